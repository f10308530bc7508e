/* devmem.c — device-pointer detection through the CUDA driver API (devmem.h). */
#include "actors/client/devmem.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "runtime/log.h"

/* The driver API's types, as its ABI defines them (we do not need cuda.h to build). */
typedef int cu_result;                  /* CUresult: 0 = CUDA_SUCCESS */
typedef unsigned long long cu_devptr;   /* CUdeviceptr on 64-bit hosts */
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_MEMORYTYPE_DEVICE 2

static struct {
    bool ok;
    cu_result (*get_attr)(void *data, int attribute, cu_devptr ptr);
} drv;

/* Process-wide, loaded once: pthread_once rather than a message because the driver handle is
 * immutable after loading and any API thread may be the first to need it (no actor owns it). */
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void drv_load(void)
{
    const char *path = getenv("KVPOOL_LIBCUDA");
    if (!path || !*path)
        path = "libcuda.so.1";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return; /* no driver: every pointer is host memory */
    cu_result (*init)(unsigned) = (cu_result(*)(unsigned))dlsym(h, "cuInit");
    drv.get_attr = (cu_result(*)(void *, int, cu_devptr))dlsym(h, "cuPointerGetAttribute");
    if (!init || !drv.get_attr || init(0) != 0) {
        kvp_log_info("devmem", "%s loaded but not usable (cuInit failed or symbols missing): pointers are "
                     "taken as host memory", path);
        dlclose(h);
        drv.get_attr = NULL;
        return;
    }
    drv.ok = true; /* the handle stays open for the life of the process */
    kvp_log_info("devmem", "CUDA driver %s: device pointers are refused (KVP_ERR_UNSUPPORTED)", path);
}

bool kvp_devmem_available(void)
{
    pthread_once(&drv_once, drv_load);
    return drv.ok;
}

bool kvp_devmem_is_device(const void *addr)
{
    if (!addr || !kvp_devmem_available())
        return false;
    unsigned int type = 0;
    if (drv.get_attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (cu_devptr)(uintptr_t)addr) != 0)
        return false; /* unknown to the driver: ordinary host memory */
    if (type != CU_MEMORYTYPE_DEVICE)
        return false;
    unsigned int managed = 0;
    if (drv.get_attr(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, (cu_devptr)(uintptr_t)addr) == 0 && managed)
        return false; /* managed memory: the CPU can read and write it */
    return true;
}

int kvp_devmem_check_iov(const char *fn, const char *key, const kvp_iov *iov, size_t iovcnt)
{
    if (!kvp_devmem_available())
        return KVP_OK;
    for (size_t k = 0; k < iovcnt; k++) {
        if (iov[k].len > 0 && kvp_devmem_is_device(iov[k].base)) {
            kvp_log_warn("client", "%s: key '%.64s': piece %zu (%p, %zu bytes) is GPU device memory, which this "
                         "build cannot move yet (KVP_ERR_UNSUPPORTED)", fn, key ? key : "", k, iov[k].base,
                         iov[k].len);
            return KVP_ERR_UNSUPPORTED;
        }
    }
    return KVP_OK;
}
