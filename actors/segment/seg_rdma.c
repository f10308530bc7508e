/*
 * seg_rdma.c — a segment's RDMA side; see seg_rdma.h and docs/rdma.md "Segment side".
 *
 * Single-owner state, no lock: the rdma transport core (actors/transfer/rdma/rdma_xport.h) and
 * this object are touched by one thread, their owner. In a segment that is loop 0 of the
 * data-plane server (seg_server_rdma.c): the other loops forward handshakes to it and mount
 * changes and FenceWriter reach it by message, so they run one at a time in loop 0's order.
 * Tests may own one directly (tests/unit/test_rdma_fence_writer.c).
 */
#include "actors/segment/seg_rdma.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "runtime/log.h"

bool kvp_seg_fence_writer_due(const Kvp__FenceWriter *fw, const struct kvp_seg_fence_ack *ack)
{
    return fw && ack && fw->seq != 0 && fw->seq != ack->seq;
}

void kvp_seg_fence_ack_set(struct kvp_seg_fence_ack *ack, uint64_t seq, int qps)
{
    ack->seq = seq;
    ack->status = KVP_OK;
    ack->qps = qps > 0 ? (uint32_t)qps : 0;
}

size_t kvp_seg_fence_selectors(const Kvp__FenceWriter *fw, struct kvp_seg_writer_sel *out, const char *who)
{
    if (!fw || !out || fw->client_id != 0 || fw->n_writers == 0)
        return 0;
    bool ok = fw->n_writers <= KVP_SEG_FENCE_SELECTORS_MAX && fw->writers;
    for (size_t i = 0; ok && i < fw->n_writers; i++)
        ok = fw->writers[i] != NULL;
    if (!ok) {
        kvp_log_warn(who ? who : "segment", "rdma: FenceWriter %llu names %zu writers (at most %d, none NULL): "
                     "every writer is fenced", (unsigned long long)fw->seq, fw->n_writers,
                     KVP_SEG_FENCE_SELECTORS_MAX);
        return 0;
    }
    for (size_t i = 0; i < fw->n_writers; i++)
        out[i] = (struct kvp_seg_writer_sel){.client_id = fw->writers[i]->client_id, .mask = fw->writers[i]->mask};
    return fw->n_writers;
}

#ifdef KVP_HAVE_VERBS
#include "actors/transfer/rdma/rdma_xport_internal.h"

struct kvp_seg_rdma {
    struct kvp_rdma_xport *x;
    void *base;
    uint64_t size;
    uint32_t id;                 /* the mount offers are answered for; 0: none */
    bool registered;
    bool reg_failed;             /* logged once */
    char who[48];
};

int kvp_seg_rdma_open(struct kvp_seg_rdma **out, const struct kvp_seg_rdma_cfg *cfg, void *base,
                      uint64_t size)
{
    if (!out || !cfg || !base || !size)
        return KVP_ERR_INVALID;
    *out = NULL;
    struct kvp_seg_rdma *r = calloc(1, sizeof *r);
    if (!r)
        return KVP_ERR_NOMEM;
    snprintf(r->who, sizeof r->who, "%s", cfg->who ? cfg->who : "seg-rdma");
    struct kvp_rdma_cfg rc = {.ops = cfg->ops ? cfg->ops : kvp_verbs_ops_ibv(), .who = r->who,
                              .devices = cfg->devices, .sysfs_root = cfg->sysfs_root,
                              .gid_index = cfg->gid_index, .fence_bound_ms = cfg->fence_bound_ms,
                              .psn_seed = cfg->psn_seed, .segment = true,
                              .nodev_log_level = KVP_LOG_WARN};
    int e = kvp_rdma_open(&rc, cfg->env, &r->x);
    if (e != KVP_OK) {
        free(r);
        return e;
    }
    r->base = base;
    r->size = size;
    *out = r;
    return KVP_OK;
}

/* Fence every writer's QPs (they answer no inbound request once fenced). */
static void fence_all(struct kvp_seg_rdma *r)
{
    while (r->x->writers)
        kvp_rdma_seg_fence_writer(r->x, r->x->writers->client_id, UINT64_MAX);
}

void kvp_seg_rdma_set_id(struct kvp_seg_rdma *r, uint32_t segment_id)
{
    if (!r)
        return;
    if (segment_id != r->id) {
        fence_all(r);
        r->id = segment_id;
        if (segment_id && !r->registered && !r->reg_failed) {
            int rc = kvp_rdma_seg_register(r->x, segment_id, r->base, r->size, NULL);
            if (rc == KVP_OK) {
                r->registered = true;
            } else {
                r->reg_failed = true;
                kvp_log_warn(r->who, "rdma: registering the segment region (%llu B) failed (%s): "
                             "clients use TCP", (unsigned long long)r->size, kvp_errname(rc));
            }
        }
        /* the same region under the new mount's id (the transport checks offers against it) */
        r->x->seg_id = segment_id;
    }
}

int kvp_seg_rdma_accept(struct kvp_seg_rdma *r, const uint8_t *offer, size_t len,
                        uint8_t **answer, size_t *answer_len)
{
    if (!answer || !answer_len)
        return KVP_ERR_INVALID;
    *answer = NULL;
    *answer_len = 0;
    if (!r)
        return KVP_ERR_UNSUPPORTED;
    int rc;
    if (!r->registered || !r->id) {
        /* unmounted, or the registration failed: the transport refuses with an answer */
        uint64_t keep = r->x->seg_len;
        r->x->seg_len = 0;
        rc = kvp_rdma_seg_accept(r->x, offer, len, answer, answer_len);
        r->x->seg_len = keep;
    } else {
        rc = kvp_rdma_seg_accept(r->x, offer, len, answer, answer_len);
    }
    return rc;
}

int kvp_seg_rdma_fence_writers(struct kvp_seg_rdma *r, uint64_t client_id, uint64_t gen)
{
    if (!r)
        return 0;
    if (gen == 0)
        gen = UINT64_MAX;
    int n = 0;
    if (client_id) {
        n = kvp_rdma_seg_fence_writer(r->x, client_id, gen);
    } else {
        /* every writer: each call unlinks at least the writer found, so this ends */
        for (;;) {
            struct kvp_rdma_writer *w = r->x->writers;
            while (w && w->gen > gen)
                w = w->next;
            if (!w)
                break;
            int k = kvp_rdma_seg_fence_writer(r->x, w->client_id, gen);
            if (k < 0)
                break;
            n += k;
        }
    }
    if (n > 0)
        kvp_log_info(r->who, "rdma: FenceWriter: %d QP(s) of %s destroyed", n,
                     client_id ? "one writer" : "every writer");
    return n < 0 ? 0 : n;
}

uint32_t kvp_seg_rdma_writer_qps(struct kvp_seg_rdma *r, uint64_t client_id, uint64_t mask,
                                 uint64_t *gen_sum)
{
    if (gen_sum)
        *gen_sum = 0;
    if (!r)
        return 0;
    uint32_t n = 0;
    for (const struct kvp_rdma_writer *w = r->x->writers; w; w = w->next) {
        if ((w->client_id & mask) != (client_id & mask))
            continue;
        n += w->n_qps;
        if (gen_sum)
            *gen_sum += w->gen;
    }
    return n;
}

uint64_t kvp_seg_rdma_writers_fenced(struct kvp_seg_rdma *r)
{
    return r ? r->x->st.writers_fenced : 0;
}

/* FenceWriter.writers: the QPs of every writer w with (w & mask) == (id & mask), for each
 * selector (a mask 0 selects every writer), of a generation <= gen (0: any). Returns the QPs
 * fenced. */
static int fence_selected(struct kvp_seg_rdma *r, const struct kvp_seg_writer_sel *sel, size_t n, uint64_t gen)
{
    if (gen == 0)
        gen = UINT64_MAX;
    int total = 0;
    for (;;) {
        struct kvp_rdma_writer *w = r->x->writers;
        for (; w; w = w->next) {
            if (w->gen > gen)
                continue;
            size_t i = 0;
            while (i < n && (w->client_id & sel[i].mask) != (sel[i].client_id & sel[i].mask))
                i++;
            if (i < n)
                break;
        }
        if (!w)
            break;
        int k = kvp_rdma_seg_fence_writer(r->x, w->client_id, gen); /* unlinks w: this ends */
        if (k < 0)
            break;
        total += k;
    }
    if (total > 0)
        kvp_log_info(r->who, "rdma: FenceWriter: %d QP(s) of %zu selected writer famil%s destroyed", total,
                     n, n == 1 ? "y" : "ies");
    return total;
}

int kvp_seg_rdma_fence_run(struct kvp_seg_rdma *r, uint64_t client_id, uint64_t gen,
                           const struct kvp_seg_writer_sel *sel, size_t n_sel)
{
    if (!r)
        return 0;
    if (client_id == 0 && sel && n_sel > 0 && n_sel <= KVP_SEG_FENCE_SELECTORS_MAX)
        return fence_selected(r, sel, n_sel, gen);
    return kvp_seg_rdma_fence_writers(r, client_id, gen);
}

void kvp_seg_rdma_hb_fill(bool rdma, const struct kvp_seg_fence_ack *ack, Kvp__HeartbeatReq *hb,
                          Kvp__Fenced *f)
{
    if (!rdma || !ack || !hb || !f)
        return;
    hb->rdma_writers = 1;
    hb->fence_selectors = 1; /* runs FenceWriter.writers (per-writer fence) */
    kvp__fenced__init(f);
    f->seq = ack->seq;
    f->status = ack->status;
    f->qps_fenced = ack->qps;
    hb->fenced = f;
}

bool kvp_seg_rdma_on_fence_writer(struct kvp_seg_rdma *r, const Kvp__FenceWriter *fw,
                                  struct kvp_seg_fence_ack *ack)
{
    if (!r || !kvp_seg_fence_writer_due(fw, ack))
        return false;
    struct kvp_seg_writer_sel sel[KVP_SEG_FENCE_SELECTORS_MAX];
    size_t n_sel = kvp_seg_fence_selectors(fw, sel, r->who);
    kvp_seg_fence_ack_set(ack, fw->seq, kvp_seg_rdma_fence_run(r, fw->client_id, fw->generation, sel, n_sel));
    return true;
}

void kvp_seg_rdma_close(struct kvp_seg_rdma **rp)
{
    if (!rp || !*rp)
        return;
    struct kvp_seg_rdma *r = *rp;
    *rp = NULL;
    fence_all(r);
    kvp_rdma_close(&r->x); /* deregisters the region */
    free(r);
}

#else /* no libibverbs in this build */

int kvp_seg_rdma_open(struct kvp_seg_rdma **out, const struct kvp_seg_rdma_cfg *cfg, void *base,
                      uint64_t size)
{
    (void)base;
    (void)size;
    if (out)
        *out = NULL;
    kvp_log_warn(cfg && cfg->who ? cfg->who : "seg-rdma",
                 "protocol=rdma: this build has no RDMA (libibverbs not found); serving TCP only");
    return KVP_ERR_UNSUPPORTED;
}
void kvp_seg_rdma_set_id(struct kvp_seg_rdma *r, uint32_t segment_id)
{
    (void)r;
    (void)segment_id;
}
int kvp_seg_rdma_accept(struct kvp_seg_rdma *r, const uint8_t *offer, size_t len,
                        uint8_t **answer, size_t *answer_len)
{
    (void)r;
    (void)offer;
    (void)len;
    if (answer)
        *answer = NULL;
    if (answer_len)
        *answer_len = 0;
    return KVP_ERR_UNSUPPORTED;
}
void kvp_seg_rdma_close(struct kvp_seg_rdma **r)
{
    if (r)
        *r = NULL;
}
int kvp_seg_rdma_fence_writers(struct kvp_seg_rdma *r, uint64_t client_id, uint64_t gen)
{
    (void)r;
    (void)client_id;
    (void)gen;
    return 0;
}
uint64_t kvp_seg_rdma_writers_fenced(struct kvp_seg_rdma *r)
{
    (void)r;
    return 0;
}
uint32_t kvp_seg_rdma_writer_qps(struct kvp_seg_rdma *r, uint64_t client_id, uint64_t mask,
                                 uint64_t *gen_sum)
{
    (void)r;
    (void)client_id;
    (void)mask;
    if (gen_sum)
        *gen_sum = 0;
    return 0;
}
int kvp_seg_rdma_fence_run(struct kvp_seg_rdma *r, uint64_t client_id, uint64_t gen,
                           const struct kvp_seg_writer_sel *sel, size_t n_sel)
{
    (void)r;
    (void)client_id;
    (void)gen;
    (void)sel;
    (void)n_sel;
    return 0;
}
void kvp_seg_rdma_hb_fill(bool rdma, const struct kvp_seg_fence_ack *ack, Kvp__HeartbeatReq *hb,
                          Kvp__Fenced *f)
{
    (void)rdma;
    (void)ack;
    (void)hb;
    (void)f;
}
bool kvp_seg_rdma_on_fence_writer(struct kvp_seg_rdma *r, const Kvp__FenceWriter *fw,
                                  struct kvp_seg_fence_ack *ack)
{
    (void)r;
    (void)fw;
    (void)ack;
    return false;
}
#endif
