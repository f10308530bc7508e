/* devrdma.c — see devrdma.h. */
#ifdef KVP_HAVE_VERBS
#include "actors/client/devrdma.h"

#include <string.h>
#include <unistd.h>

#include "actors/client/devmem.h"
#include "kvpool.h"
#include "runtime/log.h"

/* CUDA driver API values (cuda.h, CUDA 12) */
#define ATTR_FLUSH_WRITES_OPTIONS 117  /* CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS */
#define ATTR_WRITES_ORDERING 118       /* CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING */
#define ATTR_DMA_BUF_SUPPORTED 124     /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED */
#define PTR_DEVICE_ORDINAL 9           /* CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL */
#define HANDLE_DMA_BUF_FD 1            /* CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD */
#define ORDERING_OWNER 100             /* CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER */
#define FLUSH_OPTION_HOST 1            /* CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST */
#define FLUSH_TARGET_CURRENT_CTX 0     /* CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX */
#define FLUSH_TO_OWNER 100             /* CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER */

static int addr_range(void *arg, uint64_t ptr, uint64_t *base, uint64_t *size)
{
    (void)arg;
    const struct kvp_cuda *d = kvp_devmem_driver();
    kvp_cu_devptr b = 0;
    size_t s = 0;
    if (!d || d->addr_range(&b, &s, (kvp_cu_devptr)ptr) != 0)
        return -1;
    *base = b;
    *size = s;
    return 0;
}

static int dmabuf_fd(void *arg, uint64_t base, uint64_t size, int *fd)
{
    (void)arg;
    const struct kvp_cuda *d = kvp_devmem_driver();
    int ordinal = -1, dev = -1, ok = 0;
    if (!d || d->get_attr(&ordinal, PTR_DEVICE_ORDINAL, (kvp_cu_devptr)base) != 0 ||
        d->device_get(&dev, ordinal) != 0 || d->dev_attr(&ok, ATTR_DMA_BUF_SUPPORTED, dev) != 0 || !ok)
        return -1;
    /* the handle covers whole pages (the driver's rule); flags 0 (the PCIe-mapping flag fails on
     * some devices, note §5) */
    uint64_t pb = base & ~4095ull, pe = (base + size + 4095) & ~4095ull;
    int h = -1;
    kvp_cu_result r = d->range_handle(&h, (kvp_cu_devptr)pb, (size_t)(pe - pb), HANDLE_DMA_BUF_FD, 0);
    if (r != 0 || h < 0) {
        kvp_log_warn("devrdma", "cuMemGetHandleForAddressRange(DMA_BUF_FD) of %llu B: %s",
                     (unsigned long long)(pe - pb), kvp_devmem_errstr(r));
        return -1;
    }
    *fd = h;
    return 0;
}

static void close_fd(void *arg, int fd)
{
    (void)arg;
    close(fd);
}

static bool needs_flush(void *arg, int ordinal)
{
    (void)arg;
    const struct kvp_cuda *d = kvp_devmem_driver();
    int dev = -1, order = 0, opts = 0;
    if (!d || d->device_get(&dev, ordinal) != 0 || d->dev_attr(&order, ATTR_WRITES_ORDERING, dev) != 0 ||
        d->dev_attr(&opts, ATTR_FLUSH_WRITES_OPTIONS, dev) != 0)
        return true; /* unknown: flushing is safe, only slower */
    return order < ORDERING_OWNER && (opts & FLUSH_OPTION_HOST);
}

static int flush(void *arg, int ordinal)
{
    (void)arg;
    const struct kvp_cuda *d = kvp_devmem_driver();
    int dev = -1;
    void *ctx = NULL, *old = NULL;
    if (!d || d->device_get(&dev, ordinal) != 0 || d->primary_retain(&ctx, dev) != 0)
        return -1;
    kvp_cu_result r = d->ctx_push(ctx);
    if (r == 0) {
        r = d->flush_gdr(FLUSH_TARGET_CURRENT_CTX, FLUSH_TO_OWNER);
        d->ctx_pop(&old);
    }
    d->primary_release(dev);
    return r == 0 ? 0 : -1;
}

int kvp_devrdma_cuda(struct kvp_rdma_cuda *out)
{
    if (!out)
        return KVP_ERR_INVALID;
    memset(out, 0, sizeof *out);
    if (!kvp_devmem_available())
        return KVP_ERR_UNSUPPORTED;
    const struct kvp_cuda *d = kvp_devmem_driver();
    if (!d || !d->dev_attr || !d->range_handle || !d->flush_gdr)
        return KVP_ERR_UNSUPPORTED;
    *out = (struct kvp_rdma_cuda){.addr_range = addr_range, .dmabuf_fd = dmabuf_fd,
                                  .close_fd = close_fd, .needs_flush = needs_flush, .flush = flush};
    return KVP_OK;
}
#else
typedef int kvp_devrdma_unused; /* no libibverbs: nothing to build */
#endif
