/*
 * test_fence_peer.c — a dead or frozen peer (issue 6): the segment data-plane server runs in a
 * child process (its region in shared memory, so this process can look at it); the transfer
 * engine here reads from it while the child is SIGSTOPped (the call returns TIMEOUT within the
 * timeout plus the fence bound, per slice; after SIGCONT the late bytes land nowhere) and while
 * it is SIGKILLed mid-transfer (per-slice errors, no hang).
 *
 * Built a second time with KVP_FENCE_RDMA (test_fence_peer_rdma, issue 20): the child's segment
 * server has its RDMA side and the engine runs on the rdma transport, both over one verbs double
 * shared by the two processes (tests/lib/fakeverbs_shared.h: the fabric in a shared arena, run
 * at real time by this process's ticker; the child's node dies with the child). One-sided READs
 * do not need the segment's CPU, so a SIGSTOP alone does not hold them: the frozen case also
 * holds the segment host's NIC (a PFC pause longer than the call), and the killed case runs over
 * a slow link so the READs are still in flight when the kill destroys the segment's QPs. The
 * engine must never have moved the peer to TCP (tcp_fallback_peers 0: no TCP data frame).
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "actors/segment/seg_server.h"
#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "tests/lib/proc_stop.h"
#include "tests/lib/proc_reap.h"
#ifdef KVP_FENCE_RDMA
#include "actors/segment/seg_rdma.h"
#include "actors/transfer/rdma/xport_rdma.h"
#include "tests/lib/fakeverbs.h"
#include "tests/lib/fakeverbs_locked.h"
#include "tests/lib/fakeverbs_shared.h"
#endif

#define REGION (32u << 20)
#define SEG_ID 7u

struct child {
    pid_t pid;
    uint8_t *region; /* shared with the child */
    char endpoint[64];
#ifdef KVP_FENCE_RDMA
    struct fv_fabric *f; /* in the shared arena */
    struct fv_node *nc, *ns;
    struct kvp_xport_rdma_opts o;
    struct kvp_rdma_hello_tcp_opts ho;
#endif
};

#ifdef KVP_FENCE_RDMA
/* The fabric both processes use; ns_per_kib 0: the double's default link speed. */
static void fabric_start(struct child *ch, uint64_t ns_per_kib)
{
    struct fv_config fc = {.seed = 29, .ns_per_kib = ns_per_kib};
    struct fv_node_config cc = {.name = "client", .n_devices = 1, .flush = FV_FLUSH_ALL};
    struct fv_node_config sc = {.name = "segment", .n_devices = 1};
    assert_int_equal(fv_fabric_new(&ch->f, &fc), KVP_OK);
    assert_int_equal(fv_node_add(ch->f, &cc, &ch->nc), KVP_OK);
    assert_int_equal(fv_node_add(ch->f, &sc, &ch->ns), KVP_OK);
}

/* The engine on the rdma transport over the client node (real clock: the ticker moves the double). */
static void engine_params(struct child *ch, struct kvp_xfer_params *p)
{
    ch->ho = (struct kvp_rdma_hello_tcp_opts){.timeout_ms = 2000};
    ch->o = (struct kvp_xport_rdma_opts){
        .cfg = {.ops = fv_locked_ops(ch->nc), .gid_index = -1, .psn_seed = 13, .sysfs_root = "/nonexistent"},
        .hello = kvp_rdma_hello_tcp, .hello_arg = &ch->ho};
    p->transport = &kvp_xport_rdma;
    p->transport_opts = &ch->o;
}

/* Every byte went over the double's QPs: the engine never opened TCP to the segment, and the
 * READs were placed by the simulated NIC. */
static void assert_no_tcp(struct child *ch, struct kvp_xfer_engine *e)
{
    struct kvp_xfer_stats st;
    kvp_xfer_stats(e, &st);
    assert_int_equal(st.tcp_fallback_peers, 0);
    fv_lock();
    size_t placed = fv_audit_count(ch->f);
    fv_unlock();
    assert_true(placed > 0);
}
#endif

static void child_start(struct child *ch)
{
    ch->region = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(ch->region != MAP_FAILED);
    for (size_t i = 0; i < REGION; i++)
        ch->region[i] = (uint8_t)(i * 31u + 1u);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    ch->pid = fork();
    kvp_test_child_track(ch->pid); /* killed at teardown if a failed assert skips its stop */
    assert_true(ch->pid >= 0);
    if (ch->pid == 0) {
        close(pfd[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed assert in the parent leaves no segment behind */
        struct kvp_seg_server *s = NULL;
        if (kvp_seg_server_start(&s, "127.0.0.1", 0, ch->region, REGION) != KVP_OK)
            _exit(2);
#ifdef KVP_FENCE_RDMA
        struct kvp_seg_rdma_cfg rc = {.who = "seg-peer", .ops = fv_locked_ops(ch->ns),
                                      .sysfs_root = "/nonexistent", .gid_index = -1, .psn_seed = 11};
        if (kvp_seg_server_rdma(s, &rc) != KVP_OK)
            _exit(4);
#endif
        kvp_seg_server_set_id(s, SEG_ID);
        uint32_t port = kvp_seg_server_port(s);
        if (write(pfd[1], &port, sizeof port) != sizeof port)
            _exit(3);
        for (;;)
            pause(); /* until killed */
    }
    close(pfd[1]);
    uint32_t port = 0;
    assert_int_equal(read(pfd[0], &port, sizeof port), sizeof port);
    close(pfd[0]);
    snprintf(ch->endpoint, sizeof ch->endpoint, "127.0.0.1:%u", port);
#ifdef KVP_FENCE_RDMA
    assert_int_equal(fv_ticker_start(ch->f), KVP_OK);
    assert_int_equal(fv_ticker_watch(ch->ns, ch->pid), KVP_OK);
#endif
}

static void child_stop(struct child *ch)
{
    if (ch->pid > 0) {
        kill(ch->pid, SIGKILL);
        waitpid(ch->pid, NULL, 0);
        ch->pid = 0;
    }
#ifdef KVP_FENCE_RDMA
    fv_ticker_stop();
    fv_locked_reset();
    fv_fabric_destroy(&ch->f);
#endif
    munmap(ch->region, REGION);
}

static size_t slices_for(struct kvp_xfer_slice *s, uint8_t *buf, size_t n, uint64_t each, const char *ep)
{
    for (size_t i = 0; i < n; i++)
        s[i] = (struct kvp_xfer_slice){.local = buf + i * each, .length = each, .segment_id = SEG_ID,
                                       .endpoint = ep, .remote_offset = i * each, .op = KVP_XFER_READ};
    return n;
}

static uint64_t count_not(const uint8_t *b, size_t len, uint8_t v)
{
    uint64_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += b[i] != v;
    return n;
}

static void test_fence_peer_sigstop_timeout_then_nothing_lands(void **state)
{
    (void)state;
    struct child ch = {0};
    struct kvp_xfer_params p = {.conns_per_peer = 2, .fence_bound_ms = 1000};
    uint8_t *d = malloc(REGION);
#ifdef KVP_FENCE_RDMA
    fabric_start(&ch, 0);
    engine_params(&ch, &p);
    ch.o.prereg_base = d; /* registered: the NIC places READ bytes straight into d */
    ch.o.prereg_len = REGION;
#endif
    child_start(&ch);
    struct kvp_xfer_engine *e = NULL;
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    struct kvp_xfer_slice s[8];
    /* warm up: connections are up before the peer freezes */
    slices_for(s, d, 8, 64 * 1024, ch.endpoint);
    assert_int_equal(kvp_xfer_run(e, s, 8, 5000), KVP_OK);
    assert_true(kvp_test_stop_process(ch.pid, 5000)); /* every thread stopped (proc_stop.h) */
#ifdef KVP_FENCE_RDMA
    /* A one-sided READ needs no segment CPU: hold the frozen host's NIC too, past the call. */
    const uint64_t hold_ns = 1000000000ull;
    fv_lock();
    uint64_t hold_end = fv_now(ch.f) + hold_ns;
    fv_node_pause(ch.ns, hold_ns);
    fv_unlock();
#endif
    slices_for(s, d, 8, REGION / 8, ch.endpoint);
    uint64_t t0 = kvp_clock_now_ms();
    int rc = kvp_xfer_run(e, s, 8, 300);
    uint64_t took = kvp_clock_now_ms() - t0;
#ifdef KVP_FENCE_RDMA
    fv_lock();
    uint64_t t_ret = fv_now(ch.f);
    fv_unlock();
#endif
    printf("SIGSTOP: returned %s after %lu ms (timeout 300, fence bound 1000)\n", kvp_errname(rc),
           (unsigned long)took);
    assert_int_equal(rc, KVP_ERR_TIMEOUT);
    for (int i = 0; i < 8; i++)
        assert_true(s[i].status == KVP_ERR_TIMEOUT || s[i].status == KVP_OK);
    assert_true(took < 30000); /* returned: never hangs (no tight timing on a shared machine) */
    memset(d, 0x5e, REGION); /* the caller reuses its memory */
    assert_int_equal(kill(ch.pid, SIGCONT), 0);
#ifdef KVP_FENCE_RDMA
    /* the held requests reach the segment when the pause ends; their responses find fenced QPs */
    for (int i = 0; i < 30000; i++) {
        fv_lock();
        bool over = fv_now(ch.f) > hold_end + 50000000ull;
        fv_unlock();
        if (over)
            break;
        usleep(1000);
    }
#endif
    /* A READ on every connection, behind the stale responses: when it completes, they were drained. */
    uint8_t small[2][4096];
    struct kvp_xfer_slice sync[2];
    for (int i = 0; i < 2; i++)
        sync[i] = (struct kvp_xfer_slice){.local = small[i], .length = 4096, .segment_id = SEG_ID,
                                          .endpoint = ch.endpoint, .remote_offset = 0, .op = KVP_XFER_READ};
    assert_int_equal(kvp_xfer_run(e, sync, 2, 30000), KVP_OK);
    assert_int_equal(memcmp(small[0], ch.region, 4096), 0);
    assert_int_equal(count_not(d, REGION, 0x5e), 0);
    struct kvp_xfer_stats st;
    kvp_xfer_stats(e, &st);
    printf("SIGSTOP: %lu pieces fenced, %lu stray bytes drained after SIGCONT\n", (unsigned long)st.fenced,
           (unsigned long)st.stray_bytes);
    assert_true(st.timeouts >= 1);
#ifdef KVP_FENCE_RDMA
    assert_no_tcp(&ch, e);
    fv_lock();
    const struct fv_dma *first = NULL;
    size_t late = fv_audit_placed_after(ch.f, d, REGION, t_ret, &first);
    struct fv_stats fs;
    fv_stats_get(ch.f, &fs);
    fv_unlock();
    printf("SIGSTOP (rdma): %zu placements in d after the return (%llu late placements anywhere)\n", late,
           (unsigned long long)fs.late_placements);
    assert_int_equal(late, 0);
#endif
    kvp_xfer_engine_destroy(&e);
    free(d);
    child_stop(&ch);
}

static void test_fence_peer_sigkill_mid_transfer_per_slice_errors(void **state)
{
    (void)state;
    struct child ch = {0};
    struct kvp_xfer_params p = {.conns_per_peer = 2, .fence_bound_ms = 1000};
#ifdef KVP_FENCE_RDMA
    fabric_start(&ch, 0);
    engine_params(&ch, &p);
#endif
    child_start(&ch);
    struct kvp_xfer_engine *e = NULL;
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    uint8_t *d = malloc(REGION);
    struct kvp_xfer_slice s[8];
    slices_for(s, d, 8, 64 * 1024, ch.endpoint);
    assert_int_equal(kvp_xfer_run(e, s, 8, 5000), KVP_OK);
#ifdef KVP_FENCE_RDMA
    /* A frozen process's NIC still serves one-sided READs, so "in flight at the kill" cannot be
     * arranged without also stalling the NIC, which alone fails the READs. Here the kill comes
     * first: the endpoint made before it must fail per slice (the dead process's QPs are gone,
     * retries run out: IBV_WC_RETRY_EXC_ERR), not hang; were its QPs still served (no node
     * kill), the READs would succeed and this test would fail. */
    assert_int_equal(kill(ch.pid, SIGKILL), 0);
    waitpid(ch.pid, NULL, 0);
    ch.pid = 0;
    bool dead = false;
    for (int i = 0; i < 5000 && !dead; i++) { /* the ticker kills the node when the pidfd fires */
        fv_lock();
        dead = fv_node_killed(ch.ns);
        fv_unlock();
        if (!dead)
            usleep(1000);
    }
    assert_true(dead);
    slices_for(s, d, 8, REGION / 8, ch.endpoint);
    uint64_t t0 = kvp_clock_now_ms();
    int rc = kvp_xfer_run(e, s, 8, 20000);
    uint64_t took = kvp_clock_now_ms() - t0;
    printf("SIGKILL (rdma): returned %s after %lu ms (timeout 20000)\n", kvp_errname(rc), (unsigned long)took);
    assert_int_equal(rc, KVP_ERR_TRANSFER);
    for (int i = 0; i < 8; i++)
        assert_int_equal(s[i].status, KVP_ERR_TRANSFER);
    assert_true(took < 20000);
    assert_no_tcp(&ch, e);
    kvp_xfer_engine_destroy(&e);
    free(d);
    child_stop(&ch);
}
#else
    /* Freeze it so the transfer is surely in flight, then kill it. */
    assert_true(kvp_test_stop_process(ch.pid, 5000)); /* every thread stopped (proc_stop.h) */
    pid_t killer = fork();
    kvp_test_child_track(killer);
    if (killer == 0) {
        usleep(200 * 1000);
        kill(ch.pid, SIGKILL);
        _exit(0);
    }
    slices_for(s, d, 8, REGION / 8, ch.endpoint);
    uint64_t t0 = kvp_clock_now_ms();
    int rc = kvp_xfer_run(e, s, 8, 20000);
    uint64_t took = kvp_clock_now_ms() - t0;
    waitpid(killer, NULL, 0);
    waitpid(ch.pid, NULL, 0);
    ch.pid = 0;
    printf("SIGKILL: returned %s after %lu ms (timeout 20000)\n", kvp_errname(rc), (unsigned long)took);
    assert_int_equal(rc, KVP_ERR_TRANSFER);
    for (int i = 0; i < 8; i++)
        assert_int_equal(s[i].status, KVP_ERR_TRANSFER);
    assert_true(took < 20000); /* the dead peer's sockets closed: not the timeout */
    kvp_xfer_engine_destroy(&e);
    free(d);
    child_stop(&ch);
}
#endif

int main(void)
{
#ifdef KVP_FENCE_RDMA
    if (fv_shared_init(1ull << 30) != KVP_OK) /* before any fabric or fork */
        return 1;
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_fence_peer_sigstop_timeout_then_nothing_lands, kvp_test_children_teardown),
        cmocka_unit_test_teardown(test_fence_peer_sigkill_mid_transfer_per_slice_errors, kvp_test_children_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
