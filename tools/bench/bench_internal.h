/*
 * bench_internal.h — shared pieces of kvpool-bench (tools/bench/bench_*.c).
 *
 * Modes: trace (bench_trace.c), put/get/mixed and baseline-tcp (bench_kv.c), meta
 * (bench_meta.c). Pure helpers that unit tests drive directly: the trace parser
 * (bench_tracefile.c), the offline hit-rate bounds (bench_bounds.c), the block byte pattern and
 * the statistics helpers (bench_util.c). None of these keep global state.
 */
#ifndef KVP_TOOLS_BENCH_INTERNAL_H
#define KVP_TOOLS_BENCH_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvpool.h"

/* ---------------------------------------------------------------- trace file */

/** One request of a Mooncake trace line. */
struct bench_req {
    uint64_t ts_ms;       /* arrival, ms since trace start */
    uint32_t input_len;   /* prompt tokens */
    uint32_t output_len;  /* generated tokens */
    uint32_t nblocks;     /* number of hash ids */
    uint64_t *hash_ids;   /* nblocks prefix-hash ids, points into trace->ids */
};

struct bench_trace {
    struct bench_req *reqs;
    size_t n;
    uint64_t *ids;        /* all hash ids, concatenated */
    size_t nids;
    uint32_t max_blocks;  /* largest nblocks of any request */
};

/**
 * Parse at most `limit` requests (0 = all) of the JSON-lines trace at `path` into *out.
 * Blank lines are skipped. A line that is not a JSON object with an integer timestamp >= 0,
 * input_length >= 1 and a non-empty array of integer hash_ids >= 0 is an error: KVP_ERR_MALFORMED
 * with the line number in *errline (1-based) and a message in errbuf. KVP_ERR_IO when the file
 * cannot be read. Requests keep the file's order. Free with bench_trace_free().
 */
int bench_trace_load(const char *path, size_t limit, struct bench_trace *out, size_t *errline,
                     char *errbuf, size_t errcap);
/** Same, from a memory buffer of `len` bytes (tests). */
int bench_trace_parse(const char *text, size_t len, size_t limit, struct bench_trace *out,
                      size_t *errline, char *errbuf, size_t errcap);
void bench_trace_free(struct bench_trace *t);

/**
 * Tokens in block i of request r: block_tokens for every block but the last, the rest of
 * input_length for the last one (clamped to 1..block_tokens).
 */
uint32_t bench_block_tokens(const struct bench_req *r, uint32_t i, uint32_t block_tokens);

/* ---------------------------------------------------------------- offline bounds */

/** Per-request hits of an offline cache simulation (prefix semantics). */
struct bench_bound {
    uint64_t hit_blocks;   /* total */
    uint64_t hit_tokens;
    uint64_t total_blocks;
    uint64_t total_tokens;
    uint32_t *req_hit_blocks; /* per request, n entries (may be NULL if not asked for) */
};

/**
 * Infinite cache: a request hits the longest prefix of its blocks that any earlier request
 * referenced; then all its blocks are cached. req_hits: fill out->req_hit_blocks (malloc'd).
 */
int bench_bound_infinite(const struct bench_trace *t, size_t n, uint32_t block_tokens,
                         bool req_hits, struct bench_bound *out);
/**
 * Block-level LRU holding at most capacity_tokens tokens, every block costing block_tokens
 * (a partial last block occupies a whole block slot, as it does in an inference server's
 * paged KV cache). A request hits the longest prefix of its blocks that are cached; every block
 * of the request is then touched (moved to most-recent, inserted when missing) in order, and
 * least-recently-used blocks are evicted while the cache is over capacity.
 */
int bench_bound_lru(const struct bench_trace *t, size_t n, uint32_t block_tokens,
                    uint64_t capacity_tokens, bool req_hits, struct bench_bound *out);
void bench_bound_free(struct bench_bound *b);

/* ---------------------------------------------------------------- block bytes */

/** Fill buf with the deterministic byte stream of block `id` (the first len bytes). */
void bench_pattern_fill(void *buf, size_t len, uint64_t id);
/** Offset of the first byte of buf that differs from the stream of `id`, or -1 if all match. */
int64_t bench_pattern_check(const void *buf, size_t len, uint64_t id);

/* ---------------------------------------------------------------- statistics */

/** A growable list of latency samples in microseconds. Not thread-safe: one per thread. */
struct bench_lat {
    uint32_t *us;
    size_t n, cap;
};
void bench_lat_add(struct bench_lat *l, uint64_t us);
/** Append src's samples to dst. */
void bench_lat_merge(struct bench_lat *dst, const struct bench_lat *src);
/** Sort (needed before bench_lat_pct). */
void bench_lat_sort(struct bench_lat *l);
/** The q-quantile (0..1) of a sorted list, 0 when empty (nearest-rank). */
uint64_t bench_lat_pct(const struct bench_lat *l, double q);
void bench_lat_free(struct bench_lat *l);

/** Counts of error codes, indexed by -code (0 .. -KVP_ERR__LAST). */
#define BENCH_NCODES 32
struct bench_errs {
    uint64_t n[BENCH_NCODES];
};
void bench_errs_add(struct bench_errs *e, int code);
void bench_errs_merge(struct bench_errs *dst, const struct bench_errs *src);
uint64_t bench_errs_total(const struct bench_errs *e);
/** Print "NAME=count, ..." or "none". */
void bench_errs_print(FILE *f, const struct bench_errs *e);

/** Parse "4096", "4K", "4KiB", "1M", "2G", "1.5G" into bytes. Returns 0 or KVP_ERR_INVALID. */
int bench_parse_size(const char *s, uint64_t *out);
/** Human-readable bytes (static buffer per call site: pass one). */
const char *bench_fmt_bytes(double b, char *buf, size_t cap);

uint64_t bench_now_us(void);

/* ---------------------------------------------------------------- cluster access */

/** Where the cluster is: --cluster FILE or --masters LIST (comma-separated host:port). */
struct bench_target {
    const char *cluster_file;
    const char *masters;
    const char *config_file; /* --config: client config JSON, applied first */
};

/** Open a client for the target (global_segment_size 0: the bench contributes no memory). */
int bench_client_open(const struct bench_target *t, kvp_client **out);
/**
 * The comma-separated master list of the target (from cluster.json's master_server_address
 * when --cluster is given). Returns a malloc'd string or NULL (message printed).
 */
char *bench_target_masters(const struct bench_target *t);
/**
 * Ask the leader for ClusterStatus; on success *capacity_bytes / *used_bytes are filled from the
 * status document. Returns 0 or a negative code.
 */
int bench_cluster_capacity(const struct bench_target *t, uint64_t *capacity_bytes,
                           uint64_t *used_bytes);
/** Objects (complete + pending) the leader's state machine holds. Returns 0 or a negative code. */
int bench_cluster_objects(const struct bench_target *t, uint64_t *objects);

/** A master session for the target (meta mode, ClusterStatus). Returns 0 or a negative code. */
struct kvp_msession;
int bench_msession_open(const struct bench_target *t, const char *name, struct kvp_msession **out);

/* ---------------------------------------------------------------- CPU per op (bench_cpu.c) */

#define BENCH_CPU_MAX 32
/** CPU time of the cluster's processes (from cluster.json) and of the bench over a phase. */
struct bench_cpu {
    size_t n;
    int pid[BENCH_CPU_MAX];
    char name[BENCH_CPU_MAX][32];
    uint64_t t0[BENCH_CPU_MAX]; /* ns on CPU at begin */
    uint64_t self0;
};
/** Start: read the pids of cluster_file's masters and segments (NULL: the bench only). */
void bench_cpu_begin(struct bench_cpu *bc, const char *cluster_file);
/**
 * End: a JSON object of CPU µs per op over the phase: "bench", each process by its cluster.json
 * name, and the sums "masters" and "segments". The caller owns the object. NULL when ops is 0
 * (every op failed: no per-op figure).
 */
struct json_t;
struct json_t *bench_cpu_end(const struct bench_cpu *bc, uint64_t ops);

/* ---------------------------------------------------------------- modes */

int bench_trace_main(int argc, char **argv);
int bench_bounds_main(int argc, char **argv);
int bench_models_main(void);
int bench_kv_main(const char *mode, int argc, char **argv);
int bench_baseline_tcp_main(int argc, char **argv);
/** kvpool-bench baseline-kernel (bench_kernel.c): CPU cost of a system call and a thread wake-up. */
int bench_baseline_kernel_main(int argc, char **argv);
int bench_meta_main(int argc, char **argv);

#endif
