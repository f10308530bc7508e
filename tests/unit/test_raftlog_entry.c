/* test_raftlog_entry.c — Raft entry framing and snapshot framing: round trips, every truncated
 * prefix, lying lengths, bad magic/version, oversized snapshot claims. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvpool.h"
#include "raftlog/entry.h"
#include "raftlog/raftlog.h"
#include "raftlog/raftlog_internal.h"

static uint8_t *encode3(size_t *len)
{
    static const uint8_t a[] = {1, 2, 3}, c[] = "hello world";
    struct kvp_rl_cmd cmds[3] = {{a, sizeof(a)}, {NULL, 0}, {c, sizeof(c)}};
    size_t sz = kvp_rl_entry_size(cmds, 3);
    assert_int_equal(sz, 40); /* 9 + 12 + 3 + 0 + 12 = 36, padded to 40 */
    assert_int_equal(sz % 8, 0);
    uint8_t *buf = malloc(sz);
    assert_non_null(buf);
    size_t w = 0;
    assert_int_equal(kvp_rl_entry_encode(buf, sz, cmds, 3, &w), KVP_OK);
    assert_int_equal(w, sz);
    *len = sz;
    return buf;
}

static void test_raftlog_entry_roundtrip_equal(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = encode3(&len);
    assert_memory_equal(buf, "KVPR", 4);
    struct kvp_rl_entry_iter it;
    assert_int_equal(kvp_rl_entry_decode(buf, len, &it), KVP_OK);
    assert_int_equal(it.count, 3);
    struct kvp_rl_cmd c;
    assert_int_equal(kvp_rl_entry_next(&it, &c), 1);
    assert_int_equal(c.len, 3);
    assert_int_equal(c.data[2], 3);
    assert_int_equal(kvp_rl_entry_next(&it, &c), 1);
    assert_int_equal(c.len, 0);
    assert_int_equal(kvp_rl_entry_next(&it, &c), 1);
    assert_int_equal(c.len, 12);
    assert_string_equal((const char *)c.data, "hello world");
    assert_int_equal(kvp_rl_entry_next(&it, &c), 0);
    free(buf);
}

static void test_raftlog_entry_every_prefix_malformed(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = encode3(&len);
    for (size_t n = 0; n < len; n++) {
        uint8_t *copy = malloc(n > 0 ? n : 1); /* exact-size copy so ASan sees over-reads */
        memcpy(copy, buf, n);
        struct kvp_rl_entry_iter it;
        assert_int_equal(kvp_rl_entry_decode(n > 0 ? copy : NULL, n, &it), KVP_ERR_MALFORMED);
        free(copy);
    }
    free(buf);
}

static void test_raftlog_entry_trailing_bytes_malformed(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = encode3(&len);
    uint8_t *big = calloc(1, len + 1);
    memcpy(big, buf, len);
    struct kvp_rl_entry_iter it;
    assert_int_equal(kvp_rl_entry_decode(big, len + 1, &it), KVP_ERR_MALFORMED);
    free(big);
    /* padding must be zero, and never a whole extra 8 bytes */
    big = calloc(1, len + 8);
    memcpy(big, buf, len);
    assert_int_equal(kvp_rl_entry_decode(big, len, &it), KVP_OK);
    assert_int_equal(kvp_rl_entry_decode(big, len + 8, &it), KVP_ERR_MALFORMED);
    big[len - 1] = 1;
    assert_int_equal(kvp_rl_entry_decode(big, len, &it), KVP_ERR_MALFORMED);
    free(big);
    free(buf);
}

static void test_raftlog_entry_lying_lengths_malformed(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = encode3(&len);
    struct kvp_rl_entry_iter it;
    /* count far beyond what the bytes hold */
    uint8_t save = buf[8];
    buf[8] = 0xff;
    assert_int_equal(kvp_rl_entry_decode(buf, len, &it), KVP_ERR_MALFORMED);
    buf[8] = save;
    /* count 0 */
    buf[5] = 0;
    assert_int_equal(kvp_rl_entry_decode(buf, len, &it), KVP_ERR_MALFORMED);
    buf[5] = 3;
    /* first command length 0xffffffff */
    memset(buf + 9, 0xff, 4);
    assert_int_equal(kvp_rl_entry_decode(buf, len, &it), KVP_ERR_MALFORMED);
    /* first command length one too long (swallows the next prefix partly) */
    buf[9] = 4;
    buf[10] = buf[11] = buf[12] = 0;
    assert_int_equal(kvp_rl_entry_decode(buf, len, &it), KVP_ERR_MALFORMED);
    free(buf);
}

static void test_raftlog_entry_bad_magic_version_rejected(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = encode3(&len);
    struct kvp_rl_entry_iter it;
    buf[0] = 'X';
    assert_int_equal(kvp_rl_entry_decode(buf, len, &it), KVP_ERR_MALFORMED);
    buf[0] = 'K';
    buf[4] = 2;
    assert_int_equal(kvp_rl_entry_decode(buf, len, &it), KVP_ERR_VERSION);
    buf[4] = 1;
    assert_int_equal(kvp_rl_entry_decode(buf, len, &it), KVP_OK);
    free(buf);
}

static void test_raftlog_entry_encode_errors_reported(void **state)
{
    (void)state;
    uint8_t out[64];
    size_t w;
    static const uint8_t a[] = "abcdefgh";
    struct kvp_rl_cmd cmds[2] = {{a, 8}, {a, 8}};
    assert_int_equal(kvp_rl_entry_encode(out, sizeof(out), cmds, 0, &w), KVP_ERR_INVALID);
    assert_int_equal(kvp_rl_entry_encode(out, 20, cmds, 2, &w), KVP_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(kvp_rl_entry_encode(NULL, 20, cmds, 2, &w), KVP_ERR_INVALID);
    struct kvp_rl_cmd huge = {a, (size_t)KVP_RL_ENTRY_MAX_CMD_BYTES + 1};
    assert_int_equal(kvp_rl_entry_size(&huge, 1), 0);
    assert_int_equal(kvp_rl_entry_encode(out, sizeof(out), &huge, 1, &w), KVP_ERR_INVALID);
}

static void test_raftlog_snap_roundtrip_equal(void **state)
{
    (void)state;
    size_t raw_len = 100000;
    uint8_t *raw = malloc(raw_len);
    for (size_t i = 0; i < raw_len; i++)
        raw[i] = (uint8_t)(i % 251 < 200 ? 'a' : i);
    uint8_t *packed = NULL, *back = NULL;
    size_t packed_len = 0, back_len = 0;
    assert_int_equal(kvp_rl_snap_pack(raw, raw_len, &packed, &packed_len), KVP_OK);
    assert_true(packed_len < raw_len); /* compressible input does compress */
    assert_int_equal(kvp_rl_snap_unpack(packed, packed_len, &back, &back_len), KVP_OK);
    assert_int_equal(back_len, raw_len);
    assert_memory_equal(back, raw, raw_len);
    free(back);
    /* every truncated prefix is refused */
    for (size_t n = 0; n < packed_len; n += (n < 64 ? 1 : 97)) {
        uint8_t *copy = malloc(n > 0 ? n : 1);
        memcpy(copy, packed, n);
        back = NULL;
        assert_int_equal(kvp_rl_snap_unpack(copy, n, &back, &back_len), KVP_ERR_MALFORMED);
        assert_null(back);
        free(copy);
    }
    free(packed);
    free(raw);
}

static void test_raftlog_snap_lying_size_malformed(void **state)
{
    (void)state;
    static const uint8_t raw[] = "state-bytes-state-bytes";
    uint8_t *packed = NULL, *back = NULL;
    size_t packed_len = 0, back_len = 0;
    assert_int_equal(kvp_rl_snap_pack(raw, sizeof(raw), &packed, &packed_len), KVP_OK);
    /* claim one byte more / less than the frame holds */
    packed[5] = (uint8_t)(sizeof(raw) + 1);
    assert_int_equal(kvp_rl_snap_unpack(packed, packed_len, &back, &back_len), KVP_ERR_MALFORMED);
    packed[5] = (uint8_t)(sizeof(raw) - 1);
    assert_int_equal(kvp_rl_snap_unpack(packed, packed_len, &back, &back_len), KVP_ERR_MALFORMED);
    /* a gigantic claim is refused before allocating */
    memset(packed + 5, 0xff, 8);
    assert_int_equal(kvp_rl_snap_unpack(packed, packed_len, &back, &back_len), KVP_ERR_MALFORMED);
    packed[5] = (uint8_t)sizeof(raw);
    memset(packed + 6, 0, 7);
    packed[4] = 9;
    assert_int_equal(kvp_rl_snap_unpack(packed, packed_len, &back, &back_len), KVP_ERR_VERSION);
    packed[4] = 1;
    assert_int_equal(kvp_rl_snap_unpack(packed, packed_len, &back, &back_len), KVP_OK);
    assert_memory_equal(back, raw, sizeof(raw));
    free(back);
    free(packed);
}

static void test_raftlog_err_from_raft_mapped(void **state)
{
    (void)state;
    assert_int_equal(kvp_rl_err_from_raft(0), KVP_OK);
    assert_int_equal(kvp_rl_err_from_raft(RAFT_NOTLEADER), KVP_ERR_NOT_LEADER);
    assert_int_equal(kvp_rl_err_from_raft(RAFT_LEADERSHIPLOST), KVP_ERR_NOT_LEADER);
    assert_int_equal(kvp_rl_err_from_raft(RAFT_SHUTDOWN), KVP_ERR_CLOSED);
    assert_int_equal(kvp_rl_err_from_raft(RAFT_CANTCHANGE), KVP_ERR_BUSY);
    assert_int_equal(kvp_rl_err_from_raft(RAFT_BADID), KVP_ERR_INVALID);
    assert_int_equal(kvp_rl_err_from_raft(RAFT_IOERR), KVP_ERR_IO);
    assert_int_equal(kvp_rl_err_from_raft(9999), KVP_ERR_INTERNAL);
    /* The log line of a full disk names it (raft_strerror calls RAFT_NOSPACE "unknown error"). */
    assert_string_equal(kvp_rl_strerror(RAFT_NOSPACE), "not enough space on disk");
    assert_string_equal(kvp_rl_strerror(RAFT_IOERR), raft_strerror(RAFT_IOERR));
}

/* EV_APPLIED_BATCH records: two records read back in order; a header cut short and a length
 * past the end are malformed at every cut, with the read offset left where it was. */
static void test_raftlog_applied_batch_records(void **state)
{
    (void)state;
    uint8_t buf[16 + 3 + 16];
    memset(buf, 0, sizeof(buf));
    /* record 1: corr 0x0102030405060708, status -3 (KVP_ERR_*), 3 bytes "abc" */
    const uint8_t r1[16] = {8, 7, 6, 5, 4, 3, 2, 1, 0xfd, 0xff, 0xff, 0xff, 3, 0, 0, 0};
    memcpy(buf, r1, 16);
    memcpy(buf + 16, "abc", 3);
    /* record 2: corr 9, status 0, no bytes */
    buf[19] = 9;
    size_t pos = 0, rl = 99;
    uint64_t corr = 0;
    int32_t st = 1;
    const uint8_t *res = NULL;
    assert_int_equal(kvp_raftlog_applied_next(buf, sizeof(buf), &pos, &corr, &st, &res, &rl), 1);
    assert_int_equal(corr, 0x0102030405060708ull);
    assert_int_equal(st, -3);
    assert_int_equal(rl, 3);
    assert_memory_equal(res, "abc", 3);
    assert_int_equal(pos, 19);
    assert_int_equal(kvp_raftlog_applied_next(buf, sizeof(buf), &pos, &corr, &st, &res, &rl), 1);
    assert_int_equal(corr, 9);
    assert_int_equal(st, 0);
    assert_int_equal(rl, 0);
    assert_null(res);
    assert_int_equal(pos, sizeof(buf));
    assert_int_equal(kvp_raftlog_applied_next(buf, sizeof(buf), &pos, &corr, &st, &res, &rl), 0);
    /* every cut inside a record */
    for (size_t cut = 1; cut < sizeof(buf); cut++) {
        if (cut == 19)
            continue; /* the end of record 1: a whole record, then the end */
        size_t p2 = 0;
        int r;
        size_t last = 0;
        while ((r = kvp_raftlog_applied_next(buf, cut, &p2, &corr, &st, &res, &rl)) == 1)
            last = p2;
        assert_int_equal(r, KVP_ERR_MALFORMED);
        assert_int_equal(p2, last);
    }
    /* a length that lies: 2^32-1 bytes claimed */
    uint8_t lie[20] = {0};
    memset(lie + 12, 0xff, 4);
    pos = 0;
    assert_int_equal(kvp_raftlog_applied_next(lie, sizeof(lie), &pos, &corr, &st, &res, &rl), KVP_ERR_MALFORMED);
    assert_int_equal(pos, 0);
    assert_int_equal(kvp_raftlog_applied_next(NULL, 0, &pos, &corr, &st, &res, &rl), 0);
}

/* Group commit's packing rule (issue 22, session 31): an entry is bounded by commands, bytes
 * and apply cost (the master's batch items). 26 PutStart commands of 1,024 items (~40 KiB each)
 * used to fit one 1 MiB entry; at a cost bound of 4,096 they go 4 to an entry. The first
 * command always goes, however large or costly. */
static uint32_t take(const size_t *lens, const uint32_t *costs, uint32_t n, uint32_t max_cmds, size_t max_bytes,
                     uint64_t max_cost, struct kvp_rl_group *out)
{
    struct kvp_rl_group g = {0};
    for (uint32_t i = 0; i < n && kvp_rl_group_fits(&g, lens[i], costs[i], max_cmds, max_bytes, max_cost); i++)
        kvp_rl_group_add(&g, lens[i], costs[i]);
    *out = g;
    return g.n;
}

static void test_raftlog_group_bounded_by_cost_bytes_and_count(void **state)
{
    (void)state;
    size_t lens[64];
    uint32_t costs[64];
    struct kvp_rl_group g;
    for (int i = 0; i < 64; i++) {
        lens[i] = 40 * 1024;
        costs[i] = 1024;
    }
    /* bytes alone (the rule before): 1 MiB holds 25 of them */
    assert_int_equal(take(lens, costs, 64, 1024, 1u << 20, UINT64_MAX, &g), 25);
    assert_true(g.bytes <= (1u << 20) + 4);
    /* cost: 4,096 items = 4 commands, 16 KiB of items less per entry */
    assert_int_equal(take(lens, costs, 64, 1024, 1u << 20, 4096, &g), 4);
    assert_int_equal(g.cost, 4096);
    assert_int_equal(take(lens, costs, 64, 1024, 1u << 20, 4095, &g), 3);
    assert_true(g.cost <= 4095);
    /* count */
    assert_int_equal(take(lens, costs, 64, 2, 1u << 20, 4096, &g), 2);
    /* a first command costlier (or larger) than the bound still goes, alone */
    costs[0] = 100000;
    assert_int_equal(take(lens, costs, 64, 1024, 1u << 20, 4096, &g), 1);
    costs[0] = 1024;
    lens[0] = 4u << 20;
    assert_int_equal(take(lens, costs, 64, 1024, 1u << 20, 4096, &g), 1);
    /* single-item commands: 256 to an entry as before (the default group_commit_max) */
    for (int i = 0; i < 64; i++) {
        lens[i] = 60;
        costs[i] = 1;
    }
    assert_int_equal(take(lens, costs, 64, 256, 1u << 20, 4096, &g), 64);
    assert_int_equal(g.cost, 64);
    /* every prefix the rule takes stays within all three bounds */
    for (uint64_t seed = 1; seed < 200; seed++) {
        uint64_t x = seed * 0x9E3779B97F4A7C15ull;
        for (int i = 0; i < 64; i++) {
            x ^= x >> 29;
            x *= 0xBF58476D1CE4E5B9ull;
            lens[i] = 1 + (size_t)(x % 100000);
            costs[i] = 1 + (uint32_t)((x >> 20) % 3000);
        }
        uint32_t n = take(lens, costs, 64, 32, 1u << 20, 4096, &g);
        assert_true(n >= 1 && n <= 32);
        if (n > 1) {
            assert_true(g.cost <= 4096);
            assert_true(g.bytes - 4 <= (1u << 20));
        }
        if (n < 32 && n > 0) /* it stopped for a reason: the next one did not fit */
            assert_true(g.cost + costs[n] > 4096 || g.bytes + lens[n] > (1u << 20));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_raftlog_entry_roundtrip_equal),
        cmocka_unit_test(test_raftlog_entry_every_prefix_malformed),
        cmocka_unit_test(test_raftlog_entry_trailing_bytes_malformed),
        cmocka_unit_test(test_raftlog_entry_lying_lengths_malformed),
        cmocka_unit_test(test_raftlog_entry_bad_magic_version_rejected),
        cmocka_unit_test(test_raftlog_entry_encode_errors_reported),
        cmocka_unit_test(test_raftlog_snap_roundtrip_equal),
        cmocka_unit_test(test_raftlog_snap_lying_size_malformed),
        cmocka_unit_test(test_raftlog_err_from_raft_mapped),
        cmocka_unit_test(test_raftlog_applied_batch_records),
        cmocka_unit_test(test_raftlog_group_bounded_by_cost_bytes_and_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
