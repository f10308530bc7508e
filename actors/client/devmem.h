/*
 * devmem.h — is a caller's pointer GPU (device) memory, and the CUDA driver API kvpool uses to
 * stage it. Internal to the client library.
 *
 * kvpool moves bytes with the CPU (memcpy, readv/writev, XXH3), which must never touch device
 * memory: a device piece of a put or get goes through pinned bounce buffers (devstage.h).
 * Detection goes through the CUDA driver API, loaded at run time: dlopen("libcuda.so.1") (or the
 * path in KVPOOL_LIBCUDA, which tests use for the driver double tests/lib/fakecuda/) and
 * cuPointerGetAttribute (memory type, device ordinal, allocation range). Without a driver every
 * pointer is host memory and a check costs one load of a cached flag (pthread_once).
 */
#ifndef KVP_CLIENT_DEVMEM_H
#define KVP_CLIENT_DEVMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

typedef int kvp_cu_result;                /* CUresult: 0 = CUDA_SUCCESS */
typedef unsigned long long kvp_cu_devptr; /* CUdeviceptr on 64-bit hosts */

/* The driver API entry points kvpool calls (the ABI's _v2 names where the header maps to them). */
struct kvp_cuda {
    kvp_cu_result (*get_attr)(void *data, int attribute, kvp_cu_devptr ptr);
    kvp_cu_result (*addr_range)(kvp_cu_devptr *base, size_t *size, kvp_cu_devptr ptr);
    kvp_cu_result (*device_get)(int *dev, int ordinal);
    kvp_cu_result (*primary_retain)(void **ctx, int dev);
    kvp_cu_result (*primary_release)(int dev);
    kvp_cu_result (*ctx_push)(void *ctx);
    kvp_cu_result (*ctx_pop)(void **ctx);
    kvp_cu_result (*stream_create)(void **stream, unsigned flags);
    kvp_cu_result (*stream_destroy)(void *stream);
    kvp_cu_result (*stream_sync)(void *stream);
    kvp_cu_result (*event_create)(void **event, unsigned flags);
    kvp_cu_result (*event_destroy)(void *event);
    kvp_cu_result (*event_record)(void *event, void *stream);
    kvp_cu_result (*event_sync)(void *event);
    kvp_cu_result (*host_alloc)(void **p, size_t size, unsigned flags);
    kvp_cu_result (*host_free)(void *p);
    kvp_cu_result (*d2h_async)(void *dst, kvp_cu_devptr src, size_t n, void *stream);
    kvp_cu_result (*h2d_async)(kvp_cu_devptr dst, const void *src, size_t n, void *stream);
    kvp_cu_result (*error_name)(kvp_cu_result e, const char **name); /* may be NULL */
    /* GPUDirect RDMA (issue 20; NULL when the driver lacks them: GPU memory is then staged) */
    kvp_cu_result (*dev_attr)(int *v, int attribute, int dev);                /* cuDeviceGetAttribute */
    kvp_cu_result (*range_handle)(void *handle, kvp_cu_devptr p, size_t size, int type,
                                  unsigned long long flags);                  /* cuMemGetHandleForAddressRange */
    kvp_cu_result (*flush_gdr)(int target, int scope);                       /* cuFlushGPUDirectRDMAWrites */
};

/** true when the CUDA driver was found and initialised (loaded once, on the first check). */
bool kvp_devmem_available(void);

/** The loaded driver (NULL when kvp_devmem_available() is false). */
const struct kvp_cuda *kvp_devmem_driver(void);

/** "CUDA_ERROR_X (n)" for a driver result, into a static per-thread buffer. */
const char *kvp_devmem_errstr(kvp_cu_result r);

/* Where a pointer lives (kvp_devmem_classify). */
struct kvp_devmem_info {
    int ordinal;     /* device ordinal */
    uintptr_t base;  /* the allocation containing the pointer */
    size_t size;
};

/**
 * 0: host memory (also: NULL, no driver, managed memory); 1: device memory, *info filled (may be
 * NULL); KVP_ERR_DEVICE: the driver failed to answer for this pointer other than "not mine"
 * (a poisoned context): the caller fails the key (the pointer may be device memory, which the
 * CPU must not touch). Registered device ranges answer from a cache without a driver call.
 */
int kvp_devmem_classify(const void *addr, struct kvp_devmem_info *info);

/** true when addr is device memory (kvp_devmem_classify() == 1). */
bool kvp_devmem_is_device(const void *addr);

/**
 * Classify an object's pieces: 0 when none (of non-zero length) is device memory; 1 when some
 * are, all on one device (*ordinal set); else KVP_ERR_DEVICE (driver failure) or KVP_ERR_INVALID
 * (pieces on two devices), with a WARN line naming `fn` and the key.
 */
int kvp_devmem_iov_class(const char *fn, const char *key, const kvp_iov *iov, size_t iovcnt, int *ordinal);

/**
 * Remember [base, base+len) as device memory of `ordinal` (kvp_register_buffer on device memory):
 * later classifications inside it cost no driver call. Counted (a range registered twice needs
 * two forgets). KVP_ERR_NOMEM.
 */
int kvp_devmem_remember(uintptr_t base, size_t len, int ordinal);
void kvp_devmem_forget(uintptr_t base);

/** Bytes of device memory remembered (registered) now. */
uint64_t kvp_devmem_registered_bytes(void);

/** Replaced registration tables not yet freed (tests: stays 0 after a change made while no other
 *  thread is looking a range up; see devmem.c). */
size_t kvp_devmem_retired_tables(void);

#endif
