/* test_fsm_snap.c — FSM snapshot/restore and the raftlog byte adapters. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "actors/master/fsm/fsm_internal.h"
#include "test_fsm_helpers.h"
#include "wire/snapshot.pb-c.h"
#include <xxhash.h>

#define MB (1024ull * 1024)

/* A state with every kind of thing in it: live, draining and lost segments, complete, pinned
 * and pending objects, quarantine entries, a forgotten segment id. */
static struct kvp_master_fsm *busy_state(void)
{
    struct kvp_master_fsm *f = tf_new(100, 5000);
    uint32_t s1, s2, s3, s4, s5;
    assert_int_equal(tf_mount(f, "s1", "hostA", 2 * MB, 1, &s1), KVP_OK);
    assert_int_equal(tf_mount(f, "s2", "hostB", MB, 1, &s2), KVP_OK);
    assert_int_equal(tf_mount(f, "s3", "hostC", MB, 1, &s3), KVP_OK);
    assert_int_equal(tf_mount(f, "s4", "hostD", MB, 1, &s4), KVP_OK);
    assert_int_equal(tf_mount(f, "s5", "hostE", MB, 1, &s5), KVP_OK);
    char k[64];
    for (int i = 0; i < 200; i++) {
        snprintf(k, sizeof(k), "obj-%03d", i);
        struct tf_put p = {.key = k, .size = 100 + (uint64_t)i * 37, .replica_num = 1 + i % 3,
                           .op_id = 1000 + (uint64_t)i, .soft_pin = i % 7 == 0};
        int st;
        kvp_master_fsm_response_free(tf_put_start_r(f, &p, 10 + (uint64_t)i, 0, &st));
        assert_int_equal(st, KVP_OK);
        if (i % 5 != 0)
            assert_int_equal(tf_put_end(f, k, 1000 + (uint64_t)i, (uint64_t)i * 31, 20), KVP_OK);
    }
    for (int i = 0; i < 200; i += 9) {
        snprintf(k, sizeof(k), "obj-%03d", i);
        int st = tf_remove(f, k, i % 2, 30 + (uint64_t)i);
        assert_true(st == KVP_OK || st == KVP_ERR_BUSY);
    }
    assert_int_equal(tf_drain(f, s3, NULL, 40), KVP_OK);
    assert_int_equal(tf_seg_lost(f, s4, 41), KVP_OK);
    assert_int_equal(tf_unmount(f, s5, 42), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    return f;
}

static void test_fsm_snapshot_restore_identical_bytes(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = busy_state();
    size_t n1, n2, n3;
    uint8_t *b1 = tf_snapshot(f, &n1);
    uint8_t *b1b = tf_snapshot(f, &n3); /* snapshot is read-only and repeatable */
    assert_int_equal(n1, n3);
    assert_memory_equal(b1, b1b, n1);
    free(b1b);

    struct kvp_master_fsm *g = tf_new(100, 5000);
    assert_int_equal(tf_mount(g, "junk", "x", MB, 1, NULL), KVP_OK); /* replaced entirely */
    assert_int_equal(kvp_master_fsm_restore(g, b1, n1), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(g), 0);
    uint8_t *b2 = tf_snapshot(g, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    struct kvp_master_fsm_stats sf, sg;
    kvp_master_fsm_stats(f, &sf);
    kvp_master_fsm_stats(g, &sg);
    assert_memory_equal(&sf, &sg, sizeof(sf));

    /* The same commands on both give the same results and the same bytes again. */
    char k[64];
    for (int i = 0; i < 100; i++) {
        snprintf(k, sizeof(k), "after-%d", i);
        assert_int_equal(tf_put(f, k, 500 + (uint64_t)i, 2, 5000 + (uint64_t)i, 100),
                         tf_put(g, k, 500 + (uint64_t)i, 2, 5000 + (uint64_t)i, 100));
    }
    assert_int_equal(tf_revoke_expired(f, 100000), tf_revoke_expired(g, 100000));
    assert_int_equal(tf_release(f, 100050), tf_release(g, 100050));
    assert_int_equal(tf_mount(f, "s6", "hostF", MB, 100, NULL),
                     tf_mount(g, "s6", "hostF", MB, 100, NULL));
    free(b1);
    free(b2);
    b1 = tf_snapshot(f, &n1);
    b2 = tf_snapshot(g, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    free(b1);
    free(b2);
    kvp_master_fsm_destroy(&f);
    kvp_master_fsm_destroy(&g);
}

/* Incremental snapshot (fsm_snap_inc.c) while the table grows twice and half the objects it
 * owes are removed or rewritten: the chunks restore to the state at begin (digest), and the
 * live state, snapshotted again after 200 abandoned snapshots (the 8-bit generation wraps),
 * restores to itself. */
static void test_fsm_snap_incremental_across_growth_and_removal(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(100, 5000);
    uint32_t id = 0;
    assert_int_equal(tf_mount(f, "seg-a", "h1", 1ull << 30, 1000, &id), KVP_OK);
    assert_int_equal(tf_mount(f, "seg-b", "h2", 1ull << 30, 1000, &id), KVP_OK);
    char key[64];
    for (int i = 0; i < 3000; i++) {
        snprintf(key, sizeof(key), "k/%06d", i);
        assert_int_equal(tf_put(f, key, 100 + (uint64_t)i, 2, 1 + (uint64_t)i, 1000), KVP_OK);
    }
    size_t n = 0;
    uint8_t *b = tf_snapshot(f, &n);
    struct kvp_master_fsm *ref = tf_new(100, 5000);
    assert_int_equal(kvp_master_fsm_restore(ref, b, n), KVP_OK);
    free(b);
    uint64_t d0 = kvp_master_fsm_digest(ref);
    assert_true(d0 == kvp_master_fsm_digest(f));
    assert_int_equal(kvp_master_fsm_snap_begin(f), KVP_OK);
    uint8_t *all = NULL;
    size_t len = 0;
    bool last = false;
    int added = 0;
    for (int step = 0; !last; step++) {
        uint8_t *c = NULL;
        size_t l = 0;
        assert_int_equal(kvp_master_fsm_snap_next(f, 512, &c, &l, &last), KVP_OK);
        all = realloc(all, len + l);
        memcpy(all + len, c, l);
        len += l;
        free(c);
        /* between chunks: 40 new objects (the table grows past 4096 and 8192 slots), and
         * every third original removed, every third pending put revoked and put again */
        for (int k = 0; k < 40; k++, added++) {
            snprintf(key, sizeof(key), "new/%06d", added);
            assert_int_equal(tf_put(f, key, 64, 1, 100000 + (uint64_t)added, 2000), KVP_OK);
        }
        for (int k = step * 30; k < step * 30 + 30 && k < 3000; k++) {
            snprintf(key, sizeof(key), "k/%06d", k);
            if (k % 3 == 0)
                assert_int_equal(tf_remove(f, key, false, 2000), KVP_OK);
        }
    }
    assert_true(added > 3000);
    struct kvp_master_fsm *got = tf_new(100, 5000);
    assert_int_equal(kvp_master_fsm_restore(got, all, len), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(got), 0);
    assert_true(kvp_master_fsm_digest(got) == d0);
    assert_true(kvp_master_fsm_digest(f) != d0);
    for (int i = 0; i < 200; i++) {
        assert_int_equal(kvp_master_fsm_snap_begin(f), KVP_OK);
        if (i % 2) {
            uint8_t *c = NULL;
            size_t l = 0;
            assert_int_equal(kvp_master_fsm_snap_next(f, 256, &c, &l, &last), KVP_OK);
            free(c);
        }
        kvp_master_fsm_snap_abort(f);
    }
    assert_int_equal(kvp_master_fsm_snap_begin(f), KVP_OK);
    len = 0;
    last = false;
    while (!last) {
        uint8_t *c = NULL;
        size_t l = 0;
        assert_int_equal(kvp_master_fsm_snap_next(f, 1 << 16, &c, &l, &last), KVP_OK);
        all = realloc(all, len + l);
        memcpy(all + len, c, l);
        len += l;
        free(c);
    }
    struct kvp_master_fsm *again = tf_new(100, 5000);
    assert_int_equal(kvp_master_fsm_restore(again, all, len), KVP_OK);
    assert_true(kvp_master_fsm_digest(again) == kvp_master_fsm_digest(f));
    free(all);
    kvp_master_fsm_destroy(&again);
    kvp_master_fsm_destroy(&got);
    kvp_master_fsm_destroy(&ref);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_snapshot_empty_roundtrip(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1, 1);
    size_t n;
    uint8_t *b = tf_snapshot(f, &n);
    struct kvp_master_fsm *g = busy_state();
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_OK);
    struct kvp_master_fsm_stats s;
    kvp_master_fsm_stats(g, &s);
    assert_int_equal(s.segments + s.objects + s.pending_puts, 0);
    uint32_t id;
    assert_int_equal(tf_mount(g, "s1", "h", MB, 1, &id), KVP_OK);
    assert_int_equal(id, 1);
    free(b);
    kvp_master_fsm_destroy(&f);
    kvp_master_fsm_destroy(&g);
}

/* Every prefix and many corruptions: an error with the state unchanged (a consistent state
 * if one ever passed). */
static void test_fsm_restore_truncated_or_corrupt_consistent(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = busy_state();
    size_t n, n0;
    uint8_t *b = tf_snapshot(f, &n);
    struct kvp_master_fsm *g = tf_new(100, 5000);
    assert_int_equal(tf_mount(g, "keep", "h", MB, 1, NULL), KVP_OK);
    assert_int_equal(tf_put(g, "keep", 10, 1, 1, 1), KVP_OK);
    uint8_t *before = tf_snapshot(g, &n0);
    int ok = 0, rejected = 0;
    for (size_t cut = 0; cut < n; cut += (cut < 200 ? 1 : 97)) {
        int rc = kvp_master_fsm_restore(g, b, cut);
        if (rc == KVP_OK) {
            ok++;
            assert_int_equal(kvp_master_fsm_check(g), 0);
            assert_int_equal(kvp_master_fsm_restore(g, before, n0), KVP_OK);
        } else {
            rejected++;
            assert_true(rc == KVP_ERR_MALFORMED || rc == KVP_ERR_VERSION);
            size_t m;
            uint8_t *now = tf_snapshot(g, &m);
            assert_int_equal(m, n0);
            assert_memory_equal(now, before, n0);
            free(now);
        }
    }
    uint8_t *c = malloc(n);
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 300; i++) {
        memcpy(c, b, n);
        for (int j = 0; j < 3; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            c[x % n] ^= (uint8_t)(1u << (x >> 40) % 8);
        }
        int rc = kvp_master_fsm_restore(g, c, n);
        if (rc == KVP_OK) {
            ok++;
            assert_int_equal(kvp_master_fsm_check(g), 0);
            assert_int_equal(kvp_master_fsm_restore(g, before, n0), KVP_OK);
        } else {
            rejected++;
        }
    }
    print_message("prefixes and corruptions: %d restored, %d rejected\n", ok, rejected);
    assert_int_equal(ok, 0); /* the trailing checksum catches every one */
    /* Corruptions behind a recomputed checksum reach the parser: error or consistent state. */
    int parsed_ok = 0, parsed_bad = 0;
    for (int i = 0; i < 2000; i++) {
        memcpy(c, b, n);
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        c[x % (n - 9)] ^= (uint8_t)(1u << (x >> 40) % 8);
        uint64_t sum = XXH3_64bits(c, n - 9);
        for (int j = 0; j < 8; j++)
            c[n - 8 + j] = (uint8_t)(sum >> (8 * j));
        int rc = kvp_master_fsm_restore(g, c, n);
        if (rc == KVP_OK) {
            parsed_ok++;
            assert_int_equal(kvp_master_fsm_check(g), 0);
            assert_int_equal(kvp_master_fsm_restore(g, before, n0), KVP_OK);
        } else {
            parsed_bad++;
            assert_true(rc == KVP_ERR_MALFORMED || rc == KVP_ERR_VERSION);
        }
    }
    print_message("bit flips behind a good checksum: %d consistent restores, %d rejected\n",
                  parsed_ok, parsed_bad);
    assert_true(parsed_bad > 0);
    free(c);
    free(b);
    free(before);
    kvp_master_fsm_destroy(&f);
    kvp_master_fsm_destroy(&g);
}

/* Pack with the trailing checksum the way the FSM writes it (field 15 is packed last). */
static uint8_t *pack_snapshot(Kvp__Snapshot *s, size_t *n)
{
    s->checksum = 0;
    *n = kvp__snapshot__get_packed_size(s);
    uint8_t *b = malloc(*n + 9);
    kvp__snapshot__pack(s, b);
    s->checksum = XXH3_64bits(b, *n);
    *n = kvp__snapshot__get_packed_size(s);
    kvp__snapshot__pack(s, b);
    return b;
}

/* Hand-built snapshots that decode but are inconsistent. */
static void test_fsm_restore_inconsistent_malformed(void **state)
{
    (void)state;
    Kvp__SnapSegment seg = KVP__SNAP_SEGMENT__INIT, *segs[1] = {&seg};
    seg.id = 1;
    seg.name = "s1";
    seg.size = 4096;
    Kvp__SnapReplica r1 = KVP__SNAP_REPLICA__INIT, r2 = KVP__SNAP_REPLICA__INIT;
    Kvp__SnapReplica *rp1[1] = {&r1}, *rp2[1] = {&r2};
    r1.segment_id = r2.segment_id = 1;
    r1.offset = 0;
    r2.offset = 64;
    Kvp__SnapObject o1 = KVP__SNAP_OBJECT__INIT, o2 = KVP__SNAP_OBJECT__INIT;
    Kvp__SnapObject *objs[2] = {&o1, &o2};
    o1.key = "a";
    o1.size = 100; /* 128 bytes: [0, 128) */
    o1.complete = true;
    o1.n_replicas = 1;
    o1.replicas = rp1;
    o2 = o1;
    o2.key = "b";
    o2.replicas = rp2; /* [64, 192): overlaps a */
    Kvp__Snapshot s = KVP__SNAPSHOT__INIT;
    s.format = 1;
    s.last_segment_id = 1;
    s.n_segments = 1;
    s.segments = segs;
    s.n_objects = 2;
    s.objects = objs;
    struct kvp_master_fsm *g = tf_new(100, 5000);
    size_t n;
    uint8_t *b = pack_snapshot(&s, &n);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_ERR_MALFORMED);
    free(b);
    r2.offset = 128; /* now consistent */
    b = pack_snapshot(&s, &n);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(g), 0);
    assert_int_equal(tf_exists(g, "b"), 1);
    free(b);
    o2.key = "a"; /* duplicate key */
    b = pack_snapshot(&s, &n);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_ERR_MALFORMED);
    free(b);
    o2.key = "b";
    r2.segment_id = 2; /* unknown segment */
    b = pack_snapshot(&s, &n);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_ERR_MALFORMED);
    free(b);
    r2.segment_id = 1;
    r2.offset = 4096 - 64; /* runs past the end */
    b = pack_snapshot(&s, &n);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_ERR_MALFORMED);
    free(b);
    r2.offset = 128;
    s.format = 5; /* 2 is known since feature level 3 (reservations), 3 since 5, 4 since 6; 5 is a future one */
    b = pack_snapshot(&s, &n);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_ERR_VERSION);
    free(b);
    s.format = 4; /* written exactly when level 6 is committed: here none is */
    b = pack_snapshot(&s, &n);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_ERR_MALFORMED);
    free(b);
    s.format = 3; /* written exactly when level 5 is committed: here none is */
    b = pack_snapshot(&s, &n);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_ERR_MALFORMED);
    free(b);
    s.feature_level = 5; /* level 5 committed: format 3 restores */
    b = pack_snapshot(&s, &n);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_OK);
    assert_int_equal(kvp_master_fsm_feature_level(g), 5);
    free(b);
    s.feature_level = 99; /* a level above this binary's: its rules are not this binary's */
    b = pack_snapshot(&s, &n);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_ERR_VERSION);
    free(b);
    s.feature_level = 0;
    s.format = 1;
    s.last_segment_id = 0; /* segment id beyond the ids handed out */
    b = pack_snapshot(&s, &n);
    assert_int_equal(kvp_master_fsm_restore(g, b, n), KVP_ERR_MALFORMED);
    free(b);
    assert_int_equal(kvp_master_fsm_restore(g, (const uint8_t *)"", 0), KVP_ERR_MALFORMED);
    assert_int_equal(tf_exists(g, "b"), 1); /* still the good state */
    kvp_master_fsm_destroy(&g);
}

static void test_fsm_apply_bytes_roundtrip_and_malformed(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(100, 5000);
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__MountSegmentReq m = KVP__MOUNT_SEGMENT_REQ__INIT;
    m.name = "s1";
    m.host = "h";
    m.endpoint = "h:1";
    m.size = MB;
    c.body_case = KVP__COMMAND__BODY_MOUNT;
    c.mount = &m;
    size_t n = kvp__command__get_packed_size(&c);
    uint8_t *buf = malloc(n);
    kvp__command__pack(&c, buf);
    uint8_t *res = NULL;
    size_t rl = 0;
    assert_int_equal(kvp_master_fsm_apply_bytes(f, buf, n, &res, &rl), KVP_OK);
    Kvp__Response *r = kvp__response__unpack(NULL, rl, res);
    assert_non_null(r);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->mount->segment_id, 1);
    kvp__response__free_unpacked(r, NULL);
    free(res);
    free(buf);

    size_t s0;
    uint8_t *before = tf_snapshot(f, &s0);
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    res = (uint8_t *)1;
    assert_int_equal(kvp_master_fsm_apply_bytes(f, junk, sizeof(junk), &res, &rl),
                     KVP_ERR_MALFORMED);
    assert_null(res);
    assert_int_equal(kvp_master_fsm_query_bytes(f, junk, sizeof(junk), &res, &rl),
                     KVP_ERR_MALFORMED);
    /* An empty command decodes to "no body": INVALID, state unchanged. */
    assert_int_equal(kvp_master_fsm_apply_bytes(f, junk, 0, &res, &rl), KVP_ERR_INVALID);
    size_t s1;
    uint8_t *after = tf_snapshot(f, &s1);
    assert_int_equal(s0, s1);
    assert_memory_equal(before, after, s0);
    free(before);
    free(after);

    Kvp__Request q = KVP__REQUEST__INIT;
    Kvp__ExistsReq e = KVP__EXISTS_REQ__INIT;
    char *keys[2] = {"x", "y"};
    e.n_keys = 2;
    e.keys = keys;
    q.req_id = 5;
    q.body_case = KVP__REQUEST__BODY_EXISTS;
    q.exists = &e;
    n = kvp__request__get_packed_size(&q);
    buf = malloc(n);
    kvp__request__pack(&q, buf);
    assert_int_equal(kvp_master_fsm_query_bytes(f, buf, n, &res, &rl), KVP_OK);
    r = kvp__response__unpack(NULL, rl, res);
    assert_non_null(r);
    assert_int_equal(r->req_id, 5);
    assert_int_equal(r->exists->n_results, 2);
    assert_int_equal(r->exists->results[0], 0);
    kvp__response__free_unpacked(r, NULL);
    free(res);
    free(buf);

    uint8_t *sb;
    size_t sl;
    assert_int_equal(kvp_master_fsm_snapshot_bytes(f, &sb, &sl), KVP_OK);
    assert_int_equal(kvp_master_fsm_restore_bytes(f, sb, sl), KVP_OK);
    assert_int_equal(kvp_master_fsm_restore_bytes(f, junk, sizeof(junk)), KVP_ERR_MALFORMED);
    free(sb);
    kvp_master_fsm_destroy(&f);
}

/* The hand-written SnapObject encoder writes exactly protobuf-c's bytes for every shape: pending
 * and complete, zero and large values, soft pin, 1..3 replicas, replica_num, a 512-byte key. */
static void test_fsm_snap_object_encoder_matches_protobuf_c(void **state)
{
    (void)state;
    char longkey[KVP_FSM_KEY_MAX + 1];
    memset(longkey, 'k', KVP_FSM_KEY_MAX);
    longkey[KVP_FSM_KEY_MAX] = 0;
    const char *keys[] = {"a", "blk-00000042", longkey};
    for (unsigned shape = 0; shape < 24; shape++) {
        const char *key = keys[shape % 3];
        unsigned nrep = 1 + shape % 3;
        struct kvp_fsm_obj *o = kvp_fsm_obj_alloc(key, strlen(key), nrep);
        assert_non_null(o);
        o->size = shape & 1 ? 4096 : (1ull << 40) + 7;
        o->op_id = shape & 2 ? 0 : 0xfedcba9876543210ull;
        o->term = shape;
        o->state = shape & 4 ? KVP_FSM_OBJ_COMPLETE : KVP_FSM_OBJ_PENDING;
        o->u.checksum = shape & 8 ? 0 : 0x1234567890abcdefull;
        o->soft_pin = (shape & 16) != 0;
        o->pad[0] = (uint8_t)(shape % 5);
        for (unsigned i = 0; i < nrep; i++)
            o->rep[i] = (struct kvp_fsm_replica){.segment_id = i * 3, .state = i & 1, .offset = (uint64_t)i << 33};
        uint8_t mine[KVP_FSM_SNAP_OBJECT_MAX];
        size_t n = kvp_fsm_snap_object_encode(NULL, o, mine);

        Kvp__SnapObject m = KVP__SNAP_OBJECT__INIT;
        Kvp__SnapReplica rm[3], *rp[3];
        m.key = (char *)key;
        m.size = o->size;
        m.op_id = o->op_id;
        m.term = o->term;
        m.complete = o->state == KVP_FSM_OBJ_COMPLETE;
        m.checksum = m.complete ? o->u.checksum : 0;
        m.deadline_wall_ms = m.complete ? 0 : o->u.deadline_ms;
        m.soft_pin = o->soft_pin;
        m.replica_num = o->pad[0];
        for (unsigned i = 0; i < nrep; i++) {
            kvp__snap_replica__init(&rm[i]);
            rm[i].segment_id = o->rep[i].segment_id;
            rm[i].offset = o->rep[i].offset;
            rm[i].state = o->rep[i].state;
            rp[i] = &rm[i];
        }
        m.n_replicas = nrep;
        m.replicas = rp;
        size_t want = kvp__snap_object__get_packed_size(&m);
        uint8_t *ref = malloc(want);
        kvp__snap_object__pack(&m, ref);
        assert_int_equal(n, want);
        assert_memory_equal(mine, ref, n);
        free(ref);
        free(o);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fsm_snapshot_restore_identical_bytes),
        cmocka_unit_test(test_fsm_snap_object_encoder_matches_protobuf_c),
        cmocka_unit_test(test_fsm_snapshot_empty_roundtrip),
        cmocka_unit_test(test_fsm_snap_incremental_across_growth_and_removal),
        cmocka_unit_test(test_fsm_restore_truncated_or_corrupt_consistent),
        cmocka_unit_test(test_fsm_restore_inconsistent_malformed),
        cmocka_unit_test(test_fsm_apply_bytes_roundtrip_and_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
