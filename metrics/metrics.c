/*
 * metrics.c — histogram, Prometheus text writer and the publish slot (metrics.h). No locks:
 * the slot lives on its owner's thread, the shared histogram uses relaxed atomics.
 */
#include "metrics/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/clock.h"

const uint64_t kvp_metrics_hist_bounds_us[KVP_METRICS_HIST_BUCKETS] = {
    10,     25,     50,      100,     250,     500,       1000,      2500,      5000,       10000,
    25000,  50000,  100000,  250000,  500000,  1000000,   2500000,   5000000,   10000000,   60000000,
};

void kvp_metrics_hist_observe_us(struct kvp_metrics_hist *h, uint64_t us)
{
    size_t i = 0;
    while (i < KVP_METRICS_HIST_BUCKETS && us > kvp_metrics_hist_bounds_us[i])
        i++;
    h->buckets[i]++;
    h->count++;
    h->sum_us += us;
}

/* ------------------------------------------------------------------ text */

void kvp_metrics_text_fini(struct kvp_metrics_text *t)
{
    free(t->buf);
    memset(t, 0, sizeof *t);
}

char *kvp_metrics_text_take(struct kvp_metrics_text *t)
{
    if (t->failed) {
        kvp_metrics_text_fini(t);
        return NULL;
    }
    char *b = t->buf ? t->buf : strdup("");
    memset(t, 0, sizeof *t);
    return b;
}

static void vappend(struct kvp_metrics_text *t, const char *fmt, va_list ap)
{
    if (t->failed)
        return;
    for (;;) {
        size_t room = t->cap - t->len;
        va_list aq;
        va_copy(aq, ap);
        int n = room ? vsnprintf(t->buf + t->len, room, fmt, aq) : -2;
        va_end(aq);
        if (n == -1) {
            t->failed = true;
            return;
        }
        if (n >= 0 && (size_t)n < room) {
            t->len += (size_t)n;
            return;
        }
        size_t need = t->len + (n > 0 ? (size_t)n : 0) + 1;
        size_t cap = t->cap ? t->cap * 2 : 4096;
        while (cap < need)
            cap *= 2;
        char *nb = realloc(t->buf, cap);
        if (!nb) {
            t->failed = true;
            return;
        }
        t->buf = nb;
        t->cap = cap;
    }
}

void kvp_metrics_text_printf(struct kvp_metrics_text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vappend(t, fmt, ap);
    va_end(ap);
}

void kvp_metrics_family(struct kvp_metrics_text *t, const char *name, const char *type, const char *help)
{
    /* HELP text escapes only \ and newline; ours are plain sentences. */
    kvp_metrics_text_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void put_escaped(struct kvp_metrics_text *t, const char *v)
{
    for (const char *p = v ? v : ""; *p; p++) {
        if (*p == '\\')
            kvp_metrics_text_printf(t, "\\\\");
        else if (*p == '"')
            kvp_metrics_text_printf(t, "\\\"");
        else if (*p == '\n')
            kvp_metrics_text_printf(t, "\\n");
        else
            kvp_metrics_text_printf(t, "%c", *p);
    }
}

/* name{a="x",b="y"  (no closing brace: the caller may add le=) */
static bool put_name_labels(struct kvp_metrics_text *t, const char *name, const char *suffix,
                            const char *const *labels)
{
    kvp_metrics_text_printf(t, "%s%s", name, suffix ? suffix : "");
    bool any = false;
    for (size_t i = 0; labels && labels[i] && labels[i + 1]; i += 2) {
        kvp_metrics_text_printf(t, "%s%s=\"", any ? "," : "{", labels[i]);
        put_escaped(t, labels[i + 1]);
        kvp_metrics_text_printf(t, "\"");
        any = true;
    }
    return any;
}

void kvp_metrics_sample_u64(struct kvp_metrics_text *t, const char *name, const char *const *labels, uint64_t v)
{
    bool any = put_name_labels(t, name, NULL, labels);
    kvp_metrics_text_printf(t, "%s %llu\n", any ? "}" : "", (unsigned long long)v);
}

void kvp_metrics_sample_double(struct kvp_metrics_text *t, const char *name, const char *const *labels, double v)
{
    bool any = put_name_labels(t, name, NULL, labels);
    kvp_metrics_text_printf(t, "%s %.15g\n", any ? "}" : "", v);
}

void kvp_metrics_sample_hist_units(struct kvp_metrics_text *t, const char *name, const char *const *labels,
                                   const struct kvp_metrics_hist *h, const uint64_t *bounds, double scale)
{
    uint64_t cum = 0;
    for (size_t i = 0; i <= KVP_METRICS_HIST_BUCKETS; i++) {
        cum += h->buckets[i];
        bool any = put_name_labels(t, name, "_bucket", labels);
        if (i < KVP_METRICS_HIST_BUCKETS)
            kvp_metrics_text_printf(t, "%sle=\"%g\"} %llu\n", any ? "," : "{", (double)bounds[i] * scale,
                                    (unsigned long long)cum);
        else
            kvp_metrics_text_printf(t, "%sle=\"+Inf\"} %llu\n", any ? "," : "{", (unsigned long long)cum);
    }
    bool any = put_name_labels(t, name, "_sum", labels);
    kvp_metrics_text_printf(t, "%s %.15g\n", any ? "}" : "", (double)h->sum_us * scale);
    any = put_name_labels(t, name, "_count", labels);
    kvp_metrics_text_printf(t, "%s %llu\n", any ? "}" : "", (unsigned long long)h->count);
}

void kvp_metrics_sample_hist(struct kvp_metrics_text *t, const char *name, const char *const *labels,
                             const struct kvp_metrics_hist *h)
{
    kvp_metrics_sample_hist_units(t, name, labels, h, kvp_metrics_hist_bounds_us, 1e-6);
}

void kvp_metrics_ahist_observe(struct kvp_metrics_ahist *h, const uint64_t *bounds, uint64_t v)
{
    size_t i = 0;
    while (i < KVP_METRICS_HIST_BUCKETS && v > bounds[i])
        i++;
    atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum, v, memory_order_relaxed);
}

void kvp_metrics_ahist_read(struct kvp_metrics_ahist *h, struct kvp_metrics_hist *out)
{
    /* Buckets first, count last: a concurrent observe can only make the count trail the
     * buckets, so fix the count up to their sum (a valid exposition: +Inf bucket == count). */
    uint64_t total = 0;
    for (size_t i = 0; i <= KVP_METRICS_HIST_BUCKETS; i++) {
        out->buckets[i] = atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
        total += out->buckets[i];
    }
    out->sum_us = atomic_load_explicit(&h->sum, memory_order_relaxed);
    out->count = total;
}

/* ------------------------------------------------------------------ publish slot */

void kvp_metrics_pub_init(struct kvp_metrics_pub *p)
{
    memset(p, 0, sizeof *p);
    snprintf(p->not_ready, sizeof p->not_ready, "starting");
}

void kvp_metrics_pub_fini(struct kvp_metrics_pub *p)
{
    for (int i = 0; i < KVP_METRICS_DOC_N; i++)
        free(p->doc[i]);
    memset(p, 0, sizeof *p);
}

void kvp_metrics_pub_set(struct kvp_metrics_pub *p, enum kvp_metrics_doc which, char **doc)
{
    if ((unsigned)which >= KVP_METRICS_DOC_N || !doc)
        return;
    free(p->doc[which]);
    p->doc[which] = *doc;
    p->published_ms = kvp_clock_now_ms();
    *doc = NULL;
}

void kvp_metrics_pub_state(struct kvp_metrics_pub *p, bool ready, const char *why, const char *redirect)
{
    p->ready = ready;
    snprintf(p->not_ready, sizeof p->not_ready, "%s", ready || !why ? "" : why);
    snprintf(p->redirect, sizeof p->redirect, "%s", redirect ? redirect : "");
}

char *kvp_metrics_pub_copy(struct kvp_metrics_pub *p, enum kvp_metrics_doc which, uint64_t *published_ms)
{
    if ((unsigned)which >= KVP_METRICS_DOC_N)
        return NULL;
    char *c = p->doc[which] ? strdup(p->doc[which]) : NULL;
    if (published_ms)
        *published_ms = p->published_ms;
    return c;
}

void kvp_metrics_host_of(const char *hostport, char *buf, size_t cap)
{
    if (!cap)
        return;
    buf[0] = '\0';
    if (!hostport)
        return;
    const char *end = strrchr(hostport, ':');
    const char *start = hostport;
    if (hostport[0] == '[') {
        const char *rb = strchr(hostport, ']');
        if (!rb)
            return;
        start = hostport + 1;
        end = rb;
    }
    if (!end)
        end = hostport + strlen(hostport);
    size_t n = (size_t)(end - start);
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, start, n);
    buf[n] = '\0';
}
