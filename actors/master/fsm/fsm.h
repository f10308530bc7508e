/*
 * fsm.h — the master's metadata state machine. Pure and deterministic: no clock reads, no I/O,
 * no randomness; time arrives in commands (Command.now_wall_ms). Applied on every Raft member.
 *
 * State: segments (id, name, host, endpoint, size, state ACTIVE/DRAINING/LOST, bytes used), a
 * per-segment offset allocator (KVP_FSM_ALIGN-byte alignment, fragmentation reported), objects
 * (key <= 512 bytes, size, checksum, soft pin, replicas PENDING/COMPLETE, creation term, op_id),
 * pending puts with deadlines, quarantine of freed space (reused only after fence_grace_ms).
 *
 * Semantics of each command and query: docs/internals.md, "Master state machine".
 */
#ifndef KVP_MASTER_FSM_H
#define KVP_MASTER_FSM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/kvpool.pb-c.h"

#define KVP_FSM_ALIGN 64u

struct kvp_master_fsm;

struct kvp_master_fsm_params {
    uint64_t fence_grace_ms;  /* quarantine length */
    uint64_t put_ttl_ms;      /* pending put deadline when PutStartReq.ttl_ms == 0 */
};

int kvp_master_fsm_new(struct kvp_master_fsm **out, const struct kvp_master_fsm_params *p);
void kvp_master_fsm_destroy(struct kvp_master_fsm **fsm);

/**
 * Apply one command. *out is a new Response (free with kvp_master_fsm_response_free) whose
 * status and body carry the result (per-key statuses inside batch bodies). Returns KVP_OK, or
 * KVP_ERR_NOMEM / KVP_ERR_INVALID (unknown command body: logged, state unchanged).
 */
int kvp_master_fsm_apply(struct kvp_master_fsm *fsm, const Kvp__Command *cmd, Kvp__Response **out);

/**
 * Read-only query for requests GetReplicaList, Exists, GetSize, ClusterStatus (segments and
 * object counts), with *out as for apply. Other request bodies: KVP_ERR_INVALID.
 */
int kvp_master_fsm_query(const struct kvp_master_fsm *fsm, const Kvp__Request *req, Kvp__Response **out);

/**
 * kvp_master_fsm_query, for the leader's own reads of level 6 (docs/master.md "Intent overlapped
 * with the transfer (level 6)"): a pending intent counts as a complete object when
 * vis->sealed(vis->arg, key, op_id, checksum) says so (the leader acknowledged its PutEnd and its
 * PutSealCmd is not applied yet: read-your-writes). vis NULL: kvp_master_fsm_query. sealed runs
 * on the caller's thread, under the caller's read.
 */
struct kvp_fsm_qvis {
    bool (*sealed)(void *arg, const char *key, uint64_t op_id, uint64_t checksum);
    void *arg;
};
int kvp_master_fsm_query_vis(const struct kvp_master_fsm *fsm, const Kvp__Request *req,
                             const struct kvp_fsm_qvis *vis, Kvp__Response **out);

/**
 * Free a Response from apply/query (NULL is fine). Responses are built from malloc'd parts
 * only, so this is protobuf_c_message_free_unpacked(): callers may also free them that way.
 */
void kvp_master_fsm_response_free(Kvp__Response *resp);

/** Serialize / replace the whole state (deterministic bytes for equal states). */
int kvp_master_fsm_snapshot(const struct kvp_master_fsm *fsm, uint8_t **buf, size_t *len);
int kvp_master_fsm_restore(struct kvp_master_fsm *fsm, const uint8_t *buf, size_t len);

/**
 * Restore in steps (fsm_snap.c; raftlog installs a snapshot this way, docs/raftlog.md
 * "Installing a snapshot in steps"). begin checks the snapshot's trailer (O(1)) and returns a
 * handle; buf must stay valid and unchanged until the handle is dropped. step parses about
 * max_bytes of it into a new state built aside, checksumming what it parsed (the whole stream's
 * XXH3 must match before the new state is complete), then builds the segments' allocators a few
 * at a time, and sets *done once the new state is complete: the current state is untouched until
 * then. end swaps the new state in (O(1)); after end, step frees the old state about
 * max_bytes / 64 table slots at a time and sets *done when it is gone. drop frees the handle
 * and whatever it still holds (the unfinished new state or the rest of the old one; NULL is
 * fine). Errors: begin KVP_ERR_MALFORMED (no checksum trailer), KVP_ERR_NOMEM; step KVP_ERR_MALFORMED /
 * KVP_ERR_VERSION / KVP_ERR_NOMEM (the handle must then be dropped, the state is unchanged);
 * end KVP_ERR_INVALID when the new state is not complete.
 */
struct kvp_fsm_restore;
int kvp_master_fsm_restore_begin(struct kvp_master_fsm *fsm, const uint8_t *buf, size_t len,
                                 struct kvp_fsm_restore **out);
int kvp_master_fsm_restore_step(struct kvp_fsm_restore *r, size_t max_bytes, bool *done);
int kvp_master_fsm_restore_end(struct kvp_master_fsm *fsm, struct kvp_fsm_restore *r);
void kvp_master_fsm_restore_drop(struct kvp_fsm_restore *r);

/**
 * Incremental snapshot (fsm_snap_inc.c, docs/raftlog.md "Snapshots"): begin freezes the state
 * as of now (O(segments): the segments and their quarantine are written at once); each next
 * call returns one malloc'd chunk (*chunk, free()) of at most about max_bytes of the same byte
 * stream kvp_master_fsm_snapshot writes, objects in table order rather than sorted; *last is set
 * on the final chunk, which ends the snapshot. A call also visits at most max_bytes / 4 slots of
 * the object table (at least 1,024), so a chunk before the last may be short or empty (*len 0)
 * when the walk skips objects already written (after a table growth) or inserted since begin.
 * Applies may run between calls: an object a command changes or removes is written as it was
 * at begin before the change. Concatenated, the chunks are a snapshot kvp_master_fsm_restore
 * reads. begin: KVP_ERR_BUSY while one runs, NOMEM.
 * next: KVP_ERR_INVALID with none running, NOMEM (the snapshot is then dropped). abort drops a
 * running one (no-op otherwise). restore drops a running one as well.
 */
int kvp_master_fsm_snap_begin(struct kvp_master_fsm *fsm);
int kvp_master_fsm_snap_next(struct kvp_master_fsm *fsm, size_t max_bytes, uint8_t **chunk, size_t *len,
                             bool *last);
void kvp_master_fsm_snap_abort(struct kvp_master_fsm *fsm);
bool kvp_master_fsm_snap_running(const struct kvp_master_fsm *fsm);

/**
 * Digest of the replicated state: equal on members that applied the same commands, whatever
 * their table layout or snapshot history (order-free sum of per-object XXH3-64 hashes, mixed
 * with a hash of the segments and their quarantine in id order). O(objects).
 */
uint64_t kvp_master_fsm_digest(const struct kvp_master_fsm *fsm);

/**
 * Byte adapters for raftlog (struct kvp_raftlog_fsm): decode → apply/query → encode. Input is
 * a raw protobuf-packed Kvp__Command (apply) or Kvp__Request (query), no envelope; *res is a
 * new malloc'd raw packed Kvp__Response (free()). A buffer that does not decode: KVP_ERR_MALFORMED
 * with a log line, state unchanged, *res NULL. Other errors as apply/query, *res NULL.
 * restore: KVP_ERR_MALFORMED (or KVP_ERR_VERSION for an unknown snapshot format) with the state
 * unchanged when the snapshot does not decode or is inconsistent (overlapping extents, replicas
 * on unknown segments, duplicate keys).
 */
int kvp_master_fsm_apply_bytes(void *fsm, const uint8_t *cmd, size_t len, uint8_t **res, size_t *res_len);
int kvp_master_fsm_query_bytes(void *fsm, const uint8_t *q, size_t len, uint8_t **res, size_t *res_len);
int kvp_master_fsm_snapshot_bytes(void *fsm, uint8_t **buf, size_t *len);
int kvp_master_fsm_restore_bytes(void *fsm, const uint8_t *buf, size_t len);
int kvp_master_fsm_snap_begin_bytes(void *fsm);
int kvp_master_fsm_snap_next_bytes(void *fsm, size_t max_bytes, uint8_t **chunk, size_t *len, bool *last);
void kvp_master_fsm_snap_abort_bytes(void *fsm);
int kvp_master_fsm_restore_begin_bytes(void *fsm, const uint8_t *buf, size_t len, void **h);
int kvp_master_fsm_restore_step_bytes(void *fsm, void *h, size_t max_bytes, bool *done);
int kvp_master_fsm_restore_end_bytes(void *fsm, void *h);
void kvp_master_fsm_restore_drop_bytes(void *fsm, void *h);
/* raftlog's hold_note (raftlog.h): begin marks the FSM's work counts; otherwise writes what was
 * done since the mark (commands, PutStart/PutEnd items, table growth slots copied / swaps /
 * whole growths / table bytes allocated and freed, snapshot slots visited and objects written)
 * into buf as one line. Never changes the replicated state. */
void kvp_master_fsm_hold_note(void *fsm, bool begin, char *buf, size_t cap);

/**
 * A counter bumped by every applied command that can create repair or drain work (a segment
 * mounted, draining, lost or unmounted, a repair step, a replica dropped, an object completed
 * with fewer copies than it wants or on a segment no longer ACTIVE) and by restore. Commands
 * that only take objects away, free space or touch pending puts leave it. A RepairScan that
 * found no work stays valid while this value is unchanged, so the leader skips the O(objects)
 * scan (service_repair.c). Not part of the replicated state: nodes may differ. Read it on the
 * raft thread or under kvp_raftlog_read_begin.
 */
uint64_t kvp_master_fsm_repair_epoch(const struct kvp_master_fsm *fsm);

/**
 * The cluster's committed feature level (RaiseLevelCmd; actors/master/fsm/version.h): the
 * highest level a leader committed after every member reported it, never lowered; 0 = none
 * committed. Read under kvp_raftlog_read_begin like every other FSM read.
 */
uint32_t kvp_master_fsm_feature_level(const struct kvp_master_fsm *fsm);

/** Totals for status and eviction (bytes). */
struct kvp_master_fsm_stats {
    uint64_t segments, objects, pending_puts;
    uint64_t capacity_bytes, used_bytes, quarantined_bytes, pinned_bytes;
};
void kvp_master_fsm_stats(const struct kvp_master_fsm *fsm, struct kvp_master_fsm_stats *out);

/**
 * Quarantined bytes not reusable by `after_wall_ms` (wall-clock ms): those whose release time,
 * freed-at + fence_grace_ms, is after it (held to a lease horizon or a revoked put's deadline).
 * The headroom rule counts only the rest as room (docs/eviction.md, "Headroom"). Each segment's
 * entries are in time order at every feature level, so the late ones are a suffix, found by
 * binary search and summed from a running count: O(log entries) per segment.
 */
uint64_t kvp_master_fsm_quarantine_late(const struct kvp_master_fsm *fsm, uint64_t after_wall_ms);

/**
 * Added: visit every COMPLETE object (key NUL-terminated, size in bytes, soft pin), in table
 * order (not sorted). For the service's eviction choice: it pairs these with its leader-only
 * last-access times. The callback must not modify the FSM. O(objects).
 */
void kvp_master_fsm_foreach_object(const struct kvp_master_fsm *fsm,
                                   void (*cb)(void *ctx, const char *key, uint64_t size,
                                              bool soft_pin),
                                   void *ctx);

/**
 * Added (issue 22): kvp_master_fsm_foreach_object over the table slots [from, from + slots) only
 * (slots 0, or a slice past the end: up to the end; from past the end: from 0), so that one call
 * visits a bounded number of slots at any table size (a pass of slices, as the repair scan's).
 * Returns the slot the next slice starts at, 0 when this one reached the end of the table.
 * *table_slots and *table_moves (each may be NULL): the table's size now (a change within a pass
 * means a growth swapped tables: start the pass again) and its count of objects moved between
 * slots by removals (a change within a pass means an object may have been missed or seen twice).
 */
uint64_t kvp_master_fsm_foreach_object_slice(const struct kvp_master_fsm *fsm, uint64_t from, uint64_t slots,
                                             void (*cb)(void *ctx, const char *key, uint64_t size,
                                                        bool soft_pin),
                                             void *ctx, uint64_t *table_slots, uint64_t *table_moves);

/**
 * Added (issue 22): visit every tenant's complete objects: bytes (each object's size rounded up
 * to 64) and count, kept as entries are applied, so O(tenants), not O(objects). The tenant is
 * the key's part before KVP_AUTH_TENANT_SEP ("" without one), at most 63 bytes. A tenant seen
 * once may be listed at 0. KVP_ERR_NOMEM when a count was lost for want of memory (the figures
 * are then low until the next restore), KVP_ERR_INVALID on NULL arguments.
 */
int kvp_master_fsm_tenants(const struct kvp_master_fsm *fsm,
                           void (*cb)(void *ctx, const char *tenant, uint64_t used_bytes, uint64_t objects),
                           void *ctx);

/**
 * Added, for tests: check every invariant of the state (per live segment: allocator tree valid,
 * free + used + quarantined == capacity, no two replica/quarantine extents overlap, counters
 * match; objects findable by key, pending list consistent, replicas on distinct live
 * segments). Returns 0 when all hold, else a negative code naming the failed check.
 * O(objects log objects).
 */
int kvp_master_fsm_check(const struct kvp_master_fsm *fsm);

/* Reads for the leader's one-commit put (service_put.c), under kvp_raftlog_read_begin only.
 * key_present: an object (complete or pending) holds `key`; false for an invalid key.
 * segment_addr: an ACTIVE segment's host, endpoint and owner pid (pointers valid until the next
 * applied command); false when it is not ACTIVE or unknown. */
bool kvp_master_fsm_key_present(const struct kvp_master_fsm *fsm, const char *key);
/* segment_id: the id of the ACTIVE segment named `name`; 0 when none. */
uint32_t kvp_master_fsm_segment_id(const struct kvp_master_fsm *fsm, const char *name);
bool kvp_master_fsm_segment_addr(const struct kvp_master_fsm *fsm, uint32_t id, const char **host,
                                 const char **endpoint, uint64_t *owner_pid);
/* An ACTIVE segment's size and largest free extent (bytes); false when not ACTIVE or unknown. */
bool kvp_master_fsm_segment_space(const struct kvp_master_fsm *fsm, uint32_t id, uint64_t *size,
                                  uint64_t *largest_free);

/**
 * Pending intents (feature level 6; docs/master.md "Intent overlapped with the transfer (level
 * 6)"): puts whose intent (PutCommitItem.intent) committed and that no PutSealCmd / PutEnd has
 * completed nor PutRevoke dropped. Hidden from every read and from eviction; RevokeExpired never
 * drops them (a put acknowledged by an older leader may be unsealed): a leader that took over
 * seals each one whose bytes it verified on the segments (PutSealCmd, its op_id and checksum)
 * and revokes the others (PutRevoke with its op_id, once past deadline_ms).
 * key points into the FSM (valid until the next applied command); replicas in placement order.
 */
#define KVP_FSM_INTENT_MAX_REPLICAS 16u
struct kvp_fsm_intent {
    const char *key;
    uint64_t op_id, size, checksum, term, deadline_ms; /* size in bytes; deadline wall-clock ms */
    uint32_t replica_num;                             /* wanted replicas (0 = nreplicas) */
    bool soft_pin;
    uint32_t nreplicas;
    struct {
        uint32_t segment_id;
        uint64_t offset;
    } replicas[KVP_FSM_INTENT_MAX_REPLICAS];
};
/* Call fn on each pending intent (list order, not sorted) until it returns false. A local read:
 * on the raft thread or under kvp_raftlog_read_begin. fn must not change the FSM. */
void kvp_fsm_intent_each(const struct kvp_master_fsm *fsm, bool (*fn)(const struct kvp_fsm_intent *, void *),
                         void *arg);
/* The pending intent of `key` into *out: true when `key` holds one. A local read as above. */
bool kvp_fsm_intent_get(const struct kvp_master_fsm *fsm, const char *key, struct kvp_fsm_intent *out);
/* How many intents are pending (O(1)). */
uint64_t kvp_fsm_intent_count(const struct kvp_master_fsm *fsm);

#endif
