/*
 * service_quota.c — use and quota per tenant (service_quota.h). Soft state of the leader:
 * use is read from the state machine's per-tenant counts, kept there as entries are applied
 * (kvp_master_fsm_tenants: O(tenants), read on this thread under kvp_raftlog_read_begin, as the
 * data path's local reads are), at most every QUOTA_SCAN_MS, plus the bytes of PutStarts
 * admitted since (so puts in flight count before they complete; the next read replaces the
 * estimate). Only a tenant over its quota walks the objects, for its eviction candidates (in
 * slices of the table, the read lock let go between two: scan()). Without a quota a tenant is only counted: eviction is then the pool's one LRU
 * across tenants (service_evict.c).
 */
#include "actors/master/service/service_quota.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/master/service/service_evict.h"
#include "auth/auth_scope.h"
#include "config/config.h"
#include "kvpool.h"
#include "runtime/log.h"

#define QUOTA_MAX_TENANTS 64
#define QUOTA_SCAN_MS 250
#define STATUS_SCAN_MS 2000
#define SVC_INT_QUOTA_EVICT 200 /* internal kind: the result needs nothing (on_internal_result ignores it) */
#define ALIGN64(x) (((x) + 63u) & ~(uint64_t)63u)

struct quota_tenant {
    char name[KVP_AUTH_TENANT_MAX];
    uint64_t quota_bytes;   /* 0 = none (counted only) */
    uint64_t used_bytes;    /* complete objects at the last scan */
    uint64_t objects;
    uint64_t admitted;      /* PutStart bytes admitted since the last scan */
    uint64_t scanned_ms;
    uint64_t evictions;     /* objects evicted for its quota */
    uint64_t refusals;      /* PutStarts refused NO_SPACE */
};

struct svc_quota {
    size_t n;
    struct quota_tenant t[QUOTA_MAX_TENANTS];
    uint64_t status_ms;     /* last full scan for status/metrics */
    bool lost_logged;       /* the FSM's "a count was lost" was logged (once per loss, not per scan) */
};

struct cand {
    char *key;
    uint64_t size;
    uint64_t last;
};

struct scan {
    struct svc_quota *q;
    const char *collect;    /* tenant whose objects are collected as candidates, or NULL */
    size_t collect_len;
    struct kvp_master_service *s;
    struct cand *c;
    size_t n, cap;
    bool oom;
    struct svc_map seen;    /* key hashes collected (a key a removal moved across the cursor may come twice) */
};

/* The candidates walk reads this many table slots per hold of the FSM read lock, and lets the
 * raft thread apply between two (issue 22: one hold of the whole walk blocked its applies for
 * 0.2 s at 1M objects, ~2 s at 10M; docs/bench.md "Session 31"). */
#define QUOTA_SLICE_SLOTS 32768u
#define QUOTA_CMD_KEYS 8192u /* keys per EvictCmd, as service_evict.c's */

static struct quota_tenant *find(struct svc_quota *q, const char *name, bool add)
{
    for (size_t i = 0; i < q->n; i++)
        if (strcmp(q->t[i].name, name) == 0)
            return &q->t[i];
    if (!add || q->n == QUOTA_MAX_TENANTS)
        return NULL;
    struct quota_tenant *t = &q->t[q->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}

int svc_quota_new(struct kvp_master_service *s)
{
    s->quota = calloc(1, sizeof *s->quota);
    if (!s->quota)
        return KVP_ERR_NOMEM;
    char buf[sizeof s->cfg.tenant_quota];
    snprintf(buf, sizeof buf, "%s", s->cfg.tenant_quota);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        char *eq = strchr(tok, '=');
        uint64_t bytes = 0;
        if (eq)
            *eq = '\0';
        if (!eq || !*tok || !kvp_auth_tenant_valid(tok) || kvp_cfg_parse_size(eq + 1, &bytes) != KVP_OK || !bytes ||
            !find(s->quota, tok, true)) {
            kvp_log_error(s->actor, "tenant_quota=\"%s\": expected TENANT=SIZE,... (tenant 1..63 of [A-Za-z0-9._-], "
                          "size > 0, at most %d tenants)", s->cfg.tenant_quota, QUOTA_MAX_TENANTS);
            return KVP_ERR_INVALID;
        }
        find(s->quota, tok, false)->quota_bytes = bytes;
    }
    return KVP_OK;
}

void svc_quota_destroy(struct kvp_master_service *s)
{
    free(s->quota);
    s->quota = NULL;
}

static void use_one(void *ctx, const char *tenant, uint64_t used_bytes, uint64_t objects)
{
    struct scan *sc = ctx;
    struct quota_tenant *t = find(sc->q, tenant, objects > 0);
    if (t) {
        t->used_bytes = used_bytes;
        t->objects = objects;
    }
}

static void scan_one(void *ctx, const char *key, uint64_t size, bool soft_pin)
{
    struct scan *sc = ctx;
    size_t pl = kvp_auth_key_tenant(key, NULL, 0);
    if (!sc->collect || pl != sc->collect_len + 1 || strncmp(key, sc->collect, sc->collect_len) != 0)
        return;
    if (soft_pin && !sc->s->cfg.allow_evict_soft_pinned_objects)
        return;
    uint64_t h = svc_key_hash(key);
    if (svc_key_leased(sc->s, h) || svc_evict_hides(sc->s, h) || svc_map_get(&sc->seen, h, NULL))
        return;
    if (svc_map_put(&sc->seen, h, 1) != KVP_OK) {
        sc->oom = true;
        return;
    }
    if (sc->n == sc->cap) {
        size_t nc = sc->cap ? sc->cap * 2 : 64;
        struct cand *c = realloc(sc->c, nc * sizeof *c);
        if (!c) {
            sc->oom = true;
            return;
        }
        sc->c = c;
        sc->cap = nc;
    }
    uint64_t last = 0;
    svc_map_get(&sc->s->last_access, h, &last);
    sc->c[sc->n].key = strdup(key);
    if (!sc->c[sc->n].key) {
        sc->oom = true;
        return;
    }
    sc->c[sc->n].size = ALIGN64(size);
    sc->c[sc->n].last = last;
    sc->n++;
}

/* Every tenant's use (O(tenants)); with `collect`, also that tenant's eviction candidates (a walk
 * of every object: only for a tenant over its quota), in slices of QUOTA_SLICE_SLOTS table slots
 * with the read lock let go between two: the raft thread waits for one slice at most. Between
 * two slices the table may change: a key seen twice (moved across the cursor, or a growth that
 * doubled the table: the new table's upper half holds objects already seen) counts once; an
 * object added or moved behind the cursor is not a candidate this time. The walk stops where
 * the state machine can no longer be read (leadership lost, or not confirmed by the raft thread
 * within the local-read window, kvp_raftlog_read_begin): the candidates found so far are used
 * (the least recently used among them go; a commit of theirs fails NOT_LEADER if leadership is
 * gone). false when it cannot be read at the start. */
static bool scan(struct kvp_master_service *s, const char *collect, struct scan *sc)
{
    memset(sc, 0, sizeof *sc);
    svc_map_init(&sc->seen);
    sc->q = s->quota;
    sc->s = s;
    sc->collect = collect;
    sc->collect_len = collect ? strlen(collect) : 0;
    if (kvp_raftlog_read_begin(s->rl) != KVP_OK)
        return false;
    uint64_t now = svc_now_ms();
    for (size_t i = 0; i < s->quota->n; i++) {
        s->quota->t[i].used_bytes = s->quota->t[i].objects = s->quota->t[i].admitted = 0;
        s->quota->t[i].scanned_ms = now;
    }
    bool lost = kvp_master_fsm_tenants(s->fsm, use_one, sc) == KVP_ERR_NOMEM;
    if (lost && !s->quota->lost_logged) /* it stays lost until a restore: say so once, not 4/s */
        kvp_log_warn(s->actor, "tenant use: a count was lost for want of memory; figures are low until a restore");
    s->quota->lost_logged = lost;
    if (collect) {
        uint64_t cursor = 0, slice = QUOTA_SLICE_SLOTS;
#ifdef KVP_FAULT_INJECTION
        /* tests: small slices, so a small table's walk lets the lock go many times */
        const char *ts = getenv("KVPOOL_TEST_QUOTA_SCAN_SLOTS");
        if (ts && strtoull(ts, NULL, 10) > 0)
            slice = strtoull(ts, NULL, 10);
#endif
        while ((cursor = kvp_master_fsm_foreach_object_slice(s->fsm, cursor, slice, scan_one, sc,
                                                              NULL, NULL)) != 0) {
            kvp_raftlog_read_end(s->rl);
            if (kvp_raftlog_read_begin(s->rl) != KVP_OK) {
                s->quota->status_ms = now;
                return true; /* not readable any more: nothing to end */
            }
        }
    }
    kvp_raftlog_read_end(s->rl);
    s->quota->status_ms = now;
    return true;
}

static void scan_free(struct scan *sc)
{
    for (size_t i = 0; i < sc->n; i++)
        free(sc->c[i].key);
    free(sc->c);
    svc_map_fini(&sc->seen);
}

static int by_last(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    return x->last < y->last ? -1 : x->last > y->last ? 1 : strcmp(x->key, y->key);
}

static void submit_evict(struct kvp_master_service *s, struct cand *c, size_t n)
{
    struct svc_pending *p = svc_pending_new(s, NULL, NULL);
    char **keys = calloc(n, sizeof *keys);
    uint64_t *hashes = calloc(n, sizeof *hashes);
    if (!p || !keys || !hashes) {
        free(keys);
        free(hashes);
        svc_pending_free(p);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        keys[i] = c[i].key;
        hashes[i] = svc_key_hash(c[i].key);
    }
    p->internal = SVC_INT_QUOTA_EVICT;
    p->key_hashes = hashes;
    p->n_keys = n;
    Kvp__EvictCmd body = KVP__EVICT_CMD__INIT;
    body.keys = keys;
    body.n_keys = n;
    Kvp__Command cmd = KVP__COMMAND__INIT;
    cmd.body_case = KVP__COMMAND__BODY_EVICT;
    cmd.evict = &body;
    svc_submit(s, p, &cmd); /* the command is encoded here; keys stay the caller's */
    free(keys);
}

bool svc_quota_admit(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req, const char *tenant)
{
    struct svc_quota *q = s->quota;
    struct quota_tenant *t = q && tenant[0] ? find(q, tenant, false) : NULL;
    if (!t || !t->quota_bytes || req->body_case != KVP__REQUEST__BODY_PUT_START || !req->put_start)
        return true;
    uint64_t need = 0;
    for (size_t i = 0; i < req->put_start->n_items; i++)
        need += ALIGN64(req->put_start->items[i]->size);
    char why[200];
    if (need > t->quota_bytes) {
        snprintf(why, sizeof why, "tenant %s: %llu bytes asked, its quota is %llu", tenant, (unsigned long long)need,
                 (unsigned long long)t->quota_bytes);
        goto refuse;
    }
    uint64_t now = svc_now_ms();
    struct scan sc;
    memset(&sc, 0, sizeof sc);
    bool over = t->used_bytes + t->admitted + need > t->quota_bytes;
    if (over || now - t->scanned_ms >= QUOTA_SCAN_MS)
        (void)scan(s, over ? tenant : NULL, &sc); /* not readable now: decide on the estimate */
    if (t->used_bytes + t->admitted + need <= t->quota_bytes) {
        scan_free(&sc);
        t->admitted += need;
        return true;
    }
    /* Over its quota: its own least recently used objects go first (never leased ones, nor
     * during a new leader's grace window, when nothing may be freed). */
    uint64_t overflow = t->used_bytes + t->admitted + need - t->quota_bytes, freed = 0;
    size_t k = 0;
    if (!svc_in_election_grace(s) && sc.n) {
        qsort(sc.c, sc.n, sizeof *sc.c, by_last);
        while (k < sc.n && freed < overflow)
            freed += sc.c[k++].size;
    }
    if (freed >= overflow && k) {
        /* in EvictCmds of at most QUOTA_CMD_KEYS keys: one apply each is bounded (issue 22) */
        for (size_t at = 0; at < k; at += QUOTA_CMD_KEYS)
            submit_evict(s, sc.c + at, k - at < QUOTA_CMD_KEYS ? k - at : QUOTA_CMD_KEYS);
        t->evictions += k;
        t->used_bytes -= freed < t->used_bytes ? freed : t->used_bytes;
        t->admitted += need;
        kvp_log_info(s->actor, "tenant %s over its quota (%llu bytes): evicting %zu of its own objects (%llu bytes)",
                     tenant, (unsigned long long)t->quota_bytes, k, (unsigned long long)freed);
        scan_free(&sc);
        return true;
    }
    scan_free(&sc);
    snprintf(why, sizeof why, "tenant %s over its quota: %llu of %llu bytes used, and its own objects cannot make room",
             tenant, (unsigned long long)(t->used_bytes + t->admitted), (unsigned long long)t->quota_bytes);
refuse:
    t->refusals++;
    svc_reply_status(s, identity, req->req_id, KVP_ERR_NO_SPACE, why);
    return false;
}

void svc_quota_status(struct kvp_master_service *s, json_t *doc)
{
    if (!s->quota || !s->is_leader)
        return;
    struct scan sc;
    if (!scan(s, NULL, &sc))
        return;
    json_t *arr = json_array();
    for (size_t i = 0; i < s->quota->n; i++) {
        const struct quota_tenant *t = &s->quota->t[i];
        json_t *o = json_object();
        json_object_set_new(o, "tenant", json_string(t->name));
        json_object_set_new(o, "used_bytes", json_integer((json_int_t)t->used_bytes));
        json_object_set_new(o, "objects", json_integer((json_int_t)t->objects));
        json_object_set_new(o, "quota_bytes", json_integer((json_int_t)t->quota_bytes));
        json_object_set_new(o, "quota_evictions", json_integer((json_int_t)t->evictions));
        json_object_set_new(o, "quota_refusals", json_integer((json_int_t)t->refusals));
        json_array_append_new(arr, o);
    }
    json_object_set_new(doc, "tenants", arr);
}

void svc_quota_render(struct kvp_master_service *s, struct kvp_metrics_text *t)
{
    uint64_t rk = 0, rh = 0;
    kvp_auth_server_stats(s->auth, &rk, &rh);
    kvp_metrics_family(t, "kvpool_auth_refused_total", "counter",
                       "Control connections refused: by key (unknown or bad) and by handshake (no keys, garbage).");
    const char *l1[] = {"reason", "key", NULL}, *l2[] = {"reason", "handshake", NULL};
    kvp_metrics_sample_u64(t, "kvpool_auth_refused_total", l1, rk);
    kvp_metrics_sample_u64(t, "kvpool_auth_refused_total", l2, rh);
    kvp_metrics_family(t, "kvpool_auth_denied_requests_total", "counter",
                       "Requests refused for the sender's role or tenant (KVP_ERR_DENIED).");
    kvp_metrics_sample_u64(t, "kvpool_auth_denied_requests_total", NULL, s->denied_requests);
    if (!s->quota || !s->is_leader)
        return;
    struct scan sc;
    if (svc_now_ms() - s->quota->status_ms >= STATUS_SCAN_MS)
        (void)scan(s, NULL, &sc);
    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"kvpool_tenant_used_bytes", "gauge", "Bytes of complete objects per tenant (default tenant: \"\")."},
        {"kvpool_tenant_objects", "gauge", "Complete objects per tenant."},
        {"kvpool_tenant_quota_bytes", "gauge", "Quota per tenant (tenant_quota); absent: none."},
        {"kvpool_tenant_quota_evictions_total", "counter", "Objects evicted to keep a tenant within its quota."},
        {"kvpool_tenant_quota_refusals_total", "counter", "PutStarts refused NO_SPACE for a tenant's quota."},
    };
    for (size_t f = 0; f < sizeof fam / sizeof fam[0]; f++) {
        kvp_metrics_family(t, fam[f].name, fam[f].type, fam[f].help);
        for (size_t i = 0; i < s->quota->n; i++) {
            const struct quota_tenant *qt = &s->quota->t[i];
            const char *l[] = {"tenant", qt->name, NULL};
            uint64_t v = f == 0 ? qt->used_bytes : f == 1 ? qt->objects : f == 2 ? qt->quota_bytes
                         : f == 3 ? qt->evictions : qt->refusals;
            if (f == 2 && !qt->quota_bytes)
                continue;
            kvp_metrics_sample_u64(t, fam[f].name, l, v);
        }
    }
}
