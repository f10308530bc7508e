/*
 * evict_sim.c — `kvpool-evict-sim`: replay a Mooncake trace offline through the master's own
 * eviction choice (actors/master/fsm/evict_policy.c) at a given capacity, with the watermark rule of
 * service_evict.c (at `high` × capacity, evict down to (high − ratio) × capacity), for the lru and
 * prefix policies. Prints the prefix hit rate (blocks) of each (docs/eviction.md, Measurements).
 *
 *   kvpool-evict-sim [--trace FILE] [--requests N] --capacity-blocks C[,C...] [--high 0.95] [--ratio 0.05]
 *
 * Same request semantics as `kvpool-bench bounds`: the stored prefix of a request is looked up
 * first (and touched, head first), then its missing blocks are stored; a block that is stored but
 * after the first miss is left as is (a put of it would get EXISTS). Every block costs 1.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/master/fsm/evict_policy.h"
#include "tools/bench/bench_internal.h"

struct map { /* trace hash id + 1 → slot + 1 in `stored` (0 = absent) */
    uint64_t *k;
    uint32_t *v;
    size_t cap;
};

static size_t slot_of(const struct map *m, uint64_t key)
{
    size_t i = (size_t)(key * 0x9E3779B97F4A7C15ull) & (m->cap - 1);
    while (m->k[i] && m->k[i] != key)
        i = (i + 1) & (m->cap - 1);
    return i;
}

struct sim {
    struct map m;
    uint64_t *ids;      /* stored block ids (trace id + 1), dense */
    uint64_t *parent;   /* parent id + 1, or 0 */
    uint64_t *at;       /* last access tick */
    size_t n, cap_blocks;
    uint64_t tick;
};

static uint32_t get(struct sim *s, uint64_t id)
{
    size_t i = slot_of(&s->m, id);
    return s->m.k[i] ? s->m.v[i] : 0;
}

/* Backward-shift deletion keeps probing chains intact. */
static void del(struct map *m, uint64_t key)
{
    size_t i = slot_of(m, key);
    if (!m->k[i])
        return;
    m->k[i] = 0;
    for (size_t j = (i + 1) & (m->cap - 1); m->k[j]; j = (j + 1) & (m->cap - 1)) {
        uint64_t kk = m->k[j];
        uint32_t vv = m->v[j];
        m->k[j] = 0;
        size_t t = slot_of(m, kk);
        m->k[t] = kk;
        m->v[t] = vv;
    }
}

static void put(struct map *m, uint64_t key, uint32_t v)
{
    size_t i = slot_of(m, key);
    m->k[i] = key;
    m->v[i] = v;
}

static void remove_at(struct sim *s, size_t x)
{
    del(&s->m, s->ids[x]);
    size_t last = --s->n;
    if (x != last) {
        s->ids[x] = s->ids[last];
        s->parent[x] = s->parent[last];
        s->at[x] = s->at[last];
        put(&s->m, s->ids[x], (uint32_t)x + 1);
    }
}

static void evict(struct sim *s, int policy, uint64_t target)
{
    struct kvp_evict_cand *c = calloc(s->n, sizeof *c);
    size_t *ch = calloc(s->n, sizeof *ch);
    for (size_t i = 0; i < s->n; i++)
        c[i] = (struct kvp_evict_cand){.hash = s->ids[i], .parent = s->parent[i], .last_access = s->at[i], .size = 1};
    size_t k = kvp_evict_choose(c, s->n, target, policy, true, ch, NULL);
    uint64_t *gone = malloc((k ? k : 1) * sizeof *gone);
    for (size_t j = 0; j < k; j++)
        gone[j] = c[ch[j]].hash;
    for (size_t j = 0; j < k; j++) {
        uint32_t v = get(s, gone[j]);
        if (v)
            remove_at(s, v - 1);
    }
    free(gone);
    free(c);
    free(ch);
}

static double run(const struct bench_trace *t, size_t nreq, size_t cap_blocks, double high, double ratio,
                  int policy, uint64_t *evictions)
{
    struct sim s = {.cap_blocks = cap_blocks};
    s.m.cap = 1;
    while (s.m.cap < cap_blocks * 4 + 16)
        s.m.cap <<= 1;
    s.m.k = calloc(s.m.cap, sizeof *s.m.k);
    s.m.v = calloc(s.m.cap, sizeof *s.m.v);
    s.ids = calloc(cap_blocks + 1, sizeof *s.ids);
    s.parent = calloc(cap_blocks + 1, sizeof *s.parent);
    s.at = calloc(cap_blocks + 1, sizeof *s.at);
    uint64_t hits = 0, total = 0;
    size_t hi = (size_t)(high * (double)cap_blocks), lo = (size_t)((high - ratio) * (double)cap_blocks);
    if (hi < 1)
        hi = 1;
    *evictions = 0;
    for (size_t r = 0; r < nreq && r < t->n; r++) {
        const struct bench_req *q = &t->reqs[r];
        uint32_t hit = 0;
        while (hit < q->nblocks && get(&s, q->hash_ids[hit] + 1))
            hit++;
        for (uint32_t i = 0; i < hit; i++)
            s.at[get(&s, q->hash_ids[i] + 1) - 1] = ++s.tick;
        hits += hit;
        total += q->nblocks;
        for (uint32_t i = hit; i < q->nblocks; i++) {
            uint64_t id = q->hash_ids[i] + 1;
            if (get(&s, id))
                continue;
            if (s.n >= hi) { /* at the watermark: one eviction step */
                evict(&s, policy, s.n - lo > 0 ? s.n - lo : 1);
                (*evictions)++;
            }
            if (s.n >= cap_blocks)
                continue; /* no space (cannot happen with high <= 1) */
            s.ids[s.n] = id;
            s.parent[s.n] = i > 0 ? q->hash_ids[i - 1] + 1 : 0;
            s.at[s.n] = ++s.tick;
            put(&s.m, id, (uint32_t)s.n + 1);
            s.n++;
        }
    }
    free(s.m.k);
    free(s.m.v);
    free(s.ids);
    free(s.parent);
    free(s.at);
    return total ? (double)hits / (double)total : 0.0;
}

int main(int argc, char **argv)
{
    const char *trace = "../shared/data/traces/conversation_trace.jsonl";
    size_t nreq = 0;
    double high = 0.95, ratio = 0.05;
    char caps[256] = "";
    static const struct option lo[] = {{"trace", 1, 0, 't'}, {"requests", 1, 0, 'n'}, {"capacity-blocks", 1, 0, 'c'},
                                       {"high", 1, 0, 'h'},  {"ratio", 1, 0, 'r'},    {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 't': trace = optarg; break;
        case 'n': nreq = strtoull(optarg, NULL, 10); break;
        case 'c': snprintf(caps, sizeof caps, "%s", optarg); break;
        case 'h': high = strtod(optarg, NULL); break;
        case 'r': ratio = strtod(optarg, NULL); break;
        default:
            fprintf(stderr, "usage: kvpool-evict-sim [--trace FILE] [--requests N] --capacity-blocks C[,C...] "
                            "[--high 0.95] [--ratio 0.05]\n");
            return 2;
        }
    }
    if (!caps[0] || high <= 0 || high > 1 || ratio < 0 || ratio >= high) {
        fprintf(stderr, "kvpool-evict-sim: --capacity-blocks required; 0 <= ratio < high <= 1\n");
        return 2;
    }
    struct bench_trace t;
    size_t errline = 0;
    char err[256] = "";
    if (bench_trace_load(trace, nreq, &t, &errline, err, sizeof err) != 0) {
        fprintf(stderr, "kvpool-evict-sim: %s: line %zu: %s\n", trace, errline, err);
        return 1;
    }
    printf("trace %s: %zu requests; watermark %.2f, step %.2f\n", trace, t.n, high, ratio);
    printf("%-16s %12s %12s %12s\n", "capacity blocks", "lru", "prefix", "evict rounds");
    for (char *save = NULL, *tok = strtok_r(caps, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        size_t cap = strtoull(tok, NULL, 10);
        uint64_t e1 = 0, e2 = 0;
        double a = run(&t, t.n, cap, high, ratio, KVP_EVICT_LRU, &e1);
        double b = run(&t, t.n, cap, high, ratio, KVP_EVICT_PREFIX, &e2);
        printf("%-16zu %11.2f%% %11.2f%% %6llu/%llu\n", cap, 100 * a, 100 * b, (unsigned long long)e1,
               (unsigned long long)e2);
    }
    bench_trace_free(&t);
    return 0;
}
