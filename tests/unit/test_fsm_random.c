/*
 * test_fsm_random.c — randomized (seeded, reproducible) command sequences against a model.
 *
 * 100k random commands (puts, retries, ends, revokes, removes, evictions, expiry, quarantine
 * release, drains, segment loss, unmount, remount, clock steps back) are applied to the FSM
 * and to a small model of keys and segments. Checked: every per-key status against the model,
 * replica lists against the model, kvp_master_fsm_check() (no overlapping extents; used + free
 * + quarantined == capacity per segment), and determinism: every few thousand commands the
 * state is snapshotted into a second FSM, the snapshot bytes must match, and the next commands
 * must give byte-identical responses on both. A third FSM gets every command plus a bit-flipped
 * copy through kvp_master_fsm_apply_bytes() (fuzzing the decode path) and must stay consistent.
 * KVP_FSM_RANDOM_SEED and KVP_FSM_RANDOM_OPS override the seed and the command count.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/log.h"
#include "test_fsm_helpers.h"

#define NKEYS 400
#define MAXSEG 64

static uint64_t rs;
static uint64_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static uint64_t rn(uint64_t n)
{
    return rnd() % n;
}

struct mkey {
    int state; /* 0 none, 1 pending, 2 complete */
    uint64_t op, deadline;
    unsigned nrep;
    uint32_t seg[16];
};

struct mseg {
    uint32_t id;
    int state; /* KVP__SEGMENT_STATE__*; LOST/forgotten segments are not kept */
    char name[32];
    char host[16];
};

/* A reservation as the leader would keep it (feature level 3): bump = next offset it hands out. */
struct mresv {
    uint32_t seg;
    uint64_t off, len, term, horizon, bump;
};
#define MAXRESV 256

static struct mkey keys[NKEYS];
static struct mresv resv[MAXRESV];
static int nresv;
static struct mseg segs[MAXSEG];
static int nsegs;
static int seg_counter;
static uint64_t now_ms = 1000000;
static struct kvp_master_fsm *F, *G, *H; /* model-checked, mirror, fuzzed */
static uint64_t mirror_left;             /* commands still to compare on G */
static uint64_t n_fuzz_decoded;

static void key_name(int i, char *buf, size_t n)
{
    /* three tenants and the default one: kvp_master_fsm_check compares the per-tenant use kept
     * on apply with a recount */
    if (i % 4)
        snprintf(buf, n, "t%d\x1fmodel/layer-%02d/block-%06d", i % 4, i % 40, i);
    else
        snprintf(buf, n, "model/layer-%02d/block-%06d", i % 40, i);
}

static struct mseg *mseg_find(uint32_t id)
{
    for (int i = 0; i < nsegs; i++)
        if (segs[i].id == id)
            return &segs[i];
    return NULL;
}

/* The model's effect of losing (or unmounting) segment id. */
static void model_drop_segment(uint32_t id)
{
    for (int k = 0; k < NKEYS; k++) {
        struct mkey *m = &keys[k];
        if (!m->state)
            continue;
        unsigned w = 0;
        bool hit = false;
        for (unsigned r = 0; r < m->nrep; r++) {
            if (m->seg[r] == id)
                hit = true;
            else
                m->seg[w++] = m->seg[r];
        }
        m->nrep = w;
        if (hit && (m->state == 1 || w == 0))
            m->state = 0;
    }
    for (int i = 0; i < nsegs; i++)
        if (segs[i].id == id) {
            segs[i] = segs[--nsegs];
            break;
        }
    for (int i = 0; i < nresv;)
        if (resv[i].seg == id)
            resv[i] = resv[--nresv]; /* the FSM drops them with the segment */
        else
            i++;
}

/* Apply to F (returned), G while mirroring (responses must be identical), H plus a mutant. */
static Kvp__Response *apply_all(Kvp__Command *c)
{
    Kvp__Response *r = tf_apply(F, c);
    size_t n = kvp__command__get_packed_size(c);
    uint8_t *buf = malloc(n + 1);
    kvp__command__pack(c, buf);
    if (mirror_left) {
        mirror_left--;
        uint8_t *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        assert_int_equal(kvp_master_fsm_apply_bytes(G, buf, n, &b, &bl), KVP_OK);
        al = kvp__response__get_packed_size(r);
        a = malloc(al + 1);
        kvp__response__pack(r, a);
        assert_int_equal(al, bl);
        assert_memory_equal(a, b, al);
        free(a);
        free(b);
    }
    uint8_t *res = NULL;
    size_t rl = 0;
    assert_int_equal(kvp_master_fsm_apply_bytes(H, buf, n, &res, &rl), KVP_OK);
    free(res);
    if (n > 0) {
        buf[rn(n)] ^= (uint8_t)(1u << rn(8));
        res = NULL;
        int rc = kvp_master_fsm_apply_bytes(H, buf, n, &res, &rl);
        /* KVP_ERR_VERSION: the flipped bit raised Command.feature_level above this binary's
         * (refused, docs/operations.md "Upgrading") */
        assert_true(rc == KVP_OK || rc == KVP_ERR_MALFORMED || rc == KVP_ERR_INVALID || rc == KVP_ERR_VERSION);
        if (rc == KVP_OK) {
            n_fuzz_decoded++;
            assert_non_null(res);
        } else {
            assert_null(res);
        }
        free(res);
    }
    free(buf);
    return r;
}

static void op_mount(bool restart)
{
    if (nsegs >= MAXSEG - 1)
        return;
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__MountSegmentReq m = KVP__MOUNT_SEGMENT_REQ__INIT;
    struct mseg s = {0};
    struct mseg *old = NULL;
    if (restart && nsegs > 0) {
        old = &segs[rn((uint64_t)nsegs)];
        memcpy(s.name, old->name, sizeof(s.name));
        memcpy(s.host, old->host, sizeof(s.host));
    } else {
        snprintf(s.name, sizeof(s.name), "seg-%d", ++seg_counter);
        snprintf(s.host, sizeof(s.host), "host-%d", (int)rn(4));
    }
    m.name = s.name;
    m.host = s.host;
    m.endpoint = "ep:1";
    m.size = 64 * 1024 * (1 + rn(4));
    c.now_wall_ms = now_ms;
    c.body_case = KVP__COMMAND__BODY_MOUNT;
    c.mount = &m;
    Kvp__Response *r = apply_all(&c);
    assert_int_equal(r->status, KVP_OK);
    if (old)
        model_drop_segment(old->id);
    s.id = r->mount->segment_id;
    s.state = KVP__SEGMENT_STATE__SEGMENT_ACTIVE;
    segs[nsegs++] = s;
    kvp_master_fsm_response_free(r);
}

static void op_put_start(void)
{
    int k = (int)rn(NKEYS);
    struct mkey *m = &keys[k];
    char key[64];
    key_name(k, key, sizeof(key));
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutStartReq q = KVP__PUT_START_REQ__INIT;
    Kvp__PutStartItem it = KVP__PUT_START_ITEM__INIT, *items[1] = {&it};
    it.key = key;
    it.size = rn(20) == 0 ? 1 + rn(300 * 1024) : 1 + rn(8192);
    it.replica_num = (uint32_t)rn(5);
    it.op_id = (uint64_t)k * 10 + rn(3);
    it.soft_pin = rn(5) == 0;
    char pref[32];
    if (rn(4) == 0 && nsegs) {
        memcpy(pref, segs[rn((uint64_t)nsegs)].name, sizeof(pref));
        it.preferred_segment = pref;
    }
    q.n_items = 1;
    q.items = items;
    q.ttl_ms = rn(2) ? 0 : 50 + rn(500);
    c.now_wall_ms = now_ms;
    c.term = 1 + now_ms / 100000;
    c.body_case = KVP__COMMAND__BODY_PUT_START;
    c.put_start = &q;
    Kvp__Response *r = apply_all(&c);
    Kvp__PutStartResult *res = r->put_start->results[0];
    switch (m->state) {
    case 2:
        assert_int_equal(res->status, KVP_ERR_EXISTS);
        break;
    case 1:
        if (m->op == it.op_id) {
            assert_int_equal(res->status, KVP_OK);
            assert_int_equal(res->n_replicas, m->nrep);
            for (unsigned i = 0; i < m->nrep; i++)
                assert_int_equal(res->replicas[i]->segment_id, m->seg[i]);
        } else {
            assert_int_equal(res->status, KVP_ERR_EXISTS);
        }
        break;
    default:
        if (res->status == KVP_OK) {
            unsigned want = it.replica_num ? it.replica_num : 1;
            assert_true(res->n_replicas >= 1 && res->n_replicas <= want);
            m->state = 1;
            m->op = it.op_id;
            m->deadline = now_ms + (q.ttl_ms ? q.ttl_ms : 5000);
            m->nrep = (unsigned)res->n_replicas;
            for (unsigned i = 0; i < m->nrep; i++) {
                struct mseg *s = mseg_find(res->replicas[i]->segment_id);
                assert_non_null(s);
                assert_int_equal(s->state, KVP__SEGMENT_STATE__SEGMENT_ACTIVE);
                for (unsigned j = 0; j < i; j++)
                    assert_int_not_equal(m->seg[j], res->replicas[i]->segment_id);
                m->seg[i] = res->replicas[i]->segment_id;
            }
        } else {
            assert_true(res->status == KVP_ERR_NO_SPACE || res->status == KVP_ERR_TOO_LARGE);
        }
    }
    kvp_master_fsm_response_free(r);
}

static void op_put_end(void)
{
    int k = (int)rn(NKEYS);
    for (int tries = 0; tries < 30 && keys[k].state != 1 && rn(10); tries++)
        k = (int)rn(NKEYS); /* mostly end puts that are pending */
    struct mkey *m = &keys[k];
    char key[64];
    key_name(k, key, sizeof(key));
    uint64_t op = m->state && rn(4) ? m->op : (uint64_t)k * 10 + rn(3);
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutEndReq q = KVP__PUT_END_REQ__INIT;
    Kvp__PutEndItem it = KVP__PUT_END_ITEM__INIT, *items[1] = {&it};
    it.key = key;
    it.op_id = op;
    it.checksum = rnd();
    q.n_items = 1;
    q.items = items;
    c.now_wall_ms = now_ms;
    c.body_case = KVP__COMMAND__BODY_PUT_END;
    c.put_end = &q;
    Kvp__Response *r = apply_all(&c);
    int st = r->put_end->status[0];
    if (!m->state)
        assert_int_equal(st, KVP_ERR_NOT_FOUND);
    else if (m->op != op)
        assert_int_equal(st, KVP_ERR_EXISTS);
    else {
        assert_int_equal(st, KVP_OK);
        m->state = 2;
    }
    kvp_master_fsm_response_free(r);
}

static void op_revoke(void)
{
    int k = (int)rn(NKEYS);
    struct mkey *m = &keys[k];
    char key[64];
    key_name(k, key, sizeof(key));
    uint64_t op = m->state && rn(4) ? m->op : (uint64_t)k * 10 + rn(3);
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutRevokeReq q = KVP__PUT_REVOKE_REQ__INIT;
    Kvp__PutRevokeItem it = KVP__PUT_REVOKE_ITEM__INIT, *items[1] = {&it};
    it.key = key;
    it.op_id = op;
    q.n_items = 1;
    q.items = items;
    c.now_wall_ms = now_ms;
    c.body_case = KVP__COMMAND__BODY_PUT_REVOKE;
    c.put_revoke = &q;
    Kvp__Response *r = apply_all(&c);
    int st = r->put_revoke->status[0];
    if (m->state == 1 && m->op == op) {
        assert_int_equal(st, KVP_OK);
        m->state = 0;
    } else {
        assert_int_equal(st, KVP_ERR_NOT_FOUND);
    }
    kvp_master_fsm_response_free(r);
}

static void op_remove(bool evict)
{
    int k = (int)rn(NKEYS);
    struct mkey *m = &keys[k];
    char key[64], *kp[1] = {key};
    key_name(k, key, sizeof(key));
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__RemoveReq q = KVP__REMOVE_REQ__INIT;
    Kvp__EvictCmd e = KVP__EVICT_CMD__INIT;
    c.now_wall_ms = now_ms;
    if (evict) {
        e.n_keys = 1;
        e.keys = kp;
        c.body_case = KVP__COMMAND__BODY_EVICT;
        c.evict = &e;
    } else {
        q.n_keys = 1;
        q.keys = kp;
        c.body_case = KVP__COMMAND__BODY_REMOVE;
        c.remove = &q;
    }
    Kvp__Response *r = apply_all(&c);
    int st = r->remove->status[0];
    if (m->state == 2) {
        assert_int_equal(st, KVP_OK);
        m->state = 0;
    } else {
        assert_int_equal(st, m->state == 1 ? KVP_ERR_BUSY : KVP_ERR_NOT_FOUND);
    }
    kvp_master_fsm_response_free(r);
}

static uint64_t op_count(int which)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__RevokeExpiredCmd re = KVP__REVOKE_EXPIRED_CMD__INIT;
    Kvp__QuarantineReleaseCmd qr = KVP__QUARANTINE_RELEASE_CMD__INIT;
    Kvp__RemoveAllReq ra = KVP__REMOVE_ALL_REQ__INIT;
    c.now_wall_ms = now_ms;
    c.body_case = which;
    if (which == KVP__COMMAND__BODY_REVOKE_EXPIRED)
        c.revoke_expired = &re;
    else if (which == KVP__COMMAND__BODY_QUARANTINE_RELEASE)
        c.quarantine_release = &qr;
    else
        c.remove_all = &ra;
    Kvp__Response *r = apply_all(&c);
    uint64_t n = r->remove_all->removed;
    kvp_master_fsm_response_free(r);
    return n;
}

/* ReserveCmd on a random live segment: OK (recorded) or NO_SPACE. */
static void op_reserve(void)
{
    if (!nsegs || nresv == MAXRESV)
        return;
    struct mseg *sg = &segs[rn((uint64_t)nsegs)];
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__ReserveCmd q = KVP__RESERVE_CMD__INIT;
    q.segment_id = sg->id;
    q.length = 64 * (1 + rn(1024));
    q.horizon_ms = now_ms + 200 + rn(2000);
    c.now_wall_ms = now_ms;
    c.term = 1 + now_ms / 100000;
    c.feature_level = 3;
    c.body_case = KVP__COMMAND__BODY_RESERVE;
    c.reserve = &q;
    Kvp__Response *r = apply_all(&c);
    assert_int_equal(r->body_case, KVP__RESPONSE__BODY_RESERVE);
    if (sg->state != KVP__SEGMENT_STATE__SEGMENT_ACTIVE) {
        assert_int_equal(r->reserve->status, KVP_ERR_NOT_FOUND);
    } else if (r->reserve->status == KVP_OK) {
        resv[nresv++] = (struct mresv){sg->id, r->reserve->offset, q.length, c.term, q.horizon_ms,
                                       r->reserve->offset};
    } else {
        assert_int_equal(r->reserve->status, KVP_ERR_NO_SPACE);
    }
    kvp_master_fsm_response_free(r);
}

/* PutCommitCmd of one key placed at the bump pointer of a recorded reservation: the model says
 * exactly which status it gets. */
static void op_put_commit(void)
{
    if (!nresv)
        return;
    int k = (int)rn(NKEYS);
    struct mkey *m = &keys[k];
    struct mresv *v = &resv[rn((uint64_t)nresv)];
    uint64_t size = 1 + rn(2048), need = (size + 63) & ~63ull;
    if (v->bump + need > v->off + v->len)
        return;
    char key[64];
    key_name(k, key, sizeof(key));
    uint64_t op = (uint64_t)k * 10 + 5;
    uint64_t deadline = rn(8) == 0 ? now_ms - 1 : now_ms + rn(300);
    if (deadline > v->horizon)
        deadline = v->horizon;
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutCommitCmd q = KVP__PUT_COMMIT_CMD__INIT;
    Kvp__PutCommitItem it = KVP__PUT_COMMIT_ITEM__INIT, *items[1] = {&it};
    Kvp__ReplicaPlace rp = KVP__REPLICA_PLACE__INIT, *rpp[1] = {&rp};
    rp.segment_id = v->seg;
    rp.offset = v->bump;
    v->bump += need; /* handed out whether or not it commits: never handed out again */
    it.key = key;
    it.op_id = op;
    it.size = size;
    it.checksum = op * 7;
    it.term = v->term;
    it.deadline_ms = deadline;
    it.n_replicas = 1;
    it.replicas = rpp;
    q.n_items = 1;
    q.items = items;
    c.now_wall_ms = now_ms;
    c.term = 1 + now_ms / 100000;
    c.feature_level = 3;
    c.body_case = KVP__COMMAND__BODY_PUT_COMMIT;
    c.put_commit = &q;
    Kvp__Response *r = apply_all(&c);
    assert_int_equal(r->body_case, KVP__RESPONSE__BODY_PUT_END);
    int st = r->put_end->status[0];
    if (m->state == 2 && m->op == op)
        assert_int_equal(st, KVP_OK);
    else if (m->state)
        assert_int_equal(st, KVP_ERR_EXISTS);
    else if (now_ms > deadline)
        assert_int_equal(st, KVP_ERR_TIMEOUT);
    else
        assert_int_equal(st, KVP_OK); /* reservation live (retired ones leave resv[]) */
    if (!m->state && st == KVP_OK) {
        m->state = 2;
        m->op = op;
        m->nrep = 1;
        m->seg[0] = v->seg;
    }
    kvp_master_fsm_response_free(r);
}

static void op_revoke_expired(void)
{
    for (int i = 0; i < nresv;)
        if (resv[i].horizon <= now_ms)
            resv[i] = resv[--nresv]; /* retired by this command */
        else
            i++;
    uint64_t want = 0;
    for (int k = 0; k < NKEYS; k++)
        if (keys[k].state == 1 && keys[k].deadline < now_ms) {
            keys[k].state = 0;
            want++;
        }
    assert_int_equal(op_count(KVP__COMMAND__BODY_REVOKE_EXPIRED), want);
}

static void op_remove_all(void)
{
    uint64_t want = 0;
    for (int k = 0; k < NKEYS; k++)
        if (keys[k].state == 2) {
            keys[k].state = 0;
            want++;
        }
    assert_int_equal(op_count(KVP__COMMAND__BODY_REMOVE_ALL), want);
}

static void op_segment(int kind)
{
    if (nsegs == 0)
        return;
    struct mseg *s = &segs[rn((uint64_t)nsegs)];
    uint32_t id = s->id;
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__SegmentLostCmd l = KVP__SEGMENT_LOST_CMD__INIT;
    Kvp__UnmountSegmentReq u = KVP__UNMOUNT_SEGMENT_REQ__INIT;
    Kvp__DrainSegmentReq d = KVP__DRAIN_SEGMENT_REQ__INIT;
    Kvp__SegmentStateCmd ss = KVP__SEGMENT_STATE_CMD__INIT;
    c.now_wall_ms = now_ms;
    switch (kind) {
    case 0:
        l.segment_id = id;
        c.body_case = KVP__COMMAND__BODY_SEGMENT_LOST;
        c.segment_lost = &l;
        break;
    case 1:
        u.segment_id = id;
        c.body_case = KVP__COMMAND__BODY_UNMOUNT;
        c.unmount = &u;
        break;
    case 2:
        d.segment_id = id;
        c.body_case = KVP__COMMAND__BODY_DRAIN;
        c.drain = &d;
        break;
    default:
        ss.segment_id = id;
        ss.state = KVP__SEGMENT_STATE__SEGMENT_ACTIVE;
        c.body_case = KVP__COMMAND__BODY_SEGMENT_STATE;
        c.segment_state = &ss;
        break;
    }
    Kvp__Response *r = apply_all(&c);
    assert_int_equal(r->status, KVP_OK);
    kvp_master_fsm_response_free(r);
    if (kind <= 1)
        model_drop_segment(id);
    else
        s->state = kind == 2 ? KVP__SEGMENT_STATE__SEGMENT_DRAINING
                             : KVP__SEGMENT_STATE__SEGMENT_ACTIVE;
}

static void check_key(int k)
{
    struct mkey *m = &keys[k];
    char key[64];
    key_name(k, key, sizeof(key));
    const char *host = nsegs ? segs[rn((uint64_t)nsegs)].host : "none";
    Kvp__Response *r = tf_get_replicas(F, key, host);
    Kvp__ObjectInfo *oi = r->get_replicas->objects[0];
    if (m->state != 2) {
        assert_int_equal(oi->status, KVP_ERR_NOT_FOUND);
    } else {
        assert_int_equal(oi->status, KVP_OK);
        /* DRAINING replicas are listed only when no ACTIVE one exists (C4) */
        unsigned active = 0;
        for (unsigned j = 0; j < m->nrep; j++) {
            struct mseg *ms = mseg_find(m->seg[j]);
            active += ms && ms->state == KVP__SEGMENT_STATE__SEGMENT_ACTIVE;
        }
        assert_int_equal(oi->n_replicas, active ? active : m->nrep);
        int prev_rank = -1;
        for (size_t i = 0; i < oi->n_replicas; i++) {
            bool in = false;
            for (unsigned j = 0; j < m->nrep; j++)
                in |= m->seg[j] == oi->replicas[i]->segment_id;
            assert_true(in);
            struct mseg *s = mseg_find(oi->replicas[i]->segment_id);
            assert_non_null(s);
            int rank = (s->state == KVP__SEGMENT_STATE__SEGMENT_ACTIVE ? 0 : 2) +
                       (strcmp(s->host, host) != 0);
            assert_true(rank >= prev_rank); /* ACTIVE before DRAINING, same host first */
            prev_rank = rank;
        }
    }
    kvp_master_fsm_response_free(r);
    assert_int_equal(tf_exists(F, key), m->state == 2 ? 1 : 0);
}

static void start_mirror(void)
{
    size_t n1, n2;
    uint8_t *b1 = tf_snapshot(F, &n1);
    assert_int_equal(kvp_master_fsm_restore(G, b1, n1), KVP_OK);
    uint8_t *b2 = tf_snapshot(G, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    free(b1);
    free(b2);
    assert_int_equal(kvp_master_fsm_check(G), 0);
    mirror_left = 300;
}

/* Incremental snapshots of F taken across the random commands (fsm_snap_inc.c): R restores
 * F's synchronous snapshot at begin; the chunks, written a few hundred bytes at a time while
 * the next commands run on F, must restore to a state with R's digest that passes every
 * invariant. Some are abandoned half way. */
static struct kvp_master_fsm *R;
static uint8_t *inc_buf;
static size_t inc_len, inc_cap;
static uint64_t inc_done, inc_abandoned;

static void inc_step(void)
{
    if (!kvp_master_fsm_snap_running(F)) {
        if (rn(100) != 0)
            return;
        size_t n = 0;
        uint8_t *b = tf_snapshot(F, &n);
        R = tf_new(200, 5000);
        assert_int_equal(kvp_master_fsm_restore(R, b, n), KVP_OK);
        free(b);
        assert_int_equal(kvp_master_fsm_snap_begin(F), KVP_OK);
        assert_int_equal(kvp_master_fsm_snap_begin(F), KVP_ERR_BUSY);
        inc_len = 0;
        return;
    }
    if (rn(400) == 0) {
        kvp_master_fsm_snap_abort(F);
        kvp_master_fsm_destroy(&R);
        inc_abandoned++;
        return;
    }
    uint8_t *c = NULL;
    size_t l = 0;
    bool last = false;
    assert_int_equal(kvp_master_fsm_snap_next(F, 64 + rn(1024), &c, &l, &last), KVP_OK);
    if (inc_len + l > inc_cap) {
        inc_cap = (inc_len + l) * 2;
        inc_buf = realloc(inc_buf, inc_cap);
        assert_non_null(inc_buf);
    }
    memcpy(inc_buf + inc_len, c, l);
    inc_len += l;
    free(c);
    if (!last)
        return;
    assert_false(kvp_master_fsm_snap_running(F));
    struct kvp_master_fsm *S = tf_new(200, 5000);
    assert_int_equal(kvp_master_fsm_restore(S, inc_buf, inc_len), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(S), 0);
    assert_true(kvp_master_fsm_digest(S) == kvp_master_fsm_digest(R));
    kvp_master_fsm_destroy(&S);
    kvp_master_fsm_destroy(&R);
    inc_done++;
}

static void test_fsm_random_100k_ops_model_and_invariants_hold(void **state)
{
    (void)state;
    const char *e = getenv("KVP_FSM_RANDOM_SEED");
    rs = e ? strtoull(e, NULL, 0) : 0x9E3779B97F4A7C15ull;
    if (!rs)
        rs = 1;
    e = getenv("KVP_FSM_RANDOM_OPS");
    uint64_t ops = e ? strtoull(e, NULL, 0) : 100000;
    print_message("seed 0x%llx, %llu ops\n", (unsigned long long)rs, (unsigned long long)ops);
    F = tf_new(200, 5000);
    G = tf_new(200, 5000);
    H = tf_new(200, 5000);
    for (int i = 0; i < 6; i++)
        op_mount(false);
    uint64_t counts[17] = {0}, max_objects = 0, n_put_start_late = 0;
    for (uint64_t i = 0; i < ops; i++) {
        now_ms += rn(40);
        if (rn(500) == 0)
            now_ms -= rn(30); /* a new leader's clock may be a little behind */
        uint64_t p = rn(1000);
        int kind;
        if (p < 300)
            kind = 0, op_put_start();
        else if (p < 600)
            kind = 1, op_put_end();
        else if (p < 650)
            kind = 2, op_revoke();
        else if (p < 710)
            kind = 3, op_remove(false);
        else if (p < 730)
            kind = 4, op_remove(true);
        else if (p < 780)
            kind = 5, op_revoke_expired();
        else if (p < 860)
            kind = 6, (void)op_count(KVP__COMMAND__BODY_QUARANTINE_RELEASE);
        else if (p < 863 && rn(3) == 0)
            kind = 7, op_segment(0);
        else if (p < 866 && rn(3) == 0)
            kind = 8, op_segment(1);
        else if (p < 872)
            kind = 9, op_segment(2);
        else if (p < 880)
            kind = 10, op_segment(3);
        else if ((p < 886 && nsegs < 10) || nsegs < 3)
            kind = 11, op_mount(false);
        else if (p < 888 && rn(2) == 0)
            kind = 12, op_mount(true);
        else if (p < 889 && rn(10) == 0)
            kind = 13, op_remove_all();
        else if (p < 905)
            kind = 15, op_reserve();
        else if (p < 960)
            kind = 16, op_put_commit();
        else
            kind = 14, check_key((int)rn(NKEYS));
        counts[kind]++;
        struct kvp_master_fsm_stats st;
        kvp_master_fsm_stats(F, &st);
        assert_true(st.used_bytes + st.quarantined_bytes <= st.capacity_bytes);
        if (st.objects > max_objects)
            max_objects = st.objects;
        if (kind == 0 && i > 1000)
            n_put_start_late++;
        if (i % 50 == 0)
            assert_int_equal(kvp_master_fsm_check(F), 0);
        if (i % 5000 == 2500)
            start_mirror();
        if (i % 1000 == 0)
            assert_int_equal(kvp_master_fsm_check(H), 0);
        inc_step();
    }
    print_message("incremental snapshots: %llu restored with the digest of their begin, %llu abandoned\n",
                  (unsigned long long)inc_done, (unsigned long long)inc_abandoned);
    assert_true(inc_done > 10);
    kvp_master_fsm_snap_abort(F);
    kvp_master_fsm_destroy(&R);
    free(inc_buf);
    assert_int_equal(kvp_master_fsm_check(F), 0);
    assert_int_equal(kvp_master_fsm_check(H), 0);
    for (int k = 0; k < NKEYS; k++)
        check_key(k);
    struct kvp_master_fsm_stats st;
    kvp_master_fsm_stats(F, &st);
    print_message("end: %llu segments, %llu objects, %llu pending, used %llu, quarantined %llu "
                  "of %llu bytes; %llu mutated commands decoded and applied\n",
                  (unsigned long long)st.segments, (unsigned long long)st.objects,
                  (unsigned long long)st.pending_puts, (unsigned long long)st.used_bytes,
                  (unsigned long long)st.quarantined_bytes,
                  (unsigned long long)st.capacity_bytes, (unsigned long long)n_fuzz_decoded);
    print_message("max complete objects at once: %llu\n", (unsigned long long)max_objects);
    (void)n_put_start_late;
    print_message("ops: put_start %llu put_end %llu revoke %llu remove %llu evict %llu "
                  "expire %llu release %llu lost %llu unmount %llu drain %llu active %llu "
                  "mount %llu remount %llu remove_all %llu check %llu reserve %llu put_commit %llu\n",
                  (unsigned long long)counts[0], (unsigned long long)counts[1],
                  (unsigned long long)counts[2], (unsigned long long)counts[3],
                  (unsigned long long)counts[4], (unsigned long long)counts[5],
                  (unsigned long long)counts[6], (unsigned long long)counts[7],
                  (unsigned long long)counts[8], (unsigned long long)counts[9],
                  (unsigned long long)counts[10], (unsigned long long)counts[11],
                  (unsigned long long)counts[12], (unsigned long long)counts[13],
                  (unsigned long long)counts[14], (unsigned long long)counts[15],
                  (unsigned long long)counts[16]);
    assert_true(counts[0] > 0 && st.objects + st.pending_puts > 0);
    kvp_master_fsm_destroy(&F);
    kvp_master_fsm_destroy(&G);
    kvp_master_fsm_destroy(&H);
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_ERROR); /* segment churn and fuzzing log a lot at INFO/WARN */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fsm_random_100k_ops_model_and_invariants_hold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
