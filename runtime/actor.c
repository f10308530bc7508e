/* actor.c — mailboxes, messages, references, spawn/close/stop, sinks and blocking calls.
 * The loop state (dispatch, timers, hosted actors) is in actor_loop.c. See actor.h. */
#include "runtime/actor.h"

#include <czmq.h>
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
    snprintf(a->name, sizeof(a->name), "%s", name ? name : "actor");
    pthread_mutex_init(&a->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->cv, &ca);
    pthread_condattr_destroy(&ca);
    rt_core_init(a);
    return a;
}

static void set_init_rc(struct kvp_rt_actor *a, int rc)
{
    pthread_mutex_lock(&a->mu);
    a->init_rc = rc;
    if (rc < 0 && !a->fail_err)
        a->fail_err = rc;
    pthread_mutex_unlock(&a->mu);
}

/* The actor thread: zactor runs this with the actor end of the pipe. */
static void actor_main(zsock_t *pipe, void *arg)
{
    struct kvp_rt_actor *a = arg;
    a->pipe = pipe;
    int rc = rt_core_start(a);
    if (rc < 0) {
        rt_core_close(a);
        rt_core_finish(a);
        set_init_rc(a, rc);
        zsock_signal(pipe, 0);
        /* Wait for kvp_rt_spawn's zactor_destroy. */
        for (;;) {
            char *cmd = zstr_recv(pipe);
            bool term = !cmd || streq(cmd, "$TERM");
            zstr_free(&cmd);
            if (term)
                break;
        }
        return;
    }
    set_init_rc(a, KVP_OK);
    zsock_signal(pipe, 0);

    bool term = false;
    zmq_pollitem_t *items = NULL;
    size_t nitems = 0, cap = 0;
    bool rebuild = true;
    /* While every watch is a plain fd (the data-plane actors), the loop waits in epoll_wait over
     * the mailbox eventfd, the pipe's ZMQ_FD and the watched fds: one system call per wake-up.
     * zmq_poll, needed as soon as a libzmq socket is watched, also asks libzmq about the pipe
     * (ZMQ_EVENTS, each a poll of its signaler) before and after waiting. ZMQ_FD only says that
     * the pipe's state may have changed: the pipe is read while ZMQ_EVENTS says POLLIN, and
     * checked once at start and after every rebuild (docs/runtime.md, "Watching sockets and fds"). */
    int ep = -1;
    int pipe_fd = -1;
    size_t pfl = sizeof pipe_fd;
    if (zmq_getsockopt(zsock_resolve(pipe), ZMQ_FD, &pipe_fd, &pfl) != 0)
        pipe_fd = -1;
    bool use_ep = false, check_pipe = true;
    while (!term) {
        if (rebuild || a->core.watches_changed) {
            size_t n = 2;
            for (struct rt_watch *w = a->core.watches; w; w = w->next)
                n++;
            if (n > cap) {
                zmq_pollitem_t *ni = realloc(items, n * sizeof(*ni));
                if (!ni) {
                    kvp_log_error(a->name, "poll set: out of memory");
                    zclock_sleep(10);
                    continue;
                }
                items = ni;
                cap = n;
            }
            memset(items, 0, n * sizeof(*items));
            items[0].socket = zsock_resolve(pipe);
            items[0].events = ZMQ_POLLIN;
            items[1].fd = a->efd;
            items[1].events = ZMQ_POLLIN;
            size_t i = 2;
            for (struct rt_watch *w = a->core.watches; w; w = w->next, i++) {
                if (w->fd >= 0)
                    items[i].fd = w->fd;
                else
                    items[i].socket = zsock_resolve(w->handle);
                items[i].events = ZMQ_POLLIN;
            }
            nitems = n;
            rebuild = false;
            a->core.watches_changed = false;
            bool all_fds = pipe_fd >= 0;
            for (struct rt_watch *w = a->core.watches; w; w = w->next)
                if (w->fd < 0)
                    all_fds = false;
            if (ep >= 0)
                close(ep);
            ep = all_fds ? epoll_create1(EPOLL_CLOEXEC) : -1;
            use_ep = ep >= 0;
            for (size_t k = 0; k < nitems && use_ep; k++) {
                struct epoll_event ee = {.events = EPOLLIN, .data.u64 = k};
                if (epoll_ctl(ep, EPOLL_CTL_ADD, k == 0 ? pipe_fd : items[k].fd, &ee) != 0) {
                    close(ep);
                    ep = -1;
                    use_ep = false;
                }
            }
            check_pipe = true;
        }
        int64_t due = rt_core_next_due_ms(a);
        long timeout = due < 0 ? -1 : (long)due;
        int n;
        if (use_ep) {
            struct epoll_event evs[16];
            int ne = epoll_wait(ep, evs, 16, check_pipe ? 0 : (int)timeout);
            if (ne < 0 && errno != EINTR)
                kvp_log_error(a->name, "epoll_wait: %s", strerror(errno));
            for (size_t k = 0; k < nitems; k++)
                items[k].revents = 0;
            n = 0;
            for (int k = 0; k < ne; k++)
                if (evs[k].data.u64 < nitems) {
                    if (evs[k].data.u64 == 0)
                        check_pipe = true;
                    else
                        items[evs[k].data.u64].revents = ZMQ_POLLIN;
                }
            if (check_pipe) {
                check_pipe = false;
                if (zsock_events(pipe) & ZMQ_POLLIN)
                    items[0].revents = ZMQ_POLLIN;
            }
            for (size_t k = 0; k < nitems; k++)
                n += items[k].revents != 0;
        } else {
            n = zmq_poll(items, (int)nitems, timeout);
            if (n < 0 && zmq_errno() != EINTR) {
                kvp_log_error(a->name, "zmq_poll: %s", zmq_strerror(zmq_errno()));
                zclock_sleep(1);
            }
        }
        if (n > 0 && (items[0].revents & ZMQ_POLLIN)) {
            char *cmd = zstr_recv(pipe);
            if (!cmd || streq(cmd, "$TERM")) {
                term = true;
            } else if (streq(cmd, "$CLOSE")) {
                rt_core_close(a);
                zsock_signal(pipe, 0);
            }
            zstr_free(&cmd);
            if (term)
                break;
            check_pipe = true; /* epoll: more may be queued (ZMQ_FD will not say so again) */
        }
        if (n > 0 && (items[1].revents & ZMQ_POLLIN)) {
            uint64_t cnt;
            ssize_t r = read(a->efd, &cnt, sizeof(cnt)); /* clear before taking the queue */
            (void)r;
            struct kvp_rt_msg *m = rt_take_all(a);
            while (m) {
                struct kvp_rt_msg *next = m->next;
                rt_core_dispatch(a, m);
                m = next;
            }
        }
        if (n > 0 && !a->core.watches_changed) {
            size_t i = 2;
            for (struct rt_watch *w = a->core.watches; w && i < nitems; w = w->next, i++) {
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
    free(items);
    if (ep >= 0)
        close(ep);
    rt_core_close(a);
    rt_core_finish(a);
    pthread_mutex_lock(&a->mu);
    a->exited = true; /* orders every loop-side write before the owner frees the actor */
    pthread_mutex_unlock(&a->mu);
}

int kvp_rt_spawn(struct kvp_rt_actor **out, const struct kvp_rt_spec *spec,
                 struct kvp_rt_actor *parent)
{
    if (!out || !spec || !spec->handle)
        return KVP_ERR_INVALID;
    struct kvp_rt_actor *a = actor_alloc(RT_THREAD, spec->name);
    if (!a)
        return KVP_ERR_NOMEM;
    a->spec = *spec;
    a->spec.name = NULL; /* copied into a->name */
    a->core.state = spec->state;
    a->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (a->efd < 0) {
        kvp_log_error(a->name, "eventfd: %s", strerror(errno));
        actor_free(a);
        return KVP_ERR_IO;
    }
    a->parent = kvp_rt_ref(parent);
    zactor_t *z = zactor_new(actor_main, a); /* returns after init ran (ready handshake) */
    if (!z) {
        kvp_log_error(a->name, "cannot start the actor thread");
        kvp_rt_unref(&a->parent);
        actor_free(a);
        return KVP_ERR_IO;
    }
    a->zactor = z;
    pthread_mutex_lock(&a->mu);
    int rc = a->init_rc;
    pthread_mutex_unlock(&a->mu);
    if (rc < 0) {
        zactor_destroy(&z);
        a->zactor = NULL;
        pthread_mutex_lock(&a->mu);
        a->closed = true;
        pthread_mutex_unlock(&a->mu);
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
    if (!out || !spec || !spec->handle)
        return KVP_ERR_INVALID;
    struct kvp_rt_actor *a = actor_alloc(RT_MANUAL, spec->name);
    if (!a)
        return KVP_ERR_NOMEM;
    a->spec = *spec;
    a->spec.name = NULL;
    a->core.state = spec->state;
    a->parent = kvp_rt_ref(parent);
    int rc = rt_core_start(a);
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
        if (zstr_send(a->zactor, "$CLOSE") == 0)
            zsock_wait(a->zactor);
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
            zactor_t *z = a->zactor;
            zactor_destroy(&z); /* $TERM: the thread closes, runs the finis, signals, ends */
            a->zactor = NULL;
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
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    uint64_t ns = (uint64_t)until.tv_nsec + (uint64_t)(timeout_ms % 1000) * 1000000u;
    until.tv_sec += timeout_ms / 1000 + (time_t)(ns / 1000000000u);
    until.tv_nsec = (long)(ns % 1000000000u);
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
