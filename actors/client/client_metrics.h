/*
 * client_metrics.h — metrics of an open client (docs/operations.md "Metrics and health
 * endpoints"): counted by the API calls on the callers' threads, served on `metrics_port`
 * (0 = off: nothing is counted, every hook is one NULL test). Not part of the public API.
 */
#ifndef KVP_CLIENT_METRICS_H
#define KVP_CLIENT_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "actors/client/client.h"

enum kvp_client_op { KVP_CLIENT_OP_PUT = 0, KVP_CLIENT_OP_GET, KVP_CLIENT_OP_EXISTS, KVP_CLIENT_OP_N };

/** When cfg.metrics_port > 0: allocate the counters and serve HTTP on local_hostname. KVP_OK or
 * the endpoint's error (logged; the open fails: the caller asked for the endpoint). */
int kvp_client_metrics_start(struct kvp_client *c);
/** Stop the endpoint, then free the counters. Before the engine and segment go. NULL-safe. */
void kvp_client_metrics_stop(struct kvp_client *c);

/** The start time of a call for kvp_client_metrics_*: 0 when metrics are off (no clock read). */
uint64_t kvp_client_metrics_t0(const struct kvp_client *c);

/** One batch put (or kvp_put) returned rc; results[0..n) per key when rc is KVP_OK. */
void kvp_client_metrics_put(struct kvp_client *c, int rc, size_t n, const struct kvp_client_obj *objs,
                            const int *results, uint64_t t0_us);
/** One batch get: results[i] bytes read or an error. */
void kvp_client_metrics_get(struct kvp_client *c, int rc, size_t n, const int64_t *results, uint64_t t0_us);
/** One batch exists: results[i] 1, 0 or an error. */
void kvp_client_metrics_exists(struct kvp_client *c, int rc, size_t n, const int *results, uint64_t t0_us);

#endif
