/*
 * client_state.h — all mutable state of an open client (struct kvp_client of include/kvpool.h).
 *
 * Thread-safety: the session (msession) and the transfer engine are thread-safe on their own;
 * `mu` guards only the lifecycle fields (closed, inflight) and the registered-buffer table.
 * Atomics use sequentially consistent order (the default): they are read once per call, not on
 * a hot per-byte path, so the simplest order is chosen.
 */
#ifndef KVP_CLIENT_STATE_H
#define KVP_CLIENT_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "actors/session/msession.h"
#include "actors/segment/segment.h"
#include "actors/transfer/transfer.h"
#include "config/config.h"

/** One range registered with kvp_register_buffer(). */
struct kvp_client_buf {
    uintptr_t addr; /* first byte */
    size_t len;     /* bytes, >= 1 */
};

struct kvp_client_metrics;
#define KVP_CLIENT_AVOID_MAX 16
#define KVP_CLIENT_AVOID_MS 5000u /* how long a reported segment's replicas are tried last */
#define KVP_CLIENT_READ_WITNESS_MS 1000u /* an older successful read is no witness */

struct kvp_client {
    char name[64];                  /* "client-<pid>" for log lines */
    char transport[8];              /* the data-plane transport in use ("tcp" or "rdma"; metrics label) */
    /* protocol=rdma with a usable device: the options of the engine's rdma transport (read by
     * the transfer actors for the engine's lifetime; opaque here: actors/transfer/rdma/xport_rdma.h) */
    void *rdma_opts;
    struct kvp_cfg_client cfg;      /* copy of the caller's config */
    struct kvp_msession *ms;        /* session with the master quorum (owned) */
    struct kvp_xfer_engine *xfer;   /* transfer engine (owned) */
    struct kvp_dtoken *dtok;        /* data-plane tokens (owned; NULL: auth none or no token keys) */
    uint8_t token_keys[16][32];     /* the masters' token keys: an embedded segment requires tokens */
    size_t n_token_keys;
    struct kvp_devstage *devstage;  /* GPU staging lanes of this transfer side (owned; devstage.h) */
    struct kvp_segment *seg;        /* embedded segment, NULL when global_segment_size == 0 (owned) */
    uint64_t client_id;             /* random; op ids are client_id ^ counter */
    atomic_uint_fast64_t op_counter;/* per-put counter for op ids */
    atomic_uint local_seg_id;       /* embedded segment id registered with the local transport; 0 = none */

    /* mu guards closed, inflight, bufs, avoid. A lock rather than a message: the API calls run on
     * the application's own threads (the client is a library, not an actor), every call enters
     * and leaves through closed/inflight and looks up bufs on its data path, and close must wait
     * (idle_cv) until the calls already inside have left; a message round trip to an owner
     * thread per call would add a hop to every get and put without removing that wait. */
    pthread_mutex_t mu;
    pthread_cond_t idle_cv;         /* signalled when inflight drops to 0 */
    bool closed;                    /* kvp_client_close started: new calls get KVP_ERR_CLOSED */
    uint32_t inflight;              /* API calls running */
    struct kvp_client_buf *bufs;    /* registered buffers (unsorted) */
    size_t n_bufs, cap_bufs;
    struct kvp_client_metrics *metrics; /* client_metrics.c; NULL when metrics_port is 0 */
    /* Segments this client could not reach lately (it reported them unreachable): gets try their
     * replicas last and PutStart asks to place on them last until `until_ms` (issue 18 item 2:
     * the master may still hear them, so their replicas stay listed). Under mu: every caller thread reads it when ordering replicas; the
     * client is a library called from the caller's threads, not an actor with a mailbox. */
    struct { uint32_t segment_id; uint64_t until_ms; } avoid[KVP_CLIENT_AVOID_MAX];
    /* Segments this client read from successfully, not yet named to the master: the next
     * GetReplicaList carries those read within KVP_CLIENT_READ_WITNESS_MS (issue 18 rule 5: a
     * read-only fleet is the only witness that a segment the master cannot hear lives). Under
     * mu, for the same reason as avoid. */
    struct { uint32_t segment_id; uint64_t at_ms; } read_ok[KVP_CLIENT_AVOID_MAX];
};

#endif
