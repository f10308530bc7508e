/*
 * client_state.h — all mutable state of an open client (struct kvp_client of include/kvpool.h).
 *
 * Thread-safety: the session (msession) and the transfer engine are actors of their own; the
 * state the API calls share (registered buffers, avoid list, read witnesses, close's wait) is
 * owned by the client actor (client_actor.c) and reached by message. The fields here are set at
 * open and read-only afterwards, except the atomics, each with its reason. Atomics use
 * sequentially consistent order unless marked: they are read once per call, not on a hot
 * per-byte path, so the simplest order is chosen.
 */
#ifndef KVP_CLIENT_STATE_H
#define KVP_CLIENT_STATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "actors/session/msession.h"
#include "actors/segment/segment.h"
#include "actors/transfer/transfer.h"
#include "config/config.h"

/** One range registered with kvp_register_buffer() (kept by the client actor). */
struct kvp_client_buf {
    uintptr_t addr; /* first byte */
    size_t len;     /* bytes, >= 1 */
};

struct kvp_client_metrics;
#define KVP_CLIENT_AVOID_MAX 16
#define KVP_CLIENT_AVOID_MS 5000u /* how long a reported segment's replicas are tried last */
#define KVP_CLIENT_READ_WITNESS_MS 1000u /* an older successful read is no witness */

/* What a call copies out of the client actor (client_actor.c): the avoid list (segments this
 * client could not reach lately: gets try their replicas last and PutStart asks to place on them
 * last until `until_ms`, issue 18 item 2: the master may still hear them, so their replicas stay
 * listed) and the read witnesses taken for the next GetReplicaList (segments read from
 * successfully within KVP_CLIENT_READ_WITNESS_MS, issue 18 rule 5: a read-only fleet is the only
 * witness that a segment the master cannot hear lives). */
struct kvp_client_view {
    struct { uint32_t segment_id; uint64_t until_ms; } avoid[KVP_CLIENT_AVOID_MAX];
    size_t n_avoid;
    uint32_t read_ok[KVP_CLIENT_AVOID_MAX];
    size_t n_read_ok;
};

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
    /* per-put counter for op ids: an atomic, since every put of any thread takes one and a
     * message to the client actor for a number would add a hop to every put */
    atomic_uint_fast64_t op_counter;
    /* embedded segment id registered with the local transport; 0 = none. Written by the segment's
     * mount hook (on the segment's own thread), read once per get to order replicas: an atomic,
     * since the hook must not wait on a reply and a get would pay a hop to ask for one number */
    atomic_uint local_seg_id;

    /* The client actor (client_actor.c): owns the registered buffers, the avoid list and the read
     * witnesses, and closes the client's lifecycle; reached by message. */
    struct kvp_rt_actor *actor;
    /* Bit 63: kvp_client_close started (new calls get KVP_ERR_CLOSED); low bits: API calls
     * inside. An atomic rather than a message: every call enters and leaves through it, and a
     * round trip to the client actor there would add two hops to every call (client_actor.c). */
    atomic_uint_fast64_t life;
    /* Hints the client actor publishes so calls skip a request that would return nothing (a
     * stale value costs one request or a witness named one call later; client_actor.c):
     * the latest end (ms) of an avoid entry, and whether read witnesses wait to be taken. */
    atomic_uint_fast64_t avoid_until_hint;
    atomic_bool read_ok_hint;
    struct kvp_client_metrics *metrics; /* client_metrics.c; NULL when metrics_port is 0 */
};

#endif
