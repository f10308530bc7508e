/*
 * test_repair_pass.c — the repair driver's pass in slices (actors/master/service/repair_pass.h):
 * slices' counters sum to the pass; a change of the table's size within a pass restarts it at
 * slot 0 without counting the answer that saw it; objects moved between slots within a pass
 * mark it (its "no work" verdict is then bounded in time by service_repair.c); an answer to a
 * query sent before a reset (leadership lost, then won again) is not awaited and does not join.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "actors/master/service/repair_pass.h"

#define MAX 512u

/* The answer to a slice of `slots` from `cursor` of a table of `cap` slots. */
static Kvp__RepairScanResp slice(uint64_t cap, uint64_t moves, uint64_t cursor, uint64_t slots, uint64_t needs,
                                 uint64_t under)
{
    Kvp__RepairScanResp b = KVP__REPAIR_SCAN_RESP__INIT;
    uint64_t from = cursor < cap ? cursor : 0;
    b.next_cursor = from + slots < cap ? from + slots : 0;
    b.table_slots = cap;
    b.table_moves = moves;
    b.n_needs = needs;
    b.under_replicated = under;
    b.draining_objects = 1;
    return b;
}

static void test_slices_sum_to_the_pass(void **state)
{
    (void)state;
    struct repair_pass p;
    repair_pass_reset(&p);
    p.in_pass = true;
    for (int i = 0; i < 4; i++) {
        Kvp__RepairScanResp b = slice(1024, 7, p.cursor, 256, 1, 2);
        assert_int_equal(repair_pass_add(&p, &b, MAX), i < 3 ? REPAIR_PASS_MORE : REPAIR_PASS_DONE);
        assert_int_equal(p.cursor, i < 3 ? 256u * (unsigned)(i + 1) : 0u);
    }
    assert_false(p.in_pass);
    assert_false(p.moved);
    assert_false(p.full);
    assert_int_equal(p.sum.n_needs, 4);
    assert_int_equal(p.sum.under_replicated, 8);
    assert_int_equal(p.sum.draining_objects, 4);
}

static void test_growth_within_a_pass_restarts_at_slot_0(void **state)
{
    (void)state;
    struct repair_pass p;
    repair_pass_reset(&p);
    p.in_pass = true;
    Kvp__RepairScanResp b = slice(1024, 0, 0, 512, 1, 1);
    assert_int_equal(repair_pass_add(&p, &b, MAX), REPAIR_PASS_MORE);
    assert_int_equal(p.cursor, 512);
    /* the table doubled: this answer walked [512, 1024) of the new table */
    b = slice(2048, 0, 512, 512, 3, 3);
    assert_int_equal(repair_pass_add(&p, &b, MAX), REPAIR_PASS_RESTARTED);
    assert_true(p.in_pass);
    assert_int_equal(p.cursor, 0); /* not 1024: [0, 512) of the new table was never walked */
    assert_int_equal(p.sum.n_needs, 0);
    int slices = 0;
    enum repair_pass_step st;
    do {
        b = slice(2048, 0, p.cursor, 512, 1, 0);
        st = repair_pass_add(&p, &b, MAX);
        slices++;
    } while (st == REPAIR_PASS_MORE);
    assert_int_equal(st, REPAIR_PASS_DONE);
    assert_int_equal(slices, 4); /* the whole new table */
    assert_int_equal(p.sum.n_needs, 4);
    assert_int_equal(p.sum.under_replicated, 0);
}

static void test_moves_within_a_pass_mark_it(void **state)
{
    (void)state;
    struct repair_pass p;
    repair_pass_reset(&p);
    p.in_pass = true;
    Kvp__RepairScanResp b = slice(1024, 40, 0, 512, 0, 0);
    assert_int_equal(repair_pass_add(&p, &b, MAX), REPAIR_PASS_MORE);
    assert_false(p.moved);
    b = slice(1024, 41, 512, 512, 0, 0); /* a removal shifted an object between the slices */
    assert_int_equal(repair_pass_add(&p, &b, MAX), REPAIR_PASS_DONE);
    assert_true(p.moved);
    /* a pass of one slice cannot miss a moved object, whatever the counter says */
    repair_pass_reset(&p);
    p.in_pass = true;
    b = slice(1024, 99, 0, 0 + 4096, 0, 0);
    assert_int_equal(repair_pass_add(&p, &b, MAX), REPAIR_PASS_DONE);
    assert_false(p.moved);
    /* a slice whose needs list is at its bound marks the pass full */
    repair_pass_reset(&p);
    p.in_pass = true;
    b = slice(1024, 0, 0, 4096, MAX, 0);
    assert_int_equal(repair_pass_add(&p, &b, MAX), REPAIR_PASS_DONE);
    assert_true(p.full);
}

/* Issue 22: a query sent in an old term and answered after the node leads again. Mirrors
 * service_repair.c: on_tick sends with repair_scan_send, svc_repair_reset forgets, and
 * svc_repair_on_result joins an answer to the pass only if repair_scan_answered. */
static void test_answer_from_before_a_reset_is_dropped(void **state)
{
    (void)state;
    struct repair_pass p;
    struct repair_scan_ticket t = {0, 0};
    repair_pass_reset(&p);
    p.in_pass = true;
    /* old term: the first slice answered, the second asked from cursor 512 */
    uint64_t t1 = repair_scan_send(&t);
    assert_true(repair_scan_answered(&t, t1));
    Kvp__RepairScanResp b = slice(1024, 0, p.cursor, 512, 0, 0);
    assert_int_equal(repair_pass_add(&p, &b, MAX), REPAIR_PASS_MORE);
    uint64_t old = repair_scan_send(&t);
    uint64_t old_cursor = p.cursor;
    assert_int_equal(old_cursor, 512);
    /* leadership lost: svc_repair_reset */
    repair_scan_forget(&t);
    repair_pass_reset(&p);
    assert_false(repair_scan_in_flight(&t)); /* the new leader's first scan is not held back */
    /* leadership won again: the new pass's first query, from slot 0 */
    p.in_pass = true;
    uint64_t t2 = repair_scan_send(&t);
    assert_int_not_equal(t2, old);
    assert_int_equal(p.cursor, 0);
    /* the old query's answer ([512, 1024), the table's end) comes now: dropped, and the new query
     * is still awaited (no second one is sent beside it) */
    assert_false(repair_scan_answered(&t, old));
    assert_true(repair_scan_in_flight(&t));
    assert_true(p.in_pass);
    assert_int_equal(p.cursor, 0); /* joining it would have ended the pass after half the table */
    /* the new query's answers make the whole pass */
    int slices = 0;
    enum repair_pass_step st;
    uint64_t tk = t2;
    do {
        assert_true(repair_scan_answered(&t, tk));
        b = slice(1024, 0, p.cursor, 512, 1, 0);
        st = repair_pass_add(&p, &b, MAX);
        slices++;
        tk = repair_scan_send(&t);
    } while (st == REPAIR_PASS_MORE);
    assert_int_equal(st, REPAIR_PASS_DONE);
    assert_int_equal(slices, 2);
    assert_int_equal(p.sum.n_needs, 2);
    /* a stale answer with none awaited is dropped too, and so is ticket 0 */
    repair_scan_forget(&t);
    assert_false(repair_scan_answered(&t, tk));
    assert_false(repair_scan_answered(&t, 0));
    assert_false(repair_scan_in_flight(&t));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slices_sum_to_the_pass),
        cmocka_unit_test(test_growth_within_a_pass_restarts_at_slot_0),
        cmocka_unit_test(test_moves_within_a_pass_mark_it),
        cmocka_unit_test(test_answer_from_before_a_reset_is_dropped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
