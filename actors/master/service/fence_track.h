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
 * Which writers (per-writer fence, docs/rdma.md "Per-writer fence"): a client's transfer actors
 * use RDMA writer ids that share its high 32 bits, and its PutRevoke names them (writer_id and
 * writer_mask). Such a failure asks each RDMA segment to fence only the writers selected, and
 * the other clients' queue pairs stay up. A failure with no writer named (an expired put, an
 * older client, a new leader's first ask) asks for every writer (client_id 0); so does any ask
 * toward a segment whose heartbeat did not say fence_selectors (an older segment, which ignores
 * FenceWriter.writers and would fence every writer anyway: client_id stays 0).
 *
 * Merging: per segment, the pending asks are a short list of selectors, each with the newest
 * seq that asked for it and the earliest failure it holds for. Every new failure takes a new seq
 * (the fence the segment ran before the failure does not cover WRITEs posted after it), and the
 * FenceWriter of the newest seq names every pending selector. An answer to seq s (status 0)
 * clears the selectors whose seq is <= s: the FenceWriter of s named them all, as selectors only
 * leave the list through such answers and any addition takes a newer seq. A fence of every
 * writer absorbs the list (one "all" entry, the earliest hold, the newest seq); so does a list
 * that would exceed KVP_FENCE_SELECTORS_MAX. The segment's hold_from is the earliest of what is
 * left, so space is reused only once every fence it needs is answered.
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

/* Pending per-writer selectors per segment; one more becomes a fence of every writer. */
#define KVP_FENCE_SELECTORS_MAX 8

struct kvp_fence_sel {
    uint64_t client_id;   /* already masked */
    uint64_t mask;        /* 0: every writer (then it is the list's only entry) */
    uint64_t seq;         /* the newest seq that asked for it: an answer >= this clears it */
    uint64_t hold_from;   /* wall ms: the earliest failure it holds for */
};

struct kvp_fence_seg {
    bool rdma;            /* said rdma_writers in a heartbeat to this leader */
    bool asked;           /* a fence is outstanding (n_sel > 0) */
    bool selectors;       /* said fence_selectors in its last heartbeat */
    uint64_t want_seq;    /* the seq asked for (valid when asked) */
    uint64_t hold_from;   /* wall ms: entries freed at or after this wait (valid when asked) */
    uint64_t acked;       /* fences answered (status and tests) */
    uint32_t n_sel;       /* pending selectors; one with mask 0 means every writer */
    struct kvp_fence_sel sel[KVP_FENCE_SELECTORS_MAX];
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
 * A put written by the RDMA writers that (client_id, mask) selects (a writer w matches when
 * (w & mask) == (client_id & mask)) failed at wall_ms: every RDMA segment gets a new seq that
 * asks to fence those writers, merged with what it already has pending (file comment). client_id
 * or mask 0, or a segment without fence_selectors: a fence of every writer, as
 * kvp_fence_track_note_failure. Returns the number of segments asked.
 */
uint32_t kvp_fence_track_note_writer_failure(struct kvp_fence_track *t, uint64_t wall_ms,
                                             uint64_t client_id, uint64_t mask);

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
 * kvp_fence_track_heartbeat with HeartbeatReq.fence_selectors: a segment that says false (an
 * older one) is only ever asked to fence every writer; pending selectors toward a segment that
 * stops saying it become one fence of every writer under a new seq. An answer to any seq up to
 * the one asked clears the selectors it covered (file comment).
 */
uint64_t kvp_fence_track_heartbeat_sel(struct kvp_fence_track *t, uint32_t seg, bool rdma_writers,
                                       bool selectors, uint64_t fenced_seq, int fenced_status,
                                       bool *nomem);

/**
 * What FenceWriter toward `seg` must say: false when nothing is asked. Otherwise *seq is the seq,
 * and *n the number of selectors in *sel (pointing into the record, valid until its next change):
 * 0 means every writer (client_id 0, no writers).
 */
bool kvp_fence_track_ask(const struct kvp_fence_track *t, uint32_t seg, uint64_t *seq,
                         const struct kvp_fence_sel **sel, uint32_t *n);

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
