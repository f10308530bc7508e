/*
 * segment.c — one contributed segment: region (mmap), data-plane server, mount, heartbeat,
 * drain, unmount. See segment.h and docs/data-plane.md.
 *
 * Runs on: the caller of kvp_segment_start/drain/stop (the first mount, the drain, the unmount:
 * blocking calls of this API), and the segment's actors under its supervisor (segment_state.h):
 * heartbeat (seg_heartbeat.c), mover (mover.c), prefault (below). No lock; the shared atomics
 * are described in segment_state.h.
 */
#define _GNU_SOURCE
#include "actors/segment/segment.h"
#include "actors/segment/seg_rdma.h"

#include <errno.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "actors/segment/mover.h"
#include "actors/segment/seg_server.h"
#include "actors/segment/segment_internal.h"
#include "actors/segment/segment_state.h"
#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "runtime/proc.h"
#include "runtime/supervisor.h"

#define HUGE_PAGE_BYTES (2ull << 20)
#define MOUNT_TIMEOUT_MS 10000u
/* kvpool-segment at start, no master answering (hooks.mount_retry): each try waits this long
 * for a leader, then the next one comes after a backoff from 1 s doubling to 10 s. */
#define MOUNT_RETRY_TRY_MS 2000u
#define MOUNT_RETRY_FIRST_MS 1000u
#define MOUNT_RETRY_MAX_MS 10000u
#define UNMOUNT_TIMEOUT_MS 3000u
#define DRAIN_POLL_MS 200u

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

void kvp_seg_mount_req(struct kvp_segment *s, Kvp__Request *req, Kvp__MountSegmentReq *m)
{
    kvp__request__init(req);
    kvp__mount_segment_req__init(m);
    m->name = s->name;
    m->host = s->cfg.local_hostname;
    m->endpoint = s->endpoint;
    m->size = s->size;
    m->owner_pid = (uint64_t)getpid();
    req->body_case = KVP__REQUEST__BODY_MOUNT;
    req->mount = m;
}

int kvp_seg_mount_apply(struct kvp_segment *s, int rc, Kvp__Response *resp, bool quiet, bool post)
{
    if (rc == KVP_OK && !resp)
        rc = KVP_ERR_MALFORMED;
    if (rc == KVP_OK)
        rc = resp->status;
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
    if (post) { /* the heartbeat actor: one-way (seg_heartbeat.c says why that is enough) */
        int e = kvp_seg_server_set_id_post(s->srv, id);
        if (e != KVP_OK)
            kvp_log_warn(s->actor, "segment %u: data plane: %s", id, kvp_errname(e));
    } else {
        kvp_seg_server_set_id(s->srv, id);
    }
    kvp_log_info(s->actor, "mounted as segment %u (%lu bytes, endpoint %s)", id, (unsigned long)s->size,
                 s->endpoint);
    if (s->hooks.on_mount)
        s->hooks.on_mount(s->hooks.ctx, old, id, s->base, s->size);
    return KVP_OK;
}

/* MountSegment, blocking (the start); on success the new id is stored and the server accepts
 * it. A failure is logged as ERROR unless `quiet` (the caller logs its own line). */
static int do_mount_ex(struct kvp_segment *s, uint32_t timeout_ms, bool quiet, uint64_t nonce)
{
    Kvp__Request req;
    Kvp__MountSegmentReq m;
    kvp_seg_mount_req(s, &req, &m);
    m.mount_nonce = nonce; /* 0: none */
    Kvp__Response *resp = NULL;
    int rc = kvp_msession_call(s->ms, &req, timeout_ms, &resp);
    return kvp_seg_mount_apply(s, rc, resp, quiet, false);
}

static int do_mount(struct kvp_segment *s, uint32_t timeout_ms)
{
    return do_mount_ex(s, timeout_ms, false, 0);
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
    /* Every try carries the same nonce: a try whose answer came after its window registered the
     * segment, and the master answers the next try with that registration rather than a second
     * one (which would mark the first LOST). */
    uint64_t nonce = 0;
    for (int i = 0; i < 4 && nonce == 0; i++)
        if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
            nonce = 0;
    if (nonce == 0) {
        /* getrandom refused (ENOSYS, a seccomp profile): a nonce from the clock, the pid and the
         * stack is unique enough for one host's mounts within the master's 60 s memory */
        nonce = kvp_clock_now_ms() * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)&nonce;
        if (nonce == 0)
            nonce = 1;
        kvp_log_warn(s->actor, "mount: getrandom failed (%s); the mount nonce comes from the clock and pid",
                     strerror(errno));
    }
    for (unsigned attempt = 1;; attempt++) {
        int rc = do_mount_ex(s, MOUNT_RETRY_TRY_MS, true, nonce);
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
enum { PF_MSG_STEP = 1 };

struct pf_state {
    struct kvp_segment *s;
    uint64_t t0;          /* ms: when it started */
    size_t done;          /* bytes populated */
    size_t allowed;       /* bytes below which memory was checked */
    bool populate;        /* MADV_POPULATE_WRITE works (else: touch page by page) */
    bool ended;           /* the closing line was logged */
    bool started;         /* init ran (a spawn that failed before it logs no closing line) */
    char why[768];        /* why it stopped early ("" = it did not) */
};

static void pf_log_end(struct pf_state *p)
{
    struct kvp_segment *s = p->s;
    p->ended = true;
    if (p->why[0])
        kvp_log_warn(s->actor, "prefault stopped after %zu of %zu bytes: %s (the rest faults on first write)",
                     p->done, s->map_bytes, p->why);
    else
        kvp_log_info(s->actor, "prefault: %zu of %zu bytes populated in %llu ms%s", p->done, s->map_bytes,
                     (unsigned long long)(kvp_clock_now_ms() - p->t0), p->populate ? "" : " (page by page)");
}

/* One chunk (PREFAULT_CHUNK_BYTES) per message: between two, the actor's mailbox runs, so a stop
 * (close drops the next PF_MSG_STEP) waits for one madvise call at most. */
static int pf_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct pf_state *p = kvp_rt_state(ctx);
    struct kvp_segment *s = p->s;
    if (msg->type != PF_MSG_STEP || p->ended)
        return KVP_OK;
    if (p->done >= s->map_bytes) {
        pf_log_end(p);
        return KVP_OK;
    }
    size_t n = s->map_bytes - p->done < PREFAULT_CHUNK_BYTES ? s->map_bytes - p->done : PREFAULT_CHUNK_BYTES;
    if (p->done + n > p->allowed) {
        uint64_t step = s->map_bytes - p->done < PREFAULT_MEMCHECK_BYTES ? s->map_bytes - p->done
                                                                        : PREFAULT_MEMCHECK_BYTES;
        if (prefault_allow(step, p->why, sizeof p->why) < step) {
            pf_log_end(p);
            return KVP_OK;
        }
        p->allowed = p->done + step;
    }
    uint8_t *at = (uint8_t *)s->base + p->done;
    bool again = false;
    if (p->populate && madvise(at, n, MADV_POPULATE_WRITE) != 0) {
        if (errno == EINTR) {
            again = true; /* the same chunk again */
        } else if (errno == EINVAL) {
            p->populate = false; /* kernel without it: touch below */
        } else {
            snprintf(p->why, sizeof p->why, "%s", strerror(errno));
            pf_log_end(p);
            return KVP_OK;
        }
    }
    if (!again) {
        if (!p->populate)
            for (size_t off = 0; off < n; off += 4096)
                __atomic_fetch_or(at + off, (uint8_t)0, __ATOMIC_RELAXED);
        p->done += n;
    }
    kvp_rt_send(kvp_rt_self(ctx), 0, PF_MSG_STEP, 0, NULL, NULL); /* CLOSED when stopping: fini logs */
    return KVP_OK;
}

static int pf_init(struct kvp_rt_ctx *ctx)
{
    ((struct pf_state *)kvp_rt_state(ctx))->started = true;
    return kvp_rt_send(kvp_rt_self(ctx), 0, PF_MSG_STEP, 0, NULL, NULL);
}

/* Stopped before the end (a drain, the segment's stop): the closing line as the thread had it. */
static void pf_fini(struct kvp_rt_ctx *ctx)
{
    struct pf_state *p = kvp_rt_state(ctx);
    if (!p->ended && p->started)
        pf_log_end(p);
    free(p);
}

int kvp_seg_prefault_spawn(void *arg, struct kvp_rt_actor *parent, struct kvp_rt_actor **out)
{
    struct kvp_segment *s = arg;
    struct pf_state *p = calloc(1, sizeof *p);
    if (!p)
        return KVP_ERR_NOMEM;
    p->s = s;
    p->t0 = kvp_clock_now_ms();
    p->populate = true;
    p->allowed = s->huge ? s->map_bytes : 0;
    struct kvp_rt_spec spec = {.name = "prefault", .init = pf_init, .handle = pf_handle, .fini = pf_fini,
                               .state = p};
    return kvp_rt_spawn(out, &spec, parent); /* owns p from here: any failure ran pf_fini */
}

static void prefault_start(struct kvp_segment *s)
{
    if (!s->cfg.segment_prefault)
        return;
    if (kvp_rt_sup_add(s->sup, "prefault", kvp_seg_prefault_spawn, s) != KVP_OK)
        kvp_log_warn(s->actor, "prefault actor not started: pages fault on first write");
}

static void segment_free(struct kvp_segment *s)
{
    kvp_rt_destroy(&s->sup); /* its children first (prefault, mover, heartbeat): before munmap */
    kvp_seg_server_stop(&s->srv);
    if (s->base)
        munmap(s->base, s->map_bytes);
    free(s);
}

/* The supervisor's last resort for a child failing again and again: a kvpool-segment daemon
 * stops (the default: SIGTERM, its drain-and-exit path); an embedded segment (a client's) never
 * stops its application: the child stays stopped, said at ERROR (without heartbeats the master
 * declares the segment lost and the client keeps working without it). */
static void embedded_give_up(void *arg, const char *child, int err)
{
    struct kvp_segment *s = arg;
    kvp_log_error(s->actor, "%s stays stopped (%s): this segment %s", child, kvp_errname(err),
                  strcmp(child, "heartbeat") == 0 ? "will be declared lost by the master"
                                                  : "keeps serving without it");
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
    if (strcmp(cfg->protocol, "rdma") == 0) { /* issue 20: also RDMA; TCP only without a device */
        struct kvp_seg_rdma_cfg rcfg = {.who = "segment", .devices = cfg->device_name,
                                        .gid_index = kvp_cfg_gid_index(cfg->gid_index)};
        (void)kvp_seg_server_rdma(s->srv, &rcfg); /* logged there when it fails */
    }
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
    /* The supervisor of the segment's actors: a failing child is restarted up to 3 times a
     * minute; then the daemon stops, an embedded segment goes on without it. */
    char supname[KVP_RT_NAME_MAX + 1];
    snprintf(supname, sizeof supname, "seg %s", s->name);
    struct kvp_rt_sup_policy pol = {.max_restarts = 3, .window_ms = 60000,
                                    .give_up = s->hooks.on_mount ? embedded_give_up : NULL, .give_up_arg = s};
    rc = kvp_rt_sup_new(&s->sup, supname, &pol);
    if (rc != KVP_OK)
        goto fail;
    prefault_start(s); /* after s->actor is final: the actor logs with it */
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
        rc = do_mount_ex(s, MOUNT_TIMEOUT_MS, i + 1 < MOUNT_EXISTS_RETRIES, 0);
    }
    if (rc != KVP_OK)
        goto fail;
    rc = kvp_rt_sup_add(s->sup, "heartbeat", kvp_seg_heartbeat_spawn, s);
    if (rc != KVP_OK)
        goto fail_mounted;
    if (kvp_rt_sup_add(s->sup, "mover", kvp_seg_mover_spawn, s) != KVP_OK)
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

/* The leader's ClusterStatus document (2 s): NULL with *err set (the call's error, or
 * KVP_ERR_MALFORMED for an answer without a parsable document). Free with json_decref. */
static json_t *cluster_status(struct kvp_segment *s, int *err)
{
    Kvp__Request req;
    Kvp__ClusterStatusReq cs;
    kvp__request__init(&req);
    kvp__cluster_status_req__init(&cs);
    req.body_case = KVP__REQUEST__BODY_CLUSTER_STATUS;
    req.cluster_status = &cs;
    Kvp__Response *resp = NULL;
    *err = call(s, &req, 2000, &resp);
    json_t *root = NULL;
    if (*err == KVP_OK && resp->body_case == KVP__RESPONSE__BODY_CLUSTER_STATUS && resp->cluster_status) {
        json_error_t je;
        root = json_loads(resp->cluster_status->json, 0, &je);
    }
    kvp_msession_response_free(resp);
    if (!root && *err == KVP_OK)
        *err = KVP_ERR_MALFORMED;
    return root;
}

/* Replicas the master counts on our segment: >= 0, -1 when the segment is not listed, or an
 * error code (< -1 is impossible: errors are returned through *err). *others (may be NULL) gets
 * the number of ACTIVE segments other than ours: with none, a drain cannot move anything. */
static int64_t objects_on_segment(struct kvp_segment *s, uint32_t id, int *err, int *others)
{
    if (others)
        *others = 0;
    json_t *root = cluster_status(s, err);
    if (!root)
        return 0;
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
    int err = KVP_OK;
    json_t *root = cluster_status(s, &err); /* NULL: the counters read 0 */
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
     * (NOT_FOUND: no prefault, or it ended already.) */
    if (s->cfg.segment_prefault)
        kvp_rt_sup_stop_child(s->sup, "prefault");
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
        uint32_t wait = left < DRAIN_POLL_MS ? (uint32_t)left : DRAIN_POLL_MS;
        struct timespec ts = {.tv_sec = wait / 1000, .tv_nsec = (long)(wait % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
}

void kvp_segment_stop(struct kvp_segment **sp)
{
    if (!sp || !*sp)
        return;
    struct kvp_segment *s = *sp;
    *sp = NULL;
    kvp_rt_destroy(&s->sup); /* heartbeat, mover and prefault stop (their finis ran) */
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

int kvp_seg_mover_spawn(void *arg, struct kvp_rt_actor *parent, struct kvp_rt_actor **out)
{
    struct kvp_segment *s = arg;
    struct kvp_mover_cfg mc = {.ms = s->ms, .id = &s->id, .base = s->base, .size = s->size, .actor = s->actor,
                              .tokens = s->hooks.n_token_keys > 0};
    return kvp_mover_spawn(out, parent, &mc);
}
