/*
 * test_master_actor.c — the master service as a runtime actor (service_actor.c), in process:
 * one single-member service serves on its ROUTER from its actor while the test thread waits in
 * kvp_master_service_run; requests go through the dispatch table (a known one answered, an
 * unknown body answered INVALID); kvp_master_service_request_stop from another thread (a message
 * to the sink run() waits on) ends run() with KVP_OK, also when it was asked before run() began.
 * No timing is asserted: waits are bounded only so that a hang fails instead of blocking.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <czmq.h>

#include "actors/master/service/service.h"
#include "config/config.h"
#include "kvpool.h"
#include "tests/lib/http_get.h"
#include "wire/envelope.h"

struct runner {
    struct kvp_master_service *svc;
    int rc;
};

static void *run_thread(void *arg)
{
    struct runner *r = arg;
    r->rc = kvp_master_service_run(r->svc);
    return NULL;
}

static void make_cfg(struct kvp_cfg_master *cfg, char *dir, size_t cap, uint32_t *ctrl_port)
{
    kvp_cfg_defaults(KVP_CFG_MASTER, cfg);
    snprintf(dir, cap, "/tmp/kvp-master-actor-XXXXXX");
    assert_non_null(mkdtemp(dir));
    *ctrl_port = kvp_test_free_port();
    uint32_t raft_port = kvp_test_free_port();
    while (raft_port == *ctrl_port)
        raft_port = kvp_test_free_port();
    cfg->id = 1;
    snprintf(cfg->listen, sizeof cfg->listen, "127.0.0.1:%u", *ctrl_port);
    snprintf(cfg->raft_address, sizeof cfg->raft_address, "127.0.0.1:%u", raft_port);
    snprintf(cfg->data_dir, sizeof cfg->data_dir, "%s", dir);
    cfg->members[0] = '\0';
    snprintf(cfg->auth, sizeof cfg->auth, "none"); /* CURVE is covered by test_auth_cluster */
}

static void rm_dir(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* One request on a DEALER; the decoded response (NULL when none came within 2 s). */
static Kvp__Response *ask(zsock_t *d, Kvp__Request *req)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(kvp_wire_encode_request(req, &buf, &len), KVP_OK);
    zframe_t *f = zframe_new(buf, len);
    free(buf);
    assert_int_equal(zframe_send(&f, d, 0), 0);
    zpoller_t *p = zpoller_new(d, NULL);
    void *ready = zpoller_wait(p, 2000);
    zpoller_destroy(&p);
    if (!ready)
        return NULL;
    zframe_t *in = zframe_recv(d);
    Kvp__Response *resp = NULL;
    int rc = kvp_wire_decode_response(zframe_data(in), zframe_size(in), &resp);
    zframe_destroy(&in);
    return rc == KVP_OK ? resp : NULL;
}

static void test_actor_serves_and_stops_on_request(void **state)
{
    (void)state;
    struct kvp_cfg_master cfg;
    char dir[64];
    uint32_t port;
    make_cfg(&cfg, dir, sizeof dir, &port);
    struct runner r = {0};
    assert_int_equal(kvp_master_service_new(&r.svc, &cfg), KVP_OK);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_thread, &r), 0);

    zsock_t *d = zsock_new_dealer(NULL);
    assert_non_null(d);
    zsock_set_linger(d, 0);
    assert_int_equal(zsock_connect(d, "tcp://127.0.0.1:%u", port), 0);
    /* Members through the dispatch table, once this single member leads (bounded: 30 tries). */
    Kvp__Response *resp = NULL;
    for (int i = 0; i < 30; i++) {
        Kvp__Request req = KVP__REQUEST__INIT;
        Kvp__MembersReq mr = KVP__MEMBERS_REQ__INIT;
        req.req_id = 100 + (uint64_t)i;
        req.body_case = KVP__REQUEST__BODY_MEMBERS;
        req.members = &mr;
        resp = ask(d, &req);
        if (resp && resp->status == KVP_OK)
            break;
        if (resp)
            kvp__response__free_unpacked(resp, NULL);
        resp = NULL;
        usleep(100 * 1000);
    }
    assert_non_null(resp);
    assert_int_equal(resp->body_case, KVP__RESPONSE__BODY_MEMBERS);
    assert_int_equal(resp->members->n_members, 1);
    assert_int_equal(resp->members->members[0]->id, 1);
    kvp__response__free_unpacked(resp, NULL);

    /* A body case with no entry in the table (an internal query): INVALID, and it keeps serving. */
    Kvp__Request bad = KVP__REQUEST__INIT;
    Kvp__RepairScanReq rs = KVP__REPAIR_SCAN_REQ__INIT;
    bad.req_id = 7;
    bad.body_case = KVP__REQUEST__BODY_REPAIR_SCAN;
    bad.repair_scan = &rs;
    resp = ask(d, &bad);
    assert_non_null(resp);
    assert_int_equal(resp->req_id, 7);
    assert_int_equal(resp->status, KVP_ERR_INVALID);
    kvp__response__free_unpacked(resp, NULL);
    zsock_destroy(&d);

    kvp_master_service_request_stop(r.svc); /* from this thread: a message to run()'s sink */
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(r.rc, KVP_OK);
    kvp_master_service_destroy(&r.svc);
    assert_null(r.svc);
    rm_dir(dir);
}

static void test_stop_asked_before_run(void **state)
{
    (void)state;
    struct kvp_cfg_master cfg;
    char dir[64];
    uint32_t port;
    make_cfg(&cfg, dir, sizeof dir, &port);
    struct kvp_master_service *svc = NULL;
    assert_int_equal(kvp_master_service_new(&svc, &cfg), KVP_OK);
    kvp_master_service_request_stop(svc);
    assert_int_equal(kvp_master_service_run(svc), KVP_OK); /* returns: the STOP was queued */
    kvp_master_service_destroy(&svc);
    rm_dir(dir);
}

int main(void)
{
    zsys_handler_set(NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_actor_serves_and_stops_on_request),
        cmocka_unit_test(test_stop_asked_before_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
