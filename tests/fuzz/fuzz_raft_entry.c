/* fuzz_raft_entry.c — libFuzzer target for the Raft entry decoder (raftlog/entry.h) and the
 * snapshot unpacker. Properties checked on every input:
 *  - decode never reads outside the input (ASan) and never crashes;
 *  - if decode accepts, iterating yields exactly `count` commands inside the input, and
 *    re-encoding them reproduces the input byte for byte (the framing is canonical);
 *  - snapshot unpack either fails cleanly or returns exactly the size the header claims.
 * Built with -fsanitize=fuzzer when KVP_FUZZ=ON (KVP_LIBFUZZER defined); otherwise the main()
 * below replays a deterministic generated corpus plus any files named on the command line, so
 * the target runs as an ordinary ctest (label fuzz). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "raftlog/entry.h"
#include "raftlog/raftlog_internal.h"

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_raft_entry: check failed: %s (line %d)\n", #c, __LINE__);       \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvp_rl_entry_iter it;
    int rc = kvp_rl_entry_decode(data, size, &it);
    CHECK(rc == KVP_OK || rc == KVP_ERR_MALFORMED || rc == KVP_ERR_VERSION);
    if (rc == KVP_OK) {
        CHECK(it.count > 0);
        struct kvp_rl_cmd *cmds = calloc(it.count, sizeof(*cmds));
        CHECK(cmds != NULL);
        uint32_t n = 0;
        struct kvp_rl_cmd c;
        while (kvp_rl_entry_next(&it, &c)) {
            CHECK(n < it.count);
            CHECK(c.data >= data && c.data + c.len <= data + size);
            cmds[n++] = c;
        }
        CHECK(n == it.count);
        size_t sz = kvp_rl_entry_size(cmds, n);
        CHECK(sz == size);
        uint8_t *again = malloc(sz);
        size_t w = 0;
        CHECK(again != NULL);
        CHECK(kvp_rl_entry_encode(again, sz, cmds, n, &w) == KVP_OK);
        CHECK(w == size && memcmp(again, data, size) == 0);
        free(again);
        free(cmds);
    }
    uint8_t *raw = NULL;
    size_t raw_len = 0;
    rc = kvp_rl_snap_unpack(data, size, &raw, &raw_len);
    if (rc == KVP_OK) {
        CHECK(size >= KVP_RL_SNAP_HDR_BYTES);
        uint64_t claim = 0;
        for (int i = 0; i < 8; i++)
            claim |= (uint64_t)data[5 + i] << (8 * i);
        CHECK(claim == raw_len);
        free(raw);
    } else {
        CHECK(raw == NULL);
    }
    return 0;
}

#ifndef KVP_LIBFUZZER
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void run_with_mutations(const uint8_t *buf, size_t len, unsigned *runs)
{
    uint8_t *copy = malloc(len + 16);
    CHECK(copy != NULL);
    for (size_t n = 0; n <= len; n++) { /* every prefix, in an exact-size buffer */
        uint8_t *p = malloc(n > 0 ? n : 1);
        memcpy(p, buf, n);
        LLVMFuzzerTestOneInput(p, n);
        free(p);
        (*runs)++;
    }
    for (int m = 0; m < 150; m++) { /* random byte flips and small length changes */
        memcpy(copy, buf, len);
        size_t l = len;
        int flips = 1 + (int)(rnd() % 4);
        for (int f = 0; f < flips && l > 0; f++)
            copy[rnd() % l] ^= (uint8_t)(1u << (rnd() % 8));
        if (rnd() % 4 == 0)
            l += rnd() % 9;
        uint8_t *p = malloc(l > 0 ? l : 1);
        memcpy(p, copy, l > len ? len : l);
        if (l > len)
            memset(p + len, (int)(rnd() % 2), l - len);
        LLVMFuzzerTestOneInput(p, l);
        free(p);
        (*runs)++;
    }
    free(copy);
}

int main(int argc, char **argv)
{
    unsigned runs = 0;
    /* generated corpus: entries of 1..40 commands with lengths 0..70 */
    for (int e = 0; e < 40; e++) {
        struct kvp_rl_cmd cmds[40];
        uint8_t pool[40 * 71];
        for (size_t i = 0; i < sizeof(pool); i++)
            pool[i] = (uint8_t)rnd();
        unsigned n = 1 + (unsigned)(rnd() % 40);
        for (unsigned i = 0; i < n; i++) {
            cmds[i].data = pool + i * 71;
            cmds[i].len = (size_t)(rnd() % 71);
        }
        size_t sz = kvp_rl_entry_size(cmds, n);
        uint8_t *buf = malloc(sz);
        size_t w = 0;
        CHECK(kvp_rl_entry_encode(buf, sz, cmds, n, &w) == KVP_OK);
        run_with_mutations(buf, w, &runs);
        free(buf);
    }
    /* snapshots */
    for (int s = 0; s < 8; s++) {
        size_t raw_len = (size_t)(rnd() % 3000);
        uint8_t *raw = malloc(raw_len + 1);
        for (size_t i = 0; i < raw_len; i++)
            raw[i] = (uint8_t)(s % 2 ? rnd() : 'x');
        uint8_t *packed = NULL;
        size_t packed_len = 0;
        CHECK(kvp_rl_snap_pack(raw, raw_len, &packed, &packed_len) == KVP_OK);
        run_with_mutations(packed, packed_len, &runs);
        free(packed);
        free(raw);
    }
    /* files given on the command line (a libFuzzer corpus or crash reproducer) */
    for (int a = 1; a < argc; a++) {
        FILE *f = fopen(argv[a], "rb");
        if (f == NULL)
            continue;
        uint8_t *buf = malloc(1 << 20);
        size_t n = fread(buf, 1, 1 << 20, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
        free(buf);
        runs++;
    }
    printf("fuzz_raft_entry: %u inputs replayed, no failure\n", runs);
    return 0;
}
#endif
