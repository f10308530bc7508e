/*
 * bench_fsm_scale.c — the master FSM's raft-thread holds at scale, without a cluster (issue 22;
 * docs/bench.md "Master scale"). Not a ctest: prints figures, asserts none.
 *
 * Drives one FSM the way a member's raft thread does under scripts/bench-scale.sh's load, on
 * one thread: 100 segments on one host; N objects of 64 B, 1 replica, written as group entries
 * of --cmds PutStart commands of --batch items each (the cluster's entries of ~2.4k PutStarts),
 * each followed by an entry of the matching PutEnds; an incremental snapshot always running,
 * one step (kvp_master_fsm_snap_next of 256 KiB, then LZ4 of the chunk as raftlog does) after
 * every entry, a new one begun when the last one ends. Every hold is timed in the thread's own
 * CPU (CLOCK_THREAD_CPUTIME_ID), so a loaded host changes the figures little; cache misses are
 * still the host's.
 *
 * Prints, per band of --band objects: the longest PutStart entry apply, the longest PutEnd entry
 * apply, the longest snapshot step (snap_next alone, and with LZ4), steps over 10 ms, and the
 * table's capacity. Last line: totals.
 *   bench_fsm_scale [--objects N] [--segments S] [--batch B] [--cmds C] [--band N] [--chunk BYTES]
 *                   [--no-snap] [--replicas R] [--note-ms MS]
 * A hold over --note-ms (default 20) of CPU is printed with the FSM's note of what it did
 * (kvp_master_fsm_hold_note: items, table growth slots/swaps/frees, snapshot slots/objects).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>

#include <lz4.h>

#include "actors/master/fsm/fsm_internal.h"
#include "kvpool.h"
#include "runtime/log.h"

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The (single-threaded) process's involuntary context switches and minor page faults so far: a hold that was
 * preempted or faulted in fresh pages is the host's as much as the code's. */
static uint64_t sys_us_now; /* the process's kernel CPU time at the last thread_counts */
static void thread_counts(uint64_t *ivcsw, uint64_t *minflt)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru); /* one thread */
    *ivcsw = (uint64_t)ru.ru_nivcsw;
    *minflt = (uint64_t)ru.ru_minflt;
    sys_us_now = (uint64_t)ru.ru_stime.tv_sec * 1000000u + (uint64_t)ru.ru_stime.tv_usec;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_fsm_scale: %s: %s\n", what, kvp_strerror(rc));
    exit(1);
}

static Kvp__Response *apply(struct kvp_master_fsm *f, Kvp__Command *c)
{
    Kvp__Response *r = NULL;
    int rc = kvp_master_fsm_apply(f, c, &r);
    if (rc != KVP_OK || !r)
        die("apply", rc);
    return r;
}

struct band {
    uint64_t put_max, end_max, step_max, step_lz4_max, step_max_at, put_max_at;
    uint64_t steps, steps_over_10ms, entries;
    uint64_t put_sum, end_sum, step_sum; /* for the means: an outlier of a loaded host shows less */
    uint64_t step_max_slots, step_max_bytes, step_max_ivcsw, step_max_flt, put_max_ivcsw, put_max_flt;
    uint64_t slots_max;                  /* most table slots one step visited */
};

int main(int argc, char **argv)
{
    uint64_t objects = 1000000, band_objs = 500000;
    unsigned segments = 100, batch = 800, cmds = 3, replicas = 1;
    size_t chunk = 256u << 10;
    bool snap = true;
    uint64_t note_ns = 20000000; /* holds over this are printed with what they did (--note-ms) */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-snap")) {
            snap = false;
            continue;
        }
        if (!v) {
            fprintf(stderr, "bench_fsm_scale: %s needs a value\n", a);
            return 2;
        }
        uint64_t n = strtoull(v, NULL, 0);
        if (!strcmp(a, "--objects"))
            objects = n;
        else if (!strcmp(a, "--segments"))
            segments = (unsigned)n;
        else if (!strcmp(a, "--batch"))
            batch = (unsigned)n;
        else if (!strcmp(a, "--cmds"))
            cmds = (unsigned)n;
        else if (!strcmp(a, "--band"))
            band_objs = n;
        else if (!strcmp(a, "--chunk"))
            chunk = (size_t)n;
        else if (!strcmp(a, "--replicas"))
            replicas = (unsigned)n;
        else if (!strcmp(a, "--note-ms"))
            note_ns = n * 1000000ull;
        else {
            fprintf(stderr, "bench_fsm_scale: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (!batch || !cmds || !segments || !band_objs) {
        fprintf(stderr, "bench_fsm_scale: zero option\n");
        return 2;
    }
    if (!getenv("KVPOOL_LOG_LEVEL"))
        kvp_log_set_level(KVP_LOG_WARN); /* not 100 mount lines */
    struct kvp_master_fsm_params p = {.fence_grace_ms = 1000, .put_ttl_ms = 600000};
    struct kvp_master_fsm *f = NULL;
    int rc = kvp_master_fsm_new(&f, &p);
    if (rc != KVP_OK)
        die("new", rc);
    uint64_t seg_size = objects * 128 / segments + (1ull << 30), now = 1;
    for (unsigned i = 0; i < segments; i++) {
        char name[32];
        snprintf(name, sizeof name, "scale-seg-%03u", i);
        Kvp__Command c = KVP__COMMAND__INIT;
        Kvp__MountSegmentReq m = KVP__MOUNT_SEGMENT_REQ__INIT;
        m.name = name;
        m.host = "127.0.0.1";
        m.endpoint = "127.0.0.1:7000";
        m.size = seg_size;
        m.owner_pid = 4242;
        c.now_wall_ms = now;
        c.body_case = KVP__COMMAND__BODY_MOUNT;
        c.mount = &m;
        Kvp__Response *r = apply(f, &c);
        if (r->status != KVP_OK)
            die("mount", r->status);
        kvp_master_fsm_response_free(r);
    }
    size_t per_entry = (size_t)batch * cmds;
    Kvp__PutStartItem *items = calloc(per_entry, sizeof *items), **ip = calloc(per_entry, sizeof *ip);
    Kvp__PutEndItem *eitems = calloc(per_entry, sizeof *eitems), **ep = calloc(per_entry, sizeof *ep);
    char (*keys)[24] = calloc(per_entry, sizeof *keys);
    uint8_t *lz = malloc((size_t)LZ4_compressBound((int)(chunk + (64u << 10))));
    if (!items || !ip || !eitems || !ep || !keys || !lz)
        die("calloc", KVP_ERR_NOMEM);
    struct band b = {0}, all = {0};
    uint64_t snaps = 0, t_total0 = cpu_ns(), k = 0, last_cap = f->tab_cap;
    printf("bench_fsm_scale: %llu objects, %u segments, entries of %u PutStart commands x %u items, "
           "%u replica(s), snapshot %s (steps of %zu B)\n",
           (unsigned long long)objects, segments, cmds, batch, replicas, snap ? "always running" : "off", chunk);
    printf("%-10s %-12s %-12s %-14s %-14s %-8s %-10s %-10s\n", "objects", "put_max_ms", "end_max_ms",
           "step_max_ms", "step+lz4_ms", "steps", ">10ms", "tab_cap");
    while (k < objects) {
        size_t n = objects - k < per_entry ? (size_t)(objects - k) : per_entry;
        for (size_t i = 0; i < n; i++) {
            snprintf(keys[i], sizeof keys[i], "k/%012llu", (unsigned long long)(k + i));
            kvp__put_start_item__init(&items[i]);
            items[i].key = keys[i];
            items[i].size = 64;
            items[i].replica_num = replicas;
            items[i].op_id = k + i + 1;
            items[i].client_host = "127.0.0.1";
            ip[i] = &items[i];
            kvp__put_end_item__init(&eitems[i]);
            eitems[i].key = keys[i];
            eitems[i].op_id = k + i + 1;
            eitems[i].checksum = k + i;
            ep[i] = &eitems[i];
        }
        now++;
        /* One entry of PutStarts, one of PutEnds; each command's response freed inside the hold
         * (raftlog packs and frees it on the raft thread). */
        for (int phase = 0; phase < 2; phase++) {
            uint64_t t0 = cpu_ns(), cs0, fl0, cs1, fl1;
            thread_counts(&cs0, &fl0);
            uint64_t sys0 = sys_us_now;
            kvp_master_fsm_hold_note(f, true, NULL, 0);
            for (size_t off = 0; off < n; off += batch) {
                size_t m = n - off < batch ? n - off : batch;
                Kvp__Command c = KVP__COMMAND__INIT;
                Kvp__PutStartReq ps = KVP__PUT_START_REQ__INIT;
                Kvp__PutEndReq pe = KVP__PUT_END_REQ__INIT;
                c.now_wall_ms = now;
                c.term = 2;
                if (phase == 0) {
                    ps.items = ip + off;
                    ps.n_items = m;
                    c.body_case = KVP__COMMAND__BODY_PUT_START;
                    c.put_start = &ps;
                } else {
                    pe.items = ep + off;
                    pe.n_items = m;
                    c.body_case = KVP__COMMAND__BODY_PUT_END;
                    c.put_end = &pe;
                }
                kvp_master_fsm_response_free(apply(f, &c));
            }
            uint64_t dt = cpu_ns() - t0;
            thread_counts(&cs1, &fl1);
            if (dt >= note_ns) {
                char note[512];
                kvp_master_fsm_hold_note(f, false, note, sizeof note);
                printf("slow %s entry at %llu objects: %.2f ms CPU (%.2f ms kernel), %llu preemptions, %llu page "
                       "faults; %s\n", phase ? "PutEnd" : "PutStart", (unsigned long long)k, dt / 1e6,
                       (sys_us_now - sys0) / 1e3,
                       (unsigned long long)(cs1 - cs0), (unsigned long long)(fl1 - fl0), note);
            }
            if (phase == 0)
                b.put_sum += dt;
            else
                b.end_sum += dt;
            if (phase == 0 && dt > b.put_max) {
                b.put_max = dt;
                b.put_max_at = k;
                b.put_max_ivcsw = cs1 - cs0;
                b.put_max_flt = fl1 - fl0;
            }
            if (phase == 1 && dt > b.end_max)
                b.end_max = dt;
            b.entries++;
            if (!snap)
                continue;
            /* One snapshot step after every entry, as the raft thread's loop does. */
            thread_counts(&cs0, &fl0);
            uint64_t ssys0 = sys_us_now;
            kvp_master_fsm_hold_note(f, true, NULL, 0);
            uint64_t s0 = cpu_ns(), cap0 = f->tab_cap;
            bool growth = cap0 != last_cap; /* the table grew since the last step: the walk restarts */
            last_cap = cap0;
            if (!kvp_master_fsm_snap_running(f)) {
                if ((rc = kvp_master_fsm_snap_begin(f)) != KVP_OK)
                    die("snap_begin", rc);
                snaps++;
            }
            uint8_t *out = NULL;
            size_t out_len = 0;
            bool last = false;
            uint64_t cur0 = kvp_fsm_snap_cursor(f);
            if ((rc = kvp_master_fsm_snap_next(f, chunk, &out, &out_len, &last)) != KVP_OK)
                die("snap_next", rc);
            uint64_t s1 = cpu_ns();
            uint64_t slots = last ? 0 : kvp_fsm_snap_cursor(f) - cur0; /* the last step's is not known */
            if (out_len && LZ4_compress_default((const char *)out, (char *)lz, (int)out_len,
                                                LZ4_compressBound((int)out_len)) <= 0)
                die("lz4", KVP_ERR_INTERNAL);
            free(out);
            uint64_t s2 = cpu_ns();
            thread_counts(&cs1, &fl1);
            if (s2 - s0 >= note_ns) {
                char note[512];
                kvp_master_fsm_hold_note(f, false, note, sizeof note);
                printf("slow step at %llu objects: %.2f ms CPU (%.2f with LZ4; %.2f ms kernel), %zu bytes, %llu "
                       "preemptions, %llu page faults; %s\n", (unsigned long long)k, (s1 - s0) / 1e6,
                       (s2 - s0) / 1e6, (sys_us_now - ssys0) / 1e3, out_len,
                       (unsigned long long)(cs1 - cs0), (unsigned long long)(fl1 - fl0), note);
            }
            b.steps++;
            if (slots > b.slots_max)
                b.slots_max = slots;
            b.step_sum += s2 - s0;
            if (growth && kvp_master_fsm_snap_running(f))
                printf("growth to %llu slots at %llu objects: the next step %.2f ms of CPU (%.2f ms with LZ4)\n",
                       (unsigned long long)cap0, (unsigned long long)k, (s1 - s0) / 1e6, (s2 - s0) / 1e6);
            if (s1 - s0 > b.step_max) {
                b.step_max = s1 - s0;
                b.step_max_at = k;
                b.step_max_slots = slots;
                b.step_max_bytes = out_len;
                b.step_max_ivcsw = cs1 - cs0;
                b.step_max_flt = fl1 - fl0;
            }
            if (s2 - s0 > b.step_lz4_max)
                b.step_lz4_max = s2 - s0;
            if (s2 - s0 > 10000000ull)
                b.steps_over_10ms++;
        }
        k += n;
        if (k / band_objs != (k - n) / band_objs || k == objects) {
            printf("%-10llu %-12.2f %-12.2f %-14.2f %-14.2f %-8llu %-10llu %-10llu\n", (unsigned long long)k,
                   b.put_max / 1e6, b.end_max / 1e6, b.step_max / 1e6, b.step_lz4_max / 1e6,
                   (unsigned long long)b.steps, (unsigned long long)b.steps_over_10ms,
                   (unsigned long long)f->tab_cap);
            printf("  longest PutStart entry: %llu preemptions, %llu page faults; longest step: %llu slots, %llu "
                   "bytes, %llu preemptions, %llu page faults; most slots in a step %llu\n",
                   (unsigned long long)b.put_max_ivcsw, (unsigned long long)b.put_max_flt,
                   (unsigned long long)b.step_max_slots, (unsigned long long)b.step_max_bytes,
                   (unsigned long long)b.step_max_ivcsw, (unsigned long long)b.step_max_flt,
                   (unsigned long long)b.slots_max);
            fflush(stdout);
#define KEEP_MAX(x) all.x = b.x > all.x ? b.x : all.x
            KEEP_MAX(put_max);
            KEEP_MAX(end_max);
            KEEP_MAX(step_max);
            KEEP_MAX(step_lz4_max);
            all.steps += b.steps;
            all.steps_over_10ms += b.steps_over_10ms;
            all.entries += b.entries;
            all.put_sum += b.put_sum;
            all.end_sum += b.end_sum;
            all.step_sum += b.step_sum;
            memset(&b, 0, sizeof b);
        }
    }
    printf("total: %llu objects, CPU %.2f s, %llu entries, longest PutStart entry %.2f ms, longest PutEnd "
           "entry %.2f ms, longest snapshot step %.2f ms (with LZ4 %.2f ms), %llu snapshots begun, %llu steps, "
           "%llu steps over 10 ms; means: PutStart entry %.2f ms, PutEnd entry %.2f ms, step with LZ4 %.2f ms\n",
           (unsigned long long)k, (cpu_ns() - t_total0) / 1e9, (unsigned long long)all.entries, all.put_max / 1e6,
           all.end_max / 1e6, all.step_max / 1e6, all.step_lz4_max / 1e6, (unsigned long long)snaps,
           (unsigned long long)all.steps, (unsigned long long)all.steps_over_10ms,
           all.put_sum / 1e6 / (double)(all.entries ? (all.entries + 1) / 2 : 1),
           all.end_sum / 1e6 / (double)(all.entries ? all.entries / 2 : 1),
           all.step_sum / 1e6 / (double)(all.steps ? all.steps : 1));
    free(items);
    free(ip);
    free(eitems);
    free(ep);
    free(keys);
    free(lz);
    kvp_master_fsm_destroy(&f);
    return 0;
}
