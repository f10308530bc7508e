/*
 * fault.c — fault-injection rules for the transfer engine (see fault.h, docs/fencing.md).
 * Compiled only into test builds (KVP_FAULT_INJECTION); a release build gets the stubs below.
 *
 * One runtime actor per process, "xfer-fault", owns everything process-wide about fault injection:
 * the rule table, the count left on count-limited rules, the hit and late-frame counters, the
 * pieces still outstanding (held, paused, or a late frame not yet answered) with the
 * kvp_xfer_fault_quiesce waiters, and the late WRITE frames. It is changed by messages only:
 *  - test threads (plain threads) call it with kvp_rt_call: add, clear, release, quiesce, counts;
 *  - each fault transport (xfer_fault.c, one per transfer actor) registers a sink (its port) at
 *    open. The owner pushes a copy of the rule table into every port when it changes, and every
 *    release; the transport matches on its copy on its own thread. A rule with a count is not
 *    decided on a copy: the transport holds the piece and asks (a request from its sink); the
 *    owner matches, consumes, and answers, so "count=1" hits exactly one piece in the process. A
 *    rule that reached its count is marked spent in the next copy, so later pieces do not ask.
 *    Hits and the end of outstanding pieces come as one-way messages from the transfer actor's
 *    thread, before the piece's completion can reach a caller, so a count or quiesce asked after
 *    a call returned sees them;
 *  - a LATE WRITE frame stands for bytes the kernel keeps retransmitting after the sender gave
 *    up: the owner sends it on a connection of its own when its timer fires (or at release),
 *    non-blocking, several at once with independent delays. No transfer actor's loop or fence
 *    orders it: it leaves from this actor's loop.
 * The owner is started once per process (pthread_once) and lives until the process exits. In a
 * child forked from a process that had one, the child starts its own at its first use, with the
 * parent's rules (a fork copies them, as it copied the old process-wide table), without the
 * parent's outstanding pieces or late frames.
 */
#define _GNU_SOURCE
#include "actors/transfer/fault.h"

#include "kvpool.h"

#ifndef KVP_FAULT_INJECTION

int kvp_xfer_fault_add(const struct kvp_xfer_fault_rule *r)
{
    (void)r;
    return KVP_ERR_UNSUPPORTED;
}
void kvp_xfer_fault_clear(void) {}
void kvp_xfer_fault_release(void) {}
int kvp_xfer_fault_quiesce(uint32_t timeout_ms)
{
    (void)timeout_ms;
    return KVP_ERR_UNSUPPORTED;
}
int kvp_xfer_fault_parse(const char *spec)
{
    (void)spec;
    return KVP_ERR_UNSUPPORTED;
}
void kvp_xfer_fault_counts(struct kvp_xfer_fault_counts *out)
{
    if (out)
        *out = (struct kvp_xfer_fault_counts){0};
}

#else

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "actors/transfer/transfer.h"
#include "runtime/actor.h"
#include "runtime/log.h"
#include "wire/envelope.h"

#define ACTOR "xfer-fault"
#define MAX_RULES XFER_FAULT_MAX_RULES
#define LATE_IO_MS 15000u      /* a late frame's connect + send + answer (was 5 s per step) */
#define CALL_MS 30000u         /* a test thread's wait for the owner's answer */
#define REG_CORR UINT64_MAX    /* correlation id of a port's registration */

/* Messages to the owner. */
enum {
    FA_ADD = 1,    /* call: payload struct xfer_fault_rule_slot; status OK / NO_SPACE */
    FA_CLEAR,      /* call */
    FA_RELEASE,    /* call */
    FA_QUIESCE,    /* call: arg timeout ms; status OK / TIMEOUT */
    FA_COUNTS,     /* call: reply payload struct kvp_xfer_fault_counts */
    FA_REGISTER,   /* request from a port's sink: arg the sink (a reference moves); reply: rules */
    FA_UNREGISTER, /* send: arg the sink */
    FA_ASK,        /* request from a port's sink: arg the sink, payload struct ask; reply arg */
    FA_HIT,        /* send: arg the sink; type says whether it is outstanding */
    FA_HIT_FAIL,   /* send: arg the sink (counted, not outstanding) */
    FA_DONE,       /* send: arg the sink: one of its outstanding pieces is over */
    FA_LATE,       /* send: payload struct late */
    /* timers */
    FT_QUIESCE,
    FT_LATE_DUE,
    FT_LATE_IO,
};

/* Pushed into a port's sink. */
enum { FP_RULES = 1, FP_RELEASE = 2 };

struct rules_msg {
    unsigned n;
    struct xfer_fault_rule_slot x[MAX_RULES];
};

struct ask {
    uint8_t transport, op;
    uint32_t segment_id;
    char endpoint[XFER_FAULT_EP_MAX]; /* "" = none */
};

enum { L_WAIT = 0, L_CONNECT, L_SEND, L_ANSWER };

struct late {
    struct late *next;
    struct sockaddr_storage addr;
    unsigned addr_len;
    uint8_t hdr[KVP_FRAME_HEADER_BYTES];
    uint8_t *payload;
    uint64_t len;
    uint32_t ms;
    int state;
    int fd;
    uint64_t sent;                      /* bytes of hdr + payload sent */
    uint8_t resp[KVP_FRAME_HEADER_BYTES];
    size_t got;
    uint64_t due_timer, io_timer;       /* 0: none */
};

struct reg {
    struct reg *next;
    struct kvp_rt_actor *sink;          /* a reference */
    long outstanding;                   /* its pieces the owner counts */
};

struct waiter {
    struct waiter *next;
    uint64_t token, timer;
};

struct fa {
    struct xfer_fault_rule_slot rules[MAX_RULES];
    unsigned n;
    struct reg *regs;
    long outstanding;                   /* all regs' + late frames not yet over */
    struct kvp_xfer_fault_counts counts;
    struct waiter *waiters;
    struct late *lates;
    int epfd;
};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static struct kvp_rt_actor *g_fa;      /* set once (g_once); never stopped */
static struct fa *g_state;             /* read only in a forked child (fork_child) */
static struct fa *g_inherit;           /* in a child: the parent's owner state, for its rules */
static bool g_atfork;

/* ------------------------------------------------------------------ rules */

static bool rule_valid(const struct kvp_xfer_fault_rule *r)
{
    if (!r || r->action < KVP_FAULT_STALL || r->action > KVP_FAULT_WEDGE)
        return false;
    if (r->transport > KVP_FAULT_LOCAL || (r->op != 0 && r->op != KVP_XFER_READ && r->op != KVP_XFER_WRITE))
        return false;
    if (r->endpoint && strlen(r->endpoint) >= XFER_FAULT_EP_MAX)
        return false;
    return true;
}

static bool slot_matches(const struct xfer_fault_rule_slot *x, uint8_t transport, uint8_t op,
                         uint32_t segment_id, const char *endpoint)
{
    if (x->r.transport && x->r.transport != transport)
        return false;
    if (x->r.op && x->r.op != op)
        return false;
    if (x->r.segment_id && x->r.segment_id != segment_id)
        return false;
    if (x->endpoint[0] && (!endpoint || strcmp(x->endpoint, endpoint)))
        return false;
    return true;
}

static void slot_fill(struct xfer_fault_rule_slot *x, const struct kvp_xfer_fault_rule *r)
{
    memset(x, 0, sizeof *x);
    x->r = *r;
    if (r->endpoint)
        snprintf(x->endpoint, sizeof x->endpoint, "%s", r->endpoint);
    x->r.endpoint = NULL;
    x->left = r->count;
}

/* ------------------------------------------------------------------ the owner */

static struct rules_msg *rules_copy(const struct fa *fa)
{
    struct rules_msg *m = malloc(sizeof *m);
    if (!m)
        return NULL;
    m->n = fa->n;
    memcpy(m->x, fa->rules, sizeof m->x);
    return m;
}

/* Push the table (FP_RULES) or a release (FP_RELEASE) into every port. */
static void push_all(struct fa *fa, uint32_t type)
{
    for (struct reg *r = fa->regs; r; r = r->next) {
        void *pl = type == FP_RULES ? rules_copy(fa) : NULL;
        if (type == FP_RULES && !pl) {
            kvp_log_error(ACTOR, "out of memory: a transport keeps its old rules");
            continue;
        }
        if (kvp_rt_send(r->sink, 0, type, 0, pl ? &pl : NULL, NULL) != KVP_OK)
            free(pl); /* the port closed; its unregistration is on its way */
    }
}

static struct reg *reg_find(struct fa *fa, uint64_t arg)
{
    for (struct reg *r = fa->regs; r; r = r->next)
        if ((uintptr_t)r->sink == (uintptr_t)arg)
            return r;
    return NULL;
}

static void quiesce_check(struct fa *fa, struct kvp_rt_ctx *ctx)
{
    if (fa->outstanding > 0)
        return;
    while (fa->waiters) {
        struct waiter *w = fa->waiters;
        fa->waiters = w->next;
        kvp_rt_timer_cancel(ctx, w->timer);
        kvp_rt_reply(ctx, w->token, KVP_OK, 0, NULL, NULL);
        free(w);
    }
}

static void out_add(struct fa *fa, struct kvp_rt_ctx *ctx, struct reg *r, long d)
{
    if (r)
        r->outstanding += d;
    fa->outstanding += d;
    if (d < 0)
        quiesce_check(fa, ctx);
}

static int rules_add(struct fa *fa, const struct xfer_fault_rule_slot *x)
{
    if (fa->n == MAX_RULES)
        return KVP_ERR_NO_SPACE;
    fa->rules[fa->n] = *x;
    fa->rules[fa->n].left = x->r.count;
    fa->rules[fa->n].spent = false;
    fa->n++;
    return KVP_OK;
}

/* The owner's match (the only place a count is consumed). */
static bool owner_match(struct fa *fa, const struct ask *q, struct xfer_fault_hit *out)
{
    for (unsigned i = 0; i < fa->n; i++) {
        struct xfer_fault_rule_slot *x = &fa->rules[i];
        if (!slot_matches(x, q->transport, q->op, q->segment_id, q->endpoint[0] ? q->endpoint : NULL))
            continue;
        if (x->r.count) {
            if (x->left == 0)
                continue;
            if (--x->left == 0) {
                x->spent = true;
                push_all(fa, FP_RULES); /* before the answer: the asker sees it spent first */
            }
        }
        out->action = x->r.action;
        out->ms = x->r.ms;
        return true;
    }
    return false;
}

/* ------------------------------------------------------------------ late WRITE frames */

static void late_end(struct fa *fa, struct kvp_rt_ctx *ctx, struct late *l, bool sent, int status)
{
    for (struct late **pp = &fa->lates; *pp; pp = &(*pp)->next)
        if (*pp == l) {
            *pp = l->next;
            break;
        }
    if (l->due_timer)
        kvp_rt_timer_cancel(ctx, l->due_timer);
    if (l->io_timer)
        kvp_rt_timer_cancel(ctx, l->io_timer);
    if (l->fd >= 0) {
        epoll_ctl(fa->epfd, EPOLL_CTL_DEL, l->fd, NULL);
        close(l->fd);
    }
    if (sent) {
        fa->counts.late_sent++;
        if (status == 0)
            fa->counts.late_accepted++;
        else
            fa->counts.late_refused++;
        kvp_log_debug(ACTOR, "late WRITE frame (%lu bytes) answered %s", (unsigned long)l->len,
                      kvp_errname(status));
    }
    free(l->payload);
    free(l);
    out_add(fa, ctx, NULL, -1);
}

/* Move a late frame on as far as its socket allows (never blocks). */
static void late_step(struct fa *fa, struct kvp_rt_ctx *ctx, struct late *l)
{
    if (l->state == L_CONNECT) {
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err == EINPROGRESS)
            return; /* not yet */
        if (err) {
            late_end(fa, ctx, l, false, 0);
            return;
        }
        l->state = L_SEND;
    }
    if (l->state == L_SEND) {
        uint64_t total = sizeof l->hdr + l->len;
        while (l->sent < total) {
            struct iovec iov[2];
            int n = 0;
            if (l->sent < sizeof l->hdr)
                iov[n++] = (struct iovec){l->hdr + l->sent, sizeof l->hdr - l->sent};
            uint64_t po = l->sent < sizeof l->hdr ? 0 : l->sent - sizeof l->hdr;
            if (l->len > po)
                iov[n++] = (struct iovec){l->payload + po, l->len - po};
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
            ssize_t r = sendmsg(l->fd, &mh, MSG_NOSIGNAL);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return; /* EPOLLOUT brings it back */
            if (r <= 0) {
                late_end(fa, ctx, l, false, 0);
                return;
            }
            l->sent += (uint64_t)r;
        }
        l->state = L_ANSWER;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = l};
        epoll_ctl(fa->epfd, EPOLL_CTL_MOD, l->fd, &ev);
    }
    if (l->state == L_ANSWER) {
        while (l->got < sizeof l->resp) {
            ssize_t r = recv(l->fd, l->resp + l->got, sizeof l->resp - l->got, 0);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return;
            if (r <= 0) {
                late_end(fa, ctx, l, true, KVP_ERR_TRANSFER);
                return;
            }
            l->got += (size_t)r;
        }
        struct kvp_frame f;
        late_end(fa, ctx, l, true, kvp_frame_decode(l->resp, &f) == KVP_OK ? f.status : KVP_ERR_TRANSFER);
    }
}

/* Its delay ran out (or a release came): connect, non-blocking. */
static void late_start(struct fa *fa, struct kvp_rt_ctx *ctx, struct late *l)
{
    if (l->due_timer) {
        kvp_rt_timer_cancel(ctx, l->due_timer);
        l->due_timer = 0;
    }
    l->fd = socket(l->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd < 0) {
        late_end(fa, ctx, l, false, 0);
        return;
    }
    int rc = connect(l->fd, (struct sockaddr *)&l->addr, l->addr_len);
    if (rc != 0 && errno != EINPROGRESS) {
        late_end(fa, ctx, l, false, 0);
        return;
    }
    struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = l};
    if (epoll_ctl(fa->epfd, EPOLL_CTL_ADD, l->fd, &ev) != 0 ||
        kvp_rt_timer_start(ctx, LATE_IO_MS, 0, FT_LATE_IO, &l->io_timer) != KVP_OK) {
        late_end(fa, ctx, l, false, 0);
        return;
    }
    l->state = L_CONNECT;
    late_step(fa, ctx, l);
}

static int on_epoll(struct kvp_rt_ctx *ctx, void *handle)
{
    (void)handle;
    struct fa *fa = kvp_rt_state(ctx);
    struct epoll_event ev[16];
    int n = epoll_wait(fa->epfd, ev, 16, 0);
    for (int i = 0; i < n; i++) {
        /* an earlier step in this batch may have ended a frame: step only live ones */
        for (struct late *l = fa->lates; l; l = l->next)
            if (l == ev[i].data.ptr) {
                late_step(fa, ctx, l);
                break;
            }
    }
    return KVP_OK;
}

static void late_add(struct fa *fa, struct kvp_rt_ctx *ctx, struct late *l)
{
    l->fd = -1;
    l->next = fa->lates;
    fa->lates = l;
    out_add(fa, ctx, NULL, 1);
    if (l->ms == 0 || kvp_rt_timer_start(ctx, l->ms, 0, FT_LATE_DUE, &l->due_timer) != KVP_OK)
        late_start(fa, ctx, l);
}

static void late_free(void *p)
{
    struct late *l = p;
    if (l)
        free(l->payload);
    free(l);
}

/* ------------------------------------------------------------------ the owner's handler */

static int fa_timer(struct fa *fa, struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m)
{
    if (m->type == FT_QUIESCE) {
        for (struct waiter **pp = &fa->waiters; *pp; pp = &(*pp)->next)
            if ((*pp)->timer == m->corr_id) {
                struct waiter *w = *pp;
                *pp = w->next;
                kvp_rt_reply(ctx, w->token, fa->outstanding > 0 ? KVP_ERR_TIMEOUT : KVP_OK, 0, NULL, NULL);
                free(w);
                break;
            }
        return KVP_OK;
    }
    for (struct late *l = fa->lates; l; l = l->next) {
        if (m->type == FT_LATE_DUE && l->due_timer == m->corr_id) {
            l->due_timer = 0;
            late_start(fa, ctx, l);
            break;
        }
        if (m->type == FT_LATE_IO && l->io_timer == m->corr_id) {
            l->io_timer = 0;
            late_end(fa, ctx, l, l->state == L_ANSWER, KVP_ERR_TRANSFER);
            break;
        }
    }
    return KVP_OK;
}

static int fa_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m)
{
    struct fa *fa = kvp_rt_state(ctx);
    if (m->kind == KVP_RT_TIMER)
        return fa_timer(fa, ctx, m);
    switch (m->type) {
    case FA_ADD: {
        int rc = m->payload ? rules_add(fa, m->payload) : KVP_ERR_INVALID;
        if (rc == KVP_OK)
            push_all(fa, FP_RULES);
        kvp_rt_reply(ctx, m->corr_id, rc, 0, NULL, NULL);
        break;
    }
    case FA_CLEAR:
        fa->n = 0;
        push_all(fa, FP_RULES);
        kvp_rt_reply(ctx, m->corr_id, KVP_OK, 0, NULL, NULL);
        break;
    case FA_RELEASE:
        push_all(fa, FP_RELEASE);
        for (struct late *l = fa->lates, *nl; l; l = nl) {
            nl = l->next; /* late_start may end (free) l */
            if (l->state == L_WAIT)
                late_start(fa, ctx, l);
        }
        kvp_rt_reply(ctx, m->corr_id, KVP_OK, 0, NULL, NULL);
        break;
    case FA_QUIESCE: {
        struct waiter *w = fa->outstanding > 0 ? calloc(1, sizeof *w) : NULL;
        if (fa->outstanding <= 0 || !w) {
            kvp_rt_reply(ctx, m->corr_id, fa->outstanding > 0 ? KVP_ERR_NOMEM : KVP_OK, 0, NULL, NULL);
            break;
        }
        w->token = m->corr_id;
        if (kvp_rt_timer_start(ctx, (uint32_t)m->arg, 0, FT_QUIESCE, &w->timer) != KVP_OK) {
            kvp_rt_reply(ctx, m->corr_id, KVP_ERR_NOMEM, 0, NULL, NULL);
            free(w);
            break;
        }
        w->next = fa->waiters;
        fa->waiters = w;
        break;
    }
    case FA_COUNTS: {
        struct kvp_xfer_fault_counts *c = malloc(sizeof *c);
        if (c)
            *c = fa->counts;
        void *pl = c;
        if (kvp_rt_reply(ctx, m->corr_id, c ? KVP_OK : KVP_ERR_NOMEM, 0, c ? &pl : NULL, NULL) != KVP_OK)
            free(pl);
        break;
    }
    case FA_REGISTER: {
        struct reg *r = calloc(1, sizeof *r);
        void *pl = rules_copy(fa);
        struct kvp_rt_actor *sink = (struct kvp_rt_actor *)(uintptr_t)m->arg;
        if (!r || !pl) {
            free(r);
            free(pl);
            kvp_rt_unref(&sink);
            kvp_rt_reply(ctx, m->corr_id, KVP_ERR_NOMEM, 0, NULL, NULL);
            break;
        }
        r->sink = sink;
        r->next = fa->regs;
        fa->regs = r;
        if (kvp_rt_reply(ctx, m->corr_id, KVP_OK, 0, &pl, NULL) != KVP_OK)
            free(pl);
        break;
    }
    case FA_UNREGISTER:
        for (struct reg **pp = &fa->regs; *pp; pp = &(*pp)->next)
            if ((uintptr_t)(*pp)->sink == (uintptr_t)m->arg) {
                struct reg *r = *pp;
                *pp = r->next;
                out_add(fa, ctx, NULL, -r->outstanding); /* its held pieces went with it */
                kvp_rt_unref(&r->sink);
                free(r);
                break;
            }
        break;
    case FA_ASK: {
        struct xfer_fault_hit hit = {0};
        struct reg *r = reg_find(fa, m->arg);
        bool h = m->payload && owner_match(fa, m->payload, &hit);
        if (h) {
            fa->counts.hits++;
            if (hit.action != KVP_FAULT_FAIL)
                out_add(fa, ctx, r, 1);
        }
        kvp_rt_reply(ctx, m->corr_id, KVP_OK, h ? ((uint64_t)hit.action << 32 | hit.ms) : 0, NULL, NULL);
        break;
    }
    case FA_HIT:
        fa->counts.hits++;
        out_add(fa, ctx, reg_find(fa, m->arg), 1);
        break;
    case FA_HIT_FAIL:
        fa->counts.hits++;
        break;
    case FA_DONE:
        out_add(fa, ctx, reg_find(fa, m->arg), -1);
        break;
    case FA_LATE:
        if (m->payload)
            late_add(fa, ctx, kvp_rt_msg_take(m));
        break;
    default:
        if (m->kind == KVP_RT_REQUEST)
            kvp_rt_reply(ctx, m->corr_id, KVP_ERR_INVALID, 0, NULL, NULL);
        break;
    }
    return KVP_OK;
}

static int parse_spec(const char *spec, struct xfer_fault_rule_slot *out, size_t *n_out);

static int fa_init(struct kvp_rt_ctx *ctx)
{
    struct fa *fa = kvp_rt_state(ctx);
    fa->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (fa->epfd < 0)
        return KVP_ERR_IO;
    int rc = kvp_rt_watch_fd(ctx, fa->epfd, on_epoll);
    if (rc != KVP_OK)
        return rc;
    const char *s = getenv("KVP_XFER_FAULT");
    if (s && *s) {
        struct xfer_fault_rule_slot x[MAX_RULES];
        size_t n = 0;
        if (parse_spec(s, x, &n) == KVP_OK) {
            for (size_t i = 0; i < n; i++)
                if (rules_add(fa, &x[i]) != KVP_OK)
                    break;
            kvp_log_warn(ACTOR, "fault injection active: KVP_XFER_FAULT=\"%s\"", s);
        }
    }
    return KVP_OK;
}

static void fa_fini(struct kvp_rt_ctx *ctx)
{
    struct fa *fa = kvp_rt_state(ctx);
    if (!fa)
        return;
    while (fa->lates)
        late_end(fa, ctx, fa->lates, false, 0);
    while (fa->waiters) {
        struct waiter *w = fa->waiters;
        fa->waiters = w->next;
        free(w);
    }
    while (fa->regs) {
        struct reg *r = fa->regs;
        fa->regs = r->next;
        kvp_rt_unref(&r->sink);
        free(r);
    }
    if (fa->epfd >= 0)
        close(fa->epfd);
    free(fa);
}

/* A forked child has no owner thread: it starts its own at its first use (g_once again), with
 * the parent's rules. The child runs this alone (fork's child handler), before any other thread. */
static void fork_child(void)
{
    g_inherit = g_state;
    g_state = NULL;
    g_fa = NULL;
    pthread_once_t fresh = PTHREAD_ONCE_INIT;
    g_once = fresh;
}

static void fa_start(void)
{
    if (!g_atfork) {
        g_atfork = true;
        pthread_atfork(NULL, NULL, fork_child);
    }
    struct fa *fa = calloc(1, sizeof *fa);
    if (!fa) {
        kvp_log_error(ACTOR, "out of memory: fault injection is off in this process");
        return;
    }
    fa->epfd = -1;
    if (g_inherit) {
        fa->n = g_inherit->n;
        memcpy(fa->rules, g_inherit->rules, sizeof fa->rules);
        g_inherit = NULL;
    }
    struct kvp_rt_spec spec = {.name = ACTOR, .init = fa_init, .handle = fa_handle, .fini = fa_fini, .state = fa};
    int rc = kvp_rt_spawn(&g_fa, &spec, NULL);
    if (rc != KVP_OK) {
        g_fa = NULL;
        kvp_log_error(ACTOR, "cannot start the fault owner (%s): fault injection is off in this process",
                      kvp_errname(rc));
        return;
    }
    g_state = fa;
}

static struct kvp_rt_actor *owner(void)
{
    pthread_once(&g_once, fa_start);
    return g_fa;
}

/* A test thread's call: the owner's status, or the call's own error. */
static int owner_call(uint32_t type, uint64_t arg, void *payload, uint32_t timeout_ms, void **reply_payload)
{
    struct kvp_rt_actor *a = owner();
    if (!a) {
        free(payload);
        return KVP_ERR_IO;
    }
    struct kvp_rt_msg *r = NULL;
    void *pl = payload;
    int rc = kvp_rt_call(a, 0, type, arg, pl ? &pl : NULL, NULL, timeout_ms, &r);
    free(pl); /* still ours when the call failed */
    if (rc != KVP_OK)
        return rc;
    rc = r->status;
    if (reply_payload)
        *reply_payload = kvp_rt_msg_take(r);
    kvp_rt_msg_destroy(&r);
    return rc;
}

/* ------------------------------------------------------------------ the public calls */

int kvp_xfer_fault_add(const struct kvp_xfer_fault_rule *r)
{
    if (!rule_valid(r))
        return KVP_ERR_INVALID;
    struct xfer_fault_rule_slot *x = malloc(sizeof *x);
    if (!x)
        return KVP_ERR_NOMEM;
    slot_fill(x, r);
    return owner_call(FA_ADD, 0, x, CALL_MS, NULL);
}

void kvp_xfer_fault_clear(void)
{
    if (owner_call(FA_CLEAR, 0, NULL, CALL_MS, NULL) != KVP_OK)
        kvp_log_error(ACTOR, "kvp_xfer_fault_clear: the fault owner did not answer");
}

/* Pieces held in transports end at their next poll (they look again every few ms while they
 * hold any); the owner's late frames leave now. */
void kvp_xfer_fault_release(void)
{
    if (owner_call(FA_RELEASE, 0, NULL, CALL_MS, NULL) != KVP_OK)
        kvp_log_error(ACTOR, "kvp_xfer_fault_release: the fault owner did not answer");
}

int kvp_xfer_fault_quiesce(uint32_t timeout_ms)
{
    /* the owner answers TIMEOUT itself at timeout_ms; the call's own limit is a backstop */
    uint32_t limit = timeout_ms > UINT32_MAX - CALL_MS ? UINT32_MAX - 1 : timeout_ms + CALL_MS;
    int rc = owner_call(FA_QUIESCE, timeout_ms, NULL, limit, NULL);
    return rc == KVP_OK ? KVP_OK : KVP_ERR_TIMEOUT;
}

void kvp_xfer_fault_counts(struct kvp_xfer_fault_counts *out)
{
    if (!out)
        return;
    void *c = NULL;
    if (owner_call(FA_COUNTS, 0, NULL, CALL_MS, &c) == KVP_OK && c)
        *out = *(struct kvp_xfer_fault_counts *)c;
    else
        *out = (struct kvp_xfer_fault_counts){0};
    free(c);
}

/* ------------------------------------------------------------------ ports (transfer actors' side) */

struct xfer_fault_port *xfer_fault_port_open(void)
{
    struct kvp_rt_actor *a = owner();
    struct xfer_fault_port *p = calloc(1, sizeof *p);
    if (!a || !p || kvp_rt_sink_new(&p->sink, "xfer-fault-port") != KVP_OK) {
        kvp_log_error(ACTOR, "a transport cannot reach the fault owner: no faults on it");
        free(p);
        return NULL;
    }
    struct kvp_rt_actor *ref = kvp_rt_ref(p->sink); /* the owner's, with the message */
    if (kvp_rt_request_from(p->sink, a, 0, FA_REGISTER, (uint64_t)(uintptr_t)ref, NULL, NULL, REG_CORR) !=
        KVP_OK) {
        kvp_rt_unref(&ref);
        kvp_rt_destroy(&p->sink);
        free(p);
        kvp_log_error(ACTOR, "a transport cannot register with the fault owner: no faults on it");
        return NULL;
    }
    /* The rules as they are now, before the transport's first post: a test that added a rule and
     * then started an engine must see it applied. The wait is short and bounded: the owner never
     * waits on anyone, and this runs once, in the transfer actor's init (its spawner is waiting
     * for that init anyway). */
    struct kvp_rt_msg *m = NULL;
    if (kvp_rt_recv(p->sink, CALL_MS, &m) != KVP_OK || m->kind != KVP_RT_REPLY || m->status != KVP_OK ||
        !m->payload) {
        kvp_log_error(ACTOR, "the fault owner did not answer a transport's registration: rules come later");
    } else {
        const struct rules_msg *rm = m->payload;
        p->n = rm->n;
        memcpy(p->rules, rm->x, sizeof p->rules);
    }
    kvp_rt_msg_destroy(&m);
    return p;
}

void xfer_fault_port_close(struct xfer_fault_port *p)
{
    if (!p)
        return;
    struct kvp_rt_actor *a = g_fa;
    if (a)
        kvp_rt_send(a, 0, FA_UNREGISTER, (uint64_t)(uintptr_t)p->sink, NULL, NULL);
    kvp_rt_destroy(&p->sink);
    free(p);
}

void xfer_fault_port_sync(struct xfer_fault_port *p,
                          void (*on_answer)(void *arg, uint64_t ask_id, const struct xfer_fault_hit *hit),
                          void *arg)
{
    struct kvp_rt_msg *m = NULL;
    while (kvp_rt_recv(p->sink, 0, &m) == KVP_OK) {
        if (m->kind == KVP_RT_REPLY) {
            if (m->corr_id != REG_CORR) {
                struct xfer_fault_hit h = {.action = (uint8_t)(m->arg >> 32), .ms = (uint32_t)m->arg};
                on_answer(arg, m->corr_id, m->status == KVP_OK && h.action ? &h : NULL);
            }
        } else if (m->type == FP_RULES && m->payload) {
            const struct rules_msg *rm = m->payload;
            p->n = rm->n;
            memcpy(p->rules, rm->x, sizeof p->rules);
        } else if (m->type == FP_RELEASE) {
            p->gen++;
        }
        kvp_rt_msg_destroy(&m);
    }
}

int xfer_fault_port_match(const struct xfer_fault_port *p, uint8_t transport, uint8_t op,
                          uint32_t segment_id, const char *endpoint, struct xfer_fault_hit *out)
{
    for (unsigned i = 0; i < p->n; i++) {
        const struct xfer_fault_rule_slot *x = &p->rules[i];
        if (!slot_matches(x, transport, op, segment_id, endpoint))
            continue;
        if (x->r.count) {
            if (x->spent)
                continue;
            return XFER_FAULT_ASK;
        }
        out->action = x->r.action;
        out->ms = x->r.ms;
        return XFER_FAULT_HIT;
    }
    return XFER_FAULT_NONE;
}

int xfer_fault_port_ask(struct xfer_fault_port *p, uint64_t ask_id, uint8_t transport, uint8_t op,
                        uint32_t segment_id, const char *endpoint)
{
    struct ask *q = calloc(1, sizeof *q);
    if (!q || !g_fa) {
        free(q);
        return KVP_ERR_NOMEM;
    }
    q->transport = transport;
    q->op = op;
    q->segment_id = segment_id;
    if (endpoint)
        snprintf(q->endpoint, sizeof q->endpoint, "%s", endpoint);
    void *pl = q;
    int rc = kvp_rt_request_from(p->sink, g_fa, 0, FA_ASK, (uint64_t)(uintptr_t)p->sink, &pl, NULL, ask_id);
    free(pl);
    return rc;
}

void xfer_fault_port_hit(struct xfer_fault_port *p, uint8_t action)
{
    if (g_fa)
        kvp_rt_send(g_fa, 0, action == KVP_FAULT_FAIL ? FA_HIT_FAIL : FA_HIT, (uint64_t)(uintptr_t)p->sink, NULL,
                    NULL);
}

void xfer_fault_port_done(struct xfer_fault_port *p)
{
    if (g_fa)
        kvp_rt_send(g_fa, 0, FA_DONE, (uint64_t)(uintptr_t)p->sink, NULL, NULL);
}

void xfer_fault_port_late_write(struct xfer_fault_port *p, const struct sockaddr_storage *addr,
                                unsigned addr_len, const uint8_t *hdr, const uint8_t *payload,
                                uint64_t len, uint32_t ms)
{
    (void)p;
    struct late *l = calloc(1, sizeof *l);
    if (!l || !(l->payload = malloc(len ? len : 1)) || !g_fa) {
        late_free(l);
        return;
    }
    memcpy(&l->addr, addr, sizeof l->addr);
    l->addr_len = addr_len;
    memcpy(l->hdr, hdr, sizeof l->hdr);
    memcpy(l->payload, payload, len);
    l->len = len;
    l->ms = ms;
    void *pl = l;
    if (kvp_rt_send(g_fa, 0, FA_LATE, 0, &pl, late_free) != KVP_OK)
        late_free(pl);
}

/* ------------------------------------------------------------------ environment */

static int parse_rule(char *s, struct kvp_xfer_fault_rule *r, char *ep, size_t ep_cap)
{
    *r = (struct kvp_xfer_fault_rule){0};
    char *save = NULL;
    char *tok = strtok_r(s, ",", &save);
    if (!tok)
        return KVP_ERR_INVALID;
    static const char *names[] = {NULL, "stall", "late", "drop", "fail", "wedge"};
    for (int i = 1; i <= 5; i++)
        if (!strcmp(tok, names[i]))
            r->action = (uint8_t)i;
    if (!r->action)
        return KVP_ERR_INVALID;
    while ((tok = strtok_r(NULL, ",", &save))) {
        char *eq = strchr(tok, '=');
        if (!eq)
            return KVP_ERR_INVALID;
        *eq = 0;
        const char *k = tok, *v = eq + 1;
        char *end = NULL;
        if (!strcmp(k, "transport")) {
            if (!strcmp(v, "tcp"))
                r->transport = KVP_FAULT_TCP;
            else if (!strcmp(v, "local"))
                r->transport = KVP_FAULT_LOCAL;
            else
                return KVP_ERR_INVALID;
        } else if (!strcmp(k, "op")) {
            if (!strcmp(v, "read"))
                r->op = KVP_XFER_READ;
            else if (!strcmp(v, "write"))
                r->op = KVP_XFER_WRITE;
            else
                return KVP_ERR_INVALID;
        } else if (!strcmp(k, "endpoint")) {
            if (strlen(v) >= ep_cap)
                return KVP_ERR_INVALID;
            snprintf(ep, ep_cap, "%s", v);
            r->endpoint = ep;
        } else if (!strcmp(k, "segment") || !strcmp(k, "ms") || !strcmp(k, "count")) {
            errno = 0;
            unsigned long n = strtoul(v, &end, 10);
            if (errno || !*v || *end || n > UINT32_MAX)
                return KVP_ERR_INVALID;
            if (!strcmp(k, "segment"))
                r->segment_id = (uint32_t)n;
            else if (!strcmp(k, "ms"))
                r->ms = (uint32_t)n;
            else
                r->count = (uint32_t)n;
        } else {
            return KVP_ERR_INVALID;
        }
    }
    return rule_valid(r) ? KVP_OK : KVP_ERR_INVALID;
}

/* Parse a whole spec into slots; nothing is added here. */
static int parse_spec(const char *spec, struct xfer_fault_rule_slot *out, size_t *n_out)
{
    *n_out = 0;
    if (!spec)
        return KVP_ERR_INVALID;
    char *copy = strdup(spec);
    if (!copy)
        return KVP_ERR_NOMEM;
    size_t n = 0;
    int rc = KVP_OK;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ";", &save); tok && rc == KVP_OK; tok = strtok_r(NULL, ";", &save)) {
        if (!*tok)
            continue;
        if (n == MAX_RULES) {
            rc = KVP_ERR_INVALID;
            break;
        }
        struct kvp_xfer_fault_rule r;
        char ep[XFER_FAULT_EP_MAX];
        rc = parse_rule(tok, &r, ep, sizeof ep);
        if (rc == KVP_OK)
            slot_fill(&out[n++], &r);
    }
    free(copy);
    if (rc != KVP_OK) {
        kvp_log_error(ACTOR, "KVP_XFER_FAULT: bad rule in \"%s\" (nothing added)", spec);
        return rc;
    }
    *n_out = n;
    return KVP_OK;
}

int kvp_xfer_fault_parse(const char *spec)
{
    struct xfer_fault_rule_slot x[MAX_RULES];
    size_t n = 0;
    int rc = parse_spec(spec, x, &n);
    for (size_t i = 0; i < n && rc == KVP_OK; i++) {
        struct xfer_fault_rule_slot *c = malloc(sizeof *c);
        if (!c)
            return KVP_ERR_NOMEM;
        *c = x[i];
        rc = owner_call(FA_ADD, 0, c, CALL_MS, NULL);
    }
    return rc;
}

#endif
