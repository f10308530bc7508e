/*
 * fence_track.c — the leader's record of the segment-side RDMA fence; see fence_track.h.
 */
#include "actors/master/service/fence_track.h"

#include <stdlib.h>
#include <string.h>

/* Ids above this are not recorded (a bound on what a bad heartbeat can make us allocate). */
#define KVP_FENCE_TRACK_MAX_ID (1u << 22)

void kvp_fence_track_reset(struct kvp_fence_track *t)
{
    if (t->seg)
        memset(t->seg, 0, (size_t)t->cap * sizeof *t->seg);
}

void kvp_fence_track_fini(struct kvp_fence_track *t)
{
    free(t->seg);
    memset(t, 0, sizeof *t);
}

static struct kvp_fence_seg *slot(struct kvp_fence_track *t, uint32_t seg, bool grow)
{
    if (seg == 0)
        return NULL;
    if (seg < t->cap)
        return &t->seg[seg];
    if (!grow)
        return NULL;
    if (seg >= KVP_FENCE_TRACK_MAX_ID)
        return NULL;
    uint32_t cap = t->cap ? t->cap : 64;
    while (cap <= seg)
        cap *= 2;
    struct kvp_fence_seg *n = realloc(t->seg, (size_t)cap * sizeof *n);
    if (!n)
        return NULL;
    memset(n + t->cap, 0, (size_t)(cap - t->cap) * sizeof *n);
    t->seg = n;
    t->cap = cap;
    return &t->seg[seg];
}

/* hold_from and asked from what is pending */
static void settle(struct kvp_fence_seg *e)
{
    e->asked = e->n_sel > 0;
    if (!e->asked)
        return;
    e->hold_from = e->sel[0].hold_from;
    for (uint32_t i = 1; i < e->n_sel; i++)
        if (e->sel[i].hold_from < e->hold_from)
            e->hold_from = e->sel[i].hold_from;
}

/* One entry for every writer, at seq, holding from the earliest of hold_from and what was pending. */
static void collapse_all(struct kvp_fence_seg *e, uint64_t seq, uint64_t hold_from)
{
    for (uint32_t i = 0; i < e->n_sel; i++)
        if (e->sel[i].hold_from < hold_from)
            hold_from = e->sel[i].hold_from;
    e->sel[0] = (struct kvp_fence_sel){.client_id = 0, .mask = 0, .seq = seq, .hold_from = hold_from};
    e->n_sel = 1;
}

/* A new fence of the writers (client_id, mask) selects (mask 0: every writer), merged. */
static void ask_sel(struct kvp_fence_track *t, struct kvp_fence_seg *e, uint64_t hold_from,
                    uint64_t client_id, uint64_t mask)
{
    uint64_t seq = ++t->last_seq;
    t->asks++;
    e->want_seq = seq;
    if (!e->selectors || mask == 0 || (client_id & mask) == 0 ||
        (e->n_sel == 1 && e->sel[0].mask == 0)) {
        collapse_all(e, seq, hold_from);
        settle(e);
        return;
    }
    client_id &= mask;
    uint32_t i = 0;
    while (i < e->n_sel && (e->sel[i].client_id != client_id || e->sel[i].mask != mask))
        i++;
    if (i < e->n_sel) {
        e->sel[i].seq = seq; /* the fence it had may have run before this failure */
        if (hold_from < e->sel[i].hold_from)
            e->sel[i].hold_from = hold_from;
    } else if (e->n_sel < KVP_FENCE_SELECTORS_MAX) {
        e->sel[e->n_sel++] = (struct kvp_fence_sel){.client_id = client_id, .mask = mask, .seq = seq,
                                                    .hold_from = hold_from};
    } else {
        collapse_all(e, seq, hold_from);
    }
    settle(e);
}

static void ask(struct kvp_fence_track *t, struct kvp_fence_seg *e, uint64_t hold_from)
{
    ask_sel(t, e, hold_from, 0, 0);
}

uint32_t kvp_fence_track_note_failure(struct kvp_fence_track *t, uint64_t wall_ms)
{
    return kvp_fence_track_note_writer_failure(t, wall_ms, 0, 0);
}

uint32_t kvp_fence_track_note_writer_failure(struct kvp_fence_track *t, uint64_t wall_ms,
                                             uint64_t client_id, uint64_t mask)
{
    uint32_t n = 0;
    for (uint32_t i = 1; i < t->cap; i++) {
        if (!t->seg[i].rdma)
            continue;
        ask_sel(t, &t->seg[i], wall_ms, client_id, mask);
        n++;
    }
    return n;
}

uint64_t kvp_fence_track_heartbeat(struct kvp_fence_track *t, uint32_t seg, bool rdma_writers,
                                   uint64_t fenced_seq, int fenced_status, bool *nomem)
{
    return kvp_fence_track_heartbeat_sel(t, seg, rdma_writers, false, fenced_seq, fenced_status, nomem);
}

uint64_t kvp_fence_track_heartbeat_sel(struct kvp_fence_track *t, uint32_t seg, bool rdma_writers,
                                       bool selectors, uint64_t fenced_seq, int fenced_status,
                                       bool *nomem)
{
    if (nomem)
        *nomem = false;
    struct kvp_fence_seg *e = slot(t, seg, rdma_writers);
    if (!e) {
        if (rdma_writers && seg && nomem)
            *nomem = true;
        return 0;
    }
    if (!rdma_writers) {
        /* a segment that no longer serves RDMA (restarted without it): nothing to fence */
        memset(e, 0, sizeof *e);
        return 0;
    }
    if (!e->rdma) {
        /* first heard by this leader: fences an older leader waited for are unknown here, so
         * one fence of every writer now, and every quarantine entry waits for it */
        e->rdma = true;
        e->selectors = selectors;
        ask(t, e, 0);
        return e->want_seq;
    }
    if (e->selectors && !selectors) {
        /* it no longer runs selectors: what is pending becomes one fence of every writer */
        e->selectors = false;
        if (e->asked && !(e->n_sel == 1 && e->sel[0].mask == 0)) {
            ask(t, e, UINT64_MAX);
            return e->want_seq;
        }
    }
    e->selectors = selectors;
    if (!e->asked || fenced_seq == 0 || fenced_seq > e->want_seq)
        return e->asked ? e->want_seq : 0;
    if (fenced_status != 0) {
        if (fenced_seq == e->want_seq) {
            /* it failed there: everything pending is asked again under a new seq */
            uint64_t seq = ++t->last_seq;
            t->asks++;
            e->want_seq = seq;
            for (uint32_t i = 0; i < e->n_sel; i++)
                e->sel[i].seq = seq;
        }
        return e->want_seq;
    }
    /* the FenceWriter of fenced_seq named every selector whose seq is <= it */
    uint32_t k = 0;
    for (uint32_t i = 0; i < e->n_sel; i++)
        if (e->sel[i].seq > fenced_seq)
            e->sel[k++] = e->sel[i];
    if (k != e->n_sel) {
        e->n_sel = k;
        e->acked++;
        t->acks++;
        settle(e);
    }
    return e->asked ? e->want_seq : 0;
}

bool kvp_fence_track_ask(const struct kvp_fence_track *t, uint32_t seg, uint64_t *seq,
                         const struct kvp_fence_sel **sel, uint32_t *n)
{
    const struct kvp_fence_seg *e = seg && seg < t->cap ? &t->seg[seg] : NULL;
    if (!e || !e->asked)
        return false;
    *seq = e->want_seq;
    bool all = !e->selectors || (e->n_sel == 1 && e->sel[0].mask == 0);
    *sel = all ? NULL : e->sel;
    *n = all ? 0 : e->n_sel;
    return true;
}

uint64_t kvp_fence_track_release_time(struct kvp_fence_track *t, uint64_t now_ms, uint64_t grace_ms,
                                      bool (*alive)(void *ctx, uint32_t seg), void *ctx,
                                      uint32_t *held_by)
{
    uint64_t at = now_ms;
    uint32_t by = 0;
    if (grace_ms == 0)
        grace_ms = 1;
    for (uint32_t i = 1; i < t->cap; i++) {
        struct kvp_fence_seg *e = &t->seg[i];
        if (!e->asked)
            continue;
        if (alive && !alive(ctx, i)) {
            memset(e, 0, sizeof *e);
            continue;
        }
        /* released: freed_at + grace <= stamp; held: freed_at >= hold_from */
        uint64_t cap = e->hold_from + grace_ms - 1;
        if (cap < at) {
            at = cap;
            by = i;
        }
    }
    if (held_by)
        *held_by = by;
    return at;
}
