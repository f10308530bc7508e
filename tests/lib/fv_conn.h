/*
 * fv_conn.h — test helpers over any kvp_verbs_ops table (used with the verbs double): open a
 * device's PD and CQ, and connect two RC QPs RESET→INIT→RTR→RTS with the attribute values of
 * ../shared/design/rdma.md §1.1 (what the rdma transport's handshake will do once the transport
 * seam exists). Built only with KVP_HAVE_VERBS.
 */
#ifndef KVP_TESTLIB_FV_CONN_H
#define KVP_TESTLIB_FV_CONN_H

#include <stdint.h>

#include <stddef.h>

#include "actors/transfer/rdma/verbs_ops.h"
#include "tests/lib/fakeverbs.h"

/* One side's device resources. */
struct fv_end {
    const struct kvp_verbs_ops *ops;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    union ibv_gid gid;    /* GID index 1 (link-local, RoCE v2) */
    uint16_t lid;
};

/** Open device `dev` of ops' list, a PD and a CQ of `cqe` entries. Returns 0 or an errno. */
int fv_end_open(const struct kvp_verbs_ops *ops, int dev, int cqe, struct fv_end *e);
/** Destroy the CQ and PD and close the device (QPs and MRs must be gone). */
void fv_end_close(struct fv_end *e);

struct fv_qp_params {
    uint32_t max_send_wr;  /* default 256 */
    uint8_t timeout;       /* default 14 (~67 ms); 0 stays 0 only with timeout_zero set */
    uint8_t retry_cnt;     /* default 7 */
    int timeout_zero;
    uint32_t psn_a, psn_b; /* start PSNs (24-bit) of a's and b's send queues */
    int access_a, access_b;/* qp_access_flags: what the peer may do through that QP */
};

/**
 * Create one RC QP on each end and bring both to RTS facing each other. p may be NULL
 * (defaults; access: REMOTE_READ|REMOTE_WRITE on b, none on a). Returns 0 or the errno of the
 * failing verb.
 */
int fv_connect(struct fv_end *a, struct fv_end *b, const struct fv_qp_params *p,
               struct ibv_qp **qa, struct ibv_qp **qb);

/** Fill a one-SGE RDMA READ or WRITE WR (signaled) into *wr / *sge. */
void fv_wr(struct ibv_send_wr *wr, struct ibv_sge *sge, enum ibv_wr_opcode op, uint64_t wr_id,
           void *local, uint32_t len, uint32_t lkey, uint64_t remote, uint32_t rkey);

/* A client (node a) and a segment (node b) on one fabric, one QP each way connected:
 * `buf` is client memory registered LOCAL_WRITE only (kvp_register_buffer's rule), `seg` is
 * segment memory registered LOCAL_WRITE|REMOTE_READ|REMOTE_WRITE. Both are filled with
 * distinct patterns (buf 0x00.., seg 0x5a..). */
struct fv_pair {
    struct fv_fabric *f;
    struct fv_node *na, *nb;
    struct fv_end a, b;
    struct ibv_qp *qa, *qb;
    uint8_t *buf, *seg;
    size_t buf_len, seg_len;
    struct ibv_mr *buf_mr, *seg_mr;
};

/**
 * Build the pair: fabric from fc (NULL: defaults), client flush mode flush_a, QP params p (NULL:
 * fv_connect's defaults), CQs of cqe entries on both sides. Returns 0 or an errno / kvp error.
 */
int fv_pair_up(struct fv_pair *x, const struct fv_config *fc, int flush_a,
               const struct fv_qp_params *p, size_t buf_len, size_t seg_len, int cqe);
/** Free everything (the fabric frees the verbs objects). */
void fv_pair_down(struct fv_pair *x);

#endif
