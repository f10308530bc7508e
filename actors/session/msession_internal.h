/*
 * msession_internal.h — state of the master session actor (actors/session/msession.c).
 *
 * The session is a runtime actor (runtime/actor.h, a threaded actor named after its owner).
 * Its thread owns everything below: one ZeroMQ DEALER socket per master, the list of calls in
 * flight, the leader and the fail-fast breaker. No lock: callers reach it only by message.
 *
 *  - a caller's kvp_msession_call() is a runtime request (MS_MSG_CALL, payload struct
 *    ms_call_msg) through kvp_rt_call; the caller blocks on its reply. The actor keeps the reply
 *    token in a `struct kvp_ms_call` and answers it once: the leader's Response, or UNAVAILABLE at
 *    the call's deadline, or CLOSED when the session is destroyed (the runtime answers requests
 *    still owed at close).
 *  - replies from the masters arrive on the watched DEALER sockets;
 *  - resends, per-attempt timeouts, call deadlines and fail-fast probes run from one runtime
 *    timer (MS_MSG_TICK), armed for the earliest thing due.
 *
 * req_id layout: (call sequence << 8) | (attempt number & 0xff), so a late reply to an earlier
 * attempt of the same call is still recognised (and accepted when it is a real answer:
 * every request is idempotent).
 */
#ifndef KVP_SESSION_MSESSION_INTERNAL_H
#define KVP_SESSION_MSESSION_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "actors/session/msession.h"

#define KVP_MS_MAX_MASTERS 16
#define KVP_MS_FIRST_ATTEMPT_MS 300u  /* first per-attempt reply timeout */
#define KVP_MS_MAX_ATTEMPT_MS 2000u   /* per-attempt timeout grows up to this */
#define KVP_MS_NOHINT_BACKOFF_MS 20u  /* pause before the next master after a hint-less NOT_LEADER */
#define KVP_MS_PROBE_MS 200u          /* fail-fast: one probe to the next master this often */
#define KVP_MS_FAILOVER_MS 3000u      /* fail-fast: a leader known this recently = a failover in progress
                                       * (an election takes about two election timeouts, C5) */
#define KVP_MS_PROBE_SEQ 0u           /* call sequence of probes (calls start at 1) */

/** Messages the session actor handles (kvp_rt_msg.type). */
enum kvp_ms_msg {
    MS_MSG_CALL = 1,      /* request: payload struct ms_call_msg; reply payload Kvp__Response */
    MS_MSG_REQUEST = KVP_MSESSION_REPLY_TYPE, /* as MS_MSG_CALL with an owned request (ms_call_msg.owned) */
    MS_MSG_FAIL_FAST = 2, /* one-way: arg 1 = on, 0 = off */
    MS_MSG_STATUS = 3,    /* request: reply arg = fast-failed count << 1 | breaker open */
    MS_MSG_LEADER = 4,    /* request: reply payload = the leader's "host:port" (malloc'd) or none */
    MS_MSG_TICK = 5,      /* the session's timer */
};

/** Payload of MS_MSG_CALL / MS_MSG_REQUEST. MS_MSG_CALL: `req` stays the caller's (it blocks in
 * kvp_rt_call until the reply). MS_MSG_REQUEST: `req` is a decoded copy owned by the message
 * (then by the call record), freed with kvp__request__free_unpacked. */
struct ms_call_msg {
    Kvp__Request *req;
    bool owned;
    uint32_t timeout_ms;       /* the call's whole budget */
    uint64_t start_ms;         /* monotonic: when the caller made the call */
};

/** One call in flight, owned by the actor; linked in the session while pending. */
struct kvp_ms_call {
    struct kvp_ms_call *next;
    Kvp__Request *req;         /* borrowed from the caller (blocked in kvp_rt_call) until answered,
                                * or owned (owned_req) for kvp_msession_request */
    bool owned_req;            /* req is ours: freed with the record */
    uint64_t token;            /* the runtime reply token */
    uint64_t seq;              /* call sequence number (req_id >> 8) */
    uint32_t attempt;          /* attempts sent so far */
    int target;                /* master index of the current attempt, -1 before the first */
    uint64_t start_ms;         /* monotonic: when the call was made */
    uint64_t deadline_ms;      /* monotonic: the call ends here with UNAVAILABLE */
    uint64_t next_action_ms;   /* monotonic: resend (0 = send now) */
    uint32_t attempt_ms;       /* current per-attempt reply timeout */
    uint32_t unsent;           /* consecutive sends refused by the current target (not connected) */
    bool sent;                 /* an attempt is outstanding (next_action_ms is its timeout) */
    bool done;                 /* answered; unlinked */
};

/** The actor's state. */
struct kvp_ms_state {
    char name[64];             /* owner name for log lines */
    char *masters[KVP_MS_MAX_MASTERS]; /* "host:port" (malloc'd) */
    size_t n_masters;          /* masters known; hints may add up to KVP_MS_MAX_MASTERS */
    int leader;                /* index of the last known leader, -1 if none */
    struct kvp_ms_call *calls; /* pending calls */
    uint64_t next_seq;         /* next call sequence */
    void *zctx;                /* ZeroMQ context (the session's own) */
    struct kvp_auth_client *auth; /* CURVE keys (auth/auth.h); NULL = auth off; freed with the state */
    void *socks[KVP_MS_MAX_MASTERS]; /* DEALER per master */
    bool watched[KVP_MS_MAX_MASTERS]; /* socket is in the actor's poll set */
    uint64_t sent_ms[KVP_MS_MAX_MASTERS]; /* last request sent to that master (0 never) */
    struct kvp_rt_ctx *ctx;    /* the running callback's context (set on entry of each callback;
                                * complete() answers calls through it) */
    uint64_t timer_id;         /* the armed MS_MSG_TICK timer, 0 none */
    uint64_t timer_due_ms;     /* when it fires */

    /* Fail fast (the circuit breaker, docs/internals.md "Leadership"). When on, a call that
     * waited its whole timeout while no leader answered, and no leader was known for
     * KVP_MS_FAILOVER_MS (so no failover in progress: followers saying "not leader" without a
     * hint do not count, the quorum may be gone), opens the breaker: later calls fail at once
     * with UNAVAILABLE, and the actor probes one master every KVP_MS_PROBE_MS (a Members
     * request); the first reply that shows a leader closes it. */
    bool fail_fast;            /* enabled (kvp_msession_set_fail_fast) */
    uint64_t last_heard_ms;    /* last reply of any kind from any master (0 = never) */
    uint64_t last_leader_ms;   /* last reply showing a leader: a leader's answer, a "not leader"
                                * with a hint, a Members reply naming one (0 = never) */
    bool breaker_open;
    uint64_t breaker_opened_ms;
    uint64_t probe_next_ms;    /* next probe send time */
    uint32_t probe_attempt;    /* probes sent in this open period (req_id low byte) */
    int probe_target;          /* master index of the next probe */
    uint64_t fast_failed;      /* calls failed at once while open (total) */
    uint64_t fast_failed_open; /* ... in the current open period (for the closing log line) */
};

/** The handle callers hold. */
struct kvp_msession {
    struct kvp_rt_actor *actor; /* the session actor (owner's reference); its state is a
                                 * struct kvp_ms_state, freed by its fini */
};

#endif
