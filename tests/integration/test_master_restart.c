/*
 * test_master_restart.c — issue 15: a daemon restarted while its listen port or data dir is
 * still held (a killed previous incarnation whose threads are still exiting, or anything else)
 * waits for it instead of exiting, and two masters never share one data dir. On real
 * processes started with `kvpoolctl cluster up` (loopback, free ports):
 *  (a) a member is killed, the test itself takes the member's control port and holds it while
 *      `kvpoolctl cluster restart` starts the member again; once the member's log shows a bind
 *      retry naming the address, the test lets the port go: the member binds, rejoins the
 *      quorum (leadership is handed to it, and it serves every acknowledged put);
 *  (b) a second kvpool-master on a running member's data dir (other ports, so only the lock can
 *      stop it) exits 1 with an error naming the dir, and changes nothing in that dir;
 *  (c) kvpool-segment on a fixed port the test holds: it logs retries, binds once the port is
 *      free, and mounts.
 * No step waits a fixed time: each waits for a log line, an exit or an answer, with a bound.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "tests/integration/test_master_util.h"
#include "tests/lib/proc_reap.h"

static int setup(void **state)
{
    struct tm_cluster *c = calloc(1, sizeof *c);
    *state = c;
    return c ? 0 : -1;
}

static int teardown(void **state)
{
    (void)kvp_test_children_kill();
    tm_cluster_down(*state);
    free(*state);
    return 0;
}

/* Listen on 127.0.0.1:port (as a squatter would); -1 if the port cannot be taken. */
static int hold_port(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 8) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int free_port(void)
{
    int fd = hold_port(0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

static off_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : 0;
}

/* Wait up to timeout_ms until `path`, read from byte `from`, contains `needle`. */
static bool wait_log(const char *path, off_t from, const char *needle, uint32_t timeout_ms)
{
    uint64_t deadline = tm_now_ms() + timeout_ms;
    static char buf[1 << 20];
    do {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t n = pread(fd, buf, sizeof buf - 1, from);
            close(fd);
            buf[n > 0 ? n : 0] = '\0';
            if (strstr(buf, needle))
                return true;
        }
        tm_sleep_ms(20);
    } while (tm_now_ms() < deadline);
    return false;
}

/* member id's field `key` from cluster.json (a string; "" if none). */
static void member_field(struct tm_cluster *c, int id, const char *key, char *out, size_t cap)
{
    out[0] = '\0';
    json_t *j = json_load_file(c->file, 0, NULL);
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(j, "masters"), i, m) if (json_integer_value(json_object_get(m, "id")) == id)
        snprintf(out, cap, "%s", json_string_value(json_object_get(m, key)) ?: "");
    json_decref(j);
}

static void test_master_restart_waits_for_held_port_then_rejoins(void **state)
{
    struct tm_cluster *c = *state;
    assert_int_equal(tm_cluster_up(c), 0);
    int leader = tm_leader(c, 10000);
    assert_true(leader > 0);
    int id = leader % TM_MASTERS + 1; /* a follower */
    char key[64];
    char *acked[40];
    for (unsigned i = 0; i < 20; i++) {
        tm_key(key, sizeof key, "before", i);
        assert_int_equal(tm_put(c, key, 5000), KVP_OK);
        acked[i] = strdup(key);
    }
    tm_kill(c, id);
    int port = atoi(strrchr(c->addr[id], ':') + 1);
    int squat = hold_port(port);
    assert_true(squat >= 0);
    char log[512];
    member_field(c, id, "log", log, sizeof log);
    off_t from = file_size(log);
    assert_int_equal(tm_restart(c, id), 0);
    char needle[128];
    snprintf(needle, sizeof needle, "bind tcp://%s: Address already in use; retry", c->addr[id]);
    bool retried = wait_log(log, from, needle, 10000);
    /* Puts go on meanwhile (two of three members form the quorum). */
    for (unsigned i = 20; i < 40; i++) {
        tm_key(key, sizeof key, "during", i);
        assert_int_equal(tm_put(c, key, 5000), KVP_OK);
        acked[i] = strdup(key);
    }
    bool still_trying = tm_alive(c->pids[id]);
    close(squat);
    print_message("restarted member %d on held port %d: retry logged %d, alive while held %d\n", id, port, retried,
                  still_trying);
    assert_true(retried);
    assert_true(still_trying);
    snprintf(needle, sizeof needle, "bind tcp://%s: done at try", c->addr[id]);
    assert_true(wait_log(log, from, needle, 10000));
    /* Rejoined: it takes the leadership and serves every acknowledged put. */
    assert_int_equal(tm_transfer(c, id, 15000), 0);
    assert_int_equal(tm_count_existing(c, acked, 40, 5000), 40);
    assert_int_equal(tm_put(c, "after-rejoin", 5000), KVP_OK);
    assert_true(tm_alive(c->pids[id]));
    for (unsigned i = 0; i < 40; i++)
        free(acked[i]);
}

/* Names, sizes and modification times of every file in dir, one line each, sorted by readdir
 * order of a fresh scan (compared as a whole before and after). */
static void dir_listing(const char *dir, char *out, size_t cap)
{
    out[0] = '\0';
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        char p[1024];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, ents[i]->d_name);
        if (ents[i]->d_name[0] != '.' && stat(p, &st) == 0) {
            size_t len = strlen(out);
            snprintf(out + len, cap - len, "%s %lld %lld.%09ld\n", ents[i]->d_name, (long long)st.st_size,
                     (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
        }
        free(ents[i]);
    }
    free(ents);
}

static void test_master_second_on_data_dir_in_use_exits_untouched(void **state)
{
    struct tm_cluster *c = *state;
    assert_int_equal(tm_cluster_up(c), 0);
    assert_true(tm_leader(c, 10000) > 0);
    const int id = 1;
    /* member 1's command line, with other ports: only the data-dir lock can stop it */
    json_t *j = json_load_file(c->file, 0, NULL);
    assert_non_null(j);
    json_t *cmd = NULL;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(j, "masters"), i, m) if (json_integer_value(json_object_get(m, "id")) == id)
        cmd = json_object_get(m, "cmdline");
    assert_non_null(cmd);
    char data_dir[512] = "";
    char *argv[64];
    size_t n = 0;
    char ports[2][64];
    snprintf(ports[0], sizeof ports[0], "127.0.0.1:%d", free_port());
    snprintf(ports[1], sizeof ports[1], "127.0.0.1:%d", free_port());
    for (i = 0; i < json_array_size(cmd) && n < 58; i++) {
        const char *a = json_string_value(json_array_get(cmd, i));
        argv[n++] = (char *)a;
        if (i + 1 < json_array_size(cmd) && strcmp(a, "--listen") == 0)
            argv[n++] = ports[0], i++;
        else if (i + 1 < json_array_size(cmd) && strcmp(a, "--raft-address") == 0)
            argv[n++] = ports[1], i++;
        else if (i + 1 < json_array_size(cmd) && strcmp(a, "--data-dir") == 0)
            snprintf(data_dir, sizeof data_dir, "%s", json_string_value(json_array_get(cmd, i + 1)));
    }
    argv[n] = NULL;
    assert_true(data_dir[0]);
    /* The holder is stopped while the second one runs, so nothing else changes the dir. */
    assert_true(tm_stop(c, id)); /* every thread stopped before the listing (tests/lib/proc_stop.h) */
    static char before[16384], after[16384];
    dir_listing(data_dir, before, sizeof before);
    char errlog[600];
    snprintf(errlog, sizeof errlog, "%s/second-master.log", c->dir);
    pid_t pid = fork();
    kvp_test_child_track(pid); /* killed at teardown if a failed assert skips its stop */
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(errlog, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        setenv("KVPOOL_BIND_RETRY_MS", "600", 1); /* give up on the lock soon */
        setenv("KVPOOL_AUTH", "none", 1);         /* this test is about the data-dir lock, not keys */
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0, code = -1;
    uint64_t deadline = tm_now_ms() + 15000;
    while (waitpid(pid, &st, WNOHANG) == 0 && tm_now_ms() < deadline)
        tm_sleep_ms(20);
    if (kill(pid, 0) == 0 && waitpid(pid, &st, WNOHANG) == 0) {
        kill(pid, SIGKILL); /* still running on a shared data dir: the failure this test is for */
        waitpid(pid, &st, 0);
    } else if (WIFEXITED(st)) {
        code = WEXITSTATUS(st);
    }
    dir_listing(data_dir, after, sizeof after);
    tm_signal(c, id, SIGCONT);
    json_decref(j);
    char needle[700];
    snprintf(needle, sizeof needle, "lock data dir %s: in use by another process (pid %d)", data_dir, c->pids[id]);
    bool named = wait_log(errlog, 0, needle, 1);
    bool clear = wait_log(errlog, 0, "is in use by another kvpool-master", 1);
    print_message("second master on %s: exit %d, lock error logged %d, dir unchanged %d\n", data_dir, code, named,
                  strcmp(before, after) == 0);
    assert_int_equal(code, 1);
    assert_true(named);
    assert_true(clear);
    assert_string_equal(before, after);
    /* The holder serves on. */
    assert_int_equal(tm_put(c, "after-second", 8000), KVP_OK);
}

static void test_segment_waits_for_held_port_then_mounts(void **state)
{
    struct tm_cluster *c = *state;
    assert_int_equal(tm_cluster_up(c), 0);
    int port = free_port();
    int squat = hold_port(port);
    assert_true(squat >= 0);
    char seg[600], log[600], ports[16];
    const char *bd = getenv("KVP_BUILD_DIR");
    snprintf(seg, sizeof seg, "%s/tools/kvpool-segment", bd ? bd : ".");
    snprintf(log, sizeof log, "%s/held-port-segment.log", c->dir);
    snprintf(ports, sizeof ports, "%d", port);
    char *argv[] = {seg, "--cluster-file", c->file, "--global-segment-size", "16M", "--port", ports,
                    "--segment-prefault", "false", "--name", "held-port-seg", NULL};
    pid_t pid = fork();
    kvp_test_child_track(pid);
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    char needle[128];
    snprintf(needle, sizeof needle, "port %d: Address already in use; retry", port);
    bool retried = wait_log(log, 0, needle, 10000);
    bool alive = waitpid(pid, NULL, WNOHANG) == 0;
    close(squat);
    bool mounted = wait_log(log, 0, "kvpool-segment: held-port-seg id", 10000);
    print_message("segment on held port %d: retry logged %d, alive while held %d, mounted %d\n", port, retried, alive,
                  mounted);
    kill(pid, SIGINT);
    int st = 0;
    uint64_t deadline = tm_now_ms() + 10000;
    while (waitpid(pid, &st, WNOHANG) == 0 && tm_now_ms() < deadline)
        tm_sleep_ms(20);
    if (tm_now_ms() >= deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    assert_true(retried);
    assert_true(alive);
    assert_true(mounted);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_master_restart_waits_for_held_port_then_rejoins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_master_second_on_data_dir_in_use_exits_untouched, setup, teardown),
        cmocka_unit_test_setup_teardown(test_segment_waits_for_held_port_then_mounts, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
