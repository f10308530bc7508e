/* actor_loop.c — the part of an actor that runs on its own thread: dispatch, requests and
 * replies, timers, hosted actors, supervision, close. Everything here runs on the actor's
 * thread (or the kvp_rt_poll caller for a manual actor) and takes no lock except through
 * rt_push/rt_take_all. See actor.h for the contract. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "runtime/actor_internal.h"
#include "runtime/clock.h"
#include "runtime/log.h"

void rt_core_init(struct kvp_rt_actor *a)
{
    struct rt_core *c = &a->core;
    memset(c, 0, sizeof(*c));
    rt_hmap_init(&c->hosted);
    rt_hmap_init(&c->pending);
    rt_hmap_init(&c->owed);
    rt_hmap_init(&c->timers);
}

static struct rt_hosted *hosted_get(struct kvp_rt_actor *a, uint64_t hid)
{
    struct rt_hnode *n = rt_hmap_get(&a->core.hosted, hid);
    return n ? RT_CONTAINER(n, struct rt_hosted, node) : NULL;
}

int rt_core_start(struct kvp_rt_actor *a)
{
    if (!a->spec.init)
        return KVP_OK;
    struct kvp_rt_ctx ctx = {a, NULL};
    return a->spec.init(&ctx);
}

/* Run one handler for `m` (owned here) in actor a / hosted h, then free m. */
static void deliver(struct kvp_rt_actor *a, struct rt_hosted *h, struct kvp_rt_msg *m)
{
    struct rt_core *c = &a->core;
    struct rt_hosted *prev = c->running;
    c->running = h;
    struct kvp_rt_ctx ctx = {a, h};
    int rc = h ? h->spec.handle(&ctx, m) : a->spec.handle(&ctx, m);
    c->running = prev;
    rt_msg_free(m);
    if (rc < 0)
        rt_core_fail(a, h, rc);
    else if (rc == KVP_RT_DONE && h)
        kvp_rt_hosted_finish(&(struct kvp_rt_ctx){a, NULL}, h->node.key);
}

/* Deliver to hosted id `hid` (0 = the actor) if it still exists; else drop m. */
static void deliver_to(struct kvp_rt_actor *a, uint64_t hid, struct kvp_rt_msg *m)
{
    struct rt_hosted *h = NULL;
    if (hid) {
        h = hosted_get(a, hid);
        if (!h) {
            kvp_log_debug(a->name, "message type %u for finished hosted actor %llu dropped",
                          m->type, (unsigned long long)hid);
            rt_msg_free(m); /* a request is answered CLOSED */
            return;
        }
    }
    deliver(a, h, m);
}

static void owed_close(struct kvp_rt_actor *a, struct rt_owed *o)
{
    if (o->hid) {
        struct rt_hosted *h = hosted_get(a, o->hid);
        if (h)
            h->owed--;
    }
    rt_send_reply(o->from, o->from_hid, o->from_corr, o->type, KVP_ERR_CLOSED, 0, NULL, NULL);
    kvp_rt_unref(&o->from);
    free(o);
}

static void timer_free(struct kvp_rt_actor *a, struct rt_timer *t)
{
    if (!t->deadline && t->hid) {
        struct rt_hosted *h = hosted_get(a, t->hid);
        if (h)
            h->timers--;
    }
    free(t);
}

void rt_core_dispatch(struct kvp_rt_actor *a, struct kvp_rt_msg *m)
{
    struct rt_core *c = &a->core;
    if (c->closed) {
        rt_msg_free(m); /* a request is answered CLOSED */
        return;
    }
    switch (m->kind) {
    case KVP_RT_REPLY: {
        struct rt_hnode *n = rt_hmap_del(&c->pending, m->corr_id);
        if (!n) { /* it timed out already */
            kvp_log_debug(a->name, "late reply %llu dropped", (unsigned long long)m->corr_id);
            rt_msg_free(m);
            return;
        }
        struct rt_pending *p = RT_CONTAINER(n, struct rt_pending, node);
        if (p->deadline) {
            rt_heap_remove(&c->heap, p->deadline);
            free(p->deadline);
        }
        uint64_t hid = p->hid;
        free(p);
        deliver_to(a, hid, m);
        return;
    }
    case KVP_RT_REQUEST: {
        struct rt_hosted *h = NULL;
        if (m->to_hid && !(h = hosted_get(a, m->to_hid))) {
            rt_msg_free(m); /* answered CLOSED */
            return;
        }
        struct rt_owed *o = calloc(1, sizeof(*o));
        if (o) {
            o->node.key = ++c->next_token;
            if (rt_hmap_put(&c->owed, &o->node)) {
                free(o);
                o = NULL;
            }
        }
        if (!o) {
            kvp_log_error(a->name, "request type %u: out of memory, answered CLOSED", m->type);
            rt_msg_free(m);
            return;
        }
        o->from = m->from;
        m->from = NULL; /* the reference moves to the owed entry */
        o->from_hid = m->from_hid;
        o->from_corr = m->from_corr;
        o->hid = m->to_hid;
        o->type = m->type;
        if (h)
            h->owed++;
        m->corr_id = o->node.key;
        deliver(a, h, m);
        return;
    }
    default:
        deliver_to(a, m->to_hid, m);
        return;
    }
}

/* ------------------------------------------------------------------ context accessors */

struct kvp_rt_actor *kvp_rt_self(struct kvp_rt_ctx *ctx) { return ctx->a; }
uint64_t kvp_rt_self_hid(struct kvp_rt_ctx *ctx) { return ctx->h ? ctx->h->node.key : 0; }
void *kvp_rt_state(struct kvp_rt_ctx *ctx) { return ctx->h ? ctx->h->state : ctx->a->core.state; }
const char *kvp_rt_ctx_name(struct kvp_rt_ctx *ctx) { return ctx->h ? ctx->h->name : ctx->a->name; }

void kvp_rt_set_state(struct kvp_rt_ctx *ctx, void *state)
{
    if (ctx->h)
        ctx->h->state = state;
    else
        ctx->a->core.state = state;
}

/* ------------------------------------------------------------------ requests and replies */

int kvp_rt_request(struct kvp_rt_ctx *ctx, struct kvp_rt_actor *to, uint64_t hid, uint32_t type,
                   uint64_t arg, void **payload, kvp_rt_free_fn free_fn, uint32_t timeout_ms,
                   uint64_t *corr_id)
{
    if (!ctx || !to)
        return KVP_ERR_INVALID;
    struct kvp_rt_actor *a = ctx->a;
    struct rt_core *c = &a->core;
    if (c->closed)
        return KVP_ERR_CLOSED;
    struct rt_pending *p = calloc(1, sizeof(*p));
    struct kvp_rt_msg *m = rt_msg_new(KVP_RT_REQUEST, type, arg);
    struct rt_timer *t = timeout_ms ? calloc(1, sizeof(*t)) : NULL;
    if (!p || !m || (timeout_ms && !t))
        goto nomem;
    p->node.key = ++c->next_corr;
    p->hid = kvp_rt_self_hid(ctx);
    p->type = type;
    if (rt_hmap_put(&c->pending, &p->node))
        goto nomem;
    if (t) {
        t->deadline = true;
        t->corr = p->node.key;
        t->due_us = kvp_clock_now_us() + (uint64_t)timeout_ms * 1000u;
        if (rt_heap_push(&c->heap, t)) {
            rt_hmap_del(&c->pending, p->node.key);
            goto nomem;
        }
        p->deadline = t;
    }
    m->to_hid = hid;
    m->from = kvp_rt_ref(a);
    m->from_hid = p->hid;
    m->from_corr = p->node.key;
    if (payload && *payload) {
        m->payload = *payload;
        m->free_fn = free_fn;
    }
    int rc = rt_push(to, m);
    if (rc) {
        m->payload = NULL;
        kvp_rt_unref(&m->from);
        rt_msg_free(m);
        rt_hmap_del(&c->pending, p->node.key);
        if (t)
            rt_heap_remove(&c->heap, t);
        free(t);
        free(p);
        return rc;
    }
    if (payload)
        *payload = NULL;
    if (corr_id)
        *corr_id = p->node.key;
    return KVP_OK;
nomem:
    free(p);
    free(t);
    if (m)
        free(m);
    return KVP_ERR_NOMEM;
}

int kvp_rt_reply(struct kvp_rt_ctx *ctx, uint64_t token, int status, uint64_t arg,
                 void **payload, kvp_rt_free_fn free_fn)
{
    if (!ctx)
        return KVP_ERR_INVALID;
    struct kvp_rt_actor *a = ctx->a;
    struct rt_hnode *n = rt_hmap_del(&a->core.owed, token);
    if (!n)
        return KVP_ERR_NOT_FOUND;
    struct rt_owed *o = RT_CONTAINER(n, struct rt_owed, node);
    if (o->hid) {
        struct rt_hosted *h = hosted_get(a, o->hid);
        if (h)
            h->owed--;
    }
    int rc = rt_send_reply(o->from, o->from_hid, o->from_corr, o->type, status, arg, payload,
                           free_fn);
    kvp_rt_unref(&o->from);
    free(o);
    return rc;
}

/* ------------------------------------------------------------------ timers */

int kvp_rt_timer_start(struct kvp_rt_ctx *ctx, uint32_t delay_ms, uint32_t interval_ms,
                       uint32_t type, uint64_t *timer_id)
{
    if (!ctx)
        return KVP_ERR_INVALID;
    struct rt_core *c = &ctx->a->core;
    if (c->closed)
        return KVP_ERR_CLOSED;
    struct rt_timer *t = calloc(1, sizeof(*t));
    if (!t)
        return KVP_ERR_NOMEM;
    t->node.key = ++c->next_timer;
    t->due_us = kvp_clock_now_us() + (uint64_t)delay_ms * 1000u;
    t->interval_us = (uint64_t)interval_ms * 1000u;
    t->hid = kvp_rt_self_hid(ctx);
    t->type = type;
    if (rt_hmap_put(&c->timers, &t->node)) {
        free(t);
        return KVP_ERR_NOMEM;
    }
    if (rt_heap_push(&c->heap, t)) {
        rt_hmap_del(&c->timers, t->node.key);
        free(t);
        return KVP_ERR_NOMEM;
    }
    if (ctx->h)
        ctx->h->timers++;
    if (timer_id)
        *timer_id = t->node.key;
    return KVP_OK;
}

int kvp_rt_timer_cancel(struct kvp_rt_ctx *ctx, uint64_t timer_id)
{
    if (!ctx)
        return KVP_ERR_INVALID;
    struct rt_core *c = &ctx->a->core;
    struct rt_hnode *n = rt_hmap_del(&c->timers, timer_id);
    if (!n)
        return KVP_ERR_NOT_FOUND;
    struct rt_timer *t = RT_CONTAINER(n, struct rt_timer, node);
    rt_heap_remove(&c->heap, t);
    timer_free(ctx->a, t);
    return KVP_OK;
}

int rt_core_run_timers(struct kvp_rt_actor *a)
{
    struct rt_core *c = &a->core;
    int fired = 0;
    uint64_t now = kvp_clock_now_us();
    struct rt_timer *t;
    while (!c->closed && (t = rt_heap_top(&c->heap)) && t->due_us <= now) {
        rt_heap_remove(&c->heap, t);
        struct kvp_rt_msg *m;
        uint64_t hid;
        if (t->deadline) {
            struct rt_hnode *n = rt_hmap_del(&c->pending, t->corr);
            free(t);
            if (!n)
                continue;
            struct rt_pending *p = RT_CONTAINER(n, struct rt_pending, node);
            hid = p->hid;
            m = rt_msg_new(KVP_RT_REPLY, p->type, 0);
            if (m) {
                m->status = KVP_ERR_TIMEOUT;
                m->corr_id = p->node.key;
            }
            free(p);
        } else {
            hid = t->hid;
            m = rt_msg_new(KVP_RT_TIMER, t->type, 0);
            if (m)
                m->corr_id = t->node.key;
            if (t->interval_us) {
                t->due_us += t->interval_us;
                if (t->due_us <= now)
                    t->due_us = now + t->interval_us;
                if (rt_heap_push(&c->heap, t)) {
                    kvp_log_error(a->name, "timer %llu: out of memory, cancelled",
                                  (unsigned long long)t->node.key);
                    rt_hmap_del(&c->timers, t->node.key);
                    timer_free(a, t);
                }
            } else {
                rt_hmap_del(&c->timers, t->node.key);
                timer_free(a, t);
            }
        }
        if (!m) {
            kvp_log_error(a->name, "timer: out of memory, event lost");
            continue;
        }
        fired++;
        deliver_to(a, hid, m);
    }
    return fired;
}

int64_t rt_core_next_due_ms(struct kvp_rt_actor *a)
{
    struct rt_timer *t = rt_heap_top(&a->core.heap);
    if (!t || a->core.closed)
        return -1;
    uint64_t now = kvp_clock_now_us();
    if (t->due_us <= now)
        return 0;
    return (int64_t)((t->due_us - now + 999u) / 1000u);
}

/* ------------------------------------------------------------------ hosted actors */

static void hosted_end(struct kvp_rt_actor *a, struct rt_hosted *h);

int kvp_rt_hosted_spawn(struct kvp_rt_ctx *ctx, const struct kvp_rt_hosted_spec *spec,
                        void *state, uint64_t *hid)
{
    if (!ctx || !spec || !spec->handle)
        return KVP_ERR_INVALID;
    struct rt_core *c = &ctx->a->core;
    if (c->closed)
        return KVP_ERR_CLOSED;
    struct rt_hosted *h = malloc(sizeof(*h));
    if (!h)
        return KVP_ERR_NOMEM;
    h->node.key = ++c->next_hid;
    h->node.next = NULL;
    h->spec = *spec;
    h->state = state;
    h->parent_hid = kvp_rt_self_hid(ctx);
    h->owed = 0;
    h->timers = 0;
    const char *name = spec->name ? spec->name : "hosted";
    size_t len = strlen(name);
    if (len > KVP_RT_NAME_MAX)
        len = KVP_RT_NAME_MAX;
    memcpy(h->name, name, len);
    h->name[len] = '\0';
    if (rt_hmap_put(&c->hosted, &h->node)) {
        free(h);
        return KVP_ERR_NOMEM;
    }
    if (hid)
        *hid = h->node.key;
    return KVP_OK;
}

int kvp_rt_hosted_spawn_run(struct kvp_rt_ctx *ctx, const struct kvp_rt_hosted_spec *spec, void *state,
                            int (*start)(struct kvp_rt_ctx *ctx), uint64_t *hid)
{
    uint64_t id = 0;
    int rc = kvp_rt_hosted_spawn(ctx, spec, state, &id);
    if (rc != KVP_OK || !start)
        return rc;
    if (hid)
        *hid = id;
    struct rt_core *c = &ctx->a->core;
    struct rt_hosted *h = hosted_get(ctx->a, id);
    struct rt_hosted *prev = c->running;
    c->running = h;
    struct kvp_rt_ctx hctx = {ctx->a, h};
    rc = start(&hctx);
    c->running = prev;
    if (rc < 0 || rc == KVP_RT_DONE) {
        hosted_end(ctx->a, h);
        return rc < 0 ? rc : KVP_OK;
    }
    return KVP_OK;
}

/* Remove every node of map m whose owner hosted id (via hid_of) is `hid`; call drop on it. */
static void drop_matching(struct kvp_rt_actor *a, struct rt_hmap *m, uint64_t hid,
                          uint64_t (*hid_of)(struct rt_hnode *),
                          void (*drop)(struct kvp_rt_actor *, struct rt_hnode *))
{
    for (size_t i = 0; i < m->nb; i++) {
        struct rt_hnode **pp = &m->b[i];
        while (*pp) {
            struct rt_hnode *n = *pp;
            if (hid_of(n) == hid) {
                *pp = n->next;
                m->n--;
                drop(a, n);
            } else {
                pp = &n->next;
            }
        }
    }
}

static uint64_t owed_hid(struct rt_hnode *n) { return RT_CONTAINER(n, struct rt_owed, node)->hid; }
static uint64_t timer_hid(struct rt_hnode *n) { return RT_CONTAINER(n, struct rt_timer, node)->hid; }
static void owed_drop(struct kvp_rt_actor *a, struct rt_hnode *n)
{
    owed_close(a, RT_CONTAINER(n, struct rt_owed, node));
}
static void timer_drop(struct kvp_rt_actor *a, struct rt_hnode *n)
{
    struct rt_timer *t = RT_CONTAINER(n, struct rt_timer, node);
    rt_heap_remove(&a->core.heap, t);
    free(t);
}

/* Finish hosted actor h: its debts are settled CLOSED, timers cancelled, fini run, freed. */
static void hosted_end(struct kvp_rt_actor *a, struct rt_hosted *h)
{
    struct rt_core *c = &a->core;
    rt_hmap_del(&c->hosted, h->node.key);
    if (h->owed)
        drop_matching(a, &c->owed, h->node.key, owed_hid, owed_drop);
    if (h->timers)
        drop_matching(a, &c->timers, h->node.key, timer_hid, timer_drop);
    if (h->spec.fini) {
        struct rt_hosted *prev = c->running;
        c->running = h;
        struct kvp_rt_ctx ctx = {a, h};
        h->spec.fini(&ctx);
        c->running = prev;
    }
    free(h);
}

int kvp_rt_hosted_finish(struct kvp_rt_ctx *ctx, uint64_t hid)
{
    if (!ctx)
        return KVP_ERR_INVALID;
    struct rt_hosted *h = hid ? hosted_get(ctx->a, hid) : NULL;
    if (!h)
        return KVP_ERR_NOT_FOUND;
    if (h == ctx->a->core.running)
        return KVP_ERR_BUSY;
    hosted_end(ctx->a, h);
    return KVP_OK;
}

size_t kvp_rt_hosted_count(struct kvp_rt_ctx *ctx)
{
    return ctx ? ctx->a->core.hosted.n : 0;
}

/* ------------------------------------------------------------------ watches */

static int watch_add(struct kvp_rt_ctx *ctx, void *sock, int fd,
                     int (*fn)(struct kvp_rt_ctx *ctx, void *handle))
{
    if (!ctx || !fn || ctx->a->mode != RT_THREAD || (fd < 0 && !sock))
        return KVP_ERR_INVALID;
    struct rt_core *c = &ctx->a->core;
    if (c->closed)
        return KVP_ERR_CLOSED;
    for (struct rt_watch *w = c->watches; w; w = w->next)
        if (fd >= 0 ? w->fd == fd : (w->fd < 0 && w->handle == sock))
            return KVP_ERR_EXISTS;
    struct rt_watch *w = calloc(1, sizeof(*w));
    if (!w)
        return KVP_ERR_NOMEM;
    w->fd = fd;
    w->handle = fd >= 0 ? (void *)&w->fd : sock;
    w->fn = fn;
    w->next = c->watches;
    c->watches = w;
    c->watches_changed = true;
    return KVP_OK;
}

static int watch_del(struct kvp_rt_ctx *ctx, void *sock, int fd)
{
    if (!ctx)
        return KVP_ERR_INVALID;
    struct rt_core *c = &ctx->a->core;
    for (struct rt_watch **pp = &c->watches; *pp; pp = &(*pp)->next) {
        struct rt_watch *w = *pp;
        if (fd >= 0 ? w->fd == fd : (w->fd < 0 && w->handle == sock)) {
            *pp = w->next;
            free(w);
            c->watches_changed = true;
            return KVP_OK;
        }
    }
    return KVP_ERR_NOT_FOUND;
}

int kvp_rt_watch(struct kvp_rt_ctx *ctx, void *sock,
                 int (*fn)(struct kvp_rt_ctx *ctx, void *handle))
{
    return sock ? watch_add(ctx, sock, -1, fn) : KVP_ERR_INVALID;
}

int kvp_rt_watch_fd(struct kvp_rt_ctx *ctx, int fd,
                    int (*fn)(struct kvp_rt_ctx *ctx, void *handle))
{
    return fd >= 0 ? watch_add(ctx, NULL, fd, fn) : KVP_ERR_INVALID;
}

int kvp_rt_unwatch(struct kvp_rt_ctx *ctx, void *sock)
{
    return sock ? watch_del(ctx, sock, -1) : KVP_ERR_NOT_FOUND;
}

int kvp_rt_unwatch_fd(struct kvp_rt_ctx *ctx, int fd)
{
    return fd >= 0 ? watch_del(ctx, NULL, fd) : KVP_ERR_NOT_FOUND;
}

/* ------------------------------------------------------------------ supervision and close */

static void report_hosted_failure(struct kvp_rt_actor *a, uint64_t parent_hid,
                                  const struct kvp_rt_failure *f)
{
    if (a->core.closed) {
        kvp_log_error(a->name, "hosted actor %s (%llu) failed while closing: %s", f->name,
                      (unsigned long long)f->hid, kvp_strerror(f->err));
        return;
    }
    struct kvp_rt_msg *m = rt_msg_new(KVP_RT_FAILED, 0, 0);
    struct kvp_rt_failure *copy = malloc(sizeof(*copy));
    if (!m || !copy) {
        free(m);
        free(copy);
        kvp_log_error(a->name, "hosted actor %s (%llu) failed: %s (report lost: no memory)",
                      f->name, (unsigned long long)f->hid, kvp_strerror(f->err));
        return;
    }
    *copy = *f;
    m->payload = copy;
    uint64_t to = parent_hid && hosted_get(a, parent_hid) ? parent_hid : 0;
    deliver_to(a, to, m);
}

void rt_core_fail(struct kvp_rt_actor *a, struct rt_hosted *h, int err)
{
    if (h) {
        struct kvp_rt_failure f = {.hid = h->node.key, .child = NULL, .err = err};
        memcpy(f.name, h->name, sizeof(f.name));
        uint64_t parent = h->parent_hid;
        kvp_log_warn(a->name, "hosted actor %s (%llu) failed: %s", h->name,
                     (unsigned long long)h->node.key, kvp_strerror(err));
        hosted_end(a, h);
        report_hosted_failure(a, parent, &f);
        return;
    }
    if (a->core.closed) {
        kvp_log_error(a->name, "handler error while closing: %s", kvp_strerror(err));
        rt_set_fail(a, err);
        return;
    }
    rt_set_fail(a, err);
    kvp_log_error(a->name, "failed: %s", kvp_strerror(err));
    rt_core_close(a);
    if (!a->parent) {
        kvp_log_error(a->name, "no parent to report the failure to; kvp_rt_stop returns it");
        return;
    }
    struct kvp_rt_msg *m = rt_msg_new(KVP_RT_FAILED, 0, 0);
    struct kvp_rt_failure *f = calloc(1, sizeof(*f));
    if (m && f) {
        f->child = a;
        f->err = err;
        memcpy(f->name, a->name, sizeof(f->name));
        m->payload = f;
        if (rt_push(a->parent, m) == KVP_OK)
            return;
    } else {
        free(f);
        f = NULL;
    }
    rt_msg_free(m);
    kvp_log_error(a->name, "failure could not be reported to parent %s (closed or no memory)",
                  a->parent->name);
}

void rt_core_close(struct kvp_rt_actor *a)
{
    struct rt_core *c = &a->core;
    if (c->closed)
        return;
    c->closed = true;
    pthread_mutex_lock(&a->mu);
    a->closed = true;
    pthread_mutex_unlock(&a->mu);
    /* Queued messages: requests are answered CLOSED by rt_msg_free; replies to our own pending
     * requests are dropped here and those requests complete CLOSED below. */
    struct kvp_rt_msg *m = rt_take_all(a);
    while (m) {
        struct kvp_rt_msg *next = m->next;
        rt_msg_free(m);
        m = next;
    }
    struct rt_hnode *n;
    while ((n = rt_hmap_any(&c->owed))) {
        rt_hmap_del(&c->owed, n->key);
        owed_close(a, RT_CONTAINER(n, struct rt_owed, node));
    }
    while ((n = rt_hmap_any(&c->timers))) {
        rt_hmap_del(&c->timers, n->key);
        struct rt_timer *t = RT_CONTAINER(n, struct rt_timer, node);
        rt_heap_remove(&c->heap, t);
        timer_free(a, t);
    }
    /* Our own pending requests complete with CLOSED: the handler sees the reply, so whatever
     * it keeps per request is released (a call that was accepted always completes). */
    while ((n = rt_hmap_any(&c->pending))) {
        rt_hmap_del(&c->pending, n->key);
        struct rt_pending *p = RT_CONTAINER(n, struct rt_pending, node);
        if (p->deadline) {
            rt_heap_remove(&c->heap, p->deadline);
            free(p->deadline);
        }
        struct kvp_rt_msg *r = rt_msg_new(KVP_RT_REPLY, p->type, 0);
        if (r) {
            r->status = KVP_ERR_CLOSED;
            r->corr_id = p->node.key;
            deliver_to(a, p->hid, r);
        } else {
            kvp_log_error(a->name, "close: out of memory, request %llu completion lost",
                          (unsigned long long)p->node.key);
        }
        free(p);
    }
    /* A closed actor reads no more input: drop the watches so the loop stops polling them. */
    while (c->watches) {
        struct rt_watch *w = c->watches;
        c->watches = w->next;
        free(w);
        c->watches_changed = true;
    }
    kvp_log_debug(a->name, "closed");
}

void rt_core_finish(struct kvp_rt_actor *a)
{
    struct rt_core *c = &a->core;
    if (c->finished)
        return;
    c->finished = true;
    struct rt_hnode *n;
    while ((n = rt_hmap_any(&c->hosted)))
        hosted_end(a, RT_CONTAINER(n, struct rt_hosted, node));
    if (a->spec.fini) {
        struct kvp_rt_ctx ctx = {a, NULL};
        a->spec.fini(&ctx);
    }
    /* Anything left (e.g. requests made by the finis) is released. */
    while ((n = rt_hmap_any(&c->owed))) {
        rt_hmap_del(&c->owed, n->key);
        owed_close(a, RT_CONTAINER(n, struct rt_owed, node));
    }
    while ((n = rt_hmap_any(&c->timers)))
        rt_hmap_del(&c->timers, n->key); /* freed with the heap below */
    while (c->heap.n) {
        struct rt_timer *t = c->heap.v[0];
        rt_heap_remove(&c->heap, t);
        free(t);
    }
    while ((n = rt_hmap_any(&c->pending))) {
        rt_hmap_del(&c->pending, n->key);
        free(RT_CONTAINER(n, struct rt_pending, node));
    }
    while (c->watches) {
        struct rt_watch *w = c->watches;
        c->watches = w->next;
        free(w);
    }
    rt_hmap_fini(&c->hosted);
    rt_hmap_fini(&c->pending);
    rt_hmap_fini(&c->owed);
    rt_hmap_fini(&c->timers);
    rt_heap_fini(&c->heap);
}
