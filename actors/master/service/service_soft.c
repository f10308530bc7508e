/*
 * service_soft.c — the leader-only soft state of the master service and its timers
 * (DESIGN.md "Core flows: Get / Segments", "Master failover"; docs/master.md "Soft state"):
 *  - read leases: GetReplicaList grants default_kv_lease_ttl per key; Remove of a leased key is
 *    refused unless force; a new leader treats every object as leased for one lease TTL;
 *  - last access per key (LRU input for eviction);
 *  - last heartbeat per segment (a mount counts as one) and the segment liveness check;
 *  - periodic RevokeExpired and QuarantineRelease commands.
 * None of it is replicated: a new leader starts empty and is conservative for one lease TTL.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <xxhash.h>

#include "actors/master/service/service_evict.h"
#include "actors/master/service/service_repair.h"
#include "actors/master/service/service_state.h"
#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"

/* ------------------------------------------------------------------ u64 map */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void svc_map_init(struct svc_map *m)
{
    memset(m, 0, sizeof *m);
}

void svc_map_fini(struct svc_map *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

void svc_map_clear(struct svc_map *m)
{
    if (m->cap)
        memset(m->keys, 0, m->cap * sizeof *m->keys);
    m->n = 0;
}

static size_t map_find(const struct svc_map *m, uint64_t key)
{
    size_t mask = m->cap - 1;
    size_t i = (size_t)mix64(key) & mask;
    while (m->keys[i] && m->keys[i] != key)
        i = (i + 1) & mask;
    return i;
}

static int map_grow(struct svc_map *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 64;
    struct svc_map nm = {.cap = ncap};
    nm.keys = calloc(ncap, sizeof *nm.keys);
    nm.vals = malloc(ncap * sizeof *nm.vals);
    if (!nm.keys || !nm.vals) {
        free(nm.keys);
        free(nm.vals);
        return KVP_ERR_NOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i])
            continue;
        size_t j = map_find(&nm, m->keys[i]);
        nm.keys[j] = m->keys[i];
        nm.vals[j] = m->vals[i];
        nm.n++;
    }
    free(m->keys);
    free(m->vals);
    *m = nm;
    return KVP_OK;
}

int svc_map_put(struct svc_map *m, uint64_t key, uint64_t val)
{
    if (key == 0)
        return KVP_ERR_INVALID;
    /* Grow past 3/4 full: linear probing stays short there, and a million tracked keys cost
     * 16-32 bytes each (the master's memory per object is a benchmark target). */
    if ((m->n + 1) * 4 > m->cap * 3 && map_grow(m) != KVP_OK)
        return KVP_ERR_NOMEM;
    size_t i = map_find(m, key);
    if (!m->keys[i]) {
        m->keys[i] = key;
        m->n++;
    }
    m->vals[i] = val;
    return KVP_OK;
}

bool svc_map_get(const struct svc_map *m, uint64_t key, uint64_t *val)
{
    if (key == 0 || m->cap == 0)
        return false;
    size_t i = map_find(m, key);
    if (!m->keys[i])
        return false;
    if (val)
        *val = m->vals[i];
    return true;
}

bool svc_map_del(struct svc_map *m, uint64_t key, uint64_t *val)
{
    if (key == 0 || m->cap == 0)
        return false;
    size_t mask = m->cap - 1;
    size_t i = map_find(m, key);
    if (!m->keys[i])
        return false;
    if (val)
        *val = m->vals[i];
    /* Backward-shift deletion: pull later entries of the probe run into the hole. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->keys[j])
            break;
        size_t home = (size_t)mix64(m->keys[j]) & mask;
        bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->keys[i] = 0;
    m->n--;
    return true;
}

void svc_map_filter(struct svc_map *m, bool (*keep)(uint64_t key, uint64_t val, void *ctx), void *ctx)
{
    if (m->n == 0)
        return;
    size_t cap = m->cap;
    uint64_t *keys = malloc(cap * sizeof *keys);
    uint64_t *vals = malloc(cap * sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return; /* keep everything: the conservative outcome */
    }
    memcpy(keys, m->keys, cap * sizeof *keys);
    memcpy(vals, m->vals, cap * sizeof *vals);
    svc_map_clear(m);
    for (size_t i = 0; i < cap; i++)
        if (keys[i] && keep(keys[i], vals[i], ctx))
            svc_map_put(m, keys[i], vals[i]); /* cannot grow: fewer entries than before */
    free(keys);
    free(vals);
}

bool svc_map_next(const struct svc_map *m, size_t *pos, uint64_t *key, uint64_t *val)
{
    while (*pos < m->cap) {
        size_t i = (*pos)++;
        if (m->keys[i]) {
            *key = m->keys[i];
            *val = m->vals[i];
            return true;
        }
    }
    return false;
}

uint64_t svc_key_hash(const char *key)
{
    uint64_t h = XXH3_64bits(key ? key : "", key ? strlen(key) : 0);
    return h ? h : 1;
}

/* ------------------------------------------------------------------ leases, LRU */

static void answer_hb_waiters(struct kvp_master_service *s, int status);

void svc_soft_reset(struct kvp_master_service *s)
{
    svc_map_clear(&s->leases);
    svc_map_clear(&s->last_access);
    svc_map_clear(&s->last_hb);
    svc_map_clear(&s->hb_gap);
    svc_map_clear(&s->unreachable);
    svc_map_clear(&s->segments);
    svc_map_clear(&s->lost_sent);
    svc_map_clear(&s->heard_via);
    svc_map_clear(&s->client_wrote);
    svc_map_clear(&s->successor);
    svc_map_clear(&s->probing);
    s->n_verdicts = 0;
    /* A leadership change is a blind period: every segment gets a fresh grace (liveness.h). */
    kvp_liveness_restart(&s->liveness, svc_now_ms(), s->is_leader ? "became leader" : "lost leadership");
    svc_repair_reset(s);
    s->segments_fresh_ms = 0;
    s->status_refresh_inflight = false;
    s->revoke_inflight = false;
    s->release_inflight = false;
    svc_evict_reset(s);
    svc_put_reset(s);
    svc_fence_reset(s, s->term);
    svc_resolve_reset(s);
    svc_verify_reset(s);
    if (!s->is_leader)
        answer_hb_waiters(s, KVP_ERR_NOT_LEADER);
}

bool svc_in_election_grace(const struct kvp_master_service *s)
{
    return s->is_leader && svc_now_ms() < s->leader_since_ms + s->cfg.default_kv_lease_ttl_ms;
}

uint64_t svc_mono_to_wall(uint64_t mono_ms)
{
    uint64_t now = svc_now_ms(), wall = kvp_clock_wall_ms();
    return mono_ms >= now ? wall + (mono_ms - now) : (wall > now - mono_ms ? wall - (now - mono_ms) : 0);
}

uint64_t svc_lease_horizon(const struct kvp_master_service *s, const uint64_t *key_hashes, size_t n)
{
    uint64_t now = svc_now_ms(), until = 0, exp;
    for (size_t i = 0; i < n; i++)
        if (svc_map_get(&s->leases, key_hashes[i], &exp) && exp > now && exp > until)
            until = exp;
    /* An older leader's leases: granted before this node's election, or (a deposed leader still
     * answering local reads, docs/raftlog.md) at most about an election timeout after it; two
     * election timeouts of margin. */
    uint64_t grace_end = s->leader_since_ms + s->cfg.default_kv_lease_ttl_ms + 2 * s->cfg.election_timeout_ms;
    if (svc_in_election_grace(s) && grace_end > until)
        until = grace_end;
    return until ? svc_mono_to_wall(until) : 0;
}

void svc_release_now(struct kvp_master_service *s)
{
    /* At most one every 50 ms: writers waiting for space retry every 5-200 ms each, and every
     * QuarantineRelease is a Raft entry even when nothing is due. */
    uint64_t now = svc_now_ms();
    if (!s->is_leader || s->release_inflight || (s->release_sent_ms && now - s->release_sent_ms < 50))
        return;
    Kvp__QuarantineReleaseCmd body = KVP__QUARANTINE_RELEASE_CMD__INIT;
    s->release_inflight = true;
    s->release_sent_ms = now;
    svc_submit_internal(s, SVC_INT_QUARANTINE_RELEASE, KVP__COMMAND__BODY_QUARANTINE_RELEASE, &body, 0);
}

bool svc_key_leased(const struct kvp_master_service *s, uint64_t key_hash)
{
    uint64_t exp = 0;
    return svc_map_get(&s->leases, key_hash, &exp) && exp > svc_now_ms();
}

void svc_grant_lease(struct kvp_master_service *s, uint64_t key_hash)
{
    svc_map_put(&s->leases, key_hash, svc_now_ms() + s->cfg.default_kv_lease_ttl_ms);
}

void svc_touch(struct kvp_master_service *s, uint64_t key_hash)
{
    svc_map_put(&s->last_access, key_hash, svc_now_ms());
}

/* ------------------------------------------------------------------ segments and heartbeats */

static int state_from_json(json_t *v)
{
    if (json_is_integer(v))
        return (int)json_integer_value(v);
    const char *str = json_string_value(v);
    if (!str)
        return KVP__SEGMENT_STATE__SEGMENT_ACTIVE;
    if (strcasestr(str, "lost"))
        return KVP__SEGMENT_STATE__SEGMENT_LOST;
    if (strcasestr(str, "drain"))
        return KVP__SEGMENT_STATE__SEGMENT_DRAINING;
    return KVP__SEGMENT_STATE__SEGMENT_ACTIVE;
}

int svc_segments_from_json(struct kvp_master_service *s, const char *json)
{
    json_error_t err;
    json_t *root = json_loads(json, 0, &err);
    json_t *segs = root ? json_object_get(root, "segments") : NULL;
    if (!json_is_array(segs)) {
        kvp_log_warn(s->actor, "state machine status has no segments array (%s)", root ? "shape" : err.text);
        json_decref(root);
        return KVP_ERR_MALFORMED;
    }
    svc_map_clear(&s->segments);
    if (s->endpoints)
        zhashx_purge(s->endpoints);
    size_t i;
    json_t *seg;
    json_array_foreach(segs, i, seg) {
        json_int_t id = json_integer_value(json_object_get(seg, "id"));
        if (id <= 0)
            continue;
        int st = state_from_json(json_object_get(seg, "state"));
        svc_map_put(&s->segments, (uint64_t)id, (uint64_t)st + 1);
        const char *ep = json_string_value(json_object_get(seg, "endpoint"));
        if (s->endpoints && ep && *ep && st != KVP__SEGMENT_STATE__SEGMENT_LOST) {
            char idbuf[24];
            snprintf(idbuf, sizeof idbuf, "%lld", (long long)id);
            zhashx_insert(s->endpoints, idbuf, (void *)ep); /* duplicated (strdup) */
        }
    }
    s->fsm_pending_puts = (uint64_t)json_integer_value(json_object_get(root, "pending_puts"));
    s->fsm_quarantined_bytes = (uint64_t)json_integer_value(json_object_get(root, "quarantined_bytes"));
    json_decref(root);
    s->segments_fresh_ms = svc_now_ms();
    /* Reports that arrived before the segment's endpoint was known get their probe now. */
    size_t pos = 0;
    uint64_t rk, rv;
    while (svc_map_next(&s->unreachable, &pos, &rk, &rv))
        svc_probe_segment(s, (uint32_t)rk);
    return KVP_OK;
}

static void answer_heartbeat(struct kvp_master_service *s, zframe_t *identity, uint64_t req_id, uint32_t seg)
{
    uint64_t st = 0;
    bool known = svc_map_get(&s->segments, seg, &st);
    if (!known || st - 1 == KVP__SEGMENT_STATE__SEGMENT_LOST || svc_map_get(&s->lost_sent, seg, NULL)) {
        svc_reply_status(s, identity, req_id, KVP_ERR_NOT_FOUND,
                         "segment unknown or lost: remount as a new segment");
        return;
    }
    uint64_t now = svc_now_ms(), prev = 0;
    if (svc_map_get(&s->last_hb, seg, &prev) && now > prev)
        svc_map_put(&s->hb_gap, seg, now - prev);
    svc_map_put(&s->last_hb, seg, now);
    svc_map_put(&s->heard_via, seg, 2);
    Kvp__Response resp = KVP__RESPONSE__INIT;
    Kvp__HeartbeatResp hb = KVP__HEARTBEAT_RESP__INIT;
    Kvp__FenceWriter fw;
    hb.state = (Kvp__SegmentState)(st - 1);
    svc_fence_fill(s, seg, &hb, &fw);
    svc_verify_fill(s, seg, &hb);
    resp.body_case = KVP__RESPONSE__BODY_HEARTBEAT;
    resp.heartbeat = &hb;
    svc_reply(s, identity, req_id, &resp);
}

static void answer_hb_waiters(struct kvp_master_service *s, int status)
{
    struct svc_hb_waiter *w;
    uint64_t now = svc_now_ms();
    while ((w = zlist_pop(s->hb_waiters))) {
        if (w->deadline_ms && now > w->deadline_ms)
            ; /* the caller gave up */
        else if (status == KVP_OK)
            answer_heartbeat(s, w->identity, w->req_id, w->segment_id);
        else
            svc_reply_status(s, w->identity, w->req_id, status, "segment table unavailable");
        zframe_destroy(&w->identity);
        free(w);
    }
}

void svc_request_status_refresh(struct kvp_master_service *s)
{
    if (!s->is_leader || s->status_refresh_inflight)
        return;
    struct svc_pending *p = svc_pending_new(s, NULL, NULL);
    if (!p)
        return;
    p->internal = SVC_INT_STATUS_REFRESH;
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__ClusterStatusReq cs = KVP__CLUSTER_STATUS_REQ__INIT;
    req.body_case = KVP__REQUEST__BODY_CLUSTER_STATUS;
    req.cluster_status = &cs;
    s->status_refresh_inflight = true;
    svc_query(s, p, &req); /* on error svc_query runs the result path, clearing the flag */
}

/* A new leader's first segment table: its state is current from here (the query ran after its
 * term's barrier), so what waited for the periodic timers runs now, not up to a second later:
 * the committed feature level (the one-commit put), this term's first reservations, the release
 * of quarantine already due and an eviction scan. Safe as early as this: every freed extent
 * carries its lease horizon (docs/master.md "Leases and failover"), reservations are fenced by
 * term, and what this leader evicts in its election grace is held past the grace's end. */
static void on_leader_ready(struct kvp_master_service *s)
{
    svc_version_refresh(s);
    svc_put_tick(s);
    svc_release_now(s);
    svc_evict_kick(s);
    svc_resolve_tick(s); /* intents an older leader left (service_resolve.c) */
    svc_put_redispatch_held(s); /* reads that came before this (svc_put_hold_unready) */
}

void svc_on_status_refresh(struct kvp_master_service *s, int status, const Kvp__Response *resp)
{
    s->status_refresh_inflight = false;
    if (status == KVP_OK && resp && resp->status == KVP_OK && resp->cluster_status && resp->cluster_status->json) {
        bool first = s->is_leader && !s->segments_fresh_ms;
        if (svc_segments_from_json(s, resp->cluster_status->json) != KVP_OK)
            status = KVP_ERR_INTERNAL;
        else if (first)
            on_leader_ready(s);
        /* The query ran on the raft thread as leader: quorum contact confirmed (raftlog.h). */
        uint64_t stale_since = s->liveness.quorum_ok_ms;
        if (s->is_leader && kvp_liveness_quorum_ok(&s->liveness, svc_now_ms()))
            kvp_log_warn(s->actor, "quorum contact confirmed again after %llu ms without: every segment gets a "
                         "fresh grace of client_ttl before it can be declared lost",
                         (unsigned long long)(svc_now_ms() - stale_since));
    } else if (status == KVP_OK) {
        status = resp ? resp->status : KVP_ERR_INTERNAL;
        if (status == KVP_OK)
            status = KVP_ERR_INTERNAL;
    }
    if (status == KVP_OK || !s->is_leader)
        answer_hb_waiters(s, status == KVP_OK ? KVP_OK : KVP_ERR_NOT_LEADER);
    else if (zlist_size(s->hb_waiters) > 0)
        kvp_log_debug(s->actor, "segment table refresh failed (%s); heartbeats wait", kvp_strerror(status));
}

/* Heartbeat: soft state only. The answer is the segment's state as the FSM knows it, or
 * NOT_FOUND (lost / unknown: the segment remounts as new). A new leader answers only once it
 * has read the segment table from the FSM; until then heartbeats wait (bounded by their
 * deadline), never a wrong NOT_FOUND that would make a live segment drop its data. */
void svc_on_heartbeat_req(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req)
{
    uint32_t seg = req->heartbeat->segment_id;
    if (seg == 0) {
        svc_reply_status(s, identity, req->req_id, KVP_ERR_INVALID, "segment_id 0");
        return;
    }
    svc_fence_on_heartbeat(s, seg, req->heartbeat);
    svc_verify_on_heartbeat(s, seg, req->heartbeat);
    if (s->segments_fresh_ms) {
        answer_heartbeat(s, identity, req->req_id, seg);
        return;
    }
    struct svc_hb_waiter *w = calloc(1, sizeof *w);
    if (!w || !(w->identity = zframe_dup(identity)) || zlist_append(s->hb_waiters, w) != 0) {
        if (w)
            zframe_destroy(&w->identity);
        free(w);
        svc_reply_status(s, identity, req->req_id, KVP_ERR_NOMEM, "out of memory");
        return;
    }
    w->req_id = req->req_id;
    w->segment_id = seg;
    w->deadline_ms = req->timeout_ms ? svc_now_ms() + req->timeout_ms : 0;
    svc_request_status_refresh(s);
}

/* ------------------------------------------------------------------ timers */

/* Every ~200 ms: revoke pending puts past their deadline (their space goes to quarantine). */
static int on_revoke_timer(struct kvp_master_service *s)
{
    svc_put_tick(s); /* reservations kept fresh, puts past their deadline dropped */
    if (!s->is_leader || s->revoke_inflight)
        return 0;
    /* Idle cluster: no Raft entry five times a second for nothing. The table is refreshed every
     * second, far inside any put deadline, and PutStart results also mark puts pending. At
     * feature level 3 it also retires reservations: then at least once a second. */
    if (s->segments_fresh_ms && s->fsm_pending_puts == 0 && !svc_put_revoke_due(s))
        return 0;
    Kvp__RevokeExpiredCmd body = KVP__REVOKE_EXPIRED_CMD__INIT;
    s->revoke_inflight = true;
    svc_submit_internal(s, SVC_INT_REVOKE_EXPIRED, KVP__COMMAND__BODY_REVOKE_EXPIRED, &body, 0);
    return 0;
}

/* The segment liveness check (DESIGN.md "Core flows: Segments"; the rule: liveness.h,
 * docs/operations.md "How a segment is declared lost"). Every LOST decision is logged with its
 * evidence; a withheld episode gets one WARN when it begins and one INFO when it ends. */
static void check_liveness(struct kvp_master_service *s)
{
    if (!s->segments_fresh_ms)
        return;
    uint64_t now = svc_now_ms();
    size_t n = s->segments.n;
    if (n > s->cap_verdicts) {
        struct kvp_liveness_verdict *nv = realloc(s->verdicts, n * sizeof *nv);
        if (!nv)
            return; /* no decision this tick: the conservative outcome */
        s->verdicts = nv;
        s->cap_verdicts = n;
    }
    struct kvp_liveness_seg *in = calloc(n ? n : 1, sizeof *in);
    if (!in)
        return;
    size_t pos = 0, k = 0;
    uint64_t seg, st;
    while (svc_map_next(&s->segments, &pos, &seg, &st) && k < n) {
        if (st - 1 == KVP__SEGMENT_STATE__SEGMENT_LOST || svc_map_get(&s->lost_sent, seg, NULL))
            continue;
        struct kvp_liveness_seg *g = &in[k++];
        g->id = (uint32_t)seg;
        (void)svc_map_get(&s->last_hb, seg, &g->last_hb_ms);
        (void)svc_map_get(&s->hb_gap, seg, &g->hb_gap_ms);
        (void)svc_map_get(&s->unreachable, seg, &g->reported_ms);
        g->probe_failed_ms = svc_repair_probe_failed_at(s, (uint32_t)seg);
        (void)svc_map_get(&s->client_wrote, seg, &g->client_wrote_ms);
        (void)svc_map_get(&s->successor, seg, &g->successor_ms);
    }
    struct kvp_liveness_events ev;
    kvp_liveness_check(&s->liveness, now, in, k, s->verdicts, &ev);
    s->n_verdicts = k;
    s->verdicts_at_ms = now;
    if (ev.blind_detected)
        kvp_log_warn(s->actor, "%s (a pause or a stall of this leader): silence before now does not count; every "
                     "segment gets a fresh grace of client_ttl %llu ms",
                     s->liveness.blind_why, (unsigned long long)s->cfg.client_ttl_ms);
    if (ev.withhold_began) {
        char ids[160] = "";
        size_t len = 0;
        for (size_t i = 0; i < k && len + 12 < sizeof ids; i++)
            if (s->verdicts[i].state == KVP_LIVENESS_WITHHELD)
                len += (size_t)snprintf(ids + len, sizeof ids - len, "%s%u", len ? "," : "", s->verdicts[i].id);
        kvp_log_warn(s->actor, "NOT declaring segments [%s] lost: %s; withheld until the evidence holds (kvpoolctl "
                     "segments shows why)",
                     ids, s->liveness.withheld_why);
    }
    if (ev.withhold_ended)
        kvp_log_info(s->actor, "withheld lost decisions: episode over (heard %u of %u segments): every segment gets "
                     "a fresh grace of client_ttl", s->liveness.heard, s->liveness.total);
    /* Silent for over half a ttl: probe its data plane (a witness when it answers, rule 5). At
     * most a few probes queued: the prober runs one at a time, so with many segments cut off
     * the queue must not grow without bound. */
    for (size_t i = 0; i < k && s->probes_out < 4; i++)
        if (s->verdicts[i].state != KVP_LIVENESS_LOST && s->verdicts[i].silent_ms > s->cfg.client_ttl_ms / 2)
            svc_probe_segment(s, s->verdicts[i].id);
    for (size_t i = 0; i < k; i++) {
        const struct kvp_liveness_verdict *v = &s->verdicts[i];
        if (v->state != KVP_LIVENESS_LOST)
            continue;
        kvp_log_warn(s->actor, "segment %u: declaring it lost: %s", v->id, v->why);
        svc_map_put(&s->lost_sent, v->id, now);
        Kvp__SegmentLostCmd body = KVP__SEGMENT_LOST_CMD__INIT;
        body.segment_id = v->id;
        svc_submit_internal(s, SVC_INT_SEGMENT_LOST, KVP__COMMAND__BODY_SEGMENT_LOST, &body, v->id);
    }
    free(in);
}

/* Every ~500 ms: release quarantine past fence_grace_ms, and check segment liveness. A new
 * leader releases at once too: every quarantine entry already waits for the leases on what it
 * held (the lease horizon each freeing command committed, docs/master.md "Leases and
 * failover"), so nothing here depends on leases only the old leader knew. */
static int on_release_timer(struct kvp_master_service *s)
{
    if (!s->is_leader)
        return 0;
    if (!s->segments_fresh_ms || s->fsm_quarantined_bytes > 0)
        svc_release_now(s);
    check_liveness(s);
    return 0;
}

static bool keep_unexpired(uint64_t key, uint64_t exp, void *ctx)
{
    return exp > *(uint64_t *)ctx;
}

static bool keep_recent(uint64_t key, uint64_t at, void *ctx)
{
    const uint64_t *a = ctx; /* a[0] now, a[1] ttl */
    return a[0] - at < a[1];
}

/* Every second: refresh the segment table from the FSM; drop expired leases and old reports. */
static int on_slow_timer(struct kvp_master_service *s)
{
    svc_pending_sweep(s); /* on followers too: entries from before a leadership loss */
    if (!s->is_leader)
        return 0;
    svc_request_status_refresh(s);
    uint64_t now = svc_now_ms();
    svc_map_filter(&s->leases, keep_unexpired, &now);
    uint64_t a[2] = {now, s->cfg.client_ttl_ms};
    svc_map_filter(&s->unreachable, keep_recent, a);
    svc_map_filter(&s->client_wrote, keep_recent, a);
    svc_map_filter(&s->successor, keep_recent, a);
    uint64_t b[2] = {now, 60000};
    svc_map_filter(&s->lost_sent, keep_recent, b);
    svc_map_filter(&s->probing, keep_recent, b);
    svc_verify_tick(s);
    svc_resolve_tick(s);
    return 0;
}

int svc_timers_start(struct kvp_master_service *s)
{
    if (svc_timer_every(s, 200, on_revoke_timer) != KVP_OK ||
        svc_timer_every(s, 500, on_release_timer) != KVP_OK ||
        svc_timer_every(s, 1000, on_slow_timer) != KVP_OK || svc_repair_start(s) != KVP_OK)
        return KVP_ERR_NOMEM;
    return KVP_OK;
}

/* ------------------------------------------------------------------ data-plane probe */

/* The prober's answer (service_actor.c): rc is kvp_xfer_probe's status for the segment, or
 * KVP_ERR_CLOSED for a probe that did not run (the prober stopped or failed): only counted. */
void svc_on_probe_result(struct kvp_master_service *s, uint32_t seg, int rc)
{
    if (s->probes_out > 0)
        s->probes_out--;
    if (rc == KVP_ERR_CLOSED)
        return; /* retried at the next check or report (svc_probe_segment) */
    if (rc == KVP_OK) {
        /* The data plane answers: the client's trouble was its own or transient, and the
         * process lives whatever its heartbeats say: a witness for liveness rule 5, like a
         * client's successful transfer (client_wrote is the map of data-plane witnesses). */
        svc_map_del(&s->unreachable, seg, NULL);
        svc_repair_note_probe(s, seg, rc);
        if (svc_map_get(&s->segments, seg, NULL))
            svc_map_put(&s->client_wrote, seg, svc_now_ms());
        kvp_log_info(s->actor, "segment %u: probe answered: the data plane lives (unreachable report cleared)",
                     seg);
    } else {
        svc_repair_note_probe(s, seg, rc);
        kvp_log_warn(s->actor, "segment %u: probe failed (%s): lost if its heartbeats stop too", seg,
                     kvp_strerror(rc));
    }
}

void svc_probe_segment(struct kvp_master_service *s, uint32_t seg)
{
    uint64_t started = 0;
    /* At most one probe per segment every 2 s, or every client_ttl / 4 when shorter: an answer
     * is a witness for client_ttl / 2 (liveness rule 5), so a kept segment is probed again in
     * time. */
    uint64_t every = s->cfg.client_ttl_ms / 4 < 2000 ? s->cfg.client_ttl_ms / 4 : 2000;
    if (!s->prober || !s->endpoints || (svc_map_get(&s->probing, seg, &started) && svc_now_ms() - started < every))
        return;
    char idbuf[24];
    snprintf(idbuf, sizeof idbuf, "%u", seg);
    const char *ep = zhashx_lookup(s->endpoints, idbuf);
    if (!ep)
        return;
    uint32_t to = s->cfg.probe_timeout_ms ? s->cfg.probe_timeout_ms : 500;
    if (svc_prober_ask(s, seg, ep, to) == KVP_OK) {
        svc_map_put(&s->probing, seg, svc_now_ms());
        s->probes_out++;
    }
}
