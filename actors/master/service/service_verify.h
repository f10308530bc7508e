/*
 * service_verify.h — the leader's range verifier (issue 21; docs/master.md "Range verification").
 *
 * The master never calls a segment: it asks in the segment's next HeartbeatResp (RangeVerify
 * {id, offset, len}) and the segment answers in the HeartbeatReq that follows (RangeSum {id,
 * status, checksum}), sent right away (actors/segment/seg_verify.h). This file keeps the asks of
 * this leadership, leader-only soft state on the service thread, and calls back once per ask:
 *  - SVC_VERIFY_MATCH: the segment's XXH3-64 of [offset, offset + len) is the expected checksum;
 *  - SVC_VERIFY_MISMATCH: it is another (the value is passed);
 *  - SVC_VERIFY_UNKNOWN: no usable answer: the segment refused the range, is lost or unknown, did
 *    not answer within SVC_VERIFY_BEATS heartbeats (plus one per 256 MiB queued before it: an
 *    older segment never answers) or SVC_VERIFY_TIMEOUT_MS, the queue was full, or the leadership
 *    changed (every ask is cancelled).
 * Ids carry the term in their high 32 bits: an answer to an older leader's ask is never taken for
 * one of this leader's.
 *
 * Callbacks run on the service thread, never inside svc_verify_range (a refused ask returns an
 * error and is not called back), and may call svc_verify_range again. Their `s` is NULL when the
 * service is stopping (svc_verify_destroy): free, reply to nobody, ask nothing.
 */
#ifndef KVP_MASTER_SERVICE_VERIFY_H
#define KVP_MASTER_SERVICE_VERIFY_H

#include <stdint.h>

#include <czmq.h>

#include "wire/kvpool.pb-c.h"

struct kvp_master_service;
struct svc_pending;

enum svc_verify_result {
    SVC_VERIFY_UNKNOWN = KVP__VERIFY_RESULT__VERIFY_UNKNOWN,
    SVC_VERIFY_MATCH = KVP__VERIFY_RESULT__VERIFY_MATCH,
    SVC_VERIFY_MISMATCH = KVP__VERIFY_RESULT__VERIFY_MISMATCH,
};

#define SVC_VERIFY_MAX 4096u          /* asks held at once (all segments) */
#define SVC_VERIFY_PER_BEAT 64u       /* asks put in one HeartbeatResp */
#define SVC_VERIFY_OUT_PER_SEG 128u   /* asks sent to one segment and not answered yet */
#define SVC_VERIFY_BEATS 3u           /* heartbeats of the segment an ask waits for its answer */
#define SVC_VERIFY_TIMEOUT_MS 30000u  /* the longest an ask waits, sent or not */

/** An ask's end: result, and with MATCH / MISMATCH the segment's checksum. */
typedef void (*svc_verify_fn)(struct kvp_master_service *s, void *arg, uint32_t idx, int result,
                              uint64_t checksum);

/**
 * Ask segment `segment_id` for the checksum of [offset, offset + len) and compare it with
 * `expect`; fn(s, arg, idx, ...) runs once with the result. Leader only. Errors (fn never runs):
 * KVP_ERR_NOT_LEADER, KVP_ERR_INVALID (len 0, segment 0), KVP_ERR_BUSY (SVC_VERIFY_MAX asks held;
 * one WARN per burst), KVP_ERR_NOMEM.
 */
int svc_verify_range(struct kvp_master_service *s, uint32_t segment_id, uint64_t offset, uint64_t len,
                     uint64_t expect, svc_verify_fn fn, void *arg, uint32_t idx);

/** A heartbeat from seg: its answers (RangeSum), and one more beat for the asks it left open. */
void svc_verify_on_heartbeat(struct kvp_master_service *s, uint32_t seg, const Kvp__HeartbeatReq *hb);
/** Put seg's unsent asks (up to SVC_VERIFY_PER_BEAT) into its answer (storage in the verifier,
 * valid until the next call). */
void svc_verify_fill(struct kvp_master_service *s, uint32_t seg, Kvp__HeartbeatResp *hb);
/** Every second: asks past SVC_VERIFY_TIMEOUT_MS or of a segment no longer in the table end UNKNOWN. */
void svc_verify_tick(struct kvp_master_service *s);
/** A leadership change: every ask ends UNKNOWN; new ids take the new term. */
void svc_verify_reset(struct kvp_master_service *s);
/** The service stops: every ask ends UNKNOWN without a reply to any caller; memory freed. */
void svc_verify_destroy(struct kvp_master_service *s);
/** Asks held now (status, tests). */
size_t svc_verify_held(const struct kvp_master_service *s);

/* The Verify RPC (kvpoolctl verify): look the keys up, verify every replica, answer. */
void svc_on_verify_req(struct kvp_master_service *s, zframe_t *identity, Kvp__Request *req);
/** Free a Verify call whose lookup was dropped unanswered (svc_pending_free). NULL: nothing. */
void svc_verify_job_drop(void *job);
/** The lookup's result (SVC_INT_VERIFY_LOOKUP). */
void svc_verify_on_lookup(struct kvp_master_service *s, struct svc_pending *p, int status, Kvp__Response *resp);

#endif
