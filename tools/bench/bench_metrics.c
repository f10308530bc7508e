/*
 * bench_metrics.c — `kvpool-bench-metrics`: the cost of the client's metrics hooks alone
 * (issue 24), without any transfer: T threads call the hooks of one client with metrics on
 * (its endpoint really started on a free loopback port), as a batch get of K keys does.
 *
 *   kvpool-bench-metrics [KEYS_PER_CALL] [THREADS] [CALLS_PER_THREAD]   (defaults 32 4 500000)
 *
 * Prints nanoseconds per call per thread (wall). Figures, never asserted (docs/operations.md
 * "Cost on the hot path").
 */
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "actors/client/client_metrics.h"
#include "actors/client/client_state.h"
#include "kvpool.h"

static struct kvp_client client;
static int keys_per_call = 32;
static long calls = 500000;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void *worker(void *arg)
{
    int64_t res[1024];
    for (int i = 0; i < 1024; i++)
        res[i] = 4096;
    for (long i = 0; i < calls; i++) {
        uint64_t t0 = kvp_client_metrics_t0(&client);
        kvp_client_metrics_get(&client, KVP_OK, (size_t)keys_per_call, res, t0);
    }
    return arg;
}

static uint32_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof a;
    uint32_t p = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &sl) == 0)
        p = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return p;
}

int main(int argc, char **argv)
{
    int threads = 4;
    if (argc > 1)
        keys_per_call = atoi(argv[1]);
    if (argc > 2)
        threads = atoi(argv[2]);
    if (argc > 3)
        calls = atol(argv[3]);
    if (keys_per_call < 1 || keys_per_call > 1024 || threads < 1 || threads > 64 || calls < 1) {
        fprintf(stderr, "usage: kvpool-bench-metrics [KEYS_PER_CALL 1..1024] [THREADS 1..64] [CALLS_PER_THREAD]\n");
        return 2;
    }
    snprintf(client.name, sizeof client.name, "bench-metrics");
    snprintf(client.cfg.local_hostname, sizeof client.cfg.local_hostname, "127.0.0.1");
    client.cfg.metrics_port = free_port();
    if (kvp_client_metrics_start(&client) != KVP_OK) {
        fprintf(stderr, "kvpool-bench-metrics: cannot start the metrics endpoint\n");
        return 1;
    }
    pthread_t th[64];
    uint64_t t0 = now_ns();
    for (int i = 0; i < threads; i++)
        pthread_create(&th[i], NULL, worker, NULL);
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    double ns = (double)(now_ns() - t0) / (double)calls;
    printf("metrics hooks: %d keys per call, %d threads: %.0f ns per call per thread (wall)\n", keys_per_call,
           threads, ns);
    kvp_client_metrics_stop(&client);
    return 0;
}
