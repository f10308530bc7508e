/*
 * raftlog_thread.h — the raft thread's private state, shared by raftlog.c (the thread, its
 * submission queue and the FSM's read view) and raftlog_io.c (raft_uv's log writes and sends,
 * wrapped). Not for use outside raftlog/. The locks named here are taken only in raftlog.c.
 */
#ifndef KVP_RAFTLOG_THREAD_H
#define KVP_RAFTLOG_THREAD_H

#include <pthread.h>
#include <raft.h>
#include <raft/uv.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "raftlog/raftlog.h"
#include "raftlog/raftlog_internal.h"

enum op_kind { OP_SUBMIT, OP_QUERY, OP_ADD_VOTER, OP_REMOVE, OP_TRANSFER };

/* One request from a caller thread to the raft thread. */
struct rl_op {
    enum op_kind kind;
    uint64_t corr;
    uint64_t id;          /* admin target */
    char addr[256];       /* add_voter */
    size_t len;           /* data bytes */
    uint32_t cost;        /* apply cost (kvp_raftlog_submit_cost), at least 1 */
    uint64_t queued_us;   /* monotonic time of enqueue (submit latency counters) */
    struct rl_op *next;
    uint8_t data[];
};

/* An admin call in flight (raft_change / raft_transfer need stable memory). */
struct rl_admin {
    struct kvp_raftlog *rl;
    enum op_kind kind;
    uint64_t corr;
    uint64_t id;
    struct raft_change change;
    struct raft_change assign;
    struct raft_transfer transfer;
    struct rl_admin *next;
};


/* The FSM's read view (raftlog.c). */
struct kvp_rl_view;

struct kvp_raftlog {
    struct kvp_raftlog_params p;
    char actor[32];
    pthread_t thread;
    bool thread_started;

    /* mu guards: q_*, closing, start_done, start_rc, info. This queue is the raft thread's
     * mailbox (with its uv_async_t as the wake-up): the raft thread is libuv's loop, which owns the
     * canonical raft instance and must keep running it (issue 23: raft's libuv thread stays the
     * raft actor's loop), so a runtime mailbox polled by another loop would not do. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct rl_op *q_head, *q_tail;
    bool closing;
    bool start_done;
    int start_rc;
    struct kvp_raftlog_info info;

    /* raft thread only */
    uv_loop_t loop;
    uv_async_t async;
    uv_timer_t timer;
    uv_check_t check; /* after every loop iteration's I/O: read_lease_refresh */
    uv_prepare_t prep; /* before the loop waits: batch_flush (params.batch_applied) */
    bool async_inited, timer_inited, check_inited, prep_inited;
    /* Incremental snapshot: while a build runs, an idle handle makes every loop iteration poll
     * for I/O without blocking and then build one chunk (kvp_rl_glue_snap_work). */
    uv_idle_t snap_idle;
    bool snap_idle_inited, snap_idle_on;
    bool slot_freed;          /* an in-flight entry settled: pump (or close) in on_check */
    uint64_t last_tick_us;    /* when on_tick last ran (stall measurement) */
    uint64_t last_tick_cpu_us; /* the raft thread's CPU time then */
    /* The glue's counts and the thread's minor faults at the last tick: a busy stall over 50 ms
     * is logged with what ran in it (issue 22). */
    uint64_t last_tick_entries, last_tick_cmds, last_tick_rs_steps, last_tick_restored;
    long last_tick_minflt;
    uint64_t max_stall_us;    /* largest tick lateness: the raft thread's longest stall */
    uint64_t max_busy_stall_us; /* the part of a lateness the thread spent on its own CPU work */
    struct raft_uv_transport transport;
    /* raft_uv_tcp's own connect, wrapped by rl_connect (TCP_NODELAY on Raft connections) */
    int (*tcp_connect)(struct raft_uv_transport *t, struct raft_uv_connect *req, raft_id id,
                       const char *address, raft_uv_connect_cb cb);
    struct raft_io io;
    /* Log writes (rl_append*): raft_uv's own append, wrapped. Raft thread only. */
    int (*uv_append)(struct raft_io *io, struct raft_io_append *req, const struct raft_entry entries[],
                     unsigned n, raft_io_append_cb cb);
    /* raft_uv's own send, wrapped by rl_send (a message to no address is dropped). */
    kvp_rl_io_send_fn uv_send;
    uint64_t sends_no_address;     /* messages dropped by rl_send: to a leader no longer known */
    bool log_failed;               /* a write failed: nothing more is written or answered */
    bool install_failed_sent;      /* a failed staged install was reported (EV_LOG_FAILED) */
    struct rl_append *held;        /* appends never answered since then (freed at close) */
    struct raft_transfer log_transfer; /* handover after a failed write or a run of slow ones */
    bool log_transfer_busy;
    uint64_t slow_since_ms;        /* start of the current run of slow appends (0 = none) */
    unsigned slow_count;           /* appends in that run */
    uint64_t slow_handover_ms;     /* last handover for slow writes */
#ifdef KVP_FAULT_INJECTION
    char fault_file[256];          /* $KVP_RAFTLOG_FAULT_FILE; "" = off */
    uint64_t fault_read_ms;        /* when the file was last read */
    int fault_mode;                /* 0 none, 1 nospace, 2 slow */
    unsigned fault_ms;             /* slow: completion delay */
#endif
    struct raft raft;
    struct kvp_rl_glue glue;
    struct rl_op *pend_head, *pend_tail; /* submits taken from the queue, not yet proposed */
    struct rl_op *qwait_head;            /* queries waiting for the new leader's barrier */
    struct rl_admin *admins;
    struct raft_barrier barrier;
    bool barrier_pending;
    uint64_t ready_term;                 /* term whose barrier has applied (reads allowed) */
    uint64_t last_leader;
    uint64_t last_term;
    int last_is_leader;
    bool raft_closing;        /* stop begun: nothing new is proposed */
    bool raft_closed_called;  /* raft_close issued */
    uint64_t close_deadline_ms;
    uint64_t started_ms;
    unsigned max_inflight;
    uint64_t trimmed_at_snapshot; /* glue.snapshots_taken at the last malloc_trim */
    uint32_t group_max;
    uint32_t entry_max_cost; /* params.entry_max_cost or RL_DEFAULT_ENTRY_COST */
    uint64_t cmd_queue_us_total; /* submit → raft_apply, summed over proposed commands */

    /* Local reads: the view (below) is entered for writing around every fsm apply and restore
     * (glue) and for reading by kvp_raftlog_read_begin..end. read_until_us (monotonic µs, 0 =
     * none): until when a local read may trust this node's leadership. */
    struct kvp_rl_view *view; /* raftlog.c */
    _Atomic uint64_t read_until_us;

    zsock_t *ev_reader; /* caller side */
    zsock_t *ev_writer; /* raft thread side */
    /* params.batch_applied: EV_APPLIED records waiting for the end of this loop iteration
     * (raftlog.c, batch_flush); raft thread only. */
    uint8_t *batch_buf;
    size_t batch_len, batch_cap;
    uint64_t batch_n;
};

/* A log write handed to raft_uv (raftlog_io.c); held ones are freed by raftlog.c at close. */
struct rl_append {
    struct raft_io_append inner;   /* handed to raft_uv */
    struct raft_io_append *orig;   /* raft's request */
    raft_io_append_cb cb;          /* raft's callback */
    struct kvp_raftlog *rl;
    uint64_t t0_ms;                /* when raft asked for it */
    int status;
    bool timer_used, held;
    uv_timer_t timer;              /* fault injection: a delayed or failed completion */
    struct rl_append *next;        /* held list */
};

/* raftlog.c: send an event to the owner (raft thread only). */
void kvp_rl_ev_send(struct kvp_raftlog *rl, uint8_t kind, uint64_t corr, int32_t status, const void *data,
                    size_t len);
/* raftlog_io.c: wrap raft_uv's append and send (and, in test builds, the fault file). Raft
 * thread, once, after raft_uv_init. */
void kvp_rl_io_install(struct kvp_raftlog *rl);

#endif
