/*
 * auth_keys.c — key pairs (czmq zcert files), names and the connecting side's CURVE setup
 * (auth.h). The masters' side is auth_server.c.
 */
#include "auth/auth.h"

#include <czmq.h>
#include <errno.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvpool.h"
#include "auth/auth_token.h"
#include "runtime/log.h"

static const char *const ROLE_NAMES[] = {"client", "segment", "admin", "master"};

int kvp_auth_token_key_derive(const uint8_t curve_secret[32], uint8_t pk[32], uint8_t sk[64])
{
    static const char domain[] = "kvpool data-plane token key v1";
    uint8_t seed[crypto_sign_SEEDBYTES];
    if (sodium_init() < 0 ||
        crypto_generichash(seed, sizeof seed, curve_secret, 32, (const uint8_t *)domain, sizeof domain - 1) != 0 ||
        crypto_sign_seed_keypair(pk, sk, seed) != 0) {
        sodium_memzero(seed, sizeof seed);
        return KVP_ERR_IO;
    }
    sodium_memzero(seed, sizeof seed);
    return KVP_OK;
}

int kvp_auth_parse_mode(const char *mode, bool *on, const char *who)
{
    if (!mode || !*mode || strcmp(mode, "curve") == 0) {
        *on = true;
        return KVP_OK;
    }
    if (strcmp(mode, "none") == 0) {
        *on = false;
        return KVP_OK;
    }
    kvp_log_error(who ? who : "auth", "auth=\"%s\": must be curve or none", mode);
    return KVP_ERR_INVALID;
}

int kvp_auth_role_parse(const char *s)
{
    for (int i = 0; s && i < 4; i++)
        if (strcmp(s, ROLE_NAMES[i]) == 0)
            return i;
    return -1;
}

const char *kvp_auth_role_name(enum kvp_auth_role r)
{
    return (unsigned)r < 4 ? ROLE_NAMES[r] : "?";
}

bool kvp_auth_tenant_valid(const char *t)
{
    if (!t)
        return false;
    size_t n = strlen(t);
    if (n >= KVP_AUTH_TENANT_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = t[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return false;
    }
    return true;
}

static bool name_valid(const char *t)
{
    return t && *t && kvp_auth_tenant_valid(t);
}

int kvp_auth_keygen(const char *path, const char *name, const char *role, const char *tenant, const char *address)
{
    if (!path || !*path || !name_valid(name) || kvp_auth_role_parse(role) < 0 || !kvp_auth_tenant_valid(tenant ? tenant : "")) {
        kvp_log_error("auth", "keygen %s: name must be 1..63 of [A-Za-z0-9._-], role client|segment|admin|master, "
                      "tenant 0..63 of [A-Za-z0-9._-]", path ? path : "(null)");
        return KVP_ERR_INVALID;
    }
    char secret[1100];
    snprintf(secret, sizeof secret, "%s_secret", path);
    struct stat sb;
    if (stat(secret, &sb) == 0) {
        kvp_log_error("auth", "keygen: %s exists; not overwritten", secret);
        return KVP_ERR_EXISTS;
    }
    zcert_t *cert = zcert_new();
    if (!cert)
        return KVP_ERR_NOMEM;
    zcert_set_meta(cert, "name", "%s", name);
    zcert_set_meta(cert, "role", "%s", role);
    zcert_set_meta(cert, "tenant", "%s", tenant ? tenant : "");
    if (address && *address)
        zcert_set_meta(cert, "address", "%s", address);
    if (strcmp(role, "master") == 0) {
        /* The master's data-plane token key (docs/security.md "Data plane: tokens"): derived
         * from its CURVE secret, its public half published in the certificate for segments. */
        uint8_t pk[32], sk[64];
        char z[KVP_AUTH_Z85_LEN + 1];
        if (kvp_auth_token_key_derive(zcert_secret_key(cert), pk, sk) != KVP_OK) {
            zcert_destroy(&cert);
            return KVP_ERR_IO;
        }
        sodium_memzero(sk, sizeof sk);
        zmq_z85_encode(z, pk, 32);
        zcert_set_meta(cert, "token_key", "%s", z);
    }
    mode_t old = umask(077); /* the secret file: owner only */
    int rc = zcert_save_secret(cert, secret);
    umask(old);
    if (rc == 0)
        rc = zcert_save_public(cert, path);
    zcert_destroy(&cert);
    if (rc != 0) {
        kvp_log_error("auth", "keygen: write %s: %s", path, strerror(errno));
        return KVP_ERR_IO;
    }
    return KVP_OK;
}

/* Load a certificate: PATH_secret (or PATH itself when it is the secret file). */
static zcert_t *load_cert(const char *path)
{
    struct stat sb;
    if (!path || !*path || stat(path, &sb) != 0)
        return NULL;
    zcert_t *c = zcert_load(path); /* czmq tries PATH_secret first, then PATH */
    return c;
}

static bool cert_has_secret(zcert_t *c)
{
    static const byte zero[32] = {0};
    return memcmp(zcert_secret_key(c), zero, 32) != 0;
}

int kvp_auth_token_key_load(const char *secret_path, uint8_t pk[32], uint8_t sk[64])
{
    zcert_t *c = load_cert(secret_path);
    if (!c || !cert_has_secret(c)) {
        zcert_destroy(&c);
        return KVP_ERR_INVALID;
    }
    int rc = kvp_auth_token_key_derive(zcert_secret_key(c), pk, sk);
    zcert_destroy(&c);
    return rc;
}

int kvp_auth_export_public(const char *secret_path, const char *public_path)
{
    zcert_t *c = load_cert(secret_path);
    if (!c)
        return KVP_ERR_IO;
    int rc = zcert_save_public(c, public_path) == 0 ? KVP_OK : KVP_ERR_IO;
    zcert_destroy(&c);
    return rc;
}

/* ------------------------------------------------------------------ connecting side */

struct kvp_auth_client {
    zcert_t *cert;
    enum kvp_auth_role role;
    char tenant[KVP_AUTH_TENANT_MAX];
    char master_keys_dir[1024]; /* reread when a master's key is missing (a member added later) */
    size_t n_masters;
    struct {
        char address[256];
        char pub[KVP_AUTH_Z85_LEN + 1];
        bool has_token_key; /* the certificate carries "token_key" (made with data tokens) */
        uint8_t token_key[32];
    } masters[KVP_AUTH_MAX_MASTER_KEYS];
};

static const char *strip_tcp(const char *a)
{
    return strncmp(a, "tcp://", 6) == 0 ? a + 6 : a;
}

/* Every master public certificate of `dir` (files without the _secret suffix, metadata address). */
static int load_master_keys(struct kvp_auth_client *a, const char *dir, const char *who)
{
    zdir_t *d = zdir_new(dir, "-");
    if (!d) {
        kvp_log_error(who, "auth: master keys directory %s: cannot read it", dir);
        return KVP_ERR_INVALID;
    }
    zlist_t *files = zdir_list(d);
    for (zfile_t *f = zlist_first(files); f; f = zlist_next(files)) {
        const char *fn = zfile_filename(f, NULL);
        size_t l = strlen(fn);
        if (l >= 7 && strcmp(fn + l - 7, "_secret") == 0)
            continue;
        zcert_t *c = zcert_load(fn);
        if (!c)
            continue;
        const char *addr = zcert_meta(c, "address");
        bool known = false;
        for (size_t i = 0; addr && i < a->n_masters; i++)
            known |= strcmp(a->masters[i].address, strip_tcp(addr)) == 0;
        if (addr && *addr && !known && a->n_masters < KVP_AUTH_MAX_MASTER_KEYS) {
            snprintf(a->masters[a->n_masters].address, sizeof a->masters[0].address, "%s", strip_tcp(addr));
            snprintf(a->masters[a->n_masters].pub, sizeof a->masters[0].pub, "%s", zcert_public_txt(c));
            const char *tk = zcert_meta(c, "token_key");
            a->masters[a->n_masters].has_token_key =
                tk && strlen(tk) == KVP_AUTH_Z85_LEN && zmq_z85_decode(a->masters[a->n_masters].token_key, tk);
            if (tk && !a->masters[a->n_masters].has_token_key)
                kvp_log_warn(who, "auth: master certificate %s: bad token_key: ignored", fn);
            a->n_masters++;
        }
        zcert_destroy(&c);
    }
    zlist_destroy(&files);
    zdir_destroy(&d);
    if (a->n_masters == 0) {
        kvp_log_error(who, "auth: no master public key (certificate with an address) in %s", dir);
        return KVP_ERR_INVALID;
    }
    return KVP_OK;
}

/* The "auth" section of cluster.json: {"mode", "master_keys", key_field}. */
static int from_cluster(const char *cluster_file, const char *key_field, char *mode, size_t mcap, char *key,
                        size_t kcap, char *mdir, size_t dcap)
{
    json_error_t je;
    json_t *root = json_load_file(cluster_file, 0, &je);
    if (!root)
        return KVP_ERR_IO;
    json_t *auth = json_object_get(root, "auth");
    if (json_is_object(auth)) {
        const char *v;
        if (!*mode && (v = json_string_value(json_object_get(auth, "mode"))))
            snprintf(mode, mcap, "%s", v);
        if (!*key && key_field && (v = json_string_value(json_object_get(auth, key_field))))
            snprintf(key, kcap, "%s", v);
        if (!*mdir && (v = json_string_value(json_object_get(auth, "master_keys"))))
            snprintf(mdir, dcap, "%s", v);
    }
    json_decref(root);
    return KVP_OK;
}

int kvp_auth_client_load(struct kvp_auth_client **out, const char *mode_in, const char *key_path,
                         const char *master_keys_dir, const char *cluster_file, const char *key_field,
                         const char *who)
{
    if (!out)
        return KVP_ERR_INVALID;
    *out = NULL;
    who = who ? who : "auth";
    char mode[16] = "", key[1100] = "", mdir[1100] = "";
    snprintf(mode, sizeof mode, "%s", mode_in ? mode_in : "");
    snprintf(key, sizeof key, "%s", key_path ? key_path : "");
    snprintf(mdir, sizeof mdir, "%s", master_keys_dir ? master_keys_dir : "");
    if (cluster_file && *cluster_file && (!*mode || !*key || !*mdir))
        (void)from_cluster(cluster_file, key_field, mode, sizeof mode, key, sizeof key, mdir, sizeof mdir);
    bool on = true;
    if (kvp_auth_parse_mode(mode, &on, who) != KVP_OK)
        return KVP_ERR_INVALID;
    if (!on) {
        kvp_log_warn(who, "auth: none: the masters are reached without authentication (docs/security.md)");
        return KVP_OK;
    }
    if (!*key || !*mdir) {
        kvp_log_error(who, "auth: curve (the default) needs a key (auth_key) and the masters' public keys "
                      "(auth_master_keys), or a cluster_file whose \"auth\" section names them; set auth=none "
                      "to connect without authentication");
        return KVP_ERR_INVALID;
    }
    struct kvp_auth_client *a = calloc(1, sizeof *a);
    if (!a)
        return KVP_ERR_NOMEM;
    a->cert = load_cert(key);
    if (!a->cert || !cert_has_secret(a->cert)) {
        kvp_log_error(who, "auth: key %s: missing, unreadable or without a secret key", key);
        kvp_auth_client_destroy(&a);
        return KVP_ERR_INVALID;
    }
    const char *t = zcert_meta(a->cert, "tenant");
    snprintf(a->tenant, sizeof a->tenant, "%s", t ? t : "");
    int r = kvp_auth_role_parse(zcert_meta(a->cert, "role"));
    a->role = r < 0 ? KVP_AUTH_ROLE_CLIENT : (enum kvp_auth_role)r;
    snprintf(a->master_keys_dir, sizeof a->master_keys_dir, "%s", mdir);
    int rc = load_master_keys(a, mdir, who);
    if (rc != KVP_OK) {
        kvp_auth_client_destroy(&a);
        return rc;
    }
    *out = a;
    return KVP_OK;
}

int kvp_auth_client_apply(struct kvp_auth_client *a, void *z, const char *addr)
{
    if (!a)
        return KVP_OK;
    const char *want = strip_tcp(addr);
    const char *pub = NULL;
    for (int pass = 0; pass < 2 && !pub; pass++) {
        if (pass == 1) /* a master added since the load (kvpoolctl add-member): read the directory again */
            (void)load_master_keys(a, a->master_keys_dir, "auth");
        for (size_t i = 0; i < a->n_masters; i++)
            if (strcmp(a->masters[i].address, want) == 0)
                pub = a->masters[i].pub;
    }
    if (!pub) {
        kvp_log_warn("auth", "master %s: no public key for it among the masters' keys: not connecting", want);
        return KVP_ERR_INVALID;
    }
    const char *mine = zcert_public_txt(a->cert), *sec = zcert_secret_txt(a->cert);
    if (zmq_setsockopt(z, ZMQ_CURVE_SERVERKEY, pub, KVP_AUTH_Z85_LEN) != 0 ||
        zmq_setsockopt(z, ZMQ_CURVE_PUBLICKEY, mine, KVP_AUTH_Z85_LEN) != 0 ||
        zmq_setsockopt(z, ZMQ_CURVE_SECRETKEY, sec, KVP_AUTH_Z85_LEN) != 0) {
        kvp_log_error("auth", "master %s: set CURVE options: %s", want, zmq_strerror(zmq_errno()));
        return KVP_ERR_IO;
    }
    return KVP_OK;
}

size_t kvp_auth_client_token_keys(const struct kvp_auth_client *a, uint8_t (*out)[32], size_t max)
{
    size_t n = 0;
    for (size_t i = 0; a && i < a->n_masters && n < max; i++)
        if (a->masters[i].has_token_key)
            memcpy(out[n++], a->masters[i].token_key, 32);
    return n;
}

const char *kvp_auth_client_tenant(const struct kvp_auth_client *a)
{
    return a ? a->tenant : "";
}

enum kvp_auth_role kvp_auth_client_role(const struct kvp_auth_client *a)
{
    return a ? a->role : KVP_AUTH_ROLE_ADMIN;
}

int kvp_auth_client_check_tenant(const struct kvp_auth_client *a, const char *tenant_id, const char *who)
{
    if (!a || !tenant_id || !*tenant_id || strcmp(tenant_id, a->tenant) == 0)
        return KVP_OK;
    kvp_log_error(who ? who : "auth", "tenant_id=\"%s\" disagrees with the key's tenant \"%s\": refused", tenant_id,
                  a->tenant);
    return KVP_ERR_DENIED;
}

void kvp_auth_client_destroy(struct kvp_auth_client **ap)
{
    if (!ap || !*ap)
        return;
    zcert_destroy(&(*ap)->cert);
    free(*ap);
    *ap = NULL;
}

/* ------------------------------------------------------------------ refusal log */

bool kvp_auth_ratelog_allow(struct kvp_auth_ratelog *r, const char *addr, uint64_t now_ms, uint64_t *suppressed)
{
    *suppressed = 0;
    if (now_ms - r->window_ms >= 60000 || r->window_ms == 0) {
        r->window_ms = now_ms ? now_ms : 1;
        r->in_window = 0;
    }
    size_t n = sizeof r->slots / sizeof r->slots[0], pick = 0;
    bool found = false;
    for (size_t i = 0; i < n; i++) {
        if (strncmp(r->slots[i].addr, addr, sizeof r->slots[i].addr - 1) == 0 && r->slots[i].addr[0]) {
            pick = i;
            found = true;
            break;
        }
        if (r->slots[i].last_ms < r->slots[pick].last_ms)
            pick = i; /* the oldest slot is reused */
    }
    if ((found && now_ms - r->slots[pick].last_ms < 10000) || r->in_window >= 20) {
        r->suppressed++;
        return false;
    }
    snprintf(r->slots[pick].addr, sizeof r->slots[pick].addr, "%s", addr);
    r->slots[pick].last_ms = now_ms ? now_ms : 1;
    r->in_window++;
    *suppressed = r->suppressed;
    r->suppressed = 0;
    return true;
}
