/* rdma_xport.c — the rdma transport's devices, endpoints, handshake and segment side; see
 * rdma_xport.h. Batches are in rdma_run.c, memory in rdma_mr.c. */
#include "actors/transfer/rdma/rdma_xport_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "kvpool.h"
#include "runtime/log.h"

#define MS_NS 1000000ull

/* ------------------------------------------------------------------ time, PSNs */

uint64_t kvp_rdma_now(struct kvp_rdma_xport *x)
{
    if (x->env.now_ns)
        return x->env.now_ns(x->env.arg);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Take the CQ events waiting on NIC c's channel and ack them (man 3 ibv_get_cq_event: every
 * event taken is acked before its CQ is destroyed). */
static void nic_events_ack(struct kvp_rdma_xport *x, struct kvp_rdma_nicst *c)
{
    struct ibv_cq *cq;
    void *cctx;
    unsigned got = 0;
    while (c->ch && x->ops->get_cq_event(c->ch, &cq, &cctx) == 0)
        got++;
    if (got)
        x->ops->ack_cq_events(c->cq.cq, got);
}

/* Production wait: arm every NIC's CQ, poll again is the caller's loop; block on the channel
 * fds for at most max_ns (1 ms cap: the caller re-checks its deadline), then consume and ack
 * the events (man 3 ibv_get_cq_event: events may be spurious; the caller polls the CQ next). */
static void channel_wait(struct kvp_rdma_xport *x, uint64_t max_ns)
{
    struct pollfd pf[KVP_RDMA_MAX_NICS];
    size_t n = 0;
    for (size_t i = 0; i < x->n_nics; i++) {
        struct kvp_rdma_nicst *c = &x->nic[i];
        if (!c->ch || c->cq.failed)
            continue;
        x->ops->req_notify_cq(c->cq.cq, 0);
        pf[n].fd = c->ch->fd;
        pf[n].events = POLLIN;
        pf[n].revents = 0;
        n++;
    }
    int ms = (int)(max_ns / MS_NS);
    if (ms > 1)
        ms = 1;
    if (n == 0 || poll(pf, n, ms) <= 0)
        return;
    for (size_t i = 0; i < x->n_nics; i++)
        nic_events_ack(x, &x->nic[i]);
}

void kvp_rdma_wait(struct kvp_rdma_xport *x, uint64_t max_ns)
{
    if (x->env.wait)
        x->env.wait(x->env.arg, max_ns);
    else
        channel_wait(x, max_ns);
}

uint32_t kvp_rdma_psn(struct kvp_rdma_xport *x)
{
    uint32_t v = 0;
    if (x->cfg.psn_seed) {
        /* splitmix64: tests get the same PSNs for the same seed */
        uint64_t z = (x->psn_state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        v = (uint32_t)(z ^ (z >> 31));
    } else if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
        v = (uint32_t)kvp_rdma_now(x) * 2654435761u;
    }
    return v & 0xffffffu;
}

/* ------------------------------------------------------------------ fencing a QP set */

int kvp_rdma_fence_qps(struct kvp_rdma_xport *x, struct kvp_rdma_qp **qps, size_t n,
                       struct ibv_mr **mrs, size_t n_mrs)
{
    struct kvp_rdma_fence f;
    uint64_t bound = (uint64_t)x->cfg.fence_bound_ms * MS_NS;
    int rc = kvp_rdma_fence_begin(&f, &x->reaper, qps, n, mrs, n_mrs, kvp_rdma_now(x), bound);
    if (rc != KVP_OK)
        return rc;
    while (!kvp_rdma_fence_step(&f, kvp_rdma_now(x)))
        kvp_rdma_wait(x, MS_NS / 10);
    return f.result;
}

/* ------------------------------------------------------------------ devices */

static void nic_close(struct kvp_rdma_xport *x, struct kvp_rdma_nicst *c)
{
    if (c->cq.cq)
        x->ops->destroy_cq(c->cq.cq);
    if (c->ch)
        x->ops->destroy_comp_channel(c->ch);
    if (c->pd)
        x->ops->dealloc_pd(c->pd);
    if (c->ctx)
        x->ops->close_device(c->ctx);
    memset(c, 0, sizeof *c);
}

/* Open one device: its first ACTIVE port, GID, PD, channel and CQ. KVP_ERR_UNSUPPORTED when
 * no port is active or no suitable GID exists (the NIC is skipped). */
static int nic_open(struct kvp_rdma_xport *x, struct ibv_device *dev, struct kvp_rdma_nicst *c)
{
    const struct kvp_verbs_ops *o = x->ops;
    const char *name = o->get_device_name(dev);
    snprintf(c->topo.name, sizeof c->topo.name, "%s", name ? name : "?");
    c->ctx = o->open_device(dev);
    if (!c->ctx) {
        kvp_log_warn(x->who, "rdma: %s: open failed: %s; skipped", c->topo.name, strerror(errno));
        return KVP_ERR_UNSUPPORTED;
    }
    if (o->query_device(c->ctx, &c->dattr) != 0) {
        kvp_log_warn(x->who, "rdma: %s: query_device failed; skipped", c->topo.name);
        return KVP_ERR_UNSUPPORTED;
    }
    struct ibv_port_attr pa;
    for (uint8_t p = 1; p <= c->dattr.phys_port_cnt && !c->port; p++)
        if (o->query_port(c->ctx, p, &pa) == 0 && pa.state == IBV_PORT_ACTIVE) {
            c->port = p;
            c->active_mtu = (uint8_t)pa.active_mtu;
            c->lid = pa.lid;
        }
    if (!c->port) {
        kvp_log_warn(x->who, "rdma: %s: no ACTIVE port; skipped", c->topo.name);
        return KVP_ERR_UNSUPPORTED;
    }
    c->topo.active = true;
    if (kvp_rdma_gid_select(o, c->ctx, c->port, x->cfg.gid_index, &c->gid_index, &c->gid) != KVP_OK)
        return KVP_ERR_UNSUPPORTED; /* logged: "no suitable GID" */
    uint64_t page = 4096;
    if (kvp_rdma_chunk_bytes(c->dattr.max_mr_size, page, &c->chunk_bytes) != KVP_OK)
        return KVP_ERR_UNSUPPORTED;
    int rd = c->dattr.max_qp_rd_atom < c->dattr.max_qp_init_rd_atom ? c->dattr.max_qp_rd_atom
                                                                    : c->dattr.max_qp_init_rd_atom;
    c->max_rd_atomic = (uint8_t)(rd < 1 ? 1 : rd > 16 ? 16 : rd);
    c->pd = o->alloc_pd(c->ctx);
    c->ch = o->create_comp_channel(c->ctx);
    if (!c->pd || !c->ch) {
        kvp_log_error(x->who, "rdma: %s: alloc_pd/create_comp_channel failed: %s", c->topo.name,
                      strerror(errno));
        return KVP_ERR_IO;
    }
    if (!x->env.wait) {
        int fl = fcntl(c->ch->fd, F_GETFL);
        if (fl >= 0)
            (void)fcntl(c->ch->fd, F_SETFL, fl | O_NONBLOCK);
    }
    int cqe = (int)x->cfg.cq_size;
    if (cqe > c->dattr.max_cqe)
        cqe = c->dattr.max_cqe;
    c->cq.cq = o->create_cq(c->ctx, cqe, c, c->ch, 0);
    if (!c->cq.cq) {
        kvp_log_error(x->who, "rdma: %s: create_cq(%d) failed: %s", c->topo.name, cqe, strerror(errno));
        return KVP_ERR_IO;
    }
    /* credits: never more outstanding than the CQ really holds */
    c->cq.size = (uint32_t)c->cq.cq->cqe;
    return KVP_OK;
}

static void cfg_defaults(struct kvp_rdma_cfg *c)
{
    if (!c->who)
        c->who = "rdma";
    if (!c->sysfs_root)
        c->sysfs_root = "/sys";
    if (!c->qps_per_peer)
        c->qps_per_peer = 2;
    if (!c->slice_bytes)
        c->slice_bytes = 256 * 1024;
    if (!c->fence_bound_ms)
        c->fence_bound_ms = 1000;
    if (!c->cq_size)
        c->cq_size = 4096;
    if (!c->max_send_wr)
        c->max_send_wr = 256;
    if (!c->bounce_slots)
        c->bounce_slots = 16;
}

int kvp_rdma_open(const struct kvp_rdma_cfg *cfg, const struct kvp_rdma_env *env,
                  struct kvp_rdma_xport **out)
{
    if (!cfg || !cfg->ops || !out || cfg->qps_per_peer > KVP_RDMA_HELLO_MAX_QPS ||
        cfg->slice_bytes > (1ull << 30) || cfg->gid_index < -1 || cfg->gid_index > 255) {
        kvp_log_error(cfg && cfg->who ? cfg->who : "rdma", "rdma open: bad arguments");
        return KVP_ERR_INVALID;
    }
    *out = NULL;
    struct kvp_verbs_probe pr;
    int rc = kvp_verbs_probe(cfg->ops, cfg->who ? cfg->who : "rdma",
                             cfg->nodev_log_level ? cfg->nodev_log_level : KVP_LOG_INFO, &pr);
    if (rc != KVP_OK)
        return rc; /* the one "no RDMA device ...; using TCP" line is the probe's */
    struct kvp_rdma_xport *x = calloc(1, sizeof *x);
    if (!x)
        return KVP_ERR_NOMEM;
    x->cfg = *cfg;
    cfg_defaults(&x->cfg);
    if (env)
        x->env = *env;
    x->ops = cfg->ops;
    x->who = x->cfg.who;
    x->psn_state = cfg->psn_seed;
    x->pc_free = x->xs_free = KVP_RDMA_NONE;
    kvp_rdma_qp_attrs_default(&x->attrs);
    x->attrs.max_send_wr = x->cfg.max_send_wr;

    int num = 0;
    struct ibv_device **list = x->ops->get_device_list(x->ops, &num);
    if (!list || num <= 0) {
        if (list)
            x->ops->free_device_list(x->ops, list);
        free(x);
        return KVP_ERR_UNSUPPORTED;
    }
    /* The device list override: names must exist on this host. */
    struct kvp_rdma_nic all[KVP_RDMA_MAX_NICS];
    bool allowed[KVP_RDMA_MAX_NICS];
    size_t n_all = (size_t)num < KVP_RDMA_MAX_NICS ? (size_t)num : KVP_RDMA_MAX_NICS;
    memset(all, 0, sizeof all);
    for (size_t i = 0; i < n_all; i++) {
        const char *nm = x->ops->get_device_name(list[i]);
        snprintf(all[i].name, sizeof all[i].name, "%s", nm ? nm : "?");
        all[i].active = true;
    }
    rc = kvp_rdma_nic_filter(x->cfg.devices, all, n_all, allowed);
    if (rc != KVP_OK) {
        x->ops->free_device_list(x->ops, list);
        free(x);
        return rc;
    }
    for (size_t i = 0; i < n_all; i++) {
        if (!allowed[i])
            continue;
        struct kvp_rdma_nicst *c = &x->nic[x->n_nics];
        int r = nic_open(x, list[i], c);
        if (r == KVP_OK) {
            struct kvp_rdma_nic t;
            if (kvp_rdma_nic_sysfs(x->cfg.sysfs_root, c->topo.name, &t) == KVP_OK) {
                c->topo.numa_node = t.numa_node;
                memcpy(c->topo.pci_path, t.pci_path, sizeof t.pci_path);
            } else {
                c->topo.numa_node = -1;
            }
            x->n_nics++;
        } else {
            nic_close(x, c);
            if (r != KVP_ERR_UNSUPPORTED)
                rc = r;
        }
    }
    x->ops->free_device_list(x->ops, list);
    if (x->n_nics == 0) {
        if (rc == KVP_OK) {
            rc = KVP_ERR_UNSUPPORTED;
            kvp_log(x->cfg.nodev_log_level ? x->cfg.nodev_log_level : KVP_LOG_INFO, x->who,
                    "rdma: no usable RDMA device (%d listed, none with an active port and a "
                    "suitable GID); using TCP", num);
        }
        free(x);
        return rc;
    }
    rc = kvp_rdma_slots_init(&x->slots, 8192, 1);
    if (rc == KVP_OK)
        rc = kvp_rdma_bounce_init(x);
    if (rc != KVP_OK) {
        kvp_rdma_close(&x);
        return rc;
    }
    x->reaper = (struct kvp_rdma_reaper){.ops = x->ops, .slots = &x->slots, .who = x->who};
    char names[256] = "";
    for (size_t i = 0; i < x->n_nics; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? "," : "",
                 x->nic[i].topo.name);
    kvp_log_info(x->who, "rdma: transport up on %s (%zu NIC%s, %u QPs per peer, slice %llu B, "
                         "fence bound %u ms)", names, x->n_nics, x->n_nics == 1 ? "" : "s",
                 x->cfg.qps_per_peer, (unsigned long long)x->cfg.slice_bytes, x->cfg.fence_bound_ms);
    *out = x;
    return KVP_OK;
}

size_t kvp_rdma_nics(const struct kvp_rdma_xport *x) { return x ? x->n_nics : 0; }

const char *kvp_rdma_nic_name(const struct kvp_rdma_xport *x, size_t i)
{
    return x && i < x->n_nics ? x->nic[i].topo.name : "";
}

size_t kvp_rdma_fds(const struct kvp_rdma_xport *x, int *fds, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; x && i < x->n_nics && n < cap; i++)
        if (x->nic[i].ch)
            fds[n++] = x->nic[i].ch->fd;
    return n;
}

static void writers_free(struct kvp_rdma_xport *x)
{
    while (x->writers) {
        struct kvp_rdma_writer *w = x->writers;
        x->writers = w->next;
        struct kvp_rdma_qp *qs[KVP_RDMA_HELLO_MAX_QPS];
        for (uint32_t i = 0; i < w->n_qps; i++)
            qs[i] = &w->q[i];
        kvp_rdma_fence_qps(x, qs, w->n_qps, NULL, 0);
        free(w);
    }
}

void kvp_rdma_close(struct kvp_rdma_xport **xp)
{
    if (!xp || !*xp)
        return;
    struct kvp_rdma_xport *x = *xp;
    while (x->eps) {
        struct kvp_rdma_ep *e = x->eps;
        kvp_rdma_ep_free(&e);
    }
    writers_free(x);
    while (x->gens) {
        struct kvp_rdma_gen *g = x->gens;
        x->gens = g->next;
        free(g);
    }
    for (size_t i = 0; i < KVP_RDMA_MAX_NICS; i++)
        kvp_rdma_region_deregister(x->ops, &x->seg_region[i]);
    kvp_rdma_mr_fini(x);
    kvp_rdma_bounce_fini(x);
    for (size_t i = 0; i < x->n_nics; i++)
        nic_close(x, &x->nic[i]);
    kvp_rdma_slots_fini(&x->slots);
    kvp_rdma_core_fini(x);
    free(x);
    *xp = NULL;
}

/* The NIC for memory at mem: nearest by GPU PCIe path or NUMA node, rails round-robin. */
static size_t nic_for(struct kvp_rdma_xport *x, const struct kvp_rdma_mem *mem)
{
    struct kvp_rdma_nic t[KVP_RDMA_MAX_NICS];
    for (size_t i = 0; i < x->n_nics; i++)
        t[i] = x->nic[i].topo;
    struct kvp_rdma_mem_loc loc = {.numa_node = mem ? mem->numa_node : -1,
                                   .gpu_pci_path = mem ? mem->gpu_pci_path : NULL};
    int i = kvp_rdma_nic_pick(t, x->n_nics, NULL, &loc, x->rr++);
    return i >= 0 ? (size_t)i : 0;
}

/* ------------------------------------------------------------------ QP sets */

static int qps_create(struct kvp_rdma_xport *x, size_t nic, uint32_t n, struct kvp_rdma_qp *q)
{
    for (uint32_t i = 0; i < n; i++) {
        memset(&q[i], 0, sizeof q[i]);
        int rc = kvp_rdma_qp_create(x->ops, x->nic[nic].pd, x->nic[nic].cq.cq, &x->attrs, &q[i].qp);
        if (rc != KVP_OK) {
            for (uint32_t j = 0; j < i; j++) {
                x->ops->destroy_qp(q[j].qp);
                q[j].qp = NULL;
            }
            return rc;
        }
        q[i].cq = &x->nic[nic].cq;
        q[i].max_send_wr = x->attrs.max_send_wr;
        q[i].state = KVP_RDMA_QP_LIVE;
    }
    return KVP_OK;
}

/* Bring q[0..n) to RTS facing the peer's QPs of hello h. */
static int qps_connect(struct kvp_rdma_xport *x, size_t nic, struct kvp_rdma_qp *q,
                       const uint32_t *psn, const struct kvp_rdma_hello *h, int access)
{
    struct kvp_rdma_nicst *c = &x->nic[nic];
    struct kvp_rdma_local lo = {.ctx = c->ctx, .port = c->port, .gid_index = c->gid_index,
                                .access = access};
    for (uint32_t i = 0; i < h->n_qps; i++) {
        struct kvp_rdma_peer pe = {.lid = h->lid, .qpn = h->qps[i].qpn, .psn = h->qps[i].psn,
                                   .mtu = h->mtu, .max_rd_atomic = h->max_rd_atomic};
        memcpy(pe.gid.raw, h->gid, 16);
        lo.psn = psn[i];
        int rc = kvp_rdma_qp_to_rts(x->ops, q[i].qp, &lo, &pe, &x->attrs);
        if (rc != KVP_OK)
            return rc;
    }
    return KVP_OK;
}

static void hello_local(struct kvp_rdma_xport *x, size_t nic, struct kvp_rdma_hello *h)
{
    struct kvp_rdma_nicst *c = &x->nic[nic];
    snprintf(h->nic, sizeof h->nic, "%s", c->topo.name);
    h->port = c->port;
    h->lid = c->lid;
    memcpy(h->gid, c->gid.raw, 16);
    h->gid_index = c->gid_index;
    h->mtu = c->active_mtu < 1 ? 1 : c->active_mtu > 5 ? 5 : c->active_mtu;
    h->max_rd_atomic = c->max_rd_atomic;
}

/* ------------------------------------------------------------------ client side */

int kvp_rdma_ep_offer(struct kvp_rdma_xport *x, uint32_t segment_id, uint64_t client_id,
                      const struct kvp_rdma_mem *mem, struct kvp_rdma_ep **out, uint8_t **hello,
                      size_t *hello_len)
{
    if (!x || !out || !hello || !hello_len)
        return KVP_ERR_INVALID;
    struct kvp_rdma_gen *g = x->gens;
    while (g && g->segment_id != segment_id)
        g = g->next;
    if (!g) {
        g = calloc(1, sizeof *g);
        if (!g)
            return KVP_ERR_NOMEM;
        g->segment_id = segment_id;
        g->next = x->gens;
        x->gens = g;
    }
    struct kvp_rdma_ep *e = calloc(1, sizeof *e);
    if (!e)
        return KVP_ERR_NOMEM;
    e->x = x;
    e->nic = nic_for(x, mem);
    e->segment_id = segment_id;
    e->client_id = client_id;
    e->gen = ++g->gen; /* a new generation per reconnect */
    e->n_qps = x->cfg.qps_per_peer;
    e->pend_head = e->pend_tail = KVP_RDMA_NONE;
    int rc = qps_create(x, e->nic, e->n_qps, e->q);
    if (rc != KVP_OK) {
        free(e);
        return rc;
    }
    struct kvp_rdma_hello h = {.conn_generation = e->gen, .segment_id = segment_id,
                               .client_id = client_id, .n_qps = e->n_qps};
    hello_local(x, e->nic, &h);
    for (uint32_t i = 0; i < e->n_qps; i++) {
        e->psn[i] = kvp_rdma_psn(x);
        h.qps[i].qpn = e->q[i].qp->qp_num;
        h.qps[i].psn = e->psn[i];
    }
    rc = kvp_rdma_hello_encode(&h, hello, hello_len);
    e->next = x->eps;
    x->eps = e;
    if (rc != KVP_OK) {
        kvp_rdma_ep_free(&e);
        return rc;
    }
    *out = e;
    return KVP_OK;
}

int kvp_rdma_ep_complete(struct kvp_rdma_ep *e, const uint8_t *answer, size_t len)
{
    if (!e || e->state != EP_OFFERED)
        return KVP_ERR_INVALID;
    struct kvp_rdma_xport *x = e->x;
    struct kvp_rdma_hello h;
    char why[160] = "";
    int rc = kvp_rdma_hello_decode(answer, len, &h, why, sizeof why);
    if (rc != KVP_OK) {
        kvp_log_warn(x->who, "rdma: segment %u: bad handshake answer (%s): %s", e->segment_id,
                     kvp_errname(rc), why);
        goto out;
    }
    if (h.status != KVP_OK) {
        rc = h.status;
        kvp_log_warn(x->who, "rdma: segment %u refused the connection: %s", e->segment_id,
                     kvp_errname(rc));
        goto out;
    }
    if ((e->segment_id && h.segment_id != e->segment_id) || h.conn_generation != e->gen ||
        h.n_qps != e->n_qps || h.n_chunks == 0) {
        rc = KVP_ERR_MALFORMED;
        kvp_log_warn(x->who, "rdma: segment %u: handshake answer for segment %u gen %llu with %u "
                             "QPs and %zu chunks, expected gen %llu and %u QPs",
                     e->segment_id, h.segment_id, (unsigned long long)h.conn_generation, h.n_qps,
                     h.n_chunks, (unsigned long long)e->gen, e->n_qps);
        goto out;
    }
    struct kvp_rdma_chunk *tab = calloc(h.n_chunks, sizeof *tab);
    if (!tab) {
        rc = KVP_ERR_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < h.n_chunks; i++)
        tab[i] = (struct kvp_rdma_chunk){.base = h.chunks[i].base, .len = h.chunks[i].len,
                                         .rkey = h.chunks[i].rkey};
    rc = kvp_rdma_region_from_table(tab, h.n_chunks, &e->remote);
    free(tab);
    if (rc == KVP_OK)
        rc = qps_connect(x, e->nic, e->q, e->psn, &h, 0); /* no remote access into the client */
    if (rc == KVP_OK) {
        e->state = EP_LIVE;
        e->segment_id = h.segment_id; /* an offer to "whatever serves here" (0) learns it */
        kvp_log_info(x->who, "rdma: segment %u connected over %s -> %s (gen %llu, %u QPs)",
                     e->segment_id, x->nic[e->nic].topo.name, h.nic, (unsigned long long)e->gen,
                     e->n_qps);
    }
out:
    kvp_rdma_hello_free(&h);
    return rc;
}

bool kvp_rdma_ep_live(const struct kvp_rdma_ep *e) { return e && e->state == EP_LIVE; }
uint64_t kvp_rdma_ep_generation(const struct kvp_rdma_ep *e) { return e ? e->gen : 0; }
const char *kvp_rdma_ep_nic(const struct kvp_rdma_ep *e)
{
    return e ? e->x->nic[e->nic].topo.name : "";
}

void kvp_rdma_ep_free(struct kvp_rdma_ep **ep)
{
    if (!ep || !*ep)
        return;
    struct kvp_rdma_ep *e = *ep;
    struct kvp_rdma_xport *x = e->x;
    struct kvp_rdma_qp *qs[KVP_RDMA_HELLO_MAX_QPS];
    size_t n = 0;
    for (uint32_t i = 0; i < e->n_qps; i++)
        if (e->q[i].qp)
            qs[n++] = &e->q[i];
    /* never a bare destroy: fence first (note §1.3, eviction is a fence) */
    if (n)
        kvp_rdma_fence_qps(x, qs, n, NULL, 0);
    for (struct kvp_rdma_ep **pp = &x->eps; *pp; pp = &(*pp)->next)
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    kvp_rdma_region_deregister(NULL, &e->remote);
    free(e->f_mrs);
    free(e->f_owner);
    free(e);
    *ep = NULL;
}

/* ------------------------------------------------------------------ segment side */

int kvp_rdma_seg_register(struct kvp_rdma_xport *x, uint32_t segment_id, void *base, uint64_t len,
                          const struct kvp_rdma_mem *mem)
{
    if (!x || !base || !len)
        return KVP_ERR_INVALID;
    if (x->seg_len)
        return KVP_ERR_BUSY;
    int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    for (size_t i = 0; i < x->n_nics; i++) {
        int rc = kvp_rdma_region_register(x->ops, x->nic[i].pd, base, len, x->nic[i].chunk_bytes,
                                          acc, &x->seg_region[i]);
        if (rc != KVP_OK) {
            for (size_t j = 0; j < i; j++)
                kvp_rdma_region_deregister(x->ops, &x->seg_region[j]);
            return rc;
        }
        x->st.mr_regs += x->seg_region[i].n;
    }
    x->seg_id = segment_id;
    x->seg_base = (uint64_t)(uintptr_t)base;
    x->seg_len = len;
    x->seg_nic = nic_for(x, mem);
    kvp_log_info(x->who, "rdma: segment %u region of %llu B registered in %zu chunk(s) on %zu NIC(s)",
                 segment_id, (unsigned long long)len, x->seg_region[0].n, x->n_nics);
    return KVP_OK;
}

static int refuse(struct kvp_rdma_xport *x, const struct kvp_rdma_hello *offer, int status,
                  uint8_t **answer, size_t *alen)
{
    struct kvp_rdma_hello a = {.conn_generation = offer && offer->conn_generation ? offer->conn_generation : 1,
                               .segment_id = x->seg_id, .port = 1, .mtu = 1, .max_rd_atomic = 1,
                               .status = status};
    if (kvp_rdma_hello_encode(&a, answer, alen) != KVP_OK) {
        *answer = NULL;
        *alen = 0;
    }
    return status;
}

int kvp_rdma_seg_fence_writer(struct kvp_rdma_xport *x, uint64_t client_id, uint64_t gen)
{
    if (!x)
        return KVP_ERR_INVALID;
    int fenced = 0;
    for (struct kvp_rdma_writer **pp = &x->writers; *pp;) {
        struct kvp_rdma_writer *w = *pp;
        if (w->client_id != client_id || w->gen > gen) {
            pp = &w->next;
            continue;
        }
        struct kvp_rdma_qp *qs[KVP_RDMA_HELLO_MAX_QPS];
        for (uint32_t i = 0; i < w->n_qps; i++)
            qs[i] = &w->q[i];
        /* The segment's QPs facing a writer post nothing, so begin (ERR) + one step destroys
         * them at once: an Error QP answers no inbound request (note §2.1, §2.4 L2). */
        kvp_rdma_fence_qps(x, qs, w->n_qps, NULL, 0);
        fenced += (int)w->n_qps;
        *pp = w->next;
        free(w);
    }
    x->st.writers_fenced += (uint64_t)fenced;
    if (fenced)
        kvp_log_info(x->who, "rdma: fenced writer %llu (generations <= %llu): %d QP(s) destroyed",
                     (unsigned long long)client_id, (unsigned long long)gen, fenced);
    return fenced;
}

int kvp_rdma_seg_accept(struct kvp_rdma_xport *x, const uint8_t *offer, size_t len,
                        uint8_t **answer, size_t *alen)
{
    if (!x || !answer || !alen)
        return KVP_ERR_INVALID;
    struct kvp_rdma_hello h;
    char why[160] = "";
    int rc = kvp_rdma_hello_decode(offer, len, &h, why, sizeof why);
    if (rc != KVP_OK) {
        kvp_log_warn(x->who, "rdma: bad handshake offer refused (%s): %s", kvp_errname(rc), why);
        kvp_rdma_hello_free(&h);
        return refuse(x, NULL, rc, answer, alen);
    }
    if (h.status != KVP_OK || h.n_chunks) {
        kvp_log_warn(x->who, "rdma: handshake offer from client %llu carries a status or a chunk "
                             "table; refused", (unsigned long long)h.client_id);
        kvp_rdma_hello_free(&h);
        return refuse(x, &h, KVP_ERR_MALFORMED, answer, alen);
    }
    if (!x->seg_len) {
        kvp_rdma_hello_free(&h);
        return refuse(x, &h, KVP_ERR_UNSUPPORTED, answer, alen);
    }
    if (h.segment_id && h.segment_id != x->seg_id) {
        kvp_rdma_hello_free(&h);
        return refuse(x, &h, KVP_ERR_NOT_FOUND, answer, alen);
    }
    /* A newer generation from the same client: its older QPs are fenced first. */
    kvp_rdma_seg_fence_writer(x, h.client_id, h.conn_generation - 1);
    struct kvp_rdma_writer *w = calloc(1, sizeof *w);
    if (!w) {
        kvp_rdma_hello_free(&h);
        return refuse(x, &h, KVP_ERR_NOMEM, answer, alen);
    }
    w->client_id = h.client_id;
    w->gen = h.conn_generation;
    w->nic = x->seg_nic;
    w->n_qps = h.n_qps;
    uint32_t psn[KVP_RDMA_HELLO_MAX_QPS];
    rc = qps_create(x, w->nic, w->n_qps, w->q);
    if (rc == KVP_OK) {
        for (uint32_t i = 0; i < w->n_qps; i++)
            psn[i] = kvp_rdma_psn(x);
        rc = qps_connect(x, w->nic, w->q, psn, &h,
                         IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
        if (rc != KVP_OK) {
            struct kvp_rdma_qp *qs[KVP_RDMA_HELLO_MAX_QPS];
            for (uint32_t i = 0; i < w->n_qps; i++)
                qs[i] = &w->q[i];
            kvp_rdma_fence_qps(x, qs, w->n_qps, NULL, 0);
        }
    }
    if (rc != KVP_OK) {
        free(w);
        int st = rc == KVP_ERR_INVALID ? KVP_ERR_MALFORMED : rc;
        kvp_rdma_hello_free(&h);
        return refuse(x, &h, st, answer, alen);
    }
    w->next = x->writers;
    x->writers = w;
    const struct kvp_rdma_region *r = &x->seg_region[w->nic];
    struct kvp_rdma_hello a = {.conn_generation = h.conn_generation, .segment_id = x->seg_id,
                               .client_id = h.client_id, .n_qps = w->n_qps};
    hello_local(x, w->nic, &a);
    for (uint32_t i = 0; i < w->n_qps; i++) {
        a.qps[i].qpn = w->q[i].qp->qp_num;
        a.qps[i].psn = psn[i];
    }
    a.chunks = calloc(r->n, sizeof *a.chunks);
    if (!a.chunks) {
        kvp_rdma_hello_free(&h);
        return KVP_ERR_NOMEM;
    }
    a.n_chunks = r->n;
    for (size_t i = 0; i < r->n; i++)
        a.chunks[i] = (struct kvp_rdma_hello_chunk){.base = r->chunks[i].base,
                                                    .len = r->chunks[i].len,
                                                    .rkey = r->chunks[i].rkey};
    rc = kvp_rdma_hello_encode(&a, answer, alen);
    free(a.chunks);
    kvp_rdma_hello_free(&h);
    return rc;
}

void kvp_rdma_arm(struct kvp_rdma_xport *x)
{
    if (!x || x->env.wait)
        return; /* the double's clock drives the tests: no channel events there */
    for (size_t i = 0; i < x->n_nics; i++) {
        struct kvp_rdma_nicst *c = &x->nic[i];
        nic_events_ack(x, c);
        if (c->cq.cq && !c->cq.failed)
            x->ops->req_notify_cq(c->cq.cq, 0);
    }
}

uint32_t kvp_rdma_ep_segment(const struct kvp_rdma_ep *e) { return e ? e->segment_id : 0; }

void kvp_rdma_stats(const struct kvp_rdma_xport *x, struct kvp_rdma_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!x)
        return;
    *out = x->st;
    out->late_ok = x->reaper.late_ok;
    out->stale_wc = x->reaper.stale_wc;
    for (size_t i = 0; i < x->n_nics; i++) {
        if (x->nic[i].cq.high_water > out->cq_high_water)
            out->cq_high_water = x->nic[i].cq.high_water;
        out->cq_size = x->nic[i].cq.size;
    }
}
