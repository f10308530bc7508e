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

static const char *level_name[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};

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
