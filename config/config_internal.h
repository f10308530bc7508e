/*
 * config_internal.h — the key tables behind config.h. One row per key: the same row drives
 * defaults, validation, JSON files, the environment, flags, --print-config and the help text.
 * Only the config module sources and the config unit tests include this.
 */
#ifndef KVP_CONFIG_INTERNAL_H
#define KVP_CONFIG_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

enum kvp_cfg_type {
    KVP_CFG_T_STRING,      /* char[width]; `allowed` may restrict it to "a|b|c" */
    KVP_CFG_T_BOOL,        /* bool: true|false|1|0|yes|no|on|off */
    KVP_CFG_T_U32,         /* uint32_t, decimal */
    KVP_CFG_T_U64,         /* uint64_t, decimal */
    KVP_CFG_T_SIZE,        /* uint64_t bytes; 4096, 4K, 4KB, 4KiB, 512M, 4G, 1T (binary) */
    KVP_CFG_T_DOUBLE,      /* double, finite */
    KVP_CFG_T_DURATION_MS, /* uint32_t or uint64_t (width 4|8) ms; 250, 250ms, 30s */
    KVP_CFG_T_DURATION_S,  /* as DURATION_MS (stored in ms), but a plain number is seconds: the
                            * Mooncake keys whose unit is seconds (transfer_timeout, client_ttl) */
};

/* Extra checks on a string key. */
enum kvp_cfg_check {
    KVP_CFG_CHECK_NONE = 0,
    KVP_CFG_CHECK_HOSTPORT,  /* "host:port" or "[v6]:port" */
    KVP_CFG_CHECK_MASTERS,   /* empty or a master list kvp_cfg_masters() accepts */
    KVP_CFG_CHECK_LISTEN_HOST, /* a string key that replaces the host of the "host:port" field at
                                * `offset` (Mooncake's --rpc_address into the master's listen) */
    KVP_CFG_CHECK_LISTEN_PORT, /* a U32 key in [min, max] that replaces the port of that field
                                * (Mooncake's --rpc_port) */
    KVP_CFG_CHECK_DEVLIST,   /* empty or a comma list of RDMA device names (letters, digits,
                              * '_', '-', '.'; blanks around items; no empty item) */
    KVP_CFG_CHECK_GID_INDEX, /* "auto" (or empty) or a GID table index 0..255 */
};

/* A key whose offset is KVP_CFG_NO_FIELD is validated and then ignored (Mooncake keys that
 * belong to another process, e.g. default_kv_lease_ttl set on a client). */
#define KVP_CFG_NO_FIELD ((size_t)-1)

struct kvp_cfg_key {
    const char *name;        /* key as in JSON; env KVPOOL_<NAME upper>; flag --name */
    enum kvp_cfg_type type;
    size_t offset;           /* offsetof() into the kind's struct, or KVP_CFG_NO_FIELD */
    size_t width;            /* string capacity (bytes incl. NUL) or integer width (4|8) */
    double min, max;         /* numeric bounds, inclusive (integers: exact below 2^53) */
    const char *allowed;     /* strings: "tcp|rdma" choices, or NULL for any */
    enum kvp_cfg_check check;
    const char *def;         /* default, as a string parsed by the same code as input */
    const char *help;        /* one line */
    /* Non-NULL: this row is another spelling of the key named here and writes the same field
     * (Mooncake's name with Mooncake's unit next to kvpool's own `_ms` key, an old kvpool
     * spelling, or a part of it such as rpc_port of listen). Such a row has no default, is not
     * in --print-config (the named key is) and is listed apart in the help. */
    const char *alias_of;
    /* With alias_of: an old spelling kept so that existing configs work; every use logs one
     * WARN naming alias_of. */
    int deprecated;
};

struct kvp_cfg_table {
    const char *kind_name;   /* "master", "segment", "client" */
    const struct kvp_cfg_key *keys;
    size_t n_keys;
    size_t struct_size;
};

/** The table of a kind, or NULL for a bad kind. */
const struct kvp_cfg_table *kvp_cfg_table(enum kvp_cfg_kind kind);

/** Find a key; '-' and '_' are equal, case-sensitive otherwise. NULL when unknown. */
const struct kvp_cfg_key *kvp_cfg_find(const struct kvp_cfg_table *t, const char *name, size_t len);

/**
 * Set one key. `source` names where the value came from for the log line ("flag --x",
 * "file a.json", "env KVPOOL_X", NULL for the API). Logs and returns KVP_ERR_INVALID on a
 * bad value; the struct is unchanged then.
 */
int kvp_cfg_set_key(const struct kvp_cfg_key *k, void *cfg, const char *value, const char *source);

/**
 * Parse a master list ("host:port,tcp://host:port,[v6]:port"; blanks around entries and empty
 * entries are skipped). Without logging: on error writes the reason to why[why_cap].
 * out may be NULL (validate only); else up to cap malloc'd "host:port" strings.
 */
int kvp_cfg_parse_masters(const char *s, char **out, size_t cap, size_t *n, char *why, size_t why_cap);

/** Check "host:port" / "[v6]:port"; on success the host and port (may be NULL). */
int kvp_cfg_parse_hostport(const char *s, size_t len, char *host, size_t host_cap, uint32_t *port);

#endif
