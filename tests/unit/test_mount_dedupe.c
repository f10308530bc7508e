/*
 * test_mount_dedupe.c — a MountSegment call sent again by the session is proposed once
 * (actors/master/service/mount_dedupe.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "actors/master/service/mount_dedupe.h"

static const char ID_A[5] = {0, 0, 0, 0, 1}, ID_B[5] = {0, 0, 0, 0, 2};

/* req_id = seq << 8 | attempt, as the session numbers them */
#define REQ(seq, attempt) (((uint64_t)(seq) << 8) | (attempt))

static void test_mount_dedupe_later_attempt_of_one_call_is_a_repeat(void **state)
{
    (void)state;
    struct kvp_mount_recent r;
    kvp_mount_recent_clear(&r);
    assert_false(kvp_mount_recent_repeat(&r, ID_A, sizeof ID_A, REQ(7, 1), 1000));
    assert_true(kvp_mount_recent_repeat(&r, ID_A, sizeof ID_A, REQ(7, 3), 1400)); /* the bounce back */
    assert_true(kvp_mount_recent_repeat(&r, ID_A, sizeof ID_A, REQ(7, 4), 2600));
}

static void test_mount_dedupe_other_calls_and_callers_are_not(void **state)
{
    (void)state;
    struct kvp_mount_recent r;
    kvp_mount_recent_clear(&r);
    assert_false(kvp_mount_recent_repeat(&r, ID_A, sizeof ID_A, REQ(7, 1), 1000));
    assert_false(kvp_mount_recent_repeat(&r, ID_A, sizeof ID_A, REQ(8, 1), 1001)); /* next call */
    assert_false(kvp_mount_recent_repeat(&r, ID_B, sizeof ID_B, REQ(7, 1), 1002)); /* a restart */
    assert_false(kvp_mount_recent_repeat(&r, NULL, 0, REQ(9, 1), 1003));          /* no identity */
    assert_false(kvp_mount_recent_repeat(&r, NULL, 0, REQ(9, 2), 1004));
}

static void test_mount_dedupe_forgets_after_window_and_clear(void **state)
{
    (void)state;
    struct kvp_mount_recent r;
    kvp_mount_recent_clear(&r);
    assert_false(kvp_mount_recent_repeat(&r, ID_A, sizeof ID_A, REQ(7, 1), 1000));
    assert_false(kvp_mount_recent_repeat(&r, ID_A, sizeof ID_A, REQ(7, 2), 1000 + KVP_MOUNT_RECENT_MS));
    assert_true(kvp_mount_recent_repeat(&r, ID_A, sizeof ID_A, REQ(7, 3), 1001 + KVP_MOUNT_RECENT_MS));
    kvp_mount_recent_clear(&r); /* leadership change */
    assert_false(kvp_mount_recent_repeat(&r, ID_A, sizeof ID_A, REQ(7, 4), 1002 + KVP_MOUNT_RECENT_MS));
}

static void test_mount_dedupe_oldest_record_makes_room(void **state)
{
    (void)state;
    struct kvp_mount_recent r;
    kvp_mount_recent_clear(&r);
    assert_false(kvp_mount_recent_repeat(&r, ID_A, sizeof ID_A, REQ(1, 1), 1000));
    for (unsigned i = 0; i < KVP_MOUNT_RECENT - 1; i++)
        assert_false(kvp_mount_recent_repeat(&r, ID_B, sizeof ID_B, REQ(100 + i, 1), 1001 + i));
    assert_true(kvp_mount_recent_repeat(&r, ID_A, sizeof ID_A, REQ(1, 2), 2000)); /* still held */
    assert_false(kvp_mount_recent_repeat(&r, ID_B, sizeof ID_B, REQ(500, 1), 2001));
    assert_false(kvp_mount_recent_repeat(&r, ID_A, sizeof ID_A, REQ(1, 3), 2002)); /* overwritten */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mount_dedupe_later_attempt_of_one_call_is_a_repeat),
        cmocka_unit_test(test_mount_dedupe_other_calls_and_callers_are_not),
        cmocka_unit_test(test_mount_dedupe_forgets_after_window_and_clear),
        cmocka_unit_test(test_mount_dedupe_oldest_record_makes_room),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
