/* test_fsm_reserve.c — reservations per term and PutCommit (actors/master/fsm/fsm_reserve.c,
 * docs/master.md "One-commit put"): placement checks, the retire and its quarantine, snapshot
 * round trip (format 2), segment loss, feature level. */
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

/* ReserveCmd; returns its status, *off the offset. */
static int reserve(struct kvp_master_fsm *f, uint32_t seg, uint64_t len, uint64_t horizon, uint64_t term,
                   uint64_t now, uint64_t *off)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__ReserveCmd q = KVP__RESERVE_CMD__INIT;
    q.segment_id = seg;
    q.length = len;
    q.horizon_ms = horizon;
    c.now_wall_ms = now;
    c.term = term;
    c.feature_level = KVP_FEATURE_RESERVE;
    c.body_case = KVP__COMMAND__BODY_RESERVE;
    c.reserve = &q;
    Kvp__Response *r = tf_apply(f, &c);
    assert_int_equal(r->body_case, KVP__RESPONSE__BODY_RESERVE);
    int st = r->reserve->status;
    if (off)
        *off = r->reserve->offset;
    kvp_master_fsm_response_free(r);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    return st;
}

#define place tf_place

/* PutCommitCmd of one item; returns its status. A later leader than the item's term logs it (the
 * item's term is what counts). */
static int commit(struct kvp_master_fsm *f, const char *key, uint64_t op, uint64_t size, uint64_t term,
                  uint64_t deadline, uint64_t now, const struct place *pl, size_t n)
{
    return tf_put_commit(f, key, op, size, 0xABCDull ^ op, term, term + 1, deadline, now, pl, n, 0, false,
                         KVP_FEATURE_RESERVE);
}

/* The offset of key's first replica and its checksum (the object must exist). */
static uint64_t replica_off(struct kvp_master_fsm *f, const char *key, uint64_t *csum)
{
    Kvp__Response *r = tf_get_replicas(f, key, NULL);
    Kvp__ObjectInfo *o = r->get_replicas->objects[0];
    assert_int_equal(o->status, KVP_OK);
    assert_true(o->n_replicas >= 1);
    uint64_t off = o->replicas[0]->offset;
    if (csum)
        *csum = o->checksum;
    kvp_master_fsm_response_free(r);
    return off;
}

/* RevokeExpired (the retire) and QuarantineRelease, each followed by the invariant check. */
static void retire(struct kvp_master_fsm *f, uint64_t now)
{
    tf_revoke_expired(f, now);
    assert_int_equal(kvp_master_fsm_check(f), 0);
}

static void release(struct kvp_master_fsm *f, uint64_t now)
{
    tf_release(f, now);
    assert_int_equal(kvp_master_fsm_check(f), 0);
}

static void test_reserve_commit_checks_placement(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(GRACE, 10000);
    uint32_t s1, s2;
    assert_int_equal(tf_mount(f, "s1", "h1", SEG, T0, &s1), KVP_OK);
    assert_int_equal(tf_mount(f, "s2", "h2", SEG, T0, &s2), KVP_OK);
    uint64_t o1, o2, H = T0 + 3000;
    assert_int_equal(reserve(f, s1, 16384, H, 7, T0, &o1), KVP_OK);
    assert_int_equal(reserve(f, s2, 16384, H, 7, T0, &o2), KVP_OK);
    /* Nothing else is placed in reserved space. */
    struct tf_put p = {.key = "old-path", .size = 4096, .op_id = 9};
    int st;
    Kvp__Response *r = tf_put_start_r(f, &p, T0, 0, &st);
    assert_int_equal(st, KVP_OK);
    uint64_t old_off = r->put_start->results[0]->replicas[0]->offset;
    assert_true(old_off >= (r->put_start->results[0]->replicas[0]->segment_id == s1 ? o1 + 16384 : o2 + 16384) ||
                old_off + 4096 <= (r->put_start->results[0]->replicas[0]->segment_id == s1 ? o1 : o2));
    kvp_master_fsm_response_free(r);

    struct place two[2] = {{s1, o1}, {s2, o2}};
    assert_int_equal(commit(f, "a", 1, 4000, 7, T0 + 2000, T0 + 10, two, 2), KVP_OK);
    uint64_t cs;
    assert_int_equal(replica_off(f, "a", &cs), o1);
    assert_int_equal(cs, 0xABCDull ^ 1);
    assert_int_equal(tf_get_size(f, "a"), 4000);
    /* A retried commit is OK; another op on the key is EXISTS. */
    assert_int_equal(commit(f, "a", 1, 4000, 7, T0 + 2000, T0 + 20, two, 2), KVP_OK);
    assert_int_equal(commit(f, "a", 2, 10, 7, T0 + 2000, T0 + 20, (struct place[]){{s1, o1 + 8192}}, 1),
                     KVP_ERR_EXISTS);
    /* Overlapping a committed range (4000 rounds to 4032: o1 + 4000 is inside it). */
    assert_int_equal(commit(f, "b", 3, 64, 7, T0 + 2000, T0 + 20, (struct place[]){{s1, o1 + 3968}}, 1),
                     KVP_ERR_INVALID);
    /* Wrong term, outside the reservation, past its end, two replicas on one segment. */
    assert_int_equal(commit(f, "b", 3, 64, 6, T0 + 2000, T0 + 20, (struct place[]){{s1, o1 + 4096}}, 1),
                     KVP_ERR_INVALID);
    assert_int_equal(commit(f, "b", 3, 64, 7, T0 + 2000, T0 + 20, (struct place[]){{s1, o1 + 16384}}, 1),
                     KVP_ERR_INVALID);
    assert_int_equal(commit(f, "b", 3, 128, 7, T0 + 2000, T0 + 20, (struct place[]){{s1, o1 + 16384 - 64}}, 1),
                     KVP_ERR_INVALID);
    assert_int_equal(commit(f, "b", 3, 64, 7, T0 + 2000, T0 + 20, (struct place[]){{s1, o1 + 4096}, {s1, o1 + 8192}},
                            2),
                     KVP_ERR_INVALID);
    /* A deadline past the horizon (the leader must never hand one out), a late commit. */
    assert_int_equal(commit(f, "b", 3, 64, 7, H + 1, T0 + 20, (struct place[]){{s1, o1 + 4096}}, 1),
                     KVP_ERR_INVALID);
    assert_int_equal(commit(f, "b", 3, 64, 7, T0 + 2000, T0 + 2001, (struct place[]){{s1, o1 + 4096}}, 1),
                     KVP_ERR_TIMEOUT);
    assert_int_equal(tf_exists(f, "b"), 0);
    /* The refusals changed nothing: the range is still free in the reservation. */
    assert_int_equal(commit(f, "b", 3, 64, 7, T0 + 2000, T0 + 30, (struct place[]){{s1, o1 + 4096}}, 1), KVP_OK);
    /* Bad reservations. */
    assert_int_equal(reserve(f, s1, 64, T0, 7, T0, NULL), KVP_ERR_INVALID);     /* horizon not ahead */
    assert_int_equal(reserve(f, 99, 64, H, 7, T0, NULL), KVP_ERR_NOT_FOUND);    /* no segment */
    assert_int_equal(reserve(f, s1, SEG, H, 7, T0, NULL), KVP_ERR_NO_SPACE);    /* does not fit */
    kvp_master_fsm_destroy(&f);
}

static void test_reserve_retire_quarantines_unused_at_horizon(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(GRACE, 10000);
    uint32_t s1;
    assert_int_equal(tf_mount(f, "s1", "h1", SEG, T0, &s1), KVP_OK);
    uint64_t o, H = T0 + 1000;
    assert_int_equal(reserve(f, s1, SEG, H, 4, T0, &o), KVP_OK); /* the whole segment */
    assert_int_equal(o, 0);
    assert_int_equal(tf_put_start(f, "x", 64, 1, 1, T0), KVP_ERR_NO_SPACE);
    assert_int_equal(commit(f, "k1", 1, 4096, 4, T0 + 900, T0 + 100, (struct place[]){{s1, 8192}}, 1), KVP_OK);
    /* Before its horizon the reservation stays. */
    retire(f, H - 1);
    release(f, H + GRACE + 100);
    assert_int_equal(tf_put_start(f, "x", 64, 1, 1, H - 1), KVP_ERR_NO_SPACE);
    /* Retired at H: the unused ranges are quarantined as freed at H, reused at H + grace. */
    retire(f, H);
    assert_int_equal(commit(f, "k2", 2, 64, 4, H, H, (struct place[]){{s1, 0}}, 1), KVP_ERR_INVALID);
    release(f, H + GRACE - 1);
    assert_int_equal(tf_put_start(f, "x", 64, 1, 1, H + GRACE - 1), KVP_ERR_NO_SPACE);
    release(f, H + GRACE);
    /* Everything but k1's range is free again; k1 keeps its bytes. */
    assert_int_equal(tf_put(f, "y", 8192, 1, 5, H + GRACE), KVP_OK);
    assert_int_equal(replica_off(f, "y", NULL), 0);
    assert_int_equal(tf_put(f, "z", SEG - 8192 - 4096, 1, 6, H + GRACE), KVP_OK);
    assert_int_equal(replica_off(f, "z", NULL), 8192 + 4096);
    assert_int_equal(replica_off(f, "k1", NULL), 8192);
    assert_int_equal(tf_put_start(f, "w", 64, 1, 7, H + GRACE), KVP_ERR_NO_SPACE);
    /* Removing k1 frees its range once, by the ordinary quarantine. */
    assert_int_equal(tf_remove(f, "k1", false, H + GRACE), KVP_OK);
    release(f, H + 2 * GRACE);
    assert_int_equal(tf_put(f, "w", 4096, 1, 7, H + 2 * GRACE), KVP_OK);
    assert_int_equal(replica_off(f, "w", NULL), 8192);
    kvp_master_fsm_destroy(&f);
}

/* An object committed from a reservation and removed while that reservation lives frees its range
 * (quarantine, then the allocator); a later reservation of the same term gets it, and a put placed
 * there commits. Before the fix resv_find stopped at the first reservation covering the range,
 * whose used[] still holds the removed object's range, and answered INVALID. */
static void test_reserve_overlapping_reservations_commit(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(GRACE, 10000);
    uint32_t s1;
    assert_int_equal(tf_mount(f, "s1", "h1", SEG, T0, &s1), KVP_OK);
    uint64_t o1, o2, H = T0 + 5000;
    assert_int_equal(reserve(f, s1, 16384, H, 7, T0, &o1), KVP_OK);
    assert_int_equal(o1, 0);
    assert_int_equal(commit(f, "a", 1, 4096, 7, T0 + 2000, T0 + 10, (struct place[]){{s1, 0}}, 1), KVP_OK);
    assert_int_equal(tf_remove(f, "a", false, T0 + 20), KVP_OK);
    release(f, T0 + 20 + GRACE);
    /* first fit: the removed object's range, inside the first (still live) reservation */
    assert_int_equal(reserve(f, s1, 4096, H, 7, T0 + 30 + GRACE, &o2), KVP_OK);
    assert_int_equal(o2, 0);
    assert_int_equal(commit(f, "b", 2, 4096, 7, T0 + 2000, T0 + 40 + GRACE, (struct place[]){{s1, 0}}, 1), KVP_OK);
    assert_int_equal(replica_off(f, "b", NULL), 0);
    /* the same range again is refused: it is in use in both reservations now */
    assert_int_equal(commit(f, "c", 3, 4096, 7, T0 + 2000, T0 + 50 + GRACE, (struct place[]){{s1, 0}}, 1),
                     KVP_ERR_INVALID);
    /* the first reservation's own space beyond it still commits */
    assert_int_equal(commit(f, "d", 4, 4096, 7, T0 + 2000, T0 + 60 + GRACE, (struct place[]){{s1, 4096}}, 1),
                     KVP_OK);
    /* both retire at H without freeing b's or d's range twice (the invariant check runs in retire) */
    retire(f, H);
    release(f, H + GRACE);
    assert_int_equal(replica_off(f, "b", NULL), 0);
    assert_int_equal(replica_off(f, "d", NULL), 4096);
    kvp_master_fsm_destroy(&f);
}

static bool snap_format2(const uint8_t *b, size_t n)
{
    return n >= 2 && b[0] == 0x08 && b[1] == 2;
}

static void test_reserve_snapshot_round_trip(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(GRACE, 10000), *g = tf_new(GRACE, 10000);
    uint32_t s1;
    assert_int_equal(tf_mount(f, "s1", "h1", SEG, T0, &s1), KVP_OK);
    uint64_t o, H = T0 + 1000;
    size_t n;
    uint8_t *b = tf_snapshot(f, &n);
    assert_false(snap_format2(b, n)); /* no reservation: format 1, as an older master writes */
    free(b);
    assert_int_equal(reserve(f, s1, 32768, H, 4, T0, &o), KVP_OK);
    assert_int_equal(commit(f, "k1", 1, 100, 4, H, T0 + 1, (struct place[]){{s1, o + 1024}}, 1), KVP_OK);
    assert_int_equal(commit(f, "k2", 2, 64, 4, H, T0 + 1, (struct place[]){{s1, o}}, 1), KVP_OK);
    b = tf_snapshot(f, &n);
    assert_true(snap_format2(b, n));
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_OK);
    size_t n2;
    uint8_t *b2 = tf_snapshot(g, &n2);
    assert_int_equal(n, n2);
    assert_memory_equal(b, b2, n);
    free(b2);
    free(b);
    /* The restored reservation checks as the original: used ranges refused, free ones taken. */
    assert_int_equal(commit(g, "k3", 3, 64, 4, H, T0 + 2, (struct place[]){{s1, o + 1024 + 64}}, 1),
                     KVP_ERR_INVALID);
    assert_int_equal(commit(g, "k3", 3, 64, 4, H, T0 + 2, (struct place[]){{s1, o + 2048}}, 1), KVP_OK);
    /* Reserved space is used space after restore: nothing else lands there. */
    assert_int_equal(tf_put(g, "p", SEG - 32768, 1, 8, T0 + 2), KVP_OK);
    assert_int_equal(tf_put_start(g, "q", 64, 1, 9, T0 + 2), KVP_ERR_NO_SPACE);
    /* Both retire alike. */
    retire(g, H);
    release(g, H + GRACE);
    assert_int_equal(tf_put(g, "q", 64, 1, 9, H + GRACE), KVP_OK);
    b = tf_snapshot(g, &n);
    assert_false(snap_format2(b, n));
    free(b);
    /* A snapshot with a reservation past the segment's end is refused. */
    kvp_master_fsm_destroy(&g);
    kvp_master_fsm_destroy(&f);
}

/* The incremental snapshot (fsm_snap_inc.c) with reservations: its prefix is format 2, and
 * PutCommit objects created or removed between its chunks leave the image as it was at begin:
 * restored, it writes the same whole snapshot bytes as the state at begin. */
static void test_reserve_incremental_snapshot(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(GRACE, 10000);
    uint32_t s1;
    assert_int_equal(tf_mount(f, "s1", "h1", SEG, T0, &s1), KVP_OK);
    uint64_t o, H = T0 + 1000;
    assert_int_equal(reserve(f, s1, 32768, H, 4, T0, &o), KVP_OK);
    char key[32];
    for (int i = 0; i < 64; i++) { /* 64 objects of 64 bytes in the first half of the reservation */
        snprintf(key, sizeof key, "c/%03d", i);
        assert_int_equal(commit(f, key, 1 + (uint64_t)i, 64, 4, H, T0 + 1,
                                (struct place[]){{s1, o + (uint64_t)i * KVP_FSM_ALIGN}}, 1), KVP_OK);
    }
    size_t wn;
    uint8_t *whole = tf_snapshot(f, &wn);
    assert_true(snap_format2(whole, wn));
    assert_int_equal(kvp_master_fsm_snap_begin(f), KVP_OK);
    uint8_t *all = NULL;
    size_t len = 0;
    bool last = false;
    int added = 0, removed = 0;
    for (int step = 0; !last; step++) {
        uint8_t *c = NULL;
        size_t l = 0;
        assert_int_equal(kvp_master_fsm_snap_next(f, 256, &c, &l, &last), KVP_OK);
        all = realloc(all, len + l);
        assert_non_null(all);
        memcpy(all + len, c, l);
        len += l;
        free(c);
        /* between chunks: commit into the reservation's second half, remove committed ones */
        for (int k = 0; k < 4 && added < 200; k++, added++) {
            snprintf(key, sizeof key, "n/%03d", added);
            assert_int_equal(commit(f, key, 1000 + (uint64_t)added, 64, 4, H, T0 + 2,
                                    (struct place[]){{s1, o + 16384 + (uint64_t)added * KVP_FSM_ALIGN}}, 1),
                             KVP_OK);
        }
        for (int k = 0; k < 3 && removed < 64; k++, removed += 2) {
            snprintf(key, sizeof key, "c/%03d", removed);
            assert_int_equal(tf_remove(f, key, false, T0 + 2), KVP_OK);
        }
    }
    assert_true(added > 8 && removed > 8); /* the walk was interleaved with changes */
    assert_true(snap_format2(all, len));
    struct kvp_master_fsm *g = tf_new(GRACE, 10000);
    assert_int_equal(kvp_master_fsm_restore(g, all, len), KVP_OK);
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

static void test_reserve_segment_lost_drops_reservations(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(GRACE, 10000);
    uint32_t s1, s2;
    assert_int_equal(tf_mount(f, "s1", "h1", SEG, T0, &s1), KVP_OK);
    assert_int_equal(tf_mount(f, "s2", "h2", SEG, T0, &s2), KVP_OK);
    uint64_t o1, o2, H = T0 + 1000;
    assert_int_equal(reserve(f, s1, 8192, H, 4, T0, &o1), KVP_OK);
    assert_int_equal(reserve(f, s2, 8192, H, 4, T0, &o2), KVP_OK);
    assert_int_equal(tf_seg_lost(f, s1, T0 + 1), KVP_OK);
    assert_int_equal(commit(f, "k", 1, 64, 4, H, T0 + 2, (struct place[]){{s1, o1}}, 1), KVP_ERR_INVALID);
    assert_int_equal(commit(f, "k", 1, 64, 4, H, T0 + 2, (struct place[]){{s2, o2}}, 1), KVP_OK);
    assert_int_equal(reserve(f, s1, 64, H, 4, T0 + 2, NULL), KVP_ERR_NOT_FOUND);
    /* Unmount frees the other's reservation with the segment (ASan checks the memory). */
    assert_int_equal(tf_remove(f, "k", false, T0 + 3), KVP_OK);
    retire(f, H);
    release(f, H + GRACE);
    assert_int_equal(reserve(f, s2, 64, H + 5000, 5, H + GRACE, NULL), KVP_OK);
    assert_int_equal(tf_unmount(f, s2, H + GRACE), KVP_OK);
    kvp_master_fsm_destroy(&f);
}

static void test_reserve_feature_level(void **state)
{
    (void)state;
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__ReserveCmd q = KVP__RESERVE_CMD__INIT;
    c.body_case = KVP__COMMAND__BODY_RESERVE;
    c.reserve = &q;
    assert_int_equal(kvp_feature_command_needs(&c), KVP_FEATURE_RESERVE);
    kvp_feature_prepare_command(&c, KVP_FEATURE_LEVEL);
    assert_int_equal(c.feature_level, KVP_FEATURE_RESERVE);
    Kvp__PutCommitCmd pc = KVP__PUT_COMMIT_CMD__INIT;
    c.body_case = KVP__COMMAND__BODY_PUT_COMMIT;
    c.put_commit = &pc;
    assert_int_equal(kvp_feature_command_needs(&c), KVP_FEATURE_RESERVE);
    assert_true(KVP_FEATURE_LEVEL >= KVP_FEATURE_RESERVE);
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reserve_commit_checks_placement),
        cmocka_unit_test(test_reserve_retire_quarantines_unused_at_horizon),
        cmocka_unit_test(test_reserve_overlapping_reservations_commit),
        cmocka_unit_test(test_reserve_snapshot_round_trip),
        cmocka_unit_test(test_reserve_incremental_snapshot),
        cmocka_unit_test(test_reserve_segment_lost_drops_reservations),
        cmocka_unit_test(test_reserve_feature_level),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
