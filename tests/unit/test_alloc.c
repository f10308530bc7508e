/* test_alloc.c — the per-segment offset allocator (actors/master/fsm/alloc.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "actors/master/fsm/alloc.h"
#include "kvpool.h"

static void test_alloc_round_aligns_and_rejects_overflow(void **state)
{
    (void)state;
    assert_int_equal(kvp_alloc_round(0), 0);
    assert_int_equal(kvp_alloc_round(1), 64);
    assert_int_equal(kvp_alloc_round(64), 64);
    assert_int_equal(kvp_alloc_round(65), 128);
    assert_int_equal(kvp_alloc_round(UINT64_MAX), 0);
    assert_int_equal(kvp_alloc_round(UINT64_MAX - 62), 0);
    assert_int_equal(kvp_alloc_round(UINT64_MAX - 63), UINT64_MAX - 63);
}

static void test_alloc_first_fit_aligned_offsets(void **state)
{
    (void)state;
    struct kvp_alloc a;
    assert_int_equal(kvp_alloc_init(&a, 1000), KVP_OK);
    assert_int_equal(a.capacity, 960); /* rounded down to 64 */
    assert_int_equal(a.free_bytes, 960);
    uint64_t o1, o2, o3;
    assert_int_equal(kvp_alloc_alloc(&a, 1, &o1), KVP_OK);
    assert_int_equal(kvp_alloc_alloc(&a, 100, &o2), KVP_OK);
    assert_int_equal(kvp_alloc_alloc(&a, 64, &o3), KVP_OK);
    assert_int_equal(o1, 0);
    assert_int_equal(o2, 64);
    assert_int_equal(o3, 192);
    assert_int_equal(a.free_bytes, 960 - 256);
    assert_int_equal(a.n_free, 1);
    assert_int_equal(kvp_alloc_largest_free(&a), 960 - 256);
    /* A hole at 64..192 is reused first fit by a request that fits it. */
    assert_int_equal(kvp_alloc_free(&a, o2, 100), KVP_OK);
    assert_int_equal(a.n_free, 2);
    uint64_t o4;
    assert_int_equal(kvp_alloc_alloc(&a, 65, &o4), KVP_OK);
    assert_int_equal(o4, 64);
    assert_int_equal(a.n_free, 1);
    assert_int_equal(kvp_alloc_check(&a), 0);
    kvp_alloc_fini(&a);
}

static void test_alloc_free_coalesces_neighbours(void **state)
{
    (void)state;
    struct kvp_alloc a;
    assert_int_equal(kvp_alloc_init(&a, 64 * 10), KVP_OK);
    uint64_t o[10];
    for (int i = 0; i < 10; i++)
        assert_int_equal(kvp_alloc_alloc(&a, 64, &o[i]), KVP_OK);
    assert_int_equal(a.n_free, 0);
    uint64_t x;
    assert_int_equal(kvp_alloc_alloc(&a, 64, &x), KVP_ERR_NO_SPACE);
    assert_int_equal(kvp_alloc_free(&a, o[3], 64), KVP_OK);
    assert_int_equal(kvp_alloc_free(&a, o[5], 64), KVP_OK);
    assert_int_equal(a.n_free, 2);
    assert_int_equal(kvp_alloc_largest_free(&a), 64);
    assert_int_equal(kvp_alloc_free(&a, o[4], 64), KVP_OK); /* joins 3 and 5 */
    assert_int_equal(a.n_free, 1);
    assert_int_equal(kvp_alloc_largest_free(&a), 192);
    assert_int_equal(kvp_alloc_alloc(&a, 192, &x), KVP_OK);
    assert_int_equal(x, 192);
    assert_int_equal(kvp_alloc_check(&a), 0);
    for (int i = 0; i < 10; i++)
        if (i < 3 || i > 5)
            assert_int_equal(kvp_alloc_free(&a, o[i], 64), KVP_OK);
    assert_int_equal(kvp_alloc_free(&a, 192, 192), KVP_OK);
    assert_int_equal(a.n_free, 1);
    assert_int_equal(a.free_bytes, 640);
    assert_int_equal(kvp_alloc_check(&a), 0);
    kvp_alloc_fini(&a);
}

static void test_alloc_bad_calls_invalid_unchanged(void **state)
{
    (void)state;
    struct kvp_alloc a;
    assert_int_equal(kvp_alloc_init(&a, 4096), KVP_OK);
    uint64_t off;
    assert_int_equal(kvp_alloc_alloc(&a, 0, &off), KVP_ERR_INVALID);
    assert_int_equal(kvp_alloc_alloc(&a, UINT64_MAX, &off), KVP_ERR_INVALID);
    assert_int_equal(kvp_alloc_alloc(&a, 4097, &off), KVP_ERR_NO_SPACE);
    assert_int_equal(kvp_alloc_alloc(&a, 1024, &off), KVP_OK);
    assert_int_equal(kvp_alloc_free(&a, 1, 64), KVP_ERR_INVALID);      /* misaligned */
    assert_int_equal(kvp_alloc_free(&a, 4096, 64), KVP_ERR_INVALID);   /* out of range */
    assert_int_equal(kvp_alloc_free(&a, 0, 8192), KVP_ERR_INVALID);    /* too long */
    assert_int_equal(kvp_alloc_free(&a, 1024, 64), KVP_ERR_INVALID);   /* already free */
    assert_int_equal(kvp_alloc_free(&a, 960, 128), KVP_ERR_INVALID);   /* overlaps free */
    assert_int_equal(kvp_alloc_free(&a, 0, 0), KVP_ERR_INVALID);
    assert_int_equal(a.free_bytes, 3072);
    assert_int_equal(kvp_alloc_free(&a, 0, 1024), KVP_OK);
    assert_int_equal(kvp_alloc_free(&a, 0, 64), KVP_ERR_INVALID);      /* double free */
    assert_int_equal(a.free_bytes, 4096);
    assert_int_equal(kvp_alloc_check(&a), 0);
    kvp_alloc_fini(&a);
    kvp_alloc_fini(&a); /* idempotent */
}

static void test_alloc_reserve_splits_free_extent(void **state)
{
    (void)state;
    struct kvp_alloc a;
    assert_int_equal(kvp_alloc_init(&a, 64 * 100), KVP_OK);
    assert_int_equal(kvp_alloc_reserve(&a, 64 * 10, 64 * 5), KVP_OK);
    assert_int_equal(a.n_free, 2);
    assert_int_equal(a.free_bytes, 64 * 95);
    assert_int_equal(kvp_alloc_reserve(&a, 64 * 12, 64), KVP_ERR_INVALID); /* used */
    assert_int_equal(kvp_alloc_reserve(&a, 64 * 8, 64 * 4), KVP_ERR_INVALID); /* straddles */
    assert_int_equal(kvp_alloc_reserve(&a, 0, 64 * 10), KVP_OK);  /* whole left piece */
    assert_int_equal(kvp_alloc_reserve(&a, 64 * 99, 64), KVP_OK); /* the tail */
    assert_int_equal(a.n_free, 1);
    assert_int_equal(a.free_bytes, 64 * 84);
    assert_int_equal(kvp_alloc_check(&a), 0);
    uint64_t off;
    assert_int_equal(kvp_alloc_alloc(&a, 64, &off), KVP_OK);
    assert_int_equal(off, 64 * 15);
    kvp_alloc_fini(&a);

    struct kvp_alloc full;
    kvp_alloc_init_full(&full, 6400);
    assert_int_equal(full.free_bytes, 0);
    assert_int_equal(kvp_alloc_alloc(&full, 64, &off), KVP_ERR_NO_SPACE);
    assert_int_equal(kvp_alloc_free(&full, 128, 64), KVP_OK);
    assert_int_equal(kvp_alloc_free(&full, 64, 64), KVP_OK);
    assert_int_equal(full.n_free, 1);
    assert_int_equal(kvp_alloc_check(&full), 0);
    kvp_alloc_fini(&full);
}

/* Deterministic xorshift for the test's own choices. */
static uint64_t rng_state = 0x1234567887654321ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

struct ext {
    uint64_t off, len;
};

struct mark_ctx {
    uint8_t *map;
    int overlap;
};

static void mark_free(void *ctx, uint64_t off, uint64_t len)
{
    struct mark_ctx *m = ctx;
    for (uint64_t b = off / 64; b < (off + len) / 64; b++) {
        if (m->map[b])
            m->overlap = 1;
        m->map[b] = 1;
    }
}

/* Every block is either free (once) or in exactly one allocated extent. */
static void check_bitmap(const struct kvp_alloc *a, const struct ext *v, size_t n)
{
    size_t blocks = a->capacity / 64;
    struct mark_ctx m = {.map = calloc(blocks, 1)};
    assert_non_null(m.map);
    kvp_alloc_foreach_free(a, mark_free, &m);
    for (size_t i = 0; i < n; i++)
        mark_free(&m, v[i].off, v[i].len);
    assert_int_equal(m.overlap, 0);
    for (size_t b = 0; b < blocks; b++)
        assert_int_equal(m.map[b], 1);
    free(m.map);
}

static void test_alloc_random_100k_ops_all_bytes_accounted(void **state)
{
    (void)state;
    const uint64_t cap = 64ull << 16; /* 65536 blocks */
    struct kvp_alloc a;
    assert_int_equal(kvp_alloc_init(&a, cap), KVP_OK);
    size_t n = 0, vcap = 1 << 16;
    struct ext *v = malloc(vcap * sizeof(*v));
    uint64_t used = 0, nospace = 0;
    for (int op = 0; op < 100000; op++) {
        if (n == 0 || (rnd() % 100) < 55) {
            uint64_t len = 1 + rnd() % (rnd() % 8 == 0 ? 64 * 200 : 64 * 4);
            uint64_t off;
            int rc = kvp_alloc_alloc(&a, len, &off);
            if (rc == KVP_ERR_NO_SPACE) {
                assert_true(kvp_alloc_largest_free(&a) < kvp_alloc_round(len));
                nospace++;
            } else {
                assert_int_equal(rc, KVP_OK);
                assert_int_equal(off % 64, 0);
                assert_true(off + kvp_alloc_round(len) <= a.capacity);
                if (n == vcap)
                    v = realloc(v, (vcap *= 2) * sizeof(*v));
                v[n++] = (struct ext){off, kvp_alloc_round(len)};
                used += kvp_alloc_round(len);
            }
        } else {
            size_t i = rnd() % n;
            assert_int_equal(kvp_alloc_free(&a, v[i].off, v[i].len), KVP_OK);
            used -= v[i].len;
            v[i] = v[--n];
        }
        assert_int_equal(used + a.free_bytes, a.capacity);
        if (op % 5000 == 0) {
            assert_int_equal(kvp_alloc_check(&a), 0);
            check_bitmap(&a, v, n);
        }
    }
    assert_int_equal(kvp_alloc_check(&a), 0);
    check_bitmap(&a, v, n);
    print_message("alloc random: %zu live extents, %llu free extents, largest %llu, %llu no-space\n",
                  n, (unsigned long long)a.n_free,
                  (unsigned long long)kvp_alloc_largest_free(&a), (unsigned long long)nospace);
    while (n)
        assert_int_equal(kvp_alloc_free(&a, v[n - 1].off, v[n - 1].len), KVP_OK), n--;
    assert_int_equal(a.n_free, 1);
    assert_int_equal(a.free_bytes, a.capacity);
    free(v);
    kvp_alloc_fini(&a);
}

/* 1e6 64-byte extents, then free every other one, then the rest: stays fast (log n). */
static void test_alloc_million_extents_coalesce_back(void **state)
{
    (void)state;
    const uint64_t n = 1000000;
    struct kvp_alloc a;
    assert_int_equal(kvp_alloc_init(&a, n * 64), KVP_OK);
    uint64_t off;
    for (uint64_t i = 0; i < n; i++)
        assert_int_equal(kvp_alloc_alloc(&a, 64, &off), KVP_OK);
    assert_int_equal(a.free_bytes, 0);
    for (uint64_t i = 0; i < n; i += 2)
        assert_int_equal(kvp_alloc_free(&a, i * 64, 64), KVP_OK);
    assert_int_equal(a.n_free, n / 2);
    assert_int_equal(kvp_alloc_largest_free(&a), 64);
    assert_int_equal(kvp_alloc_check(&a), 0);
    assert_int_equal(kvp_alloc_alloc(&a, 128, &off), KVP_ERR_NO_SPACE);
    for (uint64_t i = 1; i < n; i += 2)
        assert_int_equal(kvp_alloc_free(&a, i * 64, 64), KVP_OK);
    assert_int_equal(a.n_free, 1);
    assert_int_equal(kvp_alloc_largest_free(&a), n * 64);
    kvp_alloc_fini(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_round_aligns_and_rejects_overflow),
        cmocka_unit_test(test_alloc_first_fit_aligned_offsets),
        cmocka_unit_test(test_alloc_free_coalesces_neighbours),
        cmocka_unit_test(test_alloc_bad_calls_invalid_unchanged),
        cmocka_unit_test(test_alloc_reserve_splits_free_extent),
        cmocka_unit_test(test_alloc_random_100k_ops_all_bytes_accounted),
        cmocka_unit_test(test_alloc_million_extents_coalesce_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
