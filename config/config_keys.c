/* config_keys.c — the key tables: one row per key of each process kind (see config_internal.h). */
#include <stddef.h>
#include <string.h>

#include "config/config_internal.h"

#define SZ(field, st) sizeof(((st *)0)->field)
#define STR(st, key, field, allowed, check, def, help)                                             \
    {key, KVP_CFG_T_STRING, offsetof(st, field), SZ(field, st), 0, 0, allowed, check, def, help, NULL, 0}
#define BOOL(st, key, field, def, help)                                                            \
    {key, KVP_CFG_T_BOOL, offsetof(st, field), SZ(field, st), 0, 0, NULL, 0, def, help, NULL, 0}
#define NUM(st, type, key, field, lo, hi, def, help)                                               \
    {key, type, offsetof(st, field), SZ(field, st), lo, hi, NULL, 0, def, help, NULL, 0}
/* Validated, then ignored: keys Mooncake users set on the wrong process kind. */
#define IGNORED(type, key, lo, hi, help)                                                           \
    {key, type, KVP_CFG_NO_FIELD, 1024, lo, hi, NULL, 0, NULL, help, NULL, 0}

/* Another spelling of the key `of`, writing the same field: a key with Mooncake's name and
 * Mooncake's unit next to kvpool's own key that carries its unit in its name. */
#define ALIAS(st, type, key, field, lo, hi, of, help)                                              \
    {key, type, offsetof(st, field), SZ(field, st), lo, hi, NULL, 0, NULL, help, of, 0}
/* An old spelling of the key `of`, same type and unit, kept so that existing configs keep
 * working; each use logs a WARN naming `of`. */
#define DEPRECATED(st, type, key, field, lo, hi, of)                                               \
    {key, type, offsetof(st, field), SZ(field, st), lo, hi, NULL, 0, NULL, "old spelling of " of, of, 1}
/* Mooncake's --rpc_address / --rpc_port: one part of a host:port field. */
#define HOSTPORT_PART(st, type, key, field, check, lo, hi, help)                                   \
    {key, type, offsetof(st, field), SZ(field, st), lo, hi, NULL, check, NULL, help, #field, 0}

#define KIB 1024.0
#define MIB (1024.0 * KIB)
#define GIB (1024.0 * MIB)
#define TIB (1024.0 * GIB)
#define LOG_LEVELS "error|warn|info|debug"
#define LOG_FORMATS "text|json"

#define M struct kvp_cfg_master
static const struct kvp_cfg_key master_keys[] = {
    NUM(M, KVP_CFG_T_U64, "id", id, 1, 1e15, "1", "Raft server id of this master (>= 1)"),
    STR(M, "listen", listen, NULL, KVP_CFG_CHECK_HOSTPORT, "127.0.0.1:7101",
        "control-plane host:port (ZeroMQ ROUTER binds tcp://host:port)"),
    STR(M, "raft_address", raft_address, NULL, KVP_CFG_CHECK_HOSTPORT, "127.0.0.1:7201",
        "Raft transport host:port"),
    STR(M, "data_dir", data_dir, NULL, 0, "kvpool-master-data", "directory of the Raft log and snapshots"),
    STR(M, "members", members, NULL, 0, "",
        "bootstrap list ID@CTRL_HOST:PORT@RAFT_HOST:PORT,...; empty = this master alone"),
    BOOL(M, "join", join, "false", "start empty and wait to be added (kvpoolctl add-member)"),
    NUM(M, KVP_CFG_T_DURATION_MS, "election_timeout_ms", election_timeout_ms, 50, 600000, "300",
        "Raft election timeout"),
    NUM(M, KVP_CFG_T_DURATION_MS, "raft_heartbeat_ms", raft_heartbeat_ms, 5, 60000, "50",
        "Raft heartbeat period (must be below election_timeout_ms)"),
    NUM(M, KVP_CFG_T_U64, "snapshot_threshold", snapshot_threshold, 1, 1e12, "4096",
        "Raft entries between snapshots"),
    NUM(M, KVP_CFG_T_U64, "snapshot_trailing", snapshot_trailing, 0, 1e12, "1024",
        "Raft entries kept after a snapshot"),
    NUM(M, KVP_CFG_T_SIZE, "snapshot_log_bytes", snapshot_log_bytes, 1 * MIB, 64 * TIB, "16MiB",
        "also snapshot once the Raft log since the last snapshot holds this many bytes; bounds the log "
        "the master keeps in memory (below 1 MiB a large FSM would be serialized back to back)"),
    NUM(M, KVP_CFG_T_U32, "group_commit_max", group_commit_max, 1, 65536, "512",
        "most commands batched into one Raft entry"),
    NUM(M, KVP_CFG_T_U32, "raft_max_inflight_entries", raft_max_inflight_entries, 1, 64, "4",
        "Raft entries the leader has proposed and not yet applied; commands arriving meanwhile wait "
        "and go into the next entry (fewer: larger entries, less CPU per command, more latency)"),
    NUM(M, KVP_CFG_T_DURATION_MS, "default_kv_lease_ttl", default_kv_lease_ttl_ms, 1, 3600000, "5000",
        "read lease handed out with a replica list (Mooncake's name; ms)"),
    NUM(M, KVP_CFG_T_DURATION_MS, "client_ttl_ms", client_ttl_ms, 100, 86400000, "10000",
        "a segment silent this long is declared lost"),
    ALIAS(M, KVP_CFG_T_DURATION_S, "client_ttl", client_ttl_ms, 100, 86400000, "client_ttl_ms",
          "Mooncake's spelling of client_ttl_ms, in Mooncake's unit: a plain number is seconds"),
    NUM(M, KVP_CFG_T_DURATION_MS, "put_ttl_ms", put_ttl_ms, 100, 86400000, "30000",
        "deadline of a pending put before the leader revokes it"),
    DEPRECATED(M, KVP_CFG_T_DURATION_MS, "put_ttl", put_ttl_ms, 100, 86400000, "put_ttl_ms"),
    NUM(M, KVP_CFG_T_DURATION_MS, "fence_grace_ms", fence_grace_ms, 0, 3600000, "5000",
        "quarantine of freed space before reuse"),
    NUM(M, KVP_CFG_T_DOUBLE, "eviction_ratio", eviction_ratio, 0.0, 1.0, "0.05",
        "share of the pool evicted when above the high watermark"),
    NUM(M, KVP_CFG_T_DOUBLE, "eviction_high_watermark_ratio", eviction_high_watermark_ratio, 0.0, 1.0,
        "0.95", "pool usage ratio that starts eviction"),
    NUM(M, KVP_CFG_T_DOUBLE, "eviction_headroom_factor", eviction_headroom_factor, 0.0, 10.0, "1.25",
        "eviction starts early enough that the free space and the quarantine due in time absorb write "
        "rate x max(fence_grace_ms, default_kv_lease_ttl + 4 x election_timeout_ms) x this factor "
        "(0: only the high watermark)"),
    STR(M, "eviction_policy", eviction_policy, "lru|prefix", 0, "lru",
        "eviction order: lru, or prefix (later blocks of a prefix before its head; docs/eviction.md)"),
    BOOL(M, "allow_evict_soft_pinned_objects", allow_evict_soft_pinned_objects, "true",
         "soft-pinned objects may be evicted when nothing else can go (Mooncake's name)"),
    NUM(M, KVP_CFG_T_DURATION_MS, "probe_timeout_ms", probe_timeout_ms, 1, 600000, "500",
        "data-plane probe of a segment that a client reported unreachable"),
    STR(M, "log_level", log_level, LOG_LEVELS, 0, "info", "log level"),
    STR(M, "log_format", log_format, LOG_FORMATS, 0, "text",
        "log lines as text, or as one JSON object per line (ts, level, actor, pid, msg)"),
    NUM(M, KVP_CFG_T_SIZE, "repair_bandwidth_bytes_per_s", repair_bandwidth_bytes_per_s, 0, 64 * TIB,
        "256MiB", "bytes per second the leader hands to movers for drain and repair copies; 0 = no cap"),
    NUM(M, KVP_CFG_T_DURATION_MS, "bind_retry_ms", bind_retry_ms, 0, 600000, "5000",
        "at start, keep retrying (with backoff, one log line per try) a data-dir lock or listen port "
        "still held, e.g. by a killed previous incarnation whose threads are still exiting; then exit 1"),
    NUM(M, KVP_CFG_T_U32, "metrics_port", metrics_port, 0, 65535, "0",
        "HTTP port of /metrics (Prometheus), /healthz, /readyz and /get_all_segments, on the host of "
        "`listen`; 0 = off (Mooncake's name)"),
    /* mooncake_master's flags, so that its command line starts a kvpool-master as it is */
    HOSTPORT_PART(M, KVP_CFG_T_STRING, "rpc_address", listen, KVP_CFG_CHECK_LISTEN_HOST, 0, 0,
                  "Mooncake's flag: the host of listen (listen = rpc_address:rpc_port)"),
    HOSTPORT_PART(M, KVP_CFG_T_U32, "rpc_port", listen, KVP_CFG_CHECK_LISTEN_PORT, 1, 65535,
                  "Mooncake's flag: the port of listen"),
    IGNORED(KVP_CFG_T_U32, "rpc_thread_num", 0, 65536,
            "Mooncake's RPC thread count: not needed, kvpool's master is one actor"),
    IGNORED(KVP_CFG_T_BOOL, "enable_http_metadata_server", 0, 0,
            "Mooncake's HTTP metadata server: not needed, kvpool has no transfer-engine metadata "
            "(metrics_port serves /get_all_segments)"),
    IGNORED(KVP_CFG_T_STRING, "http_metadata_server_host", 0, 0,
            "Mooncake's HTTP metadata server: not needed, nothing is bound"),
    IGNORED(KVP_CFG_T_U32, "http_metadata_server_port", 0, 65535,
            "Mooncake's HTTP metadata server: not needed, nothing is bound"),
    STR(M, "auth", auth, "curve|none", 0, "curve",
        "authentication of every port (docs/security.md): curve, or none (one WARN at start)"),
    STR(M, "auth_key", auth_key, NULL, 0, "", "this master's key pair (kvpoolctl keygen; the PATH_secret file)"),
    STR(M, "auth_allowed_dir", auth_allowed_dir, NULL, 0, "",
        "directory of the public keys allowed to connect (their role and tenant are in each file)"),
    STR(M, "auth_master_keys", auth_master_keys, NULL, 0, "",
        "directory of the masters' public keys (for this master's polls of its peers)"),
    BOOL(M, "raft_network_trusted", raft_network_trusted, "false",
         "with auth on, Raft binds only loopback addresses unless this says the Raft network is closed "
         "to anyone else (Raft peers are not authenticated; docs/security.md)"),
    STR(M, "tenant_quota", tenant_quota, NULL, 0, "",
        "bytes each tenant may hold, TENANT=SIZE,... (e.g. a=4GiB,b=1GiB); a tenant over its quota evicts its "
        "own least recently used objects first (docs/security.md)"),
};
#undef M

#define S struct kvp_cfg_segment
static const struct kvp_cfg_key segment_keys[] = {
    STR(S, "name", name, NULL, 0, "", "unique segment name; empty = <hostname>-<port> at start"),
    STR(S, "local_hostname", local_hostname, NULL, 0, "127.0.0.1",
        "this host's address for the data plane (IPv4, IPv6 or host name)"),
    NUM(S, KVP_CFG_T_U32, "port", port, 0, 65535, "0", "data-plane TCP port; 0 = ephemeral"),
    NUM(S, KVP_CFG_T_SIZE, "global_segment_size", global_segment_size, 4096, 64 * TIB, "1GiB",
        "bytes of memory this segment contributes"),
    STR(S, "master_server_address", master_server_address, NULL, KVP_CFG_CHECK_MASTERS, "",
        "master list host:port,host:port,..."),
    STR(S, "cluster_file", cluster_file, NULL, 0, "", "cluster.json (used when master_server_address is empty)"),
    NUM(S, KVP_CFG_T_DURATION_MS, "heartbeat_ms", heartbeat_ms, 10, 600000, "1000", "heartbeat period"),
    BOOL(S, "hugepages", hugepages, "true", "try MAP_HUGETLB first, fall back to normal pages"),
    BOOL(S, "segment_prefault", segment_prefault, "true",
         "populate the region's pages on a background thread after it is mapped, so a transfer does not "
         "take the first-write page fault (embedded client segments use the default)"),
    NUM(S, KVP_CFG_T_DURATION_MS, "drain_timeout_ms", drain_timeout_ms, 0, 86400000, "60000",
        "longest wait for a drain on SIGTERM"),
    NUM(S, KVP_CFG_T_DURATION_MS, "bind_retry_ms", bind_retry_ms, 0, 600000, "5000",
        "at start, keep retrying (with backoff, one log line per try) a data-plane port still held, "
        "e.g. by a killed previous incarnation whose threads are still exiting; then exit 1"),
    STR(S, "log_level", log_level, LOG_LEVELS, 0, "info", "log level"),
    STR(S, "log_format", log_format, LOG_FORMATS, 0, "text",
        "log lines as text, or as one JSON object per line (ts, level, actor, pid, msg)"),
    IGNORED(KVP_CFG_T_STRING, "metadata_server", 0, 0,
            "Mooncake transfer-engine metadata server (kvpool has none)"),
    NUM(S, KVP_CFG_T_U32, "metrics_port", metrics_port, 0, 65535, "0",
        "HTTP port of /metrics (Prometheus), /healthz and /readyz, on local_hostname; 0 = off"),
    STR(S, "auth", auth, NULL, 0, "",
        "curve|none; empty = the cluster file's \"auth\" mode, else curve (docs/security.md)"),
    STR(S, "auth_key", auth_key, NULL, 0, "", "this process's key pair (PATH_secret); empty = the cluster file's"),
    STR(S, "auth_master_keys", auth_master_keys, NULL, 0, "",
        "directory of the masters' public keys; empty = the cluster file's"),
    STR(S, "protocol", protocol, "tcp|rdma", 0, "tcp",
        "data-plane transport offered to clients; rdma also serves TCP, and falls back to it with no device"),
    STR(S, "device_name", device_name, NULL, KVP_CFG_CHECK_DEVLIST, "",
        "RDMA devices that register the region, a comma list; empty = any"),
    {"rdma_devices", KVP_CFG_T_STRING, offsetof(S, device_name), SZ(device_name, S), 0, 0, NULL,
     KVP_CFG_CHECK_DEVLIST, NULL, "Mooncake's name for device_name (a comma list)", "device_name", 0},
    STR(S, "gid_index", gid_index, NULL, KVP_CFG_CHECK_GID_INDEX, "auto",
        "RoCE GID table index; auto = the first RoCE v2 entry with an IPv4-mapped address"),
};
#undef S

#define C struct kvp_cfg_client
static const struct kvp_cfg_key client_keys[] = {
    STR(C, "master_server_address", master_server_address, NULL, KVP_CFG_CHECK_MASTERS, "",
        "master list host:port,host:port,..."),
    STR(C, "cluster_file", cluster_file, NULL, 0, "", "cluster.json (used when master_server_address is empty)"),
    STR(C, "local_hostname", local_hostname, NULL, 0, "127.0.0.1",
        "this host's address (replica choice; embedded segment's data plane)"),
    NUM(C, KVP_CFG_T_SIZE, "global_segment_size", global_segment_size, 0, 64 * TIB, "0",
        "bytes of an embedded segment contributed by this process; 0 = none"),
    BOOL(C, "segment_prefault", segment_prefault, "true",
         "populate the embedded segment's pages on a background thread (as kvpool-segment's key)"),
    NUM(C, KVP_CFG_T_SIZE, "local_buffer_size", local_buffer_size, 0, 64 * TIB, "0",
        "accepted for Mooncake compatibility (kvpool reads into caller buffers)"),
    STR(C, "protocol", protocol, "tcp|rdma", 0, "tcp", "data-plane transport"),
    STR(C, "device_name", device_name, NULL, KVP_CFG_CHECK_DEVLIST, "",
        "RDMA devices to use, a comma list (mlx5_0,mlx5_1); empty = any, chosen per buffer by NUMA/GPU affinity"),
    {"rdma_devices", KVP_CFG_T_STRING, offsetof(C, device_name), SZ(device_name, C), 0, 0, NULL,
     KVP_CFG_CHECK_DEVLIST, NULL, "Mooncake's name for device_name (a comma list)", "device_name", 0},
    STR(C, "gid_index", gid_index, NULL, KVP_CFG_CHECK_GID_INDEX, "auto",
        "RoCE GID table index; auto = the first RoCE v2 entry with an IPv4-mapped address (Mooncake's MC_GID_INDEX)"),
    NUM(C, KVP_CFG_T_U32, "rdma_qps_per_peer", rdma_qps_per_peer, 1, 16, "2",
        "RC queue pairs per (local NIC, segment NIC); slices go round-robin over them"),
    NUM(C, KVP_CFG_T_SIZE, "rdma_slice_bytes", rdma_slice_bytes, 4096, 1 * GIB, "256KiB",
        "bytes per RDMA work request (clamped at memory-registration chunk edges)"),
    NUM(C, KVP_CFG_T_DURATION_MS, "rdma_fence_bound_ms", rdma_fence_bound_ms, 1, 600000, "1000",
        "a timed-out call waits this long for flush completions; then its QPs are destroyed and its "
        "buffers deregistered (docs/rdma.md)"),
    NUM(C, KVP_CFG_T_DURATION_MS, "rdma_reprobe_ms", rdma_reprobe_ms, 0, 3600000, "30000",
        "a segment reached over TCP because RDMA was refused is tried over RDMA again this long after "
        "(0 = never; docs/rdma.md)"),
    NUM(C, KVP_CFG_T_U32, "replica_num", replica_num, 1, 16, "1", "default replicas of a put"),
    NUM(C, KVP_CFG_T_DURATION_MS, "transfer_timeout_ms", transfer_timeout_ms, 1, 3600000, "10000",
        "default timeout of one put/get call"),
    ALIAS(C, KVP_CFG_T_DURATION_S, "transfer_timeout", transfer_timeout_ms, 1, 3600000, "transfer_timeout_ms",
          "Mooncake's spelling of transfer_timeout_ms, in Mooncake's unit: a plain number is seconds (\"500ms\" for ms)"),
    NUM(C, KVP_CFG_T_DURATION_MS, "rpc_timeout_ms", rpc_timeout_ms, 1, 3600000, "5000",
        "one master RPC including failover retries"),
    NUM(C, KVP_CFG_T_SIZE, "slice_bytes", slice_bytes, 4096, 1 * GIB, "1MiB", "transfer slice size"),
    NUM(C, KVP_CFG_T_SIZE, "put_intent_min_bytes", put_intent_min_bytes, 0, 1024 * GIB, "1MiB",
        "a put call of at least this many bytes commits its intent while the bytes move (level 6); 0 = never"),
    NUM(C, KVP_CFG_T_U32, "conns_per_peer", conns_per_peer, 1, 64, "4", "TCP connections per segment"),
    NUM(C, KVP_CFG_T_U32, "transfer_io_threads", transfer_io_threads, 1, 8, "2",
        "transfer I/O threads; a call's transfer runs on the least busy one (each has its own connections)"),
    NUM(C, KVP_CFG_T_DURATION_MS, "heartbeat_ms", heartbeat_ms, 10, 600000, "1000",
        "embedded segment heartbeat period"),
    NUM(C, KVP_CFG_T_DURATION_MS, "drain_timeout_ms", drain_timeout_ms, 0, 86400000, "30000",
        "longest wait of kvp_client_drain() for the embedded segment's objects to move"),
    STR(C, "tenant_id", tenant_id, NULL, 0, "", "tenant (Mooncake's key): when set, must be the tenant the key is authorised for"),
    STR(C, "log_level", log_level, LOG_LEVELS, 0, "info", "log level"),
    IGNORED(KVP_CFG_T_STRING, "metadata_server", 0, 0,
            "Mooncake transfer-engine metadata server (kvpool has none)"),
    IGNORED(KVP_CFG_T_BOOL, "enable_ssd_offload", 0, 0, "Mooncake's SSD tier (not in kvpool): validated only"),
    IGNORED(KVP_CFG_T_STRING, "ssd_offload_path", 0, 0, "Mooncake's SSD tier (not in kvpool): validated only"),
    IGNORED(KVP_CFG_T_DURATION_MS, "default_kv_lease_ttl", 1, 3600000,
            "a kvpool-master setting, validated only"),
    IGNORED(KVP_CFG_T_DURATION_S, "client_ttl", 100, 86400000,
            "a kvpool-master setting, validated only"),
    IGNORED(KVP_CFG_T_DOUBLE, "eviction_ratio", 0.0, 1.0, "a kvpool-master setting, validated only"),
    IGNORED(KVP_CFG_T_DOUBLE, "eviction_high_watermark_ratio", 0.0, 1.0,
            "a kvpool-master setting, validated only"),
    NUM(C, KVP_CFG_T_U32, "metrics_port", metrics_port, 0, 65535, "0",
        "HTTP port of this client's /metrics (Prometheus), /healthz and /readyz, on local_hostname; 0 = off "
        "(each process on a host needs its own)"),
    STR(C, "auth", auth, NULL, 0, "",
        "curve|none; empty = the cluster file's \"auth\" mode, else curve (docs/security.md)"),
    STR(C, "auth_key", auth_key, NULL, 0, "", "this process's key pair (PATH_secret); empty = the cluster file's"),
    STR(C, "auth_master_keys", auth_master_keys, NULL, 0, "",
        "directory of the masters' public keys; empty = the cluster file's"),
};
#undef C

static const struct kvp_cfg_table tables[] = {
    [KVP_CFG_MASTER] = {"master", master_keys, sizeof master_keys / sizeof master_keys[0],
                        sizeof(struct kvp_cfg_master)},
    [KVP_CFG_SEGMENT] = {"segment", segment_keys, sizeof segment_keys / sizeof segment_keys[0],
                         sizeof(struct kvp_cfg_segment)},
    [KVP_CFG_CLIENT] = {"client", client_keys, sizeof client_keys / sizeof client_keys[0],
                        sizeof(struct kvp_cfg_client)},
};

const struct kvp_cfg_table *kvp_cfg_table(enum kvp_cfg_kind kind)
{
    if ((unsigned)kind > KVP_CFG_CLIENT)
        return NULL;
    return &tables[kind];
}

static int name_eq(const char *key, const char *name, size_t len)
{
    size_t i = 0;
    for (; i < len && key[i]; i++) {
        char a = key[i], b = name[i];
        if (a == '-')
            a = '_';
        if (b == '-')
            b = '_';
        if (a != b)
            return 0;
    }
    return i == len && key[i] == '\0';
}

bool kvp_cfg_devlist_check(const char *s)
{
    if (!s)
        return false;
    size_t item = 0;    /* name characters in the current item */
    bool blank_after = false;
    for (const char *p = s;; p++) {
        char c = *p;
        if (c == ',' || c == '\0') {
            if (item == 0 && *s)
                return false; /* an empty item (or only blanks) */
            if (c == '\0')
                return true;
            item = 0;
            blank_after = false;
            continue;
        }
        if (c == ' ' || c == '\t') {
            if (item)
                blank_after = true;
            continue;
        }
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-' || c == '.';
        if (!ok || blank_after)
            return false;
        item++;
    }
}

int kvp_cfg_gid_index(const char *s)
{
    if (!s || !*s || strcmp(s, "auto") == 0)
        return -1;
    int v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9' || p - s >= 3)
            return -2;
        v = v * 10 + (*p - '0');
    }
    return v <= 255 ? v : -2;
}

const struct kvp_cfg_key *kvp_cfg_find(const struct kvp_cfg_table *t, const char *name, size_t len)
{
    if (!t || !name)
        return NULL;
    for (size_t i = 0; i < t->n_keys; i++)
        if (name_eq(t->keys[i].name, name, len))
            return &t->keys[i];
    return NULL;
}
