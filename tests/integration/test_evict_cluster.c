/*
 * test_evict_cluster.c — memory pressure on a real local cluster (docs/eviction.md): 3 masters +
 * 3 segments of 4 MiB (12 MiB pool), high watermark 0.8, eviction ratio 0.1, fence grace 200 ms.
 *
 *  1. three client processes write 3.2× the pool (64 KiB self-checking objects, a few soft-pinned
 *     first; allow_evict_soft_pinned_objects=false): every put succeeds, every read returns the exact bytes or NOT_FOUND, the pinned
 *     objects all survive, and the parent, polling `kvpoolctl status`, never sees the used bytes
 *     above (high + ratio) × capacity + the objects in flight;
 *  2. objects under read leases are never evicted: with every object leased, a put that needs
 *     room gets NO_SPACE at once with the "cannot help" reason, the objects stay; once the leases
 *     expire the same put succeeds (eviction makes room within its timeout);
 *  3. a reader whose transfer is stalled (fault injection) past its lease gets LEASE_EXPIRED and
 *     no bytes; Exists/GetSize grant no lease, GetReplicaList (kvp_get) does; a forced remove of a
 *     leased object keeps its space quarantined until the lease expires, although fence grace
 *     is shorter;
 *  4. a failover while the pool is under pressure: the new leader evicts and releases quarantine
 *     inside its election grace (issue 21: what it frees then waits for the grace's end, the
 *     lease horizon it commits), and every put of a writer across the failover succeeds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "actors/transfer/fault.h"
#include "actors/transfer/transfer.h"
#include "runtime/clock.h"
#include "tests/integration/test_client_util.h"
#include "tests/lib/cluster_guard.h"
#include "tests/lib/proc_reap.h"

#define SEG_SIZE_STR "4M"
#define POOL_BYTES (12ull << 20)
#define HIGH 0.8
#define RATIO 0.1
#define OBJ (64u << 10)
#define N_CLIENTS 3
#define PER_CLIENT 200
#define PINNED 4
#define LEASE_MS 5000

static struct tc_cluster CL;

/* tc_cluster_up; `attempt` only numbers retries (kvpoolctl picks free ports each time). */
static int cluster_up(struct tc_cluster *c, int segments, const char *segment_size, int attempt)
{
    memset(c, 0, sizeof *c);
    const char *bd = getenv("KVP_BUILD_DIR");
    snprintf(c->ctl, sizeof c->ctl, "%s/tools/kvpoolctl", bd ? bd : ".");
    snprintf(c->dir, sizeof c->dir, "/tmp/kvp-evict-test-XXXXXX");
    if (!mkdtemp(c->dir))
        return -1;
    snprintf(c->file, sizeof c->file, "%s/cluster.json", c->dir);
    char segs[16];
    (void)attempt; /* kvpoolctl picks free ports; a retry gets new ones */
    snprintf(segs, sizeof segs, "%d", segments);
    (void)kvp_test_cluster_guard(); /* its daemons die with this process, however it ends */
    char *argv[] = {c->ctl, "cluster", "up", "--dir", c->dir, "--masters", "3", "--segments", segs,
                    "--segment-size", (char *)segment_size, NULL};
    int rc = tc_run(argv);
    c->up = true; /* even on failure: down kills whatever started */
    return rc;
}

static int setup(void **state)
{
    (void)state;
    setenv("KVPOOL_EVICTION_HIGH_WATERMARK_RATIO", "0.8", 1);
    setenv("KVPOOL_EVICTION_RATIO", "0.1", 1);
    setenv("KVPOOL_FENCE_GRACE_MS", "200", 1);
    setenv("KVPOOL_DEFAULT_KV_LEASE_TTL", "5000", 1);
    /* Test 1 checks that every soft-pinned object survives. With Mooncake's default (true), a
     * pinned object may go when the unpinned ones cannot reach the eviction target, and they
     * cannot while most of them are leased: each writer's read-back leases a key for 5 s, as
     * long as the whole run. On a loaded CI machine that happened (w1-pin-2 evicted). The
     * guarantee the test checks is the one of allow_evict_soft_pinned_objects=false. */
    setenv("KVPOOL_ALLOW_EVICT_SOFT_PINNED_OBJECTS", "false", 1);
    /* A port chosen free may be taken before a process binds it: try up to 4 times. */
    for (int attempt = 0; attempt < 4; attempt++) {
        if (cluster_up(&CL, 3, SEG_SIZE_STR, attempt) == 0)
            return 0;
        fprintf(stderr, "kvpoolctl cluster up failed (dir %s), attempt %d\n", CL.dir, attempt + 1);
        tc_cluster_down(&CL);
    }
    return -1;
}

static int teardown(void **state)
{
    (void)kvp_test_children_kill();
    (void)state;
    tc_cluster_down(&CL);
    return 0;
}

/* `kvpoolctl --cluster FILE --json status`, parsed; NULL on failure. */
static json_t *status(void)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s --cluster %s --json --timeout 3000 status 2>/dev/null", CL.ctl, CL.file);
    FILE *p = popen(cmd, "r");
    if (!p)
        return NULL;
    json_error_t e;
    json_t *j = json_loadf(p, 0, &e);
    pclose(p);
    return j;
}

static long long jget(json_t *o, const char *k)
{
    return (long long)json_integer_value(json_object_get(o, k));
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Wait until the leader is out of its election grace window (it evicts nothing before). */
static void wait_no_grace(void)
{
    for (int i = 0; i < 200; i++) {
        json_t *st = status();
        bool grace = !st || json_is_true(json_object_get(json_object_get(st, "node"), "in_election_grace"));
        json_decref(st);
        if (!grace)
            return;
        sleep_ms(100);
    }
    fail_msg("leader still in its election grace window");
}

/* Wait until nothing is quarantined (20 s at most): removed space comes back after fence_grace_ms
 * at the leader's pace, which a fixed sleep does not measure on a loaded host. */
static void wait_quarantine_empty(void)
{
    long long q = -1;
    for (int i = 0; i < 200; i++) {
        json_t *st = status();
        q = st ? jget(st, "quarantined_bytes") : -1;
        json_decref(st);
        if (q == 0)
            return;
        sleep_ms(100);
    }
    fail_msg("still %lld bytes quarantined after 20 s", q);
}

/* One writer process: PINNED soft-pinned objects, then PER_CLIENT plain ones; after each put
 * reads back a random earlier key (exact bytes or NOT_FOUND). Exit code = number of failures. */
static int writer(int id)
{
    kvp_client *c = tc_open(&CL, 20000);
    if (!c)
        return 100;
    int bad = 0;
    uint8_t *buf = malloc(OBJ), *rd = malloc(OBJ);
    char key[64];
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(id + 1);
    for (int i = 0; i < PINNED + PER_CLIENT; i++) {
        bool pin = i < PINNED;
        snprintf(key, sizeof key, "w%d-%s-%d", id, pin ? "pin" : "obj", i);
        tc_fill(key, buf, OBJ);
        kvp_put_opts o = {.soft_pin = pin};
        int rc = kvp_put(c, key, buf, OBJ, &o);
        if (rc != KVP_OK) {
            fprintf(stderr, "writer %d: put %s: %s\n", id, key, kvp_errname(rc));
            bad++;
        }
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int j = (int)(x % (uint64_t)(i + 1));
        snprintf(key, sizeof key, "w%d-%s-%d", id, j < PINNED ? "pin" : "obj", j);
        memset(rd, TC_POISON, OBJ);
        int64_t g = kvp_get(c, key, rd, OBJ, 0);
        if (g == KVP_ERR_NOT_FOUND && j >= PINNED)
            continue;
        if (g != (int64_t)OBJ || !tc_check(key, rd, OBJ)) {
            fprintf(stderr, "writer %d: get %s: %lld (%s)\n", id, key, (long long)g,
                    g < 0 ? kvp_errname((int)g) : "wrong bytes");
            bad++;
        }
    }
    /* every pinned object survived while unpinned ones could go */
    for (int i = 0; i < PINNED; i++) {
        snprintf(key, sizeof key, "w%d-pin-%d", id, i);
        memset(rd, TC_POISON, OBJ);
        int64_t g = kvp_get(c, key, rd, OBJ, 0);
        if (g != (int64_t)OBJ || !tc_check(key, rd, OBJ)) {
            fprintf(stderr, "writer %d: pinned %s lost: %lld\n", id, key, (long long)g);
            bad++;
        }
    }
    free(buf);
    free(rd);
    tc_close(&c);
    return bad;
}

static void test_evict_fill_three_times_capacity_all_puts_succeed(void **state)
{
    (void)state;
    wait_no_grace();
    pid_t pids[N_CLIENTS];
    for (int i = 0; i < N_CLIENTS; i++) {
        pids[i] = fork();
        kvp_test_child_track(pids[i]); /* killed at teardown if a failed assert skips its stop */
        assert_true(pids[i] >= 0);
        if (pids[i] == 0)
            _exit(writer(i));
    }
    long long max_used = 0, cap = 0;
    int running = N_CLIENTS, failures = 0, samples = 0;
    while (running > 0) {
        json_t *st = status();
        if (st) {
            long long u = jget(st, "used_bytes");
            cap = jget(st, "capacity_bytes");
            if (u > max_used)
                max_used = u;
            samples++;
            json_decref(st);
        }
        for (int i = 0; i < N_CLIENTS; i++) {
            int ws = 0;
            if (pids[i] > 0 && waitpid(pids[i], &ws, WNOHANG) == pids[i]) {
                pids[i] = 0;
                running--;
                int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 255;
                if (code)
                    fprintf(stderr, "writer %d: %d failures\n", i, code);
                failures += code;
            }
        }
        sleep_ms(20);
    }
    assert_int_equal(failures, 0);
    json_t *st = status();
    assert_non_null(st);
    json_t *ev = json_object_get(st, "eviction");
    fprintf(stderr, "fill: %d status samples, max used %lld of %lld bytes (%.3f), %lld rounds, %lld objects evicted, "
            "pinned %lld bytes\n", samples, max_used, cap, cap ? (double)max_used / (double)cap : 0.0,
            jget(ev, "rounds"), jget(ev, "objects_evicted"), jget(st, "pinned_bytes"));
    assert_int_equal(cap, (long long)POOL_BYTES);
    assert_true(jget(ev, "objects_evicted") > 0);
    /* test_evict_cluster_slices (issue 22): each listing was a pass of several slices */
    const char *slots = getenv("KVPOOL_TEST_EVICT_SCAN_SLOTS");
    fprintf(stderr, "fill: %lld lists in %lld slices; %lld rounds in %lld commands\n", jget(ev, "lists"),
            jget(ev, "list_slices"), jget(ev, "rounds"), jget(ev, "commands"));
    if (slots && atoi(slots) > 0) {
        assert_true(jget(ev, "lists") > 0);
        assert_true(jget(ev, "list_slices") > jget(ev, "lists"));
    }
    /* ... and with KVPOOL_TEST_EVICT_CMD_KEYS, a round of more keys went as several commands */
    const char *ck = getenv("KVPOOL_TEST_EVICT_CMD_KEYS");
    assert_true(jget(ev, "commands") >= jget(ev, "rounds"));
    if (ck && atoi(ck) > 0 && jget(ev, "objects_evicted") > atoi(ck) * jget(ev, "rounds"))
        assert_true(jget(ev, "commands") > jget(ev, "rounds"));
    assert_int_equal(jget(st, "pinned_bytes"), (long long)N_CLIENTS * PINNED * OBJ);
    /* high watermark plus one eviction step, plus the puts in flight (one per writer) */
    assert_true(max_used <= (long long)((HIGH + RATIO) * (double)POOL_BYTES) + N_CLIENTS * (long long)OBJ);
    json_decref(st);
}

/* Everything stored is under a read lease: a put that needs room is refused at once, with the
 * reason; nothing leased is evicted; after the leases expire the put succeeds. */
static void test_evict_all_leased_no_space_at_once_then_succeeds(void **state)
{
    (void)state;
    kvp_client *c = tc_open(&CL, 20000);
    assert_non_null(c);
    char k0[64];
    for (int w = 0; w < N_CLIENTS; w++) /* forget test 1's objects (pinned ones included) */
        for (int i = 0; i < PINNED + PER_CLIENT; i++) {
            snprintf(k0, sizeof k0, "w%d-%s-%d", w, i < PINNED ? "pin" : "obj", i);
            int r = kvp_remove(c, k0, true);
            assert_true(r == KVP_OK || r == KVP_ERR_NOT_FOUND);
        }
    wait_quarantine_empty(); /* quarantine (fence grace 200 ms) released */
    enum { N = 8, BIG = 1u << 20 };
    char keys[N][32];
    const char *kp[N];
    const void *bp[N];
    size_t lens[N];
    int res[N];
    uint8_t *bufs = malloc((size_t)N * BIG);
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "leased-%d", i);
        tc_fill(keys[i], bufs + (size_t)i * BIG, BIG);
        kp[i] = keys[i];
        bp[i] = bufs + (size_t)i * BIG;
        lens[i] = BIG;
    }
    assert_int_equal(kvp_batch_put(c, N, kp, bp, lens, NULL, res), KVP_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(res[i], KVP_OK);
    /* 8 MiB of 12 MiB: below the watermark, nothing evicted. Lease all of them. */
    void *rb[N];
    size_t caps[N];
    int64_t gres[N];
    uint8_t *rbufs = malloc((size_t)N * BIG);
    for (int i = 0; i < N; i++) {
        rb[i] = rbufs + (size_t)i * BIG;
        caps[i] = BIG;
    }
    uint64_t t_get = kvp_clock_now_ms(); /* the leases end after t_get + LEASE_MS, by t0 + LEASE_MS */
    assert_int_equal(kvp_batch_get(c, N, kp, rb, caps, 0, gres), KVP_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(gres[i], (int64_t)BIG);
    uint64_t t0 = kvp_clock_now_ms();
    /* 3 MiB fits on no segment (each has at most 2 MiB free) */
    size_t big = 3u << 20;
    uint8_t *b = malloc(big);
    tc_fill("needs-room", b, big);
    int rc = kvp_put(c, "needs-room", b, big, NULL);
    uint64_t took = kvp_clock_now_ms() - t0;
    fprintf(stderr, "all leased: put needing room -> %s after %llu ms\n", kvp_errname(rc), (unsigned long long)took);
    assert_int_equal(rc, KVP_ERR_NO_SPACE);
    for (int i = 0; i < N; i++)
        assert_int_equal(kvp_exists(c, kp[i]), 1); /* nothing leased was evicted */
    json_t *st = status();
    assert_non_null(st);
    assert_true(jget(json_object_get(st, "eviction"), "blocked_rounds") > 0);
    json_decref(st);
    /* Shortly before the leases end, a put needing room makes the leader look again and find
     * every object still leased: "eviction cannot help" (or, on a machine slow enough to get
     * here after they ended, room is made: either is right then). */
    uint64_t now = kvp_clock_now_ms();
    if (now < t_get + LEASE_MS - 250)
        sleep_ms((unsigned)(t_get + LEASE_MS - 250 - now));
    rc = kvp_put(c, "needs-room-early", b, big, NULL);
    fprintf(stderr, "put needing room %lld ms before the leases' end at the latest: %s\n",
            (long long)(t0 + LEASE_MS) - (long long)kvp_clock_now_ms(), kvp_errname(rc));
    assert_true(rc == KVP_ERR_NO_SPACE || rc == KVP_OK);
    if (rc == KVP_OK)
        assert_int_equal(kvp_remove(c, "needs-room-early", true), KVP_OK);
    /* Leases over, well inside a second of that verdict: eviction makes room inside the put's
     * timeout. The leader used to repeat the verdict for a second after its scan, leases ended
     * or not (NO_SPACE at once here). */
    now = kvp_clock_now_ms();
    if (now < t0 + LEASE_MS + 100)
        sleep_ms((unsigned)(t0 + LEASE_MS + 100 - now));
    rc = kvp_put(c, "needs-room", b, big, NULL);
    if (rc != KVP_OK)
        fail_msg("put needing room after the leases ended: %s", kvp_errname(rc));
    memset(b, 0, big);
    assert_int_equal(kvp_get(c, "needs-room", b, big, 0), (int64_t)big);
    assert_true(tc_check("needs-room", b, big));
    free(b);
    free(bufs);
    free(rbufs);
    tc_close(&c);
}

/* A get whose transfer is held past its lease returns LEASE_EXPIRED, never the bytes. */
static void test_evict_lease_expired_mid_transfer_returns_lease_expired(void **state)
{
    (void)state;
    kvp_client *c = tc_open(&CL, 30000);
    assert_non_null(c);
    size_t len = 256u << 10;
    uint8_t *b = malloc(len);
    tc_fill("slow-read", b, len);
    assert_int_equal(kvp_put(c, "slow-read", b, len, NULL), KVP_OK);
    struct kvp_xfer_fault_rule r = {.action = KVP_FAULT_STALL, .op = KVP_XFER_READ, .ms = LEASE_MS + 1500};
    int frc = kvp_xfer_fault_add(&r);
    if (frc == KVP_ERR_UNSUPPORTED) {
        free(b);
        tc_close(&c);
        skip(); /* a build without KVP_FAULT_INJECTION */
    }
    assert_int_equal(frc, KVP_OK);
    memset(b, TC_POISON, len);
    int64_t g = kvp_get(c, "slow-read", b, len, 30000);
    kvp_xfer_fault_clear();
    kvp_xfer_fault_release();
    fprintf(stderr, "stalled read: %s\n", g < 0 ? kvp_errname((int)g) : "bytes");
    assert_int_equal(g, KVP_ERR_LEASE_EXPIRED);
    /* without the stall the same get returns the exact bytes */
    memset(b, TC_POISON, len);
    assert_int_equal(kvp_get(c, "slow-read", b, len, 0), (int64_t)len);
    assert_true(tc_check("slow-read", b, len));
    free(b);
    tc_close(&c);
}

/* Which calls lease: GetReplicaList (every get) does, Exists and GetSize do not. A forced remove
 * of a leased object keeps its space in quarantine until the lease expires. */
static void test_evict_leases_granted_by_get_only_forced_remove_quarantined(void **state)
{
    (void)state;
    kvp_client *c = tc_open(&CL, 20000);
    assert_non_null(c);
    size_t len = 512u << 10;
    uint8_t *b = malloc(len);
    tc_fill("lease-a", b, len);
    assert_int_equal(kvp_put(c, "lease-a", b, len, NULL), KVP_OK);
    assert_int_equal(kvp_put(c, "lease-b", b, len, NULL), KVP_OK);
    assert_int_equal(kvp_exists(c, "lease-a"), 1);
    assert_int_equal(kvp_get_size(c, "lease-a"), (int64_t)len);
    assert_int_equal(kvp_remove(c, "lease-a", false), KVP_OK); /* no lease from Exists/GetSize */
    assert_int_equal(kvp_get(c, "lease-b", b, len, 0), (int64_t)len);
    assert_int_equal(kvp_remove(c, "lease-b", false), KVP_ERR_LEASED);
    wait_quarantine_empty(); /* lease-a's quarantine (fence grace 200 ms) is released */
    json_t *st = status();
    assert_non_null(st);
    long long q0 = jget(st, "quarantined_bytes");
    json_decref(st);
    uint64_t t0 = kvp_clock_now_ms();
    assert_int_equal(kvp_remove(c, "lease-b", true), KVP_OK);
    assert_int_equal(kvp_exists(c, "lease-b"), 0);
    sleep_ms(1000); /* > fence grace, < the lease */
    st = status();
    assert_non_null(st);
    long long q1 = jget(st, "quarantined_bytes");
    json_decref(st);
    fprintf(stderr, "forced remove of a leased object: quarantined %lld -> %lld bytes after %llu ms\n", q0, q1,
            (unsigned long long)(kvp_clock_now_ms() - t0));
    if (kvp_clock_now_ms() - t0 < LEASE_MS - 500)
        assert_true(q1 >= q0 + (long long)len);
    /* after the lease the space is released */
    long long q2 = q1;
    for (int i = 0; i < 100 && q2 >= (long long)len; i++) {
        sleep_ms(100);
        st = status();
        if (st)
            q2 = jget(st, "quarantined_bytes");
        json_decref(st);
    }
    assert_true(q2 < (long long)len);
    free(b);
    tc_close(&c);
}

/* Kill the leader while the pool is above the watermark: the new leader evicts and releases
 * quarantine at once (issue 21); every put across the failover succeeds. */
static void test_evict_failover_new_leader_evicts_at_once(void **state)
{
    (void)state;
    kvp_client *c = tc_open(&CL, 20000);
    assert_non_null(c);
    /* fill to above the watermark with small objects (eviction brings it back down) */
    uint8_t *buf = malloc(OBJ);
    char key[64];
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof key, "fo-%d", i);
        tc_fill(key, buf, OBJ);
        assert_int_equal(kvp_put(c, key, buf, OBJ, NULL), KVP_OK);
    }
    json_t *st = status();
    assert_non_null(st);
    const char *addr = json_string_value(json_object_get(st, "leader_address"));
    assert_non_null(addr);
    int pid = tc_master_pid(&CL, strncmp(addr, "tcp://", 6) == 0 ? addr + 6 : addr);
    json_decref(st);
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    /* a writer keeps the pool under pressure while the new leader is in its grace window: its
     * puts wait (NO_SPACE, evicting) and succeed once eviction resumes. It writes a whole pool's
     * worth: the headroom rule now keeps room for a failover (up to half the pool, docs/eviction.md
     * "Across a leader failover"), and 60 puts (3.75 MiB) fitted in it, so the new leader had
     * nothing to evict (1 of 2 runs failed the rounds check below). */
    pid_t w = fork();
    kvp_test_child_track(w);
    assert_true(w >= 0);
    if (w == 0) {
        kvp_client *wc = tc_open(&CL, 30000);
        int bad = wc ? 0 : 1;
        for (int i = 200; wc && i < 400; i++) {
            snprintf(key, sizeof key, "fo-%d", i);
            tc_fill(key, buf, OBJ);
            int rc = kvp_put(wc, key, buf, OBJ, NULL);
            if (rc != KVP_OK) {
                fprintf(stderr, "failover writer: put %s: %s\n", key, kvp_errname(rc));
                bad++;
            }
        }
        tc_close(&wc);
        _exit(bad);
    }
    int in_grace = 0, after = 0;
    long long q_first = -1, rounds_in_grace = 0;
    for (int i = 0; i < 300; i++) {
        st = status();
        if (!st) {
            sleep_ms(20);
            continue;
        }
        json_t *node = json_object_get(st, "node");
        bool grace = json_is_true(json_object_get(node, "in_election_grace"));
        long long rounds = jget(json_object_get(st, "eviction"), "rounds");
        long long quar = jget(st, "quarantined_bytes");
        if (grace) {
            in_grace++;
            if (rounds > rounds_in_grace)
                rounds_in_grace = rounds; /* the new leader evicts at once (issue 21) */
            if (q_first < 0)
                q_first = quar;
        } else {
            after++;
        }
        json_decref(st);
        if (!grace && after > 3)
            break;
        sleep_ms(50);
    }
    int ws = 0;
    assert_int_equal(waitpid(w, &ws, 0), w);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
    st = status();
    assert_non_null(st);
    assert_true(jget(json_object_get(st, "eviction"), "rounds") > 0); /* it evicts after the window */
    json_decref(st);
    fprintf(stderr, "failover: %d samples inside the grace window (%lld eviction rounds there, %lld bytes "
                    "quarantined at its first sample), %d after\n", in_grace, rounds_in_grace, q_first, after);
    assert_true(in_grace > 0);
    assert_true(after > 0);
    free(buf);
    tc_close(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_evict_fill_three_times_capacity_all_puts_succeed, kvp_test_children_teardown),
        cmocka_unit_test_teardown(test_evict_all_leased_no_space_at_once_then_succeeds, kvp_test_children_teardown),
        cmocka_unit_test_teardown(test_evict_lease_expired_mid_transfer_returns_lease_expired, kvp_test_children_teardown),
        cmocka_unit_test_teardown(test_evict_leases_granted_by_get_only_forced_remove_quarantined, kvp_test_children_teardown),
        cmocka_unit_test_teardown(test_evict_failover_new_leader_evicts_at_once, kvp_test_children_teardown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
