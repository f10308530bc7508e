/*
 * bench_trace.c — `kvpool-bench trace FILE`: replay a Mooncake trace against a cluster as a
 * fleet of inference servers would, verify every byte loaded, and report hit rate, bytes,
 * throughput, latencies and errors next to the offline bounds (bench_bounds.c).
 * `kvpool-bench bounds FILE`: the offline bounds alone (no cluster).
 *
 * Each simulated instance is a thread with its own kvp_client: real inference servers are
 * separate processes, each with its own client (own master session, own data connections), and
 * several clients racing to store the same block is exactly what a fleet does (EXISTS).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvpool_hint.h"
#include "tools/bench/bench_internal.h"

/* KV bytes per token = layers x 2 (K and V) x kv_heads x head_dim x bytes per element (bf16 = 2).
 * Figures from each model's config.json on Hugging Face (num_hidden_layers,
 * num_key_value_heads, hidden_size / num_attention_heads, torch_dtype bfloat16). */
static const struct model {
    const char *name;
    unsigned layers, kv_heads, head_dim, elem_bytes;
    const char *source;
} models[] = {
    {"llama-3.1-8b", 32, 8, 128, 2, "https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json"},
    {"qwen2.5-7b", 28, 4, 128, 2, "https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json"},
    {"qwen2.5-0.5b", 24, 2, 64, 2, "https://huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json"},
};

#define DEFAULT_KV_BYTES_PER_TOKEN 64 /* 32 KiB per 512-token block: a scaled-down KV cache */
#define DEFAULT_MAX_BUFFER (256u << 20)

struct opts {
    const char *trace;
    size_t requests;
    unsigned instances;
    double speedup; /* 0 = as fast as possible */
    uint64_t kv_bytes_per_token;
    const char *model;
    uint32_t block_tokens;
    uint32_t replicas;
    uint32_t timeout_ms;
    uint64_t pool_bytes;
    uint64_t lru_tokens;
    uint64_t max_buffer;
    const char *json;
    const char *plot;
    const char *progress_file;
    const char *events;
    bool quiet;
    struct bench_target target;
};

/* What one request did (written by the one instance that ran it). */
struct req_rec {
    uint32_t hit_blocks;
    uint32_t hit_tokens;
    uint64_t start_us, end_us; /* relative to the replay's start */
    uint8_t done, failed;
};

struct shared {
    const struct opts *o;
    const struct bench_trace *t;
    size_t n;
    uint64_t block_bytes;
    uint64_t start_us;
    atomic_size_t next;
    atomic_size_t done;
    atomic_uint_fast64_t p_blocks, p_hit, p_corrupt, p_failed;
    atomic_int stop;
    struct req_rec *rec;
};

struct inst {
    struct shared *sh;
    unsigned id;
    kvp_client *c;
    unsigned char *buf;
    size_t slots; /* blocks that fit in buf */
    pthread_t th;
    int open_rc;
    /* results */
    struct bench_lat lat_get, lat_put, lat_exists;
    struct bench_errs err_get, err_put, err_exists;
    uint64_t blocks, hit_blocks, tokens, hit_tokens;
    uint64_t bytes_got, bytes_put, blocks_got, blocks_put, blocks_put_exists, blocks_no_space;
    uint64_t corrupt, size_mismatch, miss_after_exists, failed;
};

static atomic_int g_interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    atomic_store(&g_interrupted, 1);
}

static bool tolerated(int code)
{
    return code == KVP_ERR_NOT_FOUND || code == KVP_ERR_EXISTS || code == KVP_ERR_NO_SPACE;
}

static void sleep_until_us(uint64_t t)
{
    for (;;) {
        uint64_t now = bench_now_us();
        if (now >= t)
            return;
        uint64_t d = t - now;
        if (d > 200000)
            d = 200000;
        struct timespec ts = {(time_t)(d / 1000000), (long)(d % 1000000) * 1000};
        nanosleep(&ts, NULL);
        return;
    }
}

/* Run one request; returns true when it failed (definition in docs/bench.md). */
static bool run_request(struct inst *in, const struct bench_req *q, struct req_rec *rec)
{
    struct shared *sh = in->sh;
    const struct opts *o = sh->o;
    uint32_t n = q->nblocks;
    uint64_t bb = sh->block_bytes;
    bool failed = false;
    char (*keys)[32] = malloc((size_t)n * 32);
    const char **kp = malloc(n * sizeof *kp);
    int *ex = malloc(n * sizeof *ex);
    int64_t *gres = malloc(n * sizeof *gres);
    int *pres = malloc(n * sizeof *pres);
    void **bufs = malloc(n * sizeof *bufs);
    size_t *lens = malloc(n * sizeof *lens);
    if (!keys || !kp || !ex || !gres || !pres || !bufs || !lens) {
        failed = true;
        goto out;
    }
    for (uint32_t i = 0; i < n; i++) {
        snprintf(keys[i], 32, "blk-%llu", (unsigned long long)q->hash_ids[i]);
        kp[i] = keys[i];
        lens[i] = (size_t)bench_block_tokens(q, i, o->block_tokens) * o->kv_bytes_per_token;
        in->tokens += bench_block_tokens(q, i, o->block_tokens);
    }
    in->blocks += n;

    /* 1. Lookup: which prefix is stored? */
    uint64_t t0 = bench_now_us();
    int rc = kvp_batch_exists(in->c, n, kp, ex);
    bench_lat_add(&in->lat_exists, bench_now_us() - t0);
    uint32_t p = 0;
    if (rc < 0) {
        bench_errs_add(&in->err_exists, rc);
        failed = true;
        goto out; /* cannot tell what is stored: nothing else is meaningful */
    }
    for (uint32_t i = 0; i < n; i++) {
        if (ex[i] < 0) {
            bench_errs_add(&in->err_exists, ex[i]);
            if (!tolerated(ex[i]))
                failed = true;
        }
    }
    while (p < n && ex[p] == 1)
        p++;

    /* 2. Load the stored prefix, chunk by chunk (a chunk = the blocks that fit the registered
     * buffer), verifying every byte. The usable prefix ends at the first block not loaded. */
    uint32_t hit = 0;
    bool broken = false;
    for (uint32_t c0 = 0; c0 < p && !broken; c0 += (uint32_t)in->slots) {
        uint32_t cn = p - c0 < in->slots ? p - c0 : (uint32_t)in->slots;
        size_t caps[cn];
        for (uint32_t j = 0; j < cn; j++) {
            bufs[j] = in->buf + (size_t)j * bb;
            caps[j] = bb;
            memset(bufs[j], 0xA5, lens[c0 + j]); /* poison: an OK slot left unwritten fails */
        }
        t0 = bench_now_us();
        rc = kvp_batch_get(in->c, cn, kp + c0, bufs, caps, o->timeout_ms, gres + c0);
        bench_lat_add(&in->lat_get, bench_now_us() - t0);
        if (rc < 0) {
            bench_errs_add(&in->err_get, rc);
            failed = true;
            broken = true;
            break;
        }
        for (uint32_t j = 0; j < cn; j++) {
            uint32_t i = c0 + j;
            int64_t r = gres[i];
            if (r < 0) {
                bench_errs_add(&in->err_get, (int)r);
                if (r == KVP_ERR_NOT_FOUND)
                    in->miss_after_exists++;
                else
                    failed = true;
                broken = true;
                continue;
            }
            in->blocks_got++;
            in->bytes_got += (uint64_t)r;
            size_t chk = (size_t)r < bb ? (size_t)r : bb;
            int64_t bad = bench_pattern_check(bufs[j], chk, q->hash_ids[i]);
            if (bad >= 0) {
                in->corrupt++;
                atomic_fetch_add(&sh->p_corrupt, 1);
                fprintf(stderr, "\nkvpool-bench: CORRUPT block %s: byte %lld of %lld differs\n",
                        keys[i], (long long)bad, (long long)r);
                broken = true;
            } else if ((size_t)r != lens[i]) {
                in->size_mismatch++;
                broken = true;
            }
            if (!broken)
                hit = i + 1;
        }
    }
    in->hit_blocks += hit;
    uint32_t hit_tok = 0;
    for (uint32_t i = 0; i < hit; i++)
        hit_tok += bench_block_tokens(q, i, o->block_tokens);
    in->hit_tokens += hit_tok;
    rec->hit_blocks = hit;
    rec->hit_tokens = hit_tok;

    /* 3. Store what had to be computed (prefill of blocks hit..n-1). Each block names the block
     * before it as its parent (kvpool_hint.h; used by eviction_policy = prefix). */
    kvp_put_opts po = {.replica_num = o->replicas, .timeout_ms = o->timeout_ms};
    for (uint32_t c0 = hit; c0 < n; c0 += (uint32_t)in->slots) {
        uint32_t cn = n - c0 < in->slots ? n - c0 : (uint32_t)in->slots;
        const void *pb[cn];
        const char *parents[cn];
        for (uint32_t j = 0; j < cn; j++) {
            bench_pattern_fill(in->buf + (size_t)j * bb, lens[c0 + j], q->hash_ids[c0 + j]);
            pb[j] = in->buf + (size_t)j * bb;
            parents[j] = c0 + j > 0 ? kp[c0 + j - 1] : NULL;
        }
        t0 = bench_now_us();
        rc = kvp_batch_put_hinted(in->c, cn, kp + c0, pb, lens + c0, parents, &po, pres + c0);
        bench_lat_add(&in->lat_put, bench_now_us() - t0);
        if (rc < 0) {
            bench_errs_add(&in->err_put, rc);
            failed = true;
            break;
        }
        for (uint32_t j = 0; j < cn; j++) {
            int r = pres[c0 + j];
            if (r == KVP_OK) {
                in->blocks_put++;
                in->bytes_put += lens[c0 + j];
                continue;
            }
            bench_errs_add(&in->err_put, r);
            if (r == KVP_ERR_EXISTS)
                in->blocks_put_exists++;
            else if (r == KVP_ERR_NO_SPACE)
                in->blocks_no_space++;
            else if (!tolerated(r))
                failed = true;
        }
    }
out:
    atomic_fetch_add(&sh->p_blocks, n);
    atomic_fetch_add(&sh->p_hit, rec->hit_blocks);
    free(keys);
    free(kp);
    free(ex);
    free(gres);
    free(pres);
    free(bufs);
    free(lens);
    return failed;
}

static void *inst_main(void *arg)
{
    struct inst *in = arg;
    struct shared *sh = in->sh;
    for (;;) {
        if (atomic_load(&sh->stop) || atomic_load(&g_interrupted))
            break;
        size_t i = atomic_fetch_add(&sh->next, 1);
        if (i >= sh->n)
            break;
        const struct bench_req *q = &sh->t->reqs[i];
        if (sh->o->speedup > 0) {
            uint64_t at = sh->start_us + (uint64_t)((double)q->ts_ms * 1000.0 / sh->o->speedup);
            while (bench_now_us() < at && !atomic_load(&g_interrupted))
                sleep_until_us(at);
        }
        sh->rec[i].start_us = bench_now_us() - sh->start_us;
        bool f = run_request(in, q, &sh->rec[i]);
        sh->rec[i].end_us = bench_now_us() - sh->start_us;
        sh->rec[i].failed = f;
        sh->rec[i].done = 1;
        if (f) {
            in->failed++;
            atomic_fetch_add(&sh->p_failed, 1);
        }
        atomic_fetch_add(&sh->done, 1);
    }
    return NULL;
}

static void write_progress_file(const char *path, size_t done, size_t total)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    fprintf(f, "%zu %zu\n", done, total);
    fclose(f);
    rename(tmp, path);
}

static void usage_trace(void)
{
    fprintf(stderr,
            "usage: kvpool-bench trace [FILE] [--trace FILE] [--cluster DIR/cluster.json | --masters LIST]\n"
            "         [--instances N] [--requests N] [--speedup X|max] [--replicas R]\n"
            "         [--kv-bytes-per-token N | --model NAME] [--block-tokens 512]\n"
            "         [--pool-bytes SIZE] [--lru-capacity-tokens N] [--timeout-ms MS]\n"
            "         [--max-buffer SIZE] [--json FILE|-] [--plot DIR [--events FILE]] [--progress-file FILE]\n"
            "         [--quiet]\n"
            "       kvpool-bench bounds [FILE] [--requests N] [--capacity-tokens N,...]\n"
            "       kvpool-bench models\n"
            "See docs/bench.md.\n");
}

/* The trace next to the repository: <repo>/../shared/data/traces/conversation_trace.jsonl. */
static const char *default_trace(void)
{
    static char path[4096];
    const char *cands[] = {"../shared/data/traces/conversation_trace.jsonl",
                           "../../shared/data/traces/conversation_trace.jsonl",
                           "/work/shared/data/traces/conversation_trace.jsonl"};
    const char *src = getenv("KVP_SOURCE_DIR");
    if (src) {
        snprintf(path, sizeof path, "%s/../shared/data/traces/conversation_trace.jsonl", src);
        if (access(path, R_OK) == 0)
            return path;
    }
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++)
        if (access(cands[i], R_OK) == 0)
            return cands[i];
    return NULL;
}

int bench_models_main(void)
{
    printf("%-14s %6s %8s %8s %5s %14s  %s\n", "model", "layers", "kv_heads", "head_dim", "bytes",
           "KV B/token", "source");
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        const struct model *m = &models[i];
        printf("%-14s %6u %8u %8u %5u %14u  %s\n", m->name, m->layers, m->kv_heads, m->head_dim,
               m->elem_bytes, m->layers * 2 * m->kv_heads * m->head_dim * m->elem_bytes, m->source);
    }
    return 0;
}

static int load_trace(const char *path, size_t limit, struct bench_trace *t)
{
    size_t line = 0;
    char err[256] = "";
    int rc = bench_trace_load(path, limit, t, &line, err, sizeof err);
    if (rc) {
        if (line)
            fprintf(stderr, "kvpool-bench: %s:%zu: %s\n", path, line, err);
        else
            fprintf(stderr, "kvpool-bench: %s\n", err);
    } else if (t->n == 0) {
        fprintf(stderr, "kvpool-bench: %s: no requests\n", path);
        rc = KVP_ERR_INVALID;
    }
    return rc;
}

/* `kvpool-bench bounds FILE`: offline bounds only. */
int bench_bounds_main(int argc, char **argv)
{
    const char *trace = NULL, *caps = "375000,3000000,10000000,50000000";
    size_t requests = 0;
    uint32_t block_tokens = 512;
    static const struct option lo[] = {{"trace", 1, 0, 't'}, {"requests", 1, 0, 'n'},
                                       {"capacity-tokens", 1, 0, 'c'}, {"block-tokens", 1, 0, 'b'},
                                       {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 't': trace = optarg; break;
        case 'n': requests = strtoull(optarg, NULL, 10); break;
        case 'c': caps = optarg; break;
        case 'b': block_tokens = (uint32_t)strtoul(optarg, NULL, 10); break;
        default: usage_trace(); return 2;
        }
    }
    if (optind < argc)
        trace = argv[optind];
    if (!trace)
        trace = default_trace();
    if (!trace || block_tokens == 0) {
        usage_trace();
        return 2;
    }
    struct bench_trace t;
    if (load_trace(trace, requests, &t))
        return 1;
    struct bench_bound inf;
    if (bench_bound_infinite(&t, t.n, block_tokens, false, &inf)) {
        bench_trace_free(&t);
        return 1;
    }
    printf("trace %s: %zu requests, %llu block refs\n", trace, t.n, (unsigned long long)inf.total_blocks);
    printf("%-22s %12s %10s %10s\n", "cache", "hit blocks", "blocks", "tokens");
    printf("%-22s %12llu %9.2f%% %9.2f%%\n", "infinite", (unsigned long long)inf.hit_blocks,
           100.0 * (double)inf.hit_blocks / (double)inf.total_blocks,
           100.0 * (double)inf.hit_tokens / (double)inf.total_tokens);
    char *dup = strdup(caps);
    for (char *s = NULL, *tok = strtok_r(dup, ",", &s); tok; tok = strtok_r(NULL, ",", &s)) {
        uint64_t cap = strtoull(tok, NULL, 10);
        struct bench_bound l;
        if (bench_bound_lru(&t, t.n, block_tokens, cap, false, &l))
            continue;
        char name[64];
        snprintf(name, sizeof name, "LRU %llu tokens", (unsigned long long)cap);
        printf("%-22s %12llu %9.2f%% %9.2f%%\n", name, (unsigned long long)l.hit_blocks,
               100.0 * (double)l.hit_blocks / (double)l.total_blocks,
               100.0 * (double)l.hit_tokens / (double)l.total_tokens);
    }
    free(dup);
    bench_bound_free(&inf);
    bench_trace_free(&t);
    return 0;
}

static json_t *lat_json(struct bench_lat *l)
{
    return json_pack("{s:I,s:I,s:I,s:I,s:I}", "n", (json_int_t)l->n, "p50",
                     (json_int_t)bench_lat_pct(l, 0.5), "p90", (json_int_t)bench_lat_pct(l, 0.9),
                     "p99", (json_int_t)bench_lat_pct(l, 0.99), "max",
                     (json_int_t)bench_lat_pct(l, 1.0));
}

static json_t *errs_json(const struct bench_errs *e)
{
    json_t *o = json_object();
    for (int i = 1; i < BENCH_NCODES; i++)
        if (e->n[i])
            json_object_set_new(o, kvp_errname(-i), json_integer((json_int_t)e->n[i]));
    return o;
}

/* Latency CDF data: at most ~2000 points of (ms, fraction). */
static void write_cdf(const char *path, const struct bench_lat *l)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    size_t step = l->n > 2000 ? l->n / 2000 : 1;
    for (size_t i = 0; i < l->n; i += step)
        fprintf(f, "%.3f %.5f\n", l->us[i] / 1000.0, (double)(i + 1) / (double)l->n);
    if (l->n)
        fprintf(f, "%.3f 1.0\n", l->us[l->n - 1] / 1000.0);
    fclose(f);
}

static int run_gnuplot(const char *script)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        execlp("gnuplot", "gnuplot", script, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool has_pngcairo(void)
{
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execlp("gnuplot", "gnuplot", "-e", "set terminal pngcairo", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* Writes DIR/hit_rate.png and DIR/latency_cdf.png (and their .dat/.gp); returns 0 on success. */
/* --events FILE: lines "REQUEST_INDEX LABEL" (e.g. "1508 leader-kill"), drawn as vertical lines. */
static void plot_events(FILE *f, const char *events, size_t n, const struct req_rec *rec, bool by_time)
{
    FILE *e = events ? fopen(events, "r") : NULL;
    char line[256];
    int k = 0;
    while (e && fgets(line, sizeof line, e) && k < 20) {
        unsigned long long idx;
        char label[64] = "event";
        if (sscanf(line, "%llu %63s", &idx, label) < 1 || idx >= n)
            continue;
        for (char *c = label; *c; c++)
            if (*c == '\'' || *c == '_')
                *c = '-';
        double x = by_time ? (double)rec[idx].start_us / 1e6 : (double)idx;
        fprintf(f, "set arrow %d from %.3f, graph 0 to %.3f, graph 1 nohead lc rgb 'red' dt 4\n", k + 1, x, x);
        fprintf(f, "set label %d '%s' at %.3f, graph 0.97 right offset -0.5,0 tc rgb 'red'\n", k + 1, label, x);
        k++;
    }
    if (e)
        fclose(e);
}

static int make_plots(const char *dir, size_t n, const struct req_rec *rec, const struct bench_trace *t,
                      const struct bench_bound *inf, const struct bench_bound *lru,
                      const struct bench_lat *lg, const struct bench_lat *lp, const char *events, json_t *paths)
{
    mkdir(dir, 0755);
    char p[4096];
    snprintf(p, sizeof p, "%s/hit_rate.dat", dir);
    FILE *f = fopen(p, "w");
    if (!f) {
        fprintf(stderr, "kvpool-bench: --plot %s: %s\n", dir, strerror(errno));
        return -1;
    }
    /* Columns: request, cumulative measured/infinite/LRU, windowed measured/infinite/LRU. */
    size_t win = n >= 2000 ? 100 : (n >= 200 ? n / 20 : 10);
    uint64_t cb = 0, cm = 0, ci = 0, cl = 0;
    uint64_t *wb = calloc(n + 1, 8), *wm = calloc(n + 1, 8), *wi = calloc(n + 1, 8), *wl = calloc(n + 1, 8);
    for (size_t i = 0; wb && wm && wi && wl && i < n; i++) {
        cb += t->reqs[i].nblocks;
        cm += rec[i].hit_blocks;
        ci += inf->req_hit_blocks[i];
        cl += lru->req_hit_blocks[i];
        wb[i + 1] = cb, wm[i + 1] = cm, wi[i + 1] = ci, wl[i + 1] = cl;
        size_t a = i + 1 > win ? i + 1 - win : 0;
        double db = (double)(wb[i + 1] - wb[a]);
        fprintf(f, "%zu %.5f %.5f %.5f %.5f %.5f %.5f\n", i + 1, (double)cm / (double)cb,
                (double)ci / (double)cb, (double)cl / (double)cb, (double)(wm[i + 1] - wm[a]) / db,
                (double)(wi[i + 1] - wi[a]) / db, (double)(wl[i + 1] - wl[a]) / db);
    }
    free(wb), free(wm), free(wi), free(wl);
    fclose(f);
    snprintf(p, sizeof p, "%s/requests.dat", dir);
    f = fopen(p, "w");
    if (!f)
        return -1;
    /* Columns: request, start s, duration ms, hit blocks, blocks, failed. */
    for (size_t i = 0; i < n; i++)
        if (rec[i].done)
            fprintf(f, "%zu %.4f %.3f %u %u %u\n", i, (double)rec[i].start_us / 1e6,
                    (double)(rec[i].end_us - rec[i].start_us) / 1e3, rec[i].hit_blocks, t->reqs[i].nblocks,
                    rec[i].failed);
    fclose(f);
    snprintf(p, sizeof p, "%s/batch_get_cdf.dat", dir);
    write_cdf(p, lg);
    snprintf(p, sizeof p, "%s/batch_put_cdf.dat", dir);
    write_cdf(p, lp);
    snprintf(p, sizeof p, "%s/plots.gp", dir);
    f = fopen(p, "w");
    if (!f)
        return -1;
    const char *term = has_pngcairo() ? "pngcairo size 1000,600" : "png size 1000,600";
    fprintf(f,
            "set terminal %s\n"
            "set output '%s/hit_rate.png'\n"
            "set title 'Prefix hit rate (blocks) over the replay'\n"
            "set xlabel 'requests replayed (arrival order)'\nset ylabel 'hit rate'\n"
            "set yrange [0:1]\nset key left top\nset grid\n",
            term, dir);
    plot_events(f, events, n, rec, false);
    fprintf(f,
            "plot '%s/hit_rate.dat' u 1:2 w l lw 2 t 'measured (cumulative)', "
            "'' u 1:3 w l lw 2 dt 2 t 'infinite cache (cumulative)', "
            "'' u 1:4 w l lw 2 dt 3 t 'LRU same capacity (cumulative)', "
            "'' u 1:5 w l lw 1 lc rgb '#80a0a0a0' t 'measured (window of %zu)'\n"
            "unset arrow\nunset label\n"
            "set output '%s/request_latency.png'\n"
            "set title 'Request latency (exists + get + put) over the replay'\n"
            "set xlabel 'time since start (s)'\nset ylabel 'request latency (ms, log scale)'\n"
            "set autoscale y\nset logscale y\nset key right top\n",
            dir, win, dir);
    plot_events(f, events, n, rec, true);
    fprintf(f,
            "plot '%s/requests.dat' u 2:3 w p pt 7 ps 0.3 t 'one request'\n"
            "unset arrow\nunset label\nunset logscale y\n"
            "set output '%s/latency_cdf.png'\n"
            "set title 'Latency CDF'\nset xlabel 'latency (ms, log scale)'\nset ylabel 'fraction of calls'\n"
            "set logscale x\nset key right bottom\nset yrange [0:1]\n",
            dir, dir);
    int have_get = lg->n > 0, have_put = lp->n > 0;
    if (have_get || have_put) {
        fprintf(f, "plot ");
        if (have_get)
            fprintf(f, "'%s/batch_get_cdf.dat' u 1:2 w l lw 2 t 'batch\\_get'%s", dir, have_put ? ", " : "");
        if (have_put)
            fprintf(f, "'%s/batch_put_cdf.dat' u 1:2 w l lw 2 t 'batch\\_put'", dir);
        fprintf(f, "\n");
    }
    fclose(f);
    int rc = run_gnuplot(p);
    if (rc != 0) {
        fprintf(stderr, "kvpool-bench: gnuplot %s failed (%d)\n", p, rc);
        return -1;
    }
    snprintf(p, sizeof p, "%s/hit_rate.png", dir);
    json_array_append_new(paths, json_string(p));
    snprintf(p, sizeof p, "%s/request_latency.png", dir);
    json_array_append_new(paths, json_string(p));
    if (have_get || have_put) {
        snprintf(p, sizeof p, "%s/latency_cdf.png", dir);
        json_array_append_new(paths, json_string(p));
    }
    return 0;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
    static const struct option lo[] = {
        {"trace", 1, 0, 't'},          {"requests", 1, 0, 'n'},      {"instances", 1, 0, 'i'},
        {"speedup", 1, 0, 's'},        {"kv-bytes-per-token", 1, 0, 'k'}, {"model", 1, 0, 'm'},
        {"block-tokens", 1, 0, 'b'},   {"replicas", 1, 0, 'r'},      {"timeout-ms", 1, 0, 'T'},
        {"pool-bytes", 1, 0, 'P'},     {"lru-capacity-tokens", 1, 0, 'L'}, {"json", 1, 0, 'j'},
        {"plot", 1, 0, 'p'},           {"progress-file", 1, 0, 'F'}, {"quiet", 0, 0, 'q'},
        {"cluster", 1, 0, 'c'},        {"masters", 1, 0, 'M'},       {"config", 1, 0, 'C'},
        {"max-buffer", 1, 0, 'B'},     {"events", 1, 0, 'E'},        {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        char *end = NULL;
        switch (ch) {
        case 't': o->trace = optarg; break;
        case 'n': o->requests = strtoull(optarg, &end, 10); break;
        case 'i': o->instances = (unsigned)strtoul(optarg, &end, 10); break;
        case 's':
            if (!strcasecmp(optarg, "max"))
                o->speedup = 0;
            else
                o->speedup = strtod(optarg, &end);
            if (o->speedup < 0)
                return -1;
            break;
        case 'k':
            if (bench_parse_size(optarg, &o->kv_bytes_per_token) || !o->kv_bytes_per_token) {
                fprintf(stderr, "kvpool-bench: bad --kv-bytes-per-token %s\n", optarg);
                return -1;
            }
            break;
        case 'm': o->model = optarg; break;
        case 'b': o->block_tokens = (uint32_t)strtoul(optarg, &end, 10); break;
        case 'r': o->replicas = (uint32_t)strtoul(optarg, &end, 10); break;
        case 'T': o->timeout_ms = (uint32_t)strtoul(optarg, &end, 10); break;
        case 'P':
            if (bench_parse_size(optarg, &o->pool_bytes))
                return -1;
            break;
        case 'L': o->lru_tokens = strtoull(optarg, &end, 10); break;
        case 'B':
            if (bench_parse_size(optarg, &o->max_buffer) || !o->max_buffer)
                return -1;
            break;
        case 'j': o->json = optarg; break;
        case 'p': o->plot = optarg; break;
        case 'F': o->progress_file = optarg; break;
        case 'E': o->events = optarg; break;
        case 'q': o->quiet = true; break;
        case 'c': o->target.cluster_file = optarg; break;
        case 'M': o->target.masters = optarg; break;
        case 'C': o->target.config_file = optarg; break;
        default: return -1;
        }
        if (end && *end) {
            fprintf(stderr, "kvpool-bench: bad number '%s'\n", optarg);
            return -1;
        }
    }
    if (optind < argc)
        o->trace = argv[optind++];
    if (optind < argc)
        return -1;
    if (o->model) {
        const struct model *m = NULL;
        for (size_t i = 0; i < sizeof models / sizeof *models; i++)
            if (!strcasecmp(models[i].name, o->model))
                m = &models[i];
        if (!m) {
            fprintf(stderr, "kvpool-bench: unknown --model %s (kvpool-bench models lists them)\n", o->model);
            return -1;
        }
        o->kv_bytes_per_token = (uint64_t)m->layers * 2 * m->kv_heads * m->head_dim * m->elem_bytes;
    }
    if (!o->trace)
        o->trace = default_trace();
    if (!o->trace) {
        fprintf(stderr, "kvpool-bench: no trace given and ../shared/data/traces/conversation_trace.jsonl not found\n");
        return -1;
    }
    if (o->instances == 0 || o->instances > 256 || o->block_tokens == 0) {
        fprintf(stderr, "kvpool-bench: --instances must be 1..256, --block-tokens >= 1\n");
        return -1;
    }
    if (!o->target.cluster_file && !o->target.masters && !o->target.config_file) {
        fprintf(stderr, "kvpool-bench: give --cluster DIR/cluster.json or --masters host:port,...\n");
        return -1;
    }
    return 0;
}

int bench_trace_main(int argc, char **argv)
{
    struct opts o = {.instances = 4, .speedup = 0, .kv_bytes_per_token = DEFAULT_KV_BYTES_PER_TOKEN,
                     .block_tokens = 512, .max_buffer = DEFAULT_MAX_BUFFER};
    if (parse_opts(argc, argv, &o)) {
        usage_trace();
        return 2;
    }
    struct bench_trace t;
    if (load_trace(o.trace, o.requests, &t))
        return 1;
    size_t n = t.n;
    uint64_t bb = (uint64_t)o.block_tokens * o.kv_bytes_per_token;

    /* Pool capacity, for the LRU bound at the same capacity. */
    uint64_t cap_bytes = o.pool_bytes, used_bytes = 0;
    if (!cap_bytes) {
        int rc = bench_cluster_capacity(&o.target, &cap_bytes, &used_bytes);
        if (rc) {
            fprintf(stderr, "kvpool-bench: ClusterStatus: %s (use --pool-bytes)\n", kvp_errname(rc));
            cap_bytes = 0;
        }
    }
    uint32_t r_eff = o.replicas ? o.replicas : 1;
    uint64_t pool_tokens = cap_bytes / o.kv_bytes_per_token;
    uint64_t lru_tokens = o.lru_tokens ? o.lru_tokens : pool_tokens / r_eff;

    struct shared sh = {.o = &o, .t = &t, .n = n, .block_bytes = bb};
    sh.rec = calloc(n, sizeof *sh.rec);
    struct inst *ins = calloc(o.instances, sizeof *ins);
    if (!sh.rec || !ins) {
        fprintf(stderr, "kvpool-bench: out of memory\n");
        return 1;
    }
    size_t slots = t.max_blocks;
    if ((uint64_t)slots * bb > o.max_buffer)
        slots = o.max_buffer / bb ? (size_t)(o.max_buffer / bb) : 1;
    int exit_code = 0;
    for (unsigned i = 0; i < o.instances; i++) {
        ins[i].sh = &sh;
        ins[i].id = i;
        ins[i].slots = slots;
        ins[i].buf = aligned_alloc(4096, ((size_t)slots * bb + 4095) / 4096 * 4096);
        if (!ins[i].buf) {
            fprintf(stderr, "kvpool-bench: cannot allocate %zu x %llu bytes\n", slots, (unsigned long long)bb);
            return 1;
        }
        int rc = bench_client_open(&o.target, &ins[i].c);
        if (rc) {
            exit_code = 1;
            goto cleanup;
        }
        rc = kvp_register_buffer(ins[i].c, ins[i].buf, (size_t)slots * bb);
        if (rc) {
            fprintf(stderr, "kvpool-bench: register_buffer: %s\n", kvp_errname(rc));
            exit_code = 1;
            goto cleanup;
        }
    }

    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (!o.quiet)
        fprintf(stderr, "kvpool-bench: replaying %zu requests of %s with %u instances, %llu B/token "
                        "(%llu B/block), replicas %u, speedup %s\n",
                n, o.trace, o.instances, (unsigned long long)o.kv_bytes_per_token,
                (unsigned long long)bb, o.replicas, o.speedup > 0 ? "scaled" : "max");
    sh.start_us = bench_now_us();
    for (unsigned i = 0; i < o.instances; i++)
        pthread_create(&ins[i].th, NULL, inst_main, &ins[i]);
    uint64_t last_print = 0;
    for (;;) {
        size_t done = atomic_load(&sh.done);
        uint64_t now = bench_now_us();
        if (o.progress_file)
            write_progress_file(o.progress_file, done, n);
        bool finished = done >= n || atomic_load(&g_interrupted);
        if (!o.quiet && (now - last_print >= 1000000 || done >= n)) {
            double el = (double)(now - sh.start_us) / 1e6;
            uint64_t bl = atomic_load(&sh.p_blocks), hb = atomic_load(&sh.p_hit);
            fprintf(stderr, "\r[trace] %zu/%zu (%3.0f%%) %6.1f req/s  hit %5.1f%%  corrupt %llu  failed %llu  %5.0fs ",
                    done, n, 100.0 * (double)done / (double)n, el > 0 ? (double)done / el : 0,
                    bl ? 100.0 * (double)hb / (double)bl : 0.0,
                    (unsigned long long)atomic_load(&sh.p_corrupt),
                    (unsigned long long)atomic_load(&sh.p_failed), el);
            last_print = now;
        }
        if (finished)
            break;
        usleep(100000);
    }
    for (unsigned i = 0; i < o.instances; i++)
        pthread_join(ins[i].th, NULL);
    uint64_t end_us = bench_now_us();
    if (!o.quiet)
        fprintf(stderr, "\n");
    size_t done = atomic_load(&sh.done);
    if (o.progress_file)
        write_progress_file(o.progress_file, done, n);

    /* Aggregate. */
    struct inst tot = {0};
    for (unsigned i = 0; i < o.instances; i++) {
        struct inst *x = &ins[i];
        bench_lat_merge(&tot.lat_get, &x->lat_get);
        bench_lat_merge(&tot.lat_put, &x->lat_put);
        bench_lat_merge(&tot.lat_exists, &x->lat_exists);
        bench_errs_merge(&tot.err_get, &x->err_get);
        bench_errs_merge(&tot.err_put, &x->err_put);
        bench_errs_merge(&tot.err_exists, &x->err_exists);
        tot.blocks += x->blocks, tot.hit_blocks += x->hit_blocks, tot.tokens += x->tokens;
        tot.hit_tokens += x->hit_tokens, tot.bytes_got += x->bytes_got, tot.bytes_put += x->bytes_put;
        tot.blocks_got += x->blocks_got, tot.blocks_put += x->blocks_put;
        tot.blocks_put_exists += x->blocks_put_exists, tot.blocks_no_space += x->blocks_no_space;
        tot.corrupt += x->corrupt, tot.size_mismatch += x->size_mismatch;
        tot.miss_after_exists += x->miss_after_exists, tot.failed += x->failed;
    }
    bench_lat_sort(&tot.lat_get);
    bench_lat_sort(&tot.lat_put);
    bench_lat_sort(&tot.lat_exists);
    /* Bounds over the requests actually replayed (all n unless interrupted: then the prefix). */
    size_t nb = done < n ? done : n;
    struct bench_bound inf = {0}, lru = {0};
    bench_bound_infinite(&t, nb, o.block_tokens, true, &inf);
    bench_bound_lru(&t, nb, o.block_tokens, lru_tokens, true, &lru);

    double el = (double)(end_us - sh.start_us) / 1e6;
    double hr = tot.blocks ? (double)tot.hit_blocks / (double)tot.blocks : 0;
    double hrt = tot.tokens ? (double)tot.hit_tokens / (double)tot.tokens : 0;
    double binf = inf.total_blocks ? (double)inf.hit_blocks / (double)inf.total_blocks : 0;
    double binft = inf.total_tokens ? (double)inf.hit_tokens / (double)inf.total_tokens : 0;
    double blru = lru.total_blocks ? (double)lru.hit_blocks / (double)lru.total_blocks : 0;
    double blrut = lru.total_tokens ? (double)lru.hit_tokens / (double)lru.total_tokens : 0;
    char b1[32], b2[32], b3[32], b4[32];

    json_t *plots = json_array();
    if (o.plot && nb > 0 && inf.req_hit_blocks && lru.req_hit_blocks)
        make_plots(o.plot, nb, sh.rec, &t, &inf, &lru, &tot.lat_get, &tot.lat_put, o.events, plots);

    FILE *out = stdout;
    if (o.json && !strcmp(o.json, "-"))
        out = stderr; /* JSON owns stdout */
    fprintf(out, "\n== kvpool-bench trace report ==\n");
    fprintf(out, "%-28s %s\n", "trace", o.trace);
    fprintf(out, "%-28s %zu of %zu%s\n", "requests replayed", done, n,
            atomic_load(&g_interrupted) ? " (interrupted)" : "");
    fprintf(out, "%-28s %u (one client each), replicas %u, speedup %s\n", "instances", o.instances,
            o.replicas, o.speedup > 0 ? "scaled" : "max");
    fprintf(out, "%-28s %llu B/token, %u tokens/block = %s/block\n", "KV size",
            (unsigned long long)o.kv_bytes_per_token, o.block_tokens, bench_fmt_bytes((double)bb, b1, sizeof b1));
    fprintf(out, "%-28s %s = %llu tokens (%llu unique tokens at %u replicas)%s\n", "pool capacity",
            bench_fmt_bytes((double)cap_bytes, b1, sizeof b1), (unsigned long long)pool_tokens,
            (unsigned long long)(pool_tokens / r_eff), r_eff, cap_bytes ? "" : " (unknown)");
    fprintf(out, "%-28s %llu (%llu tokens)\n", "blocks looked up", (unsigned long long)tot.blocks,
            (unsigned long long)tot.tokens);
    fprintf(out, "\n%-28s %10s %10s\n", "prefix hit rate", "blocks", "tokens");
    fprintf(out, "%-28s %9.2f%% %9.2f%%\n", "  measured", 100 * hr, 100 * hrt);
    fprintf(out, "%-28s %9.2f%% %9.2f%%\n", "  bound: infinite cache", 100 * binf, 100 * binft);
    fprintf(out, "  bound: LRU %-16s %9.2f%% %9.2f%%\n",
            (snprintf(b4, sizeof b4, "%.3gM tok", (double)lru_tokens / 1e6), b4), 100 * blru, 100 * blrut);
    fprintf(out, "\n%-28s %s (%llu blocks)\n", "bytes got", bench_fmt_bytes((double)tot.bytes_got, b1, sizeof b1),
            (unsigned long long)tot.blocks_got);
    fprintf(out, "%-28s %s (%llu blocks; %llu already stored by another instance, %llu no space)\n",
            "bytes put", bench_fmt_bytes((double)tot.bytes_put, b2, sizeof b2), (unsigned long long)tot.blocks_put,
            (unsigned long long)tot.blocks_put_exists, (unsigned long long)tot.blocks_no_space);
    fprintf(out, "%-28s %.1f s, %.1f req/s, %.3f GB/s (get %.3f, put %.3f)\n", "throughput", el,
            el > 0 ? (double)done / el : 0, el > 0 ? (double)(tot.bytes_got + tot.bytes_put) / el / 1e9 : 0,
            el > 0 ? (double)tot.bytes_got / el / 1e9 : 0, el > 0 ? (double)tot.bytes_put / el / 1e9 : 0);
    fprintf(out, "\n%-16s %8s %9s %9s %9s %9s\n", "latency (ms)", "calls", "p50", "p90", "p99", "max");
    struct { const char *name; struct bench_lat *l; } ls[] = {
        {"batch_exists", &tot.lat_exists}, {"batch_get", &tot.lat_get}, {"batch_put", &tot.lat_put}};
    for (int i = 0; i < 3; i++)
        fprintf(out, "%-16s %8zu %9.3f %9.3f %9.3f %9.3f\n", ls[i].name, ls[i].l->n,
                bench_lat_pct(ls[i].l, 0.5) / 1e3, bench_lat_pct(ls[i].l, 0.9) / 1e3,
                bench_lat_pct(ls[i].l, 0.99) / 1e3, bench_lat_pct(ls[i].l, 1.0) / 1e3);
    fprintf(out, "\nerrors by code\n  exists: ");
    bench_errs_print(out, &tot.err_exists);
    fprintf(out, "\n  get:    ");
    bench_errs_print(out, &tot.err_get);
    fprintf(out, "\n  put:    ");
    bench_errs_print(out, &tot.err_put);
    fprintf(out, "\n%-28s %llu\n", "gets NOT_FOUND after exists", (unsigned long long)tot.miss_after_exists);
    fprintf(out, "%-28s %llu\n", "size mismatches", (unsigned long long)tot.size_mismatch);
    fprintf(out, "%-28s %llu\n", "CORRUPT BLOCKS", (unsigned long long)tot.corrupt);
    fprintf(out, "%-28s %llu\n", "FAILED REQUESTS", (unsigned long long)tot.failed);
    for (size_t i = 0; i < json_array_size(plots); i++)
        fprintf(out, "%-28s %s\n", i ? "" : "plots", json_string_value(json_array_get(plots, i)));
    (void)b3;

    if (o.json) {
        json_t *j = json_pack(
            "{s:s,s:s,s:I,s:I,s:i,s:f,s:I,s:i,s:I,s:i}", "mode", "trace", "trace", o.trace,
            "requests", (json_int_t)done, "requests_planned", (json_int_t)n, "instances", (int)o.instances,
            "speedup", o.speedup, "kv_bytes_per_token", (json_int_t)o.kv_bytes_per_token, "block_tokens",
            (int)o.block_tokens, "block_bytes", (json_int_t)bb, "replicas", (int)o.replicas);
        json_object_set_new(j, "elapsed_s", json_real(el));
        json_object_set_new(j, "blocks_looked_up", json_integer((json_int_t)tot.blocks));
        json_object_set_new(j, "hit_blocks", json_integer((json_int_t)tot.hit_blocks));
        json_object_set_new(j, "tokens_looked_up", json_integer((json_int_t)tot.tokens));
        json_object_set_new(j, "hit_tokens", json_integer((json_int_t)tot.hit_tokens));
        json_object_set_new(j, "hit_rate", json_real(hr));
        json_object_set_new(j, "hit_rate_tokens", json_real(hrt));
        json_object_set_new(j, "bound_infinite", json_real(binf));
        json_object_set_new(j, "bound_infinite_tokens", json_real(binft));
        json_object_set_new(j, "bound_lru", json_real(blru));
        json_object_set_new(j, "bound_lru_tokens", json_real(blrut));
        json_object_set_new(j, "lru_capacity_tokens", json_integer((json_int_t)lru_tokens));
        json_object_set_new(j, "pool_capacity_bytes", json_integer((json_int_t)cap_bytes));
        json_object_set_new(j, "pool_capacity_tokens", json_integer((json_int_t)pool_tokens));
        json_object_set_new(j, "bytes_got", json_integer((json_int_t)tot.bytes_got));
        json_object_set_new(j, "bytes_put", json_integer((json_int_t)tot.bytes_put));
        json_object_set_new(j, "blocks_got", json_integer((json_int_t)tot.blocks_got));
        json_object_set_new(j, "blocks_put", json_integer((json_int_t)tot.blocks_put));
        json_object_set_new(j, "blocks_put_exists", json_integer((json_int_t)tot.blocks_put_exists));
        json_object_set_new(j, "blocks_no_space", json_integer((json_int_t)tot.blocks_no_space));
        json_object_set_new(j, "requests_per_second", json_real(el > 0 ? (double)done / el : 0));
        json_object_set_new(j, "gb_per_second", json_real(el > 0 ? (double)(tot.bytes_got + tot.bytes_put) / el / 1e9 : 0));
        json_object_set_new(j, "latency_us", json_pack("{s:o,s:o,s:o}", "batch_exists", lat_json(&tot.lat_exists),
                                                       "batch_get", lat_json(&tot.lat_get), "batch_put",
                                                       lat_json(&tot.lat_put)));
        json_object_set_new(j, "errors", json_pack("{s:o,s:o,s:o}", "exists", errs_json(&tot.err_exists), "get",
                                                   errs_json(&tot.err_get), "put", errs_json(&tot.err_put)));
        json_object_set_new(j, "get_not_found_after_exists", json_integer((json_int_t)tot.miss_after_exists));
        json_object_set_new(j, "size_mismatch_blocks", json_integer((json_int_t)tot.size_mismatch));
        json_object_set_new(j, "corrupt_blocks", json_integer((json_int_t)tot.corrupt));
        json_object_set_new(j, "failed_requests", json_integer((json_int_t)tot.failed));
        json_object_set_new(j, "interrupted", json_boolean(atomic_load(&g_interrupted)));
        json_object_set(j, "plots", plots);
        int jr = !strcmp(o.json, "-") ? json_dumpf(j, stdout, JSON_INDENT(1))
                                      : json_dump_file(j, o.json, JSON_INDENT(1));
        if (!strcmp(o.json, "-"))
            printf("\n");
        if (jr)
            fprintf(stderr, "kvpool-bench: cannot write %s\n", o.json);
        json_decref(j);
    }
    json_decref(plots);
    if (tot.corrupt || tot.failed || done < n)
        exit_code = 1;
    bench_bound_free(&inf);
    bench_bound_free(&lru);
    bench_lat_free(&tot.lat_get);
    bench_lat_free(&tot.lat_put);
    bench_lat_free(&tot.lat_exists);
cleanup:
    for (unsigned i = 0; i < o.instances; i++) {
        if (ins[i].c) {
            kvp_unregister_buffer(ins[i].c, ins[i].buf);
            kvp_client_close(&ins[i].c);
        }
        free(ins[i].buf);
        bench_lat_free(&ins[i].lat_get);
        bench_lat_free(&ins[i].lat_put);
        bench_lat_free(&ins[i].lat_exists);
    }
    free(ins);
    free(sh.rec);
    bench_trace_free(&t);
    return exit_code;
}
