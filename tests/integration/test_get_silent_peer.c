/*
 * test_get_silent_peer.c — contract C4 for a silent peer (real cluster: 3 masters, 2 segments via
 * `kvpoolctl cluster up`, objects with replica_num 2): a read whose first replica sits on a
 * segment that keeps its TCP connections open but never answers (SIGSTOPped process, or the
 * transfer engine's fault injection dropping every READ to it) moves on to the next replica
 * within the same call (actors/client/batch_get.c, silent-peer rule), long before the call's
 * timeout, with the right bytes; and after the call returned the fenced round's late bytes never
 * land in the caller's buffers (C2).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "actors/client/client_state.h"
#include "actors/session/msession.h"
#include "auth/auth.h"
#include "actors/transfer/fault.h"
#include "config/config.h"
#include "runtime/clock.h"
#include "tests/integration/test_client_util.h"
#include "tests/lib/proc_stop.h"

static struct tc_cluster CL;
enum { N = 16, LEN = 64 << 10, TIMEOUT_MS = 3000 };

static int g_stopped_pid = -1; /* SIGCONT in teardown, also when an assert failed */
static int setup(void **state)
{
    (void)state;
    setenv("KVPOOL_CLIENT_TTL", "30000ms", 1); /* the stopped segment stays listed during the test */
    int rc = tc_cluster_up(&CL, 2, "64M");
    unsetenv("KVPOOL_CLIENT_TTL");
    if (rc != 0) {
        fprintf(stderr, "kvpoolctl cluster up failed (dir %s)\n", CL.dir);
        tc_cluster_down(&CL);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (g_stopped_pid > 0)
        kill(g_stopped_pid, SIGCONT);
    g_stopped_pid = -1;
    tc_cluster_down(&CL);
    return 0;
}

static int test_teardown(void **state)
{
    (void)state;
    if (g_stopped_pid > 0)
        kill(g_stopped_pid, SIGCONT);
    g_stopped_pid = -1;
    kvp_xfer_fault_clear();
    kvp_xfer_fault_release();
    tc_close_all(); /* only when an assert jumped out of the test before its close */
    return 0;
}

/* Segment id of segment `name` (a replica_num 1 object placed there), and how many of keys[] have
 * their first listed replica on it. */
static uint32_t first_on(kvp_client *c, const char *name, char keys[][32], size_t n, size_t *count,
                         bool *is_first)
{
    uint8_t b[64];
    memset(b, 1, sizeof b);
    kvp_put_opts o1 = {.replica_num = 1, .preferred_segment = name};
    static int probes;
    char probe[64];
    snprintf(probe, sizeof probe, "probe-%s-%d", name, probes++);
    assert_int_equal(kvp_put(c, probe, b, sizeof b, &o1), KVP_OK);

    char *masters[KVP_CFG_MAX_MASTERS];
    size_t nm = 0;
    assert_int_equal(kvp_cfg_masters(NULL, CL.file, masters, KVP_CFG_MAX_MASTERS, &nm), KVP_OK);
    struct kvp_msession *ms = NULL;
    struct kvp_auth_client *auth = NULL; /* the cluster's admin key (cluster.json "auth") */
    assert_int_equal(kvp_auth_client_load(&auth, NULL, NULL, NULL, CL.file, "admin_key", "test"), KVP_OK);
    assert_int_equal(kvp_msession_new_auth(&ms, (const char *const *)masters, nm, "test", &auth), KVP_OK);
    kvp_cfg_free_masters(masters, nm);
    char *kv[N + 1];
    kv[0] = probe;
    for (size_t i = 0; i < n; i++)
        kv[i + 1] = keys[i];
    Kvp__Request req;
    Kvp__GetReplicaListReq gr;
    kvp__request__init(&req);
    kvp__get_replica_list_req__init(&gr);
    gr.n_keys = n + 1;
    gr.keys = kv;
    gr.client_host = "localhost";
    req.body_case = KVP__REQUEST__BODY_GET_REPLICAS;
    req.get_replicas = &gr;
    Kvp__Response *resp = NULL;
    assert_int_equal(kvp_msession_call(ms, &req, 5000, &resp), KVP_OK);
    assert_int_equal(resp->body_case, KVP__RESPONSE__BODY_GET_REPLICAS);
    assert_int_equal(resp->get_replicas->n_objects, n + 1);
    assert_true(resp->get_replicas->objects[0]->n_replicas == 1);
    uint32_t id = resp->get_replicas->objects[0]->replicas[0]->segment_id;
    *count = 0;
    for (size_t i = 0; i < n; i++) {
        const Kvp__ObjectInfo *o = resp->get_replicas->objects[i + 1];
        assert_int_equal(o->n_replicas, 2);
        if (is_first)
            is_first[i] = o->replicas[0]->segment_id == id;
        if (o->replicas[0]->segment_id == id)
            (*count)++;
    }
    kvp_msession_response_free(resp);
    kvp_msession_destroy(&ms);
    return id;
}

static void put_keys(kvp_client *c, const char *prefix, char keys[][32], const char *seg0)
{
    uint8_t *buf = malloc(LEN);
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], 32, "%s-%d", prefix, i);
        tc_fill(keys[i], buf, LEN);
        /* half of them placed from seg0 on, so seg0 is likely first for many */
        kvp_put_opts o2 = {.replica_num = 2, .preferred_segment = (i % 2) ? seg0 : NULL};
        assert_int_equal(kvp_put(c, keys[i], buf, LEN, &o2), KVP_OK);
    }
    free(buf);
}

/* All keys in one batch, then every key one by one: right bytes, well within the timeout; then the
 * buffers are poisoned again, the peer is woken (release), and no late byte lands. */
static void read_all(kvp_client *c, char keys[][32], void (*release)(void))
{
    uint8_t *bufs[N];
    for (int i = 0; i < N; i++)
        bufs[i] = malloc(LEN);
    struct kvp_xfer_stats st0, st1;
    kvp_xfer_stats(c->xfer, &st0);
    const char *kp[N];
    void *bp[N];
    size_t caps[N];
    int64_t res[N];
    for (int i = 0; i < N; i++) {
        kp[i] = keys[i];
        bp[i] = bufs[i];
        caps[i] = LEN;
        memset(bufs[i], TC_POISON, LEN);
    }
    uint64_t t0 = kvp_clock_now_us();
    assert_int_equal(kvp_batch_get(c, N, kp, bp, caps, TIMEOUT_MS, res), KVP_OK);
    uint64_t took = kvp_clock_now_us() - t0;
    fprintf(stderr, "batch_get of %d keys: %.1f ms (timeout %d ms)\n", N, took / 1000.0,
            TIMEOUT_MS);
    for (int i = 0; i < N; i++) {
        if (res[i] != LEN)
            fprintf(stderr, "batch slot %d (%s): %s\n", i, keys[i], kvp_errname((int)res[i]));
        assert_int_equal(res[i], LEN);
        assert_true(tc_check(keys[i], bufs[i], LEN));
    }
    uint64_t worst = 0;
    for (int i = 0; i < N; i++) {
        memset(bufs[i], TC_POISON, LEN);
        uint64_t t1 = kvp_clock_now_us();
        int64_t g = kvp_get(c, keys[i], bufs[i], LEN, TIMEOUT_MS);
        uint64_t tg = kvp_clock_now_us() - t1;
        worst = tg > worst ? tg : worst;
        fprintf(stderr, "get %-14s %-8s %6.1f ms\n", keys[i], g == LEN ? "ok" : kvp_errname((int)g),
                tg / 1000.0);
        assert_int_equal(g, LEN);
        assert_true(tc_check(keys[i], bufs[i], LEN));
    }
    /* well within the timeout (a failover costs one round share, 750 ms here; generous bound
     * because the machine is shared) */
    assert_true(worst < (uint64_t)TIMEOUT_MS * 1000);
    assert_true(took < (uint64_t)TIMEOUT_MS * 1000);
    kvp_xfer_stats(c->xfer, &st1);
    fprintf(stderr, "engine: %llu timed-out batch(es), %llu piece(s) fenced\n",
            (unsigned long long)(st1.timeouts - st0.timeouts),
            (unsigned long long)(st1.fenced - st0.fenced));
    assert_true(st1.fenced > st0.fenced); /* the silent replica was really tried and fenced */

    /* C2: the fenced rounds' answers arrive now; none may land in a caller's buffer */
    for (int i = 0; i < N; i++)
        memset(bufs[i], TC_POISON, LEN);
    release();
    usleep(500 * 1000);
    struct kvp_xfer_stats st2;
    kvp_xfer_stats(c->xfer, &st2);
    fprintf(stderr, "after wake-up: %llu late byte(s) drained into scratch\n",
            (unsigned long long)(st2.stray_bytes - st0.stray_bytes));
    for (int i = 0; i < N; i++) {
        assert_true(tc_all_poison(bufs[i], LEN));
        free(bufs[i]);
    }
    /* and the woken segment serves again */
    uint8_t *b = malloc(LEN);
    for (int i = 0; i < N; i++) {
        memset(b, TC_POISON, LEN);
        assert_int_equal(kvp_get(c, keys[i], b, LEN, TIMEOUT_MS), LEN);
        assert_true(tc_check(keys[i], b, LEN));
    }
    free(b);
}

static void wake_stopped(void)
{
    assert_int_equal(kill(g_stopped_pid, SIGCONT), 0);
    g_stopped_pid = -1;
}

static void test_get_silent_peer_sigstop_next_replica_in_time(void **state)
{
    (void)state;
    char seg0[128] = "";
    int pid0 = tc_segment(&CL, 0, seg0, sizeof seg0);
    assert_true(pid0 > 0);
    kvp_client *c = tc_open(&CL, TIMEOUT_MS);
    assert_non_null(c);
    static char keys[N][32];
    put_keys(c, "stop", keys, seg0);
    size_t first = 0;
    uint32_t id0 = first_on(c, seg0, keys, N, &first, NULL);
    fprintf(stderr, "segment %s (id %u, pid %d): first replica of %zu/%d keys; SIGSTOP\n", seg0, id0,
            pid0, first, N);
    assert_true(first > 0);
    g_stopped_pid = pid0;
    /* all of its threads stopped, not only the signal queued (tests/lib/proc_stop.h) */
    assert_true(kvp_test_stop_process(pid0, 5000));
    read_all(c, keys, wake_stopped);
    tc_close(&c);
}

static void release_faults(void)
{
    kvp_xfer_fault_clear();
    kvp_xfer_fault_release();
}

/* The same with the engine's fault injection: every READ piece to seg0 is dropped (never sent,
 * never answered), the peer process keeps running. */
static void test_get_silent_peer_fault_drop_next_replica_in_time(void **state)
{
    (void)state;
    char seg0[128] = "";
    assert_true(tc_segment(&CL, 0, seg0, sizeof seg0) > 0);
    kvp_client *c = tc_open(&CL, TIMEOUT_MS);
    assert_non_null(c);
    static char keys[N][32];
    put_keys(c, "drop", keys, seg0);
    size_t first = 0;
    uint32_t id0 = first_on(c, seg0, keys, N, &first, NULL);
    fprintf(stderr, "segment %s (id %u): first replica of %zu/%d keys; READs to it dropped\n", seg0,
            id0, first, N);
    assert_true(first > 0);
    struct kvp_xfer_fault_rule rule = {.action = KVP_FAULT_DROP, .transport = KVP_FAULT_TCP,
                                       .op = KVP_XFER_READ, .segment_id = id0};
    int rc = kvp_xfer_fault_add(&rule);
    if (rc == KVP_ERR_UNSUPPORTED) {
        tc_close(&c);
        skip(); /* built without KVP_FAULT_INJECTION */
    }
    assert_int_equal(rc, KVP_OK);
    read_all(c, keys, release_faults);
    tc_close(&c);
}

/* A key on its last replica in a round capped for the others: the capped round fences it
 * (its segment answers late), it stays on that replica and is read again with the full time in
 * the next round. Batch: the keys whose first replica is on seg0 (every READ to seg0 dropped)
 * plus a replica_num 1 key on seg1 (its first READ answered 1500 ms late). */
static void test_get_silent_peer_last_replica_capped_round_read_again(void **state)
{
    (void)state;
    char seg0[128] = "", seg1[128] = "";
    assert_true(tc_segment(&CL, 0, seg0, sizeof seg0) > 0);
    assert_true(tc_segment(&CL, 1, seg1, sizeof seg1) > 0);
    kvp_client *c = tc_open(&CL, TIMEOUT_MS);
    assert_non_null(c);
    static char keys[N][32];
    put_keys(c, "mix", keys, seg0);
    bool is_first[N];
    size_t first = 0, unused = 0;
    uint32_t id0 = first_on(c, seg0, keys, N, &first, is_first);
    uint32_t id1 = first_on(c, seg1, keys, 0, &unused, NULL);
    assert_true(first > 0);
    const char *solo = "mix-solo";
    uint8_t *b = malloc(LEN);
    tc_fill(solo, b, LEN);
    kvp_put_opts o1 = {.replica_num = 1, .preferred_segment = seg1};
    assert_int_equal(kvp_put(c, solo, b, LEN, &o1), KVP_OK);
    free(b);

    struct kvp_xfer_fault_rule drop = {.action = KVP_FAULT_DROP, .transport = KVP_FAULT_TCP,
                                       .op = KVP_XFER_READ, .segment_id = id0};
    struct kvp_xfer_fault_rule late = {.action = KVP_FAULT_LATE, .transport = KVP_FAULT_TCP,
                                       .op = KVP_XFER_READ, .segment_id = id1, .ms = 1500, .count = 1};
    int rc = kvp_xfer_fault_add(&drop);
    if (rc == KVP_ERR_UNSUPPORTED) {
        tc_close(&c);
        skip();
    }
    assert_int_equal(rc, KVP_OK);
    assert_int_equal(kvp_xfer_fault_add(&late), KVP_OK);

    const char *kp[N + 1];
    void *bp[N + 1];
    size_t caps[N + 1];
    int64_t res[N + 1];
    size_t nb = 0;
    for (int i = 0; i < N; i++)
        if (is_first[i])
            kp[nb++] = keys[i];
    kp[nb++] = solo;
    for (size_t i = 0; i < nb; i++) {
        bp[i] = malloc(LEN);
        memset(bp[i], TC_POISON, LEN);
        caps[i] = LEN;
    }
    uint64_t t0 = kvp_clock_now_us();
    assert_int_equal(kvp_batch_get(c, nb, kp, bp, caps, TIMEOUT_MS, res), KVP_OK);
    uint64_t took = kvp_clock_now_us() - t0;
    fprintf(stderr, "batch_get of %zu keys (last one replica_num 1, answered late): %.1f ms\n", nb,
            took / 1000.0);
    for (size_t i = 0; i < nb; i++) {
        if (res[i] != LEN)
            fprintf(stderr, "batch slot %zu (%s): %s\n", i, kp[i], kvp_errname((int)res[i]));
        assert_int_equal(res[i], LEN);
        assert_true(tc_check(kp[i], bp[i], LEN));
    }
    /* the late answer of the fenced first read goes to scratch, never to the buffer */
    for (size_t i = 0; i < nb; i++)
        memset(bp[i], TC_POISON, LEN);
    release_faults();
    assert_int_equal(kvp_xfer_fault_quiesce(10000), KVP_OK);
    for (size_t i = 0; i < nb; i++) {
        assert_true(tc_all_poison(bp[i], LEN));
        free(bp[i]);
    }
    tc_close(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_get_silent_peer_sigstop_next_replica_in_time, test_teardown),
        cmocka_unit_test_teardown(test_get_silent_peer_fault_drop_next_replica_in_time, test_teardown),
        cmocka_unit_test_teardown(test_get_silent_peer_last_replica_capped_round_read_again, test_teardown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
