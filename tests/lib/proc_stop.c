/*
 * proc_stop.c — SIGSTOP a process and wait until all of its threads are stopped (proc_stop.h).
 */
#include "tests/lib/proc_stop.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* State letter of /proc/PID/task/TID/stat, or 0 when it cannot be read. */
static char task_state(pid_t pid, const char *tid)
{
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/task/%s/stat", (int)pid, tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char buf[512];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')'); /* the command name may hold spaces or ')' */
    return rp && rp[1] == ' ' ? rp[2] : 0;
}

bool kvp_test_process_stopped(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return false;
    bool all = true, any = false;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char st = task_state(pid, e->d_name);
        if (st == 0)
            continue; /* the thread exited between readdir and open */
        any = true;
        if (st != 'T' && st != 't')
            all = false;
    }
    closedir(d);
    return any && all;
}

bool kvp_test_stop_process(pid_t pid, unsigned timeout_ms)
{
    if (pid <= 0 || kill(pid, SIGSTOP) != 0)
        return false;
    for (unsigned waited = 0;; waited++) {
        if (kvp_test_process_stopped(pid))
            return true;
        if (waited >= timeout_ms)
            return false;
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}
