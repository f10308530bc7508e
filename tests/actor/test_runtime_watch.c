/* test_runtime_watch.c — a threaded actor watches a czmq socket and a file descriptor; its
 * callbacks run on the actor's thread; unwatch stops them; a failing callback fails the actor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <czmq.h>
#include <unistd.h>

#include "kvpool.h"
#include "runtime/actor.h"

enum { MSG_FROM_SOCK = 1, MSG_FROM_FD = 2, MSG_UNWATCH_FD = 3 };

struct watch_state {
    struct kvp_rt_actor *observer;
    zsock_t *pull;
    int fd;
};

static int on_sock(struct kvp_rt_ctx *ctx, void *handle)
{
    struct watch_state *s = kvp_rt_state(ctx);
    char *str = zstr_recv(handle);
    if (!str)
        return KVP_ERR_IO;
    uint64_t v = strtoull(str, NULL, 10);
    zstr_free(&str);
    if (v == 666)
        return KVP_ERR_CORRUPT; /* fails the actor */
    return kvp_rt_send(s->observer, 0, MSG_FROM_SOCK, v, NULL, NULL);
}

static int on_fd(struct kvp_rt_ctx *ctx, void *handle)
{
    struct watch_state *s = kvp_rt_state(ctx);
    uint8_t b;
    if (read(*(int *)handle, &b, 1) != 1)
        return KVP_ERR_IO;
    return kvp_rt_send(s->observer, 0, MSG_FROM_FD, b, NULL, NULL);
}

static int watch_init(struct kvp_rt_ctx *ctx)
{
    struct watch_state *s = kvp_rt_state(ctx);
    s->pull = zsock_new_pull("@inproc://kvp-test-watch");
    if (!s->pull)
        return KVP_ERR_IO;
    int rc = kvp_rt_watch(ctx, s->pull, on_sock);
    if (rc == KVP_OK)
        rc = kvp_rt_watch_fd(ctx, s->fd, on_fd);
    if (rc == KVP_OK && kvp_rt_watch(ctx, s->pull, on_sock) != KVP_ERR_EXISTS)
        rc = KVP_ERR_INTERNAL;
    return rc;
}

static int on_msg(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct watch_state *s = kvp_rt_state(ctx);
    if (msg->kind == KVP_RT_REQUEST && msg->type == MSG_UNWATCH_FD) {
        int rc = kvp_rt_unwatch_fd(ctx, s->fd);
        return kvp_rt_reply(ctx, msg->corr_id, rc, 0, NULL, NULL);
    }
    return KVP_OK;
}

static void watch_fini(struct kvp_rt_ctx *ctx)
{
    struct watch_state *s = kvp_rt_state(ctx);
    zsock_destroy(&s->pull);
}

static void expect(struct kvp_rt_actor *observer, uint32_t type, uint64_t arg)
{
    struct kvp_rt_msg *m = NULL;
    assert_int_equal(kvp_rt_recv(observer, 10000, &m), KVP_OK);
    assert_int_equal(m->type, type);
    assert_int_equal(m->arg, arg);
    kvp_rt_msg_destroy(&m);
}

static void test_runtime_watch_socket_and_fd_runs_callbacks(void **unused)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    struct kvp_rt_actor *observer = NULL, *a = NULL;
    assert_int_equal(kvp_rt_sink_new(&observer, "observer"), KVP_OK);
    struct watch_state st = {.observer = observer, .fd = p[0]};
    struct kvp_rt_spec spec = {.name = "watcher", .init = watch_init, .handle = on_msg,
                               .fini = watch_fini, .state = &st};
    assert_int_equal(kvp_rt_spawn(&a, &spec, observer), KVP_OK);
    zsock_t *push = zsock_new_push(">inproc://kvp-test-watch");
    assert_non_null(push);

    assert_int_equal(zstr_send(push, "17"), 0);
    expect(observer, MSG_FROM_SOCK, 17);
    assert_int_equal(write(p[1], "\x05", 1), 1);
    expect(observer, MSG_FROM_FD, 5);
    assert_int_equal(zstr_send(push, "18"), 0);
    expect(observer, MSG_FROM_SOCK, 18);

    struct kvp_rt_msg *r = NULL;
    assert_int_equal(kvp_rt_call(a, 0, MSG_UNWATCH_FD, 0, NULL, NULL, 0, &r), KVP_OK);
    assert_int_equal(r->status, KVP_OK);
    kvp_rt_msg_destroy(&r);
    assert_int_equal(write(p[1], "\x06", 1), 1); /* nobody reads it now */
    assert_int_equal(zstr_send(push, "19"), 0);
    expect(observer, MSG_FROM_SOCK, 19); /* the socket is still watched, the fd byte ignored */

    /* A failing watch callback fails the actor like a failing handler: the parent hears. */
    assert_int_equal(zstr_send(push, "666"), 0);
    struct kvp_rt_msg *m = NULL;
    assert_int_equal(kvp_rt_recv(observer, 10000, &m), KVP_OK);
    assert_int_equal(m->kind, KVP_RT_FAILED);
    assert_int_equal(((struct kvp_rt_failure *)m->payload)->err, KVP_ERR_CORRUPT);
    kvp_rt_msg_destroy(&m);
    assert_int_equal(kvp_rt_call(a, 0, MSG_UNWATCH_FD, 0, NULL, NULL, 0, &r), KVP_ERR_CLOSED);
    assert_int_equal(kvp_rt_stop(a), KVP_ERR_CORRUPT);
    kvp_rt_destroy(&a);
    zsock_destroy(&push);
    kvp_rt_destroy(&observer);
    close(p[0]);
    close(p[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runtime_watch_socket_and_fd_runs_callbacks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
