/*
 * test_client_cluster_loss.c — a segment dies under the client (real cluster: 3 masters,
 * 3 segments via `kvpoolctl cluster up`, client_ttl 3 s through KVPOOL_CLIENT_TTL):
 *  - batch_gets with replica_num 2 keep succeeding, with the right bytes, while a segment is
 *    SIGKILLed under them;
 *  - a get whose only replica was on the dead segment fails fast with KVP_ERR_TRANSFER within
 *    the call's timeout (never hangs) and writes nothing;
 *  - once the master declares the segment lost, exists answers no for that key.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>

#include "actors/session/msession.h"
#include "auth/auth.h"
#include "config/config.h"
#include "runtime/clock.h"
#include "tests/integration/test_client_util.h"

static struct tc_cluster CL;

static int setup(void **state)
{
    (void)state;
    setenv("KVPOOL_CLIENT_TTL", "3000ms", 1); /* inherited by the masters cluster up starts */
    int rc = tc_cluster_up(&CL, 3, "128M");
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
    tc_cluster_down(&CL);
    return 0;
}

enum { N = 48, LEN = 128 << 10, SOLO = 4, TIMEOUT_MS = 5000 };

struct reader {
    kvp_client *c;
    char keys[N][32];
    atomic_bool stop;
    atomic_int rounds;
    atomic_int rounds_after_kill;
    atomic_bool killed;
    int bad_slots;      /* slots not OK or with wrong bytes */
    int call_errors;
};

static void *reader_main(void *arg)
{
    struct reader *r = arg;
    const char *kp[N];
    void *bufs[N];
    size_t caps[N];
    int64_t res[N];
    for (int i = 0; i < N; i++) {
        kp[i] = r->keys[i];
        bufs[i] = malloc(LEN);
        caps[i] = LEN;
    }
    while (!atomic_load(&r->stop)) {
        bool after = atomic_load(&r->killed);
        for (int i = 0; i < N; i++)
            memset(bufs[i], TC_POISON, LEN);
        if (kvp_batch_get(r->c, N, kp, bufs, caps, TIMEOUT_MS, res) != KVP_OK) {
            r->call_errors++;
            continue;
        }
        for (int i = 0; i < N; i++)
            if (res[i] != LEN || !tc_check(kp[i], bufs[i], LEN)) {
                if (r->bad_slots++ < 5)
                    fprintf(stderr, "slot %d (%s): %s\n", i, kp[i],
                            res[i] < 0 ? kvp_errname((int)res[i]) : "wrong bytes");
            }
        atomic_fetch_add(&r->rounds, 1);
        if (after)
            atomic_fetch_add(&r->rounds_after_kill, 1);
    }
    for (int i = 0; i < N; i++)
        free(bufs[i]);
    return NULL;
}

static void test_client_cluster_segment_killed_gets_survive_then_lost(void **state)
{
    (void)state;
    char seg0[128] = "";
    int pid0 = tc_segment(&CL, 0, seg0, sizeof seg0);
    assert_true(pid0 > 0);
    assert_true(seg0[0] != '\0');

    kvp_client *c = tc_open(&CL, TIMEOUT_MS);
    assert_non_null(c);
    static struct reader r;
    memset(&r, 0, sizeof r);
    r.c = c;
    uint8_t *buf = malloc(LEN);
    kvp_put_opts o2 = {.replica_num = 2};
    for (int i = 0; i < N; i++) {
        snprintf(r.keys[i], sizeof r.keys[i], "loss-%d", i);
        tc_fill(r.keys[i], buf, LEN);
        assert_int_equal(kvp_put(c, r.keys[i], buf, LEN, &o2), KVP_OK);
    }
    /* single-replica objects placed on the segment that will die */
    char solo[SOLO][32];
    kvp_put_opts o1 = {.replica_num = 1, .preferred_segment = seg0};
    for (int i = 0; i < SOLO; i++) {
        snprintf(solo[i], sizeof solo[i], "solo-%d", i);
        tc_fill(solo[i], buf, 4096);
        assert_int_equal(kvp_put(c, solo[i], buf, 4096, &o1), KVP_OK);
    }

    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, reader_main, &r), 0);
    while (atomic_load(&r.rounds) < 3)
        usleep(10000);
    assert_int_equal(kill(pid0, SIGKILL), 0);
    atomic_store(&r.killed, true);
    while (atomic_load(&r.rounds_after_kill) < 5)
        usleep(10000);
    atomic_store(&r.stop, true);
    pthread_join(t, NULL);
    assert_int_equal(r.call_errors, 0);
    assert_int_equal(r.bad_slots, 0);

    /* dead-only replica: fails fast, writes nothing */
    memset(buf, TC_POISON, 4096);
    uint64_t t0 = kvp_clock_now_ms();
    int64_t g = kvp_get(c, solo[0], buf, 4096, TIMEOUT_MS);
    uint64_t took = kvp_clock_now_ms() - t0;
    fprintf(stderr, "get from the dead-only replica: %s in %llu ms\n", kvp_errname((int)g),
            (unsigned long long)took);
    /* TRANSFER normally; NOT_FOUND if the master already declared the segment lost */
    assert_true(g == KVP_ERR_TRANSFER || g == KVP_ERR_NOT_FOUND);
    assert_true(took < TIMEOUT_MS + 2000);
    assert_true(tc_all_poison(buf, 4096));

    /* declared lost within client_ttl (3 s) + slack: exists answers no */
    int ex = 1;
    for (int i = 0; i < 200 && ex != 0; i++) {
        ex = kvp_exists(c, solo[0]);
        if (ex != 0)
            usleep(100000);
    }
    assert_int_equal(ex, 0);
    for (int i = 0; i < SOLO; i++) {
        assert_int_equal(kvp_exists(c, solo[i]), 0);
        assert_int_equal(kvp_get(c, solo[i], buf, 4096, 0), KVP_ERR_NOT_FOUND);
    }
    /* the replica_num 2 objects stay readable */
    for (int i = 0; i < N; i++) {
        memset(buf, TC_POISON, LEN);
        assert_int_equal(kvp_get(c, r.keys[i], buf, LEN, 0), LEN);
        assert_true(tc_check(r.keys[i], buf, LEN));
    }
    free(buf);
    tc_close(&c);
}

/* The leader master is SIGKILLed: puts and gets go on (the session finds the new leader). */
static void test_client_cluster_leader_killed_calls_continue(void **state)
{
    (void)state;
    kvp_client *c = tc_open(&CL, 15000);
    assert_non_null(c);
    enum { M = 16, SZ = 65536 };
    uint8_t *buf = malloc(SZ);
    kvp_put_opts o2 = {.replica_num = 2};
    char key[32];
    for (int i = 0; i < M; i++) {
        snprintf(key, sizeof key, "pre-failover-%d", i);
        tc_fill(key, buf, SZ);
        assert_int_equal(kvp_put(c, key, buf, SZ, &o2), KVP_OK);
    }
    /* who leads? ask through a session of our own */
    char *masters[KVP_CFG_MAX_MASTERS];
    size_t nm = 0;
    assert_int_equal(kvp_cfg_masters(NULL, CL.file, masters, KVP_CFG_MAX_MASTERS, &nm), KVP_OK);
    struct kvp_msession *ms = NULL;
    struct kvp_auth_client *auth = NULL; /* the cluster's admin key (cluster.json "auth") */
    assert_int_equal(kvp_auth_client_load(&auth, NULL, NULL, NULL, CL.file, "admin_key", "test"), KVP_OK);
    assert_int_equal(kvp_msession_new_auth(&ms, (const char *const *)masters, nm, "test", &auth), KVP_OK);
    kvp_cfg_free_masters(masters, nm);
    Kvp__Request req;
    Kvp__ExistsReq ex;
    kvp__request__init(&req);
    kvp__exists_req__init(&ex);
    req.body_case = KVP__REQUEST__BODY_EXISTS;
    req.exists = &ex;
    Kvp__Response *resp = NULL;
    assert_int_equal(kvp_msession_call(ms, &req, 5000, &resp), KVP_OK);
    kvp_msession_response_free(resp);
    char leader[128];
    kvp_msession_leader(ms, leader, sizeof leader);
    kvp_msession_destroy(&ms);
    int lpid = tc_master_pid(&CL, leader);
    fprintf(stderr, "leader %s pid %d: SIGKILL\n", leader, lpid);
    assert_true(lpid > 0);
    assert_int_equal(kill(lpid, SIGKILL), 0);

    for (int i = 0; i < M; i++) {
        snprintf(key, sizeof key, "pre-failover-%d", i);
        memset(buf, TC_POISON, SZ);
        int64_t g = kvp_get(c, key, buf, SZ, 0);
        if (g != SZ)
            fprintf(stderr, "get %s after failover: %s\n", key, kvp_errname((int)g));
        assert_int_equal(g, SZ);
        assert_true(tc_check(key, buf, SZ));
        snprintf(key, sizeof key, "post-failover-%d", i);
        tc_fill(key, buf, SZ);
        int p = kvp_put(c, key, buf, SZ, &o2);
        if (p != KVP_OK)
            fprintf(stderr, "put %s after failover: %s\n", key, kvp_errname(p));
        assert_int_equal(p, KVP_OK);
        memset(buf, TC_POISON, SZ);
        assert_int_equal(kvp_get(c, key, buf, SZ, 0), SZ);
        assert_true(tc_check(key, buf, SZ));
    }
    free(buf);
    tc_close(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_cluster_segment_killed_gets_survive_then_lost),
        cmocka_unit_test(test_client_cluster_leader_killed_calls_continue),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
