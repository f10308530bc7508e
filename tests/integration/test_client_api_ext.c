/*
 * test_client_api_ext.c — the calls of include/kvpool.h added for language bindings (issue 16:
 * actors/client/api_ext.c) against a real local cluster (3 masters, 1 segment, `kvpoolctl
 * cluster up`): kvp_batch_get_size, kvp_get_alloc, kvp_batch_replica_count, kvp_remove_all,
 * kvp_client_segment_name/_endpoint, kvp_register_buffer_overlap, kvp_client_drain, and the
 * device-pointer check without a CUDA driver. The Python tests (python/tests) cover them again
 * through the binding.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "actors/client/devmem.h"
#include "tests/integration/test_client_util.h"

static struct tc_cluster CL;

static int setup(void **state)
{
    (void)state;
    if (tc_cluster_up(&CL, 1, "64M") != 0) {
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

static kvp_client *open_embedded(uint64_t seg_bytes)
{
    kvp_config *cfg = NULL;
    assert_int_equal(kvp_config_new(&cfg), KVP_OK);
    char sz[32];
    snprintf(sz, sizeof sz, "%llu", (unsigned long long)seg_bytes);
    assert_int_equal(kvp_config_set(cfg, "cluster_file", CL.file), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "global_segment_size", sz), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "protocol", "rdma"), KVP_OK); /* runs on TCP, with a WARN */
    kvp_client *c = NULL;
    assert_int_equal(kvp_client_open(cfg, &c), KVP_OK);
    kvp_config_destroy(&cfg);
    return c;
}

static void put_bytes(kvp_client *c, const char *key, size_t len)
{
    uint8_t *b = malloc(len);
    assert_non_null(b);
    tc_fill(key, b, len);
    assert_int_equal(kvp_put(c, key, b, len, NULL), KVP_OK);
    free(b);
}

static void test_api_ext_sizes_alloc_get_and_replica_counts(void **state)
{
    (void)state;
    kvp_client *c = tc_open(&CL, 10000);
    assert_non_null(c);
    put_bytes(c, "ext-a", 1000);
    put_bytes(c, "ext-b", 1);
    const char *keys[] = {"ext-a", "ext-missing", "", "ext-b"};
    int64_t sizes[4];
    assert_int_equal(kvp_batch_get_size(c, 4, keys, sizes), KVP_OK);
    assert_int_equal(sizes[0], 1000);
    assert_int_equal(sizes[1], KVP_ERR_NOT_FOUND);
    assert_int_equal(sizes[2], KVP_ERR_INVALID);
    assert_int_equal(sizes[3], 1);
    assert_int_equal(kvp_batch_get_size(c, 0, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_batch_get_size(c, 2, NULL, sizes), KVP_ERR_INVALID);

    void *p = (void *)1;
    assert_int_equal(kvp_get_alloc(c, "ext-a", &p, 0), 1000);
    assert_non_null(p);
    assert_true(tc_check("ext-a", p, 1000));
    free(p);
    assert_int_equal(kvp_get_alloc(c, "ext-missing", &p, 0), KVP_ERR_NOT_FOUND);
    assert_null(p);
    assert_int_equal(kvp_get_alloc(c, "ext-a", NULL, 0), KVP_ERR_INVALID);

    int cnt[4];
    assert_int_equal(kvp_batch_replica_count(c, 4, keys, cnt), KVP_OK);
    assert_int_equal(cnt[0], 1);
    assert_int_equal(cnt[1], KVP_ERR_NOT_FOUND);
    assert_int_equal(cnt[2], KVP_ERR_INVALID);
    assert_int_equal(cnt[3], 1);

    /* remove_all: refused while leased (the reads above took leases), then forced */
    uint64_t removed = 99;
    int rc = kvp_remove_all(c, false, &removed);
    assert_true(rc == KVP_ERR_LEASED || rc == KVP_OK);
    assert_int_equal(kvp_remove_all(c, true, &removed), KVP_OK);
    assert_true(removed >= (rc == KVP_OK ? 0u : 2u));
    assert_int_equal(kvp_exists(c, "ext-a"), 0);
    assert_int_equal(kvp_remove_all(NULL, true, NULL), KVP_ERR_INVALID);
    tc_close(&c);
}

static void test_api_ext_register_overlap_and_segment_names(void **state)
{
    (void)state;
    kvp_client *c = tc_open(&CL, 10000);
    assert_non_null(c);
    static char buf[8192];
    char name[128];
    assert_int_equal(kvp_client_segment_name(c, name, sizeof name), KVP_ERR_NOT_FOUND);
    assert_string_equal(name, "");
    assert_int_equal(kvp_client_segment_endpoint(c, name, sizeof name), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_client_segment_name(c, NULL, 4), KVP_ERR_INVALID);
    assert_int_equal(kvp_register_buffer(c, buf, sizeof buf), KVP_OK);
    assert_int_equal(kvp_register_buffer(c, buf + 100, 100), KVP_ERR_INVALID); /* unchanged meaning */
    assert_int_equal(kvp_register_buffer_overlap(c, buf + 100, 100), KVP_OK);
    assert_int_equal(kvp_register_buffer_overlap(c, buf, 10), KVP_OK); /* same start, nested */
    assert_int_equal(kvp_register_buffer_overlap(c, buf, 0), KVP_ERR_INVALID);
    assert_int_equal(kvp_unregister_buffer(c, buf), KVP_OK);
    assert_int_equal(kvp_unregister_buffer(c, buf), KVP_OK);
    assert_int_equal(kvp_unregister_buffer(c, buf), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_unregister_buffer(c, buf + 100), KVP_OK);
    assert_int_equal(kvp_client_drain(c, 0, NULL), KVP_OK); /* no embedded segment: nothing to move */
    tc_close(&c);

    c = open_embedded(8 << 20);
    assert_int_equal(kvp_client_segment_name(c, name, sizeof name), KVP_OK);
    assert_true(strncmp(name, "client-", 7) == 0);
    assert_int_equal(kvp_client_segment_name(c, name, 3), KVP_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(kvp_client_segment_endpoint(c, name, sizeof name), KVP_OK);
    assert_non_null(strchr(name, ':'));
    tc_close(&c);
}

/* The embedded segment drains into the cluster's segment: its objects stay readable after close. */
static void test_api_ext_drain_moves_objects_then_close(void **state)
{
    (void)state;
    kvp_client *c = open_embedded(8 << 20);
    char seg[128];
    assert_int_equal(kvp_client_segment_name(c, seg, sizeof seg), KVP_OK);
    kvp_put_opts o = {.preferred_segment = seg};
    uint8_t b[4096];
    tc_fill("ext-drain", b, sizeof b);
    assert_int_equal(kvp_put(c, "ext-drain", b, sizeof b, &o), KVP_OK);
    uint64_t left = 99;
    assert_int_equal(kvp_client_drain(c, 60000, &left), KVP_OK);
    assert_int_equal(left, 0);
    tc_close(&c);
    kvp_client *r = tc_open(&CL, 10000);
    assert_non_null(r);
    uint8_t d[4096];
    assert_int_equal(kvp_get(r, "ext-drain", d, sizeof d, 0), (int64_t)sizeof d);
    assert_true(tc_check("ext-drain", d, sizeof d));
    assert_int_equal(kvp_remove(r, "ext-drain", true), KVP_OK);
    tc_close(&r);
}

static void test_api_ext_no_cuda_driver_means_host_memory(void **state)
{
    (void)state;
    if (getenv("KVPOOL_LIBCUDA"))
        skip();
    static char buf[64];
    kvp_iov iov = {.base = buf, .len = sizeof buf};
    assert_false(kvp_devmem_is_device(buf));
    assert_int_equal(kvp_devmem_iov_class("test", "k", &iov, 1, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_api_ext_sizes_alloc_get_and_replica_counts),
        cmocka_unit_test(test_api_ext_register_overlap_and_segment_names),
        cmocka_unit_test(test_api_ext_drain_moves_objects_then_close),
        cmocka_unit_test(test_api_ext_no_cuda_driver_means_host_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
