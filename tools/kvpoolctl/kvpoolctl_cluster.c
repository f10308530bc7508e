/*
 * kvpoolctl_cluster.c — `kvpoolctl cluster up|down|restart`: a local cluster on loopback for
 * tests, benchmarks and demos. `up` starts kvpool-master processes (and kvpool-segment
 * processes when that binary sits next to kvpoolctl) on free ports, writes DIR/cluster.json
 * (layout: docs/internals.md "Config") and waits until a leader serves and every segment is
 * mounted. Processes log to DIR/<name>.log, inherit the KVPOOL_* environment and get the
 * --config FILE given to `up`. `down` stops every process of cluster.json (segments SIGINT,
 * masters SIGTERM, then SIGKILL after a grace period); `restart` starts one stopped or killed member again with its data.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "config/config.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/proc.h"
#include "tools/kvpoolctl/kvpoolctl_ctl.h"

#define CLUSTER_MAX_SEGMENTS 64

/* ------------------------------------------------------------------ processes */

/* The state letter and parent of pid from /proc/PID/stat; false when it has no entry. */
static bool proc_stat(pid_t pid, char *state, int *ppid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    if (!rp || rp[1] != ' ' || !rp[2])
        return false;
    *state = rp[2];
    *ppid = -1;
    sscanf(rp + 3, " %d", ppid);
    return true;
}

/* Is pid's thread group leader a zombie ('Z' or 'X'; its other threads may still run)? */
static bool proc_zombie(pid_t pid)
{
    char st;
    int ppid;
    return pid > 0 && proc_stat(pid, &st, &ppid) && (st == 'Z' || st == 'X');
}

/* Is pid a live process whose argv[0] is exe? Guards against pid reuse. A zombie thread group
 * leader whose other threads are still exiting (they still hold its ports and its data-dir
 * lock) counts as alive until the whole group has exited (runtime/proc.h). */
static bool proc_alive(pid_t pid, const char *exe)
{
    if (pid <= 0)
        return false;
    /* Reap it if it is our own child (cluster up / restart in this process). */
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid)
        return false;
    char state;
    int ppid;
    if (!proc_stat(pid, &state, &ppid))
        return false;
    if (state == 'Z' || state == 'X')
        return !kvp_proc_gone(pid);
    if (ppid == (int)getpid())
        return true; /* our own child: maybe between fork and exec, its cmdline still ours */
    if (!exe)
        return true;
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strcmp(buf, exe) == 0;
}

/* fork + exec argv with stdout/stderr appended to log, in its own session (it outlives us). */
static pid_t spawn(json_t *cmdline, const char *log)
{
    size_t n = json_array_size(cmdline);
    if (n == 0)
        return -1;
    char **argv = calloc(n + 1, sizeof *argv);
    if (!argv)
        return -1;
    for (size_t i = 0; i < n; i++)
        argv[i] = (char *)json_string_value(json_array_get(cmdline, i));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setsid();
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (nul >= 0)
            dup2(nul, 0);
        /* A daemon keeps nothing of its launcher but 0-2: an inherited pipe or lock (a CI
         * harness's output pipe, `flock` around a bench that restarts members) would otherwise
         * stay open for the daemon's whole life. */
        close_range(3, ~0u, 0);
        execv(argv[0], argv);
        dprintf(2, "kvpoolctl: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    free(argv);
    return pid;
}

static int free_port(int *keep_fd)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = 0};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        close(fd);
        return -1;
    }
    *keep_fd = fd; /* held open until every port is chosen, so no two are equal */
    return ntohs(a.sin_port);
}

static int self_dir(char *out, size_t cap)
{
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    snprintf(out, cap, "%s", dirname(buf));
    return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static int mkdir_p(const char *path)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* ------------------------------------------------------------------ cluster.json */

static int cluster_path(const char *dir, char *out, size_t cap)
{
    return snprintf(out, cap, "%s/cluster.json", dir) >= (int)cap ? -1 : 0;
}

static json_t *cluster_load(const char *dir)
{
    char path[PATH_MAX];
    if (cluster_path(dir, path, sizeof path))
        return NULL;
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j)
        fprintf(stderr, "kvpoolctl cluster: %s: %s\n", path, err.text);
    return j;
}

static int cluster_save(const char *dir, json_t *j)
{
    char path[PATH_MAX], tmp[PATH_MAX + 16];
    if (cluster_path(dir, path, sizeof path))
        return -1;
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    if (json_dump_file(j, tmp, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "kvpoolctl cluster: cannot write %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

static const char *cmd_exe(json_t *member)
{
    return json_string_value(json_array_get(json_object_get(member, "cmdline"), 0));
}

static bool member_alive(json_t *m)
{
    return proc_alive((pid_t)json_integer_value(json_object_get(m, "pid")), cmd_exe(m));
}

static void print_log_tail(const char *log)
{
    FILE *f = fopen(log, "r");
    if (!f)
        return;
    char line[1024];
    char ring[8][1024];
    int n = 0;
    while (fgets(line, sizeof line, f))
        snprintf(ring[n++ % 8], sizeof ring[0], "%s", line);
    fclose(f);
    fprintf(stderr, "--- last lines of %s:\n", log);
    for (int i = n > 8 ? n - 8 : 0; i < n; i++)
        fprintf(stderr, "  %s", ring[i % 8]);
}

/* --config FILE given to `up` is meant for every process, but a process rejects keys of another
 * kind. Split it: DIR/<kind>.config.json gets the keys that kind accepts; a key no kind accepts
 * (unknown, or a bad value) goes to every file, so the process reports it. */
static int split_config(const char *src, const char *dir, char *master_out, char *seg_out, size_t cap)
{
    json_error_t err;
    json_t *root = json_load_file(src, 0, &err);
    if (!json_is_object(root)) {
        fprintf(stderr, "kvpoolctl cluster up: --config %s: %s\n", src, root ? "not a JSON object" : err.text);
        json_decref(root);
        return -1;
    }
    json_t *out[2] = {json_object(), json_object()};
    enum kvp_cfg_kind kinds[2] = {KVP_CFG_MASTER, KVP_CFG_SEGMENT};
    union {
        struct kvp_cfg_master m;
        struct kvp_cfg_segment s;
    } scratch;
    /* Probing: the process that gets the key logs the real error, not us. */
    fflush(stderr);
    int saved = dup(2), nul = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (nul >= 0)
        dup2(nul, 2);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        char buf[64];
        const char *str = NULL;
        if (json_is_string(v))
            str = json_string_value(v);
        else if (json_is_integer(v))
            snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v)), str = buf;
        else if (json_is_real(v))
            snprintf(buf, sizeof buf, "%.17g", json_real_value(v)), str = buf;
        else if (json_is_boolean(v))
            str = json_is_true(v) ? "true" : "false";
        bool ok[2] = {false, false};
        for (int k = 0; k < 2 && str; k++) {
            kvp_cfg_defaults(kinds[k], &scratch);
            ok[k] = kvp_cfg_set(kinds[k], &scratch, key, str) == KVP_OK;
        }
        for (int k = 0; k < 2; k++)
            if (ok[k] || (!ok[0] && !ok[1]))
                json_object_set(out[k], key, v);
    }
    if (saved >= 0) {
        dup2(saved, 2);
        close(saved);
    }
    if (nul >= 0)
        close(nul);
    json_decref(root);
    snprintf(master_out, cap, "%s/master.config.json", dir);
    snprintf(seg_out, cap, "%s/segment.config.json", dir);
    int rc = 0;
    if (json_dump_file(out[0], master_out, JSON_INDENT(2)) != 0 || json_dump_file(out[1], seg_out, JSON_INDENT(2)) != 0) {
        fprintf(stderr, "kvpoolctl cluster up: cannot write the split config in %s\n", dir);
        rc = -1;
    }
    json_decref(out[0]);
    json_decref(out[1]);
    return rc;
}

/* ------------------------------------------------------------------ options */

struct up_opts {
    const char *dir;
    int masters;
    int segments;
    const char *segment_size;
    int base_port;
    bool metrics;           /* --metrics: every process gets a metrics_port (cluster.json "metrics") */
    bool auth_off;          /* --auth none: no keys, every process runs with auth none */
    const char *config;
    uint32_t wait_ms;
    uint32_t grace_ms;
};

static bool want_value(int argc, char **argv, int *i, const char *name, const char **val)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0)
        return false;
    if (argv[*i][n] == '=') {
        *val = argv[*i] + n + 1;
        return true;
    }
    if (argv[*i][n] != '\0')
        return false;
    *val = *i + 1 < argc ? argv[++*i] : NULL;
    return true;
}

static bool parse_int(const char *s, long lo, long hi, int *out)
{
    char *end = NULL;
    if (!s)
        return false;
    long v = strtol(s, &end, 10);
    if (!end || *end || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

static int parse_opts(struct ctl *c, int argc, char **argv, int first, struct up_opts *o, char **pos, int *npos)
{
    *npos = 0;
    for (int i = first; i < argc; i++) {
        const char *v = NULL;
        int iv;
        if (strcmp(argv[i], "--json") == 0) {
            c->json = true;
        } else if (strcmp(argv[i], "--metrics") == 0) {
            o->metrics = true;
        } else if (want_value(argc, argv, &i, "--auth", &v)) {
            if (!v || (strcmp(v, "none") != 0 && strcmp(v, "curve") != 0)) {
                fprintf(stderr, "kvpoolctl cluster: --auth must be curve or none\n");
                return 2;
            }
            o->auth_off = strcmp(v, "none") == 0;
        } else if (want_value(argc, argv, &i, "--dir", &v)) {
            if (!v)
                goto need;
            o->dir = v;
        } else if (want_value(argc, argv, &i, "--masters", &v)) {
            if (!parse_int(v, 1, KVP_CFG_MAX_MASTERS, &o->masters)) {
                fprintf(stderr, "kvpoolctl cluster: --masters: a count in [1, %d]\n", KVP_CFG_MAX_MASTERS);
                return 2;
            }
        } else if (want_value(argc, argv, &i, "--segments", &v)) {
            if (!parse_int(v, 0, CLUSTER_MAX_SEGMENTS, &o->segments)) {
                fprintf(stderr, "kvpoolctl cluster: --segments: a count in [0, %d]\n", CLUSTER_MAX_SEGMENTS);
                return 2;
            }
        } else if (want_value(argc, argv, &i, "--segment-size", &v)) {
            uint64_t b;
            if (!v || kvp_cfg_parse_size(v, &b) != KVP_OK || b == 0) {
                fprintf(stderr, "kvpoolctl cluster: --segment-size: a size such as 256M or 1G\n");
                return 2;
            }
            o->segment_size = v;
        } else if (want_value(argc, argv, &i, "--base-port", &v)) {
            if (!parse_int(v, 1024, 65000, &o->base_port)) {
                fprintf(stderr, "kvpoolctl cluster: --base-port: a port in [1024, 65000]\n");
                return 2;
            }
        } else if (want_value(argc, argv, &i, "--config", &v)) {
            if (!v || access(v, R_OK) != 0) {
                fprintf(stderr, "kvpoolctl cluster: --config %s: not readable\n", v ? v : "");
                return 2;
            }
            o->config = v;
        } else if (want_value(argc, argv, &i, "--wait-ms", &v) || want_value(argc, argv, &i, "--timeout", &v)) {
            if (!parse_int(v, 1, 600000, &iv)) {
                fprintf(stderr, "kvpoolctl cluster: --wait-ms: milliseconds\n");
                return 2;
            }
            o->wait_ms = (uint32_t)iv;
        } else if (want_value(argc, argv, &i, "--grace-ms", &v)) {
            if (!parse_int(v, 0, 600000, &iv)) {
                fprintf(stderr, "kvpoolctl cluster: --grace-ms: milliseconds\n");
                return 2;
            }
            o->grace_ms = (uint32_t)iv;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "kvpoolctl cluster: unknown option '%s'\n", argv[i]);
            return 2;
        } else if (*npos < 4) {
            pos[(*npos)++] = argv[i];
        } else {
            fprintf(stderr, "kvpoolctl cluster: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!o->dir) {
        fprintf(stderr, "kvpoolctl cluster: --dir DIR is required\n");
        return 2;
    }
    return 0;
need:
    fprintf(stderr, "kvpoolctl cluster: %s needs a value\n", argv[argc - 1]);
    return 2;
}

/* ------------------------------------------------------------------ up */

static json_t *str_array(const char *const *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_string(v[i]));
    return a;
}

/* Wait until a leader answers ClusterStatus (and, when want_segments, every seg-i is ACTIVE). */
static int wait_ready(struct ctl *c, json_t *cl, int want_segments, uint64_t deadline, json_t **status_out)
{
    int last_err = KVP_ERR_UNAVAILABLE;
    while (kvp_clock_now_ms() < deadline) {
        /* A process that died will not come up: report it at once. */
        const char *groups[] = {"masters", "segments"};
        for (int g = 0; g < 2; g++) {
            size_t i;
            json_t *m;
            json_array_foreach(json_object_get(cl, groups[g]), i, m) {
                if (!member_alive(m)) {
                    const char *log = json_string_value(json_object_get(m, "log"));
                    const char *name = json_string_value(json_object_get(m, "name"));
                    fprintf(stderr, "kvpoolctl cluster up: %s exited during start-up\n", name ? name : groups[g]);
                    if (log)
                        print_log_tail(log);
                    return KVP_ERR_IO;
                }
            }
        }
        uint64_t now = kvp_clock_now_ms();
        uint32_t t = deadline - now > 2000 ? 2000 : (uint32_t)(deadline - now);
        int err;
        json_t *st = ctl_status(c, t ? t : 1, &err);
        if (!st) {
            last_err = err;
            kvp_clock_sleep_ms(50);
            continue;
        }
        int active = 0;
        size_t i;
        json_t *s;
        json_array_foreach(json_object_get(st, "segments"), i, s) {
            const char *name = json_string_value(json_object_get(s, "name"));
            const char *state = json_string_value(json_object_get(s, "state"));
            if (name && strncmp(name, "seg-", 4) == 0 && state && strcmp(state, "ACTIVE") == 0)
                active++;
        }
        if (active >= want_segments) {
            /* A member that died while we waited (a port taken at bind) fails the start even
             * though the others formed a quorum. */
            bool all_alive = true;
            for (int g = 0; g < 2; g++) {
                size_t k;
                json_t *m;
                json_array_foreach(json_object_get(cl, groups[g]), k, m) all_alive &= member_alive(m);
            }
            if (!all_alive) {
                json_decref(st);
                continue; /* the check at the top of the loop reports it */
            }
            *status_out = st;
            return KVP_OK;
        }
        json_decref(st);
        last_err = KVP_ERR_UNAVAILABLE;
        kvp_clock_sleep_ms(100);
    }
    return last_err;
}

static int cluster_up(struct ctl *c, int argc, char **argv)
{
    struct up_opts o = {.masters = 3, .segment_size = "256M", .wait_ms = 30000};
    /* KVPOOL_AUTH=none is inherited by every process started: make no keys then either. */
    const char *env_auth = getenv("KVPOOL_AUTH");
    o.auth_off = env_auth && strcmp(env_auth, "none") == 0;
    char *pos[4];
    int npos;
    int rc = parse_opts(c, argc, argv, 2, &o, pos, &npos);
    if (rc)
        return rc;
    if (npos) {
        fprintf(stderr, "kvpoolctl cluster up: unexpected argument '%s'\n", pos[0]);
        return 2;
    }
    if (mkdir_p(o.dir) != 0) {
        fprintf(stderr, "kvpoolctl cluster up: cannot create %s: %s\n", o.dir, strerror(errno));
        return 1;
    }
    char dir[PATH_MAX], exe_dir[PATH_MAX], master_exe[PATH_MAX + 32], seg_exe[PATH_MAX + 32], config[PATH_MAX];
    if (!realpath(o.dir, dir) || self_dir(exe_dir, sizeof exe_dir) != 0) {
        fprintf(stderr, "kvpoolctl cluster up: cannot resolve paths: %s\n", strerror(errno));
        return 1;
    }
    char master_config[PATH_MAX + 32], seg_config[PATH_MAX + 32];
    if (o.config && !realpath(o.config, config)) {
        fprintf(stderr, "kvpoolctl cluster up: --config %s: %s\n", o.config, strerror(errno));
        return 2;
    }
    if (o.config && split_config(config, dir, master_config, seg_config, sizeof master_config) != 0)
        return 2;
    snprintf(master_exe, sizeof master_exe, "%s/kvpool-master", exe_dir);
    snprintf(seg_exe, sizeof seg_exe, "%s/kvpool-segment", exe_dir);
    if (access(master_exe, X_OK) != 0) {
        fprintf(stderr, "kvpoolctl cluster up: %s not found (build the kvpool-master target)\n", master_exe);
        return 1;
    }
    bool have_seg = access(seg_exe, X_OK) == 0;
    if (o.segments > 0 && !have_seg) {
        fprintf(stderr, "kvpoolctl cluster up: %s not found: starting no segments\n", seg_exe);
        o.segments = 0;
    }

    /* An existing cluster in DIR: refuse while any of it runs; else start afresh. */
    char cpath[PATH_MAX];
    cluster_path(dir, cpath, sizeof cpath);
    if (access(cpath, F_OK) == 0) {
        json_t *old = cluster_load(dir);
        const char *groups[] = {"masters", "segments"};
        for (int g = 0; old && g < 2; g++) {
            size_t i;
            json_t *m;
            json_array_foreach(json_object_get(old, groups[g]), i, m) if (member_alive(m))
            {
                fprintf(stderr, "kvpoolctl cluster up: %s has a running cluster (pid %lld): "
                                "run `kvpoolctl cluster down --dir %s` first\n",
                        dir, (long long)json_integer_value(json_object_get(m, "pid")), dir);
                json_decref(old);
                return 1;
            }
        }
        json_decref(old);
    }

    /* Ports, masters, a leader. A chosen free port can be taken by another process before the
     * master binds it: then that master exits, and the whole start is retried on new ports. */
    int n = o.masters;
    char members[2048], masters_list[1024];
    json_t *cl = NULL;
    uint64_t deadline = kvp_clock_now_ms() + o.wait_ms;
    json_t *st = NULL;
    for (int attempt = 1;; attempt++) {
        int ctrl[KVP_CFG_MAX_MASTERS], raft[KVP_CFG_MAX_MASTERS], mport[KVP_CFG_MAX_MASTERS];
        int fds[3 * KVP_CFG_MAX_MASTERS];
        int nfds = 0;
        for (int i = 0; i < n; i++) {
            mport[i] = 0;
            if (o.base_port) {
                ctrl[i] = o.base_port + 2 * i;
                raft[i] = o.base_port + 2 * i + 1;
                if (o.metrics) /* after the masters' control and Raft ports */
                    mport[i] = o.base_port + 2 * n + i;
                continue;
            }
            ctrl[i] = free_port(&fds[nfds]);
            if (ctrl[i] > 0)
                nfds++;
            raft[i] = free_port(&fds[nfds]);
            if (raft[i] > 0)
                nfds++;
            if (o.metrics && (mport[i] = free_port(&fds[nfds])) > 0)
                nfds++;
            if (ctrl[i] <= 0 || raft[i] <= 0 || (o.metrics && mport[i] <= 0)) {
                fprintf(stderr, "kvpoolctl cluster up: no free port: %s\n", strerror(errno));
                for (int k = 0; k < nfds; k++)
                    close(fds[k]);
                return 1;
            }
        }
        for (int k = 0; k < nfds; k++)
            close(fds[k]);

        members[0] = masters_list[0] = '\0';
        for (int i = 0; i < n; i++) {
            size_t ml = strlen(members), al = strlen(masters_list);
            snprintf(members + ml, sizeof members - ml, "%s%d@127.0.0.1:%d@127.0.0.1:%d", i ? "," : "", i + 1, ctrl[i],
                     raft[i]);
            snprintf(masters_list + al, sizeof masters_list - al, "%s127.0.0.1:%d", i ? "," : "", ctrl[i]);
        }

        cl = json_object();
        json_object_set_new(cl, "master_server_address", json_string(masters_list));
        json_object_set_new(cl, "dir", json_string(dir));
        if (o.config)
            json_object_set_new(cl, "config", json_string(config));
        {
            char addrs[KVP_CFG_MAX_MASTERS][64];
            const char *ap[KVP_CFG_MAX_MASTERS];
            for (int i = 0; i < n; i++) {
                snprintf(addrs[i], sizeof addrs[i], "127.0.0.1:%d", ctrl[i]);
                ap[i] = addrs[i];
            }
            if (ctl_cluster_keys(dir, n, ap, o.auth_off, cl) != 0) { /* kvpoolctl_auth.c */
                json_decref(cl);
                return 1;
            }
        }
        json_t *jm = json_array(), *js = json_array();
        json_object_set_new(cl, "masters", jm);
        json_object_set_new(cl, "segments", js);
        for (int i = 0; i < n; i++) {
            char id[16], listen[64], raddr[64], data[PATH_MAX + 32], log[PATH_MAX + 32], name[32];
            snprintf(id, sizeof id, "%d", i + 1);
            snprintf(name, sizeof name, "master-%d", i + 1);
            snprintf(listen, sizeof listen, "127.0.0.1:%d", ctrl[i]);
            snprintf(raddr, sizeof raddr, "127.0.0.1:%d", raft[i]);
            snprintf(data, sizeof data, "%s/master-%d", dir, i + 1);
            snprintf(log, sizeof log, "%s/master-%d.log", dir, i + 1);
            struct stat sb;
            if (stat(data, &sb) == 0) {
                fprintf(stderr, "kvpoolctl cluster up: removing the old data dir %s\n", data);
                nftw(data, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
            }
            unlink(log);
            const char *cmd[24] = {master_exe, "--id", id, "--listen", listen, "--raft-address", raddr,
                                   "--data-dir", data, "--members", members};
            char keyarg[PATH_MAX + 64];
            size_t ncmd = ctl_cluster_auth_args(cl, "master", i, cmd, 11, keyarg, sizeof keyarg);
            if (o.config) {
                cmd[ncmd++] = "--config";
                cmd[ncmd++] = master_config;
            }
            char mp[16], maddr[64];
            snprintf(mp, sizeof mp, "%d", mport[i]);
            snprintf(maddr, sizeof maddr, "127.0.0.1:%d", mport[i]);
            if (o.metrics) {
                cmd[ncmd++] = "--metrics-port";
                cmd[ncmd++] = mp;
            }
            json_t *m = json_object();
            json_object_set_new(m, "id", json_integer(i + 1));
            json_object_set_new(m, "name", json_string(name));
            json_object_set_new(m, "role", json_string("master"));
            json_object_set_new(m, "address", json_string(listen));
            json_object_set_new(m, "raft_address", json_string(raddr));
            json_object_set_new(m, "data_dir", json_string(data));
            json_object_set_new(m, "log", json_string(log));
            if (o.metrics)
                json_object_set_new(m, "metrics", json_string(maddr));
            json_object_set_new(m, "cmdline", str_array(cmd, ncmd));
            pid_t pid = spawn(json_object_get(m, "cmdline"), log);
            json_object_set_new(m, "pid", json_integer(pid));
            json_array_append_new(jm, m);
            if (pid <= 0) {
                fprintf(stderr, "kvpoolctl cluster up: cannot start %s: %s\n", name, strerror(errno));
                cluster_save(dir, cl);
                json_decref(cl);
                return 1;
            }
        }
        cluster_save(dir, cl);
        ctl_set_masters(c, masters_list);
        c->cluster_file = cpath; /* its "auth" section: the admin key (kvpoolctl_auth.c) */

        rc = wait_ready(c, cl, 0, deadline, &st);
        if (rc == KVP_OK)
            break;
        if (rc == KVP_ERR_IO && !o.base_port && attempt < 3) {
            fprintf(stderr, "kvpoolctl cluster up: a master exited during start-up (port taken?): "
                            "retrying on other ports (attempt %d)\n", attempt + 1);
            size_t i;
            json_t *m;
            json_array_foreach(jm, i, m) if (member_alive(m)) kill((pid_t)json_integer_value(json_object_get(m, "pid")), SIGKILL);
            uint64_t d2 = kvp_clock_now_ms() + 3000;
            bool any = true;
            while (any && kvp_clock_now_ms() < d2) {
                any = false;
                json_array_foreach(jm, i, m) any |= member_alive(m);
                if (any)
                    kvp_clock_sleep_ms(20);
            }
            json_decref(cl);
            cl = NULL;
            deadline = kvp_clock_now_ms() + o.wait_ms;
            continue;
        }
        if (rc == KVP_ERR_IO)
            fprintf(stderr, "kvpoolctl cluster up: a master exited during start-up; logs in %s/master-*.log\n", dir);
        else
            fprintf(stderr, "kvpoolctl cluster up: no leader within %u ms (%s); logs in %s/master-*.log\n",
                    o.wait_ms, kvp_errname(rc), dir);
        json_decref(cl);
        return 1;
    }
    json_int_t leader = json_integer_value(json_object_get(st, "leader_id"));
    json_decref(st);
    st = NULL;
    json_t *js = json_object_get(cl, "segments");

    for (int i = 0; i < o.segments; i++) {
        char name[32], log[PATH_MAX + 64];
        snprintf(name, sizeof name, "seg-%d", i + 1);
        snprintf(log, sizeof log, "%s/%s.log", dir, name);
        unlink(log);
        const char *cmd[20] = {seg_exe, "--name", name, "--global-segment-size", o.segment_size,
                               "--master-server-address", masters_list};
        char keyarg[PATH_MAX + 64];
        size_t ncmd = ctl_cluster_auth_args(cl, "segment", i, cmd, 7, keyarg, sizeof keyarg);
        if (o.config) {
            cmd[ncmd++] = "--config";
            cmd[ncmd++] = seg_config;
        }
        char mp[16], maddr[64];
        int sport = 0;
        if (o.metrics) {
            int fd = -1;
            sport = o.base_port ? o.base_port + 3 * n + i : free_port(&fd);
            if (fd >= 0)
                close(fd);
            snprintf(mp, sizeof mp, "%d", sport);
            snprintf(maddr, sizeof maddr, "127.0.0.1:%d", sport);
            cmd[ncmd++] = "--metrics-port";
            cmd[ncmd++] = mp;
        }
        json_t *s = json_object();
        uint64_t size = 0;
        kvp_cfg_parse_size(o.segment_size, &size);
        json_object_set_new(s, "name", json_string(name));
        json_object_set_new(s, "role", json_string("segment"));
        json_object_set_new(s, "log", json_string(log));
        json_object_set_new(s, "size", json_integer((json_int_t)size));
        if (o.metrics && sport > 0)
            json_object_set_new(s, "metrics", json_string(maddr));
        json_object_set_new(s, "cmdline", str_array(cmd, ncmd));
        pid_t pid = spawn(json_object_get(s, "cmdline"), log);
        json_object_set_new(s, "pid", json_integer(pid));
        json_array_append_new(js, s);
    }
    cluster_save(dir, cl);
    if (o.segments > 0) {
        rc = wait_ready(c, cl, o.segments, deadline, &st);
        if (rc != KVP_OK) {
            fprintf(stderr, "kvpoolctl cluster up: segments not all mounted within %u ms (%s); logs in %s/seg-*.log\n",
                    o.wait_ms, kvp_errname(rc), dir);
            json_decref(cl);
            return 1;
        }
        leader = json_integer_value(json_object_get(st, "leader_id"));
        json_decref(st);
    }
    if (c->json) {
        json_object_set_new(cl, "leader_id", json_integer(leader));
        ctl_print_json(cl);
    } else {
        printf("cluster up: %d master(s) (leader %lld), %d segment(s); %s\n", n, (long long)leader, o.segments,
               cpath);
        printf("masters: %s\n", masters_list);
        if (o.metrics)
            printf("metrics: kvpoolctl --cluster %s top\n", cpath);
    }
    json_decref(cl);
    return 0;
}

/* ------------------------------------------------------------------ down */

static int stop_members(json_t **list, size_t n, uint32_t grace_ms, int sig)
{
    for (size_t i = 0; i < n; i++)
        if (member_alive(list[i]))
            kill((pid_t)json_integer_value(json_object_get(list[i], "pid")), sig);
    uint64_t deadline = kvp_clock_now_ms() + grace_ms;
    for (;;) {
        size_t alive = 0;
        for (size_t i = 0; i < n; i++)
            alive += member_alive(list[i]);
        if (!alive)
            break;
        if (kvp_clock_now_ms() >= deadline) {
            for (size_t i = 0; i < n; i++)
                if (member_alive(list[i])) {
                    fprintf(stderr, "kvpoolctl cluster down: pid %lld did not stop in %u ms: SIGKILL\n",
                            (long long)json_integer_value(json_object_get(list[i], "pid")), grace_ms);
                    kill((pid_t)json_integer_value(json_object_get(list[i], "pid")), SIGKILL);
                }
            uint64_t d2 = kvp_clock_now_ms() + 2000;
            while (kvp_clock_now_ms() < d2) {
                alive = 0;
                for (size_t i = 0; i < n; i++)
                    alive += member_alive(list[i]);
                if (!alive)
                    break;
                kvp_clock_sleep_ms(20);
            }
            break;
        }
        kvp_clock_sleep_ms(20);
    }
    int left = 0;
    for (size_t i = 0; i < n; i++) {
        if (member_alive(list[i]))
            left++;
        else
            json_object_set_new(list[i], "pid", json_integer(0));
    }
    return left;
}

static int cluster_down(struct ctl *c, int argc, char **argv)
{
    struct up_opts o = {.grace_ms = 5000};
    char *pos[4];
    int npos;
    int rc = parse_opts(c, argc, argv, 2, &o, pos, &npos);
    if (rc)
        return rc;
    json_t *cl = cluster_load(o.dir);
    if (!cl)
        return 1;
    json_t *list[KVP_CFG_MAX_MASTERS + CLUSTER_MAX_SEGMENTS];
    size_t n = 0, i;
    json_t *m;
    /* Segments first (they unmount from the masters), then the masters. Segments get SIGINT
     * (unmount and exit), not SIGTERM (drain: migrate replicas elsewhere), since the whole
     * cluster is going away. */
    json_array_foreach(json_object_get(cl, "segments"), i, m) if (n < CLUSTER_MAX_SEGMENTS) list[n++] = m;
    int left = stop_members(list, n, o.grace_ms, SIGINT);
    size_t nseg = n;
    n = 0;
    json_array_foreach(json_object_get(cl, "masters"), i, m) if (n < KVP_CFG_MAX_MASTERS) list[n++] = m;
    left += stop_members(list, n, o.grace_ms, SIGTERM);
    cluster_save(o.dir, cl);
    json_decref(cl);
    if (c->json) {
        json_t *j = json_pack("{s:s, s:I, s:I, s:i}", "result", left ? "incomplete" : "ok", "masters", (json_int_t)n,
                              "segments", (json_int_t)nseg, "still_running", left);
        ctl_print_json(j);
        json_decref(j);
    } else {
        printf("cluster down: %zu master(s), %zu segment(s) stopped%s\n", n, nseg, left ? " (some still running!)" : "");
    }
    return left ? 1 : 0;
}

/* ------------------------------------------------------------------ restart */

static int cluster_restart(struct ctl *c, int argc, char **argv)
{
    struct up_opts o = {0};
    char *pos[4];
    int npos;
    int rc = parse_opts(c, argc, argv, 2, &o, pos, &npos);
    if (rc)
        return rc;
    if (npos != 1) {
        fprintf(stderr, "usage: kvpoolctl cluster restart --dir DIR ID   (master id, master-ID or segment name)\n");
        return 2;
    }
    json_t *cl = cluster_load(o.dir);
    if (!cl)
        return 1;
    const char *want = pos[0];
    int id = 0;
    if (!parse_int(want, 1, 1000, &id) && strncmp(want, "master-", 7) == 0)
        parse_int(want + 7, 1, 1000, &id);
    json_t *found = NULL;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(cl, "masters"), i, m) if (id && json_integer_value(json_object_get(m, "id")) == id)
        found = m;
    json_array_foreach(json_object_get(cl, "segments"), i, m)
    {
        const char *name = json_string_value(json_object_get(m, "name"));
        if (!found && name && strcmp(name, want) == 0)
            found = m;
    }
    if (!found) {
        fprintf(stderr, "kvpoolctl cluster restart: no member '%s' in %s/cluster.json\n", want, o.dir);
        json_decref(cl);
        return 1;
    }
    pid_t pid = (pid_t)json_integer_value(json_object_get(found, "pid"));
    /* Killed but still exiting (a zombie leader, other threads still holding its ports and
     * lock): wait until every thread is gone, then start it (issue 15). */
    if (proc_zombie(pid) && kvp_proc_wait_gone(pid, 10000) != KVP_OK) {
        fprintf(stderr, "kvpoolctl cluster restart: %s (pid %d) is still exiting after 10 s\n", want, (int)pid);
        json_decref(cl);
        return 1;
    }
    if (member_alive(found)) {
        if (c->json) {
            json_t *j = json_pack("{s:s, s:i}", "result", "running", "pid", (int)pid);
            ctl_print_json(j);
            json_decref(j);
        } else {
            printf("%s is already running (pid %d)\n", want, (int)pid);
        }
        json_decref(cl);
        return 0;
    }
    const char *log = json_string_value(json_object_get(found, "log"));
    pid = spawn(json_object_get(found, "cmdline"), log ? log : "/dev/null");
    if (pid <= 0) {
        fprintf(stderr, "kvpoolctl cluster restart: cannot start %s: %s\n", want, strerror(errno));
        json_decref(cl);
        return 1;
    }
    json_object_set_new(found, "pid", json_integer(pid));
    rc = cluster_save(o.dir, cl) ? 1 : 0;
    if (c->json) {
        json_t *j = json_pack("{s:s, s:i}", "result", "started", "pid", (int)pid);
        ctl_print_json(j);
        json_decref(j);
    } else {
        printf("%s started (pid %d)\n", want, (int)pid);
    }
    json_decref(cl);
    return rc;
}

int ctl_cmd_cluster(struct ctl *c, int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: kvpoolctl cluster up|down|restart --dir DIR ...\n");
        return 2;
    }
    if (strcmp(argv[1], "up") == 0)
        return cluster_up(c, argc, argv);
    if (strcmp(argv[1], "down") == 0)
        return cluster_down(c, argc, argv);
    if (strcmp(argv[1], "restart") == 0)
        return cluster_restart(c, argc, argv);
    fprintf(stderr, "kvpoolctl cluster: unknown subcommand '%s' (up, down, restart)\n", argv[1]);
    return 2;
}
