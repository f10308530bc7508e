/*
 * service_metrics.c — the master's metrics: counted on the service thread, rendered on the
 * service thread into Prometheus text every METRICS_PUBLISH_MS into a kvp_metrics_pub slot, and
 * served on the service thread too: the HTTP endpoint is hosted in the service actor (its
 * libmicrohttpd epoll fd is one of the actor's watches, metrics/metrics.h), so nothing here is
 * shared with another thread and nothing takes a lock (docs/operations.md "Metrics").
 *
 * A scrape copies the last snapshot rather than rendering anew, so scrapes cost the service
 * loop a copy each; a slow scraper costs nothing more (non-blocking sockets, bounded runs). A
 * stuck service loop now leaves scrapes unanswered (they time out) rather than answering an
 * old snapshot; the snapshot's age is still exported (kvpool_master_metrics_age_seconds), and
 * /readyz still turns 503 when it is stale (the publish timer starved by a busy loop).
 *
 * Sources, all read on the service thread: this file's counters (replies by type and code,
 * latency, leader changes), kvp_raftlog_get_info() (raft thread counters, copied under its
 * lock), the soft state in service_state.h, the repair and eviction status objects, and the
 * last FSM ClusterStatus document of the leader's 1 s refresh (objects, pool bytes per
 * segment). A follower has no FSM document: it exports no object or pool series.
 */
#include "actors/master/service/service_metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "actors/master/service/service_evict.h"
#include "actors/master/service/service_repair.h"
#include "actors/master/service/service_state.h"
#include "actors/master/service/service_quota.h"
#include "kvpool.h"
#include "metrics/metrics.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define METRICS_PUBLISH_MS 500
/* /readyz fails when the last snapshot is older than this: the service loop is stuck. */
#define METRICS_STALE_MS 5000
/* The FSM document is used while younger than this (the leader refreshes it every second). */
#define FSM_DOC_FRESH_MS 5000

/* Request types counted (index 0 = anything else). */
static const struct {
    int body_case;
    const char *name;
} rpc_types[] = {
    {0, "other"},
    {KVP__REQUEST__BODY_MOUNT, "mount"},
    {KVP__REQUEST__BODY_UNMOUNT, "unmount"},
    {KVP__REQUEST__BODY_HEARTBEAT, "heartbeat"},
    {KVP__REQUEST__BODY_PUT_START, "put_start"},
    {KVP__REQUEST__BODY_PUT_END, "put_end"},
    {KVP__REQUEST__BODY_PUT_REVOKE, "put_revoke"},
    {KVP__REQUEST__BODY_GET_REPLICAS, "get_replicas"},
    {KVP__REQUEST__BODY_EXISTS, "exists"},
    {KVP__REQUEST__BODY_GET_SIZE, "get_size"},
    {KVP__REQUEST__BODY_REMOVE, "remove"},
    {KVP__REQUEST__BODY_REMOVE_ALL, "remove_all"},
    {KVP__REQUEST__BODY_DRAIN, "drain"},
    {KVP__REQUEST__BODY_REPORT_UNREACHABLE, "report_unreachable"},
    {KVP__REQUEST__BODY_CLUSTER_STATUS, "cluster_status"},
    {KVP__REQUEST__BODY_MEMBERS, "members"},
    {KVP__REQUEST__BODY_TRANSFER_LEADER, "transfer_leader"},
    {KVP__REQUEST__BODY_ADD_MEMBER, "add_member"},
    {KVP__REQUEST__BODY_REMOVE_MEMBER, "remove_member"},
    {KVP__REQUEST__BODY_MOVER_POLL, "mover_poll"},
    {KVP__REQUEST__BODY_DATA_TOKEN, "data_token"},
    {KVP__REQUEST__BODY_PUT_INTENT, "put_intent"},
};
#define N_TYPES (sizeof rpc_types / sizeof rpc_types[0])
/* Codes: index -status for KVP_OK .. KVP_ERR__LAST+1; the last index for anything else. */
#define N_CODES (-(KVP_ERR__LAST) + 1)

struct svc_metrics {
    /* All on the service thread (the endpoint is hosted there): */
    struct kvp_metrics_pub pub;      /* the last snapshot, served by the endpoint */
    struct kvp_metrics_http *http;   /* NULL when metrics_port is 0 */
    int http_fd;                     /* its watched fd, -1 before the loop starts */
    uint64_t replies[N_TYPES][N_CODES];
    uint64_t keys[N_TYPES][N_CODES];  /* per-key results inside batch replies */
    struct kvp_metrics_hist latency[N_TYPES];
    int cur_type;                    /* index into rpc_types of the request being handled */
    uint64_t cur_recv_us;            /* its receive time (0 = unknown) */
    uint64_t leader_changes;
    uint64_t last_leader;            /* last known leader id (0 before the first) */
    json_t *fsm;                     /* last FSM ClusterStatus document, or NULL */
    uint64_t fsm_ms;                 /* when it came */
};

static int type_index(int body_case)
{
    for (size_t i = 1; i < N_TYPES; i++)
        if (rpc_types[i].body_case == body_case)
            return (int)i;
    return 0;
}

static int code_index(int status)
{
    return status <= 0 && status > KVP_ERR__LAST ? -status : N_CODES - 1;
}

/* ------------------------------------------------------------------ hooks */

void svc_metrics_on_reply(struct kvp_master_service *s, const Kvp__Response *resp)
{
    struct svc_metrics *m = s->metrics;
    if (!m)
        return;
    int t = m->cur_type;
    if (t == 0 && resp->body_case == KVP__RESPONSE__BODY_HEARTBEAT)
        t = type_index(KVP__REQUEST__BODY_HEARTBEAT); /* heartbeats answered at a table refresh */
    m->replies[t][code_index(resp->status)]++;
    /* Per-key results of the batch requests (puts, gets, exists by result code). */
    uint64_t *k = m->keys[0];
    switch (resp->body_case) {
    case KVP__RESPONSE__BODY_PUT_START:
        k = m->keys[type_index(KVP__REQUEST__BODY_PUT_START)];
        for (size_t i = 0; resp->put_start && i < resp->put_start->n_results; i++)
            k[code_index(resp->put_start->results[i] ? resp->put_start->results[i]->status : KVP_ERR_INTERNAL)]++;
        break;
    case KVP__RESPONSE__BODY_PUT_END: /* PutEnd's, or PutIntent's (same answer shape) */
        k = m->keys[t == type_index(KVP__REQUEST__BODY_PUT_INTENT) ? t : type_index(KVP__REQUEST__BODY_PUT_END)];
        for (size_t i = 0; resp->put_end && i < resp->put_end->n_status; i++)
            k[code_index(resp->put_end->status[i])]++;
        break;
    case KVP__RESPONSE__BODY_GET_REPLICAS:
        k = m->keys[type_index(KVP__REQUEST__BODY_GET_REPLICAS)];
        for (size_t i = 0; resp->get_replicas && i < resp->get_replicas->n_objects; i++)
            k[code_index(resp->get_replicas->objects[i] ? resp->get_replicas->objects[i]->status : KVP_ERR_INTERNAL)]++;
        break;
    case KVP__RESPONSE__BODY_EXISTS: /* 1 found (OK), 0 missing (NOT_FOUND), or an error */
        k = m->keys[type_index(KVP__REQUEST__BODY_EXISTS)];
        for (size_t i = 0; resp->exists && i < resp->exists->n_results; i++) {
            int32_t r = resp->exists->results[i];
            k[code_index(r == 1 ? KVP_OK : r == 0 ? KVP_ERR_NOT_FOUND : r)]++;
        }
        break;
    case KVP__RESPONSE__BODY_REMOVE:
        k = m->keys[type_index(KVP__REQUEST__BODY_REMOVE)];
        for (size_t i = 0; resp->remove && i < resp->remove->n_status; i++)
            k[code_index(resp->remove->status[i])]++;
        break;
    default:
        break;
    }
    if (m->cur_recv_us) {
        uint64_t now = kvp_clock_now_us();
        kvp_metrics_hist_observe_us(&m->latency[t], now > m->cur_recv_us ? now - m->cur_recv_us : 0);
    }
}

void svc_metrics_begin(struct kvp_master_service *s, int body_case, uint64_t recv_us, int *saved_type,
                       uint64_t *saved_us)
{
    struct svc_metrics *m = s->metrics;
    *saved_type = m ? m->cur_type : 0;
    *saved_us = m ? m->cur_recv_us : 0;
    if (!m)
        return;
    m->cur_type = type_index(body_case);
    m->cur_recv_us = recv_us;
}

void svc_metrics_end(struct kvp_master_service *s, int saved_type, uint64_t saved_us)
{
    struct svc_metrics *m = s->metrics;
    if (!m)
        return;
    m->cur_type = saved_type;
    m->cur_recv_us = saved_us;
}

void svc_metrics_on_leader(struct kvp_master_service *s, uint64_t leader_id)
{
    struct svc_metrics *m = s->metrics;
    if (!m || leader_id == 0 || leader_id == m->last_leader)
        return;
    if (m->last_leader != 0)
        m->leader_changes++;
    m->last_leader = leader_id;
}

void svc_metrics_note_fsm(struct kvp_master_service *s, const char *json)
{
    struct svc_metrics *m = s->metrics;
    if (!m || !m->http || !json) /* no endpoint: nobody reads it */
        return;
    json_error_t err;
    json_t *doc = json_loads(json, 0, &err);
    if (!json_is_object(doc)) {
        json_decref(doc);
        return;
    }
    json_decref(m->fsm);
    m->fsm = doc;
    m->fsm_ms = svc_now_ms();
}

/* ------------------------------------------------------------------ rendering */

static uint64_t ju(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    if (json_is_integer(v))
        return json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
    if (json_is_real(v))
        return json_real_value(v) > 0 ? (uint64_t)json_real_value(v) : 0;
    return 0;
}

static void one(struct kvp_metrics_text *t, const char *name, const char *type, const char *help, uint64_t v)
{
    kvp_metrics_family(t, name, type, help);
    kvp_metrics_sample_u64(t, name, NULL, v);
}

static void one_s(struct kvp_metrics_text *t, const char *name, const char *help, uint64_t us)
{
    kvp_metrics_family(t, name, "gauge", help);
    kvp_metrics_sample_double(t, name, NULL, (double)us / 1e6);
}

static void render_raft(struct kvp_master_service *s, struct svc_metrics *m, struct kvp_metrics_text *t)
{
    struct kvp_raftlog_info in;
    kvp_raftlog_get_info(s->rl, &in);
    one(t, "kvpool_raft_term", "gauge", "Current Raft term of this master.", in.term);
    one(t, "kvpool_raft_commit_index", "gauge", "Raft commit index as this master knows it.", in.commit_index);
    one(t, "kvpool_raft_last_applied_index", "gauge", "Last Raft index applied to this master's state machine.",
        in.last_applied);
    one(t, "kvpool_raft_apply_lag", "gauge", "Committed Raft entries not yet applied here (commit index - last applied).",
        in.commit_index > in.last_applied ? in.commit_index - in.last_applied : 0);
    one(t, "kvpool_raft_is_leader", "gauge", "1 when this master is the Raft leader.", s->is_leader ? 1 : 0);
    one(t, "kvpool_raft_leader_id", "gauge", "Raft id of the leader this master knows (0 = none).", s->leader_id);
    one(t, "kvpool_raft_leader_changes_total", "counter",
        "Changes of the known leader seen by this master since it started.", m->leader_changes);
    one(t, "kvpool_raft_members", "gauge", "Members of the Raft configuration (all roles).", in.n_members);
    kvp_metrics_family(t, "kvpool_raft_snapshots_total", "counter", "Raft snapshots taken or restored by this master.");
    const char *tk[] = {"kind", "taken", NULL}, *rs[] = {"kind", "restored", NULL};
    kvp_metrics_sample_u64(t, "kvpool_raft_snapshots_total", tk, in.snapshots_taken);
    kvp_metrics_sample_u64(t, "kvpool_raft_snapshots_total", rs, in.snapshots_restored);
    kvp_metrics_family(t, "kvpool_raft_snapshot_duration_seconds", "histogram",
                       "Time to take one snapshot (state machine serialisation and LZ4 framing).");
    kvp_metrics_sample_hist(t, "kvpool_raft_snapshot_duration_seconds", NULL, &in.snapshot_hist);
    one_s(t, "kvpool_raft_max_stall_seconds",
        "Longest stretch the Raft thread ran without getting back to its loop since start (lateness of its "
        "20 ms tick).", in.max_stall_us);
    one_s(t, "kvpool_raft_max_busy_stall_seconds",
          "Largest, over late tick intervals, of the CPU time the Raft thread used in the interval (capped at "
          "its lateness): an upper bound of the stall its own work caused (waiting for a CPU is not counted).",
          in.max_busy_stall_us);
    one_s(t, "kvpool_raft_snapshot_max_step_seconds",
        "Longest single step (one chunk) of an incremental snapshot build since start.", in.max_snap_step_us);
    one_s(t, "kvpool_raft_snapshot_max_step_cpu_seconds",
          "Raft-thread CPU time of the longest incremental snapshot step since start.", in.max_snap_step_cpu_us);
    one_s(t, "kvpool_raft_apply_max_cpu_seconds",
          "Raft-thread CPU time of the longest apply of one Raft entry since start.", in.max_apply_cpu_us);
    one_s(t, "kvpool_raft_apply_max_seconds",
        "Longest apply of one Raft entry (all its commands) on the Raft thread since start.", in.max_apply_us);
    one_s(t, "kvpool_raft_snapshot_restore_max_seconds",
        "Longest time a snapshot restore held the Raft thread in one piece since start (a start-up load, or "
        "the accept or one step of an install in steps).", in.max_restore_us);
    one_s(t, "kvpool_raft_catchup_max_step_seconds",
          "Longest single catch-up step of a follower (install in steps, deferred applies) since start.",
          in.max_catchup_step_us);
    one(t, "kvpool_raft_restores_in_steps_total", "counter", "Snapshots installed in steps.", in.restores_in_steps);
    one(t, "kvpool_raft_fsm_behind", "gauge",
        "1 while the state machine lags the applied index (an install in steps or deferred entries run).",
        in.fsm_behind ? 1 : 0);
    one(t, "kvpool_raft_entries_deferred_total", "counter",
        "Committed entries applied in a later loop iteration than Raft handed them over (behind an install or "
        "past the per-iteration apply budget).", in.entries_deferred);
    one_s(t, "kvpool_raft_snapshot_last_wall_seconds",
        "Last snapshot taken: time from the start of its build to handing it to Raft.", in.last_snap_wall_us);
    one_s(t, "kvpool_raft_snapshot_last_busy_seconds",
        "Last snapshot taken: Raft-thread time spent building it (sum of its steps).", in.last_snap_busy_us);
    one(t, "kvpool_raft_snapshot_last_bytes", "gauge", "Last snapshot taken: its size as stored.",
        in.last_snap_bytes);
    one(t, "kvpool_raft_entries_proposed_total", "counter", "Raft entries this master proposed as leader.",
        in.entries_proposed);
    one(t, "kvpool_raft_commands_proposed_total", "counter",
        "Commands in those entries (commands / entries = the group-commit factor).", in.cmds_proposed);
}

static void render_rpc(struct svc_metrics *m, struct kvp_metrics_text *t)
{
    kvp_metrics_family(t, "kvpool_master_rpcs_total", "counter",
                       "Control-plane requests answered by this master, by request type and result code.");
    for (size_t i = 0; i < N_TYPES; i++)
        for (int c = 0; c < N_CODES; c++) {
            if (!m->replies[i][c])
                continue;
            const char *code = c == N_CODES - 1 ? "OTHER" : kvp_errname(-c);
            const char *l[] = {"type", rpc_types[i].name, "code", code, NULL};
            kvp_metrics_sample_u64(t, "kvpool_master_rpcs_total", l, m->replies[i][c]);
        }
    kvp_metrics_family(t, "kvpool_master_keys_total", "counter",
                       "Keys of batch requests answered by this master, by request type and per-key result "
                       "(puts, gets and exists by result code; exists: KVP_OK found, KVP_ERR_NOT_FOUND missing).");
    for (size_t i = 0; i < N_TYPES; i++)
        for (int c = 0; c < N_CODES; c++) {
            if (!m->keys[i][c])
                continue;
            const char *code = c == N_CODES - 1 ? "OTHER" : kvp_errname(-c);
            const char *l[] = {"type", rpc_types[i].name, "code", code, NULL};
            kvp_metrics_sample_u64(t, "kvpool_master_keys_total", l, m->keys[i][c]);
        }
    kvp_metrics_family(t, "kvpool_master_rpc_duration_seconds", "histogram",
                       "Time from taking a request off the socket to sending its reply, by request type.");
    for (size_t i = 0; i < N_TYPES; i++) {
        if (!m->latency[i].count)
            continue;
        const char *l[] = {"type", rpc_types[i].name, NULL};
        kvp_metrics_sample_hist(t, "kvpool_master_rpc_duration_seconds", l, &m->latency[i]);
    }
}

static void render_soft(struct kvp_master_service *s, struct kvp_metrics_text *t)
{
    one(t, "kvpool_master_leases", "gauge",
        "Read leases held (leader soft state; expired ones are dropped once a second).", s->leases.n);
    one(t, "kvpool_master_heartbeating_segments", "gauge", "Segments whose heartbeat this leader has seen.",
        s->last_hb.n);
    one(t, "kvpool_master_pending_requests", "gauge", "Requests waiting for the Raft log.", s->pending.n);
    one(t, "kvpool_master_bad_frames_total", "counter", "Control-plane frames that failed to decode (dropped).",
        s->bad_total);
    one(t, "kvpool_master_local_reads_total", "counter", "Reads answered on the service thread (leader local reads).",
        s->local_reads);
}

static void render_repair_evict(struct kvp_master_service *s, struct kvp_metrics_text *t)
{
    json_t *r = svc_repair_status(s);
    one(t, "kvpool_drain_objects", "gauge", "Objects with a replica on a draining segment (left to move).",
        ju(r, "draining_objects"));
    one(t, "kvpool_drain_bytes", "gauge", "Bytes of those objects.", ju(r, "draining_bytes"));
    one(t, "kvpool_repair_under_replicated_objects", "gauge", "Objects with fewer replicas than asked for.",
        ju(r, "under_replicated"));
    one(t, "kvpool_repair_no_space_objects", "gauge", "Objects a drain or repair found no room for.", ju(r, "no_space"));
    one(t, "kvpool_repair_copies_in_flight", "gauge", "Drain and repair copies handed to movers and not yet done.",
        ju(r, "copies_in_flight"));
    one(t, "kvpool_repair_moved_objects_total", "counter", "Replicas copied by drain or repair (this leader).",
        ju(r, "moved_objects"));
    one(t, "kvpool_repair_moved_bytes_total", "counter", "Bytes copied by drain or repair (this leader).",
        ju(r, "moved_bytes"));
    one(t, "kvpool_repair_failed_copies_total", "counter", "Drain or repair copies that failed (this leader).",
        ju(r, "failed_copies"));
    one(t, "kvpool_repair_dropped_replicas_total", "counter", "Replicas dropped from drained segments (this leader).",
        ju(r, "dropped_replicas"));
    json_decref(r);
    json_t *doc = json_object();
    svc_evict_status(s, doc);
    json_t *e = json_object_get(doc, "eviction");
    one(t, "kvpool_evictions_total", "counter", "Objects evicted by this leader (watermark eviction).",
        ju(e, "objects_evicted"));
    one(t, "kvpool_evicted_bytes_total", "counter", "Bytes of the objects evicted by this leader.", ju(e, "bytes_chosen"));
    one(t, "kvpool_eviction_rounds_total", "counter", "Eviction rounds run by this leader.", ju(e, "rounds"));
    one(t, "kvpool_eviction_blocked_rounds_total", "counter",
        "Eviction rounds that found nothing they were allowed to evict (leased or pinned).", ju(e, "blocked_rounds"));
    json_decref(doc);
}

static const char *const seg_states[] = {"ACTIVE", "DRAINING", "LOST"};

/* Whether entry i of the FSM's segments is the newest of its name. A segment remounted under
 * its name (declared lost, then its heartbeat remounted it) leaves the old, LOST entry in the
 * table; the per-segment series are labelled by name only, so only the newest entry of a name
 * is exported (two samples with the same labels would make the whole scrape invalid). The
 * entries are in id order, so the newest is the last. `newest` maps name → last index. */
static bool newest_of_name(json_t *newest, size_t i, const char *nm)
{
    return json_integer_value(json_object_get(newest, nm ? nm : "")) == (json_int_t)i;
}

/* Pool series from the FSM document; also the /get_all_segments body (mounted segment names,
 * one per line: ACTIVE and DRAINING ones). */
static void render_fsm(struct svc_metrics *m, struct kvp_metrics_text *t, struct kvp_metrics_text *names)
{
    json_t *f = m->fsm;
    one(t, "kvpool_objects", "gauge", "Complete objects in the pool.", ju(f, "objects"));
    one(t, "kvpool_pending_puts", "gauge", "Puts started and not yet ended or revoked.", ju(f, "pending_puts"));
    one(t, "kvpool_pool_capacity_bytes", "gauge", "Bytes of all mounted segments.", ju(f, "capacity_bytes"));
    one(t, "kvpool_pool_used_bytes", "gauge", "Bytes allocated to objects and pending puts.", ju(f, "used_bytes"));
    one(t, "kvpool_pool_quarantined_bytes", "gauge", "Freed bytes not yet reusable (fence grace, leases).",
        ju(f, "quarantined_bytes"));
    one(t, "kvpool_pool_pinned_bytes", "gauge", "Bytes of soft-pinned objects.", ju(f, "pinned_bytes"));
    json_t *segs = json_object_get(f, "segments");
    json_t *newest = json_object();
    {
        size_t i;
        json_t *sg;
        json_array_foreach(segs, i, sg) {
            const char *nm = json_string_value(json_object_get(sg, "name"));
            json_object_set_new(newest, nm ? nm : "", json_integer((json_int_t)i));
        }
    }
    static const struct {
        const char *name, *key, *help;
    } per[] = {
        {"kvpool_pool_segment_capacity_bytes", "size", "Bytes a segment contributes."},
        {"kvpool_pool_segment_used_bytes", "used", "Bytes of a segment allocated to objects and pending puts."},
        {"kvpool_pool_segment_quarantined_bytes", "quarantined", "Freed bytes of a segment not yet reusable."},
        {"kvpool_pool_segment_objects", "objects", "Replicas held by a segment."},
    };
    for (size_t k = 0; k < sizeof per / sizeof per[0]; k++) {
        kvp_metrics_family(t, per[k].name, "gauge", per[k].help);
        size_t i;
        json_t *sg;
        json_array_foreach(segs, i, sg) {
            const char *nm = json_string_value(json_object_get(sg, "name"));
            if (!newest_of_name(newest, i, nm))
                continue;
            const char *l[] = {"segment", nm ? nm : "", NULL};
            kvp_metrics_sample_u64(t, per[k].name, l, ju(sg, per[k].key));
        }
    }
    kvp_metrics_family(t, "kvpool_pool_segment_state", "gauge", "1 for the state a segment is in (ACTIVE, DRAINING, LOST).");
    uint64_t by_state[3] = {0, 0, 0};
    size_t i;
    json_t *sg;
    json_array_foreach(segs, i, sg) {
        const char *nm = json_string_value(json_object_get(sg, "name"));
        const char *st = json_string_value(json_object_get(sg, "state"));
        bool newest_one = newest_of_name(newest, i, nm);
        for (int k = 0; k < 3; k++) {
            bool here = st && strcmp(st, seg_states[k]) == 0;
            by_state[k] += here; /* every segment known, the superseded ones too */
            const char *l[] = {"segment", nm ? nm : "", "state", seg_states[k], NULL};
            if (newest_one)
                kvp_metrics_sample_u64(t, "kvpool_pool_segment_state", l, here);
        }
        if (nm && st && strcmp(st, "LOST") != 0)
            kvp_metrics_text_printf(names, "%s\n", nm);
    }
    json_decref(newest);
    kvp_metrics_family(t, "kvpool_pool_segments", "gauge", "Segments known to the pool, by state.");
    for (int k = 0; k < 3; k++) {
        const char *l[] = {"state", seg_states[k], NULL};
        kvp_metrics_sample_u64(t, "kvpool_pool_segments", l, by_state[k]);
    }
}

static void publish(struct kvp_master_service *s)
{
    struct svc_metrics *m = s->metrics;
    uint64_t now = svc_now_ms();
    bool fsm_fresh = s->is_leader && m->fsm && now - m->fsm_ms < FSM_DOC_FRESH_MS;
    struct kvp_metrics_text t = {0}, names = {0};
    render_raft(s, m, &t);
    render_rpc(m, &t);
    render_soft(s, &t);
    render_repair_evict(s, &t);
    svc_quota_render(s, &t); /* auth refusals, use per tenant (service_quota.c) */
    one(&t, "kvpool_master_pool_view", "gauge",
        "1 when the object and pool series below come from this master (the leader with a fresh state-machine view).",
        fsm_fresh);
    if (fsm_fresh)
        render_fsm(m, &t, &names);
    char *text = kvp_metrics_text_take(&t);
    if (text)
        kvp_metrics_pub_set(&m->pub, KVP_METRICS_DOC_METRICS, &text);
    /* /get_all_segments: the leader answers; a follower points at the leader's endpoint. */
    char *body = fsm_fresh ? kvp_metrics_text_take(&names) : NULL;
    kvp_metrics_text_fini(&names);
    kvp_metrics_pub_set(&m->pub, KVP_METRICS_DOC_SEGMENTS, &body);
    free(body);
    char redirect[300] = "", host[256], own[256];
    if (!s->is_leader && s->leader_id) {
        /* The leader's metrics port is taken to be ours, which holds only on another host:
         * masters sharing a host have different ports, so no redirect there (503). */
        kvp_metrics_host_of(svc_member_address(s, s->leader_id), host, sizeof host);
        kvp_metrics_host_of(s->cfg.listen, own, sizeof own);
        if (host[0] && strcmp(host, own) != 0)
            snprintf(redirect, sizeof redirect, "http://%s%s%s:%u", strchr(host, ':') ? "[" : "", host,
                     strchr(host, ':') ? "]" : "", s->cfg.metrics_port);
    }
    kvp_metrics_pub_state(&m->pub, s->leader_id != 0, "no Raft leader known", redirect[0] ? redirect : NULL);
}

void svc_metrics_publish_now(struct kvp_master_service *s)
{
    if (s->metrics && s->metrics->http)
        publish(s);
}

static int on_publish_timer(struct kvp_master_service *s)
{
    if (s->metrics && s->metrics->http) {
        publish(s);
        kvp_metrics_http_run(s->metrics->http); /* idle connections close only while it runs */
    }
    return 0;
}

/* The endpoint's fd is readable: serve on this thread (never blocks; bounded per call). */
static int on_http_readable(struct kvp_rt_ctx *ctx, void *handle)
{
    struct kvp_master_service *s = kvp_rt_state(ctx);
    struct svc_metrics *m = s->metrics;
    if (s->stopping) { /* serve nothing more (svc_stop_self); a readable fd left unread would spin */
        kvp_rt_unwatch_fd(ctx, *(int *)handle);
        m->http_fd = -1;
        return KVP_OK;
    }
    kvp_metrics_http_run(m->http);
    return KVP_OK;
}

/* ------------------------------------------------------------------ HTTP callbacks (service thread) */

static void http_render(void *ctx, struct kvp_metrics_text *t)
{
    struct svc_metrics *m = ctx;
    uint64_t at = 0;
    char *doc = kvp_metrics_pub_copy(&m->pub, KVP_METRICS_DOC_METRICS, &at);
    if (doc)
        kvp_metrics_text_printf(t, "%s", doc);
    free(doc);
    kvp_metrics_family(t, "kvpool_master_metrics_age_seconds", "gauge",
                       "Age of the snapshot above: how long ago the service thread published it.");
    uint64_t now = kvp_clock_now_ms();
    kvp_metrics_sample_double(t, "kvpool_master_metrics_age_seconds", NULL,
                              at && now > at ? (double)(now - at) / 1000.0 : 0.0);
}

static bool http_ready(void *ctx, char *why, size_t cap)
{
    struct svc_metrics *m = ctx;
    bool ready = m->pub.ready;
    uint64_t at = m->pub.published_ms;
    snprintf(why, cap, "%s", m->pub.not_ready);
    uint64_t now = kvp_clock_now_ms();
    if (!at) {
        snprintf(why, cap, "starting");
        return false;
    }
    if (now - at > METRICS_STALE_MS) {
        snprintf(why, cap, "the service thread has published nothing for %llu ms", (unsigned long long)(now - at));
        return false;
    }
    return ready;
}

/* GET /get_all_segments, as Mooncake's master answers it: the mounted segments' names, one per
 * line (text/plain), "" while there are none. A follower on another host than the leader
 * redirects (307) to the leader's endpoint (same metrics_port assumed on every master); a
 * follower on the leader's host, or with no leader known: 503 with an empty body (SGLang's
 * check_server reads an empty body as "not up yet" and polls again). */
static int http_route(void *ctx, const char *path, char **body, const char **ct)
{
    struct svc_metrics *m = ctx;
    if (strcmp(path, "/get_all_segments") != 0)
        return 0;
    *ct = "text/plain; version=0.0.4; charset=utf-8";
    char *doc = kvp_metrics_pub_copy(&m->pub, KVP_METRICS_DOC_SEGMENTS, NULL);
    if (doc) {
        *body = doc;
        return 200;
    }
    const char *redirect = m->pub.redirect;
    if (redirect[0]) {
        size_t n = strlen(redirect) + sizeof "/get_all_segments";
        *body = malloc(n);
        if (*body) {
            snprintf(*body, n, "%s/get_all_segments", redirect);
            return 307;
        }
    }
    return 503;
}

/* ------------------------------------------------------------------ lifecycle */

int svc_metrics_start(struct kvp_master_service *s)
{
    struct svc_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return KVP_ERR_NOMEM;
    kvp_metrics_pub_init(&m->pub);
    m->http_fd = -1;
    s->metrics = m;
    if (s->cfg.metrics_port == 0)
        return KVP_OK;
    char host[256];
    kvp_metrics_host_of(s->cfg.listen, host, sizeof host);
    struct kvp_metrics_http_ops ops = {.ctx = m, .render = http_render, .ready = http_ready, .route = http_route};
    /* Bound here (a port that cannot be bound fails the start); served once the loop watches it. */
    return kvp_metrics_http_start_hosted(&m->http, s->actor, host, s->cfg.metrics_port, s->cfg.bind_retry_ms,
                                         &ops);
}

void svc_metrics_destroy(struct kvp_master_service *s)
{
    struct svc_metrics *m = s->metrics;
    if (!m)
        return;
    kvp_metrics_http_stop(&m->http); /* after the actor's thread is gone: nothing runs it */
    kvp_metrics_pub_fini(&m->pub);
    json_decref(m->fsm);
    free(m);
    s->metrics = NULL;
}

int svc_metrics_timer_start(struct kvp_master_service *s)
{
    if (!s->metrics || !s->metrics->http)
        return KVP_OK; /* nothing to publish to */
    publish(s);
    struct svc_metrics *m = s->metrics;
    int fd = kvp_metrics_http_fd(m->http);
    if (fd < 0)
        return KVP_ERR_INVALID; /* the endpoint was not started hosted */
    int rc = kvp_rt_watch_fd(s->ctx, fd, on_http_readable);
    if (rc != KVP_OK)
        return rc;
    m->http_fd = fd;
    return svc_timer_every(s, METRICS_PUBLISH_MS, on_publish_timer); /* its own error, not always NOMEM */
}
