/*
 * fence_track.h — the leader's record of the segment-side RDMA fence (issue 20; docs/rdma.md
 * "FenceWriter and Fenced"; design note ../shared/design/rdma.md §2.4 L2).
 *
 * Why: an RDMA WRITE is one-sided. A put that failed (PutRevoke, or its deadline passed) may
 * still have WRITE packets in the fabric, or queued at a frozen writer's NIC, that land in the
 * segment's memory without its CPU seeing them, after fence_grace_ms if they are late enough.
 * TCP needs no more than the grace (the segment's CPU handles every byte); RDMA space must not be
 * reused until the segment has moved the writers' queue pairs to ERR and destroyed them.
 *
 * The exchange: when a put fails at wall time t, every segment that said it serves RDMA writers
 * (HeartbeatReq.rdma_writers) is asked (HeartbeatResp.fence_writer{seq}) to fence its writers,
 * and is "outstanding" from t until its HeartbeatReq.fenced.seq echoes that seq. While any
 * segment is outstanding since t, the leader's QuarantineRelease is stamped with a time of at
 * most t + fence_grace_ms - 1, so no quarantine entry freed at or after t is released (the FSM
 * releases entries with freed_at + grace <= now, fsm_cmd.c). Every space a failed put leaves
 * enters the quarantine freed at or after the failure (PutRevoke: max(now, deadline); expiry:
 * the RevokeExpired time; a one-commit put: its reservation's horizon), so it waits for the
 * fence. Entries freed before t are not held. The Raft log is unchanged (the command's time is
 * chosen by the leader, as svc_submit does for lease horizons), so members of any level apply
 * it alike.
 *
 * Which writers: the master does not know the writers' RDMA ids (random per client transfer
 * actor), so FenceWriter asks for every writer (client_id 0). Their in-flight operations to that
 * segment fail and re-handshake: the cost of a failure path (note §2.4).
 *
 * A new leader starts empty; every RDMA segment that heartbeats it is asked once for a fence,
 * with the hold starting at 0 (every quarantine entry waits for it), so fences an older leader
 * was waiting for are not lost. Space freed under the older leader on a segment that has not yet
 * heartbeated the new one is not held (docs/rdma.md "What remains").
 *
 * A segment that stops heartbeating holds releases until the leader drops it (lost or
 * unmounted: the alive callback of kvp_fence_track_release_time says no): the bound is the
 * liveness rule's (client_ttl_ms).
 *
 * Plain data, owned by the master service actor's thread; no locks, no clock reads (callers pass
 * wall-clock ms). Segment ids index a dense array (ids start at 1 and are never reused).
 */
#ifndef KVP_MASTER_FENCE_TRACK_H
#define KVP_MASTER_FENCE_TRACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvp_fence_seg {
    bool rdma;            /* said rdma_writers in a heartbeat to this leader */
    bool asked;           /* a fence is outstanding */
    uint64_t want_seq;    /* the seq asked for (valid when asked) */
    uint64_t hold_from;   /* wall ms: entries freed at or after this wait (valid when asked) */
    uint64_t acked;       /* fences answered (status and tests) */
};

struct kvp_fence_track {
    struct kvp_fence_seg *seg; /* by segment id; seg[0] unused */
    uint32_t cap;
    uint64_t last_seq;
    uint64_t asks, acks;       /* counters: fences asked (per segment), answered */
};

/** Reset to empty (a new leadership): keeps the array, forgets every segment. */
void kvp_fence_track_reset(struct kvp_fence_track *t);
void kvp_fence_track_fini(struct kvp_fence_track *t);

/**
 * A put failed at wall_ms (its space will be quarantined as freed at or after wall_ms): every
 * RDMA segment gets a new FenceWriter seq; one already outstanding keeps its earlier hold_from.
 * Returns the number of segments asked.
 */
uint32_t kvp_fence_track_note_failure(struct kvp_fence_track *t, uint64_t wall_ms);

/**
 * A heartbeat from segment `seg`: rdma_writers is HeartbeatReq.rdma_writers, fenced_seq the
 * Fenced.seq it carried (0 none), fenced_status its status. A segment seen with rdma_writers
 * for the first time by this leader is asked for a fence with hold_from 0 (see the file
 * comment). A matching seq with status 0 clears the hold; with another status, the fence is
 * asked again under a new seq (the hold stays). Returns the seq to put in the
 * answer's FenceWriter, 0 for none. When the array cannot grow for a new id, *nomem is set (the
 * caller logs) and that segment is not recorded (it cannot be asked, so it holds nothing).
 */
uint64_t kvp_fence_track_heartbeat(struct kvp_fence_track *t, uint32_t seg, bool rdma_writers,
                                   uint64_t fenced_seq, int fenced_status, bool *nomem);

/**
 * The time to stamp on a QuarantineRelease (wall ms): now_ms, or less while a segment for which
 * alive(ctx, id) is true has a fence outstanding since hold_from: hold_from + grace_ms - 1, so
 * that nothing freed at or after hold_from is released (grace 0 counts as 1). Segments for which
 * alive says false are forgotten. alive may be NULL (every segment counts). *held_by (may be
 * NULL) gets the id of the segment that holds the earliest, 0 when none.
 */
uint64_t kvp_fence_track_release_time(struct kvp_fence_track *t, uint64_t now_ms, uint64_t grace_ms,
                                      bool (*alive)(void *ctx, uint32_t seg), void *ctx,
                                      uint32_t *held_by);

#endif
