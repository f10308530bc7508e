/* devstage.c — staging GPU memory through pinned bounce buffers (devstage.h, docs/gpu.md). */
#include "actors/client/devstage.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "actors/client/devmem.h"
#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define CU_STREAM_NON_BLOCKING 1
#define CU_EVENT_DISABLE_TIMING 2
#define CU_MEMHOSTALLOC_PORTABLE 1

struct lane {
    int ordinal;
    void *ctx;        /* the device's primary context (retained) */
    void *stream;     /* this lane's own stream */
    void *ev[2];      /* completion of the copies into / out of buf[i] */
    uint8_t *buf[2];  /* pinned bounce buffers, window bytes each */
    bool busy;
};

/* A caller waiting for a lane of `ordinal` (a DS_TAKE not answered yet), in arrival order. */
struct lane_wait {
    struct lane_wait *next;
    uint64_t token;
    int ordinal;
};

struct kvp_devstage {
    struct kvp_xfer_engine *engine;
    kvp_devstage_xfer_fn xfer;
    void *xfer_ctx;
    uint64_t window;
    /* The lane pool is the owner actor's (the client actor, or the pool actor of a devstage made
     * without one): lanes, busy flags and the waiters change only on its thread, in
     * kvp_devstage_handle. An API thread takes a lane with a request (answered when one is free:
     * the wait for a free lane is the reply) and gives it back with a request too, so that a
     * give is never still queued when the pool is freed. One round trip each per staged batch
     * (device memory only). */
    struct kvp_rt_actor *owner;     /* where DS_* messages go (a reference) */
    struct kvp_rt_actor *own_actor; /* the pool actor when made without an owner, else NULL */
    struct lane *lanes[DEVSTAGE_MAX_DEVICES][DEVSTAGE_MAX_LANES];
    struct lane_wait *waits, **waits_tail;
    /* Counters added to by API threads per copy, read by status: atomics, since a message per
     * copy would add a hop to the staging pipeline; the lane counts are written by the owner. */
    _Atomic uint64_t bounce_bytes, staged_batches, staged_bytes, copies, copy_errors;
    _Atomic uint32_t n_lanes, lanes_busy;
};

static int default_xfer(void *ctx, struct kvp_xfer_slice *s, size_t n, uint32_t t, void (*ov)(void *), void *arg)
{
    return kvp_xfer_run_overlap(ctx, s, n, t, ov, arg);
}

static int pool_actor_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m)
{
    return kvp_devstage_handle(kvp_rt_state(ctx), ctx, m);
}

int kvp_devstage_new_owned(struct kvp_devstage **out, struct kvp_xfer_engine *e, uint64_t window,
                           struct kvp_rt_actor *owner)
{
    struct kvp_devstage *ds = calloc(1, sizeof *ds);
    if (!ds)
        return KVP_ERR_NOMEM;
    ds->engine = e;
    ds->xfer = default_xfer;
    ds->xfer_ctx = e;
    ds->window = window ? window : DEVSTAGE_DEFAULT_WINDOW;
    ds->waits_tail = &ds->waits;
    if (owner) {
        ds->owner = kvp_rt_ref(owner);
    } else {
        struct kvp_rt_spec spec = {.name = "devstage", .handle = pool_actor_handle, .state = ds};
        int rc = kvp_rt_spawn(&ds->own_actor, &spec, NULL);
        if (rc != KVP_OK) {
            free(ds);
            return rc;
        }
        ds->owner = kvp_rt_ref(ds->own_actor);
    }
    *out = ds;
    return KVP_OK;
}

int kvp_devstage_new(struct kvp_devstage **out, struct kvp_xfer_engine *e, uint64_t window)
{
    return kvp_devstage_new_owned(out, e, window, NULL);
}

void kvp_devstage_set_transport(struct kvp_devstage *ds, kvp_devstage_xfer_fn fn, void *ctx)
{
    ds->xfer = fn ? fn : default_xfer;
    ds->xfer_ctx = fn ? ctx : ds->engine;
}

static void lane_free(struct kvp_devstage *ds, struct lane *l)
{
    const struct kvp_cuda *cu = kvp_devmem_driver();
    if (!l)
        return;
    if (cu && l->ctx && cu->ctx_push(l->ctx) == 0) {
        if (l->stream)
            cu->stream_sync(l->stream);
        for (int i = 0; i < 2; i++) {
            if (l->ev[i])
                cu->event_destroy(l->ev[i]);
            if (l->buf[i]) {
                cu->host_free(l->buf[i]);
                atomic_fetch_sub(&ds->bounce_bytes, ds->window);
            }
        }
        if (l->stream)
            cu->stream_destroy(l->stream);
        void *old;
        cu->ctx_pop(&old);
        int dev;
        if (cu->device_get(&dev, l->ordinal) == 0)
            cu->primary_release(dev);
    }
    free(l);
}

void kvp_devstage_destroy(struct kvp_devstage **pds)
{
    if (!pds || !*pds)
        return;
    struct kvp_devstage *ds = *pds;
    /* The lanes are freed on the owner's thread, after every give already queued there. */
    struct kvp_rt_msg *r = NULL;
    if (kvp_rt_call(ds->owner, 0, DS_FREE, 0, NULL, NULL, 0, &r) == KVP_OK)
        kvp_rt_msg_destroy(&r);
    else
        kvp_log_error("devstage", "free: the pool's owner is gone; its lanes are leaked");
    kvp_rt_unref(&ds->owner);
    kvp_rt_destroy(&ds->own_actor);
    free(ds);
    *pds = NULL;
}

/* A new lane on `ordinal`: primary context, stream, events, pinned buffers. NULL on failure
 * (logged). */
static struct lane *lane_new(struct kvp_devstage *ds, int ordinal)
{
    const struct kvp_cuda *cu = kvp_devmem_driver();
    struct lane *l = calloc(1, sizeof *l);
    if (!cu || !l) {
        free(l);
        return NULL;
    }
    l->ordinal = ordinal;
    int dev = 0;
    kvp_cu_result r = cu->device_get(&dev, ordinal);
    if (r == 0)
        r = cu->primary_retain(&l->ctx, dev);
    if (r != 0) {
        kvp_log_warn("devstage", "device %d: primary context: %s", ordinal, kvp_devmem_errstr(r));
        free(l);
        return NULL;
    }
    r = cu->ctx_push(l->ctx);
    if (r == 0) {
        r = cu->stream_create(&l->stream, CU_STREAM_NON_BLOCKING);
        for (int i = 0; i < 2 && r == 0; i++) {
            r = cu->event_create(&l->ev[i], CU_EVENT_DISABLE_TIMING);
            if (r == 0) {
                r = cu->host_alloc((void **)&l->buf[i], ds->window, CU_MEMHOSTALLOC_PORTABLE);
                if (r == 0)
                    atomic_fetch_add(&ds->bounce_bytes, ds->window);
                else
                    l->buf[i] = NULL;
            }
        }
        void *old;
        cu->ctx_pop(&old);
    }
    if (r != 0) {
        kvp_log_warn("devstage", "device %d: staging lane (stream, events, %llu-byte pinned buffers): %s", ordinal,
                     (unsigned long long)ds->window, kvp_devmem_errstr(r));
        lane_free(ds, l);
        return NULL;
    }
    atomic_fetch_add(&ds->n_lanes, 1);
    return l;
}

/* Owner's thread: a free lane of `ordinal`, created while under DEVSTAGE_MAX_LANES; NULL when
 * all are busy (*full) or one could not be made (logged). */
static struct lane *lane_pick(struct kvp_devstage *ds, int ordinal, bool *full)
{
    int empty = -1;
    *full = false;
    for (int i = 0; i < DEVSTAGE_MAX_LANES; i++) {
        struct lane *l = ds->lanes[ordinal][i];
        if (l && !l->busy) {
            l->busy = true;
            atomic_fetch_add(&ds->lanes_busy, 1);
            return l;
        }
        if (!l && empty < 0)
            empty = i;
    }
    if (empty < 0) {
        *full = true;
        return NULL;
    }
    struct lane *l = lane_new(ds, ordinal);
    if (l) {
        l->busy = true;
        ds->lanes[ordinal][empty] = l;
        atomic_fetch_add(&ds->lanes_busy, 1);
    }
    return l;
}

static void lane_answer(struct kvp_rt_ctx *ctx, uint64_t token, struct lane *l)
{
    (void)kvp_rt_reply(ctx, token, l ? KVP_OK : KVP_ERR_DEVICE, (uint64_t)(uintptr_t)l, NULL, NULL);
}

int kvp_devstage_handle(struct kvp_devstage *ds, struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m)
{
    if (m->kind != KVP_RT_REQUEST)
        return KVP_OK;
    switch (m->type) {
    case DS_TAKE: {
        if (m->arg >= DEVSTAGE_MAX_DEVICES) { /* lane_take checks it; a bad sender gets an error */
            kvp_log_warn("devstage", "take: device ordinal %llu out of range (max %d)",
                         (unsigned long long)m->arg, DEVSTAGE_MAX_DEVICES - 1);
            (void)kvp_rt_reply(ctx, m->corr_id, KVP_ERR_INVALID, 0, NULL, NULL);
            return KVP_OK;
        }
        int ordinal = (int)m->arg;
        bool full;
        struct lane *l = lane_pick(ds, ordinal, &full);
        if (!full) {
            lane_answer(ctx, m->corr_id, l);
            return KVP_OK;
        }
        struct lane_wait *w = malloc(sizeof *w);
        if (!w) {
            (void)kvp_rt_reply(ctx, m->corr_id, KVP_ERR_NOMEM, 0, NULL, NULL);
            return KVP_OK;
        }
        *w = (struct lane_wait){.token = m->corr_id, .ordinal = ordinal};
        *ds->waits_tail = w;
        ds->waits_tail = &w->next;
        return KVP_OK;
    }
    case DS_GIVE: {
        struct lane *l = (struct lane *)(uintptr_t)m->arg;
        (void)kvp_rt_reply(ctx, m->corr_id, KVP_OK, 0, NULL, NULL);
        /* the first caller waiting for this device gets it at once */
        for (struct lane_wait **pw = &ds->waits; *pw; pw = &(*pw)->next) {
            if ((*pw)->ordinal != l->ordinal)
                continue;
            struct lane_wait *w = *pw;
            *pw = w->next;
            if (ds->waits_tail == &w->next)
                ds->waits_tail = pw;
            lane_answer(ctx, w->token, l);
            free(w);
            return KVP_OK;
        }
        l->busy = false;
        atomic_fetch_sub(&ds->lanes_busy, 1);
        return KVP_OK;
    }
    case DS_FREE:
        for (int d = 0; d < DEVSTAGE_MAX_DEVICES; d++)
            for (int i = 0; i < DEVSTAGE_MAX_LANES; i++) {
                lane_free(ds, ds->lanes[d][i]);
                ds->lanes[d][i] = NULL;
            }
        while (ds->waits) { /* none can be left (no batch runs); answered rather than lost */
            struct lane_wait *w = ds->waits;
            ds->waits = w->next;
            (void)kvp_rt_reply(ctx, w->token, KVP_ERR_CLOSED, 0, NULL, NULL);
            free(w);
        }
        ds->waits_tail = &ds->waits;
        (void)kvp_rt_reply(ctx, m->corr_id, KVP_OK, 0, NULL, NULL);
        return KVP_OK;
    default:
        kvp_log_warn("devstage", "unknown message %u", (unsigned)m->type);
        (void)kvp_rt_reply(ctx, m->corr_id, KVP_ERR_INVALID, 0, NULL, NULL);
        return KVP_OK;
    }
}

/* API thread: a lane of `ordinal`, waiting for one to be free. NULL when none can be made. */
static struct lane *lane_take(struct kvp_devstage *ds, int ordinal)
{
    if (ordinal < 0 || ordinal >= DEVSTAGE_MAX_DEVICES)
        return NULL;
    struct kvp_rt_msg *r = NULL;
    if (kvp_rt_call(ds->owner, 0, DS_TAKE, (uint64_t)ordinal, NULL, NULL, 0, &r) != KVP_OK)
        return NULL;
    struct lane *l = r->status == KVP_OK ? (struct lane *)(uintptr_t)r->arg : NULL;
    kvp_rt_msg_destroy(&r);
    return l;
}

/* A give that is dropped leaves the lane busy for good, and a batch waiting for a lane of that
 * device (DS_TAKE, no deadline) could then wait forever: a give that found no memory is tried
 * again every millisecond (logged once); the owner does not close while a batch runs. */
static void lane_give(struct kvp_devstage *ds, struct lane *l)
{
    struct kvp_rt_msg *r = NULL;
    int rc;
    for (int tries = 1; (rc = kvp_rt_call(ds->owner, 0, DS_GIVE, (uint64_t)(uintptr_t)l, NULL, NULL, 0, &r)) ==
                        KVP_ERR_NOMEM;
         tries++) {
        if (tries == 1)
            kvp_log_error("devstage", "giving a lane back: out of memory; trying again every 1 ms");
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 1000000};
        nanosleep(&ts, NULL);
    }
    if (rc == KVP_OK)
        kvp_rt_msg_destroy(&r);
    else
        kvp_log_error("devstage", "giving a lane back failed (%s): the lane stays busy", kvp_errname(rc));
}

int kvp_devstage_pin(struct kvp_devstage *ds, int ordinal)
{
    struct lane *l = lane_take(ds, ordinal);
    if (!l)
        return KVP_ERR_DEVICE;
    lane_give(ds, l);
    return KVP_OK;
}

void kvp_devstage_stats(struct kvp_devstage *ds, struct kvp_devstage_stats *out)
{
    memset(out, 0, sizeof *out);
    out->registered_bytes = kvp_devmem_registered_bytes();
    if (!ds)
        return;
    out->bounce_bytes = atomic_load(&ds->bounce_bytes);
    out->lanes = atomic_load(&ds->n_lanes);
    out->lanes_busy = atomic_load(&ds->lanes_busy);
    out->staged_batches = atomic_load(&ds->staged_batches);
    out->staged_bytes = atomic_load(&ds->staged_bytes);
    out->copies = atomic_load(&ds->copies);
    out->copy_errors = atomic_load(&ds->copy_errors);
}

/* ------------------------------------------------------------------ one device's pipeline */

/* A part (<= window) of a staged slice, at boff in its round's bounce buffer. */
struct chunk {
    size_t slice;
    uint64_t off, len, boff;
    size_t round;
    bool dev;   /* the slice's local memory is device memory */
    bool sent;  /* its transfer completed */
    bool alias; /* another replica's chunk: sent from the bounce bytes of its source, not copied */
};

struct pipe {
    struct kvp_devstage *ds;
    struct kvp_devstage_batch *b;
    const struct kvp_cuda *cu;
    struct lane *l;
    struct chunk *ch;
    size_t n_ch, n_rounds;
    size_t *round_first;   /* chunk index where each round starts; [n_rounds] = n_ch */
    bool *dev_slice;       /* per slice of the batch */
    int *gerr;             /* per group: first device error (0 none) */
    XXH3_state_t **hs;     /* per group: checksum state (staged groups) */
    struct kvp_xfer_slice *xs;
    size_t *xs_chunk;      /* per transport slice: chunk index, or SIZE_MAX + host slice index */
    uint64_t deadline_ms;  /* 0 none */
    int stop;              /* why the pipeline stopped early (0: it did not) */
};

static void fail_group(struct pipe *p, size_t g, kvp_cu_result r, const char *what)
{
    atomic_fetch_add(&p->ds->copy_errors, 1);
    if (p->gerr[g])
        return;
    p->gerr[g] = KVP_ERR_DEVICE;
    kvp_log_warn("devstage", "device %d: %s failed: %s: its key fails with KVP_ERR_DEVICE", p->l->ordinal, what,
                 kvp_devmem_errstr(r));
}

/* A failure of an event/stream: every group with a device chunk in rounds [r0, r1] fails. */
static void fail_rounds(struct pipe *p, size_t r0, size_t r1, kvp_cu_result r, const char *what)
{
    for (size_t c = p->round_first[r0]; c < p->round_first[r1 + 1]; c++)
        if (p->ch[c].dev)
            fail_group(p, p->b->group[p->ch[c].slice], r, what);
}

static bool chunk_live(const struct pipe *p, const struct chunk *c)
{
    return !p->gerr[p->b->group[c->slice]] && p->b->slices[c->slice].status == KVP_OK;
}

static void feed_round(struct pipe *p, size_t k)
{
    for (size_t c = p->round_first[k]; c < p->round_first[k + 1]; c++) {
        const struct chunk *ch = &p->ch[c];
        if (!chunk_live(p, ch) || ch->alias || (p->b->feed && !p->b->feed[ch->slice]))
            continue;
        XXH3_state_t *h = p->hs[p->b->group[ch->slice]];
        if (h)
            XXH3_64bits_update(h, p->l->buf[k % 2] + ch->boff, ch->len);
    }
}

/* The put's round k: device → bounce (enqueued on the lane's stream; host pieces memcpy). */
static void put_issue(struct pipe *p, size_t k)
{
    uint8_t *buf = p->l->buf[k % 2];
    for (size_t c = p->round_first[k]; c < p->round_first[k + 1]; c++) {
        struct chunk *ch = &p->ch[c];
        if (!chunk_live(p, ch))
            continue;
        const uint8_t *src = (const uint8_t *)p->b->slices[ch->slice].local + ch->off;
        if (ch->alias)
            continue; /* its source chunk (same bytes, same boff) is copied */
        if (!ch->dev) {
            memcpy(buf + ch->boff, src, ch->len);
            continue;
        }
        kvp_cu_result r = p->cu->d2h_async(buf + ch->boff, (kvp_cu_devptr)(uintptr_t)src, ch->len, p->l->stream);
        atomic_fetch_add(&p->ds->copies, 1);
        if (r != 0)
            fail_group(p, p->b->group[ch->slice], r, "device-to-host copy");
        else
            atomic_fetch_add(&p->ds->staged_bytes, ch->len);
    }
    kvp_cu_result r = p->cu->event_record(p->l->ev[k % 2], p->l->stream);
    if (r != 0)
        fail_rounds(p, k, k, r, "event record");
}

struct round_ov {
    struct pipe *p;
    size_t k;
    bool feed; /* put: checksum the bounce buffer while it is on the wire */
    void (*user)(void *);
    void *arg;
};

static void round_overlap(void *a)
{
    struct round_ov *o = a;
    if (o->feed)
        feed_round(o->p, o->k);
    if (o->user)
        o->user(o->arg);
}

static uint32_t left_ms(const struct pipe *p)
{
    if (!p->deadline_ms)
        return 0;
    uint64_t now = kvp_clock_now_ms();
    return now >= p->deadline_ms ? 0 : (uint32_t)(p->deadline_ms - now);
}

/* Send (put) or receive (get) round k through the transport, with the batch's host slices when
 * `host` (their statuses are copied back). */
static void run_round(struct pipe *p, size_t k, bool host, bool feed)
{
    struct kvp_devstage_batch *b = p->b;
    size_t nx = 0;
    if (host)
        for (size_t i = 0; i < b->n; i++)
            if (b->group_dev[b->group[i]] < 0) {
                p->xs[nx] = b->slices[i];
                p->xs_chunk[nx++] = SIZE_MAX - i;
            }
    for (size_t c = p->round_first[k]; c < p->round_first[k + 1]; c++) {
        const struct chunk *ch = &p->ch[c];
        if (!chunk_live(p, ch))
            continue;
        p->xs[nx] = b->slices[ch->slice];
        p->xs[nx].local = p->l->buf[k % 2] + ch->boff;
        p->xs[nx].length = ch->len;
        p->xs[nx].remote_offset += ch->off;
        p->xs[nx].status = KVP_ERR_TIMEOUT;
        p->xs_chunk[nx++] = c;
    }
    uint32_t t = 0;
    if (p->deadline_ms) {
        t = left_ms(p);
        if (t == 0) {
            p->stop = KVP_ERR_TIMEOUT;
            for (size_t i = 0; i < nx; i++)
                if (p->xs_chunk[i] > p->n_ch) /* host slices: fenced before they ran */
                    b->slices[SIZE_MAX - p->xs_chunk[i]].status = KVP_ERR_TIMEOUT;
            return;
        }
    }
    struct round_ov ov = {.p = p, .k = k, .feed = feed, .user = host ? b->overlap : NULL, .arg = b->arg};
    if (nx > 0)
        p->ds->xfer(p->ds->xfer_ctx, p->xs, nx, t, round_overlap, &ov);
    for (size_t i = 0; i < nx; i++) {
        int st = p->xs[i].status;
        if (p->xs_chunk[i] > p->n_ch) {
            b->slices[SIZE_MAX - p->xs_chunk[i]].status = st;
            continue;
        }
        struct chunk *ch = &p->ch[p->xs_chunk[i]];
        if (st == KVP_OK) {
            ch->sent = true;
            continue;
        }
        if (b->slices[ch->slice].status == KVP_OK)
            b->slices[ch->slice].status = st;
        if (st == KVP_ERR_TIMEOUT || st == KVP_ERR_CLOSED || st == KVP_ERR_FENCE_FAILED)
            p->stop = st;
    }
}

/* The get's round k, after it was received: bounce → caller memory (device pieces enqueued). */
static void get_land(struct pipe *p, size_t k)
{
    uint8_t *buf = p->l->buf[k % 2];
    feed_round(p, k);
    for (size_t c = p->round_first[k]; c < p->round_first[k + 1]; c++) {
        struct chunk *ch = &p->ch[c];
        if (!ch->sent || !chunk_live(p, ch))
            continue;
        uint8_t *dst = (uint8_t *)p->b->slices[ch->slice].local + ch->off;
        if (!ch->dev) {
            memcpy(dst, buf + ch->boff, ch->len);
            continue;
        }
        kvp_cu_result r = p->cu->h2d_async((kvp_cu_devptr)(uintptr_t)dst, buf + ch->boff, ch->len, p->l->stream);
        atomic_fetch_add(&p->ds->copies, 1);
        if (r != 0)
            fail_group(p, p->b->group[ch->slice], r, "host-to-device copy");
        else
            atomic_fetch_add(&p->ds->staged_bytes, ch->len);
    }
    kvp_cu_result r = p->cu->event_record(p->l->ev[k % 2], p->l->stream);
    if (r != 0)
        fail_rounds(p, k, k, r, "event record");
}

static void run_pipeline(struct pipe *p, bool host, bool put)
{
    size_t R = p->n_rounds;
    if (put) {
        if (R > 0)
            put_issue(p, 0);
        for (size_t k = 0; k < R; k++) {
            kvp_cu_result r = p->cu->event_sync(p->l->ev[k % 2]);
            if (r != 0)
                fail_rounds(p, k, k, r, "device-to-host copy (event)");
            if (k + 1 < R)
                put_issue(p, k + 1); /* overlaps the send of round k */
            run_round(p, k, host && k == 0, true);
            if (p->stop)
                break;
        }
        if (R == 0 && host)
            run_round(p, 0, true, false);
    } else {
        for (size_t k = 0; k < R; k++) {
            if (k >= 2) { /* buf[k % 2] is free once the copy out of it (round k-2) completed */
                kvp_cu_result r = p->cu->event_sync(p->l->ev[k % 2]);
                if (r != 0)
                    fail_rounds(p, k - 2, k - 2, r, "host-to-device copy (event)");
            }
            run_round(p, k, host && k == 0, false);
            get_land(p, k); /* overlaps the receive of round k+1 */
            if (p->stop)
                break;
        }
        if (R == 0 && host)
            run_round(p, 0, true, false);
    }
    /* The fence: nothing this batch enqueued may still run when the call returns (C2). */
    kvp_cu_result r = p->cu->stream_sync(p->l->stream);
    if (r != 0 && R > 0)
        fail_rounds(p, 0, R - 1, r, "stream synchronise");
}

/* ------------------------------------------------------------------ the batch */

/* For the slices of device `dev`'s groups: alias[i] = the replica-0 slice (feed 1, same group,
 * same local range) whose bounce bytes slice i (feed 0) is sent from, else SIZE_MAX;
 * alias_head/alias_next chain each source's aliases. Within a group (contiguous, as the put
 * builds them: replica by replica, piece by piece) the k-th feed-0 slice is matched to the
 * (k mod F)-th of its F feed-1 slices, and kept only when the local range is the same. */
static void find_aliases(const struct kvp_devstage_batch *b, int dev, size_t *alias, size_t *alias_next,
                         size_t *alias_head, size_t *twins)
{
    size_t g = SIZE_MAX, nf = 0, nz = 0;
    for (size_t i = 0; i < b->n; i++) {
        alias[i] = alias_next[i] = alias_head[i] = SIZE_MAX;
        if (b->group_dev[b->group[i]] != dev)
            continue;
        if (b->group[i] != g) {
            g = b->group[i];
            nf = nz = 0;
        }
        if (b->feed[i]) {
            if (nz == 0)
                twins[nf++] = i; /* replica 0's pieces come first */
            continue;
        }
        if (nf == 0)
            continue;
        size_t j = twins[nz++ % nf];
        if (b->slices[j].local == b->slices[i].local && b->slices[j].length == b->slices[i].length) {
            alias[i] = j;
            alias_next[i] = alias_head[j];
            alias_head[j] = i;
        }
    }
}

int kvp_devstage_run(struct kvp_devstage *ds, struct kvp_devstage_batch *b)
{
    bool any = false;
    for (size_t g = 0; g < b->n_groups && !any; g++)
        any = b->group_dev[g] >= 0;
    if (!any || !ds)
        return ds ? ds->xfer(ds->xfer_ctx, b->slices, b->n, b->timeout_ms, b->overlap, b->arg)
                  : kvp_xfer_run_overlap(NULL, b->slices, b->n, b->timeout_ms, b->overlap, b->arg);
    atomic_fetch_add(&ds->staged_batches, 1);
    const struct kvp_cuda *cu = kvp_devmem_driver();
    bool put = b->n > 0 && b->slices[0].op == KVP_XFER_WRITE;
    struct pipe p = {.ds = ds, .b = b, .cu = cu};
    p.gerr = calloc(b->n_groups, sizeof *p.gerr);
    p.hs = calloc(b->n_groups, sizeof *p.hs);
    p.dev_slice = calloc(b->n ? b->n : 1, sizeof *p.dev_slice);
    if (b->timeout_ms)
        p.deadline_ms = kvp_clock_now_ms() + b->timeout_ms;
    int rc = KVP_OK;
    bool host_done = false;
    size_t *alias = NULL, *alias_next = NULL, *alias_head = NULL, *twins = NULL;
    if (put && b->feed) { /* replicas share their copies (find_aliases); without memory, they do not */
        alias = malloc(b->n * sizeof *alias);
        alias_next = malloc(b->n * sizeof *alias_next);
        alias_head = malloc(b->n * sizeof *alias_head);
        twins = malloc(b->n * sizeof *twins);
        if (!alias || !alias_next || !alias_head || !twins) {
            free(alias);
            free(alias_next);
            free(alias_head);
            free(twins);
            alias = NULL;
        }
    }
    if (!p.gerr || !p.hs || !p.dev_slice || !cu) {
        for (size_t i = 0; i < b->n; i++)
            b->slices[i].status = cu ? KVP_ERR_NOMEM : KVP_ERR_DEVICE;
        rc = cu ? KVP_ERR_NOMEM : KVP_ERR_DEVICE;
        goto out;
    }
    for (size_t g = 0; g < b->n_groups; g++)
        if (b->group_dev[g] >= 0) {
            p.hs[g] = XXH3_createState();
            if (p.hs[g])
                XXH3_64bits_reset(p.hs[g]);
        }
    for (size_t i = 0; i < b->n; i++) {
        size_t g = b->group[i];
        if (b->group_dev[g] < 0)
            continue;
        b->slices[i].status = KVP_OK; /* first error wins from here on */
        struct kvp_devmem_info info;
        int cl = kvp_devmem_classify(b->slices[i].local, &info);
        if (cl < 0)
            p.gerr[g] = KVP_ERR_DEVICE;
        p.dev_slice[i] = cl == 1;
    }
    /* one pipeline per device, in turn; the host slices ride with the first one's first round */
    for (int dev = 0; dev < DEVSTAGE_MAX_DEVICES; dev++) {
        size_t nslices = 0;
        uint64_t bytes = 0;
        for (size_t i = 0; i < b->n; i++)
            if (b->group_dev[b->group[i]] == dev) {
                nslices++;
                bytes += b->slices[i].length;
            }
        if (nslices == 0)
            continue;
        size_t max_ch = nslices + (size_t)(bytes / ds->window) + 1;
        p.ch = calloc(max_ch * 2, sizeof *p.ch);
        p.round_first = calloc(max_ch * 2 + 2, sizeof *p.round_first);
        p.xs = calloc(max_ch * 2 + b->n, sizeof *p.xs);
        p.xs_chunk = calloc(max_ch * 2 + b->n, sizeof *p.xs_chunk);
        p.l = p.ch && p.round_first && p.xs && p.xs_chunk ? lane_take(ds, dev) : NULL;
        if (!p.l) {
            for (size_t i = 0; i < b->n; i++)
                if (b->group_dev[b->group[i]] == dev && !p.gerr[b->group[i]]) {
                    p.gerr[b->group[i]] = KVP_ERR_DEVICE;
                    atomic_fetch_add(&ds->copy_errors, 1);
                }
            kvp_log_warn("devstage", "device %d: no staging lane (driver error or no memory): its %zu slice(s) fail "
                         "with KVP_ERR_DEVICE", dev, nslices);
        } else {
            /* a put's replicas: the slices of replica r >= 1 (feed 0) repeat replica 0's (feed 1)
             * local ranges; each is sent from its replica-0 twin's bounce bytes (one copy) */
            if (put && b->feed && alias)
                find_aliases(b, dev, alias, alias_next, alias_head, twins);
            /* chunks in slice order, packed into rounds of one bounce buffer each */
            p.n_ch = 0;
            p.n_rounds = 0;
            uint64_t fill = ds->window; /* forces a new round at the first chunk */
            for (size_t i = 0; i < b->n; i++) {
                if (b->group_dev[b->group[i]] != dev || (alias && alias[i] != SIZE_MAX))
                    continue;
                for (uint64_t off = 0; off < b->slices[i].length;) {
                    if (fill == ds->window) {
                        p.round_first[p.n_rounds++] = p.n_ch;
                        fill = 0;
                    }
                    uint64_t len = b->slices[i].length - off;
                    if (len > ds->window - fill)
                        len = ds->window - fill;
                    p.ch[p.n_ch++] = (struct chunk){.slice = i, .off = off, .len = len, .boff = fill,
                                                    .round = p.n_rounds - 1, .dev = p.dev_slice[i]};
                    for (size_t a = alias ? alias_head[i] : SIZE_MAX; a != SIZE_MAX; a = alias_next[a])
                        p.ch[p.n_ch++] = (struct chunk){.slice = a, .off = off, .len = len, .boff = fill,
                                                        .round = p.n_rounds - 1, .dev = p.dev_slice[a],
                                                        .alias = true};
                    off += len;
                    fill += len;
                }
            }
            p.round_first[p.n_rounds] = p.n_ch;
            p.stop = 0;
            kvp_cu_result r = cu->ctx_push(p.l->ctx);
            if (r != 0) {
                fail_rounds(&p, 0, p.n_rounds - 1, r, "context push");
            } else {
                run_pipeline(&p, !host_done, put);
                host_done = true;
                void *old;
                cu->ctx_pop(&old);
            }
            /* chunks never sent: the pipeline stopped (their slices are already failed, or get
             * the reason it stopped) */
            for (size_t c = 0; c < p.n_ch; c++)
                if (!p.ch[c].sent && b->slices[p.ch[c].slice].status == KVP_OK)
                    b->slices[p.ch[c].slice].status = p.stop ? p.stop : KVP_ERR_TIMEOUT;
            lane_give(ds, p.l);
        }
        free(p.ch);
        free(p.round_first);
        free(p.xs);
        free(p.xs_chunk);
        p.ch = NULL;
        p.round_first = NULL;
        p.xs = NULL;
        p.xs_chunk = NULL;
    }
    if (!host_done) { /* every device lane failed: the host slices still run */
        size_t nh = 0;
        for (size_t i = 0; i < b->n; i++)
            nh += b->group_dev[b->group[i]] < 0;
        struct kvp_xfer_slice *hs = calloc(nh ? nh : 1, sizeof *hs);
        size_t *hi = calloc(nh ? nh : 1, sizeof *hi);
        if (hs && hi && nh > 0) {
            size_t k = 0;
            for (size_t i = 0; i < b->n; i++)
                if (b->group_dev[b->group[i]] < 0) {
                    hi[k] = i;
                    hs[k++] = b->slices[i];
                }
            ds->xfer(ds->xfer_ctx, hs, nh, b->timeout_ms, b->overlap, b->arg);
            for (size_t k2 = 0; k2 < nh; k2++)
                b->slices[hi[k2]].status = hs[k2].status;
        } else if (nh > 0) {
            for (size_t i = 0; i < b->n; i++)
                if (b->group_dev[b->group[i]] < 0)
                    b->slices[i].status = KVP_ERR_NOMEM;
        }
        free(hs);
        free(hi);
    }
    for (size_t i = 0; i < b->n; i++) {
        size_t g = b->group[i];
        if (b->group_dev[g] >= 0 && p.gerr[g])
            b->slices[i].status = p.gerr[g];
        if (rc == KVP_OK && b->slices[i].status != KVP_OK)
            rc = b->slices[i].status;
    }
    for (size_t g = 0; g < b->n_groups; g++)
        if (p.hs[g] && b->sum)
            b->sum[g] = XXH3_64bits_digest(p.hs[g]);
out:
    if (alias) {
        free(alias);
        free(alias_next);
        free(alias_head);
        free(twins);
    }
    if (p.hs)
        for (size_t g = 0; g < b->n_groups; g++)
            if (p.hs[g])
                XXH3_freeState(p.hs[g]);
    free(p.hs);
    free(p.gerr);
    free(p.dev_slice);
    return rc;
}
