/*
 * test_xfer_tcp.c — the transfer engine against the segment data-plane server on loopback, in
 * one process (no master: the server's id is set with kvp_seg_server_set_id).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>

#include "actors/segment/seg_server.h"
#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "xfer_test_util.h"

#define SEG_ID 42u
#define REGION_BYTES (80ull << 20)

struct fixture {
    uint8_t *region;
    struct kvp_seg_server *srv;
    struct kvp_xfer_engine *eng;
    char endpoint[64];
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    f->region = calloc(1, REGION_BYTES);
    if (!f->region || kvp_seg_server_start(&f->srv, "127.0.0.1", 0, f->region, REGION_BYTES) != KVP_OK)
        return -1;
    kvp_seg_server_set_id(f->srv, SEG_ID);
    snprintf(f->endpoint, sizeof f->endpoint, "127.0.0.1:%u", kvp_seg_server_port(f->srv));
    struct kvp_xfer_params p = {.conns_per_peer = 4, .slice_bytes = 1 << 20, .connect_timeout_ms = 1000};
    if (kvp_xfer_engine_new(&f->eng, &p) != KVP_OK)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    kvp_xfer_engine_destroy(&f->eng);
    assert_null(f->eng);
    kvp_seg_server_stop(&f->srv);
    assert_null(f->srv);
    free(f->region);
    free(f);
    return 0;
}

static struct kvp_xfer_slice mk(void *local, uint64_t len, uint32_t seg, const char *ep, uint64_t off, uint8_t op)
{
    return (struct kvp_xfer_slice){.local = local, .length = len, .segment_id = seg, .endpoint = ep,
                                   .remote_offset = off, .op = op, .status = 12345};
}

static void roundtrip(struct fixture *f, uint64_t len, uint64_t off, uint32_t seed)
{
    uint8_t *src = malloc(len), *dst = malloc(len);
    assert_non_null(src);
    assert_non_null(dst);
    pat_fill(src, len, seed);
    memset(dst, 0xEE, len);
    struct kvp_xfer_slice w = mk(src, len, SEG_ID, f->endpoint, off, KVP_XFER_WRITE);
    assert_int_equal(kvp_xfer_run(f->eng, &w, 1, 10000), KVP_OK);
    assert_int_equal(w.status, KVP_OK);
    assert_int_equal(pat_check(f->region + off, len, seed), -1);
    struct kvp_xfer_slice r = mk(dst, len, SEG_ID, f->endpoint, off, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(f->eng, &r, 1, 10000), KVP_OK);
    assert_int_equal(r.status, KVP_OK);
    assert_int_equal(pat_check(dst, len, seed), -1);
    free(src);
    free(dst);
}

static void test_xfer_roundtrip_sizes_ok(void **state)
{
    struct fixture *f = *state;
    roundtrip(f, 1, 0, 1);
    roundtrip(f, 1, REGION_BYTES - 1, 2);
    roundtrip(f, 4096, 12345, 3);
    roundtrip(f, 1 << 20, 1 << 20, 4);
    roundtrip(f, (3 << 20) + 17, 7, 5); /* split into 4 pieces, the last one short */
    roundtrip(f, 64ull << 20, 5 << 20, 6);
}

static void test_xfer_mixed_batch_ok(void **state)
{
    struct fixture *f = *state;
    enum { N = 64 };
    uint8_t *bufs[N];
    struct kvp_xfer_slice s[N];
    for (int i = 0; i < N; i++) {
        uint64_t len = 1 + (uint64_t)i * 15 * 1024; /* < 1 MiB: slices do not overlap */
        bufs[i] = malloc(len);
        pat_fill(bufs[i], len, 100 + (uint32_t)i);
        s[i] = mk(bufs[i], len, SEG_ID, f->endpoint, (uint64_t)i << 20, KVP_XFER_WRITE);
    }
    assert_int_equal(kvp_xfer_run(f->eng, s, N, 10000), KVP_OK);
    for (int i = 0; i < N; i++) {
        memset(bufs[i], 0, s[i].length);
        s[i].op = KVP_XFER_READ;
    }
    assert_int_equal(kvp_xfer_run(f->eng, s, N, 10000), KVP_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(s[i].status, KVP_OK);
        assert_int_equal(pat_check(bufs[i], s[i].length, 100 + (uint32_t)i), -1);
        free(bufs[i]);
    }
}

struct worker {
    struct fixture *f;
    int id;
    int failures;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    enum { SLICES = 8, ROUNDS = 40, SZ = 24 * 1024 };
    uint8_t *buf = malloc(SLICES * SZ);
    for (int r = 0; r < ROUNDS; r++) {
        struct kvp_xfer_slice s[SLICES];
        uint32_t seed = (uint32_t)(w->id * 1000 + r);
        for (int i = 0; i < SLICES; i++) {
            pat_fill(buf + i * SZ, SZ, seed + (uint32_t)i);
            uint64_t off = ((uint64_t)w->id << 22) + (uint64_t)i * SZ;
            s[i] = mk(buf + i * SZ, SZ, SEG_ID, w->f->endpoint, off, KVP_XFER_WRITE);
        }
        if (kvp_xfer_run(w->f->eng, s, SLICES, 10000) != KVP_OK)
            w->failures++;
        memset(buf, 0, SLICES * SZ);
        for (int i = 0; i < SLICES; i++)
            s[i].op = KVP_XFER_READ;
        if (kvp_xfer_run(w->f->eng, s, SLICES, 10000) != KVP_OK)
            w->failures++;
        for (int i = 0; i < SLICES; i++)
            if (pat_check(buf + i * SZ, SZ, seed + (uint32_t)i) != -1)
                w->failures++;
    }
    free(buf);
    return NULL;
}

static void test_xfer_concurrent_batches_ok(void **state)
{
    struct fixture *f = *state;
    enum { T = 6 };
    pthread_t th[T];
    struct worker w[T];
    for (int i = 0; i < T; i++) {
        w[i] = (struct worker){.f = f, .id = i};
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
}

/*
 * A pipelined batch of READs where some answers are errors (out of range, wrong segment id):
 * the engine reads the payloads behind a header speculatively, so the bytes after an error
 * answer first land in the wrong slot and must be parsed again from the pushback buffer. Every
 * OK slot holds exactly its bytes, every error slot reports its error, and the connection
 * stays usable. Error positions vary (first piece, neighbours, last), and large pieces make
 * the readv stop mid-payload.
 */
static void test_xfer_read_errors_inside_pipelined_batch(void **state)
{
    struct fixture *f = *state;
    enum { N = 48, ROUNDS = 40 };
    pat_fill(f->region, REGION_BYTES, 77);
    uint8_t *bufs[N];
    for (int i = 0; i < N; i++) {
        bufs[i] = malloc(1 << 20);
        assert_non_null(bufs[i]);
    }
    unsigned seed = 12345;
    for (int round = 0; round < ROUNDS; round++) {
        struct kvp_xfer_slice s[N];
        int expect[N];
        for (int i = 0; i < N; i++) {
            uint64_t len = (round % 4 == 3 && i % 7 == 2) ? (256u << 10) + (uint64_t)i : 4096 + (uint64_t)i;
            uint64_t off = (uint64_t)i * (1u << 20) + (uint64_t)round * 64;
            memset(bufs[i], 0xEE, 1 << 20);
            s[i] = mk(bufs[i], len, SEG_ID, f->endpoint, off, KVP_XFER_READ);
            expect[i] = KVP_OK;
            unsigned r = (unsigned)rand_r(&seed) % 100;
            bool err = (round % 5 == 0 && i == 0) || (round % 5 == 1 && i == N - 1) || r < 12;
            if (err && (r & 1)) {
                s[i].remote_offset = REGION_BYTES + 4096;
                expect[i] = KVP_ERR_INVALID;
            } else if (err) {
                s[i].segment_id = SEG_ID + 1;
                expect[i] = KVP_ERR_NOT_FOUND;
            }
        }
        int rc = kvp_xfer_run(f->eng, s, N, 10000);
        assert_int_not_equal(rc, KVP_ERR_TIMEOUT);
        for (int i = 0; i < N; i++) {
            if (s[i].status != expect[i])
                fail_msg("round %d slice %d: status %d, expected %d", round, i, s[i].status, expect[i]);
            if (expect[i] != KVP_OK)
                continue;
            const uint8_t *want = f->region + s[i].remote_offset;
            if (memcmp(bufs[i], want, s[i].length) != 0)
                fail_msg("round %d slice %d: wrong bytes", round, i);
            assert_true(all_bytes(bufs[i] + s[i].length, (1 << 20) - s[i].length, 0xEE));
        }
    }
    for (int i = 0; i < N; i++)
        free(bufs[i]);
    roundtrip(f, 4096, 0, 10); /* the connections are still good */
    struct kvp_xfer_stats st;
    kvp_xfer_stats(f->eng, &st);
    assert_int_equal(st.stray_bytes, 0);
    assert_true(st.spec_pieces > 0); /* the speculative path ran ... */
    assert_true(st.pushbacks > 0);   /* ... and so did the re-parse after an error answer */
    printf("speculative pieces %lu, pushbacks %lu\n", (unsigned long)st.spec_pieces, (unsigned long)st.pushbacks);
}

static void test_xfer_wrong_segment_id_not_found(void **state)
{
    struct fixture *f = *state;
    uint8_t buf[8192];
    memset(f->region, 0xAB, 3 << 20);
    pat_fill(buf, sizeof buf, 9);
    struct kvp_xfer_slice s[2] = {mk(buf, sizeof buf, SEG_ID + 1, f->endpoint, 0, KVP_XFER_WRITE),
                                  mk(buf, 4096, SEG_ID, f->endpoint, 1 << 20, KVP_XFER_WRITE)};
    assert_int_equal(kvp_xfer_run(f->eng, s, 2, 5000), KVP_ERR_NOT_FOUND);
    assert_int_equal(s[0].status, KVP_ERR_NOT_FOUND);
    assert_int_equal(s[1].status, KVP_OK);
    assert_true(all_bytes(f->region, sizeof buf, 0xAB)); /* the refused payload was drained */
    memset(buf, 0x11, sizeof buf);
    struct kvp_xfer_slice r = mk(buf, 3 << 20, SEG_ID + 1, f->endpoint, 0, KVP_XFER_READ);
    uint8_t *big = malloc(3 << 20);
    memset(big, 0x11, 3 << 20);
    r.local = big;
    assert_int_equal(kvp_xfer_run(f->eng, &r, 1, 5000), KVP_ERR_NOT_FOUND);
    assert_true(all_bytes(big, 3 << 20, 0x11));
    free(big);
    /* The connections are still good. */
    roundtrip(f, 4096, 0, 10);
    /* id 0: the server rejects everything until mounted. */
    kvp_seg_server_set_id(f->srv, 0);
    struct kvp_xfer_slice z = mk(buf, 16, 0, f->endpoint, 0, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(f->eng, &z, 1, 5000), KVP_ERR_NOT_FOUND);
    kvp_seg_server_set_id(f->srv, SEG_ID);
}

static void test_xfer_out_of_bounds_invalid(void **state)
{
    struct fixture *f = *state;
    uint8_t buf[4096];
    pat_fill(buf, sizeof buf, 11);
    struct kvp_xfer_slice s = mk(buf, sizeof buf, SEG_ID, f->endpoint, REGION_BYTES - 100, KVP_XFER_WRITE);
    assert_int_equal(kvp_xfer_run(f->eng, &s, 1, 5000), KVP_ERR_INVALID);
    assert_int_equal(s.status, KVP_ERR_INVALID);
    s = mk(buf, sizeof buf, SEG_ID, f->endpoint, UINT64_MAX - 10, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(f->eng, &s, 1, 5000), KVP_ERR_INVALID); /* offset overflow */
    s = mk(buf, 16, SEG_ID, f->endpoint, REGION_BYTES, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(f->eng, &s, 1, 5000), KVP_ERR_INVALID);
    /* Bad arguments are refused before running. */
    s = mk(NULL, 16, SEG_ID, f->endpoint, 0, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(f->eng, &s, 1, 5000), KVP_ERR_INVALID);
    s = mk(buf, 0, SEG_ID, f->endpoint, 0, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(f->eng, &s, 1, 5000), KVP_ERR_INVALID);
    s = mk(buf, 16, SEG_ID, f->endpoint, 0, 9);
    assert_int_equal(kvp_xfer_run(f->eng, &s, 1, 5000), KVP_ERR_INVALID);
    s = mk(buf, 16, SEG_ID, "no-port-here", 0, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(f->eng, &s, 1, 5000), KVP_ERR_INVALID);
    assert_int_equal(kvp_xfer_run(f->eng, NULL, 1, 5000), KVP_ERR_INVALID);
    assert_int_equal(kvp_xfer_run(f->eng, &s, 0, 5000), KVP_OK);
}

static void test_xfer_server_stopped_transfer(void **state)
{
    struct fixture *f = *state;
    uint8_t buf[4096];
    roundtrip(f, 4096, 0, 12); /* connections exist */
    kvp_seg_server_stop(&f->srv); /* closes them */
    struct kvp_xfer_slice s = mk(buf, sizeof buf, SEG_ID, f->endpoint, 0, KVP_XFER_READ);
    uint64_t t0 = kvp_clock_now_ms();
    assert_int_equal(kvp_xfer_run(f->eng, &s, 1, 20000), KVP_ERR_TRANSFER);
    assert_int_equal(s.status, KVP_ERR_TRANSFER);
    assert_true(kvp_clock_now_ms() - t0 < 20000); /* failed, did not wait for the timeout */
    /* Restart on a new port for the teardown. */
    assert_int_equal(kvp_seg_server_start(&f->srv, "127.0.0.1", 0, f->region, REGION_BYTES), KVP_OK);
    kvp_seg_server_set_id(f->srv, SEG_ID);
}

struct loop_arg {
    struct kvp_xfer_engine *e;
    const char *ep;
    uint8_t *buf;
    atomic_int runs;
    atomic_int transfer_errors;
    atomic_int other_errors;
    atomic_bool stop;
};

static void *loop_reads(void *arg)
{
    struct loop_arg *a = arg;
    while (!atomic_load(&a->stop)) {
        struct kvp_xfer_slice s = mk(a->buf, 16 << 20, SEG_ID, a->ep, 0, KVP_XFER_READ);
        int rc = kvp_xfer_run(a->e, &s, 1, 20000);
        atomic_fetch_add(&a->runs, 1);
        if (rc == KVP_ERR_TRANSFER)
            atomic_fetch_add(&a->transfer_errors, 1);
        else if (rc != KVP_OK)
            atomic_fetch_add(&a->other_errors, 1);
    }
    return NULL;
}

/* The real server stopped while 16 MiB reads stream: the batches fail with TRANSFER, none hangs. */
static void test_xfer_server_killed_mid_batch_transfer(void **state)
{
    struct fixture *f = *state;
    struct loop_arg a = {.e = f->eng, .ep = f->endpoint, .buf = malloc(16 << 20)};
    pthread_t th;
    pthread_create(&th, NULL, loop_reads, &a);
    for (int i = 0; i < 5000 && atomic_load(&a.runs) < 2; i++)
        usleep(1000);
    kvp_seg_server_stop(&f->srv);
    int before = atomic_load(&a.runs);
    for (int i = 0; i < 10000 && atomic_load(&a.runs) < before + 3; i++)
        usleep(1000);
    atomic_store(&a.stop, true);
    pthread_join(th, NULL);
    assert_true(atomic_load(&a.runs) >= before + 3); /* calls keep returning */
    assert_true(atomic_load(&a.transfer_errors) >= 3);
    assert_int_equal(atomic_load(&a.other_errors), 0);
    free(a.buf);
    assert_int_equal(kvp_seg_server_start(&f->srv, "127.0.0.1", 0, f->region, REGION_BYTES), KVP_OK);
}

static void test_xfer_peer_dies_mid_response_transfer(void **state)
{
    (void)state;
    struct fake_server fs;
    assert_int_equal(fake_server_start(&fs, FAKE_HALF_CLOSE), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", fs.port);
    struct kvp_xfer_engine *e;
    struct kvp_xfer_params p = {.conns_per_peer = 1, .slice_bytes = 1 << 20};
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    uint8_t *buf = malloc(4 << 20);
    struct kvp_xfer_slice s = mk(buf, 4 << 20, 1, ep, 0, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(e, &s, 1, 20000), KVP_ERR_TRANSFER);
    assert_int_equal(s.status, KVP_ERR_TRANSFER);
    /* The fake server accepts the reconnection and serves normally now. */
    atomic_store(&fs.mode, FAKE_SERVE);
    s = mk(buf, 4096, 1, ep, 100, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(e, &s, 1, 20000), KVP_OK);
    for (int i = 0; i < 4096; i++)
        assert_int_equal(buf[i], pat_byte(7, 100 + (uint64_t)i));
    kvp_xfer_engine_destroy(&e);
    fake_server_stop(&fs);
    free(buf);
}

static void test_xfer_no_server_transfer(void **state)
{
    (void)state;
    /* A port with nobody listening: bind one, close it. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &al);
    close(fd);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", ntohs(a.sin_port));
    struct kvp_xfer_engine *e;
    assert_int_equal(kvp_xfer_engine_new(&e, NULL), KVP_OK);
    uint8_t buf[64];
    struct kvp_xfer_slice s[3] = {mk(buf, 16, 1, ep, 0, KVP_XFER_READ), mk(buf + 16, 16, 1, ep, 16, KVP_XFER_WRITE),
                                  mk(buf + 32, 16, 1, ep, 32, KVP_XFER_READ)};
    assert_int_equal(kvp_xfer_run(e, s, 3, 5000), KVP_ERR_TRANSFER);
    for (int i = 0; i < 3; i++)
        assert_int_equal(s[i].status, KVP_ERR_TRANSFER);
    assert_int_equal(kvp_xfer_probe(ep, 1, 1000), KVP_ERR_TRANSFER);
    kvp_xfer_engine_destroy(&e);
}

/* A stalled server: READ times out only after fencing; the late response never lands. */
static void test_xfer_stalled_read_timeout_fenced(void **state)
{
    (void)state;
    struct fake_server fs;
    assert_int_equal(fake_server_start(&fs, FAKE_STALL), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", fs.port);
    struct kvp_xfer_engine *e;
    struct kvp_xfer_params p = {.conns_per_peer = 1, .slice_bytes = 256 * 1024};
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    enum { LEN = 2 << 20 };
    uint8_t *dst = malloc(LEN);
    memset(dst, 0xEE, LEN);
    struct kvp_xfer_slice s[2] = {mk(dst, LEN / 2, 1, ep, 0, KVP_XFER_READ),
                                  mk(dst + LEN / 2, LEN / 2, 1, ep, LEN / 2, KVP_XFER_READ)};
    assert_int_equal(kvp_xfer_run(e, s, 2, 200), KVP_ERR_TIMEOUT);
    assert_int_equal(s[0].status, KVP_ERR_TIMEOUT);
    assert_int_equal(s[1].status, KVP_ERR_TIMEOUT);
    /* The caller owns dst again: refill it with poison, then let the late responses arrive. */
    memset(dst, 0x5A, LEN);
    uint64_t held = atomic_load(&fs.requests);
    assert_true(held >= 1);
    atomic_store(&fs.release, true);
    for (int i = 0; i < 5000 && atomic_load(&fs.late_replies) < held; i++)
        usleep(1000);
    assert_int_equal(atomic_load(&fs.late_replies), held);
    /* A new batch on the same (single) connection: it completes after the late bytes were
     * drained, so by then the engine has consumed every late byte. */
    uint8_t small[4096];
    struct kvp_xfer_slice t = mk(small, sizeof small, 1, ep, 4096, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(e, &t, 1, 10000), KVP_OK);
    for (int i = 0; i < 4096; i++)
        assert_int_equal(small[i], pat_byte(7, 4096 + (uint64_t)i));
    assert_true(all_bytes(dst, LEN, 0x5A));
    kvp_xfer_engine_destroy(&e);
    assert_true(all_bytes(dst, LEN, 0x5A));
    fake_server_stop(&fs);
    free(dst);
}

/* A server that does not read: a WRITE stuck mid-send is fenced by closing the connection;
 * after the call returns, no byte of the (changed) source buffer reaches the server. */
static void test_xfer_stalled_write_timeout_fenced(void **state)
{
    (void)state;
    struct fake_server fs;
    assert_int_equal(fake_server_start(&fs, FAKE_NO_READ), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", fs.port);
    struct kvp_xfer_engine *e;
    struct kvp_xfer_params p = {.conns_per_peer = 1, .slice_bytes = 64ull << 20};
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    enum { LEN = 64 << 20 };
    uint8_t *src = malloc(LEN);
    pat_fill(src, LEN, 5);
    struct kvp_xfer_slice s = mk(src, LEN, 1, ep, 0, KVP_XFER_WRITE);
    assert_int_equal(kvp_xfer_run(e, &s, 1, 300), KVP_ERR_TIMEOUT);
    assert_int_equal(s.status, KVP_ERR_TIMEOUT);
    memset(src, 0x5A, LEN); /* the caller reuses its buffer */
    atomic_store(&fs.release, true);
    /* The fake reads what the kernel had buffered until the closed connection ends. */
    for (int i = 0; i < 5000 && atomic_load(&fs.cur_fd) >= 0; i++)
        usleep(1000);
    kvp_xfer_engine_destroy(&e);
    fake_server_stop(&fs);
    assert_true(atomic_load(&fs.write_bytes) < (uint64_t)LEN);
    assert_int_equal(atomic_load(&fs.write_bad), 0);
    free(src);
}

/* One slice run in its own thread; timeout_ms 0: no timeout, only a destroy ends it. */
struct run_arg {
    struct kvp_xfer_engine *e;
    struct kvp_xfer_slice s;
    uint32_t timeout_ms;
    int rc;
};

static void *run_thread(void *arg)
{
    struct run_arg *a = arg;
    a->rc = kvp_xfer_run(a->e, &a->s, 1, a->timeout_ms);
    return NULL;
}

static void test_xfer_destroy_with_batch_in_flight_closed(void **state)
{
    (void)state;
    struct fake_server fs;
    assert_int_equal(fake_server_start(&fs, FAKE_STALL), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", fs.port);
    struct kvp_xfer_engine *e;
    assert_int_equal(kvp_xfer_engine_new(&e, NULL), KVP_OK);
    uint8_t buf[4096];
    struct run_arg a = {.e = e};
    a.s = mk(buf, sizeof buf, 1, ep, 0, KVP_XFER_READ);
    pthread_t th;
    pthread_create(&th, NULL, run_thread, &a);
    for (int i = 0; i < 5000 && atomic_load(&fs.requests) < 1; i++)
        usleep(1000);
    assert_int_equal(atomic_load(&fs.requests), 1);
    kvp_xfer_engine_destroy(&e);
    pthread_join(th, NULL);
    assert_int_equal(a.rc, KVP_ERR_CLOSED);
    assert_int_equal(a.s.status, KVP_ERR_CLOSED);
    fake_server_stop(&fs);
}

static void test_xfer_ipv6_and_hostname_ok(void **state)
{
    (void)state;
    uint8_t *region = calloc(1, 1 << 20);
    struct kvp_seg_server *srv = NULL;
    int rc = kvp_seg_server_start(&srv, "::1", 0, region, 1 << 20);
    if (rc != KVP_OK) {
        free(region);
        skip(); /* no IPv6 loopback on this machine */
    }
    kvp_seg_server_set_id(srv, 3);
    char ep6[64];
    snprintf(ep6, sizeof ep6, "[::1]:%u", kvp_seg_server_port(srv));
    struct kvp_xfer_engine *e;
    assert_int_equal(kvp_xfer_engine_new(&e, NULL), KVP_OK);
    uint8_t buf[8192], back[8192];
    pat_fill(buf, sizeof buf, 21);
    struct kvp_xfer_slice s = mk(buf, sizeof buf, 3, ep6, 100, KVP_XFER_WRITE);
    assert_int_equal(kvp_xfer_run(e, &s, 1, 5000), KVP_OK);
    s = mk(back, sizeof back, 3, ep6, 100, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(e, &s, 1, 5000), KVP_OK);
    assert_memory_equal(buf, back, sizeof buf);
    assert_int_equal(kvp_xfer_probe(ep6, 3, 1000), KVP_OK);
    kvp_seg_server_stop(&srv);

    /* "localhost": the server listens on every address it resolves to. */
    assert_int_equal(kvp_seg_server_start(&srv, "localhost", 0, region, 1 << 20), KVP_OK);
    kvp_seg_server_set_id(srv, 4);
    char epn[64];
    snprintf(epn, sizeof epn, "localhost:%u", kvp_seg_server_port(srv));
    memset(back, 0, sizeof back);
    s = mk(back, sizeof back, 4, epn, 100, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(e, &s, 1, 5000), KVP_OK);
    assert_memory_equal(buf, back, sizeof buf);
    assert_int_equal(kvp_xfer_probe(epn, 4, 1000), KVP_OK);
    assert_int_equal(kvp_xfer_probe(epn, 5, 1000), KVP_ERR_NOT_FOUND);
    kvp_seg_server_stop(&srv);
    kvp_xfer_engine_destroy(&e);
    free(region);
}

/* IPv6 link-local with a scope id (issue 4 item 2), by interface name and by index: a server on
 * the first link-local address of this machine, a write then a read through "[fe80::..%if]:port".
 * Skipped when no interface has a usable one (lo has none). */
static void test_xfer_link_local_scope_ok(void **state)
{
    (void)state;
    char addr[INET6_ADDRSTRLEN] = "", ifname[IF_NAMESIZE + 1] = "";
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i && !addr[0]; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET6 || !(i->ifa_flags & IFF_UP))
                continue;
            const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)i->ifa_addr;
            if (!IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr))
                continue;
            inet_ntop(AF_INET6, &a6->sin6_addr, addr, sizeof addr);
            snprintf(ifname, sizeof ifname, "%s", i->ifa_name);
        }
        freeifaddrs(ifs);
    }
    if (!addr[0])
        skip();
    char host[96];
    snprintf(host, sizeof host, "%s%%%s", addr, ifname);
    uint8_t *region = calloc(1, 1 << 20);
    struct kvp_seg_server *srv = NULL;
    if (kvp_seg_server_start(&srv, host, 0, region, 1 << 20) != KVP_OK) {
        free(region);
        skip(); /* e.g. the address is still tentative */
    }
    kvp_seg_server_set_id(srv, 7);
    struct kvp_xfer_engine *e;
    assert_int_equal(kvp_xfer_engine_new(&e, NULL), KVP_OK);
    char ep[160], ep_idx[160];
    snprintf(ep, sizeof ep, "[%s]:%u", host, kvp_seg_server_port(srv));
    snprintf(ep_idx, sizeof ep_idx, "[%s%%%u]:%u", addr, if_nametoindex(ifname), kvp_seg_server_port(srv));
    uint8_t buf[8192], back[8192];
    pat_fill(buf, sizeof buf, 33);
    struct kvp_xfer_slice s = mk(buf, sizeof buf, 7, ep, 4096, KVP_XFER_WRITE);
    assert_int_equal(kvp_xfer_run(e, &s, 1, 5000), KVP_OK);
    assert_int_equal(s.status, KVP_OK);
    memset(back, 0, sizeof back);
    s = mk(back, sizeof back, 7, ep_idx, 4096, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(e, &s, 1, 5000), KVP_OK);
    assert_int_equal(s.status, KVP_OK);
    assert_memory_equal(buf, back, sizeof buf);
    assert_int_equal(kvp_xfer_probe(ep, 7, 1000), KVP_OK);
    kvp_xfer_engine_destroy(&e);
    kvp_seg_server_stop(&srv);
    free(region);
}

static void test_xfer_local_transport_ok(void **state)
{
    struct fixture *f = *state;
    uint8_t *local_region = calloc(1, 1 << 20);
    assert_int_equal(kvp_xfer_register_local(f->eng, 77, local_region, 1 << 20), KVP_OK);
    uint8_t buf[10000], back[10000];
    pat_fill(buf, sizeof buf, 31);
    /* One batch mixing a local slice and a TCP slice. */
    struct kvp_xfer_slice s[2] = {mk(buf, sizeof buf, 77, "unused:1", 500, KVP_XFER_WRITE),
                                  mk(buf, sizeof buf, SEG_ID, f->endpoint, 500, KVP_XFER_WRITE)};
    assert_int_equal(kvp_xfer_run(f->eng, s, 2, 5000), KVP_OK);
    assert_int_equal(pat_check(local_region + 500, sizeof buf, 31), -1);
    assert_int_equal(pat_check(f->region + 500, sizeof buf, 31), -1);
    struct kvp_xfer_slice r = mk(back, sizeof back, 77, NULL, 500, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(f->eng, &r, 1, 5000), KVP_OK);
    assert_memory_equal(buf, back, sizeof buf);
    r = mk(back, sizeof back, 77, NULL, (1 << 20) - 10, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(f->eng, &r, 1, 5000), KVP_ERR_INVALID);
    assert_int_equal(kvp_xfer_unregister_local(f->eng, 77), KVP_OK);
    assert_int_equal(kvp_xfer_unregister_local(f->eng, 77), KVP_ERR_NOT_FOUND);
    /* Unregistered: the slice now needs a valid endpoint. */
    r = mk(back, 16, 77, NULL, 0, KVP_XFER_READ);
    assert_int_equal(kvp_xfer_run(f->eng, &r, 1, 5000), KVP_ERR_INVALID);
    free(local_region);
}

/* ---- several I/O threads (params.io_threads) */

static int setup_io2(void **state)
{
    if (setup(state) != 0)
        return -1;
    struct fixture *f = *state;
    kvp_xfer_engine_destroy(&f->eng);
    struct kvp_xfer_params p = {.conns_per_peer = 4, .slice_bytes = 1 << 20, .connect_timeout_ms = 1000,
                                .io_threads = 2};
    return kvp_xfer_engine_new(&f->eng, &p) == KVP_OK ? 0 : -1;
}

/* Concurrent batches spread over two I/O threads: every byte right, a local registration seen
 * by both, the counters summed over both. */
static void test_xfer_io_threads_batches_ok(void **state)
{
    struct fixture *f = *state;
    test_xfer_concurrent_batches_ok(state); /* 6 threads x 40 rounds x (WRITE batch, READ batch) */
    for (int i = 0; i < 4; i++)
        roundtrip(f, (3u << 20) + 4096u * (unsigned)i, (uint64_t)i << 24, 60u + (uint32_t)i);
    test_xfer_local_transport_ok(state);
    struct kvp_xfer_stats st;
    kvp_xfer_stats(f->eng, &st);
    /* 480 + 8 + the local test's 4 runs (its two INVALID ones got past the slice checks) */
    assert_int_equal(st.batches, 6 * 40 * 2 + 4 * 2 + 4);
    assert_int_equal(st.timeouts, 0);
    assert_int_equal(st.fenced, 0);
}

/* A listener that accepts every connection, reads and discards what comes, and never answers. */
struct stall_listener {
    int lfd;
    uint16_t port;
    pthread_t thread;
    atomic_int accepted;
    atomic_bool stop;
};

static void *stall_main(void *arg)
{
    struct stall_listener *l = arg;
    int fds[16];
    int n = 0;
    while (!atomic_load(&l->stop)) {
        struct pollfd pf[17];
        pf[0] = (struct pollfd){.fd = l->lfd, .events = POLLIN};
        for (int i = 0; i < n; i++)
            pf[i + 1] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        if (poll(pf, (nfds_t)n + 1, 20) <= 0)
            continue;
        if ((pf[0].revents & POLLIN) && n < 16) {
            int fd = accept(l->lfd, NULL, NULL);
            if (fd >= 0) {
                fds[n++] = fd;
                atomic_fetch_add(&l->accepted, 1);
            }
        }
        for (int i = 0; i < n; i++)
            if (pf[i + 1].revents & POLLIN) {
                uint8_t junk[4096];
                (void)!recv(fds[i], junk, sizeof junk, MSG_DONTWAIT);
            }
    }
    for (int i = 0; i < n; i++)
        close(fds[i]);
    return NULL;
}

/*
 * Two calls running at once go to two I/O threads (with one connection per endpoint per
 * thread, the stalled server sees two connections), and destroying the engine fences both:
 * each call returns KVP_ERR_CLOSED (contract C2 holds on every I/O thread).
 */
static void test_xfer_io_threads_spread_and_destroy_closed(void **state)
{
    (void)state;
    struct stall_listener l = {0};
    l.lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    assert_int_equal(bind(l.lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(l.lfd, 16), 0);
    assert_int_equal(getsockname(l.lfd, (struct sockaddr *)&a, &al), 0);
    l.port = ntohs(a.sin_port);
    pthread_create(&l.thread, NULL, stall_main, &l);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", l.port);

    struct kvp_xfer_params p = {.conns_per_peer = 1, .io_threads = 2};
    struct kvp_xfer_engine *e;
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    uint8_t buf[2][4096];
    struct run_arg ra[2] = {{.e = e}, {.e = e}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        ra[i].s = mk(buf[i], sizeof buf[i], 1, ep, 0, i == 0 ? KVP_XFER_READ : KVP_XFER_WRITE);
        pthread_create(&th[i], NULL, run_thread, &ra[i]);
        /* the first call holds its I/O thread (no answer comes) before the second one starts */
        for (int k = 0; k < 5000 && atomic_load(&l.accepted) < i + 1; k++)
            usleep(1000);
        assert_int_equal(atomic_load(&l.accepted), i + 1);
    }
    usleep(20000);
    assert_int_equal(atomic_load(&l.accepted), 2);
    kvp_xfer_engine_destroy(&e);
    assert_null(e);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(ra[i].rc, KVP_ERR_CLOSED);
        assert_int_equal(ra[i].s.status, KVP_ERR_CLOSED);
    }
    atomic_store(&l.stop, true);
    pthread_join(l.thread, NULL);
    close(l.lfd);
}

static void test_seg_server_malformed_header_closes_connection(void **state)
{
    struct fixture *f = *state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons((uint16_t)kvp_seg_server_port(f->srv))};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    uint8_t junk[KVP_FRAME_HEADER_BYTES];
    memset(junk, 0x42, sizeof junk);
    assert_int_equal(fake_write_full(fd, junk, sizeof junk), 0);
    uint8_t b;
    assert_int_equal(recv(fd, &b, 1, 0), 0); /* the server closed it */
    close(fd);
    /* A PING on a fresh connection, and the engine, still work. */
    assert_int_equal(kvp_xfer_probe(f->endpoint, SEG_ID, 1000), KVP_OK);
    assert_int_equal(kvp_xfer_probe(f->endpoint, SEG_ID + 1, 1000), KVP_ERR_NOT_FOUND);
    roundtrip(f, 4096, 0, 40);
}

/*
 * Fencing one call's WRITE mid-send closes its connection; another call's request queued behind
 * it on that connection never reached the wire and is not a failure of the peer: it goes out on
 * a fresh connection and ends with its own outcome (here its own timeout, the server reading
 * nothing), not KVP_ERR_TRANSFER (which a put reports to the master as "segment unreachable").
 */
static void test_xfer_fence_mid_send_spares_queued_batch(void **state)
{
    (void)state;
    struct fake_server fs;
    assert_int_equal(fake_server_start(&fs, FAKE_NO_READ), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", fs.port);
    struct kvp_xfer_engine *e;
    struct kvp_xfer_params p = {.conns_per_peer = 1, .slice_bytes = 64ull << 20, .io_threads = 1};
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    enum { LEN = 64 << 20 };
    uint8_t *big = malloc(LEN);
    pat_fill(big, LEN, 7);
    struct run_arg a = {.e = e, .timeout_ms = 1500};
    a.s = mk(big, LEN, 1, ep, 0, KVP_XFER_WRITE);
    pthread_t th;
    pthread_create(&th, NULL, run_thread, &a);
    struct kvp_xfer_stats st;
    for (int i = 0; i < 5000; i++) {
        kvp_xfer_stats(e, &st);
        if (st.batches >= 1)
            break;
        usleep(1000);
    }
    assert_int_equal(st.batches, 1);
    usleep(50000); /* the 64 MiB WRITE is mid-send (the server reads nothing) */
    uint8_t small[4096];
    pat_fill(small, sizeof small, 8);
    struct kvp_xfer_slice b = mk(small, sizeof small, 1, ep, 1ull << 30, KVP_XFER_WRITE);
    int rc = kvp_xfer_run(e, &b, 1, 6000); /* queued behind the big WRITE on the one connection */
    pthread_join(th, NULL);
    assert_int_equal(a.rc, KVP_ERR_TIMEOUT);
    assert_int_equal(b.status, KVP_ERR_TIMEOUT);
    assert_int_equal(rc, KVP_ERR_TIMEOUT);
    kvp_xfer_engine_destroy(&e);
    atomic_store(&fs.release, true);
    fake_server_stop(&fs);
    free(big);
}

/* The same with the other call's request sent before the fenced WRITE (awaiting its answer on
 * the connection the fence closes): it is sent again on a fresh connection, and ends with its own
 * timeout, not KVP_ERR_TRANSFER. */
static void test_xfer_fence_mid_send_spares_inflight_batch(void **state)
{
    (void)state;
    struct fake_server fs;
    assert_int_equal(fake_server_start(&fs, FAKE_NO_READ), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", fs.port);
    struct kvp_xfer_engine *e;
    struct kvp_xfer_params p = {.conns_per_peer = 1, .slice_bytes = 64ull << 20, .io_threads = 1};
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    uint8_t small[4096];
    pat_fill(small, sizeof small, 9);
    struct run_arg b = {.e = e, .timeout_ms = 6000};
    b.s = mk(small, sizeof small, 1, ep, 1ull << 30, KVP_XFER_WRITE);
    pthread_t th;
    pthread_create(&th, NULL, run_thread, &b);
    struct kvp_xfer_stats st;
    for (int i = 0; i < 5000; i++) {
        kvp_xfer_stats(e, &st);
        if (st.batches >= 1)
            break;
        usleep(1000);
    }
    assert_int_equal(st.batches, 1);
    usleep(50000); /* the 4 KiB WRITE is sent (into the server's socket buffer) */
    enum { LEN = 64 << 20 };
    uint8_t *big = malloc(LEN);
    pat_fill(big, LEN, 10);
    struct kvp_xfer_slice a = mk(big, LEN, 1, ep, 0, KVP_XFER_WRITE);
    assert_int_equal(kvp_xfer_run(e, &a, 1, 1500), KVP_ERR_TIMEOUT);
    pthread_join(th, NULL);
    assert_int_equal(b.s.status, KVP_ERR_TIMEOUT);
    assert_int_equal(b.rc, KVP_ERR_TIMEOUT);
    kvp_xfer_engine_destroy(&e);
    atomic_store(&fs.release, true);
    fake_server_stop(&fs);
    free(big);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_xfer_roundtrip_sizes_ok, setup, teardown),
        cmocka_unit_test_setup_teardown(test_xfer_mixed_batch_ok, setup, teardown),
        cmocka_unit_test_setup_teardown(test_xfer_concurrent_batches_ok, setup, teardown),
        cmocka_unit_test_setup_teardown(test_xfer_wrong_segment_id_not_found, setup, teardown),
        cmocka_unit_test_setup_teardown(test_xfer_read_errors_inside_pipelined_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_xfer_out_of_bounds_invalid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_xfer_server_stopped_transfer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_xfer_server_killed_mid_batch_transfer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_xfer_local_transport_ok, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seg_server_malformed_header_closes_connection, setup, teardown),
        cmocka_unit_test(test_xfer_peer_dies_mid_response_transfer),
        cmocka_unit_test(test_xfer_no_server_transfer),
        cmocka_unit_test(test_xfer_stalled_read_timeout_fenced),
        cmocka_unit_test(test_xfer_stalled_write_timeout_fenced),
        cmocka_unit_test(test_xfer_destroy_with_batch_in_flight_closed),
        cmocka_unit_test(test_xfer_ipv6_and_hostname_ok),
        cmocka_unit_test(test_xfer_link_local_scope_ok),
        cmocka_unit_test_setup_teardown(test_xfer_io_threads_batches_ok, setup_io2, teardown),
        cmocka_unit_test(test_xfer_io_threads_spread_and_destroy_closed),
        cmocka_unit_test(test_xfer_fence_mid_send_spares_queued_batch),
        cmocka_unit_test(test_xfer_fence_mid_send_spares_inflight_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
