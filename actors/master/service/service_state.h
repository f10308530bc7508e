/*
 * service_state.h — all mutable state of the master service actor (service.h), field by field,
 * and the functions the service_*.c files share. Owned by the service's thread only: nothing
 * here is touched by the raft thread (that one owns the FSM and talks to us through the
 * raftlog events socket). kvp_master_service_new fills it on the caller's thread before the
 * actor exists; from the spawn in kvp_master_service_run to its kvp_rt_stop, only the actor's
 * thread touches it (service_actor.c).
 */
#ifndef KVP_MASTER_SERVICE_STATE_H
#define KVP_MASTER_SERVICE_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <czmq.h>

#include "actors/master/fsm/fsm.h"
#include "actors/master/service/fence_track.h"
#include "actors/master/service/liveness.h"
#include "actors/master/service/service_resolve.h"
#include "actors/master/service/service_verify.h"
#include "actors/master/service/service.h"
#include "actors/master/fsm/version.h"
#include "auth/auth.h"
#include "config/config.h"
#include "raftlog/raftlog.h"
#include "runtime/actor.h"
#include "wire/arena.h"
#include "wire/kvpool.pb-c.h"

/* ------------------------------------------------------------------ u64 → u64 map
 * Open addressing, linear probing, backward-shift deletion. Key 0 is reserved (never stored):
 * corr ids start at 1, segment ids start at 1, key hashes map 0 to 1. Used for every soft-state
 * table so that a million leased keys cost 16 bytes each, not a strdup'd string. */
struct svc_map {
    uint64_t *keys; /* 0 = empty slot */
    uint64_t *vals;
    size_t cap;     /* power of two, or 0 before the first put */
    size_t n;
};

void svc_map_init(struct svc_map *m);
void svc_map_fini(struct svc_map *m);
void svc_map_clear(struct svc_map *m);
/** Insert or overwrite. Returns KVP_OK or KVP_ERR_NOMEM / KVP_ERR_INVALID (key 0). */
int svc_map_put(struct svc_map *m, uint64_t key, uint64_t val);
/** true and *val when present. val may be NULL. */
bool svc_map_get(const struct svc_map *m, uint64_t key, uint64_t *val);
/** Remove; true if it was present (and *val its value, val may be NULL). */
bool svc_map_del(struct svc_map *m, uint64_t key, uint64_t *val);
/** Keep only the entries for which keep(key, val, ctx) is true. */
void svc_map_filter(struct svc_map *m, bool (*keep)(uint64_t key, uint64_t val, void *ctx), void *ctx);
/** Iterate: *pos starts at 0; returns false at the end. Do not modify the map while iterating. */
bool svc_map_next(const struct svc_map *m, size_t *pos, uint64_t *key, uint64_t *val);

/** The soft-state key of an object key: XXH3-64 of its bytes (0 mapped to 1). A collision only
 * makes a lease look held longer: the safe direction. */
uint64_t svc_key_hash(const char *key);

/* ------------------------------------------------------------------ pending work */

enum svc_internal_kind {
    SVC_INT_NONE = 0,
    SVC_INT_REVOKE_EXPIRED,
    SVC_INT_QUARANTINE_RELEASE,
    SVC_INT_SEGMENT_LOST,
    SVC_INT_STATUS_REFRESH,
    SVC_INT_EVICT_SCAN,        /* service_evict.c: usage / candidates query */
    SVC_INT_EVICT,             /* service_evict.c: EvictCmd */
    SVC_INT_RESERVE,           /* service_put.c: ReserveCmd */
    SVC_INT_SEAL,              /* service_put.c: PutSealCmd (level 6) */
    SVC_INT_INTENT_REVOKE,     /* service_put.c: PutRevoke of an intent this leader never acked */
    SVC_INT_RAISE_LEVEL,       /* service_version.c: RaiseLevelCmd (result not needed) */
    SVC_INT_VERIFY_LOOKUP,     /* service_verify.c: the objects of a Verify call */
    SVC_INT_RESOLVE_SEAL,      /* service_resolve.c: PutSealCmd of a verified intent */
    SVC_INT_RESOLVE_REVOKE,    /* service_resolve.c: PutRevoke of an intent that did not verify */
};

/** One request waiting for a raftlog result (APPLIED, QUERY or ADMIN event), keyed by corr. */
struct svc_pending {
    uint64_t corr;
    zframe_t *identity;        /* ROUTER identity of the caller; NULL for internal work */
    uint64_t req_id;           /* echoed in the Response */
    uint64_t deadline_ms;      /* monotonic; 0 = none. Replies after it are dropped. */
    uint64_t created_ms;       /* monotonic; the sweep drops entries raftlog never answered */
    uint64_t recv_us;          /* monotonic µs the request frame was taken off the ROUTER; 0 = internal */
    uint64_t submit_us;        /* monotonic µs of kvp_raftlog_submit; 0 = not submitted */
    int body_case;             /* Kvp__Request__BodyCase of the request, or 0 */
    int internal;              /* enum svc_internal_kind for timer-driven work */
    uint32_t segment_id;       /* SEGMENT_LOST / UNMOUNT: the segment concerned */
    /* GetReplicaList / PutEnd: hashes of the keys, in request order (leases, last access). */
    uint64_t *key_hashes;
    size_t n_keys;
    /* SVC_INT_SEAL: the op_id of each item, in key_hashes' order (its sealing entry is dropped
     * only when both match). */
    uint64_t *seal_ops;
    /* Remove: per original key, the status decided here (KVP_ERR_LEASED), or 1 = forwarded to
     * the FSM (its status comes from the FSM's reply, in forwarded order). */
    int32_t *remove_status;
    size_t n_remove;
    /* Remove, RemoveAll, Evict: the lease horizon (wall-clock ms) of the objects it frees: no
     * read lease granted by this leader or an older one can be used after it. svc_submit commits
     * it (docs/master.md, "Leases and failover"); 0 = none. */
    uint64_t hold_wall_ms;
    /* Un-forced Remove: its forwarded keys are hidden from GetReplicaList (svc_evict_hide) until
     * its result, so that no lease is granted between the lease check and the commit. */
    bool hides;
    /* ReserveCmd (service_put.c): what was asked, in which term. */
    uint64_t resv_len, resv_horizon_ms, resv_term;
    /* RepairScan (service_repair.c): the query's ticket (repair_pass.h); an answer whose ticket is
     * no longer awaited (sent before a leadership loss) is dropped. */
    uint64_t repair_scan_ticket;
    /* EvictScan (service_evict.c): the same, for a pass of eviction list slices. */
    uint64_t evict_scan_ticket;
    /* Verify (service_verify.c): the call waiting for this lookup (owned; dropped with p). */
    void *verify_job;
    /* PutSealCmd / PutRevoke of the intent resolver (service_resolve.c): its entry's ticket. */
    uint64_t resolve_id;
};

/** A Heartbeat waiting for the segment table to be refreshed (a new leader's first one). */
struct svc_hb_waiter {
    zframe_t *identity;
    uint64_t req_id;
    uint64_t deadline_ms;
    uint32_t segment_id;
};

/* ------------------------------------------------------------------ the actor state */

struct kvp_master_service;
/** A timer of the service actor (svc_timer_every); a negative return stops the service. */
typedef int (*svc_timer_fn)(struct kvp_master_service *s);
/** A watched socket's handler (svc_watch): read what is there without waiting; returns 0. */
typedef int (*svc_watch_fn)(struct kvp_master_service *s, zsock_t *sock);
#define SVC_TIMERS_MAX 16
#define SVC_WATCHES_MAX 16

struct kvp_master_service {
    struct kvp_cfg_master cfg;             /* settings in force (copied at new) */
    char actor[32];                        /* log name, "master-<id>" */
    struct kvp_master_member members[KVP_CFG_MAX_MASTERS]; /* id → control/raft address */
    int n_members;
    /* Rolling upgrades (service_version.c, version.h): members[i]'s feature level as its last
     * answer reported, and the DEALER that asks it (leader only, one request a second). */
    struct kvp_feature_peer feature_peers[KVP_CFG_MAX_MASTERS];
    zsock_t *feature_sock[KVP_CFG_MAX_MASTERS];
    char feature_addr[KVP_CFG_MAX_MASTERS][256]; /* what feature_sock[i] is connected to */
    uint32_t feature_level_logged;         /* cluster level in the last INFO line (0 = none yet) */
    uint32_t feature_level;                /* cluster level at the last tick (0 = none yet) */
    uint64_t feature_level_term;           /* the term that tick ran in (leader) */
    uint32_t feature_committed;            /* the FSM's committed level as last read (a local read:
                                              while leader, at each tick and at AddMember) */
    uint64_t feature_raise_ms;             /* monotonic ms of the last RaiseLevelCmd submitted */
    /* An AddMember waiting for the new member's level while a level is committed
     * (svc_version_add_member); NULL = none. */
    struct svc_pending *admit_p;
    int admit_slot;
    uint64_t admit_id, admit_since_ms;
    char admit_raft[256];

    zsock_t *router;                       /* ROUTER bound at tcp://cfg.listen */
    struct kvp_auth_server *auth;          /* CURVE server end + ZAP handler; NULL = auth none (service_auth.c) */
    struct kvp_auth_client *peer_auth;     /* this master's keys toward its peers (feature polls) */
    zsock_t *auth_mon;                     /* the ROUTER's handshake monitor (not owned: auth's) */
    struct kvp_auth_ratelog denied_log;    /* refused requests, rate-limited lines */
    /* Data-plane tokens (auth/auth_token.h): the key derived from auth_key; the principal of the
     * request being dispatched (set by svc_auth_admit, read by svc_auth_on_data_token). */
    bool token_key_ok;
    uint8_t token_pk[32], token_sk[64];
    struct kvp_auth_principal cur_principal;
    uint64_t denied_requests;              /* requests refused for role or tenant */
    struct svc_quota *quota;               /* use and quota per tenant (service_quota.c); NULL = auth none */
    /* The actor (service_actor.c). `ctx` is the runtime context of the callback running now on
     * the service thread (NULL between callbacks): timers, watches and requests use it. */
    struct kvp_rt_actor *rt;               /* the service actor while run() runs */
    struct kvp_rt_ctx *ctx;
    struct kvp_rt_actor *ctl;              /* sink run() waits on; the actor's parent (supervision) */
    bool stopping;                         /* svc_stop_self ran: serve nothing more */
    svc_timer_fn timers[SVC_TIMERS_MAX];   /* timer message type SVC_MSG_TIMER + i runs timers[i] */
    size_t n_timers;
    struct svc_watch {
        zsock_t *sock;
        svc_watch_fn fn;
    } watches[SVC_WATCHES_MAX];
    size_t n_watches;
    struct kvp_raftlog *rl;                /* raft thread; owns `fsm` while running */
    struct kvp_master_fsm *fsm;            /* created here, destroyed after rl stops */
    uint64_t log_failed_ms;                /* raftlog said its log cannot be written (0 = never) */
    bool fatal;                            /* stopped for that: run returns KVP_ERR_IO */

    /* Leadership, from KVP_RAFTLOG_EV_LEADER events and kvp_raftlog_get_info(). */
    bool is_leader;
    uint64_t leader_id;                    /* 0 = unknown */
    uint64_t term;
    uint64_t leader_since_ms;              /* monotonic time this node became leader */
    int last_logged_role;                  /* -1 unknown, 0 follower, 1 leader: one INFO per change */
    uint64_t last_logged_leader;

    /* Requests in flight towards the raftlog: corr → struct svc_pending *. */
    struct svc_map pending;
    uint64_t next_corr;                    /* starts at 1 */

    /* Leader-only soft state (cleared on every leadership change). */
    struct svc_map leases;                 /* key hash → lease expiry (monotonic ms) */
    struct svc_map last_access;            /* key hash → last read/write (monotonic ms), for LRU */
    struct svc_map last_hb;                /* segment id → last heartbeat or mount (monotonic ms) */
    struct svc_map hb_gap;                 /* segment id → ms between its last two heartbeats (its
                                              period as seen here: check_liveness's silences) */
    struct svc_map unreachable;            /* segment id → last ReportUnreachable (monotonic ms) */
    struct svc_map segments;               /* segment id → Kvp__SegmentState + 1 (FSM's view) */
    struct svc_map lost_sent;              /* segment id → time a SegmentLost was submitted */
    struct svc_map heard_via;              /* segment id → 1 mount, 2 heartbeat: what last_hb was */
    struct svc_map client_wrote;           /* segment id → last PutEnd naming it in written_segments */
    struct svc_map successor;              /* segment id → last mount under its name from its host, refused */
    /* The "segment lost" rule (liveness.h): blind periods, self-suspicion; restarted on every
     * leadership change. `verdicts` holds the last check's verdicts (status, kvpoolctl segments). */
    struct kvp_liveness liveness;
    struct kvp_liveness_verdict *verdicts;
    size_t n_verdicts, cap_verdicts;
    uint64_t verdicts_at_ms;
    uint64_t segments_fresh_ms;            /* when `segments` was last refreshed; 0 = never as leader */
    bool status_refresh_inflight;
    uint64_t fsm_pending_puts;             /* from the last refresh: RevokeExpired only when > 0 */
    uint64_t fsm_quarantined_bytes;        /* from the last refresh: QuarantineRelease only when > 0 */
    zlist_t *hb_waiters;                   /* struct svc_hb_waiter *, answered at the next refresh */
    bool revoke_inflight;                  /* one RevokeExpired at a time */
    bool release_inflight;                 /* one QuarantineRelease at a time */
    uint64_t release_sent_ms;              /* when the last one was submitted (svc_release_now) */

    /* Data-plane probe of reported segments (ReportUnreachable), off the service thread. */
    struct kvp_rt_actor *prober;           /* child actor running kvp_xfer_probe (service_actor.c) */
    zhashx_t *endpoints;                    /* "segment id" → data-plane endpoint (from refreshes) */
    struct svc_map probing;                /* segment id → time the last probe started (one per 2 s) */
    unsigned probes_out;                   /* probes sent to the prober, not yet answered */

    /* Re-replication and drain (service_repair.c), made at first use. */
    struct svc_repair *repair;

    /* Memory pressure: watermark eviction, prefix hints, release holds (service_evict.c). */
    struct svc_evict *evict;

    /* Bad-frame log rate limit. */
    uint64_t bad_window_ms;
    unsigned bad_in_window;
    uint64_t bad_total;

    /* Reads answered on this thread (kvp_raftlog_read_begin) rather than on the raft thread. */
    uint64_t local_reads;

    /* Latency split of client requests that went through the raft log (svc_submit), summed in
     * µs: frame received → submitted, submitted → result event taken off the events socket,
     * result event → handled (reply sent). ClusterStatus "request_latency". */
    uint64_t cur_recv_us;                  /* receive time of the request being dispatched */
    /* The request being dispatched is decoded into this arena and released by one reset after
     * its handler returns (wire/arena.h): handlers copy whatever they keep. */
    struct kvp_wire_arena req_arena;
    uint64_t rl_requests;
    uint64_t rl_in_us;
    uint64_t rl_raft_us;
    uint64_t rl_out_us;

    /* Metrics (service_metrics.c): counters, the published snapshot and the HTTP endpoint. */
    struct svc_metrics *metrics;

    /* One-commit put (service_put.c): this leader's reservations and puts in flight. */
    struct svc_put *put;

    /* Range verification asks of this leadership (service_verify.c), made at first use. */
    struct svc_verify *verify;
    /* Pending intents being resolved by this leader (service_resolve.c), made at first use. */
    struct svc_resolve *resolve;

    /* RDMA segments' FenceWriter/Fenced (service_fence.c, fence_track.h). */
    struct kvp_fence_track fence;
    uint64_t fence_logged_ms;              /* wall ms of the last "release held" WARN */
    /* FenceWriter.writers of the answer being built (svc_fence_fill; packed before it returns) */
    Kvp__WriterSelector fence_sel[KVP_FENCE_SELECTORS_MAX];
    Kvp__WriterSelector *fence_selp[KVP_FENCE_SELECTORS_MAX];

    /* MountSegment calls taken by this master, by caller (ROUTER identity) and call (req_id >> 8:
     * the session's attempts of one call differ in the low 8 bits). The session resends a call
     * whose attempt timed out, and each copy of a mount committed a new segment id ("remounted,
     * the old one is lost"): the segment kept the id of the answer it got while the masters
     * placed replicas under a later one, and a client's first put there failed ("no data token
     * for this segment"), then the segment's heartbeat found its id lost and it remounted again.
     * A copy of a call still in flight is dropped (the first copy's answer completes the call);
     * a copy of one answered OK gets the same segment id again. service_rpc.c. */
    struct svc_mount_seen {
        zframe_t *identity; /* NULL = free slot */
        uint64_t call;      /* req_id >> 8 */
        uint64_t nonce;     /* MountSegmentReq.mount_nonce (0: none): a later call with the same
                             * nonce is a new try of the same mount, from any socket */
        uint32_t segment_id; /* 0 while in flight */
        uint64_t at_ms;
    } mount_seen[16];
    unsigned mount_seen_next;
};

/* ------------------------------------------------------------------ shared helpers */

uint64_t svc_now_ms(void);

/** The control address of `id` ("" when unknown). */
const char *svc_member_address(const struct kvp_master_service *s, uint64_t id);

/** Encode `resp` (req_id set from req_id) and send it to identity. Does not take ownership. */
void svc_reply(struct kvp_master_service *s, zframe_t *identity, uint64_t req_id, Kvp__Response *resp);
/** Reply with a status and an error string, no body (NOT_LEADER adds the leader hint). */
void svc_reply_status(struct kvp_master_service *s, zframe_t *identity, uint64_t req_id, int status,
                      const char *error);
void svc_reply_empty(struct kvp_master_service *s, zframe_t *identity, uint64_t req_id);

/** New pending entry for a request (identity duplicated) or internal work (identity NULL). */
struct svc_pending *svc_pending_new(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req);
void svc_pending_free(struct svc_pending *p);

/** Pack cmd_body into a Command (now_wall_ms, term) and submit it under p->corr. On error the
 * pending entry is freed and, for a request, answered with the error. */
int svc_submit(struct kvp_master_service *s, struct svc_pending *p, Kvp__Command *cmd);
/** Set c's oneof body to body (a message of the case bc), through the Command descriptor: a new
 * command needs no switch. An unknown or non-message case leaves c's body NOT_SET. */
void svc_command_set(Kvp__Command *c, Kvp__Command__BodyCase bc, void *body);
/** Submit internal work (kind: enum svc_internal_kind) as the command bc with body; its result
 * (or a submit error) goes to svc_on_result's internal step. Nothing happens without memory. */
void svc_submit_internal(struct kvp_master_service *s, int kind, Kvp__Command__BodyCase bc, void *body,
                         uint32_t segment_id);
/** Pack req as a raw Request and run it as a raftlog query under p->corr (same error rule). */
int svc_query(struct kvp_master_service *s, struct svc_pending *p, const Kvp__Request *req);

/* service_rpc.c: one handler per request type; dispatch. */
void svc_dispatch(struct kvp_master_service *s, zframe_t *identity, Kvp__Request *req);
/* service_rpc.c: a raftlog result for a pending request or internal work. */
void svc_on_result(struct kvp_master_service *s, struct svc_pending *p, int kind, int status,
                   const uint8_t *data, size_t len);

/* service.c: drop pending entries that raftlog never answered (a bug guard; logged). */
void svc_pending_sweep(struct kvp_master_service *s);
/** A MountSegment entry dropped without a result (the sweep): forget its dedupe slot, so that
 *  a resent copy is a new try instead of being dropped as "still in flight" for the slot's
 *  60 s. Any other entry: nothing. */
void svc_mount_seen_forget(struct kvp_master_service *s, const struct svc_pending *p);

/* service_soft.c: soft state and timers. */
void svc_soft_reset(struct kvp_master_service *s);
bool svc_in_election_grace(const struct kvp_master_service *s);
/** The wall-clock ms at which the monotonic time mono_ms falls (leases are kept in monotonic ms). */
uint64_t svc_mono_to_wall(uint64_t mono_ms);
/** The lease horizon, in wall-clock ms, that this leader commits with a command freeing the
 * objects whose key hashes are given (n may be 0): the latest of their leases here and, during
 * the election grace, the grace's end plus two election timeouts (an older leader's leases
 * expire by then). 0 = none. */
uint64_t svc_lease_horizon(const struct kvp_master_service *s, const uint64_t *key_hashes, size_t n);
/** Submit a QuarantineRelease now unless one is in flight (leader only). */
void svc_release_now(struct kvp_master_service *s);
bool svc_key_leased(const struct kvp_master_service *s, uint64_t key_hash);
void svc_grant_lease(struct kvp_master_service *s, uint64_t key_hash);
void svc_touch(struct kvp_master_service *s, uint64_t key_hash);
void svc_on_heartbeat_req(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req);

/* service_fence.c: FenceWriter/Fenced with RDMA segments (fence_track.h). */
/** A heartbeat's rdma_writers and Fenced; an answered fence submits a QuarantineRelease. */
void svc_fence_on_heartbeat(struct kvp_master_service *s, uint32_t seg, const Kvp__HeartbeatReq *hb);
/** Set hb->fence_writer (fw is the storage) while a fence of seg's writers is outstanding. */
void svc_fence_fill(struct kvp_master_service *s, uint32_t seg, Kvp__HeartbeatResp *hb, Kvp__FenceWriter *fw);
/** A put failed at wall_ms (0: hold everything): ask every RDMA segment to fence its writers. */
void svc_fence_note_failure(struct kvp_master_service *s, uint64_t wall_ms, const char *why);
/** A put written by the RDMA writers (writer_id, writer_mask) select failed at wall_ms: ask every
 *  RDMA segment to fence those writers only (writer_id or mask 0: every writer; fence_track.h). */
void svc_fence_note_writer_failure(struct kvp_master_service *s, uint64_t wall_ms, uint64_t writer_id,
                                   uint64_t writer_mask, const char *why);
/** A new leadership: forget every segment's fences; seqs start above any an older leader used. */
void svc_fence_reset(struct kvp_master_service *s, uint64_t term);
/** The time to stamp on a QuarantineRelease: now, or earlier while a fence is outstanding. */
uint64_t svc_fence_release_time(struct kvp_master_service *s, uint64_t now_wall_ms);
void svc_on_status_refresh(struct kvp_master_service *s, int status, const Kvp__Response *resp);
void svc_request_status_refresh(struct kvp_master_service *s);
int svc_timers_start(struct kvp_master_service *s);
/* service_version.c: ask the other members for their feature level; the cluster's level now. */
int svc_version_start(struct kvp_master_service *s);
void svc_version_stop(struct kvp_master_service *s);
/* A new leader whose state is current (its first segment table read): the committed feature
 * level read from the FSM now, not at the next version tick. Not inside a read_begin. */
void svc_version_refresh(struct kvp_master_service *s);
uint32_t svc_feature_level(struct kvp_master_service *s);
/* AddMember (p tracked by admin_pending, members[slot] filled): added at once while no level
 * above 1 is committed; else once the new member reports at least the committed level, and
 * refused with KVP_ERR_VERSION when it does not within 3 s (docs/master.md "Committed feature
 * level"). Answers p itself on any refusal. */
void svc_version_add_member(struct kvp_master_service *s, struct svc_pending *p, int slot, uint64_t id,
                            const char *raft_address);
/* service_actor.c: the service actor. Service thread only, inside a callback (s->ctx set). */
/** Run fn every every_ms (first after every_ms). Errors: KVP_ERR_INVALID (no ctx, table full), NOMEM. */
int svc_timer_every(struct kvp_master_service *s, uint32_t every_ms, svc_timer_fn fn);
/** Call fn when sock is readable. Errors: KVP_ERR_INVALID (no ctx, table full), EXISTS, NOMEM. */
int svc_watch(struct kvp_master_service *s, zsock_t *sock, svc_watch_fn fn);
void svc_unwatch(struct kvp_master_service *s, zsock_t *sock);
/** Serve nothing more and have run() stop the actor (s->fatal says why). */
void svc_stop_self(struct kvp_master_service *s);
/** Start the prober child actor; ask it to probe a segment (the answer: svc_on_probe_result). */
int svc_prober_start(struct kvp_master_service *s);
int svc_prober_ask(struct kvp_master_service *s, uint32_t segment_id, const char *endpoint, uint32_t timeout_ms);
/* service.c: watch the ROUTER and the raftlog events, start every timer (the actor's init). */
int svc_loop_start(struct kvp_master_service *s);
/* service_soft.c: ask the prober about a reported segment (at most one per 2 s); its answer. */
void svc_probe_segment(struct kvp_master_service *s, uint32_t segment_id);
void svc_on_probe_result(struct kvp_master_service *s, uint32_t segment_id, int rc);
/** Parse an FSM ClusterStatus JSON document into s->segments. Returns KVP_OK or KVP_ERR_MALFORMED. */
int svc_segments_from_json(struct kvp_master_service *s, const char *json);

/* service_put.c: the one-commit put (docs/master.md "One-commit put"). try_*: true when the
 * request was handled (answered or submitted) here; false: take the PutStart/PutEnd path. */
int svc_put_new(struct kvp_master_service *s);
void svc_put_destroy(struct kvp_master_service *s);
void svc_put_reset(struct kvp_master_service *s);
void svc_put_tick(struct kvp_master_service *s);
bool svc_put_revoke_due(struct kvp_master_service *s);
bool svc_put_has_live(const struct kvp_master_service *s);
bool svc_put_pending_key(const struct kvp_master_service *s, const char *key);
void svc_put_on_reserve(struct kvp_master_service *s, struct svc_pending *p, int status, Kvp__Response *resp);
bool svc_put_try_start(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req);
bool svc_put_try_end(struct kvp_master_service *s, zframe_t *identity, Kvp__Request *req);
bool svc_put_try_revoke(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req);
/* Level 6 (docs/master.md "Intent overlapped with the transfer (level 6)"), service_put.c:
 * PutIntent's handler; a PutSealCmd's result; the leader's reads of keys it sealed in memory
 * (the visibility callback for kvp_master_fsm_query_vis, NULL when none is sealing); a read that
 * must wait for a seal (a read through the raft thread cannot see this leader's memory): held
 * and dispatched again once the seal applied (true), or false when none of its keys is sealing. */
void svc_put_on_intent(struct kvp_master_service *s, zframe_t *identity, Kvp__Request *req);
void svc_put_on_seal(struct kvp_master_service *s, struct svc_pending *p, int status, Kvp__Response *resp);
/* Submit the seals acknowledged and not yet in the log, as one PutSealCmd (svc_submit does it
 * before any other command, the 10 ms tick otherwise). */
void svc_put_flush_seals(struct kvp_master_service *s);
const struct kvp_fsm_qvis *svc_put_read_vis(struct kvp_master_service *s);
bool svc_put_hold_read(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req);
/* Level 6: the keys of read req (GetReplicaList, Exists, GetSize) whose FSM state is a pending
 * intent of an older term (a put an older leader may have acknowledged, not sealing here), at
 * most cap into out (pointers into req). Under kvp_raftlog_read_begin. 0 also for a read held
 * to its limit already. */
size_t svc_put_intent_keys(struct kvp_master_service *s, const Kvp__Request *req, const char **out, size_t cap);
/* Level 6: hold such a read (up to 3 s from its arrival) and have the resolver verify those keys
 * now (after kvp_raftlog_read_end): it goes again when the resolver's seal or revoke applies. */
void svc_put_hold_intent(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req,
                         const char *const *keys, size_t n);
/* Level 6: a PutRevoke of intent (key, op_id) is submitted with p (SVC_INT_INTENT_REVOKE,
 * SVC_INT_RESOLVE_REVOKE): until its result, a PutEnd of that key is not acknowledged early
 * (try_seal); p keeps the key's hash and op_id. KVP_ERR_NOMEM: not noted, do not submit. */
int svc_put_revoking_note(struct kvp_master_service *s, struct svc_pending *p, const char *key, uint64_t op_id);
/* Its result came (any status). */
void svc_put_revoking_done(struct kvp_master_service *s, const struct svc_pending *p);
/* Level 6: every held read goes again (a seal or a revoke applied). */
void svc_put_redispatch_held(struct kvp_master_service *s);
/* A read reaching a leader before its state is current (before its term's barrier applied, or
 * before its first segment table): held until on_leader_ready dispatches it again (or its
 * limit), so that an older leader's pending intent in it is held for the resolver rather than
 * answered NOT_FOUND by the raft thread (DESIGN.md C4). false: not held (not such a leader, the
 * held table full, or held to its limit already). */
bool svc_put_hold_unready(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req);
/* Level 6: is (key, op_id) a put this leader acknowledged whose PutSealCmd has not applied yet? */
bool svc_put_sealing_op(const struct kvp_master_service *s, const char *key, uint64_t op_id);
/* Level 6 counters into the status document's soft_state (put_intents, puts_sealed_early,
 * puts_sealing). */
struct json_t;
void svc_put_status(struct kvp_master_service *s, struct json_t *soft);

/* service_status.c: the ClusterStatus document and Members. */
char *svc_status_json(struct kvp_master_service *s, const char *fsm_json);
/* Fill mr from kvp_raftlog_get_info() into *info; mr's strings point into *info and s. */
void svc_fill_members(struct kvp_master_service *s, struct kvp_raftlog_info *info, Kvp__MembersResp *mr,
                      Kvp__Member *storage, Kvp__Member **ptrs, size_t cap);
void svc_refresh_leadership(struct kvp_master_service *s);
void svc_set_leadership(struct kvp_master_service *s, bool is_leader, uint64_t leader_id, uint64_t term);

/* service_auth.c: authentication of the control port and the tenant scope of requests
 * (docs/security.md). start: before the ROUTER binds; loop_start: in run; admit: true when the
 * request may be dispatched (keys scoped to the sender's tenant), false when it was refused and
 * answered KVP_ERR_DENIED. */
int svc_auth_start(struct kvp_master_service *s);
int svc_auth_loop_start(struct kvp_master_service *s);
bool svc_auth_admit(struct kvp_master_service *s, zframe_t *identity, zframe_t *body, Kvp__Request *req);
int svc_auth_peer_socket(struct kvp_master_service *s, zsock_t *dealer, const char *addr);
void svc_auth_stop(struct kvp_master_service *s);
void svc_auth_on_data_token(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req);

#endif
