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
 *  - batch actors (hosted actors, one per kvp_xfer_run call) live in the transfer actor the
 *    call was sent to (its home): they cut the call's slices into xslices, hand them to the home
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
};

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
