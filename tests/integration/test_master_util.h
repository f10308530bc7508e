/*
 * test_master_util.h — helpers of the master integration tests (test_master_*.c): a real
 * three-master cluster started with `kvpoolctl cluster up` on free loopback ports, its
 * cluster.json, leader lookup, kill/stop/restart of members, metadata-only puts (PutStart +
 * PutEnd against a fake mounted segment: no data plane) and raw DEALER access for bad input.
 * Header-only (static functions): each test binary is one file. Every process started is
 * killed at the end, even when a test fails (teardown + atexit).
 */
#ifndef KVP_TEST_MASTER_UTIL_H
#define KVP_TEST_MASTER_UTIL_H

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <czmq.h>
#include <jansson.h>

#include "actors/session/msession.h"
#include "auth/auth.h"
#include "kvpool.h"
#include "runtime/proc.h"
#include "tests/lib/cluster_guard.h"
#include "tests/lib/proc_stop.h"
#include "wire/envelope.h"

/* Not every test file uses every helper. */
#pragma GCC diagnostic ignored "-Wunused-function"

#define TM_MASTERS 3

struct tm_cluster {
    char dir[256];
    char file[300];
    char ctl[512];
    bool up;
    int pids[TM_MASTERS + 1];          /* by master id */
    char addr[TM_MASTERS + 1][64];     /* control host:port by id */
    struct kvp_msession *ms;
    uint32_t segment_id;               /* the fake segment */
    uint64_t next_op;
};

static struct tm_cluster *tm_current; /* for the atexit safety net */
static bool tm_alive(int pid);

static uint64_t tm_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void tm_sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int tm_run(char *const argv[], bool quiet)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (quiet) {
            FILE *f = freopen("/dev/null", "w", stdout);
            (void)f;
        }
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int tm_load(struct tm_cluster *c)
{
    json_error_t e;
    json_t *j = json_load_file(c->file, 0, &e);
    if (!j)
        return -1;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(j, "masters"), i, m) {
        int id = (int)json_integer_value(json_object_get(m, "id"));
        if (id < 1 || id > TM_MASTERS)
            continue;
        c->pids[id] = (int)json_integer_value(json_object_get(m, "pid"));
        snprintf(c->addr[id], sizeof c->addr[id], "%s", json_string_value(json_object_get(m, "address")));
    }
    json_decref(j);
    return 0;
}

/* Kill every process of the cluster (SIGCONT first: stopped ones must die too) and remove DIR. */
static void tm_cluster_down(struct tm_cluster *c)
{
    if (!c || !c->up)
        return;
    kvp_msession_destroy(&c->ms);
    tm_load(c);
    for (int id = 1; id <= TM_MASTERS; id++)
        if (c->pids[id] > 0)
            kill(c->pids[id], SIGCONT);
    /* A clean stop (SIGTERM) exercises shutdown (and leak checks in sanitizer builds); whatever
     * is left after the grace period is SIGKILLed by `cluster down`, and again here. */
    char *argv[] = {c->ctl, "cluster", "down", "--dir", c->dir, "--grace-ms", "3000", NULL};
    tm_run(argv, true);
    for (int id = 1; id <= TM_MASTERS; id++)
        if (c->pids[id] > 0 && tm_alive(c->pids[id]))
            kill(c->pids[id], SIGKILL);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->dir);
    if (getenv("KVP_TEST_KEEP")) /* keep logs and data for a post-mortem */
        fprintf(stderr, "kept %s\n", c->dir);
    else if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", c->dir);
    c->up = false;
    tm_current = NULL;
}

static void tm_atexit(void)
{
    tm_cluster_down(tm_current);
}

/* `kvpoolctl cluster up --dir <tmp> --masters 3` (free ports). KVPOOL_* from the environment
 * reach the masters. Then a session and a fake segment of 4 GiB mounted. */
/* cluster.json of the cluster started last (tm_dealer takes its admin key). */
static char tm_cluster_file[400];

static int tm_cluster_up(struct tm_cluster *c)
{
    memset(c, 0, sizeof *c);
    const char *bd = getenv("KVP_BUILD_DIR");
    snprintf(c->ctl, sizeof c->ctl, "%s/tools/kvpoolctl", bd ? bd : ".");
    snprintf(c->dir, sizeof c->dir, "/tmp/kvp-master-test-XXXXXX");
    if (!mkdtemp(c->dir))
        return -1;
    snprintf(c->file, sizeof c->file, "%s/cluster.json", c->dir);
    c->up = true;
    c->next_op = ((uint64_t)getpid() << 32) | 1;
    tm_current = c;
    static bool registered;
    if (!registered) {
        atexit(tm_atexit);
        registered = true;
    }
    (void)kvp_test_cluster_guard(); /* its daemons die with this process, however it ends */
    char *argv[] = {c->ctl, "cluster", "up", "--dir", c->dir, "--masters", "3", NULL};
    int rc = tm_run(argv, false);
    if (rc != 0 || tm_load(c) != 0)
        return -1;
    const char *list[TM_MASTERS];
    for (int i = 0; i < TM_MASTERS; i++)
        list[i] = c->addr[i + 1];
    snprintf(tm_cluster_file, sizeof tm_cluster_file, "%s", c->file);
    struct kvp_auth_client *auth = NULL; /* the cluster's admin key (cluster.json "auth") */
    if (kvp_auth_client_load(&auth, NULL, NULL, NULL, c->file, "admin_key", "test") != KVP_OK ||
        kvp_msession_new_auth(&c->ms, list, TM_MASTERS, "test", &auth) != KVP_OK) {
        kvp_auth_client_destroy(&auth);
        return -1;
    }
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__MountSegmentReq m = KVP__MOUNT_SEGMENT_REQ__INIT;
    m.name = "fake-seg";
    m.host = "127.0.0.1";
    m.endpoint = "127.0.0.1:9";
    m.size = 4ull << 30;
    m.owner_pid = 1;
    req.body_case = KVP__REQUEST__BODY_MOUNT;
    req.mount = &m;
    Kvp__Response *resp = NULL;
    rc = kvp_msession_call(c->ms, &req, 10000, &resp);
    if (rc == KVP_OK && resp->status == KVP_OK && resp->mount)
        c->segment_id = resp->mount->segment_id;
    else
        rc = rc ? rc : resp->status;
    kvp_msession_response_free(resp);
    return rc == KVP_OK ? 0 : -1;
}

/* The leader's id from Members (0 when none answered within timeout_ms). */
static int tm_leader(struct tm_cluster *c, uint32_t timeout_ms)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__MembersReq mr = KVP__MEMBERS_REQ__INIT;
    req.body_case = KVP__REQUEST__BODY_MEMBERS;
    req.members = &mr;
    Kvp__Response *resp = NULL;
    int id = 0;
    if (kvp_msession_call(c->ms, &req, timeout_ms, &resp) == KVP_OK && resp->status == KVP_OK && resp->members)
        id = (int)resp->members->leader_id;
    kvp_msession_response_free(resp);
    return id;
}

static void tm_signal(struct tm_cluster *c, int id, int sig)
{
    tm_load(c);
    if (c->pids[id] > 0)
        kill(c->pids[id], sig);
}

/* SIGSTOP member id and return once every thread of it is stopped (kill() returns when the signal
 * is queued: tests/lib/proc_stop.h). False if it did not stop within 10 s. */
static bool tm_stop(struct tm_cluster *c, int id)
{
    tm_load(c);
    return c->pids[id] > 0 && kvp_test_stop_process(c->pids[id], 10000);
}

/* SIGKILL member id and wait until every thread of it has exited (a pidfd; not the leader's
 * 'Z', which shows while other threads still hold its ports: issue 15). */
static void tm_kill(struct tm_cluster *c, int id)
{
    tm_load(c);
    int pid = c->pids[id];
    if (pid <= 0)
        return;
    kill(pid, SIGKILL);
    if (kvp_proc_wait_gone(pid, 20000) != KVP_OK)
        fprintf(stderr, "tm_kill: master %d (pid %d) still has a live thread 20 s after SIGKILL\n", id, pid);
}

/* `kvpoolctl cluster restart --dir DIR ID`: the same command line, with its data. */
static int tm_restart(struct tm_cluster *c, int id)
{
    char ids[16];
    snprintf(ids, sizeof ids, "%d", id);
    char *argv[] = {c->ctl, "cluster", "restart", "--dir", c->dir, ids, NULL};
    int rc = tm_run(argv, true);
    tm_load(c);
    return rc;
}

/* Is pid still running (not exited, or a zombie leader whose other threads still run)? */
/* Does master id's log (DIR/master-<id>.log) hold a line containing needle? Read here, not by
 * system("grep ..."): under TSan, system() in this threaded process returned -1 (its spawn
 * failed) once in two runs of test_master_soft at load 25, failing the assert on a log line that
 * was there. */
static bool tm_log_has(const struct tm_cluster *c, int id, const char *needle)
{
    char path[320];
    snprintf(path, sizeof path, "%s/master-%d.log", c->dir, id);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char *line = NULL;
    size_t cap = 0;
    bool found = false;
    while (!found && getline(&line, &cap, f) >= 0)
        found = strstr(line, needle) != NULL;
    free(line);
    fclose(f);
    return found;
}

static bool tm_alive(int pid)
{
    return !kvp_proc_gone(pid);
}

static void tm_key(char *buf, size_t cap, const char *prefix, unsigned i)
{
    snprintf(buf, cap, "%s-%06u", prefix, i);
}

/* PutStart of one key (1 replica, 4096 bytes, op_id op, client host 127.0.0.1); preferred (NULL:
 * none) and ttl_ms (0: the master's put TTL) as PutStartReq has them. The call's error, else the
 * answer's status, else the item's. With out: the answer (free it with kvp_msession_response_free;
 * NULL when the call failed), else it is freed here. */
static inline int tm_put_start(struct tm_cluster *c, const char *key, uint64_t op, const char *preferred,
                               uint64_t ttl_ms, uint32_t timeout_ms, Kvp__Response **out)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__PutStartReq ps = KVP__PUT_START_REQ__INIT;
    Kvp__PutStartItem it = KVP__PUT_START_ITEM__INIT, *items[1] = {&it};
    it.key = (char *)key;
    it.size = 4096;
    it.replica_num = 1;
    it.op_id = op;
    it.client_host = "127.0.0.1";
    if (preferred)
        it.preferred_segment = (char *)preferred;
    ps.items = items;
    ps.n_items = 1;
    ps.ttl_ms = ttl_ms;
    req.body_case = KVP__REQUEST__BODY_PUT_START;
    req.put_start = &ps;
    Kvp__Response *resp = NULL;
    int rc = kvp_msession_call(c->ms, &req, timeout_ms, &resp);
    if (rc == KVP_OK)
        rc = resp->status ? resp->status
             : (resp->put_start && resp->put_start->n_results == 1) ? resp->put_start->results[0]->status
                                                                     : KVP_ERR_MALFORMED;
    if (out)
        *out = resp;
    else
        kvp_msession_response_free(resp);
    return rc;
}

/* One metadata put: PutStart (1 replica, 4096 bytes) then PutEnd. Returns KVP_OK only when
 * both were acknowledged OK; the session retries across failovers (same op_id). */
static int tm_put(struct tm_cluster *c, const char *key, uint32_t timeout_ms)
{
    uint64_t op = c->next_op++;
    int rc = tm_put_start(c, key, op, NULL, 0, timeout_ms, NULL);
    if (rc != KVP_OK)
        return rc;
    Kvp__Response *resp = NULL;
    Kvp__Request req2 = KVP__REQUEST__INIT;
    Kvp__PutEndReq pe = KVP__PUT_END_REQ__INIT;
    Kvp__PutEndItem e = KVP__PUT_END_ITEM__INIT, *eitems[1] = {&e};
    e.key = (char *)key;
    e.op_id = op;
    e.checksum = 0x1234;
    pe.items = eitems;
    pe.n_items = 1;
    req2.body_case = KVP__REQUEST__BODY_PUT_END;
    req2.put_end = &pe;
    rc = kvp_msession_call(c->ms, &req2, timeout_ms, &resp);
    if (rc == KVP_OK)
        rc = resp->status ? resp->status
             : (resp->put_end && resp->put_end->n_status == 1) ? resp->put_end->status[0]
                                                               : KVP_ERR_MALFORMED;
    kvp_msession_response_free(resp);
    return rc;
}

/* BatchExists over keys[0..n): returns how many exist (1), or a negative call error. */
static int tm_count_existing(struct tm_cluster *c, char **keys, size_t n, uint32_t timeout_ms)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__ExistsReq ex = KVP__EXISTS_REQ__INIT;
    ex.keys = keys;
    ex.n_keys = n;
    req.body_case = KVP__REQUEST__BODY_EXISTS;
    req.exists = &ex;
    Kvp__Response *resp = NULL;
    int rc = kvp_msession_call(c->ms, &req, timeout_ms, &resp);
    int count = 0;
    if (rc == KVP_OK && resp->status != KVP_OK)
        rc = resp->status;
    if (rc == KVP_OK && (!resp->exists || resp->exists->n_results != n))
        rc = KVP_ERR_MALFORMED;
    if (rc == KVP_OK)
        for (size_t i = 0; i < n; i++)
            count += resp->exists->results[i] == 1;
    kvp_msession_response_free(resp);
    return rc == KVP_OK ? count : rc;
}

/* GetReplicaList for one key: its status (OK with >= 1 replica and a lease, else an error). */
static int tm_get_replicas(struct tm_cluster *c, const char *key, uint32_t timeout_ms)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__GetReplicaListReq g = KVP__GET_REPLICA_LIST_REQ__INIT;
    char *keys[1] = {(char *)key};
    g.keys = keys;
    g.n_keys = 1;
    g.client_host = "127.0.0.1";
    req.body_case = KVP__REQUEST__BODY_GET_REPLICAS;
    req.get_replicas = &g;
    Kvp__Response *resp = NULL;
    int rc = kvp_msession_call(c->ms, &req, timeout_ms, &resp);
    if (rc == KVP_OK)
        rc = resp->status;
    if (rc == KVP_OK) {
        if (!resp->get_replicas || resp->get_replicas->n_objects != 1)
            rc = KVP_ERR_MALFORMED;
        else {
            Kvp__ObjectInfo *o = resp->get_replicas->objects[0];
            rc = o->status;
            if (rc == KVP_OK && (o->n_replicas < 1 || o->lease_ttl_ms == 0 || o->size != 4096))
                rc = KVP_ERR_INTERNAL;
        }
    }
    kvp_msession_response_free(resp);
    return rc;
}

/* One Heartbeat of segment id through ms: KVP_OK when answered ACTIVE, KVP_ERR_INTERNAL when
 * answered with another state, else the call's or the answer's error. */
static inline int tm_segment_heartbeat(struct kvp_msession *ms, uint32_t id, uint32_t timeout_ms)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__HeartbeatReq hb = KVP__HEARTBEAT_REQ__INIT;
    hb.segment_id = id;
    req.body_case = KVP__REQUEST__BODY_HEARTBEAT;
    req.heartbeat = &hb;
    Kvp__Response *resp = NULL;
    int rc = kvp_msession_call(ms, &req, timeout_ms, &resp);
    if (rc == KVP_OK)
        rc = resp->status;
    if (rc == KVP_OK && (!resp->heartbeat || resp->heartbeat->state != KVP__SEGMENT_STATE__SEGMENT_ACTIVE))
        rc = KVP_ERR_INTERNAL;
    kvp_msession_response_free(resp);
    return rc;
}

static int tm_heartbeat(struct tm_cluster *c, uint32_t timeout_ms)
{
    return tm_segment_heartbeat(c->ms, c->segment_id, timeout_ms);
}

/* A session of its own to the cluster's masters with its admin key (cluster.json "auth"), named
 * name in the masters' logs; NULL on failure. */
static inline struct kvp_msession *tm_admin_session(const struct tm_cluster *c, const char *name)
{
    const char *list[TM_MASTERS];
    for (int i = 0; i < TM_MASTERS; i++)
        list[i] = c->addr[i + 1];
    struct kvp_msession *ms = NULL;
    struct kvp_auth_client *auth = NULL;
    if (kvp_auth_client_load(&auth, NULL, NULL, NULL, c->file, "admin_key", name) != KVP_OK ||
        kvp_msession_new_auth(&ms, list, TM_MASTERS, name, &auth) != KVP_OK) {
        kvp_auth_client_destroy(&auth);
        return NULL;
    }
    return ms;
}

/* Segments that heartbeat on their own schedule, driven from one thread: segment ids[i] (i from
 * first, step by step, below n) is due at i * period_ms / n into each period, as independent
 * segments would spread themselves. Counts answers ACTIVE (ok), NOT_FOUND or another state
 * (not_active, may be NULL: then counted as failed) and other errors (failed), until *stop. */
struct tm_hb_driver {
    struct kvp_msession *ms;
    const uint32_t *ids;
    unsigned n, first, step;
    unsigned period_ms;
    uint32_t timeout_ms;
    _Atomic int *stop;
    _Atomic uint64_t *ok, *not_active, *failed;
};

static inline void tm_hb_drive(const struct tm_hb_driver *d)
{
    uint64_t t0 = tm_now_ms();
    unsigned step = d->step ? d->step : 1;
    for (uint64_t round = 0; !atomic_load(d->stop); round++) {
        for (unsigned i = d->first; i < d->n && !atomic_load(d->stop); i += step) {
            uint64_t due = t0 + round * d->period_ms + (uint64_t)i * d->period_ms / d->n;
            uint64_t now = tm_now_ms();
            if (due > now)
                tm_sleep_ms((unsigned)(due - now));
            int rc = tm_segment_heartbeat(d->ms, d->ids[i], d->timeout_ms);
            if (rc == KVP_OK)
                atomic_fetch_add(d->ok, 1);
            else if ((rc == KVP_ERR_INTERNAL || rc == KVP_ERR_NOT_FOUND) && d->not_active)
                atomic_fetch_add(d->not_active, 1);
            else
                atomic_fetch_add(d->failed, 1);
        }
    }
}

/* Mount n fake segments "<prefix>-NNN" of size bytes each at 127.0.0.1:<port0 + i> (nothing
 * listens there) through c->ms; their ids in ids[]. 0, or -1 after printing what failed. */
static inline int tm_mount_fake_segments(struct tm_cluster *c, const char *prefix, unsigned n, uint64_t size,
                                         unsigned port0, uint32_t *ids)
{
    for (unsigned i = 0; i < n; i++) {
        char name[64], ep[32];
        snprintf(name, sizeof name, "%s-%03u", prefix, i);
        snprintf(ep, sizeof ep, "127.0.0.1:%u", port0 + i);
        Kvp__Request req = KVP__REQUEST__INIT;
        Kvp__MountSegmentReq m = KVP__MOUNT_SEGMENT_REQ__INIT;
        m.name = name;
        m.host = "127.0.0.1";
        m.endpoint = ep;
        m.size = size;
        m.owner_pid = (uint64_t)getpid();
        req.body_case = KVP__REQUEST__BODY_MOUNT;
        req.mount = &m;
        Kvp__Response *resp = NULL;
        int rc = kvp_msession_call(c->ms, &req, 10000, &resp);
        if (rc != KVP_OK || resp->status != KVP_OK || !resp->mount) {
            printf("mount of %s: %s (status %d)\n", name, kvp_strerror(rc), resp ? resp->status : 0);
            kvp_msession_response_free(resp);
            return -1;
        }
        ids[i] = resp->mount->segment_id;
        kvp_msession_response_free(resp);
    }
    return 0;
}

/* utime + stime of a process, in clock ticks; 0 when /proc/PID/stat cannot be read. */
static inline uint64_t tm_proc_cpu_ticks(int pid)
{
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    unsigned long long ut = 0, st = 0;
    /* after ')': state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return 0;
    return ut + st;
}

/* Hand leadership to id and wait until it leads (Members says so). */
static int tm_transfer(struct tm_cluster *c, int id, uint32_t timeout_ms)
{
    uint64_t deadline = tm_now_ms() + timeout_ms;
    while (tm_now_ms() < deadline) {
        if (tm_leader(c, 2000) == id)
            return 0;
        Kvp__Request req = KVP__REQUEST__INIT;
        Kvp__TransferLeaderReq tl = KVP__TRANSFER_LEADER_REQ__INIT;
        tl.target_id = (uint64_t)id;
        req.body_case = KVP__REQUEST__BODY_TRANSFER_LEADER;
        req.transfer_leader = &tl;
        Kvp__Response *resp = NULL;
        kvp_msession_call(c->ms, &req, 3000, &resp);
        kvp_msession_response_free(resp);
        tm_sleep_ms(200);
    }
    return tm_leader(c, 2000) == id ? 0 : -1;
}

/* ------------------------------------------------------------------ raw access */

/* A DEALER straight to one master (no session: no retries, no rotation), with the admin key of
 * the cluster started last (cluster.json "auth"). */
static zsock_t *tm_dealer(const char *addr)
{
    zsock_t *d = zsock_new(ZMQ_DEALER);
    if (!d)
        return NULL;
    zsock_set_linger(d, 0);
    struct kvp_auth_client *auth = NULL;
    int arc = kvp_auth_client_load(&auth, NULL, NULL, NULL, tm_cluster_file, "admin_key", "test");
    if (arc == KVP_OK)
        arc = kvp_auth_client_apply(auth, zsock_resolve(d), addr);
    kvp_auth_client_destroy(&auth);
    if (arc != KVP_OK || zsock_connect(d, "tcp://%s", addr) != 0) {
        zsock_destroy(&d);
        return NULL;
    }
    return d;
}

/* Send an encoded request; wait up to timeout_ms for its reply. Returns the reply's status,
 * 1 when no reply came in time, or a negative code for a local failure. */
static int tm_raw_call(zsock_t *d, Kvp__Request *req, uint32_t timeout_ms, Kvp__Response **out)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    if (out)
        *out = NULL;
    int rc = kvp_wire_encode_request(req, &buf, &len);
    if (rc != KVP_OK)
        return rc;
    zframe_t *f = zframe_new(buf, len);
    free(buf);
    if (zframe_send(&f, d, 0) != 0)
        return KVP_ERR_IO;
    uint64_t deadline = tm_now_ms() + timeout_ms;
    zpoller_t *p = zpoller_new(d, NULL);
    int result = 1;
    while (tm_now_ms() < deadline) {
        void *which = zpoller_wait(p, (int)(deadline - tm_now_ms()));
        if (!which)
            break;
        zframe_t *r = zframe_recv(d);
        if (!r)
            break;
        Kvp__Response *resp = NULL;
        int drc = kvp_wire_decode_response(zframe_data(r), zframe_size(r), &resp);
        zframe_destroy(&r);
        if (drc != KVP_OK) {
            result = drc;
            break;
        }
        if (resp->req_id != req->req_id) {
            protobuf_c_message_free_unpacked(&resp->base, NULL);
            continue; /* a late reply to an earlier request */
        }
        result = resp->status;
        if (out)
            *out = resp;
        else
            protobuf_c_message_free_unpacked(&resp->base, NULL);
        break;
    }
    zpoller_destroy(&p);
    return result;
}

#endif
