/* rdma_run.c — the rdma transport's non-blocking core (submit, progress, fence, abort) and the
 * blocking kvp_rdma_run over it; see rdma_xport.h.
 *
 * An xslice becomes pieces of at most slice_bytes that never cross an MR chunk on either side
 * (kvp_rdma_spans for registered memory; one bounce slot per piece for other host memory).
 * Pieces wait in their endpoint's FIFO and are posted round-robin over its QPs as QP credits,
 * CQ credits and bounce slots allow; completions come back through the reaper with the piece
 * index as cookie (the slot's generation check already drops a stale CQE before that).
 *
 * Fencing (note §2.3): kvp_rdma_fence moves every QP of the endpoint to ERR
 * (kvp_rdma_fence_begin) and progress steps the fence: an xslice is reported only when each of
 * its WRs has a polled completion. kvp_rdma_abort runs the fence's wedged path at once: the QPs
 * are destroyed and the MRs the endpoint's posted WRs could reach are deregistered, then
 * registered again under new keys (no QP that knew the old keys exists any more). A fenced
 * endpoint takes no more work; the caller reconnects with a new generation.
 */
#include "actors/transfer/rdma/rdma_xport_internal.h"

#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define MS_NS 1000000ull
/* The engine decides when a fence has waited long enough (it calls abort): the fence helper's
 * own bound is set out of reach for fences the core starts. */
#define NO_BOUND_NS (UINT64_MAX / 4)

/* ------------------------------------------------------------------ pools */

static uint32_t piece_alloc(struct kvp_rdma_xport *x)
{
    if (x->pc_free == KVP_RDMA_NONE) {
        uint32_t nc = x->pc_cap ? x->pc_cap * 2 : 256;
        struct kvp_rdma_piece *np = realloc(x->pc, (size_t)nc * sizeof *np);
        if (!np)
            return KVP_RDMA_NONE;
        for (uint32_t i = x->pc_cap; i < nc; i++)
            np[i] = (struct kvp_rdma_piece){.next = i + 1 < nc ? i + 1 : KVP_RDMA_NONE, .bslot = -1};
        x->pc = np;
        x->pc_free = x->pc_cap;
        x->pc_cap = nc;
    }
    uint32_t i = x->pc_free;
    x->pc_free = x->pc[i].next;
    x->pc[i].next = KVP_RDMA_NONE;
    return i;
}

static void piece_free(struct kvp_rdma_xport *x, uint32_t i)
{
    x->pc[i] = (struct kvp_rdma_piece){.next = x->pc_free, .bslot = -1};
    x->pc_free = i;
}

static uint32_t xs_alloc(struct kvp_rdma_xport *x)
{
    if (x->xs_free == KVP_RDMA_NONE) {
        uint32_t nc = x->xs_cap ? x->xs_cap * 2 : 128;
        struct kvp_rdma_xs *np = realloc(x->xs, (size_t)nc * sizeof *np);
        if (!np)
            return KVP_RDMA_NONE;
        for (uint32_t i = x->xs_cap; i < nc; i++)
            np[i] = (struct kvp_rdma_xs){.next_free = i + 1 < nc ? i + 1 : KVP_RDMA_NONE};
        x->xs_free = x->xs_cap;
        x->xs = np;
        x->xs_cap = nc;
    }
    uint32_t i = x->xs_free;
    x->xs_free = x->xs[i].next_free;
    return i;
}

static int ready_push(struct kvp_rdma_xport *x, uint32_t xi)
{
    if (x->n_ready == x->ready_cap) {
        size_t nc = x->ready_cap ? x->ready_cap * 2 : 128;
        uint32_t *np = realloc(x->ready, nc * sizeof *np);
        if (!np)
            return KVP_ERR_NOMEM;
        x->ready = np;
        x->ready_cap = nc;
    }
    x->ready[x->n_ready++] = xi;
    return KVP_OK;
}

void kvp_rdma_core_fini(struct kvp_rdma_xport *x)
{
    free(x->pc);
    free(x->xs);
    free(x->ready);
    x->pc = NULL;
    x->xs = NULL;
    x->ready = NULL;
    x->pc_cap = x->xs_cap = 0;
    x->n_ready = x->ready_cap = 0;
}

size_t kvp_rdma_inflight(const struct kvp_rdma_xport *x) { return x ? x->inflight : 0; }

/* ------------------------------------------------------------------ piece completion */

static void bounce_release(struct kvp_rdma_xport *x, struct kvp_rdma_piece *p)
{
    if (p->bslot >= 0) {
        x->bounce.free_idx[x->bounce.n_free++] = (uint32_t)p->bslot;
        p->bslot = -1;
    }
}

/* A piece is over with `status`; `ok_in_time` when its bytes moved before any fence. */
static void piece_done(struct kvp_rdma_xport *x, uint32_t pi, int status)
{
    struct kvp_rdma_piece *p = &x->pc[pi];
    struct kvp_rdma_xs *s = &x->xs[p->xs];
    if (p->state == PC_POSTED && p->ep->posted)
        p->ep->posted--;
    if (status == KVP_OK && p->bslot >= 0 && p->op == KVP_RDMA_READ)
        memcpy((void *)(uintptr_t)p->laddr, x->bounce.mem + (size_t)p->bslot * x->bounce.slot_bytes,
               p->len);
    if (status == KVP_OK && p->op == KVP_RDMA_READ && p->ent && p->ent->needs_flush) {
        s->gpu_read = true;
        s->ordinal = p->ent->ordinal;
    }
    bounce_release(x, p);
    p->state = PC_DONE;
    if (status != KVP_OK && !s->status)
        s->status = status;
    if (--s->left == 0) {
        s->ready = true;
        ready_push(x, p->xs);
    }
    /* pieces of the pending FIFO are unlinked by the FIFO walk; posted ones free here */
}

static void on_wc(void *arg, struct kvp_rdma_qp *q, uint64_t cookie, bool late,
                  const struct ibv_wc *wc)
{
    (void)q;
    struct kvp_rdma_xport *x = arg;
    x->st.completed++;
    uint32_t pi = (uint32_t)cookie;
    if (pi >= x->pc_cap || x->pc[pi].state != PC_POSTED)
        return;
    struct kvp_rdma_piece *p = &x->pc[pi];
    struct kvp_rdma_ep *ep = p->ep;
    int st;
    if (wc->status == IBV_WC_SUCCESS)
        st = late ? KVP_ERR_TIMEOUT : KVP_OK; /* completed late: the caller already gave up */
    else
        st = KVP_ERR_TRANSFER;
    if (wc->status != IBV_WC_SUCCESS && wc->status != IBV_WC_WR_FLUSH_ERR && ep->state == EP_LIVE) {
        kvp_log_warn(x->who, "rdma: segment %u: %s of %u B failed: %s (vendor_err %u); fencing "
                             "the endpoint", ep->segment_id,
                     p->op == KVP_RDMA_READ ? "READ" : "WRITE", p->len,
                     ibv_wc_status_str(wc->status), wc->vendor_err);
    }
    piece_done(x, pi, st);
    piece_free(x, pi);
    if (st == KVP_ERR_TRANSFER && ep->state == EP_LIVE)
        kvp_rdma_ep_fence_begin(x, ep); /* its QP is in ERR: the rest will flush */
}

/* ------------------------------------------------------------------ submit */

/* Unlink xslice xi's pieces from ep's pending FIFO (those not posted yet) and free them; with
 * `done`, each ends with `status` first (piece_done). */
static void pend_drop(struct kvp_rdma_xport *x, struct kvp_rdma_ep *ep, uint32_t xi, bool done, int status)
{
    uint32_t prev = KVP_RDMA_NONE;
    for (uint32_t i = ep->pend_head; i != KVP_RDMA_NONE;) {
        uint32_t nx = x->pc[i].next;
        if (x->pc[i].xs == xi) {
            if (prev == KVP_RDMA_NONE)
                ep->pend_head = nx;
            else
                x->pc[prev].next = nx;
            if (ep->pend_tail == i)
                ep->pend_tail = prev;
            if (done)
                piece_done(x, i, status);
            piece_free(x, i);
        } else {
            prev = i;
        }
        i = nx;
    }
}

static int piece_add(struct kvp_rdma_xport *x, struct kvp_rdma_ep *ep, uint32_t xi,
                     const struct kvp_rdma_piece *tmpl)
{
    uint32_t pi = piece_alloc(x);
    if (pi == KVP_RDMA_NONE)
        return KVP_ERR_NOMEM;
    x->pc[pi] = *tmpl;
    x->pc[pi].xs = xi;
    x->pc[pi].ep = ep;
    x->pc[pi].bslot = -1;
    x->pc[pi].state = PC_PENDING;
    x->pc[pi].next = KVP_RDMA_NONE;
    if (ep->pend_tail == KVP_RDMA_NONE)
        ep->pend_head = pi;
    else
        x->pc[ep->pend_tail].next = pi;
    ep->pend_tail = pi;
    x->xs[xi].left++;
    return KVP_OK;
}

int kvp_rdma_submit(struct kvp_rdma_xport *x, struct kvp_rdma_ep *ep, uint64_t id, uint8_t op,
                    void *local, uint64_t len, uint64_t remote_offset)
{
    return kvp_rdma_submit_until(x, ep, id, op, local, len, remote_offset, 0);
}

/* A WRITE with a deadline that wall-clock time reached (C3: the writer posts nothing past it). */
static bool write_late(uint8_t op, uint64_t deadline_ms)
{
    return op == KVP_RDMA_WRITE && deadline_ms && kvp_clock_wall_ms() >= deadline_ms;
}

int kvp_rdma_submit_until(struct kvp_rdma_xport *x, struct kvp_rdma_ep *ep, uint64_t id, uint8_t op,
                          void *local, uint64_t len, uint64_t remote_offset, uint64_t write_deadline_ms)
{
    /* an xslice longer than slice_bytes (the engine's slices are its own size: the client's
     * slice_bytes is 1 MiB, rdma_slice_bytes 256 KiB) is cut into pieces of at most slice_bytes */
    if (!x || !ep || ep->x != x || !local || !len || len > UINT32_MAX ||
        (op != KVP_RDMA_READ && op != KVP_RDMA_WRITE) || remote_offset + len < len ||
        ep->state != EP_LIVE || remote_offset + len > ep->remote.len)
        return KVP_ERR_INVALID;
    if (write_late(op, write_deadline_ms)) {
        x->st.late_refused++;
        return KVP_ERR_TIMEOUT;
    }
    x->reaper.on_wc = on_wc;
    x->reaper.arg = x;
    uint32_t xi = xs_alloc(x);
    if (xi == KVP_RDMA_NONE)
        return KVP_ERR_NOMEM;
    x->xs[xi] = (struct kvp_rdma_xs){.id = id, .ep = ep, .live = true, .next_free = KVP_RDMA_NONE,
                                     .wdeadline_ms = op == KVP_RDMA_WRITE ? write_deadline_ms : 0};
    uint64_t la = (uint64_t)(uintptr_t)local;
    uint64_t ra = ep->remote.base + remote_offset;
    struct kvp_rdma_mrent *e = kvp_rdma_mr_find(x, la, len);
    int rc = KVP_OK;
    if (e && e->region[ep->nic].n) {
        struct kvp_rdma_span sp8[8], *sp = sp8;
        size_t need = 0;
        rc = kvp_rdma_spans(&e->region[ep->nic], la, &ep->remote, ra, len, x->cfg.slice_bytes, sp,
                            8, &need);
        if (rc == KVP_ERR_BUSY) { /* more than 8 spans: size the array */
            sp = malloc(need * sizeof *sp);
            rc = sp ? kvp_rdma_spans(&e->region[ep->nic], la, &ep->remote, ra, len, x->cfg.slice_bytes,
                                     sp, need, &need)
                    : KVP_ERR_NOMEM;
        }
        for (size_t k = 0; rc == KVP_OK && k < need; k++) {
            struct kvp_rdma_piece t = {.laddr = sp[k].laddr, .raddr = sp[k].raddr, .len = sp[k].len,
                                       .lkey = sp[k].lkey, .rkey = sp[k].rkey, .ent = e, .op = op};
            rc = piece_add(x, ep, xi, &t);
        }
        if (sp != sp8)
            free(sp);
    } else {
        /* Unregistered host memory: bounce-slot pieces, clamped at remote chunk edges. */
        for (uint64_t off = 0; rc == KVP_OK && off < len;) {
            const struct kvp_rdma_chunk *c = kvp_rdma_region_find(&ep->remote, ra + off);
            if (!c) {
                rc = KVP_ERR_INVALID;
                break;
            }
            uint64_t l = len - off;
            if (l > c->base + c->len - (ra + off))
                l = c->base + c->len - (ra + off);
            if (l > x->cfg.slice_bytes) /* one bounce slot per piece */
                l = x->cfg.slice_bytes;
            struct kvp_rdma_piece t = {.laddr = la + off, .raddr = ra + off, .len = (uint32_t)l,
                                       .rkey = c->rkey, .op = op};
            rc = piece_add(x, ep, xi, &t);
            off += l;
        }
    }
    if (rc != KVP_OK) {
        pend_drop(x, ep, xi, false, 0); /* undo: this xslice's pieces leave the FIFO */
        x->xs[xi] = (struct kvp_rdma_xs){.next_free = x->xs_free};
        x->xs_free = xi;
        return rc == KVP_ERR_BUSY ? KVP_ERR_INVALID : rc;
    }
    x->inflight++;
    return KVP_OK;
}

/* ------------------------------------------------------------------ posting */

/* Post pending pieces of ep in order while room allows. */
static void post_some(struct kvp_rdma_xport *x, struct kvp_rdma_ep *ep)
{
    while (ep->pend_head != KVP_RDMA_NONE && ep->state == EP_LIVE) {
        uint32_t pi = ep->pend_head;
        struct kvp_rdma_piece *p = &x->pc[pi];
        struct kvp_rdma_qp *q = NULL;
        for (uint32_t k = 0; k < ep->n_qps; k++) {
            struct kvp_rdma_qp *c = &ep->q[(ep->rr + k) % ep->n_qps];
            if (c->outstanding < c->max_send_wr) {
                q = c;
                ep->rr = (ep->rr + k + 1) % ep->n_qps;
                break;
            }
        }
        if (!q || q->cq->outstanding >= q->cq->size)
            return; /* no credit: completions will make room */
        if (write_late(p->op, x->xs[p->xs].wdeadline_ms)) {
            /* waited for room past its WRITE deadline: never posted (C3) */
            ep->pend_head = p->next;
            if (ep->pend_head == KVP_RDMA_NONE)
                ep->pend_tail = KVP_RDMA_NONE;
            x->st.late_refused++;
            piece_done(x, pi, KVP_ERR_TIMEOUT);
            piece_free(x, pi);
            continue;
        }
        uint64_t laddr = p->laddr;
        uint32_t lkey = p->lkey;
        if (p->ent) {
            /* the key now: a wedged fence elsewhere may have re-registered the chunk */
            const struct kvp_rdma_chunk *lc = kvp_rdma_region_find(&p->ent->region[ep->nic], laddr);
            if (!lc || !lc->mr) {
                ep->pend_head = p->next;
                if (ep->pend_head == KVP_RDMA_NONE)
                    ep->pend_tail = KVP_RDMA_NONE;
                piece_done(x, pi, KVP_ERR_TRANSFER); /* its registration is gone (logged) */
                piece_free(x, pi);
                continue;
            }
            lkey = lc->lkey;
        } else {
            if (x->bounce.n_free == 0)
                return;
            int b = (int)x->bounce.free_idx[x->bounce.n_free - 1];
            uint8_t *bp = x->bounce.mem + (size_t)b * x->bounce.slot_bytes;
            const struct kvp_rdma_chunk *bc = kvp_rdma_region_find(&x->bounce.region[ep->nic],
                                                                   (uint64_t)(uintptr_t)bp);
            if (!bc || !bc->mr || (uint64_t)(uintptr_t)bp + p->len > bc->base + bc->len)
                return; /* pool unusable after a failed re-registration: stays pending */
            x->bounce.n_free--;
            p->bslot = b;
            if (p->op == KVP_RDMA_WRITE)
                memcpy(bp, (const void *)(uintptr_t)p->laddr, p->len);
            x->st.bounce_bytes += p->len;
            laddr = (uint64_t)(uintptr_t)bp;
            lkey = bc->lkey;
        }
        struct ibv_sge sge = {.addr = laddr, .length = p->len, .lkey = lkey};
        struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1,
                                 .opcode = p->op == KVP_RDMA_READ ? IBV_WR_RDMA_READ
                                                                  : IBV_WR_RDMA_WRITE};
        wr.wr.rdma.remote_addr = p->raddr;
        wr.wr.rdma.rkey = p->rkey;
        int rc = kvp_rdma_post(&x->reaper, q, &wr, pi, NULL);
        if (rc == KVP_ERR_BUSY) {
            bounce_release(x, p);
            return;
        }
        ep->pend_head = p->next;
        if (ep->pend_head == KVP_RDMA_NONE)
            ep->pend_tail = KVP_RDMA_NONE;
        p->next = KVP_RDMA_NONE;
        if (rc != KVP_OK) {
            /* refused by the provider (logged by kvp_rdma_post): the piece fails, and the
             * endpoint is fenced (a refused post usually means a QP in error) */
            piece_done(x, pi, KVP_ERR_TRANSFER);
            piece_free(x, pi);
            kvp_rdma_ep_fence_begin(x, ep);
            return;
        }
        p->state = PC_POSTED;
        ep->posted++;
        x->st.posted++;
    }
}

/* ------------------------------------------------------------------ fencing */

void kvp_rdma_ep_fence_begin(struct kvp_rdma_xport *x, struct kvp_rdma_ep *ep)
{
    if (ep->state != EP_LIVE && ep->state != EP_OFFERED)
        return;
    size_t nic = ep->nic;
    /* the MRs the endpoint's posted WRs can reach: the cache entries they use, the bounce pool */
    size_t cap = x->bounce.region[nic].n;
    for (uint32_t i = 0; i < x->pc_cap; i++)
        if (x->pc[i].state == PC_POSTED && x->pc[i].ep == ep && x->pc[i].ent)
            cap += x->pc[i].ent->region[nic].n;
    ep->f_mrs = calloc(cap ? cap : 1, sizeof *ep->f_mrs);
    ep->f_owner = calloc(cap ? cap : 1, sizeof *ep->f_owner);
    ep->f_n = 0;
    if (ep->f_mrs && ep->f_owner) {
        for (uint32_t i = 0; i <= x->pc_cap; i++) {
            struct kvp_rdma_region *rg;
            if (i == x->pc_cap)
                rg = &x->bounce.region[nic];
            else if (x->pc[i].state == PC_POSTED && x->pc[i].ep == ep && x->pc[i].ent)
                rg = &x->pc[i].ent->region[nic];
            else
                continue;
            for (size_t k = 0; k < rg->n; k++) {
                struct ibv_mr *mr = rg->chunks[k].mr;
                bool dup = !mr;
                for (size_t j = 0; j < ep->f_n && !dup; j++)
                    dup = ep->f_mrs[j] == mr;
                if (!dup && ep->f_n < cap) {
                    ep->f_owner[ep->f_n] = &rg->chunks[k];
                    ep->f_mrs[ep->f_n++] = mr;
                }
            }
        }
    }
    size_t n = 0;
    for (uint32_t i = 0; i < ep->n_qps; i++)
        if (ep->q[i].qp)
            ep->fqs[n++] = &ep->q[i];
    kvp_rdma_fence_begin(&ep->f, &x->reaper, ep->fqs, n, ep->f_mrs, ep->f_n, kvp_rdma_now(x),
                         NO_BOUND_NS);
    ep->state = EP_FENCING;
    x->st.fenced_batches++;
}

/* The endpoint's fence is over (drained or wedged): settle every piece it still holds. */
static void ep_fence_end(struct kvp_rdma_xport *x, struct kvp_rdma_ep *ep)
{
    bool wedged = ep->f.result == KVP_ERR_FENCE_FAILED;
    if (wedged) {
        x->st.wedged_batches++;
        for (size_t i = 0; i < ep->f_n; i++) {
            if (ep->f_mrs[i] || !ep->f_owner[i])
                continue;
            /* deregistered by the wedged path. Registrations are shared by the NIC's endpoints:
             * another endpoint fencing now listed the same MR, and must not deregister it again
             * (a freed ibv_mr) nor forget the registration made after this one (below). */
            struct ibv_mr *old = ep->f_owner[i]->mr;
            for (struct kvp_rdma_ep *o = x->eps; o && old; o = o->next)
                if (o != ep && o->f_mrs)
                    for (size_t j = 0; j < o->f_n; j++)
                        if (o->f_mrs[j] == old) {
                            o->f_mrs[j] = NULL;
                            o->f_owner[j] = NULL;
                        }
            ep->f_owner[i]->mr = NULL;
        }
    }
    /* posted pieces without a completion (wedged: their QPs are destroyed, their MRs gone) */
    for (uint32_t i = 0; i < x->pc_cap; i++)
        if (x->pc[i].state == PC_POSTED && x->pc[i].ep == ep) {
            struct kvp_rdma_xs *s = &x->xs[x->pc[i].xs];
            piece_done(x, i, s->fence_status ? s->fence_status : KVP_ERR_TRANSFER);
            piece_free(x, i);
        }
    /* pieces that never left: nothing can touch their memory */
    while (ep->pend_head != KVP_RDMA_NONE) {
        uint32_t pi = ep->pend_head;
        ep->pend_head = x->pc[pi].next;
        struct kvp_rdma_xs *s = &x->xs[x->pc[pi].xs];
        piece_done(x, pi, s->fence_status ? s->fence_status : KVP_ERR_TRANSFER);
        piece_free(x, pi);
    }
    ep->pend_tail = KVP_RDMA_NONE;
    if (wedged)
        kvp_rdma_mr_after_wedge(x, ep->nic);
    free(ep->f_mrs);
    free(ep->f_owner);
    ep->f_mrs = NULL;
    ep->f_owner = NULL;
    ep->f_n = 0;
    ep->state = EP_FENCED;
}

static struct kvp_rdma_xs *xs_find(struct kvp_rdma_xport *x, uint64_t id)
{
    for (uint32_t i = 0; i < x->xs_cap; i++)
        if (x->xs[i].live && x->xs[i].id == id)
            return &x->xs[i];
    return NULL;
}

void kvp_rdma_fence(struct kvp_rdma_xport *x, const uint64_t *ids, size_t n, int status)
{
    if (!x || (n && !ids))
        return;
    for (size_t k = 0; k < n; k++) {
        struct kvp_rdma_xs *s = xs_find(x, ids[k]);
        if (!s || s->ready)
            continue; /* unknown, or its real outcome came first */
        s->fence_status = status;
        struct kvp_rdma_ep *ep = s->ep;
        uint32_t xi = (uint32_t)(s - x->xs);
        pend_drop(x, ep, xi, true, status); /* its pieces that never left end now */
        bool posted = false;
        for (uint32_t i = 0; i < x->pc_cap && !posted; i++)
            posted = x->pc[i].state == PC_POSTED && x->pc[i].xs == xi;
        if (posted)
            kvp_rdma_ep_fence_begin(x, ep);
    }
}

void kvp_rdma_abort(struct kvp_rdma_xport *x, const uint64_t *ids, size_t n)
{
    if (!x || (n && !ids))
        return;
    for (size_t k = 0; k < n; k++) {
        struct kvp_rdma_xs *s = xs_find(x, ids[k]);
        if (!s || s->ready)
            continue;
        s->fence_status = KVP_ERR_FENCE_FAILED;
    }
    for (size_t k = 0; k < n; k++) {
        struct kvp_rdma_xs *s = xs_find(x, ids[k]);
        if (!s || s->ready)
            continue;
        struct kvp_rdma_ep *ep = s->ep;
        if (ep->state == EP_LIVE || ep->state == EP_OFFERED)
            kvp_rdma_ep_fence_begin(x, ep);
        if (ep->state == EP_FENCING) {
            /* the wedged path now: destroy the QPs, deregister the MRs (rdma_fence.h) */
            kvp_rdma_fence_step(&ep->f, ep->f.deadline_ns);
            ep_fence_end(x, ep);
        }
        /* pieces still pending on a fenced endpoint */
        if (!s->ready)
            ep_fence_end(x, ep);
    }
}

/* ------------------------------------------------------------------ progress */

size_t kvp_rdma_progress(struct kvp_rdma_xport *x, struct kvp_rdma_report *out, size_t max)
{
    if (!x)
        return 0;
    x->reaper.on_wc = on_wc;
    x->reaper.arg = x;
    for (struct kvp_rdma_ep *ep = x->eps; ep; ep = ep->next)
        if (ep->state == EP_LIVE)
            post_some(x, ep);
    for (size_t i = 0; i < x->n_nics; i++)
        if (x->nic[i].cq.cq && !x->nic[i].cq.failed &&
            kvp_rdma_reap(&x->reaper, &x->nic[i].cq, 1024) < 0) {
            /* CQ overrun: completions lost; every endpoint on it can only end wedged */
            for (struct kvp_rdma_ep *ep = x->eps; ep; ep = ep->next)
                if (ep->nic == i)
                    kvp_rdma_ep_fence_begin(x, ep);
        }
    uint64_t now = kvp_rdma_now(x);
    for (struct kvp_rdma_ep *ep = x->eps; ep; ep = ep->next)
        if (ep->state == EP_FENCING && kvp_rdma_fence_step(&ep->f, now))
            ep_fence_end(x, ep);
    for (struct kvp_rdma_ep *ep = x->eps; ep; ep = ep->next)
        if (ep->state == EP_LIVE)
            post_some(x, ep); /* room freed by the completions */
    size_t n = 0;
    while (n < max && x->n_ready) {
        uint32_t xi = x->ready[0];
        memmove(x->ready, x->ready + 1, (x->n_ready - 1) * sizeof *x->ready);
        x->n_ready--;
        struct kvp_rdma_xs *s = &x->xs[xi];
        int st = s->status;
        if (st != KVP_OK && s->fence_status)
            st = s->fence_status;
        if (st == KVP_OK && s->gpu_read && x->cfg.cuda && x->cfg.cuda->flush) {
            /* GPU memory without native ordering: make the bytes visible first (note §5) */
            x->cfg.cuda->flush(x->cfg.cuda->arg, s->ordinal);
            x->st.gpu_flushes++;
        }
        out[n++] = (struct kvp_rdma_report){.id = s->id, .status = st};
        *s = (struct kvp_rdma_xs){.next_free = x->xs_free};
        x->xs_free = xi;
        x->inflight--;
    }
    return n;
}

/* ------------------------------------------------------------------ blocking wrapper */

int kvp_rdma_run(struct kvp_rdma_xport *x, struct kvp_rdma_ep *ep, struct kvp_rdma_slice *s,
                 size_t n, uint32_t timeout_ms)
{
    if (!x || !ep || ep->x != x || (n && !s))
        return KVP_ERR_INVALID;
    int bad = ep->state != EP_LIVE;
    for (size_t i = 0; i < n; i++) {
        uint64_t end = s[i].remote_offset + s[i].len;
        s[i].status = KVP_OK;
        if (!s[i].local || !s[i].len || (s[i].op != KVP_RDMA_READ && s[i].op != KVP_RDMA_WRITE) ||
            end < s[i].len || end > ep->remote.len)
            bad = 1;
    }
    if (bad) {
        for (size_t i = 0; i < n; i++)
            s[i].status = KVP_ERR_INVALID;
        kvp_log_warn(x->who, "rdma: batch refused: endpoint not live, or a slice has no memory, "
                             "length 0, a bad op or lies outside the segment");
        return KVP_ERR_INVALID;
    }
    uint64_t sb = x->cfg.slice_bytes;
    uint64_t base = (x->run_ids += 1ull << 32); /* ids: base | xslice index */
    size_t total = 0, reported = 0;
    uint32_t *owner = NULL;
    for (size_t i = 0; i < n; i++)
        total += (size_t)((s[i].len + sb - 1) / sb);
    owner = calloc(total ? total : 1, sizeof *owner);
    uint64_t *ids = calloc(total ? total : 1, sizeof *ids);
    uint8_t *done = calloc(total ? total : 1, 1);
    if (!owner || !ids || !done) {
        free(owner);
        free(ids);
        free(done);
        for (size_t i = 0; i < n; i++)
            s[i].status = KVP_ERR_NOMEM;
        return KVP_ERR_NOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (uint64_t off = 0; off < s[i].len; off += sb, k++) {
            uint64_t l = s[i].len - off < sb ? s[i].len - off : sb;
            owner[k] = (uint32_t)i;
            ids[k] = base | k;
            int rc = kvp_rdma_submit(x, ep, ids[k], s[i].op, (uint8_t *)s[i].local + off, l,
                                     s[i].remote_offset + off);
            if (rc != KVP_OK) {
                done[k] = 1;
                reported++;
                if (s[i].status == KVP_OK)
                    s[i].status = rc;
            }
        }
    uint64_t now = kvp_rdma_now(x);
    uint64_t deadline = timeout_ms ? now + (uint64_t)timeout_ms * MS_NS : UINT64_MAX;
    uint64_t abort_at = UINT64_MAX;
    struct kvp_rdma_report rep[64];
    while (reported < total) {
        size_t got;
        while ((got = kvp_rdma_progress(x, rep, 64)) > 0)
            for (size_t j = 0; j < got; j++) {
                uint64_t idx = rep[j].id - base;
                if ((rep[j].id & ~0xffffffffull) != base || idx >= total || done[idx])
                    continue;
                done[idx] = 1;
                reported++;
                if (rep[j].status != KVP_OK && s[owner[idx]].status == KVP_OK)
                    s[owner[idx]].status = rep[j].status;
            }
        if (reported == total)
            break;
        now = kvp_rdma_now(x);
        if (now >= deadline && abort_at == UINT64_MAX) {
            /* the call's timeout: fence what is left, then give it fence_bound_ms */
            size_t m = 0;
            for (size_t j = 0; j < total; j++)
                if (!done[j])
                    ids[m++] = base | j;
            kvp_rdma_fence(x, ids, m, KVP_ERR_TIMEOUT);
            abort_at = now + (uint64_t)x->cfg.fence_bound_ms * MS_NS;
            continue;
        }
        if (now >= abort_at) {
            size_t m = 0;
            for (size_t j = 0; j < total; j++)
                if (!done[j])
                    ids[m++] = base | j;
            kvp_log_warn(x->who, "rdma: segment %u: %zu xslice(s) not flushed within %u ms; "
                                 "QPs destroyed and their memory deregistered",
                         ep->segment_id, m, x->cfg.fence_bound_ms);
            kvp_rdma_abort(x, ids, m);
            abort_at = UINT64_MAX - 1;
            continue;
        }
        uint64_t until = abort_at != UINT64_MAX ? abort_at : deadline;
        uint64_t left = until - now;
        kvp_rdma_wait(x, left < MS_NS / 10 ? left : MS_NS / 10);
    }
    int first = KVP_OK;
    for (size_t i = 0; i < n; i++)
        if (s[i].status != KVP_OK && first == KVP_OK)
            first = s[i].status;
    free(owner);
    free(ids);
    free(done);
    return first;
}
