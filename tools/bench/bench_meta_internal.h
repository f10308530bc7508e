/*
 * bench_meta_internal.h — shared by bench_meta.c (the mode, thread driver, objects, failover)
 * and bench_meta_pipe.c (the pipelined driver).
 */
#ifndef KVP_TOOLS_BENCH_META_INTERNAL_H
#define KVP_TOOLS_BENCH_META_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "actors/session/msession.h"
#include "tools/bench/bench_internal.h"

#define META_OBJ_BYTES 64
#define META_SESSIONS_MAX 8

struct meta {
    struct bench_target target;
    struct kvp_msession *sess[META_SESSIONS_MAX];
    unsigned nsess;
    char seg_name[64];
    uint32_t seg_id;
    atomic_uint_fast64_t op_seq;
    atomic_int hb_stop;
    pthread_t hb;
    double seconds;
    bool json;
    unsigned batch; /* keys per request (pipe driver): BatchPutStart/BatchPutEnd/BatchGetReplicaList */
};

/* Per-caller count of keys stored so far (keys continue across levels: never a repeated key). */
struct meta_pipe_state {
    uint64_t nkeys_seen[1024];
};

/* Key i of caller `caller`, unique to this bench process. */
static inline void meta_key(char *k, size_t cap, unsigned caller, uint64_t i)
{
    snprintf(k, cap, "meta-%d-%u-%llu", (int)getpid(), caller, (unsigned long long)i);
}

/**
 * One level with the pipelined driver: `callers` request streams, each with one request
 * outstanding, for m->seconds; what 0 = PutStart+PutEnd pairs, 1 = GetReplicaList of stored
 * keys; each request carries m->batch keys. Latency per pair / get (per request) goes to lat,
 * error codes to errs (one per failed request). Returns keys/s (pairs or gets per key).
 */
double meta_run_level_pipe(struct meta *m, struct meta_pipe_state *st, unsigned callers, int what,
                           struct bench_lat *lat, struct bench_errs *errs);

#endif
