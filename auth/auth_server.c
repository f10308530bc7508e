/*
 * auth_server.c — a master's CURVE server end (auth.h): the ZAP handler (ZeroMQ RFC 27) that
 * admits a client only when its public key is a certificate in the allowed-keys directory, and
 * the handshake monitor that logs peers refused before ZAP is asked (no keys, another
 * mechanism, garbage bytes).
 *
 * The ZAP handler is a runtime actor, `zap` (its own thread, runtime/actor.h), watching the REP
 * socket: libzmq asks ZAP synchronously from its I/O thread over inproc://zeromq.zap.01, so the
 * handler cannot be a handler of the master's loop without stalling every handshake behind a
 * busy loop. Its state (the certificate store, the refusal log) is touched only on its thread.
 * The two refusal counters are relaxed atomics (one writer each: the zap actor, the master's
 * loop for the monitor) read by the metrics endpoint's thread, libmicrohttpd's, which has no
 * mailbox: a message would make every scrape a blocking round trip to both writers for two
 * plain counters that order nothing.
 */
#include "auth/auth.h"

#include <arpa/inet.h>
#include <czmq.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define MON_FDS 1024

struct kvp_auth_server {
    char who[64];
    char domain[32];
    zcert_t *cert;
    char allowed_dir[1024];
    struct kvp_rt_actor *zap;
    zsock_t *rep; /* bound by _new (so a failed bind is an error there), then used only by `zap` */
    zcertstore_t *store;          /* `zap` only: made in its init, freed in its fini */
    struct kvp_auth_ratelog zap_log; /* `zap` only */
    /* Refusal counters: refused_keys written by the `zap` actor, refused_handshakes by the
     * master service actor, both read by kvp_auth_server_stats when the master renders its
     * metrics (service_quota.c). Relaxed atomics: two independent counts, nothing else published
     * through them; asking `zap` by message for a count would make the renderer wait on it. */
    _Atomic uint64_t refused_keys;
    _Atomic uint64_t refused_handshakes;
    /* handshake monitor: owned by the master service actor's thread */
    zsock_t *mon;
    char mon_ep[64];
    char fd_addr[MON_FDS][64];
    uint32_t failed_pending;
    struct kvp_auth_ratelog mon_log;
};

static void zap_reply(zsock_t *rep, const char *req_id, const char *code, const char *text, const char *user)
{
    zstr_sendx(rep, "1.0", req_id, code, text, user, "", NULL);
}

/* The REP socket is readable: one ZAP request. Frames: version, request id, domain, address,
 * identity, mechanism, credentials... (RFC 27). Only CURVE with a known key gets 200. */
static int zap_on_request(struct kvp_rt_ctx *ctx, void *handle)
{
    struct kvp_auth_server *s = kvp_rt_state(ctx);
    zsock_t *rep = s->rep;
    zcertstore_t *store = s->store;
    zmsg_t *m = zmsg_recv(rep); /* readable: the whole request is there */
    if (!m)
        return KVP_OK;
    char *ver = zmsg_popstr(m), *rid = zmsg_popstr(m), *dom = zmsg_popstr(m), *addr = zmsg_popstr(m);
    zframe_t *ident = zmsg_pop(m);
    char *mech = zmsg_popstr(m);
    zframe_t *key = zmsg_pop(m);
    const char *why = NULL;
    char user[KVP_AUTH_NAME_MAX + KVP_AUTH_TENANT_MAX + 16] = "";
    char pub[KVP_AUTH_Z85_LEN + 1] = "";
    if (!ver || strcmp(ver, "1.0") != 0 || !rid) {
        why = "bad ZAP request";
    } else if (!mech || strcmp(mech, "CURVE") != 0) {
        why = "not CURVE";
    } else if (!key || zframe_size(key) != 32) {
        why = "no client key";
    } else {
        zmq_z85_encode(pub, zframe_data(key), 32);
        zcert_t *c = store ? zcertstore_lookup(store, pub) : NULL;
        if (!c) {
            why = "key not in the allowed-keys directory";
        } else {
            int role = kvp_auth_role_parse(zcert_meta(c, "role"));
            const char *tenant = zcert_meta(c, "tenant"), *name = zcert_meta(c, "name");
            if (role < 0 || !kvp_auth_tenant_valid(tenant ? tenant : "")) {
                why = "allowed certificate has a bad role or tenant";
            } else {
                snprintf(user, sizeof user, "%s/%s/%s", kvp_auth_role_name(role), tenant ? tenant : "",
                         name ? name : "");
            }
        }
    }
    if (why) {
        atomic_fetch_add_explicit(&s->refused_keys, 1, memory_order_relaxed);
        uint64_t sup = 0;
        if (kvp_auth_ratelog_allow(&s->zap_log, addr ? addr : "?", kvp_clock_now_ms(), &sup))
            kvp_log_warn(s->who, "auth: refused control connection from %s: %s%s%s (%llu similar lines held back)",
                         addr ? addr : "?", why, pub[0] ? ", key " : "", pub, (unsigned long long)sup);
        zap_reply(rep, rid ? rid : "", "400", why, "");
    } else {
        zap_reply(rep, rid, "200", "OK", user);
    }
    free(ver);
    free(rid);
    free(dom);
    free(addr);
    free(mech);
    zframe_destroy(&ident);
    zframe_destroy(&key);
    zmsg_destroy(&m);
    return KVP_OK;
}

static int zap_init(struct kvp_rt_ctx *ctx)
{
    struct kvp_auth_server *s = kvp_rt_state(ctx);
    s->store = zcertstore_new(s->allowed_dir); /* reloads when the directory changes */
    return kvp_rt_watch(ctx, s->rep, zap_on_request);
}

static int zap_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    return KVP_OK; /* no messages: it serves its socket */
}

/* The store only: the server struct is kvp_auth_server_destroy's. */
static void zap_fini(struct kvp_rt_ctx *ctx)
{
    struct kvp_auth_server *s = kvp_rt_state(ctx);
    zcertstore_destroy(&s->store);
}

int kvp_auth_server_new(struct kvp_auth_server **out, const char *mode, const char *server_key,
                        const char *allowed_dir, const char *who)
{
    if (!out)
        return KVP_ERR_INVALID;
    *out = NULL;
    who = who ? who : "auth";
    bool on = true;
    if (kvp_auth_parse_mode(mode, &on, who) != KVP_OK)
        return KVP_ERR_INVALID;
    if (!on) {
        kvp_log_warn(who, "auth: none: every port admits any peer (docs/security.md)");
        return KVP_OK;
    }
    if (!server_key || !*server_key || !allowed_dir || !*allowed_dir) {
        kvp_log_error(who, "auth: curve (the default) needs auth_key (this master's key pair) and auth_allowed_dir "
                      "(the allowed public keys); `kvpoolctl keygen` makes them, `kvpoolctl cluster up` does it all; "
                      "auth=none turns authentication off");
        return KVP_ERR_INVALID;
    }
    zdir_t *d = zdir_new(allowed_dir, "-");
    if (!d) {
        kvp_log_error(who, "auth: auth_allowed_dir=%s: not a readable directory", allowed_dir);
        return KVP_ERR_INVALID;
    }
    zdir_destroy(&d);
    struct kvp_auth_server *s = calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NOMEM;
    snprintf(s->who, sizeof s->who, "%s", who);
    snprintf(s->domain, sizeof s->domain, "kvpool");
    snprintf(s->allowed_dir, sizeof s->allowed_dir, "%s", allowed_dir);
    atomic_init(&s->refused_keys, 0);
    atomic_init(&s->refused_handshakes, 0);
    s->cert = zcert_load(server_key);
    static const byte zero[32] = {0};
    if (!s->cert || memcmp(zcert_secret_key(s->cert), zero, 32) == 0) {
        kvp_log_error(who, "auth: auth_key=%s: missing, unreadable or without a secret key", server_key);
        kvp_auth_server_destroy(&s);
        return KVP_ERR_INVALID;
    }
    s->rep = zsock_new(ZMQ_REP);
    if (!s->rep || zsock_bind(s->rep, ZAP_ENDPOINT) != 0) {
        kvp_log_error(who, "auth: cannot bind the ZAP handler (%s): one authenticated master per process",
                      zmq_strerror(zmq_errno()));
        kvp_auth_server_destroy(&s);
        return KVP_ERR_IO;
    }
    struct kvp_rt_spec spec = {.name = "zap", .init = zap_init, .handle = zap_handle, .fini = zap_fini, .state = s};
    int rc = kvp_rt_spawn(&s->zap, &spec, NULL); /* any failure ran zap_fini (the store only) */
    if (rc != KVP_OK) {
        kvp_auth_server_destroy(&s);
        return rc;
    }
    *out = s;
    return KVP_OK;
}

int kvp_auth_server_apply(struct kvp_auth_server *a, void *router)
{
    if (!a)
        return KVP_OK;
    zsock_t *r = router;
    zsock_set_zap_domain(r, a->domain);
    zcert_apply(a->cert, r);
    zsock_set_curve_server(r, 1);
    return zsock_curve_server(r) == 1 ? KVP_OK : KVP_ERR_IO;
}

void *kvp_auth_server_monitor(struct kvp_auth_server *a, void *router)
{
    if (!a)
        return NULL;
    snprintf(a->mon_ep, sizeof a->mon_ep, "inproc://kvp-auth-mon-%p", (void *)a);
    int ev = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    if (zmq_socket_monitor(zsock_resolve(router), a->mon_ep, ev) != 0) {
        kvp_log_warn(a->who, "auth: handshake monitor: %s (refusals before ZAP are not logged)", zmq_strerror(zmq_errno()));
        return NULL;
    }
    a->mon = zsock_new(ZMQ_PAIR);
    if (!a->mon || zsock_connect(a->mon, "%s", a->mon_ep) != 0) {
        zsock_destroy(&a->mon);
        return NULL;
    }
    return a->mon;
}

static void fd_peer(int fd, char *buf, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *in = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
            port = ntohs(in->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
            port = ntohs(in6->sin6_port);
        }
    }
    snprintf(buf, cap, "%s:%d", host, port);
}

/* Events come in order from libzmq's I/O thread: ACCEPTED(fd) ... HANDSHAKE_FAILED_x
 * DISCONNECTED(fd) for one connection (the failed engine is torn down right after its event), so
 * a DISCONNECTED that follows a failed handshake names the refused peer. AUTH failures were
 * already logged by ZAP with their key. */
void kvp_auth_server_on_monitor(struct kvp_auth_server *a)
{
    if (!a || !a->mon)
        return;
    for (int i = 0; i < 64; i++) {
        zmsg_t *m = zmsg_recv_nowait(a->mon);
        if (!m)
            break;
        zframe_t *f = zmsg_first(m);
        if (f && zframe_size(f) == 6) {
            uint16_t ev;
            uint32_t val;
            memcpy(&ev, zframe_data(f), 2);
            memcpy(&val, zframe_data(f) + 2, 4);
            int fd = (int)val;
            if (ev == ZMQ_EVENT_ACCEPTED && fd >= 0 && fd < MON_FDS) {
                fd_peer(fd, a->fd_addr[fd], sizeof a->fd_addr[fd]);
            } else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
                a->failed_pending++;
            } else if (ev == ZMQ_EVENT_DISCONNECTED && a->failed_pending) {
                a->failed_pending--;
                const char *peer = fd >= 0 && fd < MON_FDS && a->fd_addr[fd][0] ? a->fd_addr[fd] : "?";
                atomic_fetch_add_explicit(&a->refused_handshakes, 1, memory_order_relaxed);
                uint64_t sup = 0;
                if (kvp_auth_ratelog_allow(&a->mon_log, peer, kvp_clock_now_ms(), &sup))
                    kvp_log_warn(a->who,
                                 "auth: refused control connection from %s: no CURVE handshake (no keys, another "
                                 "mechanism or garbage) (%llu similar lines held back)",
                                 peer, (unsigned long long)sup);
            }
            if (ev == ZMQ_EVENT_DISCONNECTED && fd >= 0 && fd < MON_FDS)
                a->fd_addr[fd][0] = '\0';
        }
        zmsg_destroy(&m);
    }
}

void kvp_auth_server_stats(struct kvp_auth_server *a, uint64_t *refused_keys, uint64_t *refused_handshakes)
{
    *refused_keys = a ? atomic_load_explicit(&a->refused_keys, memory_order_relaxed) : 0;
    *refused_handshakes = a ? atomic_load_explicit(&a->refused_handshakes, memory_order_relaxed) : 0;
}

void kvp_auth_server_destroy(struct kvp_auth_server **ap)
{
    if (!ap || !*ap)
        return;
    struct kvp_auth_server *a = *ap;
    zsock_destroy(&a->mon);
    kvp_rt_destroy(&a->zap); /* joins the handler thread; then its socket is ours again */
    zsock_destroy(&a->rep);
    zcert_destroy(&a->cert);
    free(a);
    *ap = NULL;
}

bool kvp_auth_frame_principal(void *zframe, struct kvp_auth_principal *out)
{
    const char *u = zframe ? zframe_meta((zframe_t *)zframe, "User-Id") : NULL;
    if (!u || !*u)
        return false;
    const char *s1 = strchr(u, '/');
    const char *s2 = s1 ? strchr(s1 + 1, '/') : NULL;
    if (!s1 || !s2)
        return false;
    char role[16];
    size_t rl = (size_t)(s1 - u), tl = (size_t)(s2 - s1 - 1);
    if (rl >= sizeof role || tl >= sizeof out->tenant)
        return false;
    memcpy(role, u, rl);
    role[rl] = '\0';
    int r = kvp_auth_role_parse(role);
    if (r < 0)
        return false;
    out->role = (enum kvp_auth_role)r;
    memcpy(out->tenant, s1 + 1, tl);
    out->tenant[tl] = '\0';
    snprintf(out->name, sizeof out->name, "%s", s2 + 1);
    return true;
}
