/*
 * supervisor.c — the supervisor actor (see supervisor.h). Its state is a list of children; it
 * runs only on its own thread: the owner reaches it by kvp_rt_call, the runtime by KVP_RT_FAILED
 * reports from the children.
 */
#include "runtime/supervisor.h"

#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"

enum { SUP_MSG_ADD = 1, SUP_MSG_STOP_CHILD = 2, SUP_MSG_RESTARTS = 3 };

#define SUP_DEFAULT_RESTARTS 3u
#define SUP_DEFAULT_WINDOW_MS 60000u

struct sup_child {
    struct sup_child *next;
    char name[KVP_RT_NAME_MAX + 1];
    kvp_rt_sup_start_fn start;
    void *arg;
    struct kvp_rt_actor *actor; /* NULL when stopped (given up on, or stopped by the owner) */
    uint32_t restarts;          /* restarts so far */
    uint32_t fails_in_window;   /* failures since window_start_ms */
    uint64_t window_start_ms;
};

struct sup_state {
    struct kvp_rt_sup_policy policy;
    struct sup_child *children; /* newest first */
};

/* Payload of SUP_MSG_ADD / STOP_CHILD / RESTARTS. */
struct sup_req {
    char name[KVP_RT_NAME_MAX + 1];
    kvp_rt_sup_start_fn start;
    void *arg;
    uint32_t restarts; /* RESTARTS: the answer */
    int running;       /* RESTARTS: the answer */
};

static struct sup_child *find(struct sup_state *s, const char *name)
{
    for (struct sup_child *c = s->children; c; c = c->next)
        if (strcmp(c->name, name) == 0)
            return c;
    return NULL;
}

/* The default end: SIGTERM to the whole process (not raise(): a daemon that takes its signals
 * with sigwait blocks them in every other thread, and a signal sent to this thread would stay
 * pending here). The process's own handling of SIGTERM then stops it. */
static void stop_process(void)
{
    kill(getpid(), SIGTERM);
}

static void on_failed(struct kvp_rt_ctx *ctx, struct sup_state *s, const struct kvp_rt_failure *f)
{
    const char *sup = kvp_rt_ctx_name(ctx);
    struct sup_child *c = s->children;
    while (c && (!c->actor || c->actor != f->child))
        c = c->next;
    if (!c) {
        kvp_log_warn(sup, "failure report of %s (%s): not a child of this supervisor; ignored", f->name,
                     kvp_errname(f->err));
        return;
    }
    kvp_rt_destroy(&c->actor); /* its thread ends after its fini ran */
    uint64_t now = kvp_clock_now_ms();
    if (c->fails_in_window == 0 || now - c->window_start_ms > s->policy.window_ms) {
        c->window_start_ms = now;
        c->fails_in_window = 0;
    }
    c->fails_in_window++;
    if (c->fails_in_window > s->policy.max_restarts) {
        kvp_log_error(sup, "child %s failed (%s), %u times within %u ms: giving up on it; %s", c->name,
                      kvp_errname(f->err), c->fails_in_window, s->policy.window_ms,
                      s->policy.give_up ? "it stays stopped" : "stopping the process (SIGTERM)");
        if (s->policy.give_up)
            s->policy.give_up(s->policy.give_up_arg, c->name, f->err);
        else
            stop_process();
        return;
    }
    kvp_log_warn(sup, "child %s failed (%s): restarting it (failure %u of at most %u within %u ms)", c->name,
                 kvp_errname(f->err), c->fails_in_window, s->policy.max_restarts + 1, s->policy.window_ms);
    int rc = c->start(c->arg, kvp_rt_self(ctx), &c->actor);
    if (rc != KVP_OK) {
        c->actor = NULL;
        kvp_log_error(sup, "child %s: restart failed (%s): %s", c->name, kvp_errname(rc),
                      s->policy.give_up ? "it stays stopped" : "stopping the process (SIGTERM)");
        if (s->policy.give_up)
            s->policy.give_up(s->policy.give_up_arg, c->name, rc);
        else
            stop_process();
        return;
    }
    c->restarts++;
    kvp_log_info(sup, "child %s restarted (restart %u)", c->name, c->restarts);
}

static int sup_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct sup_state *s = kvp_rt_state(ctx);
    if (msg->kind == KVP_RT_FAILED) {
        if (msg->payload)
            on_failed(ctx, s, msg->payload);
        return KVP_OK;
    }
    if (msg->kind != KVP_RT_REQUEST)
        return KVP_OK;
    struct sup_req *q = msg->payload;
    if (!q) {
        kvp_rt_reply(ctx, msg->corr_id, KVP_ERR_INVALID, 0, NULL, NULL);
        return KVP_OK;
    }
    int rc = KVP_OK;
    struct sup_child *c = find(s, q->name);
    switch (msg->type) {
    case SUP_MSG_ADD:
        if (c) {
            rc = KVP_ERR_EXISTS;
            break;
        }
        c = calloc(1, sizeof *c);
        if (!c) {
            rc = KVP_ERR_NOMEM;
            break;
        }
        memcpy(c->name, q->name, sizeof c->name);
        c->start = q->start;
        c->arg = q->arg;
        rc = c->start(c->arg, kvp_rt_self(ctx), &c->actor);
        if (rc != KVP_OK) {
            free(c);
            break;
        }
        c->next = s->children;
        s->children = c;
        break;
    case SUP_MSG_STOP_CHILD:
        if (!c || !c->actor) {
            rc = KVP_ERR_NOT_FOUND;
            break;
        }
        kvp_rt_destroy(&c->actor);
        break;
    case SUP_MSG_RESTARTS:
        if (!c) {
            rc = KVP_ERR_NOT_FOUND;
            break;
        }
        q->restarts = c->restarts;
        q->running = c->actor != NULL;
        break;
    default:
        rc = KVP_ERR_INVALID;
        break;
    }
    /* The answer goes back in the reply's arg (the request's payload is freed with it). */
    uint64_t arg = msg->type == SUP_MSG_RESTARTS && rc == KVP_OK ? (uint64_t)q->restarts << 1 | (q->running ? 1u : 0u)
                                                                 : 0;
    kvp_rt_reply(ctx, msg->corr_id, rc, arg, NULL, NULL);
    return KVP_OK;
}

static void sup_fini(struct kvp_rt_ctx *ctx)
{
    struct sup_state *s = kvp_rt_state(ctx);
    while (s->children) { /* newest first: a child started later may use an earlier one */
        struct sup_child *c = s->children;
        s->children = c->next;
        kvp_rt_destroy(&c->actor);
        free(c);
    }
    free(s);
}

int kvp_rt_sup_new(struct kvp_rt_actor **out, const char *name, const struct kvp_rt_sup_policy *policy)
{
    if (!out)
        return KVP_ERR_INVALID;
    struct sup_state *s = calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NOMEM;
    if (policy)
        s->policy = *policy;
    else
        s->policy.max_restarts = SUP_DEFAULT_RESTARTS;
    if (!s->policy.window_ms)
        s->policy.window_ms = SUP_DEFAULT_WINDOW_MS;
    struct kvp_rt_spec spec = {.name = name ? name : "supervisor", .handle = sup_handle, .fini = sup_fini,
                               .state = s};
    return kvp_rt_spawn(out, &spec, NULL); /* owns s from here: any failure ran sup_fini */
}

static int sup_call(struct kvp_rt_actor *sup, uint32_t type, const char *child, kvp_rt_sup_start_fn start,
                    void *arg, uint64_t *answer)
{
    if (!sup || !child || !*child || strlen(child) > KVP_RT_NAME_MAX)
        return KVP_ERR_INVALID;
    struct sup_req *q = calloc(1, sizeof *q);
    if (!q)
        return KVP_ERR_NOMEM;
    memcpy(q->name, child, strlen(child));
    q->start = start;
    q->arg = arg;
    void *p = q;
    struct kvp_rt_msg *reply = NULL;
    int rc = kvp_rt_call(sup, 0, type, 0, &p, NULL, 0, &reply);
    if (rc != KVP_OK) {
        free(p);
        return rc;
    }
    rc = reply->status;
    if (answer)
        *answer = reply->arg;
    kvp_rt_msg_destroy(&reply);
    return rc;
}

int kvp_rt_sup_add(struct kvp_rt_actor *sup, const char *child, kvp_rt_sup_start_fn start, void *arg)
{
    if (!start)
        return KVP_ERR_INVALID;
    return sup_call(sup, SUP_MSG_ADD, child, start, arg, NULL);
}

int kvp_rt_sup_stop_child(struct kvp_rt_actor *sup, const char *child)
{
    return sup_call(sup, SUP_MSG_STOP_CHILD, child, NULL, NULL, NULL);
}

int kvp_rt_sup_restarts(struct kvp_rt_actor *sup, const char *child, uint32_t *restarts, int *running)
{
    uint64_t a = 0;
    int rc = sup_call(sup, SUP_MSG_RESTARTS, child, NULL, NULL, &a);
    if (rc == KVP_OK) {
        if (restarts)
            *restarts = (uint32_t)(a >> 1);
        if (running)
            *running = (int)(a & 1u);
    }
    return rc;
}
