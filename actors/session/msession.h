/*
 * msession.h — a session with the master quorum: keeps the master list, finds the leader,
 * follows "not leader" hints, rotates through the list, retries requests across a failover.
 * Used by the client library, kvpool-segment, kvpoolctl and kvpool-bench.
 *
 * Every request kvpool sends is idempotent (puts carry op ids), so the session retries any
 * request whose reply did not arrive, until the call's timeout.
 */
#ifndef KVP_CLIENT_MSESSION_H
#define KVP_CLIENT_MSESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/kvpool.pb-c.h"

struct kvp_msession;

/**
 * masters: n "host:port" control addresses (copied). `name` names the owner in log lines.
 * Does not block (connections are made lazily). Errors: KVP_ERR_INVALID, KVP_ERR_NOMEM.
 */
int kvp_msession_new(struct kvp_msession **out, const char *const *masters, size_t n, const char *name);

/**
 * Send `req` (its req_id and timeout_ms are filled in by the session; the caller keeps
 * ownership of req) to the leader and wait for the reply, at most timeout_ms in all
 * (0 = 5000). Thread-safe: many threads may call at once.
 * On KVP_OK, *out is the leader's Response (free with kvp_msession_response_free); its status
 * may itself be an error for the request. Errors: KVP_ERR_UNAVAILABLE (no leader answered within
 * the timeout), KVP_ERR_CLOSED, KVP_ERR_NOMEM, KVP_ERR_MALFORMED (a reply failed to decode).
 */
int kvp_msession_call(struct kvp_msession *s, Kvp__Request *req, uint32_t timeout_ms, Kvp__Response **out);

void kvp_msession_response_free(Kvp__Response *resp);

/**
 * Fail fast (a circuit breaker; off by default, the client library turns it on). When on: once a
 * call has waited its whole timeout while no master answered anything (no reply, not even "not
 * leader" — so no failover was in progress), later calls return KVP_ERR_UNAVAILABLE at once
 * instead of waiting, while the session's I/O thread sends a Members request to one master every
 * 200 ms; the first reply from any master closes the breaker and calls wait normally again.
 * Calls already waiting are not cut short. Any thread. Turning it off closes an open breaker.
 */
void kvp_msession_set_fail_fast(struct kvp_msession *s, bool on);

/** true while the breaker is open; *fast_failed (may be NULL): calls failed at once so far. */
bool kvp_msession_failing_fast(struct kvp_msession *s, uint64_t *fast_failed);

/** The control address of the last known leader ("" if none); copied into buf. */
void kvp_msession_leader(struct kvp_msession *s, char *buf, size_t cap);

/** Close: calls in flight return KVP_ERR_CLOSED; frees. Accepts NULL; sets *s NULL. */
void kvp_msession_destroy(struct kvp_msession **s);

#endif
