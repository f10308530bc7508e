/*
 * cluster_guard.c — the detached guard that kills a dead test's daemons (cluster_guard.h).
 *
 * The guard runs in a child forked from a test process that may have threads (clients, czmq) and
 * sanitizer runtimes: after the fork it uses only system calls and fixed buffers (no malloc, no
 * stdio), and it never returns to the test's code.
 */
#define _GNU_SOURCE
#include "tests/lib/cluster_guard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GUARD_ENV "KVP_TEST_OWNER"
/* The most rounds of "find marked processes, SIGKILL them" the guard makes (100 ms apart): a
 * kvpoolctl killed in the middle of `up` may have forked one more daemon meanwhile. */
#define GUARD_MAX_ROUNDS 50

/* Start time of pid in clock ticks since boot (field 22 of /proc/PID/stat), or 0. */
static unsigned long long start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name (field 2) may hold spaces */
    if (!p)
        return 0;
    p++;
    /* fields 3.. follow; the start time is field 22, the 20th after the ')' */
    for (int field = 3; field < 22 && *p; field++) {
        while (*p == ' ')
            p++;
        while (*p && *p != ' ')
            p++;
    }
    return strtoull(p, NULL, 10);
}

/* --- guard side: system calls and static buffers only (see the top of the file) --- */

static char g_environ[256 * 1024]; /* one /proc/PID/environ, in the guard process only */

/* Does /proc/<name>/environ hold the entry `mark` ("KVP_TEST_OWNER=..." with its NUL)? */
static int marked(const char *name, const char *mark, size_t mark_len)
{
    char path[64] = "/proc/";
    size_t k = strlen(path), nl = strlen(name);
    if (k + nl + sizeof "/environ" > sizeof path)
        return 0;
    memcpy(path + k, name, nl);
    memcpy(path + k + nl, "/environ", sizeof "/environ");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, g_environ + len, sizeof g_environ - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len == sizeof g_environ - 1)
            break;
    }
    close(fd);
    /* entries are NUL-terminated: compare each entry whole */
    for (size_t i = 0; i + mark_len <= len;) {
        if (memcmp(g_environ + i, mark, mark_len) == 0)
            return 1;
        const char *nul = memchr(g_environ + i, '\0', len - i);
        if (!nul)
            break;
        i = (size_t)(nul - g_environ) + 1;
    }
    return 0;
}

/* SIGKILL every process (but this one) whose environment carries mark; returns how many. */
static int kill_marked(const char *mark, size_t mark_len)
{
    int killed = 0;
    int dfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return 0;
    char buf[8192] __attribute__((aligned(8)));
    pid_t self = getpid();
    for (;;) {
        long n = syscall(SYS_getdents64, dfd, buf, sizeof buf);
        if (n <= 0)
            break;
        for (long off = 0; off < n;) {
            struct dirent64 *d = (struct dirent64 *)(buf + off);
            off += d->d_reclen;
            if (d->d_name[0] < '1' || d->d_name[0] > '9')
                continue;
            pid_t pid = (pid_t)strtol(d->d_name, NULL, 10);
            if (pid == self || !marked(d->d_name, mark, mark_len))
                continue;
            if (kill(pid, SIGKILL) == 0)
                killed++;
        }
    }
    close(dfd);
    return killed;
}

/* The guard's life: wait for the owner to be gone, then kill what it left. Never returns. */
static void guard_run(int pidfd, const char *mark)
{
    size_t mark_len = strlen(mark) + 1; /* with the entry's NUL */
    for (;;) {
        struct pollfd p = {.fd = pidfd, .events = POLLIN};
        int r = poll(&p, 1, -1);
        if (r > 0)
            break;
        if (r < 0 && errno != EINTR)
            break; /* cannot wait: act now rather than never */
    }
    for (int round = 0; round < GUARD_MAX_ROUNDS; round++) {
        if (kill_marked(mark, mark_len) == 0)
            break;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    _exit(0);
}

int kvp_test_guard_start(pid_t owner, char *token, size_t cap)
{
    unsigned long long st = start_time(owner);
    if (owner <= 0 || st == 0) {
        fprintf(stderr, "cluster_guard: no process %d to guard\n", (int)owner);
        return -1;
    }
    int n = snprintf(token, cap, "%d.%llu", (int)owner, st);
    if (n < 0 || (size_t)n >= cap) {
        fprintf(stderr, "cluster_guard: token buffer of %zu bytes is too small\n", cap);
        return -1;
    }
    char mark[64];
    snprintf(mark, sizeof mark, "%s=%s", GUARD_ENV, token);
    int pidfd = (int)syscall(SYS_pidfd_open, owner, 0);
    if (pidfd < 0) {
        fprintf(stderr, "cluster_guard: pidfd_open(%d): %s\n", (int)owner, strerror(errno));
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t mid = fork();
    if (mid < 0) {
        fprintf(stderr, "cluster_guard: fork: %s\n", strerror(errno));
        close(pidfd);
        return -1;
    }
    if (mid == 0) {
        /* Its own session, then a grandchild that init adopts: ctest's timeout kill walks the
         * test's children by parent pid and would otherwise take the guard down first. */
        setsid();
        pid_t g = fork();
        if (g != 0)
            _exit(g < 0 ? 1 : 0);
        /* Its name tells tests/lib/guard/leftovers.sh that it ends with its owner. */
        prctl(PR_SET_NAME, "kvp-guard", 0, 0, 0);
        sigset_t all;
        sigfillset(&all);
        sigprocmask(SIG_UNBLOCK, &all, NULL);
        signal(SIGHUP, SIG_IGN);
        signal(SIGPIPE, SIG_IGN);
        /* Nothing of the test but the pidfd: an inherited output pipe would keep ctest (or a
         * shell's $(...)) waiting for the guard's whole life. */
        int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (nul >= 0) {
            dup2(nul, 0);
            dup2(nul, 1);
            dup2(nul, 2);
        }
        if (dup2(pidfd, 3) != 3)
            _exit(1);
        close_range(4, ~0u, 0);
        guard_run(3, mark);
    }
    close(pidfd);
    int wst;
    while (waitpid(mid, &wst, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
        fprintf(stderr, "cluster_guard: the guard for %d did not start\n", (int)owner);
        return -1;
    }
    return 0;
}

int kvp_test_cluster_guard(void)
{
    /* Per process: a forked child that starts a cluster of its own gets a guard of its own. */
    static pid_t guarded;
    if (guarded == getpid())
        return 0;
    char token[32];
    if (kvp_test_guard_start(getpid(), token, sizeof token) != 0)
        return -1;
    if (setenv(GUARD_ENV, token, 1) != 0) {
        fprintf(stderr, "cluster_guard: setenv: %s\n", strerror(errno));
        return -1;
    }
    guarded = getpid();
    return 0;
}
