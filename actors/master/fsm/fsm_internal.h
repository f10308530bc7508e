/*
 * fsm_internal.h — the master FSM's state, shared by fsm*.c. Nothing here is public.
 *
 * Memory layout of an object (the big table: target < 200 bytes/object at 1e6 objects):
 *   one malloc per object = struct kvp_fsm_obj header (48 bytes) + n_replicas * 16 bytes +
 *   key bytes + NUL; plus one 8-byte slot pointer in the open-addressing table (load <= 0.75).
 * Replica count never grows after PutStart (only shrinks when a segment is lost), so the
 * replica array is exactly sized.
 */
#ifndef KVP_MASTER_FSM_INTERNAL_H
#define KVP_MASTER_FSM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "actors/master/fsm/alloc.h"
#include "actors/master/fsm/fsm.h"

#define KVP_FSM_ACTOR "master-fsm"
#define KVP_FSM_KEY_MAX 512u
#define KVP_FSM_MAX_REPLICAS 16u

/* INTENT (feature level 6): a put's intent committed while its bytes move (PutCommitItem.intent);
 * hidden from every read like PENDING, but out of RevokeExpired's reach: only a PutSealCmd (or
 * PutEnd) with its op_id and checksum completes it, only a PutRevoke with its op_id drops it.
 * u.checksum holds its checksum; its deadline is in f->intents[pending_idx]. */
enum { KVP_FSM_OBJ_PENDING = 0, KVP_FSM_OBJ_COMPLETE = 1, KVP_FSM_OBJ_INTENT = 2 };

struct kvp_fsm_replica {
    uint32_t segment_id;
    uint32_t state; /* KVP__REPLICA_STATE__REPLICA_* */
    uint64_t offset;
};

struct kvp_fsm_obj {
    uint64_t size;    /* bytes as requested (allocation is rounded to KVP_FSM_ALIGN) */
    uint64_t op_id;   /* client-chosen id of the put that created it */
    uint64_t term;    /* Raft term of the PutStart command */
    union {
        uint64_t checksum;    /* COMPLETE, INTENT: XXH3-64 given by PutEnd / the intent */
        uint64_t deadline_ms; /* PENDING: wall-clock deadline (ms since epoch) */
    } u;
    uint32_t hash;        /* low bits of XXH3-64(key): table probe and fast compare */
    uint32_t pending_idx; /* PENDING: index in fsm->pending; INTENT: in fsm->intents */
    uint16_t key_len;
    uint8_t state; /* KVP_FSM_OBJ_* */
    uint8_t soft_pin;
    uint8_t n_replicas;
    uint8_t pad[3];
    struct kvp_fsm_replica rep[]; /* n_replicas, then the key bytes + NUL */
};

static inline char *kvp_fsm_obj_key(const struct kvp_fsm_obj *o)
{
    return (char *)(o->rep + o->n_replicas);
}

/* A quarantined extent: freed at freed_at_ms, reusable once freed_at_ms + fence_grace_ms <= now.
 * run: a running byte count along the segment's array, run(next) = run(this) + len (mod 2^64),
 * so the bytes of entries [i, tail] are run(tail) + len(tail) - run(i): the late figure without
 * visiting the late entries. Derived (not in snapshots). */
struct kvp_fsm_quar {
    uint64_t offset, len, freed_at_ms, run;
};

/* A byte range [offset, offset + len) of a segment. */
struct kvp_fsm_range {
    uint64_t offset, len;
};

/* One reservation (fsm_reserve.c, docs/master.md "One-commit put"): [offset, offset + len) set
 * aside for the leader of `term` until horizon_ms. used[] (sorted by offset, disjoint) holds the
 * ranges PutCommit made into objects; at the retire the rest is quarantined as freed at
 * horizon_ms. Its unused bytes count in the segment's used_bytes. */
/* Most live reservations one segment keeps (terms not yet retired, plus refills): a bound on
 * what a buggy or hostile leader can pin, far above what one leader needs (one or two). */
#define KVP_FSM_MAX_RESV 64u

struct kvp_fsm_intent_ent {
    struct kvp_fsm_obj *o; /* state KVP_FSM_OBJ_INTENT, o->pending_idx = this entry's index */
    uint64_t deadline_ms;  /* the put's write deadline (wall clock) */
};

struct kvp_fsm_resv {
    uint64_t term, offset, len, horizon_ms;
    struct kvp_fsm_range *used;
    uint32_t n_used, used_cap;
};

struct kvp_fsm_seg {
    uint32_t id;
    int state; /* KVP__SEGMENT_STATE__SEGMENT_* */
    char *name, *host, *endpoint;
    uint64_t size, owner_pid;
    uint64_t used_bytes;  /* rounded bytes of replicas (pending and complete) */
    uint64_t n_replicas;  /* replicas stored on it */
    struct kvp_alloc alloc;
    /* Quarantine: q[q_head..q_len), times non-decreasing, so QuarantineRelease frees a prefix
     * (from the head) and the late part is a suffix (kvp_master_fsm_quarantine_late walks it
     * from the tail). How an entry keeps that order depends on the committed feature level
     * (kvp_fsm_quarantine_push): below 5 it takes at least the time of the tail (the FIFO's
     * clamp); from 5 it keeps its own time and is inserted after every entry of a time <= its
     * own. q[0..q_head) and q[q_len..q_cap) are free slots. */
    struct kvp_fsm_quar *q;
    uint64_t q_head, q_len, q_cap;
    uint64_t quarantined_bytes;
    struct kvp_fsm_resv *resv; /* reservations, in the order they were made */
    uint32_t n_resv, resv_cap;
};

/* Counts of the work done on the raft thread (kvp_master_fsm_hold_note). */
struct kvp_fsm_work {
    uint64_t cmds, put_start_items, put_end_items, other_cmds;
    int last_other; /* body case of the last other command */
    uint64_t grow_begun, grow_slots, grow_swaps, grow_whole, tab_bytes_freed, tab_bytes_alloc;
    uint64_t snap_slots, snap_objects, snap_early_bytes, snap_begun;
};

struct kvp_master_fsm {
    struct kvp_master_fsm_params params;
    /* Segments by id: segs[id - 1]; NULL once forgotten (unmount). Ids are never reused. */
    struct kvp_fsm_seg **segs;
    uint32_t n_segs_ids; /* ids handed out so far (next id = n_segs_ids + 1) */
    uint32_t segs_cap;
    /* Objects: open addressing, linear probing, backward-shift deletion. */
    struct kvp_fsm_obj **tab;
    uint64_t tab_cap; /* power of two */
    /* The table's successor while it is built in steps (fsm.c, kvp_fsm_obj_insert), or NULL:
     * ncap slots, tab[0, ncursor) copied; grow_gen marks the objects in it. */
    struct kvp_fsm_obj **ntab;
    uint64_t ncap, ncursor;
    uint8_t grow_gen;
    /* Objects moved between slots of the live table (backward shifts; a restore counts one),
     * for the repair scan's slices (RepairScanResp.table_moves). Derived, not in snapshots. */
    uint64_t tab_moves;
    uint64_t n_objects; /* complete + pending */
    /* Pending puts (unordered; obj->pending_idx is the index). */
    struct kvp_fsm_obj **pending;
    uint64_t n_pending, pending_cap;
    /* Pending intents (feature level 6; unordered; obj->pending_idx is the index) with their
     * write deadlines: an INTENT object's union holds its checksum. */
    struct kvp_fsm_intent_ent *intents;
    uint64_t n_intents, intents_cap;
    uint64_t pinned_bytes; /* sizes of complete soft-pinned objects */
    /* The cluster's committed feature level (RaiseLevelCmd, fsm_reserve.c): the highest level
     * ever committed, never lowered; 0 = none committed. In snapshots (field 5). */
    uint32_t feature_level;
    /* Bumped by every applied command that can create repair work (kvp_master_fsm_repair_epoch);
     * not part of the state proper: not in snapshots, bumped by restore. */
    uint64_t repair_epoch;
    /* Incremental snapshot in progress (fsm_snap_inc.c), or NULL. Objects whose snapshot
     * generation (KVP_FSM_OBJ_GEN) differs from snap_gen are still owed to it in their state as
     * of kvp_master_fsm_snap_begin: kvp_fsm_snap_touch writes such an object out before anything
     * changes it. With no snapshot running every object's generation equals snap_gen. */
    struct kvp_fsm_snap *snap;
    uint8_t snap_gen;
    uint8_t snap_abandoned; /* snapshots abandoned since the last finished one */
    /* Complete objects' bytes and count per tenant, kept on apply (fsm_tenant.c); derived, not
     * in snapshots. tenant_idx: open addressing over tenants[] positions + 1. */
    struct kvp_fsm_tenant *tenants;
    uint32_t n_tenants, tenants_cap;
    uint32_t *tenant_idx;
    uint32_t tenant_idx_cap;
    bool tenants_lost; /* a count was dropped for want of memory */
    /* What the raft thread's holds did, counted as it happens (kvp_master_fsm_hold_note): the
     * log line of a slow apply or snapshot step says which work it was. Derived, not in
     * snapshots, never read by apply. work_mark: the counts at the hold's begin. */
    struct kvp_fsm_work work, work_mark;
};

/* fsm_tenant.c: o (COMPLETE) joins (sign +1) or leaves (-1) its tenant's counts. */
void kvp_fsm_tenant_count(struct kvp_master_fsm *f, const struct kvp_fsm_obj *o, int sign);
void kvp_fsm_tenants_clear(struct kvp_master_fsm *f);
/* 0 when a recount of the table equals the kept counts, -14 otherwise (kvp_master_fsm_check). */
int kvp_fsm_tenants_check(const struct kvp_master_fsm *f);

/* Snapshot generation of an object (fsm_snap_inc.c): kept in pad[1]. */
#define KVP_FSM_OBJ_GEN(o) ((o)->pad[1])
/* In the growing table iff equal to the FSM's grow_gen (fsm.c): kept in pad[2]. */
#define KVP_FSM_OBJ_MOVED(o) ((o)->pad[2])
/* Tables from this size grow in steps, this many slots copied per insert (fsm.c). */
#define KVP_FSM_GROW_STEP_MIN_CAP 65536u
#define KVP_FSM_GROW_STEP_SLOTS 64u
/* A snapshot step (kvp_master_fsm_snap_next) visits at most max_bytes / 4 table slots, and at
 * least this many (fsm_snap_inc.c). */
#define KVP_FSM_SNAP_STEP_MIN_SLOTS 1024u

/* fsm_snap_inc.c: write o into the running snapshot if it is still owed to it. Every change to
 * an object of the table (fields, replicas, unlink, move between slots) calls this first. */
void kvp_fsm_snap_touch_slow(struct kvp_master_fsm *f, struct kvp_fsm_obj *o);
static inline void kvp_fsm_snap_touch(struct kvp_master_fsm *f, struct kvp_fsm_obj *o)
{
    if (f->snap && KVP_FSM_OBJ_GEN(o) != f->snap_gen)
        kvp_fsm_snap_touch_slow(f, o);
}
/* The table was rebuilt (grown): the snapshot's walk starts again from slot 0 (objects already
 * written are skipped by their generation). */
void kvp_fsm_snap_rewind(struct kvp_master_fsm *f);
/* The running snapshot's next table slot to visit (UINT64_MAX with none running). Tests. */
uint64_t kvp_fsm_snap_cursor(const struct kvp_master_fsm *f);
void kvp_fsm_snap_free(struct kvp_master_fsm *f);
/* Bytes of the snapshot stream before the objects: format, last segment id, every segment with
 * its quarantine (fsm_snap.c). *buf malloc'd. */
int kvp_fsm_snap_prefix_encode(const struct kvp_master_fsm *f, uint8_t **buf, size_t *len);

/* fsm.c: tables and helpers */
uint32_t kvp_fsm_hash(const char *key, size_t len);

/* Bytes of one SnapObject (wire/snapshot.proto) as protobuf-c would pack it, written to p
 * (at least KVP_FSM_SNAP_OBJECT_MAX bytes); returns the length. fsm_snap.c. */
#define KVP_FSM_SNAP_OBJECT_MAX (KVP_FSM_KEY_MAX + 16 + 10 * 11 + KVP_FSM_MAX_REPLICAS * 30)
size_t kvp_fsm_snap_object_encode(const struct kvp_master_fsm *f, const struct kvp_fsm_obj *ob, uint8_t *p);
bool kvp_fsm_key_valid(const char *key, size_t *len);
struct kvp_fsm_obj *kvp_fsm_obj_find(const struct kvp_master_fsm *f, const char *key, size_t len);
/* kvp_fsm_obj_find for a command that may change the object: the object is handed to a running
 * snapshot first (kvp_fsm_snap_touch). Every apply path uses this one. */
struct kvp_fsm_obj *kvp_fsm_obj_find_mut(struct kvp_master_fsm *f, const char *key, size_t len);
int kvp_fsm_obj_insert(struct kvp_master_fsm *f, struct kvp_fsm_obj *o);
void kvp_fsm_obj_unlink(struct kvp_master_fsm *f, struct kvp_fsm_obj *o);
struct kvp_fsm_obj *kvp_fsm_obj_alloc(const char *key, size_t key_len, unsigned n_replicas);
int kvp_fsm_pending_add(struct kvp_master_fsm *f, struct kvp_fsm_obj *o);
void kvp_fsm_pending_del(struct kvp_master_fsm *f, struct kvp_fsm_obj *o);
/* The intent list (fsm.c): add (KVP_ERR_NOMEM, nothing changed) / drop o, an INTENT object. */
int kvp_fsm_intent_add(struct kvp_master_fsm *f, struct kvp_fsm_obj *o, uint64_t deadline_ms);
void kvp_fsm_intent_del(struct kvp_master_fsm *f, struct kvp_fsm_obj *o);
/* o's deadline: PENDING from its union, INTENT from the intent list; 0 for COMPLETE. */
uint64_t kvp_fsm_obj_deadline(const struct kvp_master_fsm *f, const struct kvp_fsm_obj *o);
/* PutSealCmd's and PutEnd's rule for an INTENT object o (fsm_reserve.c): complete it when op_id
 * and checksum are its own (KVP_OK), else KVP_ERR_EXISTS with nothing changed. */
int kvp_fsm_intent_seal(struct kvp_master_fsm *f, struct kvp_fsm_obj *o, uint64_t op_id, uint64_t checksum);
struct kvp_fsm_seg *kvp_fsm_seg_get(const struct kvp_master_fsm *f, uint32_t id);
struct kvp_fsm_seg *kvp_fsm_seg_by_name(const struct kvp_master_fsm *f, const char *name);
void kvp_fsm_seg_free(struct kvp_fsm_seg *s);
/* Quarantine [off, off + len) of s (a segment of f) as freed at now_ms: reusable at now_ms +
 * fence_grace_ms, by the rule of f's committed feature level. Below
 * KVP_FEATURE_QUARANTINE_OWN_TIME (version.h) the entry takes at least the tail's time (the
 * FIFO of levels 1-4: an entry held far ahead holds every later free of its segment); from it,
 * its own time. Amortised O(1) for an entry not older than the tail; an older one moves the
 * shorter side of the array past it (min(entries before, entries after)). KVP_OK or
 * KVP_ERR_NOMEM (nothing changed). */
int kvp_fsm_quarantine_push(const struct kvp_master_fsm *f, struct kvp_fsm_seg *s, uint64_t off, uint64_t len,
                            uint64_t now_ms);
/* Remove an object entirely: unlink, quarantine every replica extent on a live segment (freed
 * at now_ms), drop it from the pending list, free its memory. */
void kvp_fsm_obj_destroy(struct kvp_master_fsm *f, struct kvp_fsm_obj *o, uint64_t now_ms);
/* Drop every replica on segment s; pending puts touching it are revoked, complete objects left
 * without replicas are removed. Returns the number of objects removed or revoked. */
uint64_t kvp_fsm_drop_segment_replicas(struct kvp_master_fsm *f, struct kvp_fsm_seg *s,
                                       uint64_t now_ms);
void kvp_fsm_state_clear(struct kvp_master_fsm *f);

/* fsm_cmd.c */
int kvp_fsm_apply_cmd(struct kvp_master_fsm *f, const Kvp__Command *cmd, Kvp__Response *r);
/* r's body becomes a PutEndResp with n statuses, all 0 (PutEnd's answer; PutCommit's too); the
 * body belongs to r even when this fails half way. NULL: out of memory. */
Kvp__PutEndResp *kvp_fsm_put_end_body(Kvp__Response *r, size_t n);

/* fsm_repair.c (drain and repair, docs/drain-repair.md). The wanted replica count of an
 * object is kept in pad[0] (PutStart's replica_num, 0 → 1). */
#define KVP_FSM_OBJ_WANT(o) ((o)->pad[0] ? (unsigned)(o)->pad[0] : (unsigned)(o)->n_replicas)
int kvp_fsm_repair_start(struct kvp_master_fsm *f, const Kvp__Command *c, Kvp__Response *r);
int kvp_fsm_repair_end(struct kvp_master_fsm *f, const Kvp__Command *c, Kvp__Response *r);
int kvp_fsm_replica_drop(struct kvp_master_fsm *f, const Kvp__Command *c, Kvp__Response *r);
int kvp_fsm_repair_scan(const struct kvp_master_fsm *f, const Kvp__RepairScanReq *q, Kvp__Response *r);

/* fsm_reserve.c (feature level 3): ReserveCmd, PutCommitCmd, the retire run by RevokeExpired. */
int kvp_fsm_reserve(struct kvp_master_fsm *f, const Kvp__Command *c, Kvp__Response *r);
int kvp_fsm_put_commit(struct kvp_master_fsm *f, const Kvp__Command *c, Kvp__Response *r);
int kvp_fsm_raise_level(struct kvp_master_fsm *f, const Kvp__Command *c, Kvp__Response *r);
int kvp_fsm_put_seal(struct kvp_master_fsm *f, const Kvp__Command *c, Kvp__Response *r);
/* Retire every reservation whose horizon_ms <= now_ms; returns how many. */
uint64_t kvp_fsm_resv_retire(struct kvp_master_fsm *f, uint64_t now_ms);
/* Forget every reservation of s (segment lost or unmounted: its space goes with it). */
void kvp_fsm_resv_drop_all(struct kvp_fsm_seg *s);
/* Unused bytes of a reservation (len minus its used ranges). */
uint64_t kvp_fsm_resv_unused(const struct kvp_fsm_resv *v);

/* fsm_query.c */
int kvp_fsm_query_req(const struct kvp_master_fsm *f, const Kvp__Request *req, Kvp__Response *r,
                      const struct kvp_fsm_qvis *vis);

/* Response helpers (fsm.c). */
Kvp__Response *kvp_fsm_resp_new(void);
int kvp_fsm_resp_error(Kvp__Response *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
Kvp__Replica *kvp_fsm_replica_msg(const struct kvp_fsm_seg *s, const struct kvp_fsm_replica *rp);
char *kvp_fsm_strdup(const char *s);

#endif
