/*
 * test_auth_cluster.c — issue 25 on real processes (`kvpoolctl cluster up`, 1 master, 2
 * segments, authentication on as by default): the control port refuses a peer without keys,
 * with a key not in the allowed-keys directory, and garbage before the handshake; the Raft port
 * drops garbage and a master refuses to bind Raft to a non-loopback address; authorised
 * clients keep working meanwhile. Two tenants: no cross-tenant read, exists, size, remove or
 * batch; a role may not ask what it is not allowed; a tenant_id that disagrees with the key is
 * refused; a tenant over its quota evicts its own objects only, and gets NO_SPACE when they
 * cannot make room. docs/security.md.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <czmq.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "actors/session/dtoken.h"
#include "actors/segment/seg_server.h"
#include "actors/session/msession.h"
#include "actors/transfer/transfer.h"
#include "auth/auth.h"
#include "auth/auth_token.h"
#include "config/config.h"
#include "runtime/clock.h"
#include "tests/integration/test_client_util.h"
#include "tests/lib/cluster_guard.h"
#include "tests/lib/http_get.h"
#include "tests/lib/proc_reap.h"
#include "wire/envelope.h"

static struct {
    struct tc_cluster cl;
    char master[64];      /* control host:port */
    char raft[64];        /* Raft host:port */
    char log[600];        /* master-1.log */
    char keys[400];       /* DIR/keys */
    char master_keys[500];
    char allowed[500];
} A;

static bool log_has(const char *needle, uint64_t wait_ms)
{
    uint64_t end = kvp_clock_now_ms() + wait_ms;
    do {
        FILE *f = fopen(A.log, "r");
        char line[2048];
        bool found = false;
        while (f && fgets(line, sizeof line, f))
            if (strstr(line, needle))
                found = true;
        if (f)
            fclose(f);
        if (found)
            return true;
        kvp_clock_sleep_ms(50);
    } while (kvp_clock_now_ms() < end);
    return false;
}

static int group_setup(void **state)
{
    memset(&A, 0, sizeof A);
    struct tc_cluster *c = &A.cl;
    const char *bd = getenv("KVP_BUILD_DIR");
    snprintf(c->ctl, sizeof c->ctl, "%s/tools/kvpoolctl", bd ? bd : ".");
    snprintf(c->dir, sizeof c->dir, "/tmp/kvp-auth-test-XXXXXX");
    if (!mkdtemp(c->dir))
        return -1;
    snprintf(c->file, sizeof c->file, "%s/cluster.json", c->dir);
    char cfgpath[400];
    snprintf(cfgpath, sizeof cfgpath, "%s/test-config.json", c->dir);
    FILE *f = fopen(cfgpath, "w");
    if (!f)
        return -1;
    /* Tenant "qa" may hold 1 MiB; short leases so that reads do not hold eviction back long. */
    fprintf(f, "{\"tenant_quota\": \"qa=1MiB\", \"default_kv_lease_ttl\": 300, \"fence_grace_ms\": 200,"
               " \"segment_prefault\": false}\n");
    fclose(f);
    (void)kvp_test_cluster_guard(); /* its daemons die with this process, however it ends */
    char *argv[] = {c->ctl, "cluster", "up", "--dir", c->dir, "--masters", "1", "--segments", "2",
                    "--segment-size", "32M", "--config", cfgpath, NULL};
    int rc = tc_run(argv);
    c->up = true;
    if (rc != 0)
        return -1;
    json_error_t e;
    json_t *j = json_load_file(c->file, 0, &e);
    if (!j)
        return -1;
    json_t *m = json_array_get(json_object_get(j, "masters"), 0);
    snprintf(A.master, sizeof A.master, "%s", json_string_value(json_object_get(m, "address")));
    snprintf(A.raft, sizeof A.raft, "%s", json_string_value(json_object_get(m, "raft_address")));
    snprintf(A.log, sizeof A.log, "%s", json_string_value(json_object_get(m, "log")));
    json_t *au = json_object_get(j, "auth");
    snprintf(A.master_keys, sizeof A.master_keys, "%s", json_string_value(json_object_get(au, "master_keys")));
    snprintf(A.allowed, sizeof A.allowed, "%s", json_string_value(json_object_get(au, "allowed_dir")));
    snprintf(A.keys, sizeof A.keys, "%s/keys", c->dir);
    json_decref(j);
    return 0;
}

static int group_teardown(void **state)
{
    (void)kvp_test_children_kill();
    tc_cluster_down(&A.cl);
    return 0;
}

/* A client key of `tenant`, allowed by the master (it rereads the directory). Path of its secret. */
static void tenant_key(const char *tenant, char *secret, size_t cap)
{
    char path[500], pub[600];
    snprintf(path, sizeof path, "%s/tenant-%s", A.keys, tenant);
    snprintf(secret, cap, "%s_secret", path);
    if (access(secret, F_OK) == 0)
        return;
    char name[80];
    snprintf(name, sizeof name, "tenant-%s", tenant);
    assert_int_equal(kvp_auth_keygen(path, name, "client", tenant, NULL), KVP_OK);
    snprintf(pub, sizeof pub, "%s/%s", A.allowed, name);
    assert_int_equal(kvp_auth_export_public(path, pub), KVP_OK);
}

static kvp_client *open_client(const char *key_secret, const char *tenant_id, int *rc_out)
{
    kvp_config *cfg = NULL;
    assert_int_equal(kvp_config_new(&cfg), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "cluster_file", A.cl.file), KVP_OK);
    assert_int_equal(kvp_config_set(cfg, "transfer_timeout", "5000ms"), KVP_OK);
    if (key_secret)
        assert_int_equal(kvp_config_set(cfg, "auth_key", key_secret), KVP_OK);
    if (tenant_id)
        assert_int_equal(kvp_config_set(cfg, "tenant_id", tenant_id), KVP_OK);
    kvp_client *c = NULL;
    int rc = kvp_client_open(cfg, &c);
    kvp_config_destroy(&cfg);
    if (rc_out)
        *rc_out = rc;
    return rc == KVP_OK ? c : NULL;
}

/* An authorised client still puts and gets. */
static void assert_serving(void)
{
    kvp_client *c = open_client(NULL, NULL, NULL);
    assert_non_null(c);
    char key[64], buf[100];
    snprintf(key, sizeof key, "alive-%llu", (unsigned long long)kvp_clock_now_us());
    assert_int_equal(kvp_put(c, key, "still serving", 13, NULL), KVP_OK);
    assert_int_equal(kvp_get(c, key, buf, sizeof buf, 0), 13);
    assert_memory_equal(buf, "still serving", 13);
    tc_close(&c);
}

/* A Members request on a DEALER; true when any reply arrives within wait_ms. */
static bool members_answered(void *dealer, uint32_t wait_ms)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__MembersReq mr = KVP__MEMBERS_REQ__INIT;
    req.req_id = 7;
    req.timeout_ms = wait_ms;
    req.body_case = KVP__REQUEST__BODY_MEMBERS;
    req.members = &mr;
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(kvp_wire_encode_request(&req, &buf, &len), KVP_OK);
    zmq_send(dealer, buf, len, ZMQ_DONTWAIT);
    free(buf);
    zmq_pollitem_t it = {.socket = dealer, .events = ZMQ_POLLIN};
    return zmq_poll(&it, 1, (long)wait_ms) == 1;
}

static void test_auth_control_refuses_peer_without_keys(void **state)
{
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    char ep[100];
    snprintf(ep, sizeof ep, "tcp://%s", A.master);
    assert_int_equal(zmq_connect(d, ep), 0);
    assert_false(members_answered(d, 1500));
    zmq_close(d);
    zmq_ctx_term(ctx);
    assert_true(log_has("no CURVE handshake", 3000));
    assert_serving();
}

static void test_auth_control_refuses_wrong_key(void **state)
{
    char path[500];
    snprintf(path, sizeof path, "%s/not-allowed", A.cl.dir);
    assert_int_equal(kvp_auth_keygen(path, "not-allowed", "admin", "", NULL), KVP_OK);
    char secret[520];
    snprintf(secret, sizeof secret, "%s_secret", path);
    struct kvp_auth_client *auth = NULL;
    assert_int_equal(kvp_auth_client_load(&auth, "curve", secret, A.master_keys, NULL, NULL, "test"), KVP_OK);
    const char *m[] = {A.master};
    struct kvp_msession *ms = NULL;
    assert_int_equal(kvp_msession_new_auth(&ms, m, 1, "test", &auth), KVP_OK);
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__ClusterStatusReq cs = KVP__CLUSTER_STATUS_REQ__INIT;
    req.body_case = KVP__REQUEST__BODY_CLUSTER_STATUS;
    req.cluster_status = &cs;
    Kvp__Response *resp = NULL;
    assert_int_equal(kvp_msession_call(ms, &req, 1500, &resp), KVP_ERR_UNAVAILABLE);
    kvp_msession_destroy(&ms);
    assert_true(log_has("key not in the allowed-keys directory", 3000));
    assert_serving();
}

/* Connect, send garbage, expect the peer to close within 3 s. */
static void garbage_closed(const char *hostport)
{
    char host[64];
    snprintf(host, sizeof host, "%s", hostport);
    char *colon = strrchr(host, ':');
    assert_non_null(colon);
    *colon = '\0';
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    assert_int_equal(inet_pton(AF_INET, host, &sa.sin_addr), 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    char junk[256];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (char)(0xff - i * 7);
    assert_true(write(fd, junk, sizeof junk) > 0);
    bool closed = false;
    for (uint64_t end = kvp_clock_now_ms() + 3000; !closed && kvp_clock_now_ms() < end;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) == 1) {
            char b[512];
            ssize_t n = read(fd, b, sizeof b);
            closed = n <= 0; /* bytes of a greeting first are fine; then the close */
        }
    }
    close(fd);
    assert_true(closed);
}

static void test_auth_control_refuses_garbage_before_handshake(void **state)
{
    garbage_closed(A.master);
    assert_true(log_has("refused control connection from 127.0.0.1", 3000));
    assert_serving();
}

static void test_auth_raft_port_drops_garbage(void **state)
{
    garbage_closed(A.raft);
    assert_serving();
}

static void test_auth_raft_non_loopback_refused(void **state)
{
    const char *bd = getenv("KVP_BUILD_DIR");
    char exe[600], listen[64], raft[64], data[500], key[500], log[500];
    snprintf(exe, sizeof exe, "%s/tools/kvpool-master", bd ? bd : ".");
    snprintf(listen, sizeof listen, "127.0.0.1:%u", kvp_test_free_port());
    snprintf(raft, sizeof raft, "0.0.0.0:%u", kvp_test_free_port());
    snprintf(data, sizeof data, "%s/nonloopback", A.cl.dir);
    snprintf(key, sizeof key, "%s/master-1_secret", A.keys);
    snprintf(log, sizeof log, "%s/nonloopback.log", A.cl.dir);
    pid_t pid = fork();
    kvp_test_child_track(pid); /* killed at teardown if a failed assert skips its stop */
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(exe, exe, "--id", "1", "--listen", listen, "--raft-address", raft, "--data-dir", data, "--auth-key", key,
              "--auth-allowed-dir", A.allowed, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
    FILE *f = fopen(log, "r");
    char buf[8192] = "";
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    assert_non_null(strstr(buf, "raft_network_trusted"));
}

/* auth none: the master starts and serves, with exactly one WARN saying so. */
static void test_auth_none_warns_once(void **state)
{
    const char *bd = getenv("KVP_BUILD_DIR");
    char exe[600], listen[64], raft[64], data[500], log[500];
    snprintf(exe, sizeof exe, "%s/tools/kvpool-master", bd ? bd : ".");
    snprintf(listen, sizeof listen, "127.0.0.1:%u", kvp_test_free_port());
    snprintf(raft, sizeof raft, "127.0.0.1:%u", kvp_test_free_port());
    snprintf(data, sizeof data, "%s/authnone", A.cl.dir);
    snprintf(log, sizeof log, "%s/authnone.log", A.cl.dir);
    pid_t pid = fork();
    kvp_test_child_track(pid);
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(exe, exe, "--id", "1", "--listen", listen, "--raft-address", raft, "--data-dir", data, "--auth", "none",
              (char *)NULL);
        _exit(127);
    }
    int warns = 0;
    bool serving = false;
    for (uint64_t end = kvp_clock_now_ms() + 10000; !serving && kvp_clock_now_ms() < end; kvp_clock_sleep_ms(100)) {
        FILE *f = fopen(log, "r");
        char line[2048];
        warns = 0;
        while (f && fgets(line, sizeof line, f)) {
            warns += strstr(line, "WARN") && strstr(line, "auth: none") ? 1 : 0;
            serving |= strstr(line, "serving tcp://") != NULL;
        }
        if (f)
            fclose(f);
    }
    kill(pid, SIGTERM);
    int st = 0;
    waitpid(pid, &st, 0);
    assert_true(serving);
    assert_int_equal(warns, 1);
}

static void test_auth_tenants_isolated(void **state)
{
    char ka[600], kb[600];
    tenant_key("ta", ka, sizeof ka);
    tenant_key("tb", kb, sizeof kb);
    kvp_client *a = open_client(ka, "ta", NULL);
    kvp_client *b = open_client(kb, NULL, NULL);
    kvp_client *owner = open_client(NULL, NULL, NULL);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(owner);
    const char *k = "tenant-object";
    char va[4096], vb[1024], got[4096];
    memset(va, 'a', sizeof va);
    memset(vb, 'b', sizeof vb);
    assert_int_equal(kvp_put(a, k, va, sizeof va, NULL), KVP_OK);
    /* tenant B sees nothing of A's */
    assert_int_equal(kvp_get(b, k, got, sizeof got, 0), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_exists(b, k), 0);
    assert_int_equal(kvp_get_size(b, k), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_remove(b, k, true), KVP_ERR_NOT_FOUND);
    const char *keys[] = {k};
    int ex[1] = {-100};
    assert_int_equal(kvp_batch_exists(b, 1, keys, ex), KVP_OK);
    assert_int_equal(ex[0], 0);
    void *bufs[] = {got};
    size_t caps[] = {sizeof got};
    int64_t res[1] = {0};
    assert_int_equal(kvp_batch_get(b, 1, keys, bufs, caps, 0, res), KVP_OK);
    assert_int_equal(res[0], KVP_ERR_NOT_FOUND);
    /* nor does the default tenant; a key holding the tenant separator is refused */
    assert_int_equal(kvp_exists(owner, k), 0);
    char forged[64];
    snprintf(forged, sizeof forged, "ta%c%s", KVP_AUTH_TENANT_SEP, k);
    assert_true(kvp_exists(b, forged) < 0);
    assert_true(kvp_get(owner, forged, got, sizeof got, 0) < 0);
    /* the same name in B's own scope */
    assert_int_equal(kvp_put(b, k, vb, sizeof vb, NULL), KVP_OK);
    assert_int_equal(kvp_get(a, k, got, sizeof got, 0), (int64_t)sizeof va);
    assert_memory_equal(got, va, sizeof va);
    assert_int_equal(kvp_get(b, k, got, sizeof got, 0), (int64_t)sizeof vb);
    assert_memory_equal(got, vb, sizeof vb);
    /* RemoveAll is the pool owner's: a tenant is refused */
    uint64_t removed = 0;
    assert_int_equal(kvp_remove_all(b, true, &removed), KVP_ERR_DENIED);
    assert_int_equal(kvp_exists(a, k), 1);
    tc_close(&a);
    tc_close(&b);
    tc_close(&owner);
}

static void test_auth_tenant_id_disagreeing_refused(void **state)
{
    char ka[600];
    tenant_key("ta", ka, sizeof ka);
    int rc = 0;
    kvp_client *c = open_client(ka, "tb", &rc);
    assert_null(c);
    assert_int_equal(rc, KVP_ERR_DENIED);
    c = open_client(ka, "ta", &rc);
    assert_non_null(c);
    tc_close(&c);
}

static void test_auth_role_denied(void **state)
{
    char ka[600];
    tenant_key("ta", ka, sizeof ka);
    struct kvp_auth_client *auth = NULL;
    assert_int_equal(kvp_auth_client_load(&auth, NULL, ka, NULL, A.cl.file, "client_key", "test"), KVP_OK);
    const char *m[] = {A.master};
    struct kvp_msession *ms = NULL;
    assert_int_equal(kvp_msession_new_auth(&ms, m, 1, "test", &auth), KVP_OK);
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__TransferLeaderReq tl = KVP__TRANSFER_LEADER_REQ__INIT;
    req.body_case = KVP__REQUEST__BODY_TRANSFER_LEADER;
    req.transfer_leader = &tl;
    Kvp__Response *resp = NULL;
    assert_int_equal(kvp_msession_call(ms, &req, 5000, &resp), KVP_OK);
    assert_int_equal(resp->status, KVP_ERR_DENIED);
    kvp_msession_response_free(resp);
    kvp_msession_destroy(&ms);
    assert_true(log_has("refused request", 3000));
}

/* A thread that waits (busy, 20 s at most) until d records segment 5's token, then reads 512
 * bytes from segment 5 at off through xe without asking for a token itself. */
struct held_reader {
    struct kvp_dtoken *d;
    struct kvp_xfer_engine *xe;
    const char *endpoint;
    uint64_t off;
    bool saw_held;
    int status;
    uint8_t buf[512];
};

static void *held_reader_run(void *arg)
{
    struct held_reader *r = arg;
    uint64_t end = kvp_clock_now_ms() + 20000;
    while (!(r->saw_held = kvp_dtoken_held(r->d, 5, kvp_clock_wall_ms(), 0)) && kvp_clock_now_ms() < end)
        sched_yield();
    if (!r->saw_held)
        return NULL;
    struct kvp_xfer_slice sl = {.local = r->buf, .length = sizeof r->buf, .segment_id = 5,
                                .endpoint = r->endpoint, .remote_offset = r->off, .op = KVP_XFER_READ};
    r->status = kvp_xfer_run(r->xe, &sl, 1, 10000);
    return NULL;
}

/* Data-plane tokens (issue 25 item 2): the master signs tokens for an authenticated client's
 * ephemeral key, bound to each asked segment and to the key's tenant; they verify with the
 * token key published in the master's certificate; a bad request is INVALID. */
static void test_auth_data_token_issued(void **state)
{
    char ka[600];
    tenant_key("ta", ka, sizeof ka);
    struct kvp_auth_client *auth = NULL, *keys = NULL;
    assert_int_equal(kvp_auth_client_load(&auth, NULL, ka, NULL, A.cl.file, "client_key", "test"), KVP_OK);
    assert_int_equal(kvp_auth_client_load(&keys, NULL, ka, NULL, A.cl.file, "client_key", "test"), KVP_OK);
    uint8_t mk[4][32];
    size_t nmk = kvp_auth_client_token_keys(keys, mk, 4);
    kvp_auth_client_destroy(&keys);
    assert_int_equal(nmk, 1); /* cluster up's master certificate publishes its token key */
    const char *m[] = {A.master};
    struct kvp_msession *ms = NULL;
    assert_int_equal(kvp_msession_new_auth(&ms, m, 1, "test", &auth), KVP_OK);
    struct kvp_dt_wallet *w = NULL;
    assert_int_equal(kvp_dt_wallet_new(&w), KVP_OK);
    uint8_t pk[KVP_DT_PK_BYTES];
    kvp_dt_wallet_public_key(w, pk);
    uint32_t segs[2] = {1, 2};
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__DataTokenReq dt = KVP__DATA_TOKEN_REQ__INIT;
    dt.n_segment_ids = 2;
    dt.segment_ids = segs;
    dt.client_key.data = pk;
    dt.client_key.len = 5; /* first a bad key length */
    req.body_case = KVP__REQUEST__BODY_DATA_TOKEN;
    req.data_token = &dt;
    Kvp__Response *resp = NULL;
    assert_int_equal(kvp_msession_call(ms, &req, 5000, &resp), KVP_OK);
    assert_int_equal(resp->status, KVP_ERR_INVALID);
    kvp_msession_response_free(resp);
    dt.client_key.len = sizeof pk;
    resp = NULL;
    assert_int_equal(kvp_msession_call(ms, &req, 5000, &resp), KVP_OK);
    assert_int_equal(resp->status, KVP_OK);
    assert_int_equal(resp->body_case, KVP__RESPONSE__BODY_DATA_TOKEN);
    assert_int_equal(resp->data_token->n_tokens, 2);
    assert_true(resp->data_token->expires_ms > kvp_clock_wall_ms());
    for (size_t i = 0; i < 2; i++)
        assert_int_equal(kvp_dt_wallet_put(w, resp->data_token->tokens[i].data, resp->data_token->tokens[i].len),
                         KVP_OK);
    kvp_msession_response_free(resp);
    kvp_msession_destroy(&ms);
    uint8_t ch[KVP_DT_CHALLENGE_BYTES], r[KVP_DT_RESPONSE_MAX];
    struct kvp_dt_claims c;
    kvp_dt_challenge(1, ch);
    int rl = kvp_dt_wallet_respond(w, ch, kvp_clock_wall_ms(), r, sizeof r);
    assert_true(rl > 0);
    assert_int_equal(kvp_dt_verify(ch, r, (size_t)rl, 1, kvp_clock_wall_ms(), (const uint8_t(*)[32])mk, nmk, &c, NULL),
                     KVP_OK);
    assert_string_equal(c.tenant, "ta");
    /* segment 1's token, presented to segment 3 (whose challenge names 3, the wallet has none) */
    kvp_dt_challenge(3, ch);
    assert_int_equal(kvp_dt_wallet_respond(w, ch, kvp_clock_wall_ms(), r, sizeof r), KVP_ERR_NOT_FOUND);
    kvp_dt_wallet_destroy(&w);

    /* The process's tokens (actors/session/dtoken.c): ensure asks the master once for the
     * segments of a batch's slices, hands the tokens to the engine's transfer actors and only then
     * records them as held. Three other threads wait (busy, bounded) for the record of segment
     * 5's token and read from segment 5 at once, without asking themselves: their transfers, sent
     * to any of the 4 transfer actors, find the token there (the hand-over entered every actor's
     * mailbox before the record was stored; docs/runtime.md "Messages"). */
    assert_int_equal(kvp_auth_client_load(&auth, NULL, ka, NULL, A.cl.file, "client_key", "test"), KVP_OK);
    assert_int_equal(kvp_msession_new_auth(&ms, m, 1, "test", &auth), KVP_OK);
    struct kvp_dtoken *d = NULL;
    assert_int_equal(kvp_dtoken_new(&d, "test"), KVP_OK);
    struct kvp_xfer_params xp = {.io_threads = 4, .connect_timeout_ms = 5000, .token_wallet = kvp_dtoken_key(d)};
    struct kvp_xfer_engine *xe = NULL;
    assert_int_equal(kvp_xfer_engine_new(&xe, &xp), KVP_OK);
    static uint8_t region[1u << 16];
    for (size_t i = 0; i < sizeof region; i++)
        region[i] = (uint8_t)(i * 7u + 3u);
    struct kvp_seg_server *srv = NULL;
    assert_int_equal(kvp_seg_server_start_auth(&srv, "127.0.0.1", 0, region, sizeof region,
                                               (const uint8_t(*)[KVP_DT_PK_BYTES])mk, nmk),
                     KVP_OK);
    kvp_seg_server_set_id(srv, 5);
    char ep[32];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", kvp_seg_server_port(srv));
    struct held_reader rd[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        rd[i] = (struct held_reader){.d = d, .xe = xe, .endpoint = ep, .off = (uint64_t)i * 4096, .status = 1};
        assert_int_equal(pthread_create(&th[i], NULL, held_reader_run, &rd[i]), 0);
    }
    struct kvp_xfer_slice sl[3] = {{.segment_id = 4}, {.segment_id = 5}, {.segment_id = 4}};
    uint64_t now = kvp_clock_wall_ms();
    bool before = kvp_dtoken_held(d, 5, now, 0); /* none yet */
    kvp_dtoken_ensure(d, ms, xe, sl, 3, 5000);
    for (int i = 0; i < 3; i++) /* before any assert: the threads use this frame */
        pthread_join(th[i], NULL);
    now = kvp_clock_wall_ms();
    assert_false(before);
    assert_false(kvp_dtoken_off(d));
    assert_true(kvp_dtoken_held(d, 4, now, 60000));
    assert_true(kvp_dtoken_held(d, 5, now, 60000));
    assert_false(kvp_dtoken_held(d, 5, now, KVP_DT_TTL_MS)); /* ends within the token's lifetime */
    assert_false(kvp_dtoken_held(d, 6, now, 0));
    for (int i = 0; i < 3; i++) {
        assert_true(rd[i].saw_held);
        assert_int_equal(rd[i].status, KVP_OK);
        for (size_t j = 0; j < sizeof rd[i].buf; j++)
            assert_int_equal(rd[i].buf[j], (uint8_t)((rd[i].off + j) * 7u + 3u));
    }
    kvp_xfer_engine_destroy(&xe);
    kvp_seg_server_stop(&srv);
    kvp_dtoken_destroy(&d);
    kvp_msession_destroy(&ms);
}

/* The first line of file `path` holding `needle`, into line (false when none within wait_ms). */
static bool file_line(const char *path, const char *needle, char *line, size_t cap, uint64_t wait_ms)
{
    uint64_t end = kvp_clock_now_ms() + wait_ms;
    do {
        FILE *f = fopen(path, "r");
        bool found = false;
        while (f && !found && fgets(line, (int)cap, f))
            found = strstr(line, needle) != NULL;
        if (f)
            fclose(f);
        if (found)
            return true;
        kvp_clock_sleep_ms(50);
    } while (kvp_clock_now_ms() < end);
    return false;
}

/* A connection to a segment's data port: the challenge comes first; sending `bytes` instead of a
 * token gets the connection closed unanswered. */
static void data_port_refuses(uint16_t port, const uint8_t *bytes, size_t len)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint8_t ch[KVP_DT_CHALLENGE_BYTES];
    size_t got = 0;
    while (got < sizeof ch) {
        ssize_t r = recv(fd, ch + got, sizeof ch - got, 0);
        assert_true(r > 0);
        got += (size_t)r;
    }
    assert_memory_equal(ch, "KVPC", 4);
    assert_true(write(fd, bytes, len) == (ssize_t)len);
    uint8_t b[64];
    ssize_t r = recv(fd, b, sizeof b, 0);
    assert_true(r == 0 || (r < 0 && errno == ECONNRESET));
    close(fd);
}

/* Item 2 on real processes: kvpool-segment requires tokens (the masters' certificates carry
 * token keys), refuses a peer without one and logs it naming the address, while the clients
 * (which fetch and present tokens) keep working. */
static void test_auth_data_port_refuses_peer_without_token(void **state)
{
    json_error_t e;
    json_t *j = json_load_file(A.cl.file, 0, &e);
    assert_non_null(j);
    char slog[600];
    snprintf(slog, sizeof slog, "%s",
             json_string_value(json_object_get(json_array_get(json_object_get(j, "segments"), 0), "log")));
    json_decref(j);
    char line[2048];
    assert_true(file_line(slog, "data tokens required", line, sizeof line, 3000));
    const char *pp = strstr(line, " port ");
    assert_non_null(pp);
    uint16_t port = (uint16_t)atoi(pp + 6);
    assert_true(port > 0);
    struct kvp_frame f = {.op = KVP_FRAME_PING, .segment_id = 1, .req_id = 1};
    uint8_t hdr[KVP_FRAME_HEADER_BYTES];
    kvp_frame_encode(&f, hdr);
    data_port_refuses(port, hdr, sizeof hdr); /* no token: a request first */
    assert_true(file_line(slog, "refused data connection from 127.0.0.1", line, sizeof line, 3000));
    uint8_t junk[100];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(0x5a ^ i);
    data_port_refuses(port, junk, sizeof junk); /* garbage before the handshake */
    assert_serving();
}

static void test_auth_quota_evicts_own_objects_only(void **state)
{
    char kq[600], ko[600];
    tenant_key("qa", kq, sizeof kq); /* quota 1 MiB (group_setup) */
    tenant_key("qb", ko, sizeof ko); /* no quota */
    kvp_client *q = open_client(kq, NULL, NULL), *o = open_client(ko, NULL, NULL);
    assert_non_null(q);
    assert_non_null(o);
    size_t len = 300 << 10;
    char *v = malloc(len);
    assert_non_null(v);
    memset(v, 'q', len);
    char key[32];
    for (int i = 0; i < 3; i++) { /* the other tenant's objects */
        snprintf(key, sizeof key, "other-%d", i);
        assert_int_equal(kvp_put(o, key, v, len, NULL), KVP_OK);
    }
    for (int i = 0; i < 3; i++) { /* 900 KiB of qa's 1 MiB */
        snprintf(key, sizeof key, "q-%d", i);
        assert_int_equal(kvp_put(q, key, v, len, NULL), KVP_OK);
        kvp_clock_sleep_ms(20); /* distinct last-access times: q-0 is the least recent */
    }
    assert_int_equal(kvp_put(q, "q-3", v, len, NULL), KVP_OK); /* over: q-0 goes */
    bool gone = false;
    for (uint64_t end = kvp_clock_now_ms() + 5000; !gone && kvp_clock_now_ms() < end; kvp_clock_sleep_ms(50))
        gone = kvp_exists(q, "q-0") == 0;
    assert_true(gone);
    assert_int_equal(kvp_exists(q, "q-3"), 1);
    for (int i = 0; i < 3; i++) {
        snprintf(key, sizeof key, "other-%d", i);
        assert_int_equal(kvp_exists(o, key), 1);
    }
    /* more than the whole quota: NO_SPACE at PutStart, nothing evicted for it */
    char *big = malloc(2 << 20);
    assert_non_null(big);
    memset(big, 'Q', 2 << 20);
    assert_int_equal(kvp_put(q, "q-big", big, 2 << 20, NULL), KVP_ERR_NO_SPACE);
    assert_int_equal(kvp_exists(q, "q-3"), 1);
    free(big);
    free(v);
    /* use per tenant in kvpoolctl status --json */
    char out[600];
    snprintf(out, sizeof out, "%s/status.json", A.cl.dir);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "'%s' --cluster '%s' --json status > '%s'", A.cl.ctl, A.cl.file, out);
    assert_int_equal(system(cmd), 0);
    json_error_t e;
    json_t *st = json_load_file(out, 0, &e);
    assert_non_null(st);
    json_t *tn = json_object_get(st, "tenants"), *t;
    size_t i;
    bool seen = false;
    json_array_foreach(tn, i, t) if (strcmp(json_string_value(json_object_get(t, "tenant")), "qa") == 0)
    {
        seen = true;
        assert_true(json_integer_value(json_object_get(t, "used_bytes")) <= (1 << 20));
        assert_int_equal(json_integer_value(json_object_get(t, "quota_bytes")), 1 << 20);
        assert_true(json_integer_value(json_object_get(t, "quota_evictions")) >= 1);
    }
    assert_true(seen);
    json_decref(st);
    tc_close(&q);
    tc_close(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auth_control_refuses_peer_without_keys),
        cmocka_unit_test(test_auth_control_refuses_wrong_key),
        cmocka_unit_test(test_auth_control_refuses_garbage_before_handshake),
        cmocka_unit_test(test_auth_raft_port_drops_garbage),
        cmocka_unit_test(test_auth_raft_non_loopback_refused),
        cmocka_unit_test(test_auth_none_warns_once),
        cmocka_unit_test(test_auth_tenants_isolated),
        cmocka_unit_test(test_auth_tenant_id_disagreeing_refused),
        cmocka_unit_test(test_auth_role_denied),
        cmocka_unit_test(test_auth_data_token_issued),
        cmocka_unit_test(test_auth_data_port_refuses_peer_without_token),
        cmocka_unit_test(test_auth_quota_evicts_own_objects_only),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
