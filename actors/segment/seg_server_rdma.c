/*
 * seg_server_rdma.c — the segment's RDMA side as loop 0's state, and the mount changes (set_id)
 * of the data-plane server (seg_server.h, seg_server_internal.h, docs/rdma.md "Segment side").
 *
 * Owner: loop 0 ("seg-loop-0", seg_server.c). The RDMA side (seg_rdma.h: the QPs facing the
 * writers, the region's MRs, the fencing of old writers) is handed to loop 0 when it is opened
 * (SEG_MSG_RDMA_OPEN) and touched only on loop 0's thread from then on; loop 0's fini closes it.
 * Everything else reaches it by message:
 *  - an RdmaHello that arrives on another loop is forwarded to loop 0 (SEG_MSG_RDMA_HELLO) and the
 *    connection reads nothing more until loop 0's answer comes back (seg_server.c, hello_done);
 *  - a mount change (SEG_MSG_SET_ID) runs on loop 0 in this order: the RDMA side fences every
 *    writer of the old mount, then the id the loops check requests against is stored, then the
 *    loops are told (SEG_MSG_ID). Loop 0 is the only writer of that id;
 *  - FenceWriter (SEG_MSG_RDMA_FENCE), its selectors (FenceWriter.writers, the per-writer fence)
 *    copied into the message by value;
 *  - the status and test queries (SEG_MSG_RDMA_QPS, SEG_MSG_RDMA_FENCED).
 * Plain threads (the segment's start and stop, tests) keep the blocking calls: kvp_rt_call, which
 * returns after loop 0 has done the change. Actors (the segment's heartbeat) must not block on
 * another actor: they use the _request forms and go on when the reply arrives, or the _post form
 * where nothing they do next depends on it (seg_server.h says which guarantee each gives).
 * Because loop 0 runs one message at a time, a handshake forwarded from another loop is either
 * answered before a fence (its QPs are then among those fenced) or after it (it then sees the
 * new mount, or id 0, which admits no writer): no QP of an old mount outlives the fence.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "actors/segment/seg_rdma.h"
#include "actors/segment/seg_server.h"
#include "actors/segment/seg_server_internal.h"
#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/log.h"
#include "wire/rdma_hello.h"

#define ACTOR "seg-server"

/* ------------------------------------------------------------------ on loop 0 */

/* A fence loop 0 ran: remember whom it covered (fence_log), then publish the new epoch. Called
 * after the fence and before its reply, so a hello whose header a loop read before the reply
 * carries an older epoch. n_sel 0: every writer. */
static void fence_note(struct kvp_seg_server *s, uint64_t gen, const struct kvp_seg_writer_sel *sel, size_t n_sel)
{
    if (!s->rdma)
        return; /* TCP only: no handshake to refuse */
    uint64_t e = ++s->fence_epoch;
    struct seg_fence_rec *r = &s->fence_log[e % SEG_FENCE_LOG];
    r->gen = gen ? gen : UINT64_MAX;
    r->n_sel = 0;
    if (n_sel == 0 || n_sel > KVP_SEG_FENCE_SELECTORS_MAX || !sel)
        r->sel[r->n_sel++] = (struct kvp_seg_writer_sel){.client_id = 0, .mask = 0};
    else
        for (size_t i = 0; i < n_sel; i++)
            r->sel[r->n_sel++] = sel[i];
    atomic_store_explicit(&s->rdma_fence_epoch, e, memory_order_release);
}

/* The fence (epoch > `epoch`) that covers writer `client` at generation `gen`, or 0. More fences
 * since than the log holds: the oldest forgotten one is named (whoever the writer is). */
static uint64_t fenced_since(const struct kvp_seg_server *s, uint64_t epoch, uint64_t client, uint64_t gen)
{
    uint64_t now = s->fence_epoch;
    if (epoch >= now)
        return 0;
    if (now - epoch > SEG_FENCE_LOG)
        return epoch + 1;
    for (uint64_t e = epoch + 1; e <= now; e++) {
        const struct seg_fence_rec *r = &s->fence_log[e % SEG_FENCE_LOG];
        if (gen > r->gen)
            continue;
        for (uint32_t i = 0; i < r->n_sel; i++)
            if ((client & r->sel[i].mask) == (r->sel[i].client_id & r->sel[i].mask))
                return e;
    }
    return 0;
}

int kvp_seg_rdma_loop_hello(struct kvp_seg_server *s, const uint8_t *offer, size_t len, uint64_t epoch,
                            uint8_t **answer, size_t *answer_len)
{
    if (answer && answer_len && s->rdma && epoch < s->fence_epoch) {
        /* Read before a fence that loop 0 ran (and answered) since: QPs made now would outlive it,
         * and the master may reuse the space that fence protected. */
        struct kvp_rdma_hello h;
        char why[64] = "";
        if (kvp_rdma_hello_decode(offer, len, &h, why, sizeof why) == KVP_OK) {
            uint64_t e = fenced_since(s, epoch, h.client_id, h.conn_generation);
            uint64_t client = h.client_id, gen = h.conn_generation;
            kvp_rdma_hello_free(&h);
            if (e) {
                *answer = NULL;
                *answer_len = 0;
                kvp_log_info(ACTOR, "loop 0: RDMA handshake of writer %llx (generation %llu) read before "
                             "fence %llu, which covers it: refused (BUSY); the writer connects again",
                             (unsigned long long)client, (unsigned long long)gen, (unsigned long long)e);
                return KVP_ERR_BUSY;
            }
        } else {
            kvp_rdma_hello_free(&h); /* bad offer: the accept below refuses it with its reason */
        }
    }
    return kvp_seg_rdma_accept(s->rdma, offer, len, answer, answer_len);
}

void kvp_seg_server_test_hold_hellos(struct kvp_seg_server *s, kvp_seg_hello_hook fn, void *arg)
{
    if (!s)
        return;
    atomic_store_explicit(&s->hello_hold_arg, arg, memory_order_release);
    atomic_store_explicit(&s->hello_hold, fn, memory_order_release);
}

/* A mount change: the old mount's writers are fenced before the new id is served. */
static void apply_id(struct kvp_seg_server *s, uint32_t id)
{
    bool change = id != atomic_load_explicit(&s->segment_id, memory_order_relaxed);
    kvp_seg_rdma_set_id(s->rdma, id); /* NULL (TCP only): nothing */
    if (change)
        fence_note(s, 0, NULL, 0); /* every writer of the old mount */
    atomic_store_explicit(&s->segment_id, id, memory_order_relaxed);
    /* After the store: a loop that held a challenge because it read 0 sees the id when this
     * message comes (seg_server.c, challenge_send); loop 0 sends it to itself too. */
    for (int i = 0; id != 0 && i < s->n_loops; i++)
        (void)kvp_rt_send(s->loops[i], 0, SEG_MSG_ID, 0, NULL, NULL);
}

int kvp_seg_rdma_loop_msg(struct kvp_seg_server *s, struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    int st = KVP_OK;
    uint64_t arg = 0;
    void *out = NULL;
    switch (msg->type) {
    case SEG_MSG_SET_ID:
        apply_id(s, (uint32_t)msg->arg);
        break;
    case SEG_MSG_RDMA_OPEN: {
        struct kvp_seg_rdma *r = kvp_rt_msg_take(msg);
        if (!r || s->rdma) {
            kvp_seg_rdma_close(&r);
            st = KVP_ERR_INVALID;
            break;
        }
        s->rdma = r;
        /* loop 0 is the only writer of segment_id: this is the id served now */
        kvp_seg_rdma_set_id(r, atomic_load_explicit(&s->segment_id, memory_order_relaxed));
        break;
    }
    case SEG_MSG_RDMA_FENCE: {
        const struct seg_fence_req *f = msg->payload;
        if (!f)
            st = KVP_ERR_INVALID;
        else {
            size_t n_sel = f->n_sel > KVP_SEG_FENCE_SELECTORS_MAX ? 0 : f->n_sel;
            arg = (uint64_t)kvp_seg_rdma_fence_run(s->rdma, f->client_id, f->gen, f->sel, n_sel);
            if (f->client_id) {
                struct kvp_seg_writer_sel one = {.client_id = f->client_id, .mask = UINT64_MAX};
                fence_note(s, f->gen, &one, 1);
            } else {
                fence_note(s, f->gen, f->sel, n_sel); /* n_sel 0: every writer */
            }
        }
        break;
    }
    case SEG_MSG_RDMA_QPS: {
        struct seg_qps_req *q = kvp_rt_msg_take(msg);
        if (!q) {
            st = KVP_ERR_INVALID;
            break;
        }
        q->n = kvp_seg_rdma_writer_qps(s->rdma, q->client_id, q->mask, &q->gen_sum);
        out = q;
        break;
    }
    case SEG_MSG_RDMA_FENCED:
        arg = kvp_seg_rdma_writers_fenced(s->rdma);
        break;
    case SEG_MSG_RDMA_HELLO: {
        uint8_t *ans = NULL;
        size_t alen = 0;
        const struct seg_hello_req *h = msg->payload;
        if (!h || h->len == 0 || h->len != msg->arg)
            st = KVP_ERR_INVALID;
        else
            st = kvp_seg_rdma_loop_hello(s, h->offer, h->len, h->epoch, &ans, &alen);
        out = ans;
        arg = alen;
        break;
    }
    default:
        st = KVP_ERR_INVALID;
        break;
    }
    if (msg->kind == KVP_RT_REQUEST) {
        int rc = kvp_rt_reply(ctx, msg->corr_id, st, arg, out ? &out : NULL, NULL);
        if (rc != KVP_OK && rc != KVP_ERR_CLOSED) /* CLOSED: the requester is gone (stopping) */
            kvp_log_warn(ACTOR, "loop 0: answering message %u: %s", msg->type, kvp_errname(rc));
    }
    free(out); /* NULL once the reply took it */
    return KVP_OK;
}

void kvp_seg_rdma_loop_fini(struct kvp_seg_server *s)
{
    kvp_seg_rdma_close(&s->rdma); /* fences every writer, deregisters the region */
}

/* ------------------------------------------------------------------ callers */

static void rdma_free(void *p)
{
    struct kvp_seg_rdma *r = p;
    kvp_seg_rdma_close(&r);
}

bool kvp_seg_server_has_rdma(const struct kvp_seg_server *s)
{
    return s && atomic_load_explicit(&s->rdma_on, memory_order_acquire);
}

int kvp_seg_server_rdma(struct kvp_seg_server *s, const struct kvp_seg_rdma_cfg *cfg)
{
    if (!s || !cfg || s->n_loops == 0 || atomic_load_explicit(&s->rdma_on, memory_order_acquire))
        return KVP_ERR_INVALID;
    struct kvp_seg_rdma *r = NULL;
    int rc = kvp_seg_rdma_open(&r, cfg, s->base, s->size);
    if (rc != KVP_OK)
        return rc;
    /* Opened here (the device probe may take a while), then handed to loop 0, its owner. */
    void *p = r;
    struct kvp_rt_msg *reply = NULL;
    rc = kvp_rt_call(s->loops[0], 0, SEG_MSG_RDMA_OPEN, 0, &p, rdma_free, 0, &reply);
    if (rc != KVP_OK) {
        rdma_free(p); /* not sent: still ours */
        return rc;
    }
    rc = reply->status;
    kvp_rt_msg_destroy(&reply);
    if (rc == KVP_OK)
        atomic_store_explicit(&s->rdma_on, true, memory_order_release);
    return rc;
}

void kvp_seg_server_set_id(struct kvp_seg_server *s, uint32_t segment_id)
{
    if (!s)
        return;
    struct kvp_rt_msg *reply = NULL;
    int rc = s->n_loops > 0 ? kvp_rt_call(s->loops[0], 0, SEG_MSG_SET_ID, segment_id, NULL, NULL, 0, &reply)
                            : KVP_ERR_CLOSED;
    if (rc == KVP_OK)
        rc = reply->status;
    kvp_rt_msg_destroy(&reply);
    if (rc == KVP_OK)
        return;
    /* Loop 0 could not be reached (out of memory, or it failed). Refuse at once; with an RDMA side
     * whose writers could not be fenced, refuse every id rather than serve a new one. */
    bool rdma = kvp_seg_server_has_rdma(s);
    uint32_t id = rdma ? 0 : segment_id;
    kvp_log_error(ACTOR, "set_id %u: loop 0 unreachable (%s): %s", segment_id, kvp_errname(rc),
                  rdma ? "refusing every request (the RDMA writers could not be fenced)" : "set directly");
    atomic_store_explicit(&s->segment_id, id, memory_order_relaxed);
}

int kvp_seg_server_set_id_request(struct kvp_rt_ctx *ctx, struct kvp_seg_server *s, uint32_t segment_id,
                                  uint64_t *corr_id)
{
    if (!ctx || !s || !corr_id || s->n_loops == 0)
        return KVP_ERR_INVALID;
    return kvp_rt_request(ctx, s->loops[0], 0, SEG_MSG_SET_ID, segment_id, NULL, NULL, 0, corr_id);
}

int kvp_seg_server_set_id_post(struct kvp_seg_server *s, uint32_t segment_id)
{
    if (!s || s->n_loops == 0)
        return KVP_ERR_INVALID;
    return kvp_rt_send(s->loops[0], 0, SEG_MSG_SET_ID, segment_id, NULL, NULL);
}

/* A FenceWriter's arguments for loop 0 (malloc'd: the message owns it once sent). */
static struct seg_fence_req *fence_req_new(uint64_t client_id, uint64_t gen, const struct kvp_seg_writer_sel *sel,
                                           size_t n_sel)
{
    struct seg_fence_req *f = malloc(sizeof *f);
    if (!f)
        return NULL;
    *f = (struct seg_fence_req){.client_id = client_id, .gen = gen};
    if (sel && n_sel > 0 && n_sel <= KVP_SEG_FENCE_SELECTORS_MAX) {
        memcpy(f->sel, sel, n_sel * sizeof *sel);
        f->n_sel = (uint32_t)n_sel;
    }
    return f;
}

int kvp_seg_server_fence_selected(struct kvp_seg_server *s, uint64_t client_id, uint64_t gen,
                                  const struct kvp_seg_writer_sel *sel, size_t n_sel)
{
    if (!s || s->n_loops == 0 || n_sel > KVP_SEG_FENCE_SELECTORS_MAX || (n_sel && !sel))
        return KVP_ERR_INVALID;
    struct seg_fence_req *f = fence_req_new(client_id, gen, sel, n_sel);
    if (!f)
        return KVP_ERR_NOMEM;
    void *p = f;
    struct kvp_rt_msg *reply = NULL;
    int rc = kvp_rt_call(s->loops[0], 0, SEG_MSG_RDMA_FENCE, 0, &p, NULL, 0, &reply);
    if (rc != KVP_OK) {
        free(p);
        return rc;
    }
    rc = reply->status == KVP_OK ? (int)reply->arg : reply->status;
    kvp_rt_msg_destroy(&reply);
    return rc;
}

int kvp_seg_server_fence_writers(struct kvp_seg_server *s, uint64_t client_id, uint64_t gen)
{
    return kvp_seg_server_fence_selected(s, client_id, gen, NULL, 0);
}

int kvp_seg_server_fence_request(struct kvp_rt_ctx *ctx, struct kvp_seg_server *s, uint64_t client_id,
                                 uint64_t gen, const struct kvp_seg_writer_sel *sel, size_t n_sel,
                                 uint64_t *corr_id)
{
    if (!ctx || !s || !corr_id || s->n_loops == 0 || n_sel > KVP_SEG_FENCE_SELECTORS_MAX || (n_sel && !sel))
        return KVP_ERR_INVALID;
    struct seg_fence_req *f = fence_req_new(client_id, gen, sel, n_sel);
    if (!f)
        return KVP_ERR_NOMEM;
    void *p = f;
    int rc = kvp_rt_request(ctx, s->loops[0], 0, SEG_MSG_RDMA_FENCE, 0, &p, NULL, 0, corr_id);
    free(p); /* NULL when sent */
    return rc;
}

int kvp_seg_server_rdma_writer_qps(struct kvp_seg_server *s, uint64_t client_id, uint64_t mask,
                                   uint32_t *qps, uint64_t *gen_sum)
{
    if (qps)
        *qps = 0;
    if (gen_sum)
        *gen_sum = 0;
    if (!s || s->n_loops == 0)
        return KVP_ERR_INVALID;
    struct seg_qps_req *q = malloc(sizeof *q);
    if (!q)
        return KVP_ERR_NOMEM;
    *q = (struct seg_qps_req){.client_id = client_id, .mask = mask};
    void *p = q;
    struct kvp_rt_msg *reply = NULL;
    int rc = kvp_rt_call(s->loops[0], 0, SEG_MSG_RDMA_QPS, 0, &p, NULL, 0, &reply);
    if (rc != KVP_OK) {
        free(p);
        return rc;
    }
    rc = reply->status;
    const struct seg_qps_req *a = reply->payload;
    if (rc == KVP_OK && !a)
        rc = KVP_ERR_INVALID;
    if (rc == KVP_OK) {
        if (qps)
            *qps = a->n;
        if (gen_sum)
            *gen_sum = a->gen_sum;
    }
    kvp_rt_msg_destroy(&reply);
    return rc;
}

int kvp_seg_server_rdma_writers_fenced(struct kvp_seg_server *s, uint64_t *fenced)
{
    if (fenced)
        *fenced = 0;
    if (!s || s->n_loops == 0)
        return KVP_ERR_INVALID;
    struct kvp_rt_msg *reply = NULL;
    int rc = kvp_rt_call(s->loops[0], 0, SEG_MSG_RDMA_FENCED, 0, NULL, NULL, 0, &reply);
    if (rc != KVP_OK)
        return rc;
    rc = reply->status;
    if (rc == KVP_OK && fenced)
        *fenced = reply->arg;
    kvp_rt_msg_destroy(&reply);
    return rc;
}
