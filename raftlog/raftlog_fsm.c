/*
 * raftlog_fsm.c — the FSM glue (raftlog_internal.h): raft_fsm apply/snapshot/restore over the
 * caller's opaque FSM, group entries proposed with one raft_apply each, and the LZ4-framed
 * snapshot format. Runs on the raft thread (or the test thread driving raft's fixture).
 */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include <lz4.h>
#include <lz4frame.h>
#include <xxhash.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "kvpool.h"
#include "raftlog/raftlog_internal.h"
#include "runtime/clock.h"
#include "runtime/log.h"

/* CPU time of the calling thread: on a host short of CPUs a stretch of work can take far longer
 * in wall time than it costs; both are recorded. */
static uint64_t thread_cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* A hold of the raft thread over this much of its CPU is logged at INFO with what it did: the
 * entry's size, the thread's minor page faults and involuntary switches over it (RUSAGE_THREAD),
 * and the FSM's own line (hold_note): to find what each remaining long hold is (issue 22). */
#define RL_HOLD_NOTE_CPU_US 20000u

struct hold {
    uint64_t t0, c0, sys0;
    long minflt, majflt, nivcsw;
};

static uint64_t tv_us(struct timeval tv)
{
    return (uint64_t)tv.tv_sec * 1000000u + (uint64_t)tv.tv_usec;
}

static void hold_begin(struct kvp_rl_glue *g, struct hold *h)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    h->minflt = ru.ru_minflt;
    h->majflt = ru.ru_majflt;
    h->nivcsw = ru.ru_nivcsw;
    h->sys0 = tv_us(ru.ru_stime);
    h->t0 = kvp_clock_now_us();
    h->c0 = thread_cpu_us();
    if (g->user.hold_note != NULL)
        g->user.hold_note(g->user.ctx, true, NULL, 0);
}

/* Logs the hold when it used RL_HOLD_NOTE_CPU_US of CPU or more; what: "entry apply (N commands, B
 * bytes)" etc. */
static void hold_end(struct kvp_rl_glue *g, const struct hold *h, uint64_t us, uint64_t cpu, const char *what)
{
    if (cpu < RL_HOLD_NOTE_CPU_US)
        return;
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    char note[512] = "";
    if (g->user.hold_note != NULL)
        g->user.hold_note(g->user.ctx, false, note, sizeof note);
    g->holds_logged++;
    kvp_log_info(g->actor, "slow hold: %s: %llu ms wall, %llu ms CPU (%llu ms of it in the kernel), %ld minor / %ld "
                 "major page faults, %ld preemptions; fsm: %s", what, (unsigned long long)us / 1000,
                 (unsigned long long)cpu / 1000, (unsigned long long)(tv_us(ru.ru_stime) - h->sys0) / 1000,
                 ru.ru_minflt - h->minflt, ru.ru_majflt - h->majflt, ru.ru_nivcsw - h->nivcsw, note);
}

const char *kvp_rl_strerror(int rv)
{
    switch (rv) {
    case RAFT_NOSPACE: return "not enough space on disk";
    default: return raft_strerror(rv);
    }
}

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

static void snap_inc_after_apply(struct kvp_rl_glue *g, const void *entry, size_t len);
static void apply_entry(struct kvp_rl_glue *g, struct kvp_rl_entry_iter *it, struct kvp_rl_inflight *mine);
static void after_apply(struct kvp_rl_glue *g, const void *entry, size_t len, uint32_t n_cmds);
static int defer_push(struct kvp_rl_glue *g, const void *entry, size_t len);
static int catch_up_unit(struct kvp_rl_glue *g, bool *idle);

static int fsm_apply(struct raft_fsm *fsm, const struct raft_buffer *buf, void **result)
{
    struct kvp_rl_glue *g = fsm->data;
    *result = NULL;
    struct kvp_rl_entry_iter it;
    int rc = kvp_rl_entry_decode(buf->base, buf->len, &it);
    struct kvp_rl_inflight *mine = inflight_find(g, buf->base);
    if (rc != KVP_OK) {
        /* Deterministic on every node: the entry is skipped everywhere (a newer entry version is
         * skipped only by older masters: a new format may be written only once every member reads
         * it, docs/operations.md "Upgrading"). Never an error to raft
         * (that would wedge the log). */
        g->entries_malformed++;
        if (rc == KVP_ERR_VERSION)
            kvp_log_error(g->actor, "entry of %zu bytes skipped: entry format version %u, this master reads %u "
                          "(written by a newer master: upgrade this one, docs/operations.md \"Upgrading\")",
                          buf->len, (unsigned)((const uint8_t *)buf->base)[4], (unsigned)KVP_RL_ENTRY_VERSION);
        else
            kvp_log_error(g->actor, "entry of %zu bytes skipped: %s", buf->len, kvp_strerror(rc));
        if (mine != NULL) {
            mine->delivered = true;
            for (uint32_t i = 0; i < mine->n; i++)
                g->deliver(g->deliver_ctx, mine->corrs[i], KVP_ERR_INTERNAL, NULL, 0);
        }
        return 0; /* not in a snapshot's tail either: a replay would skip it the same way */
    }
    if (mine != NULL && mine->n != it.count) {
        kvp_log_error(g->actor, "own entry holds %u commands, expected %u", it.count, mine->n);
        mine = NULL;
    }
    if (g->failed)
        return 0; /* a failed staged install: the state is behind and the member is stopping */
    bool leader = g->raft != NULL && raft_state(g->raft) == RAFT_LEADER;
    if (g->steps && mine == NULL && !leader) {
        /* A follower: behind a staged install or past this iteration's budget, the entry
         * waits in order (applied by kvp_rl_glue_catch_up_step, one loop iteration at a time). */
        bool defer = kvp_rl_glue_behind(g);
        if (!defer && g->apply_budget_us > 0) {
            uint64_t now = kvp_clock_now_us();
            if (g->apply_iter != g->iter_seq) {
                g->apply_iter = g->iter_seq;
                g->apply_iter_t0_us = now;
            } else if (now - g->apply_iter_t0_us >= g->apply_budget_us) {
                defer = true;
            }
        } else if (defer && g->rs != 1 && g->rs != 2 && g->defer_max_bytes > 0 &&
                   g->q_bytes + buf->len > g->defer_max_bytes) {
            /* The memory bound: the oldest queued entries are applied now, in order, until this
             * one fits (usually one per arrival). Only here does a follower apply its backlog
             * inside raft's callback; below the bound a burst (a restarted member is handed
             * every entry since its snapshot in one callback: 320 entries, 1,031 ms of CPU in
             * session 31, when each arrival at the time bound applied part of the queue) just
             * queues, and the idle steps apply it a budget per loop iteration
             * (kvp_rl_glue_catch_up_budget_us). */
            uint64_t done = 0;
            while (g->q_head != NULL && g->q_bytes + buf->len > g->defer_max_bytes) {
                bool idle = false;
                if (catch_up_unit(g, &idle) != KVP_OK || idle)
                    break;
                done++;
            }
            if (done > g->max_backlog_applied)
                g->max_backlog_applied = done;
            if (g->failed)
                return 0;
        }
        if (defer && defer_push(g, buf->base, buf->len) == KVP_OK) {
            after_apply(g, buf->base, buf->len, it.count);
            return 0;
        }
    }
    if (kvp_rl_glue_behind(g) && kvp_rl_glue_catch_up(g) != KVP_OK)
        return 0; /* failed: nothing more is applied */
    apply_entry(g, &it, mine);
    after_apply(g, buf->base, buf->len, it.count);
    return 0;
}

/* Apply the commands of one decoded entry, delivering results of this node's own. */
static void apply_entry(struct kvp_rl_glue *g, struct kvp_rl_entry_iter *it, struct kvp_rl_inflight *mine)
{
    struct kvp_rl_cmd cmd;
    uint32_t i = 0;
    struct hold h;
    hold_begin(g, &h);
    uint64_t t0 = h.t0, c0 = h.c0;
    size_t bytes = 0;
    while (kvp_rl_entry_next(it, &cmd)) {
        bytes += cmd.len;
        uint8_t *res = NULL;
        size_t res_len = 0;
        /* Locked per command, not per entry: a reader waits for one apply at most. */
        kvp_rl_view_write_begin(g->view);
        int st = g->user.apply(g->user.ctx, cmd.data, cmd.len, &res, &res_len);
        kvp_rl_view_end(g->view);
        if (mine != NULL)
            g->deliver(g->deliver_ctx, mine->corrs[i], st, res, res != NULL ? res_len : 0);
        free(res);
        i++;
    }
    if (mine != NULL)
        mine->delivered = true;
    if (++g->iter_applied > g->max_iter_applied)
        g->max_iter_applied = g->iter_applied;
    uint64_t apply_us = kvp_clock_now_us() - t0, apply_cpu = thread_cpu_us() - c0;
    g->apply_mean_us = g->apply_mean_us ? (g->apply_mean_us * 7 + apply_us) / 8 : apply_us;
    if (apply_us > g->max_apply_us)
        g->max_apply_us = apply_us;
    if (apply_cpu > g->max_apply_cpu_us)
        g->max_apply_cpu_us = apply_cpu;
    if (apply_cpu >= RL_HOLD_NOTE_CPU_US) {
        char what[96];
        snprintf(what, sizeof what, "entry apply (%u commands, %zu bytes%s)", i, bytes, mine ? ", own" : "");
        hold_end(g, &h, apply_us, apply_cpu, what);
    }
}

/* What follows raft handing over an entry, applied now or deferred: counters, the byte bound,
 * the incremental snapshot's log tail (an entry raft counts applied belongs to the tail even
 * while its apply waits). */
static void after_apply(struct kvp_rl_glue *g, const void *entry, size_t len, uint32_t n_cmds)
{
    g->entries_applied++;
    g->cmds_applied += n_cmds;
    g->log_bytes += len;
    g->log_entries++;
    if (g->inc) {
        snap_inc_after_apply(g, entry, len);
        return;
    }
    if (g->snap_log_bytes > 0 && g->log_bytes >= g->snap_log_bytes && !g->snap_forced && g->raft != NULL &&
        g->user.snapshot != NULL) {
        /* raft checks the threshold right after this apply batch, so a snapshot follows now. */
        raft_set_snapshot_threshold(g->raft, 1);
        g->snap_forced = true;
        g->snapshots_by_bytes++;
    }
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


/* ---- snapshot container version 2 (raftlog_internal.h) ---- */

#define RL_NO_THRESHOLD 0xFFFFFFFFu /* raft never takes a snapshot on its own count */
#define RL_TAIL_BLOCK ((size_t)4 << 20)

static int vec_push(uint8_t ***v, size_t **lens, size_t *n, size_t *cap, uint8_t *p, size_t len)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        uint8_t **nv = realloc(*v, c * sizeof(**v));
        if (nv == NULL)
            return KVP_ERR_NOMEM;
        *v = nv;
        size_t *nl = realloc(*lens, c * sizeof(**lens));
        if (nl == NULL)
            return KVP_ERR_NOMEM;
        *lens = nl;
        *cap = c;
    }
    (*v)[*n] = p;
    (*lens)[*n] = len;
    (*n)++;
    return KVP_OK;
}

/* LZ4-compress raw into one chunk record and add it to the build. */
static int chunk_add(struct kvp_rl_glue *g, const uint8_t *raw, size_t raw_len)
{
    if (raw_len > (size_t)LZ4_MAX_INPUT_SIZE)
        return KVP_ERR_TOO_LARGE;
    int bound = LZ4_compressBound((int)raw_len);
    uint8_t *rec = malloc(KVP_RL_SNAP2_CHUNK_HDR + (size_t)bound);
    if (rec == NULL)
        return KVP_ERR_NOMEM;
    int n = LZ4_compress_default((const char *)raw, (char *)rec + KVP_RL_SNAP2_CHUNK_HDR, (int)raw_len, bound);
    if (n <= 0 && raw_len > 0) {
        free(rec);
        return KVP_ERR_INTERNAL;
    }
    put_le(rec, raw_len, 4);
    put_le(rec + 4, (uint64_t)n, 4);
    put_le(rec + 8, XXH3_64bits(rec + KVP_RL_SNAP2_CHUNK_HDR, (size_t)n), 8);
    size_t len = KVP_RL_SNAP2_CHUNK_HDR + (size_t)n;
    uint8_t *shrunk = realloc(rec, len); /* give back the bound's slack */
    if (shrunk != NULL)
        rec = shrunk;
    if (vec_push(&g->chunks, &g->chunk_lens, &g->n_chunks, &g->chunks_cap, rec, len) != KVP_OK) {
        free(rec);
        return KVP_ERR_NOMEM;
    }
    g->build_raw += raw_len;
    g->build_framed += len;
    return KVP_OK;
}

/* Copy an applied entry into the tail (blocks of up to 4 MiB of records). */
static int tail_add(struct kvp_rl_glue *g, const void *entry, size_t len)
{
    size_t need = KVP_RL_SNAP2_TAIL_HDR + len;
    size_t last = g->n_tail ? g->tail_lens[g->n_tail - 1] : 0;
    if (g->n_tail == 0 || last + need > RL_TAIL_BLOCK) {
        size_t cap = need > RL_TAIL_BLOCK ? need : RL_TAIL_BLOCK;
        uint8_t *blk = malloc(cap);
        if (blk == NULL)
            return KVP_ERR_NOMEM;
        if (vec_push(&g->tail, &g->tail_lens, &g->n_tail, &g->tail_cap, blk, 0) != KVP_OK) {
            free(blk);
            return KVP_ERR_NOMEM;
        }
        last = 0;
    }
    uint8_t *p = g->tail[g->n_tail - 1] + last;
    put_le(p, len, 4);
    put_le(p + 4, XXH3_64bits(entry, len), 8);
    memcpy(p + KVP_RL_SNAP2_TAIL_HDR, entry, len);
    g->tail_lens[g->n_tail - 1] = last + need;
    g->tail_bytes += need;
    return KVP_OK;
}

static void build_free(struct kvp_rl_glue *g)
{
    for (size_t i = 0; i < g->n_chunks; i++)
        free(g->chunks[i]);
    for (size_t i = 0; i < g->n_tail; i++)
        free(g->tail[i]);
    free(g->chunks);
    free(g->chunk_lens);
    free(g->tail);
    free(g->tail_lens);
    g->chunks = g->tail = NULL;
    g->chunk_lens = g->tail_lens = NULL;
    g->n_chunks = g->chunks_cap = g->n_tail = g->tail_cap = 0;
    g->build_raw = g->build_framed = g->tail_bytes = 0;
    g->build_busy_us = 0;
}

void kvp_rl_glue_snap_drop(struct kvp_rl_glue *g)
{
    if (g->build == 1 && g->user.snap_abort != NULL)
        g->user.snap_abort(g->user.ctx);
    if (g->build != 0 && g->raft != NULL)
        raft_set_snapshot_threshold(g->raft, RL_NO_THRESHOLD);
    g->build = 0;
    build_free(g);
}

int kvp_rl_glue_snap_start(struct kvp_rl_glue *g)
{
    if (!g->inc)
        return KVP_ERR_INVALID;
    if (g->build != 0)
        return KVP_OK;
    if (kvp_rl_glue_behind(g))
        return KVP_ERR_BUSY; /* the FSM lags raft's applied index: after the catch-up */
    uint64_t t0 = kvp_clock_now_us();
    /* Read lock: begin only marks objects (generations) that readers never look at. */
    kvp_rl_view_scan_begin(g->view);
    int rc = g->user.snap_begin(g->user.ctx);
    kvp_rl_view_end(g->view);
    if (rc != KVP_OK) {
        kvp_log_error(g->actor, "snapshot not begun: %s", kvp_strerror(rc));
        return rc;
    }
    g->build = 1;
    g->build_t0_us = t0;
    g->build_busy_us = kvp_clock_now_us() - t0;
    g->build_cpu_us = 0;
    return KVP_OK;
}

bool kvp_rl_glue_snap_pending(const struct kvp_rl_glue *g)
{
    return g->build == 1;
}

int kvp_rl_glue_snap_work(struct kvp_rl_glue *g)
{
    if (g->build != 1)
        return KVP_OK;
    struct hold h;
    hold_begin(g, &h);
    uint64_t t0 = h.t0, c0 = h.c0;
    uint8_t *raw = NULL;
    size_t raw_len = 0;
    bool last = false;
    kvp_rl_view_scan_begin(g->view);
    int rc = g->user.snap_next(g->user.ctx, g->chunk_raw ? g->chunk_raw : KVP_RL_SNAP_CHUNK_RAW, &raw, &raw_len,
                               &last);
    kvp_rl_view_end(g->view);
    if (rc == KVP_OK && (raw_len > 0 || last)) /* a step may write nothing (raftlog.h) */
        rc = chunk_add(g, raw != NULL ? raw : (const uint8_t *)"", raw != NULL ? raw_len : 0);
    free(raw);
    if (rc != KVP_OK) {
        kvp_log_error(g->actor, "snapshot build dropped after %zu chunks: %s", g->n_chunks, kvp_strerror(rc));
        if (!last)
            g->build = 1; /* snap_drop aborts the FSM's side unless it already ended */
        else
            g->build = 2;
        kvp_rl_glue_snap_drop(g);
        return rc;
    }
    uint64_t us = kvp_clock_now_us() - t0;
    uint64_t cpu = thread_cpu_us() - c0;
    g->build_busy_us += us;
    g->build_cpu_us += cpu;
    if (us > g->max_snap_step_us)
        g->max_snap_step_us = us;
    if (cpu > g->max_snap_step_cpu_us)
        g->max_snap_step_cpu_us = cpu;
    if (cpu >= RL_HOLD_NOTE_CPU_US) {
        char what[96];
        snprintf(what, sizeof what, "snapshot build step (chunk %zu, %zu raw bytes%s)", g->n_chunks, raw_len,
                 last ? ", last" : "");
        hold_end(g, &h, us, cpu, what);
    }
    if (last) {
        g->build = 2;
        /* raft checks its threshold after every apply: the snapshot is taken after the next. */
        if (g->raft != NULL)
            raft_set_snapshot_threshold(g->raft, 1);
    }
    return KVP_OK;
}

static void snap_inc_after_apply(struct kvp_rl_glue *g, const void *entry, size_t len)
{
    if (g->build != 0) {
        if (entry == NULL)
            return; /* the deferred entries drained: nothing new for the tail */
        if (tail_add(g, entry, len) != KVP_OK) {
            kvp_log_error(g->actor, "snapshot build dropped: no memory for the log tail");
            kvp_rl_glue_snap_drop(g);
        }
        return;
    }
    if (kvp_rl_glue_behind(g))
        return; /* begin freezes the FSM as of raft's applied index: after the catch-up */
    bool by_bytes = g->snap_log_bytes > 0 && g->log_bytes >= g->snap_log_bytes;
    if (by_bytes || (g->base_threshold > 0 && g->log_entries >= g->base_threshold)) {
        if (kvp_rl_glue_snap_start(g) == KVP_OK && by_bytes)
            g->snapshots_by_bytes++;
    }
}

/* Hand the finished build to raft: header + chunk records + tail blocks, no copy. */
static int build_emit(struct kvp_rl_glue *g, struct raft_buffer *bufs[], unsigned *n_bufs)
{
    size_t n = 1 + g->n_chunks + g->n_tail;
    if (n > 0xFFFFFFFFu || g->n_chunks > 0xFFFFFFFFu)
        return RAFT_TOOBIG;
    struct raft_buffer *b = raft_malloc(n * sizeof(*b));
    uint8_t *hdr = malloc(KVP_RL_SNAP2_HDR_BYTES);
    if (b == NULL || hdr == NULL) {
        raft_free(b);
        free(hdr);
        return RAFT_NOMEM;
    }
    uint32_t n_tail_recs = 0;
    for (size_t i = 0; i < g->n_tail; i++)
        for (size_t off = 0; off < g->tail_lens[i];) {
            off += KVP_RL_SNAP2_TAIL_HDR + get_le(g->tail[i] + off, 4);
            n_tail_recs++;
        }
    uint64_t total = KVP_RL_SNAP2_HDR_BYTES + g->build_framed + g->tail_bytes;
    put_le(hdr, KVP_RL_SNAP_MAGIC, 4);
    hdr[4] = (uint8_t)KVP_RL_SNAP_VERSION2;
    put_le(hdr + 5, g->n_chunks, 4);
    put_le(hdr + 9, n_tail_recs, 4);
    g->snap_tail_entries += n_tail_recs;
    put_le(hdr + 13, g->build_raw, 8);
    put_le(hdr + 21, total, 8);
    put_le(hdr + 29, XXH3_64bits(hdr, 29), 8);
    b[0] = (struct raft_buffer){.base = hdr, .len = KVP_RL_SNAP2_HDR_BYTES};
    for (size_t i = 0; i < g->n_chunks; i++)
        b[1 + i] = (struct raft_buffer){.base = g->chunks[i], .len = g->chunk_lens[i]};
    for (size_t i = 0; i < g->n_tail; i++)
        b[1 + g->n_chunks + i] = (struct raft_buffer){.base = g->tail[i], .len = g->tail_lens[i]};
    /* The records now belong to raft's buffers (freed in fsm_snapshot_finalize). */
    free(g->chunks);
    free(g->chunk_lens);
    free(g->tail);
    free(g->tail_lens);
    g->chunks = g->tail = NULL;
    g->chunk_lens = g->tail_lens = NULL;
    g->n_chunks = g->chunks_cap = g->n_tail = g->tail_cap = 0;
    g->last_snap_bytes = total;
    g->build_raw = g->build_framed = g->tail_bytes = 0;
    *bufs = b;
    *n_bufs = (unsigned)n;
    return 0;
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

static void set_trailing(struct kvp_rl_glue *g)
{
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
}

static int fsm_snapshot(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
    struct kvp_rl_glue *g = fsm->data;
    if (g->user.snapshot == NULL && !g->inc)
        return RAFT_INVALID;
    uint64_t t0 = kvp_clock_now_us();
    if ((!g->inc || g->build != 2) && kvp_rl_glue_behind(g) && kvp_rl_glue_catch_up(g) != KVP_OK)
        return RAFT_IOERR; /* a failed install: this member stops */
    if (g->inc) {
        if (g->build != 2) {
            /* raft asked before the build finished (not through our threshold): finish it now,
             * holding the thread. Only a threshold set from outside gets here. */
            kvp_log_warn(g->actor, "snapshot asked for before its build finished: built synchronously");
            if (g->build == 0 && kvp_rl_glue_snap_start(g) != KVP_OK)
                return RAFT_NOMEM;
            while (g->build == 1)
                if (kvp_rl_glue_snap_work(g) != KVP_OK)
                    return RAFT_NOMEM;
        }
    } else {
        /* One call to the FSM, framed in chunks. */
        uint8_t *raw = NULL;
        size_t raw_len = 0;
        int rc = g->user.snapshot(g->user.ctx, &raw, &raw_len);
        if (rc != KVP_OK) {
            kvp_log_error(g->actor, "fsm snapshot failed: %s", kvp_strerror(rc));
            free(raw);
            return RAFT_IOERR;
        }
        build_free(g);
        for (size_t off = 0; rc == KVP_OK && (off < raw_len || off == 0); off += KVP_RL_SNAP_CHUNK_RAW) {
            size_t n = raw_len - off < KVP_RL_SNAP_CHUNK_RAW ? raw_len - off : KVP_RL_SNAP_CHUNK_RAW;
            rc = chunk_add(g, raw != NULL ? raw + off : (const uint8_t *)"", n);
            if (raw_len == 0)
                break;
        }
        free(raw);
        if (rc != KVP_OK) {
            kvp_log_error(g->actor, "snapshot of %zu bytes not framed: %s; not stored", raw_len, kvp_strerror(rc));
            build_free(g);
            return RAFT_NOMEM;
        }
        g->build_t0_us = t0;
        g->build_busy_us = 0;
        g->build_cpu_us = 0;
    }
    uint64_t raw_len = g->build_raw, n_chunks = g->n_chunks, tail = g->tail_bytes;
    int rv = build_emit(g, bufs, n_bufs);
    if (rv != 0) {
        kvp_rl_glue_snap_drop(g);
        return rv;
    }
    uint64_t now = kvp_clock_now_us();
    g->last_snap_wall_us = now - g->build_t0_us;
    g->last_snap_busy_us = g->build_busy_us + (now - t0);
    g->build = 0;
    if (g->inc && g->raft != NULL)
        raft_set_snapshot_threshold(g->raft, RL_NO_THRESHOLD);
    g->snapshots_taken++;
    kvp_metrics_hist_observe_us(&g->snapshot_hist, g->last_snap_busy_us);
    kvp_log_info(g->actor, "snapshot taken: %llu bytes of state in %llu chunks + %llu bytes of log tail, %llu framed; "
                 "%llu ms from begin, %llu ms of raft-thread work (%llu ms of its CPU), longest step %llu ms "
                 "(CPU %llu ms)",
                 (unsigned long long)raw_len, (unsigned long long)n_chunks, (unsigned long long)tail,
                 (unsigned long long)g->last_snap_bytes, (unsigned long long)g->last_snap_wall_us / 1000,
                 (unsigned long long)g->last_snap_busy_us / 1000, (unsigned long long)g->build_cpu_us / 1000,
                 (unsigned long long)g->max_snap_step_us / 1000, (unsigned long long)g->max_snap_step_cpu_us / 1000);
    set_trailing(g);
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

/* Check a version-2 container: every length and checksum, nothing decompressed. *n_chunks,
 * *raw_want: its chunk count and state size; *tail, *n_tail: where the tail records start and
 * how many. Errors: KVP_ERR_MALFORMED with *why naming the check. */
static int snap2_check(const uint8_t *buf, size_t len, uint64_t *n_chunks_out, uint64_t *raw_want,
                       const uint8_t **tail, uint32_t *n_tail, const char **why)
{
    *why = "header";
    if (len < KVP_RL_SNAP2_HDR_BYTES)
        return (*why = "shorter than its header"), KVP_ERR_MALFORMED;
    if (get_le(buf + 29, 8) != XXH3_64bits(buf, 29))
        return (*why = "header checksum mismatch"), KVP_ERR_MALFORMED;
    uint64_t n_chunks = get_le(buf + 5, 4), want = get_le(buf + 13, 8), total = get_le(buf + 21, 8);
    *n_tail = (uint32_t)get_le(buf + 9, 4);
    if (total != len)
        return (*why = total > len ? "truncated (shorter than its header says)" : "longer than its header says"),
               KVP_ERR_MALFORMED;
    if (want > KVP_RL_SNAP_MAX_RAW_BYTES || want > (uint64_t)len * 255u + 64u)
        return (*why = "claims more state bytes than it can hold"), KVP_ERR_MALFORMED;
    const uint8_t *p = buf + KVP_RL_SNAP2_HDR_BYTES, *end = buf + len;
    uint64_t sum_raw = 0;
    for (uint64_t i = 0; i < n_chunks; i++) {
        if ((size_t)(end - p) < KVP_RL_SNAP2_CHUNK_HDR)
            return (*why = "chunk header past the end"), KVP_ERR_MALFORMED;
        uint64_t r = get_le(p, 4), c = get_le(p + 4, 4);
        if (c > (size_t)(end - p) - KVP_RL_SNAP2_CHUNK_HDR)
            return (*why = "chunk past the end"), KVP_ERR_MALFORMED;
        if (get_le(p + 8, 8) != XXH3_64bits(p + KVP_RL_SNAP2_CHUNK_HDR, (size_t)c))
            return (*why = "chunk checksum mismatch"), KVP_ERR_MALFORMED;
        sum_raw += r;
        p += KVP_RL_SNAP2_CHUNK_HDR + c;
    }
    if (sum_raw != want)
        return (*why = "chunk sizes do not add up to the state size"), KVP_ERR_MALFORMED;
    *tail = p;
    for (uint32_t i = 0; i < *n_tail; i++) {
        if ((size_t)(end - p) < KVP_RL_SNAP2_TAIL_HDR)
            return (*why = "log tail record past the end"), KVP_ERR_MALFORMED;
        uint64_t l = get_le(p, 4);
        if (l > (size_t)(end - p) - KVP_RL_SNAP2_TAIL_HDR)
            return (*why = "log tail entry past the end"), KVP_ERR_MALFORMED;
        if (get_le(p + 4, 8) != XXH3_64bits(p + KVP_RL_SNAP2_TAIL_HDR, (size_t)l))
            return (*why = "log tail checksum mismatch"), KVP_ERR_MALFORMED;
        p += KVP_RL_SNAP2_TAIL_HDR + l;
    }
    if (p != end)
        return (*why = "bytes after the last record"), KVP_ERR_MALFORMED;
    *n_chunks_out = n_chunks;
    *raw_want = want;
    return KVP_OK;
}

/* Decompress one checked chunk record at p into dst (room for its raw size). */
static int snap2_chunk_decompress(const uint8_t *p, uint8_t *dst, const char **why)
{
    uint64_t r = get_le(p, 4), c = get_le(p + 4, 4);
    if (r == 0)
        return KVP_OK;
    int got = LZ4_decompress_safe((const char *)p + KVP_RL_SNAP2_CHUNK_HDR, (char *)dst, (int)c, (int)r);
    if (got < 0 || (uint64_t)got != r)
        return (*why = "chunk does not decompress to its size"), KVP_ERR_MALFORMED;
    return KVP_OK;
}

/* Check a version-2 container, then decompress the FSM bytes into one buffer (fsm_raw_len). */
static int snap2_unpack(const uint8_t *buf, size_t len, uint8_t **raw, size_t *raw_len, const uint8_t **tail,
                        uint32_t *n_tail, const char **why)
{
    uint64_t n_chunks = 0, want = 0;
    int rc = snap2_check(buf, len, &n_chunks, &want, tail, n_tail, why);
    if (rc != KVP_OK)
        return rc;
    uint8_t *dst = malloc(want > 0 ? (size_t)want : 1);
    if (dst == NULL)
        return KVP_ERR_NOMEM;
    const uint8_t *p = buf + KVP_RL_SNAP2_HDR_BYTES;
    size_t off = 0;
    for (uint64_t i = 0; i < n_chunks; i++) {
        if (snap2_chunk_decompress(p, dst + off, why) != KVP_OK) {
            free(dst);
            return KVP_ERR_MALFORMED;
        }
        off += (size_t)get_le(p, 4);
        p += KVP_RL_SNAP2_CHUNK_HDR + get_le(p + 4, 4);
    }
    *raw = dst;
    *raw_len = (size_t)want;
    return KVP_OK;
}

int kvp_rl_snap_check(const uint8_t *buf, size_t len, const char **why)
{
    uint8_t *raw = NULL;
    size_t raw_len = 0;
    const uint8_t *tail = NULL;
    uint32_t n_tail = 0;
    *why = "not a snapshot (bad magic)";
    if (buf == NULL || len < 5 || get_le(buf, 4) != KVP_RL_SNAP_MAGIC)
        return KVP_ERR_MALFORMED;
    int rc;
    if (buf[4] == KVP_RL_SNAP_VERSION) {
        rc = kvp_rl_snap_unpack(buf, len, &raw, &raw_len);
        *why = "version-1 frame does not decompress";
    } else if (buf[4] == KVP_RL_SNAP_VERSION2) {
        rc = snap2_unpack(buf, len, &raw, &raw_len, &tail, &n_tail, why);
    } else {
        *why = "unknown container version";
        return KVP_ERR_VERSION;
    }
    free(raw);
    return rc;
}

/* ---- catching up in steps (docs/raftlog.md "Installing a snapshot in steps") ---- */

static int defer_push(struct kvp_rl_glue *g, const void *entry, size_t len)
{
    struct kvp_rl_deferred *d = malloc(sizeof(*d) + len);
    if (d == NULL)
        return KVP_ERR_NOMEM;
    d->next = NULL;
    d->len = len;
    memcpy(d->data, entry, len);
    if (g->q_tail != NULL)
        g->q_tail->next = d;
    else
        g->q_head = d;
    g->q_tail = d;
    g->q_len++;
    g->q_bytes += len;
    g->entries_deferred++;
    return KVP_OK;
}

static void defer_clear(struct kvp_rl_glue *g)
{
    while (g->q_head != NULL) {
        struct kvp_rl_deferred *d = g->q_head;
        g->q_head = d->next;
        free(d);
    }
    g->q_tail = NULL;
    g->q_len = 0;
    g->q_bytes = 0;
}

/* Drop a staged install (a newer snapshot replaces it, or the glue closes). */
static void staged_drop(struct kvp_rl_glue *g)
{
    if (g->rs_h != NULL && g->user.restore_drop != NULL)
        g->user.restore_drop(g->user.ctx, g->rs_h);
    g->rs_h = NULL;
    if (g->rs_snap != NULL)
        raft_free(g->rs_snap);
    g->rs_snap = NULL;
    free(g->rs_raw);
    g->rs_raw = NULL;
    g->rs_raw_len = g->rs_raw_off = 0;
    g->rs_chunks_left = 0;
    g->rs = 0;
}

/* A staged install that cannot finish: raft already counts the snapshot installed, so the FSM
 * may not apply anything more; raftlog stops the member (its stored snapshot is checked again
 * at start-up, where a bad one is refused). */
static int staged_fail(struct kvp_rl_glue *g, int rc, const char *why)
{
    snprintf(g->failed_why, sizeof(g->failed_why), "snapshot install failed after it was accepted: %s (%s)", why,
             kvp_strerror(rc));
    kvp_log_error(g->actor, "%s; this member's state is behind its log: it stops", g->failed_why);
    g->failed = true;
    staged_drop(g);
    defer_clear(g);
    return rc;
}

bool kvp_rl_glue_behind(const struct kvp_rl_glue *g)
{
    return g->rs == 1 || g->rs == 2 || g->q_head != NULL || g->failed;
}

bool kvp_rl_glue_catch_up_pending(const struct kvp_rl_glue *g)
{
    return !g->failed && (g->rs != 0 || g->q_head != NULL);
}

void kvp_rl_glue_next_iteration(struct kvp_rl_glue *g)
{
    g->iter_seq++;
    g->iter_applied = 0;
}

uint64_t kvp_rl_glue_catch_up_budget_us(const struct kvp_rl_glue *g, uint64_t step_us)
{
    /* Over the backlog bound (a burst handed over in one callback, or a follower slower than
     * the commit rate): half the bound per iteration, so the backlog drains in a few iterations
     * of bounded length rather than 5 ms at a time. */
    bool staged = g->rs == 1 || g->rs == 2;
    if (!staged && g->defer_max_us > 0 && g->q_len * g->apply_mean_us >= g->defer_max_us &&
        g->defer_max_us / 2 > step_us)
        return g->defer_max_us / 2;
    return step_us;
}

/* One unit of catch-up work. Returns KVP_OK with *idle set when nothing was left. */
static int catch_up_unit(struct kvp_rl_glue *g, bool *idle)
{
    *idle = false;
    const char *why = "";
    size_t step_bytes = g->restore_step_bytes ? g->restore_step_bytes : ((size_t)64 << 10);
    if (g->rs == 1) {
        if (g->rs_chunks_left > 0) {
            uint64_t r = get_le(g->rs_next, 4);
            if (r > g->rs_raw_len - g->rs_raw_off)
                return staged_fail(g, KVP_ERR_MALFORMED, "chunks larger than the state");
            if (snap2_chunk_decompress(g->rs_next, g->rs_raw + g->rs_raw_off, &why) != KVP_OK)
                return staged_fail(g, KVP_ERR_MALFORMED, why);
            g->rs_raw_off += (size_t)r;
            g->rs_next += KVP_RL_SNAP2_CHUNK_HDR + get_le(g->rs_next + 4, 4);
            g->rs_chunks_left--;
            return KVP_OK;
        }
        raft_free(g->rs_snap); /* its tail entries were copied into the queue */
        g->rs_snap = NULL;
        int rc = g->user.restore_begin(g->user.ctx, g->rs_raw, g->rs_raw_len, &g->rs_h);
        if (rc != KVP_OK) {
            g->rs_h = NULL;
            return staged_fail(g, rc, "the state's bytes are not a snapshot");
        }
        g->rs = 2;
        return KVP_OK;
    }
    if (g->rs == 2) {
        bool done = false;
        int rc = g->user.restore_step(g->user.ctx, g->rs_h, step_bytes, &done);
        if (rc != KVP_OK)
            return staged_fail(g, rc, rc == KVP_ERR_VERSION ? "a state format newer than this master reads"
                                                              : "the state's bytes do not decode or fail their checksum");
        if (!done)
            return KVP_OK;
        kvp_rl_view_write_begin(g->view);
        rc = g->user.restore_end(g->user.ctx, g->rs_h);
        kvp_rl_view_end(g->view);
        if (rc != KVP_OK)
            return staged_fail(g, rc, "the new state could not be swapped in");
        free(g->rs_raw);
        g->rs_raw = NULL;
        g->rs = 3;
        g->snapshots_restored++;
        g->restores_in_steps++;
        kvp_log_info(g->actor, "snapshot installed in %llu steps: %zu bytes of state, %llu ms from its arrival, "
                     "%llu ms of raft-thread work, longest step %llu ms; %llu entries wait to be applied",
                     (unsigned long long)g->rs_steps + 1, g->rs_raw_len,
                     (unsigned long long)(kvp_clock_now_us() - g->rs_t0_us) / 1000,
                     (unsigned long long)g->rs_busy_us / 1000, (unsigned long long)g->max_restore_us / 1000,
                     (unsigned long long)g->q_len);
        return KVP_OK;
    }
    if (g->q_head != NULL) {
        struct kvp_rl_deferred *d = g->q_head;
        g->q_head = d->next;
        if (g->q_head == NULL)
            g->q_tail = NULL;
        g->q_len--;
        g->q_bytes -= d->len;
        struct kvp_rl_entry_iter it;
        if (kvp_rl_entry_decode(d->data, d->len, &it) == KVP_OK) /* checked before it was queued */
            apply_entry(g, &it, NULL);
        free(d);
        if (g->q_head == NULL && g->inc)
            snap_inc_after_apply(g, NULL, 0); /* a build put off while behind may start now */
        return KVP_OK;
    }
    if (g->rs == 3) {
        bool done = false;
        int rc = g->user.restore_step(g->user.ctx, g->rs_h, step_bytes, &done);
        if (rc != KVP_OK || done) {
            g->user.restore_drop(g->user.ctx, g->rs_h); /* frees what is left */
            g->rs_h = NULL;
            g->rs = 0;
        }
        return KVP_OK;
    }
    *idle = true;
    return KVP_OK;
}

int kvp_rl_glue_catch_up_step(struct kvp_rl_glue *g, uint64_t budget_us)
{
    if (g->failed)
        return KVP_ERR_MALFORMED;
    if (!kvp_rl_glue_catch_up_pending(g))
        return KVP_OK;
    struct hold h;
    hold_begin(g, &h);
    uint64_t t0 = h.t0, c0 = h.c0;
    int rs0 = g->rs;
    uint64_t q0 = g->q_len;
    bool staged = g->rs == 1 || g->rs == 2;
    int rc = KVP_OK;
    for (;;) {
        bool idle = false;
        rc = catch_up_unit(g, &idle);
        if (rc != KVP_OK || idle || kvp_clock_now_us() - t0 >= budget_us)
            break;
        if (budget_us == UINT64_MAX && !kvp_rl_glue_behind(g))
            break; /* a full catch-up stops at the state; the old one is freed in later steps */
    }
    uint64_t us = kvp_clock_now_us() - t0, cpu = thread_cpu_us() - c0;
    if (budget_us != UINT64_MAX) { /* one step of many; a full catch-up is one piece on purpose */
        if (us > g->max_catchup_step_us)
            g->max_catchup_step_us = us;
        if (cpu > g->max_catchup_step_cpu_us)
            g->max_catchup_step_cpu_us = cpu;
    }
    if (cpu >= RL_HOLD_NOTE_CPU_US) {
        char what[128];
        snprintf(what, sizeof what, "catch-up %s (install stage %d -> %d, deferred entries %llu -> %llu)",
                 budget_us == UINT64_MAX ? "in one piece" : "step", rs0, g->rs, (unsigned long long)q0,
                 (unsigned long long)g->q_len);
        hold_end(g, &h, us, cpu, what);
    }
    if (staged) {
        g->rs_busy_us += us;
        g->rs_steps++;
        if (us > g->max_restore_us)
            g->max_restore_us = us;
    }
    return rc;
}

int kvp_rl_glue_catch_up(struct kvp_rl_glue *g)
{
    /* Everything but freeing the replaced state, which may go on in steps. */
    int rc = KVP_OK;
    while (rc == KVP_OK && kvp_rl_glue_behind(g) && !g->failed)
        rc = kvp_rl_glue_catch_up_step(g, UINT64_MAX);
    return g->failed ? KVP_ERR_MALFORMED : rc;
}

/* Accept a checked version-2 snapshot for an install in steps: nothing of the state changes
 * now. The log tail's entries go first into the (emptied) queue of deferred entries. */
static int restore_staged(struct kvp_rl_glue *g, struct raft_buffer *buf, uint64_t n_chunks, uint64_t raw_len,
                          const uint8_t *tail, uint32_t n_tail)
{
    uint8_t *raw = malloc(raw_len > 0 ? (size_t)raw_len : 1);
    if (raw == NULL)
        return KVP_ERR_NOMEM;
    defer_clear(g);
    const uint8_t *p = tail;
    for (uint32_t i = 0; i < n_tail; i++) {
        size_t l = (size_t)get_le(p, 4);
        struct kvp_rl_entry_iter it;
        /* An entry that does not decode was skipped by the leader too: leave it out. */
        if (kvp_rl_entry_decode(p + KVP_RL_SNAP2_TAIL_HDR, l, &it) == KVP_OK &&
            defer_push(g, p + KVP_RL_SNAP2_TAIL_HDR, l) != KVP_OK) {
            defer_clear(g);
            free(raw);
            return KVP_ERR_NOMEM;
        }
        p += KVP_RL_SNAP2_TAIL_HDR + l;
    }
    g->entries_deferred -= g->q_len; /* tail entries are not deferred applies */
    g->rs_snap = buf->base;      /* the FSM owns raft's buffer on success */
    g->rs_next = (const uint8_t *)buf->base + KVP_RL_SNAP2_HDR_BYTES;
    g->rs_chunks_left = n_chunks;
    g->rs_raw = raw;
    g->rs_raw_len = (size_t)raw_len;
    g->rs_raw_off = 0;
    g->rs = 1;
    g->rs_t0_us = kvp_clock_now_us();
    g->rs_busy_us = 0;
    g->rs_steps = 0;
    return KVP_OK;
}

static int fsm_restore(struct raft_fsm *fsm, struct raft_buffer *buf)
{
    struct kvp_rl_glue *g = fsm->data;
    if (g->user.restore == NULL)
        return RAFT_INVALID;
    struct hold h;
    hold_begin(g, &h);
    uint64_t t0 = h.t0;
    uint8_t *raw = NULL;
    size_t raw_len = 0;
    const uint8_t *tail = NULL;
    uint32_t n_tail = 0;
    uint64_t n_chunks = 0, want = 0;
    const char *why = "";
    int rc;
    const uint8_t *b = buf->base;
    bool staged = false;
    if (b == NULL || buf->len < 5 || get_le(b, 4) != KVP_RL_SNAP_MAGIC) {
        rc = KVP_ERR_MALFORMED;
        why = "not a snapshot (bad magic)";
    } else if (b[4] == KVP_RL_SNAP_VERSION) {
        rc = kvp_rl_snap_unpack(b, buf->len, &raw, &raw_len); /* written before issue 22 */
        why = "version-1 LZ4 frame does not decode";
    } else if (b[4] == KVP_RL_SNAP_VERSION2) {
        /* In steps once raft runs (a start-up restore has no peers waiting on it): here only
         * the checks, which refuse a damaged snapshot before raft counts it installed. */
        staged = g->steps && g->user.restore_begin != NULL && g->user.restore_step != NULL &&
                 g->user.restore_end != NULL && g->user.restore_drop != NULL;
        if (staged)
            rc = snap2_check(b, buf->len, &n_chunks, &want, &tail, &n_tail, &why);
        else
            rc = snap2_unpack(b, buf->len, &raw, &raw_len, &tail, &n_tail, &why);
    } else {
        rc = KVP_ERR_VERSION;
    }
    if (rc != KVP_OK) {
        if (rc == KVP_ERR_VERSION)
            kvp_log_error(g->actor, "snapshot of %zu bytes rejected: container version %u, this master reads 1 and 2 "
                          "(taken by a newer master: upgrade this one, docs/operations.md \"Upgrading\")",
                          buf->len, (unsigned)b[4]);
        else
            kvp_log_error(g->actor, "snapshot of %zu bytes rejected: %s (%s); state unchanged, a peer's snapshot "
                          "is needed", buf->len, kvp_strerror(rc), why);
        return RAFT_MALFORMED;
    }
    kvp_rl_glue_snap_drop(g); /* a build of the state being replaced is worthless */
    staged_drop(g);           /* so is an install not finished yet, */
    defer_clear(g);           /* and entries older than this snapshot */
    if (staged) {
        rc = restore_staged(g, buf, n_chunks, want, tail, n_tail);
        if (rc != KVP_OK) {
            kvp_log_error(g->actor, "snapshot of %zu bytes not installed: %s", buf->len, kvp_strerror(rc));
            return RAFT_NOMEM;
        }
        log_bound_reset(g); /* or a second full snapshot would follow the install */
        uint64_t us = kvp_clock_now_us() - t0;
        g->rs_busy_us = us;
        if (us > g->max_restore_us)
            g->max_restore_us = us;
        kvp_log_info(g->actor, "snapshot of %zu bytes accepted (%llu ms of checks): %llu bytes of state in %llu chunks "
                     "+ %u log entries, installed in steps", buf->len, (unsigned long long)us / 1000,
                     (unsigned long long)want, (unsigned long long)n_chunks, n_tail);
        hold_end(g, &h, us, thread_cpu_us() - h.c0, "snapshot install accepted (checks, log tail copied)");
        return 0;
    }
    kvp_rl_view_write_begin(g->view);
    rc = g->user.restore(g->user.ctx, raw, raw_len);
    kvp_rl_view_end(g->view);
    free(raw);
    if (rc != KVP_OK) {
        kvp_log_error(g->actor, "fsm restore failed: %s%s", kvp_strerror(rc),
                      rc == KVP_ERR_VERSION ? " (a snapshot format newer than this master reads: upgrade it, "
                                              "docs/operations.md \"Upgrading\")" : "");
        return RAFT_IOERR;
    }
    /* The log tail: entries applied while the snapshot was built, in order. */
    const uint8_t *p = tail;
    for (uint32_t i = 0; i < n_tail; i++) {
        size_t l = (size_t)get_le(p, 4);
        struct kvp_rl_entry_iter it;
        if (kvp_rl_entry_decode(p + KVP_RL_SNAP2_TAIL_HDR, l, &it) == KVP_OK) {
            struct kvp_rl_cmd cmd;
            while (kvp_rl_entry_next(&it, &cmd)) {
                uint8_t *res = NULL;
                size_t res_len = 0;
                kvp_rl_view_write_begin(g->view);
                g->user.apply(g->user.ctx, cmd.data, cmd.len, &res, &res_len);
                kvp_rl_view_end(g->view);
                free(res);
            }
        }
        p += KVP_RL_SNAP2_TAIL_HDR + l;
    }
    /* On success the FSM owns the buffer raft handed over. */
    raft_free(buf->base);
    g->snapshots_restored++;
    log_bound_reset(g); /* or a second full snapshot would follow the install */
    uint64_t us = kvp_clock_now_us() - t0;
    if (us > g->max_restore_us)
        g->max_restore_us = us;
    kvp_log_info(g->actor, "snapshot restored: %zu bytes of state + %u log entries in %llu ms", raw_len, n_tail,
                 (unsigned long long)us / 1000);
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
    g->inc = user->snap_begin != NULL && user->snap_next != NULL && user->snap_abort != NULL;
}

void kvp_rl_glue_fini(struct kvp_rl_glue *g)
{
    staged_drop(g);
    defer_clear(g);
    if (g->build == 1 && g->user.snap_abort != NULL)
        g->user.snap_abort(g->user.ctx);
    g->build = 0;
    build_free(g);
    while (g->inflight != NULL) {
        struct kvp_rl_inflight *f = g->inflight;
        g->inflight = f->next;
        free(f);
    }
    g->n_inflight = 0;
}
