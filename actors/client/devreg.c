/* devreg.c — the client's side of GPU memory: registration of device ranges and the device
 * counters (devmem.h, devstage.h, docs/gpu.md). */
#include <string.h>

#include "actors/client/client.h"
#include "runtime/log.h"

void kvp_client_dev_register(struct kvp_client *c, void *addr, size_t len)
{
    struct kvp_devmem_info info;
    int cl = kvp_devmem_classify(addr, &info);
    if (cl != 1)
        return; /* host memory (or a driver error, logged): nothing to cache */
    if (kvp_devmem_remember((uintptr_t)addr, len, info.ordinal) != KVP_OK)
        return;
    int rc = kvp_devstage_pin(c->devstage, info.ordinal);
    kvp_log_info(c->name, "register_buffer: %p+%zu is device memory (device %d, allocation %#lx+%zu)%s", addr, len,
                 info.ordinal, (unsigned long)info.base, info.size,
                 rc == KVP_OK ? ": bounce buffers pinned" : ": bounce buffers NOT pinned (driver error)");
}

int kvp_device_pointer(const void *addr)
{
    return kvp_devmem_classify(addr, NULL);
}

int kvp_client_device_stats(kvp_client *c, kvp_device_stats *out)
{
    if (!c || !out)
        return kvp_client_invalid(__func__, "client or out NULL");
    struct kvp_devstage_stats s;
    kvp_devstage_stats(c->devstage, &s);
    memset(out, 0, sizeof *out);
    out->driver_loaded = kvp_devmem_available();
    out->registered_bytes = s.registered_bytes;
    out->bounce_bytes = s.bounce_bytes;
    out->lanes = s.lanes;
    out->lanes_busy = s.lanes_busy;
    out->staged_batches = s.staged_batches;
    out->staged_bytes = s.staged_bytes;
    out->copies = s.copies;
    out->copy_errors = s.copy_errors;
    return KVP_OK;
}
