/*
 * xfer_local.c — the local transport behind the transport seam (transport.h): segments
 * registered in this process (kvp_xfer_register_local) are read and written with memcpy.
 *
 * An instance belongs to the engine's local transfer actor ("xfer-local"), which owns the table
 * of registered segments: register and unregister are messages to that actor, handled between
 * two posts, and a post copies at once, so an unregister never overlaps a copy
 * (docs/data-plane.md, "Local transport"). The table is found by segment id; the peer of connect()
 * is a placeholder (one per endpoint the engine asks for, all alike).
 */
#include <stdlib.h>
#include <string.h>

#include "actors/transfer/transfer_internal.h"
#include "actors/transfer/transport.h"
#include "kvpool.h"

struct xfer_local_seg {
    uint32_t segment_id;
    uint8_t *base;
    uint64_t size;
};

struct local_xport {
    struct xfer_local_seg *segs;
    size_t n, cap;
    struct kvp_xport_completion *cq;
    size_t cq_n, cq_cap;
    char peer; /* the address handed out as every peer */
};

#define L(x) ((struct local_xport *)(x))

int xfer_local_add(struct kvp_xport *x, uint32_t segment_id, void *base, uint64_t size)
{
    struct local_xport *t = L(x);
    size_t i;
    for (i = 0; i < t->n; i++)
        if (t->segs[i].segment_id == segment_id)
            break;
    if (i == t->n) {
        if (t->n == t->cap) {
            size_t nc = t->cap ? t->cap * 2 : 4;
            struct xfer_local_seg *ns = realloc(t->segs, nc * sizeof *ns);
            if (!ns)
                return KVP_ERR_NOMEM;
            t->segs = ns;
            t->cap = nc;
        }
        t->n++;
    }
    t->segs[i] = (struct xfer_local_seg){segment_id, base, size};
    return KVP_OK;
}

int xfer_local_del(struct kvp_xport *x, uint32_t segment_id)
{
    struct local_xport *t = L(x);
    for (size_t i = 0; i < t->n; i++)
        if (t->segs[i].segment_id == segment_id) {
            t->segs[i] = t->segs[--t->n];
            return KVP_OK;
        }
    return KVP_ERR_NOT_FOUND;
}

static int local_open(struct kvp_xport **out, const struct kvp_xport_params *p)
{
    (void)p;
    struct local_xport *t = calloc(1, sizeof *t);
    if (!t)
        return KVP_ERR_NOMEM;
    *out = (struct kvp_xport *)t;
    return KVP_OK;
}

static int local_fds(struct kvp_xport *x, int *fds, size_t max)
{
    (void)x, (void)fds, (void)max;
    return 0;
}

static int local_connect(struct kvp_xport *x, const char *endpoint, const struct sockaddr_storage *addr,
                         unsigned addr_len, struct kvp_xport_peer **peer)
{
    (void)endpoint, (void)addr, (void)addr_len;
    *peer = (struct kvp_xport_peer *)&L(x)->peer;
    return KVP_OK;
}

static int local_post(struct kvp_xport *x, struct kvp_xport_peer *peer, const struct kvp_xport_slice *s, size_t n)
{
    (void)peer;
    struct local_xport *t = L(x);
    if (t->cq_n + n > t->cq_cap) {
        size_t nc = t->cq_cap ? t->cq_cap : 16;
        while (nc < t->cq_n + n)
            nc *= 2;
        struct kvp_xport_completion *q = realloc(t->cq, nc * sizeof *q);
        if (!q)
            return KVP_ERR_NOMEM;
        t->cq = q;
        t->cq_cap = nc;
    }
    for (size_t i = 0; i < n; i++)
        if ((s[i].op != KVP_XFER_READ && s[i].op != KVP_XFER_WRITE) || !s[i].local || !s[i].length)
            return KVP_ERR_INVALID;
    for (size_t i = 0; i < n; i++) {
        const struct kvp_xport_slice *x1 = &s[i];
        const struct xfer_local_seg *g = NULL;
        for (size_t k = 0; k < t->n && !g; k++)
            if (t->segs[k].segment_id == x1->segment_id)
                g = &t->segs[k];
        int st = KVP_OK;
        if (!g)
            st = KVP_ERR_NOT_FOUND; /* unregistered since the batch chose this transport */
        else if (x1->remote_offset > g->size || x1->length > g->size - x1->remote_offset)
            st = KVP_ERR_INVALID;
        else if (x1->op == KVP_XFER_READ)
            memcpy(x1->local, g->base + x1->remote_offset, x1->length);
        else
            memcpy(g->base + x1->remote_offset, x1->local, x1->length);
        t->cq[t->cq_n++] = (struct kvp_xport_completion){x1->id, st};
    }
    return KVP_OK;
}

static int local_poll(struct kvp_xport *x, uint64_t now_ns, struct kvp_xport_completion *out, size_t max,
                      uint64_t *next_ns)
{
    struct local_xport *t = L(x);
    size_t k = t->cq_n < max ? t->cq_n : max;
    if (k > 0) {
        memcpy(out, t->cq, k * sizeof *out);
        memmove(t->cq, t->cq + k, (t->cq_n - k) * sizeof *t->cq);
        t->cq_n -= k;
    }
    *next_ns = t->cq_n ? now_ns : UINT64_MAX;
    return (int)k;
}

/* Copies finish inside post(): by the time a fence comes, every xslice was reported. */
static void local_fence(struct kvp_xport *x, const uint64_t *ids, size_t n, int status)
{
    (void)x, (void)ids, (void)n, (void)status;
}

static void local_abort(struct kvp_xport *x, const uint64_t *ids, size_t n)
{
    (void)x, (void)ids, (void)n;
}

static void local_close(struct kvp_xport *x)
{
    struct local_xport *t = L(x);
    if (!t)
        return;
    free(t->segs);
    free(t->cq);
    free(t);
}

const struct kvp_xport_ops kvp_xport_local = {
    .name = "local",
    .open = local_open,
    .fds = local_fds,
    .connect = local_connect,
    .post = local_post,
    .poll = local_poll,
    .fence = local_fence,
    .abort = local_abort,
    .close = local_close,
};
