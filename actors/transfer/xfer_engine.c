/*
 * xfer_engine.c — the transfer engine: transfer actors driving transports through the seam
 * (transport.h), and the batch actors they host. See transfer.h for the contract,
 * transfer_internal.h for who owns what, docs/data-plane.md for the design.
 *
 * A call (kvp_xfer_run) is a request from the caller's thread (a runtime sink) to the engine's
 * batch host when it has one (kvp_xfer_params.batch_host: the client actor; xfer_host.c), else to
 * its home transfer actor (a tcp actor), which is then the batch host itself. Either spawns a
 * hosted batch actor for it (xfer_batch.c: the one implementation, with every fence rule), which
 * cuts the slices into xslices and gives each transfer actor its work: as an XA_WORK request, or,
 * for the remote xslices of a batch hosted by a tcp actor, on that actor's own transport (the
 * ops below: a direct call, same thread). Each transfer actor reports every xslice terminal
 * (completed, failed, or fenced) back to the batch: directly, or by answering the XA_WORK request.
 * The call's timeout is a runtime timer of the batch actor: it fences the works (XA_FENCE), and
 * the fence bound's timer aborts what a transport could not fence (XA_ABORT). Only when every
 * work is complete does the batch actor finish; its fini answers the caller. So the caller
 * returns only after every transfer actor let go of every slice's memory (contract C2), and no
 * lock or atomic is needed: each transport, each work and each batch has exactly one owner at a
 * time, and ownership moves by message. That includes the data-plane tokens: each network actor
 * signs from its own wallet (params.token_wallet's key), filled by XA_TOKENS messages
 * (kvp_xfer_tokens_put), so no wallet is shared between threads.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <czmq.h>

#include "actors/transfer/transfer_internal.h"
#include "actors/transfer/transport.h"
#include "auth/auth_token.h"
#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "wire/envelope.h"

#define ACTOR "xfer"
#define XA_MAX_FDS 8
#define XA_COMP_BATCH 256

struct xa_peer {
    char *endpoint;
    struct kvp_xport_peer *p;
    bool alt;                  /* on xa->alt (TCP fallback), not xa->t */
    struct kvp_xport_peer *tcp_p; /* its TCP peer once it went back to the transport (kept: the
                                   * instance owns it, and in-flight ids may still complete) */
    uint64_t reprobe_ms;       /* alt: when to try the transport again (monotonic ms) */
    struct sockaddr_storage sa;
    unsigned sl;
    struct xa_peer *next;
};

/* A transfer actor's state (its thread only). */
struct xa {
    struct kvp_xfer_params p;
    char name[24];
    bool is_local;
    const struct kvp_xport_ops *ops;
    struct kvp_xport *t;
    struct kvp_xport *raw;     /* the transport under the fault wrapper (the local table) */
    /* Per-peer TCP fallback: a network actor whose transport is not tcp (rdma) opens a tcp
     * instance the first time that transport's connect() answers KVP_ERR_UNSUPPORTED for a peer
     * (the segment has no RDMA, or refused the handshake), and that peer uses it from then on.
     * Ids are the engine's, so fence/abort go to both instances (unknown ids are ignored,
     * transport.h) and poll drains both. NULL until needed. */
    struct kvp_xport *alt;
    struct kvp_xport_params alt_params;
    bool alt_failed;           /* opening it failed (logged once): such peers fail */
    int fds[XA_MAX_FDS];
    int nfds;
    struct xa_peer *peers;
    struct xfer_work *works;
    uint64_t next_seq;
    uint64_t timer_id;
    uint64_t timer_due_ns;     /* 0: no poll timer */
    bool rearm_sent;           /* an XA_REARM is on its way */
    struct xfer_bhost bh;      /* the batch actors hosted here (tcp actors; xfer_batch.c), the
                                  engine's stop, the routing to xfer-local */
    struct kvp_rt_actor *local_actor; /* tcp actors: a reference to xfer-local */
    struct kvp_rt_actor *idle;   /* tcp actors: a reference to the engine's idle-token sink */
    struct kvp_dt_wallet *wallet; /* network actors with params.token_wallet: this actor's copy
                                     (its key; tokens by XA_TOKENS), signed from by its transports */
    struct kvp_xfer_stats st;
    struct kvp_xport_completion comp[XA_COMP_BATCH];
};

/* Put the call's idle token back (see struct xfer_call); before the call is answered. */
static void token_back(struct xa *xa, struct xfer_call *c)
{
    if (c->home_token >= 0 && xa->idle)
        kvp_rt_send(xa->idle, 0, 0, (uint64_t)c->home_token, NULL, NULL);
    c->home_token = -1;
}

void xfer_work_free(struct xfer_work *w) { free(w); /* one block: xfer_work_new */ }

#define WORK_ALIGN(x) (((x) + 15u) & ~(size_t)15u)

/* A work for n xslices and its four per-xslice arrays, in one zeroed allocation (a call's works
 * are made and freed once per call: one calloc, not five). NULL when out of memory. */
struct xfer_work *xfer_work_new(size_t n)
{
    if (n == 0)
        n = 1;
    if (n > SIZE_MAX / 64)
        return NULL;
    size_t o_xs = WORK_ALIGN(sizeof(struct xfer_work));
    size_t o_ep = WORK_ALIGN(o_xs + n * sizeof(struct kvp_xport_slice));
    size_t o_sl = WORK_ALIGN(o_ep + n * sizeof(const char *));
    size_t o_st = WORK_ALIGN(o_sl + n * sizeof(uint32_t));
    size_t total = o_st + n * sizeof(int);
    uint8_t *m = calloc(1, total);
    if (!m)
        return NULL;
    struct xfer_work *w = (struct xfer_work *)m;
    w->xs = (struct kvp_xport_slice *)(m + o_xs);
    w->ep = (const char **)(m + o_ep);
    w->slice_of = (uint32_t *)(m + o_sl);
    w->st = (int *)(m + o_st);
    return w;
}

/* ------------------------------------------------------------------ transfer actor: works
 * (lent by XA_WORK, or a batch's remote work run by its host: w->direct) */

static void xa_stop_check(struct xa *xa, struct kvp_rt_ctx *ctx);

/* Every xslice of w is terminal: give it back to its batch. */
static void work_done(struct xa *xa, struct kvp_rt_ctx *ctx, struct xfer_work *w)
{
    for (struct xfer_work **pp = &xa->works; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    w->next = NULL;
    if (w->direct) {
        w->done = true; /* (a lent work's `done` is unused: its batch tracks it) */
        xfer_batch_direct_done(ctx, w->batch);
    } else if (kvp_rt_reply(ctx, w->token, KVP_OK, 0, NULL, NULL) != KVP_OK) {
        kvp_log_error(xa->name, "a batch's work could not be answered (its batch is gone)");
    }
}

static void xs_terminal(struct xa *xa, struct xfer_work *w, size_t i, int status)
{
    if (w->st[i] != XS_PENDING)
        return;
    /* Stopping aborts at once, without waiting for the fence bound: a transport that reports
     * what its abort tore down as FENCE_FAILED (rdma: QPs destroyed, MRs deregistered, so no
     * byte can land) missed no bound, and the slice ends with the stop's status, as on tcp. */
    if (w->abort_now && status == KVP_ERR_FENCE_FAILED && w->fence_status)
        status = w->fence_status;
    w->st[i] = status;
    w->left--;
    if (w->fence_status && status == w->fence_status)
        xa->st.fenced++;
    if (status == KVP_ERR_FENCE_FAILED)
        xa->st.fence_failed++;
}

static struct xfer_work *work_find(struct xa *xa, uint64_t seq)
{
    for (struct xfer_work *w = xa->works; w; w = w->next)
        if (w->seq == seq)
            return w;
    return NULL;
}

/* Make sure the transport is polled at `next`. The poll timer must be the transfer actor's own
 * (a batch actor's timers end with it): from a batch actor's callback, the host is asked by a
 * message to itself (XA_REARM), and arms the timer when it pumps. */
static void xa_arm(struct xa *xa, struct kvp_rt_ctx *ctx, uint64_t now, uint64_t next)
{
    if (next == UINT64_MAX || (xa->timer_due_ns && xa->timer_due_ns <= next))
        return;
    if (kvp_rt_self_hid(ctx) != 0) {
        if (!xa->rearm_sent && kvp_rt_send(kvp_rt_self(ctx), 0, XA_REARM, 0, NULL, NULL) == KVP_OK)
            xa->rearm_sent = true;
        return;
    }
    if (xa->timer_due_ns)
        kvp_rt_timer_cancel(ctx, xa->timer_id);
    uint64_t ms = next > now ? (next - now + 999999ull) / 1000000ull : 0;
    if (kvp_rt_timer_start(ctx, (uint32_t)(ms > UINT32_MAX ? UINT32_MAX : ms), 0, XA_POLL_TIMER,
                           &xa->timer_id) == KVP_OK)
        xa->timer_due_ns = next;
    else
        xa->timer_due_ns = 0;
}

/* Poll the transport until it has nothing more now; hand completions to their works. */
static void xa_pump(struct xa *xa, struct kvp_rt_ctx *ctx)
{
    uint64_t now = 0, next = UINT64_MAX;
    for (int round = 0; round < 1024; round++) {
        now = kvp_clock_now_ns();
        int n = xa->ops->poll(xa->t, now, xa->comp, XA_COMP_BATCH, &next);
        if (xa->alt && n >= 0 && n < XA_COMP_BATCH) {
            uint64_t next2 = UINT64_MAX;
            int n2 = kvp_xport_tcp.poll(xa->alt, now, xa->comp + n, XA_COMP_BATCH - (size_t)n, &next2);
            if (n2 > 0)
                n += n2;
            if (next2 < next)
                next = next2;
        }
        for (int i = 0; i < n; i++) {
            struct xfer_work *w = work_find(xa, xa->comp[i].id >> ID_SHIFT);
            size_t idx = (size_t)(xa->comp[i].id & ((1ull << ID_SHIFT) - 1));
            if (!w || idx >= w->n) {
                kvp_log_error(xa->name, "completion for unknown xslice %llx dropped",
                              (unsigned long long)xa->comp[i].id);
                continue;
            }
            xs_terminal(xa, w, idx, xa->comp[i].status);
            if (w->left == 0)
                work_done(xa, ctx, w);
        }
        if (n < XA_COMP_BATCH && next > now)
            break;
    }
    xa_arm(xa, ctx, now, next);
    xa_stop_check(xa, ctx);
}

static int xa_on_fd(struct kvp_rt_ctx *ctx, void *handle);

/* Open the TCP fallback instance (see struct xa) and watch its fds. */
static int xa_alt_open(struct xa *xa, struct kvp_rt_ctx *ctx)
{
    if (xa->alt)
        return KVP_OK;
    if (xa->alt_failed)
        return KVP_ERR_UNSUPPORTED;
    struct kvp_xport_params tp = xa->alt_params;
    tp.wrap_opts = NULL;
    tp.inner = NULL;
    int rc = kvp_xport_tcp.open(&xa->alt, &tp);
    int fds[XA_MAX_FDS];
    int n = rc == KVP_OK ? kvp_xport_tcp.fds(xa->alt, fds, XA_MAX_FDS) : 0, watched = 0;
    for (; rc == KVP_OK && watched < n; watched++)
        if ((rc = kvp_rt_watch_fd(ctx, fds[watched], xa_on_fd)) != KVP_OK)
            break;
    if (rc != KVP_OK) {
        kvp_log_error(xa->name, "TCP fallback transport could not be opened (%s): peers without RDMA "
                      "fail", kvp_errname(rc));
        for (int i = 0; i < watched; i++) /* no watch left on an fd the close below frees */
            kvp_rt_unwatch_fd(ctx, fds[i]);
        if (xa->alt)
            kvp_xport_tcp.close(xa->alt);
        xa->alt = NULL;
        xa->alt_failed = true;
    }
    return rc;
}

/* When the next try of the transport for a peer on TCP is due (0: never). */
static uint64_t reprobe_at(const struct xa *xa)
{
    uint32_t ms = xa->p.rdma_reprobe_ms ? xa->p.rdma_reprobe_ms : 30000;
    return ms == UINT32_MAX ? 0 : kvp_clock_now_ms() + ms;
}

/* A peer on the TCP fallback: try the transport's connect again (one handshake round trip on
 * this actor, at most once per rdma_reprobe_ms). OK: new batches to it use the transport (one
 * log line); the TCP peer stays with the TCP instance, which finishes what it has in flight.
 * Anything else: TCP still, silently, until the next try. */
static void xa_reprobe(struct xa *xa, struct xa_peer *p)
{
    xa->st.rdma_reprobes++;
    struct kvp_xport_peer *np = NULL;
    int rc = xa->ops->connect(xa->t, p->endpoint, &p->sa, p->sl, &np);
    if (rc != KVP_OK) {
        p->reprobe_ms = reprobe_at(xa);
        kvp_log_debug(xa->name, "segment %s: RDMA still unusable (%s); TCP", p->endpoint, kvp_errname(rc));
        return;
    }
    p->tcp_p = p->p;
    p->p = np;
    p->alt = false;
    p->reprobe_ms = 0;
    xa->st.rdma_returned_peers++;
    kvp_log_info(xa->name, "segment %s: reachable over RDMA again; new transfers use RDMA", p->endpoint);
}

static struct xa_peer *xa_peer_get(struct xa *xa, struct kvp_rt_ctx *ctx, const char *endpoint, int *err)
{
    const char *key = endpoint ? endpoint : "";
    for (struct xa_peer *p = xa->peers; p; p = p->next)
        if (!strcmp(p->endpoint, key)) {
            if (p->alt && p->reprobe_ms && kvp_clock_now_ms() >= p->reprobe_ms)
                xa_reprobe(xa, p);
            return p;
        }
    struct sockaddr_storage sa;
    unsigned sl = 0;
    memset(&sa, 0, sizeof sa);
    if (!xa->is_local) {
        /* Once per endpoint: a numeric one never blocks; a name waits for the resolver. */
        int rc = kvp_xfer_resolve(endpoint, &sa, &sl);
        if (rc != KVP_OK) {
            *err = rc;
            return NULL;
        }
    }
    struct xa_peer *p = calloc(1, sizeof *p);
    if (!p || !(p->endpoint = strdup(key))) {
        free(p);
        *err = KVP_ERR_NOMEM;
        return NULL;
    }
    int rc = xa->ops->connect(xa->t, endpoint, xa->is_local ? NULL : &sa, sl, &p->p);
    if (rc == KVP_ERR_UNSUPPORTED && !xa->is_local && xa->alt_params.name && (rc = xa_alt_open(xa, ctx)) == KVP_OK) {
        /* this transport cannot reach that segment (no RDMA there, or the handshake was
         * refused): TCP for this peer only, for the life of the engine */
        rc = kvp_xport_tcp.connect(xa->alt, endpoint, &sa, sl, &p->p);
        if (rc == KVP_OK) {
            p->alt = true;
            p->sa = sa;
            p->sl = sl;
            p->reprobe_ms = reprobe_at(xa);
            xa->st.tcp_fallback_peers++;
            char again[64] = "for the engine's life";
            if (p->reprobe_ms)
                snprintf(again, sizeof again, "RDMA tried again every %u ms",
                         xa->p.rdma_reprobe_ms ? xa->p.rdma_reprobe_ms : 30000);
            kvp_log_warn(xa->name, "segment %s: not reachable over RDMA (no RDMA there, or the handshake "
                         "was refused); using TCP for this segment, %s", endpoint, again);
        }
    }
    if (rc != KVP_OK) {
        free(p->endpoint);
        free(p);
        *err = rc;
        return NULL;
    }
    p->next = xa->peers;
    xa->peers = p;
    return p;
}

/* Take w: post its xslices (runs of one endpoint at a time). Completes it at once if nothing
 * could be posted. The caller pumps afterwards. */
static void work_start(struct xa *xa, struct kvp_rt_ctx *ctx, struct xfer_work *w)
{
    w->seq = ++xa->next_seq;
    w->left = w->n;
    w->next = xa->works;
    xa->works = w;
    for (size_t i = 0; i < w->n; i++) {
        w->st[i] = XS_PENDING;
        w->xs[i].id = w->seq << ID_SHIFT | i;
    }
    if (xa->bh.stopping) {
        for (size_t i = 0; i < w->n; i++)
            xs_terminal(xa, w, i, KVP_ERR_CLOSED);
    }
    size_t i = 0;
    while (i < w->n && !xa->bh.stopping) {
        size_t j = i + 1;
        const char *ep = w->ep[i];
        while (j < w->n && (ep == w->ep[j] || (ep && w->ep[j] && !strcmp(ep, w->ep[j]))))
            j++;
        int err = KVP_ERR_INVALID;
        struct xa_peer *peer = xa_peer_get(xa, ctx, ep, &err);
        int rc = !peer ? err
                 : peer->alt ? kvp_xport_tcp.post(xa->alt, peer->p, w->xs + i, j - i)
                             : xa->ops->post(xa->t, peer->p, w->xs + i, j - i);
        if (rc != KVP_OK)
            for (size_t k = i; k < j; k++)
                xs_terminal(xa, w, k, rc);
        i = j;
    }
    if (w->left == 0)
        work_done(xa, ctx, w);
}

/* Ask the transport to fence w's pending xslices; with abort_now (stopping) abort them too. */
static void work_fence(struct xa *xa, struct xfer_work *w, int status)
{
    if (w->done)
        return;
    if (!w->fence_status)
        w->fence_status = status;
    uint64_t *ids = malloc(w->left * sizeof *ids);
    size_t n = 0;
    for (size_t i = 0; i < w->n && ids; i++)
        if (w->st[i] == XS_PENDING)
            ids[n++] = w->xs[i].id;
    if (ids && n) {
        xa->ops->fence(xa->t, ids, n, w->fence_status);
        if (xa->alt)
            kvp_xport_tcp.fence(xa->alt, ids, n, w->fence_status);
        if (w->abort_now) {
            xa->ops->abort(xa->t, ids, n);
            if (xa->alt)
                kvp_xport_tcp.abort(xa->alt, ids, n);
        }
    }
    free(ids);
}

static void work_abort(struct xa *xa, struct xfer_work *w)
{
    if (w->done)
        return;
    uint64_t *ids = malloc(w->left * sizeof *ids);
    size_t n = 0;
    char owners[256];
    size_t olen = 0;
    owners[0] = 0;
    for (size_t i = 0; i < w->n && ids; i++)
        if (w->st[i] == XS_PENDING) {
            ids[n++] = w->xs[i].id;
            if (olen < sizeof owners - 64) {
                char one[96];
                snprintf(one, sizeof one, "%sseg %u@%s", olen ? ", " : "", w->xs[i].segment_id,
                         w->ep[i] ? w->ep[i] : "local");
                if (!strstr(owners, one + (olen ? 2 : 0))) {
                    snprintf(owners + olen, sizeof owners - olen, "%s", one);
                    olen = strlen(owners);
                }
            }
        }
    if (ids && n) {
        kvp_log_error(xa->name, "%zu pieces could not be fenced within %u ms; tearing down their "
                      "transport: %s", n, xa->p.fence_bound_ms, owners);
        xa->ops->abort(xa->t, ids, n);
        if (xa->alt)
            kvp_xport_tcp.abort(xa->alt, ids, n);
    }
    free(ids);
}

/* ------------------------------------------------------------------ the batch host's ops */

/* A tcp actor runs its batches' remote works on its own transport (struct xfer_bhost_ops). */
static void xa_direct_start(void *owner, struct kvp_rt_ctx *ctx, struct xfer_work *w)
{
    work_start(owner, ctx, w);
    xa_pump(owner, ctx);
}

static void xa_direct_fence(void *owner, struct kvp_rt_ctx *ctx, struct xfer_work *w, int status, bool now)
{
    w->abort_now = now;
    work_fence(owner, w, status);
    xa_pump(owner, ctx);
}

static void xa_direct_abort(void *owner, struct kvp_rt_ctx *ctx, struct xfer_work *w)
{
    work_abort(owner, w);
    xa_pump(owner, ctx);
}

static void xa_answering(void *owner, struct xfer_call *c, bool ran)
{
    (void)ran;
    token_back(owner, c);
}

static bool xa_busy(void *owner) { return ((struct xa *)owner)->works != NULL; }

static const struct xfer_bhost_ops xa_bhost_ops = {.direct_start = xa_direct_start,
                                                   .direct_fence = xa_direct_fence,
                                                   .direct_abort = xa_direct_abort,
                                                   .answering = xa_answering,
                                                   .busy = xa_busy};

/* ------------------------------------------------------------------ transfer actor */

static void xa_stop_check(struct xa *xa, struct kvp_rt_ctx *ctx)
{
    xfer_bhost_stop_check(&xa->bh, ctx);
}

static int xa_on_fd(struct kvp_rt_ctx *ctx, void *handle)
{
    (void)handle;
    xa_pump(kvp_rt_state(ctx), ctx);
    return KVP_OK;
}

/* kvp_xport_params.token_respond of a network actor with its own wallet (xa->wallet): called
 * by its transports on its thread only. */
static int xa_token_respond(void *ctx, const uint8_t *challenge, size_t len, uint8_t *out, size_t cap)
{
    if (len != KVP_DT_CHALLENGE_BYTES)
        return KVP_ERR_INVALID;
    return kvp_dt_wallet_respond(ctx, challenge, kvp_clock_wall_ms(), out, cap);
}

static int xa_init(struct kvp_rt_ctx *ctx)
{
    struct xa *xa = kvp_rt_state(ctx);
    struct kvp_xport_params tp = {.conns_per_peer = xa->p.conns_per_peer,
                                  .slice_bytes = xa->is_local ? UINT64_MAX : xa->p.slice_bytes,
                                  .connect_timeout_ms = xa->p.connect_timeout_ms,
                                  .name = xa->name,
                                  .wrap_opts = xa->is_local ? NULL : xa->p.transport_opts,
                                  .token_respond = xa->is_local ? NULL : xa->p.token_respond,
                                  .token_ctx = xa->is_local ? NULL : xa->p.token_ctx};
    if (xa->wallet) {
        tp.token_respond = xa_token_respond;
        tp.token_ctx = xa->wallet;
    }
    const struct kvp_xport_ops *base = xa->is_local ? &kvp_xport_local
                                       : xa->p.transport ? xa->p.transport : &kvp_xport_tcp;
    if (xfer_fault_compiled()) {
        tp.inner = base;
        xa->ops = &kvp_xport_fault;
    } else {
        xa->ops = base;
    }
    if (!xa->is_local && base != &kvp_xport_tcp)
        xa->alt_params = tp; /* its name set: the fallback is allowed (xa_alt_open) */
    int rc = xa->ops->open(&xa->t, &tp);
    if (rc != KVP_OK) {
        xa->t = NULL;
        return rc;
    }
    xa->raw = xfer_fault_compiled() ? xfer_fault_inner(xa->t) : xa->t;
    xa->nfds = xa->ops->fds(xa->t, xa->fds, XA_MAX_FDS);
    for (int i = 0; i < xa->nfds; i++) {
        rc = kvp_rt_watch_fd(ctx, xa->fds[i], xa_on_fd);
        if (rc != KVP_OK)
            return rc;
    }
    return KVP_OK;
}

static void xa_fini(struct kvp_rt_ctx *ctx)
{
    struct xa *xa = kvp_rt_state(ctx);
    if (xa->t)
        xa->ops->close(xa->t);
    if (xa->alt)
        kvp_xport_tcp.close(xa->alt);
    for (struct xa_peer *p = xa->peers, *np; p; p = np) {
        np = p->next;
        free(p->endpoint);
        free(p);
    }
    xfer_bhost_free(&xa->bh);
    kvp_dt_wallet_destroy(&xa->wallet);
    kvp_rt_unref(&xa->local_actor);
    kvp_rt_unref(&xa->idle);
    free(xa);
}

static int xa_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m)
{
    struct xa *xa = kvp_rt_state(ctx);
    switch (m->type) {
    case XA_CALL:
        if (m->kind == KVP_RT_REQUEST)
            xfer_bhost_call(&xa->bh, ctx, m);
        break;
    case XA_WORK:
        if (m->kind == KVP_RT_REQUEST) {
            struct xfer_work *w = m->payload;
            w->token = m->corr_id; /* (w->direct is false for a lent work: the batch's field) */
            work_start(xa, ctx, w);
            xa_pump(xa, ctx);
        }
        break;
    case XA_FENCE:
    case XA_ABORT: {
        struct xfer_work *w = m->payload;
        bool active = false;
        for (struct xfer_work *x = xa->works; x && !active; x = x->next)
            active = x == w;
        if (!active)
            break; /* answered already: the message crossed the answer */
        if (m->type == XA_FENCE) {
            work_fence(xa, w, (int)(int64_t)m->arg);
        } else {
            if (m->arg) { /* stopping: fenced with the status and aborted at once (work_fence
                           * with abort_now), as the home's own works are: no bound was missed */
                w->abort_now = true;
                work_fence(xa, w, (int)(int64_t)m->arg);
            } else {
                work_abort(xa, w);
            }
        }
        xa_pump(xa, ctx);
        break;
    }
    case XA_STOP:
        if (m->kind != KVP_RT_REQUEST)
            break;
        xfer_bhost_stop(&xa->bh, ctx, m->corr_id);
        for (struct xfer_work *w = xa->works, *nw; w; w = nw) { /* works lent by other actors */
            nw = w->next;
            w->abort_now = true;
            work_fence(xa, w, KVP_ERR_CLOSED);
        }
        xa_pump(xa, ctx);
        break;
    case XA_STATS:
        if (m->kind == KVP_RT_REQUEST) {
            struct kvp_xfer_stats *st = malloc(sizeof *st);
            if (!st) {
                kvp_rt_reply(ctx, m->corr_id, KVP_ERR_NOMEM, 0, NULL, NULL);
                break;
            }
            *st = xa->st;
            struct kvp_xport_stats ts = {0};
            if (xa->ops->stats)
                xa->ops->stats(xa->t, &ts);
            st->stray_bytes += ts.stray_bytes;
            st->spec_pieces += ts.spec_pieces;
            st->pushbacks += ts.pushbacks;
            if (xa->alt && kvp_xport_tcp.stats) {
                struct kvp_xport_stats as = {0};
                kvp_xport_tcp.stats(xa->alt, &as);
                st->stray_bytes += as.stray_bytes;
                st->spec_pieces += as.spec_pieces;
                st->pushbacks += as.pushbacks;
            }
            void *pl = st;
            if (kvp_rt_reply(ctx, m->corr_id, KVP_OK, 0, &pl, NULL) != KVP_OK)
                free(pl);
        }
        break;
    case XA_LOCAL_ADD:
    case XA_LOCAL_DEL: {
        if (m->kind != KVP_RT_REQUEST)
            break;
        uint32_t id = m->type == XA_LOCAL_ADD ? ((struct xfer_local_reg *)m->payload)->segment_id : (uint32_t)m->arg;
        int rc = KVP_OK;
        if (xa->is_local) {
            const struct xfer_local_reg *r = m->payload;
            rc = m->type == XA_LOCAL_ADD ? xfer_local_add(xa->raw, id, r->base, r->size) : xfer_local_del(xa->raw, id);
        } else {
            rc = xfer_bhost_local_set(&xa->bh, id, m->type == XA_LOCAL_ADD);
        }
        kvp_rt_reply(ctx, m->corr_id, rc, 0, NULL, NULL);
        break;
    }
    case XA_MEM_REG:
    case XA_MEM_UNREG: { /* caller memory registered with the transport (rdma: MRs; tcp: none) */
        if (m->kind != KVP_RT_REQUEST)
            break;
        const struct xfer_local_reg *r = m->payload;
        int (*fn)(struct kvp_xport *, void *, uint64_t) =
            m->type == XA_MEM_REG ? xa->ops->mem_register : xa->ops->mem_unregister;
        kvp_rt_reply(ctx, m->corr_id, fn && r ? fn(xa->t, r->base, r->size) : KVP_OK, 0, NULL, NULL);
        break;
    }
    case XA_TOKENS: { /* tokens pushed before the calls that need them (kvp_xfer_tokens_put) */
        const struct xfer_tokens *tk = m->payload;
        for (size_t i = 0; xa->wallet && tk && i < tk->n; i++) {
            int rc = kvp_dt_wallet_put(xa->wallet, tk->tok[i].b, tk->tok[i].len);
            if (rc != KVP_OK)
                kvp_log_warn(xa->name, "data token %zu of %zu: not kept (%s)", i, tk->n, kvp_errname(rc));
        }
        break;
    }
    case XA_POLL_TIMER:
        if (m->kind == KVP_RT_TIMER) {
            xa->timer_due_ns = 0;
            xa_pump(xa, ctx);
        }
        break;
    case XA_REARM:
        xa->rearm_sent = false;
        xa_pump(xa, ctx);
        break;
    default:
        kvp_log_warn(xa->name, "message type %u ignored", m->type);
        break;
    }
    return KVP_OK;
}

/* ------------------------------------------------------------------ public API */

static int spawn_xa(struct kvp_rt_actor **out, const struct kvp_xfer_params *p, bool local, unsigned idx,
                    struct kvp_rt_actor *local_actor, struct kvp_rt_actor *idle)
{
    struct xa *xa = calloc(1, sizeof *xa);
    if (!xa)
        return KVP_ERR_NOMEM;
    xa->p = *p;
    xa->is_local = local;
    if (local)
        snprintf(xa->name, sizeof xa->name, "xfer-local");
    else
        snprintf(xa->name, sizeof xa->name, "xfer-tcp-%u", idx);
    if (local_actor)
        xa->local_actor = kvp_rt_ref(local_actor);
    xa->bh = (struct xfer_bhost){.ops = &xa_bhost_ops, .owner = xa, .name = xa->name, .p = &xa->p,
                                 .local = xa->local_actor, .st = &xa->st};
    if (idle)
        xa->idle = kvp_rt_ref(idle);
    if (!local && p->token_wallet) {
        int rc = kvp_dt_wallet_copy_key(p->token_wallet, &xa->wallet);
        if (rc != KVP_OK) {
            kvp_rt_unref(&xa->local_actor);
            kvp_rt_unref(&xa->idle);
            free(xa);
            return rc;
        }
    }
    struct kvp_rt_spec spec = {.name = xa->name, .init = xa_init, .handle = xa_handle, .fini = xa_fini,
                               .state = xa};
    return kvp_rt_spawn(out, &spec, NULL); /* owns xa from here: any failure ran xa_fini */
}

int kvp_xfer_engine_new(struct kvp_xfer_engine **out, const struct kvp_xfer_params *p)
{
    if (!out)
        return KVP_ERR_INVALID;
    struct kvp_xfer_engine *e = calloc(1, sizeof *e);
    if (!e)
        return KVP_ERR_NOMEM;
    if (p)
        e->p = *p;
    if (e->p.conns_per_peer == 0)
        e->p.conns_per_peer = XFER_DEFAULT_CONNS;
    if (e->p.conns_per_peer > XFER_MAX_CONNS)
        e->p.conns_per_peer = XFER_MAX_CONNS;
    if (e->p.slice_bytes == 0)
        e->p.slice_bytes = XFER_DEFAULT_SLICE_BYTES;
    if (e->p.slice_bytes > KVP_FRAME_MAX_LENGTH)
        e->p.slice_bytes = KVP_FRAME_MAX_LENGTH;
    if (e->p.connect_timeout_ms == 0)
        e->p.connect_timeout_ms = XFER_DEFAULT_CONNECT_MS;
    if (e->p.fence_bound_ms == 0)
        e->p.fence_bound_ms = XFER_DEFAULT_FENCE_BOUND_MS;
    if (e->p.io_threads == 0)
        e->p.io_threads = 1;
    if (e->p.io_threads > XFER_MAX_IO_THREADS)
        e->p.io_threads = XFER_MAX_IO_THREADS;
    /* The transfer actors may be a process's first runtime actors (a client): czmq's zsys_init
     * (run by the process's first czmq socket or zactor) would install czmq's SIGINT/SIGTERM handlers and take Ctrl-C
     * away from the application. Before the engine was actors clients never had them; keep it so
     * (docs/runtime.md, "Signals"; as kvp_seg_server_start does). */
    zsys_handler_set(NULL);
    if (e->p.batch_host)
        e->host = kvp_rt_ref(e->p.batch_host);
    int rc = kvp_rt_sink_new(&e->idle, "xfer-idle");
    if (rc == KVP_OK)
        rc = spawn_xa(&e->local, &e->p, true, 0, NULL, NULL);
    for (unsigned i = 0; rc == KVP_OK && i < e->p.io_threads; i++) {
        rc = spawn_xa(&e->tcp[i], &e->p, false, i, e->local, e->idle);
        if (rc == KVP_OK)
            e->n_tcp++;
    }
    for (unsigned i = 0; rc == KVP_OK && i < e->n_tcp; i++)
        rc = kvp_rt_send(e->idle, 0, 0, i, NULL, NULL);
    if (rc != KVP_OK) {
        kvp_xfer_engine_destroy(&e);
        return rc;
    }
    *out = e;
    return KVP_OK;
}

/* A request from a thread that is not an actor, answered with a status. */
static int call_status(struct kvp_rt_actor *a, uint32_t type, uint64_t arg, void **payload, void **reply_payload)
{
    struct kvp_rt_msg *r = NULL;
    int rc = kvp_rt_call(a, 0, type, arg, payload, payload ? xfer_no_free : NULL, 0, &r);
    if (rc != KVP_OK)
        return rc;
    rc = r->status;
    if (reply_payload)
        *reply_payload = kvp_rt_msg_take(r);
    kvp_rt_msg_destroy(&r);
    return rc;
}

void kvp_xfer_stats(struct kvp_xfer_engine *e, struct kvp_xfer_stats *out)
{
    if (!out)
        return;
    *out = (struct kvp_xfer_stats){0};
    if (!e)
        return;
    for (unsigned i = 0; i <= e->n_tcp + 1; i++) { /* the tcp actors, xfer-local, the batch host */
        struct kvp_rt_actor *a = i < e->n_tcp ? e->tcp[i] : i == e->n_tcp ? e->local : e->host;
        void *pl = NULL;
        if (!a || call_status(a, i <= e->n_tcp ? XA_STATS : XH_STATS, 0, NULL, &pl) != KVP_OK || !pl) {
            free(pl);
            continue;
        }
        const struct kvp_xfer_stats *s = pl;
        out->batches += s->batches;
        out->slices += s->slices;
        out->timeouts += s->timeouts;
        out->fenced += s->fenced;
        out->fence_failed += s->fence_failed;
        out->stray_bytes += s->stray_bytes;
        out->spec_pieces += s->spec_pieces;
        out->pushbacks += s->pushbacks;
        out->tcp_fallback_peers += s->tcp_fallback_peers;
        out->rdma_reprobes += s->rdma_reprobes;
        out->rdma_returned_peers += s->rdma_returned_peers;
        free(pl);
    }
}

void kvp_xfer_engine_stop(struct kvp_xfer_engine *e)
{
    if (!e)
        return;
    /* The batch host first (its batches wait for the transfer actors' answers: it fences them and
     * answers once they all reported), then the tcp actors: their batches wait for the local
     * actor's answers. */
    if (e->host)
        call_status(e->host, XH_STOP, 0, NULL, NULL);
    for (unsigned i = 0; i < e->n_tcp; i++)
        if (e->tcp[i])
            call_status(e->tcp[i], XA_STOP, 0, NULL, NULL);
    if (e->local)
        call_status(e->local, XA_STOP, 0, NULL, NULL);
}

void kvp_xfer_engine_destroy(struct kvp_xfer_engine **ep)
{
    if (!ep || !*ep)
        return;
    struct kvp_xfer_engine *e = *ep;
    *ep = NULL;
    kvp_xfer_engine_stop(e);
    for (unsigned i = 0; i < XFER_MAX_IO_THREADS; i++)
        kvp_rt_destroy(&e->tcp[i]);
    kvp_rt_destroy(&e->local);
    kvp_rt_destroy(&e->idle);
    kvp_rt_unref(&e->host);
    free(e);
}

int kvp_xfer_tokens_put(struct kvp_xfer_engine *e, const uint8_t *const *tokens, const size_t *lens, size_t n)
{
    if (!e || !e->p.token_wallet || n == 0 || n > KVP_XFER_TOKENS_MAX || !tokens || !lens)
        return KVP_ERR_INVALID;
    for (size_t i = 0; i < n; i++)
        if (!tokens[i] || lens[i] == 0 || lens[i] > KVP_DT_TOKEN_MAX)
            return KVP_ERR_INVALID;
    size_t bytes = sizeof(struct xfer_tokens) + n * sizeof(((struct xfer_tokens *)0)->tok[0]);
    int rc = KVP_OK;
    for (unsigned a = 0; a < e->n_tcp && rc == KVP_OK; a++) {
        struct xfer_tokens *tk = malloc(bytes); /* each actor its own copy: it frees it */
        if (!tk)
            return KVP_ERR_NOMEM;
        tk->n = n;
        for (size_t i = 0; i < n; i++) {
            tk->tok[i].len = (uint16_t)lens[i];
            memcpy(tk->tok[i].b, tokens[i], lens[i]);
        }
        void *pl = tk;
        rc = kvp_rt_send(e->tcp[a], 0, XA_TOKENS, 0, &pl, free);
        free(pl); /* NULL once sent */
    }
    return rc;
}

static int local_req(struct kvp_xfer_engine *e, uint32_t type, uint32_t segment_id, void *base, uint64_t size)
{
    struct xfer_local_reg r = {segment_id, base, size};
    int rc = KVP_OK;
    /* Adds: the local actor first, then the tcp actors and the batch host route to it. Deletes:
     * the other way. */
    bool add = type == XA_LOCAL_ADD;
    for (unsigned k = 0; k <= e->n_tcp + 1; k++) {
        unsigned i = add ? (k == 0 ? e->n_tcp : k == e->n_tcp + 1 ? e->n_tcp + 1 : k - 1)
                         : (k == 0 ? e->n_tcp + 1 : k - 1);
        struct kvp_rt_actor *a = i < e->n_tcp ? e->tcp[i] : i == e->n_tcp ? e->local : e->host;
        if (!a)
            continue;
        uint32_t t = i <= e->n_tcp ? type : add ? XH_LOCAL_ADD : XH_LOCAL_DEL;
        void *pl = &r;
        int r1 = call_status(a, t, segment_id, add ? &pl : NULL, NULL);
        if (r1 != KVP_OK && rc == KVP_OK)
            rc = r1;
    }
    return rc;
}

int kvp_xfer_register_local(struct kvp_xfer_engine *e, uint32_t segment_id, void *base, uint64_t size)
{
    if (!e || segment_id == 0 || !base || size == 0)
        return KVP_ERR_INVALID;
    int rc = local_req(e, XA_LOCAL_ADD, segment_id, base, size);
    if (rc != KVP_OK)
        local_req(e, XA_LOCAL_DEL, segment_id, NULL, 0);
    return rc;
}

int kvp_xfer_unregister_local(struct kvp_xfer_engine *e, uint32_t segment_id)
{
    if (!e)
        return KVP_ERR_INVALID;
    return local_req(e, XA_LOCAL_DEL, segment_id, NULL, 0);
}

static int mem_req(struct kvp_xfer_engine *e, uint32_t type, void *base, uint64_t len)
{
    if (!e || !base || len == 0)
        return KVP_ERR_INVALID;
    struct xfer_local_reg r = {0, base, len};
    int rc = KVP_OK;
    for (unsigned i = 0; i < e->n_tcp; i++) {
        void *pl = &r;
        int r1 = call_status(e->tcp[i], type, 0, &pl, NULL);
        if (r1 != KVP_OK && rc == KVP_OK)
            rc = r1;
    }
    return rc;
}

int kvp_xfer_mem_register(struct kvp_xfer_engine *e, void *base, uint64_t len)
{
    int rc = mem_req(e, XA_MEM_REG, base, len);
    if (rc != KVP_OK && rc != KVP_ERR_INVALID)
        (void)mem_req(e, XA_MEM_UNREG, base, len);
    return rc;
}

int kvp_xfer_mem_unregister(struct kvp_xfer_engine *e, void *base, uint64_t len)
{
    return mem_req(e, XA_MEM_UNREG, base, len);
}

static bool slice_valid(const struct kvp_xfer_slice *s)
{
    if (!s->local || s->length == 0)
        return false;
    if (s->op != KVP_XFER_READ && s->op != KVP_XFER_WRITE)
        return false;
    if (s->remote_offset + s->length < s->remote_offset)
        return false;
    return true;
}

int kvp_xfer_run(struct kvp_xfer_engine *e, struct kvp_xfer_slice *slices, size_t n, uint32_t timeout_ms)
{
    return kvp_xfer_run_overlap(e, slices, n, timeout_ms, NULL, NULL);
}

int kvp_xfer_run_overlap(struct kvp_xfer_engine *e, struct kvp_xfer_slice *slices, size_t n,
                         uint32_t timeout_ms, void (*overlap)(void *arg), void *arg)
{
    if (!e || (n > 0 && !slices))
        return KVP_ERR_INVALID;
    bool bad = false;
    for (size_t i = 0; i < n; i++)
        if (!slice_valid(&slices[i]))
            bad = true;
    if (bad) {
        for (size_t i = 0; i < n; i++)
            slices[i].status = slice_valid(&slices[i]) ? KVP_ERR_CANCELLED : KVP_ERR_INVALID;
        kvp_log_warn(ACTOR, "run: invalid slice (NULL buffer, zero length, bad op or offset overflow)");
        return KVP_ERR_INVALID;
    }
    for (size_t i = 0; i < n; i++)
        slices[i].status = KVP_OK;
    struct xfer_call c = {.slices = slices, .n = n, .timeout_ms = timeout_ms, .start_ns = kvp_clock_now_ns(),
                          .home_token = -1, .e = e};
    /* The write deadline the segment server enforces (C3): no later than this call's end. */
    if (timeout_ms)
        c.wdeadline_ms = kvp_clock_wall_ms() + timeout_ms;
    /* The home: a tcp actor no call is using now, if there is one (its token, taken from the
     * engine's `idle` mailbox; the home puts it back before it answers), else the calling
     * thread's own (its id modulo io_threads): concurrent calls spread over the actors, and no
     * counter is shared. */
    struct kvp_rt_msg *tok = NULL; /* the token message (freed at once: its arg is the index) */
    static __thread unsigned tid; /* the calling thread's id, asked once per thread */
    if (!tid)
        tid = (unsigned)syscall(SYS_gettid);
    unsigned idx = tid % e->n_tcp;
    c.tid = tid;
    /* With a batch host (the client actor) the call goes there: its batch actor picks the tcp
     * actor itself (it knows which have work), so no idle token is taken. */
    if (!e->host && e->idle && kvp_rt_recv(e->idle, 0, &tok) == KVP_OK) {
        if (tok->arg < e->n_tcp) {
            idx = (unsigned)tok->arg;
            c.home_token = (int64_t)idx;
        }
        kvp_rt_msg_destroy(&tok);
    }
    struct kvp_rt_actor *home = e->host ? e->host : e->tcp[idx];
    struct kvp_rt_actor *sink = NULL;
    int rc = kvp_rt_sink_new(&sink, "xfer-call");
    void *pl = &c;
    if (rc == KVP_OK)
        rc = kvp_rt_request_from(sink, home, 0, e->host ? XH_CALL : XA_CALL, 0, &pl, xfer_no_free, 1);
    if (rc != KVP_OK) { /* not sent: the token is still this call's to put back */
        kvp_rt_destroy(&sink);
        if (c.home_token >= 0)
            kvp_rt_send(e->idle, 0, 0, (uint64_t)c.home_token, NULL, NULL);
        for (size_t i = 0; i < n; i++)
            slices[i].status = rc;
        return rc;
    }
    /* The caller's own work while the transfer actors move the slices. */
    if (overlap)
        overlap(arg);
    struct kvp_rt_msg *r = NULL;
    rc = kvp_rt_recv(sink, UINT32_MAX, &r);
    /* Every path of the home answers only after the batch actor's fini (or before it spawned one). */
    if (rc == KVP_OK && r->status != KVP_OK && r->status != KVP_ERR_CLOSED) {
        for (size_t i = 0; i < n; i++)
            if (slices[i].status == KVP_OK)
                slices[i].status = r->status;
    }
    kvp_rt_msg_destroy(&r);
    kvp_rt_destroy(&sink);
    rc = KVP_OK;
    for (size_t i = 0; i < n; i++)
        if (slices[i].status != KVP_OK) {
            rc = slices[i].status;
            break;
        }
    return rc;
}
