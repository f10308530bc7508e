/*
 * fsm_query.c — read-only queries (docs/internals.md, "Master state machine", Queries):
 * GetReplicaList, Exists, GetSize, ClusterStatus, and Heartbeat (the segment's state as the
 * FSM knows it, so the service can answer NOT_FOUND to a lost segment).
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "actors/master/fsm/evict_policy.h"
#include "actors/master/fsm/fsm_internal.h"
#include "kvpool.h"
#include "runtime/log.h"

typedef struct kvp_master_fsm fsm_t;

/* A complete object, or (the leader's reads, level 6) an intent the caller's `vis` says it
 * acknowledged: sealed in its memory, its PutSealCmd not applied yet. */
static const struct kvp_fsm_obj *find_complete(const fsm_t *f, const char *key, int *status,
                                               const struct kvp_fsm_qvis *vis)
{
    size_t klen;
    if (!kvp_fsm_key_valid(key, &klen)) {
        *status = KVP_ERR_INVALID;
        return NULL;
    }
    const struct kvp_fsm_obj *o = kvp_fsm_obj_find(f, key, klen);
    bool sealed = o && o->state == KVP_FSM_OBJ_INTENT && vis && vis->sealed &&
                  vis->sealed(vis->arg, key, o->op_id, o->u.checksum);
    if (!o || (o->state != KVP_FSM_OBJ_COMPLETE && !sealed)) {
        *status = KVP_ERR_NOT_FOUND;
        return NULL;
    }
    *status = KVP_OK;
    return o;
}

/* Replica order for a reader: ACTIVE before DRAINING, then same host first, then as stored. */
static int replica_rank(const struct kvp_fsm_seg *s, const char *client_host)
{
    int rank = s->state == KVP__SEGMENT_STATE__SEGMENT_ACTIVE ? 0 : 2;
    if (!client_host || !client_host[0] || strcmp(s->host, client_host) != 0)
        rank += 1;
    return rank;
}

static int object_info(const fsm_t *f, const char *key, const char *client_host,
                       Kvp__ObjectInfo *info, const struct kvp_fsm_qvis *vis)
{
    int st;
    const struct kvp_fsm_obj *o = find_complete(f, key, &st, vis);
    if (!o) {
        info->status = st;
        return KVP_OK;
    }
    info->replicas = calloc(o->n_replicas ? o->n_replicas : 1, sizeof(*info->replicas));
    if (!info->replicas)
        return KVP_ERR_NOMEM;
    /* DRAINING replicas are listed only when no ACTIVE complete replica exists (C4). */
    int max_rank = 4;
    for (unsigned i = 0; i < o->n_replicas && max_rank == 4; i++) {
        const struct kvp_fsm_seg *s = kvp_fsm_seg_get(f, o->rep[i].segment_id);
        if (s && s->state == KVP__SEGMENT_STATE__SEGMENT_ACTIVE &&
            o->rep[i].state == KVP__REPLICA_STATE__REPLICA_COMPLETE)
            max_rank = 2;
    }
    for (int rank = 0; rank < max_rank; rank++) {
        for (unsigned i = 0; i < o->n_replicas; i++) {
            const struct kvp_fsm_seg *s = kvp_fsm_seg_get(f, o->rep[i].segment_id);
            if (!s || s->state == KVP__SEGMENT_STATE__SEGMENT_LOST ||
                o->rep[i].state != KVP__REPLICA_STATE__REPLICA_COMPLETE ||
                replica_rank(s, client_host) != rank)
                continue;
            Kvp__Replica *m = kvp_fsm_replica_msg(s, &o->rep[i]);
            if (!m)
                return KVP_ERR_NOMEM;
            info->replicas[info->n_replicas++] = m;
        }
    }
    if (info->n_replicas == 0) {
        info->status = KVP_ERR_NOT_FOUND;
        return KVP_OK;
    }
    info->status = KVP_OK;
    info->size = o->size;
    info->checksum = o->u.checksum;
    return KVP_OK;
}

static int q_get_replicas(const fsm_t *f, const Kvp__GetReplicaListReq *q, Kvp__Response *r,
                          const struct kvp_fsm_qvis *vis)
{
    Kvp__GetReplicaListResp *body = malloc(sizeof(*body));
    if (!body)
        return KVP_ERR_NOMEM;
    kvp__get_replica_list_resp__init(body);
    r->body_case = KVP__RESPONSE__BODY_GET_REPLICAS;
    r->get_replicas = body;
    body->objects = calloc(q->n_keys ? q->n_keys : 1, sizeof(*body->objects));
    if (!body->objects)
        return KVP_ERR_NOMEM;
    for (size_t i = 0; i < q->n_keys; i++) {
        Kvp__ObjectInfo *info = malloc(sizeof(*info));
        if (!info)
            return KVP_ERR_NOMEM;
        kvp__object_info__init(info);
        body->objects[body->n_objects++] = info;
        int rc = object_info(f, q->keys[i], q->client_host, info, vis);
        if (rc)
            return rc;
    }
    return KVP_OK;
}

static int q_exists(const fsm_t *f, const Kvp__ExistsReq *q, Kvp__Response *r, const struct kvp_fsm_qvis *vis)
{
    Kvp__ExistsResp *body = malloc(sizeof(*body));
    if (!body)
        return KVP_ERR_NOMEM;
    kvp__exists_resp__init(body);
    r->body_case = KVP__RESPONSE__BODY_EXISTS;
    r->exists = body;
    body->results = calloc(q->n_keys ? q->n_keys : 1, sizeof(*body->results));
    if (!body->results)
        return KVP_ERR_NOMEM;
    body->n_results = q->n_keys;
    for (size_t i = 0; i < q->n_keys; i++) {
        int st;
        const struct kvp_fsm_obj *o = find_complete(f, q->keys[i], &st, vis);
        body->results[i] = o ? 1 : (st == KVP_ERR_NOT_FOUND ? 0 : st);
    }
    return KVP_OK;
}

static int q_get_size(const fsm_t *f, const Kvp__GetSizeReq *q, Kvp__Response *r, const struct kvp_fsm_qvis *vis)
{
    Kvp__GetSizeResp *body = malloc(sizeof(*body));
    if (!body)
        return KVP_ERR_NOMEM;
    kvp__get_size_resp__init(body);
    r->body_case = KVP__RESPONSE__BODY_GET_SIZE;
    r->get_size = body;
    body->sizes = calloc(q->n_keys ? q->n_keys : 1, sizeof(*body->sizes));
    if (!body->sizes)
        return KVP_ERR_NOMEM;
    body->n_sizes = q->n_keys;
    for (size_t i = 0; i < q->n_keys; i++) {
        int st;
        const struct kvp_fsm_obj *o = find_complete(f, q->keys[i], &st, vis);
        body->sizes[i] = o ? (int64_t)o->size : st;
    }
    return KVP_OK;
}

static int q_heartbeat(const fsm_t *f, const Kvp__HeartbeatReq *q, Kvp__Response *r)
{
    const struct kvp_fsm_seg *s = kvp_fsm_seg_get(f, q->segment_id);
    if (!s || s->state == KVP__SEGMENT_STATE__SEGMENT_LOST) {
        kvp_fsm_resp_error(r, KVP_ERR_NOT_FOUND, "segment %u unknown or lost: mount again",
                           q->segment_id);
        return KVP_OK;
    }
    Kvp__HeartbeatResp *body = malloc(sizeof(*body));
    if (!body)
        return KVP_ERR_NOMEM;
    kvp__heartbeat_resp__init(body);
    body->state = (Kvp__SegmentState)s->state;
    r->body_case = KVP__RESPONSE__BODY_HEARTBEAT;
    r->heartbeat = body;
    return KVP_OK;
}

static const char *seg_state_name(int st)
{
    switch (st) {
    case KVP__SEGMENT_STATE__SEGMENT_ACTIVE:
        return "ACTIVE";
    case KVP__SEGMENT_STATE__SEGMENT_DRAINING:
        return "DRAINING";
    default:
        return "LOST";
    }
}

/* json_object_set_new on a fresh object fails only on allocation failure; one check at the end
 * (json_dumps of a partial tree) is replaced by counting failures here. */
static int jset(json_t *o, const char *k, json_t *v)
{
    return v ? json_object_set_new(o, k, v) : -1;
}

static json_t *status_json(const fsm_t *f)
{
    json_t *root = json_object(), *segs = json_array();
    int bad = (!root || !segs);
    for (uint32_t i = 0; i < f->n_segs_ids && !bad; i++) {
        const struct kvp_fsm_seg *s = f->segs[i];
        if (!s)
            continue;
        json_t *j = json_object();
        if (!j) {
            bad = 1;
            break;
        }
        bad |= jset(j, "id", json_integer(s->id));
        bad |= jset(j, "name", json_string(s->name));
        bad |= jset(j, "host", json_string(s->host));
        bad |= jset(j, "endpoint", json_string(s->endpoint));
        bad |= jset(j, "owner_pid", json_integer((json_int_t)s->owner_pid));
        bad |= jset(j, "size", json_integer((json_int_t)s->size));
        bad |= jset(j, "used", json_integer((json_int_t)s->used_bytes));
        bad |= jset(j, "quarantined", json_integer((json_int_t)s->quarantined_bytes));
        bad |= jset(j, "free", json_integer((json_int_t)s->alloc.free_bytes));
        bad |= jset(j, "state", json_string(seg_state_name(s->state)));
        bad |= jset(j, "objects", json_integer((json_int_t)s->n_replicas));
        bad |= jset(j, "free_extents", json_integer((json_int_t)s->alloc.n_free));
        bad |= jset(j, "largest_free",
                    json_integer((json_int_t)kvp_alloc_largest_free(&s->alloc)));
        bad |= json_array_append_new(segs, j);
    }
    struct kvp_master_fsm_stats st;
    kvp_master_fsm_stats(f, &st);
    if (!bad) {
        bad |= jset(root, "segments", segs);
        segs = NULL;
        bad |= jset(root, "objects", json_integer((json_int_t)st.objects));
        bad |= jset(root, "pending_puts", json_integer((json_int_t)st.pending_puts));
        bad |= jset(root, "capacity_bytes", json_integer((json_int_t)st.capacity_bytes));
        bad |= jset(root, "used_bytes", json_integer((json_int_t)st.used_bytes));
        bad |= jset(root, "quarantined_bytes", json_integer((json_int_t)st.quarantined_bytes));
        bad |= jset(root, "pinned_bytes", json_integer((json_int_t)st.pinned_bytes));
    }
    json_decref(segs);
    if (bad) {
        json_decref(root);
        return NULL;
    }
    return root;
}

static int q_cluster_status(const fsm_t *f, Kvp__Response *r)
{
    json_t *root = status_json(f);
    if (!root)
        return KVP_ERR_NOMEM;
    char *txt = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    Kvp__ClusterStatusResp *body = malloc(sizeof(*body));
    if (!txt || !body) {
        free(txt);
        free(body);
        return KVP_ERR_NOMEM;
    }
    kvp__cluster_status_resp__init(body);
    body->json = txt;
    r->body_case = KVP__RESPONSE__BODY_CLUSTER_STATUS;
    r->cluster_status = body;
    return KVP_OK;
}

int kvp_fsm_query_req(const fsm_t *f, const Kvp__Request *req, Kvp__Response *r, const struct kvp_fsm_qvis *vis)
{
    if (req->body_case != KVP__REQUEST__BODY__NOT_SET && !req->mount) {
        kvp_log_warn(KVP_FSM_ACTOR, "query: request body %d without a message",
                     (int)req->body_case);
        return KVP_ERR_INVALID;
    }
    switch (req->body_case) {
    case KVP__REQUEST__BODY_GET_REPLICAS:
        return q_get_replicas(f, req->get_replicas, r, vis);
    case KVP__REQUEST__BODY_EXISTS:
        return q_exists(f, req->exists, r, vis);
    case KVP__REQUEST__BODY_GET_SIZE:
        return q_get_size(f, req->get_size, r, vis);
    case KVP__REQUEST__BODY_CLUSTER_STATUS:
        return q_cluster_status(f, r);
    case KVP__REQUEST__BODY_REPAIR_SCAN:
        return kvp_fsm_repair_scan(f, req->repair_scan, r);
    case KVP__REQUEST__BODY_HEARTBEAT:
        return q_heartbeat(f, req->heartbeat, r);
    case KVP__REQUEST__BODY_EVICT_SCAN: /* the leader's own eviction scan (evict_policy.c) */
        return kvp_evict_scan(f, req->evict_scan, r);
    default:
        kvp_log_warn(KVP_FSM_ACTOR, "query: request body %d is not a query", (int)req->body_case);
        return KVP_ERR_INVALID;
    }
}

/* ------------------------------------------------------------------ leader's local reads */

bool kvp_master_fsm_key_present(const struct kvp_master_fsm *f, const char *key)
{
    size_t klen;
    return key && kvp_fsm_key_valid(key, &klen) && kvp_fsm_obj_find(f, key, klen) != NULL;
}

bool kvp_master_fsm_segment_space(const struct kvp_master_fsm *f, uint32_t id, uint64_t *size, uint64_t *largest_free)
{
    const struct kvp_fsm_seg *s = kvp_fsm_seg_get(f, id);
    if (!s || s->state != KVP__SEGMENT_STATE__SEGMENT_ACTIVE)
        return false;
    *size = s->size;
    *largest_free = kvp_alloc_largest_free(&s->alloc);
    return true;
}

uint32_t kvp_master_fsm_segment_id(const struct kvp_master_fsm *f, const char *name)
{
    const struct kvp_fsm_seg *s = name && name[0] ? kvp_fsm_seg_by_name(f, name) : NULL;
    return s && s->state == KVP__SEGMENT_STATE__SEGMENT_ACTIVE ? s->id : 0;
}

bool kvp_master_fsm_segment_addr(const struct kvp_master_fsm *f, uint32_t id, const char **host,
                                 const char **endpoint, uint64_t *owner_pid)
{
    const struct kvp_fsm_seg *s = kvp_fsm_seg_get(f, id);
    if (!s || s->state != KVP__SEGMENT_STATE__SEGMENT_ACTIVE)
        return false;
    *host = s->host;
    *endpoint = s->endpoint;
    *owner_pid = s->owner_pid;
    return true;
}
