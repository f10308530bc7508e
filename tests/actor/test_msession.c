/*
 * test_msession.c — the master session against fake masters (ZeroMQ ROUTERs in a thread of
 * the test): NOT_LEADER hints are followed, dead and silent masters are skipped, replies with
 * unknown req_ids are dropped, no master → UNAVAILABLE, destroy → in-flight calls get CLOSED,
 * many caller threads through leader changes each get their own answer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "actors/session/msession.h"
#include "kvpool.h"
#include "runtime/actor.h"
#include "wire/envelope.h"

enum fake_mode {
    FAKE_OK,          /* answer status OK, body exists {results: [7]} */
    FAKE_HINT,        /* answer NOT_LEADER with hint */
    FAKE_NOHINT,      /* answer NOT_LEADER without hint */
    FAKE_SILENT,      /* never answer */
    FAKE_BOGUS_FIRST, /* answer a reply with a wrong req_id, then the right one */
    FAKE_FOLLOW,      /* F.leader's index: answer as FAKE_OK; F.mute: silent; else NOT_LEADER + hint */
};

struct fake_master {
    void *sock;
    _Atomic enum fake_mode mode; /* the test thread changes it while the fake masters run */
    char addr[64]; /* "127.0.0.1:port" */
    char hint[128];
    atomic_int requests;
};

#define MAX_FAKES 4
static struct {
    void *ctx;
    struct fake_master m[MAX_FAKES];
    int n;
    atomic_bool stop;
    pthread_t thread;
    atomic_int leader; /* FAKE_FOLLOW: index of the leader */
    atomic_int mute;   /* FAKE_FOLLOW: index of a master that answers nothing (-1 none) */
} F;

static void fake_reply(struct fake_master *m, zmq_msg_t *id, const Kvp__Request *req)
{
    Kvp__Response resp;
    kvp__response__init(&resp);
    Kvp__ExistsResp ex;
    kvp__exists_resp__init(&ex);
    int32_t results[1] = {7};
    resp.req_id = req->req_id;
    enum fake_mode mode = m->mode;
    if (mode == FAKE_FOLLOW) {
        int me = (int)(m - F.m);
        int leader = atomic_load(&F.leader);
        mode = me == atomic_load(&F.mute) ? FAKE_SILENT : me == leader ? FAKE_OK : FAKE_HINT;
        if (mode == FAKE_HINT)
            resp.leader_hint = F.m[leader].addr;
    }
    switch (mode) {
    case FAKE_HINT:
        resp.status = KVP_ERR_NOT_LEADER;
        resp.leader_hint = m->hint;
        break;
    case FAKE_NOHINT:
        resp.status = KVP_ERR_NOT_LEADER;
        break;
    case FAKE_SILENT:
    case FAKE_FOLLOW: /* resolved above */
        return;
    case FAKE_BOGUS_FIRST:
    case FAKE_OK:
        resp.status = KVP_OK;
        ex.n_results = 1;
        ex.results = results;
        resp.body_case = KVP__RESPONSE__BODY_EXISTS;
        resp.exists = &ex;
        break;
    }
    int n_send = mode == FAKE_BOGUS_FIRST ? 2 : 1;
    for (int k = 0; k < n_send; k++) {
        if (n_send == 2 && k == 0)
            resp.req_id = req->req_id + 12345678ull; /* nobody's */
        else
            resp.req_id = req->req_id;
        uint8_t *buf;
        size_t len;
        if (kvp_wire_encode_response(&resp, &buf, &len) != KVP_OK)
            return;
        zmq_send(m->sock, zmq_msg_data(id), zmq_msg_size(id), ZMQ_SNDMORE);
        zmq_send(m->sock, buf, len, 0);
        free(buf);
    }
}

static void *fake_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&F.stop)) {
        zmq_pollitem_t items[MAX_FAKES];
        for (int i = 0; i < F.n; i++)
            items[i] = (zmq_pollitem_t){.socket = F.m[i].sock, .events = ZMQ_POLLIN};
        if (zmq_poll(items, F.n, 20) <= 0)
            continue;
        for (int i = 0; i < F.n; i++) {
            if (!(items[i].revents & ZMQ_POLLIN))
                continue;
            zmq_msg_t id, body;
            zmq_msg_init(&id);
            zmq_msg_init(&body);
            zmq_msg_recv(&id, F.m[i].sock, 0);
            zmq_msg_recv(&body, F.m[i].sock, 0);
            Kvp__Request *req = NULL;
            if (kvp_wire_decode_request(zmq_msg_data(&body), zmq_msg_size(&body), &req) == KVP_OK) {
                atomic_fetch_add(&F.m[i].requests, 1);
                fake_reply(&F.m[i], &id, req);
                kvp__request__free_unpacked(req, NULL);
            }
            zmq_msg_close(&id);
            zmq_msg_close(&body);
        }
    }
    return NULL;
}

/* Start n fake masters with the given modes (hints are filled by the test afterwards). */
static void fakes_start(int n, const enum fake_mode *modes)
{
    memset(&F, 0, sizeof F);
    F.ctx = zmq_ctx_new();
    F.n = n;
    for (int i = 0; i < n; i++) {
        F.m[i].sock = zmq_socket(F.ctx, ZMQ_ROUTER);
        int zero = 0;
        zmq_setsockopt(F.m[i].sock, ZMQ_LINGER, &zero, sizeof zero);
        assert_int_equal(zmq_bind(F.m[i].sock, "tcp://127.0.0.1:*"), 0);
        char ep[128];
        size_t len = sizeof ep;
        zmq_getsockopt(F.m[i].sock, ZMQ_LAST_ENDPOINT, ep, &len);
        snprintf(F.m[i].addr, sizeof F.m[i].addr, "%s", ep + strlen("tcp://"));
        F.m[i].mode = modes[i];
    }
}

static void fakes_run(void)
{
    assert_int_equal(pthread_create(&F.thread, NULL, fake_main, NULL), 0);
}

static void fakes_stop(void)
{
    atomic_store(&F.stop, true);
    pthread_join(F.thread, NULL);
    for (int i = 0; i < F.n; i++)
        zmq_close(F.m[i].sock);
    zmq_ctx_term(F.ctx);
}

/* A loopback "host:port" where nothing listens. */
static void dead_addr(char *buf, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &l);
    snprintf(buf, cap, "127.0.0.1:%u", ntohs(a.sin_port));
    close(fd);
}

static void make_exists(Kvp__Request *req, Kvp__ExistsReq *ex, char **keys)
{
    kvp__request__init(req);
    kvp__exists_req__init(ex);
    keys[0] = "k";
    ex->n_keys = 1;
    ex->keys = keys;
    req->body_case = KVP__REQUEST__BODY_EXISTS;
    req->exists = ex;
}

static int call_exists(struct kvp_msession *s, uint32_t timeout_ms, int32_t *result)
{
    Kvp__Request req;
    Kvp__ExistsReq ex;
    char *keys[1];
    make_exists(&req, &ex, keys);
    Kvp__Response *resp = NULL;
    int rc = kvp_msession_call(s, &req, timeout_ms, &resp);
    if (rc == KVP_OK) {
        assert_non_null(resp);
        assert_int_equal(resp->status, KVP_OK);
        assert_int_equal(resp->body_case, KVP__RESPONSE__BODY_EXISTS);
        assert_int_equal(resp->exists->n_results, 1);
        *result = resp->exists->results[0];
        assert_int_equal(resp->req_id, req.req_id);
        kvp_msession_response_free(resp);
    } else {
        assert_null(resp);
    }
    return rc;
}

static void test_msession_not_leader_hint_follows_to_leader(void **state)
{
    (void)state;
    enum fake_mode modes[2] = {FAKE_HINT, FAKE_OK};
    fakes_start(2, modes);
    snprintf(F.m[0].hint, sizeof F.m[0].hint, "%s", F.m[1].addr);
    fakes_run();
    const char *masters[2] = {F.m[0].addr, F.m[1].addr};
    struct kvp_msession *s = NULL;
    assert_int_equal(kvp_msession_new(&s, masters, 2, "test"), KVP_OK);
    int32_t r = 0;
    assert_int_equal(call_exists(s, 3000, &r), KVP_OK);
    assert_int_equal(r, 7);
    char leader[128];
    kvp_msession_leader(s, leader, sizeof leader);
    assert_string_equal(leader, F.m[1].addr);
    assert_int_equal(atomic_load(&F.m[1].requests), 1);
    /* (A is normally asked first; on a slow machine the session may reach B by rotation before
     * its connection to A is up. test_msession_hint_unknown_master_added covers the hint.) */
    int before = atomic_load(&F.m[0].requests);
    /* The next call goes straight to the known leader. */
    assert_int_equal(call_exists(s, 3000, &r), KVP_OK);
    assert_int_equal(atomic_load(&F.m[0].requests), before);
    assert_int_equal(atomic_load(&F.m[1].requests), 2);
    kvp_msession_destroy(&s);
    assert_null(s);
    fakes_stop();
}

static void test_msession_hint_unknown_master_added(void **state)
{
    (void)state;
    enum fake_mode modes[2] = {FAKE_HINT, FAKE_OK};
    fakes_start(2, modes);
    snprintf(F.m[0].hint, sizeof F.m[0].hint, "tcp://%s", F.m[1].addr);
    fakes_run();
    const char *masters[1] = {F.m[0].addr}; /* the session only knows the follower */
    struct kvp_msession *s = NULL;
    assert_int_equal(kvp_msession_new(&s, masters, 1, "test"), KVP_OK);
    int32_t r = 0;
    assert_int_equal(call_exists(s, 3000, &r), KVP_OK);
    assert_int_equal(r, 7);
    char leader[128];
    kvp_msession_leader(s, leader, sizeof leader);
    assert_string_equal(leader, F.m[1].addr);
    kvp_msession_destroy(&s);
    fakes_stop();
}

static void test_msession_dead_and_silent_masters_rotated(void **state)
{
    (void)state;
    enum fake_mode modes[3] = {FAKE_SILENT, FAKE_NOHINT, FAKE_OK};
    fakes_start(3, modes);
    fakes_run();
    char dead[64];
    dead_addr(dead, sizeof dead);
    const char *masters[4] = {dead, F.m[0].addr, F.m[1].addr, F.m[2].addr};
    struct kvp_msession *s = NULL;
    assert_int_equal(kvp_msession_new(&s, masters, 4, "test"), KVP_OK);
    int32_t r = 0;
    assert_int_equal(call_exists(s, 8000, &r), KVP_OK);
    assert_int_equal(r, 7);
    char leader[128];
    kvp_msession_leader(s, leader, sizeof leader);
    assert_string_equal(leader, F.m[2].addr);
    kvp_msession_destroy(&s);
    fakes_stop();
}

static void test_msession_unknown_req_id_dropped(void **state)
{
    (void)state;
    enum fake_mode modes[1] = {FAKE_BOGUS_FIRST};
    fakes_start(1, modes);
    fakes_run();
    const char *masters[1] = {F.m[0].addr};
    struct kvp_msession *s = NULL;
    assert_int_equal(kvp_msession_new(&s, masters, 1, "test"), KVP_OK);
    int32_t r = 0;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(call_exists(s, 3000, &r), KVP_OK);
        assert_int_equal(r, 7);
    }
    kvp_msession_destroy(&s);
    fakes_stop();
}

static void test_msession_no_master_unavailable(void **state)
{
    (void)state;
    enum fake_mode modes[1] = {FAKE_NOHINT};
    fakes_start(1, modes);
    fakes_run();
    char dead[64];
    dead_addr(dead, sizeof dead);
    const char *masters[2] = {dead, F.m[0].addr};
    struct kvp_msession *s = NULL;
    assert_int_equal(kvp_msession_new(&s, masters, 2, "test"), KVP_OK);
    int32_t r = 0;
    assert_int_equal(call_exists(s, 600, &r), KVP_ERR_UNAVAILABLE);
    char leader[128];
    kvp_msession_leader(s, leader, sizeof leader);
    assert_string_equal(leader, "");
    kvp_msession_destroy(&s);
    fakes_stop();
}

/* Issue 18 item 3: after a whole timeout with no master answering, calls fail at once (even one
 * with a 10-minute timeout: without the breaker it would hold the test until CTest kills it)
 * until a probe is answered; then calls go through again. */
static void test_msession_fail_fast_after_silent_timeout_until_master_answers(void **state)
{
    (void)state;
    enum fake_mode modes[1] = {FAKE_SILENT};
    fakes_start(1, modes);
    fakes_run();
    const char *masters[1] = {F.m[0].addr};
    struct kvp_msession *s = NULL;
    assert_int_equal(kvp_msession_new(&s, masters, 1, "test"), KVP_OK);
    kvp_msession_set_fail_fast(s, true);
    int32_t r = 0;
    assert_false(kvp_msession_failing_fast(s, NULL));
    assert_int_equal(call_exists(s, 400, &r), KVP_ERR_UNAVAILABLE);
    assert_true(kvp_msession_failing_fast(s, NULL));
    for (int i = 0; i < 3; i++)
        assert_int_equal(call_exists(s, 600000, &r), KVP_ERR_UNAVAILABLE);
    uint64_t ff = 0;
    assert_true(kvp_msession_failing_fast(s, &ff));
    assert_int_equal(ff, 3);
    /* The master answers again: a probe closes the breaker. */
    int before = atomic_load(&F.m[0].requests);
    F.m[0].mode = FAKE_OK;
    for (int i = 0; i < 1000 && kvp_msession_failing_fast(s, NULL); i++)
        usleep(10000);
    assert_false(kvp_msession_failing_fast(s, NULL));
    assert_true(atomic_load(&F.m[0].requests) > before); /* it was a probe that got through */
    assert_int_equal(call_exists(s, 5000, &r), KVP_OK);
    assert_int_equal(r, 7);
    kvp_msession_destroy(&s);
    fakes_stop();
}

/* A failover in progress: a leader answered a moment ago, now a master answers "not leader" (no
 * leader yet). The call times out, but the breaker stays closed: the next call waits for a
 * leader as before. Off by default. */
static void test_msession_fail_fast_not_while_a_master_answers_or_off(void **state)
{
    (void)state;
    enum fake_mode modes[2] = {FAKE_OK, FAKE_SILENT};
    fakes_start(2, modes);
    fakes_run();
    const char *masters[2] = {F.m[0].addr, F.m[1].addr};
    struct kvp_msession *s = NULL;
    assert_int_equal(kvp_msession_new(&s, masters, 2, "test"), KVP_OK);
    kvp_msession_set_fail_fast(s, true);
    int32_t r = 0;
    assert_int_equal(call_exists(s, 5000, &r), KVP_OK); /* a leader, well within KVP_MS_FAILOVER_MS */
    F.m[0].mode = FAKE_NOHINT;
    assert_int_equal(call_exists(s, 400, &r), KVP_ERR_UNAVAILABLE);
    assert_false(kvp_msession_failing_fast(s, NULL));
    assert_int_equal(call_exists(s, 400, &r), KVP_ERR_UNAVAILABLE);
    uint64_t ff = 1;
    assert_false(kvp_msession_failing_fast(s, &ff));
    assert_int_equal(ff, 0);
    kvp_msession_destroy(&s);
    /* Off (the default, as for segments and kvpoolctl): a silent master never opens it. */
    const char *silent[1] = {F.m[1].addr};
    assert_int_equal(kvp_msession_new(&s, silent, 1, "test"), KVP_OK);
    assert_int_equal(call_exists(s, 400, &r), KVP_ERR_UNAVAILABLE);
    assert_false(kvp_msession_failing_fast(s, NULL));
    kvp_msession_destroy(&s);
    fakes_stop();
}

/* The quorum is gone but a master runs: it answers "not leader" without a hint, and no leader
 * was ever known to this session. A whole call timeout of that opens the breaker (before the
 * fix, every call waited its whole timeout forever); a probe answered with a leader closes it. */
static void test_msession_fail_fast_when_only_not_leader_without_a_leader(void **state)
{
    (void)state;
    enum fake_mode modes[1] = {FAKE_NOHINT};
    fakes_start(1, modes);
    fakes_run();
    const char *masters[1] = {F.m[0].addr};
    struct kvp_msession *s = NULL;
    assert_int_equal(kvp_msession_new(&s, masters, 1, "test"), KVP_OK);
    kvp_msession_set_fail_fast(s, true);
    int32_t r = 0;
    assert_int_equal(call_exists(s, 400, &r), KVP_ERR_UNAVAILABLE);
    assert_true(kvp_msession_failing_fast(s, NULL));
    assert_int_equal(call_exists(s, 600000, &r), KVP_ERR_UNAVAILABLE); /* at once */
    /* Probes answered "not leader" keep it open; a leader's answer closes it. */
    int before = atomic_load(&F.m[0].requests);
    for (int i = 0; i < 1000 && atomic_load(&F.m[0].requests) < before + 2; i++)
        usleep(10000);
    assert_true(kvp_msession_failing_fast(s, NULL));
    F.m[0].mode = FAKE_OK;
    for (int i = 0; i < 1000 && kvp_msession_failing_fast(s, NULL); i++)
        usleep(10000);
    assert_false(kvp_msession_failing_fast(s, NULL));
    assert_int_equal(call_exists(s, 5000, &r), KVP_OK);
    kvp_msession_destroy(&s);
    fakes_stop();
}

struct bg_call {
    struct kvp_msession *s;
    int rc;
};

static void *bg_call_main(void *arg)
{
    struct bg_call *b = arg;
    Kvp__Request req;
    Kvp__ExistsReq ex;
    char *keys[1];
    make_exists(&req, &ex, keys);
    Kvp__Response *resp = NULL;
    b->rc = kvp_msession_call(b->s, &req, 30000, &resp);
    kvp_msession_response_free(resp);
    return NULL;
}

static void test_msession_destroy_inflight_closed(void **state)
{
    (void)state;
    enum fake_mode modes[1] = {FAKE_SILENT};
    fakes_start(1, modes);
    fakes_run();
    const char *masters[1] = {F.m[0].addr};
    struct kvp_msession *s = NULL;
    assert_int_equal(kvp_msession_new(&s, masters, 1, "test"), KVP_OK);
    struct bg_call b = {.s = s, .rc = 1};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, bg_call_main, &b), 0);
    while (atomic_load(&F.m[0].requests) == 0)
        usleep(1000); /* wait until the call is on the wire */
    kvp_msession_destroy(&s);
    pthread_join(t, NULL);
    assert_int_equal(b.rc, KVP_ERR_CLOSED);
    fakes_stop();
}

struct hammer {
    struct kvp_msession *s;
    int ok, bad;
};

static void *hammer_main(void *arg)
{
    struct hammer *h = arg;
    for (int i = 0; i < 200; i++) {
        Kvp__Request req;
        Kvp__ExistsReq ex;
        char *keys[1];
        make_exists(&req, &ex, keys);
        Kvp__Response *resp = NULL;
        int rc = kvp_msession_call(h->s, &req, 5000, &resp);
        if (rc == KVP_OK && resp->req_id == req.req_id && resp->body_case == KVP__RESPONSE__BODY_EXISTS)
            h->ok++;
        else
            h->bad++;
        kvp_msession_response_free(resp);
    }
    return NULL;
}

/* Many threads on one session: every call gets its own reply. */
static void test_msession_many_threads_each_own_reply(void **state)
{
    (void)state;
    enum fake_mode modes[2] = {FAKE_HINT, FAKE_OK};
    fakes_start(2, modes);
    snprintf(F.m[0].hint, sizeof F.m[0].hint, "%s", F.m[1].addr);
    fakes_run();
    const char *masters[2] = {F.m[0].addr, F.m[1].addr};
    struct kvp_msession *s = NULL;
    assert_int_equal(kvp_msession_new(&s, masters, 2, "test"), KVP_OK);
    struct hammer h[8];
    pthread_t t[8];
    for (int i = 0; i < 8; i++) {
        h[i] = (struct hammer){.s = s};
        assert_int_equal(pthread_create(&t[i], NULL, hammer_main, &h[i]), 0);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(h[i].ok, 200);
        assert_int_equal(h[i].bad, 0);
    }
    kvp_msession_destroy(&s);
    fakes_stop();
}

struct follower {
    struct kvp_msession *s;
    atomic_int *done_calls;
    int ok, bad;
};

static void *follower_main(void *arg)
{
    struct follower *f = arg;
    for (int i = 0; i < 60; i++) {
        Kvp__Request req;
        Kvp__ExistsReq ex;
        char *keys[1];
        make_exists(&req, &ex, keys);
        Kvp__Response *resp = NULL;
        int rc = kvp_msession_call(f->s, &req, 10000, &resp);
        if (rc == KVP_OK && resp->status == KVP_OK && resp->body_case == KVP__RESPONSE__BODY_EXISTS &&
            resp->exists->n_results == 1 && resp->exists->results[0] == 7)
            f->ok++;
        else
            f->bad++;
        kvp_msession_response_free(resp);
        atomic_fetch_add(f->done_calls, 1);
    }
    return NULL;
}

/* Many caller threads on one session while the leader changes under them: the old leader goes
 * silent mid-call (calls in flight to it must move on after their attempt timeout), then answers
 * "not leader" with a hint to the new one. Every call still gets its own answer, none fails. */
static void test_msession_many_threads_leader_change_mid_call(void **state)
{
    (void)state;
    enum fake_mode modes[3] = {FAKE_FOLLOW, FAKE_FOLLOW, FAKE_FOLLOW};
    fakes_start(3, modes);
    atomic_store(&F.leader, 0);
    atomic_store(&F.mute, -1);
    fakes_run();
    const char *masters[3] = {F.m[0].addr, F.m[1].addr, F.m[2].addr};
    struct kvp_msession *s = NULL;
    assert_int_equal(kvp_msession_new(&s, masters, 3, "test"), KVP_OK);
    enum { N = 12 };
    struct follower f[N];
    pthread_t t[N];
    atomic_int done_calls = 0;
    for (int i = 0; i < N; i++) {
        f[i] = (struct follower){.s = s, .done_calls = &done_calls};
        assert_int_equal(pthread_create(&t[i], NULL, follower_main, &f[i]), 0);
    }
    /* a third of the calls done: the leader (0) dies for the calls in flight, 2 takes over */
    while (atomic_load(&done_calls) < N * 20)
        usleep(1000);
    atomic_store(&F.mute, 0);
    atomic_store(&F.leader, 2);
    int at_change = atomic_load(&done_calls);
    /* the old leader comes back as a follower with a hint once the session moved on */
    while (atomic_load(&done_calls) < at_change + N)
        usleep(1000);
    atomic_store(&F.mute, -1);
    /* and the leadership moves once more, to 1, announced only by hints */
    while (atomic_load(&done_calls) < N * 45)
        usleep(1000);
    atomic_store(&F.leader, 1);
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(f[i].bad, 0);
        assert_int_equal(f[i].ok, 60);
    }
    char leader[64];
    kvp_msession_leader(s, leader, sizeof leader);
    assert_string_equal(leader, F.m[1].addr);
    assert_true(atomic_load(&F.m[2].requests) > 0);
    kvp_msession_destroy(&s);
    fakes_stop();
}

struct asker {
    struct kvp_msession *s;
    uint64_t corr;
    int replies, status;
    int32_t result;
    uint32_t type;
};

static int asker_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct asker *a = kvp_rt_state(ctx);
    if (msg->kind == KVP_RT_REPLY && msg->corr_id == a->corr) {
        a->replies++;
        a->status = msg->status;
        a->type = msg->type;
        Kvp__Response *resp = kvp_rt_msg_take(msg);
        if (resp && resp->body_case == KVP__RESPONSE__BODY_EXISTS && resp->exists->n_results == 1)
            a->result = resp->exists->results[0];
        kvp_msession_response_free(resp);
    }
    return KVP_OK;
}

static int asker_init(struct kvp_rt_ctx *ctx)
{
    struct asker *a = kvp_rt_state(ctx);
    Kvp__Request req;
    Kvp__ExistsReq ex;
    char *keys[1];
    make_exists(&req, &ex, keys);
    /* the request lives on this stack frame only: the session must have its own copy */
    return kvp_msession_request(ctx, a->s, &req, 5000, &a->corr);
}

/* From inside an actor: the call does not block it, the answer comes back as a reply message. */
static void test_msession_request_from_actor_replied_by_message(void **state)
{
    (void)state;
    enum fake_mode modes[2] = {FAKE_HINT, FAKE_OK};
    fakes_start(2, modes);
    snprintf(F.m[0].hint, sizeof F.m[0].hint, "%s", F.m[1].addr);
    fakes_run();
    const char *masters[2] = {F.m[0].addr, F.m[1].addr};
    struct kvp_msession *s = NULL;
    assert_int_equal(kvp_msession_new(&s, masters, 2, "test"), KVP_OK);
    struct asker a = {.s = s};
    struct kvp_rt_spec spec = {.name = "asker", .init = asker_init, .handle = asker_handle, .state = &a};
    struct kvp_rt_actor *act = NULL;
    assert_int_equal(kvp_rt_spawn_manual(&act, &spec, NULL), KVP_OK);
    for (int i = 0; i < 500 && a.replies == 0; i++) {
        kvp_rt_poll(act);
        usleep(10000);
    }
    assert_int_equal(a.replies, 1);
    assert_int_equal(a.status, KVP_OK);
    assert_int_equal(a.type, KVP_MSESSION_REPLY_TYPE);
    assert_int_equal(a.result, 7);
    kvp_msession_destroy(&s);
    kvp_rt_destroy(&act);
    fakes_stop();
}

static void test_msession_bad_args_invalid(void **state)
{
    (void)state;
    struct kvp_msession *s = NULL;
    const char *none[1] = {""};
    assert_int_equal(kvp_msession_new(&s, NULL, 1, "x"), KVP_ERR_INVALID);
    assert_int_equal(kvp_msession_new(&s, none, 0, "x"), KVP_ERR_INVALID);
    assert_int_equal(kvp_msession_new(&s, none, 1, "x"), KVP_ERR_INVALID);
    assert_null(s);
    /* an address ZeroMQ refuses fails the actor's init: fini frees the state, and the session
     * must not free it again (a double free aborts; the ASan stage names it) */
    const char *bad[2] = {"127.0.0.1:1", "no-port-here"};
    assert_int_equal(kvp_msession_new(&s, bad, 2, "x"), KVP_ERR_INVALID);
    assert_null(s);
    const char *one[1] = {"127.0.0.1:1"};
    assert_int_equal(kvp_msession_new(&s, one, 1, NULL), KVP_OK);
    Kvp__Response *resp = NULL;
    assert_int_equal(kvp_msession_call(s, NULL, 10, &resp), KVP_ERR_INVALID);
    kvp_msession_destroy(&s);
    kvp_msession_destroy(&s); /* NULL is fine */
    kvp_msession_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_msession_not_leader_hint_follows_to_leader),
        cmocka_unit_test(test_msession_hint_unknown_master_added),
        cmocka_unit_test(test_msession_dead_and_silent_masters_rotated),
        cmocka_unit_test(test_msession_unknown_req_id_dropped),
        cmocka_unit_test(test_msession_no_master_unavailable),
        cmocka_unit_test(test_msession_fail_fast_after_silent_timeout_until_master_answers),
        cmocka_unit_test(test_msession_fail_fast_not_while_a_master_answers_or_off),
        cmocka_unit_test(test_msession_fail_fast_when_only_not_leader_without_a_leader),
        cmocka_unit_test(test_msession_destroy_inflight_closed),
        cmocka_unit_test(test_msession_many_threads_each_own_reply),
        cmocka_unit_test(test_msession_many_threads_leader_change_mid_call),
        cmocka_unit_test(test_msession_request_from_actor_replied_by_message),
        cmocka_unit_test(test_msession_bad_args_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
