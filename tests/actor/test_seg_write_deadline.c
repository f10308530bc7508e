/*
 * test_seg_write_deadline.c — the segment server's WRITE receive against a raw TCP client that
 * paces its bytes (actors/segment/seg_server.c take_payload, contract C3):
 *  - a WRITE with a long deadline (formerly the blocking MSG_WAITALL path; now taken as it arrives) whose payload
 *    comes in three parts with pauses, after a header that arrived together with the first part
 *    and a second pipelined request: every byte lands, both answered in order;
 *  - a WRITE with a 1.5 s deadline whose payload stops after 1 KiB and resumes after the
 *    deadline: answered TIMEOUT, and no byte past what arrived before the deadline reaches the
 *    region (the rest is drained; the connection keeps working: a READ after it is answered).
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

#define REGION (1u << 20)
#define SEG_ID 9
#define OLD(i) ((uint8_t)((i) * 7u + 3u))
#define NEW(i) ((uint8_t)((i) * 13u + 5u))

static struct {
    struct kvp_seg_server *srv;
    uint8_t *region;
    int fd;
} T;

static int setup(void **state)
{
    (void)state;
    T.region = malloc(REGION);
    if (!T.region)
        return -1;
    for (size_t i = 0; i < REGION; i++)
        T.region[i] = OLD(i);
    return seg_raw_server_start(T.region, REGION, SEG_ID, &T.srv, &T.fd);
}

static int teardown(void **state)
{
    (void)state;
    seg_raw_server_stop(&T.srv, T.fd);
    free(T.region);
    return 0;
}

static void test_seg_write_deadline_paced_payload_lands(void **state)
{
    (void)state;
    enum { OFF = 4096, LEN = 300000, PART = 1000 };
    uint8_t *pay = malloc(LEN);
    assert_non_null(pay);
    for (size_t i = 0; i < LEN; i++)
        pay[i] = NEW(i);
    uint32_t dl = kvp_frame_deadline_make(kvp_clock_wall_ms() + 20000);
    uint8_t msg[KVP_FRAME_HEADER_BYTES + PART];
    seg_raw_header(msg, KVP_FRAME_WRITE, SEG_ID, 1, OFF, LEN, dl);
    memcpy(msg + KVP_FRAME_HEADER_BYTES, pay, PART); /* header and the first bytes together */
    seg_raw_send_all(T.fd, msg, sizeof msg);
    usleep(100 * 1000);
    seg_raw_send_all(T.fd, pay + PART, LEN / 2 - PART);
    usleep(100 * 1000);
    /* the rest of the payload and a pipelined READ of what it wrote, in one send */
    size_t rest = LEN - LEN / 2;
    uint8_t *tail = malloc(rest + KVP_FRAME_HEADER_BYTES);
    assert_non_null(tail);
    memcpy(tail, pay + LEN / 2, rest);
    seg_raw_header(tail + rest, KVP_FRAME_READ, SEG_ID, 2, OFF, 64, 0);
    seg_raw_send_all(T.fd, tail, rest + KVP_FRAME_HEADER_BYTES);
    struct kvp_frame w = seg_raw_response(T.fd);
    assert_int_equal(w.op, KVP_FRAME_WRITE_RESP);
    assert_int_equal(w.req_id, 1);
    assert_int_equal(w.status, KVP_OK);
    struct kvp_frame r = seg_raw_response(T.fd);
    assert_int_equal(r.op, KVP_FRAME_READ_RESP);
    assert_int_equal(r.req_id, 2);
    assert_int_equal(r.status, KVP_OK);
    uint8_t back[64];
    seg_raw_recv_all(T.fd, back, sizeof back);
    assert_memory_equal(back, pay, sizeof back);
    assert_memory_equal(T.region + OFF, pay, LEN);
    assert_int_equal(T.region[OFF - 1], OLD(OFF - 1));
    assert_int_equal(T.region[OFF + LEN], OLD(OFF + LEN));
    free(tail);
    free(pay);
}

static void test_seg_write_deadline_stalled_payload_lands_nothing_late(void **state)
{
    (void)state;
    enum { OFF = 600000, LEN = 65536, EARLY = 1024 };
    uint8_t *pay = malloc(LEN);
    assert_non_null(pay);
    for (size_t i = 0; i < LEN; i++)
        pay[i] = NEW(i);
    uint64_t t0 = kvp_clock_wall_ms();
    uint32_t dl = kvp_frame_deadline_make(t0 + 1500); /* > 500 ms: starts on the blocking path */
    uint8_t h[KVP_FRAME_HEADER_BYTES];
    seg_raw_header(h, KVP_FRAME_WRITE, SEG_ID, 3, OFF, LEN, dl);
    seg_raw_send_all(T.fd, h, sizeof h);
    seg_raw_send_all(T.fd, pay, EARLY);
    while (kvp_clock_wall_ms() < t0 + 1700) /* past the deadline */
        usleep(20 * 1000);
    seg_raw_send_all(T.fd, pay + EARLY, LEN - EARLY);
    struct kvp_frame w = seg_raw_response(T.fd);
    assert_int_equal(w.op, KVP_FRAME_WRITE_RESP);
    assert_int_equal(w.req_id, 3);
    assert_int_equal(w.status, KVP_ERR_TIMEOUT);
    /* what arrived before the deadline may have landed; nothing sent after it did */
    for (size_t i = 0; i < LEN; i++) {
        if (i < EARLY)
            assert_true(T.region[OFF + i] == pay[i] || T.region[OFF + i] == OLD(OFF + i));
        else
            assert_int_equal(T.region[OFF + i], OLD(OFF + i));
    }
    /* the connection still serves requests: the late payload was drained, not parsed */
    seg_raw_header(h, KVP_FRAME_READ, SEG_ID, 4, OFF + EARLY, 16, 0);
    seg_raw_send_all(T.fd, h, sizeof h);
    struct kvp_frame r = seg_raw_response(T.fd);
    assert_int_equal(r.req_id, 4);
    assert_int_equal(r.status, KVP_OK);
    uint8_t back[16];
    seg_raw_recv_all(T.fd, back, sizeof back);
    for (size_t i = 0; i < sizeof back; i++)
        assert_int_equal(back[i], OLD(OFF + EARLY + i));
    free(pay);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seg_write_deadline_paced_payload_lands),
        cmocka_unit_test(test_seg_write_deadline_stalled_payload_lands_nothing_late),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
