/*
 * rdma_fence.h — completion accounting, credits and the requester-side fence (fence (a) of
 * ../shared/design/rdma.md §2.3), as building blocks for the rdma transport (issue 20).
 *
 * The contract they serve (DESIGN.md C2): a call returns only when no WR it posted can still
 * place a byte in caller memory. `man 3 ibv_post_send`: a WR's buffers are reusable only once its
 * completion has been polled. So:
 *  - every WR goes through kvp_rdma_post(): signaled, a generation-checked wr_id (rdma_wrid.h),
 *    counted against the QP's max_send_wr and the CQ's size (an overrun loses CQEs and makes the
 *    CQ unusable, and a lost CQE breaks the fence);
 *  - every CQE goes through kvp_rdma_reap(), which returns the credits and hands the completion
 *    to the owner's callback (stale wr_ids are counted and dropped);
 *  - kvp_rdma_fence_begin/step move a set of QPs to ERR and poll until each has a completion for
 *    every WR it ever posted (then destroy the QP), or, when the provider does not flush within
 *    the bound ("wedged": i40iw-like, broken providers), destroy the QPs and deregister the
 *    given MRs so that the NIC can no longer reach that memory, and report KVP_ERR_FENCE_FAILED.
 *
 * Non-blocking: nothing here sleeps or reads a clock. The caller passes now_ns (the runtime's
 * monotonic clock, or the double's virtual clock) and calls kvp_rdma_fence_step() again when the
 * CQ has events or a timer fires, as an actor handler does. Single-threaded: these objects belong
 * to one transfer actor; no locks.
 *
 * Ownership: the verbs objects (ibv_qp, ibv_cq, ibv_mr) are created by the caller. The fence
 * destroys the QPs it fenced (qp->qp becomes NULL) and, on the wedged path only, deregisters the
 * MRs it was given (their array slots become NULL). CQs are never destroyed here.
 */
#ifndef KVP_XFER_RDMA_FENCE_H
#define KVP_XFER_RDMA_FENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "actors/transfer/rdma/rdma_wrid.h"
#include "actors/transfer/rdma/verbs_ops.h"

/* A CQ and its credits: at most `size` (= ibv_cq->cqe) signaled WRs outstanding over every QP
 * that completes on it. */
struct kvp_rdma_cq {
    struct ibv_cq *cq;
    uint32_t size;
    uint32_t outstanding;
    uint32_t high_water; /* most outstanding ever (tests assert <= size) */
    bool failed;         /* poll_cq reported the CQ in error (logged once); it stays unusable */
};

enum kvp_rdma_qp_state {
    KVP_RDMA_QP_LIVE = 0,      /* posting allowed */
    KVP_RDMA_QP_FENCING = 1,   /* moved to ERR, waiting for every completion */
    KVP_RDMA_QP_DRAINED = 2,   /* every posted WR completed; QP destroyed */
    KVP_RDMA_QP_WEDGED = 3,    /* the bound passed with WRs outstanding; QP destroyed anyway */
};

/* A QP as the transport accounts for it. */
struct kvp_rdma_qp {
    struct ibv_qp *qp;         /* NULL once destroyed */
    struct kvp_rdma_cq *cq;    /* its send CQ's credits */
    uint32_t max_send_wr;      /* the QP's SQ depth */
    uint32_t outstanding;      /* WRs posted and not completed */
    uint64_t posted, completed;
    uint8_t state;             /* enum kvp_rdma_qp_state */
};

/**
 * Called once per accepted completion: `q` posted it, `cookie` is what kvp_rdma_post was given,
 * `late` is true when the QP was already fencing (a success then is "completed late": the bytes
 * are fine, but the call has already given up). The wc is only valid during the call.
 */
typedef void (*kvp_rdma_wc_fn)(void *arg, struct kvp_rdma_qp *q, uint64_t cookie, bool late,
                               const struct ibv_wc *wc);

/* Routes completions from CQs to their owners through the wr_id slots. */
struct kvp_rdma_reaper {
    const struct kvp_verbs_ops *ops;
    struct kvp_rdma_slots *slots;
    kvp_rdma_wc_fn on_wc;      /* may be NULL */
    void *arg;
    const char *who;           /* actor name for logs */
    uint64_t stale_wc;         /* CQEs whose wr_id matched no live slot (dropped) */
    uint64_t late_ok;          /* successes polled on a fencing QP */
    uint64_t cq_errors;        /* poll_cq returned < 0 (CQ overrun / error) */
};

/**
 * Post one READ or WRITE WR (wr->next must be NULL) on q: forces IBV_SEND_SIGNALED, overwrites
 * wr->wr_id with a fresh slot handle (returned in *wr_id_out when not NULL), and takes one QP
 * credit and one CQ credit. Returns KVP_OK; KVP_ERR_BUSY when the QP or CQ has no credit or no
 * slot is free (nothing posted: keep the slice pending); KVP_ERR_CLOSED when q is not LIVE;
 * KVP_ERR_INVALID for bad arguments (logged); KVP_ERR_TRANSFER when the provider refused the
 * post (logged with its errno; the slot and credits are returned).
 */
int kvp_rdma_post(struct kvp_rdma_reaper *r, struct kvp_rdma_qp *q, struct ibv_send_wr *wr,
                  uint64_t cookie, uint64_t *wr_id_out);

/**
 * Poll up to `max` completions (in rounds of at most 64) from cq, return their credits and
 * hand each to r->on_wc. Returns the number of completions accepted (stale ones excluded), or
 * KVP_ERR_TRANSFER when poll_cq reports the CQ in error (an overrun lost CQEs: the CQ is
 * unusable, cq->failed is set and the first time is logged at ERROR; fences over its QPs then
 * end wedged at their bound).
 */
int kvp_rdma_reap(struct kvp_rdma_reaper *r, struct kvp_rdma_cq *cq, int max);

/* One fence of a set of QPs. Fields are read-only to the caller once begun. */
struct kvp_rdma_fence {
    struct kvp_rdma_reaper *r;
    struct kvp_rdma_qp **qps;  /* the set (not owned) */
    size_t n_qps;
    struct ibv_mr **mrs;       /* memory to deregister if wedged (array not owned; slots NULLed) */
    size_t n_mrs;
    uint64_t deadline_ns;
    bool done;
    int result;                /* once done: KVP_OK or KVP_ERR_FENCE_FAILED */
    uint64_t wedged_wrs;       /* WRs without a completion at the bound */
};

/**
 * Begin fencing qps[0..n_qps): each LIVE QP is moved to ERR (modify_qp STATE only; a failure is
 * logged and the bound then decides) and marked FENCING; QPs already FENCING/DRAINED/WEDGED are
 * left as they are. `mrs` (may be NULL with n_mrs 0) are the regions the posted WRs touch that
 * must become unreachable if the provider never flushes. `bound_ns` is rdma_fence_bound_ms
 * (1000 ms by default) in ns. Returns KVP_OK, or KVP_ERR_INVALID (logged) for bad arguments.
 * Then call kvp_rdma_fence_step until it returns 1.
 */
int kvp_rdma_fence_begin(struct kvp_rdma_fence *f, struct kvp_rdma_reaper *r,
                         struct kvp_rdma_qp **qps, size_t n_qps, struct ibv_mr **mrs,
                         size_t n_mrs, uint64_t now_ns, uint64_t bound_ns);

/**
 * Make progress: reap the CQs of the set, destroy each fencing QP whose WRs have all completed
 * (DRAINED). Returns 1 when the fence is over (f->result: KVP_OK when every QP drained;
 * KVP_ERR_FENCE_FAILED when now_ns reached the deadline first: the remaining QPs were destroyed
 * (WEDGED), their slots freed, their CQ credits returned, f->mrs deregistered, a WARN logged with
 * the count), 0 while still waiting. After 1, further calls return 1 and do nothing.
 */
int kvp_rdma_fence_step(struct kvp_rdma_fence *f, uint64_t now_ns);

#endif
