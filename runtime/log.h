/*
 * log.h — one line per event, the actor's name on every line.
 *
 * Policy (STYLE.md): ERROR something broke; WARN an operator should act, or it repairs itself;
 * INFO state transitions; DEBUG behind KVPOOL_LOG_LEVEL=debug. Never log payload bytes.
 * The level comes from the environment KVPOOL_LOG_LEVEL (error|warn|info|debug; default info)
 * read once at first use, or kvp_log_set_level(). Lines go to stderr:
 *   2026-11-29T19:40:01.123Z WARN  master-1: segment 3: heartbeat missed (1200 ms)
 * Thread-safe: one write(2) per line.
 *
 * Format: text (above), or JSON, one object per line, for log shippers (issue 24):
 *   {"ts":"2026-11-29T19:40:01.123Z","level":"warn","actor":"master-1","pid":4242,"msg":"segment 3: ..."}
 * chosen by the environment KVPOOL_LOG_FORMAT (text|json; default text) read once at first use,
 * or kvp_log_set_format() (the daemons' `log_format` key). In JSON, actor and msg are escaped
 * (quote, backslash, control characters; bytes that are not UTF-8 become U+FFFD), so every line
 * parses; a message cut at the line limit (2 KiB of text) stays valid JSON.
 */
#ifndef KVP_RUNTIME_LOG_H
#define KVP_RUNTIME_LOG_H

enum kvp_log_level {
    KVP_LOG_ERROR = 0,
    KVP_LOG_WARN = 1,
    KVP_LOG_INFO = 2,
    KVP_LOG_DEBUG = 3,
};

/** Current level (lines above it are skipped before formatting). */
int kvp_log_level(void);
/** Override the level (tests, --log-level flags). */
void kvp_log_set_level(int level);
/** Parse "error|warn|info|debug" (case-insensitive); returns -1 for anything else. */
int kvp_log_parse_level(const char *s);

enum kvp_log_format {
    KVP_LOG_FORMAT_TEXT = 0,
    KVP_LOG_FORMAT_JSON = 1,
};

/** Current format (KVPOOL_LOG_FORMAT at first use, else text). */
int kvp_log_format(void);
/** Override the format (the daemons' log_format key, tests). */
void kvp_log_set_format(int format);
/** Parse "text|json" (case-insensitive); returns -1 for anything else. */
int kvp_log_parse_format(const char *s);

void kvp_log_write(int level, const char *actor, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** kvp_log(level, actor, fmt, ...): checks the level before formatting. */
#define kvp_log(level, actor, ...)                                                                 \
    do {                                                                                           \
        if ((level) <= kvp_log_level())                                                            \
            kvp_log_write((level), (actor), __VA_ARGS__);                                          \
    } while (0)

#define kvp_log_error(actor, ...) kvp_log(KVP_LOG_ERROR, actor, __VA_ARGS__)
#define kvp_log_warn(actor, ...) kvp_log(KVP_LOG_WARN, actor, __VA_ARGS__)
#define kvp_log_info(actor, ...) kvp_log(KVP_LOG_INFO, actor, __VA_ARGS__)
#define kvp_log_debug(actor, ...) kvp_log(KVP_LOG_DEBUG, actor, __VA_ARGS__)

#endif
