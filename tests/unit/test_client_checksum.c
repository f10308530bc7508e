/* test_client_checksum.c — the object checksum (actors/client/checksum.c) equals the system
 * libxxhash's XXH3-64 of the concatenated bytes, whatever build runs (AVX-512F, AVX2 or
 * portable) and however the object is cut into iov pieces. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "actors/client/client.h"

static void test_client_checksum_matches_xxh3(void **state)
{
    (void)state;
    size_t max = (5u << 20) + 123;
    uint8_t *buf = malloc(max);
    assert_non_null(buf);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < max; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (uint8_t)x;
    }
    static const size_t sizes[] = {1, 3, 16, 17, 128, 129, 240, 241, 1024, 4096, 65537, 1u << 20, 4u << 20, (5u << 20) + 123};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s];
        uint64_t want = XXH3_64bits(buf, n);
        kvp_iov one = {buf, n};
        assert_true(kvp_client_checksum(&one, 1, n) == want);
        /* a larger buffer than the object: only `size` bytes count */
        kvp_iov big = {buf, max};
        assert_true(kvp_client_checksum(&big, 1, n) == want);
        /* cut into pieces (one empty) */
        size_t a = n / 3, b = n / 2;
        kvp_iov parts[4] = {{buf, a}, {buf + a, 0}, {buf + a, b - a}, {buf + b, n - b}};
        assert_true(kvp_client_checksum(parts, 4, n) == want);
#if defined(__x86_64__)
        /* every SIMD build this CPU can run, not only the one the dispatcher picks */
        int level = kvp_client_checksum_simd_level();
        if (level >= 1) {
            assert_true(kvp_client_checksum_avx2(&one, 1, n) == want);
            assert_true(kvp_client_checksum_avx2(parts, 4, n) == want);
        }
        if (level >= 2) {
            assert_true(kvp_client_checksum_avx512(&one, 1, n) == want);
            assert_true(kvp_client_checksum_avx512(parts, 4, n) == want);
        }
#endif
    }
    print_message("checksum build in use: %s\n", (const char *[]){"portable", "AVX2", "AVX-512F"}[kvp_client_checksum_simd_level()]);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_checksum_matches_xxh3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
