/*
 * config.c — parse and validate config values into the per-process structs, and the layering
 * defaults < JSON file < KVPOOL_* environment < flags (config.h). No globals.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <jansson.h>

#include "config/config_internal.h"
#include "kvpool.h"
#include "runtime/log.h"

#define ACTOR "config"

/* ---------------------------------------------------------------- scalar parsers */

/* Decimal digits only (no sign, no blanks); ERANGE-safe. Returns the end of the digits. */
static const char *parse_dec(const char *s, uint64_t *out)
{
    if (!isdigit((unsigned char)*s))
        return NULL;
    uint64_t v = 0;
    for (; isdigit((unsigned char)*s); s++) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return NULL;
        v = v * 10 + d;
    }
    *out = v;
    return s;
}

int kvp_cfg_parse_size(const char *s, uint64_t *out)
{
    if (!s || !out)
        return KVP_ERR_INVALID;
    uint64_t v;
    const char *p = parse_dec(s, &v);
    if (!p)
        return KVP_ERR_INVALID;
    if (*p == ' ') {
        while (*p == ' ')
            p++;
        if (*p == '\0')
            return KVP_ERR_INVALID; /* trailing blanks */
    }
    static const struct {
        const char *suffix;
        unsigned shift;
    } units[] = {
        {"", 0},    {"b", 0},    {"k", 10},    {"kb", 10},  {"kib", 10},  {"m", 20},
        {"mb", 20}, {"mib", 20}, {"g", 30},    {"gb", 30},  {"gib", 30},  {"t", 40},
        {"tb", 40}, {"tib", 40},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(p, units[i].suffix) != 0)
            continue;
        if (units[i].shift && v > (UINT64_MAX >> units[i].shift))
            return KVP_ERR_INVALID;
        *out = v << units[i].shift;
        return KVP_OK;
    }
    return KVP_ERR_INVALID;
}

int kvp_cfg_parse_duration_ms(const char *s, uint64_t *out)
{
    if (!s || !out)
        return KVP_ERR_INVALID;
    uint64_t v;
    const char *p = parse_dec(s, &v);
    if (!p)
        return KVP_ERR_INVALID;
    if (*p == ' ') {
        while (*p == ' ')
            p++;
        if (*p == '\0')
            return KVP_ERR_INVALID; /* trailing blanks */
    }
    if (*p == '\0' || strcasecmp(p, "ms") == 0) {
        *out = v;
        return KVP_OK;
    }
    if (strcasecmp(p, "s") == 0) {
        if (v > UINT64_MAX / 1000)
            return KVP_ERR_INVALID;
        *out = v * 1000;
        return KVP_OK;
    }
    return KVP_ERR_INVALID;
}

static int parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "1", "yes", "on"};
    static const char *const no[] = {"false", "0", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return KVP_OK;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return KVP_OK;
        }
    }
    return KVP_ERR_INVALID;
}

static int parse_double(const char *s, double *out)
{
    if (!*s || isspace((unsigned char)*s))
        return KVP_ERR_INVALID;
    char *end = NULL;
    errno = 0;
    double d = strtod(s, &end);
    if (errno || !end || *end != '\0' || !isfinite(d))
        return KVP_ERR_INVALID;
    *out = d;
    return KVP_OK;
}

/* "4GiB" when exact, else the plain byte count. */
static void fmt_size(char *buf, size_t cap, double v)
{
    static const char *const names[] = {"", "KiB", "MiB", "GiB", "TiB"};
    uint64_t b = (uint64_t)v;
    unsigned i = 0;
    while (i < 4 && b >= 1024 && b % 1024 == 0) {
        b /= 1024;
        i++;
    }
    snprintf(buf, cap, "%" PRIu64 "%s", b, names[i]);
}

/* ---------------------------------------------------------------- host:port */

int kvp_cfg_parse_hostport(const char *s, size_t len, char *host, size_t host_cap, uint32_t *port)
{
    if (!s)
        return KVP_ERR_INVALID;
    const char *h, *colon;
    size_t hlen;
    if (len > 0 && s[0] == '[') {
        const char *rb = memchr(s, ']', len);
        if (!rb || rb == s + 1)
            return KVP_ERR_INVALID;
        h = s + 1;
        hlen = (size_t)(rb - h);
        if (memchr(h, '[', hlen))
            return KVP_ERR_INVALID;
        colon = rb + 1;
        if (colon >= s + len || *colon != ':')
            return KVP_ERR_INVALID;
    } else {
        colon = NULL;
        for (size_t i = 0; i < len; i++)
            if (s[i] == ':') {
                if (colon)
                    return KVP_ERR_INVALID; /* a bare IPv6 address: needs [brackets] */
                colon = s + i;
            }
        if (!colon || colon == s)
            return KVP_ERR_INVALID;
        h = s;
        hlen = (size_t)(colon - s);
        for (size_t i = 0; i < hlen; i++)
            if (h[i] == ']' || h[i] == '[')
                return KVP_ERR_INVALID;
    }
    for (size_t i = 0; i < hlen; i++)
        if (isspace((unsigned char)h[i]) || h[i] == ',' || h[i] == '/' || h[i] == '\0')
            return KVP_ERR_INVALID;
    /* port: 1..65535, digits only, to the end */
    const char *p = colon + 1, *e = s + len;
    if (p >= e || e - p > 5)
        return KVP_ERR_INVALID;
    uint32_t v = 0;
    for (; p < e; p++) {
        if (!isdigit((unsigned char)*p))
            return KVP_ERR_INVALID;
        v = v * 10 + (uint32_t)(*p - '0');
    }
    if (v < 1 || v > 65535)
        return KVP_ERR_INVALID;
    if (host) {
        if (hlen + 1 > host_cap)
            return KVP_ERR_INVALID;
        memcpy(host, h, hlen);
        host[hlen] = '\0';
    }
    if (port)
        *port = v;
    return KVP_OK;
}

/* ---------------------------------------------------------------- one key */

static void log_bad(const struct kvp_cfg_key *k, const char *value, const char *source,
                    const char *what)
{
    kvp_log_error(ACTOR, "%s%s%s=%.256s%s: %s", source ? source : "", source ? ": " : "", k->name,
                  value, strlen(value) > 256 ? "..." : "", what);
}

static void describe(const struct kvp_cfg_key *k, char *buf, size_t cap)
{
    char lo[32], hi[32];
    switch (k->type) {
    case KVP_CFG_T_STRING:
        if (k->allowed)
            snprintf(buf, cap, "must be one of %s", k->allowed);
        else if (k->check == KVP_CFG_CHECK_HOSTPORT)
            snprintf(buf, cap, "must be host:port or [ipv6]:port, port 1-65535, at most %zu bytes",
                     k->width - 1);
        else if (k->check == KVP_CFG_CHECK_DEVLIST)
            snprintf(buf, cap, "must be a comma list of RDMA device names (e.g. mlx5_0,mlx5_1), "
                               "at most %zu bytes", k->width - 1);
        else if (k->check == KVP_CFG_CHECK_GID_INDEX)
            snprintf(buf, cap, "must be auto or a GID index 0-255");
        else
            snprintf(buf, cap, "must be a string of at most %zu bytes", k->width - 1);
        break;
    case KVP_CFG_T_BOOL:
        snprintf(buf, cap, "must be true or false (also 1|0, yes|no, on|off)");
        break;
    case KVP_CFG_T_U32:
    case KVP_CFG_T_U64:
        snprintf(buf, cap, "must be an integer in [%.0f, %.0f]", k->min, k->max);
        break;
    case KVP_CFG_T_SIZE:
        fmt_size(lo, sizeof lo, k->min);
        fmt_size(hi, sizeof hi, k->max);
        snprintf(buf, cap, "must be a size in [%s, %s] (bytes, or with K|M|G|T, KB|KiB... suffix, e.g. 512MiB)",
                 lo, hi);
        break;
    case KVP_CFG_T_DOUBLE:
        snprintf(buf, cap, "must be a number in [%g, %g]", k->min, k->max);
        break;
    case KVP_CFG_T_DURATION_MS:
        snprintf(buf, cap, "must be a duration in [%.0f, %.0f] ms (e.g. 500, 500ms, 30s)", k->min, k->max);
        break;
    case KVP_CFG_T_DURATION_S:
        snprintf(buf, cap, "must be a duration in [%.0f, %.0f] ms; a plain number is seconds, Mooncake's unit "
                 "(e.g. 30, 30s, 500ms)", k->min, k->max);
        break;
    }
}

/* Mooncake's rpc_address / rpc_port: replace the host or the port of the "host:port" field the
 * key points at (the master's listen), keeping the other part. Later sources win as for any
 * key: `--listen a:1 --rpc_port 2` is a:2, `--rpc_port 2 --listen a:1` is a:1. */
static int set_hostport_part(const struct kvp_cfg_key *k, void *cfg, const char *value, const char *source)
{
    char *field = (char *)cfg + k->offset;
    const char *colon = strrchr(field, ':'); /* the field always holds a valid host:port */
    char out[512];
    int n = -1;
    if (colon && k->check == KVP_CFG_CHECK_LISTEN_PORT) {
        uint64_t u = 0;
        const char *end = parse_dec(value, &u);
        if (end && *end == '\0' && (double)u >= k->min && (double)u <= k->max)
            n = snprintf(out, sizeof out, "%.*s:%" PRIu64, (int)(colon - field), field, u);
    } else if (colon) {
        /* a bare IPv6 address gets its brackets: --rpc_address ::1 is listen [::1]:port; any
         * other value with a ':' (a host:port) is refused */
        bool v6 = strchr(value, ':') && value[0] != '[';
        char addr[INET6_ADDRSTRLEN + 1];
        struct in6_addr a6;
        size_t alen = strcspn(value, "%");
        bool v6_ok = v6 && alen < sizeof addr && (memcpy(addr, value, alen), addr[alen] = '\0',
                                                   inet_pton(AF_INET6, addr, &a6) == 1);
        if (!v6 || v6_ok)
            n = snprintf(out, sizeof out, "%s%s%s%s", v6 ? "[" : "", value, v6 ? "]" : "", colon);
    }
    if (n < 0 || (size_t)n >= sizeof out || (size_t)n + 1 > k->width ||
        kvp_cfg_parse_hostport(out, (size_t)n, NULL, 0, NULL) != KVP_OK) {
        char why[160];
        if (k->check == KVP_CFG_CHECK_LISTEN_PORT)
            snprintf(why, sizeof why, "must be a port in [%.0f, %.0f] (it sets the port of %s)", k->min, k->max,
                     k->alias_of);
        else
            snprintf(why, sizeof why, "must be a host name or IP address (it sets the host of %s)", k->alias_of);
        log_bad(k, value, source, why);
        return KVP_ERR_INVALID;
    }
    memcpy(field, out, (size_t)n + 1);
    return KVP_OK;
}

int kvp_cfg_set_key(const struct kvp_cfg_key *k, void *cfg, const char *value, const char *source)
{
    char why[256];
    if (!k || !cfg)
        return KVP_ERR_INVALID;
    if (!value) {
        kvp_log_error(ACTOR, "%s%s%s: no value", source ? source : "", source ? ": " : "", k->name);
        return KVP_ERR_INVALID;
    }
    if (k->check == KVP_CFG_CHECK_LISTEN_HOST || k->check == KVP_CFG_CHECK_LISTEN_PORT)
        return set_hostport_part(k, cfg, value, source);
    char *field = k->offset == KVP_CFG_NO_FIELD ? NULL : (char *)cfg + k->offset;
    int rc = KVP_OK;
    uint64_t u = 0;
    double d = 0;
    bool b = false;

    switch (k->type) {
    case KVP_CFG_T_STRING: {
        size_t len = strlen(value);
        if (len + 1 > k->width) {
            rc = KVP_ERR_INVALID;
            break;
        }
        char low[64];
        const char *store = value;
        if (k->allowed) {
            /* choices are case-insensitive and stored in lower case */
            if (len >= sizeof low) {
                rc = KVP_ERR_INVALID;
                break;
            }
            for (size_t i = 0; i <= len; i++)
                low[i] = (char)tolower((unsigned char)value[i]);
            rc = KVP_ERR_INVALID;
            for (const char *a = k->allowed; *a;) {
                const char *bar = strchr(a, '|');
                size_t alen = bar ? (size_t)(bar - a) : strlen(a);
                if (alen == len && memcmp(a, low, len) == 0)
                    rc = KVP_OK;
                a += alen + (bar ? 1 : 0);
            }
            store = low;
        } else if (k->check == KVP_CFG_CHECK_HOSTPORT) {
            rc = kvp_cfg_parse_hostport(value, len, NULL, 0, NULL);
        } else if (k->check == KVP_CFG_CHECK_DEVLIST) {
            rc = kvp_cfg_devlist_check(value) ? KVP_OK : KVP_ERR_INVALID;
        } else if (k->check == KVP_CFG_CHECK_GID_INDEX) {
            rc = kvp_cfg_gid_index(value) >= -1 ? KVP_OK : KVP_ERR_INVALID;
        } else if (k->check == KVP_CFG_CHECK_MASTERS && len > 0) {
            size_t n = 0;
            rc = kvp_cfg_parse_masters(value, NULL, KVP_CFG_MAX_MASTERS, &n, why, sizeof why);
            if (rc != KVP_OK) {
                log_bad(k, value, source, why);
                return KVP_ERR_INVALID;
            }
        }
        if (rc == KVP_OK && field)
            memcpy(field, store, len + 1);
        break;
    }
    case KVP_CFG_T_BOOL:
        rc = parse_bool(value, &b);
        if (rc == KVP_OK && field)
            *(bool *)field = b;
        break;
    case KVP_CFG_T_U32:
    case KVP_CFG_T_U64:
    case KVP_CFG_T_SIZE:
    case KVP_CFG_T_DURATION_MS:
    case KVP_CFG_T_DURATION_S: {
        const char *end;
        if (k->type == KVP_CFG_T_SIZE) {
            rc = kvp_cfg_parse_size(value, &u);
        } else if (k->type == KVP_CFG_T_DURATION_S && (end = parse_dec(value, &u)) && *end == '\0') {
            rc = u <= UINT64_MAX / 1000 ? KVP_OK : KVP_ERR_INVALID; /* plain number: seconds */
            u *= 1000;
        } else if (k->type == KVP_CFG_T_DURATION_MS || k->type == KVP_CFG_T_DURATION_S) {
            rc = kvp_cfg_parse_duration_ms(value, &u);
        } else {
            rc = ((end = parse_dec(value, &u)) && *end == '\0') ? KVP_OK : KVP_ERR_INVALID;
        }
        if (rc == KVP_OK && ((double)u < k->min || (double)u > k->max))
            rc = KVP_ERR_INVALID;
        if (rc == KVP_OK && field) {
            size_t w = k->type == KVP_CFG_T_U32                                              ? 4
                       : k->type == KVP_CFG_T_DURATION_MS || k->type == KVP_CFG_T_DURATION_S ? k->width
                                                                                             : 8;
            if (w == 4)
                *(uint32_t *)field = (uint32_t)u;
            else
                *(uint64_t *)field = u;
        }
        break;
    }
    case KVP_CFG_T_DOUBLE:
        rc = parse_double(value, &d);
        if (rc == KVP_OK && (d < k->min || d > k->max))
            rc = KVP_ERR_INVALID;
        if (rc == KVP_OK && field)
            *(double *)field = d;
        break;
    }
    if (rc != KVP_OK) {
        describe(k, why, sizeof why);
        log_bad(k, value, source, why);
        return KVP_ERR_INVALID;
    }
    if (!field)
        kvp_log_info(ACTOR, "%s%s%s: accepted, not used here: %s", source ? source : "", source ? ": " : "",
                     k->name, k->help);
    if (k->deprecated)
        kvp_log_warn(ACTOR, "%s%s%s is deprecated: use %s (same value, same unit); the old spelling still works",
                     source ? source : "", source ? ": " : "", k->name, k->alias_of);
    return KVP_OK;
}

/* ---------------------------------------------------------------- public: defaults, set */

void kvp_cfg_defaults(enum kvp_cfg_kind kind, void *cfg)
{
    const struct kvp_cfg_table *t = kvp_cfg_table(kind);
    if (!t || !cfg)
        return;
    memset(cfg, 0, t->struct_size);
    for (size_t i = 0; i < t->n_keys; i++) {
        if (t->keys[i].offset == KVP_CFG_NO_FIELD || t->keys[i].alias_of)
            continue;
        int rc = kvp_cfg_set_key(&t->keys[i], cfg, t->keys[i].def, "default");
        (void)rc; /* every default is checked by test_config_defaults_all_valid */
    }
}

static int unknown_key(const struct kvp_cfg_table *t, const char *key, size_t len, const char *source)
{
    kvp_log_error(ACTOR, "%s%sunknown key '%.*s' for kvpool-%s (see docs/config.md)",
                  source ? source : "", source ? ": " : "", (int)(len > 128 ? 128 : len), key,
                  t->kind_name);
    return KVP_ERR_INVALID;
}

int kvp_cfg_set(enum kvp_cfg_kind kind, void *cfg, const char *key, const char *value)
{
    const struct kvp_cfg_table *t = kvp_cfg_table(kind);
    if (!t || !cfg || !key || !value) {
        kvp_log_error(ACTOR, "set: NULL argument or bad kind");
        return KVP_ERR_INVALID;
    }
    const struct kvp_cfg_key *k = kvp_cfg_find(t, key, strlen(key));
    if (!k)
        return unknown_key(t, key, strlen(key), NULL);
    return kvp_cfg_set_key(k, cfg, value, NULL);
}

/* ---------------------------------------------------------------- JSON file */

static int apply_json(const struct kvp_cfg_table *t, void *cfg, json_t *root, const char *path)
{
    char source[1100];
    snprintf(source, sizeof source, "file %s", path);
    if (!json_is_object(root)) {
        kvp_log_error(ACTOR, "%s: top level must be a JSON object of key -> value", source);
        return KVP_ERR_INVALID;
    }
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        const struct kvp_cfg_key *k = kvp_cfg_find(t, name, strlen(name));
        if (!k)
            return unknown_key(t, name, strlen(name), source);
        char buf[64];
        const char *s;
        if (json_is_string(v)) {
            s = json_string_value(v);
        } else if (json_is_integer(v)) {
            snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
            s = buf;
        } else if (json_is_real(v)) {
            snprintf(buf, sizeof buf, "%.17g", json_real_value(v));
            s = buf;
        } else if (json_is_boolean(v)) {
            s = json_is_true(v) ? "true" : "false";
        } else {
            kvp_log_error(ACTOR, "%s: %s: must be a string, number or bool (got %s)", source, name,
                          json_is_null(v) ? "null" : json_is_array(v) ? "an array" : "an object");
            return KVP_ERR_INVALID;
        }
        int rc = kvp_cfg_set_key(k, cfg, s, source);
        if (rc != KVP_OK)
            return rc;
    }
    return KVP_OK;
}

static int load_file_into(const struct kvp_cfg_table *t, void *cfg, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        kvp_log_error(ACTOR, "file %s: cannot open: %s", path, strerror(errno));
        return KVP_ERR_IO;
    }
    json_error_t jerr;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
    int rd_err = ferror(f);
    fclose(f);
    if (!root) {
        if (rd_err) {
            kvp_log_error(ACTOR, "file %s: read error", path);
            return KVP_ERR_IO;
        }
        kvp_log_error(ACTOR, "file %s:%d:%d: not valid JSON: %s", path, jerr.line, jerr.column, jerr.text);
        return KVP_ERR_INVALID;
    }
    int rc = apply_json(t, cfg, root, path);
    json_decref(root);
    return rc;
}

int kvp_cfg_load_file(enum kvp_cfg_kind kind, void *cfg, const char *path)
{
    const struct kvp_cfg_table *t = kvp_cfg_table(kind);
    if (!t || !cfg || !path) {
        kvp_log_error(ACTOR, "load_file: NULL argument or bad kind");
        return KVP_ERR_INVALID;
    }
    void *tmp = malloc(t->struct_size);
    if (!tmp)
        return KVP_ERR_NOMEM;
    memcpy(tmp, cfg, t->struct_size);
    int rc = load_file_into(t, tmp, path);
    if (rc == KVP_OK)
        memcpy(cfg, tmp, t->struct_size);
    free(tmp);
    return rc;
}

/* ---------------------------------------------------------------- environment */

static int load_env_into(const struct kvp_cfg_table *t, void *cfg)
{
    for (size_t i = 0; i < t->n_keys; i++) {
        char var[160] = "KVPOOL_";
        size_t j = strlen(var);
        for (const char *p = t->keys[i].name; *p && j + 1 < sizeof var; p++)
            var[j++] = (char)toupper((unsigned char)*p);
        var[j] = '\0';
        const char *v = getenv(var);
        if (!v)
            continue;
        char source[180];
        snprintf(source, sizeof source, "env %s", var);
        int rc = kvp_cfg_set_key(&t->keys[i], cfg, v, source);
        if (rc != KVP_OK)
            return rc;
    }
    return KVP_OK;
}

int kvp_cfg_load_env(enum kvp_cfg_kind kind, void *cfg)
{
    const struct kvp_cfg_table *t = kvp_cfg_table(kind);
    if (!t || !cfg) {
        kvp_log_error(ACTOR, "load_env: NULL argument or bad kind");
        return KVP_ERR_INVALID;
    }
    void *tmp = malloc(t->struct_size);
    if (!tmp)
        return KVP_ERR_NOMEM;
    memcpy(tmp, cfg, t->struct_size);
    int rc = load_env_into(t, tmp);
    if (rc == KVP_OK)
        memcpy(cfg, tmp, t->struct_size);
    free(tmp);
    return rc;
}

/* ---------------------------------------------------------------- validation */

int kvp_cfg_validate(enum kvp_cfg_kind kind, const void *cfg)
{
    const struct kvp_cfg_table *t = kvp_cfg_table(kind);
    if (!t || !cfg)
        return KVP_ERR_INVALID;
    if (kind == KVP_CFG_MASTER) {
        const struct kvp_cfg_master *m = cfg;
        if (m->raft_heartbeat_ms >= m->election_timeout_ms) {
            kvp_log_error(ACTOR, "raft_heartbeat_ms=%u: must be below election_timeout_ms=%u",
                          m->raft_heartbeat_ms, m->election_timeout_ms);
            return KVP_ERR_INVALID;
        }
    }
    return KVP_OK;
}

/* ---------------------------------------------------------------- flags */

static bool is_extra(const char *const *extra, const char *name, size_t len, bool *takes_value)
{
    for (size_t i = 0; extra && extra[i]; i++) {
        size_t el = strlen(extra[i]);
        bool val = el > 0 && extra[i][el - 1] == '=';
        if (val)
            el--;
        if (el == len && strncmp(extra[i], name, len) == 0) {
            *takes_value = val;
            return true;
        }
    }
    return false;
}


static int add_positional(int idx, int *positional, int max_positional, int *n_positional,
                          const char *arg)
{
    if (!n_positional || !positional || *n_positional >= max_positional) {
        kvp_log_error(ACTOR, "unexpected argument '%.128s'", arg);
        return KVP_ERR_INVALID;
    }
    positional[(*n_positional)++] = idx;
    return KVP_OK;
}

static bool name_is(const char *name, size_t len, const char *want)
{
    size_t wl = strlen(want);
    if (wl != len)
        return false;
    for (size_t i = 0; i < len; i++) {
        char a = name[i] == '-' ? '_' : name[i], b = want[i] == '-' ? '_' : want[i];
        if (a != b)
            return false;
    }
    return true;
}

int kvp_cfg_from_args_ex(enum kvp_cfg_kind kind, void *cfg, int argc, char **argv,
                         const char *const *extra_flags, bool *print_config, int *positional,
                         int max_positional, int *n_positional)
{
    const struct kvp_cfg_table *t = kvp_cfg_table(kind);
    if (!t || !cfg || argc < 0 || (argc > 0 && !argv)) {
        kvp_log_error(ACTOR, "from_args: NULL argument or bad kind");
        return KVP_ERR_INVALID;
    }
    if (n_positional)
        *n_positional = 0;
    if (print_config)
        *print_config = false;
    void *tmp = malloc(t->struct_size);
    if (!tmp)
        return KVP_ERR_NOMEM;
    kvp_cfg_defaults(kind, tmp);
    int rc = KVP_OK;

    /* Pass 1: every --config FILE, in order. */
    for (int i = 1; i < argc && rc == KVP_OK; i++) {
        const char *a = argv[i];
        if (!a || strcmp(a, "--") == 0)
            break;
        if (a[0] != '-' || a[1] == '\0')
            continue;
        const char *name = a + (a[1] == '-' ? 2 : 1);
        const char *eq = strchr(name, '=');
        if (!name_is(name, eq ? (size_t)(eq - name) : strlen(name), "config"))
            continue;
        const char *path = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!path || !*path) {
            kvp_log_error(ACTOR, "flag --config: needs a file name");
            rc = KVP_ERR_INVALID;
        } else {
            rc = load_file_into(t, tmp, path);
        }
    }
    if (rc == KVP_OK)
        rc = load_env_into(t, tmp);

    /* Pass 2: flags and positional arguments. */
    bool only_positional = false;
    for (int i = 1; i < argc && rc == KVP_OK; i++) {
        const char *a = argv[i];
        if (!a) {
            rc = KVP_ERR_INVALID;
            break;
        }
        if (only_positional || a[0] != '-' || strcmp(a, "-") == 0) {
            rc = add_positional(i, positional, max_positional, n_positional, a);
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_positional = true;
            continue;
        }
        const char *name = a + (a[1] == '-' ? 2 : 1);
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        bool ev = false;
        if (name_is(name, len, "config")) {
            if (!eq)
                i++; /* applied in pass 1 */
            continue;
        }
        if (name_is(name, len, "print-config") && !eq) {
            if (print_config)
                *print_config = true;
            continue;
        }
        if (is_extra(extra_flags, name, len, &ev)) {
            rc = add_positional(i, positional, max_positional, n_positional, a);
            if (rc == KVP_OK && ev && !eq) {
                if (i + 1 >= argc) {
                    kvp_log_error(ACTOR, "flag %.128s: needs a value", a);
                    rc = KVP_ERR_INVALID;
                } else {
                    i++;
                    rc = add_positional(i, positional, max_positional, n_positional, argv[i]);
                }
            }
            continue;
        }
        char source[200];
        snprintf(source, sizeof source, "flag --%.*s", (int)(len > 128 ? 128 : len), name);
        const struct kvp_cfg_key *k = kvp_cfg_find(t, name, len);
        if (!k && len > 3 && strncmp(name, "no-", 3) == 0 && !eq) {
            const struct kvp_cfg_key *nk = kvp_cfg_find(t, name + 3, len - 3);
            if (nk && nk->type == KVP_CFG_T_BOOL) {
                rc = kvp_cfg_set_key(nk, tmp, "false", source);
                continue;
            }
        }
        if (!k) {
            kvp_log_error(ACTOR, "unknown flag '%.128s' for kvpool-%s (see docs/config.md)", a,
                          t->kind_name);
            rc = KVP_ERR_INVALID;
            break;
        }
        const char *value;
        if (eq) {
            value = eq + 1;
        } else if (k->type == KVP_CFG_T_BOOL) {
            bool dummy;
            if (i + 1 < argc && argv[i + 1] && parse_bool(argv[i + 1], &dummy) == KVP_OK)
                value = argv[++i];
            else
                value = "true";
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            kvp_log_error(ACTOR, "%s: needs a value", source);
            rc = KVP_ERR_INVALID;
            break;
        }
        rc = kvp_cfg_set_key(k, tmp, value, source);
    }
    if (rc == KVP_OK)
        rc = kvp_cfg_validate(kind, tmp);
    if (rc == KVP_OK)
        memcpy(cfg, tmp, t->struct_size);
    free(tmp);
    return rc;
}

int kvp_cfg_from_args(enum kvp_cfg_kind kind, void *cfg, int argc, char **argv, bool *print_config,
                      int *positional, int max_positional, int *n_positional)
{
    return kvp_cfg_from_args_ex(kind, cfg, argc, argv, NULL, print_config, positional, max_positional,
                                n_positional);
}

/* ---------------------------------------------------------------- output */

static json_t *key_to_json(const struct kvp_cfg_key *k, const void *cfg)
{
    const char *field = (const char *)cfg + k->offset;
    switch (k->type) {
    case KVP_CFG_T_STRING: {
        size_t n = strnlen(field, k->width);
        return json_stringn(field, n);
    }
    case KVP_CFG_T_BOOL:
        return json_boolean(*(const bool *)field);
    case KVP_CFG_T_U32:
        return json_integer((json_int_t) * (const uint32_t *)field);
    case KVP_CFG_T_DURATION_MS:
        if (k->width == 4)
            return json_integer((json_int_t) * (const uint32_t *)field);
        return json_integer((json_int_t) * (const uint64_t *)field);
    case KVP_CFG_T_DURATION_S: { /* "Nms": a plain number would read back as seconds */
        char b[32];
        snprintf(b, sizeof b, "%llums",
                 (unsigned long long)(k->width == 4 ? *(const uint32_t *)field : *(const uint64_t *)field));
        return json_string(b);
    }
    case KVP_CFG_T_U64:
    case KVP_CFG_T_SIZE:
        return json_integer((json_int_t) * (const uint64_t *)field);
    case KVP_CFG_T_DOUBLE:
        return json_real(*(const double *)field);
    }
    return json_null();
}

char *kvp_cfg_to_json(enum kvp_cfg_kind kind, const void *cfg)
{
    const struct kvp_cfg_table *t = kvp_cfg_table(kind);
    if (!t || !cfg)
        return NULL;
    json_t *o = json_object();
    if (!o)
        return NULL;
    for (size_t i = 0; i < t->n_keys; i++) {
        if (t->keys[i].offset == KVP_CFG_NO_FIELD || t->keys[i].alias_of)
            continue; /* the key an alias writes is printed under its own name */
        json_t *v = key_to_json(&t->keys[i], cfg);
        if (!v || json_object_set_new(o, t->keys[i].name, v) != 0) {
            json_decref(o);
            return NULL;
        }
    }
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    json_decref(o);
    return s;
}

char *kvp_cfg_help(enum kvp_cfg_kind kind)
{
    const struct kvp_cfg_table *t = kvp_cfg_table(kind);
    if (!t)
        return NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    fprintf(f, "kvpool-%s settings (flag --key=value, env KVPOOL_KEY, JSON file via --config FILE):\n",
            t->kind_name);
    for (size_t i = 0; i < t->n_keys; i++) {
        const struct kvp_cfg_key *k = &t->keys[i];
        if (k->offset == KVP_CFG_NO_FIELD || k->alias_of)
            continue;
        fprintf(f, "  --%-32s %s", k->name, k->help);
        if (k->def && *k->def)
            fprintf(f, " (default %s)", k->def);
        fputc('\n', f);
    }
    fprintf(f, "other spellings (Mooncake's names and units, old names) and keys accepted but not used:\n");
    for (size_t i = 0; i < t->n_keys; i++) {
        const struct kvp_cfg_key *k = &t->keys[i];
        if (k->offset == KVP_CFG_NO_FIELD || k->alias_of)
            fprintf(f, "  --%-32s %s%s\n", k->name, k->help, k->deprecated ? " (deprecated)" : "");
    }
    fprintf(f, "  --%-32s %s\n", "print-config", "print the effective config as JSON and exit");
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
