/*
 * raftlog.h — canonical raft 0.15 (libuv backend) on its own thread. The only code that
 * includes <raft.h>. The master service talks to it only by message.
 *
 * The state machine is opaque bytes to raftlog: commands go in as encoded bytes, results come
 * back as encoded bytes. The FSM callbacks (struct kvp_raftlog_fsm) run on the raft thread only,
 * so the FSM state is owned by that thread; the one exception is a local read
 * (kvp_raftlog_read_begin), which reads it from another thread while apply is held off.
 *
 * Group commit: commands submitted while the raft thread is busy are packed into one Raft entry
 * (up to group_commit_max), so throughput is not bound by one fsync per request. The entry's
 * payload is a sequence of [u32 len][bytes] commands (raftlog/entry.h); apply calls fsm.apply
 * once per command, in order, and each submitter gets its own result. One entry per raft_apply;
 * up to max_inflight_entries (default 4) entries are in flight at once, the rest of the queue
 * waits and is packed into the next entry.
 *
 * Results and events are delivered as ZeroMQ messages on the `events` socket returned by
 * kvp_raftlog_events() (a PAIR the caller polls; only the raft thread writes to it). Its high
 * water marks are 0 (unlimited) so the raft thread never blocks on it: the caller must keep
 * reading. Frames (integers little-endian):
 *   frame 0: u8 kind (enum kvp_raftlog_event)
 *   frame 1: u64 corr (the id given at submit/query/admin call; leader id for EV_LEADER)
 *   frame 2: i32 status (KVP_OK, KVP_ERR_NOT_LEADER, KVP_ERR_UNAVAILABLE, ...)
 *   frame 3: result bytes (may be empty)
 * For KVP_RAFTLOG_EV_LEADER: corr = new leader's id (0 = unknown), status = 1 if this node
 * leads now else 0, frame 3 = u64 term (8 bytes little-endian).
 * With params.batch_applied, the EV_APPLIED results of one raft-thread loop iteration come as
 * one KVP_RAFTLOG_EV_APPLIED_BATCH message instead (corr = the number of results, status 0,
 * frame 3 = that many records, read with kvp_raftlog_applied_next()). Every other event is sent
 * after the batch holding the results that preceded it, so the order of events is unchanged.
 */
#ifndef KVP_RAFTLOG_H
#define KVP_RAFTLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <czmq.h>

#include "metrics/metrics.h"

/** FSM callbacks. All run on the raft thread; `ctx` is theirs. */
struct kvp_raftlog_fsm {
    void *ctx;
    /* Apply one committed command. Must be deterministic. *result (malloc'd, raftlog frees)
     * may be NULL for no result. Return KVP_OK or an error (the command is still applied on
     * every node: errors are results, not failures). */
    int (*apply)(void *ctx, const uint8_t *cmd, size_t len, uint8_t **result, size_t *result_len);
    /* Read-only query, run on the leader only. */
    int (*query)(void *ctx, const uint8_t *q, size_t len, uint8_t **result, size_t *result_len);
    /* Serialize the whole state into a new malloc'd buffer (raftlog lz4-frames it). */
    int (*snapshot)(void *ctx, uint8_t **buf, size_t *len);
    /* Replace the whole state with a snapshot produced by snapshot(). */
    int (*restore)(void *ctx, const uint8_t *buf, size_t len);
    /* Added, optional (all three or none): the incremental snapshot (docs/raftlog.md
     * "Snapshots"). snap_begin freezes the state as of the last applied command (cheap);
     * snap_next returns the next malloc'd chunk (*chunk, raftlog frees) of about max_bytes of the
     * same bytes snapshot() would write, *last on the final one (a chunk before it may be
     * empty: a step that only skipped work; it is not stored). apply may run between
     * snap_next calls and must not change what the running snapshot writes. snap_abort drops
     * a running one. With them raftlog builds snapshots a chunk per loop iteration and never
     * calls snapshot(). */
    int (*snap_begin)(void *ctx);
    int (*snap_next)(void *ctx, size_t max_bytes, uint8_t **chunk, size_t *len, bool *last);
    void (*snap_abort)(void *ctx);
    /* Added, optional (all four or none): restore in steps (docs/raftlog.md "Installing a
     * snapshot in steps"). restore_begin checks buf (what snapshot() or the snap_next chunks
     * wrote; it stays valid until restore_drop) and returns a handle *h; restore_step does about
     * max_bytes of the work and sets *done when the new state is complete; restore_end swaps it
     * in; after restore_end, restore_step frees the old state and sets *done when it is gone;
     * restore_drop frees the handle and whatever it still holds. The current state must stay
     * untouched before restore_end. With them a follower installs a snapshot a few
     * milliseconds per loop iteration; without them restore() runs in one piece. */
    int (*restore_begin)(void *ctx, const uint8_t *buf, size_t len, void **h);
    int (*restore_step)(void *ctx, void *h, size_t max_bytes, bool *done);
    int (*restore_end)(void *ctx, void *h);
    void (*restore_drop)(void *ctx, void *h);
    /* Added, optional: for the log line of a slow hold. raftlog calls it with begin=true before
     * an entry's apply or a snapshot/catch-up step, and, when that hold used over 20 ms of the
     * raft thread's CPU (RL_HOLD_NOTE_CPU_US), with begin=false to get one line (into buf, cap
     * bytes, NUL-terminated) of what the FSM did since the begin. Must not change the state. */
    void (*hold_note)(void *ctx, bool begin, char *buf, size_t cap);
};

struct kvp_raftlog_member {
    uint64_t id;
    char raft_address[256]; /* "host:port" */
};

struct kvp_raftlog_params {
    uint64_t id;
    char raft_address[256];
    char data_dir[1024];
    struct kvp_raftlog_member members[9]; /* bootstrap configuration (ignored when join) */
    size_t n_members;
    bool join;                    /* start with no configuration; wait to be added */
    uint32_t election_timeout_ms;
    uint32_t heartbeat_ms;
    uint64_t snapshot_threshold;
    uint64_t snapshot_trailing;
    uint32_t group_commit_max;    /* commands per entry; 0 = 256 (capped at 1024) */
    struct kvp_raftlog_fsm fsm;
    /* Added by raftlog (0 = default, so zero-initialised params keep working): */
    size_t segment_size_bytes;     /* raft_uv open segment size; 0 = raft's 8 MiB. Tests: small */
    uint32_t max_inflight_entries; /* group entries proposed but not yet applied; 0 = 4 */
    uint64_t snapshot_log_bytes;   /* also snapshot once the log since the last one holds this
                                      many payload bytes (0 = entries only); see raftlog_internal.h */
    bool batch_applied;            /* EV_APPLIED results of one loop iteration in one
                                      EV_APPLIED_BATCH message (false: one message each) */
    uint32_t entry_max_cost;       /* an entry's commands cost at most this in all
                                      (kvp_raftlog_submit_cost); 0 = RL_DEFAULT_ENTRY_COST (4096) */
};

enum kvp_raftlog_event {
    KVP_RAFTLOG_EV_APPLIED = 1,  /* result of kvp_raftlog_submit */
    KVP_RAFTLOG_EV_QUERY = 2,    /* result of kvp_raftlog_query */
    KVP_RAFTLOG_EV_LEADER = 3,   /* leadership changed (see above) */
    KVP_RAFTLOG_EV_ADMIN = 4,    /* result of add/remove/transfer */
    KVP_RAFTLOG_EV_LOG_FAILED = 5, /* a Raft log write failed: status KVP_ERR_IO, data the reason
                                      (text). This member can write nothing more (raft_uv stays
                                      errored, and no later write is answered); a leader has begun
                                      handing leadership over. The owner should stop the process
                                      (without kvp_raftlog_stop) and let a supervisor restart it
                                      once the disk is fixed. Sent once. */
    KVP_RAFTLOG_EV_APPLIED_BATCH = 6, /* several EV_APPLIED results (params.batch_applied) */
};

/**
 * Read the next record of a KVP_RAFTLOG_EV_APPLIED_BATCH payload (`data`, `len`: frame 3).
 * Record layout, little-endian: [u64 corr][i32 status][u32 res_len][res_len bytes].
 * `*pos` is the read offset (start at 0); on success it moves past the record and *res points
 * into `data` (borrowed; NULL when res_len is 0). Returns 1 for a record, 0 at the end, or
 * KVP_ERR_MALFORMED (negative) when the bytes left are too short for a header or for the
 * length it gives; *pos is then left unchanged. Pure: safe from any thread.
 */
int kvp_raftlog_applied_next(const uint8_t *data, size_t len, size_t *pos, uint64_t *corr, int32_t *status,
                             const uint8_t **res, size_t *res_len);

struct kvp_raftlog;

/**
 * Start the raft thread: open/create data_dir, bootstrap if empty and not join, load snapshot
 * + log, start the libuv loop. Synchronous: returns once the thread runs (or failed).
 * Bootstrap is attempted whenever !join; a data dir that already holds state is simply
 * restarted. The params are copied (fsm.ctx must outlive the instance). SIGPIPE is blocked on
 * the raft thread (peers closing Raft connections). Errors: KVP_ERR_IO (data dir, bind,
 * corrupt log), KVP_ERR_INVALID (id 0, address not host:port, no fsm.apply, 0 or > 9 members
 * without join), KVP_ERR_NOMEM. On error *out is untouched and nothing is left running.
 */
int kvp_raftlog_start(struct kvp_raftlog **out, const struct kvp_raftlog_params *p);

/** The events socket (owned by raftlog; the caller polls and reads it from one thread). */
zsock_t *kvp_raftlog_events(struct kvp_raftlog *rl);

/**
 * Submit one encoded command (copied). Thread-safe, never blocks on I/O. The result arrives as
 * KVP_RAFTLOG_EV_APPLIED with `corr`: status = fsm.apply's return + its result once committed
 * and applied on this node, or KVP_ERR_NOT_LEADER (not leader / lost leadership before commit;
 * the command may or may not have been committed — callers make commands idempotent).
 * Exactly one APPLIED event per accepted submit, except after kvp_raftlog_stop (see there).
 * Returns KVP_OK (queued), KVP_ERR_INVALID, KVP_ERR_TOO_LARGE (> 64 MiB), KVP_ERR_NOMEM,
 * KVP_ERR_CLOSED (stop has begun); on error no event follows.
 */
int kvp_raftlog_submit(struct kvp_raftlog *rl, uint64_t corr, const uint8_t *cmd, size_t len);
/**
 * kvp_raftlog_submit with the command's apply cost in the caller's units (the master: the
 * items of a batch command, 1 for others; kvp_raftlog_submit counts 1). An entry stops growing
 * before its commands' costs would pass entry_max_cost (a command costlier than that alone
 * still goes, in an entry of its own), as it stops past 1 MiB of bytes: every member applies an
 * entry in one piece on its raft thread, and bytes alone let 1 MiB of PutStarts (~26k items,
 * ~118 ms of CPU) into one entry (issue 22). Grouping never changes what is applied, only how
 * commands are split into entries.
 */
int kvp_raftlog_submit_cost(struct kvp_raftlog *rl, uint64_t corr, const uint8_t *cmd, size_t len, uint32_t cost);

/**
 * Run fsm.query on the raft thread if this node is leader and has heard from a quorum within
 * the election timeout; else KVP_ERR_NOT_LEADER. Result as KVP_RAFTLOG_EV_QUERY.
 * "Heard from a quorum": canonical raft makes a leader step down once it has not had contact
 * with a majority for one election timeout, so raft_state() == RAFT_LEADER is the check.
 * A newly elected leader first commits a barrier entry of its own term (so every entry
 * committed by earlier leaders is applied); queries arriving before that wait for it.
 * Queries are not ordered after earlier submits: wait for a submit's APPLIED event before
 * querying if the query must see it. fsm.query NULL → KVP_ERR_UNSUPPORTED.
 */
int kvp_raftlog_query(struct kvp_raftlog *rl, uint64_t corr, const uint8_t *q, size_t len);

/**
 * Local read on the caller's thread, without a trip to the raft thread (a leader that knows it
 * leads may answer reads from its own state machine: Ongaro, "Consensus: Bridging Theory and
 * Practice", 2014, §6.4). KVP_OK when this node leads, its term's barrier entry has applied, and
 * the raft thread confirmed both at most 40 ms ago (it re-confirms after every loop
 * iteration, in uv_check, and before every event it sends, and withdraws it as soon as it sees a step-down or
 * starts a leadership transfer). The FSM is then held against apply and restore until
 * kvp_raftlog_read_end, so the caller may read the fsm.ctx state directly; keep it short (the
 * raft thread's apply waits). Same basis as kvp_raftlog_query (raft_state() == RAFT_LEADER),
 * seen at most 40 ms earlier. KVP_ERR_NOT_LEADER otherwise — not leader, a new leader before
 * its barrier, closing, or the raft thread busy for over 40 ms: use kvp_raftlog_query then,
 * which waits on the raft thread. KVP_ERR_INVALID for NULL. Any thread; not re-entrant on one
 * thread; never from an FSM callback.
 */
int kvp_raftlog_read_begin(struct kvp_raftlog *rl);
/** Release what a successful kvp_raftlog_read_begin holds (only then). */
void kvp_raftlog_read_end(struct kvp_raftlog *rl);
/**
 * Admin operations (leader only); results as KVP_RAFTLOG_EV_ADMIN with corr.
 * add_voter: raft_add then raft_assign(RAFT_VOTER) (status after the promotion commits); when
 * the id is in the configuration but not a voter (an earlier add whose promotion failed), it
 * only promotes, so a failed add can be retried.
 * remove: raft_remove. transfer: raft_transfer; KVP_OK if the target (any other voter for 0)
 * leads when raft reports the transfer finished, else KVP_ERR_TIMEOUT.
 * Errors in the event: KVP_ERR_NOT_LEADER, KVP_ERR_INVALID (unknown/duplicate id, bad role),
 * KVP_ERR_BUSY (another configuration change in progress), KVP_ERR_CLOSED.
 */
int kvp_raftlog_add_voter(struct kvp_raftlog *rl, uint64_t corr, uint64_t id, const char *raft_address);
int kvp_raftlog_remove(struct kvp_raftlog *rl, uint64_t corr, uint64_t id);
int kvp_raftlog_transfer(struct kvp_raftlog *rl, uint64_t corr, uint64_t target_id /* 0 = any */);

/** Snapshot of leadership info (thread-safe, may be slightly stale). */
struct kvp_raftlog_info {
    uint64_t id;
    uint64_t leader_id;      /* 0 = unknown */
    uint64_t term;
    bool is_leader;
    uint64_t commit_index;
    uint64_t last_applied;
    size_t n_members;
    struct kvp_raftlog_member members[9]; /* current configuration (all roles) */
    /* Added by raftlog: counters of the raft thread (entries_proposed vs cmds_proposed shows
     * the group-commit factor on the leader). */
    uint64_t entries_proposed;
    uint64_t cmds_proposed;
    uint64_t snapshots_taken;
    uint64_t snapshots_restored;
    uint64_t entries_committed; /* this node's own entries committed and applied (as leader) */
    uint64_t commit_us_total;   /* their summed raft_apply → applied time, microseconds */
    uint64_t snapshots_by_bytes; /* snapshots triggered by snapshot_log_bytes */
    uint64_t log_bytes;          /* payload bytes applied since the last snapshot */
    /* Where a command's time goes on the leader, summed in microseconds. Per proposed command
     * (cmds_proposed): kvp_raftlog_submit → raft_apply (the raft thread's wake-up, the
     * in-flight cap, raft_apply's own work). Per command of its committed entries:
     * raft_apply → applied. Per entry: raft_apply → stored in this node's log (only entries
     * stored before they were applied; with two faster followers an entry can commit first). */
    uint64_t cmd_queue_us_total;
    uint64_t cmds_committed;
    uint64_t cmd_commit_us_total;
    uint64_t entries_stored;
    uint64_t store_us_total;
    /* Added for the metrics endpoint: time to take each snapshot (fsm.snapshot + lz4 framing). */
    struct kvp_metrics_hist snapshot_hist;
    /* Added (issue 22): the raft thread's longest stall since start: the largest lateness of its
     * 20 ms tick (time between two ticks less 20 ms), microseconds; the longest single
     * incremental snapshot step and snapshot restore; the last incremental snapshot's wall time
     * from begin to handing it to raft, its raft-thread busy time, and its framed size. */
    uint64_t max_stall_us;
    uint64_t max_busy_stall_us; /* of that lateness, the most the thread spent on its own CPU
                                   work (not waiting to be scheduled on a busy machine) */
    uint64_t max_snap_step_us;
    uint64_t max_apply_us;      /* longest apply of one entry (all its commands) */
    uint64_t max_snap_step_cpu_us; /* the same two in the raft thread's CPU time (a thread waiting */
    uint64_t max_apply_cpu_us;     /* for a CPU on a busy host takes longer in wall time) */
    uint64_t max_restore_us;
    uint64_t last_snap_wall_us;
    uint64_t last_snap_busy_us;
    uint64_t last_snap_bytes;
    /* Added (issue 22, catching up in steps): committed entries a follower applied later than
     * raft handed them over (behind a snapshot install, or past the per-iteration budget);
     * snapshots installed in steps; the longest single catch-up step (install, deferred
     * applies), wall and CPU time; entries waiting now. max_restore_us is the longest time a
     * restore held the raft thread in one piece (a step, when installed in steps). */
    uint64_t entries_deferred;
    uint64_t restores_in_steps;
    uint64_t max_catchup_step_us;
    uint64_t max_catchup_step_cpu_us;
    uint64_t deferred_now;
    bool fsm_behind;            /* the FSM lags raft's applied index (a staged install or deferred
                                   entries): last_applied is raft's, not yet the state's */
};
void kvp_raftlog_get_info(struct kvp_raftlog *rl, struct kvp_raftlog_info *out);

/**
 * Stop the raft thread (raft_close → the uv loop drains → join → free). Accepts NULL; sets *rl
 * to NULL. Blocks until the thread has exited: first the entries already in flight settle
 * (bounded by two election timeouts; and never before 1 s after start — raft 0.15 crashes when
 * closed earlier, see docs/raftlog.md). Safe with submissions pending: commands still queued
 * are dropped; entries in flight may still be committed by the cluster. No event is
 * delivered after (or during) stop — the events socket is destroyed with the instance — so the
 * caller fails its own outstanding corrs (KVP_ERR_CLOSED). The caller must make sure no other
 * thread calls into the instance once stop is called (the memory is freed when it returns).
 * Must not be called from an FSM callback.
 */
void kvp_raftlog_stop(struct kvp_raftlog **rl);

#endif
