/*
 * client_metrics.c — the client's counters and its /metrics endpoint (client_metrics.h).
 *
 * The API calls run on the callers' threads, many at once, with no actor of their own: a
 * message per call to some owner would cost more than the call's bookkeeping and add a thread
 * hop to the hot path. So the counters are atomics that every calling thread adds to with
 * relaxed fetch-adds (independent counts; nothing is published through them), and the HTTP
 * thread (libmicrohttpd's) reads them with relaxed loads. The transfer engine's counters come
 * from kvp_xfer_stats(), which any thread may call. With metrics_port 0 nothing is allocated
 * and nothing counted.
 */
#include "actors/client/client_metrics.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "metrics/metrics.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define N_CODES (-(KVP_ERR__LAST) + 1) /* index -code; the last: anything else */

static const char *const op_names[KVP_CLIENT_OP_N] = {"put", "get", "exists"};

/* Keys per call: 1, 2, 4, ... 2^19. */
static const uint64_t batch_bounds[KVP_METRICS_HIST_BUCKETS] = {
    1,    2,    4,     8,     16,    32,    64,     128,    256,    512,
    1024, 2048, 4096,  8192,  16384, 32768, 65536,  131072, 262144, 524288,
};

struct kvp_client_metrics {
    struct kvp_metrics_http *http;
    _Atomic uint64_t calls[KVP_CLIENT_OP_N][N_CODES]; /* call-level result */
    _Atomic uint64_t keys[KVP_CLIENT_OP_N][N_CODES];  /* per-key result */
    _Atomic uint64_t bytes_read, bytes_written;      /* payload of keys that succeeded */
    struct kvp_metrics_ahist latency[KVP_CLIENT_OP_N]; /* µs */
    struct kvp_metrics_ahist batch[KVP_CLIENT_OP_N];   /* keys per call */
};

static int code_index(int64_t st)
{
    return st <= 0 && st > KVP_ERR__LAST ? (int)-st : N_CODES - 1;
}

static void add(_Atomic uint64_t *c, uint64_t v)
{
    atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

uint64_t kvp_client_metrics_t0(const struct kvp_client *c)
{
    return c && c->metrics ? kvp_clock_now_us() : 0;
}

static void call_done(struct kvp_client_metrics *m, enum kvp_client_op op, int rc, size_t n, uint64_t t0)
{
    add(&m->calls[op][code_index(rc)], 1);
    uint64_t now = kvp_clock_now_us();
    kvp_metrics_ahist_observe(&m->latency[op], kvp_metrics_hist_bounds_us, now > t0 ? now - t0 : 0);
    kvp_metrics_ahist_observe(&m->batch[op], batch_bounds, n);
}

void kvp_client_metrics_put(struct kvp_client *c, int rc, size_t n, const struct kvp_client_obj *objs,
                            const int *results, uint64_t t0_us)
{
    struct kvp_client_metrics *m = c ? c->metrics : NULL;
    if (!m)
        return;
    call_done(m, KVP_CLIENT_OP_PUT, rc, n, t0_us);
    if (rc != KVP_OK || !results)
        return;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        add(&m->keys[KVP_CLIENT_OP_PUT][code_index(results[i])], 1);
        if (results[i] == KVP_OK && objs)
            for (size_t j = 0; j < objs[i].iovcnt; j++)
                bytes += objs[i].iov[j].len;
    }
    add(&m->bytes_written, bytes);
}

void kvp_client_metrics_get(struct kvp_client *c, int rc, size_t n, const int64_t *results, uint64_t t0_us)
{
    struct kvp_client_metrics *m = c ? c->metrics : NULL;
    if (!m)
        return;
    call_done(m, KVP_CLIENT_OP_GET, rc, n, t0_us);
    if (rc != KVP_OK || !results)
        return;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        add(&m->keys[KVP_CLIENT_OP_GET][code_index(results[i] >= 0 ? KVP_OK : results[i])], 1);
        if (results[i] > 0)
            bytes += (uint64_t)results[i];
    }
    add(&m->bytes_read, bytes);
}

void kvp_client_metrics_exists(struct kvp_client *c, int rc, size_t n, const int *results, uint64_t t0_us)
{
    struct kvp_client_metrics *m = c ? c->metrics : NULL;
    if (!m)
        return;
    call_done(m, KVP_CLIENT_OP_EXISTS, rc, n, t0_us);
    if (rc != KVP_OK || !results)
        return;
    for (size_t i = 0; i < n; i++)
        add(&m->keys[KVP_CLIENT_OP_EXISTS][code_index(results[i] == 1 ? KVP_OK
                                                      : results[i] == 0 ? KVP_ERR_NOT_FOUND : results[i])], 1);
}

/* ------------------------------------------------------------------ HTTP thread */

static void per_code(struct kvp_metrics_text *t, const char *name, _Atomic uint64_t (*arr)[N_CODES])
{
    for (int op = 0; op < KVP_CLIENT_OP_N; op++)
        for (int i = 0; i < N_CODES; i++) {
            uint64_t v = atomic_load_explicit(&arr[op][i], memory_order_relaxed);
            if (!v)
                continue;
            const char *l[] = {"op", op_names[op], "code", i == N_CODES - 1 ? "OTHER" : kvp_errname(-i), NULL};
            kvp_metrics_sample_u64(t, name, l, v);
        }
}

static void one(struct kvp_metrics_text *t, const char *name, const char *type, const char *help, uint64_t v)
{
    kvp_metrics_family(t, name, type, help);
    kvp_metrics_sample_u64(t, name, NULL, v);
}

static void render(void *ctx, struct kvp_metrics_text *t)
{
    struct kvp_client *c = ctx;
    struct kvp_client_metrics *m = c->metrics;
    kvp_metrics_family(t, "kvpool_client_calls_total", "counter",
                       "API calls of this client by operation and call-level result (a batch is one call).");
    per_code(t, "kvpool_client_calls_total", m->calls);
    kvp_metrics_family(t, "kvpool_client_keys_total", "counter",
                       "Keys of the calls by operation and per-key result (exists: KVP_OK found, KVP_ERR_NOT_FOUND missing).");
    per_code(t, "kvpool_client_keys_total", m->keys);
    kvp_metrics_family(t, "kvpool_client_call_duration_seconds", "histogram", "Duration of an API call, by operation.");
    for (int op = 0; op < KVP_CLIENT_OP_N; op++) {
        struct kvp_metrics_hist h;
        kvp_metrics_ahist_read(&m->latency[op], &h);
        const char *l[] = {"op", op_names[op], NULL};
        kvp_metrics_sample_hist(t, "kvpool_client_call_duration_seconds", l, &h);
    }
    kvp_metrics_family(t, "kvpool_client_batch_keys", "histogram", "Keys per API call, by operation.");
    for (int op = 0; op < KVP_CLIENT_OP_N; op++) {
        struct kvp_metrics_hist h;
        kvp_metrics_ahist_read(&m->batch[op], &h);
        const char *l[] = {"op", op_names[op], NULL};
        kvp_metrics_sample_hist_units(t, "kvpool_client_batch_keys", l, &h, batch_bounds, 1.0);
    }
    kvp_metrics_family(t, "kvpool_client_transfer_bytes_total", "counter",
                       "Payload bytes of keys that succeeded: read = gets, write = puts (each replica written counts once).");
    /* the transport really used (protocol=rdma without a usable device runs tcp) */
    const char *tr = c->transport[0] ? c->transport : "tcp";
    const char *rd[] = {"direction", "read", "transport", tr, NULL};
    const char *wr[] = {"direction", "write", "transport", tr, NULL};
    kvp_metrics_sample_u64(t, "kvpool_client_transfer_bytes_total", rd,
                           atomic_load_explicit(&m->bytes_read, memory_order_relaxed));
    kvp_metrics_sample_u64(t, "kvpool_client_transfer_bytes_total", wr,
                           atomic_load_explicit(&m->bytes_written, memory_order_relaxed));
    struct kvp_xfer_stats xs;
    memset(&xs, 0, sizeof xs);
    if (c->xfer)
        kvp_xfer_stats(c->xfer, &xs);
    one(t, "kvpool_client_transfer_batches_total", "counter", "Transfer batches run by the engine.", xs.batches);
    one(t, "kvpool_client_transfer_slices_total", "counter", "Transfer slices run by the engine.", xs.slices);
    one(t, "kvpool_client_transfer_timeouts_total", "counter", "Transfer batches that hit their timeout.", xs.timeouts);
    one(t, "kvpool_client_fenced_slices_total", "counter",
        "Slice pieces fenced (timeout or close) before they completed: they can no longer touch caller memory.",
        xs.fenced);
    one(t, "kvpool_client_fence_failures_total", "counter",
        "Pieces a transport could not fence within its bound (a wedged transport; the call waited).", xs.fence_failed);
    one(t, "kvpool_client_stray_bytes_total", "counter", "Bytes that arrived for fenced READs and were drained.",
        xs.stray_bytes);
    /* GPU staging (docs/gpu.md), only where a CUDA driver is loaded */
    if (kvp_devmem_available()) {
        struct kvp_devstage_stats ds;
        kvp_devstage_stats(c->devstage, &ds);
        one(t, "kvpool_client_device_registered_bytes", "gauge",
            "GPU device memory registered with register_buffer (this process).", ds.registered_bytes);
        one(t, "kvpool_client_device_bounce_bytes", "gauge", "Pinned host bounce memory of the staging lanes.",
            ds.bounce_bytes);
        one(t, "kvpool_client_device_lanes", "gauge", "GPU staging lanes (stream + 2 bounce buffers) created.",
            ds.lanes);
        one(t, "kvpool_client_device_lanes_busy", "gauge", "GPU staging lanes in use by a call now.", ds.lanes_busy);
        one(t, "kvpool_client_device_staged_bytes_total", "counter",
            "Bytes copied between GPU device memory and the bounce buffers.", ds.staged_bytes);
        one(t, "kvpool_client_device_copies_total", "counter", "GPU copies enqueued by the staging.", ds.copies);
        one(t, "kvpool_client_device_copy_errors_total", "counter",
            "GPU copies (or their stream) that failed: their keys got KVP_ERR_DEVICE.", ds.copy_errors);
    }
}

/* ------------------------------------------------------------------ lifecycle */

int kvp_client_metrics_start(struct kvp_client *c)
{
    if (c->cfg.metrics_port == 0)
        return KVP_OK;
    struct kvp_client_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return KVP_ERR_NOMEM;
    c->metrics = m;
    struct kvp_metrics_http_ops ops = {.ctx = c, .render = render};
    int rc = kvp_metrics_http_start(&m->http, c->name, c->cfg.local_hostname, c->cfg.metrics_port, 0, &ops);
    if (rc != KVP_OK) {
        c->metrics = NULL;
        free(m);
    }
    return rc;
}

void kvp_client_metrics_stop(struct kvp_client *c)
{
    if (!c || !c->metrics)
        return;
    kvp_metrics_http_stop(&c->metrics->http); /* no callback runs after this */
    free(c->metrics);
    c->metrics = NULL;
}
