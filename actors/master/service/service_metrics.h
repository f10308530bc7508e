/*
 * service_metrics.h — the master's metrics (docs/operations.md "Metrics"): counters the service
 * actor keeps on its own thread, a snapshot it renders every METRICS_PUBLISH_MS into a
 * kvp_metrics_pub slot, and the endpoint itself (metrics_port; off when 0), hosted in the
 * service actor: requests are served on the service thread (metrics/metrics.h).
 */
#ifndef KVP_MASTER_SERVICE_METRICS_H
#define KVP_MASTER_SERVICE_METRICS_H

#include <stdint.h>

#include "wire/kvpool.pb-c.h"

struct kvp_master_service;

/* Allocate the counters and, when cfg.metrics_port > 0, serve HTTP on the host of cfg.listen.
 * KVP_OK, or the endpoint's error (logged): the master does not start without the endpoint it
 * was asked for. */
int svc_metrics_start(struct kvp_master_service *s);
/* Stop the endpoint (first: nothing reads the slot after) and free. Safe when never started. */
void svc_metrics_destroy(struct kvp_master_service *s);
/* The publish timer on s->loop (run()). */
int svc_metrics_timer_start(struct kvp_master_service *s);

/* Hooks of the service thread (cheap: array increments). */
/* A reply leaves (svc_reply): counted under the request type being handled and its status. */
void svc_metrics_on_reply(struct kvp_master_service *s, const Kvp__Response *resp);
/* The request type and receive time replies are counted under until the matching _end. Nests. */
void svc_metrics_begin(struct kvp_master_service *s, int body_case, uint64_t recv_us, int *saved_type,
                       uint64_t *saved_us);
void svc_metrics_end(struct kvp_master_service *s, int saved_type, uint64_t saved_us);
/* Leadership as seen by svc_set_leadership (counts leader changes). */
void svc_metrics_on_leader(struct kvp_master_service *s, uint64_t leader_id);
/* Publish a snapshot now (a role change); nothing without an endpoint. */
void svc_metrics_publish_now(struct kvp_master_service *s);
/* A fresh FSM ClusterStatus document (the leader's 1 s refresh): kept for the next snapshot. */
void svc_metrics_note_fsm(struct kvp_master_service *s, const char *json);

#endif
