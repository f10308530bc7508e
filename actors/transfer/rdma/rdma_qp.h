/*
 * rdma_qp.h — RC queue-pair bring-up with kvpool's attribute values, and GID selection for
 * RoCE v2 (../shared/design/rdma.md §1.1; issue 20 item 1), through the verbs ops table.
 *
 * The handshake message that carries a kvp_rdma_peer between two processes belongs in wire/
 * and waits for the transport seam (issue 19); these functions are what each side runs with the
 * peer's values once it has them. Values from a peer came over the network: they are checked,
 * never asserted.
 *
 * Single-threaded (the transfer actor that owns the QP); no clock; does not block.
 */
#ifndef KVP_XFER_RDMA_QP_H
#define KVP_XFER_RDMA_QP_H

#include <stdint.h>

#include "actors/transfer/rdma/verbs_ops.h"

/* kvpool's RC attributes (note §1.1). timeout is never 0: 0 disables the ACK timer and a QP
 * facing a dead peer would retry forever. */
struct kvp_rdma_qp_attrs {
    uint8_t timeout;        /* 14: 4.096 us * 2^14 ~ 67 ms per ACK timeout */
    uint8_t retry_cnt;      /* 7: ~0.54 s to IBV_WC_RETRY_EXC_ERR against a dead peer */
    uint8_t rnr_retry;      /* 6 (7 would be infinite) */
    uint8_t min_rnr_timer;  /* 12 */
    uint8_t max_rd_atomic;  /* 16, capped by the device's max_qp_init_rd_atom / max_qp_rd_atom */
    uint32_t max_send_wr;   /* 256, capped by max_qp_wr */
    uint32_t max_inline;    /* 64: tiny WRITEs may go inline */
};

/** Fill *a with the values above. */
void kvp_rdma_qp_attrs_default(struct kvp_rdma_qp_attrs *a);

/* One side's connection facts, as the handshake will carry them. */
struct kvp_rdma_peer {
    union ibv_gid gid;      /* the peer's selected GID (RoCE) */
    uint16_t lid;           /* the peer's LID (InfiniBand) */
    uint32_t qpn;           /* 24-bit, non-zero */
    uint32_t psn;           /* the peer's random 24-bit start PSN (its sq_psn = our rq_psn) */
    uint8_t mtu;            /* enum ibv_mtu the peer's port runs (1..5) */
    uint8_t max_rd_atomic;  /* what the peer's device allows, 1..16 */
};

/* This side's: the device context, port and selected GID index. */
struct kvp_rdma_local {
    struct ibv_context *ctx;
    uint8_t port;           /* 1-based */
    int gid_index;          /* from kvp_rdma_gid_select; -1 on InfiniBand without a GRH */
    uint32_t psn;           /* our random 24-bit start PSN */
    int access;             /* qp_access_flags: what the peer may do through this QP */
};

/**
 * Pick the GID index for RoCE v2: `override_index` >= 0 (config gid_index, Mooncake's
 * MC_GID_INDEX) is taken if that entry exists; otherwise the first RoCE v2 entry holding an
 * IPv4-mapped address, else the first RoCE v2 entry. On an InfiniBand port: *index = -1 (no
 * GRH needed) and *gid is entry 0. Returns KVP_OK; KVP_ERR_UNSUPPORTED (logged: "no suitable
 * GID") when no RoCE v2 entry exists or the override is empty/out of range; KVP_ERR_INVALID for
 * NULL arguments; KVP_ERR_IO when the port query fails.
 */
int kvp_rdma_gid_select(const struct kvp_verbs_ops *ops, struct ibv_context *ctx, uint8_t port,
                        int override_index, int *index, union ibv_gid *gid);

/**
 * Create an RC QP on pd with send and receive completions on cq, sized by *a capped by the
 * device (max_qp_wr). Returns KVP_OK with *out, KVP_ERR_INVALID (bad arguments, logged),
 * KVP_ERR_IO (create_qp failed; errno logged).
 */
int kvp_rdma_qp_create(const struct kvp_verbs_ops *ops, struct ibv_pd *pd, struct ibv_cq *cq,
                       const struct kvp_rdma_qp_attrs *a, struct ibv_qp **out);

/**
 * Bring qp from RESET to RTS facing `peer`: INIT (pkey 0, port, access), RTR (AV from the peer's
 * GID/LID, path MTU = min(ours, peer's, 4096), dest QPN, rq_psn = peer->psn, max_dest_rd_atomic
 * = min(a, device)), RTS (sq_psn = local->psn, timeout, retry_cnt, rnr_retry, max_rd_atomic =
 * min(a, device, peer)). Returns KVP_OK; KVP_ERR_INVALID when a peer value is out of range (a
 * malformed handshake: logged) or a is bad (timeout 0); KVP_ERR_IO when a verb fails (logged
 * with the step and errno; the QP is then left where it stopped: destroy it).
 */
int kvp_rdma_qp_to_rts(const struct kvp_verbs_ops *ops, struct ibv_qp *qp,
                       const struct kvp_rdma_local *local, const struct kvp_rdma_peer *peer,
                       const struct kvp_rdma_qp_attrs *a);

#endif
