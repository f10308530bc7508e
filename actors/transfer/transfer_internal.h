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
 *  - batch actors (hosted actors, one per kvp_xfer_run call) live in the engine's batch host
 *    when it has one (params.batch_host: the client actor; xfer_host.c: they reach every
 *    transfer actor by XA_WORK requests, fence by XA_FENCE/XA_ABORT, and answer the caller from
 *    their fini once every work was answered); else in the transfer actor the call was sent to
 *    (its home): they cut the call's slices into xslices, hand them to the home
 *    transport directly (same thread) and to the local actor by message, run the call's timeout
 *    and the fence bound as runtime timers, and answer the caller — whose thread waits on a
 *    runtime sink — from their fini, once every transfer actor reported every xslice terminal.
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

/* The xslices of one batch on one transfer actor. Owned by its batch; lent to a transfer actor
 * (by XA_WORK) until that actor answers. */
struct xfer_work {
    struct xb *batch;          /* read on the home thread only (NULL: a host's work) */
    uint64_t token;            /* XA_WORK's reply token (remote works) */
    uint64_t seq;              /* in the transfer actor that runs it */
    bool direct;               /* runs on the home itself (no messages) */
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
