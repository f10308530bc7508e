/*
 * segment_internal.h — helpers shared by the segment runtime files (not a public interface).
 */
#ifndef KVP_SEGMENT_INTERNAL_H
#define KVP_SEGMENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* Largest number of addresses one server listens on (a host name may resolve to several). */
#define KVP_SEG_MAX_LISTEN 8

/* Most connections one server serves at once (one thread each); more are refused with a WARN. */
#define KVP_SEG_MAX_CONNS 4096u

/* Stack of a connection thread (it needs little: a 40-byte header and a few locals). */
#define KVP_SEG_THREAD_STACK_BYTES (512u * 1024u)

/* Bytes of the per-connection scratch buffer that drains the payload of a refused WRITE. */
#define KVP_SEG_SCRATCH_BYTES (64u * 1024u)

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

#endif
