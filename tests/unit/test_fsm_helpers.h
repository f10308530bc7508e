/* test_fsm_helpers.h — build FSM commands and queries in one line (test_fsm*.c). Include after
 * <cmocka.h>. */
#ifndef KVP_TEST_FSM_HELPERS_H
#define KVP_TEST_FSM_HELPERS_H

#include <stdlib.h>
#include <string.h>

#include "actors/master/fsm/fsm.h"
#include "actors/master/fsm/version.h"
#include "kvpool.h"

static inline struct kvp_master_fsm *tf_new(uint64_t grace_ms, uint64_t ttl_ms)
{
    struct kvp_master_fsm_params p = {.fence_grace_ms = grace_ms, .put_ttl_ms = ttl_ms};
    struct kvp_master_fsm *f = NULL;
    assert_int_equal(kvp_master_fsm_new(&f, &p), KVP_OK);
    return f;
}

/* Apply and return the response (caller frees). */
static inline Kvp__Response *tf_apply(struct kvp_master_fsm *f, Kvp__Command *c)
{
    Kvp__Response *r = NULL;
    assert_int_equal(kvp_master_fsm_apply(f, c, &r), KVP_OK);
    assert_non_null(r);
    return r;
}

/* Apply, return Response.status, free. */
static inline int tf_apply_status(struct kvp_master_fsm *f, Kvp__Command *c)
{
    Kvp__Response *r = tf_apply(f, c);
    int st = r->status;
    kvp_master_fsm_response_free(r);
    return st;
}

static inline int tf_mount(struct kvp_master_fsm *f, const char *name, const char *host,
                           uint64_t size, uint64_t now, uint32_t *id)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__MountSegmentReq m = KVP__MOUNT_SEGMENT_REQ__INIT;
    char ep[128];
    if (id)
        *id = 0;
    snprintf(ep, sizeof(ep), "%s:7000", host);
    m.name = (char *)name;
    m.host = (char *)host;
    m.endpoint = ep;
    m.size = size;
    m.owner_pid = 4242;
    c.now_wall_ms = now;
    c.body_case = KVP__COMMAND__BODY_MOUNT;
    c.mount = &m;
    Kvp__Response *r = tf_apply(f, &c);
    int st = r->status;
    if (st == KVP_OK) {
        assert_int_equal(r->body_case, KVP__RESPONSE__BODY_MOUNT);
        if (id)
            *id = r->mount->segment_id;
    }
    kvp_master_fsm_response_free(r);
    return st;
}

struct tf_put {
    const char *key;
    uint64_t size;
    uint32_t replica_num;
    uint64_t op_id;
    const char *preferred;
    bool soft_pin;
};

/* PutStart of one item; returns the response (caller frees); *st = the item's status. */
static inline Kvp__Response *tf_put_start_r(struct kvp_master_fsm *f, const struct tf_put *p,
                                            uint64_t now, uint64_t ttl_ms, int *st)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutStartReq q = KVP__PUT_START_REQ__INIT;
    Kvp__PutStartItem it = KVP__PUT_START_ITEM__INIT, *items[1] = {&it};
    it.key = (char *)p->key;
    it.size = p->size;
    it.replica_num = p->replica_num;
    it.op_id = p->op_id;
    it.soft_pin = p->soft_pin;
    if (p->preferred)
        it.preferred_segment = (char *)p->preferred;
    q.n_items = 1;
    q.items = items;
    q.ttl_ms = ttl_ms;
    c.now_wall_ms = now;
    c.term = 3;
    c.body_case = KVP__COMMAND__BODY_PUT_START;
    c.put_start = &q;
    Kvp__Response *r = tf_apply(f, &c);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->body_case, KVP__RESPONSE__BODY_PUT_START);
    assert_int_equal(r->put_start->n_results, 1);
    *st = r->put_start->results[0]->status;
    return r;
}

/* A replica's place in a PutCommit item. */
struct tf_place {
    uint32_t seg;
    uint64_t off;
};

/* One PutCommitCmd item (an intent when `intent`) logged by a leader of `cmd_term` at `now`,
 * placed in the reservations of `term`; the command's feature level `level`, or as a leader of
 * this binary stamps it when 0. Returns the apply's error when it is not KVP_OK, else the item's
 * status (the FSM's invariants checked after it). */
static inline int tf_put_commit(struct kvp_master_fsm *f, const char *key, uint64_t op, uint64_t size, uint64_t csum,
                                uint64_t term, uint64_t cmd_term, uint64_t deadline, uint64_t now,
                                const struct tf_place *pl, size_t n, uint32_t replica_num, bool intent, uint32_t level)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutCommitCmd q = KVP__PUT_COMMIT_CMD__INIT;
    Kvp__PutCommitItem it = KVP__PUT_COMMIT_ITEM__INIT, *items[1] = {&it};
    Kvp__ReplicaPlace rp[4], *rpp[4];
    assert_true(n <= 4);
    for (size_t i = 0; i < n; i++) {
        kvp__replica_place__init(&rp[i]);
        rp[i].segment_id = pl[i].seg;
        rp[i].offset = pl[i].off;
        rpp[i] = &rp[i];
    }
    it.key = (char *)key;
    it.op_id = op;
    it.size = size;
    it.checksum = csum;
    it.term = term;
    it.deadline_ms = deadline;
    it.n_replicas = n;
    it.replicas = rpp;
    it.replica_num = replica_num;
    it.intent = intent;
    q.n_items = 1;
    q.items = items;
    c.now_wall_ms = now;
    c.term = cmd_term;
    c.body_case = KVP__COMMAND__BODY_PUT_COMMIT;
    c.put_commit = &q;
    if (level)
        c.feature_level = level;
    else
        kvp_feature_prepare_command(&c, KVP_FEATURE_LEVEL);
    Kvp__Response *r = NULL;
    int rc = kvp_master_fsm_apply(f, &c, &r);
    if (rc != KVP_OK) {
        kvp_master_fsm_response_free(r);
        return rc;
    }
    assert_int_equal(r->body_case, KVP__RESPONSE__BODY_PUT_END);
    assert_int_equal(r->put_end->n_status, 1);
    int st = r->put_end->status[0];
    kvp_master_fsm_response_free(r);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    return st;
}

static inline int tf_put_start(struct kvp_master_fsm *f, const char *key, uint64_t size,
                               uint32_t rn, uint64_t op, uint64_t now)
{
    struct tf_put p = {.key = key, .size = size, .replica_num = rn, .op_id = op};
    int st;
    kvp_master_fsm_response_free(tf_put_start_r(f, &p, now, 0, &st));
    return st;
}

static inline int tf_put_end(struct kvp_master_fsm *f, const char *key, uint64_t op,
                             uint64_t csum, uint64_t now)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutEndReq q = KVP__PUT_END_REQ__INIT;
    Kvp__PutEndItem it = KVP__PUT_END_ITEM__INIT, *items[1] = {&it};
    it.key = (char *)key;
    it.op_id = op;
    it.checksum = csum;
    q.n_items = 1;
    q.items = items;
    c.now_wall_ms = now;
    c.body_case = KVP__COMMAND__BODY_PUT_END;
    c.put_end = &q;
    Kvp__Response *r = tf_apply(f, &c);
    assert_int_equal(r->body_case, KVP__RESPONSE__BODY_PUT_END);
    assert_int_equal(r->put_end->n_status, 1);
    int st = r->put_end->status[0];
    kvp_master_fsm_response_free(r);
    return st;
}

static inline int tf_put(struct kvp_master_fsm *f, const char *key, uint64_t size, uint32_t rn,
                         uint64_t op, uint64_t now)
{
    int st = tf_put_start(f, key, size, rn, op, now);
    if (st != KVP_OK)
        return st;
    return tf_put_end(f, key, op, 0xC0FFEEull ^ op, now);
}

static inline int tf_revoke(struct kvp_master_fsm *f, const char *key, uint64_t op, uint64_t now)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutRevokeReq q = KVP__PUT_REVOKE_REQ__INIT;
    Kvp__PutRevokeItem it = KVP__PUT_REVOKE_ITEM__INIT, *items[1] = {&it};
    it.key = (char *)key;
    it.op_id = op;
    q.n_items = 1;
    q.items = items;
    c.now_wall_ms = now;
    c.body_case = KVP__COMMAND__BODY_PUT_REVOKE;
    c.put_revoke = &q;
    Kvp__Response *r = tf_apply(f, &c);
    assert_int_equal(r->body_case, KVP__RESPONSE__BODY_PUT_REVOKE);
    int st = r->put_revoke->status[0];
    kvp_master_fsm_response_free(r);
    return st;
}

/* Remove (evict=false) or Evict (evict=true) one key. */
static inline int tf_remove(struct kvp_master_fsm *f, const char *key, bool evict, uint64_t now)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__RemoveReq q = KVP__REMOVE_REQ__INIT;
    Kvp__EvictCmd e = KVP__EVICT_CMD__INIT;
    char *keys[1] = {(char *)key};
    c.now_wall_ms = now;
    if (evict) {
        e.n_keys = 1;
        e.keys = keys;
        c.body_case = KVP__COMMAND__BODY_EVICT;
        c.evict = &e;
    } else {
        q.n_keys = 1;
        q.keys = keys;
        c.body_case = KVP__COMMAND__BODY_REMOVE;
        c.remove = &q;
    }
    Kvp__Response *r = tf_apply(f, &c);
    assert_int_equal(r->body_case, KVP__RESPONSE__BODY_REMOVE);
    int st = r->remove->status[0];
    kvp_master_fsm_response_free(r);
    return st;
}

/* Body-less timer commands; returns the count in remove_all.removed. */
static inline uint64_t tf_count_cmd(struct kvp_master_fsm *f, int which, uint64_t now)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__RevokeExpiredCmd re = KVP__REVOKE_EXPIRED_CMD__INIT;
    Kvp__QuarantineReleaseCmd qr = KVP__QUARANTINE_RELEASE_CMD__INIT;
    Kvp__RemoveAllReq ra = KVP__REMOVE_ALL_REQ__INIT;
    c.now_wall_ms = now;
    c.body_case = which;
    if (which == KVP__COMMAND__BODY_REVOKE_EXPIRED)
        c.revoke_expired = &re;
    else if (which == KVP__COMMAND__BODY_QUARANTINE_RELEASE)
        c.quarantine_release = &qr;
    else
        c.remove_all = &ra;
    Kvp__Response *r = tf_apply(f, &c);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->body_case, KVP__RESPONSE__BODY_REMOVE_ALL);
    uint64_t n = r->remove_all->removed;
    kvp_master_fsm_response_free(r);
    return n;
}
#define tf_revoke_expired(f, now) tf_count_cmd((f), KVP__COMMAND__BODY_REVOKE_EXPIRED, (now))
#define tf_release(f, now) tf_count_cmd((f), KVP__COMMAND__BODY_QUARANTINE_RELEASE, (now))
#define tf_remove_all(f, now) tf_count_cmd((f), KVP__COMMAND__BODY_REMOVE_ALL, (now))

static inline int tf_seg_lost(struct kvp_master_fsm *f, uint32_t id, uint64_t now)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__SegmentLostCmd l = KVP__SEGMENT_LOST_CMD__INIT;
    l.segment_id = id;
    c.now_wall_ms = now;
    c.body_case = KVP__COMMAND__BODY_SEGMENT_LOST;
    c.segment_lost = &l;
    return tf_apply_status(f, &c);
}

static inline int tf_seg_state(struct kvp_master_fsm *f, uint32_t id, int state, uint64_t now)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__SegmentStateCmd s = KVP__SEGMENT_STATE_CMD__INIT;
    s.segment_id = id;
    s.state = state;
    c.now_wall_ms = now;
    c.body_case = KVP__COMMAND__BODY_SEGMENT_STATE;
    c.segment_state = &s;
    return tf_apply_status(f, &c);
}

static inline int tf_unmount(struct kvp_master_fsm *f, uint32_t id, uint64_t now)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__UnmountSegmentReq u = KVP__UNMOUNT_SEGMENT_REQ__INIT;
    u.segment_id = id;
    c.now_wall_ms = now;
    c.body_case = KVP__COMMAND__BODY_UNMOUNT;
    c.unmount = &u;
    return tf_apply_status(f, &c);
}

static inline int tf_drain(struct kvp_master_fsm *f, uint32_t id, const char *name, uint64_t now)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__DrainSegmentReq d = KVP__DRAIN_SEGMENT_REQ__INIT;
    d.segment_id = id;
    if (name)
        d.name = (char *)name;
    c.now_wall_ms = now;
    c.body_case = KVP__COMMAND__BODY_DRAIN;
    c.drain = &d;
    return tf_apply_status(f, &c);
}

/* Queries. */
static inline Kvp__Response *tf_query(const struct kvp_master_fsm *f, Kvp__Request *q)
{
    Kvp__Response *r = NULL;
    assert_int_equal(kvp_master_fsm_query(f, q, &r), KVP_OK);
    assert_non_null(r);
    return r;
}

static inline Kvp__Response *tf_get_replicas(const struct kvp_master_fsm *f, const char *key,
                                             const char *client_host)
{
    Kvp__Request q = KVP__REQUEST__INIT;
    Kvp__GetReplicaListReq g = KVP__GET_REPLICA_LIST_REQ__INIT;
    char *keys[1] = {(char *)key};
    g.n_keys = 1;
    g.keys = keys;
    if (client_host)
        g.client_host = (char *)client_host;
    q.body_case = KVP__REQUEST__BODY_GET_REPLICAS;
    q.get_replicas = &g;
    Kvp__Response *r = tf_query(f, &q);
    assert_int_equal(r->body_case, KVP__RESPONSE__BODY_GET_REPLICAS);
    assert_int_equal(r->get_replicas->n_objects, 1);
    return r;
}

static inline int tf_exists(const struct kvp_master_fsm *f, const char *key)
{
    Kvp__Request q = KVP__REQUEST__INIT;
    Kvp__ExistsReq e = KVP__EXISTS_REQ__INIT;
    char *keys[1] = {(char *)key};
    e.n_keys = 1;
    e.keys = keys;
    q.body_case = KVP__REQUEST__BODY_EXISTS;
    q.exists = &e;
    Kvp__Response *r = tf_query(f, &q);
    int v = r->exists->results[0];
    kvp_master_fsm_response_free(r);
    return v;
}

static inline int64_t tf_get_size(const struct kvp_master_fsm *f, const char *key)
{
    Kvp__Request q = KVP__REQUEST__INIT;
    Kvp__GetSizeReq g = KVP__GET_SIZE_REQ__INIT;
    char *keys[1] = {(char *)key};
    g.n_keys = 1;
    g.keys = keys;
    q.body_case = KVP__REQUEST__BODY_GET_SIZE;
    q.get_size = &g;
    Kvp__Response *r = tf_query(f, &q);
    int64_t v = r->get_size->sizes[0];
    kvp_master_fsm_response_free(r);
    return v;
}

/* Snapshot bytes (caller frees). */
static inline uint8_t *tf_snapshot(const struct kvp_master_fsm *f, size_t *len)
{
    uint8_t *b = NULL;
    assert_int_equal(kvp_master_fsm_snapshot(f, &b, len), KVP_OK);
    assert_non_null(b);
    return b;
}

#endif
