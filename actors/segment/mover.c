/*
 * mover.c — the mover actor (see mover.h). Its state is touched only on its thread: a timer
 * (MOVER_MSG_POLL) starts a poll, the session's reply brings the tasks.
 */
#define _GNU_SOURCE
#include "actors/segment/mover.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "actors/session/dtoken.h"
#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/log.h"

#define MOVER_IDLE_MS 250u
#define MOVER_MAX_TASKS 16u
#define MOVER_COPY_TIMEOUT_MS 8000u
#define MOVER_RPC_TIMEOUT_MS 2000u

enum { MOVER_MSG_POLL = 1 };

struct kvp_mover {
    struct kvp_msession *ms;
    _Atomic uint32_t *id;
    uint8_t *base;
    uint64_t size;
    char actor[200];
    struct kvp_xfer_engine *xe;
    struct kvp_dtoken *dtok; /* data-plane tokens toward other segments (NULL: auth none) */
    uint64_t copies_ok, copies_failed, bytes_moved; /* logged at stop */
    /* reports waiting for the next poll */
    Kvp__MoveDone *done;
    size_t n_done, cap_done;
    /* the poll in flight */
    bool polling;
    uint64_t poll_corr;
    uint32_t poll_id;      /* segment id it was sent for */
    size_t poll_reports;   /* reports it carries (the first ones of done[]) */
    bool failing;          /* polls fail: logged once */
};

static void clear_done(struct kvp_mover *m)
{
    for (size_t i = 0; i < m->n_done; i++)
        free(m->done[i].key);
    m->n_done = 0;
}

static void add_done(struct kvp_mover *m, const Kvp__MoveTask *t, int status)
{
    if (m->n_done == m->cap_done) {
        size_t cap = m->cap_done ? m->cap_done * 2 : 32;
        Kvp__MoveDone *d = realloc(m->done, cap * sizeof *d);
        if (!d)
            return; /* the master frees the replica when no report comes */
        m->done = d;
        m->cap_done = cap;
    }
    Kvp__MoveDone *d = &m->done[m->n_done];
    kvp__move_done__init(d);
    d->key = strdup(t->key ? t->key : "");
    if (!d->key)
        return;
    d->task_id = t->task_id;
    d->status = status;
    d->target_segment_id = t->target ? t->target->segment_id : 0;
    d->target_offset = t->target ? t->target->offset : 0;
    m->n_done++;
    if (status == KVP_OK) {
        m->copies_ok++;
        m->bytes_moved += t->size;
    } else {
        m->copies_failed++;
    }
}

/* Run the tasks of one poll as one transfer batch. */
static void run_tasks(struct kvp_mover *m, uint32_t id, Kvp__MoveTask **tasks, size_t n)
{
    struct kvp_xfer_slice sl[MOVER_MAX_TASKS];
    size_t idx[MOVER_MAX_TASKS], k = 0;
    for (size_t i = 0; i < n && i < MOVER_MAX_TASKS; i++) {
        const Kvp__MoveTask *t = tasks[i];
        if (!t->key || !t->target || !t->target->endpoint || t->size == 0 || t->src_segment_id != id ||
            t->src_offset > m->size || t->size > m->size - t->src_offset) {
            kvp_log_warn(m->actor, "move task %llu: not ours or out of bounds (segment %u, offset %llu, "
                         "%llu bytes)", (unsigned long long)t->task_id, t->src_segment_id,
                         (unsigned long long)t->src_offset, (unsigned long long)t->size);
            add_done(m, t, KVP_ERR_INVALID);
            continue;
        }
        const uint8_t *src = m->base + t->src_offset;
        if (XXH3_64bits(src, t->size) != t->checksum) {
            kvp_log_error(m->actor, "move of %s: source bytes do not match the checksum: not copied", t->key);
            add_done(m, t, KVP_ERR_CORRUPT);
            continue;
        }
        sl[k] = (struct kvp_xfer_slice){.local = (void *)src,
                                        .length = t->size,
                                        .segment_id = t->target->segment_id,
                                        .endpoint = t->target->endpoint,
                                        .remote_offset = t->target->offset,
                                        .op = KVP_XFER_WRITE};
        idx[k++] = i;
    }
    if (k == 0)
        return;
    kvp_dtoken_ensure(m->dtok, m->ms, m->xe, sl, k, MOVER_COPY_TIMEOUT_MS);
    kvp_xfer_run(m->xe, sl, k, MOVER_COPY_TIMEOUT_MS);
    for (size_t j = 0; j < k; j++) {
        if (sl[j].status != KVP_OK)
            kvp_log_warn(m->actor, "move of %s to segment %u (%s): %s", tasks[idx[j]]->key, sl[j].segment_id,
                         sl[j].endpoint, kvp_errname(sl[j].status));
        add_done(m, tasks[idx[j]], sl[j].status);
    }
}

/* Start the next poll after delay_ms. */
static int schedule(struct kvp_rt_ctx *ctx, uint32_t delay_ms)
{
    int rc = kvp_rt_timer_start(ctx, delay_ms, 0, MOVER_MSG_POLL, NULL);
    return rc == KVP_ERR_CLOSED ? KVP_OK : rc; /* NOMEM fails the actor: its supervisor restarts it */
}

static int on_poll_timer(struct kvp_rt_ctx *ctx, struct kvp_mover *m)
{
    uint32_t id = atomic_load_explicit(m->id, memory_order_relaxed);
    if (id == 0 || m->polling)
        return m->polling ? KVP_OK : schedule(ctx, MOVER_IDLE_MS);
    Kvp__Request req;
    Kvp__MoverPollReq q;
    Kvp__MoveDone *dp[256];
    kvp__request__init(&req);
    kvp__mover_poll_req__init(&q);
    q.segment_id = id;
    q.max_tasks = MOVER_MAX_TASKS;
    size_t nd = m->n_done < 256 ? m->n_done : 256;
    for (size_t i = 0; i < nd; i++)
        dp[i] = &m->done[i];
    q.done = dp;
    q.n_done = nd;
    req.body_case = KVP__REQUEST__BODY_MOVER_POLL;
    req.mover_poll = &q;
    int rc = kvp_msession_request(ctx, m->ms, &req, MOVER_RPC_TIMEOUT_MS, &m->poll_corr);
    if (rc != KVP_OK) {
        if (rc == KVP_ERR_NOMEM)
            return rc;
        if (!m->failing)
            kvp_log_debug(m->actor, "mover poll: %s", kvp_errname(rc));
        m->failing = true;
        return schedule(ctx, MOVER_IDLE_MS);
    }
    m->polling = true;
    m->poll_id = id;
    m->poll_reports = nd;
    return KVP_OK;
}

static int on_poll_reply(struct kvp_rt_ctx *ctx, struct kvp_mover *m, struct kvp_rt_msg *msg)
{
    m->polling = false;
    Kvp__Response *resp = msg->status == KVP_OK ? kvp_rt_msg_take(msg) : NULL;
    int rc = msg->status == KVP_OK ? (resp ? resp->status : KVP_ERR_MALFORMED) : msg->status;
    if (rc != KVP_OK) {
        if (!m->failing)
            kvp_log_debug(m->actor, "mover poll: %s", kvp_errname(rc));
        m->failing = true;
        kvp_msession_response_free(resp);
        return schedule(ctx, MOVER_IDLE_MS); /* reports kept for the next poll */
    }
    m->failing = false;
    /* delivered: drop the reports sent */
    size_t nd = m->poll_reports;
    for (size_t i = 0; i < nd; i++)
        free(m->done[i].key);
    if (nd > 0) { /* m->done may be NULL when nothing was reported */
        memmove(m->done, m->done + nd, (m->n_done - nd) * sizeof *m->done);
        m->n_done -= nd;
    }
    bool busy = false;
    if (resp->body_case == KVP__RESPONSE__BODY_MOVER_POLL && resp->mover_poll && resp->mover_poll->n_tasks) {
        run_tasks(m, m->poll_id, resp->mover_poll->tasks, resp->mover_poll->n_tasks);
        busy = true;
    }
    if (m->n_done)
        busy = true;
    kvp_msession_response_free(resp);
    return schedule(ctx, busy ? 0 : MOVER_IDLE_MS);
}

static int mover_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct kvp_mover *m = kvp_rt_state(ctx);
    if (msg->kind == KVP_RT_TIMER && msg->type == MOVER_MSG_POLL)
        return on_poll_timer(ctx, m);
    if (msg->kind == KVP_RT_REPLY && m->polling && msg->corr_id == m->poll_corr)
        return on_poll_reply(ctx, m, msg);
    return KVP_OK;
}

static int mover_init(struct kvp_rt_ctx *ctx)
{
    return schedule(ctx, MOVER_IDLE_MS);
}

static void mover_fini(struct kvp_rt_ctx *ctx)
{
    struct kvp_mover *m = kvp_rt_state(ctx);
    if (m->copies_ok || m->copies_failed)
        kvp_log_info(m->actor, "stopped: %llu copies done (%llu bytes), %llu failed",
                     (unsigned long long)m->copies_ok, (unsigned long long)m->bytes_moved,
                     (unsigned long long)m->copies_failed);
    kvp_xfer_engine_destroy(&m->xe);
    kvp_dtoken_destroy(&m->dtok); /* after the engine (made with its key) */
    clear_done(m);
    free(m->done);
    free(m);
}

int kvp_mover_spawn(struct kvp_rt_actor **out, struct kvp_rt_actor *parent, const struct kvp_mover_cfg *cfg)
{
    if (!out || !cfg || !cfg->ms || !cfg->id || !cfg->base)
        return KVP_ERR_INVALID;
    struct kvp_mover *m = calloc(1, sizeof *m);
    if (!m)
        return KVP_ERR_NOMEM;
    m->ms = cfg->ms;
    m->id = cfg->id;
    m->base = cfg->base;
    m->size = cfg->size;
    snprintf(m->actor, sizeof m->actor, "%s mover", cfg->actor ? cfg->actor : "segment");
    int rc = cfg->tokens ? kvp_dtoken_new(&m->dtok, m->actor) : KVP_OK;
    if (rc != KVP_OK) {
        free(m);
        return rc;
    }
    struct kvp_xfer_params xp = {.conns_per_peer = 2, .slice_bytes = 1u << 20, .connect_timeout_ms = 1000,
                                 .token_wallet = kvp_dtoken_key(m->dtok)};
    rc = kvp_xfer_engine_new(&m->xe, &xp);
    if (rc != KVP_OK) {
        kvp_dtoken_destroy(&m->dtok);
        free(m);
        return rc;
    }
    struct kvp_rt_spec spec = {.name = "mover", .init = mover_init, .handle = mover_handle, .fini = mover_fini,
                               .state = m};
    return kvp_rt_spawn(out, &spec, parent); /* owns m from here: any failure ran mover_fini */
}
