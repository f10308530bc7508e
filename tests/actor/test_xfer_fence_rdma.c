/*
 * test_xfer_fence_rdma.c — contract C2 at the transfer engine on the rdma transport
 * (kvp_xport_rdma behind the seam) over the verbs double: test_xfer_fence's rounds (random
 * slices, random timeouts of 1..20 ms, a segment whose QPs answer late by random delays) with the
 * engine's transfer actor driving the rdma transport instead of tcp. Every slice that times out
 * is refilled with poison by the "caller" at once; after the engine is gone and the fabric has
 * delivered every packet still in flight, every such READ buffer must still be poison, every
 * completed READ must hold the segment's bytes, and no WRITE may have placed a poison byte
 * (a WR that read caller memory after its call returned). The same rounds also run against a
 * provider that never flushes: the engine's fence bound ends those slices KVP_ERR_FENCE_FAILED
 * and the same checks hold.
 *
 * The double is single-threaded: the transfer actor's thread is the only one that touches it
 * while the engine runs (its polls advance the virtual clock by the real time elapsed,
 * kvp_xport_rdma_opts.drive_clock); the test thread touches it only before and after.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/transfer/rdma/rdma_xport_internal.h"
#include "actors/transfer/rdma/xport_rdma.h"
#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "runtime/log.h"
#include "tests/lib/fakeverbs.h"

#define POISON 0xA5
#define SEG_BYTES (256 * 1024)
#define MS 1000000ull

/* Two segments, used in alternate rounds: a timed-out round's endpoint is replaced only at its
 * segment's next round, so its late packets have a whole round of the other segment to land in
 * the caller's memory if the fence had not stopped them. */
struct dbl {
    struct fv_fabric *f;
    struct fv_node *nc, *ns[2];
    struct kvp_rdma_xport *sx[2];
    uint8_t *seg[2];
    unsigned rng;
};

static uint64_t now_fn(void *a) { return fv_now(((struct dbl *)a)->f); }
static void wait_fn(void *a, uint64_t ns) { fv_advance(((struct dbl *)a)->f, ns ? ns : 1000); }

/* The handshake channel: the segment's transport answers in process; its QPs facing this client
 * answer late by a random 0..8 ms (runs on the transfer actor's thread). */
static int hello_fn(void *arg, const char *endpoint, const uint8_t *offer, size_t len,
                    uint8_t **ans, size_t *alen)
{
    struct dbl *d = arg;
    int k = strcmp(endpoint, "127.0.0.1:7002") == 0;
    kvp_rdma_seg_accept(d->sx[k], offer, len, ans, alen);
    for (struct kvp_rdma_writer *w = d->sx[k]->writers; w; w = w->next)
        for (uint32_t i = 0; i < w->n_qps; i++)
            if (w->q[i].qp)
                fv_qp_set_delay(w->q[i].qp, (uint64_t)(rand_r(&d->rng) % 8000) * 1000);
    return *ans ? KVP_OK : KVP_ERR_TRANSFER;
}

struct kept {
    uint8_t *buf;
    uint64_t len;
};

static void run_rounds(uint8_t op, int rounds, unsigned seed, int flush)
{
    struct dbl d = {.rng = seed};
    struct fv_config fc = {.seed = seed, .jitter_ns = 2 * MS};
    assert_int_equal(fv_fabric_new(&d.f, &fc), KVP_OK);
    struct fv_node_config cc = {.name = "client", .n_devices = 1, .flush = flush};
    struct fv_node_config sc = {.name = "segment", .n_devices = 1};
    assert_int_equal(fv_node_add(d.f, &cc, &d.nc), KVP_OK);
    struct kvp_rdma_env env = {.now_ns = now_fn, .wait = wait_fn, .arg = &d};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(fv_node_add(d.f, &sc, &d.ns[k]), KVP_OK);
        struct kvp_rdma_cfg scfg = {.ops = fv_node_ops(d.ns[k]), .who = "segment", .gid_index = -1,
                                    .segment = true, .psn_seed = seed + 1 + (unsigned)k,
                                    .sysfs_root = "/nonexistent"};
        assert_int_equal(kvp_rdma_open(&scfg, &env, &d.sx[k]), KVP_OK);
        d.seg[k] = aligned_alloc(4096, SEG_BYTES);
        for (size_t i = 0; i < SEG_BYTES; i++)
            d.seg[k][i] = op == KVP_XFER_READ ? (uint8_t)(i * 31 + 7 + (size_t)k) : 0;
        for (size_t i = 0; i < SEG_BYTES; i++)
            if (d.seg[k][i] == POISON)
                d.seg[k][i] = 0;
        assert_int_equal(kvp_rdma_seg_register(d.sx[k], 1 + (uint32_t)k, d.seg[k], SEG_BYTES, NULL),
                         KVP_OK);
    }

    /* odd seeds: caller buffers in memory registered with the transport (DMA lands in place);
     * even seeds: plain malloc (staged through the bounce pool) */
    bool reg = seed % 2;
    size_t arena_len = (size_t)rounds * 16 * 32 * 1024, arena_used = 0;
    uint8_t *arena = reg ? aligned_alloc(4096, arena_len) : NULL;
    struct kvp_xport_rdma_opts o = {
        .cfg = {.ops = fv_node_ops(d.nc), .gid_index = -1, .psn_seed = seed * 3 + 1,
                .sysfs_root = "/nonexistent"},
        .env = env, .client_id = 7, .hello = hello_fn, .hello_arg = &d, .drive_clock = true,
        .prereg_base = arena, .prereg_len = reg ? arena_len : 0};
    struct kvp_xfer_engine *e;
    struct kvp_xfer_params p = {.conns_per_peer = 2, .slice_bytes = 64 * 1024,
                                .fence_bound_ms = 200, .transport = &kvp_xport_rdma,
                                .transport_opts = &o};
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    struct kept *kept = calloc((size_t)rounds * 16, sizeof *kept);
    size_t n_kept = 0, n_ok = 0, n_timeout = 0, n_wedged = 0;
    unsigned r = seed;
    for (int round = 0; round < rounds; round++) {
        int k = round % 2;
        size_t n = 1 + (size_t)(rand_r(&r) % 16);
        struct kvp_xfer_slice s[16];
        uint8_t *bufs[16];
        for (size_t i = 0; i < n; i++) {
            uint64_t len = 1 + (uint64_t)(rand_r(&r) % (32 * 1024));
            bufs[i] = reg ? arena + arena_used : malloc(len);
            arena_used += reg ? len : 0;
            memset(bufs[i], op == KVP_XFER_WRITE ? 0x10 + round % 64 : 0, len);
            s[i] = (struct kvp_xfer_slice){.local = bufs[i], .length = len, .segment_id = 1 + (uint32_t)k,
                                           .endpoint = k ? "127.0.0.1:7002" : "127.0.0.1:7001",
                                           .remote_offset = (uint64_t)(rand_r(&r) % (SEG_BYTES - 32 * 1024)),
                                           .op = op};
        }
        uint32_t timeout = 1 + (uint32_t)(rand_r(&r) % 20);
        int rc = kvp_xfer_run(e, s, n, timeout);
        (void)rc;
        for (size_t i = 0; i < n; i++) {
            int st = s[i].status;
            if (st == KVP_OK) {
                n_ok++;
                if (op == KVP_XFER_READ)
                    assert_memory_equal(bufs[i], d.seg[k] + s[i].remote_offset, s[i].length);
                if (!reg)
                    free(bufs[i]);
                continue;
            }
            /* timed out (fenced), failed (the endpoint fenced after an error), or wedged */
            assert_true(st == KVP_ERR_TIMEOUT || st == KVP_ERR_TRANSFER || st == KVP_ERR_FENCE_FAILED);
            n_timeout += st == KVP_ERR_TIMEOUT;
            n_wedged += st == KVP_ERR_FENCE_FAILED;
            memset(bufs[i], POISON, s[i].length); /* the caller reuses its memory at once */
            kept[n_kept++] = (struct kept){bufs[i], s[i].length};
        }
    }
    kvp_xfer_engine_destroy(&e);
    fv_run_idle(d.f, 5000 * MS); /* every packet still in flight arrives now */
    for (size_t k = 0; k < n_kept; k++) {
        for (uint64_t i = 0; i < kept[k].len; i++)
            if (kept[k].buf[i] != POISON)
                fail_msg("seed %u: byte %llu of a fenced buffer changed after its call returned",
                         seed, (unsigned long long)i);
        if (!reg)
            free(kept[k].buf);
    }
    for (int k = 0; op == KVP_XFER_WRITE && k < 2; k++)
        for (size_t i = 0; i < SEG_BYTES; i++)
            if (d.seg[k][i] == POISON)
                fail_msg("seed %u: segment byte %zu holds poison: a WRITE read caller memory after "
                         "its call returned", seed, i);
    fprintf(stderr, "seed %u %s flush %d %s: %zu ok, %zu timed out, %zu wedged\n", seed,
            op == KVP_XFER_READ ? "READ" : "WRITE", flush, reg ? "registered" : "bounced", n_ok,
            n_timeout, n_wedged);
    assert_true(n_ok > 0);
    assert_true(n_timeout + n_wedged > 0); /* the scenario is real */
    if (flush == FV_FLUSH_NEVER)
        assert_true(n_wedged > 0);
    free(kept);
    free(arena);
    for (int k = 0; k < 2; k++)
        kvp_rdma_close(&d.sx[k]);
    fv_fabric_destroy(&d.f);
    free(d.seg[0]);
    free(d.seg[1]);
}

static void test_xfer_fence_rdma_random_read_timeouts_never_write_late(void **state)
{
    (void)state;
    for (unsigned seed = 1; seed <= 4; seed++)
        run_rounds(KVP_XFER_READ, 60, seed, (int)(seed % 3));
}

static void test_xfer_fence_rdma_random_write_timeouts_never_read_late(void **state)
{
    (void)state;
    for (unsigned seed = 11; seed <= 14; seed++)
        run_rounds(KVP_XFER_WRITE, 60, seed, (int)(seed % 3));
}

static void test_xfer_fence_rdma_never_flushing_provider_wedges_within_bound(void **state)
{
    (void)state;
    run_rounds(KVP_XFER_READ, 20, 21, FV_FLUSH_NEVER);
    run_rounds(KVP_XFER_WRITE, 20, 22, FV_FLUSH_NEVER);
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xfer_fence_rdma_random_read_timeouts_never_write_late),
        cmocka_unit_test(test_xfer_fence_rdma_random_write_timeouts_never_read_late),
        cmocka_unit_test(test_xfer_fence_rdma_never_flushing_provider_wedges_within_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
