/*
 * test_seg_pipeline.c — how the segment server answers pipelined requests on one connection
 * (actors/segment/seg_server.c: responses are queued and leave together; the connection never
 * waits for bytes while answers are queued; a queued READ answer is sent before a later WRITE
 * payload can overwrite what it reads). A raw TCP client:
 *  - 64 WRITEs of 4 KiB and a READ in one send: all answered OK, in order, every byte landed;
 *  - WRITE A, READ, WRITE B, READ of one range in one send: the first READ answers A, the
 *    second B (the first READ's answer leaves before B lands);
 *  - a stop-and-wait client: a WRITE answered only after the next WRITE's payload is complete
 *    would never be answered, because this client sends the rest of that payload only after
 *    it has the answer (with and without a write deadline).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "actors/segment/seg_server.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "tests/actor/seg_raw_client.h"
#include "wire/envelope.h"

#define REGION (4u << 20)
#define SEG_ID 11
#define PAT(seed, i) ((uint8_t)((i) * 31u + (seed) * 7u + 1u))

static struct {
    struct kvp_seg_server *srv;
    uint8_t *region;
    int fd;
} T;

static int setup(void **state)
{
    (void)state;
    T.region = calloc(1, REGION);
    return seg_raw_server_start(T.region, REGION, SEG_ID, &T.srv, &T.fd);
}

static int teardown(void **state)
{
    (void)state;
    seg_raw_server_stop(&T.srv, T.fd);
    free(T.region);
    return 0;
}

/* Append a request header (and a WRITE's payload) to buf at *at. */
static void put_req(uint8_t *buf, size_t *at, uint8_t op, uint64_t req, uint64_t off, uint64_t len,
                    uint32_t deadline, const uint8_t *payload)
{
    seg_raw_header(buf + *at, op, SEG_ID, req, off, len, deadline);
    *at += KVP_FRAME_HEADER_BYTES;
    if (op == KVP_FRAME_WRITE) {
        memcpy(buf + *at, payload, len);
        *at += len;
    }
}

static void expect(uint8_t op, uint64_t req, int status)
{
    struct kvp_frame f = seg_raw_response(T.fd);
    assert_int_equal(f.op, op);
    assert_int_equal(f.req_id, req);
    assert_int_equal(f.status, status);
}

static uint32_t deadline_in(uint64_t ms) { return kvp_frame_deadline_make(kvp_clock_wall_ms() + ms); }

static void test_seg_pipeline_small_writes_all_answered_in_order(void **state)
{
    (void)state;
    enum { N = 64, LEN = 4096, BASE = 8192 };
    uint8_t *pay = malloc((size_t)N * LEN);
    uint8_t *msg = malloc((size_t)N * (KVP_FRAME_HEADER_BYTES + LEN) + KVP_FRAME_HEADER_BYTES);
    assert_non_null(pay);
    assert_non_null(msg);
    size_t at = 0;
    uint32_t dl = deadline_in(20000);
    for (size_t k = 0; k < N; k++) {
        for (size_t i = 0; i < LEN; i++)
            pay[k * LEN + i] = PAT(k, i);
        put_req(msg, &at, KVP_FRAME_WRITE, 100 + k, BASE + k * LEN, LEN, k % 2 ? dl : 0, pay + k * LEN);
    }
    put_req(msg, &at, KVP_FRAME_READ, 999, BASE + (N - 1) * LEN, LEN, 0, NULL);
    seg_raw_send_all(T.fd, msg, at);
    for (size_t k = 0; k < N; k++)
        expect(KVP_FRAME_WRITE_RESP, 100 + k, KVP_OK);
    expect(KVP_FRAME_READ_RESP, 999, KVP_OK);
    uint8_t back[LEN];
    seg_raw_recv_all(T.fd, back, sizeof back);
    assert_memory_equal(back, pay + (N - 1) * LEN, LEN);
    assert_memory_equal(T.region + BASE, pay, (size_t)N * LEN);
    assert_int_equal(T.region[BASE - 1], 0);
    assert_int_equal(T.region[BASE + N * LEN], 0);
    free(msg);
    free(pay);
}

static void test_seg_pipeline_read_answer_leaves_before_later_write(void **state)
{
    (void)state;
    enum { OFF = 1u << 20, LEN = 2048 };
    uint8_t a[LEN], b[LEN];
    for (size_t i = 0; i < LEN; i++) {
        a[i] = PAT(1, i);
        b[i] = PAT(2, i);
    }
    uint8_t msg[4 * KVP_FRAME_HEADER_BYTES + 2 * LEN];
    size_t at = 0;
    uint32_t dl = deadline_in(20000);
    put_req(msg, &at, KVP_FRAME_WRITE, 1, OFF, LEN, dl, a);
    put_req(msg, &at, KVP_FRAME_READ, 2, OFF, LEN, 0, NULL);
    put_req(msg, &at, KVP_FRAME_WRITE, 3, OFF, LEN, dl, b);
    put_req(msg, &at, KVP_FRAME_READ, 4, OFF, LEN, 0, NULL);
    seg_raw_send_all(T.fd, msg, at);
    uint8_t back[LEN];
    expect(KVP_FRAME_WRITE_RESP, 1, KVP_OK);
    expect(KVP_FRAME_READ_RESP, 2, KVP_OK);
    seg_raw_recv_all(T.fd, back, LEN);
    assert_memory_equal(back, a, LEN);
    expect(KVP_FRAME_WRITE_RESP, 3, KVP_OK);
    expect(KVP_FRAME_READ_RESP, 4, KVP_OK);
    seg_raw_recv_all(T.fd, back, LEN);
    assert_memory_equal(back, b, LEN);
}

/* WRITE 1 whole, then WRITE 2's header and half its payload; the rest of it only after WRITE 1
 * is answered. With queued answers held until WRITE 2's payload were complete, this would wait
 * forever (until the ctest timeout). */
static void stop_and_wait(uint64_t req, uint64_t off, uint32_t deadline)
{
    enum { LEN = 4096 };
    uint8_t p1[LEN], p2[LEN];
    for (size_t i = 0; i < LEN; i++) {
        p1[i] = PAT(req, i);
        p2[i] = PAT(req + 1, i);
    }
    uint8_t msg[2 * KVP_FRAME_HEADER_BYTES + 2 * LEN];
    size_t at = 0;
    put_req(msg, &at, KVP_FRAME_WRITE, req, off, LEN, deadline, p1);
    put_req(msg, &at, KVP_FRAME_WRITE, req + 1, off + LEN, LEN, deadline, p2);
    seg_raw_send_all(T.fd, msg, at - LEN / 2);
    expect(KVP_FRAME_WRITE_RESP, req, KVP_OK);
    seg_raw_send_all(T.fd, msg + at - LEN / 2, LEN / 2);
    expect(KVP_FRAME_WRITE_RESP, req + 1, KVP_OK);
    assert_memory_equal(T.region + off, p1, LEN);
    assert_memory_equal(T.region + off + LEN, p2, LEN);
}

static void test_seg_pipeline_stop_and_wait_client_is_answered(void **state)
{
    (void)state;
    stop_and_wait(10, 2u << 20, deadline_in(20000)); /* the blocking receive under SO_RCVTIMEO */
    stop_and_wait(20, 3u << 20, 0);                  /* no deadline */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seg_pipeline_small_writes_all_answered_in_order),
        cmocka_unit_test(test_seg_pipeline_read_answer_leaves_before_later_write),
        cmocka_unit_test(test_seg_pipeline_stop_and_wait_client_is_answered),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
