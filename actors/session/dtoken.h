/*
 * dtoken.h — a process's data-plane tokens (docs/security.md "Data plane: tokens"): its ephemeral
 * key pair, the DataToken requests to the masters before a transfer needs a token, and the
 * hand-over of the tokens to the transfer engine's actors, which sign the segments' challenges
 * from their own wallets (kvp_xfer_params.token_wallet, kvp_xfer_tokens_put). Used by the client
 * and by a segment's mover.
 */
#ifndef KVP_CLIENT_DTOKEN_H
#define KVP_CLIENT_DTOKEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvp_dtoken;
struct kvp_dt_wallet;
struct kvp_msession;
struct kvp_xfer_engine;
struct kvp_xfer_slice;

/** A fresh ephemeral key pair. Errors: KVP_ERR_NOMEM, KVP_ERR_IO. `who` names log lines. */
int kvp_dtoken_new(struct kvp_dtoken **out, const char *who);

/**
 * The wallet holding d's key pair and no token, for kvp_xfer_params.token_wallet: each transfer
 * actor copies the key at engine start. Owned by d, never changed; d outlives the engine.
 */
const struct kvp_dt_wallet *kvp_dtoken_key(const struct kvp_dtoken *d);

/**
 * Before running slices on engine xe (made with kvp_dtoken_key(d)): ask the masters (one
 * DataToken call, at most 64 segments) for a token for every segment among them whose token is
 * missing or ends within a minute, and give the tokens to xe's transfer actors
 * (kvp_xfer_tokens_put) before recording them as held. So when this returns, a kvp_xfer_run on
 * xe by this thread, or by any thread after its own kvp_dtoken_ensure found nothing to ask, is
 * handled after the tokens reached its transfer actor. Blocks the calling thread for that call
 * (at most timeout_ms); failures are logged and left to the transfer (a segment that requires a
 * token then refuses the connection). A master that does not issue tokens (auth none, older
 * master) turns asking off. Any thread that is not one of xe's actors.
 */
void kvp_dtoken_ensure(struct kvp_dtoken *d, struct kvp_msession *ms, struct kvp_xfer_engine *xe,
                       const struct kvp_xfer_slice *sl, size_t n, uint32_t timeout_ms);

/**
 * true when d records a token for segment_id, valid at least margin_ms after now_ms (wall ms),
 * that every transfer actor of the engine was sent. Any thread.
 */
bool kvp_dtoken_held(const struct kvp_dtoken *d, uint32_t segment_id, uint64_t now_ms, uint64_t margin_ms);

/** true once the masters answered that they issue no tokens (asking is off). Any thread. */
bool kvp_dtoken_off(const struct kvp_dtoken *d);

/** Accepts NULL; sets *d NULL. Only after the engine using its key was destroyed. */
void kvp_dtoken_destroy(struct kvp_dtoken **d);

#endif
