/*
 * msession_internal.h — state of a master session (actors/session/msession.c).
 *
 * One I/O thread owns one ZeroMQ DEALER socket per master. Caller threads put a `struct
 * kvp_ms_call` (on their own stack) on the session's list under `mu`, wake the I/O thread
 * through an eventfd and wait on the call's condvar. The I/O thread encodes and sends each
 * attempt, matches replies by req_id, follows NOT_LEADER hints, rotates through the masters on
 * silence, and completes the call (status + response) at the latest at its deadline.
 *
 * req_id layout: (call sequence << 8) | (attempt number & 0xff), so a late reply to an earlier
 * attempt of the same call is still recognised (and accepted when it is a real answer:
 * every request is idempotent).
 */
#ifndef KVP_CLIENT_MSESSION_INTERNAL_H
#define KVP_CLIENT_MSESSION_INTERNAL_H

#include <pthread.h>
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

/** One caller's request, owned by the caller's stack; linked in the session while pending. */
struct kvp_ms_call {
    struct kvp_ms_call *next;
    Kvp__Request *req;         /* borrowed from the caller until done */
    uint64_t seq;              /* call sequence number (req_id >> 8) */
    uint32_t attempt;          /* attempts sent so far */
    int target;                /* master index of the current attempt, -1 before the first */
    uint64_t start_ms;         /* monotonic: when the call was made */
    uint64_t deadline_ms;      /* monotonic: the call ends here with UNAVAILABLE */
    uint64_t next_action_ms;   /* monotonic: resend (0 = send now) */
    uint32_t attempt_ms;       /* current per-attempt reply timeout */
    uint32_t unsent;           /* consecutive sends refused by the current target (not connected) */
    bool sent;                 /* an attempt is outstanding (next_action_ms is its timeout) */
    bool done;                 /* completed: status/resp are final */
    int status;                /* KVP_OK or error */
    Kvp__Response *resp;       /* on KVP_OK: the reply (caller frees) */
    pthread_cond_t cv;         /* signalled when done */
};

struct kvp_msession {
    char name[64];             /* owner name for log lines */
    char *masters[KVP_MS_MAX_MASTERS]; /* "host:port" (malloc'd) */
    size_t n_masters;          /* masters known; hints may add up to KVP_MS_MAX_MASTERS */
    int leader;                /* index of the last known leader, -1 if none (I/O thread writes; under mu) */

    pthread_mutex_t mu;        /* guards the call list, leader, closing, inflight, n_masters */
    struct kvp_ms_call *calls; /* pending calls */
    uint64_t next_seq;         /* next call sequence */
    bool closing;              /* destroy started: new calls get CLOSED */
    uint32_t inflight;         /* callers inside kvp_msession_call */
    pthread_cond_t idle_cv;    /* signalled when inflight drops to 0 while closing */

    int wake_fd;               /* eventfd: callers wake the I/O thread */
    bool io_polling;           /* under mu: the I/O thread is in (or about to enter) its poll */
    bool wake_sent;            /* under mu: wake_fd written since the I/O thread last read it */
    void *zctx;                /* ZeroMQ context */
    void *socks[KVP_MS_MAX_MASTERS]; /* DEALER per master, owned by the I/O thread */
    uint64_t sent_ms[KVP_MS_MAX_MASTERS]; /* under mu: last request sent to that master (0 never) */

    /* Fail fast (the circuit breaker, docs/internals.md "Master session"), under mu. When on, a
     * call that waited its whole timeout while no leader answered, and no leader was known for
     * KVP_MS_FAILOVER_MS (so no failover in progress: followers saying "not leader" without a
     * hint do not count, the quorum may be gone), opens the breaker: later calls fail at once
     * with UNAVAILABLE, and the I/O thread probes one master every KVP_MS_PROBE_MS (a Members
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
    pthread_t thread;          /* the I/O thread */
};

#endif
