/*
 * segment_state.h — the state of one contributed segment (segment.c) and the actors that run for
 * it, all children of its supervisor (runtime/supervisor.h, named "seg <name>"):
 *
 *  - "heartbeat" (seg_heartbeat.c): heartbeats, the stall fence, remounts after the master
 *    declared the segment lost, the daemon's drain signal;
 *  - "mover" (mover.c): drain/repair copies from this segment;
 *  - "prefault" (seg_prefault.c): populates the region in the background (segment_prefault).
 *
 * The first mount, drain and unmount run on the caller of kvp_segment_start / drain / stop (they
 * are blocking calls of the segment's API). The fields below are written before the children
 * start and read-only afterwards, except the atomics, whose rule is given with them.
 */
#ifndef KVP_SEGMENT_STATE_H
#define KVP_SEGMENT_STATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "actors/segment/segment.h"
#include "wire/kvpool.pb-c.h"

struct kvp_rt_actor;
struct kvp_seg_server;

struct kvp_segment {
    struct kvp_cfg_segment cfg;
    struct kvp_msession *ms;
    struct kvp_segment_hooks hooks;
    void *base;
    size_t map_bytes;
    uint64_t size;
    bool huge;
    struct kvp_seg_server *srv;
    /* The segment id: written by the mount at start, then by the heartbeat actor alone (remounts);
     * read by the mover actor and by kvp_segment_id / kvp_segment_stats on any thread (the
     * metrics endpoint's, which has no mailbox). Relaxed: one independent value; the data-plane
     * server keeps its own copy, set by message. */
    _Atomic uint32_t id;
    /* Mount counters for kvp_segment_stats: written by whichever mounts (the start, then the
     * heartbeat actor: one at a time), read by the metrics thread; relaxed, independent values
     * (see seg_server.c's counters for why atomics and not a message). */
    _Atomic uint64_t mounts;
    _Atomic uint64_t mount_failures;
    char name[128];
    char endpoint[300];
    char actor[160];            /* "segment <name>": the log lines' actor */
    struct kvp_rt_actor *sup;   /* the supervisor of the actors above (owner: the segment's owner) */
};

/** Fill a MountSegment request for this segment (m is the request's body, owned by the caller). */
void kvp_seg_mount_req(struct kvp_segment *s, Kvp__Request *req, Kvp__MountSegmentReq *m);

/**
 * Apply a MountSegment answer: `rc` is the session's result (KVP_OK: resp is the master's
 * Response, whose status is checked here). On success the new id is stored, the data plane
 * accepts it and hooks.on_mount runs. A failure is counted and logged as ERROR unless `quiet`.
 * `post`: the caller is an actor (the heartbeat): the data plane gets the id by a one-way message
 * (kvp_seg_server_set_id_post); else by the blocking kvp_seg_server_set_id (plain threads).
 * Frees resp. Returns KVP_OK or the error.
 */
int kvp_seg_mount_apply(struct kvp_segment *s, int rc, Kvp__Response *resp, bool quiet, bool post);

/** Start functions of the children (kvp_rt_sup_start_fn); arg is the struct kvp_segment. */
int kvp_seg_heartbeat_spawn(void *arg, struct kvp_rt_actor *parent, struct kvp_rt_actor **out);
int kvp_seg_prefault_spawn(void *arg, struct kvp_rt_actor *parent, struct kvp_rt_actor **out);
int kvp_seg_mover_spawn(void *arg, struct kvp_rt_actor *parent, struct kvp_rt_actor **out);

#endif
