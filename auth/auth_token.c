/*
 * auth_token.c — the data-plane token and its challenge/response (auth_token.h). Ed25519 is
 * libsodium's crypto_sign_detached / crypto_sign_verify_detached (RFC 8032).
 */
#include "auth/auth_token.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

int kvp_dt_init(void) { return sodium_init() < 0 ? KVP_ERR_IO : KVP_OK; }

int kvp_dt_keypair(uint8_t pk[KVP_DT_PK_BYTES], uint8_t sk[KVP_DT_SK_BYTES])
{
    if (kvp_dt_init() != KVP_OK)
        return KVP_ERR_IO;
    return crypto_sign_keypair(pk, sk) == 0 ? KVP_OK : KVP_ERR_IO;
}

int kvp_dt_issue(const uint8_t pk[KVP_DT_PK_BYTES], const uint8_t sk[KVP_DT_SK_BYTES],
                 const struct kvp_dt_claims *c, uint8_t *out, size_t cap)
{
    size_t tl = strnlen(c->tenant, sizeof c->tenant);
    if (tl > KVP_DT_TENANT_MAX || cap < KVP_DT_TOKEN_FIXED + tl + KVP_DT_SIG_BYTES)
        return KVP_ERR_INVALID;
    if (kvp_dt_init() != KVP_OK)
        return KVP_ERR_IO;
    uint8_t *p = out;
    memcpy(p, "KVT1", 4);
    p += 4;
    memcpy(p, pk, KVP_DT_KEYID_BYTES);
    p += KVP_DT_KEYID_BYTES;
    put32(p, c->segment_id);
    p += 4;
    put64(p, c->expires_ms);
    p += 8;
    memcpy(p, c->client_pk, KVP_DT_PK_BYTES);
    p += KVP_DT_PK_BYTES;
    memcpy(p, c->client_id, KVP_DT_CLIENT_ID_BYTES);
    p += KVP_DT_CLIENT_ID_BYTES;
    *p++ = (uint8_t)tl;
    memcpy(p, c->tenant, tl);
    p += tl;
    size_t body = (size_t)(p - out);
    if (crypto_sign_detached(p, NULL, out, body, sk) != 0)
        return KVP_ERR_IO;
    return (int)(body + KVP_DT_SIG_BYTES);
}

void kvp_dt_challenge(uint32_t segment_id, uint8_t out[KVP_DT_CHALLENGE_BYTES])
{
    (void)kvp_dt_init(); /* randombytes works (falls back) even if init failed */
    memcpy(out, "KVPC", 4);
    out[4] = KVP_DT_VERSION;
    out[5] = out[6] = out[7] = 0;
    put32(out + 8, segment_id);
    randombytes_buf(out + 12, KVP_DT_NONCE_BYTES);
}

/* What the ephemeral key signs: "KVPP" followed by the challenge. */
static void proof_message(const uint8_t challenge[KVP_DT_CHALLENGE_BYTES], uint8_t msg[4 + KVP_DT_CHALLENGE_BYTES])
{
    memcpy(msg, "KVPP", 4);
    memcpy(msg + 4, challenge, KVP_DT_CHALLENGE_BYTES);
}

int kvp_dt_respond(const uint8_t challenge[KVP_DT_CHALLENGE_BYTES], const uint8_t *token, size_t token_len,
                   const uint8_t eph_sk[KVP_DT_SK_BYTES], uint8_t *out, size_t cap)
{
    if (memcmp(challenge, "KVPC", 4) != 0 || challenge[4] != KVP_DT_VERSION)
        return KVP_ERR_INVALID;
    if (token_len > KVP_DT_TOKEN_MAX || cap < KVP_DT_RESPONSE_HEAD + token_len + KVP_DT_SIG_BYTES)
        return KVP_ERR_INVALID;
    if (kvp_dt_init() != KVP_OK)
        return KVP_ERR_IO;
    memcpy(out, "KVPR", 4);
    out[4] = (uint8_t)token_len;
    out[5] = (uint8_t)(token_len >> 8);
    memcpy(out + KVP_DT_RESPONSE_HEAD, token, token_len);
    uint8_t msg[4 + KVP_DT_CHALLENGE_BYTES];
    proof_message(challenge, msg);
    if (crypto_sign_detached(out + KVP_DT_RESPONSE_HEAD + token_len, NULL, msg, sizeof msg, eph_sk) != 0)
        return KVP_ERR_IO;
    return (int)(KVP_DT_RESPONSE_HEAD + token_len + KVP_DT_SIG_BYTES);
}

int kvp_dt_response_length(const uint8_t *buf, size_t len)
{
    static const uint8_t magic[4] = {'K', 'V', 'P', 'R'};
    size_t m = len < 4 ? len : 4;
    if (memcmp(buf, magic, m) != 0)
        return KVP_ERR_MALFORMED;
    if (len < KVP_DT_RESPONSE_HEAD)
        return 0;
    size_t tl = (size_t)buf[4] | ((size_t)buf[5] << 8);
    if (tl < KVP_DT_TOKEN_FIXED + KVP_DT_SIG_BYTES || tl > KVP_DT_TOKEN_MAX)
        return KVP_ERR_MALFORMED;
    return (int)(KVP_DT_RESPONSE_HEAD + tl + KVP_DT_SIG_BYTES);
}

int kvp_dt_verify(const uint8_t challenge[KVP_DT_CHALLENGE_BYTES], const uint8_t *resp, size_t len,
                  uint32_t segment_id, uint64_t now_ms, const uint8_t (*master_pks)[KVP_DT_PK_BYTES], size_t n,
                  struct kvp_dt_claims *out, const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    int total = kvp_dt_response_length(resp, len);
    if (total <= 0 || (size_t)total != len) {
        *why = "not a token response";
        return KVP_ERR_MALFORMED;
    }
    if (kvp_dt_init() != KVP_OK) {
        *why = "libsodium failed to start";
        return KVP_ERR_DENIED;
    }
    size_t tl = (size_t)resp[4] | ((size_t)resp[5] << 8);
    const uint8_t *tok = resp + KVP_DT_RESPONSE_HEAD;
    size_t body = tl - KVP_DT_SIG_BYTES;
    if (memcmp(tok, "KVT1", 4) != 0) {
        *why = "unknown token version";
        return KVP_ERR_DENIED;
    }
    size_t tenant_len = tok[KVP_DT_TOKEN_FIXED - 1];
    if (KVP_DT_TOKEN_FIXED + tenant_len != body) {
        *why = "token fields do not add up";
        return KVP_ERR_DENIED;
    }
    const uint8_t *pk = NULL;
    for (size_t i = 0; i < n && !pk; i++)
        if (memcmp(master_pks[i], tok + 4, KVP_DT_KEYID_BYTES) == 0)
            pk = master_pks[i];
    if (!pk) {
        *why = "token not issued by a known master key";
        return KVP_ERR_DENIED;
    }
    if (crypto_sign_verify_detached(tok + body, tok, body, pk) != 0) {
        *why = "bad master signature (forged or altered token)";
        return KVP_ERR_DENIED;
    }
    struct kvp_dt_claims c;
    memset(&c, 0, sizeof c);
    const uint8_t *p = tok + 4 + KVP_DT_KEYID_BYTES;
    c.segment_id = get32(p);
    p += 4;
    c.expires_ms = get64(p);
    p += 8;
    memcpy(c.client_pk, p, KVP_DT_PK_BYTES);
    p += KVP_DT_PK_BYTES;
    memcpy(c.client_id, p, KVP_DT_CLIENT_ID_BYTES);
    p += KVP_DT_CLIENT_ID_BYTES + 1;
    memcpy(c.tenant, p, tenant_len);
    if (c.segment_id != segment_id || get32(challenge + 8) != segment_id) {
        *why = "token for another segment";
        return KVP_ERR_DENIED;
    }
    if (now_ms >= c.expires_ms) {
        *why = "token expired";
        return KVP_ERR_DENIED;
    }
    uint8_t msg[4 + KVP_DT_CHALLENGE_BYTES];
    proof_message(challenge, msg);
    if (crypto_sign_verify_detached(tok + tl, msg, sizeof msg, c.client_pk) != 0) {
        *why = "bad proof of the client key (replayed or stolen token)";
        return KVP_ERR_DENIED;
    }
    if (out)
        *out = c;
    *why = "ok";
    return KVP_OK;
}

/* ------------------------------------------------------------------ the client's wallet */

struct dt_held {
    uint32_t segment_id;
    uint64_t expires_ms;
    size_t len;
    uint8_t token[KVP_DT_TOKEN_MAX];
};

struct kvp_dt_wallet {
    uint8_t pk[KVP_DT_PK_BYTES], sk[KVP_DT_SK_BYTES];
    struct dt_held *held; /* one per segment, unsorted (a pool has tens of segments) */
    size_t n, cap;
};

int kvp_dt_wallet_new(struct kvp_dt_wallet **out)
{
    struct kvp_dt_wallet *w = calloc(1, sizeof *w);
    if (!w)
        return KVP_ERR_NOMEM;
    if (kvp_dt_keypair(w->pk, w->sk) != KVP_OK) {
        free(w);
        return KVP_ERR_IO;
    }
    *out = w;
    return KVP_OK;
}

int kvp_dt_wallet_copy_key(const struct kvp_dt_wallet *w, struct kvp_dt_wallet **out)
{
    if (!w || !out)
        return KVP_ERR_INVALID;
    struct kvp_dt_wallet *c = calloc(1, sizeof *c);
    if (!c)
        return KVP_ERR_NOMEM;
    memcpy(c->pk, w->pk, sizeof c->pk);
    memcpy(c->sk, w->sk, sizeof c->sk);
    *out = c;
    return KVP_OK;
}

void kvp_dt_wallet_public_key(const struct kvp_dt_wallet *w, uint8_t pk[KVP_DT_PK_BYTES])
{
    memcpy(pk, w->pk, KVP_DT_PK_BYTES);
}

static struct dt_held *wallet_find(const struct kvp_dt_wallet *w, uint32_t segment_id)
{
    for (size_t i = 0; i < w->n; i++)
        if (w->held[i].segment_id == segment_id)
            return &w->held[i];
    return NULL;
}

int kvp_dt_token_peek(const uint8_t *token, size_t len, const uint8_t pk[KVP_DT_PK_BYTES], uint32_t *segment_id,
                      uint64_t *expires_ms)
{
    if (!token || len < KVP_DT_TOKEN_FIXED + KVP_DT_SIG_BYTES || len > KVP_DT_TOKEN_MAX ||
        memcmp(token, "KVT1", 4) != 0 ||
        (size_t)KVP_DT_TOKEN_FIXED + token[KVP_DT_TOKEN_FIXED - 1] + KVP_DT_SIG_BYTES != len)
        return KVP_ERR_INVALID;
    const uint8_t *p = token + 4 + KVP_DT_KEYID_BYTES;
    if (memcmp(p + 12, pk, KVP_DT_PK_BYTES) != 0)
        return KVP_ERR_INVALID; /* for another ephemeral key: useless here */
    *segment_id = get32(p);
    *expires_ms = get64(p + 4);
    return KVP_OK;
}

int kvp_dt_wallet_put(struct kvp_dt_wallet *w, const uint8_t *token, size_t len)
{
    uint32_t seg;
    uint64_t expires;
    if (kvp_dt_token_peek(token, len, w->pk, &seg, &expires) != KVP_OK)
        return KVP_ERR_INVALID;
    struct dt_held *h = wallet_find(w, seg);
    if (h && h->expires_ms > expires)
        return KVP_OK; /* an older token arriving after a newer one: keep the newer */
    if (!h) {
        if (w->n == w->cap) {
            size_t nc = w->cap ? 2 * w->cap : 8;
            struct dt_held *nh = realloc(w->held, nc * sizeof *nh);
            if (!nh)
                return KVP_ERR_NOMEM;
            w->held = nh;
            w->cap = nc;
        }
        h = &w->held[w->n++];
    }
    h->segment_id = seg;
    h->expires_ms = expires;
    h->len = len;
    memcpy(h->token, token, len);
    return KVP_OK;
}

bool kvp_dt_wallet_needs(const struct kvp_dt_wallet *w, uint32_t segment_id, uint64_t now_ms, uint64_t margin_ms)
{
    const struct dt_held *h = wallet_find(w, segment_id);
    return !h || now_ms + margin_ms >= h->expires_ms;
}

int kvp_dt_wallet_respond(const struct kvp_dt_wallet *w, const uint8_t challenge[KVP_DT_CHALLENGE_BYTES],
                          uint64_t now_ms, uint8_t *out, size_t cap)
{
    if (memcmp(challenge, "KVPC", 4) != 0 || challenge[4] != KVP_DT_VERSION)
        return KVP_ERR_INVALID;
    const struct dt_held *h = wallet_find(w, get32(challenge + 8));
    if (!h || now_ms >= h->expires_ms)
        return KVP_ERR_NOT_FOUND;
    return kvp_dt_respond(challenge, h->token, h->len, w->sk, out, cap);
}

void kvp_dt_wallet_destroy(struct kvp_dt_wallet **wp)
{
    if (!wp || !*wp)
        return;
    sodium_memzero((*wp)->sk, sizeof (*wp)->sk);
    free((*wp)->held);
    free(*wp);
    *wp = NULL;
}
