/*
 * put_retry.h — the client side of memory pressure (docs/eviction.md): a PutStart item answered
 * NO_SPACE with `evicting` set is retried (fresh op id) after a short back-off until the master
 * finds room or the call's deadline is near; NO_SPACE without `evicting` (eviction cannot help)
 * is final at once. Also the per-thread prefix hints of kvp_batch_put_hinted (kvpool_hint.h).
 */
#ifndef KVP_CLIENT_PUT_RETRY_H
#define KVP_CLIENT_PUT_RETRY_H

#include <stddef.h>
#include <stdint.h>

#include "actors/client/client.h"

/**
 * Retry the NO_SPACE+evicting items of a PutStart. items[j] is the PutStart item of res[j];
 * retried items get a new op_id in items[j]->op_id (the caller copies it back). res[j] is
 * replaced by the latest result; the responses that own them are appended to *extra (caller
 * frees each with kvp_msession_response_free, then free(*extra)). Items whose retry RPC failed
 * get res[j] = NULL and *rpc_status[j] set (the master may have started them: revoke). Returns
 * the number of retry rounds.
 */
unsigned kvp_client_put_start_retry(struct kvp_client *c, Kvp__PutStartItem **items, size_t m,
                                    const Kvp__PutStartResult **res, int *rpc_status, uint64_t deadline,
                                    Kvp__Response ***extra, size_t *n_extra);

/**
 * The pause before a retry round, in ms, for the round's back-off `backoff_ms` (5, 10, 20 …
 * 200): uniform in [ceil(backoff_ms / 2), backoff_ms], drawn from *rng (a per-call xorshift64*
 * state; 0 is replaced by a fixed nonzero seed). Bounded jitter, so that clients answered
 * NO_SPACE together do not all ask again at the same moment; never longer than the plain
 * back-off (a waiting put is not made slower), at least half of it (the master is not asked
 * more often than about twice the plain rate). docs/eviction.md, "Puts under pressure".
 */
unsigned kvp_put_retry_pause_ms(unsigned backoff_ms, uint64_t *rng);

/** The parent key hint of object i of the current kvp_batch_put_hinted call on this thread, or "". */
const char *kvp_client_put_parent(size_t i);

#endif
