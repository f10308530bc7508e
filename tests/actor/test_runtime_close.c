/* test_runtime_close.c — staged stop: close is idempotent, requests pending in or from a
 * closing actor complete with KVP_ERR_CLOSED, sends after close fail and leave the payload
 * with the caller, nothing leaks (payload counter here, LeakSanitizer in the ASan build). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kvpool.h"
#include "runtime/actor.h"

enum { MSG_KICK = 1, MSG_WORK = 2, MSG_NOTE = 3 };

static atomic_int g_live;

static void *pl_new(void)
{
    atomic_fetch_add(&g_live, 1);
    return malloc(64);
}

static void pl_free(void *p)
{
    atomic_fetch_sub(&g_live, 1);
    free(p);
}

/* Requester: KICK(arg = n) sends n WORK requests (no deadline) to peer, payload each. */
struct req_state {
    struct kvp_rt_actor *peer;
    struct kvp_rt_actor *observer; /* may be NULL */
    int replies_closed;
    int replies_other;
    int fini_ran;
};

static int on_req(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct req_state *s = kvp_rt_state(ctx);
    if (msg->kind == KVP_RT_SEND && msg->type == MSG_KICK) {
        for (uint64_t i = 0; i < msg->arg; i++) {
            void *p = pl_new();
            int rc = kvp_rt_request(ctx, s->peer, 0, MSG_WORK, i, &p, pl_free, 0, NULL);
            if (rc) {
                pl_free(p);
                return rc;
            }
        }
        return KVP_OK;
    }
    if (msg->kind == KVP_RT_REPLY) {
        if (msg->status == KVP_ERR_CLOSED)
            s->replies_closed++;
        else
            s->replies_other++;
        if (s->observer)
            kvp_rt_send(s->observer, 0, MSG_NOTE, (uint64_t)(int64_t)msg->status, NULL, NULL);
    }
    return KVP_OK;
}

static void req_fini(struct kvp_rt_ctx *ctx)
{
    struct req_state *s = kvp_rt_state(ctx);
    s->fini_ran++;
}

/* Hoarder: takes every WORK request's payload and token and never answers. */
struct hoard_state {
    int held;
    void *payloads[64];
    struct kvp_rt_actor *observer;
};

static int on_hoard(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct hoard_state *s = kvp_rt_state(ctx);
    if (msg->kind == KVP_RT_REQUEST && s->held < 64) {
        s->payloads[s->held++] = kvp_rt_msg_take(msg);
        if (s->observer)
            kvp_rt_send(s->observer, 0, MSG_NOTE, (uint64_t)s->held, NULL, NULL);
    }
    return KVP_OK;
}

static void hoard_fini(struct kvp_rt_ctx *ctx)
{
    struct hoard_state *s = kvp_rt_state(ctx);
    for (int i = 0; i < s->held; i++)
        pl_free(s->payloads[i]);
    s->held = 0;
}

static void test_runtime_close_with_pending_requests_answers_closed(void **unused)
{
    struct hoard_state hs = {0};
    struct req_state rs = {0};
    struct kvp_rt_spec hspec = {.name = "hoard", .handle = on_hoard, .fini = hoard_fini,
                                .state = &hs};
    struct kvp_rt_spec rspec = {.name = "req", .handle = on_req, .fini = req_fini, .state = &rs};
    struct kvp_rt_actor *hoard = NULL, *req = NULL;
    assert_int_equal(kvp_rt_spawn_manual(&hoard, &hspec, NULL), KVP_OK);
    assert_int_equal(kvp_rt_spawn_manual(&req, &rspec, NULL), KVP_OK);
    rs.peer = hoard;

    /* 5 requests handled (held, unanswered) and 3 still queued at close time. */
    assert_int_equal(kvp_rt_send(req, 0, MSG_KICK, 5, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_rt_poll(req), 1);
    assert_int_equal(kvp_rt_poll(hoard), 5);
    assert_int_equal(hs.held, 5);
    assert_int_equal(kvp_rt_send(req, 0, MSG_KICK, 3, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_rt_poll(req), 1);
    assert_int_equal(kvp_rt_queued(hoard), 3);
    assert_int_equal(atomic_load(&g_live), 8);

    kvp_rt_close(hoard);
    kvp_rt_close(hoard); /* idempotent */
    assert_int_equal(kvp_rt_queued(hoard), 0);
    assert_int_equal(atomic_load(&g_live), 5); /* queued payloads freed; held ones are hoard's */
    assert_int_equal(kvp_rt_poll(req), 8);
    assert_int_equal(rs.replies_closed, 8);
    assert_int_equal(rs.replies_other, 0);
    assert_int_equal(kvp_rt_poll(hoard), KVP_ERR_CLOSED);

    /* After close: sends and requests fail, the payload stays with the caller. */
    void *p = pl_new();
    assert_int_equal(kvp_rt_send(hoard, 0, MSG_WORK, 0, &p, pl_free), KVP_ERR_CLOSED);
    assert_non_null(p);
    pl_free(p);
    assert_int_equal(kvp_rt_send(req, 0, MSG_KICK, 1, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_rt_poll(req), 1); /* request fails → the handler error fails req */
    assert_int_equal(kvp_rt_stop(req), KVP_ERR_CLOSED);

    assert_int_equal(kvp_rt_stop(hoard), KVP_OK);
    assert_int_equal(atomic_load(&g_live), 0); /* hoard's fini released its payloads */
    kvp_rt_destroy(&hoard);
    kvp_rt_destroy(&req);
    assert_int_equal(rs.fini_ran, 1);
}

static void test_runtime_close_requester_completes_own_requests_closed(void **unused)
{
    struct kvp_rt_actor *sink = NULL, *req = NULL;
    struct req_state rs = {0};
    struct kvp_rt_spec rspec = {.name = "req", .handle = on_req, .state = &rs};
    assert_int_equal(kvp_rt_sink_new(&sink, "peer"), KVP_OK);
    assert_int_equal(kvp_rt_spawn_manual(&req, &rspec, NULL), KVP_OK);
    rs.peer = sink;
    assert_int_equal(kvp_rt_send(req, 0, MSG_KICK, 4, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_rt_poll(req), 1);
    assert_int_equal(kvp_rt_queued(sink), 4);
    kvp_rt_close(req);
    assert_int_equal(rs.replies_closed, 4); /* delivered during close */
    /* The peer answering afterwards finds the requester closed: its payload stays its own. */
    struct kvp_rt_msg *m = NULL;
    assert_int_equal(kvp_rt_recv(sink, 0, &m), KVP_OK);
    void *p = pl_new();
    assert_int_equal(kvp_rt_msg_reply(&m, KVP_OK, 0, &p, pl_free), KVP_ERR_CLOSED);
    assert_non_null(p);
    pl_free(p);
    kvp_rt_destroy(&sink); /* drops the 3 remaining requests (answers CLOSED to nobody) */
    kvp_rt_destroy(&req);
    assert_int_equal(rs.replies_closed, 4);
    assert_int_equal(atomic_load(&g_live), 0);
}

struct caller_arg {
    struct kvp_rt_actor *to;
    int rc;
    int status;
};

static void *caller_main(void *p)
{
    struct caller_arg *ca = p;
    struct kvp_rt_msg *r = NULL;
    void *pl = pl_new();
    ca->rc = kvp_rt_call(ca->to, 0, MSG_WORK, 0, &pl, pl_free, 0, &r);
    if (pl)
        pl_free(pl);
    ca->status = r ? r->status : 1;
    kvp_rt_msg_destroy(&r);
    return NULL;
}

static void test_runtime_stop_threaded_with_blocked_callers_answers_closed(void **unused)
{
    struct kvp_rt_actor *observer = NULL, *hoard = NULL;
    assert_int_equal(kvp_rt_sink_new(&observer, "observer"), KVP_OK);
    struct hoard_state hs = {.observer = observer};
    struct kvp_rt_spec hspec = {.name = "hoard", .handle = on_hoard, .fini = hoard_fini,
                                .state = &hs};
    assert_int_equal(kvp_rt_spawn(&hoard, &hspec, NULL), KVP_OK);
    enum { N = 3 };
    pthread_t th[N];
    struct caller_arg ca[N];
    for (int i = 0; i < N; i++) {
        ca[i] = (struct caller_arg){.to = hoard, .rc = 1, .status = 1};
        assert_int_equal(pthread_create(&th[i], NULL, caller_main, &ca[i]), 0);
    }
    /* Wait until the hoarder holds all three requests. */
    for (int got = 0; got < N; got++) {
        struct kvp_rt_msg *m = NULL;
        assert_int_equal(kvp_rt_recv(observer, 10000, &m), KVP_OK);
        kvp_rt_msg_destroy(&m);
    }
    assert_int_equal(kvp_rt_stop(hoard), KVP_OK); /* close → stop: callers get CLOSED */
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(ca[i].rc, KVP_OK);
        assert_int_equal(ca[i].status, KVP_ERR_CLOSED);
    }
    /* A call to a stopped actor fails at once; its payload stays with the caller. */
    struct kvp_rt_msg *r = NULL;
    void *p = pl_new();
    assert_int_equal(kvp_rt_call(hoard, 0, MSG_WORK, 0, &p, pl_free, 0, &r), KVP_ERR_CLOSED);
    assert_non_null(p);
    pl_free(p);
    kvp_rt_destroy(&hoard);
    kvp_rt_destroy(&observer);
    assert_int_equal(atomic_load(&g_live), 0);
}

static void test_runtime_destroy_null_is_noop(void **unused)
{
    struct kvp_rt_actor *a = NULL;
    kvp_rt_destroy(NULL);
    kvp_rt_destroy(&a);
    kvp_rt_close(NULL);
    assert_int_equal(kvp_rt_stop(NULL), KVP_ERR_INVALID);
    struct kvp_rt_spec bad = {.name = "bad"};
    assert_int_equal(kvp_rt_spawn(&a, &bad, NULL), KVP_ERR_INVALID);
    assert_null(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runtime_close_with_pending_requests_answers_closed),
        cmocka_unit_test(test_runtime_close_requester_completes_own_requests_closed),
        cmocka_unit_test(test_runtime_stop_threaded_with_blocked_callers_answers_closed),
        cmocka_unit_test(test_runtime_destroy_null_is_noop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
