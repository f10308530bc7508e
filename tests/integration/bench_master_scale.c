/*
 * bench_master_scale.c — the master at fleet scale (issue 22; docs/bench.md "Master scale").
 * Not a ctest: prints figures. Run through scripts/bench-scale.sh.
 *
 * A real 3-master cluster (`kvpoolctl cluster up --masters 3 --metrics` from $KVP_BUILD_DIR, so
 * an older build can be measured the same way), then:
 *  1. 100 fake segments (no data plane) are mounted and heartbeat the leader every hb_ms from
 *     one thread of this process; the leader's CPU time (/proc/PID/stat) over a window with
 *     heartbeats, less an idle window before, divided by segments and seconds, is the heartbeat
 *     CPU per segment.
 *  2. N small objects (metadata puts: PutStart + PutEnd batches of --batch keys, 1 replica of
 *     64 bytes, from --loaders threads with a session each) while the heartbeats go on. Every
 *     100 ms the masters' RSS (/proc/PID/status) is sampled; every 500 ms their /metrics.
 *     Elections = changes of the leader (kvpool_raft_leader_changes_total summed over masters,
 *     and the term) during the load.
 *  3. The leader's RSS growth per object; peak RSS while a snapshot is being built or written
 *     (the largest sample); snapshot figures from /metrics (newer builds) or from the masters'
 *     "snapshot taken" log lines (every build logs them).
 *  4. Install: a follower is stopped, more objects are written (the leader compacts its log past
 *     the follower's), the follower is restarted; time until it has applied the leader's commit.
 *  5. Failover: the leader is SIGKILLed --failovers times; time from the kill until a put is
 *     acknowledged by a new leader; the killed master is restarted in between.
 * Options: --objects N --segments S --batch B --loaders L --hb-ms MS --failovers K --extra N
 * --load-deadline-s S (stop the main load after S seconds on a slow host; the rest still runs).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <netdb.h>
#include <sys/socket.h>

#include "runtime/log.h"
#include "test_master_util.h"
#include "tests/lib/cluster_guard.h"

struct opts {
    uint64_t objects, extra;
    unsigned segments, batch, loaders, hb_ms, failovers;
    unsigned load_deadline_s; /* stop the main load after this long (0 = none); figures follow */
};

static struct opts O = {.objects = 1000000, .extra = 0, .segments = 100, .batch = 1024, .loaders = 4,
                        .hb_ms = 1000, .failovers = 3};
static struct tm_cluster C;
static char metrics_addr[TM_MASTERS + 1][64];
static uint32_t seg_ids[1024];
static _Atomic int stop_hb, stop_sampler;
static _Atomic uint64_t hb_sent, hb_failed, objects_done, next_key;
static _Atomic uint64_t peak_rss_kb[TM_MASTERS + 1];
static _Atomic int sampling_snapshot; /* 1 while a snapshot is known to be in progress */
static _Atomic uint64_t peak_rss_snap_kb[TM_MASTERS + 1];

/* ---------------------------------------------------------------- /proc and /metrics */

static uint64_t proc_rss_kb(int pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    uint64_t kb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %" SCNu64, &kb) == 1)
            break;
    fclose(f);
    return kb;
}

static char *http_get(const char *hostport)
{
    char host[64], port[16];
    const char *colon = strrchr(hostport, ':');
    if (!colon)
        return NULL;
    snprintf(host, sizeof host, "%.*s", (int)(colon - hostport), hostport);
    snprintf(port, sizeof port, "%s", colon + 1);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai) != 0)
        return NULL;
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = 2};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return NULL;
    }
    freeaddrinfo(ai);
    const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    if (write(fd, req, sizeof req - 1) < 0) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    for (;;) {
        if (len + 4096 > cap)
            b = realloc(b, cap *= 2);
        ssize_t r = read(fd, b + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    b[len] = 0;
    return b;
}

/* Value of metric `name` (with `label` inside its braces when given); -1 when absent. */
static double metric(const char *text, const char *name, const char *label)
{
    size_t nl = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, name, nl) != 0 || (p[nl] != ' ' && p[nl] != '{'))
            continue;
        const char *eol = strchr(p, '\n');
        if (label) {
            const char *l = strstr(p, label);
            if (!l || (eol && l > eol))
                continue;
        }
        const char *sp = strchr(p, ' ');
        if (!sp || (eol && sp > eol))
            continue;
        return strtod(sp + 1, NULL);
    }
    return -1;
}

/* A _seconds gauge in microseconds (-1 when absent: an older build). */
static double us_metric(const char *text, const char *name)
{
    double v = metric(text, name, NULL);
    return v < 0 ? v : v * 1e6;
}

struct msnap {
    double catchup_max, in_steps, deferred, behind;
    double term, is_leader, changes, stall_us, busy_us, taken, restored, last_wall, last_busy, last_bytes, restore_max,
        applied, commit, step_max, apply_max, step_cpu, apply_cpu;
};

static bool read_metrics(int id, struct msnap *m)
{
    memset(m, 0, sizeof *m);
    char *t = http_get(metrics_addr[id]);
    if (!t)
        return false;
    m->term = metric(t, "kvpool_raft_term", NULL);
    m->is_leader = metric(t, "kvpool_raft_is_leader", NULL);
    m->changes = metric(t, "kvpool_raft_leader_changes_total", NULL);
    m->stall_us = us_metric(t, "kvpool_raft_max_stall_seconds");
    m->busy_us = us_metric(t, "kvpool_raft_max_busy_stall_seconds");
    m->taken = metric(t, "kvpool_raft_snapshots_total", "taken");
    m->restored = metric(t, "kvpool_raft_snapshots_total", "restored");
    m->last_wall = us_metric(t, "kvpool_raft_snapshot_last_wall_seconds");
    m->last_busy = us_metric(t, "kvpool_raft_snapshot_last_busy_seconds");
    m->last_bytes = metric(t, "kvpool_raft_snapshot_last_bytes", NULL);
    m->restore_max = us_metric(t, "kvpool_raft_snapshot_restore_max_seconds");
    m->catchup_max = us_metric(t, "kvpool_raft_catchup_max_step_seconds"); /* -1 on builds without it */
    m->in_steps = metric(t, "kvpool_raft_restores_in_steps_total", NULL);
    m->deferred = metric(t, "kvpool_raft_entries_deferred_total", NULL);
    m->behind = metric(t, "kvpool_raft_fsm_behind", NULL); /* -1 on builds without it */
    m->step_max = us_metric(t, "kvpool_raft_snapshot_max_step_seconds");
    m->apply_max = us_metric(t, "kvpool_raft_apply_max_seconds");
    m->step_cpu = us_metric(t, "kvpool_raft_snapshot_max_step_cpu_seconds");
    m->apply_cpu = us_metric(t, "kvpool_raft_apply_max_cpu_seconds");
    m->applied = metric(t, "kvpool_raft_last_applied_index", NULL);
    m->commit = metric(t, "kvpool_raft_commit_index", NULL);
    free(t);
    return m->term >= 0;
}

/* ---------------------------------------------------------------- threads */

static struct kvp_msession *session(void)
{
    return tm_admin_session(&C, "scale-bench");
}

static void *hb_main(void *arg)
{
    (void)arg;
    struct kvp_msession *ms = session();
    if (!ms)
        return NULL;
    struct tm_hb_driver d = {.ms = ms, .ids = seg_ids, .n = O.segments, .step = 1, .period_ms = O.hb_ms,
                             .timeout_ms = 2000, .stop = &stop_hb, .ok = &hb_sent, .failed = &hb_failed};
    tm_hb_drive(&d);
    kvp_msession_destroy(&ms);
    return NULL;
}

static _Atomic int loading;
static double changes_total(struct msnap *m);

static void *sampler_main(void *arg)
{
    (void)arg;
    uint64_t last_print = tm_now_ms(), t_start = tm_now_ms();
    while (!atomic_load(&stop_sampler)) {
        if (atomic_load(&loading) && tm_now_ms() - last_print >= 15000) {
            /* progress, so a run cut short still says how far it got */
            struct msnap ms[TM_MASTERS + 1];
            double term = 0;
            for (int id = 1; id <= TM_MASTERS; id++) {
                read_metrics(id, &ms[id]);
                if (ms[id].term > term)
                    term = ms[id].term;
            }
            printf("  [%5.0f s] %llu objects; leader changes seen %.0f, term %.0f; RSS %.0f / %.0f / %.0f MiB\n",
                   (tm_now_ms() - t_start) / 1000.0, (unsigned long long)atomic_load(&objects_done),
                   changes_total(ms), term, C.pids[1] > 0 ? proc_rss_kb(C.pids[1]) / 1024.0 : 0,
                   C.pids[2] > 0 ? proc_rss_kb(C.pids[2]) / 1024.0 : 0, C.pids[3] > 0 ? proc_rss_kb(C.pids[3]) / 1024.0 : 0);
            fflush(stdout);
            last_print = tm_now_ms();
        }
        tm_load(&C);
        for (int id = 1; id <= TM_MASTERS; id++) {
            uint64_t kb = C.pids[id] > 0 ? proc_rss_kb(C.pids[id]) : 0;
            if (kb > atomic_load(&peak_rss_kb[id]))
                atomic_store(&peak_rss_kb[id], kb);
            if (atomic_load(&sampling_snapshot) && kb > atomic_load(&peak_rss_snap_kb[id]))
                atomic_store(&peak_rss_snap_kb[id], kb);
        }
        tm_sleep_ms(100);
    }
    return NULL;
}

/* One batch of metadata puts of keys [k, k+n). */
static int put_batch(struct kvp_msession *ms, uint64_t k, unsigned n, uint64_t op_base)
{
    Kvp__PutStartItem *items = calloc(n, sizeof *items), **ip = calloc(n, sizeof *ip);
    Kvp__PutEndItem *eitems = calloc(n, sizeof *eitems), **ep = calloc(n, sizeof *ep);
    char (*keys)[24] = calloc(n, sizeof *keys);
    for (unsigned i = 0; i < n; i++) {
        snprintf(keys[i], sizeof keys[i], "k/%012llu", (unsigned long long)(k + i));
        kvp__put_start_item__init(&items[i]);
        items[i].key = keys[i];
        items[i].size = 64;
        items[i].replica_num = 1;
        items[i].op_id = op_base + k + i;
        items[i].client_host = "127.0.0.1";
        ip[i] = &items[i];
        kvp__put_end_item__init(&eitems[i]);
        eitems[i].key = keys[i];
        eitems[i].op_id = op_base + k + i;
        eitems[i].checksum = k + i;
        ep[i] = &eitems[i];
    }
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__PutStartReq ps = KVP__PUT_START_REQ__INIT;
    ps.items = ip;
    ps.n_items = n;
    req.body_case = KVP__REQUEST__BODY_PUT_START;
    req.put_start = &ps;
    Kvp__Response *resp = NULL;
    int rc = kvp_msession_call(ms, &req, 30000, &resp);
    if (rc == KVP_OK)
        rc = resp->status;
    kvp_msession_response_free(resp);
    if (rc == KVP_OK) {
        Kvp__Request req2 = KVP__REQUEST__INIT;
        Kvp__PutEndReq pe = KVP__PUT_END_REQ__INIT;
        pe.items = ep;
        pe.n_items = n;
        req2.body_case = KVP__REQUEST__BODY_PUT_END;
        req2.put_end = &pe;
        resp = NULL;
        rc = kvp_msession_call(ms, &req2, 30000, &resp);
        if (rc == KVP_OK)
            rc = resp->status;
        kvp_msession_response_free(resp);
    }
    free(items);
    free(ip);
    free(eitems);
    free(ep);
    free(keys);
    return rc;
}

static uint64_t load_target;
static uint64_t op_base;
static uint64_t load_stop_at_ms; /* 0 = none */

static void *loader_main(void *arg)
{
    (void)arg;
    struct kvp_msession *ms = session();
    for (;;) {
        if (load_stop_at_ms && tm_now_ms() >= load_stop_at_ms)
            break;
        uint64_t k = atomic_fetch_add(&next_key, O.batch);
        if (k >= load_target)
            break;
        unsigned n = (unsigned)(load_target - k < O.batch ? load_target - k : O.batch);
        int tries = 0;
        while (put_batch(ms, k, n, op_base) != KVP_OK && ++tries < 20)
            tm_sleep_ms(100); /* the same op ids: a retried batch is idempotent */
        if (tries < 20)
            atomic_fetch_add(&objects_done, n);
    }
    kvp_msession_destroy(&ms);
    return NULL;
}

static void load(uint64_t upto)
{
    load_target = upto;
    pthread_t th[64];
    unsigned n = O.loaders < 64 ? O.loaders : 64;
    for (unsigned i = 0; i < n; i++)
        pthread_create(&th[i], NULL, loader_main, NULL);
    for (unsigned i = 0; i < n; i++)
        pthread_join(th[i], NULL);
}

/* ---------------------------------------------------------------- log lines */

/* Longest "snapshot taken" time in a master's log, and how many. Newer builds log the
 * raft-thread work ("M ms of raft-thread work"), older ones the whole synchronous take
 * ("fsm X ms, lz4 Y ms"). */
static uint64_t log_max_cpu_ms;

static void log_snapshots(int id, unsigned *n, uint64_t *max_thread_ms, uint64_t *max_wall_ms)
{
    log_max_cpu_ms = 0;
    char path[400], line[1024];
    snprintf(path, sizeof path, "%s/master-%d.log", C.dir, id);
    *n = 0;
    *max_thread_ms = *max_wall_ms = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, "snapshot taken:");
        if (!p)
            continue;
        unsigned long long a = 0, b = 0;
        char *q;
        if ((q = strstr(p, "ms from begin,")) && sscanf(strstr(p, "framed;") + 7, " %llu ms from begin, %llu", &a, &b) == 2) {
            (*n)++;
            if (b > *max_thread_ms)
                *max_thread_ms = b;
            unsigned long long cpu = 0;
            char *w = strstr(p, "work (");
            if (w && sscanf(w, "work (%llu", &cpu) == 1 && cpu > log_max_cpu_ms)
                log_max_cpu_ms = cpu;
            if (a > *max_wall_ms)
                *max_wall_ms = a;
        } else if ((q = strstr(p, "fsm ")) && sscanf(q, "fsm %llu ms, lz4 %llu ms", &a, &b) == 2) {
            (*n)++;
            if (a + b > *max_thread_ms)
                *max_thread_ms = a + b;
            if (a + b > *max_wall_ms)
                *max_wall_ms = a + b;
        }
    }
    fclose(f);
}

/* ---------------------------------------------------------------- main */

static int mount_segments(void)
{
    return tm_mount_fake_segments(&C, "scale-seg", O.segments, O.objects * 128 / O.segments + (1ull << 30), 20000,
                                  seg_ids);
}

static double leader_cpu_us_per_s(int id, unsigned secs)
{
    long hz = sysconf(_SC_CLK_TCK);
    uint64_t c0 = tm_proc_cpu_ticks(C.pids[id]);
    uint64_t t0 = tm_now_ms();
    tm_sleep_ms(secs * 1000);
    uint64_t c1 = tm_proc_cpu_ticks(C.pids[id]);
    uint64_t t1 = tm_now_ms();
    return (double)(c1 - c0) * 1e6 / (double)hz / ((double)(t1 - t0) / 1000.0);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double changes_total(struct msnap *m)
{
    double s = 0;
    for (int id = 1; id <= TM_MASTERS; id++)
        s += m[id].changes > 0 ? m[id].changes : 0;
    return s;
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        uint64_t v = strtoull(argv[i + 1], NULL, 0);
        if (!strcmp(argv[i], "--objects"))
            O.objects = v;
        else if (!strcmp(argv[i], "--segments"))
            O.segments = (unsigned)(v > 1024 ? 1024 : v);
        else if (!strcmp(argv[i], "--batch"))
            O.batch = (unsigned)v;
        else if (!strcmp(argv[i], "--loaders"))
            O.loaders = (unsigned)v;
        else if (!strcmp(argv[i], "--hb-ms"))
            O.hb_ms = (unsigned)v;
        else if (!strcmp(argv[i], "--failovers"))
            O.failovers = (unsigned)v;
        else if (!strcmp(argv[i], "--extra"))
            O.extra = v;
        else if (!strcmp(argv[i], "--load-deadline-s"))
            O.load_deadline_s = (unsigned)v;
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (!O.extra)
        O.extra = O.objects / 10 + 400000; /* past two 16 MiB log bounds: the leader compacts past the follower */
    kvp_log_set_level(KVP_LOG_ERROR);
    /* Bring up with --metrics (tm_cluster_up has no flag for it). */
    memset(&C, 0, sizeof C);
    const char *bd = getenv("KVP_BUILD_DIR");
    snprintf(C.ctl, sizeof C.ctl, "%s/tools/kvpoolctl", bd ? bd : ".");
    snprintf(C.dir, sizeof C.dir, "/tmp/kvp-scale-XXXXXX");
    if (!mkdtemp(C.dir))
        return 1;
    snprintf(C.file, sizeof C.file, "%s/cluster.json", C.dir);
    C.up = true;
    tm_current = &C;
    atexit(tm_atexit);
    (void)kvp_test_cluster_guard(); /* its daemons die with this process, however it ends */
    char *up[] = {C.ctl, "cluster", "up", "--dir", C.dir, "--masters", "3", "--metrics", NULL};
    if (tm_run(up, true) != 0 || tm_load(&C) != 0) {
        fprintf(stderr, "cluster up failed (logs in %s)\n", C.dir);
        return 1;
    }
    json_error_t e;
    json_t *j = json_load_file(C.file, 0, &e);
    size_t ix;
    json_t *m;
    json_array_foreach(json_object_get(j, "masters"), ix, m) {
        int id = (int)json_integer_value(json_object_get(m, "id"));
        if (id >= 1 && id <= TM_MASTERS)
            snprintf(metrics_addr[id], sizeof metrics_addr[id], "%s", json_string_value(json_object_get(m, "metrics")));
    }
    json_decref(j);
    C.ms = session();
    op_base = ((uint64_t)getpid() << 40);
    if (!C.ms || mount_segments() != 0) {
        fprintf(stderr, "mount failed\n");
        return 1;
    }
    int leader = tm_leader(&C, 5000);
    printf("cluster: 3 masters, leader %d, %u segments mounted; %llu objects of 64 B (1 replica), batches of %u, "
           "%u loaders; heartbeats every %u ms\n",
           leader, O.segments, (unsigned long long)O.objects, O.batch, O.loaders, O.hb_ms);
    fflush(stdout);
    pthread_t sampler, hb;
    pthread_create(&sampler, NULL, sampler_main, NULL);

    /* 1. heartbeat CPU on the leader */
    double idle = leader_cpu_us_per_s(leader, 5);
    pthread_create(&hb, NULL, hb_main, NULL);
    tm_sleep_ms(1000);
    double busy = leader_cpu_us_per_s(leader, 10);
    double per_seg = (busy - idle) / O.segments;
    printf("heartbeats: leader CPU %.0f us/s idle, %.0f us/s with %u segments heartbeating -> %.1f us of leader CPU "
           "per segment per second (%.1f us per heartbeat)\n",
           idle, busy, O.segments, per_seg, per_seg * O.hb_ms / 1000.0);
    fflush(stdout);

    /* 2. load */
    struct msnap before[TM_MASTERS + 1], after[TM_MASTERS + 1];
    for (int id = 1; id <= TM_MASTERS; id++)
        read_metrics(id, &before[id]);
    uint64_t rss0 = proc_rss_kb(C.pids[leader]);
    atomic_store(&sampling_snapshot, 1); /* snapshots run throughout a load this size */
    char la[128] = "";
    FILE *lf = fopen("/proc/loadavg", "r");
    if (lf && fgets(la, sizeof la, lf))
        printf("host load average before the load: %s", la);
    if (lf)
        fclose(lf);
    uint64_t t0 = tm_now_ms();
    atomic_store(&loading, 1);
    load_stop_at_ms = O.load_deadline_s ? tm_now_ms() + O.load_deadline_s * 1000ull : 0;
    load(O.objects);
    load_stop_at_ms = 0;
    atomic_store(&loading, 0);
    if (atomic_load(&objects_done) < O.objects) {
        printf("load stopped by --load-deadline-s %u at %llu objects: the figures below are at that size\n",
               O.load_deadline_s, (unsigned long long)atomic_load(&objects_done));
        O.objects = atomic_load(&next_key) < O.objects ? atomic_load(&next_key) : O.objects;
    }
    uint64_t t1 = tm_now_ms();
    /* let the last snapshot of the load finish (its log tail is small by now) */
    tm_sleep_ms(3000);
    atomic_store(&sampling_snapshot, 0);
    lf = fopen("/proc/loadavg", "r");
    if (lf && fgets(la, sizeof la, lf))
        printf("host load average after the load: %s", la);
    if (lf)
        fclose(lf);
    for (int id = 1; id <= TM_MASTERS; id++)
        read_metrics(id, &after[id]);
    int leader_after = tm_leader(&C, 5000);
    uint64_t rss1 = proc_rss_kb(C.pids[leader_after]);
    double elections = changes_total(after) - changes_total(before);
    printf("load: %llu objects in %.1f s (%.0f/s); leader changes seen during it: %.0f (term %.0f -> %.0f); "
           "heartbeats ok %llu, failed %llu\n",
           (unsigned long long)atomic_load(&objects_done), (t1 - t0) / 1000.0,
           atomic_load(&objects_done) * 1000.0 / (double)(t1 - t0 + 1), elections, before[leader].term,
           after[leader_after].term, (unsigned long long)atomic_load(&hb_sent),
           (unsigned long long)atomic_load(&hb_failed));
    printf("leader RSS: %.1f MiB before, %.1f MiB after -> %.0f B/object; peak during the load (snapshots "
           "running): leader %.1f MiB, masters %.1f / %.1f / %.1f MiB\n",
           rss0 / 1024.0, rss1 / 1024.0, (double)(rss1 - rss0) * 1024.0 / (double)atomic_load(&objects_done),
           atomic_load(&peak_rss_snap_kb[leader_after]) / 1024.0, atomic_load(&peak_rss_snap_kb[1]) / 1024.0,
           atomic_load(&peak_rss_snap_kb[2]) / 1024.0, atomic_load(&peak_rss_snap_kb[3]) / 1024.0);
    for (int id = 1; id <= TM_MASTERS; id++) {
        unsigned n;
        uint64_t thr, wall;
        log_snapshots(id, &n, &thr, &wall);
        printf("master %d%s: %u snapshots logged, longest raft-thread time of one %llu ms (CPU %llu ms), longest "
               "begin->taken %llu ms",
               id, id == leader_after ? " (leader)" : "", n, (unsigned long long)thr,
               (unsigned long long)log_max_cpu_ms, (unsigned long long)wall);
        if (after[id].stall_us >= 0)
            printf("; max raft-thread stall %.1f ms (CPU used over it %.1f ms), longest entry apply %.1f ms (CPU %.1f ms), "
                   "longest build step %.1f ms (CPU %.1f ms); last snapshot %.1f MB built in %.0f ms "
                   "(%.0f ms of thread time)",
                   after[id].stall_us / 1000.0, after[id].busy_us / 1000.0, after[id].apply_max / 1000.0,
                   after[id].apply_cpu / 1000.0, after[id].step_max / 1000.0, after[id].step_cpu / 1000.0,
                   after[id].last_bytes / 1e6,
                   after[id].last_wall / 1000.0, after[id].last_busy / 1000.0);
        printf("\n");
    }
    fflush(stdout);

    /* 4. install: stop a follower, write more, restart it */
    int fol = leader_after == 1 ? 2 : 1;
    tm_kill(&C, fol);
    load(O.objects + O.extra);
    tm_sleep_ms(3000); /* a snapshot after the extra writes compacts past the follower */
    struct msnap lm;
    read_metrics(leader_after, &lm);
    uint64_t r0 = tm_now_ms();
    if (tm_restart(&C, fol) != 0)
        printf("install: restart of master %d failed\n", fol);
    struct msnap fm = {0};
    uint64_t caught = 0;
    while (tm_now_ms() - r0 < 600000) {
        /* Caught up: raft's applied index reached the leader's commit and (builds that install
         * in steps) the state machine no longer lags it. */
        if (read_metrics(fol, &fm) && fm.applied >= lm.commit && fm.behind <= 0) {
            caught = tm_now_ms() - r0;
            break;
        }
        tm_sleep_ms(100);
    }
    printf("install: follower %d restarted after %llu more objects; caught up (applied >= leader's commit %.0f, state not behind) %llu ms "
           "after the restart; snapshots restored %.0f, longest restore %.0f ms\n",
           fol, (unsigned long long)O.extra, lm.commit, (unsigned long long)caught, fm.restored,
           fm.restore_max >= 0 ? fm.restore_max / 1000.0 : -1.0);
    if (fm.catchup_max >= 0)
        printf("install: %.0f of those in steps, longest catch-up step %.1f ms, %.0f entries applied in a later loop "
               "iteration (longest restore above includes the restart's own start-up load, one piece)\n",
               fm.in_steps, fm.catchup_max / 1000.0, fm.deferred);
    fflush(stdout);

    /* 5. failovers */
    uint64_t fo[16];
    unsigned nfo = 0;
    char key[64];
    for (unsigned k = 0; k < O.failovers && k < 16; k++) {
        int l = tm_leader(&C, 5000);
        tm_sleep_ms(2000);
        uint64_t k0 = tm_now_ms();
        tm_kill(&C, l);
        snprintf(key, sizeof key, "failover/%u", k);
        int rc = tm_put(&C, key, 30000);
        uint64_t dt = tm_now_ms() - k0;
        printf("failover %u: leader %d killed; put acknowledged by the new leader after %llu ms (%s)\n", k, l,
               (unsigned long long)dt, kvp_strerror(rc));
        fflush(stdout);
        if (rc == KVP_OK)
            fo[nfo++] = dt;
        tm_restart(&C, l);
        uint64_t w0 = tm_now_ms();
        struct msnap x;
        while (tm_now_ms() - w0 < 600000 && !(read_metrics(l, &x) && x.applied > 0 && x.applied + 100 >= x.commit))
            tm_sleep_ms(200);
    }
    if (nfo) {
        qsort(fo, nfo, sizeof fo[0], cmp_u64);
        printf("failover: median %llu ms over %u (min %llu, max %llu)\n", (unsigned long long)fo[nfo / 2], nfo,
               (unsigned long long)fo[0], (unsigned long long)fo[nfo - 1]);
    }
    for (int id = 1; id <= TM_MASTERS; id++) {
        struct msnap x;
        if (read_metrics(id, &x) && x.stall_us >= 0)
            printf("master %d at the end: max raft-thread stall since its start %.1f ms (busy %.1f ms), longest "
                   "restore %.0f ms\n", id, x.stall_us / 1000.0, x.busy_us / 1000.0, x.restore_max / 1000.0);
    }
    atomic_store(&stop_hb, 1);
    pthread_join(hb, NULL);
    atomic_store(&stop_sampler, 1);
    pthread_join(sampler, NULL);
    printf("peak RSS per master over the run: %.1f / %.1f / %.1f MiB\n", atomic_load(&peak_rss_kb[1]) / 1024.0,
           atomic_load(&peak_rss_kb[2]) / 1024.0, atomic_load(&peak_rss_kb[3]) / 1024.0);
    fflush(stdout);
    tm_cluster_down(&C);
    return 0;
}
