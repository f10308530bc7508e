/* test_wire.c — envelope and data-plane frame codecs: round trips and every truncation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvpool.h"
#include "wire/envelope.h"

static void make_request(Kvp__Request *req, Kvp__PutStartReq *ps, Kvp__PutStartItem *item,
                         Kvp__PutStartItem **items)
{
    kvp__request__init(req);
    kvp__put_start_req__init(ps);
    kvp__put_start_item__init(item);
    item->key = "block-42";
    item->size = 4096;
    item->replica_num = 2;
    item->op_id = 77;
    items[0] = item;
    ps->n_items = 1;
    ps->items = items;
    req->req_id = 9;
    req->timeout_ms = 500;
    req->body_case = KVP__REQUEST__BODY_PUT_START;
    req->put_start = ps;
}

static void test_wire_request_roundtrip_equal(void **state)
{
    (void)state;
    Kvp__Request req;
    Kvp__PutStartReq ps;
    Kvp__PutStartItem item, *items[1];
    make_request(&req, &ps, &item, items);
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(kvp_wire_encode_request(&req, &buf, &len), KVP_OK);
    Kvp__Request *out = NULL;
    assert_int_equal(kvp_wire_decode_request(buf, len, &out), KVP_OK);
    assert_int_equal(out->req_id, 9);
    assert_int_equal(out->body_case, KVP__REQUEST__BODY_PUT_START);
    assert_int_equal(out->put_start->n_items, 1);
    assert_string_equal(out->put_start->items[0]->key, "block-42");
    assert_int_equal(out->put_start->items[0]->size, 4096);
    protobuf_c_message_free_unpacked(&out->base, NULL);
    free(buf);
}

static void test_wire_truncated_prefix_malformed(void **state)
{
    (void)state;
    Kvp__Request req;
    Kvp__PutStartReq ps;
    Kvp__PutStartItem item, *items[1];
    make_request(&req, &ps, &item, items);
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(kvp_wire_encode_request(&req, &buf, &len), KVP_OK);
    for (size_t i = 0; i < len; i++) {
        Kvp__Request *out = NULL;
        assert_int_equal(kvp_wire_decode_request(buf, i, &out), KVP_ERR_MALFORMED);
        assert_null(out);
    }
    free(buf);
}

static void test_wire_bad_header_rejected(void **state)
{
    (void)state;
    Kvp__Request req;
    Kvp__PutStartReq ps;
    Kvp__PutStartItem item, *items[1];
    make_request(&req, &ps, &item, items);
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(kvp_wire_encode_request(&req, &buf, &len), KVP_OK);
    Kvp__Request *out = NULL;
    buf[0] ^= 1; /* magic */
    assert_int_equal(kvp_wire_decode_request(buf, len, &out), KVP_ERR_MALFORMED);
    buf[0] ^= 1;
    buf[4] = 9; /* version */
    assert_int_equal(kvp_wire_decode_request(buf, len, &out), KVP_ERR_VERSION);
    buf[4] = KVP_WIRE_VERSION;
    /* right envelope, wrong expected message id */
    Kvp__Response *r = NULL;
    assert_int_equal(kvp_wire_decode_response(buf, len, &r), KVP_ERR_MALFORMED);
    /* oversized length field */
    buf[11] = 0xff;
    assert_int_equal(kvp_wire_decode_request(buf, len, &out), KVP_ERR_MALFORMED);
    free(buf);
    /* trailing byte after a valid message */
    assert_int_equal(kvp_wire_encode_request(&req, &buf, &len), KVP_OK);
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, buf, len);
    longer[len] = 0;
    assert_int_equal(kvp_wire_decode_request(longer, len + 1, &out), KVP_ERR_MALFORMED);
    free(longer);
    free(buf);
}

static void test_wire_frame_roundtrip_and_rejects(void **state)
{
    (void)state;
    struct kvp_frame f = {.op = KVP_FRAME_WRITE, .status = KVP_ERR_NO_SPACE, .segment_id = 7,
                          .req_id = 1234567890123ull, .offset = 1ull << 33, .length = 4096};
    uint8_t h[KVP_FRAME_HEADER_BYTES];
    kvp_frame_encode(&f, h);
    struct kvp_frame g;
    assert_int_equal(kvp_frame_decode(h, &g), KVP_OK);
    assert_int_equal(g.op, f.op);
    assert_int_equal(g.status, f.status);
    assert_int_equal(g.segment_id, 7);
    assert_int_equal(g.req_id, f.req_id);
    assert_int_equal(g.offset, f.offset);
    assert_int_equal(g.length, 4096);
    h[5] = 99;
    assert_int_equal(kvp_frame_decode(h, &g), KVP_ERR_MALFORMED);
    kvp_frame_encode(&f, h);
    h[39] = 0xff; /* length beyond the cap */
    assert_int_equal(kvp_frame_decode(h, &g), KVP_ERR_MALFORMED);
    kvp_frame_encode(&f, h);
    h[12] = 1; /* a deadline on a WRITE: carried */
    assert_int_equal(kvp_frame_decode(h, &g), KVP_OK);
    assert_int_equal(g.deadline, 1);
    f.op = KVP_FRAME_READ;
    kvp_frame_encode(&f, h);
    h[12] = 1; /* a deadline on anything but a WRITE is malformed */
    assert_int_equal(kvp_frame_decode(h, &g), KVP_ERR_MALFORMED);
    /* the deadline word: never 0, serial arithmetic across the 2^32 wrap */
    f.op = KVP_FRAME_WRITE;
    f.deadline = kvp_frame_deadline_make(1ull << 32);
    assert_int_equal(f.deadline, 1);
    kvp_frame_encode(&f, h);
    assert_int_equal(kvp_frame_decode(h, &g), KVP_OK);
    assert_int_equal(g.deadline, 1);
    uint64_t now = (1ull << 40) + 0xfffffff0ull; /* just before a wrap */
    uint32_t d = kvp_frame_deadline_make(now + 100); /* wraps to a small number */
    assert_false(kvp_frame_deadline_passed(d, now));
    assert_false(kvp_frame_deadline_passed(d, now + 100));
    assert_true(kvp_frame_deadline_passed(d, now + 101));
    assert_true(kvp_frame_deadline_passed(kvp_frame_deadline_make(now - 5000), now));
    assert_false(kvp_frame_deadline_passed(0, now)); /* no deadline */
}

static void test_err_strerror_every_code_named(void **state)
{
    (void)state;
    for (int e = 0; e > KVP_ERR__LAST; e--) {
        assert_non_null(kvp_strerror(e));
        assert_string_not_equal(kvp_strerror(e), "unknown error");
        assert_memory_equal(kvp_errname(e), "KVP_", 4);
    }
    assert_string_equal(kvp_strerror(KVP_ERR__LAST), "unknown error");
    assert_string_equal(kvp_strerror(5), "unknown error");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_request_roundtrip_equal),
        cmocka_unit_test(test_wire_truncated_prefix_malformed),
        cmocka_unit_test(test_wire_bad_header_rejected),
        cmocka_unit_test(test_wire_frame_roundtrip_and_rejects),
        cmocka_unit_test(test_err_strerror_every_code_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
