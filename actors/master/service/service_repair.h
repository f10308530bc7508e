/*
 * service_repair.h — the leader's drain and repair driver (docs/drain-repair.md).
 *
 * Leader only, on the service thread. A 100 ms timer runs the RepairScan query on the FSM (every
 * 200 ms while there is work, every second otherwise), turns "copy needed" items into
 * RepairStart commands (a PENDING replica on another ACTIVE segment), keeps the resulting copy
 * tasks in memory and hands them to the mover of the source segment when it polls
 * (MoverPoll), paced by `repair_bandwidth_bytes_per_s`. A mover's report becomes RepairEnd
 * (COMPLETE or freed). A replica on a DRAINING segment whose object has its replicas elsewhere
 * is dropped (ReplicaDrop) once it has been droppable for default_kv_lease_ttl (replica lists
 * stop naming a DRAINING replica as soon as an ACTIVE one exists, so every lease that could
 * still name it has expired by then). Nothing here is replicated: a new leader starts empty,
 * accepts reports for tasks it never saw, and frees PENDING repair replicas nobody reports on.
 */
#ifndef KVP_MASTER_SERVICE_REPAIR_H
#define KVP_MASTER_SERVICE_REPAIR_H

#include <stdint.h>

#include <czmq.h>
#include <jansson.h>

#include "wire/kvpool.pb-c.h"

struct kvp_master_service;
struct svc_pending;

/* svc_pending.internal values of the repair driver (above enum svc_internal_kind). */
enum {
    SVC_INT_REPAIR_SCAN = 100,
    SVC_INT_REPAIR_START = 101,
    SVC_INT_REPAIR_END = 102,
    SVC_INT_REPLICA_DROP = 103,
};

/** Start the driver's timer on s->loop. Returns KVP_OK or KVP_ERR_NOMEM. */
int svc_repair_start(struct kvp_master_service *s);
/** Forget every task and counter (leadership change). */
void svc_repair_reset(struct kvp_master_service *s);
/** Free the driver's state (service destroy). */
void svc_repair_free(struct kvp_master_service *s);
/** MoverPoll request from a segment: record its reports, answer its next tasks. */
void svc_repair_on_mover_poll(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req);
/** Result of one of the driver's internal commands or queries (p->internal >= 100). */
void svc_repair_on_result(struct kvp_master_service *s, struct svc_pending *p, int status,
                          const Kvp__Response *resp);
/** The prober's verdict on a reported segment (KVP_OK or the probe's error). */
void svc_repair_note_probe(struct kvp_master_service *s, uint32_t segment_id, int rc);
/** true when a probe of segment_id failed after after_ms (monotonic; e.g. its last heartbeat),
 * within the last client_ttl, and none answered since. */
/** Time of the last failed probe of the segment (monotonic ms), 0 = none (or answered since). */
uint64_t svc_repair_probe_failed_at(struct kvp_master_service *s, uint32_t segment_id);
/** The "repair" object of the status document (new reference). */
json_t *svc_repair_status(struct kvp_master_service *s);

#endif
