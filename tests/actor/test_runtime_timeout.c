/* test_runtime_timeout.c — request deadlines (fake clock under the harness, and short real
 * deadlines between threaded actors), late replies dropped, blocking-call timeouts, timers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdlib.h>

#include "kvpool.h"
#include "runtime/actor.h"
#include "tests/lib/actor_harness.h"

enum {
    MSG_KICK = 1,     /* requester: send a request to the peer (arg = timeout ms) */
    MSG_WORK = 2,     /* the request itself */
    MSG_NOTE = 3,     /* requester → observer: "I got a reply", arg = status */
    MSG_PING = 4,     /* requester → observer: echoes */
    MSG_ANSWER = 5,   /* silent actor: answer the request you hold now */
    MSG_TICK = 6,     /* timer */
    MSG_CANCEL = 7,   /* cancel the periodic timer */
};

static atomic_int g_live; /* payloads allocated and not yet freed */

static void *pl_new(void)
{
    atomic_fetch_add(&g_live, 1);
    return malloc(32);
}

static void pl_free(void *p)
{
    atomic_fetch_sub(&g_live, 1);
    free(p);
}

/* Requester: on KICK sends WORK to peer with a deadline; reports every reply to observer. */
struct req_state {
    struct kvp_rt_actor *peer;
    struct kvp_rt_actor *observer;
    uint64_t corr;
    uint64_t timer;
    int ticks;
};

static int on_requester(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct req_state *s = kvp_rt_state(ctx);
    switch (msg->kind) {
    case KVP_RT_SEND:
        if (msg->type == MSG_KICK) {
            void *p = pl_new();
            int rc = kvp_rt_request(ctx, s->peer, 0, MSG_WORK, 7, &p, pl_free,
                                    (uint32_t)msg->arg, &s->corr);
            if (rc)
                pl_free(p);
            return rc;
        }
        if (msg->type == MSG_PING)
            return kvp_rt_send(s->observer, 0, MSG_PING, msg->arg, NULL, NULL);
        if (msg->type == MSG_CANCEL)
            return kvp_rt_timer_cancel(ctx, s->timer);
        return KVP_OK;
    case KVP_RT_REPLY: {
        if (msg->corr_id != s->corr)
            return KVP_ERR_INTERNAL;
        return kvp_rt_send(s->observer, 0, MSG_NOTE, (uint64_t)(int64_t)msg->status, NULL, NULL);
    }
    case KVP_RT_TIMER:
        s->ticks++;
        return KVP_OK;
    default:
        return KVP_OK;
    }
}

static int requester_init(struct kvp_rt_ctx *ctx)
{
    struct req_state *s = kvp_rt_state(ctx);
    return kvp_rt_timer_start(ctx, 50, 10, MSG_TICK, &s->timer);
}

static void test_runtime_request_deadline_fake_clock_times_out(void **unused)
{
    struct kvp_th th;
    struct req_state st = {0};
    struct kvp_rt_spec spec = {.name = "req", .init = requester_init, .handle = on_requester,
                               .state = &st};
    assert_int_equal(kvp_th_init(&th, &spec), KVP_OK);
    st.peer = th.probe;
    st.observer = th.probe;

    assert_int_equal(kvp_th_send(&th, 0, MSG_KICK, 100, NULL, NULL), 1);
    struct kvp_rt_msg *req = NULL;
    assert_int_equal(kvp_th_take(&th, &req), KVP_OK);
    assert_int_equal(req->kind, KVP_RT_REQUEST);
    assert_int_equal(req->type, MSG_WORK);
    assert_int_equal(req->arg, 7);
    assert_non_null(req->payload);

    kvp_th_advance_ms(&th, 99);
    assert_int_equal(kvp_th_captured(&th), 0); /* not yet */
    kvp_th_advance_ms(&th, 1);
    struct kvp_rt_msg *note = NULL;
    assert_int_equal(kvp_th_take(&th, &note), KVP_OK);
    assert_int_equal(note->type, MSG_NOTE);
    assert_int_equal((int)(int64_t)note->arg, KVP_ERR_TIMEOUT);
    kvp_rt_msg_destroy(&note);

    /* The late reply is dropped: the requester reports nothing more. */
    assert_int_equal(kvp_rt_msg_reply(&req, KVP_OK, 0, NULL, NULL), KVP_OK);
    assert_null(req);
    kvp_th_run(&th);
    assert_int_equal(kvp_th_captured(&th), 0);

    /* Periodic timer (first at 50 ms, then every 10 ms): the clock jumped from 0 to 99 ms,
     * so it fired once there (missed periods are not replayed) and is next due at 109. */
    assert_int_equal(st.ticks, 1);
    kvp_th_advance_ms(&th, 8);
    assert_int_equal(st.ticks, 1);
    kvp_th_advance_ms(&th, 1);
    assert_int_equal(st.ticks, 2);
    kvp_th_advance_ms(&th, 10);
    assert_int_equal(st.ticks, 3);
    assert_int_equal(kvp_th_send(&th, 0, MSG_CANCEL, 0, NULL, NULL), 1);
    kvp_th_advance_ms(&th, 1000);
    assert_int_equal(st.ticks, 3);
    /* Cancelling twice is an error, which fails the actor and reaches its parent. */
    assert_int_equal(kvp_th_send(&th, 0, MSG_CANCEL, 0, NULL, NULL), 1);
    assert_int_equal(kvp_th_take(&th, &note), KVP_OK);
    assert_int_equal(note->kind, KVP_RT_FAILED);
    assert_int_equal(((struct kvp_rt_failure *)note->payload)->err, KVP_ERR_NOT_FOUND);
    kvp_rt_msg_destroy(&note);
    assert_int_equal(kvp_th_fini(&th), KVP_ERR_NOT_FOUND);
    assert_int_equal(atomic_load(&g_live), 0);
}

static void test_runtime_reply_before_deadline_is_delivered(void **unused)
{
    struct kvp_th th;
    struct req_state st = {0};
    struct kvp_rt_spec spec = {.name = "req", .handle = on_requester, .state = &st};
    assert_int_equal(kvp_th_init(&th, &spec), KVP_OK);
    st.peer = th.probe;
    st.observer = th.probe;
    assert_int_equal(kvp_th_send(&th, 0, MSG_KICK, 100, NULL, NULL), 1);
    struct kvp_rt_msg *req = NULL, *note = NULL;
    assert_int_equal(kvp_th_take(&th, &req), KVP_OK);
    kvp_th_advance_ms(&th, 50);
    assert_int_equal(kvp_rt_msg_reply(&req, KVP_ERR_NO_SPACE, 0, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_th_run(&th), 1);
    assert_int_equal(kvp_th_take(&th, &note), KVP_OK);
    assert_int_equal((int)(int64_t)note->arg, KVP_ERR_NO_SPACE);
    kvp_rt_msg_destroy(&note);
    /* The deadline was cancelled with the reply: nothing fires later. */
    kvp_th_advance_ms(&th, 1000);
    assert_int_equal(kvp_th_captured(&th), 0);
    assert_int_equal(kvp_th_fini(&th), KVP_OK);
}

/* Silent actor: keeps the token of the last WORK request; answers it on ANSWER. */
struct silent_state {
    uint64_t token;
};

static int on_silent(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct silent_state *s = kvp_rt_state(ctx);
    if (msg->kind == KVP_RT_REQUEST && msg->type == MSG_WORK) {
        s->token = msg->corr_id;
        return KVP_OK;
    }
    if (msg->kind == KVP_RT_REQUEST && msg->type == MSG_ANSWER) {
        void *p = pl_new();
        int rc = kvp_rt_reply(ctx, s->token, KVP_OK, 0, &p, pl_free);
        if (p)
            pl_free(p); /* requester gone/gave up: the payload stayed ours */
        return kvp_rt_reply(ctx, msg->corr_id, rc, 0, NULL, NULL);
    }
    return KVP_OK;
}

static void test_runtime_request_real_deadline_times_out_late_reply_dropped(void **unused)
{
    struct kvp_rt_actor *observer = NULL, *silent = NULL, *req = NULL;
    assert_int_equal(kvp_rt_sink_new(&observer, "observer"), KVP_OK);
    struct silent_state ss = {0};
    struct kvp_rt_spec sspec = {.name = "silent", .handle = on_silent, .state = &ss};
    assert_int_equal(kvp_rt_spawn(&silent, &sspec, NULL), KVP_OK);
    struct req_state rs = {.peer = silent, .observer = observer};
    struct kvp_rt_spec rspec = {.name = "req", .handle = on_requester, .state = &rs};
    assert_int_equal(kvp_rt_spawn(&req, &rspec, NULL), KVP_OK);

    assert_int_equal(kvp_rt_send(req, 0, MSG_KICK, 20, NULL, NULL), KVP_OK);
    struct kvp_rt_msg *m = NULL;
    assert_int_equal(kvp_rt_recv(observer, 10000, &m), KVP_OK);
    assert_int_equal(m->type, MSG_NOTE);
    assert_int_equal((int)(int64_t)m->arg, KVP_ERR_TIMEOUT);
    kvp_rt_msg_destroy(&m);

    /* Silent answers now; the reply reaches req before PING (same sender order is not
     * needed: the call returns after the reply was pushed). req must drop it. */
    assert_int_equal(kvp_rt_call(silent, 0, MSG_ANSWER, 0, NULL, NULL, 0, &m), KVP_OK);
    assert_int_equal(m->status, KVP_OK);
    kvp_rt_msg_destroy(&m);
    assert_int_equal(kvp_rt_send(req, 0, MSG_PING, 42, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_rt_recv(observer, 10000, &m), KVP_OK);
    assert_int_equal(m->type, MSG_PING);
    assert_int_equal(m->arg, 42);
    kvp_rt_msg_destroy(&m);

    kvp_rt_destroy(&req);
    kvp_rt_destroy(&silent);
    kvp_rt_destroy(&observer);
    assert_int_equal(atomic_load(&g_live), 0);
}

static void test_runtime_call_timeout_returns_timeout(void **unused)
{
    struct kvp_rt_actor *silent = NULL;
    struct silent_state ss = {0};
    struct kvp_rt_spec sspec = {.name = "silent", .handle = on_silent, .state = &ss};
    assert_int_equal(kvp_rt_spawn(&silent, &sspec, NULL), KVP_OK);
    struct kvp_rt_msg *m = NULL;
    void *p = pl_new();
    assert_int_equal(kvp_rt_call(silent, 0, MSG_WORK, 0, &p, pl_free, 20, &m), KVP_ERR_TIMEOUT);
    assert_null(p); /* the request was sent: its payload went with it */
    assert_null(m);
    /* The late answer finds the caller gone; the replier keeps (and frees) its payload. */
    assert_int_equal(kvp_rt_call(silent, 0, MSG_ANSWER, 0, NULL, NULL, 0, &m), KVP_OK);
    assert_int_equal(m->status, KVP_ERR_CLOSED);
    kvp_rt_msg_destroy(&m);
    kvp_rt_destroy(&silent);
    assert_int_equal(atomic_load(&g_live), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runtime_request_deadline_fake_clock_times_out),
        cmocka_unit_test(test_runtime_reply_before_deadline_is_delivered),
        cmocka_unit_test(test_runtime_request_real_deadline_times_out_late_reply_dropped),
        cmocka_unit_test(test_runtime_call_timeout_returns_timeout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
