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

/* Registered device ranges, process-wide (include/kvpool.h: kvp_device_stats.registered_bytes and
 * kvp_device_pointer are per process): written by kvp_register_buffer / kvp_unregister_buffer of
 * any client, read by every classification on any API thread of any client. The table is
 * immutable once published; a change builds a new one and swaps one atomic pointer
 * (compare-and-swap, so two clients registering at once both land). Neither a lock nor a
 * message: a lookup is a few loads on the data path of every call, and no single actor owns
 * state that every client of the process shares.
 *
 * Reclaiming replaced tables (atomics, not a lock: a lookup must not block behind a writer, and
 * no actor owns this state). Whoever dereferences a table (lookups, registered_bytes, a writer
 * copying it) first increments `regs_pins`, then loads `regs_now`, and decrements `regs_pins`
 * when done: two atomic read-modify-writes per lookup, none while nothing is registered (the
 * NULL check comes first and dereferences nothing). A replaced table goes on the `retired` list;
 * after each change the writer takes the whole list (exchange) and frees it if it then reads
 * `regs_pins` == 0, else puts it back for the next change. Why that is safe (all operations
 * sequentially consistent, so they fall in one total order): every table on the taken list was
 * swapped out of `regs_now` before it was pushed, so before the exchange, so before the read of
 * `regs_pins`. A thread whose increment comes before that read is counted (non-zero: nothing is
 * freed); one whose increment comes after it loads `regs_now` later still, after every table of
 * the list was swapped out, so it cannot hold one of them. Bound: a change made while no other
 * thread is inside a pinned section frees every retired table (none left); retired tables only
 * accumulate while every change meets a concurrent reader, and go at the first change that does
 * not. kvp_devmem_retired_tables() counts them for tests. */
struct reg_table {
    struct reg_table *retired_next;
    uint64_t bytes; /* sum of len */
    size_t n;
    struct reg_range r[];
};
static _Atomic(struct reg_table *) regs_now; /* NULL: nothing registered */
static _Atomic(struct reg_table *) retired;
static atomic_size_t regs_pins;     /* threads between pin() and unpin() */
static atomic_size_t retired_alive; /* tables on `retired` (tests) */

/* The current table, safe to read until unpin() (NULL: nothing registered). */
static struct reg_table *pin(void)
{
    atomic_fetch_add(&regs_pins, 1);
    return atomic_load(&regs_now);
}

static void unpin(void)
{
    atomic_fetch_sub(&regs_pins, 1);
}

static void push_retired(struct reg_table *first, struct reg_table *last)
{
    struct reg_table *head = atomic_load(&retired);
    do
        last->retired_next = head;
    while (!atomic_compare_exchange_weak(&retired, &head, first));
}

static void retire(struct reg_table *t)
{
    if (!t)
        return;
    atomic_fetch_add(&retired_alive, 1);
    push_retired(t, t);
}

/* Free the retired tables if no thread is pinned (see above for the order that makes it safe). */
static void reclaim(void)
{
    struct reg_table *list = atomic_exchange(&retired, NULL);
    if (!list)
        return;
    if (atomic_load(&regs_pins) == 0) {
        while (list) {
            struct reg_table *next = list->retired_next;
            free(list);
            atomic_fetch_sub(&retired_alive, 1);
            list = next;
        }
        return;
    }
    struct reg_table *last = list;
    while (last->retired_next)
        last = last->retired_next;
    push_retired(list, last); /* a reader may hold one: the next change tries again */
}

size_t kvp_devmem_retired_tables(void)
{
    return atomic_load(&retired_alive);
}

/* Replace the table with cur + (base,len,ordinal) when add, else cur without the last range at
 * base. KVP_OK, KVP_ERR_NOMEM, or KVP_ERR_NOT_FOUND (forget: no range at base). */
static int regs_change(bool add, uintptr_t base, size_t len, int ordinal)
{
    for (;;) {
        struct reg_table *cur = pin(); /* another writer may free the table it replaces */
        size_t n = cur ? cur->n : 0;
        size_t at = n;
        if (!add) {
            for (size_t i = n; i-- > 0;)
                if (cur->r[i].base == base) {
                    at = i;
                    break;
                }
            if (at == n) {
                unpin();
                return KVP_ERR_NOT_FOUND;
            }
        }
        size_t nn = add ? n + 1 : n - 1;
        struct reg_table *t = NULL;
        if (nn > 0) {
            t = malloc(sizeof *t + nn * sizeof t->r[0]);
            if (!t) {
                unpin();
                return KVP_ERR_NOMEM;
            }
            t->n = 0;
            t->bytes = 0;
            for (size_t i = 0; i < n; i++)
                if (add || i != at) {
                    t->r[t->n++] = cur->r[i];
                    t->bytes += cur->r[i].len;
                }
            if (add) {
                t->r[t->n++] = (struct reg_range){.base = base, .len = len, .ordinal = ordinal};
                t->bytes += len;
            }
        }
        if (atomic_compare_exchange_strong(&regs_now, &cur, t)) {
            retire(cur);
            unpin();
            reclaim();
            return KVP_OK;
        }
        unpin();
        free(t); /* another change landed first: build again from it */
    }
}

int kvp_devmem_remember(uintptr_t base, size_t len, int ordinal)
{
    return regs_change(true, base, len, ordinal);
}

void kvp_devmem_forget(uintptr_t base)
{
    (void)regs_change(false, base, 0, 0);
}

uint64_t kvp_devmem_registered_bytes(void)
{
    if (!atomic_load(&regs_now))
        return 0;
    struct reg_table *t = pin();
    uint64_t bytes = t ? t->bytes : 0;
    unpin();
    return bytes;
}

static bool reg_lookup(uintptr_t a, struct kvp_devmem_info *info)
{
    if (!atomic_load(&regs_now))
        return false; /* nothing registered: no pin (the common case without GPU registration) */
    struct reg_table *t = pin();
    bool found = false;
    for (size_t i = 0; t && i < t->n; i++) {
        if (a >= t->r[i].base && a - t->r[i].base < t->r[i].len) {
            if (info)
                *info = (struct kvp_devmem_info){.ordinal = t->r[i].ordinal, .base = t->r[i].base, .size = t->r[i].len};
            found = true;
            break;
        }
    }
    unpin();
    return found;
}

/* ------------------------------------------------------------------ classification */

int kvp_devmem_classify(const void *addr, struct kvp_devmem_info *info)
{
    if (!addr || !kvp_devmem_available())
        return 0;
    uintptr_t a = (uintptr_t)addr;
    if (reg_lookup(a, info))
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
