/*
 * bench_cpu.c — CPU time per operation of every process of a local cluster and of the bench
 * itself, over one timed phase. On a shared 2-core machine the bench, the masters and the
 * segments compete for the same cores, so ops/s alone cannot say which process a change made
 * cheaper; CPU µs per op can. Process run time is the sum of /proc/PID/task/TID/schedstat
 * (first field: ns on CPU) over the process's threads; the bench's own is getrusage(). The
 * processes come from cluster.json (`kvpoolctl cluster up`); without --cluster only the bench
 * is measured.
 */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "tools/bench/bench_internal.h"

static uint64_t proc_cpu_ns(int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    if (d == NULL)
        return 0;
    uint64_t sum = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char p[128];
        snprintf(p, sizeof p, "/proc/%d/task/%s/schedstat", pid, e->d_name);
        FILE *f = fopen(p, "r");
        unsigned long long ns = 0;
        if (f != NULL) {
            if (fscanf(f, "%llu", &ns) == 1)
                sum += ns;
            fclose(f);
        }
    }
    closedir(d);
    return sum;
}

static uint64_t self_cpu_ns(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
           ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
}

static void add_procs(struct bench_cpu *bc, json_t *arr)
{
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        json_t *pid = json_object_get(v, "pid"), *name = json_object_get(v, "name");
        if (!json_is_integer(pid) || json_integer_value(pid) <= 0 || bc->n >= BENCH_CPU_MAX)
            continue;
        bc->pid[bc->n] = (int)json_integer_value(pid);
        snprintf(bc->name[bc->n], sizeof bc->name[0], "%s", json_is_string(name) ? json_string_value(name) : "?");
        bc->n++;
    }
}

void bench_cpu_begin(struct bench_cpu *bc, const char *cluster_file)
{
    memset(bc, 0, sizeof *bc);
    if (cluster_file != NULL) {
        json_t *doc = json_load_file(cluster_file, 0, NULL);
        if (doc != NULL) {
            add_procs(bc, json_object_get(doc, "masters"));
            add_procs(bc, json_object_get(doc, "segments"));
            json_decref(doc);
        }
    }
    for (size_t i = 0; i < bc->n; i++)
        bc->t0[i] = proc_cpu_ns(bc->pid[i]);
    bc->self0 = self_cpu_ns();
}

struct json_t *bench_cpu_end(const struct bench_cpu *bc, uint64_t ops)
{
    if (ops == 0)
        return NULL; /* no op completed: there is no per-op figure */
    json_t *o = json_object();
    double div = (double)ops * 1000.0; /* ns → µs per op */
    json_object_set_new(o, "bench", json_real((double)(self_cpu_ns() - bc->self0) / div));
    double masters = 0, segments = 0;
    for (size_t i = 0; i < bc->n; i++) {
        uint64_t t1 = proc_cpu_ns(bc->pid[i]);
        double us = t1 >= bc->t0[i] ? (double)(t1 - bc->t0[i]) / div : 0;
        json_object_set_new(o, bc->name[i], json_real(us));
        if (strncmp(bc->name[i], "master", 6) == 0)
            masters += us;
        else
            segments += us;
    }
    if (bc->n) {
        json_object_set_new(o, "masters", json_real(masters));
        json_object_set_new(o, "segments", json_real(segments));
    }
    return o;
}
