/*
 * devmem.h — is a caller's pointer GPU (device) memory? Internal to the client library.
 *
 * kvpool moves bytes with the CPU (memcpy, readv/writev), so a device pointer given to a put or
 * a get would crash the process. Until GPU staging exists (next issue), such a pointer fails its
 * key with KVP_ERR_UNSUPPORTED and a log line instead. Detection goes through the CUDA driver
 * API, loaded at run time: dlopen("libcuda.so.1") (or the path in the environment variable
 * KVPOOL_LIBCUDA, which tests use for a fake driver) and cuPointerGetAttribute
 * (CU_POINTER_ATTRIBUTE_MEMORY_TYPE). Without a driver every pointer is host memory and a check
 * costs one load of a cached flag.
 */
#ifndef KVP_CLIENT_DEVMEM_H
#define KVP_CLIENT_DEVMEM_H

#include <stdbool.h>
#include <stddef.h>

#include "kvpool.h"

/** true when the CUDA driver was found and initialised (loaded once, on the first check). */
bool kvp_devmem_available(void);

/**
 * true when [addr, addr+len) starts in device memory (CU_MEMORYTYPE_DEVICE and not managed
 * memory, which the CPU can touch). Host memory, NULL, and anything when no driver is loaded are
 * false. Thread-safe; does not block beyond one driver call.
 */
bool kvp_devmem_is_device(const void *addr);

/**
 * KVP_OK when no piece of iov[0..iovcnt-1] (of non-zero length) is device memory; else
 * KVP_ERR_UNSUPPORTED with a WARN line naming `fn`, the key and the piece.
 */
int kvp_devmem_check_iov(const char *fn, const char *key, const kvp_iov *iov, size_t iovcnt);

#endif
