/*
 * fsm_cmd.c — one handler per Raft command (docs/internals.md, "Master state machine").
 * Handlers put their result in the Response: single-target commands (mount, unmount, drain,
 * segment state/lost) in Response.status; batch commands per item in the body with
 * Response.status KVP_OK. A handler returns KVP_ERR_NOMEM only; every other outcome is a result.
 */
#include <stdlib.h>
#include <string.h>

#include "actors/master/fsm/fsm_internal.h"
#include "actors/master/fsm/version.h"
#include "kvpool.h"
#include "runtime/log.h"

typedef struct kvp_master_fsm fsm_t;
typedef struct kvp_fsm_seg seg_t;
typedef struct kvp_fsm_obj obj_t;

static int32_t *status_array(size_t n)
{
    return calloc(n ? n : 1, sizeof(int32_t));
}

static void seg_mark_lost(fsm_t *f, seg_t *s, uint64_t now_ms)
{
    uint64_t n = kvp_fsm_drop_segment_replicas(f, s, now_ms);
    kvp_fsm_resv_drop_all(s);
    kvp_alloc_fini(&s->alloc);
    free(s->q);
    s->q = NULL;
    s->q_head = s->q_len = s->q_cap = 0;
    s->quarantined_bytes = 0;
    s->used_bytes = 0;
    s->state = KVP__SEGMENT_STATE__SEGMENT_LOST;
    kvp_log_info(KVP_FSM_ACTOR, "segment %u (%s): lost; %llu objects removed or revoked", s->id,
                 s->name, (unsigned long long)n);
}

/* ---------------------------------------------------------------- segments */

#define KVP_FSM_MAX_SEGMENT_BYTES (64ull << 40) /* as config's global_segment_size bound */

/* "host:port", "[v6]:port", "[v6%scope]:port": a non-empty host and a port in 1..65535. */
static bool endpoint_ok(const char *ep)
{
    if (!ep || !ep[0])
        return false;
    const char *colon = strrchr(ep, ':');
    if (!colon || colon == ep || !colon[1] || strlen(colon + 1) > 5)
        return false;
    unsigned long port = 0;
    for (const char *p = colon + 1; *p; p++) {
        if (*p < '0' || *p > '9')
            return false;
        port = port * 10 + (unsigned long)(*p - '0');
    }
    return port >= 1 && port <= 65535;
}
#define KVP_FSM_MAX_PUT_TTL_MS (2ull * 3600 * 1000) /* above the 1 h transfer_timeout cap */

static int on_mount(fsm_t *f, const Kvp__Command *c, Kvp__Response *r)
{
    const Kvp__MountSegmentReq *m = c->mount;
    if (!m->name || !m->name[0])
        return kvp_fsm_resp_error(r, KVP_ERR_INVALID, "mount: empty segment name"), KVP_OK;
    if (m->size < KVP_FSM_ALIGN)
        return kvp_fsm_resp_error(r, KVP_ERR_INVALID, "mount %s: size %llu below %u bytes",
                                  m->name, (unsigned long long)m->size, KVP_FSM_ALIGN),
               KVP_OK;
    if (m->size > KVP_FSM_MAX_SEGMENT_BYTES)
        return kvp_fsm_resp_error(r, KVP_ERR_INVALID, "mount %s: size %llu above %llu bytes (64 TiB)",
                                  m->name, (unsigned long long)m->size,
                                  (unsigned long long)KVP_FSM_MAX_SEGMENT_BYTES),
               KVP_OK;
    if (!endpoint_ok(m->endpoint))
        return kvp_fsm_resp_error(r, KVP_ERR_INVALID, "mount %s: endpoint '%.200s' is not host:port",
                                  m->name, m->endpoint ? m->endpoint : ""),
               KVP_OK;
    if (f->n_segs_ids == UINT32_MAX)
        return kvp_fsm_resp_error(r, KVP_ERR_NO_SPACE, "mount %s: segment ids exhausted",
                                  m->name),
               KVP_OK;
    /* A live segment of the same name: the same host and endpoint means it restarted (the new
     * process holds its address), so the old one is lost; another address means a second
     * process claims a name in use, which must not wipe the live segment's objects. */
    const seg_t *same = kvp_fsm_seg_by_name(f, m->name);
    if (same && same->state != KVP__SEGMENT_STATE__SEGMENT_LOST &&
        (strcmp(same->endpoint, m->endpoint) != 0 || strcmp(same->host, m->host ? m->host : "") != 0)) {
        /* The same host: a successor of a process that may have died (restarted on a new port).
         * The body names the holder so that the leader's liveness rule can take this mount as
         * evidence that it hears that host (liveness.h rule 6). Not state: nothing changes. */
        if (strcmp(same->host, m->host ? m->host : "") == 0) {
            Kvp__MountSegmentResp *held = malloc(sizeof(*held));
            if (held) {
                kvp__mount_segment_resp__init(held);
                held->segment_id = same->id;
                r->body_case = KVP__RESPONSE__BODY_MOUNT;
                r->mount = held;
            }
        }
        return kvp_fsm_resp_error(r, KVP_ERR_EXISTS,
                                  "mount %s: name in use by segment %u at %s (host %s); it is free "
                                  "again once that segment unmounts or is declared lost",
                                  m->name, same->id, same->endpoint, same->host),
               KVP_OK;
    }
    Kvp__MountSegmentResp *body = malloc(sizeof(*body));
    seg_t *s = calloc(1, sizeof(*s));
    if (!body || !s)
        goto nomem;
    kvp__mount_segment_resp__init(body);
    s->name = kvp_fsm_strdup(m->name);
    s->host = kvp_fsm_strdup(m->host);
    s->endpoint = kvp_fsm_strdup(m->endpoint);
    if (!s->name || !s->host || !s->endpoint || kvp_alloc_init(&s->alloc, m->size))
        goto nomem;
    if (f->n_segs_ids == f->segs_cap) {
        uint32_t cap = f->segs_cap ? f->segs_cap * 2 : 16;
        seg_t **a = realloc(f->segs, cap * sizeof(*a));
        if (!a)
            goto nomem;
        f->segs = a;
        f->segs_cap = cap;
    }
    seg_t *old = kvp_fsm_seg_by_name(f, m->name);
    if (old) {
        kvp_log_info(KVP_FSM_ACTOR, "segment %u (%s): remounted, the old one is lost", old->id,
                     old->name);
        seg_mark_lost(f, old, c->now_wall_ms);
    }
    s->id = ++f->n_segs_ids;
    s->size = m->size;
    s->owner_pid = m->owner_pid;
    s->state = KVP__SEGMENT_STATE__SEGMENT_ACTIVE;
    f->segs[s->id - 1] = s;
    body->segment_id = s->id;
    r->body_case = KVP__RESPONSE__BODY_MOUNT;
    r->mount = body;
    kvp_log_info(KVP_FSM_ACTOR, "segment %u (%s, host %s, %s): mounted, %llu bytes", s->id,
                 s->name, s->host, s->endpoint, (unsigned long long)s->size);
    return KVP_OK;
nomem:
    free(body);
    kvp_fsm_seg_free(s);
    return KVP_ERR_NOMEM;
}

static int on_unmount(fsm_t *f, const Kvp__Command *c, Kvp__Response *r)
{
    uint32_t id = c->unmount->segment_id;
    seg_t *s = kvp_fsm_seg_get(f, id);
    if (!s)
        return kvp_fsm_resp_error(r, KVP_ERR_NOT_FOUND, "unmount: no segment %u", id), KVP_OK;
    uint64_t n = 0;
    if (s->state != KVP__SEGMENT_STATE__SEGMENT_LOST)
        n = kvp_fsm_drop_segment_replicas(f, s, c->now_wall_ms);
    kvp_log_info(KVP_FSM_ACTOR, "segment %u (%s): unmounted; %llu objects removed or revoked",
                 s->id, s->name, (unsigned long long)n);
    f->segs[id - 1] = NULL;
    kvp_fsm_seg_free(s);
    return KVP_OK;
}

static int on_drain(fsm_t *f, const Kvp__Command *c, Kvp__Response *r)
{
    const Kvp__DrainSegmentReq *d = c->drain;
    seg_t *s = d->segment_id ? kvp_fsm_seg_get(f, d->segment_id)
                             : (d->name && d->name[0] ? kvp_fsm_seg_by_name(f, d->name) : NULL);
    if (!s || s->state == KVP__SEGMENT_STATE__SEGMENT_LOST)
        return kvp_fsm_resp_error(r, KVP_ERR_NOT_FOUND, "drain: no live segment %u '%s'",
                                  d->segment_id, d->name ? d->name : ""),
               KVP_OK;
    Kvp__DrainSegmentResp *body = malloc(sizeof(*body));
    if (!body)
        return KVP_ERR_NOMEM;
    kvp__drain_segment_resp__init(body);
    body->segment_id = s->id;
    r->body_case = KVP__RESPONSE__BODY_DRAIN;
    r->drain = body;
    if (s->state != KVP__SEGMENT_STATE__SEGMENT_DRAINING)
        kvp_log_info(KVP_FSM_ACTOR, "segment %u (%s): draining", s->id, s->name);
    s->state = KVP__SEGMENT_STATE__SEGMENT_DRAINING;
    return KVP_OK;
}

static int on_segment_lost(fsm_t *f, const Kvp__Command *c, Kvp__Response *r)
{
    uint32_t id = c->segment_lost->segment_id;
    seg_t *s = kvp_fsm_seg_get(f, id);
    if (!s)
        return kvp_fsm_resp_error(r, KVP_ERR_NOT_FOUND, "segment lost: no segment %u", id),
               KVP_OK;
    if (s->state != KVP__SEGMENT_STATE__SEGMENT_LOST)
        seg_mark_lost(f, s, c->now_wall_ms);
    return KVP_OK;
}

static int on_segment_state(fsm_t *f, const Kvp__Command *c, Kvp__Response *r)
{
    uint32_t id = c->segment_state->segment_id;
    int st = c->segment_state->state;
    seg_t *s = kvp_fsm_seg_get(f, id);
    if (!s)
        return kvp_fsm_resp_error(r, KVP_ERR_NOT_FOUND, "segment state: no segment %u", id),
               KVP_OK;
    switch (st) {
    case KVP__SEGMENT_STATE__SEGMENT_LOST:
        if (s->state != KVP__SEGMENT_STATE__SEGMENT_LOST)
            seg_mark_lost(f, s, c->now_wall_ms);
        return KVP_OK;
    case KVP__SEGMENT_STATE__SEGMENT_ACTIVE:
    case KVP__SEGMENT_STATE__SEGMENT_DRAINING:
        if (s->state == KVP__SEGMENT_STATE__SEGMENT_LOST)
            return kvp_fsm_resp_error(r, KVP_ERR_INVALID,
                                      "segment %u is lost: it must mount again", id),
                   KVP_OK;
        s->state = st;
        return KVP_OK;
    default:
        return kvp_fsm_resp_error(r, KVP_ERR_INVALID, "segment state: bad state %d", st),
               KVP_OK;
    }
}

/* ---------------------------------------------------------------- PutStart */

/* Placement (docs/internals.md, PutStart): among the ACTIVE segments with a free extent of the
 * rounded size, in the order preferred segment first, avoided segments (PutStartReq.avoid_segments)
 * last, then most free bytes, then lowest id, the replicas go to the first segment of each host
 * (pass 1) and, when hosts run out, to the first segments not taken yet (pass 2).
 *
 * The order is total (ids are unique), so pass 1 picks, round after round, the first candidate
 * on a host not chosen yet, and pass 2 the first candidate not taken: a scan for the minimum
 * per replica gives exactly what sorting all candidates and walking them gave, in O(segments x
 * replicas) instead of O(segments log segments) comparisons through qsort per item (the sort
 * was ~45% of a PutStart's apply at 100 segments: docs/bench.md "Master scale").
 * test_fsm_place checks it against the sort on random states. */
struct cand {
    seg_t *s;
    uint64_t free_bytes; /* s->alloc.free_bytes, copied: compared in every round */
    uint32_t id;
    uint8_t rank;        /* 0 preferred, 1 preferred and avoided, 2 plain, 3 avoided */
    bool taken;
    bool host_taken;     /* on the host of a replica chosen: skipped by pass 1 only */
};

/* x before y in the placement order. */
static inline bool cand_before(const struct cand *x, const struct cand *y)
{
    if (x->rank != y->rank)
        return x->rank < y->rank;
    if (x->free_bytes != y->free_bytes)
        return x->free_bytes > y->free_bytes;
    return x->id < y->id;
}

/* The first candidate not taken (pass 1: nor on a chosen host), or NULL. */
static struct cand *cand_first(struct cand *cands, size_t n, bool pass1)
{
    struct cand *best = NULL;
    for (size_t i = 0; i < n; i++) {
        struct cand *c = &cands[i];
        if (c->taken || (pass1 && c->host_taken))
            continue;
        if (!best || cand_before(c, best))
            best = c;
    }
    return best;
}

/* Choose up to want segments for one object; returns how many (chosen[] in placement order). */
static unsigned cand_choose(struct cand *cands, size_t n, unsigned want, seg_t **chosen)
{
    unsigned k = 0;
    for (bool pass1 = true;; pass1 = false) {
        while (k < want) {
            struct cand *c = cand_first(cands, n, pass1);
            if (!c)
                break;
            chosen[k++] = c->s;
            c->taken = true;
            if (!pass1 || k == want)
                continue;
            const char *host = c->s->host;
            for (size_t i = 0; i < n; i++)
                if (!cands[i].taken && !cands[i].host_taken &&
                    (cands[i].s->host == host || strcmp(cands[i].s->host, host) == 0))
                    cands[i].host_taken = true;
        }
        if (k == want || !pass1)
            return k;
    }
}

static int fill_replicas(const fsm_t *f, const obj_t *o, Kvp__PutStartResult *res)
{
    res->replicas = calloc(o->n_replicas ? o->n_replicas : 1, sizeof(*res->replicas));
    if (!res->replicas)
        return KVP_ERR_NOMEM;
    for (unsigned i = 0; i < o->n_replicas; i++) {
        const seg_t *s = kvp_fsm_seg_get(f, o->rep[i].segment_id);
        res->replicas[i] = kvp_fsm_replica_msg(s, &o->rep[i]);
        if (!res->replicas[i])
            return KVP_ERR_NOMEM;
        res->n_replicas++;
    }
    return KVP_OK;
}

/* Returns KVP_ERR_NOMEM or KVP_OK with res->status set. cands: scratch of n_segs_ids. */
static int put_start_item(fsm_t *f, const Kvp__PutStartItem *it, uint64_t deadline,
                          uint64_t term, const uint32_t *avoid, size_t n_avoid, struct cand *cands,
                          Kvp__PutStartResult *res)
{
    size_t klen;
    if (!kvp_fsm_key_valid(it->key, &klen) || it->size == 0 ||
        it->replica_num > KVP_FSM_MAX_REPLICAS) {
        res->status = KVP_ERR_INVALID;
        return KVP_OK;
    }
    obj_t *o = kvp_fsm_obj_find_mut(f, it->key, klen);
    if (o) {
        if (o->state == KVP_FSM_OBJ_PENDING && o->op_id == it->op_id) {
            res->status = KVP_OK;
            return fill_replicas(f, o, res);
        }
        res->status = KVP_ERR_EXISTS;
        return KVP_OK;
    }
    uint64_t need = kvp_alloc_round(it->size);
    unsigned want = it->replica_num ? it->replica_num : 1;
    size_t n = 0;
    bool any_active = false, any_big = false;
    for (uint32_t i = 0; i < f->n_segs_ids; i++) {
        seg_t *s = f->segs[i];
        if (!s || s->state != KVP__SEGMENT_STATE__SEGMENT_ACTIVE)
            continue;
        any_active = true;
        if (need && s->alloc.capacity >= need)
            any_big = true;
        if (need && kvp_alloc_largest_free(&s->alloc) >= need) {
            bool preferred = it->preferred_segment && it->preferred_segment[0] &&
                             strcmp(s->name, it->preferred_segment) == 0;
            bool avoided = false;
            for (size_t a = 0; a < n_avoid && !avoided; a++)
                avoided = avoid[a] == s->id;
            cands[n] = (struct cand){.s = s, .free_bytes = s->alloc.free_bytes, .id = s->id,
                                     .rank = (uint8_t)((preferred ? 0 : 2) + (avoided ? 1 : 0))};
            n++;
        }
    }
    if (any_active && !any_big) {
        res->status = KVP_ERR_TOO_LARGE;
        return KVP_OK;
    }
    if (n == 0) {
        res->status = KVP_ERR_NO_SPACE;
        return KVP_OK;
    }
    seg_t *chosen[KVP_FSM_MAX_REPLICAS];
    unsigned k = cand_choose(cands, n, want, chosen);
    o = kvp_fsm_obj_alloc(it->key, klen, k);
    if (!o)
        return KVP_ERR_NOMEM;
    o->size = it->size;
    o->op_id = it->op_id;
    o->term = term;
    o->u.deadline_ms = deadline;
    o->soft_pin = it->soft_pin;
    o->pad[0] = (uint8_t)want;
    o->state = KVP_FSM_OBJ_PENDING;
    for (unsigned i = 0; i < k; i++) {
        uint64_t off = 0;
        int rc = kvp_alloc_alloc(&chosen[i]->alloc, need, &off);
        if (rc != KVP_OK) { /* cannot happen: largest_free >= need was checked */
            kvp_log_error(KVP_FSM_ACTOR, "segment %u: alloc %llu: %d after a fit check",
                          chosen[i]->id, (unsigned long long)need, rc);
            for (unsigned j = 0; j < i; j++)
                kvp_alloc_free(&chosen[j]->alloc, o->rep[j].offset, need);
            free(o);
            res->status = KVP_ERR_INTERNAL;
            return KVP_OK;
        }
        o->rep[i] = (struct kvp_fsm_replica){.segment_id = chosen[i]->id,
                                             .state = KVP__REPLICA_STATE__REPLICA_PENDING,
                                             .offset = off};
    }
    if (kvp_fsm_obj_insert(f, o) != KVP_OK) {
        for (unsigned j = 0; j < k; j++)
            kvp_alloc_free(&chosen[j]->alloc, o->rep[j].offset, need);
        free(o);
        return KVP_ERR_NOMEM;
    }
    if (kvp_fsm_pending_add(f, o) != KVP_OK) {
        kvp_fsm_obj_unlink(f, o);
        for (unsigned j = 0; j < k; j++)
            kvp_alloc_free(&chosen[j]->alloc, o->rep[j].offset, need);
        free(o);
        return KVP_ERR_NOMEM;
    }
    for (unsigned j = 0; j < k; j++) {
        chosen[j]->used_bytes += need;
        chosen[j]->n_replicas++;
    }
    res->status = KVP_OK;
    return fill_replicas(f, o, res);
}

static int on_put_start(fsm_t *f, const Kvp__Command *c, Kvp__Response *r)
{
    const Kvp__PutStartReq *q = c->put_start;
    /* A client's ttl covers its call timeout (transfer_timeout is at most 1 h) plus a margin;
     * anything longer would pin space and the key for good, so it is capped. */
    uint64_t ttl = q->ttl_ms ? q->ttl_ms : f->params.put_ttl_ms;
    if (ttl > KVP_FSM_MAX_PUT_TTL_MS)
        ttl = KVP_FSM_MAX_PUT_TTL_MS;
    uint64_t deadline = c->now_wall_ms > UINT64_MAX - ttl ? UINT64_MAX : c->now_wall_ms + ttl;
    Kvp__PutStartResp *body = malloc(sizeof(*body));
    if (!body)
        return KVP_ERR_NOMEM;
    kvp__put_start_resp__init(body);
    r->body_case = KVP__RESPONSE__BODY_PUT_START;
    r->put_start = body;
    body->results = calloc(q->n_items ? q->n_items : 1, sizeof(*body->results));
    struct cand *cands = malloc((f->n_segs_ids ? f->n_segs_ids : 1) * sizeof(*cands));
    int rc = KVP_OK;
    if (!body->results || !cands) {
        free(cands);
        return KVP_ERR_NOMEM;
    }
    /* The avoid list counts only in a command stamped with its feature level (version.h): a
     * v0.1.0 leader passes a new client's avoid list through into its log as an unknown field,
     * and its v0.1.0 members place without it; so must every member here. */
    size_t n_avoid = c->feature_level >= KVP_FEATURE_AVOID_SEGMENTS ? q->n_avoid_segments : 0;
    for (size_t i = 0; i < q->n_items && rc == KVP_OK; i++) {
        Kvp__PutStartResult *res = malloc(sizeof(*res));
        if (!res) {
            rc = KVP_ERR_NOMEM;
            break;
        }
        kvp__put_start_result__init(res);
        body->results[body->n_results++] = res;
        rc = put_start_item(f, q->items[i], deadline, c->term, q->avoid_segments, n_avoid < 16 ? n_avoid : 16,
                            cands, res);
    }
    free(cands);
    return rc;
}

/* ---------------------------------------------------------------- PutEnd / PutRevoke */

Kvp__PutEndResp *kvp_fsm_put_end_body(Kvp__Response *r, size_t n)
{
    Kvp__PutEndResp *body = malloc(sizeof(*body));
    if (!body)
        return NULL;
    kvp__put_end_resp__init(body);
    r->body_case = KVP__RESPONSE__BODY_PUT_END;
    r->put_end = body; /* freed with r from here on */
    if (!(body->status = status_array(n)))
        return NULL;
    body->n_status = n;
    return body;
}

static int on_put_end(fsm_t *f, const Kvp__Command *c, Kvp__Response *r)
{
    const Kvp__PutEndReq *q = c->put_end;
    Kvp__PutEndResp *body = kvp_fsm_put_end_body(r, q->n_items);
    if (!body)
        return KVP_ERR_NOMEM;
    for (size_t i = 0; i < q->n_items; i++) {
        const Kvp__PutEndItem *it = q->items[i];
        size_t klen;
        if (!kvp_fsm_key_valid(it->key, &klen)) {
            body->status[i] = KVP_ERR_INVALID;
            continue;
        }
        obj_t *o = kvp_fsm_obj_find_mut(f, it->key, klen);
        if (!o) {
            body->status[i] = KVP_ERR_NOT_FOUND;
        } else if (o->op_id != it->op_id) {
            body->status[i] = KVP_ERR_EXISTS;
        } else if (o->state == KVP_FSM_OBJ_COMPLETE) {
            body->status[i] = KVP_OK; /* retried PutEnd */
        } else if (o->state == KVP_FSM_OBJ_INTENT) {
            /* Level 6: an intent is sealed by a PutEnd of its op_id and checksum as by a
             * PutSealCmd (only a level-6 member holds intents). */
            body->status[i] = kvp_fsm_intent_seal(f, o, it->op_id, it->checksum);
        } else {
            kvp_fsm_pending_del(f, o);
            o->state = KVP_FSM_OBJ_COMPLETE;
            o->u.checksum = it->checksum;
            bool repair = o->n_replicas < KVP_FSM_OBJ_WANT(o);
            for (unsigned k = 0; k < o->n_replicas; k++) {
                o->rep[k].state = KVP__REPLICA_STATE__REPLICA_COMPLETE;
                const struct kvp_fsm_seg *sg = kvp_fsm_seg_get(f, o->rep[k].segment_id);
                if (!sg || sg->state != KVP__SEGMENT_STATE__SEGMENT_ACTIVE)
                    repair = true; /* placed before its segment began draining or was lost */
            }
            if (repair)
                f->repair_epoch++; /* a complete object short of copies: repair work */
            if (o->soft_pin)
                f->pinned_bytes += o->size;
            kvp_fsm_tenant_count(f, o, +1);
            body->status[i] = KVP_OK;
        }
    }
    return KVP_OK;
}

static int on_put_revoke(fsm_t *f, const Kvp__Command *c, Kvp__Response *r)
{
    const Kvp__PutRevokeReq *q = c->put_revoke;
    Kvp__PutRevokeResp *body = malloc(sizeof(*body));
    if (!body)
        return KVP_ERR_NOMEM;
    kvp__put_revoke_resp__init(body);
    r->body_case = KVP__RESPONSE__BODY_PUT_REVOKE;
    r->put_revoke = body;
    if (!(body->status = status_array(q->n_items)))
        return KVP_ERR_NOMEM;
    body->n_status = q->n_items;
    for (size_t i = 0; i < q->n_items; i++) {
        const Kvp__PutRevokeItem *it = q->items[i];
        size_t klen;
        if (!kvp_fsm_key_valid(it->key, &klen)) {
            body->status[i] = KVP_ERR_INVALID;
            continue;
        }
        obj_t *o = kvp_fsm_obj_find_mut(f, it->key, klen);
        /* A pending put, or (level 6) a pending intent: the leader revokes one whose client gave
         * up or whose bytes a new leader could not verify. */
        if (!o || (o->state != KVP_FSM_OBJ_PENDING && o->state != KVP_FSM_OBJ_INTENT) || o->op_id != it->op_id) {
            body->status[i] = KVP_ERR_NOT_FOUND;
            continue;
        }
        if (o->state == KVP_FSM_OBJ_INTENT)
            kvp_log_info(KVP_FSM_ACTOR, "intent of %s (op %llx) revoked", it->key, (unsigned long long)o->op_id);
        kvp_fsm_obj_destroy(f, o, c->now_wall_ms);
        body->status[i] = KVP_OK;
    }
    return KVP_OK;
}

/* ---------------------------------------------------------------- Remove / Evict */

/* Remove (and Evict, which is Remove chosen by the service): complete → quarantined. */
static int remove_keys(fsm_t *f, char **keys, size_t n, uint64_t now_ms, Kvp__Response *r)
{
    Kvp__RemoveResp *body = malloc(sizeof(*body));
    if (!body)
        return KVP_ERR_NOMEM;
    kvp__remove_resp__init(body);
    r->body_case = KVP__RESPONSE__BODY_REMOVE;
    r->remove = body;
    if (!(body->status = status_array(n)))
        return KVP_ERR_NOMEM;
    body->n_status = n;
    for (size_t i = 0; i < n; i++) {
        size_t klen;
        if (!kvp_fsm_key_valid(keys[i], &klen)) {
            body->status[i] = KVP_ERR_INVALID;
            continue;
        }
        obj_t *o = kvp_fsm_obj_find_mut(f, keys[i], klen);
        if (!o) {
            body->status[i] = KVP_ERR_NOT_FOUND;
        } else if (o->state == KVP_FSM_OBJ_PENDING || o->state == KVP_FSM_OBJ_INTENT) {
            body->status[i] = KVP_ERR_BUSY;
        } else {
            kvp_fsm_obj_destroy(f, o, now_ms);
            body->status[i] = KVP_OK;
        }
    }
    return KVP_OK;
}

static int count_body(Kvp__Response *r, uint64_t n)
{
    Kvp__RemoveAllResp *body = malloc(sizeof(*body));
    if (!body)
        return KVP_ERR_NOMEM;
    kvp__remove_all_resp__init(body);
    body->removed = n;
    r->body_case = KVP__RESPONSE__BODY_REMOVE_ALL;
    r->remove_all = body;
    return KVP_OK;
}

static int on_remove_all(fsm_t *f, const Kvp__Command *c, Kvp__Response *r)
{
    uint64_t n = 0, cap = f->n_objects - f->n_pending - f->n_intents;
    obj_t **v = malloc((cap ? cap : 1) * sizeof(*v));
    if (!v)
        return KVP_ERR_NOMEM;
    for (uint64_t i = 0; i < f->tab_cap && n < cap; i++)
        if (f->tab[i] && f->tab[i]->state == KVP_FSM_OBJ_COMPLETE)
            v[n++] = f->tab[i];
    for (uint64_t i = 0; i < n; i++)
        kvp_fsm_obj_destroy(f, v[i], c->now_wall_ms);
    free(v);
    if (n)
        kvp_log_info(KVP_FSM_ACTOR, "remove all: %llu objects", (unsigned long long)n);
    return count_body(r, n);
}

/* ---------------------------------------------------------------- timers' commands */

static int on_revoke_expired(fsm_t *f, const Kvp__Command *c, Kvp__Response *r)
{
    uint64_t n = 0;
    for (uint64_t i = 0; i < f->n_pending;) {
        obj_t *o = f->pending[i];
        if (o->u.deadline_ms < c->now_wall_ms) {
            kvp_fsm_obj_destroy(f, o, c->now_wall_ms); /* swaps the last one into i */
            n++;
        } else {
            i++;
        }
    }
    if (n)
        kvp_log_info(KVP_FSM_ACTOR, "revoked %llu expired pending puts", (unsigned long long)n);
    /* Reservations (feature level 3) retire at the same tick: none exist on a member or in a
     * log that never had level 3, so this changes nothing for an older cluster. */
    uint64_t nr = kvp_fsm_resv_retire(f, c->now_wall_ms);
    if (nr)
        kvp_log_info(KVP_FSM_ACTOR, "retired %llu reservations", (unsigned long long)nr);
    return count_body(r, n);
}

static int on_quarantine_release(fsm_t *f, const Kvp__Command *c, Kvp__Response *r)
{
    uint64_t n = 0, grace = f->params.fence_grace_ms, now = c->now_wall_ms;
    if (now >= grace) {
        uint64_t limit = now - grace; /* freed_at + grace <= now */
        for (uint32_t i = 0; i < f->n_segs_ids; i++) {
            seg_t *s = f->segs[i];
            if (!s || s->state == KVP__SEGMENT_STATE__SEGMENT_LOST)
                continue;
            /* From the head: entries are in time order at every level (kvp_fsm_quarantine_push),
             * so every due entry is in the prefix. Below level 5 an entry's time was clamped to
             * the one before it (the FIFO); from level 5 it is its own, and this frees each
             * entry at its own time wherever it was pushed: on every member the same extents in
             * the same apply (the set of due entries; first fit depends on the free set only). */
            while (s->q_head < s->q_len && s->q[s->q_head].freed_at_ms <= limit) {
                struct kvp_fsm_quar *e = &s->q[s->q_head];
                int rc = kvp_alloc_free(&s->alloc, e->offset, e->len);
                if (rc == KVP_ERR_NOMEM)
                    return KVP_ERR_NOMEM; /* entry stays; the next release retries */
                if (rc != KVP_OK)
                    kvp_log_error(KVP_FSM_ACTOR, "segment %u: release %llu+%llu: %d", s->id,
                                  (unsigned long long)e->offset, (unsigned long long)e->len,
                                  rc);
                s->quarantined_bytes -= e->len;
                s->q_head++;
                n++;
            }
            if (s->q_head == s->q_len)
                s->q_head = s->q_len = 0;
        }
    }
    return count_body(r, n);
}

/* ---------------------------------------------------------------- dispatch */

int kvp_fsm_apply_cmd(fsm_t *f, const Kvp__Command *c, Kvp__Response *r)
{
    /* The oneof members share one union: a set case with a NULL member is a caller bug. */
    if (c->body_case != KVP__COMMAND__BODY__NOT_SET && !c->mount) {
        kvp_log_warn(KVP_FSM_ACTOR, "apply: command body %d without a message", (int)c->body_case);
        return KVP_ERR_INVALID;
    }
    /* A command logged by a newer leader for a newer cluster: applying it this binary's way
     * could place or remove differently from the members that understand it. Refuse, loudly. */
    if (c->feature_level > KVP_FEATURE_LEVEL) {
        kvp_log_error(KVP_FSM_ACTOR, "apply: command (body %d) needs feature level %u, this master has %u: "
                      "not applied; upgrade this master (docs/operations.md \"Upgrading\")",
                      (int)c->body_case, (unsigned)c->feature_level, (unsigned)KVP_FEATURE_LEVEL);
        return KVP_ERR_VERSION;
    }
    /* The repair scan is skipped while nothing could have created work since a scan that found
     * none (kvp_master_fsm_repair_epoch). Commands that can only take objects away, free space
     * or touch pending puts leave the epoch; PutEnd bumps it itself for an object completed
     * short of copies; every other command bumps it. */
    switch (c->body_case) {
    case KVP__COMMAND__BODY_PUT_START:
    case KVP__COMMAND__BODY_PUT_END:
    case KVP__COMMAND__BODY_PUT_REVOKE:
    case KVP__COMMAND__BODY_REMOVE:
    case KVP__COMMAND__BODY_REMOVE_ALL:
    case KVP__COMMAND__BODY_REVOKE_EXPIRED:
    case KVP__COMMAND__BODY_EVICT:
    case KVP__COMMAND__BODY_QUARANTINE_RELEASE:
    case KVP__COMMAND__BODY_RESERVE:
    case KVP__COMMAND__BODY_PUT_COMMIT:
    case KVP__COMMAND__BODY_RAISE_LEVEL:
    case KVP__COMMAND__BODY_PUT_SEAL: /* bumps it itself for an object sealed short of copies */
        break;
    default:
        f->repair_epoch++;
        break;
    }
    switch (c->body_case) {
    case KVP__COMMAND__BODY_MOUNT:
        return on_mount(f, c, r);
    case KVP__COMMAND__BODY_UNMOUNT:
        return on_unmount(f, c, r);
    case KVP__COMMAND__BODY_PUT_START:
        return on_put_start(f, c, r);
    case KVP__COMMAND__BODY_PUT_END:
        return on_put_end(f, c, r);
    case KVP__COMMAND__BODY_PUT_REVOKE:
        return on_put_revoke(f, c, r);
    case KVP__COMMAND__BODY_REMOVE:
        return remove_keys(f, c->remove->keys, c->remove->n_keys, c->now_wall_ms, r);
    case KVP__COMMAND__BODY_REMOVE_ALL:
        return on_remove_all(f, c, r);
    case KVP__COMMAND__BODY_DRAIN:
        return on_drain(f, c, r);
    case KVP__COMMAND__BODY_SEGMENT_LOST:
        return on_segment_lost(f, c, r);
    case KVP__COMMAND__BODY_SEGMENT_STATE:
        return on_segment_state(f, c, r);
    case KVP__COMMAND__BODY_REVOKE_EXPIRED:
        return on_revoke_expired(f, c, r);
    case KVP__COMMAND__BODY_EVICT:
        return remove_keys(f, c->evict->keys, c->evict->n_keys, c->now_wall_ms, r);
    case KVP__COMMAND__BODY_REPAIR_START:
        return kvp_fsm_repair_start(f, c, r);
    case KVP__COMMAND__BODY_REPAIR_END:
        return kvp_fsm_repair_end(f, c, r);
    case KVP__COMMAND__BODY_REPLICA_DROP:
        return kvp_fsm_replica_drop(f, c, r);
    case KVP__COMMAND__BODY_QUARANTINE_RELEASE:
        return on_quarantine_release(f, c, r);
    case KVP__COMMAND__BODY_RESERVE:
        return kvp_fsm_reserve(f, c, r);
    case KVP__COMMAND__BODY_PUT_COMMIT:
        return kvp_fsm_put_commit(f, c, r);
    case KVP__COMMAND__BODY_RAISE_LEVEL:
        return kvp_fsm_raise_level(f, c, r);
    case KVP__COMMAND__BODY_PUT_SEAL:
        return kvp_fsm_put_seal(f, c, r);
    default:
        kvp_log_warn(KVP_FSM_ACTOR, "apply: unknown command body %d: ignored", (int)c->body_case);
        return KVP_ERR_INVALID;
    }
}
