/*
 * service_version.c — the leader learns every other member's feature level (version.h).
 *
 * Once a second, while leader, it sends each other member a MembersReq on a DEALER of its own
 * (connected to the member's control address). Every master's Response carries its
 * feature_level, NOT_LEADER replies included; a v0.1.0 master's carries none (read as 1), and
 * one that does not answer within KVP_FEATURE_FRESH_MS counts as 1. The members asked are those
 * of the Raft configuration (all roles). The cluster's level is computed on each tick, and
 * svc_submit gates each command with it. All of it runs on the service actor's thread.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/master/service/service_state.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "wire/envelope.h"

#define VERSION_POLL_MS 1000

static int on_peer_reply(struct kvp_master_service *s, zsock_t *sock)
{
    for (int n = 0; n < 64; n++) {
        zframe_t *f = zframe_recv_nowait(sock);
        if (!f)
            break;
        Kvp__Response *resp = NULL;
        int rc = kvp_wire_decode_response(zframe_data(f), zframe_size(f), &resp);
        if (rc != KVP_OK) {
            kvp_log_warn(s->actor, "feature level: undecodable answer from a member: %s", kvp_strerror(rc));
        } else {
            /* req_id is members[] index + 1 of the member asked. */
            uint64_t i = resp->req_id;
            if (i >= 1 && i <= (uint64_t)s->n_members && s->feature_sock[i - 1] == sock) {
                s->feature_peers[i - 1].level = kvp_feature_reported(resp->feature_level);
                s->feature_peers[i - 1].heard_ms = kvp_clock_now_ms();
            }
            protobuf_c_message_free_unpacked(&resp->base, NULL);
        }
        zframe_destroy(&f);
    }
    return 0;
}

static void close_peer(struct kvp_master_service *s, int i)
{
    if (s->feature_sock[i]) {
        svc_unwatch(s, s->feature_sock[i]);
        zsock_destroy(&s->feature_sock[i]);
    }
    s->feature_addr[i][0] = '\0';
    memset(&s->feature_peers[i], 0, sizeof s->feature_peers[i]);
}

static void ask_peer(struct kvp_master_service *s, int i)
{
    const struct kvp_master_member *m = &s->members[i];
    if (s->feature_sock[i] && strcmp(s->feature_addr[i], m->address) != 0)
        close_peer(s, i); /* the member list changed under this index */
    if (!s->feature_sock[i]) {
        zsock_t *d = zsock_new(ZMQ_DEALER);
        if (!d)
            return;
        zsock_set_linger(d, 0);
        zsock_set_sndhwm(d, 4); /* an unreachable member queues a few asks, not thousands */
        zsock_set_sndtimeo(d, 0);
        if (svc_auth_peer_socket(s, d, m->address) != KVP_OK || /* CURVE (service_auth.c) */
            zsock_connect(d, "tcp://%s", m->address) != 0 || svc_watch(s, d, on_peer_reply) != KVP_OK) {
            zsock_destroy(&d);
            return;
        }
        s->feature_sock[i] = d;
        size_t l = strnlen(m->address, sizeof s->feature_addr[i] - 1);
        memcpy(s->feature_addr[i], m->address, l);
        s->feature_addr[i][l] = '\0';
    }
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__MembersReq mr = KVP__MEMBERS_REQ__INIT;
    req.req_id = (uint64_t)i + 1;
    req.timeout_ms = VERSION_POLL_MS;
    req.body_case = KVP__REQUEST__BODY_MEMBERS;
    req.members = &mr;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (kvp_wire_encode_request(&req, &buf, &len) != KVP_OK)
        return;
    zframe_t *f = zframe_new(buf, len);
    free(buf);
    if (f && zframe_send(&f, s->feature_sock[i], ZFRAME_DONTWAIT) != 0)
        zframe_destroy(&f); /* queue full: the member is not answering; it ages out */
}

uint32_t svc_feature_level(struct kvp_master_service *s)
{
    /* Computed by the last tick of this leadership; until then (or not leader): 1. */
    if (!s->is_leader || s->feature_level_term != s->term || !s->feature_level)
        return 1u;
    return s->feature_level;
}

static int members_index(const struct kvp_master_service *s, uint64_t id)
{
    for (int i = 0; i < s->n_members; i++)
        if (s->members[i].id == id)
            return i;
    return -1;
}

static int on_version_tick(struct kvp_master_service *s)
{
    if (!s->is_leader) {
        for (int i = 0; i < KVP_CFG_MAX_MASTERS; i++)
            close_peer(s, i);
        s->feature_level = 0;
        s->feature_level_logged = 0;
        return 0;
    }
    /* The Raft configuration, all roles (a standby applies the log too); an address from the
     * members book. A member without a known address cannot be asked: it counts as level 1. */
    struct kvp_raftlog_info info;
    memset(&info, 0, sizeof info);
    kvp_raftlog_get_info(s->rl, &info);
    struct kvp_feature_peer peers[9];
    size_t n = 0;
    char who[512];
    size_t off = 0;
    who[0] = '\0';
    for (size_t j = 0; j < info.n_members && j < 9; j++) {
        uint64_t id = info.members[j].id;
        uint32_t shown = KVP_FEATURE_LEVEL;
        if (id != s->cfg.id) {
            int i = members_index(s, id);
            if (i >= 0)
                ask_peer(s, i);
            peers[n] = i >= 0 ? s->feature_peers[i] : (struct kvp_feature_peer){0, 0};
            shown = peers[n].level;
            n++;
        }
        if (off < sizeof who) {
            int w = snprintf(who + off, sizeof who - off, "%s%llu:%u", off ? " " : "", (unsigned long long)id,
                             (unsigned)shown);
            if (w > 0)
                off += (size_t)w;
        }
    }
    uint32_t level = kvp_feature_cluster_level(KVP_FEATURE_LEVEL, peers, n, kvp_clock_now_ms());
    s->feature_level = level;
    s->feature_level_term = s->term;
    if (level != s->feature_level_logged) {
        kvp_log_info(s->actor, "cluster feature level %u (this master %u; members id:level, 0 = not heard: %s)%s",
                     (unsigned)level, (unsigned)KVP_FEATURE_LEVEL, who,
                     level < KVP_FEATURE_AVOID_SEGMENTS
                         ? "; PutStart avoid lists are not logged until every member has level 2"
                         : "");
        s->feature_level_logged = level;
    }
    return 0;
}

int svc_version_start(struct kvp_master_service *s)
{
    return svc_timer_every(s, VERSION_POLL_MS, on_version_tick) != KVP_OK ? KVP_ERR_NOMEM : KVP_OK;
}

void svc_version_stop(struct kvp_master_service *s)
{
    for (int i = 0; i < KVP_CFG_MAX_MASTERS; i++)
        close_peer(s, i);
}
