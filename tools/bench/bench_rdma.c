/*
 * bench_rdma.c — `kvpool-bench-rdma`: CPU per posted and reaped slice, rdma transport on the
 * verbs double against the TCP transport on loopback, measured in the same run (issue 20's
 * benchmark; figures, never asserted: docs/rdma.md "CPU per slice").
 *
 *   kvpool-bench-rdma [SLICE_BYTES] [SLICES_PER_BATCH] [BATCHES]   (defaults 65536 32 2000)
 *
 * TCP: a segment server on 127.0.0.1 in this process and a transfer engine; READ batches; the
 * process CPU time (CLOCK_PROCESS_CPUTIME_ID: client and server threads, the kernel's socket
 * copies included) per slice.
 * RDMA: a client and a segment transport on the verbs double; the same READ batches through
 * the non-blocking core (submit, progress) as the engine drives it, the double delivering all
 * posted work between progress calls. Two figures: the transport's own CPU per slice (thread
 * CPU minus the time inside the double's event delivery: building the WR, posting, polling the
 * CQE, the bookkeeping — what runs on a host whose NIC does the transfer; the double's
 * post_send/poll_cq bodies are counted in it), and the total
 * including the double's simulation of the NIC (which copies the payload with memcpy, work a
 * real NIC does without the CPU). The ratio printed is transport-only rdma / tcp.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "actors/segment/seg_server.h"
#include "actors/transfer/rdma/rdma_xport.h"
#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "runtime/log.h"
#include "tests/lib/fakeverbs.h"

static uint64_t cpu_ns(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static double tcp_run(uint64_t slice, int per, int batches)
{
    uint64_t region = slice * (uint64_t)per;
    uint8_t *seg = calloc(1, region), *buf = calloc(1, region);
    struct kvp_seg_server *srv = NULL;
    if (!seg || !buf || kvp_seg_server_start(&srv, "127.0.0.1", 0, seg, region) != KVP_OK) {
        fprintf(stderr, "tcp: segment server failed\n");
        exit(1);
    }
    kvp_seg_server_set_id(srv, 1);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", kvp_seg_server_port(srv));
    struct kvp_xfer_params p = {.conns_per_peer = 4, .slice_bytes = 1 << 20,
                                .connect_timeout_ms = 1000, .fence_bound_ms = 2000, .io_threads = 1};
    struct kvp_xfer_engine *e = NULL;
    if (kvp_xfer_engine_new(&e, &p) != KVP_OK) {
        fprintf(stderr, "tcp: engine failed\n");
        exit(1);
    }
    struct kvp_xfer_slice *s = calloc((size_t)per, sizeof *s);
    for (int w = 0; w < 2; w++) { /* warm: connections up */
        for (int i = 0; i < per; i++)
            s[i] = (struct kvp_xfer_slice){.local = buf + (uint64_t)i * slice, .length = slice,
                                           .segment_id = 1, .endpoint = ep,
                                           .remote_offset = (uint64_t)i * slice, .op = KVP_XFER_READ};
        kvp_xfer_run(e, s, (size_t)per, 10000);
    }
    uint64_t c0 = cpu_ns(CLOCK_PROCESS_CPUTIME_ID);
    for (int b = 0; b < batches; b++) {
        for (int i = 0; i < per; i++)
            s[i] = (struct kvp_xfer_slice){.local = buf + (uint64_t)i * slice, .length = slice,
                                           .segment_id = 1, .endpoint = ep,
                                           .remote_offset = (uint64_t)i * slice, .op = KVP_XFER_READ};
        if (kvp_xfer_run(e, s, (size_t)per, 10000) != KVP_OK) {
            fprintf(stderr, "tcp: batch failed\n");
            exit(1);
        }
    }
    uint64_t c1 = cpu_ns(CLOCK_PROCESS_CPUTIME_ID);
    kvp_xfer_engine_destroy(&e);
    kvp_seg_server_stop(&srv);
    free(s);
    free(seg);
    free(buf);
    return (double)(c1 - c0) / ((double)batches * per);
}

static struct fv_fabric *g_f;
static uint64_t env_now(void *a) { (void)a; return fv_now(g_f); }
static void env_wait(void *a, uint64_t ns) { (void)a; fv_advance(g_f, ns ? ns : 1000); }

static void rdma_run(uint64_t slice, int per, int batches, double *own, double *total)
{
    uint64_t region = slice * (uint64_t)per;
    uint8_t *seg = aligned_alloc(4096, region), *buf = aligned_alloc(4096, region);
    memset(seg, 1, region);
    struct fv_config fc = {.seed = 1, .latency_ns = 2000, .jitter_ns = 100, .ns_per_kib = 80};
    struct fv_node *nc, *ns;
    struct fv_node_config cc = {.name = "client", .n_devices = 1}, sc = {.name = "segment", .n_devices = 1};
    if (fv_fabric_new(&g_f, &fc) || fv_node_add(g_f, &cc, &nc) || fv_node_add(g_f, &sc, &ns)) {
        fprintf(stderr, "rdma: double failed\n");
        exit(1);
    }
    struct kvp_rdma_env env = {.now_ns = env_now, .wait = env_wait};
    struct kvp_rdma_cfg ccfg = {.ops = fv_node_ops(nc), .who = "client", .gid_index = -1,
                                .slice_bytes = slice, .qps_per_peer = 2, .psn_seed = 1,
                                .sysfs_root = "/nonexistent"};
    struct kvp_rdma_cfg scfg = {.ops = fv_node_ops(ns), .who = "segment", .gid_index = -1,
                                .segment = true, .psn_seed = 2, .sysfs_root = "/nonexistent"};
    struct kvp_rdma_xport *cx = NULL, *sx = NULL;
    if (kvp_rdma_open(&ccfg, &env, &cx) || kvp_rdma_open(&scfg, &env, &sx) ||
        kvp_rdma_seg_register(sx, 1, seg, region, NULL) || kvp_rdma_register(cx, buf, region, NULL)) {
        fprintf(stderr, "rdma: open failed\n");
        exit(1);
    }
    uint8_t *offer = NULL, *ans = NULL;
    size_t ol = 0, al = 0;
    struct kvp_rdma_ep *ep = NULL;
    kvp_rdma_ep_offer(cx, 1, 1, NULL, &ep, &offer, &ol);
    kvp_rdma_seg_accept(sx, offer, ol, &ans, &al);
    if (kvp_rdma_ep_complete(ep, ans, al) != KVP_OK) {
        fprintf(stderr, "rdma: handshake failed\n");
        exit(1);
    }
    free(offer);
    free(ans);
    uint64_t nic_ns = 0, id = 0;
    uint64_t t0 = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
    struct kvp_rdma_report rep[64];
    for (int b = 0; b < batches; b++) {
        for (int i = 0; i < per; i++)
            if (kvp_rdma_submit(cx, ep, ++id, KVP_RDMA_READ, buf + (uint64_t)i * slice, slice,
                                (uint64_t)i * slice) != KVP_OK) {
                fprintf(stderr, "rdma: submit failed\n");
                exit(1);
            }
        int left = per;
        while (left) {
            size_t got = kvp_rdma_progress(cx, rep, 64);
            for (size_t k = 0; k < got; k++)
                if (rep[k].status != KVP_OK) {
                    fprintf(stderr, "rdma: slice failed %d\n", rep[k].status);
                    exit(1);
                }
            left -= (int)got;
            if (left) {
                /* the simulated NIC moves everything posted (a busy poller would find the CQEs
                 * of a loaded queue in batches, as here); its CPU is not the transport's */
                uint64_t a = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
                fv_run_idle(g_f, 100000000ull);
                nic_ns += cpu_ns(CLOCK_THREAD_CPUTIME_ID) - a;
            }
        }
    }
    uint64_t t1 = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
    *own = (double)(t1 - t0 - nic_ns) / ((double)batches * per);
    *total = (double)(t1 - t0) / ((double)batches * per);
    kvp_rdma_ep_free(&ep);
    kvp_rdma_unregister(cx, buf, region);
    kvp_rdma_close(&cx);
    kvp_rdma_close(&sx);
    fv_fabric_destroy(&g_f);
    free(seg);
    free(buf);
}

int main(int argc, char **argv)
{
    uint64_t slice = argc > 1 ? strtoull(argv[1], NULL, 0) : 65536;
    int per = argc > 2 ? atoi(argv[2]) : 32;
    int batches = argc > 3 ? atoi(argv[3]) : 2000;
    if (slice < 1 || slice > (1u << 30) || per < 1 || per > 4096 || batches < 1) {
        fprintf(stderr, "usage: kvpool-bench-rdma [SLICE_BYTES] [SLICES_PER_BATCH] [BATCHES]\n");
        return 2;
    }
    kvp_log_set_level(KVP_LOG_ERROR);
    double tcp = tcp_run(slice, per, batches);
    double own = 0, total = 0;
    rdma_run(slice, per, batches, &own, &total);
    printf("slice %llu B, %d slices per batch, %d batches (READ)\n", (unsigned long long)slice,
           per, batches);
    printf("tcp  (loopback, client+server, process CPU): %9.0f ns/slice\n", tcp);
    printf("rdma (double, transport only, thread CPU):   %9.0f ns/slice\n", own);
    printf("rdma (double, incl. the simulated NIC):      %9.0f ns/slice\n", total);
    printf("ratio rdma transport / tcp: %.3f\n", own / tcp);
    return 0;
}
