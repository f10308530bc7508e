/*
 * fakeverbs.c — the verbs test double; see fakeverbs.h for the model and docs/rdma.md for what
 * it simplifies. Built only with KVP_HAVE_VERBS (it needs rdma-core's headers for the types,
 * not its library).
 *
 * This file: the verbs ops, the fabric, nodes and knobs; fakeverbs_wire.c has the engine.
 * Structure: a fabric owns nodes (simulated processes); a node owns devices and every verbs
 * object made through its table (records are freed only at fv_fabric_destroy, so events and
 * tests may keep pointers to destroyed objects). Events (packets, ACKs, timers, flushes) sit in
 * a binary heap ordered by (time, sequence number); nothing runs unless the test advances the
 * clock. Single-threaded: no locks, no atomics.
 */
#ifdef KVP_HAVE_VERBS

#include "tests/lib/fakeverbs_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kvpool.h"

/* ---------- ops: devices ---------- */

static struct fv_node *ops_node(const struct kvp_verbs_ops *ops)
{
    return ops ? ops->impl : NULL;
}

static struct ibv_device **fv_get_device_list(const struct kvp_verbs_ops *ops, int *num)
{
    struct fv_node *n = ops_node(ops);
    if (num)
        *num = 0;
    if (!n || n->cfg.n_devices < 0 || n->killed) {
        errno = n && n->cfg.list_errno ? n->cfg.list_errno : ENOSYS;
        return NULL;
    }
    struct ibv_device **l = fv_calloc((size_t)n->n_dev + 1, sizeof *l);
    if (!l) {
        errno = ENOMEM;
        return NULL;
    }
    for (int i = 0; i < n->n_dev; i++)
        l[i] = &n->devs[i].dev;
    if (num)
        *num = n->n_dev;
    return l;
}

static void fv_free_device_list(const struct kvp_verbs_ops *ops, struct ibv_device **list)
{
    (void)ops;
    fv_free(list);
}

static const char *fv_get_device_name(struct ibv_device *dev)
{
    return dev ? dev->name : NULL;
}

static struct ibv_context *fv_open_device(struct ibv_device *dev)
{
    struct fv_dev *d = (struct fv_dev *)dev;
    if (!d || d->node->killed) {
        errno = ENODEV;
        return NULL;
    }
    struct fv_ctx *c = fv_calloc(1, sizeof *c);
    if (!c) {
        errno = ENOMEM;
        return NULL;
    }
    c->d = d;
    c->ctx.device = dev;
    c->ctx.cmd_fd = -1;
    c->ctx.async_fd = -1;
    c->ctx.num_comp_vectors = 1;
    c->next = d->node->ctxs;
    d->node->ctxs = c;
    return &c->ctx;
}

static int fv_close_device(struct ibv_context *ctx)
{
    struct fv_ctx *c = (struct fv_ctx *)ctx;
    if (!c || c->closed)
        return EINVAL;
    c->closed = true;
    return 0;
}

static int fv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a)
{
    struct fv_ctx *c = (struct fv_ctx *)ctx;
    if (!c || !a || c->closed)
        return EINVAL;
    struct fv_node *n = c->d->node;
    memset(a, 0, sizeof *a);
    snprintf(a->fw_ver, sizeof a->fw_ver, "fake-1.0");
    a->node_guid = 0x0200000000000000ull | ((uint64_t)n->idx << 8) | (uint64_t)c->d->idx;
    a->max_mr_size = n->cfg.max_mr_size;
    a->page_size_cap = 4096;
    a->vendor_id = 0xfa4e;
    a->max_qp = 1 << 17;
    a->max_qp_wr = (int)n->cfg.max_qp_wr;
    a->max_sge = 1;
    a->max_cq = 1 << 16;
    a->max_cqe = n->cfg.max_cqe;
    a->max_mr = 1 << 20;
    a->max_pd = 1 << 16;
    a->max_qp_rd_atom = 16;
    a->max_qp_init_rd_atom = 16;
    a->atomic_cap = IBV_ATOMIC_NONE;
    a->phys_port_cnt = 1;
    return 0;
}

static int fv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a)
{
    struct fv_ctx *c = (struct fv_ctx *)ctx;
    if (!c || !a || c->closed || port != 1)
        return EINVAL;
    memset(a, 0, sizeof *a);
    a->state = IBV_PORT_ACTIVE;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = IBV_MTU_4096;
    a->gid_tbl_len = FV_GIDS;
    a->max_msg_sz = 1u << 31;
    a->pkey_tbl_len = 1;
    a->lid = c->d->node->cfg.link_layer == IBV_LINK_LAYER_INFINIBAND ? c->d->lid : 0;
    a->link_layer = c->d->node->cfg.link_layer;
    a->active_width = 2;  /* 4x */
    a->active_speed = 32; /* EDR-class */
    a->phys_state = 5;    /* LinkUp */
    return 0;
}

static int fv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
    struct fv_ctx *c = (struct fv_ctx *)ctx;
    if (!c || !gid || c->closed || port != 1 || index < 0 || index >= FV_GIDS)
        return EINVAL;
    *gid = c->d->gid[index];
    return 0;
}

static int fv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                           struct ibv_gid_entry *entry, uint32_t flags)
{
    struct fv_ctx *c = (struct fv_ctx *)ctx;
    if (!c || !entry || c->closed || port != 1 || flags || index >= FV_GIDS)
        return EINVAL;
    static const uint8_t zero[16];
    if (memcmp(c->d->gid[index].raw, zero, 16) == 0)
        return ENODATA; /* an empty table entry */
    memset(entry, 0, sizeof *entry);
    entry->gid = c->d->gid[index];
    entry->gid_index = index;
    entry->port_num = port;
    entry->gid_type = c->d->node->cfg.link_layer == IBV_LINK_LAYER_INFINIBAND ? IBV_GID_TYPE_IB
                      : index % 2 ? IBV_GID_TYPE_ROCE_V2
                                  : IBV_GID_TYPE_ROCE_V1;
    entry->ndev_ifindex = 0;
    return 0;
}

static int fv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev)
{
    struct fv_ctx *c = (struct fv_ctx *)ctx;
    if (!c || !ev) {
        errno = EINVAL;
        return -1;
    }
    if (!c->n_ev) {
        errno = EAGAIN; /* the double never blocks */
        return -1;
    }
    *ev = c->ev[0];
    memmove(&c->ev[0], &c->ev[1], (size_t)(c->n_ev - 1) * sizeof c->ev[0]);
    c->n_ev--;
    return 0;
}

static void fv_ack_async_event(struct ibv_async_event *ev)
{
    (void)ev;
}

/* ---------- ops: PD and MR ---------- */

static bool take_fail(struct fv_node *n, enum fv_op op, int *err)
{
    if (!n->fail_next[op])
        return false;
    *err = n->fail_next[op];
    n->fail_next[op] = 0;
    return true;
}

static struct ibv_pd *fv_alloc_pd(struct ibv_context *ctx)
{
    struct fv_ctx *c = (struct fv_ctx *)ctx;
    if (!c || c->closed || c->d->node->killed) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_pd *p = fv_calloc(1, sizeof *p);
    if (!p) {
        errno = ENOMEM;
        return NULL;
    }
    p->c = c;
    p->pd.context = ctx;
    p->next = c->d->node->pds;
    c->d->node->pds = p;
    return &p->pd;
}

static int fv_dealloc_pd(struct ibv_pd *pd)
{
    struct fv_pd *p = (struct fv_pd *)pd;
    if (!p || p->dead)
        return EINVAL;
    struct fv_node *n = p->c->d->node;
    for (struct fv_mr *m = n->mrs; m; m = m->next)
        if (!m->dead && m->pd == p)
            return EBUSY;
    for (struct fv_qp *q = n->qps; q; q = q->next)
        if (!q->dead && q->pd == p)
            return EBUSY;
    p->dead = true;
    return 0;
}

static uint32_t new_key(struct fv_fabric *f)
{
    for (;;) {
        uint32_t k = (uint32_t)fvi_rnd(f);
        bool used = k == 0;
        for (struct fv_node *n = f->nodes; n && !used; n = n->next)
            for (struct fv_mr *m = n->mrs; m && !used; m = m->next)
                used = m->mr.lkey == k || m->mr.rkey == k;
        if (!used)
            return k;
    }
}

#define FV_MR_ACCESS_OK                                                                            \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |                   \
     IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_RELAXED_ORDERING)

static struct ibv_mr *mr_make(struct fv_pd *p, uint8_t *host, uint64_t iova, size_t len, int access)
{
    struct fv_node *n = p->c->d->node;
    int err;
    if (take_fail(n, FV_OP_REG, &err)) {
        errno = err;
        return NULL;
    }
    if (p->dead || n->killed || !host || len == 0 || (access & ~FV_MR_ACCESS_OK) ||
        ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
         !(access & IBV_ACCESS_LOCAL_WRITE)) ||
        len > n->cfg.max_mr_size) {
        errno = EINVAL;
        return NULL;
    }
    if (n->cfg.memlock_bytes && (len > n->cfg.memlock_bytes || n->locked > n->cfg.memlock_bytes - len)) {
        errno = ENOMEM;
        return NULL;
    }
    struct fv_mr *m = fv_calloc(1, sizeof *m);
    if (!m) {
        errno = ENOMEM;
        return NULL;
    }
    struct fv_fabric *f = n->f;
    m->pd = p;
    m->host = host;
    m->iova = iova;
    m->len = len;
    m->access = access;
    m->mr.context = &p->c->ctx;
    m->mr.pd = &p->pd;
    m->mr.addr = (void *)(uintptr_t)iova;
    m->mr.length = len;
    m->mr.lkey = new_key(f);
    m->next = n->mrs;
    n->mrs = m;
    m->mr.rkey = new_key(f);
    n->locked += len;
    return &m->mr;
}

static struct ibv_mr *fv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    if (!pd) {
        errno = EINVAL;
        return NULL;
    }
    return mr_make((struct fv_pd *)pd, addr, (uint64_t)(uintptr_t)addr, length, access);
}

static struct ibv_mr *fv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                       uint64_t iova, int fd, int access)
{
    struct fv_pd *p = (struct fv_pd *)pd;
    if (!p) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_fabric *f = p->c->d->node->f;
    if (fd < FV_DMABUF_BASE || (size_t)(fd - FV_DMABUF_BASE) >= f->n_dmabufs) {
        errno = EBADF;
        return NULL;
    }
    struct fv_dmabuf *b = &f->dmabufs[fd - FV_DMABUF_BASE];
    /* man 3 ibv_reg_mr: iova keeps offset's page offset; no MW_BIND/ZERO_BASED and the like. */
    if (offset > b->len || length > b->len - offset || (iova & 4095) != (offset & 4095) ||
        (access & ~FV_MR_ACCESS_OK)) {
        errno = EINVAL;
        return NULL;
    }
    return mr_make(p, b->addr + offset, iova, length, access);
}

static int fv_dereg_mr(struct ibv_mr *mr)
{
    struct fv_mr *m = (struct fv_mr *)mr;
    if (!m || m->dead)
        return EINVAL;
    m->dead = true;
    m->pd->c->d->node->locked -= m->len;
    return 0;
}

int fv_dmabuf_export(struct fv_fabric *f, void *addr, size_t len)
{
    if (!f || !addr || !len)
        return -1;
    f->dmabufs = fvi_grow(f->dmabufs, &f->cap_dmabufs, f->n_dmabufs + 1, sizeof *f->dmabufs);
    f->dmabufs[f->n_dmabufs].addr = addr;
    f->dmabufs[f->n_dmabufs].len = len;
    return FV_DMABUF_BASE + (int)f->n_dmabufs++;
}

/* ---------- ops: CQs and channels ---------- */

static struct ibv_comp_channel *fv_create_comp_channel(struct ibv_context *ctx)
{
    struct fv_ctx *c = (struct fv_ctx *)ctx;
    if (!c || c->closed) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_chan *ch = fv_calloc(1, sizeof *ch);
    if (!ch) {
        errno = ENOMEM;
        return NULL;
    }
    ch->ch.fd = eventfd(0, EFD_NONBLOCK | EFD_SEMAPHORE | EFD_CLOEXEC);
    if (ch->ch.fd < 0) {
        int e = errno;
        fv_free(ch);
        errno = e;
        return NULL;
    }
    ch->c = c;
    ch->pid = (int)getpid();
    ch->ch.context = ctx;
    ch->next = c->d->node->chans;
    c->d->node->chans = ch;
    return &ch->ch;
}

static int fv_destroy_comp_channel(struct ibv_comp_channel *chp)
{
    struct fv_chan *ch = (struct fv_chan *)chp;
    if (!ch || ch->dead)
        return EINVAL;
    for (struct fv_cq *cq = ch->c->d->node->cqs; cq; cq = cq->next)
        if (!cq->dead && cq->ch == ch)
            return EBUSY;
    ch->dead = true;
    if (ch->pid == getpid())
        close(ch->ch.fd);
    ch->ch.fd = -1;
    return 0;
}

static struct ibv_cq *fv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                                   struct ibv_comp_channel *chp, int comp_vector)
{
    struct fv_ctx *c = (struct fv_ctx *)ctx;
    if (!c || c->closed || cqe < 1 || cqe > c->d->node->cfg.max_cqe || comp_vector != 0 ||
        (chp && ((struct fv_chan *)chp)->dead)) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_cq *cq = fv_calloc(1, sizeof *cq);
    if (cq)
        cq->ring = fv_calloc((size_t)cqe, sizeof *cq->ring);
    if (!cq || !cq->ring) {
        if (cq)
            fv_free(cq);
        errno = ENOMEM;
        return NULL;
    }
    cq->c = c;
    cq->cap = cqe;
    cq->ch = (struct fv_chan *)chp;
    cq->cq.context = ctx;
    cq->cq.channel = chp;
    cq->cq.cq_context = cq_context;
    cq->cq.cqe = cqe;
    cq->next = c->d->node->cqs;
    c->d->node->cqs = cq;
    return &cq->cq;
}

static int fv_destroy_cq(struct ibv_cq *cqp)
{
    struct fv_cq *cq = (struct fv_cq *)cqp;
    if (!cq || cq->dead)
        return EINVAL;
    for (struct fv_qp *q = cq->c->d->node->qps; q; q = q->next)
        if (!q->dead && (q->scq == cq || q->rcq == cq))
            return EBUSY;
    cq->dead = true;
    return 0;
}

static int fv_poll_cq(struct ibv_cq *cqp, int num, struct ibv_wc *wc)
{
    struct fv_cq *cq = (struct fv_cq *)cqp;
    if (!cq || cq->dead || num < 0 || (num && !wc))
        return -1;
    struct fv_node *n = cq->c->d->node;
    if (n->frozen)
        return 0;
    if (cq->overrun)
        return -1;
    if (n->cfg.flush == FV_FLUSH_ON_POLL)
        for (struct fv_qp *q = n->qps; q; q = q->next)
            if (!q->dead && q->flush_pending && (q->scq == cq || q->rcq == cq))
                fvi_flush_qp(n->f, q);
    if (cq->overrun)
        return -1;
    int k = 0;
    while (k < num && cq->count) {
        wc[k++] = cq->ring[cq->head];
        cq->head = (cq->head + 1) % cq->cap;
        cq->count--;
    }
    return k;
}

static int fv_req_notify_cq(struct ibv_cq *cqp, int solicited_only)
{
    struct fv_cq *cq = (struct fv_cq *)cqp;
    if (!cq || cq->dead || !cq->ch)
        return EINVAL;
    (void)solicited_only;
    cq->armed = true;
    return 0;
}

static int fv_get_cq_event(struct ibv_comp_channel *chp, struct ibv_cq **cq, void **cq_context)
{
    struct fv_chan *ch = (struct fv_chan *)chp;
    if (!ch || ch->dead || !cq || !cq_context) {
        errno = EINVAL;
        return -1;
    }
    if (!ch->n_pend) {
        errno = EAGAIN; /* the double never blocks */
        return -1;
    }
    struct fv_cq *c = ch->pend[0];
    memmove(&ch->pend[0], &ch->pend[1], (ch->n_pend - 1) * sizeof ch->pend[0]);
    ch->n_pend--;
    uint64_t v;
    if (read(ch->ch.fd, &v, sizeof v) < 0) {
        /* already drained: nothing to do */
    }
    *cq = &c->cq;
    *cq_context = c->cq.cq_context;
    return 0;
}

static void fv_ack_cq_events(struct ibv_cq *cqp, unsigned int nevents)
{
    struct fv_cq *cq = (struct fv_cq *)cqp;
    if (cq)
        cq->events_acked += nevents;
}

void fv_cq_inject(struct ibv_cq *cqp, const struct ibv_wc *wc)
{
    struct fv_cq *cq = (struct fv_cq *)cqp;
    if (cq && wc)
        fvi_cq_push(cq->c->d->node->f, cq, wc);
}

/* ---------- ops: QPs ---------- */

static uint32_t new_qpn(struct fv_fabric *f)
{
    for (;;) {
        uint32_t k = (uint32_t)fvi_rnd(f) & PSN_MASK;
        bool used = k < 2; /* QP0/QP1 are special */
        for (struct fv_node *n = f->nodes; n && !used; n = n->next)
            for (struct fv_qp *q = n->qps; q && !used; q = q->next)
                used = q->qp.qp_num == k;
        if (!used)
            return k;
    }
}

static struct ibv_qp *fv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init)
{
    struct fv_pd *p = (struct fv_pd *)pd;
    if (!p || !init || p->dead || p->c->d->node->killed) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_node *n = p->c->d->node;
    if (init->qp_type != IBV_QPT_RC) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    struct fv_cq *scq = (struct fv_cq *)init->send_cq, *rcq = (struct fv_cq *)init->recv_cq;
    if (!scq || !rcq || scq->dead || rcq->dead || init->srq || init->cap.max_send_wr == 0 ||
        init->cap.max_send_wr > n->cfg.max_qp_wr || init->cap.max_recv_wr > n->cfg.max_qp_wr ||
        init->cap.max_send_sge > 1 || init->cap.max_recv_sge > 1 ||
        init->cap.max_inline_data > 256) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_qp *q = fv_calloc(1, sizeof *q);
    if (!q) {
        errno = ENOMEM;
        return NULL;
    }
    q->pd = p;
    q->scq = scq;
    q->rcq = rcq;
    q->cap = init->cap;
    q->sq_sig_all = init->sq_sig_all;
    q->qp.context = &p->c->ctx;
    q->qp.qp_context = init->qp_context;
    q->qp.pd = pd;
    q->qp.send_cq = init->send_cq;
    q->qp.recv_cq = init->recv_cq;
    q->qp.qp_num = new_qpn(n->f);
    q->qp.state = IBV_QPS_RESET;
    q->qp.qp_type = IBV_QPT_RC;
    q->next = n->qps;
    n->qps = q;
    return &q->qp;
}

static void qp_reset(struct fv_fabric *f, struct fv_qp *q)
{
    fvi_cancel_departures(f, q, true);
    fvi_discard_all(q);
    q->qp.state = IBV_QPS_RESET;
    q->flush_pending = false;
    q->sq_psn = q->epsn = 0;
    q->dest_qpn = 0;
    q->access = 0;
    q->tx_free = 0;
}

static bool ah_ok(const struct fv_qp *q, const struct ibv_ah_attr *ah)
{
    if (ah->port_num != 1)
        return false;
    if (fvi_qp_node(q)->cfg.link_layer == IBV_LINK_LAYER_ETHERNET && !ah->is_global)
        return false; /* RoCE needs a GRH */
    if (ah->is_global && ah->grh.sgid_index >= FV_GIDS)
        return false;
    return true;
}

static int fv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
    struct fv_qp *q = (struct fv_qp *)qp;
    if (!q || !a || q->dead)
        return EINVAL;
    struct fv_node *n = fvi_qp_node(q);
    struct fv_fabric *f = n->f;
    int err;
    if (take_fail(n, FV_OP_MODIFY, &err))
        return err;
    if (n->frozen)
        return EAGAIN;
    enum ibv_qp_state cur = q->qp.state;
    if ((mask & IBV_QP_CUR_STATE) && a->cur_qp_state != cur)
        return EINVAL;
    enum ibv_qp_state nw = (mask & IBV_QP_STATE) ? a->qp_state : cur;
    int other = mask & ~(IBV_QP_STATE | IBV_QP_CUR_STATE);
    if (nw == IBV_QPS_RESET || nw == IBV_QPS_ERR) {
        if (other || !(mask & IBV_QP_STATE))
            return EINVAL;
        if (nw == IBV_QPS_RESET)
            qp_reset(f, q);
        else
            fvi_enter_err(f, q);
        return 0;
    }
    int req, opt;
    if (cur == IBV_QPS_RESET && nw == IBV_QPS_INIT) {
        req = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        opt = 0;
    } else if (cur == IBV_QPS_INIT && nw == IBV_QPS_INIT) {
        req = 0;
        opt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    } else if (cur == IBV_QPS_INIT && nw == IBV_QPS_RTR) {
        req = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        opt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
    } else if ((cur == IBV_QPS_RTR || cur == IBV_QPS_RTS) && nw == IBV_QPS_RTS) {
        req = cur == IBV_QPS_RTR ? IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                                       IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC
                                 : 0;
        opt = IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE;
    } else {
        return EINVAL; /* not a transition of man 3 ibv_modify_qp's RC table */
    }
    if ((mask & req) != req || (other & ~(req | opt)))
        return EINVAL;
    /* Values. */
    if ((mask & IBV_QP_PORT) && a->port_num != 1)
        return EINVAL;
    if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0)
        return EINVAL;
    if ((mask & IBV_QP_ACCESS_FLAGS) &&
        (a->qp_access_flags & ~(unsigned)(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                          IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)))
        return EINVAL;
    if ((mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096))
        return EINVAL;
    if ((mask & IBV_QP_AV) && !ah_ok(q, &a->ah_attr))
        return EINVAL;
    if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > 16)
        return EINVAL;
    if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > 16)
        return EINVAL;
    if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31)
        return EINVAL;
    if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7)
        return EINVAL;
    if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7)
        return EINVAL;
    if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31)
        return EINVAL;
    if ((mask & IBV_QP_RQ_PSN) && a->rq_psn > PSN_MASK)
        return EINVAL;
    if ((mask & IBV_QP_SQ_PSN) && a->sq_psn > PSN_MASK)
        return EINVAL;
    if ((mask & IBV_QP_DEST_QPN) && (a->dest_qp_num == 0 || a->dest_qp_num > PSN_MASK))
        return EINVAL;
    /* Apply. */
    if (mask & IBV_QP_ACCESS_FLAGS)
        q->access = (int)a->qp_access_flags;
    if (mask & IBV_QP_AV)
        q->ah = a->ah_attr;
    if (mask & IBV_QP_PATH_MTU)
        q->path_mtu = (uint8_t)a->path_mtu;
    if (mask & IBV_QP_DEST_QPN)
        q->dest_qpn = a->dest_qp_num;
    if (mask & IBV_QP_RQ_PSN)
        q->epsn = a->rq_psn;
    if (mask & IBV_QP_SQ_PSN)
        q->sq_psn = a->sq_psn;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
        q->max_dest_rd_atomic = a->max_dest_rd_atomic;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
        q->max_rd_atomic = a->max_rd_atomic;
    if (mask & IBV_QP_MIN_RNR_TIMER)
        q->min_rnr_timer = a->min_rnr_timer;
    if (mask & IBV_QP_TIMEOUT)
        q->timeout = a->timeout;
    if (mask & IBV_QP_RETRY_CNT)
        q->retry_cnt = a->retry_cnt;
    if (mask & IBV_QP_RNR_RETRY)
        q->rnr_retry = a->rnr_retry;
    q->qp.state = nw;
    if (nw == IBV_QPS_RTS)
        fvi_kick(f, q);
    return 0;
}

static int fv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask,
                       struct ibv_qp_init_attr *init)
{
    struct fv_qp *q = (struct fv_qp *)qp;
    if (!q || !a || q->dead)
        return EINVAL;
    (void)mask;
    memset(a, 0, sizeof *a);
    a->qp_state = q->qp.state;
    a->cur_qp_state = q->qp.state;
    a->path_mtu = (enum ibv_mtu)q->path_mtu;
    a->qp_access_flags = (unsigned)q->access;
    a->rq_psn = q->epsn;
    a->sq_psn = q->sq_psn;
    a->dest_qp_num = q->dest_qpn;
    a->ah_attr = q->ah;
    a->cap = q->cap;
    a->timeout = q->timeout;
    a->retry_cnt = q->retry_cnt;
    a->rnr_retry = q->rnr_retry;
    a->max_rd_atomic = q->max_rd_atomic;
    a->max_dest_rd_atomic = q->max_dest_rd_atomic;
    a->min_rnr_timer = q->min_rnr_timer;
    a->port_num = 1;
    if (init) {
        memset(init, 0, sizeof *init);
        init->qp_context = q->qp.qp_context;
        init->send_cq = q->qp.send_cq;
        init->recv_cq = q->qp.recv_cq;
        init->cap = q->cap;
        init->qp_type = IBV_QPT_RC;
        init->sq_sig_all = q->sq_sig_all;
    }
    return 0;
}

static void qp_destroy(struct fv_fabric *f, struct fv_qp *q)
{
    qp_reset(f, q);
    q->dead = true;
}

static int fv_destroy_qp(struct ibv_qp *qp)
{
    struct fv_qp *q = (struct fv_qp *)qp;
    if (!q || q->dead)
        return EINVAL;
    qp_destroy(fvi_qp_node(q)->f, q);
    return 0;
}

static int fv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct fv_qp *q = (struct fv_qp *)qp;
    if (bad)
        *bad = wr;
    if (!q || !wr || q->dead)
        return EINVAL;
    struct fv_node *n = fvi_qp_node(q);
    struct fv_fabric *f = n->f;
    int err;
    if (take_fail(n, FV_OP_POST, &err))
        return err;
    if (n->frozen)
        return EAGAIN;
    enum ibv_qp_state st = q->qp.state;
    if (st != IBV_QPS_RTS && st != IBV_QPS_ERR)
        return EINVAL; /* RESET, INIT, RTR: the SQ is not open */
    for (; wr; wr = wr->next) {
        if (bad)
            *bad = wr;
        if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_READ)
            return EINVAL; /* the double models one-sided READ and WRITE only */
        if (wr->num_sge != 1 || !wr->sg_list || (uint32_t)wr->num_sge > q->cap.max_send_sge)
            return EINVAL;
        bool inl = (wr->send_flags & IBV_SEND_INLINE) != 0;
        if (inl && (wr->opcode != IBV_WR_RDMA_WRITE || wr->sg_list[0].length > q->cap.max_inline_data))
            return EINVAL;
        if (q->n_out >= q->cap.max_send_wr)
            return ENOMEM;
        struct fv_wqe *w = fv_calloc(1, sizeof *w);
        if (!w)
            return ENOMEM;
        w->seq = ++q->wqe_seq;
        w->wr_id = wr->wr_id;
        w->opcode = wr->opcode;
        w->signaled = (wr->send_flags & IBV_SEND_SIGNALED) != 0;
        w->laddr = wr->sg_list[0].addr;
        w->lkey = wr->sg_list[0].lkey;
        w->len = wr->sg_list[0].length;
        w->raddr = wr->wr.rdma.remote_addr;
        w->rkey = wr->wr.rdma.rkey;
        if (inl && w->len) {
            w->inl = fv_malloc(w->len);
            if (!w->inl) {
                fv_free(w);
                return ENOMEM;
            }
            memcpy(w->inl, (const void *)(uintptr_t)w->laddr, w->len);
        }
        w->posted_in_err = st == IBV_QPS_ERR;
        if (q->tail)
            q->tail->next = w;
        else
            q->head = w;
        q->tail = w;
        q->n_out++;
    }
    if (bad)
        *bad = NULL;
    if (st == IBV_QPS_RTS)
        fvi_kick(f, q);
    else
        fvi_schedule_flush(f, q);
    return 0;
}

static int fv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    struct fv_qp *q = (struct fv_qp *)qp;
    if (bad)
        *bad = wr;
    if (!q || !wr || q->dead || q->qp.state == IBV_QPS_RESET)
        return EINVAL;
    for (; wr; wr = wr->next) {
        if (bad)
            *bad = wr;
        if (q->n_rq >= q->cap.max_recv_wr)
            return ENOMEM;
        q->rq = fvi_grow(q->rq, &q->cap_rq, q->n_rq + 1, sizeof *q->rq);
        q->rq[q->n_rq++].wr_id = wr->wr_id;
    }
    if (bad)
        *bad = NULL;
    if (q->qp.state == IBV_QPS_ERR)
        fvi_schedule_flush(fvi_qp_node(q)->f, q);
    return 0;
}

/* ---------- fabric, nodes, knobs ---------- */

int fv_fabric_new(struct fv_fabric **out, const struct fv_config *cfg)
{
    if (!out)
        return KVP_ERR_INVALID;
    struct fv_config c;
    memset(&c, 0, sizeof c);
    if (cfg)
        c = *cfg;
    if (!c.latency_ns)
        c.latency_ns = 2000;
    if (!c.jitter_ns)
        c.jitter_ns = 1000;
    if (!c.ns_per_kib)
        c.ns_per_kib = 80;
    if (!c.mtu)
        c.mtu = 4096;
    if (!c.flush_delay_ns)
        c.flush_delay_ns = 5000;
    if (c.mtu < 256 || c.mtu > 4096)
        return KVP_ERR_INVALID;
    struct fv_fabric *f = fv_calloc(1, sizeof *f);
    if (!f)
        return KVP_ERR_NOMEM;
    f->cfg = c;
    f->rng = c.seed ^ 0x6a09e667f3bcc909ull;
    f->now = 1000000000ull;
    *out = f;
    return KVP_OK;
}

static void node_free(struct fv_node *n)
{
    for (struct fv_qp *q = n->qps, *x; q; q = x) {
        x = q->next;
        fvi_discard_all(q);
        fv_free(q->rq);
        fv_free(q);
    }
    for (struct fv_cq *c = n->cqs, *x; c; c = x) {
        x = c->next;
        fv_free(c->ring);
        fv_free(c);
    }
    for (struct fv_chan *c = n->chans, *x; c; c = x) {
        x = c->next;
        if (!c->dead && c->pid == getpid())
            close(c->ch.fd);
        fv_free(c->pend);
        fv_free(c);
    }
    for (struct fv_mr *m = n->mrs, *x; m; m = x) {
        x = m->next;
        fv_free(m);
    }
    for (struct fv_pd *p = n->pds, *x; p; p = x) {
        x = p->next;
        fv_free(p);
    }
    for (struct fv_ctx *c = n->ctxs, *x; c; c = x) {
        x = c->next;
        fv_free(c);
    }
    fv_free(n);
}

void fv_fabric_destroy(struct fv_fabric **fp)
{
    if (!fp || !*fp)
        return;
    struct fv_fabric *f = *fp;
    for (size_t i = 0; i < f->n_heap; i++)
        fvi_ev_free(f->heap[i]);
    fv_free(f->heap);
    for (struct fv_node *n = f->nodes, *x; n; n = x) {
        x = n->next;
        node_free(n);
    }
    fv_free(f->audit);
    fv_free(f->dmabufs);
    fv_free(f);
    *fp = NULL;
}

int fv_node_add(struct fv_fabric *f, const struct fv_node_config *cfg, struct fv_node **out)
{
    if (!f || !out)
        return KVP_ERR_INVALID;
    struct fv_node_config c;
    memset(&c, 0, sizeof c);
    if (cfg)
        c = *cfg;
    else
        c.n_devices = 1;
    if (c.n_devices < -1 || c.n_devices > FV_MAX_DEVS || c.flush < FV_FLUSH_ALL ||
        c.flush > FV_FLUSH_NEVER)
        return KVP_ERR_INVALID;
    if (!c.list_errno)
        c.list_errno = ENOSYS;
    if (!c.max_mr_size)
        c.max_mr_size = 1ull << 40;
    if (!c.max_qp_wr)
        c.max_qp_wr = 16384;
    if (!c.max_cqe)
        c.max_cqe = 65536;
    if (!c.link_layer)
        c.link_layer = IBV_LINK_LAYER_ETHERNET;
    struct fv_node *n = fv_calloc(1, sizeof *n);
    if (!n)
        return KVP_ERR_NOMEM;
    n->f = f;
    n->idx = f->n_nodes++;
    snprintf(n->name, sizeof n->name, "%s", c.name ? c.name : "");
    if (!n->name[0])
        snprintf(n->name, sizeof n->name, "node%d", n->idx);
    c.name = n->name;
    n->cfg = c;
    n->n_dev = c.n_devices > 0 ? c.n_devices : 0;
    for (int i = 0; i < n->n_dev; i++) {
        struct fv_dev *d = &n->devs[i];
        d->node = n;
        d->idx = i;
        d->dev.node_type = IBV_NODE_CA;
        d->dev.transport_type = IBV_TRANSPORT_IB;
        snprintf(d->dev.name, sizeof d->dev.name, "fake_%d_%d", n->idx, i);
        snprintf(d->dev.dev_name, sizeof d->dev.dev_name, "uverbs%d", i);
        /* Like an mlx5 RoCE port with one IPv4 address: 0/1 link-local fe80::<node>:<dev> as
         * RoCE v1/v2, 2/3 ::ffff:10.<node>.<dev>.1 as RoCE v1/v2 (on InfiniBand: all type IB).
         * no_rocev2 leaves the v2 entries empty (zero GIDs: "No suitable GID"). */
        for (int g = 0; g < FV_GIDS; g++) {
            bool v2 = g % 2 == 1;
            if (v2 && c.no_rocev2)
                continue;
            if (g < 2) {
                d->gid[g].raw[0] = 0xfe;
                d->gid[g].raw[1] = 0x80;
                d->gid[g].raw[13] = (uint8_t)n->idx;
                d->gid[g].raw[15] = (uint8_t)(i + 1);
            } else {
                d->gid[g].raw[10] = 0xff;
                d->gid[g].raw[11] = 0xff;
                d->gid[g].raw[12] = 10;
                d->gid[g].raw[13] = (uint8_t)n->idx;
                d->gid[g].raw[14] = (uint8_t)i;
                d->gid[g].raw[15] = 1;
            }
        }
        d->lid = (uint16_t)(1 + n->idx * FV_MAX_DEVS + i);
    }
    n->ops = (struct kvp_verbs_ops){
        .name = "fake",
        .impl = n,
        .get_device_list = fv_get_device_list,
        .free_device_list = fv_free_device_list,
        .get_device_name = fv_get_device_name,
        .open_device = fv_open_device,
        .close_device = fv_close_device,
        .query_device = fv_query_device,
        .query_port = fv_query_port,
        .query_gid = fv_query_gid,
        .query_gid_ex = fv_query_gid_ex,
        .get_async_event = fv_get_async_event,
        .ack_async_event = fv_ack_async_event,
        .alloc_pd = fv_alloc_pd,
        .dealloc_pd = fv_dealloc_pd,
        .reg_mr = fv_reg_mr,
        .reg_dmabuf_mr = fv_reg_dmabuf_mr,
        .dereg_mr = fv_dereg_mr,
        .create_comp_channel = fv_create_comp_channel,
        .destroy_comp_channel = fv_destroy_comp_channel,
        .create_cq = fv_create_cq,
        .destroy_cq = fv_destroy_cq,
        .poll_cq = fv_poll_cq,
        .req_notify_cq = fv_req_notify_cq,
        .get_cq_event = fv_get_cq_event,
        .ack_cq_events = fv_ack_cq_events,
        .create_qp = fv_create_qp,
        .modify_qp = fv_modify_qp,
        .query_qp = fv_query_qp,
        .destroy_qp = fv_destroy_qp,
        .post_send = fv_post_send,
        .post_recv = fv_post_recv,
    };
    if (f->nodes_tail)
        f->nodes_tail->next = n;
    else
        f->nodes = n;
    f->nodes_tail = n;
    *out = n;
    return KVP_OK;
}

const struct kvp_verbs_ops *fv_node_ops(struct fv_node *n)
{
    return n ? &n->ops : NULL;
}

void fv_node_freeze(struct fv_node *n, bool frozen)
{
    n->frozen = frozen;
}

void fv_node_kill(struct fv_node *n)
{
    if (n->killed)
        return;
    n->killed = true;
    n->frozen = false;
    for (struct fv_qp *q = n->qps; q; q = q->next)
        if (!q->dead)
            qp_destroy(n->f, q);
    for (struct fv_mr *m = n->mrs; m; m = m->next)
        if (!m->dead) {
            m->dead = true;
            n->locked -= m->len;
        }
    for (struct fv_cq *c = n->cqs; c; c = c->next)
        c->dead = true;
}

void fv_node_pause(struct fv_node *n, uint64_t ns)
{
    uint64_t until = n->f->now + ns;
    if (ns && until > n->paused_until)
        n->paused_until = until;
}

void fv_chan_spurious(struct ibv_comp_channel *chp, struct ibv_cq *cq)
{
    struct fv_chan *ch = (struct fv_chan *)chp;
    if (ch && cq && !ch->dead)
        fvi_chan_signal(ch, (struct fv_cq *)cq);
}

bool fv_node_killed(const struct fv_node *n)
{
    return n->killed;
}

void fv_node_partition(struct fv_node *n, bool partitioned)
{
    n->partitioned = partitioned;
}

void fv_node_fail_next(struct fv_node *n, enum fv_op op, int err)
{
    if (n && op >= 0 && op < FV_OP__N)
        n->fail_next[op] = err;
}

void fv_qp_set_delay(struct ibv_qp *qp, uint64_t extra_ns)
{
    ((struct fv_qp *)qp)->extra_delay = extra_ns;
}

void fv_qp_drop_acks(struct ibv_qp *qp, bool drop)
{
    ((struct fv_qp *)qp)->drop_acks = drop;
}

enum ibv_qp_state fv_qp_state(struct ibv_qp *qp)
{
    struct fv_qp *q = (struct fv_qp *)qp;
    return q->dead ? IBV_QPS_RESET : q->qp.state;
}

uint32_t fv_qp_outstanding(struct ibv_qp *qp)
{
    return ((struct fv_qp *)qp)->n_out;
}

#else
/* Without rdma-core headers the double is not built (see cmake/deps.cmake). */
typedef int kvp_fakeverbs_unused;
#endif
