/*
 * config.h — one config struct per process, filled from
 *   defaults < JSON file (jansson) < KVPOOL_* environment < command-line flags.
 *
 * Keys use Mooncake's names where one exists. Every key is described once in a table
 * (config/config_keys.c) with its type, bounds and default; the same table drives JSON,
 * environment (KVPOOL_<KEY IN UPPER CASE>), flags (--key=value, --key value; '-' and '_' are
 * equal) and --print-config. Sizes accept suffixes: 4096, 4K, 4KB, 4KiB, 512M, 512MiB, 4G, 1T
 * (all binary, 1K = 1024). Durations are milliseconds (plain numbers, or with ms/s suffix),
 * except the keys with Mooncake's name whose Mooncake unit is seconds (transfer_timeout,
 * client_ttl): there a plain number is seconds ("10" = 10 s; "500ms" still works). Keys of
 * kvpool's own carry their unit in their name (_ms, _bytes): client_ttl_ms and
 * transfer_timeout_ms are kvpool's spellings of those two, writing the same field. An old
 * spelling (put_ttl for put_ttl_ms) still works and logs a WARN naming the new one. The
 * master also takes mooncake_master's --rpc_address/--rpc_port (the parts of listen) and
 * accepts --rpc_thread_num and the HTTP metadata server flags as not needed (docs/config.md,
 * "Other spellings").
 *
 * An invalid value is KVP_ERR_INVALID with a log line naming the key, the value and what is
 * allowed, e.g. "config: replica_num=0: must be an integer in [1, 16]". The struct is unchanged
 * by a failed set.
 */
#ifndef KVP_CONFIG_H
#define KVP_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_CFG_MAX_MASTERS 9

/** Settings of a kvpool-master process (one Raft member). */
struct kvp_cfg_master {
    uint64_t id;                      /* `id`: Raft server id, >= 1 */
    char listen[256];                 /* `listen`: control-plane "host:port" (ZeroMQ ROUTER binds tcp://) */
    char raft_address[256];           /* `raft_address`: Raft transport "host:port" */
    char data_dir[1024];              /* `data_dir`: Raft log and snapshots */
    char members[2048];               /* `members`: "ID@CTRL_HOST:PORT@RAFT_HOST:PORT,..." bootstrap list */
    bool join;                        /* `join`: start empty and wait to be added (kvpoolctl add-member) */
    uint32_t election_timeout_ms;     /* `election_timeout_ms`: Raft election timeout (default 300) */
    uint32_t raft_heartbeat_ms;       /* `raft_heartbeat_ms`: Raft heartbeat (default 50) */
    uint64_t snapshot_threshold;      /* `snapshot_threshold`: entries between snapshots (default 4096) */
    uint64_t snapshot_trailing;       /* `snapshot_trailing`: entries kept after a snapshot (default 1024) */
    uint64_t snapshot_log_bytes;      /* `snapshot_log_bytes`: also snapshot once the log since the last one holds this many bytes (default 16 MiB) */
    uint32_t group_commit_max;        /* `group_commit_max`: most commands in one Raft entry (default 512) */
    uint32_t raft_max_inflight_entries; /* `raft_max_inflight_entries`: entries proposed, not yet applied (default 4) */
    uint64_t default_kv_lease_ttl_ms; /* `default_kv_lease_ttl`: read lease, ms (default 5000, as Mooncake) */
    uint64_t client_ttl_ms;           /* `client_ttl_ms`, or Mooncake's `client_ttl` in seconds: a segment silent this long is lost (default 10 s) */
    uint64_t put_ttl_ms;              /* `put_ttl_ms` (old name `put_ttl`, deprecated): pending put deadline, ms (default 30000) */
    uint64_t fence_grace_ms;          /* `fence_grace_ms`: quarantine of freed space, ms (default 5000) */
    double eviction_ratio;            /* `eviction_ratio` (default 0.05) */
    double eviction_high_watermark_ratio; /* `eviction_high_watermark_ratio` (default 0.95) */
    double eviction_headroom_factor;  /* `eviction_headroom_factor` (default 1.25; 0 = off) */
    char eviction_policy[16];         /* `eviction_policy`: lru|prefix (default lru; docs/eviction.md) */
    bool allow_evict_soft_pinned_objects; /* `allow_evict_soft_pinned_objects` (default true, as Mooncake) */
    uint32_t probe_timeout_ms;        /* `probe_timeout_ms`: data-plane probe of a reported segment (default 500) */
    char log_level[16];               /* `log_level`: error|warn|info|debug (default info) */
    char log_format[8];               /* `log_format`: text|json (default text; runtime/log.h) */
    uint64_t repair_bandwidth_bytes_per_s; /* `repair_bandwidth_bytes_per_s`: drain/repair copy cap, 0 = none (default 256 MiB) */
    uint32_t bind_retry_ms;           /* `bind_retry_ms`: keep retrying a held data-dir lock or listen port this long (default 5000) */
    uint32_t metrics_port;            /* `metrics_port`: HTTP /metrics /healthz /readyz /get_all_segments, 0 = off (Mooncake's name; default 0) */
    /* authentication (auth/auth.h, docs/security.md) */
    char auth[8];                     /* `auth`: curve|none (default curve) */
    char auth_key[1024];              /* `auth_key`: this master's key pair (PATH_secret) */
    char auth_allowed_dir[1024];      /* `auth_allowed_dir`: public keys allowed to connect */
    char auth_master_keys[1024];      /* `auth_master_keys`: the masters' public keys (peer polls) */
    bool raft_network_trusted;        /* `raft_network_trusted`: allow Raft on a non-loopback address with auth on */
    char tenant_quota[1024];          /* `tenant_quota`: "TENANT=SIZE,..." (default "": none) */
};

/** Settings of a kvpool-segment process. */
struct kvp_cfg_segment {
    char name[128];                   /* `name`: unique segment name (default "<hostname>-<port>") */
    char local_hostname[256];         /* `local_hostname`: this host's address for the data plane (default 127.0.0.1) */
    uint32_t port;                    /* `port`: data-plane TCP port, 0 = ephemeral (default 0) */
    uint64_t global_segment_size;     /* `global_segment_size`: bytes contributed (default 1 GiB) */
    char master_server_address[1024]; /* `master_server_address`: "host:port,host:port,..." */
    char cluster_file[1024];          /* `cluster_file`: cluster.json (alternative to the master list) */
    uint32_t heartbeat_ms;            /* `heartbeat_ms`: heartbeat period (default 1000) */
    bool hugepages;                   /* `hugepages`: try MAP_HUGETLB first (default true) */
    bool segment_prefault;            /* `segment_prefault`: populate the region in the background (default true) */
    uint32_t drain_timeout_ms;        /* `drain_timeout_ms`: (default 60000) */
    uint32_t bind_retry_ms;           /* `bind_retry_ms`: keep retrying a held data-plane port this long (default 5000) */
    char log_level[16];
    char log_format[8];               /* `log_format`: text|json (default text; runtime/log.h) */
    uint32_t metrics_port;            /* `metrics_port`: HTTP /metrics /healthz /readyz, 0 = off (default 0) */
    char auth[8];                     /* `auth`: curve|none; "" = the cluster file's, else curve */
    char auth_key[1024];              /* `auth_key`: this segment's key pair (PATH_secret) */
    char auth_master_keys[1024];      /* `auth_master_keys`: directory of the masters' public keys */
    char protocol[16];                /* `protocol`: tcp|rdma: also serve RDMA when a device is there (default tcp) */
    char device_name[128];            /* `device_name` / `rdma_devices`: RDMA devices, a comma list (default "": any) */
    char gid_index[8];                /* `gid_index`: "auto" or 0..255 (default auto) */
};

/** Settings of an embedded client (kvp_config wraps this). */
struct kvp_cfg_client {
    char master_server_address[1024]; /* `master_server_address`: "host:port,host:port,..." */
    char cluster_file[1024];          /* `cluster_file` */
    char local_hostname[256];         /* `local_hostname` (default 127.0.0.1) */
    uint64_t global_segment_size;     /* `global_segment_size`: embedded segment bytes, 0 = none (default 0) */
    bool segment_prefault;            /* `segment_prefault`: populate the embedded segment in the background (default true) */
    uint64_t local_buffer_size;       /* `local_buffer_size`: bytes (default 0; accepted for Mooncake compatibility) */
    char protocol[16];                /* `protocol`: tcp|rdma (default tcp) */
    char device_name[128];            /* `device_name`, or Mooncake's `rdma_devices`: RDMA devices, a comma list (default "": any) */
    char gid_index[8];                /* `gid_index`: RoCE GID table index, "auto" or 0..255 (default auto; Mooncake's MC_GID_INDEX) */
    uint32_t rdma_qps_per_peer;       /* `rdma_qps_per_peer`: RC QPs per (local NIC, segment NIC), 1..16 (default 2; Mooncake's MC_NUM_QP_PER_EP) */
    uint64_t rdma_slice_bytes;         /* `rdma_slice_bytes`: bytes per RDMA work request, clamped at MR chunk edges (default 256 KiB) */
    uint32_t rdma_fence_bound_ms;     /* `rdma_fence_bound_ms`: longest wait for flush completions before a QP is destroyed and the buffers deregistered (default 1000) */
    uint32_t rdma_reprobe_ms;         /* `rdma_reprobe_ms`: a segment moved to TCP is tried over RDMA again after this long, 0 = never (default 30000) */
    uint32_t replica_num;             /* `replica_num`: default replicas of a put, 1..16 (default 1) */
    uint32_t transfer_timeout_ms;     /* `transfer_timeout_ms`, or Mooncake's `transfer_timeout` in seconds: call timeout (default 10 s) */
    uint32_t rpc_timeout_ms;          /* `rpc_timeout_ms`: one master RPC incl. failover retries (default 5000) */
    uint64_t slice_bytes;             /* `slice_bytes`: transfer slice size (default 1 MiB) */
    uint64_t put_intent_min_bytes;    /* `put_intent_min_bytes`: a put call of at least this many bytes placed from reservations commits its intent while its bytes move (cluster feature level 6), 0 = never (default 1 MiB) */
    uint32_t conns_per_peer;          /* `conns_per_peer`: TCP connections per segment (default 4) */
    uint32_t transfer_io_threads;     /* `transfer_io_threads`: transfer engine I/O threads, 1..8 (default 2) */
    uint32_t heartbeat_ms;            /* `heartbeat_ms`: embedded segment heartbeat (default 1000) */
    uint32_t drain_timeout_ms;        /* `drain_timeout_ms`: bound of kvp_client_drain() (default 30000) */
    char tenant_id[128];              /* `tenant_id`: must agree with the key's tenant when set (default "") */
    char log_level[16];
    uint32_t metrics_port;            /* `metrics_port`: HTTP /metrics /healthz /readyz of this client, 0 = off (default 0) */
    char auth[8];                     /* `auth`: curve|none; "" = the cluster file's, else curve */
    char auth_key[1024];              /* `auth_key`: this client's key pair (PATH_secret) */
    char auth_master_keys[1024];      /* `auth_master_keys`: directory of the masters' public keys */
};

enum kvp_cfg_kind { KVP_CFG_MASTER, KVP_CFG_SEGMENT, KVP_CFG_CLIENT };

/** Fill `cfg` (a struct of `kind`) with the defaults. */
void kvp_cfg_defaults(enum kvp_cfg_kind kind, void *cfg);

/** Set one key from a string. Errors: KVP_ERR_INVALID (unknown key or bad value; logged). */
int kvp_cfg_set(enum kvp_cfg_kind kind, void *cfg, const char *key, const char *value);

/** Apply a JSON file (object of key → string|number|bool). Errors: KVP_ERR_IO, KVP_ERR_INVALID. */
int kvp_cfg_load_file(enum kvp_cfg_kind kind, void *cfg, const char *path);

/** Apply every KVPOOL_<KEY> variable of the environment that names a key of `kind`. */
int kvp_cfg_load_env(enum kvp_cfg_kind kind, void *cfg);

/**
 * The whole layering for a process: defaults, then every `--config FILE` (or --config=FILE)
 * in argv in order, then the environment, then flags, then kvp_cfg_validate(). argv[0] is
 * skipped. Flags are --key=value or --key value ('-' and '_' equal; a single leading dash
 * works too); a bool key also takes a bare --key (true) and --no-key (false). "--" ends the
 * flags. Unknown flags are errors (logged); use kvp_cfg_from_args_ex() to let the caller
 * handle its own flags. Positional arguments (and "-") are left for the caller: their indexes
 * go to positional[] (capacity max_positional; more is KVP_ERR_INVALID), count to
 * *n_positional. Sets *print_config (may be NULL) when --print-config was given.
 * On error `cfg` is unchanged. Errors: KVP_ERR_INVALID, KVP_ERR_IO (config file), KVP_ERR_NOMEM.
 */
int kvp_cfg_from_args(enum kvp_cfg_kind kind, void *cfg, int argc, char **argv,
                      bool *print_config, int *positional, int max_positional, int *n_positional);

/**
 * kvp_cfg_from_args() plus the caller's own flags: `extra_flags` is a NULL-terminated list of
 * flag names without dashes (e.g. {"help", "o=", NULL}); a name ending in '=' takes a value
 * (the next argument unless given as --name=value). An extra flag's index, and its value's
 * index, go to positional[] in order, so the caller parses them from argv itself.
 */
int kvp_cfg_from_args_ex(enum kvp_cfg_kind kind, void *cfg, int argc, char **argv,
                         const char *const *extra_flags, bool *print_config, int *positional,
                         int max_positional, int *n_positional);

/**
 * Checks across keys (master: raft_heartbeat_ms < election_timeout_ms). Logged.
 * kvp_cfg_from_args() calls it; call it yourself after kvp_cfg_set()/load_*.
 * Errors: KVP_ERR_INVALID.
 */
int kvp_cfg_validate(enum kvp_cfg_kind kind, const void *cfg);

/** Usage text listing every key of `kind` with help and default (malloc'd; caller frees). */
char *kvp_cfg_help(enum kvp_cfg_kind kind);

/** Parse a duration "250", "250ms", "30s" into milliseconds. Errors: KVP_ERR_INVALID. */
int kvp_cfg_parse_duration_ms(const char *s, uint64_t *out);

/**
 * The effective config as a JSON object string, keys in table order, sizes in bytes, durations
 * in ms (malloc'd; caller frees with free()). Loading it back as a config file gives the same
 * struct. NULL on bad arguments or out of memory.
 */
char *kvp_cfg_to_json(enum kvp_cfg_kind kind, const void *cfg);

/**
 * The shared start of a daemon's main() (kvpool-master, kvpool-segment): kvp_cfg_from_args with
 * no positional arguments allowed, and --print-config handled. Returns -1 when the process
 * should go on, else its exit status: 0 after printing the config (stdout), 2 for bad settings
 * or an unexpected argument, 1 when out of memory; each error has a stderr line naming `prog`.
 */
int kvp_cfg_daemon_args(enum kvp_cfg_kind kind, void *cfg, const char *prog, int argc, char **argv);

/**
 * True when s is empty or a comma list of RDMA device names (letters, digits, '_', '-', '.';
 * blanks around items allowed; no empty item), as `device_name` / `rdma_devices` take them.
 */
bool kvp_cfg_devlist_check(const char *s);

/** The value of a `gid_index` key: -1 for "auto" or "", 0..255 for an index, -2 when malformed. */
int kvp_cfg_gid_index(const char *s);

/** Parse "4G", "512MiB", "4096" into bytes. Errors: KVP_ERR_INVALID. */
int kvp_cfg_parse_size(const char *s, uint64_t *out);

/**
 * The master list for a client or segment: master_server_address if set, else the
 * "master_server_address" field of cluster_file. Writes up to `cap` "host:port" strings
 * (each malloc'd; free with kvp_cfg_free_masters) into out[], count to *n.
 * Errors: KVP_ERR_INVALID (neither set / bad entry), KVP_ERR_IO (cluster file unreadable).
 */
int kvp_cfg_masters(const char *master_server_address, const char *cluster_file, char **out,
                    size_t cap, size_t *n);
void kvp_cfg_free_masters(char **list, size_t n);

#endif
