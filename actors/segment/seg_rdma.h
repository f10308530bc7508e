/*
 * seg_rdma.h — a segment's RDMA side (issue 20, docs/rdma.md "Segment side"): with protocol=rdma
 * and a usable device, the segment's region is registered with the rdma transport (in chunks of
 * at most the device's max_mr_size) once the segment is mounted, and clients' RdmaHello offers,
 * carried on the data-plane TCP port as KVP_FRAME_RDMA_HELLO requests (wire/envelope.h), are
 * answered with the segment's QPs and chunk table. Every mount change (a new id, or unmount)
 * fences every writer's QPs first, so QPs made for an earlier mount never reach the region again.
 *
 * Thread use: single-owner state, no lock: every function below is called by the object's owner
 * only. In a segment that is loop 0 of the data-plane server (seg_server_rdma.c); the heartbeat
 * and the other loops reach it by message through seg_server.h.
 */
#ifndef KVP_SEGMENT_SEG_RDMA_H
#define KVP_SEGMENT_SEG_RDMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/kvpool.pb-c.h"

struct kvp_verbs_ops;
struct kvp_rdma_env;
struct kvp_seg_rdma;

struct kvp_seg_rdma_cfg {
    const char *who;                   /* log name; NULL: "seg-rdma" */
    const struct kvp_verbs_ops *ops;   /* NULL: libibverbs (tests: the verbs double) */
    const struct kvp_rdma_env *env;    /* NULL: the monotonic clock (tests: the double's clock) */
    const char *devices;               /* device_name / rdma_devices; NULL or "": any */
    const char *sysfs_root;            /* NULL: "/sys" */
    int gid_index;                     /* -1: auto */
    uint32_t fence_bound_ms;           /* 0: 1000 */
    uint64_t psn_seed;                 /* 0: getrandom (tests: a seed) */
};

/**
 * Open the rdma transport as a segment over [base, base+size) (registered at the first
 * kvp_seg_rdma_set_id with a non-zero id). Returns KVP_OK, KVP_ERR_UNSUPPORTED (no device or a
 * build without libibverbs: one log line said so; serve TCP only), KVP_ERR_INVALID, KVP_ERR_NOMEM.
 */
int kvp_seg_rdma_open(struct kvp_seg_rdma **out, const struct kvp_seg_rdma_cfg *cfg, void *base,
                      uint64_t size);
/** Mount change: fence every writer's QPs, then (id != 0) register the region if not yet and
 *  answer offers for `id`. A registration failure is logged and leaves the segment on TCP. */
void kvp_seg_rdma_set_id(struct kvp_seg_rdma *r, uint32_t segment_id);
/**
 * Answer one RdmaHello offer (r NULL: KVP_ERR_UNSUPPORTED, no answer). *answer (malloc'd, the
 * caller frees) is the encoded answer, carrying its own status, also on refusals; NULL when
 * none could be made. Returns the answer's status.
 */
int kvp_seg_rdma_accept(struct kvp_seg_rdma *r, const uint8_t *offer, size_t len,
                        uint8_t **answer, size_t *answer_len);
/**
 * FenceWriter (docs/rdma.md "FenceWriter and Fenced"): move every QP facing writer client_id
 * (0: every writer) with a conn_generation <= gen (0: any) to ERR and destroy it. When this
 * returns, no packet of those writers places another byte in the region. Returns the number of
 * QPs fenced (>= 0); r NULL: 0.
 */
int kvp_seg_rdma_fence_writers(struct kvp_seg_rdma *r, uint64_t client_id, uint64_t gen);

/** The QPs the segment holds facing the writers w with (w & mask) == (client_id & mask) (mask
 *  UINT64_MAX: that one writer; 0: none, e.g. fenced or never connected), and in *gen_sum (may be
 *  NULL) the sum of their conn_generations (a reconnect changes it); status and tests. r NULL: 0.
 *  The owner's thread only (a server's: kvp_seg_server_rdma_writer_qps). */
uint32_t kvp_seg_rdma_writer_qps(struct kvp_seg_rdma *r, uint64_t client_id, uint64_t mask,
                                 uint64_t *gen_sum);

/** QPs facing writers destroyed since open (every fence, and a reconnect's older generation);
 *  status and tests. r NULL: 0. The owner's thread only (a server's:
 *  kvp_seg_server_rdma_writers_fenced). */
uint64_t kvp_seg_rdma_writers_fenced(struct kvp_seg_rdma *r);

/* The heartbeat's half of FenceWriter/Fenced (used by seg_heartbeat.c; tests drive it). */
struct kvp_seg_fence_ack {
    uint64_t seq;     /* the last FenceWriter.seq run (0: none) */
    int32_t status;   /* its result (0) */
    uint32_t qps;     /* QPs it destroyed */
};
/** With an RDMA side (rdma): set hb->rdma_writers, hb->fence_selectors (this segment runs
 *  FenceWriter.writers) and hb->fenced (f is its storage) from *ack. rdma false: nothing is set
 *  (a TCP-only segment says nothing, as older ones). Any thread. */
void kvp_seg_rdma_hb_fill(bool rdma, const struct kvp_seg_fence_ack *ack, Kvp__HeartbeatReq *hb,
                          Kvp__Fenced *f);
/** Whether a HeartbeatResp's FenceWriter (fw may be NULL) is one to run: a seq other than 0 and
 *  than the last one run (ack->seq). Any thread. */
bool kvp_seg_fence_writer_due(const Kvp__FenceWriter *fw, const struct kvp_seg_fence_ack *ack);
/** Record a FenceWriter run: seq, status OK, qps QPs destroyed (negative: 0). */
void kvp_seg_fence_ack_set(struct kvp_seg_fence_ack *ack, uint64_t seq, int qps);
/* The most FenceWriter.writers run one by one (more: every writer is fenced, with a WARN). The
 * master sends at most KVP_FENCE_SELECTORS_MAX (8, fence_track.h). */
#define KVP_SEG_FENCE_SELECTORS_MAX 16
/* One FenceWriter.writers entry, copied out of the message (it travels to loop 0 by value):
 * writer w is selected when (w & mask) == (client_id & mask); mask 0 selects every writer. */
struct kvp_seg_writer_sel {
    uint64_t client_id;
    uint64_t mask;
};
/** Copy a FenceWriter's selectors into out[KVP_SEG_FENCE_SELECTORS_MAX]; returns how many (0:
 *  fence by fw->client_id: it names one writer, or none were sent, or they are unusable, more
 *  than KVP_SEG_FENCE_SELECTORS_MAX or a NULL entry, which is logged as a WARN by `who` and means
 *  every writer). Any thread. */
size_t kvp_seg_fence_selectors(const Kvp__FenceWriter *fw, struct kvp_seg_writer_sel *out, const char *who);
/** The owner's FenceWriter: with client_id 0 and 1..KVP_SEG_FENCE_SELECTORS_MAX selectors, fence
 *  the QPs (generation <= gen, 0: any) of the writers they select; otherwise as
 *  kvp_seg_rdma_fence_writers(r, client_id, gen). Returns the QPs fenced (>= 0); r NULL: 0. */
int kvp_seg_rdma_fence_run(struct kvp_seg_rdma *r, uint64_t client_id, uint64_t gen,
                           const struct kvp_seg_writer_sel *sel, size_t n_sel);
/** The owner's FenceWriter step in one call: when kvp_seg_fence_writer_due, run it
 *  (kvp_seg_fence_selectors, kvp_seg_rdma_fence_run: with client_id 0 and writers, only the
 *  writers they select) and record it in *ack. Returns true when it ran (the caller answers at
 *  once rather than a period later). r NULL: false. The segment's heartbeat does the same through
 *  loop 0 (kvp_seg_server_fence_request, the selectors copied into the message) and answers when
 *  the reply comes. */
bool kvp_seg_rdma_on_fence_writer(struct kvp_seg_rdma *r, const Kvp__FenceWriter *fw,
                                  struct kvp_seg_fence_ack *ack);

/** Fence every writer, deregister, close. Accepts NULL; sets *r NULL. */
void kvp_seg_rdma_close(struct kvp_seg_rdma **r);

#endif
