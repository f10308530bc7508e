/*
 * service_auth.c — the master's side of authentication (docs/security.md, auth/auth.h):
 * the ROUTER as a CURVE server with a ZAP handler over the allowed-keys directory, the
 * handshake monitor, this master's own keys toward its peers, the refusal of Raft on a
 * non-loopback address while the Raft transport is unauthenticated, and the admission of each
 * request: the sender's role must allow it and its keys are scoped to the sender's tenant.
 */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/master/service/service_quota.h"
#include "actors/master/service/service_state.h"
#include "auth/auth_scope.h"
#include "auth/auth_token.h"
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
    /* The data-plane token key (docs/security.md "Data plane: tokens"): derived from auth_key. */
    s->token_key_ok = kvp_auth_token_key_load(s->cfg.auth_key, s->token_pk, s->token_sk) == KVP_OK;
    if (!s->token_key_ok)
        kvp_log_warn(s->actor, "auth: no data-plane token key could be derived from %s: DataToken refused",
                     s->cfg.auth_key);
    s->auth_mon = kvp_auth_server_monitor(s->auth, s->router);
    kvp_log_info(s->actor, "auth: curve; allowed keys in %s", s->cfg.auth_allowed_dir);
    return KVP_OK;
}

static int on_auth_monitor(struct kvp_master_service *s, zsock_t *sock)
{
    kvp_auth_server_on_monitor(s->auth);
    return 0;
}

int svc_auth_loop_start(struct kvp_master_service *s)
{
    if (!s->auth_mon)
        return KVP_OK;
    return svc_watch(s, s->auth_mon, on_auth_monitor) == KVP_OK ? KVP_OK : KVP_ERR_NOMEM;
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
        rc = kvp_auth_scope_request_with(req, &s->req_arena.pb, &p, why, sizeof why);
        s->cur_principal = p;
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

/*
 * DataToken: sign one token per asked segment for the requesting principal (its tenant, and as
 * client id BLAKE2b-256 of "ROLE/TENANT/NAME") and the ephemeral key it sent, expiring
 * KVP_DT_TTL_MS from now (auth/auth_token.h). Auth none or no token key: UNSUPPORTED.
 */
void svc_auth_on_data_token(struct kvp_master_service *s, zframe_t *id, Kvp__Request *req)
{
    Kvp__DataTokenReq *r = req->data_token;
    if (!s->auth || !s->token_key_ok) {
        svc_reply_status(s, id, req->req_id, KVP_ERR_UNSUPPORTED, "no data-plane tokens (auth none or no token key)");
        return;
    }
    if (r->client_key.len != KVP_DT_PK_BYTES || r->n_segment_ids == 0 || r->n_segment_ids > 64) {
        kvp_log_warn(s->actor, "DataToken %llu: needs a 32-byte client_key and 1..64 segment ids (got %zu, %zu)",
                     (unsigned long long)req->req_id, r->client_key.len, r->n_segment_ids);
        svc_reply_status(s, id, req->req_id, KVP_ERR_INVALID, "DataToken: client_key must be 32 bytes, 1..64 segment ids");
        return;
    }
    const struct kvp_auth_principal *p = &s->cur_principal;
    struct kvp_dt_claims c = {.expires_ms = kvp_clock_wall_ms() + KVP_DT_TTL_MS};
    memcpy(c.client_pk, r->client_key.data, KVP_DT_PK_BYTES);
    char who[KVP_AUTH_NAME_MAX + KVP_AUTH_TENANT_MAX + 16];
    int wl = snprintf(who, sizeof who, "%s/%s/%s", kvp_auth_role_name(p->role), p->tenant, p->name);
    crypto_generichash(c.client_id, sizeof c.client_id, (const uint8_t *)who, (size_t)wl, NULL, 0);
    snprintf(c.tenant, sizeof c.tenant, "%s", p->tenant);
    uint8_t(*buf)[KVP_DT_TOKEN_MAX] = calloc(r->n_segment_ids, sizeof *buf);
    ProtobufCBinaryData *toks = calloc(r->n_segment_ids, sizeof *toks);
    if (!buf || !toks) {
        free(buf);
        free(toks);
        svc_reply_status(s, id, req->req_id, KVP_ERR_NOMEM, "out of memory");
        return;
    }
    for (size_t i = 0; i < r->n_segment_ids; i++) {
        c.segment_id = r->segment_ids[i];
        int n = kvp_dt_issue(s->token_pk, s->token_sk, &c, buf[i], sizeof buf[i]);
        toks[i].data = buf[i];
        toks[i].len = n > 0 ? (size_t)n : 0;
    }
    Kvp__Response resp = KVP__RESPONSE__INIT;
    Kvp__DataTokenResp dr = KVP__DATA_TOKEN_RESP__INIT;
    dr.n_tokens = r->n_segment_ids;
    dr.tokens = toks;
    dr.expires_ms = c.expires_ms;
    resp.body_case = KVP__RESPONSE__BODY_DATA_TOKEN;
    resp.data_token = &dr;
    svc_reply(s, id, req->req_id, &resp);
    free(toks);
    free(buf);
}

void svc_auth_stop(struct kvp_master_service *s)
{
    sodium_memzero(s->token_sk, sizeof s->token_sk);
    svc_quota_destroy(s);
    kvp_auth_client_destroy(&s->peer_auth);
    s->auth_mon = NULL;
    kvp_auth_server_destroy(&s->auth);
}
