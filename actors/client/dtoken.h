/*
 * dtoken.h — a process's data-plane tokens (docs/security.md "Data plane: tokens"): a wallet
 * (auth/auth_token.h) behind a lock, filled from the masters' DataToken request before a
 * transfer needs it, and answering segments' challenges for the transfer engine
 * (kvp_xfer_params.token_respond). Used by the client and by a segment's mover.
 */
#ifndef KVP_CLIENT_DTOKEN_H
#define KVP_CLIENT_DTOKEN_H

#include <stddef.h>
#include <stdint.h>

struct kvp_dtoken;
struct kvp_msession;
struct kvp_xfer_slice;

/** A fresh wallet (new ephemeral key). Errors: KVP_ERR_NOMEM, KVP_ERR_IO. `who` names log lines. */
int kvp_dtoken_new(struct kvp_dtoken **out, const char *who);

/**
 * Before running slices: ask the masters (one DataToken call, at most 64 segments) for a token
 * for every segment among them whose token is missing or ends within a minute. Blocks the
 * calling thread for that call (at most timeout_ms); failures are logged and left to the
 * transfer (a segment that requires a token then refuses the connection). A master that does
 * not issue tokens (auth none, older master) turns asking off. Any thread.
 */
void kvp_dtoken_ensure(struct kvp_dtoken *d, struct kvp_msession *ms, const struct kvp_xfer_slice *sl, size_t n,
                       uint32_t timeout_ms);

/** kvp_xfer_params.token_respond: ctx is the struct kvp_dtoken. Any thread. */
int kvp_dtoken_respond(void *ctx, const uint8_t *challenge, size_t len, uint8_t *out, size_t cap);

/** Accepts NULL; sets *d NULL. Only after the engine using it was destroyed. */
void kvp_dtoken_destroy(struct kvp_dtoken **d);

#endif
