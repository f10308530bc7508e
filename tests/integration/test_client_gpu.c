/*
 * test_client_gpu.c — device pointers in the client's data calls (issue 17) against a real local
 * cluster (3 masters, 1 segment, `kvpoolctl cluster up`) and the CUDA driver double
 * (tests/lib/fakecuda/, loaded through KVPOOL_LIBCUDA). Device memory is PROT_NONE: any CPU
 * access by kvpool kills the test. The pipelining and the fencing on the virtual clock are in
 * tests/unit/test_client_devstage.c; here: the real transfer engine and master, end to end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "actors/client/devstage.h"
#include "actors/transfer/fault.h"
#include "tests/integration/test_client_util.h"
#include "tests/lib/http_get.h"
#include "tests/lib/prom_check.h"
#include "tests/lib/fakecuda/fakecuda_load.h"

#define MIB (1ull << 20)

static struct tc_cluster CL;
static uint8_t *DEV, *DEV2; /* 32 MiB each, device 0 */

static int setup(void **state)
{
    (void)state;
    DEV = fakecuda_dev_alloc(0, 32 * MIB);
    DEV2 = fakecuda_dev_alloc(0, 32 * MIB);
    if (!DEV || !DEV2)
        return -1;
    if (tc_cluster_up(&CL, 1, "256M") != 0) {
        tc_cluster_down(&CL);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tc_cluster_down(&CL);
    return 0;
}

static uint8_t *shadow(const void *dev)
{
    return FC.shadow((uintptr_t)dev);
}

/* put/get/iov from device memory: registered (DEV) and not (DEV2), large (several bounce
 * windows through the real engine) and small, mixed with host keys in one batch. */
static void test_gpu_put_get_iov_from_device_memory(void **state)
{
    (void)state;
    kvp_client *c = tc_open(&CL, 20000);
    assert_non_null(c);
    assert_int_equal(kvp_register_buffer(c, DEV, 32 * MIB), KVP_OK);
    kvp_device_stats ds;
    assert_int_equal(kvp_client_device_stats(c, &ds), KVP_OK);
    assert_true(ds.driver_loaded);
    assert_int_equal(ds.registered_bytes, 32 * MIB);
    assert_true(ds.bounce_bytes > 0); /* pinned at registration */

    size_t big = 9 * MIB + 123;
    tc_fill("gpu-big", shadow(DEV), big);
    tc_fill("gpu-small", shadow(DEV2), 4096);
    uint8_t host[5000];
    tc_fill("gpu-host", host, sizeof host);
    const char *keys[] = {"gpu-big", "gpu-small", "gpu-host"};
    const void *bufs[] = {DEV, DEV2, host};
    size_t lens[] = {big, 4096, sizeof host};
    int res[3];
    assert_int_equal(kvp_batch_put(c, 3, keys, bufs, lens, NULL, res), KVP_OK);
    assert_int_equal(res[0], KVP_OK);
    assert_int_equal(res[1], KVP_OK);
    assert_int_equal(res[2], KVP_OK);

    /* back into other device memory (and the host key into device memory too) */
    void *gb[] = {DEV2 + 1 * MIB, DEV + 16 * MIB, DEV + 30 * MIB};
    size_t caps[] = {12 * MIB, 4096, 8192};
    int64_t gr[3];
    memset(shadow(DEV2 + MIB), 0, big);
    assert_int_equal(kvp_batch_get(c, 3, keys, gb, caps, 20000, gr), KVP_OK);
    assert_int_equal(gr[0], (int64_t)big);
    assert_int_equal(gr[1], 4096);
    assert_int_equal(gr[2], (int64_t)sizeof host);
    assert_true(tc_check("gpu-big", shadow(DEV2 + MIB), big));
    assert_true(tc_check("gpu-small", shadow(DEV + 16 * MIB), 4096));
    assert_true(tc_check("gpu-host", shadow(DEV + 30 * MIB), sizeof host));
    /* single-key calls */
    assert_int_equal(kvp_get(c, "gpu-small", DEV2 + 20 * MIB, 4096, 0), 4096);
    assert_true(tc_check("gpu-small", shadow(DEV2 + 20 * MIB), 4096));

    /* scatter-gather: host piece + device piece + device piece, out and back in other shapes */
    uint8_t all[3000];
    tc_fill("gpu-iov", all, sizeof all);
    uint8_t h0[1000];
    memcpy(h0, all, 1000);
    memcpy(shadow(DEV + 20 * MIB), all + 1000, 1500);
    memcpy(shadow(DEV2 + 25 * MIB), all + 2500, 500);
    kvp_iov pi[3] = {{h0, 1000}, {DEV + 20 * MIB, 1500}, {DEV2 + 25 * MIB, 500}};
    const kvp_iov *piv[] = {pi};
    size_t pc[] = {3};
    const char *ik[] = {"gpu-iov"};
    assert_int_equal(kvp_batch_put_iov(c, 1, ik, piv, pc, NULL, res), KVP_OK);
    assert_int_equal(res[0], KVP_OK);
    uint8_t g0[100];
    kvp_iov gi[2] = {{DEV + 24 * MIB, 2900}, {g0, 100}};
    const kvp_iov *giv[] = {gi};
    size_t gc[] = {2};
    assert_int_equal(kvp_batch_get_iov(c, 1, ik, giv, gc, 0, gr), KVP_OK);
    assert_int_equal(gr[0], 3000);
    assert_memory_equal(shadow(DEV + 24 * MIB), all, 2900);
    assert_memory_equal(g0, all + 2900, 100);

    assert_int_equal(kvp_client_device_stats(c, &ds), KVP_OK);
    assert_true(ds.staged_batches >= 4 && ds.copies >= 6 && ds.copy_errors == 0 && ds.lanes_busy == 0);
    assert_true(ds.staged_bytes >= 2 * big);
    assert_int_equal(kvp_unregister_buffer(c, DEV), KVP_OK);
    assert_int_equal(kvp_client_device_stats(c, &ds), KVP_OK);
    assert_int_equal(ds.registered_bytes, 0);
    tc_close(&c);
}

/* One copy fails: that key fails with KVP_ERR_DEVICE (and is not stored), the rest completes.
 * The client's metrics endpoint counts the copy errors. */
static void test_gpu_copy_error_fails_that_key_only(void **state)
{
    (void)state;
    kvp_config *cfg = NULL;
    assert_int_equal(kvp_config_new(&cfg), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "cluster_file", CL.file), KVP_OK);
    uint32_t port = kvp_test_free_port();
    char ps[16];
    snprintf(ps, sizeof ps, "%u", port);
    assert_int_equal(kvp_config_set(cfg, "metrics_port", ps), KVP_OK);
    kvp_client *c = NULL;
    assert_int_equal(kvp_client_open(cfg, &c), KVP_OK);
    kvp_config_destroy(&cfg);
    const char *keys[] = {"gpu-e0", "gpu-e1", "gpu-e2"};
    for (int i = 0; i < 3; i++)
        tc_fill(keys[i], shadow(DEV + (size_t)i * MIB), 10000);
    const void *bufs[] = {DEV, DEV + MIB, DEV + 2 * MIB};
    size_t lens[] = {10000, 10000, 10000};
    int res[3];
    FC.fail_copy(1, 1);
    assert_int_equal(kvp_batch_put(c, 3, keys, bufs, lens, NULL, res), KVP_OK);
    assert_int_equal(res[0], KVP_OK);
    assert_int_equal(res[1], KVP_ERR_DEVICE);
    assert_int_equal(res[2], KVP_OK);
    assert_int_equal(kvp_exists(c, "gpu-e1"), 0);
    void *gb[] = {DEV2, DEV2 + MIB, DEV2 + 2 * MIB};
    size_t caps[] = {10000, 10000, 10000};
    int64_t gr[3];
    const char *gk[] = {"gpu-e0", "gpu-e2", "gpu-e0"};
    FC.fail_copy(0, 1);
    assert_int_equal(kvp_batch_get(c, 3, gk, gb, caps, 0, gr), KVP_OK);
    assert_int_equal(gr[0], KVP_ERR_DEVICE);
    assert_int_equal(gr[1], 10000);
    assert_int_equal(gr[2], 10000);
    assert_true(tc_check("gpu-e2", shadow(DEV2 + MIB), 10000));
    assert_true(tc_check("gpu-e0", shadow(DEV2 + 2 * MIB), 10000));
    kvp_device_stats ds;
    assert_int_equal(kvp_client_device_stats(c, &ds), KVP_OK);
    assert_int_equal(ds.copy_errors, 2);
    int status = 0;
    char *body = NULL, why[256];
    assert_int_equal(kvp_test_http(port, "GET", "/metrics", &status, &body, NULL, 5000), 0);
    assert_int_equal(status, 200);
    assert_int_equal(kvp_test_prom_check(body, "kvpool_", why, sizeof why), 0);
    assert_true(kvp_test_prom_value(body, "kvpool_client_device_copy_errors_total") == 2);
    assert_true(kvp_test_prom_value(body, "kvpool_client_device_copies_total") >= 6);
    assert_true(kvp_test_prom_value(body, "kvpool_client_device_staged_bytes_total") >= 4 * 10000);
    assert_true(kvp_test_prom_value(body, "kvpool_client_device_lanes_busy") == 0);
    assert_true(kvp_test_prom_value(body, "kvpool_client_device_bounce_bytes") > 0);
    free(body);
    tc_close(&c);
}

/* A poisoned context: every device key fails with KVP_ERR_DEVICE, host keys keep working. */
static void test_gpu_poisoned_context_fails_device_keys_host_keys_work(void **state)
{
    (void)state;
    kvp_client *c = tc_open(&CL, 20000);
    assert_non_null(c);
    tc_fill("gpu-p-dev", shadow(DEV), 4096);
    FC.poison(700);
    uint8_t host[4096];
    tc_fill("gpu-p-host", host, sizeof host);
    const char *keys[] = {"gpu-p-dev", "gpu-p-host"};
    const void *bufs[] = {DEV, host};
    size_t lens[] = {4096, 4096};
    int res[2];
    assert_int_equal(kvp_batch_put(c, 2, keys, bufs, lens, NULL, res), KVP_OK);
    assert_int_equal(res[0], KVP_ERR_DEVICE);
    assert_int_equal(res[1], KVP_OK);
    uint8_t back[4096] = {0};
    void *gb[] = {DEV2, back};
    const char *gk[] = {"gpu-p-host", "gpu-p-host"};
    size_t caps[] = {4096, 4096};
    int64_t gr[2];
    assert_int_equal(kvp_batch_get(c, 2, gk, gb, caps, 0, gr), KVP_OK);
    assert_int_equal(gr[0], KVP_ERR_DEVICE);
    assert_int_equal(gr[1], 4096);
    assert_true(tc_check("gpu-p-host", back, sizeof back));
    assert_int_equal(kvp_put(c, "gpu-p-dev2", DEV, 100, NULL), KVP_ERR_DEVICE);
    assert_int_equal(kvp_put(c, "gpu-p-host2", host, 100, NULL), KVP_OK);
    FC.reset_errors();
    tc_close(&c);
}

/* At the first host-to-device copy of a get, the network starts dropping every read: the next
 * round of the get times out while that copy (delayed 5 s on the virtual clock) is queued. */
static void drop_reads_from_now(int kind, void *arg)
{
    bool *done = arg; /* once (the hook runs under the double's lock: no driver call here) */
    if (kind != FAKECUDA_H2D || *done)
        return;
    *done = true;
    struct kvp_xfer_fault_rule r = {.action = KVP_FAULT_DROP, .op = KVP_XFER_READ};
    kvp_xfer_fault_add(&r);
}

/* A timed-out get through the real engine: it returns KVP_ERR_TIMEOUT only after the queued
 * copy completed, and nothing writes the device buffer after it returned. */
static void test_gpu_timed_out_get_never_writes_device_memory_after_return(void **state)
{
    (void)state;
    kvp_client *c = tc_open(&CL, 20000);
    assert_non_null(c);
    size_t n = 3 * DEVSTAGE_DEFAULT_WINDOW; /* three rounds */
    tc_fill("gpu-to", shadow(DEV), n);
    assert_int_equal(kvp_put(c, "gpu-to", DEV, n, NULL), KVP_OK);
    memset(shadow(DEV2), 0xEE, n);
    size_t a0 = FC.audit_count();
    FC.delay_next_copy(5000000000ull);
    bool hooked = false;
    FC.on_enqueue(drop_reads_from_now, &hooked);
    uint64_t v0 = FC.now_ns();
    int64_t r = kvp_get(c, "gpu-to", DEV2, n, 400);
    uint64_t v_ret = FC.now_ns();
    kvp_xfer_fault_clear();
    FC.on_enqueue(NULL, NULL);
    assert_true(hooked);
    assert_int_equal(r, KVP_ERR_TIMEOUT);
    assert_int_equal(FC.pending(), 0);
    assert_true(v_ret - v0 >= 5000000000ull); /* it waited for the queued copy */
    uint8_t *after = malloc(n);
    assert_non_null(after);
    memcpy(after, shadow(DEV2), n);
    FC.advance(1000000000000ull);
    assert_memory_equal(after, shadow(DEV2), n);
    size_t copies = 0;
    for (size_t i = a0; i < FC.audit_count(); i++) {
        struct fakecuda_audit a;
        assert_true(FC.audit_get(i, &a));
        if (a.kind == FAKECUDA_H2D && a.dev_addr >= (uintptr_t)DEV2 && a.dev_addr < (uintptr_t)DEV2 + n) {
            assert_true(a.end_ns <= v_ret);
            copies++;
        }
    }
    assert_int_equal(copies, 1); /* round 0 only */
    free(after);
    /* the client keeps working */
    assert_int_equal(kvp_get(c, "gpu-to", DEV2, n, 0), (int64_t)n);
    assert_true(tc_check("gpu-to", shadow(DEV2), n));
    tc_close(&c);
}

int main(void)
{
    if (fakecuda_load() != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_put_get_iov_from_device_memory),
        cmocka_unit_test(test_gpu_copy_error_fails_that_key_only),
        cmocka_unit_test(test_gpu_poisoned_context_fails_device_keys_host_keys_work),
        cmocka_unit_test(test_gpu_timed_out_get_never_writes_device_memory_after_return),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
