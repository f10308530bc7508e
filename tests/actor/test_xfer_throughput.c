/*
 * test_xfer_throughput.c — a small throughput figure, printed, never asserted (shared, noisy
 * machine): 4 MiB READ and WRITE batches over loopback through the engine and the segment
 * server, and in the same run a raw single TCP stream (one sender thread, one receiver thread,
 * 4 MiB send()/recv() calls) as the baseline. The asserts only check the bytes.
 *
 * KVP_XFER_BENCH_MIB (default 256) sets the bytes moved per measurement.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "actors/segment/seg_server.h"
#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "xfer_test_util.h"

#define OBJ (4u << 20)

static uint64_t total_bytes(void)
{
    const char *s = getenv("KVP_XFER_BENCH_MIB");
    uint64_t mib = s ? strtoull(s, NULL, 10) : 256;
    if (mib < 8)
        mib = 8;
    return mib << 20;
}

struct raw {
    int lfd;
    uint64_t bytes;
};

static void *raw_receiver(void *arg)
{
    struct raw *r = arg;
    int fd = accept(r->lfd, NULL, NULL);
    uint8_t *buf = malloc(OBJ);
    uint64_t got = 0;
    while (got < r->bytes) {
        ssize_t n = recv(fd, buf, OBJ, 0);
        if (n <= 0)
            break;
        got += (uint64_t)n;
    }
    free(buf);
    close(fd);
    r->bytes = got;
    return NULL;
}

static double raw_stream_mib_s(uint64_t bytes)
{
    struct raw r = {.bytes = bytes};
    r.lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    assert_int_equal(bind(r.lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(r.lfd, 1), 0);
    getsockname(r.lfd, (struct sockaddr *)&a, &al);
    pthread_t th;
    pthread_create(&th, NULL, raw_receiver, &r);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    uint8_t *buf = malloc(OBJ);
    pat_fill(buf, OBJ, 1);
    uint64_t t0 = kvp_clock_now_ns();
    for (uint64_t sent = 0; sent < bytes; sent += OBJ)
        assert_int_equal(fake_write_full(fd, buf, OBJ), 0);
    pthread_join(th, NULL);
    uint64_t dt = kvp_clock_now_ns() - t0;
    assert_int_equal(r.bytes, bytes);
    close(fd);
    close(r.lfd);
    free(buf);
    return (double)bytes / (1 << 20) / ((double)dt / 1e9);
}

static double engine_mib_s(struct kvp_xfer_engine *e, const char *ep, uint8_t op, uint8_t *buf, uint64_t bytes)
{
    uint64_t t0 = kvp_clock_now_ns();
    for (uint64_t done = 0; done < bytes; done += OBJ) {
        struct kvp_xfer_slice s = {.local = buf, .length = OBJ, .segment_id = 1, .endpoint = ep,
                                   .remote_offset = (done / OBJ % 8) * OBJ, .op = op};
        assert_int_equal(kvp_xfer_run(e, &s, 1, 30000), KVP_OK);
    }
    uint64_t dt = kvp_clock_now_ns() - t0;
    return (double)bytes / (1 << 20) / ((double)dt / 1e9);
}

static void test_xfer_throughput_4mib_prints_figures(void **state)
{
    (void)state;
    uint64_t bytes = total_bytes();
    uint8_t *region = calloc(1, 8 * (size_t)OBJ);
    struct kvp_seg_server *srv;
    assert_int_equal(kvp_seg_server_start(&srv, "127.0.0.1", 0, region, 8 * (uint64_t)OBJ), KVP_OK);
    kvp_seg_server_set_id(srv, 1);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", kvp_seg_server_port(srv));
    struct kvp_xfer_engine *e;
    assert_int_equal(kvp_xfer_engine_new(&e, NULL), KVP_OK); /* defaults: 4 conns, 1 MiB slices */
    uint8_t *buf = malloc(OBJ);
    pat_fill(buf, OBJ, 3);
    engine_mib_s(e, ep, KVP_XFER_WRITE, buf, 8 * (uint64_t)OBJ); /* warm up, fill the region */
    double raw = raw_stream_mib_s(bytes);
    double w = engine_mib_s(e, ep, KVP_XFER_WRITE, buf, bytes);
    memset(buf, 0, OBJ);
    double r = engine_mib_s(e, ep, KVP_XFER_READ, buf, bytes);
    assert_int_equal(pat_check(buf, OBJ, 3), -1);
    /* Small objects: batches of 32 x 4 KiB READs (the KV-block lookup pattern). */
    enum { SMALL = 4096, BATCH = 32, BATCHES = 2000 };
    uint8_t *small = malloc(SMALL * BATCH);
    uint64_t t0 = kvp_clock_now_ns();
    for (int b = 0; b < BATCHES; b++) {
        struct kvp_xfer_slice s[BATCH];
        for (int i = 0; i < BATCH; i++)
            s[i] = (struct kvp_xfer_slice){.local = small + i * SMALL, .length = SMALL, .segment_id = 1,
                                           .endpoint = ep, .remote_offset = (uint64_t)((b * BATCH + i) % 8192) * SMALL,
                                           .op = KVP_XFER_READ};
        assert_int_equal(kvp_xfer_run(e, s, BATCH, 30000), KVP_OK);
    }
    double small_s = (double)(kvp_clock_now_ns() - t0) / 1e9;
    /* Slot 0 read an offset that is a multiple of 128 KiB, where the pattern repeats. */
    assert_int_equal(pat_check(small, SMALL, 3), -1);
    free(small);
    printf("xfer throughput (4 MiB objects, %llu MiB each, loopback, one caller thread):\n"
           "  raw single TCP stream : %8.1f MiB/s\n"
           "  engine WRITE          : %8.1f MiB/s  (%.2fx raw)\n"
           "  engine READ           : %8.1f MiB/s  (%.2fx raw)\n",
           (unsigned long long)(bytes >> 20), raw, w, w / raw, r, r / raw);
    printf("  engine READ 4 KiB x %d per batch: %.0f objects/s (%d batches)\n", BATCH,
           BATCH * BATCHES / small_s, BATCHES);
    kvp_xfer_engine_destroy(&e);
    kvp_seg_server_stop(&srv);
    free(buf);
    free(region);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xfer_throughput_4mib_prints_figures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
