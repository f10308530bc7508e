/*
 * seg_fake_master.h — a scripted fake master for the segment tests: a ZeroMQ ROUTER on an
 * ephemeral loopback port answering Mount/Heartbeat/Unmount/Drain/ClusterStatus from a thread.
 */
#ifndef KVP_TEST_SEG_FAKE_MASTER_H
#define KVP_TEST_SEG_FAKE_MASTER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "kvpool.h"
#include "wire/envelope.h"

struct fake_master {
    void *zctx, *router;
    char addr[64];
    pthread_t thread;
    atomic_bool stop;
    _Atomic uint32_t next_id;
    _Atomic uint32_t lost_id;    /* heartbeats for this id answer NOT_FOUND */
    _Atomic int mounts, heartbeats, unmounts, drains, statuses;
    _Atomic uint32_t unmounted_id, drained_id;
    _Atomic int64_t objects;     /* reported for the drained segment; -1 decrements stop */
    atomic_bool objects_stuck;
    char mount_name[128], mount_endpoint[128]; /* written before `mounts` is incremented */
    uint64_t mount_pid;
    /* FenceWriter (docs/rdma.md): fw_seq != 0 is asked in every HeartbeatResp until a heartbeat
     * answers it with Fenced; on_fenced (when set) runs on the fake master's thread as the first
     * heartbeat carrying a new Fenced.seq arrives, before it is answered. */
    _Atomic uint64_t fw_seq;
    _Atomic uint64_t fenced_seq;
    _Atomic uint32_t fenced_qps;
    _Atomic int rdma_beats; /* heartbeats that said rdma_writers */
    _Atomic int sel_beats;  /* heartbeats that said fence_selectors (and rdma_writers) */
    /* fw_sel_mask != 0: the FenceWriter names one writer family (writers = {fw_sel_id,
     * fw_sel_mask}, client_id 0: the per-writer fence) instead of every writer */
    _Atomic uint64_t fw_sel_id, fw_sel_mask;
    void (*on_fenced)(void *arg);
    void *on_fenced_arg;
    /* drop_mount_calls > 0: that many MountSegment calls (every copy the session resends of one
     * call, req_id >> 8) go unanswered, as a master whose answer comes after the try's window;
     * their mount_nonce and that of the mount answered next are kept */
    _Atomic int drop_mount_calls;
    uint64_t drop_call; /* the fake master's thread only */
    _Atomic uint64_t dropped_nonce, answered_nonce;
    _Atomic int dropped_calls;
    /* on_heartbeat (set by fm_start_hb) runs on the fake master's thread for every heartbeat
     * answered OK, once the answer's other fields are set: it may read hb (verified) and fill hr (verify,
     * with storage of its own that stays valid after it returns: the answer is encoded then). */
    void (*on_heartbeat)(void *arg, const Kvp__HeartbeatReq *hb, Kvp__HeartbeatResp *hr);
    void *on_heartbeat_arg;
};

static inline void fm_reply(struct fake_master *fm, zmq_msg_t *id, Kvp__Request *req)
{
    Kvp__Response resp;
    kvp__response__init(&resp);
    resp.req_id = req->req_id;
    Kvp__MountSegmentResp mr;
    Kvp__HeartbeatResp hr;
    Kvp__Empty em;
    Kvp__DrainSegmentResp dr;
    Kvp__ClusterStatusResp cr;
    Kvp__FenceWriter fw;
    Kvp__WriterSelector ws, *wsp[1] = {&ws};
    char json[256];
    switch (req->body_case) {
    case KVP__REQUEST__BODY_MOUNT:
        if ((fm->drop_call && req->req_id >> 8 == fm->drop_call) || atomic_load(&fm->drop_mount_calls) > 0) {
            if (req->req_id >> 8 != fm->drop_call) {
                fm->drop_call = req->req_id >> 8;
                atomic_fetch_sub(&fm->drop_mount_calls, 1);
                atomic_store(&fm->dropped_nonce, req->mount->mount_nonce);
                atomic_fetch_add(&fm->dropped_calls, 1);
            }
            return; /* no answer */
        }
        atomic_store(&fm->answered_nonce, req->mount->mount_nonce);
        kvp__mount_segment_resp__init(&mr);
        mr.segment_id = atomic_fetch_add(&fm->next_id, 1);
        snprintf(fm->mount_name, sizeof fm->mount_name, "%s", req->mount->name);
        snprintf(fm->mount_endpoint, sizeof fm->mount_endpoint, "%s", req->mount->endpoint);
        fm->mount_pid = req->mount->owner_pid;
        atomic_fetch_add(&fm->mounts, 1);
        resp.body_case = KVP__RESPONSE__BODY_MOUNT;
        resp.mount = &mr;
        break;
    case KVP__REQUEST__BODY_HEARTBEAT:
        atomic_fetch_add(&fm->heartbeats, 1);
        if (req->heartbeat->segment_id == atomic_load(&fm->lost_id)) {
            resp.status = KVP_ERR_NOT_FOUND;
            break;
        }
        kvp__heartbeat_resp__init(&hr);
        resp.body_case = KVP__RESPONSE__BODY_HEARTBEAT;
        resp.heartbeat = &hr;
        if (req->heartbeat->rdma_writers)
            atomic_fetch_add(&fm->rdma_beats, 1);
        if (req->heartbeat->rdma_writers && req->heartbeat->fence_selectors)
            atomic_fetch_add(&fm->sel_beats, 1);
        if (req->heartbeat->fenced && req->heartbeat->fenced->seq &&
            req->heartbeat->fenced->seq != atomic_load(&fm->fenced_seq)) {
            if (fm->on_fenced)
                fm->on_fenced(fm->on_fenced_arg);
            atomic_store(&fm->fenced_qps, req->heartbeat->fenced->qps_fenced);
            atomic_store(&fm->fenced_seq, req->heartbeat->fenced->seq);
        }
        if (atomic_load(&fm->fw_seq) && atomic_load(&fm->fw_seq) != atomic_load(&fm->fenced_seq)) {
            kvp__fence_writer__init(&fw);
            fw.seq = atomic_load(&fm->fw_seq); /* client_id 0, generation 0: every writer */
            if (atomic_load(&fm->fw_sel_mask)) { /* ... or the writers this family selects */
                kvp__writer_selector__init(&ws);
                ws.client_id = atomic_load(&fm->fw_sel_id);
                ws.mask = atomic_load(&fm->fw_sel_mask);
                fw.n_writers = 1;
                fw.writers = wsp;
            }
            hr.fence_writer = &fw;
        }
        if (fm->on_heartbeat)
            fm->on_heartbeat(fm->on_heartbeat_arg, req->heartbeat, &hr);
        break;
    case KVP__REQUEST__BODY_UNMOUNT:
        atomic_store(&fm->unmounted_id, req->unmount->segment_id);
        atomic_fetch_add(&fm->unmounts, 1);
        kvp__empty__init(&em);
        resp.body_case = KVP__RESPONSE__BODY_EMPTY;
        resp.empty = &em;
        break;
    case KVP__REQUEST__BODY_DRAIN:
        atomic_store(&fm->drained_id, req->drain->segment_id);
        atomic_fetch_add(&fm->drains, 1);
        kvp__drain_segment_resp__init(&dr);
        dr.segment_id = req->drain->segment_id;
        resp.body_case = KVP__RESPONSE__BODY_DRAIN;
        resp.drain = &dr;
        break;
    case KVP__REQUEST__BODY_CLUSTER_STATUS: {
        atomic_fetch_add(&fm->statuses, 1);
        int64_t n = atomic_load(&fm->objects);
        if (n > 0 && !atomic_load(&fm->objects_stuck))
            atomic_fetch_sub(&fm->objects, 1);
        snprintf(json, sizeof json,
                 "{\"segments\":[{\"id\":999,\"objects\":5},{\"id\":%u,\"name\":\"x\",\"objects\":%lld}],"
                 "\"objects\":%lld}",
                 atomic_load(&fm->drained_id), (long long)n, (long long)n);
        kvp__cluster_status_resp__init(&cr);
        cr.json = json;
        resp.body_case = KVP__RESPONSE__BODY_CLUSTER_STATUS;
        resp.cluster_status = &cr;
        break;
    }
    default:
        resp.status = KVP_ERR_INVALID;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    if (kvp_wire_encode_response(&resp, &buf, &len) != KVP_OK)
        return;
    zmq_msg_send(id, fm->router, ZMQ_SNDMORE);
    zmq_send(fm->router, buf, len, 0);
    free(buf);
}

static inline void *fm_main(void *arg)
{
    struct fake_master *fm = arg;
    while (!atomic_load(&fm->stop)) {
        zmq_pollitem_t it = {.socket = fm->router, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 20) <= 0)
            continue;
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&id, fm->router, 0) >= 0 && zmq_msg_recv(&body, fm->router, 0) >= 0) {
            Kvp__Request *req = NULL;
            if (kvp_wire_decode_request(zmq_msg_data(&body), zmq_msg_size(&body), &req) == KVP_OK) {
                fm_reply(fm, &id, req);
                kvp__request__free_unpacked(req, NULL);
            }
        }
        zmq_msg_close(&id);
        zmq_msg_close(&body);
    }
    return NULL;
}

/* fm_start with on_heartbeat (and its arg) set before the fake master's thread starts (it reads
 * them on every heartbeat without a lock). */
static inline int fm_start_hb(struct fake_master *fm,
                              void (*on_heartbeat)(void *, const Kvp__HeartbeatReq *, Kvp__HeartbeatResp *),
                              void *arg)
{
    memset(fm, 0, sizeof *fm);
    fm->on_heartbeat = on_heartbeat;
    fm->on_heartbeat_arg = arg;
    atomic_store(&fm->next_id, 1);
    fm->zctx = zmq_ctx_new();
    fm->router = zmq_socket(fm->zctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(fm->router, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(fm->router, "tcp://127.0.0.1:*") != 0)
        return -1;
    char ep[128];
    size_t l = sizeof ep;
    zmq_getsockopt(fm->router, ZMQ_LAST_ENDPOINT, ep, &l);
    snprintf(fm->addr, sizeof fm->addr, "%s", ep + 6); /* strip tcp:// */
    return pthread_create(&fm->thread, NULL, fm_main, fm);
}

static inline int fm_start(struct fake_master *fm)
{
    return fm_start_hb(fm, NULL, NULL);
}

static inline void fm_stop(struct fake_master *fm)
{
    atomic_store(&fm->stop, true);
    pthread_join(fm->thread, NULL);
    zmq_close(fm->router);
    zmq_ctx_term(fm->zctx);
}

#endif
