/*
 * seg_server.h — the TCP data plane of one segment: serves READ and WRITE frames
 * (wire/envelope.h) for a memory region. Used by kvpool-segment and by embedded clients.
 *
 * A request is served only when its segment_id equals the server's current id and
 * [offset, offset+length) lies inside the region; otherwise the reply carries KVP_ERR_INVALID
 * (bounds) or KVP_ERR_NOT_FOUND (wrong id: a restarted or remounted segment), and for WRITE the
 * payload is drained without touching the region.
 */
#ifndef KVP_SEG_SERVER_H
#define KVP_SEG_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvp_seg_server;

/**
 * Listen on host:port (port 0 = ephemeral; IPv4, IPv6, names) and serve [base, base+size).
 * The region stays owned by the caller and must outlive the server.
 * Errors: KVP_ERR_BUSY (the port is in use: nothing logged, the caller retries and logs; see
 * kvp_retry_start), KVP_ERR_IO (other bind errors), KVP_ERR_INVALID, KVP_ERR_NOMEM.
 */
int kvp_seg_server_start(struct kvp_seg_server **out, const char *host, uint32_t port, void *base,
                         uint64_t size);
/**
 * As kvp_seg_server_start, and when n_token_pks > 0 every connection must pass the data-plane
 * token check first (auth/auth_token.h, docs/security.md "Data plane: tokens"): the server
 * sends a challenge at accept and serves no request before a response carrying a token signed
 * by one of the masters' token keys `token_pks` (32-byte Ed25519 public keys, copied), for this
 * segment's current id, unexpired, with a valid proof. Refused connections are closed, counted
 * (token_refused) and logged naming the peer address (rate-limited).
 */
int kvp_seg_server_start_auth(struct kvp_seg_server **out, const char *host, uint32_t port, void *base,
                              uint64_t size, const uint8_t (*token_pks)[32], size_t n_token_pks);
/** The bound port. */
uint32_t kvp_seg_server_port(const struct kvp_seg_server *s);
struct kvp_seg_rdma_cfg;
struct kvp_rt_ctx;
/**
 * protocol=rdma: also serve RDMA (actors/segment/seg_rdma.h): open the rdma transport as this
 * segment, register the region at mount, answer KVP_FRAME_RDMA_HELLO on the data-plane port.
 * The RDMA side is then loop 0's state (seg_server_rdma.c); this returns once loop 0 has it, so a
 * hello right after is answered. Once per server; a plain thread's call (it blocks on loop 0).
 * KVP_ERR_UNSUPPORTED: no usable device (logged; TCP only, handshakes are answered UNSUPPORTED);
 * KVP_ERR_INVALID (NULL, or called twice); KVP_ERR_CLOSED (the server is stopping).
 */
int kvp_seg_server_rdma(struct kvp_seg_server *s, const struct kvp_seg_rdma_cfg *cfg);
/** Whether kvp_seg_server_rdma gave this server an RDMA side (any thread). */
bool kvp_seg_server_has_rdma(const struct kvp_seg_server *s);
/**
 * Set the segment id requests must carry (0 = reject all until mounted): a mount change. Loop 0
 * runs it: the RDMA side first fences every writer of the old mount, then the new id is served.
 * Blocking: when this returns, both hold. Plain threads only (not from an actor's callback: use
 * the _request form there).
 */
void kvp_seg_server_set_id(struct kvp_seg_server *s, uint32_t segment_id);
/**
 * set_id from inside an actor's callback: the reply (KVP_RT_REPLY, msg->corr_id == *corr_id,
 * status KVP_OK; KVP_ERR_CLOSED when the server stopped first) comes back to the caller once the
 * old mount's writers are fenced and the new id is served. No deadline. Errors (no reply will
 * come): KVP_ERR_INVALID, KVP_ERR_NOMEM, KVP_ERR_CLOSED.
 */
int kvp_seg_server_set_id_request(struct kvp_rt_ctx *ctx, struct kvp_seg_server *s, uint32_t segment_id,
                                  uint64_t *corr_id);
/**
 * set_id as a one-way message (any thread): loop 0 runs it after every set_id/fence the same
 * thread sent before, and before those it sends after. Nothing says when it ran: for a caller
 * that does nothing that depends on it. Errors: KVP_ERR_INVALID, KVP_ERR_NOMEM, KVP_ERR_CLOSED.
 */
int kvp_seg_server_set_id_post(struct kvp_seg_server *s, uint32_t segment_id);
/**
 * FenceWriter on the RDMA side (seg_rdma.h, kvp_seg_rdma_fence_writers): fence the QPs facing
 * writer client_id (0: every writer) with a generation <= gen (0: any). Blocking (plain threads):
 * returns the number of QPs fenced (>= 0; 0 without an RDMA side), or a negative kvp_err when
 * loop 0 could not be reached.
 */
int kvp_seg_server_fence_writers(struct kvp_seg_server *s, uint64_t client_id, uint64_t gen);
struct kvp_seg_writer_sel;
/**
 * The per-writer fence (FenceWriter.writers, seg_rdma.h kvp_seg_rdma_fence_run): with client_id 0
 * and n_sel (1..KVP_SEG_FENCE_SELECTORS_MAX) selectors, fence the QPs (generation <= gen, 0: any)
 * of the writers they select; n_sel 0: as kvp_seg_server_fence_writers. The selectors are copied.
 * Blocking (plain threads): returns the QPs fenced (>= 0), or a negative kvp_err
 * (KVP_ERR_INVALID: more than KVP_SEG_FENCE_SELECTORS_MAX; loop 0 unreachable).
 */
int kvp_seg_server_fence_selected(struct kvp_seg_server *s, uint64_t client_id, uint64_t gen,
                                  const struct kvp_seg_writer_sel *sel, size_t n_sel);
/** FenceWriter from inside an actor's callback, selectors included (as
 *  kvp_seg_server_fence_selected; copied into the message): the reply (as
 *  kvp_seg_server_set_id_request; its arg: QPs fenced) comes once those QPs are fenced. Errors as
 *  kvp_seg_server_set_id_request, and KVP_ERR_INVALID for more than KVP_SEG_FENCE_SELECTORS_MAX. */
int kvp_seg_server_fence_request(struct kvp_rt_ctx *ctx, struct kvp_seg_server *s, uint64_t client_id,
                                 uint64_t gen, const struct kvp_seg_writer_sel *sel, size_t n_sel,
                                 uint64_t *corr_id);
/** Status and tests, from loop 0 (seg_rdma.h kvp_seg_rdma_writer_qps): *qps (may be NULL) the QPs
 *  facing the writers w with (w & mask) == (client_id & mask), *gen_sum (may be NULL) the sum of
 *  their generations; 0 without an RDMA side. Blocking (plain threads). Returns KVP_OK, or
 *  KVP_ERR_INVALID / KVP_ERR_NOMEM / KVP_ERR_CLOSED (loop 0 unreachable; outputs 0). */
int kvp_seg_server_rdma_writer_qps(struct kvp_seg_server *s, uint64_t client_id, uint64_t mask,
                                   uint32_t *qps, uint64_t *gen_sum);
/** Status and tests, from loop 0: *fenced the RDMA side's writers_fenced (seg_rdma.h; 0 without
 *  one). Blocking (plain threads). Errors as kvp_seg_server_rdma_writer_qps. */
int kvp_seg_server_rdma_writers_fenced(struct kvp_seg_server *s, uint64_t *fenced);
/** Tests: a function a loop other than loop 0 calls after it read an RdmaHello (and the fence
 *  epoch it carries), before it forwards the offer to loop 0; it may block that loop, so a test
 *  can hold the handshake until after a fence. Set once, before the hello (NULL: none). */
typedef void (*kvp_seg_hello_hook)(void *arg);
void kvp_seg_server_test_hold_hellos(struct kvp_seg_server *s, kvp_seg_hello_hook fn, void *arg);
/* Request kinds and results counted by the server (names for metrics labels). */
#define KVP_SEG_OPS 3     /* read, write, ping */
#define KVP_SEG_RESULTS 5 /* ok, not_found, invalid, deadline_passed, other */
extern const char *const kvp_seg_op_names[KVP_SEG_OPS];
extern const char *const kvp_seg_result_names[KVP_SEG_RESULTS];

/** Counters of the data plane since start (docs/operations.md "Metrics"). */
struct kvp_seg_server_stats {
    uint64_t bytes_read;      /* READ payload bytes served (queued for sending) */
    uint64_t bytes_written;   /* WRITE payload bytes that landed in the region */
    uint64_t requests[KVP_SEG_OPS][KVP_SEG_RESULTS];
    uint64_t bad_frames;      /* malformed headers (the connection was closed) */
    uint64_t conns_open;      /* connections being served now */
    uint64_t conns_accepted;  /* since start */
    uint64_t conns_refused;   /* over KVP_SEG_MAX_CONNS */
    uint64_t token_refused;   /* refused by the data-plane token check */
    uint64_t rdma_hellos_forwarded; /* RDMA handshakes that came on a loop other than loop 0 (the
                                     * RDMA side's owner) and were forwarded to it */
};

/** Snapshot of the counters. Any thread (the metrics endpoint's): takes the connection list's
 * lock for the sum; the request path never waits on it. s NULL: all zero. */
void kvp_seg_server_stats(struct kvp_seg_server *s, struct kvp_seg_server_stats *out);

/** Stop serving, close every connection, join threads, free. Accepts NULL; sets *s NULL. */
void kvp_seg_server_stop(struct kvp_seg_server **s);

#endif
