/*
 * service.h — the master RPC service: one Raft member's control-plane actor.
 *
 * The service owns a ZeroMQ ROUTER bound at tcp://<cfg.listen>, the raftlog (canonical raft on
 * its own thread, with the master FSM of fsm.h wired into it) and the leader-only soft state
 * (read leases, last access per key, last heartbeat per segment). run() serves them as a runtime
 * actor ("master-<id>", its own thread; service_actor.c) that watches the ROUTER and the raftlog
 * events socket and runs its timers; a child actor ("prober") runs the blocking data-plane probes.
 * Requests go through one dispatch table (service_rpc.c), one handler per request type.
 *
 * Request handling (docs/master.md, DESIGN.md "Core flows" and "Master failover"):
 *  - every frame is decoded with kvp_wire_decode_request(); a frame that fails gets a WARN line
 *    naming the peer and no reply (there is no req_id to answer);
 *  - on a follower (or before this node leads) every request is answered KVP_ERR_NOT_LEADER with
 *    leader_hint = the leader's control "host:port" when known;
 *  - mutations become Raft commands (kvp_raftlog_submit), reads become raftlog queries
 *    (kvp_raftlog_query: served only while the leader has heard from a quorum);
 *  - Heartbeat, ReportUnreachable, Members, TransferLeader, AddMember, RemoveMember are handled
 *    by the service itself;
 *  - a reply that would arrive after the request's timeout_ms is dropped.
 *
 * Threads: kvp_master_service_new/run/destroy are called from one thread (the process's main
 * thread in kvpool-master), which waits in run() while the actor serves.
 * kvp_master_service_request_stop() may be called from any thread.
 */
#ifndef KVP_MASTER_SERVICE_H
#define KVP_MASTER_SERVICE_H

#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"

struct kvp_master_service;

/* Most items of one PutStart request (one Raft command); more is KVP_ERR_INVALID. The client
 * library sends at most KVP_CLIENT_PUT_CHUNK (8,192) per request. */
#define KVP_MASTER_MAX_PUT_ITEMS 65536u

/**
 * Create the service: parse cfg->members ("ID@CTRL_HOST:PORT@RAFT_HOST:PORT,..."; empty means
 * a single-member cluster of this node), create the FSM, start the raftlog (bootstrap from the
 * members list when the data dir is empty and !cfg->join) and bind the ROUTER.
 * cfg is copied. Blocks only for the raftlog's synchronous start.
 * Errors: KVP_ERR_INVALID (bad members list, this id missing from it), KVP_ERR_IO (bind, data
 * dir), KVP_ERR_NOMEM; each logged with its context.
 */
int kvp_master_service_new(struct kvp_master_service **out, const struct kvp_cfg_master *cfg);

/**
 * Serve until SIGINT/SIGTERM (czmq's zsys_interrupted, looked at every 50 ms) or
 * kvp_master_service_request_stop(): spawns the service actor, waits, stops it. Blocks the
 * calling thread. An actor that fails (a handler's error) is logged at ERROR and its error
 * returned: the process stops. Returns KVP_OK on a requested stop; KVP_ERR_IO when it stopped
 * because its Raft log cannot be written (a full disk, an I/O error: logged, leadership handed
 * over first, at most 2 s): then the caller must exit without kvp_master_service_destroy
 * (raft holds appends that will never be answered) and let a supervisor restart the member.
 */
int kvp_master_service_run(struct kvp_master_service *svc);

/** Ask run() to return (a message to the sink run() waits on). Any thread, before or during run(). */
void kvp_master_service_request_stop(struct kvp_master_service *svc);

/** Stop the raftlog, close the socket, free the FSM and the state. Accepts NULL; sets *svc NULL. */
void kvp_master_service_destroy(struct kvp_master_service **svc);

/** One parsed member of the "members" config string. */
struct kvp_master_member {
    uint64_t id;
    char address[256];      /* control "host:port" */
    char raft_address[256]; /* Raft "host:port" */
};

/**
 * Parse "ID@CTRL@RAFT,ID@CTRL@RAFT,..." into out[0..cap). Whitespace around entries is ignored.
 * Returns the count (>= 0), or KVP_ERR_INVALID (bad entry, id 0, duplicate id, more than cap).
 * Pure: used by kvpool-master, kvpoolctl and the tests.
 */
int kvp_master_members_parse(const char *s, struct kvp_master_member *out, int cap);

#endif
