/* rdma_topo.c — NIC choice by override, PCIe and NUMA affinity; see rdma_topo.h. */
#include "actors/transfer/rdma/rdma_topo.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvpool.h"
#include "runtime/log.h"

#define ACTOR "rdma"
#define MAX_LISTED 64

int kvp_rdma_nic_sysfs(const char *root, const char *name, struct kvp_rdma_nic *out)
{
    if (!root || !name || !out || !name[0] || strlen(name) >= KVP_RDMA_NIC_NAME ||
        strchr(name, '/')) {
        kvp_log_error(ACTOR, "nic sysfs: bad arguments");
        return KVP_ERR_INVALID;
    }
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", name);
    out->numa_node = -1;
    char p[PATH_MAX];
    int k = snprintf(p, sizeof p, "%s/class/infiniband/%s/device", root, name);
    if (k < 0 || (size_t)k >= sizeof p)
        return KVP_ERR_INVALID;
    struct stat st;
    if (stat(p, &st) != 0) {
        kvp_log_warn(ACTOR, "nic %s: no %s (%s)", name, p, strerror(errno));
        return KVP_ERR_NOT_FOUND;
    }
    char real[PATH_MAX];
    if (realpath(p, real) && strlen(real) < sizeof out->pci_path)
        snprintf(out->pci_path, sizeof out->pci_path, "%s", real);
    k = snprintf(p, sizeof p, "%s/class/infiniband/%s/device/numa_node", root, name);
    FILE *fp = k > 0 && (size_t)k < sizeof p ? fopen(p, "r") : NULL;
    if (fp) {
        int v;
        if (fscanf(fp, "%d", &v) == 1 && v >= 0)
            out->numa_node = v;
        fclose(fp);
    }
    return KVP_OK;
}

int kvp_rdma_nic_filter(const char *list, const struct kvp_rdma_nic *nics, size_t n,
                        bool *allowed)
{
    if ((n && !nics) || !allowed) {
        kvp_log_error(ACTOR, "nic filter: bad arguments");
        return KVP_ERR_INVALID;
    }
    bool all = !list || !list[0];
    for (size_t i = 0; i < n; i++)
        allowed[i] = all;
    if (all)
        return KVP_OK;
    const char *s = list;
    int items = 0;
    for (;;) {
        while (*s == ' ')
            s++;
        const char *e = s;
        while (*e && *e != ',')
            e++;
        const char *t = e;
        while (t > s && t[-1] == ' ')
            t--;
        size_t len = (size_t)(t - s);
        if (len == 0 || len >= KVP_RDMA_NIC_NAME || ++items > MAX_LISTED) {
            kvp_log_error(ACTOR, "rdma device list '%s': empty, too long or too many names",
                          list);
            return KVP_ERR_INVALID;
        }
        bool found = false;
        for (size_t i = 0; i < n; i++)
            if (strlen(nics[i].name) == len && memcmp(nics[i].name, s, len) == 0)
                allowed[i] = found = true;
        if (!found) {
            kvp_log_error(ACTOR, "rdma device list: no RDMA device named '%.*s' on this host",
                          (int)len, s);
            return KVP_ERR_INVALID;
        }
        if (!*e)
            break;
        s = e + 1;
    }
    return KVP_OK;
}

/* Number of leading path components two sysfs device paths share. */
static size_t common_components(const char *a, const char *b)
{
    size_t n = 0;
    while (*a && *b) {
        const char *ea = strchr(a + 1, '/'), *eb = strchr(b + 1, '/');
        size_t la = ea ? (size_t)(ea - a) : strlen(a), lb = eb ? (size_t)(eb - b) : strlen(b);
        if (la != lb || memcmp(a, b, la) != 0)
            break;
        n++;
        a += la;
        b += lb;
    }
    return n;
}

static long score(const struct kvp_rdma_nic *nic, const struct kvp_rdma_mem_loc *loc)
{
    if (loc->gpu_pci_path && loc->gpu_pci_path[0] && nic->pci_path[0])
        return 1000 + (long)common_components(nic->pci_path, loc->gpu_pci_path);
    if (loc->numa_node >= 0 && nic->numa_node == loc->numa_node)
        return 1;
    return 0;
}

int kvp_rdma_nic_pick(const struct kvp_rdma_nic *nics, size_t n, const bool *allowed,
                      const struct kvp_rdma_mem_loc *loc, unsigned rr)
{
    if ((n && !nics) || !loc) {
        kvp_log_error(ACTOR, "nic pick: bad arguments");
        return KVP_ERR_INVALID;
    }
    long best = -1;
    size_t ties = 0;
    for (size_t i = 0; i < n; i++) {
        if ((allowed && !allowed[i]) || !nics[i].active)
            continue;
        long sc = score(&nics[i], loc);
        if (sc > best) {
            best = sc;
            ties = 1;
        } else if (sc == best) {
            ties++;
        }
    }
    if (best < 0)
        return KVP_ERR_UNSUPPORTED;
    size_t want = rr % ties;
    for (size_t i = 0; i < n; i++) {
        if ((allowed && !allowed[i]) || !nics[i].active || score(&nics[i], loc) != best)
            continue;
        if (want-- == 0)
            return (int)i;
    }
    return KVP_ERR_INTERNAL; /* unreachable: ties counted above */
}
