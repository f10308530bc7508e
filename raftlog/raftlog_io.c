/*
 * raftlog_io.c — raft_uv's log writes and sends, wrapped (raft thread only): a failed write is
 * held and reported instead of handed back to raft, a run of slow writes hands leadership over,
 * a message to no known server is dropped, and test builds inject faults from a file.
 * The state is the raft thread's (raftlog_thread.h); this file takes no lock.
 */
#include "raftlog/raftlog_thread.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"

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
            kvp_rl_ev_send(rl, KVP_RAFTLOG_EV_LOG_FAILED, 0, KVP_ERR_IO, msg, strlen(msg));
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
 * strlen <- uvSend <- sendAppendEntriesResult <- appendFollowerCb; reported upstream as
 * canonical/raft issue 350, and as 339 through installSnapshotCb). Such a message is
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

void kvp_rl_io_install(struct kvp_raftlog *rl)
{
    rl->uv_append = rl->io.append;
    rl->io.append = rl_append;
    rl->uv_send = rl->io.send;
    rl->io.send = rl_send;
#ifdef KVP_FAULT_INJECTION
    rl_fault_install(rl);
#endif
}

