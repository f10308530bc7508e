/*
 * test_master_soft.c — the leader's soft state and timers on three real kvpool-master
 * processes (short TTLs through KVPOOL_* variables):
 *  - a new leader refuses un-forced Remove for one lease TTL (election grace), forced Remove works;
 *  - GetReplicaList grants a lease: un-forced Remove of that key is KVP_ERR_LEASED until it ends;
 *  - a pending put past its deadline is revoked by the leader's RevokeExpired timer;
 *  - a segment that stops heartbeating is declared lost after client_ttl, and its heartbeat is
 *    then answered NOT_FOUND; an unknown segment's heartbeat is NOT_FOUND;
 *  - a segment reported unreachable is probed (the failed probe is logged) but kept while it
 *    heartbeats;
 *  - membership: a fourth master started with --join is added, leads, serves, and is removed
 *    (through the kvpoolctl commands);
 *  - the per-writer RDMA fence: a PutRevoke naming a writer family asks a segment that says
 *    fence_selectors to fence that family only, and an older segment to fence every writer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "actors/master/service/service.h"
#include "auth/auth.h"
#include "tests/integration/test_master_util.h"
#include "tests/lib/proc_reap.h"

/* True once a listener can bind 127.0.0.1:port (SO_REUSEADDR, as zmq binds), within ms. */
static bool port_bindable(int port, unsigned ms)
{
    for (unsigned waited = 0;; waited += 10) {
        int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                .sin_port = htons((uint16_t)port)};
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        if (fd >= 0)
            close(fd);
        if (ok)
            return true;
        if (waited >= ms)
            return false;
        tm_sleep_ms(10);
    }
}

static int setup(void **state)
{
    struct tm_cluster *c = calloc(1, sizeof *c);
    *state = c;
    setenv("KVPOOL_CLIENT_TTL", "2500ms", 1);
    setenv("KVPOOL_DEFAULT_KV_LEASE_TTL", "1500", 1);
    return c ? 0 : -1;
}

static int teardown(void **state)
{
    (void)kvp_test_children_kill();
    tm_cluster_down(*state);
    free(*state);
    return 0;
}

static int remove_one(struct tm_cluster *c, const char *key, bool force)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__RemoveReq rr = KVP__REMOVE_REQ__INIT;
    char *keys[1] = {(char *)key};
    rr.keys = keys;
    rr.n_keys = 1;
    rr.force = force;
    req.body_case = KVP__REQUEST__BODY_REMOVE;
    req.remove = &rr;
    Kvp__Response *resp = NULL;
    int rc = kvp_msession_call(c->ms, &req, 5000, &resp);
    if (rc == KVP_OK)
        rc = resp->status ? resp->status
             : (resp->remove && resp->remove->n_status == 1) ? resp->remove->status[0]
                                                            : KVP_ERR_MALFORMED;
    kvp_msession_response_free(resp);
    return rc;
}

/* Wait ms while heartbeating the main fake segment (client_ttl is short here). */
static void wait_heartbeating(struct tm_cluster *c, unsigned ms)
{
    uint64_t end = tm_now_ms() + ms;
    while (tm_now_ms() < end) {
        assert_int_equal(tm_heartbeat(c, 3000), KVP_OK);
        tm_sleep_ms(200);
    }
}

static json_t *status_json(struct tm_cluster *c)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__ClusterStatusReq cs = KVP__CLUSTER_STATUS_REQ__INIT;
    req.body_case = KVP__REQUEST__BODY_CLUSTER_STATUS;
    req.cluster_status = &cs;
    Kvp__Response *resp = NULL;
    json_t *j = NULL;
    if (kvp_msession_call(c->ms, &req, 5000, &resp) == KVP_OK && resp->status == KVP_OK && resp->cluster_status) {
        json_error_t e;
        j = json_loads(resp->cluster_status->json, 0, &e);
    }
    kvp_msession_response_free(resp);
    return j;
}

/* A fake segment `name` (1 GiB at 127.0.0.1:10, where nothing listens) mounted; its id. */
static uint32_t mount_fake(struct tm_cluster *c, const char *name)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__MountSegmentReq m = KVP__MOUNT_SEGMENT_REQ__INIT;
    m.name = (char *)name;
    m.host = "127.0.0.1";
    m.endpoint = "127.0.0.1:10";
    m.size = 1ull << 30;
    req.body_case = KVP__REQUEST__BODY_MOUNT;
    req.mount = &m;
    Kvp__Response *resp = NULL;
    assert_int_equal(kvp_msession_call(c->ms, &req, 5000, &resp), KVP_OK);
    assert_int_equal(resp->status, KVP_OK);
    uint32_t id = resp->mount->segment_id;
    kvp_msession_response_free(resp);
    return id;
}

static void report_unreachable(struct tm_cluster *c, uint32_t seg)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__ReportUnreachableReq ru = KVP__REPORT_UNREACHABLE_REQ__INIT;
    ru.segment_id = seg;
    req.body_case = KVP__REQUEST__BODY_REPORT_UNREACHABLE;
    req.report_unreachable = &ru;
    Kvp__Response *resp = NULL;
    assert_int_equal(kvp_msession_call(c->ms, &req, 5000, &resp), KVP_OK);
    assert_int_equal(resp->status, KVP_OK);
    kvp_msession_response_free(resp);
}

/* PutStart of one 4096-byte key on fake-seg (its preferred segment), op_id op, ttl_ms; asserts
 * that the call, the answer and the item are OK. The answer: free with kvp_msession_response_free. */
static Kvp__Response *put_start_preferred(struct tm_cluster *c, const char *key, uint64_t op, uint64_t ttl_ms)
{
    Kvp__Response *resp = NULL;
    assert_int_equal(tm_put_start(c, key, op, "fake-seg", ttl_ms, 5000, &resp), KVP_OK);
    return resp;
}

/* PutEnd of key (op_id op): asserts that the call and the answer are OK; the item's status. */
static int put_end(struct tm_cluster *c, const char *key, uint64_t op)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__PutEndReq pe = KVP__PUT_END_REQ__INIT;
    Kvp__PutEndItem e = KVP__PUT_END_ITEM__INIT, *eitems[1] = {&e};
    e.key = (char *)key;
    e.op_id = op;
    pe.items = eitems;
    pe.n_items = 1;
    req.body_case = KVP__REQUEST__BODY_PUT_END;
    req.put_end = &pe;
    Kvp__Response *resp = NULL;
    assert_int_equal(kvp_msession_call(c->ms, &req, 5000, &resp), KVP_OK);
    assert_int_equal(resp->status, KVP_OK);
    assert_non_null(resp->put_end);
    assert_int_equal(resp->put_end->n_status, 1);
    int st = resp->put_end->status[0];
    kvp_msession_response_free(resp);
    return st;
}

/* C6: a PutStart of more than KVP_MASTER_MAX_PUT_ITEMS items is refused with KVP_ERR_INVALID and
 * nothing of it is applied (one PutStart is one Raft command: a million items held the raft
 * thread past the election timeout); the master keeps serving. */
static void test_master_put_start_too_many_items_invalid(void **state)
{
    struct tm_cluster *c = *state;
    assert_int_equal(tm_cluster_up(c), 0);
    size_t n = KVP_MASTER_MAX_PUT_ITEMS + 1;
    Kvp__PutStartItem *its = calloc(n, sizeof *its);
    Kvp__PutStartItem **ip = calloc(n, sizeof *ip);
    char (*keys)[32] = calloc(n, sizeof *keys);
    assert_non_null(its);
    assert_non_null(ip);
    assert_non_null(keys);
    for (size_t i = 0; i < n; i++) {
        kvp__put_start_item__init(&its[i]);
        snprintf(keys[i], sizeof keys[i], "many-%zu", i);
        its[i].key = keys[i];
        its[i].size = 1;
        its[i].replica_num = 1;
        its[i].op_id = c->next_op++;
        its[i].client_host = "127.0.0.1";
        ip[i] = &its[i];
    }
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__PutStartReq ps = KVP__PUT_START_REQ__INIT;
    ps.items = ip;
    ps.n_items = n;
    ps.ttl_ms = 5000;
    req.body_case = KVP__REQUEST__BODY_PUT_START;
    req.put_start = &ps;
    Kvp__Response *resp = NULL;
    assert_int_equal(kvp_msession_call(c->ms, &req, 20000, &resp), KVP_OK);
    assert_int_equal(resp->status, KVP_ERR_INVALID);
    kvp_msession_response_free(resp);
    char *k0[1] = {keys[0]};
    assert_int_equal(tm_count_existing(c, k0, 1, 5000), 0);
    assert_int_equal(tm_put(c, "after-many", 5000), KVP_OK);
    free(its);
    free(ip);
    free(keys);
}

/* docs/operations.md: kvpool-master exits 2 for bad settings, 1 when it could not start. A
 * members list it cannot parse, or one without this node's id, is a bad setting (it was 1). */
static void test_master_bad_members_exit_2(void **state)
{
    (void)state;
    const char *bd = getenv("KVP_BUILD_DIR");
    char bin[512], dir[64] = "/tmp/kvp-master-args-XXXXXX";
    snprintf(bin, sizeof bin, "%s/tools/kvpool-master", bd ? bd : ".");
    assert_non_null(mkdtemp(dir));
    char *garbage[] = {bin, "--id", "1", "--data-dir", dir, "--listen", "127.0.0.1:1", "--members", "garbage", NULL};
    assert_int_equal(tm_run(garbage, true), 2);
    char *not_me[] = {bin, "--id", "1", "--data-dir", dir, "--listen", "127.0.0.1:1", "--members",
                      "2@127.0.0.1:1@127.0.0.1:2", NULL};
    assert_int_equal(tm_run(not_me, true), 2);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) /* clean-up only: under TSan system() itself failed once (tm_log_has) */
        fprintf(stderr, "could not remove %s\n", dir);
}

/* One-commit put with a preferred segment (docs/master.md "One-commit put"): the first replica
 * is on the preferred segment whichever path answers; once the leader holds a reservation on it,
 * the PutStart is answered from memory (PutStartResult.term != 0) and its PutEnd commits. */
static void preferred_put_on_fast_path(struct tm_cluster *c)
{
    bool fast = false;
    for (int i = 0; i < 60 && !fast; i++) {
        char key[32];
        snprintf(key, sizeof key, "pref-%d", i);
        Kvp__Response *resp = put_start_preferred(c, key, 5000 + (uint64_t)i, 5000);
        Kvp__PutStartResult *r = resp->put_start->results[0];
        assert_true(r->n_replicas == 1);
        assert_int_equal(r->replicas[0]->segment_id, c->segment_id); /* the preferred one */
        fast = r->term != 0;
        kvp_msession_response_free(resp);
        assert_int_equal(put_end(c, key, 5000 + (uint64_t)i), KVP_OK);
        if (!fast)
            usleep(100000); /* the leader's next tick reserves on it */
    }
    assert_true(fast);
}

static void test_master_soft_state_leases_revoke_liveness(void **state)
{
    struct tm_cluster *c = *state;
    assert_int_equal(tm_cluster_up(c), 0);
    assert_int_equal(tm_put(c, "s-1", 5000), KVP_OK);
    assert_int_equal(tm_put(c, "s-2", 5000), KVP_OK);
    assert_int_equal(tm_put(c, "s-3", 5000), KVP_OK);

    /* Election grace: the new leader refuses un-forced removes; forced ones pass. How long it
     * has led comes from its own status document (a slow machine may be past the window). */
    json_t *st = status_json(c);
    assert_non_null(st);
    json_int_t led = json_integer_value(json_object_get(json_object_get(st, "node"), "leader_for_ms"));
    bool grace = json_is_true(json_object_get(json_object_get(st, "node"), "in_election_grace"));
    json_decref(st);
    if (grace && led < 1000)
        assert_int_equal(remove_one(c, "s-1", false), KVP_ERR_LEASED);
    else
        print_message("leader already led for %lld ms: election grace not checked\n", (long long)led);
    assert_int_equal(remove_one(c, "s-2", true), KVP_OK);
    assert_int_equal(remove_one(c, "s-2", true), KVP_ERR_NOT_FOUND);

    /* A second fake segment that never heartbeats. */
    uint32_t silent = mount_fake(c, "silent-seg");
    assert_int_equal(tm_segment_heartbeat(c->ms, silent, 3000), KVP_OK);
    assert_int_equal(tm_segment_heartbeat(c->ms, 999999, 3000), KVP_ERR_NOT_FOUND);

    preferred_put_on_fast_path(c);

    /* A pending put with a 300 ms deadline that never ends. */
    kvp_msession_response_free(put_start_preferred(c, "s-abandoned", 4242, 300));

    /* A client reports the heartbeating fake segment unreachable: the leader probes its data
     * plane (nothing listens there: the probe fails, logged) but keeps it while it heartbeats. */
    report_unreachable(c, c->segment_id);

    /* Past the grace (1.5 s) and past client_ttl (2.5 s) of the silent segment. */
    wait_heartbeating(c, 4000);
    int leader = tm_leader(c, 5000);
    char needle[64];
    snprintf(needle, sizeof needle, "segment %u: probe failed", c->segment_id);
    assert_true(tm_log_has(c, leader, needle));

    /* The abandoned put was revoked by the leader: its PutEnd finds nothing. */
    assert_int_equal(put_end(c, "s-abandoned", 4242), KVP_ERR_NOT_FOUND);

    /* The silent segment was declared lost; the heartbeating one was not. */
    assert_int_equal(tm_segment_heartbeat(c->ms, silent, 3000), KVP_ERR_NOT_FOUND);
    assert_int_equal(tm_heartbeat(c, 3000), KVP_OK);

    /* Leases: a read lease blocks un-forced Remove until it ends; an unread key is removable. */
    assert_int_equal(remove_one(c, "s-3", false), KVP_OK);
    assert_int_equal(tm_get_replicas(c, "s-1", 5000), KVP_OK);
    assert_int_equal(remove_one(c, "s-1", false), KVP_ERR_LEASED);
    wait_heartbeating(c, 1800);
    assert_int_equal(remove_one(c, "s-1", false), KVP_OK);
    assert_int_equal(remove_one(c, "s-1", false), KVP_ERR_NOT_FOUND);
}

/* Heartbeats the main fake segment every 300 ms until *stop (results ignored: calls made
 * during a leadership change may fail). For steps that take longer than client_ttl (2.5 s)
 * without a heartbeat of their own. */
struct hb_thread {
    struct tm_cluster *c;
    atomic_bool stop;
    pthread_t th;
};

static void *hb_main(void *arg)
{
    struct hb_thread *h = arg;
    while (!atomic_load(&h->stop)) {
        (void)tm_heartbeat(h->c, 2000);
        tm_sleep_ms(300);
    }
    return NULL;
}

/* A fourth master started with --join, added with `kvpoolctl add-member`, made leader with
 * `kvpoolctl transfer-leader`, serving every object, then removed with `kvpoolctl remove-member`. */
static void test_master_joined_member_added_leads_then_removed(void **state)
{
    struct tm_cluster *c = *state;
    assert_int_equal(tm_cluster_up(c), 0);
    char *keys[20];
    for (unsigned i = 0; i < 20; i++) {
        char key[64];
        tm_key(key, sizeof key, "j", i);
        assert_int_equal(tm_put(c, key, 5000), KVP_OK);
        keys[i] = strdup(key);
    }
    /* Two free ports for the new member. Both probes stay bound until both are chosen: czmq's
     * "*" takes the first free port of its dynamic range, so a probe closed before the second
     * bind handed out the same port twice and member 4 could not start (add-member then
     * answered BUSY until the test gave up). "!" picks a random port of the range. */
    int ports[2];
    zsock_t *probes[2];
    for (int i = 0; i < 2; i++) {
        probes[i] = zsock_new(ZMQ_ROUTER);
        ports[i] = zsock_bind(probes[i], "tcp://127.0.0.1:!");
        assert_true(ports[i] > 0);
    }
    for (int i = 0; i < 2; i++)
        zsock_destroy(&probes[i]);
    assert_int_not_equal(ports[0], ports[1]);
    /* zsock_destroy returns before zmq's I/O thread has closed the listener: under ctest -j2
     * member 4 found its port still bound by this process ("Address already in use"). */
    for (int i = 0; i < 2; i++)
        assert_true(port_bindable(ports[i], 5000));
    char listen[64], raft[64], data[400], log[400], master[600];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", ports[0]);
    snprintf(raft, sizeof raft, "127.0.0.1:%d", ports[1]);
    snprintf(data, sizeof data, "%s/master-4", c->dir);
    snprintf(log, sizeof log, "%s/master-4.log", c->dir);
    /* Member 4's key pair, its public half in the allowed and the masters' key directories
     * (docs/security.md "Adding a master"). */
    char key4[500], pub4[500], allowed[500], mkeys[500];
    snprintf(key4, sizeof key4, "%s/keys/master-4", c->dir);
    snprintf(allowed, sizeof allowed, "%s/keys/allowed", c->dir);
    snprintf(mkeys, sizeof mkeys, "%s/keys/masters", c->dir);
    assert_int_equal(kvp_auth_keygen(key4, "master-4", "master", "", listen), KVP_OK);
    snprintf(pub4, sizeof pub4, "%s/master-4", allowed);
    assert_int_equal(kvp_auth_export_public(key4, pub4), KVP_OK);
    snprintf(pub4, sizeof pub4, "%s/master-4", mkeys);
    assert_int_equal(kvp_auth_export_public(key4, pub4), KVP_OK);
    snprintf(key4, sizeof key4, "%s/keys/master-4_secret", c->dir);
    const char *bd = getenv("KVP_BUILD_DIR");
    snprintf(master, sizeof master, "%s/tools/kvpool-master", bd ? bd : ".");
    pid_t pid = fork();
    kvp_test_child_track(pid); /* killed at teardown if a failed assert skips its stop */
    if (pid == 0) {
        FILE *f = freopen(log, "w", stderr);
        (void)f;
        execl(master, master, "--id", "4", "--listen", listen, "--raft-address", raft, "--data-dir", data, "--join",
              "--auth-key", key4, "--auth-allowed-dir", allowed, "--auth-master-keys", mkeys, (char *)NULL);
        _exit(127);
    }
    assert_true(pid > 0);
    /* add-member (with its retries) and the transfer can take longer than client_ttl: without
     * heartbeats the fake segment was declared lost and its 20 objects dropped ("0 of 20
     * visible"; 2.9 s without one in a failed run). No assert until the thread is joined. */
    struct hb_thread hb = {.c = c};
    atomic_init(&hb.stop, false);
    bool hb_running = pthread_create(&hb.th, NULL, hb_main, &hb) == 0;
    char *add[] = {c->ctl, "--cluster", c->file, "add-member", "4", listen, raft, NULL};
    /* Promotion needs the new member to catch up in time; on a loaded machine that can fail
     * once, and add-member may be retried (it then only promotes). */
    int rc = tm_run(add, true);
    for (int i = 0; i < 4 && rc != 0; i++) {
        tm_sleep_ms(500);
        rc = tm_run(add, true);
    }
    char *members[] = {c->ctl, "--cluster", c->file, "--json", "members", NULL};
    char *xfer[] = {c->ctl, "--cluster", c->file, "transfer-leader", "4", NULL};
    char *rm[] = {c->ctl, "--cluster", c->file, "remove-member", "4", NULL};
    if (rc == 0) {
        tm_run(members, true);
        /* The session only knows the three; the new leader hints its own address (added with
         * add-member on this leader), so calls still reach it. */
        for (int i = 0; i < 50 && tm_run(xfer, true) != 0; i++)
            tm_sleep_ms(200);
        int n = tm_count_existing(c, keys, 20, 10000);
        int leader = tm_leader(c, 5000);
        print_message("joined member 4: leader %d, %d of 20 objects visible\n", leader, n);
        if (leader != 4 || n != 20)
            rc = -1;
        if (rc == 0)
            rc = tm_run(rm, true);
    }
    kill(pid, SIGTERM);
    int st;
    for (int i = 0; i < 100 && waitpid(pid, &st, WNOHANG) == 0; i++)
        tm_sleep_ms(50);
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    atomic_store(&hb.stop, true);
    if (hb_running)
        pthread_join(hb.th, NULL);
    for (unsigned i = 0; i < 20; i++)
        free(keys[i]);
    assert_int_equal(rc, 0);
    /* Three members again, and they serve. */
    int leader = tm_leader(c, 10000);
    assert_true(leader >= 1 && leader <= 3);
    assert_int_equal(tm_put(c, "j-after", 10000), KVP_OK);
}

/* C4: a live segment that heartbeats every 1.4 s (its heartbeat_ms; client_ttl is 2.5 s here),
 * reported unreachable again and again by clients while its probe fails (a busy data plane:
 * here nothing listens there), is kept while it heartbeats. The leader used to declare it lost
 * (every replica on it dropped) once its heartbeat was more than 1 s old after a failed probe:
 * 1 s is no silence for a segment whose period is longer. */
static void test_master_reported_segment_with_slow_heartbeat_kept(void **state)
{
    struct tm_cluster *c = *state;
    assert_int_equal(tm_cluster_up(c), 0);
    assert_int_equal(tm_heartbeat(c, 3000), KVP_OK);
    tm_sleep_ms(1400);
    assert_int_equal(tm_heartbeat(c, 3000), KVP_OK);
    for (int i = 0; i < 4; i++) {
        report_unreachable(c, c->segment_id);
        tm_sleep_ms(1400);
        assert_int_equal(tm_heartbeat(c, 3000), KVP_OK);
    }
    int leader = tm_leader(c, 5000);
    char needle[64];
    snprintf(needle, sizeof needle, "segment %u: probe failed", c->segment_id);
    assert_true(tm_log_has(c, leader, needle));
}

/* ------------------------------------------------------------------ per-writer RDMA fence */

struct fw_seen {
    uint64_t seq;       /* 0: no FenceWriter in the answer */
    uint64_t client_id;
    size_t n_writers;
    uint64_t w_id, w_mask; /* writers[0] */
};

/* One heartbeat of an RDMA segment (rdma_writers; fence_selectors as `selectors`) answering
 * FenceWriter `fenced`; what the leader's answer asked. */
static int rdma_beat(struct tm_cluster *c, uint32_t seg, bool selectors, uint64_t fenced, struct fw_seen *out)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__HeartbeatReq hb = KVP__HEARTBEAT_REQ__INIT;
    Kvp__Fenced fd = KVP__FENCED__INIT;
    hb.segment_id = seg;
    hb.rdma_writers = 1;
    hb.fence_selectors = selectors;
    fd.seq = fenced;
    hb.fenced = &fd;
    req.body_case = KVP__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    Kvp__Response *resp = NULL;
    memset(out, 0, sizeof *out);
    int rc = kvp_msession_call(c->ms, &req, 3000, &resp);
    if (rc == KVP_OK)
        rc = resp->status;
    if (rc == KVP_OK && resp->heartbeat && resp->heartbeat->fence_writer) {
        const Kvp__FenceWriter *fw = resp->heartbeat->fence_writer;
        out->seq = fw->seq;
        out->client_id = fw->client_id;
        out->n_writers = fw->n_writers;
        if (fw->n_writers && fw->writers[0]) {
            out->w_id = fw->writers[0]->client_id;
            out->w_mask = fw->writers[0]->mask;
        }
    }
    kvp_msession_response_free(resp);
    return rc;
}

/* PutStart of key on fake-seg, then PutRevoke naming (writer_id, writer_mask). */
static void put_and_revoke(struct tm_cluster *c, const char *key, uint64_t op, uint64_t writer_id, uint64_t writer_mask)
{
    kvp_msession_response_free(put_start_preferred(c, key, op, 30000));
    Kvp__Request rv_req = KVP__REQUEST__INIT;
    Kvp__PutRevokeReq rv = KVP__PUT_REVOKE_REQ__INIT;
    Kvp__PutRevokeItem ri = KVP__PUT_REVOKE_ITEM__INIT, *ris[1] = {&ri};
    ri.key = (char *)key;
    ri.op_id = op;
    rv.items = ris;
    rv.n_items = 1;
    rv.writer_id = writer_id;
    rv.writer_mask = writer_mask;
    rv_req.body_case = KVP__REQUEST__BODY_PUT_REVOKE;
    rv_req.put_revoke = &rv;
    Kvp__Response *resp = NULL;
    assert_int_equal(kvp_msession_call(c->ms, &rv_req, 5000, &resp), KVP_OK);
    assert_int_equal(resp->status, KVP_OK);
    kvp_msession_response_free(resp);
}

/* Segment seg (fence_selectors as `selectors`) answers FenceWriter seq: nothing more is asked. */
static void fence_answered(struct tm_cluster *c, uint32_t seg, bool selectors, uint64_t seq)
{
    struct fw_seen f;
    assert_int_equal(rdma_beat(c, seg, selectors, seq, &f), KVP_OK);
    assert_int_equal(f.seq, 0);
}

/* Whether `leader` still leads; else the round runs again (a new leader asks every segment for a
 * fence of every writer). */
static bool same_leader(struct tm_cluster *c, int leader, int round)
{
    if (tm_leader(c, 5000) == leader)
        return true;
    print_message("leader changed during round %d: again\n", round);
    return false;
}

/* The per-writer fence through the real leader (docs/rdma.md "Per-writer fence"): a PutRevoke
 * that names writer family A asks an RDMA segment whose heartbeat says fence_selectors to fence
 * A only (FenceWriter.writers, client_id 0), and a segment without the flag (an older build) to
 * fence every writer; a PutRevoke naming no writer (an older client) asks both for every writer.
 * A leader change in between asks every segment for a fence of every writer: the round is run
 * again (at most 3 rounds). */
static void test_master_rdma_fence_names_the_failed_writer(void **state)
{
    struct tm_cluster *c = *state;
    assert_int_equal(tm_cluster_up(c), 0);
    const uint64_t fam = 0xffffffff00000000ull, pa = 0x5eed000100000000ull;
    bool checked = false;
    for (int round = 0; round < 3 && !checked; round++) {
        char nn[32], no[32], key[32];
        snprintf(nn, sizeof nn, "rdma-new-%d", round);
        snprintf(no, sizeof no, "rdma-old-%d", round);
        uint32_t sn = mount_fake(c, nn), so = mount_fake(c, no);
        int leader = tm_leader(c, 5000);
        struct fw_seen f;
        /* first heard: a fence of every writer each, answered */
        for (int i = 0; i < 2; i++) {
            uint32_t seg = i ? so : sn;
            assert_int_equal(rdma_beat(c, seg, seg == sn, 0, &f), KVP_OK);
            assert_true(f.seq != 0);
            assert_int_equal(f.n_writers, 0);
            fence_answered(c, seg, seg == sn, f.seq);
        }
        assert_int_equal(tm_heartbeat(c, 3000), KVP_OK);
        snprintf(key, sizeof key, "fw-a-%d", round);
        put_and_revoke(c, key, 9100 + (uint64_t)round, pa, fam);
        struct fw_seen fn, fo;
        assert_int_equal(rdma_beat(c, sn, true, 0, &fn), KVP_OK);
        assert_int_equal(rdma_beat(c, so, false, 0, &fo), KVP_OK);
        if (!same_leader(c, leader, round))
            continue;
        assert_true(fn.seq != 0 && fo.seq != 0);
        assert_int_equal(fn.client_id, 0);
        assert_int_equal(fn.n_writers, 1);
        assert_int_equal(fn.w_id, pa);
        assert_int_equal(fn.w_mask, fam);
        assert_int_equal(fo.client_id, 0);
        assert_int_equal(fo.n_writers, 0);
        /* answered: nothing more asked */
        fence_answered(c, sn, true, fn.seq);
        fence_answered(c, so, false, fo.seq);
        /* an older client's PutRevoke (no writer): every writer on both */
        snprintf(key, sizeof key, "fw-o-%d", round);
        put_and_revoke(c, key, 9200 + (uint64_t)round, 0, 0);
        assert_int_equal(rdma_beat(c, sn, true, fn.seq, &fn), KVP_OK);
        assert_int_equal(rdma_beat(c, so, false, fo.seq, &fo), KVP_OK);
        if (!same_leader(c, leader, round))
            continue;
        assert_true(fn.seq != 0 && fo.seq != 0);
        assert_int_equal(fn.n_writers, 0);
        assert_int_equal(fo.n_writers, 0);
        checked = true;
    }
    assert_true(checked);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_master_soft_state_leases_revoke_liveness, setup, teardown),
        cmocka_unit_test_setup_teardown(test_master_put_start_too_many_items_invalid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_master_rdma_fence_names_the_failed_writer, setup, teardown),
        cmocka_unit_test(test_master_bad_members_exit_2),
        cmocka_unit_test_setup_teardown(test_master_reported_segment_with_slow_heartbeat_kept, setup, teardown),
        cmocka_unit_test_setup_teardown(test_master_joined_member_added_leads_then_removed, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
