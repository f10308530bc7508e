/*
 * kvpoolctl_admin.c — kvpoolctl's cluster administration commands: status, leader, members,
 * segments, transfer-leader, add-member, remove-member. Each prints a short human form, or
 * with --json one JSON document on stdout. docs/operations.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "tools/kvpoolctl/kvpoolctl_ctl.h"

static int no_args(struct ctl *c, int argc, char **argv)
{
    if (argc > 1) {
        fprintf(stderr, "kvpoolctl %s: unexpected argument '%s'\n", argv[0], argv[1]);
        return 2;
    }
    return 0;
}

static bool parse_id(const char *s, uint64_t *out)
{
    char *end = NULL;
    if (!s || !*s || *s == '-')
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (!end || *end || v == 0)
        return false;
    *out = v;
    return true;
}

static json_int_t jint(json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

static const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static void human_bytes(uint64_t b, char *buf, size_t cap)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    snprintf(buf, cap, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

static void print_segments(json_t *segs)
{
    size_t i;
    json_t *s;
    printf("%-4s %-20s %-22s %-9s %10s %10s %8s %6s\n", "ID", "NAME", "ENDPOINT", "STATE", "SIZE", "USED",
           "OBJECTS", "FREEX");
    json_array_foreach(segs, i, s) {
        char sz[32], used[32];
        human_bytes((uint64_t)jint(s, "size"), sz, sizeof sz);
        human_bytes((uint64_t)jint(s, "used"), used, sizeof used);
        printf("%-4lld %-20s %-22s %-9s %10s %10s %8lld %6lld\n", (long long)jint(s, "id"), jstr(s, "name"),
               jstr(s, "endpoint"), jstr(s, "state"), sz, used, (long long)jint(s, "objects"),
               (long long)jint(s, "free_extents"));
    }
}

int ctl_cmd_status(struct ctl *c, int argc, char **argv)
{
    int rc = no_args(c, argc, argv);
    if (rc)
        return rc;
    int err;
    json_t *st = ctl_status(c, 0, &err);
    if (!st)
        return ctl_fail(c, "status", err, NULL);
    if (c->json) {
        ctl_print_json(st);
        json_decref(st);
        return 0;
    }
    json_t *node = json_object_get(st, "node");
    printf("leader   %lld at %s (pid %lld), term %lld, commit index %lld\n", (long long)jint(st, "leader_id"),
           jstr(st, "leader_address"), (long long)jint(node, "pid"), (long long)jint(st, "term"),
           (long long)jint(st, "commit_index"));
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(st, "members"), i, m)
        printf("member   %lld  control %-22s raft %-22s%s\n", (long long)jint(m, "id"), jstr(m, "address"),
               jstr(m, "raft_address"), json_is_true(json_object_get(m, "leader")) ? "  leader" : "");
    char cap[32], used[32], quar[32];
    human_bytes((uint64_t)jint(st, "capacity_bytes"), cap, sizeof cap);
    human_bytes((uint64_t)jint(st, "used_bytes"), used, sizeof used);
    human_bytes((uint64_t)jint(st, "quarantined_bytes"), quar, sizeof quar);
    printf("objects  %lld complete, %lld pending puts\n", (long long)jint(st, "objects"),
           (long long)jint(st, "pending_puts"));
    char pinned[32];
    human_bytes((uint64_t)jint(st, "pinned_bytes"), pinned, sizeof pinned);
    printf("pool     %s capacity, %s used, %s quarantined, %s soft-pinned\n", cap, used, quar, pinned);
    json_t *ev = json_object_get(st, "eviction"); /* docs/eviction.md */
    if (ev)
        printf("eviction policy %s, %lld rounds, %lld objects evicted, %lld blocked rounds%s\n",
               jstr(ev, "policy"), (long long)jint(ev, "rounds"), (long long)jint(ev, "objects_evicted"),
               (long long)jint(ev, "blocked_rounds"),
               json_is_true(json_object_get(ev, "blocked")) ? " (blocked: everything leased or pinned)" : "");
    size_t ti;
    json_t *tn; /* use per tenant (docs/security.md); absent with auth none */
    json_array_foreach(json_object_get(st, "tenants"), ti, tn) {
        char tu[32], tq[32] = "none";
        human_bytes((uint64_t)jint(tn, "used_bytes"), tu, sizeof tu);
        if (jint(tn, "quota_bytes"))
            human_bytes((uint64_t)jint(tn, "quota_bytes"), tq, sizeof tq);
        const char *name = jstr(tn, "tenant");
        printf("tenant   %-16s %s used, %lld objects, quota %s, %lld quota evictions, %lld refused puts\n",
               name && *name ? name : "(default)", tu, (long long)jint(tn, "objects"), tq,
               (long long)jint(tn, "quota_evictions"), (long long)jint(tn, "quota_refusals"));
    }
    json_t *segs = json_object_get(st, "segments");
    printf("segments %zu\n", json_array_size(segs));
    if (json_array_size(segs))
        print_segments(segs);
    json_t *set = json_object_get(st, "settings");
    const char *k;
    json_t *v;
    printf("settings");
    json_object_foreach(set, k, v) {
        if (json_is_real(v))
            printf(" %s=%g", k, json_real_value(v));
        else
            printf(" %s=%lld", k, (long long)json_integer_value(v));
    }
    printf("\n");
    json_decref(st);
    return 0;
}

int ctl_cmd_leader(struct ctl *c, int argc, char **argv)
{
    int rc = no_args(c, argc, argv);
    if (rc)
        return rc;
    int err;
    json_t *st = ctl_status(c, 0, &err);
    if (!st)
        return ctl_fail(c, "leader", err, "no leader answered");
    /* ClusterStatus is answered by the leader itself, so its "node" is the leader. */
    json_t *node = json_object_get(st, "node");
    json_int_t id = jint(st, "leader_id");
    if (!id)
        id = jint(node, "id");
    const char *addr = jstr(st, "leader_address");
    if (!*addr)
        addr = jstr(node, "address");
    json_int_t pid = jint(node, "pid");
    if (c->json) {
        json_t *j = json_pack("{s:I, s:s, s:I, s:I}", "id", id, "address", addr, "pid", pid, "term",
                              jint(st, "term"));
        ctl_print_json(j);
        json_decref(j);
    } else {
        printf("leader %lld at %s (pid %lld, term %lld)\n", (long long)id, addr, (long long)pid,
               (long long)jint(st, "term"));
    }
    json_decref(st);
    return 0;
}

int ctl_cmd_members(struct ctl *c, int argc, char **argv)
{
    int rc = no_args(c, argc, argv);
    if (rc)
        return rc;
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__MembersReq mr = KVP__MEMBERS_REQ__INIT;
    req.body_case = KVP__REQUEST__BODY_MEMBERS;
    req.members = &mr;
    Kvp__Response *resp = NULL;
    int err = ctl_call(c, &req, 0, &resp);
    if (err == KVP_OK && resp->status != KVP_OK)
        err = resp->status;
    if (err == KVP_OK && !resp->members)
        err = KVP_ERR_MALFORMED;
    if (err != KVP_OK) {
        ctl_response_free(resp);
        return ctl_fail(c, "members", err, NULL);
    }
    Kvp__MembersResp *m = resp->members;
    if (c->json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < m->n_members; i++)
            json_array_append_new(arr, json_pack("{s:I, s:s, s:s, s:b}", "id", (json_int_t)m->members[i]->id,
                                                 "address", m->members[i]->address, "raft_address",
                                                 m->members[i]->raft_address, "leader",
                                                 m->members[i]->id == m->leader_id));
        json_t *j = json_pack("{s:I, s:I, s:o}", "leader_id", (json_int_t)m->leader_id, "term",
                              (json_int_t)m->term, "members", arr);
        ctl_print_json(j);
        json_decref(j);
    } else {
        printf("%-4s %-22s %-22s %s\n", "ID", "CONTROL", "RAFT", "ROLE");
        for (size_t i = 0; i < m->n_members; i++)
            printf("%-4llu %-22s %-22s %s\n", (unsigned long long)m->members[i]->id,
                   *m->members[i]->address ? m->members[i]->address : "?", m->members[i]->raft_address,
                   m->members[i]->id == m->leader_id ? "leader" : "voter");
        printf("term %llu\n", (unsigned long long)m->term);
    }
    ctl_response_free(resp);
    return 0;
}

/* Per segment: when the leader last heard it, from whom, and why it is suspected; then the
 * rule's state (withheld lost decisions, the last blind period). docs/operations.md. */
static void print_liveness(json_t *st)
{
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(st, "segments"), i, s) {
        json_t *l = json_object_get(s, "liveness");
        if (!l)
            continue;
        long long h = (long long)jint(l, "last_heard_ms_ago");
        char heard[128];
        if (h < 0)
            snprintf(heard, sizeof heard, "not heard by this leader");
        else
            snprintf(heard, sizeof heard, "heard %lld ms ago by %s, period %lld ms", h, jstr(l, "heard_by"),
                     (long long)jint(l, "heartbeat_period_ms"));
        printf("  %-4lld %s: %s%s%s\n", (long long)jint(s, "id"), heard, jstr(l, "verdict"), *jstr(l, "why") ? ": " : "",
               jstr(l, "why"));
    }
    json_t *lv = json_object_get(st, "liveness");
    if (!lv)
        return;
    if (json_is_true(json_object_get(lv, "withholding")))
        printf("WITHHOLDING lost decisions for %lld ms: %s\n", (long long)jint(lv, "withheld_for_ms"),
               jstr(lv, "withheld_why"));
    printf("liveness: heard %lld of %lld segments; quorum contact %lld ms ago; %lld blind periods",
           (long long)jint(lv, "heard"), (long long)jint(lv, "checked"), (long long)jint(lv, "quorum_contact_ms_ago"),
           (long long)jint(lv, "blind_periods"));
    if (jint(lv, "blind_periods") > 0)
        printf(" (last %lld ms ago: %s)", (long long)jint(lv, "last_blind_ms_ago"), jstr(lv, "last_blind_why"));
    printf("; %lld withheld episodes\n", (long long)jint(lv, "withheld_episodes"));
}

int ctl_cmd_segments(struct ctl *c, int argc, char **argv)
{
    int rc = no_args(c, argc, argv);
    if (rc)
        return rc;
    int err;
    json_t *st = ctl_status(c, 0, &err);
    if (!st)
        return ctl_fail(c, "segments", err, NULL);
    json_t *segs = json_object_get(st, "segments");
    if (c->json)
        ctl_print_json(segs ? segs : json_array());
    else {
        print_segments(segs);
        print_liveness(st);
    }
    json_decref(st);
    return 0;
}

static int simple_call(struct ctl *c, const char *cmd, Kvp__Request *req, const char *done)
{
    Kvp__Response *resp = NULL;
    int err = ctl_call(c, req, 0, &resp);
    const char *ctx = NULL;
    if (err == KVP_OK && resp->status != KVP_OK) {
        err = resp->status;
        ctx = resp->error;
    }
    int rc;
    if (err != KVP_OK) {
        rc = ctl_fail(c, cmd, err, ctx);
    } else {
        if (c->json) {
            json_t *j = json_pack("{s:s}", "result", "ok");
            ctl_print_json(j);
            json_decref(j);
        } else {
            printf("%s\n", done);
        }
        rc = 0;
    }
    ctl_response_free(resp);
    return rc;
}

int ctl_cmd_transfer_leader(struct ctl *c, int argc, char **argv)
{
    uint64_t target = 0;
    if (argc > 2 || (argc == 2 && !parse_id(argv[1], &target))) {
        fprintf(stderr, "usage: kvpoolctl transfer-leader [ID]   (ID >= 1; none = any other member)\n");
        return 2;
    }
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__TransferLeaderReq tl = KVP__TRANSFER_LEADER_REQ__INIT;
    tl.target_id = target;
    req.body_case = KVP__REQUEST__BODY_TRANSFER_LEADER;
    req.transfer_leader = &tl;
    return simple_call(c, "transfer-leader", &req, "leadership transfer done");
}

int ctl_cmd_add_member(struct ctl *c, int argc, char **argv)
{
    uint64_t id = 0;
    if (argc != 4 || !parse_id(argv[1], &id) || !strchr(argv[2], ':') || !strchr(argv[3], ':')) {
        fprintf(stderr, "usage: kvpoolctl add-member ID CTRL_HOST:PORT RAFT_HOST:PORT\n");
        return 2;
    }
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__AddMemberReq am = KVP__ADD_MEMBER_REQ__INIT;
    Kvp__Member m = KVP__MEMBER__INIT;
    m.id = id;
    m.address = argv[2];
    m.raft_address = argv[3];
    am.member = &m;
    req.body_case = KVP__REQUEST__BODY_ADD_MEMBER;
    req.add_member = &am;
    return simple_call(c, "add-member", &req, "member added");
}

int ctl_cmd_remove_member(struct ctl *c, int argc, char **argv)
{
    uint64_t id = 0;
    if (argc != 2 || !parse_id(argv[1], &id)) {
        fprintf(stderr, "usage: kvpoolctl remove-member ID\n");
        return 2;
    }
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__RemoveMemberReq rm = KVP__REMOVE_MEMBER_REQ__INIT;
    rm.id = id;
    req.body_case = KVP__REQUEST__BODY_REMOVE_MEMBER;
    req.remove_member = &rm;
    return simple_call(c, "remove-member", &req, "member removed");
}

/* The operator's answer to a withheld episode that does not end (docs/operations.md "How a
 * segment is declared lost"): refuses without --yes, since a live segment declared lost loses
 * every object whose only replicas it holds. */
int ctl_cmd_segment_lost(struct ctl *c, int argc, char **argv)
{
    uint64_t id = 0;
    bool yes = argc == 3 && strcmp(argv[2], "--yes") == 0;
    if ((argc != 2 && !yes) || !parse_id(argv[1], &id) || id == 0 || id > UINT32_MAX) {
        fprintf(stderr, "usage: kvpoolctl segment-lost ID --yes\n");
        return 2;
    }
    if (!yes) {
        fprintf(stderr, "kvpoolctl segment-lost: segment %llu would be declared lost NOW: its replicas are dropped "
                        "(objects with no other replica are gone) and, if it is alive, it remounts empty.\n"
                        "Only for a segment you know is dead while the leader withholds the decision "
                        "(kvpoolctl segments). Repeat with --yes to do it.\n",
                (unsigned long long)id);
        return 2;
    }
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__SegmentLostCmd sl = KVP__SEGMENT_LOST_CMD__INIT;
    sl.segment_id = (uint32_t)id;
    req.body_case = KVP__REQUEST__BODY_SEGMENT_LOST;
    req.segment_lost = &sl;
    return simple_call(c, "segment-lost", &req, "segment declared lost (replicas dropped; repair re-replicates)");
}

int ctl_cmd_drain(struct ctl *c, int argc, char **argv)
{
    if (argc != 2 || !argv[1][0]) {
        fprintf(stderr, "usage: kvpoolctl drain SEGMENT   (segment id or name)\n");
        return 2;
    }
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__DrainSegmentReq dr = KVP__DRAIN_SEGMENT_REQ__INIT;
    uint64_t id = 0;
    if (parse_id(argv[1], &id) && id <= UINT32_MAX)
        dr.segment_id = (uint32_t)id;
    else
        dr.name = argv[1];
    req.body_case = KVP__REQUEST__BODY_DRAIN;
    req.drain = &dr;
    return simple_call(c, "drain", &req, "segment marked DRAINING (no new allocations; readers steered away)");
}
