/*
 * auth_token.h — the data-plane token (issue 25 item 2, docs/security.md "Data plane: tokens").
 *
 * A segment's data port admits a connection only after it presents a token a master issued to
 * an authenticated client, and proves it holds the client's ephemeral secret key:
 *
 *   token  = Ed25519_sign_master( "KVT1", issuer key id, segment id, expiry (wall ms),
 *                                 client ephemeral Ed25519 public key, client id, tenant )
 *   segment → client, on accept:   challenge = "KVPC", version, segment id, 32 random bytes
 *   client  → segment, first bytes: response = "KVPR", token length, token,
 *                                   Ed25519_sign_ephemeral("KVPP" | challenge)
 *
 * The segment checks, before it reads any request: the magic and lengths (garbage and a peer
 * without a token fail here), the master's signature with one of the masters' public keys it
 * was given (forged or altered tokens), the segment id (a token for another segment), the
 * expiry against its wall clock (an expired token), and the proof over its own fresh challenge
 * with the ephemeral key named in the token (a replayed token or a replayed response: the
 * challenge differs per connection and the ephemeral secret never leaves the client).
 * The challenge goes out at accept, so a client pays at most one extra round trip per new
 * connection (it sends the response and its first requests together).
 *
 * Ed25519 is libsodium's crypto_sign (RFC 8032). Everything here is pure: no I/O, no threads;
 * the wall time is passed in. Integers are little-endian on the wire.
 */
#ifndef KVP_AUTH_TOKEN_H
#define KVP_AUTH_TOKEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_DT_PK_BYTES 32         /* Ed25519 public key */
#define KVP_DT_SK_BYTES 64         /* Ed25519 secret key (libsodium layout: seed + public key) */
#define KVP_DT_SIG_BYTES 64
#define KVP_DT_KEYID_BYTES 8       /* first bytes of the issuer's public key: which key to check */
#define KVP_DT_CLIENT_ID_BYTES 32  /* the client's identity (BLAKE2b-256 of its principal) */
#define KVP_DT_TENANT_MAX 63
#define KVP_DT_NONCE_BYTES 32
#define KVP_DT_CHALLENGE_BYTES 44  /* "KVPC" u8 version, 3 zero bytes, u32 segment id, nonce */
/* token: "KVT1" keyid u32 seg u64 expiry eph_pk client_id u8 tenant_len tenant sig */
#define KVP_DT_TOKEN_FIXED (4 + KVP_DT_KEYID_BYTES + 4 + 8 + KVP_DT_PK_BYTES + KVP_DT_CLIENT_ID_BYTES + 1)
#define KVP_DT_TOKEN_MAX (KVP_DT_TOKEN_FIXED + KVP_DT_TENANT_MAX + KVP_DT_SIG_BYTES)
#define KVP_DT_RESPONSE_HEAD 6     /* "KVPR" u16 token length */
#define KVP_DT_RESPONSE_MAX (KVP_DT_RESPONSE_HEAD + KVP_DT_TOKEN_MAX + KVP_DT_SIG_BYTES)
#define KVP_DT_VERSION 1
/* How long a token a master issues is valid (ms). A client asks again before it ends; a
 * connection already admitted is not cut when its token expires (the check is at connect). */
#define KVP_DT_TTL_MS (10u * 60u * 1000u)

/** What a verified token says (filled by kvp_dt_verify on success). */
struct kvp_dt_claims {
    uint32_t segment_id;
    uint64_t expires_ms; /* wall clock, ms since the epoch */
    uint8_t client_pk[KVP_DT_PK_BYTES];
    uint8_t client_id[KVP_DT_CLIENT_ID_BYTES];
    char tenant[KVP_DT_TENANT_MAX + 1];
};

/** libsodium's init (idempotent, thread-safe). KVP_ERR_IO when libsodium cannot start. */
int kvp_dt_init(void);

/** A fresh Ed25519 key pair (a master's signing key, a client's ephemeral key). */
int kvp_dt_keypair(uint8_t pk[KVP_DT_PK_BYTES], uint8_t sk[KVP_DT_SK_BYTES]);

/**
 * Master side: sign a token for `c` with the master's secret key `sk` (its public key `pk`
 * names the issuer). Writes at most KVP_DT_TOKEN_MAX bytes to out (cap bytes); returns the
 * length, or KVP_ERR_INVALID (tenant longer than KVP_DT_TENANT_MAX, cap too small).
 */
int kvp_dt_issue(const uint8_t pk[KVP_DT_PK_BYTES], const uint8_t sk[KVP_DT_SK_BYTES],
                 const struct kvp_dt_claims *c, uint8_t *out, size_t cap);

/** Segment side: the challenge of one new connection (fresh random nonce) for segment_id. */
void kvp_dt_challenge(uint32_t segment_id, uint8_t out[KVP_DT_CHALLENGE_BYTES]);

/**
 * Client side: the response to `challenge` with a token and the ephemeral secret key the token
 * names. Returns its length (at most KVP_DT_RESPONSE_MAX), or KVP_ERR_INVALID (a bad challenge,
 * a token too long, cap too small).
 */
int kvp_dt_respond(const uint8_t challenge[KVP_DT_CHALLENGE_BYTES], const uint8_t *token, size_t token_len,
                   const uint8_t eph_sk[KVP_DT_SK_BYTES], uint8_t *out, size_t cap);

/**
 * Segment side, on the first bytes of a connection: how many bytes the whole response has,
 * given the `len` bytes received so far: 0 = not enough to tell yet, > 0 = the total length,
 * KVP_ERR_MALFORMED = not a response (garbage, or a peer that sent requests without a token).
 */
int kvp_dt_response_length(const uint8_t *buf, size_t len);

/**
 * Segment side: check a whole response (kvp_dt_response_length bytes) against this
 * connection's challenge, this segment's id, the wall clock now_ms and the masters' public keys
 * (n of them). KVP_OK fills *out (may be NULL); else KVP_ERR_DENIED with *why (static text)
 * saying what failed, or KVP_ERR_MALFORMED for bytes that are not a response.
 */
int kvp_dt_verify(const uint8_t challenge[KVP_DT_CHALLENGE_BYTES], const uint8_t *resp, size_t len,
                  uint32_t segment_id, uint64_t now_ms, const uint8_t (*master_pks)[KVP_DT_PK_BYTES], size_t n,
                  struct kvp_dt_claims *out, const char **why);

/*
 * The client's side: a wallet of tokens, one per segment, for one ephemeral key pair (made by
 * kvp_dt_wallet_new; the public key is what the client sends the masters with a token request).
 * The TCP transport's connect path answers a segment's challenge with kvp_dt_wallet_respond.
 * One owner at a time (no lock inside): the owning actor, or a lock of the caller's.
 */
struct kvp_dt_wallet;

/** A wallet with a fresh ephemeral key pair. Errors: KVP_ERR_NOMEM, KVP_ERR_IO. */
int kvp_dt_wallet_new(struct kvp_dt_wallet **out);
/**
 * An empty wallet with w's key pair (no tokens): each transfer actor signs from its own copy,
 * filled by message (kvp_xfer_tokens_put). Reads only w's key (set at new, never changed), so
 * any thread may copy while another owns w. Errors: KVP_ERR_NOMEM, KVP_ERR_INVALID (NULL).
 */
int kvp_dt_wallet_copy_key(const struct kvp_dt_wallet *w, struct kvp_dt_wallet **out);
/** The wallet's ephemeral public key (to send with a token request). */
void kvp_dt_wallet_public_key(const struct kvp_dt_wallet *w, uint8_t pk[KVP_DT_PK_BYTES]);
/**
 * A token's segment id and expiry (wall ms), when it is well formed and issued for the ephemeral
 * public key pk; the master's signature is not checked (the segment does). KVP_ERR_INVALID
 * otherwise. Pure.
 */
int kvp_dt_token_peek(const uint8_t *token, size_t len, const uint8_t pk[KVP_DT_PK_BYTES], uint32_t *segment_id,
                      uint64_t *expires_ms);
/**
 * Keep a token a master issued for this wallet. It replaces the one held for the same segment
 * unless that one expires later (two refreshes can arrive in either order).
 * The wallet reads the token's segment id and expiry but does not check the master's signature
 * (the segment does). KVP_ERR_INVALID: not a token, or issued for another ephemeral key.
 */
int kvp_dt_wallet_put(struct kvp_dt_wallet *w, const uint8_t *token, size_t len);
/**
 * true when the wallet holds no token for segment_id that is still valid margin_ms from now
 * (wall ms): the client asks the masters for a fresh one before it expires.
 */
bool kvp_dt_wallet_needs(const struct kvp_dt_wallet *w, uint32_t segment_id, uint64_t now_ms, uint64_t margin_ms);
/**
 * The response to a segment's challenge (the segment id it names picks the token). Returns
 * its length, KVP_ERR_NOT_FOUND (no unexpired token for that segment: ask the masters),
 * KVP_ERR_INVALID (not a challenge, cap too small).
 */
int kvp_dt_wallet_respond(const struct kvp_dt_wallet *w, const uint8_t challenge[KVP_DT_CHALLENGE_BYTES],
                          uint64_t now_ms, uint8_t *out, size_t cap);
void kvp_dt_wallet_destroy(struct kvp_dt_wallet **w);

#endif
