/*
 * auth.h — authentication of the control plane (ZeroMQ CURVE, libsodium through libzmq/czmq)
 * and the tenant a key is authorised for. docs/security.md is the operator's view.
 *
 * Keys are czmq certificates (zcert): a public file PATH and a secret file PATH_secret, both
 * Z85 text. A certificate's metadata carries what kvpool needs to know about its holder:
 *   role    = client | segment | admin | master   (what the holder may ask the masters)
 *   tenant  = the tenant the key is authorised for ("" = the default tenant)
 *   address = (master certificates only) the master's control "host:port"
 * A master admits a peer only when the peer's public key is a certificate in its allowed-keys
 * directory (`auth_allowed_dir`); the principal (role, tenant, name) comes from that
 * directory's copy of the certificate, never from what the peer says.
 *
 * Modes: "curve" (the default) and "none" (no authentication: one WARN at start).
 */
#ifndef KVP_AUTH_H
#define KVP_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_AUTH_TENANT_MAX 64   /* tenant names: 1..63 bytes of [A-Za-z0-9._-] */
#define KVP_AUTH_NAME_MAX 64
#define KVP_AUTH_Z85_LEN 40      /* a 32-byte key in Z85 text */
#define KVP_AUTH_MAX_MASTER_KEYS 16
/* Separator between a tenant and its key inside the master (never accepted in a key when
 * authentication is on). */
#define KVP_AUTH_TENANT_SEP '\x1f'

enum kvp_auth_role {
    KVP_AUTH_ROLE_CLIENT = 0,  /* data calls; mount/heartbeat of an embedded segment */
    KVP_AUTH_ROLE_SEGMENT = 1, /* a storage host: mount, heartbeat, mover/repair calls */
    KVP_AUTH_ROLE_ADMIN = 2,   /* kvpoolctl: everything, any tenant's keys (unscoped) */
    KVP_AUTH_ROLE_MASTER = 3,  /* a peer master (feature-level polls) */
};

/** Who a connection is: filled from the allowed-keys directory's certificate. */
struct kvp_auth_principal {
    enum kvp_auth_role role;
    char tenant[KVP_AUTH_TENANT_MAX];
    char name[KVP_AUTH_NAME_MAX];
};

/** "curve" → true, "none" → false; anything else KVP_ERR_INVALID (logged, naming `who`). */
int kvp_auth_parse_mode(const char *mode, bool *on, const char *who);

/** "client" → KVP_AUTH_ROLE_CLIENT, ...; -1 for an unknown name. */
int kvp_auth_role_parse(const char *s);
const char *kvp_auth_role_name(enum kvp_auth_role r);

/** true when `t` is a valid tenant name ("" is the default tenant and valid). */
bool kvp_auth_tenant_valid(const char *t);

/**
 * Create a key pair: PATH (public) and PATH_secret (secret), metadata name, role, tenant and
 * (may be NULL) address. Refuses to overwrite an existing PATH_secret (KVP_ERR_EXISTS).
 * The secret file is written mode 0600. Errors: KVP_ERR_INVALID (bad role/tenant),
 * KVP_ERR_IO, KVP_ERR_EXISTS, KVP_ERR_NOMEM.
 */
int kvp_auth_keygen(const char *path, const char *name, const char *role, const char *tenant,
                    const char *address);

/**
 * The data-plane token key of a master (auth_token.h): an Ed25519 key pair derived from the
 * master's CURVE secret key (seed = BLAKE2b-256 keyed by a fixed domain string, so the CURVE
 * secret itself is never used as a signing key). `kvpoolctl keygen --role master` publishes
 * the public half as the certificate's metadata "token_key" (Z85), which segments read from
 * the masters' public certificates. Errors: KVP_ERR_IO (libsodium).
 */
int kvp_auth_token_key_derive(const uint8_t curve_secret[32], uint8_t pk[32], uint8_t sk[64]);

/** The token key pair of the master whose secret certificate is `secret_path`. KVP_ERR_INVALID
 * when it is missing or holds no secret key. */
int kvp_auth_token_key_load(const char *secret_path, uint8_t pk[32], uint8_t sk[64]);

/** Write (copy) the public half of the key pair at `secret_path` to `public_path`. */
int kvp_auth_export_public(const char *secret_path, const char *public_path);

/* ------------------------------------------------------------------ connecting side */

/**
 * What a DEALER needs to open a CURVE session to the masters: its own key pair and every
 * master's public key by control address. Opaque; one owner at a time (kvp_auth_client_apply
 * may reread the masters' directory).
 */
struct kvp_auth_client;

/**
 * Load: `key_path` = this process's secret certificate (PATH_secret, or PATH when PATH_secret
 * exists), `master_keys_dir` = a directory of master public certificates (metadata `address`).
 * Either may be "" when `cluster_file` is set: then its "auth" section names them, with
 * `key_field` ("client_key", "segment_key" or "admin_key") choosing the key.
 * On success *out is NULL when authentication is off (mode "none", one WARN logged naming
 * `who`). Errors: KVP_ERR_INVALID (mode, missing/unreadable key, no master keys; logged),
 * KVP_ERR_NOMEM.
 */
int kvp_auth_client_load(struct kvp_auth_client **out, const char *mode, const char *key_path,
                         const char *master_keys_dir, const char *cluster_file, const char *key_field,
                         const char *who);

/**
 * Set the CURVE client options on a (libzmq) socket that will connect to the master at
 * control address `addr` ("host:port" or "tcp://host:port"). NULL `a` is a no-op (auth off).
 * A master not among the loaded keys makes it reread the masters' directory once. Must run
 * before zmq_connect. Errors: KVP_ERR_INVALID (no public key known for that master; logged),
 * KVP_ERR_IO.
 */
int kvp_auth_client_apply(struct kvp_auth_client *a, void *zmq_socket, const char *addr);

/**
 * The masters' data-plane token public keys (metadata "token_key" of their certificates; a
 * certificate made before data tokens has none): up to max into out. Returns how many. NULL a: 0.
 */
size_t kvp_auth_client_token_keys(const struct kvp_auth_client *a, uint8_t (*out)[32], size_t max);

/** The tenant and role in this process's own certificate (what the masters will say). */
const char *kvp_auth_client_tenant(const struct kvp_auth_client *a);
enum kvp_auth_role kvp_auth_client_role(const struct kvp_auth_client *a);

/**
 * Check a configured `tenant_id` against the key's tenant: "" (not set) always agrees; else
 * they must be equal. KVP_ERR_DENIED with a log line naming both when they differ.
 */
int kvp_auth_client_check_tenant(const struct kvp_auth_client *a, const char *tenant_id, const char *who);

void kvp_auth_client_destroy(struct kvp_auth_client **a);

/* ------------------------------------------------------------------ serving side (masters) */

/**
 * A master's server end: its key pair, the allowed-keys directory, and a ZAP handler (RFC 27)
 * that admits a CURVE client only when its key is in that directory, logs refusals
 * (rate-limited, naming the peer address), and hands the principal to the socket as the
 * message property "User-Id" ("ROLE/TENANT/NAME"). One per master; the ZAP endpoint is
 * process-wide (libzmq's design), so a second server in one process shares the handler
 * (each keeps its own directory, told apart by ZAP domain).
 */
struct kvp_auth_server;

/**
 * Start: on success *out is NULL when `mode` is "none" (one WARN logged). Errors:
 * KVP_ERR_INVALID (mode, unreadable server key, missing directory; logged), KVP_ERR_IO
 * (ZAP handler could not bind), KVP_ERR_NOMEM.
 */
int kvp_auth_server_new(struct kvp_auth_server **out, const char *mode, const char *server_key,
                        const char *allowed_dir, const char *who);

/**
 * Make a czmq ROUTER (zsock_t *) a CURVE server of this master; before bind. NULL `a`: no-op.
 * Errors: KVP_ERR_IO.
 */
int kvp_auth_server_apply(struct kvp_auth_server *a, void *zsock_router);

/**
 * Watch the ROUTER for handshakes that never reach ZAP (no keys, a wrong mechanism, garbage
 * bytes) and log them, rate-limited, naming the peer address. Returns a czmq socket (zsock_t *)
 * to read in the owner's loop with kvp_auth_server_on_monitor(), or NULL (auth off / failure:
 * logged, not fatal).
 */
void *kvp_auth_server_monitor(struct kvp_auth_server *a, void *zsock_router);
void kvp_auth_server_on_monitor(struct kvp_auth_server *a);

/** Counters for metrics: refusals by ZAP (bad/unknown key) and by the handshake monitor. */
void kvp_auth_server_stats(struct kvp_auth_server *a, uint64_t *refused_keys, uint64_t *refused_handshakes);

void kvp_auth_server_destroy(struct kvp_auth_server **a);

/**
 * The principal of a received frame (czmq zframe_t *), from its "User-Id" property. Returns
 * false when the frame carries none (auth off or a NULL-mechanism socket).
 */
bool kvp_auth_frame_principal(void *zframe, struct kvp_auth_principal *out);

/* ------------------------------------------------------------------ rate-limited refusal log */

/**
 * One refusal log line per peer address per 10 s and at most 20 lines a minute overall; the
 * lines suppressed meanwhile are counted in the next one. Pure (time passed in).
 */
struct kvp_auth_ratelog {
    struct {
        char addr[64];
        uint64_t last_ms;
    } slots[32];
    uint64_t window_ms;
    uint32_t in_window;
    uint64_t suppressed;
};
/** true when a line for `addr` may be logged now; *suppressed gets the count held back. */
bool kvp_auth_ratelog_allow(struct kvp_auth_ratelog *r, const char *addr, uint64_t now_ms, uint64_t *suppressed);

#endif
