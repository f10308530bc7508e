/*
 * test_rdma_xport.c — the rdma transport (actors/transfer/rdma/rdma_xport.h) end to end on the
 * verbs double: a client transport and a segment transport on one simulated fabric, connected
 * through the RdmaHello handshake (the bytes go through the wire codec), moving slices with the
 * non-blocking core driven as the transfer engine drives a transport (kvp_rdma_run: post,
 * progress, fence at the timeout, abort at the fence bound). Issue 20's fencing cases over many
 * seeds, with the double's DMA audit log as the judge: "no byte placed in this range after the
 * call returned / after the segment fenced the writer". Virtual time only: no sleeps.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "actors/transfer/rdma/rdma_xport_internal.h"
#include "kvpool.h"
#include "runtime/log.h"
#include "tests/lib/fakeverbs.h"
#include "wire/rdma_hello.h"

#define MS 1000000ull
#define US 1000ull
#define CLIENT_ID 42u
#define SEG_ID 7u

/* Seeds per case; KVP_RDMA_SEED_SCALE=k runs k times as many (the defaults keep the suite at a
 * few seconds on CI's 2 cores). */
static uint64_t seeds(uint64_t n)
{
    const char *e = getenv("KVP_RDMA_SEED_SCALE");
    long k = e ? atol(e) : 1;
    return n * (uint64_t)(k > 0 ? k : 1);
}

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct fx {
    struct fv_fabric *f;
    struct fv_node *nc, *ns;
    struct kvp_rdma_xport *cx, *sx;
    struct kvp_rdma_env env;
    uint8_t *seg, *buf, *buf2;
    size_t seg_len, buf_len;
    struct kvp_rdma_ep *ep;
    void (*hook)(struct fx *);
    int hook_fired;
    uint64_t t_hook;
    int hook_ok;
};

static uint64_t env_now(void *a) { return fv_now(((struct fx *)a)->f); }
static void env_wait(void *a, uint64_t ns)
{
    struct fx *x = a;
    if (x->hook && !x->hook_fired) {
        x->hook_fired = 1;
        x->hook(x);
    }
    fv_advance(x->f, ns ? ns : US);
}

struct fx_opts {
    uint64_t seed;
    int flush;                /* client provider */
    bool keeps_placing;
    uint64_t max_mr_size;     /* both sides; 0 = default */
    uint32_t qps, cq, slice;
    uint32_t bound_ms;
    int client_devs;
    const struct kvp_rdma_cuda *cuda;
    const char *sysfs;
};

static void fx_up(struct fx *x, const struct fx_opts *o)
{
    memset(x, 0, sizeof *x);
    struct fv_config fc = {.seed = o->seed, .jitter_ns = 1 + o->seed % (30 * US)};
    assert_int_equal(fv_fabric_new(&x->f, &fc), KVP_OK);
    struct fv_node_config cc = {.name = "client", .n_devices = o->client_devs ? o->client_devs : 1,
                                .flush = o->flush, .err_keeps_placing = o->keeps_placing,
                                .max_mr_size = o->max_mr_size};
    struct fv_node_config sc = {.name = "segment", .n_devices = 1, .max_mr_size = o->max_mr_size};
    assert_int_equal(fv_node_add(x->f, &cc, &x->nc), KVP_OK);
    assert_int_equal(fv_node_add(x->f, &sc, &x->ns), KVP_OK);
    x->env = (struct kvp_rdma_env){.now_ns = env_now, .wait = env_wait, .arg = x};
    struct kvp_rdma_cfg ccfg = {.ops = fv_node_ops(x->nc), .who = "client", .gid_index = -1,
                                .qps_per_peer = o->qps, .cq_size = o->cq, .slice_bytes = o->slice,
                                .fence_bound_ms = o->bound_ms, .psn_seed = o->seed | 1,
                                .cuda = o->cuda, .sysfs_root = o->sysfs ? o->sysfs : "/nonexistent"};
    assert_int_equal(kvp_rdma_open(&ccfg, &x->env, &x->cx), KVP_OK);
    struct kvp_rdma_cfg scfg = {.ops = fv_node_ops(x->ns), .who = "segment", .gid_index = -1,
                                .segment = true, .psn_seed = o->seed * 3 + 1,
                                .sysfs_root = "/nonexistent"};
    assert_int_equal(kvp_rdma_open(&scfg, &x->env, &x->sx), KVP_OK);
    x->seg_len = 1 << 20;
    x->buf_len = 1 << 20;
    x->seg = aligned_alloc(4096, x->seg_len);
    x->buf = aligned_alloc(4096, x->buf_len);
    x->buf2 = aligned_alloc(4096, x->buf_len);
    assert_non_null(x->seg);
    memset(x->seg, 0x5a, x->seg_len);
    memset(x->buf, 0, x->buf_len);
    memset(x->buf2, 0, x->buf_len);
    assert_int_equal(kvp_rdma_seg_register(x->sx, SEG_ID, x->seg, x->seg_len, NULL), KVP_OK);
}

/* The handshake: offer -> accept -> complete, through the wire codec. */
static int fx_connect(struct fx *x, struct kvp_rdma_ep **ep)
{
    uint8_t *offer = NULL, *ans = NULL;
    size_t ol = 0, al = 0;
    int rc = kvp_rdma_ep_offer(x->cx, SEG_ID, CLIENT_ID, NULL, ep, &offer, &ol);
    if (rc != KVP_OK)
        return rc;
    kvp_rdma_seg_accept(x->sx, offer, ol, &ans, &al);
    rc = kvp_rdma_ep_complete(*ep, ans, al);
    free(offer);
    free(ans);
    return rc;
}

static void fx_down(struct fx *x)
{
    kvp_rdma_ep_free(&x->ep);
    kvp_rdma_close(&x->cx);
    kvp_rdma_close(&x->sx);
    fv_fabric_destroy(&x->f);
    free(x->seg);
    free(x->buf);
    free(x->buf2);
}

static struct kvp_rdma_qp *seg_qp(struct fx *x, uint32_t i)
{
    assert_non_null(x->sx->writers);
    return &x->sx->writers->q[i];
}

/* ------------------------------------------------------------------ the data path */

/* Random puts and gets, registered and bounce-staged, with MR chunks far below the region
 * (max_mr_size 16..256 KiB on both sides): every WR must stay inside one chunk on each side
 * (the double fails a straddling WR with REM_ACCESS_ERR), the bytes must match, and CQ credits
 * must never exceed the CQ. */
static void test_rdma_xport_put_get_chunk_limits_and_clamping(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= seeds(25); seed++) {
        uint64_t rng = seed * 7717;
        struct fx x;
        struct fx_opts o = {.seed = seed, .max_mr_size = (4096ull << (2 + mix(&rng) % 5)),
                            .qps = 1 + (uint32_t)(mix(&rng) % 4), .cq = 16 + (uint32_t)(mix(&rng) % 64),
                            .slice = (uint32_t)(4096u << (mix(&rng) % 6))};
        fx_up(&x, &o);
        assert_int_equal(fx_connect(&x, &x.ep), KVP_OK);
        bool reg = mix(&rng) % 2;
        if (reg) {
            assert_int_equal(kvp_rdma_register(x.cx, x.buf, x.buf_len, NULL), KVP_OK);
            assert_int_equal(kvp_rdma_register(x.cx, x.buf2, x.buf_len, NULL), KVP_OK);
        }
        for (size_t i = 0; i < x.buf_len; i++)
            x.buf[i] = (uint8_t)(mix(&rng));
        struct kvp_rdma_slice s[8];
        size_t n = 1 + mix(&rng) % 8;
        uint64_t off = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t len = 1 + mix(&rng) % (x.buf_len / 8 - 1);
            s[i] = (struct kvp_rdma_slice){.local = x.buf + off, .len = len, .remote_offset = off,
                                           .op = KVP_RDMA_WRITE};
            off += len + mix(&rng) % 512;
        }
        assert_int_equal(kvp_rdma_run(x.cx, x.ep, s, n, 0), KVP_OK);
        for (size_t i = 0; i < n; i++)
            assert_memory_equal(x.seg + s[i].remote_offset, s[i].local, s[i].len);
        for (size_t i = 0; i < n; i++) {
            s[i].local = x.buf2 + (s[i].remote_offset);
            s[i].op = KVP_RDMA_READ;
        }
        assert_int_equal(kvp_rdma_run(x.cx, x.ep, s, n, 0), KVP_OK);
        for (size_t i = 0; i < n; i++)
            assert_memory_equal(x.buf2 + s[i].remote_offset, x.buf + s[i].remote_offset, s[i].len);
        struct kvp_rdma_stats st;
        kvp_rdma_stats(x.cx, &st);
        assert_true(st.cq_high_water <= st.cq_size);
        assert_true(st.posted >= n * 2);
        if (!reg)
            assert_true(st.bounce_bytes > 0);
        assert_int_equal(kvp_rdma_inflight(x.cx), 0);
        if (reg) {
            assert_int_equal(kvp_rdma_unregister(x.cx, x.buf, x.buf_len), KVP_OK);
            assert_int_equal(kvp_rdma_unregister(x.cx, x.buf2, x.buf_len), KVP_OK);
        }
        fx_down(&x);
    }
}

/* Two QPs x 256 WRs against a CQ of 16: slices wait for credit, none is lost. */
static void test_rdma_xport_cq_credits_never_exceed_cq_size(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= seeds(15); seed++) {
        struct fx x;
        struct fx_opts o = {.seed = seed, .qps = 4, .cq = 16, .slice = 4096};
        fx_up(&x, &o);
        assert_int_equal(fx_connect(&x, &x.ep), KVP_OK);
        assert_int_equal(kvp_rdma_register(x.cx, x.buf, x.buf_len, NULL), KVP_OK);
        struct kvp_rdma_slice s = {.local = x.buf, .len = 256 * 4096, .op = KVP_RDMA_READ};
        assert_int_equal(kvp_rdma_run(x.cx, x.ep, &s, 1, 0), KVP_OK);
        struct kvp_rdma_stats st;
        kvp_rdma_stats(x.cx, &st);
        assert_int_equal(st.cq_size, 16);
        assert_true(st.cq_high_water <= 16);
        assert_int_equal(st.cq_high_water, 16); /* it was the limit, not luck */
        assert_memory_equal(x.buf, x.seg, 256 * 4096);
        assert_int_equal(kvp_rdma_unregister(x.cx, x.buf, x.buf_len), KVP_OK);
        fx_down(&x);
    }
}

/* ------------------------------------------------------------------ fencing */

/* The seed failure: a READ that completes after its call gave up never reaches the caller's
 * buffer, which holds the caller's new bytes. Every provider that flushes, registered and
 * bounce-staged buffers. */
static void timed_out_read(uint64_t seed, int mode)
{
    uint64_t rng = seed * 31337 + (uint64_t)mode;
    struct fx x;
    struct fx_opts o = {.seed = seed, .flush = mode, .qps = 1 + (uint32_t)(mix(&rng) % 3)};
    fx_up(&x, &o);
    assert_int_equal(fx_connect(&x, &x.ep), KVP_OK);
    bool reg = mix(&rng) % 2;
    if (reg)
        assert_int_equal(kvp_rdma_register(x.cx, x.buf, x.buf_len, NULL), KVP_OK);
    for (uint32_t i = 0; i < x.ep->n_qps; i++)
        fv_qp_set_delay(seg_qp(&x, i)->qp, 5 * MS + mix(&rng) % (40 * MS));
    size_t len = 256 * 1024 + mix(&rng) % (512 * 1024);
    struct kvp_rdma_slice s = {.local = x.buf, .len = len, .op = KVP_RDMA_READ};
    uint32_t timeout = 1 + (uint32_t)(mix(&rng) % 4);
    uint64_t t0 = fv_now(x.f);
    int rc = kvp_rdma_run(x.cx, x.ep, &s, 1, timeout);
    uint64_t t_ret = fv_now(x.f);
    assert_int_equal(rc, KVP_ERR_TIMEOUT);
    assert_int_equal(s.status, KVP_ERR_TIMEOUT);
    assert_true(t_ret - t0 < (uint64_t)timeout * MS + 20 * MS); /* flushes come in microseconds */
    assert_false(kvp_rdma_ep_live(x.ep));
    assert_int_equal(kvp_rdma_inflight(x.cx), 0);
    memset(x.buf, 0xee, len); /* the caller owns its buffer again */
    fv_run_idle(x.f, 3000 * MS);
    const struct fv_dma *d = NULL;
    if (fv_audit_placed_after(x.f, x.buf, len, t_ret, &d) != 0)
        fail_msg("seed %llu mode %d: a READ response landed in the caller's buffer %llu ns after "
                 "the call returned", (unsigned long long)seed, mode,
                 (unsigned long long)(d->t_ns - t_ret));
    for (size_t i = 0; i < len; i++)
        if (x.buf[i] != 0xee)
            fail_msg("seed %llu mode %d: byte %zu changed after return", (unsigned long long)seed,
                     mode, i);
    /* the fenced endpoint is gone for good; a new generation works */
    struct kvp_rdma_ep *e2 = NULL;
    assert_int_equal(fx_connect(&x, &e2), KVP_OK);
    assert_int_equal(kvp_rdma_ep_generation(e2), kvp_rdma_ep_generation(x.ep) + 1);
    s.status = 0;
    assert_int_equal(kvp_rdma_run(x.cx, e2, &s, 1, 0), KVP_OK);
    assert_memory_equal(x.buf, x.seg, len);
    kvp_rdma_ep_free(&e2);
    fx_down(&x);
}

static void test_rdma_xport_timed_out_read_never_lands_after_return(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= seeds(60); seed++)
        for (int mode = FV_FLUSH_ALL; mode <= FV_FLUSH_ON_POLL; mode++)
            timed_out_read(seed, mode);
}

/* A provider that never flushes (and whose ERR QP keeps placing READ responses): the call
 * returns within timeout + fence bound with KVP_ERR_FENCE_FAILED, and nothing lands after it
 * returns (the QPs were destroyed and the buffer's MRs deregistered). The next call works under
 * new keys. */
static void test_rdma_xport_never_flush_returns_within_bound_no_dma_after(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= seeds(30); seed++) {
        uint64_t rng = seed * 99991;
        struct fx x;
        struct fx_opts o = {.seed = seed, .flush = FV_FLUSH_NEVER, .keeps_placing = true,
                            .bound_ms = 200, .qps = 2};
        fx_up(&x, &o);
        assert_int_equal(fx_connect(&x, &x.ep), KVP_OK);
        bool reg = seed % 2;
        if (reg)
            assert_int_equal(kvp_rdma_register(x.cx, x.buf, x.buf_len, NULL), KVP_OK);
        for (uint32_t i = 0; i < 2; i++)
            fv_qp_set_delay(seg_qp(&x, i)->qp, 250 * MS + mix(&rng) % (300 * MS));
        struct kvp_rdma_slice s = {.local = x.buf, .len = 512 * 1024, .op = KVP_RDMA_READ};
        uint64_t t0 = fv_now(x.f);
        int rc = kvp_rdma_run(x.cx, x.ep, &s, 1, 5);
        uint64_t t_ret = fv_now(x.f);
        assert_int_equal(rc, KVP_ERR_FENCE_FAILED);
        assert_true(t_ret - t0 <= 5 * MS + 200 * MS + MS);
        memset(x.buf, 0xee, s.len);
        fv_run_idle(x.f, 3000 * MS);
        assert_int_equal(fv_audit_placed_after(x.f, x.buf, s.len, t_ret, NULL), 0);
        for (size_t i = 0; i < s.len; i++)
            assert_int_equal(x.buf[i], 0xee);
        struct kvp_rdma_stats st;
        kvp_rdma_stats(x.cx, &st);
        assert_int_equal(st.wedged_batches, 1);
        /* new generation, re-registered memory: works (no delay on the new QPs) */
        struct kvp_rdma_ep *e2 = NULL;
        assert_int_equal(fx_connect(&x, &e2), KVP_OK);
        assert_int_equal(kvp_rdma_run(x.cx, e2, &s, 1, 0), KVP_OK);
        assert_memory_equal(x.buf, x.seg, s.len);
        kvp_rdma_ep_free(&e2);
        fx_down(&x);
    }
}

/* A late WRITE whose delay is longer than fence_grace_ms: only the segment-side fence can stop
 * it. With kvp_rdma_seg_fence_writer the reused space keeps the new object's bytes; without it
 * the late packets do land (so the scenario is real). */
static void late_write(uint64_t seed, bool fence_writer)
{
    uint64_t rng = seed * 104729;
    struct fx x;
    struct fx_opts o = {.seed = seed, .flush = (int)(mix(&rng) % 3), .qps = 2};
    fx_up(&x, &o);
    assert_int_equal(fx_connect(&x, &x.ep), KVP_OK);
    if (mix(&rng) % 2)
        assert_int_equal(kvp_rdma_register(x.cx, x.buf, x.buf_len, NULL), KVP_OK);
    uint64_t grace = 20 * MS; /* fence_grace_ms for this test */
    for (uint32_t i = 0; i < 2; i++)
        fv_qp_set_delay(x.ep->q[i].qp, grace + 10 * MS + mix(&rng) % (50 * MS));
    memset(x.buf, 0xd1, 65536);
    struct kvp_rdma_slice s = {.local = x.buf, .len = 65536, .op = KVP_RDMA_WRITE};
    int rc = kvp_rdma_run(x.cx, x.ep, &s, 1, 1 + (uint32_t)(mix(&rng) % 4));
    uint64_t t_ret = fv_now(x.f);
    assert_int_equal(rc, KVP_ERR_TIMEOUT);
    uint64_t t_l2 = t_ret;
    if (fence_writer) {
        /* FenceWriter{client, gen}: the master's PutRevoke path asks the segment */
        assert_true(kvp_rdma_seg_fence_writer(x.sx, CLIENT_ID, kvp_rdma_ep_generation(x.ep)) == 2);
        assert_null(x.sx->writers);
    }
    fv_run_until(x.f, t_ret + grace); /* the quarantine passes; the space is reused */
    uint64_t t_reuse = fv_now(x.f);
    memset(x.seg, 0x0b, 65536);
    fv_run_idle(x.f, 3000 * MS);
    if (fence_writer) {
        assert_int_equal(fv_audit_placed_after(x.f, x.seg, 65536, t_l2, NULL), 0);
        for (size_t i = 0; i < 65536; i++)
            if (x.seg[i] != 0x0b)
                fail_msg("seed %llu: byte %zu of reused space overwritten by a late WRITE",
                         (unsigned long long)seed, i);
    } else {
        assert_true(fv_audit_placed_after(x.f, x.seg, 65536, t_reuse, NULL) > 0);
    }
    fx_down(&x);
}

static void test_rdma_xport_late_write_past_grace_stopped_by_segment_fence(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= seeds(60); seed++)
        late_write(seed, true);
    for (uint64_t seed = 1; seed <= seeds(10); seed++)
        late_write(seed, false);
}

/* A frozen writer (SIGSTOP after posting): its HCA keeps retransmitting WRITEs. While it is
 * frozen the segment fences it (FenceWriter) and the space is reused: nothing lands after the
 * fence, whatever the writer's NIC does. */
static void frozen_hook(struct fx *x)
{
    fv_node_freeze(x->nc, true);
    fv_advance(x->f, 200 * US);
    x->t_hook = fv_now(x->f);
    x->hook_ok = kvp_rdma_seg_fence_writer(x->sx, CLIENT_ID, ~0ull) > 0;
    fv_advance(x->f, 10 * MS);
    memset(x->seg, 0x0c, 65536);
    fv_advance(x->f, 2000 * MS); /* retransmits, timeouts, all while frozen */
    fv_node_freeze(x->nc, false);
}

static void test_rdma_xport_frozen_writer_stopped_by_segment_fence(void **state)
{
    (void)state;
    int stopped = 0;
    for (uint64_t seed = 1; seed <= seeds(40); seed++) {
        uint64_t rng = seed * 271;
        struct fx x;
        struct fx_opts o = {.seed = seed, .qps = 2};
        fx_up(&x, &o);
        assert_int_equal(fx_connect(&x, &x.ep), KVP_OK);
        for (uint32_t i = 0; i < 2; i++)
            fv_qp_set_delay(x.ep->q[i].qp, 1 * MS + mix(&rng) % (10 * MS));
        memset(x.buf, 0xd2, 65536);
        x.hook = frozen_hook;
        struct kvp_rdma_slice s = {.local = x.buf, .len = 65536, .op = KVP_RDMA_WRITE};
        int rc = kvp_rdma_run(x.cx, x.ep, &s, 1, 100);
        assert_true(x.hook_fired && x.hook_ok);
        stopped += rc != KVP_OK; /* OK: every packet had landed before the fence */
        fv_run_idle(x.f, 3000 * MS);
        assert_int_equal(fv_audit_placed_after(x.f, x.seg, 65536, x.t_hook, NULL), 0);
        for (size_t i = 0; i < 65536; i++)
            assert_int_equal(x.seg[i], 0x0c);
        fx_down(&x);
    }
    assert_true((uint64_t)stopped * 2 > seeds(40)); /* the fence did stop writes in flight in most runs */
}

/* Reconnect after a peer restart: the killed segment costs retry exhaustion (~0.54 s), the
 * batch fails and its endpoint is fenced; the restarted segment (new process, new QPs, new
 * PSNs) takes a new generation and the data moves. */
static void test_rdma_xport_reconnect_after_peer_restart(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= seeds(10); seed++) {
        struct fx x;
        struct fx_opts o = {.seed = seed, .qps = 2};
        fx_up(&x, &o);
        assert_int_equal(fx_connect(&x, &x.ep), KVP_OK);
        uint32_t old_psn = x.ep->psn[0];
        fv_node_kill(x.ns);
        struct kvp_rdma_slice s = {.local = x.buf, .len = 65536, .op = KVP_RDMA_READ};
        uint64_t t0 = fv_now(x.f);
        assert_int_equal(kvp_rdma_run(x.cx, x.ep, &s, 1, 5000), KVP_ERR_TRANSFER);
        uint64_t took = fv_now(x.f) - t0;
        assert_true(took > 400 * MS && took < 800 * MS); /* 8 x 67 ms */
        /* restart: a new segment process on the fabric */
        kvp_rdma_close(&x.sx);
        struct fv_node_config sc = {.name = "segment2", .n_devices = 1};
        assert_int_equal(fv_node_add(x.f, &sc, &x.ns), KVP_OK);
        struct kvp_rdma_cfg scfg = {.ops = fv_node_ops(x.ns), .who = "segment2", .gid_index = -1,
                                    .segment = true, .psn_seed = seed * 5 + 3,
                                    .sysfs_root = "/nonexistent"};
        assert_int_equal(kvp_rdma_open(&scfg, &x.env, &x.sx), KVP_OK);
        memset(x.seg, 0x77, x.seg_len);
        assert_int_equal(kvp_rdma_seg_register(x.sx, SEG_ID, x.seg, x.seg_len, NULL), KVP_OK);
        struct kvp_rdma_ep *e2 = NULL;
        assert_int_equal(fx_connect(&x, &e2), KVP_OK);
        assert_int_equal(kvp_rdma_ep_generation(e2), 2);
        assert_int_not_equal(e2->psn[0], old_psn);
        assert_int_equal(kvp_rdma_run(x.cx, e2, &s, 1, 1000), KVP_OK);
        assert_memory_equal(x.buf, x.seg, 65536);
        kvp_rdma_ep_free(&e2);
        fx_down(&x);
    }
}

/* Stale wr_id generations: a completion injected with the wr_id of a WR from a fenced endpoint
 * (its slot reused since) is counted and dropped, never taken for the new owner's. */
static void test_rdma_xport_stale_wr_id_dropped(void **state)
{
    (void)state;
    struct fx x;
    struct fx_opts o = {.seed = 5, .qps = 1};
    fx_up(&x, &o);
    assert_int_equal(fx_connect(&x, &x.ep), KVP_OK);
    struct kvp_rdma_slice s = {.local = x.buf, .len = 4096, .op = KVP_RDMA_READ};
    assert_int_equal(kvp_rdma_run(x.cx, x.ep, &s, 1, 0), KVP_OK);
    /* every slot has been used once at most; wr_id (slot 0, gen 1) is stale by now if used */
    struct ibv_wc wc = {.wr_id = kvp_rdma_wrid_encode(x.cx->slots.v[0].in_use ? 1 : 0, 1),
                        .status = IBV_WC_SUCCESS, .qp_num = x.ep->q[0].qp->qp_num};
    fv_cq_inject(x.cx->nic[0].cq.cq, &wc);
    struct kvp_rdma_report rep[4];
    assert_int_equal(kvp_rdma_progress(x.cx, rep, 4), 0);
    struct kvp_rdma_stats st;
    kvp_rdma_stats(x.cx, &st);
    assert_int_equal(st.stale_wc, 1);
    assert_int_equal(kvp_rdma_run(x.cx, x.ep, &s, 1, 0), KVP_OK);
    fx_down(&x);
}

/* ------------------------------------------------------------------ memory */

/* kvp_register_buffer's rule: caller memory is LOCAL_WRITE only, so a peer (here the segment's
 * own QP, with the caller MR's rkey) can neither write nor read it. Nested registrations share
 * the cache entry; an overlapping one registers the union once. */
static void test_rdma_xport_mr_cache_and_local_write_only(void **state)
{
    (void)state;
    struct fx x;
    struct fx_opts o = {.seed = 11, .qps = 1};
    fx_up(&x, &o);
    assert_int_equal(fx_connect(&x, &x.ep), KVP_OK);
    struct kvp_rdma_stats st0, st1;
    assert_int_equal(kvp_rdma_register(x.cx, x.buf, 65536, NULL), KVP_OK);
    kvp_rdma_stats(x.cx, &st0);
    assert_int_equal(kvp_rdma_register(x.cx, x.buf + 4096, 8192, NULL), KVP_OK); /* nested */
    kvp_rdma_stats(x.cx, &st1);
    assert_int_equal(st1.mr_regs, st0.mr_regs);
    assert_int_equal(st1.mr_cache_hits, st0.mr_cache_hits + 1);
    assert_int_equal(kvp_rdma_register(x.cx, x.buf + 32768, 65536, NULL), KVP_OK); /* overlaps */
    kvp_rdma_stats(x.cx, &st1);
    assert_true(st1.mr_regs > st0.mr_regs);
    struct kvp_rdma_mrent *e = kvp_rdma_mr_find(x.cx, (uint64_t)(uintptr_t)x.buf, 98304);
    assert_non_null(e); /* the union covers both */
    assert_int_equal(e->base, (uint64_t)(uintptr_t)x.buf);
    /* a segment QP tries to WRITE into the caller's memory with its rkey */
    memset(x.buf, 0x31, 65536);
    struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)x.seg, .length = 4096,
                          .lkey = x.sx->seg_region[0].chunks[0].lkey};
    struct ibv_send_wr wr = {.wr_id = 9, .sg_list = &sge, .num_sge = 1,
                             .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
    wr.wr.rdma.remote_addr = (uint64_t)(uintptr_t)x.buf;
    wr.wr.rdma.rkey = e->region[0].chunks[0].rkey;
    struct ibv_send_wr *bad = NULL;
    uint64_t t0 = fv_now(x.f);
    assert_int_equal(x.sx->ops->post_send(seg_qp(&x, 0)->qp, &wr, &bad), 0);
    fv_run_idle(x.f, 100 * MS);
    struct ibv_wc wc;
    assert_int_equal(x.sx->ops->poll_cq(x.sx->nic[0].cq.cq, 1, &wc), 1);
    assert_int_equal(wc.status, IBV_WC_REM_ACCESS_ERR);
    assert_int_equal(fv_audit_placed_after(x.f, x.buf, 65536, t0, NULL), 0);
    for (size_t i = 0; i < 65536; i++)
        assert_int_equal(x.buf[i], 0x31);
    assert_int_equal(kvp_rdma_unregister(x.cx, x.buf + 4096, 8192), KVP_OK);
    assert_int_equal(kvp_rdma_unregister(x.cx, x.buf + 4096, 8192), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_rdma_unregister(x.cx, x.buf + 32768, 65536), KVP_OK);
    assert_int_equal(kvp_rdma_unregister(x.cx, x.buf, 65536), KVP_OK);
    assert_null(x.cx->mrs);
    fx_down(&x);
}

/* Two NICs, a GPU behind the second one's PCIe switch: the GPU buffer is registered through
 * dma-buf on both NICs, the endpoint for it uses the near NIC, READs land in the "device"
 * memory and are flushed (cuFlushGPUDirectRDMAWrites) before they are reported. Host memory on
 * NUMA node 0 uses the first NIC. Without the CUDA route, GPU memory is refused (the client
 * then stages it). */
static struct fv_fabric *g_fab;
static int g_flushes, g_exports;
static uint64_t g_gpu_base, g_gpu_size;
static int cu_range(void *a, uint64_t p, uint64_t *b, uint64_t *s)
{
    (void)a;
    if (p < g_gpu_base || p >= g_gpu_base + g_gpu_size)
        return 1;
    *b = g_gpu_base;
    *s = g_gpu_size;
    return 0;
}
static int cu_fd(void *a, uint64_t b, uint64_t s, int *fd)
{
    (void)a;
    g_exports++;
    *fd = fv_dmabuf_export(g_fab, (void *)(uintptr_t)b, s);
    return *fd < 0;
}
static bool cu_needs(void *a, int ord) { (void)a; return ord == 1; }
static int cu_flush(void *a, int ord) { (void)a; (void)ord; g_flushes++; return 0; }

static char g_root[PATH_MAX];
static void mkdir_p(const char *rel)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s%s", g_root, rel);
    for (char *s = p + strlen(g_root) + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755);
            *s = '/';
        }
    mkdir(p, 0755);
}
static void put_file(const char *rel, const char *text)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s%s", g_root, rel);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}
static void nic_link(const char *name, const char *dev)
{
    char d[PATH_MAX], l[PATH_MAX], t[PATH_MAX];
    snprintf(d, sizeof d, "/class/infiniband/%s", name);
    mkdir_p(d);
    snprintf(l, sizeof l, "%s%s/device", g_root, d);
    snprintf(t, sizeof t, "%s%s", g_root, dev);
    assert_int_equal(symlink(t, l), 0);
}
static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

#define SW0 "/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
#define SW1 "/devices/pci0000:80/0000:80:01.0/0000:81:00.0"

static void test_rdma_xport_two_nics_gpu_buffer_near_one(void **state)
{
    (void)state;
    snprintf(g_root, sizeof g_root, "/tmp/kvp-xport-XXXXXX");
    assert_non_null(mkdtemp(g_root));
    mkdir_p(SW0 "/0000:02:00.0/0000:03:00.0");
    mkdir_p(SW1 "/0000:82:00.0/0000:83:00.0");
    mkdir_p(SW1 "/0000:82:01.0/0000:84:00.0");
    put_file(SW0 "/0000:02:00.0/0000:03:00.0/numa_node", "0\n");
    put_file(SW1 "/0000:82:00.0/0000:83:00.0/numa_node", "1\n");
    nic_link("fake_0_0", SW0 "/0000:02:00.0/0000:03:00.0");
    nic_link("fake_0_1", SW1 "/0000:82:00.0/0000:83:00.0");
    char gpu_path[PATH_MAX];
    snprintf(gpu_path, sizeof gpu_path, "%s%s", g_root, SW1 "/0000:82:01.0/0000:84:00.0");
    char *gpu_real = realpath(gpu_path, NULL);
    assert_non_null(gpu_real);

    struct kvp_rdma_cuda cu = {.addr_range = cu_range, .dmabuf_fd = cu_fd,
                               .needs_flush = cu_needs, .flush = cu_flush};
    for (uint64_t seed = 1; seed <= 10; seed++) {
        struct fx x;
        struct fx_opts o = {.seed = seed, .client_devs = 2, .qps = 2, .cuda = &cu,
                            .sysfs = g_root};
        fx_up(&x, &o);
        g_fab = x.f;
        g_flushes = g_exports = 0;
        assert_int_equal(kvp_rdma_nics(x.cx), 2);
        g_gpu_base = (uint64_t)(uintptr_t)x.buf2;
        g_gpu_size = x.buf_len;
        struct kvp_rdma_mem gpu = {.kind = KVP_RDMA_MEM_CUDA, .ordinal = 1, .numa_node = -1,
                                   .gpu_pci_path = gpu_real};
        assert_int_equal(kvp_rdma_register(x.cx, x.buf2 + 8192, 262144, &gpu), KVP_OK);
        assert_int_equal(g_exports, 1); /* exported once, imported on both NICs */
        struct kvp_rdma_mrent *e = kvp_rdma_mr_find(x.cx, (uint64_t)(uintptr_t)x.buf2 + 8192, 4096);
        assert_non_null(e);
        assert_true(e->region[0].n > 0 && e->region[1].n > 0);
        uint8_t *offer = NULL, *ans = NULL;
        size_t ol = 0, al = 0;
        struct kvp_rdma_ep *ep = NULL;
        assert_int_equal(kvp_rdma_ep_offer(x.cx, SEG_ID, CLIENT_ID, &gpu, &ep, &offer, &ol), KVP_OK);
        assert_string_equal(kvp_rdma_ep_nic(ep), "fake_0_1");
        kvp_rdma_seg_accept(x.sx, offer, ol, &ans, &al);
        assert_int_equal(kvp_rdma_ep_complete(ep, ans, al), KVP_OK);
        free(offer);
        free(ans);
        for (size_t i = 0; i < x.seg_len; i++)
            x.seg[i] = (uint8_t)(i * 7 + seed);
        struct kvp_rdma_slice s = {.local = x.buf2 + 8192, .len = 262144, .remote_offset = 4096,
                                   .op = KVP_RDMA_READ};
        assert_int_equal(kvp_rdma_run(x.cx, ep, &s, 1, 0), KVP_OK);
        assert_memory_equal(x.buf2 + 8192, x.seg + 4096, 262144);
        assert_true(g_flushes >= 1);
        struct kvp_rdma_stats st;
        kvp_rdma_stats(x.cx, &st);
        assert_int_equal(st.bounce_bytes, 0); /* in place, through the dma-buf MRs */
        /* host memory on node 0 picks the first NIC */
        struct kvp_rdma_mem host0 = {.kind = KVP_RDMA_MEM_HOST, .numa_node = 0};
        struct kvp_rdma_ep *ep0 = NULL;
        assert_int_equal(kvp_rdma_ep_offer(x.cx, SEG_ID, CLIENT_ID, &host0, &ep0, &offer, &ol), KVP_OK);
        assert_string_equal(kvp_rdma_ep_nic(ep0), "fake_0_0");
        free(offer);
        kvp_rdma_ep_free(&ep0);
        kvp_rdma_ep_free(&ep);
        assert_int_equal(kvp_rdma_unregister(x.cx, x.buf2 + 8192, 262144), KVP_OK);
        fx_down(&x);
    }
    /* no CUDA route: GPU memory is refused (the caller stages it) */
    struct fx x;
    struct fx_opts o = {.seed = 3};
    fx_up(&x, &o);
    struct kvp_rdma_mem gpu = {.kind = KVP_RDMA_MEM_CUDA};
    assert_int_equal(kvp_rdma_register(x.cx, x.buf2, 4096, &gpu), KVP_ERR_UNSUPPORTED);
    fx_down(&x);
    free(gpu_real);
    nftw(g_root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* ------------------------------------------------------------------ no device, bad handshakes */

/* Count the lines a call writes to stderr (the log). */
static int stderr_lines(int (*fn)(void *), void *arg, int *rc)
{
    char path[] = "/tmp/kvp-xport-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    *rc = fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(path, "r");
    int lines = 0, c;
    char first[256] = "";
    size_t k = 0;
    while ((c = fgetc(f)) != EOF) {
        if (lines == 0 && k + 1 < sizeof first)
            first[k++] = (char)c;
        lines += c == '\n';
    }
    fclose(f);
    close(fd);
    unlink(path);
    if (lines)
        fprintf(stderr, "(captured: %s", first);
    return lines;
}

static const struct kvp_verbs_ops *g_ops;
static int open_with(void *a)
{
    (void)a;
    struct kvp_rdma_cfg c = {.ops = g_ops, .who = "client", .gid_index = -1,
                             .nodev_log_level = KVP_LOG_WARN};
    struct kvp_rdma_xport *x = NULL;
    int rc = kvp_rdma_open(&c, NULL, &x);
    assert_null(x);
    return rc;
}

static void test_rdma_xport_no_device_falls_back_with_one_line(void **state)
{
    (void)state;
    struct fv_fabric *f = NULL;
    assert_int_equal(fv_fabric_new(&f, NULL), KVP_OK);
    struct fv_node *n0, *n1;
    struct fv_node_config c0 = {.n_devices = -1}, c1 = {.n_devices = 0};
    assert_int_equal(fv_node_add(f, &c0, &n0), KVP_OK);
    assert_int_equal(fv_node_add(f, &c1, &n1), KVP_OK);
    int rc = 0;
    kvp_log_set_level(KVP_LOG_INFO);
    g_ops = fv_node_ops(n0);
    assert_int_equal(stderr_lines(open_with, NULL, &rc), 1);
    assert_int_equal(rc, KVP_ERR_UNSUPPORTED);
    g_ops = fv_node_ops(n1);
    assert_int_equal(stderr_lines(open_with, NULL, &rc), 1);
    assert_int_equal(rc, KVP_ERR_UNSUPPORTED);
    /* this machine's real libibverbs: no device, one line, TCP */
    g_ops = kvp_verbs_ops_ibv();
    assert_int_equal(stderr_lines(open_with, NULL, &rc), 1);
    assert_int_equal(rc, KVP_ERR_UNSUPPORTED);
    kvp_log_set_level(KVP_LOG_ERROR);
    fv_fabric_destroy(&f);
}

static void test_rdma_xport_bad_handshakes_refused(void **state)
{
    (void)state;
    struct fx x;
    struct fx_opts o = {.seed = 9, .qps = 2};
    fx_up(&x, &o);
    uint8_t junk[40] = {1, 2, 3};
    uint8_t *ans = NULL;
    size_t al = 0;
    assert_int_equal(kvp_rdma_seg_accept(x.sx, junk, sizeof junk, &ans, &al), KVP_ERR_MALFORMED);
    struct kvp_rdma_hello h;
    assert_int_equal(kvp_rdma_hello_decode(ans, al, &h, NULL, 0), KVP_OK);
    assert_int_equal(h.status, KVP_ERR_MALFORMED);
    kvp_rdma_hello_free(&h);
    /* a client whose answer is that refusal */
    uint8_t *offer = NULL;
    size_t ol = 0;
    struct kvp_rdma_ep *ep = NULL;
    assert_int_equal(kvp_rdma_ep_offer(x.cx, SEG_ID, CLIENT_ID, NULL, &ep, &offer, &ol), KVP_OK);
    assert_int_equal(kvp_rdma_ep_complete(ep, ans, al), KVP_ERR_MALFORMED);
    free(ans);
    free(offer);
    kvp_rdma_ep_free(&ep);
    /* wrong segment id */
    assert_int_equal(kvp_rdma_ep_offer(x.cx, SEG_ID + 1, CLIENT_ID, NULL, &ep, &offer, &ol), KVP_OK);
    assert_int_equal(kvp_rdma_seg_accept(x.sx, offer, ol, &ans, &al), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_rdma_ep_complete(ep, ans, al), KVP_ERR_NOT_FOUND);
    assert_false(kvp_rdma_ep_live(ep));
    free(offer);
    free(ans);
    kvp_rdma_ep_free(&ep);
    /* a good answer cut short, then one for another generation */
    assert_int_equal(kvp_rdma_ep_offer(x.cx, SEG_ID, CLIENT_ID, NULL, &ep, &offer, &ol), KVP_OK);
    assert_int_equal(kvp_rdma_seg_accept(x.sx, offer, ol, &ans, &al), KVP_OK);
    assert_int_equal(kvp_rdma_ep_complete(ep, ans, al - 1), KVP_ERR_MALFORMED);
    free(offer);
    free(ans);
    kvp_rdma_ep_free(&ep);
    struct kvp_rdma_slice s = {.local = x.buf, .len = 4096, .op = KVP_RDMA_READ};
    assert_int_equal(kvp_rdma_run(x.cx, ep ? ep : x.ep, &s, 1, 0), KVP_ERR_INVALID);
    fx_down(&x);
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rdma_xport_put_get_chunk_limits_and_clamping),
        cmocka_unit_test(test_rdma_xport_cq_credits_never_exceed_cq_size),
        cmocka_unit_test(test_rdma_xport_timed_out_read_never_lands_after_return),
        cmocka_unit_test(test_rdma_xport_never_flush_returns_within_bound_no_dma_after),
        cmocka_unit_test(test_rdma_xport_late_write_past_grace_stopped_by_segment_fence),
        cmocka_unit_test(test_rdma_xport_frozen_writer_stopped_by_segment_fence),
        cmocka_unit_test(test_rdma_xport_reconnect_after_peer_restart),
        cmocka_unit_test(test_rdma_xport_stale_wr_id_dropped),
        cmocka_unit_test(test_rdma_xport_mr_cache_and_local_write_only),
        cmocka_unit_test(test_rdma_xport_two_nics_gpu_buffer_near_one),
        cmocka_unit_test(test_rdma_xport_bad_handshakes_refused),
        cmocka_unit_test(test_rdma_xport_no_device_falls_back_with_one_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
