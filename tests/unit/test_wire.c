/* test_wire.c — envelope and data-plane frame codecs: round trips and every truncation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvpool.h"
#include "wire/arena.h"
#include "wire/envelope.h"
#include "wire/rdma_hello.h"

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

static void hello_base(struct kvp_rdma_hello *h, struct kvp_rdma_hello_chunk *ch)
{
    memset(h, 0, sizeof *h);
    h->conn_generation = 3;
    h->segment_id = 5;
    h->client_id = 77;
    strcpy(h->nic, "mlx5_1");
    h->port = 1;
    h->gid_index = 3;
    h->gid[15] = 9;
    h->mtu = 5;
    h->max_rd_atomic = 16;
    h->n_qps = 2;
    h->qps[0] = (struct kvp_rdma_hello_qp){.qpn = 0x100, .psn = 0xffffff};
    h->qps[1] = (struct kvp_rdma_hello_qp){.qpn = 0xffffff, .psn = 0};
    ch[0] = (struct kvp_rdma_hello_chunk){.base = 4096, .len = 8192, .rkey = 1};
    ch[1] = (struct kvp_rdma_hello_chunk){.base = 12288, .len = 100, .rkey = 2};
    h->chunks = ch;
    h->n_chunks = 2;
}

/* The RDMA handshake (issue 20): round trip, then each out-of-range field refused by encode
 * (check) and, when smuggled past it by editing the protobuf, by decode. */
static void test_wire_rdma_hello_roundtrip_and_bounds(void **state)
{
    (void)state;
    struct kvp_rdma_hello h, d;
    struct kvp_rdma_hello_chunk ch[2];
    hello_base(&h, ch);
    uint8_t *b = NULL;
    size_t l = 0;
    char why[128];
    assert_int_equal(kvp_rdma_hello_encode(&h, &b, &l), KVP_OK);
    assert_int_equal(kvp_rdma_hello_decode(b, l, &d, why, sizeof why), KVP_OK);
    assert_int_equal(d.version, KVP_RDMA_HELLO_VERSION);
    assert_int_equal(d.conn_generation, 3);
    assert_string_equal(d.nic, "mlx5_1");
    assert_int_equal(d.qps[1].qpn, 0xffffff);
    assert_int_equal(d.qps[0].psn, 0xffffff);
    assert_int_equal(d.n_chunks, 2);
    assert_int_equal(d.chunks[1].rkey, 2);
    assert_memory_equal(d.gid, h.gid, 16);
    kvp_rdma_hello_free(&d);
    for (size_t cut = 0; cut < l; cut++)
        assert_int_equal(kvp_rdma_hello_decode(b, cut, &d, NULL, 0), KVP_ERR_MALFORMED);
    free(b);

    /* each bad field: encode refuses it (the same check decode runs) */
    for (int i = 0; i < 17; i++) {
        struct kvp_rdma_hello_chunk c2[2];
        hello_base(&h, c2);
        switch (i) {
        case 0: h.conn_generation = 0; break;
        case 1: h.qps[0].qpn = 0; break;
        case 2: h.qps[1].qpn = 1u << 24; break;
        case 3: h.qps[1].psn = 1u << 24; break;
        case 4: h.n_qps = 0; break;
        case 5: h.n_qps = 17; break;
        case 6: h.mtu = 0; break;
        case 7: h.mtu = 6; break;
        case 8: h.max_rd_atomic = 17; break;
        case 9: h.port = 0; break;
        case 10: h.gid_index = 256; break;
        case 11: h.gid_index = -2; break;
        case 12: c2[1].base += 1; break;                      /* gap */
        case 13: c2[1].len = 0; break;                        /* empty chunk */
        case 14: c2[0].base = UINT64_MAX - 10 - 8192;         /* wraps */
                 c2[1].base = UINT64_MAX - 10; break;
        case 15: h.nic[2] = ' '; break;
        case 16: h.status = 1; break;
        }
        assert_int_equal(kvp_rdma_hello_check(&h, why, sizeof why), KVP_ERR_MALFORMED);
        assert_int_equal(kvp_rdma_hello_encode(&h, &b, &l), KVP_ERR_INVALID);
    }
    /* decode-side checks that encode cannot produce: gid length, field widths, version */
    Kvp__RdmaHello m = KVP__RDMA_HELLO__INIT;
    Kvp__RdmaQp q = KVP__RDMA_QP__INIT, *qp = &q;
    uint8_t gid[15] = {0};
    q.qpn = 5;
    m.version = 1;
    m.conn_generation = 1;
    m.port = 1;
    m.mtu = 3;
    m.max_rd_atomic = 1;
    m.gid.data = gid;
    m.gid.len = 15;
    m.n_qps = 1;
    m.qps = &qp;
    assert_int_equal(kvp_wire_encode(KVP_MSG_RDMA_HELLO, &m.base, &b, &l), KVP_OK);
    assert_int_equal(kvp_rdma_hello_decode(b, l, &d, why, sizeof why), KVP_ERR_MALFORMED);
    assert_non_null(strstr(why, "gid"));
    free(b);
    uint8_t gid16[16] = {0};
    m.gid.data = gid16;
    m.gid.len = 16;
    m.port = 256;
    assert_int_equal(kvp_wire_encode(KVP_MSG_RDMA_HELLO, &m.base, &b, &l), KVP_OK);
    assert_int_equal(kvp_rdma_hello_decode(b, l, &d, why, sizeof why), KVP_ERR_MALFORMED);
    free(b);
    m.port = 1;
    assert_int_equal(kvp_wire_encode(KVP_MSG_RDMA_HELLO, &m.base, &b, &l), KVP_OK);
    assert_int_equal(kvp_rdma_hello_decode(b, l, &d, why, sizeof why), KVP_OK);
    kvp_rdma_hello_free(&d);
    free(b);
    m.version = 2;
    assert_int_equal(kvp_wire_encode(KVP_MSG_RDMA_HELLO, &m.base, &b, &l), KVP_OK);
    assert_int_equal(kvp_rdma_hello_decode(b, l, &d, why, sizeof why), KVP_ERR_VERSION);
    free(b);
    /* a hello is not a Request: the envelope id is checked */
    m.version = 1;
    assert_int_equal(kvp_wire_encode(KVP_MSG_RDMA_HELLO, &m.base, &b, &l), KVP_OK);
    Kvp__Request *r = NULL;
    assert_int_equal(kvp_wire_decode_request(b, l, &r), KVP_ERR_MALFORMED);
    free(b);
}

/* A PutStart of n items with keys of varying lengths: *enc (malloc'd) is its encoding. */
static void encode_put_start(size_t n, uint8_t **enc, size_t *enc_len)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__PutStartReq ps = KVP__PUT_START_REQ__INIT;
    Kvp__PutStartItem *items = calloc(n, sizeof *items);
    Kvp__PutStartItem **ip = calloc(n, sizeof *ip);
    char **keys = calloc(n, sizeof *keys);
    assert_non_null(items);
    assert_non_null(ip);
    assert_non_null(keys);
    for (size_t i = 0; i < n; i++) {
        kvp__put_start_item__init(&items[i]);
        keys[i] = malloc(200);
        assert_non_null(keys[i]);
        snprintf(keys[i], 200, "key-%zu-%.*s", i, (int)(i * 7 % 150), "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabc");
        items[i].key = keys[i];
        items[i].size = 4096 + i;
        items[i].replica_num = 1 + (uint32_t)(i % 3);
        items[i].op_id = 1000 + i;
        ip[i] = &items[i];
    }
    ps.n_items = n;
    ps.items = ip;
    req.req_id = 5;
    req.body_case = KVP__REQUEST__BODY_PUT_START;
    req.put_start = &ps;
    assert_int_equal(kvp_wire_encode_request(&req, enc, enc_len), KVP_OK);
    for (size_t i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
    free(ip);
    free(items);
}

/* A request decoded into an arena is the request decoded with malloc, byte for byte once
 * encoded again, whatever the block size (messages larger than the block spill to malloc),
 * message after message on one arena; every allocation is aligned. */
static void test_wire_arena_decode_equals_malloc(void **state)
{
    (void)state;
    const size_t caps[] = {0, 256, 4096, 64u << 10};
    const size_t sizes[] = {1, 3, 40, 700};
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
        struct kvp_wire_arena a;
        assert_int_equal(kvp_wire_arena_init(&a, caps[c]), KVP_OK);
        for (int round = 0; round < 3; round++)
            for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
                uint8_t *enc = NULL;
                size_t enc_len = 0;
                encode_put_start(sizes[k], &enc, &enc_len);
                Kvp__Request *r = NULL;
                assert_int_equal(kvp_wire_decode_with(KVP_MSG_REQUEST, enc, enc_len, &a.pb, (ProtobufCMessage **)&r),
                                 KVP_OK);
                assert_int_equal(r->put_start->n_items, sizes[k]);
                for (size_t i = 0; i < r->put_start->n_items; i++) {
                    assert_int_equal((uintptr_t)r->put_start->items[i] % alignof(max_align_t), 0);
                    assert_int_equal(r->put_start->items[i]->op_id, 1000 + i);
                }
                uint8_t *again = NULL;
                size_t again_len = 0;
                assert_int_equal(kvp_wire_encode_request(r, &again, &again_len), KVP_OK);
                assert_int_equal(again_len, enc_len);
                assert_memory_equal(again, enc, enc_len);
                free(again);
                /* free_unpacked through the arena frees nothing and is harmless */
                protobuf_c_message_free_unpacked(&r->base, &a.pb);
                kvp_wire_arena_reset(&a);
                assert_int_equal(a.used, 0);
                assert_null(a.big);
                free(enc);
            }
        if (caps[c] == 0 || caps[c] == 256)
            assert_true(a.big_allocs > 0); /* the spill path ran */
        kvp_wire_arena_fini(&a);
        kvp_wire_arena_fini(&a); /* twice: a no-op */
    }
    assert_int_equal(kvp_wire_arena_init(NULL, 16), KVP_ERR_INVALID);
}

/* Every truncation and every flipped byte of a request decoded into an arena: a clean error or
 * a message, never a leak (ASan) or a read past the input; the arena stays usable. */
static void test_wire_arena_bad_input(void **state)
{
    (void)state;
    uint8_t *enc = NULL;
    size_t enc_len = 0;
    encode_put_start(5, &enc, &enc_len);
    struct kvp_wire_arena a;
    assert_int_equal(kvp_wire_arena_init(&a, 128), KVP_OK);
    for (size_t cut = 0; cut < enc_len; cut++) {
        uint8_t *b = malloc(cut ? cut : 1);
        memcpy(b, enc, cut);
        ProtobufCMessage *m = NULL;
        assert_int_equal(kvp_wire_decode_with(KVP_MSG_REQUEST, b, cut, &a.pb, &m), KVP_ERR_MALFORMED);
        assert_null(m);
        kvp_wire_arena_reset(&a);
        free(b);
    }
    for (size_t k = KVP_WIRE_HEADER_BYTES; k < enc_len; k++) {
        uint8_t *b = malloc(enc_len);
        memcpy(b, enc, enc_len);
        b[k] ^= 0xff;
        ProtobufCMessage *m = NULL;
        int rc = kvp_wire_decode_with(KVP_MSG_REQUEST, b, enc_len, &a.pb, &m);
        assert_true(rc == KVP_OK || rc == KVP_ERR_MALFORMED);
        assert_true((rc == KVP_OK) == (m != NULL));
        kvp_wire_arena_reset(&a);
        free(b);
    }
    ProtobufCMessage *m = NULL;
    assert_int_equal(kvp_wire_decode_with(KVP_MSG_REQUEST, enc, enc_len, &a.pb, &m), KVP_OK);
    kvp_wire_arena_fini(&a);
    free(enc);
}

/* kvp_wire_encoded_size + kvp_wire_encode_into write what kvp_wire_encode writes, exactly len
 * bytes; a wrong length is refused without a byte written past it. */
static void test_wire_encode_into_equals_encode(void **state)
{
    (void)state;
    Kvp__Response resp = KVP__RESPONSE__INIT;
    Kvp__ExistsResp ex = KVP__EXISTS_RESP__INIT;
    int32_t found[3] = {0, -5, 0};
    ex.n_results = 3;
    ex.results = found;
    resp.req_id = 11;
    resp.status = 0;
    resp.body_case = KVP__RESPONSE__BODY_EXISTS;
    resp.exists = &ex;
    uint8_t *enc = NULL;
    size_t enc_len = 0;
    assert_int_equal(kvp_wire_encode_response(&resp, &enc, &enc_len), KVP_OK);
    size_t len = 0;
    assert_int_equal(kvp_wire_encoded_size(KVP_MSG_RESPONSE, &resp.base, &len), KVP_OK);
    assert_int_equal(len, enc_len);
    uint8_t *buf = malloc(len + 16);
    memset(buf, 0xa5, len + 16);
    assert_int_equal(kvp_wire_encode_into(KVP_MSG_RESPONSE, &resp.base, buf, len), KVP_OK);
    assert_memory_equal(buf, enc, len);
    for (size_t i = len; i < len + 16; i++)
        assert_int_equal(buf[i], 0xa5);
    /* one byte short, one byte long: refused, nothing past the stated length written */
    memset(buf, 0xa5, len + 16);
    assert_int_equal(kvp_wire_encode_into(KVP_MSG_RESPONSE, &resp.base, buf, len - 1), KVP_ERR_INTERNAL);
    for (size_t i = len - 1; i < len + 16; i++)
        assert_int_equal(buf[i], 0xa5);
    assert_int_equal(kvp_wire_encode_into(KVP_MSG_RESPONSE, &resp.base, buf, len + 1), KVP_ERR_INTERNAL);
    /* wrong type, too short for the envelope, NULLs */
    assert_int_equal(kvp_wire_encode_into(KVP_MSG_REQUEST, &resp.base, buf, len), KVP_ERR_INVALID);
    assert_int_equal(kvp_wire_encode_into(KVP_MSG_RESPONSE, &resp.base, buf, 3), KVP_ERR_INVALID);
    assert_int_equal(kvp_wire_encode_into(KVP_MSG_RESPONSE, &resp.base, NULL, len), KVP_ERR_INVALID);
    assert_int_equal(kvp_wire_encoded_size(KVP_MSG_REQUEST, &resp.base, &len), KVP_ERR_INVALID);
    free(buf);
    free(enc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_request_roundtrip_equal),
        cmocka_unit_test(test_wire_truncated_prefix_malformed),
        cmocka_unit_test(test_wire_bad_header_rejected),
        cmocka_unit_test(test_wire_frame_roundtrip_and_rejects),
        cmocka_unit_test(test_err_strerror_every_code_named),
        cmocka_unit_test(test_wire_rdma_hello_roundtrip_and_bounds),
        cmocka_unit_test(test_wire_arena_decode_equals_malloc),
        cmocka_unit_test(test_wire_arena_bad_input),
        cmocka_unit_test(test_wire_encode_into_equals_encode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
