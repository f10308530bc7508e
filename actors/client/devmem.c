/* devmem.c — device-pointer detection and the CUDA driver API table (devmem.h). */
#include "actors/client/devmem.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime/log.h"

#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_MEMORYTYPE_DEVICE 2
#define CUDA_ERROR_INVALID_VALUE 1

static struct kvp_cuda drv;
static bool drv_ok;

/* Process-wide, loaded once: pthread_once rather than a message because the driver handle is
 * immutable after loading and any API thread may be the first to need it (no actor owns it). */
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void *sym(void *h, const char *name, bool *missing)
{
    void *p = dlsym(h, name);
    if (!p)
        *missing = true;
    return p;
}

static void drv_load(void)
{
    const char *path = getenv("KVPOOL_LIBCUDA");
    if (!path || !*path)
        path = "libcuda.so.1";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return; /* no driver: every pointer is host memory */
    bool miss = false;
    kvp_cu_result (*init)(unsigned) = (kvp_cu_result(*)(unsigned))sym(h, "cuInit", &miss);
#define S(field, name) *(void **)&drv.field = sym(h, name, &miss)
    S(get_attr, "cuPointerGetAttribute");
    S(addr_range, "cuMemGetAddressRange_v2");
    S(device_get, "cuDeviceGet");
    S(primary_retain, "cuDevicePrimaryCtxRetain");
    S(primary_release, "cuDevicePrimaryCtxRelease_v2");
    S(ctx_push, "cuCtxPushCurrent_v2");
    S(ctx_pop, "cuCtxPopCurrent_v2");
    S(stream_create, "cuStreamCreate");
    S(stream_destroy, "cuStreamDestroy_v2");
    S(stream_sync, "cuStreamSynchronize");
    S(event_create, "cuEventCreate");
    S(event_destroy, "cuEventDestroy_v2");
    S(event_record, "cuEventRecord");
    S(event_sync, "cuEventSynchronize");
    S(host_alloc, "cuMemHostAlloc");
    S(host_free, "cuMemFreeHost");
    S(d2h_async, "cuMemcpyDtoHAsync_v2");
    S(h2d_async, "cuMemcpyHtoDAsync_v2");
#undef S
    *(void **)&drv.error_name = dlsym(h, "cuGetErrorName"); /* optional */
    /* optional: GPUDirect RDMA through dma-buf (CUDA 11.7+); without them GPU memory is staged */
    *(void **)&drv.dev_attr = dlsym(h, "cuDeviceGetAttribute");
    *(void **)&drv.range_handle = dlsym(h, "cuMemGetHandleForAddressRange");
    *(void **)&drv.flush_gdr = dlsym(h, "cuFlushGPUDirectRDMAWrites");
    if (miss || init(0) != 0) {
        kvp_log_info("devmem", "%s loaded but not usable (cuInit failed or symbols missing): pointers are "
                     "taken as host memory", path);
        dlclose(h);
        return;
    }
    drv_ok = true; /* the handle stays open for the life of the process */
    kvp_log_info("devmem", "CUDA driver %s: device pointers are staged through pinned bounce buffers", path);
}

bool kvp_devmem_available(void)
{
    pthread_once(&drv_once, drv_load);
    return drv_ok;
}

const struct kvp_cuda *kvp_devmem_driver(void)
{
    return kvp_devmem_available() ? &drv : NULL;
}

const char *kvp_devmem_errstr(kvp_cu_result r)
{
    static __thread char buf[80];
    const char *name = NULL;
    if (!drv.error_name || drv.error_name(r, &name) != 0 || !name)
        name = "CUDA_ERROR";
    snprintf(buf, sizeof buf, "%s (%d)", name, r);
    return buf;
}

/* ------------------------------------------------------------------ registered ranges */

struct reg_range {
    uintptr_t base;
    size_t len;
    int ordinal;
};

/* Registered device ranges: written by kvp_register_buffer, read by every classification on
 * any API thread. A lock rather than an actor message: a lookup is a few loads on the data
 * path of every call, and no actor owns process-wide driver state. */
static pthread_rwlock_t reg_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct reg_range *regs;
static size_t n_regs, cap_regs;
/* n_regs mirrored for the lock-free "any registered range?" test on the data path. */
static atomic_size_t n_regs_hint;
static uint64_t reg_bytes;

int kvp_devmem_remember(uintptr_t base, size_t len, int ordinal)
{
    int rc = KVP_OK;
    pthread_rwlock_wrlock(&reg_lock);
    if (n_regs == cap_regs) {
        size_t cap = cap_regs ? cap_regs * 2 : 8;
        struct reg_range *nr = realloc(regs, cap * sizeof *nr);
        if (!nr) {
            rc = KVP_ERR_NOMEM;
            goto out;
        }
        regs = nr;
        cap_regs = cap;
    }
    regs[n_regs++] = (struct reg_range){.base = base, .len = len, .ordinal = ordinal};
    reg_bytes += len;
    atomic_store_explicit(&n_regs_hint, n_regs, memory_order_relaxed);
out:
    pthread_rwlock_unlock(&reg_lock);
    return rc;
}

void kvp_devmem_forget(uintptr_t base)
{
    pthread_rwlock_wrlock(&reg_lock);
    for (size_t i = n_regs; i-- > 0;) {
        if (regs[i].base == base) {
            reg_bytes -= regs[i].len;
            regs[i] = regs[--n_regs];
            atomic_store_explicit(&n_regs_hint, n_regs, memory_order_relaxed);
            break;
        }
    }
    pthread_rwlock_unlock(&reg_lock);
}

uint64_t kvp_devmem_registered_bytes(void)
{
    pthread_rwlock_rdlock(&reg_lock);
    uint64_t b = reg_bytes;
    pthread_rwlock_unlock(&reg_lock);
    return b;
}

static bool reg_lookup(uintptr_t a, struct kvp_devmem_info *info)
{
    bool hit = false;
    pthread_rwlock_rdlock(&reg_lock);
    for (size_t i = 0; i < n_regs && !hit; i++) {
        if (a >= regs[i].base && a - regs[i].base < regs[i].len) {
            hit = true;
            if (info)
                *info = (struct kvp_devmem_info){.ordinal = regs[i].ordinal, .base = regs[i].base, .size = regs[i].len};
        }
    }
    pthread_rwlock_unlock(&reg_lock);
    return hit;
}

/* ------------------------------------------------------------------ classification */

int kvp_devmem_classify(const void *addr, struct kvp_devmem_info *info)
{
    if (!addr || !kvp_devmem_available())
        return 0;
    uintptr_t a = (uintptr_t)addr;
    /* a stale hint only costs the driver call (a miss) or one locked lookup */
    if (atomic_load_explicit(&n_regs_hint, memory_order_relaxed) > 0 && reg_lookup(a, info))
        return 1;
    unsigned int type = 0;
    kvp_cu_result r = drv.get_attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (kvp_cu_devptr)a);
    if (r == CUDA_ERROR_INVALID_VALUE)
        return 0; /* unknown to the driver: ordinary host memory */
    if (r != 0) {
        kvp_log_warn("devmem", "cuPointerGetAttribute(%p): %s: the pointer may be device memory; its key fails "
                     "(KVP_ERR_DEVICE)", addr, kvp_devmem_errstr(r));
        return KVP_ERR_DEVICE;
    }
    if (type != CU_MEMORYTYPE_DEVICE)
        return 0;
    unsigned int managed = 0;
    if (drv.get_attr(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, (kvp_cu_devptr)a) == 0 && managed)
        return 0; /* managed memory: the CPU can read and write it */
    if (info) {
        int ord = 0;
        kvp_cu_devptr base = 0;
        size_t size = 0;
        r = drv.get_attr(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (kvp_cu_devptr)a);
        if (r == 0)
            r = drv.addr_range(&base, &size, (kvp_cu_devptr)a);
        if (r != 0) {
            kvp_log_warn("devmem", "device pointer %p: ordinal/range query failed: %s (KVP_ERR_DEVICE)", addr,
                         kvp_devmem_errstr(r));
            return KVP_ERR_DEVICE;
        }
        *info = (struct kvp_devmem_info){.ordinal = ord, .base = (uintptr_t)base, .size = size};
    }
    return 1;
}

bool kvp_devmem_is_device(const void *addr)
{
    return kvp_devmem_classify(addr, NULL) == 1;
}

int kvp_devmem_iov_class(const char *fn, const char *key, const kvp_iov *iov, size_t iovcnt, int *ordinal)
{
    if (!kvp_devmem_available())
        return 0;
    int found = 0, ord = -1;
    for (size_t k = 0; k < iovcnt; k++) {
        if (iov[k].len == 0)
            continue;
        struct kvp_devmem_info info;
        int c = kvp_devmem_classify(iov[k].base, &info);
        if (c < 0) {
            kvp_log_warn("client", "%s: key '%.64s': piece %zu (%p): the CUDA driver failed (KVP_ERR_DEVICE)", fn,
                         key ? key : "", k, iov[k].base);
            return c;
        }
        if (c == 0)
            continue;
        if ((uintptr_t)iov[k].base - info.base + iov[k].len > info.size) {
            kvp_log_warn("client", "%s: key '%.64s': piece %zu (%p, %zu bytes) runs past its device allocation "
                         "(%zu bytes at %#lx): KVP_ERR_INVALID", fn, key ? key : "", k, iov[k].base, iov[k].len,
                         info.size, (unsigned long)info.base);
            return KVP_ERR_INVALID;
        }
        if (found && info.ordinal != ord) {
            kvp_log_warn("client", "%s: key '%.64s': pieces on devices %d and %d: one object's device pieces must "
                         "be on one device (KVP_ERR_INVALID)", fn, key ? key : "", ord, info.ordinal);
            return KVP_ERR_INVALID;
        }
        found = 1;
        ord = info.ordinal;
    }
    if (ordinal)
        *ordinal = ord;
    return found;
}
