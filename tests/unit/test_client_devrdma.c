/*
 * test_client_devrdma.c — the CUDA side of GPU memory over RDMA (issue 20, note §5) against the
 * CUDA driver double: the dma-buf export of an allocation (a real fd of the device memory's
 * pages), the DMA_BUF_SUPPORTED check that sends GPU memory to staging instead, which devices need
 * cuFlushGPUDirectRDMAWrites after READs, and the flush itself. (The verbs side of dma-buf
 * registration, ibv_reg_dmabuf_mr with iova addressing, is tested against the verbs double in
 * test_rdma_xport.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "actors/client/devmem.h"
#include "actors/client/devrdma.h"
#include "kvpool.h"
#include "runtime/log.h"
#include "tests/lib/fakecuda/fakecuda_load.h"

static void test_devrdma_dmabuf_export_flush_and_unsupported(void **state)
{
    (void)state;
    struct kvp_rdma_cuda cu;
    assert_int_equal(kvp_devrdma_cuda(&cu), KVP_OK);
    uint8_t *d1 = fakecuda_dev_alloc(1, 1 << 20);
    uint8_t *d0 = fakecuda_dev_alloc(0, 1 << 20);
    assert_non_null(d1);
    assert_non_null(d0);
    uint64_t base = 0, size = 0;
    assert_int_equal(cu.addr_range(cu.arg, (uint64_t)(uintptr_t)(d1 + 4096), &base, &size), 0);
    assert_int_equal(base, (uint64_t)(uintptr_t)d1);
    assert_int_equal(size, 1 << 20);
    assert_int_not_equal(cu.addr_range(cu.arg, (uint64_t)(uintptr_t)&base, &base, &size), 0);
    uint64_t ex0 = FC.dmabuf_exports();
    int fd = -1;
    assert_int_equal(cu.dmabuf_fd(cu.arg, base, size, &fd), 0);
    assert_true(fd >= 0);
    assert_int_equal(FC.dmabuf_exports(), ex0 + 1);
    /* the fd is the device memory: bytes written through it show in the allocation */
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_true((uint64_t)st.st_size >= size);
    uint8_t *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(m != MAP_FAILED);
    m[12345] = 0xab;
    assert_int_equal(((uint8_t *)FC.shadow((uint64_t)(uintptr_t)d1))[12345], 0xab);
    munmap(m, size);
    cu.close_fd(cu.arg, fd);
    /* device 1 orders nothing natively (needs the flush), device 0 orders for its owner */
    assert_true(cu.needs_flush(cu.arg, 1));
    assert_false(cu.needs_flush(cu.arg, 0));
    uint64_t f0 = FC.gdr_flushes();
    assert_int_equal(cu.flush(cu.arg, 1), 0);
    assert_int_equal(FC.gdr_flushes(), f0 + 1);
    /* a flush without the HOST option cannot be done from the host: no flush needed/possible */
    FC.set_gdr(1, 1, 0, 0);
    assert_false(cu.needs_flush(cu.arg, 1));
    /* a device without dma-buf support: the export is refused (the caller stages instead) */
    FC.set_gdr(1, 0, 0, 1);
    fd = -1;
    assert_int_not_equal(cu.dmabuf_fd(cu.arg, base, size, &fd), 0);
    assert_int_equal(fd, -1);
    FC.set_gdr(1, 1, 0, 1);
    /* device 0 still exports */
    assert_int_equal(cu.dmabuf_fd(cu.arg, (uint64_t)(uintptr_t)d0, 1 << 20, &fd), 0);
    cu.close_fd(cu.arg, fd);
}

int main(void)
{
    if (fakecuda_load() != 0)
        return 1;
    kvp_log_set_level(KVP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_devrdma_dmabuf_export_flush_and_unsupported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
