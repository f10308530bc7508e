/*
 * fakecuda.c — a test double of the CUDA driver API, built as libcuda.so.1 (build/tests/fakecuda/)
 * and loaded by kvpool through the same dlopen path as the real driver (KVPOOL_LIBCUDA).
 *
 * What it models:
 *  - 2 devices, each with a primary context (cuDevicePrimaryCtxRetain); a current context per
 *    thread (cuCtxPushCurrent/PopCurrent/SetCurrent); streams, events and copies need one.
 *  - device memory (cuMemAlloc): a memfd mapped twice, PROT_NONE at the address handed out (any
 *    CPU access by kvpool crashes the test with SIGSEGV) and read-write at a shadow address only
 *    this library (and tests, through fakecuda_shadow) use.
 *  - pinned host memory (cuMemHostAlloc / cuMemFreeHost), counted.
 *  - pointer attributes (memory type, device ordinal, managed, range start/size) and
 *    cuMemGetAddressRange. Host memory the driver does not know: CUDA_ERROR_INVALID_VALUE.
 *  - a virtual clock (ns). A copy enqueued on a stream starts at max(now, the stream's tail) and
 *    ends dur = bytes * ns_per_byte + injected delay later; its bytes move only when the clock
 *    passes its end. The clock moves on cuEventSynchronize / cuStreamSynchronize (to the end of
 *    what they wait for), on synchronous copies, and on fakecuda_advance (a test's model of CPU or
 *    network time). Every completed copy is appended to an audit log with its times.
 *  - errors: fakecuda_fail_copy(k, code) makes the k-th next copy enqueue fail with `code`;
 *    fakecuda_poison(code) poisons every context: every later call that needs a context fails
 *    with `code` (as a sticky error does), pending copies never complete, and pointer attribute
 *    queries on device memory fail with it (on unknown host memory they still answer
 *    CUDA_ERROR_INVALID_VALUE).
 * One mutex serialises everything (a test double: simplicity over speed).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fakecuda.h"

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_ILLEGAL_ADDRESS 700

#define CU_POINTER_ATTRIBUTE_CONTEXT 1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define CU_MEMORYTYPE_HOST 1
#define CU_MEMORYTYPE_DEVICE 2

#define NDEV 2
#define MAX_ALLOCS 256
#define MAX_AUDIT 65536

typedef unsigned long long devptr;

struct ctx {
    int dev;
    int retained;
};

struct alloc {
    uintptr_t base; /* the PROT_NONE mapping */
    uint8_t *shadow;
    size_t size;
    int dev;
    int pinned; /* 1: pinned host memory (base == shadow, readable) */
    int fd;     /* the memfd behind device memory (dma-buf handles are dups of it), -1 else */
};

struct op {
    int kind; /* FAKECUDA_D2H / H2D / D2D */
    void *dst;
    const void *src;
    size_t n;
    uint64_t start, end;
    uintptr_t dev_addr; /* the device address touched (for the audit) */
    struct op *next;
};

struct stream {
    int magic;
    int dev;
    uint64_t tail;
};

struct event {
    int magic;
    uint64_t t;
    int recorded;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ctx ctxs[NDEV] = {{0, 0}, {1, 0}};
static __thread struct ctx *cur_stack[16];
static __thread int cur_depth;
static struct alloc allocs[MAX_ALLOCS];
static uint64_t now_ns;
static double ns_per_byte = 0.0;
static uint64_t next_delay_ns;
static int fail_after = -1, fail_code;
static int poison_code;
static struct op *pending; /* sorted by end */
static struct fakecuda_audit audit[MAX_AUDIT];
static size_t n_audit;
static uint64_t pinned_bytes, n_copies, n_calls;
static int inited;
static void (*on_enqueue)(int kind, void *arg);
static void *on_enqueue_arg;

static struct ctx *cur(void)
{
    return cur_depth > 0 ? cur_stack[cur_depth - 1] : NULL;
}

/* Complete every pending copy whose end is <= t, in end order; then now = t. mu held. */
static void advance_to(uint64_t t)
{
    while (pending && pending->end <= t && !poison_code) {
        struct op *o = pending;
        pending = o->next;
        memcpy(o->dst, o->src, o->n);
        if (n_audit < MAX_AUDIT)
            audit[n_audit++] = (struct fakecuda_audit){.kind = o->kind, .dev_addr = o->dev_addr, .bytes = o->n,
                                                       .start_ns = o->start, .end_ns = o->end};
        free(o);
    }
    if (t > now_ns)
        now_ns = t;
}

static struct alloc *find_alloc(uintptr_t p, int pinned)
{
    for (size_t i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].size && allocs[i].pinned == pinned && p >= allocs[i].base && p < allocs[i].base + allocs[i].size)
            return &allocs[i];
    return NULL;
}

/* The CPU-accessible address behind p (device or host), checking n bytes fit; NULL if not. */
static void *resolve(uintptr_t p, size_t n, int want_dev, int *dev)
{
    if (want_dev) {
        struct alloc *a = find_alloc(p, 0);
        if (!a || p + n > a->base + a->size)
            return NULL;
        if (dev)
            *dev = a->dev;
        return a->shadow + (p - a->base);
    }
    if (find_alloc(p, 0))
        return NULL; /* a device address given as host memory */
    return (void *)p;
}

#define ENTER()                                                                                                  \
    pthread_mutex_lock(&mu);                                                                                     \
    n_calls++;                                                                                                   \
    if (!inited) {                                                                                               \
        pthread_mutex_unlock(&mu);                                                                               \
        return CUDA_ERROR_NOT_INITIALIZED;                                                                       \
    }
#define RET(x)                                                                                                   \
    do {                                                                                                         \
        int r_ = (x);                                                                                            \
        pthread_mutex_unlock(&mu);                                                                               \
        return r_;                                                                                               \
    } while (0)
#define NEED_CTX()                                                                                               \
    if (poison_code)                                                                                             \
        RET(poison_code);                                                                                        \
    if (!cur())                                                                                                  \
        RET(CUDA_ERROR_INVALID_CONTEXT);

/* ------------------------------------------------------------------ init, devices, contexts */

int cuInit(unsigned flags)
{
    (void)flags;
    pthread_mutex_lock(&mu);
    if (!inited) {
        const char *r = getenv("FAKECUDA_NS_PER_BYTE");
        if (r)
            ns_per_byte = strtod(r, NULL);
    }
    inited = 1;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

int cuDriverGetVersion(int *v)
{
    *v = 12040;
    return CUDA_SUCCESS;
}

int cuDeviceGetCount(int *n)
{
    ENTER();
    *n = NDEV;
    RET(CUDA_SUCCESS);
}

int cuDeviceGet(int *dev, int ordinal)
{
    ENTER();
    if (ordinal < 0 || ordinal >= NDEV)
        RET(CUDA_ERROR_INVALID_DEVICE);
    *dev = ordinal;
    RET(CUDA_SUCCESS);
}

int cuDevicePrimaryCtxRetain(void **pctx, int dev)
{
    ENTER();
    if (poison_code)
        RET(poison_code);
    if (dev < 0 || dev >= NDEV)
        RET(CUDA_ERROR_INVALID_DEVICE);
    ctxs[dev].retained++;
    *pctx = &ctxs[dev];
    RET(CUDA_SUCCESS);
}

int cuDevicePrimaryCtxRelease_v2(int dev)
{
    ENTER();
    if (dev < 0 || dev >= NDEV || ctxs[dev].retained == 0)
        RET(CUDA_ERROR_INVALID_DEVICE);
    ctxs[dev].retained--;
    RET(CUDA_SUCCESS);
}

int cuCtxPushCurrent_v2(void *c)
{
    ENTER();
    if (!c || cur_depth >= 16)
        RET(CUDA_ERROR_INVALID_CONTEXT);
    cur_stack[cur_depth++] = c;
    RET(CUDA_SUCCESS);
}

int cuCtxPopCurrent_v2(void **pc)
{
    ENTER();
    if (cur_depth == 0)
        RET(CUDA_ERROR_INVALID_CONTEXT);
    struct ctx *c = cur_stack[--cur_depth];
    if (pc)
        *pc = c;
    RET(CUDA_SUCCESS);
}

int cuCtxSetCurrent(void *c)
{
    ENTER();
    if (c) {
        if (cur_depth == 0)
            cur_depth = 1;
        cur_stack[cur_depth - 1] = c;
    } else if (cur_depth > 0) {
        cur_depth--;
    }
    RET(CUDA_SUCCESS);
}

int cuCtxGetCurrent(void **pc)
{
    ENTER();
    *pc = cur();
    RET(CUDA_SUCCESS);
}

int cuGetErrorName(int e, const char **s)
{
    switch (e) {
    case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
    case CUDA_ERROR_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ memory */

int cuMemAlloc_v2(devptr *out, size_t size)
{
    ENTER();
    NEED_CTX();
    if (size == 0)
        RET(CUDA_ERROR_INVALID_VALUE);
    size_t sz = (size + 4095) & ~(size_t)4095;
    int fd = memfd_create("fakecuda", 0);
    if (fd < 0 || ftruncate(fd, (off_t)sz) != 0) {
        if (fd >= 0)
            close(fd);
        RET(CUDA_ERROR_OUT_OF_MEMORY);
    }
    void *none = mmap(NULL, sz, PROT_NONE, MAP_SHARED, fd, 0);
    void *rw = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (none == MAP_FAILED || rw == MAP_FAILED) {
        close(fd);
        RET(CUDA_ERROR_OUT_OF_MEMORY);
    }
    for (size_t i = 0; i < MAX_ALLOCS; i++)
        if (!allocs[i].size) {
            allocs[i] = (struct alloc){.base = (uintptr_t)none, .shadow = rw, .size = size, .dev = cur()->dev,
                                       .fd = fd};
            *out = (devptr)(uintptr_t)none;
            RET(CUDA_SUCCESS);
        }
    RET(CUDA_ERROR_OUT_OF_MEMORY);
}

int cuMemFree_v2(devptr p)
{
    ENTER();
    for (size_t i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].size && !allocs[i].pinned && allocs[i].base == p) {
            size_t sz = (allocs[i].size + 4095) & ~(size_t)4095;
            munmap((void *)allocs[i].base, sz);
            munmap(allocs[i].shadow, sz);
            close(allocs[i].fd);
            allocs[i].size = 0;
            RET(CUDA_SUCCESS);
        }
    RET(CUDA_ERROR_INVALID_VALUE);
}

int cuMemHostAlloc(void **out, size_t size, unsigned flags)
{
    (void)flags;
    ENTER();
    NEED_CTX();
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        RET(CUDA_ERROR_OUT_OF_MEMORY);
    for (size_t i = 0; i < MAX_ALLOCS; i++)
        if (!allocs[i].size) {
            allocs[i] = (struct alloc){.base = (uintptr_t)p, .shadow = p, .size = size, .dev = cur()->dev, .pinned = 1, .fd = -1};
            pinned_bytes += size;
            *out = p;
            RET(CUDA_SUCCESS);
        }
    munmap(p, size);
    RET(CUDA_ERROR_OUT_OF_MEMORY);
}

int cuMemFreeHost(void *p)
{
    ENTER();
    for (size_t i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].size && allocs[i].pinned && allocs[i].base == (uintptr_t)p) {
            munmap(p, allocs[i].size);
            pinned_bytes -= allocs[i].size;
            allocs[i].size = 0;
            RET(CUDA_SUCCESS);
        }
    RET(CUDA_ERROR_INVALID_VALUE);
}

int cuMemGetAddressRange_v2(devptr *base, size_t *size, devptr p)
{
    ENTER();
    struct alloc *a = find_alloc((uintptr_t)p, 0);
    if (!a)
        RET(CUDA_ERROR_INVALID_VALUE);
    if (poison_code)
        RET(poison_code);
    if (base)
        *base = a->base;
    if (size)
        *size = a->size;
    RET(CUDA_SUCCESS);
}

/* ------------------------------------------------------------------ GPUDirect RDMA (issue 20)
 * cuDeviceGetAttribute answers the three attributes the rdma transport asks (others:
 * CUDA_ERROR_INVALID_VALUE): DMA_BUF_SUPPORTED (124), GPU_DIRECT_RDMA_WRITES_ORDERING (118) and
 * GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS (117). By default device 0 orders RDMA writes for its owner
 * (100) and device 1 does not (0) and needs cuFlushGPUDirectRDMAWrites (options: HOST, 1);
 * fakecuda_set_gdr changes them. cuMemGetHandleForAddressRange(DMA_BUF_FD) hands out a dup of the
 * allocation's memfd (a real fd of the device memory's pages) for a page-aligned range inside one
 * allocation, with flags 0 only. */
static int gdr_dmabuf[NDEV] = {1, 1};
static int gdr_ordering[NDEV] = {100, 0};
static int gdr_flush_opts[NDEV] = {1, 1};
static uint64_t gdr_flushes, dmabuf_exports;

void fakecuda_set_gdr(int dev, int dmabuf_supported, int ordering, int flush_opts)
{
    pthread_mutex_lock(&mu);
    if (dev >= 0 && dev < NDEV) {
        gdr_dmabuf[dev] = dmabuf_supported;
        gdr_ordering[dev] = ordering;
        gdr_flush_opts[dev] = flush_opts;
    }
    pthread_mutex_unlock(&mu);
}

uint64_t fakecuda_gdr_flushes(void) { return gdr_flushes; }
uint64_t fakecuda_dmabuf_exports(void) { return dmabuf_exports; }

int cuDeviceGetAttribute(int *v, int attrib, int dev)
{
    ENTER();
    if (!v || dev < 0 || dev >= NDEV)
        RET(CUDA_ERROR_INVALID_VALUE);
    switch (attrib) {
    case 124: *v = gdr_dmabuf[dev]; break;
    case 118: *v = gdr_ordering[dev]; break;
    case 117: *v = gdr_flush_opts[dev]; break;
    default: RET(CUDA_ERROR_INVALID_VALUE);
    }
    RET(CUDA_SUCCESS);
}

int cuMemGetHandleForAddressRange(void *handle, devptr p, size_t size, int type, unsigned long long flags)
{
    ENTER();
    if (!handle || type != 1 /* CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD */ || flags != 0 || size == 0 ||
        (p & 4095) || (size & 4095))
        RET(CUDA_ERROR_INVALID_VALUE);
    struct alloc *a = find_alloc(p, 0);
    if (!a || a->pinned || p + size > a->base + ((a->size + 4095) & ~(size_t)4095))
        RET(CUDA_ERROR_INVALID_VALUE);
    if (!gdr_dmabuf[a->dev])
        RET(801 /* CUDA_ERROR_NOT_SUPPORTED */);
    int fd = dup(a->fd);
    if (fd < 0)
        RET(CUDA_ERROR_OUT_OF_MEMORY);
    *(int *)handle = fd;
    dmabuf_exports++;
    RET(CUDA_SUCCESS);
}

int cuFlushGPUDirectRDMAWrites(int target, int scope)
{
    ENTER();
    NEED_CTX();
    if (target != 0 /* CURRENT_CTX */ || (scope != 100 && scope != 200))
        RET(CUDA_ERROR_INVALID_VALUE);
    gdr_flushes++;
    RET(CUDA_SUCCESS);
}

int cuPointerGetAttribute(void *data, int attr, devptr p)
{
    ENTER();
    struct alloc *a = find_alloc((uintptr_t)p, 0);
    int dev_mem = a != NULL;
    if (!a)
        a = find_alloc((uintptr_t)p, 1);
    if (!a)
        RET(CUDA_ERROR_INVALID_VALUE); /* host memory the driver does not know */
    if (poison_code && dev_mem)
        RET(poison_code);
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = dev_mem ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned *)data = 0;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = a->dev;
        break;
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(void **)data = &ctxs[a->dev];
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(devptr *)data = a->base;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = a->size;
        break;
    default:
        RET(CUDA_ERROR_INVALID_VALUE);
    }
    RET(CUDA_SUCCESS);
}

/* ------------------------------------------------------------------ streams, events, copies */

#define STREAM_MAGIC 0x5754
#define EVENT_MAGIC 0x4556

int cuStreamCreate(void **out, unsigned flags)
{
    (void)flags;
    ENTER();
    NEED_CTX();
    struct stream *s = calloc(1, sizeof *s);
    if (!s)
        RET(CUDA_ERROR_OUT_OF_MEMORY);
    s->magic = STREAM_MAGIC;
    s->dev = cur()->dev;
    *out = s;
    RET(CUDA_SUCCESS);
}

int cuStreamDestroy_v2(void *sp)
{
    ENTER();
    struct stream *s = sp;
    if (!s || s->magic != STREAM_MAGIC)
        RET(CUDA_ERROR_INVALID_HANDLE);
    s->magic = 0;
    free(s);
    RET(CUDA_SUCCESS);
}

int cuEventCreate(void **out, unsigned flags)
{
    (void)flags;
    ENTER();
    NEED_CTX();
    struct event *e = calloc(1, sizeof *e);
    if (!e)
        RET(CUDA_ERROR_OUT_OF_MEMORY);
    e->magic = EVENT_MAGIC;
    *out = e;
    RET(CUDA_SUCCESS);
}

int cuEventDestroy_v2(void *ep)
{
    ENTER();
    struct event *e = ep;
    if (!e || e->magic != EVENT_MAGIC)
        RET(CUDA_ERROR_INVALID_HANDLE);
    e->magic = 0;
    free(e);
    RET(CUDA_SUCCESS);
}

int cuEventRecord(void *ep, void *sp)
{
    ENTER();
    NEED_CTX();
    struct event *e = ep;
    struct stream *s = sp;
    if (!e || e->magic != EVENT_MAGIC || !s || s->magic != STREAM_MAGIC)
        RET(CUDA_ERROR_INVALID_HANDLE);
    e->t = s->tail > now_ns ? s->tail : now_ns;
    e->recorded = 1;
    RET(CUDA_SUCCESS);
}

int cuEventQuery(void *ep)
{
    ENTER();
    struct event *e = ep;
    if (!e || e->magic != EVENT_MAGIC)
        RET(CUDA_ERROR_INVALID_HANDLE);
    if (poison_code)
        RET(poison_code);
    advance_to(now_ns);
    RET(!e->recorded || e->t <= now_ns ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
}

int cuEventSynchronize(void *ep)
{
    ENTER();
    struct event *e = ep;
    if (!e || e->magic != EVENT_MAGIC)
        RET(CUDA_ERROR_INVALID_HANDLE);
    if (poison_code)
        RET(poison_code);
    if (e->recorded)
        advance_to(e->t);
    RET(CUDA_SUCCESS);
}

int cuStreamSynchronize(void *sp)
{
    ENTER();
    struct stream *s = sp;
    if (!s || s->magic != STREAM_MAGIC)
        RET(CUDA_ERROR_INVALID_HANDLE);
    if (poison_code)
        RET(poison_code);
    advance_to(s->tail);
    RET(CUDA_SUCCESS);
}

/* Enqueue a copy of n bytes on stream s (NULL: synchronous). mu held. */
static int enqueue(int kind, void *dst, const void *src, size_t n, uintptr_t dev_addr, struct stream *s)
{
    if (poison_code)
        return poison_code;
    if (!cur())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (s && s->magic != STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!dst || !src)
        return CUDA_ERROR_INVALID_VALUE;
    if (fail_after >= 0 && fail_after-- == 0) {
        int c = fail_code;
        fail_after = -1;
        return c;
    }
    n_copies++;
    uint64_t tail = s ? s->tail : 0;
    uint64_t start = tail > now_ns ? tail : now_ns;
    uint64_t end = start + (uint64_t)((double)n * ns_per_byte) + next_delay_ns;
    next_delay_ns = 0;
    struct op *o = calloc(1, sizeof *o);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *o = (struct op){.kind = kind, .dst = dst, .src = src, .n = n, .start = start, .end = end, .dev_addr = dev_addr};
    struct op **pp = &pending;
    while (*pp && (*pp)->end <= end)
        pp = &(*pp)->next;
    o->next = *pp;
    *pp = o;
    if (s)
        s->tail = end;
    else
        advance_to(end); /* synchronous */
    if (on_enqueue)
        on_enqueue(kind, on_enqueue_arg); /* a test's hook: must not call the driver */
    return CUDA_SUCCESS;
}

static int copy(int kind, devptr dst, devptr src, size_t n, void *sp)
{
    ENTER();
    int dd = 0;
    void *d = resolve((uintptr_t)dst, n, kind == FAKECUDA_H2D || kind == FAKECUDA_D2D, &dd);
    const void *s = resolve((uintptr_t)src, n, kind == FAKECUDA_D2H || kind == FAKECUDA_D2D, &dd);
    if (!poison_code && (!d || !s))
        RET(CUDA_ERROR_INVALID_VALUE);
    uintptr_t da = kind == FAKECUDA_D2H ? (uintptr_t)src : (uintptr_t)dst;
    RET(enqueue(kind, d, s, n, da, sp));
}

int cuMemcpyDtoHAsync_v2(void *dst, devptr src, size_t n, void *s)
{
    return copy(FAKECUDA_D2H, (devptr)(uintptr_t)dst, src, n, s);
}

int cuMemcpyHtoDAsync_v2(devptr dst, const void *src, size_t n, void *s)
{
    return copy(FAKECUDA_H2D, dst, (devptr)(uintptr_t)src, n, s);
}

int cuMemcpyDtoH_v2(void *dst, devptr src, size_t n)
{
    return copy(FAKECUDA_D2H, (devptr)(uintptr_t)dst, src, n, NULL);
}

int cuMemcpyHtoD_v2(devptr dst, const void *src, size_t n)
{
    return copy(FAKECUDA_H2D, dst, (devptr)(uintptr_t)src, n, NULL);
}

int cuMemsetD8_v2(devptr dst, unsigned char v, size_t n)
{
    ENTER();
    NEED_CTX();
    void *d = resolve((uintptr_t)dst, n, 1, NULL);
    if (!d)
        RET(CUDA_ERROR_INVALID_VALUE);
    advance_to(now_ns); /* ordered after what completed; synchronous */
    memset(d, v, n);
    RET(CUDA_SUCCESS);
}

int cuDeviceGetName(char *name, int len, int dev)
{
    if (len > 0)
        snprintf(name, (size_t)len, "kvpool fakecuda device %d", dev);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ test controls */

uint64_t fakecuda_now_ns(void)
{
    pthread_mutex_lock(&mu);
    uint64_t t = now_ns;
    pthread_mutex_unlock(&mu);
    return t;
}

void fakecuda_advance(uint64_t ns)
{
    pthread_mutex_lock(&mu);
    advance_to(now_ns + ns);
    pthread_mutex_unlock(&mu);
}

void fakecuda_set_ns_per_byte(double v)
{
    pthread_mutex_lock(&mu);
    ns_per_byte = v;
    pthread_mutex_unlock(&mu);
}

void fakecuda_delay_next_copy(uint64_t ns)
{
    pthread_mutex_lock(&mu);
    next_delay_ns = ns;
    pthread_mutex_unlock(&mu);
}

void fakecuda_fail_copy(int k, int code)
{
    pthread_mutex_lock(&mu);
    fail_after = k;
    fail_code = code ? code : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&mu);
}

void fakecuda_poison(int code)
{
    pthread_mutex_lock(&mu);
    poison_code = code;
    pthread_mutex_unlock(&mu);
}

size_t fakecuda_audit_count(void)
{
    pthread_mutex_lock(&mu);
    size_t n = n_audit;
    pthread_mutex_unlock(&mu);
    return n;
}

int fakecuda_audit_get(size_t i, struct fakecuda_audit *out)
{
    pthread_mutex_lock(&mu);
    int ok = i < n_audit;
    if (ok)
        *out = audit[i];
    pthread_mutex_unlock(&mu);
    return ok;
}

size_t fakecuda_pending(void)
{
    pthread_mutex_lock(&mu);
    size_t n = 0;
    for (struct op *o = pending; o; o = o->next)
        n++;
    pthread_mutex_unlock(&mu);
    return n;
}

void *fakecuda_shadow(uint64_t dptr)
{
    pthread_mutex_lock(&mu);
    void *p = resolve((uintptr_t)dptr, 1, 1, NULL);
    pthread_mutex_unlock(&mu);
    return p;
}

uint64_t fakecuda_pinned_bytes(void)
{
    pthread_mutex_lock(&mu);
    uint64_t n = pinned_bytes;
    pthread_mutex_unlock(&mu);
    return n;
}

uint64_t fakecuda_copies(void)
{
    pthread_mutex_lock(&mu);
    uint64_t n = n_copies;
    pthread_mutex_unlock(&mu);
    return n;
}

void fakecuda_on_enqueue(void (*fn)(int kind, void *arg), void *arg)
{
    pthread_mutex_lock(&mu);
    on_enqueue = fn;
    on_enqueue_arg = arg;
    pthread_mutex_unlock(&mu);
}

void fakecuda_reset_errors(void)
{
    pthread_mutex_lock(&mu);
    poison_code = 0;
    fail_after = -1;
    next_delay_ns = 0;
    pthread_mutex_unlock(&mu);
}
