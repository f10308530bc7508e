/*
 * test_client_avoid.c — the client's memory of segments it could not reach (issue 18 item 2:
 * "clients' reports steer reads away"): a reported segment's replicas are tried last for
 * KVP_CLIENT_AVOID_MS, then in the master's order again; the table keeps the newest entries.
 * Fake clock: no waiting.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "actors/client/client.h"
#include "runtime/clock.h"
#include "tests/lib/fake_clock.h"

static void test_client_avoid_reported_segment_tried_last_then_forgiven(void **state)
{
    (void)state;
    struct kvp_fake_clock fc;
    kvp_fake_clock_install(&fc, 1000000000ull);
    static struct kvp_client c; /* only mu and avoid are used */
    memset(&c, 0, sizeof c);
    pthread_mutex_init(&c.mu, NULL);
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
    pthread_mutex_destroy(&c.mu);
    kvp_fake_clock_uninstall();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_avoid_reported_segment_tried_last_then_forgiven),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
