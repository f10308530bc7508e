/*
 * test_master_heartbeats.c — 100 segments heartbeat a real 3-master quorum (issue 22): hosted as
 * 4 threads of this process, 25 segments each, a heartbeat per segment per second, spread over
 * the second. Checked: every heartbeat is answered ACTIVE while the leader serves them, across a
 * leadership transfer (the new leader answers them once it has read the segment table), and no
 * segment is declared lost; afterwards each still gets ACTIVE. The leader's CPU time per segment
 * (/proc/PID/stat over the heartbeating window, less an idle window) is printed, not asserted
 * (figures: docs/bench.md "Master scale").
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <cmocka.h>

#include "tests/integration/test_master_util.h"

#define NSEG 100
#define NTHR 4

static struct tm_cluster *C;
static uint32_t ids[NSEG];
static _Atomic int stop;
static _Atomic uint64_t ok, not_active, failed;

static void *hb_thread(void *arg)
{
    unsigned t = (unsigned)(uintptr_t)arg;
    struct kvp_msession *ms = tm_admin_session(C, "hb-test");
    assert_non_null(ms);
    struct tm_hb_driver d = {.ms = ms, .ids = ids, .n = NSEG, .first = t, .step = NTHR, .period_ms = 1000,
                             .timeout_ms = 3000, .stop = &stop, .ok = &ok, .not_active = &not_active,
                             .failed = &failed};
    tm_hb_drive(&d);
    kvp_msession_destroy(&ms);
    return NULL;
}

static double cpu_us_per_s(int pid, unsigned ms)
{
    uint64_t c0 = tm_proc_cpu_ticks(pid), t0 = tm_now_ms();
    tm_sleep_ms(ms);
    uint64_t c1 = tm_proc_cpu_ticks(pid), t1 = tm_now_ms();
    return (double)(c1 - c0) * 1e6 / (double)sysconf(_SC_CLK_TCK) / ((double)(t1 - t0) / 1000.0);
}

/* Wait until `ok` reaches n (30 s at most): the heartbeat threads keep a 1 s schedule, but on a
 * loaded host a fixed sleep is no measure of how many rounds they finished. */
static uint64_t wait_ok(uint64_t n)
{
    for (uint64_t t0 = tm_now_ms(); atomic_load(&ok) < n && tm_now_ms() - t0 < 30000;)
        tm_sleep_ms(50);
    return atomic_load(&ok);
}

static void test_master_100_segments_heartbeat_quorum(void **state)
{
    C = *state;
    setenv("KVPOOL_CLIENT_TTL", "3000ms", 1);
    assert_int_equal(tm_cluster_up(C), 0);
    assert_int_equal(tm_mount_fake_segments(C, "hb-seg", NSEG, 1ull << 30, 21000, ids), 0);
    int leader = tm_leader(C, 5000);
    assert_true(leader >= 1);
    tm_load(C);
    double idle = cpu_us_per_s(C->pids[leader], 2000);
    pthread_t th[NTHR];
    for (unsigned t = 0; t < NTHR; t++)
        pthread_create(&th[t], NULL, hb_thread, (void *)(uintptr_t)t);
    tm_sleep_ms(500);
    double busy = cpu_us_per_s(C->pids[leader], 4000);
    uint64_t before = wait_ok(3 * NSEG);
    print_message("leader %d: %.0f us/s idle, %.0f us/s with %d segments heartbeating: %.1f us of leader CPU per "
                  "segment per second\n", leader, idle, busy, NSEG, (busy - idle) / NSEG);
    assert_true(before >= 3 * NSEG); /* ~4.5 rounds */
    assert_int_equal(atomic_load(&not_active), 0);
    assert_int_equal(atomic_load(&failed), 0);
    /* Hand leadership over while they heartbeat. */
    int next = leader % TM_MASTERS + 1;
    assert_int_equal(tm_transfer(C, next, 15000), 0);
    tm_sleep_ms(5000); /* 1.7 client TTLs under the new leader */
    (void)wait_ok(before + 4 * NSEG);
    atomic_store(&stop, 1);
    for (unsigned t = 0; t < NTHR; t++)
        pthread_join(th[t], NULL);
    print_message("heartbeats: %llu answered ACTIVE, %llu not active, %llu failed (transfer %d -> %d)\n",
                  (unsigned long long)atomic_load(&ok), (unsigned long long)atomic_load(&not_active),
                  (unsigned long long)atomic_load(&failed), leader, next);
    assert_int_equal(atomic_load(&not_active), 0); /* never declared lost */
    assert_true(atomic_load(&ok) >= before + 4 * NSEG);
    struct kvp_msession *ms = tm_admin_session(C, "hb-test");
    assert_non_null(ms);
    for (unsigned i = 0; i < NSEG; i++)
        assert_int_equal(tm_segment_heartbeat(ms, ids[i], 3000), KVP_OK);
    kvp_msession_destroy(&ms);
}

static int setup(void **state)
{
    struct tm_cluster *c = calloc(1, sizeof *c);
    *state = c;
    return c ? 0 : -1;
}

static int teardown(void **state)
{
    tm_cluster_down(*state);
    free(*state);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_master_100_segments_heartbeat_quorum, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
