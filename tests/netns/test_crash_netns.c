/*
 * test_crash_netns.c — the crash case of issue 7 across hosts: each of 4 segment hosts is its
 * own network namespace joined to a "hub" namespace (3 masters, 2 forked client processes
 * running the mixed load with replica_num 3) by a veth pair on a bridge; addresses 10.78.N.x
 * exist only inside the namespaces this test creates. The "crash" is the link of one segment
 * host going down (no RST, no FIN: packets vanish).
 * Checks: the leader declares the host's segment lost (heartbeats stop; at client_ttl at the
 * latest), re-replicates every object back to 3 replicas on the 3 other hosts, and gets started
 * once the loss is known all succeed with the right bytes. Prints the detection time, the time
 * to restore, and the gets that failed while the dead link was still in the replica lists (a
 * get whose transfer is stuck on a silent peer waits for its call deadline: see the report).
 * Needs root and `ip netns`; skips with a message otherwise. Namespaces are always removed.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <sched.h>

#include "tests/integration/test_drain_util.h"
#include "tests/lib/proc_reap.h"

#define HOSTS 4

static struct {
    bool ok;
    char why[256];
    int id, net;
    char hub[32], ns[HOSTS][32], br[16];
    int orig_ns;
    pid_t masters[3], segs[HOSTS];
    struct tc_cluster cl;
} N;

static int sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[600];
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
        kill(*p, SIGKILL);
        waitpid(*p, NULL, 0);
    }
    *p = 0;
}

static void cleanup(void)
{
    for (int i = 0; i < HOSTS; i++)
        stop_pid(&N.segs[i]);
    for (int i = 0; i < 3; i++)
        stop_pid(&N.masters[i]);
    if (N.orig_ns >= 0) {
        setns(N.orig_ns, CLONE_NEWNET);
        close(N.orig_ns);
        N.orig_ns = -1;
    }
    for (int i = 0; i < HOSTS; i++)
        if (N.ns[i][0])
            sh("ip netns del %s", N.ns[i]);
    if (N.hub[0])
        sh("ip netns del %s", N.hub);
    if (N.cl.dir[0]) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", N.cl.dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", N.cl.dir);
    }
}

/* fork + setns(ns) + execv(argv) with stdout/stderr to log */
static pid_t spawn_in(const char *ns, char *const argv[], const char *log)
{
    pid_t p = fork();
    kvp_test_child_track(p); /* killed at teardown if a failed assert skips its stop */
    if (p != 0)
        return p;
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
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

static int setup(void **state)
{
    (void)state;
    memset(&N, 0, sizeof N);
    N.orig_ns = -1;
    if (geteuid() != 0) {
        snprintf(N.why, sizeof N.why, "not root: network namespaces need CAP_SYS_ADMIN");
        return 0;
    }
    if (sh("ip netns list")) {
        snprintf(N.why, sizeof N.why, "`ip netns` is not available");
        return 0;
    }
    N.id = (int)(getpid() % 100000);
    N.net = 1 + (int)(getpid() % 250);
    snprintf(N.hub, sizeof N.hub, "kvpch%d", N.id);
    snprintf(N.br, sizeof N.br, "kvbr%d", N.id);
    if (sh("ip netns add %s", N.hub) || sh("ip -n %s link set lo up", N.hub) ||
        sh("ip -n %s link add %s type bridge", N.hub, N.br) ||
        sh("ip -n %s addr add 10.78.%d.1/24 dev %s", N.hub, N.net, N.br) ||
        sh("ip -n %s link set %s up", N.hub, N.br)) {
        snprintf(N.why, sizeof N.why, "hub namespace / bridge set-up failed");
        cleanup();
        return 0;
    }
    for (int i = 0; i < HOSTS; i++) {
        snprintf(N.ns[i], sizeof N.ns[i], "kvpcs%d-%d", N.id, i);
        if (sh("ip netns add %s", N.ns[i]) || sh("ip -n %s link set lo up", N.ns[i]) ||
            sh("ip link add kvh%d%d netns %s type veth peer name kvs%d%d netns %s", N.id, i, N.hub, N.id, i,
               N.ns[i]) ||
            sh("ip -n %s link set kvh%d%d master %s", N.hub, N.id, i, N.br) ||
            sh("ip -n %s link set kvh%d%d up", N.hub, N.id, i) ||
            sh("ip -n %s addr add 10.78.%d.%d/24 dev kvs%d%d", N.ns[i], N.net, 11 + i, N.id, i) ||
            sh("ip -n %s link set kvs%d%d up", N.ns[i], N.id, i)) {
            snprintf(N.why, sizeof N.why, "segment host namespace %d set-up failed (veth, bridge)", i);
            cleanup();
            return 0;
        }
    }
    /* cluster dir and a minimal cluster.json (the master list) */
    snprintf(N.cl.dir, sizeof N.cl.dir, "/tmp/kvp-crash-netns-XXXXXX");
    if (!mkdtemp(N.cl.dir)) {
        N.cl.dir[0] = 0;
        cleanup();
        return -1;
    }
    snprintf(N.cl.file, sizeof N.cl.file, "%s/cluster.json", N.cl.dir);
    char list[256], members[512];
    snprintf(list, sizeof list, "10.78.%d.1:7101,10.78.%d.1:7102,10.78.%d.1:7103", N.net, N.net, N.net);
    snprintf(members, sizeof members,
             "1@10.78.%d.1:7101@10.78.%d.1:7201,2@10.78.%d.1:7102@10.78.%d.1:7202,3@10.78.%d.1:7103@10.78.%d.1:7203",
             N.net, N.net, N.net, N.net, N.net, N.net);
    FILE *f = fopen(N.cl.file, "w");
    if (!f) {
        cleanup();
        return -1;
    }
    fprintf(f, "{\"master_server_address\": \"%s\", \"auth\": {\"mode\": \"none\"}}\n", list);
    fclose(f);
    /* Masters and clients in network namespaces (non-loopback Raft addresses) without keys: this
     * test is about crashes, authentication has its own tests (test_auth_cluster.c). */
    setenv("KVPOOL_AUTH", "none", 1);
    setenv("KVPOOL_DEFAULT_KV_LEASE_TTL", "2000", 1);
    setenv("KVPOOL_CLIENT_TTL", "3000ms", 1);
    setenv("KVPOOL_HEARTBEAT_MS", "300", 1);
    const char *bd = getenv("KVP_BUILD_DIR");
    char mexe[512], sexe[512];
    snprintf(mexe, sizeof mexe, "%s/tools/kvpool-master", bd ? bd : ".");
    snprintf(sexe, sizeof sexe, "%s/tools/kvpool-segment", bd ? bd : ".");
    for (int i = 0; i < 3; i++) {
        char id[8], listen[64], raft[64], data[400], log[400];
        snprintf(id, sizeof id, "%d", i + 1);
        snprintf(listen, sizeof listen, "10.78.%d.1:%d", N.net, 7101 + i);
        snprintf(raft, sizeof raft, "10.78.%d.1:%d", N.net, 7201 + i);
        snprintf(data, sizeof data, "%s/master-%d", N.cl.dir, i + 1);
        snprintf(log, sizeof log, "%s/master-%d.log", N.cl.dir, i + 1);
        char *argv[] = {mexe, "--id", id, "--listen", listen, "--raft-address", raft, "--data-dir", data,
                        "--members", members, NULL};
        N.masters[i] = spawn_in(N.hub, argv, log);
    }
    for (int i = 0; i < HOSTS; i++) {
        char name[32], host[32], log[400];
        snprintf(name, sizeof name, "host-%d", i);
        snprintf(host, sizeof host, "10.78.%d.%d", N.net, 11 + i);
        snprintf(log, sizeof log, "%s/host-%d.log", N.cl.dir, i);
        char *argv[] = {sexe, "--name", name, "--global-segment-size", "48M", "--local-hostname", host,
                        "--master-server-address", list, NULL};
        N.segs[i] = spawn_in(N.ns[i], argv, log);
    }
    /* wait until every segment printed its mounted line */
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
    /* this process (and the load it forks) lives in the hub namespace */
    N.orig_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (N.orig_ns < 0 || enter_ns(N.hub) != 0) {
        cleanup();
        return -1;
    }
    N.ok = true;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cleanup();
    return 0;
}

static void test_crash_netns_host_link_down_lost_and_rereplicated(void **state)
{
    (void)state;
    if (!N.ok) {
        printf("SKIP: %s\n", N.why);
        skip();
    }
    struct td_load L;
    assert_int_equal(td_load_start(&L, &N.cl, 3, 400), 0);
    struct kvp_msession *ms = td_session(&N.cl);
    assert_non_null(ms);
    uint64_t t0 = kvp_clock_now_ms();
    while (kvp_clock_now_ms() - t0 < 30000 &&
           (atomic_load(&L.sh->ch[0].n_keys) < 200 || atomic_load(&L.sh->ch[1].n_keys) < 200))
        usleep(50000);
    json_t *doc = td_status(ms);
    assert_non_null(doc);
    uint32_t vid = td_segment_id(doc, "host-0", NULL);
    json_decref(doc);
    assert_true(vid != 0);
    atomic_store(&L.sh->pause_puts, true);
    usleep(500000);

    unsigned long po, pf, go, gf0, gf1, gf, co, br;
    td_load_totals(&L, &po, &pf, &go, &gf0, &co, &br);
    uint64_t tk = kvp_clock_now_ms();
    assert_int_equal(sh("ip -n %s link set kvs%d%d down", N.ns[0], N.id, 0), 0);
    uint64_t lost_ms = 0, restored_ms = 0;
    unsigned nk = 0, nshort = 0, nbad = 0, nmiss = 0;
    while (kvp_clock_now_ms() - tk < 45000 && !restored_ms) {
        usleep(200000);
        if (!lost_ms) {
            doc = td_status(ms);
            if (doc && td_segment_id(doc, "host-0", NULL) != vid)
                lost_ms = kvp_clock_now_ms() - tk;
            json_decref(doc);
            continue;
        }
        td_check_replicas(ms, &L, 3, vid, &nk, &nshort, &nbad, &nmiss);
        if (nshort == 0 && nbad == 0 && nmiss == 0)
            restored_ms = kvp_clock_now_ms() - tk;
    }
    /* gets in flight on the dead link end at their 5 s deadline; after that, none may fail */
    usleep(5500000);
    td_load_totals(&L, &po, &pf, &go, &gf1, &co, &br);
    usleep(3000000);
    td_load_totals(&L, &po, &pf, &go, &gf, &co, &br);
    int bad_children = td_load_stop(&L);
    doc = td_status(ms);
    json_t *rep = doc ? json_object_get(doc, "repair") : NULL;
    long long moved = td_jint(rep, "moved_objects"), moved_b = td_jint(rep, "moved_bytes");
    json_decref(doc);
    kvp_msession_destroy(&ms);
    printf("link down on host-0 (segment %u): declared lost after %llu ms, 3 replicas again after %llu ms; "
           "%lld objects (%lld bytes) copied\n",
           vid, (unsigned long long)lost_ms, (unsigned long long)restored_ms, moved, moved_b);
    printf("gets: ok %lu, failed while the dead link was listed %lu, failed afterwards %lu, corrupt %lu\n", go,
           gf1 - gf0, gf - gf1, co);
    printf("replicas: %u keys, %u with fewer than 3, %u on the dead segment, %u missing\n", nk, nshort, nbad, nmiss);
    assert_int_equal(bad_children, 0);
    assert_true(lost_ms > 0);
    assert_true(restored_ms > 0);
    assert_int_equal(nmiss, 0);
    assert_int_equal(nshort, 0);
    assert_int_equal(nbad, 0);
    assert_int_equal(co, 0);
    assert_int_equal(gf - gf1, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crash_netns_host_link_down_lost_and_rereplicated),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
