/*
 * segment_internal.h — helpers shared by the segment runtime files (not a public interface).
 */
#ifndef KVP_SEGMENT_INTERNAL_H
#define KVP_SEGMENT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Largest number of addresses one server listens on (a host name may resolve to several). */
#define KVP_SEG_MAX_LISTEN 8

/* Most connections one server serves at once; more are refused with a WARN (at most one line a
 * second). An idle connection costs a small struct and its kernel socket, no thread. */
#define KVP_SEG_MAX_CONNS 16384u

/* Event loops (threaded runtime actors) of one server; connections are spread round robin. */
#define KVP_SEG_LOOPS 2

/* Bytes of answers one connection may have queued and not yet taken by its peer (READ payloads
 * are not copied: they are the region's bytes); past it, or past 64 answers, the server reads no
 * more of that connection's requests until the peer takes them. */
#define KVP_SEG_CONN_INFLIGHT_BYTES (16u << 20)

/* A connection in the middle of a frame (a partial request, a WRITE payload, answers not taken)
 * that makes no progress for this long is dropped; checked every KVP_SEG_SWEEP_MS. */
#define KVP_SEG_STALL_MS 30000u
#define KVP_SEG_SWEEP_MS 1000u

/* After accept fails for lack of descriptors or memory, accepting resumes after this long. */
#define KVP_SEG_ACCEPT_RETRY_MS 100u

/* Bytes of the per-loop scratch buffer that drains the payload of a refused or late WRITE. */
#define KVP_SEG_SCRATCH_BYTES (64u * 1024u)

struct kvp_seg_server;
/** Tests: make every loop drop its stalled connections now, as if the clock were ahead_ms ahead
 * (by message; the test then sees the stalled connections closed). */
void kvp_seg_server_sweep(struct kvp_seg_server *s, uint64_t ahead_ms);

/**
 * Copy `host` into buf without the brackets of "[v6]" / "[fe80::1%eth0]". Returns 0, or -1 when
 * it does not fit or the brackets are unbalanced.
 */
int kvp_seg_strip_brackets(const char *host, char *buf, size_t cap);

/** "host:port", bracketing an IPv6 host ("[::1]:7000"). Returns snprintf's result. */
int kvp_seg_format_endpoint(char *buf, size_t cap, const char *host, uint32_t port);

/**
 * segment_prefault's memory guard: of `want` more bytes, how many may be populated given the
 * text of /proc/meminfo, keeping MemAvailable above max(MemTotal / 10, 512 MiB); 0: stop. Text
 * without both MemTotal and MemAvailable: `want` (no guard).
 */
uint64_t kvp_seg_prefault_allow(const char *meminfo, uint64_t want);

/** MemTotal + SwapTotal in bytes from the text of /proc/meminfo; 0 when MemTotal is missing. A
 * normal-page segment larger than this WARNs at start (the pool would promise bytes the host
 * cannot hold; writes past them run the OOM killer). */
uint64_t kvp_seg_host_memory(const char *meminfo);

/** The tightest memory cgroup limit of a process (memcg.c): the one with the least room. */
struct kvp_seg_memcg {
    bool found;      /* some cgroup of the process has a memory limit */
    uint64_t limit;  /* bytes: memory.max (v2) or memory.limit_in_bytes (v1) */
    uint64_t usage;  /* bytes: memory.current or memory.usage_in_bytes, page cache included */
    char path[512];  /* the cgroup directory it was read from (log lines) */
};

/**
 * Read the memory limits of the cgroups listed in `proc_cgroup` (the text of /proc/self/cgroup)
 * and of all their ancestors, under the cgroup mount `root` ("/sys/fs/cgroup"; tests pass a
 * directory of their own): v2 under root and root/unified, v1 under root/memory (memcg.c says
 * which files). Fills *out with the one with the least room (limit - usage). Returns out->found;
 * unreadable or missing files are skipped (no limit known).
 */
bool kvp_seg_memcg_read(const char *proc_cgroup, const char *root, struct kvp_seg_memcg *out);

/**
 * segment_prefault's cgroup guard: of `want` more bytes, how many may be populated keeping
 * limit - usage above max(limit / 10, 512 MiB), the host guard's rule applied to the cgroup;
 * 0: stop. `want` when m is NULL or has no limit.
 */
uint64_t kvp_seg_memcg_allow(const struct kvp_seg_memcg *m, uint64_t want);

#endif
