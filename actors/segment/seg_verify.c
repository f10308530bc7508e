/*
 * seg_verify.c — the segment's range checksums (see seg_verify.h).
 */
#include "actors/segment/seg_verify.h"

#include <string.h>

#include <xxhash.h>

#include "kvpool.h"
#include "runtime/log.h"

void kvp_seg_verify_init(struct kvp_seg_verify *v)
{
    memset(v, 0, sizeof *v);
}

static void range_free(struct kvp_seg_verify_range *r)
{
    if (r->state)
        XXH3_freeState(r->state);
    r->state = NULL;
}

void kvp_seg_verify_clear(struct kvp_seg_verify *v)
{
    for (size_t i = 0; i < v->n; i++)
        range_free(&v->q[i]);
    v->n = 0;
}

size_t kvp_seg_verify_add(struct kvp_seg_verify *v, uint32_t segment_id, Kvp__RangeVerify *const *ranges,
                          size_t n, uint64_t region_bytes, const char *actor)
{
    if (segment_id != v->segment_id) {
        kvp_seg_verify_clear(v); /* asked for another mount's bytes: that leader waits no more */
        v->segment_id = segment_id;
    }
    size_t added = 0, dropped = 0;
    for (size_t i = 0; i < n; i++) {
        const Kvp__RangeVerify *rv = ranges[i];
        if (!rv)
            continue;
        bool dup = false;
        for (size_t j = 0; j < v->n && !dup; j++)
            dup = v->q[j].id == rv->id;
        if (dup)
            continue;
        if (v->n == KVP_SEG_VERIFY_MAX) {
            dropped++;
            continue;
        }
        struct kvp_seg_verify_range *r = &v->q[v->n++];
        memset(r, 0, sizeof *r);
        r->id = rv->id;
        r->offset = rv->offset;
        r->len = rv->len;
        if (rv->len == 0 || rv->offset >= region_bytes || rv->len > region_bytes - rv->offset) {
            r->status = KVP_ERR_INVALID;
            r->ready = true;
            kvp_log_warn(actor, "segment %u: range verify %llu [%llu, +%llu) is not inside the region of %llu "
                         "bytes: refused", segment_id, (unsigned long long)rv->id, (unsigned long long)rv->offset,
                         (unsigned long long)rv->len, (unsigned long long)region_bytes);
        }
        added++;
    }
    if (dropped) {
        v->refused += dropped;
        kvp_log_warn(actor, "segment %u: %zu range verifies refused: %u already queued (the leader asks again)",
                     segment_id, dropped, KVP_SEG_VERIFY_MAX);
    }
    return added;
}

uint64_t kvp_seg_verify_step(struct kvp_seg_verify *v, const uint8_t *base, uint64_t budget_bytes)
{
    uint64_t spent = 0;
    for (size_t i = 0; i < v->n && spent < budget_bytes; i++) {
        struct kvp_seg_verify_range *r = &v->q[i];
        if (r->ready)
            continue;
        const uint8_t *p = base + r->offset + r->done;
        uint64_t left = r->len - r->done, room = budget_bytes - spent;
        if (r->done == 0 && left <= room) { /* all of it now: one call */
            r->checksum = XXH3_64bits(p, (size_t)left);
            r->status = KVP_OK;
            r->ready = true;
            r->done = r->len;
            spent += left;
            continue;
        }
        if (!r->state) {
            r->state = XXH3_createState();
            if (!r->state) {
                r->status = KVP_ERR_NOMEM;
                r->ready = true;
                continue;
            }
            XXH3_64bits_reset(r->state);
        }
        uint64_t take = left < room ? left : room;
        XXH3_64bits_update(r->state, p, (size_t)take);
        r->done += take;
        spent += take;
        if (r->done == r->len) {
            r->checksum = XXH3_64bits_digest(r->state);
            r->status = KVP_OK;
            r->ready = true;
            range_free(r);
        }
    }
    return spent;
}

size_t kvp_seg_verify_ready(const struct kvp_seg_verify *v)
{
    size_t k = 0;
    for (size_t i = 0; i < v->n; i++)
        k += v->q[i].ready;
    return k;
}

size_t kvp_seg_verify_pending(const struct kvp_seg_verify *v)
{
    return v->n - kvp_seg_verify_ready(v);
}

size_t kvp_seg_verify_fill(struct kvp_seg_verify *v, Kvp__HeartbeatReq *hb)
{
    size_t k = 0, w = 0;
    for (size_t i = 0; i < v->n; i++) {
        struct kvp_seg_verify_range *r = &v->q[i];
        if (!r->ready) {
            v->q[w++] = *r; /* keeps its state pointer */
            continue;
        }
        Kvp__RangeSum *s = &v->sums[k];
        kvp__range_sum__init(s);
        s->id = r->id;
        s->status = r->status;
        s->checksum = r->status == KVP_OK ? r->checksum : 0;
        v->sump[k++] = s;
        range_free(r);
    }
    v->n = w;
    v->answered += k;
    hb->n_verified = k;
    hb->verified = k ? v->sump : NULL;
    return k;
}
