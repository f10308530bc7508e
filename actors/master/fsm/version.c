/*
 * version.c — feature levels for rolling upgrades (version.h).
 */
#include "actors/master/fsm/version.h"

static bool peer_fresh(const struct kvp_feature_peer *p, uint64_t now_ms);

uint32_t kvp_feature_cluster_level(uint32_t self, const struct kvp_feature_peer *peers, size_t n,
                                   uint64_t now_ms)
{
    uint32_t level = self;
    for (size_t i = 0; i < n; i++) {
        const struct kvp_feature_peer *p = &peers[i];
        bool fresh = peer_fresh(p, now_ms);
        uint32_t l = fresh && p->level ? p->level : 1u;
        if (l < level)
            level = l;
    }
    return level ? level : 1u;
}

static bool peer_fresh(const struct kvp_feature_peer *p, uint64_t now_ms)
{
    return p->heard_ms && now_ms >= p->heard_ms && now_ms - p->heard_ms < KVP_FEATURE_FRESH_MS;
}

uint32_t kvp_feature_effective_level(uint32_t self, const struct kvp_feature_peer *peers, size_t n,
                                     uint64_t now_ms, uint32_t committed)
{
    uint32_t computed = kvp_feature_cluster_level(self, peers, n, now_ms);
    if (committed <= computed)
        return computed;
    uint32_t floor = committed < self ? committed : self;
    for (size_t i = 0; i < n; i++)
        if (peer_fresh(&peers[i], now_ms)) {
            uint32_t l = peers[i].level ? peers[i].level : 1u;
            if (l < floor)
                floor = l;
        }
    return floor > computed ? floor : computed;
}

size_t kvp_feature_gate_put_start(Kvp__PutStartReq *ps, uint32_t level)
{
    if (!ps || level >= KVP_FEATURE_AVOID_SEGMENTS)
        return 0;
    size_t n = ps->n_avoid_segments;
    ps->n_avoid_segments = 0; /* the array stays owned by the request; only the count goes */
    return n;
}

uint32_t kvp_feature_command_needs(const Kvp__Command *c)
{
    if (c && c->body_case == KVP__COMMAND__BODY_PUT_SEAL)
        return KVP_FEATURE_INTENT;
    if (c && c->body_case == KVP__COMMAND__BODY_PUT_COMMIT && c->put_commit)
        for (size_t i = 0; i < c->put_commit->n_items; i++)
            if (c->put_commit->items[i] && c->put_commit->items[i]->intent)
                return KVP_FEATURE_INTENT; /* a level-5 member would make it complete at once */
    if (c && (c->body_case == KVP__COMMAND__BODY_RESERVE || c->body_case == KVP__COMMAND__BODY_PUT_COMMIT))
        return KVP_FEATURE_RESERVE;
    if (c && c->body_case == KVP__COMMAND__BODY_RAISE_LEVEL)
        return c->raise_level && c->raise_level->level > KVP_FEATURE_COMMITTED ? c->raise_level->level
                                                                                : KVP_FEATURE_COMMITTED;
    if (c && c->body_case == KVP__COMMAND__BODY_PUT_START && c->put_start && c->put_start->n_avoid_segments)
        return KVP_FEATURE_AVOID_SEGMENTS;
    return 1u;
}

void kvp_feature_prepare_command(Kvp__Command *c, uint32_t level)
{
    if (!c)
        return;
    if (c->body_case == KVP__COMMAND__BODY_PUT_START && c->put_start)
        kvp_feature_gate_put_start(c->put_start, level);
    uint32_t needs = kvp_feature_command_needs(c);
    c->feature_level = needs > 1 ? needs : 0;
}
