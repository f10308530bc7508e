/*
 * service.c — the master service's state and plumbing: members list, ROUTER, raftlog start with
 * the FSM wired in, frame decoding, replies, raftlog events, the leadership tick. The actor that
 * runs them (timers, watched sockets, the prober, run/stop) is in service_actor.c.
 * Request handlers live in service_rpc.c, soft state and timers in service_soft.c, the status
 * document and leadership tracking in service_status.c.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "actors/master/service/service_evict.h"
#include "actors/master/service/service_metrics.h"
#include "actors/master/service/service_repair.h"
#include "actors/master/service/service_state.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "runtime/proc.h"
#include "wire/envelope.h"

/* The request arena's block (service_state.h req_arena). Decoded, a one-key PutStart takes 240
 * bytes of it and one of 256 keys 46 KiB (24-byte keys); a larger request takes the rest from
 * malloc until its reset. */
#define SVC_REQ_ARENA_BYTES (64u << 10)

uint64_t svc_now_ms(void)
{
    return kvp_clock_now_ms();
}

/* ------------------------------------------------------------------ members */

static int parse_hostport(const char *s, size_t n, char *out, size_t cap)
{
    if (n == 0 || n >= cap)
        return KVP_ERR_INVALID;
    const char *colon = memrchr(s, ':', n);
    if (!colon || colon == s || colon == s + n - 1)
        return KVP_ERR_INVALID;
    for (const char *p = colon + 1; p < s + n; p++)
        if (!isdigit((unsigned char)*p))
            return KVP_ERR_INVALID;
    memcpy(out, s, n);
    out[n] = '\0';
    return KVP_OK;
}

int kvp_master_members_parse(const char *s, struct kvp_master_member *out, int cap)
{
    if (!s || !out || cap <= 0)
        return KVP_ERR_INVALID;
    int n = 0;
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (!*p)
            break;
        const char *end = p;
        while (*end && *end != ',')
            end++;
        const char *e = end;
        while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        const char *at1 = memchr(p, '@', (size_t)(e - p));
        const char *at2 = at1 ? memchr(at1 + 1, '@', (size_t)(e - at1 - 1)) : NULL;
        if (!at1 || !at2 || n >= cap)
            return KVP_ERR_INVALID;
        char idbuf[32];
        size_t idn = (size_t)(at1 - p);
        if (idn == 0 || idn >= sizeof idbuf)
            return KVP_ERR_INVALID;
        memcpy(idbuf, p, idn);
        idbuf[idn] = '\0';
        char *idend = NULL;
        errno = 0;
        unsigned long long id = strtoull(idbuf, &idend, 10);
        if (errno || *idend || id == 0 || idbuf[0] == '-')
            return KVP_ERR_INVALID;
        struct kvp_master_member *m = &out[n];
        memset(m, 0, sizeof *m);
        m->id = id;
        if (parse_hostport(at1 + 1, (size_t)(at2 - at1 - 1), m->address, sizeof m->address) ||
            parse_hostport(at2 + 1, (size_t)(e - at2 - 1), m->raft_address, sizeof m->raft_address))
            return KVP_ERR_INVALID;
        for (int i = 0; i < n; i++)
            if (out[i].id == id)
                return KVP_ERR_INVALID;
        n++;
        p = end;
    }
    return n;
}

const char *svc_member_address(const struct kvp_master_service *s, uint64_t id)
{
    for (int i = 0; i < s->n_members; i++)
        if (s->members[i].id == id)
            return s->members[i].address;
    return "";
}

/* ------------------------------------------------------------------ replies */

void svc_reply(struct kvp_master_service *s, zframe_t *identity, uint64_t req_id, Kvp__Response *resp)
{
    if (!identity)
        return;
    svc_metrics_on_reply(s, resp);
    resp->req_id = req_id;
    resp->feature_level = KVP_FEATURE_LEVEL;
    /* Encoded straight into the message libzmq sends (no buffer to copy from), the identity
     * sent from its frame's bytes (libzmq keeps an identity this short inside the message). */
    size_t len = 0;
    int rc = kvp_wire_encoded_size(KVP_MSG_RESPONSE, &resp->base, &len);
    zmq_msg_t body;
    bool have_body = false;
    if (rc == KVP_OK) {
        if (zmq_msg_init_size(&body, len) != 0)
            rc = KVP_ERR_NOMEM;
        else {
            have_body = true;
            rc = kvp_wire_encode_into(KVP_MSG_RESPONSE, &resp->base, zmq_msg_data(&body), len);
        }
    }
    if (rc != KVP_OK) {
        if (have_body)
            zmq_msg_close(&body);
        kvp_log_error(s->actor, "req %llu: encode reply: %s", (unsigned long long)req_id, kvp_strerror(rc));
        /* Answer with the code rather than not at all (the caller would wait out its timeout
         * and retry the same request on every master). A bare status always encodes. */
        if (resp->body_case != KVP__RESPONSE__BODY_EMPTY)
            svc_reply_status(s, identity, req_id, rc,
                             rc == KVP_ERR_TOO_LARGE ? "reply over the message limit: ask for fewer keys"
                                                     : "reply could not be encoded");
        return;
    }
    void *router = zsock_resolve(s->router);
    if (zmq_send(router, zframe_data(identity), zframe_size(identity), ZMQ_SNDMORE) < 0 ||
        zmq_msg_send(&body, router, 0) < 0) {
        kvp_log_warn(s->actor, "req %llu: reply not sent: %s", (unsigned long long)req_id,
                     zmq_strerror(zmq_errno()));
        zmq_msg_close(&body); /* a message not sent is still ours (a no-op on an empty one) */
    }
}

void svc_reply_status(struct kvp_master_service *s, zframe_t *identity, uint64_t req_id, int status,
                      const char *error)
{
    Kvp__Response resp = KVP__RESPONSE__INIT;
    Kvp__Empty empty = KVP__EMPTY__INIT;
    resp.status = status;
    resp.error = (char *)(error ? error : "");
    if (status == KVP_ERR_NOT_LEADER) {
        const char *hint = s->is_leader ? "" : svc_member_address(s, s->leader_id);
        resp.leader_hint = (char *)hint;
    }
    resp.body_case = KVP__RESPONSE__BODY_EMPTY;
    resp.empty = &empty;
    svc_reply(s, identity, req_id, &resp);
}

void svc_reply_empty(struct kvp_master_service *s, zframe_t *identity, uint64_t req_id)
{
    svc_reply_status(s, identity, req_id, KVP_OK, NULL);
}

/* ------------------------------------------------------------------ pending */

struct svc_pending *svc_pending_new(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req)
{
    struct svc_pending *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->corr = s->next_corr++;
    p->created_ms = svc_now_ms();
    p->recv_us = identity ? s->cur_recv_us : 0;
    if (identity) {
        p->identity = zframe_dup(identity);
        if (!p->identity) {
            free(p);
            return NULL;
        }
    }
    if (req) {
        p->req_id = req->req_id;
        p->body_case = (int)req->body_case;
        if (req->timeout_ms)
            p->deadline_ms = svc_now_ms() + req->timeout_ms;
    }
    return p;
}

void svc_pending_free(struct svc_pending *p)
{
    if (!p)
        return;
    zframe_destroy(&p->identity);
    free(p->key_hashes);
    free(p->seal_ops);
    free(p->remove_status);
    svc_verify_job_drop(p->verify_job);
    free(p);
}

static int pending_track(struct kvp_master_service *s, struct svc_pending *p)
{
    return svc_map_put(&s->pending, p->corr, (uint64_t)(uintptr_t)p);
}

static void pending_fail(struct kvp_master_service *s, struct svc_pending *p, int rc, const char *what)
{
    uint64_t dummy;
    svc_map_del(&s->pending, p->corr, &dummy);
    if (p->identity)
        svc_reply_status(s, p->identity, p->req_id, rc, what);
    else
        svc_on_result(s, p, 0, rc, NULL, 0);
    svc_pending_free(p);
}

void svc_command_set(Kvp__Command *c, Kvp__Command__BodyCase bc, void *body)
{
    /* protobuf-c numbers a oneof's cases by field number: the field is the body case's. */
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(&kvp__command__descriptor,
                                                                                 (unsigned)bc);
    if (!f || !(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) || f->type != PROTOBUF_C_TYPE_MESSAGE) {
        c->body_case = KVP__COMMAND__BODY__NOT_SET;
        return;
    }
    *(void **)((char *)c + f->offset) = body;
    *(uint32_t *)((char *)c + f->quantifier_offset) = (uint32_t)bc;
}

void svc_submit_internal(struct kvp_master_service *s, int kind, Kvp__Command__BodyCase bc, void *body,
                         uint32_t segment_id)
{
    struct svc_pending *p = svc_pending_new(s, NULL, NULL);
    if (!p)
        return;
    p->internal = kind;
    p->segment_id = segment_id;
    Kvp__Command cmd = KVP__COMMAND__INIT;
    svc_command_set(&cmd, bc, body);
    svc_submit(s, p, &cmd); /* on error its result runs with the error */
}

/* A command's apply cost for raftlog's entry bound (kvp_raftlog_submit_cost): the items of a
 * batch command, 1 for the rest. The per-item apply work of these is of one order (a lookup, an
 * insert or a placement); a whole-table command (RemoveAll, a lost segment) is 1 and goes alone
 * or with few others by bytes. */
static uint32_t svc_command_cost(const Kvp__Command *c)
{
    size_t n = 1;
    switch (c->body_case) {
    case KVP__COMMAND__BODY_PUT_START: n = c->put_start ? c->put_start->n_items : 1; break;
    case KVP__COMMAND__BODY_PUT_END: n = c->put_end ? c->put_end->n_items : 1; break;
    case KVP__COMMAND__BODY_PUT_REVOKE: n = c->put_revoke ? c->put_revoke->n_items : 1; break;
    case KVP__COMMAND__BODY_REMOVE: n = c->remove ? c->remove->n_keys : 1; break;
    case KVP__COMMAND__BODY_EVICT: n = c->evict ? c->evict->n_keys : 1; break;
    case KVP__COMMAND__BODY_PUT_COMMIT: n = c->put_commit ? c->put_commit->n_items : 1; break;
    case KVP__COMMAND__BODY_PUT_SEAL: n = c->put_seal ? c->put_seal->n_items : 1; break;
    case KVP__COMMAND__BODY_REPAIR_START: n = c->repair_start ? c->repair_start->n_items : 1; break;
    case KVP__COMMAND__BODY_REPAIR_END: n = c->repair_end ? c->repair_end->n_items : 1; break;
    case KVP__COMMAND__BODY_REPLICA_DROP: n = c->replica_drop ? c->replica_drop->n_items : 1; break;
    default: break;
    }
    return n == 0 ? 1 : n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

int svc_submit(struct kvp_master_service *s, struct svc_pending *p, Kvp__Command *cmd)
{
    /* Level 6: puts acknowledged before their seal (service_put.c) are sealed in the log before
     * anything this leader logs after their acknowledgement (a Remove of the key finds it sealed). */
    if (cmd->body_case != KVP__COMMAND__BODY_PUT_SEAL)
        svc_put_flush_seals(s);
    cmd->now_wall_ms = kvp_clock_wall_ms();
    cmd->term = s->term;
    /* A lease horizon (docs/master.md, "Leases and failover"): the FSM quarantines the space a
     * Remove, RemoveAll or Evict frees as freed at now_wall_ms and reuses it fence_grace_ms
     * later; a horizon later than that moves the command's time forward, so the space waits for
     * the leases as well, on every member and after any failover. Only these three commands read
     * now_wall_ms for nothing but that (fsm_cmd.c), so the log stays what every level applies
     * alike. */
    uint64_t grace = s->cfg.fence_grace_ms;
    if (p->hold_wall_ms > grace && p->hold_wall_ms - grace > cmd->now_wall_ms &&
        (cmd->body_case == KVP__COMMAND__BODY_REMOVE || cmd->body_case == KVP__COMMAND__BODY_REMOVE_ALL ||
         cmd->body_case == KVP__COMMAND__BODY_EVICT))
        cmd->now_wall_ms = p->hold_wall_ms - grace;
    /* RDMA writers of failed puts not yet fenced by their segments (FenceWriter/Fenced,
     * fence_track.h): what was freed since the failure stays quarantined. */
    if (cmd->body_case == KVP__COMMAND__BODY_QUARANTINE_RELEASE)
        cmd->now_wall_ms = svc_fence_release_time(s, cmd->now_wall_ms);
    /* Rolling upgrades (version.h): log nothing that a member of the cluster's level would
     * apply its own way, and stamp what the command needs so that an older member refuses it. */
    svc_resolve_test_hook(s, cmd);
    kvp_feature_prepare_command(cmd, svc_feature_level(s));
    size_t len = protobuf_c_message_get_packed_size(&cmd->base);
    uint8_t *buf = malloc(len ? len : 1);
    int rc = KVP_ERR_NOMEM;
    if (buf && (rc = pending_track(s, p)) == KVP_OK) {
        protobuf_c_message_pack(&cmd->base, buf);
        rc = kvp_raftlog_submit_cost(s->rl, p->corr, buf, len, svc_command_cost(cmd));
        if (rc == KVP_OK && p->recv_us)
            p->submit_us = kvp_clock_now_us();
    }
    free(buf);
    if (rc != KVP_OK)
        pending_fail(s, p, rc, "submit to raft log failed");
    return rc;
}

int svc_query(struct kvp_master_service *s, struct svc_pending *p, const Kvp__Request *req)
{
    size_t len = protobuf_c_message_get_packed_size(&req->base);
    uint8_t *buf = malloc(len ? len : 1);
    int rc = KVP_ERR_NOMEM;
    if (buf && (rc = pending_track(s, p)) == KVP_OK) {
        protobuf_c_message_pack(&req->base, buf);
        rc = kvp_raftlog_query(s->rl, p->corr, buf, len);
    }
    free(buf);
    if (rc != KVP_OK)
        pending_fail(s, p, rc, "query to raft log failed");
    return rc;
}

void svc_pending_sweep(struct kvp_master_service *s)
{
    /* raftlog answers every submit and query (APPLIED/QUERY/ADMIN, NOT_LEADER on leadership
     * loss); an entry still here long after its deadline means a result was lost. Free it so
     * memory and the one-in-flight timer flags do not stay stuck. */
    uint64_t now = svc_now_ms();
    uint64_t stale[256];
    size_t n = 0, pos = 0;
    uint64_t k, v;
    while (n < 256 && svc_map_next(&s->pending, &pos, &k, &v)) {
        struct svc_pending *p = (struct svc_pending *)(uintptr_t)v;
        uint64_t limit = p->deadline_ms ? p->deadline_ms + 30000 : p->created_ms + 120000;
        if (now > limit)
            stale[n++] = k;
    }
    for (size_t i = 0; i < n; i++) {
        if (!svc_map_del(&s->pending, stale[i], &v))
            continue;
        struct svc_pending *p = (struct svc_pending *)(uintptr_t)v;
        kvp_log_error(s->actor, "corr %llu (request %llu): no raft log result after %llu ms: dropped",
                      (unsigned long long)p->corr, (unsigned long long)p->req_id,
                      (unsigned long long)(now - p->created_ms));
        if (p->internal)
            svc_on_result(s, p, 0, KVP_ERR_TIMEOUT, NULL, 0); /* clears its in-flight flag */
        svc_mount_seen_forget(s, p); /* else its resent copies are dropped for 60 s */
        svc_pending_free(p);
    }
}

/* ------------------------------------------------------------------ watched sockets, the tick */

static void log_bad_frame(struct kvp_master_service *s, zframe_t *frame, const char *why, int rc)
{
    uint64_t now = svc_now_ms();
    s->bad_total++;
    if (now - s->bad_window_ms >= 1000) {
        if (s->bad_in_window > 20)
            kvp_log_warn(s->actor, "%u more bad frames in the last second (log lines suppressed)",
                         s->bad_in_window - 20);
        s->bad_window_ms = now;
        s->bad_in_window = 0;
    }
    if (++s->bad_in_window > 20)
        return;
    const char *peer = frame ? zframe_meta(frame, "Peer-Address") : NULL;
    kvp_log_warn(s->actor, "bad frame from %s (%zu bytes): %s: %s (dropped, no reply)",
                 peer ? peer : "unknown peer", frame ? zframe_size(frame) : (size_t)0, why,
                 kvp_strerror(rc));
}

/* The rest of a message that had more frames than a request's two (or its last frame when the
 * body is missing): read and dropped, so the next read starts at the next message. */
static void drop_rest(zsock_t *sock, zframe_t *last)
{
    bool more = last && zframe_more(last);
    while (more) {
        zframe_t *f = zframe_recv_nowait(sock);
        more = f && zframe_more(f);
        zframe_destroy(&f);
    }
}

static int on_router_readable(struct kvp_master_service *s, zsock_t *sock)
{
    /* Drain up to a batch of messages per wakeup, so timers and raftlog events stay served.
     * A request is two frames (the peer's identity, the body), read one by one (a whole
     * zmsg_t costs four more allocations per request); the body is decoded into the request
     * arena, released once its handler has returned. */
    for (int i = 0; i < 256; i++) {
        zframe_t *identity = zframe_recv_nowait(sock);
        if (!identity)
            break;
        s->cur_recv_us = kvp_clock_now_us();
        zframe_t *body = zframe_more(identity) ? zframe_recv_nowait(sock) : NULL;
        if (!body || zframe_more(body)) {
            log_bad_frame(s, body, "not one frame", KVP_ERR_MALFORMED);
            drop_rest(sock, body);
        } else {
            Kvp__Request *req = NULL;
            int rc = kvp_wire_decode_with(KVP_MSG_REQUEST, zframe_data(body), zframe_size(body), &s->req_arena.pb,
                                          (ProtobufCMessage **)&req);
            if (rc != KVP_OK)
                log_bad_frame(s, body, "decode request", rc);
            else if (svc_auth_admit(s, identity, body, req)) /* role and tenant (service_auth.c) */
                svc_dispatch(s, identity, req);
            kvp_wire_arena_reset(&s->req_arena);
        }
        zframe_destroy(&identity);
        zframe_destroy(&body);
    }
    s->cur_recv_us = 0;
    return 0;
}

static int frame_u64(zframe_t *f, uint64_t *out)
{
    if (!f || zframe_size(f) != 8)
        return -1;
    memcpy(out, zframe_data(f), 8);
    return 0;
}

/* One submit's result (EV_APPLIED, or one record of an EV_APPLIED_BATCH) or a query's. */
static void on_raftlog_result(struct kvp_master_service *s, uint8_t kind, uint64_t corr, int32_t status,
                              const uint8_t *data, size_t len)
{
    uint64_t v = 0;
    if (!svc_map_del(&s->pending, corr, &v)) {
        kvp_log_debug(s->actor, "raftlog result for unknown corr %llu", (unsigned long long)corr);
        return;
    }
    struct svc_pending *p = (struct svc_pending *)(uintptr_t)v;
    uint64_t t_ev = p->submit_us ? kvp_clock_now_us() : 0;
    svc_on_result(s, p, kind, status, data, len);
    if (t_ev) {
        s->rl_requests++;
        s->rl_in_us += p->submit_us - p->recv_us;
        s->rl_raft_us += t_ev - p->submit_us;
        s->rl_out_us += kvp_clock_now_us() - t_ev;
    }
    svc_pending_free(p);
}

static int on_raftlog_event(struct kvp_master_service *s, zsock_t *sock)
{
    for (int i = 0; i < 256; i++) {
        zmsg_t *msg = zmsg_recv_nowait(sock);
        if (!msg)
            break;
        zframe_t *fk = zmsg_first(msg);
        zframe_t *fc = zmsg_next(msg);
        zframe_t *fs = zmsg_next(msg);
        zframe_t *fr = zmsg_next(msg);
        uint64_t corr = 0;
        int32_t status = 0;
        if (!fk || zframe_size(fk) != 1 || frame_u64(fc, &corr) || !fs || zframe_size(fs) != 4) {
            kvp_log_error(s->actor, "raftlog event with a bad shape (%zu frames): ignored", zmsg_size(msg));
            zmsg_destroy(&msg);
            continue;
        }
        uint8_t kind = zframe_data(fk)[0];
        memcpy(&status, zframe_data(fs), 4);
        const uint8_t *data = fr ? zframe_data(fr) : NULL;
        size_t len = fr ? zframe_size(fr) : 0;
        if (kind == KVP_RAFTLOG_EV_LEADER) {
            /* The payload may be older than get_info(); always take the latest view. */
            svc_refresh_leadership(s);
        } else if (kind == KVP_RAFTLOG_EV_LOG_FAILED) {
            /* Nothing more can be persisted here: stop once leadership has moved (on_tick), so
             * a supervisor restarts this member on a fixed disk; the others go on. */
            if (!s->log_failed_ms)
                kvp_log_error(s->actor, "%.*s: stopping (exit 1) once leadership has moved, at most 2000 ms",
                              (int)len, data ? (const char *)data : "raft log write failed");
            if (!s->log_failed_ms)
                s->log_failed_ms = kvp_clock_now_ms();
        } else if (kind == KVP_RAFTLOG_EV_APPLIED_BATCH) {
            /* corr = how many records; each is one EV_APPLIED (raftlog.h). */
            size_t pos = 0, res_len = 0;
            uint64_t rcorr = 0, got = 0;
            int32_t rst = 0;
            const uint8_t *res = NULL;
            int r;
            while ((r = kvp_raftlog_applied_next(data, len, &pos, &rcorr, &rst, &res, &res_len)) == 1) {
                on_raftlog_result(s, KVP_RAFTLOG_EV_APPLIED, rcorr, rst, res, res_len);
                got++;
            }
            if (r != 0 || got != corr)
                kvp_log_error(s->actor, "raftlog applied batch: %llu of %llu records read from %zu bytes%s",
                              (unsigned long long)got, (unsigned long long)corr, len,
                              r != 0 ? ", the rest malformed" : "");
        } else {
            on_raftlog_result(s, kind, corr, status, data, len);
        }
        zmsg_destroy(&msg);
    }
    return 0;
}

static int on_tick(struct kvp_master_service *s)
{
    svc_refresh_leadership(s);
    svc_put_flush_seals(s); /* acknowledged puts' seals that no command carried since */
    if (s->log_failed_ms && (!s->is_leader || kvp_clock_now_ms() - s->log_failed_ms >= 2000)) {
        s->fatal = true;
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ lifecycle */

struct bind_try {
    zsock_t *router;
    const char *listen;
};

/* One bind of the ROUTER: BUSY while the port is held (retried), any other error is final. */
static int router_bind_attempt(void *arg, char *why, size_t why_cap)
{
    struct bind_try *t = arg;
    if (zsock_bind(t->router, "tcp://%s", t->listen) >= 0)
        return KVP_OK;
    int e = zmq_errno();
    snprintf(why, why_cap, "%s", zmq_strerror(e));
    return e == EADDRINUSE ? KVP_ERR_BUSY : KVP_ERR_IO;
}

static int raft_probe_attempt(void *arg, char *why, size_t why_cap)
{
    return kvp_probe_listen(arg, why, why_cap);
}

int kvp_master_service_new(struct kvp_master_service **out, const struct kvp_cfg_master *cfg)
{
    if (!out || !cfg)
        return KVP_ERR_INVALID;
    struct kvp_master_service *s = calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NOMEM;
    s->cfg = *cfg;
    snprintf(s->actor, sizeof s->actor, "master-%llu", (unsigned long long)cfg->id);
    if (kvp_wire_arena_init(&s->req_arena, SVC_REQ_ARENA_BYTES) != KVP_OK) {
        free(s);
        return KVP_ERR_NOMEM;
    }
    s->next_corr = 1;
    s->last_logged_role = -1;
    svc_map_init(&s->pending);
    svc_map_init(&s->leases);
    svc_map_init(&s->last_access);
    svc_map_init(&s->last_hb);
    svc_map_init(&s->hb_gap);
    svc_map_init(&s->unreachable);
    svc_map_init(&s->segments);
    svc_map_init(&s->lost_sent);
    svc_map_init(&s->heard_via);
    svc_map_init(&s->client_wrote);
    svc_map_init(&s->successor);
    kvp_liveness_init(&s->liveness, cfg->client_ttl_ms, 0, 0, svc_now_ms());
    svc_map_init(&s->probing);
    int rc = svc_evict_new(s);
    if (rc == KVP_OK)
        rc = svc_put_new(s);
    if (rc != KVP_OK) {
        kvp_master_service_destroy(&s);
        return rc;
    }
    s->hb_waiters = zlist_new();
    if (!s->hb_waiters) {
        rc = KVP_ERR_NOMEM;
        goto fail;
    }
    rc = kvp_rt_sink_new(&s->ctl, "master-ctl");
    if (rc != KVP_OK)
        goto fail;

    if (cfg->id == 0) {
        kvp_log_error(s->actor, "id must be >= 1");
        rc = KVP_ERR_INVALID;
        goto fail;
    }
    if (cfg->members[0]) {
        int n = kvp_master_members_parse(cfg->members, s->members, KVP_CFG_MAX_MASTERS);
        if (n < 0) {
            kvp_log_error(s->actor, "members=\"%s\": expected ID@HOST:PORT@HOST:PORT,... (at most %d)",
                          cfg->members, KVP_CFG_MAX_MASTERS);
            rc = KVP_ERR_INVALID;
            goto fail;
        }
        s->n_members = n;
    } else {
        s->members[0].id = cfg->id;
        snprintf(s->members[0].address, sizeof s->members[0].address, "%s", cfg->listen);
        snprintf(s->members[0].raft_address, sizeof s->members[0].raft_address, "%s", cfg->raft_address);
        s->n_members = 1;
    }
    bool self = false;
    for (int i = 0; i < s->n_members; i++)
        if (s->members[i].id == cfg->id)
            self = true;
    if (!self && !cfg->join) {
        kvp_log_error(s->actor, "members=\"%s\" does not list this node's id %llu", cfg->members,
                      (unsigned long long)cfg->id);
        rc = KVP_ERR_INVALID;
        goto fail;
    }
    if (!self && s->n_members < KVP_CFG_MAX_MASTERS) {
        /* A joining node knows its own addresses even if the list does not name it. */
        struct kvp_master_member *m = &s->members[s->n_members++];
        m->id = cfg->id;
        snprintf(m->address, sizeof m->address, "%s", cfg->listen);
        snprintf(m->raft_address, sizeof m->raft_address, "%s", cfg->raft_address);
    }

    /* The ROUTER first: a port in use should fail before raft touches the data dir. */
    s->router = zsock_new(ZMQ_ROUTER);
    if (!s->router) {
        rc = KVP_ERR_IO;
        goto fail;
    }
    zsock_set_maxmsgsize(s->router, (int64_t)KVP_WIRE_HEADER_BYTES + KVP_WIRE_MAX_BODY);
    zsock_set_rcvhwm(s->router, 100000);
    zsock_set_sndhwm(s->router, 100000);
    zsock_set_linger(s->router, 0);
    rc = svc_auth_start(s); /* CURVE before bind (service_auth.c) */
    if (rc != KVP_OK)
        goto fail;
    /* A port still held (by a killed previous incarnation whose threads are still exiting, or
     * by anything else) is retried for bind_retry_ms, with one log line per try (issue 15). */
    char what[300];
    snprintf(what, sizeof what, "bind tcp://%s", cfg->listen);
    struct bind_try bt = {.router = s->router, .listen = cfg->listen};
    rc = kvp_retry_start(s->actor, what, cfg->bind_retry_ms, router_bind_attempt, &bt);
    if (rc != KVP_OK) {
        rc = KVP_ERR_IO;
        goto fail;
    }
    /* The Raft transport binds inside raft_start, where a held port cannot be retried: wait
     * here until it can be taken (the same incarnation held both; a TIME-WAIT does not count). */
    snprintf(what, sizeof what, "bind Raft address %s", cfg->raft_address);
    rc = kvp_retry_start(s->actor, what, cfg->bind_retry_ms, raft_probe_attempt, (void *)cfg->raft_address);
    if (rc != KVP_OK) {
        rc = rc == KVP_ERR_INVALID ? KVP_ERR_INVALID : KVP_ERR_IO;
        goto fail;
    }

    struct kvp_master_fsm_params fp = {.fence_grace_ms = cfg->fence_grace_ms, .put_ttl_ms = cfg->put_ttl_ms};
    rc = kvp_master_fsm_new(&s->fsm, &fp);
    if (rc != KVP_OK) {
        kvp_log_error(s->actor, "create state machine: %s", kvp_strerror(rc));
        goto fail;
    }

    struct kvp_raftlog_params *rp = calloc(1, sizeof *rp);
    if (!rp) {
        rc = KVP_ERR_NOMEM;
        goto fail;
    }
    rp->id = cfg->id;
    snprintf(rp->raft_address, sizeof rp->raft_address, "%s", cfg->raft_address);
    snprintf(rp->data_dir, sizeof rp->data_dir, "%s", cfg->data_dir);
    for (int i = 0; i < s->n_members && i < 9; i++) {
        rp->members[i].id = s->members[i].id;
        snprintf(rp->members[i].raft_address, sizeof rp->members[i].raft_address, "%s",
                 s->members[i].raft_address);
    }
    rp->n_members = (size_t)s->n_members;
    rp->join = cfg->join;
    rp->election_timeout_ms = cfg->election_timeout_ms;
    rp->heartbeat_ms = cfg->raft_heartbeat_ms;
    rp->snapshot_threshold = cfg->snapshot_threshold;
    rp->snapshot_trailing = cfg->snapshot_trailing;
    rp->snapshot_log_bytes = cfg->snapshot_log_bytes;
    rp->group_commit_max = cfg->group_commit_max;
    rp->batch_applied = true; /* one events message per raft-thread iteration (on_raftlog_event) */
    rp->max_inflight_entries = cfg->raft_max_inflight_entries;
    rp->fsm.ctx = s->fsm;
    rp->fsm.apply = kvp_master_fsm_apply_bytes;
    rp->fsm.query = kvp_master_fsm_query_bytes;
    rp->fsm.snapshot = kvp_master_fsm_snapshot_bytes;
    /* Snapshots are built a chunk per raft loop iteration (docs/raftlog.md "Snapshots"). */
    rp->fsm.snap_begin = kvp_master_fsm_snap_begin_bytes;
    rp->fsm.snap_next = kvp_master_fsm_snap_next_bytes;
    rp->fsm.snap_abort = kvp_master_fsm_snap_abort_bytes;
    rp->fsm.restore = kvp_master_fsm_restore_bytes;
    rp->fsm.restore_begin = kvp_master_fsm_restore_begin_bytes; /* install in steps (issue 22) */
    rp->fsm.restore_step = kvp_master_fsm_restore_step_bytes;
    rp->fsm.restore_end = kvp_master_fsm_restore_end_bytes;
    rp->fsm.restore_drop = kvp_master_fsm_restore_drop_bytes;
    rp->fsm.hold_note = kvp_master_fsm_hold_note; /* what a slow hold of the raft thread did */
    rc = kvp_raftlog_start(&s->rl, rp);
    free(rp);
    if (rc != KVP_OK) {
        kvp_log_error(s->actor, "start raft (id %llu, raft %s, data %s): %s", (unsigned long long)cfg->id,
                      cfg->raft_address, cfg->data_dir, kvp_strerror(rc));
        goto fail;
    }
    /* After raft: a metrics port that cannot be bound fails the start like the control port. */
    rc = svc_metrics_start(s);
    if (rc != KVP_OK)
        goto fail;
    kvp_log_info(s->actor, "serving tcp://%s, raft %s, data %s, %d member(s)%s", cfg->listen,
                 cfg->raft_address, cfg->data_dir, s->n_members, cfg->join ? ", joining" : "");
    *out = s;
    return KVP_OK;
fail:
    kvp_master_service_destroy(&s);
    return rc;
}

int svc_loop_start(struct kvp_master_service *s)
{
    /* Each step's own error (no watch, no eventfd or thread for the prober, no memory), with
     * the step named: a start that fails says why, not always "out of memory". */
    int rc;
    const char *step;
    if ((rc = svc_watch(s, s->router, on_router_readable)) != KVP_OK)
        step = "watch the control socket";
    else if ((rc = svc_watch(s, kvp_raftlog_events(s->rl), on_raftlog_event)) != KVP_OK)
        step = "watch the raft log's events";
    else if ((rc = svc_timer_every(s, 10, on_tick)) != KVP_OK || (rc = svc_timers_start(s)) != KVP_OK ||
             (rc = svc_evict_timer_start(s)) != KVP_OK)
        step = "start the timers";
    else if ((rc = svc_prober_start(s)) != KVP_OK)
        step = "start the prober";
    else if ((rc = svc_metrics_timer_start(s)) != KVP_OK)
        step = "start the metrics timer";
    else if ((rc = svc_version_start(s)) != KVP_OK)
        step = "start the feature-level checks";
    else if ((rc = svc_auth_loop_start(s)) != KVP_OK)
        step = "watch the CURVE handshakes";
    else
        return KVP_OK;
    kvp_log_error(s->actor, "cannot %s: %s", step, kvp_strerror(rc));
    return rc;
}

void kvp_master_service_destroy(struct kvp_master_service **sp)
{
    if (!sp || !*sp)
        return;
    struct kvp_master_service *s = *sp;
    svc_metrics_destroy(s); /* the endpoint first: its callbacks read what the rest frees */
    kvp_raftlog_stop(&s->rl); /* the raft thread no longer touches the FSM after this */
    kvp_master_fsm_destroy(&s->fsm);
    size_t pos = 0;
    uint64_t k, v;
    while (svc_map_next(&s->pending, &pos, &k, &v))
        svc_pending_free((struct svc_pending *)(uintptr_t)v);
    if (s->hb_waiters) {
        struct svc_hb_waiter *w;
        while ((w = zlist_pop(s->hb_waiters))) {
            zframe_destroy(&w->identity);
            free(w);
        }
        zlist_destroy(&s->hb_waiters);
    }
    svc_map_fini(&s->pending);
    svc_map_fini(&s->leases);
    svc_map_fini(&s->last_access);
    svc_map_fini(&s->last_hb);
    svc_map_fini(&s->hb_gap);
    svc_map_fini(&s->unreachable);
    svc_map_fini(&s->segments);
    svc_map_fini(&s->lost_sent);
    svc_map_fini(&s->heard_via);
    svc_map_fini(&s->client_wrote);
    svc_map_fini(&s->successor);
    free(s->verdicts);
    svc_map_fini(&s->probing);
    svc_repair_free(s);
    svc_evict_destroy(s);
    svc_resolve_destroy(s);
    svc_verify_destroy(s);
    svc_put_destroy(s);
    kvp_fence_track_fini(&s->fence);
    for (size_t i = 0; i < sizeof s->mount_seen / sizeof s->mount_seen[0]; i++)
        zframe_destroy(&s->mount_seen[i].identity);
    kvp_rt_destroy(&s->prober); /* the actor's fini did, unless run() never ran */
    zhashx_destroy(&s->endpoints);
    zsock_destroy(&s->router);
    svc_auth_stop(s);
    kvp_rt_destroy(&s->ctl);
    kvp_wire_arena_fini(&s->req_arena);
    free(s);
    *sp = NULL;
}
