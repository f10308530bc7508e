/*
 * seg_verify.h — the segment's side of range verification (issue 21; docs/master.md "Range
 * verification"): the leader asks, in a HeartbeatResp, for the XXH3-64 of byte ranges of this
 * segment's region (RangeVerify); the heartbeat actor (seg_heartbeat.c) queues them here,
 * hashes at most a budget of bytes per heartbeat answer, and sends the results (RangeSum) in its
 * next heartbeat, right away when it has some.
 *
 * A queue of ranges owned by one thread (the heartbeat actor's): no locks. The region is read on
 * that thread, as the mover reads its source replicas (mover.c): a range being checked is one the
 * leader holds placed (a complete replica, or a pending intent), which no writer of the current
 * term writes; bytes that change while hashed give a MISMATCH, never a wrong MATCH of bytes that
 * were not there (XXH3 over what was read). The data plane is never blocked.
 *
 * The checksum is XXH3-64 with seed 0 of the concatenated bytes, the same function as the
 * client's object checksum (actors/client/checksum.c): a range hashed in several steps (the
 * streaming XXH3 state) gives the same value as one call over it.
 */
#ifndef KVP_SEG_VERIFY_H
#define KVP_SEG_VERIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/kvpool.pb-c.h"

/* Ranges queued at once (answered ones included, until a heartbeat takes them); more are
 * refused with a WARN (the leader then sees no answer: UNKNOWN, asked again later). */
#define KVP_SEG_VERIFY_MAX 256u
/* Bytes hashed per step (one step per heartbeat answer): 16-20 ms of one core with the system's
 * XXH3 on the 2-core build host (resident pages); the rest waits for the next step. */
#define KVP_SEG_VERIFY_BUDGET_BYTES (256ull << 20)

struct kvp_seg_verify_range {
    uint64_t id;       /* RangeVerify.id */
    uint64_t offset;   /* bytes into the region */
    uint64_t len;      /* bytes */
    uint64_t done;     /* bytes hashed so far */
    int status;        /* KVP_OK, or the refusal (KVP_ERR_INVALID) */
    bool ready;        /* answered: status (and checksum) final */
    uint64_t checksum; /* ready with KVP_OK: XXH3-64 of the range */
    void *state;       /* XXH3_state_t of a range hashed in several steps; NULL otherwise */
};

struct kvp_seg_verify {
    struct kvp_seg_verify_range q[KVP_SEG_VERIFY_MAX];
    size_t n;                  /* entries of q in use, in arrival order */
    uint32_t segment_id;       /* the mount the queue was filled for (a new id clears it) */
    uint64_t refused;          /* ranges dropped because the queue was full (logged) */
    uint64_t answered;         /* answers handed to heartbeats */
    /* RangeSum storage of the heartbeat being built (kvp_seg_verify_fill) */
    Kvp__RangeSum sums[KVP_SEG_VERIFY_MAX];
    Kvp__RangeSum *sump[KVP_SEG_VERIFY_MAX];
};

/** Empty queue (zeroed storage is one too). */
void kvp_seg_verify_init(struct kvp_seg_verify *v);
/** Drop every queued range (a new mount, the actor's end). */
void kvp_seg_verify_clear(struct kvp_seg_verify *v);

/**
 * Queue the leader's ranges of one HeartbeatResp for segment `segment_id` (a different id than the
 * queue's clears it first), over a region of `region_bytes`. A range that is not inside the
 * region (offset + len past its end, overflow, len 0) is answered KVP_ERR_INVALID at once, with a
 * WARN naming it; an id already queued is skipped (a resent ask); past KVP_SEG_VERIFY_MAX the
 * rest is dropped with one WARN. `actor` names the log lines. Returns the ranges queued.
 */
size_t kvp_seg_verify_add(struct kvp_seg_verify *v, uint32_t segment_id, Kvp__RangeVerify *const *ranges,
                          size_t n, uint64_t region_bytes, const char *actor);

/**
 * Hash up to `budget_bytes` of the queued ranges, in order, reading `base` (the region, at least
 * as large as the region_bytes given to add). A range finished is ready. Returns the bytes hashed.
 * A range whose streaming state cannot be allocated is finished with KVP_ERR_NOMEM.
 */
uint64_t kvp_seg_verify_step(struct kvp_seg_verify *v, const uint8_t *base, uint64_t budget_bytes);

/** Answers ready to send. */
size_t kvp_seg_verify_ready(const struct kvp_seg_verify *v);
/** Ranges not finished yet (more steps needed). */
size_t kvp_seg_verify_pending(const struct kvp_seg_verify *v);

/**
 * Put the ready answers into hb->verified (storage inside v, valid until the next call on v) and
 * drop them from the queue: an answer goes out once; a lost heartbeat loses it (the leader's
 * request then ends UNKNOWN and is asked again). Returns the answers put.
 */
size_t kvp_seg_verify_fill(struct kvp_seg_verify *v, Kvp__HeartbeatReq *hb);

#endif
