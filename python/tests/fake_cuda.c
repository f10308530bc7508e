/*
 * fake_cuda.c — a test double of the CUDA driver API (built as libcuda.so.1 under
 * build/python/fakecuda/). It exports the two functions kvpool's device-pointer check uses
 * (actors/client/devmem.c): cuInit succeeds, and cuPointerGetAttribute reports the address
 * range in the environment variable FAKE_CUDA_DEVICE_RANGE ("ADDR:LEN", decimal, read on
 * every call) as device memory; every other address gets CUDA_ERROR_INVALID_VALUE, as the real
 * driver answers for host memory it does not know. FAKE_CUDA_CALLS counts the calls (for the
 * test's check that the double was used).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_MEMORYTYPE_DEVICE 2

int cuInit(unsigned flags)
{
    (void)flags;
    return CUDA_SUCCESS;
}

int cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr)
{
    unsigned long long lo = 0, len = 0;
    const char *r = getenv("FAKE_CUDA_DEVICE_RANGE");
    if (!r || sscanf(r, "%llu:%llu", &lo, &len) != 2 || ptr < lo || ptr >= lo + len)
        return CUDA_ERROR_INVALID_VALUE;
    if (attribute == CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
        *(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
    else if (attribute == CU_POINTER_ATTRIBUTE_IS_MANAGED)
        *(unsigned int *)data = 0;
    else
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}
