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
/**
 * protocol=rdma: also serve RDMA (actors/segment/seg_rdma.h): open the rdma transport as this
 * segment, register the region at mount, answer KVP_FRAME_RDMA_HELLO on the data-plane port.
 * Once per server. KVP_ERR_UNSUPPORTED: no usable device (logged; TCP only, handshakes are
 * answered UNSUPPORTED); KVP_ERR_INVALID (NULL, or called twice).
 */
int kvp_seg_server_rdma(struct kvp_seg_server *s, const struct kvp_seg_rdma_cfg *cfg);
/** The RDMA side opened by kvp_seg_server_rdma, or NULL (TCP only). Owned by the server. */
struct kvp_seg_rdma *kvp_seg_server_rdma_side(struct kvp_seg_server *s);
/** Set the segment id requests must carry (0 = reject all until mounted). Thread-safe. */
void kvp_seg_server_set_id(struct kvp_seg_server *s, uint32_t segment_id);
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
};

/** Snapshot of the counters. Any thread (the metrics endpoint's): takes the connection list's
 * lock for the sum; the request path never waits on it. s NULL: all zero. */
void kvp_seg_server_stats(struct kvp_seg_server *s, struct kvp_seg_server_stats *out);

/** Stop serving, close every connection, join threads, free. Accepts NULL; sets *s NULL. */
void kvp_seg_server_stop(struct kvp_seg_server **s);

#endif
