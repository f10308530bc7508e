/*
 * bench_tracefile.c — parse a Mooncake trace (JSON lines: timestamp, input_length,
 * output_length, hash_ids) into flat arrays. Pure: no I/O beyond reading the file.
 */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tools/bench/bench_internal.h"

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 1024;
    while (nc < need)
        nc *= 2;
    void *np = realloc(*p, nc * elem);
    if (!np)
        return KVP_ERR_NOMEM;
    *p = np;
    *cap = nc;
    return 0;
}

static int parse_line(const char *line, size_t len, struct bench_trace *t, size_t *reqcap,
                      size_t *idcap, char *errbuf, size_t errcap)
{
    json_error_t jerr;
    json_t *o = json_loadb(line, len, 0, &jerr);
    if (!o) {
        snprintf(errbuf, errcap, "not JSON: %s", jerr.text);
        return KVP_ERR_MALFORMED;
    }
    int rc = KVP_ERR_MALFORMED;
    json_t *ts = json_object_get(o, "timestamp");
    json_t *in = json_object_get(o, "input_length");
    json_t *outl = json_object_get(o, "output_length");
    json_t *ids = json_object_get(o, "hash_ids");
    if (!json_is_object(o)) {
        snprintf(errbuf, errcap, "not a JSON object");
        goto out;
    }
    if (!json_is_integer(ts) || json_integer_value(ts) < 0) {
        snprintf(errbuf, errcap, "timestamp missing or not an integer >= 0");
        goto out;
    }
    if (!json_is_integer(in) || json_integer_value(in) < 1 || json_integer_value(in) > UINT32_MAX) {
        snprintf(errbuf, errcap, "input_length missing or not an integer >= 1");
        goto out;
    }
    if (outl && (!json_is_integer(outl) || json_integer_value(outl) < 0)) {
        snprintf(errbuf, errcap, "output_length not an integer >= 0");
        goto out;
    }
    if (!json_is_array(ids) || json_array_size(ids) == 0 || json_array_size(ids) > 1000000) {
        snprintf(errbuf, errcap, "hash_ids missing, empty or not an array");
        goto out;
    }
    size_t k = json_array_size(ids);
    if (grow((void **)&t->ids, idcap, t->nids + k, sizeof(uint64_t)) ||
        grow((void **)&t->reqs, reqcap, t->n + 1, sizeof(struct bench_req))) {
        rc = KVP_ERR_NOMEM;
        snprintf(errbuf, errcap, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < k; i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
            snprintf(errbuf, errcap, "hash_ids[%zu] is not an integer >= 0", i);
            goto out;
        }
        t->ids[t->nids + i] = (uint64_t)json_integer_value(v);
    }
    struct bench_req *r = &t->reqs[t->n];
    r->ts_ms = (uint64_t)json_integer_value(ts);
    r->input_len = (uint32_t)json_integer_value(in);
    r->output_len = outl ? (uint32_t)json_integer_value(outl) : 0;
    r->nblocks = (uint32_t)k;
    r->hash_ids = NULL; /* fixed up once t->ids stops moving */
    t->nids += k;
    t->n++;
    if (k > t->max_blocks)
        t->max_blocks = (uint32_t)k;
    rc = 0;
out:
    json_decref(o);
    return rc;
}

int bench_trace_parse(const char *text, size_t len, size_t limit, struct bench_trace *out,
                      size_t *errline, char *errbuf, size_t errcap)
{
    struct bench_trace t = {0};
    size_t reqcap = 0, idcap = 0, lineno = 0;
    size_t pos = 0;
    char dummy[8];
    if (!errbuf) {
        errbuf = dummy;
        errcap = sizeof dummy;
    }
    if (errline)
        *errline = 0;
    while (pos < len && (limit == 0 || t.n < limit)) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        lineno++;
        size_t a = pos, b = end;
        while (a < b && (text[a] == ' ' || text[a] == '\t' || text[a] == '\r'))
            a++;
        while (b > a && (text[b - 1] == ' ' || text[b - 1] == '\t' || text[b - 1] == '\r'))
            b--;
        if (b > a) {
            int rc = parse_line(text + a, b - a, &t, &reqcap, &idcap, errbuf, errcap);
            if (rc) {
                if (errline)
                    *errline = lineno;
                free(t.reqs);
                free(t.ids);
                return rc;
            }
        }
        pos = end + 1;
    }
    size_t off = 0;
    for (size_t i = 0; i < t.n; i++) {
        t.reqs[i].hash_ids = t.ids + off;
        off += t.reqs[i].nblocks;
    }
    *out = t;
    return 0;
}

int bench_trace_load(const char *path, size_t limit, struct bench_trace *out, size_t *errline,
                     char *errbuf, size_t errcap)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errbuf)
            snprintf(errbuf, errcap, "%s: %s", path, strerror(errno));
        return KVP_ERR_IO;
    }
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    int ioerr = ferror(f);
    fclose(f);
    if (!buf || ioerr) {
        free(buf);
        if (errbuf)
            snprintf(errbuf, errcap, "%s: read failed", path);
        return buf ? KVP_ERR_IO : KVP_ERR_NOMEM;
    }
    int rc = bench_trace_parse(buf, len, limit, out, errline, errbuf, errcap);
    free(buf);
    return rc;
}

void bench_trace_free(struct bench_trace *t)
{
    if (!t)
        return;
    free(t->reqs);
    free(t->ids);
    memset(t, 0, sizeof *t);
}

uint32_t bench_block_tokens(const struct bench_req *r, uint32_t i, uint32_t block_tokens)
{
    if (i + 1 < r->nblocks)
        return block_tokens;
    uint64_t before = (uint64_t)block_tokens * (r->nblocks - 1);
    if (r->input_len <= before)
        return 1;
    uint64_t rest = r->input_len - before;
    return rest > block_tokens ? block_tokens : (uint32_t)rest;
}
