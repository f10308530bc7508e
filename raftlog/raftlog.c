/*
 * raftlog.c — the raft thread: libuv loop, raft_uv + TCP transport, the submission queue
 * (mutex + uv_async_t), group commit, leadership polling, admin calls, events PAIR socket.
 * raft_uv's log writes and sends are wrapped in raftlog_io.c; the thread's state is in
 * raftlog_thread.h. See raftlog.h for the contract and docs/raftlog.md for the behaviour notes.
 *
 * Threads and locks (issue 23: raft's libuv thread stays the raft actor's loop): this file starts
 * the raft thread, guards its submission queue with `mu` (why not a runtime mailbox: at struct
 * kvp_raftlog, raftlog_thread.h) and holds the FSM's read view (why not a message: at struct kvp_rl_view). No other
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
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <uv.h>

#include "kvpool.h"
#include "raftlog/raftlog_internal.h"
#include "raftlog/raftlog_thread.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define RL_TICK_MS 20
/* Catching up in steps (docs/raftlog.md "Installing a snapshot in steps"): a follower applies
 * committed entries for at most RL_APPLY_BUDGET_US per loop iteration and defers the rest; the
 * idle handle then does RL_CATCHUP_STEP_US of install or deferred applies per iteration. */
#define RL_APPLY_BUDGET_US 10000u
#define RL_CATCHUP_STEP_US 5000u
/* A follower's backlog of deferred applies, in (wall) apply time: over it the idle steps do
 * half of it per iteration instead of RL_CATCHUP_STEP_US (kvp_rl_glue_catch_up_budget_us); a
 * member that becomes leader applies all of it in one piece. Since session 31 an arrival over
 * it no longer applies queued entries inside raft's callback (a burst of entries handed over at
 * once was then applied in that one iteration). Only the memory bound, RL_DEFER_MAX_BYTES of
 * queued payload, does: the oldest entries are applied until the arriving one fits. */
#define RL_DEFER_MAX_US 50000u
#define RL_DEFER_MAX_BYTES ((uint64_t)64 << 20)
#define RL_MIN_UPTIME_MS 1000
#define RL_DEFAULT_GROUP_MAX 256
#define RL_DEFAULT_INFLIGHT 4
/* Stop adding commands to an entry past this size. Every node applies an entry in one go on its
 * raft thread, so its size bounds that stall: 1 MiB of metadata puts (~20k objects) applies in
 * tens of ms on this VM; at 4 MiB the longest apply was ~200 ms (issue 22). */
#define RL_ENTRY_SOFT_BYTES (1u << 20)
/* ... and past this much apply cost (kvp_raftlog_submit_cost; the master counts a batch
 * command's items): 1 MiB of PutStarts is ~26k items and ~118 ms of CPU at 10M objects on this
 * VM, 4,096 items ~10-20 ms (docs/bench.md "Master scale", session 31). */
#define RL_DEFAULT_ENTRY_COST 4096u
/* A local read (kvp_raftlog_read_begin) trusts leadership the raft thread confirmed at most this
 * long ago. The raft thread re-confirms after every loop iteration (uv_check) and before every
 * event it sends; with nothing else to do it still wakes every tick (RL_TICK_MS), so two ticks
 * let one late tick pass without sending reads to the slow path. */
#define RL_READ_FRESH_US (2u * RL_TICK_MS * 1000u)

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

/* ---- events (raft thread only) ---- */

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void read_lease_refresh(struct kvp_raftlog *rl);

static void ev_send_frames(struct kvp_raftlog *rl, uint8_t kind, uint64_t corr, int32_t status, const void *data,
                           size_t len)
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

/* params.batch_applied: send the EV_APPLIED records gathered so far as one EV_APPLIED_BATCH.
 * Runs at the end of every loop iteration (on_check), before any other event (so events keep
 * their order) and when the loop ends. One message per iteration instead of one per command:
 * the service reads one message (a few allocations) for a whole group entry's results. */
static void batch_flush(struct kvp_raftlog *rl)
{
    if (rl->batch_n == 0)
        return;
    uint64_t n = rl->batch_n;
    rl->batch_n = 0;
    ev_send_frames(rl, KVP_RAFTLOG_EV_APPLIED_BATCH, n, 0, rl->batch_buf, rl->batch_len);
    rl->batch_len = 0;
    if (rl->batch_cap > (1u << 20)) { /* a burst of large results: do not keep its buffer */
        free(rl->batch_buf);
        rl->batch_buf = NULL;
        rl->batch_cap = 0;
    }
}

/* Append one record ([u64 corr][i32 status][u32 len][bytes]); false when out of memory. */
static bool batch_add(struct kvp_raftlog *rl, uint64_t corr, int32_t status, const uint8_t *res, size_t len)
{
    size_t need = rl->batch_len + 16 + len;
    if (len > UINT32_MAX || need < len)
        return false;
    if (need > rl->batch_cap) {
        size_t cap = rl->batch_cap ? rl->batch_cap : 4096;
        while (cap < need)
            cap *= 2;
        uint8_t *nb = realloc(rl->batch_buf, cap);
        if (nb == NULL)
            return false;
        rl->batch_buf = nb;
        rl->batch_cap = cap;
    }
    uint8_t *p = rl->batch_buf + rl->batch_len;
    put_le64(p, corr);
    for (int i = 0; i < 4; i++) {
        p[8 + i] = (uint8_t)((uint32_t)status >> (8 * i));
        p[12 + i] = (uint8_t)((uint32_t)len >> (8 * i));
    }
    if (len)
        memcpy(p + 16, res, len);
    rl->batch_len = need;
    rl->batch_n++;
    return true;
}

void kvp_rl_ev_send(struct kvp_raftlog *rl, uint8_t kind, uint64_t corr, int32_t status,
                    const void *data, size_t len)
{
    batch_flush(rl); /* results applied before this event leave before it */
    ev_send_frames(rl, kind, corr, status, data, len);
}

static void deliver_applied(void *ctx, uint64_t corr, int status, const uint8_t *res, size_t len)
{
    struct kvp_raftlog *rl = ctx;
    if (rl->p.batch_applied && !rl->raft_closed_called && batch_add(rl, corr, status, res, len))
        return;
    kvp_rl_ev_send(ctx, KVP_RAFTLOG_EV_APPLIED, corr, status, res, len);
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
    kvp_rl_ev_send(rl, KVP_RAFTLOG_EV_QUERY, op->corr, st, res, res != NULL ? res_len : 0);
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
            kvp_rl_ev_send(rl, KVP_RAFTLOG_EV_QUERY, op->corr, status, NULL, 0);
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
    kvp_rl_ev_send(rl, KVP_RAFTLOG_EV_LEADER, lid, is_leader, t, sizeof(t));
}

/* ---- submission pump (raft thread) ---- */

static void fail_pending(struct kvp_raftlog *rl, int status)
{
    while (rl->pend_head != NULL) {
        struct rl_op *op = rl->pend_head;
        rl->pend_head = op->next;
        if (status != 0)
            kvp_rl_ev_send(rl, KVP_RAFTLOG_EV_APPLIED, op->corr, status, NULL, 0);
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
        struct kvp_rl_group grp = {0};
        struct rl_op *op = rl->pend_head;
        while (op != NULL && kvp_rl_group_fits(&grp, op->len, op->cost, gmax, RL_ENTRY_SOFT_BYTES, rl->entry_max_cost)) {
            corrs[grp.n] = op->corr;
            cmds[grp.n].data = op->data;
            cmds[grp.n].len = op->len;
            kvp_rl_group_add(&grp, op->len, op->cost);
            op = op->next;
        }
        uint32_t n = grp.n;
        int rc = kvp_rl_glue_propose(&rl->glue, corrs, cmds, n);
        uint64_t now = rc == KVP_OK ? kvp_clock_now_us() : 0;
        /* Either way these ops are done with: on success results come through the glue. */
        for (uint32_t i = 0; i < n; i++) {
            struct rl_op *o = rl->pend_head;
            rl->pend_head = o->next;
            if (rc != KVP_OK)
                kvp_rl_ev_send(rl, KVP_RAFTLOG_EV_APPLIED, o->corr, rc, NULL, 0);
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
    kvp_rl_ev_send(rl, KVP_RAFTLOG_EV_ADMIN, a->corr, status, NULL, 0);
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
        kvp_rl_ev_send(rl, KVP_RAFTLOG_EV_ADMIN, op->corr, KVP_ERR_NOMEM, NULL, 0);
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
    if (rl->prep_inited)
        uv_close((uv_handle_t *)&rl->prep, on_handle_closed);
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
    if (rl->prep_inited)
        uv_prepare_stop(&rl->prep);
    batch_flush(rl); /* nothing is batched from here on (deliver_applied) */
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
                kvp_rl_ev_send(rl, KVP_RAFTLOG_EV_QUERY, op->corr, KVP_ERR_NOT_LEADER, NULL, 0);
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
        if (busy >= 50000u) {
            struct rusage ru;
            getrusage(RUSAGE_THREAD, &ru);
            kvp_log_info(rl->actor, "raft thread stall: tick %llu ms late, %llu ms of its CPU over the interval; in it: "
                         "%llu entries (%llu commands) handed over, %llu install steps, %llu snapshots restored, "
                         "%ld minor page faults", (unsigned long long)late / 1000, (unsigned long long)cpu / 1000,
                         (unsigned long long)(rl->glue.entries_applied - rl->last_tick_entries),
                         (unsigned long long)(rl->glue.cmds_applied - rl->last_tick_cmds),
                         (unsigned long long)(rl->glue.rs_steps - rl->last_tick_rs_steps),
                         (unsigned long long)(rl->glue.snapshots_restored - rl->last_tick_restored),
                         ru.ru_minflt - rl->last_tick_minflt);
        }
    }
    {
        struct rusage ru;
        getrusage(RUSAGE_THREAD, &ru);
        rl->last_tick_minflt = ru.ru_minflt;
    }
    rl->last_tick_entries = rl->glue.entries_applied;
    rl->last_tick_cmds = rl->glue.cmds_applied;
    rl->last_tick_rs_steps = rl->glue.rs_steps;
    rl->last_tick_restored = rl->glue.snapshots_restored;
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
        struct timespec a, b;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
        malloc_trim(0);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
        int64_t trim_us = ((int64_t)(b.tv_sec - a.tv_sec) * 1000000000 + (b.tv_nsec - a.tv_nsec)) / 1000;
        if (trim_us >= 20000)
            kvp_log_info(rl->actor, "slow hold: malloc_trim after a snapshot: %llu ms CPU",
                         (long long)trim_us / 1000);
    }
}

/* After the timer and I/O callbacks of every loop iteration (messages of a new term, raft's own
 * check-quorum step-down, a barrier applied, submissions): the local-read permission follows
 * raft's state before the thread sleeps again. The only other refresh is in kvp_rl_ev_send. Also
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
    kvp_rl_ev_send(rl, KVP_RAFTLOG_EV_LOG_FAILED, 0, KVP_ERR_MALFORMED, rl->glue.failed_why, strlen(rl->glue.failed_why));
}

static void on_snap_idle(uv_idle_t *h)
{
    struct kvp_raftlog *rl = h->data;
    if (!rl->raft_closing) {
        /* Install steps and deferred applies first: a build cannot begin while the FSM lags. */
        if (kvp_rl_glue_catch_up_pending(&rl->glue)) {
            if (kvp_rl_glue_catch_up_step(&rl->glue, kvp_rl_glue_catch_up_budget_us(&rl->glue, RL_CATCHUP_STEP_US)) != KVP_OK)
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
         * deferred entries now, in one piece (up to RL_DEFER_MAX_BYTES of queued entries). */
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
    batch_flush(rl); /* this iteration's applied results, in one message */
}

/* Before the loop waits: results applied by this iteration's timer, pending or idle callbacks
 * (params.batch_applied) leave now, not after the wait. */
static void on_prepare(uv_prepare_t *h)
{
    batch_flush(h->data);
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

/* The raft thread's nice value below its process's (docs/raftlog.md "The raft thread's
 * priority"). Five steps give it about three times the CPU share of a thread at the process's
 * nice value when both wait for a CPU (the kernel's CFS weights: 3121 against 1024). */
#define RL_THREAD_NICE_BOOST 5

/* Heartbeats and vote answers go out from this thread: on a busy host it must not wait behind
 * the service, ZeroMQ's I/O thread or co-hosted processes for longer than an election timeout.
 * Linux keeps a nice value per thread; raising it needs CAP_SYS_NICE (root has it). Without the
 * capability the thread keeps the process's priority and one line says so. */
static void raise_thread_priority(struct kvp_raftlog *rl)
{
    id_t tid = (id_t)syscall(SYS_gettid);
    errno = 0;
    int cur = getpriority(PRIO_PROCESS, tid);
    if (cur == -1 && errno != 0)
        return;
    if (setpriority(PRIO_PROCESS, tid, cur - RL_THREAD_NICE_BOOST) != 0)
        kvp_log_info(rl->actor, "raft thread keeps nice %d (%s): without CAP_SYS_NICE it waits for a CPU like "
                     "every other thread, and a busy host can delay heartbeats past the election timeout",
                     cur, strerror(errno));
    else
        kvp_log_debug(rl->actor, "raft thread nice %d -> %d", cur, cur - RL_THREAD_NICE_BOOST);
}

static void *thread_main(void *arg)
{
    struct kvp_raftlog *rl = arg;
    int rv;
    int stage = 0; /* 1 transport, 2 io, 3 raft */
    raise_thread_priority(rl);
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
    kvp_rl_io_install(rl);
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
    rl->glue.defer_max_bytes = RL_DEFER_MAX_BYTES;
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
    uv_prepare_init(&rl->loop, &rl->prep);
    rl->prep.data = rl;
    rl->prep_inited = true;
    uv_prepare_start(&rl->prep, on_prepare);
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
    batch_flush(rl); /* results applied by the loop's last callbacks */
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
    if (rl->view != NULL && rl->view->inited)
        pthread_rwlock_destroy(&rl->view->lock);
    free(rl->view);
    zsock_destroy(&rl->ev_writer);
    free(rl->batch_buf);
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
    rl->entry_max_cost = p->entry_max_cost > 0 ? p->entry_max_cost : RL_DEFAULT_ENTRY_COST;
    kvp_rl_glue_init(&rl->glue, &p->fsm, deliver_applied, rl, rl->actor);
    rl->glue.on_done = on_slot_free;
    pthread_rwlockattr_t la;
    pthread_rwlockattr_init(&la);
    /* Writer first: the one raft thread applying must not wait behind a stream of reads. */
    pthread_rwlockattr_setkind_np(&la, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    rl->view = calloc(1, sizeof *rl->view);
    if (rl->view == NULL || pthread_rwlock_init(&rl->view->lock, &la) != 0) {
        pthread_rwlockattr_destroy(&la);
        rl_free(rl);
        return KVP_ERR_NOMEM;
    }
    pthread_rwlockattr_destroy(&la);
    rl->view->inited = true;
    rl->glue.view = rl->view;

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
    pthread_rwlock_rdlock(&rl->view->lock);
    /* Checked again under the lock: a step-down followed by a snapshot install (which holds
     * the lock for writing) may have happened while this thread waited. */
    if (!read_lease_valid(rl)) {
        pthread_rwlock_unlock(&rl->view->lock);
        return KVP_ERR_NOT_LEADER;
    }
    return KVP_OK;
}

void kvp_raftlog_read_end(struct kvp_raftlog *rl)
{
    if (rl != NULL)
        pthread_rwlock_unlock(&rl->view->lock);
}

zsock_t *kvp_raftlog_events(struct kvp_raftlog *rl)
{
    return rl != NULL ? rl->ev_reader : NULL;
}

static int enqueue(struct kvp_raftlog *rl, enum op_kind kind, uint64_t corr, uint64_t id,
                   const char *addr, const uint8_t *data, size_t len, uint32_t cost)
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
    op->cost = cost > 0 ? cost : 1;
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
    return enqueue(rl, OP_SUBMIT, corr, 0, NULL, cmd, len, 1);
}

int kvp_raftlog_submit_cost(struct kvp_raftlog *rl, uint64_t corr, const uint8_t *cmd, size_t len, uint32_t cost)
{
    return enqueue(rl, OP_SUBMIT, corr, 0, NULL, cmd, len, cost);
}

int kvp_raftlog_query(struct kvp_raftlog *rl, uint64_t corr, const uint8_t *q, size_t len)
{
    return enqueue(rl, OP_QUERY, corr, 0, NULL, q, len, 1);
}

int kvp_raftlog_add_voter(struct kvp_raftlog *rl, uint64_t corr, uint64_t id, const char *raft_address)
{
    if (id == 0 || raft_address == NULL || raft_address[0] == 0 || strlen(raft_address) >= 256)
        return KVP_ERR_INVALID;
    return enqueue(rl, OP_ADD_VOTER, corr, id, raft_address, NULL, 0, 1);
}

int kvp_raftlog_remove(struct kvp_raftlog *rl, uint64_t corr, uint64_t id)
{
    if (id == 0)
        return KVP_ERR_INVALID;
    return enqueue(rl, OP_REMOVE, corr, id, NULL, NULL, 0, 1);
}

int kvp_raftlog_transfer(struct kvp_raftlog *rl, uint64_t corr, uint64_t target_id)
{
    return enqueue(rl, OP_TRANSFER, corr, target_id, NULL, NULL, 0, 1);
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
