/*
 * test_failover_onecommit.c — the one-commit put across a leader SIGKILL (issue 21 goal 1;
 * docs/master.md "One-commit put"), on a real local cluster: 3 masters + 3 segments of 32 MiB,
 * 256 KiB self-checking objects read into poisoned buffers. The pool is mostly free, so every
 * leader answers PutStart from its term's reservations (no Raft entry; the test checks the
 * leader logged "one-commit put on").
 *
 * Pending intents across the kill, placed by the old leader in its reservations:
 *  - writer A (its WRITEs land 700 ms late, timeout 6 s): its PutEnd reaches the new leader,
 *    which never saw the put; it commits it from the placement the client echoes; the object
 *    reads back exactly;
 *  - writer B (WRITEs 3 s late, timeout 1.2 s): it times out, is never committed, never
 *    visible; its late WRITE frames are refused by the segment (write deadline) while the new
 *    leader hands out space; the old term's reserved space is not reused before its horizon.
 * Objects put before the kill (committed) and after it (the new leader's own reservations) all
 * read back exactly (C1, C3).
 *
 * The committed feature level (RaiseLevelCmd, actors/master/fsm/version.h): the new leader keeps
 * the one-commit put while the killed master is still down (it logs "one-commit put on" for its
 * own term before the dead master is restarted, and its status shows this binary's level committed).
 *
 * Before the kill: a Remove of a key whose put is only in the leader's memory (placed from a
 * reservation, its WRITEs late, no commit yet) answers BUSY, as for a pending put of the
 * PutStart/PutEnd path; once that put has completed, the Remove succeeds.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/master/fsm/version.h"
#include "actors/transfer/fault.h"
#include "actors/transfer/transfer.h"
#include "runtime/clock.h"
#include "tests/integration/test_failover_util.h"
#include "tests/lib/proc_reap.h"

#define OBJ (256u << 10)
#define N_BEFORE 12
#define N_AFTER 12

static struct tc_cluster CL;

static int setup(void **state)
{
    (void)state;
    setenv("KVPOOL_FENCE_GRACE_MS", "500", 1);
    return tf_cluster_start(&CL, 3, "32M");
}

static int teardown(void **state)
{
    (void)kvp_test_children_kill();
    (void)state;
    tc_cluster_down(&CL);
    return 0;
}

static void test_onecommit_pending_intents_across_failover(void **state)
{
    (void)state;
    struct tc_cluster cl = CL;
    kvp_client *c = tc_open(&cl, 20000);
    assert_non_null(c);
    uint8_t *buf = malloc(OBJ);
    assert_non_null(buf);
    /* Level 3 is known a second after the leader hears its peers; then reservations follow. */
    for (int i = 0; i < 100 && tf_log_count(&cl, "one-commit put on") == 0; i++)
        tf_sleep_ms(100);
    assert_true(tf_log_count(&cl, "one-commit put on") >= 1);
    char key[64];
    for (int i = 0; i < N_BEFORE; i++) {
        snprintf(key, sizeof key, "before-%d", i);
        tc_fill(key, buf, OBJ);
        int rc = kvp_put(c, key, buf, OBJ, NULL);
        if (rc != KVP_OK)
            fail_msg("put %s: %s", key, kvp_errname(rc));
    }
    /* Remove of a put in flight in the leader's memory: BUSY, then OK once it is committed. */
    int cready[2];
    assert_int_equal(pipe(cready), 0);
    tf_ready_w = cready[1];
    fflush(stderr);
    pid_t wc = fork();
    kvp_test_child_track(wc); /* killed at teardown if a failed assert skips its stop */
    assert_true(wc >= 0);
    if (wc == 0)
        _exit(tf_child_writer(&cl, "pend-c", OBJ, 1500, 8000, KVP_OK, false));
    close(cready[1]);
    tf_ready_w = -1;
    /* its PutStart answered from a reservation, its WRITEs posted and held 1.5 s */
    int cgot = tc_ready_wait(cready[0], 1, 30000);
    close(cready[0]);
    assert_int_equal(cgot, 1);
    int rrc = kvp_remove(c, "pend-c", false);
    if (rrc != KVP_ERR_BUSY)
        fail_msg("remove of a put in flight: %s, want BUSY", kvp_errname(rrc));
    rrc = kvp_remove(c, "pend-c", true); /* force changes nothing: the put is not an object yet */
    if (rrc != KVP_ERR_BUSY)
        fail_msg("forced remove of a put in flight: %s, want BUSY", kvp_errname(rrc));
    assert_int_equal(tf_wait_child(wc), 0);
    assert_int_equal(tf_read_exact(c, "pend-c", buf, OBJ), 1);
    assert_int_equal(kvp_remove(c, "pend-c", true), KVP_OK);
    assert_int_equal(tf_read_exact(c, "pend-c", buf, OBJ), 0);
    fflush(stderr);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    tf_ready_w = ready[1];
    pid_t wa = fork();
    kvp_test_child_track(wa);
    assert_true(wa >= 0);
    if (wa == 0)
        _exit(tf_child_writer(&cl, "pend-a", OBJ, 700, 6000, KVP_OK, false));
    pid_t wb = fork();
    kvp_test_child_track(wb);
    assert_true(wb >= 0);
    if (wb == 0)
        _exit(tf_child_writer(&cl, "pend-b", OBJ, 3000, 1200, KVP_ERR_TIMEOUT, false));
    close(ready[1]);
    tf_ready_w = -1;
    /* both PutStarts answered by the old leader from its reservations */
    int nready = tc_ready_wait(ready[0], 2, 30000);
    close(ready[0]);
    assert_int_equal(nready, 2);
    int on_before = tf_log_count(&cl, "one-commit put on");
    int dead = tf_kill_leader(&cl);
    uint64_t t_kill = kvp_clock_now_ms();
    kvp_client *q = tc_open(&cl, 8000);
    assert_non_null(q);
    for (int i = 0; i < N_AFTER; i++) {
        snprintf(key, sizeof key, "after-%d", i);
        tc_fill(key, buf, OBJ);
        int rc = kvp_put(q, key, buf, OBJ, NULL);
        if (rc != KVP_OK)
            fail_msg("put %s after the kill: %s", key, kvp_errname(rc));
        if (i == 0)
            fprintf(stderr, "first put after the kill: %llu ms\n", (unsigned long long)(kvp_clock_now_ms() - t_kill));
    }
    tc_close(&q);
    assert_int_equal(tf_wait_child(wa), 0);
    assert_int_equal(tf_wait_child(wb), 0);
    /* pend-a was committed by the new leader from the placement the old one gave it. */
    assert_true(tf_log_count(&cl, "placed by an older leader") >= 1);
    /* The killed master is still down: the new leader keeps the committed level (KVP_FEATURE_LEVEL) and makes
     * its own term's reservations (the one-commit put goes on across the failover). */
    for (int i = 0; i < 100 && tf_log_count(&cl, "one-commit put on") <= on_before; i++)
        tf_sleep_ms(100);
    if (tf_log_count(&cl, "one-commit put on") <= on_before)
        fail_msg("the new leader did not turn the one-commit put on with member %d down", dead);
    json_t *st = tf_status(&cl);
    assert_non_null(st);
    json_t *fl = json_object_get(st, "feature_level");
    int cluster_level = (int)json_integer_value(json_object_get(fl, "cluster"));
    int committed = (int)json_integer_value(json_object_get(fl, "committed"));
    fprintf(stderr, "member %d down: feature level %d, committed %d\n", dead, cluster_level, committed);
    json_decref(st);
    assert_int_equal(committed, KVP_FEATURE_LEVEL);
    assert_int_equal(cluster_level, KVP_FEATURE_LEVEL);
    /* A put now is placed from the new leader's reservations and reads back exactly. */
    snprintf(key, sizeof key, "after-down");
    tc_fill(key, buf, OBJ);
    assert_int_equal(kvp_put(c, key, buf, OBJ, NULL), KVP_OK);
    assert_int_equal(tf_read_exact(c, key, buf, OBJ), 1);
    char id[16];
    snprintf(id, sizeof id, "%d", dead);
    char *argv[] = {cl.ctl, "cluster", "restart", "--dir", cl.dir, id, NULL};
    assert_int_equal(tc_run(argv), 0);
    assert_int_equal(tf_read_exact(c, "pend-a", buf, OBJ), 1);
    assert_int_equal(tf_read_exact(c, "pend-b", buf, OBJ), 0);
    for (int i = 0; i < N_BEFORE; i++) {
        snprintf(key, sizeof key, "before-%d", i);
        assert_int_equal(tf_read_exact(c, key, buf, OBJ), 1);
    }
    for (int i = 0; i < N_AFTER; i++) {
        snprintf(key, sizeof key, "after-%d", i);
        assert_int_equal(tf_read_exact(c, key, buf, OBJ), 1);
    }
    free(buf);
    tc_close(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_onecommit_pending_intents_across_failover, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
