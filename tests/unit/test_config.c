/* test_config.c — config/: parsing, every error path, layering, print-config, master lists, public API. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "actors/client/api_config.h"
#include "config/config.h"
#include "config/config_internal.h"
#include "kvpool.h"

extern char **environ;

/* ------------------------------------------------------------------ helpers */

static char tmpdir[256];

static const char *write_tmp(const char *name, const char *content)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(content, f);
    fclose(f);
    return path;
}

/* Capture what the logger writes to fd 2 between cap_start() and cap_end(). */
static int saved_fd2 = -1;
static FILE *cap_file;

static void cap_start(void)
{
    fflush(stderr);
    cap_file = tmpfile();
    assert_non_null(cap_file);
    saved_fd2 = dup(2);
    dup2(fileno(cap_file), 2);
}

static char *cap_end(void)
{
    fflush(stderr);
    dup2(saved_fd2, 2);
    close(saved_fd2);
    long n = ftell(cap_file);
    if (n < 0)
        n = 0;
    rewind(cap_file);
    char *s = calloc(1, (size_t)n + 1);
    assert_non_null(s);
    size_t got = fread(s, 1, (size_t)n, cap_file);
    s[got] = '\0';
    fclose(cap_file);
    return s;
}

/* Expect kvp_cfg_set to fail with INVALID, leave the struct unchanged, and log a line
 * containing every needle. */
static void expect_bad(enum kvp_cfg_kind kind, const char *key, const char *value, const char *needle1,
                       const char *needle2)
{
    union {
        struct kvp_cfg_master m;
        struct kvp_cfg_segment s;
        struct kvp_cfg_client c;
    } a, b;
    kvp_cfg_defaults(kind, &a);
    memcpy(&b, &a, sizeof a);
    cap_start();
    int rc = kvp_cfg_set(kind, &a, key, value);
    char *log = cap_end();
    if (rc != KVP_ERR_INVALID)
        fail_msg("%s=%s: rc %d, want KVP_ERR_INVALID", key, value, rc);
    assert_memory_equal(&a, &b, sizeof a);
    if (needle1 && !strstr(log, needle1))
        fail_msg("%s=%s: log '%s' lacks '%s'", key, value, log, needle1);
    if (needle2 && !strstr(log, needle2))
        fail_msg("%s=%s: log '%s' lacks '%s'", key, value, log, needle2);
    free(log);
}

static void clear_kvpool_env(void)
{
    for (;;) {
        char name[256] = "";
        for (char **e = environ; *e; e++)
            if (strncmp(*e, "KVPOOL_", 7) == 0 && strncmp(*e, "KVPOOL_LOG_LEVEL=", 17) != 0) {
                const char *eq = strchr(*e, '=');
                size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
                if (n >= sizeof name)
                    n = sizeof name - 1;
                memcpy(name, *e, n);
                name[n] = '\0';
                break;
            }
        if (!name[0])
            break;
        unsetenv(name);
    }
    unsetenv("KVPOOL_LOG_LEVEL");
}

static int setup(void **state)
{
    (void)state;
    clear_kvpool_env();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    clear_kvpool_env();
    return 0;
}

/* ------------------------------------------------------------------ defaults */

static void test_config_defaults_documented_values(void **state)
{
    (void)state;
    struct kvp_cfg_master m;
    kvp_cfg_defaults(KVP_CFG_MASTER, &m);
    assert_int_equal(m.id, 1);
    assert_int_equal(m.election_timeout_ms, 300);
    assert_int_equal(m.raft_heartbeat_ms, 50);
    assert_int_equal(m.snapshot_threshold, 4096);
    assert_int_equal(m.snapshot_trailing, 1024);
    assert_int_equal(m.group_commit_max, 512);
    assert_int_equal(m.default_kv_lease_ttl_ms, 5000);
    assert_int_equal(m.client_ttl_ms, 10000);
    assert_int_equal(m.put_ttl_ms, 30000);
    assert_int_equal(m.fence_grace_ms, 5000);
    assert_true(m.eviction_ratio > 0.0499 && m.eviction_ratio < 0.0501);
    assert_true(m.eviction_high_watermark_ratio > 0.9499 && m.eviction_high_watermark_ratio < 0.9501);
    assert_true(m.eviction_headroom_factor > 1.2499 && m.eviction_headroom_factor < 1.2501);
    assert_int_equal(m.probe_timeout_ms, 500);
    assert_false(m.join);
    assert_string_equal(m.log_level, "info");
    assert_string_equal(m.listen, "127.0.0.1:7101");
    assert_int_equal(kvp_cfg_validate(KVP_CFG_MASTER, &m), KVP_OK);
    /* Mooncake's units: client_ttl in seconds (mooncake_master --client_ttl 10),
     * default_kv_lease_ttl in milliseconds (--default_kv_lease_ttl 5000) */
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "client_ttl", "3"), KVP_OK);
    assert_int_equal(m.client_ttl_ms, 3000);
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "client_ttl", "2500ms"), KVP_OK);
    assert_int_equal(m.client_ttl_ms, 2500);
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "default_kv_lease_ttl", "5000"), KVP_OK);
    assert_int_equal(m.default_kv_lease_ttl_ms, 5000);

    struct kvp_cfg_segment s;
    kvp_cfg_defaults(KVP_CFG_SEGMENT, &s);
    assert_int_equal(s.global_segment_size, 1ull << 30);
    assert_string_equal(s.local_hostname, "127.0.0.1");
    assert_int_equal(s.port, 0);
    assert_int_equal(s.heartbeat_ms, 1000);
    assert_true(s.hugepages);
    assert_int_equal(s.drain_timeout_ms, 60000);

    struct kvp_cfg_client c;
    kvp_cfg_defaults(KVP_CFG_CLIENT, &c);
    assert_string_equal(c.local_hostname, "127.0.0.1");
    assert_int_equal(c.global_segment_size, 0);
    assert_int_equal(c.local_buffer_size, 0);
    assert_string_equal(c.protocol, "tcp");
    assert_string_equal(c.device_name, "");
    assert_int_equal(c.replica_num, 1);
    assert_int_equal(c.transfer_timeout_ms, 10000);
    assert_int_equal(c.rpc_timeout_ms, 5000);
    assert_int_equal(c.slice_bytes, 1u << 20);
    assert_int_equal(c.conns_per_peer, 4);
    assert_int_equal(c.transfer_io_threads, 2);
    assert_int_equal(c.heartbeat_ms, 1000);
    assert_string_equal(c.master_server_address, "");
}

static void test_config_defaults_all_parse_without_log(void **state)
{
    (void)state;
    for (int kind = KVP_CFG_MASTER; kind <= KVP_CFG_CLIENT; kind++) {
        const struct kvp_cfg_table *t = kvp_cfg_table((enum kvp_cfg_kind)kind);
        assert_non_null(t);
        char buf[8192];
        assert_true(t->struct_size <= sizeof buf);
        for (size_t i = 0; i < t->n_keys; i++) {
            const struct kvp_cfg_key *k = &t->keys[i];
            assert_non_null(k->help);
            if (k->offset == KVP_CFG_NO_FIELD)
                continue;
            if (k->alias_of) { /* another spelling: no default of its own, names a real key */
                assert_null(k->def);
                assert_non_null(kvp_cfg_find(t, k->alias_of, strlen(k->alias_of)));
                continue;
            }
            assert_non_null(k->def);
            assert_true(k->offset < t->struct_size);
            cap_start();
            int rc = kvp_cfg_set_key(k, buf, k->def, "default");
            char *log = cap_end();
            if (rc != KVP_OK || log[0])
                fail_msg("%s: default '%s' rejected: %s", k->name, k->def, log);
            free(log);
        }
    }
    assert_null(kvp_cfg_table((enum kvp_cfg_kind)7));
}

/* ------------------------------------------------------------------ sizes and durations */

static void test_config_parse_size_suffixes_binary(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        uint64_t v;
    } ok[] = {
        {"4096", 4096},       {"0", 0},
        {"4K", 4096},         {"4KB", 4096},
        {"4KiB", 4096},       {"4k", 4096},
        {"4kib", 4096},       {"512M", 512ull << 20},
        {"512MiB", 512ull << 20}, {"512MB", 512ull << 20},
        {"4G", 4ull << 30},   {"4GiB", 4ull << 30},
        {"1T", 1ull << 40},   {"1TiB", 1ull << 40},
        {"100B", 100},        {"8 G", 8ull << 30},
        {"16777215T", 16777215ull << 40},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t v = 1;
        if (kvp_cfg_parse_size(ok[i].s, &v) != KVP_OK)
            fail_msg("size '%s' rejected", ok[i].s);
        assert_int_equal(v, ok[i].v);
    }
    static const char *const bad[] = {"",    "G",    "-1",     "4X",   "4GiBs", "1.5G", " 4",
                                      "4P",  "0x10", "+4",     "4 ",   "4iB",
                                      "16777216T", "18446744073709551616"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 77;
        if (kvp_cfg_parse_size(bad[i], &v) != KVP_ERR_INVALID)
            fail_msg("size '%s' accepted", bad[i]);
        assert_int_equal(v, 77);
    }
    uint64_t v;
    assert_int_equal(kvp_cfg_parse_size(NULL, &v), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_parse_size("4", NULL), KVP_ERR_INVALID);
}

static void test_config_parse_duration_ms_and_s(void **state)
{
    (void)state;
    uint64_t v = 0;
    assert_int_equal(kvp_cfg_parse_duration_ms("250", &v), KVP_OK);
    assert_int_equal(v, 250);
    assert_int_equal(kvp_cfg_parse_duration_ms("250ms", &v), KVP_OK);
    assert_int_equal(v, 250);
    assert_int_equal(kvp_cfg_parse_duration_ms("30s", &v), KVP_OK);
    assert_int_equal(v, 30000);
    assert_int_equal(kvp_cfg_parse_duration_ms("30S", &v), KVP_OK);
    assert_int_equal(v, 30000);
    assert_int_equal(kvp_cfg_parse_duration_ms("0", &v), KVP_OK);
    assert_int_equal(v, 0);
    static const char *const bad[] = {"", "s", "ms", "-5", "1.5s", "10m", "10min", "5 sec", "5 ",
                                      "18446744073709551615s", "abc", NULL};
    for (size_t i = 0; bad[i]; i++)
        if (kvp_cfg_parse_duration_ms(bad[i], &v) != KVP_ERR_INVALID)
            fail_msg("duration '%s' accepted", bad[i]);
    assert_int_equal(kvp_cfg_parse_duration_ms(NULL, &v), KVP_ERR_INVALID);
}

/* ------------------------------------------------------------------ set: good values */

static void test_config_set_every_type_stored(void **state)
{
    (void)state;
    struct kvp_cfg_client c;
    kvp_cfg_defaults(KVP_CFG_CLIENT, &c);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "replica_num", "3"), KVP_OK);
    assert_int_equal(c.replica_num, 3);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "global_segment_size", "4GiB"), KVP_OK);
    assert_int_equal(c.global_segment_size, 4ull << 30);
    assert_true(c.segment_prefault); /* default, like kvpool-segment's */
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "segment_prefault", "false"), KVP_OK);
    assert_false(c.segment_prefault);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "transfer_timeout", "30s"), KVP_OK);
    assert_int_equal(c.transfer_timeout_ms, 30000);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "transfer-timeout", "1500ms"), KVP_OK);
    assert_int_equal(c.transfer_timeout_ms, 1500);
    /* Mooncake's unit for transfer_timeout: a plain number is seconds */
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "transfer_timeout", "7"), KVP_OK);
    assert_int_equal(c.transfer_timeout_ms, 7000);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "protocol", "RDMA"), KVP_OK);
    assert_string_equal(c.protocol, "rdma");
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "log_level", "DEBUG"), KVP_OK);
    assert_string_equal(c.log_level, "debug");
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "master_server_address",
                                 "tcp://10.0.0.1:7101, [::1]:7102,host-b:7103"), KVP_OK);
    assert_string_equal(c.master_server_address, "tcp://10.0.0.1:7101, [::1]:7102,host-b:7103");
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "device_name", ""), KVP_OK);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "master_server_address", ""), KVP_OK);
    /* RDMA keys (issue 20): Mooncake's rdma_devices writes device_name; comma lists checked */
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "rdma_devices", "mlx5_0, mlx5_1"), KVP_OK);
    assert_string_equal(c.device_name, "mlx5_0, mlx5_1");
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "device_name", "mlx5_0,,mlx5_1"), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "device_name", "mlx5_0,"), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "device_name", "mlx5 0"), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "device_name", "mlx5_0;rm"), KVP_ERR_INVALID);
    assert_string_equal(c.device_name, "mlx5_0, mlx5_1");
    assert_string_equal(c.gid_index, "auto");
    assert_int_equal(kvp_cfg_gid_index(c.gid_index), -1);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "gid_index", "3"), KVP_OK);
    assert_int_equal(kvp_cfg_gid_index(c.gid_index), 3);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "gid_index", "256"), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "gid_index", "-1"), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_gid_index("x"), -2);
    assert_int_equal(kvp_cfg_gid_index("0255"), -2);
    assert_int_equal(c.rdma_qps_per_peer, 2);
    assert_int_equal(c.rdma_slice_bytes, 256 * 1024);
    assert_int_equal(c.rdma_fence_bound_ms, 1000);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "rdma_qps_per_peer", "17"), KVP_ERR_INVALID);
    assert_true(kvp_cfg_devlist_check(""));
    assert_false(kvp_cfg_devlist_check(" "));
    struct kvp_cfg_segment sg;
    kvp_cfg_defaults(KVP_CFG_SEGMENT, &sg);
    assert_string_equal(sg.protocol, "tcp");
    assert_int_equal(kvp_cfg_set(KVP_CFG_SEGMENT, &sg, "protocol", "rdma"), KVP_OK);
    assert_int_equal(kvp_cfg_set(KVP_CFG_SEGMENT, &sg, "rdma_devices", "mlx5_2"), KVP_OK);
    assert_string_equal(sg.device_name, "mlx5_2");
    assert_int_equal(kvp_cfg_set(KVP_CFG_SEGMENT, &sg, "device_name", ","), KVP_ERR_INVALID);

    struct kvp_cfg_master m;
    kvp_cfg_defaults(KVP_CFG_MASTER, &m);
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "eviction_ratio", "0.1"), KVP_OK);
    assert_true(m.eviction_ratio > 0.0999 && m.eviction_ratio < 0.1001);
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "eviction_headroom_factor", "0"), KVP_OK);
    assert_true(m.eviction_headroom_factor == 0.0);
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "join", "yes"), KVP_OK);
    assert_true(m.join);
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "join", "off"), KVP_OK);
    assert_false(m.join);
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "default_kv_lease_ttl", "7s"), KVP_OK);
    assert_int_equal(m.default_kv_lease_ttl_ms, 7000);
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "id", "3"), KVP_OK);
    assert_int_equal(m.id, 3);
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "listen", "[fe80::1%eth0]:7101"), KVP_OK);
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "raft_address", "node-1.example:7201"), KVP_OK);

    struct kvp_cfg_segment s;
    kvp_cfg_defaults(KVP_CFG_SEGMENT, &s);
    assert_int_equal(kvp_cfg_set(KVP_CFG_SEGMENT, &s, "port", "65535"), KVP_OK);
    assert_int_equal(s.port, 65535);
    assert_int_equal(kvp_cfg_set(KVP_CFG_SEGMENT, &s, "hugepages", "false"), KVP_OK);
    assert_false(s.hugepages);
}

/* ------------------------------------------------------------------ set: every error path */

static void test_config_set_bad_values_invalid_logged_unchanged(void **state)
{
    (void)state;
    /* u32 */
    expect_bad(KVP_CFG_CLIENT, "replica_num", "0", "replica_num=0", "must be an integer in [1, 16]");
    expect_bad(KVP_CFG_CLIENT, "replica_num", "17", "replica_num=17", "[1, 16]");
    expect_bad(KVP_CFG_CLIENT, "replica_num", "-1", "replica_num=-1", "integer");
    expect_bad(KVP_CFG_CLIENT, "replica_num", "two", "replica_num=two", "integer");
    expect_bad(KVP_CFG_CLIENT, "replica_num", "", "replica_num=", "integer");
    expect_bad(KVP_CFG_CLIENT, "replica_num", "3x", "replica_num=3x", "integer");
    expect_bad(KVP_CFG_CLIENT, "conns_per_peer", "99999999999999999999999", "conns_per_peer=", "[1, 64]");
    expect_bad(KVP_CFG_CLIENT, "transfer_io_threads", "9", "transfer_io_threads=9", "[1, 8]");
    expect_bad(KVP_CFG_CLIENT, "transfer_io_threads", "0", "transfer_io_threads=0", "[1, 8]");
    expect_bad(KVP_CFG_SEGMENT, "port", "65536", "port=65536", "[0, 65535]");
    /* u64 */
    expect_bad(KVP_CFG_MASTER, "id", "0", "id=0", "integer in [1,");
    expect_bad(KVP_CFG_MASTER, "snapshot_threshold", "1e3", "snapshot_threshold=1e3", "integer");
    /* size */
    expect_bad(KVP_CFG_CLIENT, "slice_bytes", "1K", "slice_bytes=1K", "must be a size in [4KiB, 1GiB]");
    expect_bad(KVP_CFG_CLIENT, "slice_bytes", "2G", "slice_bytes=2G", "size");
    expect_bad(KVP_CFG_CLIENT, "global_segment_size", "4Q", "global_segment_size=4Q", "512MiB");
    expect_bad(KVP_CFG_SEGMENT, "global_segment_size", "0", "global_segment_size=0", "[4KiB, 64TiB]");
    expect_bad(KVP_CFG_SEGMENT, "global_segment_size", "65T", "global_segment_size=65T", "size");
    /* duration */
    expect_bad(KVP_CFG_CLIENT, "transfer_timeout", "0", "transfer_timeout=0", "duration in [1, 3600000] ms");
    expect_bad(KVP_CFG_CLIENT, "transfer_timeout", "3601", "transfer_timeout=3601", "a plain number is seconds");
    expect_bad(KVP_CFG_MASTER, "client_ttl", "0.5", "client_ttl=0.5", "a plain number is seconds");
    expect_bad(KVP_CFG_CLIENT, "transfer_timeout", "2h", "transfer_timeout=2h", "30s");
    expect_bad(KVP_CFG_CLIENT, "transfer_timeout", "3601s", "transfer_timeout=3601s", "duration");
    expect_bad(KVP_CFG_MASTER, "election_timeout_ms", "10", "election_timeout_ms=10", "[50, 600000]");
    /* double */
    expect_bad(KVP_CFG_MASTER, "eviction_ratio", "1.5", "eviction_ratio=1.5", "number in [0, 1]");
    expect_bad(KVP_CFG_MASTER, "eviction_ratio", "-0.1", "eviction_ratio=-0.1", "number");
    expect_bad(KVP_CFG_MASTER, "eviction_ratio", "nan", "eviction_ratio=nan", "number");
    expect_bad(KVP_CFG_MASTER, "eviction_ratio", "inf", "eviction_ratio=inf", "number");
    expect_bad(KVP_CFG_MASTER, "eviction_headroom_factor", "11", "eviction_headroom_factor=11", "number in [0, 10]");
    expect_bad(KVP_CFG_MASTER, "eviction_ratio", "0.5x", "eviction_ratio=0.5x", "number");
    expect_bad(KVP_CFG_MASTER, "eviction_high_watermark_ratio", "", "eviction_high_watermark_ratio=", "number");
    /* bool */
    expect_bad(KVP_CFG_MASTER, "join", "maybe", "join=maybe", "true or false");
    expect_bad(KVP_CFG_SEGMENT, "hugepages", "", "hugepages=", "true or false");
    /* string choices, length, host:port, master list */
    expect_bad(KVP_CFG_CLIENT, "protocol", "udp", "protocol=udp", "one of tcp|rdma");
    expect_bad(KVP_CFG_CLIENT, "log_level", "verbose", "log_level=verbose", "error|warn|info|debug");
    char long_name[300];
    memset(long_name, 'x', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    expect_bad(KVP_CFG_CLIENT, "local_hostname", long_name, "local_hostname=xxx", "at most 255 bytes");
    expect_bad(KVP_CFG_SEGMENT, "name", long_name, "name=xxx", "at most 127 bytes");
    expect_bad(KVP_CFG_MASTER, "listen", "localhost", "listen=localhost", "host:port");
    expect_bad(KVP_CFG_MASTER, "listen", "::1:7101", "listen=::1:7101", "[ipv6]:port");
    expect_bad(KVP_CFG_MASTER, "listen", "host:0", "listen=host:0", "1-65535");
    expect_bad(KVP_CFG_MASTER, "raft_address", "host:99999", "raft_address=host:99999", "host:port");
    expect_bad(KVP_CFG_MASTER, "raft_address", ":7201", "raft_address=:7201", "host:port");
    expect_bad(KVP_CFG_CLIENT, "master_server_address", "a:1,b", "master_server_address=a:1,b", "entry 'b'");
    expect_bad(KVP_CFG_CLIENT, "master_server_address", " , ", "master_server_address=", "no master");
    expect_bad(KVP_CFG_CLIENT, "master_server_address", "a:1,a:2,a:3,a:4,a:5,a:6,a:7,a:8,a:9,a:10",
               "master_server_address=", "more than 9 masters");
    /* unknown keys, and keys of another kind */
    expect_bad(KVP_CFG_CLIENT, "replicas", "2", "unknown key 'replicas'", "kvpool-client");
    expect_bad(KVP_CFG_CLIENT, "election_timeout_ms", "300", "unknown key 'election_timeout_ms'", NULL);
    expect_bad(KVP_CFG_MASTER, "replica_num", "2", "unknown key 'replica_num'", "kvpool-master");
    expect_bad(KVP_CFG_SEGMENT, "", "2", "unknown key ''", NULL);
    /* validated-and-ignored Mooncake keys still check their value */
    expect_bad(KVP_CFG_CLIENT, "default_kv_lease_ttl", "soon", "default_kv_lease_ttl=soon", "duration");
    expect_bad(KVP_CFG_CLIENT, "eviction_ratio", "2", "eviction_ratio=2", "number in [0, 1]");
}

static void test_config_set_null_args_invalid(void **state)
{
    (void)state;
    struct kvp_cfg_client c;
    kvp_cfg_defaults(KVP_CFG_CLIENT, &c);
    cap_start();
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, NULL, "replica_num", "2"), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, NULL, "2"), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "replica_num", NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_set((enum kvp_cfg_kind)9, &c, "replica_num", "2"), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_load_file(KVP_CFG_CLIENT, &c, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_load_file(KVP_CFG_CLIENT, NULL, "x.json"), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_load_env(KVP_CFG_CLIENT, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_from_args(KVP_CFG_CLIENT, NULL, 0, NULL, NULL, NULL, 0, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_validate(KVP_CFG_CLIENT, NULL), KVP_ERR_INVALID);
    char *log = cap_end();
    assert_non_null(strstr(log, "NULL"));
    free(log);
    assert_null(kvp_cfg_to_json(KVP_CFG_CLIENT, NULL));
    assert_int_equal(c.replica_num, 1);
}

static void test_config_ignored_mooncake_key_accepted_not_stored(void **state)
{
    (void)state;
    struct kvp_cfg_client a, b;
    kvp_cfg_defaults(KVP_CFG_CLIENT, &a);
    memcpy(&b, &a, sizeof a);
    cap_start();
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &a, "default_kv_lease_ttl", "5000"), KVP_OK);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &a, "metadata_server", "P2PHANDSHAKE"), KVP_OK);
    char *log = cap_end();
    assert_non_null(strstr(log, "metadata_server: accepted, not used here"));
    free(log);
    assert_memory_equal(&a, &b, sizeof a);
    char *js = kvp_cfg_to_json(KVP_CFG_CLIENT, &a);
    assert_null(strstr(js, "metadata_server"));
    free(js);
}

/* ------------------------------------------------------------------ files */

/* A config file as vLLM/SGLang pass it to Mooncake (MOONCAKE_CONFIG_PATH) loads as it is, with
 * Mooncake's units: transfer_timeout 30 is 30 s, sizes as "4GB" / "16 MB". */
static void test_config_mooncake_json_loads_with_mooncake_units(void **state)
{
    (void)state;
    struct kvp_cfg_client c;
    kvp_cfg_defaults(KVP_CFG_CLIENT, &c);
    const char *p = write_tmp("mooncake.json",
                              "{\"local_hostname\": \"10.0.0.5\", \"metadata_server\": \"P2PHANDSHAKE\","
                              " \"master_server_address\": \"10.0.0.1:50051,10.0.0.2:50051\","
                              " \"global_segment_size\": \"4GB\", \"local_buffer_size\": \"16 MB\","
                              " \"protocol\": \"rdma\", \"device_name\": \"mlx5_0\", \"transfer_timeout\": 30,"
                              " \"tenant_id\": \"team-a\", \"enable_ssd_offload\": false,"
                              " \"ssd_offload_path\": \"\"}");
    assert_int_equal(kvp_cfg_load_file(KVP_CFG_CLIENT, &c, p), KVP_OK);
    assert_int_equal(c.global_segment_size, 4ull << 30);
    assert_int_equal(c.local_buffer_size, 16ull << 20);
    assert_int_equal(c.transfer_timeout_ms, 30000);
    assert_string_equal(c.protocol, "rdma");
    assert_string_equal(c.tenant_id, "team-a");
    assert_int_equal(c.drain_timeout_ms, 30000); /* default */
}

static void test_config_load_file_types_applied(void **state)
{
    (void)state;
    struct kvp_cfg_client c;
    kvp_cfg_defaults(KVP_CFG_CLIENT, &c);
    const char *p = write_tmp("ok.json",
                              "{\"local_hostname\": \"10.1.2.3\", \"global_segment_size\": \"4GB\","
                              " \"local_buffer_size\": 1073741824, \"protocol\": \"tcp\","
                              " \"replica_num\": 2, \"transfer_timeout\": \"20s\","
                              " \"master_server_address\": \"127.0.0.1:50051\","
                              " \"metadata_server\": \"P2PHANDSHAKE\", \"device_name\": \"\"}");
    assert_int_equal(kvp_cfg_load_file(KVP_CFG_CLIENT, &c, p), KVP_OK);
    assert_string_equal(c.local_hostname, "10.1.2.3");
    assert_int_equal(c.global_segment_size, 4ull << 30);
    assert_int_equal(c.local_buffer_size, 1ull << 30);
    assert_int_equal(c.replica_num, 2);
    assert_int_equal(c.transfer_timeout_ms, 20000);

    struct kvp_cfg_master m;
    kvp_cfg_defaults(KVP_CFG_MASTER, &m);
    p = write_tmp("m.json", "{\"join\": true, \"eviction_ratio\": 0.25, \"eviction_high_watermark_ratio\": 1}");
    assert_int_equal(kvp_cfg_load_file(KVP_CFG_MASTER, &m, p), KVP_OK);
    assert_true(m.join);
    assert_true(m.eviction_ratio > 0.2499 && m.eviction_ratio < 0.2501);
    assert_true(m.eviction_high_watermark_ratio > 0.999);
}

static void test_config_load_file_errors_unchanged(void **state)
{
    (void)state;
    static const struct {
        const char *content;
        int rc;
        const char *needle;
    } cases[] = {
        {"{\"replica_num\": 2, \"protocol\": \"udp\"}", KVP_ERR_INVALID, "protocol=udp"},
        {"{\"replica_num\": 2, \"bogus\": 1}", KVP_ERR_INVALID, "unknown key 'bogus'"},
        {"{\"replica_num\": -2}", KVP_ERR_INVALID, "replica_num=-2"},
        {"{\"replica_num\": 2.5}", KVP_ERR_INVALID, "replica_num=2.5"},
        {"{\"replica_num\": null}", KVP_ERR_INVALID, "got null"},
        {"{\"replica_num\": [1]}", KVP_ERR_INVALID, "got an array"},
        {"{\"replica_num\": {\"a\": 1}}", KVP_ERR_INVALID, "got an object"},
        {"{\"protocol\": true}", KVP_ERR_INVALID, "protocol=true"},
        {"[1, 2]", KVP_ERR_INVALID, "top level must be a JSON object"},
        {"{\"replica_num\": 2,", KVP_ERR_INVALID, "not valid JSON"},
        {"", KVP_ERR_INVALID, "not valid JSON"},
        {"{\"replica_num\": 2, \"replica_num\": 3}", KVP_ERR_INVALID, "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct kvp_cfg_client a, b;
        kvp_cfg_defaults(KVP_CFG_CLIENT, &a);
        memcpy(&b, &a, sizeof a);
        const char *p = write_tmp("bad.json", cases[i].content);
        cap_start();
        int rc = kvp_cfg_load_file(KVP_CFG_CLIENT, &a, p);
        char *log = cap_end();
        if (rc != cases[i].rc || !strstr(log, cases[i].needle) || !strstr(log, "bad.json"))
            fail_msg("case %zu (%s): rc %d, log '%s'", i, cases[i].content, rc, log);
        assert_memory_equal(&a, &b, sizeof a); /* replica_num=2 before the bad key not applied */
        free(log);
    }
    struct kvp_cfg_client c;
    kvp_cfg_defaults(KVP_CFG_CLIENT, &c);
    cap_start();
    int rc = kvp_cfg_load_file(KVP_CFG_CLIENT, &c, "/nonexistent/kvpool.json");
    char *log = cap_end();
    assert_int_equal(rc, KVP_ERR_IO);
    assert_non_null(strstr(log, "/nonexistent/kvpool.json"));
    free(log);
    cap_start();
    rc = kvp_cfg_load_file(KVP_CFG_CLIENT, &c, tmpdir); /* a directory: opens, cannot be read */
    log = cap_end();
    assert_int_equal(rc, KVP_ERR_IO);
    assert_non_null(strstr(log, "read error"));
    free(log);
}

/* ------------------------------------------------------------------ environment */

static void test_config_load_env_applies_and_validates(void **state)
{
    (void)state;
    struct kvp_cfg_client c;
    kvp_cfg_defaults(KVP_CFG_CLIENT, &c);
    setenv("KVPOOL_REPLICA_NUM", "4", 1);
    setenv("KVPOOL_TRANSFER_TIMEOUT", "2s", 1);
    setenv("KVPOOL_ELECTION_TIMEOUT_MS", "garbage", 1); /* not a client key: ignored */
    setenv("KVPOOL_NOT_A_KEY", "x", 1);
    assert_int_equal(kvp_cfg_load_env(KVP_CFG_CLIENT, &c), KVP_OK);
    assert_int_equal(c.replica_num, 4);
    assert_int_equal(c.transfer_timeout_ms, 2000);

    struct kvp_cfg_client a, b;
    kvp_cfg_defaults(KVP_CFG_CLIENT, &a);
    memcpy(&b, &a, sizeof a);
    setenv("KVPOOL_CONNS_PER_PEER", "0", 1);
    cap_start();
    int rc = kvp_cfg_load_env(KVP_CFG_CLIENT, &a);
    char *log = cap_end();
    assert_int_equal(rc, KVP_ERR_INVALID);
    assert_non_null(strstr(log, "env KVPOOL_CONNS_PER_PEER: conns_per_peer=0: must be an integer in [1, 64]"));
    assert_memory_equal(&a, &b, sizeof a); /* KVPOOL_REPLICA_NUM=4 not applied either */
    free(log);
    clear_kvpool_env();
}

/* ------------------------------------------------------------------ layering and flags */

static void test_config_layering_defaults_file_env_flags(void **state)
{
    (void)state;
    const char *p = write_tmp("layer.json", "{\"replica_num\": 2, \"transfer_timeout\": \"20s\","
                                            " \"conns_per_peer\": 8, \"rpc_timeout_ms\": 700}");
    char path[512];
    snprintf(path, sizeof path, "%s", p);
    setenv("KVPOOL_REPLICA_NUM", "3", 1);
    setenv("KVPOOL_TRANSFER_TIMEOUT", "15", 1); /* seconds */
    setenv("KVPOOL_RPC_TIMEOUT_MS", "800", 1);
    char *argv[] = {"prog", "--config", path, "--replica-num=4", "--rpc_timeout_ms", "900", "put", "-", NULL};
    int argc = 8;
    struct kvp_cfg_client c;
    memset(&c, 0xAB, sizeof c);
    int pos[4], npos = -1;
    bool pc = true;
    assert_int_equal(kvp_cfg_from_args(KVP_CFG_CLIENT, &c, argc, argv, &pc, pos, 4, &npos), KVP_OK);
    assert_false(pc);
    assert_int_equal(c.replica_num, 4);           /* flag beats env beats file */
    assert_int_equal(c.transfer_timeout_ms, 15000); /* env beats file */
    assert_int_equal(c.rpc_timeout_ms, 900);       /* flag (space form) beats env */
    assert_int_equal(c.conns_per_peer, 8);         /* file beats default */
    assert_int_equal(c.slice_bytes, 1u << 20);     /* default */
    assert_string_equal(c.protocol, "tcp");
    assert_int_equal(npos, 2);
    assert_int_equal(pos[0], 6);
    assert_int_equal(pos[1], 7);
    clear_kvpool_env();

    /* --config=FILE and -config FILE are the same as --config FILE */
    char eqform[600];
    snprintf(eqform, sizeof eqform, "--config=%s", path);
    char *argv2[] = {"prog", eqform, NULL};
    assert_int_equal(kvp_cfg_from_args(KVP_CFG_CLIENT, &c, 2, argv2, NULL, NULL, 0, NULL), KVP_OK);
    assert_int_equal(c.replica_num, 2);
    assert_int_equal(c.transfer_timeout_ms, 20000);
    char *argv3[] = {"prog", "-config", path, NULL};
    kvp_cfg_defaults(KVP_CFG_CLIENT, &c);
    assert_int_equal(kvp_cfg_from_args(KVP_CFG_CLIENT, &c, 3, argv3, NULL, NULL, 0, NULL), KVP_OK);
    assert_int_equal(c.conns_per_peer, 8);
}

static void test_config_from_args_forms_and_print_config(void **state)
{
    (void)state;
    char *argv[] = {"kvpool-segment", "--print-config", "--no-hugepages", "--port", "7300", "-name=seg-a",
                    "--global_segment_size", "64M", "--", "--port=1", NULL};
    struct kvp_cfg_segment s;
    int pos[2], npos = 0;
    bool pc = false;
    assert_int_equal(kvp_cfg_from_args(KVP_CFG_SEGMENT, &s, 10, argv, &pc, pos, 2, &npos), KVP_OK);
    assert_true(pc);
    assert_false(s.hugepages);
    assert_int_equal(s.port, 7300);
    assert_string_equal(s.name, "seg-a");
    assert_int_equal(s.global_segment_size, 64u << 20);
    assert_int_equal(npos, 1);
    assert_int_equal(pos[0], 9); /* after "--": positional */

    char *argv2[] = {"m", "--join", "--id", "2", "--join", "false", NULL};
    struct kvp_cfg_master m;
    assert_int_equal(kvp_cfg_from_args(KVP_CFG_MASTER, &m, 6, argv2, NULL, NULL, 0, NULL), KVP_OK);
    assert_false(m.join);
    assert_int_equal(m.id, 2);
    char *argv3[] = {"m", "--join", "--id=5", NULL};
    assert_int_equal(kvp_cfg_from_args(KVP_CFG_MASTER, &m, 3, argv3, NULL, NULL, 0, NULL), KVP_OK);
    assert_true(m.join);
    assert_int_equal(m.id, 5);
}

static void test_config_from_args_extra_flags_left_to_caller(void **state)
{
    (void)state;
    char *argv[] = {"kvpoolctl", "get", "k1", "-o", "out.bin", "--force", "--masters=a:1", "--replica-num", "2", NULL};
    const char *const extra[] = {"o=", "force", "masters=", NULL};
    struct kvp_cfg_client c;
    int pos[8], npos = 0;
    assert_int_equal(kvp_cfg_from_args_ex(KVP_CFG_CLIENT, &c, 9, argv, extra, NULL, pos, 8, &npos), KVP_OK);
    assert_int_equal(npos, 6);
    int want[] = {1, 2, 3, 4, 5, 6};
    assert_memory_equal(pos, want, sizeof want);
    assert_int_equal(c.replica_num, 2);
}

static void test_config_from_args_errors_unchanged(void **state)
{
    (void)state;
    const char *good = write_tmp("good.json", "{\"replica_num\": 2}");
    char gpath[512];
    snprintf(gpath, sizeof gpath, "%s", good);
    struct {
        char *argv[6];
        int argc;
        int rc;
        const char *needle;
    } cases[] = {
        {{"p", "--bogus=1"}, 2, KVP_ERR_INVALID, "unknown flag '--bogus=1' for kvpool-client"},
        {{"p", "-x"}, 2, KVP_ERR_INVALID, "unknown flag '-x'"},
        {{"p", "--replica-num"}, 2, KVP_ERR_INVALID, "flag --replica-num: needs a value"},
        {{"p", "--replica-num", "0"}, 3, KVP_ERR_INVALID, "flag --replica-num: replica_num=0"},
        {{"p", "--config"}, 2, KVP_ERR_INVALID, "--config: needs a file name"},
        {{"p", "--config=/nonexistent/x.json"}, 2, KVP_ERR_IO, "/nonexistent/x.json"},
        {{"p", "--config", gpath, "a", "b"}, 5, KVP_ERR_INVALID, "unexpected argument 'b'"},
        {{"p", "--print-config=yes"}, 2, KVP_ERR_INVALID, "unknown flag"},
        {{"p", "--no-replica-num"}, 2, KVP_ERR_INVALID, "unknown flag"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct kvp_cfg_client a, b;
        kvp_cfg_defaults(KVP_CFG_CLIENT, &a);
        a.replica_num = 9;
        memcpy(&b, &a, sizeof a);
        int pos[1], npos = 0;
        cap_start();
        int rc = kvp_cfg_from_args(KVP_CFG_CLIENT, &a, cases[i].argc, cases[i].argv, NULL, pos, 1, &npos);
        char *log = cap_end();
        if (rc != cases[i].rc || !strstr(log, cases[i].needle))
            fail_msg("case %zu: rc %d, log '%s', want '%s'", i, rc, log, cases[i].needle);
        assert_memory_equal(&a, &b, sizeof a);
        free(log);
    }
    /* a bad environment value fails the whole layering too */
    setenv("KVPOOL_PROTOCOL", "carrier-pigeon", 1);
    char *argv[] = {"p", NULL};
    struct kvp_cfg_client c;
    cap_start();
    int rc = kvp_cfg_from_args(KVP_CFG_CLIENT, &c, 1, argv, NULL, NULL, 0, NULL);
    char *log = cap_end();
    assert_int_equal(rc, KVP_ERR_INVALID);
    assert_non_null(strstr(log, "env KVPOOL_PROTOCOL: protocol=carrier-pigeon: must be one of tcp|rdma"));
    free(log);
    clear_kvpool_env();
}

static void test_config_validate_heartbeat_below_election(void **state)
{
    (void)state;
    char *argv[] = {"m", "--election-timeout-ms", "100", "--raft-heartbeat-ms", "100", NULL};
    struct kvp_cfg_master m;
    cap_start();
    int rc = kvp_cfg_from_args(KVP_CFG_MASTER, &m, 5, argv, NULL, NULL, 0, NULL);
    char *log = cap_end();
    assert_int_equal(rc, KVP_ERR_INVALID);
    assert_non_null(strstr(log, "raft_heartbeat_ms=100: must be below election_timeout_ms=100"));
    free(log);
    argv[4] = "99";
    assert_int_equal(kvp_cfg_from_args(KVP_CFG_MASTER, &m, 5, argv, NULL, NULL, 0, NULL), KVP_OK);
}

/* ------------------------------------------------------------------ print-config JSON */

static void test_config_to_json_typed_and_round_trips(void **state)
{
    (void)state;
    for (int kind = KVP_CFG_MASTER; kind <= KVP_CFG_CLIENT; kind++) {
        const struct kvp_cfg_table *t = kvp_cfg_table((enum kvp_cfg_kind)kind);
        char a[8192], b[8192];
        kvp_cfg_defaults((enum kvp_cfg_kind)kind, a);
        if (kind == KVP_CFG_CLIENT) {
            assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, a, "master_server_address", "h:1,[::1]:2"), KVP_OK);
            assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, a, "global_segment_size", "3G"), KVP_OK);
        }
        char *js = kvp_cfg_to_json((enum kvp_cfg_kind)kind, a);
        assert_non_null(js);
        if (kind == KVP_CFG_MASTER) /* readable doubles, one key per line */
            assert_non_null(strstr(js, "\n  \"eviction_ratio\": 0.05,\n"));
        json_error_t err;
        json_t *o = json_loads(js, 0, &err);
        assert_non_null(o);
        size_t stored = 0;
        for (size_t i = 0; i < t->n_keys; i++) {
            const struct kvp_cfg_key *k = &t->keys[i];
            json_t *v = json_object_get(o, k->name);
            if (k->offset == KVP_CFG_NO_FIELD || k->alias_of) { /* aliases print as their key */
                assert_null(v);
                continue;
            }
            stored++;
            assert_non_null(v);
            switch (k->type) {
            case KVP_CFG_T_STRING: assert_true(json_is_string(v)); break;
            case KVP_CFG_T_BOOL: assert_true(json_is_boolean(v)); break;
            case KVP_CFG_T_DOUBLE: assert_true(json_is_real(v)); break;
            case KVP_CFG_T_DURATION_S: assert_true(json_is_string(v)); break; /* "10000ms" */
            default: assert_true(json_is_integer(v)); break;
            }
        }
        assert_int_equal(json_object_size(o), stored);
        if (kind == KVP_CFG_CLIENT) {
            assert_int_equal(json_integer_value(json_object_get(o, "global_segment_size")), 3ll << 30);
            assert_int_equal(json_integer_value(json_object_get(o, "transfer_timeout_ms")), 10000);
            assert_string_equal(json_string_value(json_object_get(o, "master_server_address")), "h:1,[::1]:2");
        }
        json_decref(o);
        /* load it back into a struct that starts elsewhere: same bytes */
        const char *p = write_tmp("rt.json", js);
        memset(b, 0, sizeof b);
        kvp_cfg_defaults((enum kvp_cfg_kind)kind, b);
        if (kind == KVP_CFG_CLIENT)
            assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, b, "replica_num", "7"), KVP_OK);
        assert_int_equal(kvp_cfg_load_file((enum kvp_cfg_kind)kind, b, p), KVP_OK);
        assert_memory_equal(a, b, t->struct_size);
        free(js);
    }
}

static void test_config_help_lists_every_key(void **state)
{
    (void)state;
    for (int kind = KVP_CFG_MASTER; kind <= KVP_CFG_CLIENT; kind++) {
        const struct kvp_cfg_table *t = kvp_cfg_table((enum kvp_cfg_kind)kind);
        char *h = kvp_cfg_help((enum kvp_cfg_kind)kind);
        assert_non_null(h);
        for (size_t i = 0; i < t->n_keys; i++)
            if (t->keys[i].offset != KVP_CFG_NO_FIELD && !strstr(h, t->keys[i].name))
                fail_msg("help lacks %s", t->keys[i].name);
        assert_non_null(strstr(h, "print-config"));
        free(h);
    }
    assert_null(kvp_cfg_help((enum kvp_cfg_kind)5));
}

/* ------------------------------------------------------------------ one rule for units (issue 24) */

/* Set key=value on a fresh default struct: rc, and the log it wrote (caller frees). */
static int set_logged(enum kvp_cfg_kind kind, void *cfg, const char *key, const char *value, char **log)
{
    cap_start();
    int rc = kvp_cfg_set(kind, cfg, key, value);
    *log = cap_end();
    return rc;
}

/* The rule, checked on the tables themselves: every duration or size key either has Mooncake's
 * name (then Mooncake's unit), or carries its unit in its name; a seconds key is always one of
 * Mooncake's. A new key without its unit fails here. */
static void test_config_units_every_own_key_names_its_unit(void **state)
{
    (void)state;
    static const char *const mooncake_names[] = {"default_kv_lease_ttl", "client_ttl", "transfer_timeout",
                                                 "global_segment_size", "local_buffer_size", NULL};
    for (int kind = KVP_CFG_MASTER; kind <= KVP_CFG_CLIENT; kind++) {
        const struct kvp_cfg_table *t = kvp_cfg_table((enum kvp_cfg_kind)kind);
        for (size_t i = 0; i < t->n_keys; i++) {
            const struct kvp_cfg_key *k = &t->keys[i];
            if (k->type != KVP_CFG_T_DURATION_MS && k->type != KVP_CFG_T_DURATION_S && k->type != KVP_CFG_T_SIZE)
                continue;
            bool mooncake = false;
            for (size_t j = 0; mooncake_names[j]; j++)
                mooncake |= strcmp(k->name, mooncake_names[j]) == 0;
            if (k->deprecated) { /* an old spelling: its new name carries the unit */
                assert_non_null(k->alias_of);
                assert_non_null(strstr(k->alias_of, "_ms"));
                continue;
            }
            if (k->type == KVP_CFG_T_DURATION_S && !mooncake)
                fail_msg("%s: a plain number is seconds but it is not Mooncake's key", k->name);
            size_t n = strlen(k->name);
            bool named = (k->type == KVP_CFG_T_DURATION_MS && n > 3 && strcmp(k->name + n - 3, "_ms") == 0) ||
                         (k->type == KVP_CFG_T_SIZE && strstr(k->name, "_bytes"));
            if (!mooncake && !named)
                fail_msg("kvpool-%s key %s: a kvpool key of its own must carry its unit in its name",
                         t->kind_name, k->name);
        }
    }
}

/* Every key that changed name or unit: Mooncake's spelling takes Mooncake's unit, kvpool's own
 * spelling takes the unit in its name, the old spelling still works with one WARN naming the new. */
static void test_config_units_renamed_keys_and_aliases(void **state)
{
    (void)state;
    char *log;
    struct kvp_cfg_master m;
    kvp_cfg_defaults(KVP_CFG_MASTER, &m);
    /* client_ttl (Mooncake, seconds) and client_ttl_ms (kvpool, ms) write one field */
    assert_int_equal(set_logged(KVP_CFG_MASTER, &m, "client_ttl", "10", &log), KVP_OK);
    assert_int_equal(m.client_ttl_ms, 10000);
    assert_string_equal(log, "");
    free(log);
    assert_int_equal(set_logged(KVP_CFG_MASTER, &m, "client_ttl_ms", "2500", &log), KVP_OK);
    assert_int_equal(m.client_ttl_ms, 2500);
    assert_string_equal(log, "");
    free(log);
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "client_ttl_ms", "3s"), KVP_OK);
    assert_int_equal(m.client_ttl_ms, 3000);
    expect_bad(KVP_CFG_MASTER, "client_ttl_ms", "10", "client_ttl_ms=10", "[100, 86400000] ms");
    expect_bad(KVP_CFG_MASTER, "client_ttl", "86401", "client_ttl=86401", "a plain number is seconds");
    /* default_kv_lease_ttl keeps Mooncake's unit, milliseconds */
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "default_kv_lease_ttl", "5000"), KVP_OK);
    assert_int_equal(m.default_kv_lease_ttl_ms, 5000);
    /* put_ttl_ms: the new name, silent; put_ttl: the old one, same unit (ms), one WARN */
    assert_int_equal(set_logged(KVP_CFG_MASTER, &m, "put_ttl_ms", "20000", &log), KVP_OK);
    assert_int_equal(m.put_ttl_ms, 20000);
    assert_string_equal(log, "");
    free(log);
    assert_int_equal(set_logged(KVP_CFG_MASTER, &m, "put_ttl", "25000", &log), KVP_OK);
    assert_int_equal(m.put_ttl_ms, 25000);
    assert_non_null(strstr(log, "WARN"));
    assert_non_null(strstr(log, "put_ttl is deprecated: use put_ttl_ms"));
    char *second = strstr(log, "deprecated");
    assert_null(strstr(second + 1, "deprecated")); /* one line */
    free(log);
    expect_bad(KVP_CFG_MASTER, "put_ttl", "50", "put_ttl=50", "[100, 86400000] ms");
    /* the old spelling in a file, the environment and a flag, naming where it came from */
    const char *p = write_tmp("old.json", "{\"put_ttl\": 40000}");
    cap_start();
    assert_int_equal(kvp_cfg_load_file(KVP_CFG_MASTER, &m, p), KVP_OK);
    log = cap_end();
    assert_int_equal(m.put_ttl_ms, 40000);
    assert_non_null(strstr(log, "old.json: put_ttl is deprecated: use put_ttl_ms"));
    free(log);
    setenv("KVPOOL_PUT_TTL", "41000", 1);
    char *argv[] = {"m", "--put-ttl", "42000", NULL};
    cap_start();
    assert_int_equal(kvp_cfg_from_args(KVP_CFG_MASTER, &m, 3, argv, NULL, NULL, 0, NULL), KVP_OK);
    log = cap_end();
    assert_int_equal(m.put_ttl_ms, 42000); /* the flag wins */
    assert_non_null(strstr(log, "env KVPOOL_PUT_TTL: put_ttl is deprecated: use put_ttl_ms"));
    assert_non_null(strstr(log, "flag --put-ttl: put_ttl is deprecated: use put_ttl_ms"));
    free(log);
    clear_kvpool_env();
    /* print-config writes kvpool's own spellings, which load back as they are */
    char *js = kvp_cfg_to_json(KVP_CFG_MASTER, &m);
    assert_non_null(strstr(js, "\"client_ttl_ms\": 10000")); /* from_args started from the defaults */
    assert_non_null(strstr(js, "\"put_ttl_ms\": 42000"));
    assert_null(strstr(js, "\"client_ttl\""));
    assert_null(strstr(js, "\"put_ttl\""));
    free(js);

    struct kvp_cfg_client c;
    kvp_cfg_defaults(KVP_CFG_CLIENT, &c);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "transfer_timeout", "30"), KVP_OK);
    assert_int_equal(c.transfer_timeout_ms, 30000);
    assert_int_equal(kvp_cfg_set(KVP_CFG_CLIENT, &c, "transfer_timeout_ms", "30"), KVP_OK);
    assert_int_equal(c.transfer_timeout_ms, 30);
    setenv("KVPOOL_TRANSFER_TIMEOUT_MS", "750", 1);
    assert_int_equal(kvp_cfg_load_env(KVP_CFG_CLIENT, &c), KVP_OK);
    assert_int_equal(c.transfer_timeout_ms, 750);
    clear_kvpool_env();
    expect_bad(KVP_CFG_CLIENT, "transfer_timeout_ms", "3600001", "transfer_timeout_ms=3600001", "[1, 3600000] ms");

    /* the help lists the other spellings apart, the deprecated one marked */
    char *h = kvp_cfg_help(KVP_CFG_MASTER);
    assert_non_null(strstr(h, "--put_ttl_ms"));
    assert_non_null(strstr(h, "old spelling of put_ttl_ms (deprecated)"));
    assert_non_null(strstr(h, "--client_ttl "));
    assert_non_null(strstr(h, "--rpc_port"));
    free(h);
}

/* mooncake_master's command line (../shared/clients/mooncake-python.md, last section) as it is:
 * rpc_address:rpc_port become listen, the units are Mooncake's, the flags kvpool does not need
 * are accepted with a line saying so. */
static void test_config_master_mooncake_flags_accepted(void **state)
{
    (void)state;
    char *argv[] = {"kvpool-master", "--rpc_port", "50051", "--rpc_address", "10.1.2.3",
                    "--default_kv_lease_ttl", "5000", "--client_ttl", "10", "--eviction_ratio", "0.05",
                    "--eviction_high_watermark_ratio", "0.95", "--metrics_port", "9003", "--rpc_thread_num", "8",
                    "--enable_http_metadata_server=true", "--http_metadata_server_host", "0.0.0.0",
                    "--http_metadata_server_port", "8080", NULL};
    int argc = (int)(sizeof argv / sizeof argv[0]) - 1;
    struct kvp_cfg_master m;
    cap_start();
    int rc = kvp_cfg_from_args(KVP_CFG_MASTER, &m, argc, argv, NULL, NULL, 0, NULL);
    char *log = cap_end();
    if (rc != KVP_OK)
        fail_msg("rc %d: %s", rc, log);
    assert_string_equal(m.listen, "10.1.2.3:50051");
    assert_int_equal(m.default_kv_lease_ttl_ms, 5000);
    assert_int_equal(m.client_ttl_ms, 10000);
    assert_true(m.eviction_ratio > 0.0499 && m.eviction_ratio < 0.0501);
    assert_true(m.eviction_high_watermark_ratio > 0.9499 && m.eviction_high_watermark_ratio < 0.9501);
    assert_int_equal(m.metrics_port, 9003);
    assert_non_null(strstr(log, "flag --rpc_thread_num: rpc_thread_num: accepted, not used here"));
    assert_non_null(strstr(log, "flag --enable_http_metadata_server: enable_http_metadata_server: accepted, not "
                                "used here: Mooncake's HTTP metadata server: not needed"));
    assert_non_null(strstr(log, "http_metadata_server_host: accepted, not used here"));
    assert_non_null(strstr(log, "http_metadata_server_port: accepted, not used here"));
    free(log);
    char *js = kvp_cfg_to_json(KVP_CFG_MASTER, &m);
    assert_null(strstr(js, "rpc_port"));
    assert_null(strstr(js, "http_metadata"));
    assert_non_null(strstr(js, "\"listen\": \"10.1.2.3:50051\""));
    free(js);

    /* the space form of a bool and gflags' single dash */
    char *argv2[] = {"m", "-rpc_port=7400", "--enable_http_metadata_server", "false", NULL};
    assert_int_equal(kvp_cfg_from_args(KVP_CFG_MASTER, &m, 4, argv2, NULL, NULL, 0, NULL), KVP_OK);
    assert_string_equal(m.listen, "127.0.0.1:7400");

    /* later wins between listen and its parts; an IPv6 rpc_address gets its brackets */
    kvp_cfg_defaults(KVP_CFG_MASTER, &m);
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "listen", "a.example:1"), KVP_OK);
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "rpc_port", "2"), KVP_OK);
    assert_string_equal(m.listen, "a.example:2");
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "rpc_address", "::1"), KVP_OK);
    assert_string_equal(m.listen, "[::1]:2");
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "rpc_port", "3"), KVP_OK);
    assert_string_equal(m.listen, "[::1]:3");
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "rpc_address", "[fe80::1%eth0]"), KVP_OK);
    assert_string_equal(m.listen, "[fe80::1%eth0]:3");
    assert_int_equal(kvp_cfg_set(KVP_CFG_MASTER, &m, "listen", "b:4"), KVP_OK);
    assert_string_equal(m.listen, "b:4");

    /* bad values: an error naming the flag, the struct unchanged */
    expect_bad(KVP_CFG_MASTER, "rpc_port", "0", "rpc_port=0", "must be a port in [1, 65535] (it sets the port of listen)");
    expect_bad(KVP_CFG_MASTER, "rpc_port", "65536", "rpc_port=65536", "port in [1, 65535]");
    expect_bad(KVP_CFG_MASTER, "rpc_port", "http", "rpc_port=http", "port");
    expect_bad(KVP_CFG_MASTER, "rpc_address", "", "rpc_address=", "must be a host name or IP address");
    expect_bad(KVP_CFG_MASTER, "rpc_address", "a b", "rpc_address=a b", "host of listen");
    expect_bad(KVP_CFG_MASTER, "rpc_address", "h:1", "rpc_address=h:1", "host name or IP address");
    expect_bad(KVP_CFG_MASTER, "rpc_thread_num", "many", "rpc_thread_num=many", "integer");
    expect_bad(KVP_CFG_MASTER, "enable_http_metadata_server", "maybe", "enable_http_metadata_server=maybe",
               "true or false");
    expect_bad(KVP_CFG_MASTER, "http_metadata_server_port", "70000", "http_metadata_server_port=70000", "[0, 65535]");
    char *argv3[] = {"m", "--rpc_port", "99999", NULL};
    struct kvp_cfg_master a, b;
    kvp_cfg_defaults(KVP_CFG_MASTER, &a);
    memcpy(&b, &a, sizeof a);
    cap_start();
    rc = kvp_cfg_from_args(KVP_CFG_MASTER, &a, 3, argv3, NULL, NULL, 0, NULL);
    log = cap_end();
    assert_int_equal(rc, KVP_ERR_INVALID);
    assert_non_null(strstr(log, "flag --rpc_port: rpc_port=99999: must be a port"));
    assert_memory_equal(&a, &b, sizeof a);
    free(log);
}

/* The text of the fenced block (```lang) that follows `after` in docs/migrating-from-mooncake.md
 * (malloc'd), so that the page's examples are the ones tested. */
static char *doc_block(const char *after, const char *lang)
{
    const char *src = getenv("KVP_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/migrating-from-mooncake.md", src ? src : "..");
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("cannot open %s (KVP_SOURCE_DIR)", path);
    static char doc[65536];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    doc[n] = '\0';
    fclose(f);
    const char *a = strstr(doc, after);
    assert_non_null(a);
    char fence[32];
    snprintf(fence, sizeof fence, "```%s\n", lang);
    const char *b = strstr(a, fence);
    assert_non_null(b);
    b += strlen(fence);
    const char *e = strstr(b, "```");
    assert_non_null(e);
    char *out = strndup(b, (size_t)(e - b));
    assert_non_null(out);
    return out;
}

/* docs/migrating-from-mooncake.md: its kvpool-master line and its Mooncake client JSON mean
 * what the page says they mean. */
static void test_config_migration_doc_examples_load(void **state)
{
    (void)state;
    char *js = doc_block("## The client config", "json");
    const char *p = write_tmp("doc-client.json", js);
    free(js);
    struct kvp_cfg_client c;
    kvp_cfg_defaults(KVP_CFG_CLIENT, &c);
    assert_int_equal(kvp_cfg_load_file(KVP_CFG_CLIENT, &c, p), KVP_OK);
    assert_string_equal(c.local_hostname, "10.0.0.5");
    assert_string_equal(c.master_server_address, "10.0.0.1:50051,10.0.0.2:50051");
    assert_int_equal(c.global_segment_size, 4ull << 30);
    assert_int_equal(c.local_buffer_size, 16ull << 20);
    assert_string_equal(c.protocol, "rdma");
    assert_string_equal(c.device_name, "mlx5_0");
    assert_int_equal(c.transfer_timeout_ms, 30000);

    /* the kvpool-master line, split into words as a shell would (no quoting in it) */
    char *sh = doc_block("with the program name changed", "sh");
    char *argv[64];
    int argc = 0;
    for (char *save = NULL, *w = strtok_r(sh, " \\\n", &save); w && argc < 63; w = strtok_r(NULL, " \\\n", &save))
        argv[argc++] = w;
    argv[argc] = NULL;
    assert_string_equal(argv[0], "kvpool-master");
    struct kvp_cfg_master m;
    assert_int_equal(kvp_cfg_from_args(KVP_CFG_MASTER, &m, argc, argv, NULL, NULL, 0, NULL), KVP_OK);
    assert_string_equal(m.listen, "10.0.0.1:50051");
    assert_string_equal(m.raft_address, "10.0.0.1:7201");
    assert_int_equal(m.client_ttl_ms, 10000);
    assert_int_equal(m.default_kv_lease_ttl_ms, 5000);
    assert_int_equal(m.metrics_port, 9003);
    free(sh);
}

/* ------------------------------------------------------------------ master lists */

static void test_config_masters_forms_normalised(void **state)
{
    (void)state;
    char *out[KVP_CFG_MAX_MASTERS];
    size_t n = 0;
    assert_int_equal(kvp_cfg_masters(" tcp://10.0.0.1:7101 ,[::1]:7102,,host-c:7103, TCP://[fe80::1%eth0]:7104,",
                                     NULL, out, KVP_CFG_MAX_MASTERS, &n),
                     KVP_OK);
    assert_int_equal(n, 4);
    assert_string_equal(out[0], "10.0.0.1:7101");
    assert_string_equal(out[1], "[::1]:7102");
    assert_string_equal(out[2], "host-c:7103");
    assert_string_equal(out[3], "[fe80::1%eth0]:7104");
    kvp_cfg_free_masters(out, n);
    /* master_server_address wins over cluster_file */
    assert_int_equal(kvp_cfg_masters("a:1", "/nonexistent", out, 2, &n), KVP_OK);
    assert_int_equal(n, 1);
    kvp_cfg_free_masters(out, n);
    kvp_cfg_free_masters(NULL, 3);
}

static void test_config_masters_errors_invalid(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        const char *needle;
    } bad[] = {
        {"host", "entry 'host'"},        {"::1:7101", "entry '::1:7101'"}, {"h:0", "entry 'h:0'"},
        {"h:65536", "entry 'h:65536'"},  {"h:12a", "entry 'h:12a'"},       {"[::1]7101", "entry"},
        {"[::1:7101", "entry"},          {"tcp://", "no master"},           {",,", "no master"},
        {"a b:1", "entry 'a b:1'"},      {"a:1,b:2,c:3", "more than 2 masters"},
        {"udp://h:1", "entry 'udp://h:1'"}, {"[]:1", "entry"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out[2] = {NULL, NULL};
        size_t n = 99;
        cap_start();
        int rc = kvp_cfg_masters(bad[i].s, NULL, out, 2, &n);
        char *log = cap_end();
        if (rc != KVP_ERR_INVALID || n != 0 || !strstr(log, bad[i].needle))
            fail_msg("'%s': rc %d n %zu log '%s'", bad[i].s, rc, n, log);
        free(log);
    }
    char *out[2];
    size_t n;
    cap_start();
    assert_int_equal(kvp_cfg_masters(NULL, NULL, out, 2, &n), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_masters("", "", out, 2, &n), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_masters("a:1", NULL, NULL, 2, &n), KVP_ERR_INVALID);
    assert_int_equal(kvp_cfg_masters("a:1", NULL, out, 2, NULL), KVP_ERR_INVALID);
    char *log = cap_end();
    assert_non_null(strstr(log, "set master_server_address"));
    free(log);
}

static void test_config_masters_cluster_file(void **state)
{
    (void)state;
    char *out[KVP_CFG_MAX_MASTERS];
    size_t n = 0;
    const char *p = write_tmp("cluster.json",
                              "{\"master_server_address\": \"127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103\","
                              " \"masters\": [{\"id\": 1, \"address\": \"127.0.0.1:9999\"}], \"segments\": []}");
    assert_int_equal(kvp_cfg_masters("", p, out, KVP_CFG_MAX_MASTERS, &n), KVP_OK);
    assert_int_equal(n, 3);
    assert_string_equal(out[2], "127.0.0.1:7103");
    kvp_cfg_free_masters(out, n);

    p = write_tmp("cluster2.json", "{\"masters\": [{\"address\": \"h1:1\"}, {\"address\": \"h2:2\"}]}");
    assert_int_equal(kvp_cfg_masters(NULL, p, out, KVP_CFG_MAX_MASTERS, &n), KVP_OK);
    assert_int_equal(n, 2);
    assert_string_equal(out[1], "h2:2");
    kvp_cfg_free_masters(out, n);

    static const struct {
        const char *content;
        int rc;
        const char *needle;
    } bad[] = {
        {"{\"segments\": []}", KVP_ERR_INVALID, "has no \"master_server_address\""},
        {"{\"master_server_address\": 7101}", KVP_ERR_INVALID, "has no"},
        {"{\"master_server_address\": \"nope\"}", KVP_ERR_INVALID, "entry 'nope'"},
        {"{\"masters\": [{\"address\": \"x\"}]}", KVP_ERR_INVALID, "masters[].address"},
        {"not json", KVP_ERR_INVALID, "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = write_tmp("cbad.json", bad[i].content);
        cap_start();
        int rc = kvp_cfg_masters(NULL, p, out, KVP_CFG_MAX_MASTERS, &n);
        char *log = cap_end();
        if (rc != bad[i].rc || !strstr(log, bad[i].needle) || !strstr(log, "cbad.json"))
            fail_msg("case %zu: rc %d log '%s'", i, rc, log);
        free(log);
    }
    cap_start();
    assert_int_equal(kvp_cfg_masters(NULL, "/nonexistent/cluster.json", out, 2, &n), KVP_ERR_IO);
    free(cap_end());
}

/* ------------------------------------------------------------------ public API */

static void test_config_api_wraps_client_table(void **state)
{
    (void)state;
    cap_start();
    assert_int_equal(kvp_config_new(NULL), KVP_ERR_INVALID);
    kvp_config *cfg = NULL;
    assert_int_equal(kvp_config_new(&cfg), KVP_OK);
    assert_non_null(cfg);
    assert_int_equal(cfg->c.replica_num, 1);
    assert_int_equal(kvp_config_set(NULL, "replica_num", "2"), KVP_ERR_INVALID);
    assert_int_equal(kvp_config_set(cfg, NULL, "2"), KVP_ERR_INVALID);
    assert_int_equal(kvp_config_set(cfg, "replica_num", NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_config_load_file(NULL, "x"), KVP_ERR_INVALID);
    assert_int_equal(kvp_config_load_file(cfg, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_config_load_env(NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_config_set(cfg, "election_timeout_ms", "300"), KVP_ERR_INVALID); /* master key */
    assert_int_equal(kvp_config_set(cfg, "replica_num", "0"), KVP_ERR_INVALID);
    assert_int_equal(kvp_config_load_file(cfg, "/nonexistent.json"), KVP_ERR_IO);
    char *log = cap_end();
    assert_non_null(strstr(log, "replica_num=0"));
    free(log);
    assert_int_equal(cfg->c.replica_num, 1);
    assert_int_equal(kvp_config_set(cfg, "replica_num", "2"), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "global_segment_size", "512MiB"), KVP_OK);
    assert_int_equal(cfg->c.replica_num, 2);
    assert_int_equal(cfg->c.global_segment_size, 512u << 20);
    const char *p = write_tmp("api.json", "{\"master_server_address\": \"127.0.0.1:7101\", \"protocol\": \"tcp\"}");
    assert_int_equal(kvp_config_load_file(cfg, p), KVP_OK);
    assert_string_equal(cfg->c.master_server_address, "127.0.0.1:7101");
    setenv("KVPOOL_REPLICA_NUM", "3", 1);
    assert_int_equal(kvp_config_load_env(cfg), KVP_OK);
    assert_int_equal(cfg->c.replica_num, 3);
    clear_kvpool_env();
    char *js = kvp_config_to_json(cfg);
    assert_non_null(strstr(js, "\"replica_num\": 3"));
    free(js);
    assert_null(kvp_config_to_json(NULL));
    kvp_config_destroy(&cfg);
    assert_null(cfg);
    kvp_config_destroy(&cfg);
    kvp_config_destroy(NULL);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvp-test-config-XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_defaults_documented_values),
        cmocka_unit_test(test_config_defaults_all_parse_without_log),
        cmocka_unit_test(test_config_parse_size_suffixes_binary),
        cmocka_unit_test(test_config_parse_duration_ms_and_s),
        cmocka_unit_test(test_config_set_every_type_stored),
        cmocka_unit_test(test_config_set_bad_values_invalid_logged_unchanged),
        cmocka_unit_test(test_config_set_null_args_invalid),
        cmocka_unit_test(test_config_ignored_mooncake_key_accepted_not_stored),
        cmocka_unit_test(test_config_mooncake_json_loads_with_mooncake_units),
        cmocka_unit_test(test_config_load_file_types_applied),
        cmocka_unit_test(test_config_load_file_errors_unchanged),
        cmocka_unit_test(test_config_load_env_applies_and_validates),
        cmocka_unit_test(test_config_layering_defaults_file_env_flags),
        cmocka_unit_test(test_config_from_args_forms_and_print_config),
        cmocka_unit_test(test_config_from_args_extra_flags_left_to_caller),
        cmocka_unit_test(test_config_from_args_errors_unchanged),
        cmocka_unit_test(test_config_validate_heartbeat_below_election),
        cmocka_unit_test(test_config_to_json_typed_and_round_trips),
        cmocka_unit_test(test_config_help_lists_every_key),
        cmocka_unit_test(test_config_units_every_own_key_names_its_unit),
        cmocka_unit_test(test_config_units_renamed_keys_and_aliases),
        cmocka_unit_test(test_config_master_mooncake_flags_accepted),
        cmocka_unit_test(test_config_migration_doc_examples_load),
        cmocka_unit_test(test_config_masters_forms_normalised),
        cmocka_unit_test(test_config_masters_errors_invalid),
        cmocka_unit_test(test_config_masters_cluster_file),
        cmocka_unit_test(test_config_api_wraps_client_table),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        rc = rc ? rc : 1;
    return rc;
}
