/*
 * test_drain_util.h — helpers of the drain/repair integration tests (test_drain*.c,
 * test_repair*.c): a real local cluster (tests/integration/test_client_util.h), an extra
 * kvpool-segment started as our own child (so its exit status can be checked), a continuous
 * mixed load in two forked client processes with self-checking payloads and shared counters,
 * the status document and per-key replica lists through a master session.
 * Header-only (static functions): each test binary is one file.
 */
#ifndef KVP_TEST_DRAIN_UTIL_H
#define KVP_TEST_DRAIN_UTIL_H

#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include "actors/session/msession.h"
#include "auth/auth.h"
#include "runtime/clock.h"
#include "tests/integration/test_client_util.h"
#include "tests/lib/proc_reap.h"

#define TD_CHILDREN 2
#define TD_MAX_KEYS 4096
#define TD_LEN (32u << 10)
#define TD_PUT_BATCH 4
#define TD_GET_BATCH 8

struct td_child_stats {
    atomic_ulong puts_ok, puts_failed, gets_ok, gets_failed, corrupt, bytes_read;
    atomic_uint n_keys;                /* keys [0, n_keys) attempted; ok[i] says which are stored */
    atomic_uchar ok[TD_MAX_KEYS];
    char first_error[160];
};

struct td_shared {
    atomic_bool stop;
    atomic_bool pause_puts;            /* only gets while set */
    atomic_uint max_keys;              /* per child; puts stop there */
    struct td_child_stats ch[TD_CHILDREN];
};

static inline void td_key(char *buf, size_t cap, int child, unsigned i)
{
    snprintf(buf, cap, "ld%d-%u", child, i);
}

/* The load of one child process: batch_put new keys (replica_num 3), batch_get stored ones. */
static inline void td_child_main(const struct tc_cluster *cl, struct td_shared *sh, int child, uint32_t rn)
{
    struct td_child_stats *st = &sh->ch[child];
    kvp_client *c = tc_open(cl, 5000);
    if (!c) {
        snprintf(st->first_error, sizeof st->first_error, "client open failed");
        _exit(3);
    }
    uint8_t *pbuf[TD_PUT_BATCH], *gbuf[TD_GET_BATCH];
    for (int i = 0; i < TD_PUT_BATCH; i++)
        pbuf[i] = malloc(TD_LEN);
    for (int i = 0; i < TD_GET_BATCH; i++)
        gbuf[i] = malloc(TD_LEN);
    uint64_t seed = (uint64_t)getpid() * 2654435761u;
    while (!atomic_load(&sh->stop)) {
        unsigned n = atomic_load(&st->n_keys);
        if (!atomic_load(&sh->pause_puts) && n + TD_PUT_BATCH <= atomic_load(&sh->max_keys)) {
            char keys[TD_PUT_BATCH][32];
            const char *kp[TD_PUT_BATCH];
            const void *vp[TD_PUT_BATCH];
            size_t lens[TD_PUT_BATCH];
            int res[TD_PUT_BATCH];
            for (int i = 0; i < TD_PUT_BATCH; i++) {
                td_key(keys[i], sizeof keys[i], child, n + (unsigned)i);
                tc_fill(keys[i], pbuf[i], TD_LEN);
                kp[i] = keys[i];
                vp[i] = pbuf[i];
                lens[i] = TD_LEN;
            }
            kvp_put_opts o = {.replica_num = rn};
            int rc = kvp_batch_put(c, TD_PUT_BATCH, kp, vp, lens, &o, res);
            for (int i = 0; i < TD_PUT_BATCH; i++) {
                bool ok = rc == KVP_OK && res[i] == KVP_OK;
                atomic_store(&st->ok[n + (unsigned)i], ok ? 1 : 0);
                atomic_fetch_add(ok ? &st->puts_ok : &st->puts_failed, 1);
            }
            atomic_store(&st->n_keys, n + TD_PUT_BATCH);
        }
        n = atomic_load(&st->n_keys);
        if (n == 0) {
            usleep(10000);
            continue;
        }
        char keys[TD_GET_BATCH][32];
        const char *kp[TD_GET_BATCH];
        void *bp[TD_GET_BATCH];
        size_t caps[TD_GET_BATCH];
        int64_t res[TD_GET_BATCH];
        int k = 0;
        for (int tries = 0; tries < 4 * TD_GET_BATCH && k < TD_GET_BATCH; tries++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            unsigned i = (unsigned)(seed % n);
            if (!atomic_load(&st->ok[i]))
                continue;
            td_key(keys[k], sizeof keys[k], child, i);
            kp[k] = keys[k];
            memset(gbuf[k], TC_POISON, TD_LEN);
            bp[k] = gbuf[k];
            caps[k] = TD_LEN;
            k++;
        }
        if (k == 0)
            continue;
        int rc = kvp_batch_get(c, (size_t)k, kp, bp, caps, 5000, res);
        for (int i = 0; i < k; i++) {
            if (rc != KVP_OK || res[i] != (int64_t)TD_LEN) {
                atomic_fetch_add(&st->gets_failed, 1);
                if (!st->first_error[0])
                    snprintf(st->first_error, sizeof st->first_error, "get %s: %s", kp[i],
                             rc != KVP_OK ? kvp_errname(rc) : res[i] < 0 ? kvp_errname((int)res[i]) : "short");
            } else if (!tc_check(kp[i], gbuf[i], TD_LEN)) {
                atomic_fetch_add(&st->corrupt, 1);
                if (!st->first_error[0])
                    snprintf(st->first_error, sizeof st->first_error, "get %s: wrong bytes", kp[i]);
            } else {
                atomic_fetch_add(&st->gets_ok, 1);
                atomic_fetch_add(&st->bytes_read, TD_LEN);
            }
        }
    }
    tc_close(&c);
    _exit(0);
}

struct td_load {
    struct td_shared *sh;
    pid_t pids[TD_CHILDREN];
};

/* Fork the load processes (before the parent opens any ZeroMQ context). */
static inline int td_load_start(struct td_load *l, const struct tc_cluster *cl, uint32_t rn, unsigned max_keys)
{
    l->sh = mmap(NULL, sizeof *l->sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (l->sh == MAP_FAILED)
        return -1;
    memset(l->sh, 0, sizeof *l->sh);
    atomic_store(&l->sh->max_keys, max_keys > TD_MAX_KEYS ? TD_MAX_KEYS : max_keys);
    for (int i = 0; i < TD_CHILDREN; i++) {
        pid_t p = fork();
        if (p < 0)
            return -1;
        if (p == 0)
            td_child_main(cl, l->sh, i, rn);
        l->pids[i] = p;
        kvp_test_child_track(p);
    }
    return 0;
}

static inline void td_load_totals(const struct td_load *l, unsigned long *puts_ok, unsigned long *puts_failed,
                                  unsigned long *gets_ok, unsigned long *gets_failed, unsigned long *corrupt,
                                  unsigned long *bytes_read)
{
    *puts_ok = *puts_failed = *gets_ok = *gets_failed = *corrupt = *bytes_read = 0;
    for (int i = 0; i < TD_CHILDREN; i++) {
        const struct td_child_stats *s = &l->sh->ch[i];
        *puts_ok += atomic_load(&s->puts_ok);
        *puts_failed += atomic_load(&s->puts_failed);
        *gets_ok += atomic_load(&s->gets_ok);
        *gets_failed += atomic_load(&s->gets_failed);
        *corrupt += atomic_load(&s->corrupt);
        *bytes_read += atomic_load(&s->bytes_read);
    }
}

/* Stop the load; returns the number of children that did not exit 0. */
static inline int td_load_stop(struct td_load *l)
{
    int bad = 0;
    atomic_store(&l->sh->stop, true);
    for (int i = 0; i < TD_CHILDREN; i++) {
        if (l->pids[i] <= 0)
            continue;
        int st = 0;
        uint64_t t0 = kvp_clock_now_ms();
        pid_t r;
        while ((r = waitpid(l->pids[i], &st, WNOHANG)) == 0 && kvp_clock_now_ms() - t0 < 15000)
            usleep(20000);
        if (r == 0) {
            kill(l->pids[i], SIGKILL);
            waitpid(l->pids[i], &st, 0);
            bad++;
        } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            bad++;
        }
        l->pids[i] = 0;
    }
    for (int i = 0; i < TD_CHILDREN; i++)
        if (l->sh->ch[i].first_error[0])
            fprintf(stderr, "load %d: first error: %s\n", i, l->sh->ch[i].first_error);
    return bad;
}

/* ------------------------------------------------------------------ cluster access */

/* Like tc_cluster_up, without --base-port: kvpoolctl picks free ports and retries on new ones
 * when a port is taken meanwhile (a pid-derived base collides on a busy shared machine). */
static inline int td_cluster_up(struct tc_cluster *c, int segments, const char *segment_size)
{
    memset(c, 0, sizeof *c);
    const char *bd = getenv("KVP_BUILD_DIR");
    snprintf(c->ctl, sizeof c->ctl, "%s/tools/kvpoolctl", bd ? bd : ".");
    snprintf(c->dir, sizeof c->dir, "/tmp/kvp-drain-test-XXXXXX");
    if (!mkdtemp(c->dir))
        return -1;
    snprintf(c->file, sizeof c->file, "%s/cluster.json", c->dir);
    char segs[16];
    snprintf(segs, sizeof segs, "%d", segments);
    (void)kvp_test_cluster_guard(); /* its daemons die with this process, however it ends */
    char *argv[] = {c->ctl, "cluster", "up", "--dir", c->dir, "--masters", "3", "--segments", segs,
                    "--segment-size", (char *)segment_size, NULL};
    int rc = tc_run(argv);
    c->up = true; /* even on failure: down kills whatever started */
    return rc;
}

static inline struct kvp_msession *td_session(const struct tc_cluster *cl)
{
    json_error_t e;
    json_t *j = json_load_file(cl->file, 0, &e);
    if (!j)
        return NULL;
    const char *list = json_string_value(json_object_get(j, "master_server_address"));
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list ? list : "");
    json_decref(j);
    const char *m[8];
    size_t n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && n < 8; t = strtok_r(NULL, ",", &save))
        m[n++] = t;
    struct kvp_msession *ms = NULL;
    struct kvp_auth_client *auth = NULL; /* the cluster's admin key (cluster.json "auth") */
    if (kvp_auth_client_load(&auth, NULL, NULL, NULL, cl->file, "admin_key", "test") != KVP_OK ||
        kvp_msession_new_auth(&ms, m, n, "test", &auth) != KVP_OK) {
        kvp_auth_client_destroy(&auth);
        return NULL;
    }
    return ms;
}

static inline json_t *td_status(struct kvp_msession *ms)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__ClusterStatusReq cs = KVP__CLUSTER_STATUS_REQ__INIT;
    req.body_case = KVP__REQUEST__BODY_CLUSTER_STATUS;
    req.cluster_status = &cs;
    Kvp__Response *resp = NULL;
    int rc = kvp_msession_call(ms, &req, 5000, &resp);
    json_t *doc = NULL;
    if (rc == KVP_OK && resp->status == KVP_OK && resp->body_case == KVP__RESPONSE__BODY_CLUSTER_STATUS &&
        resp->cluster_status) {
        json_error_t e;
        doc = json_loads(resp->cluster_status->json, 0, &e);
    }
    kvp_msession_response_free(resp);
    return doc;
}

static inline long long td_jint(json_t *o, const char *k)
{
    return (long long)json_integer_value(json_object_get(o, k));
}

/* Segment id of `name` in the status document, 0 when absent; *state its state string. */
static inline uint32_t td_segment_id(json_t *doc, const char *name, const char **state)
{
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(doc, "segments"), i, s)
    {
        const char *n = json_string_value(json_object_get(s, "name"));
        const char *stt = json_string_value(json_object_get(s, "state"));
        if (n && strcmp(n, name) == 0 && (!stt || strcmp(stt, "LOST") != 0)) {
            if (state)
                *state = stt;
            return (uint32_t)td_jint(s, "id");
        }
    }
    return 0;
}

/* Replica lists of every stored key of the load: counts keys with fewer than `want` replicas,
 * keys with a replica on segment `bad_id` (0 = none), and keys not found. */
static inline void td_check_replicas(struct kvp_msession *ms, const struct td_load *l, unsigned want,
                                     uint32_t bad_id, unsigned *n_keys, unsigned *n_short, unsigned *n_on_bad,
                                     unsigned *n_missing)
{
    *n_keys = *n_short = *n_on_bad = *n_missing = 0;
    for (int c = 0; c < TD_CHILDREN; c++) {
        unsigned n = atomic_load(&l->sh->ch[c].n_keys);
        for (unsigned base = 0; base < n; base += 64) {
            char keys[64][32];
            char *kp[64];
            size_t k = 0;
            for (unsigned i = base; i < n && i < base + 64; i++)
                if (atomic_load(&l->sh->ch[c].ok[i])) {
                    td_key(keys[k], sizeof keys[k], c, i);
                    kp[k] = keys[k];
                    k++;
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
            int rc = kvp_msession_call(ms, &req, 5000, &resp);
            for (size_t i = 0; i < k; i++) {
                (*n_keys)++;
                const Kvp__ObjectInfo *o = rc == KVP_OK && resp->get_replicas && i < resp->get_replicas->n_objects
                                               ? resp->get_replicas->objects[i]
                                               : NULL;
                if (!o || o->status != KVP_OK) {
                    (*n_missing)++;
                    continue;
                }
                if (o->n_replicas < want)
                    (*n_short)++;
                for (size_t r = 0; r < o->n_replicas; r++)
                    if (bad_id && o->replicas[r]->segment_id == bad_id) {
                        (*n_on_bad)++;
                        break;
                    }
            }
            kvp_msession_response_free(resp);
        }
    }
}

/* Start `kvpool-segment --name NAME --global-segment-size SIZE` as our child (log in the
 * cluster dir). Returns its pid or -1. */
static inline pid_t td_spawn_segment(const struct tc_cluster *cl, const char *name, const char *size)
{
    json_error_t e;
    json_t *j = json_load_file(cl->file, 0, &e);
    if (!j)
        return -1;
    char list[1024];
    const char *l = json_string_value(json_object_get(j, "master_server_address"));
    snprintf(list, sizeof list, "%s", l ? l : "");
    json_decref(j);
    const char *bd = getenv("KVP_BUILD_DIR");
    char exe[512], log[600];
    snprintf(exe, sizeof exe, "%s/tools/kvpool-segment", bd ? bd : ".");
    snprintf(log, sizeof log, "%s/%s.log", cl->dir, name);
    pid_t p = fork();
    if (p < 0)
        return -1;
    if (p == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        char *argv[] = {exe, "--name", (char *)name, "--global-segment-size", (char *)size,
                        "--master-server-address", list, "--cluster-file", (char *)cl->file, NULL}; /* keys */
        execv(exe, argv);
        _exit(127);
    }
    kvp_test_child_track(p);
    return p;
}

/* Wait until the child exits (or timeout_ms): its exit code, -2 on timeout, -1 if killed. */
static inline int td_wait_exit(pid_t p, uint32_t timeout_ms)
{
    uint64_t t0 = kvp_clock_now_ms();
    int st = 0;
    for (;;) {
        pid_t r = waitpid(p, &st, WNOHANG);
        if (r == p)
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (kvp_clock_now_ms() - t0 > timeout_ms)
            return -2;
        usleep(20000);
    }
}

#endif
