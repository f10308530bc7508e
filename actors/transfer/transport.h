/*
 * transport.h — the transport seam: the one ops table through which a transfer actor drives a
 * transport (tcp, local now; rdma next; fault injection as a transport wrapping another).
 * A new transport is a `const struct kvp_xport_ops` and nothing else: the engine (batches,
 * deadlines, the fence bound, counters) never looks inside one.
 *
 * Words (docs/data-plane.md):
 *  - instance: one opened transport (struct kvp_xport). It belongs to exactly ONE transfer actor:
 *    every op below runs on that actor's thread, never concurrently, and none blocks (no sleep, no
 *    blocking socket or verbs call; bounded system calls only). No locks are needed inside one.
 *  - peer: one remote segment server endpoint as this instance reaches it (TCP: conns_per_peer
 *    sockets; RDMA: its QPs, the remote rkey/base learnt in the handshake). Created by connect,
 *    owned by the instance, freed by close (never earlier: the engine may keep the pointer).
 *  - xslice: one unit of posted work, at most kvp_xport_params.slice_bytes long (the engine cuts a
 *    caller's kvp_xfer_slice into xslices). It names caller memory (`local`) that the transport
 *    may read (WRITE) or write (READ) from post until its completion is reaped, and never after.
 *
 * Completion semantics (contract C2 rests on them):
 *  1. Every xslice that post() accepted gets EXACTLY ONE completion, reported by poll(): status
 *     KVP_OK, a failure (KVP_ERR_TRANSFER, or the segment's own error code: KVP_ERR_INVALID,
 *     KVP_ERR_NOT_FOUND, KVP_ERR_TIMEOUT for a WRITE that arrived after its write deadline, ...),
 *     or the status the engine gave to fence()/abort(). Never two, never none — also not at
 *     close(): close reports nothing; the engine has already made every xslice terminal.
 *  2. When poll() hands out the completion of an xslice, the transport has finished with its
 *     `local` memory for good: no byte of it is read or written after that, by the CPU, the
 *     kernel on the transport's behalf, or a NIC (RDMA: its WR's CQE was polled, or its QP was
 *     destroyed / its MR deregistered). This is what lets the engine return to the caller.
 *  3. A READ's completion with KVP_OK means every byte of [local, local+length) holds the
 *     segment's data. A failed READ may have written part of `local` (the caller's memory is
 *     then undefined, never touched again).
 *  4. Order: none promised between xslices, even on one peer.
 *
 * Fence contract (docs/fencing.md): fence(t, ids, n, status) asks that the listed xslices become
 * terminal now. For each id the transport either (a) reports it with `status` — only once it has
 * proof that it can no longer touch `local` (TCP: the request never left, or the response bytes
 * will be drained into scratch memory, or the connection was closed; RDMA: its WR flushed /
 * completed, i.e. fence (a) of design/rdma.md) — or (b) reports its real outcome if that came
 * first, or (c) cannot do either yet (an RDMA QP that does not flush: "wedged"), in which case the
 * report comes later, from poll(). The engine waits at most fence_bound_ms for (c) and then calls
 * abort(). Unknown or already-reported ids are ignored (not an error). fence() may report through
 * poll() only: the engine calls poll() right after fence().
 * abort(t, ids, n) is the fence that cannot wait: when it returns, the transport can no longer
 * touch the listed xslices' memory by any path (TCP: their connections are closed; RDMA: their QPs
 * are destroyed and, if a provider will not flush, the MRs covering `local` are deregistered),
 * and each listed id not yet reported is reported (by the next poll) with KVP_ERR_FENCE_FAILED.
 * Other xslices on the same connections may be failed with KVP_ERR_TRANSFER as collateral.
 *
 * Events: the transfer actor watches every fd of fds() for readability (kvp_rt_watch_fd) and calls
 * poll() when one is readable, after post()/fence()/abort(), and when poll's *next_ns passes. A
 * transport with timed work (connect timeouts, handshake retries, fault delays) says when through
 * *next_ns; it may not rely on being polled at any other time. TCP: one epoll fd over its
 * sockets. RDMA: the CQ's completion channel fd and the connection-setup fd (the out-of-band
 * handshake socket or an rdma_cm event channel); poll() re-arms ibv_req_notify_cq itself.
 *
 * Connection setup: connect() starts it and returns at once; the peer may accept post() before it
 * is up (xslices queue) and failures come back as completions (KVP_ERR_TRANSFER) of the queued
 * xslices, never as an error of a later post(). Out-of-band handshakes (RDMA: exchanging
 * struct kvp_rdma_peer facts — GID, QPN, PSN, MTU — and the remote segment's base and rkey over a
 * TCP side channel to the segment server) are the transport's own business, driven by poll().
 * connect() returning KVP_ERR_UNSUPPORTED means "this transport cannot reach that peer" (no RDMA
 * device, or the segment does not offer it): the engine then uses another transport for it.
 *
 * Memory: mem_register/mem_unregister (optional, NULL when not needed: tcp, local) tell the
 * transport about caller memory before it appears in xslices (kvp_register_buffer; RDMA registers
 * an MR). An xslice whose `local` is in no registered range is still legal: a transport that needs
 * registration registers on the fly or fails it with KVP_ERR_UNSUPPORTED.
 *
 * The local transport (memcpy into a segment registered in this process, kvp_xfer_register_local)
 * is chosen by segment id, not endpoint: its connect() ignores the address and returns one peer per
 * call; its post() copies at once and poll() reports.
 *
 * Wrapping: a transport may wrap another (kvp_xport_params.inner): the fault-injection transport
 * (fault.h) forwards every op to its inner transport and holds, delays, drops, fails or wedges
 * xslices that match a rule, so the fault tests drive any transport without an #ifdef in the
 * engine.
 */
#ifndef KVP_XFER_TRANSPORT_H
#define KVP_XFER_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

struct sockaddr_storage;
struct kvp_xport;
struct kvp_xport_peer;
struct kvp_xport_ops;

/** One unit of posted work. Read by post() (copied: the array may be reused after it returns). */
struct kvp_xport_slice {
    uint64_t id;             /* the engine's, unique among this instance's unreported xslices; echoed */
    uint8_t op;              /* KVP_XFER_READ / KVP_XFER_WRITE (transfer.h) */
    uint8_t *local;          /* caller memory, `length` bytes; see the completion semantics above */
    uint64_t length;         /* bytes, 1 .. params.slice_bytes */
    uint32_t segment_id;     /* the remote segment (the server checks it) */
    uint64_t remote_offset;  /* byte offset inside the segment */
    uint64_t write_deadline_ms; /* WRITE: wall-clock ms (CLOCK_REALTIME) after which the segment
                                   lands no byte (sent in the frame); 0 = none. READ: 0 */
};

/** One completion, reported by poll(). */
struct kvp_xport_completion {
    uint64_t id;             /* the xslice's id */
    int status;              /* KVP_OK or a kvp_err (see the completion semantics) */
};

/** Counters a transport adds to (the engine's kvp_xfer_stats; all monotonic). */
struct kvp_xport_stats {
    uint64_t stray_bytes;    /* bytes received for fenced READs, drained into scratch */
    uint64_t spec_pieces;    /* tcp: READ payloads received by a readv begun before their header */
    uint64_t pushbacks;      /* tcp: error answers found behind a speculative readv */
    uint64_t aborted;        /* xslices reported KVP_ERR_FENCE_FAILED by abort() */
};

/** How to open an instance. Copied by open(); strings are copied. */
struct kvp_xport_params {
    uint32_t conns_per_peer;     /* tcp: sockets per peer (1..64); rdma: QPs per peer */
    uint64_t slice_bytes;        /* largest xslice the engine will post */
    uint32_t connect_timeout_ms; /* connection setup (handshake included) bound */
    const char *name;            /* owner's name for log lines (the transfer actor's), may be NULL */
    /* Wrapping transports only: the transport they wrap (opened by the wrapper with these same
     * params, inner set to NULL) and its options (the fault wrapper takes none: NULL). */
    const struct kvp_xport_ops *inner;
    const void *wrap_opts;
    /* tcp: data-plane tokens (auth/auth_token.h, docs/security.md "Data plane: tokens"). When set,
     * each new connection waits for the segment's challenge (len bytes) and sends what this
     * writes to out (at most cap bytes; returns the length, or a negative kvp_err: the
     * connection fails) before its first request. Called on the owning actor's thread; must not
     * block (kvp_dt_wallet_respond fits; the engine passes its actor's own wallet). rdma: given
     * to its TCP hello channel (xport_rdma.c). NULL: no token (auth none, or the local transport). */
    int (*token_respond)(void *ctx, const uint8_t *challenge, size_t len, uint8_t *out, size_t cap);
    void *token_ctx;
};

/**
 * The ops table. Every op except open runs on the owning transfer actor's thread; none blocks.
 * Return values: KVP_OK or a negative kvp_err (kvpool.h), as documented per op.
 */
struct kvp_xport_ops {
    const char *name; /* "tcp", "local", "rdma", "fault" (wrapper): logs and fault rules */

    /** Create an instance: *out on KVP_OK. Errors: KVP_ERR_NOMEM, KVP_ERR_IO, KVP_ERR_INVALID,
     *  KVP_ERR_UNSUPPORTED (e.g. rdma without a device). May run on the owner's thread before the
     *  actor starts. */
    int (*open)(struct kvp_xport **out, const struct kvp_xport_params *p);

    /** The fds to watch for readability: writes at most max into fds, returns how many (>= 0).
     *  The set is fixed from open to close (a transport multiplexes changing sockets behind one
     *  epoll fd). 0 fds = the transport is driven only by calls and *next_ns (local). */
    int (*fds)(struct kvp_xport *t, int *fds, size_t max);

    /** Start reaching `endpoint` (its resolved address given). *peer is valid until close() and
     *  can be passed to post() at once. Calling it again for the same endpoint is the engine's
     *  mistake (it keeps one peer per endpoint and transport). Errors: KVP_ERR_NOMEM,
     *  KVP_ERR_UNSUPPORTED (cannot reach this peer: use another transport). */
    int (*connect)(struct kvp_xport *t, const char *endpoint, const struct sockaddr_storage *addr,
                   unsigned addr_len, struct kvp_xport_peer **peer);

    /** Post n xslices to peer. On KVP_OK all n are accepted (each will get one completion); on an
     *  error none is (KVP_ERR_NOMEM; KVP_ERR_INVALID for a length above slice_bytes or a bad op).
     *  Never refused for lack of room (send queue, RDMA credits): the transport queues and posts
     *  as room frees, from poll(). The engine spreads xslices over peers; spreading them over a
     *  peer's connections / QPs is the transport's. */
    int (*post)(struct kvp_xport *t, struct kvp_xport_peer *peer, const struct kvp_xport_slice *s,
                size_t n);

    /** Make progress (send, receive, reap CQEs, advance handshakes and timers) without blocking
     *  and report up to max completions into out; returns how many (call again while it returns
     *  max). now_ns: monotonic clock (runtime/clock.h), the engine's. *next_ns: set to the
     *  monotonic time at which poll must run again even without an fd event, or UINT64_MAX. */
    int (*poll)(struct kvp_xport *t, uint64_t now_ns, struct kvp_xport_completion *out, size_t max,
                uint64_t *next_ns);

    /** Fence (see the fence contract): the listed ids become terminal with `status`
     *  (KVP_ERR_TIMEOUT, KVP_ERR_CANCELLED or KVP_ERR_CLOSED) as soon as the transport can prove
     *  their memory is out of its reach. Reports go through poll(). */
    void (*fence)(struct kvp_xport *t, const uint64_t *ids, size_t n, int status);

    /** The fence that cannot wait (fence bound passed): see the fence contract. */
    void (*abort)(struct kvp_xport *t, const uint64_t *ids, size_t n);

    /** Optional (NULL = not needed): caller memory that will appear in xslices. Errors:
     *  KVP_ERR_NOMEM, KVP_ERR_IO (the device refused). unregister: no xslice in flight uses it. */
    int (*mem_register)(struct kvp_xport *t, void *base, uint64_t len);
    int (*mem_unregister)(struct kvp_xport *t, void *base, uint64_t len);

    /** Optional: add this instance's counters to *out. */
    void (*stats)(struct kvp_xport *t, struct kvp_xport_stats *out);

    /** Free the instance: closes every socket / QP / fd, frees every peer. The engine calls it
     *  only when no xslice is unreported (it aborts what is left first), on the owner's thread
     *  (the actor's fini). Accepts NULL. */
    void (*close)(struct kvp_xport *t);
};

/* The transports built in (actors/transfer/xfer_*.c). */
extern const struct kvp_xport_ops kvp_xport_tcp;
extern const struct kvp_xport_ops kvp_xport_local;
/* The fault-injection wrapper (fault.c): params.inner is the wrapped transport. */
extern const struct kvp_xport_ops kvp_xport_fault;

#endif
