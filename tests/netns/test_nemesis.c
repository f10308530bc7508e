/*
 * test_nemesis.c — issue 18's nemesis suite: faults of the masters' own making (a pause, a
 * partition from the segments), segment deaths, asymmetric partitions and a stopped segment, each
 * under a steady load of batch puts and gets (replica_num 2, self-checking payloads), on 3
 * masters and 4 segments in network namespaces, with client_ttl 2 s.
 *
 * Layout: a "hub" namespace holds the 3 masters (10.78.N.1, control ports 7101-7103, raft ports
 * 7201-7203) and a bridge; each segment host and the client host ("cli", 10.78.N.2, where the two
 * load processes run) is its own namespace joined to the bridge by a veth pair. Partitions are
 * nftables rules in a table "kvn18" inside the namespaces this test creates (never the host's
 * ruleset); the namespaces (and with them the rules) are removed at the end.
 *
 * One binary, one scenario per run: `test_nemesis SCENARIO` (CTest registers each as
 * test_nemesis_SCENARIO, tests/cmake/nemesis.cmake). Each prints its figures: objects lost, failed
 * reads (during the fault window and outside it), the longest window without a successful put
 * and without a successful get, the time to full replica count after the heal.
 * Pass: zero acknowledged objects lost except those whose every replica's segment was really
 * killed; zero wrong bytes; zero failed reads outside the fault window where the scenario keeps a
 * replica and a master reachable; every process alive; what the scenario says about "lost".
 * Needs root, `ip netns` and `nft`; skips with a message otherwise.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include "tests/integration/test_drain_util.h"
#include "tests/lib/proc_stop.h"
#include "actors/session/msession_internal.h" /* KVP_MS_PROBE_MS, KVP_MS_FIRST_ATTEMPT_MS */
#include "tests/lib/proc_reap.h"

#define HOSTS 4
#define TTL_MS 2000u
#define NM_CHILDREN 2
#define NM_MAX_KEYS 3000
#define NM_LEN (4u << 10)
#define NM_PUT_BATCH 4
#define NM_GET_BATCH 8
#define NM_CALL_MS 3000u
/* The masters' election_timeout_ms: the default (config_keys.c), not set by this suite. */
#define NM_ELECTION_MS 300u
/* How soon after all masters return a client's get must succeed: an election (about two election
 * timeouts, C5), one breaker probe period, one first attempt, and 1 s for a loaded 2-core machine
 * (seen: 21-399 ms). It stays below one call timeout (NM_CALL_MS): a client whose breaker did not
 * close at the first answer, or whose calls waited their whole timeout, still fails. */
#define NM_BACK_MS (2 * NM_ELECTION_MS + KVP_MS_PROBE_MS + KVP_MS_FIRST_ATTEMPT_MS + 1000u)
_Static_assert(NM_BACK_MS < NM_CALL_MS, "the bound must stay below a whole call timeout");

/* ------------------------------------------------------------------ load */

struct nm_child {
    atomic_ulong puts_ok, puts_failed, gets_ok, gets_failed, gets_failed_fault, corrupt;
    atomic_ulong fast_fails;           /* calls that failed in under 100 ms */
    atomic_ulong last_put_ok_ms, last_get_ok_ms, max_put_gap_ms, max_get_gap_ms;
    atomic_uint n_keys;
    atomic_uchar ok[NM_MAX_KEYS];      /* 0 not stored, 1 stored, 2 excluded (every replica killed) */
    atomic_bool paused;                /* acknowledges pause_puts */
    atomic_ulong call_start_ms;        /* start of the put/get call in progress */
    atomic_ulong done_start_ms;        /* start of the last call that has returned */
    char first_error[160];
};

struct nm_shared {
    atomic_bool stop, pause_puts, in_fault;
    struct nm_child ch[NM_CHILDREN];
};

static void nm_key(char *buf, size_t cap, int child, unsigned i)
{
    snprintf(buf, cap, "nm%d-%u", child, i);
}

static void note_ok(atomic_ulong *last, atomic_ulong *maxgap)
{
    unsigned long now = (unsigned long)kvp_clock_now_ms(), prev = atomic_load(last);
    if (prev && now - prev > atomic_load(maxgap))
        atomic_store(maxgap, now - prev);
    atomic_store(last, now);
}

struct nm_ctx {
    kvp_client *c;
    struct nm_shared *sh;
    struct nm_child *st;
    int child;
};

/* Puts, about 25 batches a second, in a thread of their own: a put stuck on an unreachable
 * segment must not hold the gets (the windows are measured per kind). */
static void *nm_put_loop(void *arg)
{
    struct nm_ctx *x = arg;
    struct nm_child *st = x->st;
    uint8_t *pbuf[NM_PUT_BATCH];
    for (int i = 0; i < NM_PUT_BATCH; i++)
        pbuf[i] = malloc(NM_LEN);
    while (!atomic_load(&x->sh->stop)) {
        uint64_t loop_t0 = kvp_clock_now_ms();
        unsigned n = atomic_load(&st->n_keys);
        bool pause = atomic_load(&x->sh->pause_puts);
        atomic_store(&st->paused, pause);
        if (!pause && n + NM_PUT_BATCH <= NM_MAX_KEYS) {
            char keys[NM_PUT_BATCH][32];
            const char *kp[NM_PUT_BATCH];
            const void *vp[NM_PUT_BATCH];
            size_t lens[NM_PUT_BATCH];
            int res[NM_PUT_BATCH];
            for (int i = 0; i < NM_PUT_BATCH; i++) {
                nm_key(keys[i], sizeof keys[i], x->child, n + (unsigned)i);
                tc_fill(keys[i], pbuf[i], NM_LEN);
                kp[i] = keys[i];
                vp[i] = pbuf[i];
                lens[i] = NM_LEN;
            }
            kvp_put_opts o = {.replica_num = 2, .timeout_ms = NM_CALL_MS};
            uint64_t t0 = kvp_clock_now_ms();
            int rc = kvp_batch_put(x->c, NM_PUT_BATCH, kp, vp, lens, &o, res);
            bool any = false;
            for (int i = 0; i < NM_PUT_BATCH; i++) {
                bool ok = rc == KVP_OK && res[i] == KVP_OK;
                any |= ok;
                atomic_store(&st->ok[n + (unsigned)i], ok ? 1 : 0);
                atomic_fetch_add(ok ? &st->puts_ok : &st->puts_failed, 1);
                if (!ok && !st->first_error[0] && !atomic_load(&x->sh->in_fault))
                    snprintf(st->first_error, sizeof st->first_error, "put %s: %s", kp[i],
                             kvp_errname(rc != KVP_OK ? rc : res[i]));
            }
            if (any)
                note_ok(&st->last_put_ok_ms, &st->max_put_gap_ms);
            else if (kvp_clock_now_ms() - t0 < 100)
                atomic_fetch_add(&st->fast_fails, 1);
            atomic_store(&st->n_keys, n + NM_PUT_BATCH);
        }
        uint64_t spent = kvp_clock_now_ms() - loop_t0;
        if (spent < 40)
            usleep((useconds_t)(40 - spent) * 1000);
    }
    return NULL;
}

/* One load process: a put thread and, on this thread, batch gets of random stored keys. */
static void nm_child_main(const struct tc_cluster *cl, struct nm_shared *sh, int child)
{
    struct nm_child *st = &sh->ch[child];
    kvp_client *c = tc_open(cl, 5000);
    if (!c) {
        snprintf(st->first_error, sizeof st->first_error, "client open failed");
        _exit(3);
    }
    uint8_t *gbuf[NM_GET_BATCH];
    for (int i = 0; i < NM_GET_BATCH; i++)
        gbuf[i] = malloc(NM_LEN);
    uint64_t seed = (uint64_t)getpid() * 2654435761u;
    atomic_store(&st->last_put_ok_ms, kvp_clock_now_ms());
    atomic_store(&st->last_get_ok_ms, kvp_clock_now_ms());
    struct nm_ctx x = {.c = c, .sh = sh, .st = st, .child = child};
    pthread_t put_thread;
    if (pthread_create(&put_thread, NULL, nm_put_loop, &x) != 0)
        _exit(4);
    while (!atomic_load(&sh->stop)) {
        uint64_t loop_t0 = kvp_clock_now_ms();
        unsigned n = atomic_load(&st->n_keys);
        char keys[NM_GET_BATCH][32];
        const char *kp[NM_GET_BATCH];
        void *bp[NM_GET_BATCH];
        size_t caps[NM_GET_BATCH];
        int64_t res[NM_GET_BATCH];
        int k = 0;
        for (int tries = 0; n && tries < 4 * NM_GET_BATCH && k < NM_GET_BATCH; tries++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            unsigned i = (unsigned)(seed % n);
            if (atomic_load(&st->ok[i]) != 1)
                continue;
            nm_key(keys[k], sizeof keys[k], child, i);
            kp[k] = keys[k];
            memset(gbuf[k], TC_POISON, NM_LEN);
            bp[k] = gbuf[k];
            caps[k] = NM_LEN;
            k++;
        }
        if (k > 0) {
            bool fault = atomic_load(&sh->in_fault);
            uint64_t t0 = kvp_clock_now_ms();
            atomic_store(&st->call_start_ms, t0);
            int rc = kvp_batch_get(c, (size_t)k, kp, bp, caps, NM_CALL_MS, res);
            atomic_store(&st->done_start_ms, t0);
            bool any = false;
            for (int i = 0; i < k; i++) {
                /* A key marked excluded meanwhile (both replicas killed) is not counted. */
                unsigned idx = (unsigned)strtoul(kp[i] + 4, NULL, 10);
                if (atomic_load(&st->ok[idx]) != 1)
                    continue;
                if (rc != KVP_OK || res[i] != (int64_t)NM_LEN) {
                    fault |= atomic_load(&sh->in_fault);
                    atomic_fetch_add(fault ? &st->gets_failed_fault : &st->gets_failed, 1);
                    if (!fault && !st->first_error[0])
                        snprintf(st->first_error, sizeof st->first_error, "get %s: %s", kp[i],
                                 rc != KVP_OK ? kvp_errname(rc) : res[i] < 0 ? kvp_errname((int)res[i]) : "short");
                } else if (!tc_check(kp[i], gbuf[i], NM_LEN)) {
                    atomic_fetch_add(&st->corrupt, 1);
                    snprintf(st->first_error, sizeof st->first_error, "get %s: wrong bytes", kp[i]);
                } else {
                    atomic_fetch_add(&st->gets_ok, 1);
                    any = true;
                }
            }
            if (any)
                note_ok(&st->last_get_ok_ms, &st->max_get_gap_ms);
            else if (kvp_clock_now_ms() - t0 < 100 && rc != KVP_OK)
                atomic_fetch_add(&st->fast_fails, 1);
        }
        uint64_t spent = kvp_clock_now_ms() - loop_t0;
        if (spent < 40)
            usleep((useconds_t)(40 - spent) * 1000);
    }
    pthread_join(put_thread, NULL);
    tc_close(&c);
    _exit(0);
}

/* ------------------------------------------------------------------ namespaces and processes */

static struct {
    bool ok;
    char why[256];
    int id, net;
    char hub[32], cli[32], ns[HOSTS][32], br[16];
    int orig_ns;
    pid_t masters[3], segs[HOSTS], load[NM_CHILDREN];
    uint32_t lost_before[16]; /* segment ids already LOST when the scenario began (setup) */
    unsigned n_lost_before;
    struct tc_cluster cl;
    struct nm_shared *sh;
    struct kvp_msession *ms;
    char list[256], members[512];
} N;

static int sh(const char *fmt, ...)
{
    char cmd[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[900];
    snprintf(full, sizeof full, "%s >/dev/null 2>&1", cmd);
    return system(full) == 0 ? 0 : -1;
}

static int enter_ns(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "/var/run/netns/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = setns(fd, CLONE_NEWNET);
    close(fd);
    return rc;
}

static void stop_pid(pid_t *p)
{
    if (*p > 0) {
        kill(*p, SIGCONT);
        kill(*p, SIGKILL);
        waitpid(*p, NULL, 0);
    }
    *p = 0;
}

static void cleanup(void)
{
    if (N.sh)
        atomic_store(&N.sh->stop, true);
    for (int i = 0; i < NM_CHILDREN; i++)
        stop_pid(&N.load[i]);
    kvp_msession_destroy(&N.ms);
    for (int i = 0; i < HOSTS; i++)
        stop_pid(&N.segs[i]);
    for (int i = 0; i < 3; i++)
        stop_pid(&N.masters[i]);
    if (N.orig_ns >= 0) {
        if (setns(N.orig_ns, CLONE_NEWNET) != 0)
            fprintf(stderr, "setns back failed\n");
        close(N.orig_ns);
        N.orig_ns = -1;
    }
    for (int i = 0; i < HOSTS; i++)
        if (N.ns[i][0])
            sh("ip netns del %s", N.ns[i]);
    if (N.cli[0])
        sh("ip netns del %s", N.cli);
    if (N.hub[0])
        sh("ip netns del %s", N.hub);
    if (N.cl.dir[0] && !getenv("KVP_NEMESIS_KEEP")) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", N.cl.dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", N.cl.dir);
    }
}

static pid_t spawn_in(const char *ns, char *const argv[], const char *log)
{
    pid_t p = fork();
    kvp_test_child_track(p); /* killed at teardown if a failed assert skips its stop */
    if (p != 0)
        return p;
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
    }
    if (enter_ns(ns) != 0)
        _exit(126);
    execv(argv[0], argv);
    _exit(127);
}

static bool log_has(const char *path, const char *needle)
{
    char line[1024];
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool ok = false;
    while (!ok && fgets(line, sizeof line, f))
        ok = strstr(line, needle) != NULL;
    fclose(f);
    return ok;
}

static unsigned logs_count(const char *needle)
{
    unsigned n = 0;
    for (int i = 0; i < 3; i++) {
        char path[400], line[1024];
        snprintf(path, sizeof path, "%s/master-%d.log", N.cl.dir, i + 1);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        while (fgets(line, sizeof line, f))
            n += strstr(line, needle) != NULL;
        fclose(f);
    }
    return n;
}

static int add_host_ns(const char *name, int idx, int addr)
{
    return sh("ip netns add %s", name) || sh("ip -n %s link set lo up", name) ||
                   sh("ip link add kvh%d%d netns %s type veth peer name kvs%d%d netns %s", N.id, idx, N.hub, N.id,
                      idx, name) ||
                   sh("ip -n %s link set kvh%d%d master %s", N.hub, N.id, idx, N.br) ||
                   sh("ip -n %s link set kvh%d%d up", N.hub, N.id, idx) ||
                   sh("ip -n %s addr add 10.78.%d.%d/24 dev kvs%d%d", name, N.net, addr, N.id, idx) ||
                   sh("ip -n %s link set kvs%d%d up", name, N.id, idx)
               ? -1
               : 0;
}

static void spawn_segment(int i)
{
    const char *bd = getenv("KVP_BUILD_DIR");
    char sexe[512], name[32], host[32], log[400];
    snprintf(sexe, sizeof sexe, "%s/tools/kvpool-segment", bd ? bd : ".");
    snprintf(name, sizeof name, "host-%d", i);
    snprintf(host, sizeof host, "10.78.%d.%d", N.net, 11 + i);
    snprintf(log, sizeof log, "%s/host-%d.log", N.cl.dir, i);
    char *argv[] = {sexe, "--name", name, "--global-segment-size", "48M", "--local-hostname", host,
                    "--master-server-address", N.list, NULL};
    N.segs[i] = spawn_in(N.ns[i], argv, log);
}

static void spawn_master(int i)
{
    const char *bd = getenv("KVP_BUILD_DIR");
    char mexe[512], id[8], listen[64], raft[64], data[400], log[400];
    snprintf(mexe, sizeof mexe, "%s/tools/kvpool-master", bd ? bd : ".");
    snprintf(id, sizeof id, "%d", i + 1);
    snprintf(listen, sizeof listen, "10.78.%d.1:%d", N.net, 7101 + i);
    snprintf(raft, sizeof raft, "10.78.%d.1:%d", N.net, 7201 + i);
    snprintf(data, sizeof data, "%s/master-%d", N.cl.dir, i + 1);
    snprintf(log, sizeof log, "%s/master-%d.log", N.cl.dir, i + 1);
    char *argv[] = {mexe, "--id", id, "--listen", listen, "--raft-address", raft, "--data-dir", data,
                    "--members", N.members, NULL};
    char fault[400];
    snprintf(fault, sizeof fault, "%s/master-%d.fault", N.cl.dir, i + 1);
    setenv("KVP_RAFTLOG_FAULT_FILE", fault, 1); /* raftlog's log-write fault injection (test builds) */
    N.masters[i] = spawn_in(N.hub, argv, log);
    unsetenv("KVP_RAFTLOG_FAULT_FILE");
}

static json_t *status(void);

static int setup(void)
{
    memset(&N, 0, sizeof N);
    N.orig_ns = -1;
    if (geteuid() != 0) {
        snprintf(N.why, sizeof N.why, "not root: network namespaces need CAP_SYS_ADMIN");
        return 0;
    }
    if (sh("ip netns list") || sh("nft --version")) {
        snprintf(N.why, sizeof N.why, "`ip netns` or `nft` is not available");
        return 0;
    }
    N.id = (int)(getpid() % 10000);
    N.net = 1 + (int)((getpid() / 7) % 250);
    snprintf(N.hub, sizeof N.hub, "kvn18h%d", N.id);
    snprintf(N.cli, sizeof N.cli, "kvn18c%d", N.id);
    snprintf(N.br, sizeof N.br, "kvnb%d", N.id);
    if (sh("ip netns add %s", N.hub) || sh("ip -n %s link set lo up", N.hub) ||
        sh("ip -n %s link add %s type bridge", N.hub, N.br) ||
        sh("ip -n %s addr add 10.78.%d.1/24 dev %s", N.hub, N.net, N.br) ||
        sh("ip -n %s link set %s up", N.hub, N.br)) {
        snprintf(N.why, sizeof N.why, "hub namespace / bridge set-up failed");
        cleanup();
        return -1;
    }
    for (int i = 0; i < HOSTS; i++) {
        snprintf(N.ns[i], sizeof N.ns[i], "kvn18s%d-%d", N.id, i);
        if (add_host_ns(N.ns[i], i, 11 + i)) {
            cleanup();
            return -1;
        }
    }
    if (add_host_ns(N.cli, HOSTS, 2)) {
        cleanup();
        return -1;
    }
    snprintf(N.cl.dir, sizeof N.cl.dir, "/tmp/kvp-nemesis-XXXXXX");
    if (!mkdtemp(N.cl.dir)) {
        N.cl.dir[0] = 0;
        cleanup();
        return -1;
    }
    snprintf(N.cl.file, sizeof N.cl.file, "%s/cluster.json", N.cl.dir);
    snprintf(N.list, sizeof N.list, "10.78.%d.1:7101,10.78.%d.1:7102,10.78.%d.1:7103", N.net, N.net, N.net);
    snprintf(N.members, sizeof N.members,
             "1@10.78.%d.1:7101@10.78.%d.1:7201,2@10.78.%d.1:7102@10.78.%d.1:7202,3@10.78.%d.1:7103@10.78.%d.1:7203",
             N.net, N.net, N.net, N.net, N.net, N.net);
    FILE *f = fopen(N.cl.file, "w");
    if (!f) {
        cleanup();
        return -1;
    }
    fprintf(f, "{\"master_server_address\": \"%s\", \"auth\": {\"mode\": \"none\"}}\n", N.list);
    fclose(f);
    char ttl[16];
    snprintf(ttl, sizeof ttl, "%ums", TTL_MS); /* with its unit: client_ttl's plain unit is Mooncake's */
    /* Masters and clients in network namespaces (non-loopback Raft addresses) without keys: this
     * suite is about faults, authentication has its own tests (test_auth_cluster.c). */
    setenv("KVPOOL_AUTH", "none", 1);
    setenv("KVPOOL_DEFAULT_KV_LEASE_TTL", "2000", 1);
    setenv("KVPOOL_CLIENT_TTL", ttl, 1);
    setenv("KVPOOL_HEARTBEAT_MS", "300", 1);
    for (int i = 0; i < 3; i++)
        spawn_master(i);
    for (int i = 0; i < HOSTS; i++)
        spawn_segment(i);
    uint64_t t0 = kvp_clock_now_ms();
    int mounted = 0;
    while (mounted < HOSTS && kvp_clock_now_ms() - t0 < 30000) {
        usleep(100000);
        mounted = 0;
        for (int i = 0; i < HOSTS; i++) {
            char log[400], want[64];
            snprintf(log, sizeof log, "%s/host-%d.log", N.cl.dir, i);
            snprintf(want, sizeof want, "kvpool-segment: host-%d id", i);
            mounted += log_has(log, want);
        }
    }
    if (mounted < HOSTS) {
        fprintf(stderr, "only %d of %d segments mounted\n", mounted, HOSTS);
        cleanup();
        return -1;
    }
    /* The load runs in the client namespace; this process stays in the hub (status, checks). */
    N.sh = mmap(NULL, sizeof *N.sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (N.sh == MAP_FAILED) {
        N.sh = NULL;
        cleanup();
        return -1;
    }
    memset(N.sh, 0, sizeof *N.sh);
    for (int i = 0; i < NM_CHILDREN; i++) {
        pid_t p = fork();
        kvp_test_child_track(p);
        if (p == 0) {
            if (enter_ns(N.cli) != 0)
                _exit(126);
            nm_child_main(&N.cl, N.sh, i);
        }
        N.load[i] = p;
    }
    N.orig_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (N.orig_ns < 0 || enter_ns(N.hub) != 0) {
        cleanup();
        return -1;
    }
    N.ms = td_session(&N.cl);
    if (!N.ms) {
        cleanup();
        return -1;
    }
    /* Losses before any fault do not count: a segment whose first mount was answered after its
     * 2 s try window mounts again, and the master marks the first registration LOST (the same
     * name, host and endpoint: a restart, fsm_cmd.c on_mount). Seen at load 20-30 ("mount try 1:
     * no master answered within 2000 ms", segment 4 LOST, the segment serving as 5): the
     * scenario then counted a loss it did not cause. */
    json_t *d = status();
    size_t i;
    json_t *sg;
    N.n_lost_before = 0;
    json_array_foreach(json_object_get(d, "segments"), i, sg) {
        const char *st = json_string_value(json_object_get(sg, "state"));
        if (st && strcasestr(st, "lost") && N.n_lost_before < sizeof N.lost_before / sizeof N.lost_before[0])
            N.lost_before[N.n_lost_before++] = (uint32_t)td_jint(sg, "id");
    }
    json_decref(d);
    if (N.n_lost_before)
        printf("set-up: %u segment registration(s) already LOST (a mount tried again); not counted\n",
               N.n_lost_before);
    N.ok = true;
    return 0;
}

/* nftables: a table "kvn18" in namespace ns dropping what `rule` matches, both directions. */
static int nft_drop(const char *ns, const char *rule_in, const char *rule_out)
{
    if (sh("ip netns exec %s nft add table inet kvn18", ns) ||
        sh("ip netns exec %s nft 'add chain inet kvn18 in { type filter hook input priority 0; }'", ns) ||
        sh("ip netns exec %s nft 'add chain inet kvn18 out { type filter hook output priority 0; }'", ns))
        return -1;
    if (rule_in && sh("ip netns exec %s nft add rule inet kvn18 in %s drop", ns, rule_in))
        return -1;
    if (rule_out && sh("ip netns exec %s nft add rule inet kvn18 out %s drop", ns, rule_out))
        return -1;
    return 0;
}

/* A cut like nft_drop's, as one `nft -f` transaction: every rule lands at the same instant.
 * in_rules and out_rules are complete nft statements ("ip saddr X drop; tcp dport Y drop").
 * A cut applied namespace by namespace (5 `ip netns exec nft` runs each) spread over a second or
 * more at load 20-30, longer than a segment's heartbeat period: the hosts cut last kept
 * heartbeating after the first ones fell silent and, by the liveness rule, rightly vouched for
 * their loss (masters_cut_from_segments declared 1 segment lost once in 3 runs at load 21). */
static int nft_drop_at_once(const char *ns, const char *in_rules, const char *out_rules)
{
    char file[400];
    snprintf(file, sizeof file, "%s/nft-%s.rules", N.cl.dir, ns);
    FILE *f = fopen(file, "w");
    if (!f)
        return -1;
    fprintf(f,
            "table inet kvn18 {\n"
            "  chain in { type filter hook input priority 0; %s; }\n"
            "  chain out { type filter hook output priority 0; %s; }\n"
            "}\n",
            in_rules, out_rules);
    if (fclose(f) != 0)
        return -1;
    return sh("ip netns exec %s nft -f %s", ns, file);
}

static void nft_heal(const char *ns)
{
    sh("ip netns exec %s nft delete table inet kvn18", ns);
}

/* ------------------------------------------------------------------ checks */

static json_t *status(void)
{
    for (int i = 0; i < 20; i++) {
        json_t *d = td_status(N.ms);
        if (d)
            return d;
        usleep(100000);
    }
    return NULL;
}

static unsigned lost_segments(json_t *doc)
{
    unsigned n = 0;
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(doc, "segments"), i, s) {
        const char *st = json_string_value(json_object_get(s, "state"));
        if (!st || !strcasestr(st, "lost"))
            continue;
        bool before = false;
        for (unsigned k = 0; k < N.n_lost_before; k++)
            before |= N.lost_before[k] == (uint32_t)td_jint(s, "id");
        n += !before;
    }
    return n;
}

static uint32_t seg_id(json_t *doc, int host)
{
    char name[32];
    snprintf(name, sizeof name, "host-%d", host);
    return td_segment_id(doc, name, NULL);
}

static int leader_index(void)
{
    json_t *d = status();
    int l = d ? (int)td_jint(d, "leader_id") : 0;
    json_decref(d);
    return l >= 1 && l <= 3 ? l - 1 : -1;
}

/* Replica lists of every stored key: keys with fewer than 2 replicas, keys not found; when
 * dead[] is given, keys whose every replica is on a dead segment are marked excluded (2). */
static void check_replicas(unsigned *n_keys, unsigned *n_short, unsigned *n_missing, const uint32_t *dead,
                           size_t n_dead)
{
    *n_keys = *n_short = *n_missing = 0;
    for (int c = 0; c < NM_CHILDREN; c++) {
        unsigned n = atomic_load(&N.sh->ch[c].n_keys);
        for (unsigned base = 0; base < n; base += 64) {
            char keys[64][32];
            char *kp[64];
            unsigned idx[64];
            size_t k = 0;
            for (unsigned i = base; i < n && i < base + 64; i++)
                if (atomic_load(&N.sh->ch[c].ok[i]) == 1) {
                    nm_key(keys[k], sizeof keys[k], c, i);
                    kp[k] = keys[k];
                    idx[k++] = i;
                }
            if (!k)
                continue;
            Kvp__Request req = KVP__REQUEST__INIT;
            Kvp__GetReplicaListReq g = KVP__GET_REPLICA_LIST_REQ__INIT;
            g.keys = kp;
            g.n_keys = k;
            req.body_case = KVP__REQUEST__BODY_GET_REPLICAS;
            req.get_replicas = &g;
            Kvp__Response *resp = NULL;
            int rc = kvp_msession_call(N.ms, &req, 5000, &resp);
            for (size_t i = 0; i < k; i++) {
                (*n_keys)++;
                const Kvp__ObjectInfo *o = rc == KVP_OK && resp->get_replicas && i < resp->get_replicas->n_objects
                                               ? resp->get_replicas->objects[i]
                                               : NULL;
                if (!o || o->status != KVP_OK) {
                    (*n_missing)++;
                    continue;
                }
                if (o->n_replicas < 2)
                    (*n_short)++;
                if (dead) {
                    size_t on_dead = 0;
                    for (size_t r = 0; r < o->n_replicas; r++)
                        for (size_t d = 0; d < n_dead; d++)
                            on_dead += o->replicas[r]->segment_id == dead[d];
                    if (o->n_replicas > 0 && on_dead == o->n_replicas)
                        atomic_store(&N.sh->ch[c].ok[idx[i]], 2);
                }
            }
            kvp_msession_response_free(resp);
        }
    }
}

/* Wait (up to timeout) until every stored key has 2 replicas again; returns ms taken or -1. */
static long long wait_full_replicas(uint32_t timeout_ms)
{
    uint64_t t0 = kvp_clock_now_ms();
    while (kvp_clock_now_ms() - t0 < timeout_ms) {
        unsigned nk, ns, nm;
        check_replicas(&nk, &ns, &nm, NULL, 0);
        if (ns == 0 && nm == 0)
            return (long long)(kvp_clock_now_ms() - t0);
        usleep(250000);
    }
    return -1;
}

/* Every key stored (ok == 1): get it with a fresh client; counts lost (NOT_FOUND), failed
 * (other errors) and wrong bytes. */
static void verify_all(unsigned *n_keys, unsigned *n_lost, unsigned *n_failed, unsigned *n_wrong)
{
    *n_keys = *n_lost = *n_failed = *n_wrong = 0;
    kvp_client *c = tc_open(&N.cl, 5000);
    assert_non_null(c);
    uint8_t *buf = malloc(NM_LEN);
    for (int ch = 0; ch < NM_CHILDREN; ch++) {
        unsigned n = atomic_load(&N.sh->ch[ch].n_keys);
        for (unsigned i = 0; i < n; i++) {
            if (atomic_load(&N.sh->ch[ch].ok[i]) != 1)
                continue;
            char key[32];
            nm_key(key, sizeof key, ch, i);
            memset(buf, TC_POISON, NM_LEN);
            int64_t r = kvp_get(c, key, buf, NM_LEN, 5000);
            (*n_keys)++;
            if (r == KVP_ERR_NOT_FOUND)
                (*n_lost)++;
            else if (r != (int64_t)NM_LEN)
                (*n_failed)++;
            else if (!tc_check(key, buf, NM_LEN))
                (*n_wrong)++;
        }
    }
    free(buf);
    tc_close(&c);
}

static void wait_keys(unsigned want)
{
    uint64_t t0 = kvp_clock_now_ms();
    while (kvp_clock_now_ms() - t0 < 30000 &&
           (atomic_load(&N.sh->ch[0].n_keys) < want || atomic_load(&N.sh->ch[1].n_keys) < want))
        usleep(50000);
}

static void pause_puts(bool on)
{
    atomic_store(&N.sh->pause_puts, on);
    if (!on)
        return;
    uint64_t t0 = kvp_clock_now_ms();
    while (kvp_clock_now_ms() - t0 < 10000 &&
           !(atomic_load(&N.sh->ch[0].paused) && atomic_load(&N.sh->ch[1].paused)))
        usleep(20000);
}

static void fault_begin(void)
{
    atomic_store(&N.sh->in_fault, true);
}

/* The fault is healed: the window ends once every load process has finished a call it started
 * after the heal (the calls in flight during the fault are over by then) and has read
 * successfully again (a client whose breaker was open has seen a master answer). */
static void fault_end(void)
{
    unsigned long heal = (unsigned long)kvp_clock_now_ms();
    uint64_t t0 = kvp_clock_now_ms();
    for (int i = 0; i < NM_CHILDREN; i++) {
        struct nm_child *c = &N.sh->ch[i];
        while (kvp_clock_now_ms() - t0 < 4 * NM_CALL_MS &&
               !(atomic_load(&c->done_start_ms) > heal && atomic_load(&c->last_get_ok_ms) > heal))
            usleep(10000);
    }
    atomic_store(&N.sh->in_fault, false);
}

/* The longest windows without a successful put / get since the last call (then reset). */
static void phase_gaps(unsigned long *put_gap, unsigned long *get_gap)
{
    *put_gap = *get_gap = 0;
    for (int i = 0; i < NM_CHILDREN; i++) {
        struct nm_child *c = &N.sh->ch[i];
        unsigned long p = atomic_exchange(&c->max_put_gap_ms, 0), g = atomic_exchange(&c->max_get_gap_ms, 0);
        unsigned long now = (unsigned long)kvp_clock_now_ms();
        unsigned long lp = now - atomic_load(&c->last_put_ok_ms), lg = now - atomic_load(&c->last_get_ok_ms);
        if (lp > p)
            p = lp; /* a window still open */
        if (lg > g)
            g = lg;
        if (p > *put_gap)
            *put_gap = p;
        if (g > *get_gap)
            *get_gap = g;
    }
}

/* SIGSTOP waits until every thread of each master is stopped (tests/lib/proc_stop.h): the pause
 * a scenario measures starts when they are silent, not when the signal is queued. */
static void all_masters(int sig)
{
    for (int i = 0; i < 3; i++)
        if (sig == SIGSTOP)
            assert_true(kvp_test_stop_process(N.masters[i], 10000));
        else
            kill(N.masters[i], sig);
}

static bool alive(pid_t *p, const char *what, int i)
{
    int st = 0;
    if (*p <= 0)
        return false;
    if (waitpid(*p, &st, WNOHANG) == 0)
        return true;
    fprintf(stderr, "%s %d (pid %d) is gone: %s %d\n", what, i, (int)*p, WIFSIGNALED(st) ? "signal" : "exit",
            WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    *p = 0;
    return false;
}

static bool all_alive(void)
{
    bool ok = true;
    for (int i = 0; i < 3; i++)
        ok &= alive(&N.masters[i], "master", i + 1);
    for (int i = 0; i < HOSTS; i++)
        if (N.segs[i] > 0)
            ok &= alive(&N.segs[i], "segment host", i);
    for (int i = 0; i < NM_CHILDREN; i++)
        ok &= waitpid(N.load[i], NULL, WNOHANG) == 0;
    return ok;
}

struct figures {
    unsigned keys, lost, failed, wrong, excluded, lost_segments;
    unsigned long gets_failed, gets_failed_fault, puts_failed, puts_ok, gets_ok, corrupt, fast_fails;
    unsigned long max_put_gap, max_get_gap;
    long long full_ms;
};

/* Stop the load, wait for full replica count, read every object back, print the figures. */
static void finish(const char *scenario, struct figures *f, uint32_t full_timeout_ms)
{
    memset(f, 0, sizeof *f);
    bool alive = all_alive();
    f->full_ms = wait_full_replicas(full_timeout_ms);
    atomic_store(&N.sh->stop, true);
    for (int i = 0; i < NM_CHILDREN; i++) {
        int st = 0;
        waitpid(N.load[i], &st, 0);
        N.load[i] = 0;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            alive = false;
        struct nm_child *c = &N.sh->ch[i];
        f->gets_failed += atomic_load(&c->gets_failed);
        f->gets_failed_fault += atomic_load(&c->gets_failed_fault);
        f->puts_failed += atomic_load(&c->puts_failed);
        f->puts_ok += atomic_load(&c->puts_ok);
        f->gets_ok += atomic_load(&c->gets_ok);
        f->corrupt += atomic_load(&c->corrupt);
        f->fast_fails += atomic_load(&c->fast_fails);
        if (atomic_load(&c->max_put_gap_ms) > f->max_put_gap)
            f->max_put_gap = atomic_load(&c->max_put_gap_ms);
        if (atomic_load(&c->max_get_gap_ms) > f->max_get_gap)
            f->max_get_gap = atomic_load(&c->max_get_gap_ms);
        for (unsigned k = 0; k < atomic_load(&c->n_keys); k++)
            f->excluded += atomic_load(&c->ok[k]) == 2;
        if (c->first_error[0])
            fprintf(stderr, "load %d: first error outside the fault window: %s\n", i, c->first_error);
    }
    verify_all(&f->keys, &f->lost, &f->failed, &f->wrong);
    json_t *doc = status();
    f->lost_segments = doc ? lost_segments(doc) : 99;
    json_decref(doc);
    printf("nemesis %s: %u objects checked, %u lost, %u unreadable, %u wrong bytes (%u excluded: every replica "
           "killed); gets ok %lu, failed %lu outside the fault window, %lu inside; puts ok %lu, failed %lu; corrupt "
           "%lu; longest window without a put %lu ms, without a get %lu ms; full replica count %lld ms after the "
           "heal; segments declared lost %u; master log: %u withheld episodes, %u blind periods\n",
           scenario, f->keys, f->lost, f->failed, f->wrong, f->excluded, f->gets_ok, f->gets_failed,
           f->gets_failed_fault, f->puts_ok, f->puts_failed, f->corrupt, f->max_put_gap, f->max_get_gap, f->full_ms,
           f->lost_segments, logs_count("NOT declaring segments"), logs_count("did not run for"));
    fflush(stdout);
    assert_true(alive);
    assert_int_equal(f->lost, 0);
    assert_int_equal(f->failed, 0);
    assert_int_equal(f->wrong, 0);
    assert_int_equal(f->corrupt, 0);
    assert_true(f->full_ms >= 0);
}

/* ------------------------------------------------------------------ scenarios */

/* Every master SIGSTOPped for 2x, then (after recovery) 5x client_ttl: nothing declared lost. */
static void sc_masters_paused(void)
{
    wait_keys(100);
    for (int round = 0; round < 2; round++) {
        uint32_t ms = (round == 0 ? 2 : 5) * TTL_MS;
        fault_begin();
        all_masters(SIGSTOP);
        usleep(ms * 1000);
        all_masters(SIGCONT);
        fault_end();
        json_t *d = status();
        assert_non_null(d);
        assert_int_equal(lost_segments(d), 0);
        json_decref(d);
    }
    usleep(2 * TTL_MS * 1000); /* a ttl of normal running after the resume: still nothing lost */
    struct figures f;
    finish("masters_paused", &f, 20000);
    assert_int_equal(f.lost_segments, 0);
    assert_int_equal(f.gets_failed, 0);
}

/* The masters cut off from every segment (all traffic between the masters' address and the
 * segments: heartbeats and the leader's probes) for 3x client_ttl; clients still reach both.
 * Puts are paused for the partition (gets go on) and the probes cannot pass: clients' writes and
 * the probes' answers would witness the segments (rule 5) and hide what this scenario checks,
 * the leader's self-suspicion (rule 3): it must withhold, not drop four healthy segments. */
static void sc_masters_cut_from_segments(void)
{
    wait_keys(100);
    pause_puts(true);
    /* In the hub, where the masters (10.78.N.1) live: every segment host's address (10.78.N.11
     * and up) at once. */
    char in[96], out[96];
    snprintf(in, sizeof in, "ip saddr 10.78.%d.11-10.78.%d.%d drop", N.net, N.net, 10 + HOSTS);
    snprintf(out, sizeof out, "ip daddr 10.78.%d.11-10.78.%d.%d drop", N.net, N.net, 10 + HOSTS);
    assert_int_equal(nft_drop_at_once(N.hub, in, out), 0);
    usleep(3 * TTL_MS * 1000);
    json_t *d = status();
    assert_non_null(d);
    unsigned lost_during = lost_segments(d);
    json_t *lv = json_object_get(d, "liveness");
    printf("during the partition: withholding %s (%s)\n",
           json_is_true(json_object_get(lv, "withholding")) ? "yes" : "no",
           json_string_value(json_object_get(lv, "withheld_why")));
    json_decref(d);
    nft_heal(N.hub);
    pause_puts(false);
    usleep(2 * TTL_MS * 1000);
    struct figures f;
    finish("masters_cut_from_segments", &f, 20000);
    assert_int_equal(lost_during, 0);
    assert_int_equal(f.lost_segments, 0);
    assert_int_equal(f.gets_failed, 0);
    assert_true(logs_count("NOT declaring segments") >= 1);
}

/* Keys (stored, not excluded) whose every replica lies on segments a and b. */
static unsigned keys_only_on(uint32_t a, uint32_t b)
{
    uint32_t pair[2] = {a, b};
    unsigned nk, ns, nm, n = 0;
    check_replicas(&nk, &ns, &nm, pair, 2); /* marks them excluded (2): counted, then restored */
    for (int c = 0; c < NM_CHILDREN; c++)
        for (unsigned k = 0; k < atomic_load(&N.sh->ch[c].n_keys); k++)
            if (atomic_load(&N.sh->ch[c].ok[k]) == 2) {
                atomic_store(&N.sh->ch[c].ok[k], 1);
                n++;
            }
    return n;
}

/* The masters cut off from the control plane of two of four segments for 3x client_ttl while
 * clients read (puts paused: a read-only inference fleet serving its prefix cache). The two are
 * the pair holding both replicas of the most objects; their data planes stay reachable. From
 * the heartbeats alone this looks like two of four segments killed; the clients' successful
 * reads and the leader's probes of the silent segments say otherwise: neither is dropped, no
 * object is lost. */
static void sc_masters_cut_from_half(void)
{
    wait_keys(300);
    pause_puts(true);
    json_t *d = status();
    assert_non_null(d);
    uint32_t id[HOSTS];
    for (int h = 0; h < HOSTS; h++)
        id[h] = seg_id(d, h);
    json_decref(d);
    int ha = 0, hb = 1;
    unsigned both = 0;
    for (int x = 0; x < HOSTS; x++)
        for (int y = x + 1; y < HOSTS; y++) {
            unsigned k = keys_only_on(id[x], id[y]);
            if (k > both)
                both = k, ha = x, hb = y;
        }
    assert_true(both > 0);
    assert_int_equal(nft_drop(N.ns[ha], "tcp sport 7101-7103", "tcp dport 7101-7103"), 0);
    assert_int_equal(nft_drop(N.ns[hb], "tcp sport 7101-7103", "tcp dport 7101-7103"), 0);
    usleep(3 * TTL_MS * 1000);
    d = status();
    assert_non_null(d);
    unsigned dropped = (seg_id(d, ha) != id[ha]) + (seg_id(d, hb) != id[hb]);
    json_decref(d);
    nft_heal(N.ns[ha]);
    nft_heal(N.ns[hb]);
    pause_puts(false);
    usleep(2 * TTL_MS * 1000);
    printf("masters cut from hosts %d and %d (%u objects have both replicas there; clients read from them): %u of "
           "the two declared lost\n",
           ha, hb, both, dropped);
    struct figures f;
    finish("masters_cut_from_half", &f, 20000);
    assert_int_equal(dropped, 0);
    assert_int_equal(f.gets_failed, 0);
}

/* Two of four segments SIGKILLed at once: both declared lost and repaired; no read of an object
 * with a living replica fails. */
static void sc_two_segments_killed(void)
{
    wait_keys(200);
    json_t *d = status();
    assert_non_null(d);
    /* Hosts 1 and 3: the allocator pairs replicas across all four, so most keys keep one. */
    uint32_t dead[2] = {seg_id(d, 1), seg_id(d, 3)};
    json_decref(d);
    pause_puts(true);
    unsigned nk, ns, nm;
    check_replicas(&nk, &ns, &nm, dead, 2);
    ns = 0;
    for (int c = 0; c < NM_CHILDREN; c++)
        for (unsigned k = 0; k < atomic_load(&N.sh->ch[c].n_keys); k++)
            ns += atomic_load(&N.sh->ch[c].ok[k]) == 2;
    uint64_t tk = kvp_clock_now_ms();
    kill(N.segs[1], SIGKILL);
    kill(N.segs[3], SIGKILL);
    waitpid(N.segs[1], NULL, 0);
    waitpid(N.segs[3], NULL, 0);
    N.segs[1] = N.segs[3] = 0;
    pause_puts(false);
    uint64_t lost_ms = 0;
    while (!lost_ms && kvp_clock_now_ms() - tk < 6 * TTL_MS) {
        usleep(100000);
        d = status();
        if (d && lost_segments(d) == 2)
            lost_ms = kvp_clock_now_ms() - tk;
        json_decref(d);
    }
    long long full = wait_full_replicas(30000);
    printf("two segments killed (%u keys with every replica on them): both declared lost after %llu ms, every "
           "other key on 2 replicas again %lld ms after the kill\n",
           ns, (unsigned long long)lost_ms, full < 0 ? -1LL : (long long)(kvp_clock_now_ms() - tk));
    struct figures f;
    finish("two_segments_killed", &f, 30000);
    assert_true(lost_ms > 0);
    assert_int_equal(f.lost_segments, 2);
    assert_int_equal(f.gets_failed, 0);
}

/* Asymmetric: (a) the masters cannot reach segment 0 (its control plane dropped) but clients can;
 * (b) clients cannot reach segment 1 but the masters can; (c) segment 2 cut off from everyone
 * (link down): lost after the grace, repaired. */
static void sc_asymmetric(void)
{
    wait_keys(100);
    json_t *d = status();
    assert_non_null(d);
    uint32_t s0 = seg_id(d, 0), s1 = seg_id(d, 1), s2 = seg_id(d, 2);
    json_decref(d);
    unsigned long pg, gg;
    phase_gaps(&pg, &gg);
    /* (a) */
    assert_int_equal(nft_drop(N.ns[0], "tcp sport 7101-7103", "tcp dport 7101-7103"), 0);
    usleep(3 * TTL_MS * 1000);
    d = status();
    bool a_lost = d && seg_id(d, 0) != s0;
    json_decref(d);
    nft_heal(N.ns[0]);
    phase_gaps(&pg, &gg);
    printf("asymmetric (a) masters cannot reach segment %u, clients can: %s; longest window without a put %lu ms, "
           "without a get %lu ms\n",
           s0, a_lost ? "declared lost (remounted as new, objects re-replicated)" : "kept (clients' puts witness it)",
           pg, gg);
    /* (b) */
    char in[64], out[64];
    snprintf(in, sizeof in, "ip saddr 10.78.%d.2", N.net);
    snprintf(out, sizeof out, "ip daddr 10.78.%d.2", N.net);
    fault_begin();
    assert_int_equal(nft_drop(N.ns[1], in, out), 0);
    usleep(3 * TTL_MS * 1000);
    d = status();
    bool b_lost = d && seg_id(d, 1) != s1;
    json_decref(d);
    nft_heal(N.ns[1]);
    fault_end();
    phase_gaps(&pg, &gg);
    printf("asymmetric (b) clients cannot reach segment %u, masters can: %s; longest window without a put %lu ms, "
           "without a get %lu ms\n",
           s1, b_lost ? "declared lost" : "kept", pg, gg);
    /* (c) */
    uint64_t tc = kvp_clock_now_ms();
    assert_int_equal(sh("ip -n %s link set kvs%d%d down", N.ns[2], N.id, 2), 0);
    uint64_t c_lost = 0;
    while (!c_lost && kvp_clock_now_ms() - tc < 5 * TTL_MS) {
        usleep(100000);
        d = status();
        if (d && seg_id(d, 2) != s2)
            c_lost = kvp_clock_now_ms() - tc;
        json_decref(d);
    }
    assert_int_equal(sh("ip -n %s link set kvs%d%d up", N.ns[2], N.id, 2), 0);
    phase_gaps(&pg, &gg);
    printf("asymmetric (c) segment %u cut off from everyone: declared lost after %llu ms; longest window without a "
           "put %lu ms, without a get %lu ms\n",
           s2, (unsigned long long)c_lost, pg, gg);
    struct figures f;
    finish("asymmetric", &f, 30000);
    assert_false(a_lost);
    assert_false(b_lost);
    assert_true(c_lost > 0);
    assert_int_equal(f.gets_failed, 0);
}

/* The leader isolated with one segment (port rules: the leader's raft port from the other
 * masters, its control port from three segments and the clients, the others' control ports from
 * the isolated segment) for 3x client_ttl: the majority elects a new leader, which declares
 * only the isolated segment lost and repairs; nothing committed is lost. */
static void sc_leader_isolated(void)
{
    wait_keys(100);
    int L = leader_index();
    assert_true(L >= 0);
    json_t *d = status();
    uint32_t s0 = seg_id(d, 0);
    json_decref(d);
    /* All in the hub (the masters live there), one transaction (nft_drop_at_once): raft traffic
     * to and from the leader's raft port; segment hosts 1-3 and the client host (10.78.N.2) cut
     * from the leader's control port; segment host 0 (10.78.N.11) cut from the other two. */
    char in[512], out[512];
    int o1 = 7101 + (L + 1) % 3, o2 = 7101 + (L + 2) % 3;
    snprintf(in, sizeof in,
             "tcp dport %d drop; ip saddr { 10.78.%d.2, 10.78.%d.12-10.78.%d.%d } tcp dport %d drop; "
             "ip saddr 10.78.%d.11 tcp dport { %d, %d } drop",
             7201 + L, N.net, N.net, N.net, 10 + HOSTS, 7101 + L, N.net, o1, o2);
    snprintf(out, sizeof out,
             "tcp sport %d drop; ip daddr { 10.78.%d.2, 10.78.%d.12-10.78.%d.%d } tcp sport %d drop; "
             "ip daddr 10.78.%d.11 tcp sport { %d, %d } drop",
             7201 + L, N.net, N.net, N.net, 10 + HOSTS, 7101 + L, N.net, o1, o2);
    fault_begin();
    assert_int_equal(nft_drop_at_once(N.hub, in, out), 0);
    usleep(3 * TTL_MS * 1000);
    nft_heal(N.hub);
    fault_end();
    d = status();
    bool lost0 = d && seg_id(d, 0) != s0;
    int newL = d ? (int)td_jint(d, "leader_id") - 1 : -1;
    json_decref(d);
    printf("leader %d isolated with segment %u: new leader %d; the isolated segment %s\n", L + 1, s0, newL + 1,
           lost0 ? "was declared lost (remounted as new)" : "was kept");
    struct figures f;
    finish("leader_isolated", &f, 30000);
    assert_true(f.lost_segments <= 1);
}

/* One segment SIGSTOPped for 2x client_ttl: it may be declared lost and repaired; reads never
 * fail while the other replica lives; when it resumes it serves no stale space (it remounts). */
static void sc_segment_stopped(void)
{
    wait_keys(100);
    json_t *d = status();
    uint32_t s0 = seg_id(d, 0);
    json_decref(d);
    assert_true(kvp_test_stop_process(N.segs[0], 10000)); /* silent from here on (proc_stop.h) */
    usleep(2 * TTL_MS * 1000);
    kill(N.segs[0], SIGCONT);
    usleep(TTL_MS * 1000);
    d = status();
    bool lost = d && seg_id(d, 0) != s0;
    json_decref(d);
    char hlog[400];
    snprintf(hlog, sizeof hlog, "%s/host-0.log", N.cl.dir);
    bool refused = log_has(hlog, "refusing data until the master");
    bool remounted = log_has(hlog, "remounting as a new segment");
    printf("segment %u stopped for %u ms: %s; on resume it refused data until confirmed: %s, remounted empty: %s\n",
           s0, 2 * TTL_MS, lost ? "declared lost" : "kept", refused ? "yes" : "no", remounted ? "yes" : "no");
    /* No stale space: a segment declared lost must come back empty under a new id. */
    if (lost)
        assert_true(remounted);
    struct figures f;
    finish("segment_stopped", &f, 30000);
    assert_int_equal(f.gets_failed, 0);
}

/* All masters down (SIGSTOP) for 10 s under load: calls fail fast after the first timeout and
 * succeed again soon after the masters' return (NM_BACK_MS). */
static void sc_masters_down(void)
{
    wait_keys(100);
    fault_begin();
    unsigned long ff0 = atomic_load(&N.sh->ch[0].fast_fails) + atomic_load(&N.sh->ch[1].fast_fails);
    unsigned long gf0 = atomic_load(&N.sh->ch[0].gets_failed_fault) + atomic_load(&N.sh->ch[1].gets_failed_fault);
    all_masters(SIGSTOP);
    usleep(10000 * 1000);
    unsigned long ff = atomic_load(&N.sh->ch[0].fast_fails) + atomic_load(&N.sh->ch[1].fast_fails) - ff0;
    unsigned long gf = atomic_load(&N.sh->ch[0].gets_failed_fault) + atomic_load(&N.sh->ch[1].gets_failed_fault) - gf0;
    uint64_t back = kvp_clock_now_ms();
    all_masters(SIGCONT);
    /* Each client's first successful get after the return (calls that waited, or new ones). */
    unsigned long first = 0;
    while (kvp_clock_now_ms() - back < 10000) {
        unsigned long a = atomic_load(&N.sh->ch[0].last_get_ok_ms), b = atomic_load(&N.sh->ch[1].last_get_ok_ms);
        if (a > back && b > back) {
            first = a > b ? a : b;
            break;
        }
        usleep(5000);
    }
    fault_end();
    printf("masters down 10 s: %lu calls failed fast (< 100 ms), %lu gets failed in the window; first get ok "
           "%lld ms after the masters' return (slowest client)\n",
           ff, gf, first ? (long long)(first - back) : -1LL);
    struct figures f;
    finish("masters_down", &f, 20000);
    assert_int_equal(f.lost_segments, 0);
    assert_true(ff > 0);                   /* the client's breaker: calls failed at once */
    assert_true(first > 0);
    if (first - back >= NM_BACK_MS) /* and succeed soon after the return */
        fail_msg("first get %lu ms after the masters' return (bound %u ms)", first - back, NM_BACK_MS);
}

static void set_fault(int master, const char *what)
{
    char path[400];
    snprintf(path, sizeof path, "%s/master-%d.fault", N.cl.dir, master + 1);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(what, f);
    fclose(f);
}

/* Count acknowledged puts so far (for "writes go on / resume"). */
static unsigned long puts_ok_now(void)
{
    return atomic_load(&N.sh->ch[0].puts_ok) + atomic_load(&N.sh->ch[1].puts_ok);
}

/* The leader's Raft log writes fail (disk full), through raftlog's fault injection (the same
 * completion path as a real failed write): the leader hands leadership over and exits 1 (its
 * raft_uv cannot write again before a restart); the others go on committing; nothing committed
 * is lost; once the disk is fixed the member is started again from its data dir and rejoins. */
static void sc_raftlog_disk_full(void)
{
    wait_keys(100);
    int L = leader_index();
    assert_true(L >= 0);
    char log[400];
    snprintf(log, sizeof log, "%s/master-%d.log", N.cl.dir, L + 1);
    fault_begin();
    unsigned long p0 = puts_ok_now();
    uint64_t t0 = kvp_clock_now_ms();
    set_fault(L, "nospace\n");
    int st = 0, code = -1;
    while (kvp_clock_now_ms() - t0 < 10000) {
        if (waitpid(N.masters[L], &st, WNOHANG) == N.masters[L]) {
            code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            N.masters[L] = 0;
            break;
        }
        usleep(10000);
    }
    uint64_t exited = kvp_clock_now_ms() - t0;
    usleep(2 * TTL_MS * 1000); /* the other two serve meanwhile */
    unsigned long p1 = puts_ok_now();
    int during = leader_index();
    set_fault(L, "");
    fault_end();
    bool logged = log_has(log, "raft log write failed: ");
    if (code < 0) { /* still running on a log it cannot write: the defect this scenario is for */
        kill(N.masters[L], SIGKILL);
        waitpid(N.masters[L], NULL, 0);
        N.masters[L] = 0;
    }
    uint64_t back = kvp_clock_now_ms();
    spawn_master(L);
    unsigned long p2 = puts_ok_now();
    while (puts_ok_now() == p2 && kvp_clock_now_ms() - back < 10000)
        usleep(10000);
    printf("raft log writes failing on leader %d: it exited %d after %llu ms (error logged %d); leader then %d; "
           "%lu puts acknowledged meanwhile; restarted on a fixed disk, puts acknowledged %llu ms later\n",
           L + 1, code, (unsigned long long)exited, logged, during + 1, p1 - p0,
           (unsigned long long)(kvp_clock_now_ms() - back));
    struct figures f;
    finish("raftlog_disk_full", &f, 20000);
    assert_int_equal(code, 1);
    assert_true(logged);
    assert_true(during >= 0 && during != L);
    assert_true(p1 > p0);
    assert_int_equal(f.lost_segments, 0);
    assert_true(puts_ok_now() > p2);
}

/* The leader's Raft log writes slow (each completion 300 ms late, a slow fsync) for 3x
 * client_ttl: the leader hands leadership over (a run of slow appends), service goes on under
 * another leader; nothing committed is lost; nothing is declared lost. */
static void sc_raftlog_slow_fsync(void)
{
    wait_keys(100);
    int L = leader_index();
    assert_true(L >= 0);
    unsigned long pg, gg;
    phase_gaps(&pg, &gg);
    unsigned long p0 = puts_ok_now();
    set_fault(L, "slow 300\n");
    usleep(3 * TTL_MS * 1000);
    unsigned long p1 = puts_ok_now();
    int during = leader_index();
    set_fault(L, "");
    phase_gaps(&pg, &gg);
    usleep(TTL_MS * 1000);
    printf("raft log writes 300 ms slow on leader %d for %u ms: %lu puts acknowledged meanwhile, leader %d; "
           "longest window without a put %lu ms, without a get %lu ms\n",
           L + 1, 3 * TTL_MS, p1 - p0, during + 1, pg, gg);
    struct figures f;
    finish("raftlog_slow_fsync", &f, 20000);
    assert_int_equal(f.lost_segments, 0);
    assert_int_equal(f.gets_failed, 0);
    assert_true(p1 > p0);
    assert_true(during >= 0 && during != L); /* the slow leader handed leadership over */
}

/* All masters SIGKILLed, restarted from their data dirs 10 s later: the same as masters_down,
 * through a restart (Raft log and snapshot reload, a new election). */
static void sc_masters_killed(void)
{
    wait_keys(100);
    fault_begin();
    unsigned long ff0 = atomic_load(&N.sh->ch[0].fast_fails) + atomic_load(&N.sh->ch[1].fast_fails);
    for (int i = 0; i < 3; i++)
        stop_pid(&N.masters[i]);
    usleep(10000 * 1000);
    unsigned long ff = atomic_load(&N.sh->ch[0].fast_fails) + atomic_load(&N.sh->ch[1].fast_fails) - ff0;
    uint64_t back = kvp_clock_now_ms();
    for (int i = 0; i < 3; i++)
        spawn_master(i);
    unsigned long first = 0;
    while (kvp_clock_now_ms() - back < 20000) {
        unsigned long a = atomic_load(&N.sh->ch[0].last_get_ok_ms), b = atomic_load(&N.sh->ch[1].last_get_ok_ms);
        if (a > back && b > back) {
            first = a > b ? a : b;
            break;
        }
        usleep(5000);
    }
    fault_end();
    kvp_msession_destroy(&N.ms); /* its sockets reconnect anyway; a fresh one is simplest */
    N.ms = td_session(&N.cl);
    assert_non_null(N.ms);
    printf("masters killed, restarted after 10 s: %lu calls failed fast meanwhile; first get ok %lld ms after the "
           "restart (slowest client)\n",
           ff, first ? (long long)(first - back) : -1LL);
    struct figures f;
    finish("masters_killed", &f, 20000);
    assert_int_equal(f.lost_segments, 0);
    assert_true(ff > 0);
    assert_true(first > 0);
}

static const struct {
    const char *name;
    void (*fn)(void);
} SCENARIOS[] = {
    {"masters_paused", sc_masters_paused},
    {"masters_cut_from_segments", sc_masters_cut_from_segments},
    {"masters_cut_from_half", sc_masters_cut_from_half},
    {"two_segments_killed", sc_two_segments_killed},
    {"asymmetric", sc_asymmetric},
    {"leader_isolated", sc_leader_isolated},
    {"segment_stopped", sc_segment_stopped},
    {"masters_down", sc_masters_down},
    {"masters_killed", sc_masters_killed},
    {"raftlog_disk_full", sc_raftlog_disk_full},
    {"raftlog_slow_fsync", sc_raftlog_slow_fsync},
};

static const char *g_scenario;
static bool g_finished; /* the scenario returned: every assert held */

static void test_nemesis(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof SCENARIOS / sizeof SCENARIOS[0]; i++)
        if (strcmp(SCENARIOS[i].name, g_scenario) == 0) {
            if (setup() != 0)
                fail_msg("set-up failed: %s", N.why);
            if (!N.ok) {
                printf("SKIP: %s\n", N.why);
                cleanup();
                skip();
            }
            SCENARIOS[i].fn();
            g_finished = true;
            return;
        }
    fail_msg("unknown scenario %s", g_scenario);
}

/* After a failed scenario (its asserts jump past the end of test_nemesis): the masters' and
 * segments' WARN and ERROR lines, and the leader changes, before cleanup removes the logs. A CI
 * failure (leader_isolated declared 2 segments lost once in 3 runs at load 28) otherwise leaves
 * only the figures. */
static void dump_logs_on_failure(void)
{
    if (g_finished || !N.cl.dir[0])
        return;
    const char *names[] = {"master-1", "master-2", "master-3", "host-0", "host-1", "host-2", "host-3"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[400], line[1024];
        snprintf(path, sizeof path, "%s/%s.log", N.cl.dir, names[i]);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        unsigned shown = 0;
        while (fgets(line, sizeof line, f) && shown < 80)
            if (strstr(line, " WARN ") || strstr(line, " ERROR ") || strstr(line, "leader")) {
                printf("%s: %s", names[i], line);
                shown++;
            }
        fclose(f);
    }
    fflush(stdout);
}

static int teardown(void **state)
{
    (void)state;
    dump_logs_on_failure();
    cleanup();
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_nemesis SCENARIO\n");
        for (size_t i = 0; i < sizeof SCENARIOS / sizeof SCENARIOS[0]; i++)
            fprintf(stderr, "  %s\n", SCENARIOS[i].name);
        return 2;
    }
    g_scenario = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_nemesis, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
