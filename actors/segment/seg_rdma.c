/*
 * seg_rdma.c — a segment's RDMA side; see seg_rdma.h and docs/rdma.md "Segment side".
 *
 * The rdma transport core (actors/transfer/rdma/rdma_xport.h) is single-owner state. Two kinds
 * of threads reach it here: the segment runtime (mount changes) and the data-plane loops (a
 * handshake arrives on whichever loop owns the client's connection). Both are rare control-plane
 * events (one per mount, one per client connection generation), never on the data path: RDMA
 * data moves without the segment's CPU. A mutex serializes them. Not a message: set_id must hold
 * when it returns (the space of an unmounted segment may be reused at once, so the old writers'
 * QPs must be fenced before), and kvp_seg_server_set_id is called from inside the segment
 * runtime's own actor callbacks, where a blocking call to another actor is not allowed.
 */
#include "actors/segment/seg_rdma.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "runtime/log.h"

#ifdef KVP_HAVE_VERBS
#include "actors/transfer/rdma/rdma_xport_internal.h"

struct kvp_seg_rdma {
    pthread_mutex_t mu;          /* see the file comment */
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
    pthread_mutex_init(&r->mu, NULL);
    r->base = base;
    r->size = size;
    *out = r;
    return KVP_OK;
}

/* Fence every writer's QPs (they answer no inbound request once fenced). Under r->mu. */
static void fence_all(struct kvp_seg_rdma *r)
{
    while (r->x->writers)
        kvp_rdma_seg_fence_writer(r->x, r->x->writers->client_id, UINT64_MAX);
}

void kvp_seg_rdma_set_id(struct kvp_seg_rdma *r, uint32_t segment_id)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
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
    pthread_mutex_unlock(&r->mu);
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
    pthread_mutex_lock(&r->mu);
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
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int kvp_seg_rdma_fence_writers(struct kvp_seg_rdma *r, uint64_t client_id, uint64_t gen)
{
    if (!r)
        return 0;
    if (gen == 0)
        gen = UINT64_MAX;
    int n = 0;
    pthread_mutex_lock(&r->mu);
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
    pthread_mutex_unlock(&r->mu);
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
    pthread_mutex_lock(&r->mu);
    for (const struct kvp_rdma_writer *w = r->x->writers; w; w = w->next) {
        if ((w->client_id & mask) != (client_id & mask))
            continue;
        n += w->n_qps;
        if (gen_sum)
            *gen_sum += w->gen;
    }
    pthread_mutex_unlock(&r->mu);
    return n;
}

uint64_t kvp_seg_rdma_writers_fenced(struct kvp_seg_rdma *r)
{
    if (!r)
        return 0;
    pthread_mutex_lock(&r->mu);
    uint64_t n = r->x->st.writers_fenced;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* FenceWriter.writers: the QPs of every writer w with (w & mask) == (id & mask), for each
 * selector (a mask 0 selects every writer). Returns the QPs fenced. */
static int fence_selected(struct kvp_seg_rdma *r, Kvp__WriterSelector *const *sel, size_t n, uint64_t gen)
{
    if (gen == 0)
        gen = UINT64_MAX;
    int total = 0;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        struct kvp_rdma_writer *w = r->x->writers;
        for (; w; w = w->next) {
            if (w->gen > gen)
                continue;
            size_t i = 0;
            while (i < n && (w->client_id & sel[i]->mask) != (sel[i]->client_id & sel[i]->mask))
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
    pthread_mutex_unlock(&r->mu);
    if (total > 0)
        kvp_log_info(r->who, "rdma: FenceWriter: %d QP(s) of %zu selected writer famil%s destroyed", total,
                     n, n == 1 ? "y" : "ies");
    return total;
}

void kvp_seg_rdma_hb_fill(const struct kvp_seg_rdma *r, const struct kvp_seg_fence_ack *ack,
                          Kvp__HeartbeatReq *hb, Kvp__Fenced *f)
{
    if (!r || !ack || !hb || !f)
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
    if (!r || !fw || !ack || fw->seq == 0 || fw->seq == ack->seq)
        return false;
    int n;
    bool sel_ok = fw->client_id == 0 && fw->n_writers > 0 && fw->n_writers <= KVP_SEG_FENCE_SELECTORS_MAX;
    for (size_t i = 0; sel_ok && i < fw->n_writers; i++)
        sel_ok = fw->writers[i] != NULL;
    if (sel_ok) {
        n = fence_selected(r, fw->writers, fw->n_writers, fw->generation);
    } else {
        if (fw->client_id == 0 && fw->n_writers > 0)
            kvp_log_warn(r->who, "rdma: FenceWriter %llu names %zu writers (at most %d, none NULL): "
                         "every writer is fenced", (unsigned long long)fw->seq, fw->n_writers,
                         KVP_SEG_FENCE_SELECTORS_MAX);
        n = kvp_seg_rdma_fence_writers(r, fw->client_id, fw->generation);
    }
    ack->seq = fw->seq;
    ack->status = KVP_OK;
    ack->qps = (uint32_t)n;
    return true;
}

void kvp_seg_rdma_close(struct kvp_seg_rdma **rp)
{
    if (!rp || !*rp)
        return;
    struct kvp_seg_rdma *r = *rp;
    *rp = NULL;
    pthread_mutex_lock(&r->mu);
    fence_all(r);
    pthread_mutex_unlock(&r->mu);
    kvp_rdma_close(&r->x); /* deregisters the region */
    pthread_mutex_destroy(&r->mu);
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
void kvp_seg_rdma_hb_fill(const struct kvp_seg_rdma *r, const struct kvp_seg_fence_ack *ack,
                          Kvp__HeartbeatReq *hb, Kvp__Fenced *f)
{
    (void)r;
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
