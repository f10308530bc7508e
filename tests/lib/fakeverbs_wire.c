/*
 * fakeverbs_wire.c — the verbs double's engine: the event queue and virtual clock, packets on
 * the wire (PSNs, ACKs, NAKs, retransmits), responder execution, completions in order, flushes
 * by provider mode, and the DMA audit log. See fakeverbs.h for the model; fakeverbs.c has the
 * verbs ops. Single-threaded: no locks, no atomics.
 */
#ifdef KVP_HAVE_VERBS

#include "tests/lib/fakeverbs_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvpool.h"

/* ---------- small helpers ---------- */

uint64_t fvi_rnd(struct fv_fabric *f)
{
    /* splitmix64 */
    uint64_t z = (f->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void *fvi_grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return p;
    size_t nc = *cap ? *cap * 2 : 16;
    while (nc < need)
        nc *= 2;
    void *q = fv_realloc(p, nc * elem);
    if (!q)
        abort(); /* test double: out of memory ends the test */
    *cap = nc;
    return q;
}

uint64_t fv_ack_timeout_ns(uint8_t timeout)
{
    if (timeout == 0)
        return 0;
    if (timeout > 31)
        timeout = 31;
    return 4096ull << timeout;
}

static uint64_t ser_ns(const struct fv_fabric *f, uint64_t bytes)
{
    uint64_t ns = (bytes * f->cfg.ns_per_kib + 1023) / 1024;
    return ns ? ns : 1;
}

/* ---------- event heap ---------- */

static bool ev_before(const struct fv_ev *a, const struct fv_ev *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

/* Insert e with its current (t, seq). */
static void heap_insert(struct fv_fabric *f, struct fv_ev *e)
{
    f->heap = fvi_grow(f->heap, &f->cap_heap, f->n_heap + 1, sizeof *f->heap);
    size_t i = f->n_heap++;
    f->heap[i] = e;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ev_before(f->heap[i], f->heap[p]))
            break;
        struct fv_ev *t = f->heap[p];
        f->heap[p] = f->heap[i];
        f->heap[i] = t;
        i = p;
    }
}

static void heap_push(struct fv_fabric *f, struct fv_ev *e)
{
    e->seq = ++f->seq;
    heap_insert(f, e);
}

static struct fv_ev *heap_pop(struct fv_fabric *f)
{
    if (!f->n_heap)
        return NULL;
    struct fv_ev *top = f->heap[0];
    f->heap[0] = f->heap[--f->n_heap];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < f->n_heap && ev_before(f->heap[l], f->heap[m]))
            m = l;
        if (r < f->n_heap && ev_before(f->heap[r], f->heap[m]))
            m = r;
        if (m == i)
            break;
        struct fv_ev *t = f->heap[m];
        f->heap[m] = f->heap[i];
        f->heap[i] = t;
        i = m;
    }
    return top;
}

static struct fv_ev *ev_new(int kind)
{
    struct fv_ev *e = fv_calloc(1, sizeof *e);
    if (!e)
        abort();
    e->kind = kind;
    return e;
}

void fvi_ev_free(struct fv_ev *e)
{
    if (e) {
        fv_free(e->data);
        fv_free(e);
    }
}

/* Schedule a packet leaving `from` at `depart`: arrival after latency, jitter and the QP's
 * extra delay, never before an earlier packet of the same QP (RC order). */
static void send_pkt(struct fv_fabric *f, struct fv_qp *from, struct fv_ev *e, uint64_t depart)
{
    uint64_t jit = f->cfg.jitter_ns ? fvi_rnd(f) % (f->cfg.jitter_ns + 1) : 0;
    uint64_t arr = depart + f->cfg.latency_ns + jit + from->extra_delay;
    if (arr < from->last_arr)
        arr = from->last_arr;
    from->last_arr = arr;
    e->from = from;
    e->depart = depart;
    e->t = arr;
    f->st.packets++;
    heap_push(f, e);
}

/* A QP stops sending (ERR, RESET, destroy, kill): packets that have not left yet never will,
 * and its retransmit timers stop. Packets already on the wire are untouched. */
void fvi_cancel_departures(struct fv_fabric *f, struct fv_qp *q, bool also_flush)
{
    for (size_t i = 0; i < f->n_heap; i++) {
        struct fv_ev *e = f->heap[i];
        if (e->from == q && e->depart > f->now)
            e->cancelled = true;
        if (e->kind == EV_TIMER && e->req == q)
            e->cancelled = true;
        if (also_flush && e->kind == EV_FLUSH && e->req == q)
            e->cancelled = true;
    }
}

/* ---------- CQs ---------- */

void fvi_chan_signal(struct fv_chan *ch, struct fv_cq *cq)
{
    ch->pend = fvi_grow(ch->pend, &ch->cap_pend, ch->n_pend + 1, sizeof *ch->pend);
    ch->pend[ch->n_pend++] = cq;
    uint64_t one = 1;
    /* Another process's channel (fv_shared_init): its fd number means nothing here; it finds
     * the event when it polls (no wake-up across processes). */
    if (ch->pid == (int)getpid() && write(ch->ch.fd, &one, sizeof one) < 0) {
        /* EAGAIN at the eventfd's limit: the fd is readable anyway. */
    }
}

static void ctx_async(struct fv_ctx *c, enum ibv_event_type type, struct fv_cq *cq)
{
    if (c->n_ev >= (int)(sizeof c->ev / sizeof c->ev[0]))
        return;
    c->ev[c->n_ev].event_type = type;
    c->ev[c->n_ev].element.cq = &cq->cq;
    c->n_ev++;
}

void fvi_cq_push(struct fv_fabric *f, struct fv_cq *cq, const struct ibv_wc *wc)
{
    if (!cq || cq->dead)
        return;
    if (cq->overrun || cq->count == cq->cap) {
        if (!cq->overrun)
            ctx_async(cq->c, IBV_EVENT_CQ_ERR, cq);
        cq->overrun = true;
        f->st.cq_overruns++;
        return;
    }
    cq->ring[(cq->head + cq->count) % cq->cap] = *wc;
    cq->count++;
    f->st.cqes++;
    if (wc->status == IBV_WC_WR_FLUSH_ERR)
        f->st.flushed++;
    if (cq->armed && cq->ch) {
        cq->armed = false;
        fvi_chan_signal(cq->ch, cq);
    }
}

static void wqe_cqe(struct fv_fabric *f, struct fv_qp *q, const struct fv_wqe *w,
                    enum ibv_wc_status status)
{
    struct ibv_wc wc;
    memset(&wc, 0, sizeof wc);
    wc.wr_id = w->wr_id;
    wc.status = status;
    wc.opcode = w->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
    wc.byte_len = status == IBV_WC_SUCCESS && w->opcode == IBV_WR_RDMA_READ ? w->len : 0;
    wc.qp_num = q->qp.qp_num;
    wc.vendor_err = status == IBV_WC_SUCCESS ? 0 : 0x100u + (uint32_t)status;
    fvi_cq_push(f, q->scq, &wc);
}

/* ---------- QP send-queue machinery ---------- */

static struct fv_wqe *wqe_find(struct fv_qp *q, uint64_t wseq)
{
    for (struct fv_wqe *w = q->head; w; w = w->next)
        if (w->seq == wseq)
            return w;
    return NULL;
}

static void wqe_free(struct fv_wqe *w)
{
    fv_free(w->inl);
    fv_free(w);
}

void fvi_discard_all(struct fv_qp *q)
{
    struct fv_wqe *w = q->head;
    while (w) {
        struct fv_wqe *n = w->next;
        wqe_free(w);
        w = n;
    }
    q->head = q->tail = NULL;
    q->n_out = 0;
    q->n_rq = 0;
}

void fvi_flush_qp(struct fv_fabric *f, struct fv_qp *q)
{
    int mode = fvi_qp_node(q)->cfg.flush;
    struct fv_wqe **pp = &q->head;
    q->tail = NULL;
    while (*pp) {
        struct fv_wqe *w = *pp;
        if (mode == FV_FLUSH_NOT_LATE && w->posted_in_err) {
            q->tail = w;
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        wqe_cqe(f, q, w, IBV_WC_WR_FLUSH_ERR);
        wqe_free(w);
        q->n_out--;
    }
    for (size_t i = 0; i < q->n_rq; i++) {
        struct ibv_wc wc;
        memset(&wc, 0, sizeof wc);
        wc.wr_id = q->rq[i].wr_id;
        wc.status = IBV_WC_WR_FLUSH_ERR;
        wc.opcode = IBV_WC_RECV;
        wc.qp_num = q->qp.qp_num;
        fvi_cq_push(f, q->rcq, &wc);
    }
    q->n_rq = 0;
    q->flush_pending = false;
}

void fvi_schedule_flush(struct fv_fabric *f, struct fv_qp *q)
{
    int mode = fvi_qp_node(q)->cfg.flush;
    if (mode == FV_FLUSH_ALL || mode == FV_FLUSH_NOT_LATE) {
        struct fv_ev *e = ev_new(EV_FLUSH);
        e->req = q;
        e->t = f->now + f->cfg.flush_delay_ns;
        heap_push(f, e);
    } else if (mode == FV_FLUSH_ON_POLL) {
        q->flush_pending = true;
    }
}

void fvi_enter_err(struct fv_fabric *f, struct fv_qp *q)
{
    if (q->qp.state == IBV_QPS_ERR)
        return;
    q->qp.state = IBV_QPS_ERR;
    fvi_cancel_departures(f, q, false);
    fvi_schedule_flush(f, q);
}

/* Pop completed WRs from the head of the SQ in post order; the first error moves the QP to ERR
 * (its CQE comes first, the flushes after it). */
static void complete_in_order(struct fv_fabric *f, struct fv_qp *q)
{
    while (q->head && q->head->acked && q->qp.state == IBV_QPS_RTS) {
        struct fv_wqe *w = q->head;
        q->head = w->next;
        if (!q->head)
            q->tail = NULL;
        q->n_out--;
        if (w->failed) {
            wqe_cqe(f, q, w, w->status);
            wqe_free(w);
            fvi_enter_err(f, q);
            return;
        }
        if (w->signaled || q->sq_sig_all)
            wqe_cqe(f, q, w, IBV_WC_SUCCESS);
        wqe_free(w);
    }
}

static struct fv_mr *mr_by_key(struct fv_node *n, uint32_t key, bool remote)
{
    for (struct fv_mr *m = n->mrs; m; m = m->next)
        if (!m->dead && (remote ? m->mr.rkey : m->mr.lkey) == key)
            return m;
    return NULL;
}

static bool mr_covers(const struct fv_mr *m, uint64_t a, uint64_t len)
{
    return a >= m->iova && len <= m->len && a - m->iova <= m->len - len;
}

/* The local SGE of w, or NULL (then the WR fails with LOC_PROT_ERR). */
static struct fv_mr *local_mr(struct fv_qp *q, const struct fv_wqe *w)
{
    struct fv_mr *m = mr_by_key(fvi_qp_node(q), w->lkey, false);
    if (!m || m->pd != q->pd || !mr_covers(m, w->laddr, w->len))
        return NULL;
    if (w->opcode == IBV_WR_RDMA_READ && !(m->access & IBV_ACCESS_LOCAL_WRITE))
        return NULL;
    return m;
}

static void arm_timer(struct fv_fabric *f, struct fv_qp *q, struct fv_wqe *w, uint64_t last_depart)
{
    uint64_t to = fv_ack_timeout_ns(q->timeout);
    if (!to)
        return; /* timeout 0: no ACK timer, the QP waits forever (why kvpool never uses 0) */
    struct fv_ev *e = ev_new(EV_TIMER);
    e->req = q;
    e->wseq = w->seq;
    e->timer_gen = ++w->timer_gen;
    e->t = last_depart + to;
    heap_push(f, e);
}

static void transmit(struct fv_fabric *f, struct fv_qp *q, struct fv_wqe *w)
{
    uint64_t t = f->now > q->tx_free ? f->now : q->tx_free;
    if (w->opcode == IBV_WR_RDMA_WRITE) {
        const uint8_t *src = w->inl;
        if (!src) {
            struct fv_mr *m = local_mr(q, w);
            src = m ? m->host + (w->laddr - m->iova) : NULL;
        }
        uint32_t mtu = f->cfg.mtu;
        for (uint32_t i = 0; i < w->npkts; i++) {
            struct fv_ev *e = ev_new(EV_REQ);
            e->op = IBV_WR_RDMA_WRITE;
            e->req = q;
            e->wseq = w->seq;
            e->wr_id = w->wr_id;
            e->psn = (w->psn + i) & PSN_MASK;
            e->pkt = i;
            e->npkts = w->npkts;
            e->wr_raddr = w->raddr;
            e->wr_len = w->len;
            e->rkey = w->rkey;
            e->off = i * mtu;
            e->len = w->len - e->off < mtu ? w->len - e->off : mtu;
            e->ah = q->ah;
            e->dest_qpn = q->dest_qpn;
            if (e->len) {
                e->data = fv_malloc(e->len);
                if (!e->data)
                    abort();
                if (src)
                    memcpy(e->data, src + e->off, e->len);
            }
            t += ser_ns(f, e->len + 64);
            send_pkt(f, q, e, t);
        }
    } else {
        struct fv_ev *e = ev_new(EV_REQ);
        e->op = IBV_WR_RDMA_READ;
        e->req = q;
        e->wseq = w->seq;
        e->wr_id = w->wr_id;
        e->psn = w->psn;
        e->npkts = w->npkts;
        e->wr_raddr = w->raddr;
        e->wr_len = w->len;
        e->rkey = w->rkey;
        e->ah = q->ah;
        e->dest_qpn = q->dest_qpn;
        t += ser_ns(f, 64);
        send_pkt(f, q, e, t);
    }
    q->tx_free = t;
    w->sent = true;
    arm_timer(f, q, w, t);
}

/* Send every WR not yet sent, in order (RTS only). A bad local SGE fails its WR at once. */
void fvi_kick(struct fv_fabric *f, struct fv_qp *q)
{
    for (struct fv_wqe *w = q->head; w && q->qp.state == IBV_QPS_RTS; w = w->next) {
        if (w->sent)
            continue;
        if (!w->inl && !local_mr(q, w)) {
            w->sent = w->acked = w->failed = true;
            w->status = IBV_WC_LOC_PROT_ERR;
            complete_in_order(f, q);
            return;
        }
        w->psn = q->sq_psn;
        w->npkts = w->len ? (w->len + f->cfg.mtu - 1) / f->cfg.mtu : 1;
        q->sq_psn = (q->sq_psn + w->npkts) & PSN_MASK;
        transmit(f, q, w);
    }
}

/* ---------- packet delivery ---------- */

static bool node_reachable(const struct fv_node *n)
{
    return !n->killed && !n->partitioned;
}

static struct fv_qp *resolve(struct fv_fabric *f, const struct ibv_ah_attr *ah, uint32_t qpn)
{
    for (struct fv_node *n = f->nodes; n; n = n->next) {
        for (int d = 0; d < n->n_dev; d++) {
            struct fv_dev *dv = &n->devs[d];
            bool match = false;
            if (ah->is_global) {
                for (int g = 0; g < FV_GIDS; g++)
                    match |= memcmp(dv->gid[g].raw, ah->grh.dgid.raw, 16) == 0;
            } else {
                match = dv->lid == ah->dlid;
            }
            if (!match)
                continue;
            for (struct fv_qp *q = n->qps; q; q = q->next)
                if (!q->dead && q->qp.qp_num == qpn && q->pd->c->d == dv)
                    return q;
        }
    }
    return NULL;
}

static void reply(struct fv_fabric *f, struct fv_qp *r, const struct fv_ev *req, int kind,
                  int status)
{
    if (kind == EV_ACK && req->req->drop_acks) {
        f->st.packets++;
        f->st.dropped++;
        return;
    }
    struct fv_ev *e = ev_new(kind);
    e->req = req->req;
    e->wseq = req->wseq;
    e->wr_id = req->wr_id;
    e->status = status;
    send_pkt(f, r, e, f->now);
}

static bool remote_ok(struct fv_qp *r, const struct fv_ev *e, int need)
{
    if (!(r->access & need))
        return false;
    struct fv_mr *m = mr_by_key(fvi_qp_node(r), e->rkey, true);
    if (!m || m->pd != r->pd || !(m->access & need))
        return false;
    return mr_covers(m, e->wr_raddr, e->wr_len);
}

static void audit(struct fv_fabric *f, uint8_t kind, const void *addr, size_t len,
                  const struct fv_ev *e)
{
    struct fv_qp *rq = e->req;
    bool stopped = rq->dead || rq->qp.state != IBV_QPS_RTS;
    f->audit = fvi_grow(f->audit, &f->cap_audit, f->n_audit + 1, sizeof *f->audit);
    struct fv_dma *d = &f->audit[f->n_audit++];
    d->t_ns = f->now;
    d->addr = (uintptr_t)addr;
    d->len = len;
    d->kind = kind;
    d->qp_num = rq->qp.qp_num;
    d->wr_id = e->wr_id;
    d->requester_stopped = stopped;
    if (stopped)
        f->st.late_placements++;
}

static void on_req(struct fv_fabric *f, struct fv_ev *e)
{
    struct fv_qp *r = resolve(f, &e->ah, e->dest_qpn);
    if (!r || !node_reachable(fvi_qp_node(r)) || fvi_qp_node(e->from)->partitioned ||
        (r->qp.state != IBV_QPS_RTR && r->qp.state != IBV_QPS_RTS) ||
        r->dest_qpn != e->from->qp.qp_num) {
        f->st.dropped++;
        return;
    }
    uint32_t ahead = (e->psn - r->epsn) & PSN_MASK;
    uint32_t behind = (r->epsn - e->psn) & PSN_MASK;
    bool dup = ahead != 0 && behind != 0 && behind <= (1u << 23);
    if (ahead != 0 && !dup) {
        f->st.dropped++; /* a gap: wait for the requester's retransmit */
        return;
    }
    if (e->op == IBV_WR_RDMA_WRITE) {
        if (dup) {
            if (e->pkt + 1 == e->npkts)
                reply(f, r, e, EV_ACK, 0);
            return;
        }
        if (!remote_ok(r, e, IBV_ACCESS_REMOTE_WRITE)) {
            reply(f, r, e, EV_NAK, IBV_WC_REM_ACCESS_ERR);
            return;
        }
        struct fv_mr *m = mr_by_key(fvi_qp_node(r), e->rkey, true);
        uint8_t *dst = m->host + (e->wr_raddr - m->iova) + e->off;
        if (e->len) {
            memcpy(dst, e->data, e->len);
            audit(f, FV_DMA_WRITE, dst, e->len, e);
        }
        r->epsn = (r->epsn + 1) & PSN_MASK;
        if (e->pkt + 1 == e->npkts)
            reply(f, r, e, EV_ACK, 0);
        return;
    }
    /* READ request: answer with npkts response packets read from memory now. */
    if (!dup && !remote_ok(r, e, IBV_ACCESS_REMOTE_READ)) {
        reply(f, r, e, EV_NAK, IBV_WC_REM_ACCESS_ERR);
        return;
    }
    if (dup && !remote_ok(r, e, IBV_ACCESS_REMOTE_READ))
        return;
    if (!dup)
        r->epsn = (r->epsn + e->npkts) & PSN_MASK;
    struct fv_mr *m = mr_by_key(fvi_qp_node(r), e->rkey, true);
    const uint8_t *src = m->host + (e->wr_raddr - m->iova);
    uint32_t mtu = f->cfg.mtu;
    uint64_t t = f->now;
    for (uint32_t i = 0; i < e->npkts; i++) {
        struct fv_ev *p = ev_new(EV_RESP);
        p->req = e->req;
        p->wseq = e->wseq;
        p->wr_id = e->wr_id;
        p->pkt = i;
        p->npkts = e->npkts;
        p->off = i * mtu;
        p->len = e->wr_len - p->off < mtu ? e->wr_len - p->off : mtu;
        if (p->len) {
            p->data = fv_malloc(p->len);
            if (!p->data)
                abort();
            memcpy(p->data, src + p->off, p->len);
        }
        t += ser_ns(f, p->len + 64);
        send_pkt(f, r, p, t);
    }
}

static bool requester_live(struct fv_fabric *f, struct fv_ev *e)
{
    struct fv_qp *q = e->req;
    bool open = q->qp.state == IBV_QPS_RTS ||
                (e->kind == EV_RESP && q->qp.state == IBV_QPS_ERR && fvi_qp_node(q)->cfg.err_keeps_placing);
    if (q->dead || !open || !node_reachable(fvi_qp_node(q)) ||
        fvi_qp_node(e->from)->partitioned) {
        f->st.dropped++;
        return false;
    }
    return true;
}

static void on_resp(struct fv_fabric *f, struct fv_ev *e)
{
    if (!requester_live(f, e))
        return;
    struct fv_qp *q = e->req;
    struct fv_wqe *w = wqe_find(q, e->wseq);
    if (!w || w->acked || e->pkt != w->rd_next) {
        f->st.dropped++;
        return;
    }
    struct fv_mr *m = local_mr(q, w);
    if (!m) {
        w->acked = w->failed = true;
        w->status = IBV_WC_LOC_PROT_ERR;
        complete_in_order(f, q);
        return;
    }
    uint8_t *dst = m->host + (w->laddr - m->iova) + e->off;
    if (e->len) {
        memcpy(dst, e->data, e->len);
        audit(f, FV_DMA_READ_RESP, dst, e->len, e);
    }
    if (++w->rd_next == w->npkts) {
        w->acked = true;
        complete_in_order(f, q);
    }
}

static void on_ack(struct fv_fabric *f, struct fv_ev *e)
{
    if (!requester_live(f, e))
        return;
    struct fv_qp *q = e->req;
    struct fv_wqe *w = wqe_find(q, e->wseq);
    if (!w)
        return;
    /* ACKs are cumulative: every earlier WRITE was executed too. */
    for (struct fv_wqe *x = q->head; x; x = x->next) {
        if (x->opcode == IBV_WR_RDMA_WRITE && x->sent)
            x->acked = true;
        if (x == w)
            break;
    }
    complete_in_order(f, q);
}

static void on_nak(struct fv_fabric *f, struct fv_ev *e)
{
    if (!requester_live(f, e))
        return;
    struct fv_wqe *w = wqe_find(e->req, e->wseq);
    if (!w || w->acked)
        return;
    w->acked = w->failed = true;
    w->status = (enum ibv_wc_status)e->status;
    complete_in_order(f, e->req);
}

static void on_timer(struct fv_fabric *f, struct fv_ev *e)
{
    struct fv_qp *q = e->req;
    if (q->dead || q->qp.state != IBV_QPS_RTS)
        return;
    struct fv_wqe *w = wqe_find(q, e->wseq);
    if (!w || w->acked || w->timer_gen != e->timer_gen)
        return;
    if (++w->retries > q->retry_cnt) {
        w->acked = w->failed = true;
        w->status = IBV_WC_RETRY_EXC_ERR;
        complete_in_order(f, q);
        return;
    }
    f->st.retransmits++;
    transmit(f, q, w);
}

/* The node a packet event is arriving at (NULL for timers, flushes, unknown addresses). */
static struct fv_node *arrival_node(struct fv_fabric *f, const struct fv_ev *e)
{
    if (e->kind == EV_RESP || e->kind == EV_ACK || e->kind == EV_NAK)
        return fvi_qp_node(e->req);
    if (e->kind != EV_REQ)
        return NULL;
    for (struct fv_node *n = f->nodes; n; n = n->next)
        for (int d = 0; d < n->n_dev; d++) {
            const struct fv_dev *dv = &n->devs[d];
            if (!e->ah.is_global && dv->lid == e->ah.dlid)
                return n;
            for (int g = 0; e->ah.is_global && g < FV_GIDS; g++)
                if (memcmp(dv->gid[g].raw, e->ah.grh.dgid.raw, 16) == 0)
                    return n;
        }
    return NULL;
}

/* Returns false when the event was put back (a PFC pause at its node); it is then not freed. */
static bool deliver(struct fv_fabric *f, struct fv_ev *e)
{
    if (e->cancelled)
        return true;
    struct fv_node *to = arrival_node(f, e);
    if (to && to->paused_until >= f->now) {
        /* Held upstream until the pause ends. The event keeps its sequence number, so packets
         * of one QP still arrive in the order they left. */
        e->t = to->paused_until + 1;
        heap_insert(f, e);
        return false;
    }
    switch (e->kind) {
    case EV_REQ: on_req(f, e); break;
    case EV_RESP: on_resp(f, e); break;
    case EV_ACK: on_ack(f, e); break;
    case EV_NAK: on_nak(f, e); break;
    case EV_TIMER: on_timer(f, e); break;
    case EV_FLUSH:
        if (!e->req->dead && e->req->qp.state == IBV_QPS_ERR)
            fvi_flush_qp(f, e->req);
        break;
    }
    return true;
}

/* ---------- clock ---------- */

uint64_t fv_now(const struct fv_fabric *f)
{
    return f->now;
}

uint64_t fv_next_event(const struct fv_fabric *f)
{
    return f->n_heap ? f->heap[0]->t : UINT64_MAX;
}

bool fv_step(struct fv_fabric *f)
{
    struct fv_ev *e = heap_pop(f);
    if (!e)
        return false;
    if (e->t > f->now)
        f->now = e->t;
    if (deliver(f, e))
        fvi_ev_free(e);
    return true;
}

void fv_run_until(struct fv_fabric *f, uint64_t t_ns)
{
    while (f->n_heap && f->heap[0]->t <= t_ns)
        fv_step(f);
    if (t_ns > f->now)
        f->now = t_ns;
}

void fv_advance(struct fv_fabric *f, uint64_t ns)
{
    fv_run_until(f, f->now + ns);
}

void fv_run_idle(struct fv_fabric *f, uint64_t limit_ns)
{
    uint64_t end = f->now + limit_ns;
    while (f->n_heap && f->heap[0]->t <= end)
        fv_step(f);
}

/* ---------- audit ---------- */

size_t fv_audit_count(const struct fv_fabric *f)
{
    return f->n_audit;
}

const struct fv_dma *fv_audit_get(const struct fv_fabric *f, size_t i)
{
    return i < f->n_audit ? &f->audit[i] : NULL;
}

size_t fv_audit_placed_after(const struct fv_fabric *f, const void *addr, size_t len,
                             uint64_t after_ns, const struct fv_dma **first)
{
    uintptr_t a = (uintptr_t)addr, e = a + len;
    size_t k = 0;
    if (first)
        *first = NULL;
    for (size_t i = 0; i < f->n_audit; i++) {
        const struct fv_dma *d = &f->audit[i];
        if (d->t_ns <= after_ns || d->addr >= e || d->addr + d->len <= a)
            continue;
        if (first && !*first)
            *first = d;
        k++;
    }
    return k;
}

uint64_t fv_audit_hash(const struct fv_fabric *f)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < f->n_audit; i++) {
        const struct fv_dma *d = &f->audit[i];
        uint64_t v[5] = {d->t_ns, d->len, d->kind, d->qp_num, d->wr_id};
        for (int j = 0; j < 5; j++) {
            h ^= v[j];
            h *= 0x100000001b3ull;
        }
    }
    return h;
}

void fv_stats_get(const struct fv_fabric *f, struct fv_stats *out)
{
    *out = f->st;
}

#else
/* Without rdma-core headers the double is not built (see cmake/deps.cmake). */
typedef int kvp_fakeverbs_wire_unused;
#endif
