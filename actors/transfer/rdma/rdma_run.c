/* rdma_run.c — one batch on an rdma endpoint, and its fence; see kvp_rdma_run in rdma_xport.h.
 *
 * Pieces: a slice becomes pieces of at most slice_bytes that never cross an MR chunk on either
 * side (kvp_rdma_spans for registered memory; for bounce-staged memory, one bounce slot per
 * piece). Pieces are posted in order, round-robin over the endpoint's QPs, as QP credits, CQ
 * credits and bounce slots allow; completions come back through the transport's reaper with the
 * piece index as cookie (the batch serial in the high bits, so a completion can never be taken
 * for another batch's).
 *
 * The fence (note §2.3): on the deadline or on the first error completion, every QP of the
 * endpoint goes to ERR and the batch waits until each has a completion for every WR it posted
 * (kvp_rdma_fence_begin/step). If the bound passes first (a provider that does not flush), the
 * QPs are destroyed and every MR the batch's WRs could reach (the MR-cache entries they used,
 * the bounce pool) is deregistered before this returns; those chunks are then registered again
 * under new keys for later calls (no QP that knew the old keys exists any more). Either way the
 * endpoint is fenced for good; the caller reconnects with a new generation.
 */
#include "actors/transfer/rdma/rdma_xport_internal.h"

#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "runtime/log.h"

#define MS_NS 1000000ull

enum piece_state { P_PENDING = 0, P_POSTED = 1, P_DONE = 2 };

struct piece {
    uint32_t slice;
    uint64_t laddr, raddr;    /* laddr: caller memory (also when bounced) */
    uint32_t len;
    uint32_t lkey, rkey;
    struct kvp_rdma_mrent *ent; /* NULL: bounce */
    int bslot;                /* bounce slot while posted, else -1 */
    uint8_t op;
    uint8_t state;
    int status;
};

struct run {
    struct kvp_rdma_xport *x;
    struct kvp_rdma_ep *ep;
    struct piece *p;
    size_t n, done, next_post;
    int first_err;
    bool fencing;
    bool gpu_read;            /* a successful READ landed in GPU memory needing a flush */
    int gpu_ordinal;
};

static void on_wc(void *arg, struct kvp_rdma_qp *q, uint64_t cookie, bool late,
                  const struct ibv_wc *wc)
{
    (void)q;
    struct kvp_rdma_xport *x = arg;
    struct run *r = x->run;
    x->st.completed++;
    if (!r || (cookie >> 32) != (x->run_serial & 0xffffffffu))
        return; /* not this batch's (cannot happen while one batch runs at a time) */
    size_t i = (size_t)(cookie & 0xffffffffu);
    if (i >= r->n || r->p[i].state != P_POSTED)
        return;
    struct piece *pc = &r->p[i];
    pc->state = P_DONE;
    r->done++;
    if (wc->status == IBV_WC_SUCCESS && !late) {
        pc->status = KVP_OK;
        if (pc->bslot >= 0 && pc->op == KVP_RDMA_READ)
            memcpy((void *)(uintptr_t)pc->laddr,
                   x->bounce.mem + (size_t)pc->bslot * x->bounce.slot_bytes, pc->len);
        if (pc->op == KVP_RDMA_READ && pc->ent && pc->ent->needs_flush) {
            r->gpu_read = true;
            r->gpu_ordinal = pc->ent->ordinal;
        }
    } else if (wc->status == IBV_WC_SUCCESS) {
        pc->status = KVP_ERR_TIMEOUT; /* completed late: the call already gave up */
    } else if (wc->status == IBV_WC_WR_FLUSH_ERR) {
        pc->status = r->fencing ? KVP_ERR_TIMEOUT : KVP_ERR_TRANSFER;
    } else {
        pc->status = KVP_ERR_TRANSFER;
        if (!r->first_err)
            kvp_log_warn(x->who, "rdma: segment %u: %s of %u B failed: %s (vendor_err %u); "
                                 "fencing the endpoint", r->ep->segment_id,
                         pc->op == KVP_RDMA_READ ? "READ" : "WRITE", pc->len,
                         ibv_wc_status_str(wc->status), wc->vendor_err);
    }
    if (pc->status != KVP_OK && !r->first_err)
        r->first_err = pc->status;
    if (pc->bslot >= 0) {
        x->bounce.free_idx[x->bounce.n_free++] = (uint32_t)pc->bslot;
        pc->bslot = -1;
    }
}

/* Split the slices into pieces. */
static int build(struct run *r, struct kvp_rdma_slice *s, size_t n)
{
    struct kvp_rdma_xport *x = r->x;
    struct kvp_rdma_ep *ep = r->ep;
    uint64_t sb = x->cfg.slice_bytes;
    size_t cap = 0;
    for (size_t i = 0; i < n; i++)
        cap += (size_t)((s[i].len + sb - 1) / sb) + 2 * ep->remote.n + 2;
    /* cap is an upper bound only for small chunk counts; grow when needed */
    r->p = calloc(cap, sizeof *r->p);
    if (!r->p)
        return KVP_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        uint64_t la = (uint64_t)(uintptr_t)s[i].local;
        uint64_t ra = ep->remote.base + s[i].remote_offset;
        struct kvp_rdma_mrent *e = kvp_rdma_mr_find(x, la, s[i].len);
        if (e && e->region[ep->nic].n) {
            size_t need = 0;
            int rc = kvp_rdma_spans(&e->region[ep->nic], la, &ep->remote, ra, s[i].len, sb, NULL, 0,
                                    &need);
            if (rc != KVP_OK && rc != KVP_ERR_BUSY)
                return rc;
            if (r->n + need > cap) {
                size_t nc = (r->n + need) * 2;
                struct piece *np = realloc(r->p, nc * sizeof *np);
                if (!np)
                    return KVP_ERR_NOMEM;
                memset(np + cap, 0, (nc - cap) * sizeof *np);
                r->p = np;
                cap = nc;
            }
            struct kvp_rdma_span *sp = calloc(need, sizeof *sp);
            if (!sp)
                return KVP_ERR_NOMEM;
            rc = kvp_rdma_spans(&e->region[ep->nic], la, &ep->remote, ra, s[i].len, sb, sp, need,
                                &need);
            for (size_t k = 0; rc == KVP_OK && k < need; k++)
                r->p[r->n++] = (struct piece){.slice = (uint32_t)i, .laddr = sp[k].laddr,
                                              .raddr = sp[k].raddr, .len = sp[k].len,
                                              .lkey = sp[k].lkey, .rkey = sp[k].rkey, .ent = e,
                                              .bslot = -1, .op = s[i].op};
            free(sp);
            if (rc != KVP_OK)
                return rc;
            continue;
        }
        /* Unregistered host memory: bounce-slot-sized pieces, clamped at remote chunk edges. */
        for (uint64_t off = 0; off < s[i].len;) {
            const struct kvp_rdma_chunk *rc = kvp_rdma_region_find(&ep->remote, ra + off);
            if (!rc) {
                kvp_log_error(x->who, "rdma: slice %zu: remote range outside segment %u", i,
                              ep->segment_id);
                return KVP_ERR_INVALID;
            }
            uint64_t len = s[i].len - off;
            if (len > x->bounce.slot_bytes)
                len = x->bounce.slot_bytes;
            if (len > rc->base + rc->len - (ra + off))
                len = rc->base + rc->len - (ra + off);
            if (r->n == cap) {
                size_t nc = cap * 2 + 16;
                struct piece *np = realloc(r->p, nc * sizeof *np);
                if (!np)
                    return KVP_ERR_NOMEM;
                r->p = np;
                cap = nc;
            }
            r->p[r->n++] = (struct piece){.slice = (uint32_t)i, .laddr = la + off, .raddr = ra + off,
                                          .len = (uint32_t)len, .rkey = rc->rkey, .bslot = -1,
                                          .op = s[i].op};
            off += len;
        }
    }
    return KVP_OK;
}

/* Post pending pieces in order while credits, slots and bounce buffers allow. Returns KVP_OK, or
 * the error of a post the provider refused (the batch then fences). */
static int post_some(struct run *r)
{
    struct kvp_rdma_xport *x = r->x;
    struct kvp_rdma_ep *ep = r->ep;
    while (r->next_post < r->n) {
        struct piece *pc = &r->p[r->next_post];
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
            return KVP_OK; /* no credit: wait for completions */
        uint64_t laddr = pc->laddr;
        uint32_t lkey = pc->lkey;
        if (!pc->ent) {
            if (x->bounce.n_free == 0)
                return KVP_OK;
            pc->bslot = (int)x->bounce.free_idx[--x->bounce.n_free];
            uint8_t *b = x->bounce.mem + (size_t)pc->bslot * x->bounce.slot_bytes;
            const struct kvp_rdma_chunk *bc = kvp_rdma_region_find(&x->bounce.region[ep->nic],
                                                                   (uint64_t)(uintptr_t)b);
            if (!bc || !bc->mr) {
                x->bounce.free_idx[x->bounce.n_free++] = (uint32_t)pc->bslot;
                pc->bslot = -1;
                return KVP_ERR_TRANSFER;
            }
            if (pc->op == KVP_RDMA_WRITE)
                memcpy(b, (const void *)(uintptr_t)pc->laddr, pc->len);
            x->st.bounce_bytes += pc->len;
            laddr = (uint64_t)(uintptr_t)b;
            lkey = bc->lkey;
        }
        struct ibv_sge sge = {.addr = laddr, .length = pc->len, .lkey = lkey};
        struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1,
                                 .opcode = pc->op == KVP_RDMA_READ ? IBV_WR_RDMA_READ
                                                                   : IBV_WR_RDMA_WRITE};
        wr.wr.rdma.remote_addr = pc->raddr;
        wr.wr.rdma.rkey = pc->rkey;
        uint64_t cookie = ((x->run_serial & 0xffffffffu) << 32) | (uint64_t)r->next_post;
        int rc = kvp_rdma_post(&x->reaper, q, &wr, cookie, NULL);
        if (rc == KVP_ERR_BUSY) {
            if (pc->bslot >= 0) {
                x->bounce.free_idx[x->bounce.n_free++] = (uint32_t)pc->bslot;
                pc->bslot = -1;
            }
            return KVP_OK;
        }
        if (rc != KVP_OK) {
            if (pc->bslot >= 0) {
                x->bounce.free_idx[x->bounce.n_free++] = (uint32_t)pc->bslot;
                pc->bslot = -1;
            }
            return KVP_ERR_TRANSFER;
        }
        x->st.posted++;
        pc->state = P_POSTED;
        r->next_post++;
    }
    return KVP_OK;
}

/* The batch's fence: ERR + drain, or wedged (destroy + dereg + re-register). */
static int fence(struct run *r)
{
    struct kvp_rdma_xport *x = r->x;
    struct kvp_rdma_ep *ep = r->ep;
    r->fencing = true;
    size_t nic = ep->nic;
    /* the MRs the batch's WRs can reach: the cache entries it used and the bounce pool */
    size_t cap = x->bounce.region[nic].n;
    for (size_t i = 0; i < r->n; i++)
        if (r->p[i].ent)
            cap += r->p[i].ent->region[nic].n;
    struct ibv_mr **mrs = calloc(cap ? cap : 1, sizeof *mrs);
    struct kvp_rdma_chunk **owner = calloc(cap ? cap : 1, sizeof *owner);
    size_t n_mrs = 0;
    if (mrs && owner) {
        struct kvp_rdma_region *seen[64];
        size_t n_seen = 0;
        for (size_t i = 0; i <= r->n; i++) {
            struct kvp_rdma_region *rg = i < r->n ? (r->p[i].ent ? &r->p[i].ent->region[nic] : NULL)
                                                  : &x->bounce.region[nic];
            if (!rg)
                continue;
            bool dup = false;
            for (size_t k = 0; k < n_seen; k++)
                dup |= seen[k] == rg;
            if (dup)
                continue;
            if (n_seen < 64)
                seen[n_seen++] = rg;
            for (size_t k = 0; k < rg->n && n_mrs < cap; k++)
                if (rg->chunks[k].mr) {
                    owner[n_mrs] = &rg->chunks[k];
                    mrs[n_mrs++] = rg->chunks[k].mr;
                }
        }
    }
    struct kvp_rdma_qp *qs[KVP_RDMA_HELLO_MAX_QPS];
    for (uint32_t i = 0; i < ep->n_qps; i++)
        qs[i] = &ep->q[i];
    int rc = kvp_rdma_fence_qps(x, qs, ep->n_qps, mrs, n_mrs);
    ep->state = EP_FENCED;
    x->st.fenced_batches++;
    /* GPU memory without native ordering: flush before the caller reads what landed (§5) */
    if (r->gpu_read && x->cfg.cuda && x->cfg.cuda->flush) {
        x->cfg.cuda->flush(x->cfg.cuda->arg, r->gpu_ordinal);
        x->st.gpu_flushes++;
        r->gpu_read = false;
    }
    if (rc == KVP_ERR_FENCE_FAILED) {
        x->st.wedged_batches++;
        for (size_t i = 0; i < n_mrs; i++)
            if (!mrs[i])
                owner[i]->mr = NULL; /* deregistered by the wedged path */
        /* every bounce slot the batch held is reachable by nothing now */
        for (size_t i = 0; i < r->n; i++)
            if (r->p[i].bslot >= 0) {
                x->bounce.free_idx[x->bounce.n_free++] = (uint32_t)r->p[i].bslot;
                r->p[i].bslot = -1;
            }
        kvp_rdma_mr_after_wedge(x, nic);
    } else if (rc != KVP_OK && !mrs) {
        rc = KVP_ERR_FENCE_FAILED;
    }
    free(mrs);
    free(owner);
    return rc;
}

int kvp_rdma_run(struct kvp_rdma_xport *x, struct kvp_rdma_ep *ep, struct kvp_rdma_slice *s,
                 size_t n, uint32_t timeout_ms)
{
    if (!x || !ep || ep->x != x || (n && !s))
        return KVP_ERR_INVALID;
    for (size_t i = 0; i < n; i++)
        s[i].status = KVP_ERR_CANCELLED;
    if (ep->state != EP_LIVE) {
        for (size_t i = 0; i < n; i++)
            s[i].status = KVP_ERR_INVALID;
        return KVP_ERR_INVALID;
    }
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t end = s[i].remote_offset + s[i].len;
        if (!s[i].local || !s[i].len || (s[i].op != KVP_RDMA_READ && s[i].op != KVP_RDMA_WRITE) ||
            end < s[i].len || end > ep->remote.len) {
            s[i].status = KVP_ERR_INVALID;
            bad = 1;
        }
    }
    if (bad) {
        kvp_log_warn(x->who, "rdma: batch refused: a slice has no memory, length 0, a bad op or "
                             "lies outside segment %u", ep->segment_id);
        return KVP_ERR_INVALID;
    }
    if (n == 0)
        return KVP_OK;
    struct run r = {.x = x, .ep = ep};
    int rc = build(&r, s, n);
    if (rc != KVP_OK) {
        free(r.p);
        for (size_t i = 0; i < n; i++)
            s[i].status = rc;
        return rc;
    }
    x->run = &r;
    x->run_serial++;
    x->reaper.on_wc = on_wc;
    x->reaper.arg = x;
    uint64_t deadline = timeout_ms ? kvp_rdma_now(x) + (uint64_t)timeout_ms * MS_NS : UINT64_MAX;
    struct kvp_rdma_nicst *c = &x->nic[ep->nic];
    int fence_rc = KVP_OK;
    int why = 0;
    for (;;) {
        if (post_some(&r) != KVP_OK && !r.first_err)
            r.first_err = KVP_ERR_TRANSFER;
        if (kvp_rdma_reap(&x->reaper, &c->cq, 256) < 0 && !r.first_err)
            r.first_err = KVP_ERR_TRANSFER; /* CQ overrun: completions lost */
        if (r.done == r.n)
            break;
        uint64_t now = kvp_rdma_now(x);
        if (r.first_err || now >= deadline) {
            why = r.first_err ? r.first_err : KVP_ERR_TIMEOUT;
            fence_rc = fence(&r);
            break;
        }
        uint64_t left = deadline - now;
        kvp_rdma_wait(x, left < MS_NS ? left : MS_NS);
    }
    if (r.gpu_read && x->cfg.cuda && x->cfg.cuda->flush) {
        x->cfg.cuda->flush(x->cfg.cuda->arg, r.gpu_ordinal);
        x->st.gpu_flushes++;
    }
    /* slice status: OK only when every piece completed in time */
    for (size_t i = 0; i < n; i++)
        s[i].status = KVP_OK;
    int first = KVP_OK;
    for (size_t i = 0; i < r.n; i++) {
        struct piece *pc = &r.p[i];
        int st = pc->state == P_DONE ? pc->status : (why ? why : KVP_ERR_TIMEOUT);
        if (pc->state == P_DONE && st == KVP_ERR_TIMEOUT && why && why != KVP_ERR_TIMEOUT)
            st = why;
        if (fence_rc == KVP_ERR_FENCE_FAILED && st != KVP_OK)
            st = KVP_ERR_FENCE_FAILED;
        if (st != KVP_OK && s[pc->slice].status == KVP_OK)
            s[pc->slice].status = st;
    }
    for (size_t i = 0; i < n; i++)
        if (s[i].status != KVP_OK && first == KVP_OK)
            first = s[i].status;
    x->run = NULL;
    free(r.p);
    return first;
}
