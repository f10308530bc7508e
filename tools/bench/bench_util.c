/*
 * bench_util.c — block byte pattern, latency samples, error counts, size parsing.
 * Pure helpers (no cluster access); unit-tested through tests/unit/test_trace_bounds.c.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "tools/bench/bench_internal.h"

/* ---------------------------------------------------------------- pattern */

/* splitmix64 step: turns the block id into a well-mixed, never-zero xorshift state. */
static uint64_t seed_of(uint64_t id)
{
    uint64_t z = id + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return z ? z : 0x2545f4914f6cdd1dULL;
}

static inline uint64_t xs_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dULL;
}

void bench_pattern_fill(void *buf, size_t len, uint64_t id)
{
    uint64_t s = seed_of(id);
    unsigned char *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = xs_next(&s);
        memcpy(p + i, &v, 8);
    }
    if (i < len) {
        uint64_t v = xs_next(&s);
        memcpy(p + i, &v, len - i);
    }
}

int64_t bench_pattern_check(const void *buf, size_t len, uint64_t id)
{
    uint64_t s = seed_of(id);
    const unsigned char *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = xs_next(&s);
        if (memcmp(p + i, &v, 8) != 0) {
            const unsigned char *e = (const unsigned char *)&v;
            for (size_t j = 0; j < 8; j++)
                if (p[i + j] != e[j])
                    return (int64_t)(i + j);
        }
    }
    if (i < len) {
        uint64_t v = xs_next(&s);
        const unsigned char *e = (const unsigned char *)&v;
        for (size_t j = 0; i + j < len; j++)
            if (p[i + j] != e[j])
                return (int64_t)(i + j);
    }
    return -1;
}

/* ---------------------------------------------------------------- latency */

void bench_lat_add(struct bench_lat *l, uint64_t us)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4096;
        uint32_t *np = realloc(l->us, nc * sizeof *np);
        if (!np)
            return; /* a lost sample under memory pressure; never a crash */
        l->us = np;
        l->cap = nc;
    }
    l->us[l->n++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

void bench_lat_merge(struct bench_lat *dst, const struct bench_lat *src)
{
    for (size_t i = 0; i < src->n; i++)
        bench_lat_add(dst, src->us[i]);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

void bench_lat_sort(struct bench_lat *l)
{
    if (l->n)
        qsort(l->us, l->n, sizeof *l->us, cmp_u32);
}

uint64_t bench_lat_pct(const struct bench_lat *l, double q)
{
    if (!l->n)
        return 0;
    if (q <= 0)
        return l->us[0];
    size_t rank = (size_t)ceil(q * (double)l->n);
    if (rank < 1)
        rank = 1;
    if (rank > l->n)
        rank = l->n;
    return l->us[rank - 1];
}

void bench_lat_free(struct bench_lat *l)
{
    free(l->us);
    memset(l, 0, sizeof *l);
}

/* ---------------------------------------------------------------- errors */

void bench_errs_add(struct bench_errs *e, int code)
{
    int i = code < 0 ? -code : code;
    if (i >= BENCH_NCODES)
        i = BENCH_NCODES - 1;
    e->n[i]++;
}

void bench_errs_merge(struct bench_errs *dst, const struct bench_errs *src)
{
    for (int i = 0; i < BENCH_NCODES; i++)
        dst->n[i] += src->n[i];
}

uint64_t bench_errs_total(const struct bench_errs *e)
{
    uint64_t s = 0;
    for (int i = 1; i < BENCH_NCODES; i++)
        s += e->n[i];
    return s;
}

void bench_errs_print(FILE *f, const struct bench_errs *e)
{
    int any = 0;
    for (int i = 1; i < BENCH_NCODES; i++) {
        if (!e->n[i])
            continue;
        fprintf(f, "%s%s=%llu", any ? ", " : "", kvp_errname(-i), (unsigned long long)e->n[i]);
        any = 1;
    }
    if (!any)
        fprintf(f, "none");
}

/* ---------------------------------------------------------------- misc */

int bench_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s)
        return KVP_ERR_INVALID;
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0 || !isfinite(v))
        return KVP_ERR_INVALID;
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; break;
        case 'm': case 'M': mul = 1024.0 * 1024; break;
        case 'g': case 'G': mul = 1024.0 * 1024 * 1024; break;
        case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
        case 'b': case 'B': mul = 1; break;
        default: return KVP_ERR_INVALID;
        }
        const char *rest = end + 1;
        if (*end != 'b' && *end != 'B' &&
            !(*rest == 0 || !strcasecmp(rest, "b") || !strcasecmp(rest, "ib")))
            return KVP_ERR_INVALID;
        if ((*end == 'b' || *end == 'B') && *rest)
            return KVP_ERR_INVALID;
    }
    double r = v * mul;
    if (r > 1.8e19)
        return KVP_ERR_INVALID;
    *out = (uint64_t)r;
    return 0;
}

const char *bench_fmt_bytes(double b, char *buf, size_t cap)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(buf, cap, i ? "%.2f %s" : "%.0f %s", b, u[i]);
    return buf;
}

uint64_t bench_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000ull + (uint64_t)ts.tv_nsec / 1000;
}
