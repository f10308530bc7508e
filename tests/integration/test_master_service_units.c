/*
 * test_master_service_units.c — issue 24 items 2 and 3 against real processes on loopback:
 *  - mooncake_master's command line from ../shared/clients/mooncake-python.md ("Master flags an
 *    operator copies from a Mooncake deployment"), flag for flag, starts a kvpool-master that
 *    serves: /readyz, /get_all_segments on --metrics_port, a segment mounts at --rpc_port, a
 *    client puts and gets bytes through it; the flags it does not need are logged as such;
 *  - under a fake NOTIFY_SOCKET (what systemd's Type=notify hands a service) each daemon sends
 *    READY=1 — the master once it serves, the segment once mounted, not before — and
 *    STOPPING=1 when stopped; both exit 0;
 *  - a bad Mooncake flag value exits 2 with a line naming it;
 *  - --log-format json: the daemon's log lines are JSON objects.
 *
 * The only things not from the Mooncake line: the ports (free ones instead of 50051/9003/8080,
 * which other tests on this host may hold), the working directory (a temporary one: the data
 * dir's default is relative) and KVPOOL_RAFT_ADDRESS in the environment (the Raft port, which
 * Mooncake has none of, would default to 7201). Every process is started here and stopped here
 * by its pid, also on failure (atexit).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "kvpool.h"
#include "tests/lib/http_get.h"
#include "tests/lib/proc_reap.h"

static struct {
    char dir[128];
    char bin[512];
    uint32_t rpc, raft, metrics, http_md;
    pid_t master, seg;
    int master_fd, seg_fd; /* the fake NOTIFY_SOCKETs */
    char master_log[256], seg_log[256];
    bool master_ready;
} C = {.master_fd = -1, .seg_fd = -1};

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

/* fork + exec with stdout/stderr to log, in `cwd`, with NAME=VALUE pairs added to env. */
static pid_t spawn(char *const argv[], const char *log, const char *cwd, const char *const env[])
{
    pid_t pid = fork();
    kvp_test_child_track(pid); /* killed at teardown if a failed assert skips its stop */
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (cwd && chdir(cwd) != 0)
            _exit(126);
        for (size_t i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
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

/* sig, then wait up to wait_ms for the exit; returns the exit status (-1: killed by us). */
static int stop(pid_t *pid, int sig, unsigned wait_ms)
{
    if (*pid <= 0)
        return -1;
    kill(*pid, sig);
    int st = 0;
    pid_t r = 0;
    for (uint64_t end = now_ms() + wait_ms; (r = waitpid(*pid, &st, WNOHANG)) == 0 && now_ms() < end;)
        sleep_ms(50);
    if (r == 0) {
        kill(*pid, SIGKILL);
        waitpid(*pid, &st, 0);
        *pid = 0;
        return -1;
    }
    *pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void teardown_all(void)
{
    stop(&C.seg, SIGINT, 5000);
    stop(&C.master, SIGTERM, 5000);
    if (C.master_fd >= 0)
        close(C.master_fd);
    if (C.seg_fd >= 0)
        close(C.seg_fd);
    C.master_fd = C.seg_fd = -1;
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
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

/* A fake NOTIFY_SOCKET: a datagram socket bound at DIR/name. */
static int notify_socket(const char *name, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", C.dir, name);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    assert_true(strlen(path) < sizeof sa.sun_path);
    strcpy(sa.sun_path, path);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

/* The next datagram within timeout_ms into buf (NUL-terminated); false when none came. */
static bool notify_recv(int fd, char *buf, size_t cap, unsigned timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)timeout_ms) != 1)
        return false;
    ssize_t n = recv(fd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    return n > 0;
}

static uint32_t fresh_port(const uint32_t *taken, int n)
{
    for (;;) {
        uint32_t p = kvp_test_free_port();
        bool dup = p == 0;
        for (int i = 0; i < n; i++)
            dup |= taken[i] == p;
        if (!dup)
            return p;
    }
}

static int http(const char *path, char **body)
{
    int st = 0;
    char *b = NULL;
    if (kvp_test_http(C.metrics, "GET", path, &st, &b, NULL, 3000) != 0)
        st = 0;
    if (body)
        *body = b;
    else
        free(b);
    return st;
}

static int group_setup(void **state)
{
    (void)state;
    const char *bd = getenv("KVP_BUILD_DIR");
    snprintf(C.bin, sizeof C.bin, "%s/tools", bd ? bd : ".");
    /* Mooncake's command lines, flag for flag, carry no keys: the processes started here run with
     * auth none (the one WARN each); authentication has its own tests (test_auth_cluster.c). */
    setenv("KVPOOL_AUTH", "none", 1);
    snprintf(C.dir, sizeof C.dir, "/tmp/kvp-service-test-XXXXXX");
    if (!mkdtemp(C.dir))
        return -1;
    atexit(teardown_all);
    uint32_t p[4] = {0};
    for (int i = 0; i < 4; i++)
        p[i] = fresh_port(p, i);
    C.rpc = p[0];
    C.raft = p[1];
    C.metrics = p[2];
    C.http_md = p[3];
    snprintf(C.master_log, sizeof C.master_log, "%s/master.log", C.dir);
    snprintf(C.seg_log, sizeof C.seg_log, "%s/seg.log", C.dir);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    teardown_all();
    return 0;
}

/* mooncake_master's flags start a kvpool-master; it says READY=1 once it serves. */
static void test_master_mooncake_flags_serve_and_notify_ready(void **state)
{
    (void)state;
    char npath[256];
    C.master_fd = notify_socket("notify-master", npath, sizeof npath);
    char exe[600], rpc[16], metrics[16], http_md[16];
    snprintf(exe, sizeof exe, "%s/kvpool-master", C.bin);
    snprintf(rpc, sizeof rpc, "%u", C.rpc);
    snprintf(metrics, sizeof metrics, "%u", C.metrics);
    snprintf(http_md, sizeof http_md, "%u", C.http_md);
    /* ../shared/clients/mooncake-python.md, last section, flag for flag */
    char *argv[] = {exe, "--rpc_port", rpc, "--rpc_address", "127.0.0.1", "--default_kv_lease_ttl", "5000",
                    "--client_ttl", "10", "--eviction_ratio", "0.05", "--eviction_high_watermark_ratio", "0.95",
                    "--metrics_port", metrics, "--rpc_thread_num", "8", "--enable_http_metadata_server=true",
                    "--http_metadata_server_host", "127.0.0.1", "--http_metadata_server_port", http_md, NULL};
    static char env_notify[300], env_raft[64];
    snprintf(env_notify, sizeof env_notify, "NOTIFY_SOCKET=%s", npath);
    snprintf(env_raft, sizeof env_raft, "KVPOOL_RAFT_ADDRESS=127.0.0.1:%u", C.raft);
    const char *env[] = {env_notify, env_raft, NULL};
    C.master = spawn(argv, C.master_log, C.dir, env);
    assert_true(C.master > 0);

    char msg[512];
    bool got = notify_recv(C.master_fd, msg, sizeof msg, 30000);
    if (!got)
        fail_msg("no READY=1 from kvpool-master within 30 s (alive %d; see %s)", alive(C.master), C.master_log);
    char want[128];
    snprintf(want, sizeof want, "STATUS=serving on 127.0.0.1:%u", C.rpc);
    if (!strstr(msg, "READY=1") || !strstr(msg, want))
        fail_msg("notify datagram '%s' lacks READY=1 / '%s'", msg, want);
    C.master_ready = true;

    /* It serves: the health endpoints on --metrics_port, a leader (this single member). */
    assert_int_equal(http("/healthz", NULL), 200);
    int st = 0;
    for (uint64_t end = now_ms() + 20000; now_ms() < end && (st = http("/readyz", NULL)) != 200;)
        sleep_ms(100);
    assert_int_equal(st, 200);
    /* the segment list is published by the leader's loop (every 500 ms): 503 until then */
    char *body = NULL;
    for (uint64_t end = now_ms() + 10000; now_ms() < end && (st = http("/get_all_segments", &body)) != 200;) {
        free(body);
        body = NULL;
        sleep_ms(100);
    }
    assert_int_equal(st, 200);
    assert_string_equal(body, ""); /* no segment yet */
    free(body);
    /* the units as Mooncake's: --client_ttl 10 is 10 s, --default_kv_lease_ttl 5000 is 5 s */
    assert_true(file_has(C.master_log, "rpc_thread_num: accepted, not used here: Mooncake's RPC thread count: "
                                       "not needed"));
    assert_true(file_has(C.master_log, "enable_http_metadata_server: accepted, not used here"));
    assert_true(file_has(C.master_log, "http_metadata_server_host: accepted, not used here"));
    assert_true(file_has(C.master_log, "http_metadata_server_port: accepted, not used here"));
    /* the HTTP metadata server is not started: nothing listens on its port */
    int hst = 0;
    char *hb = NULL;
    assert_int_not_equal(kvp_test_http(C.http_md, "GET", "/metadata", &hst, &hb, NULL, 1000), 0);
    free(hb);
}

/* A segment with no master to mount at says nothing; SIGTERM then exits at once, unmounted. */
static void test_segment_not_mounted_sends_no_ready(void **state)
{
    (void)state;
    char npath[256], exe[600], masters[64], log[300];
    int fd = notify_socket("notify-seg-orphan", npath, sizeof npath);
    snprintf(exe, sizeof exe, "%s/kvpool-segment", C.bin);
    uint32_t taken[4] = {C.rpc, C.raft, C.metrics, C.http_md};
    snprintf(masters, sizeof masters, "127.0.0.1:%u", fresh_port(taken, 4)); /* nobody there */
    snprintf(log, sizeof log, "%s/seg-orphan.log", C.dir);
    char *argv[] = {exe, "--master-server-address", masters, "--global-segment-size", "16M",
                    "--hugepages=false", "--segment-prefault=false", "--log-format", "json", NULL};
    static char env_notify[300];
    snprintf(env_notify, sizeof env_notify, "NOTIFY_SOCKET=%s", npath);
    const char *env[] = {env_notify, NULL};
    pid_t pid = spawn(argv, log, C.dir, env);
    assert_true(pid > 0);
    /* its first mount try has failed (logged) before we look */
    for (uint64_t end = now_ms() + 20000; now_ms() < end && !file_has(log, "mount try 1:");)
        sleep_ms(100);
    assert_true(file_has(log, "mount try 1:"));
    /* --log-format json: every line so far is one JSON object (before the signal's own line) */
    FILE *lf = fopen(log, "r");
    assert_non_null(lf);
    char line[4096];
    int lines = 0;
    bool saw_try = false;
    while (fgets(line, sizeof line, lf)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o)
            fail_msg("log line is not JSON (%s): %s", je.text, line);
        const char *m = json_string_value(json_object_get(o, "msg"));
        saw_try |= m && strstr(m, "mount try 1:") && json_object_get(o, "level") && json_object_get(o, "actor");
        json_decref(o);
        lines++;
    }
    fclose(lf);
    assert_true(lines >= 1);
    assert_true(saw_try);
    char msg[256];
    assert_false(notify_recv(fd, msg, sizeof msg, 0));
    assert_int_equal(stop(&pid, SIGTERM, 5000), 143);
    assert_false(notify_recv(fd, msg, sizeof msg, 0));
    close(fd);
}

/* The segment says READY=1 once mounted: the master lists it at that moment. A client puts
 * and gets through the master started from Mooncake's flags. SIGTERM: STOPPING=1, drain, exit 0. */
static void test_segment_notifies_ready_once_mounted_and_data_flows(void **state)
{
    (void)state;
    if (!C.master_ready)
        skip();
    char npath[256], exe[600], masters[64], name[64];
    C.seg_fd = notify_socket("notify-seg", npath, sizeof npath);
    snprintf(exe, sizeof exe, "%s/kvpool-segment", C.bin);
    snprintf(masters, sizeof masters, "127.0.0.1:%u", C.rpc);
    snprintf(name, sizeof name, "svc-seg-%d", (int)getpid());
    char *argv[] = {exe, "--master-server-address", masters, "--global-segment-size", "64M", "--name", name,
                    "--hugepages=false", "--segment-prefault=false", "--drain-timeout-ms", "20000", NULL};
    static char env_notify[300];
    snprintf(env_notify, sizeof env_notify, "NOTIFY_SOCKET=%s", npath);
    const char *env[] = {env_notify, NULL};
    C.seg = spawn(argv, C.seg_log, C.dir, env);
    assert_true(C.seg > 0);
    char msg[512];
    if (!notify_recv(C.seg_fd, msg, sizeof msg, 30000))
        fail_msg("no READY=1 from kvpool-segment within 30 s (alive %d; see %s)", alive(C.seg), C.seg_log);
    if (!strstr(msg, "READY=1") || !strstr(msg, "STATUS=mounted as ") || !strstr(msg, name))
        fail_msg("notify datagram '%s' lacks READY=1 / mounted as %s", msg, name);
    assert_true(file_has(C.seg_log, "kvpool-segment: ")); /* the mounted line came first */

    /* The leader lists it (the published body lags by at most its 500 ms refresh). */
    char *body = NULL;
    char want[80];
    snprintf(want, sizeof want, "%s\n", name);
    for (uint64_t end = now_ms() + 10000; now_ms() < end;) {
        free(body);
        body = NULL;
        if (http("/get_all_segments", &body) == 200 && body && strstr(body, want))
            break;
        sleep_ms(100);
    }
    assert_non_null(body);
    assert_non_null(strstr(body, want));
    free(body);

    /* Bytes through the master started from Mooncake's flags. */
    kvp_config *cfg = NULL;
    kvp_client *cl = NULL;
    assert_int_equal(kvp_config_new(&cfg), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "master_server_address", masters), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "auth", "none"), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "transfer_timeout", "10"), KVP_OK);
    assert_int_equal(kvp_client_open(cfg, &cl), KVP_OK);
    kvp_config_destroy(&cfg);
    char out[4096], in[4096];
    for (size_t i = 0; i < sizeof out; i++)
        out[i] = (char)(i * 7 + 3);
    assert_int_equal(kvp_put(cl, "svc-key", out, sizeof out, NULL), KVP_OK);
    assert_int_equal(kvp_get(cl, "svc-key", in, sizeof in, 0), (int64_t)sizeof in);
    assert_memory_equal(in, out, sizeof out);
    /* the pool's only segment: its objects have nowhere to go on a drain, so remove them first */
    assert_int_equal(kvp_remove(cl, "svc-key", true), KVP_OK);
    kvp_client_close(&cl);

    /* SIGTERM: STOPPING=1 (draining), then a clean exit. */
    kill(C.seg, SIGTERM);
    assert_true(notify_recv(C.seg_fd, msg, sizeof msg, 10000));
    assert_non_null(strstr(msg, "STOPPING=1"));
    assert_non_null(strstr(msg, "draining"));
    assert_int_equal(stop(&C.seg, SIGTERM, 60000), 0);
    assert_true(file_has(C.seg_log, "SIGTERM: draining"));
}

/* SIGTERM stops the master: STOPPING=1 and exit 0 (systemd's Restart=on-failure leaves it down). */
static void test_master_sigterm_notifies_stopping_exits_0(void **state)
{
    (void)state;
    if (!C.master_ready)
        skip();
    kill(C.master, SIGTERM);
    char msg[256];
    assert_true(notify_recv(C.master_fd, msg, sizeof msg, 10000));
    assert_string_equal(msg, "STOPPING=1");
    assert_int_equal(stop(&C.master, SIGTERM, 10000), 0);
}

/* A bad value of one of Mooncake's flags: exit 2 and a line naming the flag and what is allowed. */
static void test_master_bad_mooncake_flag_exits_2_naming_it(void **state)
{
    (void)state;
    char exe[600], log[300];
    snprintf(exe, sizeof exe, "%s/kvpool-master", C.bin);
    snprintf(log, sizeof log, "%s/bad.log", C.dir);
    char *argv[] = {exe, "--rpc_port", "0", "--client_ttl", "10", NULL};
    pid_t pid = spawn(argv, log, C.dir, NULL);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 2);
    assert_true(file_has(log, "flag --rpc_port: rpc_port=0: must be a port in [1, 65535]"));
    char *argv2[] = {exe, "--rpc_threads", "8", NULL};
    pid = spawn(argv2, log, C.dir, NULL);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_int_equal(WEXITSTATUS(st), 2);
    assert_true(file_has(log, "unknown flag '--rpc_threads' for kvpool-master"));
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_master_mooncake_flags_serve_and_notify_ready),
        cmocka_unit_test(test_segment_not_mounted_sends_no_ready),
        cmocka_unit_test(test_segment_notifies_ready_once_mounted_and_data_flows),
        cmocka_unit_test(test_master_sigterm_notifies_stopping_exits_0),
        cmocka_unit_test(test_master_bad_mooncake_flag_exits_2_naming_it),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
