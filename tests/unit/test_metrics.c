/*
 * test_metrics.c — the metrics module (metrics/metrics.h): Prometheus text writer, histogram,
 * publish slot, the HTTP endpoint on loopback (on libmicrohttpd's thread, and hosted on a loop
 * thread of the test's, as an actor hosts it; no timing), and the
 * tests' own format checker (tests/lib/prom_check.h) — which must reject bad text, or the
 * format checks of the integration test could not fail.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "kvpool.h"
#include "metrics/metrics.h"
#include "tests/lib/http_get.h"
#include "tests/lib/prom_check.h"

static void check_ok(const char *text)
{
    char why[512];
    int rc = kvp_test_prom_check(text, "kvpool_", why, sizeof why);
    if (rc != 0)
        fprintf(stderr, "checker: %s\n---\n%s---\n", why, text);
    assert_int_equal(rc, 0);
    rc = kvp_test_promtool(text, why, sizeof why);
    if (rc == 1)
        fprintf(stderr, "promtool: %s\n---\n%s---\n", why, text);
    assert_true(rc != 1); /* passed, or promtool not installed */
}

static void test_metrics_text_labels_escaped(void **state)
{
    struct kvp_metrics_text t = {0};
    kvp_metrics_family(&t, "kvpool_x_total", "counter", "A test counter.");
    const char *l[] = {"segment", "a\"b\\c\nd", "code", "KVP_OK", NULL};
    kvp_metrics_sample_u64(&t, "kvpool_x_total", l, 18446744073709551615ull);
    kvp_metrics_family(&t, "kvpool_y", "gauge", "A gauge.");
    kvp_metrics_sample_double(&t, "kvpool_y", NULL, 0.25);
    char *s = kvp_metrics_text_take(&t);
    assert_non_null(s);
    assert_string_equal(s, "# HELP kvpool_x_total A test counter.\n# TYPE kvpool_x_total counter\n"
                           "kvpool_x_total{segment=\"a\\\"b\\\\c\\nd\",code=\"KVP_OK\"} 18446744073709551615\n"
                           "# HELP kvpool_y A gauge.\n# TYPE kvpool_y gauge\nkvpool_y 0.25\n");
    check_ok(s);
    free(s);
}

static void test_metrics_hist_buckets_cumulative(void **state)
{
    struct kvp_metrics_hist h = {0};
    kvp_metrics_hist_observe_us(&h, 5);        /* <= 10 µs */
    kvp_metrics_hist_observe_us(&h, 10);       /* <= 10 µs (bounds are inclusive) */
    kvp_metrics_hist_observe_us(&h, 11);       /* <= 25 µs */
    kvp_metrics_hist_observe_us(&h, 60000000); /* <= 60 s */
    kvp_metrics_hist_observe_us(&h, 70000000); /* +Inf */
    assert_int_equal(h.buckets[0], 2);
    assert_int_equal(h.buckets[1], 1);
    assert_int_equal(h.buckets[KVP_METRICS_HIST_BUCKETS - 1], 1);
    assert_int_equal(h.buckets[KVP_METRICS_HIST_BUCKETS], 1);
    assert_int_equal(h.count, 5);
    assert_int_equal(kvp_metrics_hist_bounds_us[0], 10);
    assert_int_equal(kvp_metrics_hist_bounds_us[KVP_METRICS_HIST_BUCKETS - 1], 60000000);
    struct kvp_metrics_text t = {0};
    kvp_metrics_family(&t, "kvpool_lat_seconds", "histogram", "Latency.");
    const char *l[] = {"type", "get", NULL};
    kvp_metrics_sample_hist(&t, "kvpool_lat_seconds", l, &h);
    char *s = kvp_metrics_text_take(&t);
    assert_non_null(strstr(s, "kvpool_lat_seconds_bucket{type=\"get\",le=\"1e-05\"} 2\n"));
    assert_non_null(strstr(s, "kvpool_lat_seconds_bucket{type=\"get\",le=\"2.5e-05\"} 3\n"));
    assert_non_null(strstr(s, "kvpool_lat_seconds_bucket{type=\"get\",le=\"60\"} 4\n"));
    assert_non_null(strstr(s, "kvpool_lat_seconds_bucket{type=\"get\",le=\"+Inf\"} 5\n"));
    assert_non_null(strstr(s, "kvpool_lat_seconds_count{type=\"get\"} 5\n"));
    assert_non_null(strstr(s, "kvpool_lat_seconds_sum{type=\"get\"} 130.000026\n"));
    check_ok(s);
    assert_true(kvp_test_prom_value(s, "kvpool_lat_seconds_count{type=\"get\"}") == 5.0);
    assert_true(kvp_test_prom_value(s, "kvpool_lat_seconds_count{type=\"put\"}") == -1.0);
    free(s);
}

/* The checker must fail on each of these, or the integration test's format check proves nothing. */
static void test_prom_check_rejects_bad_text(void **state)
{
    static const char *bad[] = {
        "# TYPE kvpool_a counter\nkvpool_a 1\n",                                     /* counter without _total */
        "# TYPE kvpool_a gauge\nkvpool_a 1\nkvpool_a 2\n",                           /* duplicate series */
        "# TYPE kvpool_a gauge\nkvpool_a{x=\"1\"} 1\n# TYPE kvpool_b gauge\nkvpool_b 1\nkvpool_a{x=\"2\"} 1\n",
        "# TYPE kvpool_a gauge\nkvpool_a{x=\"\\q\"} 1\n",                            /* bad escape */
        "# TYPE kvpool_a gauge\nkvpool_a one\n",                                     /* not a number */
        "# TYPE kvpool_a gauge\nkvpool_a 1",                                         /* no final newline */
        "kvpool_a 1\n# TYPE kvpool_a gauge\n",                                       /* TYPE after samples */
        "# TYPE kvpool_a gauge\n# TYPE kvpool_a gauge\nkvpool_a 1\n",                /* two TYPEs */
        "# TYPE other_a gauge\nother_a 1\n",                                         /* no kvpool_ prefix */
        "# TYPE kvpool_a gauge\nkvpool_a{1x=\"a\"} 1\n",                             /* bad label name */
        "# TYPE kvpool_a gauge\nkvpool_a{x=\"a} 1\n",                                /* unterminated value */
        "# TYPE kvpool_a wibble\nkvpool_a 1\n",                                      /* unknown type */
        "# TYPE kvpool_h histogram\nkvpool_h_bucket{le=\"1\"} 2\nkvpool_h_bucket{le=\"+Inf\"} 1\n"
        "kvpool_h_sum 1\nkvpool_h_count 1\n",                                        /* buckets decrease */
        "# TYPE kvpool_h histogram\nkvpool_h_bucket{le=\"1\"} 1\nkvpool_h_bucket{le=\"+Inf\"} 2\n"
        "kvpool_h_sum 1\nkvpool_h_count 3\n",                                        /* count != +Inf */
        "# TYPE kvpool_h histogram\nkvpool_h_bucket{le=\"1\"} 1\nkvpool_h_sum 1\n",  /* no +Inf */
        "# TYPE kvpool_h histogram\nkvpool_h 1\n",                                   /* bare histogram sample */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char why[512];
        if (kvp_test_prom_check(bad[i], "kvpool_", why, sizeof why) == 0)
            fail_msg("checker accepted bad text #%zu:\n%s", i, bad[i]);
    }
}

static void test_metrics_pub_set_copy_state(void **state)
{
    struct kvp_metrics_pub p;
    kvp_metrics_pub_init(&p);
    uint64_t at = 1;
    assert_null(kvp_metrics_pub_copy(&p, KVP_METRICS_DOC_METRICS, &at));
    assert_int_equal(at, 0);
    char *d = strdup("a\n");
    kvp_metrics_pub_set(&p, KVP_METRICS_DOC_METRICS, &d);
    assert_null(d);
    char *c = kvp_metrics_pub_copy(&p, KVP_METRICS_DOC_METRICS, &at);
    assert_string_equal(c, "a\n");
    assert_true(at > 0);
    free(c);
    assert_null(kvp_metrics_pub_copy(&p, KVP_METRICS_DOC_SEGMENTS, NULL));
    assert_null(kvp_metrics_pub_copy(&p, (enum kvp_metrics_doc)7, NULL));
    kvp_metrics_pub_state(&p, false, "no leader", NULL);
    assert_false(p.ready);
    assert_string_equal(p.not_ready, "no leader");
    kvp_metrics_pub_fini(&p);
    char host[64];
    kvp_metrics_host_of("10.0.0.1:7101", host, sizeof host);
    assert_string_equal(host, "10.0.0.1");
    kvp_metrics_host_of("[::1]:7101", host, sizeof host);
    assert_string_equal(host, "::1");
}

/* ------------------------------------------------------------------ the endpoint */

struct fx_http {
    bool ready;
    unsigned renders;
};

static void fx_render(void *ctx, struct kvp_metrics_text *t)
{
    struct fx_http *f = ctx;
    f->renders++;
    kvp_metrics_family(t, "kvpool_test_renders_total", "counter", "Renders.");
    kvp_metrics_sample_u64(t, "kvpool_test_renders_total", NULL, f->renders);
}

static bool fx_ready(void *ctx, char *why, size_t cap)
{
    struct fx_http *f = ctx;
    if (!f->ready)
        snprintf(why, cap, "test says no");
    return f->ready;
}

static int fx_route(void *ctx, const char *path, char **body, const char **ct)
{
    if (strcmp(path, "/get_all_segments") == 0) {
        *body = strdup("seg-a\nseg-b\n");
        return 200;
    }
    if (strcmp(path, "/moved") == 0) {
        *body = strdup("http://127.0.0.2:1/elsewhere");
        return 307;
    }
    return 0;
}

static void get(uint32_t port, const char *method, const char *path, int want_status, const char *want_body_part,
                const char *want_header_part)
{
    int st = 0;
    char *body = NULL, *hdr = NULL;
    assert_int_equal(kvp_test_http(port, method, path, &st, &body, &hdr, 5000), 0);
    if (st != want_status || (want_body_part && !strstr(body, want_body_part)) ||
        (want_header_part && !strstr(hdr, want_header_part)))
        fail_msg("%s %s: status %d body '%s' headers '%s'", method, path, st, body, hdr);
    free(body);
    free(hdr);
}

static void test_metrics_http_endpoints_answer(void **state)
{
    struct fx_http f = {.ready = false};
    struct kvp_metrics_http_ops ops = {.ctx = &f, .render = fx_render, .ready = fx_ready, .route = fx_route};
    struct kvp_metrics_http *h = NULL;
    uint32_t port = kvp_test_free_port();
    assert_true(port > 0);
    assert_int_equal(kvp_metrics_http_start(&h, "test", "127.0.0.1", port, 2000, &ops), KVP_OK);
    assert_int_equal(kvp_metrics_http_port(h), port);
    get(port, "GET", "/healthz", 200, "ok", NULL);
    get(port, "GET", "/readyz", 503, "not ready: test says no", NULL);
    f.ready = true;
    get(port, "GET", "/readyz", 200, "ready", NULL);
    get(port, "GET", "/metrics", 200, "kvpool_test_renders_total 1\n", "version=0.0.4");
    int st = 0;
    char *body = NULL;
    assert_int_equal(kvp_test_http(port, "GET", "/metrics", &st, &body, NULL, 5000), 0);
    assert_non_null(strstr(body, "kvpool_process_start_time_seconds "));
    assert_non_null(strstr(body, "kvpool_build_info{version="));
    check_ok(body);
    free(body);
    get(port, "GET", "/get_all_segments", 200, "seg-a\nseg-b\n", NULL);
    get(port, "GET", "/moved", 307, NULL, "Location: http://127.0.0.2:1/elsewhere");
    get(port, "GET", "/nope", 404, "no such path /nope", NULL);
    get(port, "POST", "/metrics", 405, "only GET and HEAD", NULL);
    get(port, "DELETE", "/healthz", 405, NULL, NULL);
    get(port, "GET", "/healthz", 200, "ok", NULL); /* still serving after bad requests */
    /* A second endpoint on the same port: refused after its (short) retry budget. */
    struct kvp_metrics_http *h2 = NULL;
    assert_int_equal(kvp_metrics_http_start(&h2, "test", "127.0.0.1", port, 0, &ops), KVP_ERR_IO);
    assert_null(h2);
    assert_int_equal(kvp_metrics_http_start(&h2, "test", "127.0.0.1", 0, 0, &ops), KVP_ERR_INVALID);
    assert_int_equal(kvp_metrics_http_start(&h2, "test", "127.0.0.1", 70000, 0, &ops), KVP_ERR_INVALID);
    kvp_metrics_http_stop(&h);
    assert_null(h);
    kvp_metrics_http_stop(&h); /* NULL is fine */
    assert_int_not_equal(kvp_test_http(port, "GET", "/healthz", &st, &body, NULL, 2000), 0);
}

/* ------------------------------------------------------------------ the hosted endpoint */

/* The hosting loop: what an actor does with kvp_rt_watch_fd, on a plain thread of the test. */
struct fx_host {
    struct kvp_metrics_http *h;
    atomic_bool stop;
    pthread_t loop;
    size_t big;                 /* bytes of filler each render adds */
    atomic_uint rounds;         /* loop iterations: it is not stuck in a call */
    /* loop thread only (read by the test after the join): */
    unsigned renders;
    unsigned renders_elsewhere; /* renders that ran on any other thread */
};

static void fx_host_render(void *ctx, struct kvp_metrics_text *t)
{
    struct fx_host *f = ctx;
    f->renders++;
    if (!pthread_equal(pthread_self(), f->loop))
        f->renders_elsewhere++;
    kvp_metrics_family(t, "kvpool_test_renders_total", "counter", "Renders.");
    kvp_metrics_sample_u64(t, "kvpool_test_renders_total", NULL, f->renders);
    for (size_t i = 0; i < f->big / 64; i++)
        kvp_metrics_text_printf(t, "# filler %054zu\n", i);
}

static void *fx_host_loop(void *arg)
{
    struct fx_host *f = arg;
    struct pollfd p = {.fd = kvp_metrics_http_fd(f->h), .events = POLLIN};
    while (!atomic_load(&f->stop)) {
        poll(&p, 1, 50); /* the bound stands for the owner's timer */
        kvp_metrics_http_run(f->h);
        atomic_fetch_add(&f->rounds, 1);
    }
    return NULL;
}

/* A raw loopback connection that sends `req` and then does nothing (a slow scraper). */
static int stalled_conn(uint32_t port, const char *req)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
    return fd;
}

/* Hosted: no thread of its own; every callback runs on the thread that calls run(), and a
 * scraper that stops halfway through its request, or never reads a large answer, does not stop
 * that thread from answering the next scrape. */
static void test_metrics_http_hosted_serves_on_caller_thread(void **state)
{
    struct fx_host f = {.big = 1 << 20};
    struct kvp_metrics_http_ops ops = {.ctx = &f, .render = fx_host_render};
    uint32_t port = kvp_test_free_port();
    assert_true(port > 0);
    assert_int_equal(kvp_metrics_http_start_hosted(&f.h, "test", "127.0.0.1", port, 2000, &ops), KVP_OK);
    assert_true(kvp_metrics_http_fd(f.h) >= 0);
    assert_int_equal(kvp_metrics_http_fd(NULL), -1);
    kvp_metrics_http_run(NULL); /* NULL is fine */
    assert_int_equal(pthread_create(&f.loop, NULL, fx_host_loop, &f), 0);
    get(port, "GET", "/healthz", 200, "ok", NULL);
    get(port, "GET", "/readyz", 200, "ready", NULL); /* no ready callback: ready */
    int half = stalled_conn(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n");  /* never finished */
    int noread = stalled_conn(port, "GET /metrics HTTP/1.0\r\n\r\n");       /* 1 MiB never read */
    get(port, "GET", "/metrics", 200, "kvpool_build_info{version=", "version=0.0.4");
    get(port, "GET", "/nope", 404, "no such path /nope", NULL);
    get(port, "GET", "/healthz", 200, "ok", NULL);
    /* With no connection waiting, run() returns (a blocking accept would hold it here). */
    unsigned r0 = atomic_load(&f.rounds);
    for (int i = 0; i < 500 && atomic_load(&f.rounds) < r0 + 3; i++)
        usleep(10 * 1000);
    assert_true(atomic_load(&f.rounds) >= r0 + 3);
    close(half);
    close(noread);
    atomic_store(&f.stop, true);
    pthread_join(f.loop, NULL);
    assert_true(f.renders >= 2);
    assert_int_equal(f.renders_elsewhere, 0);
    kvp_metrics_http_stop(&f.h);
    assert_null(f.h);
    int st = 0;
    char *body = NULL;
    assert_int_not_equal(kvp_test_http(port, "GET", "/healthz", &st, &body, NULL, 2000), 0);
    /* The same argument checks as the threaded start. */
    struct kvp_metrics_http *h2 = NULL;
    assert_int_equal(kvp_metrics_http_start_hosted(&h2, "test", "127.0.0.1", 0, 0, &ops), KVP_ERR_INVALID);
    assert_null(h2);
}

/* metrics_port: off by default; Mooncake's --metrics_port and --metrics-port alike; bounds. */
static void test_metrics_port_key_both_spellings(void **state)
{
    struct kvp_cfg_master m;
    kvp_cfg_defaults(KVP_CFG_MASTER, &m);
    assert_int_equal(m.metrics_port, 0);
    char *a1[] = {"kvpool-master", "--metrics_port", "9003", NULL};
    assert_int_equal(kvp_cfg_from_args(KVP_CFG_MASTER, &m, 3, a1, NULL, NULL, 0, NULL), KVP_OK);
    assert_int_equal(m.metrics_port, 9003);
    char *a2[] = {"kvpool-master", "--metrics-port=9004", NULL};
    assert_int_equal(kvp_cfg_from_args(KVP_CFG_MASTER, &m, 2, a2, NULL, NULL, 0, NULL), KVP_OK);
    assert_int_equal(m.metrics_port, 9004);
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "metrics_port", "70000"), KVP_ERR_INVALID);
    assert_int_equal(m.metrics_port, 9004);
    struct kvp_cfg_segment sg;
    kvp_cfg_defaults(KVP_CFG_SEGMENT, &sg);
    assert_int_equal(sg.metrics_port, 0);
    assert_int_equal(kvp_cfg_set(KVP_CFG_SEGMENT, &sg, "metrics-port", "9005"), KVP_OK);
    assert_int_equal(sg.metrics_port, 9005);
    assert_int_equal(kvp_cfg_set(KVP_CFG_SEGMENT, &sg, "metrics_port", "-1"), KVP_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_text_labels_escaped),
        cmocka_unit_test(test_metrics_hist_buckets_cumulative),
        cmocka_unit_test(test_prom_check_rejects_bad_text),
        cmocka_unit_test(test_metrics_pub_set_copy_state),
        cmocka_unit_test(test_metrics_http_endpoints_answer),
        cmocka_unit_test(test_metrics_http_hosted_serves_on_caller_thread),
        cmocka_unit_test(test_metrics_port_key_both_spellings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
