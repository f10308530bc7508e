/*
 * fuzz_driver.c — runs a fuzz target without libFuzzer, so the normal suite exercises the
 * decoders (ctest label `fuzz`). Linked with one tests/fuzz/fuzz_<name>.c (KVP_FUZZ_NAME).
 *
 *  1. replays every file of the seed corpus (argv[1], else
 *     $KVP_SOURCE_DIR/tests/fuzz/corpus/<name>); at least one seed must decode, else the
 *     corpus or the target is broken and the test fails;
 *  2. feeds every strict prefix of every seed: a strict prefix of a seed that decodes must be
 *     refused (truncated input is a malformed message), else the test fails;
 *  3. feeds KVP_FUZZ_ITERATIONS (default 4000) inputs: random bytes, and seeds mutated by bit
 *     flips, byte overwrites, length-field rewrites, truncation, insertion and splicing,
 *     from a fixed PRNG seed (deterministic: a failure reproduces).
 * Each input sits in a buffer of exactly its size, so ASan catches any overread.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz_common.h"

#ifndef KVP_FUZZ_NAME
#error "KVP_FUZZ_NAME must name the target"
#endif

struct blob {
    uint8_t *p;
    size_t n;
};

static uint64_t g_rng;

static uint64_t rnd(void)
{
    /* xorshift64* */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545F4914F6CDD1Dull;
}

static size_t rnd_below(size_t n)
{
    return n ? (size_t)(rnd() % n) : 0;
}

static void run(const uint8_t *data, size_t n)
{
    uint8_t *copy = malloc(n ? n : 1); /* exact size: overreads are caught */
    if (!copy)
        abort();
    if (n)
        memcpy(copy, data, n);
    LLVMFuzzerTestOneInput(copy, n);
    free(copy);
}

static int load_corpus(const char *dir, struct blob **out, size_t *count)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "%s: cannot open corpus %s\n", KVP_FUZZ_NAME, dir);
        return -1;
    }
    struct blob *v = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        uint8_t *buf = malloc(1 << 20);
        size_t len = buf ? fread(buf, 1, 1 << 20, f) : 0;
        fclose(f);
        struct blob *nv = buf ? realloc(v, (n + 1) * sizeof(*v)) : NULL;
        if (!nv) {
            free(buf);
            continue;
        }
        v = nv;
        v[n].p = buf;
        v[n].n = len;
        n++;
    }
    closedir(d);
    *out = v;
    *count = n;
    return 0;
}

static size_t mutate(uint8_t *b, size_t n, size_t cap, const struct blob *seeds, size_t nseeds)
{
    int steps = 1 + (int)rnd_below(6);
    for (int s = 0; s < steps; s++) {
        switch (rnd_below(8)) {
        case 0: /* flip a bit */
            if (n)
                b[rnd_below(n)] ^= (uint8_t)(1u << rnd_below(8));
            break;
        case 1: { /* interesting byte */
            static const uint8_t vals[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0x0a, 0x12, 0x22};
            if (n)
                b[rnd_below(n)] = vals[rnd_below(sizeof(vals))];
            break;
        }
        case 2: /* random byte */
            if (n)
                b[rnd_below(n)] = (uint8_t)rnd();
            break;
        case 3: { /* rewrite a 4-byte little-endian field (lengths) */
            if (n >= 4) {
                size_t at = rnd_below(n - 3);
                uint32_t vals[] = {0, 1, 0xffffffffu, 0x7fffffffu, (uint32_t)n, (uint32_t)n - 12,
                                   (uint32_t)n - 11, (uint32_t)n - 13, 64u << 20, (64u << 20) + 1};
                uint32_t v = vals[rnd_below(sizeof(vals) / sizeof(vals[0]))];
                for (int i = 0; i < 4; i++)
                    b[at + (size_t)i] = (uint8_t)(v >> (8 * i));
            }
            break;
        }
        case 4: /* truncate */
            n = rnd_below(n + 1);
            break;
        case 5: { /* insert random bytes */
            size_t k = 1 + rnd_below(8);
            if (n + k <= cap) {
                size_t at = rnd_below(n + 1);
                memmove(b + at + k, b + at, n - at);
                for (size_t i = 0; i < k; i++)
                    b[at + i] = (uint8_t)rnd();
                n += k;
            }
            break;
        }
        case 6: { /* splice the tail of another seed */
            if (nseeds) {
                const struct blob *o = &seeds[rnd_below(nseeds)];
                size_t at = rnd_below(n + 1), from = rnd_below(o->n + 1);
                size_t k = o->n - from;
                if (at + k > cap)
                    k = cap - at;
                memcpy(b + at, o->p + from, k);
                n = at + k;
            }
            break;
        }
        default: { /* duplicate a chunk */
            if (n) {
                size_t from = rnd_below(n), k = 1 + rnd_below(n - from);
                if (n + k <= cap) {
                    memmove(b + from + k, b + from, n - from);
                    n += k;
                }
            }
            break;
        }
        }
    }
    return n;
}

int main(int argc, char **argv)
{
    char dir[4096];
    if (argc > 1) {
        snprintf(dir, sizeof(dir), "%s", argv[1]);
    } else {
        const char *src = getenv("KVP_SOURCE_DIR");
        snprintf(dir, sizeof(dir), "%s/tests/fuzz/corpus/%s", src ? src : ".", KVP_FUZZ_NAME);
    }
    struct blob *seeds = NULL;
    size_t nseeds = 0;
    if (load_corpus(dir, &seeds, &nseeds) != 0)
        return 1;
    char *valid = calloc(nseeds ? nseeds : 1, 1);
    if (!valid)
        return 1;
    for (size_t i = 0; i < nseeds; i++) {
        unsigned long d0 = kvp_fuzz_decoded;
        run(seeds[i].p, seeds[i].n);
        valid[i] = kvp_fuzz_decoded > d0;
    }
    unsigned long seeds_ok = kvp_fuzz_decoded;
    if (nseeds == 0 || seeds_ok == 0) {
        fprintf(stderr, "%s: %zu seeds, %lu decoded: the corpus must hold valid inputs\n",
                KVP_FUZZ_NAME, nseeds, seeds_ok);
        return 1;
    }
    size_t prefixes = 0;
    for (size_t i = 0; i < nseeds; i++) {
        for (size_t cut = 0; cut < seeds[i].n; cut++) {
            unsigned long d0 = kvp_fuzz_decoded;
            run(seeds[i].p, cut);
            prefixes++;
            if (valid[i] && kvp_fuzz_decoded != d0) {
                fprintf(stderr, "%s: seed %zu: prefix of %zu bytes (of %zu) decoded\n",
                        KVP_FUZZ_NAME, i, cut, seeds[i].n);
                return 1;
            }
        }
    }
    unsigned long before = kvp_fuzz_decoded;
    long iters = 4000;
    const char *it = getenv("KVP_FUZZ_ITERATIONS");
    if (it && atol(it) > 0)
        iters = atol(it);
    g_rng = 0x6b76706f6f6cull; /* "kvpool" */
    for (const char *c = KVP_FUZZ_NAME; *c; c++)
        g_rng = g_rng * 131 + (uint8_t)*c;
    enum { CAP = 4096 };
    uint8_t *buf = malloc(CAP);
    if (!buf)
        return 1;
    for (long i = 0; i < iters; i++) {
        size_t n;
        if (i % 4 == 0) {
            n = rnd_below(300);
            for (size_t k = 0; k < n; k++)
                buf[k] = (uint8_t)rnd();
        } else {
            const struct blob *s = &seeds[rnd_below(nseeds)];
            n = s->n < CAP ? s->n : CAP;
            memcpy(buf, s->p, n);
            n = mutate(buf, n, CAP, seeds, nseeds);
        }
        run(buf, n);
    }
    printf("%s: %zu seeds (%lu decoded), %zu prefixes, %ld generated inputs (%lu decoded)\n",
           KVP_FUZZ_NAME, nseeds, seeds_ok, prefixes, iters, kvp_fuzz_decoded - before);
    free(buf);
    for (size_t i = 0; i < nseeds; i++)
        free(seeds[i].p);
    free(seeds);
    free(valid);
    return 0;
}
