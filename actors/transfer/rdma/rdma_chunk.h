/*
 * rdma_chunk.h — memory registered in chunks, and slices that never cross a chunk
 * (../shared/design/rdma.md §0.6, §1.2; issue 20 item 3).
 *
 * A device cannot register more than `max_mr_size` in one MR (eRDMA: 64 GiB; some devices
 * silently truncate, then fail past the edge with REM_ACCESS_ERR), and MRs above ~4 GiB read
 * slower on mlx5 with the IOMMU on. So a segment registers its region as chunks of
 * min(max_mr_size, 4 GiB) rounded down to the page size, and a slice that would cross a chunk
 * edge (on either side: the local buffer's chunks or the remote segment's) is split there,
 * because one WR names one lkey and one rkey (Mooncake PR #3198: a straddling slice fails).
 *
 * A region's chunk table {base, len, lkey, rkey} is what a segment publishes (rkeys) and what a
 * client keeps for its registered buffers (lkeys); lookups are binary searches. The table for a
 * remote segment is built from the handshake without MRs (mr NULL).
 *
 * Single-threaded; no clock. Registration goes through the verbs ops table and may take long
 * for large regions (it pins pages): callers run it off the data path (mount, register_buffer).
 */
#ifndef KVP_XFER_RDMA_CHUNK_H
#define KVP_XFER_RDMA_CHUNK_H

#include <stddef.h>
#include <stdint.h>

#include "actors/transfer/rdma/verbs_ops.h"

#define KVP_RDMA_CHUNK_MAX_BYTES (4ull << 30)

struct kvp_rdma_chunk {
    uint64_t base;       /* address of the chunk's first byte (iova == virtual address) */
    uint64_t len;        /* bytes */
    uint32_t lkey, rkey;
    struct ibv_mr *mr;   /* owned when the region registered it; NULL for a remote table */
};

struct kvp_rdma_region {
    uint64_t base, len;
    struct kvp_rdma_chunk *chunks; /* n of them, ascending and contiguous; owned */
    size_t n;
};

/**
 * The chunk size for a device: min(max_mr_size, KVP_RDMA_CHUNK_MAX_BYTES) rounded down to a
 * multiple of page_bytes (a power of two). Returns KVP_OK, or KVP_ERR_INVALID (logged) when
 * page_bytes is not a power of two or max_mr_size < page_bytes.
 */
int kvp_rdma_chunk_bytes(uint64_t max_mr_size, uint64_t page_bytes, uint64_t *out);

/**
 * Register [base, base+len) through ops/pd as ceil(len / chunk_bytes) MRs with `access`, into
 * *out (which the caller then owns; release with kvp_rdma_region_deregister). On any failure the
 * chunks registered so far are deregistered, *out is left empty, and the error is logged with
 * the failing chunk and errno: KVP_ERR_NOMEM (ENOMEM: memlock limit, or no memory),
 * KVP_ERR_INVALID (bad arguments, EINVAL from the device: e.g. chunk_bytes > max_mr_size),
 * KVP_ERR_IO (any other errno).
 */
int kvp_rdma_region_register(const struct kvp_verbs_ops *ops, struct ibv_pd *pd, void *base,
                             uint64_t len, uint64_t chunk_bytes, int access,
                             struct kvp_rdma_region *out);

/**
 * Build a region from a chunk table received from a peer: n entries copied (mr NULL). The
 * entries must be ascending, contiguous and non-empty, else KVP_ERR_INVALID (logged: it came
 * over the wire). KVP_ERR_NOMEM. Release with kvp_rdma_region_deregister (no verbs calls then).
 */
int kvp_rdma_region_from_table(const struct kvp_rdma_chunk *tab, size_t n,
                               struct kvp_rdma_region *out);

/** Deregister the region's MRs (if it owns any) and free its table; r may be empty. ops may be
 *  NULL for a remote table. Errors of dereg_mr are logged, not returned. */
void kvp_rdma_region_deregister(const struct kvp_verbs_ops *ops, struct kvp_rdma_region *r);

/** The chunk holding address addr, or NULL when addr is outside the region. O(log n). */
const struct kvp_rdma_chunk *kvp_rdma_region_find(const struct kvp_rdma_region *r, uint64_t addr);

/* One WR's worth: a piece that lies in one local and one remote chunk. */
struct kvp_rdma_span {
    uint64_t laddr, raddr;
    uint32_t len;
    uint32_t lkey, rkey;
};

/**
 * Split a transfer of len bytes between local address laddr (in region `local`) and remote
 * address raddr (in region `remote`) into spans of at most slice_bytes that never cross a chunk
 * edge on either side. Writes up to cap spans to out and the number needed to *n (so a call
 * with cap 0 sizes the array). Returns KVP_OK; KVP_ERR_INVALID (logged) when a range is outside
 * its region, len is 0, or slice_bytes is 0 or above 2 GiB (one SGE length is 32-bit);
 * KVP_ERR_BUSY when cap < *n (nothing useful written past cap).
 */
int kvp_rdma_spans(const struct kvp_rdma_region *local, uint64_t laddr,
                   const struct kvp_rdma_region *remote, uint64_t raddr, uint64_t len,
                   uint64_t slice_bytes, struct kvp_rdma_span *out, size_t cap, size_t *n);

#endif
