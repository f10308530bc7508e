/*
 * test_client_cluster.c — the client library against a real local cluster: 3 kvpool-master
 * (Raft) + 3 kvpool-segment processes started with `kvpoolctl cluster up`, two client
 * processes (fork), an embedded-mode client. Sizes 1 B .. the largest a segment holds, batches
 * of 1/32/1,024 keys, replica_num 1/2/3, the batch cases of issue 4 item 4. Every payload
 * derives from its key; every read buffer is poisoned first.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/integration/test_batch_util.h"
#include "tests/integration/test_client_util.h"
#include "tests/lib/proc_reap.h"

#define SEG_SIZE_STR "256M"
#define SEG_BYTES (256ull << 20)

static struct tc_cluster CL;

static int setup(void **state)
{
    (void)state;
    if (tc_cluster_up(&CL, 3, SEG_SIZE_STR) != 0) {
        fprintf(stderr, "kvpoolctl cluster up failed (dir %s)\n", CL.dir);
        tc_cluster_down(&CL);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)kvp_test_children_kill();
    (void)state;
    tc_cluster_down(&CL);
    return 0;
}

static kvp_client *open_or_fail(uint32_t timeout_ms)
{
    kvp_client *c = tc_open(&CL, timeout_ms);
    assert_non_null(c);
    return c;
}

static void roundtrip(kvp_client *c, const char *key, size_t len, uint32_t replicas)
{
    uint8_t *src = malloc(len), *dst = malloc(len + 64);
    assert_non_null(src);
    assert_non_null(dst);
    tc_fill(key, src, len);
    kvp_put_opts o = {.replica_num = replicas};
    int rc = kvp_put(c, key, src, len, &o);
    if (rc != KVP_OK)
        fprintf(stderr, "put %s (%zu bytes, r%u): %s\n", key, len, replicas, kvp_errname(rc));
    assert_int_equal(rc, KVP_OK);
    memset(dst, TC_POISON, len + 64);
    assert_int_equal(kvp_get(c, key, dst, len + 64, 0), (int64_t)len);
    assert_true(tc_check(key, dst, len));
    assert_true(tc_all_poison(dst + len, 64));
    assert_int_equal(kvp_exists(c, key), 1);
    assert_int_equal(kvp_get_size(c, key), (int64_t)len);
    free(src);
    free(dst);
}

/* First, on the empty cluster: an object as large as a whole segment; one byte more is too large. */
static void test_client_cluster_largest_object_roundtrip(void **state)
{
    (void)state;
    kvp_client *c = open_or_fail(60000);
    roundtrip(c, "largest", SEG_BYTES, 1);
    uint8_t *b = malloc(SEG_BYTES + 1); /* never filled: the master refuses before any transfer */
    assert_non_null(b);
    int rc = kvp_put(c, "too-large", b, SEG_BYTES + 1, NULL);
    free(b);
    assert_true(rc == KVP_ERR_TOO_LARGE || rc == KVP_ERR_NO_SPACE);
    assert_int_equal(kvp_exists(c, "too-large"), 0);
    assert_int_equal(kvp_remove(c, "largest", true), KVP_OK);
    assert_int_equal(kvp_exists(c, "largest"), 0);
    tc_close(&c);
}

static void test_client_cluster_sizes_replicas_roundtrip(void **state)
{
    (void)state;
    kvp_client *c = open_or_fail(30000);
    const size_t sizes[] = {1, 4096, 1u << 20, 64u << 20};
    char key[64];
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (uint32_t r = 1; r <= 3; r++) {
            snprintf(key, sizeof key, "size-%zu-r%u", sizes[s], r);
            roundtrip(c, key, sizes[s], r);
        }
    tc_close(&c);
}

/* keys "<tag>-r<replicas>-<i>", lengths len + i % 5 */
static void batch_roundtrip(kvp_client *c, size_t n, size_t len, uint32_t replicas, const char *tag)
{
    char prefix[48];
    snprintf(prefix, sizeof prefix, "%s-r%u", tag, replicas);
    tb_batch_roundtrip(c, n, prefix, len, 5, replicas);
}

static void test_client_cluster_batches_roundtrip(void **state)
{
    (void)state;
    kvp_client *c = open_or_fail(30000);
    for (uint32_t r = 1; r <= 3; r++) {
        batch_roundtrip(c, 1, 4096, r, "b1");
        batch_roundtrip(c, 32, 4096, r, "b32");
        batch_roundtrip(c, 1024, 4096, r, "b1024");
    }
    tc_close(&c);
}

static void test_client_cluster_batch_semantics(void **state)
{
    (void)state;
    kvp_client *c = open_or_fail(10000);
    /* one existing key in a batch_put: EXISTS for it only, the others stored */
    uint8_t old[777], v[4][2000];
    tc_fill("sem-old", old, sizeof old);
    assert_int_equal(kvp_put(c, "sem-2", old, sizeof old, NULL), KVP_OK);
    const char *keys[4] = {"sem-0", "sem-1", "sem-2", "sem-3"};
    const void *bufs[4];
    size_t lens[4];
    int res[4];
    for (int i = 0; i < 4; i++) {
        tc_fill(keys[i], v[i], sizeof v[i]);
        bufs[i] = v[i];
        lens[i] = sizeof v[i];
    }
    kvp_put_opts o2 = {.replica_num = 2};
    assert_int_equal(kvp_batch_put(c, 4, keys, bufs, lens, &o2, res), KVP_OK);
    assert_int_equal(res[0], KVP_OK);
    assert_int_equal(res[1], KVP_OK);
    assert_int_equal(res[2], KVP_ERR_EXISTS);
    assert_int_equal(res[3], KVP_OK);
    assert_int_equal(kvp_get_size(c, "sem-2"), (int64_t)sizeof old); /* untouched */

    /* the same key twice in one batch_get: both slots filled */
    /* the too-small buffers are 100 bytes in the middle of poisoned guard blocks: a write past
     * (or before) them shows; the slots' buffers do not overlap (kvpool.h) */
    uint8_t b0[2000], b1[2000], guard1[4096], guard3[4096];
    uint8_t *small = guard3 + 2048;
    memset(b0, TC_POISON, sizeof b0);
    memset(b1, TC_POISON, sizeof b1);
    memset(guard1, TC_POISON, sizeof guard1);
    memset(guard3, TC_POISON, sizeof guard3);
    const char *gk[4] = {"sem-1", "sem-missing", "sem-1", "sem-3"};
    void *gb[4] = {b0, guard1 + 2048, b1, small};
    size_t gc[4] = {sizeof b0, 100, sizeof b1, 100};
    int64_t gr[4];
    assert_int_equal(kvp_batch_get(c, 4, gk, gb, gc, 0, gr), KVP_OK);
    assert_int_equal(gr[0], 2000);
    assert_int_equal(gr[1], KVP_ERR_NOT_FOUND);
    assert_int_equal(gr[2], 2000);
    assert_int_equal(gr[3], KVP_ERR_BUFFER_TOO_SMALL); /* the needed size: */
    assert_int_equal(kvp_get_size(c, "sem-3"), 2000);
    assert_true(tc_check("sem-1", b0, sizeof b0));
    assert_true(tc_check("sem-1", b1, sizeof b1));
    assert_true(tc_all_poison(guard1, sizeof guard1));
    assert_true(tc_all_poison(guard3, sizeof guard3)); /* nothing written into or past a too-small buffer */
    assert_int_equal(kvp_get(c, "sem-3", small, 100, 0), KVP_ERR_BUFFER_TOO_SMALL);
    assert_true(tc_all_poison(guard3, sizeof guard3));
    /* one byte short, as an iov split in two: still too small, nothing written */
    kvp_iov iv[2] = {{guard3 + 1000, 1000}, {guard3 + 2500, 999}};
    const kvp_iov *ivs[1] = {iv};
    size_t cnt[1] = {2};
    const char *k3[1] = {"sem-3"};
    int64_t r3[1] = {0};
    assert_int_equal(kvp_batch_get_iov(c, 1, k3, ivs, cnt, 0, r3), KVP_OK);
    assert_int_equal(r3[0], KVP_ERR_BUFFER_TOO_SMALL);
    assert_true(tc_all_poison(guard3, sizeof guard3));
    tc_close(&c);
}

/* Two client processes race on the same keys: exactly one put per key succeeds. */
static void test_client_cluster_two_processes_race_one_stores(void **state)
{
    (void)state;
    enum { K = 24 };
    int to_child[2], to_parent[2];
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(to_parent), 0);
    pid_t pid = fork();
    kvp_test_child_track(pid); /* killed at teardown if a failed assert skips its stop */
    assert_true(pid >= 0);
    if (pid == 0) {
        /* child: own client; report its K put results then its read check */
        kvp_client *c = tc_open(&CL, 10000);
        int ready = c ? 1 : 0;
        if (write(to_parent[1], &ready, sizeof ready) != sizeof ready || !c)
            _exit(1);
        char go;
        if (read(to_child[0], &go, 1) != 1)
            _exit(1);
        int results[K];
        for (int i = 0; i < K; i++) {
            char key[32];
            snprintf(key, sizeof key, "race-%d", i);
            uint8_t buf[50000];
            tc_fill(key, buf, sizeof buf);
            results[i] = kvp_put(c, key, buf, sizeof buf, NULL);
        }
        if (write(to_parent[1], results, sizeof results) != sizeof results)
            _exit(1);
        /* wait for the parent's puts, then read every key back */
        if (read(to_child[0], &go, 1) != 1)
            _exit(1);
        int ok = 1;
        for (int i = 0; i < K; i++) {
            char key[32];
            snprintf(key, sizeof key, "race-%d", i);
            uint8_t buf[50000];
            memset(buf, TC_POISON, sizeof buf);
            if (kvp_get(c, key, buf, sizeof buf, 0) != (int64_t)sizeof buf || !tc_check(key, buf, sizeof buf))
                ok = 0;
        }
        if (write(to_parent[1], &ok, sizeof ok) != sizeof ok)
            _exit(1);
        tc_close(&c);
        _exit(0);
    }
    kvp_client *c = open_or_fail(10000);
    int ready = 0;
    assert_int_equal(read(to_parent[0], &ready, sizeof ready), sizeof ready);
    assert_int_equal(ready, 1);
    assert_int_equal(write(to_child[1], "g", 1), 1);
    int mine[K], theirs[K];
    for (int i = K - 1; i >= 0; i--) { /* opposite order: the two meet in the middle */
        char key[32];
        snprintf(key, sizeof key, "race-%d", i);
        uint8_t buf[50000];
        tc_fill(key, buf, sizeof buf);
        mine[i] = kvp_put(c, key, buf, sizeof buf, NULL);
    }
    assert_int_equal(read(to_parent[0], theirs, sizeof theirs), sizeof theirs);
    for (int i = 0; i < K; i++) {
        if (!((mine[i] == KVP_OK && theirs[i] == KVP_ERR_EXISTS) || (mine[i] == KVP_ERR_EXISTS && theirs[i] == KVP_OK)))
            fail_msg("race-%d: this process's put %s, the other's %s (want one OK, one EXISTS)", i,
                     kvp_errname(mine[i]), kvp_errname(theirs[i]));
        char key[32];
        snprintf(key, sizeof key, "race-%d", i);
        assert_int_equal(kvp_exists(c, key), 1);
    }
    assert_int_equal(write(to_child[1], "g", 1), 1);
    int child_ok = 0;
    assert_int_equal(read(to_parent[0], &child_ok, sizeof child_ok), sizeof child_ok);
    assert_int_equal(child_ok, 1);
    int st = 0;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(to_child[0]);
    close(to_child[1]);
    close(to_parent[0]);
    close(to_parent[1]);
    tc_close(&c);
}

/* Embedded mode: a client contributing 64 MiB; its objects are readable by another client,
 * and after it closes (unmount) the objects it held a replica of are still readable from the
 * other replicas. */
static void test_client_cluster_embedded_segment_roundtrip(void **state)
{
    (void)state;
    kvp_config *cfg = NULL;
    assert_int_equal(kvp_config_new(&cfg), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "cluster_file", CL.file), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "global_segment_size", "64M"), KVP_OK);
    kvp_client *e = NULL;
    assert_int_equal(kvp_client_open(cfg, &e), KVP_OK);
    kvp_config_destroy(&cfg);
    kvp_client *c = open_or_fail(10000);
    enum { N = 16 };
    kvp_put_opts o = {.replica_num = 4}; /* 3 daemons + the embedded segment: one lands locally */
    for (int i = 0; i < N; i++) {
        char key[32];
        snprintf(key, sizeof key, "emb-%d", i);
        uint8_t buf[100000];
        tc_fill(key, buf, sizeof buf);
        assert_int_equal(kvp_put(e, key, buf, sizeof buf, &o), KVP_OK);
        memset(buf, TC_POISON, sizeof buf);
        assert_int_equal(kvp_get(e, key, buf, sizeof buf, 0), (int64_t)sizeof buf);
        assert_true(tc_check(key, buf, sizeof buf));
        memset(buf, TC_POISON, sizeof buf);
        assert_int_equal(kvp_get(c, key, buf, sizeof buf, 0), (int64_t)sizeof buf);
        assert_true(tc_check(key, buf, sizeof buf));
    }
    tc_close(&e);
    for (int i = 0; i < N; i++) {
        char key[32];
        snprintf(key, sizeof key, "emb-%d", i);
        uint8_t buf[100000];
        memset(buf, TC_POISON, sizeof buf);
        assert_int_equal(kvp_get(c, key, buf, sizeof buf, 0), (int64_t)sizeof buf);
        assert_true(tc_check(key, buf, sizeof buf));
    }
    tc_close(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_cluster_largest_object_roundtrip),
        cmocka_unit_test(test_client_cluster_sizes_replicas_roundtrip),
        cmocka_unit_test(test_client_cluster_batches_roundtrip),
        cmocka_unit_test(test_client_cluster_batch_semantics),
        cmocka_unit_test(test_client_cluster_two_processes_race_one_stores),
        cmocka_unit_test(test_client_cluster_embedded_segment_roundtrip),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
