/*
 * kvpool.h — the public C API of kvpool, a distributed KV-cache store for LLM inference.
 *
 * An inference server embeds the client (libkvpool) to save the attention KV cache of token
 * blocks into a pool of memory spread over many hosts and to load it back instead of
 * recomputing the prefill. See docs/ and DESIGN.md for the architecture and contract C1–C6.
 *
 * Conventions, for every function below:
 *  - Sizes are bytes; timeouts are milliseconds, 0 meaning the configured default
 *    (`transfer_timeout`).
 *  - Keys are NUL-terminated strings of 1..KVP_MAX_KEY_BYTES bytes (not counting the NUL).
 *  - Buffers stay the caller's. kvpool reads or writes them only while the call that was given
 *    them runs: when any call returns, success or error, nothing in kvpool touches them again
 *    (contract C2).
 *  - Every function is safe to call from many threads at once on one client.
 *  - Errors are negative `kvp_err` values; kvp_strerror() names them.
 */
#ifndef KVPOOL_H
#define KVPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Longest key, in bytes, not counting the terminating NUL. */
#define KVP_MAX_KEY_BYTES 512

/**
 * Error codes. All negative; values never change (they cross the wire).
 * KVP_OK is 0. Codes below -100 are internal and not normally returned by the public API.
 *
 * KVP_ERR_LIST is the one list of the codes: X(NAME, value, "description") per code, in value
 * order. It generates enum kvp_err below and the table behind kvp_errname() / kvp_strerror()
 * (runtime/err.c); a new code is one line here. The description is kvp_strerror()'s text; the
 * comment after each line says when the code is returned.
 */
#define KVP_ERR_LIST(X) \
    X(KVP_OK, 0, "success") /* the call did what it says */ \
    X(KVP_ERR_NOT_FOUND, -1, "no such object") /* no complete object under that key */ \
    X(KVP_ERR_EXISTS, -2, "object already exists") /* put of a key that exists (complete or being written) */ \
    X(KVP_ERR_NO_SPACE, -3, "no space left in the pool") /* the pool cannot hold the object */ \
    X(KVP_ERR_TIMEOUT, -4, "timed out (outstanding transfers were fenced)") /* the call gave up at its timeout; every slice was fenced first */ \
    X(KVP_ERR_TRANSFER, -5, "data transfer failed") /* a data transfer failed (peer gone, connection error) */ \
    X(KVP_ERR_CORRUPT, -6, "checksum mismatch") /* checksum mismatch: bytes were not returned */ \
    X(KVP_ERR_LEASE_EXPIRED, -7, "read lease expired before the transfer finished") /* the read lease ran out before the transfer finished */ \
    X(KVP_ERR_UNAVAILABLE, -8, "no master quorum available") /* no master quorum / no leader reachable */ \
    X(KVP_ERR_INVALID, -9, "invalid argument") /* bad argument or bad config value */ \
    X(KVP_ERR_TOO_LARGE, -10, "object too large") /* object larger than any segment / than allowed */ \
    X(KVP_ERR_BUFFER_TOO_SMALL, -11, "buffer too small for the object") /* the caller's buffer is smaller than the object */ \
    X(KVP_ERR_CLOSED, -12, "closed") /* the client (or actor) was closed */ \
    X(KVP_ERR_NOMEM, -13, "out of memory") /* local memory allocation failed */ \
    X(KVP_ERR_MALFORMED, -14, "malformed message") /* a message failed to decode (truncated, oversized, bad magic) */ \
    X(KVP_ERR_VERSION, -15, "unsupported wire version") /* unknown wire version */ \
    X(KVP_ERR_NOT_LEADER, -16, "not the leader") /* this master is not the Raft leader (reply carries a hint) */ \
    X(KVP_ERR_LEASED, -17, "object is under a read lease") /* refused: the object is under a read lease (use force) */ \
    X(KVP_ERR_BUSY, -18, "busy (object being written or operation in progress)") /* the object is being written, or the operation is in progress */ \
    X(KVP_ERR_IO, -19, "I/O error") /* local I/O error (file, socket set-up) */ \
    X(KVP_ERR_INTERNAL, -20, "internal error") /* an internal invariant failed; logged */ \
    X(KVP_ERR_FENCE_FAILED, -21, "outstanding transfers could not be fenced") /* slices could not be fenced within the bound (wedged transport) */ \
    X(KVP_ERR_CANCELLED, -22, "cancelled") /* the operation was cancelled */ \
    X(KVP_ERR_UNSUPPORTED, -23, "not supported here") /* feature not available here (e.g. no RDMA device) */ \
    X(KVP_ERR_PINNED, -24, "object is soft-pinned") /* refused: the object is soft-pinned */ \
    X(KVP_ERR_DEVICE, -25, "GPU copy failed (CUDA driver error)") /* the CUDA driver failed a copy of GPU memory (or its context is poisoned) */ \
    X(KVP_ERR_DENIED, -26, "refused: not authenticated or not authorised") /* refused: not authenticated, or not authorised for it (tenant, role) */

#define KVP_ERR_ENUM_ITEM_(name, value, text) name = value,
#define KVP_ERR_COUNT_ITEM_(name, value, text) +1
typedef enum kvp_err {
    KVP_ERR_LIST(KVP_ERR_ENUM_ITEM_)
    /* One past the last code (-27): the list's length, negated. */
    KVP_ERR__LAST = -(0 KVP_ERR_LIST(KVP_ERR_COUNT_ITEM_))
} kvp_err;
#undef KVP_ERR_ENUM_ITEM_
#undef KVP_ERR_COUNT_ITEM_

typedef struct kvp_config kvp_config; /* opaque */
typedef struct kvp_client kvp_client; /* opaque */

/** Options of a put. Pass NULL for all defaults. */
typedef struct kvp_put_opts {
    uint32_t replica_num;          /* replicas on distinct segments; 0 = config `replica_num` */
    bool soft_pin;                 /* survive ordinary eviction */
    const char *preferred_segment; /* segment name to place the first replica on; NULL = none */
    uint32_t timeout_ms;           /* 0 = config `transfer_timeout` */
} kvp_put_opts;

/** One piece of a scatter-gather object: `len` bytes at `base`. */
typedef struct kvp_iov {
    void *base;
    size_t len;
} kvp_iov;

/**
 * Create a config holding the defaults. On success *out owns a new config that the caller
 * frees with kvp_config_destroy(). Errors: KVP_ERR_INVALID (out NULL), KVP_ERR_NOMEM.
 */
int kvp_config_new(kvp_config **out);

/**
 * Set one key (Mooncake's names where one exists: local_hostname, master_server_address,
 * global_segment_size, local_buffer_size, protocol, device_name, replica_num,
 * transfer_timeout, default_kv_lease_ttl, eviction_ratio, eviction_high_watermark_ratio,
 * client_ttl, tenant_id; plus cluster_file and kvpool's own keys listed in docs/config.md, e.g.
 * drain_timeout_ms). protocol "rdma" is accepted and runs on TCP (a WARN at open) until the
 * RDMA transport exists.
 * Sizes accept suffixes (4G, 512MiB). Errors: KVP_ERR_INVALID with a log line naming the key,
 * the value and what is allowed; the config is unchanged then.
 */
int kvp_config_set(kvp_config *cfg, const char *key, const char *value);

/** Load a JSON object of key → value (string, number or bool). Errors: KVP_ERR_IO, KVP_ERR_INVALID. */
int kvp_config_load_file(kvp_config *cfg, const char *path);

/**
 * Apply every KVPOOL_<KEY> environment variable that names a client key (e.g.
 * KVPOOL_MASTER_SERVER_ADDRESS, KVPOOL_REPLICA_NUM). Not done implicitly, so that an embedding
 * program decides the order: the usual one is defaults < file < environment < its own sets.
 * Errors: KVP_ERR_INVALID (a bad value; logged, the config is unchanged).
 */
int kvp_config_load_env(kvp_config *cfg);

/** Free a config; accepts NULL and *cfg == NULL; sets *cfg to NULL. */
void kvp_config_destroy(kvp_config **cfg);

/**
 * Open a client: connect to the master quorum (master_server_address or cluster_file) and, if
 * global_segment_size > 0, contribute a segment of that size from this process (embedded mode).
 * The config is copied; the caller keeps ownership of cfg. Blocks until the client has
 * reached a leader or the timeout passes. Errors: KVP_ERR_INVALID, KVP_ERR_UNAVAILABLE,
 * KVP_ERR_NOMEM, KVP_ERR_IO.
 */
int kvp_client_open(const kvp_config *cfg, kvp_client **out);

/**
 * Close a client. Calls in flight on other threads return KVP_ERR_CLOSED; this returns only
 * once nothing in kvpool can touch caller memory again. Accepts NULL; sets *client to NULL.
 */
void kvp_client_close(kvp_client **client);

/**
 * Store `len` bytes at `buf` under `key`, with opts->replica_num replicas.
 * Returns KVP_OK, or KVP_ERR_EXISTS (nothing written), KVP_ERR_INVALID (len 0, bad key),
 * KVP_ERR_NO_SPACE, KVP_ERR_TOO_LARGE, KVP_ERR_TIMEOUT, KVP_ERR_TRANSFER, KVP_ERR_UNAVAILABLE,
 * KVP_ERR_CLOSED. On error no object is visible under the key from this call.
 */
int kvp_put(kvp_client *c, const char *key, const void *buf, size_t len, const kvp_put_opts *opts);

/**
 * Read the object under `key` into `buf` (capacity `cap` bytes). Returns the object's size in
 * bytes (>= 1), or: KVP_ERR_NOT_FOUND, KVP_ERR_BUFFER_TOO_SMALL (nothing written; the needed
 * size is kvp_get_size()), KVP_ERR_CORRUPT, KVP_ERR_TIMEOUT, KVP_ERR_TRANSFER (every replica
 * failed), KVP_ERR_LEASE_EXPIRED, KVP_ERR_UNAVAILABLE, KVP_ERR_INVALID, KVP_ERR_CLOSED.
 */
int64_t kvp_get(kvp_client *c, const char *key, void *buf, size_t cap, uint32_t timeout_ms);

/**
 * Store n objects: keys[i] ← lens[i] bytes at bufs[i]. results[i] gets the per-key code as
 * for kvp_put. Returns KVP_OK when the call ran (read results[]), or a negative code when it
 * could not run at all (bad arguments, closed client).
 */
int kvp_batch_put(kvp_client *c, size_t n, const char *const keys[], const void *const bufs[],
                  const size_t lens[], const kvp_put_opts *opts, int results[]);

/**
 * Read n objects: keys[i] into bufs[i] of capacity caps[i]. results[i] gets the size read or a
 * negative code as for kvp_get. The same key may appear more than once: each slot is filled.
 * The n buffers must not overlap one another (as for memcpy); a slot whose buffer overlaps
 * another's may end in KVP_ERR_CORRUPT. Returns KVP_OK when the call ran, or a negative code
 * when it could not run at all.
 */
int kvp_batch_get(kvp_client *c, size_t n, const char *const keys[], void *const bufs[],
                  const size_t caps[], uint32_t timeout_ms, int64_t results[]);

/**
 * Scatter-gather put: object i is the concatenation of iovs[i][0..iovcnt[i]-1].
 * Results and return as for kvp_batch_put.
 */
int kvp_batch_put_iov(kvp_client *c, size_t n, const char *const keys[], const kvp_iov *const iovs[],
                      const size_t iovcnt[], const kvp_put_opts *opts, int results[]);

/**
 * Scatter-gather get: object i is scattered into iovs[i][0..iovcnt[i]-1] in order; the pieces'
 * lengths must add up to at least the object's size (else KVP_ERR_BUFFER_TOO_SMALL for that key).
 * Results and return as for kvp_batch_get.
 */
int kvp_batch_get_iov(kvp_client *c, size_t n, const char *const keys[], const kvp_iov *const iovs[],
                      const size_t iovcnt[], uint32_t timeout_ms, int64_t results[]);

/** 1 if a complete object exists under key, 0 if not, or a negative code. */
int kvp_exists(kvp_client *c, const char *key);

/** results[i] = 1, 0 or a negative code for keys[i]. Returns KVP_OK or a negative code. */
int kvp_batch_exists(kvp_client *c, size_t n, const char *const keys[], int results[]);

/**
 * Remove the object under key. A leased object is refused with KVP_ERR_LEASED unless force;
 * forced or not, its space is quarantined, never reused while a reader may read it.
 * Errors: KVP_ERR_NOT_FOUND, KVP_ERR_LEASED, KVP_ERR_UNAVAILABLE, KVP_ERR_INVALID.
 */
int kvp_remove(kvp_client *c, const char *key, bool force);

/** Size in bytes of the complete object under key, or a negative code (KVP_ERR_NOT_FOUND, ...). */
int64_t kvp_get_size(kvp_client *c, const char *key);

/**
 * Register [addr, addr+len) as a buffer the caller will pass to put/get (for RDMA memory
 * registration; on TCP only validated, except for GPU device memory: its range is cached and
 * its device's bounce buffers pinned, see "GPU (device) memory" below). The caller keeps
 * ownership.
 * Errors: KVP_ERR_INVALID (NULL, 0 length, overlaps a registered buffer).
 */
int kvp_register_buffer(kvp_client *c, void *addr, size_t len);

/** Undo kvp_register_buffer. Errors: KVP_ERR_NOT_FOUND when addr was not registered. */
int kvp_unregister_buffer(kvp_client *c, void *addr);

/** A static English description of an error code ("unknown error" for unknown codes). */
const char *kvp_strerror(int err);

/** The code's symbolic name, e.g. "KVP_ERR_NOT_FOUND" (static string). */
const char *kvp_errname(int err);

/* ------------------------------------------------------------------------------------------
 * Calls added for language bindings (the Python module, docs/python.md). Same conventions.
 * ------------------------------------------------------------------------------------------ */

/**
 * Remove every complete object of the pool (kvpoolctl's and Mooncake's remove_all). Without
 * force, the whole call is refused with KVP_ERR_LEASED while any object is under a read lease
 * (or the leader is in its election grace); with force leased objects are removed too (their
 * space is quarantined, never reused while a reader may read it). Objects being written stay.
 * *removed (may be NULL) gets how many objects were removed. Blocks for one master RPC.
 * Errors: KVP_ERR_LEASED, KVP_ERR_INVALID (c NULL), KVP_ERR_UNAVAILABLE, KVP_ERR_TIMEOUT,
 * KVP_ERR_CLOSED.
 */
int kvp_remove_all(kvp_client *c, bool force, uint64_t *removed);

/**
 * Sizes of n objects: sizes[i] gets the size in bytes of the complete object under keys[i]
 * (>= 1), or a negative code (KVP_ERR_NOT_FOUND; KVP_ERR_INVALID for a bad key, that slot only;
 * the RPC's error for every slot when the master could not answer). One GetSize RPC per 8,192
 * keys; no lease is taken, so a size is a hint for sizing a buffer, not a promise. Returns KVP_OK
 * when the call ran, or a negative code when it could not run at all (NULL arrays, closed).
 */
int kvp_batch_get_size(kvp_client *c, size_t n, const char *const keys[], int64_t sizes[]);

/**
 * Read the object under key into a buffer this call allocates with malloc(): on success *out
 * owns it (the caller frees it with free()) and the return is its size in bytes (>= 1). On error
 * *out is NULL and the return is a negative code as for kvp_get() (KVP_ERR_NOT_FOUND, ...;
 * KVP_ERR_BUSY when the key was replaced by a larger object four times while it ran). Two RPCs
 * (GetSize, then the get's GetReplicaList).
 */
int64_t kvp_get_alloc(kvp_client *c, const char *key, void **out, uint32_t timeout_ms);

/**
 * Replica counts of n objects: results[i] gets the number of complete replicas of keys[i]
 * (>= 1), or a negative code (KVP_ERR_NOT_FOUND, KVP_ERR_INVALID for a bad key). Asks the master
 * for the replica lists, which grants a read lease on each object found (default 5 s: a remove
 * without force is refused meanwhile). Returns KVP_OK when the call ran, else a negative code.
 */
int kvp_batch_replica_count(kvp_client *c, size_t n, const char *const keys[], int results[]);

/**
 * The name of the segment this client contributes (global_segment_size > 0), as the master and
 * `kvpoolctl status` list it and as kvp_put_opts.preferred_segment takes it; written
 * NUL-terminated into buf (cap bytes). Errors: KVP_ERR_NOT_FOUND (no embedded segment; buf ""),
 * KVP_ERR_BUFFER_TOO_SMALL (cap too small; buf ""), KVP_ERR_INVALID (NULL argument, cap 0).
 * Does not block.
 */
int kvp_client_segment_name(kvp_client *c, char *buf, size_t cap);

/**
 * The data-plane endpoint "host:port" of the segment this client contributes (the address its
 * TCP server listens on; port chosen at open). Same contract and errors as
 * kvp_client_segment_name().
 */
int kvp_client_segment_endpoint(kvp_client *c, char *buf, size_t cap);

/**
 * kvp_register_buffer() that accepts a range overlapping or nested in ranges already
 * registered (Mooncake allows it: a small buffer registered inside a larger one). Each call is
 * one registration; kvp_unregister_buffer(addr) removes the latest registration starting at
 * addr. The caller keeps ownership of the memory. Errors: KVP_ERR_INVALID (NULL, 0 length,
 * wrapping range), KVP_ERR_NOMEM, KVP_ERR_CLOSED.
 */
int kvp_register_buffer_overlap(kvp_client *c, void *addr, size_t len);

/**
 * Drain this client's embedded segment before closing it: the master marks it draining (no new
 * replicas go there, readers move to other copies) and its objects are copied to other segments;
 * this waits until none is left, at most timeout_ms (0 = config `drain_timeout_ms`, default
 * 30 s; a configured 0 means no drain: KVP_ERR_TIMEOUT at once). *left (may be NULL) gets the
 * replicas still on the segment at the end: the objects whose only copy they are are dropped by
 * kvp_client_close(). When the master does not take the drain request (KVP_ERR_UNAVAILABLE,
 * KVP_ERR_TIMEOUT) nothing was counted: *left is 0 and the log line says the number is unknown. Returns KVP_OK (drained, or no embedded segment), KVP_ERR_TIMEOUT,
 * KVP_ERR_NO_SPACE (no other segment is ACTIVE: nothing can move; returns at once),
 * KVP_ERR_UNAVAILABLE, KVP_ERR_CLOSED, KVP_ERR_INVALID. Logs the outcome (one line). Blocks;
 * other calls keep working meanwhile; kvp_client_close() keeps its meaning (no drain).
 */
int kvp_client_drain(kvp_client *c, uint32_t timeout_ms, uint64_t *left);

/* ------------------------------------------------------------------------------------------
 * GPU (device) memory (docs/gpu.md).
 *
 * Every put and get call (and kvp_register_buffer) takes CUDA device pointers as well as host
 * pointers: with a CUDA driver present (libcuda.so.1, loaded at run time), device pieces are
 * copied through pinned host bounce buffers on kvpool's own streams, in the device's primary
 * context, pipelined with the TCP transfer. Register a whole device allocation once
 * (kvp_register_buffer) to skip the per-piece driver query and pin the bounce buffers early.
 * One object's device pieces must be on one device.
 *
 * Ordering with the caller's streams: kvpool does not synchronise the caller's compute stream.
 *  - put: the device memory must already hold the bytes when the call is made (the caller
 *    synchronises its stream or event first, as vLLM does); kvpool's copies may read it at any
 *    time until the call returns, and never after.
 *  - get: when the call returns a byte count for a key, that key's bytes are in device memory
 *    (kvpool's copies completed); the caller's kernels may read them at once. On any return,
 *    OK or not, no copy of the call runs any more (C2): a timed-out get never writes the device
 *    buffer after it returned.
 * A failed device copy (or a poisoned CUDA context) fails its key with KVP_ERR_DEVICE and a log
 * line naming the driver error; host keys of the same call are not affected.
 * ------------------------------------------------------------------------------------------ */

/** GPU staging counters of one client. */
typedef struct kvp_device_stats {
    bool driver_loaded;        /* a CUDA driver was found and initialised */
    uint64_t registered_bytes; /* device memory registered with kvp_register_buffer (process-wide) */
    uint64_t bounce_bytes;     /* pinned bounce memory this client holds */
    uint32_t lanes;            /* staging lanes (stream + 2 bounce buffers) created */
    uint32_t lanes_busy;       /* lanes in use by a call now */
    uint64_t staged_batches;   /* transfer batches that staged device memory */
    uint64_t staged_bytes;     /* bytes copied between device memory and bounce buffers */
    uint64_t copies;           /* driver copies enqueued */
    uint64_t copy_errors;      /* failed copies (their keys got KVP_ERR_DEVICE) */
} kvp_device_stats;

/**
 * 1 when addr is CUDA device memory (kvpool stages it), 0 when host memory (also: no CUDA
 * driver), KVP_ERR_DEVICE when the driver failed to say (logged). Any thread.
 */
int kvp_device_pointer(const void *addr);

/** Fill *out with c's GPU staging counters. Errors: KVP_ERR_INVALID. */
int kvp_client_device_stats(kvp_client *c, kvp_device_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* KVPOOL_H */
