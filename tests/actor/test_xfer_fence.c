/*
 * test_xfer_fence.c — contract C2 at the transfer engine over real TCP: batches against a
 * segment that answers after random delays, with random timeouts. Every slice that times out
 * is refilled with poison by the "caller" right away; at the end (after a sync batch proves
 * every late response was consumed) every such buffer must still be poison, every completed
 * READ must hold the right bytes, and no WRITE byte that reached the segment may come from a
 * buffer after its call returned (the fake segment checks each payload byte).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "xfer_test_util.h"

#define POISON 0xA5

struct kept {
    uint8_t *buf;
    uint64_t len;
};

static void run_rounds(uint8_t op, int rounds, unsigned seed)
{
    struct fake_server fs;
    assert_int_equal(fake_server_start_seeded(&fs, FAKE_DELAY, 4000, seed), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", fs.port);
    struct kvp_xfer_engine *e;
    struct kvp_xfer_params p = {.conns_per_peer = 1, .slice_bytes = 64 * 1024};
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    struct kept *kept = calloc((size_t)rounds * 16, sizeof *kept);
    size_t n_kept = 0, n_ok = 0, n_timeout = 0;
    unsigned r = seed;
    for (int round = 0; round < rounds; round++) {
        size_t n = 1 + (size_t)(rand_r(&r) % 16);
        struct kvp_xfer_slice s[16];
        uint8_t *bufs[16];
        for (size_t i = 0; i < n; i++) {
            uint64_t len = 1 + (uint64_t)(rand_r(&r) % (32 * 1024));
            bufs[i] = malloc(len);
            if (op == KVP_XFER_WRITE)
                pat_fill(bufs[i], len, 5);
            else
                memset(bufs[i], 0, len);
            s[i] = (struct kvp_xfer_slice){.local = bufs[i], .length = len, .segment_id = 1, .endpoint = ep,
                                           .remote_offset = (uint64_t)(rand_r(&r) % 100000), .op = op};
        }
        uint32_t timeout = 1 + (uint32_t)(rand_r(&r) % 20);
        int rc = kvp_xfer_run(e, s, n, timeout);
        assert_true(rc == KVP_OK || rc == KVP_ERR_TIMEOUT);
        for (size_t i = 0; i < n; i++) {
            assert_true(s[i].status == KVP_OK || s[i].status == KVP_ERR_TIMEOUT);
            if (s[i].status == KVP_OK) {
                n_ok++;
                if (op == KVP_XFER_READ)
                    for (uint64_t j = 0; j < s[i].length; j++)
                        assert_int_equal(bufs[i][j], pat_byte(7, s[i].remote_offset + j));
                free(bufs[i]);
            } else {
                n_timeout++;
                memset(bufs[i], POISON, s[i].length); /* the caller reuses its buffer at once */
                kept[n_kept++] = (struct kept){bufs[i], s[i].length};
            }
        }
    }
    /* Sync: on the single connection this answer comes after every late one. */
    atomic_store(&fs.delay_us, 0);
    uint8_t tail[4096];
    struct kvp_xfer_slice t = {.local = tail, .length = sizeof tail, .segment_id = 1, .endpoint = ep,
                               .remote_offset = 0, .op = KVP_XFER_READ};
    assert_int_equal(kvp_xfer_run(e, &t, 1, 30000), KVP_OK);
    for (size_t i = 0; i < n_kept; i++) {
        assert_true(all_bytes(kept[i].buf, kept[i].len, POISON));
        free(kept[i].buf);
    }
    kvp_xfer_engine_destroy(&e);
    fake_server_stop(&fs);
    assert_int_equal(atomic_load(&fs.write_bad), 0);
    printf("  %s: %d rounds, %zu slices completed, %zu fenced by timeout, %llu WRITE bytes checked\n",
           op == KVP_XFER_READ ? "READ" : "WRITE", rounds, n_ok, n_timeout,
           (unsigned long long)atomic_load(&fs.write_bytes));
    free(kept);
}

static void test_xfer_fence_random_read_timeouts_never_write_late(void **state)
{
    (void)state;
    run_rounds(KVP_XFER_READ, 150, 12345);
}

static void test_xfer_fence_random_write_timeouts_never_read_late(void **state)
{
    (void)state;
    run_rounds(KVP_XFER_WRITE, 150, 777);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xfer_fence_random_read_timeouts_never_write_late),
        cmocka_unit_test(test_xfer_fence_random_write_timeouts_never_read_late),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
