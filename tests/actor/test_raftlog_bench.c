/* test_raftlog_bench.c — commands/s through a single-node raftlog with 1 and with 64 submitter
 * threads (each keeps one command in flight and waits for its result), to show group commit.
 * Not a ctest (it prints figures, it asserts nothing about speed). Usage:
 *   raftlog_bench [data-parent-dir] [seconds-per-run]
 * The data dir is created under data-parent-dir (default: the current directory; use an
 * ordinary disk, not tmpfs) and removed afterwards. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ftw.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvpool.h"
#include "raftlog/raftlog.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define MAX_THREADS 64

static _Atomic uint64_t g_applied;

static int c_apply(void *ctx, const uint8_t *cmd, size_t len, uint8_t **res, size_t *res_len)
{
    atomic_fetch_add_explicit(&g_applied, 1, memory_order_relaxed);
    return KVP_OK;
}

struct submitter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    uint64_t count;
};

static struct submitter g_sub[MAX_THREADS];
static struct kvp_raftlog *g_rl;
static _Atomic bool g_reader_stop;
static uint64_t g_end_ms;

static void *reader_main(void *arg)
{
    zsock_t *s = kvp_raftlog_events(g_rl);
    zsock_set_rcvtimeo(s, 100);
    while (!atomic_load(&g_reader_stop)) {
        zmsg_t *m = zmsg_recv(s);
        if (m == NULL)
            continue;
        zframe_t *f0 = zmsg_first(m), *f1 = zmsg_next(m), *f2 = zmsg_next(m);
        if (zframe_data(f0)[0] == KVP_RAFTLOG_EV_APPLIED) {
            uint64_t corr = 0;
            int32_t st = 0;
            memcpy(&corr, zframe_data(f1), 8); /* little-endian host */
            memcpy(&st, zframe_data(f2), 4);
            struct submitter *u = &g_sub[corr >> 32];
            pthread_mutex_lock(&u->mu);
            u->done = true;
            u->status = st;
            pthread_cond_signal(&u->cv);
            pthread_mutex_unlock(&u->mu);
        }
        zmsg_destroy(&m);
    }
    return NULL;
}

static void *submit_main(void *arg)
{
    uint64_t idx = (uint64_t)(uintptr_t)arg;
    struct submitter *u = &g_sub[idx];
    uint8_t cmd[64];
    memset(cmd, (int)idx, sizeof(cmd)); /* a small metadata-sized command */
    for (uint64_t seq = 0; kvp_clock_now_ms() < g_end_ms; seq++) {
        pthread_mutex_lock(&u->mu);
        u->done = false;
        pthread_mutex_unlock(&u->mu);
        if (kvp_raftlog_submit(g_rl, idx << 32 | seq, cmd, sizeof(cmd)) != KVP_OK)
            break;
        pthread_mutex_lock(&u->mu);
        while (!u->done)
            pthread_cond_wait(&u->cv, &u->mu);
        if (u->status == KVP_OK)
            u->count++;
        pthread_mutex_unlock(&u->mu);
    }
    return NULL;
}

static double run(int threads, int seconds, uint64_t *cmds_out, uint64_t *entries_out)
{
    struct kvp_raftlog_info a, b;
    kvp_raftlog_get_info(g_rl, &a);
    pthread_t th[MAX_THREADS];
    for (int i = 0; i < threads; i++) {
        pthread_mutex_init(&g_sub[i].mu, NULL);
        pthread_cond_init(&g_sub[i].cv, NULL);
        g_sub[i].count = 0;
    }
    uint64_t t0 = kvp_clock_now_us();
    g_end_ms = kvp_clock_now_ms() + (uint64_t)seconds * 1000;
    for (int i = 0; i < threads; i++)
        pthread_create(&th[i], NULL, submit_main, (void *)(uintptr_t)i);
    uint64_t total = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        total += g_sub[i].count;
    }
    uint64_t us = kvp_clock_now_us() - t0;
    usleep(100000); /* let the info counters refresh (20 ms tick) */
    kvp_raftlog_get_info(g_rl, &b);
    *cmds_out = b.cmds_proposed - a.cmds_proposed;
    *entries_out = b.entries_proposed - a.entries_proposed;
    return (double)total * 1e6 / (double)us;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

int main(int argc, char **argv)
{
    const char *parent = argc > 1 ? argv[1] : ".";
    int seconds = argc > 2 ? atoi(argv[2]) : 3;
    if (seconds <= 0)
        seconds = 3;
    kvp_log_set_level(KVP_LOG_WARN);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) != 0)
        return 1;
    close(fd);
    struct kvp_raftlog_params p;
    memset(&p, 0, sizeof(p));
    p.id = 1;
    snprintf(p.raft_address, sizeof(p.raft_address), "127.0.0.1:%d", ntohs(sa.sin_port));
    snprintf(p.data_dir, sizeof(p.data_dir), "%s/raftlog-bench-%d", parent, (int)getpid());
    p.n_members = 1;
    p.members[0].id = 1;
    snprintf(p.members[0].raft_address, sizeof(p.members[0].raft_address), "%s", p.raft_address);
    p.election_timeout_ms = 300;
    p.heartbeat_ms = 50;
    p.group_commit_max = 256;
    p.snapshot_threshold = 100000;
    p.fsm.apply = c_apply;
    int rc = kvp_raftlog_start(&g_rl, &p);
    if (rc != KVP_OK) {
        fprintf(stderr, "start: %s\n", kvp_strerror(rc));
        return 1;
    }
    struct kvp_raftlog_info in;
    uint64_t end = kvp_clock_now_ms() + 10000;
    do {
        usleep(10000);
        kvp_raftlog_get_info(g_rl, &in);
    } while (!in.is_leader && kvp_clock_now_ms() < end);
    if (!in.is_leader) {
        fprintf(stderr, "no leadership\n");
        return 1;
    }
    pthread_t reader;
    pthread_create(&reader, NULL, reader_main, NULL);
    printf("raftlog_bench: single node, data dir %s, 64-byte commands, %d s per run\n",
           p.data_dir, seconds);
    int cases[2] = {1, 64};
    for (int c = 0; c < 2; c++) {
        uint64_t cmds = 0, entries = 0;
        double rate = run(cases[c], seconds, &cmds, &entries);
        printf("  %2d submitter(s): %9.0f commands/s  (%llu commands in %llu entries, %.1f per "
               "entry)\n",
               cases[c], rate, (unsigned long long)cmds, (unsigned long long)entries,
               entries > 0 ? (double)cmds / (double)entries : 0.0);
    }
    atomic_store(&g_reader_stop, true);
    pthread_join(reader, NULL);
    kvp_raftlog_stop(&g_rl);
    nftw(p.data_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}
