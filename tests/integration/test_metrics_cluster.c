/*
 * test_metrics_cluster.c — issue 24 against real processes on loopback: a kvpool-segment
 * started before any master keeps retrying its mount and mounts once the masters appear; then
 * every endpoint of three kvpool-master processes and the segment answers as
 * docs/operations.md says (/metrics in valid Prometheus text — our checker, and promtool when
 * found —, /healthz, /readyz, /get_all_segments, 404 and 405), and the counters move with the
 * test's own puts and gets.
 *
 * The tests run in order and share one cluster (the first one starts it). Every process is
 * started here and stopped here by its pid (SIGINT/SIGTERM, then SIGKILL), also on failure
 * (atexit). Waits poll real processes with deadlines: nothing asserts on a duration except
 * the one the issue is about (the segment outlives the old 10 s give-up).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvpool.h"
#include "tests/lib/cluster_guard.h"
#include "tests/lib/http_get.h"
#include "tests/lib/proc_reap.h"
#include "tests/lib/prom_check.h"

#define NM 3

struct cl {
    char dir[128];
    char bin[512];
    uint32_t ctl[NM], raft[NM], mport[NM], sport;
    char mhost[NM][16];   /* master i on 127.0.0.(i+1): all share one metrics port, as on real hosts */
    char masters[256];
    char seg_name[64];
    char seg_log[256];
    pid_t seg_pid;
    pid_t m_pid[NM];
    uint64_t seg_started_ms;
    bool mounted;
    bool cu_up; /* a `kvpoolctl cluster up --metrics` in DIR/cu runs */
};

static struct cl C;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static pid_t spawn(char *const argv[], const char *log)
{
    pid_t pid = fork();
    kvp_test_child_track(pid); /* killed at teardown if a failed assert skips its stop */
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static bool alive(pid_t pid)
{
    int st;
    return pid > 0 && waitpid(pid, &st, WNOHANG) == 0;
}

/* Stop one process we started: sig, up to 5 s, then SIGKILL; reaped. */
static void stop(pid_t *pid, int sig)
{
    if (*pid <= 0)
        return;
    kill(*pid, sig);
    for (int i = 0; i < 100 && alive(*pid); i++)
        sleep_ms(50);
    if (alive(*pid)) {
        kill(*pid, SIGKILL);
        waitpid(*pid, NULL, 0);
    }
    *pid = 0;
}

static pid_t spawn(char *const argv[], const char *log);

static void cluster_down_cu(void)
{
    if (!C.cu_up)
        return;
    char exe[600], dir[200];
    snprintf(exe, sizeof exe, "%s/kvpoolctl", C.bin);
    snprintf(dir, sizeof dir, "%s/cu", C.dir);
    char *argv[] = {exe, "cluster", "down", "--dir", dir, "--grace-ms", "3000", NULL};
    pid_t pid = spawn(argv, "/dev/null");
    if (pid > 0)
        waitpid(pid, NULL, 0);
    C.cu_up = false;
}

static void teardown_all(void)
{
    cluster_down_cu();
    stop(&C.seg_pid, SIGINT);
    for (int i = 0; i < NM; i++)
        stop(&C.m_pid[i], SIGTERM);
    if (C.dir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", C.dir);
        if (getenv("KVP_TEST_KEEP"))
            fprintf(stderr, "kept %s\n", C.dir);
        else if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", C.dir);
        C.dir[0] = '\0';
    }
}

static bool file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char line[2048];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

/* GET; returns the status (0 = no answer) and the body in *body (caller frees; may be NULL). */
static int http_at(const char *host, uint32_t port, const char *method, const char *path, char **body, char **hdr)
{
    int st = 0;
    char *b = NULL, *h = NULL;
    if (kvp_test_http_at(host, port, method, path, &st, &b, &h, 3000) != 0)
        st = 0;
    if (body)
        *body = b;
    else
        free(b);
    if (hdr)
        *hdr = h;
    else
        free(h);
    return st;
}

static int http(uint32_t port, const char *method, const char *path, char **body, char **hdr)
{
    return http_at("127.0.0.1", port, method, path, body, hdr);
}

/* Master i's endpoint. */
static int mhttp(int i, const char *method, const char *path, char **body, char **hdr)
{
    return http_at(C.mhost[i], C.mport[i], method, path, body, hdr);
}

static char *scrape_at(const char *host, uint32_t port)
{
    char *b = NULL;
    assert_int_equal(http_at(host, port, "GET", "/metrics", &b, NULL), 200);
    assert_non_null(b);
    return b;
}

static char *scrape(uint32_t port)
{
    return scrape_at("127.0.0.1", port);
}

static char *mscrape(int i)
{
    return scrape_at(C.mhost[i], C.mport[i]);
}

static void check_format(const char *what, const char *text)
{
    char why[2048];
    if (kvp_test_prom_check(text, "kvpool_", why, sizeof why) != 0)
        fail_msg("%s /metrics: %s", what, why);
    int rc = kvp_test_promtool(text, why, sizeof why);
    if (rc == 1)
        fail_msg("%s /metrics: promtool check metrics: %s", what, why);
    if (rc < 0)
        fprintf(stderr, "note: promtool not found (set KVP_PROMTOOL); %s checked by the test's checker\n", what);
}

static int group_setup(void **state)
{
    memset(&C, 0, sizeof C);
    const char *bd = getenv("KVP_BUILD_DIR");
    snprintf(C.bin, sizeof C.bin, "%s/tools", bd ? bd : ".");
    /* The processes this test starts by hand carry no keys: auth none (this test is about the
     * metrics endpoints; authentication has its own tests, test_auth_cluster.c). */
    setenv("KVPOOL_AUTH", "none", 1);
    snprintf(C.dir, sizeof C.dir, "/tmp/kvp-metrics-test-XXXXXX");
    if (!mkdtemp(C.dir))
        return -1;
    atexit(teardown_all);
    /* Distinct free ports: 3 x (control, raft, metrics) + the segment's metrics port. */
    uint32_t all[3 * NM + 1];
    for (int i = 0; i < 3 * NM + 1; i++) {
        uint32_t p;
        bool dup;
        do {
            p = kvp_test_free_port();
            dup = p == 0;
            for (int j = 0; j < i; j++)
                dup |= all[j] == p;
        } while (dup);
        all[i] = p;
    }
    for (int i = 0; i < NM; i++) {
        C.ctl[i] = all[3 * i];
        C.raft[i] = all[3 * i + 1];
        C.mport[i] = all[2]; /* one metrics port, each master on its own loopback address */
        snprintf(C.mhost[i], sizeof C.mhost[i], "127.0.0.%d", i + 1);
    }
    C.sport = all[3 * NM];
    snprintf(C.masters, sizeof C.masters, "%s:%u,%s:%u,%s:%u", C.mhost[0], C.ctl[0], C.mhost[1], C.ctl[1], C.mhost[2],
             C.ctl[2]);
    snprintf(C.seg_name, sizeof C.seg_name, "mseg-%d", (int)getpid());
    snprintf(C.seg_log, sizeof C.seg_log, "%s/seg.log", C.dir);
    return 0;
}

static int group_teardown(void **state)
{
    (void)kvp_test_children_kill();
    teardown_all();
    return 0;
}

static void start_masters(void)
{
    char members[512];
    snprintf(members, sizeof members, "1@%s:%u@%s:%u,2@%s:%u@%s:%u,3@%s:%u@%s:%u", C.mhost[0], C.ctl[0], C.mhost[0],
             C.raft[0], C.mhost[1], C.ctl[1], C.mhost[1], C.raft[1], C.mhost[2], C.ctl[2], C.mhost[2], C.raft[2]);
    for (int i = 0; i < NM; i++) {
        char exe[600], id[8], listen[64], raft[64], data[200], mp[16], log[200];
        snprintf(exe, sizeof exe, "%s/kvpool-master", C.bin);
        snprintf(id, sizeof id, "%d", i + 1);
        snprintf(listen, sizeof listen, "%s:%u", C.mhost[i], C.ctl[i]);
        snprintf(raft, sizeof raft, "%s:%u", C.mhost[i], C.raft[i]);
        snprintf(data, sizeof data, "%s/master-%d", C.dir, i + 1);
        snprintf(mp, sizeof mp, "%u", C.mport[i]);
        snprintf(log, sizeof log, "%s/master-%d.log", C.dir, i + 1);
        char *argv[] = {exe, "--id", id, "--listen", listen, "--raft-address", raft, "--data-dir", data,
                        "--members", members, "--metrics-port", mp, NULL};
        C.m_pid[i] = spawn(argv, log);
        assert_true(C.m_pid[i] > 0);
    }
}

/* Issue 24 item 3: a segment started before any master keeps retrying the mount (one WARN line
 * per try) past the 10 s after which it used to exit, and mounts once the masters appear. Its
 * /healthz answers from the start and /readyz says why it is not ready. */
static void test_metrics_segment_started_first_mounts_when_masters_appear(void **state)
{
    char exe[600], sp[16];
    snprintf(exe, sizeof exe, "%s/kvpool-segment", C.bin);
    snprintf(sp, sizeof sp, "%u", C.sport);
    char name[80];
    snprintf(name, sizeof name, "%s", C.seg_name);
    char *argv[] = {exe, "--master-server-address", C.masters, "--global-segment-size", "64M", "--name", name,
                    "--metrics-port", sp, "--hugepages=false", "--segment-prefault=false", NULL};
    C.seg_started_ms = now_ms();
    C.seg_pid = spawn(argv, C.seg_log);
    assert_true(C.seg_pid > 0);

    int st = 0;
    for (uint64_t end = now_ms() + 20000; now_ms() < end && (st = http(C.sport, "GET", "/healthz", NULL, NULL)) != 200;)
        sleep_ms(100);
    assert_int_equal(st, 200);
    char *body = NULL;
    assert_int_equal(http(C.sport, "GET", "/readyz", &body, NULL), 503);
    assert_non_null(strstr(body, "not mounted yet"));
    free(body);
    body = scrape(C.sport);
    check_format("segment (not mounted)", body);
    assert_true(kvp_test_prom_value(body, "kvpool_segment_mounted") == 0.0);
    free(body);

    /* Each try is logged; wait for the second. */
    for (uint64_t end = now_ms() + 30000; now_ms() < end && !file_has(C.seg_log, "mount try 2:");)
        sleep_ms(200);
    assert_true(file_has(C.seg_log, "mount try 1: no master answered"));
    assert_true(file_has(C.seg_log, "mount try 2: no master answered"));
    /* The old daemon gave up 10 s after its start: still here at 11 s. */
    while (now_ms() < C.seg_started_ms + 11000) {
        assert_true(alive(C.seg_pid));
        sleep_ms(200);
    }
    assert_true(alive(C.seg_pid));
    assert_false(file_has(C.seg_log, "cannot start"));

    start_masters();
    for (uint64_t end = now_ms() + 60000; now_ms() < end && (st = http(C.sport, "GET", "/readyz", NULL, NULL)) != 200;) {
        assert_true(alive(C.seg_pid));
        sleep_ms(200);
    }
    assert_int_equal(st, 200);
    assert_true(file_has(C.seg_log, "a master answered at try"));
    body = scrape(C.sport);
    assert_true(kvp_test_prom_value(body, "kvpool_segment_mounted") == 1.0);
    assert_true(kvp_test_prom_value(body, "kvpool_segment_mounts_total") == 1.0);
    assert_true(kvp_test_prom_value(body, "kvpool_segment_mount_failures_total") >= 2.0);
    free(body);
    C.mounted = true;
}

/* The leader's index, once every master reports a leader (readyz) and one says it leads. */
static int find_leader(void)
{
    for (uint64_t end = now_ms() + 30000; now_ms() < end; sleep_ms(200)) {
        int leader = -1, ready = 0;
        for (int i = 0; i < NM; i++) {
            ready += mhttp(i, "GET", "/readyz", NULL, NULL) == 200;
            char *b = NULL;
            if (mhttp(i, "GET", "/metrics", &b, NULL) == 200 &&
                kvp_test_prom_value(b, "kvpool_raft_is_leader") == 1.0 &&
                kvp_test_prom_value(b, "kvpool_master_pool_view") == 1.0)
                leader = i;
            free(b);
        }
        if (ready == NM && leader >= 0)
            return leader;
    }
    return -1;
}

static void test_metrics_endpoints_answer_as_documented(void **state)
{
    assert_true(C.mounted);
    int leader = find_leader();
    assert_true(leader >= 0);
    /* /get_all_segments on the leader: the mounted segment's name, one per line. */
    char *body = NULL, *hdr = NULL, want[80];
    snprintf(want, sizeof want, "%s\n", C.seg_name);
    int st = 0;
    for (uint64_t end = now_ms() + 10000; now_ms() < end; sleep_ms(200)) {
        free(body);
        st = mhttp(leader, "GET", "/get_all_segments", &body, &hdr);
        free(hdr);
        hdr = NULL;
        if (st == 200 && body && strcmp(body, want) == 0)
            break;
    }
    assert_int_equal(st, 200);
    assert_string_equal(body, want);
    free(body);
    int is_leader_sum = 0;
    for (int i = 0; i < NM; i++) {
        char what[32];
        snprintf(what, sizeof what, "master-%d", i + 1);
        assert_int_equal(mhttp(i, "GET", "/healthz", &body, NULL), 200);
        assert_string_equal(body, "ok\n");
        free(body);
        assert_int_equal(mhttp(i, "GET", "/readyz", &body, NULL), 200);
        assert_string_equal(body, "ready\n");
        free(body);
        if (i != leader) {
            /* A follower (on another address than the leader, same port) redirects to the
             * leader's endpoint, which answers the list: what SGLang's check_server follows. */
            char loc[160];
            snprintf(loc, sizeof loc, "Location: http://%s:%u/get_all_segments", C.mhost[leader], C.mport[leader]);
            assert_int_equal(mhttp(i, "GET", "/get_all_segments", &body, &hdr), 307);
            if (!strstr(hdr, loc))
                fail_msg("follower %d: no '%s' in\n%s", i + 1, loc, hdr);
            free(body);
            free(hdr);
            hdr = NULL;
            assert_int_equal(http_at(C.mhost[leader], C.mport[leader], "GET", "/get_all_segments", &body, NULL), 200);
            assert_string_equal(body, want);
            free(body);
        }
        assert_int_equal(mhttp(i, "GET", "/no/such/path", &body, NULL), 404);
        assert_non_null(strstr(body, "no such path"));
        free(body);
        assert_int_equal(mhttp(i, "POST", "/metrics", &body, NULL), 405);
        free(body);
        body = mscrape(i);
        check_format(what, body);
        is_leader_sum += (int)kvp_test_prom_value(body, "kvpool_raft_is_leader");
        assert_true(kvp_test_prom_value(body, "kvpool_raft_term") >= 1.0);
        assert_true(kvp_test_prom_value(body, "kvpool_raft_commit_index") >= 1.0);
        assert_true(kvp_test_prom_value(body, "kvpool_raft_apply_lag") >= 0.0);
        assert_true(kvp_test_prom_value(body, "kvpool_raft_members") == 3.0);
        assert_true(kvp_test_prom_value(body, "kvpool_master_metrics_age_seconds") < 5.0);
        if (i == leader) {
            char series[160];
            snprintf(series, sizeof series, "kvpool_pool_segment_capacity_bytes{segment=\"%s\"}", C.seg_name);
            assert_true(kvp_test_prom_value(body, series) == 64.0 * 1024 * 1024);
            assert_true(kvp_test_prom_value(body, "kvpool_pool_capacity_bytes") == 64.0 * 1024 * 1024);
            snprintf(series, sizeof series, "kvpool_pool_segment_state{segment=\"%s\",state=\"ACTIVE\"}", C.seg_name);
            assert_true(kvp_test_prom_value(body, series) == 1.0);
        } else {
            assert_true(kvp_test_prom_value(body, "kvpool_objects") == -1.0); /* no pool view */
        }
        free(body);
        /* The master log names the bad requests. */
        char log[200];
        snprintf(log, sizeof log, "%s/master-%d.log", C.dir, i + 1);
        assert_true(file_has(log, "HTTP POST /metrics from 127.0.0."));
        assert_true(file_has(log, "HTTP GET /no/such/path from 127.0.0."));
    }
    assert_int_equal(is_leader_sum, 1);
    /* The segment's endpoints. */
    assert_int_equal(http(C.sport, "GET", "/healthz", &body, NULL), 200);
    free(body);
    assert_int_equal(http(C.sport, "GET", "/get_all_segments", &body, NULL), 404);
    free(body);
    assert_int_equal(http(C.sport, "PUT", "/readyz", &body, NULL), 405);
    free(body);
    body = scrape(C.sport);
    check_format("segment", body);
    free(body);
}

static double leader_value(int leader, const char *series)
{
    char *b = mscrape(leader);
    double v = kvp_test_prom_value(b, series);
    free(b);
    return v < 0 ? 0 : v;
}

static double seg_value(const char *series)
{
    char *b = scrape(C.sport);
    double v = kvp_test_prom_value(b, series);
    free(b);
    return v < 0 ? 0 : v;
}

#define N_KEYS 5
#define VAL_BYTES 4096

static void test_metrics_counters_move_with_puts_and_gets(void **state)
{
    assert_true(C.mounted);
    int leader = find_leader();
    assert_true(leader >= 0);
    const char *put_ok = "kvpool_master_rpcs_total{type=\"put_start\",code=\"KVP_OK\"}";
    const char *get_ok = "kvpool_master_rpcs_total{type=\"get_replicas\",code=\"KVP_OK\"}";
    /* per key: a get of a missing key is an OK request whose key is NOT_FOUND */
    const char *get_nf = "kvpool_master_keys_total{type=\"get_replicas\",code=\"KVP_ERR_NOT_FOUND\"}";
    const char *put_key_ok = "kvpool_master_keys_total{type=\"put_start\",code=\"KVP_OK\"}";
    const char *put_lat = "kvpool_master_rpc_duration_seconds_count{type=\"put_start\"}";
    const char *wr = "kvpool_segment_transfer_bytes_total{direction=\"write\"}";
    const char *rd = "kvpool_segment_transfer_bytes_total{direction=\"read\"}";
    const char *wr_ok = "kvpool_segment_requests_total{op=\"write\",result=\"ok\"}";
    const char *rd_ok = "kvpool_segment_requests_total{op=\"read\",result=\"ok\"}";
    double p0 = leader_value(leader, put_ok), g0 = leader_value(leader, get_ok), nf0 = leader_value(leader, get_nf);
    double l0 = leader_value(leader, put_lat), o0 = leader_value(leader, "kvpool_objects");
    double pk0 = leader_value(leader, put_key_ok);
    double w0 = seg_value(wr), r0 = seg_value(rd), wo0 = seg_value(wr_ok), ro0 = seg_value(rd_ok);
    double acc0 = seg_value("kvpool_segment_connections_accepted_total");

    kvp_config *cfg = NULL;
    kvp_client *c = NULL;
    assert_int_equal(kvp_config_new(&cfg), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "master_server_address", C.masters), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "auth", "none"), KVP_OK);
    uint32_t cport = kvp_test_free_port();
    char cps[16];
    snprintf(cps, sizeof cps, "%u", cport);
    assert_int_equal(kvp_config_set(cfg, "metrics_port", cps), KVP_OK);
    assert_int_equal(kvp_client_open(cfg, &c), KVP_OK);
    static uint8_t val[VAL_BYTES], out[VAL_BYTES];
    for (int i = 0; i < N_KEYS; i++) {
        char key[64];
        snprintf(key, sizeof key, "metrics-%d-%d", (int)getpid(), i);
        memset(val, 'a' + i, sizeof val);
        assert_int_equal(kvp_put(c, key, val, sizeof val, NULL), KVP_OK);
        assert_int_equal(kvp_get(c, key, out, sizeof out, 0), VAL_BYTES);
        assert_memory_equal(out, val, sizeof val);
    }
    assert_int_equal(kvp_get(c, "metrics-no-such-key", out, sizeof out, 0), KVP_ERR_NOT_FOUND);
    const char *const ek[2] = {"metrics-no-such-key", "metrics-no-such-key-2"};
    int er[2] = {9, 9};
    assert_int_equal(kvp_batch_exists(c, 2, ek, er), KVP_OK);
    assert_int_equal(er[0], 0);

    /* The client's own counters are live: exact. */
    char *cb = scrape(cport);
    check_format("client", cb);
    assert_true(kvp_test_prom_value(cb, "kvpool_client_calls_total{op=\"put\",code=\"KVP_OK\"}") == N_KEYS);
    assert_true(kvp_test_prom_value(cb, "kvpool_client_calls_total{op=\"get\",code=\"KVP_OK\"}") == N_KEYS + 1);
    assert_true(kvp_test_prom_value(cb, "kvpool_client_keys_total{op=\"put\",code=\"KVP_OK\"}") == N_KEYS);
    assert_true(kvp_test_prom_value(cb, "kvpool_client_keys_total{op=\"get\",code=\"KVP_OK\"}") == N_KEYS);
    assert_true(kvp_test_prom_value(cb, "kvpool_client_keys_total{op=\"get\",code=\"KVP_ERR_NOT_FOUND\"}") == 1);
    assert_true(kvp_test_prom_value(cb, "kvpool_client_keys_total{op=\"exists\",code=\"KVP_ERR_NOT_FOUND\"}") == 2);
    assert_true(kvp_test_prom_value(cb, "kvpool_client_transfer_bytes_total{direction=\"write\",transport=\"tcp\"}") ==
                N_KEYS * VAL_BYTES);
    assert_true(kvp_test_prom_value(cb, "kvpool_client_transfer_bytes_total{direction=\"read\",transport=\"tcp\"}") ==
                N_KEYS * VAL_BYTES);
    assert_true(kvp_test_prom_value(cb, "kvpool_client_call_duration_seconds_count{op=\"get\"}") == N_KEYS + 1);
    assert_true(kvp_test_prom_value(cb, "kvpool_client_batch_keys_bucket{op=\"exists\",le=\"1\"}") == 0);
    assert_true(kvp_test_prom_value(cb, "kvpool_client_batch_keys_bucket{op=\"exists\",le=\"2\"}") == 1);
    assert_true(kvp_test_prom_value(cb, "kvpool_client_transfer_slices_total") >= 2 * N_KEYS);
    assert_true(kvp_test_prom_value(cb, "kvpool_client_fence_failures_total") == 0);
    free(cb);
    assert_int_equal(http(cport, "GET", "/readyz", NULL, NULL), 200);

    /* The master publishes every 500 ms: poll until the snapshot shows the calls. */
    bool ok = false;
    for (uint64_t end = now_ms() + 10000; !ok && now_ms() < end; sleep_ms(200)) {
        char *b = mscrape(leader);
        ok = kvp_test_prom_value(b, put_ok) >= p0 + N_KEYS && kvp_test_prom_value(b, get_ok) >= g0 + N_KEYS &&
             kvp_test_prom_value(b, get_nf) >= nf0 + 1 && kvp_test_prom_value(b, put_lat) >= l0 + N_KEYS &&
             kvp_test_prom_value(b, put_key_ok) >= pk0 + N_KEYS &&
             kvp_test_prom_value(b, "kvpool_objects") >= o0 + N_KEYS;
        free(b);
    }
    if (!ok) {
        char *b = mscrape(leader);
        fprintf(stderr, "leader metrics:\n%s\n", b);
        free(b);
    }
    assert_true(ok);
    /* The segment's counters are read live (no publish delay). */
    assert_true(seg_value(wr) >= w0 + N_KEYS * VAL_BYTES);
    assert_true(seg_value(rd) >= r0 + N_KEYS * VAL_BYTES);
    assert_true(seg_value(wr_ok) >= wo0 + N_KEYS);
    assert_true(seg_value(rd_ok) >= ro0 + N_KEYS);
    assert_true(seg_value("kvpool_segment_connections_accepted_total") >= acc0 + 1);
    assert_true(seg_value("kvpool_segment_connections") >= 1); /* the client keeps its connections */
    kvp_client_close(&c);
    kvp_config_destroy(&cfg);
    assert_int_equal(http(cport, "GET", "/healthz", NULL, NULL), 0); /* closed with the client */
    char *b = mscrape(leader);
    check_format("leader after traffic", b);
    free(b);
}

/* kvpoolctl top: the same numbers as a terminal view (two screens, then exit 0). */
static void test_metrics_kvpoolctl_top_shows_cluster(void **state)
{
    assert_true(C.mounted);
    assert_true(find_leader() >= 0);
    char exe[600], eps[200], out[300];
    snprintf(exe, sizeof exe, "%s/kvpoolctl", C.bin);
    snprintf(eps, sizeof eps, "%s:%u,%s:%u,%s:%u,127.0.0.1:%u", C.mhost[0], C.mport[0], C.mhost[1], C.mport[1],
             C.mhost[2], C.mport[2], C.sport);
    snprintf(out, sizeof out, "%s/top.out", C.dir);
    char *argv[] = {exe, "top", "--endpoints", eps, "--interval", "300", "--count", "2", NULL};
    pid_t pid = spawn(argv, out);
    assert_true(pid > 0);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_true(file_has(out, " leader "));
    assert_true(file_has(out, " follower "));
    assert_true(file_has(out, " mounted "));
    assert_true(file_has(out, C.seg_name));
    assert_true(file_has(out, "POOL (leader 127.0.0."));
    assert_true(file_has(out, "type=\"put_start\",code=\"KVP_OK\""));
    /* usage errors: exit 2 */
    char *bad[] = {exe, "top", "--interval", "5", "--endpoints", eps, NULL};
    snprintf(out, sizeof out, "%s/top-bad.out", C.dir);
    pid = spawn(bad, out);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_int_equal(WEXITSTATUS(st), 2);
    assert_true(file_has(out, "--interval 5: milliseconds in [100, 3600000]"));
}

/* A leadership transfer moves kvpool_raft_leader_changes_total on every master, the pool view
 * and /get_all_segments follow the new leader, and the old one now redirects to it. */
static void test_metrics_leader_change_counted_and_followed(void **state)
{
    assert_true(C.mounted);
    int old = find_leader();
    assert_true(old >= 0);
    double before[NM];
    for (int i = 0; i < NM; i++) {
        char *b = mscrape(i);
        before[i] = kvp_test_prom_value(b, "kvpool_raft_leader_changes_total");
        free(b);
    }
    char exe[600], out[300];
    snprintf(exe, sizeof exe, "%s/kvpoolctl", C.bin);
    snprintf(out, sizeof out, "%s/transfer.out", C.dir);
    char *argv[] = {exe, "--masters", C.masters, "transfer-leader", NULL};
    /* A transfer can time out on a loaded host (the target did not lead in time): try again,
     * at most 3 times; what is checked is what the metrics say once leadership moved. */
    int now = -1;
    for (int attempt = 0; attempt < 3 && (now < 0 || now == old); attempt++) {
        pid_t pid = spawn(argv, out);
        int st = 0;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fprintf(stderr, "note: kvpoolctl transfer-leader try %d exited %d\n", attempt + 1,
                    WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        for (uint64_t end = now_ms() + 10000; now_ms() < end; sleep_ms(200)) {
            now = find_leader();
            if (now >= 0 && now != old)
                break;
        }
    }
    assert_true(now >= 0 && now != old);
    bool counted = false;
    for (uint64_t end = now_ms() + 10000; !counted && now_ms() < end; sleep_ms(200)) {
        counted = true;
        for (int i = 0; i < NM; i++) {
            char *b = mscrape(i);
            counted &= kvp_test_prom_value(b, "kvpool_raft_leader_changes_total") >= before[i] + 1;
            free(b);
        }
    }
    assert_true(counted);
    char want[80], loc[160], *body = NULL, *hdr = NULL;
    snprintf(want, sizeof want, "%s\n", C.seg_name);
    for (uint64_t end = now_ms() + 10000; now_ms() < end; sleep_ms(200)) {
        free(body);
        body = NULL;
        if (mhttp(now, "GET", "/get_all_segments", &body, NULL) == 200 && strcmp(body, want) == 0)
            break;
    }
    assert_string_equal(body, want);
    free(body);
    snprintf(loc, sizeof loc, "Location: http://%s:%u/get_all_segments", C.mhost[now], C.mport[now]);
    bool redirected = false;
    for (uint64_t end = now_ms() + 10000; !redirected && now_ms() < end; sleep_ms(200)) {
        redirected = mhttp(old, "GET", "/get_all_segments", &body, &hdr) == 307 && strstr(hdr, loc);
        free(body);
        free(hdr);
        body = hdr = NULL;
    }
    assert_true(redirected);
}

/* The segment's id from its own scrape (kvpool_segment_info's segment_id label); 0 when none. */
static uint32_t seg_id_now(void)
{
    char *b = scrape(C.sport);
    const char *p = strstr(b, "segment_id=\"");
    uint32_t id = p ? (uint32_t)strtoul(p + strlen("segment_id=\""), NULL, 10) : 0;
    free(b);
    return id;
}

/* A segment declared lost remounts under its name as a new segment, so the leader's table holds
 * two segments of one name (the old one LOST). The leader's scrape must stay valid: one sample
 * per name in the per-segment series (the newest segment), the LOST one still counted in
 * kvpool_pool_segments, and /get_all_segments lists the name once. */
static void test_metrics_remounted_segment_one_series_per_name(void **state)
{
    assert_true(C.mounted);
    uint32_t old_id = seg_id_now();
    assert_true(old_id > 0);
    char exe[600], out[300], ids[16];
    snprintf(exe, sizeof exe, "%s/kvpoolctl", C.bin);
    snprintf(out, sizeof out, "%s/segment-lost.out", C.dir);
    snprintf(ids, sizeof ids, "%u", old_id);
    char *argv[] = {exe, "--masters", C.masters, "segment-lost", ids, "--yes", NULL};
    pid_t pid = spawn(argv, out);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* The heartbeat sees LOST and remounts: a new id. */
    uint32_t new_id = 0;
    for (uint64_t end = now_ms() + 30000; now_ms() < end; sleep_ms(200)) {
        new_id = seg_id_now();
        if (new_id != 0 && new_id != old_id)
            break;
    }
    assert_true(new_id != 0 && new_id != old_id);
    /* The leader's view (refreshed every second) shows both: one LOST, the name ACTIVE again. */
    char active[160];
    snprintf(active, sizeof active, "kvpool_pool_segment_state{segment=\"%s\",state=\"ACTIVE\"}", C.seg_name);
    char *b = NULL;
    bool seen = false;
    for (uint64_t end = now_ms() + 30000; !seen && now_ms() < end; sleep_ms(200)) {
        int leader = find_leader();
        free(b);
        b = NULL;
        if (leader < 0 || mhttp(leader, "GET", "/metrics", &b, NULL) != 200)
            continue;
        seen = kvp_test_prom_value(b, "kvpool_pool_segments{state=\"LOST\"}") >= 1.0 &&
               kvp_test_prom_value(b, active) == 1.0;
    }
    assert_true(seen);
    check_format("leader after a remount", b); /* duplicate series fail here */
    free(b);
    int leader = find_leader();
    assert_true(leader >= 0);
    char want[80], *body = NULL;
    snprintf(want, sizeof want, "%s\n", C.seg_name);
    assert_int_equal(mhttp(leader, "GET", "/get_all_segments", &body, NULL), 200);
    assert_string_equal(body, want);
    free(body);
}

/* `kvpoolctl cluster up --metrics`: every member gets a metrics port, named in cluster.json as
 * "metrics", and `kvpoolctl --cluster DIR top` finds them there. */
static void test_metrics_cluster_up_metrics_and_top(void **state)
{
    char exe[600], dir[200], out[300], file[300];
    snprintf(exe, sizeof exe, "%s/kvpoolctl", C.bin);
    snprintf(dir, sizeof dir, "%s/cu", C.dir);
    snprintf(out, sizeof out, "%s/cu.out", C.dir);
    snprintf(file, sizeof file, "%s/cluster.json", dir);
    (void)kvp_test_cluster_guard(); /* its daemons die with this process, however it ends */
    char *up[] = {exe, "cluster", "up", "--dir", dir, "--masters", "1", "--segments", "1", "--segment-size", "32M",
                  "--metrics", NULL};
    C.cu_up = true;
    pid_t pid = spawn(up, out);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_true(file_has(out, "metrics: kvpoolctl --cluster"));
    /* cluster.json: one "metrics" address per member, each serving valid text */
    FILE *f = fopen(file, "r");
    assert_non_null(f);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    int found = 0;
    for (char *p = strstr(buf, "\"metrics\""); p; p = strstr(p + 1, "\"metrics\"")) {
        char host[64];
        unsigned port = 0;
        assert_int_equal(sscanf(p, "\"metrics\": \"%63[0-9.]:%u\"", host, &port), 2);
        char *b = scrape_at(host, port);
        check_format("cluster up --metrics member", b);
        free(b);
        found++;
    }
    assert_int_equal(found, 2);
    snprintf(out, sizeof out, "%s/cu-top.out", C.dir);
    char *top[] = {exe, "--cluster", dir, "top", "--count", "1", NULL};
    /* A segment's own kvpool_segment_mounted follows the mount's answer in that process, which
     * may come after the leader listed it ACTIVE (what cluster up waits for): top again until
     * it shows one mounted (20 tries, 250 ms apart), instead of assuming it at once. */
    for (int i = 0; i < 20; i++) {
        pid = spawn(top, out);
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_int_equal(WEXITSTATUS(st), 0);
        if (file_has(out, " mounted "))
            break;
        usleep(250000);
    }
    assert_true(file_has(out, " leader "));
    assert_true(file_has(out, " mounted "));
    cluster_down_cu();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_segment_started_first_mounts_when_masters_appear),
        cmocka_unit_test(test_metrics_endpoints_answer_as_documented),
        cmocka_unit_test(test_metrics_counters_move_with_puts_and_gets),
        cmocka_unit_test(test_metrics_kvpoolctl_top_shows_cluster),
        cmocka_unit_test(test_metrics_leader_change_counted_and_followed),
        cmocka_unit_test(test_metrics_remounted_segment_one_series_per_name),
        cmocka_unit_test(test_metrics_cluster_up_metrics_and_top),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
