/*
 * service_status.c — leadership tracking (one INFO line per change) and the ClusterStatus
 * document: the FSM's JSON merged with leader, term, members, this node and the settings in
 * force (docs/master.md "ClusterStatus").
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "actors/master/service/service_evict.h"
#include "actors/master/service/service_metrics.h"
#include "actors/master/service/service_repair.h"
#include "actors/master/service/service_state.h"
#include "actors/master/service/service_quota.h"
#include "kvpool.h"
#include "runtime/log.h"

void svc_set_leadership(struct kvp_master_service *s, bool is_leader, uint64_t leader_id, uint64_t term)
{
    bool was = s->is_leader;
    uint64_t old_term = s->term;
    svc_metrics_on_leader(s, leader_id);
    s->leader_id = leader_id;
    s->term = term;
    if (is_leader && (!was || term != old_term)) {
        s->is_leader = true;
        s->leader_since_ms = svc_now_ms();
        svc_soft_reset(s);
        svc_request_status_refresh(s);
    } else if (!is_leader && was) {
        s->is_leader = false;
        svc_soft_reset(s);
    }
    int role = is_leader ? 1 : 0;
    if (role != s->last_logged_role || (!is_leader && leader_id != s->last_logged_leader)) {
        if (is_leader)
            kvp_log_info(s->actor, "became leader (term %llu); for %llu ms every object counts as leased "
                         "(un-forced removes refused, space freed held past that window)",
                         (unsigned long long)term, (unsigned long long)s->cfg.default_kv_lease_ttl_ms);
        else if (leader_id)
            kvp_log_info(s->actor, "follower (term %llu), leader is %llu at %s", (unsigned long long)term,
                         (unsigned long long)leader_id, svc_member_address(s, leader_id));
        else
            kvp_log_info(s->actor, "follower (term %llu), no leader known", (unsigned long long)term);
        s->last_logged_role = role;
        s->last_logged_leader = leader_id;
        svc_metrics_publish_now(s); /* /readyz and the role series without the 500 ms wait */
    }
}

void svc_refresh_leadership(struct kvp_master_service *s)
{
    struct kvp_raftlog_info info;
    memset(&info, 0, sizeof info);
    kvp_raftlog_get_info(s->rl, &info);
    svc_set_leadership(s, info.is_leader, info.leader_id, info.term);
}

void svc_fill_members(struct kvp_master_service *s, struct kvp_raftlog_info *info, Kvp__MembersResp *mr,
                      Kvp__Member *storage, Kvp__Member **ptrs, size_t cap)
{
    memset(info, 0, sizeof *info);
    kvp_raftlog_get_info(s->rl, info);
    size_t n = 0;
    for (size_t i = 0; i < info->n_members && i < 9 && n < cap; i++) {
        Kvp__Member *m = &storage[n];
        kvp__member__init(m);
        m->id = info->members[i].id;
        m->address = (char *)svc_member_address(s, m->id);
        m->raft_address = info->members[i].raft_address; /* points into *info: the caller's */
        m->role = 0;
        ptrs[n++] = m;
    }
    mr->members = ptrs;
    mr->n_members = n;
    mr->leader_id = info->leader_id;
    mr->term = info->term;
}

static json_int_t ago(uint64_t now, uint64_t t)
{
    return t && now >= t ? (json_int_t)(now - t) : -1;
}

/* "liveness": the rule's state on this node (docs/operations.md), and per entry of the FSM's
 * "segments" array what this leader last heard of it, from whom, and why it is suspected. */
static void svc_liveness_status(struct kvp_master_service *s, json_t *doc)
{
    const struct kvp_liveness *lv = &s->liveness;
    uint64_t now = svc_now_ms();
    json_t *o = json_object();
    json_object_set_new(o, "evaluated_by", json_integer(s->is_leader ? (json_int_t)s->cfg.id : 0));
    json_object_set_new(o, "client_ttl_ms", json_integer((json_int_t)lv->ttl_ms));
    json_object_set_new(o, "tick_gap_limit_ms", json_integer((json_int_t)lv->tick_gap_ms));
    json_object_set_new(o, "quorum_stale_limit_ms", json_integer((json_int_t)lv->quorum_stale_ms));
    json_object_set_new(o, "grace_started_ms_ago", json_integer(ago(now, lv->grace_from_ms)));
    json_object_set_new(o, "quorum_contact_ms_ago", json_integer(ago(now, lv->quorum_ok_ms)));
    json_object_set_new(o, "heard", json_integer(lv->heard));
    json_object_set_new(o, "checked", json_integer(lv->total));
    json_object_set_new(o, "withholding", json_boolean(s->is_leader && lv->withholding));
    json_object_set_new(o, "withheld_for_ms", json_integer(lv->withholding ? ago(now, lv->withheld_since_ms) : 0));
    json_object_set_new(o, "withheld_why", json_string(lv->withholding ? lv->withheld_why : ""));
    json_object_set_new(o, "withheld_episodes", json_integer((json_int_t)lv->withheld_episodes));
    json_object_set_new(o, "blind_periods", json_integer((json_int_t)lv->blind_periods));
    json_object_set_new(o, "last_blind_why", json_string(lv->blind_why));
    json_object_set_new(o, "last_blind_ms_ago", json_integer(ago(now, lv->blind_at_ms)));
    json_object_set_new(o, "last_blind_length_ms", json_integer((json_int_t)lv->blind_len_ms));
    json_object_set_new(doc, "liveness", o);
    if (!s->is_leader)
        return;
    size_t i;
    json_t *seg;
    json_array_foreach(json_object_get(doc, "segments"), i, seg) {
        json_int_t id = json_integer_value(json_object_get(seg, "id"));
        if (id <= 0)
            continue;
        uint64_t hb = 0, via = 0, gap = 0, rep = 0;
        bool heard = svc_map_get(&s->last_hb, (uint64_t)id, &hb);
        (void)svc_map_get(&s->heard_via, (uint64_t)id, &via);
        (void)svc_map_get(&s->hb_gap, (uint64_t)id, &gap);
        (void)svc_map_get(&s->unreachable, (uint64_t)id, &rep);
        json_t *l = json_object();
        json_object_set_new(l, "last_heard_ms_ago", json_integer(heard ? ago(now, hb) : -1));
        char by[64];
        snprintf(by, sizeof by, "%s (%s)", s->actor, via == 1 ? "mount" : via == 2 ? "heartbeat" : "nothing yet");
        json_object_set_new(l, "heard_by", json_string(heard ? by : "not heard by this leader"));
        json_object_set_new(l, "heartbeat_period_ms", json_integer((json_int_t)gap));
        json_object_set_new(l, "reported_unreachable_ms_ago", json_integer(ago(now, rep)));
        json_object_set_new(l, "probe_failed_ms_ago", json_integer(ago(now, svc_repair_probe_failed_at(s, (uint32_t)id))));
        uint64_t cw = 0;
        (void)svc_map_get(&s->client_wrote, (uint64_t)id, &cw);
        json_object_set_new(l, "clients_wrote_ms_ago", json_integer(ago(now, cw)));
        const char *state = "live", *why = "";
        for (size_t k = 0; k < s->n_verdicts; k++)
            if (s->verdicts[k].id == (uint32_t)id) {
                state = kvp_liveness_state_name(s->verdicts[k].state);
                why = s->verdicts[k].why;
            }
        const char *fsm_state = json_string_value(json_object_get(seg, "state"));
        if (svc_map_get(&s->lost_sent, (uint64_t)id, NULL) || (fsm_state && strcasestr(fsm_state, "lost")))
            state = "lost", why = "declared lost";
        json_object_set_new(l, "verdict", json_string(state));
        json_object_set_new(l, "why", json_string(why));
        json_object_set_new(seg, "liveness", l);
    }
}

char *svc_status_json(struct kvp_master_service *s, const char *fsm_json)
{
    json_error_t err;
    json_t *doc = json_loads(fsm_json, 0, &err);
    if (!json_is_object(doc)) {
        json_decref(doc);
        doc = json_object();
        if (!doc)
            return NULL;
        json_object_set_new(doc, "fsm_raw", json_string(fsm_json));
    }
    struct kvp_raftlog_info info;
    memset(&info, 0, sizeof info);
    kvp_raftlog_get_info(s->rl, &info);
    const struct kvp_cfg_master *c = &s->cfg;

    json_object_set_new(doc, "leader_id", json_integer((json_int_t)info.leader_id));
    json_object_set_new(doc, "leader_address", json_string(svc_member_address(s, info.leader_id)));
    json_object_set_new(doc, "term", json_integer((json_int_t)info.term));
    /* Rolling upgrades (version.h): this binary's level and, on the leader, the cluster's (the
     * lowest any member reports; features that need more stay off). */
    json_t *fl = json_object();
    json_object_set_new(fl, "this_master", json_integer(KVP_FEATURE_LEVEL));
    json_object_set_new(fl, "cluster", s->is_leader ? json_integer(svc_feature_level(s)) : json_null());
    json_object_set_new(fl, "committed", json_integer(s->feature_committed));
    json_object_set_new(doc, "feature_level", fl);
    json_object_set_new(doc, "commit_index", json_integer((json_int_t)info.commit_index));
    svc_quota_status(s, doc); /* use per tenant (service_quota.c) */
    json_object_set_new(doc, "last_applied", json_integer((json_int_t)info.last_applied));
    /* Group commit as seen by this node while it led: commands per entry, mean commit time. */
    json_t *rj = json_object();
    json_object_set_new(rj, "entries_proposed", json_integer((json_int_t)info.entries_proposed));
    json_object_set_new(rj, "commands_proposed", json_integer((json_int_t)info.cmds_proposed));
    json_object_set_new(rj, "entries_committed", json_integer((json_int_t)info.entries_committed));
    json_object_set_new(rj, "commit_us_mean",
                        json_integer(info.entries_committed ? (json_int_t)(info.commit_us_total / info.entries_committed) : 0));
    /* Per command: queued before raft_apply, raft_apply → applied; per entry: → stored locally. */
    json_object_set_new(rj, "command_queue_us_mean",
                        json_integer(info.cmds_proposed ? (json_int_t)(info.cmd_queue_us_total / info.cmds_proposed) : 0));
    json_object_set_new(rj, "command_commit_us_mean",
                        json_integer(info.cmds_committed ? (json_int_t)(info.cmd_commit_us_total / info.cmds_committed) : 0));
    json_object_set_new(rj, "local_store_us_mean",
                        json_integer(info.entries_stored ? (json_int_t)(info.store_us_total / info.entries_stored) : 0));
    json_object_set_new(rj, "snapshots_taken", json_integer((json_int_t)info.snapshots_taken));
    json_object_set_new(rj, "snapshots_restored", json_integer((json_int_t)info.snapshots_restored));
    json_object_set_new(rj, "snapshots_by_bytes", json_integer((json_int_t)info.snapshots_by_bytes));
    json_object_set_new(rj, "log_bytes_since_snapshot", json_integer((json_int_t)info.log_bytes));
    json_object_set_new(doc, "raft", rj);

    /* Client requests through the raft log, on this node's service thread (means in µs). */
    json_t *lj = json_object();
    uint64_t nr = s->rl_requests;
    json_object_set_new(lj, "requests", json_integer((json_int_t)nr));
    json_object_set_new(lj, "receive_to_submit_us_mean", json_integer(nr ? (json_int_t)(s->rl_in_us / nr) : 0));
    json_object_set_new(lj, "submit_to_result_us_mean", json_integer(nr ? (json_int_t)(s->rl_raft_us / nr) : 0));
    json_object_set_new(lj, "result_to_reply_us_mean", json_integer(nr ? (json_int_t)(s->rl_out_us / nr) : 0));
    json_object_set_new(doc, "request_latency", lj);

    json_t *members = json_array();
    for (size_t i = 0; i < info.n_members && i < 9; i++) {
        json_t *m = json_object();
        json_object_set_new(m, "id", json_integer((json_int_t)info.members[i].id));
        json_object_set_new(m, "address", json_string(svc_member_address(s, info.members[i].id)));
        json_object_set_new(m, "raft_address", json_string(info.members[i].raft_address));
        json_object_set_new(m, "leader", json_boolean(info.members[i].id == info.leader_id));
        json_array_append_new(members, m);
    }
    json_object_set_new(doc, "members", members);

    json_t *node = json_object();
    json_object_set_new(node, "id", json_integer((json_int_t)c->id));
    json_object_set_new(node, "pid", json_integer((json_int_t)getpid()));
    json_object_set_new(node, "address", json_string(c->listen));
    json_object_set_new(node, "raft_address", json_string(c->raft_address));
    json_object_set_new(node, "data_dir", json_string(c->data_dir));
    json_object_set_new(node, "is_leader", json_boolean(s->is_leader));
    uint64_t now = svc_now_ms();
    json_object_set_new(node, "leader_for_ms", json_integer(s->is_leader ? (json_int_t)(now - s->leader_since_ms) : 0));
    json_object_set_new(node, "in_election_grace", json_boolean(svc_in_election_grace(s)));
    json_object_set_new(doc, "node", node);

    json_t *soft = json_object();
    json_object_set_new(soft, "leases", json_integer((json_int_t)s->leases.n));
    json_object_set_new(soft, "tracked_access", json_integer((json_int_t)s->last_access.n));
    json_object_set_new(soft, "heartbeating_segments", json_integer((json_int_t)s->last_hb.n));
    json_object_set_new(soft, "pending_requests", json_integer((json_int_t)s->pending.n));
    json_object_set_new(soft, "bad_frames", json_integer((json_int_t)s->bad_total));
    json_object_set_new(soft, "local_reads", json_integer((json_int_t)s->local_reads));
    svc_put_status(s, soft); /* level 6: intents logged, puts acknowledged before their seal */
    svc_resolve_status(s, soft); /* range verification and the intent resolver */
    json_object_set_new(doc, "soft_state", soft);
    json_object_set_new(doc, "repair", svc_repair_status(s));
    svc_liveness_status(s, doc);
    svc_evict_status(s, doc);

    json_t *set = json_object();
    json_object_set_new(set, "election_timeout_ms", json_integer(c->election_timeout_ms));
    json_object_set_new(set, "raft_heartbeat_ms", json_integer(c->raft_heartbeat_ms));
    json_object_set_new(set, "snapshot_threshold", json_integer((json_int_t)c->snapshot_threshold));
    json_object_set_new(set, "snapshot_trailing", json_integer((json_int_t)c->snapshot_trailing));
    json_object_set_new(set, "snapshot_log_bytes", json_integer((json_int_t)c->snapshot_log_bytes));
    json_object_set_new(set, "group_commit_max", json_integer(c->group_commit_max));
    json_object_set_new(set, "default_kv_lease_ttl", json_integer((json_int_t)c->default_kv_lease_ttl_ms));
    json_object_set_new(set, "client_ttl", json_integer((json_int_t)c->client_ttl_ms));
    json_object_set_new(set, "put_ttl", json_integer((json_int_t)c->put_ttl_ms));
    json_object_set_new(set, "fence_grace_ms", json_integer((json_int_t)c->fence_grace_ms));
    json_object_set_new(set, "eviction_ratio", json_real(c->eviction_ratio));
    json_object_set_new(set, "eviction_high_watermark_ratio", json_real(c->eviction_high_watermark_ratio));
    json_object_set_new(set, "eviction_headroom_factor", json_real(c->eviction_headroom_factor));
    json_object_set_new(set, "probe_timeout_ms", json_integer(c->probe_timeout_ms));
    json_object_set_new(doc, "settings", set);

    char *out = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    return out;
}
