/*
 * fakecuda_load.h — point kvpool at the CUDA driver double and reach its test controls (header
 * only: the .c files of tests/lib are linked into every test binary). Call fakecuda_load() first in main(),
 * before any kvpool call: it sets KVPOOL_LIBCUDA to $KVP_BUILD_DIR/tests/fakecuda/libcuda.so.1
 * and dlopens it (the same instance kvpool's devmem.c loads).
 */
#ifndef KVP_TESTS_FAKECUDA_LOAD_H
#define KVP_TESTS_FAKECUDA_LOAD_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/lib/fakecuda/fakecuda.h"

struct fakecuda_api {
    void *h;
    uint64_t (*now_ns)(void);
    void (*advance)(uint64_t);
    void (*set_ns_per_byte)(double);
    void (*delay_next_copy)(uint64_t);
    void (*fail_copy)(int, int);
    void (*poison)(int);
    size_t (*audit_count)(void);
    int (*audit_get)(size_t, struct fakecuda_audit *);
    size_t (*pending)(void);
    void *(*shadow)(uint64_t);
    uint64_t (*pinned_bytes)(void);
    uint64_t (*copies)(void);
    void (*reset_errors)(void);
    void (*on_enqueue)(void (*)(int, void *), void *);
    /* driver calls the tests make themselves */
    int (*init)(unsigned);
    int (*retain)(void **, int);
    int (*push)(void *);
    int (*pop)(void **);
    int (*mem_alloc)(unsigned long long *, size_t);
    int (*mem_free)(unsigned long long);
    void (*set_gdr)(int, int, int, int);
    uint64_t (*gdr_flushes)(void);
    uint64_t (*dmabuf_exports)(void);
};

static struct fakecuda_api FC;

static inline int fakecuda_load(void)
{
    const char *b = getenv("KVP_BUILD_DIR");
    static char path[4096];
    snprintf(path, sizeof path, "%s/tests/fakecuda/libcuda.so.1", b ? b : "build");
    setenv("KVPOOL_LIBCUDA", path, 1);
    FC.h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!FC.h) {
        fprintf(stderr, "fakecuda: %s\n", dlerror());
        return -1;
    }
#define L(f, n) *(void **)&FC.f = dlsym(FC.h, n)
    L(now_ns, "fakecuda_now_ns");
    L(advance, "fakecuda_advance");
    L(set_ns_per_byte, "fakecuda_set_ns_per_byte");
    L(delay_next_copy, "fakecuda_delay_next_copy");
    L(fail_copy, "fakecuda_fail_copy");
    L(poison, "fakecuda_poison");
    L(audit_count, "fakecuda_audit_count");
    L(audit_get, "fakecuda_audit_get");
    L(pending, "fakecuda_pending");
    L(shadow, "fakecuda_shadow");
    L(pinned_bytes, "fakecuda_pinned_bytes");
    L(copies, "fakecuda_copies");
    L(reset_errors, "fakecuda_reset_errors");
    L(on_enqueue, "fakecuda_on_enqueue");
    L(init, "cuInit");
    L(retain, "cuDevicePrimaryCtxRetain");
    L(push, "cuCtxPushCurrent_v2");
    L(pop, "cuCtxPopCurrent_v2");
    L(mem_alloc, "cuMemAlloc_v2");
    L(mem_free, "cuMemFree_v2");
    L(set_gdr, "fakecuda_set_gdr");
    L(gdr_flushes, "fakecuda_gdr_flushes");
    L(dmabuf_exports, "fakecuda_dmabuf_exports");
#undef L
    return FC.init(0);
}

/* Allocate device memory on `dev` (through its primary context). */
static inline void *fakecuda_dev_alloc(int dev, size_t n)
{
    void *ctx = NULL, *old = NULL;
    unsigned long long p = 0;
    if (FC.retain(&ctx, dev) || FC.push(ctx))
        return NULL;
    int r = FC.mem_alloc(&p, n);
    FC.pop(&old);
    return r ? NULL : (void *)(uintptr_t)p;
}

#endif
