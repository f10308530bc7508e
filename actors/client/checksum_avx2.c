/*
 * checksum_avx2.c — XXH3-64 of an object built with AVX2 (this file alone is compiled with
 * -mavx2, see CMakeLists.txt; checksum.c calls it only when the CPU reports AVX2). The values
 * are XXH3-64's, bit for bit the same as the portable build's: only the speed differs (about
 * 2.5x on 4 MiB objects on the benchmark VM).
 */
#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

#if defined(__x86_64__) && defined(__AVX2__)
#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t kvp_client_checksum_avx2(const kvp_iov *iov, size_t iovcnt, uint64_t size);

uint64_t kvp_client_checksum_avx2(const kvp_iov *iov, size_t iovcnt, uint64_t size)
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
