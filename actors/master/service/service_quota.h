/*
 * service_quota.h — use and quota per tenant on the leader (docs/security.md "Tenants"):
 * `tenant_quota` ("A=1GiB,B=512MiB"); a PutStart of a tenant over its quota evicts that
 * tenant's own least recently used objects first, and is refused with KVP_ERR_NO_SPACE when
 * they cannot make room. Use per tenant for ClusterStatus (kvpoolctl status) and /metrics.
 */
#ifndef KVP_MASTER_SERVICE_QUOTA_H
#define KVP_MASTER_SERVICE_QUOTA_H

#include <jansson.h>
#include <stdbool.h>

#include "actors/master/service/service_state.h"
#include "metrics/metrics.h"

/** Parse cfg.tenant_quota into s->quota. Errors: KVP_ERR_INVALID (logged), KVP_ERR_NOMEM. */
int svc_quota_new(struct kvp_master_service *s);
void svc_quota_destroy(struct kvp_master_service *s);

/**
 * A PutStart of `tenant` (keys already scoped): true when it may go on (room within the quota,
 * or made by evicting the tenant's own objects); false when it was answered KVP_ERR_NO_SPACE.
 */
bool svc_quota_admit(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req, const char *tenant);

/** ClusterStatus: "tenants": [{"tenant","used_bytes","objects","quota_bytes"}] (leader only). */
void svc_quota_status(struct kvp_master_service *s, json_t *doc);

/** /metrics: kvpool_tenant_used_bytes, _objects, _quota_bytes, _quota_evictions_total,
 * _quota_refusals_total, and the auth refusal counters. */
void svc_quota_render(struct kvp_master_service *s, struct kvp_metrics_text *t);

#endif
