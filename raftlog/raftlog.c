/*
 * raftlog.c — the raft thread: libuv loop, raft_uv + TCP transport, the submission queue
 * (mutex + uv_async_t), group commit, leadership polling, admin calls, events PAIR socket.
 * See raftlog.h for the contract and docs/raftlog.md for the behaviour notes.
 *
 * Threads and locks (issue 23: raft's libuv thread stays the raft actor's loop): this file starts
 * the raft thread, guards its submission queue with `mu` (why not a runtime mailbox: at struct
 * kvp_raftlog) and holds the FSM's read view (why not a message: at struct kvp_rl_view). No other
 * file of raftlog/ takes a lock or starts a thread.
 */
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np */
#include "raftlog/raftlog.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <raft.h>
#include <raft/uv.h>
#include <stdatomic.h>
#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <sys/stat.h>
#include <uv.h>

#include "kvpool.h"
#include "raftlog/raftlog_internal.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define RL_TICK_MS 20
/* Catching up in steps (docs/raftlog.md "Installing a snapshot in steps"): a follower applies
 * committed entries for at most RL_APPLY_BUDGET_US per loop iteration and defers the rest; the
 * idle handle then does RL_CATCHUP_STEP_US of install or deferred applies per iteration. */
#define RL_APPLY_BUDGET_US 10000u
#define RL_CATCHUP_STEP_US 5000u
#define RL_DEFER_MAX_US 200000u /* a follower's backlog of deferred applies, in apply time */
#define RL_MIN_UPTIME_MS 1000
#define RL_DEFAULT_GROUP_MAX 256
#define RL_DEFAULT_INFLIGHT 4
/* Stop adding commands to an entry past this size. Every node applies an entry in one go on its
 * raft thread, so its size bounds that stall: 1 MiB of metadata puts (~20k objects) applies in
 * tens of ms on this VM; at 4 MiB the longest apply was ~200 ms (issue 22). */
#define RL_ENTRY_SOFT_BYTES (1u << 20)
/* A local read (kvp_raftlog_read_begin) trusts leadership the raft thread confirmed at most this
 * long ago. The raft thread re-confirms after every loop iteration (uv_check) and before every
 * event it sends; with nothing else to do it still wakes every tick (RL_TICK_MS), so two ticks
 * let one late tick pass without sending reads to the slow path. */
#define RL_READ_FRESH_US (2u * RL_TICK_MS * 1000u)

enum op_kind { OP_SUBMIT, OP_QUERY, OP_ADD_VOTER, OP_REMOVE, OP_TRANSFER };

/* One request from a caller thread to the raft thread. */
struct rl_op {
    enum op_kind kind;
    uint64_t corr;
    uint64_t id;          /* admin target */
    char addr[256];       /* add_voter */
    size_t len;           /* data bytes */
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

/*
 * The FSM's read view: a reader-writer lock that lets the service thread read committed state
 * (kvp_raftlog_read_begin/_end) while the raft thread applies. The glue (raftlog_fsm.c) enters
 * it only through kvp_rl_view_* (raftlog_internal.h), so this is raftlog's only file with a
 * lock. Why not a message: a query (kvp_raftlog_query, answered on the events socket) already
 * exists and is the fallback, but each would cost two thread hand-offs per read, and
 * GetReplicaList/Exists/GetSize are the master's hottest calls (local reads measured 1.8k →
 * 4.6k/s at one caller, docs/raftlog.md "Local reads"). Readers hold it for one lookup and copy
 * out; the raft thread holds it for one command at a time. The rule: docs/raftlog.md "Reading
 * committed state".
 */
struct kvp_rl_view {
    pthread_rwlock_t lock; /* writer-preferring: the one applying thread never waits behind reads */
    bool inited;
};

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
    bool async_inited, timer_inited, check_inited;
    /* Incremental snapshot: while a build runs, an idle handle makes every loop iteration poll
     * for I/O without blocking and then build one chunk (kvp_rl_glue_snap_work). */
    uv_idle_t snap_idle;
    bool snap_idle_inited, snap_idle_on;
    bool slot_freed;          /* an in-flight entry settled: pump (or close) in on_check */
    uint64_t last_tick_us;    /* when on_tick last ran (stall measurement) */
    uint64_t last_tick_cpu_us; /* the raft thread's CPU time then */
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
    uint64_t cmd_queue_us_total; /* submit → raft_apply, summed over proposed commands */

    /* Local reads: the view (below) is entered for writing around every fsm apply and restore
     * (glue) and for reading by kvp_raftlog_read_begin..end. read_until_us (monotonic µs, 0 =
     * none): until when a local read may trust this node's leadership. */
    struct kvp_rl_view view;
    _Atomic uint64_t read_until_us;

    zsock_t *ev_reader; /* caller side */
    zsock_t *ev_writer; /* raft thread side */
};

static atomic_uint g_instance_seq;

/* ------------------------------------------------------------------ the FSM's read view */

void kvp_rl_view_write_begin(struct kvp_rl_view *v)
{
    if (v != NULL)
        pthread_rwlock_wrlock(&v->lock);
}

void kvp_rl_view_scan_begin(struct kvp_rl_view *v)
{
    if (v != NULL)
        pthread_rwlock_rdlock(&v->lock);
}

void kvp_rl_view_end(struct kvp_rl_view *v)
{
    if (v != NULL)
        pthread_rwlock_unlock(&v->lock);
}

/* ---- log writes (raft thread only; docs/raftlog.md "When the log cannot be written") ----
 * raft_uv's append is always wrapped (rl_append):
 *  - A write that fails (a full disk, an I/O error) is never handed back to raft: libraft 0.15
 *    crashes (SIGSEGV in the raft thread) when a leader's append completes with an error (found
 *    with the fault injection below), and raft_uv marks itself errored after a failed write, so
 *    no later write of this member can succeed before a restart. So the append is held, never
 *    answered, as is every later one; a leader hands leadership over; the owner is told
 *    (KVP_RAFTLOG_EV_LOG_FAILED) and stops the process, for its supervisor to start it again
 *    once the disk is fixed. The other members go on committing: nothing committed is lost.
 *  - Slow writes: when every append completed for RL_SLOW_RUN_MS took longer than
 *    max(election_timeout / 2, 100 ms) (at least RL_SLOW_MIN_APPENDS of them), a leader hands
 *    leadership over (at most once per RL_SLOW_REARM_MS): a slow disk delays every commit, and
 *    a member with a healthy disk can lead instead.
 * Fault injection (test builds, $KVP_RAFTLOG_FAULT_FILE, re-read at most every 100 ms): missing
 * or empty = no fault; "nospace" = an append is not written and completes with RAFT_NOSPACE, as
 * on a full disk; "slow MS" = an append is written and its completion comes MS ms late. Both go
 * through the same completion path as real writes. */
#define RL_SLOW_RUN_MS 2000u
#define RL_SLOW_MIN_APPENDS 3u
#define RL_SLOW_REARM_MS 10000u

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

static void ev_send(struct kvp_raftlog *rl, uint8_t kind, uint64_t corr, int32_t status, const void *data,
                    size_t len);

static void rl_log_transfer_cb(struct raft_transfer *req)
{
    struct kvp_raftlog *rl = (struct kvp_raftlog *)((char *)req - offsetof(struct kvp_raftlog, log_transfer));
    rl->log_transfer_busy = false;
}

/* Hand leadership to the most up-to-date follower (raft_transfer with id 0), if leading. */
static void rl_log_handover(struct kvp_raftlog *rl, const char *why)
{
    if (raft_state(&rl->raft) != RAFT_LEADER || rl->log_transfer_busy)
        return;
    int rv = raft_transfer(&rl->raft, &rl->log_transfer, 0, rl_log_transfer_cb);
    rl->log_transfer_busy = rv == 0;
    kvp_log_warn(rl->actor, "%s: handing leadership over (%s)", why, rv == 0 ? "transfer started" : kvp_rl_strerror(rv));
}

static void rl_append_free(uv_handle_t *h)
{
    struct rl_append *w = h->data;
    if (!w->held)
        free(w);
}

static void rl_append_release(struct rl_append *w)
{
    if (w->timer_used)
        uv_close((uv_handle_t *)&w->timer, rl_append_free);
    else if (!w->held)
        free(w);
}

static void rl_append_hold(struct kvp_raftlog *rl, struct rl_append *w)
{
    w->held = true;
    w->next = rl->held;
    rl->held = w;
}

/* Every append's completion, real or injected. */
static void rl_append_done(struct rl_append *w, int status)
{
    struct kvp_raftlog *rl = w->rl;
    if (rl->raft_closed_called) { /* never call into a closed raft */
        rl_append_release(w);
        return;
    }
    if (status != 0 || rl->log_failed) {
        if (!rl->log_failed) {
            rl->log_failed = true;
            char msg[512];
            snprintf(msg, sizeof msg, "raft log write failed: %s (%s): this member cannot write its log any more",
                     kvp_rl_strerror(status), rl->io.errmsg[0] ? rl->io.errmsg : "no detail");
            kvp_log_error(rl->actor, "%s; no further write is answered", msg);
            rl_log_handover(rl, "raft log write failed");
            ev_send(rl, KVP_RAFTLOG_EV_LOG_FAILED, 0, KVP_ERR_IO, msg, strlen(msg));
        }
        rl_append_hold(rl, w);
        rl_append_release(w);
        return;
    }
    uint64_t now = kvp_clock_now_ms();
    uint64_t slow_ms = rl->p.election_timeout_ms / 2 > 100 ? rl->p.election_timeout_ms / 2 : 100;
    if (now - w->t0_ms > slow_ms) {
        if (rl->slow_count++ == 0)
            rl->slow_since_ms = w->t0_ms;
        if (rl->slow_count >= RL_SLOW_MIN_APPENDS && now - rl->slow_since_ms >= RL_SLOW_RUN_MS &&
            (rl->slow_handover_ms == 0 || now - rl->slow_handover_ms >= RL_SLOW_REARM_MS) &&
            raft_state(&rl->raft) == RAFT_LEADER) {
            rl->slow_handover_ms = now;
            char why[160];
            snprintf(why, sizeof why, "raft log writes slow: %u appends over %llu ms each took more than %llu ms",
                     rl->slow_count, (unsigned long long)(now - rl->slow_since_ms), (unsigned long long)slow_ms);
            rl_log_handover(rl, why);
        }
    } else {
        rl->slow_count = 0;
        rl->slow_since_ms = 0;
    }
    raft_io_append_cb cb = w->cb;
    struct raft_io_append *orig = w->orig;
    rl_append_release(w);
    cb(orig, 0);
}

static void rl_append_inner_cb(struct raft_io_append *req, int status);

#ifdef KVP_FAULT_INJECTION
static void rl_fault_read(struct kvp_raftlog *rl)
{
    uint64_t now = kvp_clock_now_ms();
    if (rl->fault_read_ms && now - rl->fault_read_ms < 100)
        return;
    rl->fault_read_ms = now;
    int mode = 0;
    unsigned ms = 0;
    FILE *f = fopen(rl->fault_file, "r");
    if (f) {
        char buf[64] = "";
        if (fgets(buf, sizeof buf, f)) {
            if (strncmp(buf, "nospace", 7) == 0)
                mode = 1;
            else if (sscanf(buf, "slow %u", &ms) == 1 && ms > 0)
                mode = 2;
        }
        fclose(f);
    }
    if (mode != rl->fault_mode || ms != rl->fault_ms)
        kvp_log_warn(rl->actor, "fault injection: raft log writes %s", mode == 1 ? "fail (no space)"
                                                                     : mode == 2 ? "are slow"
                                                                                 : "are normal again");
    rl->fault_mode = mode;
    rl->fault_ms = ms;
}

static void rl_fault_fire(uv_timer_t *t)
{
    struct rl_append *w = t->data;
    rl_append_done(w, w->status);
}

/* Deliver w's completion (status) after ms, from the loop. */
static void rl_fault_later(struct rl_append *w, int status, unsigned ms)
{
    w->status = status;
    w->timer_used = true;
    uv_timer_init(&w->rl->loop, &w->timer);
    w->timer.data = w;
    uv_timer_start(&w->timer, rl_fault_fire, ms, 0);
}

static void rl_fault_inner_cb(struct raft_io_append *req, int status)
{
    struct rl_append *w = req->data;
    rl_fault_later(w, status, w->rl->fault_ms);
}

static void rl_fault_install(struct kvp_raftlog *rl)
{
    const char *f = getenv("KVP_RAFTLOG_FAULT_FILE");
    if (!f || !*f || strlen(f) >= sizeof rl->fault_file)
        return;
    snprintf(rl->fault_file, sizeof rl->fault_file, "%s", f);
    kvp_log_warn(rl->actor, "fault injection: raft log writes follow %s", rl->fault_file);
}
#endif

static void rl_append_inner_cb(struct raft_io_append *req, int status)
{
    rl_append_done(req->data, status);
}

static int rl_append(struct raft_io *io, struct raft_io_append *req, const struct raft_entry entries[], unsigned n,
                     raft_io_append_cb cb)
{
    struct kvp_raftlog *rl = (struct kvp_raftlog *)((char *)io - offsetof(struct kvp_raftlog, io));
    struct rl_append *w = calloc(1, sizeof *w);
    if (!w)
        return RAFT_NOMEM;
    w->orig = req;
    w->cb = cb;
    w->rl = rl;
    w->t0_ms = kvp_clock_now_ms();
    w->inner.data = w;
    if (rl->log_failed) { /* raft_uv is errored: never write, never answer */
        rl_append_hold(rl, w);
        return 0;
    }
    raft_io_append_cb inner_cb = rl_append_inner_cb;
#ifdef KVP_FAULT_INJECTION
    if (rl->fault_file[0]) {
        rl_fault_read(rl);
        if (rl->fault_mode == 1) { /* a full disk: not written, fails on the next loop turn */
            rl_fault_later(w, RAFT_NOSPACE, 0);
            return 0;
        }
        if (rl->fault_mode == 2)
            inner_cb = rl_fault_inner_cb;
    }
#endif
    int rv = rl->uv_append(io, &w->inner, entries, n, inner_cb);
    if (rv != 0)
        free(w);
    return rv;
}

/* libraft 0.15 answers a follower's log write, once it is on disk, with an AppendEntriesResult
 * to the leader it knew when the entries came (follower_state.current_leader). If the term
 * moved meanwhile (a RequestVote of a higher term: the follower no longer knows a leader), that
 * address is NULL and raft_uv's send crashes in strlen (uvGetClient copying the address): the
 * master SIGSEGV in the raft thread seen in the issue-22 scale bench under elections (core:
 * strlen <- uvSend <- sendAppendEntriesResult <- appendFollowerCb; canonical/raft issue 339,
 * fixed upstream after 0.15 by not answering when the term changed). Such a message is
 * refused here (raft frees the request; no callback): the new leader learns the follower's log
 * from its own AppendEntries, as upstream does. */
int kvp_rl_send_checked(struct raft_io *io, struct raft_io_send *req, const struct raft_message *message,
                        raft_io_send_cb cb, kvp_rl_io_send_fn inner, uint64_t *dropped, const char *actor)
{
    if (message->server_address == NULL || message->server_id == 0) {
        if ((*dropped)++ % 1000 == 0)
            kvp_log_info(actor, "raft message of type %d to no known server dropped (%llu so far)",
                         (int)message->type, (unsigned long long)*dropped);
        return RAFT_NOCONNECTION;
    }
    return inner(io, req, message, cb);
}

static int rl_send(struct raft_io *io, struct raft_io_send *req, const struct raft_message *message,
                   raft_io_send_cb cb)
{
    struct kvp_raftlog *rl = (struct kvp_raftlog *)((char *)io - offsetof(struct kvp_raftlog, io));
    return kvp_rl_send_checked(io, req, message, cb, rl->uv_send, &rl->sends_no_address, rl->actor);
}

static void rl_append_install(struct kvp_raftlog *rl)
{
    rl->uv_append = rl->io.append;
    rl->io.append = rl_append;
    rl->uv_send = rl->io.send;
    rl->io.send = rl_send;
#ifdef KVP_FAULT_INJECTION
    rl_fault_install(rl);
#endif
}

/* ---- events (raft thread only) ---- */

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void read_lease_refresh(struct kvp_raftlog *rl);

static void ev_send(struct kvp_raftlog *rl, uint8_t kind, uint64_t corr, int32_t status,
                    const void *data, size_t len)
{
    /* Nothing leaves this thread (an applied result, a leader change, a finished transfer)
     * while the local-read permission still claims a leadership this thread knows is gone. */
    read_lease_refresh(rl);
    void *s = zsock_resolve(rl->ev_writer);
    uint8_t c[8], st[4];
    put_le64(c, corr);
    for (int i = 0; i < 4; i++)
        st[i] = (uint8_t)((uint32_t)status >> (8 * i));
    /* SNDHWM is 0 (unlimited): these never block the raft thread. */
    if (zmq_send(s, &kind, 1, ZMQ_SNDMORE) < 0 || zmq_send(s, c, 8, ZMQ_SNDMORE) < 0 ||
        zmq_send(s, st, 4, ZMQ_SNDMORE) < 0 || zmq_send(s, data, len, 0) < 0)
        kvp_log_error(rl->actor, "event %u corr %llu lost: %s", kind, (unsigned long long)corr,
                      zmq_strerror(zmq_errno()));
}

static void deliver_applied(void *ctx, uint64_t corr, int status, const uint8_t *res, size_t len)
{
    ev_send(ctx, KVP_RAFTLOG_EV_APPLIED, corr, status, res, len);
}

/* ---- state polling ---- */

static void update_info(struct kvp_raftlog *rl)
{
    struct raft *r = &rl->raft;
    raft_id lid = 0;
    const char *laddr = NULL;
    raft_leader(r, &lid, &laddr);
    pthread_mutex_lock(&rl->mu);
    struct kvp_raftlog_info *in = &rl->info;
    in->id = rl->p.id;
    in->leader_id = lid;
    in->term = r->current_term;
    in->is_leader = raft_state(r) == RAFT_LEADER;
    in->commit_index = r->commit_index;
    in->last_applied = raft_last_applied(r);
    in->n_members = 0;
    for (unsigned i = 0; i < r->configuration.n && in->n_members < 9; i++) {
        struct kvp_raftlog_member *m = &in->members[in->n_members++];
        m->id = r->configuration.servers[i].id;
        snprintf(m->raft_address, sizeof(m->raft_address), "%s",
                 r->configuration.servers[i].address);
    }
    in->entries_proposed = rl->glue.entries_proposed;
    in->cmds_proposed = rl->glue.cmds_proposed;
    in->snapshots_taken = rl->glue.snapshots_taken;
    in->snapshots_restored = rl->glue.snapshots_restored;
    in->entries_committed = rl->glue.entries_committed;
    in->commit_us_total = rl->glue.commit_us_total;
    in->snapshots_by_bytes = rl->glue.snapshots_by_bytes;
    in->log_bytes = rl->glue.log_bytes;
    in->cmds_committed = rl->glue.cmds_committed;
    in->cmd_queue_us_total = rl->cmd_queue_us_total;
    in->cmd_commit_us_total = rl->glue.cmd_commit_us_total;
    in->entries_stored = rl->glue.entries_stored;
    in->store_us_total = rl->glue.store_us_total;
    in->snapshot_hist = rl->glue.snapshot_hist;
    in->max_stall_us = rl->max_stall_us;
    in->max_busy_stall_us = rl->max_busy_stall_us;
    in->max_snap_step_us = rl->glue.max_snap_step_us;
    in->max_apply_us = rl->glue.max_apply_us;
    in->max_snap_step_cpu_us = rl->glue.max_snap_step_cpu_us;
    in->max_apply_cpu_us = rl->glue.max_apply_cpu_us;
    in->max_restore_us = rl->glue.max_restore_us;
    in->last_snap_wall_us = rl->glue.last_snap_wall_us;
    in->last_snap_busy_us = rl->glue.last_snap_busy_us;
    in->last_snap_bytes = rl->glue.last_snap_bytes;
    in->entries_deferred = rl->glue.entries_deferred;
    in->restores_in_steps = rl->glue.restores_in_steps;
    in->max_catchup_step_us = rl->glue.max_catchup_step_us;
    in->max_catchup_step_cpu_us = rl->glue.max_catchup_step_cpu_us;
    in->deferred_now = rl->glue.q_len;
    in->fsm_behind = kvp_rl_glue_behind(&rl->glue);
    pthread_mutex_unlock(&rl->mu);
}

static void run_query(struct kvp_raftlog *rl, struct rl_op *op)
{
    uint8_t *res = NULL;
    size_t res_len = 0;
    int st = KVP_ERR_UNSUPPORTED;
    if (kvp_rl_glue_behind(&rl->glue) && kvp_rl_glue_catch_up(&rl->glue) != KVP_OK)
        st = KVP_ERR_UNAVAILABLE; /* a failed install: the member is stopping */
    else if (rl->p.fsm.query != NULL)
        st = rl->p.fsm.query(rl->p.fsm.ctx, op->data, op->len, &res, &res_len);
    ev_send(rl, KVP_RAFTLOG_EV_QUERY, op->corr, st, res, res != NULL ? res_len : 0);
    free(res);
}

static void flush_query_waiters(struct kvp_raftlog *rl, int status)
{
    while (rl->qwait_head != NULL) {
        struct rl_op *op = rl->qwait_head;
        rl->qwait_head = op->next;
        if (status == KVP_OK)
            run_query(rl, op);
        else
            ev_send(rl, KVP_RAFTLOG_EV_QUERY, op->corr, status, NULL, 0);
        free(op);
    }
}

/* Re-confirm (or withdraw) the local-read permission: leader, its term's barrier applied, not
 * closing, not handing leadership over (raft_transfer: the target may be elected and commit
 * at any moment, while this node still reads RAFT_LEADER until a message of the new term
 * arrives). Called after every loop iteration (uv_check: a step-down caused by a message or by
 * raft's own tick withdraws it before the thread sleeps again), on every tick, and before
 * every event goes out; the 40 ms bound covers a thread that stops running. */
static void read_lease_refresh(struct kvp_raftlog *rl)
{
    uint64_t until = 0;
    if (!rl->raft_closing && raft_state(&rl->raft) == RAFT_LEADER && rl->raft.transfer == NULL &&
        rl->ready_term == rl->raft.current_term && !kvp_rl_glue_behind(&rl->glue))
        until = kvp_clock_now_us() + RL_READ_FRESH_US;
    atomic_store_explicit(&rl->read_until_us, until, memory_order_release);
}

static void barrier_cb(struct raft_barrier *req, int status)
{
    struct kvp_raftlog *rl = req->data;
    rl->barrier_pending = false;
    if (rl->raft_closing) {
        flush_query_waiters(rl, KVP_ERR_CLOSED);
        return;
    }
    if (status == 0 && raft_state(&rl->raft) == RAFT_LEADER) {
        rl->ready_term = rl->raft.current_term;
        flush_query_waiters(rl, KVP_OK);
    } else {
        flush_query_waiters(rl, KVP_ERR_NOT_LEADER);
    }
}

/* A new leader reads only after an entry of its own term has applied: that makes every entry
 * committed by earlier leaders visible in its FSM. */
static void ensure_barrier(struct kvp_raftlog *rl)
{
    if (rl->barrier_pending || rl->ready_term == rl->raft.current_term)
        return;
    rl->barrier.data = rl;
    int rv = raft_barrier(&rl->raft, &rl->barrier, barrier_cb);
    if (rv == 0)
        rl->barrier_pending = true;
    else
        flush_query_waiters(rl, kvp_rl_err_from_raft(rv));
}

static void check_leadership(struct kvp_raftlog *rl)
{
    struct raft *r = &rl->raft;
    raft_id lid = 0;
    const char *laddr = NULL;
    raft_leader(r, &lid, &laddr);
    int is_leader = raft_state(r) == RAFT_LEADER;
    uint64_t term = r->current_term;
    if (is_leader)
        ensure_barrier(rl);
    if (lid == rl->last_leader && is_leader == rl->last_is_leader &&
        (term == rl->last_term || !is_leader))
        return;
    rl->last_leader = lid;
    rl->last_is_leader = is_leader;
    rl->last_term = term;
    uint8_t t[8];
    put_le64(t, term);
    kvp_log_info(rl->actor, "leader %llu term %llu%s", (unsigned long long)lid,
                 (unsigned long long)term, is_leader ? " (this node)" : "");
    ev_send(rl, KVP_RAFTLOG_EV_LEADER, lid, is_leader, t, sizeof(t));
}

/* ---- submission pump (raft thread) ---- */

static void fail_pending(struct kvp_raftlog *rl, int status)
{
    while (rl->pend_head != NULL) {
        struct rl_op *op = rl->pend_head;
        rl->pend_head = op->next;
        if (status != 0)
            ev_send(rl, KVP_RAFTLOG_EV_APPLIED, op->corr, status, NULL, 0);
        free(op);
    }
    rl->pend_tail = NULL;
}

static void pump(struct kvp_raftlog *rl)
{
    if (rl->raft_closing)
        return;
    if (rl->pend_head != NULL && raft_state(&rl->raft) != RAFT_LEADER) {
        fail_pending(rl, KVP_ERR_NOT_LEADER);
        return;
    }
    uint64_t corrs[1024];
    struct kvp_rl_cmd cmds[1024];
    uint32_t gmax = rl->group_max < 1024 ? rl->group_max : 1024;
    while (rl->pend_head != NULL && rl->glue.n_inflight < rl->max_inflight) {
        uint32_t n = 0;
        size_t bytes = 0;
        struct rl_op *op = rl->pend_head;
        while (op != NULL && n < gmax && (n == 0 || bytes + op->len <= RL_ENTRY_SOFT_BYTES)) {
            corrs[n] = op->corr;
            cmds[n].data = op->data;
            cmds[n].len = op->len;
            bytes += op->len + 4;
            n++;
            op = op->next;
        }
        int rc = kvp_rl_glue_propose(&rl->glue, corrs, cmds, n);
        uint64_t now = rc == KVP_OK ? kvp_clock_now_us() : 0;
        /* Either way these ops are done with: on success results come through the glue. */
        for (uint32_t i = 0; i < n; i++) {
            struct rl_op *o = rl->pend_head;
            rl->pend_head = o->next;
            if (rc != KVP_OK)
                ev_send(rl, KVP_RAFTLOG_EV_APPLIED, o->corr, rc, NULL, 0);
            else
                rl->cmd_queue_us_total += now - o->queued_us;
            free(o);
        }
        if (rl->pend_head == NULL)
            rl->pend_tail = NULL;
        if (rc == KVP_ERR_NOT_LEADER) {
            fail_pending(rl, KVP_ERR_NOT_LEADER);
            return;
        }
    }
}

static void finish_close(struct kvp_raftlog *rl);
static bool drained(struct kvp_raftlog *rl);

/* An in-flight entry settled. This runs inside raft's apply callback, and raft 0.15 also fails
 * a deposed leader's entries from convertClearLeader: after it has freed the leader's progress
 * array but while raft_state() still says RAFT_LEADER. A raft_apply from there walked the freed
 * progress (SIGSEGV in replicationProgress; 3 crashes of the issue-22 scale bench under load).
 * So nothing calls into raft from here: the next proposals (or the close) wait for on_check,
 * at the end of this loop iteration. */
static void on_slot_free(void *ctx)
{
    struct kvp_raftlog *rl = ctx;
    rl->slot_freed = true;
}

/* ---- admin (raft thread) ---- */

static void admin_done(struct rl_admin *a, int status)
{
    struct kvp_raftlog *rl = a->rl;
    for (struct rl_admin **pp = &rl->admins; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == a) {
            *pp = a->next;
            break;
        }
    }
    kvp_log_info(rl->actor, "admin op %d on %llu: %s", a->kind, (unsigned long long)a->id,
                 kvp_strerror(status));
    ev_send(rl, KVP_RAFTLOG_EV_ADMIN, a->corr, status, NULL, 0);
    free(a);
}

static void assign_cb(struct raft_change *req, int status)
{
    admin_done(req->data, kvp_rl_err_from_raft(status));
}

static void add_cb(struct raft_change *req, int status)
{
    struct rl_admin *a = req->data;
    if (status != 0 || a->rl->raft_closing) {
        admin_done(a, status != 0 ? kvp_rl_err_from_raft(status) : KVP_ERR_CLOSED);
        return;
    }
    a->assign.data = a;
    int rv = raft_assign(&a->rl->raft, &a->assign, a->id, RAFT_VOTER, assign_cb);
    if (rv != 0)
        admin_done(a, kvp_rl_err_from_raft(rv));
}

static void remove_cb(struct raft_change *req, int status)
{
    admin_done(req->data, kvp_rl_err_from_raft(status));
}

static void transfer_cb(struct raft_transfer *req)
{
    struct rl_admin *a = req->data;
    struct kvp_raftlog *rl = a->rl;
    raft_id lid = 0;
    const char *addr = NULL;
    raft_leader(&rl->raft, &lid, &addr);
    bool ok = a->id != 0 ? lid == a->id : (lid != 0 && lid != rl->p.id);
    admin_done(a, ok ? KVP_OK : KVP_ERR_TIMEOUT);
}

static void run_admin(struct kvp_raftlog *rl, struct rl_op *op)
{
    struct rl_admin *a = calloc(1, sizeof(*a));
    if (a == NULL) {
        ev_send(rl, KVP_RAFTLOG_EV_ADMIN, op->corr, KVP_ERR_NOMEM, NULL, 0);
        return;
    }
    a->rl = rl;
    a->kind = op->kind;
    a->corr = op->corr;
    a->id = op->id;
    a->change.data = a;
    a->transfer.data = a;
    a->next = rl->admins;
    rl->admins = a;
    int rv;
    if (op->kind == OP_ADD_VOTER) {
        rv = raft_add(&rl->raft, &a->change, op->id, op->addr, add_cb);
        if (rv == RAFT_DUPLICATEID) {
            /* A retried add whose first attempt added the server but did not finish promoting
             * it (catch-up too slow): promote it now. A retried add whose first attempt did
             * finish (its answer lost, or the caller gave up while the catch-up ran) finds a
             * voter at the same address: done, KVP_OK. A voter at another address stays a
             * duplicate (KVP_ERR_INVALID). */
            const struct raft_configuration *cf = &rl->raft.configuration;
            for (unsigned i = 0; i < cf->n; i++) {
                if (cf->servers[i].id != op->id)
                    continue;
                if (cf->servers[i].role != RAFT_VOTER) {
                    a->assign.data = a;
                    rv = raft_assign(&rl->raft, &a->assign, op->id, RAFT_VOTER, assign_cb);
                } else if (strcmp(cf->servers[i].address, op->addr) == 0) {
                    admin_done(a, KVP_OK);
                    return;
                }
                break;
            }
        }
    } else if (op->kind == OP_REMOVE) {
        rv = raft_remove(&rl->raft, &a->change, op->id, remove_cb);
    } else {
        /* No local read from here on: raft_transfer may already have sent TimeoutNow. */
        atomic_store_explicit(&rl->read_until_us, 0, memory_order_release);
        rv = raft_transfer(&rl->raft, &a->transfer, op->id, transfer_cb);
    }
    if (rv != 0) /* a call that returns an error never fires its callback */
        admin_done(a, kvp_rl_err_from_raft(rv));
}

/* ---- loop callbacks ---- */

static void on_handle_closed(uv_handle_t *h)
{
    (void)h;
}

static void on_raft_closed(struct raft *r)
{
    struct kvp_raftlog *rl = r->data;
    raft_uv_close(&rl->io);
    raft_uv_tcp_close(&rl->transport);
    if (rl->timer_inited)
        uv_close((uv_handle_t *)&rl->timer, on_handle_closed);
    if (rl->check_inited)
        uv_close((uv_handle_t *)&rl->check, on_handle_closed);
    if (rl->snap_idle_inited)
        uv_close((uv_handle_t *)&rl->snap_idle, on_handle_closed);
    if (rl->async_inited)
        uv_close((uv_handle_t *)&rl->async, on_handle_closed);
    while (rl->held) { /* never written, never answered: raft is closed */
        struct rl_append *w = rl->held;
        rl->held = w->next;
        free(w);
    }
}

/* Phase 2 of stop: raft_close, once drained() (below). raft 0.15 was seen to crash inside
 * raft_close (its log reference table) and in its uv writer when closed with appends in
 * flight or right after start, so stop waits until our entries are settled and the node
 * has run for RL_MIN_UPTIME_MS, bounded by two election timeouts. */
static void finish_close(struct kvp_raftlog *rl)
{
    if (rl->raft_closed_called)
        return;
    rl->raft_closed_called = true;
    if (rl->timer_inited)
        uv_timer_stop(&rl->timer);
    if (rl->check_inited)
        uv_check_stop(&rl->check);
    if (rl->snap_idle_inited)
        uv_idle_stop(&rl->snap_idle);
    rl->snap_idle_on = false;
    raft_close(&rl->raft, on_raft_closed);
}

static bool drained(struct kvp_raftlog *rl)
{
    uint64_t now = kvp_clock_now_ms();
    /* raft_uv prepares its open segments in the libuv thread pool after raft_start; closing
     * before that settles trips an assertion in raft 0.15's writer (uv_poll_stop on a closing
     * handle). Seen only when stopping within ~0.5 s of start; 1 s is the margin. */
    if (now < rl->started_ms + RL_MIN_UPTIME_MS)
        return false;
    if (now >= rl->close_deadline_ms)
        return true;
    return rl->glue.n_inflight == 0 && !rl->barrier_pending && rl->admins == NULL &&
           rl->raft.last_stored >= raft_last_index(&rl->raft);
}

static void begin_close(struct kvp_raftlog *rl)
{
    if (rl->raft_closing)
        return;
    rl->raft_closing = true;
    read_lease_refresh(rl); /* withdraws it */
    uint32_t et = rl->p.election_timeout_ms > 0 ? rl->p.election_timeout_ms : 1000;
    rl->close_deadline_ms = kvp_clock_now_ms() + 2u * et;
    kvp_log_info(rl->actor, "closing (state %d, %u entries in flight, barrier %d)",
                 raft_state(&rl->raft), rl->glue.n_inflight, rl->barrier_pending);
    /* Queued work that never reached raft is dropped (stop destroys the events socket:
     * nobody would read a KVP_ERR_CLOSED event). */
    fail_pending(rl, 0);
    flush_query_waiters(rl, KVP_ERR_CLOSED);
    if (drained(rl))
        finish_close(rl);
    /* else the tick (or the last apply callback) finishes it */
}

static void on_async(uv_async_t *h)
{
    struct kvp_raftlog *rl = h->data;
    pthread_mutex_lock(&rl->mu);
    struct rl_op *list = rl->q_head;
    rl->q_head = rl->q_tail = NULL;
    bool closing = rl->closing;
    pthread_mutex_unlock(&rl->mu);
    if (closing || rl->raft_closing) {
        while (list != NULL) {
            struct rl_op *n = list->next;
            free(list);
            list = n;
        }
        begin_close(rl);
        return;
    }
    while (list != NULL) {
        struct rl_op *op = list;
        list = op->next;
        op->next = NULL;
        switch (op->kind) {
        case OP_SUBMIT:
            if (rl->pend_tail != NULL)
                rl->pend_tail->next = op;
            else
                rl->pend_head = op;
            rl->pend_tail = op;
            continue; /* owned by the pending list now */
        case OP_QUERY:
            /* canonical raft steps a leader down once it has not heard from a majority for
             * an election timeout, so RAFT_LEADER here means "led a quorum recently". While a
             * transfer runs the target may already lead and commit: not answered here either
             * (a local read falls back to this path). */
            if (raft_state(&rl->raft) != RAFT_LEADER || rl->raft.transfer != NULL) {
                ev_send(rl, KVP_RAFTLOG_EV_QUERY, op->corr, KVP_ERR_NOT_LEADER, NULL, 0);
            } else if (rl->ready_term != rl->raft.current_term) {
                op->next = rl->qwait_head;
                rl->qwait_head = op;
                ensure_barrier(rl);
                continue;
            } else {
                run_query(rl, op);
            }
            break;
        default:
            run_admin(rl, op);
            break;
        }
        free(op);
    }
    pump(rl);
}

static void on_tick(uv_timer_t *t)
{
    struct kvp_raftlog *rl = t->data;
    /* A repeating libuv timer fires RL_TICK_MS after its previous run once the loop gets to
     * it: lateness beyond that is time the thread spent in one stretch of callbacks. */
    uint64_t now_us = kvp_clock_now_us();
    struct timespec cts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cts);
    uint64_t cpu_us = (uint64_t)cts.tv_sec * 1000000u + (uint64_t)cts.tv_nsec / 1000u;
    if (rl->last_tick_us != 0 && now_us - rl->last_tick_us > RL_TICK_MS * 1000u) {
        uint64_t late = now_us - rl->last_tick_us - RL_TICK_MS * 1000u;
        if (late > rl->max_stall_us)
            rl->max_stall_us = late;
        /* On a loaded machine the thread may be late only because it was not scheduled: the
         * lateness it spent running (its CPU time over the interval, at most the lateness) is
         * the stall its own work caused. */
        uint64_t cpu = cpu_us - rl->last_tick_cpu_us;
        uint64_t busy = cpu < late ? cpu : late;
        if (busy > rl->max_busy_stall_us)
            rl->max_busy_stall_us = busy;
    }
    rl->last_tick_us = now_us;
    rl->last_tick_cpu_us = cpu_us;
    if (rl->raft_closing) {
        if (drained(rl))
            finish_close(rl);
        return;
    }
    check_leadership(rl);
    update_info(rl);
    pump(rl); /* fails queued submits promptly after a step-down */
    if (rl->glue.snapshots_taken != rl->trimmed_at_snapshot && rl->raft.snapshot.pending.term == 0 &&
        rl->raft.snapshot.put.data == NULL) {
        /* A snapshot was stored and raft released the log entries before it (nothing pending
         * or being put): hand the freed heap back to the kernel, or the master's RSS keeps the
         * log's high-water mark. */
        rl->trimmed_at_snapshot = rl->glue.snapshots_taken;
        malloc_trim(0);
    }
}

/* After the timer and I/O callbacks of every loop iteration (messages of a new term, raft's own
 * check-quorum step-down, a barrier applied, submissions): the local-read permission follows
 * raft's state before the thread sleeps again. The only other refresh is in ev_send. Also
 * where the in-flight entries that reached the local log are timed (a store completes in an
 * I/O callback of this iteration). */
static bool idle_work_pending(struct kvp_raftlog *rl)
{
    return kvp_rl_glue_snap_pending(&rl->glue) || kvp_rl_glue_catch_up_pending(&rl->glue);
}

/* A follower that failed a staged install stops like one whose log cannot be written. */
static void report_install_failure(struct kvp_raftlog *rl)
{
    if (!rl->glue.failed || rl->install_failed_sent)
        return;
    rl->install_failed_sent = true;
    ev_send(rl, KVP_RAFTLOG_EV_LOG_FAILED, 0, KVP_ERR_MALFORMED, rl->glue.failed_why, strlen(rl->glue.failed_why));
}

static void on_snap_idle(uv_idle_t *h)
{
    struct kvp_raftlog *rl = h->data;
    if (!rl->raft_closing) {
        /* Install steps and deferred applies first: a build cannot begin while the FSM lags. */
        if (kvp_rl_glue_catch_up_pending(&rl->glue)) {
            if (kvp_rl_glue_catch_up_step(&rl->glue, RL_CATCHUP_STEP_US) != KVP_OK)
                report_install_failure(rl);
        } else {
            kvp_rl_glue_snap_work(&rl->glue);
        }
    }
    if (rl->raft_closing || !idle_work_pending(rl)) {
        uv_idle_stop(&rl->snap_idle);
        rl->snap_idle_on = false;
    }
}

static void on_check(uv_check_t *h)
{
    struct kvp_raftlog *rl = h->data;
    kvp_rl_glue_next_iteration(&rl->glue);
    if (!rl->raft_closing && kvp_rl_glue_behind(&rl->glue) && raft_state(&rl->raft) == RAFT_LEADER) {
        /* A leader serves from an FSM at its applied index: the rest of an install and the
         * deferred entries now, in one piece (bounded by RL_DEFER_MAX_US unless an install ran). */
        uint64_t t0 = kvp_clock_now_us(), n = rl->glue.q_len;
        int staged = rl->glue.rs;
        if (kvp_rl_glue_catch_up(&rl->glue) != KVP_OK)
            report_install_failure(rl);
        kvp_log_info(rl->actor, "leading while behind: %s%llu deferred entries applied in one piece, %llu ms",
                     staged == 1 || staged == 2 ? "the rest of an install and " : "", (unsigned long long)n,
                     (unsigned long long)(kvp_clock_now_us() - t0) / 1000);
    }
    if (!rl->raft_closing)
        read_lease_refresh(rl);
    kvp_rl_glue_note_stored(&rl->glue);
    if (rl->slot_freed) { /* see on_slot_free */
        rl->slot_freed = false;
        if (!rl->raft_closing)
            pump(rl);
        else if (drained(rl))
            finish_close(rl);
    }
    if (rl->snap_idle_inited && !rl->snap_idle_on && !rl->raft_closing && idle_work_pending(rl)) {
        uv_idle_start(&rl->snap_idle, on_snap_idle); /* a build, an install or deferred applies began */
        rl->snap_idle_on = true;
    }
}

/* ---- thread ---- */

static void signal_start(struct kvp_raftlog *rl, int rc)
{
    pthread_mutex_lock(&rl->mu);
    rl->start_rc = rc;
    rl->start_done = true;
    pthread_cond_broadcast(&rl->cv);
    pthread_mutex_unlock(&rl->mu);
}

static int bootstrap(struct kvp_raftlog *rl)
{
    struct raft_configuration conf;
    raft_configuration_init(&conf);
    int rv = 0;
    for (size_t i = 0; i < rl->p.n_members && rv == 0; i++)
        rv = raft_configuration_add(&conf, rl->p.members[i].id, rl->p.members[i].raft_address,
                                    RAFT_VOTER);
    if (rv == 0) {
        rv = raft_bootstrap(&rl->raft, &conf);
        if (rv == RAFT_CANTBOOTSTRAP)
            rv = 0; /* the data dir already holds state: restart, not a new cluster */
        else if (rv == 0)
            kvp_log_info(rl->actor, "bootstrapped with %zu members", rl->p.n_members);
    }
    raft_configuration_close(&conf);
    return rv;
}

/*
 * raft_uv_tcp leaves Nagle's algorithm on. A leader sends AppendEntries back to back on its
 * outgoing connection (a follower answers on its own outgoing one): a small message written
 * while the previous one is unacknowledged waits for that ACK, which the peer delays up to
 * 40 ms. Every outgoing Raft connection gets TCP_NODELAY. raft_uv writes on the connections it
 * opened and only reads the ones it accepted, so the connect side is the one that matters.
 */
struct rl_connect {
    struct raft_uv_connect req; /* handed to raft_uv_tcp */
    struct raft_uv_connect *orig;
    raft_uv_connect_cb orig_cb;
};

static void rl_connect_cb(struct raft_uv_connect *req, struct uv_stream_s *stream, int status)
{
    struct rl_connect *w = req->data;
    if (status == 0 && stream && stream->type == UV_TCP)
        uv_tcp_nodelay((uv_tcp_t *)stream, 1);
    struct raft_uv_connect *orig = w->orig;
    raft_uv_connect_cb cb = w->orig_cb;
    free(w);
    cb(orig, stream, status);
}

static int rl_connect(struct raft_uv_transport *t, struct raft_uv_connect *req, raft_id id,
                      const char *address, raft_uv_connect_cb cb)
{
    struct kvp_raftlog *rl = (struct kvp_raftlog *)((char *)t - offsetof(struct kvp_raftlog, transport));
    struct rl_connect *w = malloc(sizeof *w);
    if (!w)
        return RAFT_NOMEM;
    w->req.data = w;
    w->orig = req;
    w->orig_cb = cb;
    int rv = rl->tcp_connect(t, &w->req, id, address, rl_connect_cb);
    if (rv != 0)
        free(w); /* the callback does not fire */
    return rv;
}

static void *thread_main(void *arg)
{
    struct kvp_raftlog *rl = arg;
    int rv;
    int stage = 0; /* 1 transport, 2 io, 3 raft */
    /* A peer closing its Raft connection must not kill the process: raft_uv writes with
     * write(2), so block SIGPIPE on this thread only (writes then fail with EPIPE). */
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, NULL);
    if (uv_loop_init(&rl->loop) != 0) {
        signal_start(rl, KVP_ERR_INTERNAL);
        return NULL;
    }
    rv = raft_uv_tcp_init(&rl->transport, &rl->loop);
    if (rv != 0)
        goto fail;
    stage = 1;
    rl->tcp_connect = rl->transport.connect;
    rl->transport.connect = rl_connect;
    rv = raft_uv_init(&rl->io, &rl->loop, rl->p.data_dir, &rl->transport);
    if (rv != 0)
        goto fail;
    stage = 2;
    if (rl->p.segment_size_bytes > 0)
        raft_uv_set_segment_size(&rl->io, rl->p.segment_size_bytes);
    raft_uv_set_snapshot_compression(&rl->io, false); /* we LZ4-frame snapshots ourselves */
    raft_uv_set_connect_retry_delay(&rl->io, 100);
    rl_append_install(rl);
    rv = raft_init(&rl->raft, &rl->io, &rl->glue.fsm, rl->p.id, rl->p.raft_address);
    if (rv != 0)
        goto fail;
    stage = 3;
    rl->raft.data = rl;
    rl->glue.raft = &rl->raft;
    if (rl->p.election_timeout_ms > 0)
        raft_set_election_timeout(&rl->raft, rl->p.election_timeout_ms);
    if (rl->p.heartbeat_ms > 0)
        raft_set_heartbeat_timeout(&rl->raft, rl->p.heartbeat_ms);
    /* Pre-vote (Raft thesis 9.6): a member that restarts or was cut off asks first whether it
     * could win before it bumps its term, so it cannot depose a healthy leader on rejoining. */
    raft_set_pre_vote(&rl->raft, true);
    if (rl->p.snapshot_threshold > 0)
        raft_set_snapshot_threshold(&rl->raft, (unsigned)rl->p.snapshot_threshold);
    if (rl->p.snapshot_trailing > 0)
        raft_set_snapshot_trailing(&rl->raft, (unsigned)rl->p.snapshot_trailing);
    rl->glue.base_threshold = rl->p.snapshot_threshold > 0 ? (unsigned)rl->p.snapshot_threshold : 1024; /* raft's defaults */
    rl->glue.base_trailing = rl->p.snapshot_trailing > 0 ? (unsigned)rl->p.snapshot_trailing : 128;
    rl->glue.snap_log_bytes = rl->p.snapshot_log_bytes;
    if ((rl->p.fsm.snapshot == NULL && !rl->glue.inc) || rl->p.fsm.restore == NULL) {
        raft_set_snapshot_threshold(&rl->raft, 0xFFFFFFFFu);
        rl->glue.snap_log_bytes = 0;
        rl->glue.inc = false;
    } else if (rl->glue.inc) {
        /* The glue starts builds itself and lowers the threshold to 1 once one is built. */
        raft_set_snapshot_threshold(&rl->raft, 0xFFFFFFFFu);
    }
    if (!rl->p.join) {
        rv = bootstrap(rl);
        if (rv != 0)
            goto fail;
    }
    rv = raft_start(&rl->raft);
    if (rv != 0)
        goto fail;
    /* From here on an install and a follower's applies go in steps (a start-up restore above
     * ran in one piece: no peer waits on this member yet). */
    rl->glue.steps = true;
    rl->glue.apply_budget_us = RL_APPLY_BUDGET_US;
    rl->glue.defer_max_us = RL_DEFER_MAX_US;
    uv_async_init(&rl->loop, &rl->async, on_async);
    rl->async.data = rl;
    rl->async_inited = true;
    uv_timer_init(&rl->loop, &rl->timer);
    rl->timer.data = rl;
    rl->timer_inited = true;
    uv_timer_start(&rl->timer, on_tick, RL_TICK_MS, RL_TICK_MS);
    uv_check_init(&rl->loop, &rl->check);
    rl->check.data = rl;
    rl->check_inited = true;
    uv_check_start(&rl->check, on_check);
    uv_idle_init(&rl->loop, &rl->snap_idle);
    rl->snap_idle.data = rl;
    rl->snap_idle_inited = true;
    update_info(rl);
    rl->started_ms = kvp_clock_now_ms();
    kvp_log_info(rl->actor, "started on %s, data dir %s", rl->p.raft_address, rl->p.data_dir);
    signal_start(rl, KVP_OK);
    /* stop may have been requested before the async handle existed */
    uv_async_send(&rl->async);
    uv_run(&rl->loop, UV_RUN_DEFAULT);
    uv_loop_close(&rl->loop);
    return NULL;

fail:
    kvp_log_error(rl->actor, "start failed: %s (%s)", kvp_rl_strerror(rv),
                  stage == 3 ? raft_errmsg(&rl->raft) : "");
    {
        int krc = kvp_rl_err_from_raft(rv);
        if (krc == KVP_ERR_INTERNAL || krc == KVP_ERR_INVALID || krc == KVP_ERR_UNAVAILABLE)
            krc = rv == RAFT_NOMEM ? KVP_ERR_NOMEM : KVP_ERR_IO;
        if (stage == 3) {
            rl->raft_closing = true;
            rl->raft_closed_called = true;
            raft_close(&rl->raft, on_raft_closed);
        } else {
            if (stage >= 2)
                raft_uv_close(&rl->io);
            if (stage >= 1)
                raft_uv_tcp_close(&rl->transport);
        }
        uv_run(&rl->loop, UV_RUN_DEFAULT);
        uv_loop_close(&rl->loop);
        signal_start(rl, krc);
    }
    return NULL;
}

/* ---- public API ---- */

static int mkdir_p(const char *path)
{
    char tmp[1024];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(tmp))
        return -1;
    memcpy(tmp, path, n + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

static bool str_ok(const char *s, size_t cap)
{
    return memchr(s, 0, cap) != NULL && s[0] != 0;
}

static void rl_free(struct kvp_raftlog *rl)
{
    if (rl == NULL)
        return;
    fail_pending(rl, 0);
    while (rl->qwait_head != NULL) {
        struct rl_op *op = rl->qwait_head;
        rl->qwait_head = op->next;
        free(op);
    }
    while (rl->q_head != NULL) {
        struct rl_op *op = rl->q_head;
        rl->q_head = op->next;
        free(op);
    }
    while (rl->admins != NULL) {
        struct rl_admin *a = rl->admins;
        rl->admins = a->next;
        free(a);
    }
    kvp_rl_glue_fini(&rl->glue);
    if (rl->view.inited)
        pthread_rwlock_destroy(&rl->view.lock);
    zsock_destroy(&rl->ev_writer);
    zsock_destroy(&rl->ev_reader);
    pthread_mutex_destroy(&rl->mu);
    pthread_cond_destroy(&rl->cv);
    free(rl);
}

int kvp_raftlog_start(struct kvp_raftlog **out, const struct kvp_raftlog_params *p)
{
    if (out == NULL || p == NULL)
        return KVP_ERR_INVALID;
    char actor[32];
    snprintf(actor, sizeof(actor), "raftlog-%llu", (unsigned long long)p->id);
    if (p->id == 0 || !str_ok(p->raft_address, sizeof(p->raft_address)) ||
        strchr(p->raft_address, ':') == NULL || !str_ok(p->data_dir, sizeof(p->data_dir)) ||
        p->fsm.apply == NULL || p->n_members > 9 || (!p->join && p->n_members == 0)) {
        kvp_log_error(actor, "invalid parameters (id, raft_address host:port, data_dir, "
                             "fsm.apply, 1..9 members unless join)");
        return KVP_ERR_INVALID;
    }
    for (size_t i = 0; i < p->n_members; i++) {
        if (p->members[i].id == 0 ||
            !str_ok(p->members[i].raft_address, sizeof(p->members[i].raft_address))) {
            kvp_log_error(actor, "member %zu: invalid id or address", i);
            return KVP_ERR_INVALID;
        }
    }
    if (mkdir_p(p->data_dir) != 0) {
        kvp_log_error(actor, "data dir %s: %s", p->data_dir, strerror(errno));
        return KVP_ERR_IO;
    }
    struct kvp_raftlog *rl = calloc(1, sizeof(*rl));
    if (rl == NULL)
        return KVP_ERR_NOMEM;
    rl->p = *p;
    memcpy(rl->actor, actor, sizeof(actor));
    pthread_mutex_init(&rl->mu, NULL);
    pthread_cond_init(&rl->cv, NULL);
    rl->last_is_leader = -1;
    rl->max_inflight = p->max_inflight_entries > 0 ? p->max_inflight_entries : RL_DEFAULT_INFLIGHT;
    rl->group_max = p->group_commit_max > 0 ? p->group_commit_max : RL_DEFAULT_GROUP_MAX;
    kvp_rl_glue_init(&rl->glue, &p->fsm, deliver_applied, rl, rl->actor);
    rl->glue.on_done = on_slot_free;
    pthread_rwlockattr_t la;
    pthread_rwlockattr_init(&la);
    /* Writer first: the one raft thread applying must not wait behind a stream of reads. */
    pthread_rwlockattr_setkind_np(&la, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    if (pthread_rwlock_init(&rl->view.lock, &la) != 0) {
        pthread_rwlockattr_destroy(&la);
        rl_free(rl);
        return KVP_ERR_NOMEM;
    }
    pthread_rwlockattr_destroy(&la);
    rl->view.inited = true;
    rl->glue.view = &rl->view;

    char ep[96];
    snprintf(ep, sizeof(ep), "inproc://kvp-raftlog-%llu-%u-%p", (unsigned long long)p->id,
             atomic_fetch_add_explicit(&g_instance_seq, 1, memory_order_relaxed), (void *)rl);
    rl->ev_reader = zsock_new(ZMQ_PAIR);
    rl->ev_writer = zsock_new(ZMQ_PAIR);
    if (rl->ev_reader == NULL || rl->ev_writer == NULL) {
        rl_free(rl);
        return KVP_ERR_NOMEM;
    }
    zsock_set_rcvhwm(rl->ev_reader, 0);
    zsock_set_sndhwm(rl->ev_writer, 0);
    if (zsock_bind(rl->ev_reader, "%s", ep) != 0 || zsock_connect(rl->ev_writer, "%s", ep) != 0) {
        kvp_log_error(rl->actor, "events socket %s: %s", ep, zmq_strerror(zmq_errno()));
        rl_free(rl);
        return KVP_ERR_IO;
    }
    if (pthread_create(&rl->thread, NULL, thread_main, rl) != 0) {
        rl_free(rl);
        return KVP_ERR_NOMEM;
    }
    rl->thread_started = true;
    pthread_mutex_lock(&rl->mu);
    while (!rl->start_done)
        pthread_cond_wait(&rl->cv, &rl->mu);
    int rc = rl->start_rc;
    pthread_mutex_unlock(&rl->mu);
    if (rc != KVP_OK) {
        pthread_join(rl->thread, NULL);
        rl_free(rl);
        return rc;
    }
    *out = rl;
    return KVP_OK;
}

static bool read_lease_valid(struct kvp_raftlog *rl)
{
    uint64_t until = atomic_load_explicit(&rl->read_until_us, memory_order_acquire);
    return until != 0 && kvp_clock_now_us() < until;
}

int kvp_raftlog_read_begin(struct kvp_raftlog *rl)
{
    if (rl == NULL)
        return KVP_ERR_INVALID;
    if (!read_lease_valid(rl))
        return KVP_ERR_NOT_LEADER;
    pthread_rwlock_rdlock(&rl->view.lock);
    /* Checked again under the lock: a step-down followed by a snapshot install (which holds
     * the lock for writing) may have happened while this thread waited. */
    if (!read_lease_valid(rl)) {
        pthread_rwlock_unlock(&rl->view.lock);
        return KVP_ERR_NOT_LEADER;
    }
    return KVP_OK;
}

void kvp_raftlog_read_end(struct kvp_raftlog *rl)
{
    if (rl != NULL)
        pthread_rwlock_unlock(&rl->view.lock);
}

zsock_t *kvp_raftlog_events(struct kvp_raftlog *rl)
{
    return rl != NULL ? rl->ev_reader : NULL;
}

static int enqueue(struct kvp_raftlog *rl, enum op_kind kind, uint64_t corr, uint64_t id,
                   const char *addr, const uint8_t *data, size_t len)
{
    if (rl == NULL || (data == NULL && len > 0))
        return KVP_ERR_INVALID;
    if (len > KVP_RL_ENTRY_MAX_CMD_BYTES)
        return KVP_ERR_TOO_LARGE;
    struct rl_op *op = malloc(sizeof(*op) + len);
    if (op == NULL)
        return KVP_ERR_NOMEM;
    op->kind = kind;
    op->corr = corr;
    op->id = id;
    op->addr[0] = 0;
    if (addr != NULL)
        snprintf(op->addr, sizeof(op->addr), "%s", addr);
    op->len = len;
    op->next = NULL;
    op->queued_us = kind == OP_SUBMIT ? kvp_clock_now_us() : 0;
    if (len > 0)
        memcpy(op->data, data, len);
    pthread_mutex_lock(&rl->mu);
    if (rl->closing) {
        pthread_mutex_unlock(&rl->mu);
        free(op);
        return KVP_ERR_CLOSED;
    }
    bool wake = rl->q_head == NULL;
    if (rl->q_tail != NULL)
        rl->q_tail->next = op;
    else
        rl->q_head = op;
    rl->q_tail = op;
    /* uv_async_send is thread-safe; a wake-up already pending coalesces the new op. Sent
     * under mu so stop cannot tear the handle down in between. */
    if (wake)
        uv_async_send(&rl->async);
    pthread_mutex_unlock(&rl->mu);
    return KVP_OK;
}

int kvp_raftlog_submit(struct kvp_raftlog *rl, uint64_t corr, const uint8_t *cmd, size_t len)
{
    return enqueue(rl, OP_SUBMIT, corr, 0, NULL, cmd, len);
}

int kvp_raftlog_query(struct kvp_raftlog *rl, uint64_t corr, const uint8_t *q, size_t len)
{
    return enqueue(rl, OP_QUERY, corr, 0, NULL, q, len);
}

int kvp_raftlog_add_voter(struct kvp_raftlog *rl, uint64_t corr, uint64_t id, const char *raft_address)
{
    if (id == 0 || raft_address == NULL || raft_address[0] == 0 || strlen(raft_address) >= 256)
        return KVP_ERR_INVALID;
    return enqueue(rl, OP_ADD_VOTER, corr, id, raft_address, NULL, 0);
}

int kvp_raftlog_remove(struct kvp_raftlog *rl, uint64_t corr, uint64_t id)
{
    if (id == 0)
        return KVP_ERR_INVALID;
    return enqueue(rl, OP_REMOVE, corr, id, NULL, NULL, 0);
}

int kvp_raftlog_transfer(struct kvp_raftlog *rl, uint64_t corr, uint64_t target_id)
{
    return enqueue(rl, OP_TRANSFER, corr, target_id, NULL, NULL, 0);
}

void kvp_raftlog_get_info(struct kvp_raftlog *rl, struct kvp_raftlog_info *out)
{
    if (out == NULL)
        return;
    memset(out, 0, sizeof(*out));
    if (rl == NULL)
        return;
    pthread_mutex_lock(&rl->mu);
    *out = rl->info;
    pthread_mutex_unlock(&rl->mu);
}

void kvp_raftlog_stop(struct kvp_raftlog **rlp)
{
    if (rlp == NULL || *rlp == NULL)
        return;
    struct kvp_raftlog *rl = *rlp;
    *rlp = NULL;
    pthread_mutex_lock(&rl->mu);
    rl->closing = true;
    uv_async_send(&rl->async);
    pthread_mutex_unlock(&rl->mu);
    pthread_join(rl->thread, NULL);
    kvp_log_info(rl->actor, "stopped");
    rl_free(rl);
}
