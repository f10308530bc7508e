/*
 * fsm_snap_inc.c — the incremental snapshot: a point-in-time image of the state written in
 * chunks between applies, so no single call holds the caller (the raft thread) for long, and
 * the FSM digest.
 *
 * Method (docs/raftlog.md "Snapshots"): kvp_master_fsm_snap_begin freezes the state at the
 * current command. The small tables (segments with their quarantine; any table of the FSM that
 * is O(segments) rather than O(objects)) are written out at once. The object table is owed:
 * begin steps the FSM's snapshot generation, so every object's generation (KVP_FSM_OBJ_GEN)
 * differs from it. Each kvp_master_fsm_snap_next call walks the table from a cursor and writes
 * owed objects until its chunk holds max_bytes or it has visited max_bytes / 4 slots, marking
 * each written one (a chunk may so be short, or empty). An apply that is about
 * to change or remove an owed object first writes it (kvp_fsm_snap_touch: copy-before-write at
 * object granularity), so the object goes out as it was at begin. Objects inserted after begin
 * carry the new generation and are not written. Slot moves are covered too: backward-shift
 * deletion touches every object it moves (one could move from ahead of the cursor to behind
 * it), and a table growth rewinds the cursor (written objects are skipped by generation).
 * The last chunk ends with the XXH3-64 checksum field of the whole stream.
 *
 * The bytes are the format kvp_master_fsm_restore reads (wire/snapshot.proto, format 1, or 2
 * while a reservation exists; the prefix is kvp_fsm_snap_prefix_encode, as the whole snapshot's):
 * format, last segment id, segments, objects, checksum. Objects come in table and touch order,
 * not sorted, so two members with equal state may write different bytes; the digest below is
 * order-free for comparing them.
 *
 * Memory: the writer holds the prefix (segments), the objects written early by touches (one
 * encoded copy of each object changed during the snapshot, at most the objects changed) and one
 * chunk at a time. Nothing is copied per object up front.
 */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "actors/master/fsm/fsm_internal.h"
#include "kvpool.h"
#include "runtime/log.h"

struct kvp_fsm_snap {
    uint8_t *prefix;            /* segments; emitted first */
    size_t prefix_len;
    bool prefix_sent;
    uint8_t *early;             /* objects written by touches; [early_off, early_len) not emitted */
    size_t early_off, early_len, early_cap;
    bool err;                   /* out of memory while touching: the snapshot fails */
    uint64_t cursor;            /* next table slot to visit */
    uint64_t objects_written;
    uint64_t objects_at_begin;
    XXH3_state_t *xs;           /* checksum of every byte emitted */
};

#define F_OBJECT_TAG 0x22u      /* field 4, length-delimited */
#define F_CHECKSUM_TAG 0x79u    /* field 15, fixed64 */

static size_t varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* One object as the field the stream holds: tag, length, SnapObject bytes. */
static size_t object_field(const struct kvp_master_fsm *f, const struct kvp_fsm_obj *o, uint8_t *b)
{
    uint8_t tmp[KVP_FSM_SNAP_OBJECT_MAX];
    size_t len = kvp_fsm_snap_object_encode(f, o, tmp);
    size_t h = 0;
    b[h++] = F_OBJECT_TAG;
    h += varint(b + h, len);
    memcpy(b + h, tmp, len);
    return h + len;
}

#define FIELD_MAX (KVP_FSM_SNAP_OBJECT_MAX + 12)

void kvp_fsm_snap_touch_slow(struct kvp_master_fsm *f, struct kvp_fsm_obj *o)
{
    struct kvp_fsm_snap *s = f->snap;
    KVP_FSM_OBJ_GEN(o) = f->snap_gen;
    if (s->err)
        return;
    if (s->early_len + FIELD_MAX > s->early_cap) {
        size_t cap = s->early_cap ? s->early_cap * 2 : 64 * 1024;
        uint8_t *p = realloc(s->early, cap);
        if (!p) {
            s->err = true; /* the snapshot is refused at its next chunk; the apply goes on */
            return;
        }
        s->early = p;
        s->early_cap = cap;
    }
    s->early_len += object_field(f, o, s->early + s->early_len);
    s->objects_written++;
}

void kvp_fsm_snap_rewind(struct kvp_master_fsm *f)
{
    if (f->snap)
        f->snap->cursor = 0;
}

uint64_t kvp_fsm_snap_cursor(const struct kvp_master_fsm *f)
{
    return f->snap ? f->snap->cursor : UINT64_MAX;
}

void kvp_fsm_snap_free(struct kvp_master_fsm *f)
{
    struct kvp_fsm_snap *s = f->snap;
    if (!s)
        return;
    free(s->prefix);
    free(s->early);
    XXH3_freeState(s->xs);
    free(s);
    f->snap = NULL;
}

/* Generations are 8 bits and begin steps them by one, so an object left owed by an abandoned
 * snapshot keeps an older generation, which differs from every later one until the counter
 * wraps. A finished snapshot leaves every object at the current generation; after 128 abandoned
 * ones in a row the table is walked once to bring them all to it. */
static void snap_abandon(struct kvp_master_fsm *f)
{
    kvp_fsm_snap_free(f);
    if (++f->snap_abandoned < 128)
        return;
    for (uint64_t i = 0; i < f->tab_cap; i++)
        if (f->tab[i])
            KVP_FSM_OBJ_GEN(f->tab[i]) = f->snap_gen;
    f->snap_abandoned = 0;
}

int kvp_master_fsm_snap_begin(struct kvp_master_fsm *f)
{
    if (!f)
        return KVP_ERR_INVALID;
    if (f->snap)
        return KVP_ERR_BUSY;
    struct kvp_fsm_snap *s = calloc(1, sizeof(*s));
    if (!s)
        return KVP_ERR_NOMEM;
    s->xs = XXH3_createState();
    if (!s->xs || kvp_fsm_snap_prefix_encode(f, &s->prefix, &s->prefix_len) != KVP_OK) {
        XXH3_freeState(s->xs);
        free(s);
        return KVP_ERR_NOMEM;
    }
    XXH3_64bits_reset(s->xs);
    s->objects_at_begin = f->n_objects;
    f->work.snap_begun++;
    f->snap = s;
    f->snap_gen++; /* every object in the table is now owed (its generation is older) */
    return KVP_OK;
}

void kvp_master_fsm_snap_abort(struct kvp_master_fsm *f)
{
    if (f && f->snap)
        snap_abandon(f);
}

struct chunk {
    uint8_t *p;
    size_t len, cap;
};

static int chunk_put(struct chunk *c, const uint8_t *d, size_t n)
{
    if (c->len + n > c->cap) {
        size_t cap = c->cap ? c->cap : 64 * 1024;
        while (cap < c->len + n)
            cap *= 2;
        uint8_t *p = realloc(c->p, cap);
        if (!p)
            return KVP_ERR_NOMEM;
        c->p = p;
        c->cap = cap;
    }
    memcpy(c->p + c->len, d, n);
    c->len += n;
    return KVP_OK;
}

int kvp_master_fsm_snap_next(struct kvp_master_fsm *f, size_t max_bytes, uint8_t **out, size_t *out_len,
                             bool *last)
{
    if (!f || !out || !out_len || !last)
        return KVP_ERR_INVALID;
    struct kvp_fsm_snap *s = f->snap;
    if (!s)
        return KVP_ERR_INVALID;
    *out = NULL;
    *out_len = 0;
    *last = false;
    if (s->err) {
        kvp_log_error(KVP_FSM_ACTOR, "snapshot: out of memory while writing changed objects early: "
                      "snapshot dropped");
        snap_abandon(f);
        return KVP_ERR_NOMEM;
    }
    if (max_bytes < FIELD_MAX)
        max_bytes = FIELD_MAX;
    struct chunk c = {.cap = max_bytes + FIELD_MAX + 16};
    c.p = malloc(c.cap);
    int rc = c.p ? KVP_OK : KVP_ERR_NOMEM;
    if (rc == KVP_OK && !s->prefix_sent) {
        rc = chunk_put(&c, s->prefix, s->prefix_len);
        s->prefix_sent = true;
        free(s->prefix);
        s->prefix = NULL;
    }
    if (rc == KVP_OK && s->early_off < s->early_len) {
        /* At most a chunk of it: one apply (a segment lost, a removal of many keys) can touch
         * many objects. The stream's bytes, not whole fields, are what chunks split. */
        size_t n = s->early_len - s->early_off, room = max_bytes > c.len ? max_bytes - c.len : 0;
        if (n > room)
            n = room;
        rc = chunk_put(&c, s->early + s->early_off, n);
        s->early_off += n;
        f->work.snap_early_bytes += n;
        if (s->early_off == s->early_len) {
            s->early_off = s->early_len = 0;
            if (s->early_cap > (1u << 20)) { /* a burst of touches: give the buffer back */
                free(s->early);
                s->early = NULL;
                s->early_cap = 0;
            }
        }
    }
    /* Slots visited per call are bounded too: after a table growth the walk starts over and
     * skips every object already written (it writes nothing for them), which at 3M objects
     * made one call walk 1.7M slots (23-44 ms of CPU, docs/bench.md "Session 30"). */
    uint64_t slots = max_bytes / 4 > KVP_FSM_SNAP_STEP_MIN_SLOTS ? max_bytes / 4 : KVP_FSM_SNAP_STEP_MIN_SLOTS;
    while (rc == KVP_OK && c.len < max_bytes && s->cursor < f->tab_cap && slots-- > 0) {
        f->work.snap_slots++;
        struct kvp_fsm_obj *o = f->tab[s->cursor++];
        if (!o || KVP_FSM_OBJ_GEN(o) == f->snap_gen)
            continue;
        if (s->cursor + 8 < f->tab_cap && f->tab[s->cursor + 8]) /* random heap addresses */
            __builtin_prefetch(f->tab[s->cursor + 8]);
        KVP_FSM_OBJ_GEN(o) = f->snap_gen;
        uint8_t b[FIELD_MAX];
        rc = chunk_put(&c, b, object_field(f, o, b));
        s->objects_written++;
        f->work.snap_objects++;
    }
    if (rc != KVP_OK) {
        free(c.p);
        kvp_log_error(KVP_FSM_ACTOR, "snapshot: no memory for a chunk: snapshot dropped");
        snap_abandon(f);
        return rc;
    }
    XXH3_64bits_update(s->xs, c.p, c.len);
    if (s->cursor >= f->tab_cap && s->early_off == s->early_len) {
        /* Everything owed is written (touches after this point see f->snap == NULL). */
        uint64_t sum = XXH3_64bits_digest(s->xs);
        uint8_t t[9];
        t[0] = F_CHECKSUM_TAG;
        for (int i = 0; i < 8; i++)
            t[1 + i] = (uint8_t)(sum >> (8 * i));
        if (chunk_put(&c, t, sizeof(t)) != KVP_OK) {
            free(c.p);
            snap_abandon(f);
            return KVP_ERR_NOMEM;
        }
        kvp_log_debug(KVP_FSM_ACTOR, "snapshot: %llu objects written (%llu at begin)",
                      (unsigned long long)s->objects_written, (unsigned long long)s->objects_at_begin);
        *last = true;
        kvp_fsm_snap_free(f);
        f->snap_abandoned = 0;
    }
    *out = c.p;
    *out_len = c.len;
    return KVP_OK;
}

bool kvp_master_fsm_snap_running(const struct kvp_master_fsm *f)
{
    return f && f->snap;
}

/* ------------------------------------------------------------------ digest */

uint64_t kvp_master_fsm_digest(const struct kvp_master_fsm *f)
{
    if (!f)
        return 0;
    uint8_t *prefix = NULL;
    size_t plen = 0;
    uint64_t seg_hash = 0;
    if (kvp_fsm_snap_prefix_encode(f, &prefix, &plen) == KVP_OK) {
        seg_hash = XXH3_64bits(prefix, plen);
        free(prefix);
    }
    /* Objects: a sum of per-object hashes, so table order does not matter. */
    uint64_t sum = 0, n = 0;
    uint8_t b[KVP_FSM_SNAP_OBJECT_MAX];
    for (uint64_t i = 0; i < f->tab_cap; i++) {
        const struct kvp_fsm_obj *o = f->tab[i];
        if (!o)
            continue;
        size_t len = kvp_fsm_snap_object_encode(f, o, b);
        sum += XXH3_64bits(b, len);
        n++;
    }
    uint64_t parts[3] = {seg_hash, sum, n};
    return XXH3_64bits(parts, sizeof(parts));
}

/* ------------------------------------------------------------------ raftlog adapters */

int kvp_master_fsm_snap_begin_bytes(void *fsm)
{
    return kvp_master_fsm_snap_begin(fsm);
}

int kvp_master_fsm_snap_next_bytes(void *fsm, size_t max_bytes, uint8_t **chunk, size_t *len, bool *last)
{
    return kvp_master_fsm_snap_next(fsm, max_bytes, chunk, len, last);
}

void kvp_master_fsm_snap_abort_bytes(void *fsm)
{
    kvp_master_fsm_snap_abort(fsm);
}
