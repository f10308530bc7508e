/*
 * transfer_internal.h — state of the transfer engine (not a public interface).
 *
 * Threads and ownership (docs/data-plane.md):
 *  - caller threads build a batch and its pieces, resolve endpoints (peers are created under
 *    e->mu and never freed before the engine), do local-transport slices with memcpy, submit
 *    the batch to the I/O thread and wait on the batch's condition variable;
 *  - the engine's I/O thread owns every connection, every piece after submission, the active
 *    batch list and the deadlines. Only the I/O thread reads or writes caller memory for TCP
 *    slices, and only it fences; so "check the slice's state before every recv into caller
 *    memory" is a plain field read (piece->batch != NULL) with no race.
 */
#ifndef KVP_XFER_TRANSFER_INTERNAL_H
#define KVP_XFER_TRANSFER_INTERNAL_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "actors/transfer/transfer.h"
#include "wire/envelope.h"

#define XFER_DEFAULT_CONNS 4u
#define XFER_MAX_IO_THREADS 8u
#define XFER_MAX_CONNS 64u
#define XFER_DEFAULT_SLICE_BYTES (1ull << 20)
#define XFER_DEFAULT_CONNECT_MS 1000u
#define XFER_SCRATCH_BYTES (256u * 1024u)
#define XFER_MAX_IOV 64
/* Extra load counted per piece when choosing a connection, so many tiny pieces still spread. */
#define XFER_PIECE_COST 4096u
/* A connection whose load is below this takes the next piece before any other (pick_conn). */
#define XFER_PACK_BYTES (256u * 1024u)

enum xfer_piece_where {
    PIECE_NEW = 0,      /* built by the caller, not yet on a connection */
    PIECE_SENDQ = 1,    /* on conn->sendq; p->sent bytes of header+payload already sent */
    PIECE_INFLIGHT = 2, /* request sent; on conn->inflight waiting for its response */
    PIECE_RECV = 3,     /* its response payload is being received (conn->rpiece) */
    PIECE_HELD = 4,     /* held back by a fault rule (e->held), not on a connection */
};

struct xfer_batch;
struct xfer_conn;
struct xfer_peer;

/* One request on the wire: a part (<= slice_bytes) of one slice. */
struct xfer_piece {
    struct xfer_batch *batch; /* NULL once terminal: from then on nothing reads p->local */
    struct xfer_peer *peer;
    struct xfer_conn *conn;
    size_t slice;             /* index of its slice in the batch */
    size_t idx;               /* index in batch->pieces */
    uint8_t op;               /* KVP_XFER_READ / KVP_XFER_WRITE */
    uint8_t where;            /* enum xfer_piece_where */
    uint8_t *local;           /* caller memory */
    uint64_t length;
    uint64_t req_id;
    uint64_t sent;            /* bytes of hdr + payload sent */
    uint8_t hdr[KVP_FRAME_HEADER_BYTES];
    uint32_t segment_id;      /* for logs (the slice may be gone once the piece is terminal) */
    uint8_t fault;            /* fault action hit (0 none; fault.h) */
    uint32_t fault_ms;
    uint64_t fault_until_ns;  /* end of the stall / late delay (UINT64_MAX: until released) */
    unsigned long fault_gen;  /* release generation when hit */
    struct xfer_piece *prev, *next; /* links in conn->sendq, conn->inflight or e->held */
};

struct xfer_list {
    struct xfer_piece *head, *tail;
};

enum xfer_conn_state { CONN_IDLE = 0, CONN_CONNECTING = 1, CONN_UP = 2 };

struct xfer_conn {
    struct xfer_peer *peer;
    int fd;
    int state;
    uint32_t events;            /* the epoll mask now registered */
    uint64_t connect_deadline_ns;
    uint64_t load;              /* bytes (plus XFER_PIECE_COST per piece) queued or in flight */
    struct xfer_list sendq;     /* requests to send, head first (head may be partly sent) */
    struct xfer_list inflight;  /* requests sent, in order; responses come back in this order */
    struct xfer_piece *rpiece;  /* piece whose READ payload is being received */
    uint64_t rgot;              /* payload bytes of rpiece received */
    uint8_t rhdr[KVP_FRAME_HEADER_BYTES];
    size_t rhdr_got;
    uint8_t *pb;                /* pushback: response bytes a speculative readv misplaced (conn_recv) */
    size_t pb_len, pb_off;      /* bytes in pb, bytes of them already parsed */
    bool close_pending;         /* fencing found a piece mid-send: close after the fence pass */
    bool paused;                /* fault LATE: not reading until pause_until_ns / release */
    uint64_t pause_until_ns;
    unsigned long pause_gen;
};

struct xfer_peer {
    char *endpoint;
    struct sockaddr_storage addr;
    unsigned addr_len;
    struct xfer_conn *conns;    /* conns_per_peer of them; I/O thread only */
    bool io_known;              /* on the I/O thread's peer list (I/O thread only) */
    bool down_logged;           /* a connection failure was logged at WARN; reset on connect (I/O thread) */
    struct xfer_peer *next;     /* e->peers, guarded by e->mu */
    struct xfer_peer *io_next;  /* e->io_peers, I/O thread only */
};

struct xfer_batch {
    struct kvp_xfer_slice *slices;
    size_t n;
    struct xfer_piece **pieces; /* a slot is NULL once its piece is terminal (I/O thread) */
    size_t n_pieces;
    size_t left;                /* pieces not terminal (I/O thread only) */
    uint64_t deadline_ns;       /* 0 = no timeout */
    bool fenced;                /* the timeout fenced it (I/O thread) */
    uint64_t fence_deadline_ns; /* pieces a transport could not fence yet: torn down at this time */
    bool done;                  /* guarded by e->mu; the caller waits for it */
    pthread_cond_t cv;
    struct xfer_batch *next;    /* e->submitted (under e->mu) */
    struct xfer_batch *aprev, *anext; /* e->active (I/O thread only) */
};

struct xfer_local {
    uint32_t segment_id;
    uint8_t *base;
    uint64_t size;
};

struct kvp_xfer_engine {
    struct kvp_xfer_params p;
    int ep;                     /* epoll */
    int wake_fd;                /* eventfd: new submissions or stop */
    pthread_t io_thread;
    pthread_mutex_t mu;         /* guards: submitted, stopping, peers, users, batch->done */
    pthread_cond_t users_cv;
    struct xfer_batch *submitted_head, *submitted_tail;
    bool stopping;
    unsigned users;             /* callers inside kvp_xfer_run */
    struct xfer_peer *peers;
    uint64_t next_req_id;       /* atomic */

    /* I/O thread only */
    struct xfer_batch *active;
    struct xfer_peer *io_peers;
    uint8_t *scratch;
    uint8_t spec_hdr[XFER_MAX_IOV][KVP_FRAME_HEADER_BYTES]; /* headers of speculative reads (conn_recv) */
    struct xfer_list held;      /* pieces held by fault rules */

    /* counters (relaxed atomics) */
    uint64_t st_batches, st_slices, st_timeouts, st_fenced, st_fence_failed, st_stray;
    uint64_t st_spec, st_pushback;

    /* local transport */
    pthread_rwlock_t local_lock;
    struct xfer_local *locals;
    size_t n_locals, cap_locals;

    /* More I/O threads (params.io_threads > 1): sibling engines, each a complete engine with its
     * own I/O thread, connections and batches, created and destroyed with this one. A batch runs
     * whole on one of {this, siblings}: the one with the fewest batches running (`running`). Local
     * registrations are made on all of them. */
    struct kvp_xfer_engine *sib[XFER_MAX_IO_THREADS - 1];
    unsigned n_sib;
    unsigned running;           /* kvp_xfer_run calls on this engine (relaxed atomic) */
};

/* Counters of struct kvp_xfer_engine: relaxed atomic adds (read by kvp_xfer_stats). */
#define STAT_ADD(e, f, n) __atomic_add_fetch(&(e)->f, (uint64_t)(n), __ATOMIC_RELAXED)

/* xfer_local.c: the local transport (registered segments copied with memcpy; caller holds
 * e->local_lock for reading around both calls). */
const struct xfer_local *xfer_local_find(const struct kvp_xfer_engine *e, uint32_t id);
void xfer_local_copy(struct kvp_xfer_engine *e, struct kvp_xfer_slice *s, uint64_t start_ns, uint32_t timeout_ms);

/* xfer_net.c */
int xfer_set_nonblock(int fd);
int xfer_connect_start(const struct sockaddr_storage *addr, unsigned len, int *fd_out);

#endif
