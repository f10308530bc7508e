/*
 * msession.h — a session with the master quorum: keeps the master list, finds the leader,
 * follows "not leader" hints, rotates through the list, retries requests across a failover.
 * Used by the client library, kvpool-segment, kvpoolctl and kvpool-bench. It runs as a runtime
 * actor (msession_internal.h); these calls reach it by message.
 *
 * Every request kvpool sends is idempotent (puts carry op ids), so the session retries any
 * request whose reply did not arrive, until the call's timeout.
 */
#ifndef KVP_SESSION_MSESSION_H
#define KVP_SESSION_MSESSION_H

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

struct kvp_auth_client;
/**
 * kvp_msession_new with CURVE: every master socket authenticates with *auth (auth/auth.h;
 * NULL or *auth NULL = no authentication). Once the arguments pass validation the session
 * owns *auth and sets it NULL (also when a later step fails: the session frees it); on
 * KVP_ERR_INVALID for a bad argument the caller still owns it. KVP_ERR_INVALID also when a master's public key is unknown.
 */
int kvp_msession_new_auth(struct kvp_msession **out, const char *const *masters, size_t n, const char *name,
                          struct kvp_auth_client **auth);

/**
 * Send `req` (its req_id and timeout_ms are filled in by the session; the caller keeps
 * ownership of req) to the leader and wait for the reply, at most timeout_ms in all
 * (0 = 5000). Thread-safe: many threads may call at once. Blocks the caller: not from an
 * actor's callback (use kvp_msession_request there).
 * On KVP_OK, *out is the leader's Response (free with kvp_msession_response_free); its status
 * may itself be an error for the request. Errors: KVP_ERR_UNAVAILABLE (no leader answered within
 * the timeout), KVP_ERR_CLOSED, KVP_ERR_NOMEM, KVP_ERR_MALFORMED (a reply failed to decode).
 */
int kvp_msession_call(struct kvp_msession *s, Kvp__Request *req, uint32_t timeout_ms, Kvp__Response **out);

void kvp_msession_response_free(Kvp__Response *resp);

struct kvp_rt_ctx;

/**
 * The same call, from inside another actor, without blocking it: the session gets its own copy
 * of `req` (the caller may free or change it at once), and the answer comes back to the calling
 * actor (or hosted actor) as a KVP_RT_REPLY message with msg->corr_id == *corr_id and msg->type
 * == KVP_MSESSION_REPLY_TYPE: msg->status is KVP_OK with msg->payload the leader's Response (take
 * it with kvp_rt_msg_take and free it with kvp_msession_response_free, or leave it to the
 * runtime), or an error as for kvp_msession_call. Exactly one such reply comes, at the latest at
 * the call's timeout (0 = 5000 ms). Errors (no reply will come): KVP_ERR_INVALID,
 * KVP_ERR_NOMEM, KVP_ERR_MALFORMED (req cannot be encoded), KVP_ERR_CLOSED (session destroyed).
 * Only from an actor's callback (ctx).
 */
int kvp_msession_request(struct kvp_rt_ctx *ctx, struct kvp_msession *s, const Kvp__Request *req,
                         uint32_t timeout_ms, uint64_t *corr_id);

/** msg->type of the replies to kvp_msession_request (for the requester's dispatch). */
#define KVP_MSESSION_REPLY_TYPE 0x4d530001u

/**
 * Fail fast (a circuit breaker; off by default, the client library turns it on). When on: once a
 * call has waited its whole timeout while no master answered anything (no reply, not even "not
 * leader" — so no failover was in progress), later calls return KVP_ERR_UNAVAILABLE at once
 * instead of waiting, while the session actor sends a Members request to one master every
 * 200 ms; the first reply from any master closes the breaker and calls wait normally again.
 * Calls already waiting are not cut short. Any thread. Turning it off closes an open breaker.
 */
void kvp_msession_set_fail_fast(struct kvp_msession *s, bool on);

/** true while the breaker is open; *fast_failed (may be NULL): calls failed at once so far. */
bool kvp_msession_failing_fast(struct kvp_msession *s, uint64_t *fast_failed);

/** The control address of the last known leader ("" if none); copied into buf. */
void kvp_msession_leader(struct kvp_msession *s, char *buf, size_t cap);

/**
 * Close: calls in flight return KVP_ERR_CLOSED; frees. Accepts NULL; sets *s NULL. Calls must
 * not start on other threads once this started (the handle is freed; the client's close waits
 * for its callers first). */
void kvp_msession_destroy(struct kvp_msession **s);

#endif
