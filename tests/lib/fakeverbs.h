/*
 * fakeverbs.h — the verbs test double: kvp_verbs_ops (actors/transfer/rdma/verbs_ops.h) over an
 * in-process simulated fabric with a virtual clock. Design: ../shared/design/rdma.md §4 and
 * docs/rdma.md ("The verbs test double").
 *
 * A fabric (fv_fabric) holds simulated processes (fv_node), each with its own ops table
 * (fv_node_ops) and 0..4 devices. Verbs objects made through a node's table are real rdma-core
 * structs (struct ibv_qp, ...) embedded in the double's own records; their memory stays valid
 * until fv_fabric_destroy, even after the verbs destroy call, so a test may keep pointers.
 * Registered memory is the test's own memory: WRITEs and READ responses are memcpy'd into it
 * when their packets are delivered, and every such placement is recorded in the DMA audit log.
 *
 * Time: nothing happens on its own. The fabric has a virtual clock (ns, starts at 1 s); verbs
 * calls act at the current time, and fv_advance()/fv_run_until()/fv_step() deliver the queued
 * events (packets, ACKs, retransmit timers, flushes) in (time, sequence) order. All randomness
 * (keys, QP numbers, per-packet jitter) comes from one generator seeded by fv_config.seed, so a
 * run is a pure function of the seed and the test's calls.
 *
 * Model (what each piece does; docs/rdma.md lists what is simplified):
 *  - RC QPs only: RESET→INIT→RTR→RTS with the required/optional attribute masks of
 *    man 3 ibv_modify_qp; any state →ERR or →RESET. Posting in RESET/INIT/RTR fails EINVAL;
 *    posting in ERR follows the node's flush mode. RESET and destroy discard WRs, no CQE.
 *  - Per-QP order: a QP's packets arrive in the order they left; CQEs come in post order; the
 *    first error CQE moves the QP to ERR. Unsignaled successes produce no CQE.
 *  - Flush on ERR by provider (fv_node_config.flush): FV_FLUSH_ALL (mlx5: every outstanding WR,
 *    including ones posted in ERR, completes with IBV_WC_WR_FLUSH_ERR after flush_delay_ns),
 *    FV_FLUSH_NOT_LATE (i40iw: WRs posted after the ERR never complete), FV_FLUSH_ON_POLL (cxgb3:
 *    flushes appear only when the CQ is polled), FV_FLUSH_NEVER (broken: nothing completes).
 *  - CQs hold exactly `cqe` entries: one more CQE is an overrun: it is lost, IBV_EVENT_CQ_ERR is
 *    queued on the context, and poll_cq returns -1 from then on.
 *  - MRs: REMOTE_WRITE without LOCAL_WRITE is EINVAL; length > max_mr_size EINVAL; a memlock
 *    budget (ENOMEM). The local SGE is checked (lkey, bounds, LOCAL_WRITE for a READ's
 *    destination) → IBV_WC_LOC_PROT_ERR; the remote side checks rkey, bounds and the MR's and
 *    the responder QP's REMOTE_READ/REMOTE_WRITE → IBV_WC_REM_ACCESS_ERR. dma-buf MRs over
 *    fv_dmabuf_export()ed "device" memory (tagged host memory) with iova addressing.
 *  - Wire: packets of at most `mtu` bytes, latency + seeded jitter + per-QP extra delay,
 *    serialization at ns_per_kib; PSNs (a responder executes only the expected PSN, re-ACKs a
 *    duplicate WRITE without placing it again, re-reads for a duplicate READ); ACK timeout
 *    4.096 us * 2^timeout and retry_cnt retransmissions, then IBV_WC_RETRY_EXC_ERR.
 *  - Late packets: packets that left before the requester went to ERR (or was destroyed, or its
 *    process was killed) still travel and still execute at an RTR/RTS responder with a valid
 *    rkey: delayed placement. A responder QP in ERR/RESET/destroyed drops them. READ responses
 *    that reach a requester no longer in RTS are dropped (earlier ones may have landed), unless
 *    the node sets err_keeps_placing (then only destroy or dereg stops them).
 *  - Processes: frozen (the application runs no code: its poll_cq returns 0, post_send and
 *    modify_qp EAGAIN, while its device keeps sending, retransmitting and answering), killed
 *    (QPs destroyed without CQEs, MRs deregistered, CQs gone; packets already on the wire still
 *    arrive), and partitioned (packets to or from it are lost until healed).
 *  - Knobs: fail the next post/modify/reg with an errno; extra delay on a QP; lost ACKs on a QP
 *    (the data lands, the requester times out: "maybe applied"); inject an arbitrary CQE; a
 *    spurious completion-channel event.
 *  - DMA audit log: every placement {time, address, length, kind, QP, wr_id}, queried with
 *    fv_audit_placed_after(): "no byte placed in [addr, addr+len) after time t".
 *
 * Single-threaded, no locks: one test thread drives the fabric and calls the verbs.
 */
#ifndef KVP_TESTLIB_FAKEVERBS_H
#define KVP_TESTLIB_FAKEVERBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "actors/transfer/rdma/verbs_ops.h"

struct fv_fabric;
struct fv_node;

struct fv_config {
    uint64_t seed;            /* generator seed (any value) */
    uint64_t latency_ns;      /* one-way base latency; default 2000 */
    uint64_t jitter_ns;       /* extra per packet, uniform in [0, jitter_ns]; default 1000 */
    uint64_t ns_per_kib;      /* serialization per KiB; default 80 (~12.5 GB/s) */
    uint32_t mtu;             /* bytes per packet, 256..4096; default 4096 */
    uint64_t flush_delay_ns;  /* from ERR to the flush CQEs; default 5000 */
};

enum fv_flush_mode {
    FV_FLUSH_ALL = 0,
    FV_FLUSH_NOT_LATE = 1,
    FV_FLUSH_ON_POLL = 2,
    FV_FLUSH_NEVER = 3,
};

struct fv_node_config {
    const char *name;         /* for device names and logs; default "nodeN" */
    int n_devices;            /* 0..4; -1: get_device_list returns NULL with errno list_errno */
    int list_errno;           /* default ENOSYS (what this kernel gives) */
    int flush;                /* enum fv_flush_mode */
    uint64_t max_mr_size;     /* default 1 TiB */
    uint64_t memlock_bytes;   /* registration budget over all MRs; 0 = unlimited */
    uint32_t max_qp_wr;       /* default 16384 */
    int max_cqe;              /* default 65536 */
    uint8_t link_layer;       /* IBV_LINK_LAYER_ETHERNET (default, RoCE) or _INFINIBAND */
    bool no_rocev2;           /* the GID table has no RoCE v2 entries */
    bool err_keeps_placing;   /* provider bug: a QP in ERR still places the READ responses that
                               * reach it until it is destroyed (what the wedged fence's
                               * destroy + dereg must stop) */
};

/* The verbs calls a knob can fail. */
enum fv_op { FV_OP_POST = 0, FV_OP_MODIFY = 1, FV_OP_REG = 2, FV_OP__N = 3 };

/* One placement of bytes by the simulated device. */
enum fv_dma_kind {
    FV_DMA_WRITE = 1,      /* a WRITE packet placed at the responder */
    FV_DMA_READ_RESP = 2,  /* a READ response placed at the requester */
};
struct fv_dma {
    uint64_t t_ns;
    uintptr_t addr;        /* host address written */
    size_t len;
    uint8_t kind;          /* enum fv_dma_kind */
    uint32_t qp_num;       /* the requester's QP */
    uint64_t wr_id;        /* the requester's WR */
    bool requester_stopped;/* the requester QP had left RTS (ERR, RESET, destroyed) by then */
};

struct fv_stats {
    uint64_t packets;          /* request, response and ACK packets sent */
    uint64_t dropped;          /* packets lost: dead/ERR peer, partition, wrong QP, bad PSN */
    uint64_t retransmits;      /* WRs sent again after an ACK timeout */
    uint64_t cqes;             /* CQEs delivered into CQs */
    uint64_t flushed;          /* of them, IBV_WC_WR_FLUSH_ERR */
    uint64_t cq_overruns;      /* CQEs lost to a full CQ */
    uint64_t late_placements;  /* placements after the requester had left RTS */
};

/**
 * Create a fabric. cfg NULL (or zero fields) takes the defaults above. Returns KVP_OK,
 * KVP_ERR_INVALID (mtu out of range), KVP_ERR_NOMEM. Free with fv_fabric_destroy.
 */
int fv_fabric_new(struct fv_fabric **out, const struct fv_config *cfg);
/** Free the fabric and every object made through its nodes (fp may be NULL; sets NULL). */
void fv_fabric_destroy(struct fv_fabric **fp);

/**
 * Add a simulated process. cfg NULL = one device, FV_FLUSH_ALL, defaults. The node is owned by
 * the fabric. Errors: KVP_ERR_INVALID (n_devices > 4 or < -1, flush out of range), KVP_ERR_NOMEM.
 */
int fv_node_add(struct fv_fabric *f, const struct fv_node_config *cfg, struct fv_node **out);
/** The node's ops table (valid until the fabric is destroyed). */
const struct kvp_verbs_ops *fv_node_ops(struct fv_node *n);

/* Virtual clock. */
uint64_t fv_now(const struct fv_fabric *f);
/** Deliver every event due up to now + ns, then set the clock to now + ns. */
void fv_advance(struct fv_fabric *f, uint64_t ns);
/** fv_advance to absolute time t_ns (no-op if t_ns <= now). */
void fv_run_until(struct fv_fabric *f, uint64_t t_ns);
/** Deliver the next event (the clock jumps to it). Returns false when none is queued. */
bool fv_step(struct fv_fabric *f);
/** Time of the next queued event, or UINT64_MAX. */
uint64_t fv_next_event(const struct fv_fabric *f);
/** Deliver events until none is left or the clock would pass now + limit_ns. */
void fv_run_idle(struct fv_fabric *f, uint64_t limit_ns);

/* Processes. */
void fv_node_freeze(struct fv_node *n, bool frozen);
/** SIGKILL: every QP destroyed (no CQEs), every MR deregistered, CQs gone. Irreversible. */
void fv_node_kill(struct fv_node *n);
void fv_node_partition(struct fv_node *n, bool partitioned);
/** Whether fv_node_kill ran on n. */
bool fv_node_killed(const struct fv_node *n);
/**
 * PFC pause: for the next ns, nothing is delivered to this node's ports; packets that reach it
 * meanwhile are held upstream and delivered, in order, just after the pause (then they execute
 * as usual: a late WRITE held by PFC still lands at an RTS responder).
 */
void fv_node_pause(struct fv_node *n, uint64_t ns);

/* Knobs. */
/** The node's next call of `op` fails with errno `err` (post: returned; modify: returned;
 *  reg: NULL with errno). */
void fv_node_fail_next(struct fv_node *n, enum fv_op op, int err);
/** Extra one-way delay for every packet that leaves this QP from now on (0 = none). */
void fv_qp_set_delay(struct ibv_qp *qp, uint64_t extra_ns);
/** Lose every WRITE ACK sent to this requester QP (lost-ACK mode). */
void fv_qp_drop_acks(struct ibv_qp *qp, bool drop);
/** Push a CQE into cq as if the device had (bad or stale wr_id tests). Counts toward overrun. */
void fv_cq_inject(struct ibv_cq *cq, const struct ibv_wc *wc);
/** Put a completion event for cq on its channel without a CQE (a spurious event: man 3
 *  ibv_get_cq_event says consumers must poll again after re-arming and may find nothing). */
void fv_chan_spurious(struct ibv_comp_channel *ch, struct ibv_cq *cq);
/** The double's QP state (same as query_qp's, also after destroy: then IBV_QPS_RESET). */
enum ibv_qp_state fv_qp_state(struct ibv_qp *qp);
/** WRs posted on qp and not yet completed or discarded. */
uint32_t fv_qp_outstanding(struct ibv_qp *qp);

/**
 * "Export" [addr, addr+len) of test memory as a dma-buf: returns a handle >= 1000 to pass as
 * reg_dmabuf_mr's fd (the double's stand-in for cuMemGetHandleForAddressRange). Returns -1 on
 * bad arguments.
 */
int fv_dmabuf_export(struct fv_fabric *f, void *addr, size_t len);

/* DMA audit log. */
size_t fv_audit_count(const struct fv_fabric *f);
const struct fv_dma *fv_audit_get(const struct fv_fabric *f, size_t i);
/**
 * Number of placements that overlap [addr, addr+len) at a time > after_ns. *first (when not
 * NULL) gets the earliest such entry or NULL.
 */
size_t fv_audit_placed_after(const struct fv_fabric *f, const void *addr, size_t len,
                             uint64_t after_ns, const struct fv_dma **first);
/** A hash of the log's (time, length, kind, qp, wr_id) sequence, for determinism checks. */
uint64_t fv_audit_hash(const struct fv_fabric *f);

void fv_stats_get(const struct fv_fabric *f, struct fv_stats *out);

/** The ACK timeout of a QP attribute `timeout` (0..31): 4096 ns * 2^timeout; 0 = infinite. */
uint64_t fv_ack_timeout_ns(uint8_t timeout);

#endif
