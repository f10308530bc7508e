/*
 * test_seg_daemon.c — the kvpool-segment process against a scripted fake master: it prints its
 * "mounted" line, serves its data plane, unmounts on SIGINT (exit 0), drains then unmounts on
 * SIGTERM (exit 0), refuses bad settings with exit status 2, and leaves at once on a signal
 * while its mount still waits for a master (130 / 143).
 * Needs the tool built ($KVP_BUILD_DIR/tools/kvpool-segment); skips when it is missing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "seg_fake_master.h"
#include "tests/lib/proc_reap.h"

static char g_exe[1024];

struct proc {
    pid_t pid;
    FILE *out;
};

/* Start kvpool-segment with argv (NULL-terminated, without argv[0]); stdout is piped back. */
static int spawn(struct proc *p, const char *const *args)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    p->pid = fork();
    kvp_test_child_track(p->pid); /* killed at teardown if a failed assert skips its stop */
    if (p->pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        const char *argv[32] = {g_exe};
        for (int i = 0; args[i] && i < 30; i++)
            argv[i + 1] = args[i];
        execv(g_exe, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    p->out = fdopen(fds[0], "r");
    return p->pid > 0 ? 0 : -1;
}

/* Wait for the child's exit status, at most ~10 s (then SIGKILL). */
static int reap(struct proc *p)
{
    int st = 0;
    for (int i = 0; i < 10000; i++) {
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r == p->pid) {
            fclose(p->out);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        usleep(1000);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
    fclose(p->out);
    return -1;
}

static int setup(void **state)
{
    const char *b = getenv("KVP_BUILD_DIR");
    snprintf(g_exe, sizeof g_exe, "%s/tools/kvpool-segment", b ? b : ".");
    setenv("KVPOOL_AUTH", "none", 1); /* the scripted fake master speaks ZeroMQ's NULL mechanism */
    struct fake_master *fm = calloc(1, sizeof *fm);
    if (fm_start(fm) != 0)
        return -1;
    *state = fm;
    return 0;
}

static int teardown(void **state)
{
    struct fake_master *fm = *state;
    fm_stop(fm);
    free(fm);
    return 0;
}

static void skip_without_tool(void)
{
    if (access(g_exe, X_OK) != 0) /* built with the tests; its absence is a failure, not a skip */
        fail_msg("%s not built", g_exe);
}

/* Read the "kvpool-segment: NAME id ID endpoint EP size BYTES" line. */
static void read_mounted(struct proc *p, char *name, unsigned *id, char *ep, unsigned long long *size)
{
    char line[512];
    assert_non_null(fgets(line, sizeof line, p->out));
    assert_int_equal(sscanf(line, "kvpool-segment: %127s id %u endpoint %127s size %llu", name, id, ep, size), 4);
}

static void test_seg_daemon_sigint_unmounts_exit_0(void **state)
{
    struct fake_master *fm = *state;
    skip_without_tool();
    struct proc p;
    const char *args[] = {"--master-server-address", fm->addr, "--global-segment-size", "8M",
                          "--name", "daemon-a", "--heartbeat-ms", "50", "--local-hostname", "127.0.0.1", NULL};
    assert_int_equal(spawn(&p, args), 0);
    char name[128], ep[128];
    unsigned id = 0;
    unsigned long long size = 0;
    read_mounted(&p, name, &id, ep, &size);
    assert_string_equal(name, "daemon-a");
    assert_int_equal(id, 1);
    assert_int_equal(size, 8ull << 20);
    assert_int_equal(kvp_xfer_probe(ep, id, 2000), KVP_OK);
    for (int i = 0; i < 5000 && atomic_load(&fm->heartbeats) < 2; i++)
        usleep(1000);
    assert_true(atomic_load(&fm->heartbeats) >= 2);
    kill(p.pid, SIGINT);
    assert_int_equal(reap(&p), 0);
    assert_int_equal(atomic_load(&fm->unmounts), 1);
    assert_int_equal(atomic_load(&fm->unmounted_id), 1);
    assert_int_equal(atomic_load(&fm->drains), 0);
}

static void test_seg_daemon_sigterm_drains_then_unmounts_exit_0(void **state)
{
    struct fake_master *fm = *state;
    skip_without_tool();
    atomic_store(&fm->objects, 2); /* decremented by each status query: the drain completes */
    struct proc p;
    const char *args[] = {"--master-server-address", fm->addr, "--global-segment-size", "4M",
                          "--drain-timeout-ms", "5000", NULL};
    assert_int_equal(spawn(&p, args), 0);
    char name[128], ep[128];
    unsigned id = 0;
    unsigned long long size = 0;
    read_mounted(&p, name, &id, ep, &size);
    assert_true(strncmp(name, "127.0.0.1-", 10) == 0); /* default name <local_hostname>-<port> */
    kill(p.pid, SIGTERM);
    assert_int_equal(reap(&p), 0);
    assert_int_equal(atomic_load(&fm->drains), 1);
    assert_int_equal(atomic_load(&fm->drained_id), id);
    assert_int_equal(atomic_load(&fm->objects), 0);
    assert_int_equal(atomic_load(&fm->unmounts), 1);
}

static void test_seg_daemon_bad_settings_exit_2(void **state)
{
    struct fake_master *fm = *state;
    skip_without_tool();
    struct proc p;
    const char *args[] = {"--master-server-address", fm->addr, "--no-such-key", "1", NULL};
    assert_int_equal(spawn(&p, args), 0);
    assert_int_equal(reap(&p), 2);
    const char *none[] = {"--global-segment-size", "4M", NULL}; /* no masters */
    unsetenv("KVPOOL_MASTER_SERVER_ADDRESS");
    unsetenv("KVPOOL_CLUSTER_FILE");
    assert_int_equal(spawn(&p, none), 0);
    assert_int_equal(reap(&p), 2);
    const char *pc[] = {"--print-config", "--global-segment-size", "4M", NULL};
    assert_int_equal(spawn(&p, pc), 0);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, p.out);
    buf[n] = '\0';
    assert_int_equal(reap(&p), 0);
    assert_non_null(strstr(buf, "global_segment_size"));
    assert_int_equal(atomic_load(&fm->mounts), 0);
}

/* No master answers (nothing listens at port 1): the start waits in the mount, up to its
 * timeout. SIGINT / SIGTERM then end the process at once with 130 / 143 and no mount; before,
 * the signal waited for the mount's timeout and the process exited 1 ("cannot start"). */
static void test_seg_daemon_signal_while_mounting_exits_at_once(void **state)
{
    struct fake_master *fm = *state;
    skip_without_tool();
    const int sigs[] = {SIGINT, SIGTERM}, want[] = {130, 143};
    for (int i = 0; i < 2; i++) {
        struct proc p;
        const char *args[] = {"--master-server-address", "127.0.0.1:1", "--global-segment-size", "4M", NULL};
        assert_int_equal(spawn(&p, args), 0);
        usleep(300 * 1000); /* into the start (a signal sent earlier stays pending: same result) */
        kill(p.pid, sigs[i]);
        assert_int_equal(reap(&p), want[i]);
    }
    assert_int_equal(atomic_load(&fm->mounts), 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_seg_daemon_sigint_unmounts_exit_0, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seg_daemon_sigterm_drains_then_unmounts_exit_0, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seg_daemon_bad_settings_exit_2, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seg_daemon_signal_while_mounting_exits_at_once, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
