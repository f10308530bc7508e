/*
 * transfer_internal.h — the transfer engine's parts (not a public interface).
 *
 * Actors and ownership (docs/data-plane.md, docs/runtime.md):
 *  - transfer actors (runtime threaded actors): `xfer-tcp-<i>` (params.io_threads of them), each
 *    owning one tcp transport instance (transport.h: its sockets, its epoll set, its scratch
 *    memory), and `xfer-local`, owning the local transport (the table of segments registered in
 *    this process). With fault injection compiled in, each instance is wrapped by the fault
 *    transport. Nothing outside an actor touches its transport. With params.token_wallet each
 *    network actor also owns a wallet (that key pair; tokens by message, kvp_xfer_tokens_put)
 *    its transports sign the segments' challenges from;
 *  - batch actors (hosted actors, one per kvp_xfer_run call; one implementation, xfer_batch.c)
 *    live in the engine's batch host when it has one (params.batch_host: the client actor;
 *    xfer_host.c), else in the tcp transfer actor the call was sent to (its home). They cut the
 *    call's slices into xslices, lend them to the transfer actors by XA_WORK requests (in a tcp
 *    actor, the remote ones go to its own transport directly: same thread), run the call's
 *    timeout and the fence bound as runtime timers (XA_FENCE, XA_ABORT), and answer the caller —
 *    whose thread waits on a runtime sink — from their fini, once every transfer actor reported
 *    every xslice terminal. Each host embeds a struct xfer_bhost (below).
 */
#ifndef KVP_XFER_TRANSFER_INTERNAL_H
#define KVP_XFER_TRANSFER_INTERNAL_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "actors/transfer/transfer.h"
#include "actors/transfer/transport.h"
#include "auth/auth_token.h"

#define XFER_DEFAULT_CONNS 4u
#define XFER_MAX_IO_THREADS 8u
#define XFER_MAX_CONNS 64u
#define XFER_DEFAULT_SLICE_BYTES (1ull << 20)
#define XFER_DEFAULT_CONNECT_MS 1000u
#define XFER_DEFAULT_FENCE_BOUND_MS 2000u

struct kvp_rt_actor;

struct kvp_xfer_engine {
    struct kvp_xfer_params p;            /* defaults applied; read-only after new */
    unsigned n_tcp;
    struct kvp_rt_actor *tcp[XFER_MAX_IO_THREADS]; /* xfer-tcp-<i> (owner's references) */
    struct kvp_rt_actor *local;          /* xfer-local */
    struct kvp_rt_actor *idle;           /* a sink holding one token (arg = index) per tcp actor
                                            no call uses now: kvp_xfer_run takes one if any */
    struct kvp_rt_actor *host;           /* params.batch_host (a reference), or NULL */
};

#define XS_PENDING 1 /* a work's xslice status while it is not terminal (kvp_err are <= 0) */
#define ID_SHIFT 24  /* xslice id = work seq << ID_SHIFT | index in the work */

enum xa_msg {
    XA_CALL = 1,   /* request caller -> home: payload struct xfer_call * (the caller's; no free) */
    XA_WORK,       /* request batch -> transfer actor: payload struct xfer_work * (the batch's) */
    XA_FENCE,      /* one-way batch -> transfer actor: payload work, arg = status */
    XA_ABORT,      /* one-way batch -> transfer actor: payload work */
    XA_STOP,       /* request owner -> actor: fence everything CLOSED, refuse new work */
    XA_STATS,      /* request: answer's payload is a struct kvp_xfer_stats */
    XA_LOCAL_ADD,  /* request: payload struct xfer_local_reg */
    XA_LOCAL_DEL,  /* request: arg = segment id */
    XA_POLL_TIMER, /* timer: the transport asked to be polled (its next_ns) */
    XA_REARM,      /* one-way to itself: pump (and arm the poll timer) as the transfer actor */
    XB_TIMEOUT,    /* batch timer: the call's timeout */
    XB_BOUND,      /* batch timer: the fence bound after the timeout */
    XA_MEM_REG,    /* request: payload struct xfer_local_reg (base, size): the transport's mem_register */
    XA_MEM_UNREG,  /* request: the same, mem_unregister */
    XA_TOKENS,     /* one-way caller -> network actor: payload struct xfer_tokens (kvp_xfer_tokens_put) */
    /* To the batch host (kvp_xfer_params.batch_host; transfer.h, xfer_host.c): */
    XH_CALL = KVP_XFER_HOST_MSG_FIRST, /* request caller -> host: payload struct xfer_call * */
    XH_STOP,       /* request engine -> host: fence its batches CLOSED, refuse new calls */
    XH_STATS,      /* request: answer's payload is a struct kvp_xfer_stats (batches, slices, timeouts) */
    XH_LOCAL_ADD,  /* request: payload struct xfer_local_reg (routing: a segment in this process) */
    XH_LOCAL_DEL,  /* request: arg = segment id */
};


/* XA_TOKENS' payload: one allocation, freed by the runtime after the handler. */
struct xfer_tokens {
    size_t n;
    struct {
        uint16_t len;
        uint8_t b[KVP_DT_TOKEN_MAX];
    } tok[];
};

static inline void xfer_no_free(void *p) { (void)p; }

/* What the caller sends (lives on the caller's stack until the answer). */
struct xfer_call {
    struct kvp_xfer_slice *slices;
    size_t n;
    uint32_t timeout_ms;
    uint64_t start_ns;
    uint64_t wdeadline_ms; /* WRITE deadline (wall ms) the segment enforces; 0 none */
    int64_t home_token;    /* the engine's idle token this call took (index), -1 none: the home
                              puts it back before it answers (the caller may not touch the engine
                              after the answer: a destroy may be freeing it) */
    struct kvp_xfer_engine *e; /* hosted calls (XH_CALL): the engine, for the host's batch actor */
    unsigned tid;          /* the calling thread's id: the tcp actor it uses when none is idle */
};

struct xfer_local_reg {
    uint32_t segment_id;
    void *base;
    uint64_t size;
};

struct xb;
struct kvp_rt_ctx;
struct kvp_rt_msg;

/* The xslices of one batch on one transfer actor. Owned by its batch; lent to a transfer actor
 * (by XA_WORK) until that actor answers. */
struct xfer_work {
    struct xb *batch;          /* a direct work's: read on its host's thread only (NULL: lent) */
    uint64_t token;            /* XA_WORK's reply token (remote works) */
    uint64_t seq;              /* in the transfer actor that runs it */
    bool direct;               /* runs on its batch's host itself (no messages) */
    bool done;                 /* every xslice terminal (set by the transfer actor) */
    bool abort_now;            /* fence = abort at once (engine stopping) */
    size_t n, left;
    struct kvp_xport_slice *xs;
    const char **ep;           /* per xslice: the caller slice's endpoint (read-only) */
    uint32_t *slice_of;        /* per xslice: its slice in the call */
    int *st;                   /* per xslice: XS_PENDING or the terminal status */
    int fence_status;          /* 0, or the status a fence asked for */
    struct xfer_work *next;    /* the running actor's list */
};

/* A zeroed work for n xslices and its per-xslice arrays, in one allocation; NULL when out of
 * memory. xfer_work_free frees it. */
struct xfer_work *xfer_work_new(size_t n);
void xfer_work_free(struct xfer_work *w);

/* ------------------------------------------------------------------ xfer_batch.c
 * The batch actors' host: a tcp transfer actor (xfer_engine.c) or the engine's batch host
 * (xfer_host.c), each embedding one struct xfer_bhost; everything below runs on its thread. */

/* What the two hosts do differently. */
struct xfer_bhost_ops {
    /* A tcp transfer actor runs a batch's remote work on its own transport (no message): start
     * it, fence it (with `now`, the engine stopping: abort it too), abort it (the fence bound
     * passed); each polls the transport afterwards, so the work may report back
     * (xfer_batch_direct_done) before it returns. NULL (the client actor): the remote work is
     * lent to a tcp actor (XA_WORK), as the local one is to xfer-local. */
    void (*direct_start)(void *owner, struct kvp_rt_ctx *ctx, struct xfer_work *w);
    void (*direct_fence)(void *owner, struct kvp_rt_ctx *ctx, struct xfer_work *w, int status, bool now);
    void (*direct_abort)(void *owner, struct kvp_rt_ctx *ctx, struct xfer_work *w);
    /* Just before a call is answered: in its batch actor's fini (ran, after on_batch_fini), or
     * when it is refused before a batch actor ran. May be NULL. */
    void (*answering)(void *owner, struct xfer_call *c, bool ran);
    /* Whether the host holds work besides its batches (the engine's stop waits for it). May be NULL. */
    bool (*busy)(void *owner);
};

/* A batch host's state (its thread only). */
struct xfer_bhost {
    const struct xfer_bhost_ops *ops;
    void *owner;                       /* the ops' first argument */
    const char *name;                  /* for log lines */
    const struct kvp_xfer_params *p;   /* slice_bytes, fence_bound_ms, on_batch_fini (defaults applied) */
    struct kvp_rt_actor *local;        /* xfer-local */
    struct kvp_rt_actor *const *tcp;   /* without direct ops: the tcp actors a remote work is lent to */
    unsigned n_tcp;
    unsigned lent[XFER_MAX_IO_THREADS]; /* remote works of this host each tcp actor holds now */
    uint32_t *local_ids;               /* segments registered with xfer-local (routing) */
    size_t n_local, cap_local;
    struct xb *batches;                /* live batch actors */
    struct xb *running;                /* the batch whose start or handler runs now */
    bool stopping;                     /* the engine's stop came: new calls are refused CLOSED */
    bool stop_owed;                    /* stop_token holds an unanswered stop */
    uint64_t stop_token;
    struct kvp_xfer_stats *st;         /* the owner's: batches, slices, timeouts counted here */
};

/* A call (the XA_CALL or XH_CALL request m, payload struct xfer_call *): spawn its batch actor, or
 * refuse it (stopping: KVP_ERR_CLOSED; KVP_ERR_NOMEM). */
void xfer_bhost_call(struct xfer_bhost *h, struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m);
/* Refuse call m before any batch actor: every slice gets `status`, then the host's answering hook
 * (h may be NULL: none), then the caller its answer. */
void xfer_bhost_refuse(struct xfer_bhost *h, struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m, int status);
/* The engine's stop (request corr): refuse new calls, fence every batch with KVP_ERR_CLOSED and
 * abort at once; the stop is answered (xfer_bhost_stop_check) once no batch is left and the host
 * is not busy. A second stop answers the first. */
void xfer_bhost_stop(struct xfer_bhost *h, struct kvp_rt_ctx *ctx, uint64_t corr);
void xfer_bhost_stop_check(struct xfer_bhost *h, struct kvp_rt_ctx *ctx);
/* The host's own remote work of batch b (w->batch, w->direct) has every xslice terminal. */
void xfer_batch_direct_done(struct kvp_rt_ctx *ctx, struct xb *b);
/* Routing: the segments registered with xfer-local. local_set: KVP_OK (also for an add of one
 * there already), KVP_ERR_NOT_FOUND (a delete of one not there), KVP_ERR_NOMEM. */
bool xfer_bhost_is_local(const struct xfer_bhost *h, uint32_t segment_id);
int xfer_bhost_local_set(struct xfer_bhost *h, uint32_t segment_id, bool add);
/* Free what the host state holds (not the state: its owner's). */
void xfer_bhost_free(struct xfer_bhost *h);

/* xfer_local.c: the local transport's table (called by the local actor, on its thread). */
int xfer_local_add(struct kvp_xport *t, uint32_t segment_id, void *base, uint64_t size);
int xfer_local_del(struct kvp_xport *t, uint32_t segment_id);

/* xfer_tcp.c: fault injection's LATE on a READ: its answer is not read before until_ns (0 lifts). */
void xfer_tcp_delay(struct kvp_xport *t, uint64_t id, uint64_t until_ns);

/* xfer_fault.c: whether fault injection is compiled in (then the engine wraps its transports in
 * kvp_xport_fault), and the transport a fault instance wraps (t itself without injection). */
bool xfer_fault_compiled(void);
struct kvp_xport *xfer_fault_inner(struct kvp_xport *t);

/* xfer_net.c */
int xfer_set_nonblock(int fd);
int xfer_connect_start(const struct sockaddr_storage *addr, unsigned len, int *fd_out);
/* Wait for poll event `ev` (POLLIN, POLLOUT) on fd until deadline_ms (kvp_clock_now_ms): 1 ready,
 * 0 timeout, -1 error. Blocks the caller: probes and the RDMA hello only, never an actor's loop. */
int xfer_wait_fd(int fd, short ev, uint64_t deadline_ms);

#endif
