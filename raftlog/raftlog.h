/*
 * raftlog.h — canonical raft 0.15 (libuv backend) on its own thread. The only code that
 * includes <raft.h>. The master service talks to it only by message.
 *
 * The state machine is opaque bytes to raftlog: commands go in as encoded bytes, results come
 * back as encoded bytes. The FSM callbacks (struct kvp_raftlog_fsm) run on the raft thread only,
 * so the FSM state is owned by that thread.
 *
 * Group commit: commands submitted while the raft thread is busy are packed into one Raft entry
 * (up to group_commit_max), so throughput is not bound by one fsync per request. The entry's
 * payload is a sequence of [u32 len][bytes] commands; apply calls fsm.apply once per command, in
 * order, and each submitter gets its own result.
 *
 * Results and events are delivered as ZeroMQ messages on the `events` socket returned by
 * kvp_raftlog_events() (a PAIR the caller polls; only the raft thread writes to it). Frames:
 *   frame 0: u8 kind (enum kvp_raftlog_event)
 *   frame 1: u64 corr (the id given at submit/query; 0 for leadership events)
 *   frame 2: i32 status (KVP_OK, KVP_ERR_NOT_LEADER, KVP_ERR_UNAVAILABLE, ...)
 *   frame 3: result bytes (may be empty)
 * For KVP_RAFTLOG_EV_LEADER: corr = new leader's id (0 = unknown), status = 1 if this node
 * leads now else 0, frame 3 = u64 term (8 bytes little-endian).
 */
#ifndef KVP_RAFTLOG_H
#define KVP_RAFTLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <czmq.h>

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
};

enum kvp_raftlog_event {
    KVP_RAFTLOG_EV_APPLIED = 1,  /* result of kvp_raftlog_submit */
    KVP_RAFTLOG_EV_QUERY = 2,    /* result of kvp_raftlog_query */
    KVP_RAFTLOG_EV_LEADER = 3,   /* leadership changed (see above) */
    KVP_RAFTLOG_EV_ADMIN = 4,    /* result of add/remove/transfer */
};

struct kvp_raftlog;

/**
 * Start the raft thread: open/create data_dir, bootstrap if empty and not join, load snapshot
 * + log, start the libuv loop. Synchronous: returns once the thread runs (or failed).
 * Errors: KVP_ERR_IO (data dir, bind), KVP_ERR_INVALID, KVP_ERR_NOMEM.
 */
int kvp_raftlog_start(struct kvp_raftlog **out, const struct kvp_raftlog_params *p);

/** The events socket (owned by raftlog; the caller polls and reads it from one thread). */
zsock_t *kvp_raftlog_events(struct kvp_raftlog *rl);

/**
 * Submit one encoded command (copied). Thread-safe, never blocks on I/O. The result arrives as
 * KVP_RAFTLOG_EV_APPLIED with `corr`: status KVP_OK + fsm result once committed and applied on
 * this node, or KVP_ERR_NOT_LEADER (not leader / lost leadership before commit; the command
 * may or may not have been committed — callers make commands idempotent).
 */
int kvp_raftlog_submit(struct kvp_raftlog *rl, uint64_t corr, const uint8_t *cmd, size_t len);

/**
 * Run fsm.query on the raft thread if this node is leader and has heard from a quorum within
 * the election timeout; else KVP_ERR_NOT_LEADER. Result as KVP_RAFTLOG_EV_QUERY.
 */
int kvp_raftlog_query(struct kvp_raftlog *rl, uint64_t corr, const uint8_t *q, size_t len);

/** Admin operations (leader only); results as KVP_RAFTLOG_EV_ADMIN with corr. */
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
};
void kvp_raftlog_get_info(struct kvp_raftlog *rl, struct kvp_raftlog_info *out);

/** Stop the raft thread (close → stop → fini) and free. Accepts NULL; sets *rl to NULL. */
void kvp_raftlog_stop(struct kvp_raftlog **rl);

#endif
