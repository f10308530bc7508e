/* test_runtime_hosted.c — hosted actors: churn of 100,000 create/finish without leaks (the
 * ASan build checks the heap), finishing with requests, timers and pending replies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/clock.h"
#include "tests/lib/actor_harness.h"

enum { MSG_CHURN = 1, MSG_COUNT = 2, MSG_BYE = 3, MSG_WORK = 4, MSG_TICK = 5, MSG_ASK = 6 };

#define CHURN 100000

struct host_state {
    uint64_t created, finished; /* finished = hosted finis run */
    uint64_t spawn_ns;
};

static void hosted_fini(struct kvp_rt_ctx *ctx)
{
    uint64_t *payload = kvp_rt_state(ctx);
    struct host_state *hs = (struct host_state *)(uintptr_t)payload[0];
    hs->finished++;
    free(payload);
}

static int on_hosted(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    if (msg->kind == KVP_RT_SEND && msg->type == MSG_BYE)
        return KVP_RT_DONE;
    return KVP_OK;
}

static const struct kvp_rt_hosted_spec g_hosted = {"churn", on_hosted, hosted_fini};

static int on_host(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct host_state *s = kvp_rt_state(ctx);
    if (msg->kind == KVP_RT_REQUEST && msg->type == MSG_CHURN) {
        uint64_t t0 = kvp_clock_now_ns();
        for (uint64_t i = 0; i < msg->arg; i++) {
            uint64_t *st = malloc(2 * sizeof(*st)); /* state with a heap block: leaks show */
            if (!st)
                return KVP_ERR_NOMEM;
            st[0] = (uint64_t)(uintptr_t)s;
            uint64_t hid = 0;
            int rc = kvp_rt_hosted_spawn(ctx, &g_hosted, st, &hid);
            if (rc) {
                free(st);
                return rc;
            }
            s->created++;
            /* Half end now (kvp_rt_hosted_finish), half after a message (KVP_RT_DONE). */
            if (i % 2 == 0)
                rc = kvp_rt_hosted_finish(ctx, hid);
            else
                rc = kvp_rt_send(kvp_rt_self(ctx), hid, MSG_BYE, 0, NULL, NULL);
            if (rc)
                return rc;
        }
        s->spawn_ns = kvp_clock_now_ns() - t0;
        return kvp_rt_reply(ctx, msg->corr_id, KVP_OK, s->spawn_ns, NULL, NULL);
    }
    if (msg->kind == KVP_RT_REQUEST && msg->type == MSG_COUNT)
        return kvp_rt_reply(ctx, msg->corr_id, KVP_OK, kvp_rt_hosted_count(ctx), NULL, NULL);
    return KVP_OK;
}

static void test_runtime_hosted_churn_100k_no_leak(void **unused)
{
    struct host_state hs = {0};
    struct kvp_rt_spec spec = {.name = "host", .handle = on_host, .state = &hs};
    struct kvp_rt_actor *a = NULL;
    assert_int_equal(kvp_rt_spawn(&a, &spec, NULL), KVP_OK);
    struct kvp_rt_msg *r = NULL;
    assert_int_equal(kvp_rt_call(a, 0, MSG_CHURN, CHURN, NULL, NULL, 0, &r), KVP_OK);
    assert_int_equal(r->status, KVP_OK);
    kvp_rt_msg_destroy(&r);
    /* COUNT is queued behind every BYE: by then all hosted actors must be gone. */
    assert_int_equal(kvp_rt_call(a, 0, MSG_COUNT, 0, NULL, NULL, 0, &r), KVP_OK);
    assert_int_equal(r->arg, 0); /* every hosted actor is gone */
    kvp_rt_msg_destroy(&r);
    assert_int_equal(kvp_rt_stop(a), KVP_OK);
    kvp_rt_destroy(&a);
    assert_int_equal(hs.created, CHURN);
    assert_int_equal(hs.finished, CHURN);
    fprintf(stderr, "hosted spawn+finish/send: %.3f us per hosted actor\n",
            (double)hs.spawn_ns / 1000.0 / CHURN);
}

/* Finishing a hosted actor settles its debts: a request it holds is answered CLOSED, its
 * timer never fires, replies still due to it are dropped. */
struct keeper_state {
    struct kvp_rt_actor *peer;
    int ticks;
    uint64_t held_token;
};

static int on_keeper(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct keeper_state *s = kvp_rt_state(ctx);
    switch (msg->kind) {
    case KVP_RT_REQUEST:
        s->held_token = msg->corr_id; /* never answered */
        return KVP_OK;
    case KVP_RT_TIMER:
        s->ticks++;
        return KVP_OK;
    case KVP_RT_SEND:
        if (msg->type == MSG_ASK)
            return kvp_rt_request(ctx, s->peer, 0, MSG_WORK, 0, NULL, NULL, 0, NULL);
        if (msg->type == MSG_TICK)
            return kvp_rt_timer_start(ctx, 10, 10, MSG_TICK, NULL);
        return KVP_OK;
    case KVP_RT_REPLY:
        return KVP_ERR_INTERNAL; /* must never arrive after finish */
    default:
        return KVP_OK;
    }
}

struct khost_state {
    struct kvp_rt_actor *probe;
    uint64_t hid;
    struct keeper_state ks;
};

static int on_khost(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct khost_state *s = kvp_rt_state(ctx);
    static const struct kvp_rt_hosted_spec ks = {"keeper", on_keeper, NULL};
    if (msg->kind == KVP_RT_SEND && msg->type == MSG_CHURN)
        return kvp_rt_hosted_spawn(ctx, &ks, &s->ks, &s->hid);
    if (msg->kind == KVP_RT_SEND && msg->type == MSG_BYE) {
        int rc = kvp_rt_hosted_finish(ctx, s->hid);
        int again = kvp_rt_hosted_finish(ctx, s->hid);
        return rc ? rc : (again == KVP_ERR_NOT_FOUND ? KVP_OK : KVP_ERR_INTERNAL);
    }
    if (msg->kind == KVP_RT_FAILED)
        return KVP_ERR_INTERNAL;
    return KVP_OK;
}

static void test_runtime_hosted_finish_settles_requests_and_timers(void **unused)
{
    struct kvp_th th;
    struct khost_state s = {0};
    struct kvp_rt_spec spec = {.name = "khost", .handle = on_khost, .state = &s};
    assert_int_equal(kvp_th_init(&th, &spec), KVP_OK);
    s.ks.peer = th.probe;
    assert_int_equal(kvp_th_send(&th, 0, MSG_CHURN, 0, NULL, NULL), 1);
    uint64_t hid = s.hid;
    uint64_t corr = 0;
    assert_int_equal(kvp_th_request(&th, hid, MSG_WORK, 0, NULL, NULL, &corr), 1);
    assert_int_equal(kvp_th_send(&th, hid, MSG_TICK, 0, NULL, NULL), 1);
    assert_int_equal(kvp_th_send(&th, hid, MSG_ASK, 0, NULL, NULL), 1);
    kvp_th_advance_ms(&th, 10);
    assert_int_equal(s.ks.ticks, 1);
    struct kvp_rt_msg *asked = NULL;
    assert_int_equal(kvp_th_take(&th, &asked), KVP_OK); /* keeper's request to the probe */
    assert_int_equal(asked->kind, KVP_RT_REQUEST);

    assert_int_equal(kvp_th_send(&th, 0, MSG_BYE, 0, NULL, NULL), 1);
    struct kvp_rt_msg *m = NULL;
    assert_int_equal(kvp_th_take(&th, &m), KVP_OK); /* the held request: answered CLOSED */
    assert_int_equal(m->kind, KVP_RT_REPLY);
    assert_int_equal(m->corr_id, corr);
    assert_int_equal(m->status, KVP_ERR_CLOSED);
    kvp_rt_msg_destroy(&m);
    kvp_th_advance_ms(&th, 100);
    assert_int_equal(s.ks.ticks, 1); /* timer cancelled */
    assert_int_equal(kvp_rt_msg_reply(&asked, KVP_OK, 0, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_th_run(&th), 1); /* delivered to nobody: dropped, host unaffected */
    assert_int_equal(kvp_th_captured(&th), 0);
    assert_int_equal(kvp_th_fini(&th), KVP_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runtime_hosted_churn_100k_no_leak),
        cmocka_unit_test(test_runtime_hosted_finish_settles_requests_and_timers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
