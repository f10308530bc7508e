/*
 * test_client_avoid.c — the client's memory of segments it could not reach (issue 18 item 2:
 * "clients' reports steer reads away"): a reported segment's replicas are tried last for
 * KVP_CLIENT_AVOID_MS, then in the master's order again; the table keeps the newest entries.
 * The tables are the client actor's (client_actor.c): the test runs the actor and reaches them by
 * its messages, as the calls do. Fake clock: no waiting on time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include <sched.h>
#include <stdio.h>

#include "actors/client/client.h"
#include "runtime/clock.h"
#include "tests/lib/fake_clock.h"

/* As a get sees it: one copy of the avoid list (kvp_client_get_begin), then the check. */
static bool avoided(struct kvp_client *c, uint32_t seg, uint64_t now_ms)
{
    struct kvp_client_view v;
    kvp_client_get_begin(c, &v);
    return kvp_client_view_avoided(&v, seg, now_ms);
}
#define kvp_client_avoided avoided

static void test_client_avoid_reported_segment_tried_last_then_forgiven(void **state)
{
    (void)state;
    struct kvp_fake_clock fc;
    kvp_fake_clock_install(&fc, 1000000000ull);
    static struct kvp_client c; /* only the name, the actor and its hints are used */
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "client-test");
    assert_int_equal(kvp_client_actor_start(&c), KVP_OK);
    uint64_t t0 = kvp_clock_now_ms();
    assert_false(kvp_client_avoided(&c, 3, t0));
    kvp_client_avoid_note(&c, 3);
    assert_true(kvp_client_avoided(&c, 3, t0));
    assert_false(kvp_client_avoided(&c, 4, t0));
    assert_true(kvp_client_avoided(&c, 3, t0 + KVP_CLIENT_AVOID_MS - 1));
    assert_false(kvp_client_avoided(&c, 3, t0 + KVP_CLIENT_AVOID_MS));
    /* noted again later: avoided from then on */
    kvp_fake_clock_advance_ms(&fc, 1000);
    kvp_client_avoid_note(&c, 3);
    assert_true(kvp_client_avoided(&c, 3, t0 + KVP_CLIENT_AVOID_MS + 500));
    /* a full table drops the oldest entry */
    for (uint32_t s = 100; s < 100 + KVP_CLIENT_AVOID_MAX; s++) {
        kvp_fake_clock_advance_ms(&fc, 1);
        kvp_client_avoid_note(&c, s);
    }
    uint64_t now = kvp_clock_now_ms();
    assert_false(kvp_client_avoided(&c, 3, now));
    for (uint32_t s = 100; s < 100 + KVP_CLIENT_AVOID_MAX; s++)
        assert_true(kvp_client_avoided(&c, s, now));
    /* the put's copy: the same entries */
    uint32_t list[KVP_CLIENT_AVOID_MAX];
    assert_int_equal(kvp_client_avoid_list(&c, list, KVP_CLIENT_AVOID_MAX), KVP_CLIENT_AVOID_MAX);
    /* all forgiven: no entry, and no request needed (the hint says so) */
    kvp_fake_clock_advance_ms(&fc, KVP_CLIENT_AVOID_MS);
    assert_int_equal(kvp_client_avoid_list(&c, list, KVP_CLIENT_AVOID_MAX), 0);
    kvp_client_actor_stop(&c);
    kvp_fake_clock_uninstall();
}

/* Read witnesses (issue 18 rule 5): the segments of completed slices are named once, in the next
 * GetReplicaList, and only while fresh (KVP_CLIENT_READ_WITNESS_MS). */
static void test_client_read_witnesses_taken_once_while_fresh(void **state)
{
    (void)state;
    struct kvp_fake_clock fc;
    kvp_fake_clock_install(&fc, 2000000000ull);
    static struct kvp_client c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "client-test");
    assert_int_equal(kvp_client_actor_start(&c), KVP_OK);
    uint8_t b[4];
    struct kvp_xfer_slice sl[4] = {
        {.local = b, .length = 1, .segment_id = 7, .status = KVP_OK},
        {.local = b, .length = 1, .segment_id = 7, .status = KVP_OK},
        {.local = b, .length = 1, .segment_id = 8, .status = KVP_ERR_TRANSFER},
        {.local = b, .length = 1, .segment_id = 9, .status = KVP_OK},
    };
    kvp_client_read_ok(&c, sl, 4); /* one-way: wait until the actor took it (bounded) */
    for (int i = 0; i < 100000 && !atomic_load(&c.read_ok_hint); i++)
        sched_yield();
    struct kvp_client_view v;
    kvp_client_get_begin(&c, &v);
    assert_int_equal(v.n_read_ok, 2);
    assert_true((v.read_ok[0] == 7 && v.read_ok[1] == 9) || (v.read_ok[0] == 9 && v.read_ok[1] == 7));
    kvp_client_get_begin(&c, &v); /* taken: named once */
    assert_int_equal(v.n_read_ok, 0);
    /* a reading older than the witness window is not named */
    kvp_client_read_ok(&c, sl, 1);
    for (int i = 0; i < 100000 && !atomic_load(&c.read_ok_hint); i++)
        sched_yield();
    kvp_fake_clock_advance_ms(&fc, KVP_CLIENT_READ_WITNESS_MS + 1);
    kvp_client_get_begin(&c, &v);
    assert_int_equal(v.n_read_ok, 0);
    kvp_client_actor_stop(&c);
    kvp_fake_clock_uninstall();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_avoid_reported_segment_tried_last_then_forgiven),
        cmocka_unit_test(test_client_read_witnesses_taken_once_while_fresh),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
