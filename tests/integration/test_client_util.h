/*
 * test_client_util.h — helpers of the client integration tests (test_client_cluster*.c):
 * start/stop a real local cluster with `kvpoolctl cluster up/down`, read cluster.json,
 * self-checking payloads derived from the key, poisoned read buffers.
 * Header-only (static functions): each test binary is one file.
 */
#ifndef KVP_TEST_CLIENT_UTIL_H
#define KVP_TEST_CLIENT_UTIL_H

#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "actors/client/api_config.h"
#include "actors/transfer/fault.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "tests/lib/cluster_guard.h"

#define TC_POISON 0xA5

struct tc_cluster {
    char dir[256];
    char file[300]; /* DIR/cluster.json */
    char ctl[512];  /* path of kvpoolctl */
    bool up;
};

/* Run argv (NULL-terminated), wait; returns the exit status or -1. */
static inline int tc_run(char *const argv[])
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* `kvpoolctl cluster up --dir <tmp> --masters 3 --segments N --segment-size SIZE`: kvpoolctl
 * picks free ports itself and retries on new ones if one is taken meanwhile (a pid-derived port
 * base collided with other tests and ephemeral ports on the shared machine).
 * The environment (KVPOOL_*) is inherited by the processes it starts. */
static inline int tc_cluster_up(struct tc_cluster *c, int segments, const char *segment_size)
{
    memset(c, 0, sizeof *c);
    const char *bd = getenv("KVP_BUILD_DIR");
    snprintf(c->ctl, sizeof c->ctl, "%s/tools/kvpoolctl", bd ? bd : ".");
    snprintf(c->dir, sizeof c->dir, "/tmp/kvp-client-test-XXXXXX");
    if (!mkdtemp(c->dir))
        return -1;
    snprintf(c->file, sizeof c->file, "%s/cluster.json", c->dir);
    char segs[16];
    snprintf(segs, sizeof segs, "%d", segments);
    (void)kvp_test_cluster_guard(); /* its daemons die with this process, however it ends */
    char *argv[] = {c->ctl, "cluster", "up", "--dir", c->dir, "--masters", "3", "--segments", segs,
                    "--segment-size", (char *)segment_size, NULL};
    int rc = tc_run(argv);
    c->up = true; /* even on failure: down kills whatever started */
    return rc;
}

/* The clients tc_open opened and tc_close did not close yet. A failed cmocka assert jumps out of
 * a test past its kvp_client_close; a client still open at exit made the process abort in czmq's
 * exit handler ('dangling PAIR socket', then zsock_set_sndtimeo: Assertion rc == 0) or hang until
 * the ctest timeout. tc_cluster_down closes them, so a failing test fails cleanly. */
#define TC_MAX_OPEN 16
static inline kvp_client **tc_open_slots(void)
{
    static kvp_client *slots[TC_MAX_OPEN];
    return slots;
}

/* Close every client of tc_open still open (after a failed assert skipped the test's close). */
static inline void tc_close_all(void)
{
    kvp_client **slots = tc_open_slots();
    for (int i = 0; i < TC_MAX_OPEN; i++)
        kvp_client_close(&slots[i]);
}

static inline void tc_cluster_down(struct tc_cluster *c)
{
    tc_close_all(); /* before the masters go: a client's close is quick then */
    if (!c->up)
        return;
    char *argv[] = {c->ctl, "cluster", "down", "--dir", c->dir, NULL};
    tc_run(argv);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", c->dir);
    c->up = false;
}

/* pid and name of segment i (0-based) from cluster.json; returns pid or -1. */
static inline int tc_segment(const struct tc_cluster *c, size_t i, char *name, size_t cap)
{
    json_error_t e;
    json_t *j = json_load_file(c->file, 0, &e);
    if (!j)
        return -1;
    json_t *s = json_array_get(json_object_get(j, "segments"), i);
    int pid = -1;
    if (s) {
        pid = (int)json_integer_value(json_object_get(s, "pid"));
        const char *n = json_string_value(json_object_get(s, "name"));
        snprintf(name, cap, "%s", n ? n : "");
    }
    json_decref(j);
    return pid;
}

/* pid of the master whose control address is addr ("host:port"), or -1. */
static inline int tc_master_pid(const struct tc_cluster *c, const char *addr)
{
    json_error_t e;
    json_t *j = json_load_file(c->file, 0, &e);
    if (!j)
        return -1;
    int pid = -1;
    json_t *ms = json_object_get(j, "masters");
    for (size_t i = 0; i < json_array_size(ms); i++) {
        json_t *m = json_array_get(ms, i);
        const char *a = json_string_value(json_object_get(m, "address"));
        if (a && strncmp(a, "tcp://", 6) == 0)
            a += 6;
        if (a && strcmp(a, addr) == 0)
            pid = (int)json_integer_value(json_object_get(m, "pid"));
    }
    json_decref(j);
    return pid;
}

static inline kvp_client *tc_open(const struct tc_cluster *c, uint32_t timeout_ms)
{
    kvp_config *cfg = NULL;
    if (kvp_config_new(&cfg) != KVP_OK)
        return NULL;
    char t[32];
    snprintf(t, sizeof t, "%ums", timeout_ms);
    kvp_client *cl = NULL;
    if (kvp_config_set(cfg, "cluster_file", c->file) != KVP_OK ||
        kvp_config_set(cfg, "transfer_timeout", t) != KVP_OK || kvp_client_open(cfg, &cl) != KVP_OK)
        cl = NULL;
    kvp_config_destroy(&cfg);
    kvp_client **slots = tc_open_slots();
    for (int i = 0; cl && i < TC_MAX_OPEN; i++)
        if (!slots[i]) {
            slots[i] = cl;
            break;
        }
    return cl;
}

/* kvp_client_close for a client of tc_open (any other client is just closed). */
static inline void tc_close(kvp_client **cp)
{
    kvp_client **slots = tc_open_slots();
    for (int i = 0; cp && *cp && i < TC_MAX_OPEN; i++)
        if (slots[i] == *cp)
            slots[i] = NULL;
    kvp_client_close(cp);
}


static inline void tc_fill(const char *key, uint8_t *buf, size_t len)
{
    uint64_t x = XXH3_64bits(key, strlen(key)) | 1;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(buf + i, &x, 8);
    }
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    for (; i < len; i++)
        buf[i] = (uint8_t)(x >> (8 * (i & 7)));
}

/* true when buf holds exactly the payload of key (len bytes) */
static inline bool tc_check(const char *key, const uint8_t *buf, size_t len)
{
    uint64_t x = XXH3_64bits(key, strlen(key)) | 1;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (memcmp(buf + i, &x, 8) != 0)
            return false;
    }
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    for (; i < len; i++)
        if (buf[i] != (uint8_t)(x >> (8 * (i & 7))))
            return false;
    return true;
}

static inline bool tc_all_poison(const uint8_t *buf, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (buf[i] != TC_POISON)
            return false;
    return true;
}

/*
 * "The master answered my call" from a forked child to its parent, without a fixed sleep: a child
 * whose transfers are held by a fault rule (LATE, DROP, ...) calls tc_ready_watch_start(fd) before
 * its call; a thread writes one byte to fd once the rule hit a piece of this process (the master's
 * answer came, the transfer was posted). The parent reads them with tc_ready_wait.
 */
static inline void *tc_ready_watch(void *arg)
{
    int fd = (int)(intptr_t)arg;
    struct kvp_xfer_fault_counts fc;
    for (int i = 0; i < 60000; i++) { /* 60 s at most */
        kvp_xfer_fault_counts(&fc);
        if (fc.hits > 0) {
            uint8_t one = 1;
            (void)!write(fd, &one, 1);
            break;
        }
        usleep(1000);
    }
    return NULL;
}

static inline void tc_ready_watch_start(int fd)
{
    pthread_t t;
    if (fd >= 0 && pthread_create(&t, NULL, tc_ready_watch, (void *)(intptr_t)fd) == 0)
        pthread_detach(t);
}

/* Read n bytes from fd (timeout_ms at most, or until every writer closed it); how many came. */
static inline int tc_ready_wait(int fd, int n, uint32_t timeout_ms)
{
    int got = 0;
    for (uint64_t t0 = kvp_clock_now_ms(); got < n && kvp_clock_now_ms() - t0 < timeout_ms;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        uint8_t b;
        ssize_t r = read(fd, &b, 1);
        if (r == 0)
            break; /* every child closed it: one failed before its call was answered */
        if (r == 1)
            got++;
    }
    return got;
}

#endif
