/*
 * test_rdma_fence.c — the rdma fencing building blocks (actors/transfer/rdma/rdma_wrid.h,
 * rdma_fence.h) against the verbs test double, over many seeds: generation-checked wr_ids,
 * CQ/QP credits, the requester-side fence (ERR + drain, or wedged: destroy + dereg within the
 * bound), the seed's timed-out READ, a late WRITE stopped only by the segment-side fence, a
 * frozen writer, and reconnect after a peer restart. Virtual time only.
 *
 * The rdma transport itself waits for the transport seam (issue 19); these tests drive the
 * pieces the way its batch actor will: post slices, reap, and on timeout fence.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "actors/transfer/rdma/rdma_fence.h"
#include "actors/transfer/rdma/rdma_wrid.h"
#include "kvpool.h"
#include "runtime/log.h"
#include "tests/lib/fakeverbs.h"
#include "tests/lib/fv_conn.h"

#define MS 1000000ull
#define US 1000ull
#define STEP_NS (100 * US)
#define BOUND_NS (1000 * MS) /* rdma_fence_bound_ms */

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- wr_id slots ---- */

static void test_rdma_wrid_encode_alloc_free_stale(void **state)
{
    (void)state;
    assert_int_equal(kvp_rdma_wrid_slot(kvp_rdma_wrid_encode(12345, 77)), 12345);
    assert_int_equal(kvp_rdma_wrid_gen(kvp_rdma_wrid_encode(12345, 77)), 77);
    assert_int_equal(kvp_rdma_wrid_gen(kvp_rdma_wrid_encode(1, 0x1ffffff)), 0xffffff);

    struct kvp_rdma_slots s;
    assert_int_equal(kvp_rdma_slots_init(&s, 0, 1), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_slots_init(NULL, 4, 1), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_slots_init(&s, KVP_RDMA_WRID_MAX_SLOTS + 1, 1), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_slots_init(&s, 3, 0), KVP_OK);
    int owner;
    uint64_t id[4];
    for (int i = 0; i < 3; i++)
        assert_int_equal(kvp_rdma_slot_alloc(&s, &owner, (uint64_t)i, &id[i]), KVP_OK);
    assert_int_equal(kvp_rdma_slot_alloc(&s, &owner, 9, &id[3]), KVP_ERR_BUSY);
    assert_int_equal(kvp_rdma_slots_used(&s), 3);
    assert_true(id[0] != 0); /* generation 0 is never issued */
    struct kvp_rdma_slot *sl = kvp_rdma_slot_lookup(&s, id[1]);
    assert_non_null(sl);
    assert_ptr_equal(sl->owner, &owner);
    assert_int_equal(sl->cookie, 1);
    assert_int_equal(kvp_rdma_slot_free(&s, id[1]), KVP_OK);
    assert_int_equal(kvp_rdma_slot_free(&s, id[1]), KVP_ERR_NOT_FOUND); /* double free */
    assert_null(kvp_rdma_slot_lookup(&s, id[1]));                        /* stale */
    uint64_t again;
    assert_int_equal(kvp_rdma_slot_alloc(&s, &owner, 5, &again), KVP_OK);
    assert_int_equal(kvp_rdma_wrid_slot(again), kvp_rdma_wrid_slot(id[1])); /* same slot */
    assert_true(again != id[1]);                                            /* new generation */
    assert_null(kvp_rdma_slot_lookup(&s, id[1]));
    assert_null(kvp_rdma_slot_lookup(&s, 0));
    assert_null(kvp_rdma_slot_lookup(&s, kvp_rdma_wrid_encode(3, 1))); /* out of range */
    assert_null(kvp_rdma_slot_lookup(&s, UINT64_MAX));
    assert_int_equal(s.stale, 6);
    kvp_rdma_slots_fini(&s);
    kvp_rdma_slots_fini(NULL);
}

static void test_rdma_wrid_generation_wraps_past_zero(void **state)
{
    (void)state;
    struct kvp_rdma_slots s;
    assert_int_equal(kvp_rdma_slots_init(&s, 1, KVP_RDMA_WRID_GEN_MASK), KVP_OK);
    uint64_t a, b;
    assert_int_equal(kvp_rdma_slot_alloc(&s, NULL, 0, &a), KVP_OK);
    assert_int_equal(kvp_rdma_wrid_gen(a), KVP_RDMA_WRID_GEN_MASK);
    assert_int_equal(kvp_rdma_slot_free(&s, a), KVP_OK);
    assert_int_equal(kvp_rdma_slot_alloc(&s, NULL, 0, &b), KVP_OK);
    assert_int_equal(kvp_rdma_wrid_gen(b), 1);
    kvp_rdma_slots_fini(&s);
}

/* ---- a call's view: one client QP on the double, slots, reaper ---- */

struct call {
    struct fv_pair x;
    struct kvp_rdma_slots slots;
    struct kvp_rdma_reaper r;
    struct kvp_rdma_cq cq;
    struct kvp_rdma_qp q;
    int n_ok, n_err, n_flush, n_late;
};

static void on_wc(void *arg, struct kvp_rdma_qp *q, uint64_t cookie, bool late,
                  const struct ibv_wc *wc)
{
    (void)q;
    (void)cookie;
    struct call *c = arg;
    if (wc->status == IBV_WC_SUCCESS)
        c->n_ok++;
    else if (wc->status == IBV_WC_WR_FLUSH_ERR)
        c->n_flush++;
    else
        c->n_err++;
    c->n_late += late;
}

static void call_up(struct call *c, const struct fv_config *fc, int flush,
                    const struct fv_qp_params *p, bool err_keeps_placing, size_t buf, size_t seg,
                    int cqe, uint32_t first_gen)
{
    memset(c, 0, sizeof *c);
    assert_int_equal(fv_pair_up(&c->x, fc, flush, p, buf, seg, cqe), 0);
    (void)err_keeps_placing;
    assert_int_equal(kvp_rdma_slots_init(&c->slots, 1024, first_gen), KVP_OK);
    c->r.ops = c->x.a.ops;
    c->r.slots = &c->slots;
    c->r.on_wc = on_wc;
    c->r.arg = c;
    c->r.who = "test";
    c->cq.cq = c->x.a.cq;
    c->cq.size = (uint32_t)c->x.a.cq->cqe;
    c->q.qp = c->x.qa;
    c->q.cq = &c->cq;
    c->q.max_send_wr = p && p->max_send_wr ? p->max_send_wr : 256;
}

static void call_down(struct call *c)
{
    kvp_rdma_slots_fini(&c->slots);
    fv_pair_down(&c->x);
}

static int post(struct call *c, enum ibv_wr_opcode op, size_t boff, size_t soff, uint32_t len,
                uint64_t cookie)
{
    struct ibv_send_wr wr;
    struct ibv_sge sge;
    fv_wr(&wr, &sge, op, 0, c->x.buf + boff, len, c->x.buf_mr ? c->x.buf_mr->lkey : 0,
          (uint64_t)(uintptr_t)(c->x.seg + soff), c->x.seg_mr->rkey);
    return kvp_rdma_post(&c->r, &c->q, &wr, cookie, NULL);
}

/* Fence c->q (and deregister the caller's MR if wedged), stepping the virtual clock; returns
 * the fence result and sets *t_ret to the time the "call" returns. */
static int fence_call(struct call *c, uint64_t *t_begin, uint64_t *t_ret)
{
    struct kvp_rdma_fence f;
    struct kvp_rdma_qp *qs[1] = {&c->q};
    struct ibv_mr *mrs[1] = {c->x.buf_mr};
    *t_begin = fv_now(c->x.f);
    assert_int_equal(kvp_rdma_fence_begin(&f, &c->r, qs, 1, mrs, 1, *t_begin, BOUND_NS), KVP_OK);
    while (!kvp_rdma_fence_step(&f, fv_now(c->x.f)))
        fv_advance(c->x.f, STEP_NS);
    *t_ret = fv_now(c->x.f);
    if (!mrs[0])
        c->x.buf_mr = NULL; /* deregistered by the wedged path */
    return f.result;
}

static void test_rdma_post_argument_errors(void **state)
{
    (void)state;
    struct call c;
    call_up(&c, NULL, FV_FLUSH_ALL, NULL, false, 4096, 4096, 64, 1);
    struct ibv_send_wr wr, wr2;
    struct ibv_sge sge;
    fv_wr(&wr, &sge, IBV_WR_SEND, 0, c.x.buf, 8, c.x.buf_mr->lkey, 0, 0);
    assert_int_equal(kvp_rdma_post(&c.r, &c.q, &wr, 0, NULL), KVP_ERR_INVALID);
    fv_wr(&wr, &sge, IBV_WR_RDMA_WRITE, 0, c.x.buf, 8, c.x.buf_mr->lkey,
          (uint64_t)(uintptr_t)c.x.seg, c.x.seg_mr->rkey);
    wr.next = &wr2;
    assert_int_equal(kvp_rdma_post(&c.r, &c.q, &wr, 0, NULL), KVP_ERR_INVALID);
    wr.next = NULL;
    assert_int_equal(kvp_rdma_post(NULL, &c.q, &wr, 0, NULL), KVP_ERR_INVALID);
    fv_node_fail_next(c.x.na, FV_OP_POST, EIO);
    assert_int_equal(kvp_rdma_post(&c.r, &c.q, &wr, 0, NULL), KVP_ERR_TRANSFER);
    assert_int_equal(kvp_rdma_slots_used(&c.slots), 0);
    assert_int_equal(c.q.outstanding, 0);
    wr.send_flags = 0; /* the helper signals every WR anyway */
    uint64_t id;
    assert_int_equal(kvp_rdma_post(&c.r, &c.q, &wr, 42, &id), KVP_OK);
    assert_true(wr.send_flags & IBV_SEND_SIGNALED);
    assert_int_equal(wr.wr_id, id);
    fv_run_idle(c.x.f, MS);
    assert_int_equal(kvp_rdma_reap(&c.r, &c.cq, 64), 1);
    assert_int_equal(c.n_ok, 1);
    assert_int_equal(c.q.outstanding, 0);
    assert_int_equal(kvp_rdma_reap(&c.r, NULL, 64), KVP_ERR_INVALID);
    c.q.state = KVP_RDMA_QP_FENCING;
    assert_int_equal(kvp_rdma_post(&c.r, &c.q, &wr, 0, NULL), KVP_ERR_CLOSED);
    call_down(&c);
}

/* Credits: two QPs share one CQ of 16; random posting and reaping never puts more than 16 WRs
 * in flight on it, so the double never overruns and every WR completes. */
static void test_rdma_cq_credits_never_exceed_cq_size(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 200; seed++) {
        struct fv_config fc = {.seed = seed, .jitter_ns = 10 * US};
        struct call c;
        call_up(&c, &fc, FV_FLUSH_ALL, NULL, false, 65536, 65536, 16, (uint32_t)seed);
        struct ibv_qp *qa2, *qb2;
        assert_int_equal(fv_connect(&c.x.a, &c.x.b, NULL, &qa2, &qb2), 0);
        struct kvp_rdma_qp q2 = {.qp = qa2, .cq = &c.cq, .max_send_wr = 8};
        uint64_t rng = seed;
        int posted = 0, busy = 0;
        for (int i = 0; i < 300; i++) {
            uint64_t v = mix(&rng);
            struct kvp_rdma_qp *q = (v & 1) ? &c.q : &q2;
            struct ibv_send_wr wr;
            struct ibv_sge sge;
            uint32_t len = 1 + (uint32_t)((v >> 8) % 4096);
            fv_wr(&wr, &sge, (v >> 4) & 1 ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE, 0, c.x.buf,
                  len, c.x.buf_mr->lkey, (uint64_t)(uintptr_t)c.x.seg, c.x.seg_mr->rkey);
            int rc = kvp_rdma_post(&c.r, q, &wr, 0, NULL);
            if (rc == KVP_OK)
                posted++;
            else
                assert_int_equal(rc, KVP_ERR_BUSY), busy++;
            assert_true(c.cq.outstanding <= c.cq.size);
            assert_true(q2.outstanding <= q2.max_send_wr);
            if (((v >> 20) & 3) == 0) {
                fv_advance(c.x.f, (v >> 24) % (50 * US));
                assert_true(kvp_rdma_reap(&c.r, &c.cq, (int)((v >> 40) % 8)) >= 0);
            }
        }
        fv_run_idle(c.x.f, 10 * MS);
        while (kvp_rdma_reap(&c.r, &c.cq, 64) > 0)
            ;
        struct fv_stats st;
        fv_stats_get(c.x.f, &st);
        assert_int_equal(st.cq_overruns, 0);
        assert_true(c.cq.high_water <= 16);
        assert_int_equal(c.n_ok, posted);
        assert_int_equal(c.cq.outstanding, 0);
        assert_true(busy > 0); /* the bound was actually reached */
        call_down(&c);
    }
}

/* ---- the seed's timed-out READ ---- */

/* A batch of READs into the caller's buffer times out while responses are still coming (or
 * still delayed); the call fences and returns; the caller writes new bytes into its buffer. No
 * byte may land in the buffer after the return, whatever the provider does with flushes. */
static void timed_out_read(uint64_t seed, int mode, bool keeps_placing)
{
    uint64_t rng = seed * 7919 + (uint64_t)mode;
    struct fv_config fc = {.seed = seed, .jitter_ns = 1 + mix(&rng) % (100 * US),
                           .ns_per_kib = 100 + mix(&rng) % 2000};
    struct call c;
    memset(&c, 0, sizeof c);
    /* the client node's provider behaviour */
    assert_int_equal(fv_fabric_new(&c.x.f, &fc), KVP_OK);
    struct fv_node_config ca = {.name = "client", .n_devices = 1, .flush = mode,
                                .err_keeps_placing = keeps_placing};
    struct fv_node_config cb = {.name = "segment", .n_devices = 1};
    assert_int_equal(fv_node_add(c.x.f, &ca, &c.x.na), KVP_OK);
    assert_int_equal(fv_node_add(c.x.f, &cb, &c.x.nb), KVP_OK);
    assert_int_equal(fv_end_open(fv_node_ops(c.x.na), 0, 256, &c.x.a), 0);
    assert_int_equal(fv_end_open(fv_node_ops(c.x.nb), 0, 256, &c.x.b), 0);
    struct fv_qp_params p = {.psn_a = (uint32_t)mix(&rng), .psn_b = (uint32_t)mix(&rng),
                             .access_b = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE};
    assert_int_equal(fv_connect(&c.x.a, &c.x.b, &p, &c.x.qa, &c.x.qb), 0);
    size_t len = 256 * 1024;
    c.x.buf_len = c.x.seg_len = len;
    c.x.buf = calloc(1, len);
    c.x.seg = malloc(len);
    assert_non_null(c.x.buf);
    assert_non_null(c.x.seg);
    memset(c.x.seg, 0x5a, len);
    c.x.buf_mr = c.x.a.ops->reg_mr(c.x.a.pd, c.x.buf, len, IBV_ACCESS_LOCAL_WRITE);
    c.x.seg_mr = c.x.b.ops->reg_mr(c.x.b.pd, c.x.seg, len,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    assert_non_null(c.x.buf_mr);
    assert_non_null(c.x.seg_mr);
    assert_int_equal(kvp_rdma_slots_init(&c.slots, 64, (uint32_t)seed), KVP_OK);
    c.r = (struct kvp_rdma_reaper){.ops = c.x.a.ops, .slots = &c.slots, .on_wc = on_wc, .arg = &c,
                                   .who = "test"};
    c.cq = (struct kvp_rdma_cq){.cq = c.x.a.cq, .size = 256};
    c.q = (struct kvp_rdma_qp){.qp = c.x.qa, .cq = &c.cq, .max_send_wr = 256};

    /* the segment's responses are late; with a provider whose ERR QP keeps placing, later
     * than the fence bound, so that only the wedged path's destroy + dereg can stop them */
    fv_qp_set_delay(c.x.qb, keeps_placing ? BOUND_NS + mix(&rng) % (500 * MS)
                                          : mix(&rng) % (20 * MS));
    uint32_t slice = 64 * 1024;
    int n = 0;
    for (size_t off = 0; off < len; off += slice, n++)
        assert_int_equal(post(&c, IBV_WR_RDMA_READ, off, off, slice, (uint64_t)n), KVP_OK);
    uint64_t deadline = fv_now(c.x.f) + MS + mix(&rng) % (10 * MS);
    while (fv_now(c.x.f) < deadline && c.n_ok < n) {
        fv_advance(c.x.f, STEP_NS);
        assert_true(kvp_rdma_reap(&c.r, &c.cq, 64) >= 0);
    }
    uint64_t t_begin = 0, t_ret = fv_now(c.x.f);
    int rc = KVP_OK;
    if (c.n_ok < n) {
        rc = fence_call(&c, &t_begin, &t_ret);
        if (mode == FV_FLUSH_NEVER) {
            assert_int_equal(rc, KVP_ERR_FENCE_FAILED);
            assert_true(t_ret - t_begin <= BOUND_NS + STEP_NS);
            assert_null(c.x.buf_mr); /* deregistered */
        } else {
            assert_int_equal(rc, KVP_OK);
            assert_int_equal(c.n_ok + c.n_flush + c.n_err, n);
            assert_true(t_ret - t_begin < 10 * MS);
        }
        assert_null(c.q.qp); /* destroyed either way */
        assert_int_equal(kvp_rdma_slots_used(&c.slots), 0);
        assert_int_equal(c.cq.outstanding, 0);
    }
    /* The call returned: the caller owns its buffer again and writes new bytes. */
    memset(c.x.buf, 0xee, len);
    fv_run_idle(c.x.f, 3000 * MS);
    const struct fv_dma *d;
    assert_int_equal(fv_audit_placed_after(c.x.f, c.x.buf, len, t_ret, &d), 0);
    for (size_t i = 0; i < len; i++)
        if (c.x.buf[i] != 0xee)
            fail_msg("seed %llu mode %d: byte %zu of the caller's buffer changed after return",
                     (unsigned long long)seed, mode, i);
    call_down(&c);
}

static void test_rdma_fence_timed_out_read_never_lands_after_return_500_seeds(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 500; seed++)
        timed_out_read(seed, (int)(seed % 3), false); /* ALL, NOT_LATE, ON_POLL */
}

/* A provider that never flushes, and whose ERR QP still places READ responses: the fence
 * returns within its bound (wedged), and nothing lands after the return because the QP was
 * destroyed and the MR deregistered. */
static void test_rdma_fence_never_flush_wedged_within_bound_no_dma_after(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 100; seed++)
        timed_out_read(seed, FV_FLUSH_NEVER, seed % 2 == 0);
}

/* Stale generations: a CQE for a WR of the wedged QP that turns up after the fence (injected
 * here) and a wr_id of a slot that was reused are counted and dropped, never delivered. */
static void test_rdma_fence_stale_wr_id_after_wedge_dropped(void **state)
{
    (void)state;
    struct call c;
    call_up(&c, NULL, FV_FLUSH_NEVER, NULL, false, 4096, 4096, 64, 9);
    fv_qp_set_delay(c.x.qb, 100 * MS);
    struct ibv_send_wr wr;
    struct ibv_sge sge;
    fv_wr(&wr, &sge, IBV_WR_RDMA_READ, 0, c.x.buf, 64, c.x.buf_mr->lkey,
          (uint64_t)(uintptr_t)c.x.seg, c.x.seg_mr->rkey);
    uint64_t old;
    assert_int_equal(kvp_rdma_post(&c.r, &c.q, &wr, 1, &old), KVP_OK);
    fv_advance(c.x.f, MS);
    uint64_t t0, t1;
    assert_int_equal(fence_call(&c, &t0, &t1), KVP_ERR_FENCE_FAILED);
    /* the slot is reused by a new WR on a new QP */
    struct ibv_qp *qa2, *qb2;
    assert_int_equal(fv_connect(&c.x.a, &c.x.b, NULL, &qa2, &qb2), 0);
    struct ibv_mr *mr2 = c.x.a.ops->reg_mr(c.x.a.pd, c.x.buf, 4096, IBV_ACCESS_LOCAL_WRITE);
    assert_non_null(mr2);
    struct kvp_rdma_qp q2 = {.qp = qa2, .cq = &c.cq, .max_send_wr = 16};
    fv_wr(&wr, &sge, IBV_WR_RDMA_READ, 0, c.x.buf, 64, mr2->lkey, (uint64_t)(uintptr_t)c.x.seg,
          c.x.seg_mr->rkey);
    uint64_t fresh;
    assert_int_equal(kvp_rdma_post(&c.r, &q2, &wr, 2, &fresh), KVP_OK);
    assert_int_equal(kvp_rdma_wrid_slot(fresh), kvp_rdma_wrid_slot(old));
    assert_true(fresh != old);
    struct ibv_wc late = {.wr_id = old, .status = IBV_WC_SUCCESS, .qp_num = 1234};
    fv_cq_inject(c.x.a.cq, &late);
    struct ibv_wc bad = {.wr_id = 0xdeadbeefcafeull, .status = IBV_WC_SUCCESS};
    fv_cq_inject(c.x.a.cq, &bad);
    int before = c.n_ok;
    fv_run_idle(c.x.f, MS);
    assert_int_equal(kvp_rdma_reap(&c.r, &c.cq, 64), 1); /* only the fresh one */
    assert_int_equal(c.n_ok, before + 1);
    assert_int_equal(c.r.stale_wc, 2);
    assert_int_equal(q2.outstanding, 0);
    call_down(&c);
}

/* A CQ in error (overrun: CQEs were lost) can never account for every WR, so the fence cannot
 * drain: it takes the wedged path at the bound (destroy + dereg) and says so. */
static void test_rdma_fence_cq_error_goes_wedged_at_bound(void **state)
{
    (void)state;
    struct call c;
    call_up(&c, NULL, FV_FLUSH_ALL, NULL, false, 4096, 4096, 4, 5);
    fv_qp_set_delay(c.x.qb, 50 * MS);
    assert_int_equal(post(&c, IBV_WR_RDMA_READ, 0, 0, 64, 0), KVP_OK);
    struct ibv_wc junk = {.wr_id = 0, .status = IBV_WC_SUCCESS};
    for (int i = 0; i < 5; i++) /* someone else's CQEs overrun the 4-entry CQ */
        fv_cq_inject(c.x.a.cq, &junk);
    uint64_t t0, t1;
    assert_int_equal(fence_call(&c, &t0, &t1), KVP_ERR_FENCE_FAILED);
    assert_true(t1 - t0 >= BOUND_NS && t1 - t0 <= BOUND_NS + STEP_NS);
    assert_true(c.r.cq_errors > 0);
    assert_true(c.cq.failed);
    assert_null(c.q.qp);
    assert_null(c.x.buf_mr);
    call_down(&c);
}

/* Completions that succeed while the QP is fencing are counted as late, not lost. */
static void test_rdma_fence_success_during_fence_counted_late(void **state)
{
    (void)state;
    struct call c;
    call_up(&c, NULL, FV_FLUSH_ALL, NULL, false, 65536, 65536, 64, 3);
    for (int i = 0; i < 4; i++)
        assert_int_equal(post(&c, IBV_WR_RDMA_WRITE, 0, (size_t)i * 4096, 4096, (uint64_t)i), KVP_OK);
    fv_advance(c.x.f, 200 * US); /* all done on the device, none polled yet */
    uint64_t t0, t1;
    assert_int_equal(fence_call(&c, &t0, &t1), KVP_OK);
    assert_int_equal(c.n_ok, 4);
    assert_int_equal(c.n_late, 4);
    assert_int_equal(c.r.late_ok, 4);
    call_down(&c);
}

static void test_rdma_fence_begin_argument_errors(void **state)
{
    (void)state;
    struct call c;
    call_up(&c, NULL, FV_FLUSH_ALL, NULL, false, 4096, 4096, 64, 1);
    struct kvp_rdma_fence f;
    struct kvp_rdma_qp *qs[2] = {&c.q, NULL};
    assert_int_equal(kvp_rdma_fence_begin(&f, &c.r, qs, 2, NULL, 0, 0, BOUND_NS), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_fence_begin(&f, NULL, qs, 1, NULL, 0, 0, BOUND_NS), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_fence_begin(&f, &c.r, NULL, 1, NULL, 0, 0, BOUND_NS), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_fence_begin(&f, &c.r, qs, 1, NULL, 1, 0, BOUND_NS), KVP_ERR_INVALID);
    /* an empty set is fenced at once */
    assert_int_equal(kvp_rdma_fence_begin(&f, &c.r, NULL, 0, NULL, 0, 0, BOUND_NS), KVP_OK);
    assert_int_equal(kvp_rdma_fence_step(&f, 0), 1);
    assert_int_equal(f.result, KVP_OK);
    call_down(&c);
}

/* ---- WRITE targets: the segment-side fence (L2) ---- */

/* A put's WRITE is held on the wire longer than fence_grace_ms. The writer fences (ERR, flush)
 * and its call returns; after the grace the master reuses the space for another object. Only
 * the segment-side fence (the segment's QP facing that writer to ERR and destroyed) stops the
 * late packets; without it they land in the reused space (the hazard is real in the model). */
static void late_write(uint64_t seed, bool segment_fence)
{
    uint64_t rng = seed * 104729;
    struct fv_config fc = {.seed = seed, .jitter_ns = 1 + mix(&rng) % (50 * US)};
    struct call c;
    struct fv_qp_params p = {.psn_a = (uint32_t)mix(&rng), .psn_b = (uint32_t)mix(&rng),
                             .access_b = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE};
    call_up(&c, &fc, (int)(mix(&rng) % 3), &p, false, 65536, 65536, 64, (uint32_t)seed);
    uint64_t grace = 20 * MS; /* fence_grace_ms for this test */
    fv_qp_set_delay(c.x.qa, grace + 10 * MS + mix(&rng) % (50 * MS));
    memset(c.x.buf, 0xd1, 65536);
    for (int i = 0; i < 4; i++)
        assert_int_equal(post(&c, IBV_WR_RDMA_WRITE, (size_t)i * 16384, (size_t)i * 16384, 16384,
                              (uint64_t)i), KVP_OK);
    fv_advance(c.x.f, MS + mix(&rng) % (5 * MS)); /* the put's timeout */
    uint64_t t0, t_ret;
    assert_int_equal(fence_call(&c, &t0, &t_ret), KVP_OK);
    assert_int_equal(c.n_flush, 4);
    uint64_t t_l2 = 0;
    if (segment_fence) {
        /* FenceWriter{client}: the segment moves its QP facing the client to ERR, destroys it */
        struct kvp_rdma_slots ss;
        assert_int_equal(kvp_rdma_slots_init(&ss, 4, 1), KVP_OK);
        struct kvp_rdma_reaper sr = {.ops = c.x.b.ops, .slots = &ss, .who = "segment"};
        struct kvp_rdma_cq scq = {.cq = c.x.b.cq, .size = 64};
        struct kvp_rdma_qp sq = {.qp = c.x.qb, .cq = &scq, .max_send_wr = 256};
        struct kvp_rdma_qp *sqs[1] = {&sq};
        struct kvp_rdma_fence sf;
        t_l2 = fv_now(c.x.f);
        assert_int_equal(kvp_rdma_fence_begin(&sf, &sr, sqs, 1, NULL, 0, t_l2, BOUND_NS), KVP_OK);
        assert_int_equal(kvp_rdma_fence_step(&sf, t_l2), 1);
        assert_int_equal(sf.result, KVP_OK);
        assert_null(sq.qp);
        kvp_rdma_slots_fini(&ss);
    }
    fv_run_until(c.x.f, t_ret + grace);
    uint64_t t_reuse = fv_now(c.x.f);
    memset(c.x.seg, 0x0b, 65536); /* another object's bytes in the reused space */
    fv_run_idle(c.x.f, 3000 * MS);
    size_t after = fv_audit_placed_after(c.x.f, c.x.seg, 65536, t_reuse, NULL);
    if (segment_fence) {
        assert_int_equal(fv_audit_placed_after(c.x.f, c.x.seg, 65536, t_l2, NULL), 0);
        for (size_t i = 0; i < 65536; i++)
            if (c.x.seg[i] != 0x0b)
                fail_msg("seed %llu: byte %zu of reused space overwritten by a late WRITE",
                         (unsigned long long)seed, i);
    } else {
        assert_true(after > 0);
    }
    call_down(&c);
}

static void test_rdma_fence_late_write_past_grace_stopped_by_segment_fence(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 200; seed++) {
        late_write(seed, true);
        late_write(seed, false);
    }
}

/* A frozen writer (SIGSTOP) cannot fence anything: its device keeps executing and retrying
 * its WRITEs. The segment-side fence at any time t stops every placement after t. */
static void test_rdma_fence_frozen_writer_stopped_by_segment_fence(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 200; seed++) {
        uint64_t rng = seed * 31337;
        struct fv_config fc = {.seed = seed, .jitter_ns = 1 + mix(&rng) % (20 * US)};
        struct call c;
        call_up(&c, &fc, FV_FLUSH_ALL, NULL, false, 65536, 65536, 64, (uint32_t)seed);
        fv_qp_set_delay(c.x.qa, mix(&rng) % (30 * MS));
        if (seed % 3 == 0)
            fv_node_partition(c.x.nb, true); /* packets lost: the device retransmits */
        for (int i = 0; i < 8; i++)
            assert_int_equal(post(&c, IBV_WR_RDMA_WRITE, (size_t)i * 8192, (size_t)i * 8192,
                                  8192, (uint64_t)i), KVP_OK);
        fv_node_freeze(c.x.na, true);
        fv_advance(c.x.f, mix(&rng) % (40 * MS));
        if (seed % 3 == 0)
            fv_node_partition(c.x.nb, false);
        uint64_t t_l2 = fv_now(c.x.f);
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
        assert_int_equal(c.x.b.ops->modify_qp(c.x.qb, &a, IBV_QP_STATE), 0);
        assert_int_equal(c.x.b.ops->destroy_qp(c.x.qb), 0);
        fv_run_idle(c.x.f, 3000 * MS);
        assert_int_equal(fv_audit_placed_after(c.x.f, c.x.seg, 65536, t_l2, NULL), 0);
        /* thawed, the writer finds its WRs completed (before the fence) or failed */
        fv_node_freeze(c.x.na, false);
        while (kvp_rdma_reap(&c.r, &c.cq, 64) > 0)
            ;
        assert_int_equal(c.n_ok + c.n_err + c.n_flush, 8);
        call_down(&c);
    }
}

/* ---- reconnect after a peer restart ---- */

static void test_rdma_fence_reconnect_after_peer_restart(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 50; seed++) {
        struct fv_config fc = {.seed = seed};
        struct call c;
        call_up(&c, &fc, FV_FLUSH_ALL, NULL, false, 65536, 65536, 64, 1);
        assert_int_equal(post(&c, IBV_WR_RDMA_WRITE, 0, 0, 4096, 0), KVP_OK);
        fv_run_idle(c.x.f, MS);
        assert_int_equal(kvp_rdma_reap(&c.r, &c.cq, 64), 1);
        fv_node_kill(c.x.nb); /* the segment process dies */
        uint64_t stale_id;
        struct ibv_send_wr wr;
        struct ibv_sge sge;
        fv_wr(&wr, &sge, IBV_WR_RDMA_WRITE, 0, c.x.buf, 64, c.x.buf_mr->lkey,
              (uint64_t)(uintptr_t)c.x.seg, c.x.seg_mr->rkey);
        assert_int_equal(kvp_rdma_post(&c.r, &c.q, &wr, 1, &stale_id), KVP_OK);
        uint64_t t0 = fv_now(c.x.f);
        while (c.n_err == 0) {
            fv_advance(c.x.f, MS);
            assert_true(kvp_rdma_reap(&c.r, &c.cq, 64) >= 0);
            assert_true(fv_now(c.x.f) - t0 < 1000 * MS);
        }
        assert_true(fv_now(c.x.f) - t0 >= 8 * fv_ack_timeout_ns(14)); /* ~0.54 s */
        uint64_t tb, tr;
        assert_int_equal(fence_call(&c, &tb, &tr), KVP_OK); /* already ERR: drains at once */
        assert_int_equal(tr, tb);
        /* restart: a new process, new QPs, new PSNs; the actor's one slot table goes on (its
         * generations only move forward, so the old wr_id cannot be issued again) */
        struct fv_node *nb2;
        struct fv_node_config cb = {.name = "segment-2", .n_devices = 1};
        assert_int_equal(fv_node_add(c.x.f, &cb, &nb2), KVP_OK);
        struct fv_end b2;
        assert_int_equal(fv_end_open(fv_node_ops(nb2), 0, 64, &b2), 0);
        uint8_t *seg2 = calloc(1, 4096);
        struct ibv_mr *smr2 = b2.ops->reg_mr(b2.pd, seg2, 4096,
                                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        assert_non_null(smr2);
        struct fv_qp_params p = {.psn_a = (uint32_t)(seed * 7777), .psn_b = (uint32_t)(seed * 31),
                                 .access_b = IBV_ACCESS_REMOTE_WRITE};
        struct ibv_qp *qa2, *qb2;
        assert_int_equal(fv_connect(&c.x.a, &b2, &p, &qa2, &qb2), 0);
        struct kvp_rdma_reaper r2 = c.r;
        struct kvp_rdma_qp q2 = {.qp = qa2, .cq = &c.cq, .max_send_wr = 16};
        memset(c.x.buf, 0x42, 64);
        fv_wr(&wr, &sge, IBV_WR_RDMA_WRITE, 0, c.x.buf, 64, c.x.buf_mr->lkey,
              (uint64_t)(uintptr_t)seg2, smr2->rkey);
        uint64_t id2;
        assert_int_equal(kvp_rdma_post(&r2, &q2, &wr, 7, &id2), KVP_OK);
        assert_true(id2 != stale_id);
        assert_null(kvp_rdma_slot_lookup(c.r.slots, stale_id));
        struct ibv_wc stale = {.wr_id = stale_id, .status = IBV_WC_SUCCESS};
        fv_cq_inject(c.x.a.cq, &stale);
        int ok = c.n_ok;
        fv_run_idle(c.x.f, MS);
        assert_int_equal(kvp_rdma_reap(&r2, &c.cq, 64), 1);
        assert_int_equal(c.n_ok, ok + 1);
        assert_int_equal(r2.stale_wc, c.r.stale_wc + 1);
        assert_int_equal(seg2[0], 0x42);
        free(seg2);
        call_down(&c);
    }
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rdma_wrid_encode_alloc_free_stale),
        cmocka_unit_test(test_rdma_wrid_generation_wraps_past_zero),
        cmocka_unit_test(test_rdma_post_argument_errors),
        cmocka_unit_test(test_rdma_cq_credits_never_exceed_cq_size),
        cmocka_unit_test(test_rdma_fence_timed_out_read_never_lands_after_return_500_seeds),
        cmocka_unit_test(test_rdma_fence_never_flush_wedged_within_bound_no_dma_after),
        cmocka_unit_test(test_rdma_fence_stale_wr_id_after_wedge_dropped),
        cmocka_unit_test(test_rdma_fence_cq_error_goes_wedged_at_bound),
        cmocka_unit_test(test_rdma_fence_success_during_fence_counted_late),
        cmocka_unit_test(test_rdma_fence_begin_argument_errors),
        cmocka_unit_test(test_rdma_fence_late_write_past_grace_stopped_by_segment_fence),
        cmocka_unit_test(test_rdma_fence_frozen_writer_stopped_by_segment_fence),
        cmocka_unit_test(test_rdma_fence_reconnect_after_peer_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
