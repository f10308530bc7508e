/*
 * bench_kernel.c — kvpool-bench baseline-kernel: what a kernel crossing costs on this machine.
 *
 * Two figures, both CPU time (getrusage of the process, user + system), not wall time:
 *  - syscall_us: one trivial system call (getppid, never cached by libc), over --count calls;
 *  - wakeup_us: one thread wake-up: two threads ping-pong a token over two eventfds. A round
 *    trip is 4 system calls (each side writes the other's eventfd and blocks reading its own)
 *    and 2 wake-ups, so wakeup_us = (CPU per round trip - 4 x syscall_us) / 2. Measured twice:
 *    with the threads free to run on two CPUs (the woken thread mostly finds an idle CPU; what
 *    the idle CPU spends waking up is not counted) and pinned to one CPU (every wake-up is a
 *    context switch on a busy CPU, as when a benchmark saturates the machine: switch_us).
 * scripts/bench.sh multiplies them by the system calls and context switches that perf counts
 * per key in kvpool's and redis's 4 KiB runs (docs/bench.md, "What a kernel crossing costs").
 * On bare metal a system call costs about 0.1 us; on this VM about 1.1 us.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <sched.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tools/bench/bench_internal.h"

struct pingpong {
    int in, out;   /* eventfds: this side blocks on `in`, wakes the other through `out` */
    uint64_t rounds;
    int err;
};

/* The ping-pong of `rounds` round trips; *rt_us = process CPU per round trip. 0 or -1. */
static int pingpong_run(uint64_t rounds, bool one_cpu, double *rt_us);

static double cpu_us(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* The passive side: wait for the token, hand it back. */
static void *pong_main(void *arg)
{
    struct pingpong *p = arg;
    uint64_t v = 1;
    for (uint64_t i = 0; i < p->rounds; i++) {
        if (read(p->in, &v, sizeof v) != sizeof v || write(p->out, &v, sizeof v) != sizeof v) {
            p->err = 1;
            break;
        }
    }
    return NULL;
}

int bench_baseline_kernel_main(int argc, char **argv)
{
    uint64_t count = 1000000, rounds = 100000;
    bool json = false;
    static const struct option lo[] = {{"count", 1, 0, 'n'}, {"rounds", 1, 0, 'r'},
                                       {"json", 0, 0, 'j'}, {0, 0, 0, 0}};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'n': count = strtoull(optarg, NULL, 10); break;
        case 'r': rounds = strtoull(optarg, NULL, 10); break;
        case 'j': json = true; break;
        default:
            fprintf(stderr, "usage: kvpool-bench baseline-kernel [--count N] [--rounds N] [--json]\n"
                            "  --count   system calls timed (default 1000000)\n"
                            "  --rounds  thread ping-pong round trips timed (default 100000)\n");
            return 2;
        }
    }
    if (!count || !rounds || count > 100000000 || rounds > 10000000) {
        fprintf(stderr, "kvpool-bench: baseline-kernel: --count must be 1..1e8, --rounds 1..1e7\n");
        return 2;
    }

    double c0 = cpu_us();
    for (uint64_t i = 0; i < count; i++)
        syscall(SYS_getppid);
    double syscall_us = (cpu_us() - c0) / (double)count;

    double rt_us, rt1_us;
    if (pingpong_run(rounds, false, &rt_us) || pingpong_run(rounds, true, &rt1_us))
        return 1;
    double wakeup_us = (rt_us - 4 * syscall_us) / 2, switch_us = (rt1_us - 4 * syscall_us) / 2;
    if (json)
        printf("{\"mode\":\"baseline-kernel\",\"syscalls\":%llu,\"syscall_us\":%.3f,\"rounds\":%llu,"
               "\"round_trip_cpu_us\":%.3f,\"wakeup_us\":%.3f,\"round_trip_one_cpu_us\":%.3f,"
               "\"switch_us\":%.3f}\n",
               (unsigned long long)count, syscall_us, (unsigned long long)rounds, rt_us, wakeup_us,
               rt1_us, switch_us);
    else
        printf("system call %.3f us CPU; thread wake-up %.3f us CPU on two CPUs (round trip %.3f us), "
               "%.3f us as a context switch on one CPU (round trip %.3f us)\n",
               syscall_us, wakeup_us, rt_us, switch_us, rt1_us);
    return 0;
}

static int pingpong_run(uint64_t rounds, bool one_cpu, double *rt_us)
{
    int a = eventfd(0, EFD_CLOEXEC), b = eventfd(0, EFD_CLOEXEC);
    if (a < 0 || b < 0) {
        perror("kvpool-bench: baseline-kernel: eventfd");
        if (a >= 0)
            close(a);
        if (b >= 0)
            close(b);
        return -1;
    }
    cpu_set_t old, one;
    bool pinned = false;
    if (one_cpu && !pthread_getaffinity_np(pthread_self(), sizeof old, &old)) {
        /* Pin this thread (and so the thread it creates, which inherits the mask) to the
         * first CPU it may use. */
        CPU_ZERO(&one);
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &old)) {
                CPU_SET(c, &one);
                break;
            }
        pinned = !pthread_setaffinity_np(pthread_self(), sizeof one, &one);
    }
    struct pingpong pong = {.in = b, .out = a, .rounds = rounds};
    pthread_t th;
    double c0 = cpu_us();
    int err = 0;
    if (pthread_create(&th, NULL, pong_main, &pong)) {
        fprintf(stderr, "kvpool-bench: baseline-kernel: pthread_create failed\n");
        err = 1;
    } else {
        uint64_t v = 1;
        for (uint64_t i = 0; i < rounds && !err; i++)
            err = write(b, &v, sizeof v) != sizeof v || read(a, &v, sizeof v) != sizeof v;
        if (err) /* the other side may be blocked in read(), a cancellation point */
            pthread_cancel(th);
        pthread_join(th, NULL);
    }
    *rt_us = (cpu_us() - c0) / (double)rounds;
    if (pinned)
        pthread_setaffinity_np(pthread_self(), sizeof old, &old);
    close(a);
    close(b);
    if (err || pong.err) {
        fprintf(stderr, "kvpool-bench: baseline-kernel: eventfd ping-pong failed\n");
        return -1;
    }
    return 0;
}
