/*
 * actor.h — the kvpool actor runtime (kvp_rt_*), built on czmq.
 *
 * An actor is a private state plus a handler that receives typed messages one at a time on
 * one thread. Three kinds share one handle type, struct kvp_rt_actor:
 *
 *  - threaded actor (kvp_rt_spawn): its own thread running a loop over its mailbox (an eventfd,
 *    also used for the owner's close/stop commands), its timers and any sockets/fds it watches;
 *  - manual actor (kvp_rt_spawn_manual): no thread; kvp_rt_poll() runs it on the caller's thread
 *    (tests, the harness in tests/lib/, or an embedding event loop);
 *  - sink (kvp_rt_sink_new): a mailbox without a handler; a thread takes messages with
 *    kvp_rt_recv(). Used by non-actor threads to receive replies and by tests to capture output.
 *
 * Hosted actors (kvp_rt_hosted_spawn) are lightweight actors that live inside an actor's loop:
 * a handler + a state pointer + an id (`hid`), no thread, created in about a microsecond. They
 * are addressed as (actor, hid); hid 0 is the actor itself.
 *
 * Lifecycle (STYLE.md): spawn (synchronous ready handshake: init ran on the actor's thread
 * before kvp_rt_spawn returns) → run → kvp_rt_close (idempotent; mailbox refuses new messages;
 * every request pending in or from the actor completes with KVP_ERR_CLOSED) → kvp_rt_stop
 * (the thread ends after the hosted actors' and the actor's fini ran on it) → kvp_rt_destroy
 * (drops the owner's reference; memory goes with the last reference).
 *
 * Messages. A message is a u32 `type` (the application's KVP_MSG_* / own enum), a u64 `arg`
 * copied by value and an optional `payload` pointer whose ownership moves with the message:
 * a send that succeeds takes it (the caller's pointer is set to NULL); a send that fails leaves
 * it with the caller. The runtime frees the payload with the message's free function (NULL
 * means free()) after the handler returns, unless the handler took it (kvp_rt_msg_take()).
 * Messages from one sender thread to one actor arrive in the order they were sent.
 *
 * Requests. kvp_rt_request() sends a request with a correlation id and a deadline; exactly one
 * reply message (kind KVP_RT_REPLY, same corr_id) comes back to the requester: the replier's,
 * or a synthetic one with status KVP_ERR_TIMEOUT when the deadline passes first, or
 * KVP_ERR_CLOSED when the target (or the requester itself) closes first. A late reply after a
 * timeout is dropped (its payload freed). A receiver answers with kvp_rt_reply(), now or later
 * (keep msg->corr_id, the reply token); an unanswered request is answered KVP_ERR_CLOSED when the
 * receiver closes, never lost.
 *
 * Supervision. A handler that returns a negative kvp_err fails its actor: the actor closes
 * itself (as kvp_rt_close) and its parent receives a KVP_RT_FAILED message whose payload is a
 * struct kvp_rt_failure. A threaded actor without a parent logs at ERROR, and kvp_rt_stop()
 * returns the error. A failing hosted actor is finished and reported to its host (hid 0) or to
 * the hosted actor that spawned it.
 *
 * Time comes from runtime/clock.h (tests may install a fake clock; kvp_rt_wake() makes a
 * threaded actor re-read it). Timer and deadline arguments are milliseconds.
 *
 * Threads: functions taking a `struct kvp_rt_ctx *` are called only from inside that actor's
 * callbacks (init, handle, fini, watch callbacks), on its thread. kvp_rt_send*, kvp_rt_call,
 * kvp_rt_wake, kvp_rt_ref/unref, kvp_rt_name and kvp_rt_recv may be called from any thread.
 * kvp_rt_close/stop/destroy/poll are called by the actor's owner (the thread that spawned it,
 * or one that took over), never from the actor's own callbacks.
 * A sender must hold a reference to the actor it sends to (the owner's, or kvp_rt_ref()).
 */
#ifndef KVP_RUNTIME_ACTOR_H
#define KVP_RUNTIME_ACTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvp_rt_actor;
struct kvp_rt_ctx;

/** Frees a message payload. NULL in any API below means free(). */
typedef void (*kvp_rt_free_fn)(void *payload);

/** What a message is; msg->kind. */
enum kvp_rt_kind {
    KVP_RT_SEND = 0,    /* one-way message (kvp_rt_send) */
    KVP_RT_REQUEST = 1, /* expects kvp_rt_reply(ctx, msg->corr_id, ...) */
    KVP_RT_REPLY = 2,   /* completes a kvp_rt_request: msg->status, msg->corr_id */
    KVP_RT_TIMER = 3,   /* a timer fired: msg->type as given, msg->corr_id = timer id */
    KVP_RT_FAILED = 4,  /* a child failed: payload is a struct kvp_rt_failure */
};

/** Return value of a handler (besides KVP_OK and negative errors): a hosted actor is done. */
#define KVP_RT_DONE 1

/** Longest actor name kept (bytes, without NUL); longer names are truncated. */
#define KVP_RT_NAME_MAX 31

/** A delivered message. Fields are read-only for handlers except through kvp_rt_msg_take(). */
struct kvp_rt_msg {
    uint8_t kind;           /* enum kvp_rt_kind */
    uint32_t type;          /* application message type (a reply carries the request's type) */
    int32_t status;         /* REPLY: KVP_OK or a kvp_err (TIMEOUT, CLOSED, or the replier's) */
    uint64_t arg;           /* small argument, by value */
    uint64_t corr_id;       /* REQUEST: reply token; REPLY: id from kvp_rt_request; TIMER: timer id */
    void *payload;          /* owned by the message; NULL if none */
    kvp_rt_free_fn free_fn; /* frees payload; NULL = free() */
    /* private to the runtime */
    struct kvp_rt_msg *next;
    struct kvp_rt_actor *from; /* REQUEST: the requester (a reference is held) */
    uint64_t from_hid;         /* REQUEST: requester's hosted id */
    uint64_t from_corr;        /* REQUEST: requester's correlation id */
    uint64_t to_hid;           /* destination hosted id, 0 = the actor itself */
};

/** Payload of a KVP_RT_FAILED message. */
struct kvp_rt_failure {
    uint64_t hid;                      /* failed hosted actor's id; 0 for a threaded/manual child */
    struct kvp_rt_actor *child;        /* failed threaded/manual child (the parent owns it), or NULL */
    int err;                           /* the negative kvp_err its handler returned */
    char name[KVP_RT_NAME_MAX + 1];    /* the child's name */
};

/** How to build an actor. Copied by kvp_rt_spawn*; the name is copied. */
struct kvp_rt_spec {
    const char *name; /* for logs; NULL = "actor" */
    /**
     * Runs on the actor's thread before spawn returns; may set state, start timers, watch
     * sockets, spawn hosted actors. A negative return fails the spawn with that error; fini
     * still runs (so init may leave partly built state for fini to release).
     */
    int (*init)(struct kvp_rt_ctx *ctx);
    /**
     * Handles one message (never NULL except for sinks). The message and its payload stay
     * the runtime's; take the payload with kvp_rt_msg_take(). Returns KVP_OK, or a negative
     * kvp_err to fail the actor (supervision).
     */
    int (*handle)(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg);
    /**
     * Releases the state (may be NULL). Runs exactly once: on the actor's thread at stop, or,
     * when kvp_rt_spawn* fails, before it returns (see there) — also when the failure came
     * before init could run, so fini must accept the state exactly as the spawner built it.
     */
    void (*fini)(struct kvp_rt_ctx *ctx);
    void *state; /* initial state pointer, returned by kvp_rt_state() */
};

/** A hosted actor: handler + state, living in the host's loop. Copied by kvp_rt_hosted_spawn. */
struct kvp_rt_hosted_spec {
    const char *name;
    /** As kvp_rt_spec.handle; may also return KVP_RT_DONE to finish this hosted actor. */
    int (*handle)(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg);
    /** Releases the hosted state once, when it finishes or its host stops (may be NULL). */
    void (*fini)(struct kvp_rt_ctx *ctx);
};

/* ------------------------------------------------------------------ creation and lifecycle */

/**
 * Spawn a threaded actor. Blocks until init has run on the new thread. `parent` (may be
 * NULL) receives KVP_RT_FAILED if this actor fails; the runtime holds a reference to it.
 * On success *out is the owner's handle (release with kvp_rt_destroy).
 *
 * Ownership, one rule: from the call on, the runtime owns spec->state. Whatever fails,
 * spec->fini (when set) has run exactly once before the error returns, and the caller must not
 * touch the state again: on the actor's thread when init failed, on the caller's thread (with
 * the actor already closed, init never run) when the spawn failed before that. Only spec ==
 * NULL leaves nothing to release.
 * Errors: KVP_ERR_INVALID (spec/out/handle NULL), KVP_ERR_NOMEM, KVP_ERR_IO (no eventfd or
 * thread), or init's negative return (the thread is then already gone).
 */
int kvp_rt_spawn(struct kvp_rt_actor **out, const struct kvp_rt_spec *spec,
                 struct kvp_rt_actor *parent);

/** As kvp_rt_spawn (the same ownership rule), but no thread: init runs now on the caller;
 * kvp_rt_poll() runs it. */
int kvp_rt_spawn_manual(struct kvp_rt_actor **out, const struct kvp_rt_spec *spec,
                        struct kvp_rt_actor *parent);

/** A sink: a mailbox with no handler, read with kvp_rt_recv(). Errors: INVALID, NOMEM. */
int kvp_rt_sink_new(struct kvp_rt_actor **out, const char *name);

/**
 * Close (idempotent, blocks until done): new sends fail with KVP_ERR_CLOSED; queued and
 * unanswered requests to it are answered KVP_ERR_CLOSED; its own pending requests complete
 * with KVP_ERR_CLOSED (the handler sees those replies); queued one-way messages are freed;
 * timers are cancelled. For a sink, queued messages are freed.
 */
void kvp_rt_close(struct kvp_rt_actor *a);

/**
 * Stop: close, then end the thread after hosted finis and the actor's fini ran (for a manual
 * actor: on the caller's thread). Idempotent. Returns the first error that failed the actor
 * (its handler's or init's), else KVP_OK.
 */
int kvp_rt_stop(struct kvp_rt_actor *a);

/** Stop if needed and drop the owner's reference. Accepts NULL and *ap == NULL; sets NULL. */
void kvp_rt_destroy(struct kvp_rt_actor **ap);

/** Take / drop a reference (any thread). The memory is freed with the last reference. */
struct kvp_rt_actor *kvp_rt_ref(struct kvp_rt_actor *a);
void kvp_rt_unref(struct kvp_rt_actor **ap);

/** The actor's name (valid while a reference is held). */
const char *kvp_rt_name(const struct kvp_rt_actor *a);

/**
 * Manual actors: run every queued message and every due timer on the calling thread, until
 * the mailbox is empty (an actor that always sends itself another message keeps it running).
 * Returns the number of messages and timers handled, KVP_ERR_CLOSED once closed, KVP_ERR_INVALID
 * if `a` is not a manual actor.
 */
int kvp_rt_poll(struct kvp_rt_actor *a);

/** Make a threaded actor re-read the clock and run due timers (after a fake clock moved). */
void kvp_rt_wake(struct kvp_rt_actor *a);

/* ------------------------------------------------------------------ messages (any thread) */

/**
 * Send a one-way message to `to` (hid 0) or to hosted actor `hid` inside it. `payload` may
 * be NULL (no payload) or point to the payload pointer, which is taken (set NULL) on success.
 * Errors: KVP_ERR_INVALID, KVP_ERR_NOMEM, KVP_ERR_CLOSED (payload still the caller's).
 * Never blocks (mailboxes are unbounded; flow control is the application's).
 */
int kvp_rt_send(struct kvp_rt_actor *to, uint64_t hid, uint32_t type, uint64_t arg,
                void **payload, kvp_rt_free_fn free_fn);

/**
 * Blocking request from a thread that is not an actor: send a request and wait up to
 * timeout_ms of real time (0 = wait forever) for its reply. On KVP_OK *reply is the reply
 * message (free with kvp_rt_msg_destroy); (*reply)->status is the replier's status, or
 * KVP_ERR_CLOSED if the target closed before answering. Errors (no reply): KVP_ERR_TIMEOUT,
 * KVP_ERR_CLOSED (target already closed; payload still the caller's), KVP_ERR_INVALID,
 * KVP_ERR_NOMEM. Must not be called from an actor's callback (it would block the actor).
 */
int kvp_rt_call(struct kvp_rt_actor *to, uint64_t hid, uint32_t type, uint64_t arg,
                void **payload, kvp_rt_free_fn free_fn, uint32_t timeout_ms,
                struct kvp_rt_msg **reply);

/**
 * Asynchronous request from a non-actor thread: the reply (kind KVP_RT_REPLY, corr_id ==
 * `corr_id`, chosen by the caller) will be pushed into `sink` (see kvp_rt_sink_new); there is
 * no deadline: the caller waits with kvp_rt_recv's timeout. If the target closes first, the
 * reply has status KVP_ERR_CLOSED. Payload rules as kvp_rt_send.
 * Errors: KVP_ERR_INVALID (sink not a sink), KVP_ERR_NOMEM, KVP_ERR_CLOSED (target closed).
 */
int kvp_rt_request_from(struct kvp_rt_actor *sink, struct kvp_rt_actor *to, uint64_t hid,
                        uint32_t type, uint64_t arg, void **payload, kvp_rt_free_fn free_fn,
                        uint64_t corr_id);

/**
 * Sinks: take the oldest message, waiting up to timeout_ms (0 = do not wait, UINT32_MAX =
 * forever). On KVP_OK *msg is the caller's (kvp_rt_msg_destroy). Errors: KVP_ERR_TIMEOUT
 * (nothing arrived), KVP_ERR_CLOSED, KVP_ERR_INVALID (not a sink).
 */
int kvp_rt_recv(struct kvp_rt_actor *sink, uint32_t timeout_ms, struct kvp_rt_msg **msg);

/** Number of messages queued in a mailbox (a snapshot; tests and metrics). */
size_t kvp_rt_queued(struct kvp_rt_actor *a);

/** Take the payload out of a message: returns it and sets msg->payload to NULL. */
void *kvp_rt_msg_take(struct kvp_rt_msg *msg);

/**
 * Free a message the caller owns (from kvp_rt_recv/kvp_rt_call) and its payload. An
 * unanswered KVP_RT_REQUEST is answered KVP_ERR_CLOSED first. Accepts NULL; sets *msgp NULL.
 */
void kvp_rt_msg_destroy(struct kvp_rt_msg **msgp);

/**
 * Answer a KVP_RT_REQUEST message that a sink received (tests playing a peer, non-actor
 * threads), then free it: *reqp is set to NULL whatever the result. Payload rules as
 * kvp_rt_send. Errors: KVP_ERR_INVALID (not a request), KVP_ERR_CLOSED (requester gone).
 */
int kvp_rt_msg_reply(struct kvp_rt_msg **reqp, int status, uint64_t arg, void **payload,
                     kvp_rt_free_fn free_fn);

/* ------------------------------------------------------------------ inside an actor */

/** The actor this callback runs in. */
struct kvp_rt_actor *kvp_rt_self(struct kvp_rt_ctx *ctx);
/** The hosted actor this callback runs for, 0 for the actor itself. */
uint64_t kvp_rt_self_hid(struct kvp_rt_ctx *ctx);
/** State of the actor (or of the hosted actor the callback runs for). */
void *kvp_rt_state(struct kvp_rt_ctx *ctx);
void kvp_rt_set_state(struct kvp_rt_ctx *ctx, void *state);
/** Name of the actor or hosted actor, for log lines. */
const char *kvp_rt_ctx_name(struct kvp_rt_ctx *ctx);

/**
 * Send a request; the reply (or TIMEOUT/CLOSED) comes back to this actor/hosted actor as a
 * KVP_RT_REPLY message with msg->corr_id == *corr_id. timeout_ms is the deadline from now
 * (0 = no deadline). Payload rules as kvp_rt_send. On error no reply will ever come.
 * Errors: KVP_ERR_INVALID, KVP_ERR_NOMEM, KVP_ERR_CLOSED (target or self closed).
 */
int kvp_rt_request(struct kvp_rt_ctx *ctx, struct kvp_rt_actor *to, uint64_t hid, uint32_t type,
                   uint64_t arg, void **payload, kvp_rt_free_fn free_fn, uint32_t timeout_ms,
                   uint64_t *corr_id);

/**
 * Answer the request whose token is `token` (msg->corr_id of the KVP_RT_REQUEST), now or in
 * a later callback. `status` is a kvp_err for the requester. Payload rules as kvp_rt_send.
 * Errors: KVP_ERR_NOT_FOUND (unknown or already answered token), KVP_ERR_CLOSED (the requester
 * is closed, e.g. a kvp_rt_call that timed out: the token is consumed, the payload is still the
 * caller's), KVP_ERR_NOMEM. A requester whose deadline already passed is still open: the reply
 * is accepted (KVP_OK) and dropped on arrival, its payload freed there.
 */
int kvp_rt_reply(struct kvp_rt_ctx *ctx, uint64_t token, int status, uint64_t arg,
                 void **payload, kvp_rt_free_fn free_fn);

/**
 * Start a timer for this actor/hosted actor: a KVP_RT_TIMER message of `type` arrives after
 * delay_ms, then every interval_ms if interval_ms > 0. *timer_id (may be NULL) names it.
 * Errors: KVP_ERR_NOMEM, KVP_ERR_CLOSED.
 */
int kvp_rt_timer_start(struct kvp_rt_ctx *ctx, uint32_t delay_ms, uint32_t interval_ms,
                       uint32_t type, uint64_t *timer_id);
/** Cancel a timer; it will not fire again. Errors: KVP_ERR_NOT_FOUND. */
int kvp_rt_timer_cancel(struct kvp_rt_ctx *ctx, uint64_t timer_id);

/**
 * Spawn a hosted actor in this actor's loop, with `state` as its state. Its parent (for
 * supervision) is the caller (the host or a hosted actor). *hid names it. No thread; O(1).
 * Errors: KVP_ERR_INVALID, KVP_ERR_NOMEM, KVP_ERR_CLOSED.
 */
int kvp_rt_hosted_spawn(struct kvp_rt_ctx *ctx, const struct kvp_rt_hosted_spec *spec,
                        void *state, uint64_t *hid);
/**
 * As kvp_rt_hosted_spawn, then run `start` at once, on this thread, as the new hosted actor (its
 * ctx: the timers, requests and replies it makes are its own), so a hosted actor can begin its
 * work without a message to itself. `start` returns as a handler does: KVP_OK, KVP_RT_DONE (the
 * hosted actor is finished at once: fini runs; this returns KVP_OK) or a negative kvp_err (fini
 * runs; this returns that error, no failure report). *hid is set before `start` runs.
 * Errors: as kvp_rt_hosted_spawn (then `start` did not run), or start's error.
 */
int kvp_rt_hosted_spawn_run(struct kvp_rt_ctx *ctx, const struct kvp_rt_hosted_spec *spec, void *state,
                            int (*start)(struct kvp_rt_ctx *ctx), uint64_t *hid);
/**
 * Finish hosted actor `hid` now: unanswered requests to it are answered KVP_ERR_CLOSED, its
 * timers are cancelled, replies still due to it will be dropped, its fini runs. Must not be
 * called for the hosted actor whose handler is running (return KVP_RT_DONE instead).
 * Errors: KVP_ERR_NOT_FOUND, KVP_ERR_BUSY (it is the running one).
 */
int kvp_rt_hosted_finish(struct kvp_rt_ctx *ctx, uint64_t hid);
/** Number of live hosted actors in this actor. */
size_t kvp_rt_hosted_count(struct kvp_rt_ctx *ctx);

/**
 * Watch a socket for input: `sock` is a czmq zsock_t or zactor_t, or a libzmq socket. fn runs on
 * the actor's thread (with handle == sock) whenever it is readable; it should read what is there
 * without blocking; a negative return fails the actor. The socket stays the caller's; it must
 * outlive the watch (unwatch, or close/stop, which drop every watch). Threaded actors only.
 * Errors: KVP_ERR_INVALID (manual actor or sink, NULL argument), KVP_ERR_EXISTS (already
 * watched), KVP_ERR_NOMEM, KVP_ERR_CLOSED.
 */
int kvp_rt_watch(struct kvp_rt_ctx *ctx, void *sock,
                 int (*fn)(struct kvp_rt_ctx *ctx, void *handle));
/** As kvp_rt_watch for a file descriptor; fn gets handle pointing to an int holding fd. */
int kvp_rt_watch_fd(struct kvp_rt_ctx *ctx, int fd,
                    int (*fn)(struct kvp_rt_ctx *ctx, void *handle));
/** Stop watching a socket / an fd. Errors: KVP_ERR_NOT_FOUND. */
int kvp_rt_unwatch(struct kvp_rt_ctx *ctx, void *sock);
int kvp_rt_unwatch_fd(struct kvp_rt_ctx *ctx, int fd);

#endif
