/* test_raftlog_cluster.c — three real kvp_raftlog instances (libuv + TCP on loopback, data dirs
 * under a fresh /tmp directory) in one process: election, 1,000 commands applied everywhere,
 * queries (leader only), leader stop and re-election, restart of the stopped node from its
 * data dir catching up through a snapshot, leadership transfer. Real time is unavoidable here
 * (real sockets and disks); every wait is bounded and polls for a condition, no timing
 * assertions. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ftw.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvpool.h"
#include "raftlog/raftlog.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define N 3

struct counter {
    _Atomic uint64_t count; /* written by the raft thread, read by the test thread */
    _Atomic uint64_t sum;
    _Atomic uint64_t restores;
};

static int c_apply(void *ctx, const uint8_t *cmd, size_t len, uint8_t **res, size_t *res_len)
{
    struct counter *c = ctx;
    uint64_t v = 0;
    if (len != 8)
        return KVP_ERR_INVALID;
    memcpy(&v, cmd, 8);
    uint64_t n = atomic_fetch_add(&c->count, 1) + 1;
    atomic_fetch_add(&c->sum, v);
    *res = malloc(8);
    memcpy(*res, &n, 8);
    *res_len = 8;
    return KVP_OK;
}

static int c_query(void *ctx, const uint8_t *q, size_t len, uint8_t **res, size_t *res_len)
{
    struct counter *c = ctx;
    uint64_t n = atomic_load(&c->count);
    *res = malloc(8);
    memcpy(*res, &n, 8);
    *res_len = 8;
    return KVP_OK;
}

static int c_snapshot(void *ctx, uint8_t **buf, size_t *len)
{
    struct counter *c = ctx;
    uint64_t v[2] = {atomic_load(&c->count), atomic_load(&c->sum)};
    *buf = malloc(16);
    memcpy(*buf, v, 16);
    *len = 16;
    return KVP_OK;
}

static int c_restore(void *ctx, const uint8_t *buf, size_t len)
{
    struct counter *c = ctx;
    uint64_t v[2];
    if (len != 16)
        return KVP_ERR_MALFORMED;
    memcpy(v, buf, 16);
    atomic_store(&c->count, v[0]);
    atomic_store(&c->sum, v[1]);
    atomic_fetch_add(&c->restores, 1);
    return KVP_OK;
}

struct cluster {
    char dir[64];
    int ports[N];
    struct kvp_raftlog *rl[N];
    struct counter fsm[N];
    struct kvp_raftlog_params p[N];
};

/* A loopback port that is free now, below the ephemeral range (so outgoing connections of
 * this or other tests do not take it between the probe and raft's bind): a pid-derived start,
 * probed upwards. */
static int free_port(void)
{
    static int next;
    if (next == 0)
        next = 20000 + (int)(((unsigned)getpid() * 37u) % 10000u);
    for (int tries = 0; tries < 2000; tries++) {
        int port = next++;
        if (next >= 32000)
            next = 20000;
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                .sin_port = htons((uint16_t)port)};
        int ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
        close(fd);
        if (ok)
            return port;
    }
    fail_msg("no free port");
    return -1;
}

static void node_start(struct cluster *c, int i)
{
    memset(&c->fsm[i], 0, sizeof(c->fsm[i]));
    assert_int_equal(kvp_raftlog_start(&c->rl[i], &c->p[i]), KVP_OK);
}

static struct cluster *g_cluster; /* for the teardown after a failed assertion */
static bool cluster_try_start(struct cluster *c);
static struct kvp_raftlog *g_joiner;
static bool g_batch_applied; /* params.batch_applied of the next cluster_new */

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw);

static struct cluster *cluster_new(void)
{
    struct cluster *c = calloc(1, sizeof(*c));
    g_cluster = c;
    snprintf(c->dir, sizeof(c->dir), "/tmp/kvp-raftlog-XXXXXX");
    assert_non_null(mkdtemp(c->dir));
    for (int attempt = 0;; attempt++) {
        for (int i = 0; i < N; i++)
            c->ports[i] = free_port();
        if (cluster_try_start(c))
            break;
        /* a port was taken between the probe and the bind: start over with fresh ports */
        for (int i = 0; i < N; i++)
            kvp_raftlog_stop(&c->rl[i]);
        nftw(c->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        assert_int_equal(mkdir(c->dir, 0700), 0);
        assert_true(attempt < 5);
    }
    return c;
}

static bool cluster_try_start(struct cluster *c)
{
    char dir[64];
    memcpy(dir, c->dir, sizeof(dir));
    for (int i = 0; i < N; i++) {
        struct kvp_raftlog_params *p = &c->p[i];
        p->id = (uint64_t)i + 1;
        snprintf(p->raft_address, sizeof(p->raft_address), "127.0.0.1:%d", c->ports[i]);
        snprintf(p->data_dir, sizeof(p->data_dir), "%s/n%d", dir, i + 1);
        for (int j = 0; j < N; j++) {
            p->members[j].id = (uint64_t)j + 1;
            snprintf(p->members[j].raft_address, sizeof(p->members[j].raft_address),
                     "127.0.0.1:%d", c->ports[j]);
        }
        p->n_members = N;
        p->election_timeout_ms = 300;
        p->heartbeat_ms = 50;
        p->snapshot_threshold = 64;
        p->snapshot_trailing = 16;
        p->group_commit_max = 64;
        p->segment_size_bytes = 64 * 1024;
        p->batch_applied = g_batch_applied;
        p->fsm = (struct kvp_raftlog_fsm){.ctx = &c->fsm[i], .apply = c_apply, .query = c_query,
                                          .snapshot = c_snapshot, .restore = c_restore};
    }
    for (int i = 0; i < N; i++) {
        memset(&c->fsm[i], 0, sizeof(c->fsm[i]));
        if (kvp_raftlog_start(&c->rl[i], &c->p[i]) != KVP_OK)
            return false;
    }
    return true;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void cluster_free(struct cluster *c)
{
    for (int i = 0; i < N; i++)
        kvp_raftlog_stop(&c->rl[i]);
    nftw(c->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    int gone = access(c->dir, F_OK) != 0;
    free(c);
    g_cluster = NULL;
    assert_true(gone);
}

static int teardown(void **state)
{
    (void)state;
    kvp_raftlog_stop(&g_joiner);
    if (g_cluster != NULL)
        cluster_free(g_cluster);
    return 0;
}

/* Wait (bounded) for a live node that leads in a term > min_term; returns its index or -1. */
static int wait_leader(struct cluster *c, uint64_t min_term, int timeout_ms)
{
    uint64_t end = kvp_clock_now_ms() + (uint64_t)timeout_ms;
    while (kvp_clock_now_ms() < end) {
        for (int i = 0; i < N; i++) {
            if (c->rl[i] == NULL)
                continue;
            struct kvp_raftlog_info in;
            kvp_raftlog_get_info(c->rl[i], &in);
            if (in.is_leader && in.term > min_term)
                return i;
        }
        usleep(10000);
    }
    return -1;
}

static bool wait_count(struct counter *f, uint64_t want, int timeout_ms)
{
    uint64_t end = kvp_clock_now_ms() + (uint64_t)timeout_ms;
    while (atomic_load(&f->count) < want && kvp_clock_now_ms() < end)
        usleep(10000);
    return atomic_load(&f->count) == want;
}

struct ev {
    int kind;
    uint64_t corr;
    int status;
    uint64_t val;
};

static uint64_t le64(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n && i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Read one event (any kind) within timeout_ms; false on timeout. */
static bool read_ev(struct kvp_raftlog *rl, struct ev *e, int timeout_ms)
{
    zsock_t *s = kvp_raftlog_events(rl);
    zsock_set_rcvtimeo(s, timeout_ms);
    zmsg_t *m = zmsg_recv(s);
    if (m == NULL)
        return false;
    assert_int_equal(zmsg_size(m), 4);
    zframe_t *f0 = zmsg_first(m), *f1 = zmsg_next(m), *f2 = zmsg_next(m), *f3 = zmsg_next(m);
    assert_int_equal(zframe_size(f0), 1);
    assert_int_equal(zframe_size(f1), 8);
    assert_int_equal(zframe_size(f2), 4);
    e->kind = zframe_data(f0)[0];
    e->corr = le64(zframe_data(f1), 8);
    e->status = (int32_t)(uint32_t)le64(zframe_data(f2), 4);
    e->val = zframe_size(f3) == 8 ? le64(zframe_data(f3), 8) : 0;
    zmsg_destroy(&m);
    return true;
}

/* Read events until one of `kind` (and corr, unless corr == 0) arrives. */
static bool wait_ev(struct kvp_raftlog *rl, int kind, uint64_t corr, struct ev *e, int timeout_ms)
{
    uint64_t end = kvp_clock_now_ms() + (uint64_t)timeout_ms;
    while (kvp_clock_now_ms() < end) {
        if (read_ev(rl, e, 100) && e->kind == kind && (corr == 0 || e->corr == corr))
            return true;
    }
    return false;
}

/* Submit values corr_base.. (value = corr) keeping `window` in flight; all must apply OK. */
static void submit_all(struct kvp_raftlog *rl, uint64_t corr_base, unsigned n, unsigned window)
{
    unsigned sent = 0, done = 0;
    uint64_t end = kvp_clock_now_ms() + 30000;
    while (done < n) {
        while (sent < n && sent - done < window) {
            uint64_t v = corr_base + sent;
            assert_int_equal(kvp_raftlog_submit(rl, v, (const uint8_t *)&v, 8), KVP_OK);
            sent++;
        }
        struct ev e;
        assert_true(kvp_clock_now_ms() < end);
        if (!read_ev(rl, &e, 200) || e.kind != KVP_RAFTLOG_EV_APPLIED)
            continue;
        assert_int_equal(e.status, KVP_OK);
        assert_true(e.corr >= corr_base && e.corr < corr_base + n);
        assert_true(e.val >= 1);
        done++;
    }
}

static void test_raftlog_cluster_failover_restart_catches_up(void **state)
{
    (void)state;
    kvp_log_set_level(KVP_LOG_WARN);
    struct cluster *c = cluster_new();

    int l = wait_leader(c, 0, 10000);
    assert_true(l >= 0);
    struct ev e;
    assert_true(wait_ev(c->rl[l], KVP_RAFTLOG_EV_LEADER, 0, &e, 5000) || true);

    /* 1,000 commands through the leader, 32 in flight: all three apply all of them */
    submit_all(c->rl[l], 1, 1000, 32);
    for (int i = 0; i < N; i++) {
        assert_true(wait_count(&c->fsm[i], 1000, 10000));
        assert_int_equal(atomic_load(&c->fsm[i].sum), 1000 * 1001 / 2);
    }
    struct kvp_raftlog_info in;
    kvp_raftlog_get_info(c->rl[l], &in);
    assert_int_equal(in.cmds_proposed, 1000);
    assert_true(in.entries_proposed >= 1 && in.entries_proposed <= 1000);
    /* the latency counters cover every one of the leader's commands (info: next 20 ms tick) */
    uint64_t cnt_end = kvp_clock_now_ms() + 2000;
    while (in.cmds_committed < 1000 && kvp_clock_now_ms() < cnt_end) {
        usleep(10000);
        kvp_raftlog_get_info(c->rl[l], &in);
    }
    assert_int_equal(in.cmds_committed, 1000);
    assert_true(in.entries_stored <= in.entries_proposed);
    assert_int_equal(in.n_members, 3);
    assert_int_equal(in.leader_id, (uint64_t)l + 1);

    /* a query runs on the leader only */
    assert_int_equal(kvp_raftlog_query(c->rl[l], 77, NULL, 0), KVP_OK);
    assert_true(wait_ev(c->rl[l], KVP_RAFTLOG_EV_QUERY, 77, &e, 5000));
    assert_int_equal(e.status, KVP_OK);
    assert_int_equal(e.val, 1000);
    int f = (l + 1) % N;
    assert_int_equal(kvp_raftlog_query(c->rl[f], 78, NULL, 0), KVP_OK);
    assert_true(wait_ev(c->rl[f], KVP_RAFTLOG_EV_QUERY, 78, &e, 5000));
    assert_int_equal(e.status, KVP_ERR_NOT_LEADER);
    /* a local read: on the leader (its barrier has applied), with the state under the lock;
     * never on a follower */
    int lr = KVP_ERR_NOT_LEADER;
    for (uint64_t t_end = kvp_clock_now_ms() + 2000; lr != KVP_OK && kvp_clock_now_ms() < t_end;)
        if ((lr = kvp_raftlog_read_begin(c->rl[l])) != KVP_OK)
            usleep(5000);
    assert_int_equal(lr, KVP_OK);
    assert_int_equal(atomic_load(&c->fsm[l].count), 1000);
    kvp_raftlog_read_end(c->rl[l]);
    assert_int_equal(kvp_raftlog_read_begin(c->rl[f]), KVP_ERR_NOT_LEADER);
    assert_int_equal(kvp_raftlog_read_begin(NULL), KVP_ERR_INVALID);
    /* a submit to a follower fails NOT_LEADER */
    uint64_t v = 5;
    assert_int_equal(kvp_raftlog_submit(c->rl[f], 79, (const uint8_t *)&v, 8), KVP_OK);
    assert_true(wait_ev(c->rl[f], KVP_RAFTLOG_EV_APPLIED, 79, &e, 5000));
    assert_int_equal(e.status, KVP_ERR_NOT_LEADER);

    /* stop the leader: a new one is elected and commits */
    uint64_t old_term = in.term;
    int stopped = l;
    kvp_raftlog_stop(&c->rl[l]);
    assert_null(c->rl[stopped]);
    l = wait_leader(c, old_term, 10000);
    assert_true(l >= 0 && l != stopped);
    /* one at a time: 200 entries, enough for the leader to snapshot and compact its log */
    submit_all(c->rl[l], 2001, 200, 1);
    for (int i = 0; i < N; i++)
        if (i != stopped)
            assert_true(wait_count(&c->fsm[i], 1200, 10000));
    kvp_raftlog_get_info(c->rl[l], &in);
    assert_true(in.snapshots_taken >= 1);

    /* restart the stopped node from its data dir with an empty FSM: it catches up */
    node_start(c, stopped);
    assert_true(wait_count(&c->fsm[stopped], 1200, 20000));
    uint64_t want_sum = 1000 * 1001 / 2 + (2001 + 2200) * 200 / 2;
    assert_int_equal(atomic_load(&c->fsm[stopped].sum), want_sum);
    assert_true(atomic_load(&c->fsm[stopped].restores) >= 1);
    /* kvp_raftlog_get_info is refreshed on the raft thread's 20 ms tick: a snapshot installed
     * by the leader just now shows up there at the next tick (failed once under ASan) */
    uint64_t info_end = kvp_clock_now_ms() + 2000;
    do {
        kvp_raftlog_get_info(c->rl[stopped], &in);
        if (in.snapshots_restored < 1)
            usleep(10000);
    } while (in.snapshots_restored < 1 && kvp_clock_now_ms() < info_end);
    assert_true(in.snapshots_restored >= 1);

    /* leadership transfer to the restarted node */
    assert_int_equal(kvp_raftlog_transfer(c->rl[l], 90, (uint64_t)stopped + 1), KVP_OK);
    assert_true(wait_ev(c->rl[l], KVP_RAFTLOG_EV_ADMIN, 90, &e, 10000));
    assert_int_equal(e.status, KVP_OK);
    /* The old leader reported the handover: it no longer vouches for local reads (the new
     * leader may commit from now on, so a read here could miss a committed write). */
    assert_int_equal(kvp_raftlog_read_begin(c->rl[l]), KVP_ERR_NOT_LEADER);
    uint64_t end = kvp_clock_now_ms() + 5000;
    do {
        kvp_raftlog_get_info(c->rl[stopped], &in);
        if (!in.is_leader)
            usleep(10000);
    } while (!in.is_leader && kvp_clock_now_ms() < end);
    assert_true(in.is_leader);
    /* the node that handed leadership over stops answering local reads (at most two ticks
     * after its raft thread saw the change; 2 s is only the test's patience) */
    lr = KVP_OK;
    for (uint64_t t_end = kvp_clock_now_ms() + 2000; lr == KVP_OK && kvp_clock_now_ms() < t_end;) {
        if ((lr = kvp_raftlog_read_begin(c->rl[l])) == KVP_OK) {
            kvp_raftlog_read_end(c->rl[l]);
            usleep(5000);
        }
    }
    assert_int_equal(lr, KVP_ERR_NOT_LEADER);
    submit_all(c->rl[stopped], 5001, 10, 10);
    for (int i = 0; i < N; i++)
        assert_true(wait_count(&c->fsm[i], 1210, 10000));

    cluster_free(c);
}

static void test_raftlog_cluster_stop_with_pending_safe(void **state)
{
    (void)state;
    kvp_log_set_level(KVP_LOG_WARN);
    struct cluster *c = cluster_new();
    int l = wait_leader(c, 0, 10000);
    assert_true(l >= 0);
    /* stop every node with submissions queued and in flight: no crash, no leak (ASan) */
    for (uint64_t i = 1; i <= 500; i++)
        assert_int_equal(kvp_raftlog_submit(c->rl[l], i, (const uint8_t *)&i, 8), KVP_OK);
    struct kvp_raftlog *keep = c->rl[l];
    c->rl[l] = NULL;
    kvp_raftlog_stop(&keep);
    assert_null(keep);
    kvp_raftlog_stop(&keep); /* NULL is accepted */
    cluster_free(c);
}

static void test_raftlog_cluster_add_remove_voter_applied(void **state)
{
    (void)state;
    kvp_log_set_level(KVP_LOG_WARN);
    struct cluster *c = cluster_new();
    int l = wait_leader(c, 0, 10000);
    assert_true(l >= 0);
    submit_all(c->rl[l], 1, 20, 20);

    /* a fourth node starts empty with join = true and is added as a voter */
    static struct counter fsm4;
    memset(&fsm4, 0, sizeof(fsm4));
    struct kvp_raftlog_params p = c->p[0];
    p.id = 4;
    p.join = true;
    p.n_members = 0;
    snprintf(p.raft_address, sizeof(p.raft_address), "127.0.0.1:%d", free_port());
    char dir[64];
    memcpy(dir, c->dir, sizeof(dir));
    snprintf(p.data_dir, sizeof(p.data_dir), "%s/n4", dir);
    p.fsm.ctx = &fsm4;
    assert_int_equal(kvp_raftlog_start(&g_joiner, &p), KVP_OK);
    struct ev e;
    assert_int_equal(kvp_raftlog_add_voter(c->rl[l], 40, 4, p.raft_address), KVP_OK);
    assert_true(wait_ev(c->rl[l], KVP_RAFTLOG_EV_ADMIN, 40, &e, 15000));
    assert_int_equal(e.status, KVP_OK);
    /* adding it again at the same address (a retry whose first answer was lost) is done at
     * once; at another address it is refused */
    assert_int_equal(kvp_raftlog_add_voter(c->rl[l], 41, 4, p.raft_address), KVP_OK);
    assert_true(wait_ev(c->rl[l], KVP_RAFTLOG_EV_ADMIN, 41, &e, 5000));
    assert_int_equal(e.status, KVP_OK);
    char other[64];
    snprintf(other, sizeof other, "127.0.0.1:%d", free_port());
    assert_int_equal(kvp_raftlog_add_voter(c->rl[l], 45, 4, other), KVP_OK);
    assert_true(wait_ev(c->rl[l], KVP_RAFTLOG_EV_ADMIN, 45, &e, 5000));
    assert_int_equal(e.status, KVP_ERR_INVALID);
    submit_all(c->rl[l], 100, 10, 10);
    assert_true(wait_count(&fsm4, 30, 10000));
    struct kvp_raftlog_info in;
    kvp_raftlog_get_info(c->rl[l], &in);
    usleep(50000);
    kvp_raftlog_get_info(c->rl[l], &in);
    assert_int_equal(in.n_members, 4);

    /* remove it again; removing an unknown id is INVALID; admin on a follower NOT_LEADER */
    assert_int_equal(kvp_raftlog_remove(c->rl[l], 42, 4), KVP_OK);
    assert_true(wait_ev(c->rl[l], KVP_RAFTLOG_EV_ADMIN, 42, &e, 10000));
    assert_int_equal(e.status, KVP_OK);
    assert_int_equal(kvp_raftlog_remove(c->rl[l], 43, 99), KVP_OK);
    assert_true(wait_ev(c->rl[l], KVP_RAFTLOG_EV_ADMIN, 43, &e, 5000));
    assert_int_equal(e.status, KVP_ERR_INVALID);
    int f = (l + 1) % N;
    assert_int_equal(kvp_raftlog_transfer(c->rl[f], 44, 0), KVP_OK);
    assert_true(wait_ev(c->rl[f], KVP_RAFTLOG_EV_ADMIN, 44, &e, 5000));
    assert_int_equal(e.status, KVP_ERR_NOT_LEADER);
    usleep(50000);
    kvp_raftlog_get_info(c->rl[l], &in);
    assert_int_equal(in.n_members, 3);
    kvp_raftlog_stop(&g_joiner);
    cluster_free(c);
}

/* Leadership moves away while 64 commands are in flight: every submit still gets exactly one
 * APPLIED event, KVP_OK or KVP_ERR_NOT_LEADER, and every OK command is in every FSM. */
static void test_raftlog_cluster_leadership_loss_one_event_each(void **state)
{
    (void)state;
    kvp_log_set_level(KVP_LOG_WARN);
    struct cluster *c = cluster_new();
    int l = wait_leader(c, 0, 10000);
    assert_true(l >= 0);
    enum { TOTAL = 600, WINDOW = 64 };
    static uint8_t seen[TOTAL + 1];
    memset(seen, 0, sizeof(seen));
    unsigned sent = 0, done = 0, ok = 0, not_leader = 0;
    bool transferred = false, moved = false;
    uint64_t end = kvp_clock_now_ms() + 30000;
    while (done < TOTAL) {
        assert_true(kvp_clock_now_ms() < end);
        /* between the transfer request and its result, send nothing new: once it has moved,
         * the rest goes to a node that no longer leads */
        while (sent < TOTAL && sent - done < WINDOW && (!transferred || moved)) {
            uint64_t v = ++sent;
            assert_int_equal(kvp_raftlog_submit(c->rl[l], v, (const uint8_t *)&v, 8), KVP_OK);
        }
        if (!transferred && done >= 100) {
            assert_int_equal(kvp_raftlog_transfer(c->rl[l], 1000000, 0), KVP_OK);
            transferred = true;
        }
        struct ev e;
        if (!read_ev(c->rl[l], &e, 200))
            continue;
        if (e.kind == KVP_RAFTLOG_EV_ADMIN) {
            assert_int_equal(e.corr, 1000000);
            assert_int_equal(e.status, KVP_OK);
            moved = true;
        }
        if (e.kind != KVP_RAFTLOG_EV_APPLIED)
            continue;
        assert_true(e.corr >= 1 && e.corr <= TOTAL);
        assert_int_equal(seen[e.corr], 0); /* exactly one event per submit */
        seen[e.corr] = 1;
        assert_true(e.status == KVP_OK || e.status == KVP_ERR_NOT_LEADER);
        if (e.status == KVP_OK)
            ok++;
        else
            not_leader++;
        done++;
    }
    assert_int_equal(ok + not_leader, TOTAL);
    assert_true(not_leader > 0); /* the old leader did refuse work once it stopped leading */
    /* whatever was acknowledged is applied everywhere; NOT_LEADER ones may or may not be */
    int nl = -1;
    for (uint64_t t_end = kvp_clock_now_ms() + 10000; nl < 0 && kvp_clock_now_ms() < t_end;) {
        for (int i = 0; i < N; i++) {
            struct kvp_raftlog_info in;
            kvp_raftlog_get_info(c->rl[i], &in);
            if (i != l && in.is_leader)
                nl = i;
        }
        if (nl < 0)
            usleep(10000);
    }
    assert_true(nl >= 0);
    uint64_t extra = 7;
    assert_int_equal(kvp_raftlog_submit(c->rl[nl], 999999, (const uint8_t *)&extra, 8), KVP_OK);
    struct ev e;
    assert_true(wait_ev(c->rl[nl], KVP_RAFTLOG_EV_APPLIED, 999999, &e, 10000));
    assert_int_equal(e.status, KVP_OK);
    uint64_t applied = atomic_load(&c->fsm[nl].count);
    assert_true(applied >= (uint64_t)ok + 1 && applied <= TOTAL + 1);
    for (int i = 0; i < N; i++)
        assert_true(wait_count(&c->fsm[i], applied, 10000));
    cluster_free(c);
}

static void test_raftlog_cluster_bad_params_invalid(void **state)
{
    (void)state;
    kvp_log_set_level(KVP_LOG_ERROR);
    struct kvp_raftlog *rl = NULL;
    struct kvp_raftlog_params p;
    memset(&p, 0, sizeof(p));
    assert_int_equal(kvp_raftlog_start(&rl, &p), KVP_ERR_INVALID);
    p.id = 1;
    snprintf(p.raft_address, sizeof(p.raft_address), "127.0.0.1:1");
    snprintf(p.data_dir, sizeof(p.data_dir), "/tmp/unused");
    assert_int_equal(kvp_raftlog_start(&rl, &p), KVP_ERR_INVALID); /* no fsm.apply */
    p.fsm.apply = c_apply;
    assert_int_equal(kvp_raftlog_start(&rl, &p), KVP_ERR_INVALID); /* no members, not join */
    p.n_members = 1;
    p.members[0].id = 1;
    snprintf(p.members[0].raft_address, sizeof(p.members[0].raft_address), "127.0.0.1:1");
    snprintf(p.data_dir, sizeof(p.data_dir), "/proc/no-such-dir/x");
    assert_int_equal(kvp_raftlog_start(&rl, &p), KVP_ERR_IO);
    assert_null(rl);
    assert_int_equal(kvp_raftlog_submit(NULL, 1, NULL, 0), KVP_ERR_INVALID);
}

/* Leadership handed over five times in a row. Each time, once the old leader has reported the
 * handover (its ADMIN event), it must refuse local reads: the new leader commits a write, and a
 * local read on the old one may then never show a state without it. Before the permission
 * followed raft's state (it was refreshed only every 20 ms tick), a read here was allowed for
 * up to 40 ms after the handover and saw the old count. */
static void test_raftlog_cluster_transfer_ends_local_reads(void **state)
{
    (void)state;
    kvp_log_set_level(KVP_LOG_WARN);
    struct cluster *c = cluster_new();
    int l = wait_leader(c, 0, 10000);
    assert_true(l >= 0);
    submit_all(c->rl[l], 1, 10, 10);
    uint64_t want = 10;
    struct ev e;
    for (int round = 0; round < 5; round++) {
        int lr = KVP_ERR_NOT_LEADER;
        for (uint64_t t_end = kvp_clock_now_ms() + 5000; lr != KVP_OK && kvp_clock_now_ms() < t_end;)
            if ((lr = kvp_raftlog_read_begin(c->rl[l])) != KVP_OK)
                usleep(2000);
        assert_int_equal(lr, KVP_OK); /* the leader's barrier applied: it reads locally */
        assert_int_equal(atomic_load(&c->fsm[l].count), want);
        kvp_raftlog_read_end(c->rl[l]);

        int t = (l + 1) % N;
        uint64_t corr = 100 + (uint64_t)round;
        assert_int_equal(kvp_raftlog_transfer(c->rl[l], corr, (uint64_t)t + 1), KVP_OK);
        assert_true(wait_ev(c->rl[l], KVP_RAFTLOG_EV_ADMIN, corr, &e, 10000));
        assert_int_equal(e.status, KVP_OK);
        assert_int_equal(kvp_raftlog_read_begin(c->rl[l]), KVP_ERR_NOT_LEADER);

        /* a write committed by the new leader; the old one still refuses (or, were it to
         * answer, would have to show the write) */
        submit_all(c->rl[t], 1000 + 10 * (uint64_t)round, 1, 1);
        want++;
        if (kvp_raftlog_read_begin(c->rl[l]) == KVP_OK) {
            uint64_t seen = atomic_load(&c->fsm[l].count);
            kvp_raftlog_read_end(c->rl[l]);
            fail_msg("round %d: old leader %d still reads locally (count %llu, committed %llu)", round,
                     l, (unsigned long long)seen, (unsigned long long)want);
        }
        for (int i = 0; i < N; i++)
            assert_true(wait_count(&c->fsm[i], want, 10000));
        l = t;
    }
    cluster_free(c);
}

/* params.batch_applied: every submit's result arrives exactly once, inside an EV_APPLIED_BATCH
 * (never as a lone EV_APPLIED), each batch holds as many records as its corr says, and the
 * results come in apply order (the FSM's running count rises by one from record to record). */
static void test_raftlog_cluster_batch_applied_each_result_once(void **state)
{
    (void)state;
    kvp_log_set_level(KVP_LOG_WARN);
    g_batch_applied = true;
    struct cluster *c = cluster_new();
    g_batch_applied = false;
    int l = wait_leader(c, 0, 10000);
    assert_true(l >= 0);
    enum { TOTAL = 400, WINDOW = 64 };
    static uint8_t seen[TOTAL + 1];
    memset(seen, 0, sizeof(seen));
    unsigned sent = 0, done = 0;
    uint64_t last_val = 0;
    zsock_t *s = kvp_raftlog_events(c->rl[l]);
    zsock_set_rcvtimeo(s, 200);
    uint64_t end = kvp_clock_now_ms() + 30000;
    while (done < TOTAL) {
        assert_true(kvp_clock_now_ms() < end);
        while (sent < TOTAL && sent - done < WINDOW) {
            uint64_t v = ++sent;
            assert_int_equal(kvp_raftlog_submit(c->rl[l], v, (const uint8_t *)&v, 8), KVP_OK);
        }
        zmsg_t *m = zmsg_recv(s);
        if (m == NULL)
            continue;
        assert_int_equal(zmsg_size(m), 4);
        zframe_t *f0 = zmsg_first(m), *f1 = zmsg_next(m), *f2 = zmsg_next(m), *f3 = zmsg_next(m);
        int kind = zframe_data(f0)[0];
        assert_int_not_equal(kind, KVP_RAFTLOG_EV_APPLIED);
        if (kind == KVP_RAFTLOG_EV_APPLIED_BATCH) {
            uint64_t n = le64(zframe_data(f1), 8), got = 0;
            assert_int_equal(le64(zframe_data(f2), 4), 0);
            size_t pos = 0, rl = 0;
            uint64_t corr = 0;
            int32_t st = 0;
            const uint8_t *res = NULL;
            int r;
            while ((r = kvp_raftlog_applied_next(zframe_data(f3), zframe_size(f3), &pos, &corr, &st, &res, &rl)) ==
                   1) {
                assert_true(corr >= 1 && corr <= TOTAL);
                assert_int_equal(seen[corr], 0);
                seen[corr] = 1;
                assert_int_equal(st, KVP_OK);
                assert_int_equal(rl, 8);
                uint64_t val = le64(res, 8);
                assert_int_equal(val, last_val + 1);
                last_val = val;
                got++;
                done++;
            }
            assert_int_equal(r, 0);
            assert_true(n >= 1);
            assert_int_equal(got, n);
        }
        zmsg_destroy(&m);
    }
    for (unsigned i = 1; i <= TOTAL; i++)
        assert_int_equal(seen[i], 1);
    cluster_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_raftlog_cluster_bad_params_invalid),
        cmocka_unit_test_teardown(test_raftlog_cluster_stop_with_pending_safe, teardown),
        cmocka_unit_test_teardown(test_raftlog_cluster_failover_restart_catches_up, teardown),
        cmocka_unit_test_teardown(test_raftlog_cluster_add_remove_voter_applied, teardown),
        cmocka_unit_test_teardown(test_raftlog_cluster_leadership_loss_one_event_each, teardown),
        cmocka_unit_test_teardown(test_raftlog_cluster_transfer_ends_local_reads, teardown),
        cmocka_unit_test_teardown(test_raftlog_cluster_batch_applied_each_result_once, teardown),
    };
    if (getenv("KVP_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("KVP_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
