/* test_fsm.c — master FSM commands and queries: every result code of every command. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "runtime/log.h"
#include "test_fsm_helpers.h"

#define MB (1024ull * 1024)

static void test_fsm_mount_ids_monotonic_never_reused(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    uint32_t a, b, c;
    assert_int_equal(tf_mount(f, "seg-a", "h1", MB, 1, &a), KVP_OK);
    assert_int_equal(tf_mount(f, "seg-b", "h2", MB, 1, &b), KVP_OK);
    assert_int_equal(a, 1);
    assert_int_equal(b, 2);
    assert_int_equal(tf_unmount(f, a, 2), KVP_OK);
    assert_int_equal(tf_unmount(f, a, 2), KVP_ERR_NOT_FOUND);
    assert_int_equal(tf_unmount(f, 99, 2), KVP_ERR_NOT_FOUND);
    assert_int_equal(tf_mount(f, "seg-a", "h1", MB, 3, &c), KVP_OK);
    assert_int_equal(c, 3);
    assert_int_equal(tf_mount(f, "", "h1", MB, 3, NULL), KVP_ERR_INVALID);
    assert_int_equal(tf_mount(f, "tiny", "h1", 63, 3, NULL), KVP_ERR_INVALID);
    struct kvp_master_fsm_stats st;
    kvp_master_fsm_stats(f, &st);
    assert_int_equal(st.segments, 2);
    assert_int_equal(st.capacity_bytes, 2 * MB);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
    assert_null(f);
    kvp_master_fsm_destroy(&f);
}

static int heartbeat(const struct kvp_master_fsm *f, uint32_t id, int *seg_state)
{
    Kvp__Request q = KVP__REQUEST__INIT;
    Kvp__HeartbeatReq h = KVP__HEARTBEAT_REQ__INIT;
    h.segment_id = id;
    q.body_case = KVP__REQUEST__BODY_HEARTBEAT;
    q.heartbeat = &h;
    Kvp__Response *r = tf_query(f, &q);
    int st = r->status;
    if (st == KVP_OK)
        *seg_state = r->heartbeat->state;
    kvp_master_fsm_response_free(r);
    return st;
}

static void test_fsm_remount_same_name_old_lost(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    uint32_t a, a2;
    int ss = -1;
    assert_int_equal(tf_mount(f, "seg-a", "h1", MB, 1, &a), KVP_OK);
    assert_int_equal(tf_put(f, "k1", 100, 1, 7, 2), KVP_OK);
    assert_int_equal(heartbeat(f, a, &ss), KVP_OK);
    assert_int_equal(ss, KVP__SEGMENT_STATE__SEGMENT_ACTIVE);
    assert_int_equal(tf_mount(f, "seg-a", "h1", MB, 3, &a2), KVP_OK);
    assert_int_not_equal(a, a2);
    assert_int_equal(heartbeat(f, a, &ss), KVP_ERR_NOT_FOUND); /* lost: must remount */
    assert_int_equal(heartbeat(f, 77, &ss), KVP_ERR_NOT_FOUND);
    assert_int_equal(tf_exists(f, "k1"), 0); /* its only replica was on the old segment */
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

/* A second process claiming a live segment's name from another address is refused; the live
 * segment keeps its objects. Bad sizes and endpoints are refused. */
static void test_fsm_mount_name_in_use_elsewhere_exists(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    uint32_t a, b;
    assert_int_equal(tf_mount(f, "seg-a", "h1", MB, 1, &a), KVP_OK);
    assert_int_equal(tf_put(f, "k1", 100, 1, 7, 2), KVP_OK);
    assert_int_equal(tf_mount(f, "seg-a", "h2", MB, 3, &b), KVP_ERR_EXISTS); /* h2:7000 */
    assert_int_equal(tf_exists(f, "k1"), 1);
    assert_int_equal(tf_seg_lost(f, a, 4), KVP_OK);
    assert_int_equal(tf_mount(f, "seg-a", "h2", MB, 5, &b), KVP_OK); /* free once lost */
    assert_int_equal(tf_mount(f, "huge", "h3", (64ull << 40) + 64, 6, NULL), KVP_ERR_INVALID);
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__MountSegmentReq m = KVP__MOUNT_SEGMENT_REQ__INIT;
    m.name = "bad-ep";
    m.host = "h4";
    m.size = MB;
    c.now_wall_ms = 7;
    c.body_case = KVP__COMMAND__BODY_MOUNT;
    c.mount = &m;
    const char *bad[] = {"", "h4", "h4:", ":7000", "h4:0", "h4:65536", "h4:70x0", "h4:1234567"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        m.endpoint = (char *)bad[i];
        assert_int_equal(tf_apply_status(f, &c), KVP_ERR_INVALID);
    }
    m.endpoint = "[fe80::1%eth0]:7001";
    assert_int_equal(tf_apply_status(f, &c), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

/* A client's pending-put ttl is capped (2 h): a huge ttl cannot pin space for good. */
static void test_fsm_put_start_huge_ttl_capped(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(100, 5000);
    assert_int_equal(tf_mount(f, "s1", "h", MB, 1, NULL), KVP_OK);
    struct tf_put p = {.key = "t", .size = 64, .replica_num = 1, .op_id = 1};
    int st;
    kvp_master_fsm_response_free(tf_put_start_r(f, &p, 1000, UINT64_MAX, &st));
    assert_int_equal(st, KVP_OK);
    assert_int_equal(tf_revoke_expired(f, 1000 + 2ull * 3600 * 1000 - 1), 0);
    assert_int_equal(tf_revoke_expired(f, 1000 + 2ull * 3600 * 1000 + 1), 1);
    assert_int_equal(tf_put_start(f, "t", 64, 1, 2, 1000 + 2ull * 3600 * 1000 + 2), KVP_OK);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_put_start_bad_items_invalid(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    assert_int_equal(tf_mount(f, "s1", "h1", MB, 1, NULL), KVP_OK);
    char big[600];
    memset(big, 'x', sizeof(big));
    big[513] = '\0';
    assert_int_equal(tf_put_start(f, "", 10, 1, 1, 1), KVP_ERR_INVALID);
    assert_int_equal(tf_put_start(f, big, 10, 1, 1, 1), KVP_ERR_INVALID);
    big[512] = '\0'; /* exactly 512 bytes is fine */
    assert_int_equal(tf_put_start(f, big, 10, 1, 1, 1), KVP_OK);
    assert_int_equal(tf_put_start(f, "zero", 0, 1, 1, 1), KVP_ERR_INVALID);
    assert_int_equal(tf_put_start(f, "many", 10, 17, 1, 1), KVP_ERR_INVALID);
    assert_int_equal(tf_put_start(f, "huge", UINT64_MAX, 1, 1, 1), KVP_ERR_TOO_LARGE);
    assert_int_equal(tf_put_start(f, "big", MB + 1, 1, 1, 1), KVP_ERR_TOO_LARGE);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_put_start_no_room_no_space(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    assert_int_equal(tf_put_start(f, "k", 10, 1, 1, 1), KVP_ERR_NO_SPACE); /* no segments */
    uint32_t s1;
    assert_int_equal(tf_mount(f, "s1", "h1", 4096, 1, &s1), KVP_OK);
    assert_int_equal(tf_put_start(f, "a", 4096, 1, 1, 1), KVP_OK);
    assert_int_equal(tf_put_start(f, "b", 64, 1, 2, 1), KVP_ERR_NO_SPACE);
    assert_int_equal(tf_drain(f, s1, NULL, 1), KVP_OK);
    assert_int_equal(tf_put_start(f, "c", 64, 1, 3, 1), KVP_ERR_NO_SPACE); /* no ACTIVE */
    kvp_master_fsm_destroy(&f);
}

/* PutStartReq.avoid_segments: placement takes those segments last (issue 18: a client that
 * cannot reach a segment the master hears), and still takes them when nothing else fits. */
static void test_fsm_put_start_avoid_segments_placed_last(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    uint32_t s1, s2, s3;
    assert_int_equal(tf_mount(f, "s1", "h1", 4 * MB, 1, &s1), KVP_OK); /* most free: first choice */
    assert_int_equal(tf_mount(f, "s2", "h2", 2 * MB, 1, &s2), KVP_OK);
    assert_int_equal(tf_mount(f, "s3", "h3", MB, 1, &s3), KVP_OK);
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutStartReq q = KVP__PUT_START_REQ__INIT;
    Kvp__PutStartItem it = KVP__PUT_START_ITEM__INIT, *items[1] = {&it};
    uint32_t avoid[2] = {s1, 999};
    it.key = "k";
    it.size = 1000;
    it.replica_num = 2;
    it.op_id = 1;
    q.n_items = 1;
    q.items = items;
    q.avoid_segments = avoid;
    q.n_avoid_segments = 2;
    c.now_wall_ms = 10;
    c.term = 3;
    c.feature_level = 2; /* as a level-2 leader logs it (actors/master/fsm/version.h) */
    c.body_case = KVP__COMMAND__BODY_PUT_START;
    c.put_start = &q;
    Kvp__Response *r = tf_apply(f, &c);
    assert_int_equal(r->put_start->results[0]->status, KVP_OK);
    assert_int_equal(r->put_start->results[0]->n_replicas, 2);
    for (size_t i = 0; i < 2; i++)
        assert_int_not_equal(r->put_start->results[0]->replicas[i]->segment_id, s1);
    kvp_master_fsm_response_free(r);
    /* three replicas wanted: the avoided segment is taken last rather than not at all */
    it.key = "k3";
    it.replica_num = 3;
    it.op_id = 2;
    r = tf_apply(f, &c);
    assert_int_equal(r->put_start->results[0]->status, KVP_OK);
    assert_int_equal(r->put_start->results[0]->n_replicas, 3);
    assert_int_equal(r->put_start->results[0]->replicas[2]->segment_id, s1);
    kvp_master_fsm_response_free(r);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_put_start_retry_same_op_same_replicas(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    assert_int_equal(tf_mount(f, "s1", "h1", MB, 1, NULL), KVP_OK);
    assert_int_equal(tf_mount(f, "s2", "h2", MB, 1, NULL), KVP_OK);
    struct tf_put p = {.key = "k", .size = 1000, .replica_num = 2, .op_id = 11};
    int st;
    Kvp__Response *r1 = tf_put_start_r(f, &p, 10, 0, &st);
    assert_int_equal(st, KVP_OK);
    Kvp__Response *r2 = tf_put_start_r(f, &p, 20, 0, &st);
    assert_int_equal(st, KVP_OK);
    Kvp__PutStartResult *a = r1->put_start->results[0], *b = r2->put_start->results[0];
    assert_int_equal(a->n_replicas, 2);
    assert_int_equal(b->n_replicas, 2);
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(a->replicas[i]->segment_id, b->replicas[i]->segment_id);
        assert_int_equal(a->replicas[i]->offset, b->replicas[i]->offset);
        assert_int_equal(a->replicas[i]->state, KVP__REPLICA_STATE__REPLICA_PENDING);
        assert_int_equal(a->replicas[i]->owner_pid, 4242);
        assert_string_not_equal(a->replicas[i]->endpoint, "");
    }
    kvp_master_fsm_response_free(r1);
    kvp_master_fsm_response_free(r2);
    struct kvp_master_fsm_stats stt;
    kvp_master_fsm_stats(f, &stt);
    assert_int_equal(stt.pending_puts, 1);
    assert_int_equal(stt.used_bytes, 2 * 1024); /* allocated once, not twice */
    /* A different writer: EXISTS while pending. */
    assert_int_equal(tf_put_start(f, "k", 1000, 2, 12, 30), KVP_ERR_EXISTS);
    assert_int_equal(tf_exists(f, "k"), 0);
    /* PutEnd: wrong op EXISTS, right op OK, retried OK, unknown NOT_FOUND, bad key INVALID. */
    assert_int_equal(tf_put_end(f, "k", 12, 5, 40), KVP_ERR_EXISTS);
    assert_int_equal(tf_put_end(f, "k", 11, 5, 40), KVP_OK);
    assert_int_equal(tf_put_end(f, "k", 11, 5, 41), KVP_OK);
    assert_int_equal(tf_put_end(f, "k", 12, 5, 41), KVP_ERR_EXISTS);
    assert_int_equal(tf_put_end(f, "nope", 11, 5, 41), KVP_ERR_NOT_FOUND);
    assert_int_equal(tf_put_end(f, "", 11, 5, 41), KVP_ERR_INVALID);
    assert_int_equal(tf_exists(f, "k"), 1);
    /* PutStart on a complete key: EXISTS, with the same op_id too. */
    assert_int_equal(tf_put_start(f, "k", 1000, 2, 11, 50), KVP_ERR_EXISTS);
    assert_int_equal(tf_put_start(f, "k", 1000, 2, 99, 50), KVP_ERR_EXISTS);
    kvp_master_fsm_stats(f, &stt);
    assert_int_equal(stt.pending_puts, 0);
    assert_int_equal(stt.objects, 1);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_put_revoke_quarantines_extents(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    assert_int_equal(tf_mount(f, "s1", "h1", MB, 1, NULL), KVP_OK);
    assert_int_equal(tf_put_start(f, "k", 100, 1, 5, 10), KVP_OK);
    assert_int_equal(tf_revoke(f, "k", 6, 11), KVP_ERR_NOT_FOUND); /* other writer */
    assert_int_equal(tf_revoke(f, "k", 5, 11), KVP_OK);
    assert_int_equal(tf_revoke(f, "k", 5, 12), KVP_ERR_NOT_FOUND); /* already gone */
    assert_int_equal(tf_revoke(f, "", 5, 12), KVP_ERR_INVALID);
    assert_int_equal(tf_put_end(f, "k", 5, 1, 12), KVP_ERR_NOT_FOUND);
    struct kvp_master_fsm_stats st;
    kvp_master_fsm_stats(f, &st);
    assert_int_equal(st.used_bytes, 0);
    assert_int_equal(st.quarantined_bytes, 128);
    assert_int_equal(st.pending_puts, 0);
    /* A complete object cannot be revoked. */
    assert_int_equal(tf_put(f, "c", 100, 1, 8, 13), KVP_OK);
    assert_int_equal(tf_revoke(f, "c", 8, 14), KVP_ERR_NOT_FOUND);
    assert_int_equal(tf_exists(f, "c"), 1);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_remove_and_evict_statuses(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    assert_int_equal(tf_mount(f, "s1", "h1", MB, 1, NULL), KVP_OK);
    assert_int_equal(tf_put(f, "a", 100, 1, 1, 1), KVP_OK);
    assert_int_equal(tf_put(f, "b", 100, 1, 2, 1), KVP_OK);
    assert_int_equal(tf_put_start(f, "p", 100, 1, 3, 1), KVP_OK);
    for (int evict = 0; evict < 2; evict++) {
        const char *k = evict ? "b" : "a";
        assert_int_equal(tf_remove(f, k, evict, 2), KVP_OK);
        assert_int_equal(tf_remove(f, k, evict, 2), KVP_ERR_NOT_FOUND);
        assert_int_equal(tf_remove(f, "p", evict, 2), KVP_ERR_BUSY);
        assert_int_equal(tf_remove(f, "", evict, 2), KVP_ERR_INVALID);
        assert_int_equal(tf_exists(f, k), 0);
    }
    struct kvp_master_fsm_stats st;
    kvp_master_fsm_stats(f, &st);
    assert_int_equal(st.quarantined_bytes, 256);
    assert_int_equal(st.used_bytes, 128);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_remove_all_counts_complete_only(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    assert_int_equal(tf_mount(f, "s1", "h1", MB, 1, NULL), KVP_OK);
    char k[32];
    for (int i = 0; i < 50; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        assert_int_equal(tf_put(f, k, 100 + i, 1, (uint64_t)i + 1, 1), KVP_OK);
    }
    assert_int_equal(tf_put_start(f, "pending", 100, 1, 99, 1), KVP_OK);
    assert_int_equal(tf_remove_all(f, 2), 50);
    assert_int_equal(tf_remove_all(f, 2), 0);
    struct kvp_master_fsm_stats st;
    kvp_master_fsm_stats(f, &st);
    assert_int_equal(st.objects, 0);
    assert_int_equal(st.pending_puts, 1);
    assert_int_equal(tf_put_end(f, "pending", 99, 1, 3), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

static uint32_t replica_seg(Kvp__Response *r, size_t i)
{
    return r->put_start->results[0]->replicas[i]->segment_id;
}

static void test_fsm_placement_distinct_hosts_then_segments(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    uint32_t s1, s2, s3, s4;
    assert_int_equal(tf_mount(f, "s1", "hostA", 1 * MB, 1, &s1), KVP_OK);
    assert_int_equal(tf_mount(f, "s2", "hostA", 2 * MB, 1, &s2), KVP_OK);
    assert_int_equal(tf_mount(f, "s3", "hostB", 1 * MB, 1, &s3), KVP_OK);
    assert_int_equal(tf_mount(f, "s4", "hostC", MB / 2, 1, &s4), KVP_OK);
    int st;
    struct tf_put p = {.key = "r3", .size = 1000, .replica_num = 3, .op_id = 1};
    Kvp__Response *r = tf_put_start_r(f, &p, 1, 0, &st);
    assert_int_equal(st, KVP_OK);
    assert_int_equal(r->put_start->results[0]->n_replicas, 3);
    /* Most free first (s2), then hostA is taken: s1 skipped for s3 (hostB), then s4 (hostC). */
    assert_int_equal(replica_seg(r, 0), s2);
    assert_int_equal(replica_seg(r, 1), s3);
    assert_int_equal(replica_seg(r, 2), s4);
    kvp_master_fsm_response_free(r);
    /* Four replicas: all hosts used, then the remaining segment (s1) on a repeated host. */
    p = (struct tf_put){.key = "r4", .size = 1000, .replica_num = 4, .op_id = 2};
    r = tf_put_start_r(f, &p, 1, 0, &st);
    assert_int_equal(r->put_start->results[0]->n_replicas, 4);
    assert_int_equal(replica_seg(r, 3), s1);
    kvp_master_fsm_response_free(r);
    /* More replicas than segments: as many as fit, status OK, never two on one segment. */
    p = (struct tf_put){.key = "r8", .size = 1000, .replica_num = 8, .op_id = 3};
    r = tf_put_start_r(f, &p, 1, 0, &st);
    assert_int_equal(st, KVP_OK);
    assert_int_equal(r->put_start->results[0]->n_replicas, 4);
    kvp_master_fsm_response_free(r);
    /* Only s4 too small for 700 KB: 3 replicas on s2, s3... ordered by free bytes. */
    p = (struct tf_put){.key = "big", .size = 700 * 1024, .replica_num = 4, .op_id = 4};
    r = tf_put_start_r(f, &p, 1, 0, &st);
    assert_int_equal(st, KVP_OK);
    assert_int_equal(r->put_start->results[0]->n_replicas, 3);
    assert_int_equal(replica_seg(r, 0), s2);
    assert_int_equal(replica_seg(r, 1), s3);
    assert_int_equal(replica_seg(r, 2), s1);
    kvp_master_fsm_response_free(r);
    /* replica_num 0 means 1. */
    p = (struct tf_put){.key = "one", .size = 10, .replica_num = 0, .op_id = 5};
    r = tf_put_start_r(f, &p, 1, 0, &st);
    assert_int_equal(r->put_start->results[0]->n_replicas, 1);
    kvp_master_fsm_response_free(r);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_preferred_segment_first_when_room(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    uint32_t s1, s2;
    assert_int_equal(tf_mount(f, "small", "hostA", 4096, 1, &s1), KVP_OK);
    assert_int_equal(tf_mount(f, "large", "hostB", MB, 1, &s2), KVP_OK);
    int st;
    struct tf_put p = {.key = "a", .size = 2048, .replica_num = 1, .op_id = 1,
                       .preferred = "small"};
    Kvp__Response *r = tf_put_start_r(f, &p, 1, 0, &st);
    assert_int_equal(replica_seg(r, 0), s1);
    kvp_master_fsm_response_free(r);
    p.key = "b";
    p.op_id = 2;
    p.size = 4096; /* no longer fits in "small": falls back */
    r = tf_put_start_r(f, &p, 1, 0, &st);
    assert_int_equal(st, KVP_OK);
    assert_int_equal(replica_seg(r, 0), s2);
    kvp_master_fsm_response_free(r);
    p.key = "c";
    p.op_id = 3;
    p.size = 10;
    p.preferred = "no-such-segment";
    r = tf_put_start_r(f, &p, 1, 0, &st);
    assert_int_equal(replica_seg(r, 0), s2);
    kvp_master_fsm_response_free(r);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_drain_steers_placement_and_reads(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    uint32_t s1, s2;
    assert_int_equal(tf_mount(f, "s1", "hostA", 2 * MB, 1, &s1), KVP_OK);
    assert_int_equal(tf_mount(f, "s2", "hostB", MB, 1, &s2), KVP_OK);
    assert_int_equal(tf_put(f, "k", 100, 2, 1, 1), KVP_OK);
    Kvp__Response *r = tf_get_replicas(f, "k", "hostB");
    Kvp__ObjectInfo *oi = r->get_replicas->objects[0];
    assert_int_equal(oi->status, KVP_OK);
    assert_int_equal(oi->n_replicas, 2);
    assert_int_equal(oi->replicas[0]->segment_id, s2); /* same host first */
    assert_int_equal(oi->replicas[0]->state, KVP__REPLICA_STATE__REPLICA_COMPLETE);
    assert_int_equal(oi->size, 100);
    assert_int_equal(oi->checksum, 0xC0FFEEull ^ 1);
    kvp_master_fsm_response_free(r);
    r = tf_get_replicas(f, "k", "hostA");
    assert_int_equal(r->get_replicas->objects[0]->replicas[0]->segment_id, s1);
    kvp_master_fsm_response_free(r);

    assert_int_equal(tf_drain(f, 0, "s1", 2), KVP_OK); /* by name */
    assert_int_equal(tf_drain(f, s1, NULL, 2), KVP_OK); /* again: fine */
    assert_int_equal(tf_drain(f, 42, NULL, 2), KVP_ERR_NOT_FOUND);
    assert_int_equal(tf_drain(f, 0, "ghost", 2), KVP_ERR_NOT_FOUND);
    assert_int_equal(tf_drain(f, 0, NULL, 2), KVP_ERR_NOT_FOUND);
    r = tf_get_replicas(f, "k", "hostA"); /* a DRAINING replica is hidden while an ACTIVE one exists (C4) */
    oi = r->get_replicas->objects[0];
    assert_int_equal(oi->n_replicas, 1);
    assert_int_equal(oi->replicas[0]->segment_id, s2);
    kvp_master_fsm_response_free(r);
    /* New puts avoid the draining segment even though it has more room. */
    int st;
    struct tf_put p = {.key = "n", .size = 100, .replica_num = 2, .op_id = 2};
    r = tf_put_start_r(f, &p, 3, 0, &st);
    assert_int_equal(r->put_start->results[0]->n_replicas, 1);
    assert_int_equal(replica_seg(r, 0), s2);
    kvp_master_fsm_response_free(r);
    /* Back to ACTIVE through SegmentState. */
    assert_int_equal(tf_seg_state(f, s1, KVP__SEGMENT_STATE__SEGMENT_ACTIVE, 4), KVP_OK);
    assert_int_equal(tf_put_start(f, "m", 100, 1, 3, 4), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

/* The repair epoch moves on what can create repair work and stays on the hot path (puts of
 * fully placed objects, removes), so the leader may skip its O(objects) scan. */
static void test_fsm_repair_epoch_moves_only_on_possible_work(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    uint64_t e = kvp_master_fsm_repair_epoch(f);
    assert_true(e != 0);
    uint32_t s1, s2;
    assert_int_equal(tf_mount(f, "s1", "hostA", 2 * MB, 1, &s1), KVP_OK);
    assert_true(kvp_master_fsm_repair_epoch(f) > e); /* a new segment: capped objects may grow */
    assert_int_equal(tf_mount(f, "s2", "hostB", 2 * MB, 1, &s2), KVP_OK);
    e = kvp_master_fsm_repair_epoch(f);
    assert_int_equal(tf_put(f, "full", 100, 2, 1, 1), KVP_OK); /* two copies, as wanted */
    assert_int_equal(tf_put_start(f, "p", 100, 1, 2, 1), KVP_OK);
    assert_int_equal(tf_revoke(f, "p", 2, 1), KVP_OK);
    assert_int_equal(tf_remove(f, "full", false, 2), KVP_OK);
    assert_int_equal(kvp_master_fsm_repair_epoch(f), e);
    /* wants 3, two segments: completed short of copies */
    assert_int_equal(tf_put(f, "short", 100, 3, 3, 3), KVP_OK);
    assert_true(kvp_master_fsm_repair_epoch(f) > e);
    e = kvp_master_fsm_repair_epoch(f);
    /* placed on s1, which starts draining before the put ends: the PutEnd bumps */
    assert_int_equal(tf_put_start(f, "late", 100, 2, 4, 4), KVP_OK);
    assert_int_equal(tf_drain(f, s1, NULL, 4), KVP_OK);
    assert_true(kvp_master_fsm_repair_epoch(f) > e);
    e = kvp_master_fsm_repair_epoch(f);
    assert_int_equal(tf_put_end(f, "late", 4, 7, 5), KVP_OK);
    assert_true(kvp_master_fsm_repair_epoch(f) > e);
    e = kvp_master_fsm_repair_epoch(f);
    assert_int_equal(tf_seg_lost(f, s1, 6), KVP_OK);
    assert_true(kvp_master_fsm_repair_epoch(f) > e);
    /* a restore never leaves the epoch where it was */
    e = kvp_master_fsm_repair_epoch(f);
    size_t len = 0;
    uint8_t *snap = tf_snapshot(f, &len);
    assert_int_equal(kvp_master_fsm_restore(f, snap, len), KVP_OK);
    free(snap);
    assert_true(kvp_master_fsm_repair_epoch(f) > e);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_segment_lost_drops_replicas_revokes_pending(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    uint32_t s1, s2;
    assert_int_equal(tf_mount(f, "s1", "hostA", 2 * MB, 1, &s1), KVP_OK);
    assert_int_equal(tf_mount(f, "s2", "hostB", MB, 1, &s2), KVP_OK);
    assert_int_equal(tf_put(f, "x", 100, 2, 1, 1), KVP_OK);     /* s1 + s2 */
    assert_int_equal(tf_put(f, "y", 100, 1, 2, 1), KVP_OK);     /* s1 (most free) */
    assert_int_equal(tf_put_start(f, "z", 100, 2, 3, 1), KVP_OK); /* pending on both */
    assert_int_equal(tf_seg_lost(f, s1, 10), KVP_OK);
    assert_int_equal(tf_exists(f, "x"), 1);
    assert_int_equal(tf_exists(f, "y"), 0);
    assert_int_equal(tf_put_end(f, "z", 3, 1, 11), KVP_ERR_NOT_FOUND); /* revoked */
    Kvp__Response *r = tf_get_replicas(f, "x", "hostA");
    assert_int_equal(r->get_replicas->objects[0]->n_replicas, 1);
    assert_int_equal(r->get_replicas->objects[0]->replicas[0]->segment_id, s2);
    kvp_master_fsm_response_free(r);
    struct kvp_master_fsm_stats st;
    kvp_master_fsm_stats(f, &st);
    assert_int_equal(st.segments, 1);
    assert_int_equal(st.capacity_bytes, MB);
    assert_int_equal(st.used_bytes, 128);        /* x on s2 */
    assert_int_equal(st.quarantined_bytes, 128); /* z's s2 replica */
    assert_int_equal(st.pending_puts, 0);
    assert_int_equal(tf_seg_lost(f, s1, 12), KVP_OK); /* repeat: no-op */
    assert_int_equal(tf_seg_lost(f, 99, 12), KVP_ERR_NOT_FOUND);
    assert_int_equal(tf_seg_state(f, s1, KVP__SEGMENT_STATE__SEGMENT_ACTIVE, 12),
                     KVP_ERR_INVALID);
    assert_int_equal(tf_seg_state(f, s2, 7, 12), KVP_ERR_INVALID);
    assert_int_equal(tf_seg_state(f, 99, KVP__SEGMENT_STATE__SEGMENT_ACTIVE, 12),
                     KVP_ERR_NOT_FOUND);
    assert_int_equal(tf_drain(f, s1, NULL, 12), KVP_ERR_NOT_FOUND);
    /* SegmentState LOST has the same effect. */
    assert_int_equal(tf_seg_state(f, s2, KVP__SEGMENT_STATE__SEGMENT_LOST, 13), KVP_OK);
    assert_int_equal(tf_exists(f, "x"), 0);
    kvp_master_fsm_stats(f, &st);
    assert_int_equal(st.segments, 0);
    assert_int_equal(st.objects, 0);
    /* Lost segments can be forgotten with unmount. */
    assert_int_equal(tf_unmount(f, s1, 14), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_unmount_drops_replicas(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    uint32_t s1, s2;
    assert_int_equal(tf_mount(f, "s1", "hostA", 2 * MB, 1, &s1), KVP_OK);
    assert_int_equal(tf_mount(f, "s2", "hostB", MB, 1, &s2), KVP_OK);
    assert_int_equal(tf_put(f, "x", 100, 2, 1, 1), KVP_OK);
    assert_int_equal(tf_put(f, "y", 100, 1, 2, 1), KVP_OK);
    assert_int_equal(tf_unmount(f, s1, 2), KVP_OK);
    assert_int_equal(tf_exists(f, "x"), 1);
    assert_int_equal(tf_exists(f, "y"), 0);
    assert_int_equal(tf_get_size(f, "x"), 100);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_quarantine_no_reuse_before_grace(void **state)
{
    (void)state;
    const uint64_t grace = 500;
    struct kvp_master_fsm *f = tf_new(grace, 5000);
    uint32_t s1;
    assert_int_equal(tf_mount(f, "s1", "h", 128, 1, &s1), KVP_OK); /* two 64-byte blocks */
    assert_int_equal(tf_put(f, "a", 64, 1, 1, 1000), KVP_OK);
    assert_int_equal(tf_put(f, "b", 64, 1, 2, 1000), KVP_OK);
    assert_int_equal(tf_remove(f, "a", false, 1000), KVP_OK);
    assert_int_equal(tf_put_start(f, "c", 64, 1, 3, 1001), KVP_ERR_NO_SPACE);
    assert_int_equal(tf_release(f, 1000 + grace - 1), 0);
    assert_int_equal(tf_put_start(f, "c", 64, 1, 3, 1001), KVP_ERR_NO_SPACE);
    /* A clock step back does not release early, nor make a later free release sooner. */
    assert_int_equal(tf_remove(f, "b", false, 900), KVP_OK);
    assert_int_equal(tf_release(f, 1000 + grace), 2); /* b's freed_at was clamped to 1000 */
    int st;
    struct tf_put p = {.key = "c", .size = 64, .replica_num = 1, .op_id = 3};
    Kvp__Response *r = tf_put_start_r(f, &p, 1600, 0, &st);
    assert_int_equal(st, KVP_OK);
    assert_int_equal(r->put_start->results[0]->replicas[0]->offset, 0);
    kvp_master_fsm_response_free(r);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    /* Grace larger than now: nothing is released. */
    assert_int_equal(tf_revoke(f, "c", 3, 1600), KVP_OK);
    struct kvp_master_fsm *g = tf_new(UINT64_MAX, 5000);
    assert_int_equal(tf_mount(g, "s1", "h", 128, 1, NULL), KVP_OK);
    assert_int_equal(tf_put(g, "a", 64, 1, 1, 1), KVP_OK);
    assert_int_equal(tf_remove(g, "a", false, 1), KVP_OK);
    assert_int_equal(tf_release(g, UINT64_MAX - 1), 0);
    kvp_master_fsm_destroy(&g);
    kvp_master_fsm_destroy(&f);
}

/* The lease horizon (docs/master.md "Leases and failover"): a leader commits a Remove or Evict
 * with now_wall_ms moved forward to horizon - fence_grace_ms. Those commands read their time
 * only as the freed-at time of what they quarantine: the space comes back at the horizon and
 * not before, on every member; nothing else of the state moves (a pending put keeps its
 * deadline, other objects stay). */
static void test_fsm_remove_evict_later_time_holds_quarantine(void **state)
{
    (void)state;
    const uint64_t grace = 500, horizon = 9000;
    struct kvp_master_fsm *f = tf_new(grace, 5000);
    assert_int_equal(tf_mount(f, "s1", "h", 256, 1, NULL), KVP_OK); /* four 64-byte blocks */
    assert_int_equal(tf_put(f, "a", 64, 1, 1, 1000), KVP_OK);
    assert_int_equal(tf_put(f, "b", 64, 1, 2, 1000), KVP_OK);
    assert_int_equal(tf_put(f, "c", 64, 1, 3, 1000), KVP_OK);
    assert_int_equal(tf_put_start(f, "p", 64, 1, 4, 1000), KVP_OK); /* deadline 1000 + 5000 */
    assert_int_equal(tf_remove(f, "a", false, horizon - grace), KVP_OK); /* Remove */
    assert_int_equal(tf_remove(f, "b", true, horizon - grace), KVP_OK);  /* Evict */
    assert_int_equal(tf_release(f, 1000 + grace), 0);
    assert_int_equal(tf_release(f, horizon - 1), 0);
    assert_int_equal(tf_exists(f, "c"), 1);
    assert_int_equal(tf_revoke_expired(f, 5999), 0); /* the pending put is still pending */
    assert_int_equal(tf_release(f, horizon), 2);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

/* Entries are released in time order, from the head (every member applies the same release,
 * whatever its version: version.h): one entry held far ahead (a pending put revoked long before
 * its deadline) holds the frees after it on that segment, and the late-quarantine figure (the
 * headroom rule, docs/eviction.md) counts them as late until then. */
static void test_fsm_quarantine_far_entry_holds_later_frees(void **state)
{
    (void)state;
    const uint64_t grace = 500;
    struct kvp_master_fsm *f = tf_new(grace, 5000);
    assert_int_equal(tf_mount(f, "s1", "h", 256, 1, NULL), KVP_OK); /* four 64-byte blocks */
    struct tf_put p = {.key = "a", .size = 64, .replica_num = 1, .op_id = 1};
    int st;
    kvp_master_fsm_response_free(tf_put_start_r(f, &p, 1000, 10000, &st)); /* deadline 11000 */
    assert_int_equal(st, KVP_OK);
    assert_int_equal(tf_put(f, "b", 64, 1, 2, 1000), KVP_OK);
    assert_int_equal(tf_put(f, "c", 64, 1, 3, 1000), KVP_OK);
    assert_int_equal(tf_put(f, "z", 64, 1, 7, 1000), KVP_OK); /* the pool is full */
    assert_int_equal(tf_revoke(f, "a", 1, 1100), KVP_OK);       /* freed at 11000 */
    assert_int_equal(tf_remove(f, "b", false, 1200), KVP_OK);   /* 1200, held to 11000 */
    assert_int_equal(tf_remove(f, "c", true, 1300), KVP_OK);    /* 1300, held to 11000 */
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 1200 + grace - 1), 3 * 64);
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 11000 + grace - 1), 3 * 64);
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 11000 + grace), 0);
    assert_int_equal(tf_release(f, 1300 + grace), 0);
    assert_int_equal(tf_put_start(f, "d", 64, 1, 4, 1900), KVP_ERR_NO_SPACE);
    assert_int_equal(tf_release(f, 11000 + grace - 1), 0);
    assert_int_equal(tf_release(f, 11000 + grace), 3);
    assert_int_equal(kvp_master_fsm_quarantine_late(f, 0), 0); /* nothing left */
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

/* The eviction scan reports the late part of the quarantine when asked (due_by_wall_ms), and
 * nothing when not asked (an older leader's scan, or a request without it). */
static void test_fsm_evict_scan_reports_late_quarantine(void **state)
{
    (void)state;
    const uint64_t grace = 500;
    struct kvp_master_fsm *f = tf_new(grace, 5000);
    assert_int_equal(tf_mount(f, "s1", "h", 256, 1, NULL), KVP_OK);
    assert_int_equal(tf_put(f, "b", 64, 1, 2, 1000), KVP_OK);
    assert_int_equal(tf_put(f, "c", 64, 1, 3, 1000), KVP_OK);
    assert_int_equal(tf_remove(f, "b", true, 1000), KVP_OK);  /* due at 1500 */
    assert_int_equal(tf_remove(f, "c", true, 8000), KVP_OK);  /* a horizon: due at 8500 */
    Kvp__Request q = KVP__REQUEST__INIT;
    Kvp__EvictScanReq sq = KVP__EVICT_SCAN_REQ__INIT;
    sq.high_watermark = 2.0; /* no list */
    q.body_case = KVP__REQUEST__BODY_EVICT_SCAN;
    q.evict_scan = &sq;
    Kvp__Response *r = tf_query(f, &q);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->evict_scan->quarantined_bytes, 128);
    assert_int_equal(r->evict_scan->quarantined_late_bytes, 0); /* not asked */
    kvp_master_fsm_response_free(r);
    sq.due_by_wall_ms = 1000 + 6200;
    r = tf_query(f, &q);
    assert_int_equal(r->evict_scan->quarantined_late_bytes, 64);
    assert_false(r->evict_scan->listed);
    kvp_master_fsm_response_free(r);
    kvp_master_fsm_destroy(&f);
}

/* A revoked pending put's space is reused only after its deadline + grace: its writer's
 * frames may land until the write deadline (C3). */
static void test_fsm_revoked_pending_quarantined_until_deadline(void **state)
{
    (void)state;
    const uint64_t grace = 500;
    struct kvp_master_fsm *f = tf_new(grace, 5000);
    assert_int_equal(tf_mount(f, "s1", "h", 64, 1, NULL), KVP_OK); /* one 64-byte block */
    struct tf_put p = {.key = "a", .size = 64, .replica_num = 1, .op_id = 1};
    int st;
    kvp_master_fsm_response_free(tf_put_start_r(f, &p, 1000, 10000, &st)); /* deadline 11000 */
    assert_int_equal(st, KVP_OK);
    assert_int_equal(tf_revoke(f, "a", 1, 1100), KVP_OK);
    assert_int_equal(tf_release(f, 1100 + grace + 1), 0);
    assert_int_equal(tf_release(f, 11000 + grace - 1), 0);
    assert_int_equal(tf_put_start(f, "b", 64, 1, 2, 11000 + grace - 1), KVP_ERR_NO_SPACE);
    assert_int_equal(tf_release(f, 11000 + grace), 1);
    assert_int_equal(tf_put_start(f, "b", 64, 1, 2, 11000 + grace), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_revoke_expired_after_deadline(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(100, 5000);
    assert_int_equal(tf_mount(f, "s1", "h", MB, 1, NULL), KVP_OK);
    int st;
    struct tf_put p = {.key = "short", .size = 100, .replica_num = 1, .op_id = 1};
    kvp_master_fsm_response_free(tf_put_start_r(f, &p, 1000, 100, &st)); /* deadline 1100 */
    assert_int_equal(tf_put_start(f, "default", 100, 1, 2, 1000), KVP_OK); /* 6000 */
    assert_int_equal(tf_put_start(f, "done", 100, 1, 3, 1000), KVP_OK);
    assert_int_equal(tf_put_end(f, "done", 3, 9, 1000), KVP_OK);
    assert_int_equal(tf_revoke_expired(f, 1100), 0);
    assert_int_equal(tf_revoke_expired(f, 1101), 1);
    assert_int_equal(tf_put_end(f, "short", 1, 9, 1102), KVP_ERR_NOT_FOUND);
    assert_int_equal(tf_revoke_expired(f, 6000), 0);
    assert_int_equal(tf_revoke_expired(f, 6001), 1);
    assert_int_equal(tf_exists(f, "done"), 1);
    struct kvp_master_fsm_stats s;
    kvp_master_fsm_stats(f, &s);
    assert_int_equal(s.pending_puts, 0);
    assert_int_equal(s.quarantined_bytes, 256);
    assert_int_equal(tf_release(f, 6101), 2);
    kvp_master_fsm_stats(f, &s);
    assert_int_equal(s.quarantined_bytes, 0);
    /* The key is free for a new writer. */
    assert_int_equal(tf_put(f, "short", 100, 1, 4, 7000), KVP_OK);
    assert_int_equal(kvp_master_fsm_check(f), 0);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_queries_exists_size_status(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    assert_int_equal(tf_mount(f, "s1", "hostA", MB, 1, NULL), KVP_OK);
    assert_int_equal(tf_mount(f, "s2", "hostB", MB, 1, NULL), KVP_OK);
    struct tf_put p = {.key = "pin", .size = 300, .replica_num = 1, .op_id = 1, .soft_pin = true};
    int st;
    kvp_master_fsm_response_free(tf_put_start_r(f, &p, 1, 0, &st));
    assert_int_equal(tf_put_end(f, "pin", 1, 77, 1), KVP_OK);
    assert_int_equal(tf_put_start(f, "pend", 10, 2, 2, 1), KVP_OK);
    assert_int_equal(tf_exists(f, "pin"), 1);
    assert_int_equal(tf_exists(f, "pend"), 0);
    assert_int_equal(tf_exists(f, "none"), 0);
    assert_int_equal(tf_exists(f, ""), KVP_ERR_INVALID);
    assert_int_equal(tf_get_size(f, "pin"), 300);
    assert_int_equal(tf_get_size(f, "pend"), KVP_ERR_NOT_FOUND);
    assert_int_equal(tf_get_size(f, "none"), KVP_ERR_NOT_FOUND);
    assert_int_equal(tf_get_size(f, ""), KVP_ERR_INVALID);
    Kvp__Response *bad = tf_get_replicas(f, "", NULL);
    assert_int_equal(bad->get_replicas->objects[0]->status, KVP_ERR_INVALID);
    kvp_master_fsm_response_free(bad);
    bad = tf_get_replicas(f, "none", NULL);
    assert_int_equal(bad->get_replicas->objects[0]->status, KVP_ERR_NOT_FOUND);
    kvp_master_fsm_response_free(bad);
    Kvp__Response *r = tf_get_replicas(f, "pend", NULL);
    assert_int_equal(r->get_replicas->objects[0]->status, KVP_ERR_NOT_FOUND);
    kvp_master_fsm_response_free(r);
    r = tf_get_replicas(f, "pin", NULL);
    assert_int_equal(r->get_replicas->objects[0]->checksum, 77);
    kvp_master_fsm_response_free(r);

    Kvp__Request q = KVP__REQUEST__INIT;
    Kvp__ClusterStatusReq cs = KVP__CLUSTER_STATUS_REQ__INIT;
    q.body_case = KVP__REQUEST__BODY_CLUSTER_STATUS;
    q.cluster_status = &cs;
    q.req_id = 31;
    r = tf_query(f, &q);
    assert_int_equal(r->req_id, 31);
    assert_int_equal(r->body_case, KVP__RESPONSE__BODY_CLUSTER_STATUS);
    json_error_t err;
    json_t *j = json_loads(r->cluster_status->json, 0, &err);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(j, "objects")), 1);
    assert_int_equal(json_integer_value(json_object_get(j, "pending_puts")), 1);
    assert_int_equal(json_integer_value(json_object_get(j, "capacity_bytes")), 2 * MB);
    assert_int_equal(json_integer_value(json_object_get(j, "used_bytes")), 320 + 128);
    assert_int_equal(json_integer_value(json_object_get(j, "quarantined_bytes")), 0);
    assert_int_equal(json_integer_value(json_object_get(j, "pinned_bytes")), 300);
    json_t *segs = json_object_get(j, "segments");
    assert_int_equal(json_array_size(segs), 2);
    json_t *s0 = json_array_get(segs, 0);
    assert_string_equal(json_string_value(json_object_get(s0, "name")), "s1");
    assert_string_equal(json_string_value(json_object_get(s0, "state")), "ACTIVE");
    assert_string_equal(json_string_value(json_object_get(s0, "host")), "hostA");
    assert_int_equal(json_integer_value(json_object_get(s0, "objects")), 2);
    assert_int_equal(json_integer_value(json_object_get(s0, "free_extents")), 1);
    assert_int_equal(json_integer_value(json_object_get(s0, "largest_free")), MB - 320 - 64);
    assert_non_null(json_object_get(s0, "endpoint"));
    assert_non_null(json_object_get(s0, "size"));
    assert_non_null(json_object_get(s0, "used"));
    assert_non_null(json_object_get(s0, "id"));
    json_decref(j);
    kvp_master_fsm_response_free(r);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_unknown_bodies_invalid(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__Response *r = (Kvp__Response *)1;
    assert_int_equal(kvp_master_fsm_apply(f, &c, &r), KVP_ERR_INVALID);
    assert_null(r);
    c.body_case = KVP__COMMAND__BODY_MOUNT; /* case set, message missing */
    assert_int_equal(kvp_master_fsm_apply(f, &c, &r), KVP_ERR_INVALID);
    assert_int_equal(kvp_master_fsm_apply(NULL, &c, &r), KVP_ERR_INVALID);
    Kvp__Request q = KVP__REQUEST__INIT;
    Kvp__PutStartReq ps = KVP__PUT_START_REQ__INIT;
    assert_int_equal(kvp_master_fsm_query(f, &q, &r), KVP_ERR_INVALID);
    q.body_case = KVP__REQUEST__BODY_PUT_START; /* a mutation is not a query */
    q.put_start = &ps;
    assert_int_equal(kvp_master_fsm_query(f, &q, &r), KVP_ERR_INVALID);
    assert_null(r);
    struct kvp_master_fsm *g = NULL;
    assert_int_equal(kvp_master_fsm_new(&g, NULL), KVP_ERR_INVALID);
    kvp_master_fsm_response_free(NULL);
    kvp_master_fsm_destroy(&f);
}

static void test_fsm_batch_put_start_per_item_status(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    assert_int_equal(tf_mount(f, "s1", "h", 4096, 1, NULL), KVP_OK);
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutStartReq q = KVP__PUT_START_REQ__INIT;
    Kvp__PutStartItem it[4], *items[4];
    const char *keys[4] = {"a", "", "a", "b"};
    uint64_t sizes[4] = {1000, 10, 1000, 5000};
    for (int i = 0; i < 4; i++) {
        kvp__put_start_item__init(&it[i]);
        it[i].key = (char *)keys[i];
        it[i].size = sizes[i];
        it[i].op_id = i == 2 ? 1 : (uint64_t)i + 1;
        items[i] = &it[i];
    }
    q.n_items = 4;
    q.items = items;
    c.now_wall_ms = 1;
    c.body_case = KVP__COMMAND__BODY_PUT_START;
    c.put_start = &q;
    Kvp__Response *r = tf_apply(f, &c);
    assert_int_equal(r->put_start->n_results, 4);
    assert_int_equal(r->put_start->results[0]->status, KVP_OK);
    assert_int_equal(r->put_start->results[1]->status, KVP_ERR_INVALID);
    assert_int_equal(r->put_start->results[2]->status, KVP_OK); /* same key + op: retry */
    assert_int_equal(r->put_start->results[2]->replicas[0]->offset,
                     r->put_start->results[0]->replicas[0]->offset);
    assert_int_equal(r->put_start->results[3]->status, KVP_ERR_TOO_LARGE);
    kvp_master_fsm_response_free(r);
    kvp_master_fsm_destroy(&f);
}

struct visit {
    int n, pinned;
    uint64_t bytes;
};

static void visit_cb(void *ctx, const char *key, uint64_t size, bool soft_pin)
{
    struct visit *v = ctx;
    assert_true(strncmp(key, "v", 1) == 0);
    v->n++;
    v->pinned += soft_pin;
    v->bytes += size;
}

static void test_fsm_foreach_object_visits_complete_only(void **state)
{
    (void)state;
    struct kvp_master_fsm *f = tf_new(1000, 5000);
    assert_int_equal(tf_mount(f, "s1", "h", MB, 1, NULL), KVP_OK);
    char k[16];
    for (int i = 0; i < 30; i++) {
        snprintf(k, sizeof(k), "v%d", i);
        struct tf_put p = {.key = k, .size = 10 + (uint64_t)i, .replica_num = 1,
                           .op_id = (uint64_t)i + 1, .soft_pin = i % 3 == 0};
        int st;
        kvp_master_fsm_response_free(tf_put_start_r(f, &p, 1, 0, &st));
        if (i < 20)
            assert_int_equal(tf_put_end(f, k, (uint64_t)i + 1, 0, 1), KVP_OK);
    }
    struct visit v = {0};
    kvp_master_fsm_foreach_object(f, visit_cb, &v);
    assert_int_equal(v.n, 20);
    assert_int_equal(v.pinned, 7);
    assert_int_equal(v.bytes, 20 * 10 + 19 * 20 / 2);
    struct kvp_master_fsm_stats st;
    kvp_master_fsm_stats(f, &st);
    assert_int_equal(st.pinned_bytes, 10 + 13 + 16 + 19 + 22 + 25 + 28);
    kvp_master_fsm_destroy(&f);
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fsm_mount_ids_monotonic_never_reused),
        cmocka_unit_test(test_fsm_remount_same_name_old_lost),
        cmocka_unit_test(test_fsm_mount_name_in_use_elsewhere_exists),
        cmocka_unit_test(test_fsm_put_start_huge_ttl_capped),
        cmocka_unit_test(test_fsm_put_start_bad_items_invalid),
        cmocka_unit_test(test_fsm_put_start_no_room_no_space),
        cmocka_unit_test(test_fsm_put_start_avoid_segments_placed_last),
        cmocka_unit_test(test_fsm_put_start_retry_same_op_same_replicas),
        cmocka_unit_test(test_fsm_put_revoke_quarantines_extents),
        cmocka_unit_test(test_fsm_remove_and_evict_statuses),
        cmocka_unit_test(test_fsm_remove_all_counts_complete_only),
        cmocka_unit_test(test_fsm_placement_distinct_hosts_then_segments),
        cmocka_unit_test(test_fsm_preferred_segment_first_when_room),
        cmocka_unit_test(test_fsm_drain_steers_placement_and_reads),
        cmocka_unit_test(test_fsm_segment_lost_drops_replicas_revokes_pending),
        cmocka_unit_test(test_fsm_unmount_drops_replicas),
        cmocka_unit_test(test_fsm_quarantine_no_reuse_before_grace),
        cmocka_unit_test(test_fsm_remove_evict_later_time_holds_quarantine),
        cmocka_unit_test(test_fsm_quarantine_far_entry_holds_later_frees),
        cmocka_unit_test(test_fsm_evict_scan_reports_late_quarantine),
        cmocka_unit_test(test_fsm_revoked_pending_quarantined_until_deadline),
        cmocka_unit_test(test_fsm_revoke_expired_after_deadline),
        cmocka_unit_test(test_fsm_queries_exists_size_status),
        cmocka_unit_test(test_fsm_unknown_bodies_invalid),
        cmocka_unit_test(test_fsm_batch_put_start_per_item_status),
        cmocka_unit_test(test_fsm_foreach_object_visits_complete_only),
        cmocka_unit_test(test_fsm_repair_epoch_moves_only_on_possible_work),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
