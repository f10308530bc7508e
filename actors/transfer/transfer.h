/*
 * transfer.h — the transfer engine: batches of slices over one interface, with `tcp` and
 * `local` (memcpy, same process) transports now and `rdma` later.
 *
 * A slice is {local address, remote segment, remote offset, length, READ|WRITE}. Each slice
 * ends in exactly one terminal state: completed (status KVP_OK), failed (KVP_ERR_TRANSFER or
 * the segment's error code), or fenced (KVP_ERR_TIMEOUT / KVP_ERR_CANCELLED: the transport has
 * proof it can no longer touch the local memory).
 *
 * kvp_xfer_run() returns only when every slice of the batch is terminal: when it returns, the
 * engine never reads or writes any slice's local memory again (contract C2).
 */
#ifndef KVP_XFER_TRANSFER_H
#define KVP_XFER_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

struct kvp_xport_ops;
struct kvp_dt_wallet;
struct kvp_xfer_engine;

enum kvp_xfer_op { KVP_XFER_READ = 1, KVP_XFER_WRITE = 2 };

struct kvp_xfer_slice {
    void *local;             /* caller memory: destination of READ, source of WRITE */
    uint64_t length;         /* bytes, >= 1 */
    uint32_t segment_id;     /* the remote segment (checked by the segment server) */
    const char *endpoint;    /* segment data-plane address "host:port", "[v6%scope]:port", "name:port" */
    uint64_t remote_offset;  /* byte offset inside the segment */
    uint8_t op;              /* enum kvp_xfer_op */
    int status;              /* out: terminal status */
};

struct kvp_xfer_params {
    uint32_t conns_per_peer;   /* TCP connections per endpoint (default 4) */
    uint64_t slice_bytes;      /* engine splits larger slices into pieces of this size (default 1 MiB) */
    uint32_t connect_timeout_ms; /* default 1000 */
    uint32_t fence_bound_ms;   /* how long a timed-out batch waits for a transport that cannot fence
                                  at once (wedged) before it is torn down: default 2000
                                  (docs/fencing.md) */
    uint32_t io_threads;       /* tcp transfer actors (default 1, at most 8), each a thread that
                                  owns its own connections (conns_per_peer per endpoint each); a
                                  call's remote slices go to one that no call uses now if there is
                                  one, else to the calling thread's own (thread id modulo
                                  io_threads), so the socket copies of concurrent calls run on
                                  several cores. Without batch_host it also hosts the batch actors
                                  of the calls sent to it */
    /* Tests (contract C2): when not NULL, runs on the batch actor's host thread (a tcp transfer
     * actor, or batch_host) in each batch actor's fini, after every slice of the call is terminal and before the call is answered. */
    void (*on_batch_fini)(const struct kvp_xfer_slice *slices, size_t n, void *arg);
    void *on_batch_fini_arg;
    /* The transport of the network transfer actors (transport.h): NULL = tcp. transport_opts goes
     * to it as kvp_xport_params.wrap_opts (rdma: struct kvp_xport_rdma_opts, rdma/xport_rdma.h).
     * The C2 suite runs on the rdma transport over the verbs double this way (issue 20). */
    const struct kvp_xport_ops *transport;
    const void *transport_opts;
    /* A peer moved to TCP (its connect answered KVP_ERR_UNSUPPORTED) tries `transport` again
     * this long after (ms), at its next batch: a segment that gains RDMA (its device appears, it
     * restarts with protocol=rdma) is used over RDMA again. 0: 30000; UINT32_MAX: never. */
    uint32_t rdma_reprobe_ms;
    /* Data-plane tokens (docs/security.md "Data plane: tokens"), one of two ways:
     *  - token_wallet (the client and the mover): a wallet holding the process's ephemeral key
     *    pair. Each network transfer actor signs the segments' challenges from its own copy of it
     *    (kvp_dt_wallet_copy_key at engine start; no lock, no wait in its poll), filled by
     *    kvp_xfer_tokens_put. Only its key is read, at kvp_xfer_engine_new: the caller keeps it
     *    and frees it after the engine;
     *  - token_respond / token_ctx (tests, a caller with a wallet of its own): given to the
     *    transport of every network transfer actor (kvp_xport_params.token_respond), so called
     *    from several actors' threads at once: token_ctx must serialise itself. Not used when
     *    token_wallet is set.
     * Both NULL: no token (auth none). */
    const struct kvp_dt_wallet *token_wallet;
    int (*token_respond)(void *ctx, const uint8_t *challenge, size_t len, uint8_t *out, size_t cap);
    void *token_ctx;
    /* The actor that hosts the batch actors (DESIGN.md "Actors": the client actor), or NULL: the
     * tcp transfer actors host them (a segment's mover, the engine's own tests). When set, every
     * kvp_xfer_run is one request to this actor, whose handler must pass each message of type
     * KVP_XFER_HOST_MSG_FIRST..LAST to kvp_xfer_host_handle; its batch actor sends each transfer
     * actor it needs one XA_WORK request (the tcp actor it picks, and xfer-local for segments
     * registered here) and answers the caller once every one of them reported every slice
     * terminal. The engine holds a reference; the actor must stop only after the engine was
     * destroyed. on_batch_fini then runs on this actor's thread. kvp_xfer_run must then never be
     * called from that actor's own thread (it would wait for itself). */
    struct kvp_rt_actor *batch_host;
};

/** Most tokens one kvp_xfer_tokens_put takes (the masters' limit per DataToken request). */
#define KVP_XFER_TOKENS_MAX 64

/**
 * Give n data-plane tokens (tokens[i], lens[i] bytes, as a DataToken answer carries them) to
 * every network transfer actor of an engine made with params.token_wallet: one one-way message
 * per actor, which puts them in that actor's wallet (a token for a segment replaces the one held
 * unless that one expires later; one the wallet refuses is logged there).
 *
 * Ordering: messages to one actor are handled in the order they entered its mailbox
 * (docs/runtime.md "Messages"), so a kvp_xfer_run that starts after this returned — on this
 * thread, or on one that learnt of the push through a release/acquire pair or a message — is
 * handled after the tokens are in its home actor's wallet, and its connections answer the
 * segments' challenges with them. A transfer actor without a token for a segment answers that
 * segment's challenge as a wallet without one does: the connection is refused.
 *
 * KVP_OK when every actor was sent the tokens. Errors: KVP_ERR_INVALID (no token_wallet, n 0 or
 * over KVP_XFER_TOKENS_MAX, a NULL token or a length over KVP_DT_TOKEN_MAX), KVP_ERR_NOMEM,
 * KVP_ERR_CLOSED (the engine is stopping); after an error some actors may lack the tokens. Any
 * thread that is not one of the engine's actors.
 */
int kvp_xfer_tokens_put(struct kvp_xfer_engine *e, const uint8_t *const *tokens, const size_t *lens, size_t n);

/* Engine counters (monotonic since the engine started). */
struct kvp_xfer_stats {
    uint64_t batches;       /* kvp_xfer_run calls with at least one slice */
    uint64_t slices;        /* slices run */
    uint64_t timeouts;      /* batches that hit their timeout */
    uint64_t fenced;        /* pieces fenced (timeout or close) before they completed */
    uint64_t fence_failed;  /* pieces a transport could not fence within fence_bound_ms */
    uint64_t stray_bytes;   /* bytes that arrived for fenced READs and were drained into scratch */
    uint64_t spec_pieces;   /* READ payloads received by a readv that began before their header */
    uint64_t pushbacks;     /* error answers found behind a speculative readv (bytes parsed again) */
    uint64_t tcp_fallback_peers; /* peers the transport (rdma) could not reach, moved to TCP */
    uint64_t rdma_reprobes;      /* of them, tries of the transport again (rdma_reprobe_ms) */
    uint64_t rdma_returned_peers;/* tries that succeeded: the peer is back on the transport */
};

struct kvp_xfer_engine;

/** Copy the engine's counters (summed over its transfer actors, asked by message). Any thread
 *  that is not one of the engine's actors. */
void kvp_xfer_stats(struct kvp_xfer_engine *e, struct kvp_xfer_stats *out);

/**
 * Stop accepting batches and fence every batch in flight with KVP_ERR_CLOSED, without freeing the
 * engine (kvp_client_close uses it so calls in flight return at once; destroy still follows).
 */
void kvp_xfer_engine_stop(struct kvp_xfer_engine *e);

struct kvp_xfer_engine;

/** Start the engine (its transfer actors). Errors: KVP_ERR_NOMEM, KVP_ERR_IO. */
int kvp_xfer_engine_new(struct kvp_xfer_engine **out, const struct kvp_xfer_params *p);

/**
 * Stop: fences every batch in flight (their kvp_xfer_run calls return KVP_ERR_CLOSED per slice),
 * stops the transfer actors (their transports close every connection), frees. Accepts NULL; sets
 * *e to NULL.
 */
void kvp_xfer_engine_destroy(struct kvp_xfer_engine **e);

/**
 * Declare that segment_id's memory is [base, base+size) in this process: slices to it use the
 * local (memcpy) transport. unregister waits until no slice uses it. Both are requests to the
 * engine's transfer actors: call them from a thread that is not one of those actors.
 */
int kvp_xfer_register_local(struct kvp_xfer_engine *e, uint32_t segment_id, void *base, uint64_t size);

/**
 * Register caller memory [base, base+len) with every network transfer actor's transport (rdma:
 * memory regions, so transfers from/to it skip the bounce pool; tcp: nothing, KVP_OK), as
 * kvp_register_buffer does. Blocking call to each actor. Unregister before the memory is freed.
 * Errors: the transport's (a failure unregisters what the other actors registered),
 * KVP_ERR_INVALID (NULL, len 0).
 */
int kvp_xfer_mem_register(struct kvp_xfer_engine *e, void *base, uint64_t len);
/** Undo kvp_xfer_mem_register (the transport's errors; KVP_ERR_INVALID). */
int kvp_xfer_mem_unregister(struct kvp_xfer_engine *e, void *base, uint64_t len);
int kvp_xfer_unregister_local(struct kvp_xfer_engine *e, uint32_t segment_id);

/**
 * Run a batch of n slices, in parallel over the engine's connections, and block the calling
 * thread until every slice is terminal. On timeout_ms (> 0) the outstanding slices are fenced
 * and get KVP_ERR_TIMEOUT. Thread-safe: many threads may run batches at once.
 * Returns KVP_OK when every slice completed, else the first error code seen (the per-slice
 * status is authoritative). Errors before running: KVP_ERR_INVALID (a slice with NULL local,
 * length 0, bad op or offset overflow: nothing runs; such slices get KVP_ERR_INVALID, the others
 * KVP_ERR_CANCELLED), KVP_ERR_CLOSED. A slice whose endpoint does not parse or resolve gets
 * KVP_ERR_INVALID while the other slices run. timeout_ms 0 = no timeout.
 * WRITE requests carry the write deadline now + timeout_ms (wall clock): the segment server lands
 * no byte after it. A slice the transport could not fence within fence_bound_ms after the
 * timeout gets KVP_ERR_FENCE_FAILED, and only once that transport was torn down (closed), so
 * even then nothing touches the slice's memory after this returns.
 */
int kvp_xfer_run(struct kvp_xfer_engine *e, struct kvp_xfer_slice *slices, size_t n, uint32_t timeout_ms);

/**
 * kvp_xfer_run, and `overlap(arg)` (if not NULL) runs once in the calling thread after the batch
 * was sent to its transfer actor, while the transfer runs, before the call waits for the batch:
 * the caller's CPU work overlaps the transfer (the put computes its checksums there). It is not
 * called when the batch is refused before running (KVP_ERR_INVALID, KVP_ERR_CLOSED at the send,
 * out of memory). It must not touch the memory of READ slices (not complete yet).
 */
int kvp_xfer_run_overlap(struct kvp_xfer_engine *e, struct kvp_xfer_slice *slices, size_t n,
                         uint32_t timeout_ms, void (*overlap)(void *arg), void *arg);

/* ------------------------------------------------------------------ hosted batch actors */

struct kvp_rt_ctx;
struct kvp_rt_msg;
struct kvp_xfer_host;

/* The messages a batch host (kvp_xfer_params.batch_host) passes to kvp_xfer_host_handle. */
#define KVP_XFER_HOST_MSG_FIRST 0x5800u
#define KVP_XFER_HOST_MSG_LAST 0x580fu

/**
 * Handle a message of type KVP_XFER_HOST_MSG_FIRST..LAST sent to the batch host (its own thread,
 * from its handler): the calls (each spawns a hosted batch actor in the host), the engine's stop
 * (fences every batch hosted here with KVP_ERR_CLOSED, answered once none is left), the locally
 * registered segments (routing), stats. *h is the host's batch state, made on first use (NULL
 * before); free it with kvp_xfer_host_free in the host's fini. Returns KVP_OK.
 */
int kvp_xfer_host_handle(struct kvp_rt_ctx *ctx, struct kvp_xfer_host **h, struct kvp_rt_msg *m);

/**
 * Make a host's batch state now (else kvp_xfer_host_handle makes it on first use), with a hook
 * that runs on the host's thread in every batch actor's fini, after every slice is terminal and
 * before the caller is answered: the host's own bookkeeping of a finished call (the client notes
 * its read witnesses there), folded into the batch rather than sent as one more message. on_done
 * may be NULL. Errors: KVP_ERR_NOMEM, KVP_ERR_INVALID (out NULL).
 */
int kvp_xfer_host_new(struct kvp_xfer_host **out,
                      void (*on_done)(void *arg, const struct kvp_xfer_slice *slices, size_t n), void *arg);

/** Free a host's batch state (its fini: no batch is left then). Accepts NULL; sets *h NULL. */
void kvp_xfer_host_free(struct kvp_xfer_host **h);

/**
 * Probe a segment's data plane (PING/PONG) within timeout_ms (0 = 1000). KVP_OK when it answers
 * for segment_id; KVP_ERR_NOT_FOUND when a server answers there but for another id (restarted or
 * remounted segment); KVP_ERR_TIMEOUT / KVP_ERR_TRANSFER otherwise. Blocks the caller; any thread.
 * Used by the master's lost-segment probe.
 */
int kvp_xfer_probe(const char *endpoint, uint32_t segment_id, uint32_t timeout_ms);

/**
 * Resolve "host:port" / "[v6]:port" / "[fe80::1%eth0]:port" / "name:port" into a sockaddr.
 * Errors: KVP_ERR_INVALID.
 */
struct sockaddr_storage;
int kvp_xfer_resolve(const char *endpoint, struct sockaddr_storage *out, unsigned *out_len);

#endif
