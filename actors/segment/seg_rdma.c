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

void kvp_seg_rdma_hb_fill(bool rdma, const struct kvp_seg_fence_ack *ack, Kvp__HeartbeatReq *hb,
                          Kvp__Fenced *f)
{
    if (!rdma || !ack || !hb || !f)
        return;
    hb->rdma_writers = 1;
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
    kvp_seg_fence_ack_set(ack, fw->seq, kvp_seg_rdma_fence_writers(r, fw->client_id, fw->generation));
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
