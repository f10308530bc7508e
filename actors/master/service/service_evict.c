/*
 * service_evict.c — the leader's memory-pressure loop (service_evict.h, docs/eviction.md).
 *
 * 1. Every 50 ms (leader only, outside the election grace window), when puts happened since the
 *    last look or a PutStart found no space, an EvictScanReq runs as a raftlog query. The FSM
 *    answers with usage and, from the usage at which a round could evict something
 *    (kvp_evict_list_ratio) or on demand, every complete object.
 * 2. The service pairs each object with its soft state (last access, lease, prefix hint) and
 *    asks evict_policy.c for victims worth max(eviction_ratio × capacity, usage above
 *    (high − ratio) × capacity, the bytes asked by PutStarts since the last scan when one of them
 *    found no space), less what is already quarantined (it comes back by itself).
 *    Besides the watermark, the headroom rule (kvp_evict_headroom): used bytes, plus the
 *    quarantine not back within the horizon, are kept at or below capacity − write rate ×
 *    horizon × eviction_headroom_factor, where the horizon (kvp_evict_headroom_horizon_ms) is
 *    the longer of fence_grace_ms and what a leader failover locks evicted space for, so that
 *    when the pool fills, also across a leader kill, writers do not wait for quarantine.
 * 3. The victims go to the FSM as one EvictCmd (a Raft command); their extents are quarantined
 *    there and released by QuarantineRelease after fence_grace_ms, like any freed space. Until
 *    the command's result arrives, GetReplicaList answers NOT_FOUND for them (no new lease on an
 *    object that is going away).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "actors/master/fsm/evict_policy.h"
#include "actors/master/service/service_evict.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"

struct svc_evict {
    int policy;
    bool scan_inflight;
    unsigned evict_inflight;   /* EvictCmds of the last round not answered yet */
    size_t cmd_keys;           /* most keys per EvictCmd (EVICT_CMD_KEYS; tests: env) */
    bool dirty;                /* PutStart results since the last scan */
    bool need;                 /* a PutStart found no space */
    uint64_t need_bytes;       /* largest object × replicas that found no space */
    uint64_t max_put_bytes;    /* bytes (size × replicas) asked by PutStarts since the last scan */
    struct kvp_write_rate rate; /* bytes asked by PutStarts per second (evict_policy.h) */
    struct svc_map rate_keys;  /* key hash → ms its bytes were last counted in `rate` */
    uint64_t rate_keys_pruned_ms;
    uint64_t headroom;         /* kvp_evict_headroom at the last scan */
    uint64_t logged_headroom;  /* headroom last logged */
    uint64_t room_quiet_until; /* the headroom rule found nothing to take: no list for it before */
    /* From the last scan. */
    uint64_t cap, used, quar, pinned;
    uint64_t late;             /* of quar, not reusable within the headroom's horizon */
    uint64_t scan_ms;          /* monotonic time of the last listed scan, 0 = none */
    bool blocked;              /* last listed scan: nothing could be evicted */
    /* Monotonic time the first lease that blocked it ends (UINT64_MAX: only pins blocked it).
     * A verdict is not repeated past it: the scan saw leases that have ended since, and a put
     * answered "eviction cannot help" then would be refused with room to be made (seen under
     * load: test_evict_cluster's put right after the leases ended got NO_SPACE at once). */
    uint64_t blocked_until;
    char blocked_why[160];
    /* Hints and holds. */
    struct svc_map parents;    /* key hash → parent key hash (prefix hint) */
    struct svc_map evicting;   /* key hash → how many EvictCmd / un-forced Remove commands naming
                                  it are in flight (svc_evict_hide) */
    /* Counters (since this node became leader). */
    uint64_t rounds, objects, bytes, pinned_bytes_evicted, blocked_rounds;
    uint64_t lists; /* scans answered with the object list (O(objects) each) */
    /* The list is read in slices of `slice` table slots, one raft-thread query each, sent back
     * to back (issue 22: the whole list in one answer held the raft thread 0.3-0.7 s at 1M
     * objects and 4.5-7 s at 10M, docs/bench.md "Session 31"). A pass gathers the slices'
     * candidates (each key once) and on_scan runs on the whole list when the slice that ends the
     * table arrives. */
    uint64_t slice;
    uint64_t ticket;          /* of the query in flight; an answer with another is dropped */
    bool pass_on;             /* a pass is under way: the next query continues it */
    uint64_t pass_cursor, pass_table_slots, pass_slices;
    Kvp__EvictCandidate **acc; /* the pass's candidates so far (owned) */
    size_t acc_n, acc_cap;
    struct svc_map acc_seen;  /* their key hashes (a key moved by a removal may come twice) */
    uint64_t passes, pass_restarts, slices;
    uint64_t cmds; /* EvictCmds submitted (a round is one or more) */
};

/* One round's victims go to the FSM as EvictCmds of at most this many keys each, so that one
 * apply is bounded (issue 22: a round is eviction_ratio of the pool, 500k keys at 10M objects of
 * the bench's size, one apply of ~0.5 s). Same command, same effect key by key: members apply
 * them as they did one big one. */
#define EVICT_CMD_KEYS 8192u
#define EVICT_SLICE_SLOTS 32768u /* ~20k objects listed at the table's load: ~5-8 ms of raft-thread CPU */

static void pass_clear(struct svc_evict *e)
{
    for (size_t i = 0; i < e->acc_n; i++)
        kvp__evict_candidate__free_unpacked(e->acc[i], NULL);
    free(e->acc);
    e->acc = NULL;
    e->acc_n = e->acc_cap = 0;
    svc_map_fini(&e->acc_seen); /* not clear: a 10M-object pass's table would stay allocated */
    svc_map_init(&e->acc_seen);
    e->pass_on = false;
    e->pass_cursor = e->pass_table_slots = e->pass_slices = 0;
}

int svc_evict_new(struct kvp_master_service *s)
{
    struct svc_evict *e = calloc(1, sizeof *e);
    if (!e)
        return KVP_ERR_NOMEM;
    svc_map_init(&e->parents);
    svc_map_init(&e->evicting);
    svc_map_init(&e->rate_keys);
    svc_map_init(&e->acc_seen);
    int p = kvp_evict_policy_parse(s->cfg.eviction_policy);
    e->policy = p < 0 ? KVP_EVICT_LRU : p;
    e->slice = EVICT_SLICE_SLOTS;
    e->cmd_keys = EVICT_CMD_KEYS;
#ifdef KVP_FAULT_INJECTION
    const char *tk = getenv("KVPOOL_TEST_EVICT_CMD_KEYS");
    if (tk && strtoull(tk, NULL, 10) > 0)
        e->cmd_keys = (size_t)strtoull(tk, NULL, 10);
    /* tests: small slices, so a pass over a small table has many of them */
    const char *ts = getenv("KVPOOL_TEST_EVICT_SCAN_SLOTS");
    if (ts && strtoull(ts, NULL, 10) > 0) {
        e->slice = strtoull(ts, NULL, 10);
        kvp_log_info(s->actor, "eviction list: slices of %llu table slots (KVPOOL_TEST_EVICT_SCAN_SLOTS)",
                     (unsigned long long)e->slice);
    }
#endif
    s->evict = e;
    return KVP_OK;
}

void svc_evict_destroy(struct kvp_master_service *s)
{
    struct svc_evict *e = s->evict;
    if (!e)
        return;
    svc_map_fini(&e->parents);
    svc_map_fini(&e->evicting);
    svc_map_fini(&e->rate_keys);
    pass_clear(e);
    svc_map_fini(&e->acc_seen);
    free(e);
    s->evict = NULL;
}

void svc_evict_reset(struct kvp_master_service *s)
{
    struct svc_evict *e = s->evict;
    if (!e)
        return;
    svc_map_clear(&e->parents);
    svc_map_clear(&e->evicting);
    svc_map_clear(&e->rate_keys);
    pass_clear(e);
    int policy = e->policy;
    uint64_t slice = e->slice, ticket = e->ticket;
    size_t cmd_keys = e->cmd_keys;
    struct svc_map parents = e->parents, evicting = e->evicting, rate_keys = e->rate_keys, seen = e->acc_seen;
    memset(e, 0, sizeof *e);
    e->policy = policy;
    e->slice = slice;
    e->cmd_keys = cmd_keys;
    e->ticket = ticket + 1; /* an answer still in flight belongs to the old leadership */
    e->parents = parents;
    e->evicting = evicting;
    e->rate_keys = rate_keys;
    e->acc_seen = seen;
    e->dirty = true; /* look once the grace window is over */
}

bool svc_evict_hides(const struct kvp_master_service *s, uint64_t key_hash)
{
    return s->evict && s->evict->evicting.n > 0 && svc_map_get(&s->evict->evicting, key_hash, NULL);
}

void svc_evict_hide(struct kvp_master_service *s, uint64_t key_hash)
{
    uint64_t n = 0;
    if (!s->evict)
        return;
    svc_map_get(&s->evict->evicting, key_hash, &n);
    svc_map_put(&s->evict->evicting, key_hash, n + 1);
}

void svc_evict_unhide(struct kvp_master_service *s, uint64_t key_hash)
{
    uint64_t n = 0;
    if (!s->evict || !svc_map_del(&s->evict->evicting, key_hash, &n))
        return;
    if (n > 1)
        svc_map_put(&s->evict->evicting, key_hash, n - 1);
}

void svc_evict_on_put_start_req(struct kvp_master_service *s, const Kvp__PutStartReq *ps)
{
    struct svc_evict *e = s->evict;
    if (!e)
        return;
    uint64_t now = svc_now_ms(), grace = s->cfg.fence_grace_ms;
    /* Usage is about to grow: look again (the 50 ms timer starts the scan). The FSM path also
     * marks it at its result, but a PutStart answered from a reservation (service_put.c) has no
     * FSM result: with every put taking that path no scan ran, the headroom rule was never
     * applied, and a leader kill found the pool far fuller than the headroom (main job: 0.76 GB
     * free of 3.2 GB against 1.3 GB of headroom), so the new leader's grace-held eviction left
     * writers waiting seconds for space. */
    e->dirty = true;
    for (size_t i = 0; i < ps->n_items; i++) {
        const Kvp__PutStartItem *it = ps->items[i];
        if (!it->key)
            continue;
        uint64_t bytes = it->size * (it->replica_num ? it->replica_num : 1);
        e->max_put_bytes += bytes;
        /* a key counts once per window: retries of a put that found no space ask for no more */
        uint64_t h = svc_key_hash(it->key);
        kvp_write_rate_add_key(&e->rate, &e->rate_keys, h, bytes, now, grace);
        if (it->parent_key && it->parent_key[0])
            svc_map_put(&e->parents, h, svc_key_hash(it->parent_key));
    }
}

/* Quarantined bytes back within the headroom's horizon (the last scan's figures): only those
 * count as coming back by themselves; the late rest (a revoked put held to its deadline, a long
 * lease horizon) may take up to a put TTL. */
static uint64_t soon_quar(const struct svc_evict *e)
{
    return e->quar > e->late ? e->quar - e->late : 0;
}

/* The headroom's horizon (kvp_evict_headroom_horizon_ms): at the defaults 6.2 s. */
static uint64_t horizon_ms(const struct kvp_master_service *s)
{
    return kvp_evict_headroom_horizon_ms(s->cfg.fence_grace_ms, s->cfg.default_kv_lease_ttl_ms,
                                         s->cfg.election_timeout_ms);
}

/*
 * Headroom for the current write rate (kvp_evict_headroom), and the usage ratio from which the
 * FSM lists objects: the lowest at which on_scan could evict something (kvp_evict_list_ratio,
 * with the quarantine of the last scan). Logged when the headroom moves by 5% of the pool or more.
 */
static double list_ratio(struct kvp_master_service *s)
{
    struct svc_evict *e = s->evict;
    double high = s->cfg.eviction_high_watermark_ratio;
    uint64_t h_ms = horizon_ms(s);
    e->headroom = kvp_evict_headroom(e->cap, e->rate.bps, h_ms, s->cfg.eviction_headroom_factor);
    uint64_t moved = e->headroom > e->logged_headroom ? e->headroom - e->logged_headroom
                                                      : e->logged_headroom - e->headroom;
    if (e->cap && (double)moved >= 0.05 * (double)e->cap) {
        kvp_log_info(s->actor,
                     "eviction: writes at %.1f MB/s over a %llu ms horizon: keeping %.1f MB of %.1f MB "
                     "free or in quarantine due by then (eviction_headroom_factor %.2f)",
                     e->rate.bps / 1e6, (unsigned long long)h_ms, (double)e->headroom / 1e6,
                     (double)e->cap / 1e6, s->cfg.eviction_headroom_factor);
        e->logged_headroom = e->headroom;
    }
    /* Late quarantine counts as used (on_scan): both rules fire on the quarantine due within
     * the horizon only. The headroom rule then fires at used + late + headroom > capacity, i.e.
     * at usage (used + quarantined) > capacity − headroom + the quarantine due soon. */
    uint64_t room = svc_now_ms() < e->room_quiet_until ? 0 : e->headroom;
    return kvp_evict_list_ratio(e->cap, room, soon_quar(e), high, s->cfg.eviction_ratio);
}

/* Ask the FSM for usage (and the object list when needed). */
static void start_scan(struct kvp_master_service *s)
{
    struct svc_evict *e = s->evict;
    struct svc_pending *p = svc_pending_new(s, NULL, NULL);
    if (!p)
        return;
    p->internal = SVC_INT_EVICT_SCAN;
    p->evict_scan_ticket = ++e->ticket;
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__EvictScanReq q = KVP__EVICT_SCAN_REQ__INIT;
    /* quarantine not back within the horizon does not count as headroom (on_scan) */
    q.due_by_wall_ms = kvp_clock_wall_ms() + horizon_ms(s);
    q.slots = e->slice;
    if (e->pass_on) {
        /* The next slice of a pass: listed whatever the usage now (the pass decided to list). */
        q.cursor = e->pass_cursor;
        q.high_watermark = 0;
        req.body_case = KVP__REQUEST__BODY_EVICT_SCAN;
        req.evict_scan = &q;
        e->scan_inflight = true;
        svc_query(s, p, &req); /* on error the result path runs and clears the flag */
        return;
    }
    q.high_watermark = list_ratio(s);
    /* A waiting put makes the FSM list every object (O(objects) on the raft thread) only when
     * the quarantine of the last scan does not cover its need: if it does, on_scan would evict
     * nothing anyway (the put waits for the release). This scan still reads usage, so the next
     * one, 50 ms later, sees the quarantine that is left. */
    uint64_t need = e->need ? (e->need_bytes ? e->need_bytes : 1) : 0;
    q.need_bytes = need > soon_quar(e) ? need : 0;
    req.body_case = KVP__REQUEST__BODY_EVICT_SCAN;
    req.evict_scan = &q;
    e->scan_inflight = true;
    e->dirty = false;
    e->max_put_bytes = 0; /* demand seen from now on */
    svc_query(s, p, &req); /* on error the result path runs and clears the flag */
}

static void maybe_scan(struct kvp_master_service *s)
{
    struct svc_evict *e = s->evict;
    /* A new leader evicts too: what it evicts during its election grace is held past the
     * grace's end (the lease horizon of submit_evict), in case an older leader leased it. */
    if (!e || !s->is_leader || e->scan_inflight || e->evict_inflight)
        return;
    if (e->dirty || e->need)
        start_scan(s);
}

bool svc_evict_scan_wanted(const struct kvp_master_service *s)
{
    return s->evict && (s->evict->dirty || s->evict->need);
}

void svc_evict_kick(struct kvp_master_service *s)
{
    if (s->evict)
        s->evict->dirty = true;
    maybe_scan(s);
}

static int on_evict_timer(struct kvp_master_service *s)
{
    struct svc_evict *e = s->evict;
    if (e) {
        uint64_t now = svc_now_ms();
        kvp_write_rate_tick(&e->rate, now, s->cfg.fence_grace_ms);
        if (e->rate_keys.n > 0 && now - e->rate_keys_pruned_ms >= 1000) {
            kvp_write_rate_forget(&e->rate_keys, now, s->cfg.fence_grace_ms);
            e->rate_keys_pruned_ms = now;
        }
    }
    maybe_scan(s);
    return 0;
}

int svc_evict_timer_start(struct kvp_master_service *s)
{
    return svc_timer_every(s, 50, on_evict_timer); /* its own error, not always NOMEM */
}

void svc_evict_on_put_start_result(struct kvp_master_service *s, Kvp__Response *resp)
{
    struct svc_evict *e = s->evict;
    if (!e)
        return;
    e->dirty = true;
    if (!resp || !resp->put_start)
        return;
    bool release = false;
    for (size_t i = 0; i < resp->put_start->n_results; i++) {
        Kvp__PutStartResult *r = resp->put_start->results[i];
        if (r->status != KVP_ERR_NO_SPACE)
            continue;
        release = true;
        const char *why;
        bool evicting = true;
        uint64_t now = svc_now_ms();
        if (e->blocked && e->quar == 0 && !e->evict_inflight && now - e->scan_ms < 1000 && now < e->blocked_until) {
            why = e->blocked_why;
            evicting = false;
        } else {
            why = "no space; eviction is making room: retry";
        }
        if (evicting) {
            e->need = true;
            if (e->max_put_bytes > e->need_bytes)
                e->need_bytes = e->max_put_bytes;
        }
        char *dup = strdup(why);
        if (!dup)
            continue;
        /* an unset string of an unpacked message is protobuf-c's shared empty string: never free it */
        if (r->reason && r->reason != protobuf_c_empty_string)
            free(r->reason);
        r->reason = dup;
        r->evicting = evicting;
    }
    /* Quarantine that has served its time comes back now rather than at the next 500 ms tick
     * (a new leader's first puts into a full pool wait for nothing else). */
    if (release)
        svc_release_now(s);
    maybe_scan(s);
}

void svc_evict_on_remove_all(struct kvp_master_service *s)
{
    if (s->evict)
        svc_map_clear(&s->evict->parents);
}

static void submit_evict(struct kvp_master_service *s, char **keys, uint64_t *hashes, size_t n)
{
    struct svc_evict *e = s->evict;
    struct svc_pending *p = svc_pending_new(s, NULL, NULL);
    if (!p) {
        free(hashes);
        return;
    }
    p->internal = SVC_INT_EVICT;
    p->key_hashes = hashes;
    p->n_keys = n;
    p->hold_wall_ms = svc_lease_horizon(s, hashes, n);
    for (size_t i = 0; i < n; i++)
        svc_evict_hide(s, hashes[i]);
    Kvp__EvictCmd body = KVP__EVICT_CMD__INIT;
    body.keys = keys;
    body.n_keys = n;
    Kvp__Command cmd = KVP__COMMAND__INIT;
    cmd.body_case = KVP__COMMAND__BODY_EVICT;
    cmd.evict = &body;
    e->evict_inflight++;
    e->cmds++;
    svc_submit(s, p, &cmd); /* on error the result path runs and counts it answered */
}

/* A round's victims in EvictCmds of at most e->cmd_keys keys. keys stay the caller's; hashes
 * (n, malloc'd) is taken. */
static void submit_evict_round(struct kvp_master_service *s, char **keys, uint64_t *hashes, size_t n)
{
    size_t per = s->evict->cmd_keys ? s->evict->cmd_keys : n;
    for (size_t at = 0; at < n; at += per) {
        size_t m = n - at < per ? n - at : per;
        uint64_t *h = m == n ? hashes : malloc(m * sizeof *h);
        if (!h) {
            kvp_log_warn(s->actor, "eviction: no memory for a command of %zu keys; the rest of the round dropped", m);
            break;
        }
        if (h != hashes)
            memcpy(h, hashes + at, m * sizeof *h);
        submit_evict(s, keys + at, h, m);
    }
    if (per < n || n == 0)
        free(hashes);
}

static void on_scan(struct kvp_master_service *s, const Kvp__EvictScanResp *r)
{
    struct svc_evict *e = s->evict;
    e->cap = r->capacity_bytes;
    e->used = r->used_bytes;
    e->quar = r->quarantined_bytes;
    e->pinned = r->pinned_bytes;
    e->late = r->quarantined_late_bytes;
    if (!r->listed)
        return;
    e->lists++;
    e->scan_ms = svc_now_ms();
    double high = s->cfg.eviction_high_watermark_ratio, ratio = s->cfg.eviction_ratio;
    double lowmark = high - ratio > 0 ? high - ratio : 0;
    uint64_t usage = e->used + e->quar;
    uint64_t target = 0;
    if ((double)usage >= high * (double)e->cap || e->need) {
        target = (uint64_t)(ratio * (double)e->cap);
        if ((double)usage > lowmark * (double)e->cap && usage - (uint64_t)(lowmark * (double)e->cap) > target)
            target = usage - (uint64_t)(lowmark * (double)e->cap);
        if (e->need && e->need_bytes > target)
            target = e->need_bytes;
        if (target == 0 && e->need)
            target = 1; /* a put is waiting: free at least something */
        /* Quarantined bytes come back by themselves (those due within the horizon: late ones,
         * held to a put's deadline, may take a put TTL): count them as already freed. When they
         * cover what is needed, evict nothing: an evicted object's space is quarantined too, so
         * it could not serve the waiting put any sooner (it used to evict one object per
         * NO_SPACE round, each a lost cache entry). The put retries; once the quarantine is
         * released and space is still short, the next scan sees quar == 0 and evicts. */
        if (target <= soon_quar(e)) {
            e->need = false;
            e->need_bytes = 0;
            target = 0;
        } else {
            target -= soon_quar(e);
        }
    }
    /* The headroom rule counts free space and the quarantine that is back within the
     * headroom's horizon (kvp_evict_headroom_horizon_ms) as room: that space absorbs the writes
     * the headroom is for. Quarantine held past it (a revoked put's deadline, a lease horizon
     * longer than the failover's) counts as used. It evicts ahead of need, so it takes no
     * soft-pinned object and a round that finds nothing for it is not "blocked"
     * (kvp_evict_choose_round). */
    uint64_t t_room = kvp_evict_room_target(e->used, e->late, e->cap, e->headroom, ratio);
    if (target == 0 && t_room == 0) {
        e->blocked = false; /* nothing was needed: no verdict (else an older one looks fresh) */
        return;
    }

    size_t n = r->n_objects;
    struct kvp_evict_cand *c = calloc(n ? n : 1, sizeof *c);
    size_t *chosen = calloc(n ? n : 1, sizeof *chosen);
    if (!c || !chosen) {
        free(c);
        free(chosen);
        return;
    }
    struct svc_map present;
    svc_map_init(&present);
    uint64_t lease_end = UINT64_MAX; /* the first of the leases seen here to end */
    for (size_t i = 0; i < n; i++) {
        const Kvp__EvictCandidate *o = r->objects[i];
        uint64_t h = svc_key_hash(o->key);
        c[i].hash = h;
        c[i].size = o->size;
        c[i].pinned = o->soft_pin;
        c[i].leased = svc_key_leased(s, h);
        uint64_t exp = 0;
        if (c[i].leased && svc_map_get(&s->leases, h, &exp) && exp < lease_end)
            lease_end = exp;
        uint64_t at = 0, parent = 0;
        svc_map_get(&s->last_access, h, &at);
        svc_map_get(&e->parents, h, &parent);
        c[i].last_access = at;
        c[i].parent = parent;
        svc_map_put(&present, h, 1);
    }
    struct kvp_evict_summary sum;
    size_t k = kvp_evict_choose_round(c, n, target, t_room, e->policy, s->cfg.allow_evict_soft_pinned_objects,
                                      chosen, &sum);
    e->need = false;
    e->need_bytes = 0;
    /* The headroom rule alone, and not even its target could be chosen (the rest is leased or
     * pinned): no list for it for a second, rather than one O(objects) list per 50 ms scan. */
    if (target == 0 && sum.chosen_bytes < t_room)
        e->room_quiet_until = svc_now_ms() + 1000;
    /* Blocked: nothing may go and nothing comes back from quarantine. With no complete object
     * but capacity, the space is held by puts in progress: they complete (then evictable) or
     * are revoked, so clients keep waiting. Only the watermark or a waiting put can be blocked:
     * the headroom rule is ahead of need. */
    e->blocked = target > 0 && k == 0 && e->quar == 0 && (n > 0 || e->cap == 0);
    e->blocked_until = lease_end;
    if (e->blocked) {
        e->blocked_rounds++;
        if (n == 0)
            snprintf(e->blocked_why, sizeof e->blocked_why,
                     "no space; eviction cannot help: no segment is mounted");
        else
            snprintf(e->blocked_why, sizeof e->blocked_why,
                     "no space; eviction cannot help: every object is under a read lease or soft-pinned "
                     "(%llu bytes leased, %llu bytes pinned%s)",
                     (unsigned long long)sum.leased_bytes, (unsigned long long)sum.pinned_bytes,
                     s->cfg.allow_evict_soft_pinned_objects ? "" : ", allow_evict_soft_pinned_objects=false");
        kvp_log_warn(s->actor, "eviction: %s", e->blocked_why);
    }
    /* Drop hints of objects that no longer exist (keeps the table bounded). */
    size_t pos = 0;
    uint64_t key, val;
    struct svc_map keep;
    svc_map_init(&keep);
    while (svc_map_next(&e->parents, &pos, &key, &val))
        if (svc_map_get(&present, key, NULL))
            svc_map_put(&keep, key, val);
    svc_map_fini(&e->parents);
    e->parents = keep;
    svc_map_fini(&present);

    if (k > 0) {
        char **keys = calloc(k, sizeof *keys);
        uint64_t *hashes = calloc(k, sizeof *hashes);
        if (keys && hashes) {
            for (size_t j = 0; j < k; j++) {
                keys[j] = r->objects[chosen[j]]->key;
                hashes[j] = c[chosen[j]].hash;
            }
            e->rounds++;
            kvp_log_info(s->actor,
                         "eviction (%s): usage %llu of %llu bytes (%llu quarantined): evicting %zu objects, "
                         "%llu bytes (%llu pinned); %llu bytes leased",
                         kvp_evict_policy_name(e->policy), (unsigned long long)usage, (unsigned long long)e->cap,
                         (unsigned long long)e->quar, k, (unsigned long long)sum.chosen_bytes,
                         (unsigned long long)sum.pinned_chosen_bytes, (unsigned long long)sum.leased_bytes);
            e->pinned_bytes_evicted += sum.pinned_chosen_bytes;
            e->bytes += sum.chosen_bytes; /* counted at choice time: the FSM's result has no sizes */
            submit_evict_round(s, keys, hashes, k);
            hashes = NULL;
        }
        free(keys);
        free(hashes);
    }
    free(c);
    free(chosen);
}

/*
 * One answer of a pass (start_scan). Unlisted: usage only, as before. Listed: its candidates join
 * the pass (ownership moves from the answer); the slice that ends the table hands the whole list
 * to on_scan. A change of the table's size within a pass (a growth swapped tables: the cursor now
 * names other objects) starts the pass again. Objects added behind the cursor during a pass are
 * not candidates of that round, and one that a removal's backward shift moved from just after the
 * cursor to just before it is missed (table_moves): eviction is best effort, the next pass sees
 * them. A key seen twice (moved the other way) is taken once.
 */
static void on_scan_slice(struct kvp_master_service *s, Kvp__EvictScanResp *r)
{
    struct svc_evict *e = s->evict;
    if (!r->listed) {
        pass_clear(e);
        on_scan(s, r);
        return;
    }
    e->slices++;
    if (e->pass_on && r->table_slots != e->pass_table_slots) {
        e->pass_restarts++;
        pass_clear(e);
        e->dirty = true; /* start over at the next tick */
        return;
    }
    if (!e->pass_on) {
        e->pass_on = true;
        e->pass_table_slots = r->table_slots;
    }
    e->pass_slices++;
    if (e->acc_n + r->n_objects > e->acc_cap) {
        size_t nc = e->acc_cap ? e->acc_cap : 1024;
        while (nc < e->acc_n + r->n_objects)
            nc *= 2;
        Kvp__EvictCandidate **v = realloc(e->acc, nc * sizeof *v);
        if (!v) {
            kvp_log_warn(s->actor, "eviction list: no memory for %zu candidates; pass dropped",
                         e->acc_n + r->n_objects);
            pass_clear(e);
            e->dirty = true;
            return;
        }
        e->acc = v;
        e->acc_cap = nc;
    }
    for (size_t i = 0; i < r->n_objects; i++) {
        Kvp__EvictCandidate *o = r->objects[i];
        uint64_t h = svc_key_hash(o->key);
        if (svc_map_get(&e->acc_seen, h, NULL) || svc_map_put(&e->acc_seen, h, 1) != KVP_OK) {
            kvp__evict_candidate__free_unpacked(o, NULL);
            continue;
        }
        e->acc[e->acc_n++] = o;
    }
    r->n_objects = 0; /* taken (the answer frees only its array now) */
    if (r->next_cursor != 0) {
        e->pass_cursor = r->next_cursor;
        start_scan(s); /* the next slice at once: other raft-thread work runs between the two */
        return;
    }
    /* The pass is whole: the usage figures of its last slice, the candidates of all. */
    e->passes++;
    Kvp__EvictScanResp whole = *r;
    whole.objects = e->acc;
    whole.n_objects = e->acc_n;
    on_scan(s, &whole);
    pass_clear(e);
}

void svc_evict_on_internal(struct kvp_master_service *s, struct svc_pending *p, int status, Kvp__Response *resp)
{
    struct svc_evict *e = s->evict;
    if (!e)
        return;
    int st = status != KVP_OK ? status : (resp ? resp->status : KVP_ERR_INTERNAL);
    if (p->internal == SVC_INT_EVICT_SCAN) {
        if (p->evict_scan_ticket != e->ticket) {
            kvp_log_debug(s->actor, "eviction scan: an answer from before a reset, dropped");
            return;
        }
        e->scan_inflight = false;
        if (st == KVP_OK && resp->evict_scan && s->is_leader)
            on_scan_slice(s, resp->evict_scan);
        else {
            pass_clear(e); /* the next scan starts a new pass */
            if (st != KVP_ERR_NOT_LEADER)
                kvp_log_debug(s->actor, "eviction scan: %s", kvp_strerror(st));
        }
        return;
    }
    if (p->internal != SVC_INT_EVICT)
        return;
    if (e->evict_inflight > 0)
        e->evict_inflight--;
    for (size_t i = 0; i < p->n_keys; i++)
        svc_evict_unhide(s, p->key_hashes[i]);
    if (st != KVP_OK || !resp->remove) {
        if (st != KVP_ERR_NOT_LEADER)
            kvp_log_warn(s->actor, "eviction of %zu objects not committed: %s", p->n_keys, kvp_strerror(st));
        return;
    }
    uint64_t gone = 0;
    for (size_t i = 0; i < p->n_keys && i < resp->remove->n_status; i++)
        if (resp->remove->status[i] == KVP_OK) {
            gone++;
            svc_map_del(&s->last_access, p->key_hashes[i], NULL);
            svc_map_del(&e->parents, p->key_hashes[i], NULL);
        }
    e->objects += gone;
    s->fsm_quarantined_bytes++; /* let QuarantineRelease run */
    e->dirty = true;          /* look again: one round may not have been enough */
}

void svc_evict_status(struct kvp_master_service *s, void *json_doc)
{
    struct svc_evict *e = s->evict;
    json_t *doc = json_doc;
    if (!e || !doc)
        return;
    json_t *ev = json_object();
    if (!ev)
        return;
    json_object_set_new(ev, "policy", json_string(kvp_evict_policy_name(e->policy)));
    json_object_set_new(ev, "rounds", json_integer((json_int_t)e->rounds));
    json_object_set_new(ev, "objects_evicted", json_integer((json_int_t)e->objects));
    json_object_set_new(ev, "bytes_chosen", json_integer((json_int_t)e->bytes));
    json_object_set_new(ev, "pinned_bytes_evicted", json_integer((json_int_t)e->pinned_bytes_evicted));
    json_object_set_new(ev, "blocked_rounds", json_integer((json_int_t)e->blocked_rounds));
    json_object_set_new(ev, "lists", json_integer((json_int_t)e->lists));
    json_object_set_new(ev, "list_slices", json_integer((json_int_t)e->slices));
    json_object_set_new(ev, "list_pass_restarts", json_integer((json_int_t)e->pass_restarts));
    json_object_set_new(ev, "commands", json_integer((json_int_t)e->cmds));
    json_object_set_new(ev, "blocked", json_boolean(e->blocked));
    json_object_set_new(ev, "prefix_hints", json_integer((json_int_t)e->parents.n));
    json_object_set_new(ev, "in_flight", json_integer((json_int_t)e->evicting.n));
    json_object_set_new(ev, "write_rate_bytes_per_s", json_real(e->rate.bps));
    json_object_set_new(ev, "headroom_bytes", json_integer((json_int_t)e->headroom));
    json_object_set_new(ev, "headroom_horizon_ms", json_integer((json_int_t)horizon_ms(s)));
    json_object_set_new(ev, "quarantined_late_bytes", json_integer((json_int_t)e->late));
    json_object_set_new(doc, "eviction", ev);
}

/* ------------------------------------------------------------------ write rate per key */

static uint64_t key_window(uint64_t window_ms) { return window_ms > 1000 ? window_ms : 1000; }

bool kvp_write_rate_add_key(struct kvp_write_rate *r, struct svc_map *seen, uint64_t key_hash, uint64_t bytes,
                            uint64_t now_ms, uint64_t window_ms)
{
    uint64_t at = 0;
    if (svc_map_get(seen, key_hash, &at) && now_ms >= at && now_ms - at < key_window(window_ms))
        return false;
    kvp_write_rate_add(r, bytes);
    svc_map_put(seen, key_hash, now_ms); /* out of memory: counted again next time, no harm */
    return true;
}

struct forget_ctx {
    uint64_t now, window;
};

static bool key_fresh(uint64_t key, uint64_t at, void *ctx)
{
    (void)key;
    const struct forget_ctx *x = ctx;
    return x->now >= at && x->now - at < x->window;
}

void kvp_write_rate_forget(struct svc_map *seen, uint64_t now_ms, uint64_t window_ms)
{
    struct forget_ctx x = {.now = now_ms, .window = key_window(window_ms)};
    svc_map_filter(seen, key_fresh, &x);
}
