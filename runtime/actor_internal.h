/*
 * actor_internal.h — private structures of the actor runtime (runtime/actor*.c only).
 *
 * Threads and locks: the mailbox part of struct kvp_rt_actor (queue, closed, fail_err,
 * init_rc, exited, and the owner's commands cmd_close/cmd_term with their answers init_done and
 * close_acked) is guarded by `mu`; the loop part (struct rt_core) is touched only by the thread
 * that runs the actor (its own pthread, or the owner calling kvp_rt_poll for a manual actor). `refs` is the only atomic; see rt_ref/rt_unref in actor.c for its memory orders.
 */
#ifndef KVP_RUNTIME_ACTOR_INTERNAL_H
#define KVP_RUNTIME_ACTOR_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/actor.h"

/* ------------------------------------------------------------------ u64 hash map (intrusive) */
struct rt_hnode {
    uint64_t key;
    struct rt_hnode *next;
};

struct rt_hmap {
    struct rt_hnode **b; /* buckets, nb a power of two (or NULL when empty) */
    size_t nb;
    size_t n;
};

void rt_hmap_init(struct rt_hmap *m);
void rt_hmap_fini(struct rt_hmap *m); /* frees the bucket array only */
/* Returns KVP_OK or KVP_ERR_NOMEM (then the node is not inserted). Keys are unique. */
int rt_hmap_put(struct rt_hmap *m, struct rt_hnode *node);
struct rt_hnode *rt_hmap_get(const struct rt_hmap *m, uint64_t key);
struct rt_hnode *rt_hmap_del(struct rt_hmap *m, uint64_t key);
/* Any node (to drain a map), or NULL when empty. */
struct rt_hnode *rt_hmap_any(const struct rt_hmap *m);

#define RT_CONTAINER(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* ------------------------------------------------------------------ timers (min-heap) */
struct rt_timer {
    struct rt_hnode node;  /* key = timer id (user timers, in core.timers) */
    uint64_t due_us;       /* monotonic kvp_clock_now_us() time it fires */
    uint64_t interval_us;  /* 0 = one shot */
    uint64_t hid;          /* who receives it */
    uint64_t corr;         /* deadline timers: the pending request's corr id */
    uint32_t type;         /* user timers: message type */
    bool deadline;         /* request deadline (not in core.timers) */
    size_t idx;            /* position in the heap */
};

struct rt_heap {
    struct rt_timer **v;
    size_t n, cap;
};

int rt_heap_push(struct rt_heap *h, struct rt_timer *t);
void rt_heap_remove(struct rt_heap *h, struct rt_timer *t);
struct rt_timer *rt_heap_top(const struct rt_heap *h);
void rt_heap_fini(struct rt_heap *h);

/* ------------------------------------------------------------------ loop state */
struct rt_hosted {
    struct rt_hnode node; /* key = hid */
    struct kvp_rt_hosted_spec spec;
    void *state;
    uint64_t parent_hid;
    uint32_t owed;   /* unanswered requests addressed to it */
    uint32_t timers; /* live user timers addressed to it */
    char name[KVP_RT_NAME_MAX + 1];
};

struct rt_pending { /* a request this actor sent, awaiting its reply */
    struct rt_hnode node; /* key = corr id */
    uint64_t hid;         /* who sent it (gets the reply) */
    uint32_t type;
    struct rt_timer *deadline; /* NULL = none */
};

struct rt_owed { /* a request this actor received and has not answered */
    struct rt_hnode node; /* key = token */
    struct kvp_rt_actor *from; /* reference held */
    uint64_t from_hid, from_corr;
    uint64_t hid; /* receiving hosted id */
    uint32_t type;
};

struct rt_watch {
    void *handle; /* the socket, or &fd */
    int fd;       /* -1 for sockets */
    int (*fn)(struct kvp_rt_ctx *ctx, void *handle);
    struct rt_watch *next;
};

struct rt_core {
    void *state;
    bool closed;    /* close ran */
    bool finished;  /* fini ran */
    struct rt_hmap hosted, pending, owed, timers;
    struct rt_heap heap;
    uint64_t next_hid, next_corr, next_token, next_timer;
    struct rt_hosted *running; /* hosted actor whose handler runs now */
    struct rt_watch *watches;
    bool watches_changed;
};

struct kvp_rt_ctx {
    struct kvp_rt_actor *a;
    struct rt_hosted *h; /* NULL = the actor itself */
};

enum rt_mode { RT_THREAD, RT_MANUAL, RT_SINK };

struct kvp_rt_actor {
    atomic_uint refs;
    enum rt_mode mode;
    char name[KVP_RT_NAME_MAX + 1];
    struct kvp_rt_spec spec;
    struct kvp_rt_actor *parent; /* reference held until stop */

    /* mailbox, guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* sinks: a message arrived / closed */
    struct kvp_rt_msg *head, *tail;
    size_t queued;
    bool closed;
    int fail_err;
    int init_rc;
    bool exited;
    bool init_done;   /* threaded: init ran (or failed); the spawner waits on cv for it */
    bool cmd_close;   /* threaded: the owner asks the loop to close (kvp_rt_close) */
    bool cmd_term;    /* threaded: the owner asks the loop to end (kvp_rt_stop) */
    bool close_acked; /* threaded: the loop closed after cmd_close; kvp_rt_close waits on cv */
    int efd; /* threaded: eventfd written when the queue goes from empty to non-empty, and for
              * every owner command (cmd_close, cmd_term) */

    /* owner side */
    pthread_t thread; /* threaded: joined by kvp_rt_stop */
    bool thread_live; /* threaded: thread started and not yet joined */
    bool stopped;

    /* loop side */
    struct rt_core core;
};

/* actor.c */
struct kvp_rt_msg *rt_msg_new(uint8_t kind, uint32_t type, uint64_t arg);
void rt_msg_free(struct kvp_rt_msg *m); /* answers an unanswered request with CLOSED */
int rt_push(struct kvp_rt_actor *to, struct kvp_rt_msg *m);
struct kvp_rt_msg *rt_take_all(struct kvp_rt_actor *a);
void rt_set_fail(struct kvp_rt_actor *a, int err);
int rt_send_reply(struct kvp_rt_actor *to, uint64_t hid, uint64_t corr, uint32_t type, int status,
                  uint64_t arg, void **payload, kvp_rt_free_fn free_fn);

/* actor_loop.c */
void rt_core_init(struct kvp_rt_actor *a);
int rt_core_start(struct kvp_rt_actor *a);       /* runs spec.init */
void rt_core_dispatch(struct kvp_rt_actor *a, struct kvp_rt_msg *m);
int rt_core_run_timers(struct kvp_rt_actor *a);  /* returns number fired */
int64_t rt_core_next_due_ms(struct kvp_rt_actor *a); /* -1 none, else ms from now (>= 0) */
void rt_core_close(struct kvp_rt_actor *a);
void rt_core_finish(struct kvp_rt_actor *a);     /* hosted finis, fini, free loop state */
void rt_core_fail(struct kvp_rt_actor *a, struct rt_hosted *h, int err);

#endif
