/*
 * raftlog_internal.h — the FSM glue between canonical raft and kvpool's opaque FSM callbacks,
 * split out so that tests drive it on raft's in-memory fixture as well as on the libuv backend.
 *
 * The glue owns: the struct raft_fsm handed to raft_init (apply decodes one entry, see
 * entry.h, and calls the user's apply once per command, in order), the snapshot framing
 * (LZ4 frame + header) and the list of entries this node proposed and that are still in
 * flight. It knows nothing of threads or sockets: results leave through `deliver`.
 * Everything here runs on the thread that runs the raft instance.
 */
#ifndef KVP_RAFTLOG_INTERNAL_H
#define KVP_RAFTLOG_INTERNAL_H

#include <raft.h>
#include <stdbool.h>
#include <stdint.h>

#include "raftlog/entry.h"
#include "metrics/metrics.h"
#include "raftlog/raftlog.h"

/* Snapshot container, version 1 (read only since issue 22): [u32 magic 'KVPS'][u8 1][u64 raw_len]
 * then one LZ4 frame of the FSM's bytes. */
#define KVP_RL_SNAP_MAGIC 0x5350564Bu
#define KVP_RL_SNAP_VERSION 1u
#define KVP_RL_SNAP_HDR_BYTES 13u
/* Version 2 (written): header [u32 'KVPS'][u8 2][u32 n_chunks][u32 n_tail][u64 fsm_raw_len]
 * [u64 total_len][u64 XXH3-64 of the 29 bytes before], then n_chunks FSM chunks
 * [u32 raw_len][u32 lz4_len][u64 XXH3-64 of the lz4 bytes][LZ4 block], whose raw bytes
 * concatenated are the FSM's snapshot as of the build's start, then n_tail log entries applied
 * after that start [u32 len][u64 XXH3-64][entry payload, entry.h], replayed after the FSM
 * restore. total_len covers everything, header included. */
#define KVP_RL_SNAP_VERSION2 2u
#define KVP_RL_SNAP2_HDR_BYTES 37u
#define KVP_RL_SNAP2_CHUNK_HDR 16u
#define KVP_RL_SNAP2_TAIL_HDR 12u
/* Raw bytes per FSM chunk: one chunk is built per raft loop iteration (about 10 ms of encoding
 * and LZ4 on this VM). */
#define KVP_RL_SNAP_CHUNK_RAW ((size_t)256 << 10)
/* Restore refuses a snapshot claiming more than this many uncompressed bytes. */
#define KVP_RL_SNAP_MAX_RAW_BYTES ((uint64_t)16 << 30)

/**
 * Result sink: one call per command of a locally proposed entry. `result` is borrowed for the
 * duration of the call. status: the fsm's return value once applied, or KVP_ERR_NOT_LEADER /
 * KVP_ERR_CLOSED / ... when the entry failed.
 */
typedef void (*kvp_rl_deliver_fn)(void *ctx, uint64_t corr, int status, const uint8_t *result,
                                  size_t result_len);

/** A committed entry whose apply was put off (a follower catching up in steps): a copy of the
 * raft entry's payload. */
struct kvp_rl_deferred {
    struct kvp_rl_deferred *next;
    size_t len;
    uint8_t data[];
};

/** One entry this node proposed with raft_apply, awaiting its callback. */
struct kvp_rl_inflight {
    struct raft_apply req;          /* req.data = this record */
    struct kvp_rl_glue *glue;
    const void *entry_base;         /* payload handed to raft (raft owns it) */
    uint32_t n;                     /* commands in the entry */
    bool delivered;                 /* results already sent by fsm apply */
    bool stored;                    /* seen in the local log (raft.last_stored), store_us counted */
    uint64_t proposed_us;           /* monotonic time of raft_apply (commit latency) */
    struct kvp_rl_inflight *next;
    uint64_t corrs[];               /* n correlation ids, command order */
};

/*
 * The FSM's read view (defined in raftlog.c, the one file of raftlog that holds a lock). The
 * glue enters it around every change of the FSM (write: apply, restore, the swap of a state
 * built in steps) and around snapshot reads (scan: begin and the chunks, which only mark
 * generations that readers never look at). The service reads through kvp_raftlog_read_begin/
 * _end (raftlog.h); the rule is in docs/raftlog.md "Reading committed state". A NULL view
 * does nothing (the fixture, where no other thread reads).
 */
struct kvp_rl_view;
void kvp_rl_view_write_begin(struct kvp_rl_view *v);
void kvp_rl_view_scan_begin(struct kvp_rl_view *v);
/** Leave what write_begin or scan_begin entered. */
void kvp_rl_view_end(struct kvp_rl_view *v);

struct kvp_rl_glue {
    struct raft_fsm fsm;            /* handed to raft_init/raft_fixture_grow; fsm.data = glue */
    struct raft *raft;              /* set once raft is initialised (needed to know our index) */
    struct kvp_raftlog_fsm user;    /* the caller's FSM */
    /* The read view (raftlog.c): entered for writing around user.apply and user.restore, so
     * another thread may read the FSM through kvp_raftlog_read_begin. NULL: no other thread
     * reads it (fixture). */
    struct kvp_rl_view *view;
    kvp_rl_deliver_fn deliver;
    void *deliver_ctx;
    void (*on_done)(void *ctx);     /* an in-flight slot freed (may be NULL) */
    const char *actor;              /* log prefix */
    struct kvp_rl_inflight *inflight; /* oldest first */
    unsigned n_inflight;
    /* counters (raft thread only) */
    uint64_t entries_proposed;
    uint64_t cmds_proposed;
    uint64_t entries_applied;
    uint64_t cmds_applied;
    uint64_t entries_malformed;
    uint64_t entries_committed;     /* own entries applied with results (leader) */
    /* Byte bound on the in-memory log (raft 0.15 only counts entries): once the entries applied
     * since the last snapshot hold snap_log_bytes, the next apply triggers a snapshot (the
     * threshold is dropped to 1 and put back when the snapshot is taken), and the trailing
     * entries kept after it are cut to about snap_log_bytes / 8. 0 = no byte bound. */
    uint64_t snap_log_bytes;
    uint64_t log_bytes;             /* payload bytes applied since the last snapshot */
    uint64_t log_entries;           /* entries applied since the last snapshot */
    unsigned base_threshold;        /* snapshot threshold / trailing in force without the bound */
    unsigned base_trailing;
    bool snap_forced;               /* the threshold is lowered to 1 */
    uint64_t snapshots_by_bytes;
    uint64_t commit_us_total;       /* sum over those of raft_apply → applied, microseconds */
    uint64_t cmds_committed;        /* commands of those entries */
    uint64_t cmd_commit_us_total;   /* per command: raft_apply → applied */
    uint64_t entries_stored;        /* own entries seen stored locally before they applied */
    uint64_t store_us_total;        /* raft_apply → stored, summed over those */
    uint64_t snapshots_taken;
    uint64_t snapshots_restored;
    struct kvp_metrics_hist snapshot_hist; /* fsm snapshot + lz4 framing time of each snapshot taken */
    /* Incremental snapshot (user.snap_begin set): build = 0 idle, 1 building (a chunk per
     * kvp_rl_glue_snap_work), 2 built (raft's threshold is 1 until raft takes it). While
     * building or built, every entry applied is copied into tail (replayed on restore). */
    bool inc;
    int build;
    size_t chunk_raw;               /* raw bytes per chunk; 0 = KVP_RL_SNAP_CHUNK_RAW (tests: small) */
    uint64_t snap_tail_entries;     /* log entries carried in the tails of snapshots taken */
    uint8_t **chunks;               /* framed chunk records */
    size_t *chunk_lens;
    size_t n_chunks, chunks_cap;
    uint64_t build_raw;             /* FSM bytes so far */
    uint64_t build_framed;          /* bytes of the chunk records */
    uint8_t **tail;                 /* framed tail records */
    size_t *tail_lens;
    size_t n_tail, tail_cap;
    uint64_t tail_bytes;
    uint64_t build_t0_us, build_busy_us, build_cpu_us;
    uint64_t max_snap_step_us, max_restore_us, max_apply_us; /* wall time */
    uint64_t max_snap_step_cpu_us, max_apply_cpu_us;         /* the raft thread's CPU time */
    uint64_t holds_logged; /* holds over RL_HOLD_NOTE_CPU_US logged with what they did */
    uint64_t last_snap_wall_us, last_snap_busy_us, last_snap_bytes;
    /* Catching up in steps (docs/raftlog.md "Installing a snapshot in steps"): a snapshot
     * install staged over many kvp_rl_glue_catch_up_step calls, and committed entries a
     * follower applies later than raft hands them over (behind a staged install, or past
     * apply_budget_us of applies in one loop iteration). raft counts those entries applied; the
     * FSM lags until the queue drains. A leader, a query, a snapshot that needs the FSM, or an
     * entry of this node's own catch up at once (kvp_rl_glue_catch_up). */
    bool steps;                     /* on once raft has started (a start-up restore: one piece) */
    uint64_t apply_budget_us;       /* applies per loop iteration on a follower; 0 = no bound */
    /* Backlog bound, in work (queued entries x the mean apply time of an entry): over it the
     * idle steps get half of it per loop iteration instead of the usual step
     * (kvp_rl_glue_catch_up_budget_us). Since session 31 (second half) it no longer makes an
     * arriving entry apply queued ones inside raft's callback: a burst handed over at once
     * queues whole and is applied over several iterations. 0 = no bound. */
    uint64_t defer_max_us;
    /* Memory bound of the queue (payload bytes): an entry that would take it past this applies
     * the oldest queued entries first, inside raft's callback (the raft thread is held, memory
     * stays bounded). Not applied behind a staged install. 0 = no bound. */
    uint64_t defer_max_bytes;
    uint64_t apply_mean_us;         /* moving mean of one entry's apply, wall time */
    uint64_t iter_seq;              /* bumped once per loop iteration (kvp_rl_glue_next_iteration) */
    uint64_t apply_iter, apply_iter_t0_us;
    size_t restore_step_bytes;      /* per user.restore_step call; 0 = 64 KiB */
    int rs;                         /* staged install: 0 none, 1 decompressing, 2 FSM steps,
                                       3 the old state being freed (the new one is live) */
    void *rs_snap;                  /* raft's snapshot buffer (ours once restore returned 0) */
    const uint8_t *rs_next;         /* next chunk record */
    uint64_t rs_chunks_left;
    uint8_t *rs_raw;                /* the FSM bytes, decompressed chunk by chunk */
    size_t rs_raw_len, rs_raw_off;
    void *rs_h;                     /* user.restore_begin's handle */
    uint64_t rs_t0_us, rs_busy_us, rs_steps;
    struct kvp_rl_deferred *q_head, *q_tail;
    uint64_t q_len;
    uint64_t q_bytes;               /* payload bytes of the queued entries */
    uint64_t iter_applied;          /* entries applied in this loop iteration (any path) */
    uint64_t max_iter_applied;      /* most entries applied in one loop iteration */
    uint64_t entries_deferred, restores_in_steps;
    uint64_t max_backlog_applied; /* most deferred entries applied at once at the memory bound */
    uint64_t max_catchup_step_us, max_catchup_step_cpu_us;
    /* A staged install failed after raft was told it succeeded (the FSM bytes did not decode):
     * the state is behind raft's, nothing more is applied, and raftlog stops the member. */
    bool failed;
    char failed_why[160];
};

void kvp_rl_glue_init(struct kvp_rl_glue *g, const struct kvp_raftlog_fsm *user,
                      kvp_rl_deliver_fn deliver, void *ctx, const char *actor);
/** Free in-flight records without callbacks: only once raft is closed (no callback can come). */
void kvp_rl_glue_fini(struct kvp_rl_glue *g);

/**
 * Encode cmds[0..n) as ONE entry and raft_apply it. On success the results arrive through
 * deliver (one per corr). On error nothing is delivered and the caller still owns the
 * commands: KVP_ERR_NOT_LEADER, KVP_ERR_INVALID, KVP_ERR_NOMEM, KVP_ERR_CLOSED, KVP_ERR_INTERNAL.
 */
int kvp_rl_glue_propose(struct kvp_rl_glue *g, const uint64_t *corrs, const struct kvp_rl_cmd *cmds,
                        uint32_t n);

/** Mark the in-flight entries raft has stored in the local log (raft.last_stored) and count
 * their raft_apply → stored time. Cheap (walks at most the in-flight cap); the raft thread
 * calls it after every loop iteration. */
void kvp_rl_glue_note_stored(struct kvp_rl_glue *g);

/** Map a raft error code (RAFT_*) to a kvp_err. */
int kvp_rl_err_from_raft(int rv);

/* raftlog.c: every raft message goes through this on its way to raft_uv's send (`inner`). A
 * message to no known server (NULL address or id 0: libraft 0.15 answers a follower's finished
 * log write to a leader it no longer knows, and raft_uv's send then crashes in strlen) is
 * refused with RAFT_NOCONNECTION (raft frees the request, no callback) and counted in *dropped.
 * Raft thread only. */
typedef int (*kvp_rl_io_send_fn)(struct raft_io *io, struct raft_io_send *req, const struct raft_message *message,
                                 raft_io_send_cb cb);
int kvp_rl_send_checked(struct raft_io *io, struct raft_io_send *req, const struct raft_message *message,
                        raft_io_send_cb cb, kvp_rl_io_send_fn inner, uint64_t *dropped, const char *actor);
/** raft_strerror for log lines, with the codes it calls "unknown error" (RAFT_NOSPACE: a full
 * disk) named. */
const char *kvp_rl_strerror(int rv);

/** Incremental snapshot: true while a build wants more kvp_rl_glue_snap_work calls. */
bool kvp_rl_glue_snap_pending(const struct kvp_rl_glue *g);
/** One step of the build: the next FSM chunk, LZ4-compressed (about KVP_RL_SNAP_CHUNK_RAW raw
 * bytes). When the last one is in, raft's threshold drops to 1 so raft takes the snapshot after
 * its next apply. Returns KVP_OK or the error that dropped the build (logged). */
int kvp_rl_glue_snap_work(struct kvp_rl_glue *g);
/** Start a build now if none runs (tests; raftlog starts them from the thresholds). */
int kvp_rl_glue_snap_start(struct kvp_rl_glue *g);
/** Drop a build (and its chunks). */
void kvp_rl_glue_snap_drop(struct kvp_rl_glue *g);

/** True while the FSM is behind raft: a staged install or deferred entries remain. */
bool kvp_rl_glue_behind(const struct kvp_rl_glue *g);
/** The budget for this iteration's kvp_rl_glue_catch_up_step: step_us, or half of defer_max_us
 *  while the queue of deferred entries holds more than defer_max_us of work (not behind a staged
 *  install). */
uint64_t kvp_rl_glue_catch_up_budget_us(const struct kvp_rl_glue *g, uint64_t step_us);
/** True while kvp_rl_glue_catch_up_step has anything to do (behind, or an old state to free). */
bool kvp_rl_glue_catch_up_pending(const struct kvp_rl_glue *g);
/** A new loop iteration: the per-iteration apply budget starts again. */
void kvp_rl_glue_next_iteration(struct kvp_rl_glue *g);
/** Catch-up work for about budget_us of wall time (0: one unit — a chunk, a restore step, an
 * entry), install steps first, then deferred entries, then freeing the replaced state.
 * KVP_OK, or the error that failed a staged install (g->failed, logged). */
int kvp_rl_glue_catch_up_step(struct kvp_rl_glue *g, uint64_t budget_us);
/** Catch up completely now (a leader, a query, a snapshot): one piece. */
int kvp_rl_glue_catch_up(struct kvp_rl_glue *g);

/** Snapshot framing, exposed for tests. *out is malloc'd (free()). kvp_rl_snap_pack writes the
 * version-1 container (kept to produce old-format snapshots for the upgrade test). */
int kvp_rl_snap_pack(const uint8_t *raw, size_t raw_len, uint8_t **out, size_t *out_len);
int kvp_rl_snap_unpack(const uint8_t *buf, size_t len, uint8_t **raw, size_t *raw_len);
/** Check a whole snapshot (either container version) without restoring it: KVP_OK, or
 * KVP_ERR_MALFORMED / KVP_ERR_VERSION with *why naming what is wrong. */
int kvp_rl_snap_check(const uint8_t *buf, size_t len, const char **why);

#endif
