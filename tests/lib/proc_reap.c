/*
 * proc_reap.c — kill and reap the children a test tracked (proc_reap.h).
 */
#include "tests/lib/proc_reap.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_TRACKED 64

/* Test-process state: tests track and kill from their main thread only (fork, setup and
 * teardown run there), so no lock. */
static pid_t tracked[MAX_TRACKED];
static int n_tracked;
static pid_t owner; /* the process that tracked; 0 before the first call */

static void kill_at_exit(void)
{
    (void)kvp_test_children_kill();
}

void kvp_test_child_track(pid_t pid)
{
    if (pid <= 0)
        return;
    if (owner != getpid()) { /* first call here (or in a forked child that tracks its own) */
        owner = getpid();
        n_tracked = 0;
        atexit(kill_at_exit);
    }
    for (int i = 0; i < n_tracked; i++)
        if (tracked[i] == pid)
            return;
    if (n_tracked < MAX_TRACKED) {
        tracked[n_tracked++] = pid;
        return;
    }
    fprintf(stderr, "proc_reap: more than %d children tracked; pid %d is not\n", MAX_TRACKED, (int)pid);
}

int kvp_test_children_kill(void)
{
    if (owner != getpid())
        return 0;
    int killed = 0;
    for (int i = 0; i < n_tracked; i++) {
        pid_t p = tracked[i];
        int st;
        pid_t r = waitpid(p, &st, WNOHANG);
        if (r != 0)
            continue; /* reaped now (it had exited) or before (ECHILD): nothing to signal */
        if (kill(p, SIGKILL) == 0) {
            killed++;
            fprintf(stderr, "proc_reap: child %d still running at teardown: killed\n", (int)p);
        }
        while (waitpid(p, &st, 0) < 0 && errno == EINTR) {
        }
    }
    n_tracked = 0;
    return killed;
}

int kvp_test_children_teardown(void **state)
{
    (void)state;
    (void)kvp_test_children_kill();
    return 0;
}
