/*
 * alloc.h — offset allocator for one segment: hands out KVP_ALLOC_ALIGN-aligned extents of
 * [0, capacity). Pure: no I/O, no clock, no randomness (treap priorities come from a counter
 * hashed with splitmix64, so the same call sequence builds the same tree on every Raft member).
 *
 * Free extents live in one treap ordered by offset; every node also holds the largest extent
 * length in its subtree. That single tree gives, in O(log n) expected time:
 *   - first fit (the lowest-offset free extent that is long enough),
 *   - coalescing on free (the neighbours by offset),
 *   - the largest free extent (the root's subtree maximum).
 * Allocated extents are not tracked here: the owner (the FSM) remembers offset and length and
 * gives both back to kvp_alloc_free(). Free extents are always fully coalesced (no two touch).
 *
 * Lengths are rounded up to KVP_ALLOC_ALIGN by every call; capacity is the segment size rounded
 * down to KVP_ALLOC_ALIGN (the tail of a segment that is not a multiple of 64 is never used).
 * Not thread-safe: one owner.
 */
#ifndef KVP_MASTER_ALLOC_H
#define KVP_MASTER_ALLOC_H

#include <stdint.h>

#define KVP_ALLOC_ALIGN 64u

struct kvp_alloc_node;

struct kvp_alloc {
    struct kvp_alloc_node *root; /* treap of free extents by offset */
    uint64_t capacity;           /* bytes managed, a multiple of KVP_ALLOC_ALIGN */
    uint64_t free_bytes;         /* sum of free extent lengths */
    uint64_t n_free;             /* number of free extents (fragmentation) */
    uint64_t seq;                /* priority counter (deterministic) */
};

/** Round len up to KVP_ALLOC_ALIGN; 0 when len is 0 or the result would overflow. */
uint64_t kvp_alloc_round(uint64_t len);

/**
 * Start with [0, size rounded down to KVP_ALLOC_ALIGN) entirely free.
 * Returns KVP_OK or KVP_ERR_NOMEM (then *a is empty and fini is still safe).
 */
int kvp_alloc_init(struct kvp_alloc *a, uint64_t size);

/** Start with capacity (size rounded down) and nothing free (used by restore with _free). */
void kvp_alloc_init_full(struct kvp_alloc *a, uint64_t size);

/** Release every node. Safe on a zeroed or already finished allocator. */
void kvp_alloc_fini(struct kvp_alloc *a);

/**
 * Allocate len bytes (rounded up) first fit. *off receives the offset.
 * Returns KVP_OK, KVP_ERR_INVALID (len 0 or overflow), KVP_ERR_NO_SPACE (no free extent that
 * long; the allocator is unchanged).
 */
int kvp_alloc_alloc(struct kvp_alloc *a, uint64_t len, uint64_t *off);

/**
 * Give [off, off + len rounded up) back; it is merged with touching free extents.
 * Returns KVP_OK, KVP_ERR_INVALID (misaligned, out of range, or overlapping free space:
 * the allocator is unchanged), KVP_ERR_NOMEM.
 */
int kvp_alloc_free(struct kvp_alloc *a, uint64_t off, uint64_t len);

/**
 * Mark [off, off + len rounded up) used; it must lie inside one free extent (restore uses
 * this to rebuild an allocator from recorded extents). Returns KVP_OK, KVP_ERR_INVALID (not
 * entirely free, misaligned, out of range: unchanged), KVP_ERR_NOMEM.
 */
int kvp_alloc_reserve(struct kvp_alloc *a, uint64_t off, uint64_t len);

/** Length of the largest free extent (0 when none). */
uint64_t kvp_alloc_largest_free(const struct kvp_alloc *a);

/** Visit the free extents in offset order. */
void kvp_alloc_foreach_free(const struct kvp_alloc *a,
                            void (*cb)(void *ctx, uint64_t off, uint64_t len), void *ctx);

/**
 * Check every invariant (order, alignment, bounds, coalesced, subtree maxima, heap order,
 * free_bytes and n_free). Returns 0 when all hold, else a negative line-specific code. Tests.
 */
int kvp_alloc_check(const struct kvp_alloc *a);

#endif
