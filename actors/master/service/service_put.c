/*
 * service_put.c — the leader's half of the one-commit put (docs/master.md "One-commit put";
 * the FSM half is fsm_reserve.c). Leader only, cluster feature level >= 3.
 *
 * Per ACTIVE segment this leader keeps one reservation of its term (ReserveCmd, committed in the
 * background) and a bump pointer inside it. A PutStart that fits is answered here, with no Raft
 * entry: the key is checked against the FSM (local read) and this leader's puts in flight, each
 * replica gets the next range of a reservation on a distinct segment (distinct hosts first), and
 * the put's deadline (now + its ttl) must not pass the reservation's horizon. The put is kept in
 * memory until its PutEnd, which becomes one PutCommitCmd (the one commit of the put), or its
 * PutRevoke or deadline, which drop it with no commit (its range is never handed out again; the
 * FSM quarantines it when the reservation retires). A preferred segment gets the first replica,
 * as the FSM places it, when its reservation has room. Anything else takes the PutStart/PutEnd
 * path as before: an avoid list, a preferred segment whose reservation has no room (the FSM then
 * places on it if it can), a ttl above KVP_SVC_FAST_TTL_MAX_MS, a key the FSM holds, no
 * reservation with room.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "actors/master/service/service_evict.h"
#include "actors/master/service/service_resolve.h"
#include "actors/master/service/service_state.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"

/* A put whose ttl is longer takes the old path: its range would pin the reservation longer. */
#define KVP_SVC_FAST_TTL_MAX_MS 15000u
/* How long one reservation is used for new puts; its horizon is this plus the ttl cap. */
#define KVP_SVC_RESV_WINDOW_MS 2000u
/* Bytes per reservation: twice what the segment's last reservation handed out, and twice its
 * largest put, between 1 and 64 MiB; none while that is more than a quarter of the segment's
 * largest free extent (a nearly full pool takes the PutStart/PutEnd path). What a reservation
 * leaves unused is held until its horizon + fence_grace_ms (docs/master.md). */
#define KVP_SVC_RESV_MIN (1ull << 20)
#define KVP_SVC_RESV_MAX (64ull << 20)
#define KVP_SVC_MAX_SEGS 1024u
#define KVP_FSM_MAX_REPLICAS_SVC 16u /* KVP_FSM_MAX_REPLICAS (fsm_internal.h) */

struct svc_resv {
    uint64_t term, off, len, horizon_ms, bump; /* len 0 = none */
    uint64_t last_used;                         /* bytes the one before handed out */
    uint64_t max_need;                          /* largest put placed or refused here */
    bool inflight;                              /* a ReserveCmd for it is in the log */
    bool want;                                  /* a put found it too small or too short */
    uint64_t retry_ms;                          /* refused: not asked again before (monotonic) */
    /* The next one, committed while this one is still in use: it takes over when a put no
     * longer fits here, so that a renewal does not abandon the rest of this one. len 0 = none. */
    uint64_t next_term, next_off, next_len, next_horizon_ms;
};

/* Make r's next reservation the current one (the rest of the current one is never handed out
 * again: the FSM quarantines it at its horizon). */
static void resv_promote(struct svc_resv *r)
{
    uint64_t last = r->bump - r->off;
    r->term = r->next_term;
    r->off = r->bump = r->next_off;
    r->len = r->next_len;
    r->horizon_ms = r->next_horizon_ms;
    r->last_used = last;
    r->next_len = 0;
}

struct svc_fast_put {
    char *key;
    uint64_t op_id, size, deadline_ms, term;
    uint32_t replica_num;
    bool soft_pin;
    bool intent;  /* level 6: its intent was logged (PutIntent): the FSM holds it until revoked */
    bool revoked; /* its client revoked it after the intent: kept to revoke it again at its deadline */
    unsigned n;
    uint32_t seg[KVP_FSM_MAX_REPLICAS_SVC];
    uint64_t off[KVP_FSM_MAX_REPLICAS_SVC];
};

/* Level 6: a put this leader acknowledged (its PutEnd) whose PutSealCmd has not applied yet. */
struct svc_seal {
    char *key;
    uint64_t op_id, checksum;
    bool submitted; /* its PutSealCmd is in the log (false: to submit again at the next tick) */
};

/* Level 6: a read that could not be answered locally while some of its keys were sealing: held
 * until the seal applied (svc_put_hold_read). The request packed, the caller's identity. */
struct svc_held {
    zframe_t *identity;
    uint8_t *buf;
    size_t len;
    uint64_t until_ms; /* monotonic: answered UNAVAILABLE after it */
    uint64_t req_id;
    bool sealing; /* held for a seal of this leader (svc_put_hold_read), else for the resolver or
                   * for this leader's state (svc_put_hold_intent, svc_put_hold_unready) */
    uint8_t n_keys; /* its first keys' hashes (a seal of one of them sends it again); more: any */
    uint64_t key_hash[8];
};
#define KVP_SVC_HELD_MAX 256u
#define KVP_SVC_HELD_MS 2000u
#define KVP_SVC_HELD_INTENT_MS 3000u /* a read of an older leader's pending intent (the resolver's turn) */

struct svc_put {
    struct svc_resv resv[KVP_SVC_MAX_SEGS]; /* by segment id (ids above the cap: old path) */
    struct svc_map puts;                   /* key hash → struct svc_fast_put * */
    struct svc_map sealing;                /* key hash → struct svc_seal * (level 6) */
    struct svc_held held[KVP_SVC_HELD_MAX];
    size_t n_held;
    uint64_t redispatch_until;             /* held_redispatch: the read's first limit (0: a new read) */
    struct svc_map revoking;               /* key hash → op_id: a PutRevoke of that intent in flight */
    struct kvp_fsm_qvis vis;               /* svc_put_read_vis */
    uint64_t last_revoke_ms;               /* svc_put_revoke_due */
    uint64_t logged_term;                  /* the term of the last "one-commit put on" line */
    uint64_t takeover_term;                /* the term of the last "placed by an older leader" line */
    uint64_t intent_term;                  /* the term of the last "first PutIntent" line */
    uint64_t seal_term;                    /* the term of the last "first PutEnd sealed" line */
    uint64_t n_intent_items, n_sealed_early; /* PutIntent items logged, PutEnd items sealed (status) */
    bool renew_now;                        /* a PutStart found a reservation short: tick at once */
    uint64_t n_unsubmitted;                /* sealing entries whose PutSealCmd is not in the log */
    uint64_t n_fast_starts, n_slow_starts; /* PutStarts answered here / left to the FSM (status) */
};

static uint64_t wall_ms(void)
{
    return kvp_clock_wall_ms();
}

static bool fast_on(struct kvp_master_service *s)
{
    return s->put && s->is_leader && s->segments_fresh_ms && svc_feature_level(s) >= KVP_FEATURE_RESERVE;
}

/* Level 6: PutIntent is offered (PutStartResult.intent_ok) and served once every member runs
 * level 6 and the level is committed (a member of level 5 would refuse the commands). */
static bool intent_on(struct kvp_master_service *s)
{
    return fast_on(s) && svc_feature_level(s) >= KVP_FEATURE_INTENT && s->feature_committed >= KVP_FEATURE_INTENT;
}

static void submit_intent_revoke(struct kvp_master_service *s, const char *key, uint64_t op_id);
/* Which held reads go again: past their limit (the tick), those waiting for seals (a seal
 * applied), or every one (the resolver decided, the leader's state became current). */
enum held_which { HELD_EXPIRED, HELD_SEALING, HELD_ALL };
static void held_redispatch(struct kvp_master_service *s, enum held_which which, const struct svc_pending *sealed);
static int submit_seal(struct kvp_master_service *s, struct svc_seal **v, size_t n);

int svc_put_new(struct kvp_master_service *s)
{
    s->put = calloc(1, sizeof(*s->put));
    if (!s->put)
        return KVP_ERR_NOMEM;
    svc_map_init(&s->put->puts);
    svc_map_init(&s->put->sealing);
    svc_map_init(&s->put->revoking);
    return KVP_OK;
}

static void put_free(struct svc_fast_put *e)
{
    if (e) {
        free(e->key);
        free(e);
    }
}

void svc_put_reset(struct kvp_master_service *s)
{
    if (!s->put)
        return;
    size_t pos = 0;
    uint64_t k, v;
    while (svc_map_next(&s->put->puts, &pos, &k, &v))
        put_free((struct svc_fast_put *)(uintptr_t)v);
    svc_map_clear(&s->put->puts);
    /* Seals not applied: the next leader seals each intent whose bytes it verifies (V's
     * resolver) or its client's PutEnd, retried there, seals it. */
    pos = 0;
    while (svc_map_next(&s->put->sealing, &pos, &k, &v)) {
        struct svc_seal *e = (struct svc_seal *)(uintptr_t)v;
        free(e->key);
        free(e);
    }
    svc_map_clear(&s->put->sealing);
    svc_map_clear(&s->put->revoking);
    s->put->n_unsubmitted = 0;
    for (size_t i = 0; i < s->put->n_held; i++) {
        svc_reply_status(s, s->put->held[i].identity, s->put->held[i].req_id, KVP_ERR_NOT_LEADER, "not the leader");
        zframe_destroy(&s->put->held[i].identity);
        free(s->put->held[i].buf);
    }
    s->put->n_held = 0;
    memset(s->put->resv, 0, sizeof(s->put->resv));
}

void svc_put_destroy(struct kvp_master_service *s)
{
    if (!s->put)
        return;
    for (size_t i = 0; i < s->put->n_held; i++) { /* shutting down: no reply */
        zframe_destroy(&s->put->held[i].identity);
        free(s->put->held[i].buf);
    }
    s->put->n_held = 0;
    svc_put_reset(s);
    svc_map_fini(&s->put->puts);
    svc_map_fini(&s->put->sealing);
    svc_map_fini(&s->put->revoking);
    free(s->put);
    s->put = NULL;
}

bool svc_put_has_live(const struct kvp_master_service *s)
{
    return s->put && s->put->puts.n > 0;
}

/* ------------------------------------------------------------------ reservations */

static void submit_reserve(struct kvp_master_service *s, uint32_t seg, uint64_t len)
{
    struct svc_pending *p = svc_pending_new(s, NULL, NULL);
    if (!p)
        return;
    p->internal = SVC_INT_RESERVE;
    p->segment_id = seg;
    Kvp__ReserveCmd body = KVP__RESERVE_CMD__INIT;
    body.segment_id = seg;
    body.length = len;
    body.horizon_ms = wall_ms() + KVP_SVC_RESV_WINDOW_MS + KVP_SVC_FAST_TTL_MAX_MS;
    p->resv_len = (len + 63) & ~63ull;
    p->resv_horizon_ms = body.horizon_ms;
    p->resv_term = s->term; /* svc_submit stamps the command with it */
    Kvp__Command cmd = KVP__COMMAND__INIT;
    cmd.body_case = KVP__COMMAND__BODY_RESERVE;
    cmd.reserve = &body;
    s->put->resv[seg].inflight = true;
    if (svc_submit(s, p, &cmd) != KVP_OK)
        s->put->resv[seg].inflight = false;
}

/* Every ACTIVE segment gets a fresh reservation of this term when it has none, when half of it
 * is handed out, or when it is past its window. */
void svc_put_tick(struct kvp_master_service *s)
{
    if (s->put && s->put->n_held && !fast_on(s))
        held_redispatch(s, HELD_EXPIRED, NULL); /* reads held past their limit, also before this leader is ready */
    if (!fast_on(s))
        return;
    uint64_t now = wall_ms();
    size_t pos = 0;
    uint64_t id, st;
    bool reading = kvp_raftlog_read_begin(s->rl) == KVP_OK;
    while (reading && svc_map_next(&s->segments, &pos, &id, &st)) {
        if (id >= KVP_SVC_MAX_SEGS || st != (uint64_t)KVP__SEGMENT_STATE__SEGMENT_ACTIVE + 1)
            continue;
        struct svc_resv *r = &s->put->resv[id];
        if (r->inflight || svc_now_ms() < r->retry_ms)
            continue;
        if (r->next_len && r->next_term != s->term)
            r->next_len = 0;
        if (r->next_len && (r->len == 0 || r->term != s->term || r->horizon_ms < now + KVP_SVC_FAST_TTL_MAX_MS)) {
            resv_promote(r); /* the current one can no longer serve the longest ttl */
            continue;
        }
        if (r->next_len)
            continue; /* one ahead is enough */
        /* Renewed when asked for, half handed out, or in use and no longer long enough for the
         * longest ttl: an idle segment's reservation just runs out (no entry for nothing). */
        bool used = r->len && r->bump != r->off;
        bool stale = r->len == 0 || r->term != s->term || r->want || (r->bump - r->off) * 2 > r->len ||
                     (used && r->horizon_ms < now + KVP_SVC_FAST_TTL_MAX_MS);
        if (!stale)
            continue;
        uint64_t size = 0, largest = 0;
        if (!kvp_master_fsm_segment_space(s->fsm, (uint32_t)id, &size, &largest))
            continue;
        uint64_t len = 2 * (r->term == s->term && r->len ? r->bump - r->off : r->last_used);
        if (len < 2 * r->max_need)
            len = 2 * r->max_need;
        if (len < KVP_SVC_RESV_MIN)
            len = KVP_SVC_RESV_MIN;
        if (len > KVP_SVC_RESV_MAX)
            len = KVP_SVC_RESV_MAX;
        if (len > largest / 4)
            continue; /* a nearly full segment keeps its space for the old path (and eviction) */
        submit_reserve(s, (uint32_t)id, len);
    }
    if (reading)
        kvp_raftlog_read_end(s->rl);
    /* Puts past their deadline: dropped (their WRITE frames are refused by the segment). */
    size_t n = 0;
    struct svc_fast_put *gone[64];
    pos = 0;
    uint64_t k, v;
    while (n < 64 && svc_map_next(&s->put->puts, &pos, &k, &v)) {
        struct svc_fast_put *e = (struct svc_fast_put *)(uintptr_t)v;
        if (e->deadline_ms < now)
            gone[n++] = e;
    }
    for (size_t i = 0; i < n; i++) {
        svc_map_del(&s->put->puts, svc_key_hash(gone[i]->key), NULL);
        /* An intent the FSM holds and this leader never acknowledged (an acknowledged one left
         * this table at its PutEnd): RevokeExpired never drops intents, so revoke it here. */
        if (gone[i]->intent)
            submit_intent_revoke(s, gone[i]->key, gone[i]->op_id);
        put_free(gone[i]);
    }
    if (n) /* quarantined at the reservation's horizon, after now */
        svc_fence_note_failure(s, now, "expired one-commit puts");
    /* Seals not in the log yet (one whose submit failed), and reads held past their time. */
    svc_put_flush_seals(s);
    held_redispatch(s, HELD_EXPIRED, NULL);
}

void svc_put_on_reserve(struct kvp_master_service *s, struct svc_pending *p, int status, Kvp__Response *resp)
{
    if (!s->put || p->segment_id >= KVP_SVC_MAX_SEGS)
        return;
    struct svc_resv *r = &s->put->resv[p->segment_id];
    r->inflight = false;
    if (status != KVP_OK || !resp || resp->body_case != KVP__RESPONSE__BODY_RESERVE || !resp->reserve ||
        resp->reserve->status != KVP_OK) {
        /* A refusal (full segment) is asked again a second later. Only a refusal: this was set
         * after every answer, so a segment got at most one reservation a second, and puts past
         * it took the PutStart/PutEnd path (stop 32: 70% of batch-1 4 MiB puts did). */
        r->retry_ms = svc_now_ms() + 1000;
        int st = status != KVP_OK ? status : resp && resp->reserve ? resp->reserve->status : KVP_ERR_INTERNAL;
        if (st != KVP_ERR_NOT_LEADER)
            kvp_log_debug(s->actor, "segment %u: reserve: %s", p->segment_id, kvp_strerror(st));
        return;
    }
    if (!s->is_leader || p->resv_term != s->term)
        return; /* a reservation of an older term: the FSM retires it at its horizon */
    if (s->put->logged_term != s->term) {
        s->put->logged_term = s->term;
        kvp_log_info(s->actor, "one-commit put on (term %llu): first reservation, segment %u, %llu bytes",
                     (unsigned long long)s->term, p->segment_id, (unsigned long long)p->resv_len);
    }
    r->want = false;
    r->next_term = p->resv_term;
    r->next_off = resp->reserve->offset;
    r->next_len = p->resv_len;
    r->next_horizon_ms = p->resv_horizon_ms;
    if (r->len == 0 || r->term != p->resv_term)
        resv_promote(r); /* none in use: it becomes the current one at once */
}

/* ------------------------------------------------------------------ PutStart / PutEnd / PutRevoke */

/* What one PutStart changed in the reservations, to put back when it takes the old path after
 * all (nothing of it was handed out). */
struct resv_undo {
    uint32_t *id;
    struct svc_resv *was;
    size_t n, cap;
};

static void undo_note(struct svc_put *sp, struct resv_undo *u, uint32_t id)
{
    for (size_t i = 0; i < u->n; i++)
        if (u->id[i] == id)
            return;
    if (u->n < u->cap) {
        u->id[u->n] = id;
        u->was[u->n++] = sp->resv[id];
    }
}

static bool key_ok(const char *key)
{
    size_t n = key ? strlen(key) : 0;
    return n > 0 && n <= 512;
}

/* Place one item; false = take the old path. bumps are the caller's to keep or roll back. */
static bool place(struct kvp_master_service *s, const Kvp__PutStartItem *it, uint64_t deadline,
                  struct svc_fast_put *e, struct resv_undo *u)
{
    uint64_t need = (it->size + 63) & ~63ull;
    unsigned want = it->replica_num ? it->replica_num : 1;
    if (want > KVP_FSM_MAX_REPLICAS_SVC)
        return false;
    /* Candidates: room for need, horizon past the deadline; most room first, one per host. */
    uint32_t cand[KVP_FSM_MAX_REPLICAS_SVC * 4];
    unsigned nc = 0;
    size_t pos = 0;
    uint64_t id, st;
    while (svc_map_next(&s->segments, &pos, &id, &st) && nc < KVP_FSM_MAX_REPLICAS_SVC * 4) {
        if (id >= KVP_SVC_MAX_SEGS || st != (uint64_t)KVP__SEGMENT_STATE__SEGMENT_ACTIVE + 1)
            continue;
        struct svc_resv *r = &s->put->resv[id];
        if (need > r->max_need)
            r->max_need = need;
        bool fits = r->len && r->term == s->term && r->horizon_ms >= deadline && r->bump + need <= r->off + r->len;
        if (!fits && r->next_len && r->next_term == s->term && r->next_horizon_ms >= deadline &&
            need <= r->next_len) {
            undo_note(s->put, u, (uint32_t)id);
            resv_promote(r); /* the next one takes over; the tick asks for another */
            fits = true;
        }
        if (!fits) {
            if (!r->want && !r->inflight)
                s->put->renew_now = true;
            r->want = true; /* renewed at once after this PutStart (renew_now), or at the tick */
            continue;
        }
        cand[nc++] = (uint32_t)id;
    }
    if (nc < want)
        return false; /* the FSM places what it can; let it */
    uint32_t pref = 0;
    if (it->preferred_segment && it->preferred_segment[0]) {
        /* The FSM puts the preferred segment first (fsm_cmd.c cand_cmp); so does this, or the
         * put takes the old path when its reservation has no room here. */
        pref = kvp_master_fsm_segment_id(s->fsm, it->preferred_segment);
        bool found = false;
        for (unsigned i = 0; i < nc && !found; i++)
            found = cand[i] == pref;
        if (!found)
            return false;
    }
    for (unsigned i = 1; i < nc; i++) /* insertion sort by room, most first */
        for (unsigned j = i; j > 0; j--) {
            struct svc_resv *a = &s->put->resv[cand[j - 1]], *b = &s->put->resv[cand[j]];
            if (a->off + a->len - a->bump >= b->off + b->len - b->bump)
                break;
            uint32_t t = cand[j - 1];
            cand[j - 1] = cand[j];
            cand[j] = t;
        }
    for (unsigned i = 1; pref && i < nc; i++) /* the preferred one first */
        if (cand[i] == pref) {
            memmove(&cand[1], &cand[0], i * sizeof(cand[0]));
            cand[0] = pref;
            break;
        }
    const char *hosts[KVP_FSM_MAX_REPLICAS_SVC];
    bool taken[KVP_FSM_MAX_REPLICAS_SVC * 4] = {false};
    e->n = 0;
    for (int pass = 0; pass < 2 && e->n < want; pass++)
        for (unsigned i = 0; i < nc && e->n < want; i++) {
            if (taken[i])
                continue;
            const char *host, *ep;
            uint64_t pid;
            if (!kvp_master_fsm_segment_addr(s->fsm, cand[i], &host, &ep, &pid))
                continue;
            bool dup = false;
            for (unsigned j = 0; j < e->n && pass == 0 && !dup; j++)
                dup = strcmp(hosts[j], host) == 0;
            if (dup)
                continue;
            taken[i] = true;
            hosts[e->n] = host;
            struct svc_resv *r = &s->put->resv[cand[i]];
            undo_note(s->put, u, cand[i]);
            e->seg[e->n] = cand[i];
            e->off[e->n] = r->bump;
            r->bump += need;
            if (!r->inflight && !r->next_len && (r->bump - r->off) * 2 > r->len &&
                (r->bump - need - r->off) * 2 <= r->len)
                s->put->renew_now = true; /* it crossed half: ask for the next one now */
            e->n++;
        }
    return e->n == want;
}

static void start_resp_free(Kvp__PutStartResp *b)
{
    for (size_t i = 0; i < b->n_results; i++) {
        Kvp__PutStartResult *r = b->results[i];
        for (size_t j = 0; j < r->n_replicas; j++)
            free(r->replicas[j]);
        free(r->replicas);
        free(r);
    }
    free(b->results);
}

static bool try_start(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req);

bool svc_put_try_start(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req)
{
    bool ok = try_start(s, identity, req);
    if (s->put && ok)
        s->put->n_fast_starts++;
    else if (s->put)
        s->put->n_slow_starts++;
    return ok;
}

static bool try_start(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req)
{
    const Kvp__PutStartReq *ps = req->put_start;
    if (!fast_on(s) || ps->n_avoid_segments || ps->n_items > 1024)
        return false;
    uint64_t ttl = ps->ttl_ms ? ps->ttl_ms : s->cfg.put_ttl_ms;
    if (ttl > KVP_SVC_FAST_TTL_MAX_MS)
        return false;
    for (size_t i = 0; i < ps->n_items; i++) {
        const Kvp__PutStartItem *it = ps->items[i];
        if (!key_ok(it->key) || it->size == 0 || it->size > (1ull << 40) ||
            (it->preferred_segment && strlen(it->preferred_segment) > 256) ||
            it->replica_num > KVP_FSM_MAX_REPLICAS_SVC)
            return false;
    }
    if (kvp_raftlog_read_begin(s->rl) != KVP_OK)
        return false;
    uint64_t deadline = wall_ms() + ttl;
    struct svc_fast_put **ents = calloc(ps->n_items, sizeof(*ents));
    bool *again = calloc(ps->n_items, sizeof(*again)); /* a retried PutStart of a put in flight */
    /* at most every segment of every item's replicas is touched, and never more than all */
    size_t ucap = ps->n_items * KVP_FSM_MAX_REPLICAS_SVC < KVP_SVC_MAX_SEGS ? ps->n_items * KVP_FSM_MAX_REPLICAS_SVC
                                                                           : KVP_SVC_MAX_SEGS;
    struct resv_undo u = {.id = malloc(ucap * sizeof(uint32_t)), .was = malloc(ucap * sizeof(struct svc_resv)),
                          .cap = ucap};
    bool ok = ents && again && u.id && u.was;
    for (size_t i = 0; ok && i < ps->n_items; i++) {
        const Kvp__PutStartItem *it = ps->items[i];
        for (size_t j = 0; j < i && ok; j++)
            ok = strcmp(ps->items[j]->key, it->key) != 0; /* one key twice: the FSM answers */
        ok = ok && !kvp_master_fsm_key_present(s->fsm, it->key);
        if (!ok)
            break;
        uint64_t v;
        if (svc_map_get(&s->put->puts, svc_key_hash(it->key), &v)) {
            /* In flight here: the same put asked again gets the same ranges; another put of the
             * key (or a hash twin) takes the old path, and the FSM lets one of them complete. */
            struct svc_fast_put *old = (struct svc_fast_put *)(uintptr_t)v;
            ok = strcmp(old->key, it->key) == 0 && old->op_id == it->op_id && old->size == it->size &&
                 !old->revoked;
            ents[i] = old;
            again[i] = true;
            continue;
        }
        struct svc_fast_put *e = calloc(1, sizeof(*e));
        ents[i] = e;
        ok = e && (e->key = strdup(it->key)) && place(s, it, deadline, e, &u);
        if (ok) {
            e->op_id = it->op_id;
            e->size = it->size;
            e->deadline_ms = deadline;
            e->term = s->term;
            e->replica_num = it->replica_num;
            e->soft_pin = it->soft_pin;
        }
    }
    Kvp__Response resp = KVP__RESPONSE__INIT;
    Kvp__PutStartResp body = KVP__PUT_START_RESP__INIT;
    bool intent_ok = intent_on(s) && kvp_master_fsm_feature_level(s->fsm) >= KVP_FEATURE_INTENT;
    if (ok) {
        body.results = calloc(ps->n_items, sizeof(*body.results));
        ok = body.results != NULL;
        for (size_t i = 0; ok && i < ps->n_items; i++) {
            struct svc_fast_put *e = ents[i];
            Kvp__PutStartResult *r = calloc(1, sizeof(*r));
            if (!r) {
                ok = false;
                break;
            }
            kvp__put_start_result__init(r);
            body.results[body.n_results++] = r;
            r->term = e->term; /* echoed by the client's PutEnd (a new leader commits from it) */
            r->deadline_ms = e->deadline_ms;
            r->intent_ok = intent_ok;
            if (!(r->replicas = calloc(e->n, sizeof(*r->replicas)))) {
                ok = false;
                break;
            }
            r->status = KVP_OK;
            for (unsigned k = 0; k < e->n; k++) {
                Kvp__Replica *rp = calloc(1, sizeof(*rp));
                const char *host = "", *ep = "";
                uint64_t pid = 0;
                if (!rp || !kvp_master_fsm_segment_addr(s->fsm, e->seg[k], &host, &ep, &pid)) {
                    free(rp);
                    ok = false;
                    break;
                }
                kvp__replica__init(rp);
                rp->segment_id = e->seg[k];
                rp->offset = e->off[k];
                rp->endpoint = (char *)ep;
                rp->host = (char *)host;
                rp->owner_pid = pid;
                rp->state = KVP__REPLICA_STATE__REPLICA_PENDING;
                r->replicas[r->n_replicas++] = rp;
            }
        }
    }
    if (ok) {
        resp.body_case = KVP__RESPONSE__BODY_PUT_START;
        resp.put_start = &body;
        resp.status = KVP_OK;
        svc_reply(s, identity, req->req_id, &resp); /* packs the FSM's strings: still under the read */
    }
    kvp_raftlog_read_end(s->rl);
    start_resp_free(&body);
    if (ok) {
        for (size_t i = 0; i < ps->n_items; i++) {
            if (again[i])
                continue;
            if (svc_map_put(&s->put->puts, svc_key_hash(ents[i]->key), (uint64_t)(uintptr_t)ents[i]) != KVP_OK) {
                /* No memory to remember it: its PutEnd is committed from the placement the
                 * client echoes, as after a failover. */
                put_free(ents[i]);
            }
        }
        svc_evict_on_put_start_req(s, ps);
    } else {
        for (size_t i = u.n; i-- > 0;)
            s->put->resv[u.id[i]] = u.was[i]; /* nothing was handed out */
        for (size_t i = 0; ents && again && i < ps->n_items; i++)
            if (!again[i])
                put_free(ents[i]);
    }
    if (s->put->renew_now) {
        /* Renewal at the event, not at the next 200 ms tick: at a few hundred MB/s per segment a
         * reservation is handed out between two ticks, and the puts after it took the
         * PutStart/PutEnd path (two commits) until the tick (stop 32: 40% of batch-1 4 MiB puts
         * did). The tick's rules decide what is asked for (one ahead, none while one is in the
         * log, a refused one not before a second). */
        s->put->renew_now = false;
        svc_put_tick(s);
    }
    free(ents);
    free(again);
    free(u.id);
    free(u.was);
    return ok;
}

/* A PutCommit item's size, term, deadline, pin, wanted replicas and placement from this
 * leader's in-flight entry e (PutEnd's commit and PutIntent's intent alike); `pl` holds its
 * replicas (KVP_FSM_MAX_REPLICAS_SVC), c->replicas the pointers to fill. */
static void item_place_from_entry(Kvp__PutCommitItem *c, const struct svc_fast_put *e, Kvp__ReplicaPlace *pl)
{
    c->size = e->size;
    c->term = e->term;
    c->deadline_ms = e->deadline_ms;
    c->soft_pin = e->soft_pin;
    c->replica_num = e->replica_num;
    c->n_replicas = e->n;
    for (unsigned k = 0; k < e->n; k++) {
        kvp__replica_place__init(&pl[k]);
        pl[k].segment_id = e->seg[k];
        pl[k].offset = e->off[k];
        c->replicas[k] = &pl[k];
    }
}

/* May this leader log PutCommitCmd now? At level 3; and for a put placed by an older leader,
 * whatever the level now says: its reservation is in the log (the FSM refuses the commit
 * otherwise), so every member that applied it understands PutCommit, and a member that did not
 * already refused that ReserveCmd. A member down counts as level 1 (version.h): refusing would
 * fail, after every failover, puts whose bytes are written. */
static bool commit_ok(struct kvp_master_service *s, bool takeover)
{
    if (!s->put || !s->is_leader)
        return false;
    return takeover || svc_feature_level(s) >= KVP_FEATURE_RESERVE;
}

static bool try_seal(struct kvp_master_service *s, zframe_t *identity, Kvp__Request *req);

bool svc_put_try_end(struct kvp_master_service *s, zframe_t *identity, Kvp__Request *req)
{
    Kvp__PutEndReq *pe = req->put_end;
    if (!s->put || pe->n_items == 0 || !s->is_leader)
        return false;
    if (try_seal(s, identity, req))
        return true; /* level 6: intents committed during the transfer, sealed in the background */
    /* Every item is either a put in flight here or carries the placement a leader gave it
     * (PutEndItem.term != 0: placed by this or an older leader); else the PutEnd command path. */
    struct svc_fast_put **ents = calloc(pe->n_items, sizeof(*ents));
    bool *mine = calloc(pe->n_items, sizeof(*mine));
    bool ok = ents && mine, takeover = false;
    for (size_t i = 0; ok && i < pe->n_items; i++) {
        uint64_t v;
        const Kvp__PutEndItem *it = pe->items[i];
        ok = key_ok(it->key);
        if (ok && svc_map_get(&s->put->puts, svc_key_hash(it->key), &v)) {
            struct svc_fast_put *e = (struct svc_fast_put *)(uintptr_t)v;
            if (strcmp(e->key, it->key) == 0 && e->op_id == it->op_id) {
                for (size_t j = 0; j < i && ok; j++)
                    ok = ents[j] != e;
                ents[i] = e;
                mine[i] = true;
                continue;
            }
        }
        ok = ok && it->term && it->size && it->n_replicas >= 1 && it->n_replicas <= KVP_FSM_MAX_REPLICAS_SVC;
        for (size_t k = 0; ok && k < it->n_replicas; k++)
            ok = it->replicas[k] != NULL;
        if (!ok)
            break;
        struct svc_fast_put *e = calloc(1, sizeof(*e));
        ents[i] = e;
        ok = e && (e->key = strdup(it->key));
        if (!ok)
            break;
        e->op_id = it->op_id;
        e->size = it->size;
        e->deadline_ms = it->deadline_ms;
        e->term = it->term;
        e->replica_num = it->replica_num;
        e->soft_pin = it->soft_pin;
        e->n = (unsigned)it->n_replicas;
        for (unsigned k = 0; k < e->n; k++) {
            e->seg[k] = it->replicas[k]->segment_id;
            e->off[k] = it->replicas[k]->offset;
        }
        takeover = true;
        if (e->term != s->term && s->put->takeover_term != s->term) {
            s->put->takeover_term = s->term;
            kvp_log_info(s->actor, "PutEnd of %s placed by an older leader (term %llu): committed from the "
                         "placement it echoes (first of term %llu)", e->key, (unsigned long long)e->term,
                         (unsigned long long)s->term);
        }
    }
    ok = ok && commit_ok(s, takeover);
    if (!ok) {
        for (size_t i = 0; ents && mine && i < pe->n_items; i++)
            if (!mine[i])
                put_free(ents[i]);
        free(ents);
        free(mine);
        return false;
    }
    struct svc_pending *p = svc_pending_new(s, identity, req);
    Kvp__PutCommitItem *items = calloc(pe->n_items, sizeof(*items));
    Kvp__PutCommitItem **itp = calloc(pe->n_items, sizeof(*itp));
    Kvp__ReplicaPlace *pl = calloc(pe->n_items * KVP_FSM_MAX_REPLICAS_SVC, sizeof(*pl));
    Kvp__ReplicaPlace **plp = calloc(pe->n_items * KVP_FSM_MAX_REPLICAS_SVC, sizeof(*plp));
    if (!p || !items || !itp || !pl || !plp || !(p->key_hashes = calloc(pe->n_items, sizeof(uint64_t)))) {
        svc_pending_free(p);
        for (size_t i = 0; i < pe->n_items; i++)
            if (!mine[i])
                put_free(ents[i]);
        free(items), free(itp), free(pl), free(plp), free(ents), free(mine);
        svc_reply_status(s, identity, req->req_id, KVP_ERR_NOMEM, "out of memory");
        return true;
    }
    for (size_t i = 0; i < pe->n_items; i++) {
        struct svc_fast_put *e = ents[i];
        Kvp__PutCommitItem *c = &items[i];
        kvp__put_commit_item__init(c);
        c->key = e->key;
        c->op_id = e->op_id;
        c->checksum = pe->items[i]->checksum;
        c->replicas = &plp[i * KVP_FSM_MAX_REPLICAS_SVC];
        item_place_from_entry(c, e, &pl[i * KVP_FSM_MAX_REPLICAS_SVC]);
        itp[i] = c;
        p->key_hashes[i] = svc_key_hash(e->key);
    }
    p->n_keys = pe->n_items;
    for (size_t i = 0; i < pe->n_written_segments; i++) /* liveness witnesses, as on_put_end */
        if (pe->written_segments[i] && svc_map_get(&s->segments, pe->written_segments[i], NULL))
            svc_map_put(&s->client_wrote, pe->written_segments[i], svc_now_ms());
    Kvp__PutCommitCmd body = KVP__PUT_COMMIT_CMD__INIT;
    body.n_items = pe->n_items;
    body.items = itp;
    Kvp__Command cmd = KVP__COMMAND__INIT;
    cmd.body_case = KVP__COMMAND__BODY_PUT_COMMIT;
    cmd.put_commit = &body;
    svc_submit(s, p, &cmd); /* packs now; answers the caller itself on error */
    for (size_t i = 0; i < pe->n_items; i++) { /* committed or refused, it is no longer ours */
        if (mine[i])
            svc_map_del(&s->put->puts, svc_key_hash(ents[i]->key), NULL);
        put_free(ents[i]);
    }
    free(items), free(itp), free(pl), free(plp), free(ents), free(mine);
    return true;
}

bool svc_put_try_revoke(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req)
{
    const Kvp__PutRevokeReq *pr = req->put_revoke;
    if (!s->put || s->put->puts.n == 0 || pr->n_items == 0 || !s->is_leader)
        return false;
    for (size_t i = 0; i < pr->n_items; i++) {
        uint64_t v;
        const Kvp__PutRevokeItem *it = pr->items[i];
        if (!key_ok(it->key) || !svc_map_get(&s->put->puts, svc_key_hash(it->key), &v))
            return false;
        struct svc_fast_put *e = (struct svc_fast_put *)(uintptr_t)v;
        if (strcmp(e->key, it->key) != 0 || e->op_id != it->op_id)
            return false;
    }
    bool any_intent = false;
    for (size_t i = 0; i < pr->n_items; i++) {
        uint64_t v;
        if (svc_map_get(&s->put->puts, svc_key_hash(pr->items[i]->key), &v) &&
            ((struct svc_fast_put *)(uintptr_t)v)->intent) {
            /* Its intent is in the log: the PutRevoke command drops it there. The entry stays,
             * marked, so that the tick revokes it once more at its deadline (an intent still in
             * flight when this revoke applied would be left otherwise). */
            ((struct svc_fast_put *)(uintptr_t)v)->revoked = true;
            any_intent = true;
        }
    }
    if (any_intent) {
        /* The PutRevoke command path, for the whole request. Its plain items (never in the log)
         * leave this table now, as on the path below, rather than linger to their deadline. */
        for (size_t i = 0; i < pr->n_items; i++) {
            uint64_t v;
            if (svc_map_get(&s->put->puts, svc_key_hash(pr->items[i]->key), &v) &&
                !((struct svc_fast_put *)(uintptr_t)v)->intent) {
                svc_map_del(&s->put->puts, svc_key_hash(pr->items[i]->key), NULL);
                put_free((struct svc_fast_put *)(uintptr_t)v);
            }
        }
        return false;
    }
    int32_t *st = calloc(pr->n_items, sizeof(*st));
    if (!st)
        return false;
    for (size_t i = 0; i < pr->n_items; i++) {
        uint64_t v;
        if (svc_map_del(&s->put->puts, svc_key_hash(pr->items[i]->key), &v))
            put_free((struct svc_fast_put *)(uintptr_t)v);
        st[i] = KVP_OK;
    }
    Kvp__Response resp = KVP__RESPONSE__INIT;
    Kvp__PutRevokeResp body = KVP__PUT_REVOKE_RESP__INIT;
    body.n_status = pr->n_items;
    body.status = st;
    resp.body_case = KVP__RESPONSE__BODY_PUT_REVOKE;
    resp.put_revoke = &body;
    svc_reply(s, identity, req->req_id, &resp);
    free(st);
    return true;
}

/* Remove of a key whose put is in flight here: BUSY, as the FSM answers for a pending put. */
bool svc_put_pending_key(const struct kvp_master_service *s, const char *key)
{
    uint64_t v;
    return s->put && key && svc_map_get(&s->put->puts, svc_key_hash(key), &v) &&
           strcmp(((struct svc_fast_put *)(uintptr_t)v)->key, key) == 0;
}

/* RevokeExpired also retires reservations (fsm_reserve.c): at level 3 it runs at least once a
 * second even with no pending put in the FSM, whatever term made them. */
bool svc_put_revoke_due(struct kvp_master_service *s)
{
    if (!s->put || !s->is_leader || svc_feature_level(s) < KVP_FEATURE_RESERVE)
        return false;
    uint64_t now = svc_now_ms();
    if (now - s->put->last_revoke_ms < 1000)
        return false;
    s->put->last_revoke_ms = now;
    return true;
}

/* ------------------------------------------------------------------ intents (feature level 6) */

/* A PutRevoke command for an intent whose client never ended it (its answer is not needed: a
 * NOT_FOUND means it was revoked or never committed). */
static void submit_intent_revoke(struct kvp_master_service *s, const char *key, uint64_t op_id)
{
    struct svc_pending *p = svc_pending_new(s, NULL, NULL);
    if (!p || svc_put_revoking_note(s, p, key, op_id) != KVP_OK) {
        svc_pending_free(p);
        return; /* again at a later tick (the resolver's, past its deadline) */
    }
    p->internal = SVC_INT_INTENT_REVOKE;
    Kvp__PutRevokeItem it = KVP__PUT_REVOKE_ITEM__INIT, *itp[1] = {&it};
    it.key = (char *)key;
    it.op_id = op_id;
    Kvp__PutRevokeReq body = KVP__PUT_REVOKE_REQ__INIT;
    body.n_items = 1;
    body.items = itp;
    Kvp__Command cmd = KVP__COMMAND__INIT;
    cmd.body_case = KVP__COMMAND__BODY_PUT_REVOKE;
    cmd.put_revoke = &body;
    svc_submit(s, p, &cmd);
}

int svc_put_revoking_note(struct kvp_master_service *s, struct svc_pending *p, const char *key, uint64_t op_id)
{
    if (!s->put)
        return KVP_OK;
    if (!(p->key_hashes = calloc(1, sizeof(uint64_t))) || !(p->seal_ops = calloc(1, sizeof(uint64_t))))
        return KVP_ERR_NOMEM;
    p->key_hashes[0] = svc_key_hash(key);
    p->seal_ops[0] = op_id;
    p->n_keys = 1;
    return svc_map_put(&s->put->revoking, p->key_hashes[0], op_id);
}

void svc_put_revoking_done(struct kvp_master_service *s, const struct svc_pending *p)
{
    uint64_t op;
    if (s->put && p->n_keys == 1 && p->key_hashes && p->seal_ops &&
        svc_map_get(&s->put->revoking, p->key_hashes[0], &op) && op == p->seal_ops[0])
        svc_map_del(&s->put->revoking, p->key_hashes[0], NULL);
}

/* One PutSealCmd for v[0..n): submitted marks each; KVP_OK or the submit's error (none marked). */
static int submit_seal(struct kvp_master_service *s, struct svc_seal **v, size_t n)
{
    struct svc_pending *p = svc_pending_new(s, NULL, NULL);
    Kvp__PutSealItem *items = calloc(n, sizeof(*items));
    Kvp__PutSealItem **itp = calloc(n, sizeof(*itp));
    if (!p || !items || !itp || !(p->key_hashes = calloc(n, sizeof(uint64_t))) ||
        !(p->seal_ops = calloc(n, sizeof(uint64_t)))) {
        svc_pending_free(p);
        free(items), free(itp);
        return KVP_ERR_NOMEM;
    }
    p->internal = SVC_INT_SEAL;
    for (size_t i = 0; i < n; i++) {
        kvp__put_seal_item__init(&items[i]);
        items[i].key = v[i]->key;
        items[i].op_id = v[i]->op_id;
        items[i].checksum = v[i]->checksum;
        itp[i] = &items[i];
        p->key_hashes[i] = svc_key_hash(v[i]->key);
        p->seal_ops[i] = v[i]->op_id;
    }
    p->n_keys = n;
    Kvp__PutSealCmd body = KVP__PUT_SEAL_CMD__INIT;
    body.n_items = n;
    body.items = itp;
    Kvp__Command cmd = KVP__COMMAND__INIT;
    cmd.body_case = KVP__COMMAND__BODY_PUT_SEAL;
    cmd.put_seal = &body;
    int rc = svc_submit(s, p, &cmd); /* frees p on error */
    for (size_t i = 0; rc == KVP_OK && i < n; i++)
        if (!v[i]->submitted) {
            v[i]->submitted = true;
            s->put->n_unsubmitted--;
        }
    free(items), free(itp);
    return rc;
}

/* PutIntent: one PutCommitCmd of intent items, answered with the FSM's PutEndResp once applied.
 * Each item is a put this leader placed (its placement from this table, the checksum from the
 * item) or one an older leader placed (the placement the client echoes, checked by the FSM
 * against that term's reservation, as PutEnd's takeover). */
void svc_put_on_intent(struct kvp_master_service *s, zframe_t *identity, Kvp__Request *req)
{
    Kvp__PutIntentReq *pi = req->put_intent;
    if (!s->put || !intent_on(s)) {
        svc_reply_status(s, identity, req->req_id, KVP_ERR_VERSION, "PutIntent needs cluster feature level 6");
        return;
    }
    if (pi->n_items == 0 || pi->n_items > KVP_MASTER_MAX_PUT_ITEMS) {
        kvp_log_warn(s->actor, "req %llu: PutIntent of %zu items refused (1 to %u)", (unsigned long long)req->req_id,
                     pi->n_items, KVP_MASTER_MAX_PUT_ITEMS);
        svc_reply_status(s, identity, req->req_id, KVP_ERR_INVALID, "PutIntent: 1 to KVP_MASTER_MAX_PUT_ITEMS items");
        return;
    }
    for (size_t i = 0; i < pi->n_items; i++) {
        const Kvp__PutEndItem *it = pi->items[i];
        bool ok = it && key_ok(it->key) && it->term && it->size && it->n_replicas >= 1 &&
                  it->n_replicas <= KVP_FSM_MAX_REPLICAS_SVC;
        for (size_t k = 0; ok && k < it->n_replicas; k++)
            ok = it->replicas[k] != NULL;
        if (!ok) {
            kvp_log_warn(s->actor, "req %llu: PutIntent item %zu without a valid key or placement: refused",
                         (unsigned long long)req->req_id, i);
            svc_reply_status(s, identity, req->req_id, KVP_ERR_INVALID, "PutIntent item without a key or placement");
            return;
        }
    }
    s->put->n_intent_items += pi->n_items;
    if (s->put->intent_term != s->term) {
        s->put->intent_term = s->term;
        kvp_log_info(s->actor, "intent overlapped with the transfer (term %llu): first PutIntent, %zu item(s)",
                     (unsigned long long)s->term, pi->n_items);
    }
    struct svc_pending *p = svc_pending_new(s, identity, req);
    Kvp__PutCommitItem *items = calloc(pi->n_items, sizeof(*items));
    Kvp__PutCommitItem **itp = calloc(pi->n_items, sizeof(*itp));
    Kvp__ReplicaPlace *pl = calloc(pi->n_items * KVP_FSM_MAX_REPLICAS_SVC, sizeof(*pl));
    Kvp__ReplicaPlace **plp = calloc(pi->n_items * KVP_FSM_MAX_REPLICAS_SVC, sizeof(*plp));
    if (!p || !items || !itp || !pl || !plp) {
        svc_pending_free(p);
        free(items), free(itp), free(pl), free(plp);
        svc_reply_status(s, identity, req->req_id, KVP_ERR_NOMEM, "out of memory");
        return;
    }
    for (size_t i = 0; i < pi->n_items; i++) {
        const Kvp__PutEndItem *it = pi->items[i];
        Kvp__PutCommitItem *c = &items[i];
        kvp__put_commit_item__init(c);
        c->key = it->key;
        c->op_id = it->op_id;
        c->checksum = it->checksum;
        c->intent = true;
        c->replicas = &plp[i * KVP_FSM_MAX_REPLICAS_SVC];
        uint64_t v;
        struct svc_fast_put *e = NULL;
        if (svc_map_get(&s->put->puts, svc_key_hash(it->key), &v)) {
            e = (struct svc_fast_put *)(uintptr_t)v;
            if (strcmp(e->key, it->key) != 0 || e->op_id != it->op_id || e->revoked)
                e = NULL;
        }
        if (e) { /* placed here: this table is the placement */
            e->intent = true;
            item_place_from_entry(c, e, &pl[i * KVP_FSM_MAX_REPLICAS_SVC]);
        } else { /* placed by an older leader, or forgotten here: the echo, checked by the FSM */
            c->size = it->size;
            c->term = it->term;
            c->deadline_ms = it->deadline_ms;
            c->soft_pin = it->soft_pin;
            c->replica_num = it->replica_num;
            c->n_replicas = it->n_replicas;
            for (size_t k = 0; k < it->n_replicas; k++) {
                Kvp__ReplicaPlace *r = &pl[i * KVP_FSM_MAX_REPLICAS_SVC + k];
                kvp__replica_place__init(r);
                r->segment_id = it->replicas[k]->segment_id;
                r->offset = it->replicas[k]->offset;
                c->replicas[k] = r;
            }
        }
        itp[i] = c;
    }
    Kvp__PutCommitCmd body = KVP__PUT_COMMIT_CMD__INIT;
    body.n_items = pi->n_items;
    body.items = itp;
    Kvp__Command cmd = KVP__COMMAND__INIT;
    cmd.body_case = KVP__COMMAND__BODY_PUT_COMMIT;
    cmd.put_commit = &body;
    svc_submit(s, p, &cmd); /* answers the caller with the FSM's PutEndResp, or the error */
    free(items), free(itp), free(pl), free(plp);
}

void svc_put_flush_seals(struct kvp_master_service *s)
{
    if (!s->put || s->put->n_unsubmitted == 0 || !s->is_leader)
        return;
    size_t n = 0, cap = (size_t)s->put->n_unsubmitted;
    struct svc_seal **v = malloc(cap * sizeof(*v));
    if (!v)
        return; /* again at the next tick */
    size_t pos = 0;
    uint64_t k, val;
    while (n < cap && svc_map_next(&s->put->sealing, &pos, &k, &val)) {
        struct svc_seal *e = (struct svc_seal *)(uintptr_t)val;
        if (!e->submitted)
            v[n++] = e;
    }
    if (n)
        submit_seal(s, v, n);
    free(v);
}

/* PutEnd of puts whose intents committed: acknowledged at once, sealed in the background.
 * Every item must be a pending intent in the FSM with the item's op_id and checksum, not past
 * its deadline by this leader's clock (an intent past it may be under this leader's revoke),
 * and not sealing here under another op (hash twins). Otherwise false: the PutCommit path,
 * where the FSM seals an intent of the same op_id and checksum in the commit. */
static bool try_seal(struct kvp_master_service *s, zframe_t *identity, Kvp__Request *req)
{
    Kvp__PutEndReq *pe = req->put_end;
    if (!intent_on(s) || pe->n_items > KVP_MASTER_MAX_PUT_ITEMS)
        return false;
    /* Without a read, the common case: an item in flight here whose intent this leader never
     * logged (a small put, or an older client's) ends by its commit. An item not in flight here
     * (placed by an older leader, whose intent may be in the log) is looked up. */
    for (size_t i = 0; i < pe->n_items; i++) {
        uint64_t v;
        const Kvp__PutEndItem *it = pe->items[i];
        if (!it->term)
            return false; /* not placed from a reservation: no intent */
        if (key_ok(it->key) && svc_map_get(&s->put->puts, svc_key_hash(it->key), &v)) {
            const struct svc_fast_put *e = (const struct svc_fast_put *)(uintptr_t)v;
            if (strcmp(e->key, it->key) == 0 && e->op_id == it->op_id && !e->intent)
                return false;
        }
    }
    if (kvp_raftlog_read_begin(s->rl) != KVP_OK)
        return false;
    uint64_t now = wall_ms();
    bool ok = kvp_fsm_intent_count(s->fsm) > 0;
    for (size_t i = 0; ok && i < pe->n_items; i++) {
        const Kvp__PutEndItem *it = pe->items[i];
        struct kvp_fsm_intent in;
        uint64_t v;
        /* not under a revoke of this leader's (a wall clock stepped back after the tick or the
         * resolver revoked it past its deadline: its PutCommit decides in the log's order) */
        ok = key_ok(it->key) && kvp_fsm_intent_get(s->fsm, it->key, &in) && in.op_id == it->op_id &&
             in.checksum == it->checksum && now <= in.deadline_ms &&
             !svc_map_get(&s->put->revoking, svc_key_hash(it->key), NULL);
        if (ok && svc_map_get(&s->put->sealing, svc_key_hash(it->key), &v))
            ok = strcmp(((struct svc_seal *)(uintptr_t)v)->key, it->key) == 0 &&
                 ((struct svc_seal *)(uintptr_t)v)->op_id == it->op_id;
        for (size_t j = 0; ok && j < i; j++)
            ok = strcmp(pe->items[j]->key, it->key) != 0;
    }
    kvp_raftlog_read_end(s->rl);
    if (!ok)
        return false;
    struct svc_seal **v = calloc(pe->n_items, sizeof(*v));
    bool *fresh = calloc(pe->n_items, sizeof(*fresh));
    int32_t *st = calloc(pe->n_items, sizeof(*st));
    ok = v && fresh && st;
    for (size_t i = 0; ok && i < pe->n_items; i++) {
        uint64_t old;
        if (svc_map_get(&s->put->sealing, svc_key_hash(pe->items[i]->key), &old)) {
            v[i] = (struct svc_seal *)(uintptr_t)old; /* a retried PutEnd: its seal is on its way */
            continue;
        }
        v[i] = calloc(1, sizeof(*v[i]));
        ok = v[i] && (v[i]->key = strdup(pe->items[i]->key));
        if (ok) {
            v[i]->op_id = pe->items[i]->op_id;
            v[i]->checksum = pe->items[i]->checksum;
            fresh[i] = true;
        }
    }
    /* Remembered first: the seal goes to the log with the next command this leader submits (any
     * command: svc_submit flushes the queue before it, so a later Remove, Evict or RemoveAll
     * applies after the seal), or at the next 10 ms tick, whichever comes first. At batch 1 the
     * next put's PutIntent carries it, in the same entry: one entry per put, not two. */
    size_t added = 0;
    for (size_t i = 0; ok && i < pe->n_items; i++) {
        if (!fresh[i])
            continue;
        if (svc_map_put(&s->put->sealing, svc_key_hash(v[i]->key), (uint64_t)(uintptr_t)v[i]) != KVP_OK) {
            ok = false;
            break;
        }
        s->put->n_unsubmitted++;
        added = i + 1;
    }
    if (!ok) { /* out of memory: nothing acknowledged; the PutCommit path */
        for (size_t i = 0; i < added; i++)
            if (fresh[i]) {
                svc_map_del(&s->put->sealing, svc_key_hash(v[i]->key), NULL);
                s->put->n_unsubmitted--;
            }
    }
    if (!ok) {
        for (size_t i = 0; v && fresh && i < pe->n_items; i++)
            if (fresh[i] && v[i]) {
                free(v[i]->key);
                free(v[i]);
            }
        free(v), free(fresh), free(st);
        return false;
    }
    for (size_t i = 0; i < pe->n_items; i++) { /* no longer in flight here */
        uint64_t e;
        const Kvp__PutEndItem *it = pe->items[i];
        if (svc_map_get(&s->put->puts, svc_key_hash(it->key), &e) &&
            strcmp(((struct svc_fast_put *)(uintptr_t)e)->key, it->key) == 0 &&
            ((struct svc_fast_put *)(uintptr_t)e)->op_id == it->op_id) {
            svc_map_del(&s->put->puts, svc_key_hash(it->key), NULL);
            put_free((struct svc_fast_put *)(uintptr_t)e);
        }
        st[i] = KVP_OK;
    }
    for (size_t i = 0; i < pe->n_written_segments; i++) /* liveness witnesses, as on_put_end */
        if (pe->written_segments[i] && svc_map_get(&s->segments, pe->written_segments[i], NULL))
            svc_map_put(&s->client_wrote, pe->written_segments[i], svc_now_ms());
    s->put->n_sealed_early += pe->n_items;
    if (s->put->seal_term != s->term) {
        s->put->seal_term = s->term;
        kvp_log_info(s->actor, "PutEnd acknowledged before its seal commits (term %llu): first, %s", (unsigned long long)s->term,
                     pe->items[0]->key);
    }
    Kvp__Response resp = KVP__RESPONSE__INIT;
    Kvp__PutEndResp body = KVP__PUT_END_RESP__INIT;
    body.n_status = pe->n_items;
    body.status = st;
    resp.body_case = KVP__RESPONSE__BODY_PUT_END;
    resp.put_end = &body;
    svc_reply(s, identity, req->req_id, &resp);
    free(v), free(fresh), free(st);
    return true;
}

/* Held reads go again (every one: their keys' seals applied; or only those past their limit,
 * at the tick). Each keeps its first limit: held again, it is answered at that limit
 * (svc_put_hold_read). */
/* Whether held read h names one of the keys `sealed` sealed (hash compare: a twin only sends
 * it again early, where it is held again). */
static bool held_names(const struct svc_held *h, const struct svc_pending *sealed)
{
    if (!sealed || h->n_keys > 8)
        return true;
    for (unsigned i = 0; i < h->n_keys; i++)
        for (size_t k = 0; k < sealed->n_keys; k++)
            if (h->key_hash[i] == sealed->key_hashes[k])
                return true;
    return false;
}

static void held_redispatch(struct kvp_master_service *s, enum held_which which, const struct svc_pending *sealed)
{
    size_t n = 0, keep = 0;
    uint64_t now = svc_now_ms();
    struct svc_held *h = malloc((s->put->n_held ? s->put->n_held : 1) * sizeof(*h));
    if (!h)
        return;
    for (size_t i = 0; i < s->put->n_held; i++) {
        bool go = which == HELD_ALL || (which == HELD_EXPIRED && s->put->held[i].until_ms <= now) ||
                  (which == HELD_SEALING && (s->put->held[i].sealing || held_names(&s->put->held[i], sealed)));
        if (!go)
            s->put->held[keep++] = s->put->held[i];
        else
            h[n++] = s->put->held[i];
    }
    s->put->n_held = keep;
    for (size_t i = 0; i < n; i++) {
        Kvp__Request *req = kvp__request__unpack(NULL, h[i].len, h[i].buf);
        if (req) {
            uint64_t outer = s->put->redispatch_until; /* a redispatch inside a redispatch */
            s->put->redispatch_until = h[i].until_ms ? h[i].until_ms : 1;
            svc_dispatch(s, h[i].identity, req); /* may hold it again, until the same limit */
            s->put->redispatch_until = outer;
            kvp__request__free_unpacked(req, NULL);
        }
        zframe_destroy(&h[i].identity);
        free(h[i].buf);
    }
    free(h);
}

void svc_put_redispatch_held(struct kvp_master_service *s)
{
    if (s->put && s->put->n_held)
        held_redispatch(s, HELD_ALL, NULL);
}

void svc_put_on_seal(struct kvp_master_service *s, struct svc_pending *p, int status, Kvp__Response *resp)
{
    if (!s->put)
        return;
    bool body = status == KVP_OK && resp && resp->status == KVP_OK && resp->body_case == KVP__RESPONSE__BODY_PUT_END &&
                resp->put_end && resp->put_end->n_status == p->n_keys;
    for (size_t i = 0; i < p->n_keys; i++) {
        uint64_t v;
        if (!svc_map_get(&s->put->sealing, p->key_hashes[i], &v))
            continue;
        struct svc_seal *e = (struct svc_seal *)(uintptr_t)v;
        if (!p->seal_ops || e->op_id != p->seal_ops[i])
            continue; /* another put of that key (or a hash twin) sealing now: not this command's */
        if (!body && status != KVP_ERR_NOT_LEADER) {
            if (e->submitted) {
                e->submitted = false; /* the log refused it (not a lost leadership): again */
                s->put->n_unsubmitted++;
            }
            continue;
        }
        if (body && resp->put_end->status[i] != KVP_OK)
            /* acknowledged and not sealed: its intent was revoked or changed under it */
            kvp_log_error(s->actor, "%s (op %llx): PutSeal refused: %s", e->key, (unsigned long long)e->op_id,
                          kvp_strerror(resp->put_end->status[i]));
        svc_map_del(&s->put->sealing, p->key_hashes[i], NULL);
        free(e->key);
        free(e);
    }
    /* Only when seals applied: a refused submit reaches here synchronously from inside a held
     * read's own flush (svc_put_hold_read), and redispatching then would recurse. */
    if (body && s->put->n_held)
        held_redispatch(s, HELD_SEALING, p); /* a read held for the resolver goes if one of its keys sealed */
}

static bool sealed_cb(void *arg, const char *key, uint64_t op_id, uint64_t checksum)
{
    struct kvp_master_service *s = arg;
    uint64_t v;
    if (!svc_map_get(&s->put->sealing, svc_key_hash(key), &v))
        return false;
    const struct svc_seal *e = (const struct svc_seal *)(uintptr_t)v;
    return e->op_id == op_id && e->checksum == checksum && strcmp(e->key, key) == 0;
}

bool svc_put_sealing_op(const struct kvp_master_service *s, const char *key, uint64_t op_id)
{
    uint64_t v;
    if (!s->put || !key || !svc_map_get(&s->put->sealing, svc_key_hash(key), &v))
        return false;
    const struct svc_seal *e = (const struct svc_seal *)(uintptr_t)v;
    return e->op_id == op_id && strcmp(e->key, key) == 0;
}

const struct kvp_fsm_qvis *svc_put_read_vis(struct kvp_master_service *s)
{
    if (!s->put || s->put->sealing.n == 0)
        return NULL;
    s->put->vis.sealed = sealed_cb;
    s->put->vis.arg = s;
    return &s->put->vis;
}

static size_t read_keys(const Kvp__Request *req, char ***keys)
{
    *keys = NULL;
    if (req->body_case == KVP__REQUEST__BODY_GET_REPLICAS && req->get_replicas)
        return *keys = req->get_replicas->keys, req->get_replicas->n_keys;
    if (req->body_case == KVP__REQUEST__BODY_EXISTS && req->exists)
        return *keys = req->exists->keys, req->exists->n_keys;
    if (req->body_case == KVP__REQUEST__BODY_GET_SIZE && req->get_size)
        return *keys = req->get_size->keys, req->get_size->n_keys;
    return 0;
}

/* Hold req until its limit (a held read dispatched again keeps its first one). */
static void hold(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req, uint64_t hold_ms,
                 bool sealing)
{
    if (s->put->n_held == KVP_SVC_HELD_MAX) {
        svc_reply_status(s, identity, req->req_id, KVP_ERR_BUSY, "too many reads waiting for seals");
        return;
    }
    struct svc_held *h = &s->put->held[s->put->n_held];
    h->len = protobuf_c_message_get_packed_size(&req->base);
    h->buf = malloc(h->len ? h->len : 1);
    h->identity = zframe_dup(identity);
    if (!h->buf || !h->identity) {
        free(h->buf);
        zframe_destroy(&h->identity);
        svc_reply_status(s, identity, req->req_id, KVP_ERR_NOMEM, "out of memory");
        return;
    }
    protobuf_c_message_pack(&req->base, h->buf);
    h->req_id = req->req_id;
    h->sealing = sealing;
    char **keys = NULL;
    size_t nk = read_keys(req, &keys);
    h->n_keys = nk > 8 ? 9 : (uint8_t)nk;
    for (size_t i = 0; i < nk && i < 8; i++)
        h->key_hash[i] = keys[i] ? svc_key_hash(keys[i]) : 0;
    h->until_ms = s->put->redispatch_until ? s->put->redispatch_until : svc_now_ms() + hold_ms;
    s->put->n_held++;
}

bool svc_put_hold_read(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req)
{
    if (!s->put || s->put->sealing.n == 0 || !identity)
        return false;
    char **keys = NULL;
    size_t n = read_keys(req, &keys);
    bool hit = false;
    for (size_t i = 0; i < n && !hit; i++) {
        uint64_t v;
        hit = keys[i] && svc_map_get(&s->put->sealing, svc_key_hash(keys[i]), &v) &&
              strcmp(((struct svc_seal *)(uintptr_t)v)->key, keys[i]) == 0;
    }
    if (!hit)
        return false;
    if (s->put->redispatch_until && s->put->redispatch_until <= svc_now_ms()) {
        svc_reply_status(s, identity, req->req_id, KVP_ERR_UNAVAILABLE, "a key's put is still being sealed");
        return true; /* held to its limit already */
    }
    svc_put_flush_seals(s); /* now, not at the next tick: the read waits for it */
    hold(s, identity, req, KVP_SVC_HELD_MS, true);
    return true;
}

size_t svc_put_intent_keys(struct kvp_master_service *s, const Kvp__Request *req, const char **out, size_t cap)
{
    /* No feature-level gate: an intent in the FSM means level 6 was committed, while a new
     * leader's own reading of the level is 1 until its first refresh (on_leader_ready). */
    if (!s->put || !s->is_leader || kvp_fsm_intent_count(s->fsm) == 0)
        return 0;
    if (s->put->redispatch_until && s->put->redispatch_until <= svc_now_ms())
        return 0; /* held to its limit already: answered as it is now */
    char **keys = NULL;
    size_t n = read_keys(req, &keys), hit = 0;
    for (size_t i = 0; i < n && hit < cap; i++) {
        struct kvp_fsm_intent in;
        /* an older leader's intent: maybe acknowledged by it; this leader's own are either
         * acknowledged here (sealing: svc_put_hold_read) or still being written */
        if (keys[i] && kvp_fsm_intent_get(s->fsm, keys[i], &in) && in.term < s->term &&
            !svc_put_sealing_op(s, keys[i], in.op_id))
            out[hit++] = keys[i];
    }
    return hit;
}

bool svc_put_hold_unready(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req)
{
    if (!s->put || !identity || !s->is_leader || s->segments_fresh_ms || s->put->n_held == KVP_SVC_HELD_MAX)
        return false;
    if (s->put->redispatch_until && s->put->redispatch_until <= svc_now_ms())
        return false; /* held to its limit already: the raft thread answers it */
    hold(s, identity, req, KVP_SVC_HELD_INTENT_MS, false);
    return true;
}

void svc_put_hold_intent(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req,
                         const char *const *keys, size_t n)
{
    hold(s, identity, req, KVP_SVC_HELD_INTENT_MS, false);
    for (size_t i = 0; i < n; i++)
        svc_resolve_urge(s, keys[i]);
}

void svc_put_status(struct kvp_master_service *s, json_t *soft)
{
    if (!s->put)
        return;
    json_object_set_new(soft, "put_intents", json_integer((json_int_t)s->put->n_intent_items));
    json_object_set_new(soft, "puts_sealed_early", json_integer((json_int_t)s->put->n_sealed_early));
    json_object_set_new(soft, "puts_sealing", json_integer((json_int_t)s->put->sealing.n));
    json_object_set_new(soft, "put_starts_from_reservations", json_integer((json_int_t)s->put->n_fast_starts));
    json_object_set_new(soft, "put_starts_refused_here", json_integer((json_int_t)s->put->n_slow_starts));
}
