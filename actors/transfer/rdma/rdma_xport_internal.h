/*
 * rdma_xport_internal.h — the transport's records, shared by rdma_xport.c (devices, endpoints,
 * handshake, segment side), rdma_mr.c (MR cache, bounce pool, dma-buf) and rdma_run.c (batches
 * and their fence). Not for other modules.
 */
#ifndef KVP_XFER_RDMA_XPORT_INTERNAL_H
#define KVP_XFER_RDMA_XPORT_INTERNAL_H

#include "actors/transfer/rdma/rdma_qp.h"
#include "actors/transfer/rdma/rdma_xport.h"
#include "wire/rdma_hello.h"

#define KVP_RDMA_MAX_NICS 8

/* One open NIC: its PD, CQ (with credits) and completion channel. */
struct kvp_rdma_nicst {
    struct kvp_rdma_nic topo;         /* name, NUMA node, PCIe path, active */
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *ch;
    struct kvp_rdma_cq cq;
    struct ibv_device_attr dattr;
    uint8_t port;
    uint8_t active_mtu;               /* enum ibv_mtu */
    uint16_t lid;
    int gid_index;
    union ibv_gid gid;
    uint64_t chunk_bytes;             /* min(max_mr_size, 4 GiB), page-aligned */
    uint8_t max_rd_atomic;            /* min(16, device limits) */
};

/* One entry of the MR cache: a range registered on every NIC (LOCAL_WRITE only). */
struct kvp_rdma_mrent {
    struct kvp_rdma_mrent *next;
    uint64_t base, len;
    uint32_t refs;                    /* kvp_rdma_register calls it serves */
    int kind;                         /* enum kvp_rdma_mem_kind */
    int ordinal;
    bool needs_flush;                 /* CUDA: cuFlushGPUDirectRDMAWrites after READs land */
    uint64_t dmabuf_base;             /* CUDA: the exported allocation range */
    uint64_t dmabuf_size;
    struct kvp_rdma_region region[KVP_RDMA_MAX_NICS];
};

/* A caller's registration: exactly [addr, addr+len), served by `ent`. */
struct kvp_rdma_user {
    struct kvp_rdma_user *next;
    uint64_t addr, len;
    struct kvp_rdma_mrent *ent;
};

/* The bounce pool: n slots of slot_bytes, registered on every NIC (LOCAL_WRITE). */
struct kvp_rdma_bounce {
    uint8_t *mem;
    uint64_t slot_bytes;
    uint32_t n;
    uint32_t *free_idx;
    uint32_t n_free;
    struct kvp_rdma_region region[KVP_RDMA_MAX_NICS];
};

enum kvp_rdma_ep_state { EP_OFFERED = 0, EP_LIVE = 1, EP_FENCING = 2, EP_FENCED = 3 };

#define KVP_RDMA_NONE UINT32_MAX

enum kvp_rdma_piece_state { PC_FREE = 0, PC_PENDING = 1, PC_POSTED = 2, PC_DONE = 3 };

/* One WR's worth of an xslice (rdma_run.c). Referenced by index (the pools grow). */
struct kvp_rdma_piece {
    uint32_t xs;                      /* its xslice */
    uint32_t next;                    /* the endpoint's pending FIFO, or the free list */
    uint64_t laddr, raddr;            /* laddr: caller memory, also when bounced */
    uint32_t len, lkey, rkey;
    struct kvp_rdma_mrent *ent;       /* NULL: through the bounce pool */
    int bslot;                        /* bounce slot while posted, else -1 */
    uint8_t op, state;
    struct kvp_rdma_ep *ep;
};

/* One submitted xslice until it is reported. */
struct kvp_rdma_xs {
    uint64_t id;
    struct kvp_rdma_ep *ep;
    uint32_t left;                    /* pieces not done */
    uint32_t next_free;
    int status;                       /* first piece failure (0 while all went well) */
    int fence_status;                 /* set by kvp_rdma_fence / abort */
    bool live, ready;
    bool gpu_read;                    /* a READ landed in GPU memory that needs a flush */
    int ordinal;
    uint64_t wdeadline_ms;            /* WRITE: no piece posted from this wall-clock ms on; 0: none */
};

struct kvp_rdma_ep {
    struct kvp_rdma_ep *next;         /* in x->eps */
    struct kvp_rdma_xport *x;
    size_t nic;
    uint32_t segment_id;
    uint64_t client_id, gen;
    uint32_t n_qps;
    struct kvp_rdma_qp q[KVP_RDMA_HELLO_MAX_QPS];
    uint32_t psn[KVP_RDMA_HELLO_MAX_QPS];
    struct kvp_rdma_region remote;    /* the segment's chunk table (rkeys) */
    int state;
    uint32_t rr;
    uint32_t pend_head, pend_tail;    /* pieces waiting for room (FIFO) */
    uint32_t posted;                  /* pieces posted, not completed */
    /* the fence in progress (EP_FENCING) */
    struct kvp_rdma_fence f;
    struct kvp_rdma_qp *fqs[KVP_RDMA_HELLO_MAX_QPS];
    struct ibv_mr **f_mrs;            /* MRs the wedged path deregisters */
    struct kvp_rdma_chunk **f_owner;  /* where each came from */
    size_t f_n;
};

/* Segment side: the QPs facing one client's endpoint. */
struct kvp_rdma_writer {
    struct kvp_rdma_writer *next;
    uint64_t client_id, gen;
    size_t nic;
    uint32_t n_qps;
    struct kvp_rdma_qp q[KVP_RDMA_HELLO_MAX_QPS];
};

/* The generation counter per (client, segment) pair on the client side. */
struct kvp_rdma_gen {
    struct kvp_rdma_gen *next;
    uint32_t segment_id;
    uint64_t gen;
};

struct kvp_rdma_xport {
    struct kvp_rdma_cfg cfg;          /* with defaults filled in */
    struct kvp_rdma_env env;
    const struct kvp_verbs_ops *ops;
    const char *who;
    struct kvp_rdma_nicst nic[KVP_RDMA_MAX_NICS];
    size_t n_nics;
    unsigned rr;                      /* rails: round-robin among equally near NICs */
    struct kvp_rdma_slots slots;      /* one wr_id table for the transport's life */
    struct kvp_rdma_reaper reaper;
    struct kvp_rdma_qp_attrs attrs;
    uint64_t psn_state;               /* seeded PSN generator (cfg.psn_seed != 0) */
    struct kvp_rdma_mrent *mrs;       /* the MR cache */
    struct kvp_rdma_user *users;
    struct kvp_rdma_bounce bounce;
    struct kvp_rdma_ep *eps;
    struct kvp_rdma_gen *gens;
    /* segment side */
    uint32_t seg_id;
    uint64_t seg_base, seg_len;
    struct kvp_rdma_region seg_region[KVP_RDMA_MAX_NICS];
    size_t seg_nic;                   /* NIC nearest the region: answers use it first */
    struct kvp_rdma_writer *writers;
    /* the core's pools (rdma_run.c) */
    struct kvp_rdma_piece *pc;
    uint32_t pc_cap, pc_free;
    struct kvp_rdma_xs *xs;
    uint32_t xs_cap, xs_free;
    size_t inflight;
    uint32_t *ready;                  /* xslice indexes to report */
    size_t n_ready, ready_cap;
    uint64_t run_ids;                 /* kvp_rdma_run's id counter */
    struct kvp_rdma_stats st;
};

/* rdma_xport.c */
uint32_t kvp_rdma_psn(struct kvp_rdma_xport *x);
uint64_t kvp_rdma_now(struct kvp_rdma_xport *x);
void kvp_rdma_wait(struct kvp_rdma_xport *x, uint64_t max_ns);
/** Fence a set of QPs to the end (ERR, drain, or wedged at the bound: destroy + dereg mrs).
 *  Blocking (waits through the env): used for QPs with no xslice of the core (closing an
 *  endpoint, the segment's writer QPs). */
int kvp_rdma_fence_qps(struct kvp_rdma_xport *x, struct kvp_rdma_qp **qps, size_t n,
                       struct ibv_mr **mrs, size_t n_mrs);

/* rdma_run.c */
/** Begin fencing ep (all its QPs to ERR); no-op when already fencing or fenced. */
void kvp_rdma_ep_fence_begin(struct kvp_rdma_xport *x, struct kvp_rdma_ep *ep);
/** Free the core's pools (close). */
void kvp_rdma_core_fini(struct kvp_rdma_xport *x);

/* rdma_mr.c */
/** The MR cache entry on nic covering [addr, addr+len), or NULL. */
struct kvp_rdma_mrent *kvp_rdma_mr_find(struct kvp_rdma_xport *x, uint64_t addr, uint64_t len);
int kvp_rdma_bounce_init(struct kvp_rdma_xport *x);
void kvp_rdma_bounce_fini(struct kvp_rdma_xport *x);
/** Re-register every MR whose slot a wedged fence set to NULL (new keys), on nic. */
void kvp_rdma_mr_after_wedge(struct kvp_rdma_xport *x, size_t nic);
/** Deregister the whole cache (close). */
void kvp_rdma_mr_fini(struct kvp_rdma_xport *x);

#endif
