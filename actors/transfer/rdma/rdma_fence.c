/* rdma_fence.c — completion accounting, credits and the requester-side fence; see rdma_fence.h. */
#include "actors/transfer/rdma/rdma_fence.h"

#include <errno.h>
#include <string.h>

#include "kvpool.h"
#include "runtime/log.h"

#define REAP_ROUND 64

static const char *who_of(const struct kvp_rdma_reaper *r)
{
    return r && r->who ? r->who : "rdma";
}

int kvp_rdma_post(struct kvp_rdma_reaper *r, struct kvp_rdma_qp *q, struct ibv_send_wr *wr,
                  uint64_t cookie, uint64_t *wr_id_out)
{
    if (!r || !r->ops || !r->slots || !q || !wr || wr->next || !q->cq) {
        kvp_log_error(who_of(r), "rdma post: bad arguments (one WR, a QP with a CQ required)");
        return KVP_ERR_INVALID;
    }
    if (wr->opcode != IBV_WR_RDMA_READ && wr->opcode != IBV_WR_RDMA_WRITE) {
        kvp_log_error(who_of(r), "rdma post: opcode %d is not RDMA READ or WRITE", (int)wr->opcode);
        return KVP_ERR_INVALID;
    }
    if (q->state != KVP_RDMA_QP_LIVE || !q->qp)
        return KVP_ERR_CLOSED;
    if (q->outstanding >= q->max_send_wr || q->cq->outstanding >= q->cq->size)
        return KVP_ERR_BUSY;
    uint64_t id;
    int rc = kvp_rdma_slot_alloc(r->slots, q, cookie, &id);
    if (rc != KVP_OK)
        return rc;
    wr->wr_id = id;
    wr->send_flags |= IBV_SEND_SIGNALED;
    struct ibv_send_wr *bad = NULL;
    int err = r->ops->post_send(q->qp, wr, &bad);
    if (err) {
        kvp_rdma_slot_free(r->slots, id);
        kvp_log_warn(who_of(r), "rdma post on qp %u refused: %s", q->qp->qp_num, strerror(err));
        return KVP_ERR_TRANSFER;
    }
    q->outstanding++;
    q->posted++;
    q->cq->outstanding++;
    if (q->cq->outstanding > q->cq->high_water)
        q->cq->high_water = q->cq->outstanding;
    if (wr_id_out)
        *wr_id_out = id;
    return KVP_OK;
}

int kvp_rdma_reap(struct kvp_rdma_reaper *r, struct kvp_rdma_cq *cq, int max)
{
    if (!r || !r->ops || !r->slots || !cq || !cq->cq || max < 0) {
        kvp_log_error(who_of(r), "rdma reap: bad arguments");
        return KVP_ERR_INVALID;
    }
    struct ibv_wc wc[REAP_ROUND];
    int accepted = 0;
    while (max > 0) {
        int want = max < REAP_ROUND ? max : REAP_ROUND;
        int n = r->ops->poll_cq(cq->cq, want, wc);
        if (n < 0) {
            r->cq_errors++;
            if (!cq->failed)
                kvp_log_error(who_of(r), "rdma: poll_cq failed (%d): CQ in error, completions "
                                         "lost; its QPs can only be fenced by destroying them", n);
            cq->failed = true;
            return KVP_ERR_TRANSFER;
        }
        for (int i = 0; i < n; i++) {
            struct kvp_rdma_slot *sl = kvp_rdma_slot_lookup(r->slots, wc[i].wr_id);
            if (!sl) {
                r->stale_wc++;
                continue;
            }
            struct kvp_rdma_qp *q = sl->owner;
            uint64_t cookie = sl->cookie;
            kvp_rdma_slot_free(r->slots, wc[i].wr_id);
            if (q) {
                if (q->outstanding)
                    q->outstanding--;
                q->completed++;
                if (q->cq && q->cq->outstanding)
                    q->cq->outstanding--;
            } else if (cq->outstanding) {
                cq->outstanding--;
            }
            bool late = q && q->state != KVP_RDMA_QP_LIVE;
            if (late && wc[i].status == IBV_WC_SUCCESS)
                r->late_ok++;
            accepted++;
            if (r->on_wc)
                r->on_wc(r->arg, q, cookie, late, &wc[i]);
        }
        max -= n;
        if (n < want)
            break;
    }
    return accepted;
}

int kvp_rdma_fence_begin(struct kvp_rdma_fence *f, struct kvp_rdma_reaper *r,
                         struct kvp_rdma_qp **qps, size_t n_qps, struct ibv_mr **mrs,
                         size_t n_mrs, uint64_t now_ns, uint64_t bound_ns)
{
    if (!f || !r || !r->ops || !r->slots || (n_qps && !qps) || (n_mrs && !mrs)) {
        kvp_log_error(who_of(r), "rdma fence: bad arguments");
        return KVP_ERR_INVALID;
    }
    for (size_t i = 0; i < n_qps; i++)
        if (!qps[i] || !qps[i]->cq) {
            kvp_log_error(who_of(r), "rdma fence: QP %zu of %zu is NULL or has no CQ", i, n_qps);
            return KVP_ERR_INVALID;
        }
    memset(f, 0, sizeof *f);
    f->r = r;
    f->qps = qps;
    f->n_qps = n_qps;
    f->mrs = mrs;
    f->n_mrs = n_mrs;
    f->deadline_ns = now_ns + bound_ns;
    f->result = KVP_OK;
    for (size_t i = 0; i < n_qps; i++) {
        struct kvp_rdma_qp *q = qps[i];
        if (q->state != KVP_RDMA_QP_LIVE)
            continue;
        q->state = KVP_RDMA_QP_FENCING;
        if (!q->qp)
            continue;
        struct ibv_qp_attr a;
        memset(&a, 0, sizeof a);
        a.qp_state = IBV_QPS_ERR;
        int err = r->ops->modify_qp(q->qp, &a, IBV_QP_STATE);
        if (err)
            kvp_log_warn(who_of(r), "rdma fence: qp %u to ERR failed: %s (waiting for the bound)",
                         q->qp->qp_num, strerror(err));
    }
    return KVP_OK;
}

static void destroy_qp(struct kvp_rdma_reaper *r, struct kvp_rdma_qp *q)
{
    if (!q->qp)
        return;
    uint32_t num = q->qp->qp_num;
    int err = r->ops->destroy_qp(q->qp);
    if (err)
        kvp_log_error(who_of(r), "rdma fence: destroy qp %u failed: %s", num, strerror(err));
    q->qp = NULL;
}

/* The wedged path: the QP is destroyed with WRs outstanding. Their slots are freed (a CQE that
 * still turns up is then stale) and their CQ credits returned. */
static void wedge_qp(struct kvp_rdma_fence *f, struct kvp_rdma_qp *q)
{
    struct kvp_rdma_reaper *r = f->r;
    destroy_qp(r, q);
    f->wedged_wrs += q->outstanding;
    struct kvp_rdma_slots *s = r->slots;
    for (uint32_t i = 0; i < s->n && q->outstanding; i++) {
        if (!s->v[i].in_use || s->v[i].owner != q)
            continue;
        kvp_rdma_slot_free(s, kvp_rdma_wrid_encode(i, s->v[i].gen));
        q->outstanding--;
        if (q->cq->outstanding)
            q->cq->outstanding--;
    }
    q->outstanding = 0;
    q->state = KVP_RDMA_QP_WEDGED;
}

int kvp_rdma_fence_step(struct kvp_rdma_fence *f, uint64_t now_ns)
{
    if (!f || !f->r)
        return 1;
    if (f->done)
        return 1;
    struct kvp_rdma_reaper *r = f->r;
    /* Reap each distinct CQ of the set (completions of other QPs on it go to their owners). */
    for (size_t i = 0; i < f->n_qps; i++) {
        struct kvp_rdma_cq *cq = f->qps[i]->cq;
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = f->qps[j]->cq == cq;
        if (!seen && cq->cq)
            (void)kvp_rdma_reap(r, cq, 1 << 20);
    }
    size_t waiting = 0;
    for (size_t i = 0; i < f->n_qps; i++) {
        struct kvp_rdma_qp *q = f->qps[i];
        if (q->state != KVP_RDMA_QP_FENCING)
            continue;
        if (q->outstanding == 0) {
            destroy_qp(r, q);
            q->state = KVP_RDMA_QP_DRAINED;
        } else {
            waiting++;
        }
    }
    if (waiting == 0) {
        f->done = true;
        return 1;
    }
    if (now_ns < f->deadline_ns)
        return 0;
    /* Wedged: the provider did not flush within the bound. Destroying the QP is what stops
     * the device (provider behaviour, not spec: rdma.md §2.3 step 6); deregistering the MRs
     * is what makes the memory unreachable even if it does not. */
    for (size_t i = 0; i < f->n_qps; i++)
        if (f->qps[i]->state == KVP_RDMA_QP_FENCING)
            wedge_qp(f, f->qps[i]);
    size_t dereg = 0;
    for (size_t i = 0; i < f->n_mrs; i++) {
        if (!f->mrs[i])
            continue;
        int err = r->ops->dereg_mr(f->mrs[i]);
        if (err)
            kvp_log_error(who_of(r), "rdma fence: dereg of a wedged MR failed: %s", strerror(err));
        else
            dereg++;
        f->mrs[i] = NULL;
    }
    kvp_log_warn(who_of(r),
                 "rdma fence: wedged: %llu WR(s) on %zu QP(s) without a completion after the "
                 "bound; QPs destroyed, %zu MR(s) deregistered",
                 (unsigned long long)f->wedged_wrs, waiting, dereg);
    f->result = KVP_ERR_FENCE_FAILED;
    f->done = true;
    return 1;
}
