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

static void ask(struct kvp_fence_track *t, struct kvp_fence_seg *e, uint64_t hold_from)
{
    if (!e->asked || hold_from < e->hold_from)
        e->hold_from = hold_from;
    e->asked = true;
    e->want_seq = ++t->last_seq;
    t->asks++;
}

uint32_t kvp_fence_track_note_failure(struct kvp_fence_track *t, uint64_t wall_ms)
{
    uint32_t n = 0;
    for (uint32_t i = 1; i < t->cap; i++) {
        if (!t->seg[i].rdma)
            continue;
        ask(t, &t->seg[i], wall_ms);
        n++;
    }
    return n;
}

uint64_t kvp_fence_track_heartbeat(struct kvp_fence_track *t, uint32_t seg, bool rdma_writers,
                                   uint64_t fenced_seq, int fenced_status, bool *nomem)
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
         * one fence now, and every quarantine entry waits for it */
        e->rdma = true;
        ask(t, e, 0);
        return e->want_seq;
    }
    if (e->asked && fenced_seq == e->want_seq) {
        if (fenced_status == 0) {
            e->asked = false;
            e->acked++;
            t->acks++;
        } else {
            ask(t, e, e->hold_from); /* it failed there: a new seq asks again */
        }
    }
    return e->asked ? e->want_seq : 0;
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
