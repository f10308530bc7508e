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

enum kvp_rdma_ep_state { EP_OFFERED = 0, EP_LIVE = 1, EP_FENCED = 2 };

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
    /* the batch running now (rdma_run.c); completions are routed to it */
    void *run;
    uint64_t run_serial;
    struct kvp_rdma_stats st;
};

/* rdma_xport.c */
uint32_t kvp_rdma_psn(struct kvp_rdma_xport *x);
uint64_t kvp_rdma_now(struct kvp_rdma_xport *x);
void kvp_rdma_wait(struct kvp_rdma_xport *x, uint64_t max_ns);
/** Fence a set of QPs to the end (ERR, drain, or wedged at the bound: destroy + dereg mrs). */
int kvp_rdma_fence_qps(struct kvp_rdma_xport *x, struct kvp_rdma_qp **qps, size_t n,
                       struct ibv_mr **mrs, size_t n_mrs);

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
