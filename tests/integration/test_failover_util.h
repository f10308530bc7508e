/*
 * test_failover_util.h — helpers of the leader-failover write tests (test_failover_write.c,
 * test_failover_onecommit.c): a real local cluster (test_client_util.h) started with retries,
 * its status document, the leader's SIGKILL, exact reads into poisoned buffers, and a forked
 * writer whose WRITE frames are held late (transfer fault injection).
 * Header-only (static functions): each test binary is one file.
 */
#ifndef KVP_TEST_FAILOVER_UTIL_H
#define KVP_TEST_FAILOVER_UTIL_H

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <time.h>

#include "actors/transfer/fault.h"
#include "actors/transfer/transfer.h"
#include "tests/integration/test_client_util.h"

static inline void tf_sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* `kvpoolctl cluster up` with n_segs segments of seg_size, up to 4 attempts (a port taken
 * between the probe and the bind fails one); the settings come from the environment. 0 or -1. */
static inline int tf_cluster_start(struct tc_cluster *c, int n_segs, const char *seg_size)
{
    for (int attempt = 0; attempt < 4; attempt++) {
        if (tc_cluster_up(c, n_segs, seg_size) == 0)
            return 0;
        fprintf(stderr, "kvpoolctl cluster up failed (dir %s), attempt %d\n", c->dir, attempt + 1);
        tc_cluster_down(c);
    }
    return -1;
}

/* `kvpoolctl --cluster FILE --json status`, parsed; NULL on failure. */
static inline json_t *tf_status(const struct tc_cluster *c)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s --cluster %s --json --timeout 3000 status 2>/dev/null", c->ctl, c->file);
    FILE *p = popen(cmd, "r");
    if (!p)
        return NULL;
    json_error_t e;
    json_t *j = json_loadf(p, 0, &e);
    pclose(p);
    return j;
}

/* How many lines of the cluster's master logs contain `what` (a grep pattern without quotes). */
static inline int tf_log_count(const struct tc_cluster *c, const char *what)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cat %s/master-*.log 2>/dev/null | grep -c '%s'", c->dir, what);
    FILE *p = popen(cmd, "r");
    int n = 0;
    if (p) {
        if (fscanf(p, "%d", &n) != 1)
            n = 0;
        pclose(p);
    }
    return n;
}

static inline long long tf_jget(json_t *o, const char *k)
{
    return (long long)json_integer_value(json_object_get(o, k));
}

/* SIGKILL the leader; returns its member id. */
static inline int tf_kill_leader(const struct tc_cluster *c)
{
    json_t *st = tf_status(c);
    assert_non_null(st);
    int id = (int)json_integer_value(json_object_get(st, "leader_id"));
    assert_true(id > 0);
    const char *addr = json_string_value(json_object_get(st, "leader_address"));
    assert_non_null(addr);
    int pid = tc_master_pid(c, strncmp(addr, "tcp://", 6) == 0 ? addr + 6 : addr);
    json_decref(st);
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    return id;
}

/* Read key (len bytes) into a poisoned buffer: 1 exact bytes, 0 NOT_FOUND; anything else fails
 * the test. */
static inline int tf_read_exact(kvp_client *c, const char *key, uint8_t *buf, size_t len)
{
    memset(buf, TC_POISON, len);
    int64_t n = kvp_get(c, key, buf, len, 0);
    if (n == KVP_ERR_NOT_FOUND)
        return 0;
    if (n != (int64_t)len)
        fail_msg("get %s: %s", key, n < 0 ? kvp_errname((int)n) : "short read");
    if (!tc_check(key, buf, len))
        fail_msg("get %s: other bytes (C1)", key);
    return 1;
}

/* The write end of the parent's pipe: each child writes one byte once the master answered its
 * call (tc_ready_watch_start), so the parent kills the old leader only after every child's call
 * was answered by it. Before, the parent slept 300 ms and assumed it; a child slow to start on
 * a loaded host met the new leader instead. Set by the parent before fork, -1 after. */
static int tf_ready_w = -1;

/* Child: one put of KEY (len bytes) with its WRITEs late by late_ms, timeout timeout_ms,
 * soft-pinned when pin (not evicted before the parent reads it). Exit code 0 when the put's
 * result is `want` (KVP_OK or KVP_ERR_TIMEOUT) and no late WRITE landed after a timeout. */
static inline int tf_child_writer(const struct tc_cluster *cl, const char *key, size_t len, unsigned late_ms,
                                  unsigned timeout_ms, int want, bool pin)
{
    struct kvp_xfer_fault_rule rule = {.action = KVP_FAULT_LATE, .transport = KVP_FAULT_TCP,
                                       .op = KVP_XFER_WRITE, .ms = late_ms};
    if (kvp_xfer_fault_add(&rule) != KVP_OK)
        return 10;
    kvp_client *c = tc_open(cl, timeout_ms);
    uint8_t *buf = malloc(len);
    if (!c || !buf)
        return 11;
    tc_ready_watch_start(tf_ready_w);
    tc_fill(key, buf, len);
    kvp_put_opts opts = {.soft_pin = pin};
    int rc = kvp_put(c, key, buf, len, pin ? &opts : NULL);
    if (kvp_xfer_fault_quiesce(15000) != KVP_OK) /* every late frame has been answered */
        return 12;
    struct kvp_xfer_fault_counts fc;
    kvp_xfer_fault_counts(&fc);
    fprintf(stderr, "writer %s: put %s (want %s); late frames sent %llu, refused %llu, accepted %llu\n", key,
            kvp_errname(rc), kvp_errname(want), (unsigned long long)fc.late_sent,
            (unsigned long long)fc.late_refused, (unsigned long long)fc.late_accepted);
    tc_close(&c);
    free(buf);
    if (rc != want)
        return 13;
    if (want != KVP_OK && fc.late_accepted != 0)
        return 14; /* a timed-out put's bytes landed after its deadline */
    return 0;
}

/* The exit code of child pid (waited for), 100 when it did not exit normally. */
static inline int tf_wait_child(pid_t pid)
{
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

#endif
