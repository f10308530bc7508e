/*
 * bench_fsm_walks.c — the master's event-triggered walks over every object, timed at scale without
 * a cluster (issue 22; docs/bench.md "Master scale", "Session 31: event-triggered walks"). Not a
 * ctest: prints figures, asserts none.
 *
 * Loads N complete objects of 64 B, 1 replica, on S segments (keys spread over T tenants,
 * "tenant<i>" + KVP_AUTH_TENANT_SEP + "k/<n>") through kvp_master_fsm_apply, then times each walk
 * in the thread's own CPU (CLOCK_THREAD_CPUTIME_ID), one hold at a time, as the thread that runs
 * it in a master would:
 *   - evict list, whole: the raft thread's answer to an EvictScanReq that lists (kvp_master_fsm_query_bytes:
 *     build, pack and free), then the service's unpack and kvp_evict_choose (LRU, 5% of the listed bytes);
 *   - evict list in slices (EvictScanReq.cursor/slots): the longest slice and the sum, then the
 *     service's choice over the same candidates;
 *   - tenant candidates: kvp_master_fsm_foreach_object with tenant 0's filter and a copy of its
 *     keys (service_quota.c's scan under the FSM read lock), whole and in slices (the longest);
 *   - repair scan: whole table, and one slice of 131,072 slots (the model);
 *   - a round's EvictCmd of 5% of the objects, in one command and in commands of 8,192 keys;
 *   - SegmentLost of one segment, Unmount of another, RemoveAll (applies, in that order).
 *   bench_fsm_walks [--objects N] [--segments S] [--tenants T] [--slots SLICE]
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "actors/master/fsm/evict_policy.h"
#include "actors/master/fsm/fsm_internal.h"
#include "auth/auth.h"
#include "kvpool.h"
#include "runtime/log.h"

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_fsm_walks: %s: %s\n", what, kvp_strerror(rc));
    exit(1);
}

static Kvp__Response *apply(struct kvp_master_fsm *f, Kvp__Command *c)
{
    Kvp__Response *r = NULL;
    int rc = kvp_master_fsm_apply(f, c, &r);
    if (rc != KVP_OK || !r)
        die("apply", rc);
    return r;
}

/* One query through the byte adapter, as raftlog runs it on the raft thread (decode, answer,
 * encode, free); the packed answer is returned. */
static uint8_t *query(struct kvp_master_fsm *f, const Kvp__Request *req, size_t *len)
{
    size_t n = kvp__request__get_packed_size(req);
    uint8_t *q = malloc(n ? n : 1), *res = NULL;
    if (!q)
        die("malloc", KVP_ERR_NOMEM);
    kvp__request__pack(req, q);
    int rc = kvp_master_fsm_query_bytes(f, q, n, &res, len);
    free(q);
    if (rc != KVP_OK || !res)
        die("query", rc);
    return res;
}

struct cands {
    struct kvp_evict_cand *c;
    size_t n, cap;
};

static void cands_add(struct cands *cs, const char *key, uint64_t size, bool pin)
{
    if (cs->n == cs->cap) {
        cs->cap = cs->cap ? cs->cap * 2 : 1024;
        cs->c = realloc(cs->c, cs->cap * sizeof *cs->c);
        if (!cs->c)
            die("realloc", KVP_ERR_NOMEM);
    }
    struct kvp_evict_cand *x = &cs->c[cs->n++];
    memset(x, 0, sizeof *x);
    x->hash = XXH3_64bits(key, strlen(key)) | 1;
    x->size = size;
    x->pinned = pin;
    x->last_access = x->hash % 1000003; /* stands for the service's last_access map */
}

/* The service's side of an answer: unpack and turn the objects into candidates. */
static void service_take(const uint8_t *res, size_t len, struct cands *cs, uint64_t *next, uint64_t *cap)
{
    Kvp__Response *r = kvp__response__unpack(NULL, len, res);
    if (!r || r->body_case != KVP__RESPONSE__BODY_EVICT_SCAN)
        die("unpack", KVP_ERR_INTERNAL);
    const Kvp__EvictScanResp *b = r->evict_scan;
    for (size_t i = 0; i < b->n_objects; i++)
        cands_add(cs, b->objects[i]->key, b->objects[i]->size, b->objects[i]->soft_pin);
#ifndef BENCH_WALKS_NO_SLICES
    *next = b->next_cursor;
#else
    *next = 0;
#endif
    *cap = b->capacity_bytes;
    kvp__response__free_unpacked(r, NULL);
}

struct tenant_walk {
    const char *prefix;
    size_t len;
    char **keys;
    size_t n, cap;
};

static void tenant_one(void *ctx, const char *key, uint64_t size, bool soft_pin)
{
    (void)size;
    (void)soft_pin;
    struct tenant_walk *t = ctx;
    if (strncmp(key, t->prefix, t->len) != 0 || key[t->len] != KVP_AUTH_TENANT_SEP)
        return;
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 1024;
        t->keys = realloc(t->keys, t->cap * sizeof *t->keys);
        if (!t->keys)
            die("realloc", KVP_ERR_NOMEM);
    }
    t->keys[t->n++] = strdup(key);
}

static void seg_cmd(struct kvp_master_fsm *f, int lost, uint32_t id, uint64_t now, const char *what)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__SegmentLostCmd sl = KVP__SEGMENT_LOST_CMD__INIT;
    Kvp__UnmountSegmentReq um = KVP__UNMOUNT_SEGMENT_REQ__INIT;
    c.now_wall_ms = now;
    if (lost) {
        sl.segment_id = id;
        c.body_case = KVP__COMMAND__BODY_SEGMENT_LOST;
        c.segment_lost = &sl;
    } else {
        um.segment_id = id;
        c.body_case = KVP__COMMAND__BODY_UNMOUNT;
        c.unmount = &um;
    }
    uint64_t before = f->n_objects, t0 = cpu_ns();
    kvp_master_fsm_response_free(apply(f, &c));
    uint64_t dt = cpu_ns() - t0;
    printf("%-34s %10.2f ms  (%llu objects removed)\n", what, dt / 1e6,
           (unsigned long long)(before - f->n_objects));
}

int main(int argc, char **argv)
{
    uint64_t objects = 1000000, slots = 32768;
    unsigned segments = 100, tenants = 4;
    for (int i = 1; i + 1 < argc; i += 2) {
        uint64_t v = strtoull(argv[i + 1], NULL, 0);
        if (!strcmp(argv[i], "--objects"))
            objects = v;
        else if (!strcmp(argv[i], "--segments"))
            segments = (unsigned)v;
        else if (!strcmp(argv[i], "--tenants"))
            tenants = (unsigned)v;
        else if (!strcmp(argv[i], "--slots"))
            slots = v;
        else {
            fprintf(stderr, "bench_fsm_walks: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!segments || !tenants || !slots) {
        fprintf(stderr, "bench_fsm_walks: zero option\n");
        return 2;
    }
    if (!getenv("KVPOOL_LOG_LEVEL"))
        kvp_log_set_level(KVP_LOG_WARN);
    struct kvp_master_fsm_params p = {.fence_grace_ms = 1000, .put_ttl_ms = 600000};
    struct kvp_master_fsm *f = NULL;
    int rc = kvp_master_fsm_new(&f, &p);
    if (rc != KVP_OK)
        die("new", rc);
    uint64_t seg_size = objects * 128 / segments + (1ull << 30), now = 1;
    for (unsigned i = 0; i < segments; i++) {
        char name[32];
        snprintf(name, sizeof name, "walk-seg-%03u", i);
        Kvp__Command c = KVP__COMMAND__INIT;
        Kvp__MountSegmentReq m = KVP__MOUNT_SEGMENT_REQ__INIT;
        m.name = name;
        m.host = "127.0.0.1";
        m.endpoint = "127.0.0.1:7000";
        m.size = seg_size;
        m.owner_pid = 4242;
        c.now_wall_ms = now;
        c.body_case = KVP__COMMAND__BODY_MOUNT;
        c.mount = &m;
        Kvp__Response *r = apply(f, &c);
        if (r->status != KVP_OK)
            die("mount", r->status);
        kvp_master_fsm_response_free(r);
    }
    enum { BATCH = 1024 };
    static Kvp__PutStartItem items[BATCH];
    static Kvp__PutEndItem eitems[BATCH];
    static Kvp__PutStartItem *ip[BATCH];
    static Kvp__PutEndItem *ep[BATCH];
    static char keys[BATCH][48];
    uint64_t t_load = cpu_ns();
    for (uint64_t k = 0; k < objects;) {
        size_t n = objects - k < BATCH ? (size_t)(objects - k) : BATCH;
        for (size_t i = 0; i < n; i++) {
            snprintf(keys[i], sizeof keys[i], "tenant%u%ck/%012llu", (unsigned)((k + i) % tenants),
                     KVP_AUTH_TENANT_SEP, (unsigned long long)(k + i));
            kvp__put_start_item__init(&items[i]);
            items[i].key = keys[i];
            items[i].size = 64;
            items[i].replica_num = 1;
            items[i].op_id = k + i + 1;
            items[i].client_host = "127.0.0.1";
            ip[i] = &items[i];
            kvp__put_end_item__init(&eitems[i]);
            eitems[i].key = keys[i];
            eitems[i].op_id = k + i + 1;
            eitems[i].checksum = k + i;
            ep[i] = &eitems[i];
        }
        now++;
        Kvp__Command c = KVP__COMMAND__INIT;
        Kvp__PutStartReq ps = KVP__PUT_START_REQ__INIT;
        Kvp__PutEndReq pe = KVP__PUT_END_REQ__INIT;
        c.now_wall_ms = now;
        c.term = 2;
        ps.items = ip;
        ps.n_items = n;
        c.body_case = KVP__COMMAND__BODY_PUT_START;
        c.put_start = &ps;
        kvp_master_fsm_response_free(apply(f, &c));
        pe.items = ep;
        pe.n_items = n;
        c.body_case = KVP__COMMAND__BODY_PUT_END;
        c.put_end = &pe;
        kvp_master_fsm_response_free(apply(f, &c));
        k += n;
    }
    printf("bench_fsm_walks: %llu objects on %u segments, %u tenants, table %llu slots; loaded in %.1f s of CPU\n",
           (unsigned long long)f->n_objects, segments, tenants, (unsigned long long)f->tab_cap,
           (cpu_ns() - t_load) / 1e9);
    printf("%-34s %10s\n", "walk (one hold)", "CPU");

    /* Eviction list, whole table in one answer (slots 0: the older request). */
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__EvictScanReq eq = KVP__EVICT_SCAN_REQ__INIT;
    eq.high_watermark = 0; /* list */
    req.body_case = KVP__REQUEST__BODY_EVICT_SCAN;
    req.evict_scan = &eq;
    size_t len = 0;
    uint64_t t0 = cpu_ns();
    uint8_t *res = query(f, &req, &len);
    uint64_t t_raft = cpu_ns() - t0;
    struct cands whole = {0};
    uint64_t next = 0, cap = 0;
    t0 = cpu_ns();
    service_take(res, len, &whole, &next, &cap);
    uint64_t t_take = cpu_ns() - t0;
    free(res);
    size_t *chosen = malloc((whole.n ? whole.n : 1) * sizeof *chosen);
    if (!chosen)
        die("malloc", KVP_ERR_NOMEM);
    struct kvp_evict_summary sum;
    t0 = cpu_ns();
    uint64_t listed_bytes = 0;
    for (size_t i = 0; i < whole.n; i++)
        listed_bytes += whole.c[i].size;
    (void)cap;
    size_t k_whole = kvp_evict_choose(whole.c, whole.n, listed_bytes / 20, KVP_EVICT_LRU, false, chosen, &sum);
    uint64_t t_choose = cpu_ns() - t0;
    printf("%-34s %10.2f ms  (%zu objects, %.1f MB answer)\n", "evict list, whole: raft thread", t_raft / 1e6,
           whole.n, len / 1e6);
    printf("%-34s %10.2f ms\n", "  service: unpack + candidates", t_take / 1e6);
    printf("%-34s %10.2f ms  (%zu chosen)\n", "  service: choose (LRU, 5% of bytes)", t_choose / 1e6, k_whole);

#ifndef BENCH_WALKS_NO_SLICES /* defined to build this driver over a base without EvictScanReq slices */
    /* Eviction list in slices (cursor/slots). */
    struct cands sliced = {0};
    uint64_t t_max = 0, t_sum = 0, take_max = 0, n_slices = 0;
    eq.cursor = 0;
    eq.slots = slots;
    do {
        t0 = cpu_ns();
        res = query(f, &req, &len);
        uint64_t dt = cpu_ns() - t0;
        t_max = dt > t_max ? dt : t_max;
        t_sum += dt;
        t0 = cpu_ns();
        service_take(res, len, &sliced, &next, &cap);
        dt = cpu_ns() - t0;
        take_max = dt > take_max ? dt : take_max;
        free(res);
        eq.cursor = next;
        n_slices++;
    } while (next != 0);
    printf("%-34s %10.2f ms  (%llu slices of %llu slots, %.2f ms in all, %zu objects)\n",
           "evict list, sliced: longest slice", t_max / 1e6, (unsigned long long)n_slices,
           (unsigned long long)slots, t_sum / 1e6, sliced.n);
    printf("%-34s %10.2f ms\n", "  service: longest slice taken", take_max / 1e6);
    free(sliced.c);
#endif
    free(whole.c);
    free(chosen);

    /* An over-quota tenant's candidates (service_quota.c, under the FSM read lock). */
    struct tenant_walk tw = {.prefix = "tenant0", .len = 7};
    t0 = cpu_ns();
    kvp_master_fsm_foreach_object(f, tenant_one, &tw);
    uint64_t t_ten = cpu_ns() - t0;
    printf("%-34s %10.2f ms  (%zu of its objects)\n", "tenant candidates (FSM lock held)", t_ten / 1e6, tw.n);
    for (size_t i = 0; i < tw.n; i++)
        free(tw.keys[i]);
    free(tw.keys);
#ifndef BENCH_WALKS_NO_SLICES
    /* The same in slices (service_quota.c since issue 22: the read lock let go between two). */
    struct tenant_walk ts = {.prefix = "tenant0", .len = 7};
    uint64_t cur = 0, ts_max = 0, ts_sum = 0, ts_n = 0;
    do {
        t0 = cpu_ns();
        cur = kvp_master_fsm_foreach_object_slice(f, cur, slots, tenant_one, &ts, NULL, NULL);
        uint64_t dt = cpu_ns() - t0;
        ts_max = dt > ts_max ? dt : ts_max;
        ts_sum += dt;
        ts_n++;
    } while (cur != 0);
    printf("%-34s %10.2f ms  (%llu slices, %.2f ms in all, %zu of its objects)\n",
           "tenant candidates, sliced: longest", ts_max / 1e6, (unsigned long long)ts_n, ts_sum / 1e6, ts.n);
    for (size_t i = 0; i < ts.n; i++)
        free(ts.keys[i]);
    free(ts.keys);
#endif

    /* The repair scan, whole and one slice (the model). */
    Kvp__RepairScanReq rq = KVP__REPAIR_SCAN_REQ__INIT;
    req.body_case = KVP__REQUEST__BODY_REPAIR_SCAN;
    req.repair_scan = &rq;
    rq.max = 512;
    t0 = cpu_ns();
    free(query(f, &req, &len));
    printf("%-34s %10.2f ms\n", "repair scan, whole table", (cpu_ns() - t0) / 1e6);
    rq.slots = 131072;
    t0 = cpu_ns();
    free(query(f, &req, &len));
    printf("%-34s %10.2f ms\n", "repair scan, one 131,072-slot slice", (cpu_ns() - t0) / 1e6);

    /* A round's EvictCmd: 5% of the objects (eviction_ratio's default) in one command, and the
     * next 5% in commands of 8,192 keys (service_evict.c since issue 22): the longest apply. */
    {
        uint64_t want = f->n_objects / 20;
        char **ek = calloc(want ? want : 1, sizeof *ek);
        if (!ek)
            die("calloc", KVP_ERR_NOMEM);
        for (int part = 0; part < 2; part++) {
            for (uint64_t i = 0; i < want; i++) {
                uint64_t id = (uint64_t)part * want + i;
                if (asprintf(&ek[i], "tenant%u%ck/%012llu", (unsigned)(id % tenants), KVP_AUTH_TENANT_SEP,
                             (unsigned long long)id) < 0)
                    die("asprintf", KVP_ERR_NOMEM);
            }
            uint64_t per = part == 0 ? (want ? want : 1) : 8192, longest = 0, n_cmds = 0;
            for (uint64_t at = 0; at < want; at += per) {
                Kvp__Command c = KVP__COMMAND__INIT;
                Kvp__EvictCmd ev = KVP__EVICT_CMD__INIT;
                ev.keys = ek + at;
                ev.n_keys = want - at < per ? want - at : per;
                c.now_wall_ms = now;
                c.body_case = KVP__COMMAND__BODY_EVICT;
                c.evict = &ev;
                t0 = cpu_ns();
                kvp_master_fsm_response_free(apply(f, &c));
                uint64_t dt = cpu_ns() - t0;
                longest = dt > longest ? dt : longest;
                n_cmds++;
            }
            printf("%-34s %10.2f ms  (%llu keys in %llu command(s))\n",
                   part == 0 ? "Evict, one command (apply)" : "Evict, commands of 8,192 keys: longest",
                   longest / 1e6, (unsigned long long)want, (unsigned long long)n_cmds);
            for (uint64_t i = 0; i < want; i++)
                free(ek[i]);
        }
        free(ek);
    }

    /* Applies that walk: a segment lost, a segment unmounted, RemoveAll. */
    now++;
    seg_cmd(f, 1, 1, now, "SegmentLost (apply)");
    seg_cmd(f, 0, 2, now, "Unmount (apply)");
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__RemoveAllReq ra = KVP__REMOVE_ALL_REQ__INIT;
    c.now_wall_ms = now;
    c.body_case = KVP__COMMAND__BODY_REMOVE_ALL;
    c.remove_all = &ra;
    uint64_t before = f->n_objects;
    t0 = cpu_ns();
    kvp_master_fsm_response_free(apply(f, &c));
    printf("%-34s %10.2f ms  (%llu objects removed)\n", "RemoveAll (apply)", (cpu_ns() - t0) / 1e6,
           (unsigned long long)(before - f->n_objects));
    kvp_master_fsm_destroy(&f);
    return 0;
}
