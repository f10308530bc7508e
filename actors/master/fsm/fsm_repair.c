/*
 * fsm_repair.c — drain and repair in the master state machine (docs/drain-repair.md):
 *  - RepairStart {key, src}: add one PENDING replica to a complete object on an ACTIVE segment
 *    that holds no replica of it (distinct host first, then most free bytes);
 *  - RepairEnd {key, segment, offset, ok}: that replica becomes COMPLETE (ok) or is freed
 *    (quarantined);
 *  - ReplicaDrop {key, segment}: a COMPLETE replica on a DRAINING segment leaves (quarantined);
 *    refused (BUSY) when it is the object's last complete replica;
 *  - RepairScan (query): what needs a copy, what can be dropped, stale pending repair replicas,
 *    and the drain/repair progress counters.
 * Pure like the rest of the FSM: time only from Command.now_wall_ms.
 */
#include <stdlib.h>
#include <string.h>

#include "actors/master/fsm/fsm_internal.h"
#include "kvpool.h"
#include "runtime/log.h"

typedef struct kvp_master_fsm fsm_t;
typedef struct kvp_fsm_seg seg_t;
typedef struct kvp_fsm_obj obj_t;

static bool seg_is(const fsm_t *f, uint32_t id, int state)
{
    const seg_t *s = kvp_fsm_seg_get(f, id);
    return s && s->state == state;
}

/* Counts of o's replicas: complete on ACTIVE, complete on DRAINING, pending. */
static void obj_counts(const fsm_t *f, const obj_t *o, unsigned *good, unsigned *drn, unsigned *pend)
{
    *good = *drn = *pend = 0;
    for (unsigned i = 0; i < o->n_replicas; i++) {
        if (o->rep[i].state != KVP__REPLICA_STATE__REPLICA_COMPLETE)
            (*pend)++;
        else if (seg_is(f, o->rep[i].segment_id, KVP__SEGMENT_STATE__SEGMENT_ACTIVE))
            (*good)++;
        else if (seg_is(f, o->rep[i].segment_id, KVP__SEGMENT_STATE__SEGMENT_DRAINING))
            (*drn)++;
    }
}

static bool obj_on(const obj_t *o, uint32_t seg)
{
    for (unsigned i = 0; i < o->n_replicas; i++)
        if (o->rep[i].segment_id == seg)
            return true;
    return false;
}

static unsigned active_segments(const fsm_t *f)
{
    unsigned n = 0;
    for (uint32_t i = 0; i < f->n_segs_ids; i++)
        if (f->segs[i] && f->segs[i]->state == KVP__SEGMENT_STATE__SEGMENT_ACTIVE)
            n++;
    return n;
}

/* The target count: what the object wants, bounded by the ACTIVE segments that exist. */
static unsigned obj_target(const fsm_t *f, const obj_t *o, unsigned n_active)
{
    unsigned want = KVP_FSM_OBJ_WANT(o);
    if (want == 0)
        want = 1;
    return want < n_active ? want : n_active;
}

/* Replace o by a copy with one more replica slot (the object table holds the new pointer). */
static obj_t *obj_grow(fsm_t *f, obj_t *o)
{
    obj_t *n = kvp_fsm_obj_alloc(kvp_fsm_obj_key(o), o->key_len, o->n_replicas + 1u);
    if (!n)
        return NULL;
    n->size = o->size;
    n->op_id = o->op_id;
    n->term = o->term;
    n->u = o->u;
    n->state = o->state;
    n->soft_pin = o->soft_pin;
    n->pad[0] = o->pad[0];
    memcpy(n->rep, o->rep, o->n_replicas * sizeof(o->rep[0]));
    kvp_fsm_obj_unlink(f, o);
    if (kvp_fsm_obj_insert(f, n) != KVP_OK) {
        kvp_fsm_obj_insert(f, o); /* the slot it left is free again */
        free(n);
        return NULL;
    }
    free(o);
    return n;
}

static void obj_remove_replica(obj_t *o, unsigned i)
{
    memmove(&o->rep[i], &o->rep[i + 1],
            (o->n_replicas - i - 1) * sizeof(o->rep[0]) + o->key_len + 1u);
    o->n_replicas--;
}

/* Free replica i of o (quarantined on its segment) and remove it from the array. */
static void obj_free_replica(fsm_t *f, obj_t *o, unsigned i, uint64_t now_ms)
{
    seg_t *s = kvp_fsm_seg_get(f, o->rep[i].segment_id);
    uint64_t len = kvp_alloc_round(o->size);
    if (s && s->state != KVP__SEGMENT_STATE__SEGMENT_LOST) {
        s->used_bytes -= len;
        s->n_replicas--;
        if (kvp_fsm_quarantine_push(f, s, o->rep[i].offset, len, now_ms) != KVP_OK)
            kvp_log_error(KVP_FSM_ACTOR, "segment %u: quarantine %llu bytes: no memory, extent "
                          "leaked until restore", s->id, (unsigned long long)len);
    }
    obj_remove_replica(o, i);
}

static int32_t *status_array(size_t n)
{
    return calloc(n ? n : 1, sizeof(int32_t));
}

static int remove_body(Kvp__Response *r, size_t n, int32_t **st)
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
    *st = body->status;
    return KVP_OK;
}

/* ---------------------------------------------------------------- RepairStart */

static int repair_item(fsm_t *f, const Kvp__RepairItem *it, Kvp__RepairStartResult *res)
{
    size_t klen;
    if (!kvp_fsm_key_valid(it->key, &klen)) {
        res->status = KVP_ERR_INVALID;
        return KVP_OK;
    }
    obj_t *o = kvp_fsm_obj_find_mut(f, it->key, klen);
    if (!o || o->state != KVP_FSM_OBJ_COMPLETE) {
        res->status = KVP_ERR_NOT_FOUND;
        return KVP_OK;
    }
    int src = -1;
    for (unsigned i = 0; i < o->n_replicas; i++)
        if (o->rep[i].segment_id == it->src_segment_id &&
            o->rep[i].state == KVP__REPLICA_STATE__REPLICA_COMPLETE)
            src = (int)i;
    const seg_t *ss = src >= 0 ? kvp_fsm_seg_get(f, it->src_segment_id) : NULL;
    if (!ss || ss->state == KVP__SEGMENT_STATE__SEGMENT_LOST) {
        res->status = KVP_ERR_NOT_FOUND;
        return KVP_OK;
    }
    unsigned good, drn, pend;
    obj_counts(f, o, &good, &drn, &pend);
    if (good + pend >= obj_target(f, o, active_segments(f))) {
        res->status = KVP_ERR_EXISTS;
        return KVP_OK;
    }
    if (o->n_replicas >= KVP_FSM_MAX_REPLICAS) {
        res->status = KVP_ERR_NO_SPACE;
        return KVP_OK;
    }
    uint64_t need = kvp_alloc_round(o->size);
    seg_t *best = NULL;
    bool best_newhost = false;
    for (uint32_t i = 0; i < f->n_segs_ids; i++) {
        seg_t *s = f->segs[i];
        if (!s || s->state != KVP__SEGMENT_STATE__SEGMENT_ACTIVE || obj_on(o, s->id) ||
            kvp_alloc_largest_free(&s->alloc) < need)
            continue;
        bool newhost = true;
        for (unsigned r = 0; r < o->n_replicas && newhost; r++) {
            const seg_t *rs = kvp_fsm_seg_get(f, o->rep[r].segment_id);
            if (rs && rs->host && s->host && strcmp(rs->host, s->host) == 0)
                newhost = false;
        }
        if (!best || (newhost && !best_newhost) ||
            (newhost == best_newhost && s->alloc.free_bytes > best->alloc.free_bytes)) {
            best = s;
            best_newhost = newhost;
        }
    }
    if (!best) {
        res->status = KVP_ERR_NO_SPACE;
        return KVP_OK;
    }
    uint64_t off = 0;
    if (kvp_alloc_alloc(&best->alloc, need, &off) != KVP_OK) {
        res->status = KVP_ERR_NO_SPACE;
        return KVP_OK;
    }
    obj_t *n = obj_grow(f, o);
    if (!n) {
        kvp_alloc_free(&best->alloc, off, need);
        return KVP_ERR_NOMEM;
    }
    n->rep[n->n_replicas - 1] = (struct kvp_fsm_replica){
        .segment_id = best->id, .state = KVP__REPLICA_STATE__REPLICA_PENDING, .offset = off};
    best->used_bytes += need;
    best->n_replicas++;
    res->target = kvp_fsm_replica_msg(best, &n->rep[n->n_replicas - 1]);
    for (unsigned i = 0; i < n->n_replicas; i++)
        if (n->rep[i].segment_id == it->src_segment_id)
            res->source = kvp_fsm_replica_msg(ss, &n->rep[i]);
    res->key = kvp_fsm_strdup(it->key);
    if (!res->target || !res->source || !res->key)
        return KVP_ERR_NOMEM;
    res->size = n->size;
    res->checksum = n->u.checksum;
    res->status = KVP_OK;
    return KVP_OK;
}

int kvp_fsm_repair_start(fsm_t *f, const Kvp__Command *c, Kvp__Response *r)
{
    const Kvp__RepairStartCmd *q = c->repair_start;
    Kvp__RepairStartResp *body = malloc(sizeof(*body));
    if (!body)
        return KVP_ERR_NOMEM;
    kvp__repair_start_resp__init(body);
    r->body_case = KVP__RESPONSE__BODY_REPAIR_START;
    r->repair_start = body;
    body->results = calloc(q->n_items ? q->n_items : 1, sizeof(*body->results));
    if (!body->results)
        return KVP_ERR_NOMEM;
    for (size_t i = 0; i < q->n_items; i++) {
        Kvp__RepairStartResult *res = malloc(sizeof(*res));
        if (!res)
            return KVP_ERR_NOMEM;
        kvp__repair_start_result__init(res);
        body->results[body->n_results++] = res;
        int rc = repair_item(f, q->items[i], res);
        if (rc)
            return rc;
    }
    return KVP_OK;
}

/* ---------------------------------------------------------------- RepairEnd, ReplicaDrop */

int kvp_fsm_repair_end(fsm_t *f, const Kvp__Command *c, Kvp__Response *r)
{
    const Kvp__RepairEndCmd *q = c->repair_end;
    int32_t *st;
    if (remove_body(r, q->n_items, &st))
        return KVP_ERR_NOMEM;
    for (size_t i = 0; i < q->n_items; i++) {
        const Kvp__RepairEndItem *it = q->items[i];
        size_t klen;
        if (!kvp_fsm_key_valid(it->key, &klen)) {
            st[i] = KVP_ERR_INVALID;
            continue;
        }
        obj_t *o = kvp_fsm_obj_find_mut(f, it->key, klen);
        int k = -1;
        for (unsigned j = 0; o && j < o->n_replicas; j++)
            if (o->rep[j].segment_id == it->segment_id && o->rep[j].offset == it->offset)
                k = (int)j;
        if (!o || o->state != KVP_FSM_OBJ_COMPLETE || k < 0) {
            st[i] = KVP_ERR_NOT_FOUND;
            continue;
        }
        if (o->rep[k].state == KVP__REPLICA_STATE__REPLICA_COMPLETE) {
            st[i] = it->ok ? KVP_OK : KVP_ERR_EXISTS; /* retried; a complete one is never freed here */
            continue;
        }
        if (it->ok && seg_is(f, it->segment_id, KVP__SEGMENT_STATE__SEGMENT_ACTIVE)) {
            o->rep[k].state = KVP__REPLICA_STATE__REPLICA_COMPLETE;
            st[i] = KVP_OK;
        } else {
            obj_free_replica(f, o, (unsigned)k, c->now_wall_ms);
            st[i] = it->ok ? KVP_ERR_NOT_FOUND : KVP_OK;
        }
    }
    return KVP_OK;
}

int kvp_fsm_replica_drop(fsm_t *f, const Kvp__Command *c, Kvp__Response *r)
{
    const Kvp__ReplicaDropCmd *q = c->replica_drop;
    int32_t *st;
    if (remove_body(r, q->n_items, &st))
        return KVP_ERR_NOMEM;
    for (size_t i = 0; i < q->n_items; i++) {
        const Kvp__ReplicaDropItem *it = q->items[i];
        size_t klen;
        if (!kvp_fsm_key_valid(it->key, &klen)) {
            st[i] = KVP_ERR_INVALID;
            continue;
        }
        obj_t *o = kvp_fsm_obj_find_mut(f, it->key, klen);
        int k = -1;
        unsigned complete_elsewhere = 0;
        for (unsigned j = 0; o && j < o->n_replicas; j++) {
            if (o->rep[j].segment_id == it->segment_id)
                k = (int)j;
            else if (o->rep[j].state == KVP__REPLICA_STATE__REPLICA_COMPLETE)
                complete_elsewhere++;
        }
        if (!o || o->state != KVP_FSM_OBJ_COMPLETE || k < 0 ||
            !seg_is(f, it->segment_id, KVP__SEGMENT_STATE__SEGMENT_DRAINING)) {
            st[i] = KVP_ERR_NOT_FOUND;
            continue;
        }
        if (complete_elsewhere == 0) {
            st[i] = KVP_ERR_BUSY; /* its last copy: never dropped by a drain */
            continue;
        }
        obj_free_replica(f, o, (unsigned)k, c->now_wall_ms);
        st[i] = KVP_OK;
    }
    return KVP_OK;
}

/* ---------------------------------------------------------------- RepairScan */

static int add_need(Kvp__RepairScanResp *b, size_t cap, const obj_t *o, uint32_t src, uint32_t drop,
                    uint32_t kind, uint64_t offset)
{
    if (b->n_needs >= cap)
        return KVP_OK;
    Kvp__RepairNeed *n = malloc(sizeof(*n));
    if (!n)
        return KVP_ERR_NOMEM;
    kvp__repair_need__init(n);
    b->needs[b->n_needs++] = n;
    n->key = kvp_fsm_strdup(kvp_fsm_obj_key(o));
    if (!n->key)
        return KVP_ERR_NOMEM;
    n->size = o->size;
    n->src_segment_id = src;
    n->drop_segment_id = drop;
    n->kind = kind;
    n->offset = offset;
    return KVP_OK;
}

/* Would a copy of o fit on some ACTIVE segment that holds none of its replicas? */
static bool copy_fits(const fsm_t *f, const obj_t *o)
{
    uint64_t need = kvp_alloc_round(o->size);
    for (uint32_t i = 0; i < f->n_segs_ids; i++) {
        const seg_t *s = f->segs[i];
        if (s && s->state == KVP__SEGMENT_STATE__SEGMENT_ACTIVE && !obj_on(o, s->id) &&
            kvp_alloc_largest_free(&s->alloc) >= need)
            return true;
    }
    return false;
}

int kvp_fsm_repair_scan(const fsm_t *f, const Kvp__RepairScanReq *q, Kvp__Response *r)
{
    Kvp__RepairScanResp *b = malloc(sizeof(*b));
    if (!b)
        return KVP_ERR_NOMEM;
    kvp__repair_scan_resp__init(b);
    r->body_case = KVP__RESPONSE__BODY_REPAIR_SCAN;
    r->repair_scan = b;
    size_t cap = q && q->max ? q->max : 256;
    if (cap > 4096)
        cap = 4096;
    b->needs = calloc(cap, sizeof(*b->needs));
    if (!b->needs)
        return KVP_ERR_NOMEM;
    bool any_draining = false;
    for (uint32_t i = 0; i < f->n_segs_ids; i++)
        if (f->segs[i] && f->segs[i]->state == KVP__SEGMENT_STATE__SEGMENT_DRAINING)
            any_draining = true;
    unsigned n_active = active_segments(f);
    /* A slice [cursor, cursor + slots) of the table (slots 0: all of it), so one query holds the
     * raft thread for a bounded time at any table size (issue 22). The counters are the slice's;
     * the caller sums a pass. */
    uint64_t from = q && q->cursor < f->tab_cap ? q->cursor : 0;
    uint64_t to = q && q->slots && q->slots < f->tab_cap - from ? from + q->slots : f->tab_cap;
    b->next_cursor = to < f->tab_cap ? to : 0;
    b->table_slots = f->tab_cap;
    b->table_moves = f->tab_moves;
    for (uint64_t t = from; t < to; t++) {
        if (t + 16 < to && f->tab[t + 16])
            __builtin_prefetch(f->tab[t + 16]); /* each object is a cache miss: keep some in flight */
        const obj_t *o = f->tab[t];
        if (!o || o->state != KVP_FSM_OBJ_COMPLETE)
            continue;
        unsigned good, drn, pend;
        obj_counts(f, o, &good, &drn, &pend);
        unsigned target = obj_target(f, o, n_active);
        uint32_t src = 0, drain_src = 0;
        for (unsigned i = 0; i < o->n_replicas; i++) {
            if (o->rep[i].state != KVP__REPLICA_STATE__REPLICA_COMPLETE)
                continue;
            if (seg_is(f, o->rep[i].segment_id, KVP__SEGMENT_STATE__SEGMENT_DRAINING))
                drain_src = drain_src ? drain_src : o->rep[i].segment_id;
            else if (!src)
                src = o->rep[i].segment_id;
        }
        if (any_draining && drn) {
            b->draining_objects += drn;
            b->draining_bytes += drn * o->size;
            if (good == 0)
                b->lost_if_drained++;
        }
        if (pend)
            b->in_flight++;
        /* stale pending repair replicas are the service's call: it reports those it does not know */
        for (unsigned i = 0; i < o->n_replicas && pend; i++)
            if (o->rep[i].state != KVP__REPLICA_STATE__REPLICA_COMPLETE &&
                add_need(b, cap, o, 0, o->rep[i].segment_id, 2, o->rep[i].offset))
                return KVP_ERR_NOMEM;
        if (good < KVP_FSM_OBJ_WANT(o))
            b->under_replicated++;
        if (good + pend < target) {
            /* the draining copy moves itself (its reads are local); else any surviving copy */
            uint32_t from = drain_src ? drain_src : src;
            if (!from)
                continue;
            if (!copy_fits(f, o)) {
                b->no_space++;
                continue;
            }
            if (add_need(b, cap, o, from, 0, 0, 0))
                return KVP_ERR_NOMEM;
        } else if (drn && good >= 1 && good >= target) {
            for (unsigned i = 0; i < o->n_replicas; i++)
                if (o->rep[i].state == KVP__REPLICA_STATE__REPLICA_COMPLETE &&
                    seg_is(f, o->rep[i].segment_id, KVP__SEGMENT_STATE__SEGMENT_DRAINING) &&
                    add_need(b, cap, o, 0, o->rep[i].segment_id, 1, 0))
                    return KVP_ERR_NOMEM;
        }
    }
    return KVP_OK;
}
