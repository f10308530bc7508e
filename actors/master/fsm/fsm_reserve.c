/*
 * fsm_reserve.c — reservations per term and PutCommit (feature level 3; docs/master.md
 * "One-commit put").
 *
 * A ReserveCmd sets one extent of a segment aside for the leader of Command.term until
 * horizon_ms. A PutCommitCmd turns ranges the leader handed out from its term's reservations
 * into complete objects in one command: every replica range must lie inside a reservation of the
 * item's term on that segment and overlap no range committed from it before, and the command's
 * time must not be past the put's deadline, which must not be past the reservation's horizon.
 * RevokeExpired retires every reservation whose horizon has come: the ranges no PutCommit used
 * enter the quarantine as freed at horizon_ms, so they are reused fence_grace_ms after the last
 * write deadline that could point into them (contract C3), on every member alike.
 */
#include <stdlib.h>
#include <string.h>

#include "actors/master/fsm/fsm_internal.h"
#include "actors/master/fsm/version.h"
#include "kvpool.h"
#include "runtime/log.h"

uint64_t kvp_fsm_resv_unused(const struct kvp_fsm_resv *v)
{
    uint64_t used = 0;
    for (uint32_t i = 0; i < v->n_used; i++)
        used += v->used[i].len;
    return v->len - used;
}

void kvp_fsm_resv_drop_all(struct kvp_fsm_seg *s)
{
    for (uint32_t i = 0; i < s->n_resv; i++)
        free(s->resv[i].used);
    free(s->resv);
    s->resv = NULL;
    s->n_resv = s->resv_cap = 0;
}

int kvp_fsm_reserve(struct kvp_master_fsm *f, const Kvp__Command *c, Kvp__Response *r)
{
    const Kvp__ReserveCmd *q = c->reserve;
    Kvp__ReserveResp *body = malloc(sizeof(*body));
    if (!body)
        return KVP_ERR_NOMEM;
    kvp__reserve_resp__init(body);
    r->body_case = KVP__RESPONSE__BODY_RESERVE;
    r->reserve = body;
    struct kvp_fsm_seg *s = kvp_fsm_seg_get(f, q->segment_id);
    uint64_t len = kvp_alloc_round(q->length);
    if (!s || s->state != KVP__SEGMENT_STATE__SEGMENT_ACTIVE) {
        body->status = KVP_ERR_NOT_FOUND;
        return KVP_OK;
    }
    if (len == 0 || c->term == 0 || q->horizon_ms <= c->now_wall_ms) {
        body->status = KVP_ERR_INVALID;
        return KVP_OK;
    }
    if (s->n_resv >= KVP_FSM_MAX_RESV) {
        kvp_log_warn(KVP_FSM_ACTOR, "segment %u: reserve refused, %u reservations live", s->id, s->n_resv);
        body->status = KVP_ERR_NO_SPACE;
        return KVP_OK;
    }
    if (s->n_resv == s->resv_cap) {
        uint32_t cap = s->resv_cap ? s->resv_cap * 2 : 4;
        struct kvp_fsm_resv *v = realloc(s->resv, cap * sizeof(*v));
        if (!v)
            return KVP_ERR_NOMEM;
        s->resv = v;
        s->resv_cap = cap;
    }
    uint64_t off = 0;
    int rc = kvp_alloc_alloc(&s->alloc, len, &off);
    if (rc != KVP_OK) {
        body->status = rc == KVP_ERR_NO_SPACE ? KVP_ERR_NO_SPACE : KVP_ERR_INVALID;
        return KVP_OK;
    }
    s->resv[s->n_resv++] = (struct kvp_fsm_resv){
        .term = c->term, .offset = off, .len = len, .horizon_ms = q->horizon_ms};
    s->used_bytes += len;
    body->status = KVP_OK;
    body->offset = off;
    return KVP_OK;
}

/* Index in v->used of the first range ending after off (binary search). */
static uint32_t used_lower(const struct kvp_fsm_resv *v, uint64_t off)
{
    uint32_t lo = 0, hi = v->n_used;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (v->used[mid].offset + v->used[mid].len <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The reservation of `term` on s that holds [off, off + len) unused, or NULL; *at receives the
 * index in its used[] where the range goes. Two live reservations of one term may overlap: an
 * object committed from the first and then removed frees its range through the quarantine while
 * the first reservation lives on (its used[] keeps the range), and a later ReserveCmd may get
 * that range. A placement there comes from the later one, so a reservation whose used[]
 * overlaps the range is passed over, not taken as the answer (it was, and such a put failed
 * INVALID: test_python_store's 8 threads of put/get/forced remove did it every run). */
static struct kvp_fsm_resv *resv_find(struct kvp_fsm_seg *s, uint64_t term, uint64_t off, uint64_t len,
                                      uint32_t *at)
{
    for (uint32_t i = 0; i < s->n_resv; i++) {
        struct kvp_fsm_resv *v = &s->resv[i];
        if (v->term != term || off < v->offset || off - v->offset > v->len || len > v->len - (off - v->offset))
            continue;
        uint32_t k = used_lower(v, off);
        if (k < v->n_used && v->used[k].offset < off + len)
            continue; /* overlaps a range committed before: perhaps freed and reserved again */
        *at = k;
        return v;
    }
    return NULL;
}

static int used_insert(struct kvp_fsm_resv *v, uint32_t at, uint64_t off, uint64_t len)
{
    if (v->n_used == v->used_cap) {
        uint32_t cap = v->used_cap ? v->used_cap * 2 : 16;
        struct kvp_fsm_range *u = realloc(v->used, cap * sizeof(*u));
        if (!u)
            return KVP_ERR_NOMEM;
        v->used = u;
        v->used_cap = cap;
    }
    memmove(v->used + at + 1, v->used + at, (v->n_used - at) * sizeof(*v->used));
    v->used[at] = (struct kvp_fsm_range){off, len};
    v->n_used++;
    return KVP_OK;
}

/* Returns KVP_ERR_NOMEM, or KVP_OK with *status set. */
static int put_commit_item(struct kvp_master_fsm *f, const Kvp__Command *c, const Kvp__PutCommitItem *it,
                           int32_t *status)
{
    size_t klen;
    uint64_t need = kvp_alloc_round(it->size);
    if (!kvp_fsm_key_valid(it->key, &klen) || need == 0 || it->n_replicas == 0 ||
        it->n_replicas > KVP_FSM_MAX_REPLICAS || it->replica_num > KVP_FSM_MAX_REPLICAS) {
        *status = KVP_ERR_INVALID;
        return KVP_OK;
    }
    /* The intent flag counts only in a command stamped with its level: a member of level 5
     * ignores the field (unknown to it) and would make the object complete at once. */
    bool intent = it->intent && c->feature_level >= KVP_FEATURE_INTENT;
    struct kvp_fsm_obj *o = kvp_fsm_obj_find_mut(f, it->key, klen);
    if (o) {
        if (o->state == KVP_FSM_OBJ_INTENT && o->op_id == it->op_id)
            /* A retried intent: OK. A commit of the put whose intent committed (a leader that
             * took the PutEnd path): it seals it, with the same checksum only. */
            *status = intent ? KVP_OK : kvp_fsm_intent_seal(f, o, it->op_id, it->checksum);
        else
            *status = o->state == KVP_FSM_OBJ_COMPLETE && o->op_id == it->op_id ? KVP_OK /* retried */
                                                                                : KVP_ERR_EXISTS;
        return KVP_OK;
    }
    if (c->now_wall_ms > it->deadline_ms) {
        *status = KVP_ERR_TIMEOUT;
        return KVP_OK;
    }
    struct kvp_fsm_seg *segs[KVP_FSM_MAX_REPLICAS];
    struct kvp_fsm_resv *resv[KVP_FSM_MAX_REPLICAS];
    uint32_t at[KVP_FSM_MAX_REPLICAS];
    for (size_t i = 0; i < it->n_replicas; i++) {
        const Kvp__ReplicaPlace *p = it->replicas[i];
        segs[i] = p ? kvp_fsm_seg_get(f, p->segment_id) : NULL;
        resv[i] = NULL;
        for (size_t j = 0; j < i && segs[i]; j++)
            if (segs[j] == segs[i])
                segs[i] = NULL; /* two replicas on one segment */
        if (segs[i] && segs[i]->state != KVP__SEGMENT_STATE__SEGMENT_LOST)
            resv[i] = resv_find(segs[i], it->term, p->offset, need, &at[i]);
        if (!resv[i] || it->deadline_ms > resv[i]->horizon_ms) {
            *status = KVP_ERR_INVALID;
            return KVP_OK;
        }
    }
    o = kvp_fsm_obj_alloc(it->key, klen, (unsigned)it->n_replicas);
    if (!o)
        return KVP_ERR_NOMEM;
    o->size = it->size;
    o->op_id = it->op_id;
    o->term = it->term;
    o->u.checksum = it->checksum;
    o->soft_pin = it->soft_pin;
    o->pad[0] = (uint8_t)(it->replica_num ? it->replica_num : it->n_replicas);
    /* An intent's replicas are COMPLETE too: the object's state alone hides it, and a segment
     * lost before the seal then drops one copy as for a complete object, not the whole put. */
    o->state = intent ? KVP_FSM_OBJ_INTENT : KVP_FSM_OBJ_COMPLETE;
    for (size_t i = 0; i < it->n_replicas; i++)
        o->rep[i] = (struct kvp_fsm_replica){.segment_id = segs[i]->id,
                                             .state = KVP__REPLICA_STATE__REPLICA_COMPLETE,
                                             .offset = it->replicas[i]->offset};
    /* Room first, then nothing can fail half way. */
    for (size_t i = 0; i < it->n_replicas; i++)
        if (resv[i]->n_used == resv[i]->used_cap) {
            uint32_t cap = resv[i]->used_cap ? resv[i]->used_cap * 2 : 16;
            struct kvp_fsm_range *u = realloc(resv[i]->used, cap * sizeof(*u));
            if (!u) {
                free(o);
                return KVP_ERR_NOMEM;
            }
            resv[i]->used = u;
            resv[i]->used_cap = cap;
        }
    if (kvp_fsm_obj_insert(f, o) != KVP_OK) {
        free(o);
        return KVP_ERR_NOMEM;
    }
    if (intent && kvp_fsm_intent_add(f, o, it->deadline_ms) != KVP_OK) {
        kvp_fsm_obj_unlink(f, o);
        free(o);
        return KVP_ERR_NOMEM;
    }
    for (size_t i = 0; i < it->n_replicas; i++) {
        used_insert(resv[i], at[i], it->replicas[i]->offset, need); /* room made above */
        segs[i]->n_replicas++; /* used_bytes: the bytes move from the reservation to the object */
    }
    if (intent) {
        *status = KVP_OK; /* complete (pinned, tenant, repair) at its seal */
        return KVP_OK;
    }
    bool repair = it->n_replicas < KVP_FSM_OBJ_WANT(o);
    for (size_t i = 0; i < it->n_replicas; i++)
        if (segs[i]->state != KVP__SEGMENT_STATE__SEGMENT_ACTIVE)
            repair = true; /* its segment began draining since the placement */
    if (repair)
        f->repair_epoch++;
    if (o->soft_pin)
        f->pinned_bytes += o->size;
    kvp_fsm_tenant_count(f, o, +1);
    *status = KVP_OK;
    return KVP_OK;
}

int kvp_fsm_put_commit(struct kvp_master_fsm *f, const Kvp__Command *c, Kvp__Response *r)
{
    const Kvp__PutCommitCmd *q = c->put_commit;
    Kvp__PutEndResp *body = kvp_fsm_put_end_body(r, q->n_items); /* PutEnd's answer shape */
    if (!body)
        return KVP_ERR_NOMEM;
    for (size_t i = 0; i < q->n_items; i++) {
        int rc = put_commit_item(f, c, q->items[i], &body->status[i]);
        if (rc != KVP_OK)
            return rc;
    }
    return KVP_OK;
}

int kvp_fsm_intent_seal(struct kvp_master_fsm *f, struct kvp_fsm_obj *o, uint64_t op_id, uint64_t checksum)
{
    if (o->state != KVP_FSM_OBJ_INTENT || o->op_id != op_id || o->u.checksum != checksum)
        return KVP_ERR_EXISTS;
    kvp_fsm_snap_touch(f, o);
    kvp_fsm_intent_del(f, o);
    o->state = KVP_FSM_OBJ_COMPLETE;
    bool repair = o->n_replicas < KVP_FSM_OBJ_WANT(o); /* a copy lost since the intent */
    for (unsigned k = 0; k < o->n_replicas; k++) {
        const struct kvp_fsm_seg *sg = kvp_fsm_seg_get(f, o->rep[k].segment_id);
        if (!sg || sg->state != KVP__SEGMENT_STATE__SEGMENT_ACTIVE)
            repair = true;
    }
    if (repair)
        f->repair_epoch++;
    if (o->soft_pin)
        f->pinned_bytes += o->size;
    kvp_fsm_tenant_count(f, o, +1);
    return KVP_OK;
}

/* PutSealCmd (feature level 6): each intent of the item's op_id and checksum becomes complete.
 * OK also for an object already complete with that op_id and checksum (a seal logged twice);
 * NOT_FOUND when the key holds no intent (revoked, or a put of the PutStart path); EXISTS for
 * another op_id or checksum. Answered with PutEndResp. */
int kvp_fsm_put_seal(struct kvp_master_fsm *f, const Kvp__Command *c, Kvp__Response *r)
{
    const Kvp__PutSealCmd *q = c->put_seal;
    Kvp__PutEndResp *body = kvp_fsm_put_end_body(r, q->n_items);
    if (!body)
        return KVP_ERR_NOMEM;
    for (size_t i = 0; i < q->n_items; i++) {
        const Kvp__PutSealItem *it = q->items[i];
        size_t klen;
        if (!it || !kvp_fsm_key_valid(it->key, &klen)) {
            body->status[i] = KVP_ERR_INVALID;
            continue;
        }
        struct kvp_fsm_obj *o = kvp_fsm_obj_find_mut(f, it->key, klen);
        if (!o || o->state == KVP_FSM_OBJ_PENDING)
            body->status[i] = KVP_ERR_NOT_FOUND;
        else if (o->state == KVP_FSM_OBJ_COMPLETE)
            body->status[i] = o->op_id == it->op_id && o->u.checksum == it->checksum ? KVP_OK : KVP_ERR_EXISTS;
        else
            body->status[i] = kvp_fsm_intent_seal(f, o, it->op_id, it->checksum);
    }
    return KVP_OK;
}

uint64_t kvp_fsm_resv_retire(struct kvp_master_fsm *f, uint64_t now_ms)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < f->n_segs_ids; i++) {
        struct kvp_fsm_seg *s = f->segs[i];
        if (!s || s->state == KVP__SEGMENT_STATE__SEGMENT_LOST)
            continue;
        for (uint32_t k = 0; k < s->n_resv;) {
            struct kvp_fsm_resv *v = &s->resv[k];
            if (v->horizon_ms > now_ms) {
                k++;
                continue;
            }
            /* The gaps between used ranges: no writer of this reservation writes there after
             * horizon_ms, so they are freed at horizon_ms (reused fence_grace_ms later). */
            uint64_t pos = v->offset, end = v->offset + v->len;
            for (uint32_t u = 0; u <= v->n_used; u++) {
                uint64_t next = u < v->n_used ? v->used[u].offset : end;
                if (next > pos) {
                    s->used_bytes -= next - pos;
                    if (kvp_fsm_quarantine_push(f, s, pos, next - pos, v->horizon_ms) != KVP_OK)
                        kvp_log_error(KVP_FSM_ACTOR, "segment %u: retire %llu+%llu: no memory, extent leaked "
                                      "until restore", s->id, (unsigned long long)pos,
                                      (unsigned long long)(next - pos));
                }
                if (u < v->n_used)
                    pos = v->used[u].offset + v->used[u].len;
            }
            free(v->used);
            s->resv[k] = s->resv[--s->n_resv]; /* order does not matter to any rule */
            n++;
        }
    }
    return n;
}

/* RaiseLevelCmd (feature level 4, version.h): the committed level only goes up. A raise to a
 * level above this binary's does not get here: the command is stamped with the level it
 * commits (kvp_feature_command_needs), which kvp_fsm_apply_cmd refuses above KVP_FEATURE_LEVEL.
 * Committing level 5 switches the quarantine to per-entry release for every later push
 * (kvp_fsm_quarantine_push): nothing else to do here, entries are time-ordered at every level.
 * Answered with an empty body. */
int kvp_fsm_raise_level(struct kvp_master_fsm *f, const Kvp__Command *c, Kvp__Response *r)
{
    uint32_t level = c->raise_level->level;
    if (level < 2) {
        kvp_log_warn(KVP_FSM_ACTOR, "RaiseLevel: level %u is not a raise: refused", (unsigned)level);
        r->status = KVP_ERR_INVALID;
        return KVP_OK;
    }
    if (level > f->feature_level) {
        kvp_log_info(KVP_FSM_ACTOR, "cluster feature level %u committed (was %u)", (unsigned)level,
                     (unsigned)f->feature_level);
        f->feature_level = level;
    }
    return KVP_OK;
}
