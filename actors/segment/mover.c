/*
 * mover.c — see mover.h.
 */
#define _GNU_SOURCE
#include "actors/segment/mover.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "actors/client/dtoken.h"
#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "runtime/log.h"

#define MOVER_IDLE_MS 250u
#define MOVER_MAX_TASKS 16u
#define MOVER_COPY_TIMEOUT_MS 8000u
#define MOVER_RPC_TIMEOUT_MS 2000u

struct kvp_mover {
    struct kvp_msession *ms;
    _Atomic uint32_t *id;
    uint8_t *base;
    uint64_t size;
    char actor[200];
    struct kvp_xfer_engine *xe;
    struct kvp_dtoken *dtok; /* data-plane tokens toward other segments (NULL: auth none) */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stopping;
    struct kvp_mover_stats st;
    /* reports waiting for the next poll */
    Kvp__MoveDone *done;
    size_t n_done, cap_done;
};

static bool wait_stop(struct kvp_mover *m, uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_mutex_lock(&m->mu);
    while (!m->stopping)
        if (pthread_cond_timedwait(&m->cv, &m->mu, &ts) == ETIMEDOUT)
            break;
    bool st = m->stopping;
    pthread_mutex_unlock(&m->mu);
    return st;
}

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
    pthread_mutex_lock(&m->mu);
    if (status == KVP_OK) {
        m->st.copies_ok++;
        m->st.bytes_moved += t->size;
    } else {
        m->st.copies_failed++;
    }
    pthread_mutex_unlock(&m->mu);
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
    kvp_dtoken_ensure(m->dtok, m->ms, sl, k, MOVER_COPY_TIMEOUT_MS);
    kvp_xfer_run(m->xe, sl, k, MOVER_COPY_TIMEOUT_MS);
    for (size_t j = 0; j < k; j++) {
        if (sl[j].status != KVP_OK)
            kvp_log_warn(m->actor, "move of %s to segment %u (%s): %s", tasks[idx[j]]->key, sl[j].segment_id,
                         sl[j].endpoint, kvp_errname(sl[j].status));
        add_done(m, tasks[idx[j]], sl[j].status);
    }
}

static void *mover_main(void *arg)
{
    struct kvp_mover *m = arg;
    bool busy = false, failing = false;
    while (!wait_stop(m, busy ? 0 : MOVER_IDLE_MS)) {
        uint32_t id = atomic_load_explicit(m->id, memory_order_relaxed);
        busy = false;
        if (id == 0)
            continue;
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
        Kvp__Response *resp = NULL;
        int rc = kvp_msession_call(m->ms, &req, MOVER_RPC_TIMEOUT_MS, &resp);
        if (rc == KVP_OK)
            rc = resp->status;
        if (rc != KVP_OK) {
            if (!failing)
                kvp_log_debug(m->actor, "mover poll: %s", kvp_errname(rc));
            failing = true;
            kvp_msession_response_free(resp);
            continue; /* reports kept for the next poll */
        }
        failing = false;
        /* delivered: drop the reports sent */
        for (size_t i = 0; i < nd; i++)
            free(m->done[i].key);
        if (nd > 0) { /* m->done may be NULL when nothing was reported */
            memmove(m->done, m->done + nd, (m->n_done - nd) * sizeof *m->done);
            m->n_done -= nd;
        }
        if (resp->body_case == KVP__RESPONSE__BODY_MOVER_POLL && resp->mover_poll &&
            resp->mover_poll->n_tasks) {
            run_tasks(m, id, resp->mover_poll->tasks, resp->mover_poll->n_tasks);
            busy = true;
        }
        if (m->n_done)
            busy = true;
        kvp_msession_response_free(resp);
    }
    return NULL;
}

int kvp_mover_start(struct kvp_mover **out, struct kvp_msession *ms, _Atomic uint32_t *id, void *base,
                    uint64_t size, const char *actor, bool tokens)
{
    if (!out || !ms || !id || !base)
        return KVP_ERR_INVALID;
    struct kvp_mover *m = calloc(1, sizeof *m);
    if (!m)
        return KVP_ERR_NOMEM;
    m->ms = ms;
    m->id = id;
    m->base = base;
    m->size = size;
    snprintf(m->actor, sizeof m->actor, "%s mover", actor ? actor : "segment");
    pthread_mutex_init(&m->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = tokens ? kvp_dtoken_new(&m->dtok, m->actor) : KVP_OK;
    if (rc != KVP_OK)
        goto fail;
    struct kvp_xfer_params xp = {.conns_per_peer = 2, .slice_bytes = 1u << 20, .connect_timeout_ms = 1000,
                                 .token_respond = m->dtok ? kvp_dtoken_respond : NULL, .token_ctx = m->dtok};
    rc = kvp_xfer_engine_new(&m->xe, &xp);
    if (rc != KVP_OK)
        goto fail;
    if (pthread_create(&m->th, NULL, mover_main, m) != 0) {
        rc = KVP_ERR_NOMEM;
        goto fail;
    }
    *out = m;
    return KVP_OK;
fail:
    kvp_xfer_engine_destroy(&m->xe);
    kvp_dtoken_destroy(&m->dtok);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m);
    return rc;
}

void kvp_mover_get_stats(struct kvp_mover *m, struct kvp_mover_stats *st)
{
    if (!m || !st)
        return;
    pthread_mutex_lock(&m->mu);
    *st = m->st;
    pthread_mutex_unlock(&m->mu);
}

void kvp_mover_stop(struct kvp_mover **mp)
{
    if (!mp || !*mp)
        return;
    struct kvp_mover *m = *mp;
    *mp = NULL;
    pthread_mutex_lock(&m->mu);
    m->stopping = true;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->th, NULL);
    kvp_xfer_engine_destroy(&m->xe);
    kvp_dtoken_destroy(&m->dtok); /* after the engine: its transports call it */
    clear_done(m);
    free(m->done);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m);
}
