/*
 * test_rdma_fence_selector.c — the per-writer RDMA fence (issue 20, docs/rdma.md "Per-writer
 * fence"): a failed put's PutRevoke names its client's writers (writer_id / writer_mask), the
 * leader asks each RDMA segment to fence only those (FenceWriter.writers), and only segments whose
 * heartbeat says fence_selectors get such an ask (an older segment is asked to fence every
 * writer). Covered here:
 *
 *   - fence_track's merging: several pending per-writer fences on one segment, a fence of every
 *     writer absorbing them, the same writer failing twice, overflow, a segment that stops saying
 *     fence_selectors, and an answer to an older seq clearing only what that seq named;
 *   - the service glue on the wire form: a segment with the flag gets writers, one without gets
 *     client_id 0 and no writers (mixed versions), in the same failure;
 *   - end to end on the verbs double (virtual time): writer family A (two transfer actors) and
 *     writer B on one segment. A's put WRITEs time out with packets delayed past fence_grace_ms;
 *     A's PutRevoke fences A's QPs only, B's QPs stay up and B writes the reused space over its
 *     existing endpoint (0 reconnects). The DMA audit log shows no byte from A's QPs placed in
 *     the reused space after its reuse, and B's bytes stay. The same run toward a segment without
 *     the flag: every writer is fenced, B must reconnect (1), and the late WRITE still never lands.
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
#include "wire/rdma_hello.h"

#define MS FENCE_RIG_MS
#define FAM KVP_RDMA_WRITER_FAMILY_MASK
#define PA 0xa11ce00000000000ull /* client A's prefix */
#define PB 0xb0b0b00000000000ull /* client B's prefix */

/* What FenceWriter toward seg would say: its seq (0: none), and the selectors (n 0: every writer). */
static uint64_t asked(const struct kvp_fence_track *t, uint32_t seg, const struct kvp_fence_sel **sel,
                      uint32_t *n)
{
    uint64_t seq = 0;
    if (!kvp_fence_track_ask(t, seg, &seq, sel, n))
        return 0;
    return seq;
}

static bool names(const struct kvp_fence_sel *sel, uint32_t n, uint64_t id, uint64_t mask)
{
    for (uint32_t i = 0; i < n; i++)
        if (sel[i].client_id == (id & mask) && sel[i].mask == mask)
            return true;
    return false;
}

/* ------------------------------------------------------------------ fence_track merging */

/* One selective segment (3): the first-heard fence of every writer, answered; then A and B fail. */
static uint64_t track_up(struct kvp_fence_track *t)
{
    uint64_t s0 = kvp_fence_track_heartbeat_sel(t, 3, true, true, 0, 0, NULL);
    assert_true(s0 != 0);
    assert_int_equal(kvp_fence_track_heartbeat_sel(t, 3, true, true, s0, 0, NULL), 0);
    return s0;
}

static void test_merge_two_writers_answered_in_order(void **state)
{
    (void)state;
    struct kvp_fence_track t = {0};
    const struct kvp_fence_sel *sel = NULL;
    uint32_t n = 99;
    track_up(&t);
    assert_int_equal(kvp_fence_track_note_writer_failure(&t, 5000, PA | 5, FAM), 1);
    uint64_t sa = asked(&t, 3, &sel, &n);
    assert_true(sa != 0);
    assert_int_equal(n, 1);
    assert_true(names(sel, n, PA, FAM));
    /* B fails before A's fence is answered: one FenceWriter (a newer seq) names both */
    kvp_fence_track_note_writer_failure(&t, 6000, PB, FAM);
    uint64_t sb = asked(&t, 3, &sel, &n);
    assert_true(sb > sa);
    assert_int_equal(n, 2);
    assert_true(names(sel, n, PA, FAM) && names(sel, n, PB, FAM));
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 5019);
    /* the segment ran A's seq (it had not seen B's yet): A is cleared, B still holds from 6000 */
    assert_int_equal(kvp_fence_track_heartbeat_sel(&t, 3, true, true, sa, 0, NULL), sb);
    sel = NULL;
    assert_int_equal(asked(&t, 3, &sel, &n), sb);
    assert_int_equal(n, 1);
    assert_true(names(sel, n, PB, FAM));
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 6019);
    /* and B's: nothing held */
    assert_int_equal(kvp_fence_track_heartbeat_sel(&t, 3, true, true, sb, 0, NULL), 0);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 9000);
    kvp_fence_track_fini(&t);
}

static void test_merge_same_writer_twice_needs_the_newer_answer(void **state)
{
    (void)state;
    struct kvp_fence_track t = {0};
    const struct kvp_fence_sel *sel = NULL;
    uint32_t n = 0;
    track_up(&t);
    kvp_fence_track_note_writer_failure(&t, 5000, PA | 1, FAM);
    uint64_t s1 = asked(&t, 3, &sel, &n);
    /* A again (other low bits: the same family): one selector, a newer seq, the earlier hold */
    kvp_fence_track_note_writer_failure(&t, 7000, PA | 2, FAM);
    uint64_t s2 = asked(&t, 3, &sel, &n);
    assert_true(s2 > s1);
    assert_int_equal(n, 1);
    /* the fence of s1 may have run before the second failure's WRITEs: it does not clear A */
    assert_int_equal(kvp_fence_track_heartbeat_sel(&t, 3, true, true, s1, 0, NULL), s2);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 5019);
    /* a failed s2 is asked again under a newer seq, still A only */
    uint64_t s3 = kvp_fence_track_heartbeat_sel(&t, 3, true, true, s2, KVP_ERR_INTERNAL, NULL);
    assert_true(s3 > s2);
    assert_int_equal(asked(&t, 3, &sel, &n), s3);
    assert_int_equal(n, 1);
    assert_true(names(sel, n, PA, FAM));
    /* an echo above what this leader asked (an older leader's seq) answers nothing */
    assert_int_equal(kvp_fence_track_heartbeat_sel(&t, 3, true, true, s3 + 100, 0, NULL), s3);
    assert_int_equal(kvp_fence_track_heartbeat_sel(&t, 3, true, true, s3, 0, NULL), 0);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 9000);
    kvp_fence_track_fini(&t);
}

static void test_merge_fence_all_absorbs_and_holds_from_the_earliest(void **state)
{
    (void)state;
    struct kvp_fence_track t = {0};
    const struct kvp_fence_sel *sel = NULL;
    uint32_t n = 0;
    track_up(&t);
    kvp_fence_track_note_writer_failure(&t, 5000, PA, FAM);
    uint64_t sa = asked(&t, 3, &sel, &n);
    kvp_fence_track_note_writer_failure(&t, 6000, PB, FAM);
    /* an expired put (no writer known): every writer, holding from A's 5000 */
    kvp_fence_track_note_failure(&t, 8000);
    uint64_t sall = asked(&t, 3, &sel, &n);
    assert_int_equal(n, 0);
    assert_null(sel);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 5019);
    /* A's older answer clears nothing now (the fence of every writer has the newest seq) */
    assert_int_equal(kvp_fence_track_heartbeat_sel(&t, 3, true, true, sa, 0, NULL), sall);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 5019);
    /* a writer failing while every writer is asked: still every writer, a newer seq */
    kvp_fence_track_note_writer_failure(&t, 8500, PA, FAM);
    uint64_t s4 = asked(&t, 3, &sel, &n);
    assert_true(s4 > sall);
    assert_int_equal(n, 0);
    assert_int_equal(kvp_fence_track_heartbeat_sel(&t, 3, true, true, sall, 0, NULL), s4);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 5019);
    assert_int_equal(kvp_fence_track_heartbeat_sel(&t, 3, true, true, s4, 0, NULL), 0);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 9000);
    /* writer id or mask 0: every writer */
    kvp_fence_track_note_writer_failure(&t, 9100, 0, FAM);
    asked(&t, 3, &sel, &n);
    assert_int_equal(n, 0);
    kvp_fence_track_fini(&t);
}

static void test_merge_overflow_becomes_fence_all(void **state)
{
    (void)state;
    struct kvp_fence_track t = {0};
    const struct kvp_fence_sel *sel = NULL;
    uint32_t n = 0;
    track_up(&t);
    for (uint64_t i = 1; i <= KVP_FENCE_SELECTORS_MAX; i++) {
        kvp_fence_track_note_writer_failure(&t, 5000 + i, i << 32, FAM);
        asked(&t, 3, &sel, &n);
        assert_int_equal(n, i);
    }
    kvp_fence_track_note_writer_failure(&t, 6000, (uint64_t)(KVP_FENCE_SELECTORS_MAX + 1) << 32, FAM);
    uint64_t s = asked(&t, 3, &sel, &n);
    assert_int_equal(n, 0); /* every writer */
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 5020);
    assert_int_equal(kvp_fence_track_heartbeat_sel(&t, 3, true, true, s, 0, NULL), 0);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 9000);
    kvp_fence_track_fini(&t);
}

/* Mixed versions in the record: a segment without the flag is only asked for every writer, in
 * the same failure that asks a selective one for writer A; a segment that stops saying the flag
 * with selectors pending gets one fence of every writer under a new seq. */
static void test_merge_mixed_versions(void **state)
{
    (void)state;
    struct kvp_fence_track t = {0};
    const struct kvp_fence_sel *sel = NULL;
    uint32_t n = 0;
    track_up(&t);                                                   /* segment 3: selective */
    uint64_t o = kvp_fence_track_heartbeat_sel(&t, 4, true, false, 0, 0, NULL); /* 4: older */
    assert_int_equal(kvp_fence_track_heartbeat_sel(&t, 4, true, false, o, 0, NULL), 0);
    /* the old API is an older segment too */
    uint64_t o5 = kvp_fence_track_heartbeat(&t, 5, true, 0, 0, NULL);
    assert_int_equal(kvp_fence_track_heartbeat(&t, 5, true, o5, 0, NULL), 0);
    assert_int_equal(kvp_fence_track_note_writer_failure(&t, 5000, PA, FAM), 3);
    asked(&t, 3, &sel, &n);
    assert_int_equal(n, 1);
    assert_true(asked(&t, 4, &sel, &n) != 0);
    assert_int_equal(n, 0);
    assert_null(sel);
    assert_true(asked(&t, 5, &sel, &n) != 0);
    assert_int_equal(n, 0);
    /* segment 3 now says no flag (it was replaced by an older build under the same id) */
    uint64_t before = asked(&t, 3, &sel, &n);
    uint64_t after = kvp_fence_track_heartbeat_sel(&t, 3, true, false, before, 0, NULL);
    assert_true(after > before); /* its answer to `before` does not count: asked again */
    assert_int_equal(asked(&t, 3, &sel, &n), after);
    assert_int_equal(n, 0);
    assert_int_equal(kvp_fence_track_release_time(&t, 9000, 20, NULL, NULL, NULL), 5019);
    kvp_fence_track_fini(&t);
}

/* The service glue, on the wire form the segment decodes: the same PutRevoke-style failure asks
 * the flagged segment for writer A's family and the older one for every writer (client_id 0,
 * no writers). A new leadership starts its seqs above any wall-clock-older leader's. */
static void test_service_glue_mixed_versions(void **state)
{
    (void)state;
    struct kvp_master_service *s = calloc(1, sizeof *s);
    assert_non_null(s);
    snprintf(s->actor, sizeof s->actor, "master-test");
    s->cfg.fence_grace_ms = 500;
    s->segments_fresh_ms = 1;
    svc_map_init(&s->segments);
    assert_int_equal(svc_map_put(&s->segments, 4, KVP__SEGMENT_STATE__SEGMENT_ACTIVE + 1), KVP_OK);
    assert_int_equal(svc_map_put(&s->segments, 6, KVP__SEGMENT_STATE__SEGMENT_ACTIVE + 1), KVP_OK);
    for (uint32_t seg = 4; seg <= 6; seg += 2) {
        Kvp__HeartbeatReq hb = KVP__HEARTBEAT_REQ__INIT;
        Kvp__Fenced fd = KVP__FENCED__INIT;
        Kvp__HeartbeatResp hr = KVP__HEARTBEAT_RESP__INIT;
        Kvp__FenceWriter fw;
        hb.segment_id = seg;
        hb.rdma_writers = 1;
        hb.fence_selectors = seg == 4; /* 6 is an older segment */
        svc_fence_on_heartbeat(s, seg, &hb);
        svc_fence_fill(s, seg, &hr, &fw);
        assert_non_null(hr.fence_writer);
        assert_int_equal(hr.fence_writer->n_writers, 0); /* first heard: every writer */
        fd.seq = hr.fence_writer->seq;
        hb.fenced = &fd;
        svc_fence_on_heartbeat(s, seg, &hb);
    }
    assert_int_equal(svc_fence_release_time(s, 100000), 100000);
    svc_fence_note_writer_failure(s, 90000, PA | 77, FAM, "PutRevoke");
    for (uint32_t seg = 4; seg <= 6; seg += 2) {
        Kvp__Response rs = KVP__RESPONSE__INIT;
        Kvp__HeartbeatResp hr = KVP__HEARTBEAT_RESP__INIT;
        Kvp__FenceWriter fw;
        svc_fence_fill(s, seg, &hr, &fw);
        assert_non_null(hr.fence_writer);
        rs.req_id = 1;
        rs.body_case = KVP__RESPONSE__BODY_HEARTBEAT;
        rs.heartbeat = &hr;
        uint8_t *buf = NULL;
        size_t len = 0;
        assert_int_equal(kvp_wire_encode_response(&rs, &buf, &len), KVP_OK);
        Kvp__Response *d = NULL;
        assert_int_equal(kvp_wire_decode_response(buf, len, &d), KVP_OK);
        free(buf);
        const Kvp__FenceWriter *got = d->heartbeat->fence_writer;
        assert_non_null(got);
        assert_int_equal(got->client_id, 0); /* a segment that ignores writers fences all */
        if (seg == 4) {
            assert_int_equal(got->n_writers, 1);
            assert_int_equal(got->writers[0]->client_id, PA);
            assert_int_equal(got->writers[0]->mask, FAM);
        } else {
            assert_int_equal(got->n_writers, 0);
        }
        kvp__response__free_unpacked(d, NULL);
    }
    assert_int_equal(svc_fence_release_time(s, 100000), 90499);
    /* a new leadership: forgets, and its seqs start at term << 32, above every seq of an
     * earlier term's leader, whatever the clocks */
    uint64_t before = s->fence.last_seq;
    svc_fence_reset(s, 7);
    assert_true(s->fence.last_seq >= (7ull << 32));
    assert_true(s->fence.last_seq > before);
    svc_map_fini(&s->segments);
    kvp_fence_track_fini(&s->fence);
    free(s);
}

/* ------------------------------------------------------------------ end to end on the double */

#define OBJ 32768u
#define SEG_LEN (2 * OBJ)
#define GRACE_MS 20u
#define HB_MS 50u   /* longer than the grace: only the hold keeps reuse after the fence */
#define TICK_MS 5u  /* the leader's QuarantineRelease timer */
#define NW 3        /* writers: A's two transfer actors, B's one */

struct writer {
    struct fv_node *n;
    struct kvp_rdma_xport *x;
    struct kvp_rdma_ep *ep;
    uint64_t id;
    uint8_t *buf;
};

struct e2e {
    struct fence_rig r;
    struct fv_node *na, *nb;
    struct writer w[NW];
    bool old_segment;   /* the segment's heartbeat does not say fence_selectors */
    uint64_t fences;    /* FenceWriters the segment ran */
    uint64_t all_asks;  /* of them, with no writers (every writer) */
};

/* One heartbeat round trip through the codec, as seg_heartbeat.c and service_soft.c run it (the
 * leader's answer built as svc_fence_fill does); a FenceWriter that ran is answered at once. */
static void beat(struct e2e *x)
{
    for (int round = 0; round < 2; round++) {
        Kvp__Request *d = fence_rig_heartbeat(&x->r, x->old_segment);
        const Kvp__Fenced *f = d->heartbeat->fenced;
        kvp_fence_track_heartbeat_sel(&x->r.track, d->heartbeat->segment_id, d->heartbeat->rdma_writers,
                                      d->heartbeat->fence_selectors, f ? f->seq : 0, f ? f->status : 0, NULL);
        kvp__request__free_unpacked(d, NULL);
        uint64_t seq = 0;
        const struct kvp_fence_sel *sel = NULL;
        uint32_t n = 0;
        if (!kvp_fence_track_ask(&x->r.track, x->r.seg_id, &seq, &sel, &n))
            return;
        if (x->old_segment)
            assert_int_equal(n, 0); /* the leader falls back to every writer */
        if (!fence_rig_fence_writer(&x->r, seq, sel, n))
            return;
        x->fences++;
        x->all_asks += n == 0;
    }
}

static void connect_writer(struct e2e *x, struct writer *w) { fence_rig_connect(&x->r, w->x, w->id, &w->ep); }

static void e2e_up(struct e2e *x, uint64_t seed, bool old_segment)
{
    memset(x, 0, sizeof *x);
    x->old_segment = old_segment;
    const struct fv_node_config cc[2] = {{.name = "client-a", .n_devices = 1, .flush = (int)(seed % 3)},
                                         {.name = "client-b", .n_devices = 1}};
    struct fv_node *nodes[2];
    fence_rig_fabric(&x->r, seed, cc, 2, nodes);
    x->na = nodes[0];
    x->nb = nodes[1];
    const uint64_t ids[NW] = {PA | 0x11, PA | 0x22, PB | 0x33};
    for (int i = 0; i < NW; i++) {
        struct writer *w = &x->w[i];
        w->n = i < 2 ? x->na : x->nb;
        w->id = ids[i];
        struct kvp_rdma_cfg cfg = {.ops = fv_node_ops(w->n), .who = i < 2 ? "client-a" : "client-b",
                                   .gid_index = -1, .qps_per_peer = 2, .psn_seed = (seed + (uint64_t)i) | 1,
                                   .sysfs_root = "/nonexistent"};
        assert_int_equal(kvp_rdma_open(&cfg, &x->r.env, &w->x), KVP_OK);
        w->buf = aligned_alloc(4096, OBJ);
        assert_non_null(w->buf);
    }
    fence_rig_segment(&x->r, seed, SEG_LEN, GRACE_MS);
    beat(x); /* first heard by the leader: one fence of every writer, answered */
    assert_int_equal(x->fences, 1);
    for (int i = 0; i < NW; i++)
        connect_writer(x, &x->w[i]);
}

static void e2e_down(struct e2e *x)
{
    for (int i = 0; i < NW; i++) {
        kvp_rdma_ep_free(&x->w[i].ep);
        kvp_rdma_close(&x->w[i].x);
        free(x->w[i].buf);
    }
    fence_rig_down(&x->r);
}

static int write_obj(struct e2e *x, struct writer *w, uint64_t off, uint8_t byte, uint32_t timeout_ms)
{
    memset(w->buf, byte, OBJ);
    struct kvp_rdma_slice s = {.local = w->buf, .len = OBJ, .remote_offset = off, .op = KVP_RDMA_WRITE};
    return kvp_rdma_run(w->x, w->ep, &s, 1, timeout_ms);
}

static bool from_writer(const struct writer *w, uint32_t qp_num)
{
    for (uint32_t i = 0; w->ep && i < w->ep->n_qps; i++)
        if (w->ep->q[i].qp && w->ep->q[i].qp->qp_num == qp_num)
            return true;
    return false;
}

/* A's put fails with late WRITEs; A's PutRevoke names A's family; B then writes the reused space.
 * Returns B's reconnects. */
static uint64_t selector_round(uint64_t seed, bool old_segment)
{
    uint64_t rng = seed * 7919;
    struct e2e x;
    e2e_up(&x, seed, old_segment);
    struct writer *a1 = &x.w[0], *a2 = &x.w[1], *b = &x.w[2];
    uint32_t b_qps = kvp_seg_rdma_writer_qps(x.r.sr, b->id, UINT64_MAX, NULL);
    assert_true(b_qps > 0);
    uint64_t b_gen = kvp_rdma_ep_generation(b->ep);
    /* B stores an object first (it stays) */
    int st = 0;
    uint64_t off_b0 = fence_rig_put_start(&x.r, "b0", OBJ, 1, 30000, &st);
    assert_int_equal(st, KVP_OK);
    assert_int_equal(write_obj(&x, b, off_b0, 0xb0, 100), KVP_OK);
    assert_int_equal(tf_put_end(x.r.fsm, "b0", 1, 0, fence_rig_wall(&x.r)), KVP_OK);
    /* the heartbeat phase: 0..HB_MS before A's put */
    uint64_t hb_phase = fence_rig_mix(&rng) % HB_MS;
    fv_advance(x.r.f, hb_phase * MS);
    uint64_t off = fence_rig_put_start(&x.r, "a", OBJ, 2, 5, &st); /* ttl 5 ms: the call's timeout is 1..4 ms */
    assert_int_equal(st, KVP_OK);
    assert_true(off != off_b0);
    /* A's second actor is idle on its connection to the segment */
    for (uint32_t i = 0; i < a1->ep->n_qps; i++)
        fv_qp_set_delay(a1->ep->q[i].qp, (GRACE_MS + 10) * MS + fence_rig_mix(&rng) % (50 * MS));
    uint32_t a1_qpn[KVP_RDMA_HELLO_MAX_QPS], n_a1 = a1->ep->n_qps;
    for (uint32_t i = 0; i < n_a1; i++)
        a1_qpn[i] = a1->ep->q[i].qp->qp_num;
    assert_int_equal(write_obj(&x, a1, off, 0xd1, 1 + (uint32_t)(fence_rig_mix(&rng) % 4)), KVP_ERR_TIMEOUT);
    /* A's PutRevoke (batch_put.c): the leader notes A's family, then commits the revoke */
    kvp_fence_track_note_writer_failure(&x.r.track, fence_rig_wall(&x.r), a1->id & FAM, FAM);
    assert_int_equal(tf_revoke(x.r.fsm, "a", 2, fence_rig_wall(&x.r)), KVP_OK);
    uint64_t next_hb = hb_phase + HB_MS, t_ms = hb_phase, t_reuse = 0, reconnects = 0;
    for (int i = 0; i < 4000 && !t_reuse; i++) {
        fv_advance(x.r.f, 1 * MS);
        t_ms++;
        if (t_ms >= next_hb) {
            beat(&x);
            next_hb += HB_MS;
        }
        if (t_ms % TICK_MS)
            continue;
        uint64_t now = fence_rig_wall(&x.r);
        tf_release(x.r.fsm, kvp_fence_track_release_time(&x.r.track, now, GRACE_MS, NULL, NULL, NULL));
        uint64_t off2 = fence_rig_put_start(&x.r, "b1", OBJ, 3, 30000, &st);
        if (st != KVP_OK)
            continue;
        assert_int_equal(off2, off); /* A's space, reused */
        t_reuse = fv_now(x.r.f);
        /* the segment fenced A's family; B's QPs are up unless the segment fenced every writer */
        assert_int_equal(kvp_seg_rdma_writer_qps(x.r.sr, a1->id, UINT64_MAX, NULL), 0);
        assert_int_equal(kvp_seg_rdma_writer_qps(x.r.sr, a2->id, UINT64_MAX, NULL), 0);
        if (kvp_seg_rdma_writer_qps(x.r.sr, b->id, UINT64_MAX, NULL) != b_qps) {
            assert_int_equal(kvp_seg_rdma_writer_qps(x.r.sr, b->id, UINT64_MAX, NULL), 0);
            kvp_rdma_ep_free(&b->ep);
            connect_writer(&x, b);
            reconnects++;
        }
        assert_int_equal(write_obj(&x, b, off2, 0x0b, 100), KVP_OK);
        assert_int_equal(tf_put_end(x.r.fsm, "b1", 3, 0, fence_rig_wall(&x.r)), KVP_OK);
    }
    assert_true(t_reuse != 0);
    fv_run_idle(x.r.f, 3000 * MS); /* every late packet arrives or is dropped */
    /* no byte of A's placed in the reused space after its reuse; B's bytes stay, and B's first
     * object is untouched */
    const struct fv_dma *first = NULL;
    for (size_t i = 0; i < fv_audit_count(x.r.f); i++) {
        const struct fv_dma *d = fv_audit_get(x.r.f, i);
        if (d->t_ns <= t_reuse || d->addr + d->len <= (uintptr_t)(x.r.seg + off) ||
            d->addr >= (uintptr_t)(x.r.seg + off + OBJ))
            continue;
        for (uint32_t k = 0; k < n_a1; k++)
            if (d->qp_num == a1_qpn[k] && !first)
                first = d;
        if (!from_writer(b, d->qp_num) && !first)
            first = d;
    }
    if (first)
        fail_msg("seed %llu (%s segment): a WRITE not from B placed %zu B in reused space %llu ns after reuse",
                 (unsigned long long)seed, old_segment ? "older" : "selective", first->len,
                 (unsigned long long)(first->t_ns - t_reuse));
    for (size_t i = 0; i < OBJ; i++) {
        if (x.r.seg[off + i] != 0x0b)
            fail_msg("seed %llu: byte %zu of the reused space is not B's", (unsigned long long)seed, i);
        if (x.r.seg[off_b0 + i] != 0xb0)
            fail_msg("seed %llu: byte %zu of B's first object changed", (unsigned long long)seed, i);
    }
    assert_true(x.fences >= 2); /* the first-heard one and A's */
    if (!old_segment) {
        /* B kept its endpoint and its QPs on the segment: same generation, never fenced */
        assert_int_equal(kvp_rdma_ep_generation(b->ep), b_gen);
        assert_true(kvp_rdma_ep_live(b->ep));
        assert_int_equal(x.all_asks, 1); /* only the first-heard fence was of every writer */
    } else {
        assert_int_equal(x.all_asks, x.fences);
    }
    e2e_down(&x);
    return reconnects;
}

static void test_failed_writer_fenced_other_writer_stays(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= fence_rig_seeds(24); seed++)
        assert_int_equal(selector_round(seed, false), 0);
}

/* Mixed versions: toward a segment without fence_selectors, A's PutRevoke fences every writer
 * (B reconnects once), and the late WRITE still never lands in reused space. */
static void test_older_segment_gets_fence_all(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= fence_rig_seeds(12); seed++)
        assert_int_equal(selector_round(seed, true), 1);
}

/* The segment's half on its own: writers outside the selectors keep their QPs; a FenceWriter with
 * too many selectors fences every writer. */
static void test_segment_runs_selectors(void **state)
{
    (void)state;
    struct e2e x;
    e2e_up(&x, 5, false);
    Kvp__FenceWriter fw = KVP__FENCE_WRITER__INIT;
    Kvp__WriterSelector ws = KVP__WRITER_SELECTOR__INIT, *wp[KVP_SEG_FENCE_SELECTORS_MAX + 1];
    ws.client_id = x.w[2].id; /* B exactly (mask of every bit) */
    ws.mask = UINT64_MAX;
    wp[0] = &ws;
    fw.seq = 1000;
    fw.n_writers = 1;
    fw.writers = wp;
    uint32_t qa = kvp_seg_rdma_writer_qps(x.r.sr, x.w[0].id, UINT64_MAX, NULL);
    assert_true(kvp_seg_rdma_on_fence_writer(x.r.sr, &fw, &x.r.ack));
    assert_int_equal(x.r.ack.seq, 1000);
    assert_int_equal(kvp_seg_rdma_writer_qps(x.r.sr, x.w[2].id, UINT64_MAX, NULL), 0);
    assert_int_equal(kvp_seg_rdma_writer_qps(x.r.sr, x.w[0].id, UINT64_MAX, NULL), qa);
    assert_int_equal(kvp_seg_rdma_writer_qps(x.r.sr, x.w[1].id, UINT64_MAX, NULL), qa);
    /* the same seq again: not run twice */
    assert_false(kvp_seg_rdma_on_fence_writer(x.r.sr, &fw, &x.r.ack));
    /* more selectors than the bound: every writer (a NULL entry would be refused the same way) */
    for (int i = 0; i <= KVP_SEG_FENCE_SELECTORS_MAX; i++)
        wp[i] = &ws;
    fw.seq = 1001;
    fw.n_writers = KVP_SEG_FENCE_SELECTORS_MAX + 1;
    assert_true(kvp_seg_rdma_on_fence_writer(x.r.sr, &fw, &x.r.ack));
    assert_int_equal(x.r.ack.qps, 2 * qa);
    assert_int_equal(kvp_seg_rdma_writer_qps(x.r.sr, x.w[0].id, UINT64_MAX, NULL), 0);
    assert_int_equal(kvp_seg_rdma_writer_qps(x.r.sr, x.w[1].id, UINT64_MAX, NULL), 0);
    e2e_down(&x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_two_writers_answered_in_order),
        cmocka_unit_test(test_merge_same_writer_twice_needs_the_newer_answer),
        cmocka_unit_test(test_merge_fence_all_absorbs_and_holds_from_the_earliest),
        cmocka_unit_test(test_merge_overflow_becomes_fence_all),
        cmocka_unit_test(test_merge_mixed_versions),
        cmocka_unit_test(test_service_glue_mixed_versions),
        cmocka_unit_test(test_segment_runs_selectors),
        cmocka_unit_test(test_failed_writer_fenced_other_writer_stays),
        cmocka_unit_test(test_older_segment_gets_fence_all),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
