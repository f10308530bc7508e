/*
 * test_fence_peer.c — a dead or frozen peer (issue 6): the segment data-plane server runs in a
 * child process (its region in shared memory, so this process can look at it); the transfer
 * engine here reads from it while the child is SIGSTOPped (the call returns TIMEOUT within the
 * timeout plus the fence bound, per slice; after SIGCONT the late bytes land nowhere) and while
 * it is SIGKILLed mid-transfer (per-slice errors, no hang).
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
#include <sys/wait.h>
#include <unistd.h>

#include "actors/segment/seg_server.h"
#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "tests/lib/proc_stop.h"
#include "tests/lib/proc_reap.h"

#define REGION (32u << 20)
#define SEG_ID 7u

struct child {
    pid_t pid;
    uint8_t *region; /* shared with the child */
    char endpoint[64];
};

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
        struct kvp_seg_server *s = NULL;
        if (kvp_seg_server_start(&s, "127.0.0.1", 0, ch->region, REGION) != KVP_OK)
            _exit(2);
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
}

static void child_stop(struct child *ch)
{
    if (ch->pid > 0) {
        kill(ch->pid, SIGKILL);
        waitpid(ch->pid, NULL, 0);
        ch->pid = 0;
    }
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
    struct child ch;
    child_start(&ch);
    struct kvp_xfer_engine *e = NULL;
    struct kvp_xfer_params p = {.conns_per_peer = 2, .fence_bound_ms = 1000};
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    uint8_t *d = malloc(REGION);
    struct kvp_xfer_slice s[8];
    /* warm up: connections are up before the peer freezes */
    slices_for(s, d, 8, 64 * 1024, ch.endpoint);
    assert_int_equal(kvp_xfer_run(e, s, 8, 5000), KVP_OK);
    assert_true(kvp_test_stop_process(ch.pid, 5000)); /* every thread stopped (proc_stop.h) */
    slices_for(s, d, 8, REGION / 8, ch.endpoint);
    uint64_t t0 = kvp_clock_now_ms();
    int rc = kvp_xfer_run(e, s, 8, 300);
    uint64_t took = kvp_clock_now_ms() - t0;
    printf("SIGSTOP: returned %s after %lu ms (timeout 300, fence bound 1000)\n", kvp_errname(rc),
           (unsigned long)took);
    assert_int_equal(rc, KVP_ERR_TIMEOUT);
    for (int i = 0; i < 8; i++)
        assert_true(s[i].status == KVP_ERR_TIMEOUT || s[i].status == KVP_OK);
    assert_true(took < 30000); /* returned: never hangs (no tight timing on a shared machine) */
    memset(d, 0x5e, REGION); /* the caller reuses its memory */
    assert_int_equal(kill(ch.pid, SIGCONT), 0);
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
    kvp_xfer_engine_destroy(&e);
    free(d);
    child_stop(&ch);
}

static void test_fence_peer_sigkill_mid_transfer_per_slice_errors(void **state)
{
    (void)state;
    struct child ch;
    child_start(&ch);
    struct kvp_xfer_engine *e = NULL;
    struct kvp_xfer_params p = {.conns_per_peer = 2, .fence_bound_ms = 1000};
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    uint8_t *d = malloc(REGION);
    struct kvp_xfer_slice s[8];
    slices_for(s, d, 8, 64 * 1024, ch.endpoint);
    assert_int_equal(kvp_xfer_run(e, s, 8, 5000), KVP_OK);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_fence_peer_sigstop_timeout_then_nothing_lands, kvp_test_children_teardown),
        cmocka_unit_test_teardown(test_fence_peer_sigkill_mid_transfer_per_slice_errors, kvp_test_children_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
