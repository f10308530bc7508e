/* test_runtime_supervisor.c — the supervisor (runtime/supervisor.h): a child that fails is
 * reported to it and restarted with fresh state; one that keeps failing is given up on, with an
 * ERROR line, and by default the process is stopped (SIGTERM); the owner can stop a child. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/supervisor.h"

enum { MSG_FAIL_TICK = 1 };

/* A child fails (KVP_ERR_IO from its timer) on each of its first `fail_starts` starts. */
struct child_arg {
    atomic_int starts;
    int fail_starts;
};

static int child_init(struct kvp_rt_ctx *ctx)
{
    struct child_arg *a = kvp_rt_state(ctx);
    int n = atomic_fetch_add(&a->starts, 1) + 1;
    if (n <= a->fail_starts)
        return kvp_rt_timer_start(ctx, 5, 0, MSG_FAIL_TICK, NULL);
    return KVP_OK;
}

static int child_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    (void)ctx;
    if (msg->kind == KVP_RT_TIMER && msg->type == MSG_FAIL_TICK)
        return KVP_ERR_IO; /* fails the actor: the supervisor hears of it */
    return KVP_OK;
}

static int child_start(void *arg, struct kvp_rt_actor *parent, struct kvp_rt_actor **out)
{
    struct kvp_rt_spec spec = {.name = "flaky", .init = child_init, .handle = child_handle, .state = arg};
    return kvp_rt_spawn(out, &spec, parent);
}

struct give_up_seen {
    atomic_int calls;
    atomic_int err;
};

static void on_give_up(void *arg, const char *child, int err)
{
    struct give_up_seen *g = arg;
    if (strcmp(child, "flaky") == 0)
        atomic_store(&g->err, err);
    atomic_fetch_add(&g->calls, 1);
}

/* Wait (bounded) until the child reached `starts` starts and the supervisor settled. */
static void wait_starts(struct kvp_rt_actor *sup, struct child_arg *a, int starts, uint32_t restarts)
{
    uint32_t r = 0;
    for (int i = 0; i < 2000; i++) {
        if (atomic_load(&a->starts) >= starts && kvp_rt_sup_restarts(sup, "flaky", &r, NULL) == KVP_OK &&
            r >= restarts)
            return;
        usleep(1000);
    }
}

static void test_supervisor_failed_child_restarted(void **unused)
{
    (void)unused;
    struct kvp_rt_actor *sup = NULL;
    struct give_up_seen g = {0};
    struct kvp_rt_sup_policy pol = {.max_restarts = 3, .window_ms = 60000, .give_up = on_give_up,
                                    .give_up_arg = &g};
    assert_int_equal(kvp_rt_sup_new(&sup, "sup", &pol), KVP_OK);
    struct child_arg a = {.fail_starts = 1};
    assert_int_equal(kvp_rt_sup_add(sup, "flaky", child_start, &a), KVP_OK);
    wait_starts(sup, &a, 2, 1);
    uint32_t restarts = 0;
    int running = 0;
    assert_int_equal(kvp_rt_sup_restarts(sup, "flaky", &restarts, &running), KVP_OK);
    assert_int_equal(restarts, 1);
    assert_int_equal(running, 1);
    assert_int_equal(atomic_load(&a.starts), 2);
    assert_int_equal(atomic_load(&g.calls), 0);
    /* the owner stops it for good: no restart, and a second stop finds nothing */
    assert_int_equal(kvp_rt_sup_stop_child(sup, "flaky"), KVP_OK);
    assert_int_equal(kvp_rt_sup_stop_child(sup, "flaky"), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_rt_sup_restarts(sup, "flaky", &restarts, &running), KVP_OK);
    assert_int_equal(running, 0);
    assert_int_equal(kvp_rt_sup_add(sup, "flaky", child_start, &a), KVP_ERR_EXISTS);
    assert_int_equal(kvp_rt_sup_restarts(sup, "nobody", NULL, NULL), KVP_ERR_NOT_FOUND);
    kvp_rt_destroy(&sup);
}

static void test_supervisor_child_failing_too_often_given_up(void **unused)
{
    (void)unused;
    struct kvp_rt_actor *sup = NULL;
    struct give_up_seen g = {0};
    struct kvp_rt_sup_policy pol = {.max_restarts = 2, .window_ms = 60000, .give_up = on_give_up,
                                    .give_up_arg = &g};
    assert_int_equal(kvp_rt_sup_new(&sup, "sup", &pol), KVP_OK);
    struct child_arg a = {.fail_starts = 1000};
    assert_int_equal(kvp_rt_sup_add(sup, "flaky", child_start, &a), KVP_OK);
    for (int i = 0; i < 2000 && atomic_load(&g.calls) == 0; i++)
        usleep(1000);
    assert_int_equal(atomic_load(&g.calls), 1);
    assert_int_equal(atomic_load(&g.err), KVP_ERR_IO);
    uint32_t restarts = 0;
    int running = 1;
    assert_int_equal(kvp_rt_sup_restarts(sup, "flaky", &restarts, &running), KVP_OK);
    assert_int_equal(restarts, 2);  /* two restarts, the third failure gave up */
    assert_int_equal(running, 0);
    assert_int_equal(atomic_load(&a.starts), 3);
    kvp_rt_destroy(&sup);
}

/* Set by the handler, which may run on any thread of the process (the signal is sent to the
 * process): an atomic, not a sig_atomic_t, so the test thread's read is ordered with it
 * (lock-free, so signal-safe). */
static atomic_int got_sigterm;
static void on_sigterm(int sig)
{
    (void)sig;
    atomic_store(&got_sigterm, 1);
}

/* Default policy end: the process is stopped (SIGTERM) after an ERROR line naming the child. */
static void test_supervisor_give_up_default_stops_process_with_log_line(void **unused)
{
    (void)unused;
    struct sigaction sa = {0}, old;
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGTERM, &sa, &old), 0);
    /* the log goes to stderr: catch it in a file for the duration */
    fflush(stderr);
    int saved = dup(2);
    FILE *log = tmpfile();
    assert_non_null(log);
    dup2(fileno(log), 2);

    struct kvp_rt_actor *sup = NULL;
    struct kvp_rt_sup_policy pol = {.max_restarts = 0};
    assert_int_equal(kvp_rt_sup_new(&sup, "sup", &pol), KVP_OK);
    struct child_arg a = {.fail_starts = 1000};
    assert_int_equal(kvp_rt_sup_add(sup, "flaky", child_start, &a), KVP_OK);
    for (int i = 0; i < 2000 && !atomic_load(&got_sigterm); i++)
        usleep(1000);
    kvp_rt_destroy(&sup);

    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    sigaction(SIGTERM, &old, NULL);
    assert_int_equal(atomic_load(&got_sigterm), 1);
    assert_int_equal(atomic_load(&a.starts), 1);
    char buf[8192];
    rewind(log);
    size_t n = fread(buf, 1, sizeof buf - 1, log);
    buf[n] = 0;
    fclose(log);
    assert_non_null(strstr(buf, "child flaky failed (KVP_ERR_IO)"));
    assert_non_null(strstr(buf, "giving up on it; stopping the process (SIGTERM)"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_supervisor_failed_child_restarted),
        cmocka_unit_test(test_supervisor_child_failing_too_often_given_up),
        cmocka_unit_test(test_supervisor_give_up_default_stops_process_with_log_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
