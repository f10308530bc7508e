/*
 * checksum.c — the object checksum (XXH3-64 of the concatenated iov pieces) every put computes
 * and every get verifies (contract: DESIGN.md C1). On x86-64 CPUs with AVX-512F the build in
 * checksum_avx512.c runs, with AVX2 the one in checksum_avx2.c (same values, faster); otherwise
 * the system libxxhash.
 */
#include <stdbool.h>
#include <xxhash.h>

#include "actors/client/client.h"

int kvp_client_checksum_simd_level(void)
{
#if defined(__x86_64__)
    /* No cache of our own (it was a shared atomic): libgcc fills its CPU model once, in a
     * constructor before main, and __builtin_cpu_supports only reads it (a few instructions next
     * to hashing a whole object). __builtin_cpu_init is that same one-time fill, for calls from
     * other constructors. libgcc reports AVX-512F only when the OS also saves the zmm state (XCR0). */
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
#else
    return 0;
#endif
}

uint64_t kvp_client_checksum(const kvp_iov *iov, size_t iovcnt, uint64_t size)
{
#if defined(__x86_64__)
    int level = kvp_client_checksum_simd_level();
    if (level == 2)
        return kvp_client_checksum_avx512(iov, iovcnt, size);
    if (level == 1)
        return kvp_client_checksum_avx2(iov, iovcnt, size);
#endif
    if (iovcnt >= 1 && iov[0].len >= size)
        return XXH3_64bits(iov[0].base, size);
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return 0; /* out of memory: a mismatch is reported as CORRUPT, never wrong bytes as OK */
    XXH3_64bits_reset(st);
    uint64_t left = size;
    for (size_t i = 0; i < iovcnt && left > 0; i++) {
        size_t l = iov[i].len < left ? iov[i].len : (size_t)left;
        if (l)
            XXH3_64bits_update(st, iov[i].base, l);
        left -= l;
    }
    uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
}
