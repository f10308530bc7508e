/*
 * bench_meta.c — `kvpool-bench meta`: metadata throughput of the master quorum, measured with
 * raw master sessions (actors/session/msession.h), no data plane:
 *  - mounts a fake segment ("bench-meta-<pid>", never contacted: no bytes are ever written) and
 *    heartbeats it; every put is placed on it (preferred_segment, replica_num 1), with the ttl
 *    kvp_put asks (the call's timeout + 2 s), so a leader answers it from its reservations
 *    (one-commit put) as it answers a client's put;
 *  - PutStart+PutEnd pairs/s and GetReplicaList/s at each --callers level for --seconds;
 *  - --objects N: store N objects in batches of 1000 and print the leader's RSS per object;
 *  - --failover-kills K: SIGKILL the leader (pid from `kvpoolctl leader --json`), time until the
 *    first successful put pair, restart the member (`kvpoolctl cluster restart`); median and max.
 * The fake segment is unmounted at the end, which drops every object it stored.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/bench/bench_internal.h"
#include "tools/bench/bench_meta_internal.h"

struct caller {
    struct meta *m;
    struct kvp_msession *s;
    unsigned id;
    int what; /* 0 put pairs, 1 get replica list */
    uint64_t deadline_us;
    uint64_t ok, nkeys_seen;
    struct bench_lat lat;
    struct bench_errs errs;
    pthread_t th;
};

static int call(struct kvp_msession *s, Kvp__Request *req, uint32_t timeout_ms, Kvp__Response **out)
{
    int rc = kvp_msession_call(s, req, timeout_ms, out);
    if (rc)
        return rc;
    if ((*out)->status) {
        rc = (*out)->status;
        kvp_msession_response_free(*out);
        *out = NULL;
    }
    return rc;
}


/* n keys in one PutStart and one PutEnd. Returns 0 when every item succeeded. */
#define META_PUT_TTL_MARGIN_MS 2000u /* KVP_CLIENT_PUT_TTL_MARGIN_MS */

static int put_pairs(struct meta *m, struct kvp_msession *s, char **keys, size_t n, uint32_t timeout_ms)
{
    Kvp__PutStartItem *items = calloc(n, sizeof *items);
    Kvp__PutStartItem **ip = calloc(n, sizeof *ip);
    Kvp__PutEndItem *eitems = calloc(n, sizeof *eitems);
    Kvp__PutEndItem **ep = calloc(n, sizeof *ep);
    int rc = KVP_ERR_NOMEM;
    if (!items || !ip || !eitems || !ep)
        goto out;
    uint64_t op0 = atomic_fetch_add(&m->op_seq, n);
    for (size_t i = 0; i < n; i++) {
        kvp__put_start_item__init(&items[i]);
        items[i].key = keys[i];
        items[i].size = META_OBJ_BYTES;
        items[i].replica_num = 1;
        items[i].preferred_segment = m->seg_name;
        items[i].op_id = op0 + i;
        items[i].client_host = (char *)"bench-meta";
        ip[i] = &items[i];
        kvp__put_end_item__init(&eitems[i]);
        eitems[i].key = keys[i];
        eitems[i].op_id = op0 + i;
        eitems[i].checksum = 0;
        ep[i] = &eitems[i];
    }
    Kvp__PutStartReq ps = KVP__PUT_START_REQ__INIT;
    ps.n_items = n;
    ps.items = ip;
    /* The put's ttl as kvp_put asks it (actors/client/batch_put.c: the call's time left plus a
     * margin), not the master's default (put_ttl_ms, 30 s): a leader answers a PutStart from its
     * reservations only for a ttl up to 15 s (docs/master.md "One-commit put"), so without this
     * the pairs measured a path no client's put takes. */
    ps.ttl_ms = (uint64_t)timeout_ms + META_PUT_TTL_MARGIN_MS;
    Kvp__Request req = KVP__REQUEST__INIT;
    req.body_case = KVP__REQUEST__BODY_PUT_START;
    req.put_start = &ps;
    Kvp__Response *resp = NULL;
    rc = call(s, &req, timeout_ms, &resp);
    if (rc)
        goto out;
    if (resp->body_case != KVP__RESPONSE__BODY_PUT_START || resp->put_start->n_results != n) {
        rc = KVP_ERR_MALFORMED;
    } else {
        for (size_t i = 0; i < n && !rc; i++)
            rc = resp->put_start->results[i]->status;
    }
    kvp_msession_response_free(resp);
    if (rc)
        goto out;
    Kvp__PutEndReq pe = KVP__PUT_END_REQ__INIT;
    pe.n_items = n;
    pe.items = ep;
    Kvp__Request req2 = KVP__REQUEST__INIT;
    req2.body_case = KVP__REQUEST__BODY_PUT_END;
    req2.put_end = &pe;
    rc = call(s, &req2, timeout_ms, &resp);
    if (rc)
        goto out;
    if (resp->body_case != KVP__RESPONSE__BODY_PUT_END || resp->put_end->n_status != n) {
        rc = KVP_ERR_MALFORMED;
    } else {
        for (size_t i = 0; i < n && !rc; i++)
            rc = resp->put_end->status[i];
    }
    kvp_msession_response_free(resp);
out:
    free(items);
    free(ip);
    free(eitems);
    free(ep);
    return rc;
}

static int get_replicas(struct kvp_msession *s, char *key)
{
    char *keys[1] = {key};
    Kvp__GetReplicaListReq g = KVP__GET_REPLICA_LIST_REQ__INIT;
    g.n_keys = 1;
    g.keys = keys;
    g.client_host = (char *)"bench-meta";
    Kvp__Request req = KVP__REQUEST__INIT;
    req.body_case = KVP__REQUEST__BODY_GET_REPLICAS;
    req.get_replicas = &g;
    Kvp__Response *resp = NULL;
    int rc = call(s, &req, 5000, &resp);
    if (rc)
        return rc;
    if (resp->body_case != KVP__RESPONSE__BODY_GET_REPLICAS || resp->get_replicas->n_objects != 1)
        rc = KVP_ERR_MALFORMED;
    else
        rc = resp->get_replicas->objects[0]->status;
    kvp_msession_response_free(resp);
    return rc;
}

static void *hb_main(void *arg)
{
    struct meta *m = arg;
    while (!atomic_load(&m->hb_stop)) {
        Kvp__HeartbeatReq hb = KVP__HEARTBEAT_REQ__INIT;
        hb.segment_id = m->seg_id;
        Kvp__Request req = KVP__REQUEST__INIT;
        req.body_case = KVP__REQUEST__BODY_HEARTBEAT;
        req.heartbeat = &hb;
        Kvp__Response *resp = NULL;
        if (kvp_msession_call(m->sess[0], &req, 1000, &resp) == 0)
            kvp_msession_response_free(resp);
        for (int i = 0; i < 3 && !atomic_load(&m->hb_stop); i++)
            usleep(100000);
    }
    return NULL;
}

static void *caller_main(void *arg)
{
    struct caller *c = arg;
    char key[96];
    char *kp[1] = {key};
    uint64_t i = c->nkeys_seen; /* key names continue across levels: never a repeated key */
    unsigned seed = 777u + c->id;
    while (bench_now_us() < c->deadline_us) {
        uint64_t t0 = bench_now_us();
        int rc;
        if (c->what == 0) {
            meta_key(key, sizeof key, c->id, i++);
            rc = put_pairs(c->m, c->s, kp, 1, 5000);
        } else {
            uint64_t k = c->nkeys_seen ? (uint64_t)rand_r(&seed) % c->nkeys_seen : 0; /* stored keys */
            meta_key(key, sizeof key, c->id, k);
            rc = get_replicas(c->s, key);
        }
        bench_lat_add(&c->lat, bench_now_us() - t0);
        if (rc)
            bench_errs_add(&c->errs, rc);
        else
            c->ok++;
    }
    if (c->what == 0)
        c->nkeys_seen = i;
    return NULL;
}

/* One level: `callers` threads doing `what` for m->seconds. Returns ops/s. */
static double run_level(struct meta *m, struct caller *cs, unsigned callers, int what, struct bench_lat *lat,
                        struct bench_errs *errs)
{
    uint64_t t0 = bench_now_us();
    uint64_t dl = t0 + (uint64_t)(m->seconds * 1e6);
    for (unsigned i = 0; i < callers; i++) {
        cs[i].m = m;
        cs[i].s = m->sess[i % m->nsess];
        cs[i].id = i;
        cs[i].what = what;
        cs[i].deadline_us = dl;
        cs[i].ok = 0;
        pthread_create(&cs[i].th, NULL, caller_main, &cs[i]);
    }
    uint64_t ok = 0;
    for (unsigned i = 0; i < callers; i++) {
        pthread_join(cs[i].th, NULL);
        ok += cs[i].ok;
        bench_lat_merge(lat, &cs[i].lat);
        bench_errs_merge(errs, &cs[i].errs);
        bench_lat_free(&cs[i].lat);
        memset(&cs[i].errs, 0, sizeof cs[i].errs);
    }
    double secs = (double)(bench_now_us() - t0) / 1e6;
    bench_lat_sort(lat);
    return secs > 0 ? (double)ok / secs : 0;
}

/* Run a command, capture up to cap-1 bytes of stdout. Returns the exit status or -1. */
static int run_capture(char *const argv[], char *out, size_t cap)
{
    int p[2];
    if (pipe(p))
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = out ? p[1] : open("/dev/null", O_WRONLY);
        if (fd >= 0)
            dup2(fd, 1);
        close(p[0]);
        close(p[1]);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    size_t len = 0;
    ssize_t r;
    while (out && len + 1 < cap && (r = read(p[0], out + len, cap - 1 - len)) != 0) {
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            break;
        len += (size_t)r;
    }
    if (out)
        out[len] = 0;
    close(p[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void ctl_path(char *buf, size_t cap)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        snprintf(buf, cap, "%s/kvpoolctl", dirname(exe));
        if (access(buf, X_OK) == 0)
            return;
    }
    snprintf(buf, cap, "kvpoolctl");
}

static int leader_info(const char *ctl, const char *cluster, long long *id, long long *pid, char *addr, size_t cap)
{
    char out[4096];
    char *argv[] = {(char *)ctl, (char *)"--cluster", (char *)cluster, (char *)"--timeout", (char *)"5000",
                    (char *)"leader", (char *)"--json", NULL};
    if (run_capture(argv, out, sizeof out) != 0)
        return -1;
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    if (!j)
        return -1;
    *id = json_integer_value(json_object_get(j, "id"));
    *pid = json_integer_value(json_object_get(j, "pid"));
    if (addr && cap) {
        const char *a = json_string_value(json_object_get(j, "address"));
        snprintf(addr, cap, "%s", a ? a : "");
    }
    json_decref(j);
    return *pid > 0 ? 0 : -1;
}

static long rss_kb(long long pid)
{
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%lld/status", pid);
    FILE *f = fopen(p, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kb = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return kb;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int bench_meta_main(int argc, char **argv)
{
    struct meta m = {.seconds = 3};
    const char *callers_s = "1,16,64";
    bool pipe = true;
    int only = 0; /* 0 both, 1 puts, 2 gets */
    unsigned kills = 0;
    uint64_t objects = 0;
    static const struct option lo[] = {
        {"callers", 1, 0, 'n'}, {"seconds", 1, 0, 's'}, {"failover-kills", 1, 0, 'k'}, {"objects", 1, 0, 'o'},
        {"json", 0, 0, 'j'},    {"cluster", 1, 0, 'c'}, {"masters", 1, 0, 'M'},        {"driver", 1, 0, 'd'},
        {"only", 1, 0, 'O'},    {"batch", 1, 0, 'B'},   {0, 0, 0, 0}};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'n': callers_s = optarg; break;
        case 's': m.seconds = strtod(optarg, NULL); break;
        case 'k': kills = (unsigned)strtoul(optarg, NULL, 10); break;
        case 'o': objects = strtoull(optarg, NULL, 10); break;
        case 'j': m.json = true; break;
        case 'c': m.target.cluster_file = optarg; break;
        case 'M': m.target.masters = optarg; break;
        case 'd':
            if (strcmp(optarg, "pipe") && strcmp(optarg, "threads")) {
                fprintf(stderr, "kvpool-bench meta: --driver pipe|threads, not %s\n", optarg);
                return 2;
            }
            pipe = strcmp(optarg, "pipe") == 0;
            break;
        case 'B': {
            unsigned long b = strtoul(optarg, NULL, 10);
            if (b < 1 || b > 1024) {
                fprintf(stderr, "kvpool-bench meta: --batch 1..1024, not %s\n", optarg);
                return 2;
            }
            m.batch = (unsigned)b;
            break;
        }
        case 'O':
            if (strcmp(optarg, "puts") && strcmp(optarg, "gets")) {
                fprintf(stderr, "kvpool-bench meta: --only puts|gets, not %s\n", optarg);
                return 2;
            }
            only = strcmp(optarg, "puts") == 0 ? 1 : 2;
            break;
        default:
            fprintf(stderr, "usage: kvpool-bench meta --cluster FILE | --masters LIST [--callers 1,16,64]\n"
                            "         [--driver pipe|threads] [--only puts|gets] [--batch B] [--seconds S] [--objects N]\n"
                            "         [--failover-kills K (needs --cluster)] [--json]\n");
            return 2;
        }
    }
    if (m.seconds <= 0 || (kills && !m.target.cluster_file)) {
        fprintf(stderr, "kvpool-bench meta: --seconds > 0; --failover-kills needs --cluster\n");
        return 2;
    }
    if (m.batch > 1 && !pipe) {
        fprintf(stderr, "kvpool-bench meta: --batch needs --driver pipe\n");
        return 2;
    }
    unsigned levels[16], nlev = 0, maxc = 1;
    char *dup = strdup(callers_s);
    for (char *sv = NULL, *t = strtok_r(dup, ",", &sv); t && nlev < 16; t = strtok_r(NULL, ",", &sv)) {
        unsigned v = (unsigned)strtoul(t, NULL, 10);
        if (v < 1 || v > 1024) {
            fprintf(stderr, "kvpool-bench meta: bad --callers %s\n", callers_s);
            free(dup);
            return 2;
        }
        levels[nlev++] = v;
        maxc = v > maxc ? v : maxc;
    }
    free(dup);
    /* Sessions are shared by callers (msession is thread-safe), as threads of one client do. */
    m.nsess = maxc < META_SESSIONS_MAX ? maxc : META_SESSIONS_MAX;
    for (unsigned i = 0; i < m.nsess; i++) {
        int rc = bench_msession_open(&m.target, "bench-meta", &m.sess[i]);
        if (rc) {
            fprintf(stderr, "kvpool-bench meta: session: %s\n", kvp_errname(rc));
            return 1;
        }
    }
    /* Mount the fake segment: 1 TiB, so that it has the most free bytes too. */
    snprintf(m.seg_name, sizeof m.seg_name, "bench-meta-%d", (int)getpid());
    Kvp__MountSegmentReq mr = KVP__MOUNT_SEGMENT_REQ__INIT;
    mr.name = m.seg_name;
    mr.host = (char *)"bench-meta";
    mr.endpoint = (char *)"127.0.0.1:9";
    mr.size = 1ull << 40;
    mr.owner_pid = (uint64_t)getpid();
    Kvp__Request req = KVP__REQUEST__INIT;
    req.body_case = KVP__REQUEST__BODY_MOUNT;
    req.mount = &mr;
    Kvp__Response *resp = NULL;
    int rc = call(m.sess[0], &req, 10000, &resp);
    if (rc || resp->body_case != KVP__RESPONSE__BODY_MOUNT) {
        fprintf(stderr, "kvpool-bench meta: MountSegment: %s\n", kvp_errname(rc ? rc : KVP_ERR_MALFORMED));
        if (resp)
            kvp_msession_response_free(resp);
        return 1;
    }
    m.seg_id = resp->mount->segment_id;
    kvp_msession_response_free(resp);
    atomic_store(&m.op_seq, ((uint64_t)getpid() << 32) | 1);
    pthread_create(&m.hb, NULL, hb_main, &m);

    json_t *jl = json_array();
    struct caller *cs = calloc(maxc, sizeof *cs);
    struct meta_pipe_state *ps = calloc(1, sizeof *ps);
    if (!m.json) {
        printf("driver: %s\n", pipe ? "pipe (each caller a request stream; one thread, up to 8 sockets to the leader)"
                                    : "threads (a thread per caller, callers share up to 8 master sessions)");
        if (m.batch > 1)
            printf("batch: %u keys per request (BatchPutStart/BatchPutEnd/BatchGetReplicaList); rates are keys/s,"
                   " latency per request\n", m.batch);
        printf("%-8s %14s %10s %10s %16s %10s %10s  errors\n", "callers", "put pairs/s", "p50 us", "p99 us",
               "GetReplicaList/s", "p50 us", "p99 us");
    }
    for (unsigned l = 0; l < nlev; l++) {
        struct bench_lat lp = {0}, lg = {0};
        struct bench_errs ep = {0}, eg = {0};
        /* --only: one phase (a profile or CPU count of one kind of request); the other prints 0 */
        double pps = 0, gps = 0;
        struct bench_cpu cpu;
        json_t *cpu_p = NULL, *cpu_g = NULL; /* CPU µs per pair / per GetReplicaList (bench_cpu.c) */
        if (only != 2) {
            bench_cpu_begin(&cpu, m.target.cluster_file);
            pps = pipe ? meta_run_level_pipe(&m, ps, levels[l], 0, &lp, &ep) : run_level(&m, cs, levels[l], 0, &lp, &ep);
            cpu_p = bench_cpu_end(&cpu, lp.n * (m.batch ? m.batch : 1));
        }
        if (only != 1) {
            bench_cpu_begin(&cpu, m.target.cluster_file);
            gps = pipe ? meta_run_level_pipe(&m, ps, levels[l], 1, &lg, &eg) : run_level(&m, cs, levels[l], 1, &lg, &eg);
            cpu_g = bench_cpu_end(&cpu, lg.n * (m.batch ? m.batch : 1));
        }
        if (m.json) {
            json_array_append_new(
                jl, json_pack("{s:i,s:f,s:I,s:I,s:f,s:I,s:I,s:I}", "callers", (int)levels[l], "put_pairs_per_second",
                              pps, "put_p50_us", (json_int_t)bench_lat_pct(&lp, .5), "put_p99_us",
                              (json_int_t)bench_lat_pct(&lp, .99), "get_replica_list_per_second", gps,
                              "get_p50_us", (json_int_t)bench_lat_pct(&lg, .5), "get_p99_us",
                              (json_int_t)bench_lat_pct(&lg, .99), "errors",
                              (json_int_t)(bench_errs_total(&ep) + bench_errs_total(&eg))));
            json_t *lv = json_array_get(jl, json_array_size(jl) - 1);
            if (cpu_p)
                json_object_set_new(lv, "cpu_us_per_pair", json_incref(cpu_p));
            if (cpu_g)
                json_object_set_new(lv, "cpu_us_per_get", json_incref(cpu_g));
        } else {
            printf("%-8u %14.0f %10llu %10llu %16.0f %10llu %10llu  ", levels[l], pps,
                   (unsigned long long)bench_lat_pct(&lp, .5), (unsigned long long)bench_lat_pct(&lp, .99), gps,
                   (unsigned long long)bench_lat_pct(&lg, .5), (unsigned long long)bench_lat_pct(&lg, .99));
            bench_errs_merge(&ep, &eg);
            bench_errs_print(stdout, &ep);
            printf("\n");
            json_t *cj[2] = {cpu_p, cpu_g};
            const char *cw[2] = {"per put pair", "per GetReplicaList"};
            for (int i = 0; i < 2; i++) {
                if (!cj[i])
                    continue;
                printf("         CPU us %s:", cw[i]);
                const char *k;
                json_t *v;
                json_object_foreach(cj[i], k, v) printf(" %s %.1f", k, json_real_value(v));
                printf("\n");
            }
            fflush(stdout);
        }
        json_decref(cpu_p);
        json_decref(cpu_g);
        bench_lat_free(&lp);
        bench_lat_free(&lg);
    }
    free(cs);
    free(ps);

    char ctl[PATH_MAX + 16];
    ctl_path(ctl, sizeof ctl);
    json_t *jo = NULL;
    if (objects) {
        long long lid = 0, lpid = 0;
        long before = -1, after = -1;
        if (m.target.cluster_file && leader_info(ctl, m.target.cluster_file, &lid, &lpid, NULL, 0) == 0)
            before = rss_kb(lpid);
        uint64_t t0 = bench_now_us(), stored = 0;
        enum { BATCH = 1000 };
        char *keys[BATCH];
        char kb[BATCH][48];
        for (int i = 0; i < BATCH; i++)
            keys[i] = kb[i];
        for (uint64_t i = 0; i < objects; i += BATCH) {
            size_t n = objects - i < BATCH ? (size_t)(objects - i) : BATCH;
            for (size_t j = 0; j < n; j++)
                snprintf(kb[j], sizeof kb[j], "metao-%d-%llu", (int)getpid(), (unsigned long long)(i + j));
            if (put_pairs(&m, m.sess[0], keys, n, 30000) == 0)
                stored += n;
        }
        double secs = (double)(bench_now_us() - t0) / 1e6;
        if (lpid > 0)
            after = rss_kb(lpid);
        /* Every object the leader holds (the callers levels stored some before these): the
         * divisor of total RSS / objects. */
        uint64_t held = 0;
        if (bench_cluster_objects(&m.target, &held) != 0 || held < stored)
            held = stored;
        if (m.json) {
            jo = json_pack("{s:I,s:I,s:f,s:I,s:I}", "objects", (json_int_t)stored, "objects_held", (json_int_t)held,
                           "seconds", secs, "leader_rss_kb_before", (json_int_t)before, "leader_rss_kb_after",
                           (json_int_t)after);
        } else {
            printf("objects: %llu stored in batches of %d in %.1f s (%.0f/s)\n", (unsigned long long)stored, BATCH,
                   secs, secs > 0 ? (double)stored / secs : 0);
            if (after > 0 && stored)
                printf("leader RSS: %ld KiB -> %ld KiB: %.0f bytes per object (growth), %.0f (total RSS / %llu objects "
                       "held)\n",
                       before, after, (double)(after - before) * 1024.0 / (double)stored,
                       (double)after * 1024.0 / (double)held, (unsigned long long)held);
            else
                printf("leader RSS: unknown (needs --cluster and a local leader)\n");
        }
    }

    json_t *jf = NULL;
    if (kills) {
        char dirbuf[PATH_MAX];
        snprintf(dirbuf, sizeof dirbuf, "%s", m.target.cluster_file);
        const char *dir = dirname(dirbuf);
        uint64_t *ms = calloc(kills, sizeof *ms);
        unsigned done = 0;
        for (unsigned k = 0; k < kills; k++) {
            long long id = 0, pid = 0;
            char addr[300];
            if (leader_info(ctl, m.target.cluster_file, &id, &pid, addr, sizeof addr)) {
                fprintf(stderr, "kvpool-bench meta: kill %u: leader unknown\n", k + 1);
                sleep(1);
                continue;
            }
            char key[96];
            char *kp[1] = {key};
            uint64_t t0 = bench_now_us();
            kill((pid_t)pid, SIGKILL);
            uint64_t i = 0;
            for (;;) {
                snprintf(key, sizeof key, "metaf-%d-%u-%llu", (int)getpid(), k, (unsigned long long)i++);
                if (put_pairs(&m, m.sess[0], kp, 1, 1000) == 0)
                    break;
                if (bench_now_us() - t0 > 60000000) {
                    fprintf(stderr, "kvpool-bench meta: kill %u: no successful put within 60 s\n", k + 1);
                    break;
                }
            }
            uint64_t dt = bench_now_us() - t0;
            ms[done++] = dt / 1000;
            if (!m.json) {
                printf("failover %u: killed master %lld (pid %lld): first put after %.0f ms\n", k + 1, id, pid,
                       dt / 1000.0);
                fflush(stdout);
            }
            char idb[32];
            snprintf(idb, sizeof idb, "%lld", id);
            char *rargv[] = {ctl, (char *)"cluster", (char *)"restart", (char *)"--dir", (char *)dir, idb, NULL};
            if (run_capture(rargv, NULL, 0) != 0)
                fprintf(stderr, "kvpool-bench meta: cluster restart %s failed\n", idb);
            /* Before the next kill, the restarted member must be back in the quorum (an operator
             * replaces a member before losing another): wait until it answers and follows a
             * leader (it has loaded its snapshot and log and heard from the leader), then 1 s. */
            uint64_t w0 = bench_now_us();
            bool back = false;
            while (!back && bench_now_us() - w0 < 60000000ull) {
                char out[4096];
                /* --masters picks the member to ask; --cluster gives kvpoolctl the cluster's keys (its
                 * "auth" section): with --masters alone it has none, and with authentication on every
                 * call failed until the 60 s bound below. */
                char *margv[] = {ctl, (char *)"--cluster", (char *)m.target.cluster_file, (char *)"--masters", addr,
                                 (char *)"--timeout", (char *)"500", (char *)"members", (char *)"--json", NULL};
                if (*addr && run_capture(margv, out, sizeof out) == 0) {
                    json_error_t e;
                    json_t *j = json_loads(out, 0, &e);
                    long long l = j ? json_integer_value(json_object_get(j, "leader_id")) : 0;
                    back = l != 0 && l != id;
                    json_decref(j);
                }
                if (!back)
                    usleep(100000);
            }
            if (!m.json) {
                printf("  member %lld back in the quorum after %.1f s%s\n", id, (double)(bench_now_us() - w0) / 1e6,
                       back ? "" : " (gave up waiting)");
                fflush(stdout);
            }
            sleep(1);
        }
        qsort(ms, done, sizeof *ms, cmp_u64);
        uint64_t med = done ? (done % 2 ? ms[done / 2] : (ms[done / 2 - 1] + ms[done / 2]) / 2) : 0;
        uint64_t mx = done ? ms[done - 1] : 0;
        if (m.json)
            jf = json_pack("{s:i,s:I,s:I}", "kills", (int)done, "median_ms", (json_int_t)med, "max_ms", (json_int_t)mx);
        else
            printf("failover (leader SIGKILL -> first successful put) over %u kills: median %llu ms, max %llu ms\n",
                   done, (unsigned long long)med, (unsigned long long)mx);
        free(ms);
    }

    atomic_store(&m.hb_stop, 1);
    pthread_join(m.hb, NULL);
    Kvp__UnmountSegmentReq ur = KVP__UNMOUNT_SEGMENT_REQ__INIT;
    ur.segment_id = m.seg_id;
    Kvp__Request ureq = KVP__REQUEST__INIT;
    ureq.body_case = KVP__REQUEST__BODY_UNMOUNT;
    ureq.unmount = &ur;
    if (call(m.sess[0], &ureq, 10000, &resp) == 0)
        kvp_msession_response_free(resp);
    if (m.json) {
        json_t *j = json_pack("{s:s,s:s,s:i,s:o}", "mode", "meta", "driver", pipe ? "pipe" : "threads", "batch",
                              (int)(m.batch ? m.batch : 1), "levels", jl);
        if (jo)
            json_object_set_new(j, "objects", jo);
        if (jf)
            json_object_set_new(j, "failover", jf);
        json_dumpf(j, stdout, JSON_INDENT(1));
        printf("\n");
        json_decref(j);
    } else {
        json_decref(jl);
    }
    for (unsigned i = 0; i < m.nsess; i++)
        kvp_msession_destroy(&m.sess[i]);
    return 0;
}
