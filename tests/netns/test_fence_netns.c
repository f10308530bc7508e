/*
 * test_fence_netns.c — fencing over a real network path (issue 6): the client (this process's
 * main thread, and so the transfer engine's I/O thread it starts) in one network namespace, the
 * segment data-plane server (a child process) in another, joined by a veth pair with addresses
 * 10.77.N.1/.2 that exist only inside these namespaces. An nftables rule in the segment's
 * namespace drops the data traffic for longer than the call's timeout:
 *  - get: the responses are dropped; the call returns TIMEOUT after fencing; the caller refills
 *    its buffer; the rule goes; TCP retransmits the response: it lands in scratch, not in D;
 *  - put: the WRITE is dropped on the way in; TIMEOUT; the space is "reused" (new bytes in the
 *    region); the rule goes; the retransmitted WRITE reaches the segment after its deadline and
 *    lands nowhere.
 * A READ queued behind the stale traffic on the same connection proves it was processed.
 * Needs root and `ip netns`/`nft`; skips with a message otherwise. Namespaces are always removed.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "actors/segment/seg_server.h"
#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "tests/lib/proc_reap.h"

#define REGION (8u << 20)
#define SEG_ID 9u

static struct {
    bool ok;
    char why[256];
    char ns_a[32], ns_b[32], veth_a[16], veth_b[16];
    char addr_a[32], addr_b[32];
    int orig_ns;
    pid_t seg_pid;
    uint8_t *region;
    uint32_t port;
    char endpoint[64];
} N;

static int sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[600];
    snprintf(full, sizeof full, "%s >/dev/null 2>&1", cmd);
    int rc = system(full);
    return rc == 0 ? 0 : -1;
}

static int enter_ns(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "/var/run/netns/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = setns(fd, CLONE_NEWNET);
    close(fd);
    return rc;
}

static void cleanup(void)
{
    if (N.seg_pid > 0) {
        kill(N.seg_pid, SIGKILL);
        waitpid(N.seg_pid, NULL, 0);
        N.seg_pid = 0;
    }
    if (N.orig_ns >= 0) {
        setns(N.orig_ns, CLONE_NEWNET);
        close(N.orig_ns);
        N.orig_ns = -1;
    }
    if (N.ns_a[0])
        sh("ip netns del %s", N.ns_a);
    if (N.ns_b[0])
        sh("ip netns del %s", N.ns_b);
    if (N.region && N.region != MAP_FAILED)
        munmap(N.region, REGION);
    N.region = NULL;
}

static int setup(void **state)
{
    (void)state;
    memset(&N, 0, sizeof N);
    N.orig_ns = -1;
    if (geteuid() != 0) {
        snprintf(N.why, sizeof N.why, "not root: network namespaces need CAP_SYS_ADMIN");
        return 0;
    }
    int id = (int)(getpid() % 100000);
    snprintf(N.ns_a, sizeof N.ns_a, "kvpfa%d", id);
    snprintf(N.ns_b, sizeof N.ns_b, "kvpfb%d", id);
    snprintf(N.veth_a, sizeof N.veth_a, "kvfa%d", id);
    snprintf(N.veth_b, sizeof N.veth_b, "kvfb%d", id);
    int net = 1 + (int)(getpid() % 250);
    snprintf(N.addr_a, sizeof N.addr_a, "10.77.%d.1", net);
    snprintf(N.addr_b, sizeof N.addr_b, "10.77.%d.2", net);
    if (sh("ip netns add %s", N.ns_a) || sh("ip netns add %s", N.ns_b)) {
        snprintf(N.why, sizeof N.why, "`ip netns add` failed");
        cleanup();
        return 0;
    }
    if (sh("ip link add %s netns %s type veth peer name %s netns %s", N.veth_a, N.ns_a, N.veth_b, N.ns_b) ||
        sh("ip -n %s addr add %s/24 dev %s", N.ns_a, N.addr_a, N.veth_a) ||
        sh("ip -n %s addr add %s/24 dev %s", N.ns_b, N.addr_b, N.veth_b) ||
        sh("ip -n %s link set %s up", N.ns_a, N.veth_a) || sh("ip -n %s link set %s up", N.ns_b, N.veth_b) ||
        sh("ip -n %s link set lo up", N.ns_a) || sh("ip -n %s link set lo up", N.ns_b) ||
        sh("ip netns exec %s nft add table inet kvpf", N.ns_b) ||
        sh("ip netns exec %s nft add chain inet kvpf in '{ type filter hook input priority 0; }'", N.ns_b) ||
        sh("ip netns exec %s nft add chain inet kvpf out '{ type filter hook output priority 0; }'", N.ns_b)) {
        snprintf(N.why, sizeof N.why, "veth/nftables set-up failed (ip link veth, nft)");
        cleanup();
        return 0;
    }
    /* The segment: a child process in namespace B; its region is shared with us. */
    N.region = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (N.region == MAP_FAILED) {
        snprintf(N.why, sizeof N.why, "mmap failed");
        cleanup();
        return 0;
    }
    for (size_t i = 0; i < REGION; i++)
        N.region[i] = (uint8_t)(i * 7u + 3u);
    int pfd[2];
    if (pipe(pfd) != 0)
        return -1;
    N.seg_pid = fork();
    kvp_test_child_track(N.seg_pid); /* killed at teardown if a failed assert skips its stop */
    if (N.seg_pid == 0) {
        close(pfd[0]);
        struct kvp_seg_server *s = NULL;
        uint32_t port = 0;
        if (enter_ns(N.ns_b) == 0 && kvp_seg_server_start(&s, N.addr_b, 0, N.region, REGION) == KVP_OK) {
            kvp_seg_server_set_id(s, SEG_ID);
            port = kvp_seg_server_port(s);
        }
        if (write(pfd[1], &port, sizeof port) != sizeof port || port == 0)
            _exit(2);
        for (;;)
            pause();
    }
    close(pfd[1]);
    if (read(pfd[0], &N.port, sizeof N.port) != sizeof N.port || N.port == 0) {
        close(pfd[0]);
        snprintf(N.why, sizeof N.why, "the segment server did not start in namespace %s", N.ns_b);
        cleanup();
        return 0;
    }
    close(pfd[0]);
    snprintf(N.endpoint, sizeof N.endpoint, "%s:%u", N.addr_b, N.port);
    /* The client side: this thread (and the engine threads it starts) in namespace A. */
    N.orig_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (N.orig_ns < 0 || enter_ns(N.ns_a) != 0) {
        snprintf(N.why, sizeof N.why, "setns into %s failed", N.ns_a);
        cleanup();
        return 0;
    }
    N.ok = true;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cleanup();
    return 0;
}

#define SKIP_UNLESS_READY()                                                                        \
    do {                                                                                           \
        if (!N.ok) {                                                                               \
            printf("SKIP: %s\n", N.why);                                                           \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

static struct kvp_xfer_slice slice(void *buf, uint64_t len, uint64_t off, uint8_t op)
{
    return (struct kvp_xfer_slice){.local = buf, .length = len, .segment_id = SEG_ID, .endpoint = N.endpoint,
                                   .remote_offset = off, .op = op};
}

static uint64_t count_not(const uint8_t *b, size_t len, uint8_t v)
{
    uint64_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += b[i] != v;
    return n;
}

static void test_fence_netns_get_dropped_responses_land_in_scratch(void **state)
{
    (void)state;
    SKIP_UNLESS_READY();
    struct kvp_xfer_engine *e = NULL;
    struct kvp_xfer_params p = {.conns_per_peer = 1};
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    uint8_t warm[4096];
    struct kvp_xfer_slice s = slice(warm, sizeof warm, 0, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(e, &s, 1, 5000), KVP_OK); /* the connection is up */
    assert_int_equal(sh("ip netns exec %s nft add rule inet kvpf out tcp sport %u drop", N.ns_b, N.port), 0);
    const size_t len = 256 * 1024;
    uint8_t *d = malloc(len);
    memset(d, 0, len);
    s = slice(d, len, 4096, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(e, &s, 1, 300), KVP_ERR_TIMEOUT);
    memset(d, 0xd2, len); /* the caller reuses D at once */
    usleep(500 * 1000);   /* the drop lasts well past the timeout */
    assert_int_equal(sh("ip netns exec %s nft flush chain inet kvpf out", N.ns_b), 0);
    /* Behind the stale response on the same (only) connection: completes once it was drained. */
    s = slice(warm, sizeof warm, 0, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(e, &s, 1, 60000), KVP_OK);
    assert_memory_equal(warm, N.region, sizeof warm);
    struct kvp_xfer_stats st;
    kvp_xfer_stats(e, &st);
    printf("netns get: stale response retransmitted after the drop: %lu bytes drained into scratch, "
           "%lu stray bytes in D\n", (unsigned long)st.stray_bytes, (unsigned long)count_not(d, len, 0xd2));
    assert_int_equal(count_not(d, len, 0xd2), 0);
    assert_int_equal(st.stray_bytes, len);
    kvp_xfer_engine_destroy(&e);
    free(d);
}

static void test_fence_netns_put_dropped_writes_land_nowhere(void **state)
{
    (void)state;
    SKIP_UNLESS_READY();
    struct kvp_xfer_engine *e = NULL;
    struct kvp_xfer_params p = {.conns_per_peer = 1};
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    uint8_t warm[4096];
    struct kvp_xfer_slice s = slice(warm, sizeof warm, 0, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(e, &s, 1, 5000), KVP_OK);
    assert_int_equal(sh("ip netns exec %s nft add rule inet kvpf in tcp dport %u drop", N.ns_b, N.port), 0);
    const size_t len = 64 * 1024, off = 1u << 20; /* small enough to leave in one send: retransmitted */
    uint8_t *src = malloc(len);
    memset(src, 0x11, len);
    s = slice(src, len, off, KVP_XFER_WRITE);
    assert_int_equal(kvp_xfer_run(e, &s, 1, 300), KVP_ERR_TIMEOUT);
    memset(src, 0x99, len);            /* the caller reuses its buffer */
    memset(N.region + off, 0x2b, len); /* the master gave the space to another object */
    usleep(500 * 1000);
    assert_int_equal(sh("ip netns exec %s nft flush chain inet kvpf in", N.ns_b), 0);
    uint8_t *back = malloc(len);
    s = slice(back, len, off, KVP_XFER_READ);
    int rc = kvp_xfer_run(e, &s, 1, 60000);
    /* OK: the stale WRITE went first on this connection and was answered; TRANSFER: the engine
     * reset that connection (the WRITE was fenced mid-send) and this READ raced the reset. */
    assert_true(rc == KVP_OK || rc == KVP_ERR_TRANSFER);
    if (rc != KVP_OK)
        assert_int_equal(kvp_xfer_run(e, &s, 1, 60000), KVP_OK);
    printf("netns put: after the retransmissions, %lu bytes of the reused space changed\n",
           (unsigned long)count_not(N.region + off, len, 0x2b));
    assert_int_equal(count_not(back, len, 0x2b), 0);
    assert_int_equal(count_not(N.region + off, len, 0x2b), 0);
    kvp_xfer_engine_destroy(&e);
    free(src);
    free(back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fence_netns_get_dropped_responses_land_in_scratch),
        cmocka_unit_test(test_fence_netns_put_dropped_writes_land_nowhere),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
