/*
 * version.h — feature levels for rolling upgrades (docs/operations.md "Upgrading").
 *
 * A feature level is a small integer that names what a master binary understands in the Raft
 * log. Levels so far:
 *   1  v0.1.0, the first release.
 *   2  PutStartReq.avoid_segments is read by the FSM when it places a put (issue 18).
 *   3  ReserveCmd and PutCommitCmd (one-commit put, issue 21; docs/master.md "One-commit put"),
 *      and snapshots of format 2 (they carry reservations).
 *   4  RaiseLevelCmd: the cluster's level is committed in the Raft log (docs/master.md
 *      "Committed feature level"), so a leader elected while a member is down keeps it.
 *   5  Once level 5 is committed, each quarantined extent is released at its own time (freed-at
 *      + fence_grace_ms), not at the latest time of the entries pushed before it on its segment
 *      (docs/master.md "Quarantine release per entry (level 5)"); snapshots of format 3. The
 *      switch is the apply of RaiseLevelCmd{5}: one point of the log for every member.
 *   6  The put's intent committed while its bytes move: PutCommitItem.intent, PutSealCmd, and
 *      snapshots of format 4 (they carry pending intents) once level 6 is committed
 *      (docs/master.md "Intent overlapped with the transfer (level 6)").
 * A command that a member of an older level would apply differently (or not at all) may only be
 * logged once every member of the cluster reports the level that introduced it: otherwise the
 * replicated state machines diverge. The leader asks every other member for its level (each
 * master's Response carries feature_level; a v0.1.0 master's carries none, read as 1) and
 * strips what the cluster's level does not allow before it logs the command.
 * Pure code: no I/O, no globals; safe from any thread.
 */
#ifndef KVP_MASTER_VERSION_H
#define KVP_MASTER_VERSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/kvpool.pb-c.h"

#define KVP_FEATURE_LEVEL 6u           /* this binary */
#define KVP_FEATURE_AVOID_SEGMENTS 2u  /* PutStartReq.avoid_segments placed by the FSM */
#define KVP_FEATURE_RESERVE 3u         /* ReserveCmd, PutCommitCmd */
#define KVP_FEATURE_COMMITTED 4u       /* RaiseLevelCmd */
#define KVP_FEATURE_QUARANTINE_OWN_TIME 5u /* committed: quarantine released per entry */
#define KVP_FEATURE_INTENT 6u          /* PutCommitItem.intent, PutSealCmd (committed level only) */

/* A member's reported level counts while its last answer is younger than this. */
#define KVP_FEATURE_FRESH_MS 5000u

/** What the leader last heard from one other member. heard_ms 0 = never. */
struct kvp_feature_peer {
    uint32_t level;    /* as reported; 0 = unknown */
    uint64_t heard_ms; /* monotonic ms of that answer */
};

/**
 * The cluster's feature level: the lowest of `self` and every peer's level. A peer never heard,
 * or not heard within KVP_FEATURE_FRESH_MS of `now_ms`, counts as level 1 (features that need
 * more stay off while a member is down or being replaced).
 */
uint32_t kvp_feature_cluster_level(uint32_t self, const struct kvp_feature_peer *peers, size_t n,
                                   uint64_t now_ms);

/**
 * The level a leader logs with, given the cluster's committed level (RaiseLevelCmd; 0 or 1 =
 * none committed). kvp_feature_cluster_level() counts a member not heard as level 1; a committed
 * level says every member of the configuration reported it once, and a member never goes back
 * to a lower level while it stays in the configuration unless it is downgraded in place, which
 * it then reports. So: the computed level, raised to the committed one as far as every member
 * that IS heard (and this master) allows. A member down does not lower it; a member heard at a
 * lower level (downgraded) does.
 */
uint32_t kvp_feature_effective_level(uint32_t self, const struct kvp_feature_peer *peers, size_t n,
                                     uint64_t now_ms, uint32_t committed);

/**
 * Whether the leader should log RaiseLevelCmd{level = computed}: the level every member
 * reported (kvp_feature_cluster_level) is above the committed one and this cluster can apply
 * the command (computed >= KVP_FEATURE_COMMITTED).
 */
static inline bool kvp_feature_should_raise(uint32_t computed, uint32_t committed)
{
    return computed >= KVP_FEATURE_COMMITTED && computed > committed;
}

/** The level a reply reports: 0 (an older master that sends none) reads as 1. */
static inline uint32_t kvp_feature_reported(uint32_t field)
{
    return field ? field : 1u;
}

/**
 * Make a PutStart fit a cluster of `level` before it is logged: below
 * KVP_FEATURE_AVOID_SEGMENTS the avoid list is dropped (the put is placed as v0.1.0 places it).
 * Returns how many avoid entries were dropped.
 */
size_t kvp_feature_gate_put_start(Kvp__PutStartReq *ps, uint32_t level);

/**
 * The level a command needs to be applied alike on every member (Command.feature_level).
 * A member whose KVP_FEATURE_LEVEL is lower refuses it (KVP_ERR_VERSION) rather than apply it
 * its own way. A member of this level honours a level-2 field only in a command stamped 2: a
 * v0.1.0 leader copies a client's avoid list into its log as an unknown field, unstamped.
 * RaiseLevelCmd{level} needs max(KVP_FEATURE_COMMITTED, level): committing a level changes what
 * a member applies from then on (level 5: the quarantine), so a member below it refuses the
 * command rather than record a level whose rules it does not follow.
 */
uint32_t kvp_feature_command_needs(const Kvp__Command *c);

/**
 * What the leader does to every command before it logs it, in a cluster of `level`: gate it
 * (kvp_feature_gate_put_start) and stamp Command.feature_level with what it then needs (0 when
 * 1, so that a command of level 1 packs to the bytes v0.1.0 would log).
 */
void kvp_feature_prepare_command(Kvp__Command *c, uint32_t level);

#endif
