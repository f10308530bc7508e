/*
 * segment.c — one contributed segment: region (mmap), data-plane server, mount, heartbeat,
 * drain, unmount. See segment.h and docs/data-plane.md.
 *
 * Threads: the caller of kvp_segment_start/drain/stop, and one heartbeat thread. The segment
 * id is an atomic (relaxed: a single independent value; the server keeps its own copy).
 */
#define _GNU_SOURCE
#include "actors/segment/segment.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "actors/segment/mover.h"
#include "actors/segment/seg_server.h"
#include "actors/segment/segment_internal.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "runtime/proc.h"

#define HUGE_PAGE_BYTES (2ull << 20)
#define MOUNT_TIMEOUT_MS 10000u
/* kvpool-segment at start, no master answering (hooks.mount_retry): each try waits this long
 * for a leader, then the next one comes after a backoff from 1 s doubling to 10 s. */
#define MOUNT_RETRY_TRY_MS 2000u
#define MOUNT_RETRY_FIRST_MS 1000u
#define MOUNT_RETRY_MAX_MS 10000u
#define UNMOUNT_TIMEOUT_MS 3000u
#define DRAIN_POLL_MS 200u

struct kvp_segment {
    struct kvp_cfg_segment cfg;
    struct kvp_msession *ms;
    struct kvp_segment_hooks hooks;
    void *base;
    size_t map_bytes;
    uint64_t size;
    bool huge;
    struct kvp_seg_server *srv;
    _Atomic uint32_t id;
    /* Mount counters for kvp_segment_stats: written by whichever thread mounts (the start, then
     * the heartbeat thread: one at a time), read by the metrics thread; relaxed, independent
     * values (see seg_server.c's counters for why atomics and not a message). */
    _Atomic uint64_t mounts;
    _Atomic uint64_t mount_failures;
    char name[128];
    char endpoint[300];
    char actor[160];
    pthread_t hb_thread;
    bool hb_started;
    struct kvp_mover *mover; /* drain/repair copies from this segment (mover.h) */
    bool drain_signalled;    /* heartbeat thread only */
    pthread_mutex_t mu; /* guards stopping */
    pthread_cond_t cv;
    bool stopping;
    pthread_t prefault_thread; /* segment_prefault: populates the region in the background */
    bool prefault_started;
    atomic_bool prefault_stop;
};

static int call(struct kvp_segment *s, Kvp__Request *req, uint32_t timeout_ms, Kvp__Response **out)
{
    *out = NULL;
    int rc = kvp_msession_call(s->ms, req, timeout_ms, out);
    if (rc != KVP_OK)
        return rc;
    return (*out)->status;
}

#define MOUNT_EXISTS_RETRIES 30 /* seconds: above the default client_ttl (10 s) */

static void count(_Atomic uint64_t *c)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
}

/* MountSegment; on success the new id is stored and the server accepts it. A failure is logged
 * as ERROR unless `quiet` (the caller logs its own line). */
static int do_mount_ex(struct kvp_segment *s, uint32_t timeout_ms, bool quiet)
{
    Kvp__Request req;
    Kvp__MountSegmentReq m;
    kvp__request__init(&req);
    kvp__mount_segment_req__init(&m);
    m.name = s->name;
    m.host = s->cfg.local_hostname;
    m.endpoint = s->endpoint;
    m.size = s->size;
    m.owner_pid = (uint64_t)getpid();
    req.body_case = KVP__REQUEST__BODY_MOUNT;
    req.mount = &m;
    Kvp__Response *resp = NULL;
    int rc = call(s, &req, timeout_ms, &resp);
    if (rc == KVP_OK && (resp->body_case != KVP__RESPONSE__BODY_MOUNT || !resp->mount ||
                         resp->mount->segment_id == 0))
        rc = KVP_ERR_MALFORMED;
    if (rc != KVP_OK) {
        count(&s->mount_failures);
        if (!quiet)
            kvp_log_error(s->actor, "mount (%lu bytes at %s): %s%s%s", (unsigned long)s->size, s->endpoint,
                          kvp_errname(rc), resp && resp->error && resp->error[0] ? ": " : "",
                          resp && resp->error ? resp->error : "");
        kvp_msession_response_free(resp);
        return rc;
    }
    count(&s->mounts);
    uint32_t old = atomic_load_explicit(&s->id, memory_order_relaxed);
    uint32_t id = resp->mount->segment_id;
    kvp_msession_response_free(resp);
    atomic_store_explicit(&s->id, id, memory_order_relaxed);
    kvp_seg_server_set_id(s->srv, id);
    kvp_log_info(s->actor, "mounted as segment %u (%lu bytes, endpoint %s)", id, (unsigned long)s->size,
                 s->endpoint);
    if (s->hooks.on_mount)
        s->hooks.on_mount(s->hooks.ctx, old, id, s->base, s->size);
    return KVP_OK;
}

static int do_mount(struct kvp_segment *s, uint32_t timeout_ms)
{
    return do_mount_ex(s, timeout_ms, false);
}

/*
 * The first mount of kvpool-segment (hooks.mount_retry): while no master answers (no leader
 * elected yet, masters not started), try again with backoff, 1 s doubling to 10 s, one WARN
 * line per try, for as long as it takes. Only the process's signals end the wait (the daemon
 * exits on SIGINT/SIGTERM while starting). Any other answer (EXISTS, INVALID, ...) is returned.
 */
static int mount_retrying(struct kvp_segment *s)
{
    uint32_t backoff = MOUNT_RETRY_FIRST_MS;
    uint64_t t0 = kvp_clock_now_ms();
    for (unsigned attempt = 1;; attempt++) {
        int rc = do_mount_ex(s, MOUNT_RETRY_TRY_MS, true);
        if (rc != KVP_ERR_UNAVAILABLE && rc != KVP_ERR_TIMEOUT && rc != KVP_ERR_NOT_LEADER) {
            if (rc == KVP_OK && attempt > 1)
                kvp_log_info(s->actor, "mount: a master answered at try %u, after %llu ms", attempt,
                             (unsigned long long)(kvp_clock_now_ms() - t0));
            else if (rc != KVP_OK)
                kvp_log_error(s->actor, "mount (%lu bytes at %s): %s", (unsigned long)s->size, s->endpoint,
                              kvp_errname(rc));
            return rc;
        }
        kvp_log_warn(s->actor, "mount try %u: no master answered within %u ms (%s); retrying in %u ms "
                     "(waiting %llu ms so far; SIGINT/SIGTERM exit)", attempt, MOUNT_RETRY_TRY_MS,
                     kvp_errname(rc), backoff, (unsigned long long)(kvp_clock_now_ms() - t0));
        struct timespec ts = {.tv_sec = backoff / 1000, .tv_nsec = (long)(backoff % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        backoff = backoff * 2 > MOUNT_RETRY_MAX_MS ? MOUNT_RETRY_MAX_MS : backoff * 2;
    }
}

/* Wait up to ms on the stop condition. Returns true when stopping. */
static bool wait_stop(struct kvp_segment *s, uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_mutex_lock(&s->mu);
    while (!s->stopping)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT)
            break;
    bool st = s->stopping;
    pthread_mutex_unlock(&s->mu);
    return st;
}

static void *hb_main(void *arg)
{
    struct kvp_segment *s = arg;
    uint32_t period = s->cfg.heartbeat_ms ? s->cfg.heartbeat_ms : 1000;
    uint32_t timeout = period < 1000 ? 1000 : period;
    bool failing = false, fenced = false;
    uint64_t last_wake = kvp_clock_now_ms();
    while (!wait_stop(s, period)) {
        uint32_t id = atomic_load_explicit(&s->id, memory_order_relaxed);
        int rc;
        uint64_t woke = kvp_clock_now_ms();
        if (id && woke - last_wake > 3ull * period + 1000u) {
            /* We were stopped (SIGSTOP, VM pause): the master may have declared us lost and
             * dropped our replicas. Refuse data until a heartbeat confirms the id. */
            kvp_log_warn(s->actor, "segment %u: stalled for %llu ms: refusing data until the master "
                         "confirms this segment", id, (unsigned long long)(woke - last_wake));
            kvp_seg_server_set_id(s->srv, 0);
            fenced = true;
        }
        last_wake = woke;
        if (id == 0) {
            rc = KVP_ERR_NOT_FOUND; /* a remount failed earlier: try again */
        } else {
            Kvp__Request req;
            Kvp__HeartbeatReq hb;
            kvp__request__init(&req);
            kvp__heartbeat_req__init(&hb);
            hb.segment_id = id;
            req.body_case = KVP__REQUEST__BODY_HEARTBEAT;
            req.heartbeat = &hb;
            Kvp__Response *resp = NULL;
            rc = call(s, &req, timeout, &resp);
            if (rc == KVP_OK && resp->body_case == KVP__RESPONSE__BODY_HEARTBEAT && resp->heartbeat &&
                resp->heartbeat->state == KVP__SEGMENT_STATE__SEGMENT_LOST)
                rc = KVP_ERR_NOT_FOUND; /* same meaning: the master dropped our replicas */
            if (rc == KVP_OK && resp->body_case == KVP__RESPONSE__BODY_HEARTBEAT && resp->heartbeat &&
                resp->heartbeat->state == KVP__SEGMENT_STATE__SEGMENT_DRAINING && !s->hooks.on_mount &&
                !s->drain_signalled) {
                /* `kvpoolctl drain` of a kvpool-segment daemon (no hooks): take its SIGTERM path
                 * (drain until empty, unmount, exit 0). Embedded segments keep running. */
                s->drain_signalled = true;
                kvp_log_info(s->actor, "segment %u: the master marked it DRAINING: draining, then exiting", id);
                kill(getpid(), SIGTERM);
            }
            kvp_msession_response_free(resp);
        }
        if (rc == KVP_ERR_NOT_FOUND) {
            /* The master declared us lost: the bytes we held are gone from its view. Remount as
             * a new segment; memory is considered empty (nothing references the old id). */
            kvp_log_warn(s->actor, "segment %u unknown to the master: remounting as a new segment", id);
            kvp_seg_server_set_id(s->srv, 0);
            if (do_mount(s, timeout) != KVP_OK) {
                uint32_t old = atomic_exchange_explicit(&s->id, 0, memory_order_relaxed);
                if (old && s->hooks.on_mount)
                    s->hooks.on_mount(s->hooks.ctx, old, 0, NULL, 0);
            }
            failing = false;
            fenced = false;
            continue;
        }
        if (rc != KVP_OK) {
            if (!failing)
                kvp_log_warn(s->actor, "segment %u: heartbeat: %s (retrying every %u ms)", id,
                             kvp_errname(rc), period);
            failing = true;
        } else if (failing) {
            kvp_log_info(s->actor, "segment %u: heartbeat answered again", id);
            failing = false;
        }
        if (rc == KVP_OK && fenced) {
            kvp_seg_server_set_id(s->srv, id);
            kvp_log_info(s->actor, "segment %u: confirmed by the master: serving again", id);
            fenced = false;
        }
    }
    return NULL;
}

static int map_region(struct kvp_segment *s)
{
    s->size = s->cfg.global_segment_size;
    if (s->cfg.hugepages) {
        size_t len = (size_t)((s->size + HUGE_PAGE_BYTES - 1) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES);
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
        if (p != MAP_FAILED) {
            s->base = p;
            s->map_bytes = len;
            s->huge = true;
            return KVP_OK;
        }
        kvp_log_info(s->actor, "hugepages: mmap MAP_HUGETLB of %zu bytes: %s; using normal pages", len,
                     strerror(errno));
    }
    void *p = mmap(NULL, (size_t)s->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
        kvp_log_error(s->actor, "mmap of %lu bytes: %s", (unsigned long)s->size, strerror(errno));
        return KVP_ERR_NOMEM;
    }
#ifdef MADV_HUGEPAGE
    madvise(p, (size_t)s->size, MADV_HUGEPAGE); /* transparent huge pages where enabled */
#endif
    s->base = p;
    s->map_bytes = (size_t)s->size;
    return KVP_OK;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
/* One madvise call per huge page: MADV_POPULATE_WRITE holds the process's mmap_lock (read) for
 * the whole call, and every mmap/munmap of the process (a connection thread's stack, a large
 * malloc) waits for it. With 64 MiB per call that wait reached 766 ms on this VM (cold guest
 * memory populates at ~200 MB/s); with 2 MiB it stays in the tens of ms. */
#define PREFAULT_CHUNK_BYTES (2ull << 20)
#define PREFAULT_MEMCHECK_BYTES (64ull << 20) /* /proc/meminfo read every this many bytes */
#define PREFAULT_FLOOR_MIN (512ull << 20)

uint64_t kvp_seg_prefault_allow(const char *meminfo, uint64_t want)
{
    if (!meminfo)
        return want;
    unsigned long long total = 0, avail = 0;
    bool have_total = false, have_avail = false;
    for (const char *line = meminfo; line && *line;) {
        if (sscanf(line, "MemTotal: %llu kB", &total) == 1)
            have_total = true;
        else if (sscanf(line, "MemAvailable: %llu kB", &avail) == 1)
            have_avail = true;
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    if (!have_total || !have_avail || total > UINT64_MAX / 1024 || avail > UINT64_MAX / 1024)
        return want; /* not Linux's format: no guard */
    uint64_t floor = total * 1024 / 10 > PREFAULT_FLOOR_MIN ? total * 1024 / 10 : PREFAULT_FLOOR_MIN;
    uint64_t a = avail * 1024;
    if (a <= floor)
        return 0;
    return a - floor < want ? a - floor : want;
}

uint64_t kvp_seg_host_memory(const char *meminfo)
{
    unsigned long long total = 0, swap = 0, v = 0;
    bool have_total = false;
    for (const char *line = meminfo; line && *line;) {
        if (sscanf(line, "MemTotal: %llu kB", &v) == 1) {
            total = v;
            have_total = true;
        } else if (sscanf(line, "SwapTotal: %llu kB", &v) == 1) {
            swap = v;
        }
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    if (!have_total || total > UINT64_MAX / 2048 || swap > UINT64_MAX / 2048)
        return 0;
    return (uint64_t)(total + swap) * 1024;
}

/* The whole of a small file into buf (NUL-terminated); false when it cannot be read. */
static bool read_small_file(const char *path, char *buf, size_t cap)
{
    FILE *fp = fopen(path, "re");
    if (!fp)
        return false;
    size_t n = fread(buf, 1, cap - 1, fp);
    fclose(fp);
    buf[n] = 0;
    return true;
}

/* The tightest memory cgroup limit of this process (memcg.c); false when none is known. */
static bool memcg_now(struct kvp_seg_memcg *m)
{
    char buf[4096];
    if (!read_small_file("/proc/self/cgroup", buf, sizeof buf)) {
        memset(m, 0, sizeof *m);
        return false;
    }
    return kvp_seg_memcg_read(buf, "/sys/fs/cgroup", m);
}

/* How much the prefault may populate now: the host guard (kvp_seg_prefault_allow, /proc/meminfo)
 * and the cgroup guard (kvp_seg_memcg_allow); a guard whose files cannot be read allows `want`.
 * When it allows less than `want`, *why says which guard. */
static uint64_t prefault_allow(uint64_t want, char *why, size_t cap)
{
    char buf[4096];
    uint64_t host = read_small_file("/proc/meminfo", buf, sizeof buf) ? kvp_seg_prefault_allow(buf, want) : want;
    struct kvp_seg_memcg m;
    uint64_t cg = memcg_now(&m) ? kvp_seg_memcg_allow(&m, want) : want;
    if (host < want)
        snprintf(why, cap, "MemAvailable low (the host keeps max(MemTotal/10, %llu MiB) free)",
                 PREFAULT_FLOOR_MIN >> 20);
    else if (cg < want)
        snprintf(why, cap, "memory cgroup %s near its limit (usage %llu of %llu bytes; it keeps max(limit/10, "
                 "512 MiB) free)", m.path, (unsigned long long)m.usage, (unsigned long long)m.limit);
    return host < cg ? host : cg;
}

/*
 * segment_prefault: a fresh anonymous region is not backed by memory; the first write to each
 * page faults, and that fault lands inside a transfer (this VM: 1 GiB took 4.6-11 s to touch, a
 * single 2 MiB THP fault up to 95 ms; batch_put p99 of a trace replay 237 ms on fresh regions
 * vs 59 ms on populated ones). This thread populates the region after it is mapped, one huge
 * page per call (PREFAULT_CHUNK_BYTES), checking for stop between calls, with
 * MADV_POPULATE_WRITE (page tables and memory, contents untouched, so it may run while
 * transfers write). Kernels without it (EINVAL): one atomic "or 0" per 4 KiB page, which never
 * loses a concurrent write. An error (EFAULT, ENOMEM) ends it: the rest is faulted on demand as
 * before. Populating anonymous memory the host does not have does not fail with ENOMEM: the
 * kernel's OOM killer runs. So a normal-page region stops being populated while MemAvailable
 * is below max(MemTotal / 10, 512 MiB) plus the next 64 MiB (a region larger than the host's
 * free memory, which MAP_NORESERVE allows), or while the room left under the tightest memory
 * cgroup limit of the process (a container's) is below max(limit / 10, 512 MiB) plus the next
 * 64 MiB (memcg.c); hugetlb regions are reserved at mmap.
 */
static void *prefault_main(void *arg)
{
    struct kvp_segment *s = arg;
    uint64_t t0 = kvp_clock_now_ms();
    size_t done = 0, allowed = s->map_bytes; /* bytes below which memory was checked */
    bool populate = true;
    const char *why = NULL;
    char whybuf[768];
    if (!s->huge)
        allowed = 0;
    while (done < s->map_bytes && !atomic_load_explicit(&s->prefault_stop, memory_order_relaxed)) {
        size_t n = s->map_bytes - done < PREFAULT_CHUNK_BYTES ? s->map_bytes - done : PREFAULT_CHUNK_BYTES;
        if (done + n > allowed) {
            uint64_t step = s->map_bytes - done < PREFAULT_MEMCHECK_BYTES ? s->map_bytes - done
                                                                          : PREFAULT_MEMCHECK_BYTES;
            if (prefault_allow(step, whybuf, sizeof whybuf) < step) {
                why = whybuf;
                break;
            }
            allowed = done + step;
        }
        uint8_t *p = (uint8_t *)s->base + done;
        if (populate && madvise(p, n, MADV_POPULATE_WRITE) != 0) {
            if (errno == EINTR)
                continue; /* the same chunk again */
            if (errno == EINVAL) {
                populate = false; /* kernel without it: touch below */
            } else {
                why = strerror(errno);
                break;
            }
        }
        if (!populate)
            for (size_t off = 0; off < n; off += 4096)
                __atomic_fetch_or(p + off, (uint8_t)0, __ATOMIC_RELAXED);
        done += n;
    }
    if (why)
        kvp_log_warn(s->actor, "prefault stopped after %zu of %zu bytes: %s (the rest faults on first write)", done,
                     s->map_bytes, why);
    else
        kvp_log_info(s->actor, "prefault: %zu of %zu bytes populated in %llu ms%s", done, s->map_bytes,
                     (unsigned long long)(kvp_clock_now_ms() - t0), populate ? "" : " (page by page)");
    return NULL;
}

static void prefault_start(struct kvp_segment *s)
{
    if (!s->cfg.segment_prefault)
        return;
    atomic_init(&s->prefault_stop, false);
    s->prefault_started = pthread_create(&s->prefault_thread, NULL, prefault_main, s) == 0;
    if (!s->prefault_started)
        kvp_log_warn(s->actor, "prefault thread not started: pages fault on first write");
}

static void prefault_stop(struct kvp_segment *s)
{
    if (!s->prefault_started)
        return;
    atomic_store(&s->prefault_stop, true);
    pthread_join(s->prefault_thread, NULL);
    s->prefault_started = false;
}

static void segment_free(struct kvp_segment *s)
{
    prefault_stop(s); /* before munmap */
    kvp_seg_server_stop(&s->srv);
    if (s->base)
        munmap(s->base, s->map_bytes);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

struct srv_try {
    struct kvp_segment *s;
    const struct kvp_cfg_segment *cfg;
};

static int srv_start_attempt(void *arg, char *why, size_t why_cap)
{
    struct srv_try *t = arg;
    int rc = kvp_seg_server_start_auth(&t->s->srv, t->cfg->local_hostname, t->cfg->port, t->s->base, t->s->size,
                                       (const uint8_t(*)[32])t->s->hooks.token_keys, t->s->hooks.n_token_keys);
    if (rc == KVP_ERR_BUSY)
        snprintf(why, why_cap, "%s", strerror(EADDRINUSE));
    return rc;
}

int kvp_segment_start(struct kvp_segment **out, const struct kvp_cfg_segment *cfg,
                      struct kvp_msession *ms, const struct kvp_segment_hooks *hooks)
{
    if (!out || !cfg || !ms) {
        kvp_log_error("segment", "start: NULL argument");
        return KVP_ERR_INVALID;
    }
    if (cfg->global_segment_size == 0 || cfg->port > 65535 || !cfg->local_hostname[0]) {
        kvp_log_error("segment", "start: global_segment_size=%lu port=%u local_hostname='%s': size must be "
                      "> 0, port <= 65535, host set",
                      (unsigned long)cfg->global_segment_size, cfg->port, cfg->local_hostname);
        return KVP_ERR_INVALID;
    }
    struct kvp_segment *s = calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NOMEM;
    s->cfg = *cfg;
    s->ms = ms;
    if (hooks)
        s->hooks = *hooks;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    snprintf(s->actor, sizeof s->actor, "segment %.120s", cfg->name[0] ? cfg->name : cfg->local_hostname);

    int rc = map_region(s);
    if (rc != KVP_OK)
        goto fail;
    char mi[4096];
    uint64_t host_mem = read_small_file("/proc/meminfo", mi, sizeof mi) ? kvp_seg_host_memory(mi) : 0;
    if (!s->huge && host_mem && s->size > host_mem)
        kvp_log_warn(s->actor,
                     "global_segment_size %llu bytes is more than this host's memory (MemTotal + SwapTotal = "
                     "%llu bytes): once the pool fills, writes past it run the OOM killer; lower "
                     "global_segment_size",
                     (unsigned long long)s->size, (unsigned long long)host_mem);
    struct kvp_seg_memcg mcg;
    if (!s->huge && memcg_now(&mcg) && s->size > (mcg.usage < mcg.limit ? mcg.limit - mcg.usage : 0))
        kvp_log_warn(s->actor,
                     "global_segment_size %llu bytes is more than the room left under memory cgroup %s (limit %llu, "
                     "usage %llu bytes): once the pool fills, writes past that room run the cgroup's OOM killer; "
                     "lower global_segment_size or raise the limit",
                     (unsigned long long)s->size, mcg.path, (unsigned long long)mcg.limit,
                     (unsigned long long)mcg.usage);
    /* A fixed port still held (a killed previous incarnation's threads still exiting) is
     * retried for bind_retry_ms, one log line per try (issue 15). */
    struct srv_try st = {.s = s, .cfg = cfg};
    char what[300];
    snprintf(what, sizeof what, "listen on %s port %u", cfg->local_hostname, cfg->port);
    rc = kvp_retry_start(s->actor, what, cfg->bind_retry_ms, srv_start_attempt, &st);
    if (rc == KVP_ERR_BUSY)
        rc = KVP_ERR_IO;
    if (rc != KVP_OK) {
        if (rc == KVP_ERR_INVALID && cfg->local_hostname[0])
            rc = KVP_ERR_IO; /* host did not resolve to anything we can bind */
        goto fail;
    }
    uint32_t port = kvp_seg_server_port(s->srv);
    char host[256];
    if (kvp_seg_strip_brackets(cfg->local_hostname, host, sizeof host) != 0) {
        rc = KVP_ERR_INVALID;
        goto fail;
    }
    if (cfg->name[0])
        snprintf(s->name, sizeof s->name, "%s", cfg->name);
    else
        snprintf(s->name, sizeof s->name, "%.100s-%u", host, port);
    kvp_seg_format_endpoint(s->endpoint, sizeof s->endpoint, host, port);
    snprintf(s->actor, sizeof s->actor, "segment %.120s", s->name);
    prefault_start(s); /* after s->actor is final: the thread logs with it */
    kvp_log_info(s->actor, "region %lu bytes (%s pages), data plane on %s", (unsigned long)s->size,
                 s->huge ? "huge" : "normal", s->endpoint);

    rc = s->hooks.mount_retry ? mount_retrying(s) : do_mount(s, MOUNT_TIMEOUT_MS);
    /* EXISTS: the name is still held by a segment the master thinks is alive at another
     * address (this process restarted on a new port before the old one was declared lost).
     * That resolves within client_ttl (about a second when a client reported it): retry. */
    for (int i = 0; rc == KVP_ERR_EXISTS && i < MOUNT_EXISTS_RETRIES; i++) {
        if (i == 0)
            kvp_log_warn(s->actor, "name %s still held by a live segment; retrying the mount for up to %d s",
                         s->name, MOUNT_EXISTS_RETRIES);
        struct timespec ts = {.tv_sec = 1, .tv_nsec = 0};
        nanosleep(&ts, NULL);
        /* quiet but for the last try: the WARN above says it retries; one ERROR per second for
         * up to 30 s said nothing more (a supervisor's restart loop filled logs with them) */
        rc = do_mount_ex(s, MOUNT_TIMEOUT_MS, i + 1 < MOUNT_EXISTS_RETRIES);
    }
    if (rc != KVP_OK)
        goto fail;
    if (pthread_create(&s->hb_thread, NULL, hb_main, s) != 0) {
        rc = KVP_ERR_NOMEM;
        goto fail_mounted;
    }
    s->hb_started = true;
    if (kvp_mover_start(&s->mover, s->ms, &s->id, s->base, s->size, s->actor, s->hooks.n_token_keys > 0) != KVP_OK)
        kvp_log_warn(s->actor, "mover did not start: replicas here cannot be moved by a drain");
    *out = s;
    return KVP_OK;

fail_mounted:;
    Kvp__Request req;
    Kvp__UnmountSegmentReq um;
    kvp__request__init(&req);
    kvp__unmount_segment_req__init(&um);
    um.segment_id = atomic_load(&s->id);
    req.body_case = KVP__REQUEST__BODY_UNMOUNT;
    req.unmount = &um;
    Kvp__Response *resp = NULL;
    call(s, &req, UNMOUNT_TIMEOUT_MS, &resp);
    kvp_msession_response_free(resp);
    if (s->hooks.on_mount)
        s->hooks.on_mount(s->hooks.ctx, atomic_load(&s->id), 0, NULL, 0);
fail:
    segment_free(s);
    return rc;
}

uint32_t kvp_segment_id(const struct kvp_segment *s)
{
    return s ? atomic_load_explicit(&((struct kvp_segment *)s)->id, memory_order_relaxed) : 0;
}

const char *kvp_segment_name(const struct kvp_segment *s) { return s ? s->name : ""; }

void kvp_segment_stats(struct kvp_segment *s, struct kvp_segment_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!s)
        return;
    out->segment_id = atomic_load_explicit(&s->id, memory_order_relaxed);
    out->size_bytes = s->size;
    out->mounts = atomic_load_explicit(&s->mounts, memory_order_relaxed);
    out->mount_failures = atomic_load_explicit(&s->mount_failures, memory_order_relaxed);
    kvp_seg_server_stats(s->srv, &out->server);
}
const char *kvp_segment_endpoint(const struct kvp_segment *s) { return s ? s->endpoint : ""; }

/* Replicas the master counts on our segment: >= 0, -1 when the segment is not listed, or an
 * error code (< -1 is impossible: errors are returned through *err). *others (may be NULL) gets
 * the number of ACTIVE segments other than ours: with none, a drain cannot move anything. */
static int64_t objects_on_segment(struct kvp_segment *s, uint32_t id, int *err, int *others)
{
    if (others)
        *others = 0;
    Kvp__Request req;
    Kvp__ClusterStatusReq cs;
    kvp__request__init(&req);
    kvp__cluster_status_req__init(&cs);
    req.body_case = KVP__REQUEST__BODY_CLUSTER_STATUS;
    req.cluster_status = &cs;
    Kvp__Response *resp = NULL;
    *err = call(s, &req, 2000, &resp);
    if (*err != KVP_OK || resp->body_case != KVP__RESPONSE__BODY_CLUSTER_STATUS || !resp->cluster_status) {
        if (*err == KVP_OK)
            *err = KVP_ERR_MALFORMED;
        kvp_msession_response_free(resp);
        return 0;
    }
    json_error_t je;
    json_t *root = json_loads(resp->cluster_status->json, 0, &je);
    kvp_msession_response_free(resp);
    if (!root) {
        *err = KVP_ERR_MALFORMED;
        return 0;
    }
    int64_t n = -1;
    size_t i;
    json_t *seg;
    json_array_foreach(json_object_get(root, "segments"), i, seg)
    {
        json_t *jid = json_object_get(seg, "id");
        if (!json_is_integer(jid) || (uint32_t)json_integer_value(jid) != id) {
            const char *st = json_string_value(json_object_get(seg, "state"));
            if (others && st && strcmp(st, "ACTIVE") == 0)
                (*others)++;
            continue;
        }
        json_t *o = json_object_get(seg, "objects");
        n = json_is_integer(o) ? (int64_t)json_integer_value(o) : 0;
    }
    json_decref(root);
    return n;
}

/* The leader's drain/repair counters (status "repair"), for the drain timeout report. */
static void drain_report(struct kvp_segment *s, uint32_t id, int64_t left)
{
    Kvp__Request req;
    Kvp__ClusterStatusReq cs;
    kvp__request__init(&req);
    kvp__cluster_status_req__init(&cs);
    req.body_case = KVP__REQUEST__BODY_CLUSTER_STATUS;
    req.cluster_status = &cs;
    Kvp__Response *resp = NULL;
    json_t *root = NULL;
    if (call(s, &req, 2000, &resp) == KVP_OK && resp->body_case == KVP__RESPONSE__BODY_CLUSTER_STATUS &&
        resp->cluster_status) {
        json_error_t je;
        root = json_loads(resp->cluster_status->json, 0, &je);
    }
    kvp_msession_response_free(resp);
    json_t *rep = json_object_get(root, "repair");
    long long only = (long long)json_integer_value(json_object_get(rep, "only_on_draining"));
    long long nospace = (long long)json_integer_value(json_object_get(rep, "no_space"));
    long long bytes = (long long)json_integer_value(json_object_get(rep, "draining_bytes"));
    kvp_log_warn(s->actor, "segment %u: drain report: %ld replicas (%lld bytes on draining segments) not moved; "
                 "%lld objects have no copy elsewhere and are lost with this unmount; %lld objects found no room",
                 id, (long)left, bytes, only, nospace);
    json_decref(root);
}

int kvp_segment_drain(struct kvp_segment *s, uint32_t timeout_ms)
{
    int64_t left = 0;
    return kvp_segment_drain_left(s, timeout_ms, false, &left);
}

int kvp_segment_drain_left(struct kvp_segment *s, uint32_t timeout_ms, bool stop_when_alone, int64_t *left)
{
    if (left)
        *left = 0;
    if (!s)
        return KVP_ERR_INVALID;
    uint32_t id = kvp_segment_id(s);
    if (id == 0)
        return KVP_ERR_NOT_FOUND;
    /* A draining segment takes no new data: populating the rest of its region is wasted work.
     * Only the flag: the thread is joined where it always is, before the unmap. */
    if (s->prefault_started)
        atomic_store(&s->prefault_stop, true);
    uint64_t deadline = kvp_clock_now_ms() + timeout_ms;
    Kvp__Request req;
    Kvp__DrainSegmentReq d;
    kvp__request__init(&req);
    kvp__drain_segment_req__init(&d);
    d.segment_id = id;
    req.body_case = KVP__REQUEST__BODY_DRAIN;
    req.drain = &d;
    Kvp__Response *resp = NULL;
    int rc = call(s, &req, timeout_ms ? timeout_ms : 5000, &resp);
    kvp_msession_response_free(resp);
    if (rc != KVP_OK) {
        kvp_log_error(s->actor, "segment %u: drain request: %s", id, kvp_errname(rc));
        if (left)
            *left = -1; /* the master never counted this segment's replicas: unknown, not 0 */
        return rc;
    }
    kvp_log_info(s->actor, "segment %u: draining (waiting up to %u ms for its replicas to move)", id,
                 timeout_ms);
    int64_t last = -2;
    for (;;) {
        int err = KVP_OK, others = 0;
        int64_t n = objects_on_segment(s, id, &err, &others);
        if (err == KVP_OK && left)
            *left = n > 0 ? n : 0;
        if (err == KVP_OK && n <= 0) {
            kvp_log_info(s->actor, "segment %u: drained (%s)", id, n < 0 ? "no longer listed" : "0 objects");
            return KVP_OK;
        }
        if (err == KVP_OK && n != last) {
            kvp_log_info(s->actor, "segment %u: drain: %ld replicas left", id, (long)n);
            last = n;
        }
        if (err == KVP_OK && stop_when_alone && others == 0) {
            kvp_log_warn(s->actor, "segment %u: drain: no other ACTIVE segment: %ld replicas cannot move", id,
                         (long)n);
            return KVP_ERR_NO_SPACE;
        }
        uint64_t now = kvp_clock_now_ms();
        if (now >= deadline) {
            kvp_log_warn(s->actor, "segment %u: drain timed out after %u ms: %ld replicas still here; objects "
                         "whose only copy is here are lost when it unmounts (kvpoolctl status: 'repair')", id,
                         timeout_ms, (long)last);
            drain_report(s, id, last);
            return KVP_ERR_TIMEOUT;
        }
        uint64_t left = deadline - now;
        if (wait_stop(s, left < DRAIN_POLL_MS ? (uint32_t)left : DRAIN_POLL_MS))
            return KVP_ERR_CLOSED;
    }
}

void kvp_segment_stop(struct kvp_segment **sp)
{
    if (!sp || !*sp)
        return;
    struct kvp_segment *s = *sp;
    *sp = NULL;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->hb_started)
        pthread_join(s->hb_thread, NULL);
    kvp_mover_stop(&s->mover);
    uint32_t id = atomic_load(&s->id);
    kvp_seg_server_set_id(s->srv, 0);
    if (id) {
        Kvp__Request req;
        Kvp__UnmountSegmentReq um;
        kvp__request__init(&req);
        kvp__unmount_segment_req__init(&um);
        um.segment_id = id;
        req.body_case = KVP__REQUEST__BODY_UNMOUNT;
        req.unmount = &um;
        Kvp__Response *resp = NULL;
        int rc = call(s, &req, UNMOUNT_TIMEOUT_MS, &resp);
        kvp_msession_response_free(resp);
        if (rc == KVP_OK)
            kvp_log_info(s->actor, "segment %u: unmounted", id);
        else
            kvp_log_warn(s->actor, "segment %u: unmount: %s (the master will declare it lost)", id,
                         kvp_errname(rc));
        /* The region goes away below: the owner unregisters it from its local transport now. */
        if (s->hooks.on_mount)
            s->hooks.on_mount(s->hooks.ctx, id, 0, NULL, 0);
    }
    segment_free(s);
}
