/*
 * xfer_batch.c — the batch actor: one hosted actor per kvp_xfer_run call, in either of its two
 * hosts (struct xfer_bhost, transfer_internal.h): a tcp transfer actor (an engine without
 * params.batch_host: a segment's mover, the engine's tests; xfer_engine.c) or the engine's batch
 * host (the client actor; xfer_host.c). What the hosts do differently is in the host's ops; every
 * fence rule is here, once.
 *
 * The batch actor's start cuts the call's slices into two works: the remote xslices (pieces of at
 * most slice_bytes) and the slices of segments registered in this process. The local work goes to
 * xfer-local as one XA_WORK request. The remote work runs on the host's own transport when the
 * host is a tcp transfer actor (ops->direct_*: no message; it reports back by
 * xfer_batch_direct_done), else it goes as one XA_WORK request to one tcp transfer actor: one that
 * holds no work of this host now if there is one, else the calling thread's own (thread id modulo
 * io_threads). A lent work is the transfer actor's until it answers, which it does only once every
 * xslice of it is terminal (completed, failed, or fenced).
 *
 * The call's timeout is the batch actor's timer: it fences every work still out (XA_FENCE, or the
 * host's own transport) and starts the fence-bound timer, whose expiry aborts what the transports
 * could not fence (XA_ABORT; they tear it down and report KVP_ERR_FENCE_FAILED). The engine's stop
 * (XA_STOP / XH_STOP: xfer_bhost_stop) fences every batch with KVP_ERR_CLOSED and aborts at once.
 * The batch actor finishes when every work reported back: its fini runs the test hook
 * (on_batch_fini) and the host's, frees the works and answers the caller as its last act, so the
 * caller's thread returns only after every transfer actor let go of every slice (contract C2).
 *
 * Everything here runs on the host's thread; a work is touched only by the actor that holds it.
 * Nothing here locks.
 */
#include <stdlib.h>

#include "actors/transfer/transfer_internal.h"
#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define XB_NET 0   /* w[XB_NET]: the remote xslices */
#define XB_LOCAL 1 /* w[XB_LOCAL]: the ones of segments registered in this process, for xfer-local */

/* A batch actor's state (hosted in its host). */
struct xb {
    struct xfer_bhost *h;
    struct xfer_call *call;     /* the caller's (it waits for the answer) */
    uint64_t token;             /* the caller's request */
    uint64_t hid;
    struct xfer_work *w[2];
    struct kvp_rt_actor *to[2]; /* the transfer actor each work is lent to; NULL: the host runs it */
    uint64_t corr[2];           /* XA_WORK's request, for a lent work */
    bool out[2];                /* started and not reported back yet */
    unsigned tcp_idx;           /* a lent remote work: its tcp actor in h->tcp */
    size_t works_left;
    bool started, fenced, complete;
    bool stop_fenced;           /* the engine's stop fenced it */
    struct xb *prev, *next;     /* h->batches */
};

bool xfer_bhost_is_local(const struct xfer_bhost *h, uint32_t segment_id)
{
    for (size_t i = 0; i < h->n_local; i++)
        if (h->local_ids[i] == segment_id)
            return true;
    return false;
}

int xfer_bhost_local_set(struct xfer_bhost *h, uint32_t segment_id, bool add)
{
    for (size_t i = 0; i < h->n_local; i++)
        if (h->local_ids[i] == segment_id) {
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
    h->local_ids[h->n_local++] = segment_id;
    return KVP_OK;
}

void xfer_bhost_free(struct xfer_bhost *h)
{
    free(h->local_ids);
    h->local_ids = NULL;
    h->n_local = h->cap_local = 0;
}

void xfer_bhost_stop_check(struct xfer_bhost *h, struct kvp_rt_ctx *ctx)
{
    if (h->stop_owed && !h->batches && !(h->ops->busy && h->ops->busy(h->owner))) {
        h->stop_owed = false;
        kvp_rt_reply(ctx, h->stop_token, KVP_OK, 0, NULL, NULL);
    }
}

void xfer_bhost_refuse(struct xfer_bhost *h, struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m, int status)
{
    struct xfer_call *c = m->payload;
    for (size_t i = 0; c && i < c->n; i++)
        c->slices[i].status = status;
    if (h && c && h->ops->answering)
        h->ops->answering(h->owner, c, false);
    kvp_rt_reply(ctx, m->corr_id, status, 0, NULL, NULL);
}

/* Cut the call's slices into b's works. KVP_ERR_NOMEM or KVP_OK. */
static int batch_build(struct xb *b)
{
    const struct xfer_bhost *h = b->h;
    struct xfer_call *c = b->call;
    uint64_t piece_net = h->p->slice_bytes;
    size_t n[2] = {0, 0};
    for (size_t i = 0; i < c->n; i++) {
        struct kvp_xfer_slice *s = &c->slices[i];
        if (h->n_local && xfer_bhost_is_local(h, s->segment_id))
            n[XB_LOCAL]++;
        else if (!s->endpoint)
            s->status = KVP_ERR_INVALID;
        else
            n[XB_NET] += (size_t)((s->length + piece_net - 1) / piece_net);
    }
    for (int k = 0; k < 2; k++)
        if (n[k] && !(b->w[k] = xfer_work_new(n[k])))
            return KVP_ERR_NOMEM;
    for (size_t i = 0; i < c->n; i++) {
        struct kvp_xfer_slice *s = &c->slices[i];
        bool local = h->n_local && xfer_bhost_is_local(h, s->segment_id);
        if (!local && !s->endpoint)
            continue;
        struct xfer_work *w = b->w[local ? XB_LOCAL : XB_NET];
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

/* The tcp actor for a lent remote work: one that holds no work of this host now, looking from
 * the calling thread's own (its id modulo io_threads), else that one. */
static unsigned pick_tcp(const struct xfer_bhost *h, unsigned tid)
{
    unsigned n = h->n_tcp, start = tid % n;
    for (unsigned k = 0; k < n; k++) {
        unsigned i = (start + k) % n;
        if (h->lent[i] == 0)
            return i;
    }
    return start;
}

/* The running batch returns KVP_RT_DONE itself; another one that completed (its remote work,
 * run by the host, reported back from another batch's step or the host's poll) finishes here. */
static void batch_finish_maybe(struct kvp_rt_ctx *ctx, struct xb *b)
{
    if (!b->complete || b->h->running == b || !b->started)
        return;
    kvp_rt_hosted_finish(ctx, b->hid);
}

/* Work k of b reported back (status: a lent work's answer, not OK only when its actor closed
 * without answering; KVP_OK for the host's own), or was never sent: its statuses go into the
 * call's slices. */
static void work_back(struct xb *b, int k, int status)
{
    struct xfer_work *w = b->w[k];
    if (b->out[k] && b->to[k] && k == XB_NET && b->h->lent[b->tcp_idx] > 0)
        b->h->lent[b->tcp_idx]--;
    b->out[k] = false;
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

void xfer_batch_direct_done(struct kvp_rt_ctx *ctx, struct xb *b)
{
    work_back(b, XB_NET, KVP_OK);
    batch_finish_maybe(ctx, b);
}

static int batch_init(struct kvp_rt_ctx *ctx)
{
    struct xb *b = kvp_rt_state(ctx);
    struct xfer_bhost *h = b->h;
    struct xfer_call *c = b->call;
    b->hid = kvp_rt_self_hid(ctx);
    h->running = b;
    if (batch_build(b) != KVP_OK) {
        for (size_t i = 0; i < c->n; i++)
            c->slices[i].status = KVP_ERR_NOMEM;
        for (int k = 0; k < 2; k++) {
            xfer_work_free(b->w[k]);
            b->w[k] = NULL;
        }
    }
    b->works_left = (b->w[XB_NET] != NULL) + (b->w[XB_LOCAL] != NULL);
    b->complete = b->works_left == 0;
    if (c->timeout_ms && b->works_left) {
        uint64_t spent_ms = (kvp_clock_now_ns() - c->start_ns) / 1000000ull;
        uint32_t left = spent_ms >= c->timeout_ms ? 0 : c->timeout_ms - (uint32_t)spent_ms;
        kvp_rt_timer_start(ctx, left, 0, XB_TIMEOUT, NULL);
    }
    bool direct = h->ops->direct_start != NULL;
    if (b->w[XB_NET] && !direct) {
        b->tcp_idx = pick_tcp(h, c->tid);
        b->to[XB_NET] = h->tcp[b->tcp_idx];
    }
    b->to[XB_LOCAL] = h->local;
    for (int k = 0; k < 2; k++) { /* the lent works first: the host's own may finish at once */
        if (!b->w[k] || (k == XB_NET && direct))
            continue;
        void *pl = b->w[k];
        if (b->to[k] && kvp_rt_request(ctx, b->to[k], 0, XA_WORK, 0, &pl, xfer_no_free, 0, &b->corr[k]) == KVP_OK) {
            b->out[k] = true;
            if (k == XB_NET)
                h->lent[b->tcp_idx]++;
        } else { /* the transfer actor is closed: nothing of this work ran */
            for (size_t i = 0; i < b->w[k]->n; i++)
                b->w[k]->st[i] = KVP_ERR_CLOSED;
            work_back(b, k, KVP_OK);
        }
    }
    if (b->w[XB_NET] && direct) {
        b->w[XB_NET]->batch = b;
        b->w[XB_NET]->direct = true;
        b->out[XB_NET] = true;
        h->ops->direct_start(h->owner, ctx, b->w[XB_NET]);
    }
    b->started = true;
    h->running = NULL;
    return b->complete ? KVP_RT_DONE : KVP_OK;
}

/* Fence b's works still out: the lent ones by XA_FENCE, or with `now` (the engine's stop)
 * XA_ABORT carrying the status (fenced and aborted at once); the host's own on its transport.
 * Then, unless `now`, the fence bound's timer. A lent work is only sent messages: it is its
 * transfer actor's until that answers. With `now` b may be finished (freed) when this returns
 * (the host's own work completed; b is not the running one then). */
static void batch_fence(struct kvp_rt_ctx *ctx, struct xb *b, int status, bool now)
{
    struct xfer_bhost *h = b->h;
    b->fenced = true;
    size_t pieces = 0, works = 0;
    for (int k = 0; k < 2; k++) {
        struct xfer_work *w = b->w[k];
        if (!b->out[k])
            continue;
        if (!b->to[k]) { /* the host's own: its pending pieces */
            for (size_t i = 0; i < w->n; i++)
                pieces += w->st[i] == XS_PENDING;
            works++;
            continue;
        }
        void *pl = w;
        if (kvp_rt_send(b->to[k], 0, now ? XA_ABORT : XA_FENCE, (uint64_t)(int64_t)status, &pl,
                        xfer_no_free) == KVP_OK) {
            pieces += w->n;
            works++;
        }
    }
    kvp_log_info(h->name, "batch of %zu slices: %s; fencing %zu pieces in %zu works", b->call->n,
                 kvp_errname(status), pieces, works);
    if (b->out[XB_NET] && !b->to[XB_NET])
        h->ops->direct_fence(h->owner, ctx, b->w[XB_NET], status, now);
    if (!now && !b->complete) /* (not now: b is the running one, alive) */
        kvp_rt_timer_start(ctx, h->p->fence_bound_ms, 0, XB_BOUND, NULL);
}

static int batch_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m)
{
    struct xb *b = kvp_rt_state(ctx);
    struct xfer_bhost *h = b->h;
    h->running = b;
    if (m->kind == KVP_RT_TIMER && m->type == XB_TIMEOUT && !b->complete && !b->fenced) {
        h->st->timeouts++;
        batch_fence(ctx, b, KVP_ERR_TIMEOUT, false);
    } else if (m->kind == KVP_RT_TIMER && m->type == XB_BOUND && !b->complete) {
        for (int k = 0; k < 2; k++) {
            if (!b->out[k])
                continue;
            if (!b->to[k]) {
                h->ops->direct_abort(h->owner, ctx, b->w[k]);
            } else {
                void *pl = b->w[k];
                kvp_rt_send(b->to[k], 0, XA_ABORT, 0, &pl, xfer_no_free);
            }
        }
    } else if (m->kind == KVP_RT_REPLY) {
        for (int k = 0; k < 2; k++)
            if (b->out[k] && b->to[k] && m->corr_id == b->corr[k]) {
                work_back(b, k, m->status);
                break;
            }
    }
    h->running = NULL;
    return b->complete ? KVP_RT_DONE : KVP_OK;
}

static void batch_fini(struct kvp_rt_ctx *ctx)
{
    struct xb *b = kvp_rt_state(ctx);
    struct xfer_bhost *h = b->h;
    if (!b->complete) {
        /* The host stops with the batch unfinished: only after the engine's stop fenced
         * everything, so this is an ordering bug; the caller still gets an answer (CLOSED). */
        kvp_log_error(h->name, "batch actor finished before its works were (its host stopped before the engine)");
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
    if (h->p->on_batch_fini)
        h->p->on_batch_fini(b->call->slices, b->call->n, h->p->on_batch_fini_arg);
    if (h->ops->answering)
        h->ops->answering(h->owner, b->call, true);
    uint64_t token = b->token;
    if (b->complete) {
        xfer_work_free(b->w[XB_NET]);
        xfer_work_free(b->w[XB_LOCAL]);
    } /* else a transfer actor may still hold a work: leaked rather than freed under it */
    free(b);
    /* The answer is the last thing: the caller's thread returns only now. */
    kvp_rt_reply(ctx, token, KVP_OK, 0, NULL, NULL);
    xfer_bhost_stop_check(h, ctx);
}

static const struct kvp_rt_hosted_spec batch_spec = {.name = "batch", .handle = batch_handle, .fini = batch_fini};

void xfer_bhost_call(struct xfer_bhost *h, struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m)
{
    struct xfer_call *c = m->payload;
    if (h->stopping) {
        xfer_bhost_refuse(h, ctx, m, KVP_ERR_CLOSED);
        return;
    }
    if (c->n > 0) {
        h->st->batches++;
        h->st->slices += c->n;
    }
    struct xb *b = calloc(1, sizeof *b);
    if (!b) {
        xfer_bhost_refuse(h, ctx, m, KVP_ERR_NOMEM);
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
    int rc = kvp_rt_hosted_spawn_run(ctx, &batch_spec, b, batch_init, &hid);
    if (rc != KVP_OK) { /* only a spawn failure: batch_init returns KVP_OK or KVP_RT_DONE */
        h->batches = b->next;
        if (b->next)
            b->next->prev = NULL;
        free(b);
        xfer_bhost_refuse(h, ctx, m, rc);
    }
}

void xfer_bhost_stop(struct xfer_bhost *h, struct kvp_rt_ctx *ctx, uint64_t corr)
{
    if (h->stop_owed)
        kvp_rt_reply(ctx, h->stop_token, KVP_OK, 0, NULL, NULL);
    h->stopping = true;
    h->stop_token = corr;
    h->stop_owed = true;
    for (;;) { /* fencing the host's own work may finish (and free) any batch: walk again after each */
        struct xb *b = h->batches;
        while (b && (b->complete || b->stop_fenced))
            b = b->next;
        if (!b)
            break;
        b->stop_fenced = true;
        batch_fence(ctx, b, KVP_ERR_CLOSED, true);
    }
    xfer_bhost_stop_check(h, ctx);
}
