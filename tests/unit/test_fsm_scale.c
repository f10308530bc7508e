/*
 * test_fsm_scale.c — the master's bounded walks (issue 22) give the full walk's answers.
 *
 * - RepairScan in slices of the table (cursor + slots, as the leader's repair driver asks at
 *   10M objects) over one pass reports the same needs and, summed, the same counters as one
 *   walk of the whole table: every under-replicated object is found within a pass. Seeded,
 *   random state (short copies, draining and lost segments, pending puts and repair replicas)
 *   and random slice sizes.
 * - The eviction list (EvictScanReq) in slices lists the same objects as one whole-table answer,
 *   each slice within its slots.
 * - Per-tenant use kept on apply (kvp_master_fsm_tenants) equals a recount over every object
 *   after random puts, ends, removes, evictions, segment losses, expiry and a restore.
 * - The object table grows in steps (a successor built a few slots per insert) while an
 *   incremental snapshot runs and objects are removed: invariants hold mid-growth
 *   (kvp_master_fsm_check compares the two tables), every key is found, and the snapshot
 *   restores to the state at its begin.
 * - A snapshot step is bounded after a growth restarts its walk (slots visited per step) and
 *   after one command touched every object (the early-written objects go out a chunk at a time).
 * KVP_FSM_SCALE_SEED overrides the seed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "actors/master/fsm/fsm_internal.h"
#include "test_fsm_helpers.h"

#define MB (1024ull * 1024ull)
#define NKEYS 3000

static uint64_t rs = 0x2545f4914f6cdd1dull;
static uint64_t rn(uint64_t n)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs % n;
}

static void seed(void)
{
    const char *e = getenv("KVP_FSM_SCALE_SEED");
    if (e && *e)
        rs = strtoull(e, NULL, 0) | 1u;
    print_message("seed %#llx\n", (unsigned long long)rs);
}

static void key_name(int i, char *buf, size_t n)
{
    /* four tenants and the default one ("" : no separator) */
    if (i % 5)
        snprintf(buf, n, "tenant-%d\x1fmodel/block-%06d", i % 5, i);
    else
        snprintf(buf, n, "model/block-%06d", i);
}

/* A random state with repair work of every kind: 6 segments, objects wanting 1..4 copies,
 * some pending, then one segment draining and one lost. */
static struct kvp_master_fsm *random_state(uint64_t *now)
{
    struct kvp_master_fsm *f = tf_new(1000, 600000);
    uint32_t ids[6];
    for (int i = 0; i < 6; i++) {
        char name[16], host[16];
        snprintf(name, sizeof name, "s%d", i);
        snprintf(host, sizeof host, "h%d", i);
        assert_int_equal(tf_mount(f, name, host, 64 * MB, 1, &ids[i]), KVP_OK);
    }
    *now = 10;
    char k[64];
    for (int i = 0; i < NKEYS; i++) {
        key_name(i, k, sizeof k);
        uint32_t want = 1 + (uint32_t)rn(4);
        if (tf_put_start(f, k, 64 + rn(4000), want, (uint64_t)i + 1, *now) != KVP_OK)
            continue;
        if (rn(10) != 0)
            assert_int_equal(tf_put_end(f, k, (uint64_t)i + 1, 7, *now), KVP_OK);
    }
    assert_int_equal(tf_drain(f, ids[1], NULL, ++*now), KVP_OK);
    assert_int_equal(tf_seg_lost(f, ids[4], ++*now), KVP_OK);
    for (int i = 0; i < NKEYS / 10; i++) {
        key_name((int)rn(NKEYS), k, sizeof k);
        (void)tf_remove(f, k, rn(2) == 0, ++*now);
    }
    /* Copies started for some of the objects a scan says need one: half of them finished (the
     * draining original is then droppable), half left PENDING (a repair replica in flight). */
    Kvp__Request q = KVP__REQUEST__INIT;
    Kvp__RepairScanReq rq = KVP__REPAIR_SCAN_REQ__INIT;
    rq.max = 200;
    q.body_case = KVP__REQUEST__BODY_REPAIR_SCAN;
    q.repair_scan = &rq;
    Kvp__Response *sr = tf_query(f, &q);
    for (size_t i = 0; i < sr->repair_scan->n_needs; i++) {
        const Kvp__RepairNeed *n = sr->repair_scan->needs[i];
        if (n->kind != 0)
            continue;
        Kvp__Command c = KVP__COMMAND__INIT;
        Kvp__RepairStartCmd st = KVP__REPAIR_START_CMD__INIT;
        Kvp__RepairItem it = KVP__REPAIR_ITEM__INIT, *its[1] = {&it};
        it.key = n->key;
        it.src_segment_id = n->src_segment_id;
        st.n_items = 1;
        st.items = its;
        c.now_wall_ms = ++*now;
        c.body_case = KVP__COMMAND__BODY_REPAIR_START;
        c.repair_start = &st;
        Kvp__Response *r = tf_apply(f, &c);
        if (r->body_case == KVP__RESPONSE__BODY_REPAIR_START && r->repair_start->n_results == 1 &&
            r->repair_start->results[0]->status == KVP_OK && i % 2 == 0) {
            Kvp__Command e = KVP__COMMAND__INIT;
            Kvp__RepairEndCmd ec = KVP__REPAIR_END_CMD__INIT;
            Kvp__RepairEndItem ei = KVP__REPAIR_END_ITEM__INIT, *eis[1] = {&ei};
            ei.key = n->key;
            ei.segment_id = r->repair_start->results[0]->target->segment_id;
            ei.offset = r->repair_start->results[0]->target->offset;
            ei.ok = true;
            ec.n_items = 1;
            ec.items = eis;
            e.now_wall_ms = ++*now;
            e.body_case = KVP__COMMAND__BODY_REPAIR_END;
            e.repair_end = &ec;
            kvp_master_fsm_response_free(tf_apply(f, &e));
        }
        kvp_master_fsm_response_free(r);
    }
    kvp_master_fsm_response_free(sr);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    return f;
}

static Kvp__Response *scan(const struct kvp_master_fsm *f, uint64_t cursor, uint64_t slots)
{
    Kvp__Request q = KVP__REQUEST__INIT;
    Kvp__RepairScanReq rq = KVP__REPAIR_SCAN_REQ__INIT;
    rq.max = 4096;
    rq.cursor = cursor;
    rq.slots = slots;
    q.body_case = KVP__REQUEST__BODY_REPAIR_SCAN;
    q.repair_scan = &rq;
    Kvp__Response *r = tf_query(f, &q);
    assert_int_equal(r->body_case, KVP__RESPONSE__BODY_REPAIR_SCAN);
    return r;
}

/* One line per need, sorted, for comparing lists whatever their order. */
static size_t needs_lines(const Kvp__RepairScanResp *b, char (*out)[160], size_t at)
{
    for (size_t i = 0; i < b->n_needs; i++) {
        const Kvp__RepairNeed *n = b->needs[i];
        snprintf(out[at++], 160, "%s|%llu|%u|%u|%u|%llu", n->key, (unsigned long long)n->size, n->src_segment_id,
                 n->drop_segment_id, n->kind, (unsigned long long)n->offset);
    }
    return at;
}

static int cmp_line(const void *a, const void *b)
{
    return strcmp(a, b);
}

static void test_repair_scan_slices_equal_one_walk(void **state)
{
    (void)state;
    uint64_t now;
    struct kvp_master_fsm *f = random_state(&now);
    Kvp__Response *all = scan(f, 0, 0);
    const Kvp__RepairScanResp *a = all->repair_scan;
    assert_int_equal(a->next_cursor, 0);
    assert_true(a->table_slots >= NKEYS);
    /* the state has work of each kind, so the comparison below means something */
    assert_true(a->under_replicated > 0);
    assert_true(a->draining_objects > 0);
    assert_true(a->n_needs > 0 && a->n_needs < 4096);
    char(*want)[160] = calloc(4096, 160), (*got)[160] = calloc(4096 * 2, 160);
    assert_non_null(want);
    assert_non_null(got);
    size_t nw = needs_lines(a, want, 0);
    qsort(want, nw, 160, cmp_line);
    bool kinds[3] = {false, false, false};
    for (size_t i = 0; i < a->n_needs; i++)
        if (a->needs[i]->kind < 3)
            kinds[a->needs[i]->kind] = true;
    assert_true(kinds[0] && kinds[1] && kinds[2]);
    for (int round = 0; round < 8; round++) {
        uint64_t slots = round == 0 ? 1 : round == 1 ? a->table_slots - 1 : 1 + rn(a->table_slots / 3);
        Kvp__RepairScanResp sum = KVP__REPAIR_SCAN_RESP__INIT;
        size_t ng = 0, slices = 0;
        uint64_t cursor = 0;
        do {
            Kvp__Response *r = scan(f, cursor, slots);
            const Kvp__RepairScanResp *b = r->repair_scan;
            assert_int_equal(b->table_slots, a->table_slots);
            assert_true(b->next_cursor == 0 || b->next_cursor == cursor + slots);
            sum.draining_objects += b->draining_objects;
            sum.draining_bytes += b->draining_bytes;
            sum.under_replicated += b->under_replicated;
            sum.in_flight += b->in_flight;
            sum.no_space += b->no_space;
            sum.lost_if_drained += b->lost_if_drained;
            ng = needs_lines(b, got, ng);
            cursor = b->next_cursor;
            slices++;
            kvp_master_fsm_response_free(r);
        } while (cursor != 0);
        assert_int_equal(slices, (a->table_slots + slots - 1) / slots);
        assert_int_equal(sum.draining_objects, a->draining_objects);
        assert_int_equal(sum.draining_bytes, a->draining_bytes);
        assert_int_equal(sum.under_replicated, a->under_replicated);
        assert_int_equal(sum.in_flight, a->in_flight);
        assert_int_equal(sum.no_space, a->no_space);
        assert_int_equal(sum.lost_if_drained, a->lost_if_drained);
        assert_int_equal(ng, nw);
        qsort(got, ng, 160, cmp_line);
        for (size_t i = 0; i < nw; i++)
            assert_string_equal(got[i], want[i]);
    }
    /* a cursor past the table (it shrank under a restore) starts at 0 */
    Kvp__Response *r = scan(f, a->table_slots + 5, a->table_slots);
    assert_int_equal(r->repair_scan->n_needs, a->n_needs);
    assert_int_equal(r->repair_scan->next_cursor, 0);
    kvp_master_fsm_response_free(r);
    free(want);
    free(got);
    kvp_master_fsm_response_free(all);
    kvp_master_fsm_destroy(&f);
}

/* The eviction list (EvictScanReq) in slices of the table (cursor + slots, as the leader's
 * eviction pass asks at 10M objects) lists, over one pass, exactly the objects one whole-table
 * answer lists (key, size, pin), each slice visiting at most `slots` table slots. */
static Kvp__Response *evict_scan(const struct kvp_master_fsm *f, double high, uint64_t cursor, uint64_t slots)
{
    Kvp__Request q = KVP__REQUEST__INIT;
    Kvp__EvictScanReq eq = KVP__EVICT_SCAN_REQ__INIT;
    eq.high_watermark = high;
    eq.cursor = cursor;
    eq.slots = slots;
    q.body_case = KVP__REQUEST__BODY_EVICT_SCAN;
    q.evict_scan = &eq;
    Kvp__Response *r = tf_query(f, &q);
    assert_int_equal(r->body_case, KVP__RESPONSE__BODY_EVICT_SCAN);
    return r;
}

static size_t cand_lines(const Kvp__EvictScanResp *b, char (*out)[160], size_t at)
{
    for (size_t i = 0; i < b->n_objects; i++)
        snprintf(out[at++], 160, "%s|%llu|%d", b->objects[i]->key, (unsigned long long)b->objects[i]->size,
                 b->objects[i]->soft_pin);
    return at;
}

static void test_evict_list_slices_equal_one_walk(void **state)
{
    (void)state;
    uint64_t now;
    struct kvp_master_fsm *f = random_state(&now);
    /* some soft-pinned objects, so the pin flag is compared too */
    for (int i = 0; i < 200; i++) {
        char k[64];
        snprintf(k, sizeof k, "pinned/%d", i);
        struct tf_put p = {.key = k, .size = 64 + rn(500), .replica_num = 1, .op_id = 100000 + (uint64_t)i,
                           .soft_pin = true};
        int st;
        kvp_master_fsm_response_free(tf_put_start_r(f, &p, ++now, 0, &st));
        if (st == KVP_OK)
            assert_int_equal(tf_put_end(f, k, p.op_id, 7, now), KVP_OK);
    }
    Kvp__Response *all = evict_scan(f, 0, 0, 0);
    const Kvp__EvictScanResp *a = all->evict_scan;
    assert_true(a->listed);
    assert_int_equal(a->next_cursor, 0);
    assert_int_equal(a->table_slots, f->tab_cap);
    assert_true(a->n_objects > NKEYS / 2 && a->n_objects < NKEYS);
    assert_int_equal(a->n_objects, f->n_objects - f->n_pending);
    char(*want)[160] = calloc(NKEYS, 160), (*got)[160] = calloc(NKEYS, 160);
    assert_non_null(want);
    assert_non_null(got);
    size_t nw = cand_lines(a, want, 0), pins = 0;
    for (size_t i = 0; i < a->n_objects; i++)
        pins += a->objects[i]->soft_pin;
    assert_true(pins > 0 && pins < nw);
    qsort(want, nw, 160, cmp_line);
    for (int round = 0; round < 10; round++) {
        uint64_t slots = round == 0 ? 1 : round == 1 ? a->table_slots - 1 : 1 + rn(a->table_slots / 3);
        size_t ng = 0, slices = 0;
        uint64_t cursor = 0;
        do {
            Kvp__Response *r = evict_scan(f, 0, cursor, slots);
            const Kvp__EvictScanResp *b = r->evict_scan;
            assert_true(b->listed);
            assert_int_equal(b->table_slots, a->table_slots);
            assert_int_equal(b->used_bytes, a->used_bytes);
            /* the bound: a slice visits [cursor, cursor + slots) and no more */
            assert_true(b->next_cursor == 0 || b->next_cursor == cursor + slots);
            assert_true(b->n_objects <= slots);
            uint64_t end = b->next_cursor ? b->next_cursor : b->table_slots;
            for (size_t i = 0; i < b->n_objects; i++) {
                const struct kvp_fsm_obj *o =
                    kvp_fsm_obj_find(f, b->objects[i]->key, strlen(b->objects[i]->key));
                assert_non_null(o);
                uint64_t slot = 0;
                while (f->tab[slot] != o)
                    slot++;
                assert_true(slot >= cursor && slot < end);
            }
            assert_true(ng + b->n_objects <= NKEYS);
            ng = cand_lines(b, got, ng);
            cursor = b->next_cursor;
            slices++;
            kvp_master_fsm_response_free(r);
        } while (cursor != 0);
        assert_int_equal(slices, (a->table_slots + slots - 1) / slots);
        assert_int_equal(ng, nw);
        qsort(got, ng, 160, cmp_line);
        for (size_t i = 0; i < nw; i++)
            assert_string_equal(got[i], want[i]);
    }
    /* below the watermark and nothing needed: usage only, whatever the slice */
    Kvp__Response *r = evict_scan(f, 2.0, 0, 64);
    assert_false(r->evict_scan->listed);
    assert_int_equal(r->evict_scan->n_objects, 0);
    kvp_master_fsm_response_free(r);
    /* a cursor past the table (it shrank under a restore) starts at 0 */
    r = evict_scan(f, 0, a->table_slots + 5, a->table_slots);
    assert_int_equal(r->evict_scan->n_objects, a->n_objects);
    assert_int_equal(r->evict_scan->next_cursor, 0);
    kvp_master_fsm_response_free(r);
    free(want);
    free(got);
    kvp_master_fsm_response_free(all);
    kvp_master_fsm_destroy(&f);
}

/* RepairScanResp.table_moves counts objects a removal's backward shift moved between slots
 * (one of them may cross a slice's cursor, repair_pass.h): a removal with a displaced object
 * after it moves the count, one with an empty slot after it does not, a restore does. */
static uint64_t moves_now(const struct kvp_master_fsm *f)
{
    Kvp__Response *r = scan(f, 0, 1);
    uint64_t m = r->repair_scan->table_moves;
    kvp_master_fsm_response_free(r);
    return m;
}

static void test_repair_scan_table_moves(void **state)
{
    (void)state;
    uint64_t now = 0;
    struct kvp_master_fsm *f = random_state(&now);
    uint64_t mask = f->tab_cap - 1;
    int shifted = -1, alone = -1; /* slots whose removal shifts / cannot shift another object */
    for (uint64_t i = 0; i + 1 < f->tab_cap && (shifted < 0 || alone < 0); i++) {
        const struct kvp_fsm_obj *o = f->tab[i], *n = f->tab[i + 1];
        if (!o || o->state != KVP_FSM_OBJ_COMPLETE)
            continue;
        if (n && (n->hash & mask) != i + 1 && shifted < 0)
            shifted = (int)i;
        else if (!n && alone < 0)
            alone = (int)i;
    }
    assert_true(shifted >= 0 && alone >= 0);
    char k[256];
    snprintf(k, sizeof k, "%s", kvp_fsm_obj_key(f->tab[alone]));
    uint64_t m0 = moves_now(f);
    assert_int_equal(tf_remove(f, k, true, now), KVP_OK);
    assert_int_equal(moves_now(f), m0);
    snprintf(k, sizeof k, "%s", kvp_fsm_obj_key(f->tab[shifted]));
    assert_int_equal(tf_remove(f, k, true, now), KVP_OK);
    assert_true(moves_now(f) > m0);
    size_t n = 0;
    uint8_t *b = tf_snapshot(f, &n);
    struct kvp_master_fsm *g = tf_new(100, 600000);
    uint64_t g0 = moves_now(g);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_OK);
    assert_true(moves_now(g) != g0);
    free(b);
    kvp_master_fsm_destroy(&g);
    kvp_master_fsm_destroy(&f);
}

/* A tenant whose count was lost for want of memory (its +1 dropped) and whose object then
 * leaves stays at 0, flagged lost, rather than wrapping to ~2^64 bytes (which the quota would
 * read as far over its limit). */
static void max_one(void *ctx, const char *tenant, uint64_t used_bytes, uint64_t objects)
{
    (void)tenant;
    uint64_t *m = ctx;
    if (used_bytes > m[0])
        m[0] = used_bytes;
    if (objects > m[1])
        m[1] = objects;
}

static void test_tenant_count_lost_stays_at_zero(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(100, 600000);
    uint32_t id;
    assert_int_equal(tf_mount(f, "a", "h1", 64 * MB, 1, &id), KVP_OK);
    assert_int_equal(tf_put(f, "t1\x1fk", 100, 1, 1, 10), KVP_OK);
    const struct kvp_fsm_obj *o = NULL;
    for (uint64_t i = 0; i < f->tab_cap && !o; i++)
        o = f->tab[i];
    assert_non_null(o);
    kvp_fsm_tenant_count(f, o, -1); /* as if its +1 had been lost: the tenant at 0 */
    uint64_t m[2] = {0, 0};
    assert_int_equal(kvp_master_fsm_tenants(f, max_one, m), KVP_OK);
    assert_int_equal(m[1], 0);
    assert_int_equal(tf_remove(f, "t1\x1fk", false, 20), KVP_OK); /* its -1 */
    assert_int_equal(kvp_master_fsm_tenants(f, max_one, m), KVP_ERR_NOMEM);
    assert_int_equal(m[0], 0);
    assert_int_equal(m[1], 0);
    kvp_master_fsm_destroy(&f);
}

/* tenant -> (bytes, objects) recounted over every complete object */
struct recount {
    char name[8][64];
    uint64_t bytes[8], objects[8];
    int n;
};

static void recount_one(void *ctx, const char *key, uint64_t size, bool soft_pin)
{
    (void)soft_pin;
    struct recount *rc = ctx;
    const char *sep = strchr(key, '\x1f');
    char t[64] = "";
    if (sep)
        snprintf(t, sizeof t, "%.*s", (int)(sep - key), key);
    int i = 0;
    while (i < rc->n && strcmp(rc->name[i], t) != 0)
        i++;
    assert_true(i < 8);
    if (i == rc->n)
        snprintf(rc->name[rc->n++], 64, "%s", t);
    rc->bytes[i] += (size + 63) & ~63ull;
    rc->objects[i]++;
}

struct kept {
    struct recount *want;
    int seen;
};

static void kept_one(void *ctx, const char *tenant, uint64_t used_bytes, uint64_t objects)
{
    struct kept *k = ctx;
    int i = 0;
    while (i < k->want->n && strcmp(k->want->name[i], tenant) != 0)
        i++;
    if (i == k->want->n) { /* listed once seen, at 0 when all its objects are gone */
        assert_int_equal(used_bytes, 0);
        assert_int_equal(objects, 0);
        return;
    }
    assert_int_equal(used_bytes, k->want->bytes[i]);
    assert_int_equal(objects, k->want->objects[i]);
    k->seen++;
}

static void assert_tenants_equal_recount(const struct kvp_master_fsm *f)
{
    struct recount rc;
    memset(&rc, 0, sizeof rc);
    kvp_master_fsm_foreach_object(f, recount_one, &rc);
    struct kept k = {.want = &rc};
    assert_int_equal(kvp_master_fsm_tenants(f, kept_one, &k), KVP_OK);
    assert_int_equal(k.seen, rc.n);
}

static void test_tenant_use_kept_on_apply_equals_recount(void **state)
{
    (void)state;
    uint64_t now;
    struct kvp_master_fsm *f = random_state(&now);
    assert_tenants_equal_recount(f);
    char k[64];
    uint64_t op = 100000;
    for (int step = 0; step < 20000; step++) {
        int i = (int)rn(NKEYS);
        key_name(i, k, sizeof k);
        switch (rn(8)) {
        case 0:
        case 1:
        case 2:
            if (tf_put_start(f, k, 1 + rn(5000), 1 + (uint32_t)rn(2), ++op, now) == KVP_OK && rn(4))
                (void)tf_put_end(f, k, op, 7, now);
            break;
        case 3:
            (void)tf_put_end(f, k, op, 7, now);
            break;
        case 4:
        case 5:
            (void)tf_remove(f, k, rn(2) == 0, now);
            break;
        case 6:
            now += 1000 + rn(700000); /* pending puts expire */
            (void)tf_revoke_expired(f, now);
            break;
        default:
            if (rn(200) == 0) { /* a segment lost now and then: objects on it alone go */
                uint32_t id;
                char name[16];
                snprintf(name, sizeof name, "x%d", step);
                assert_int_equal(tf_mount(f, name, "hx", 64 * MB, now, &id), KVP_OK);
                for (int j = 0; j < 40; j++) {
                    key_name((int)rn(NKEYS), k, sizeof k);
                    if (tf_put_start(f, k, 100, 1, ++op, now) == KVP_OK)
                        (void)tf_put_end(f, k, op, 7, now);
                }
                assert_int_equal(tf_seg_lost(f, id, ++now), KVP_OK);
            }
            break;
        }
        if (step % 2000 == 0) {
            assert_tenants_equal_recount(f);
            assert_int_equal(kvp_master_fsm_check(f), 0);
        }
    }
    assert_tenants_equal_recount(f);
    /* a restore rebuilds the counts from the objects */
    size_t len = 0;
    uint8_t *snap = tf_snapshot(f, &len);
    struct kvp_master_fsm *g = tf_new(1000, 600000);
    assert_int_equal(kvp_master_fsm_restore(g, snap, len), KVP_OK);
    assert_tenants_equal_recount(g);
    assert_int_equal(kvp_master_fsm_check(g), 0);
    free(snap);
    kvp_master_fsm_destroy(&g);
    kvp_master_fsm_destroy(&f);
}

static void test_table_grows_in_steps_under_snapshot(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(100, 600000);
    uint32_t id;
    assert_int_equal(tf_mount(f, "a", "h1", 1ull << 30, 1, &id), KVP_OK);
    assert_int_equal(tf_mount(f, "b", "h2", 1ull << 30, 1, &id), KVP_OK);
    enum { BASE = 38000, MORE = 12000 };
    static bool live[BASE + MORE];
    char k[64];
    for (int i = 0; i < BASE; i++) {
        snprintf(k, sizeof k, "g/%06d", i);
        assert_int_equal(tf_put(f, k, 64, 1, 1 + (uint64_t)i, 10), KVP_OK);
        live[i] = true;
    }
    assert_int_equal(f->tab_cap, 65536); /* load below 5/8: no growth yet */
    assert_null(f->ntab);
    size_t n = 0;
    uint8_t *b = tf_snapshot(f, &n);
    struct kvp_master_fsm *ref = tf_new(100, 600000);
    assert_int_equal(kvp_master_fsm_restore(ref, b, n), KVP_OK);
    free(b);
    uint64_t d0 = kvp_master_fsm_digest(ref);
    assert_int_equal(kvp_master_fsm_snap_begin(f), KVP_OK);
    uint8_t *all = NULL;
    size_t len = 0;
    bool last = false;
    int added = BASE, checks = 0, steps_seen = 0;
    uint64_t cap0 = f->tab_cap;
    while (!last || added < BASE + MORE) {
        if (!last) {
            uint8_t *c = NULL;
            size_t l = 0;
            assert_int_equal(kvp_master_fsm_snap_next(f, 4096, &c, &l, &last), KVP_OK);
            all = realloc(all, len + l);
            memcpy(all + len, c, l);
            len += l;
            free(c);
        }
        for (int j = 0; j < 100 && added < BASE + MORE; j++, added++) {
            snprintf(k, sizeof k, "g/%06d", added);
            assert_int_equal(tf_put(f, k, 64, 1, 1 + (uint64_t)added, 20), KVP_OK);
            live[added] = true;
            int r = (int)rn((uint64_t)added);
            if (live[r] && rn(4) == 0) {
                snprintf(k, sizeof k, "g/%06d", r);
                assert_int_equal(tf_remove(f, k, false, 20), KVP_OK);
                live[r] = false;
            }
        }
        if (f->ntab && f->ncursor >= 4 && f->ncursor < f->tab_cap) {
            /* removals just behind the copy's cursor, with the cursor's slot taken: the
             * backward shift may move an object not yet copied to behind the cursor */
            for (uint64_t i = f->ncursor - 3; i < f->ncursor; i++) {
                const struct kvp_fsm_obj *o = f->tab[i];
                if (!o || !f->tab[f->ncursor])
                    continue;
                int r = atoi(kvp_fsm_obj_key(o) + 2);
                snprintf(k, sizeof k, "g/%06d", r);
                assert_int_equal(tf_remove(f, k, false, 20), KVP_OK);
                live[r] = false;
            }
        }
        if (f->ntab) {
            steps_seen++;
            if (checks++ < 4) {
                assert_int_equal(kvp_master_fsm_check(f), 0);
                /* a member restored from a snapshot taken mid-growth has the same digest (the
                 * snapshot names the size being grown to, not how far the copy got) */
                size_t mn = 0;
                uint8_t *mb = tf_snapshot(f, &mn);
                struct kvp_master_fsm *g = tf_new(100, 600000);
                assert_int_equal(kvp_master_fsm_restore(g, mb, mn), KVP_OK);
                assert_true(kvp_master_fsm_digest(g) == kvp_master_fsm_digest(f));
                /* ... and keeps it under the same inserts, whichever of the two swaps first */
                for (int j = 0; checks == 2 && j < 1200 && (f->ntab || g->ntab); j++) {
                    snprintf(k, sizeof k, "m/%d/%06d", checks, j);
                    assert_int_equal(tf_put(f, k, 64, 1, 900000 + (uint64_t)j, 20), KVP_OK);
                    assert_int_equal(tf_put(g, k, 64, 1, 900000 + (uint64_t)j, 20), KVP_OK);
                    if (j % 20 == 0)
                        assert_true(kvp_master_fsm_digest(g) == kvp_master_fsm_digest(f));
                }
                assert_true(kvp_master_fsm_digest(g) == kvp_master_fsm_digest(f));
                free(mb);
                kvp_master_fsm_destroy(&g);
            }
        }
    }
    assert_true(steps_seen >= 2);      /* the growth spanned several batches of inserts */
    assert_int_equal(f->tab_cap, 2 * cap0);
    assert_null(f->ntab);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    for (int i = 0; i < BASE + MORE; i++) {
        snprintf(k, sizeof k, "g/%06d", i);
        assert_int_equal(tf_exists(f, k), live[i] ? 1 : 0);
    }
    struct kvp_master_fsm *got = tf_new(100, 600000);
    assert_int_equal(kvp_master_fsm_restore(got, all, len), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(got), 0);
    assert_true(kvp_master_fsm_digest(got) == d0);
    free(all);
    kvp_master_fsm_destroy(&got);
    kvp_master_fsm_destroy(&ref);
    kvp_master_fsm_destroy(&f);
}


/* Digest of the state as it is now (through a full snapshot and a restore). */
static uint64_t digest_now(const struct kvp_master_fsm *f)
{
    size_t n = 0;
    uint8_t *b = tf_snapshot(f, &n);
    struct kvp_master_fsm *g = tf_new(100, 600000);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_OK);
    uint64_t d = kvp_master_fsm_digest(g);
    free(b);
    kvp_master_fsm_destroy(&g);
    return d;
}

/* One step of the running snapshot, appended to *all; returns the chunk's length. */
static size_t snap_step(struct kvp_master_fsm *f, size_t max, uint8_t **all, size_t *len, bool *last)
{
    uint8_t *c = NULL;
    size_t l = 0;
    assert_int_equal(kvp_master_fsm_snap_next(f, max, &c, &l, last), KVP_OK);
    *all = realloc(*all, *len + l + 1);
    memcpy(*all + *len, c, l);
    *len += l;
    free(c);
    return l;
}

static void assert_restores_to(const uint8_t *all, size_t len, uint64_t digest)
{
    struct kvp_master_fsm *got = tf_new(100, 600000);
    assert_int_equal(kvp_master_fsm_restore(got, all, len), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(got), 0);
    assert_true(kvp_master_fsm_digest(got) == digest);
    kvp_master_fsm_destroy(&got);
}

/* During a growth in steps an insert writes the new table only where the copy has been
 * (session 31): an object whose live slot is ahead of the copy's cursor is left for the copy.
 * Before, every insert also wrote a random slot of the new table, faulting its pages in at
 * random (~4,500-5,500 page faults in each of the first entries of the 8M -> 16M growth, 20-27
 * ms of CPU). With inserts only, the new table holds exactly the live objects behind the cursor
 * after every insert; lookups, the check and the final table are as before. */
static void test_growth_inserts_write_only_copied_part(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(100, 600000);
    uint32_t id;
    assert_int_equal(tf_mount(f, "a", "h1", 1ull << 30, 1, &id), KVP_OK);
    char k[64];
    int i = 0;
    for (; !f->ntab; i++) {
        snprintf(k, sizeof k, "w/%06d", i);
        assert_int_equal(tf_put(f, k, 64, 1, 1 + (uint64_t)i, 10), KVP_OK);
    }
    assert_int_equal(f->ncap, 131072); /* began at 5/8 of 65,536 slots */
    uint64_t cap0 = f->tab_cap, ahead_inserts = 0, checks = 0;
    while (f->ntab) {
        snprintf(k, sizeof k, "w/%06d", i);
        assert_int_equal(tf_put(f, k, 64, 1, 1 + (uint64_t)i, 10), KVP_OK);
        i++;
        if (!f->ntab)
            break;
        uint64_t behind = 0, in_new = 0;
        for (uint64_t j = 0; j < f->ncursor; j++)
            behind += f->tab[j] != NULL;
        for (uint64_t j = 0; j < f->ncap; j++)
            in_new += f->ntab[j] != NULL;
        assert_int_equal(in_new, behind);
        /* the object just inserted: in the new table iff its slot is behind the cursor */
        const struct kvp_fsm_obj *o = kvp_fsm_obj_find(f, k, strlen(k));
        assert_non_null(o);
        uint64_t slot = o->hash & (f->tab_cap - 1);
        while (f->tab[slot] != o)
            slot = (slot + 1) & (f->tab_cap - 1);
        bool moved = KVP_FSM_OBJ_MOVED(o) == f->grow_gen;
        assert_true(moved == (slot < f->ncursor));
        ahead_inserts += !moved;
        if (checks++ % 64 == 0)
            assert_int_equal(kvp_master_fsm_check(f), 0);
    }
    assert_true(ahead_inserts > 0); /* some were left to the copy */
    assert_int_equal(f->tab_cap, 2 * cap0);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    for (int j = 0; j < i; j++) {
        snprintf(k, sizeof k, "w/%06d", j);
        assert_int_equal(tf_exists(f, k), 1);
    }
    kvp_master_fsm_destroy(&f);
}

/* A table growth while a snapshot runs restarts its walk at slot 0, over objects already written
 * (skipped, nothing emitted for them). A step visits at most max_bytes / 4 slots (at least
 * 1,024), so the step after the swap stops after 1,024 slots with a short chunk instead of
 * walking the written objects until its chunk is full (at 3M objects one such step took 25 ms of
 * CPU). The chunks still make the snapshot of the state at begin. */
static void test_snapshot_step_bounded_after_growth(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(100, 600000);
    uint32_t id;
    assert_int_equal(tf_mount(f, "a", "h1", 1ull << 30, 1, &id), KVP_OK);
    enum { BASE = 40000, MORE = 2000, MAX = 4096 };
    char k[64];
    for (int i = 0; i < BASE; i++) {
        snprintf(k, sizeof k, "b/%06d", i);
        assert_int_equal(tf_put(f, k, 64, 1, 1 + (uint64_t)i, 10), KVP_OK);
    }
    assert_int_equal(f->tab_cap, 65536);
    uint64_t d0 = digest_now(f);
    assert_int_equal(kvp_master_fsm_snap_begin(f), KVP_OK);
    uint8_t *all = NULL;
    size_t len = 0;
    bool last = false;
    while (kvp_fsm_snap_cursor(f) < 60000) { /* most of the old table written */
        uint64_t c0 = kvp_fsm_snap_cursor(f);
        assert_true(snap_step(f, MAX, &all, &len, &last) <= MAX + KVP_FSM_SNAP_OBJECT_MAX + 12);
        assert_false(last);
        assert_true(kvp_fsm_snap_cursor(f) - c0 <= KVP_FSM_SNAP_STEP_MIN_SLOTS);
    }
    for (int i = BASE; i < BASE + MORE; i++) { /* the growth starts at 40,960 and ends 1,024 later */
        snprintf(k, sizeof k, "b/%06d", i);
        assert_int_equal(tf_put(f, k, 64, 1, 1 + (uint64_t)i, 20), KVP_OK);
    }
    assert_int_equal(f->tab_cap, 131072);
    assert_null(f->ntab);
    assert_int_equal(kvp_fsm_snap_cursor(f), 0); /* the walk starts over */
    size_t l = snap_step(f, MAX, &all, &len, &last);
    assert_false(last);
    assert_int_equal(kvp_fsm_snap_cursor(f), KVP_FSM_SNAP_STEP_MIN_SLOTS); /* stopped by the slot bound */
    assert_true(l < MAX);                                                  /* ... not by the chunk's size */
    int steps = 0;
    while (!last) {
        uint64_t c0 = kvp_fsm_snap_cursor(f);
        snap_step(f, MAX, &all, &len, &last);
        if (!last)
            assert_true(kvp_fsm_snap_cursor(f) - c0 <= KVP_FSM_SNAP_STEP_MIN_SLOTS);
        steps++;
    }
    assert_true(steps >= (int)(131072 / KVP_FSM_SNAP_STEP_MIN_SLOTS) - 1);
    assert_restores_to(all, len, d0);
    free(all);
    kvp_master_fsm_destroy(&f);
}

/* Objects a command changes while a snapshot owes them are written early (copy before write);
 * RemoveAll touches every object at once. The next steps emit them a chunk at a time, not in one
 * chunk of the whole state. */
static void test_snapshot_touched_objects_emitted_in_chunks(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(100, 600000);
    uint32_t id;
    assert_int_equal(tf_mount(f, "a", "h1", 1ull << 30, 1, &id), KVP_OK);
    enum { N = 20000, MAX = 8192 };
    char k[64];
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof k, "t/%06d", i);
        assert_int_equal(tf_put(f, k, 64, 1, 1 + (uint64_t)i, 10), KVP_OK);
    }
    uint64_t d0 = digest_now(f);
    assert_int_equal(kvp_master_fsm_snap_begin(f), KVP_OK);
    uint8_t *all = NULL;
    size_t len = 0;
    bool last = false;
    for (int i = 0; i < 3; i++)
        snap_step(f, MAX, &all, &len, &last);
    assert_int_equal(tf_remove_all(f, 20), N); /* every object owed so far is written early */
    int steps = 0;
    while (!last) {
        assert_true(snap_step(f, MAX, &all, &len, &last) <= MAX + KVP_FSM_SNAP_OBJECT_MAX + 12);
        steps++;
    }
    assert_true(steps > 50); /* ~20k objects of ~40 B in chunks of 8 KiB */
    assert_restores_to(all, len, d0);
    free(all);
    kvp_master_fsm_destroy(&f);
}

int main(void)
{
    seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repair_scan_slices_equal_one_walk),
        cmocka_unit_test(test_repair_scan_table_moves),
        cmocka_unit_test(test_evict_list_slices_equal_one_walk),
        cmocka_unit_test(test_tenant_count_lost_stays_at_zero),
        cmocka_unit_test(test_tenant_use_kept_on_apply_equals_recount),
        cmocka_unit_test(test_table_grows_in_steps_under_snapshot),
        cmocka_unit_test(test_growth_inserts_write_only_copied_part),
        cmocka_unit_test(test_snapshot_step_bounded_after_growth),
        cmocka_unit_test(test_snapshot_touched_objects_emitted_in_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
