/*
 * service_rpc.c — the dispatch table of decoded requests (rpc_table: per Request body case, one
 * on_<message>() handler and at most one after_<message>() step on the state machine's answer),
 * the handlers of the request types that have no family file of their own, and the handling of
 * raftlog results (soft state, leases, status, then the reply).
 * DESIGN.md "Core flows" (Put, Get, Segments, Master failover); docs/master.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/master/service/service_evict.h"
#include "actors/master/service/service_repair.h"
#include "actors/master/service/service_metrics.h"
#include "actors/master/service/service_state.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"

/* ------------------------------------------------------------------ helpers */

/* A mutation: the request body becomes the body of a Raft command; hold_wall_ms is its lease
 * horizon (svc_pending.hold_wall_ms, 0 = none). Returns KVP_OK when submitted; otherwise the
 * caller was answered with the error (svc_submit freed the pending entry). */
static int mutate_hold(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req,
                       Kvp__Command__BodyCase bc, void *body, uint64_t hold_wall_ms)
{
    struct svc_pending *p = svc_pending_new(s, identity, req);
    if (!p) {
        svc_reply_status(s, identity, req->req_id, KVP_ERR_NOMEM, "out of memory");
        return KVP_ERR_NOMEM;
    }
    p->hold_wall_ms = hold_wall_ms;
    Kvp__Command cmd = KVP__COMMAND__INIT;
    svc_command_set(&cmd, bc, body);
    return svc_submit(s, p, &cmd);
}

static int mutate(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req,
                  Kvp__Command__BodyCase bc, void *body)
{
    return mutate_hold(s, identity, req, bc, body, 0);
}

static bool key_hashes(struct svc_pending *p, char **keys, size_t n)
{
    if (n == 0)
        return true;
    p->key_hashes = malloc(n * sizeof *p->key_hashes);
    if (!p->key_hashes)
        return false;
    for (size_t i = 0; i < n; i++)
        p->key_hashes[i] = svc_key_hash(keys[i]);
    p->n_keys = n;
    return true;
}

static void finish_result(struct kvp_master_service *s, struct svc_pending *p, int kind, int status,
                          Kvp__Response *resp);

/* The data path's reads (GetReplicaList, Exists, GetSize) answered on this thread from the
 * FSM, while raftlog vouches for this node's leadership (kvp_raftlog_read_begin): no hop to the
 * raft thread and back, no re-encoding. false: not possible now (not leader, a new leader
 * before its barrier, raft thread busy): the caller goes through the raft thread. */
static bool local_read(struct kvp_master_service *s, struct svc_pending *p, zframe_t *identity,
                       const Kvp__Request *req)
{
    if (req->body_case != KVP__REQUEST__BODY_GET_REPLICAS && req->body_case != KVP__REQUEST__BODY_EXISTS &&
        req->body_case != KVP__REQUEST__BODY_GET_SIZE)
        return false;
    if (kvp_raftlog_read_begin(s->rl) != KVP_OK)
        return false;
    /* Level 6: an older leader's pending intent (maybe acknowledged by it) waits for the
     * resolver rather than answering NOT_FOUND (DESIGN.md C4). */
    const char *intents[8];
    size_t n_intents = identity ? svc_put_intent_keys(s, req, intents, 8) : 0;
    if (n_intents) {
        kvp_raftlog_read_end(s->rl);
        svc_put_hold_intent(s, identity, req, intents, n_intents);
        return true;
    }
    Kvp__Response *resp = NULL;
    /* level 6: puts this leader acknowledged and is still sealing count as complete */
    int rc = kvp_master_fsm_query_vis(s->fsm, req, svc_put_read_vis(s), &resp);
    kvp_raftlog_read_end(s->rl);
    s->local_reads++;
    finish_result(s, p, KVP_RAFTLOG_EV_QUERY, rc, rc == KVP_OK ? resp : NULL);
    kvp_master_fsm_response_free(resp);
    return true;
}

/* A read: answered locally when raftlog vouches for this node's leadership, else as a raftlog
 * query on the leader's raft thread (only while it has heard from a quorum). */
static void query(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req, char **keys,
                  size_t n_keys)
{
    struct svc_pending *p = svc_pending_new(s, identity, req);
    if (!p || !key_hashes(p, keys, n_keys)) {
        svc_pending_free(p);
        svc_reply_status(s, identity, req->req_id, KVP_ERR_NOMEM, "out of memory");
        return;
    }
    if (local_read(s, p, identity, req)) {
        svc_pending_free(p);
        return;
    }
    /* The raft thread's answer cannot see what this leader sealed in memory: such a read waits
     * for the seal (read-your-writes after a put's acknowledgement). */
    if (svc_put_hold_read(s, identity, req) || svc_put_hold_unready(s, identity, req)) {
        svc_pending_free(p);
        return;
    }
    svc_query(s, p, req);
}

/* ------------------------------------------------------------------ handlers */

/* How long a MountSegment call is remembered (service_state.h "mount_seen"): longer than the
 * session's longest call. */
#define SVC_MOUNT_SEEN_MS 60000u

/* The remembered call: the same call (socket and call id: a resent copy), or, with a non-zero
 * nonce, any call with that nonce (a new try of the same mount, maybe on a new socket). */
static struct svc_mount_seen *mount_seen_find(struct kvp_master_service *s, zframe_t *id, uint64_t call,
                                              uint64_t nonce)
{
    uint64_t now = svc_now_ms();
    for (size_t i = 0; id && i < sizeof s->mount_seen / sizeof s->mount_seen[0]; i++) {
        struct svc_mount_seen *m = &s->mount_seen[i];
        if (!m->identity || now - m->at_ms >= SVC_MOUNT_SEEN_MS)
            continue;
        if ((m->call == call && zframe_eq(m->identity, id)) || (nonce && m->nonce == nonce))
            return m;
    }
    return NULL;
}

static void on_mount(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    uint64_t call = req->req_id >> 8;
    uint64_t nonce = req->mount->mount_nonce;
    struct svc_mount_seen *m = mount_seen_find(s, id, call, nonce);
    if (m && m->segment_id == 0) {
        kvp_log_debug(s->actor, "mount %s: a resent copy or new try (call %llu, nonce %llx) of a mount still "
                      "in flight: dropped", req->mount->name ? req->mount->name : "", (unsigned long long)call,
                      (unsigned long long)nonce);
        return;
    }
    uint64_t state = 0;
    if (m && m->call != call && (svc_map_get(&s->lost_sent, m->segment_id, NULL) ||
                                 !svc_map_get(&s->segments, m->segment_id, &state) ||
                                 state == KVP__SEGMENT_STATE__SEGMENT_LOST + 1)) {
        /* a new try of a mount whose segment was declared lost since (no heartbeat came), or is
         * no longer in the table (unmounted or forgotten): a new registration, as without the
         * nonce; answering the old id would leave the segment heartbeating an unknown id */
        zframe_destroy(&m->identity);
        m = NULL;
    }
    if (m) {
        kvp_log_info(s->actor, "mount %s: %s of call %llu answered before: segment %u again",
                     req->mount->name ? req->mount->name : "", m->call == call ? "a resent copy" : "a new try",
                     (unsigned long long)m->call, m->segment_id);
        Kvp__Response resp = KVP__RESPONSE__INIT;
        Kvp__MountSegmentResp body = KVP__MOUNT_SEGMENT_RESP__INIT;
        body.segment_id = m->segment_id;
        resp.body_case = KVP__RESPONSE__BODY_MOUNT;
        resp.mount = &body;
        svc_reply(s, id, req->req_id, &resp);
        return;
    }
    struct svc_mount_seen *slot = NULL;
    if (id) {
        slot = &s->mount_seen[s->mount_seen_next++ % (sizeof s->mount_seen / sizeof s->mount_seen[0])];
        zframe_destroy(&slot->identity);
        slot->identity = zframe_dup(id); /* NULL on no memory: then not remembered */
        slot->call = call;
        slot->nonce = nonce;
        slot->segment_id = 0;
        slot->at_ms = svc_now_ms();
    }
    /* Not submitted (answered with the error already): no copy is in flight, so a resent copy
     * must be a new try, not dropped for SVC_MOUNT_SEEN_MS. */
    if (mutate(s, id, req, KVP__COMMAND__BODY_MOUNT, req->mount) != KVP_OK && slot)
        zframe_destroy(&slot->identity);
}

/* The result of a MountSegment call: remembered when OK, forgotten otherwise (a resent copy
 * is then a new try). */
static void mount_seen_result(struct kvp_master_service *s, const struct svc_pending *p, int status, uint32_t seg)
{
    struct svc_mount_seen *m = mount_seen_find(s, p->identity, p->req_id >> 8, 0);
    if (!m)
        return;
    if (status == KVP_OK && seg) {
        m->segment_id = seg;
        m->at_ms = svc_now_ms();
    } else {
        zframe_destroy(&m->identity);
    }
}

void svc_mount_seen_forget(struct kvp_master_service *s, const struct svc_pending *p)
{
    if (p->body_case == KVP__REQUEST__BODY_MOUNT)
        mount_seen_result(s, p, KVP_ERR_TIMEOUT, 0);
}

static void on_unmount(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    struct svc_pending *p = svc_pending_new(s, id, req);
    if (!p) {
        svc_reply_status(s, id, req->req_id, KVP_ERR_NOMEM, "out of memory");
        return;
    }
    p->segment_id = req->unmount->segment_id;
    Kvp__Command cmd = KVP__COMMAND__INIT;
    svc_command_set(&cmd, KVP__COMMAND__BODY_UNMOUNT, req->unmount);
    svc_submit(s, p, &cmd);
}

static void on_heartbeat(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    svc_on_heartbeat_req(s, id, req);
}

static void on_put_start(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    if (req->put_start->n_items == 0) {
        svc_reply_status(s, id, req->req_id, KVP_ERR_INVALID, "PutStart with no items");
        return;
    }
    if (req->put_start->n_items > KVP_MASTER_MAX_PUT_ITEMS) {
        /* One PutStart is one Raft command, applied in one go on every master: a million items
         * held the raft thread past the election timeout (C6: refuse, say why). */
        kvp_log_warn(s->actor, "req %llu: PutStart of %zu items refused (at most %u per request)",
                     (unsigned long long)req->req_id, req->put_start->n_items, KVP_MASTER_MAX_PUT_ITEMS);
        char why[96];
        snprintf(why, sizeof why, "PutStart of %zu items: at most %u per request", req->put_start->n_items,
                 KVP_MASTER_MAX_PUT_ITEMS);
        svc_reply_status(s, id, req->req_id, KVP_ERR_INVALID, why);
        return;
    }
    if (svc_put_try_start(s, id, req))
        return; /* answered from a reservation, no Raft entry (service_put.c) */
    svc_evict_on_put_start_req(s, req->put_start);
    mutate(s, id, req, KVP__COMMAND__BODY_PUT_START, req->put_start);
}

/* Witnesses for the liveness rule (liveness.h rule 5): a client just wrote to (PutEnd) or read
 * from (GetReplicaList) these segments. Soft state only: ids this leader does not know are
 * ignored, and the fields stay out of the Raft log. */
static void note_client_witness(struct kvp_master_service *s, const uint32_t *segs, size_t n)
{
    uint64_t now = svc_now_ms();
    for (size_t i = 0; i < n; i++)
        if (segs[i] && svc_map_get(&s->segments, segs[i], NULL))
            svc_map_put(&s->client_wrote, segs[i], now);
}

static void on_put_end(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    Kvp__PutEndReq *pe = req->put_end;
    if (svc_put_try_end(s, id, req))
        return; /* one PutCommitCmd (service_put.c) */
    struct svc_pending *p = svc_pending_new(s, id, req);
    if (!p || !(p->key_hashes = calloc(pe->n_items ? pe->n_items : 1, sizeof(uint64_t)))) {
        svc_pending_free(p);
        svc_reply_status(s, id, req->req_id, KVP_ERR_NOMEM, "out of memory");
        return;
    }
    for (size_t i = 0; i < pe->n_items; i++)
        p->key_hashes[i] = svc_key_hash(pe->items[i]->key);
    p->n_keys = pe->n_items;
    note_client_witness(s, pe->written_segments, pe->n_written_segments);
    pe->n_written_segments = 0;
    Kvp__Command cmd = KVP__COMMAND__INIT;
    svc_command_set(&cmd, KVP__COMMAND__BODY_PUT_END, pe);
    svc_submit(s, p, &cmd);
}

static void on_put_revoke(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    /* before its space is freed; only the writers the client named (0: every writer) */
    svc_fence_note_writer_failure(s, kvp_clock_wall_ms(), req->put_revoke->writer_id,
                                  req->put_revoke->writer_mask, "PutRevoke");
    /* soft state for this leader's fences: not put in the Raft log (the command stays as before) */
    req->put_revoke->writer_id = 0;
    req->put_revoke->writer_mask = 0;
    if (svc_put_try_revoke(s, id, req))
        return; /* a put in flight here: dropped, no Raft entry */
    mutate(s, id, req, KVP__COMMAND__BODY_PUT_REVOKE, req->put_revoke);
}

static void on_get_replicas(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    note_client_witness(s, req->get_replicas->read_segments, req->get_replicas->n_read_segments);
    req->get_replicas->n_read_segments = 0;
    query(s, id, req, req->get_replicas->keys, req->get_replicas->n_keys);
}

static void on_exists(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    query(s, id, req, NULL, 0);
}

static void on_get_size(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    query(s, id, req, NULL, 0);
}

/* Remove: a key under a read lease (or any key during a new leader's grace window) is refused
 * with KVP_ERR_LEASED unless force; the rest go to the FSM (which quarantines their space). */
static void on_remove(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    Kvp__RemoveReq *rr = req->remove;
    struct svc_pending *p = svc_pending_new(s, id, req);
    size_t n = rr->n_keys;
    if (!p || !(p->remove_status = calloc(n ? n : 1, sizeof(int32_t)))) {
        svc_pending_free(p);
        svc_reply_status(s, id, req->req_id, KVP_ERR_NOMEM, "out of memory");
        return;
    }
    p->n_remove = n;
    if (!key_hashes(p, rr->keys, n)) {
        svc_pending_free(p);
        svc_reply_status(s, id, req->req_id, KVP_ERR_NOMEM, "out of memory");
        return;
    }
    char **fwd = calloc(n ? n : 1, sizeof(char *));
    if (!fwd) {
        svc_pending_free(p);
        svc_reply_status(s, id, req->req_id, KVP_ERR_NOMEM, "out of memory");
        return;
    }
    size_t nf = 0;
    bool grace = svc_in_election_grace(s);
    uint64_t *fwd_hashes = calloc(n ? n : 1, sizeof(uint64_t));
    if (!fwd_hashes) {
        svc_pending_free(p);
        svc_reply_status(s, id, req->req_id, KVP_ERR_NOMEM, "out of memory");
        free(fwd);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (svc_put_pending_key(s, rr->keys[i])) {
            p->remove_status[i] = KVP_ERR_BUSY; /* a one-commit put in flight: as a pending put */
        } else if (!rr->force && (grace || svc_key_leased(s, p->key_hashes[i]))) {
            p->remove_status[i] = KVP_ERR_LEASED;
        } else {
            p->remove_status[i] = 1;
            fwd_hashes[nf] = p->key_hashes[i];
            fwd[nf++] = rr->keys[i];
        }
    }
    /* A forced remove of leased keys commits their lease horizon: their space is reused only
     * after the last lease on them (and, during the election grace, after the grace: an older
     * leader's leases), on whichever leader releases it (docs/master.md, "Leases and failover"). */
    if (rr->force)
        p->hold_wall_ms = svc_lease_horizon(s, fwd_hashes, nf);
    if (nf == 0) {
        /* Nothing for the FSM: answer now. */
        Kvp__Response resp = KVP__RESPONSE__INIT;
        Kvp__RemoveResp body = KVP__REMOVE_RESP__INIT;
        body.n_status = n;
        body.status = p->remove_status;
        resp.body_case = KVP__RESPONSE__BODY_REMOVE;
        resp.remove = &body;
        svc_reply(s, id, req->req_id, &resp);
        svc_pending_free(p);
        free(fwd);
        free(fwd_hashes);
        return;
    }
    Kvp__RemoveReq sub = KVP__REMOVE_REQ__INIT;
    sub.keys = fwd;
    sub.n_keys = nf;
    sub.force = rr->force;
    Kvp__Command cmd = KVP__COMMAND__INIT;
    svc_command_set(&cmd, KVP__COMMAND__BODY_REMOVE, &sub);
    if (svc_submit(s, p, &cmd) == KVP_OK && !rr->force) {
        /* Un-forced: no lease was found; none may be granted before the commit either. */
        p->hides = true;
        for (size_t i = 0; i < nf; i++)
            svc_evict_hide(s, fwd_hashes[i]);
    }
    free(fwd);
    free(fwd_hashes);
}

static bool any_lease(const struct kvp_master_service *s)
{
    size_t pos = 0;
    uint64_t k, exp;
    uint64_t now = svc_now_ms();
    while (svc_map_next(&s->leases, &pos, &k, &exp))
        if (exp > now)
            return true;
    return false;
}

static void on_remove_all(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    if (!req->remove_all->force && (svc_in_election_grace(s) || any_lease(s))) {
        svc_reply_status(s, id, req->req_id, KVP_ERR_LEASED,
                         "objects are under read leases (or the leader is new); use force");
        return;
    }
    /* The space waits for the last lease (and the election grace) before reuse; and, as
     * RemoveAll cannot hide every key while it is in flight, for a lease granted meanwhile: at
     * least one lease TTL from now. */
    uint64_t hold = svc_lease_horizon(s, NULL, 0);
    if (svc_mono_to_wall(svc_now_ms() + s->cfg.default_kv_lease_ttl_ms) > hold)
        hold = svc_mono_to_wall(svc_now_ms() + s->cfg.default_kv_lease_ttl_ms);
    size_t pos = 0;
    uint64_t k, exp, now = svc_now_ms(), last = 0;
    while (svc_map_next(&s->leases, &pos, &k, &exp))
        if (exp > now && exp > last)
            last = exp;
    if (last && svc_mono_to_wall(last) > hold)
        hold = svc_mono_to_wall(last);
    mutate_hold(s, id, req, KVP__COMMAND__BODY_REMOVE_ALL, req->remove_all, hold);
}

static void on_drain(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    mutate(s, id, req, KVP__COMMAND__BODY_DRAIN, req->drain);
}

/* The operator's answer to a withheld episode that does not end (kvpoolctl segment-lost, with
 * its warning): the segment is declared lost now, whatever the liveness rule says. */
static void on_segment_lost(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    uint32_t seg = req->segment_lost->segment_id;
    uint64_t st = 0;
    if (seg == 0 || !svc_map_get(&s->segments, seg, &st) || st - 1 == KVP__SEGMENT_STATE__SEGMENT_LOST) {
        kvp_log_warn(s->actor, "segment-lost %u: no such active segment", seg);
        svc_reply_status(s, id, req->req_id, KVP_ERR_NOT_FOUND, "no such active segment");
        return;
    }
    kvp_log_warn(s->actor, "segment %u: declaring it lost: an operator said so (kvpoolctl segment-lost); its "
                 "replicas are dropped and re-replicated from surviving copies", seg);
    /* The segment table refresh (every second) takes the LOST state into the soft state. */
    mutate(s, id, req, KVP__COMMAND__BODY_SEGMENT_LOST, req->segment_lost);
}

static void on_report_unreachable(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    uint32_t seg = req->report_unreachable->segment_id;
    if (seg == 0) {
        svc_reply_status(s, id, req->req_id, KVP_ERR_INVALID, "segment_id 0");
        return;
    }
    uint64_t last = 0;
    bool known = svc_map_get(&s->last_hb, seg, &last);
    kvp_log_warn(s->actor, "segment %u reported unreachable by a client (last heartbeat %lld ms ago)",
                 seg, known ? (long long)(svc_now_ms() - last) : -1LL);
    svc_map_put(&s->unreachable, seg, svc_now_ms());
    svc_probe_segment(s, seg);
    svc_reply_empty(s, id, req->req_id);
}

static void on_cluster_status(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    query(s, id, req, NULL, 0);
}

static void on_mover_poll(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    svc_repair_on_mover_poll(s, id, req); /* service_repair.c */
}

static void on_data_token(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    svc_auth_on_data_token(s, id, req); /* service_auth.c */
}

static void on_members(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    Kvp__Response resp = KVP__RESPONSE__INIT;
    Kvp__MembersResp mr = KVP__MEMBERS_RESP__INIT;
    Kvp__Member storage[KVP_CFG_MAX_MASTERS];
    Kvp__Member *ptrs[KVP_CFG_MAX_MASTERS];
    struct kvp_raftlog_info info;
    svc_fill_members(s, &info, &mr, storage, ptrs, KVP_CFG_MAX_MASTERS);
    resp.body_case = KVP__RESPONSE__BODY_MEMBERS;
    resp.members = &mr;
    svc_reply(s, id, req->req_id, &resp);
}

static struct svc_pending *admin_pending(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    struct svc_pending *p = svc_pending_new(s, id, req);
    if (!p || svc_map_put(&s->pending, p->corr, (uint64_t)(uintptr_t)p) != KVP_OK) {
        svc_pending_free(p);
        svc_reply_status(s, id, req->req_id, KVP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    return p;
}

static void admin_done(struct kvp_master_service *s, struct svc_pending *p, int rc, const char *what)
{
    if (rc == KVP_OK)
        return;
    uint64_t v;
    svc_map_del(&s->pending, p->corr, &v);
    svc_reply_status(s, p->identity, p->req_id, rc, what);
    svc_pending_free(p);
}

static void on_transfer_leader(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    uint64_t target = req->transfer_leader->target_id;
    if (target == s->cfg.id) {
        svc_reply_empty(s, id, req->req_id); /* already leads */
        return;
    }
    struct svc_pending *p = admin_pending(s, id, req);
    if (!p)
        return;
    if (target)
        kvp_log_info(s->actor, "transferring leadership to member %llu", (unsigned long long)target);
    else
        kvp_log_info(s->actor, "transferring leadership to any other member");
    admin_done(s, p, kvp_raftlog_transfer(s->rl, p->corr, target), "leadership transfer refused");
}

static const char *strip_tcp(const char *a)
{
    return strncmp(a, "tcp://", 6) == 0 ? a + 6 : a;
}

static void on_add_member(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    Kvp__Member *m = req->add_member->member;
    if (!m || m->id == 0 || !m->raft_address || !m->raft_address[0] || strlen(m->raft_address) >= 256 ||
        !m->address || strlen(m->address) >= 256) {
        svc_reply_status(s, id, req->req_id, KVP_ERR_INVALID, "AddMember needs id >= 1 and a raft_address");
        return;
    }
    /* Remember its control address for leader hints (this node only: the Raft configuration
     * carries ids and Raft addresses, not control addresses). */
    int slot = -1;
    for (int i = 0; i < s->n_members; i++)
        if (s->members[i].id == m->id)
            slot = i;
    if (slot < 0 && s->n_members < KVP_CFG_MAX_MASTERS)
        slot = s->n_members++;
    if (slot >= 0) {
        s->members[slot].id = m->id;
        snprintf(s->members[slot].address, sizeof s->members[slot].address, "%s", strip_tcp(m->address));
        snprintf(s->members[slot].raft_address, sizeof s->members[slot].raft_address, "%s", m->raft_address);
    }
    struct svc_pending *p = admin_pending(s, id, req);
    if (!p)
        return;
    kvp_log_info(s->actor, "adding member %llu (raft %s, control %s)", (unsigned long long)m->id,
                 m->raft_address, m->address);
    svc_version_add_member(s, p, slot, m->id, m->raft_address); /* waits for its level if one is committed */
}

static void on_remove_member(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    uint64_t mid = req->remove_member->id;
    if (mid == 0) {
        svc_reply_status(s, id, req->req_id, KVP_ERR_INVALID, "RemoveMember needs id >= 1");
        return;
    }
    struct svc_pending *p = admin_pending(s, id, req);
    if (!p)
        return;
    kvp_log_info(s->actor, "removing member %llu", (unsigned long long)mid);
    admin_done(s, p, kvp_raftlog_remove(s->rl, p->corr, mid), "remove member refused");
}

static void merge_remove(struct kvp_master_service *s, struct svc_pending *p, Kvp__Response *resp);

/* ------------------------------------------------------------------ result steps
 * What a request's committed (or queried) answer changes here before the reply goes out: soft
 * state (leases, last access, the segment table), the status document. resp is the state
 * machine's answer (status OK); its fields may be changed. */

static void after_get_replicas(struct kvp_master_service *s, struct svc_pending *p, Kvp__Response *resp)
{
    if (!resp->get_replicas)
        return;
    for (size_t i = 0; i < resp->get_replicas->n_objects && i < p->n_keys; i++) {
        Kvp__ObjectInfo *oi = resp->get_replicas->objects[i];
        if (oi->status != KVP_OK)
            continue;
        if (svc_evict_hides(s, p->key_hashes[i])) { /* being evicted: no new lease */
            oi->status = KVP_ERR_NOT_FOUND;
            continue;
        }
        oi->lease_ttl_ms = s->cfg.default_kv_lease_ttl_ms;
        svc_grant_lease(s, p->key_hashes[i]);
        svc_touch(s, p->key_hashes[i]);
    }
}

static void after_put_end(struct kvp_master_service *s, struct svc_pending *p, Kvp__Response *resp)
{
    if (resp->put_end)
        for (size_t i = 0; i < resp->put_end->n_status && i < p->n_keys; i++)
            if (resp->put_end->status[i] == KVP_OK)
                svc_touch(s, p->key_hashes[i]);
}

static void after_put_start(struct kvp_master_service *s, struct svc_pending *p, Kvp__Response *resp)
{
    s->fsm_pending_puts++;                  /* until the next refresh: lets RevokeExpired run */
    svc_evict_on_put_start_result(s, resp); /* NO_SPACE: reason, retry flag, eviction */
}

static void after_put_revoke(struct kvp_master_service *s, struct svc_pending *p, Kvp__Response *resp)
{
    s->fsm_quarantined_bytes++; /* until the next refresh: lets QuarantineRelease run */
}

static void after_remove_all(struct kvp_master_service *s, struct svc_pending *p, Kvp__Response *resp)
{
    if (resp->status == KVP_OK) {
        svc_map_clear(&s->last_access);
        svc_evict_on_remove_all(s);
    }
    s->fsm_quarantined_bytes++; /* as after_put_revoke */
}

static void after_mount(struct kvp_master_service *s, struct svc_pending *p, Kvp__Response *resp)
{
    uint64_t now = svc_now_ms();
    if (resp->status == KVP_OK && resp->mount && resp->mount->segment_id) {
        uint32_t seg = resp->mount->segment_id;
        svc_map_put(&s->last_hb, seg, now); /* a mount counts as a heartbeat */
        svc_map_put(&s->heard_via, seg, 1);
        svc_map_put(&s->segments, seg, (uint64_t)KVP__SEGMENT_STATE__SEGMENT_ACTIVE + 1);
        svc_map_del(&s->lost_sent, seg, NULL);
        kvp_log_info(s->actor, "segment %u mounted", seg);
    } else if (resp->status == KVP_ERR_EXISTS && resp->mount && resp->mount->segment_id) {
        /* A new process under a live segment's name on its host: evidence for the liveness
         * rule (rule 6) that this master hears that host while the old one is silent. */
        uint32_t held = resp->mount->segment_id;
        if (!svc_map_get(&s->successor, held, NULL))
            kvp_log_info(s->actor, "segment %u: a new process under its name on its host asks to mount", held);
        svc_map_put(&s->successor, held, now);
    }
}

static void after_unmount(struct kvp_master_service *s, struct svc_pending *p, Kvp__Response *resp)
{
    if (resp->status != KVP_OK)
        return;
    svc_map_del(&s->segments, p->segment_id, NULL);
    svc_map_del(&s->last_hb, p->segment_id, NULL);
    svc_map_del(&s->hb_gap, p->segment_id, NULL);
    svc_map_del(&s->unreachable, p->segment_id, NULL);
    kvp_log_info(s->actor, "segment %u unmounted", p->segment_id);
}

static void after_drain(struct kvp_master_service *s, struct svc_pending *p, Kvp__Response *resp)
{
    if (resp->status == KVP_OK && resp->drain && resp->drain->segment_id)
        svc_map_put(&s->segments, resp->drain->segment_id, (uint64_t)KVP__SEGMENT_STATE__SEGMENT_DRAINING + 1);
}

static void after_remove(struct kvp_master_service *s, struct svc_pending *p, Kvp__Response *resp)
{
    merge_remove(s, p, resp);
    s->fsm_quarantined_bytes++;
}

static void after_cluster_status(struct kvp_master_service *s, struct svc_pending *p, Kvp__Response *resp)
{
    if (resp->status != KVP_OK || !resp->cluster_status)
        return;
    const char *fsm_json = resp->cluster_status->json ? resp->cluster_status->json : "{}";
    svc_segments_from_json(s, fsm_json);
    char *doc = svc_status_json(s, fsm_json);
    if (doc) {
        free(resp->cluster_status->json);
        resp->cluster_status->json = doc;
    }
}

/* ------------------------------------------------------------------ the dispatch table
 * One entry per client request, indexed by its Request body case: the handler that takes it
 * (on the leader; a follower answers NOT_LEADER first) and the step, if any, that runs on the
 * state machine's answer before the reply (finish_result). A new RPC is one handler, at most one
 * result step and one line here. Cases not listed (none, unknown, the FSM's internal queries
 * EvictScan and RepairScan) are answered INVALID. */

struct svc_rpc {
    void (*on_request)(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req);
    void (*on_result)(struct kvp_master_service *s, struct svc_pending *p, Kvp__Response *resp);
    /* on_result runs even when the answer comes after the caller's deadline (it is not sent):
     * the step records a committed fact, the segment table, not something granted to the
     * caller. A late mount's segment missing from s->segments answered its first heartbeats
     * NOT_FOUND until the next refresh, and the segment remounted; with MountSegment's resent
     * copies answered from mount_seen, no second mount filled it in either. */
    bool late_too;
};

#define SVC_RPC_CASES 64 /* above the largest client body case (MoverPoll, 40) */

static const struct svc_rpc rpc_table[SVC_RPC_CASES] = {
    [KVP__REQUEST__BODY_MOUNT] = {on_mount, after_mount, true},
    [KVP__REQUEST__BODY_UNMOUNT] = {on_unmount, after_unmount, true},
    [KVP__REQUEST__BODY_HEARTBEAT] = {on_heartbeat, NULL, false},
    [KVP__REQUEST__BODY_PUT_START] = {on_put_start, after_put_start, false},
    [KVP__REQUEST__BODY_PUT_END] = {on_put_end, after_put_end, false},
    [KVP__REQUEST__BODY_PUT_REVOKE] = {on_put_revoke, after_put_revoke, false},
    [KVP__REQUEST__BODY_PUT_INTENT] = {svc_put_on_intent, NULL, false},
    [KVP__REQUEST__BODY_GET_REPLICAS] = {on_get_replicas, after_get_replicas, false},
    [KVP__REQUEST__BODY_EXISTS] = {on_exists, NULL, false},
    [KVP__REQUEST__BODY_GET_SIZE] = {on_get_size, NULL, false},
    [KVP__REQUEST__BODY_REMOVE] = {on_remove, after_remove, false},
    [KVP__REQUEST__BODY_REMOVE_ALL] = {on_remove_all, after_remove_all, false},
    [KVP__REQUEST__BODY_DRAIN] = {on_drain, after_drain, true},
    [KVP__REQUEST__BODY_SEGMENT_LOST] = {on_segment_lost, NULL, false},
    [KVP__REQUEST__BODY_REPORT_UNREACHABLE] = {on_report_unreachable, NULL, false},
    [KVP__REQUEST__BODY_CLUSTER_STATUS] = {on_cluster_status, after_cluster_status, false},
    [KVP__REQUEST__BODY_MEMBERS] = {on_members, NULL, false},
    [KVP__REQUEST__BODY_TRANSFER_LEADER] = {on_transfer_leader, NULL, false},
    [KVP__REQUEST__BODY_ADD_MEMBER] = {on_add_member, NULL, false},
    [KVP__REQUEST__BODY_REMOVE_MEMBER] = {on_remove_member, NULL, false},
    [KVP__REQUEST__BODY_MOVER_POLL] = {on_mover_poll, NULL, false},
    [KVP__REQUEST__BODY_DATA_TOKEN] = {on_data_token, NULL, false},
    [KVP__REQUEST__BODY_VERIFY] = {svc_on_verify_req, NULL, false},
};

/* The table entry of a body case, NULL when it has no handler. */
static const struct svc_rpc *rpc_of(int body_case)
{
    if (body_case <= 0 || body_case >= SVC_RPC_CASES || !rpc_table[body_case].on_request)
        return NULL;
    return &rpc_table[body_case];
}

void svc_dispatch(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    int st;
    uint64_t su;
    svc_metrics_begin(s, (int)req->body_case, s->cur_recv_us, &st, &su); /* replies counted by type */
    const struct svc_rpc *rpc = rpc_of((int)req->body_case);
    if (!s->is_leader) {
        svc_reply_status(s, id, req->req_id, KVP_ERR_NOT_LEADER, "not the leader");
    } else if (rpc) {
        rpc->on_request(s, id, req);
    } else {
        kvp_log_warn(s->actor, "request %llu: no or unknown body (%d): answered INVALID",
                     (unsigned long long)req->req_id, (int)req->body_case);
        svc_reply_status(s, id, req->req_id, KVP_ERR_INVALID, "unknown or empty request body");
    }
    svc_metrics_end(s, st, su);
}

/* ------------------------------------------------------------------ results */

static void on_internal_result(struct kvp_master_service *s, struct svc_pending *p, int status,
                               Kvp__Response *resp)
{
    int st = status != KVP_OK ? status : (resp ? resp->status : KVP_ERR_INTERNAL);
    switch (p->internal) {
    case SVC_INT_REVOKE_EXPIRED:
        s->revoke_inflight = false;
        if (st == KVP_OK)
            s->fsm_quarantined_bytes++; /* maybe something was revoked: let QuarantineRelease look */
        if (st == KVP_OK && resp && resp->body_case == KVP__RESPONSE__BODY_REMOVE_ALL && resp->remove_all &&
            resp->remove_all->removed > 0)
            svc_fence_note_failure(s, 0, "expired puts"); /* freed at the command's time: hold all */
        if (st != KVP_OK && st != KVP_ERR_NOT_LEADER)
            kvp_log_debug(s->actor, "RevokeExpired: %s", kvp_strerror(st));
        break;
    case SVC_INT_QUARANTINE_RELEASE:
        s->release_inflight = false;
        if (st != KVP_OK && st != KVP_ERR_NOT_LEADER)
            kvp_log_debug(s->actor, "QuarantineRelease: %s", kvp_strerror(st));
        break;
    case SVC_INT_SEGMENT_LOST:
        if (st == KVP_OK || st == KVP_ERR_NOT_FOUND) {
            svc_map_del(&s->segments, p->segment_id, NULL);
            svc_map_del(&s->last_hb, p->segment_id, NULL);
            svc_map_del(&s->hb_gap, p->segment_id, NULL);
            svc_map_del(&s->unreachable, p->segment_id, NULL);
            kvp_log_warn(s->actor, "segment %u declared lost (committed)", p->segment_id);
        } else {
            svc_map_del(&s->lost_sent, p->segment_id, NULL); /* retried at the next check */
            kvp_log_warn(s->actor, "segment %u: SegmentLost not committed: %s", p->segment_id,
                         kvp_strerror(st));
        }
        break;
    case SVC_INT_STATUS_REFRESH:
        if (status == KVP_OK && resp && resp->status == KVP_OK && resp->cluster_status)
            svc_metrics_note_fsm(s, resp->cluster_status->json);
        svc_on_status_refresh(s, status, resp);
        break;
    case SVC_INT_REPAIR_SCAN:
    case SVC_INT_REPAIR_START:
    case SVC_INT_REPAIR_END:
    case SVC_INT_REPLICA_DROP:
        svc_repair_on_result(s, p, status, resp);
        break;
    case SVC_INT_EVICT_SCAN:
    case SVC_INT_EVICT:
        svc_evict_on_internal(s, p, status, resp);
        break;
    case SVC_INT_RESERVE:
        svc_put_on_reserve(s, p, status, resp);
        break;
    case SVC_INT_SEAL:
        svc_put_on_seal(s, p, status, resp);
        break;
    case SVC_INT_VERIFY_LOOKUP:
        svc_verify_on_lookup(s, p, status, resp);
        break;
    case SVC_INT_RESOLVE_SEAL:
    case SVC_INT_RESOLVE_REVOKE:
        if (p->internal == SVC_INT_RESOLVE_REVOKE)
            svc_put_revoking_done(s, p);
        svc_resolve_on_result(s, p, status, resp);
        break;
    case SVC_INT_INTENT_REVOKE:
        svc_put_revoking_done(s, p);
        break;
    default:
        break;
    }
}

static void merge_remove(struct kvp_master_service *s, struct svc_pending *p, Kvp__Response *resp)
{
    if (!resp->remove || !p->remove_status)
        return;
    int32_t *merged = calloc(p->n_remove ? p->n_remove : 1, sizeof(int32_t));
    if (!merged)
        return;
    size_t j = 0;
    for (size_t i = 0; i < p->n_remove; i++) {
        if (p->remove_status[i] == 1)
            merged[i] = j < resp->remove->n_status ? resp->remove->status[j++] : KVP_ERR_INTERNAL;
        else
            merged[i] = p->remove_status[i];
    }
    free(resp->remove->status);
    resp->remove->status = merged;
    resp->remove->n_status = p->n_remove;
    for (size_t i = 0; i < p->n_remove && i < p->n_keys; i++)
        if (merged[i] == KVP_OK) { /* gone: forget its soft state */
            svc_map_del(&s->last_access, p->key_hashes[i], NULL);
            svc_map_del(&s->leases, p->key_hashes[i], NULL);
        }
}

void svc_on_result(struct kvp_master_service *s, struct svc_pending *p, int kind, int status,
                   const uint8_t *data, size_t len)
{
    Kvp__Response *resp = NULL;
    if (status == KVP_OK && kind != KVP_RAFTLOG_EV_ADMIN && kind != 0) {
        /* A Response with every field at its default packs to zero bytes: that is a valid
         * "OK, no body" result, not a missing one. */
        static const uint8_t none[1];
        resp = kvp__response__unpack(NULL, len, data && len ? data : none);
        if (!resp) {
            kvp_log_error(s->actor, "corr %llu: state machine result failed to decode (%zu bytes)",
                          (unsigned long long)p->corr, len);
            status = KVP_ERR_INTERNAL;
        }
    }
    int st;
    uint64_t su;
    svc_metrics_begin(s, p->body_case, p->recv_us, &st, &su); /* the reply is counted under p's type */
    finish_result(s, p, kind, status, resp);
    svc_metrics_end(s, st, su);
    if (resp)
        kvp__response__free_unpacked(resp, NULL);
}

/* Everything after the FSM's answer: soft state, the reply. resp (NULL unless status is OK and
 * kind is not ADMIN) stays the caller's; its fields may be changed here. */
static void finish_result(struct kvp_master_service *s, struct svc_pending *p, int kind, int status,
                          Kvp__Response *resp)
{
    if (p->internal) {
        on_internal_result(s, p, status, resp);
        return;
    }
    if (p->body_case == KVP__REQUEST__BODY_MOUNT) /* before the deadline check: a resent copy
                                                   * of a call answered too late gets this id */
        mount_seen_result(s, p, status == KVP_OK && resp ? resp->status : status,
                          status == KVP_OK && resp && resp->mount ? resp->mount->segment_id : 0);
    if (p->hides) {
        for (size_t i = 0; i < p->n_remove && i < p->n_keys; i++)
            if (p->remove_status[i] == 1)
                svc_evict_unhide(s, p->key_hashes[i]);
        p->hides = false;
    }
    const struct svc_rpc *rpc = rpc_of(p->body_case);
    if (p->deadline_ms && svc_now_ms() > p->deadline_ms) {
        if (rpc && rpc->on_result && rpc->late_too && status == KVP_OK && kind != KVP_RAFTLOG_EV_ADMIN && resp)
            rpc->on_result(s, p, resp);
        kvp_log_debug(s->actor, "req %llu: result after the caller's deadline: dropped",
                      (unsigned long long)p->req_id);
        return;
    }
    if (status != KVP_OK || kind == KVP_RAFTLOG_EV_ADMIN) {
        const char *what = status == KVP_ERR_NOT_LEADER ? "not the leader" : status ? "raft log" : NULL;
        svc_reply_status(s, p->identity, p->req_id, status, what);
        return;
    }

    if (rpc && rpc->on_result)
        rpc->on_result(s, p, resp);
    svc_reply(s, p->identity, p->req_id, resp);
}
