/*
 * test_batch_util.h — the batch round trip shared by test_client_fakemaster.c and
 * test_client_cluster.c. Header-only (static functions); needs cmocka included first.
 */
#ifndef KVP_TEST_BATCH_UTIL_H
#define KVP_TEST_BATCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "tests/integration/test_client_util.h"

/* batch_put n keys "<prefix>-<i>" of len + i % len_mod bytes (payloads from tc_fill) with
 * replica_num replicas, every result OK; batch_get them into poisoned buffers, every size
 * right and every payload intact; batch_exists says 1 for each. */
static inline void tb_batch_roundtrip(kvp_client *c, size_t n, const char *prefix, size_t len,
                                      size_t len_mod, uint32_t replicas)
{
    char **keys = calloc(n, sizeof *keys);
    void **bufs = calloc(n, sizeof *bufs);
    size_t *lens = calloc(n, sizeof *lens);
    int *res = calloc(n, sizeof *res);
    int64_t *gres = calloc(n, sizeof *gres);
    for (size_t i = 0; i < n; i++) {
        keys[i] = malloc(64);
        snprintf(keys[i], 64, "%s-%zu", prefix, i);
        lens[i] = len + i % len_mod;
        bufs[i] = malloc(lens[i]);
        tc_fill(keys[i], bufs[i], lens[i]);
    }
    kvp_put_opts o = {.replica_num = replicas};
    assert_int_equal(kvp_batch_put(c, n, (const char *const *)keys, (const void *const *)bufs, lens, &o, res),
                     KVP_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(res[i], KVP_OK);
    for (size_t i = 0; i < n; i++)
        memset(bufs[i], TC_POISON, lens[i]);
    assert_int_equal(kvp_batch_get(c, n, (const char *const *)keys, bufs, lens, 0, gres), KVP_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(gres[i], (int64_t)lens[i]);
        assert_true(tc_check(keys[i], bufs[i], lens[i]));
    }
    int *ex = calloc(n, sizeof *ex);
    assert_int_equal(kvp_batch_exists(c, n, (const char *const *)keys, ex), KVP_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ex[i], 1);
    for (size_t i = 0; i < n; i++) {
        free(keys[i]);
        free(bufs[i]);
    }
    free(ex);
    free(keys);
    free(bufs);
    free(lens);
    free(res);
    free(gres);
}

#endif
