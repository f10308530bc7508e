/*
 * test_xport_rdma.c — kvp_xport_rdma through the transport seam's ops table
 * (actors/transfer/transport.h), on the verbs double, driven the way the transfer engine drives
 * any transport: post, poll until reported, fence at the call's timeout, abort at the fence bound.
 * It checks the seam's completion semantics (exactly one completion per xslice; after it, no
 * byte of the xslice's memory is touched: the double's DMA audit log) over many seeds and every
 * provider flush mode, reconnection with a new generation after a fence, the per-peer status,
 * and the TCP fallback answers (no device, no handshake channel). Virtual time only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "actors/transfer/rdma/rdma_xport_internal.h"
#include "actors/transfer/rdma/xport_rdma.h"
#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "tests/lib/fakeverbs.h"

#define MS 1000000ull
#define US 1000ull
#define SEG_ID 3u
#define MAXS 64

struct world {
    struct fv_fabric *f;
    struct fv_node *nc, *ns;
    struct kvp_rdma_xport *sx; /* the segment's transport */
    uint8_t *seg, *buf;
    size_t len;
    struct kvp_xport *t;
    struct kvp_xport_peer *peer;
    struct kvp_xport_rdma_opts opts;
};

static uint64_t now_fn(void *a) { return fv_now(((struct world *)a)->f); }
static void wait_fn(void *a, uint64_t ns) { fv_advance(((struct world *)a)->f, ns ? ns : US); }

static int hello_fn(void *arg, const char *endpoint, const uint8_t *offer, size_t len,
                    uint8_t **ans, size_t *alen)
{
    struct world *w = arg;
    if (strcmp(endpoint, "seg-a:7001") != 0)
        return KVP_ERR_TRANSFER;
    int rc = kvp_rdma_seg_accept(w->sx, offer, len, ans, alen);
    return *ans ? KVP_OK : rc; /* a refusal travels as an answer */
}

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void up(struct world *w, uint64_t seed, int flush, bool keeps, bool with_hello)
{
    memset(w, 0, sizeof *w);
    struct fv_config fc = {.seed = seed, .jitter_ns = 1 + seed % (20 * US)};
    assert_int_equal(fv_fabric_new(&w->f, &fc), KVP_OK);
    struct fv_node_config cc = {.name = "client", .n_devices = 1, .flush = flush,
                                .err_keeps_placing = keeps};
    struct fv_node_config sc = {.name = "segment", .n_devices = 1};
    assert_int_equal(fv_node_add(w->f, &cc, &w->nc), KVP_OK);
    assert_int_equal(fv_node_add(w->f, &sc, &w->ns), KVP_OK);
    struct kvp_rdma_env env = {.now_ns = now_fn, .wait = wait_fn, .arg = w};
    struct kvp_rdma_cfg scfg = {.ops = fv_node_ops(w->ns), .who = "segment", .gid_index = -1,
                                .segment = true, .psn_seed = seed + 17, .sysfs_root = "/nonexistent"};
    assert_int_equal(kvp_rdma_open(&scfg, &env, &w->sx), KVP_OK);
    w->len = 1 << 20;
    w->seg = aligned_alloc(4096, w->len);
    w->buf = aligned_alloc(4096, w->len);
    for (size_t i = 0; i < w->len; i++)
        w->seg[i] = (uint8_t)(i * 13 + seed);
    memset(w->buf, 0, w->len);
    assert_int_equal(kvp_rdma_seg_register(w->sx, SEG_ID, w->seg, w->len, NULL), KVP_OK);
    w->opts = (struct kvp_xport_rdma_opts){
        .cfg = {.ops = fv_node_ops(w->nc), .gid_index = -1, .psn_seed = seed * 7 + 1,
                .fence_bound_ms = 100, .sysfs_root = "/nonexistent"},
        .env = env, .client_id = 99, .hello = with_hello ? hello_fn : NULL, .hello_arg = w};
    struct kvp_xport_params p = {.conns_per_peer = 2, .slice_bytes = 256 * 1024,
                                 .connect_timeout_ms = 1000, .name = "xfer-rdma",
                                 .wrap_opts = &w->opts};
    assert_int_equal(kvp_xport_rdma.open(&w->t, &p), KVP_OK);
}

static void down(struct world *w)
{
    kvp_xport_rdma.close(w->t);
    kvp_rdma_close(&w->sx);
    fv_fabric_destroy(&w->f);
    free(w->seg);
    free(w->buf);
}

/* The engine's loop for one call: post, poll; at timeout fence; at the bound abort. Each id
 * must be reported exactly once; returns the time each was reported in t_rep[]. */
static void drive(struct world *w, const struct kvp_xport_slice *s, size_t n, uint64_t timeout_ns,
                  uint64_t bound_ns, int *status, uint64_t *t_rep)
{
    int seen[MAXS] = {0};
    size_t left = n;
    assert_int_equal(kvp_xport_rdma.post(w->t, w->peer, s, n), KVP_OK);
    uint64_t t0 = fv_now(w->f), fenced_at = 0;
    bool aborted = false;
    while (left) {
        struct kvp_xport_completion c[16];
        uint64_t next = 0;
        int got;
        while ((got = kvp_xport_rdma.poll(w->t, fv_now(w->f), c, 16, &next)) > 0)
            for (int i = 0; i < got; i++) {
                assert_true(c[i].id < n);
                assert_int_equal(seen[c[i].id], 0); /* exactly one completion */
                seen[c[i].id] = 1;
                status[c[i].id] = c[i].status;
                t_rep[c[i].id] = fv_now(w->f);
                left--;
            }
        if (!left)
            break;
        uint64_t now = fv_now(w->f);
        if (!fenced_at && timeout_ns && now - t0 >= timeout_ns) {
            uint64_t ids[MAXS];
            size_t m = 0;
            for (size_t i = 0; i < n; i++)
                if (!seen[i])
                    ids[m++] = i;
            kvp_xport_rdma.fence(w->t, ids, m, KVP_ERR_TIMEOUT);
            fenced_at = now;
            continue;
        }
        if (fenced_at && !aborted && now - fenced_at >= bound_ns) {
            uint64_t ids[MAXS];
            size_t m = 0;
            for (size_t i = 0; i < n; i++)
                if (!seen[i])
                    ids[m++] = i;
            kvp_xport_rdma.abort(w->t, ids, m);
            aborted = true;
            continue;
        }
        assert_true(now - t0 < 10000 * MS); /* never hangs */
        fv_advance(w->f, 100 * US);
    }
}

static void make(struct world *w, struct kvp_xport_slice *s, size_t n, uint8_t op, uint64_t *rng)
{
    size_t piece = w->len / n;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = 1 + mix(rng) % (piece < 256 * 1024 ? piece : 256 * 1024);
        s[i] = (struct kvp_xport_slice){.id = i, .op = op, .local = w->buf + i * piece,
                                        .length = len, .segment_id = SEG_ID,
                                        .remote_offset = i * piece};
    }
}

static void test_xport_rdma_moves_bytes_one_completion_each(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 20; seed++) {
        uint64_t rng = seed;
        struct world w;
        up(&w, seed, FV_FLUSH_ALL, false, true);
        assert_int_equal(kvp_xport_rdma.connect(w.t, "seg-a:7001", NULL, 0, &w.peer), KVP_OK);
        if (seed % 2)
            assert_int_equal(kvp_xport_rdma.mem_register(w.t, w.buf, w.len), KVP_OK);
        struct kvp_xport_slice s[16];
        int st[16];
        uint64_t tr[16];
        size_t n = 1 + mix(&rng) % 16;
        make(&w, s, n, KVP_XFER_READ, &rng);
        drive(&w, s, n, 0, 0, st, tr);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(st[i], KVP_OK);
            assert_memory_equal(s[i].local, w.seg + s[i].remote_offset, s[i].length);
        }
        for (size_t i = 0; i < n; i++) {
            s[i].op = KVP_XFER_WRITE;
            memset(s[i].local, 0x40 + (int)i, s[i].length);
        }
        drive(&w, s, n, 0, 0, st, tr);
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(st[i], KVP_OK);
            assert_memory_equal(s[i].local, w.seg + s[i].remote_offset, s[i].length);
        }
        /* a slice for another segment id: answered NOT_FOUND, as TCP's server would */
        s[0].segment_id = SEG_ID + 1;
        drive(&w, s, 1, 0, 0, st, tr);
        assert_int_equal(st[0], KVP_ERR_NOT_FOUND);
        struct kvp_xport_rdma_peer_status ps;
        assert_int_equal(kvp_xport_rdma_peer_status(w.t, w.peer, &ps), KVP_OK);
        assert_string_equal(ps.transport, "rdma");
        assert_string_equal(ps.device, "fake_0_0");
        assert_true(ps.live);
        if (seed % 2)
            assert_int_equal(kvp_xport_rdma.mem_unregister(w.t, w.buf, w.len), KVP_OK);
        down(&w);
    }
}

/* The C2 case through the seam: READs slower than the call's timeout, every provider. Fence at
 * the timeout, abort at the bound; after an xslice's completion no byte lands in its memory. */
static void fence_case(uint64_t seed, int mode)
{
    uint64_t rng = seed * 7 + (uint64_t)mode;
    bool keeps = mode == FV_FLUSH_NEVER && seed % 2;
    struct world w;
    up(&w, seed, mode, keeps, true);
    assert_int_equal(kvp_xport_rdma.connect(w.t, "seg-a:7001", NULL, 0, &w.peer), KVP_OK);
    if (mix(&rng) % 2)
        assert_int_equal(kvp_xport_rdma.mem_register(w.t, w.buf, w.len), KVP_OK);
    for (struct kvp_rdma_writer *wr = w.sx->writers; wr; wr = wr->next)
        for (uint32_t i = 0; i < wr->n_qps; i++)
            fv_qp_set_delay(wr->q[i].qp, (keeps ? 150 * MS : 3 * MS) + mix(&rng) % (30 * MS));
    struct kvp_xport_slice s[MAXS];
    int st[MAXS];
    uint64_t tr[MAXS];
    size_t n = 4 + mix(&rng) % 28;
    make(&w, s, n, KVP_XFER_READ, &rng);
    drive(&w, s, n, MS + mix(&rng) % (2 * MS), 100 * MS, st, tr);
    size_t ok = 0, wedged = 0;
    for (size_t i = 0; i < n; i++) {
        if (st[i] == KVP_OK) {
            ok++;
            assert_memory_equal(s[i].local, w.seg + s[i].remote_offset, s[i].length);
        } else if (mode == FV_FLUSH_NEVER) {
            /* posted: wedged, aborted; never posted: fenced at once */
            assert_true(st[i] == KVP_ERR_FENCE_FAILED || st[i] == KVP_ERR_TIMEOUT);
            wedged += st[i] == KVP_ERR_FENCE_FAILED;
        } else {
            assert_true(st[i] == KVP_ERR_TIMEOUT || st[i] == KVP_ERR_TRANSFER);
        }
        memset(s[i].local, 0xee, s[i].length); /* the caller reuses the memory */
    }
    if (mode == FV_FLUSH_NEVER)
        assert_true(wedged > 0);
    fv_run_idle(w.f, 3000 * MS);
    for (size_t i = 0; i < n; i++) {
        const struct fv_dma *d = NULL;
        if (fv_audit_placed_after(w.f, s[i].local, s[i].length, tr[i], &d))
            fail_msg("seed %llu mode %d: xslice %zu got bytes %llu ns after its completion",
                     (unsigned long long)seed, mode, i, (unsigned long long)(d->t_ns - tr[i]));
        for (size_t k = 0; k < s[i].length; k++)
            assert_int_equal(s[i].local[k], 0xee);
    }
    /* the next post reconnects with a new generation and works */
    drive(&w, s, 1, 0, 0, st, tr);
    assert_int_equal(st[0], KVP_OK);
    struct kvp_xport_rdma_peer_status ps;
    assert_int_equal(kvp_xport_rdma_peer_status(w.t, w.peer, &ps), KVP_OK);
    assert_true(ps.generation >= 2 || ok == n);
    down(&w);
}

static void test_xport_rdma_fence_and_abort_no_dma_after_completion(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 30; seed++)
        for (int mode = FV_FLUSH_ALL; mode <= FV_FLUSH_NEVER; mode++)
            fence_case(seed, mode);
}

/* No device, no handshake channel: the answers that make the engine use TCP (a handshake that
 * got no answer is not one of them). */
static void test_xport_rdma_unsupported_means_tcp(void **state)
{
    (void)state;
    struct kvp_xport *t = NULL;
    struct kvp_xport_params p = {.conns_per_peer = 2, .slice_bytes = 1 << 20, .name = "xfer"};
    assert_int_equal(kvp_xport_rdma.open(&t, &p), KVP_ERR_UNSUPPORTED); /* this machine */
    assert_null(t);
    struct world w;
    up(&w, 1, FV_FLUSH_ALL, false, false);
    struct kvp_xport_peer *peer = NULL;
    assert_int_equal(kvp_xport_rdma.connect(w.t, "seg-a:7001", NULL, 0, &peer), KVP_ERR_UNSUPPORTED);
    down(&w);
    up(&w, 2, FV_FLUSH_ALL, false, true);
    /* no answer from seg-b (not a refusal): these slices fail, no TCP fallback */
    assert_int_equal(kvp_xport_rdma.connect(w.t, "seg-b:7001", NULL, 0, &peer), KVP_ERR_TRANSFER);
    struct kvp_xport_slice bad = {.id = 1, .op = 9, .local = w.buf, .length = 1};
    assert_int_equal(kvp_xport_rdma.connect(w.t, "seg-a:7001", NULL, 0, &w.peer), KVP_OK);
    assert_int_equal(kvp_xport_rdma.post(w.t, w.peer, &bad, 1), KVP_ERR_INVALID);
    down(&w);
}

/* C3 on the writer's side (docs/fencing.md): the segment cannot check a deadline on a one-sided
 * RDMA WRITE, so the writer posts none past its write_deadline_ms. (a) A WRITE posted after its
 * deadline is refused (KVP_ERR_TIMEOUT) and nothing is posted; (b) WRITEs queued before their
 * deadline, still waiting to be posted when it passes (here: before the first poll, with the
 * deadline then moved into the past, as if they had waited for room), are never posted either.
 * In both, no byte of the segment changes and the QPs posted no WR. Fails without the check in
 * kvp_rdma_submit_until / post_some: the WRITEs land. */
static void test_xport_rdma_no_write_posted_past_deadline(void **state)
{
    (void)state;
    struct world w;
    up(&w, 5, FV_FLUSH_ALL, false, true);
    assert_int_equal(kvp_xport_rdma.connect(w.t, "seg-a:7001", NULL, 0, &w.peer), KVP_OK);
    uint8_t *before = malloc(w.len);
    memcpy(before, w.seg, w.len);
    struct kvp_rdma_xport *cx = kvp_xport_rdma_core(w.t);
    struct kvp_rdma_stats st0, st1;
    uint64_t rng = 5;
    for (int mode = 0; mode < 2; mode++) {
        struct kvp_xport_slice s[8];
        int status[8];
        uint64_t tr[8];
        make(&w, s, 8, KVP_XFER_WRITE, &rng);
        uint64_t now = kvp_clock_wall_ms();
        for (size_t i = 0; i < 8; i++) {
            memset(s[i].local, 0x5A, s[i].length);
            s[i].write_deadline_ms = mode == 0 ? now - 1 : now + 3600 * 1000;
        }
        kvp_rdma_stats(cx, &st0);
        assert_int_equal(kvp_xport_rdma.post(w.t, w.peer, s, 8), KVP_OK);
        if (mode == 1) { /* queued, not yet posted (posting happens at poll): the deadline passes */
            unsigned live = 0;
            for (uint32_t i = 0; i < cx->xs_cap; i++)
                if (cx->xs[i].live) {
                    assert_true(cx->xs[i].wdeadline_ms != 0);
                    cx->xs[i].wdeadline_ms = now - 1;
                    live++;
                }
            assert_int_equal(live, 8);
        }
        /* drive() posts again; here the slices were posted above: poll them out */
        int seen = 0;
        for (int spin = 0; spin < 100000 && seen < 8; spin++) {
            struct kvp_xport_completion c[16];
            uint64_t next = 0;
            int got = kvp_xport_rdma.poll(w.t, fv_now(w.f), c, 16, &next);
            for (int i = 0; i < got; i++) {
                assert_true(c[i].id < 8);
                status[c[i].id] = c[i].status;
                tr[c[i].id] = 1;
                seen++;
            }
            if (seen < 8)
                fv_advance(w.f, 100 * US);
        }
        assert_int_equal(seen, 8);
        kvp_rdma_stats(cx, &st1);
        print_message("%s: %llu WR(s) posted, %llu refused as late\n", mode ? "queued, deadline passed" : "posted late",
                      (unsigned long long)(st1.posted - st0.posted),
                      (unsigned long long)(st1.late_refused - st0.late_refused));
        for (size_t i = 0; i < 8; i++)
            assert_int_equal(status[i], KVP_ERR_TIMEOUT);
        assert_int_equal(st1.posted, st0.posted);
        assert_true(st1.late_refused > st0.late_refused);
        fv_run_idle(w.f, 1000 * MS);
        assert_memory_equal(w.seg, before, w.len);
        (void)tr;
    }
    /* the endpoint is not harmed: a WRITE with its deadline ahead lands */
    struct kvp_xport_slice ok = {.id = 0, .op = KVP_XFER_WRITE, .local = w.buf, .length = 4096,
                                 .segment_id = SEG_ID, .remote_offset = 0,
                                 .write_deadline_ms = kvp_clock_wall_ms() + 3600 * 1000};
    memset(w.buf, 0x33, 4096);
    int st;
    uint64_t t;
    drive(&w, &ok, 1, 0, 0, &st, &t);
    assert_int_equal(st, KVP_OK);
    assert_memory_equal(w.seg, w.buf, 4096);
    free(before);
    down(&w);
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xport_rdma_moves_bytes_one_completion_each),
        cmocka_unit_test(test_xport_rdma_fence_and_abort_no_dma_after_completion),
        cmocka_unit_test(test_xport_rdma_unsupported_means_tcp),
        cmocka_unit_test(test_xport_rdma_no_write_posted_past_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
