/*
 * xport_rdma.h — the `rdma` transport behind the transport seam (actors/transfer/transport.h),
 * its options, and what client/segment status shows per peer. docs/rdma.md.
 */
#ifndef KVP_XFER_XPORT_RDMA_H
#define KVP_XFER_XPORT_RDMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "actors/transfer/rdma/rdma_xport.h"
#include "actors/transfer/transport.h"

extern const struct kvp_xport_ops kvp_xport_rdma;

/*
 * Optional options of kvp_xport_rdma, passed as kvp_xport_params.wrap_opts (NULL: libibverbs,
 * the runtime clock, no handshake channel). The seam has no transport-specific options yet, so
 * rdma reads its own from that pointer.
 */
struct kvp_xport_rdma_opts {
    struct kvp_rdma_cfg cfg;   /* ops (the verbs double in tests), devices, gid_index, ... */
    struct kvp_rdma_env env;   /* now_ns NULL: the monotonic clock and the channel fds */
    /* With client_id 0: the writer id is writer_prefix's high 32 bits and a random non-zero low
     * half, so one PutRevoke can name every transfer actor of a client (per-writer fence,
     * KVP_RDMA_WRITER_FAMILY_MASK). 0: a random id. */
    uint64_t writer_prefix;
    uint64_t client_id;        /* the writer id segments fence; 0: a random one. One id per transport
                                * instance: a segment takes a newer generation from the same id as a
                                * reconnect and fences the older QPs (so two transfer actors of one
                                * client need two ids, and FenceWriter names them all) */
    /* The handshake channel: send the RdmaHello offer to the segment at `endpoint` and return
     * its answer (malloc'd). NULL: no channel (connect answers KVP_ERR_UNSUPPORTED: TCP). */
    int (*hello)(void *arg, const char *endpoint, const uint8_t *offer, size_t len,
                 uint8_t **answer, size_t *answer_len);
    void *hello_arg;
    /* Tests through the transfer engine: each poll advances env's (virtual) clock by the engine's
     * real time since the previous poll (at most 5 ms), so the verbs double moves as time passes. */
    bool drive_clock;
    /* Memory registered at open, as kvp_register_buffer will through mem_register (tests that
     * go through the engine, which has no registration call): 0 length = none. */
    void *prereg_base;
    uint64_t prereg_len;
};

/* The handshake channel over the segment's data-plane TCP port (rdma_hello_tcp.c): a
 * kvp_xport_rdma_opts.hello with hello_arg a struct kvp_rdma_hello_tcp_opts (or NULL). Blocks the
 * caller at most timeout_ms (0: 2000). Errors: the answer frame's status (KVP_ERR_UNSUPPORTED: a
 * segment without RDMA), KVP_ERR_TRANSFER (no connection, an older segment that closes on the
 * op, or no token for a segment that requires one: token_respond failed or the segment refused it), KVP_ERR_TIMEOUT, KVP_ERR_MALFORMED, KVP_ERR_INVALID, KVP_ERR_NOMEM. */
struct kvp_rdma_hello_tcp_opts {
    uint32_t timeout_ms;
    /* Data-plane tokens (docs/security.md "Data plane: tokens"), as kvp_xport_params.token_respond:
     * when set, the channel's own connection waits for the segment's challenge and sends the
     * response this writes before the hello (a segment that requires tokens refuses anything
     * else). NULL: no token (auth none). Called on the caller's thread. An rdma instance opened
     * with kvp_xport_params.token_respond set uses a copy of these options with that callback
     * instead (the transfer engine's: the wallet of the actor the instance belongs to). */
    int (*token_respond)(void *ctx, const uint8_t *challenge, size_t len, uint8_t *out, size_t cap);
    void *token_ctx;
};
int kvp_rdma_hello_tcp(void *arg, const char *endpoint, const uint8_t *offer, size_t len,
                       uint8_t **answer, size_t *answer_len);

/* Per peer, for client and segment status: which transport and device it uses. */
struct kvp_xport_rdma_peer_status {
    char transport[8];         /* "rdma" */
    char device[64];           /* local NIC name */
    uint64_t generation;       /* conn_generation of the current endpoint */
    bool live;                 /* connected and not fenced */
    uint64_t reconnects;       /* endpoints replaced after a fence */
};

/** Status of one peer of an rdma instance. KVP_ERR_INVALID for NULL arguments. */
int kvp_xport_rdma_peer_status(struct kvp_xport *t, struct kvp_xport_peer *peer,
                               struct kvp_xport_rdma_peer_status *out);

/** The core under an rdma instance (tests, stats). */
struct kvp_rdma_xport *kvp_xport_rdma_core(struct kvp_xport *t);

#endif
