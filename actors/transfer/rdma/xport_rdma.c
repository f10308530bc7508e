/*
 * xport_rdma.c — the `rdma` transport behind the transport seam (actors/transfer/transport.h):
 * kvp_xport_rdma, a thin layer over the non-blocking core of rdma_xport.h.
 *
 *  - open: the verbs ops table is libibverbs' unless params.wrap_opts carries a
 *    struct kvp_xport_rdma_opts (tests: the verbs double, its virtual clock, an in-process
 *    handshake). No device (NULL or 0 devices: this machine) is KVP_ERR_UNSUPPORTED with one log
 *    line, and the engine uses TCP.
 *  - connect: one endpoint per segment endpoint, set up by the RdmaHello exchange
 *    (wire/rdma_hello.h) through opts->hello. Without a handshake channel, or when the segment
 *    refuses (no RDMA there, a handshake version it does not speak), connect answers
 *    KVP_ERR_UNSUPPORTED and the engine uses TCP for that peer (one WARN, xfer_engine.c); other
 *    handshake failures are KVP_ERR_TRANSFER for those slices, tried again at the next call.
 *    A fenced endpoint is replaced, with a new generation, on the next post.
 *  - post / poll / fence / abort / mem_register: kvp_rdma_submit / progress / fence / abort /
 *    register. xslice ids are the engine's, echoed in the completions.
 *  - write deadlines: RDMA WRITEs carry no deadline the segment could check (one-sided: the
 *    segment's CPU never sees them). The writer posts no WRITE past its write_deadline_ms
 *    (kvp_rdma_submit_until: refused at post, and a piece still waiting for room then is never
 *    posted: KVP_ERR_TIMEOUT); one posted before it is the segment-side fence's
 *    (kvp_rdma_seg_fence_writer, note §2.4 L2) and the master's quarantine.
 *  - a hello the segment read before a fence of this writer and ran after it is refused
 *    (KVP_ERR_BUSY, seg_server_rdma.c): a handshake failure like any other, so the slices fail
 *    (KVP_ERR_TRANSFER) and the next post connects again, as after a fence.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "actors/transfer/rdma/rdma_xport.h"
#include "actors/transfer/rdma/xport_rdma.h"
#include "actors/transfer/transfer.h"
#include "actors/transfer/transport.h"
#include "kvpool.h"
#include "runtime/log.h"
#include "wire/rdma_hello.h"

struct rdma_peer {
    struct rdma_peer *next;
    char *endpoint;
    struct kvp_rdma_ep *ep;
    uint64_t reconnects;
};

struct rdma_inst {
    struct kvp_rdma_xport *x;
    struct kvp_xport_rdma_opts opts;
    /* With params.token_respond and the TCP handshake channel: the channel's options with this
     * instance's token callback (its transfer actor's own wallet), so the hello answers the
     * segment's challenge from the wallet of the actor it runs on. */
    struct kvp_rdma_hello_tcp_opts hello_tcp;
    bool have_opts;
    char who[64];
    struct rdma_peer *peers;
    struct kvp_xport_completion *early; /* completions decided at post (bad range, wrong id) */
    size_t n_early, cap_early;
    uint64_t aborted;
    uint64_t client_id;
    uint64_t last_poll_ns;
};

static struct rdma_inst *inst(struct kvp_xport *t) { return (struct rdma_inst *)(void *)t; }

static int r_open(struct kvp_xport **out, const struct kvp_xport_params *p)
{
    if (!out || !p)
        return KVP_ERR_INVALID;
    *out = NULL;
    struct rdma_inst *in = calloc(1, sizeof *in);
    if (!in)
        return KVP_ERR_NOMEM;
    snprintf(in->who, sizeof in->who, "%s", p->name ? p->name : "rdma");
    struct kvp_rdma_cfg cfg = {.ops = kvp_verbs_ops_ibv(), .gid_index = -1,
                               .nodev_log_level = KVP_LOG_WARN};
    const struct kvp_rdma_env *env = NULL;
    if (p->wrap_opts) {
        in->opts = *(const struct kvp_xport_rdma_opts *)p->wrap_opts;
        in->have_opts = true;
        cfg = in->opts.cfg;
        env = in->opts.env.now_ns ? &in->opts.env : NULL;
    }
    if (p->token_respond && in->opts.hello == kvp_rdma_hello_tcp) {
        if (in->opts.hello_arg)
            in->hello_tcp = *(const struct kvp_rdma_hello_tcp_opts *)in->opts.hello_arg;
        in->hello_tcp.token_respond = p->token_respond;
        in->hello_tcp.token_ctx = p->token_ctx;
        in->opts.hello_arg = &in->hello_tcp;
    }
    cfg.who = in->who;
    if (!cfg.qps_per_peer && p->conns_per_peer)
        cfg.qps_per_peer = p->conns_per_peer > 16 ? 16 : p->conns_per_peer;
    if (!cfg.slice_bytes && p->slice_bytes)
        cfg.slice_bytes = p->slice_bytes > (1ull << 30) ? (1ull << 30) : p->slice_bytes;
    in->client_id = in->opts.client_id;
    uint64_t prefix = in->opts.writer_prefix & KVP_RDMA_WRITER_FAMILY_MASK;
    while (!in->client_id) {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, 0) != sizeof r)
            continue;
        in->client_id = prefix ? prefix | (r & ~KVP_RDMA_WRITER_FAMILY_MASK) : r;
        if (prefix && in->client_id == prefix)
            in->client_id = 0; /* the low half must not be 0: draw again */
    }
    int rc = kvp_rdma_open(&cfg, env, &in->x);
    if (rc != KVP_OK) {
        free(in);
        return rc;
    }
    if (in->opts.prereg_len &&
        (rc = kvp_rdma_register(in->x, in->opts.prereg_base, in->opts.prereg_len, NULL)) != KVP_OK) {
        kvp_rdma_close(&in->x);
        free(in);
        return rc;
    }
    *out = (struct kvp_xport *)(void *)in;
    return KVP_OK;
}

static int r_fds(struct kvp_xport *t, int *fds, size_t max)
{
    return (int)kvp_rdma_fds(inst(t)->x, fds, max);
}

/* Offer, exchange, complete. */
static int handshake(struct rdma_inst *in, struct rdma_peer *p)
{
    if (!in->opts.hello) {
        kvp_log_debug(in->who, "rdma: %s: no RDMA handshake channel to this segment",
                     p->endpoint);
        return KVP_ERR_UNSUPPORTED;
    }
    uint8_t *offer = NULL, *ans = NULL;
    size_t ol = 0, al = 0;
    struct kvp_rdma_ep *ep = NULL;
    int rc = kvp_rdma_ep_offer(in->x, 0, in->client_id, NULL, &ep, &offer, &ol);
    if (rc != KVP_OK)
        return rc;
    rc = in->opts.hello(in->opts.hello_arg, p->endpoint, offer, ol, &ans, &al);
    if (rc == KVP_ERR_BUSY)
        kvp_log_info(in->who, "rdma: %s: the segment read this handshake before a fence of this writer "
                     "and refused it; connecting again at the next post", p->endpoint);
    if (rc == KVP_OK)
        rc = kvp_rdma_ep_complete(ep, ans, al);
    free(offer);
    free(ans);
    if (rc != KVP_OK) {
        kvp_rdma_ep_free(&ep);
        return rc;
    }
    kvp_rdma_ep_free(&p->ep); /* the fenced one it replaces, if any */
    p->ep = ep;
    return KVP_OK;
}

static int r_connect(struct kvp_xport *t, const char *endpoint, const struct sockaddr_storage *addr,
                     unsigned addr_len, struct kvp_xport_peer **peer)
{
    (void)addr;
    (void)addr_len;
    struct rdma_inst *in = inst(t);
    if (!endpoint || !peer)
        return KVP_ERR_INVALID;
    struct rdma_peer *p = calloc(1, sizeof *p);
    if (!p || !(p->endpoint = strdup(endpoint))) {
        free(p);
        return KVP_ERR_NOMEM;
    }
    int rc = handshake(in, p);
    if (rc != KVP_OK) {
        free(p->endpoint);
        free(p);
        /* The segment said no (no RDMA there, or a handshake version it does not speak):
         * UNSUPPORTED, and the engine uses TCP for this peer. Anything else (no answer, a
         * closed connection, a token refused, a malformed answer, a wrong segment id) fails
         * these slices only; the next call tries the handshake again. */
        if (rc == KVP_ERR_UNSUPPORTED || rc == KVP_ERR_VERSION)
            return KVP_ERR_UNSUPPORTED;
        kvp_log_debug(in->who, "rdma: %s: handshake failed: %s", endpoint, kvp_errname(rc));
        return rc == KVP_ERR_NOMEM ? rc : KVP_ERR_TRANSFER;
    }
    p->next = in->peers;
    in->peers = p;
    *peer = (struct kvp_xport_peer *)(void *)p;
    return KVP_OK;
}

static int early(struct rdma_inst *in, uint64_t id, int status)
{
    if (in->n_early == in->cap_early) {
        size_t nc = in->cap_early ? in->cap_early * 2 : 64;
        struct kvp_xport_completion *np = realloc(in->early, nc * sizeof *np);
        if (!np)
            return KVP_ERR_NOMEM;
        in->early = np;
        in->cap_early = nc;
    }
    in->early[in->n_early++] = (struct kvp_xport_completion){.id = id, .status = status};
    return KVP_OK;
}

static int r_post(struct kvp_xport *t, struct kvp_xport_peer *peer, const struct kvp_xport_slice *s,
                  size_t n)
{
    struct rdma_inst *in = inst(t);
    struct rdma_peer *p = (struct rdma_peer *)(void *)peer;
    if (!p || (n && !s))
        return KVP_ERR_INVALID;
    for (size_t i = 0; i < n; i++)
        if (!s[i].local || !s[i].length || (s[i].op != KVP_XFER_READ && s[i].op != KVP_XFER_WRITE))
            return KVP_ERR_INVALID;
    if (!kvp_rdma_ep_live(p->ep)) {
        /* fenced earlier: a new endpoint, a new generation (the segment fences the old one) */
        p->reconnects++;
        if (handshake(in, p) != KVP_OK) {
            for (size_t i = 0; i < n; i++)
                if (early(in, s[i].id, KVP_ERR_TRANSFER) != KVP_OK)
                    return KVP_ERR_NOMEM;
            return KVP_OK;
        }
    }
    for (size_t i = 0; i < n; i++) {
        int rc;
        if (s[i].segment_id != kvp_rdma_ep_segment(p->ep))
            rc = KVP_ERR_NOT_FOUND; /* as the TCP server answers a restarted segment's id */
        else
            rc = kvp_rdma_submit_until(in->x, p->ep, s[i].id, s[i].op, s[i].local, s[i].length,
                                       s[i].remote_offset, s[i].write_deadline_ms);
        if (rc == KVP_ERR_NOMEM)
            return rc;
        if (rc != KVP_OK && early(in, s[i].id, rc) != KVP_OK)
            return KVP_ERR_NOMEM;
    }
    return KVP_OK;
}

static int r_poll(struct kvp_xport *t, uint64_t now_ns, struct kvp_xport_completion *out, size_t max,
                  uint64_t *next_ns)
{
    struct rdma_inst *in = inst(t);
    if (in->opts.drive_clock && in->opts.env.wait) {
        uint64_t d = in->last_poll_ns && now_ns > in->last_poll_ns ? now_ns - in->last_poll_ns : 0;
        in->last_poll_ns = now_ns;
        if (d)
            in->opts.env.wait(in->opts.env.arg, d > 5000000 ? 5000000 : d);
    }
    size_t n = 0;
    while (n < max && in->n_early) {
        out[n++] = in->early[0];
        memmove(in->early, in->early + 1, (in->n_early - 1) * sizeof *in->early);
        in->n_early--;
    }
    struct kvp_rdma_report rep[64];
    while (n < max) {
        size_t want = max - n < 64 ? max - n : 64;
        size_t got = kvp_rdma_progress(in->x, rep, want);
        for (size_t i = 0; i < got; i++)
            out[n++] = (struct kvp_xport_completion){.id = rep[i].id, .status = rep[i].status};
        if (got < want)
            break;
    }
    kvp_rdma_arm(in->x);
    if (next_ns)
        /* work in flight: poll again soon even without a channel event (flushes of some
         * providers only appear when polled); idle: the channel fd wakes the actor */
        *next_ns = kvp_rdma_inflight(in->x) ? now_ns + 50000 : UINT64_MAX;
    return (int)n;
}

static void r_fence(struct kvp_xport *t, const uint64_t *ids, size_t n, int status)
{
    struct rdma_inst *in = inst(t);
    for (size_t i = 0; i < in->n_early; i++)
        for (size_t k = 0; k < n; k++)
            if (in->early[i].id == ids[k])
                in->early[i].status = in->early[i].status ? in->early[i].status : status;
    kvp_rdma_fence(in->x, ids, n, status);
}

static void r_abort(struct kvp_xport *t, const uint64_t *ids, size_t n)
{
    struct rdma_inst *in = inst(t);
    kvp_rdma_abort(in->x, ids, n);
    in->aborted += n;
}

static int r_mem_register(struct kvp_xport *t, void *base, uint64_t len)
{
    int rc = kvp_rdma_register(inst(t)->x, base, len, NULL);
    return rc == KVP_ERR_INVALID || rc == KVP_ERR_NOMEM ? rc : (rc == KVP_OK ? KVP_OK : KVP_ERR_IO);
}

static int r_mem_unregister(struct kvp_xport *t, void *base, uint64_t len)
{
    return kvp_rdma_unregister(inst(t)->x, base, len);
}

static void r_stats(struct kvp_xport *t, struct kvp_xport_stats *out)
{
    if (out)
        out->aborted += inst(t)->aborted;
}

static void r_close(struct kvp_xport *t)
{
    struct rdma_inst *in = inst(t);
    if (!in)
        return;
    while (in->peers) {
        struct rdma_peer *p = in->peers;
        in->peers = p->next;
        kvp_rdma_ep_free(&p->ep);
        free(p->endpoint);
        free(p);
    }
    kvp_rdma_close(&in->x);
    free(in->early);
    free(in);
}

int kvp_xport_rdma_peer_status(struct kvp_xport *t, struct kvp_xport_peer *peer,
                               struct kvp_xport_rdma_peer_status *out)
{
    struct rdma_inst *in = inst(t);
    struct rdma_peer *p = (struct rdma_peer *)(void *)peer;
    if (!in || !p || !out)
        return KVP_ERR_INVALID;
    memset(out, 0, sizeof *out);
    snprintf(out->transport, sizeof out->transport, "rdma");
    snprintf(out->device, sizeof out->device, "%s", kvp_rdma_ep_nic(p->ep));
    out->generation = kvp_rdma_ep_generation(p->ep);
    out->live = kvp_rdma_ep_live(p->ep);
    out->reconnects = p->reconnects;
    return KVP_OK;
}

struct kvp_rdma_xport *kvp_xport_rdma_core(struct kvp_xport *t) { return t ? inst(t)->x : NULL; }

const struct kvp_xport_ops kvp_xport_rdma = {
    .name = "rdma",
    .open = r_open,
    .fds = r_fds,
    .connect = r_connect,
    .post = r_post,
    .poll = r_poll,
    .fence = r_fence,
    .abort = r_abort,
    .mem_register = r_mem_register,
    .mem_unregister = r_mem_unregister,
    .stats = r_stats,
    .close = r_close,
};
