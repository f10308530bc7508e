/*
 * segment.h — one contributed segment: its memory region (mmap, MAP_HUGETLB when available,
 * falling back cleanly), its data-plane server, its mount at the master and its heartbeat.
 * Used by the kvpool-segment daemon and by clients that contribute memory (embedded mode).
 *
 * Lifecycle: start (allocate, listen, mount: synchronous) → heartbeat thread (a heartbeat
 * answered NOT_FOUND means the master declared the segment lost: it remounts as a NEW segment,
 * its memory considered empty, and reports the new id through on_mount) → stop (unmount,
 * stop the server, unmap).
 */
#ifndef KVP_SEGMENT_H
#define KVP_SEGMENT_H

#include <stdbool.h>
#include <stdint.h>

#include "actors/session/msession.h"
#include "actors/segment/seg_server.h"
#include "config/config.h"

struct kvp_segment;

struct kvp_segment_hooks {
    void *ctx;
    /* Called (from the segment's thread) whenever the segment gets an id: old_id 0 at the
     * first mount. The client uses it to register the region with its local transport.
     * It is also called with new_id 0 (base NULL, size 0) when the segment stops or a remount
     * fails, before the region is unmapped: the owner must stop using the old id's memory. */
    void (*on_mount)(void *ctx, uint32_t old_id, uint32_t new_id, void *base, uint64_t size);
    /* kvpool-segment: when no master answers the first mount (none started yet, no leader),
     * keep trying, with backoff from 1 s to 10 s and one WARN line per try, instead of failing
     * with KVP_ERR_UNAVAILABLE after 10 s. start then blocks until a master answers: the
     * caller ends the wait by exiting (the daemon does on SIGINT/SIGTERM). */
    bool mount_retry;
    /* Data-plane tokens (docs/security.md "Data plane: tokens"): the masters' token keys
     * (kvp_auth_client_token_keys; auth on). n_token_keys > 0: the data port admits only
     * connections with a token, and the mover presents tokens to other segments. */
    uint8_t token_keys[16][32];
    size_t n_token_keys;
};

/**
 * Start a segment per cfg (global_segment_size, local_hostname, port, name, heartbeat_ms).
 * `ms` is borrowed and must outlive the segment. Blocks until mounted or the mount fails.
 * Errors: KVP_ERR_NOMEM (region), KVP_ERR_IO (listen), KVP_ERR_UNAVAILABLE (no master),
 * KVP_ERR_INVALID.
 */
int kvp_segment_start(struct kvp_segment **out, const struct kvp_cfg_segment *cfg,
                      struct kvp_msession *ms, const struct kvp_segment_hooks *hooks);
uint32_t kvp_segment_id(const struct kvp_segment *s);
const char *kvp_segment_name(const struct kvp_segment *s);
const char *kvp_segment_endpoint(const struct kvp_segment *s);

/** Counters of a running segment, for the metrics endpoint (docs/operations.md "Metrics"). */
struct kvp_segment_stats {
    uint32_t segment_id;      /* 0 = not mounted (a remount failed) */
    uint64_t size_bytes;
    uint64_t mounts;          /* successful mounts: 1 + remounts after being declared lost */
    uint64_t mount_failures;  /* mount tries that failed (no master, refused) */
    struct kvp_seg_server_stats server;
};

/** Fill *out. Any thread, while the segment is not being stopped (relaxed reads of counters
 * their writers publish; the data plane's sum takes its connection list's lock). */
void kvp_segment_stats(struct kvp_segment *s, struct kvp_segment_stats *out);

/**
 * Ask the master to drain this segment (DrainSegment) and wait until the master reports no
 * replica left on it or timeout_ms passes. Then stop. (Migration itself is issue 7.)
 */
int kvp_segment_drain(struct kvp_segment *s, uint32_t timeout_ms);

/**
 * kvp_segment_drain() that also reports, in *left (may be NULL), the replicas the master still
 * counted on this segment at the last poll (0 when drained; -1 when the drain request itself
 * failed, so that nothing was counted). With stop_when_alone it returns
 * KVP_ERR_NO_SPACE at once when no other segment is ACTIVE (nothing could move) instead of
 * waiting out timeout_ms. Other errors as kvp_segment_drain() (KVP_ERR_TIMEOUT, KVP_ERR_CLOSED,
 * the drain request's error). Blocks; one caller at a time.
 */
int kvp_segment_drain_left(struct kvp_segment *s, uint32_t timeout_ms, bool stop_when_alone, int64_t *left);

/** Unmount, stop serving, unmap, free. Accepts NULL; sets *s NULL. */
void kvp_segment_stop(struct kvp_segment **s);

#endif
