/*
 * evict_policy.h — the pure eviction choice of the master (docs/eviction.md). No I/O, no clock,
 * no global state: the leader's service (service_evict.c) builds one candidate per complete
 * object from the FSM's object list and its own soft state (last access, leases, prefix hints)
 * and asks which objects to evict to free `target` bytes.
 *
 * Rules, both policies:
 *   - a leased candidate is never chosen;
 *   - soft-pinned candidates are chosen only when the unpinned ones cannot reach the target, and
 *     never when allow_pinned is false (`allow_evict_soft_pinned_objects`);
 *   - ties are broken by key hash, so the choice is deterministic.
 * KVP_EVICT_LRU: least recently used first.
 * KVP_EVICT_PREFIX: leaf first. A candidate whose hash is named as `parent` by another present
 *   candidate is not evicted while that child is present; among the leaves the least recently
 *   used goes first, and a parent becomes a leaf once all its children are chosen. When the
 *   leaves (including those freed up this way) cannot reach the target — children that are
 *   leased or pinned keep their parents — the rest is taken in LRU order.
 */
#ifndef KVP_MASTER_EVICT_POLICY_H
#define KVP_MASTER_EVICT_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/kvpool.pb-c.h"

enum kvp_evict_policy {
    KVP_EVICT_LRU = 0,
    KVP_EVICT_PREFIX = 1,
};

struct kvp_evict_cand {
    uint64_t hash;        /* key identity (non-zero, unique among candidates) */
    uint64_t parent;      /* hash of the block before it in its prefix, 0 = none */
    uint64_t last_access; /* any monotonic unit; 0 = never seen (oldest) */
    uint64_t size;        /* bytes freed by evicting it (all replicas) */
    bool pinned;
    bool leased;
};

struct kvp_evict_summary {
    size_t n_chosen;
    uint64_t chosen_bytes;
    uint64_t pinned_chosen_bytes; /* part of chosen_bytes that was soft-pinned */
    uint64_t leased_bytes;        /* candidates skipped because leased */
    uint64_t pinned_bytes;        /* all pinned candidates (chosen or not) */
    uint64_t evictable_bytes;     /* candidates that may go (unleased; pinned only if allowed) */
};

/** "lru" or "prefix" → the policy; -1 for anything else (NULL included). */
int kvp_evict_policy_parse(const char *name);
const char *kvp_evict_policy_name(int policy);

/**
 * Choose victims until at least `target` bytes are chosen or nothing else may go. Writes the
 * indexes (into c) of the chosen candidates, in eviction order, to chosen[] (room for n) and
 * returns their count. sum may be NULL. Returns 0 for n == 0 or target == 0. On allocation
 * failure returns 0 with sum->n_chosen = 0 (the caller retries later).
 */
size_t kvp_evict_choose(const struct kvp_evict_cand *c, size_t n, uint64_t target, int policy,
                        bool allow_pinned, size_t *chosen, struct kvp_evict_summary *sum);

#define KVP_WRITE_RATE_BUCKETS 64

/**
 * Write rate of the pool, as the leader sees it: bytes (size × replicas) asked by PutStarts,
 * counted in buckets of at least one second; the rate is the mean over the newest buckets that
 * span `window_ms` (the caller passes fence_grace_ms: the writes the headroom must absorb are
 * those of one quarantine period, so a one-second burst counts for its bytes, not as if it went
 * on for the whole period), or the rate of the newest two buckets when that is higher (a rising
 * rate, which the mean lags by half the window). Windows longer than 64 buckets use the newest 64.
 */
struct kvp_write_rate {
    uint64_t t0_ms;                              /* start of the current bucket (0 = not started) */
    uint64_t bytes;                              /* bytes asked in the current bucket */
    uint64_t b_bytes[KVP_WRITE_RATE_BUCKETS];    /* closed buckets, a ring */
    uint64_t b_ms[KVP_WRITE_RATE_BUCKETS];       /* their lengths */
    unsigned head, n;                            /* next slot; closed buckets kept */
    double bps;                                  /* the estimate, bytes per second */
};

/** Count `bytes` asked now. */
void kvp_write_rate_add(struct kvp_write_rate *r, uint64_t bytes);

/** The estimate is at least the rate of this many newest buckets (a rising rate, the window's
 *  mean lagging it; kvp_write_rate_tick). */
#define KVP_WRITE_RATE_RECENT 2u

/** Before the first bucket closes, the estimate is the partial bucket's once it spans this (ms). */
#define KVP_WRITE_RATE_FIRST_MS 250u

/**
 * Close the current bucket when it is at least 1,000 ms old at now_ms (monotonic ms) and
 * recompute r->bps over the newest buckets spanning window_ms (at least one), raised to the rate
 * of the newest KVP_WRITE_RATE_RECENT buckets when that is higher and they lie within the window
 * (a rising rate: the mean lags it by half the window); returns r->bps.
 * Until the first bucket closes, r->bps is the current bucket's rate once it is
 * KVP_WRITE_RATE_FIRST_MS old (0 before).
 */
double kvp_write_rate_tick(struct kvp_write_rate *r, uint64_t now_ms, uint64_t window_ms);

/**
 * Headroom, the space eviction keeps free or in quarantine that comes back in time, in bytes:
 * write_bps × horizon_ms / 1000 × factor, at most capacity / 2. horizon_ms is the longest that
 * space evicted from now on can stay unusable (kvp_evict_headroom_horizon_ms): the free space
 * and the quarantine due within it must absorb what clients write meanwhile, or writers wait for
 * the quarantine (the main job's 7–9 s put stall before this rule; 1.2–1.35 s after a leader
 * kill while the horizon was fence_grace_ms alone). 0 when factor <= 0 (the rule off). A pool
 * that needs more than half of itself as headroom is too small for its write rate; it then waits
 * for space. docs/eviction.md, "Headroom".
 */
uint64_t kvp_evict_headroom(uint64_t capacity, double write_bps, uint64_t horizon_ms, double factor);

/**
 * The headroom's horizon (ms): max(fence_grace_ms, lease_ttl_ms + 4 × election_timeout_ms).
 * Space evicted by a leader comes back fence_grace_ms later; after a leader's death, what its
 * successor evicts in its election grace comes back only at the grace's end plus two election
 * timeouts (docs/master.md, "Leases and failover"), and the successor is elected at most about
 * two election timeouts after the death (raft's randomized timeout, [1, 2] × election timeout).
 * From the death to that return, writers live on the space that was free or in quarantine at the
 * death (the writes queued during the election come right after it), so the headroom is kept
 * for this horizon all the time (within its cap of half the pool; the main job's figures,
 * docs/master.md "Figures", show it is not yet enough there).
 */
uint64_t kvp_evict_headroom_horizon_ms(uint64_t fence_grace_ms, uint64_t lease_ttl_ms,
                                       uint64_t election_timeout_ms);

/**
 * Bytes to evict so that used + headroom <= capacity again, with one step of ratio × capacity
 * below that (so one round is not one object): 0 while used + headroom <= capacity, else
 * used + headroom + ratio × capacity − capacity, at most used. `used` excludes quarantine.
 */
uint64_t kvp_evict_headroom_target(uint64_t used, uint64_t capacity, uint64_t headroom, double ratio);

/**
 * The headroom rule's target when `late` bytes of the quarantine are not reusable within the
 * horizon (kvp_master_fsm_quarantine_late at now + horizon): such space cannot absorb the writes
 * the headroom is for, so it counts as used: kvp_evict_headroom_target(used + late, …), at most
 * `used` (what can be evicted). With late = 0 the same as kvp_evict_headroom_target.
 */
uint64_t kvp_evict_room_target(uint64_t used, uint64_t late, uint64_t capacity, uint64_t headroom, double ratio);

/**
 * The usage ratio ((used + quarantined) / capacity, the FSM's test) from which the leader asks
 * for the object list: the lowest usage at which a round could evict something, given the
 * quarantined bytes `quarantined` (the leader's last figure). Two rules:
 *   - the watermark's target, max(ratio, usage − (high − ratio)) × capacity less quarantine, is
 *     0 until usage > (high − ratio) × capacity + quarantined once quarantined ≥ ratio × capacity:
 *     from max(high, that), else from high;
 *   - the headroom rule acts on used bytes only: from (capacity − headroom + quarantined) /
 *     capacity (nothing when headroom is 0 or capacity is 0).
 * The lower of the two. Without the quarantine terms a pool kept at capacity − headroom, with
 * write rate × fence_grace_ms in quarantine, was listed (every complete object, O(objects) on
 * both threads) on most 50 ms scans with nothing to evict. When the quarantine has fallen since
 * the figure, the list comes one scan later (that scan brings the new figure). A put waiting for
 * space makes the FSM list too (need_bytes), unless that quarantine already covers its need
 * (service_evict.c, start_scan).
 */
double kvp_evict_list_ratio(uint64_t capacity, uint64_t headroom, uint64_t quarantined, double high, double ratio);

/**
 * One round's victims for two targets: `target`, for the high watermark or a put waiting for
 * space (soft-pinned objects may go when allow_pinned and the unpinned cannot reach it, as
 * kvp_evict_choose), and `room`, for the headroom rule (kvp_evict_headroom_target), which
 * evicts ahead of need and so never takes a soft-pinned object. Same outputs as
 * kvp_evict_choose: the choice for max(target, room) among unpinned candidates, or, when those
 * cannot reach `target`, kvp_evict_choose(target, allow_pinned).
 */
size_t kvp_evict_choose_round(const struct kvp_evict_cand *c, size_t n, uint64_t target, uint64_t room,
                              int policy, bool allow_pinned, size_t *chosen, struct kvp_evict_summary *sum);

/**
 * The FSM side of the leader's EvictScanReq (called by fsm_query.c on the raft thread): pool
 * usage and, when (used + quarantined) / capacity >= high_watermark or need_bytes > 0, every
 * complete object — or, with q->slots > 0, those of the table slots [q->cursor, q->cursor +
 * q->slots) only, with next_cursor (0: the slice ended the table), table_slots and table_moves
 * (kvp_master_fsm_foreach_object_slice). Fills r's body. Returns KVP_OK or KVP_ERR_NOMEM.
 */
struct kvp_master_fsm;
int kvp_evict_scan(const struct kvp_master_fsm *f, const Kvp__EvictScanReq *q, Kvp__Response *r);

#endif
