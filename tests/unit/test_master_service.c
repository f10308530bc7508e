/*
 * test_master_service.c — the pure parts of the master service: the u64 → u64 map behind every
 * soft-state table (insert/overwrite/delete with backward shift, filter, iteration, growth,
 * against a reference array), the members list parser (every error path), and that a PutStart
 * marks the eviction state for a scan whichever path answers it (issue 21 item 2), and the intent
 * resolver's rule (svc_resolve_rule).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "actors/master/service/service_evict.h"
#include "actors/master/service/service_resolve.h"
#include "actors/master/service/service_state.h"
#include "kvpool.h"

#define REF_N 5000

static void test_svc_map_random_ops_match_reference(void **state)
{
    (void)state;
    struct svc_map m;
    svc_map_init(&m);
    static uint64_t ref[REF_N]; /* ref[k] = value + 1, 0 = absent; keys 1..REF_N-1 */
    memset(ref, 0, sizeof ref);
    srand(7);
    for (int op = 0; op < 200000; op++) {
        uint64_t k = 1 + (uint64_t)(rand() % (REF_N - 1));
        int what = rand() % 3;
        if (what == 0) {
            uint64_t v = (uint64_t)rand();
            assert_int_equal(svc_map_put(&m, k, v), KVP_OK);
            ref[k] = v + 1;
        } else if (what == 1) {
            uint64_t v = 0;
            bool had = svc_map_del(&m, k, &v);
            assert_int_equal(had, ref[k] != 0);
            if (had)
                assert_int_equal(v, ref[k] - 1);
            ref[k] = 0;
        } else {
            uint64_t v = 0;
            bool has = svc_map_get(&m, k, &v);
            assert_int_equal(has, ref[k] != 0);
            if (has)
                assert_int_equal(v, ref[k] - 1);
        }
    }
    size_t count = 0;
    for (size_t k = 1; k < REF_N; k++) {
        uint64_t v = 0;
        assert_int_equal(svc_map_get(&m, k, &v), ref[k] != 0);
        count += ref[k] != 0;
    }
    assert_int_equal(m.n, count);
    size_t pos = 0, seen = 0;
    uint64_t k, v;
    while (svc_map_next(&m, &pos, &k, &v)) {
        assert_true(ref[k] != 0);
        assert_int_equal(v, ref[k] - 1);
        seen++;
    }
    assert_int_equal(seen, count);
    svc_map_fini(&m);
}

static bool keep_even(uint64_t key, uint64_t val, void *ctx)
{
    (void)val;
    (void)ctx;
    return key % 2 == 0;
}

static void test_svc_map_filter_clear_key0_expected(void **state)
{
    (void)state;
    struct svc_map m;
    svc_map_init(&m);
    assert_false(svc_map_get(&m, 5, NULL)); /* empty, never allocated */
    assert_false(svc_map_del(&m, 5, NULL));
    assert_int_equal(svc_map_put(&m, 0, 1), KVP_ERR_INVALID);
    for (uint64_t k = 1; k <= 1000; k++)
        assert_int_equal(svc_map_put(&m, k, k * 10), KVP_OK);
    assert_int_equal(svc_map_put(&m, 7, 70), KVP_OK); /* overwrite: no new entry */
    assert_int_equal(m.n, 1000);
    svc_map_filter(&m, keep_even, NULL);
    assert_int_equal(m.n, 500);
    for (uint64_t k = 1; k <= 1000; k++) {
        uint64_t v = 0;
        assert_int_equal(svc_map_get(&m, k, &v), k % 2 == 0);
        if (k % 2 == 0)
            assert_int_equal(v, k * 10);
    }
    svc_map_clear(&m);
    assert_int_equal(m.n, 0);
    assert_false(svc_map_get(&m, 2, NULL));
    assert_int_equal(svc_map_put(&m, 2, 3), KVP_OK);
    assert_true(svc_map_get(&m, 2, NULL));
    svc_map_fini(&m);
}

static void test_svc_key_hash_never_zero_stable(void **state)
{
    (void)state;
    assert_int_not_equal(svc_key_hash(""), 0);
    assert_int_equal(svc_key_hash("abc"), svc_key_hash("abc"));
    assert_int_not_equal(svc_key_hash("abc"), svc_key_hash("abd"));
}

static void test_members_parse_valid_list_parsed(void **state)
{
    (void)state;
    struct kvp_master_member m[9];
    int n = kvp_master_members_parse(" 1@127.0.0.1:7101@127.0.0.1:7201, 2@h2:7101@h2:7201 ,3@[::1]:7101@[::1]:7201", m, 9);
    assert_int_equal(n, 3);
    assert_int_equal(m[0].id, 1);
    assert_string_equal(m[0].address, "127.0.0.1:7101");
    assert_string_equal(m[0].raft_address, "127.0.0.1:7201");
    assert_string_equal(m[1].address, "h2:7101");
    assert_string_equal(m[2].raft_address, "[::1]:7201");
    assert_int_equal(kvp_master_members_parse("", m, 9), 0);
}

static void test_members_parse_bad_entries_invalid(void **state)
{
    (void)state;
    struct kvp_master_member m[2];
    const char *bad[] = {
        "1@a:1",                       /* no raft address */
        "0@a:1@b:2",                   /* id 0 */
        "-1@a:1@b:2",                  /* negative id */
        "x@a:1@b:2",                   /* not a number */
        "1@a@b:2",                     /* no port */
        "1@a:@b:2",                    /* empty port */
        "1@a:1@b:2x",                  /* port not numeric */
        "1@:1@b:2",                    /* empty host */
        "1@a:1@b:2,1@c:3@d:4",         /* duplicate id */
        "1@a:1@b:2,2@c:3@d:4,3@e:5@f:6", /* more than cap */
        "99999999999999999999999@a:1@b:2", /* overflow */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int n = kvp_master_members_parse(bad[i], m, 2);
        if (n != KVP_ERR_INVALID)
            fail_msg("'%s' parsed as %d entries", bad[i], n);
    }
    assert_int_equal(kvp_master_members_parse(NULL, m, 2), KVP_ERR_INVALID);
}

/* A PutStart answered from a reservation (service_put.c: svc_evict_on_put_start_req, no FSM
 * result) must lead to a scan: before, only the FSM path's result marked usage as changed, so
 * with every put on the one-commit path the headroom rule was never applied (issue 21 item 2). */
static void test_evict_put_start_req_wants_scan(void **state)
{
    (void)state;
    struct kvp_master_service *s = calloc(1, sizeof *s);
    assert_non_null(s);
    strcpy(s->cfg.eviction_policy, "lru");
    s->cfg.fence_grace_ms = 5000;
    assert_int_equal(svc_evict_new(s), KVP_OK);
    assert_false(svc_evict_scan_wanted(s)); /* nothing seen yet */
    Kvp__PutStartItem it = KVP__PUT_START_ITEM__INIT;
    it.key = "blk-1";
    it.size = 32768;
    it.replica_num = 2;
    Kvp__PutStartItem *ip = &it;
    Kvp__PutStartReq ps = KVP__PUT_START_REQ__INIT;
    ps.n_items = 1;
    ps.items = &ip;
    svc_evict_on_put_start_req(s, &ps);
    assert_true(svc_evict_scan_wanted(s));
    svc_evict_destroy(s);
    assert_false(svc_evict_scan_wanted(s)); /* no eviction state: nothing to scan */
    free(s);
}

/* The resolver's rule (docs/master.md "Resolving pending intents"). A MISMATCH hashed before the
 * writer's last possible write (asked before `until`) is not final even when the last answer (a
 * slower replica's) arrives after `until`: an acknowledged put must never be revoked for it. */
static void test_resolve_rule_mismatch_final_only_when_asked_after_until(void **state)
{
    (void)state;
    const uint64_t until = 10000;
    /* 2 replicas: one hashed mid-transfer (MISMATCH), the other answered late; asked before
     * `until`, decided after it */
    assert_int_equal(svc_resolve_rule(2, 0, 1, until - 100, until + 5000, until), SVC_RESOLVE_AFTER_UNTIL);
    assert_int_equal(svc_resolve_rule(2, 1, 1, until - 100, until + 5000, until), SVC_RESOLVE_AFTER_UNTIL);
    assert_int_equal(svc_resolve_rule(2, 1, 1, until, until + 5000, until), SVC_RESOLVE_AFTER_UNTIL);
    /* asked after `until`: final */
    assert_int_equal(svc_resolve_rule(2, 1, 1, until + 1, until + 5000, until), SVC_RESOLVE_REVOKE);
    assert_int_equal(svc_resolve_rule(1, 0, 1, until + 1, until + 1, until), SVC_RESOLVE_REVOKE);
    /* every live replica matches: sealed whenever asked */
    assert_int_equal(svc_resolve_rule(2, 2, 0, until - 5000, until - 4000, until), SVC_RESOLVE_SEAL);
    assert_int_equal(svc_resolve_rule(1, 1, 0, until + 9, until + 10, until), SVC_RESOLVE_SEAL);
    /* no live replica: nothing asked, the time that counts is now */
    assert_int_equal(svc_resolve_rule(0, 0, 0, until - 100, until - 1, until), SVC_RESOLVE_AFTER_UNTIL);
    assert_int_equal(svc_resolve_rule(0, 0, 0, until - 100, until + 1, until), SVC_RESOLVE_REVOKE);
    /* a replica that did not answer and none mismatching, asked before `until`: again later */
    assert_int_equal(svc_resolve_rule(2, 1, 0, until - 100, until - 50, until), SVC_RESOLVE_RETRY);
    assert_int_equal(svc_resolve_rule(2, 0, 0, until - 100, until - 50, until), SVC_RESOLVE_RETRY);
    /* asked after `until`: one MATCH, no MISMATCH, a replica UNKNOWN (an older or silent
     * segment): sealed, not pending forever; no MATCH at all: again later */
    assert_int_equal(svc_resolve_rule(2, 1, 0, until + 1, until + 3000, until), SVC_RESOLVE_SEAL);
    assert_int_equal(svc_resolve_rule(3, 1, 0, until + 1, until + 3000, until), SVC_RESOLVE_SEAL);
    assert_int_equal(svc_resolve_rule(2, 0, 0, until + 1, until + 3000, until), SVC_RESOLVE_RETRY);
    assert_int_equal(svc_resolve_rule(2, 1, 0, until, until + 3000, until), SVC_RESOLVE_RETRY);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_svc_map_random_ops_match_reference),
        cmocka_unit_test(test_svc_map_filter_clear_key0_expected),
        cmocka_unit_test(test_svc_key_hash_never_zero_stable),
        cmocka_unit_test(test_members_parse_valid_list_parsed),
        cmocka_unit_test(test_members_parse_bad_entries_invalid),
        cmocka_unit_test(test_evict_put_start_req_wants_scan),
        cmocka_unit_test(test_resolve_rule_mismatch_final_only_when_asked_after_until),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
