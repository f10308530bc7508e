/*
 * fakeverbs_internal.h — the verbs double's records and the functions its two halves share
 * (fakeverbs_wire.c: event queue, packets, completions, audit; fakeverbs.c: the verbs ops,
 * fabric, nodes and knobs). Not for tests: they use fakeverbs.h.
 */
#ifndef KVP_TESTLIB_FAKEVERBS_INTERNAL_H
#define KVP_TESTLIB_FAKEVERBS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/lib/fakeverbs.h"

/* Every record of the double comes from these (fakeverbs_shared.c): libc, or the shared arena
 * of fv_shared_init, so that forked processes see one fabric. */
void *fv_malloc(size_t n);
void *fv_calloc(size_t n, size_t size);
void *fv_realloc(void *p, size_t n);
void fv_free(void *p);

#define PSN_MASK 0xffffffu
#define FV_MAX_DEVS 4
#define FV_GIDS 4
#define FV_DMABUF_BASE 1000

struct fv_node;
struct fv_qp;

struct fv_dev {
    struct ibv_device dev;
    struct fv_node *node;
    int idx;
    union ibv_gid gid[FV_GIDS];
    uint16_t lid;
};

struct fv_ctx {
    struct ibv_context ctx;
    struct fv_dev *d;
    bool closed;
    struct ibv_async_event ev[64]; /* queued async events (CQ_ERR); a full queue drops */
    int n_ev;
    struct fv_ctx *next;
};

struct fv_pd {
    struct ibv_pd pd;
    struct fv_ctx *c;
    bool dead;
    struct fv_pd *next;
};

struct fv_mr {
    struct ibv_mr mr;
    struct fv_pd *pd;
    uint8_t *host;   /* host memory of byte iova */
    uint64_t iova;   /* the address peers and SGEs use for the first byte */
    size_t len;
    int access;
    bool dead;
    struct fv_mr *next;
};

struct fv_cq;
struct fv_chan {
    struct ibv_comp_channel ch;
    struct fv_ctx *c;
    struct fv_cq **pend;  /* CQs with an undelivered completion event, FIFO */
    int pid;              /* the process whose fd table holds ch.fd (fv_shared_init: one fabric,
                           * several processes; only that one writes or closes it) */
    size_t n_pend, cap_pend;
    bool dead;
    struct fv_chan *next;
};

struct fv_cq {
    struct ibv_cq cq;
    struct fv_ctx *c;
    struct ibv_wc *ring;
    int cap, head, count;
    bool overrun, armed, dead;
    struct fv_chan *ch;
    unsigned events_acked;
    struct fv_cq *next;
};

struct fv_wqe {
    struct fv_wqe *next;
    uint64_t seq;
    uint64_t wr_id;
    int opcode;           /* IBV_WR_RDMA_WRITE / IBV_WR_RDMA_READ */
    bool signaled;
    uint64_t laddr;
    uint32_t lkey;
    uint32_t len;
    uint64_t raddr;
    uint32_t rkey;
    uint8_t *inl;         /* inline WRITE data, copied at post */
    uint32_t psn, npkts;
    bool sent, acked, failed, posted_in_err;
    enum ibv_wc_status status;
    int retries;
    uint64_t timer_gen;
    uint32_t rd_next;     /* READ: next response packet expected */
};

struct fv_rwr {
    uint64_t wr_id;
};

struct fv_qp {
    struct ibv_qp qp;
    struct fv_pd *pd;
    struct fv_cq *scq, *rcq;
    struct ibv_qp_cap cap;
    int sq_sig_all;
    bool dead;
    struct fv_wqe *head, *tail;
    uint32_t n_out;
    struct fv_rwr *rq;    /* posted receive WRs (only flushed: no SEND is modelled) */
    size_t n_rq, cap_rq;
    uint32_t sq_psn, epsn;
    uint32_t dest_qpn;
    struct ibv_ah_attr ah;
    uint8_t path_mtu, timeout, retry_cnt, rnr_retry, max_rd_atomic, max_dest_rd_atomic;
    uint8_t min_rnr_timer;
    int access;           /* qp_access_flags: what peers may do through this QP */
    uint64_t extra_delay;
    bool drop_acks;
    uint64_t last_arr;    /* arrival time of the last packet that left this QP (keeps order) */
    uint64_t tx_free;     /* when the QP's sender is free again (serialization) */
    bool flush_pending;   /* FV_FLUSH_ON_POLL: flush at the next poll */
    uint64_t wqe_seq;
    struct fv_qp *next;
};

struct fv_node {
    struct fv_fabric *f;
    struct kvp_verbs_ops ops;
    struct fv_node_config cfg;
    char name[32];
    int idx;
    struct fv_dev devs[FV_MAX_DEVS];
    int n_dev;
    bool frozen, killed, partitioned;
    uint64_t paused_until; /* PFC: packets reaching this node wait until after this time */
    int fail_next[FV_OP__N];
    uint64_t locked;
    struct fv_ctx *ctxs;
    struct fv_pd *pds;
    struct fv_mr *mrs;
    struct fv_cq *cqs;
    struct fv_chan *chans;
    struct fv_qp *qps;
    struct fv_node *next;
};

enum ev_kind { EV_REQ = 1, EV_RESP, EV_ACK, EV_NAK, EV_TIMER, EV_FLUSH };

struct fv_ev {
    uint64_t t, seq;
    int kind;
    bool cancelled;
    struct fv_qp *from;   /* the QP the packet left (NULL for timers/flushes) */
    struct fv_qp *req;    /* the requester QP (target of RESP/ACK/NAK/TIMER/FLUSH) */
    uint64_t depart;
    uint64_t wseq, wr_id;
    int op;
    uint32_t psn, pkt, npkts;
    uint64_t wr_raddr;    /* the WR's first remote address and total length (RETH) */
    uint32_t wr_len;
    uint32_t rkey;
    uint32_t off, len;    /* this packet's bytes within the WR */
    uint8_t *data;
    struct ibv_ah_attr ah;/* where a request goes */
    uint32_t dest_qpn;
    int status;
    uint64_t timer_gen;
};

struct fv_dmabuf {
    uint8_t *addr;
    size_t len;
};

struct fv_fabric {
    struct fv_config cfg;
    uint64_t rng;
    uint64_t now;
    uint64_t seq;
    struct fv_ev **heap;
    size_t n_heap, cap_heap;
    struct fv_node *nodes, *nodes_tail;
    int n_nodes;
    struct fv_dma *audit;
    size_t n_audit, cap_audit;
    struct fv_stats st;
    struct fv_dmabuf *dmabufs;
    size_t n_dmabufs, cap_dmabufs;
};

/* Shared between fakeverbs_wire.c (events, packets, completions) and fakeverbs.c (the ops). */
static inline struct fv_node *fvi_qp_node(const struct fv_qp *q)
{
    return q->pd->c->d->node;
}
uint64_t fvi_rnd(struct fv_fabric *f);
void *fvi_grow(void *p, size_t *cap, size_t need, size_t elem);
void fvi_ev_free(struct fv_ev *e);
void fvi_cancel_departures(struct fv_fabric *f, struct fv_qp *q, bool also_flush);
void fvi_chan_signal(struct fv_chan *ch, struct fv_cq *cq);
void fvi_cq_push(struct fv_fabric *f, struct fv_cq *cq, const struct ibv_wc *wc);
void fvi_discard_all(struct fv_qp *q);
void fvi_flush_qp(struct fv_fabric *f, struct fv_qp *q);
void fvi_schedule_flush(struct fv_fabric *f, struct fv_qp *q);
void fvi_enter_err(struct fv_fabric *f, struct fv_qp *q);
void fvi_kick(struct fv_fabric *f, struct fv_qp *q);

#endif
