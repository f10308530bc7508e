/* actor.c — mailboxes, messages, references, spawn/close/stop, sinks and blocking calls.
 * The loop state (dispatch, timers, hosted actors) is in actor_loop.c. See actor.h. */
#define _GNU_SOURCE /* pthread_setname_np */
#include "runtime/actor.h"

#include <czmq.h>
#include <pthread.h>
#include <stdio.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "kvpool.h"
#include "runtime/actor_internal.h"
#include "runtime/log.h"

/* ------------------------------------------------------------------ messages */

struct kvp_rt_msg *rt_msg_new(uint8_t kind, uint32_t type, uint64_t arg)
{
    struct kvp_rt_msg *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->kind = kind;
    m->type = type;
    m->arg = arg;
    return m;
}

static void free_payload(struct kvp_rt_msg *m)
{
    if (m->payload) {
        if (m->free_fn)
            m->free_fn(m->payload);
        else
            free(m->payload);
        m->payload = NULL;
    }
}

void rt_msg_free(struct kvp_rt_msg *m)
{
    if (!m)
        return;
    if (m->kind == KVP_RT_REQUEST && m->from) {
        /* Never lose a request: whoever drops it unanswered answers CLOSED. */
        rt_send_reply(m->from, m->from_hid, m->from_corr, m->type, KVP_ERR_CLOSED, 0, NULL, NULL);
    }
    if (m->from)
        kvp_rt_unref(&m->from);
    free_payload(m);
    free(m);
}

void *kvp_rt_msg_take(struct kvp_rt_msg *msg)
{
    if (!msg)
        return NULL;
    void *p = msg->payload;
    msg->payload = NULL;
    return p;
}

void kvp_rt_msg_destroy(struct kvp_rt_msg **msgp)
{
    if (!msgp || !*msgp)
        return;
    rt_msg_free(*msgp);
    *msgp = NULL;
}

/* ------------------------------------------------------------------ references */

struct kvp_rt_actor *kvp_rt_ref(struct kvp_rt_actor *a)
{
    /* Relaxed: a new reference is only made from one already held, so the object is alive and
     * nothing else needs to be ordered with the increment. */
    if (a)
        atomic_fetch_add_explicit(&a->refs, 1, memory_order_relaxed);
    return a;
}

static void actor_free(struct kvp_rt_actor *a)
{
    struct kvp_rt_msg *m = a->head;
    while (m) { /* only possible for actors that never closed (e.g. failed spawn) */
        struct kvp_rt_msg *n = m->next;
        rt_msg_free(m);
        m = n;
    }
    if (a->efd >= 0)
        close(a->efd);
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

void kvp_rt_unref(struct kvp_rt_actor **ap)
{
    if (!ap || !*ap)
        return;
    struct kvp_rt_actor *a = *ap;
    *ap = NULL;
    /* acq_rel: the release orders this thread's uses of the actor before the decrement; the
     * acquire on the last decrement makes every other thread's uses visible before the free. */
    if (atomic_fetch_sub_explicit(&a->refs, 1, memory_order_acq_rel) == 1)
        actor_free(a);
}

const char *kvp_rt_name(const struct kvp_rt_actor *a)
{
    return a ? a->name : "(null)";
}

/* ------------------------------------------------------------------ mailbox */

static void wake_fd(struct kvp_rt_actor *a)
{
    uint64_t one = 1;
    ssize_t n = write(a->efd, &one, sizeof(one));
    (void)n; /* EAGAIN: the counter is already non-zero, the loop will wake anyway */
}

int rt_push(struct kvp_rt_actor *to, struct kvp_rt_msg *m)
{
    m->next = NULL;
    pthread_mutex_lock(&to->mu);
    if (to->closed) {
        pthread_mutex_unlock(&to->mu);
        return KVP_ERR_CLOSED;
    }
    bool was_empty = to->head == NULL;
    if (to->tail)
        to->tail->next = m;
    else
        to->head = m;
    to->tail = m;
    to->queued++;
    if (to->mode == RT_SINK)
        pthread_cond_signal(&to->cv);
    pthread_mutex_unlock(&to->mu);
    if (to->mode == RT_THREAD && was_empty)
        wake_fd(to);
    return KVP_OK;
}

struct kvp_rt_msg *rt_take_all(struct kvp_rt_actor *a)
{
    pthread_mutex_lock(&a->mu);
    struct kvp_rt_msg *m = a->head;
    a->head = a->tail = NULL;
    a->queued = 0;
    pthread_mutex_unlock(&a->mu);
    return m;
}

size_t kvp_rt_queued(struct kvp_rt_actor *a)
{
    if (!a)
        return 0;
    pthread_mutex_lock(&a->mu);
    size_t n = a->queued;
    pthread_mutex_unlock(&a->mu);
    return n;
}

void rt_set_fail(struct kvp_rt_actor *a, int err)
{
    pthread_mutex_lock(&a->mu);
    if (!a->fail_err)
        a->fail_err = err;
    pthread_mutex_unlock(&a->mu);
}

static int get_fail(struct kvp_rt_actor *a)
{
    pthread_mutex_lock(&a->mu);
    int e = a->fail_err;
    pthread_mutex_unlock(&a->mu);
    return e;
}

static int send_msg(struct kvp_rt_actor *to, struct kvp_rt_msg *m, void **payload,
                    kvp_rt_free_fn free_fn)
{
    if (payload && *payload) {
        m->payload = *payload;
        m->free_fn = free_fn;
    }
    int rc = rt_push(to, m);
    if (rc) {
        m->payload = NULL; /* still the caller's */
        if (m->kind == KVP_RT_REQUEST)
            kvp_rt_unref(&m->from); /* the caller gets the error, not a CLOSED reply */
        rt_msg_free(m);
        return rc;
    }
    if (payload)
        *payload = NULL;
    return KVP_OK;
}

int rt_send_reply(struct kvp_rt_actor *to, uint64_t hid, uint64_t corr, uint32_t type, int status,
                  uint64_t arg, void **payload, kvp_rt_free_fn free_fn)
{
    struct kvp_rt_msg *m = rt_msg_new(KVP_RT_REPLY, type, arg);
    if (!m)
        return KVP_ERR_NOMEM;
    m->status = status;
    m->corr_id = corr;
    m->to_hid = hid;
    return send_msg(to, m, payload, free_fn);
}

int kvp_rt_send(struct kvp_rt_actor *to, uint64_t hid, uint32_t type, uint64_t arg,
                void **payload, kvp_rt_free_fn free_fn)
{
    if (!to)
        return KVP_ERR_INVALID;
    struct kvp_rt_msg *m = rt_msg_new(KVP_RT_SEND, type, arg);
    if (!m)
        return KVP_ERR_NOMEM;
    m->to_hid = hid;
    return send_msg(to, m, payload, free_fn);
}

int kvp_rt_msg_reply(struct kvp_rt_msg **reqp, int status, uint64_t arg, void **payload,
                     kvp_rt_free_fn free_fn)
{
    if (!reqp || !*reqp)
        return KVP_ERR_INVALID;
    struct kvp_rt_msg *req = *reqp;
    *reqp = NULL;
    if (req->kind != KVP_RT_REQUEST || !req->from) {
        rt_msg_free(req);
        return KVP_ERR_INVALID;
    }
    int rc = rt_send_reply(req->from, req->from_hid, req->from_corr, req->type, status, arg,
                           payload, free_fn);
    kvp_rt_unref(&req->from); /* answered (or the requester is gone): no CLOSED reply */
    rt_msg_free(req);
    return rc;
}

/* ------------------------------------------------------------------ creation */

static struct kvp_rt_actor *actor_alloc(enum rt_mode mode, const char *name)
{
    struct kvp_rt_actor *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    atomic_init(&a->refs, 1);
    a->mode = mode;
    a->efd = -1;
    /* memcpy, not snprintf: kvp_rt_call makes a sink per call, and the format parse was ~40% of
     * making one (callgrind, kvpool-bench-msession). */
    const char *n = name ? name : "actor";
    size_t len = strnlen(n, KVP_RT_NAME_MAX);
    memcpy(a->name, n, len);
    a->name[len] = '\0';
    pthread_mutex_init(&a->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->cv, &ca);
    pthread_condattr_destroy(&ca);
    rt_core_init(a);
    return a;
}

/* The actor whose loop runs on this thread (threaded actors only): lets kvp_rt_close from a
 * handler close its own actor directly instead of waiting for its own loop. */
static __thread struct kvp_rt_actor *rt_current;

/* Init is over (rc: its result): wake the spawner waiting in kvp_rt_spawn. */
static void set_init_rc(struct kvp_rt_actor *a, int rc, bool exited)
{
    pthread_mutex_lock(&a->mu);
    a->init_rc = rc;
    if (rc < 0 && !a->fail_err)
        a->fail_err = rc;
    a->init_done = true;
    a->exited = exited;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* What the owner asked for since the last look (kvp_rt_close / kvp_rt_stop). */
static void take_cmds(struct kvp_rt_actor *a, bool *close, bool *term)
{
    pthread_mutex_lock(&a->mu);
    *close = a->cmd_close;
    *term = a->cmd_term;
    a->cmd_close = false;
    pthread_mutex_unlock(&a->mu);
}

/* Poll set of a threaded actor: item 0 is the mailbox eventfd, then one item per watch. */
struct rt_pollset {
    zmq_pollitem_t *items;
    size_t n, cap;
    int ep;        /* epoll set over the items (a libzmq socket by its ZMQ_FD), or -1: zmq_poll */
    bool has_zmq;  /* some item is a libzmq socket: check ZMQ_EVENTS around the wait */
};

/* A libzmq socket has a message to read. ZMQ_EVENTS also processes the socket's pending
 * commands, which is what re-arms its ZMQ_FD (docs/runtime.md, "Watching sockets and fds"). */
static bool zmq_readable(void *sock)
{
    int ev = 0;
    size_t len = sizeof ev;
    return zmq_getsockopt(sock, ZMQ_EVENTS, &ev, &len) == 0 && (ev & ZMQ_POLLIN);
}

static int pollset_build(struct kvp_rt_actor *a, struct rt_pollset *ps)
{
    size_t n = 1;
    for (struct rt_watch *w = a->core.watches; w; w = w->next)
        n++;
    if (n > ps->cap) {
        zmq_pollitem_t *ni = realloc(ps->items, n * sizeof(*ni));
        if (!ni)
            return KVP_ERR_NOMEM;
        ps->items = ni;
        ps->cap = n;
    }
    memset(ps->items, 0, n * sizeof(*ps->items));
    ps->items[0].fd = a->efd;
    ps->items[0].events = ZMQ_POLLIN;
    size_t i = 1;
    for (struct rt_watch *w = a->core.watches; w; w = w->next, i++) {
        if (w->fd >= 0)
            ps->items[i].fd = w->fd;
        else
            ps->items[i].socket = zsock_resolve(w->handle);
        ps->items[i].events = ZMQ_POLLIN;
    }
    ps->n = n;
    ps->has_zmq = false;
    if (ps->ep >= 0)
        close(ps->ep);
    ps->ep = epoll_create1(EPOLL_CLOEXEC);
    for (size_t k = 0; k < n && ps->ep >= 0; k++) {
        int fd = ps->items[k].fd;
        if (ps->items[k].socket) {
            size_t len = sizeof fd;
            if (zmq_getsockopt(ps->items[k].socket, ZMQ_FD, &fd, &len) != 0)
                fd = -1;
            ps->has_zmq = true;
        }
        struct epoll_event ee = {.events = EPOLLIN, .data.u64 = k};
        if (fd < 0 || epoll_ctl(ps->ep, EPOLL_CTL_ADD, fd, &ee) != 0) {
            close(ps->ep);
            ps->ep = -1; /* zmq_poll does the same job, with more system calls */
        }
    }
    return KVP_OK;
}

/* Wait for input or the next timer (timeout_ms, -1 = none); sets revents. Returns how many
 * items are ready (0 on timeout or EINTR). */
static int pollset_wait(struct kvp_rt_actor *a, struct rt_pollset *ps, long timeout_ms)
{
    if (ps->ep < 0) {
        int n = zmq_poll(ps->items, (int)ps->n, timeout_ms);
        if (n < 0 && zmq_errno() != EINTR) {
            kvp_log_error(a->name, "zmq_poll: %s", zmq_strerror(zmq_errno()));
            zclock_sleep(1);
        }
        return n < 0 ? 0 : n;
    }
    /* A libzmq socket's ZMQ_FD says only that its state may have changed: a message can be
     * waiting while the fd is quiet (a handler's send or receive on the socket took the
     * notification). So each libzmq socket is asked before the wait (one ZMQ_EVENTS), and one
     * whose fd fired is asked again after it. */
    int n = 0;
    for (size_t k = 0; k < ps->n; k++) {
        ps->items[k].revents = 0;
        if (ps->has_zmq && ps->items[k].socket && zmq_readable(ps->items[k].socket)) {
            ps->items[k].revents = ZMQ_POLLIN;
            n++;
        }
    }
    struct epoll_event evs[16];
    int ne = epoll_wait(ps->ep, evs, 16, n ? 0 : (int)timeout_ms);
    if (ne < 0 && errno != EINTR)
        kvp_log_error(a->name, "epoll_wait: %s", strerror(errno));
    for (int k = 0; k < ne; k++) {
        zmq_pollitem_t *it = evs[k].data.u64 < ps->n ? &ps->items[evs[k].data.u64] : NULL;
        if (!it || it->revents || (it->socket && !zmq_readable(it->socket)))
            continue;
        it->revents = ZMQ_POLLIN;
        n++;
    }
    return n;
}

/* The actor thread. It waits on its mailbox eventfd, its timers and its watches only: the
 * owner's commands (close, stop) come as flags under the mailbox lock plus an eventfd write,
 * so no control socket is polled (docs/runtime.md, "Watching sockets and fds"). */
static void *actor_main(void *arg)
{
    struct kvp_rt_actor *a = arg;
    rt_current = a;
    char tname[16];
    snprintf(tname, sizeof tname, "%s", a->name);
    pthread_setname_np(pthread_self(), tname);
    int rc = rt_core_start(a);
    if (rc < 0) {
        rt_core_close(a);
        rt_core_finish(a);
        set_init_rc(a, rc, true); /* the spawner joins this thread */
        return NULL;
    }
    set_init_rc(a, KVP_OK, false);

    struct rt_pollset ps = {.ep = -1};
    bool rebuild = true;
    for (;;) {
        if (rebuild || a->core.watches_changed) {
            if (pollset_build(a, &ps) != KVP_OK) {
                kvp_log_error(a->name, "poll set: out of memory");
                zclock_sleep(10);
                continue;
            }
            rebuild = false;
            a->core.watches_changed = false;
        }
        int64_t due = rt_core_next_due_ms(a);
        int n = pollset_wait(a, &ps, due < 0 ? -1 : (long)due);
        zmq_pollitem_t *items = ps.items;
        if (n > 0 && (items[0].revents & ZMQ_POLLIN)) {
            uint64_t cnt;
            ssize_t r = read(a->efd, &cnt, sizeof(cnt)); /* clear before taking commands and queue */
            (void)r;
            bool close_cmd, term;
            take_cmds(a, &close_cmd, &term);
            if (term)
                break;
            if (close_cmd) {
                rt_core_close(a);
                pthread_mutex_lock(&a->mu);
                a->close_acked = true;
                pthread_cond_broadcast(&a->cv);
                pthread_mutex_unlock(&a->mu);
            }
            struct kvp_rt_msg *m = rt_take_all(a);
            while (m) {
                struct kvp_rt_msg *next = m->next;
                rt_core_dispatch(a, m);
                m = next;
            }
        }
        if (n > 0 && !a->core.watches_changed) {
            size_t i = 1;
            for (struct rt_watch *w = a->core.watches; w && i < ps.n; w = w->next, i++) {
                if (!(items[i].revents & ZMQ_POLLIN) || a->core.closed)
                    continue;
                struct kvp_rt_ctx ctx = {a, NULL};
                int rc2 = w->fn(&ctx, w->handle);
                if (rc2 < 0)
                    rt_core_fail(a, NULL, rc2);
                if (a->core.watches_changed)
                    break; /* the list changed under us: rebuild, poll again */
            }
        }
        rt_core_run_timers(a);
    }
    free(ps.items);
    if (ps.ep >= 0)
        close(ps.ep);
    rt_core_close(a);
    rt_core_finish(a);
    pthread_mutex_lock(&a->mu);
    a->exited = true; /* orders every loop-side write before the owner frees the actor */
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* A spawn that fails before the actor's loop could run init (bad argument, no memory, no
 * eventfd, no thread) still owns spec->state: run fini on the caller's thread, once, with the
 * actor already closed (timers, requests and watches are refused). `a` may be NULL (no
 * memory for it): a closed actor on the stack stands in for the fini call. */
static void fini_unstarted(struct kvp_rt_actor *a, const struct kvp_rt_spec *spec)
{
    if (!spec->fini)
        return;
    struct kvp_rt_actor tmp;
    if (!a) {
        memset(&tmp, 0, sizeof tmp);
        a = &tmp;
        a->mode = RT_MANUAL;
        a->efd = -1;
        snprintf(a->name, sizeof a->name, "%s", spec->name ? spec->name : "actor");
        rt_core_init(a);
        a->spec = *spec;
        a->core.state = spec->state;
    }
    a->core.closed = true;
    a->closed = true; /* only the spawner knows the actor: no lock needed */
    rt_core_finish(a);
}

/* Common start of kvp_rt_spawn and kvp_rt_spawn_manual; on failure fini ran. */
static int spawn_prepare(struct kvp_rt_actor **ap, enum rt_mode mode, struct kvp_rt_actor **out,
                         const struct kvp_rt_spec *spec)
{
    *ap = NULL;
    if (!spec)
        return KVP_ERR_INVALID;
    if (!out || !spec->handle) {
        kvp_log_error(spec->name ? spec->name : "actor", "spawn refused: %s is NULL; fini runs now",
                      out ? "spec.handle" : "out");
        fini_unstarted(NULL, spec);
        return KVP_ERR_INVALID;
    }
    struct kvp_rt_actor *a = actor_alloc(mode, spec->name);
    if (!a) {
        kvp_log_error(spec->name ? spec->name : "actor", "spawn: out of memory; fini runs now");
        fini_unstarted(NULL, spec);
        return KVP_ERR_NOMEM;
    }
    a->spec = *spec;
    a->spec.name = NULL; /* copied into a->name */
    a->core.state = spec->state;
    *ap = a;
    return KVP_OK;
}

int kvp_rt_spawn(struct kvp_rt_actor **out, const struct kvp_rt_spec *spec,
                 struct kvp_rt_actor *parent)
{
    struct kvp_rt_actor *a;
    int rc = spawn_prepare(&a, RT_THREAD, out, spec);
    if (rc != KVP_OK)
        return rc;
    a->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (a->efd < 0) {
        kvp_log_error(a->name, "spawn: eventfd: %s; fini runs now", strerror(errno));
        fini_unstarted(a, spec);
        kvp_rt_unref(&a);
        return KVP_ERR_IO;
    }
    a->parent = kvp_rt_ref(parent);
    int prc = pthread_create(&a->thread, NULL, actor_main, a);
    if (prc != 0) {
        kvp_log_error(a->name, "spawn: cannot start the actor thread: %s; fini runs now", strerror(prc));
        fini_unstarted(a, spec);
        kvp_rt_unref(&a->parent);
        kvp_rt_unref(&a);
        return KVP_ERR_IO;
    }
    a->thread_live = true;
    pthread_mutex_lock(&a->mu); /* the ready handshake: init ran on the new thread */
    while (!a->init_done)
        pthread_cond_wait(&a->cv, &a->mu);
    rc = a->init_rc;
    pthread_mutex_unlock(&a->mu);
    if (rc < 0) {
        pthread_join(a->thread, NULL); /* the thread closed, ran fini and ended */
        a->thread_live = false;
        kvp_rt_unref(&a->parent);
        kvp_log_warn(a->name, "init failed: %s", kvp_strerror(rc));
        kvp_rt_unref(&a);
        return rc;
    }
    kvp_log_debug(a->name, "started");
    *out = a;
    return KVP_OK;
}

int kvp_rt_spawn_manual(struct kvp_rt_actor **out, const struct kvp_rt_spec *spec,
                        struct kvp_rt_actor *parent)
{
    struct kvp_rt_actor *a;
    int rc = spawn_prepare(&a, RT_MANUAL, out, spec);
    if (rc != KVP_OK)
        return rc;
    a->parent = kvp_rt_ref(parent);
    rc = rt_core_start(a);
    if (rc < 0) {
        rt_core_close(a);
        rt_core_finish(a);
        kvp_rt_unref(&a->parent);
        kvp_rt_unref(&a);
        return rc;
    }
    *out = a;
    return KVP_OK;
}

int kvp_rt_sink_new(struct kvp_rt_actor **out, const char *name)
{
    if (!out)
        return KVP_ERR_INVALID;
    struct kvp_rt_actor *a = actor_alloc(RT_SINK, name ? name : "sink");
    if (!a)
        return KVP_ERR_NOMEM;
    *out = a;
    return KVP_OK;
}

/* ------------------------------------------------------------------ lifecycle */

void kvp_rt_close(struct kvp_rt_actor *a)
{
    if (!a || a->stopped)
        return;
    switch (a->mode) {
    case RT_THREAD:
        if (rt_current == a) { /* from its own handler: no need to ask the loop */
            rt_core_close(a);
            break;
        }
        pthread_mutex_lock(&a->mu);
        if (!a->close_acked && !a->exited) {
            a->cmd_close = true;
            pthread_mutex_unlock(&a->mu);
            wake_fd(a);
            pthread_mutex_lock(&a->mu);
            while (!a->close_acked && !a->exited)
                pthread_cond_wait(&a->cv, &a->mu);
        }
        pthread_mutex_unlock(&a->mu);
        break;
    case RT_MANUAL:
        rt_core_close(a);
        break;
    case RT_SINK: {
        pthread_mutex_lock(&a->mu);
        a->closed = true;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        struct kvp_rt_msg *m = rt_take_all(a);
        while (m) {
            struct kvp_rt_msg *n = m->next;
            rt_msg_free(m);
            m = n;
        }
        break;
    }
    }
}

int kvp_rt_stop(struct kvp_rt_actor *a)
{
    if (!a)
        return KVP_ERR_INVALID;
    if (!a->stopped) {
        switch (a->mode) {
        case RT_THREAD: {
            if (rt_current == a) {
                kvp_log_error(a->name, "kvp_rt_stop from the actor's own thread refused");
                return KVP_ERR_BUSY;
            }
            if (a->thread_live) { /* the thread closes, runs the finis and ends */
                pthread_mutex_lock(&a->mu);
                a->cmd_term = true;
                pthread_mutex_unlock(&a->mu);
                wake_fd(a);
                pthread_join(a->thread, NULL);
                a->thread_live = false;
            }
            pthread_mutex_lock(&a->mu);
            bool exited = a->exited;
            pthread_mutex_unlock(&a->mu);
            if (!exited)
                kvp_log_error(a->name, "actor thread did not confirm its exit");
            break;
        }
        case RT_MANUAL:
            rt_core_close(a);
            rt_core_finish(a);
            break;
        case RT_SINK:
            kvp_rt_close(a);
            break;
        }
        a->stopped = true;
        kvp_rt_unref(&a->parent);
        kvp_log_debug(a->name, "stopped");
    }
    return get_fail(a);
}

void kvp_rt_destroy(struct kvp_rt_actor **ap)
{
    if (!ap || !*ap)
        return;
    kvp_rt_stop(*ap);
    kvp_rt_unref(ap);
}

int kvp_rt_poll(struct kvp_rt_actor *a)
{
    if (!a || a->mode != RT_MANUAL)
        return KVP_ERR_INVALID;
    if (a->core.closed)
        return KVP_ERR_CLOSED;
    int handled = 0;
    for (;;) {
        int fired = rt_core_run_timers(a);
        struct kvp_rt_msg *m = rt_take_all(a);
        if (!m && !fired)
            break;
        while (m) {
            struct kvp_rt_msg *next = m->next;
            rt_core_dispatch(a, m);
            handled++;
            m = next;
        }
        handled += fired;
    }
    return handled;
}

void kvp_rt_wake(struct kvp_rt_actor *a)
{
    if (a && a->mode == RT_THREAD)
        wake_fd(a);
}

/* ------------------------------------------------------------------ sinks and blocking calls */

int kvp_rt_recv(struct kvp_rt_actor *sink, uint32_t timeout_ms, struct kvp_rt_msg **msg)
{
    if (!sink || !msg || sink->mode != RT_SINK)
        return KVP_ERR_INVALID;
    struct timespec until = {0};
    if (timeout_ms != 0 && timeout_ms != UINT32_MAX) { /* a poll (0) reads no clock */
        clock_gettime(CLOCK_MONOTONIC, &until);
        uint64_t ns = (uint64_t)until.tv_nsec + (uint64_t)(timeout_ms % 1000) * 1000000u;
        until.tv_sec += timeout_ms / 1000 + (time_t)(ns / 1000000000u);
        until.tv_nsec = (long)(ns % 1000000000u);
    }
    pthread_mutex_lock(&sink->mu);
    int rc = KVP_OK;
    while (!sink->head && !sink->closed) {
        if (timeout_ms == 0) {
            rc = KVP_ERR_TIMEOUT;
            break;
        }
        if (timeout_ms == UINT32_MAX) {
            pthread_cond_wait(&sink->cv, &sink->mu);
        } else if (pthread_cond_timedwait(&sink->cv, &sink->mu, &until) == ETIMEDOUT) {
            if (!sink->head)
                rc = KVP_ERR_TIMEOUT;
            break;
        }
    }
    if (rc == KVP_OK) {
        if (!sink->head) {
            rc = KVP_ERR_CLOSED;
        } else {
            struct kvp_rt_msg *m = sink->head;
            sink->head = m->next;
            if (!sink->head)
                sink->tail = NULL;
            sink->queued--;
            m->next = NULL;
            *msg = m;
        }
    }
    pthread_mutex_unlock(&sink->mu);
    return rc;
}

int kvp_rt_request_from(struct kvp_rt_actor *sink, struct kvp_rt_actor *to, uint64_t hid,
                        uint32_t type, uint64_t arg, void **payload, kvp_rt_free_fn free_fn,
                        uint64_t corr_id)
{
    if (!sink || !to || sink->mode != RT_SINK)
        return KVP_ERR_INVALID;
    struct kvp_rt_msg *m = rt_msg_new(KVP_RT_REQUEST, type, arg);
    if (!m)
        return KVP_ERR_NOMEM;
    m->to_hid = hid;
    m->from = kvp_rt_ref(sink);
    m->from_corr = corr_id;
    return send_msg(to, m, payload, free_fn);
}

int kvp_rt_call(struct kvp_rt_actor *to, uint64_t hid, uint32_t type, uint64_t arg,
                void **payload, kvp_rt_free_fn free_fn, uint32_t timeout_ms,
                struct kvp_rt_msg **reply)
{
    if (!to || !reply)
        return KVP_ERR_INVALID;
    struct kvp_rt_actor *sink = NULL;
    int rc = kvp_rt_sink_new(&sink, "call");
    if (rc)
        return rc;
    rc = kvp_rt_request_from(sink, to, hid, type, arg, payload, free_fn, 1);
    if (rc == KVP_OK)
        rc = kvp_rt_recv(sink, timeout_ms ? timeout_ms : UINT32_MAX, reply);
    kvp_rt_destroy(&sink); /* a late reply now fails to push and is freed by the replier */
    return rc;
}
