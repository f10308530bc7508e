/*
 * bench_meta_pipe.c — the pipelined driver of `kvpool-bench meta`: C callers as request streams
 * multiplexed by one thread over up to META_PIPE_SOCKETS DEALER sockets connected straight to
 * the leader. Each caller has at most one request outstanding (a put pair is PutStart, then
 * PutEnd after its reply), so the master sees C concurrent callers, as from C client processes,
 * while the bench itself spends one thread and no per-call hand-off (the way redis-benchmark -c
 * drives C connections from one event loop). No retry and no leader following: any error or
 * "not leader" answer is counted under its code; a call without an answer in 5 s is TIMEOUT.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "tools/bench/bench_internal.h"
#include "tools/bench/bench_meta_internal.h"
#include "wire/envelope.h"

#define META_PIPE_SOCKETS 8
#define META_PIPE_TIMEOUT_US 5000000ull

struct pcaller {
    uint64_t key_i;    /* next key index of this caller */
    uint64_t cur_i;    /* key of the request outstanding */
    uint64_t op_id;    /* op id of the current pair */
    uint64_t t0_us;    /* start of the current pair / get */
    uint64_t sent_us;  /* when the outstanding request went out */
    uint32_t seq;      /* sequence of the outstanding request (low 24 bits of req_id) */
    int phase;         /* 0 idle, 1 PutStart out, 2 PutEnd out, 3 GetReplicaList out */
    unsigned seed;
};

static int send_req(void *z, Kvp__Request *req)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = kvp_wire_encode_request(req, &buf, &len);
    if (rc)
        return rc;
    rc = zmq_send(z, buf, len, 0) < 0 ? KVP_ERR_IO : KVP_OK;
    free(buf);
    return rc;
}

/* Build and send caller ci's next request. */
static int issue(struct meta *m, void *z, unsigned ci, struct pcaller *c, int what, uint64_t nkeys_seen)
{
    enum { KEY_CAP = 96 };
    unsigned b = m->batch ? m->batch : 1;
    char *keys = malloc((size_t)b * KEY_CAP);
    char **kp = calloc(b, sizeof *kp);
    Kvp__PutStartItem *it = calloc(b, sizeof *it);
    Kvp__PutStartItem **itp = calloc(b, sizeof *itp);
    Kvp__PutEndItem *et = calloc(b, sizeof *et);
    Kvp__PutEndItem **etp = calloc(b, sizeof *etp);
    int rc = KVP_ERR_NOMEM;
    if (!keys || !kp || !it || !itp || !et || !etp)
        goto out;
    Kvp__Request req = KVP__REQUEST__INIT;
    c->seq = (c->seq + 1) & 0xffffffu;
    req.req_id = ((uint64_t)ci << 24) | c->seq;
    req.timeout_ms = 5000;
    Kvp__PutStartReq ps = KVP__PUT_START_REQ__INIT;
    Kvp__PutEndReq pe = KVP__PUT_END_REQ__INIT;
    Kvp__GetReplicaListReq g = KVP__GET_REPLICA_LIST_REQ__INIT;
    if (what == 0 && c->phase != 1) { /* a new pair: PutStart */
        c->cur_i = c->key_i;
        c->key_i += b;
        c->op_id = atomic_fetch_add(&m->op_seq, b); /* op ids op_id .. op_id + b - 1 */
    }
    for (unsigned j = 0; j < b; j++) {
        kp[j] = keys + (size_t)j * KEY_CAP;
        uint64_t k = c->cur_i + j;
        if (what != 0)
            k = nkeys_seen ? (uint64_t)rand_r(&c->seed) % nkeys_seen : 0;
        meta_key(kp[j], KEY_CAP, ci, k);
    }
    if (what == 0 && c->phase != 1) {
        for (unsigned j = 0; j < b; j++) {
            kvp__put_start_item__init(&it[j]);
            it[j].key = kp[j];
            it[j].size = META_OBJ_BYTES;
            it[j].replica_num = 1;
            it[j].preferred_segment = m->seg_name;
            it[j].op_id = c->op_id + j;
            it[j].client_host = (char *)"bench-meta";
            itp[j] = &it[j];
        }
        ps.n_items = b;
        ps.items = itp;
        /* The ttl kvp_put asks (its time left + 2 s margin, actors/client/batch_put.c), not the
         * master's 30 s default: see put_pairs in bench_meta.c. */
        ps.ttl_ms = req.timeout_ms + 2000u;
        req.body_case = KVP__REQUEST__BODY_PUT_START;
        req.put_start = &ps;
        c->phase = 1;
    } else if (what == 0) { /* PutStart answered: PutEnd */
        for (unsigned j = 0; j < b; j++) {
            kvp__put_end_item__init(&et[j]);
            et[j].key = kp[j];
            et[j].op_id = c->op_id + j;
            etp[j] = &et[j];
        }
        pe.n_items = b;
        pe.items = etp;
        req.body_case = KVP__REQUEST__BODY_PUT_END;
        req.put_end = &pe;
        c->phase = 2;
    } else {
        g.n_keys = b;
        g.keys = kp;
        g.client_host = (char *)"bench-meta";
        req.body_case = KVP__REQUEST__BODY_GET_REPLICAS;
        req.get_replicas = &g;
        c->phase = 3;
    }
    c->sent_us = bench_now_us();
    rc = send_req(z, &req);
out:
    free(keys);
    free(kp);
    free(it);
    free(itp);
    free(et);
    free(etp);
    return rc;
}

/* The status of a reply of b items for phase `phase`: the call status, else the first item
 * that is not OK. */
static int reply_status(const Kvp__Response *r, int phase, unsigned b)
{
    if (r->status)
        return r->status;
    if (phase == 1) {
        if (r->body_case != KVP__RESPONSE__BODY_PUT_START || r->put_start->n_results != b)
            return KVP_ERR_MALFORMED;
        for (unsigned j = 0; j < b; j++)
            if (r->put_start->results[j]->status)
                return r->put_start->results[j]->status;
        return KVP_OK;
    }
    if (phase == 2) {
        if (r->body_case != KVP__RESPONSE__BODY_PUT_END || r->put_end->n_status != b)
            return KVP_ERR_MALFORMED;
        for (unsigned j = 0; j < b; j++)
            if (r->put_end->status[j])
                return r->put_end->status[j];
        return KVP_OK;
    }
    if (r->body_case != KVP__RESPONSE__BODY_GET_REPLICAS || r->get_replicas->n_objects != b)
        return KVP_ERR_MALFORMED;
    for (unsigned j = 0; j < b; j++)
        if (r->get_replicas->objects[j]->status)
            return r->get_replicas->objects[j]->status;
    return KVP_OK;
}

double meta_run_level_pipe(struct meta *m, struct meta_pipe_state *st, unsigned callers, int what,
                           struct bench_lat *lat, struct bench_errs *errs)
{
    char leader[300];
    kvp_msession_leader(m->sess[0], leader, sizeof leader);
    if (!*leader) {
        bench_errs_add(errs, KVP_ERR_UNAVAILABLE);
        return 0;
    }
    unsigned nsock = callers < META_PIPE_SOCKETS ? callers : META_PIPE_SOCKETS;
    void *ctx = zmq_ctx_new();
    void *socks[META_PIPE_SOCKETS] = {0};
    zmq_pollitem_t items[META_PIPE_SOCKETS];
    char ep[320];
    snprintf(ep, sizeof ep, "tcp://%s", leader);
    for (unsigned i = 0; i < nsock; i++) {
        socks[i] = zmq_socket(ctx, ZMQ_DEALER);
        int zero = 0, hwm = 0;
        zmq_setsockopt(socks[i], ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(socks[i], ZMQ_SNDHWM, &hwm, sizeof hwm);
        zmq_setsockopt(socks[i], ZMQ_RCVHWM, &hwm, sizeof hwm);
        zmq_connect(socks[i], ep);
        items[i] = (zmq_pollitem_t){.socket = socks[i], .events = ZMQ_POLLIN};
    }
    struct pcaller *cs = calloc(callers, sizeof *cs);
    uint64_t ok = 0;
    uint64_t t0 = bench_now_us();
    uint64_t dl = t0 + (uint64_t)(m->seconds * 1e6);
    for (unsigned i = 0; i < callers; i++) {
        cs[i].key_i = st->nkeys_seen[i];
        cs[i].seed = 777u + i;
        cs[i].t0_us = bench_now_us();
        int rc = issue(m, socks[i % nsock], i, &cs[i], what, st->nkeys_seen[i]);
        if (rc)
            bench_errs_add(errs, rc);
    }
    unsigned outstanding = callers;
    while (outstanding > 0) {
        int n = zmq_poll(items, (int)nsock, 100);
        uint64_t now = bench_now_us();
        if (n < 0 && errno != EINTR)
            break;
        for (unsigned si = 0; si < nsock; si++) {
            if (!(items[si].revents & ZMQ_POLLIN))
                continue;
            for (;;) {
                zmq_msg_t msg;
                zmq_msg_init(&msg);
                if (zmq_msg_recv(&msg, socks[si], ZMQ_DONTWAIT) < 0) {
                    zmq_msg_close(&msg);
                    break;
                }
                Kvp__Response *r = NULL;
                int drc = kvp_wire_decode_response(zmq_msg_data(&msg), zmq_msg_size(&msg), &r);
                zmq_msg_close(&msg);
                if (drc) {
                    bench_errs_add(errs, drc);
                    continue;
                }
                unsigned ci = (unsigned)(r->req_id >> 24);
                if (ci >= callers || (r->req_id & 0xffffffu) != cs[ci].seq || cs[ci].phase == 0) {
                    kvp__response__free_unpacked(r, NULL);
                    continue; /* a late answer to a timed-out request */
                }
                struct pcaller *c = &cs[ci];
                int rc = reply_status(r, c->phase, m->batch ? m->batch : 1);
                kvp__response__free_unpacked(r, NULL);
                now = bench_now_us();
                bool pair_half = (c->phase == 1 && rc == 0);
                if (!pair_half) {
                    bench_lat_add(lat, now - c->t0_us);
                    if (rc)
                        bench_errs_add(errs, rc);
                    else
                        ok += m->batch ? m->batch : 1;
                    c->phase = 0;
                    if (now >= dl) {
                        outstanding--;
                        continue;
                    }
                    c->t0_us = now;
                }
                if ((rc = issue(m, socks[si], ci, c, what, st->nkeys_seen[ci])) != 0) {
                    bench_errs_add(errs, rc);
                    c->phase = 0;
                    outstanding--;
                }
            }
        }
        for (unsigned i = 0; i < callers; i++) { /* unanswered requests */
            struct pcaller *c = &cs[i];
            if (c->phase != 0 && now > c->sent_us + META_PIPE_TIMEOUT_US) {
                bench_errs_add(errs, KVP_ERR_TIMEOUT);
                bench_lat_add(lat, now - c->t0_us);
                c->phase = 0;
                if (now >= dl) {
                    outstanding--;
                } else {
                    c->t0_us = now;
                    if (issue(m, socks[i % nsock], i, c, what, st->nkeys_seen[i]) != 0) {
                        c->phase = 0;
                        outstanding--;
                    }
                }
            }
        }
    }
    double secs = (double)(bench_now_us() - t0) / 1e6;
    if (what == 0)
        for (unsigned i = 0; i < callers; i++)
            st->nkeys_seen[i] = cs[i].key_i;
    free(cs);
    for (unsigned i = 0; i < nsock; i++)
        zmq_close(socks[i]);
    zmq_ctx_term(ctx);
    bench_lat_sort(lat);
    return secs > 0 ? (double)ok / secs : 0;
}
