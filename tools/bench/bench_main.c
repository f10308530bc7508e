/*
 * bench_main.c — kvpool-bench: trace replay (the main job), offline bounds, key-value and
 * metadata benchmarks, a loopback TCP baseline. docs/bench.md describes every mode and figure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/log.h"
#include "tools/bench/bench_internal.h"

static void usage(void)
{
    fprintf(stderr,
            "usage: kvpool-bench MODE [options]\n"
            "  trace [FILE]        replay a Mooncake trace against a cluster (the main job)\n"
            "  bounds [FILE]       offline prefix-hit bounds of a trace (infinite cache, LRU)\n"
            "  models              the --model table (KV bytes per token and sources)\n"
            "  put|get|mixed|exists key-value throughput and latency through the public API\n"
            "  baseline-tcp        one loopback TCP stream, measured in-process\n"
            "  baseline-kernel     CPU cost of a system call and of a thread wake-up\n"
            "  meta                master metadata throughput and failover time\n"
            "Run `kvpool-bench MODE --help` for a mode's options; docs/bench.md has them all.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage();
        return argc < 2 ? 2 : 0;
    }
    /* The library's INFO lines (leader changes, ...) would bury the report: WARN unless asked. */
    if (!getenv("KVPOOL_LOG_LEVEL"))
        kvp_log_set_level(KVP_LOG_WARN);
    const char *mode = argv[1];
    argv[1] = argv[0];
    argc--;
    argv++;
    if (!strcmp(mode, "trace"))
        return bench_trace_main(argc, argv);
    if (!strcmp(mode, "bounds"))
        return bench_bounds_main(argc, argv);
    if (!strcmp(mode, "models"))
        return bench_models_main();
    if (!strcmp(mode, "put") || !strcmp(mode, "get") || !strcmp(mode, "mixed") || !strcmp(mode, "exists"))
        return bench_kv_main(mode, argc, argv);
    if (!strcmp(mode, "meta"))
        return bench_meta_main(argc, argv);
    if (!strcmp(mode, "baseline-tcp"))
        return bench_baseline_tcp_main(argc, argv);
    if (!strcmp(mode, "baseline-kernel"))
        return bench_baseline_kernel_main(argc, argv);
    fprintf(stderr, "kvpool-bench: unknown mode '%s'\n", mode);
    usage();
    return 2;
}
