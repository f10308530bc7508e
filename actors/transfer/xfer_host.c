/*
 * xfer_host.c — batch actors hosted by another actor (kvp_xfer_params.batch_host): the client
 * actor hosts one per put/get call (DESIGN.md "Actors", issue 19 item 2).
 *
 * A call (kvp_xfer_run with a batch host) is one request from the caller's thread to the host
 * (XH_CALL). The host spawns a hosted batch actor whose start cuts the call's slices into two
 * works: the remote xslices (pieces of at most slice_bytes) for one tcp transfer actor — one that
 * has no work of this host now if there is one, else the calling thread's own (thread id modulo
 * io_threads) — and the slices of segments registered in this process for xfer-local. Each goes
 * to its transfer actor as one XA_WORK request (one message per transfer actor per batch, not
 * per slice); the work is lent until the answer, and the transfer actor answers only once every
 * xslice of it is terminal (completed, failed, or fenced). The call's timeout is the batch
 * actor's timer: it sends XA_FENCE to every transfer actor that has not answered and starts the
 * fence-bound timer, whose expiry sends XA_ABORT (the transport tears down what it could not
 * fence and reports KVP_ERR_FENCE_FAILED). The engine's stop (XH_STOP, sent first by
 * kvp_xfer_engine_stop) fences every batch here with KVP_ERR_CLOSED at once and is answered
 * only when no batch is left. The batch actor finishes when every work was answered: its fini
 * runs the test hook (on_batch_fini), frees the works, and answers the caller as its last act:
 * so the caller's thread returns only after every transfer actor let go of every slice (C2).
 *
 * The host's state (struct kvp_xfer_host) and its batch actors are touched only on the host's
 * thread; a work is touched only by the actor that holds it. Nothing here locks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/transfer/transfer_internal.h"
#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define ACTOR "xfer-host"
#define HB_TCP 0   /* works[HB_TCP]: the remote xslices, for one tcp transfer actor */
#define HB_LOCAL 1 /* works[HB_LOCAL]: the local ones, for xfer-local */

struct hb;

/* The host's batch state (its thread only). */
struct kvp_xfer_host {
    struct kvp_xfer_engine *e;  /* the engine of the first call (one engine per host) */
    uint32_t *local_ids;        /* segments registered with xfer-local (routing) */
    size_t n_local, cap_local;
    unsigned lent[XFER_MAX_IO_THREADS]; /* works of this host that each tcp actor holds now */
    struct hb *batches;         /* live batch actors */
    bool stopping;
    bool stop_owed;             /* stop_token holds an unanswered XH_STOP */
    uint64_t stop_token;
    struct kvp_xfer_stats st;   /* batches, slices, timeouts */
    void (*on_done)(void *arg, const struct kvp_xfer_slice *slices, size_t n); /* the host's hook */
    void *on_done_arg;
};

/* A batch actor's state (hosted in the host). */
struct hb {
    struct kvp_xfer_host *h;
    struct xfer_call *call;     /* the caller's (it waits for the answer) */
    uint64_t token;             /* the caller's request */
    struct xfer_work *w[2];
    struct kvp_rt_actor *to[2]; /* the transfer actor each work is lent to */
    uint64_t corr[2];
    bool lent[2];               /* sent (XA_WORK), answer due */
    bool done[2];               /* answered (or never sent) */
    unsigned tcp_idx;
    size_t works_left;
    bool fenced, complete, stop_fenced;
    struct hb *prev, *next;
};

static bool is_local(const struct kvp_xfer_host *h, uint32_t id)
{
    for (size_t i = 0; i < h->n_local; i++)
        if (h->local_ids[i] == id)
            return true;
    return false;
}

static void stop_check(struct kvp_xfer_host *h, struct kvp_rt_ctx *ctx)
{
    if (h->stop_owed && !h->batches) {
        h->stop_owed = false;
        kvp_rt_reply(ctx, h->stop_token, KVP_OK, 0, NULL, NULL);
    }
}

/* Cut the call's slices into b's works (as the tcp-hosted batch does). KVP_ERR_NOMEM or KVP_OK. */
static int hb_build(struct hb *b)
{
    const struct kvp_xfer_host *h = b->h;
    struct xfer_call *c = b->call;
    uint64_t piece_net = h->e->p.slice_bytes;
    size_t n[2] = {0, 0};
    for (size_t i = 0; i < c->n; i++) {
        struct kvp_xfer_slice *s = &c->slices[i];
        if (h->n_local && is_local(h, s->segment_id))
            n[HB_LOCAL]++;
        else if (!s->endpoint)
            s->status = KVP_ERR_INVALID;
        else
            n[HB_TCP] += (size_t)((s->length + piece_net - 1) / piece_net);
    }
    for (int k = 0; k < 2; k++)
        if (n[k] && !(b->w[k] = xfer_work_new(n[k])))
            return KVP_ERR_NOMEM;
    for (size_t i = 0; i < c->n; i++) {
        struct kvp_xfer_slice *s = &c->slices[i];
        bool local = h->n_local && is_local(h, s->segment_id);
        if (!local && !s->endpoint)
            continue;
        struct xfer_work *w = b->w[local ? HB_LOCAL : HB_TCP];
        uint64_t piece = local ? s->length : piece_net;
        for (uint64_t off = 0; off < s->length; off += piece) {
            uint64_t len = s->length - off < piece ? s->length - off : piece;
            w->xs[w->n] = (struct kvp_xport_slice){
                .op = s->op,
                .local = (uint8_t *)s->local + off,
                .length = len,
                .segment_id = s->segment_id,
                .remote_offset = s->remote_offset + off,
                .write_deadline_ms = s->op == KVP_XFER_WRITE ? c->wdeadline_ms : 0};
            w->ep[w->n] = s->endpoint;
            w->slice_of[w->n] = (uint32_t)i;
            w->n++;
        }
    }
    return KVP_OK;
}

/* The tcp actor for a batch: one that holds no work of this host now, looking from the calling
 * thread's own (its id modulo io_threads), else that one. */
static unsigned pick_tcp(const struct kvp_xfer_host *h, unsigned tid)
{
    unsigned n = h->e->n_tcp, start = tid % n;
    for (unsigned k = 0; k < n; k++) {
        unsigned i = (start + k) % n;
        if (h->lent[i] == 0)
            return i;
    }
    return start;
}

/* Work k of b is answered (status: the answer's; not OK only when its actor closed without
 * answering) or was never sent: its statuses go into the call's slices. */
static void hb_work_done(struct hb *b, int k, int status)
{
    struct xfer_work *w = b->w[k];
    if (b->lent[k] && k == HB_TCP && b->h->lent[b->tcp_idx] > 0)
        b->h->lent[b->tcp_idx]--;
    b->lent[k] = false;
    b->done[k] = true;
    struct kvp_xfer_slice *s = b->call->slices;
    for (size_t i = 0; i < w->n; i++) {
        int st = w->st[i];
        if (status != KVP_OK && (st == KVP_OK || st == XS_PENDING))
            st = status; /* the actor closed first: it may not even have started the work */
        else if (st == XS_PENDING)
            st = KVP_ERR_CLOSED;
        if (st != KVP_OK && s[w->slice_of[i]].status == KVP_OK)
            s[w->slice_of[i]].status = st;
    }
    if (--b->works_left == 0)
        b->complete = true;
}

static int hb_init(struct kvp_rt_ctx *ctx)
{
    struct hb *b = kvp_rt_state(ctx);
    struct kvp_xfer_host *h = b->h;
    struct xfer_call *c = b->call;
    if (hb_build(b) != KVP_OK) {
        for (size_t i = 0; i < c->n; i++)
            c->slices[i].status = KVP_ERR_NOMEM;
        for (int k = 0; k < 2; k++) {
            xfer_work_free(b->w[k]);
            b->w[k] = NULL;
        }
    }
    b->works_left = (b->w[HB_TCP] != NULL) + (b->w[HB_LOCAL] != NULL);
    b->complete = b->works_left == 0;
    if (c->timeout_ms && b->works_left) {
        uint64_t spent_ms = (kvp_clock_now_ns() - c->start_ns) / 1000000ull;
        uint32_t left = spent_ms >= c->timeout_ms ? 0 : c->timeout_ms - (uint32_t)spent_ms;
        kvp_rt_timer_start(ctx, left, 0, XB_TIMEOUT, NULL);
    }
    if (b->w[HB_TCP]) {
        b->tcp_idx = pick_tcp(h, c->tid);
        b->to[HB_TCP] = h->e->tcp[b->tcp_idx];
    }
    b->to[HB_LOCAL] = h->e->local;
    for (int k = 0; k < 2; k++) {
        if (!b->w[k])
            continue;
        void *pl = b->w[k];
        if (kvp_rt_request(ctx, b->to[k], 0, XA_WORK, 0, &pl, xfer_no_free, 0, &b->corr[k]) == KVP_OK) {
            b->lent[k] = true;
            if (k == HB_TCP)
                h->lent[b->tcp_idx]++;
        } else { /* the transfer actor is closed: nothing of this work ran */
            for (size_t i = 0; i < b->w[k]->n; i++)
                b->w[k]->st[i] = KVP_ERR_CLOSED;
            hb_work_done(b, k, KVP_OK);
        }
    }
    return b->complete ? KVP_RT_DONE : KVP_OK;
}

/* Fence b's works still lent: XA_FENCE (then the fence bound's timer), or with `now` (stop)
 * XA_ABORT carrying the status: fenced and aborted at once. Only messages: the works are the
 * transfer actors' until they answer. */
static void hb_fence(struct kvp_rt_ctx *ctx, struct hb *b, int status, bool now)
{
    b->fenced = true;
    size_t works = 0;
    for (int k = 0; k < 2; k++) {
        if (!b->lent[k])
            continue;
        void *pl = b->w[k];
        if (kvp_rt_send(b->to[k], 0, now ? XA_ABORT : XA_FENCE, (uint64_t)(int64_t)status, &pl,
                        xfer_no_free) == KVP_OK)
            works++;
    }
    kvp_log_info(ACTOR, "batch of %zu slices: %s; fencing its works on %zu transfer actors", b->call->n,
                 kvp_errname(status), works);
    if (!now && !b->complete)
        kvp_rt_timer_start(ctx, b->h->e->p.fence_bound_ms, 0, XB_BOUND, NULL);
}

static int hb_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m)
{
    struct hb *b = kvp_rt_state(ctx);
    if (m->kind == KVP_RT_TIMER && m->type == XB_TIMEOUT && !b->complete && !b->fenced) {
        b->h->st.timeouts++;
        hb_fence(ctx, b, KVP_ERR_TIMEOUT, false);
    } else if (m->kind == KVP_RT_TIMER && m->type == XB_BOUND && !b->complete) {
        for (int k = 0; k < 2; k++) {
            void *pl = b->w[k];
            if (b->lent[k])
                kvp_rt_send(b->to[k], 0, XA_ABORT, 0, &pl, xfer_no_free);
        }
    } else if (m->kind == KVP_RT_REPLY) {
        for (int k = 0; k < 2; k++)
            if (b->lent[k] && m->corr_id == b->corr[k]) {
                hb_work_done(b, k, m->status);
                break;
            }
    }
    return b->complete ? KVP_RT_DONE : KVP_OK;
}

static void hb_fini(struct kvp_rt_ctx *ctx)
{
    struct hb *b = kvp_rt_state(ctx);
    struct kvp_xfer_host *h = b->h;
    if (!b->complete) {
        /* The host closes with the batch unfinished: only after the engine's stop fenced
         * everything, so this is an ordering bug; the caller still gets an answer (CLOSED). */
        kvp_log_error(ACTOR, "batch actor finished before its works were (host stopped before the engine)");
        for (size_t i = 0; i < b->call->n; i++)
            if (b->call->slices[i].status == KVP_OK)
                b->call->slices[i].status = KVP_ERR_CLOSED;
    }
    if (b->prev)
        b->prev->next = b->next;
    else if (h->batches == b)
        h->batches = b->next;
    if (b->next)
        b->next->prev = b->prev;
    if (h->on_done)
        h->on_done(h->on_done_arg, b->call->slices, b->call->n);
    if (h->e->p.on_batch_fini)
        h->e->p.on_batch_fini(b->call->slices, b->call->n, h->e->p.on_batch_fini_arg);
    uint64_t token = b->token;
    if (b->complete) {
        xfer_work_free(b->w[HB_TCP]);
        xfer_work_free(b->w[HB_LOCAL]);
    } /* else a transfer actor may still hold a work: leaked rather than freed under it */
    free(b);
    /* The answer is the last thing: the caller's thread returns only now. */
    kvp_rt_reply(ctx, token, KVP_OK, 0, NULL, NULL);
    stop_check(h, ctx);
}

static const struct kvp_rt_hosted_spec hb_spec = {.name = "batch", .handle = hb_handle, .fini = hb_fini};

/* Refuse a call before any batch actor: every slice gets `status`, the caller its answer. */
static void call_refuse(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m, int status)
{
    struct xfer_call *c = m->payload;
    for (size_t i = 0; c && i < c->n; i++)
        c->slices[i].status = status;
    kvp_rt_reply(ctx, m->corr_id, status, 0, NULL, NULL);
}

static void host_call(struct kvp_xfer_host *h, struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m)
{
    struct xfer_call *c = m->payload;
    if (!c || !c->e) {
        kvp_log_error(ACTOR, "a call without its engine refused");
        call_refuse(ctx, m, KVP_ERR_INVALID);
        return;
    }
    if (!h->e)
        h->e = c->e;
    if (c->e != h->e) {
        kvp_log_error(ACTOR, "a call from a second engine refused (one engine per batch host)");
        call_refuse(ctx, m, KVP_ERR_INVALID);
        return;
    }
    if (h->stopping) {
        call_refuse(ctx, m, KVP_ERR_CLOSED);
        return;
    }
    if (c->n > 0) {
        h->st.batches++;
        h->st.slices += c->n;
    }
    struct hb *b = calloc(1, sizeof *b);
    if (!b) {
        call_refuse(ctx, m, KVP_ERR_NOMEM);
        return;
    }
    b->h = h;
    b->call = c;
    b->token = m->corr_id;
    b->next = h->batches;
    if (h->batches)
        h->batches->prev = b;
    h->batches = b;
    uint64_t hid;
    int rc = kvp_rt_hosted_spawn_run(ctx, &hb_spec, b, hb_init, &hid);
    if (rc != KVP_OK) { /* only a spawn failure: hb_init returns KVP_OK or KVP_RT_DONE */
        h->batches = b->next;
        if (b->next)
            b->next->prev = NULL;
        free(b);
        call_refuse(ctx, m, rc);
    }
}

static int local_set(struct kvp_xfer_host *h, uint32_t id, bool add)
{
    for (size_t i = 0; i < h->n_local; i++)
        if (h->local_ids[i] == id) {
            if (!add)
                h->local_ids[i] = h->local_ids[--h->n_local];
            return KVP_OK;
        }
    if (!add)
        return KVP_ERR_NOT_FOUND;
    if (h->n_local == h->cap_local) {
        size_t nc = h->cap_local ? h->cap_local * 2 : 4;
        uint32_t *ni = realloc(h->local_ids, nc * sizeof *ni);
        if (!ni)
            return KVP_ERR_NOMEM;
        h->local_ids = ni;
        h->cap_local = nc;
    }
    h->local_ids[h->n_local++] = id;
    return KVP_OK;
}

int kvp_xfer_host_handle(struct kvp_rt_ctx *ctx, struct kvp_xfer_host **hp, struct kvp_rt_msg *m)
{
    if (!*hp && !(*hp = calloc(1, sizeof **hp))) {
        if (m->kind == KVP_RT_REQUEST) {
            if (m->type == XH_CALL)
                call_refuse(ctx, m, KVP_ERR_NOMEM);
            else
                kvp_rt_reply(ctx, m->corr_id, KVP_ERR_NOMEM, 0, NULL, NULL);
        }
        return KVP_OK;
    }
    struct kvp_xfer_host *h = *hp;
    if (m->kind != KVP_RT_REQUEST) {
        kvp_log_warn(ACTOR, "message type %u is not a request: ignored", m->type);
        return KVP_OK;
    }
    switch (m->type) {
    case XH_CALL:
        host_call(h, ctx, m);
        break;
    case XH_STOP:
        if (h->stop_owed)
            kvp_rt_reply(ctx, h->stop_token, KVP_OK, 0, NULL, NULL);
        h->stopping = true;
        h->stop_token = m->corr_id;
        h->stop_owed = true;
        for (struct hb *b = h->batches; b; b = b->next) /* fencing only sends: none finishes here */
            if (!b->complete && !b->stop_fenced) {
                b->stop_fenced = true;
                hb_fence(ctx, b, KVP_ERR_CLOSED, true);
            }
        stop_check(h, ctx);
        break;
    case XH_STATS: {
        struct kvp_xfer_stats *st = malloc(sizeof *st);
        if (!st) {
            kvp_rt_reply(ctx, m->corr_id, KVP_ERR_NOMEM, 0, NULL, NULL);
            break;
        }
        *st = h->st;
        void *pl = st;
        if (kvp_rt_reply(ctx, m->corr_id, KVP_OK, 0, &pl, NULL) != KVP_OK)
            free(pl);
        break;
    }
    case XH_LOCAL_ADD:
    case XH_LOCAL_DEL: {
        const struct xfer_local_reg *r = m->payload;
        uint32_t id = m->type == XH_LOCAL_ADD ? (r ? r->segment_id : 0) : (uint32_t)m->arg;
        int rc = id ? local_set(h, id, m->type == XH_LOCAL_ADD) : KVP_ERR_INVALID;
        kvp_rt_reply(ctx, m->corr_id, rc, 0, NULL, NULL);
        break;
    }
    default:
        kvp_log_warn(ACTOR, "unknown request type %u refused", m->type);
        kvp_rt_reply(ctx, m->corr_id, KVP_ERR_INVALID, 0, NULL, NULL);
        break;
    }
    return KVP_OK;
}

int kvp_xfer_host_new(struct kvp_xfer_host **out,
                      void (*on_done)(void *arg, const struct kvp_xfer_slice *slices, size_t n), void *arg)
{
    if (!out)
        return KVP_ERR_INVALID;
    struct kvp_xfer_host *h = calloc(1, sizeof *h);
    if (!h)
        return KVP_ERR_NOMEM;
    h->on_done = on_done;
    h->on_done_arg = arg;
    *out = h;
    return KVP_OK;
}

void kvp_xfer_host_free(struct kvp_xfer_host **hp)
{
    if (!hp || !*hp)
        return;
    struct kvp_xfer_host *h = *hp;
    *hp = NULL;
    if (h->batches) { /* the runtime finishes every hosted batch before the host's fini */
        kvp_log_error(ACTOR, "batch host freed with batch actors alive: leaked");
        return;
    }
    free(h->local_ids);
    free(h);
}
