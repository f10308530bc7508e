/*
 * test_put_intent.c — the put's intent committed while its bytes move (feature level 6,
 * docs/master.md "Intent overlapped with the transfer (level 6)"), on a real local cluster: 3
 * masters + 3 segments of 256 MiB (reservations grow to 64 MiB), self-checking objects read into poisoned buffers.
 *
 *  - 4 MiB puts take the intent path (the leader logs its first PutIntent and its first PutEnd
 *    acknowledged before the seal commits) and each reads back exactly at once after its
 *    acknowledgement, on the same leader (read-your-writes while the seal may still be in flight);
 *  - a batch of four 1 MiB objects likewise;
 *  - a put whose WRITEs land after its timeout, its intent committed: it fails, its intent is
 *    revoked (the FSM logs it), its late frames are refused by the segment, the key is absent,
 *    and a new put of the key reads back exactly (no foreign bytes);
 *  - a put whose intent the old leader committed while its WRITEs were held, the old leader then
 *    SIGKILLed: its PutEnd reaches the new leader, which seals the intent of the older term; the
 *    object reads back exactly.
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

#define BIG (4u << 20)
#define MID (1u << 20)

static struct tc_cluster CL;

static int setup(void **state)
{
    (void)state;
    setenv("KVPOOL_FENCE_GRACE_MS", "500", 1);
    return tf_cluster_start(&CL, 3, "256M");
}

static int teardown(void **state)
{
    (void)kvp_test_children_kill();
    (void)state;
    tc_cluster_down(&CL);
    return 0;
}

/* The FSM's pending puts (intents included) in the leader's status, -1 when not read. */
static long long pending_puts(const struct tc_cluster *c)
{
    json_t *st = tf_status(c);
    if (!st)
        return -1;
    json_t *fsm = json_object_get(st, "fsm");
    long long n = json_is_integer(json_object_get(fsm ? fsm : st, "pending_puts"))
                      ? tf_jget(fsm ? fsm : st, "pending_puts")
                      : -1;
    json_decref(st);
    return n;
}

/* A counter of the leader's status soft_state (put_intents, puts_sealed_early), -1 unread. */
static long long soft(const struct tc_cluster *c, const char *name)
{
    json_t *st = tf_status(c);
    if (!st)
        return -1;
    json_t *o = json_object_get(json_object_get(st, "soft_state"), name);
    long long n = json_is_integer(o) ? (long long)json_integer_value(o) : -1;
    json_decref(st);
    return n;
}

static void put_exact(kvp_client *c, const char *key, uint8_t *buf, size_t len)
{
    tc_fill(key, buf, len);
    int rc = kvp_put(c, key, buf, len, NULL);
    if (rc != KVP_OK)
        fail_msg("put %s: %s", key, kvp_errname(rc));
    /* at once, on the same leader: the seal may not have applied yet */
    if (tf_read_exact(c, key, buf, len) != 1)
        fail_msg("get %s right after its put: NOT_FOUND", key);
}

/* Put 4 MiB probes until one is acknowledged before its seal (the leader's reservations had
 * room for it: a put that finds none takes the PutStart/PutEnd path while the next reservation
 * is committed, within a 200 ms tick). Returns how many probes it took; fails after 40. */
static int probe_intent(const struct tc_cluster *cl, kvp_client *c, uint8_t *buf, int *seq)
{
    char key[64];
    for (int k = 1; k <= 40; k++) {
        long long before = soft(cl, "puts_sealed_early");
        snprintf(key, sizeof key, "probe-%d", (*seq)++);
        put_exact(c, key, buf, BIG);
        if (soft(cl, "puts_sealed_early") > before)
            return k;
        tf_sleep_ms(50); /* the next reservation is on its way: look again */
    }
    fail_msg("no 4 MiB put was acknowledged before its seal in 40 puts");
    return 0;
}

static void test_put_intent_paths(void **state)
{
    (void)state;
    struct tc_cluster cl = CL;
    kvp_client *c = tc_open(&cl, 8000); /* ttl = timeout + 2 s <= 15 s: placed from reservations */
    assert_non_null(c);
    uint8_t *buf = malloc(BIG);
    assert_non_null(buf);
    for (int i = 0; i < 100 && tf_log_count(&cl, "cluster feature level 6 committed") == 0; i++)
        tf_sleep_ms(100);
    assert_true(tf_log_count(&cl, "cluster feature level 6 committed") >= 1);
    for (int i = 0; i < 100 && tf_log_count(&cl, "one-commit put on") == 0; i++)
        tf_sleep_ms(100);
    int seq = 0;
    char key[64];
    probe_intent(&cl, c, buf, &seq);
    assert_true(tf_log_count(&cl, "first PutIntent") >= 1);
    assert_true(tf_log_count(&cl, "PutEnd acknowledged before its seal commits") >= 1);
    /* more 4 MiB puts, each read at once (whichever path each took) */
    for (int k = 0; k < 10; k++) {
        snprintf(key, sizeof key, "big-%d", k);
        put_exact(c, key, buf, BIG);
    }
    /* a batch of four 1 MiB objects, by the intent path */
    long long early = 0;
    for (int attempt = 0; attempt < 3; attempt++) {
        probe_intent(&cl, c, buf, &seq);
        long long before = soft(&cl, "puts_sealed_early");
        uint8_t *bb[4];
        const char *keys[4];
        char kb[4][32];
        const void *bufs[4];
        size_t lens[4];
        int res[4];
        for (int k = 0; k < 4; k++) {
            bb[k] = malloc(MID);
            assert_non_null(bb[k]);
            snprintf(kb[k], sizeof kb[k], "batch-%d-%d", attempt, k);
            keys[k] = kb[k];
            tc_fill(kb[k], bb[k], MID);
            bufs[k] = bb[k];
            lens[k] = MID;
        }
        assert_int_equal(kvp_batch_put(c, 4, keys, bufs, lens, NULL, res), KVP_OK);
        for (int k = 0; k < 4; k++) {
            if (res[k] != KVP_OK)
                fail_msg("batch put %s: %s", kb[k], kvp_errname(res[k]));
            assert_int_equal(tf_read_exact(c, kb[k], bb[k], MID), 1);
        }
        for (int k = 0; k < 4; k++)
            free(bb[k]);
        early = soft(&cl, "puts_sealed_early") - before;
        if (early >= 4)
            break;
    }
    if (early < 4)
        fail_msg("no batch of four 1 MiB objects was acknowledged before its seal in 3 tries");
    for (int k = 0; k < 10; k++) { /* sealed by now, still exact */
        snprintf(key, sizeof key, "big-%d", k);
        assert_int_equal(tf_read_exact(c, key, buf, BIG), 1);
    }

    /* A put whose transfer fails after its intent committed: revoked, nothing visible. */
    bool done = false;
    for (int attempt = 0; attempt < 3 && !done; attempt++) {
        probe_intent(&cl, c, buf, &seq);
        long long before = soft(&cl, "put_intents");
        char fk[32];
        snprintf(fk, sizeof fk, "fail-%d", attempt);
        fflush(stderr);
        pid_t w = fork();
        kvp_test_child_track(w);
        assert_true(w >= 0);
        if (w == 0)
            _exit(tf_child_writer(&cl, fk, BIG, 3000, 1500, KVP_ERR_TIMEOUT, false));
        assert_int_equal(tf_wait_child(w), 0);
        assert_int_equal(tf_read_exact(c, fk, buf, BIG), 0);
        if (soft(&cl, "put_intents") <= before)
            continue; /* it found no reservation room: the PutStart path (tested elsewhere) */
        char what[64];
        snprintf(what, sizeof what, "intent of %s ", fk);
        for (int k = 0; k < 100 && tf_log_count(&cl, what) == 0; k++)
            tf_sleep_ms(50);
        if (tf_log_count(&cl, what) == 0)
            fail_msg("the failed put's intent (%s) was not revoked", fk);
        long long pend = -1;
        for (int k = 0; k < 100 && (pend = pending_puts(&cl)) != 0; k++)
            tf_sleep_ms(50);
        assert_int_equal(pend, 0); /* no intent left behind */
        assert_int_equal(tf_read_exact(c, fk, buf, BIG), 0);
        put_exact(c, fk, buf, BIG); /* the key is free again */
        done = true;
    }
    if (!done)
        fail_msg("no failing put sent its intent in 3 tries");

    /* The old leader commits a put's intent, dies; the new leader seals it at its PutEnd. */
    done = false;
    for (int attempt = 0; attempt < 3 && !done; attempt++) {
        probe_intent(&cl, c, buf, &seq);
        long long before = soft(&cl, "put_intents");
        char ak[32];
        snprintf(ak, sizeof ak, "across-%d", attempt);
        int ready[2];
        assert_int_equal(pipe(ready), 0);
        tf_ready_w = ready[1];
        fflush(stderr);
        pid_t wa = fork();
        kvp_test_child_track(wa);
        assert_true(wa >= 0);
        if (wa == 0)
            _exit(tf_child_writer(&cl, ak, BIG, 1500, 8000, KVP_OK, false));
        close(ready[1]);
        tf_ready_w = -1;
        int got = tc_ready_wait(ready[0], 1, 30000);
        close(ready[0]);
        assert_int_equal(got, 1);
        /* its intent committed by this leader while its WRITEs are held 1.5 s */
        for (int k = 0; k < 100 && soft(&cl, "put_intents") <= before; k++)
            tf_sleep_ms(10);
        if (soft(&cl, "put_intents") <= before) {
            assert_int_equal(tf_wait_child(wa), 0); /* the PutStart path: not this case */
            assert_int_equal(tf_read_exact(c, ak, buf, BIG), 1);
            continue;
        }
        int sealed_before = tf_log_count(&cl, "PutEnd acknowledged before its seal commits");
        (void)tf_kill_leader(&cl);
        assert_int_equal(tf_wait_child(wa), 0);
        assert_int_equal(tf_read_exact(c, ak, buf, BIG), 1);
        /* sealed by the new leader without a commit on its path (its first such line) */
        assert_true(tf_log_count(&cl, "PutEnd acknowledged before its seal commits") > sealed_before);
        done = true;
    }
    if (!done)
        fail_msg("no put's intent was committed before the kill in 3 tries");
    for (int k = 0; k < 10; k++) {
        snprintf(key, sizeof key, "big-%d", k);
        assert_int_equal(tf_read_exact(c, key, buf, BIG), 1);
    }
    free(buf);
    tc_close(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_put_intent_paths, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
