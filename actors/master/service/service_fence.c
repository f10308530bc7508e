/*
 * service_fence.c — the leader's side of FenceWriter/Fenced (issue 20; the record and the rule
 * are in fence_track.h, the exchange in docs/rdma.md "FenceWriter and Fenced"). Glue only: the
 * heartbeat handler, the answer's FenceWriter, the failure notes and the QuarantineRelease time.
 */
#include "actors/master/service/service_state.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"

void svc_fence_on_heartbeat(struct kvp_master_service *s, uint32_t seg, const Kvp__HeartbeatReq *hb)
{
    if (s->segments_fresh_ms && !svc_map_get(&s->segments, seg, NULL))
        return; /* unknown: answered NOT_FOUND, nothing to record */
    const Kvp__Fenced *f = hb->fenced;
    bool nomem = false;
    uint64_t acks = s->fence.acks;
    kvp_fence_track_heartbeat_sel(&s->fence, seg, hb->rdma_writers, hb->fence_selectors, f ? f->seq : 0,
                                  f ? f->status : 0, &nomem);
    if (nomem)
        kvp_log_error(s->actor, "segment %u: no memory to record its RDMA fences: it is not asked to "
                      "fence writers (C3 over RDMA rests on fence_grace_ms for it)", seg);
    if (f && f->status != 0 && f->seq)
        kvp_log_warn(s->actor, "segment %u: FenceWriter %llu failed (%s): asked again", seg,
                     (unsigned long long)f->seq, kvp_errname(f->status));
    if (s->fence.acks != acks) {
        kvp_log_debug(s->actor, "segment %u: writers fenced (FenceWriter %llu, %u QPs)", seg,
                      (unsigned long long)(f ? f->seq : 0), f ? f->qps_fenced : 0);
        svc_release_now(s); /* what the fence held may be free now */
    }
}

void svc_fence_fill(struct kvp_master_service *s, uint32_t seg, Kvp__HeartbeatResp *hb, Kvp__FenceWriter *fw)
{
    uint64_t seq = 0;
    const struct kvp_fence_sel *sel = NULL;
    uint32_t n = 0;
    if (!kvp_fence_track_ask(&s->fence, seg, &seq, &sel, &n))
        return;
    kvp__fence_writer__init(fw);
    fw->seq = seq;
    fw->client_id = 0;  /* every writer, unless writers names some (a segment that ignores them
                         * fences every writer: safe) */
    fw->generation = 0; /* every generation */
    for (uint32_t i = 0; i < n && i < KVP_FENCE_SELECTORS_MAX; i++) {
        kvp__writer_selector__init(&s->fence_sel[i]);
        s->fence_sel[i].client_id = sel[i].client_id;
        s->fence_sel[i].mask = sel[i].mask;
        s->fence_selp[i] = &s->fence_sel[i];
    }
    fw->n_writers = n;
    fw->writers = n ? s->fence_selp : NULL;
    hb->fence_writer = fw;
}

void svc_fence_note_failure(struct kvp_master_service *s, uint64_t wall_ms, const char *why)
{
    svc_fence_note_writer_failure(s, wall_ms, 0, 0, why);
}

void svc_fence_note_writer_failure(struct kvp_master_service *s, uint64_t wall_ms, uint64_t writer_id,
                                   uint64_t writer_mask, const char *why)
{
    uint32_t n = kvp_fence_track_note_writer_failure(&s->fence, wall_ms, writer_id, writer_mask);
    if (n && writer_id && writer_mask)
        kvp_log_debug(s->actor, "%s: %u RDMA segment(s) asked to fence writer %016llx/%016llx", why, n,
                      (unsigned long long)writer_id, (unsigned long long)writer_mask);
    else if (n)
        kvp_log_debug(s->actor, "%s: %u RDMA segment(s) asked to fence their writers", why, n);
}

void svc_fence_reset(struct kvp_master_service *s, uint64_t term)
{
    kvp_fence_track_reset(&s->fence);
    /* A segment repeats the last seq it ran (Fenced.seq), possibly one an older leader asked: this
     * leader's seqs start at term << 32, above any seq of a leader of an earlier term (terms only
     * grow; 2^32 fences per term), so such an echo never answers one of ours (fence_track.c
     * ignores seqs above its own). Not the wall clock: a new leader's clock may be behind. */
    if (term < (1ull << 31) && s->fence.last_seq < (term << 32))
        s->fence.last_seq = term << 32;
}

static bool seg_alive(void *ctx, uint32_t seg)
{
    struct kvp_master_service *s = ctx;
    uint64_t st = 0;
    if (!s->segments_fresh_ms)
        return true; /* the table is not read yet: keep holding */
    return svc_map_get(&s->segments, seg, &st) && st - 1 != KVP__SEGMENT_STATE__SEGMENT_LOST;
}

uint64_t svc_fence_release_time(struct kvp_master_service *s, uint64_t now_wall_ms)
{
    uint32_t by = 0;
    uint64_t at = kvp_fence_track_release_time(&s->fence, now_wall_ms, s->cfg.fence_grace_ms, seg_alive, s, &by);
    /* a hold from a failure (not the 0 of a first heartbeat, answered within one period) that
     * lasts: say which segment keeps the space */
    uint64_t from = by ? s->fence.seg[by].hold_from : 0;
    if (from && now_wall_ms > from + 10000 && now_wall_ms - s->fence_logged_ms > 10000) {
        s->fence_logged_ms = now_wall_ms;
        kvp_log_warn(s->actor, "quarantine release held %llu ms by segment %u: it has not answered "
                     "FenceWriter (its RDMA writers may still place bytes)",
                     (unsigned long long)(now_wall_ms - from), by);
    }
    return at;
}
