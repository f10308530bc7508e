/*
 * test_rdma_fence_writer.c — FenceWriter/Fenced between the master and an RDMA segment (issue 20,
 * docs/rdma.md "FenceWriter and Fenced"): the leader's record and release rule
 * (actors/master/service/fence_track.h), the segment's half (actors/segment/seg_rdma.h), and the
 * two together with the master FSM's quarantine over the verbs double:
 *
 *   a put's WRITE times out, its packets delayed past fence_grace_ms (only the segment-side
 *   fence can stop them); the put is revoked (or expires); the leader stamps its
 *   QuarantineRelease commands as fence_track says, the segment answers FenceWriter in its
 *   heartbeats (period longer than the grace), and a new put takes the same space as soon as the
 *   FSM gives it. The double's DMA audit log must show no byte placed in that space after it was
 *   reused, and the new bytes stay. A control run with the plain clock stamp (no hold) shows the
 *   late packets do land in reused space, so the scenario is real.
 *
 * Virtual time only (the double's clock): no sleeps, no timing asserts.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/master/service/fence_track.h"
#include "actors/master/service/service_state.h"
#include "kvpool.h"
#include "tests/lib/fence_rig.h"
#include "tests/unit/test_fsm_helpers.h"
#include "wire/envelope.h"

#define MS FENCE_RIG_MS
#define CLIENT_ID 42u

/* ------------------------------------------------------------------ the leader's record */

static void test_track_non_rdma_segment_never_holds(void **state)
{
    (void)state;
    struct kvp_fence_track t = {0};
    bool nomem = true;
    assert_int_equal(kvp_fence_track_heartbeat(&t, 3, false, 0, 0, &nomem), 0);
    assert_false(nomem);
    assert_int_equal(kvp_fence_track_note_failure(&t, 5000), 0);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 9000);
    kvp_fence_track_fini(&t);
}

static void test_track_hold_until_the_asked_seq_is_answered(void **state)
{
    (void)state;
    struct kvp_fence_track t = {0};
    uint32_t by = 99;
    /* first heard: asked at once, everything held (hold_from 0) */
    uint64_t s1 = kvp_fence_track_heartbeat(&t, 2, true, 0, 0, NULL);
    assert_true(s1 != 0);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, &by), 19);
    assert_int_equal(by, 2);
    /* answered: no hold */
    assert_int_equal(kvp_fence_track_heartbeat(&t, 2, true, s1, 0, NULL), 0);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, &by), 9000);
    assert_int_equal(by, 0);
    /* a failure at 5000: entries freed at >= 5000 wait (stamp 5019 releases freed_at <= 4999) */
    assert_int_equal(kvp_fence_track_note_failure(&t, 5000), 1);
    uint64_t s2 = kvp_fence_track_heartbeat(&t, 2, true, s1, 0, NULL);
    assert_true(s2 > s1);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 5019);
    assert_int_equal(kvp_fence_track_release_time(&t, 5010, 20, NULL, NULL, NULL), 5010);
    /* a second failure before the answer: the earlier hold stays, a new seq is asked; the old
     * seq's answer does not clear it */
    kvp_fence_track_note_failure(&t, 7000);
    uint64_t s3 = kvp_fence_track_heartbeat(&t, 2, true, s2, 0, NULL);
    assert_true(s3 > s2);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 5019);
    /* a failed fence is asked again under a new seq */
    uint64_t s4 = kvp_fence_track_heartbeat(&t, 2, true, s3, KVP_ERR_INTERNAL, NULL);
    assert_true(s4 > s3);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 5019);
    assert_int_equal(kvp_fence_track_heartbeat(&t, 2, true, s4, 0, NULL), 0);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 9000);
    assert_int_equal(t.acks, 2);
    kvp_fence_track_fini(&t);
}

static bool not_seg_5(void *ctx, uint32_t seg)
{
    (void)ctx;
    return seg != 5;
}

static void test_track_lost_segment_and_new_leader(void **state)
{
    (void)state;
    struct kvp_fence_track t = {0};
    uint64_t a = kvp_fence_track_heartbeat(&t, 5, true, 0, 0, NULL);
    uint64_t b = kvp_fence_track_heartbeat(&t, 700, true, 0, 0, NULL); /* grows the array */
    kvp_fence_track_heartbeat(&t, 5, true, a, 0, NULL);
    kvp_fence_track_heartbeat(&t, 700, true, b, 0, NULL);
    assert_int_equal(kvp_fence_track_note_failure(&t, 1000), 2);
    uint32_t by = 0;
    kvp_fence_track_heartbeat(&t, 700, true, b, 0, NULL);
    /* 700 answers the new seq; 5 never does and then is lost: it stops holding */
    uint64_t s700 = kvp_fence_track_heartbeat(&t, 700, true, b, 0, NULL);
    kvp_fence_track_heartbeat(&t, 700, true, s700, 0, NULL);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 30, NULL, NULL, &by), 1029);
    assert_int_equal(by, 5);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 30, not_seg_5, NULL, &by), 9000);
    assert_int_equal(kvp_fence_track_heartbeat(&t, 5, false, 0, 0, NULL), 0);
    /* a new leader: forgets; a segment heard again is asked, holding everything until answered */
    kvp_fence_track_reset(&t);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 30, NULL, NULL, NULL), 9000);
    uint64_t c = kvp_fence_track_heartbeat(&t, 700, true, s700, 0, NULL);
    assert_true(c != 0 && c != s700);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 30, NULL, NULL, NULL), 29);
    kvp_fence_track_fini(&t);
}

/* The service's glue (service_fence.c) on a bare service state (not the leader: an answered fence's
 * QuarantineRelease is not submitted): the answer carries FenceWriter while one is outstanding,
 * a failure asks again, the release time holds until answered, a lost segment stops holding and
 * an unknown segment is not recorded. */
static void test_service_glue(void **state)
{
    (void)state;
    struct kvp_master_service *s = calloc(1, sizeof *s);
    assert_non_null(s);
    snprintf(s->actor, sizeof s->actor, "master-test");
    s->cfg.fence_grace_ms = 500;
    s->segments_fresh_ms = 1;
    svc_map_init(&s->segments);
    assert_int_equal(svc_map_put(&s->segments, 4, KVP__SEGMENT_STATE__SEGMENT_ACTIVE + 1), KVP_OK);
    Kvp__HeartbeatReq hb = KVP__HEARTBEAT_REQ__INIT;
    Kvp__Fenced fd = KVP__FENCED__INIT;
    Kvp__HeartbeatResp hr = KVP__HEARTBEAT_RESP__INIT;
    Kvp__FenceWriter fw;
    hb.segment_id = 4;
    hb.rdma_writers = 1;
    svc_fence_on_heartbeat(s, 4, &hb);
    svc_fence_fill(s, 4, &hr, &fw);
    assert_non_null(hr.fence_writer);
    uint64_t seq = hr.fence_writer->seq;
    assert_true(seq != 0);
    assert_int_equal(hr.fence_writer->client_id, 0);
    assert_int_equal(svc_fence_release_time(s, 100000), 499);
    fd.seq = seq;
    hb.fenced = &fd;
    svc_fence_on_heartbeat(s, 4, &hb);
    hr.fence_writer = NULL;
    svc_fence_fill(s, 4, &hr, &fw);
    assert_null(hr.fence_writer);
    assert_int_equal(svc_fence_release_time(s, 100000), 100000);
    svc_fence_note_failure(s, 90000, "test");
    svc_fence_fill(s, 4, &hr, &fw);
    assert_non_null(hr.fence_writer);
    assert_true(hr.fence_writer->seq > seq);
    assert_int_equal(svc_fence_release_time(s, 100000), 90499);
    /* lost: no longer holds */
    assert_int_equal(svc_map_put(&s->segments, 4, KVP__SEGMENT_STATE__SEGMENT_LOST + 1), KVP_OK);
    assert_int_equal(svc_fence_release_time(s, 100000), 100000);
    /* unknown to the table: not recorded, nothing asked */
    hb.segment_id = 8;
    svc_fence_on_heartbeat(s, 8, &hb);
    hr.fence_writer = NULL;
    svc_fence_fill(s, 8, &hr, &fw);
    assert_null(hr.fence_writer);
    svc_map_fini(&s->segments);
    kvp_fence_track_fini(&s->fence);
    free(s);
}

/* The wire: a HeartbeatReq with Fenced and a HeartbeatResp with FenceWriter survive the codec. */
static void test_wire_heartbeat_fence_fields(void **state)
{
    (void)state;
    Kvp__Request rq = KVP__REQUEST__INIT;
    Kvp__HeartbeatReq hb = KVP__HEARTBEAT_REQ__INIT;
    Kvp__Fenced fd = KVP__FENCED__INIT;
    fd.seq = 77;
    fd.qps_fenced = 4;
    hb.segment_id = 9;
    hb.rdma_writers = 1;
    hb.fenced = &fd;
    rq.req_id = 1;
    rq.body_case = KVP__REQUEST__BODY_HEARTBEAT;
    rq.heartbeat = &hb;
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(kvp_wire_encode_request(&rq, &buf, &len), KVP_OK);
    Kvp__Request *d = NULL;
    assert_int_equal(kvp_wire_decode_request(buf, len, &d), KVP_OK);
    assert_true(d->heartbeat->rdma_writers);
    assert_non_null(d->heartbeat->fenced);
    assert_int_equal(d->heartbeat->fenced->seq, 77);
    assert_int_equal(d->heartbeat->fenced->qps_fenced, 4);
    kvp__request__free_unpacked(d, NULL);
    free(buf);

    Kvp__Response rs = KVP__RESPONSE__INIT;
    Kvp__HeartbeatResp hr = KVP__HEARTBEAT_RESP__INIT;
    Kvp__FenceWriter fw = KVP__FENCE_WRITER__INIT;
    fw.seq = 78;
    hr.fence_writer = &fw;
    rs.req_id = 1;
    rs.body_case = KVP__RESPONSE__BODY_HEARTBEAT;
    rs.heartbeat = &hr;
    assert_int_equal(kvp_wire_encode_response(&rs, &buf, &len), KVP_OK);
    Kvp__Response *e = NULL;
    assert_int_equal(kvp_wire_decode_response(buf, len, &e), KVP_OK);
    assert_non_null(e->heartbeat->fence_writer);
    assert_int_equal(e->heartbeat->fence_writer->seq, 78);
    assert_int_equal(e->heartbeat->fence_writer->client_id, 0);
    kvp__response__free_unpacked(e, NULL);
    free(buf);
}

/* ------------------------------------------------------------------ end to end on the double */

#define SEG_LEN 65536u
#define GRACE_MS 20u
#define HB_MS 50u     /* longer than the grace: only the hold keeps reuse after the fence */
#define TICK_MS 5u    /* the leader's QuarantineRelease timer */

struct e2e {
    struct fence_rig r;
    struct fv_node *nc;
    struct kvp_rdma_xport *cx;
    struct kvp_rdma_ep *ep;
    uint8_t *buf;
    bool hold;          /* false: the control run (QuarantineRelease stamped with the clock) */
    uint64_t held;      /* releases stamped earlier than the clock */
    uint64_t fences;    /* FenceWriters the segment ran */
};

/* One heartbeat round trip through the codec, as seg_heartbeat.c and service_soft.c run it;
 * a FenceWriter that ran is answered at once by a second heartbeat (as the actor does). */
static void beat(struct e2e *x)
{
    for (int round = 0; round < 2; round++) {
        Kvp__Request *d = fence_rig_heartbeat(&x->r, false);
        const Kvp__Fenced *f = d->heartbeat->fenced;
        uint64_t seq = kvp_fence_track_heartbeat(&x->r.track, d->heartbeat->segment_id, d->heartbeat->rdma_writers,
                                                 f ? f->seq : 0, f ? f->status : 0, NULL);
        kvp__request__free_unpacked(d, NULL);
        if (!fence_rig_fence_writer(&x->r, seq, NULL, 0))
            return;
        x->fences++;
    }
}

static void e2e_up(struct e2e *x, uint64_t seed, bool hold)
{
    memset(x, 0, sizeof *x);
    x->hold = hold;
    struct fv_node_config cc = {.name = "client", .n_devices = 1, .flush = (int)(seed % 3)};
    fence_rig_fabric(&x->r, seed, &cc, 1, &x->nc);
    struct kvp_rdma_cfg ccfg = {.ops = fv_node_ops(x->nc), .who = "client", .gid_index = -1, .qps_per_peer = 2,
                                .psn_seed = seed | 1, .sysfs_root = "/nonexistent"};
    assert_int_equal(kvp_rdma_open(&ccfg, &x->r.env, &x->cx), KVP_OK);
    x->buf = aligned_alloc(4096, SEG_LEN);
    assert_non_null(x->buf);
    fence_rig_segment(&x->r, seed, SEG_LEN, GRACE_MS);
    beat(x); /* first heard by the leader: one fence, answered */
    assert_int_equal(x->fences, 1);
    fence_rig_connect(&x->r, x->cx, CLIENT_ID, &x->ep); /* the client's endpoint: RdmaHello */
}

static void e2e_down(struct e2e *x)
{
    kvp_rdma_ep_free(&x->ep);
    kvp_rdma_close(&x->cx);
    fence_rig_down(&x->r);
    free(x->buf);
}

/* One put that fails with late WRITEs, then reuse of its space. Returns the bytes the audit log
 * saw placed in the reused space after its reuse. */
static size_t late_write_round(uint64_t seed, bool hold, bool expire)
{
    uint64_t rng = seed * 7919;
    struct e2e x;
    e2e_up(&x, seed, hold);
    /* the heartbeat phase: 0..HB_MS before the put */
    uint64_t hb_phase = fence_rig_mix(&rng) % HB_MS;
    fv_advance(x.r.f, hb_phase * MS);
    int st = 0;
    /* ttl 5 ms: the call's own timeout is 1..4 ms */
    uint64_t off = fence_rig_put_start(&x.r, "a", SEG_LEN, 1, 5, &st);
    assert_int_equal(st, KVP_OK);
    for (uint32_t i = 0; i < x.ep->n_qps; i++)
        fv_qp_set_delay(x.ep->q[i].qp, (GRACE_MS + 10) * MS + fence_rig_mix(&rng) % (50 * MS));
    memset(x.buf, 0xd1, SEG_LEN);
    struct kvp_rdma_slice s = {.local = x.buf, .len = SEG_LEN, .remote_offset = off, .op = KVP_RDMA_WRITE};
    assert_int_equal(kvp_rdma_run(x.cx, x.ep, &s, 1, 1 + (uint32_t)(fence_rig_mix(&rng) % 4)), KVP_ERR_TIMEOUT);
    if (!expire) { /* PutRevoke: the leader notes the failure, then commits the revoke */
        kvp_fence_track_note_failure(&x.r.track, fence_rig_wall(&x.r));
        assert_int_equal(tf_revoke(x.r.fsm, "a", 1, fence_rig_wall(&x.r)), KVP_OK);
    }
    /* run the leader's timers and the segment's heartbeats until a new put gets the space */
    uint64_t next_hb = hb_phase + HB_MS, t_ms = hb_phase, t_reuse = 0;
    for (int i = 0; i < 4000 && !t_reuse; i++) {
        fv_advance(x.r.f, 1 * MS);
        t_ms++;
        if (t_ms >= next_hb) {
            beat(&x);
            next_hb += HB_MS;
        }
        if (t_ms % TICK_MS)
            continue;
        if (expire && tf_revoke_expired(x.r.fsm, fence_rig_wall(&x.r)) > 0)
            kvp_fence_track_note_failure(&x.r.track, 0); /* as service_rpc.c: hold everything */
        uint64_t now = fence_rig_wall(&x.r), stamp = now;
        if (x.hold)
            stamp = kvp_fence_track_release_time(&x.r.track, now, GRACE_MS, NULL, NULL, NULL);
        x.held += stamp < now;
        tf_release(x.r.fsm, stamp);
        uint64_t off2 = fence_rig_put_start(&x.r, "b", SEG_LEN, 1, 30000, &st);
        if (st == KVP_OK) {
            assert_int_equal(off2, off); /* the segment holds one object: the same space */
            t_reuse = fv_now(x.r.f);
            memset(x.r.seg + off2, 0x0b, SEG_LEN); /* the new object's bytes */
        }
    }
    assert_true(t_reuse != 0);
    fv_run_idle(x.r.f, 3000 * MS); /* every late packet arrives or is dropped */
    size_t placed = fv_audit_placed_after(x.r.f, x.r.seg + off, SEG_LEN, t_reuse, NULL);
    if (hold) {
        for (size_t i = 0; i < SEG_LEN; i++)
            if (x.r.seg[off + i] != 0x0b)
                fail_msg("seed %llu (%s): byte %zu of reused space overwritten by a late WRITE",
                         (unsigned long long)seed, expire ? "expiry" : "revoke", i);
        if (placed)
            fail_msg("seed %llu (%s): %zu bytes placed in reused space after its reuse",
                     (unsigned long long)seed, expire ? "expiry" : "revoke", placed);
        assert_true(x.fences >= 2); /* the first-heard one and the failure's */
    }
    e2e_down(&x);
    return placed;
}

static void test_late_write_never_lands_in_reused_space(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= fence_rig_seeds(40); seed++)
        assert_int_equal(late_write_round(seed, true, seed % 2 == 0), 0);
}

/* Control: the same rounds with QuarantineRelease stamped by the clock alone (fence_grace_ms
 * only): some late WRITEs land in the reused space, so the test above can fail. */
static void test_control_grace_alone_lets_late_writes_land(void **state)
{
    (void)state;
    uint64_t landed = 0;
    for (uint64_t seed = 1; seed <= fence_rig_seeds(12); seed++)
        landed += late_write_round(seed, false, seed % 2 == 0) > 0;
    assert_true(landed > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_track_non_rdma_segment_never_holds),
        cmocka_unit_test(test_track_hold_until_the_asked_seq_is_answered),
        cmocka_unit_test(test_track_lost_segment_and_new_leader),
        cmocka_unit_test(test_service_glue),
        cmocka_unit_test(test_wire_heartbeat_fence_fields),
        cmocka_unit_test(test_late_write_never_lands_in_reused_space),
        cmocka_unit_test(test_control_grace_alone_lets_late_writes_land),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
