/*
 * xfer_fault.c — the fault-injection transport (fault.h): a transport wrapping another behind the
 * same seam (transport.h). It forwards every op to its inner transport (params.inner) and applies
 * the matching rule's action to each xslice it posts:
 *   STALL  held N ms (or until kvp_xfer_fault_release), then posted; fenced while held: dropped;
 *   LATE   READ on tcp: posted, and the inner tcp transport delays reading its answer
 *          (xfer_tcp_delay: the connection stops reading when that answer is next); READ on local:
 *          as STALL; WRITE: held as STALL, and a copy of its frame is sent N ms later on a
 *          connection of its own, by the fault owner (xfer_fault_port_late_write), even when it
 *          was fenced;
 *   DROP   held until fenced; FAIL: reported KVP_ERR_TRANSFER at once;
 *   WEDGE  held, and a fence does not end it (a wedged RDMA QP): only abort() does
 *          (KVP_ERR_FENCE_FAILED), or a release, after which it is an ordinary STALL.
 * The engine chooses it when fault injection is compiled in (xfer_fault_compiled()). Single-threaded
 * like any transport, on its transfer actor's thread: the rules are owned by fault.c's actor, which
 * pushes a copy into this transport's port (fault.h) whenever they change; without a rule a post
 * costs one look into the port (an empty sink) and no per-xslice check. A rule with a count is
 * decided by the owner: the xslice is held (HIT_ASK) until the answer comes, and every xslice posted
 * after it waits behind it (HIT_DEFER, in post order), so an ask changes no order on the wire, only
 * when (about a millisecond later). Releases and answers
 * are noticed by polling the port: while it holds, delays or asks about xslices, poll() asks to be
 * called again within FAULT_RECHECK_MS (*next_ns); with nothing held it costs nothing (no fd of its
 * own to read on every poll).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "actors/transfer/fault.h"
#include "actors/transfer/transfer_internal.h"
#include "actors/transfer/transport.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "wire/envelope.h"

#ifndef KVP_FAULT_INJECTION

bool xfer_fault_compiled(void) { return false; }
static int nofault_open(struct kvp_xport **out, const struct kvp_xport_params *p)
{
    (void)out, (void)p;
    return KVP_ERR_UNSUPPORTED;
}
const struct kvp_xport_ops kvp_xport_fault = {.name = "fault", .open = nofault_open};
struct kvp_xport *xfer_fault_inner(struct kvp_xport *t) { return t; }

#else

bool xfer_fault_compiled(void) { return true; }

enum { HIT_HELD = 1, HIT_POSTED = 2, HIT_ASK = 3, HIT_DEFER = 4 };
#define FAULT_RECHECK_MS 5
#define FAULT_ASK_RECHECK_MS 1

struct fpeer {
    struct kvp_xport_peer *inner;
    char *endpoint;
    struct sockaddr_storage addr;
    unsigned addr_len;
    struct fpeer *next;
};

/* An xslice a rule hit (until it is over: reported and, for a delay, the delay ran out). */
struct fhit {
    struct kvp_xport_slice s;
    struct fpeer *peer;
    uint8_t action;         /* 0 while asking */
    uint8_t where;          /* in hits: HIT_HELD (here) or HIT_POSTED (inner has it); in the defer
                               queue: HIT_ASK (the owner is asked about it, the head) or HIT_DEFER */
    bool reported;          /* its completion went out */
    uint64_t until_ns;      /* end of the stall / delay; UINT64_MAX: until released */
    unsigned long gen;      /* release generation (port->gen) when hit */
    struct fhit *next;
};

struct fault_xport {
    const struct kvp_xport_ops *in_ops;
    struct kvp_xport *in;
    uint8_t kind;           /* KVP_FAULT_TCP / KVP_FAULT_LOCAL: the rules' transport= */
    struct xfer_fault_port *port; /* the rules' copy and the owner's mailbox; NULL: no faults */
    struct fpeer *peers;
    struct fhit *hits;
    struct fhit *defer, *defer_tail; /* waiting for an ask's answer, in post order (head: HIT_ASK) */
    uint64_t now_ns;
    struct kvp_xport_completion *cq; /* own reports (FAIL, fenced or aborted held xslices) */
    size_t cq_n, cq_cap;
    uint32_t late_seq;
};

#define F(x) ((struct fault_xport *)(x))

struct kvp_xport *xfer_fault_inner(struct kvp_xport *t) { return F(t)->in; }

static int own_report(struct fault_xport *t, uint64_t id, int status)
{
    if (t->cq_n == t->cq_cap) {
        size_t nc = t->cq_cap ? t->cq_cap * 2 : 16;
        struct kvp_xport_completion *q = realloc(t->cq, nc * sizeof *q);
        if (!q)
            return KVP_ERR_NOMEM;
        t->cq = q;
        t->cq_cap = nc;
    }
    t->cq[t->cq_n++] = (struct kvp_xport_completion){id, status};
    return KVP_OK;
}

/* Forget a hit; an outstanding one (any action but FAIL, once decided) is reported over. */
static void hit_free(struct fault_xport *t, struct fhit **pp)
{
    struct fhit *h = *pp;
    *pp = h->next;
    if (h->action && h->action != KVP_FAULT_FAIL)
        xfer_fault_port_done(t->port);
    free(h);
}

static struct fhit **hit_find(struct fault_xport *t, uint64_t id)
{
    for (struct fhit **pp = &t->hits; *pp; pp = &(*pp)->next)
        if ((*pp)->s.id == id)
            return pp;
    return NULL;
}

static int f_open(struct kvp_xport **out, const struct kvp_xport_params *p)
{
    if (!p->inner)
        return KVP_ERR_INVALID;
    struct fault_xport *t = calloc(1, sizeof *t);
    if (!t)
        return KVP_ERR_NOMEM;
    struct kvp_xport_params ip = *p;
    ip.inner = NULL;
    t->in_ops = p->inner;
    t->kind = !strcmp(p->inner->name, "local") ? KVP_FAULT_LOCAL : KVP_FAULT_TCP;
    int rc = t->in_ops->open(&t->in, &ip);
    if (rc != KVP_OK) {
        free(t);
        return rc;
    }
    t->port = xfer_fault_port_open();
    *out = (struct kvp_xport *)t;
    return KVP_OK;
}

static int f_fds(struct kvp_xport *x, int *fds, size_t max)
{
    struct fault_xport *t = F(x);
    return t->in_ops->fds(t->in, fds, max);
}

static int f_connect(struct kvp_xport *x, const char *endpoint, const struct sockaddr_storage *addr,
                     unsigned addr_len, struct kvp_xport_peer **peer)
{
    struct fault_xport *t = F(x);
    struct fpeer *p = calloc(1, sizeof *p);
    if (!p)
        return KVP_ERR_NOMEM;
    p->endpoint = endpoint ? strdup(endpoint) : NULL;
    if (addr) {
        p->addr = *addr;
        p->addr_len = addr_len;
    }
    int rc = (endpoint && !p->endpoint) ? KVP_ERR_NOMEM
                                        : t->in_ops->connect(t->in, endpoint, addr, addr_len, &p->inner);
    if (rc != KVP_OK) {
        free(p->endpoint);
        free(p);
        return rc;
    }
    p->next = t->peers;
    t->peers = p;
    *peer = (struct kvp_xport_peer *)p;
    return KVP_OK;
}

/* Send the late copy of a WRITE's frame (fault LATE): header built here, payload copied now. */
static void late_write(struct fault_xport *t, const struct fhit *h, uint32_t ms)
{
    if (t->kind != KVP_FAULT_TCP || !h->peer->addr_len)
        return;
    struct kvp_frame f = {.op = KVP_FRAME_WRITE, .segment_id = h->s.segment_id, .req_id = ++t->late_seq,
                          .offset = h->s.remote_offset, .length = h->s.length,
                          .deadline = h->s.write_deadline_ms ? kvp_frame_deadline_make(h->s.write_deadline_ms) : 0};
    uint8_t hdr[KVP_FRAME_HEADER_BYTES];
    kvp_frame_encode(&f, hdr);
    xfer_fault_port_late_write(t->port, &h->peer->addr, h->peer->addr_len, hdr, h->s.local, h->s.length, ms);
}

/* Apply a decided hit (already reported to the owner) to one xslice. KVP_OK or an error. */
static int hit_apply(struct fault_xport *t, struct fpeer *peer, const struct kvp_xport_slice *s,
                     const struct xfer_fault_hit *hit)
{
    if (hit->action == KVP_FAULT_FAIL)
        return own_report(t, s->id, KVP_ERR_TRANSFER);
    struct fhit *h = calloc(1, sizeof *h);
    if (!h) {
        xfer_fault_port_done(t->port); /* the hit was reported outstanding */
        return KVP_ERR_NOMEM;
    }
    h->s = *s;
    h->peer = peer;
    h->action = hit->action;
    h->gen = t->port->gen;
    h->until_ns = t->now_ns + (uint64_t)hit->ms * 1000000ull;
    if (hit->action == KVP_FAULT_DROP || hit->action == KVP_FAULT_WEDGE)
        h->until_ns = UINT64_MAX;
    h->where = HIT_HELD;
    if (hit->action == KVP_FAULT_LATE && s->op == KVP_XFER_WRITE)
        late_write(t, h, hit->ms);
    if (hit->action == KVP_FAULT_LATE && s->op == KVP_XFER_READ && t->kind == KVP_FAULT_TCP) {
        int rc = t->in_ops->post(t->in, peer->inner, s, 1);
        if (rc != KVP_OK) {
            xfer_fault_port_done(t->port);
            free(h);
            return rc;
        }
        h->where = HIT_POSTED;
        xfer_tcp_delay(t->in, h->s.id, h->until_ns);
    }
    h->next = t->hits;
    t->hits = h;
    return KVP_OK;
}

static struct fhit **defer_find(struct fault_xport *t, uint64_t id)
{
    for (struct fhit **pp = &t->defer; *pp; pp = &(*pp)->next)
        if ((*pp)->s.id == id)
            return pp;
    return NULL;
}

static void defer_unlink(struct fault_xport *t, struct fhit **pp)
{
    struct fhit *h = *pp;
    *pp = h->next;
    if (t->defer_tail == h) {
        t->defer_tail = NULL;
        for (struct fhit *x = t->defer; x; x = x->next)
            t->defer_tail = x;
    }
}

static int defer_add(struct fault_xport *t, struct fpeer *peer, const struct kvp_xport_slice *s, uint8_t where)
{
    struct fhit *h = calloc(1, sizeof *h);
    if (!h)
        return KVP_ERR_NOMEM;
    h->s = *s;
    h->peer = peer;
    h->where = where;
    h->until_ns = UINT64_MAX;
    if (t->defer_tail)
        t->defer_tail->next = h;
    else
        t->defer = h;
    t->defer_tail = h;
    return KVP_OK;
}

/* Act on one xslice's match m (xfer_fault_port_match): post it (NONE), fault it (HIT), or ask the
 * owner (ASK: a count-limited rule comes first). Returns XFER_FAULT_ASK when it asked (the xslice
 * must then wait as HIT_ASK), else KVP_OK or an error. */
static int act_one(struct fault_xport *t, struct fpeer *peer, const struct kvp_xport_slice *s, int m,
                   const struct xfer_fault_hit *hit)
{
    if (m == XFER_FAULT_ASK) {
        if (xfer_fault_port_ask(t->port, s->id, t->kind, s->op, s->segment_id, peer->endpoint) == KVP_OK)
            return XFER_FAULT_ASK;
        m = XFER_FAULT_NONE; /* no owner: no fault */
    }
    if (m == XFER_FAULT_NONE)
        return t->in_ops->post(t->in, peer->inner, s, 1);
    xfer_fault_port_hit(t->port, hit->action);
    return hit_apply(t, peer, s, hit);
}

/* The owner answered the ask at the head of the defer queue (xfer_fault_port_sync): fault or post
 * that xslice, then the ones that waited behind it, in order, until one needs another ask. */
static void on_answer(void *arg, uint64_t ask_id, const struct xfer_fault_hit *hit)
{
    struct fault_xport *t = arg;
    struct fhit *h = t->defer;
    if (!h || h->where != HIT_ASK || h->s.id != ask_id)
        return;
    t->now_ns = kvp_clock_now_ns();
    defer_unlink(t, &t->defer);
    if (h->reported) { /* fenced or aborted while asking: never posted, dropped */
        if (hit && hit->action != KVP_FAULT_FAIL)
            xfer_fault_port_done(t->port); /* the owner counted it outstanding */
    } else if (!hit) {
        if (t->in_ops->post(t->in, h->peer->inner, &h->s, 1) != KVP_OK)
            own_report(t, h->s.id, KVP_ERR_TRANSFER);
    } else if (hit_apply(t, h->peer, &h->s, hit) != KVP_OK) {
        own_report(t, h->s.id, KVP_ERR_TRANSFER);
    }
    free(h);
    while ((h = t->defer)) {
        if (!h->reported) {
            struct xfer_fault_hit hit2;
            int m = xfer_fault_port_match(t->port, t->kind, h->s.op, h->s.segment_id, h->peer->endpoint, &hit2);
            int rc = act_one(t, h->peer, &h->s, m, &hit2);
            if (rc == XFER_FAULT_ASK) {
                h->where = HIT_ASK;
                return;
            }
            if (rc != KVP_OK)
                own_report(t, h->s.id, KVP_ERR_TRANSFER);
        }
        defer_unlink(t, &t->defer);
        free(h);
    }
}

static int f_post(struct kvp_xport *x, struct kvp_xport_peer *xp, const struct kvp_xport_slice *s, size_t n)
{
    struct fault_xport *t = F(x);
    struct fpeer *peer = (struct fpeer *)xp;
    if (t->port)
        xfer_fault_port_sync(t->port, on_answer, t); /* rules added since the last post */
    /* No rule set (every benchmark, most tests): the whole run goes to the inner transport
     * without a per-xslice check or a clock read. */
    if (!t->port || (t->port->n == 0 && !t->defer))
        return t->in_ops->post(t->in, peer->inner, s, n);
    t->now_ns = kvp_clock_now_ns();
    size_t start = 0, i = 0;
    if (t->defer) /* an ask is open: everything waits behind it */
        goto defer_rest;
    for (; i < n; i++) {
        struct xfer_fault_hit hit;
        int m = xfer_fault_port_match(t->port, t->kind, s[i].op, s[i].segment_id, peer->endpoint, &hit);
        if (m == XFER_FAULT_NONE)
            continue;
        /* the run before it goes to the inner transport as it is */
        if (i > start) {
            int prc = t->in_ops->post(t->in, peer->inner, s + start, i - start);
            if (prc != KVP_OK)
                return prc; /* (an out-of-memory here loses nothing the engine counts on: tests only) */
        }
        start = i + 1;
        int rc = act_one(t, peer, &s[i], m, &hit);
        if (rc == XFER_FAULT_ASK) {
            if (defer_add(t, peer, &s[i], HIT_ASK) != KVP_OK)
                return KVP_ERR_NOMEM;
            i++;
            goto defer_rest;
        }
        if (rc != KVP_OK)
            return rc;
    }
    if (start < n)
        return t->in_ops->post(t->in, peer->inner, s + start, n - start);
    return KVP_OK;
defer_rest:
    for (; i < n; i++)
        if (defer_add(t, peer, &s[i], HIT_DEFER) != KVP_OK)
            return KVP_ERR_NOMEM;
    return KVP_OK;
}

static int f_poll(struct kvp_xport *x, uint64_t now_ns, struct kvp_xport_completion *out, size_t max,
                  uint64_t *next_ns)
{
    struct fault_xport *t = F(x);
    t->now_ns = now_ns;
    if (t->hits || t->defer) /* releases and the owner's answers */
        xfer_fault_port_sync(t->port, on_answer, t);
    unsigned long gen = t->hits ? t->port->gen : 0;
    uint64_t next = UINT64_MAX;
    bool asking = t->defer != NULL;
    for (struct fhit **pp = &t->hits; *pp;) {
        struct fhit *h = *pp;
        bool over = now_ns >= h->until_ns || gen != h->gen;
        if (!over) {
            if (h->until_ns < next)
                next = h->until_ns;
            pp = &h->next;
            continue;
        }
        if (h->where == HIT_HELD) {
            if (h->reported) { /* fenced while held: dropped */
                hit_free(t, pp);
                continue;
            }
            h->where = HIT_POSTED;
            h->until_ns = 0;
            if (t->in_ops->post(t->in, h->peer->inner, &h->s, 1) != KVP_OK) {
                h->reported = true;
                own_report(t, h->s.id, KVP_ERR_TRANSFER);
            }
        } else if (h->until_ns) {
            h->until_ns = 0;
            if (t->kind == KVP_FAULT_TCP)
                xfer_tcp_delay(t->in, h->s.id, 0);
        }
        if (h->reported) {
            hit_free(t, pp);
            continue;
        }
        pp = &h->next;
    }
    size_t k = 0;
    while (k < max && t->cq_n > 0) {
        out[k++] = t->cq[0];
        memmove(t->cq, t->cq + 1, --t->cq_n * sizeof *t->cq);
    }
    uint64_t inext = UINT64_MAX;
    if (k < max) {
        int r = t->in_ops->poll(t->in, now_ns, out + k, max - k, &inext);
        if (r > 0) {
            for (int i = 0; i < r; i++) {
                struct fhit **pp = t->hits ? hit_find(t, out[k + (size_t)i].id) : NULL;
                if (!pp)
                    continue;
                (*pp)->reported = true;
                if ((*pp)->where == HIT_POSTED && (*pp)->until_ns == 0)
                    hit_free(t, pp);
            }
            k += (size_t)r;
        }
    } else {
        inext = now_ns;
    }
    if (t->hits || t->defer) { /* a release or an answer may end any of them: look again soon */
        uint64_t recheck = now_ns + (asking ? FAULT_ASK_RECHECK_MS : FAULT_RECHECK_MS) * 1000000ull;
        if (recheck < next)
            next = recheck;
    }
    *next_ns = next < inext ? next : inext;
    return (int)k;
}

static void f_fence(struct kvp_xport *x, const uint64_t *ids, size_t n, int status)
{
    struct fault_xport *t = F(x);
    uint64_t *fw = malloc((n ? n : 1) * sizeof *fw);
    size_t nf = 0;
    for (size_t i = 0; i < n; i++) {
        struct fhit **pp = t->hits ? hit_find(t, ids[i]) : NULL;
        struct fhit *h = pp ? *pp : NULL;
        struct fhit **dp = !h && t->defer ? defer_find(t, ids[i]) : NULL;
        if (dp) { /* never posted: reported now (an asked one is forgotten at the answer) */
            struct fhit *d = *dp;
            if (!d->reported) {
                d->reported = true;
                own_report(t, d->s.id, status);
            }
            if (d->where == HIT_DEFER) {
                defer_unlink(t, dp);
                free(d);
            }
            continue;
        }
        if (h && h->where == HIT_HELD) {
            if (h->action == KVP_FAULT_WEDGE || h->reported)
                continue; /* this transport cannot fence it now */
            own_report(t, h->s.id, status);
            hit_free(t, pp); /* never posted: dropped */
            continue;
        }
        if (fw)
            fw[nf++] = ids[i];
        else
            t->in_ops->fence(t->in, &ids[i], 1, status);
    }
    if (fw && nf)
        t->in_ops->fence(t->in, fw, nf, status);
    free(fw);
}

static void f_abort(struct kvp_xport *x, const uint64_t *ids, size_t n)
{
    struct fault_xport *t = F(x);
    for (size_t i = 0; i < n; i++) {
        struct fhit **pp = t->hits ? hit_find(t, ids[i]) : NULL;
        struct fhit *h = pp ? *pp : NULL;
        struct fhit **dp = !h && t->defer ? defer_find(t, ids[i]) : NULL;
        if (dp) { /* never posted: nothing of it can land (an asked one is forgotten at the answer) */
            struct fhit *d = *dp;
            if (!d->reported) {
                d->reported = true;
                own_report(t, d->s.id, KVP_ERR_FENCE_FAILED);
            }
            if (d->where == HIT_DEFER) {
                defer_unlink(t, dp);
                free(d);
            }
            continue;
        }
        if (h && h->where == HIT_HELD) {
            if (!h->reported) {
                h->reported = true;
                own_report(t, h->s.id, KVP_ERR_FENCE_FAILED);
            }
            hit_free(t, pp); /* never posted: nothing of it can land */
            continue;
        }
        t->in_ops->abort(t->in, &ids[i], 1);
    }
}

static int f_mem_register(struct kvp_xport *x, void *base, uint64_t len)
{
    struct fault_xport *t = F(x);
    return t->in_ops->mem_register ? t->in_ops->mem_register(t->in, base, len) : KVP_OK;
}

static int f_mem_unregister(struct kvp_xport *x, void *base, uint64_t len)
{
    struct fault_xport *t = F(x);
    return t->in_ops->mem_unregister ? t->in_ops->mem_unregister(t->in, base, len) : KVP_OK;
}

static void f_stats(struct kvp_xport *x, struct kvp_xport_stats *out)
{
    struct fault_xport *t = F(x);
    if (t->in_ops->stats)
        t->in_ops->stats(t->in, out);
}

static void f_close(struct kvp_xport *x)
{
    struct fault_xport *t = F(x);
    if (!t)
        return;
    while (t->hits) { /* the owner forgets this port's outstanding pieces with it */
        struct fhit *h = t->hits;
        t->hits = h->next;
        free(h);
    }
    while (t->defer) {
        struct fhit *h = t->defer;
        t->defer = h->next;
        free(h);
    }
    xfer_fault_port_close(t->port);
    t->in_ops->close(t->in);
    for (struct fpeer *p = t->peers, *np; p; p = np) {
        np = p->next;
        free(p->endpoint);
        free(p);
    }
    free(t->cq);
    free(t);
}

const struct kvp_xport_ops kvp_xport_fault = {
    .name = "fault",
    .open = f_open,
    .fds = f_fds,
    .connect = f_connect,
    .post = f_post,
    .poll = f_poll,
    .fence = f_fence,
    .abort = f_abort,
    .mem_register = f_mem_register,
    .mem_unregister = f_mem_unregister,
    .stats = f_stats,
    .close = f_close,
};

#endif
