/*
 * verbs_probe.c — kvp_verbs_probe (verbs_ops.h): "is there an RDMA device?", through any ops
 * table, so the no-device path is tested against the double as well as the real library.
 */
#include "actors/transfer/rdma/verbs_ops.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kvpool.h"
#include "runtime/log.h"

int kvp_verbs_probe(const struct kvp_verbs_ops *ops, const char *who, int nodev_level,
                    struct kvp_verbs_probe *out)
{
    if (!who)
        who = "rdma";
    if (!ops || !ops->get_device_list || !ops->free_device_list) {
        kvp_log_error(who, "rdma probe: no verbs ops table given");
        return KVP_ERR_INVALID;
    }
    struct kvp_verbs_probe p;
    memset(&p, 0, sizeof p);
    int num = 0;
    errno = 0;
    struct ibv_device **list = ops->get_device_list(ops, &num);
    if (!list) {
        p.list_errno = errno ? errno : ENODEV;
        kvp_log(nodev_level, who, "rdma: no RDMA device (%s: device list unavailable: %s); using TCP",
                ops->name, strerror(p.list_errno));
    } else {
        p.n_devices = num > 0 ? num : 0;
        if (p.n_devices > 0 && list[0]) {
            const char *n = ops->get_device_name ? ops->get_device_name(list[0]) : NULL;
            snprintf(p.first_name, sizeof p.first_name, "%s", n ? n : "?");
            kvp_log_info(who, "rdma: %d RDMA device(s) (%s), first %s", p.n_devices, ops->name,
                         p.first_name);
        } else {
            p.n_devices = 0;
            kvp_log(nodev_level, who, "rdma: no RDMA device (%s: 0 devices listed); using TCP",
                    ops->name);
        }
        ops->free_device_list(ops, list);
    }
    if (out)
        *out = p;
    return p.n_devices > 0 ? KVP_OK : KVP_ERR_UNSUPPORTED;
}
