/*
 * service_resolve.h — a leader's resolution of the pending intents an older leader (or its own
 * clients) left: verify their bytes on the segments, seal the complete ones, revoke the others
 * after their deadline (feature level 6; the rule and why it is safe: service_resolve.c and
 * docs/master.md "Resolving pending intents"). Service thread only; leader-only soft state.
 */
#ifndef KVP_MASTER_SERVICE_RESOLVE_H
#define KVP_MASTER_SERVICE_RESOLVE_H

#include <stddef.h>
#include <stdint.h>

#include "wire/kvpool.pb-c.h"

struct kvp_master_service;
struct svc_pending;

/** What the resolver does with an intent after a verification (svc_resolve_rule). */
enum svc_resolve_verdict {
    SVC_RESOLVE_SEAL,       /* PutSealCmd: its bytes are the client's own */
    SVC_RESOLVE_REVOKE,     /* PutRevoke: its writer never finished, and no longer can */
    SVC_RESOLVE_AFTER_UNTIL, /* verified again once `until` has passed (its writer may be writing) */
    SVC_RESOLVE_RETRY,      /* verified again a second later (a replica did not answer) */
};

/** The rule (pure; docs/master.md "Resolving pending intents"). live/match/mismatch: replicas on
 * live segments and their answers; asked_wall: the leader's wall-clock ms when the asks were made
 * (every answer was hashed after it); now_wall: wall-clock ms now; until: the put's deadline +
 * fence_grace_ms (wall-clock ms; no WRITE of it lands after). A MISMATCH is final only when it
 * was hashed after `until` (asked_wall > until), never from when the last answer came; asked
 * after `until`, one MATCH and no MISMATCH seals (the other replicas did not answer). */
enum svc_resolve_verdict svc_resolve_rule(uint32_t live, uint32_t match, uint32_t mismatch, uint64_t asked_wall,
                                          uint64_t now_wall, uint64_t until);

/** A pass: list the FSM's pending intents (a local read), start the verifications due. Run when
 * a new leader's state is current (its first segment table) and every second. */
void svc_resolve_tick(struct kvp_master_service *s);
/** The result of a PutSealCmd / PutRevoke it submitted (SVC_INT_RESOLVE_SEAL / _REVOKE). */
void svc_resolve_on_result(struct kvp_master_service *s, struct svc_pending *p, int status, Kvp__Response *resp);
/** A read waits for key (an older leader's pending intent): verify it now (listing the FSM's
 * intents first when it is not held yet, at most every 100 ms), unless a verification is under
 * way or was asked within the last 500 ms. */
void svc_resolve_urge(struct kvp_master_service *s, const char *key);
/** A leadership change: forget every intent (the next leader lists them again). Call before
 * svc_verify_reset (whose callbacks free what had asks open). */
void svc_resolve_reset(struct kvp_master_service *s);
/** The service stops (before svc_verify_destroy). */
void svc_resolve_destroy(struct kvp_master_service *s);
/** Intents held for resolution now. */
size_t svc_resolve_held(const struct kvp_master_service *s);
/** Status (soft_state): verify_asks (held by the range verifier), intents_resolving (held
 * here), intents_sealed / intents_revoked (by this master as leader, since it started). */
struct json_t;
void svc_resolve_status(struct kvp_master_service *s, struct json_t *soft);
/** Tests only: with KVP_TEST_PUT_INTENT_ONLY=1 in a master's environment, every PutCommitCmd it
 * logs carries intent = true and is never sealed nor resolved by it (a leader that acknowledged
 * puts and died before sealing them): its resolver skips its own term's intents. Called by svc_submit before the command is stamped. */
void svc_resolve_test_hook(struct kvp_master_service *s, Kvp__Command *cmd);

#endif
