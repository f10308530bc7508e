/*
 * devstage.h — GPU device memory in put and get: staged through pinned host bounce buffers over
 * the TCP data plane (docs/gpu.md). Internal to the client library.
 *
 * One kvp_devstage per client (the transfer side): per device, up to DEVSTAGE_MAX_LANES lanes,
 * each one stream of its own in the device's primary context, two events and two pinned bounce
 * buffers of `window` bytes. A batch with device slices takes one lane per device it touches
 * for the whole call and runs its slices in rounds of `window` bytes:
 *   put: the device-to-host copy of round k+1 runs while round k is on the wire (and its XXH3 is
 *        computed on the bounce buffer meanwhile);
 *   get: round k+1 is received while the host-to-device copy of round k runs.
 * Fencing (contract C2): kvp_devstage_run returns only when every copy it enqueued has completed
 * (the lane's stream is synchronised on every path). A round cut short (timeout, close) stops the
 * pipeline: copies not yet enqueued never are, enqueued ones are waited for.
 */
#ifndef KVP_CLIENT_DEVSTAGE_H
#define KVP_CLIENT_DEVSTAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "actors/transfer/transfer.h"

#define DEVSTAGE_DEFAULT_WINDOW (4ull << 20)
#define DEVSTAGE_MAX_LANES 4
#define DEVSTAGE_MAX_DEVICES 16

struct kvp_devstage;

/* The transport a staged batch runs its rounds on (kvp_xfer_run_overlap by default; tests put
 * a model of the network here). */
typedef int (*kvp_devstage_xfer_fn)(void *ctx, struct kvp_xfer_slice *slices, size_t n, uint32_t timeout_ms,
                                    void (*overlap)(void *arg), void *arg);

struct kvp_rt_actor;
struct kvp_rt_ctx;
struct kvp_rt_msg;

/* The lane pool's messages (requests to its owner, which passes them to kvp_devstage_handle). */
enum { DS_TAKE = 0x4400, DS_GIVE, DS_FREE };
#define KVP_DEVSTAGE_MSG_FIRST DS_TAKE
#define KVP_DEVSTAGE_MSG_LAST DS_FREE

/**
 * New staging state for one engine; window 0 = DEVSTAGE_DEFAULT_WINDOW. The lane pool is owned
 * by `owner` (the client actor): its handler passes every message of type
 * KVP_DEVSTAGE_MSG_FIRST..LAST to kvp_devstage_handle. kvp_devstage_new has no owner: it runs the
 * pool in an actor of its own ("devstage"). Errors: KVP_ERR_NOMEM, kvp_rt_spawn's.
 */
int kvp_devstage_new_owned(struct kvp_devstage **out, struct kvp_xfer_engine *e, uint64_t window,
                           struct kvp_rt_actor *owner);
int kvp_devstage_new(struct kvp_devstage **out, struct kvp_xfer_engine *e, uint64_t window);
/** The owner's handler for a DS_* message (on the owner's thread). Always KVP_OK. */
int kvp_devstage_handle(struct kvp_devstage *ds, struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m);

/** Free every lane (streams, events, pinned buffers, on the owner's thread: the owner must still
 * run); no batch may run. Accepts NULL. */
void kvp_devstage_destroy(struct kvp_devstage **ds);

/** Replace the transport (tests). */
void kvp_devstage_set_transport(struct kvp_devstage *ds, kvp_devstage_xfer_fn fn, void *ctx);

/**
 * Make sure `ordinal` has a lane (its bounce buffers pinned): kvp_register_buffer on device
 * memory calls it so the first put does not pay for it. KVP_ERR_DEVICE (logged).
 */
int kvp_devstage_pin(struct kvp_devstage *ds, int ordinal);

/** One batch: the slices of kvp_xfer_run, and which of them are staged. */
struct kvp_devstage_batch {
    struct kvp_xfer_slice *slices; /* all WRITE (put) or all READ (get) */
    size_t n;
    const size_t *group;           /* per slice: its item (put) or slot (get), < n_groups */
    const uint8_t *feed;           /* per slice: 1 = its bytes feed the group's checksum (NULL: all) */
    const int *group_dev;          /* per group: device ordinal whose lane stages it, -1 = not staged */
    size_t n_groups;
    uint64_t *sum;                 /* out, per staged group: XXH3-64 of its fed bytes in slice order */
    uint32_t timeout_ms;           /* 0 = none */
    void (*overlap)(void *arg);    /* as kvp_xfer_run_overlap (run once, with the first round) */
    void *arg;
};

/**
 * Run a batch: slices of unstaged groups go to the transport as they are; slices of staged groups
 * go through a lane's bounce buffers (device pieces by the driver's async copies, host pieces of
 * the same item by memcpy). Per-slice status as kvp_xfer_run, plus KVP_ERR_DEVICE for every
 * slice of a group whose copy failed (logged with the driver's error). A batch with no staged
 * group is exactly kvp_xfer_run_overlap. Returns when no copy and no transfer of the batch can
 * touch caller memory any more.
 */
int kvp_devstage_run(struct kvp_devstage *ds, struct kvp_devstage_batch *b);

struct kvp_devstage_stats {
    uint64_t registered_bytes; /* device memory registered (kvp_register_buffer), process-wide */
    uint64_t bounce_bytes;     /* pinned bounce memory held by this client's lanes */
    uint32_t lanes;            /* lanes created */
    uint32_t lanes_busy;       /* lanes in use by a batch now */
    uint64_t staged_batches;   /* batches that staged device memory */
    uint64_t staged_bytes;     /* bytes copied between device and bounce buffers */
    uint64_t copies;           /* driver copies enqueued */
    uint64_t copy_errors;      /* copies (or their stream) that failed: their keys got KVP_ERR_DEVICE */
};

void kvp_devstage_stats(struct kvp_devstage *ds, struct kvp_devstage_stats *out);

#endif
