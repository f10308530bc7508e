/*
 * service_version.c — the leader learns every other member's feature level (version.h).
 *
 * Once a second, while leader, it sends each other member a MembersReq on a DEALER of its own
 * (connected to the member's control address). Every master's Response carries its
 * feature_level, NOT_LEADER replies included; a v0.1.0 master's carries none (read as 1), and
 * one that does not answer within KVP_FEATURE_FRESH_MS counts as 1. The members asked are those
 * of the Raft configuration (all roles). The cluster's level is computed on each tick, and
 * svc_submit gates each command with it. All of it runs on the service actor's thread.
 *
 * Committed level (level 4, docs/master.md "Committed feature level"): once every member has
 * reported a level of 4 or more above the FSM's committed one, the leader logs RaiseLevelCmd
 * (at most every 3 s until it is applied). A leader then logs with the committed level even
 * while a member is down or not yet heard (kvp_feature_effective_level), so the one-commit put
 * goes on across a failover. An AddMember waits until the new member reports the committed level
 * (svc_version_add_member): a master that could not apply the log never joins.
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
#define RAISE_RETRY_MS 3000 /* a RaiseLevelCmd not yet applied is logged again after this */
#define ADMIT_WAIT_MS 3000  /* how long an AddMember waits for the new member's level */

static void admit_resolve(struct kvp_master_service *s);

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
                if (s->admit_p && s->admit_slot == (int)(i - 1))
                    admit_resolve(s);
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
    if (!s->is_leader)
        return 1u;
    if (s->feature_level_term != s->term || !s->feature_level) {
        /* No tick yet in this leadership, no member heard: the committed level as last read
         * from the FSM (svc_version_refresh as soon as this leader's state is current, i.e. its
         * first segment table; else a tick, which reads it whenever the raftlog allows a local
         * read; it only grows, so a stale one errs low), else 1. */
        uint32_t c = s->feature_committed;
        return c > 1 ? (c < KVP_FEATURE_LEVEL ? c : KVP_FEATURE_LEVEL) : 1u;
    }
    return s->feature_level;
}

/* RaiseLevelCmd{level}: its result is not needed (the next tick reads the FSM). */
static void submit_raise(struct kvp_master_service *s, uint32_t level)
{
    Kvp__RaiseLevelCmd body = KVP__RAISE_LEVEL_CMD__INIT;
    body.level = level;
    s->feature_raise_ms = kvp_clock_now_ms();
    kvp_log_info(s->actor, "every member reports feature level %u or more: committing it (was %u)",
                 (unsigned)level, (unsigned)s->feature_committed);
    svc_submit_internal(s, SVC_INT_RAISE_LEVEL, KVP__COMMAND__BODY_RAISE_LEVEL, &body, 0);
}

/* The parked AddMember: add it if its member reported at least the committed level (fresh),
 * else (or when no longer leader) refuse it. */
static void admit_resolve(struct kvp_master_service *s)
{
    struct svc_pending *p = s->admit_p;
    if (!p)
        return;
    s->admit_p = NULL;
    const struct kvp_feature_peer *fp = &s->feature_peers[s->admit_slot];
    uint64_t now = kvp_clock_now_ms();
    bool fresh = fp->heard_ms && now >= fp->heard_ms && now - fp->heard_ms < KVP_FEATURE_FRESH_MS;
    uint32_t need = s->feature_committed;
    int rc = KVP_OK;
    char why[200];
    snprintf(why, sizeof why, "add member refused");
    if (!s->is_leader) {
        rc = KVP_ERR_NOT_LEADER;
    } else if (!fresh || fp->level < need) {
        rc = KVP_ERR_VERSION;
        if (fresh)
            snprintf(why, sizeof why, "member %llu has feature level %u, the cluster committed %u: upgrade it first",
                     (unsigned long long)s->admit_id, (unsigned)fp->level, (unsigned)need);
        else
            snprintf(why, sizeof why, "member %llu did not report its feature level within %u ms (the cluster "
                     "committed %u): start it first, then add it", (unsigned long long)s->admit_id,
                     (unsigned)ADMIT_WAIT_MS, (unsigned)need);
        kvp_log_warn(s->actor, "%s", why);
    } else {
        rc = kvp_raftlog_add_voter(s->rl, p->corr, s->admit_id, s->admit_raft);
    }
    if (rc == KVP_OK)
        return; /* the raftlog answers it */
    uint64_t v;
    svc_map_del(&s->pending, p->corr, &v);
    svc_reply_status(s, p->identity, p->req_id, rc, why);
    svc_pending_free(p);
}

/* s->feature_committed from the FSM, when the raftlog allows a local read (leader, state
 * current); else it keeps the last value read. */
static void read_committed(struct kvp_master_service *s)
{
    if (kvp_raftlog_read_begin(s->rl) == KVP_OK) {
        s->feature_committed = kvp_master_fsm_feature_level(s->fsm);
        kvp_raftlog_read_end(s->rl);
    }
}

void svc_version_refresh(struct kvp_master_service *s)
{
    read_committed(s);
}

void svc_version_add_member(struct kvp_master_service *s, struct svc_pending *p, int slot, uint64_t id,
                            const char *raft_address)
{
    /* Read now, not at the last tick: a leader elected less than a tick ago still holds what it
     * read in an earlier leadership (or 0, never leader), and a member that cannot apply the
     * committed level would be added at once. */
    read_committed(s);
    uint32_t need = s->feature_committed;
    int rc;
    if (need <= 1) {
        rc = kvp_raftlog_add_voter(s->rl, p->corr, id, raft_address);
    } else if (slot < 0 || s->admit_p) {
        rc = slot < 0 ? KVP_ERR_INVALID : KVP_ERR_BUSY; /* no room in the members book / one at a time */
    } else {
        s->admit_p = p;
        s->admit_slot = slot;
        s->admit_id = id;
        s->admit_since_ms = kvp_clock_now_ms();
        snprintf(s->admit_raft, sizeof s->admit_raft, "%s", raft_address);
        uint64_t now = kvp_clock_now_ms();
        const struct kvp_feature_peer *fp = &s->feature_peers[slot];
        if (s->feature_sock[slot] && fp->heard_ms && now - fp->heard_ms < KVP_FEATURE_FRESH_MS &&
            fp->level >= need) {
            admit_resolve(s); /* heard already (a member re-added) */
            return;
        }
        kvp_log_info(s->actor, "member %llu: asking its feature level before adding it (committed %u)",
                     (unsigned long long)id, (unsigned)need);
        memset(&s->feature_peers[slot], 0, sizeof s->feature_peers[slot]);
        ask_peer(s, slot);
        return;
    }
    if (rc == KVP_OK)
        return;
    uint64_t v;
    svc_map_del(&s->pending, p->corr, &v);
    svc_reply_status(s, p->identity, p->req_id, rc, "add member refused");
    svc_pending_free(p);
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
    read_committed(s);
    if (s->admit_p && (!s->is_leader || kvp_clock_now_ms() - s->admit_since_ms >= ADMIT_WAIT_MS))
        admit_resolve(s);
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
    uint64_t now = kvp_clock_now_ms();
    uint32_t computed = kvp_feature_cluster_level(KVP_FEATURE_LEVEL, peers, n, now);
    uint32_t level = kvp_feature_effective_level(KVP_FEATURE_LEVEL, peers, n, now, s->feature_committed);
    s->feature_level = level;
    s->feature_level_term = s->term;
    if (kvp_feature_should_raise(computed, s->feature_committed) &&
        (!s->feature_raise_ms || now - s->feature_raise_ms >= RAISE_RETRY_MS))
        submit_raise(s, computed);
    if (level != s->feature_level_logged) {
        kvp_log_info(s->actor, "cluster feature level %u (committed %u, this master %u; members id:level, 0 = not "
                     "heard: %s)%s",
                     (unsigned)level, (unsigned)s->feature_committed, (unsigned)KVP_FEATURE_LEVEL, who,
                     level < KVP_FEATURE_AVOID_SEGMENTS
                         ? "; PutStart avoid lists are not logged until every member has level 2"
                         : "");
        s->feature_level_logged = level;
    }
    return 0;
}

int svc_version_start(struct kvp_master_service *s)
{
    return svc_timer_every(s, VERSION_POLL_MS, on_version_tick); /* its own error, not always NOMEM */
}

void svc_version_stop(struct kvp_master_service *s)
{
    for (int i = 0; i < KVP_CFG_MAX_MASTERS; i++)
        close_peer(s, i);
}
