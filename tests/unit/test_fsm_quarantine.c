/*
 * test_fsm_quarantine.c — the quarantine's release rule by committed feature level
 * (actors/master/fsm/fsm.c kvp_fsm_quarantine_push, version.h level 5, docs/master.md
 * "Quarantine release per entry (level 5)"):
 *   - below level 5 the FIFO's clamp: an entry held far ahead holds every later free on its
 *     segment (as test_fsm's test_fsm_quarantine_far_entry_holds_later_frees, none committed);
 *   - once RaiseLevelCmd{5} is applied, each entry is released at its own time;
 *   - one log with the crossing in its middle, applied from the start, from a snapshot taken
 *     before the crossing, and from one taken after it: the same status for every command and
 *     the same digest after each; a member kept at level 4 frees differently (why the level);
 *   - snapshots: format 3 once level 5 is committed (a level-4 master refuses it), restored
 *     with the same digest and the same rule;
 *   - the late-quarantine figure at both levels.
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

#define GRACE 500u

/* RaiseLevelCmd{level}, stamped as a leader stamps it. */
static int raise_level(struct kvp_master_fsm *f, uint32_t level, uint64_t now)
{
    Kvp__RaiseLevelCmd body = KVP__RAISE_LEVEL_CMD__INIT;
    Kvp__Command c = KVP__COMMAND__INIT;
    body.level = level;
    c.body_case = KVP__COMMAND__BODY_RAISE_LEVEL;
    c.raise_level = &body;
    c.now_wall_ms = now;
    kvp_feature_prepare_command(&c, level);
    return tf_apply_status(f, &c);
}

/* The far-entry scenario of test_fsm_quarantine_far_entry_holds_later_frees at a committed
 * level: a revoked put freed at its deadline (11000), then two frees at 1200 and 1300 on the
 * same full segment. Returns the number released at 1300 + grace. */
static uint64_t far_entry_scenario(uint32_t level)
{
    struct kvp_master_fsm *f = tf_new(GRACE, 5000);
    assert_int_equal(tf_mount(f, "s1", "h", 256, 1, NULL), KVP_OK); /* four 64-byte blocks */
    if (level)
        assert_int_equal(raise_level(f, level, 2), KVP_OK);
    assert_int_equal(kvp_master_fsm_feature_level(f), level);
    struct tf_put p = {.key = "a", .size = 64, .replica_num = 1, .op_id = 1};
    int st;
    kvp_master_fsm_response_free(tf_put_start_r(f, &p, 1000, 10000, &st)); /* deadline 11000 */
    assert_int_equal(st, KVP_OK);
    assert_int_equal(tf_put(f, "b", 64, 1, 2, 1000), KVP_OK);
    assert_int_equal(tf_put(f, "c", 64, 1, 3, 1000), KVP_OK);
    assert_int_equal(tf_put(f, "z", 64, 1, 7, 1000), KVP_OK); /* the pool is full */
    assert_int_equal(tf_revoke(f, "a", 1, 1100), KVP_OK);     /* freed at 11000 */
    assert_int_equal(tf_remove(f, "b", false, 1200), KVP_OK);
    assert_int_equal(tf_remove(f, "c", true, 1300), KVP_OK);
    bool own = level >= KVP_FEATURE_QUARANTINE_OWN_TIME;
    /* Late before b is due: all three either way; once b is due, a and c at level 5. */
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 1200 + GRACE - 1), 3 * 64);
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 1300 + GRACE - 1), own ? 2 * 64 : 3 * 64);
    /* Late just after c is due: only a at level 5; b and c too behind the clamp. */
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 1300 + GRACE), own ? 64 : 3 * 64);
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 11000 + GRACE - 1), own ? 64 : 3 * 64);
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 11000 + GRACE), 0);
    assert_int_equal(tf_release(f, 1200 + GRACE - 1), 0);
    uint64_t first = tf_release(f, 1300 + GRACE);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    /* d fits only where b's or c's block came back */
    assert_int_equal(tf_put_start(f, "d", 64, 1, 4, 1900), own ? KVP_OK : KVP_ERR_NO_SPACE);
    assert_int_equal(tf_release(f, 11000 + GRACE - 1), 0);
    assert_int_equal(tf_release(f, 11000 + GRACE), own ? 1 : 3); /* a, at its own time */
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 0), 0);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
    return first;
}

static void test_far_entry_by_level(void **state)
{
    (void)state;
    assert_int_equal(far_entry_scenario(0), 0); /* none committed: the FIFO */
    assert_int_equal(far_entry_scenario(4), 0); /* level 4 committed: still the FIFO */
    assert_int_equal(far_entry_scenario(5), 2); /* level 5: b and c at their own time */
}

/* Entries pushed out of time order at level 5 (a far one first, then older and equal times,
 * then one older than everything) are released each at its own time; the late figure walks
 * the suffix; kvp_master_fsm_check's time order holds after every step. */
static void test_own_time_order_and_late(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(GRACE, 60000);
    assert_int_equal(tf_mount(f, "s1", "h", 64 * 64, 1, NULL), KVP_OK);
    assert_int_equal(raise_level(f, 5, 1), KVP_OK);
    /* 40 objects; freed at times 9000, 1000, 1000, 5000, 1000, 700, 9000, 3000 ... (repeating) */
    static const uint64_t at[8] = {9000, 1000, 1000, 5000, 1000, 700, 9000, 3000};
    char key[16];
    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        assert_int_equal(tf_put(f, key, 64, 1, (uint64_t)i + 1, 600), KVP_OK);
    }
    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        assert_int_equal(tf_remove(f, key, false, at[i % 8]), KVP_OK);
        assert_int_equal(kvp_master_fsm_check(f), 0);
    }
    /* counts per time: 700 x5, 1000 x15, 3000 x5, 5000 x5, 9000 x10 */
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 700 + GRACE), 35 * 64);
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 1000 + GRACE), 20 * 64);
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 4999 + GRACE), 15 * 64);
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 9000 + GRACE), 0);
    assert_int_equal(tf_release(f, 699 + GRACE), 0);
    assert_int_equal(tf_release(f, 700 + GRACE), 5);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    /* more pushes into the middle after part was released (the array's head moved) */
    for (int i = 0; i < 8; i++) {
        snprintf(key, sizeof(key), "m%d", i);
        assert_int_equal(tf_put(f, key, 64, 1, 100 + (uint64_t)i, 2000), KVP_OK);
        assert_int_equal(tf_remove(f, key, false, i % 2 ? 2000 : 8000), KVP_OK);
        assert_int_equal(kvp_master_fsm_check(f), 0);
    }
    assert_int_equal(tf_release(f, 1000 + GRACE), 15);
    assert_int_equal(tf_release(f, 2000 + GRACE), 4);
    assert_int_equal(tf_release(f, 3000 + GRACE), 5);
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 5000 + GRACE), 14 * 64); /* 4 at 8000, 10 at 9000 */
    assert_int_equal(tf_release(f, 8000 + GRACE), 9);
    assert_int_equal(tf_release(f, 9000 + GRACE), 10);
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 0), 0);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

/* ------------------------------------------------------------------ one log, three members */

#define NKEYS 96
#define NFSM 4

struct replay {
    struct kvp_master_fsm *f[NFSM]; /* 0: from the start; 1, 2: restored later; 3: kept at 4 */
    bool live[NFSM];
    int state[NKEYS]; /* 0 absent, 1 pending, 2 complete (from member 0's answers) */
    uint64_t op[NKEYS], deadline[NKEYS];
    uint64_t rng, now;
};

static uint64_t rnd(struct replay *r)
{
    r->rng ^= r->rng << 13;
    r->rng ^= r->rng >> 7;
    r->rng ^= r->rng << 17;
    return r->rng;
}

/* Apply one operation to every live member; members 1 and 2 must answer member 0's status.
 * Member 3's answer goes to *st3. */
static int step(struct replay *r, int kind, int k, uint64_t now, int *st3)
{
    char key[16];
    snprintf(key, sizeof(key), "key%d", k);
    int st0 = 0;
    for (int m = 0; m < NFSM; m++) {
        if (!r->live[m])
            continue;
        struct kvp_master_fsm *f = r->f[m];
        int st = 0;
        switch (kind) {
        case 0: { /* put start, a short or a long ttl */
            struct tf_put p = {.key = key, .size = 64 + (r->op[k] % 7) * 300, .replica_num = 1 + (unsigned)(k % 2),
                               .op_id = r->op[k]};
            kvp_master_fsm_response_free(tf_put_start_r(f, &p, now, k % 3 ? 2000 : 9000, &st));
            break;
        }
        case 1: st = tf_put_end(f, key, r->op[k], r->op[k] * 7, now); break;
        case 2: st = tf_revoke(f, key, r->op[k], now); break;
        case 3: st = tf_remove(f, key, k % 2, now); break;
        case 4: st = (int)tf_release(f, now); break;
        case 5: st = (int)tf_revoke_expired(f, now); break;
        }
        if (m == 0)
            st0 = st;
        else if (m == 3)
            *st3 = st;
        else
            assert_int_equal(st, st0);
    }
    return st0;
}

static void digests_equal(struct replay *r)
{
    uint64_t d0 = kvp_master_fsm_digest(r->f[0]);
    for (int m = 1; m < 3; m++)
        if (r->live[m])
            assert_true(kvp_master_fsm_digest(r->f[m]) == d0);
    for (int m = 0; m < NFSM; m++)
        if (r->live[m])
            assert_int_equal(kvp_master_fsm_check(r->f[m]), 0);
}

static struct kvp_master_fsm *restored_from(struct kvp_master_fsm *src)
{
    size_t n = 0;
    uint8_t *b = tf_snapshot(src, &n);
    struct kvp_master_fsm *g = tf_new(GRACE, 5000);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_OK);
    free(b);
    assert_true(kvp_master_fsm_digest(g) == kvp_master_fsm_digest(src));
    return g;
}

static void test_replay_across_level5(void **state)
{
    (void)state;
    struct replay r = {.rng = 0x9E3779B97F4A7C15ull, .now = 10000};
    r.f[0] = tf_new(GRACE, 5000);
    r.f[3] = tf_new(GRACE, 5000);
    r.live[0] = r.live[3] = true;
    for (int m = 0; m < NFSM; m++)
        if (r.live[m]) {
            assert_int_equal(tf_mount(r.f[m], "s1", "h1", 64 * 1024, 1, NULL), KVP_OK);
            assert_int_equal(tf_mount(r.f[m], "s2", "h2", 64 * 1024, 1, NULL), KVP_OK);
        }
    const int steps = 6000, raise4 = 500, snap1 = 1500, raise5 = 2500, snap2 = 3500;
    bool diverged = false;
    uint64_t released_own = 0;
    for (int i = 0; i < steps; i++) {
        r.now += rnd(&r) % 40;
        if (i == raise4)
            for (int m = 0; m < NFSM; m++)
                if (r.live[m])
                    assert_int_equal(raise_level(r.f[m], 4, r.now), KVP_OK);
        if (i == raise5) /* member 3 stays at level 4: what an old member would do */
            for (int m = 0; m < 3; m++)
                if (r.live[m])
                    assert_int_equal(raise_level(r.f[m], 5, r.now), KVP_OK);
        if (i == snap1) {
            r.f[1] = restored_from(r.f[0]);
            r.live[1] = true;
        }
        if (i == snap2) {
            r.f[2] = restored_from(r.f[0]);
            r.live[2] = true;
            assert_int_equal(kvp_master_fsm_feature_level(r.f[2]), 5);
        }
        int k = (int)(rnd(&r) % NKEYS), dice = (int)(rnd(&r) % 100), st = 0, st3 = 0;
        if (dice < 8) {
            st = step(&r, 4, k, r.now, &st3);
            if (i >= raise5)
                released_own += (uint64_t)st;
        } else if (dice < 11) {
            st = step(&r, 5, k, r.now, &st3);
            for (int j = 0; j < NKEYS; j++) /* pending puts past their deadline went */
                if (r.state[j] == 1 && r.deadline[j] < r.now)
                    r.state[j] = 0;
        } else if (r.state[k] == 0) {
            r.op[k] = (uint64_t)i + 1;
            if ((st = step(&r, 0, k, r.now, &st3)) == KVP_OK) {
                r.state[k] = 1;
                r.deadline[k] = r.now + (k % 3 ? 2000 : 9000);
            }
        } else if (r.state[k] == 1) {
            if (dice < 70) {
                if ((st = step(&r, 1, k, r.now, &st3)) == KVP_OK)
                    r.state[k] = 2;
            } else if (dice < 78) {
                if ((st = step(&r, 2, k, r.now, &st3)) == KVP_OK)
                    r.state[k] = 0;
            }
            /* else left pending: RevokeExpired takes it at its deadline */
        } else {
            /* a remove now, or with a lease horizon far ahead (the leader sets now_wall_ms to
             * horizon - fence_grace_ms for it: docs/master.md "Leases and failover") */
            uint64_t at = dice < 40 ? r.now + 2000 + rnd(&r) % 6000 : r.now;
            if ((st = step(&r, 3, k, at, &st3)) == KVP_OK)
                r.state[k] = 0;
        }
        digests_equal(&r);
        if (r.live[3] && i < raise5) /* the same log and level: the same state */
            assert_true(kvp_master_fsm_digest(r.f[3]) == kvp_master_fsm_digest(r.f[0]));
        if (r.live[3] && st3 != st) {
            assert_true(i >= raise5);
            fprintf(stderr, "member kept at level 4 answers differently from step %d (level 5 from %d): "
                    "%d, not %d\n", i, raise5, st3, st);
            diverged = true;
            r.live[3] = false; /* its state differs from here on */
        }
    }
    /* The level changed what members apply: a member left at level 4 differs. */
    assert_true(diverged);
    struct kvp_master_fsm_stats st;
    kvp_master_fsm_stats(r.f[0], &st);
    fprintf(stderr, "released after the raise: %llu; at the end %llu objects, %llu bytes used, %llu quarantined\n",
            (unsigned long long)released_own, (unsigned long long)st.objects, (unsigned long long)st.used_bytes,
            (unsigned long long)st.quarantined_bytes);
    assert_true(released_own > 0);
    for (int m = 0; m < NFSM; m++)
        kvp_master_fsm_destroy(&r.f[m]);
}

/* ------------------------------------------------------------------ snapshots */

static bool snap_format(const uint8_t *b, size_t n, uint64_t want)
{
    return n >= 2 && b[0] == 0x08 && b[1] == want; /* field 1 (format), varint, first */
}

/* Level 5 committed: snapshots are format 3 (a master of level <= 4 accepts 1 and 2 only, so it
 * refuses: test_fsm_snap checks format 3 is refused without level 5, and an unknown format with
 * KVP_ERR_VERSION); a restore keeps level 5 and its rule, with the same digest. */
static void test_snapshot_format3_round_trip(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(GRACE, 60000);
    assert_int_equal(tf_mount(f, "s1", "h", 64 * 16, 1, NULL), KVP_OK);
    size_t n = 0;
    uint8_t *b = tf_snapshot(f, &n);
    assert_true(snap_format(b, n, 1));
    free(b);
    assert_int_equal(raise_level(f, 4, 1), KVP_OK);
    b = tf_snapshot(f, &n);
    assert_true(snap_format(b, n, 1)); /* level 4: as before */
    free(b);
    assert_int_equal(raise_level(f, 5, 1), KVP_OK);
    char key[16];
    for (int i = 0; i < 6; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        assert_int_equal(tf_put(f, key, 64, 1, (uint64_t)i + 1, 100), KVP_OK);
    }
    assert_int_equal(tf_remove(f, "k0", false, 9000), KVP_OK); /* far */
    assert_int_equal(tf_remove(f, "k1", false, 1000), KVP_OK);
    assert_int_equal(tf_remove(f, "k2", true, 1000), KVP_OK);
    b = tf_snapshot(f, &n);
    assert_true(snap_format(b, n, 3));
    struct kvp_master_fsm *g = tf_new(GRACE, 60000);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_OK);
    free(b);
    assert_int_equal(kvp_master_fsm_feature_level(g), 5);
    assert_true(kvp_master_fsm_digest(g) == kvp_master_fsm_digest(f));
    /* after the restore, one more older entry and a release on both: still alike */
    struct kvp_master_fsm *m[2] = {f, g};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tf_remove(m[i], "k3", false, 1200), KVP_OK);
        assert_int_equal(kvp_master_fsm_quarantine_late(m[i], 1200 + GRACE), 64);
        assert_int_equal(tf_release(m[i], 1200 + GRACE), 3); /* k1, k2, k3: not held by k0 */
        assert_int_equal(kvp_master_fsm_check(m[i]), 0);
    }
    assert_true(kvp_master_fsm_digest(g) == kvp_master_fsm_digest(f));
    kvp_master_fsm_destroy(&g);
    kvp_master_fsm_destroy(&f);
}

/* The incremental snapshot (raftlog's path) writes the same format and restores alike. */
static void test_incremental_snapshot_level5(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(GRACE, 60000);
    assert_int_equal(tf_mount(f, "s1", "h", 64 * 16, 1, NULL), KVP_OK);
    assert_int_equal(raise_level(f, 5, 1), KVP_OK);
    assert_int_equal(tf_put(f, "a", 64, 1, 1, 100), KVP_OK);
    assert_int_equal(tf_put(f, "b", 64, 1, 2, 100), KVP_OK);
    assert_int_equal(tf_remove(f, "a", false, 9000), KVP_OK);
    assert_int_equal(tf_remove(f, "b", false, 1000), KVP_OK);
    assert_int_equal(kvp_master_fsm_snap_begin(f), KVP_OK);
    uint8_t *all = NULL;
    size_t len = 0;
    bool last = false;
    while (!last) {
        uint8_t *chunk = NULL;
        size_t cl = 0;
        assert_int_equal(kvp_master_fsm_snap_next(f, 4096, &chunk, &cl, &last), KVP_OK);
        all = realloc(all, len + cl + 1);
        assert_non_null(all);
        if (cl)
            memcpy(all + len, chunk, cl);
        len += cl;
        free(chunk);
    }
    assert_true(snap_format(all, len, 3));
    struct kvp_master_fsm *g = tf_new(GRACE, 60000);
    assert_int_equal(kvp_master_fsm_restore(g, all, len), KVP_OK);
    free(all);
    assert_true(kvp_master_fsm_digest(g) == kvp_master_fsm_digest(f));
    assert_int_equal(tf_release(g, 1000 + GRACE), 1);
    kvp_master_fsm_destroy(&g);
    kvp_master_fsm_destroy(&f);
}

/* ------------------------------------------------------------------ mixed versions */

/* A cluster with a member of level 4: the leader's level is 4, it never raises to 5, and every
 * member keeps the FIFO. RaiseLevelCmd{5} is stamped 5, so a level-4 member (whose
 * KVP_FEATURE_LEVEL is 4) refuses it rather than record a level it does not follow; this
 * binary refuses the next level's raise the same way. */
static void test_mixed_level4_member(void **state)
{
    (void)state;
    uint64_t now = 100000;
    struct kvp_feature_peer p[2] = {{5, now - 10}, {4, now - 10}};
    uint32_t computed = kvp_feature_cluster_level(KVP_FEATURE_LEVEL, p, 2, now);
    assert_int_equal(computed, 4);
    assert_true(kvp_feature_should_raise(computed, 0));
    assert_false(kvp_feature_should_raise(computed, 4)); /* committed 4: no raise to 5 */
    assert_int_equal(kvp_feature_effective_level(KVP_FEATURE_LEVEL, p, 2, now, 4), 4);
    p[1].level = 5; /* the last member upgraded */
    computed = kvp_feature_cluster_level(KVP_FEATURE_LEVEL, p, 2, now);
    assert_int_equal(computed, 5);
    assert_true(kvp_feature_should_raise(computed, 4));
    /* the stamps */
    Kvp__RaiseLevelCmd body = KVP__RAISE_LEVEL_CMD__INIT;
    Kvp__Command c = KVP__COMMAND__INIT;
    c.body_case = KVP__COMMAND__BODY_RAISE_LEVEL;
    c.raise_level = &body;
    body.level = 4;
    kvp_feature_prepare_command(&c, 5);
    assert_int_equal(c.feature_level, KVP_FEATURE_COMMITTED);
    body.level = 5;
    kvp_feature_prepare_command(&c, 5);
    assert_int_equal(c.feature_level, KVP_FEATURE_QUARANTINE_OWN_TIME);
    assert_true(c.feature_level > 4); /* what a level-4 member's apply refuses */
    body.level = KVP_FEATURE_LEVEL + 1;
    kvp_feature_prepare_command(&c, KVP_FEATURE_LEVEL + 1);
    struct kvp_master_fsm *f = tf_new(GRACE, 5000);
    assert_int_equal(raise_level(f, 4, 1), KVP_OK);
    Kvp__Response *r = NULL;
    assert_int_equal(kvp_master_fsm_apply(f, &c, &r), KVP_ERR_VERSION);
    kvp_master_fsm_response_free(r);
    assert_int_equal(kvp_master_fsm_feature_level(f), 4); /* not recorded */
    kvp_master_fsm_destroy(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_far_entry_by_level),
        cmocka_unit_test(test_own_time_order_and_late),
        cmocka_unit_test(test_replay_across_level5),
        cmocka_unit_test(test_snapshot_format3_round_trip),
        cmocka_unit_test(test_incremental_snapshot_level5),
        cmocka_unit_test(test_mixed_level4_member),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
