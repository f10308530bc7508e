/* prom_check.c — see prom_check.h. */
#define _GNU_SOURCE
#include "tests/lib/prom_check.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXF 512
#define MAXS 8192
#define MAXH 1024

struct fam {
    char name[128];
    char type[16];
    bool help, typed, had_samples, closed;
};

struct hist_series {
    char key[512];   /* family + labels without le */
    double last;
    bool has_inf;
    double inf;
    bool has_sum;
};

struct ck {
    struct fam fams[MAXF];
    int nf;
    char *series[MAXS];
    int ns;
    struct hist_series hs[MAXH];
    int nh;
    int cur; /* index of the family whose samples came last, -1 */
    char *why;
    size_t cap;
    int line;
};

static int fail(struct ck *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct ck *c, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->why, c->cap, "line %d: %s", c->line, msg);
    return -1;
}

static bool name_ok(const char *s, size_t n, bool colon)
{
    if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_' || (colon && s[0] == ':')))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || (colon && s[i] == ':')))
            return false;
    return true;
}

static struct fam *fam_get(struct ck *c, const char *name, bool create)
{
    for (int i = 0; i < c->nf; i++)
        if (strcmp(c->fams[i].name, name) == 0)
            return &c->fams[i];
    if (!create || c->nf >= MAXF)
        return NULL;
    struct fam *f = &c->fams[c->nf++];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    return f;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int comment(struct ck *c, const char *l, const char *prefix)
{
    char kw[8], name[256];
    int n = 0;
    if (sscanf(l, "# %7s %255s %n", kw, name, &n) < 2 || (strcmp(kw, "HELP") && strcmp(kw, "TYPE")))
        return 0; /* another comment */
    if (!name_ok(name, strlen(name), true))
        return fail(c, "bad metric name '%s' in %s", name, kw);
    if (prefix && strncmp(name, prefix, strlen(prefix)) != 0)
        return fail(c, "family %s lacks the prefix %s", name, prefix);
    struct fam *f = fam_get(c, name, true);
    if (!f)
        return fail(c, "too many families");
    if (f->had_samples)
        return fail(c, "%s for %s after its samples", kw, name);
    if (strcmp(kw, "HELP") == 0) {
        if (f->help)
            return fail(c, "second HELP for %s", name);
        f->help = true;
        return 0;
    }
    if (f->typed)
        return fail(c, "second TYPE for %s", name);
    const char *t = l + n;
    static const char *types[] = {"counter", "gauge", "histogram", "summary", "untyped"};
    bool ok = false;
    for (size_t i = 0; i < 5; i++)
        if (strcmp(t, types[i]) == 0)
            ok = true;
    if (!ok)
        return fail(c, "unknown type '%s' for %s", t, name);
    snprintf(f->type, sizeof f->type, "%s", t);
    f->typed = true;
    if (strcmp(t, "counter") == 0 && !ends_with(name, "_total"))
        return fail(c, "counter %s does not end in _total", name);
    return 0;
}

static struct hist_series *hist_get(struct ck *c, const char *key)
{
    for (int i = 0; i < c->nh; i++)
        if (strcmp(c->hs[i].key, key) == 0)
            return &c->hs[i];
    if (c->nh >= MAXH)
        return NULL;
    struct hist_series *h = &c->hs[c->nh++];
    memset(h, 0, sizeof *h);
    snprintf(h->key, sizeof h->key, "%s", key);
    return h;
}

static int sample(struct ck *c, const char *l, const char *prefix)
{
    const char *p = l;
    while (*p && (isalnum((unsigned char)*p) || *p == '_' || *p == ':'))
        p++;
    char name[256];
    size_t nn = (size_t)(p - l);
    if (!name_ok(l, nn, true) || nn >= sizeof name)
        return fail(c, "bad sample name in '%.80s'", l);
    memcpy(name, l, nn);
    name[nn] = '\0';
    /* labels, canonical "a=v," text without le, and le */
    char other[400] = "", le[64] = "";
    bool has_le = false;
    if (*p == '{') {
        p++;
        for (;;) {
            while (*p == ' ')
                p++;
            if (*p == '}') {
                p++;
                break;
            }
            const char *ln = p;
            while (*p && (isalnum((unsigned char)*p) || *p == '_'))
                p++;
            size_t lnn = (size_t)(p - ln);
            if (!name_ok(ln, lnn, false))
                return fail(c, "bad label name in '%.80s'", l);
            if (*p++ != '=' || *p++ != '"')
                return fail(c, "label without =\"value\" in '%.80s'", l);
            char val[256];
            size_t vn = 0;
            while (*p && *p != '"') {
                char ch = *p++;
                if (ch == '\\') {
                    char e = *p++;
                    if (e == 'n')
                        ch = '\n';
                    else if (e == '\\' || e == '"')
                        ch = e;
                    else
                        return fail(c, "bad escape \\%c in a label value", e ? e : '0');
                }
                if (vn + 1 < sizeof val)
                    val[vn++] = ch;
            }
            val[vn] = '\0';
            if (*p++ != '"')
                return fail(c, "unterminated label value in '%.80s'", l);
            if (lnn == 2 && strncmp(ln, "le", 2) == 0) {
                has_le = true;
                snprintf(le, sizeof le, "%s", val);
            } else {
                size_t ol = strlen(other);
                snprintf(other + ol, sizeof other - ol, "%.*s=%s,", (int)lnn, ln, val);
            }
            if (*p == ',')
                p++;
            else if (*p != '}')
                return fail(c, "expected , or } in '%.80s'", l);
        }
    }
    if (*p != ' ')
        return fail(c, "no value in '%.80s'", l);
    while (*p == ' ')
        p++;
    char *end = NULL;
    errno = 0;
    double v = strtod(p, &end);
    if (end == p)
        return fail(c, "value '%.40s' is not a number", p);
    while (*end == ' ')
        end++;
    if (*end) {
        char *e2 = NULL;
        strtoll(end, &e2, 10);
        if (e2 == end || *e2)
            return fail(c, "junk after the value: '%.40s'", end);
    }
    /* family */
    struct fam *f = fam_get(c, name, false);
    char base[256];
    snprintf(base, sizeof base, "%s", name);
    const char *suffix = "";
    if (!f || !f->typed) {
        static const char *sufs[] = {"_bucket", "_sum", "_count"};
        for (size_t i = 0; i < 3; i++)
            if (ends_with(name, sufs[i])) {
                char b[256];
                snprintf(b, sizeof b, "%.*s", (int)(strlen(name) - strlen(sufs[i])), name);
                struct fam *bf = fam_get(c, b, false);
                if (bf && (strcmp(bf->type, "histogram") == 0 || strcmp(bf->type, "summary") == 0)) {
                    f = bf;
                    snprintf(base, sizeof base, "%s", b);
                    suffix = sufs[i];
                }
            }
    }
    if (!f) {
        if (prefix && strncmp(name, prefix, strlen(prefix)) != 0)
            return fail(c, "series %s lacks the prefix %s", name, prefix);
        f = fam_get(c, name, true);
        if (!f)
            return fail(c, "too many families");
    }
    int idx = (int)(f - c->fams);
    if (c->cur != idx) {
        if (f->closed)
            return fail(c, "samples of %s are not contiguous", f->name);
        if (c->cur >= 0)
            c->fams[c->cur].closed = true;
        c->cur = idx;
    }
    f->had_samples = true;
    /* duplicates */
    char key[700];
    snprintf(key, sizeof key, "%s{%s%s%s}", name, other, has_le ? "le=" : "", le);
    for (int i = 0; i < c->ns; i++)
        if (strcmp(c->series[i], key) == 0)
            return fail(c, "series %s appears twice", key);
    if (c->ns < MAXS)
        c->series[c->ns++] = strdup(key);
    if (strcmp(f->type, "histogram") == 0) {
        if (!*suffix)
            return fail(c, "histogram %s has a sample without _bucket/_sum/_count", base);
        char hk[700];
        snprintf(hk, sizeof hk, "%s{%s}", base, other);
        struct hist_series *h = hist_get(c, hk);
        if (!h)
            return fail(c, "too many histogram series");
        if (strcmp(suffix, "_bucket") == 0) {
            if (!has_le)
                return fail(c, "bucket of %s without le", base);
            char *le_end = NULL;
            double lev = strtod(le, &le_end);
            if (le_end == le || *le_end)
                return fail(c, "le=\"%s\" is not a number", le);
            if (h->has_inf)
                return fail(c, "bucket of %s after le=\"+Inf\"", hk);
            if (v < h->last)
                return fail(c, "buckets of %s decrease (%g after %g)", hk, v, h->last);
            h->last = v;
            if (isinf(lev) && lev > 0) {
                h->has_inf = true;
                h->inf = v;
            }
        } else if (strcmp(suffix, "_sum") == 0) {
            h->has_sum = true;
        } else {
            if (!h->has_inf)
                return fail(c, "%s_count before a le=\"+Inf\" bucket", hk);
            if (v != h->inf)
                return fail(c, "%s_count %g differs from its +Inf bucket %g", hk, v, h->inf);
            if (!h->has_sum)
                return fail(c, "%s_count without a _sum before it", hk);
        }
    }
    return 0;
}

int kvp_test_prom_check(const char *text, const char *prefix, char *why, size_t why_cap)
{
    struct ck *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(why, why_cap, "out of memory");
        return -1;
    }
    c->why = why;
    c->cap = why_cap;
    c->cur = -1;
    snprintf(why, why_cap, "ok");
    int rc = 0;
    const char *p = text ? text : "";
    if (*p && p[strlen(p) - 1] != '\n') {
        snprintf(why, why_cap, "text does not end with a newline");
        rc = -1;
    }
    while (rc == 0 && *p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        char *l = strndup(p, n);
        c->line++;
        if (!l)
            rc = -1;
        else if (l[0] == '#')
            rc = comment(c, l, prefix);
        else if (l[0])
            rc = sample(c, l, prefix);
        free(l);
        p += n + (nl ? 1 : 0);
    }
    for (int i = 0; rc == 0 && i < c->nh; i++)
        if (!c->hs[i].has_inf || !c->hs[i].has_sum)
            rc = fail(c, "histogram %s lacks its +Inf bucket or _sum", c->hs[i].key);
    for (int i = 0; i < c->ns; i++)
        free(c->series[i]);
    free(c);
    return rc;
}

int kvp_test_promtool(const char *text, char *why, size_t why_cap)
{
    const char *pt = getenv("KVP_PROMTOOL");
    char path[1024] = "";
    if (pt && *pt) {
        snprintf(path, sizeof path, "%s", pt);
    } else {
        const char *env = getenv("PATH");
        char *dirs = strdup(env ? env : "/usr/bin:/bin");
        for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
            snprintf(path, sizeof path, "%s/promtool", d);
            if (access(path, X_OK) == 0)
                break;
            path[0] = '\0';
        }
        free(dirs);
    }
    if (!path[0] || access(path, X_OK) != 0) {
        snprintf(why, why_cap, "promtool not found");
        return -1;
    }
    char tmpl[] = "/tmp/kvp-prom-XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd < 0) {
        snprintf(why, why_cap, "mkstemp: %s", strerror(errno));
        return 1;
    }
    size_t len = strlen(text);
    bool ok = write(fd, text, len) == (ssize_t)len;
    close(fd);
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "'%s' check metrics < '%s' 2>&1", path, tmpl);
    FILE *f = ok ? popen(cmd, "r") : NULL;
    size_t got = 0;
    why[0] = '\0';
    if (f) {
        got = fread(why, 1, why_cap - 1, f);
        why[got] = '\0';
    }
    int st = f ? pclose(f) : -1;
    unlink(tmpl);
    return st == 0 ? 0 : 1;
}

double kvp_test_prom_value(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p;) {
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return -1;
}
