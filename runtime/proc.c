/* proc.c — waiting for a killed process to be gone, start-up retries, the data-dir lock (proc.h). */
#define _GNU_SOURCE
#include "runtime/proc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

/* Without pidfd_open: the leader is a zombie ('Z' or 'X') and /proc/PID/task lists no thread
 * but the leader. Either file missing means the process is gone. */
static bool gone_by_proc(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    if (!rp || (rp[2] != 'Z' && rp[2] != 'X'))
        return false;
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return true;
    int tasks = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            tasks++;
    closedir(d);
    return tasks <= 1;
}

/* -1: no pidfd (ENOSYS, EPERM): use /proc; -2: no such process; else the pidfd. */
static int open_pidfd(pid_t pid)
{
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd >= 0)
        return fd;
    return errno == ESRCH ? -2 : -1;
}

bool kvp_proc_gone(pid_t pid)
{
    if (pid <= 0)
        return true;
    int fd = open_pidfd(pid);
    if (fd == -2)
        return true;
    if (fd == -1)
        return gone_by_proc(pid);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, 0);
    close(fd);
    return r > 0;
}

int kvp_proc_wait_gone(pid_t pid, uint32_t timeout_ms)
{
    if (pid <= 0)
        return KVP_OK;
    uint64_t deadline = kvp_clock_now_ms() + timeout_ms;
    int fd = open_pidfd(pid);
    bool gone = fd == -2;
    while (!gone) {
        uint64_t now = kvp_clock_now_ms();
        uint32_t left = now < deadline ? (uint32_t)(deadline - now) : 0;
        if (fd >= 0) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            int r = poll(&p, 1, (int)left);
            if (r > 0)
                gone = true;
            else if (r < 0 && errno != EINTR)
                break;
        } else {
            gone = gone_by_proc(pid);
            if (!gone)
                kvp_clock_sleep_ms(left < 5 ? left : 5); /* no pidfd on this kernel: poll /proc */
        }
        if (!gone && kvp_clock_now_ms() >= deadline)
            break;
    }
    if (fd >= 0)
        close(fd);
    if (!gone)
        return KVP_ERR_TIMEOUT;
    /* Our own child: reap it, so it does not stay a zombie (not an error if it is not ours). */
    waitpid(pid, NULL, WNOHANG);
    return KVP_OK;
}

int kvp_retry_start(const char *actor, const char *what, uint32_t budget_ms, kvp_retry_fn attempt, void *arg)
{
    uint64_t t0 = kvp_clock_now_ms();
    uint32_t backoff = 25;
    for (unsigned tries = 1;; tries++) {
        char why[256] = "";
        int rc = attempt(arg, why, sizeof why);
        if (rc != KVP_ERR_BUSY) {
            if (rc != KVP_OK)
                kvp_log_error(actor, "%s: %s", what, why[0] ? why : kvp_strerror(rc));
            else if (tries > 1)
                kvp_log_info(actor, "%s: done at try %u, after %llu ms", what, tries,
                             (unsigned long long)(kvp_clock_now_ms() - t0));
            return rc;
        }
        uint64_t spent = kvp_clock_now_ms() - t0;
        if (spent >= budget_ms) {
            kvp_log_error(actor, "%s: %s; gave up after %u tries in %llu ms (bind_retry_ms %u)", what,
                          why[0] ? why : "in use", tries, (unsigned long long)spent, budget_ms);
            return rc;
        }
        uint32_t left = (uint32_t)(budget_ms - spent);
        uint32_t wait = backoff < left ? backoff : left;
        kvp_log_warn(actor, "%s: %s; retry %u in %u ms (%u ms of bind_retry_ms left)", what,
                     why[0] ? why : "in use", tries + 1, wait, left);
        kvp_clock_sleep_ms(wait);
        backoff = backoff >= 250 ? 500 : backoff * 2;
    }
}

/* Split "host:port" or "[v6]:port". */
static int split_hostport(const char *hp, char *host, size_t hcap, char *port, size_t pcap)
{
    const char *colon = strrchr(hp, ':');
    if (!colon || colon == hp || !colon[1])
        return -1;
    const char *h = hp;
    size_t hl = (size_t)(colon - hp);
    if (h[0] == '[') {
        if (hl < 2 || h[hl - 1] != ']')
            return -1;
        h++;
        hl -= 2;
    }
    if (hl >= hcap || strlen(colon + 1) >= pcap)
        return -1;
    memcpy(host, h, hl);
    host[hl] = '\0';
    snprintf(port, pcap, "%s", colon + 1);
    return 0;
}

int kvp_probe_listen(const char *hostport, char *why, size_t why_cap)
{
    char host[256], port[16];
    if (!hostport || split_hostport(hostport, host, sizeof host, port, sizeof port) != 0) {
        snprintf(why, why_cap, "not host:port: '%s'", hostport ? hostport : "(null)");
        return KVP_ERR_INVALID;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(host[0] ? host : NULL, port, &hints, &ai);
    if (g != 0) {
        snprintf(why, why_cap, "cannot resolve '%s': %s", host, gai_strerror(g));
        return KVP_ERR_INVALID;
    }
    int rc = KVP_ERR_IO;
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        snprintf(why, why_cap, "socket: %s", strerror(errno));
    } else {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1) == 0) {
            rc = KVP_OK;
        } else {
            rc = errno == EADDRINUSE ? KVP_ERR_BUSY : KVP_ERR_IO;
            snprintf(why, why_cap, "%s", strerror(errno));
        }
        close(fd);
    }
    freeaddrinfo(ai);
    return rc;
}

struct lock_try {
    int fd;
    const char *path;
};

static int lock_attempt(void *arg, char *why, size_t why_cap)
{
    struct lock_try *t = arg;
    if (flock(t->fd, LOCK_EX | LOCK_NB) == 0)
        return KVP_OK;
    if (errno != EWOULDBLOCK && errno != EINTR) {
        snprintf(why, why_cap, "flock %s: %s", t->path, strerror(errno));
        return KVP_ERR_IO;
    }
    char buf[32] = "";
    ssize_t n = pread(t->fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    snprintf(why, why_cap, "in use by another process%s%s", buf[0] ? " (pid " : "", buf[0] ? buf : "");
    if (buf[0])
        strncat(why, ")", why_cap - strlen(why) - 1);
    return KVP_ERR_BUSY;
}

int kvp_datadir_lock(const char *actor, const char *dir, uint32_t budget_ms, int *fd_out)
{
    if (!dir || !dir[0] || !fd_out) {
        kvp_log_error(actor, "data dir lock: no directory given");
        return KVP_ERR_INVALID;
    }
    char path[1100];
    if (snprintf(path, sizeof path, "%s/LOCK", dir) >= (int)sizeof path) {
        kvp_log_error(actor, "data dir lock: path too long: %s", dir);
        return KVP_ERR_INVALID;
    }
    /* O_CREAT without O_TRUNC: a lock file that exists is opened, not changed. */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        kvp_log_error(actor, "data dir lock: open %s: %s", path, strerror(errno));
        return KVP_ERR_IO;
    }
    struct lock_try t = {.fd = fd, .path = path};
    char what[1200];
    snprintf(what, sizeof what, "lock data dir %s", dir);
    int rc = kvp_retry_start(actor, what, budget_ms, lock_attempt, &t);
    if (rc != KVP_OK) {
        close(fd);
        return rc;
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
        kvp_log_warn(actor, "data dir lock: cannot record pid in %s: %s", path, strerror(errno));
    *fd_out = fd;
    return KVP_OK;
}
