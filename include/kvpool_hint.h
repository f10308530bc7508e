/*
 * kvpool_hint.h — optional eviction hints for puts (docs/eviction.md). Separate from kvpool.h so
 * that no existing signature changes.
 *
 * With `eviction_policy = prefix` on the masters, a block of a prefix chain (KV cache of tokens
 * [0, k·B)) should name the block before it as its parent: the master then never evicts a block
 * while a child of it is stored, and among such leaves evicts the least recently used first. A
 * chain's later blocks of a cold prefix therefore go before the head of a warm one.
 */
#ifndef KVPOOL_HINT_H
#define KVPOOL_HINT_H

#include "kvpool.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * kvp_batch_put with one parent key per object (parent_keys[i] NULL or "" = a chain head or no
 * hint; parent_keys itself may be NULL). Same results and return value as kvp_batch_put. The
 * hint is advisory, kept by the current leader only (lost on failover).
 */
int kvp_batch_put_hinted(kvp_client *c, size_t n, const char *const keys[], const void *const bufs[],
                         const size_t lens[], const char *const parent_keys[], const kvp_put_opts *opts,
                         int results[]);

#ifdef __cplusplus
}
#endif

#endif
