/*
 * mover.h — a segment's mover (docs/drain-repair.md): a runtime actor ("mover", a child of the
 * segment's supervisor, segment_state.h) that polls the master leader (MoverPoll, through the
 * master session without blocking) for copy tasks whose source is this segment, checks the
 * source bytes against the object's XXH3-64, writes them to the target segment with its own
 * transfer engine (TCP WRITE, pipelined, one batch per poll) and reports each outcome in its
 * next poll. Idle: one poll every 250 ms; busy: the next poll right after the reports are ready.
 *
 * The copy itself is the transfer engine's blocking kvp_xfer_run (at most 8 s per batch): the
 * mover has its own thread so that only its own messages wait meanwhile; it becomes a request to
 * the engine when the engine is an actor (issue 19).
 */
#ifndef KVP_SEGMENT_MOVER_H
#define KVP_SEGMENT_MOVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "actors/session/msession.h"

struct kvp_rt_actor;

/** What the mover works for: all borrowed, and they outlive the mover. */
struct kvp_mover_cfg {
    struct kvp_msession *ms;
    /* The segment's current id (0 = not mounted: no polls); relaxed reads. Segment state's
     * atomic (segment_state.h): the heartbeat actor changes it on a remount, and the mover reads
     * it before each poll; a message per remount would only duplicate that one value. */
    _Atomic uint32_t *id;
    void *base;           /* the region [base, base + size) */
    uint64_t size;
    const char *actor;    /* the segment's log name; " mover" is appended */
    bool tokens;          /* present data-plane tokens to other segments (auth on, docs/security.md) */
};

/**
 * Spawn the mover as a threaded actor with `parent` (its supervisor) as parent. Errors:
 * KVP_ERR_INVALID, KVP_ERR_NOMEM, KVP_ERR_IO, the transfer engine's.
 */
int kvp_mover_spawn(struct kvp_rt_actor **out, struct kvp_rt_actor *parent, const struct kvp_mover_cfg *cfg);

#endif
