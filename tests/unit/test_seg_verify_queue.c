/*
 * test_seg_verify_queue.c — the segment's range-verify queue alone (actors/segment/seg_verify.h):
 * steps of any budget give the one-call XXH3-64 of the range; a resent id is queued once; ranges
 * past KVP_SEG_VERIFY_MAX are dropped and counted; an answer goes out once; a new mount clears it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "actors/segment/seg_verify.h"
#include "kvpool.h"

#define REGION (1u << 20)

static uint8_t region[REGION];

static Kvp__RangeVerify mk(uint64_t id, uint64_t off, uint64_t len)
{
    Kvp__RangeVerify r;
    kvp__range_verify__init(&r);
    r.id = id;
    r.offset = off;
    r.len = len;
    return r;
}

static void fill_region(void)
{
    for (size_t i = 0; i < REGION; i++)
        region[i] = (uint8_t)((i * 2654435761u) >> 13);
}

static void test_seg_verify_steps_equal_one_call(void **state)
{
    (void)state;
    fill_region();
    static struct kvp_seg_verify v;
    kvp_seg_verify_init(&v);
    /* budgets that cut the ranges at odd places, including inside XXH3's 256-byte stripes */
    const uint64_t budgets[] = {1, 63, 255, 1000, 4096, 100003, REGION};
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
        Kvp__RangeVerify r[3] = {mk(1, 17, 300000), mk(2, 0, REGION), mk(3, REGION - 1, 1)};
        Kvp__RangeVerify *rp[3] = {&r[0], &r[1], &r[2]};
        assert_int_equal(kvp_seg_verify_add(&v, 7, rp, 3, REGION, "test"), 3);
        uint64_t total = 0;
        int steps = 0;
        while (kvp_seg_verify_pending(&v) && steps < 3000000) {
            uint64_t n = kvp_seg_verify_step(&v, region, budgets[b]);
            assert_true(n <= budgets[b]);
            total += n;
            steps++;
        }
        assert_int_equal(total, 300000 + REGION + 1);
        Kvp__HeartbeatReq hb = KVP__HEARTBEAT_REQ__INIT;
        assert_int_equal(kvp_seg_verify_fill(&v, &hb), 3);
        assert_int_equal(hb.n_verified, 3);
        const uint64_t want[3] = {XXH3_64bits(region + 17, 300000), XXH3_64bits(region, REGION),
                                  XXH3_64bits(region + REGION - 1, 1)};
        for (size_t i = 0; i < 3; i++) {
            assert_int_equal(hb.verified[i]->status, KVP_OK);
            assert_int_equal(hb.verified[i]->id, i + 1);
            assert_true(hb.verified[i]->checksum == want[i]);
        }
        assert_int_equal(v.n, 0); /* sent once */
        Kvp__HeartbeatReq hb2 = KVP__HEARTBEAT_REQ__INIT;
        assert_int_equal(kvp_seg_verify_fill(&v, &hb2), 0);
        assert_null(hb2.verified);
    }
    kvp_seg_verify_clear(&v);
}

static void test_seg_verify_refusals_and_bounds(void **state)
{
    (void)state;
    static struct kvp_seg_verify v;
    kvp_seg_verify_init(&v);
    Kvp__RangeVerify bad[4] = {mk(1, REGION, 1), mk(2, 5, 0), mk(3, UINT64_MAX, 2), mk(4, 10, REGION)};
    Kvp__RangeVerify *bp[5] = {&bad[0], &bad[1], &bad[2], &bad[3], NULL};
    assert_int_equal(kvp_seg_verify_add(&v, 1, bp, 5, REGION, "test"), 4); /* a NULL entry skipped */
    assert_int_equal(kvp_seg_verify_ready(&v), 4); /* refused at once: nothing to hash */
    assert_int_equal(kvp_seg_verify_step(&v, region, REGION), 0);
    Kvp__HeartbeatReq hb = KVP__HEARTBEAT_REQ__INIT;
    assert_int_equal(kvp_seg_verify_fill(&v, &hb), 4);
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(hb.verified[i]->status, KVP_ERR_INVALID);
        assert_int_equal(hb.verified[i]->checksum, 0);
    }
    /* a resent id still queued is not queued twice */
    Kvp__RangeVerify a = mk(9, 0, 100), *ap[2] = {&a, &a};
    assert_int_equal(kvp_seg_verify_add(&v, 1, ap, 2, REGION, "test"), 1);
    assert_int_equal(kvp_seg_verify_add(&v, 1, ap, 1, REGION, "test"), 0);
    /* a new mount's asks clear the old mount's */
    Kvp__RangeVerify b = mk(10, 0, 100), *bq[1] = {&b};
    assert_int_equal(kvp_seg_verify_add(&v, 2, bq, 1, REGION, "test"), 1);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.q[0].id, 10);
    /* the bound: KVP_SEG_VERIFY_MAX queued, the rest dropped and counted */
    size_t n = KVP_SEG_VERIFY_MAX + 10;
    Kvp__RangeVerify *many = calloc(n, sizeof *many);
    Kvp__RangeVerify **mp = calloc(n, sizeof *mp);
    assert_non_null(many);
    assert_non_null(mp);
    for (size_t i = 0; i < n; i++) {
        many[i] = mk(100 + i, i, 1);
        mp[i] = &many[i];
    }
    assert_int_equal(kvp_seg_verify_add(&v, 2, mp, n, REGION, "test"), KVP_SEG_VERIFY_MAX - 1);
    assert_int_equal(v.n, KVP_SEG_VERIFY_MAX);
    assert_int_equal(v.refused, 11);
    kvp_seg_verify_step(&v, region, REGION);
    Kvp__HeartbeatReq hb3 = KVP__HEARTBEAT_REQ__INIT;
    assert_int_equal(kvp_seg_verify_fill(&v, &hb3), KVP_SEG_VERIFY_MAX);
    free(many);
    free(mp);
    kvp_seg_verify_clear(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seg_verify_steps_equal_one_call),
        cmocka_unit_test(test_seg_verify_refusals_and_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
