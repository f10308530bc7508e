/* log.c — see log.h. */
#define _GNU_SOURCE
#include "runtime/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* -1 = not read yet. Relaxed ordering: the level is an independent flag; a racing first read
 * by two threads computes the same value from the same environment. */
static atomic_int g_level = -1;

int kvp_log_parse_level(const char *s)
{
    if (!s)
        return -1;
    if (!strcasecmp(s, "error"))
        return KVP_LOG_ERROR;
    if (!strcasecmp(s, "warn") || !strcasecmp(s, "warning"))
        return KVP_LOG_WARN;
    if (!strcasecmp(s, "info"))
        return KVP_LOG_INFO;
    if (!strcasecmp(s, "debug"))
        return KVP_LOG_DEBUG;
    return -1;
}

int kvp_log_level(void)
{
    int l = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (l >= 0)
        return l;
    l = kvp_log_parse_level(getenv("KVPOOL_LOG_LEVEL"));
    if (l < 0)
        l = KVP_LOG_INFO;
    atomic_store_explicit(&g_level, l, memory_order_relaxed);
    return l;
}

void kvp_log_set_level(int level)
{
    atomic_store_explicit(&g_level, level, memory_order_relaxed);
}

/* -1 = not read yet; relaxed for the same reason as g_level. */
static atomic_int g_format = -1;

int kvp_log_parse_format(const char *s)
{
    if (!s)
        return -1;
    if (!strcasecmp(s, "text"))
        return KVP_LOG_FORMAT_TEXT;
    if (!strcasecmp(s, "json"))
        return KVP_LOG_FORMAT_JSON;
    return -1;
}

int kvp_log_format(void)
{
    int f = atomic_load_explicit(&g_format, memory_order_relaxed);
    if (f >= 0)
        return f;
    f = kvp_log_parse_format(getenv("KVPOOL_LOG_FORMAT"));
    if (f < 0)
        f = KVP_LOG_FORMAT_TEXT;
    atomic_store_explicit(&g_format, f, memory_order_relaxed);
    return f;
}

void kvp_log_set_format(int format)
{
    atomic_store_explicit(&g_format, format == KVP_LOG_FORMAT_JSON ? KVP_LOG_FORMAT_JSON : KVP_LOG_FORMAT_TEXT,
                          memory_order_relaxed);
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), or 0 when it is not one. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    size_t len;
    unsigned min;
    unsigned cp;
    if (s[0] < 0x80)
        return 1;
    if ((s[0] & 0xE0) == 0xC0) {
        len = 2, min = 0x80, cp = s[0] & 0x1F;
    } else if ((s[0] & 0xF0) == 0xE0) {
        len = 3, min = 0x800, cp = s[0] & 0x0F;
    } else if ((s[0] & 0xF8) == 0xF0) {
        len = 4, min = 0x10000, cp = s[0] & 0x07;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

/* Append s as the inside of a JSON string to out[*o .. cap); stops (whole characters only)
 * when the next one would not fit. */
static void json_escape(char *out, size_t *o, size_t cap, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        char esc[8];
        const char *piece = esc;
        size_t plen, adv = 1;
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c, plen = 2;
        } else if (c == '\n') {
            memcpy(esc, "\\n", 2), plen = 2;
        } else if (c == '\t') {
            memcpy(esc, "\\t", 2), plen = 2;
        } else if (c < 0x20 || c == 0x7F) {
            plen = (size_t)snprintf(esc, sizeof esc, "\\u%04x", c);
        } else if (c < 0x80) {
            piece = (const char *)p + i, plen = 1;
        } else if ((adv = utf8_len(p + i, n - i)) > 0) {
            piece = (const char *)p + i, plen = adv;
        } else {
            memcpy(esc, "\\ufffd", 6), plen = 6, adv = 1; /* not UTF-8 */
        }
        if (*o + plen > cap)
            return;
        memcpy(out + *o, piece, plen);
        *o += plen;
        i += adv;
    }
}

static const char *level_name[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};
static const char *level_json[] = {"error", "warn", "info", "debug"};

void kvp_log_write(int level, const char *actor, const char *fmt, ...)
{
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    if (level < 0)
        level = 0;
    if (level > 3)
        level = 3;
    if (kvp_log_format() == KVP_LOG_FORMAT_JSON) {
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(line, sizeof line, fmt, ap);
        va_end(ap);
        if (m < 0)
            line[0] = '\0';
        char out[8192];
        size_t o = (size_t)snprintf(out, sizeof out,
                                    "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\",\"actor\":\"",
                                    tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                                    ts.tv_nsec / 1000000, level_json[level]);
        json_escape(out, &o, 512, actor ? actor : "-");
        o += (size_t)snprintf(out + o, sizeof out - o, "\",\"pid\":%d,\"msg\":\"", (int)getpid());
        json_escape(out, &o, sizeof out - 3, line);
        memcpy(out + o, "\"}\n", 3);
        o += 3;
        ssize_t w = write(STDERR_FILENO, out, o);
        (void)w;
        return;
    }
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s[%d]: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, level_name[level], actor ? actor : "-", (int)getpid());
    if (n < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
