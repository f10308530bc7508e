/*
 * service_evict.h — the leader's memory-pressure loop (docs/eviction.md): watch pool usage, pick
 * victims with evict_policy.h, evict them as Raft EvictCmd commands (their space goes through the
 * FSM's quarantine), and annotate NO_SPACE PutStart results with a reason and whether the client
 * should wait and retry. Leader-only soft state, owned by the service thread.
 */
#ifndef KVP_MASTER_SERVICE_EVICT_H
#define KVP_MASTER_SERVICE_EVICT_H

#include <stdbool.h>
#include <stdint.h>

#include "actors/master/fsm/evict_policy.h"
#include "actors/master/service/service_state.h"

struct svc_evict;

/* The write rate counted once per key (evict_policy.h has struct kvp_write_rate; these use the
 * service's soft-state map, so they live with the service). */
/**
 * Count `bytes` asked for the key whose soft-state hash is key_hash, at most once per
 * max(window_ms, 1,000) per key; seen (key hash → ms of its last count) remembers the keys.
 * A put that found no space is asked again every 5-200 ms until its timeout (put_retry.c), and
 * a key put again while its first copy holds space asks for none: counting every ask made the
 * rate, and so the headroom, grow with the retries of writers that wait. Returns true when the
 * bytes were counted.
 */
bool kvp_write_rate_add_key(struct kvp_write_rate *r, struct svc_map *seen, uint64_t key_hash, uint64_t bytes,
                            uint64_t now_ms, uint64_t window_ms);

/** Forget the keys of `seen` counted max(window_ms, 1,000) ms or more before now_ms. */
void kvp_write_rate_forget(struct svc_map *seen, uint64_t now_ms, uint64_t window_ms);

/** Create / destroy (s->evict). new returns KVP_OK or KVP_ERR_NOMEM. */
int svc_evict_new(struct kvp_master_service *s);
void svc_evict_destroy(struct kvp_master_service *s);
/** Leadership change: forget hints, counters in flight, the last scan. */
void svc_evict_reset(struct kvp_master_service *s);
/* A scan now (a new leader whose state became current), unless one is in flight. */
void svc_evict_kick(struct kvp_master_service *s);
/** Service actor timer (every 50 ms, leader only): start a scan when usage may be above the watermark. */
int svc_evict_timer_start(struct kvp_master_service *s);
/** Whether the 50 ms timer starts a scan next (usage may have changed, or a put waits for room). */
bool svc_evict_scan_wanted(const struct kvp_master_service *s);
/** PutStart request seen, on either path (the FSM's or a reservation's): record prefix hints
 * (parent keys) and the write rate, and mark usage as changed (a scan follows). */
void svc_evict_on_put_start_req(struct kvp_master_service *s, const Kvp__PutStartReq *ps);
/** PutStart result: mark usage dirty; NO_SPACE items get reason/evicting and start eviction. */
void svc_evict_on_put_start_result(struct kvp_master_service *s, Kvp__Response *resp);
/** RemoveAll committed: forget every hint. */
void svc_evict_on_remove_all(struct kvp_master_service *s);
/** Results of SVC_INT_EVICT_SCAN / SVC_INT_EVICT internal work. */
void svc_evict_on_internal(struct kvp_master_service *s, struct svc_pending *p, int status, Kvp__Response *resp);
/** GetReplicaList: true while an EvictCmd or un-forced Remove naming this key is in flight (answer NOT_FOUND). */
bool svc_evict_hides(const struct kvp_master_service *s, uint64_t key_hash);
/** Hide a key from GetReplicaList (no new lease) while a command freeing it is in flight; every
 * hide needs one unhide (counted, so an eviction and a remove of one key may overlap). */
void svc_evict_hide(struct kvp_master_service *s, uint64_t key_hash);
void svc_evict_unhide(struct kvp_master_service *s, uint64_t key_hash);
/** Add the "eviction" object to the ClusterStatus document (a json_t * object). */
void svc_evict_status(struct kvp_master_service *s, void *json_doc);

#endif
