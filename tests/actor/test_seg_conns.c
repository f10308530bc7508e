/*
 * test_seg_conns.c — the segment server as an event-driven actor (actors/segment/seg_server.c):
 *  - 10,000 idle TCP connections (KVP_TEST_IDLE_CONNS overrides; held by a child process, each
 *    answered one PING so the server has accepted it) while 4 clients read: the process's thread
 *    count does not change with the connections, and every read returns the region's bytes;
 *  - a connection that sent half a header and one that sent half a WRITE payload do not delay
 *    others; a sweep as if the clock were past the stall limit drops both, and no idle
 *    connection (kvp_seg_server_sweep: the loops' own sweep, with the clock ahead);
 *  - a connection that sends a garbage header is closed while another is served;
 *  - a client that pipelines far more answers than the per-connection cap before reading any
 *    gets every one, in order, with the right bytes (reading is paused and resumed).
 * Every blocking receive has a 20 s guard (SO_RCVTIMEO): a server that blocked would fail the
 * assertion, not hang the test; nothing here is timed.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "actors/segment/seg_server.h"
#include "actors/segment/segment_internal.h"
#include "kvpool.h"
#include "tests/actor/seg_raw_client.h"
#include "wire/envelope.h"
#include "tests/lib/proc_reap.h"

#define REGION (8u << 20)
#define SEG_ID 5
#define BYTE(i) ((uint8_t)((i) * 31u + 7u))

static struct {
    struct kvp_seg_server *srv;
    uint8_t *region;
    uint32_t port;
} T;

static int setup(void **state)
{
    (void)state;
    T.region = malloc(REGION);
    if (!T.region)
        return -1;
    for (size_t i = 0; i < REGION; i++)
        T.region[i] = BYTE(i);
    if (kvp_seg_server_start(&T.srv, "127.0.0.1", 0, T.region, REGION) != KVP_OK)
        return -1;
    kvp_seg_server_set_id(T.srv, SEG_ID);
    T.port = kvp_seg_server_port(T.srv);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvp_seg_server_stop(&T.srv);
    free(T.region);
    return 0;
}

/* A connection whose blocking receives give up after 20 s (a guard, not a timing). */
static int guarded_connect(void)
{
    int fd = seg_raw_connect(T.port);
    assert_true(fd >= 0);
    struct timeval tv = {.tv_sec = 20};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

/* READ [off, off+len) on fd and check the bytes. */
static void read_check(int fd, uint64_t req, uint64_t off, uint32_t len, uint8_t *buf)
{
    uint8_t h[KVP_FRAME_HEADER_BYTES];
    seg_raw_header(h, KVP_FRAME_READ, SEG_ID, req, off, len, 0);
    seg_raw_send_all(fd, h, sizeof h);
    struct kvp_frame f = seg_raw_response(fd);
    assert_int_equal(f.op, KVP_FRAME_READ_RESP);
    assert_int_equal(f.status, KVP_OK);
    assert_int_equal(f.req_id, req);
    assert_int_equal(f.length, len);
    seg_raw_recv_all(fd, buf, len);
    for (uint32_t i = 0; i < len; i += 4093)
        assert_int_equal(buf[i], BYTE(off + i));
    assert_int_equal(buf[len - 1], BYTE(off + len - 1));
}

static void ping_check(int fd)
{
    uint8_t h[KVP_FRAME_HEADER_BYTES];
    seg_raw_header(h, KVP_FRAME_PING, SEG_ID, 77, 0, 0, 0);
    seg_raw_send_all(fd, h, sizeof h);
    struct kvp_frame f = seg_raw_response(fd);
    assert_int_equal(f.op, KVP_FRAME_PONG);
    assert_int_equal(f.status, KVP_OK);
}

/* recv on fd returns EOF (the server closed it). */
static void assert_closed(int fd)
{
    uint8_t b[64];
    ssize_t r;
    do
        r = recv(fd, b, sizeof b, 0);
    while (r > 0);
    assert_int_equal(r, 0);
}

#define READERS 4
#define READS_PER_READER 400

static void *reader_main(void *arg)
{
    int *failures = arg;
    int fd = seg_raw_connect(T.port);
    struct timeval tv = {.tv_sec = 20};
    uint8_t *buf = malloc(256 * 1024);
    if (fd < 0 || !buf || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) {
        (*failures)++;
        free(buf);
        return NULL;
    }
    for (int i = 0; i < READS_PER_READER; i++) {
        uint32_t len = (i % 2) ? 256 * 1024 : 4096;
        uint64_t off = ((uint64_t)i * 1234567u) % (REGION - len);
        uint8_t h[KVP_FRAME_HEADER_BYTES], rh[KVP_FRAME_HEADER_BYTES];
        seg_raw_header(h, KVP_FRAME_READ, SEG_ID, (uint64_t)i, off, len, 0);
        if (send(fd, h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h ||
            recv(fd, rh, sizeof rh, MSG_WAITALL) != (ssize_t)sizeof rh ||
            recv(fd, buf, len, MSG_WAITALL) != (ssize_t)len || buf[0] != BYTE(off) ||
            buf[len - 1] != BYTE(off + len - 1)) {
            (*failures)++; /* cmocka assertions are for the main thread */
            break;
        }
    }
    free(buf);
    close(fd);
    return NULL;
}

/* The child: open n connections, PING each, report on `ready`, wait until `done` closes. */
static void idle_child(int n, int ready, int done)
{
    int *fds = malloc(sizeof(int) * (size_t)n);
    int ok = 0;
    for (int i = 0; fds && i < n; i++) {
        fds[i] = seg_raw_connect(T.port);
        if (fds[i] < 0)
            break;
        uint8_t h[KVP_FRAME_HEADER_BYTES], rh[KVP_FRAME_HEADER_BYTES];
        seg_raw_header(h, KVP_FRAME_PING, SEG_ID, (uint64_t)i, 0, 0, 0);
        if (send(fds[i], h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h ||
            recv(fds[i], rh, sizeof rh, MSG_WAITALL) != (ssize_t)sizeof rh)
            break;
        ok++;
    }
    if (write(ready, &ok, sizeof ok) != (ssize_t)sizeof ok)
        _exit(1);
    char c;
    while (read(done, &c, 1) > 0) {
    }
    _exit(0);
}

static void test_seg_idle_conns_cost_no_threads(void **state)
{
    (void)state;
    const char *env = getenv("KVP_TEST_IDLE_CONNS");
    int n = env ? atoi(env) : 10000;
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < (rlim_t)n + 512) {
        rl.rlim_cur = rl.rlim_max;
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
    if (rl.rlim_cur < (rlim_t)n + 512) {
        n = (int)rl.rlim_cur - 512;
        print_message("RLIMIT_NOFILE hard limit %lu: %d idle connections\n", (unsigned long)rl.rlim_max, n);
    }
    int t0 = thread_count();
    long rss0 = rss_kib();
    int ready[2], done[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(done), 0);
    pid_t pid = fork();
    kvp_test_child_track(pid); /* killed at teardown if a failed assert skips its stop */
    assert_true(pid >= 0);
    if (pid == 0) {
        close(ready[0]);
        close(done[1]);
        idle_child(n, ready[1], done[0]);
    }
    close(ready[1]);
    close(done[0]);
    int ok = -1;
    assert_int_equal(read(ready[0], &ok, sizeof ok), (ssize_t)sizeof ok);
    assert_int_equal(ok, n); /* every connection accepted and served */
    int t1 = thread_count();
    long rss1 = rss_kib();

    int failures = 0;
    pthread_t th[READERS];
    for (int i = 0; i < READERS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, reader_main, &failures), 0);
    int tmax = 0;
    for (int k = 0; k < 20; k++) { /* samples while the readers run */
        int t = thread_count();
        tmax = t > tmax ? t : tmax;
        usleep(1000);
    }
    for (int i = 0; i < READERS; i++)
        pthread_join(th[i], NULL);
    int t2 = thread_count();
    print_message("threads: %d before, %d with %d idle connections, at most %d with %d readers "
                  "(their own threads included), %d after; VmRSS %ld -> %ld KiB (%.2f KiB per "
                  "connection, server and its region only: the client side is in the child)\n",
                  t0, t1, n, tmax, READERS, t2, rss0, rss1, (double)(rss1 - rss0) / n);
    assert_int_equal(failures, 0);
    assert_int_equal(t1, t0);
    assert_true(tmax <= t0 + READERS);
    assert_int_equal(t2, t0);
    /* The idle connections are still served after the readers. */
    int fd = guarded_connect();
    ping_check(fd);
    close(fd);
    close(done[1]);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(ready[0]);
}

static void test_seg_half_frame_staller_delays_nobody(void **state)
{
    (void)state;
    uint8_t h[KVP_FRAME_HEADER_BYTES];
    /* Several stallers, so that every loop has one. */
    int half_hdr[KVP_SEG_LOOPS * 2], half_payload[KVP_SEG_LOOPS * 2];
    for (int i = 0; i < KVP_SEG_LOOPS * 2; i++) {
        half_hdr[i] = guarded_connect();
        seg_raw_header(h, KVP_FRAME_READ, SEG_ID, 1, 0, 4096, 0);
        seg_raw_send_all(half_hdr[i], h, sizeof h / 2);
        half_payload[i] = guarded_connect();
        seg_raw_header(h, KVP_FRAME_WRITE, SEG_ID, 2, 7u << 20, 8192, 0);
        seg_raw_send_all(half_payload[i], h, sizeof h);
        uint8_t pay[4096];
        memset(pay, 0xAB, sizeof pay);
        seg_raw_send_all(half_payload[i], pay, sizeof pay);
    }
    int idle = guarded_connect();
    ping_check(idle);
    uint8_t *buf = malloc(256 * 1024);
    assert_non_null(buf);
    int other[KVP_SEG_LOOPS * 2];
    for (int i = 0; i < KVP_SEG_LOOPS * 2; i++) {
        other[i] = guarded_connect();
        for (int k = 0; k < 20; k++)
            read_check(other[i], (uint64_t)k, (uint64_t)(k * 65536 + i), 256 * 1024, buf);
    }
    /* Past the stall limit: the stallers are dropped, the idle ones stay. */
    kvp_seg_server_sweep(T.srv, KVP_SEG_STALL_MS + 1000);
    for (int i = 0; i < KVP_SEG_LOOPS * 2; i++) {
        assert_closed(half_hdr[i]);
        assert_closed(half_payload[i]);
    }
    ping_check(idle);
    for (int i = 0; i < KVP_SEG_LOOPS * 2; i++) {
        read_check(other[i], 99, 4096, 4096, buf);
        close(other[i]);
        close(half_hdr[i]);
        close(half_payload[i]);
    }
    /* The half payload landed no byte past what was sent (4 KiB of 0xAB, then the region). */
    assert_int_equal(T.region[(7u << 20) + 4095], 0xAB);
    assert_int_equal(T.region[(7u << 20) + 4096], BYTE((7u << 20) + 4096));
    for (size_t i = 0; i < 4096; i++)
        T.region[(7u << 20) + i] = BYTE((7u << 20) + i);
    close(idle);
    free(buf);
}

static void test_seg_garbage_header_closes_only_that_connection(void **state)
{
    (void)state;
    int good = guarded_connect();
    int bad = guarded_connect();
    uint8_t h[KVP_FRAME_HEADER_BYTES];
    memset(h, 0x5A, sizeof h);
    seg_raw_send_all(bad, h, sizeof h);
    assert_closed(bad);
    close(bad);
    uint8_t *buf = malloc(4096);
    assert_non_null(buf);
    read_check(good, 1, 100, 4096, buf);
    free(buf);
    close(good);
}

/* 400 READs of 256 KiB (100 MiB of answers) sent before any answer is read: far past the
 * per-connection cap; every answer comes, in order, with the region's bytes. */
static void test_seg_inflight_cap_pauses_and_resumes(void **state)
{
    (void)state;
    int fd = guarded_connect();
    enum { N = 400, LEN = 256 * 1024 };
    static uint8_t reqs[N * KVP_FRAME_HEADER_BYTES];
    for (int i = 0; i < N; i++)
        seg_raw_header(reqs + i * KVP_FRAME_HEADER_BYTES, KVP_FRAME_READ, SEG_ID, (uint64_t)i,
                       (uint64_t)i * 4096, LEN, 0);
    seg_raw_send_all(fd, reqs, sizeof reqs); /* 16 KiB: fits the socket buffers */
    uint8_t *buf = malloc(LEN);
    assert_non_null(buf);
    for (int i = 0; i < N; i++) {
        struct kvp_frame f = seg_raw_response(fd);
        assert_int_equal(f.op, KVP_FRAME_READ_RESP);
        assert_int_equal(f.status, KVP_OK);
        assert_int_equal(f.req_id, (uint64_t)i);
        assert_int_equal(f.length, LEN);
        seg_raw_recv_all(fd, buf, LEN);
        assert_int_equal(buf[0], BYTE((uint64_t)i * 4096));
        assert_int_equal(buf[LEN - 1], BYTE((uint64_t)i * 4096 + LEN - 1));
    }
    ping_check(fd);
    free(buf);
    close(fd);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_seg_half_frame_staller_delays_nobody, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seg_garbage_header_closes_only_that_connection, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seg_inflight_cap_pauses_and_resumes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seg_idle_conns_cost_no_threads, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
