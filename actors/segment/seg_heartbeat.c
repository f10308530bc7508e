/*
 * seg_heartbeat.c — the segment's heartbeat actor ("heartbeat", a child of the segment's
 * supervisor; see segment_state.h).
 *
 * Every heartbeat_ms (a runtime timer) it sends a Heartbeat through the master session without
 * blocking (kvp_msession_request; the answer is a reply message); at most one request is in
 * flight, a tick that finds one still out is skipped. From the answers:
 *  - LOST or unknown (NOT_FOUND): the master dropped this segment's replicas: remount as a new
 *    segment (the data plane refuses data meanwhile); a failed remount leaves id 0 and the next
 *    tick tries again;
 *  - DRAINING on a kvpool-segment daemon (no on_mount hook): SIGTERM to itself, once, which runs
 *    the daemon's drain-and-exit path;
 *  - other errors: one WARN, retried every period; one INFO when answered again.
 * RDMA (protocol=rdma with a device): every heartbeat says rdma_writers and carries Fenced (the
 * last FenceWriter run); a FenceWriter in an answer with a new seq fences the writers' QPs at
 * once (seg_rdma.h) and the next heartbeat goes out right away with its Fenced, so that the
 * leader frees what it held for it (docs/rdma.md "FenceWriter and Fenced").
 * Range verification (seg_verify.h): the RangeVerify of an answer are queued, up to
 * KVP_SEG_VERIFY_BUDGET_BYTES of them hashed on this thread right after the answer (and at each
 * tick), and the next heartbeat, which goes out right away while there are answers or ranges left,
 * carries the RangeSums. A range larger than the budget takes several heartbeats.
 * Stall fence: when two ticks are more than 3 periods + 1 s apart (SIGSTOP, a paused VM), the
 * master may have declared the segment lost: the data plane refuses data until a heartbeat
 * confirms the id.
 *
 * Mount changes and fences go to the data-plane server's loop 0, the RDMA side's owner
 * (seg_server_rdma.c), by message: this actor never blocks on it. Two of them gate what this
 * actor tells the master next, so it waits for loop 0's reply (HB_RDMA, ticks skipped meanwhile)
 * before going on:
 *  - remount: id 0 (every writer of the old mount fenced) before the MountSegment goes out: the
 *    new mount lets the master place objects in this region again;
 *  - FenceWriter: the QPs fenced before the Fenced that lets the leader free the space (its
 *    selectors, FenceWriter.writers of the per-writer fence, are copied into the message).
 * The other three are one-way (kvp_seg_server_set_id_post): the stall fence (id 0; the beat that
 * follows only asks the master to confirm), the confirmation and the mount's answer (the new id:
 * a remount's id 0 came first, so no writer of an old mount is left to fence). Loop 0 runs them
 * in the order this actor sent them, before any later request of this actor.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "actors/segment/seg_rdma.h"
#include "actors/segment/seg_server.h"
#include "actors/segment/seg_verify.h"
#include "actors/segment/segment_state.h"
#include "actors/session/msession.h"
#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/clock.h"
#include "runtime/log.h"

enum { HB_MSG_TICK = 1 };

/* What the request in flight is: a heartbeat or a mount (to the master), or a step on the RDMA
 * side (to the server's loop 0; hb_next says what follows its reply). */
enum hb_wait { HB_IDLE, HB_BEAT, HB_MOUNT, HB_RDMA };
enum hb_next { NEXT_MOUNT, NEXT_FENCED };

struct hb_state {
    struct kvp_segment *s;
    uint32_t period;     /* ms between heartbeats */
    uint32_t timeout;    /* ms: a heartbeat's (and a remount's) call timeout */
    enum hb_wait wait;   /* the request in flight */
    uint64_t corr;       /* its correlation id */
    uint32_t beat_id;    /* the id the heartbeat in flight (or the FenceWriter being run) was for */
    enum hb_next next;   /* HB_RDMA: what its reply leads to */
    uint64_t fence_seq;  /* NEXT_FENCED: the FenceWriter.seq being run */
    bool failing;        /* a WARN was logged for the current run of failures */
    bool fenced;         /* the data plane refuses data until a heartbeat confirms the id */
    bool drain_signalled;
    uint64_t last_tick_ms;
    struct kvp_seg_fence_ack fence; /* the last FenceWriter run (seg_rdma.h) */
    struct kvp_seg_verify verify;   /* the leader's RangeVerify, queued and answered (seg_verify.h) */
};

static int send_beat(struct kvp_rt_ctx *ctx, struct hb_state *h, uint32_t id);

static int send_mount(struct kvp_rt_ctx *ctx, struct hb_state *h)
{
    Kvp__Request req;
    Kvp__MountSegmentReq m;
    kvp_seg_mount_req(h->s, &req, &m);
    int rc = kvp_msession_request(ctx, h->s->ms, &req, h->timeout, &h->corr);
    if (rc == KVP_OK)
        h->wait = HB_MOUNT;
    return rc;
}

/* The MountSegment of a remount, once loop 0 has fenced the old mount's writers. */
static int remount_send(struct kvp_rt_ctx *ctx, struct hb_state *h)
{
    int rc = send_mount(ctx, h);
    if (rc == KVP_ERR_NOMEM)
        return rc; /* fails the actor: the supervisor restarts it */
    if (rc != KVP_OK)
        kvp_log_warn(h->s->actor, "remount: %s (next try in %u ms)", kvp_errname(rc), h->period);
    return KVP_OK;
}

/* The master does not know the segment (or declared it lost): remount as a new one. The data
 * plane goes to id 0 first (every writer of the old mount fenced), then the MountSegment goes
 * out (remount_send, on loop 0's reply). */
static int remount(struct kvp_rt_ctx *ctx, struct hb_state *h, uint32_t id)
{
    struct kvp_segment *s = h->s;
    kvp_log_warn(s->actor, "segment %u unknown to the master: remounting as a new segment", id);
    int rc = kvp_seg_server_set_id_request(ctx, s->srv, 0, &h->corr);
    if (rc == KVP_ERR_NOMEM)
        return rc;
    if (rc != KVP_OK) { /* the server is stopping */
        kvp_log_warn(s->actor, "remount: data plane: %s (next try in %u ms)", kvp_errname(rc), h->period);
        return KVP_OK;
    }
    h->wait = HB_RDMA;
    h->next = NEXT_MOUNT;
    return KVP_OK;
}

static void on_mount_reply(struct hb_state *h, int rc, Kvp__Response *resp)
{
    struct kvp_segment *s = h->s;
    if (kvp_seg_mount_apply(s, rc, resp, false, true) != KVP_OK) {
        uint32_t old = atomic_exchange_explicit(&s->id, 0, memory_order_relaxed);
        if (old && s->hooks.on_mount)
            s->hooks.on_mount(s->hooks.ctx, old, 0, NULL, 0);
    }
    h->failing = false;
    h->fenced = false;
    h->fence = (struct kvp_seg_fence_ack){0}; /* a new id: the leader asks afresh */
}

/* A one-way mount change (see the file comment). Fails the actor only when out of memory. */
static int post_id(struct hb_state *h, uint32_t id)
{
    int rc = kvp_seg_server_set_id_post(h->s->srv, id);
    if (rc == KVP_ERR_NOMEM)
        return rc;
    if (rc != KVP_OK)
        kvp_log_warn(h->s->actor, "data plane: set id %u: %s", id, kvp_errname(rc));
    return KVP_OK;
}

/* Hash the next budget of queued ranges (seg_verify.h). true: a heartbeat should go out now
 * (answers to send, or ranges left for the steps that follow its answer). */
static bool verify_step(struct hb_state *h)
{
    struct kvp_seg_verify *v = &h->verify;
    if (!v->n)
        return false;
    if (kvp_seg_verify_pending(v))
        kvp_seg_verify_step(v, h->s->base, KVP_SEG_VERIFY_BUDGET_BYTES);
    return v->n > 0;
}

static int on_beat_reply(struct kvp_rt_ctx *ctx, struct hb_state *h, int rc, Kvp__Response *resp)
{
    struct kvp_segment *s = h->s;
    uint32_t id = h->beat_id;
    if (rc == KVP_OK)
        rc = resp->status;
    if (rc == KVP_OK && resp->body_case == KVP__RESPONSE__BODY_HEARTBEAT && resp->heartbeat &&
        resp->heartbeat->state == KVP__SEGMENT_STATE__SEGMENT_LOST)
        rc = KVP_ERR_NOT_FOUND; /* same meaning: the master dropped our replicas */
    if (rc == KVP_OK && resp->body_case == KVP__RESPONSE__BODY_HEARTBEAT && resp->heartbeat &&
        resp->heartbeat->state == KVP__SEGMENT_STATE__SEGMENT_DRAINING && !s->hooks.on_mount &&
        !h->drain_signalled) {
        /* `kvpoolctl drain` of a kvpool-segment daemon (no hooks): take its SIGTERM path
         * (drain until empty, unmount, exit 0). Embedded segments keep running. */
        h->drain_signalled = true;
        kvp_log_info(s->actor, "segment %u: the master marked it DRAINING: draining, then exiting", id);
        kill(getpid(), SIGTERM);
    }
    if (rc == KVP_ERR_NOT_FOUND)
        return remount(ctx, h, id);
    if (rc != KVP_OK) {
        if (!h->failing)
            kvp_log_warn(s->actor, "segment %u: heartbeat: %s (retrying every %u ms)", id, kvp_errname(rc),
                         h->period);
        h->failing = true;
    } else if (h->failing) {
        kvp_log_info(s->actor, "segment %u: heartbeat answered again", id);
        h->failing = false;
    }
    if (rc == KVP_OK && h->fenced) {
        int e = post_id(h, id);
        if (e != KVP_OK)
            return e;
        kvp_log_info(s->actor, "segment %u: confirmed by the master: serving again", id);
        h->fenced = false;
    }
    if (rc == KVP_OK && resp->body_case == KVP__RESPONSE__BODY_HEARTBEAT && resp->heartbeat &&
        resp->heartbeat->n_verify)
        kvp_seg_verify_add(&h->verify, id, resp->heartbeat->verify, resp->heartbeat->n_verify, s->size, s->actor);
    if (rc == KVP_OK && resp->body_case == KVP__RESPONSE__BODY_HEARTBEAT && resp->heartbeat &&
        kvp_seg_server_has_rdma(s->srv) && kvp_seg_fence_writer_due(resp->heartbeat->fence_writer, &h->fence)) {
        /* Fence on loop 0; the Fenced goes out when it replies (on_rdma_reply), not a period later */
        const Kvp__FenceWriter *fw = resp->heartbeat->fence_writer;
        struct kvp_seg_writer_sel sel[KVP_SEG_FENCE_SELECTORS_MAX]; /* FenceWriter.writers, by value */
        size_t n_sel = kvp_seg_fence_selectors(fw, sel, s->actor);
        int e = kvp_seg_server_fence_request(ctx, s->srv, fw->client_id, fw->generation, sel, n_sel, &h->corr);
        if (e == KVP_ERR_NOMEM)
            return e;
        if (e != KVP_OK) { /* the server is stopping: not run, not acknowledged */
            kvp_log_warn(s->actor, "segment %u: FenceWriter %llu: %s", id, (unsigned long long)fw->seq,
                         kvp_errname(e));
            return KVP_OK;
        }
        h->wait = HB_RDMA;
        h->next = NEXT_FENCED;
        h->fence_seq = fw->seq;
        h->beat_id = id;
        verify_step(h); /* its answers go with the Fenced */
        return KVP_OK;
    }
    if (rc == KVP_OK && verify_step(h))
        return send_beat(ctx, h, id); /* the answers now, not a period later */
    return KVP_OK;
}

/* Loop 0 answered a step on the RDMA side (HB_RDMA): go on with what waited for it. A failed
 * step (the server stopping) goes no further: nothing is acknowledged that did not happen; the
 * next tick remounts again, the leader asks for the fence again. */
static int on_rdma_reply(struct kvp_rt_ctx *ctx, struct hb_state *h, const struct kvp_rt_msg *msg)
{
    struct kvp_segment *s = h->s;
    if (msg->status != KVP_OK) {
        kvp_log_warn(s->actor, "data plane: %s: %s", h->next == NEXT_MOUNT ? "remount" : "FenceWriter",
                     kvp_errname(msg->status));
        return KVP_OK;
    }
    if (h->next == NEXT_MOUNT)
        return remount_send(ctx, h);
    kvp_seg_fence_ack_set(&h->fence, h->fence_seq, msg->arg > INT32_MAX ? INT32_MAX : (int)msg->arg);
    return send_beat(ctx, h, h->beat_id); /* Fenced now, not a period later */
}

static int on_tick(struct kvp_rt_ctx *ctx, struct hb_state *h)
{
    struct kvp_segment *s = h->s;
    uint64_t now = kvp_clock_now_ms();
    uint32_t id = atomic_load_explicit(&s->id, memory_order_relaxed);
    if (id && now - h->last_tick_ms > 3ull * h->period + 1000u) {
        /* We were stopped (SIGSTOP, VM pause): the master may have declared us lost and
         * dropped our replicas. Refuse data until a heartbeat confirms the id. */
        kvp_log_warn(s->actor, "segment %u: stalled for %llu ms: refusing data until the master "
                     "confirms this segment", id, (unsigned long long)(now - h->last_tick_ms));
        int e = post_id(h, 0);
        if (e != KVP_OK)
            return e;
        h->fenced = true;
    }
    h->last_tick_ms = now;
    if (h->wait != HB_IDLE)
        return KVP_OK; /* the previous request is still out: it ends by its own timeout */
    if (id == 0)
        return remount(ctx, h, id); /* a remount failed earlier: try again */
    verify_step(h);
    return send_beat(ctx, h, id);
}

static int send_beat(struct kvp_rt_ctx *ctx, struct hb_state *h, uint32_t id)
{
    struct kvp_segment *s = h->s;
    Kvp__Request req;
    Kvp__HeartbeatReq hb;
    Kvp__Fenced fenced;
    kvp__request__init(&req);
    kvp__heartbeat_req__init(&hb);
    hb.segment_id = id;
    kvp_seg_rdma_hb_fill(kvp_seg_server_has_rdma(s->srv), &h->fence, &hb, &fenced);
    if (h->verify.segment_id != id)
        kvp_seg_verify_clear(&h->verify); /* asked under another mount: not this one's bytes */
    kvp_seg_verify_fill(&h->verify, &hb);
    req.body_case = KVP__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    int rc = kvp_msession_request(ctx, s->ms, &req, h->timeout, &h->corr);
    if (rc == KVP_ERR_NOMEM)
        return rc;
    if (rc != KVP_OK) {
        if (!h->failing)
            kvp_log_warn(s->actor, "segment %u: heartbeat: %s (retrying every %u ms)", id, kvp_errname(rc),
                         h->period);
        h->failing = true;
        return KVP_OK;
    }
    h->wait = HB_BEAT;
    h->beat_id = id;
    return KVP_OK;
}

static int hb_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct hb_state *h = kvp_rt_state(ctx);
    if (msg->kind == KVP_RT_TIMER && msg->type == HB_MSG_TICK)
        return on_tick(ctx, h);
    if (msg->kind != KVP_RT_REPLY || h->wait == HB_IDLE || msg->corr_id != h->corr)
        return KVP_OK;
    enum hb_wait w = h->wait;
    h->wait = HB_IDLE;
    if (w == HB_RDMA)
        return on_rdma_reply(ctx, h, msg);
    Kvp__Response *resp = msg->status == KVP_OK ? kvp_rt_msg_take(msg) : NULL;
    int rc = msg->status == KVP_OK && !resp ? KVP_ERR_MALFORMED : msg->status;
    if (w == HB_MOUNT) {
        on_mount_reply(h, rc, resp); /* frees resp */
        return KVP_OK;
    }
    rc = on_beat_reply(ctx, h, rc, resp);
    kvp_msession_response_free(resp);
    return rc;
}

static int hb_init(struct kvp_rt_ctx *ctx)
{
    struct hb_state *h = kvp_rt_state(ctx);
    h->last_tick_ms = kvp_clock_now_ms();
    return kvp_rt_timer_start(ctx, h->period, h->period, HB_MSG_TICK, NULL);
}

static void hb_fini(struct kvp_rt_ctx *ctx)
{
    struct hb_state *h = kvp_rt_state(ctx);
    if (h)
        kvp_seg_verify_clear(&h->verify);
    free(h);
}

int kvp_seg_heartbeat_spawn(void *arg, struct kvp_rt_actor *parent, struct kvp_rt_actor **out)
{
    struct kvp_segment *s = arg;
    struct hb_state *h = calloc(1, sizeof *h);
    if (!h)
        return KVP_ERR_NOMEM;
    h->s = s;
    h->period = s->cfg.heartbeat_ms ? s->cfg.heartbeat_ms : 1000;
    h->timeout = h->period < 1000 ? 1000 : h->period;
    struct kvp_rt_spec spec = {.name = "heartbeat", .init = hb_init, .handle = hb_handle, .fini = hb_fini,
                               .state = h};
    return kvp_rt_spawn(out, &spec, parent); /* owns h from here: any failure ran hb_fini */
}
