/*
 * fsm_snap.c — snapshot / restore (wire/snapshot.proto) and the raftlog byte adapters.
 *
 * The outer Snapshot message is written and read field by field (protobuf encoding of its
 * repeated fields), each segment and object packed/unpacked on its own with protobuf-c, so a
 * snapshot of a million objects never exists as one message tree in memory.
 * Restore builds a complete new state aside and swaps it in only when every check passed: a bad
 * snapshot returns KVP_ERR_MALFORMED and leaves the state unchanged. It runs in steps
 * (kvp_master_fsm_restore_begin/step/end/drop) so that raftlog can install a large snapshot
 * a few milliseconds per loop iteration; kvp_master_fsm_restore runs the steps in one go.
 */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "actors/master/fsm/fsm_internal.h"
#include "actors/master/fsm/version.h"
#include "kvpool.h"
#include "runtime/log.h"
#include "wire/snapshot.pb-c.h"

typedef struct kvp_master_fsm fsm_t;

#define SNAP_FORMAT 1u
/* Written instead of 1 while any reservation exists (feature level 3): a master of level 2 or
 * less refuses it (KVP_ERR_VERSION) rather than restore without the reserved space. */
#define SNAP_FORMAT_RESV 2u
/* Written instead of 1 or 2 once feature level 5 is committed (each quarantine entry released at
 * its own time, version.h): the same fields, but a member of level 4 or less would restore the
 * image and then apply the log by the FIFO's clamp, and free later than the others. It refuses
 * format 3 (KVP_ERR_VERSION) instead. */
#define SNAP_FORMAT_L5 3u
/* Written instead of 3 once feature level 6 is committed: pending intents (SnapObject.intent)
 * may be in it, which a master of level 5 or less would restore as pending puts and revoke at
 * their deadline. It refuses format 4 (KVP_ERR_VERSION) instead. */
#define SNAP_FORMAT_L6 4u
_Static_assert(sizeof(struct kvp_fsm_range) == 2 * sizeof(uint64_t), "SnapReservation.used is read as ranges");
#define SNAP_MAX_SEGMENT_IDS (1u << 24)

enum { F_FORMAT = 1, F_LAST_SEG = 2, F_SEGMENT = 3, F_OBJECT = 4, F_FEATURE_LEVEL = 5, F_N_OBJECTS = 7, F_TAB_CAP = 8, F_CHECKSUM = 15 };
/* A restore sizes its object table once, before the first object, from the object count and
 * the writer's table capacity the snapshot announces (fields 7 and 8, hints: older snapshots
 * lack them and the table then grows as objects arrive). The writer's capacity is preferred:
 * the incremental snapshot writes objects in its table's slot order, and inserting a table's
 * slots in order into a smaller linear-probing table piles them into ever longer runs (quadratic
 * probing time: a 4.5M-object start-up restore ran for minutes in tab_place); into a table of the
 * same capacity each lands at or before its old slot. */
#define SNAP_MAX_OBJECTS_HINT ((uint64_t)1 << 32)

/* ------------------------------------------------------------------ output buffer */

struct obuf {
    ProtobufCBuffer base;
    uint8_t *p;
    size_t len, cap;
    int err;
};

static void obuf_append(ProtobufCBuffer *b, size_t n, const uint8_t *d)
{
    struct obuf *o = (struct obuf *)b;
    if (o->err)
        return;
    if (o->len + n > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap < o->len + n)
            cap *= 2;
        uint8_t *p = realloc(o->p, cap);
        if (!p) {
            o->err = 1;
            return;
        }
        o->p = p;
        o->cap = cap;
    }
    memcpy(o->p + o->len, d, n);
    o->len += n;
}

static size_t enc_varint(uint8_t *p, uint64_t v);

static void put_varint(struct obuf *o, uint64_t v)
{
    uint8_t b[10];
    obuf_append(&o->base, enc_varint(b, v), b);
}

static void put_message(struct obuf *o, unsigned field, const ProtobufCMessage *m)
{
    put_varint(o, (uint64_t)field << 3 | 2u);
    put_varint(o, protobuf_c_message_get_packed_size(m));
    protobuf_c_message_pack_to_buffer(m, &o->base);
}

/* ------------------------------------------------------------------ snapshot */

static int quar_cmp(const void *a, const void *b)
{
    const struct kvp_fsm_quar *x = a, *y = b;
    if (x->freed_at_ms != y->freed_at_ms)
        return x->freed_at_ms < y->freed_at_ms ? -1 : 1;
    return x->offset < y->offset ? -1 : (x->offset > y->offset);
}

/* Objects go out in (key hash, key) order: a total order on keys, so every node writes the same
 * bytes for the same state, and sorting compares cached hashes in a flat array instead of
 * chasing two pointers per comparison (a strcmp sort of a million keys took ~0.5 s). */
struct obj_ref {
    uint32_t hash;
    const struct kvp_fsm_obj *o;
};

static int obj_cmp(const void *a, const void *b)
{
    const struct obj_ref *x = a, *y = b;
    if (x->hash != y->hash)
        return x->hash < y->hash ? -1 : 1;
    return strcmp(kvp_fsm_obj_key(x->o), kvp_fsm_obj_key(y->o));
}

static void put_segment(struct obuf *o, const struct kvp_fsm_seg *s)
{
    Kvp__SnapSegment m;
    kvp__snap_segment__init(&m);
    m.id = s->id;
    m.name = s->name;
    m.host = s->host;
    m.endpoint = s->endpoint;
    m.size = s->size;
    m.owner_pid = s->owner_pid;
    m.state = (uint32_t)s->state;
    size_t nq = s->q_len - s->q_head;
    struct kvp_fsm_quar *q = NULL;
    Kvp__SnapQuarantine *qm = NULL, **qp = NULL;
    Kvp__SnapReservation *rm = NULL, **rp = NULL;
    if (nq) {
        q = malloc(nq * sizeof(*q));
        qm = malloc(nq * sizeof(*qm));
        qp = malloc(nq * sizeof(*qp));
        if (!q || !qm || !qp) {
            o->err = 1;
            goto out;
        }
        memcpy(q, s->q + s->q_head, nq * sizeof(*q));
        qsort(q, nq, sizeof(*q), quar_cmp);
        for (size_t i = 0; i < nq; i++) {
            kvp__snap_quarantine__init(&qm[i]);
            qm[i].offset = q[i].offset;
            qm[i].length = q[i].len;
            qm[i].freed_at_wall_ms = q[i].freed_at_ms;
            qp[i] = &qm[i];
        }
        m.n_quarantine = nq;
        m.quarantine = qp;
    }
    if (s->n_resv) {
        rm = calloc(s->n_resv, sizeof(*rm));
        rp = calloc(s->n_resv, sizeof(*rp));
        if (!rm || !rp) {
            o->err = 1;
            goto out;
        }
        for (uint32_t i = 0; i < s->n_resv; i++) {
            const struct kvp_fsm_resv *v = &s->resv[i];
            kvp__snap_reservation__init(&rm[i]);
            rm[i].term = v->term;
            rm[i].offset = v->offset;
            rm[i].length = v->len;
            rm[i].horizon_wall_ms = v->horizon_ms;
            rm[i].n_used = 2 * (size_t)v->n_used;
            rm[i].used = (uint64_t *)v->used; /* struct kvp_fsm_range is two uint64_t */
            rp[i] = &rm[i];
        }
        m.n_reservations = s->n_resv;
        m.reservations = rp;
    }
    put_message(o, F_SEGMENT, &m.base);
out:
    free(q);
    free(qm);
    free(qp);
    free(rm);
    free(rp);
}

/* Protobuf encoding of SnapObject by hand, byte for byte what protobuf-c's pack writes (fields
 * in number order, proto3 zero values left out; test_fsm_snap checks the two agree): packing a
 * million objects through protobuf-c's reflection was the larger part of a snapshot's time. */
static size_t enc_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

static size_t enc_u64(uint8_t *p, unsigned field, uint64_t v)
{
    if (!v)
        return 0;
    size_t n = enc_varint(p, (uint64_t)field << 3);
    return n + enc_varint(p + n, v);
}

size_t kvp_fsm_snap_object_encode(const fsm_t *f, const struct kvp_fsm_obj *ob, uint8_t *p)
{
    size_t n = 0;
    const char *key = kvp_fsm_obj_key(ob);
    if (ob->key_len) {
        n += enc_varint(p + n, 1u << 3 | 2u);
        n += enc_varint(p + n, ob->key_len);
        memcpy(p + n, key, ob->key_len);
        n += ob->key_len;
    }
    bool complete = ob->state == KVP_FSM_OBJ_COMPLETE, intent = ob->state == KVP_FSM_OBJ_INTENT;
    n += enc_u64(p + n, 2, ob->size);
    n += enc_u64(p + n, 3, ob->op_id);
    n += enc_u64(p + n, 4, ob->term);
    n += enc_u64(p + n, 5, complete);
    n += enc_u64(p + n, 6, complete || intent ? ob->u.checksum : 0);
    n += enc_u64(p + n, 7, complete ? 0 : kvp_fsm_obj_deadline(f, ob));
    n += enc_u64(p + n, 8, ob->soft_pin ? 1 : 0);
    for (unsigned i = 0; i < ob->n_replicas; i++) {
        uint8_t r[32];
        size_t rn = enc_u64(r, 1, ob->rep[i].segment_id);
        rn += enc_u64(r + rn, 2, ob->rep[i].offset);
        rn += enc_u64(r + rn, 3, ob->rep[i].state);
        n += enc_varint(p + n, 9u << 3 | 2u);
        n += enc_varint(p + n, rn);
        memcpy(p + n, r, rn);
        n += rn;
    }
    n += enc_u64(p + n, 40, ob->pad[0]);
    n += enc_u64(p + n, 41, intent); /* format 4 only: none exist below level 6 */
    return n;
}

static void put_object(struct obuf *o, const fsm_t *f, const struct kvp_fsm_obj *ob)
{
    uint8_t b[KVP_FSM_SNAP_OBJECT_MAX + 12];
    size_t len = kvp_fsm_snap_object_encode(f, ob, b + 12);
    size_t h = enc_varint(b, (uint64_t)F_OBJECT << 3 | 2u);
    h += enc_varint(b + h, len);
    memmove(b + h, b + 12, len);
    obuf_append(&o->base, h + len, b);
}

/* What both snapshot writers put before the objects: the format (3 once feature level 5 is
 * committed, else 2 while a reservation exists, so a master of a lower level refuses the image
 * rather than restore it and apply the log its own way), the last segment id, the segments. */
static void put_prefix(struct obuf *o, const fsm_t *f)
{
    bool any_resv = false;
    for (uint32_t i = 0; i < f->n_segs_ids && !any_resv; i++)
        any_resv = f->segs[i] && f->segs[i]->n_resv;
    put_varint(o, F_FORMAT << 3);
    put_varint(o, f->feature_level >= KVP_FEATURE_INTENT                ? SNAP_FORMAT_L6
                  : f->feature_level >= KVP_FEATURE_QUARANTINE_OWN_TIME ? SNAP_FORMAT_L5
                  : any_resv                                           ? SNAP_FORMAT_RESV
                                                                       : SNAP_FORMAT);
    if (f->n_segs_ids) {
        put_varint(o, F_LAST_SEG << 3);
        put_varint(o, f->n_segs_ids);
    }
    /* The committed feature level (RaiseLevelCmd): only once one is committed, so that a state
     * without one packs to the bytes it always did. An older reader skips the unknown field. */
    if (f->feature_level) {
        put_varint(o, F_FEATURE_LEVEL << 3);
        put_varint(o, f->feature_level);
    }
    for (uint32_t i = 0; i < f->n_segs_ids; i++)
        if (f->segs[i])
            put_segment(o, f->segs[i]);
    if (f->n_objects) {
        put_varint(o, F_N_OBJECTS << 3);
        put_varint(o, f->n_objects);
        put_varint(o, F_TAB_CAP << 3);
        /* while the table grows in steps, its successor's size: the value then depends only on
         * the object count and the size, as on every member, not on how far the copy got */
        put_varint(o, f->ntab ? f->ncap : f->tab_cap);
    }
}

/* The incremental snapshot's prefix (fsm_snap_inc.c): the same bytes the whole-state snapshot
 * starts with. */
int kvp_fsm_snap_prefix_encode(const fsm_t *f, uint8_t **buf, size_t *len)
{
    struct obuf o = {.base = {.append = obuf_append}};
    put_prefix(&o, f);
    if (o.err) {
        free(o.p);
        return KVP_ERR_NOMEM;
    }
    *buf = o.p;
    *len = o.len;
    return KVP_OK;
}

/* Sort refs by (hash, key): LSD radix sort on the 32-bit hash (four byte passes), then runs of
 * equal hashes by key. O(n) with sequential memory access. */
static int radix_sort_refs(struct obj_ref *v, size_t n)
{
    struct obj_ref *tmp = malloc((n ? n : 1) * sizeof(*tmp));
    if (!tmp)
        return KVP_ERR_NOMEM;
    struct obj_ref *src = v, *dst = tmp;
    for (unsigned shift = 0; shift < 32; shift += 8) {
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++)
            count[((src[i].hash >> shift) & 0xffu) + 1]++;
        for (unsigned b = 0; b < 256; b++)
            count[b + 1] += count[b];
        for (size_t i = 0; i < n; i++)
            dst[count[(src[i].hash >> shift) & 0xffu]++] = src[i];
        struct obj_ref *t = src;
        src = dst;
        dst = t;
    }
    /* four passes: the sorted data is back in v */
    free(tmp);
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && v[j].hash == v[i].hash)
            j++;
        if (j - i > 1)
            qsort(v + i, j - i, sizeof(*v), obj_cmp);
        i = j;
    }
    return KVP_OK;
}

int kvp_master_fsm_snapshot(const fsm_t *f, uint8_t **buf, size_t *len)
{
    if (!f || !buf || !len)
        return KVP_ERR_INVALID;
    struct obuf o = {.base = {.append = obuf_append}};
    struct obj_ref *v = malloc((f->n_objects ? f->n_objects : 1) * sizeof(*v));
    if (!v)
        return KVP_ERR_NOMEM;
    uint64_t n = 0, est = 4096;
    for (uint64_t i = 0; i < f->tab_cap; i++)
        if (f->tab[i]) {
            const struct kvp_fsm_obj *ob = f->tab[i];
            v[n++] = (struct obj_ref){.hash = ob->hash, .o = ob};
            est += ob->key_len + 48u + 24u * ob->n_replicas;
        }
    /* One buffer of about the final size: growing a tens-of-MB buffer by doubling copies it
     * several times. */
    o.p = malloc(est);
    if (!o.p) {
        free(v);
        return KVP_ERR_NOMEM;
    }
    o.cap = est;
    if (radix_sort_refs(v, n) != KVP_OK) {
        free(v);
        free(o.p);
        return KVP_ERR_NOMEM;
    }
    put_prefix(&o, f);
    for (uint64_t i = 0; i < n && !o.err; i++) {
        if (i + 8 < n) /* objects sit at random heap addresses: fetch ahead of the encoder */
            __builtin_prefetch(v[i + 8].o), __builtin_prefetch((const char *)v[i + 8].o + 64);
        put_object(&o, f, v[i].o);
    }
    free(v);
    if (!o.err) {
        uint64_t sum = XXH3_64bits(o.p, o.len);
        uint8_t le[8];
        for (int i = 0; i < 8; i++)
            le[i] = (uint8_t)(sum >> (8 * i));
        put_varint(&o, F_CHECKSUM << 3 | 1u);
        obuf_append(&o.base, sizeof(le), le);
    }
    if (o.err) {
        free(o.p);
        return KVP_ERR_NOMEM;
    }
    if (!o.p && !(o.p = malloc(1)))
        return KVP_ERR_NOMEM;
    *buf = o.p;
    *len = o.len;
    return KVP_OK;
}

/* ------------------------------------------------------------------ restore */

struct ibuf {
    const uint8_t *p, *end;
};

static int get_varint(struct ibuf *in, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (in->p >= in->end)
            return -1;
        uint8_t b = *in->p++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* Restore collects every segment's used extents (replicas and quarantine) and builds its
 * allocator once at the end from their gaps (restore_allocator): reserving each extent in the
 * free-extent treap as it was read cost two treap splits per replica at random offsets, about
 * 2 s of a million-object restore. */
struct used_ext {
    uint64_t off, len;
};

struct used_vec {
    struct used_ext *v;
    size_t n, cap;
};

struct rctx {
    fsm_t *t;
    struct used_vec *used; /* n_segs_ids entries, by segment id - 1 */
};

static int used_push(struct rctx *c, uint32_t seg_id, uint64_t off, uint64_t len)
{
    struct used_vec *u = &c->used[seg_id - 1];
    if (u->n == u->cap) {
        size_t cap = u->cap ? u->cap * 2 : 64;
        struct used_ext *v = realloc(u->v, cap * sizeof(*v));
        if (!v)
            return KVP_ERR_NOMEM;
        u->v = v;
        u->cap = cap;
    }
    u->v[u->n++] = (struct used_ext){off, len};
    return KVP_OK;
}

static int used_cmp(const void *a, const void *b)
{
    const struct used_ext *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* A segment's reservations: each one's unused gaps are used extents of the allocator (the used
 * ranges belong to objects, the quarantine or free space, pushed by whoever owns them). */
static int restore_reservations(struct rctx *c, struct kvp_fsm_seg *s, const Kvp__SnapSegment *m)
{
    if (!m->n_reservations)
        return KVP_OK;
    if (m->n_reservations > KVP_FSM_MAX_RESV)
        return KVP_ERR_MALFORMED;
    s->resv = calloc(m->n_reservations, sizeof(*s->resv));
    if (!s->resv)
        return KVP_ERR_NOMEM;
    s->resv_cap = (uint32_t)m->n_reservations;
    for (size_t i = 0; i < m->n_reservations; i++) {
        const Kvp__SnapReservation *r = m->reservations[i];
        if (r->length == 0 || r->length % KVP_FSM_ALIGN || r->offset % KVP_FSM_ALIGN || r->n_used % 2 ||
            r->n_used / 2 > UINT32_MAX || r->offset > s->size || r->length > s->size - r->offset)
            return KVP_ERR_MALFORMED;
        struct kvp_fsm_resv *v = &s->resv[s->n_resv++];
        *v = (struct kvp_fsm_resv){.term = r->term, .offset = r->offset, .len = r->length,
                                   .horizon_ms = r->horizon_wall_ms};
        if (r->n_used) {
            v->used = malloc(r->n_used * sizeof(uint64_t));
            if (!v->used)
                return KVP_ERR_NOMEM;
            memcpy(v->used, r->used, r->n_used * sizeof(uint64_t));
            v->n_used = v->used_cap = (uint32_t)(r->n_used / 2);
        }
        uint64_t pos = v->offset, end = v->offset + v->len;
        for (uint32_t u = 0; u <= v->n_used; u++) {
            uint64_t next = u < v->n_used ? v->used[u].offset : end;
            if (next < pos || next > end)
                return KVP_ERR_MALFORMED; /* unsorted, overlapping or outside */
            if (u < v->n_used && (v->used[u].len == 0 || v->used[u].len > end - next))
                return KVP_ERR_MALFORMED;
            if (next > pos) {
                int rc = used_push(c, s->id, pos, next - pos);
                if (rc)
                    return rc;
                s->used_bytes += next - pos;
            }
            if (u < v->n_used)
                pos = v->used[u].offset + v->used[u].len;
        }
    }
    return KVP_OK;
}

static int restore_segment(struct rctx *c, const Kvp__SnapSegment *m)
{
    fsm_t *t = c->t;
    if (m->id == 0 || m->id > t->n_segs_ids || t->segs[m->id - 1] || !m->name[0] ||
        m->size < KVP_FSM_ALIGN || m->state > KVP__SEGMENT_STATE__SEGMENT_LOST)
        return KVP_ERR_MALFORMED;
    if (m->state != KVP__SEGMENT_STATE__SEGMENT_LOST && kvp_fsm_seg_by_name(t, m->name))
        return KVP_ERR_MALFORMED; /* two live segments with one name */
    struct kvp_fsm_seg *s = calloc(1, sizeof(*s));
    if (!s)
        return KVP_ERR_NOMEM;
    s->id = m->id;
    s->state = (int)m->state;
    s->size = m->size;
    s->owner_pid = m->owner_pid;
    s->name = kvp_fsm_strdup(m->name);
    s->host = kvp_fsm_strdup(m->host);
    s->endpoint = kvp_fsm_strdup(m->endpoint);
    t->segs[m->id - 1] = s; /* owned by t from here on */
    if (!s->name || !s->host || !s->endpoint)
        return KVP_ERR_NOMEM;
    if (s->state == KVP__SEGMENT_STATE__SEGMENT_LOST) {
        kvp_alloc_init_full(&s->alloc, s->size);
        return m->n_quarantine || m->n_reservations ? KVP_ERR_MALFORMED : KVP_OK;
    }
    int rrc = restore_reservations(c, s, m);
    if (rrc)
        return rrc;
    kvp_alloc_init_full(&s->alloc, s->size); /* its free extents come in restore_allocator */
    for (size_t i = 0; i < m->n_quarantine; i++) {
        const Kvp__SnapQuarantine *q = m->quarantine[i];
        if (q->length == 0 || q->length % KVP_FSM_ALIGN)
            return KVP_ERR_MALFORMED;
        int rc = used_push(c, s->id, q->offset, q->length);
        if (rc)
            return rc;
        if ((rc = kvp_fsm_quarantine_push(t, s, q->offset, q->length, q->freed_at_wall_ms)))
            return rc;
    }
    return KVP_OK;
}

static int restore_object(struct rctx *c, const Kvp__SnapObject *m)
{
    fsm_t *t = c->t;
    size_t klen;
    if (!kvp_fsm_key_valid(m->key, &klen) || m->size == 0 || m->n_replicas == 0 ||
        m->n_replicas > KVP_FSM_MAX_REPLICAS || kvp_alloc_round(m->size) == 0 ||
        kvp_fsm_obj_find(t, m->key, klen))
        return KVP_ERR_MALFORMED;
    /* An intent only in a level-6 image (the level is written before the objects), never
     * complete as well. */
    if (m->intent && (m->complete || t->feature_level < KVP_FEATURE_INTENT))
        return KVP_ERR_MALFORMED;
    uint64_t need = kvp_alloc_round(m->size);
    for (size_t i = 0; i < m->n_replicas; i++) {
        const Kvp__SnapReplica *r = m->replicas[i];
        struct kvp_fsm_seg *s = kvp_fsm_seg_get(t, r->segment_id);
        if (!s || s->state == KVP__SEGMENT_STATE__SEGMENT_LOST ||
            r->state > KVP__REPLICA_STATE__REPLICA_COMPLETE)
            return KVP_ERR_MALFORMED;
        for (size_t j = 0; j < i; j++)
            if (m->replicas[j]->segment_id == r->segment_id)
                return KVP_ERR_MALFORMED;
    }
    struct kvp_fsm_obj *o = kvp_fsm_obj_alloc(m->key, klen, (unsigned)m->n_replicas);
    if (!o)
        return KVP_ERR_NOMEM;
    o->size = m->size;
    o->op_id = m->op_id;
    o->term = m->term;
    o->soft_pin = m->soft_pin;
    o->pad[0] = (uint8_t)(m->replica_num <= KVP_FSM_MAX_REPLICAS ? m->replica_num : KVP_FSM_MAX_REPLICAS);
    o->state = m->complete ? KVP_FSM_OBJ_COMPLETE : m->intent ? KVP_FSM_OBJ_INTENT : KVP_FSM_OBJ_PENDING;
    if (m->complete || m->intent)
        o->u.checksum = m->checksum;
    else
        o->u.deadline_ms = m->deadline_wall_ms;
    for (size_t i = 0; i < m->n_replicas; i++) {
        const Kvp__SnapReplica *r = m->replicas[i];
        struct kvp_fsm_seg *s = kvp_fsm_seg_get(t, r->segment_id);
        int rc = used_push(c, s->id, r->offset, need); /* checked in restore_allocator */
        if (rc) {
            free(o); /* the aside state is thrown away on any error */
            return rc;
        }
        s->used_bytes += need;
        s->n_replicas++;
        o->rep[i] = (struct kvp_fsm_replica){
            .segment_id = r->segment_id, .state = r->state, .offset = r->offset};
    }
    int rc = kvp_fsm_obj_insert(t, o);
    if (rc == KVP_OK && o->state == KVP_FSM_OBJ_PENDING && (rc = kvp_fsm_pending_add(t, o)))
        kvp_fsm_obj_unlink(t, o);
    else if (rc == KVP_OK && o->state == KVP_FSM_OBJ_INTENT &&
             (rc = kvp_fsm_intent_add(t, o, m->deadline_wall_ms)))
        kvp_fsm_obj_unlink(t, o);
    if (rc) {
        /* The extents stay reserved in t, which is thrown away on this error. */
        free(o);
        return rc;
    }
    if (o->state == KVP_FSM_OBJ_COMPLETE && o->soft_pin)
        t->pinned_bytes += o->size;
    if (o->state == KVP_FSM_OBJ_COMPLETE)
        kvp_fsm_tenant_count(t, o, +1);
    return KVP_OK;
}

/* A restore in steps (kvp_master_fsm_restore_begin): the new state built aside, the parse
 * cursor, then the allocators one segment at a time, then (after the swap) the old state freed
 * a slice of its table at a time. */
struct kvp_fsm_restore {
    fsm_t t;               /* the new state until the swap, then the old one */
    struct rctx c;
    struct ibuf in;
    bool have_format, seen_seg, seen_obj;
    uint32_t format;
    uint64_t n_hint, cap_hint; /* fields 7 and 8: the object table's size */
    XXH3_state_t *xs;          /* checksum of the bytes parsed so far */
    const uint8_t *hashed;     /* bytes before this are in xs */
    uint64_t sum_want;
    enum { RS_PARSE, RS_ALLOC, RS_READY, RS_FREE_OLD, RS_DONE } phase;
    uint32_t seg_next;     /* RS_ALLOC: next segment index */
    uint64_t slot_next;    /* RS_FREE_OLD: next table slot */
    uint64_t repair_epoch;
};

/* One field of the outer Snapshot message. */
static int restore_field(struct kvp_fsm_restore *r)
{
    struct rctx *c = &r->c;
    fsm_t *t = c->t;
    struct ibuf *in = &r->in;
    uint64_t tag, v;
    if (get_varint(in, &tag))
        return KVP_ERR_MALFORMED;
    unsigned field = (unsigned)(tag >> 3), wt = (unsigned)(tag & 7);
    if (wt == 0) {
        if (get_varint(in, &v))
            return KVP_ERR_MALFORMED;
        if (field == F_FORMAT) {
            if (v != SNAP_FORMAT && v != SNAP_FORMAT_RESV && v != SNAP_FORMAT_L5 && v != SNAP_FORMAT_L6)
                return KVP_ERR_VERSION;
            r->have_format = true;
            r->format = (uint32_t)v;
        } else if (field == F_LAST_SEG) {
            if (r->seen_seg || r->seen_obj || t->segs || v > SNAP_MAX_SEGMENT_IDS)
                return KVP_ERR_MALFORMED;
            if (v) {
                t->segs = calloc(v, sizeof(*t->segs));
                c->used = calloc(v, sizeof(*c->used));
                if (!t->segs || !c->used)
                    return KVP_ERR_NOMEM;
            }
            t->n_segs_ids = t->segs_cap = (uint32_t)v;
        } else if (field == F_N_OBJECTS && v <= SNAP_MAX_OBJECTS_HINT && v <= (uint64_t)(in->end - in->p)) {
            r->n_hint = v; /* bounded by the bytes left: an object takes more than one */
        } else if (field == F_TAB_CAP) {
            r->cap_hint = v;
        } else if (field == F_FEATURE_LEVEL) {
            if (v > UINT32_MAX)
                return KVP_ERR_MALFORMED;
            if (v > KVP_FEATURE_LEVEL) /* a newer cluster: this binary would apply its log its own way */
                return KVP_ERR_VERSION;
            t->feature_level = (uint32_t)v;
        }
        return KVP_OK;
    }
    if (wt == 1 || wt == 5) {
        size_t skip = wt == 1 ? 8 : 4;
        if ((size_t)(in->end - in->p) < skip)
            return KVP_ERR_MALFORMED;
        in->p += skip;
        return KVP_OK;
    }
    if (wt != 2 || get_varint(in, &v) || v > (uint64_t)(in->end - in->p))
        return KVP_ERR_MALFORMED;
    const uint8_t *sub = in->p;
    in->p += v;
    int rc = KVP_OK;
    if (field == F_SEGMENT) {
        if (r->seen_obj)
            return KVP_ERR_MALFORMED;
        r->seen_seg = true;
        Kvp__SnapSegment *m = kvp__snap_segment__unpack(NULL, (size_t)v, sub);
        if (!m)
            return KVP_ERR_MALFORMED;
        rc = restore_segment(c, m);
        kvp__snap_segment__free_unpacked(m, NULL);
    } else if (field == F_OBJECT) {
        if (!r->seen_obj && !t->tab && r->n_hint > 0) {
            /* Size the table once (load at most 3/4, as kvp_fsm_obj_insert keeps it): growing it
             * while objects arrive would be wasted work. */
            uint64_t cap = 1024;
            while (r->n_hint * 4 > cap * 3)
                cap *= 2;
            if (r->cap_hint >= cap && r->cap_hint <= cap * 4 && !(r->cap_hint & (r->cap_hint - 1)))
                cap = r->cap_hint; /* the writer's, when plausible for the count */
            else
                while (r->n_hint * 8 > cap * 5) /* none: below the load where a growth starts */
                    cap *= 2;
            if (!(t->tab = calloc(cap, sizeof(*t->tab))))
                return KVP_ERR_NOMEM;
            t->tab_cap = cap;
        }
        r->seen_obj = true;
        Kvp__SnapObject *m = kvp__snap_object__unpack(NULL, (size_t)v, sub);
        if (!m)
            return KVP_ERR_MALFORMED;
        rc = restore_object(c, m);
        kvp__snap_object__free_unpacked(m, NULL);
    }
    return rc;
}

/* Every live segment's allocator from its used extents: sorted, checked (aligned, inside, no
 * overlap), the gaps made free extents. */
static int restore_allocator(struct rctx *c, uint32_t i)
{
    fsm_t *t = c->t;
    struct kvp_fsm_seg *s = t->segs[i];
    if (!s || s->state == KVP__SEGMENT_STATE__SEGMENT_LOST)
        return KVP_OK;
    struct used_vec *u = &c->used[i];
    if (u->n > 1)
        qsort(u->v, u->n, sizeof(*u->v), used_cmp);
    kvp_alloc_init_full(&s->alloc, s->size);
    uint64_t cap = s->alloc.capacity, pos = 0;
    for (size_t k = 0; k <= u->n; k++) {
        uint64_t off = k < u->n ? u->v[k].off : cap;
        if (k < u->n) {
            uint64_t len = u->v[k].len;
            if (off % KVP_FSM_ALIGN || len == 0 || off > cap || len > cap - off)
                return KVP_ERR_MALFORMED; /* outside the segment */
        }
        if (off < pos)
            return KVP_ERR_MALFORMED; /* overlaps the extent before */
        if (off > pos) {
            int rc = kvp_alloc_free(&s->alloc, pos, off - pos);
            if (rc)
                return rc == KVP_ERR_NOMEM ? rc : KVP_ERR_MALFORMED;
        }
        if (k < u->n)
            pos = off + u->v[k].len;
    }
    free(u->v); /* done with this segment's extents */
    u->v = NULL;
    u->n = u->cap = 0;
    return KVP_OK;
}

static void restore_used_free(struct kvp_fsm_restore *r)
{
    if (r->c.used)
        for (uint32_t i = 0; i < r->t.n_segs_ids; i++)
            free(r->c.used[i].v);
    free(r->c.used);
    r->c.used = NULL;
}

int kvp_master_fsm_restore_begin(fsm_t *f, const uint8_t *buf, size_t len, struct kvp_fsm_restore **out)
{
    if (!f || (!buf && len) || !out)
        return KVP_ERR_INVALID;
    /* The checksum field (tag + fixed64) ends the buffer. It is checked as the parse goes,
     * over the bytes each step consumed (one pass over 450 MB at 10M objects would hold the
     * caller's thread ~100 ms), and must match before the new state can be swapped in; a damaged
     * stream fails the parse or the checksum and the state is never touched. */
    const size_t trailer = 9;
    if (len < trailer || buf[len - trailer] != (F_CHECKSUM << 3 | 1u))
        return KVP_ERR_MALFORMED;
    struct kvp_fsm_restore *r = calloc(1, sizeof(*r));
    if (!r)
        return KVP_ERR_NOMEM;
    for (int i = 0; i < 8; i++)
        r->sum_want |= (uint64_t)buf[len - 8 + i] << (8 * i);
    if (!(r->xs = XXH3_createState()) || XXH3_64bits_reset(r->xs) != XXH_OK) {
        XXH3_freeState(r->xs);
        free(r);
        return KVP_ERR_NOMEM;
    }
    r->hashed = buf;
    r->t.params = f->params;
    r->c.t = &r->t;
    r->in = (struct ibuf){buf, buf + len - trailer};
    r->phase = RS_PARSE;
    *out = r;
    return KVP_OK;
}

int kvp_master_fsm_restore_step(struct kvp_fsm_restore *r, size_t max_bytes, bool *done)
{
    if (!r || !done)
        return KVP_ERR_INVALID;
    *done = false;
    if (r->phase == RS_PARSE) {
        const uint8_t *stop = (size_t)(r->in.end - r->in.p) > max_bytes ? r->in.p + max_bytes : r->in.end;
        while (r->in.p < stop) {
            int rc = restore_field(r);
            if (rc)
                return rc;
        }
        XXH3_64bits_update(r->xs, r->hashed, (size_t)(r->in.p - r->hashed));
        r->hashed = r->in.p;
        if (r->in.p < r->in.end)
            return KVP_OK;
        if (XXH3_64bits_digest(r->xs) != r->sum_want || !r->have_format)
            return KVP_ERR_MALFORMED;
        /* format 3 is written exactly when level 5 is committed, 4 exactly when level 6 is
         * (put_prefix) */
        if ((r->format == SNAP_FORMAT_L5) != (r->t.feature_level == KVP_FEATURE_QUARANTINE_OWN_TIME) ||
            (r->format == SNAP_FORMAT_L6) != (r->t.feature_level >= KVP_FEATURE_INTENT))
            return KVP_ERR_MALFORMED;
        r->phase = RS_ALLOC;
        return KVP_OK;
    }
    if (r->phase == RS_ALLOC) {
        /* Segments until about max_bytes / 16 extents were sorted (one at least). */
        size_t work = 0;
        while (r->seg_next < r->t.n_segs_ids && work <= max_bytes / 16) {
            work += r->c.used ? r->c.used[r->seg_next].n + 1 : 1;
            int rc = restore_allocator(&r->c, r->seg_next);
            if (rc)
                return rc;
            r->seg_next++;
        }
        if (r->seg_next < r->t.n_segs_ids)
            return KVP_OK;
        restore_used_free(r);
        r->phase = RS_READY;
    }
    if (r->phase == RS_FREE_OLD) {
        /* The old state's objects, about max_bytes / 64 table slots at a time. */
        uint64_t end = r->slot_next + (max_bytes / 64 > 0 ? max_bytes / 64 : 1);
        if (end > r->t.tab_cap)
            end = r->t.tab_cap;
        for (; r->slot_next < end; r->slot_next++) {
            free(r->t.tab[r->slot_next]);
            r->t.tab[r->slot_next] = NULL;
        }
        if (r->slot_next < r->t.tab_cap)
            return KVP_OK;
        free(r->t.tab); /* every slot is empty now */
        r->t.tab = NULL;
        r->t.tab_cap = 0;
        kvp_fsm_state_clear(&r->t); /* segments, pending */
        r->phase = RS_DONE;
    }
    *done = r->phase == RS_READY || r->phase == RS_DONE;
    return KVP_OK;
}

int kvp_master_fsm_restore_end(fsm_t *f, struct kvp_fsm_restore *r)
{
    if (!f || !r || r->phase != RS_READY)
        return KVP_ERR_INVALID; /* also: the checksum has not been checked yet */
    uint64_t epoch = f->repair_epoch, moves = f->tab_moves;
    fsm_t old = *f;
    kvp_fsm_snap_free(&old); /* a running incremental snapshot of the old state is dropped */
    *f = r->t;
    f->repair_epoch = epoch + 1;
    f->tab_moves = moves + 1; /* every object is in another slot: a repair pass's slices too */
    r->t = old;
    r->c.t = &r->t;
    r->phase = RS_FREE_OLD;
    r->slot_next = 0;
    kvp_log_info(KVP_FSM_ACTOR, "restored: %u segment ids, %llu objects (%llu pending)",
                 f->n_segs_ids, (unsigned long long)f->n_objects,
                 (unsigned long long)f->n_pending);
    return KVP_OK;
}

void kvp_master_fsm_restore_drop(struct kvp_fsm_restore *r)
{
    if (!r)
        return;
    restore_used_free(r);
    kvp_fsm_state_clear(&r->t); /* the unfinished new state, or what is left of the old one */
    XXH3_freeState(r->xs);
    free(r);
}

int kvp_master_fsm_restore(fsm_t *f, const uint8_t *buf, size_t len)
{
    struct kvp_fsm_restore *r = NULL;
    int rc = kvp_master_fsm_restore_begin(f, buf, len, &r);
    bool done = false;
    while (rc == KVP_OK && !done)
        rc = kvp_master_fsm_restore_step(r, SIZE_MAX, &done);
    if (rc == KVP_OK)
        rc = kvp_master_fsm_restore_end(f, r);
    if (rc != KVP_OK)
        kvp_log_warn(KVP_FSM_ACTOR, "restore: snapshot of %zu bytes rejected (%d): state unchanged", len, rc);
    kvp_master_fsm_restore_drop(r);
    return rc;
}

/* ------------------------------------------------------------------ byte adapters */

static int pack_response(Kvp__Response *r, uint8_t **res, size_t *res_len)
{
    size_t n = kvp__response__get_packed_size(r);
    uint8_t *p = malloc(n ? n : 1);
    if (!p)
        return KVP_ERR_NOMEM;
    kvp__response__pack(r, p);
    *res = p;
    *res_len = n;
    return KVP_OK;
}

int kvp_master_fsm_apply_bytes(void *fsm, const uint8_t *cmd, size_t len, uint8_t **res,
                               size_t *res_len)
{
    if (!fsm || (!cmd && len) || !res || !res_len)
        return KVP_ERR_INVALID;
    *res = NULL;
    *res_len = 0;
    Kvp__Command *c = kvp__command__unpack(NULL, len, cmd);
    if (!c) {
        kvp_log_warn(KVP_FSM_ACTOR, "apply: command of %zu bytes does not decode: ignored", len);
        return KVP_ERR_MALFORMED;
    }
    Kvp__Response *r = NULL;
    int rc = kvp_master_fsm_apply(fsm, c, &r);
    kvp__command__free_unpacked(c, NULL);
    if (rc == KVP_OK) {
        rc = pack_response(r, res, res_len);
        kvp_master_fsm_response_free(r);
    }
    return rc;
}

int kvp_master_fsm_query_bytes(void *fsm, const uint8_t *q, size_t len, uint8_t **res,
                               size_t *res_len)
{
    if (!fsm || (!q && len) || !res || !res_len)
        return KVP_ERR_INVALID;
    *res = NULL;
    *res_len = 0;
    Kvp__Request *req = kvp__request__unpack(NULL, len, q);
    if (!req) {
        kvp_log_warn(KVP_FSM_ACTOR, "query: request of %zu bytes does not decode: ignored", len);
        return KVP_ERR_MALFORMED;
    }
    Kvp__Response *r = NULL;
    int rc = kvp_master_fsm_query(fsm, req, &r);
    kvp__request__free_unpacked(req, NULL);
    if (rc == KVP_OK) {
        rc = pack_response(r, res, res_len);
        kvp_master_fsm_response_free(r);
    }
    return rc;
}

int kvp_master_fsm_snapshot_bytes(void *fsm, uint8_t **buf, size_t *len)
{
    return kvp_master_fsm_snapshot(fsm, buf, len);
}

int kvp_master_fsm_restore_bytes(void *fsm, const uint8_t *buf, size_t len)
{
    return kvp_master_fsm_restore(fsm, buf, len);
}

int kvp_master_fsm_restore_begin_bytes(void *fsm, const uint8_t *buf, size_t len, void **h)
{
    struct kvp_fsm_restore *r = NULL;
    int rc = kvp_master_fsm_restore_begin(fsm, buf, len, &r);
    *h = r;
    return rc;
}

int kvp_master_fsm_restore_step_bytes(void *fsm, void *h, size_t max_bytes, bool *done)
{
    (void)fsm;
    return kvp_master_fsm_restore_step(h, max_bytes, done);
}

int kvp_master_fsm_restore_end_bytes(void *fsm, void *h)
{
    return kvp_master_fsm_restore_end(fsm, h);
}

void kvp_master_fsm_restore_drop_bytes(void *fsm, void *h)
{
    (void)fsm;
    kvp_master_fsm_restore_drop(h);
}
