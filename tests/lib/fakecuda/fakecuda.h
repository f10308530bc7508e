/*
 * fakecuda.h — the test controls of the CUDA driver test double (fakecuda.c). Tests reach them
 * through dlsym on the same library kvpool dlopens (KVPOOL_LIBCUDA), so they talk to the one
 * instance kvpool uses; fakecuda_load() does that.
 */
#ifndef KVP_TESTS_FAKECUDA_H
#define KVP_TESTS_FAKECUDA_H

#include <stddef.h>
#include <stdint.h>

enum { FAKECUDA_D2H = 1, FAKECUDA_H2D = 2, FAKECUDA_D2D = 3 };

/* One completed copy: which device address it touched, and when (virtual ns). */
struct fakecuda_audit {
    int kind;
    uint64_t dev_addr;
    size_t bytes;
    uint64_t start_ns, end_ns;
};

uint64_t fakecuda_now_ns(void);
void fakecuda_advance(uint64_t ns);           /* the CPU/network did ns of work: copies progress */
void fakecuda_set_ns_per_byte(double v);      /* copy speed (0: copies take no time) */
void fakecuda_delay_next_copy(uint64_t ns);   /* the next copy takes ns longer */
void fakecuda_fail_copy(int k, int code);     /* the k-th next copy enqueue fails with code */
void fakecuda_poison(int code);               /* every context poisoned (0: healed, tests only) */
size_t fakecuda_audit_count(void);
int fakecuda_audit_get(size_t i, struct fakecuda_audit *out);
size_t fakecuda_pending(void);                /* copies enqueued and not completed */
void *fakecuda_shadow(uint64_t dptr);         /* read-write alias of device memory (tests only) */
uint64_t fakecuda_pinned_bytes(void);
uint64_t fakecuda_copies(void);
void fakecuda_reset_errors(void);
/* fn(kind, arg) after every copy enqueued (under the double's lock: fn must not call the driver). */
void fakecuda_on_enqueue(void (*fn)(int kind, void *arg), void *arg);

/* GPUDirect RDMA (issue 20): per device, DMA_BUF_SUPPORTED, GPU_DIRECT_RDMA_WRITES_ORDERING and
 * GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS as cuDeviceGetAttribute answers them; counters of
 * cuFlushGPUDirectRDMAWrites calls and dma-buf exports. */
void fakecuda_set_gdr(int dev, int dmabuf_supported, int ordering, int flush_opts);
uint64_t fakecuda_gdr_flushes(void);
uint64_t fakecuda_dmabuf_exports(void);

#endif
