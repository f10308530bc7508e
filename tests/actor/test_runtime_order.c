/* test_runtime_order.c — messages from one sender arrive in the order sent: threaded actors
 * with several sender threads, hosted actors, manual actors under the harness. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>

#include "kvpool.h"
#include "runtime/actor.h"
#include "tests/lib/actor_harness.h"

enum { MSG_SEQ = 1, MSG_REPORT = 2, MSG_SPAWN_HOSTED = 3 };

#define SENDERS 4
#define PER_SENDER 5000

struct order_state {
    uint64_t next[SENDERS + 1]; /* next expected seq per sender */
    uint64_t received;
    uint64_t violations;
};

static int order_check(struct order_state *s, uint64_t arg)
{
    uint64_t sender = arg >> 32, seq = arg & 0xffffffffu;
    if (sender > SENDERS)
        return KVP_ERR_INVALID;
    if (seq != s->next[sender])
        s->violations++;
    s->next[sender] = seq + 1;
    s->received++;
    return KVP_OK;
}

static int on_order_msg(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct order_state *s = kvp_rt_state(ctx);
    if (msg->kind == KVP_RT_SEND && msg->type == MSG_SEQ)
        return order_check(s, msg->arg);
    if (msg->kind == KVP_RT_REQUEST && msg->type == MSG_REPORT)
        return kvp_rt_reply(ctx, msg->corr_id, (int)s->violations, s->received, NULL, NULL);
    return KVP_OK;
}

struct sender_arg {
    struct kvp_rt_actor *to;
    uint64_t id;
    int errors;
};

static void *sender_main(void *p)
{
    struct sender_arg *sa = p;
    for (uint64_t i = 0; i < PER_SENDER; i++)
        if (kvp_rt_send(sa->to, 0, MSG_SEQ, (sa->id << 32) | i, NULL, NULL) != KVP_OK)
            sa->errors++;
    return NULL;
}

static void test_runtime_many_senders_fifo_per_sender(void **unused)
{
    struct order_state *st = calloc(1, sizeof(*st));
    struct kvp_rt_spec spec = {.name = "order", .handle = on_order_msg, .state = st};
    struct kvp_rt_actor *a = NULL;
    assert_int_equal(kvp_rt_spawn(&a, &spec, NULL), KVP_OK);

    pthread_t th[SENDERS];
    struct sender_arg sa[SENDERS];
    for (int i = 0; i < SENDERS; i++) {
        sa[i] = (struct sender_arg){.to = a, .id = (uint64_t)i + 1};
        assert_int_equal(pthread_create(&th[i], NULL, sender_main, &sa[i]), 0);
    }
    for (int i = 0; i < SENDERS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(sa[i].errors, 0);
    }
    /* The report request is queued behind every message sent above. */
    struct kvp_rt_msg *r = NULL;
    assert_int_equal(kvp_rt_call(a, 0, MSG_REPORT, 0, NULL, NULL, 0, &r), KVP_OK);
    assert_int_equal(r->kind, KVP_RT_REPLY);
    assert_int_equal(r->status, 0); /* violations */
    assert_int_equal(r->arg, (uint64_t)SENDERS * PER_SENDER);
    kvp_rt_msg_destroy(&r);
    assert_int_equal(kvp_rt_stop(a), KVP_OK);
    kvp_rt_destroy(&a);
    assert_null(a);
    free(st);
}

/* A host whose hosted actor checks the order of the messages addressed to it. */
static int on_hosted_seq(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct order_state *s = kvp_rt_state(ctx);
    if (msg->kind == KVP_RT_SEND)
        return order_check(s, msg->arg);
    if (msg->kind == KVP_RT_REQUEST)
        return kvp_rt_reply(ctx, msg->corr_id, (int)s->violations, s->received, NULL, NULL);
    return KVP_OK;
}

static void free_state(struct kvp_rt_ctx *ctx)
{
    free(kvp_rt_state(ctx));
}

static int on_host(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    if (msg->kind == KVP_RT_REQUEST && msg->type == MSG_SPAWN_HOSTED) {
        static const struct kvp_rt_hosted_spec hs = {"seq", on_hosted_seq, free_state};
        uint64_t hid = 0;
        struct order_state *s = calloc(1, sizeof(*s));
        int rc = s ? kvp_rt_hosted_spawn(ctx, &hs, s, &hid) : KVP_ERR_NOMEM;
        if (rc)
            free(s);
        return kvp_rt_reply(ctx, msg->corr_id, rc, hid, NULL, NULL);
    }
    return KVP_OK;
}

static void test_runtime_hosted_messages_in_order(void **unused)
{
    struct kvp_rt_spec spec = {.name = "host", .handle = on_host};
    struct kvp_rt_actor *a = NULL;
    assert_int_equal(kvp_rt_spawn(&a, &spec, NULL), KVP_OK);
    struct kvp_rt_msg *r = NULL;
    assert_int_equal(kvp_rt_call(a, 0, MSG_SPAWN_HOSTED, 0, NULL, NULL, 0, &r), KVP_OK);
    assert_int_equal(r->status, KVP_OK);
    uint64_t hid = r->arg;
    assert_true(hid != 0);
    kvp_rt_msg_destroy(&r);
    for (uint64_t i = 0; i < 3000; i++)
        assert_int_equal(kvp_rt_send(a, hid, MSG_SEQ, (1ull << 32) | i, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_rt_call(a, hid, MSG_REPORT, 0, NULL, NULL, 0, &r), KVP_OK);
    assert_int_equal(r->status, 0);
    assert_int_equal(r->arg, 3000);
    kvp_rt_msg_destroy(&r);
    kvp_rt_destroy(&a); /* the hosted actor's fini frees its state */
}

static void test_runtime_harness_manual_actor_in_order(void **unused)
{
    struct order_state st = {0};
    struct kvp_rt_spec spec = {.name = "order-h", .handle = on_order_msg, .state = &st};
    struct kvp_th th;
    assert_int_equal(kvp_th_init(&th, &spec), KVP_OK);
    for (uint64_t i = 0; i < 100; i++)
        assert_int_equal(kvp_rt_send(th.actor, 0, MSG_SEQ, (2ull << 32) | i, NULL, NULL), KVP_OK);
    assert_int_equal(st.received, 0); /* nothing runs until polled */
    assert_int_equal(kvp_th_run(&th), 100);
    assert_int_equal(st.received, 100);
    assert_int_equal(st.violations, 0);
    /* An out-of-order sequence is detected (the check can fail). */
    assert_int_equal(kvp_th_send(&th, 0, MSG_SEQ, (2ull << 32) | 500, NULL, NULL), 1);
    assert_int_equal(st.violations, 1);
    uint64_t corr = 0;
    assert_int_equal(kvp_th_request(&th, 0, MSG_REPORT, 0, NULL, NULL, &corr), 1);
    struct kvp_rt_msg *r = NULL;
    assert_int_equal(kvp_th_take(&th, &r), KVP_OK);
    assert_int_equal(r->kind, KVP_RT_REPLY);
    assert_int_equal(r->corr_id, corr);
    assert_int_equal(r->status, 1);
    assert_int_equal(r->arg, 101);
    kvp_rt_msg_destroy(&r);
    assert_int_equal(kvp_th_take(&th, &r), KVP_ERR_TIMEOUT);
    assert_int_equal(kvp_th_fini(&th), KVP_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runtime_many_senders_fifo_per_sender),
        cmocka_unit_test(test_runtime_hosted_messages_in_order),
        cmocka_unit_test(test_runtime_harness_manual_actor_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
