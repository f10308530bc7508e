/*
 * test_rdma_topo.c — NIC choice (actors/transfer/rdma/rdma_topo.h): reading NUMA node and PCIe
 * path from a sysfs tree built in a temporary directory (two NICs on two sockets, a GPU behind
 * the same PCIe switch as each), the device_name / rdma_devices list, and the pick: the NIC near
 * the GPU that owns the memory, the NIC on the host memory's NUMA node, round-robin among equals,
 * and "no usable NIC" for the TCP fallback.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "actors/transfer/rdma/rdma_topo.h"
#include "kvpool.h"
#include "runtime/log.h"

static char root[PATH_MAX];

#define SW0 "/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
#define SW1 "/devices/pci0000:80/0000:80:01.0/0000:81:00.0"
#define NIC0 SW0 "/0000:02:00.0/0000:03:00.0"
#define GPU0 SW0 "/0000:02:01.0/0000:04:00.0"
#define NIC1 SW1 "/0000:82:00.0/0000:83:00.0"
#define GPU1 SW1 "/0000:82:01.0/0000:84:00.0"

static void mkdir_p(const char *rel)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s%s", root, rel);
    for (char *s = p + strlen(root) + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755);
            *s = '/';
        }
    mkdir(p, 0755);
}

static void put(const char *rel, const char *text)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s%s", root, rel);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void nic_link(const char *name, const char *dev)
{
    char d[PATH_MAX], l[PATH_MAX], t[PATH_MAX];
    snprintf(d, sizeof d, "/class/infiniband/%s", name);
    mkdir_p(d);
    snprintf(l, sizeof l, "%s%s/device", root, d);
    snprintf(t, sizeof t, "%s%s", root, dev);
    assert_int_equal(symlink(t, l), 0);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/kvp-topo-XXXXXX");
    if (!mkdtemp(root))
        return -1;
    mkdir_p(NIC0);
    mkdir_p(GPU0);
    mkdir_p(NIC1);
    mkdir_p(GPU1);
    put(NIC0 "/numa_node", "0\n");
    put(NIC1 "/numa_node", "1\n");
    nic_link("mlx5_0", NIC0);
    nic_link("mlx5_1", NIC1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void read_nics(struct kvp_rdma_nic nics[2])
{
    assert_int_equal(kvp_rdma_nic_sysfs(root, "mlx5_0", &nics[0]), KVP_OK);
    assert_int_equal(kvp_rdma_nic_sysfs(root, "mlx5_1", &nics[1]), KVP_OK);
    nics[0].active = nics[1].active = true;
}

static void test_rdma_topo_sysfs_reads_numa_and_path(void **state)
{
    (void)state;
    struct kvp_rdma_nic nics[2];
    read_nics(nics);
    assert_int_equal(nics[0].numa_node, 0);
    assert_int_equal(nics[1].numa_node, 1);
    char want[PATH_MAX], real[PATH_MAX];
    snprintf(want, sizeof want, "%s%s", root, NIC1);
    assert_non_null(realpath(want, real));
    assert_string_equal(nics[1].pci_path, real);
    struct kvp_rdma_nic x;
    assert_int_equal(kvp_rdma_nic_sysfs(root, "mlx5_7", &x), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_rdma_nic_sysfs(root, "../x", &x), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_nic_sysfs(NULL, "mlx5_0", &x), KVP_ERR_INVALID);
}

/* Two NICs with a GPU buffer near one of them: each GPU's memory goes to the NIC behind its
 * own PCIe switch; host memory to the NIC on its NUMA node; unknown locality round-robins. */
static void test_rdma_topo_pick_gpu_near_nic_and_numa(void **state)
{
    (void)state;
    struct kvp_rdma_nic nics[2];
    read_nics(nics);
    char g0[PATH_MAX], g1[PATH_MAX], t[PATH_MAX];
    snprintf(t, sizeof t, "%s%s", root, GPU0);
    assert_non_null(realpath(t, g0));
    snprintf(t, sizeof t, "%s%s", root, GPU1);
    assert_non_null(realpath(t, g1));
    for (unsigned rr = 0; rr < 4; rr++) {
        struct kvp_rdma_mem_loc m0 = {.numa_node = 1, .gpu_pci_path = g0};
        struct kvp_rdma_mem_loc m1 = {.numa_node = 0, .gpu_pci_path = g1};
        assert_int_equal(kvp_rdma_nic_pick(nics, 2, NULL, &m0, rr), 0); /* PCIe beats NUMA */
        assert_int_equal(kvp_rdma_nic_pick(nics, 2, NULL, &m1, rr), 1);
        struct kvp_rdma_mem_loc h1 = {.numa_node = 1};
        assert_int_equal(kvp_rdma_nic_pick(nics, 2, NULL, &h1, rr), 1);
        struct kvp_rdma_mem_loc unk = {.numa_node = -1};
        assert_int_equal(kvp_rdma_nic_pick(nics, 2, NULL, &unk, rr), (int)(rr % 2));
    }
    /* the NIC near the GPU is down: the other one */
    nics[0].active = false;
    struct kvp_rdma_mem_loc m0 = {.numa_node = -1, .gpu_pci_path = g0};
    assert_int_equal(kvp_rdma_nic_pick(nics, 2, NULL, &m0, 0), 1);
    nics[1].active = false;
    assert_int_equal(kvp_rdma_nic_pick(nics, 2, NULL, &m0, 0), KVP_ERR_UNSUPPORTED);
    assert_int_equal(kvp_rdma_nic_pick(nics, 0, NULL, &m0, 0), KVP_ERR_UNSUPPORTED);
    assert_int_equal(kvp_rdma_nic_pick(nics, 2, NULL, NULL, 0), KVP_ERR_INVALID);
}

static void test_rdma_topo_device_list_override(void **state)
{
    (void)state;
    struct kvp_rdma_nic nics[2];
    read_nics(nics);
    bool ok[2];
    assert_int_equal(kvp_rdma_nic_filter("mlx5_1", nics, 2, ok), KVP_OK);
    assert_false(ok[0]);
    assert_true(ok[1]);
    char t[PATH_MAX], g0[PATH_MAX];
    snprintf(t, sizeof t, "%s%s", root, GPU0);
    assert_non_null(realpath(t, g0));
    struct kvp_rdma_mem_loc m0 = {.numa_node = 0, .gpu_pci_path = g0};
    assert_int_equal(kvp_rdma_nic_pick(nics, 2, ok, &m0, 0), 1); /* the override wins */
    assert_int_equal(kvp_rdma_nic_filter(" mlx5_0 , mlx5_1 ", nics, 2, ok), KVP_OK);
    assert_true(ok[0] && ok[1]);
    assert_int_equal(kvp_rdma_nic_filter("", nics, 2, ok), KVP_OK);
    assert_true(ok[0] && ok[1]);
    assert_int_equal(kvp_rdma_nic_filter(NULL, nics, 2, ok), KVP_OK);
    assert_int_equal(kvp_rdma_nic_filter("mlx5_9", nics, 2, ok), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_nic_filter("mlx5_0,,mlx5_1", nics, 2, ok), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_nic_filter("mlx5_0,", nics, 2, ok), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_nic_filter("mlx5", nics, 2, ok), KVP_ERR_INVALID); /* no prefix match */
    assert_int_equal(kvp_rdma_nic_filter("mlx5_0", nics, 2, NULL), KVP_ERR_INVALID);
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rdma_topo_sysfs_reads_numa_and_path),
        cmocka_unit_test(test_rdma_topo_pick_gpu_near_nic_and_numa),
        cmocka_unit_test(test_rdma_topo_device_list_override),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
