/* test_fsm_intent.c — the put's intent committed while its bytes move (feature level 6,
 * docs/master.md "Intent overlapped with the transfer (level 6)"; fsm_reserve.c): an intent is
 * pending and invisible, sealed only with its op_id and checksum, revoked only explicitly (never
 * by RevokeExpired), kept by snapshots of format 4 (whole and incremental) with equal digests,
 * and refused by a member of level 5 (the commands are stamped 6). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "actors/master/fsm/version.h"
#include "runtime/log.h"
#include "test_fsm_helpers.h"

#define T0 1000000ull /* wall ms of the first command */
#define GRACE 500ull
#define SEG (64u * 1024u)
#define TERM 7u
#define CSUM(op) (0x5eed0000ull ^ (op))

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

static uint64_t reserve(struct kvp_master_fsm *f, uint32_t seg, uint64_t len, uint64_t horizon, uint64_t now)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__ReserveCmd q = KVP__RESERVE_CMD__INIT;
    q.segment_id = seg;
    q.length = len;
    q.horizon_ms = horizon;
    c.now_wall_ms = now;
    c.term = TERM;
    c.body_case = KVP__COMMAND__BODY_RESERVE;
    c.reserve = &q;
    kvp_feature_prepare_command(&c, KVP_FEATURE_LEVEL);
    Kvp__Response *r = tf_apply(f, &c);
    assert_int_equal(r->reserve->status, KVP_OK);
    uint64_t off = r->reserve->offset;
    kvp_master_fsm_response_free(r);
    return off;
}

#define place tf_place

/* One PutCommitCmd item of term TERM, an intent when `intent`; the command stamped as a leader of
 * this binary stamps it (kvp_feature_prepare_command), or left at `stamp` when stamp != 0. */
static int commit_x(struct kvp_master_fsm *f, const char *key, uint64_t op, uint64_t size, uint64_t deadline,
                    uint64_t now, const struct place *pl, size_t n, bool intent, uint32_t stamp)
{
    return tf_put_commit(f, key, op, size, CSUM(op), TERM, TERM, deadline, now, pl, n, (uint32_t)n, intent, stamp);
}

static int intent(struct kvp_master_fsm *f, const char *key, uint64_t op, uint64_t size, uint64_t deadline,
                  uint64_t now, const struct place *pl, size_t n)
{
    return commit_x(f, key, op, size, deadline, now, pl, n, true, 0);
}

/* PutSealCmd of one item; the apply's return when not KVP_OK, else the item's status. */
static int seal_x(struct kvp_master_fsm *f, const char *key, uint64_t op, uint64_t csum, uint64_t now, uint32_t stamp)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutSealCmd q = KVP__PUT_SEAL_CMD__INIT;
    Kvp__PutSealItem it = KVP__PUT_SEAL_ITEM__INIT, *items[1] = {&it};
    it.key = (char *)key;
    it.op_id = op;
    it.checksum = csum;
    q.n_items = 1;
    q.items = items;
    c.now_wall_ms = now;
    c.term = TERM;
    c.body_case = KVP__COMMAND__BODY_PUT_SEAL;
    c.put_seal = &q;
    kvp_feature_prepare_command(&c, KVP_FEATURE_LEVEL);
    if (stamp)
        c.feature_level = stamp;
    Kvp__Response *r = NULL;
    int rc = kvp_master_fsm_apply(f, &c, &r);
    if (rc != KVP_OK) {
        kvp_master_fsm_response_free(r);
        return rc;
    }
    int st = r->put_end->status[0];
    kvp_master_fsm_response_free(r);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    return st;
}

static int seal(struct kvp_master_fsm *f, const char *key, uint64_t op, uint64_t now)
{
    return seal_x(f, key, op, CSUM(op), now, 0);
}

static int get_status(struct kvp_master_fsm *f, const char *key, uint64_t *csum)
{
    Kvp__Response *r = tf_get_replicas(f, key, NULL);
    int st = r->get_replicas->objects[0]->status;
    if (csum)
        *csum = r->get_replicas->objects[0]->checksum;
    kvp_master_fsm_response_free(r);
    return st;
}

static bool count_cb(const struct kvp_fsm_intent *it, void *arg)
{
    (*(int *)arg)++;
    return it->op_id != 99; /* stop at op 99 */
}

/* Two segments, level 6 committed, one reservation of TERM on each. */
static struct kvp_master_fsm *setup(uint32_t *s1, uint32_t *s2, uint64_t *o1, uint64_t *o2, uint64_t horizon)
{
    struct kvp_master_fsm *f = tf_new(GRACE, 10000);
    assert_int_equal(tf_mount(f, "s1", "h1", SEG, T0, s1), KVP_OK);
    assert_int_equal(tf_mount(f, "s2", "h2", SEG, T0, s2), KVP_OK);
    assert_int_equal(raise_level(f, KVP_FEATURE_INTENT, T0), KVP_OK);
    *o1 = reserve(f, *s1, 16384, horizon, T0);
    *o2 = reserve(f, *s2, 16384, horizon, T0);
    return f;
}

static void test_intent_pending_then_sealed(void **state)
{
    (void)state;
    uint32_t s1, s2;
    uint64_t o1, o2, H = T0 + 3000, D = T0 + 2000;
    struct kvp_master_fsm *f = setup(&s1, &s2, &o1, &o2, H);
    struct place two[2] = {{s1, o1}, {s2, o2}};
    assert_int_equal(intent(f, "a", 11, 4000, D, T0 + 1, two, 2), KVP_OK);
    assert_int_equal(intent(f, "a", 11, 4000, D, T0 + 1, two, 2), KVP_OK); /* retried */
    /* pending: invisible to every read, Remove and Evict answer BUSY */
    assert_int_equal(get_status(f, "a", NULL), KVP_ERR_NOT_FOUND);
    assert_int_equal(tf_exists(f, "a"), 0);
    assert_int_equal(tf_remove(f, "a", false, T0 + 2), KVP_ERR_BUSY);
    assert_int_equal(tf_remove(f, "a", true, T0 + 2), KVP_ERR_BUSY);
    struct kvp_master_fsm_stats st;
    kvp_master_fsm_stats(f, &st);
    assert_int_equal(st.objects, 0);
    assert_int_equal(st.pending_puts, 1);
    /* its ranges are used: the same range cannot be committed again */
    assert_int_equal(commit_x(f, "b", 12, 64, D, T0 + 2, (struct place[]){{s1, o1}}, 1, false, 0), KVP_ERR_INVALID);
    /* the interface the takeover resolver reads */
    struct kvp_fsm_intent it;
    assert_true(kvp_fsm_intent_get(f, "a", &it));
    assert_string_equal(it.key, "a");
    assert_true(it.op_id == 11 && it.size == 4000 && it.checksum == CSUM(11) && it.term == TERM &&
                it.deadline_ms == D && it.nreplicas == 2 && it.replica_num == 2);
    assert_true(it.replicas[0].segment_id == s1 && it.replicas[0].offset == o1);
    assert_true(it.replicas[1].segment_id == s2 && it.replicas[1].offset == o2);
    assert_false(kvp_fsm_intent_get(f, "b", &it));
    assert_int_equal(kvp_fsm_intent_count(f), 1);
    /* RevokeExpired, far past its deadline and the reservation's horizon, leaves it */
    assert_int_equal(tf_revoke_expired(f, H + 10000), 0);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    assert_true(kvp_fsm_intent_get(f, "a", &it));
    /* a seal of another op or checksum is refused and changes nothing */
    assert_int_equal(seal(f, "a", 12, H + 10001), KVP_ERR_EXISTS);
    assert_int_equal(seal_x(f, "a", 11, CSUM(11) ^ 1, H + 10001, 0), KVP_ERR_EXISTS);
    assert_int_equal(seal(f, "nope", 11, H + 10001), KVP_ERR_NOT_FOUND);
    assert_int_equal(get_status(f, "a", NULL), KVP_ERR_NOT_FOUND);
    /* the seal: complete, with the intent's checksum */
    assert_int_equal(seal(f, "a", 11, H + 10002), KVP_OK);
    uint64_t cs = 0;
    assert_int_equal(get_status(f, "a", &cs), KVP_OK);
    assert_true(cs == CSUM(11));
    assert_int_equal(tf_exists(f, "a"), 1);
    assert_int_equal(seal(f, "a", 11, H + 10003), KVP_OK); /* logged twice */
    assert_int_equal(kvp_fsm_intent_count(f), 0);
    kvp_master_fsm_stats(f, &st);
    assert_int_equal(st.objects, 1);
    assert_int_equal(st.pending_puts, 0);
    /* each intent listed once; the walk stops when told (a new reservation: the retire above
     * ended the first ones) */
    uint64_t N = H + 10004, H2 = N + 3000;
    o1 = reserve(f, s1, 16384, H2, N);
    assert_int_equal(intent(f, "c", 99, 64, H2 - 1, N, (struct place[]){{s1, o1}}, 1), KVP_OK);
    assert_int_equal(intent(f, "d", 98, 64, H2 - 1, N, (struct place[]){{s1, o1 + 64}}, 1), KVP_OK);
    int seen = 0;
    kvp_fsm_intent_each(f, count_cb, &seen);
    assert_int_equal(seen, 1); /* "c" is first in the list */
    /* a PutEnd of the old path seals an intent too, with its checksum only */
    assert_int_equal(tf_put_end(f, "d", 98, CSUM(98) ^ 1, N), KVP_ERR_EXISTS);
    assert_int_equal(tf_put_end(f, "d", 98, CSUM(98), N), KVP_OK);
    assert_int_equal(get_status(f, "d", NULL), KVP_OK);
    /* and a PutCommit (not an intent) of the same op and checksum seals it as well */
    assert_int_equal(commit_x(f, "c", 99, 64, H2 - 1, N, (struct place[]){{s1, o1}}, 1, false, 0), KVP_OK);
    assert_int_equal(get_status(f, "c", NULL), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

static void test_intent_revoke_quarantines_to_deadline(void **state)
{
    (void)state;
    uint32_t s1, s2;
    uint64_t o1, o2, H = T0 + 3000, D = T0 + 2000;
    struct kvp_master_fsm *f = setup(&s1, &s2, &o1, &o2, H);
    assert_int_equal(intent(f, "a", 5, 1024, D, T0 + 1, (struct place[]){{s1, o1}}, 1), KVP_OK);
    struct kvp_master_fsm_stats st0, st;
    kvp_master_fsm_stats(f, &st0);
    assert_int_equal(tf_revoke(f, "a", 6, T0 + 10), KVP_ERR_NOT_FOUND); /* another op */
    assert_int_equal(tf_revoke(f, "a", 5, T0 + 10), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    assert_int_equal(kvp_fsm_intent_count(f), 0);
    assert_int_equal(get_status(f, "a", NULL), KVP_ERR_NOT_FOUND);
    kvp_master_fsm_stats(f, &st);
    assert_int_equal(st.quarantined_bytes, st0.quarantined_bytes + 1024);
    assert_int_equal(st.pending_puts, 0);
    /* freed at its deadline, not at the revoke: its writer may write until then */
    assert_int_equal(kvp_master_fsm_quarantine_late(f, D + GRACE - 1), 1024);
    assert_int_equal(kvp_master_fsm_quarantine_late(f, D + GRACE), 0);
    assert_int_equal(tf_release(f, D + GRACE - 1), 0);
    assert_int_equal(tf_release(f, D + GRACE), 1);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    /* the revoked range stays in the reservation's used ranges: not committed twice */
    assert_int_equal(commit_x(f, "b", 7, 64, D, T0 + 20, (struct place[]){{s1, o1}}, 1, false, 0), KVP_ERR_INVALID);
    /* a seal after the revoke finds nothing */
    assert_int_equal(seal(f, "a", 5, T0 + 30), KVP_ERR_NOT_FOUND);
    kvp_master_fsm_destroy(&f);
}

/* A segment lost before the seal drops that copy only; the seal completes the rest. */
static void test_intent_segment_lost_keeps_other_copy(void **state)
{
    (void)state;
    uint32_t s1, s2;
    uint64_t o1, o2, H = T0 + 3000, D = T0 + 2000;
    struct kvp_master_fsm *f = setup(&s1, &s2, &o1, &o2, H);
    assert_int_equal(intent(f, "a", 3, 200, D, T0 + 1, (struct place[]){{s1, o1}, {s2, o2}}, 2), KVP_OK);
    assert_int_equal(tf_seg_lost(f, s1, T0 + 2), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    struct kvp_fsm_intent it;
    assert_true(kvp_fsm_intent_get(f, "a", &it));
    assert_int_equal(it.nreplicas, 1);
    uint64_t epoch = kvp_master_fsm_repair_epoch(f);
    assert_int_equal(seal(f, "a", 3, T0 + 3), KVP_OK);
    assert_true(kvp_master_fsm_repair_epoch(f) != epoch); /* short of copies: repair work */
    assert_int_equal(get_status(f, "a", NULL), KVP_OK);
    kvp_master_fsm_destroy(&f);
}

static bool snap_format(const uint8_t *b, size_t n, uint64_t want)
{
    return n >= 2 && b[0] == 0x08 && b[1] == want;
}

/* Level 6 committed: format 4, with intents; restored, the same bytes, digest and behaviour. */
static void test_intent_snapshot_round_trip(void **state)
{
    (void)state;
    uint32_t s1, s2;
    uint64_t o1, o2, H = T0 + 3000, D = T0 + 2000;
    struct kvp_master_fsm *f = setup(&s1, &s2, &o1, &o2, H);
    assert_int_equal(intent(f, "i1", 1, 100, D, T0 + 1, (struct place[]){{s1, o1}, {s2, o2}}, 2), KVP_OK);
    assert_int_equal(intent(f, "i2", 2, 64, D, T0 + 1, (struct place[]){{s1, o1 + 128}}, 1), KVP_OK);
    assert_int_equal(commit_x(f, "c1", 3, 64, D, T0 + 1, (struct place[]){{s2, o2 + 128}}, 1, false, 0), KVP_OK);
    size_t n;
    uint8_t *b = tf_snapshot(f, &n);
    assert_true(snap_format(b, n, 4));
    struct kvp_master_fsm *g = tf_new(GRACE, 10000);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(g), 0);
    size_t n2;
    uint8_t *b2 = tf_snapshot(g, &n2);
    assert_int_equal(n, n2);
    assert_memory_equal(b, b2, n);
    free(b2);
    free(b);
    assert_true(kvp_master_fsm_digest(g) == kvp_master_fsm_digest(f));
    struct kvp_fsm_intent a, c;
    assert_true(kvp_fsm_intent_get(g, "i1", &a));
    assert_true(kvp_fsm_intent_get(f, "i1", &c));
    assert_true(a.checksum == CSUM(1) && a.deadline_ms == D && a.nreplicas == 2 && a.op_id == 1);
    assert_true(a.checksum == c.checksum && a.deadline_ms == c.deadline_ms && a.size == c.size);
    assert_int_equal(get_status(g, "i1", NULL), KVP_ERR_NOT_FOUND);
    assert_int_equal(get_status(g, "c1", NULL), KVP_OK);
    /* both go on alike: a seal, a revoke, RevokeExpired and a release */
    struct kvp_master_fsm *m[2] = {f, g};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tf_revoke_expired(m[i], D + 1), 0);
        assert_int_equal(seal(m[i], "i1", 1, D + 2), KVP_OK);
        assert_int_equal(tf_revoke(m[i], "i2", 2, D + 3), KVP_OK);
        tf_revoke_expired(m[i], H);
        tf_release(m[i], H + GRACE);
        assert_int_equal(kvp_master_fsm_check(m[i]), 0);
    }
    assert_true(kvp_master_fsm_digest(g) == kvp_master_fsm_digest(f));
    assert_int_equal(get_status(g, "i1", NULL), KVP_OK);
    /* an intent differs from a pending put in the digest (state and checksum are in it) */
    kvp_master_fsm_destroy(&g);
    kvp_master_fsm_destroy(&f);
}

/* The incremental snapshot writes intents as they were at its begin, whatever is sealed, revoked
 * or added between its chunks: restored, it equals the whole snapshot taken at begin. */
static void test_intent_incremental_snapshot(void **state)
{
    (void)state;
    uint32_t s1, s2;
    uint64_t o1, o2, H = T0 + 3000, D = T0 + 2000;
    struct kvp_master_fsm *f = setup(&s1, &s2, &o1, &o2, H);
    char key[32];
    for (int i = 0; i < 64; i++) {
        snprintf(key, sizeof key, "i/%03d", i);
        assert_int_equal(intent(f, key, 1 + (uint64_t)i, 64, D, T0 + 1,
                                (struct place[]){{s1, o1 + (uint64_t)i * KVP_FSM_ALIGN}}, 1),
                         KVP_OK);
    }
    size_t wn;
    uint8_t *whole = tf_snapshot(f, &wn);
    assert_true(snap_format(whole, wn, 4));
    assert_int_equal(kvp_master_fsm_snap_begin(f), KVP_OK);
    uint8_t *all = NULL;
    size_t len = 0;
    bool last = false;
    int sealed = 0, revoked = 0, added = 0;
    while (!last) {
        uint8_t *c = NULL;
        size_t l = 0;
        assert_int_equal(kvp_master_fsm_snap_next(f, 256, &c, &l, &last), KVP_OK);
        all = realloc(all, len + l);
        assert_non_null(all);
        memcpy(all + len, c, l);
        len += l;
        free(c);
        for (int k = 0; k < 2 && sealed < 32; k++, sealed++) {
            snprintf(key, sizeof key, "i/%03d", sealed * 2);
            assert_int_equal(seal(f, key, 1 + (uint64_t)sealed * 2, T0 + 2), KVP_OK);
        }
        for (int k = 0; k < 2 && revoked < 32; k++, revoked++) {
            snprintf(key, sizeof key, "i/%03d", revoked * 2 + 1);
            assert_int_equal(tf_revoke(f, key, 2 + (uint64_t)revoked * 2, T0 + 2), KVP_OK);
        }
        for (int k = 0; k < 2 && added < 64; k++, added++) {
            snprintf(key, sizeof key, "n/%03d", added);
            assert_int_equal(intent(f, key, 1000 + (uint64_t)added, 64, D, T0 + 2,
                                    (struct place[]){{s2, o2 + (uint64_t)added * KVP_FSM_ALIGN}}, 1),
                             KVP_OK);
        }
    }
    assert_true(sealed > 4 && revoked > 4 && added > 4);
    struct kvp_master_fsm *g = tf_new(GRACE, 10000);
    assert_int_equal(kvp_master_fsm_restore(g, all, len), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(g), 0);
    size_t gn;
    uint8_t *gb = tf_snapshot(g, &gn);
    assert_int_equal(gn, wn);
    assert_memory_equal(gb, whole, wn);
    free(gb);
    free(all);
    free(whole);
    kvp_master_fsm_destroy(&g);
    kvp_master_fsm_destroy(&f);
}

/* One log applied from the start and from snapshots taken along it: equal digests after every
 * command (seals, revokes, intents past deadline, RevokeExpired, releases, removes). */
static void test_intent_replay_digests(void **state)
{
    (void)state;
    uint32_t s1, s2;
    uint64_t o1, o2, H = T0 + 100000;
    struct kvp_master_fsm *f = setup(&s1, &s2, &o1, &o2, H);
    struct kvp_master_fsm *g = NULL;
    uint64_t seed = 12345;
    char key[32];
    uint64_t now = T0 + 1;
    for (int step = 0; step < 600; step++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int k = (int)((seed >> 33) % 200);
        int what = (int)((seed >> 20) % 6);
        snprintf(key, sizeof key, "k%03d", k);
        now += 3;
        struct kvp_master_fsm *m[2] = {f, g};
        for (int i = 0; i < 2; i++) {
            if (!m[i])
                continue;
            switch (what) {
            case 0:
            case 1: /* an intent in slot k of either reservation */
                intent(m[i], key, (uint64_t)k + 1, 64, now + 500, now,
                       (struct place[]){{k & 1 ? s1 : s2, (k & 1 ? o1 : o2) + (uint64_t)(k / 2) * KVP_FSM_ALIGN}}, 1);
                break;
            case 2:
                seal(m[i], key, (uint64_t)k + 1, now);
                break;
            case 3:
                tf_revoke(m[i], key, (uint64_t)k + 1, now);
                break;
            case 4:
                tf_revoke_expired(m[i], now);
                tf_release(m[i], now);
                break;
            default:
                tf_remove(m[i], key, false, now);
                break;
            }
            assert_int_equal(kvp_master_fsm_check(m[i]), 0);
        }
        if (g)
            assert_true(kvp_master_fsm_digest(f) == kvp_master_fsm_digest(g));
        if (step % 150 == 75) { /* a member restored from a snapshot here */
            kvp_master_fsm_destroy(&g);
            size_t n;
            uint8_t *b = tf_snapshot(f, &n);
            g = tf_new(GRACE, 10000);
            assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_OK);
            free(b);
            assert_true(kvp_master_fsm_digest(f) == kvp_master_fsm_digest(g));
        }
    }
    assert_true(kvp_fsm_intent_count(f) > 0); /* some left pending: RevokeExpired never drops them */
    kvp_master_fsm_destroy(&g);
    kvp_master_fsm_destroy(&f);
}

/* Mixed versions: the commands are stamped 6, which a member of level 5 refuses (this binary
 * refuses anything above its own level the same way); an intent item in a command not stamped 6
 * is what a level-5 member applies (the field unknown to it): a complete object. Below level 6
 * committed the image stays format 3; an intent in an image without level 6 is malformed. */
static void test_intent_feature_level(void **state)
{
    (void)state;
    assert_true(KVP_FEATURE_LEVEL >= KVP_FEATURE_INTENT);
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutSealCmd sc = KVP__PUT_SEAL_CMD__INIT;
    c.body_case = KVP__COMMAND__BODY_PUT_SEAL;
    c.put_seal = &sc;
    kvp_feature_prepare_command(&c, KVP_FEATURE_LEVEL);
    assert_int_equal(c.feature_level, KVP_FEATURE_INTENT);
    Kvp__PutCommitCmd pc = KVP__PUT_COMMIT_CMD__INIT;
    Kvp__PutCommitItem it = KVP__PUT_COMMIT_ITEM__INIT, *itp[1] = {&it};
    pc.n_items = 1;
    pc.items = itp;
    c.body_case = KVP__COMMAND__BODY_PUT_COMMIT;
    c.put_commit = &pc;
    kvp_feature_prepare_command(&c, KVP_FEATURE_LEVEL);
    assert_int_equal(c.feature_level, KVP_FEATURE_RESERVE); /* no intent: as before */
    it.intent = true;
    kvp_feature_prepare_command(&c, KVP_FEATURE_LEVEL);
    assert_int_equal(c.feature_level, KVP_FEATURE_INTENT);

    /* a member of level 5 keeps the cluster at 5: no raise to 6, no intent logged (intent_on in
     * service_put.c needs level 6 effective and committed) */
    uint64_t now = 100000;
    struct kvp_feature_peer p[2] = {{6, now - 10}, {5, now - 10}};
    uint32_t computed = kvp_feature_cluster_level(KVP_FEATURE_LEVEL, p, 2, now);
    assert_int_equal(computed, 5);
    assert_false(kvp_feature_should_raise(computed, 5));
    assert_int_equal(kvp_feature_effective_level(KVP_FEATURE_LEVEL, p, 2, now, 5), 5);
    p[1].level = 6; /* the last member upgraded */
    computed = kvp_feature_cluster_level(KVP_FEATURE_LEVEL, p, 2, now);
    assert_int_equal(computed, 6);
    assert_true(kvp_feature_should_raise(computed, 5));
    /* the raise to 6 is stamped 6: a member of level 5 refuses it rather than record it */
    Kvp__RaiseLevelCmd rl = KVP__RAISE_LEVEL_CMD__INIT;
    Kvp__Command rc6 = KVP__COMMAND__INIT;
    rl.level = 6;
    rc6.body_case = KVP__COMMAND__BODY_RAISE_LEVEL;
    rc6.raise_level = &rl;
    kvp_feature_prepare_command(&rc6, 6);
    assert_int_equal(rc6.feature_level, KVP_FEATURE_INTENT);

    uint32_t s1, s2;
    uint64_t o1, o2, H = T0 + 3000, D = T0 + 2000;
    struct kvp_master_fsm *f = setup(&s1, &s2, &o1, &o2, H);
    /* above this binary's level: refused, nothing changes */
    uint64_t d0 = kvp_master_fsm_digest(f);
    assert_int_equal(commit_x(f, "x", 1, 64, D, T0 + 1, (struct place[]){{s1, o1}}, 1, true, KVP_FEATURE_LEVEL + 1),
                     KVP_ERR_VERSION);
    assert_int_equal(seal_x(f, "x", 1, CSUM(1), T0 + 1, KVP_FEATURE_LEVEL + 1), KVP_ERR_VERSION);
    assert_true(kvp_master_fsm_digest(f) == d0);
    /* stamped 5 (a level-5 leader copying an unknown field): complete at once, as level 5 does */
    assert_int_equal(commit_x(f, "y", 2, 64, D, T0 + 1, (struct place[]){{s1, o1}}, 1, true, KVP_FEATURE_RESERVE),
                     KVP_OK);
    assert_int_equal(get_status(f, "y", NULL), KVP_OK);
    assert_int_equal(kvp_fsm_intent_count(f), 0);
    kvp_master_fsm_destroy(&f);

    /* level 5 committed: format 3 as before; level 6: format 4 */
    f = tf_new(GRACE, 10000);
    assert_int_equal(tf_mount(f, "s1", "h1", SEG, T0, &s1), KVP_OK);
    assert_int_equal(raise_level(f, 5, T0), KVP_OK);
    size_t n;
    uint8_t *b = tf_snapshot(f, &n);
    assert_true(snap_format(b, n, 3));
    free(b);
    assert_int_equal(raise_level(f, 6, T0), KVP_OK);
    b = tf_snapshot(f, &n);
    assert_true(snap_format(b, n, 4));
    struct kvp_master_fsm *g = tf_new(GRACE, 10000);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_OK);
    assert_int_equal(kvp_master_fsm_feature_level(g), 6);
    free(b);
    kvp_master_fsm_destroy(&g);
    kvp_master_fsm_destroy(&f);
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_intent_pending_then_sealed),
        cmocka_unit_test(test_intent_revoke_quarantines_to_deadline),
        cmocka_unit_test(test_intent_segment_lost_keeps_other_copy),
        cmocka_unit_test(test_intent_snapshot_round_trip),
        cmocka_unit_test(test_intent_incremental_snapshot),
        cmocka_unit_test(test_intent_replay_digests),
        cmocka_unit_test(test_intent_feature_level),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
