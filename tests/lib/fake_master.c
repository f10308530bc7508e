/* fake_master.c — see fake_master.h. */
#include "tests/lib/fake_master.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <zmq.h>

#include "actors/session/msession.h"
#include "runtime/clock.h"
#include "wire/envelope.h"

static Kvp__Response *fake_handle(struct kvp_fake_master *m, const Kvp__Request *req)
{
    Kvp__Response *resp = NULL;
    Kvp__Command cmd;
    kvp__command__init(&cmd);
    cmd.now_wall_ms = kvp_clock_wall_ms();
    cmd.term = 1;
    if (req->body_case == KVP__REQUEST__BODY_PUT_START && req->put_start) {
        size_t n = req->put_start->n_items, seen = atomic_load(&m->max_put_start_items);
        while (n > seen && !atomic_compare_exchange_weak(&m->max_put_start_items, &seen, n))
            ;
    }
    if (req->body_case == KVP__REQUEST__BODY_GET_REPLICAS && req->get_replicas) {
        size_t n = req->get_replicas->n_keys, seen = atomic_load(&m->max_get_replicas_keys);
        while (n > seen && !atomic_compare_exchange_weak(&m->max_get_replicas_keys, &seen, n))
            ;
    }
    if (req->body_case == KVP__REQUEST__BODY_PUT_REVOKE && req->put_revoke) {
        atomic_store(&m->revoke_writer_id, req->put_revoke->writer_id);
        atomic_store(&m->revoke_writer_mask, req->put_revoke->writer_mask);
    }
    switch (req->body_case) {
#define CMD(REQ, FIELD)                                                                            \
    case KVP__REQUEST__BODY_##REQ:                                                                 \
        cmd.body_case = KVP__COMMAND__BODY_##REQ;                                                  \
        cmd.FIELD = req->FIELD;                                                                    \
        pthread_mutex_lock(&m->mu);                                                                \
        kvp_master_fsm_apply(m->fsm, &cmd, &resp);                                                 \
        pthread_mutex_unlock(&m->mu);                                                              \
        break;
        CMD(MOUNT, mount)
        CMD(UNMOUNT, unmount)
        CMD(PUT_START, put_start)
        CMD(PUT_END, put_end)
        CMD(PUT_REVOKE, put_revoke)
        CMD(REMOVE, remove)
#undef CMD
    case KVP__REQUEST__BODY_GET_REPLICAS:
    case KVP__REQUEST__BODY_EXISTS:
    case KVP__REQUEST__BODY_GET_SIZE:
        pthread_mutex_lock(&m->mu);
        kvp_master_fsm_query(m->fsm, req, &resp);
        pthread_mutex_unlock(&m->mu);
        if (resp && resp->body_case == KVP__RESPONSE__BODY_GET_REPLICAS)
            for (size_t i = 0; i < resp->get_replicas->n_objects; i++)
                resp->get_replicas->objects[i]->lease_ttl_ms = 5000;
        break;
    case KVP__REQUEST__BODY_REPORT_UNREACHABLE:
        atomic_fetch_add(&m->unreachable_reports, 1);
        /* fall through */
    default:
        resp = calloc(1, sizeof *resp);
        kvp__response__init(resp);
        resp->body_case = KVP__RESPONSE__BODY_EMPTY;
        resp->empty = calloc(1, sizeof *resp->empty);
        kvp__empty__init(resp->empty);
        break;
    }
    return resp;
}

static void *fake_main(void *arg)
{
    struct kvp_fake_master *m = arg;
    while (!atomic_load(&m->stop)) {
        zmq_pollitem_t it = {.socket = m->router, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 20) <= 0)
            continue;
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        zmq_msg_recv(&id, m->router, 0);
        zmq_msg_recv(&body, m->router, 0);
        Kvp__Request *req = NULL;
        if (kvp_wire_decode_request(zmq_msg_data(&body), zmq_msg_size(&body), &req) == KVP_OK) {
            Kvp__Response *resp = fake_handle(m, req);
            if (resp) {
                resp->req_id = req->req_id;
                uint8_t *buf;
                size_t len;
                if (kvp_wire_encode_response(resp, &buf, &len) == KVP_OK) {
                    zmq_send(m->router, zmq_msg_data(&id), zmq_msg_size(&id), ZMQ_SNDMORE);
                    zmq_send(m->router, buf, len, 0);
                    free(buf);
                }
                protobuf_c_message_free_unpacked(&resp->base, NULL);
            }
            kvp__request__free_unpacked(req, NULL);
        }
        zmq_msg_close(&id);
        zmq_msg_close(&body);
    }
    return NULL;
}

int kvp_fake_master_start(struct kvp_fake_master *m, const struct kvp_master_fsm_params *p)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    if (kvp_master_fsm_new(&m->fsm, p) != KVP_OK)
        return -1;
    m->ctx = zmq_ctx_new();
    m->router = zmq_socket(m->ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(m->router, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(m->router, "tcp://127.0.0.1:*") != 0)
        return -1;
    char ep[128];
    size_t len = sizeof ep;
    zmq_getsockopt(m->router, ZMQ_LAST_ENDPOINT, ep, &len);
    snprintf(m->addr, sizeof m->addr, "%s", ep + 6);
    if (pthread_create(&m->thread, NULL, fake_main, m) != 0)
        return -1;
    return 0;
}

void kvp_fake_master_stop(struct kvp_fake_master *m)
{
    atomic_store(&m->stop, true);
    pthread_join(m->thread, NULL);
    zmq_close(m->router);
    zmq_ctx_term(m->ctx);
    kvp_master_fsm_destroy(&m->fsm);
    pthread_mutex_destroy(&m->mu);
}

uint32_t kvp_fake_master_mount(struct kvp_fake_master *m, const char *name, const char *endpoint,
                               uint64_t size)
{
    const char *masters[1] = {m->addr};
    struct kvp_msession *ms = NULL;
    assert_int_equal(kvp_msession_new(&ms, masters, 1, "test-seg"), KVP_OK);
    Kvp__Request req;
    Kvp__MountSegmentReq mr;
    kvp__request__init(&req);
    kvp__mount_segment_req__init(&mr);
    mr.name = (char *)name;
    mr.host = "127.0.0.1";
    mr.endpoint = (char *)endpoint;
    mr.size = size;
    mr.owner_pid = 1; /* not this process: every transfer goes over TCP */
    req.body_case = KVP__REQUEST__BODY_MOUNT;
    req.mount = &mr;
    Kvp__Response *resp = NULL;
    assert_int_equal(kvp_msession_call(ms, &req, 3000, &resp), KVP_OK);
    assert_int_equal(resp->status, KVP_OK);
    uint32_t id = resp->mount->segment_id;
    kvp_msession_response_free(resp);
    kvp_msession_destroy(&ms);
    return id;
}

kvp_client *kvp_fake_master_open_client(struct kvp_fake_master *m, uint32_t timeout_ms)
{
    kvp_config *cfg = NULL;
    assert_int_equal(kvp_config_new(&cfg), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "master_server_address", m->addr), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "auth", "none"), KVP_OK); /* the fake master speaks ZeroMQ's NULL mechanism */
    char t[32];
    snprintf(t, sizeof t, "%ums", timeout_ms);
    assert_int_equal(kvp_config_set(cfg, "transfer_timeout", t), KVP_OK);
    kvp_client *c = NULL;
    assert_int_equal(kvp_client_open(cfg, &c), KVP_OK);
    kvp_config_destroy(&cfg);
    return c;
}

Kvp__Response *kvp_fake_master_get_replicas(struct kvp_fake_master *m, const char *key)
{
    Kvp__Request req;
    Kvp__GetReplicaListReq gr;
    kvp__request__init(&req);
    kvp__get_replica_list_req__init(&gr);
    char *keys[1] = {(char *)key};
    gr.n_keys = 1;
    gr.keys = keys;
    gr.client_host = "127.0.0.1";
    req.body_case = KVP__REQUEST__BODY_GET_REPLICAS;
    req.get_replicas = &gr;
    Kvp__Response *resp = NULL;
    pthread_mutex_lock(&m->mu);
    kvp_master_fsm_query(m->fsm, &req, &resp);
    pthread_mutex_unlock(&m->mu);
    return resp;
}
