/*
 * inference_server.c — how an inference server embeds kvpool to save and load the KV cache of
 * token blocks. Uses only the public API (kvpool.h).
 *
 * The model's KV cache lives in one registered region, laid out per layer as paged attention
 * engines do: layer l holds the K/V bytes of every block, so block b of layer l is the piece
 * kv[l][b] of `piece` bytes. One stored object = one block = its L pieces concatenated.
 *
 *   1. open a client from a config (flags, else KVPOOL_* environment);
 *   2. register the region;
 *   3. store the first half of the blocks with kvp_batch_put (after gathering each block into a
 *      staging slot, as a connector without scatter-gather would) and the second half with
 *      kvp_batch_put_iov straight from the per-layer pieces;
 *   4. poison the region and load every block back: kvp_batch_get into the staging slots and
 *      kvp_batch_get_iov scattered back into the layer pieces;
 *   5. verify every byte against the pattern derived from the key; print a summary.
 * Exit status: 0 all bytes verified; 1 any per-key error or mismatch; 2 usage/config/open error.
 *
 *   inference_server [--masters host:port,...|--cluster DIR/cluster.json] [--config FILE]
 *                    [--blocks N] [--layers L] [--piece-bytes B] [--replicas R] [--keep]
 * Environment: KVPOOL_MASTER_SERVER_ADDRESS, KVPOOL_CLUSTER_FILE, KVPOOL_CONFIG (a JSON file).
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvpool.h"

#define POISON 0xA5

struct opts {
    const char *masters, *cluster, *config;
    size_t blocks, layers, piece;
    const char *replicas;
    bool keep;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The pattern of byte `off` of the object under `key`: a 64-bit mix of a key hash and the
 * offset, so a misplaced piece, a block under the wrong key or a stale byte all show. */
static uint64_t key_hash(const char *key)
{
    uint64_t h = 1469598103934665603ull;
    for (; *key; key++)
        h = (h ^ (uint8_t)*key) * 1099511628211ull;
    return h;
}

static uint8_t pattern(uint64_t kh, size_t off)
{
    uint64_t x = kh + (uint64_t)(off / 8) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (uint8_t)(x >> (8 * (off % 8)));
}

static int usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [--masters host:port,...|--cluster DIR/cluster.json] [--config FILE]\n"
            "          [--blocks N] [--layers L] [--piece-bytes B] [--replicas R] [--keep]\n",
            prog);
    return 2;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.blocks = 64, .layers = 32, .piece = 8192};
    o->masters = getenv("KVPOOL_MASTER_SERVER_ADDRESS");
    o->cluster = getenv("KVPOOL_CLUSTER_FILE");
    o->config = getenv("KVPOOL_CONFIG");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--keep") == 0) {
            o->keep = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "%s: %s needs a value (or is unknown)\n", argv[0], a);
            return -1;
        }
        i++;
        char *end = NULL;
        if (strcmp(a, "--masters") == 0)
            o->masters = v;
        else if (strcmp(a, "--cluster") == 0)
            o->cluster = v;
        else if (strcmp(a, "--config") == 0)
            o->config = v;
        else if (strcmp(a, "--replicas") == 0)
            o->replicas = v;
        else if (strcmp(a, "--blocks") == 0)
            o->blocks = strtoul(v, &end, 10);
        else if (strcmp(a, "--layers") == 0)
            o->layers = strtoul(v, &end, 10);
        else if (strcmp(a, "--piece-bytes") == 0)
            o->piece = strtoul(v, &end, 10);
        else {
            fprintf(stderr, "%s: unknown flag %s\n", argv[0], a);
            return -1;
        }
        if (end && (*end || end == v)) {
            fprintf(stderr, "%s: %s %s: not a number\n", argv[0], a, v);
            return -1;
        }
    }
    if (o->blocks < 2 || o->blocks > 100000 || o->layers < 1 || o->layers > 1024 || o->piece < 1 ||
        o->piece > (64u << 20) || o->blocks * o->layers * o->piece > (1ull << 32)) {
        fprintf(stderr, "%s: --blocks must be 2..100000, --layers 1..1024, --piece-bytes 1..64 MiB, "
                        "and blocks x layers x piece-bytes at most 4 GiB\n", argv[0]);
        return -1;
    }
    return 0;
}

static kvp_config *make_config(const struct opts *o)
{
    kvp_config *cfg = NULL;
    if (kvp_config_new(&cfg) != KVP_OK)
        return NULL;
    int rc = KVP_OK;
    if (o->config && *o->config)
        rc = kvp_config_load_file(cfg, o->config);
    if (rc == KVP_OK && o->cluster && *o->cluster)
        rc = kvp_config_set(cfg, "cluster_file", o->cluster);
    if (rc == KVP_OK && o->masters && *o->masters)
        rc = kvp_config_set(cfg, "master_server_address", o->masters);
    if (rc == KVP_OK && o->replicas)
        rc = kvp_config_set(cfg, "replica_num", o->replicas);
    if (rc != KVP_OK) {
        fprintf(stderr, "config: %s\n", kvp_strerror(rc));
        kvp_config_destroy(&cfg);
    }
    return cfg;
}

int main(int argc, char **argv)
{
    struct opts o;
    if (parse_opts(argc, argv, &o) != 0)
        return usage(argv[0]);
    kvp_config *cfg = make_config(&o);
    if (!cfg)
        return 2;
    kvp_client *cl = NULL;
    int rc = kvp_client_open(cfg, &cl);
    kvp_config_destroy(&cfg);
    if (rc != KVP_OK) {
        fprintf(stderr, "kvp_client_open: %s (%s)\n", kvp_strerror(rc), kvp_errname(rc));
        return 2;
    }

    const size_t n = o.blocks, L = o.layers, piece = o.piece, block = L * piece;
    const size_t half = n / 2;
    /* region = [layer pieces: L x n x piece][staging slots: n x block] */
    const size_t kv_bytes = L * n * piece, region_bytes = kv_bytes + n * block;
    uint8_t *region = NULL;
    if (posix_memalign((void **)&region, 4096, region_bytes) != 0) {
        fprintf(stderr, "out of memory (%zu bytes)\n", region_bytes);
        kvp_client_close(&cl);
        return 2;
    }
    uint8_t *kv = region, *staging = region + kv_bytes;
#define PIECE(l, b) (kv + ((size_t)(l) * n + (size_t)(b)) * piece)
#define SLOT(b) (staging + (size_t)(b) * block)

    rc = kvp_register_buffer(cl, region, region_bytes);
    if (rc != KVP_OK) {
        fprintf(stderr, "kvp_register_buffer: %s\n", kvp_strerror(rc));
        free(region);
        kvp_client_close(&cl);
        return 2;
    }

    char **keys = calloc(n, sizeof *keys);
    uint64_t *kh = calloc(n, sizeof *kh);
    kvp_iov *iov = calloc(n * L, sizeof *iov);
    const kvp_iov **iovs = calloc(n, sizeof *iovs);
    size_t *iovcnt = calloc(n, sizeof *iovcnt), *lens = calloc(n, sizeof *lens);
    const void **bufs = calloc(n, sizeof *bufs);
    void **gbufs = calloc(n, sizeof *gbufs);
    int *put_res = calloc(n, sizeof *put_res), *ex_res = calloc(n, sizeof *ex_res);
    int64_t *get_res = calloc(n, sizeof *get_res);
    if (!keys || !kh || !iov || !iovs || !iovcnt || !lens || !bufs || !gbufs || !put_res || !ex_res ||
        !get_res) {
        fprintf(stderr, "out of memory\n");
        return 2;
    }
    char run[64];
    snprintf(run, sizeof run, "%ld-%ld", (long)getpid(), (long)time(NULL));
    for (size_t b = 0; b < n; b++) {
        keys[b] = malloc(128);
        snprintf(keys[b], 128, "example/%s/block-%zu", run, b);
        kh[b] = key_hash(keys[b]);
        for (size_t l = 0; l < L; l++) {
            uint8_t *p = PIECE(l, b);
            for (size_t i = 0; i < piece; i++)
                p[i] = pattern(kh[b], l * piece + i);
            iov[b * L + l] = (kvp_iov){.base = p, .len = piece};
        }
        iovs[b] = &iov[b * L];
        iovcnt[b] = L;
        lens[b] = block;
        gbufs[b] = SLOT(b);
        bufs[b] = SLOT(b);
    }

    /* --- store: first half gathered into staging slots, second half straight from the layers */
    double t0 = now_s();
    for (size_t b = 0; b < half; b++)
        for (size_t l = 0; l < L; l++)
            memcpy(SLOT(b) + l * piece, PIECE(l, b), piece);
    size_t errors = 0;
    int brc = kvp_batch_put(cl, half, (const char *const *)keys, bufs, lens, NULL, put_res);
    if (brc == KVP_OK)
        brc = kvp_batch_put_iov(cl, n - half, (const char *const *)keys + half, iovs + half, iovcnt + half,
                                NULL, put_res + half);
    double t_put = now_s() - t0;
    if (brc != KVP_OK) {
        fprintf(stderr, "batch put could not run: %s (%s)\n", kvp_strerror(brc), kvp_errname(brc));
        errors = n;
    }
    for (size_t b = 0; b < n && brc == KVP_OK; b++)
        if (put_res[b] != KVP_OK) {
            fprintf(stderr, "put %s: %s\n", keys[b], kvp_strerror(put_res[b]));
            errors++;
        }
    if (brc == KVP_OK) {
        brc = kvp_batch_exists(cl, n, (const char *const *)keys, ex_res);
        for (size_t b = 0; b < n && brc == KVP_OK; b++)
            if (put_res[b] == KVP_OK && ex_res[b] != 1) {
                fprintf(stderr, "exists %s: %d after a successful put\n", keys[b], ex_res[b]);
                errors++;
            }
    }

    /* --- load: poison everything, then get back into the same registered region */
    memset(region, POISON, region_bytes);
    t0 = now_s();
    int grc = kvp_batch_get(cl, half, (const char *const *)keys, gbufs, lens, 0, get_res);
    if (grc == KVP_OK)
        grc = kvp_batch_get_iov(cl, n - half, (const char *const *)keys + half, iovs + half, iovcnt + half, 0,
                                get_res + half);
    double t_get = now_s() - t0;
    if (grc != KVP_OK) {
        fprintf(stderr, "batch get could not run: %s (%s)\n", kvp_strerror(grc), kvp_errname(grc));
        errors = n;
    }

    /* --- verify every byte: the first half from the staging slots, the second in the layers */
    size_t mismatched_blocks = 0, verified_bytes = 0;
    for (size_t b = 0; b < n && grc == KVP_OK; b++) {
        if (get_res[b] != (int64_t)block) {
            fprintf(stderr, "get %s: %s%" PRId64 "\n", keys[b], get_res[b] < 0 ? kvp_strerror((int)get_res[b]) : "size ",
                    get_res[b]);
            errors++;
            continue;
        }
        size_t bad = 0;
        for (size_t l = 0; l < L; l++) {
            const uint8_t *p = b < half ? SLOT(b) + l * piece : PIECE(l, b);
            for (size_t i = 0; i < piece; i++)
                if (p[i] != pattern(kh[b], l * piece + i))
                    bad++;
        }
        if (bad) {
            fprintf(stderr, "get %s: %zu of %zu bytes differ\n", keys[b], bad, block);
            mismatched_blocks++;
        } else {
            verified_bytes += block;
        }
    }

    if (!o.keep)
        for (size_t b = 0; b < n; b++)
            if (put_res[b] == KVP_OK)
                (void)kvp_remove(cl, keys[b], true);
    (void)kvp_unregister_buffer(cl, region);
    kvp_client_close(&cl);

    double mib = (double)(n * block) / (1024.0 * 1024.0);
    printf("inference_server: %zu blocks x %zu layers x %zu bytes (%.1f MiB): put %.3f s (%.1f MiB/s), "
           "get %.3f s (%.1f MiB/s); verified %zu bytes; %zu errors, %zu mismatched blocks\n",
           n, L, piece, mib, t_put, t_put > 0 ? mib / t_put : 0.0, t_get, t_get > 0 ? mib / t_get : 0.0,
           verified_bytes, errors, mismatched_blocks);

    for (size_t b = 0; b < n; b++)
        free(keys[b]);
    free(keys);
    free(kh);
    free(iov);
    free(iovs);
    free(iovcnt);
    free(lens);
    free(bufs);
    free(gbufs);
    free(put_res);
    free(ex_res);
    free(get_res);
    free(region);
    return (errors || mismatched_blocks) ? 1 : 0;
}
