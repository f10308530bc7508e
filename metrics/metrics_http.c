/*
 * metrics_http.c — the /metrics, /healthz, /readyz endpoint on libmicrohttpd (metrics.h).
 *
 * Two ways to run it:
 *  - hosted (kvp_metrics_http_start_hosted): no thread. libmicrohttpd keeps its sockets in an
 *    epoll set (MHD_USE_EPOLL) whose fd the owner actor watches; the owner calls
 *    kvp_metrics_http_run from its own loop, so on_request and the owner's callbacks run on the
 *    owner's thread and read its state with no lock. Every socket is non-blocking (libmicrohttpd
 *    sets O_NONBLOCK on the listen socket it is given and accepts with SOCK_NONBLOCK: seen with
 *    strace) and a run does a bounded amount of work (see kvp_metrics_http_run), so a slow
 *    scraper costs the owner one short call per readiness, never a wait. The master service
 *    serves its endpoint this way.
 *  - threaded (kvp_metrics_http_start): libmicrohttpd's own thread (MHD_USE_INTERNAL_POLLING_
 *    THREAD) polls and calls on_request. That thread is a library's, with no mailbox, so what it
 *    serves must be relaxed atomics of single writers (the client's counters, updated on its
 *    callers' threads, which no actor owns).
 * The fields below are written before MHD_start_daemon and only read afterwards, except the log
 * rate limit, which only the thread serving requests touches.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "kvpool.h"
#include "metrics/metrics.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "runtime/proc.h"

#define PROM_CT "text/plain; version=0.0.4; charset=utf-8"
#define TEXT_CT "text/plain; charset=utf-8"

struct kvp_metrics_http {
    char actor[64];
    struct kvp_metrics_http_ops ops;
    struct MHD_Daemon *d;
    int lfd;
    uint32_t port;
    double start_time_s;   /* wall clock at start, for kvpool_process_start_time_seconds */
    /* Bad-request log rate limit (the serving thread only). */
    uint64_t bad_window_ms;
    unsigned bad_in_window;
};

static void log_bad(struct kvp_metrics_http *h, struct MHD_Connection *c, int status, const char *method,
                    const char *url)
{
    uint64_t now = kvp_clock_now_ms();
    if (now - h->bad_window_ms >= 1000) {
        if (h->bad_in_window > 10)
            kvp_log_warn(h->actor, "%u more bad HTTP requests in the last second (log lines suppressed)",
                         h->bad_in_window - 10);
        h->bad_window_ms = now;
        h->bad_in_window = 0;
    }
    if (++h->bad_in_window > 10)
        return;
    char peer[96] = "?";
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr) {
        const struct sockaddr *sa = ci->client_addr;
        getnameinfo(sa, sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in),
                    peer, sizeof peer, NULL, 0, NI_NUMERICHOST);
    }
    kvp_log_warn(h->actor, "HTTP %s %.200s from %s: answered %d", method, url, peer, status);
}

/* Queue a response of `len` bytes of `body` (copied by libmicrohttpd). */
static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *ct, const char *body,
                             size_t len, const char *location)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ct);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (location)
        MHD_add_response_header(r, MHD_HTTP_HEADER_LOCATION, location);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result reply_str(struct MHD_Connection *c, unsigned status, const char *body)
{
    return reply(c, status, TEXT_CT, body, strlen(body), NULL);
}

static enum MHD_Result serve_metrics(struct kvp_metrics_http *h, struct MHD_Connection *c)
{
    struct kvp_metrics_text t = {0};
    h->ops.render(h->ops.ctx, &t);
    kvp_metrics_family(&t, "kvpool_process_start_time_seconds", "gauge",
                       "Start time of the process since the Unix epoch in seconds.");
    kvp_metrics_sample_double(&t, "kvpool_process_start_time_seconds", NULL, h->start_time_s);
    kvp_metrics_family(&t, "kvpool_build_info", "gauge", "Always 1; the labels name the build.");
    const char *bl[] = {"version", KVP_METRICS_VERSION, NULL};
    kvp_metrics_sample_u64(&t, "kvpool_build_info", bl, 1);
    if (t.failed) {
        kvp_metrics_text_fini(&t);
        return reply_str(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    }
    enum MHD_Result rc = reply(c, MHD_HTTP_OK, PROM_CT, t.buf ? t.buf : "", t.len, NULL);
    kvp_metrics_text_fini(&t);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    struct kvp_metrics_http *h = cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
        log_bad(h, c, MHD_HTTP_METHOD_NOT_ALLOWED, method, url);
        char msg[160];
        snprintf(msg, sizeof msg, "method %.40s not allowed: only GET and HEAD\n", method);
        return reply_str(c, MHD_HTTP_METHOD_NOT_ALLOWED, msg);
    }
    if (strcmp(url, "/metrics") == 0)
        return serve_metrics(h, c);
    if (strcmp(url, "/healthz") == 0)
        return reply_str(c, MHD_HTTP_OK, "ok\n");
    if (strcmp(url, "/readyz") == 0) {
        char why[200] = "";
        if (!h->ops.ready || h->ops.ready(h->ops.ctx, why, sizeof why))
            return reply_str(c, MHD_HTTP_OK, "ready\n");
        char msg[240];
        snprintf(msg, sizeof msg, "not ready: %s\n", why[0] ? why : "unknown");
        return reply_str(c, MHD_HTTP_SERVICE_UNAVAILABLE, msg);
    }
    if (h->ops.route) {
        char *body = NULL;
        const char *ct = TEXT_CT;
        int st = h->ops.route(h->ops.ctx, url, &body, &ct);
        if (st > 0) {
            enum MHD_Result rc;
            if (st >= 300 && st < 400)
                rc = reply(c, (unsigned)st, TEXT_CT, "", 0, body ? body : "/");
            else
                rc = reply(c, (unsigned)st, ct ? ct : TEXT_CT, body ? body : "", body ? strlen(body) : 0, NULL);
            free(body);
            return rc;
        }
        free(body);
    }
    log_bad(h, c, MHD_HTTP_NOT_FOUND, method, url);
    char msg[300];
    snprintf(msg, sizeof msg, "no such path %.120s: try /metrics, /healthz, /readyz%s\n", url,
             h->ops.route ? " or /get_all_segments" : "");
    return reply_str(c, MHD_HTTP_NOT_FOUND, msg);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    struct kvp_metrics_http *h = cls;
    char buf[300];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = '\0';
    kvp_log_warn(h->actor, "libmicrohttpd: %s", buf);
}

struct bind_try {
    const char *host;
    uint32_t port;
    int fd;
};

static int bind_attempt(void *arg, char *why, size_t why_cap)
{
    struct bind_try *b = arg;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    char ps[16];
    snprintf(ps, sizeof ps, "%u", b->port);
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(b->host && b->host[0] ? b->host : NULL, ps, &hints, &ai);
    if (g != 0) {
        snprintf(why, why_cap, "cannot resolve '%s': %s", b->host ? b->host : "", gai_strerror(g));
        return KVP_ERR_INVALID;
    }
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    int rc = KVP_OK;
    if (fd < 0) {
        snprintf(why, why_cap, "socket: %s", strerror(errno));
        rc = KVP_ERR_IO;
    } else {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
            int e = errno;
            snprintf(why, why_cap, "%s", strerror(e));
            rc = e == EADDRINUSE ? KVP_ERR_BUSY : KVP_ERR_IO;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    b->fd = fd;
    return rc;
}

static int start(struct kvp_metrics_http **out, const char *actor, const char *host, uint32_t port,
                 uint32_t bind_retry_ms, const struct kvp_metrics_http_ops *ops, bool hosted)
{
    const char *a = actor ? actor : "metrics";
    if (!out || !ops || !ops->render || port == 0 || port > 65535) {
        kvp_log_error(a, "metrics endpoint: port %u: must be in [1, 65535] (0 turns it off)", port);
        return KVP_ERR_INVALID;
    }
    struct kvp_metrics_http *h = calloc(1, sizeof *h);
    if (!h)
        return KVP_ERR_NOMEM;
    snprintf(h->actor, sizeof h->actor, "%s", a);
    h->ops = *ops;
    h->port = port;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    h->start_time_s = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    char what[320];
    snprintf(what, sizeof what, "metrics endpoint on %s port %u", host && host[0] ? host : "*", port);
    struct bind_try b = {.host = host, .port = port, .fd = -1};
    int rc = kvp_retry_start(h->actor, what, bind_retry_ms, bind_attempt, &b);
    if (rc != KVP_OK) {
        free(h);
        return rc == KVP_ERR_INVALID ? KVP_ERR_INVALID : KVP_ERR_IO;
    }
    h->lfd = b.fd;
    unsigned flags = hosted ? MHD_USE_EPOLL | MHD_USE_ERROR_LOG
                            : MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    h->d = MHD_start_daemon(flags, 0, NULL, NULL,
                            on_request, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h, /* first: see its doc */
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)h->lfd, MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    if (!h->d) {
        kvp_log_error(h->actor, "%s: libmicrohttpd did not start (see the line above)", what);
        /* The socket is left open rather than closed twice: libmicrohttpd's failure path may
         * already have closed it, and the fd number could then be another thread's. */
        free(h);
        return KVP_ERR_IO;
    }
    kvp_log_info(h->actor, "serving /metrics /healthz /readyz%s on http://%s%s%s:%u", ops->route ? " (and more)" : "",
                 host && strchr(host, ':') ? "[" : "", host && host[0] ? host : "0.0.0.0",
                 host && strchr(host, ':') ? "]" : "", port);
    *out = h;
    return KVP_OK;
}

int kvp_metrics_http_start(struct kvp_metrics_http **out, const char *actor, const char *host, uint32_t port,
                           uint32_t bind_retry_ms, const struct kvp_metrics_http_ops *ops)
{
    return start(out, actor, host, port, bind_retry_ms, ops, false);
}

int kvp_metrics_http_start_hosted(struct kvp_metrics_http **out, const char *actor, const char *host,
                                  uint32_t port, uint32_t bind_retry_ms, const struct kvp_metrics_http_ops *ops)
{
    int rc = start(out, actor, host, port, bind_retry_ms, ops, true);
    if (rc != KVP_OK)
        return rc;
    if (kvp_metrics_http_fd(*out) < 0) {
        kvp_log_error((*out)->actor, "metrics endpoint: libmicrohttpd gave no epoll fd");
        kvp_metrics_http_stop(out);
        return KVP_ERR_IO;
    }
    return KVP_OK;
}

int kvp_metrics_http_fd(const struct kvp_metrics_http *h)
{
    if (!h || !h->d)
        return -1;
    const union MHD_DaemonInfo *i = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_EPOLL_FD);
    return i ? i->epoll_fd : -1;
}

void kvp_metrics_http_run(struct kvp_metrics_http *h)
{
    if (!h || !h->d)
        return;
    /* MHD_run never blocks here (its epoll_wait has timeout 0). A timeout of 0 after it means a
     * connection is still ready to make progress (libmicrohttpd's edge-triggered ready list),
     * which the watched fd would not announce again: run again, at most 8 times a call; what is
     * left then waits for the owner's next call (its timer). */
    for (int round = 0; round < 8; round++) {
        if (MHD_run(h->d) != MHD_YES)
            return;
        MHD_UNSIGNED_LONG_LONG t = 1;
        if (MHD_get_timeout(h->d, &t) != MHD_YES || t != 0)
            return;
    }
}

uint32_t kvp_metrics_http_port(const struct kvp_metrics_http *h) { return h ? h->port : 0; }

void kvp_metrics_http_stop(struct kvp_metrics_http **hp)
{
    if (!hp || !*hp)
        return;
    struct kvp_metrics_http *h = *hp;
    *hp = NULL;
    MHD_stop_daemon(h->d); /* joins the HTTP thread (threaded) and closes the listen socket it was given */
    free(h);
}
