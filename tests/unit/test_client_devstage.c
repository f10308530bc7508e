/*
 * test_client_devstage.c — GPU staging (actors/client/devstage.c, devmem.c) against the CUDA
 * driver double (tests/lib/fakecuda/) and a model of the network in place of the transfer engine
 * (kvp_devstage_set_transport): a "segment" is a host array, and sending or receiving a slice
 * costs SEND_NS_PER_BYTE of virtual time (fakecuda_advance), during which enqueued copies run.
 * Device memory is PROT_NONE: any CPU access by kvpool would kill the test with SIGSEGV.
 *
 * Covered: bytes and checksums of staged puts/gets (device, mixed host+device items, host
 * items in the same batch); pipelining on the virtual clock (64 MiB put and get each within
 * 1.2 x max(copy time, send time)); a timed-out get whose copy is delayed never writes the
 * device buffer after the call returned (audit log vs return time); a failed copy fails its
 * item only; a poisoned context fails device items with KVP_ERR_DEVICE while host items work;
 * the counters. Prints the CPU cost of a staged slice against a host slice (not asserted).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include <cmocka.h>

#include "actors/client/devmem.h"
#include "actors/client/devstage.h"
#include "kvpool.h"
#include "tests/lib/fakecuda/fakecuda_load.h"

#define MIB (1ull << 20)
#define REMOTE_BYTES (160 * MIB)
#define COPY_NS_PER_BYTE 0.1 /* 10 GB/s */
#define SEND_NS_PER_BYTE 0.1

/* The model network. */
static struct {
    uint8_t *remote;
    double ns_per_byte;
    int timeout_from_call; /* calls numbered from 0: this one and later time out (-1: never) */
    int calls;
    int fail_slice_call;   /* call whose slices fail with TRANSFER (-1: none) */
} NET;

static int model_xfer(void *ctx, struct kvp_xfer_slice *s, size_t n, uint32_t timeout_ms, void (*overlap)(void *),
                      void *arg)
{
    (void)ctx;
    (void)timeout_ms;
    int call = __atomic_fetch_add(&NET.calls, 1, __ATOMIC_RELAXED); /* concurrent batches in one test */
    if (NET.timeout_from_call >= 0 && call >= NET.timeout_from_call) {
        for (size_t i = 0; i < n; i++)
            s[i].status = KVP_ERR_TIMEOUT; /* fenced: the engine touched nothing */
        FC.advance(1000000);
        return KVP_ERR_TIMEOUT;
    }
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i].op == KVP_XFER_WRITE)
            memcpy(NET.remote + s[i].remote_offset, s[i].local, s[i].length);
        bytes += s[i].length;
    }
    if (overlap)
        overlap(arg);
    for (size_t i = 0; i < n; i++) {
        if (s[i].op == KVP_XFER_READ)
            memcpy(s[i].local, NET.remote + s[i].remote_offset, s[i].length);
        s[i].status = call == NET.fail_slice_call ? KVP_ERR_TRANSFER : KVP_OK;
    }
    FC.advance((uint64_t)((double)bytes * NET.ns_per_byte));
    return KVP_OK;
}

static struct kvp_devstage *DS;
static uint8_t *DEV_A, *DEV_B; /* 64 MiB device allocations on device 0 */

static int setup(void **state)
{
    (void)state;
    NET.remote = calloc(1, REMOTE_BYTES);
    DEV_A = fakecuda_dev_alloc(0, 64 * MIB);
    DEV_B = fakecuda_dev_alloc(0, 64 * MIB);
    if (!NET.remote || !DEV_A || !DEV_B || kvp_devstage_new(&DS, NULL, 0) != KVP_OK)
        return -1;
    kvp_devstage_set_transport(DS, model_xfer, NULL);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvp_devstage_destroy(&DS);
    free(NET.remote);
    return 0;
}

static void reset_net(void)
{
    NET.ns_per_byte = 0;
    NET.timeout_from_call = -1;
    NET.fail_slice_call = -1;
    NET.calls = 0;
    FC.set_ns_per_byte(0);
    FC.reset_errors();
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)((i * 2654435761u + seed) >> 13);
}

static struct kvp_xfer_slice slice(void *local, uint64_t len, uint64_t roff, uint8_t op)
{
    return (struct kvp_xfer_slice){.local = local, .length = len, .segment_id = 1, .endpoint = "model:1",
                                   .remote_offset = roff, .op = op, .status = KVP_ERR_TIMEOUT};
}

/* put of `n` slices, one group each (group_dev given), then checks. */
static void run_batch(struct kvp_xfer_slice *s, size_t n, const int *gdev, uint64_t *sum)
{
    size_t group[16];
    for (size_t i = 0; i < n; i++)
        group[i] = i;
    struct kvp_devstage_batch b = {.slices = s, .n = n, .group = group, .group_dev = gdev, .n_groups = n,
                                   .sum = sum, .timeout_ms = 10000};
    kvp_devstage_run(DS, &b);
}

static void test_devstage_classify(void **state)
{
    (void)state;
    uint8_t host[64];
    struct kvp_devmem_info info;
    assert_true(kvp_devmem_available());
    assert_int_equal(kvp_devmem_classify(host, &info), 0);
    assert_int_equal(kvp_devmem_classify(DEV_A + 4096, &info), 1);
    assert_int_equal(info.ordinal, 0);
    assert_int_equal(info.base, (uintptr_t)DEV_A);
    assert_int_equal(info.size, 64 * MIB);
    uint8_t *d1 = fakecuda_dev_alloc(1, 8192);
    assert_non_null(d1);
    assert_int_equal(kvp_devmem_classify(d1 + 10, &info), 1);
    assert_int_equal(info.ordinal, 1);
    kvp_iov two[2] = {{DEV_A, 10}, {d1, 10}};
    int ord = -2;
    assert_int_equal(kvp_devmem_iov_class("t", "k", two, 2, &ord), KVP_ERR_INVALID); /* two devices */
    kvp_iov mixed[2] = {{host, 10}, {DEV_A + 100, 10}};
    assert_int_equal(kvp_devmem_iov_class("t", "k", mixed, 2, &ord), 1);
    assert_int_equal(ord, 0);
    kvp_iov past[1] = {{DEV_A + 64 * MIB - 8, 16}};
    assert_int_equal(kvp_devmem_iov_class("t", "k", past, 1, &ord), KVP_ERR_INVALID);
    /* registered: answered from the cache */
    assert_int_equal(kvp_devmem_remember((uintptr_t)DEV_B, 64 * MIB, 0), KVP_OK);
    assert_int_equal(kvp_devmem_registered_bytes(), 64 * MIB);
    assert_int_equal(kvp_devmem_classify(DEV_B + 5, &info), 1);
    kvp_devmem_forget((uintptr_t)DEV_B);
    assert_int_equal(kvp_devmem_registered_bytes(), 0);
}

/* Device, mixed and host items in one put, then one get into other device memory. */
static void test_devstage_put_get_bytes_and_checksums(void **state)
{
    (void)state;
    reset_net();
    size_t la = 5 * MIB + 17, lb = 3000, lh = 70000;
    uint8_t *src = malloc(la), *hb = malloc(lb), *hh = malloc(lh);
    fill(src, la, 1);
    fill(hb, lb, 2);
    fill(hh, lh, 3);
    memcpy(FC.shadow((uintptr_t)DEV_A), src, la); /* the "device" holds src */
    memcpy((uint8_t *)FC.shadow((uintptr_t)DEV_A) + 6 * MIB, src, 100);
    /* item 0: one device piece; item 1: host piece + device piece; item 2: host only */
    struct kvp_xfer_slice s[4] = {
        slice(DEV_A, la, 0, KVP_XFER_WRITE),
        slice(hb, lb, 10 * MIB, KVP_XFER_WRITE),
        slice(DEV_A + 6 * MIB, 100, 10 * MIB + lb, KVP_XFER_WRITE),
        slice(hh, lh, 20 * MIB, KVP_XFER_WRITE),
    };
    size_t group[4] = {0, 1, 1, 2};
    int gdev[3] = {0, 0, -1};
    uint64_t sum[3] = {0};
    struct kvp_devstage_batch b = {.slices = s, .n = 4, .group = group, .group_dev = gdev, .n_groups = 3,
                                   .sum = sum, .timeout_ms = 10000};
    assert_int_equal(kvp_devstage_run(DS, &b), KVP_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(s[i].status, KVP_OK);
    assert_memory_equal(NET.remote, src, la);
    assert_memory_equal(NET.remote + 10 * MIB, hb, lb);
    assert_memory_equal(NET.remote + 10 * MIB + lb, src, 100);
    assert_memory_equal(NET.remote + 20 * MIB, hh, lh);
    assert_true(sum[0] == XXH3_64bits(src, la));
    uint8_t cat[3100];
    memcpy(cat, hb, lb);
    memcpy(cat + lb, src, 100);
    assert_true(sum[1] == XXH3_64bits(cat, lb + 100));

    /* get them back: item 0 into DEV_B, item 1 into host + DEV_B+8M */
    uint8_t *gb = calloc(1, lb), *gh = calloc(1, lh);
    struct kvp_xfer_slice g[4] = {
        slice(DEV_B, la, 0, KVP_XFER_READ),
        slice(gb, lb, 10 * MIB, KVP_XFER_READ),
        slice(DEV_B + 8 * MIB, 100, 10 * MIB + lb, KVP_XFER_READ),
        slice(gh, lh, 20 * MIB, KVP_XFER_READ),
    };
    uint64_t gsum[3] = {0};
    b.slices = g;
    b.sum = gsum;
    assert_int_equal(kvp_devstage_run(DS, &b), KVP_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(g[i].status, KVP_OK);
    assert_memory_equal(FC.shadow((uintptr_t)DEV_B), src, la);
    assert_memory_equal(gb, hb, lb);
    assert_memory_equal(FC.shadow((uintptr_t)DEV_B + 8 * MIB), src, 100);
    assert_memory_equal(gh, hh, lh);
    assert_true(gsum[0] == sum[0] && gsum[1] == sum[1]);
    assert_int_equal(FC.pending(), 0);
    struct kvp_devstage_stats st;
    kvp_devstage_stats(DS, &st);
    assert_true(st.lanes >= 1 && st.lanes_busy == 0);
    assert_int_equal(st.bounce_bytes, (uint64_t)st.lanes * 2 * DEVSTAGE_DEFAULT_WINDOW);
    assert_true(st.staged_bytes >= 2 * (la + 100));
    free(src);
    free(hb);
    free(hh);
    free(gb);
    free(gh);
}

/* 64 MiB put and get on the virtual clock: copy and send each take 6.7 ms; pipelined, each call
 * must take at most 1.2 x that (a copy-then-send per slice would take 2x). */
static void test_devstage_pipelined_64mib_within_1_2x(void **state)
{
    (void)state;
    reset_net();
    size_t n = 64 * MIB;
    fill(FC.shadow((uintptr_t)DEV_A), n, 7);
    FC.set_ns_per_byte(COPY_NS_PER_BYTE);
    NET.ns_per_byte = SEND_NS_PER_BYTE;
    double copy_ns = (double)n * COPY_NS_PER_BYTE, send_ns = (double)n * SEND_NS_PER_BYTE;
    double bound = 1.2 * (copy_ns > send_ns ? copy_ns : send_ns);

    struct kvp_xfer_slice s = slice(DEV_A, n, 0, KVP_XFER_WRITE);
    int gdev = 0;
    uint64_t sum = 0;
    uint64_t t0 = FC.now_ns();
    run_batch(&s, 1, &gdev, &sum);
    double put_ns = (double)(FC.now_ns() - t0);
    assert_int_equal(s.status, KVP_OK);
    assert_memory_equal(NET.remote, FC.shadow((uintptr_t)DEV_A), n);

    struct kvp_xfer_slice g = slice(DEV_B, n, 0, KVP_XFER_READ);
    t0 = FC.now_ns();
    run_batch(&g, 1, &gdev, &sum);
    double get_ns = (double)(FC.now_ns() - t0);
    assert_int_equal(g.status, KVP_OK);
    assert_memory_equal(FC.shadow((uintptr_t)DEV_B), FC.shadow((uintptr_t)DEV_A), n);
    printf("# virtual clock, 64 MiB: copy %.2f ms, send %.2f ms; put %.2f ms (%.3fx), get %.2f ms (%.3fx) of "
           "max(copy, send)\n", copy_ns / 1e6, send_ns / 1e6, put_ns / 1e6, put_ns / (bound / 1.2), get_ns / 1e6,
           get_ns / (bound / 1.2));
    assert_true(put_ns <= bound);
    assert_true(get_ns <= bound);
    /* copy-bound (copies 2x slower than the network): still within 1.2 x copy time */
    FC.set_ns_per_byte(2 * COPY_NS_PER_BYTE);
    t0 = FC.now_ns();
    run_batch(&s, 1, &gdev, &sum);
    assert_true((double)(FC.now_ns() - t0) <= 1.2 * 2 * copy_ns);
    t0 = FC.now_ns();
    run_batch(&g, 1, &gdev, &sum);
    assert_true((double)(FC.now_ns() - t0) <= 1.2 * 2 * copy_ns);
    FC.set_ns_per_byte(0);
}

/* A get of 3 rounds: round 0's host-to-device copy is delayed by 5 s of virtual time, round 1
 * times out. The call must wait for round 0's copy (started), never start round 2's (cancelled),
 * and nothing may write the device buffer after it returned. */
static void test_devstage_timed_out_get_never_writes_after_return(void **state)
{
    (void)state;
    reset_net();
    size_t n = 3 * DEVSTAGE_DEFAULT_WINDOW;
    fill(NET.remote, n, 9);
    memset(FC.shadow((uintptr_t)DEV_B), 0xEE, n);
    size_t a0 = FC.audit_count();
    NET.timeout_from_call = 1;
    FC.delay_next_copy(5000000000ull);
    struct kvp_xfer_slice g = slice(DEV_B, n, 0, KVP_XFER_READ);
    int gdev = 0;
    uint64_t sum = 0;
    uint64_t t0 = FC.now_ns();
    run_batch(&g, 1, &gdev, &sum);
    uint64_t t_ret = FC.now_ns();
    assert_int_equal(g.status, KVP_ERR_TIMEOUT);
    assert_int_equal(FC.pending(), 0);      /* nothing of the call still queued */
    assert_true(t_ret - t0 >= 5000000000ull); /* it waited for the started copy */
    uint8_t *after = malloc(n);
    memcpy(after, FC.shadow((uintptr_t)DEV_B), n);
    FC.advance(1000000000000ull); /* anything still queued would land now */
    assert_memory_equal(after, FC.shadow((uintptr_t)DEV_B), n);
    size_t h2d = 0;
    for (size_t i = a0; i < FC.audit_count(); i++) {
        struct fakecuda_audit a;
        assert_true(FC.audit_get(i, &a));
        if (a.dev_addr >= (uintptr_t)DEV_B && a.dev_addr < (uintptr_t)DEV_B + 64 * MIB) {
            assert_true(a.end_ns <= t_ret);
            h2d++;
        }
    }
    assert_int_equal(h2d, 1); /* round 0 only: round 1 timed out, round 2 never started */
    assert_memory_equal(FC.shadow((uintptr_t)DEV_B), NET.remote, DEVSTAGE_DEFAULT_WINDOW);
    free(after);
}

/* The second of three copies fails at enqueue: that item fails with KVP_ERR_DEVICE, the other
 * two complete with the right bytes. */
static void test_devstage_copy_error_fails_that_item_only(void **state)
{
    (void)state;
    reset_net();
    fill(FC.shadow((uintptr_t)DEV_A), 3 * 4096, 11);
    memset(NET.remote, 0, 3 * 4096);
    struct kvp_devstage_stats st0, st1;
    kvp_devstage_stats(DS, &st0);
    struct kvp_xfer_slice s[3] = {slice(DEV_A, 4096, 0, KVP_XFER_WRITE),
                                  slice(DEV_A + 4096, 4096, 4096, KVP_XFER_WRITE),
                                  slice(DEV_A + 8192, 4096, 8192, KVP_XFER_WRITE)};
    int gdev[3] = {0, 0, 0};
    uint64_t sum[3];
    FC.fail_copy(1, 1 /* CUDA_ERROR_INVALID_VALUE */);
    run_batch(s, 3, gdev, sum);
    assert_int_equal(s[0].status, KVP_OK);
    assert_int_equal(s[1].status, KVP_ERR_DEVICE);
    assert_int_equal(s[2].status, KVP_OK);
    const uint8_t *d = FC.shadow((uintptr_t)DEV_A);
    assert_memory_equal(NET.remote, d, 4096);
    assert_memory_equal(NET.remote + 8192, d + 8192, 4096);
    kvp_devstage_stats(DS, &st1);
    assert_int_equal(st1.copy_errors - st0.copy_errors, 1);
    /* and for a get: the failing copy's item only */
    memset(FC.shadow((uintptr_t)DEV_B), 0, 3 * 4096);
    struct kvp_xfer_slice g[3] = {slice(DEV_B, 4096, 0, KVP_XFER_READ), slice(DEV_B + 4096, 4096, 4096, KVP_XFER_READ),
                                  slice(DEV_B + 8192, 4096, 8192, KVP_XFER_READ)};
    FC.fail_copy(0, 1);
    run_batch(g, 3, gdev, sum);
    assert_int_equal(g[0].status, KVP_ERR_DEVICE);
    assert_int_equal(g[1].status, KVP_OK);
    assert_int_equal(g[2].status, KVP_OK);
    assert_memory_equal((uint8_t *)FC.shadow((uintptr_t)DEV_B) + 8192, NET.remote + 8192, 4096);
}

/* Poisoned context: device items fail with KVP_ERR_DEVICE (classification or copies), host
 * items of the same batch complete; after healing (test-only), staging works again. */
static void test_devstage_poisoned_context_fails_device_items_only(void **state)
{
    (void)state;
    reset_net();
    uint8_t host[4096], back[4096] = {0};
    fill(host, sizeof host, 13);
    FC.poison(700 /* CUDA_ERROR_ILLEGAL_ADDRESS */);
    assert_int_equal(kvp_devmem_classify(DEV_A, NULL), KVP_ERR_DEVICE);
    assert_int_equal(kvp_devmem_classify(host, NULL), 0);
    kvp_iov iov = {DEV_A, 10};
    int ord;
    assert_int_equal(kvp_devmem_iov_class("t", "k", &iov, 1, &ord), KVP_ERR_DEVICE);
    /* a registered device range skips the query: its copies fail instead */
    assert_int_equal(kvp_devmem_remember((uintptr_t)DEV_A, 64 * MIB, 0), KVP_OK);
    struct kvp_xfer_slice s[2] = {slice(DEV_A, 4096, 0, KVP_XFER_WRITE), slice(host, 4096, 4096, KVP_XFER_WRITE)};
    int gdev[2] = {0, -1};
    uint64_t sum[2];
    run_batch(s, 2, gdev, sum);
    assert_int_equal(s[0].status, KVP_ERR_DEVICE);
    assert_int_equal(s[1].status, KVP_OK);
    struct kvp_xfer_slice g[2] = {slice(DEV_B, 4096, 0, KVP_XFER_READ), slice(back, 4096, 4096, KVP_XFER_READ)};
    run_batch(g, 2, gdev, sum);
    assert_int_equal(g[0].status, KVP_ERR_DEVICE);
    assert_int_equal(g[1].status, KVP_OK);
    assert_memory_equal(back, host, sizeof host);
    kvp_devmem_forget((uintptr_t)DEV_A);
    FC.reset_errors();
    struct kvp_xfer_slice ok = slice(DEV_A, 4096, 0, KVP_XFER_WRITE);
    run_batch(&ok, 1, gdev, sum);
    assert_int_equal(ok.status, KVP_OK);
}

/* Two replicas of one device item (the put's slices: replica 0 then replica 1, feed only on
 * replica 0), and an item on device 1 in the same batch (a second pipeline): both replicas
 * hold the bytes from one device-to-host copy, the checksums are those of the objects. */
static void test_devstage_replicas_and_two_devices(void **state)
{
    (void)state;
    reset_net();
    uint8_t *d1 = fakecuda_dev_alloc(1, 3 * MIB);
    assert_non_null(d1);
    size_t la = 6 * MIB + 5, lb = 3 * MIB;
    fill(FC.shadow((uintptr_t)DEV_A), la, 21);
    fill(FC.shadow((uintptr_t)d1), lb, 22);
    memset(NET.remote, 0, 40 * MIB);
    struct kvp_xfer_slice s[3] = {slice(DEV_A, la, 0, KVP_XFER_WRITE), slice(DEV_A, la, 10 * MIB, KVP_XFER_WRITE),
                                  slice(d1, lb, 20 * MIB, KVP_XFER_WRITE)};
    size_t group[3] = {0, 0, 1};
    uint8_t feed[3] = {1, 0, 1};
    int gdev[2] = {0, 1};
    uint64_t sum[2] = {0};
    struct kvp_devstage_batch b = {.slices = s, .n = 3, .group = group, .feed = feed, .group_dev = gdev,
                                   .n_groups = 2, .sum = sum, .timeout_ms = 10000};
    struct kvp_devstage_stats st0;
    kvp_devstage_stats(DS, &st0);
    assert_int_equal(kvp_devstage_run(DS, &b), KVP_OK);
    struct kvp_devstage_stats st1;
    kvp_devstage_stats(DS, &st1);
    /* replica 1 is sent from replica 0's bounce bytes: 2 copies for item 0 (4 MiB + 2 MiB), 1 for
     * item 1, not 5 */
    assert_int_equal(st1.copies - st0.copies, 3);
    const uint8_t *a = FC.shadow((uintptr_t)DEV_A);
    assert_memory_equal(NET.remote, a, la);
    assert_memory_equal(NET.remote + 10 * MIB, a, la);
    assert_memory_equal(NET.remote + 20 * MIB, FC.shadow((uintptr_t)d1), lb);
    assert_true(sum[0] == XXH3_64bits(a, la));
    assert_true(sum[1] == XXH3_64bits(FC.shadow((uintptr_t)d1), lb));
    struct kvp_devstage_stats st;
    kvp_devstage_stats(DS, &st);
    assert_true(st.lanes >= 2); /* one per device */
}

/* More concurrent batches on one device than it has lanes: they wait for a lane, and every one
 * moves its own bytes. */
struct conc_arg {
    int id;
    int ok;
};

static void *conc_thread(void *p)
{
    struct conc_arg *a = p;
    a->ok = 1;
    for (int it = 0; it < 20; it++) {
        uint8_t *src = DEV_A + (size_t)a->id * 2 * MIB;
        uint8_t *dst = DEV_B + (size_t)a->id * 2 * MIB;
        uint64_t roff = 100 * MIB + (uint64_t)a->id * 2 * MIB;
        struct kvp_xfer_slice s = slice(src, MIB + (size_t)it, roff, KVP_XFER_WRITE);
        int gdev = 0;
        uint64_t sum;
        run_batch(&s, 1, &gdev, &sum);
        struct kvp_xfer_slice g = slice(dst, MIB + (size_t)it, roff, KVP_XFER_READ);
        run_batch(&g, 1, &gdev, &sum);
        if (s.status != KVP_OK || g.status != KVP_OK ||
            memcmp(FC.shadow((uintptr_t)src), FC.shadow((uintptr_t)dst), MIB + (size_t)it) != 0)
            a->ok = 0;
    }
    return NULL;
}

static void test_devstage_concurrent_batches_share_lanes(void **state)
{
    (void)state;
    reset_net();
    enum { T = 6 };
    fill(FC.shadow((uintptr_t)DEV_A), 2 * MIB * T, 31);
    pthread_t th[T];
    struct conc_arg a[T];
    for (int i = 0; i < T; i++) {
        a[i] = (struct conc_arg){.id = i};
        assert_int_equal(pthread_create(&th[i], NULL, conc_thread, &a[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_true(a[i].ok);
    }
    struct kvp_devstage_stats st;
    kvp_devstage_stats(DS, &st);
    assert_true(st.lanes <= DEVSTAGE_MAX_LANES + 1 /* + device 1's */);
    assert_int_equal(st.lanes_busy, 0);
    assert_int_equal(FC.pending(), 0);
}

static double cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Figures for the closing note: CPU per staged put slice vs a host slice (model transport,
 * copies of zero virtual time), at 4 KiB (the fixed cost) and 64 KiB. Not asserted. */
static void test_devstage_cpu_per_slice_figure(void **state)
{
    (void)state;
    reset_net();
    enum { ITER = 2000 };
    uint8_t *h = malloc(64 * 1024);
    fill(h, 64 * 1024, 5);
    int gdev_dev = 0, gdev_host = -1;
    uint64_t sum;
    for (size_t len = 4096; len <= 64 * 1024; len *= 16) {
        double t0 = cpu_ns();
        for (int i = 0; i < ITER; i++) {
            struct kvp_xfer_slice s = slice(h, len, 0, KVP_XFER_WRITE);
            run_batch(&s, 1, &gdev_host, &sum);
        }
        double host_ns = (cpu_ns() - t0) / ITER;
        t0 = cpu_ns();
        for (int i = 0; i < ITER; i++) {
            struct kvp_xfer_slice s = slice(DEV_A, len, 0, KVP_XFER_WRITE);
            run_batch(&s, 1, &gdev_dev, &sum);
        }
        double dev_ns = (cpu_ns() - t0) / ITER;
        printf("# CPU per %zu KiB put slice (model transport): host %.2f us, staged device %.2f us (staged adds "
               "the XXH3 on the bounce buffer and the double's memcpy standing in for the DMA copy)\n",
               len / 1024, host_ns / 1e3, dev_ns / 1e3);
    }
    free(h);
}

int main(void)
{
    if (fakecuda_load() != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_devstage_classify),
        cmocka_unit_test(test_devstage_put_get_bytes_and_checksums),
        cmocka_unit_test(test_devstage_pipelined_64mib_within_1_2x),
        cmocka_unit_test(test_devstage_timed_out_get_never_writes_after_return),
        cmocka_unit_test(test_devstage_copy_error_fails_that_item_only),
        cmocka_unit_test(test_devstage_poisoned_context_fails_device_items_only),
        cmocka_unit_test(test_devstage_replicas_and_two_devices),
        cmocka_unit_test(test_devstage_concurrent_batches_share_lanes),
        cmocka_unit_test(test_devstage_cpu_per_slice_figure),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
