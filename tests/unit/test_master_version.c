/*
 * test_master_version.c — rolling upgrades (actors/master/fsm/version.h): the cluster's feature
 * level from what the members report, the PutStart gate, and why it exists: two members, one of
 * level 2 and one of level 1 (v0.1.0 ignores PutStartReq.avoid_segments), apply the commands
 * the leader logs and must place every put alike.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "actors/master/fsm/version.h"
#include "test_fsm_helpers.h"

#define MB (1024u * 1024u)

static void test_cluster_level(void **state)
{
    (void)state;
    uint64_t now = 100000;
    struct kvp_feature_peer p[2] = {{2, now - 10}, {2, now - 900}};
    assert_int_equal(kvp_feature_cluster_level(2, p, 2, now), 2);
    assert_int_equal(kvp_feature_cluster_level(2, NULL, 0, now), 2); /* a cluster of one */
    p[1].level = 1; /* a v0.1.0 member */
    assert_int_equal(kvp_feature_cluster_level(2, p, 2, now), 1);
    p[1].level = 3; /* a newer member: the cluster stays at the lowest */
    assert_int_equal(kvp_feature_cluster_level(2, p, 2, now), 2);
    p[1].level = 2;
    p[1].heard_ms = now - KVP_FEATURE_FRESH_MS; /* stopped, being replaced: unknown, so 1 */
    assert_int_equal(kvp_feature_cluster_level(2, p, 2, now), 1);
    p[1].heard_ms = 0; /* never heard (a new leader's first second) */
    assert_int_equal(kvp_feature_cluster_level(2, p, 2, now), 1);
    /* A reply without the field (v0.1.0) reads as 1. */
    assert_int_equal(kvp_feature_reported(0), 1);
    assert_int_equal(kvp_feature_reported(2), 2);
}

/* The committed level (RaiseLevelCmd): a member down does not lower it, a member heard at a
 * lower level (downgraded in place) does; it is raised only when every member reported it. */
static void test_effective_level(void **state)
{
    (void)state;
    uint64_t now = 100000;
    struct kvp_feature_peer p[2] = {{4, now - 10}, {4, now - 900}};
    /* Nothing committed: as kvp_feature_cluster_level. */
    assert_int_equal(kvp_feature_effective_level(4, p, 2, now, 0), 4);
    p[1].heard_ms = 0; /* member 2 down */
    assert_int_equal(kvp_feature_effective_level(4, p, 2, now, 0), 1);
    assert_int_equal(kvp_feature_effective_level(4, p, 2, now, 1), 1);
    /* Committed 4: a member down (or a new leader that heard nobody yet) keeps it. */
    assert_int_equal(kvp_feature_effective_level(4, p, 2, now, 4), 4);
    p[0].heard_ms = 0;
    assert_int_equal(kvp_feature_effective_level(4, p, 2, now, 4), 4);
    p[1].heard_ms = now - KVP_FEATURE_FRESH_MS; /* stale: as not heard */
    assert_int_equal(kvp_feature_effective_level(4, p, 2, now, 4), 4);
    /* Never above this master's own level, nor above the committed one. */
    assert_int_equal(kvp_feature_effective_level(3, p, 2, now, 4), 3);
    p[0] = (struct kvp_feature_peer){5, now - 10};
    p[1] = (struct kvp_feature_peer){5, now - 10};
    assert_int_equal(kvp_feature_effective_level(5, p, 2, now, 4), 5); /* everyone heard at 5 */
    p[1].heard_ms = 0;
    assert_int_equal(kvp_feature_effective_level(5, p, 2, now, 4), 4); /* one down: committed 4 */
    /* A member heard at a lower level (a downgrade in place) lowers it to what it reports. */
    p[0] = (struct kvp_feature_peer){1, now - 10};
    assert_int_equal(kvp_feature_effective_level(4, p, 2, now, 4), 1);
    p[0].level = 3;
    assert_int_equal(kvp_feature_effective_level(4, p, 2, now, 4), 3);
    /* Raised only to a level every member reported, and only from level 4 (the command's). */
    assert_false(kvp_feature_should_raise(3, 0));
    assert_false(kvp_feature_should_raise(1, 0));
    assert_true(kvp_feature_should_raise(4, 0));
    assert_true(kvp_feature_should_raise(5, 4));
    assert_false(kvp_feature_should_raise(4, 4));
    assert_false(kvp_feature_should_raise(4, 5)); /* never lowered */
}

/* RaiseLevelCmd on the FSM: monotonic, in the snapshot, stamped 4 so that a level-3 member
 * refuses it (KVP_ERR_VERSION) instead of ignoring it. */
static void test_raise_level_cmd(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    uint32_t sid = 0;
    assert_int_equal(tf_mount(f, "s1", "h1", 4 * MB, 1, &sid), KVP_OK);
    size_t l0 = 0;
    uint8_t *plain = tf_snapshot(f, &l0);
    assert_int_equal(kvp_master_fsm_feature_level(f), 0);
    Kvp__RaiseLevelCmd body = KVP__RAISE_LEVEL_CMD__INIT;
    Kvp__Command c = KVP__COMMAND__INIT;
    c.body_case = KVP__COMMAND__BODY_RAISE_LEVEL;
    c.raise_level = &body;
    body.level = 4;
    assert_int_equal(kvp_feature_command_needs(&c), KVP_FEATURE_COMMITTED);
    kvp_feature_prepare_command(&c, 1); /* stamped whatever level it is logged at */
    assert_int_equal(c.feature_level, KVP_FEATURE_COMMITTED);
    assert_int_equal(tf_apply_status(f, &c), KVP_OK);
    assert_int_equal(kvp_master_fsm_feature_level(f), 4);
    body.level = 3; /* never lowered */
    assert_int_equal(tf_apply_status(f, &c), KVP_OK);
    assert_int_equal(kvp_master_fsm_feature_level(f), 4);
    body.level = 0;
    assert_int_equal(tf_apply_status(f, &c), KVP_ERR_INVALID);
    assert_int_equal(kvp_master_fsm_feature_level(f), 4);
    /* In the snapshot: a restored member knows it. */
    size_t l1 = 0;
    uint8_t *snap = tf_snapshot(f, &l1);
    assert_true(l1 > l0);
    struct kvp_master_fsm *g = tf_new(1000, 5000);
    assert_int_equal(kvp_master_fsm_restore(g, snap, l1), KVP_OK);
    assert_int_equal(kvp_master_fsm_feature_level(g), 4);
    /* A snapshot without it restores to 0 (and over a state that had one). */
    assert_int_equal(kvp_master_fsm_restore(g, plain, l0), KVP_OK);
    assert_int_equal(kvp_master_fsm_feature_level(g), 0);
    free(plain);
    free(snap);
    kvp_master_fsm_destroy(&g);
    kvp_master_fsm_destroy(&f);
}

static void test_gate_and_needs(void **state)
{
    (void)state;
    uint32_t avoid[2] = {1, 2};
    Kvp__PutStartReq q = KVP__PUT_START_REQ__INIT;
    Kvp__Command c = KVP__COMMAND__INIT;
    c.body_case = KVP__COMMAND__BODY_PUT_START;
    c.put_start = &q;
    q.avoid_segments = avoid;
    q.n_avoid_segments = 2;
    assert_int_equal(kvp_feature_command_needs(&c), 2);
    assert_int_equal(kvp_feature_gate_put_start(&q, 2), 0);
    assert_int_equal(q.n_avoid_segments, 2);
    assert_int_equal(kvp_feature_gate_put_start(&q, 1), 2);
    assert_int_equal(q.n_avoid_segments, 0);
    assert_int_equal(kvp_feature_command_needs(&c), 1);
}

/* The FSM as v0.1.0 applies a PutStart: the avoid list is an unknown field, ignored. */
static Kvp__Response *apply_as_level1(struct kvp_master_fsm *f, Kvp__Command *c)
{
    size_t n = c->put_start->n_avoid_segments;
    c->put_start->n_avoid_segments = 0;
    Kvp__Response *r = tf_apply(f, c);
    c->put_start->n_avoid_segments = n;
    return r;
}

static void place(Kvp__Command *c, Kvp__PutStartReq *q, Kvp__PutStartItem *it, const char *key, uint64_t op,
                  uint32_t *avoid, size_t n_avoid)
{
    it->key = (char *)key;
    it->size = 1000;
    it->replica_num = 1;
    it->op_id = op;
    q->avoid_segments = avoid;
    q->n_avoid_segments = n_avoid;
    c->now_wall_ms = 10 + op;
    c->term = 2;
    c->body_case = KVP__COMMAND__BODY_PUT_START;
    c->put_start = q;
}

/* Leader of level 2, followers of level 2 and 1: what is logged is applied alike by both only
 * when the leader gates it with the cluster's level (1). Without the gate they diverge. */
static void test_mixed_members_place_alike(void **state)
{
    (void)state;
    struct kvp_master_fsm *m2 = tf_new(1000, 5000), *m1 = tf_new(1000, 5000);
    uint32_t s1 = 0, s2 = 0;
    struct kvp_master_fsm *ms[2] = {m2, m1};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tf_mount(ms[i], "s1", "h1", 4 * MB, 1, &s1), KVP_OK); /* most free: first */
        assert_int_equal(tf_mount(ms[i], "s2", "h2", 2 * MB, 1, &s2), KVP_OK);
    }
    struct kvp_feature_peer peers[1] = {{1, 1000}}; /* the other member reported level 1 */
    uint32_t level = kvp_feature_cluster_level(KVP_FEATURE_LEVEL, peers, 1, 1500);
    assert_int_equal(level, 1);
    char key[32];
    for (uint64_t op = 1; op <= 8; op++) {
        Kvp__Command c = KVP__COMMAND__INIT;
        Kvp__PutStartReq q = KVP__PUT_START_REQ__INIT;
        Kvp__PutStartItem it = KVP__PUT_START_ITEM__INIT, *items[1] = {&it};
        uint32_t avoid[1] = {s1}; /* the client cannot reach s1 */
        q.items = items;
        q.n_items = 1;
        snprintf(key, sizeof key, "k%llu", (unsigned long long)op);
        place(&c, &q, &it, key, op, avoid, 1);
        kvp_feature_prepare_command(&c, level); /* what svc_submit does before logging */
        Kvp__Response *a = tf_apply(m2, &c), *b = apply_as_level1(m1, &c);
        assert_int_equal(a->put_start->results[0]->status, KVP_OK);
        assert_int_equal(b->put_start->results[0]->status, KVP_OK);
        assert_int_equal(a->put_start->results[0]->replicas[0]->segment_id,
                         b->put_start->results[0]->replicas[0]->segment_id);
        assert_int_equal(a->put_start->results[0]->replicas[0]->offset, b->put_start->results[0]->replicas[0]->offset);
        kvp_master_fsm_response_free(a);
        kvp_master_fsm_response_free(b);
    }
    size_t la = 0, lb = 0;
    uint8_t *sa = tf_snapshot(m2, &la), *sb = tf_snapshot(m1, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(sa, sb, la); /* equal states give equal bytes */
    free(sa);
    free(sb);
    kvp_master_fsm_destroy(&m2);
    kvp_master_fsm_destroy(&m1);
}

/* Once every member reports 2 the avoid list is logged, and every member of level 2 honours it. */
static void test_level2_keeps_avoid(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    uint32_t s1 = 0, s2 = 0;
    assert_int_equal(tf_mount(f, "s1", "h1", 4 * MB, 1, &s1), KVP_OK);
    assert_int_equal(tf_mount(f, "s2", "h2", 2 * MB, 1, &s2), KVP_OK);
    struct kvp_feature_peer peers[2] = {{2, 1000}, {2, 1400}};
    uint32_t level = kvp_feature_cluster_level(KVP_FEATURE_LEVEL, peers, 2, 1500);
    assert_int_equal(level, 2);
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutStartReq q = KVP__PUT_START_REQ__INIT;
    Kvp__PutStartItem it = KVP__PUT_START_ITEM__INIT, *items[1] = {&it};
    uint32_t avoid[1] = {s1};
    q.items = items;
    q.n_items = 1;
    place(&c, &q, &it, "k", 1, avoid, 1);
    kvp_feature_prepare_command(&c, level);
    assert_int_equal(c.feature_level, 2);
    Kvp__Response *r = tf_apply(f, &c);
    assert_int_equal(r->put_start->results[0]->replicas[0]->segment_id, s2);
    kvp_master_fsm_response_free(r);
    kvp_master_fsm_destroy(&f);
}

/* A v0.1.0 leader copies a new client's avoid list into its log (protobuf-c packs unknown
 * fields back) without a feature_level: members of level 2 must place like its v0.1.0 members. */
static void test_old_leader_passes_avoid_through(void **state)
{
    (void)state;
    struct kvp_master_fsm *m2 = tf_new(1000, 5000), *m1 = tf_new(1000, 5000);
    uint32_t s1 = 0, s2 = 0;
    struct kvp_master_fsm *ms[2] = {m2, m1};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tf_mount(ms[i], "s1", "h1", 4 * MB, 1, &s1), KVP_OK);
        assert_int_equal(tf_mount(ms[i], "s2", "h2", 2 * MB, 1, &s2), KVP_OK);
    }
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutStartReq q = KVP__PUT_START_REQ__INIT;
    Kvp__PutStartItem it = KVP__PUT_START_ITEM__INIT, *items[1] = {&it};
    uint32_t avoid[1] = {s1};
    q.items = items;
    q.n_items = 1;
    place(&c, &q, &it, "k", 1, avoid, 1); /* feature_level 0: not stamped */
    Kvp__Response *a = tf_apply(m2, &c), *b = apply_as_level1(m1, &c);
    assert_int_equal(b->put_start->results[0]->replicas[0]->segment_id, s1);
    assert_int_equal(a->put_start->results[0]->replicas[0]->segment_id, s1);
    kvp_master_fsm_response_free(a);
    kvp_master_fsm_response_free(b);
    kvp_master_fsm_destroy(&m2);
    kvp_master_fsm_destroy(&m1);
}

/* A command stamped with a level above this binary's is refused, not applied its own way. */
static void test_newer_command_refused(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    assert_int_equal(tf_mount(f, "s1", "h1", 4 * MB, 1, NULL), KVP_OK);
    size_t l0 = 0, l1 = 0;
    uint8_t *before = tf_snapshot(f, &l0);
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutStartReq q = KVP__PUT_START_REQ__INIT;
    Kvp__PutStartItem it = KVP__PUT_START_ITEM__INIT, *items[1] = {&it};
    q.items = items;
    q.n_items = 1;
    place(&c, &q, &it, "k", 1, NULL, 0);
    c.feature_level = KVP_FEATURE_LEVEL + 1;
    Kvp__Response *r = NULL;
    assert_int_equal(kvp_master_fsm_apply(f, &c, &r), KVP_ERR_VERSION);
    assert_null(r);
    uint8_t *after = tf_snapshot(f, &l1);
    assert_int_equal(l0, l1);
    assert_memory_equal(before, after, l0); /* nothing changed */
    free(before);
    free(after);
    c.feature_level = KVP_FEATURE_LEVEL; /* its own level and below apply */
    assert_int_equal(tf_apply_status(f, &c), KVP_OK);
    kvp_master_fsm_destroy(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cluster_level),
        cmocka_unit_test(test_effective_level),
        cmocka_unit_test(test_raise_level_cmd),
        cmocka_unit_test(test_gate_and_needs),
        cmocka_unit_test(test_mixed_members_place_alike),
        cmocka_unit_test(test_level2_keeps_avoid),
        cmocka_unit_test(test_old_leader_passes_avoid_through),
        cmocka_unit_test(test_newer_command_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
