/*
 * kvpool_master.c — the `kvpool-master` process: one member of the metadata quorum.
 *
 *   kvpool-master --id 1 --listen 127.0.0.1:7101 --raft-address 127.0.0.1:7201 \
 *                 --data-dir /var/lib/kvpool/master-1 \
 *                 --members 1@127.0.0.1:7101@127.0.0.1:7201,2@...,3@...
 *
 * Settings: defaults < --config FILE (JSON) < KVPOOL_* environment < flags (config/config.h,
 * docs/config.md); --print-config prints the effective settings and exits. A data dir that is
 * empty bootstraps from --members unless --join (then the node waits for `kvpoolctl
 * add-member`). SIGINT/SIGTERM stop it cleanly. docs/operations.md.
 * Mooncake's mooncake_master flags work as they are (--rpc_port, --rpc_address, --client_ttl in
 * seconds, ...: docs/migrating-from-mooncake.md). Under systemd (Type=notify) it sends READY=1
 * once its control port is bound and STOPPING=1 when it stops (packaging/systemd/).
 * Exit status: 0 clean stop; 1 could not start or run (port or data dir held, Raft log not
 * writable); 2 bad settings.
 */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <czmq.h>

#include "actors/master/service/service.h"
#include "config/config.h"
#include "kvpool.h"
#include "runtime/log.h"
#include "runtime/proc.h"
#include "runtime/sdnotify.h"

static int mkdir_p(const char *path)
{
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: kvpool-master [--config FILE] [--key value ...] [--print-config] [--help]\n");
    char *h = kvp_cfg_help(KVP_CFG_MASTER);
    if (h) {
        fputs(h, stderr);
        free(h);
    }
}

int main(int argc, char **argv)
{
    /* No glibc fastbins in the master (docs/raftlog.md "Freeing millions of objects"): a freed
     * object record is coalesced when it is freed instead of parked in a fastbin, where the next
     * free or malloc of a large block (>= 64 KiB: a snapshot chunk, the pending array) coalesces
     * every parked one at once. After an install frees the replaced state of 10M objects in
     * steps, that was one 214 ms hold of the raft thread. Before any allocation. */
    if (mallopt(M_MXFAST, 0) != 1)
        fprintf(stderr, "kvpool-master: mallopt(M_MXFAST, 0) refused; large frees may coalesce in one piece\n");
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage();
            return 0;
        }
    struct kvp_cfg_master cfg;
    int done = kvp_cfg_daemon_args(KVP_CFG_MASTER, &cfg, "kvpool-master", argc, argv);
    if (done >= 0)
        return done;
    int lvl = kvp_log_parse_level(cfg.log_level);
    if (lvl >= 0)
        kvp_log_set_level(lvl);
    int fmt = kvp_log_parse_format(cfg.log_format);
    if (fmt >= 0)
        kvp_log_set_format(fmt); /* lines logged before this follow KVPOOL_LOG_FORMAT */
    if (!cfg.data_dir[0]) {
        fprintf(stderr, "kvpool-master: --data-dir is required\n");
        return 2;
    }
    if (mkdir_p(cfg.data_dir) != 0) {
        fprintf(stderr, "kvpool-master: cannot create data dir %s: %s\n", cfg.data_dir, strerror(errno));
        return 1;
    }
    /* Before anything else touches the data dir: one master per data dir, whatever the ports
     * (two masters on one Raft log would corrupt it). A dying previous incarnation still holds
     * the lock until its last thread exits, so it is retried for bind_retry_ms (issue 15). The
     * fd stays open (O_CLOEXEC) for the life of the process; exit releases the lock. */
    int lock_fd = -1;
    int lrc = kvp_datadir_lock("kvpool-master", cfg.data_dir, cfg.bind_retry_ms, &lock_fd);
    if (lrc != KVP_OK) {
        fprintf(stderr, "kvpool-master: cannot start: data dir %s %s\n", cfg.data_dir,
                lrc == KVP_ERR_BUSY ? "is in use by another kvpool-master (see the line above)"
                                    : "cannot be locked (see the line above)");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN); /* a peer that vanished is an error return, never a crash */
    zsys_init();
    zsys_set_linger(0);
    struct kvp_master_service *svc = NULL;
    int rc = kvp_master_service_new(&svc, &cfg);
    if (rc != KVP_OK) {
        /* INVALID: a setting (members list, id, raft address) named in the line above: exit 2 as
         * for every bad setting; the rest (port in use, data dir) could not start: 1 */
        fprintf(stderr, "kvpool-master: cannot start: %s%s\n", kvp_strerror(rc),
                rc == KVP_ERR_INVALID ? " (bad settings: see the line above)" : "");
        return rc == KVP_ERR_INVALID ? 2 : 1;
    }
    /* Bound and wired: a request sent from now on is served (by the leader, or answered "not
     * leader, try X"). Tell a service manager (systemd Type=notify) the start is done. */
    char status[400];
    snprintf(status, sizeof status, "READY=1\nSTATUS=serving on %s (member %llu)", cfg.listen,
             (unsigned long long)cfg.id);
    kvp_sd_notify("kvpool-master", status);
    rc = kvp_master_service_run(svc);
    kvp_sd_notify("kvpool-master", "STOPPING=1");
    if (rc == KVP_ERR_IO) {
        /* The Raft log cannot be written (logged above): raft holds appends it will never see
         * answered, so no orderly close; what was persisted is on disk, the others lead. */
        fprintf(stderr, "kvpool-master: stopped: its raft log cannot be written; start it again once the "
                        "disk is fixed\n");
        _exit(1);
    }
    kvp_master_service_destroy(&svc);
    close(lock_fd);
    return rc == KVP_OK ? 0 : 1;
}
