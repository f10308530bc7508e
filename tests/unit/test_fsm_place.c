/*
 * test_fsm_place.c — PutStart's placement (fsm_cmd.c, issue 22) chooses exactly what sorting
 * every candidate segment did before it (the reference below is that code: qsort by preferred,
 * not avoided, most free bytes, lowest id; then one replica per host, then the rest in order).
 *
 * Random states: 1-40 segments on 1-6 hosts, sizes from a small set (so free bytes tie and the
 * id decides), some draining, lost or unmounted; random PutStarts (size, 0-6 replicas, a
 * preferred segment that may not exist, avoid lists of up to 20 ids with and without the
 * feature level that enables them), PutEnds, removals and expiry so free space moves. Before
 * each single-item PutStart the reference computes the status and the segments in order from
 * the FSM's state; the apply must give the same. Multi-item commands are applied to a twin FSM
 * as one command and compared with the single-item path item by item, then by digest.
 * Replicas of one object are always on distinct segments. KVP_FSM_PLACE_SEED overrides the seed.
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
#include "actors/master/fsm/version.h"
#include "test_fsm_helpers.h"

#define KB 1024ull
#define MB (1024ull * 1024ull)

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint64_t rn(uint64_t n)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs % n;
}

/* ---------------------------------------------------------------- reference (the sort) */

struct ref_cand {
    const struct kvp_fsm_seg *s;
    bool preferred, avoided, taken;
};

static int ref_cmp(const void *a, const void *b)
{
    const struct ref_cand *x = a, *y = b;
    if (x->preferred != y->preferred)
        return x->preferred ? -1 : 1;
    if (x->avoided != y->avoided)
        return x->avoided ? 1 : -1;
    if (x->s->alloc.free_bytes != y->s->alloc.free_bytes)
        return x->s->alloc.free_bytes > y->s->alloc.free_bytes ? -1 : 1;
    return x->s->id < y->s->id ? -1 : (x->s->id > y->s->id);
}

/* Status of the item, and on KVP_OK the chosen segment ids in order (*k of them). */
static int ref_place(const struct kvp_master_fsm *f, uint64_t size, uint32_t replica_num, const char *preferred,
                     const uint32_t *avoid, size_t n_avoid, uint32_t *ids, unsigned *k)
{
    uint64_t need = kvp_alloc_round(size);
    unsigned want = replica_num ? replica_num : 1;
    struct ref_cand *c = calloc(f->n_segs_ids + 1, sizeof(*c));
    size_t n = 0;
    bool any_active = false, any_big = false;
    for (uint32_t i = 0; i < f->n_segs_ids; i++) {
        const struct kvp_fsm_seg *s = f->segs[i];
        if (!s || s->state != KVP__SEGMENT_STATE__SEGMENT_ACTIVE)
            continue;
        any_active = true;
        if (s->alloc.capacity >= need)
            any_big = true;
        if (kvp_alloc_largest_free(&s->alloc) >= need) {
            c[n].s = s;
            c[n].preferred = preferred && preferred[0] && strcmp(s->name, preferred) == 0;
            for (size_t a = 0; a < n_avoid; a++)
                c[n].avoided |= avoid[a] == s->id;
            n++;
        }
    }
    *k = 0;
    if (any_active && !any_big) {
        free(c);
        return KVP_ERR_TOO_LARGE;
    }
    if (n == 0) {
        free(c);
        return KVP_ERR_NO_SPACE;
    }
    qsort(c, n, sizeof(*c), ref_cmp);
    const struct kvp_fsm_seg *chosen[KVP_FSM_MAX_REPLICAS];
    for (size_t i = 0; i < n && *k < want; i++) {
        bool dup = false;
        for (unsigned j = 0; j < *k && !dup; j++)
            dup = strcmp(chosen[j]->host, c[i].s->host) == 0;
        if (!dup) {
            chosen[(*k)++] = c[i].s;
            c[i].taken = true;
        }
    }
    for (size_t i = 0; i < n && *k < want; i++)
        if (!c[i].taken)
            chosen[(*k)++] = c[i].s;
    for (unsigned j = 0; j < *k; j++)
        ids[j] = chosen[j]->id;
    free(c);
    return KVP_OK;
}

/* ---------------------------------------------------------------- random puts */

struct item {
    char key[32];
    uint64_t size, op;
    uint32_t replica_num;
    char preferred[16];
    bool has_preferred;
};

static void random_item(struct item *it, int i, uint32_t n_ids, uint64_t *op)
{
    snprintf(it->key, sizeof it->key, "p/%06d", i);
    static const uint64_t sizes[] = {64, 4 * KB, 64 * KB, 300 * KB, 1 * MB};
    it->size = rn(3) ? sizes[rn(5)] : 1 + rn(2 * MB);
    it->replica_num = (uint32_t)rn(7);
    it->op = ++*op;
    it->has_preferred = rn(3) == 0;
    snprintf(it->preferred, sizeof it->preferred, "s%u", (unsigned)rn(n_ids + 3)); /* some do not exist */
}

static Kvp__Response *put_cmd(struct kvp_master_fsm *f, const struct item *its, size_t n, uint32_t *avoid,
                              size_t n_avoid, uint32_t level, uint64_t now)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutStartReq q = KVP__PUT_START_REQ__INIT;
    Kvp__PutStartItem pi[8], *pp[8];
    assert_true(n <= 8);
    for (size_t i = 0; i < n; i++) {
        kvp__put_start_item__init(&pi[i]);
        pi[i].key = (char *)its[i].key;
        pi[i].size = its[i].size;
        pi[i].replica_num = its[i].replica_num;
        pi[i].op_id = its[i].op;
        if (its[i].has_preferred)
            pi[i].preferred_segment = (char *)its[i].preferred;
        pp[i] = &pi[i];
    }
    q.n_items = n;
    q.items = pp;
    q.avoid_segments = avoid;
    q.n_avoid_segments = n_avoid;
    c.now_wall_ms = now;
    c.term = 2;
    c.feature_level = level;
    c.body_case = KVP__COMMAND__BODY_PUT_START;
    c.put_start = &q;
    Kvp__Response *r = tf_apply(f, &c);
    assert_int_equal(r->body_case, KVP__RESPONSE__BODY_PUT_START);
    assert_int_equal(r->put_start->n_results, n);
    return r;
}

static void assert_distinct(const Kvp__PutStartResult *res)
{
    for (size_t a = 0; a < res->n_replicas; a++)
        for (size_t b = a + 1; b < res->n_replicas; b++)
            assert_int_not_equal(res->replicas[a]->segment_id, res->replicas[b]->segment_id);
}

/* One random state and 400 operations on it (and on its twin for multi-item commands). */
static void one_round(int round, uint64_t *checked, uint64_t *multi)
{
    struct kvp_master_fsm *f = tf_new(5, 50), *g = tf_new(5, 50);
    unsigned n_segs = 1 + (unsigned)rn(40), n_hosts = 1 + (unsigned)rn(6);
    static const uint64_t seg_sizes[] = {2 * MB, 4 * MB, 4 * MB, 16 * MB};
    for (unsigned i = 0; i < n_segs; i++) {
        char name[16], host[16];
        snprintf(name, sizeof name, "s%u", i + 1);
        snprintf(host, sizeof host, "h%u", (unsigned)rn(n_hosts));
        uint64_t size = rn(4) ? seg_sizes[rn(4)] : 64 * KB + rn(8 * MB);
        assert_int_equal(tf_mount(f, name, host, size, 1, NULL), KVP_OK);
        assert_int_equal(tf_mount(g, name, host, size, 1, NULL), KVP_OK);
    }
    uint64_t now = 2, op = 0;
    for (uint32_t id = 1; id <= n_segs; id++) {
        switch (rn(10)) {
        case 0:
            assert_int_equal(tf_drain(f, id, NULL, now), KVP_OK);
            assert_int_equal(tf_drain(g, id, NULL, now), KVP_OK);
            break;
        case 1:
            assert_int_equal(tf_seg_lost(f, id, now), KVP_OK);
            assert_int_equal(tf_seg_lost(g, id, now), KVP_OK);
            break;
        case 2:
            assert_int_equal(tf_unmount(f, id, now), KVP_OK);
            assert_int_equal(tf_unmount(g, id, now), KVP_OK);
            break;
        default:
            break;
        }
    }
    int next_key = 0;
    for (int step = 0; step < 400; step++) {
        uint32_t avoid[20];
        size_t n_avoid = rn(3) ? 0 : (size_t)rn(21);
        for (size_t a = 0; a < n_avoid; a++)
            avoid[a] = 1 + (uint32_t)rn(n_segs + 2);
        uint32_t level = rn(4) ? KVP_FEATURE_AVOID_SEGMENTS : 0;
        size_t eff_avoid = level >= KVP_FEATURE_AVOID_SEGMENTS ? (n_avoid < 16 ? n_avoid : 16) : 0;
        unsigned op_kind = (unsigned)rn(10);
        if (op_kind < 6) {
            /* single-item commands on f, checked against the reference; multi-item on g */
            size_t n = 1 + rn(rn(4) ? 1 : 8);
            struct item its[8];
            for (size_t i = 0; i < n; i++)
                random_item(&its[i], next_key++, n_segs, &op);
            if (rn(20) == 0 && (size_t)next_key > n) /* a retry of an earlier key: EXISTS or the same replicas */
                snprintf(its[0].key, sizeof its[0].key, "p/%06d", (int)rn((uint64_t)next_key - n));
            Kvp__Response *multi_r = put_cmd(g, its, n, avoid, n_avoid, level, now);
            for (size_t i = 0; i < n; i++) {
                uint32_t ids[KVP_FSM_MAX_REPLICAS];
                unsigned k = 0;
                bool exists = kvp_fsm_obj_find(f, its[i].key, strlen(its[i].key)) != NULL;
                const char *pref = its[i].has_preferred ? its[i].preferred : NULL;
                int want_st = ref_place(f, its[i].size, its[i].replica_num, pref, avoid, eff_avoid, ids, &k);
                Kvp__Response *r = put_cmd(f, &its[i], 1, avoid, n_avoid, level, now);
                const Kvp__PutStartResult *res = r->put_start->results[0];
                if (!exists) {
                    if (res->status != want_st)
                        fail_msg("round %d step %d: status %d, the sort gives %d", round, step, res->status, want_st);
                    if (want_st == KVP_OK) {
                        assert_int_equal(res->n_replicas, k);
                        for (unsigned j = 0; j < k; j++)
                            if (res->replicas[j]->segment_id != ids[j])
                                fail_msg("round %d step %d: replica %u on segment %u, the sort gives %u", round,
                                         step, j, res->replicas[j]->segment_id, ids[j]);
                        (*checked)++;
                    }
                }
                assert_distinct(res);
                /* the multi-item command placed the same item the same way */
                const Kvp__PutStartResult *mres = multi_r->put_start->results[i];
                assert_int_equal(mres->status, res->status);
                assert_int_equal(mres->n_replicas, res->n_replicas);
                for (size_t j = 0; j < res->n_replicas; j++) {
                    assert_int_equal(mres->replicas[j]->segment_id, res->replicas[j]->segment_id);
                    assert_true(mres->replicas[j]->offset == res->replicas[j]->offset);
                }
                kvp_master_fsm_response_free(r);
            }
            if (n > 1)
                (*multi)++;
            kvp_master_fsm_response_free(multi_r);
        } else if (op_kind < 8 && next_key > 0) {
            char k[32];
            snprintf(k, sizeof k, "p/%06d", (int)rn((uint64_t)next_key));
            uint64_t o = 0;
            const struct kvp_fsm_obj *ob = kvp_fsm_obj_find(f, k, strlen(k));
            if (ob)
                o = ob->op_id;
            if (op_kind == 6) {
                assert_int_equal(tf_put_end(f, k, o, 7, now), tf_put_end(g, k, o, 7, now));
            } else {
                bool evict = rn(2) == 0;
                assert_int_equal(tf_remove(f, k, evict, now), tf_remove(g, k, evict, now));
            }
        } else {
            now += 1 + rn(40); /* quarantine releases and expiry move free space */
            assert_true(tf_revoke_expired(f, now) == tf_revoke_expired(g, now));
            assert_true(tf_release(f, now) == tf_release(g, now));
        }
    }
    assert_int_equal(kvp_master_fsm_check(f), 0);
    assert_int_equal(kvp_master_fsm_check(g), 0);
    assert_true(kvp_master_fsm_digest(f) == kvp_master_fsm_digest(g));
    kvp_master_fsm_destroy(&f);
    kvp_master_fsm_destroy(&g);
}

static void test_placement_equals_sorted_order(void **state)
{
    (void)state;
    uint64_t checked = 0, multi = 0;
    for (int round = 0; round < 60; round++)
        one_round(round, &checked, &multi);
    print_message("%llu placements equal to the sort's, %llu multi-item commands equal\n",
                  (unsigned long long)checked, (unsigned long long)multi);
    assert_true(checked > 2000);
    assert_true(multi > 100);
}

int main(void)
{
    const char *e = getenv("KVP_FSM_PLACE_SEED");
    if (e && *e)
        rs = strtoull(e, NULL, 0) | 1u;
    print_message("seed %#llx\n", (unsigned long long)rs);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placement_equals_sorted_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
