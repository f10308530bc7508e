/*
 * fuzz_common.h — shared by the fuzz targets (tests/fuzz/fuzz_*.c).
 *
 * Each target defines LLVMFuzzerTestOneInput() and the counter kvp_fuzz_decoded, incremented
 * for every input its decoder accepted. The same file is linked either with libFuzzer
 * (-DKVP_FUZZ=ON, clang) or with fuzz_driver.c, a plain replay/mutation driver that the
 * normal test suite runs (label `fuzz`). FUZZ_CHECK aborts on a broken invariant so both
 * libFuzzer and the driver (under ASan/UBSan or not) report it as a crash.
 */
#ifndef KVP_TESTS_FUZZ_COMMON_H
#define KVP_TESTS_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern unsigned long kvp_fuzz_decoded;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond);    \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
