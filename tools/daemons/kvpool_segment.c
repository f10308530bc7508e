/*
 * kvpool_segment.c — the `kvpool-segment` daemon: contributes one memory region to the pool.
 *
 *   kvpool-segment --master-server-address 127.0.0.1:7101,127.0.0.1:7102 \
 *                  --global-segment-size 4G --local-hostname 10.0.0.5 --port 7301 [--name seg-a]
 *   kvpool-segment --cluster-file DIR/cluster.json --global-segment-size 1G
 *
 * Settings: defaults < --config FILE (JSON) < KVPOOL_* environment < flags (config/config.h,
 * docs/config.md); --print-config prints the effective settings and exits.
 * Once mounted it prints one line on stdout:
 *   kvpool-segment: <name> id <id> endpoint <endpoint> size <bytes>
 * SIGINT: unmount and exit 0. SIGTERM: drain (DrainSegment, wait up to drain_timeout_ms for the
 * master to report no replica left here), then unmount and exit 0. docs/data-plane.md.
 * Either signal before the mount has been confirmed (no master answering yet) exits at once
 * with 130 (SIGINT) or 143 (SIGTERM), without mounting. With no master answering at start it
 * keeps trying the mount (backoff 1 s → 10 s, one WARN line per try) until one does.
 * metrics_port > 0: /metrics, /healthz, /readyz on local_hostname:metrics_port from before the
 * mount (readyz: 503 until mounted) until the end (docs/operations.md "Metrics").
 * Under systemd (Type=notify) it sends READY=1 once mounted and STOPPING=1 on SIGTERM/SIGINT
 * (packaging/systemd/).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "actors/session/msession.h"
#include "auth/auth.h"
#include "actors/segment/segment.h"
#ifdef KVP_HAVE_VERBS
#include "actors/transfer/rdma/rdma_xport.h"
#endif
#include "config/config.h"
#include "kvpool.h"
#include "metrics/metrics.h"
#include "runtime/actor.h"
#include "runtime/log.h"
#include "runtime/sdnotify.h"

static void usage(void)
{
    fprintf(stderr, "usage: kvpool-segment [--config FILE] [--key value ...] [--print-config] [--help]\n");
    char *h = kvp_cfg_help(KVP_CFG_SEGMENT);
    if (h) {
        fputs(h, stderr);
        free(h);
    }
}

/* The signal watcher of the start: a runtime actor watching a signalfd of SIGINT/SIGTERM (blocked
 * in every thread) while main waits in kvp_segment_start. A signal read while starting exits the
 * process at once; main's START_WATCH_DONE request makes it stop reading (unwatch), so a later
 * signal stays pending for main's sigwait. */
enum { START_WATCH_DONE = 1 };

static int start_watch_on_signal(struct kvp_rt_ctx *ctx, void *handle)
{
    struct signalfd_siginfo si;
    if (read(*(int *)handle, &si, sizeof si) != (ssize_t)sizeof si)
        return KVP_OK; /* EAGAIN: taken already */
    /* Still starting: the mount may be waiting for a master. Leave at once. */
    fprintf(stderr, "kvpool-segment: %s while starting: exiting without mounting\n",
            si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
    _exit(si.ssi_signo == SIGTERM ? 143 : 130);
}

static int start_watch_init(struct kvp_rt_ctx *ctx)
{
    return kvp_rt_watch_fd(ctx, *(int *)kvp_rt_state(ctx), start_watch_on_signal);
}

static int start_watch_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    if (msg->kind == KVP_RT_REQUEST && msg->type == START_WATCH_DONE) {
        kvp_rt_unwatch_fd(ctx, *(int *)kvp_rt_state(ctx));
        kvp_rt_reply(ctx, msg->corr_id, KVP_OK, 0, NULL, NULL);
    }
    return KVP_OK;
}

/*
 * The metrics endpoint's view of the segment. `seg` is stored (release) once the start has
 * returned and read (acquire) by the HTTP thread; the HTTP server is stopped before the segment
 * is, so the pointer never dangles. An atomic rather than a message: the reader is
 * libmicrohttpd's thread (no mailbox) and the segment's counters are themselves published
 * with relaxed atomics by their single writers (kvp_segment_stats).
 */
struct seg_http {
    _Atomic(struct kvp_segment *) seg;
    uint64_t size_bytes;
};

static void seg_render(void *ctx, struct kvp_metrics_text *t)
{
    struct seg_http *h = ctx;
    struct kvp_segment *seg = atomic_load_explicit(&h->seg, memory_order_acquire);
    struct kvp_segment_stats st;
    kvp_segment_stats(seg, &st); /* all zero before the start returned */
    kvp_metrics_family(t, "kvpool_segment_mounted", "gauge", "1 when the segment is mounted at the master.");
    kvp_metrics_sample_u64(t, "kvpool_segment_mounted", NULL, st.segment_id != 0);
    if (seg) {
        char id[16];
        snprintf(id, sizeof id, "%u", st.segment_id);
        const char *l[] = {"name", kvp_segment_name(seg), "endpoint", kvp_segment_endpoint(seg), "segment_id", id, NULL};
        kvp_metrics_family(t, "kvpool_segment_info", "gauge", "Always 1; the labels name the segment.");
        kvp_metrics_sample_u64(t, "kvpool_segment_info", l, 1);
    }
    kvp_metrics_family(t, "kvpool_segment_size_bytes", "gauge", "Bytes of memory this segment contributes.");
    kvp_metrics_sample_u64(t, "kvpool_segment_size_bytes", NULL, h->size_bytes);
    kvp_metrics_family(t, "kvpool_segment_mounts_total", "counter",
                       "Successful mounts (1 + remounts after the master declared the segment lost).");
    kvp_metrics_sample_u64(t, "kvpool_segment_mounts_total", NULL, st.mounts);
    kvp_metrics_family(t, "kvpool_segment_mount_failures_total", "counter",
                       "Mount tries that failed (no master answering, or refused).");
    kvp_metrics_sample_u64(t, "kvpool_segment_mount_failures_total", NULL, st.mount_failures);
    kvp_metrics_family(t, "kvpool_segment_transfer_bytes_total", "counter",
                       "Payload bytes served by the data plane: read = sent to readers, write = landed in the region.");
    const char *rd[] = {"direction", "read", NULL}, *wr[] = {"direction", "write", NULL};
    kvp_metrics_sample_u64(t, "kvpool_segment_transfer_bytes_total", rd, st.server.bytes_read);
    kvp_metrics_sample_u64(t, "kvpool_segment_transfer_bytes_total", wr, st.server.bytes_written);
    kvp_metrics_family(t, "kvpool_segment_requests_total", "counter", "Data-plane requests by operation and result.");
    for (int o = 0; o < KVP_SEG_OPS; o++)
        for (int r = 0; r < KVP_SEG_RESULTS; r++) {
            const char *l[] = {"op", kvp_seg_op_names[o], "result", kvp_seg_result_names[r], NULL};
            kvp_metrics_sample_u64(t, "kvpool_segment_requests_total", l, st.server.requests[o][r]);
        }
    kvp_metrics_family(t, "kvpool_segment_bad_frames_total", "counter",
                       "Malformed data-plane frame headers (each closed its connection).");
    kvp_metrics_sample_u64(t, "kvpool_segment_bad_frames_total", NULL, st.server.bad_frames);
    kvp_metrics_family(t, "kvpool_segment_connections", "gauge", "Data-plane connections being served.");
    kvp_metrics_sample_u64(t, "kvpool_segment_connections", NULL, st.server.conns_open);
    kvp_metrics_family(t, "kvpool_segment_connections_accepted_total", "counter", "Data-plane connections accepted.");
    kvp_metrics_sample_u64(t, "kvpool_segment_connections_accepted_total", NULL, st.server.conns_accepted);
    kvp_metrics_family(t, "kvpool_segment_connections_refused_total", "counter",
                       "Data-plane connections refused (over the connection limit).");
    kvp_metrics_sample_u64(t, "kvpool_segment_connections_refused_total", NULL, st.server.conns_refused);
    kvp_metrics_family(t, "kvpool_segment_token_refused_total", "counter",
                       "Data-plane connections refused by the token check (docs/security.md).");
    kvp_metrics_sample_u64(t, "kvpool_segment_token_refused_total", NULL, st.server.token_refused);
}

static bool seg_ready(void *ctx, char *why, size_t cap)
{
    struct seg_http *h = ctx;
    struct kvp_segment *seg = atomic_load_explicit(&h->seg, memory_order_acquire);
    if (!seg) {
        snprintf(why, cap, "not mounted yet (waiting for a master to answer the mount)");
        return false;
    }
    if (kvp_segment_id(seg) == 0) {
        snprintf(why, cap, "not mounted (a remount failed; the heartbeat retries it)");
        return false;
    }
    return true;
}

/* protocol=rdma (issue 20): one log line on what RDMA can do here. With no device (NULL or 0
 * devices) the probe's "no RDMA device (...); using TCP". With devices, the region would be
 * registered in chunks and answer RdmaHello offers (kvp_rdma_seg_register / kvp_rdma_seg_accept
 * in actors/transfer/rdma/rdma_xport.h), but the data-plane server does not carry the handshake
 * yet, so TCP serves every client: said in one line. */
static void segment_rdma_probe(const struct kvp_cfg_segment *cfg)
{
#ifdef KVP_HAVE_VERBS
    struct kvp_rdma_cfg rc = {.ops = kvp_verbs_ops_ibv(), .who = "kvpool-segment",
                              .devices = cfg->device_name, .gid_index = kvp_cfg_gid_index(cfg->gid_index),
                              .segment = true, .nodev_log_level = KVP_LOG_WARN};
    struct kvp_rdma_xport *x = NULL;
    if (kvp_rdma_open(&rc, NULL, &x) == KVP_OK) {
        kvp_log_warn("kvpool-segment", "protocol=rdma: RDMA devices found, but the data-plane server "
                                       "does not carry the RDMA handshake yet; serving tcp only");
        kvp_rdma_close(&x);
    }
#else
    (void)cfg;
    kvp_log_warn("kvpool-segment", "protocol=rdma: this build has no RDMA (libibverbs not found); "
                                   "serving tcp");
#endif
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage();
            return 0;
        }
    /* Signals are taken synchronously by main (sigwait): block them before any thread starts,
     * so every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct kvp_cfg_segment cfg;
    int done = kvp_cfg_daemon_args(KVP_CFG_SEGMENT, &cfg, "kvpool-segment", argc, argv);
    if (done >= 0)
        return done;
    int lvl = kvp_log_parse_level(cfg.log_level);
    if (lvl >= 0)
        kvp_log_set_level(lvl);
    int fmt = kvp_log_parse_format(cfg.log_format);
    if (fmt >= 0)
        kvp_log_set_format(fmt); /* lines logged before this follow KVPOOL_LOG_FORMAT */

    char *masters[KVP_CFG_MAX_MASTERS];
    size_t n_masters = 0;
    int rc = kvp_cfg_masters(cfg.master_server_address, cfg.cluster_file, masters, KVP_CFG_MAX_MASTERS,
                             &n_masters);
    if (rc != KVP_OK) {
        fprintf(stderr, "kvpool-segment: no masters: set master_server_address or cluster_file (%s)\n",
                kvp_strerror(rc));
        return 2;
    }
    if (strcmp(cfg.protocol, "rdma") == 0)
        segment_rdma_probe(&cfg);
    /* Before the mount: /healthz answers and /readyz says why not yet while no master does. */
    struct seg_http sh = {.size_bytes = cfg.global_segment_size};
    atomic_init(&sh.seg, NULL);
    struct kvp_metrics_http *http = NULL;
    if (cfg.metrics_port) {
        struct kvp_metrics_http_ops ops = {.ctx = &sh, .render = seg_render, .ready = seg_ready};
        rc = kvp_metrics_http_start(&http, "kvpool-segment", cfg.local_hostname, cfg.metrics_port, cfg.bind_retry_ms,
                                    &ops);
        if (rc != KVP_OK) {
            fprintf(stderr, "kvpool-segment: cannot serve metrics on port %u: %s (see the line above)\n",
                    cfg.metrics_port, kvp_strerror(rc));
            return rc == KVP_ERR_INVALID ? 2 : 1;
        }
    }
    struct kvp_msession *ms = NULL;
    struct kvp_auth_client *auth = NULL; /* CURVE keys (docs/security.md) */
    rc = kvp_auth_client_load(&auth, cfg.auth, cfg.auth_key, cfg.auth_master_keys, cfg.cluster_file, "segment_key",
                              "kvpool-segment");
    struct kvp_segment_hooks hooks = {.mount_retry = true};
    /* auth on and the masters' certificates carry token keys: the data port requires tokens */
    hooks.n_token_keys = kvp_auth_client_token_keys(auth, hooks.token_keys, 16);
    if (rc == KVP_OK)
        rc = kvp_msession_new_auth(&ms, (const char *const *)masters, n_masters,
                                   cfg.name[0] ? cfg.name : "kvpool-segment", &auth);
    kvp_auth_client_destroy(&auth);
    kvp_cfg_free_masters(masters, n_masters);
    if (rc != KVP_OK) {
        fprintf(stderr, "kvpool-segment: master session: %s\n", kvp_strerror(rc));
        kvp_metrics_http_stop(&http);
        return 1;
    }
    /* The start (map, serve, mount) can wait up to the mount's timeout for a master; a signal
     * then must not wait for it. A watcher actor reads SIGINT/SIGTERM from a signalfd meanwhile:
     * before the start has returned it exits the process at once (nothing to undo: the master
     * has not confirmed the segment; were the mount to commit at that moment, the silent segment
     * is declared lost after client_ttl_ms, holding no object); after, it stops reading, and
     * main takes the signal with sigwait as below. */
    int sfd = signalfd(-1, &sigs, SFD_NONBLOCK | SFD_CLOEXEC);
    struct kvp_rt_actor *watch = NULL;
    struct kvp_rt_spec wspec = {.name = "signals", .init = start_watch_init, .handle = start_watch_handle,
                                .state = &sfd};
    if (sfd < 0 || kvp_rt_spawn(&watch, &wspec, NULL) != KVP_OK)
        kvp_log_warn("kvpool-segment", "no signal watcher during the start: a signal waits until it is done");
    struct kvp_segment *seg = NULL;
    rc = kvp_segment_start(&seg, &cfg, ms, &hooks);
    if (watch) {
        struct kvp_rt_msg *reply = NULL;
        if (kvp_rt_call(watch, 0, START_WATCH_DONE, 0, NULL, NULL, 0, &reply) == KVP_OK)
            kvp_rt_msg_destroy(&reply);
        kvp_rt_destroy(&watch);
    }
    if (sfd >= 0)
        close(sfd);
    if (rc != KVP_OK) {
        fprintf(stderr, "kvpool-segment: cannot start: %s\n", kvp_strerror(rc));
        kvp_metrics_http_stop(&http);
        kvp_msession_destroy(&ms);
        return 1;
    }
    atomic_store_explicit(&sh.seg, seg, memory_order_release);
    printf("kvpool-segment: %s id %u endpoint %s size %llu\n", kvp_segment_name(seg), kvp_segment_id(seg),
           kvp_segment_endpoint(seg), (unsigned long long)cfg.global_segment_size);
    fflush(stdout);
    /* Mounted: tell a service manager (systemd Type=notify) the start is done. */
    char status[400];
    snprintf(status, sizeof status, "READY=1\nSTATUS=mounted as %s (segment %u, endpoint %s)", kvp_segment_name(seg),
             kvp_segment_id(seg), kvp_segment_endpoint(seg));
    kvp_sd_notify("kvpool-segment", status);

    int sig = 0;
    while (!sig && sigwait(&sigs, &sig) != 0)
        ;
    kvp_sd_notify("kvpool-segment", sig == SIGTERM ? "STOPPING=1\nSTATUS=draining" : "STOPPING=1\nSTATUS=unmounting");
    if (sig == SIGTERM) {
        kvp_log_info("kvpool-segment", "SIGTERM: draining (up to %u ms)", cfg.drain_timeout_ms);
        rc = kvp_segment_drain(seg, cfg.drain_timeout_ms);
        if (rc != KVP_OK)
            kvp_log_warn("kvpool-segment", "drain: %s; unmounting anyway", kvp_errname(rc));
    } else {
        kvp_log_info("kvpool-segment", "SIGINT: unmounting");
    }
    kvp_metrics_http_stop(&http); /* before the segment it reads goes */
    kvp_segment_stop(&seg);
    kvp_msession_destroy(&ms);
    return 0;
}
