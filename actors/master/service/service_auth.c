/*
 * service_auth.c — the master's side of authentication (docs/security.md, auth/auth.h):
 * the ROUTER as a CURVE server with a ZAP handler over the allowed-keys directory, the
 * handshake monitor, this master's own keys toward its peers, the refusal of Raft on a
 * non-loopback address while the Raft transport is unauthenticated, and the admission of each
 * request: the sender's role must allow it and its keys are scoped to the sender's tenant.
 */
#include <stdio.h>
#include <string.h>

#include "actors/master/service/service_quota.h"
#include "actors/master/service/service_state.h"
#include "auth/auth_scope.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"

/* "127.x.y.z:P", "localhost:P", "[::1]:P": the only Raft addresses allowed with auth on and an
 * untrusted Raft network. canonical raft's TCP transport has no authentication of its own. */
static bool loopback(const char *hostport)
{
    if (strncmp(hostport, "127.", 4) == 0 || strncmp(hostport, "localhost:", 10) == 0 ||
        strncmp(hostport, "[::1]:", 6) == 0)
        return true;
    return false;
}

int svc_auth_start(struct kvp_master_service *s)
{
    int rc = kvp_auth_server_new(&s->auth, s->cfg.auth, s->cfg.auth_key, s->cfg.auth_allowed_dir, s->actor);
    if (rc != KVP_OK)
        return rc;
    if (!s->auth) {
        if (s->cfg.tenant_quota[0])
            kvp_log_warn(s->actor, "tenant_quota ignored: tenants come from keys, and auth is none");
        return KVP_OK; /* auth none: WARN logged */
    }
    rc = svc_quota_new(s);
    if (rc != KVP_OK)
        return rc;
    if (!loopback(s->cfg.raft_address) && !s->cfg.raft_network_trusted) {
        kvp_log_error(s->actor,
                      "raft_address=%s is not a loopback address: the Raft transport does not authenticate its "
                      "peers, so with auth on it binds only loopback unless raft_network_trusted=true says the "
                      "Raft network is reachable by the masters alone (docs/security.md \"Raft peers\")",
                      s->cfg.raft_address);
        return KVP_ERR_INVALID;
    }
    if (!loopback(s->cfg.raft_address))
        kvp_log_warn(s->actor, "raft_address=%s: Raft peers are not authenticated; raft_network_trusted=true says "
                     "only the masters can reach this network (docs/security.md)", s->cfg.raft_address);
    rc = kvp_auth_server_apply(s->auth, s->router);
    if (rc != KVP_OK) {
        kvp_log_error(s->actor, "auth: cannot make the control socket a CURVE server (libzmq without CURVE?)");
        return rc;
    }
    /* This master's own key pair opens its polls of the other members. */
    if (s->cfg.auth_master_keys[0]) {
        rc = kvp_auth_client_load(&s->peer_auth, "curve", s->cfg.auth_key, s->cfg.auth_master_keys, NULL, NULL,
                                  s->actor);
        if (rc != KVP_OK)
            return rc;
    } else if (s->n_members > 1) {
        kvp_log_warn(s->actor, "auth: no auth_master_keys: this master cannot poll its peers' feature levels");
    }
    s->auth_mon = kvp_auth_server_monitor(s->auth, s->router);
    kvp_log_info(s->actor, "auth: curve; allowed keys in %s", s->cfg.auth_allowed_dir);
    return KVP_OK;
}

static int on_auth_monitor(zloop_t *loop, zsock_t *sock, void *arg)
{
    struct kvp_master_service *s = arg;
    kvp_auth_server_on_monitor(s->auth);
    return 0;
}

int svc_auth_loop_start(struct kvp_master_service *s)
{
    if (!s->auth_mon)
        return KVP_OK;
    return zloop_reader(s->loop, s->auth_mon, on_auth_monitor, s) == 0 ? KVP_OK : KVP_ERR_NOMEM;
}

bool svc_auth_admit(struct kvp_master_service *s, zframe_t *identity, zframe_t *body, Kvp__Request *req)
{
    if (!s->auth)
        return true;
    struct kvp_auth_principal p;
    char why[200] = "";
    int rc;
    if (!kvp_auth_frame_principal(body, &p)) {
        /* Cannot happen on a CURVE ROUTER (ZAP admitted every peer with a User-Id): refuse. */
        snprintf(why, sizeof why, "no authenticated principal");
        rc = KVP_ERR_DENIED;
    } else {
        rc = kvp_auth_scope_request(req, &p, why, sizeof why);
    }
    if (rc == KVP_OK) /* a tenant's PutStart over its quota is answered NO_SPACE there */
        return p.role != KVP_AUTH_ROLE_CLIENT || svc_quota_admit(s, identity, req, p.tenant);
    s->denied_requests++;
    const char *peer = zframe_meta(body, "Peer-Address");
    uint64_t sup = 0;
    if (kvp_auth_ratelog_allow(&s->denied_log, peer ? peer : "?", kvp_clock_now_ms(), &sup))
        kvp_log_warn(s->actor, "auth: refused request %llu from %s (%s): %s (%llu similar lines held back)",
                     (unsigned long long)req->req_id, peer ? peer : "?", p.name, why, (unsigned long long)sup);
    svc_reply_status(s, identity, req->req_id, rc == KVP_ERR_NOMEM ? KVP_ERR_NOMEM : KVP_ERR_DENIED, why);
    return false;
}

int svc_auth_peer_socket(struct kvp_master_service *s, zsock_t *dealer, const char *addr)
{
    if (!s->auth)
        return KVP_OK;
    if (!s->peer_auth)
        return KVP_ERR_INVALID;
    return kvp_auth_client_apply(s->peer_auth, zsock_resolve(dealer), addr);
}

void svc_auth_stop(struct kvp_master_service *s)
{
    svc_quota_destroy(s);
    kvp_auth_client_destroy(&s->peer_auth);
    s->auth_mon = NULL;
    kvp_auth_server_destroy(&s->auth);
}
