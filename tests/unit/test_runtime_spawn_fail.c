/* test_runtime_spawn_fail.c — the spawn ownership rule (runtime/actor.h, kvp_rt_spawn): from
 * the call on the runtime owns spec->state, and whatever fails, fini has run exactly once before
 * the error returns. Spawn failures are injected by wrapping eventfd and pthread_create at link
 * time (tests/cmake/runtime.cmake: -Wl,--wrap), so the runtime's own code path fails as it would
 * without file descriptors or threads. Also the spawners built on it (the supervisor, the master
 * session, the segment server's loops, the mover) release their state on such a failure: the
 * ASan stage (detect_leaks=1) fails this test if one leaks or frees twice. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>

#include "actors/segment/mover.h"
#include "actors/segment/seg_server.h"
#include "actors/session/msession.h"
#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/supervisor.h"

/* ------------------------------------------------------------------ injection */

/* Calls to let through before failing one (-1: never fail); counts every call. */
static atomic_int eventfd_pass = -1, thread_pass = -1;
static atomic_int eventfd_calls, thread_calls;

int __real_eventfd(unsigned int initval, int flags);
int __wrap_eventfd(unsigned int initval, int flags);
int __wrap_eventfd(unsigned int initval, int flags)
{
    atomic_fetch_add(&eventfd_calls, 1);
    if (atomic_load(&eventfd_pass) == 0) {
        atomic_store(&eventfd_pass, -1);
        errno = EMFILE;
        return -1;
    }
    if (atomic_load(&eventfd_pass) > 0)
        atomic_fetch_sub(&eventfd_pass, 1);
    return __real_eventfd(initval, flags);
}

int __real_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    atomic_fetch_add(&thread_calls, 1);
    if (atomic_load(&thread_pass) == 0) {
        atomic_store(&thread_pass, -1);
        return EAGAIN;
    }
    if (atomic_load(&thread_pass) > 0)
        atomic_fetch_sub(&thread_pass, 1);
    return __real_pthread_create(t, attr, fn, arg);
}

static int reset(void **unused)
{
    atomic_store(&eventfd_pass, -1);
    atomic_store(&thread_pass, -1);
    atomic_store(&eventfd_calls, 0);
    atomic_store(&thread_calls, 0);
    return 0;
}

/* ------------------------------------------------------------------ a plain actor */

struct st {
    int finis;
    int init_rc;
    pthread_t fini_thread;
};

static int st_init(struct kvp_rt_ctx *ctx)
{
    struct st *s = kvp_rt_state(ctx);
    return s->init_rc;
}

static int st_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    return KVP_OK;
}

static void st_fini(struct kvp_rt_ctx *ctx)
{
    struct st *s = kvp_rt_state(ctx);
    s->finis++;
    s->fini_thread = pthread_self();
    /* The actor is closed: nothing new may start from a fini of a failed spawn. */
    assert_int_equal(kvp_rt_timer_start(ctx, 10, 0, 1, NULL), KVP_ERR_CLOSED);
}

static void test_spawn_no_eventfd_runs_fini_once_on_caller(void **unused)
{
    struct st s = {0};
    struct kvp_rt_spec spec = {.name = "nofd", .init = st_init, .handle = st_handle, .fini = st_fini, .state = &s};
    struct kvp_rt_actor *a = NULL;
    atomic_store(&eventfd_pass, 0);
    assert_int_equal(kvp_rt_spawn(&a, &spec, NULL), KVP_ERR_IO);
    assert_null(a);
    assert_int_equal(s.finis, 1);
    assert_true(pthread_equal(s.fini_thread, pthread_self()));
}

static void test_spawn_no_thread_runs_fini_once_on_caller(void **unused)
{
    struct st s = {0};
    struct kvp_rt_actor *parent = NULL;
    assert_int_equal(kvp_rt_sink_new(&parent, "parent"), KVP_OK);
    struct kvp_rt_spec spec = {.name = "nothread", .init = st_init, .handle = st_handle, .fini = st_fini, .state = &s};
    struct kvp_rt_actor *a = NULL;
    atomic_store(&thread_pass, 0);
    assert_int_equal(kvp_rt_spawn(&a, &spec, parent), KVP_ERR_IO);
    assert_null(a);
    assert_int_equal(s.finis, 1);
    assert_true(pthread_equal(s.fini_thread, pthread_self()));
    kvp_rt_destroy(&parent); /* the failed spawn dropped its reference (ASan: no leak) */
}

static void test_spawn_init_failure_runs_fini_once_on_actor(void **unused)
{
    struct st s = {.init_rc = KVP_ERR_BUSY};
    struct kvp_rt_spec spec = {.name = "badinit", .init = st_init, .handle = st_handle, .fini = st_fini, .state = &s};
    struct kvp_rt_actor *a = NULL;
    assert_int_equal(kvp_rt_spawn(&a, &spec, NULL), KVP_ERR_BUSY);
    assert_null(a);
    assert_int_equal(s.finis, 1);
    assert_false(pthread_equal(s.fini_thread, pthread_self()));
}

static void test_spawn_bad_argument_runs_fini_once(void **unused)
{
    struct st s = {0};
    struct kvp_rt_spec spec = {.name = "nohandler", .fini = st_fini, .state = &s};
    struct kvp_rt_actor *a = NULL;
    assert_int_equal(kvp_rt_spawn(&a, &spec, NULL), KVP_ERR_INVALID);
    assert_int_equal(s.finis, 1);
    assert_int_equal(kvp_rt_spawn_manual(&a, &spec, NULL), KVP_ERR_INVALID);
    assert_int_equal(s.finis, 2);
    spec.handle = st_handle;
    assert_int_equal(kvp_rt_spawn(NULL, &spec, NULL), KVP_ERR_INVALID);
    assert_int_equal(s.finis, 3);
    assert_int_equal(kvp_rt_spawn(&a, NULL, NULL), KVP_ERR_INVALID); /* nothing to release */
    assert_null(a);
}

static void test_spawn_succeeds_after_injection(void **unused)
{
    struct st s = {0};
    struct kvp_rt_spec spec = {.name = "ok", .init = st_init, .handle = st_handle, .fini = st_fini, .state = &s};
    struct kvp_rt_actor *a = NULL;
    assert_int_equal(kvp_rt_spawn(&a, &spec, NULL), KVP_OK);
    assert_int_equal(atomic_load(&eventfd_calls), 1);
    assert_int_equal(atomic_load(&thread_calls), 1);
    assert_int_equal(s.finis, 0);
    kvp_rt_destroy(&a);
    assert_int_equal(s.finis, 1);
}

/* ------------------------------------------------------------------ spawners built on it */

static void test_supervisor_spawn_failure_frees_state(void **unused)
{
    struct kvp_rt_actor *sup = NULL;
    atomic_store(&eventfd_pass, 0);
    assert_int_equal(kvp_rt_sup_new(&sup, "sup", NULL), KVP_ERR_IO);
    assert_null(sup);
    atomic_store(&thread_pass, 0);
    assert_int_equal(kvp_rt_sup_new(&sup, "sup", NULL), KVP_ERR_IO);
    assert_null(sup);
}

static void test_session_spawn_failure_frees_state(void **unused)
{
    const char *masters[] = {"127.0.0.1:1", "127.0.0.1:2"};
    struct kvp_msession *ms = NULL;
    atomic_store(&eventfd_pass, 0);
    assert_int_equal(kvp_msession_new(&ms, masters, 2, "ms"), KVP_ERR_IO);
    assert_null(ms);
    atomic_store(&thread_pass, 0);
    assert_int_equal(kvp_msession_new(&ms, masters, 2, "ms"), KVP_ERR_IO);
    assert_null(ms);
}

static void test_seg_server_second_loop_failure_frees_all(void **unused)
{
    size_t size = 1u << 20;
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(base != MAP_FAILED);
    struct kvp_seg_server *srv = NULL;
    atomic_store(&eventfd_pass, 1); /* loop 0 starts, loop 1 gets no eventfd */
    assert_int_equal(kvp_seg_server_start(&srv, "127.0.0.1", 0, base, size), KVP_ERR_IO);
    assert_null(srv);
    atomic_store(&thread_pass, 1); /* loop 0 starts, loop 1 gets no thread */
    assert_int_equal(kvp_seg_server_start(&srv, "127.0.0.1", 0, base, size), KVP_ERR_IO);
    assert_null(srv);
    munmap(base, size);
}

static void test_mover_spawn_failure_frees_state(void **unused)
{
    const char *masters[] = {"127.0.0.1:1"};
    struct kvp_msession *ms = NULL;
    assert_int_equal(kvp_msession_new(&ms, masters, 1, "ms"), KVP_OK);
    _Atomic uint32_t id = 0;
    char region[4096];
    struct kvp_mover_cfg cfg = {.ms = ms, .id = &id, .base = region, .size = sizeof region, .actor = "t"};
    /* Count the eventfds of a whole mover (its transfer engine's actors, then its own), then
     * fail exactly the last one: the mover's own spawn, after its engine was built. A first mover
     * is started and stopped uncounted: what a process starts once, at its first engine (the
     * fault-injection owner of test builds, actors/transfer/fault.c), is not the mover's. */
    struct kvp_rt_actor *mover = NULL;
    assert_int_equal(kvp_mover_spawn(&mover, NULL, &cfg), KVP_OK);
    kvp_rt_destroy(&mover);
    int before = atomic_load(&eventfd_calls);
    assert_int_equal(kvp_mover_spawn(&mover, NULL, &cfg), KVP_OK);
    int n = atomic_load(&eventfd_calls) - before;
    kvp_rt_destroy(&mover);
    assert_true(n >= 2);
    atomic_store(&eventfd_pass, n - 1);
    assert_int_equal(kvp_mover_spawn(&mover, NULL, &cfg), KVP_ERR_IO);
    assert_null(mover);
    kvp_msession_destroy(&ms);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_spawn_no_eventfd_runs_fini_once_on_caller, reset),
        cmocka_unit_test_setup(test_spawn_no_thread_runs_fini_once_on_caller, reset),
        cmocka_unit_test_setup(test_spawn_init_failure_runs_fini_once_on_actor, reset),
        cmocka_unit_test_setup(test_spawn_bad_argument_runs_fini_once, reset),
        cmocka_unit_test_setup(test_spawn_succeeds_after_injection, reset),
        cmocka_unit_test_setup(test_supervisor_spawn_failure_frees_state, reset),
        cmocka_unit_test_setup(test_session_spawn_failure_frees_state, reset),
        cmocka_unit_test_setup(test_seg_server_second_loop_failure_frees_all, reset),
        cmocka_unit_test_setup(test_mover_spawn_failure_frees_state, reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
