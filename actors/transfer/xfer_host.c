/*
 * xfer_host.c — the batch host of an engine with kvp_xfer_params.batch_host: the client actor
 * hosts one batch actor per put/get call (DESIGN.md "Actors", issue 19 item 2).
 *
 * A call (kvp_xfer_run with a batch host) is one request from the caller's thread to the host
 * (XH_CALL), passed here by the host's handler (kvp_xfer_host_handle). The batch actor it spawns
 * is xfer_batch.c's, hosted with no direct ops: its remote xslices go to one tcp transfer actor
 * and the slices of segments registered in this process to xfer-local, each as one XA_WORK
 * request (one message per transfer actor per batch, not per slice), and every fence and abort is
 * a message; xfer_batch.c has the rules and the C2 argument. The engine's stop (XH_STOP, sent
 * first by kvp_xfer_engine_stop) fences every batch here with KVP_ERR_CLOSED at once and is
 * answered only when no batch is left. Besides the batches, the host keeps the routing table
 * (which segments are xfer-local's) and its counters, and runs its own hook (on_done) in each
 * batch actor's fini, after the test hook and before the caller's answer.
 *
 * The host's state (struct kvp_xfer_host) and its batch actors are touched only on the host's
 * thread; a work is touched only by the actor that holds it. Nothing here locks.
 */
#include <stdlib.h>

#include "actors/transfer/transfer_internal.h"
#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/log.h"

#define ACTOR "xfer-host"

/* The host's state (its thread only). */
struct kvp_xfer_host {
    struct xfer_bhost bh;       /* its batch actors (xfer_batch.c) */
    struct kvp_xfer_engine *e;  /* the engine of the first call (one engine per host) */
    struct kvp_xfer_stats st;   /* batches, slices, timeouts */
    void (*on_done)(void *arg, const struct kvp_xfer_slice *slices, size_t n); /* the host's hook */
    void *on_done_arg;
};

static void host_answering(void *owner, struct xfer_call *c, bool ran)
{
    struct kvp_xfer_host *h = owner;
    if (ran && h->on_done)
        h->on_done(h->on_done_arg, c->slices, c->n);
}

/* No direct ops: every work is lent to its transfer actor by XA_WORK. */
static const struct xfer_bhost_ops host_ops = {.answering = host_answering};

static struct kvp_xfer_host *host_alloc(void (*on_done)(void *, const struct kvp_xfer_slice *, size_t), void *arg)
{
    struct kvp_xfer_host *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->bh.ops = &host_ops;
    h->bh.owner = h;
    h->bh.name = ACTOR;
    h->bh.st = &h->st;
    h->on_done = on_done;
    h->on_done_arg = arg;
    return h;
}

static void host_call(struct kvp_xfer_host *h, struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m)
{
    struct xfer_call *c = m->payload;
    if (!c || !c->e) {
        kvp_log_error(ACTOR, "a call without its engine refused");
        xfer_bhost_refuse(NULL, ctx, m, KVP_ERR_INVALID);
        return;
    }
    if (!h->e) {
        h->e = c->e;
        h->bh.p = &h->e->p;
        h->bh.local = h->e->local;
        h->bh.tcp = h->e->tcp;
        h->bh.n_tcp = h->e->n_tcp;
    }
    if (c->e != h->e) {
        kvp_log_error(ACTOR, "a call from a second engine refused (one engine per batch host)");
        xfer_bhost_refuse(NULL, ctx, m, KVP_ERR_INVALID);
        return;
    }
    xfer_bhost_call(&h->bh, ctx, m);
}

int kvp_xfer_host_handle(struct kvp_rt_ctx *ctx, struct kvp_xfer_host **hp, struct kvp_rt_msg *m)
{
    if (!*hp && !(*hp = host_alloc(NULL, NULL))) {
        if (m->kind == KVP_RT_REQUEST) {
            if (m->type == XH_CALL)
                xfer_bhost_refuse(NULL, ctx, m, KVP_ERR_NOMEM);
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
        xfer_bhost_stop(&h->bh, ctx, m->corr_id); /* fencing only sends: none finishes here */
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
        int rc = id ? xfer_bhost_local_set(&h->bh, id, m->type == XH_LOCAL_ADD) : KVP_ERR_INVALID;
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
    struct kvp_xfer_host *h = host_alloc(on_done, arg);
    if (!h)
        return KVP_ERR_NOMEM;
    *out = h;
    return KVP_OK;
}

void kvp_xfer_host_free(struct kvp_xfer_host **hp)
{
    if (!hp || !*hp)
        return;
    struct kvp_xfer_host *h = *hp;
    *hp = NULL;
    if (h->bh.batches) { /* the runtime finishes every hosted batch before the host's fini */
        kvp_log_error(ACTOR, "batch host freed with batch actors alive: leaked");
        return;
    }
    xfer_bhost_free(&h->bh);
    free(h);
}
