/*
 * bench_bounds.c — offline prefix-hit bounds of a trace: an infinite cache and a block-level
 * LRU of a given capacity in tokens. Pure: no I/O, no clock.
 *
 * Prefix semantics (as an inference server uses a KV cache): block i of a request is only
 * usable if blocks 0..i-1 are too, so a request hits the longest prefix of its blocks that
 * are cached.
 */
#include <stdlib.h>
#include <string.h>

#include "tools/bench/bench_internal.h"

/* id -> dense index map (insert-only, open addressing, linear probing). */
struct idmap {
    uint64_t *keys; /* id + 1; 0 = empty */
    uint32_t *vals;
    size_t cap;     /* power of two */
    size_t n;
};

static int idmap_init(struct idmap *m, size_t expect)
{
    size_t cap = 1024;
    while (cap < expect * 2)
        cap *= 2;
    m->keys = calloc(cap, sizeof *m->keys);
    m->vals = calloc(cap, sizeof *m->vals);
    m->cap = cap;
    m->n = 0;
    return (m->keys && m->vals) ? 0 : KVP_ERR_NOMEM;
}

static void idmap_fini(struct idmap *m)
{
    free(m->keys);
    free(m->vals);
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* Dense index of id, inserting it (index = number of ids seen so far) when new. */
static uint32_t idmap_get(struct idmap *m, uint64_t id, bool *fresh)
{
    size_t mask = m->cap - 1;
    size_t h = (size_t)mix64(id) & mask;
    for (;;) {
        if (m->keys[h] == id + 1) {
            *fresh = false;
            return m->vals[h];
        }
        if (m->keys[h] == 0) {
            m->keys[h] = id + 1;
            m->vals[h] = (uint32_t)m->n++;
            *fresh = true;
            return m->vals[h];
        }
        h = (h + 1) & mask;
    }
}

static size_t count_refs(const struct bench_trace *t, size_t n)
{
    size_t refs = 0;
    for (size_t i = 0; i < n; i++)
        refs += t->reqs[i].nblocks;
    return refs;
}

int bench_bound_infinite(const struct bench_trace *t, size_t n, uint32_t block_tokens,
                         bool req_hits, struct bench_bound *out)
{
    memset(out, 0, sizeof *out);
    if (n > t->n)
        n = t->n;
    struct idmap m;
    if (idmap_init(&m, count_refs(t, n) + 1))
        goto nomem;
    if (req_hits && !(out->req_hit_blocks = calloc(n ? n : 1, sizeof(uint32_t))))
        goto nomem;
    for (size_t r = 0; r < n; r++) {
        const struct bench_req *q = &t->reqs[r];
        uint32_t hit = 0;
        bool prefix = true;
        for (uint32_t i = 0; i < q->nblocks; i++) {
            bool fresh;
            idmap_get(&m, q->hash_ids[i], &fresh);
            uint32_t tok = bench_block_tokens(q, i, block_tokens);
            if (prefix && !fresh) {
                hit++;
                out->hit_tokens += tok;
            } else {
                prefix = false;
            }
            out->total_tokens += tok;
        }
        out->hit_blocks += hit;
        out->total_blocks += q->nblocks;
        if (out->req_hit_blocks)
            out->req_hit_blocks[r] = hit;
    }
    idmap_fini(&m);
    return 0;
nomem:
    idmap_fini(&m);
    bench_bound_free(out);
    return KVP_ERR_NOMEM;
}

/* LRU list over dense indices; node u is cached iff in_cache[u]. */
struct lru {
    uint32_t *prev, *next;
    uint8_t *in_cache;
    uint32_t head, tail; /* head = most recent; UINT32_MAX = none */
    uint64_t count;
};

#define NIL UINT32_MAX

static void lru_unlink(struct lru *l, uint32_t u)
{
    if (l->prev[u] != NIL)
        l->next[l->prev[u]] = l->next[u];
    else
        l->head = l->next[u];
    if (l->next[u] != NIL)
        l->prev[l->next[u]] = l->prev[u];
    else
        l->tail = l->prev[u];
}

static void lru_push_front(struct lru *l, uint32_t u)
{
    l->prev[u] = NIL;
    l->next[u] = l->head;
    if (l->head != NIL)
        l->prev[l->head] = u;
    l->head = u;
    if (l->tail == NIL)
        l->tail = u;
}

int bench_bound_lru(const struct bench_trace *t, size_t n, uint32_t block_tokens,
                    uint64_t capacity_tokens, bool req_hits, struct bench_bound *out)
{
    memset(out, 0, sizeof *out);
    if (n > t->n)
        n = t->n;
    if (block_tokens == 0)
        return KVP_ERR_INVALID;
    uint64_t cap_blocks = capacity_tokens / block_tokens;
    size_t refs = count_refs(t, n);
    struct idmap m;
    struct lru l = {.head = NIL, .tail = NIL};
    int rc = KVP_ERR_NOMEM;
    if (idmap_init(&m, refs + 1))
        goto out;
    l.prev = malloc((refs + 1) * sizeof(uint32_t));
    l.next = malloc((refs + 1) * sizeof(uint32_t));
    l.in_cache = calloc(refs + 1, 1);
    if (!l.prev || !l.next || !l.in_cache)
        goto out;
    if (req_hits && !(out->req_hit_blocks = calloc(n ? n : 1, sizeof(uint32_t))))
        goto out;
    for (size_t r = 0; r < n; r++) {
        const struct bench_req *q = &t->reqs[r];
        uint32_t hit = 0;
        bool prefix = true;
        /* Lookup first (the whole prefix is decided before anything of this request is
         * stored), then touch/insert every block in order. */
        for (uint32_t i = 0; i < q->nblocks && prefix; i++) {
            bool fresh;
            uint32_t u = idmap_get(&m, q->hash_ids[i], &fresh);
            if (!fresh && l.in_cache[u]) {
                hit++;
                out->hit_tokens += bench_block_tokens(q, i, block_tokens);
            } else {
                prefix = false;
            }
        }
        for (uint32_t i = 0; i < q->nblocks; i++) {
            out->total_tokens += bench_block_tokens(q, i, block_tokens);
            if (cap_blocks == 0)
                continue;
            bool fresh;
            uint32_t u = idmap_get(&m, q->hash_ids[i], &fresh);
            if (l.in_cache[u]) {
                lru_unlink(&l, u);
            } else {
                l.in_cache[u] = 1;
                l.count++;
            }
            lru_push_front(&l, u);
            while (l.count > cap_blocks) {
                uint32_t v = l.tail;
                lru_unlink(&l, v);
                l.in_cache[v] = 0;
                l.count--;
            }
        }
        out->hit_blocks += hit;
        out->total_blocks += q->nblocks;
        if (out->req_hit_blocks)
            out->req_hit_blocks[r] = hit;
    }
    rc = 0;
out:
    idmap_fini(&m);
    free(l.prev);
    free(l.next);
    free(l.in_cache);
    if (rc)
        bench_bound_free(out);
    return rc;
}

void bench_bound_free(struct bench_bound *b)
{
    if (!b)
        return;
    free(b->req_hit_blocks);
    b->req_hit_blocks = NULL;
}
