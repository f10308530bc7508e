/*
 * test_fence_faults.c — the fault-injection rules themselves (actors/transfer/fault.h), each
 * against a real segment server over loopback or the local transport: FAIL → TRANSFER at once,
 * DROP → TIMEOUT, a short STALL completes, a whole-peer STALL past the timeout fences READs and
 * WRITEs (the region and the buffers untouched afterwards), count limits the hits, the local
 * transport's FAIL / STALL / WEDGE, the KVP_XFER_FAULT syntax (a bad spec adds nothing) and the
 * variable read at engine start (in a child process).
 *
 * Built a second time with KVP_FENCE_RDMA (test_fence_faults_rdma, issue 20): the same segment
 * server with its RDMA side and the engine on the rdma transport, both over the verbs double
 * (tests/lib/fakeverbs_locked.h); the fault wrapper wraps the rdma transport. Only the cases
 * that go through a network transport run there, and the segment's TCP counters must show no
 * READ/WRITE frame (the data went over the double's QPs).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "actors/segment/seg_server.h"
#include "actors/transfer/fault.h"
#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "tests/lib/proc_reap.h"
#ifdef KVP_FENCE_RDMA
#include "actors/segment/seg_rdma.h"
#include "actors/transfer/rdma/xport_rdma.h"
#include "tests/lib/fakeverbs.h"
#include "tests/lib/fakeverbs_locked.h"
#endif

#define REGION (4u << 20)

static struct {
    struct kvp_seg_server *srv;
    uint8_t *region;
    char ep[64];
    struct kvp_xfer_engine *e;
#ifdef KVP_FENCE_RDMA
    struct fv_fabric *f;
    struct fv_node *nc, *ns;
    struct kvp_rdma_env env;
    struct kvp_xport_rdma_opts o;
    struct kvp_rdma_hello_tcp_opts ho;
#endif
} T;

static int setup(void **state)
{
    (void)state;
    T.region = aligned_alloc(4096, REGION);
    for (size_t i = 0; i < REGION; i++)
        T.region[i] = (uint8_t)(i * 5u + 1u);
    if (kvp_seg_server_start(&T.srv, "127.0.0.1", 0, T.region, REGION) != KVP_OK)
        return -1;
    kvp_seg_server_set_id(T.srv, 1);
    snprintf(T.ep, sizeof T.ep, "127.0.0.1:%u", kvp_seg_server_port(T.srv));
    struct kvp_xfer_params p = {.conns_per_peer = 2, .fence_bound_ms = 300};
#ifdef KVP_FENCE_RDMA
    struct fv_config fc = {.seed = 7, .jitter_ns = 1000000};
    struct fv_node_config cc = {.name = "client", .n_devices = 1, .flush = FV_FLUSH_ALL};
    struct fv_node_config sc = {.name = "segment", .n_devices = 1};
    if (fv_fabric_new(&T.f, &fc) != KVP_OK || fv_node_add(T.f, &cc, &T.nc) != KVP_OK ||
        fv_node_add(T.f, &sc, &T.ns) != KVP_OK)
        return -1;
    T.env = fv_locked_env(T.f);
    struct kvp_seg_rdma_cfg rc = {.who = "seg-faults", .ops = fv_locked_ops(T.ns), .env = &T.env,
                                  .sysfs_root = "/nonexistent", .gid_index = -1, .psn_seed = 11};
    if (kvp_seg_server_rdma(T.srv, &rc) != KVP_OK)
        return -1;
    T.ho.timeout_ms = 2000;
    T.o = (struct kvp_xport_rdma_opts){
        .cfg = {.ops = fv_locked_ops(T.nc), .gid_index = -1, .psn_seed = 13, .sysfs_root = "/nonexistent"},
        .env = T.env, .client_id = 3, .hello = kvp_rdma_hello_tcp, .hello_arg = &T.ho, .drive_clock = true};
    p.transport = &kvp_xport_rdma;
    p.transport_opts = &T.o;
#endif
    return kvp_xfer_engine_new(&T.e, &p) == KVP_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvp_xfer_fault_clear();
    kvp_xfer_fault_release();
    kvp_xfer_fault_quiesce(5000);
    kvp_xfer_engine_destroy(&T.e);
#ifdef KVP_FENCE_RDMA
    struct kvp_seg_server_stats st;
    kvp_seg_server_stats(T.srv, &st);
    for (int o = 0; o < 2; o++) /* read, write: no data frame took the TCP path */
        for (int r = 0; r < KVP_SEG_RESULTS; r++)
            if (st.requests[o][r]) {
                fprintf(stderr, "rdma variant: %llu TCP data frames (op %d, result %d)\n",
                        (unsigned long long)st.requests[o][r], o, r);
                return -1;
            }
#endif
    kvp_seg_server_stop(&T.srv);
#ifdef KVP_FENCE_RDMA
    fv_locked_reset();
    fv_fabric_destroy(&T.f);
#endif
    free(T.region);
    return 0;
}

static struct kvp_xfer_slice sl(void *buf, uint64_t len, uint64_t off, uint8_t op, uint32_t seg)
{
    return (struct kvp_xfer_slice){.local = buf, .length = len, .segment_id = seg, .endpoint = T.ep,
                                   .remote_offset = off, .op = op};
}

static void test_fence_faults_fail_drop_stall_count(void **state)
{
    (void)state;
    uint8_t buf[8192];
    struct kvp_xfer_slice s = sl(buf, sizeof buf, 0, KVP_XFER_READ, 1);
    struct kvp_xfer_fault_rule r = {.action = KVP_FAULT_FAIL, .transport = KVP_FAULT_TCP, .op = KVP_XFER_READ,
                                    .count = 1};
    assert_int_equal(kvp_xfer_fault_add(&r), KVP_OK);
    assert_int_equal(kvp_xfer_run(T.e, &s, 1, 5000), KVP_ERR_TRANSFER);
    assert_int_equal(kvp_xfer_run(T.e, &s, 1, 5000), KVP_OK); /* count 1: spent */
    kvp_xfer_fault_clear();

    r = (struct kvp_xfer_fault_rule){.action = KVP_FAULT_DROP, .transport = KVP_FAULT_TCP};
    assert_int_equal(kvp_xfer_fault_add(&r), KVP_OK);
    assert_int_equal(kvp_xfer_run(T.e, &s, 1, 50), KVP_ERR_TIMEOUT);
    kvp_xfer_fault_clear();

    r = (struct kvp_xfer_fault_rule){.action = KVP_FAULT_STALL, .transport = KVP_FAULT_TCP, .ms = 20};
    assert_int_equal(kvp_xfer_fault_add(&r), KVP_OK);
    memset(buf, 0, sizeof buf);
    assert_int_equal(kvp_xfer_run(T.e, &s, 1, 10000), KVP_OK); /* a stall inside the timeout */
    assert_memory_equal(buf, T.region, sizeof buf);
    kvp_xfer_fault_clear();
    /* a rule on another segment id or another transport does not match */
    r = (struct kvp_xfer_fault_rule){.action = KVP_FAULT_FAIL, .segment_id = 99};
    assert_int_equal(kvp_xfer_fault_add(&r), KVP_OK);
    r = (struct kvp_xfer_fault_rule){.action = KVP_FAULT_FAIL, .transport = KVP_FAULT_LOCAL};
    assert_int_equal(kvp_xfer_fault_add(&r), KVP_OK);
    assert_int_equal(kvp_xfer_run(T.e, &s, 1, 5000), KVP_OK);
    kvp_xfer_fault_clear();
    assert_int_equal(kvp_xfer_fault_quiesce(5000), KVP_OK);
}

static void test_fence_faults_peer_stall_fences_reads_and_writes(void **state)
{
    (void)state;
    struct kvp_xfer_fault_rule r = {.action = KVP_FAULT_STALL, .endpoint = T.ep, .ms = 400};
    assert_int_equal(kvp_xfer_fault_add(&r), KVP_OK);
    uint8_t *rd = calloc(1, 65536), *wr = malloc(65536);
    memset(wr, 0xee, 65536);
    uint8_t before[65536];
    memcpy(before, T.region + 65536, sizeof before);
    struct kvp_xfer_slice s[2] = {sl(rd, 65536, 0, KVP_XFER_READ, 1), sl(wr, 65536, 65536, KVP_XFER_WRITE, 1)};
    assert_int_equal(kvp_xfer_run(T.e, s, 2, 50), KVP_ERR_TIMEOUT);
    assert_int_equal(s[0].status, KVP_ERR_TIMEOUT);
    assert_int_equal(s[1].status, KVP_ERR_TIMEOUT);
    kvp_xfer_fault_clear();
    memset(rd, 0x42, 65536);
    memset(wr, 0x43, 65536);
    assert_int_equal(kvp_xfer_fault_quiesce(5000), KVP_OK); /* the stall ran out: pieces dropped */
    struct kvp_xfer_slice sync = sl(before, 4096, 0, KVP_XFER_READ, 1);
    uint8_t probe[4096];
    sync.local = probe;
    assert_int_equal(kvp_xfer_run(T.e, &sync, 1, 5000), KVP_OK);
    for (size_t i = 0; i < 65536; i++) {
        assert_int_equal(rd[i], 0x42);
        assert_int_equal(wr[i], 0x43);
        assert_int_equal(T.region[65536 + i], before[i]); /* the dropped WRITE never landed */
    }
    free(rd);
    free(wr);
}

#ifndef KVP_FENCE_RDMA
static void test_fence_faults_local_transport(void **state)
{
    (void)state;
    static uint8_t local[65536];
    memset(local, 0x10, sizeof local);
    assert_int_equal(kvp_xfer_register_local(T.e, 77, local, sizeof local), KVP_OK);
    uint8_t buf[4096];
    memset(buf, 0x20, sizeof buf);
    struct kvp_xfer_slice s = sl(buf, sizeof buf, 0, KVP_XFER_WRITE, 77);
    struct kvp_xfer_fault_rule r = {.action = KVP_FAULT_FAIL, .transport = KVP_FAULT_LOCAL, .count = 1};
    assert_int_equal(kvp_xfer_fault_add(&r), KVP_OK);
    assert_int_equal(kvp_xfer_run(T.e, &s, 1, 1000), KVP_ERR_TRANSFER);
    assert_int_equal(local[0], 0x10);
    kvp_xfer_fault_clear();
    r = (struct kvp_xfer_fault_rule){.action = KVP_FAULT_STALL, .transport = KVP_FAULT_LOCAL, .ms = 200};
    assert_int_equal(kvp_xfer_fault_add(&r), KVP_OK);
    assert_int_equal(kvp_xfer_run(T.e, &s, 1, 30), KVP_ERR_TIMEOUT); /* would end past the deadline: not done */
    assert_int_equal(local[0], 0x10);
    kvp_xfer_fault_clear();
    r = (struct kvp_xfer_fault_rule){.action = KVP_FAULT_WEDGE, .transport = KVP_FAULT_LOCAL};
    assert_int_equal(kvp_xfer_fault_add(&r), KVP_OK);
    struct kvp_xfer_stats st0, st1;
    kvp_xfer_stats(T.e, &st0);
    assert_int_equal(kvp_xfer_run(T.e, &s, 1, 30), KVP_ERR_FENCE_FAILED);
    kvp_xfer_stats(T.e, &st1);
    assert_int_equal(st1.fence_failed, st0.fence_failed + 1);
    kvp_xfer_fault_clear();
    assert_int_equal(kvp_xfer_run(T.e, &s, 1, 1000), KVP_OK);
    assert_int_equal(local[0], 0x20);
    assert_int_equal(kvp_xfer_unregister_local(T.e, 77), KVP_OK);
}

static void test_fence_faults_env_syntax(void **state)
{
    (void)state;
    assert_int_equal(kvp_xfer_fault_parse("late,op=read,ms=500;fail,transport=tcp,op=write,segment=3,count=1"),
                     KVP_OK);
    kvp_xfer_fault_clear();
    assert_int_equal(kvp_xfer_fault_parse("stall,endpoint=127.0.0.1:9,ms=10"), KVP_OK);
    kvp_xfer_fault_clear();
    assert_int_equal(kvp_xfer_fault_parse("explode,ms=1"), KVP_ERR_INVALID);
    assert_int_equal(kvp_xfer_fault_parse("fail;late,op=sideways"), KVP_ERR_INVALID); /* none added */
    assert_int_equal(kvp_xfer_fault_parse("drop,ms=abc"), KVP_ERR_INVALID);
    assert_int_equal(kvp_xfer_fault_parse("drop,color=red"), KVP_ERR_INVALID);
    /* nothing was added by the bad specs: a READ still works */
    uint8_t buf[512];
    struct kvp_xfer_slice s = sl(buf, sizeof buf, 0, KVP_XFER_READ, 1);
    assert_int_equal(kvp_xfer_run(T.e, &s, 1, 5000), KVP_OK);
    struct kvp_xfer_fault_rule bad = {.action = 9};
    assert_int_equal(kvp_xfer_fault_add(&bad), KVP_ERR_INVALID);
}

/* Child mode: the rules come from KVP_XFER_FAULT, read when the engine starts. Exit 0 when a
 * READ failed with TRANSFER (rule "fail,op=read") and a WRITE still worked. */
#endif

static int env_child(void)
{
    if (setup(NULL) != 0)
        return 2;
    uint8_t buf[512];
    struct kvp_xfer_slice s = sl(buf, sizeof buf, 0, KVP_XFER_READ, 1);
    int a = kvp_xfer_run(T.e, &s, 1, 5000);
    s.op = KVP_XFER_WRITE;
    memcpy(buf, T.region, sizeof buf);
    int b = kvp_xfer_run(T.e, &s, 1, 5000);
    teardown(NULL);
    return a == KVP_ERR_TRANSFER && b == KVP_OK ? 0 : 1;
}

#ifndef KVP_FENCE_RDMA
static void test_fence_faults_env_rules_read_at_engine_start(void **state)
{
    (void)state;
    pid_t pid = fork();
    kvp_test_child_track(pid); /* killed at teardown if a failed assert skips its stop */
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("KVP_XFER_FAULT", "fail,transport=tcp,op=read", 1);
        execl("/proc/self/exe", "test_fence_faults", "--env-child", (char *)NULL);
        _exit(3);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}
#endif

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--env-child"))
        return env_child();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fence_faults_fail_drop_stall_count),
        cmocka_unit_test(test_fence_faults_peer_stall_fences_reads_and_writes),
#ifndef KVP_FENCE_RDMA /* transport-independent: run once, in the tcp build */
        cmocka_unit_test(test_fence_faults_local_transport),
        cmocka_unit_test(test_fence_faults_env_syntax),
        cmocka_unit_test(test_fence_faults_env_rules_read_at_engine_start),
#endif
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
