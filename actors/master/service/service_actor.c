/*
 * service_actor.c — the master service as a runtime actor (runtime/actor.h, docs/runtime.md).
 *
 * kvp_master_service_run spawns one threaded actor, named after the member ("master-<id>"), whose
 * state is the struct kvp_master_service that kvp_master_service_new built on the caller's thread
 * (before the actor exists; the spawn hands it over, and the caller touches it again only after
 * kvp_rt_stop has joined the thread: destroy). On the actor's thread run:
 *  - the watched sockets (svc_watch): the ROUTER (service.c), raftlog's events socket (service.c),
 *    the CURVE handshake monitor (service_auth.c), the DEALERs of the feature-level polls
 *    (service_version.c);
 *  - the timers (svc_timer_every): leadership (10 ms), RevokeExpired, QuarantineRelease,
 *    liveness and status refresh (service_soft.c), repair (service_repair.c), eviction
 *    (service_evict.c), the metrics snapshot (service_metrics.c), feature levels;
 *  - the replies of the prober, a threaded child actor (below) that runs the blocking data-plane
 *    probe so that the service never waits on a segment.
 * The caller's thread waits in run() on a sink (`ctl`, also the actor's parent): a STOP from
 * kvp_master_service_request_stop (any thread), a DONE from the actor when it must stop (its
 * raft log cannot be written), a KVP_RT_FAILED report, or czmq's SIGINT/SIGTERM flag.
 *
 * The raft thread stays raftlog's (libuv, raftlog/); the service talks to it by kvp_raftlog_submit
 * / _query / admin calls (queued to the raft thread) and reads its results from the events socket.
 * Committed state is read by message (a raftlog query), except the data path's reads
 * (GetReplicaList, Exists, GetSize), which read the FSM here between kvp_raftlog_read_begin and
 * _read_end: raftlog's rule (raftlog.h) is that the raft thread applies nothing between the two.
 */
#include <stdlib.h>
#include <string.h>

#include "actors/master/service/service_state.h"
#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "runtime/log.h"

/* Message types of the service actor, its prober and its ctl sink. */
enum {
    SVC_MSG_PROBE = 1,    /* service → prober request: payload struct svc_probe_ask; reply arg = segment */
    SVC_CTL_STOP = 2,     /* request_stop → ctl */
    SVC_CTL_DONE = 3,     /* actor → ctl: stop me (s->fatal says why) */
    SVC_MSG_TIMER = 1000, /* + index in s->timers */
};

/* ------------------------------------------------------------------ timers and watches */

int svc_timer_every(struct kvp_master_service *s, uint32_t every_ms, svc_timer_fn fn)
{
    if (!s->ctx || s->n_timers >= SVC_TIMERS_MAX)
        return KVP_ERR_INVALID;
    int rc = kvp_rt_timer_start(s->ctx, every_ms, every_ms, SVC_MSG_TIMER + (uint32_t)s->n_timers, NULL);
    if (rc == KVP_OK)
        s->timers[s->n_timers++] = fn;
    return rc;
}

static int on_watched(struct kvp_rt_ctx *ctx, void *handle)
{
    struct kvp_master_service *s = kvp_rt_state(ctx);
    if (s->stopping)
        return KVP_OK;
    s->ctx = ctx;
    for (size_t i = 0; i < s->n_watches; i++)
        if (s->watches[i].sock == handle) {
            s->watches[i].fn(s, s->watches[i].sock);
            break;
        }
    s->ctx = NULL;
    return KVP_OK;
}

int svc_watch(struct kvp_master_service *s, zsock_t *sock, svc_watch_fn fn)
{
    if (!s->ctx || !sock || s->n_watches >= SVC_WATCHES_MAX)
        return KVP_ERR_INVALID;
    int rc = kvp_rt_watch(s->ctx, sock, on_watched);
    if (rc == KVP_OK) {
        s->watches[s->n_watches].sock = sock;
        s->watches[s->n_watches].fn = fn;
        s->n_watches++;
    }
    return rc;
}

void svc_unwatch(struct kvp_master_service *s, zsock_t *sock)
{
    for (size_t i = 0; i < s->n_watches; i++)
        if (s->watches[i].sock == sock) {
            s->watches[i] = s->watches[--s->n_watches];
            if (s->ctx)
                kvp_rt_unwatch(s->ctx, sock); /* NOT_FOUND once closed: the runtime dropped it */
            return;
        }
}

void svc_stop_self(struct kvp_master_service *s)
{
    if (s->stopping)
        return;
    s->stopping = true; /* serve nothing more; run() stops the actor */
    for (size_t i = 0; i < s->n_watches; i++) /* readable sockets left unread would spin the loop */
        if (s->ctx)
            kvp_rt_unwatch(s->ctx, s->watches[i].sock);
    s->n_watches = 0;
    if (kvp_rt_send(s->ctl, 0, SVC_CTL_DONE, 0, NULL, NULL) != KVP_OK)
        kvp_log_error(s->actor, "stop: the waiting thread is gone");
}

/* ------------------------------------------------------------------ the prober */

/* A probe to run: the segment, its data-plane endpoint and the probe's bound. */
struct svc_probe_ask {
    uint32_t segment_id;
    uint32_t timeout_ms;
    char endpoint[];
};

/* The prober's handler: one kvp_xfer_probe per request (it blocks up to timeout_ms on this
 * thread, never on the service's), answered with its status and the segment id. */
static int prober_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    if (msg->kind != KVP_RT_REQUEST || msg->type != SVC_MSG_PROBE || !msg->payload)
        return KVP_OK; /* an unanswered request is answered CLOSED by the runtime */
    const struct svc_probe_ask *a = msg->payload;
    int rc = kvp_xfer_probe(a->endpoint, a->segment_id, a->timeout_ms);
    kvp_rt_reply(ctx, msg->corr_id, rc, a->segment_id, NULL, NULL);
    return KVP_OK;
}

static int prober_spawn(struct kvp_master_service *s)
{
    struct kvp_rt_spec spec = {.name = "prober", .handle = prober_handle};
    return kvp_rt_spawn(&s->prober, &spec, kvp_rt_self(s->ctx));
}

int svc_prober_start(struct kvp_master_service *s)
{
    s->endpoints = zhashx_new();
    if (!s->endpoints)
        return KVP_ERR_NOMEM;
    zhashx_set_duplicator(s->endpoints, (zhashx_duplicator_fn *)strdup);
    zhashx_set_destructor(s->endpoints, (zhashx_destructor_fn *)zstr_free);
    return prober_spawn(s);
}

int svc_prober_ask(struct kvp_master_service *s, uint32_t segment_id, const char *endpoint, uint32_t timeout_ms)
{
    if (!s->prober || !s->ctx)
        return KVP_ERR_CLOSED;
    size_t n = strlen(endpoint) + 1;
    struct svc_probe_ask *a = malloc(sizeof *a + n);
    if (!a)
        return KVP_ERR_NOMEM;
    a->segment_id = segment_id;
    a->timeout_ms = timeout_ms;
    memcpy(a->endpoint, endpoint, n);
    void *pl = a;
    uint64_t corr = 0;
    int rc = kvp_rt_request(s->ctx, s->prober, 0, SVC_MSG_PROBE, segment_id, &pl, NULL, 0, &corr);
    free(pl); /* still ours when the request failed */
    return rc;
}

/* ------------------------------------------------------------------ the actor */

static int actor_init(struct kvp_rt_ctx *ctx)
{
    struct kvp_master_service *s = kvp_rt_state(ctx);
    s->ctx = ctx;
    int rc = svc_loop_start(s); /* service.c: sockets and timers */
    if (rc == KVP_OK)
        svc_refresh_leadership(s);
    s->ctx = NULL;
    return rc;
}

static int actor_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct kvp_master_service *s = kvp_rt_state(ctx);
    s->ctx = ctx;
    if (msg->kind == KVP_RT_TIMER && msg->type >= SVC_MSG_TIMER && msg->type - SVC_MSG_TIMER < s->n_timers) {
        if (!s->stopping && s->timers[msg->type - SVC_MSG_TIMER](s) < 0)
            svc_stop_self(s);
    } else if (msg->kind == KVP_RT_REPLY && msg->type == SVC_MSG_PROBE) {
        /* CLOSED too (the prober or this actor is stopping, or a failed prober's queue): the
         * probe is no longer out, or probes_out would stay at its cap and nothing be probed. */
        svc_on_probe_result(s, (uint32_t)msg->arg, msg->status);
    } else if (msg->kind == KVP_RT_FAILED && msg->payload) {
        /* The prober's handler does not fail; should it, start a fresh one (the probes it had
         * were answered CLOSED and are retried on the next report). */
        const struct kvp_rt_failure *f = msg->payload;
        kvp_log_error(s->actor, "child %s failed (%s): restarting it", f->name, kvp_strerror(f->err));
        if (f->child == s->prober) {
            kvp_rt_destroy(&s->prober);
            if (prober_spawn(s) != KVP_OK)
                kvp_log_error(s->actor, "prober could not be restarted: reported segments are not probed");
        }
    }
    s->ctx = NULL;
    return KVP_OK;
}

static void actor_fini(struct kvp_rt_ctx *ctx)
{
    struct kvp_master_service *s = kvp_rt_state(ctx);
    s->ctx = ctx;
    svc_version_stop(s);
    kvp_rt_destroy(&s->prober); /* waits for a probe in progress (bounded by probe_timeout_ms) */
    zhashx_destroy(&s->endpoints);
    s->n_watches = 0;
    s->n_timers = 0;
    s->ctx = NULL;
}

int kvp_master_service_run(struct kvp_master_service *s)
{
    if (!s || !s->ctl)
        return KVP_ERR_INVALID;
    s->stopping = false;
    struct kvp_rt_spec spec = {
        .name = s->actor, .init = actor_init, .handle = actor_handle, .fini = actor_fini, .state = s};
    int rc = kvp_rt_spawn(&s->rt, &spec, s->ctl); /* ctl hears of a failure (supervision) */
    if (rc != KVP_OK) {
        kvp_log_error(s->actor, "service actor did not start: %s", kvp_strerror(rc));
        return rc; /* init's own error (svc_loop_start names the step), or the spawn's */
    }
    const char *why = "requested";
    int failed = KVP_OK;
    for (;;) {
        struct kvp_rt_msg *m = NULL;
        int r = kvp_rt_recv(s->ctl, 50, &m); /* 50 ms: how soon a signal is seen */
        if (r == KVP_OK) {
            if (m->kind == KVP_RT_FAILED && m->payload) {
                failed = ((struct kvp_rt_failure *)m->payload)->err;
                why = "its actor failed";
            } else if (m->type == SVC_CTL_DONE) {
                why = "its raft log cannot be written";
            }
            kvp_rt_msg_destroy(&m);
            break;
        }
        if (r != KVP_ERR_TIMEOUT) {
            why = "its control mailbox closed";
            break;
        }
        if (zsys_interrupted) {
            why = "signal";
            break;
        }
    }
    kvp_log_info(s->actor, "stopping (%s)", why);
    int src = kvp_rt_stop(s->rt);
    kvp_rt_destroy(&s->rt);
    if (failed != KVP_OK || src != KVP_OK) {
        kvp_log_error(s->actor, "service actor failed: %s: the process stops",
                      kvp_strerror(failed != KVP_OK ? failed : src));
        return failed != KVP_OK ? failed : src;
    }
    return s->fatal ? KVP_ERR_IO : KVP_OK;
}

void kvp_master_service_request_stop(struct kvp_master_service *s)
{
    if (s && s->ctl)
        kvp_rt_send(s->ctl, 0, SVC_CTL_STOP, 0, NULL, NULL); /* a message: run() wakes at once */
}
