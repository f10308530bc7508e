/*
 * kvpoolctl_top.c — `kvpoolctl top`: a live terminal view of a cluster built from the numbers
 * its processes serve on /metrics (docs/operations.md "Metrics and health endpoints").
 *
 *   kvpoolctl top --endpoints HOST:PORT,HOST:PORT,... [--interval MS] [--count N]
 *   kvpoolctl --cluster DIR top [--interval MS] [--count N]   (a cluster up --metrics: the
 *                                                             "metrics" of its members)
 *
 * Every interval it scrapes each endpoint (masters and segments alike, told apart by their
 * series), and prints one screen: per process its role and state, per master Raft term,
 * commit index and apply lag and RPC rates; per segment bytes and requests per second; the
 * pool as the leader sees it and the per-key results of puts, gets and exists per second.
 * Rates are over the last interval (blank on the first screen). The screen is cleared
 * between refreshes when stdout is a terminal. --count N stops after N screens (default: until
 * interrupted). Exit status: 0, or 2 for a usage error. An endpoint that does not answer is
 * shown as "down"; it is not an error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "tools/kvpoolctl/kvpoolctl_ctl.h"

#define TOP_MAX_EP 32

struct sample {
    char *series; /* name{labels} as exposed */
    double v;
};

struct scrape {
    struct sample *s;
    size_t n, cap;
    bool up;
};

struct ep {
    char addr[256];
    struct scrape cur, prev;
};

static void scrape_free(struct scrape *sc)
{
    for (size_t i = 0; i < sc->n; i++)
        free(sc->s[i].series);
    free(sc->s);
    memset(sc, 0, sizeof *sc);
}

/* GET /metrics from host:port ("[v6]:port" too). Returns the body (malloc'd) or NULL. */
static char *http_get_metrics(const char *hostport, unsigned timeout_ms)
{
    char host[256];
    const char *colon = strrchr(hostport, ':');
    if (!colon || colon == hostport)
        return NULL;
    const char *h = hostport;
    size_t hn = (size_t)(colon - hostport);
    if (h[0] == '[' && hn >= 2 && h[hn - 1] == ']') {
        h++;
        hn -= 2;
    }
    if (hn >= sizeof host)
        return NULL;
    memcpy(host, h, hn);
    host[hn] = '\0';
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0)
        return NULL;
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    char *buf = NULL;
    if (fd >= 0) {
        struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        char req[320];
        int rn = snprintf(req, sizeof req, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", host);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 && send(fd, req, (size_t)rn, MSG_NOSIGNAL) == rn) {
            size_t cap = 65536, len = 0;
            buf = malloc(cap + 1);
            while (buf) {
                if (len == cap) {
                    char *nb = realloc(buf, cap * 2 + 1);
                    if (!nb) {
                        free(buf);
                        buf = NULL;
                        break;
                    }
                    buf = nb;
                    cap *= 2;
                }
                ssize_t r = recv(fd, buf + len, cap - len, 0);
                if (r <= 0)
                    break;
                len += (size_t)r;
            }
            if (buf)
                buf[len] = '\0';
            if (buf && strncmp(buf, "HTTP/1.", 7) == 0 && strstr(buf, " 200 ") == buf + 8) {
                char *body = strstr(buf, "\r\n\r\n");
                char *out = body ? strdup(body + 4) : NULL;
                free(buf);
                buf = out;
            } else {
                free(buf);
                buf = NULL;
            }
        }
        close(fd);
    }
    freeaddrinfo(ai);
    return buf;
}

static void parse(struct scrape *sc, char *text)
{
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (l[0] == '#' || !l[0])
            continue;
        char *sp = strrchr(l, ' ');
        if (!sp)
            continue;
        *sp = '\0';
        if (sc->n == sc->cap) {
            size_t nc = sc->cap ? sc->cap * 2 : 256;
            struct sample *ns = realloc(sc->s, nc * sizeof *ns);
            if (!ns)
                return;
            sc->s = ns;
            sc->cap = nc;
        }
        sc->s[sc->n].series = strdup(l);
        sc->s[sc->n].v = strtod(sp + 1, NULL);
        if (sc->s[sc->n].series)
            sc->n++;
    }
}

/* The value of an exact series, or -1. */
static double val(const struct scrape *sc, const char *series)
{
    for (size_t i = 0; i < sc->n; i++)
        if (strcmp(sc->s[i].series, series) == 0)
            return sc->s[i].v;
    return -1;
}

/* Sum of every series whose text starts with `prefix` (a name plus '{', or a full series). */
static double sum_prefix(const struct scrape *sc, const char *prefix, const char *must_contain,
                         const char *must_not_contain)
{
    double t = 0;
    size_t n = strlen(prefix);
    for (size_t i = 0; i < sc->n; i++)
        if (strncmp(sc->s[i].series, prefix, n) == 0 &&
            (!must_contain || strstr(sc->s[i].series, must_contain)) &&
            (!must_not_contain || !strstr(sc->s[i].series, must_not_contain)))
            t += sc->s[i].v;
    return t;
}

static void rate_str(char *buf, size_t cap, const struct ep *e, double cur, double prev, double secs)
{
    if (!e->prev.up || prev < 0 || cur < prev || secs <= 0)
        snprintf(buf, cap, "-");
    else
        snprintf(buf, cap, "%.1f", (cur - prev) / secs);
}

static const char *bytes_str(char *buf, size_t cap, double b)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(buf, cap, i ? "%.1f %s" : "%.0f %s", b, u[i]);
    return buf;
}

static void show(struct ep *eps, int n, double secs, unsigned interval_ms)
{
    time_t now = time(NULL);
    char ts[32];
    strftime(ts, sizeof ts, "%H:%M:%S", localtime(&now));
    printf("kvpool top  %s  %d endpoint%s, every %u ms; rates per second over the last interval\n\n", ts, n,
           n == 1 ? "" : "s", interval_ms);
    printf("%-24s %-9s %6s %10s %6s %9s %9s %10s\n", "MASTER", "ROLE", "TERM", "COMMIT", "LAG", "RPC/s", "ERR/s",
           "LEADERCHG");
    int leader = -1;
    for (int i = 0; i < n; i++) {
        struct ep *e = &eps[i];
        if (e->cur.up && val(&e->cur, "kvpool_segment_mounted") >= 0)
            continue; /* a segment: below */
        if (!e->cur.up) {
            printf("%-24s %-9s\n", e->addr, "down");
            continue;
        }
        bool is_leader = val(&e->cur, "kvpool_raft_is_leader") == 1;
        if (is_leader && val(&e->cur, "kvpool_master_pool_view") == 1)
            leader = i;
        char r1[32], r2[32];
        rate_str(r1, sizeof r1, e, sum_prefix(&e->cur, "kvpool_master_rpcs_total{", NULL, NULL),
                 sum_prefix(&e->prev, "kvpool_master_rpcs_total{", NULL, NULL), secs);
        rate_str(r2, sizeof r2, e, sum_prefix(&e->cur, "kvpool_master_rpcs_total{", NULL, "code=\"KVP_OK\""),
                 sum_prefix(&e->prev, "kvpool_master_rpcs_total{", NULL, "code=\"KVP_OK\""), secs);
        printf("%-24s %-9s %6.0f %10.0f %6.0f %9s %9s %10.0f\n", e->addr,
               is_leader ? "leader" : val(&e->cur, "kvpool_raft_leader_id") > 0 ? "follower" : "no-leader",
               val(&e->cur, "kvpool_raft_term"), val(&e->cur, "kvpool_raft_commit_index"),
               val(&e->cur, "kvpool_raft_apply_lag"), r1, r2, val(&e->cur, "kvpool_raft_leader_changes_total"));
    }
    printf("\n%-24s %-9s %11s %11s %9s %6s %10s\n", "SEGMENT", "STATE", "READ/s", "WRITE/s", "REQ/s", "CONNS",
           "SIZE");
    for (int i = 0; i < n; i++) {
        struct ep *e = &eps[i];
        if (!e->cur.up || val(&e->cur, "kvpool_segment_mounted") < 0)
            continue;
        char rd[32], wr[32], rq[32], sz[32];
        double rc = val(&e->cur, "kvpool_segment_transfer_bytes_total{direction=\"read\"}");
        double rp = val(&e->prev, "kvpool_segment_transfer_bytes_total{direction=\"read\"}");
        double wc = val(&e->cur, "kvpool_segment_transfer_bytes_total{direction=\"write\"}");
        double wp = val(&e->prev, "kvpool_segment_transfer_bytes_total{direction=\"write\"}");
        if (e->prev.up && secs > 0 && rc >= rp && rp >= 0)
            bytes_str(rd, sizeof rd, (rc - rp) / secs);
        else
            snprintf(rd, sizeof rd, "-");
        if (e->prev.up && secs > 0 && wc >= wp && wp >= 0)
            bytes_str(wr, sizeof wr, (wc - wp) / secs);
        else
            snprintf(wr, sizeof wr, "-");
        rate_str(rq, sizeof rq, e, sum_prefix(&e->cur, "kvpool_segment_requests_total{", NULL, NULL),
                 sum_prefix(&e->prev, "kvpool_segment_requests_total{", NULL, NULL), secs);
        printf("%-24s %-9s %11s %11s %9s %6.0f %10s\n", e->addr,
               val(&e->cur, "kvpool_segment_mounted") == 1 ? "mounted" : "waiting", rd, wr, rq,
               val(&e->cur, "kvpool_segment_connections"),
               bytes_str(sz, sizeof sz, val(&e->cur, "kvpool_segment_size_bytes")));
    }
    if (leader < 0) {
        printf("\nPOOL: no leader among the endpoints (scrape every master to see the pool)\n");
        return;
    }
    struct ep *L = &eps[leader];
    char u[32], cp[32], q[32];
    double used = val(&L->cur, "kvpool_pool_used_bytes"), cap = val(&L->cur, "kvpool_pool_capacity_bytes");
    printf("\nPOOL (leader %s): %.0f objects, used %s of %s (%.0f%%), quarantined %s, %.0f leases, "
           "%.0f under-replicated, %.0f left to drain\n",
           L->addr, val(&L->cur, "kvpool_objects"), bytes_str(u, sizeof u, used), bytes_str(cp, sizeof cp, cap),
           cap > 0 ? 100.0 * used / cap : 0.0, bytes_str(q, sizeof q, val(&L->cur, "kvpool_pool_quarantined_bytes")),
           val(&L->cur, "kvpool_master_leases"), val(&L->cur, "kvpool_repair_under_replicated_objects"),
           val(&L->cur, "kvpool_drain_objects"));
    printf("%-32s %12s %10s\n", "SEGMENT (pool view)", "USED", "OBJECTS");
    for (size_t i = 0; i < L->cur.n; i++) {
        const char *s = L->cur.s[i].series;
        const char *pfx = "kvpool_pool_segment_used_bytes{segment=\"";
        if (strncmp(s, pfx, strlen(pfx)) != 0)
            continue;
        char name[200];
        snprintf(name, sizeof name, "%s", s + strlen(pfx));
        char *qt = strrchr(name, '"');
        if (qt)
            *qt = '\0';
        char obj[300];
        snprintf(obj, sizeof obj, "kvpool_pool_segment_objects{segment=\"%s\"}", name);
        char ub[32];
        printf("%-32s %12s %10.0f\n", name, bytes_str(ub, sizeof ub, L->cur.s[i].v), val(&L->cur, obj));
    }
    printf("%-50s %10s\n", "KEYS/s (type, result)", "RATE");
    for (size_t i = 0; i < L->cur.n; i++) {
        const char *s = L->cur.s[i].series;
        if (strncmp(s, "kvpool_master_keys_total{", 25) != 0)
            continue;
        char r[32];
        rate_str(r, sizeof r, L, L->cur.s[i].v, val(&L->prev, s), secs);
        printf("%-50s %10s\n", s + 24, r);
    }
}

/* The "metrics" addresses of the members of a cluster.json (or of DIR/cluster.json), comma
 * separated into buf. Returns the count; -1 when the file cannot be read. */
static int endpoints_from_cluster(const char *path, char *buf, size_t cap)
{
    char file[4096];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(file, sizeof file, "%s/cluster.json", path);
    else
        snprintf(file, sizeof file, "%s", path);
    json_error_t e;
    json_t *j = json_load_file(file, 0, &e);
    if (!j) {
        fprintf(stderr, "kvpoolctl top: %s: %s\n", file, e.text);
        return -1;
    }
    int n = 0;
    buf[0] = '\0';
    const char *groups[] = {"masters", "segments"};
    for (int g = 0; g < 2; g++) {
        size_t i;
        json_t *m;
        json_array_foreach(json_object_get(j, groups[g]), i, m) {
            const char *a = json_string_value(json_object_get(m, "metrics"));
            if (!a || !*a)
                continue;
            size_t l = strlen(buf);
            snprintf(buf + l, cap - l, "%s%s", n ? "," : "", a);
            n++;
        }
    }
    json_decref(j);
    return n;
}

int ctl_cmd_top(struct ctl *c, int argc, char **argv)
{
    char from_cluster[4096];
    const char *list = NULL;
    unsigned interval = 1000;
    long count = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (strcmp(a, "--endpoints") == 0 && v) {
            list = v;
            i++;
        } else if (strcmp(a, "--interval") == 0 && v) {
            unsigned long t = strtoul(v, &end, 10);
            if (!end || *end || t < 100 || t > 3600000) {
                fprintf(stderr, "kvpoolctl top: --interval %s: milliseconds in [100, 3600000]\n", v);
                return 2;
            }
            interval = (unsigned)t;
            i++;
        } else if (strcmp(a, "--count") == 0 && v) {
            count = strtol(v, &end, 10);
            if (!end || *end || count < 1) {
                fprintf(stderr, "kvpoolctl top: --count %s: a number >= 1\n", v);
                return 2;
            }
            i++;
        } else {
            fprintf(stderr, "kvpoolctl top: unexpected '%s'\nusage: kvpoolctl top --endpoints HOST:PORT,... "
                            "[--interval MS] [--count N]\n", a);
            return 2;
        }
    }
    const char *cf = c->cluster_file ? c->cluster_file : getenv("KVPOOL_CLUSTER_FILE");
    if ((!list || !*list) && cf && *cf) {
        int k = endpoints_from_cluster(cf, from_cluster, sizeof from_cluster);
        if (k < 0)
            return 1;
        if (k == 0) {
            fprintf(stderr, "kvpoolctl top: %s names no metrics endpoint (start it with `cluster up --metrics`)\n",
                    cf);
            return 1;
        }
        list = from_cluster;
    }
    if (!list || !*list) {
        fprintf(stderr, "kvpoolctl top: give --endpoints HOST:PORT,... (the metrics_port of every master and "
                        "segment), or --cluster DIR of a `cluster up --metrics`\n");
        return 2;
    }
    struct ep *eps = calloc(TOP_MAX_EP, sizeof *eps);
    if (!eps)
        return 1;
    int n = 0;
    char *dup = strdup(list);
    for (char *save = NULL, *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        if (!*t)
            continue;
        if (n == TOP_MAX_EP || !strrchr(t, ':')) {
            fprintf(stderr, "kvpoolctl top: endpoint '%s': expected HOST:PORT (at most %d)\n", t, TOP_MAX_EP);
            free(dup);
            free(eps);
            return 2;
        }
        snprintf(eps[n++].addr, sizeof eps[0].addr, "%s", t);
    }
    free(dup);
    bool tty = isatty(1);
    struct timespec last = {0, 0};
    for (long round = 0; count < 0 || round < count; round++) {
        if (round > 0) {
            struct timespec ts = {.tv_sec = interval / 1000, .tv_nsec = (long)(interval % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
        }
        struct timespec nowts;
        clock_gettime(CLOCK_MONOTONIC, &nowts);
        double secs = round ? (double)(nowts.tv_sec - last.tv_sec) + (double)(nowts.tv_nsec - last.tv_nsec) / 1e9 : 0;
        last = nowts;
        for (int i = 0; i < n; i++) {
            scrape_free(&eps[i].prev);
            eps[i].prev = eps[i].cur;
            memset(&eps[i].cur, 0, sizeof eps[i].cur);
            char *text = http_get_metrics(eps[i].addr, c->timeout_ms < 3000 ? c->timeout_ms : 3000);
            if (text) {
                parse(&eps[i].cur, text);
                eps[i].cur.up = true;
                free(text);
            }
        }
        if (tty)
            fputs("\033[H\033[2J", stdout);
        else if (round > 0)
            fputs("\n", stdout);
        show(eps, n, secs, interval);
        fflush(stdout);
    }
    for (int i = 0; i < n; i++) {
        scrape_free(&eps[i].cur);
        scrape_free(&eps[i].prev);
    }
    free(eps);
    return 0;
}
