/*
 * metrics.h — Prometheus metrics of a kvpool process (docs/operations.md "Metrics").
 *
 * Three parts:
 *  - kvp_metrics_hist: a fixed-bucket latency histogram (10 µs … 60 s), a plain struct owned by
 *    whoever observes into it (an actor's state, the raft thread's counters);
 *  - kvp_metrics_text: a growing text buffer that writes the Prometheus text exposition format
 *    0.0.4 (HELP/TYPE once per family, label values escaped);
 *  - kvp_metrics_http: the HTTP endpoint (libmicrohttpd) that serves /metrics, /healthz,
 *    /readyz and extra routes from callbacks of its owner.
 *
 * Where the endpoint runs, and so what its callbacks may read:
 *  - hosted in its owner actor (kvp_metrics_http_start_hosted): the actor watches the
 *    endpoint's fd and serves requests on its own thread, so the callbacks read the actor's
 *    state directly. The master service does this (actors/master/service/service_metrics.c),
 *    answering from a kvp_metrics_pub slot it re-renders every 500 ms.
 *  - on libmicrohttpd's own thread (kvp_metrics_http_start), for an owner that is not one actor
 *    (the client library, whose counters its callers' threads update): the callbacks read only
 *    relaxed atomics of single writers or kvp_metrics_ahist.
 */
#ifndef KVP_METRICS_H
#define KVP_METRICS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------ histogram */

/* Upper bounds of the buckets in microseconds: 10 µs … 60 s, then +Inf. */
#define KVP_METRICS_HIST_BUCKETS 20
extern const uint64_t kvp_metrics_hist_bounds_us[KVP_METRICS_HIST_BUCKETS];

/** A latency histogram. Zero-initialised is empty. Not thread-safe: one owner writes it. */
struct kvp_metrics_hist {
    uint64_t buckets[KVP_METRICS_HIST_BUCKETS + 1]; /* per bucket (not cumulative); last = +Inf */
    uint64_t count;
    uint64_t sum_us;
};

/** Count one observation of `us` microseconds. */
void kvp_metrics_hist_observe_us(struct kvp_metrics_hist *h, uint64_t us);

/**
 * A histogram many threads observe into at once (the client library's API calls run on the
 * callers' threads, which have no actor to own the counts): every field is updated with a
 * relaxed atomic add and read with relaxed loads. Relaxed: the fields are independent counts;
 * a reader may see a bucket counted before its _count, which the next scrape corrects.
 * `bounds` are the upper bounds of the first KVP_METRICS_HIST_BUCKETS buckets (any unit).
 */
struct kvp_metrics_ahist {
    _Atomic uint64_t buckets[KVP_METRICS_HIST_BUCKETS + 1];
    _Atomic uint64_t count;
    _Atomic uint64_t sum;
};
void kvp_metrics_ahist_observe(struct kvp_metrics_ahist *h, const uint64_t *bounds, uint64_t v);
/** Copy into a plain histogram (sum_us takes `sum` in the histogram's own unit). */
void kvp_metrics_ahist_read(struct kvp_metrics_ahist *h, struct kvp_metrics_hist *out);

/* ------------------------------------------------------------------ text exposition */

/** A growing NUL-terminated text buffer. Zero-initialised is empty; free with _fini. An
 * allocation failure sets `failed` and later writes do nothing (check it before using buf). */
struct kvp_metrics_text {
    char *buf;
    size_t len;
    size_t cap;
    bool failed;
};

void kvp_metrics_text_fini(struct kvp_metrics_text *t);
/** Take the buffer (malloc'd, caller frees; "" when empty) and reset t. NULL when failed. */
char *kvp_metrics_text_take(struct kvp_metrics_text *t);
/** printf-style append. */
void kvp_metrics_text_printf(struct kvp_metrics_text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/** "# HELP name help\n# TYPE name type\n". type: counter, gauge, histogram. Write it once per
 * family, before its samples; a family's samples must not be interleaved with another's. */
void kvp_metrics_family(struct kvp_metrics_text *t, const char *name, const char *type, const char *help);

/**
 * One sample: name{labels} value. `labels` is NULL or a NULL-terminated list of name, value
 * pairs ({"code", "OK", NULL}); values are escaped (\\, \", \n). Integers print exactly.
 */
void kvp_metrics_sample_u64(struct kvp_metrics_text *t, const char *name, const char *const *labels,
                            uint64_t v);
void kvp_metrics_sample_double(struct kvp_metrics_text *t, const char *name, const char *const *labels,
                               double v);
/** The _bucket{le=...} (cumulative, seconds), _sum (seconds) and _count samples of h. */
void kvp_metrics_sample_hist(struct kvp_metrics_text *t, const char *name, const char *const *labels,
                             const struct kvp_metrics_hist *h);
/** The same for a histogram of plain numbers (le = bounds[i] as is; sum as is). */
void kvp_metrics_sample_hist_units(struct kvp_metrics_text *t, const char *name, const char *const *labels,
                                   const struct kvp_metrics_hist *h, const uint64_t *bounds, double scale);

/* ------------------------------------------------------------------ published documents */

enum kvp_metrics_doc {
    KVP_METRICS_DOC_METRICS = 0, /* the Prometheus text */
    KVP_METRICS_DOC_SEGMENTS,    /* master: /get_all_segments body */
    KVP_METRICS_DOC_N
};

/**
 * The documents an actor last rendered, for its hosted endpoint: a scrape copies the current
 * one instead of rendering again, so many scrapes cost the owner a copy each. Not thread-safe:
 * written and read on the owner's thread only (the endpoint is hosted in that actor).
 */
struct kvp_metrics_pub {
    char *doc[KVP_METRICS_DOC_N];   /* malloc'd, or NULL before the first publish */
    uint64_t published_ms;          /* monotonic time of the last kvp_metrics_pub_set (any doc) */
    bool ready;                     /* the owner's readiness (/readyz) */
    char not_ready[128];            /* why not ready */
    char redirect[300];             /* master follower: "http://host:port" of the leader's endpoint */
};

void kvp_metrics_pub_init(struct kvp_metrics_pub *p);
void kvp_metrics_pub_fini(struct kvp_metrics_pub *p);
/** Replace document `which` with *doc (ownership moves, *doc set NULL). Owner's thread. */
void kvp_metrics_pub_set(struct kvp_metrics_pub *p, enum kvp_metrics_doc which, char **doc);
/** Publish readiness: ready, or not with a reason; `redirect` NULL = none. Owner's thread. */
void kvp_metrics_pub_state(struct kvp_metrics_pub *p, bool ready, const char *why, const char *redirect);
/** A malloc'd copy of document `which` (NULL when never published or out of memory), and the
 * publish time in *published_ms (may be NULL). Owner's thread. */
char *kvp_metrics_pub_copy(struct kvp_metrics_pub *p, enum kvp_metrics_doc which, uint64_t *published_ms);

/* ------------------------------------------------------------------ HTTP endpoint */

/** Callbacks of the HTTP endpoint's owner. Hosted: they run on the owner's thread. Threaded:
 * on libmicrohttpd's thread, reading only relaxed atomics of single writers (metrics.h top). */
struct kvp_metrics_http_ops {
    void *ctx;
    /** Append the process's metrics to t. Required. */
    void (*render)(void *ctx, struct kvp_metrics_text *t);
    /** Ready? When not, write a one-line reason into why. NULL = always ready. */
    bool (*ready)(void *ctx, char *why, size_t why_cap);
    /**
     * Extra GET routes (e.g. "/get_all_segments"). Return the HTTP status and set *body
     * (malloc'd, the endpoint frees it) and *content_type; for a redirect (3xx) *body is the
     * Location. Return 0 for an unknown path (the endpoint answers 404). NULL = none.
     */
    int (*route)(void *ctx, const char *path, char **body, const char **content_type);
};

struct kvp_metrics_http;

/**
 * Serve HTTP on host:port (host "" or NULL = every address; names resolve to their first
 * address) from libmicrohttpd's own thread. The port is bound here (SO_REUSEADDR); one still
 * held is retried for bind_retry_ms with one log line per try (kvp_retry_start). Then:
 *  GET /metrics   200, text/plain; version=0.0.4: ops->render, then process series
 *                 (kvpool_process_start_time_seconds, kvpool_build_info)
 *  GET /healthz   200 "ok" while the process runs
 *  GET /readyz    200 "ready", or 503 "not ready: <why>" (ops->ready)
 *  GET <route>    ops->route
 *  other paths    404 with a one-line reason; methods other than GET/HEAD 405; both logged
 *                 (WARN, at most 10 lines a second) and the server keeps serving.
 * `actor` names the log lines (copied). ops is copied. Blocks only to bind.
 * Errors: KVP_ERR_INVALID (port 0 or > 65535, bad host: logged), KVP_ERR_IO (bind, or the
 * server did not start: logged with the reason), KVP_ERR_NOMEM.
 */
int kvp_metrics_http_start(struct kvp_metrics_http **out, const char *actor, const char *host, uint32_t port,
                           uint32_t bind_retry_ms, const struct kvp_metrics_http_ops *ops);

/**
 * As kvp_metrics_http_start, the same routes and errors, but with no thread: the caller (an
 * actor) hosts the endpoint. Watch kvp_metrics_http_fd() for reading and call
 * kvp_metrics_http_run() when it is readable and at least every second (idle connections are
 * closed after 10 s, only while it runs). The callbacks then run inside kvp_metrics_http_run,
 * on the caller's thread. Linux only (libmicrohttpd's epoll mode).
 */
int kvp_metrics_http_start_hosted(struct kvp_metrics_http **out, const char *actor, const char *host,
                                  uint32_t port, uint32_t bind_retry_ms, const struct kvp_metrics_http_ops *ops);

/** A hosted endpoint's fd (libmicrohttpd's epoll set; readable when a socket is ready). -1 when
 * none (NULL, or a threaded endpoint). Owned by the endpoint: do not close it. */
int kvp_metrics_http_fd(const struct kvp_metrics_http *h);

/**
 * Serve what is ready on a hosted endpoint: accept, read requests, call the callbacks, write
 * answers, close idle connections. Never blocks (non-blocking sockets, epoll timeout 0); does at
 * most 8 rounds of libmicrohttpd's work, each bounded by its 64 connections. Accepts NULL.
 */
void kvp_metrics_http_run(struct kvp_metrics_http *h);

/** The bound port (useful with tests). */
uint32_t kvp_metrics_http_port(const struct kvp_metrics_http *h);

/** Stop the endpoint (threaded: its thread, after a request in progress completes), free. Accepts NULL; sets NULL.
 * After it returns no callback runs. */
void kvp_metrics_http_stop(struct kvp_metrics_http **h);

/** The host part of "host:port" / "[v6]:port" into buf (no brackets); "" when none. */
void kvp_metrics_host_of(const char *hostport, char *buf, size_t cap);

#endif
