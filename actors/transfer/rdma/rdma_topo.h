/*
 * rdma_topo.h — choosing a NIC for a piece of memory (issue 20 item 2; ../shared/design/rdma.md
 * §1.3): several NICs per host, the `device_name` / `rdma_devices` override (Mooncake's names:
 * a comma list), and affinity: for GPU memory the NIC that shares the longest PCIe path with the
 * GPU (same switch before same root port before same socket), for host memory a NIC on the
 * memory's NUMA node.
 *
 * kvp_rdma_nic_pick is pure (no I/O): tests give it any topology. kvp_rdma_nic_sysfs reads one
 * NIC's NUMA node and PCIe path from sysfs under a root the caller names ("/sys" in production,
 * a temporary tree in tests). Single-threaded; does not block beyond those small reads.
 */
#ifndef KVP_XFER_RDMA_TOPO_H
#define KVP_XFER_RDMA_TOPO_H

#include <stdbool.h>
#include <stddef.h>

#define KVP_RDMA_NIC_NAME 64
#define KVP_RDMA_PCI_PATH 512

struct kvp_rdma_nic {
    char name[KVP_RDMA_NIC_NAME];     /* "mlx5_0" */
    int numa_node;                    /* -1 when unknown */
    char pci_path[KVP_RDMA_PCI_PATH]; /* resolved sysfs device path, "" when unknown:
                                       * /sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0 */
    bool active;                      /* a port is ACTIVE */
};

/* Where the memory lives. */
struct kvp_rdma_mem_loc {
    int numa_node;                    /* host memory's node, -1 when unknown */
    const char *gpu_pci_path;         /* the owning GPU's resolved sysfs path; NULL for host */
};

/**
 * Read name's NUMA node (<root>/class/infiniband/<name>/device/numa_node) and resolved PCIe
 * path (realpath of <root>/class/infiniband/<name>/device) into *out; active is left false (the
 * port state comes from query_port). Missing files leave -1 / "". Returns KVP_OK,
 * KVP_ERR_INVALID for NULL arguments or a name that does not fit, KVP_ERR_NOT_FOUND when the
 * device directory does not exist (logged).
 */
int kvp_rdma_nic_sysfs(const char *root, const char *name, struct kvp_rdma_nic *out);

/**
 * Apply a `device_name` / `rdma_devices` value (comma list of NIC names, spaces allowed;
 * NULL or "" = every NIC) to nics[0..n): allowed[i] is set for each listed NIC. Returns KVP_OK,
 * or KVP_ERR_INVALID (logged with the name) when the list names a NIC that is not there, is
 * malformed (an empty item), or names more than 64 NICs.
 */
int kvp_rdma_nic_filter(const char *list, const struct kvp_rdma_nic *nics, size_t n,
                        bool *allowed);

/**
 * Pick the NIC for memory at `loc` among the allowed and active ones: the longest common PCIe
 * path with the GPU for GPU memory; for host memory (or GPU memory with no path) the same NUMA
 * node. Among equally good NICs the `rr`-th (mod their count) is taken, so callers spread
 * buffers over rails by passing a counter. allowed may be NULL (all). Returns the index, or
 * KVP_ERR_UNSUPPORTED when no NIC is allowed and active (the caller falls back to TCP),
 * KVP_ERR_INVALID for bad arguments.
 */
int kvp_rdma_nic_pick(const struct kvp_rdma_nic *nics, size_t n, const bool *allowed,
                      const struct kvp_rdma_mem_loc *loc, unsigned rr);

#endif
