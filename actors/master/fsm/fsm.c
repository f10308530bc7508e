/*
 * fsm.c — the master FSM's tables (segments, objects, pending puts, quarantine), lifecycle,
 * the apply/query entry points and response helpers. Command handlers: fsm_cmd.c; queries:
 * fsm_query.c; snapshot/restore and byte adapters: fsm_snap.c.
 *
 * Responses: every Response returned by apply/query is built from malloc'd parts only (each
 * sub-message, repeated array and string is its own malloc; unset strings keep protobuf-c's
 * shared empty default), so kvp_master_fsm_response_free() frees it with
 * protobuf_c_message_free_unpacked(), exactly like a decoded message.
 */
#define _GNU_SOURCE /* vasprintf */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "actors/master/fsm/fsm_internal.h"
#include "actors/master/fsm/version.h"
#include "kvpool.h"
#include "runtime/log.h"

/* ------------------------------------------------------------------ helpers */

char *kvp_fsm_strdup(const char *s)
{
    return strdup(s ? s : "");
}

uint32_t kvp_fsm_hash(const char *key, size_t len)
{
    return (uint32_t)XXH3_64bits(key, len);
}

bool kvp_fsm_key_valid(const char *key, size_t *len)
{
    if (!key)
        return false;
    size_t n = strnlen(key, KVP_FSM_KEY_MAX + 1);
    if (n == 0 || n > KVP_FSM_KEY_MAX)
        return false;
    *len = n;
    return true;
}

/* ------------------------------------------------------------------ object table */

struct kvp_fsm_obj *kvp_fsm_obj_find(const struct kvp_master_fsm *f, const char *key, size_t len)
{
    if (!f->tab_cap)
        return NULL;
    uint32_t h = kvp_fsm_hash(key, len);
    uint64_t mask = f->tab_cap - 1;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
        struct kvp_fsm_obj *o = f->tab[i];
        if (!o)
            return NULL;
        if (o->hash == h && o->key_len == len && memcmp(kvp_fsm_obj_key(o), key, len) == 0)
            return o;
    }
}

struct kvp_fsm_obj *kvp_fsm_obj_find_mut(struct kvp_master_fsm *f, const char *key, size_t len)
{
    struct kvp_fsm_obj *o = kvp_fsm_obj_find(f, key, len);
    if (o)
        kvp_fsm_snap_touch(f, o);
    return o;
}

/* Returns the slot o was placed in. */
static uint64_t tab_place(struct kvp_fsm_obj **tab, uint64_t cap, struct kvp_fsm_obj *o)
{
    uint64_t mask = cap - 1;
    uint64_t i = o->hash & mask;
    while (tab[i])
        i = (i + 1) & mask;
    tab[i] = o;
    return i;
}

/* Remove o from a table that holds it (backward-shift deletion keeps probe chains intact
 * without tombstones). `touch`: the live table, whose moves a running snapshot must see; moves
 * into the growing table's walked part are recorded there (see tab_grow_step). */
static void tab_remove(struct kvp_master_fsm *f, struct kvp_fsm_obj **tab, uint64_t cap, struct kvp_fsm_obj *o,
                       bool live)
{
    uint64_t mask = cap - 1;
    uint64_t i = o->hash & mask;
    while (tab[i] != o)
        i = (i + 1) & mask;
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        struct kvp_fsm_obj *n = tab[j];
        if (!n)
            break;
        uint64_t k = n->hash & mask;
        bool movable = (i <= j) ? (k <= i || k > j) : (k <= i && k > j);
        if (movable) {
            if (live) {
                kvp_fsm_snap_touch(f, n); /* may move behind a running snapshot's walk */
                f->tab_moves++;           /* ... or behind a repair scan slice's cursor */
                /* ... or behind the growth's walk: copy it now, or the new table misses it */
                if (f->ntab && i < f->ncursor && KVP_FSM_OBJ_MOVED(n) != f->grow_gen) {
                    tab_place(f->ntab, f->ncap, n);
                    KVP_FSM_OBJ_MOVED(n) = f->grow_gen;
                }
            }
            tab[i] = n;
            i = j;
        }
    }
    tab[i] = NULL;
}

/* The whole table at once: small tables, and a growth that could not finish in steps. */
static int tab_grow(struct kvp_master_fsm *f)
{
    uint64_t cap = f->tab_cap ? f->tab_cap * 2 : 1024;
    struct kvp_fsm_obj **t = calloc(cap, sizeof(*t));
    if (!t)
        return KVP_ERR_NOMEM;
    /* Every object is a cache miss (its hash), and so is its new slot: prefetch the object 16
     * slots ahead and its new slot 8 ahead, to keep several misses in flight. */
    uint64_t mask = cap - 1;
    for (uint64_t i = 0; i < f->tab_cap; i++) {
        if (i + 16 < f->tab_cap && f->tab[i + 16])
            __builtin_prefetch(f->tab[i + 16]);
        if (i + 8 < f->tab_cap && f->tab[i + 8])
            __builtin_prefetch(&t[f->tab[i + 8]->hash & mask], 1);
        if (f->tab[i])
            tab_place(t, cap, f->tab[i]);
    }
    f->work.grow_whole++;
    f->work.tab_bytes_alloc += cap * sizeof(*t);
    f->work.tab_bytes_freed += f->tab_cap * sizeof(*t);
    free(f->tab);
    f->tab = t;
    f->tab_cap = cap;
    kvp_fsm_snap_rewind(f);
    return KVP_OK;
}

/* Growth in steps (issue 22: the whole rehash at 6.3M objects held the raft thread 261-342 ms of
 * CPU in one apply). From a load of 5/8 a table of KVP_FSM_GROW_STEP_MIN_CAP slots or more gets
 * its successor (twice the size) built aside: every insert first copies KVP_FSM_GROW_STEP_SLOTS
 * slots of the live table into it; an object inserted meanwhile goes into both when its slot in
 * the live table is behind the copy's cursor (ahead of it the copy takes it in turn). The live table
 * stays the one every lookup and walk uses until the copy has passed its last slot; then the new
 * one replaces it (and a running snapshot's walk starts over, as after a whole growth). An
 * object is in the new table iff KVP_FSM_OBJ_MOVED(o) == grow_gen. The copy ends after
 * cap / 64 inserts, long before the load of 3/4 at which a growth is forced whole. */
static void tab_grow_swap(struct kvp_master_fsm *f)
{
    f->work.grow_swaps++;
    f->work.tab_bytes_freed += f->tab_cap * sizeof(*f->tab);
    free(f->tab);
    f->tab = f->ntab;
    f->tab_cap = f->ncap;
    f->ntab = NULL;
    f->ncap = f->ncursor = 0;
    kvp_fsm_snap_rewind(f);
}

static void tab_grow_step(struct kvp_master_fsm *f, uint64_t slots)
{
    uint64_t end = f->ncursor + slots < f->tab_cap ? f->ncursor + slots : f->tab_cap;
    uint64_t mask = f->ncap - 1;
    for (uint64_t i = f->ncursor; i < end; i++) {
        if (i + 16 < end && f->tab[i + 16])
            __builtin_prefetch(f->tab[i + 16]);
        if (i + 8 < end && f->tab[i + 8])
            __builtin_prefetch(&f->ntab[f->tab[i + 8]->hash & mask], 1);
        struct kvp_fsm_obj *o = f->tab[i];
        if (o && KVP_FSM_OBJ_MOVED(o) != f->grow_gen) {
            tab_place(f->ntab, f->ncap, o);
            KVP_FSM_OBJ_MOVED(o) = f->grow_gen;
        }
    }
    f->work.grow_slots += end - f->ncursor;
    f->ncursor = end;
    if (f->ncursor == f->tab_cap)
        tab_grow_swap(f);
}

int kvp_fsm_obj_insert(struct kvp_master_fsm *f, struct kvp_fsm_obj *o)
{
    if (f->ntab)
        tab_grow_step(f, KVP_FSM_GROW_STEP_SLOTS);
    if (!f->ntab && f->tab_cap >= KVP_FSM_GROW_STEP_MIN_CAP && (f->n_objects + 1) * 8 > f->tab_cap * 5) {
        f->ntab = calloc(f->tab_cap * 2, sizeof(*f->ntab));
        if (f->ntab) { /* else: grown whole at 3/4 below */
            f->work.grow_begun++;
            f->work.tab_bytes_alloc += f->tab_cap * 2 * sizeof(*f->ntab);
            f->ncap = f->tab_cap * 2;
            f->ncursor = 0;
            f->grow_gen = f->grow_gen == UINT8_MAX ? 1 : (uint8_t)(f->grow_gen + 1); /* 0: never moved */
        }
    }
    if ((f->n_objects + 1) * 4 > f->tab_cap * 3) {
        if (f->ntab) {
            tab_grow_step(f, f->tab_cap); /* the copy did not keep up: finish it now */
        } else {
            int rc = tab_grow(f);
            if (rc)
                return rc;
        }
    }
    KVP_FSM_OBJ_GEN(o) = f->snap_gen; /* not part of a snapshot already running */
    uint64_t slot = tab_place(f->tab, f->tab_cap, o);
    KVP_FSM_OBJ_MOVED(o) = 0;
    if (f->ntab && slot < f->ncursor) {
        /* Behind the copy's cursor: into the new table now. Ahead of it the copy takes it when
         * it gets there, so an insert writes only the part of the new table already copied to
         * (whose pages the copy has faulted in, in order): before session 31 every insert also
         * wrote a random slot of the new table, ~4,500-5,500 page faults in each of the first
         * entries of a growth (20-27 ms of CPU at 5.2M objects, docs/bench.md "Session 31"). */
        tab_place(f->ntab, f->ncap, o);
        KVP_FSM_OBJ_MOVED(o) = f->grow_gen;
    }
    f->n_objects++;
    return KVP_OK;
}

void kvp_fsm_obj_unlink(struct kvp_master_fsm *f, struct kvp_fsm_obj *o)
{
    kvp_fsm_snap_touch(f, o);
    if (f->ntab && KVP_FSM_OBJ_MOVED(o) == f->grow_gen)
        tab_remove(f, f->ntab, f->ncap, o, false);
    KVP_FSM_OBJ_MOVED(o) = 0;
    tab_remove(f, f->tab, f->tab_cap, o, true);
    f->n_objects--;
}

struct kvp_fsm_obj *kvp_fsm_obj_alloc(const char *key, size_t key_len, unsigned n_replicas)
{
    struct kvp_fsm_obj *o =
        malloc(sizeof(*o) + n_replicas * sizeof(struct kvp_fsm_replica) + key_len + 1);
    if (!o)
        return NULL;
    memset(o, 0, sizeof(*o));
    o->n_replicas = (uint8_t)n_replicas;
    o->key_len = (uint16_t)key_len;
    o->hash = kvp_fsm_hash(key, key_len);
    char *k = kvp_fsm_obj_key(o);
    memcpy(k, key, key_len);
    k[key_len] = '\0';
    return o;
}

int kvp_fsm_pending_add(struct kvp_master_fsm *f, struct kvp_fsm_obj *o)
{
    if (f->n_pending == f->pending_cap) {
        uint64_t cap = f->pending_cap ? f->pending_cap * 2 : 64;
        struct kvp_fsm_obj **p = realloc(f->pending, cap * sizeof(*p));
        if (!p)
            return KVP_ERR_NOMEM;
        f->pending = p;
        f->pending_cap = cap;
    }
    o->pending_idx = (uint32_t)f->n_pending;
    f->pending[f->n_pending++] = o;
    return KVP_OK;
}

void kvp_fsm_pending_del(struct kvp_master_fsm *f, struct kvp_fsm_obj *o)
{
    uint64_t i = o->pending_idx;
    struct kvp_fsm_obj *last = f->pending[--f->n_pending];
    f->pending[i] = last;
    last->pending_idx = (uint32_t)i;
}

int kvp_fsm_intent_add(struct kvp_master_fsm *f, struct kvp_fsm_obj *o, uint64_t deadline_ms)
{
    if (f->n_intents == f->intents_cap) {
        uint64_t cap = f->intents_cap ? f->intents_cap * 2 : 16;
        struct kvp_fsm_intent_ent *p = realloc(f->intents, cap * sizeof(*p));
        if (!p)
            return KVP_ERR_NOMEM;
        f->intents = p;
        f->intents_cap = cap;
    }
    o->pending_idx = (uint32_t)f->n_intents;
    f->intents[f->n_intents++] = (struct kvp_fsm_intent_ent){o, deadline_ms};
    return KVP_OK;
}

void kvp_fsm_intent_del(struct kvp_master_fsm *f, struct kvp_fsm_obj *o)
{
    uint64_t i = o->pending_idx;
    f->intents[i] = f->intents[--f->n_intents];
    f->intents[i].o->pending_idx = (uint32_t)i;
}

uint64_t kvp_fsm_obj_deadline(const struct kvp_master_fsm *f, const struct kvp_fsm_obj *o)
{
    if (o->state == KVP_FSM_OBJ_PENDING)
        return o->u.deadline_ms;
    if (f && o->state == KVP_FSM_OBJ_INTENT && o->pending_idx < f->n_intents)
        return f->intents[o->pending_idx].deadline_ms;
    return 0;
}

_Static_assert(KVP_FSM_INTENT_MAX_REPLICAS == KVP_FSM_MAX_REPLICAS, "struct kvp_fsm_intent holds every replica");

static void intent_fill(const struct kvp_master_fsm *f, const struct kvp_fsm_intent_ent *e,
                        struct kvp_fsm_intent *out)
{
    const struct kvp_fsm_obj *o = e->o;
    memset(out, 0, sizeof(*out));
    out->key = kvp_fsm_obj_key(o);
    out->op_id = o->op_id;
    out->size = o->size;
    out->checksum = o->u.checksum;
    out->term = o->term;
    out->deadline_ms = e->deadline_ms;
    out->replica_num = o->pad[0];
    out->soft_pin = o->soft_pin != 0;
    out->nreplicas = o->n_replicas;
    for (unsigned i = 0; i < o->n_replicas; i++) {
        out->replicas[i].segment_id = o->rep[i].segment_id;
        out->replicas[i].offset = o->rep[i].offset;
    }
    (void)f;
}

void kvp_fsm_intent_each(const struct kvp_master_fsm *fsm, bool (*fn)(const struct kvp_fsm_intent *, void *),
                         void *arg)
{
    struct kvp_fsm_intent it;
    for (uint64_t i = 0; fsm && fn && i < fsm->n_intents; i++) {
        intent_fill(fsm, &fsm->intents[i], &it);
        if (!fn(&it, arg))
            break;
    }
}

bool kvp_fsm_intent_get(const struct kvp_master_fsm *fsm, const char *key, struct kvp_fsm_intent *out)
{
    size_t klen;
    if (!fsm || !out || !kvp_fsm_key_valid(key, &klen))
        return false;
    const struct kvp_fsm_obj *o = kvp_fsm_obj_find(fsm, key, klen);
    if (!o || o->state != KVP_FSM_OBJ_INTENT || o->pending_idx >= fsm->n_intents)
        return false;
    intent_fill(fsm, &fsm->intents[o->pending_idx], out);
    return true;
}

uint64_t kvp_fsm_intent_count(const struct kvp_master_fsm *fsm)
{
    return fsm ? fsm->n_intents : 0;
}

/* ------------------------------------------------------------------ segments */

struct kvp_fsm_seg *kvp_fsm_seg_get(const struct kvp_master_fsm *f, uint32_t id)
{
    if (id == 0 || id > f->n_segs_ids)
        return NULL;
    return f->segs[id - 1];
}

struct kvp_fsm_seg *kvp_fsm_seg_by_name(const struct kvp_master_fsm *f, const char *name)
{
    for (uint32_t i = 0; i < f->n_segs_ids; i++) {
        struct kvp_fsm_seg *s = f->segs[i];
        if (s && s->state != KVP__SEGMENT_STATE__SEGMENT_LOST && strcmp(s->name, name) == 0)
            return s;
    }
    return NULL;
}

void kvp_fsm_seg_free(struct kvp_fsm_seg *s)
{
    if (!s)
        return;
    kvp_alloc_fini(&s->alloc);
    kvp_fsm_resv_drop_all(s);
    free(s->q);
    free(s->name);
    free(s->host);
    free(s->endpoint);
    free(s);
}

/* Room for one more entry after the tail (tail) or before the head (!tail). When that side is
 * full the live entries move, into an array of at least twice their count plus 32 slots, so that
 * the side asked for gets three quarters of the free slots and the other side the rest: each
 * move of n entries buys at least n / 4 + 8 pushes on either side (amortised O(1)). */
static int quar_room(struct kvp_fsm_seg *s, bool tail)
{
    if (tail ? s->q_len < s->q_cap : s->q_head > 0)
        return KVP_OK;
    uint64_t live = s->q_len - s->q_head, cap = s->q_cap;
    if (cap < 2 * live + 32) {
        cap = 2 * live + 32;
        struct kvp_fsm_quar *q = realloc(s->q, cap * sizeof(*q));
        if (!q)
            return KVP_ERR_NOMEM;
        s->q = q;
        s->q_cap = cap;
    }
    uint64_t spare = cap - live, head = tail ? spare / 4 : spare - spare / 4;
    memmove(s->q + head, s->q + s->q_head, live * sizeof(*s->q));
    s->q_head = head;
    s->q_len = head + live;
    return KVP_OK;
}

int kvp_fsm_quarantine_push(const struct kvp_master_fsm *f, struct kvp_fsm_seg *s, uint64_t off, uint64_t len,
                            uint64_t now_ms)
{
    bool own_time = f->feature_level >= KVP_FEATURE_QUARANTINE_OWN_TIME;
    uint64_t live = s->q_len - s->q_head;
    /* Levels 1-4 (a cluster that may hold a member of an older release): the FIFO's clamp, as
     * every member of those releases applies it. An entry held far ahead (a revoked put's
     * deadline) thus holds the frees after it on this segment. */
    if (!own_time && live && s->q[s->q_len - 1].freed_at_ms > now_ms)
        now_ms = s->q[s->q_len - 1].freed_at_ms;
    struct kvp_fsm_quar e = {.offset = off, .len = len, .freed_at_ms = now_ms};
    if (!live || s->q[s->q_len - 1].freed_at_ms <= now_ms) {
        if (quar_room(s, true))
            return KVP_ERR_NOMEM;
        if (s->q_len > s->q_head)
            e.run = s->q[s->q_len - 1].run + s->q[s->q_len - 1].len;
        s->q[s->q_len++] = e;
    } else {
        /* Level 5: older than the tail. It goes after every entry of a time <= its own (the
         * first of a later time is found by binary search), the shorter side moving by one. The
         * order of entries of one time does not matter: a release frees all of them or none. */
        uint64_t lo = s->q_head, hi = s->q_len - 1; /* q[hi] is later */
        while (lo < hi) {
            uint64_t mid = lo + (hi - lo) / 2;
            if (s->q[mid].freed_at_ms <= now_ms)
                lo = mid + 1;
            else
                hi = mid;
        }
        uint64_t before = lo - s->q_head, after = s->q_len - lo;
        bool left = before < after;
        if (quar_room(s, !left))
            return KVP_ERR_NOMEM;
        /* The running count of the side that moves shifts by len (those entries are touched
         * anyway): the entries before the new one go down, or the ones after it go up. */
        uint64_t pos = s->q_head + before; /* the first later entry (after quar_room) */
        if (left) {
            e.run = s->q[pos].run - len;
            for (uint64_t k = s->q_head; k < pos; k++)
                s->q[k].run -= len;
            memmove(s->q + s->q_head - 1, s->q + s->q_head, before * sizeof(*s->q));
            s->q_head--;
            s->q[s->q_head + before] = e;
        } else {
            e.run = s->q[pos].run;
            for (uint64_t k = pos; k < s->q_len; k++)
                s->q[k].run += len;
            memmove(s->q + pos + 1, s->q + pos, after * sizeof(*s->q));
            s->q_len++;
            s->q[pos] = e;
        }
    }
    s->quarantined_bytes += len;
    return KVP_OK;
}

uint64_t kvp_master_fsm_quarantine_late(const struct kvp_master_fsm *f, uint64_t after_wall_ms)
{
    uint64_t grace = f->params.fence_grace_ms, late = 0;
    for (uint32_t i = 0; i < f->n_segs_ids; i++) {
        const struct kvp_fsm_seg *s = f->segs[i];
        if (!s || s->state == KVP__SEGMENT_STATE__SEGMENT_LOST || s->q_head == s->q_len)
            continue;
        /* Times are non-decreasing at every level (kvp_fsm_quarantine_push), so the late
         * entries are a suffix: its start found by binary search, its bytes from the running
         * count. O(log entries) per segment, however many are late. */
        uint64_t lo = s->q_head, hi = s->q_len;
        while (lo < hi) {
            uint64_t mid = lo + (hi - lo) / 2, at = s->q[mid].freed_at_ms;
            if (at <= UINT64_MAX - grace && at + grace <= after_wall_ms)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < s->q_len)
            late += s->q[s->q_len - 1].run + s->q[s->q_len - 1].len - s->q[lo].run;
    }
    return late;
}

void kvp_fsm_obj_destroy(struct kvp_master_fsm *f, struct kvp_fsm_obj *o, uint64_t now_ms)
{
    kvp_fsm_snap_touch(f, o); /* before the intent list forgets its deadline */
    uint64_t len = kvp_alloc_round(o->size);
    /* A pending put's writer may still have WRITE frames in flight until its deadline (the
     * segment refuses payload after the frame's write deadline, which the client sets no later
     * than the put's deadline; docs/fencing.md). So its space counts as freed at the deadline,
     * not now: reuse waits for deadline + fence_grace_ms (contract C3). */
    uint64_t freed_at = now_ms;
    uint64_t deadline = kvp_fsm_obj_deadline(f, o); /* an intent's writer too (PENDING, INTENT) */
    if (deadline > freed_at)
        freed_at = deadline;
    for (unsigned i = 0; i < o->n_replicas; i++) {
        struct kvp_fsm_seg *s = kvp_fsm_seg_get(f, o->rep[i].segment_id);
        if (!s || s->state == KVP__SEGMENT_STATE__SEGMENT_LOST)
            continue;
        s->used_bytes -= len;
        s->n_replicas--;
        if (kvp_fsm_quarantine_push(f, s, o->rep[i].offset, len, freed_at) != KVP_OK)
            kvp_log_error(KVP_FSM_ACTOR, "segment %u: quarantine %llu bytes at %llu: no memory, "
                          "extent leaked until restore", s->id, (unsigned long long)len,
                          (unsigned long long)o->rep[i].offset);
    }
    if (o->state == KVP_FSM_OBJ_PENDING)
        kvp_fsm_pending_del(f, o);
    else if (o->state == KVP_FSM_OBJ_INTENT)
        kvp_fsm_intent_del(f, o);
    else {
        if (o->soft_pin)
            f->pinned_bytes -= o->size;
        kvp_fsm_tenant_count(f, o, -1);
    }
    kvp_fsm_obj_unlink(f, o);
    free(o);
}

/* Remove replica i of o (on a segment that is gone); the key moves down with the array. */
static void obj_drop_replica(struct kvp_fsm_obj *o, unsigned i)
{
    memmove(&o->rep[i], &o->rep[i + 1],
            (o->n_replicas - i - 1) * sizeof(o->rep[0]) + o->key_len + 1u);
    o->n_replicas--;
}

uint64_t kvp_fsm_drop_segment_replicas(struct kvp_master_fsm *f, struct kvp_fsm_seg *s,
                                       uint64_t now_ms)
{
    if (s->n_replicas == 0)
        return 0;
    /* Collect first: destroying objects reshuffles the table. */
    uint64_t n = 0, cap = s->n_replicas;
    struct kvp_fsm_obj **hit = malloc(cap * sizeof(*hit));
    uint64_t affected = 0;
    if (!hit) {
        kvp_log_error(KVP_FSM_ACTOR, "segment %u: drop replicas: no memory", s->id);
        return 0;
    }
    for (uint64_t i = 0; i < f->tab_cap && n < cap; i++) {
        struct kvp_fsm_obj *o = f->tab[i];
        if (!o)
            continue;
        for (unsigned r = 0; r < o->n_replicas; r++)
            if (o->rep[r].segment_id == s->id) {
                hit[n++] = o;
                break;
            }
    }
    uint64_t len;
    for (uint64_t k = 0; k < n; k++) {
        struct kvp_fsm_obj *o = hit[k];
        kvp_fsm_snap_touch(f, o);
        len = kvp_alloc_round(o->size);
        for (unsigned r = 0; r < o->n_replicas;) {
            if (o->rep[r].segment_id == s->id) {
                obj_drop_replica(o, r);
                s->used_bytes -= len;
                s->n_replicas--;
            } else {
                r++;
            }
        }
        bool any_complete = false; /* a PENDING repair replica alone holds no data */
        for (unsigned r = 0; r < o->n_replicas; r++)
            any_complete |= o->rep[r].state == KVP__REPLICA_STATE__REPLICA_COMPLETE;
        if (o->state == KVP_FSM_OBJ_PENDING || !any_complete) {
            kvp_fsm_obj_destroy(f, o, now_ms);
            affected++;
        }
    }
    free(hit);
    return affected;
}

void kvp_fsm_state_clear(struct kvp_master_fsm *f)
{
    kvp_fsm_snap_free(f);
    for (uint64_t i = 0; i < f->tab_cap; i++)
        free(f->tab[i]);
    free(f->tab);
    f->tab = NULL;
    f->tab_cap = 0;
    free(f->ntab); /* the objects were freed above */
    f->ntab = NULL;
    f->ncap = f->ncursor = 0;
    f->n_objects = 0;
    free(f->pending);
    f->pending = NULL;
    f->n_pending = f->pending_cap = 0;
    free(f->intents);
    f->intents = NULL;
    f->n_intents = f->intents_cap = 0;
    for (uint32_t i = 0; i < f->n_segs_ids; i++)
        kvp_fsm_seg_free(f->segs[i]);
    free(f->segs);
    f->segs = NULL;
    f->n_segs_ids = f->segs_cap = 0;
    f->pinned_bytes = 0;
    f->feature_level = 0;
    kvp_fsm_tenants_clear(f);
}

/* ------------------------------------------------------------------ lifecycle */

int kvp_master_fsm_new(struct kvp_master_fsm **out, const struct kvp_master_fsm_params *p)
{
    if (!out || !p)
        return KVP_ERR_INVALID;
    struct kvp_master_fsm *f = calloc(1, sizeof(*f));
    if (!f)
        return KVP_ERR_NOMEM;
    f->params = *p;
    f->repair_epoch = 1;
    *out = f;
    return KVP_OK;
}

uint64_t kvp_master_fsm_repair_epoch(const struct kvp_master_fsm *fsm)
{
    return fsm ? fsm->repair_epoch : 0;
}

uint32_t kvp_master_fsm_feature_level(const struct kvp_master_fsm *fsm)
{
    return fsm ? fsm->feature_level : 0;
}

void kvp_master_fsm_destroy(struct kvp_master_fsm **fsm)
{
    if (!fsm || !*fsm)
        return;
    kvp_fsm_state_clear(*fsm);
    free(*fsm);
    *fsm = NULL;
}

/* ------------------------------------------------------------------ responses */

Kvp__Response *kvp_fsm_resp_new(void)
{
    Kvp__Response *r = malloc(sizeof(*r));
    if (r)
        kvp__response__init(r);
    return r;
}

int kvp_fsm_resp_error(Kvp__Response *r, int status, const char *fmt, ...)
{
    r->status = status;
    char *msg = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    if (n >= 0 && msg) {
        if (r->error && r->error != protobuf_c_empty_string)
            free(r->error);
        r->error = msg;
    }
    return status;
}

Kvp__Replica *kvp_fsm_replica_msg(const struct kvp_fsm_seg *s, const struct kvp_fsm_replica *rp)
{
    Kvp__Replica *m = malloc(sizeof(*m));
    if (!m)
        return NULL;
    kvp__replica__init(m);
    m->segment_id = rp->segment_id;
    m->offset = rp->offset;
    m->state = (Kvp__ReplicaState)rp->state;
    m->owner_pid = s->owner_pid;
    m->endpoint = kvp_fsm_strdup(s->endpoint);
    m->host = kvp_fsm_strdup(s->host);
    if (!m->endpoint || !m->host) {
        protobuf_c_message_free_unpacked(&m->base, NULL);
        return NULL;
    }
    return m;
}

void kvp_master_fsm_response_free(Kvp__Response *resp)
{
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
}

/* ------------------------------------------------------------------ entry points */

void kvp_master_fsm_hold_note(void *fsm, bool begin, char *buf, size_t cap)
{
    struct kvp_master_fsm *f = fsm;
    if (!f)
        return;
    if (begin) {
        f->work_mark = f->work;
        return;
    }
    if (!buf || !cap)
        return;
    const struct kvp_fsm_work *w = &f->work, *m = &f->work_mark;
#define D(x) (unsigned long long)(w->x - m->x)
    snprintf(buf, cap,
             "%llu commands (PutStart items %llu, PutEnd items %llu, other %llu, last other case %d); table %llu "
             "slots, %llu objects, growth: begun %llu, slots copied %llu, swaps %llu, whole %llu, %llu B "
             "allocated, %llu B freed; snapshot: begun %llu, slots visited %llu, objects written %llu, early "
             "bytes %llu",
             D(cmds), D(put_start_items), D(put_end_items), D(other_cmds), w->last_other,
             (unsigned long long)f->tab_cap, (unsigned long long)f->n_objects, D(grow_begun), D(grow_slots),
             D(grow_swaps), D(grow_whole), D(tab_bytes_alloc), D(tab_bytes_freed), D(snap_begun), D(snap_slots),
             D(snap_objects), D(snap_early_bytes));
#undef D
}

int kvp_master_fsm_apply(struct kvp_master_fsm *fsm, const Kvp__Command *cmd, Kvp__Response **out)
{
    if (!fsm || !cmd || !out)
        return KVP_ERR_INVALID;
    *out = NULL;
    Kvp__Response *r = kvp_fsm_resp_new();
    if (!r)
        return KVP_ERR_NOMEM;
    struct kvp_fsm_work *w = &fsm->work;
    w->cmds++;
    if (cmd->body_case == KVP__COMMAND__BODY_PUT_START && cmd->put_start)
        w->put_start_items += cmd->put_start->n_items;
    else if (cmd->body_case == KVP__COMMAND__BODY_PUT_END && cmd->put_end)
        w->put_end_items += cmd->put_end->n_items;
    else {
        w->other_cmds++;
        w->last_other = (int)cmd->body_case;
    }
    int rc = kvp_fsm_apply_cmd(fsm, cmd, r);
    if (rc != KVP_OK) {
        kvp_master_fsm_response_free(r);
        return rc;
    }
    *out = r;
    return KVP_OK;
}

int kvp_master_fsm_query_vis(const struct kvp_master_fsm *fsm, const Kvp__Request *req,
                             const struct kvp_fsm_qvis *vis, Kvp__Response **out)
{
    if (!fsm || !req || !out)
        return KVP_ERR_INVALID;
    *out = NULL;
    Kvp__Response *r = kvp_fsm_resp_new();
    if (!r)
        return KVP_ERR_NOMEM;
    r->req_id = req->req_id;
    int rc = kvp_fsm_query_req(fsm, req, r, vis);
    if (rc != KVP_OK) {
        kvp_master_fsm_response_free(r);
        return rc;
    }
    *out = r;
    return KVP_OK;
}

int kvp_master_fsm_query(const struct kvp_master_fsm *fsm, const Kvp__Request *req, Kvp__Response **out)
{
    return kvp_master_fsm_query_vis(fsm, req, NULL, out);
}

void kvp_master_fsm_stats(const struct kvp_master_fsm *fsm, struct kvp_master_fsm_stats *out)
{
    memset(out, 0, sizeof(*out));
    for (uint32_t i = 0; i < fsm->n_segs_ids; i++) {
        const struct kvp_fsm_seg *s = fsm->segs[i];
        if (!s || s->state == KVP__SEGMENT_STATE__SEGMENT_LOST)
            continue;
        out->segments++;
        out->capacity_bytes += s->alloc.capacity;
        out->used_bytes += s->used_bytes;
        out->quarantined_bytes += s->quarantined_bytes;
    }
    out->objects = fsm->n_objects - fsm->n_pending - fsm->n_intents;
    out->pending_puts = fsm->n_pending + fsm->n_intents;
    out->pinned_bytes = fsm->pinned_bytes;
}

void kvp_master_fsm_foreach_object(const struct kvp_master_fsm *fsm,
                                   void (*cb)(void *ctx, const char *key, uint64_t size,
                                              bool soft_pin),
                                   void *ctx)
{
    for (uint64_t i = 0; i < fsm->tab_cap; i++) {
        const struct kvp_fsm_obj *o = fsm->tab[i];
        if (o && o->state == KVP_FSM_OBJ_COMPLETE)
            cb(ctx, kvp_fsm_obj_key(o), o->size, o->soft_pin != 0);
    }
}

uint64_t kvp_master_fsm_foreach_object_slice(const struct kvp_master_fsm *fsm, uint64_t from, uint64_t slots,
                                             void (*cb)(void *ctx, const char *key, uint64_t size,
                                                        bool soft_pin),
                                             void *ctx, uint64_t *table_slots, uint64_t *table_moves)
{
    if (table_slots)
        *table_slots = fsm->tab_cap;
    if (table_moves)
        *table_moves = fsm->tab_moves;
    if (from >= fsm->tab_cap)
        from = 0;
    uint64_t to = slots && slots < fsm->tab_cap - from ? from + slots : fsm->tab_cap;
    for (uint64_t i = from; i < to; i++) {
        if (i + 16 < to && fsm->tab[i + 16])
            __builtin_prefetch(fsm->tab[i + 16]); /* each object is a cache miss: keep some in flight */
        const struct kvp_fsm_obj *o = fsm->tab[i];
        if (o && o->state == KVP_FSM_OBJ_COMPLETE)
            cb(ctx, kvp_fsm_obj_key(o), o->size, o->soft_pin != 0);
    }
    return to < fsm->tab_cap ? to : 0;
}

/* ------------------------------------------------------------------ invariants (tests) */

int kvp_master_fsm_check(const struct kvp_master_fsm *fsm)
{
    uint64_t objects = 0, pending = 0, intents = 0, pinned = 0;
    /* Rebuild every live segment's allocator from the recorded extents: any overlap fails. */
    struct kvp_alloc *shadow = calloc(fsm->n_segs_ids ? fsm->n_segs_ids : 1, sizeof(*shadow));
    uint64_t *used = calloc(fsm->n_segs_ids ? fsm->n_segs_ids : 1, sizeof(*used));
    uint64_t *reps = calloc(fsm->n_segs_ids ? fsm->n_segs_ids : 1, sizeof(*reps));
    int rc = 0;
    if (!shadow || !used || !reps) {
        rc = -100;
        goto out;
    }
    for (uint32_t i = 0; i < fsm->n_segs_ids; i++) {
        const struct kvp_fsm_seg *s = fsm->segs[i];
        if (!s || s->state == KVP__SEGMENT_STATE__SEGMENT_LOST)
            continue;
        if (kvp_alloc_check(&s->alloc)) {
            rc = -1;
            goto out;
        }
        if (s->alloc.free_bytes + s->used_bytes + s->quarantined_bytes != s->alloc.capacity) {
            rc = -2;
            goto out;
        }
        if (kvp_alloc_init(&shadow[i], s->size)) {
            rc = -100;
            goto out;
        }
        uint64_t qb = 0;
        if (s->q_head > s->q_len || s->q_len > s->q_cap) {
            rc = -3;
            goto out;
        }
        for (uint64_t k = s->q_head; k < s->q_len; k++) {
            if (k > s->q_head && (s->q[k].freed_at_ms < s->q[k - 1].freed_at_ms || /* time order */
                                  s->q[k].run != s->q[k - 1].run + s->q[k - 1].len)) {
                rc = -3;
                goto out;
            }
            if (kvp_alloc_reserve(&shadow[i], s->q[k].offset, s->q[k].len)) {
                rc = -4;
                goto out;
            }
            qb += s->q[k].len;
        }
        if (qb != s->quarantined_bytes) {
            rc = -5;
            goto out;
        }
        /* Reservations: used[] sorted, disjoint, inside; the gaps are allocated and counted in
         * used_bytes (the used ranges belong to whoever owns them now). */
        for (uint32_t k = 0; k < s->n_resv; k++) {
            const struct kvp_fsm_resv *v = &s->resv[k];
            uint64_t pos = v->offset, end = v->offset + v->len;
            for (uint32_t u = 0; u <= v->n_used; u++) {
                uint64_t next = u < v->n_used ? v->used[u].offset : end;
                if (next < pos || next > end || (u < v->n_used && v->used[u].len > end - next)) {
                    rc = -14;
                    goto out;
                }
                if (next > pos && kvp_alloc_reserve(&shadow[i], pos, next - pos)) {
                    rc = -15;
                    goto out;
                }
                used[i] += next - pos;
                if (u < v->n_used)
                    pos = next + v->used[u].len;
            }
        }
    }
    for (uint64_t t = 0; t < fsm->tab_cap; t++) {
        const struct kvp_fsm_obj *o = fsm->tab[t];
        if (!o)
            continue;
        objects++;
        if (kvp_fsm_obj_find(fsm, kvp_fsm_obj_key(o), o->key_len) != o) {
            rc = -6;
            goto out;
        }
        if (o->state == KVP_FSM_OBJ_PENDING) {
            pending++;
            if (o->pending_idx >= fsm->n_pending || fsm->pending[o->pending_idx] != o) {
                rc = -7;
                goto out;
            }
        } else if (o->state == KVP_FSM_OBJ_INTENT) {
            intents++;
            if (o->pending_idx >= fsm->n_intents || fsm->intents[o->pending_idx].o != o) {
                rc = -7;
                goto out;
            }
        } else if (o->soft_pin) {
            pinned += o->size;
        }
        if (o->n_replicas == 0) {
            rc = -8;
            goto out;
        }
        for (unsigned r = 0; r < o->n_replicas; r++) {
            uint32_t id = o->rep[r].segment_id;
            const struct kvp_fsm_seg *s = kvp_fsm_seg_get(fsm, id);
            if (!s || s->state == KVP__SEGMENT_STATE__SEGMENT_LOST) {
                rc = -9;
                goto out;
            }
            for (unsigned r2 = 0; r2 < r; r2++)
                if (o->rep[r2].segment_id == id) {
                    rc = -10;
                    goto out;
                }
            if (kvp_alloc_reserve(&shadow[id - 1], o->rep[r].offset, o->size)) {
                rc = -11;
                goto out;
            }
            used[id - 1] += kvp_alloc_round(o->size);
            reps[id - 1]++;
        }
    }
    if (objects != fsm->n_objects || pending != fsm->n_pending || intents != fsm->n_intents ||
        pinned != fsm->pinned_bytes) {
        rc = -12;
        goto out;
    }
    if ((rc = kvp_fsm_tenants_check(fsm)) != 0)
        goto out;
    if (fsm->ntab) {
        /* A growth in steps: the new table holds exactly the objects marked moved, each where
         * its probe chain finds it, and every slot already copied is marked. */
        uint64_t in_new = 0, marked = 0;
        for (uint64_t i = 0; i < fsm->ncap; i++)
            in_new += fsm->ntab[i] != NULL;
        for (uint64_t i = 0; i < fsm->tab_cap; i++) {
            const struct kvp_fsm_obj *o = fsm->tab[i];
            if (!o)
                continue;
            bool moved = KVP_FSM_OBJ_MOVED(o) == fsm->grow_gen;
            marked += moved;
            if (i < fsm->ncursor && !moved) {
                rc = -15;
                goto out;
            }
            uint64_t mask = fsm->ncap - 1, j = o->hash & mask;
            while (moved && fsm->ntab[j] && fsm->ntab[j] != o)
                j = (j + 1) & mask;
            if (moved && fsm->ntab[j] != o) {
                rc = -15;
                goto out;
            }
        }
        if (in_new != marked) {
            rc = -15;
            goto out;
        }
    }
    for (uint32_t i = 0; i < fsm->n_segs_ids; i++) {
        const struct kvp_fsm_seg *s = fsm->segs[i];
        if (!s || s->state == KVP__SEGMENT_STATE__SEGMENT_LOST)
            continue;
        if (used[i] != s->used_bytes || reps[i] != s->n_replicas ||
            shadow[i].free_bytes != s->alloc.free_bytes || shadow[i].n_free != s->alloc.n_free) {
            rc = -13;
            goto out;
        }
    }
out:
    if (shadow)
        for (uint32_t i = 0; i < fsm->n_segs_ids; i++)
            kvp_alloc_fini(&shadow[i]);
    free(shadow);
    free(used);
    free(reps);
    return rc;
}
