/*
 * seg_server.h — the TCP data plane of one segment: serves READ and WRITE frames
 * (wire/envelope.h) for a memory region. Used by kvpool-segment and by embedded clients.
 *
 * A request is served only when its segment_id equals the server's current id and
 * [offset, offset+length) lies inside the region; otherwise the reply carries KVP_ERR_INVALID
 * (bounds) or KVP_ERR_NOT_FOUND (wrong id: a restarted or remounted segment), and for WRITE the
 * payload is drained without touching the region.
 */
#ifndef KVP_SEG_SERVER_H
#define KVP_SEG_SERVER_H

#include <stdint.h>

struct kvp_seg_server;

/**
 * Listen on host:port (port 0 = ephemeral; IPv4, IPv6, names) and serve [base, base+size).
 * The region stays owned by the caller and must outlive the server.
 * Errors: KVP_ERR_BUSY (the port is in use: nothing logged, the caller retries and logs; see
 * kvp_retry_start), KVP_ERR_IO (other bind errors), KVP_ERR_INVALID, KVP_ERR_NOMEM.
 */
int kvp_seg_server_start(struct kvp_seg_server **out, const char *host, uint32_t port, void *base,
                         uint64_t size);
/** The bound port. */
uint32_t kvp_seg_server_port(const struct kvp_seg_server *s);
/** Set the segment id requests must carry (0 = reject all until mounted). Thread-safe. */
void kvp_seg_server_set_id(struct kvp_seg_server *s, uint32_t segment_id);
/** Stop serving, close every connection, join threads, free. Accepts NULL; sets *s NULL. */
void kvp_seg_server_stop(struct kvp_seg_server **s);

#endif
