/*
 * mover.h — a segment's mover (docs/drain-repair.md): one thread that polls the master leader
 * (MoverPoll) for copy tasks whose source is this segment, checks the source bytes against the
 * object's XXH3-64, writes them to the target segment with its own transfer engine (TCP
 * WRITE, pipelined, one batch per poll) and reports each outcome in its next poll.
 * Idle: one poll every 250 ms; busy: the next poll right after the reports are ready.
 */
#ifndef KVP_SEGMENT_MOVER_H
#define KVP_SEGMENT_MOVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "actors/client/msession.h"

struct kvp_mover;

struct kvp_mover_stats {
    uint64_t copies_ok, copies_failed, bytes_moved;
};

/**
 * Start the mover of the segment whose current id is *id (0 = not mounted: no polls) and whose
 * region is [base, base+size). `ms` and `id` are borrowed and must outlive the mover.
 * Errors: KVP_ERR_NOMEM, KVP_ERR_IO.
 */
int kvp_mover_start(struct kvp_mover **out, struct kvp_msession *ms, _Atomic uint32_t *id, void *base,
                    uint64_t size, const char *actor, bool tokens);
void kvp_mover_get_stats(struct kvp_mover *m, struct kvp_mover_stats *st);
/** Stop the thread (a copy in flight finishes or times out first), free. Accepts NULL. */
void kvp_mover_stop(struct kvp_mover **m);

#endif
