/*
 * raftlog_fsm.c — the FSM glue (raftlog_internal.h): raft_fsm apply/snapshot/restore over the
 * caller's opaque FSM, group entries proposed with one raft_apply each, and the LZ4-framed
 * snapshot format. Runs on the raft thread (or the test thread driving raft's fixture).
 */
#include <lz4frame.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "raftlog/raftlog_internal.h"
#include "runtime/clock.h"
#include "runtime/log.h"

int kvp_rl_err_from_raft(int rv)
{
    switch (rv) {
    case 0:
        return KVP_OK;
    case RAFT_NOTLEADER:
    case RAFT_LEADERSHIPLOST:
        return KVP_ERR_NOT_LEADER;
    case RAFT_SHUTDOWN:
    case RAFT_CANCELED:
        return KVP_ERR_CLOSED;
    case RAFT_NOMEM:
        return KVP_ERR_NOMEM;
    case RAFT_BADID:
    case RAFT_DUPLICATEID:
    case RAFT_DUPLICATEADDRESS:
    case RAFT_BADROLE:
    case RAFT_NOTFOUND:
    case RAFT_INVALID:
    case RAFT_MALFORMED:
        return KVP_ERR_INVALID;
    case RAFT_CANTCHANGE:
    case RAFT_BUSY:
        return KVP_ERR_BUSY;
    case RAFT_TOOBIG:
        return KVP_ERR_TOO_LARGE;
    case RAFT_IOERR:
    case RAFT_NOSPACE:
        return KVP_ERR_IO;
    case RAFT_NOCONNECTION:
        return KVP_ERR_UNAVAILABLE;
    default:
        return KVP_ERR_INTERNAL;
    }
}

/* ---- in-flight bookkeeping ---- */

static void inflight_unlink(struct kvp_rl_glue *g, struct kvp_rl_inflight *f)
{
    for (struct kvp_rl_inflight **pp = &g->inflight; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == f) {
            *pp = f->next;
            g->n_inflight--;
            return;
        }
    }
}

static struct kvp_rl_inflight *inflight_find(struct kvp_rl_glue *g, const void *base)
{
    raft_index idx = g->raft != NULL ? raft_last_applied(g->raft) + 1 : 0;
    for (struct kvp_rl_inflight *f = g->inflight; f != NULL; f = f->next) {
        /* The payload pointer identifies our entry (raft keeps the buffer we gave it in its
         * log); the index guards against an address reused after a truncated entry. */
        if (f->entry_base == base && !f->delivered && (idx == 0 || f->req.index == idx))
            return f;
    }
    return NULL;
}

static void apply_cb(struct raft_apply *req, int status, void *result)
{
    (void)result; /* fsm apply never returns a result object: results go through deliver */
    struct kvp_rl_inflight *f = req->data;
    struct kvp_rl_glue *g = f->glue;
    inflight_unlink(g, f);
    if (f->delivered && status == 0) {
        uint64_t us = kvp_clock_now_us() - f->proposed_us;
        g->entries_committed++;
        g->commit_us_total += us;
        g->cmds_committed += f->n;
        g->cmd_commit_us_total += us * f->n;
    }
    if (!f->delivered) {
        int st = status == 0 ? KVP_ERR_INTERNAL : kvp_rl_err_from_raft(status);
        if (status == 0)
            kvp_log_error(g->actor, "entry %llu applied without results reaching us",
                          (unsigned long long)req->index);
        else
            kvp_log_debug(g->actor, "entry %llu failed: %s", (unsigned long long)req->index,
                          raft_strerror(status));
        for (uint32_t i = 0; i < f->n; i++)
            g->deliver(g->deliver_ctx, f->corrs[i], st, NULL, 0);
    }
    free(f);
    if (g->on_done != NULL)
        g->on_done(g->deliver_ctx);
}

int kvp_rl_glue_propose(struct kvp_rl_glue *g, const uint64_t *corrs, const struct kvp_rl_cmd *cmds,
                        uint32_t n)
{
    if (g->raft == NULL || n == 0)
        return KVP_ERR_INVALID;
    size_t sz = kvp_rl_entry_size(cmds, n);
    if (sz == 0)
        return KVP_ERR_INVALID;
    struct kvp_rl_inflight *f = malloc(sizeof(*f) + (size_t)n * sizeof(uint64_t));
    if (f == NULL)
        return KVP_ERR_NOMEM;
    uint8_t *payload = raft_malloc(sz);
    if (payload == NULL) {
        free(f);
        return KVP_ERR_NOMEM;
    }
    size_t written = 0;
    int rc = kvp_rl_entry_encode(payload, sz, cmds, n, &written);
    if (rc != KVP_OK) {
        raft_free(payload);
        free(f);
        return rc;
    }
    memset(&f->req, 0, sizeof(f->req));
    f->req.data = f;
    f->glue = g;
    f->entry_base = payload;
    f->n = n;
    f->delivered = false;
    f->stored = false;
    f->proposed_us = kvp_clock_now_us();
    memcpy(f->corrs, corrs, (size_t)n * sizeof(uint64_t));
    /* Link before raft_apply: with an in-memory io raft may apply synchronously. */
    f->next = NULL;
    struct kvp_rl_inflight **pp = &g->inflight;
    while (*pp != NULL)
        pp = &(*pp)->next;
    *pp = f;
    g->n_inflight++;
    struct raft_buffer buf = {.base = payload, .len = written};
    int rv = raft_apply(g->raft, &f->req, &buf, 1, apply_cb);
    if (rv != 0) {
        inflight_unlink(g, f);
        raft_free(payload);
        free(f);
        return kvp_rl_err_from_raft(rv);
    }
    g->entries_proposed++;
    g->cmds_proposed += n;
    return KVP_OK;
}

void kvp_rl_glue_note_stored(struct kvp_rl_glue *g)
{
    if (g->raft == NULL || g->inflight == NULL)
        return;
    raft_index stored = g->raft->last_stored;
    uint64_t now = 0;
    for (struct kvp_rl_inflight *f = g->inflight; f != NULL; f = f->next) {
        if (f->stored || f->req.index == 0 || f->req.index > stored)
            continue;
        f->stored = true;
        if (now == 0)
            now = kvp_clock_now_us();
        g->entries_stored++;
        g->store_us_total += now - f->proposed_us;
    }
}

/* ---- raft_fsm ---- */

static int fsm_apply(struct raft_fsm *fsm, const struct raft_buffer *buf, void **result)
{
    struct kvp_rl_glue *g = fsm->data;
    *result = NULL;
    struct kvp_rl_entry_iter it;
    int rc = kvp_rl_entry_decode(buf->base, buf->len, &it);
    struct kvp_rl_inflight *mine = inflight_find(g, buf->base);
    if (rc != KVP_OK) {
        /* Deterministic on every node: the entry is skipped everywhere. Never an error to raft
         * (that would wedge the log). */
        g->entries_malformed++;
        kvp_log_error(g->actor, "entry of %zu bytes skipped: %s", buf->len, kvp_strerror(rc));
        if (mine != NULL) {
            mine->delivered = true;
            for (uint32_t i = 0; i < mine->n; i++)
                g->deliver(g->deliver_ctx, mine->corrs[i], KVP_ERR_INTERNAL, NULL, 0);
        }
        return 0;
    }
    if (mine != NULL && mine->n != it.count) {
        kvp_log_error(g->actor, "own entry holds %u commands, expected %u", it.count, mine->n);
        mine = NULL;
    }
    struct kvp_rl_cmd cmd;
    uint32_t i = 0;
    while (kvp_rl_entry_next(&it, &cmd)) {
        uint8_t *res = NULL;
        size_t res_len = 0;
        /* Locked per command, not per entry: a reader waits for one apply at most. */
        if (g->fsm_lock != NULL)
            pthread_rwlock_wrlock(g->fsm_lock);
        int st = g->user.apply(g->user.ctx, cmd.data, cmd.len, &res, &res_len);
        if (g->fsm_lock != NULL)
            pthread_rwlock_unlock(g->fsm_lock);
        if (mine != NULL)
            g->deliver(g->deliver_ctx, mine->corrs[i], st, res, res != NULL ? res_len : 0);
        free(res);
        i++;
    }
    if (mine != NULL)
        mine->delivered = true;
    g->entries_applied++;
    g->cmds_applied += it.count;
    g->log_bytes += buf->len;
    g->log_entries++;
    if (g->snap_log_bytes > 0 && g->log_bytes >= g->snap_log_bytes && !g->snap_forced && g->raft != NULL &&
        g->user.snapshot != NULL) {
        /* raft checks the threshold right after this apply batch, so a snapshot follows now. */
        raft_set_snapshot_threshold(g->raft, 1);
        g->snap_forced = true;
        g->snapshots_by_bytes++;
    }
    return 0;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

int kvp_rl_snap_pack(const uint8_t *raw, size_t raw_len, uint8_t **out, size_t *out_len)
{
    LZ4F_preferences_t prefs;
    memset(&prefs, 0, sizeof(prefs));
    prefs.frameInfo.contentSize = raw_len;
    size_t bound = LZ4F_compressFrameBound(raw_len, &prefs);
    uint8_t *buf = malloc(KVP_RL_SNAP_HDR_BYTES + bound);
    if (buf == NULL)
        return KVP_ERR_NOMEM;
    size_t n = LZ4F_compressFrame(buf + KVP_RL_SNAP_HDR_BYTES, bound, raw, raw_len, &prefs);
    if (LZ4F_isError(n)) {
        free(buf);
        return KVP_ERR_INTERNAL;
    }
    put_le(buf, KVP_RL_SNAP_MAGIC, 4);
    buf[4] = (uint8_t)KVP_RL_SNAP_VERSION;
    put_le(buf + 5, raw_len, 8);
    *out = buf;
    *out_len = KVP_RL_SNAP_HDR_BYTES + n;
    return KVP_OK;
}

int kvp_rl_snap_unpack(const uint8_t *buf, size_t len, uint8_t **raw, size_t *raw_len)
{
    if (buf == NULL || len < KVP_RL_SNAP_HDR_BYTES || get_le(buf, 4) != KVP_RL_SNAP_MAGIC)
        return KVP_ERR_MALFORMED;
    if (buf[4] != KVP_RL_SNAP_VERSION)
        return KVP_ERR_VERSION;
    uint64_t want = get_le(buf + 5, 8);
    size_t clen = len - KVP_RL_SNAP_HDR_BYTES;
    /* LZ4 cannot expand data by more than ~255x: a larger claim is a lie, not a snapshot. */
    if (want > KVP_RL_SNAP_MAX_RAW_BYTES || want > (uint64_t)clen * 255u + 64u)
        return KVP_ERR_MALFORMED;
    uint8_t *dst = malloc(want > 0 ? (size_t)want : 1);
    if (dst == NULL)
        return KVP_ERR_NOMEM;
    LZ4F_dctx *dctx = NULL;
    if (LZ4F_isError(LZ4F_createDecompressionContext(&dctx, LZ4F_VERSION))) {
        free(dst);
        return KVP_ERR_NOMEM;
    }
    const uint8_t *src = buf + KVP_RL_SNAP_HDR_BYTES;
    size_t src_left = clen, produced = 0;
    size_t hint = 1;
    int rc = KVP_OK;
    while (hint != 0) {
        if (src_left == 0) {
            rc = KVP_ERR_MALFORMED; /* frame not finished */
            break;
        }
        size_t dst_sz = (size_t)want - produced, src_sz = src_left;
        hint = LZ4F_decompress(dctx, dst + produced, &dst_sz, src, &src_sz, NULL);
        if (LZ4F_isError(hint)) {
            rc = KVP_ERR_MALFORMED;
            break;
        }
        if (dst_sz == 0 && src_sz == 0 && hint != 0) {
            rc = KVP_ERR_MALFORMED; /* output full but frame wants more: oversized */
            break;
        }
        produced += dst_sz;
        src += src_sz;
        src_left -= src_sz;
    }
    LZ4F_freeDecompressionContext(dctx);
    if (rc == KVP_OK && (produced != want || src_left != 0))
        rc = KVP_ERR_MALFORMED;
    if (rc != KVP_OK) {
        free(dst);
        return rc;
    }
    *raw = dst;
    *raw_len = (size_t)want;
    return KVP_OK;
}

/* The log restarts at a snapshot (taken or installed): nothing counts toward the byte bound
 * any more, and a threshold lowered to force the snapshot goes back. */
static void log_bound_reset(struct kvp_rl_glue *g)
{
    if (g->snap_forced && g->raft != NULL)
        raft_set_snapshot_threshold(g->raft, g->base_threshold);
    g->snap_forced = false;
    g->log_bytes = 0;
    g->log_entries = 0;
}

static int fsm_snapshot(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
    struct kvp_rl_glue *g = fsm->data;
    if (g->user.snapshot == NULL)
        return RAFT_INVALID;
    uint8_t *raw = NULL;
    size_t raw_len = 0;
    uint64_t t0 = kvp_clock_now_us();
    int rc = g->user.snapshot(g->user.ctx, &raw, &raw_len);
    uint64_t t1 = kvp_clock_now_us();
    if (rc != KVP_OK) {
        kvp_log_error(g->actor, "fsm snapshot failed: %s", kvp_strerror(rc));
        free(raw);
        return RAFT_IOERR;
    }
    uint8_t *packed = NULL;
    size_t packed_len = 0;
    rc = kvp_rl_snap_pack(raw != NULL ? raw : (const uint8_t *)"", raw != NULL ? raw_len : 0, &packed,
                          &packed_len);
    free(raw);
    if (rc != KVP_OK) {
        kvp_log_error(g->actor, "snapshot of %zu bytes not framed: %s; not stored", raw_len, kvp_strerror(rc));
        return RAFT_NOMEM;
    }
    struct raft_buffer *b = raft_malloc(sizeof(*b));
    if (b == NULL) {
        free(packed);
        return RAFT_NOMEM;
    }
    b->base = packed; /* freed by fsm_snapshot_finalize with free() */
    b->len = packed_len;
    *bufs = b;
    *n_bufs = 1;
    g->snapshots_taken++;
    kvp_metrics_hist_observe_us(&g->snapshot_hist, kvp_clock_now_us() - t0);
    kvp_log_info(g->actor, "snapshot taken: %zu bytes raw, %zu framed; fsm %llu ms, lz4 %llu ms", raw_len,
                 packed_len, (unsigned long long)(t1 - t0) / 1000,
                 (unsigned long long)(kvp_clock_now_us() - t1) / 1000);
    if (g->raft != NULL && g->snap_log_bytes > 0) {
        /* Trailing entries (kept for followers slightly behind) bounded to ~1/8 of the byte
         * bound at this log's mean entry size; raft reads it when the snapshot is stored. */
        uint64_t mean = g->log_entries ? g->log_bytes / g->log_entries : 0;
        uint64_t keep = mean ? (g->snap_log_bytes / 8) / mean : g->base_trailing;
        if (keep < 16)
            keep = 16;
        if (keep > g->base_trailing)
            keep = g->base_trailing;
        raft_set_snapshot_trailing(g->raft, (unsigned)keep);
    }
    log_bound_reset(g);
    return 0;
}

static int fsm_snapshot_finalize(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
    (void)fsm;
    if (*bufs != NULL) {
        for (unsigned i = 0; i < *n_bufs; i++)
            free((*bufs)[i].base);
        raft_free(*bufs);
    }
    *bufs = NULL;
    *n_bufs = 0;
    return 0;
}

static int fsm_restore(struct raft_fsm *fsm, struct raft_buffer *buf)
{
    struct kvp_rl_glue *g = fsm->data;
    if (g->user.restore == NULL)
        return RAFT_INVALID;
    uint8_t *raw = NULL;
    size_t raw_len = 0;
    int rc = kvp_rl_snap_unpack(buf->base, buf->len, &raw, &raw_len);
    if (rc != KVP_OK) {
        kvp_log_error(g->actor, "snapshot of %zu bytes rejected: %s", buf->len, kvp_strerror(rc));
        return RAFT_MALFORMED;
    }
    if (g->fsm_lock != NULL)
        pthread_rwlock_wrlock(g->fsm_lock);
    rc = g->user.restore(g->user.ctx, raw, raw_len);
    if (g->fsm_lock != NULL)
        pthread_rwlock_unlock(g->fsm_lock);
    free(raw);
    if (rc != KVP_OK) {
        kvp_log_error(g->actor, "fsm restore failed: %s", kvp_strerror(rc));
        return RAFT_IOERR;
    }
    /* On success the FSM owns the buffer raft handed over. */
    raft_free(buf->base);
    g->snapshots_restored++;
    log_bound_reset(g); /* or a second full snapshot would follow the install */
    kvp_log_info(g->actor, "snapshot restored: %zu bytes", raw_len);
    return 0;
}

void kvp_rl_glue_init(struct kvp_rl_glue *g, const struct kvp_raftlog_fsm *user,
                      kvp_rl_deliver_fn deliver, void *ctx, const char *actor)
{
    memset(g, 0, sizeof(*g));
    g->user = *user;
    g->deliver = deliver;
    g->deliver_ctx = ctx;
    g->actor = actor;
    g->fsm.version = 2;
    g->fsm.data = g;
    g->fsm.apply = fsm_apply;
    g->fsm.snapshot = fsm_snapshot;
    g->fsm.snapshot_finalize = fsm_snapshot_finalize;
    g->fsm.restore = fsm_restore;
}

void kvp_rl_glue_fini(struct kvp_rl_glue *g)
{
    while (g->inflight != NULL) {
        struct kvp_rl_inflight *f = g->inflight;
        g->inflight = f->next;
        free(f);
    }
    g->n_inflight = 0;
}
