/*
 * bench_kv.c — `kvpool-bench put|get|mixed`: throughput and latency of the public API against a
 * cluster; `kvpool-bench baseline-tcp`: one loopback TCP stream measured in-process (the
 * reference that issue 4's targets compare against).
 *
 * put:   T threads, each storing count/T fresh keys in batches of B (timed).
 * get:   the same keys are first stored (untimed), then read back in batches of B (timed).
 * mixed: keys stored first (untimed); then each batch is a get of stored keys with
 *        probability --get-ratio, else a put of fresh keys (timed).
 * exists: keys stored first (untimed), then kvp_batch_exists of batches of B (timed).
 * --pieces P: each value is P pieces (kvp_batch_put_iov / kvp_batch_get_iov), as vLLM's
 *        connector stores one piece per layer (the Python binding's benchmark compares it).
 * Latency is per call (one batch); ops are keys. Keys are removed at the end unless --keep.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tools/bench/bench_internal.h"

struct kv_opts {
    const char *mode;
    uint64_t value_size;
    uint64_t count;
    unsigned batch;
    unsigned threads;
    unsigned replicas;
    double get_ratio;
    bool json;
    bool verify;
    bool keep;
    unsigned warmup; /* put: untimed calls per thread before the timed phase */
    unsigned pieces; /* pieces per value: 1 = flat batch calls, else the _iov calls */
    uint32_t timeout_ms;
    struct bench_target target;
};

struct kv_thread {
    const struct kv_opts *o;
    kvp_client *c;
    unsigned id;
    uint64_t first, n; /* key index range of this thread */
    unsigned char *buf; /* batch * value_size */
    pthread_t th;
    struct bench_lat lat;
    struct bench_errs errs;
    uint64_t ops_ok, bytes, corrupt, calls;
    uint64_t put_next; /* mixed: next fresh key index */
    unsigned seed;
    bool timed;
    int phase; /* 0 put, 1 get, 2 mixed, 3 put warm-up, 4 exists */
};

static uint32_t g_run_id;

static void kv_key(char *k, size_t cap, uint64_t i)
{
    snprintf(k, cap, "kvb-%08x-%llu", g_run_id, (unsigned long long)i);
}

/* Value j of a batch as o->pieces pieces of buf (the last takes the remainder). */
static void split_iov(const struct kv_opts *o, unsigned char *buf, unsigned nb, kvp_iov *iov,
                      const kvp_iov **iovs, size_t *cnt)
{
    size_t piece = o->value_size / o->pieces;
    for (unsigned j = 0; j < nb; j++) {
        unsigned char *v = buf + (size_t)j * o->value_size;
        for (unsigned p = 0; p < o->pieces; p++) {
            size_t len = p + 1 < o->pieces ? piece : o->value_size - piece * (o->pieces - 1);
            iov[(size_t)j * o->pieces + p] = (kvp_iov){.base = v + piece * p, .len = len};
        }
        iovs[j] = &iov[(size_t)j * o->pieces];
        cnt[j] = o->pieces;
    }
}

static void do_put(struct kv_thread *t, uint64_t k0, unsigned nb)
{
    const struct kv_opts *o = t->o;
    char keys[nb][48];
    const char *kp[nb];
    const void *bufs[nb];
    size_t lens[nb];
    int res[nb];
    for (unsigned j = 0; j < nb; j++) {
        kv_key(keys[j], sizeof keys[j], k0 + j);
        kp[j] = keys[j];
        bufs[j] = t->buf + (size_t)j * o->value_size;
        lens[j] = o->value_size;
        /* Keys a later timed get reads back (populate) carry their own pattern, so --verify can
         * check them. Timed puts send the buffer as it is (filled once per thread): what
         * they store is never read back, and generating 4 MiB of pattern per key would
         * otherwise be counted in the put's wall time (it was 30% of the bench's CPU). */
        if (!t->timed)
            bench_pattern_fill(t->buf + (size_t)j * o->value_size, o->value_size, k0 + j);
    }
    kvp_put_opts po = {.replica_num = o->replicas, .timeout_ms = o->timeout_ms};
    kvp_iov *iov = NULL;
    const kvp_iov **iovs = NULL;
    size_t *cnt = NULL;
    if (o->pieces > 1) {
        iov = malloc((size_t)nb * o->pieces * sizeof *iov);
        iovs = malloc(nb * sizeof *iovs);
        cnt = malloc(nb * sizeof *cnt);
        if (!iov || !iovs || !cnt)
            abort();
        split_iov(o, t->buf, nb, iov, iovs, cnt);
    }
    uint64_t t0 = bench_now_us();
    int rc = o->pieces > 1 ? kvp_batch_put_iov(t->c, nb, kp, iovs, cnt, &po, res)
                           : kvp_batch_put(t->c, nb, kp, bufs, lens, &po, res);
    free(iov);
    free(iovs);
    free(cnt);
    if (t->timed) {
        bench_lat_add(&t->lat, bench_now_us() - t0);
        t->calls++;
    }
    if (rc < 0) {
        bench_errs_add(&t->errs, rc);
        return;
    }
    for (unsigned j = 0; j < nb; j++) {
        if (res[j] == KVP_OK) {
            if (t->timed) {
                t->ops_ok++;
                t->bytes += o->value_size;
            }
        } else {
            bench_errs_add(&t->errs, res[j]);
        }
    }
}

static void do_get(struct kv_thread *t, uint64_t k0, unsigned nb)
{
    const struct kv_opts *o = t->o;
    char keys[nb][48];
    const char *kp[nb];
    void *bufs[nb];
    size_t caps[nb];
    int64_t res[nb];
    for (unsigned j = 0; j < nb; j++) {
        kv_key(keys[j], sizeof keys[j], k0 + j);
        kp[j] = keys[j];
        bufs[j] = t->buf + (size_t)j * o->value_size;
        caps[j] = o->value_size;
    }
    kvp_iov *iov = NULL;
    const kvp_iov **iovs = NULL;
    size_t *cnt = NULL;
    if (o->pieces > 1) {
        iov = malloc((size_t)nb * o->pieces * sizeof *iov);
        iovs = malloc(nb * sizeof *iovs);
        cnt = malloc(nb * sizeof *cnt);
        if (!iov || !iovs || !cnt)
            abort();
        split_iov(o, t->buf, nb, iov, iovs, cnt);
    }
    uint64_t t0 = bench_now_us();
    int rc = o->pieces > 1 ? kvp_batch_get_iov(t->c, nb, kp, iovs, cnt, o->timeout_ms, res)
                           : kvp_batch_get(t->c, nb, kp, bufs, caps, o->timeout_ms, res);
    bench_lat_add(&t->lat, bench_now_us() - t0);
    free(iov);
    free(iovs);
    free(cnt);
    t->calls++;
    if (rc < 0) {
        bench_errs_add(&t->errs, rc);
        return;
    }
    for (unsigned j = 0; j < nb; j++) {
        if (res[j] < 0) {
            bench_errs_add(&t->errs, (int)res[j]);
            continue;
        }
        if (o->verify && ((uint64_t)res[j] != o->value_size ||
                          bench_pattern_check(bufs[j], (size_t)res[j], k0 + j) >= 0)) {
            t->corrupt++;
            continue;
        }
        t->ops_ok++;
        t->bytes += (uint64_t)res[j];
    }
}

static void do_exists(struct kv_thread *t, uint64_t k0, unsigned nb)
{
    char keys[nb][48];
    const char *kp[nb];
    int res[nb];
    for (unsigned j = 0; j < nb; j++) {
        kv_key(keys[j], sizeof keys[j], k0 + j);
        kp[j] = keys[j];
    }
    uint64_t t0 = bench_now_us();
    int rc = kvp_batch_exists(t->c, nb, kp, res);
    bench_lat_add(&t->lat, bench_now_us() - t0);
    t->calls++;
    if (rc < 0) {
        bench_errs_add(&t->errs, rc);
        return;
    }
    for (unsigned j = 0; j < nb; j++) {
        if (res[j] == 1)
            t->ops_ok++;
        else if (res[j] < 0)
            bench_errs_add(&t->errs, res[j]);
        else
            bench_errs_add(&t->errs, KVP_ERR_NOT_FOUND);
    }
}

static void *kv_thread_main(void *arg)
{
    struct kv_thread *t = arg;
    const struct kv_opts *o = t->o;
    if (t->phase == 3) { /* keys above the timed range: count + (id * warmup + w) * batch */
        for (unsigned w = 0; w < o->warmup; w++)
            do_put(t, o->count + ((uint64_t)t->id * o->warmup + w) * o->batch, o->batch);
        return NULL;
    }
    for (uint64_t i = 0; i < t->n; i += o->batch) {
        unsigned nb = (unsigned)(t->n - i < o->batch ? t->n - i : o->batch);
        uint64_t k0 = t->first + i;
        if (t->phase == 0) {
            do_put(t, k0, nb);
        } else if (t->phase == 1) {
            do_get(t, k0, nb);
        } else if (t->phase == 4) {
            do_exists(t, k0, nb);
        } else {
            if ((double)rand_r(&t->seed) / RAND_MAX < o->get_ratio) {
                do_get(t, k0, nb);
            } else {
                do_put(t, t->put_next, nb);
                t->put_next += nb;
            }
        }
    }
    return NULL;
}

static void usage_kv(void)
{
    fprintf(stderr,
            "usage: kvpool-bench put|get|mixed|exists [--cluster FILE | --masters LIST] --value-size S\n"
            "         [--count N] [--batch B] [--threads T] [--replicas R] [--get-ratio F] [--pieces P]\n"
            "         [--verify] [--keep] [--timeout-ms MS] [--warmup N] [--run-id HEX] [--json]\n");
}

struct rm_job {
    kvp_client *c;
    uint64_t first, n;
    pthread_t th;
};

static void *rm_main(void *arg)
{
    struct rm_job *j = arg;
    for (uint64_t i = j->first; i < j->first + j->n; i++) {
        char k[48];
        kv_key(k, sizeof k, i);
        kvp_remove(j->c, k, true);
    }
    return NULL;
}

/* Remove every key the run may have stored (untimed), with 8 threads: one RPC per key. */
static void remove_keys(kvp_client *c, const struct kv_opts *o, uint64_t per)
{
    uint64_t top = !strcmp(o->mode, "mixed") ? o->count + (uint64_t)o->threads * per : o->count;
    if (!strcmp(o->mode, "put"))
        top = o->count + (uint64_t)o->threads * o->warmup * o->batch;
    enum { NRM = 8 };
    struct rm_job j[NRM];
    uint64_t chunk = (top + NRM - 1) / NRM;
    for (int i = 0; i < NRM; i++) {
        j[i].c = c;
        j[i].first = (uint64_t)i * chunk;
        j[i].n = j[i].first >= top ? 0 : (top - j[i].first < chunk ? top - j[i].first : chunk);
        pthread_create(&j[i].th, NULL, rm_main, &j[i]);
    }
    for (int i = 0; i < NRM; i++)
        pthread_join(j[i].th, NULL);
}

static int run_phase(struct kv_thread *ts, unsigned n, int phase, bool timed, double *secs)
{
    for (unsigned i = 0; i < n; i++) {
        ts[i].phase = phase;
        ts[i].timed = timed;
    }
    uint64_t t0 = bench_now_us();
    for (unsigned i = 0; i < n; i++)
        pthread_create(&ts[i].th, NULL, kv_thread_main, &ts[i]);
    for (unsigned i = 0; i < n; i++)
        pthread_join(ts[i].th, NULL);
    *secs = (double)(bench_now_us() - t0) / 1e6;
    return 0;
}

int bench_kv_main(const char *mode, int argc, char **argv)
{
    struct kv_opts o = {.mode = mode, .value_size = 4096, .count = 10000, .batch = 1, .threads = 1,
                        .get_ratio = 0.5, .warmup = 1, .pieces = 1};
    static const struct option lo[] = {
        {"value-size", 1, 0, 's'}, {"count", 1, 0, 'n'},    {"batch", 1, 0, 'b'},
        {"threads", 1, 0, 't'},    {"replicas", 1, 0, 'r'}, {"get-ratio", 1, 0, 'g'},
        {"json", 0, 0, 'j'},       {"verify", 0, 0, 'v'},   {"keep", 0, 0, 'k'},
        {"timeout-ms", 1, 0, 'T'}, {"cluster", 1, 0, 'c'},  {"masters", 1, 0, 'M'},
        {"config", 1, 0, 'C'},     {"help", 0, 0, 'h'},     {"warmup", 1, 0, 'W'},
        {"run-id", 1, 0, 'R'},     {"pieces", 1, 0, 'P'},   {0, 0, 0, 0}};
    bool have_run_id = false;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 's':
            if (bench_parse_size(optarg, &o.value_size) || !o.value_size) {
                usage_kv();
                return 2;
            }
            break;
        case 'n': o.count = strtoull(optarg, NULL, 10); break;
        case 'b': o.batch = (unsigned)strtoul(optarg, NULL, 10); break;
        case 't': o.threads = (unsigned)strtoul(optarg, NULL, 10); break;
        case 'r': o.replicas = (unsigned)strtoul(optarg, NULL, 10); break;
        case 'g': o.get_ratio = strtod(optarg, NULL); break;
        case 'j': o.json = true; break;
        case 'v': o.verify = true; break;
        case 'k': o.keep = true; break;
        case 'T': o.timeout_ms = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'W': o.warmup = (unsigned)strtoul(optarg, NULL, 10); break;
        case 'P': o.pieces = (unsigned)strtoul(optarg, NULL, 10); break;
        case 'c': o.target.cluster_file = optarg; break;
        case 'M': o.target.masters = optarg; break;
        case 'C': o.target.config_file = optarg; break;
        case 'R': {
            char *end = NULL;
            unsigned long v = strtoul(optarg, &end, 16);
            if (!end || *end || v > 0xffffffffUL) {
                fprintf(stderr, "kvpool-bench: --run-id takes 1-8 hex digits, not %s\n", optarg);
                return 2;
            }
            g_run_id = (uint32_t)v;
            have_run_id = true;
            break;
        }
        default: usage_kv(); return 2;
        }
    }
    if (!o.batch || !o.threads || o.threads > 256 || !o.count || o.batch > 4096 || !o.pieces ||
        o.pieces > o.value_size || o.pieces > 4096 ||
        (!o.target.cluster_file && !o.target.masters && !o.target.config_file)) {
        usage_kv();
        return 2;
    }
    if ((uint64_t)o.batch * o.value_size > (1ull << 31)) {
        fprintf(stderr, "kvpool-bench: batch x value-size above 2 GiB per thread\n");
        return 2;
    }
    /* --run-id: the key names of an earlier `put --keep` run (printed as run_id); a get then
     * reads those keys without storing them first (a profile or CPU count of the get phase
     * alone). The bytes are not the populate pattern, so it cannot be combined with --verify. */
    if (!have_run_id)
        g_run_id = (uint32_t)(bench_now_us() ^ ((uint64_t)getpid() << 16));
    else if (o.verify && strcmp(mode, "put")) {
        fprintf(stderr, "kvpool-bench: --run-id with get/mixed reads keys stored by put: no --verify\n");
        return 2;
    }
    kvp_client *c = NULL;
    if (bench_client_open(&o.target, &c))
        return 1;
    struct kv_thread *ts = calloc(o.threads, sizeof *ts);
    uint64_t per = (o.count + o.threads - 1) / o.threads;
    size_t bufsz = (size_t)o.batch * o.value_size;
    int rc = 0;
    for (unsigned i = 0; i < o.threads; i++) {
        ts[i].o = &o;
        ts[i].c = c;
        ts[i].id = i;
        ts[i].first = (uint64_t)i * per;
        ts[i].n = ts[i].first >= o.count ? 0 : (o.count - ts[i].first < per ? o.count - ts[i].first : per);
        ts[i].put_next = o.count + (uint64_t)i * per; /* mixed: fresh keys above the stored ones */
        ts[i].seed = 12345u + i;
        ts[i].buf = aligned_alloc(4096, (bufsz + 4095) / 4096 * 4096);
        if (!ts[i].buf || kvp_register_buffer(c, ts[i].buf, bufsz)) {
            fprintf(stderr, "kvpool-bench: cannot allocate/register %zu bytes\n", bufsz);
            rc = 1;
            goto out;
        }
        for (unsigned j = 0; j < o.batch; j++) /* what timed puts send (do_put) */
            bench_pattern_fill(ts[i].buf + (size_t)j * o.value_size, o.value_size,
                               ((uint64_t)(i + 1) << 32) + j);
    }
    double secs = 0;
    struct bench_cpu cpu;
    if (!strcmp(mode, "put")) {
        /* Untimed warm-up: a fresh process's first calls open the data connections and their
         * TCP windows start small (on this VM the first 32 MiB per thread can take 300 ms);
         * a long-running inference server pays that once. The timed phase starts warm. */
        if (o.warmup > 0)
            run_phase(ts, o.threads, 3, false, &secs);
        for (unsigned i = 0; i < o.threads; i++)
            memset(&ts[i].errs, 0, sizeof ts[i].errs);
        bench_cpu_begin(&cpu, o.target.cluster_file);
        run_phase(ts, o.threads, 0, true, &secs);
    } else {
        if (!have_run_id)
            run_phase(ts, o.threads, 0, false, &secs); /* populate, untimed */
        struct bench_errs pe = {0};
        for (unsigned i = 0; i < o.threads; i++) {
            bench_errs_merge(&pe, &ts[i].errs);
            memset(&ts[i].errs, 0, sizeof ts[i].errs);
        }
        if (bench_errs_total(&pe)) {
            fprintf(stderr, "kvpool-bench: populate errors: ");
            bench_errs_print(stderr, &pe);
            fprintf(stderr, "\n");
        }
        bench_cpu_begin(&cpu, o.target.cluster_file);
        run_phase(ts, o.threads, !strcmp(mode, "get") ? 1 : !strcmp(mode, "exists") ? 4 : 2, true, &secs);
    }
    struct bench_lat lat = {0};
    struct bench_errs errs = {0};
    uint64_t ops = 0, bytes = 0, corrupt = 0, calls = 0;
    for (unsigned i = 0; i < o.threads; i++) {
        bench_lat_merge(&lat, &ts[i].lat);
        bench_errs_merge(&errs, &ts[i].errs);
        ops += ts[i].ops_ok, bytes += ts[i].bytes, corrupt += ts[i].corrupt, calls += ts[i].calls;
    }
    bench_lat_sort(&lat);
    json_t *cpu_j = bench_cpu_end(&cpu, ops);
    double ops_s = secs > 0 ? (double)ops / secs : 0, bytes_s = secs > 0 ? (double)bytes / secs : 0;
    if (o.json) {
        json_t *j = json_pack("{s:s,s:I,s:i,s:I,s:i,s:i,s:i,s:i,s:f,s:f,s:f,s:I,s:I,s:I}", "mode", mode, "value_size",
                              (json_int_t)o.value_size, "pieces", (int)o.pieces, "count", (json_int_t)o.count, "batch", (int)o.batch,
                              "warmup", !strcmp(mode, "put") ? (int)o.warmup : 0,
                              "threads", (int)o.threads, "replicas", (int)o.replicas, "seconds", secs,
                              "ops_per_second", ops_s, "bytes_per_second", bytes_s, "ops_ok", (json_int_t)ops,
                              "calls", (json_int_t)calls, "corrupt", (json_int_t)corrupt);
        json_object_set_new(j, "latency_us",
                            json_pack("{s:I,s:I,s:I,s:I}", "p50", (json_int_t)bench_lat_pct(&lat, 0.5), "p90",
                                      (json_int_t)bench_lat_pct(&lat, 0.9), "p99",
                                      (json_int_t)bench_lat_pct(&lat, 0.99), "max", (json_int_t)bench_lat_pct(&lat, 1)));
        json_t *e = json_object();
        for (int i = 1; i < BENCH_NCODES; i++)
            if (errs.n[i])
                json_object_set_new(e, kvp_errname(-i), json_integer((json_int_t)errs.n[i]));
        json_object_set_new(j, "errors", e);
        char rid[16];
        snprintf(rid, sizeof rid, "%08x", g_run_id);
        json_object_set_new(j, "run_id", json_string(rid));
        json_object_set_new(j, "cpu_us_per_op", cpu_j ? cpu_j : json_null());
        cpu_j = NULL;
        json_dumpf(j, stdout, JSON_COMPACT);
        printf("\n");
        json_decref(j);
    } else {
        char b[32];
        printf("%s: value %llu B (%u pieces), %llu keys, batch %u, threads %u, replicas %u\n", mode,
               (unsigned long long)o.value_size, o.pieces, (unsigned long long)o.count, o.batch, o.threads,
               o.replicas);
        printf("  %.0f keys/s, %s/s, %.2f s, %llu calls\n", ops_s, bench_fmt_bytes(bytes_s, b, sizeof b), secs,
               (unsigned long long)calls);
        printf("  latency per call (us): p50 %llu p90 %llu p99 %llu max %llu\n",
               (unsigned long long)bench_lat_pct(&lat, 0.5), (unsigned long long)bench_lat_pct(&lat, 0.9),
               (unsigned long long)bench_lat_pct(&lat, 0.99), (unsigned long long)bench_lat_pct(&lat, 1));
        printf("  errors: ");
        bench_errs_print(stdout, &errs);
        printf("\n  corrupt: %llu\n", (unsigned long long)corrupt);
        printf("  CPU us per key:");
        const char *k;
        json_t *v;
        json_object_foreach(cpu_j, k, v) printf(" %s %.1f", k, json_real_value(v));
        printf("\n");
    }
    json_decref(cpu_j);
    if (corrupt)
        rc = 1;
    bench_lat_free(&lat);
    fflush(stdout);
    if (!o.keep)
        remove_keys(c, &o, per);
out:
    for (unsigned i = 0; i < o.threads; i++) {
        if (ts[i].buf)
            kvp_unregister_buffer(c, ts[i].buf);
        free(ts[i].buf);
        bench_lat_free(&ts[i].lat);
    }
    free(ts);
    kvp_client_close(&c);
    return rc;
}

/* ---------------------------------------------------------------- baseline-tcp */

struct tcp_srv {
    int lfd;
    uint64_t value_size, count;
    int rc;
};

static int read_full(int fd, void *buf, size_t len)
{
    unsigned char *p = buf;
    while (len) {
        ssize_t r = read(fd, p, len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    while (len) {
        ssize_t r = write(fd, p, len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

static void *tcp_srv_main(void *arg)
{
    struct tcp_srv *s = arg;
    int fd = accept(s->lfd, NULL, NULL);
    s->rc = -1;
    if (fd < 0)
        return NULL;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    unsigned char *buf = malloc(s->value_size);
    for (uint64_t i = 0; buf && i < s->count; i++) {
        if (read_full(fd, buf, s->value_size) || write_full(fd, "k", 1))
            goto out;
    }
    s->rc = 0;
out:
    free(buf);
    close(fd);
    return NULL;
}

int bench_baseline_tcp_main(int argc, char **argv)
{
    uint64_t vs = 4 << 20, count = 0;
    bool json = false;
    static const struct option lo[] = {{"value-size", 1, 0, 's'}, {"count", 1, 0, 'n'},
                                       {"json", 0, 0, 'j'}, {0, 0, 0, 0}};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 's':
            if (bench_parse_size(optarg, &vs) || !vs)
                return 2;
            break;
        case 'n': count = strtoull(optarg, NULL, 10); break;
        case 'j': json = true; break;
        default:
            fprintf(stderr, "usage: kvpool-bench baseline-tcp [--value-size S] [--count N] [--json]\n");
            return 2;
        }
    }
    if (!count) /* about 2 GiB in all, at least 100 messages */
        count = (2ull << 30) / vs < 100 ? 100 : (2ull << 30) / vs;
    if (count > 1000000)
        count = 1000000;
    struct tcp_srv s = {.value_size = vs, .count = count};
    s.lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (s.lfd < 0 || bind(s.lfd, (struct sockaddr *)&a, sizeof a) || listen(s.lfd, 1) ||
        getsockname(s.lfd, (struct sockaddr *)&a, &al)) {
        perror("kvpool-bench: baseline-tcp listen");
        return 1;
    }
    pthread_t th;
    pthread_create(&th, NULL, tcp_srv_main, &s);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        perror("kvpool-bench: baseline-tcp connect");
        return 1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    unsigned char *buf = malloc(vs);
    memset(buf, 0x5a, vs);
    struct bench_lat lat = {0};
    uint64_t t0 = bench_now_us();
    int rc = 0;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t c0 = bench_now_us();
        char ack;
        if (write_full(fd, buf, vs) || read_full(fd, &ack, 1)) {
            rc = 1;
            break;
        }
        bench_lat_add(&lat, bench_now_us() - c0);
    }
    double secs = (double)(bench_now_us() - t0) / 1e6;
    close(fd);
    pthread_join(th, NULL);
    close(s.lfd);
    free(buf);
    bench_lat_sort(&lat);
    double bps = secs > 0 ? (double)vs * (double)count / secs : 0;
    if (json) {
        printf("{\"mode\":\"baseline-tcp\",\"value_size\":%llu,\"count\":%llu,\"seconds\":%.3f,"
               "\"ops_per_second\":%.1f,\"bytes_per_second\":%.1f,\"latency_us\":{\"p50\":%llu,\"p90\":%llu,"
               "\"p99\":%llu,\"max\":%llu}}\n",
               (unsigned long long)vs, (unsigned long long)count, secs, count / secs, bps,
               (unsigned long long)bench_lat_pct(&lat, 0.5), (unsigned long long)bench_lat_pct(&lat, 0.9),
               (unsigned long long)bench_lat_pct(&lat, 0.99), (unsigned long long)bench_lat_pct(&lat, 1));
    } else {
        char b[32];
        printf("baseline-tcp: one loopback stream, %llu messages of %llu B, each acknowledged\n",
               (unsigned long long)count, (unsigned long long)vs);
        printf("  %s/s, %.0f msgs/s, latency (us) p50 %llu p99 %llu\n", bench_fmt_bytes(bps, b, sizeof b),
               count / secs, (unsigned long long)bench_lat_pct(&lat, 0.5),
               (unsigned long long)bench_lat_pct(&lat, 0.99));
    }
    bench_lat_free(&lat);
    return rc || s.rc;
}
