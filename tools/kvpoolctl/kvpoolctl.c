/*
 * kvpoolctl.c — the operator CLI: entry point, global options, master calls (through the
 * master session, actors/session/msession.h) and dispatch to the commands.
 *
 *   kvpoolctl [--cluster DIR/cluster.json | --masters host:port,...] [--json] [--timeout MS] CMD ...
 *
 * Commands: status, leader, members, segments, transfer-leader [ID], add-member ID CTRL RAFT,
 * remove-member ID (kvpoolctl_admin.c); cluster up|down|restart (kvpoolctl_cluster.c); put, get,
 * exists, rm, size (kvpoolctl_data.c). docs/operations.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "actors/session/msession.h"
#include "config/config.h"
#include "kvpool.h"
#include "runtime/log.h"
#include "tools/kvpoolctl/kvpoolctl_ctl.h"

#if defined(__has_include)
#if __has_include("tools/kvpoolctl/kvpoolctl.h")
#include "tools/kvpoolctl/kvpoolctl.h"
#endif
#endif

/* The data commands live in kvpoolctl_data.c; this fallback only links when that file is absent. */
int kvpctl_data_main(int argc, char **argv) __attribute__((weak));
int kvpctl_data_main(int argc, char **argv)
{
    fprintf(stderr, "kvpoolctl: data commands (put/get/exists/rm/size) are not built in this binary\n");
    return 2;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvpoolctl [--cluster DIR/cluster.json | --masters host:port,...] [--json] [--timeout MS] COMMAND\n"
            "commands:\n"
            "  status                      cluster status: leader, term, members, segments, settings in force\n"
            "  leader                      the leader's id, control address and pid\n"
            "  members                     the Raft members and their addresses\n"
            "  segments                    the mounted segments\n"
            "  transfer-leader [ID]        hand leadership to member ID (or any other member)\n"
            "  add-member ID CTRL RAFT     add a voter (start it first with kvpool-master --join)\n"
            "  remove-member ID            remove a member from the configuration\n"
            "  drain SEGMENT               mark a segment (id or name) DRAINING\n"
            "  segment-lost ID --yes       declare a segment lost now (a dead one the leader withholds)\n"
            "  verify KEY...               check every replica's bytes against the object's checksum (exit 0 all\n"
            "                              match, 1 a mismatch, 3 a key missing or a replica unanswered)\n"
            "  put KEY FILE|- , get KEY [FILE], exists KEY, rm KEY [--force], size KEY\n"
            "  top [--endpoints HOST:PORT,...] [--interval MS] [--count N]   live view from /metrics (default:\n"
            "                              the endpoints of --cluster, started with cluster up --metrics)\n"
            "  cluster up --dir DIR --masters N [--segments N --segment-size SIZE] [--base-port P] [--config FILE]\n"
            "             [--metrics]      (every process serves /metrics; cluster.json names each endpoint)\n"
            "  cluster down --dir DIR [--grace-ms MS]\n"
            "  keygen PATH [--role client|segment|admin|master] [--tenant T] [--name N] [--address HOST:PORT]\n"
            "                              a key pair: PATH (public, for the allowed-keys directory), PATH_secret\n"
            "  cluster restart --dir DIR ID     (master id, or segment name)\n"
            "every command accepts --json. Masters default to $KVPOOL_MASTER_SERVER_ADDRESS or $KVPOOL_CLUSTER_FILE.\n");
}

/* ------------------------------------------------------------------ master calls */

int ctl_set_masters(struct ctl *c, const char *list)
{
    kvp_cfg_free_masters(c->masters, c->n_masters);
    c->n_masters = 0;
    kvp_msession_destroy(&c->ms);
    return kvp_cfg_masters(list, NULL, c->masters, CTL_MAX_MASTERS, &c->n_masters);
}

int ctl_resolve_masters(struct ctl *c)
{
    if (c->n_masters)
        return 0;
    const char *list = c->masters_arg;
    const char *file = c->cluster_file;
    if (!list && !file) {
        list = getenv("KVPOOL_MASTER_SERVER_ADDRESS");
        file = getenv("KVPOOL_CLUSTER_FILE");
    }
    if ((!list || !*list) && (!file || !*file)) {
        fprintf(stderr, "kvpoolctl: give --cluster DIR/cluster.json or --masters host:port,...\n");
        return 2;
    }
    char path[1100];
    struct stat sb;
    if (file && stat(file, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(path, sizeof path, "%s/cluster.json", file);
        file = path;
    }
    int rc = kvp_cfg_masters(list, file, c->masters, CTL_MAX_MASTERS, &c->n_masters);
    if (rc != KVP_OK || c->n_masters == 0) {
        fprintf(stderr, "kvpoolctl: no usable master list (%s)\n", kvp_strerror(rc ? rc : KVP_ERR_INVALID));
        return 2;
    }
    return 0;
}

int ctl_call(struct ctl *c, Kvp__Request *req, uint32_t timeout_ms, Kvp__Response **out)
{
    *out = NULL;
    if (ctl_resolve_masters(c) != 0)
        return KVP_ERR_INVALID;
    if (!c->ms) {
        int rc = ctl_msession_open(c); /* CURVE keys: kvpoolctl_auth.c */
        if (rc != KVP_OK)
            return rc;
    }
    return kvp_msession_call(c->ms, req, timeout_ms ? timeout_ms : c->timeout_ms, out);
}

void ctl_response_free(Kvp__Response *r)
{
    if (r)
        kvp_msession_response_free(r);
}

json_t *ctl_status(struct ctl *c, uint32_t timeout_ms, int *err)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__ClusterStatusReq cs = KVP__CLUSTER_STATUS_REQ__INIT;
    req.body_case = KVP__REQUEST__BODY_CLUSTER_STATUS;
    req.cluster_status = &cs;
    Kvp__Response *resp = NULL;
    int rc = ctl_call(c, &req, timeout_ms, &resp);
    if (rc == KVP_OK && resp->status != KVP_OK)
        rc = resp->status;
    json_t *j = NULL;
    if (rc == KVP_OK) {
        json_error_t je;
        j = resp->cluster_status && resp->cluster_status->json ? json_loads(resp->cluster_status->json, 0, &je)
                                                               : NULL;
        if (!j)
            rc = KVP_ERR_MALFORMED;
    }
    ctl_response_free(resp);
    *err = rc;
    return j;
}

int ctl_fail(struct ctl *c, const char *cmd, int err, const char *context)
{
    if (c->json) {
        json_t *j = json_pack("{s:s, s:s, s:i, s:s}", "error", kvp_errname(err), "message", kvp_strerror(err),
                              "code", err, "context", context ? context : "");
        ctl_print_json(j);
        json_decref(j);
    } else {
        fprintf(stderr, "kvpoolctl %s: %s (%s)%s%s\n", cmd, kvp_errname(err), kvp_strerror(err),
                context && *context ? ": " : "", context ? context : "");
    }
    return 1;
}

void ctl_print_json(json_t *j)
{
    char *s = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    printf("%s\n", s ? s : "null");
    free(s);
    fflush(stdout);
}

void ctl_close(struct ctl *c)
{
    kvp_msession_destroy(&c->ms);
    kvp_cfg_free_masters(c->masters, c->n_masters);
    c->n_masters = 0;
}

/* ------------------------------------------------------------------ main */

struct ctl_cmd {
    const char *name;
    int (*fn)(struct ctl *c, int argc, char **argv);
};

static const struct ctl_cmd CMDS[] = {
    {"status", ctl_cmd_status},
    {"leader", ctl_cmd_leader},
    {"members", ctl_cmd_members},
    {"segments", ctl_cmd_segments},
    {"transfer-leader", ctl_cmd_transfer_leader},
    {"add-member", ctl_cmd_add_member},
    {"remove-member", ctl_cmd_remove_member},
    {"drain", ctl_cmd_drain},
    {"segment-lost", ctl_cmd_segment_lost},
    {"verify", ctl_cmd_verify},
    {"top", ctl_cmd_top},
    {"keygen", ctl_cmd_keygen},
};

static bool is_data_cmd(const char *s)
{
    static const char *const data[] = {"put", "get", "exists", "rm", "remove", "size", NULL};
    for (int i = 0; data[i]; i++)
        if (strcmp(s, data[i]) == 0)
            return true;
    return false;
}

/* Global option with a value? Sets *val (from "--opt=V" or the next argument). */
static bool opt_value(int argc, char **argv, int *i, const char *name, const char **val)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0)
        return false;
    if (argv[*i][n] == '=') {
        *val = argv[*i] + n + 1;
        return true;
    }
    if (argv[*i][n] != '\0')
        return false;
    if (*i + 1 >= argc) {
        *val = NULL;
        return true;
    }
    *val = argv[++*i];
    return true;
}

int main(int argc, char **argv)
{
    struct ctl c;
    memset(&c, 0, sizeof c);
    if (!getenv("KVPOOL_LOG_LEVEL"))
        kvp_log_set_level(KVP_LOG_WARN); /* a CLI: session chatter only on request */
    c.timeout_ms = 5000;
    /* Find the command word, then collect global options around it (except for `cluster`,
     * whose own options, e.g. --masters N, differ). */
    int cmd_i = -1;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest)
        return 1;
    int nrest = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (cmd_i >= 0 && strcmp(argv[cmd_i], "cluster") == 0) {
            rest[nrest++] = argv[i];
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            free(rest);
            return 0;
        }
        if (strcmp(a, "--json") == 0) {
            c.json = true;
            if (cmd_i >= 0 && is_data_cmd(argv[cmd_i]))
                rest[nrest++] = argv[i];
            continue;
        }
        if (cmd_i >= 0 && is_data_cmd(argv[cmd_i])) {
            rest[nrest++] = argv[i];
            continue;
        }
        if (opt_value(argc, argv, &i, "--cluster", &v) || opt_value(argc, argv, &i, "--masters", &v) ||
            opt_value(argc, argv, &i, "--timeout", &v)) {
            if (!v || !*v) {
                fprintf(stderr, "kvpoolctl: %s needs a value\n", a);
                free(rest);
                return 2;
            }
            if (strncmp(a, "--cluster", 9) == 0)
                c.cluster_file = v;
            else if (strncmp(a, "--masters", 9) == 0)
                c.masters_arg = v;
            else {
                char *end = NULL;
                unsigned long t = strtoul(v, &end, 10);
                if (!end || *end || t == 0 || t > 3600000) {
                    fprintf(stderr, "kvpoolctl: --timeout %s: must be milliseconds in [1, 3600000]\n", v);
                    free(rest);
                    return 2;
                }
                c.timeout_ms = (uint32_t)t;
            }
            continue;
        }
        if (cmd_i < 0 && a[0] != '-') {
            cmd_i = i;
            continue;
        }
        rest[nrest++] = argv[i];
    }
    if (cmd_i < 0) {
        usage(stderr);
        free(rest);
        return 2;
    }
    const char *cmd = argv[cmd_i];
    int rc = 2;
    if (is_data_cmd(cmd)) {
        /* kvpctl_data_main takes [subcommand, flags and arguments...] and parses --masters,
         * --cluster and --json itself, wherever they stand. */
        int dn = 0;
        rest[dn++] = argv[cmd_i];
        for (int i = 1; i < argc; i++)
            if (i != cmd_i)
                rest[dn++] = argv[i];
        rest[dn] = NULL;
        rc = kvpctl_data_main(dn, rest);
        free(rest);
        return rc;
    }
    /* Commands see argv = [cmd, rest...]. */
    char **cargv = calloc((size_t)nrest + 2, sizeof *cargv);
    if (!cargv) {
        free(rest);
        return 1;
    }
    cargv[0] = argv[cmd_i];
    for (int i = 0; i < nrest; i++)
        cargv[i + 1] = rest[i];
    int cargc = nrest + 1;
    if (strcmp(cmd, "cluster") == 0) {
        rc = ctl_cmd_cluster(&c, cargc, cargv);
    } else {
        bool found = false;
        for (size_t i = 0; i < sizeof CMDS / sizeof CMDS[0]; i++)
            if (strcmp(cmd, CMDS[i].name) == 0) {
                found = true;
                rc = CMDS[i].fn(&c, cargc, cargv);
            }
        if (!found) {
            fprintf(stderr, "kvpoolctl: unknown command '%s'\n", cmd);
            usage(stderr);
            rc = 2;
        }
    }
    ctl_close(&c);
    free(cargv);
    free(rest);
    return rc;
}
