/* test_runtime_api.c — every error the runtime API returns for misuse: double reply, unknown
 * timer, finishing the running hosted actor, watches on manual actors, wrong actor kinds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "runtime/actor.h"
#include "tests/lib/actor_harness.h"

enum { MSG_CHECK = 1, MSG_SELF_FINISH = 2 };

struct api_state {
    int checks_done;
    int self_finish_rc;
    uint64_t hid;
};

static int on_hosted(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct api_state *s = kvp_rt_state(ctx);
    if (msg->type == MSG_SELF_FINISH) {
        s->self_finish_rc = kvp_rt_hosted_finish(ctx, kvp_rt_self_hid(ctx));
        return KVP_RT_DONE;
    }
    return KVP_OK;
}

static int on_api(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct api_state *s = kvp_rt_state(ctx);
    if (msg->kind != KVP_RT_REQUEST || msg->type != MSG_CHECK)
        return KVP_OK;
    static const struct kvp_rt_hosted_spec hs = {"h", on_hosted, NULL};
    static const struct kvp_rt_hosted_spec nohandler = {"x", NULL, NULL};
#define CHECK(expr, want)                                                                          \
    do {                                                                                           \
        if ((expr) != (want))                                                                      \
            return KVP_ERR_INTERNAL;                                                               \
    } while (0)
    CHECK(kvp_rt_hosted_spawn(ctx, &nohandler, NULL, NULL), KVP_ERR_INVALID);
    CHECK(kvp_rt_hosted_spawn(ctx, &hs, s, &s->hid), KVP_OK);
    CHECK(kvp_rt_hosted_finish(ctx, 0), KVP_ERR_NOT_FOUND);
    CHECK(kvp_rt_hosted_finish(ctx, s->hid + 100), KVP_ERR_NOT_FOUND);
    CHECK(kvp_rt_timer_cancel(ctx, 12345), KVP_ERR_NOT_FOUND);
    CHECK(kvp_rt_watch(ctx, ctx, NULL), KVP_ERR_INVALID);
    CHECK(kvp_rt_watch_fd(ctx, 0, NULL), KVP_ERR_INVALID);
    CHECK(kvp_rt_unwatch_fd(ctx, 0), KVP_ERR_NOT_FOUND);
    CHECK(kvp_rt_request(ctx, NULL, 0, 1, 0, NULL, NULL, 0, NULL), KVP_ERR_INVALID);
    CHECK(kvp_rt_reply(ctx, msg->corr_id, KVP_OK, 1, NULL, NULL), KVP_OK);
    CHECK(kvp_rt_reply(ctx, msg->corr_id, KVP_OK, 2, NULL, NULL), KVP_ERR_NOT_FOUND);
    CHECK(kvp_rt_send(kvp_rt_self(ctx), s->hid, MSG_SELF_FINISH, 0, NULL, NULL), KVP_OK);
    s->checks_done = 1;
    return KVP_OK;
#undef CHECK
}

static void test_runtime_api_misuse_returns_errors(void **unused)
{
    struct kvp_th th;
    struct api_state st = {0};
    struct kvp_rt_spec spec = {.name = "api", .handle = on_api, .state = &st};
    assert_int_equal(kvp_th_init(&th, &spec), KVP_OK);
    uint64_t corr = 0;
    assert_int_equal(kvp_th_request(&th, 0, MSG_CHECK, 0, NULL, NULL, &corr), 2);
    assert_int_equal(st.checks_done, 1);
    assert_int_equal(st.self_finish_rc, KVP_ERR_BUSY);
    struct kvp_rt_msg *m = NULL;
    assert_int_equal(kvp_th_take(&th, &m), KVP_OK);
    assert_int_equal(m->kind, KVP_RT_REPLY);
    assert_int_equal(m->arg, 1); /* the first reply only */
    assert_int_equal(kvp_rt_msg_reply(&m, KVP_OK, 0, NULL, NULL), KVP_ERR_INVALID);
    assert_null(m);
    assert_int_equal(kvp_th_take(&th, &m), KVP_ERR_TIMEOUT);

    /* Wrong kinds of actor. */
    assert_int_equal(kvp_rt_recv(th.actor, 0, &m), KVP_ERR_INVALID);
    assert_int_equal(kvp_rt_poll(th.probe), KVP_ERR_INVALID);
    assert_int_equal(kvp_rt_request_from(th.actor, th.probe, 0, 1, 0, NULL, NULL, 1),
                     KVP_ERR_INVALID);
    assert_int_equal(kvp_rt_send(NULL, 0, 1, 0, NULL, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_rt_call(NULL, 0, 1, 0, NULL, NULL, 0, &m), KVP_ERR_INVALID);
    assert_int_equal(kvp_rt_sink_new(NULL, "x"), KVP_ERR_INVALID);
    assert_string_equal(kvp_rt_name(th.actor), "api");
    assert_int_equal(kvp_th_fini(&th), KVP_OK);
}

static int on_noop(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    return KVP_OK;
}

static void test_runtime_long_name_truncated(void **unused)
{
    struct kvp_rt_actor *a = NULL;
    struct kvp_rt_spec spec = {.name = "a-very-long-actor-name-that-goes-on-and-on-and-on",
                               .handle = on_noop};
    assert_int_equal(kvp_rt_spawn_manual(&a, &spec, NULL), KVP_OK);
    assert_int_equal(strlen(kvp_rt_name(a)), KVP_RT_NAME_MAX);
    kvp_rt_destroy(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runtime_api_misuse_returns_errors),
        cmocka_unit_test(test_runtime_long_name_truncated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
