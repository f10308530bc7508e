/*
 * test_verify_cluster.c — `kvpoolctl verify` (the Verify RPC and the leader's range verifier,
 * issue 21; docs/master.md "Range verification") on a real cluster: three kvpool-master
 * processes and one kvpool-segment daemon from `kvpoolctl cluster up`, and this process's client
 * with an embedded segment, whose region the test can reach to corrupt a replica on purpose.
 *  - objects put with two replicas (one in each segment): every replica MATCH, exit 0;
 *  - a missing key: NOT_FOUND, exit 3;
 *  - one byte of the embedded replica flipped: that replica MISMATCH (with the checksum of the
 *    bytes now there), the daemon's MATCH, exit 1; a get still returns the exact bytes (from the
 *    good replica); the byte restored: MATCH again.
 * Self-checking payloads (tc_fill); every wait is a bounded call, no sleeps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "actors/client/client_state.h"
#include "actors/segment/segment_state.h"
#include "tests/integration/test_client_util.h"
#include "tests/lib/proc_reap.h"

static struct tc_cluster CL;

static int setup(void **state)
{
    (void)state;
    if (tc_cluster_up(&CL, 1, "64M") != 0) {
        fprintf(stderr, "kvpoolctl cluster up failed (dir %s)\n", CL.dir);
        tc_cluster_down(&CL);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    (void)kvp_test_children_kill();
    tc_cluster_down(&CL);
    return 0;
}

/* `kvpoolctl --cluster FILE --json verify KEYS...`: its exit status, stdout parsed into *out. */
static int ctl_verify(const char *const *keys, size_t n, bool json, json_t **out, char *text, size_t cap)
{
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        const char *argv[80] = {CL.ctl, "--cluster", CL.file};
        size_t a = 3;
        if (json)
            argv[a++] = "--json";
        argv[a++] = "verify";
        for (size_t i = 0; i < n && a < 78; i++)
            argv[a++] = keys[i];
        argv[a] = NULL;
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    kvp_test_child_track(pid);
    close(fd[1]);
    size_t len = 0;
    for (;;) {
        ssize_t r = read(fd[0], text + len, cap - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || len + (size_t)r >= cap - 1) {
            if (r > 0)
                len += (size_t)r;
            break;
        }
        len += (size_t)r;
    }
    text[len] = '\0';
    close(fd[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (out) {
        json_error_t e;
        *out = json ? json_loads(text, 0, &e) : NULL;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ctl_verify --json, asked again (at most 4 times) while a replica is UNKNOWN: an answer lost
 * with a heartbeat under load is a legitimate UNKNOWN, not what these checks are about. */
static int ctl_verify_settled(const char *const *keys, size_t n, json_t **out, char *text, size_t cap)
{
    int rc = -1;
    for (int attempt = 0; attempt < 4; attempt++) {
        *out = NULL;
        rc = ctl_verify(keys, n, true, out, text, cap);
        if (!*out || !strstr(text, "\"unknown\""))
            return rc;
        fprintf(stderr, "verify: a replica unknown (attempt %d), asking again\n", attempt + 1);
        if (attempt < 3)
            json_decref(*out);
    }
    return rc;
}

/* The replica of objects[i] on segment `seg` (NULL when none). */
static json_t *replica_on(json_t *doc, size_t i, uint32_t seg)
{
    json_t *reps = json_object_get(json_array_get(json_object_get(doc, "objects"), i), "replicas");
    size_t k;
    json_t *r;
    json_array_foreach(reps, k, r) {
        if ((uint32_t)json_integer_value(json_object_get(r, "segment_id")) == seg)
            return r;
    }
    return NULL;
}

static const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static void test_verify_match_mismatch_missing(void **state)
{
    (void)state;
    kvp_config *cfg = NULL;
    kvp_client *c = NULL;
    assert_int_equal(kvp_config_new(&cfg), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "cluster_file", CL.file), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "global_segment_size", "33554432"), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "segment_prefault", "false"), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "transfer_timeout", "10000ms"), KVP_OK);
    assert_int_equal(kvp_client_open(cfg, &c), KVP_OK);
    kvp_config_destroy(&cfg);
    kvp_client **slots = tc_open_slots(); /* closed by tc_cluster_down if an assert jumps out */
    slots[0] = c;
    char name[128];
    assert_int_equal(kvp_client_segment_name(c, name, sizeof name), KVP_OK);
    struct kvp_segment *seg = c->seg;
    assert_non_null(seg);
    uint32_t emb = kvp_segment_id(seg);
    uint8_t *base = seg->base;

    const size_t len1 = 1 << 20, len2 = 5000;
    uint8_t *v1 = malloc(len1), *v2 = malloc(len2), *buf = malloc(len1);
    assert_non_null(v1);
    assert_non_null(v2);
    assert_non_null(buf);
    tc_fill("verify-1", v1, len1);
    tc_fill("verify-2", v2, len2);
    kvp_put_opts o = {.replica_num = 2, .preferred_segment = name};
    assert_int_equal(kvp_put(c, "verify-1", v1, len1, &o), KVP_OK);
    assert_int_equal(kvp_put(c, "verify-2", v2, len2, &o), KVP_OK);

    static char text[65536];
    json_t *doc = NULL;
    const char *all[] = {"verify-1", "verify-2", "verify-none"};
    assert_int_equal(ctl_verify_settled(all, 3, &doc, text, sizeof text), 3); /* a key missing */
    assert_non_null(doc);
    assert_string_equal(jstr(doc, "result"), "incomplete");
    json_t *objs = json_object_get(doc, "objects");
    assert_int_equal(json_array_size(objs), 3);
    for (size_t i = 0; i < 2; i++) {
        json_t *obj = json_array_get(objs, i);
        assert_string_equal(jstr(obj, "status"), "ok");
        json_t *reps = json_object_get(obj, "replicas");
        assert_int_equal(json_array_size(reps), 2);
        size_t k;
        json_t *r;
        json_array_foreach(reps, k, r) {
            assert_string_equal(jstr(r, "result"), "match");
            assert_string_equal(jstr(r, "checksum"), jstr(obj, "checksum"));
        }
    }
    char want[20];
    snprintf(want, sizeof want, "%016" PRIx64, XXH3_64bits(v1, len1));
    assert_string_equal(jstr(json_array_get(objs, 0), "checksum"), want);
    assert_string_equal(jstr(json_array_get(objs, 2), "status"), "KVP_ERR_NOT_FOUND");
    json_t *r1 = replica_on(doc, 0, emb);
    assert_non_null(r1); /* placed on the embedded segment first (preferred) */
    uint64_t off1 = (uint64_t)json_integer_value(json_object_get(r1, "offset"));
    json_decref(doc);

    /* one byte of the embedded replica flipped: MISMATCH there, the other replica still MATCH */
    base[off1 + 777] ^= 0x5a;
    const char *one[] = {"verify-1"};
    assert_int_equal(ctl_verify_settled(one, 1, &doc, text, sizeof text), 1);
    assert_non_null(doc);
    assert_string_equal(jstr(doc, "result"), "mismatch");
    json_t *bad = replica_on(doc, 0, emb);
    assert_non_null(bad);
    assert_string_equal(jstr(bad, "result"), "mismatch");
    snprintf(want, sizeof want, "%016" PRIx64, XXH3_64bits(base + off1, len1));
    assert_string_equal(jstr(bad, "checksum"), want); /* what the bytes there hash to now */
    json_t *reps = json_object_get(json_array_get(json_object_get(doc, "objects"), 0), "replicas");
    size_t k;
    json_t *r;
    int matched = 0;
    json_array_foreach(reps, k, r) matched += strcmp(jstr(r, "result"), "match") == 0;
    assert_int_equal(matched, 1);
    json_decref(doc);
    /* the human form names it too */
    assert_int_equal(ctl_verify(one, 1, false, NULL, text, sizeof text), 1);
    assert_non_null(strstr(text, "MISMATCH"));
    /* a reader still gets the exact bytes (the corrupt replica fails its checksum, the other serves) */
    memset(buf, TC_POISON, len1);
    assert_int_equal(kvp_get(c, "verify-1", buf, len1, 0), (int64_t)len1);
    assert_true(tc_check("verify-1", buf, len1));

    /* restored: every replica matches again */
    base[off1 + 777] ^= 0x5a;
    assert_int_equal(ctl_verify_settled(one, 1, &doc, text, sizeof text), 0);
    assert_string_equal(jstr(doc, "result"), "ok");
    json_decref(doc);

    free(v1);
    free(v2);
    free(buf);
    slots[0] = NULL;
    kvp_client_close(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_match_mismatch_missing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
