/* test_runtime_supervision.c — a failing actor is reported to its parent (threaded child,
 * hosted actor, nested hosted actor), a parentless failure comes back from kvp_rt_stop, a
 * failing init fails the spawn (and fini still runs). */
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

enum { MSG_FAIL = 1, MSG_OK = 2, MSG_SPAWN = 3, MSG_SPAWN_NESTED = 4 };

/* Child: fails with the error in arg on MSG_FAIL. */
static int on_child(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    if (msg->kind == KVP_RT_SEND && msg->type == MSG_FAIL)
        return (int)(int64_t)msg->arg;
    if (msg->kind == KVP_RT_REQUEST)
        return kvp_rt_reply(ctx, msg->corr_id, KVP_OK, 0, NULL, NULL);
    return KVP_OK;
}

/* Parent: forwards each KVP_RT_FAILED report to the observer (arg = err, payload = copy). */
struct parent_state {
    struct kvp_rt_actor *observer;
};

static int on_parent(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct parent_state *s = kvp_rt_state(ctx);
    if (msg->kind != KVP_RT_FAILED)
        return KVP_OK;
    struct kvp_rt_failure *f = kvp_rt_msg_take(msg);
    void *p = f;
    int rc = kvp_rt_send(s->observer, 0, MSG_FAIL, (uint64_t)(int64_t)f->err, &p, NULL);
    if (rc)
        free(f);
    return KVP_OK;
}

static void test_runtime_child_failure_reported_to_parent(void **unused)
{
    struct kvp_rt_actor *observer = NULL, *parent = NULL, *child = NULL;
    assert_int_equal(kvp_rt_sink_new(&observer, "observer"), KVP_OK);
    struct parent_state ps = {.observer = observer};
    struct kvp_rt_spec pspec = {.name = "parent", .handle = on_parent, .state = &ps};
    struct kvp_rt_spec cspec = {.name = "child", .handle = on_child};
    assert_int_equal(kvp_rt_spawn(&parent, &pspec, NULL), KVP_OK);
    assert_int_equal(kvp_rt_spawn(&child, &cspec, parent), KVP_OK);

    struct kvp_rt_msg *r = NULL;
    assert_int_equal(kvp_rt_call(child, 0, MSG_OK, 0, NULL, NULL, 0, &r), KVP_OK);
    assert_int_equal(r->status, KVP_OK);
    kvp_rt_msg_destroy(&r);

    assert_int_equal(kvp_rt_send(child, 0, MSG_FAIL, (uint64_t)(int64_t)KVP_ERR_IO, NULL, NULL),
                     KVP_OK);
    struct kvp_rt_msg *m = NULL;
    assert_int_equal(kvp_rt_recv(observer, 10000, &m), KVP_OK);
    assert_int_equal((int)(int64_t)m->arg, KVP_ERR_IO);
    struct kvp_rt_failure *f = m->payload;
    assert_ptr_equal(f->child, child);
    assert_int_equal(f->hid, 0);
    assert_string_equal(f->name, "child");
    kvp_rt_msg_destroy(&m);

    /* The failed child is closed: calls fail (or are answered CLOSED), stop returns the error. */
    int rc = kvp_rt_call(child, 0, MSG_OK, 0, NULL, NULL, 0, &r);
    assert_int_equal(rc, KVP_ERR_CLOSED);
    assert_int_equal(kvp_rt_stop(child), KVP_ERR_IO);
    kvp_rt_destroy(&child);
    assert_int_equal(kvp_rt_stop(parent), KVP_OK);
    kvp_rt_destroy(&parent);
    kvp_rt_destroy(&observer);
}

static void test_runtime_parentless_failure_returned_by_stop(void **unused)
{
    struct kvp_rt_actor *a = NULL;
    struct kvp_rt_spec spec = {.name = "orphan", .handle = on_child};
    assert_int_equal(kvp_rt_spawn(&a, &spec, NULL), KVP_OK);
    assert_int_equal(kvp_rt_send(a, 0, MSG_FAIL, (uint64_t)(int64_t)KVP_ERR_CORRUPT, NULL, NULL),
                     KVP_OK);
    /* Still alive afterwards as a closed actor: a call is refused or answered CLOSED. */
    struct kvp_rt_msg *r = NULL;
    int rc = kvp_rt_call(a, 0, MSG_OK, 0, NULL, NULL, 0, &r);
    if (rc == KVP_OK) {
        assert_int_equal(r->status, KVP_ERR_CLOSED);
        kvp_rt_msg_destroy(&r);
    } else {
        assert_int_equal(rc, KVP_ERR_CLOSED);
    }
    assert_int_equal(kvp_rt_stop(a), KVP_ERR_CORRUPT);
    kvp_rt_destroy(&a);
}

static int g_fini_runs;

static int init_fails(struct kvp_rt_ctx *ctx)
{
    return KVP_ERR_NO_SPACE;
}

static void count_fini(struct kvp_rt_ctx *ctx)
{
    g_fini_runs++;
}

static void test_runtime_init_failure_fails_spawn(void **unused)
{
    struct kvp_rt_actor *a = NULL;
    struct kvp_rt_spec spec = {.name = "noinit", .init = init_fails, .handle = on_child,
                               .fini = count_fini};
    g_fini_runs = 0;
    assert_int_equal(kvp_rt_spawn(&a, &spec, NULL), KVP_ERR_NO_SPACE);
    assert_null(a);
    assert_int_equal(g_fini_runs, 1);
    assert_int_equal(kvp_rt_spawn_manual(&a, &spec, NULL), KVP_ERR_NO_SPACE);
    assert_null(a);
    assert_int_equal(g_fini_runs, 2);
}

/* Host under the harness: MSG_SPAWN spawns a hosted child (on_child), MSG_SPAWN_NESTED a
 * hosted "mid" actor that itself spawns a hosted child; failure reports are forwarded to
 * the probe by the host (hid 0) or by "mid". */
struct host_state {
    struct kvp_rt_actor *out;
    uint64_t last_hid;
    int mid_reports;
};

static int on_hosted_child(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    return on_child(ctx, msg);
}

static int on_mid(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct host_state *s = kvp_rt_state(ctx);
    if (msg->kind == KVP_RT_SEND && msg->type == MSG_SPAWN) {
        static const struct kvp_rt_hosted_spec cs = {"leaf", on_hosted_child, NULL};
        return kvp_rt_hosted_spawn(ctx, &cs, s, &s->last_hid);
    }
    if (msg->kind == KVP_RT_FAILED)
        s->mid_reports++;
    return KVP_OK;
}

static int on_host(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct host_state *s = kvp_rt_state(ctx);
    if (msg->kind == KVP_RT_SEND && msg->type == MSG_SPAWN) {
        static const struct kvp_rt_hosted_spec cs = {"hchild", on_hosted_child, NULL};
        return kvp_rt_hosted_spawn(ctx, &cs, NULL, &s->last_hid);
    }
    if (msg->kind == KVP_RT_SEND && msg->type == MSG_SPAWN_NESTED) {
        static const struct kvp_rt_hosted_spec ms = {"mid", on_mid, NULL};
        return kvp_rt_hosted_spawn(ctx, &ms, s, &s->last_hid);
    }
    if (msg->kind == KVP_RT_FAILED) {
        struct kvp_rt_failure *f = msg->payload;
        return kvp_rt_send(s->out, 0, MSG_FAIL, f->hid, NULL, NULL);
    }
    return KVP_OK;
}

static void test_runtime_hosted_failure_reported_to_host(void **unused)
{
    struct kvp_th th;
    struct host_state hs = {0};
    struct kvp_rt_spec spec = {.name = "host", .handle = on_host, .state = &hs};
    assert_int_equal(kvp_th_init(&th, &spec), KVP_OK);
    hs.out = th.probe;
    assert_int_equal(kvp_th_send(&th, 0, MSG_SPAWN, 0, NULL, NULL), 1);
    uint64_t hid = hs.last_hid;
    assert_true(hid != 0);
    uint64_t corr = 0;
    assert_int_equal(kvp_th_request(&th, hid, MSG_OK, 0, NULL, NULL, &corr), 1);
    struct kvp_rt_msg *m = NULL;
    assert_int_equal(kvp_th_take(&th, &m), KVP_OK);
    assert_int_equal(m->kind, KVP_RT_REPLY);
    assert_int_equal(m->status, KVP_OK);
    kvp_rt_msg_destroy(&m);

    assert_int_equal(kvp_th_send(&th, hid, MSG_FAIL, (uint64_t)(int64_t)KVP_ERR_IO, NULL, NULL),
                     1);
    assert_int_equal(kvp_th_take(&th, &m), KVP_OK);
    assert_int_equal(m->type, MSG_FAIL);
    assert_int_equal(m->arg, hid);
    kvp_rt_msg_destroy(&m);
    /* Gone: a request to it is answered CLOSED; the host itself is healthy. */
    assert_int_equal(kvp_th_request(&th, hid, MSG_OK, 0, NULL, NULL, &corr), 1);
    assert_int_equal(kvp_th_take(&th, &m), KVP_OK);
    assert_int_equal(m->kind, KVP_RT_REPLY);
    assert_int_equal(m->status, KVP_ERR_CLOSED);
    kvp_rt_msg_destroy(&m);

    /* Nested: the leaf's failure goes to "mid", its parent, not to the host. */
    assert_int_equal(kvp_th_send(&th, 0, MSG_SPAWN_NESTED, 0, NULL, NULL), 1);
    uint64_t mid = hs.last_hid;
    assert_int_equal(kvp_th_send(&th, mid, MSG_SPAWN, 0, NULL, NULL), 1);
    uint64_t leaf = hs.last_hid;
    assert_true(leaf != mid);
    assert_int_equal(kvp_th_send(&th, leaf, MSG_FAIL, (uint64_t)(int64_t)KVP_ERR_IO, NULL, NULL),
                     1);
    assert_int_equal(hs.mid_reports, 1);
    assert_int_equal(kvp_th_captured(&th), 0);
    assert_int_equal(kvp_th_fini(&th), KVP_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runtime_child_failure_reported_to_parent),
        cmocka_unit_test(test_runtime_parentless_failure_returned_by_stop),
        cmocka_unit_test(test_runtime_init_failure_fails_spawn),
        cmocka_unit_test(test_runtime_hosted_failure_reported_to_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
