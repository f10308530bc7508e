/*
 * test_failover_write.c — the write path across a leader SIGKILL (issue 21), on a real local
 * cluster: 3 masters + 3 segments of 4 MiB (12 MiB pool), 256 KiB self-checking objects read
 * into poisoned buffers. Settings chosen so that the old rule ("a new leader frees nothing for
 * one lease TTL") and the new one (lease horizons committed with every command that frees space,
 * docs/master.md "Leases and failover") give different outcomes: default_kv_lease_ttl 6 s,
 * fence_grace_ms 500, no headroom eviction (puts wait for space only when the pool is full).
 *
 *  1. full pool: the pool is filled, the first leader's election grace waited out, a quarter of
 *     the pool removed (quarantined, not yet reusable) and the leader killed at once. The first
 *     put after the kill succeeds inside the lease TTL (its time is printed, 613 ms in one run;
 *     the bound asserted is LEASE_MS itself: the old rule frees nothing for a lease TTL counted
 *     from the new leader's election, which is after the kill, so it can never be under
 *     LEASE_MS (6,998 ms against commit 5aeb1d2's binaries), while a loaded machine gets the
 *     whole TTL for the election; it was LEASE_MS - 1500 ms before); every
 *     object written before and after the kill reads back exactly or, removed or evicted, is
 *     NOT_FOUND (C1, C3).
 *  2. pending intents, an old-term writer and a leased reader across one kill, the pool full
 *     but for six objects:
 *     - writer A (its WRITEs land 700 ms late, timeout 6 s): its put started under the old leader
 *       completes under the new one and reads back exactly;
 *     - writer B (WRITEs 3 s late, timeout 1.2 s): its put times out; its late WRITE frames reach
 *       the segment after the new leader has handed out space (the parent's puts) and are
 *       refused there (write deadline); the key is never visible;
 *     - reader R (its READ answered 1.5 s late) got its replica list and lease from the old
 *       leader; the new leader force-removes that object and the parent's puts wait for space:
 *       R gets the exact bytes or a clean error, never CORRUPT (another object's bytes).
 *     Then every object reads back exactly, or is NOT_FOUND where removed, revoked or evicted
 *     (the objects that must stay are soft-pinned, allow_evict_soft_pinned_objects=false).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "actors/transfer/fault.h"
#include "actors/transfer/transfer.h"
#include "runtime/clock.h"
#include "tests/integration/test_failover_util.h"
#include "tests/lib/proc_reap.h"

#define SEG_SIZE_STR "4M"
#define OBJ (256u << 10)
#define POOL_OBJS 48 /* 12 MiB / 256 KiB */
#define LEASE_MS 6000

/* The test's cluster: started by setup, stopped by teardown, also when the test fails. */
static struct tc_cluster CL;

static int cluster_start(struct tc_cluster *c)
{
    setenv("KVPOOL_FENCE_GRACE_MS", "500", 1);
    setenv("KVPOOL_DEFAULT_KV_LEASE_TTL", "6000", 1);
    setenv("KVPOOL_EVICTION_HEADROOM_FACTOR", "0", 1);
    setenv("KVPOOL_EVICTION_HIGH_WATERMARK_RATIO", "1.0", 1);
    /* the objects a test must find again are soft-pinned: the new leader, which has no access
     * times yet, may evict any other */
    setenv("KVPOOL_ALLOW_EVICT_SOFT_PINNED_OBJECTS", "false", 1);
    return tf_cluster_start(c, 3, SEG_SIZE_STR);
}

static int setup(void **state)
{
    (void)state;
    return cluster_start(&CL);
}

static int teardown(void **state)
{
    (void)kvp_test_children_kill();
    (void)state;
    tc_cluster_down(&CL);
    return 0;
}

/* Fill the pool with n objects PREFIX-i; asserts every put succeeds. */
static void fill(kvp_client *c, const char *prefix, int n, uint8_t *buf)
{
    char key[64];
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "%s-%d", prefix, i);
        tc_fill(key, buf, OBJ);
        int rc = kvp_put(c, key, buf, OBJ, NULL);
        if (rc != KVP_OK)
            fail_msg("put %s: %s", key, kvp_errname(rc));
    }
}

static void assert_pool_full(const struct tc_cluster *c)
{
    json_t *st = tf_status(c);
    assert_non_null(st);
    long long cap = tf_jget(st, "capacity_bytes"), used = tf_jget(st, "used_bytes");
    long long q = tf_jget(st, "quarantined_bytes");
    json_decref(st);
    fprintf(stderr, "pool: capacity %lld, used %lld, quarantined %lld\n", cap, used, q);
    assert_true(cap - used - q < (long long)OBJ);
}

static void test_failover_full_pool_first_put_within_bound(void **state)
{
    (void)state;
    struct tc_cluster cl = CL;
    kvp_client *c = tc_open(&cl, 20000);
    assert_non_null(c);
    uint8_t *buf = malloc(OBJ);
    assert_non_null(buf);
    fill(c, "a", POOL_OBJS, buf);
    assert_pool_full(&cl);
    char key[64];
    /* Un-forced removes are refused during a leader's election grace: wait for the first
     * leader's to end (the cluster just started). */
    for (int i = 0; i < 200; i++) {
        json_t *st = tf_status(&cl);
        bool grace = !st || json_is_true(json_object_get(json_object_get(st, "node"), "in_election_grace"));
        json_decref(st);
        if (!grace)
            break;
        tf_sleep_ms(100);
    }
    /* What the filling evicted comes back as its quarantine is released (fence_grace_ms after
     * each eviction, at the leader's pace): fill it again until nothing is quarantined and less
     * than one object is free, so the removes below are the only quarantined space at the kill. */
    int n_z = 0;
    for (int round = 0; round < 100; round++) {
        json_t *st = tf_status(&cl);
        assert_non_null(st);
        long long q_b = tf_jget(st, "quarantined_bytes");
        long long free_b = tf_jget(st, "capacity_bytes") - tf_jget(st, "used_bytes") - q_b;
        json_decref(st);
        int more = (int)(free_b / (long long)OBJ);
        if (more == 0 && q_b == 0)
            break;
        for (int i = 0; i < more; i++, n_z++) {
            snprintf(key, sizeof key, "z-%d", n_z);
            tc_fill(key, buf, OBJ);
            int rc = kvp_put(c, key, buf, OBJ, NULL);
            if (rc != KVP_OK)
                fail_msg("put %s: %s", key, kvp_errname(rc));
        }
        if (more == 0)
            tf_sleep_ms(100);
    }
    /* a quarter of the pool freed (no leases: nothing was read), then the leader dies before
     * its quarantine (fence_grace_ms 500) can have been released by it */
    bool removed[POOL_OBJS] = {false};
    int n_removed = 0;
    for (int i = 0; i < POOL_OBJS && n_removed < POOL_OBJS / 4; i++) {
        snprintf(key, sizeof key, "a-%d", i);
        int rc = kvp_remove(c, key, false);
        if (rc == KVP_ERR_NOT_FOUND)
            continue; /* evicted while the pool filled */
        assert_int_equal(rc, KVP_OK);
        removed[i] = true;
        n_removed++;
    }
    /* the refill may have evicted most a-*: take the rest of the quarter from z-* (their final
     * check below accepts NOT_FOUND) */
    for (int i = 0; i < n_z && n_removed < POOL_OBJS / 4; i++) {
        snprintf(key, sizeof key, "z-%d", i);
        int rc = kvp_remove(c, key, false);
        if (rc == KVP_ERR_NOT_FOUND)
            continue;
        assert_int_equal(rc, KVP_OK);
        n_removed++;
    }
    assert_int_equal(n_removed, POOL_OBJS / 4);
    fprintf(stderr, "filled again with %d objects; removed %d\n", n_z, n_removed);
    /* Space can come free meanwhile without any remove: the leader retires the unused part of
     * its per-term reservations (one-commit put, docs/master.md). Fill that too, so that the
     * quarter removed above is the only space a put can get right after the kill. The read that
     * finds less than one object free is the precondition: a second read could see a reservation
     * retired after it (the kill follows at once, and a retired reservation only gives the first
     * put after the kill more room, never less). */
    bool full = false;
    for (int round = 0; round < 50 && !full; round++) {
        json_t *st = tf_status(&cl);
        assert_non_null(st);
        long long cap = tf_jget(st, "capacity_bytes"), used = tf_jget(st, "used_bytes");
        long long q = tf_jget(st, "quarantined_bytes");
        json_decref(st);
        long long free_b = cap - used - q;
        if (free_b < (long long)OBJ) {
            fprintf(stderr, "pool: capacity %lld, used %lld, quarantined %lld\n", cap, used, q);
            full = true;
            break;
        }
        for (long long i = 0; i < free_b / (long long)OBJ; i++, n_z++) {
            snprintf(key, sizeof key, "z-%d", n_z);
            tc_fill(key, buf, OBJ);
            int rc = kvp_put(c, key, buf, OBJ, NULL);
            if (rc != KVP_OK)
                fail_msg("put %s: %s", key, kvp_errname(rc));
        }
    }
    assert_true(full);
    tf_kill_leader(&cl);
    uint64_t t_kill = kvp_clock_now_ms();
    uint64_t first_ok = 0;
    for (int i = 0; i < n_removed; i++) {
        snprintf(key, sizeof key, "b-%d", i);
        tc_fill(key, buf, OBJ);
        kvp_put_opts pin = {.soft_pin = true}; /* checked at the end: never evicted */
        int rc = kvp_put(c, key, buf, OBJ, &pin);
        if (rc != KVP_OK)
            fail_msg("put %s after the kill: %s", key, kvp_errname(rc));
        if (!first_ok)
            first_ok = kvp_clock_now_ms();
    }
    uint64_t dt = first_ok - t_kill;
    fprintf(stderr, "full pool: first put after the leader kill acknowledged %llu ms after the kill "
                    "(lease TTL %d ms: the old rule waited at least that long)\n",
            (unsigned long long)dt, LEASE_MS);
    /* Under the old rule dt >= LEASE_MS always (see the file comment); no margin needed. */
    if (dt >= LEASE_MS)
        fail_msg("first put %llu ms after the kill: not inside the lease TTL (%d ms)", (unsigned long long)dt,
                 LEASE_MS);
    /* C1 / C3: every object is exact, or absent when removed (or evicted) */
    int present = 0;
    for (int i = 0; i < POOL_OBJS; i++) {
        snprintf(key, sizeof key, "a-%d", i);
        int r = tf_read_exact(c, key, buf, OBJ);
        if (removed[i])
            assert_int_equal(r, 0);
        present += r;
    }
    for (int i = 0; i < n_z; i++) {
        snprintf(key, sizeof key, "z-%d", i);
        present += tf_read_exact(c, key, buf, OBJ);
    }
    for (int i = 0; i < n_removed; i++) {
        snprintf(key, sizeof key, "b-%d", i);
        assert_int_equal(tf_read_exact(c, key, buf, OBJ), 1);
    }
    fprintf(stderr, "%d objects written before the kill still present, %d removed, %d written after it\n",
            present, n_removed, n_removed);
    free(buf);
    tc_close(&c);
}

/* Child: get KEY with its READs answered late_ms late. Exit 0 on the exact bytes, 1 on a clean
 * error other than CORRUPT, 20 on CORRUPT or other bytes. */
static int child_reader(const struct tc_cluster *cl, const char *key, unsigned late_ms)
{
    struct kvp_xfer_fault_rule rule = {.action = KVP_FAULT_LATE, .transport = KVP_FAULT_TCP,
                                       .op = KVP_XFER_READ, .ms = late_ms};
    if (kvp_xfer_fault_add(&rule) != KVP_OK)
        return 10;
    kvp_client *c = tc_open(cl, 10000);
    uint8_t *buf = malloc(OBJ);
    if (!c || !buf)
        return 11;
    tc_ready_watch_start(tf_ready_w);
    memset(buf, TC_POISON, OBJ);
    int64_t n = kvp_get(c, key, buf, OBJ, 0);
    fprintf(stderr, "reader %s: %s\n", key, n == (int64_t)OBJ ? "exact size" : kvp_errname((int)n));
    int ret = 1;
    if (n == (int64_t)OBJ)
        ret = tc_check(key, buf, OBJ) ? 0 : 20;
    else if (n == KVP_ERR_CORRUPT)
        ret = 20;
    kvp_xfer_fault_quiesce(15000);
    tc_close(&c);
    free(buf);
    return ret;
}

static void test_failover_pending_intents_old_writer_leased_reader(void **state)
{
    (void)state;
    struct tc_cluster cl = CL;
    kvp_client *c = tc_open(&cl, 20000);
    assert_non_null(c);
    uint8_t *buf = malloc(OBJ);
    assert_non_null(buf);
    /* the pool full but for the two pending puts and four more objects */
    const int n_p = POOL_OBJS - 6;
    fill(c, "p", n_p, buf);
    fflush(stderr);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    tf_ready_w = ready[1];
    pid_t reader = fork();
    kvp_test_child_track(reader); /* killed at teardown if a failed assert skips its stop */
    assert_true(reader >= 0);
    if (reader == 0)
        _exit(child_reader(&cl, "p-5", 1500));
    pid_t wa = fork();
    kvp_test_child_track(wa);
    assert_true(wa >= 0);
    if (wa == 0)
        _exit(tf_child_writer(&cl, "pend-a", OBJ, 700, 6000, KVP_OK, true));
    pid_t wb = fork();
    kvp_test_child_track(wb);
    assert_true(wb >= 0);
    if (wb == 0)
        _exit(tf_child_writer(&cl, "pend-b", OBJ, 3000, 1200, KVP_ERR_TIMEOUT, false));
    close(ready[1]);
    tf_ready_w = -1;
    /* the children's PutStarts and GetReplicaList are answered by the old leader */
    int nready = tc_ready_wait(ready[0], 3, 30000);
    close(ready[0]);
    assert_int_equal(nready, 3);
    tf_kill_leader(&cl);
    uint64_t t_kill = kvp_clock_now_ms();
    /* The new leader: force-remove the object the reader holds a lease on (its space is held
     * past the election grace), then puts: the first ones take the free space (the new
     * leader's first allocations, before pend-b's late frames arrive), the next ones wait for
     * space while the reader's READ and pend-b's frames are still on their way. */
    kvp_client *q = tc_open(&cl, 4000);
    assert_non_null(q);
    int rc = KVP_ERR_UNAVAILABLE;
    for (int i = 0; i < 100 && (rc = kvp_remove(q, "p-5", true)) != KVP_OK; i++)
        tf_sleep_ms(50);
    assert_int_equal(rc, KVP_OK);
    char key[64];
    int put_ok[6] = {0};
    kvp_put_opts pin = {.soft_pin = true}; /* checked at the end: never evicted */
    for (int i = 0; i < 6; i++) {
        snprintf(key, sizeof key, "q-%d", i);
        tc_fill(key, buf, OBJ);
        rc = kvp_put(q, key, buf, OBJ, &pin);
        fprintf(stderr, "put %s after the kill: %s at %llu ms\n", key, kvp_errname(rc),
                (unsigned long long)(kvp_clock_now_ms() - t_kill));
        put_ok[i] = rc == KVP_OK;
        if (rc != KVP_OK)
            assert_true(rc == KVP_ERR_NO_SPACE || rc == KVP_ERR_TIMEOUT);
    }
    assert_true(put_ok[0]); /* free space: no wait for any grace */
    tc_close(&q);
    int r = tf_wait_child(reader);
    fprintf(stderr, "reader across the failover: %s\n", r == 0 ? "exact bytes" : r == 1 ? "clean error" : "BAD");
    assert_true(r == 0 || r == 1);
    assert_int_equal(tf_wait_child(wa), 0);
    assert_int_equal(tf_wait_child(wb), 0);
    /* C1 / C3 everywhere: pend-a (completed across the kill) exact; pend-b (revoked) and p-5
     * (removed) absent; everything else exact, or absent where the new leader evicted it */
    assert_int_equal(tf_read_exact(c, "pend-a", buf, OBJ), 1);
    assert_int_equal(tf_read_exact(c, "pend-b", buf, OBJ), 0);
    assert_int_equal(tf_read_exact(c, "p-5", buf, OBJ), 0);
    int present = 0;
    for (int i = 0; i < n_p; i++) {
        snprintf(key, sizeof key, "p-%d", i);
        present += tf_read_exact(c, key, buf, OBJ);
    }
    for (int i = 0; i < 6; i++) {
        snprintf(key, sizeof key, "q-%d", i);
        if (put_ok[i])
            assert_int_equal(tf_read_exact(c, key, buf, OBJ), 1);
    }
    fprintf(stderr, "%d of %d older objects still present (the rest evicted)\n", present, n_p - 1);
    free(buf);
    tc_close(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_failover_full_pool_first_put_within_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failover_pending_intents_old_writer_leased_reader, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
