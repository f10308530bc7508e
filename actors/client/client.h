/*
 * client.h — helpers shared by the client's files (client.c: lifecycle and small calls;
 * batch_put.c: put flows; batch_get.c: get flows). Not part of the public API.
 */
#ifndef KVP_CLIENT_CLIENT_H
#define KVP_CLIENT_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "actors/client/client_state.h"
#include "actors/client/devmem.h"
#include "actors/client/devstage.h"
#include "kvpool.h"
#include "wire/kvpool.pb-c.h"

/** One object of a batch: the concatenation of iov[0..iovcnt-1]. */
struct kvp_client_obj {
    const char *key;
    const kvp_iov *iov;
    size_t iovcnt;
};

/**
 * The per-object view of a batch call's arguments: objs[i] = {keys[i], iovs[i], iovcnt[i]}, or,
 * when iovs is NULL, one piece per object {bufs[i], lens[i]} (the flat calls). One malloc'd
 * block the caller frees with free(); NULL when out of memory. The caller's arrays are borrowed.
 */
struct kvp_client_obj *kvp_client_objs_new(size_t n, const char *const keys[], const kvp_iov *const iovs[],
                                           const size_t iovcnt[], void *const bufs[], const size_t lens[]);

/** Start an API call: KVP_ERR_CLOSED when the client is closing, else counts it in flight. */
int kvp_client_enter(struct kvp_client *c);
/** End an API call started with kvp_client_enter(). */
void kvp_client_leave(struct kvp_client *c);

/** true once kvp_client_close started: calls in flight stop at their next phase with
 * KVP_ERR_CLOSED (after revoking what they started). */
bool kvp_client_closing(struct kvp_client *c);

/** Monotonic deadline (ms) of a call given its timeout_ms (0 = transfer_timeout). */
uint64_t kvp_client_deadline(const struct kvp_client *c, uint32_t timeout_ms);
/** Milliseconds left until deadline_ms (0 when passed). */
uint32_t kvp_client_remaining(uint64_t deadline_ms);

/**
 * Before chunk `off` (> 0, of n items) of a call split into chunks (batch put, batch get): 0 to
 * go on; KVP_ERR_CLOSED (the client is closing) or KVP_ERR_TIMEOUT (deadline_ms passed), with a
 * WARN naming `what` ("put", "get") and how many items were not started, for the items from off on.
 */
int kvp_client_chunk_gate(struct kvp_client *c, uint64_t deadline_ms, const char *what, size_t n, size_t off);

/** KVP_OK when key is 1..KVP_MAX_KEY_BYTES bytes, else KVP_ERR_INVALID. */
int kvp_client_check_key(const char *key);

/** Log a WARN line naming the API function `fn` and what was wrong; returns KVP_ERR_INVALID
 * (contract C6: bad API arguments get a clear code and a log line). */
int kvp_client_invalid(const char *fn, const char *what);

/**
 * One master RPC within the call's deadline (and at most rpc_timeout_ms). On KVP_OK *out is a
 * Response with status OK and the body `expect`; otherwise the error (the call-level status of
 * the reply, KVP_ERR_UNAVAILABLE, KVP_ERR_TIMEOUT when the deadline had passed,
 * KVP_ERR_MALFORMED for a wrong body).
 */
int kvp_client_rpc(struct kvp_client *c, Kvp__Request *req, uint64_t deadline_ms,
                   Kvp__Response__BodyCase expect, Kvp__Response **out);

/** XXH3-64 of the first `size` bytes of the concatenation of iov[0..iovcnt-1]. */
uint64_t kvp_client_checksum(const kvp_iov *iov, size_t iovcnt, uint64_t size);
#if defined(__x86_64__)
/* The SIMD builds kvp_client_checksum dispatches to (checksum_avx2.c, checksum_avx512.c); call
 * one only when kvp_client_checksum_simd_level() is at least its level (1 AVX2, 2 AVX-512F). */
uint64_t kvp_client_checksum_avx2(const kvp_iov *iov, size_t iovcnt, uint64_t size);
uint64_t kvp_client_checksum_avx512(const kvp_iov *iov, size_t iovcnt, uint64_t size);
#endif
/* 0 portable, 1 AVX2, 2 AVX-512F: the build kvp_client_checksum uses on this CPU. */
int kvp_client_checksum_simd_level(void);

/* Most replicas of one object (the master's limit too; config `replica_num` is 1..16). */
#define KVP_CLIENT_MAX_REPLICAS 16u
/* Most items of one PutStart: a larger batch put is sent in chunks of this many (batch_put.c). */
#define KVP_CLIENT_PUT_CHUNK 8192u
/* Most keys of one GetReplicaList: a larger batch get is read in chunks of this many (batch_get.c). */
#define KVP_CLIENT_GET_CHUNK 8192u

/** Put flows (batch_put.c): results[i] per object. */
void kvp_client_put_objs(struct kvp_client *c, size_t n, const struct kvp_client_obj *objs,
                         const kvp_put_opts *opts, int results[]);
/** ReportUnreachable for each of segs[0..n-1] (at most 500 ms each, within deadline; the answer
 * does not matter): the master probes them and declares a dead one lost (batch_get.c). */
/* GPU memory (devreg.c): kvp_register_buffer on device memory remembers the range (no driver
 * call per piece later) and pins the device's bounce buffers; host memory: nothing. */
void kvp_client_dev_register(struct kvp_client *c, void *addr, size_t len);

void kvp_client_report_unreachable(struct kvp_client *c, const uint32_t *segs, size_t n, uint64_t deadline);

/* ---- the client actor (client_actor.c): the state the calls share, reached by message ---- */

/** Spawn the client actor (c->actor). Errors: as kvp_rt_spawn. */
int kvp_client_actor_start(struct kvp_client *c);
/** Stop it and drop c->actor (after no call is inside). Accepts c->actor == NULL. */
void kvp_client_actor_stop(struct kvp_client *c);
/** kvp_client_close's first step: refuse new calls from now on; returns how many calls were
 * inside then. */
uint64_t kvp_client_mark_closed(struct kvp_client *c);
/** Then (after fencing their transfers): return once each of the `inside` calls left. KVP_OK;
 * anything else (logged) means a call may still be inside: the client must not be freed. */
int kvp_client_close_wait(struct kvp_client *c, uint64_t inside);
/** Reads try replicas on segment_id last for KVP_CLIENT_AVOID_MS (reported unreachable). A
 * request: the next call of any thread sees it. */
void kvp_client_avoid_note(struct kvp_client *c, uint32_t segment_id);
/** The segments avoided now (at most cap, into out); returns how many. No request while the
 * avoid list is empty. */
size_t kvp_client_avoid_list(struct kvp_client *c, uint32_t *out, size_t cap);
/** Before a GetReplicaList: take the read witnesses it carries and copy the avoid list into *v
 * (one request per batch; none while both are empty). */
void kvp_client_get_begin(struct kvp_client *c, struct kvp_client_view *v);
/** true while segment_id's replicas are tried last, as copied in v. */
bool kvp_client_view_avoided(const struct kvp_client_view *v, uint32_t segment_id, uint64_t now_ms);
/** The segments of slices[] that completed become witnesses (one one-way message; the caller
 * does not wait). A get's transfer rounds need not call it: their batch actors, hosted by the
 * client actor, note the completed READs there in their fini (client_actor.c). */
void kvp_client_read_ok(struct kvp_client *c, const struct kvp_xfer_slice *slices, size_t ns);
/** Registered-buffer table: add (KVP_ERR_INVALID with a WARN on an overlap unless
 * allow_overlap), and remove the latest registration at addr (*len its length; NOT_FOUND). */
int kvp_client_buf_add(struct kvp_client *c, uintptr_t addr, size_t len, bool allow_overlap);
int kvp_client_buf_del(struct kvp_client *c, uintptr_t addr, size_t *len);
/** Get flows (batch_get.c): results[i] = size or negative code. */
void kvp_client_get_objs(struct kvp_client *c, size_t n, const struct kvp_client_obj *objs,
                         uint32_t timeout_ms, int64_t results[]);

/* kvp_register_buffer (allow_overlap false: an overlap is KVP_ERR_INVALID with a WARN) and
 * kvp_register_buffer_overlap (true: overlapping and nested ranges, the latest wins at
 * unregister). fn names the public call in log lines. Errors as kvp_register_buffer. */
int kvp_client_register_range(kvp_client *c, void *addr, size_t len, bool allow_overlap, const char *fn);

#endif
