/*
 * evict_policy.c — the pure eviction choice (evict_policy.h, docs/eviction.md) and the FSM's
 * answer to the leader's EvictScanReq.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "actors/master/fsm/evict_policy.h"
#include "actors/master/fsm/fsm.h"
#include "kvpool.h"

int kvp_evict_policy_parse(const char *name)
{
    if (!name)
        return -1;
    if (strcmp(name, "lru") == 0)
        return KVP_EVICT_LRU;
    if (strcmp(name, "prefix") == 0)
        return KVP_EVICT_PREFIX;
    return -1;
}

const char *kvp_evict_policy_name(int policy)
{
    return policy == KVP_EVICT_PREFIX ? "prefix" : "lru";
}

/* Order: older first, then smaller hash. */
static bool older(const struct kvp_evict_cand *a, const struct kvp_evict_cand *b)
{
    if (a->last_access != b->last_access)
        return a->last_access < b->last_access;
    return a->hash < b->hash;
}

static int lru_cmp(const void *x, const void *y, void *ctx)
{
    const struct kvp_evict_cand *base = ctx;
    const struct kvp_evict_cand *a = &base[*(const size_t *)x], *b = &base[*(const size_t *)y];
    if (older(a, b))
        return -1;
    return older(b, a) ? 1 : 0;
}

/* Indexes sorted by hash, for parent lookups. */
static int hash_cmp(const void *x, const void *y, void *ctx)
{
    const struct kvp_evict_cand *base = ctx;
    uint64_t a = base[*(const size_t *)x].hash, b = base[*(const size_t *)y].hash;
    return a < b ? -1 : a > b;
}

static size_t find_hash(const struct kvp_evict_cand *c, const size_t *by_hash, size_t n, uint64_t h)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint64_t v = c[by_hash[mid]].hash;
        if (v == h)
            return by_hash[mid];
        if (v < h)
            lo = mid + 1;
        else
            hi = mid;
    }
    return SIZE_MAX;
}

/* Binary min-heap of candidate indexes ordered by older(). */
struct heap {
    size_t *v;
    size_t n;
    const struct kvp_evict_cand *c;
};

static void heap_push(struct heap *h, size_t x)
{
    size_t i = h->n++;
    h->v[i] = x;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!older(&h->c[h->v[i]], &h->c[h->v[p]]))
            break;
        size_t t = h->v[i];
        h->v[i] = h->v[p];
        h->v[p] = t;
        i = p;
    }
}

static size_t heap_pop(struct heap *h)
{
    size_t top = h->v[0];
    h->v[0] = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && older(&h->c[h->v[l]], &h->c[h->v[m]]))
            m = l;
        if (r < h->n && older(&h->c[h->v[r]], &h->c[h->v[m]]))
            m = r;
        if (m == i)
            break;
        size_t t = h->v[i];
        h->v[i] = h->v[m];
        h->v[m] = t;
        i = m;
    }
    return top;
}

static bool may_take(const struct kvp_evict_cand *x, bool allow_pinned)
{
    return !x->leased && (allow_pinned || !x->pinned);
}

void kvp_write_rate_add(struct kvp_write_rate *r, uint64_t bytes) { r->bytes += bytes; }

double kvp_write_rate_tick(struct kvp_write_rate *r, uint64_t now_ms, uint64_t window_ms)
{
    if (r->t0_ms == 0 || now_ms < r->t0_ms) {
        r->t0_ms = now_ms ? now_ms : 1;
        r->bytes = 0;
        return r->bps;
    }
    uint64_t dt = now_ms - r->t0_ms;
    if (dt < 1000) {
        /* No bucket closed yet (a new leader's first second): the partial one, once it spans
         * KVP_WRITE_RATE_FIRST_MS, so that its eviction keeps headroom from then on rather than
         * a second later (what it evicts in its election grace is held the longest). */
        if (r->n == 0 && dt >= KVP_WRITE_RATE_FIRST_MS)
            r->bps = (double)r->bytes * 1000.0 / (double)dt;
        return r->bps;
    }
    r->b_bytes[r->head] = r->bytes;
    r->b_ms[r->head] = dt;
    r->head = (r->head + 1) % KVP_WRITE_RATE_BUCKETS;
    if (r->n < KVP_WRITE_RATE_BUCKETS)
        r->n++;
    r->bytes = 0;
    r->t0_ms = now_ms;
    uint64_t sum_b = 0, sum_ms = 0;
    for (unsigned k = 0; k < r->n && (k == 0 || sum_ms < window_ms); k++) {
        unsigned i = (r->head + KVP_WRITE_RATE_BUCKETS - 1 - k) % KVP_WRITE_RATE_BUCKETS;
        sum_b += r->b_bytes[i];
        sum_ms += r->b_ms[i];
    }
    r->bps = sum_ms ? (double)sum_b * 1000.0 / (double)sum_ms : 0;
    /* A rising rate: the window's mean lags it by half the window (the main job's writes grow
     * from ~100 to ~250 MB/s in the 10 s before its leader kill, and the mean then sized the
     * headroom ~1.5x short: issue 21 item 2). The newest KVP_WRITE_RATE_RECENT buckets' rate is
     * the floor; two buckets rather than one, so that a single burst second counts less. */
    uint64_t rb = 0, rms = 0;
    for (unsigned k = 0; k < r->n && k < KVP_WRITE_RATE_RECENT; k++) {
        unsigned i = (r->head + KVP_WRITE_RATE_BUCKETS - 1 - k) % KVP_WRITE_RATE_BUCKETS;
        rb += r->b_bytes[i];
        rms += r->b_ms[i];
    }
    double recent = rms ? (double)rb * 1000.0 / (double)rms : 0;
    if (window_ms >= rms && recent > r->bps)
        r->bps = recent;
    return r->bps;
}

uint64_t kvp_evict_headroom(uint64_t capacity, double write_bps, uint64_t horizon_ms, double factor)
{
    if (capacity == 0 || !(factor > 0) || !(write_bps > 0))
        return 0;
    double h = write_bps * (double)horizon_ms / 1000.0 * factor;
    double half = (double)(capacity / 2);
    return h >= half ? capacity / 2 : (uint64_t)h;
}

uint64_t kvp_evict_headroom_horizon_ms(uint64_t fence_grace_ms, uint64_t lease_ttl_ms,
                                       uint64_t election_timeout_ms)
{
    uint64_t four = election_timeout_ms > UINT64_MAX / 4 ? UINT64_MAX : 4 * election_timeout_ms;
    uint64_t fo = lease_ttl_ms > UINT64_MAX - four ? UINT64_MAX : lease_ttl_ms + four;
    return fo > fence_grace_ms ? fo : fence_grace_ms;
}

uint64_t kvp_evict_room_target(uint64_t used, uint64_t late, uint64_t capacity, uint64_t headroom, double ratio)
{
    uint64_t u = late > UINT64_MAX - used ? UINT64_MAX : used + late;
    uint64_t t = kvp_evict_headroom_target(u, capacity, headroom, ratio);
    return t < used ? t : used;
}

uint64_t kvp_evict_headroom_target(uint64_t used, uint64_t capacity, uint64_t headroom, double ratio)
{
    if (headroom == 0)
        return 0;
    if (used > UINT64_MAX - headroom)
        return used; /* cannot happen with real sizes (headroom <= capacity / 2) */
    if (used + headroom <= capacity)
        return 0;
    double step = ratio > 0 ? ratio * (double)capacity : 0;
    uint64_t t = used + headroom - capacity + (uint64_t)step;
    return t < used ? t : used;
}

double kvp_evict_list_ratio(uint64_t capacity, uint64_t headroom, uint64_t quarantined, double high, double ratio)
{
    if (capacity == 0)
        return high;
    double cap = (double)capacity, q = (double)quarantined;
    double low = high - ratio > 0 ? high - ratio : 0;
    double wm = high;
    if (q >= ratio * cap && low + q / cap > wm)
        wm = low + q / cap;
    if (headroom == 0 || headroom > capacity)
        return wm;
    double room = ((double)(capacity - headroom) + q) / cap;
    return room < wm ? room : wm;
}

size_t kvp_evict_choose_round(const struct kvp_evict_cand *c, size_t n, uint64_t target, uint64_t room,
                              int policy, bool allow_pinned, size_t *chosen, struct kvp_evict_summary *sum)
{
    if (room <= target)
        return kvp_evict_choose(c, n, target, policy, allow_pinned, chosen, sum);
    struct kvp_evict_summary local;
    if (!sum)
        sum = &local;
    size_t k = kvp_evict_choose(c, n, room, policy, false, chosen, sum);
    if (target == 0 || !allow_pinned || sum->chosen_bytes >= target)
        return k;
    return kvp_evict_choose(c, n, target, policy, true, chosen, sum);
}

size_t kvp_evict_choose(const struct kvp_evict_cand *c, size_t n, uint64_t target, int policy,
                        bool allow_pinned, size_t *chosen, struct kvp_evict_summary *sum)
{
    struct kvp_evict_summary local;
    if (!sum)
        sum = &local;
    memset(sum, 0, sizeof *sum);
    for (size_t i = 0; i < n; i++) {
        if (c[i].leased)
            sum->leased_bytes += c[i].size;
        else if (allow_pinned || !c[i].pinned)
            sum->evictable_bytes += c[i].size;
        if (c[i].pinned)
            sum->pinned_bytes += c[i].size;
    }
    if (n == 0 || target == 0)
        return 0;

    size_t *lru = malloc(n * sizeof *lru);
    bool *taken = calloc(n, sizeof *taken);
    size_t *by_hash = NULL, *children = NULL, *parent_of = NULL;
    struct heap h = {.c = c};
    size_t k = 0;
    uint64_t bytes = 0;
    if (!lru || !taken)
        goto out;
    for (size_t i = 0; i < n; i++)
        lru[i] = i;
    qsort_r(lru, n, sizeof *lru, lru_cmp, (void *)c);

    if (policy == KVP_EVICT_PREFIX) {
        by_hash = malloc(n * sizeof *by_hash);
        children = calloc(n, sizeof *children);
        parent_of = malloc(n * sizeof *parent_of);
        h.v = malloc(n * sizeof *h.v);
        if (!by_hash || !children || !parent_of || !h.v)
            goto out;
        for (size_t i = 0; i < n; i++)
            by_hash[i] = i;
        qsort_r(by_hash, n, sizeof *by_hash, hash_cmp, (void *)c);
        for (size_t i = 0; i < n; i++) {
            parent_of[i] = c[i].parent && c[i].parent != c[i].hash ? find_hash(c, by_hash, n, c[i].parent)
                                                                  : SIZE_MAX;
            if (parent_of[i] != SIZE_MAX)
                children[parent_of[i]]++;
        }
        /* Leaf-first: unpinned pass, then pinned allowed. A chosen child releases its parent. */
        for (int pass = 0; pass < (allow_pinned ? 2 : 1) && bytes < target; pass++) {
            h.n = 0;
            for (size_t i = 0; i < n; i++)
                if (!taken[i] && children[i] == 0 && may_take(&c[i], pass == 1))
                    heap_push(&h, i);
            while (h.n > 0 && bytes < target) {
                size_t x = heap_pop(&h);
                if (taken[x])
                    continue;
                taken[x] = true;
                chosen[k++] = x;
                bytes += c[x].size;
                if (c[x].pinned)
                    sum->pinned_chosen_bytes += c[x].size;
                size_t p = parent_of[x];
                if (p != SIZE_MAX && --children[p] == 0 && !taken[p] && may_take(&c[p], pass == 1))
                    heap_push(&h, p);
            }
        }
    }
    /* LRU (and the prefix policy's fallback): unpinned first, then pinned. */
    for (int pass = 0; pass < (allow_pinned ? 2 : 1) && bytes < target; pass++)
        for (size_t r = 0; r < n && bytes < target; r++) {
            size_t x = lru[r];
            if (taken[x] || !may_take(&c[x], pass == 1))
                continue;
            taken[x] = true;
            chosen[k++] = x;
            bytes += c[x].size;
            if (c[x].pinned)
                sum->pinned_chosen_bytes += c[x].size;
        }
    sum->n_chosen = k;
    sum->chosen_bytes = bytes;
out:
    free(lru);
    free(taken);
    free(by_hash);
    free(children);
    free(parent_of);
    free(h.v);
    return k;
}

/* ------------------------------------------------------------------ FSM side of EvictScanReq */

struct scan_ctx {
    Kvp__EvictScanResp *body;
    size_t cap;
    bool nomem;
};

static void scan_one(void *ctx, const char *key, uint64_t size, bool soft_pin)
{
    struct scan_ctx *sc = ctx;
    Kvp__EvictScanResp *b = sc->body;
    if (sc->nomem)
        return;
    if (b->n_objects == sc->cap) {
        size_t nc = sc->cap ? sc->cap * 2 : 256;
        Kvp__EvictCandidate **v = realloc(b->objects, nc * sizeof *v);
        if (!v) {
            sc->nomem = true;
            return;
        }
        b->objects = v;
        sc->cap = nc;
    }
    Kvp__EvictCandidate *e = malloc(sizeof *e);
    char *k = e ? strdup(key) : NULL;
    if (!e || !k) {
        free(e);
        sc->nomem = true;
        return;
    }
    kvp__evict_candidate__init(e);
    e->key = k;
    e->size = size;
    e->soft_pin = soft_pin;
    b->objects[b->n_objects++] = e;
}

int kvp_evict_scan(const struct kvp_master_fsm *f, const Kvp__EvictScanReq *q, Kvp__Response *r)
{
    Kvp__EvictScanResp *body = malloc(sizeof *body);
    if (!body)
        return KVP_ERR_NOMEM;
    kvp__evict_scan_resp__init(body);
    r->body_case = KVP__RESPONSE__BODY_EVICT_SCAN;
    r->evict_scan = body;
    struct kvp_master_fsm_stats st;
    kvp_master_fsm_stats(f, &st);
    body->capacity_bytes = st.capacity_bytes;
    body->used_bytes = st.used_bytes;
    body->quarantined_bytes = st.quarantined_bytes;
    body->pinned_bytes = st.pinned_bytes;
    if (q->due_by_wall_ms)
        body->quarantined_late_bytes = kvp_master_fsm_quarantine_late(f, q->due_by_wall_ms);
    double usage = st.capacity_bytes ? (double)(st.used_bytes + st.quarantined_bytes) / (double)st.capacity_bytes
                                     : 0.0;
    if (q->need_bytes == 0 && usage < q->high_watermark)
        return KVP_OK;
    struct scan_ctx sc = {.body = body};
    /* slots 0: the whole table (the older request); else one slice of a pass (issue 22) */
    body->next_cursor = kvp_master_fsm_foreach_object_slice(f, q->cursor, q->slots, scan_one, &sc,
                                                            &body->table_slots, &body->table_moves);
    body->listed = true;
    return sc.nomem ? KVP_ERR_NOMEM : KVP_OK;
}
