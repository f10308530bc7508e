/*
 * kvpoolctl_ctl.h — shared state of the kvpoolctl commands (kvpoolctl.c: main, option parsing,
 * master calls; kvpoolctl_admin.c: status/leader/members/segments/transfer-leader/add-member/
 * remove-member; kvpoolctl_cluster.c: cluster up/down/restart). Internal to the tool.
 */
#ifndef KVPOOLCTL_CTL_H
#define KVPOOLCTL_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "wire/kvpool.pb-c.h"

#define CTL_MAX_MASTERS 9

struct ctl {
    bool json;                 /* --json: machine-readable output on stdout */
    uint32_t timeout_ms;       /* --timeout MS: one master call incl. failover retries */
    const char *cluster_file;  /* --cluster FILE */
    const char *masters_arg;   /* --masters LIST */
    char *masters[CTL_MAX_MASTERS];
    size_t n_masters;
    struct kvp_msession *ms;   /* opened lazily by ctl_call */
};

/** Resolve the master list (--masters, --cluster, KVPOOL_MASTER_SERVER_ADDRESS,
 * KVPOOL_CLUSTER_FILE) once. Prints the problem and returns non-zero when there is none. */
int ctl_resolve_masters(struct ctl *c);
/** Replace the master list (cluster up uses the addresses it just chose). */
int ctl_set_masters(struct ctl *c, const char *comma_list);
/** Send req to the leader. KVP_OK: *out is the response (free with ctl_response_free), whose
 * status may itself be an error. */
int ctl_call(struct ctl *c, Kvp__Request *req, uint32_t timeout_ms, Kvp__Response **out);
void ctl_response_free(Kvp__Response *r);
/** ClusterStatus as parsed JSON (caller json_decref), or NULL with *err set. */
json_t *ctl_status(struct ctl *c, uint32_t timeout_ms, int *err);
/** Print an error for a failed call: "kvpoolctl CMD: NAME (text)[: context]" on stderr, or
 * {"error":..} on stdout with --json. Returns 1 (the exit code). */
int ctl_fail(struct ctl *c, const char *cmd, int err, const char *context);
void ctl_print_json(json_t *j);
void ctl_close(struct ctl *c);

int ctl_cmd_status(struct ctl *c, int argc, char **argv);
int ctl_cmd_leader(struct ctl *c, int argc, char **argv);
int ctl_cmd_members(struct ctl *c, int argc, char **argv);
int ctl_cmd_segments(struct ctl *c, int argc, char **argv);
int ctl_cmd_transfer_leader(struct ctl *c, int argc, char **argv);
int ctl_cmd_add_member(struct ctl *c, int argc, char **argv);
int ctl_cmd_remove_member(struct ctl *c, int argc, char **argv);
int ctl_cmd_drain(struct ctl *c, int argc, char **argv);
int ctl_cmd_segment_lost(struct ctl *c, int argc, char **argv);
/** kvpoolctl verify KEY... (kvpoolctl_verify.c). */
int ctl_cmd_verify(struct ctl *c, int argc, char **argv);
int ctl_cmd_cluster(struct ctl *c, int argc, char **argv);
/* kvpoolctl_top.c: live view from the processes' /metrics endpoints. */
int ctl_cmd_top(struct ctl *c, int argc, char **argv);
/** kvpoolctl keygen (kvpoolctl_auth.c). */
int ctl_cmd_keygen(struct ctl *c, int argc, char **argv);
/** Open c->ms with the CURVE keys of the cluster file or the environment (kvpoolctl_auth.c). */
int ctl_msession_open(struct ctl *c);
/** cluster up: fresh keys in DIR/keys (masters with their control addresses, client, segment,
 * admin; public halves in keys/allowed, masters' also in keys/masters) and cl's "auth"
 * section; with auth_off only {"mode":"none"}. Returns 0, or 1 (printed). */
int ctl_cluster_keys(const char *dir, int n_masters, const char *const *master_addrs, bool auth_off, json_t *cl);
/** Append a process's auth flags (from cl's "auth") to cmd; returns the new count. buf holds a path. */
size_t ctl_cluster_auth_args(json_t *cl, const char *role, int master_index, const char **cmd, size_t ncmd,
                             char *buf, size_t cap);

#endif
