/*
 * checksum_simd.h — the XXH3-64 object checksum over an iov list, as an inline body that each
 * SIMD build (checksum_avx2.c: -mavx2, checksum_avx512.c: -mavx512f) compiles with xxhash's
 * XXH_INLINE_ALL, so xxhash picks that vector width. The values are XXH3-64's, bit for bit the
 * same as the portable libxxhash's (tests/unit/test_client_checksum.c); only the speed differs.
 * Include from exactly those files, after defining nothing: it defines XXH_INLINE_ALL itself.
 */
#ifndef KVP_CLIENT_CHECKSUM_SIMD_H
#define KVP_CLIENT_CHECKSUM_SIMD_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/* XXH3-64 of the first `size` bytes of the concatenated iov pieces. */
static inline uint64_t kvp_checksum_simd_body(const kvp_iov *iov, size_t iovcnt, uint64_t size)
{
    if (iovcnt >= 1 && iov[0].len >= size)
        return XXH3_64bits(iov[0].base, (size_t)size);
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    uint64_t left = size;
    for (size_t i = 0; i < iovcnt && left > 0; i++) {
        size_t l = iov[i].len < left ? iov[i].len : (size_t)left;
        if (l)
            XXH3_64bits_update(&st, iov[i].base, l);
        left -= l;
    }
    return XXH3_64bits_digest(&st);
}

#endif
