/*
 * rdma_wrid.h — generation-checked wr_id slots (../shared/design/rdma.md §0.3, §1.3).
 *
 * A work request's wr_id is never a pointer (Mooncake's raw Slice* is the use-after-free of its
 * PR #3508): it is a slot handle `slot << 24 | gen24`. Each slot has a 24-bit generation that
 * is bumped when the slot is freed, so a completion that arrives after its slot was reused (a
 * late CQE of a destroyed, wedged QP; an injected bad wr_id) does not match and is counted as
 * stale and dropped instead of being taken for the new owner's. Generation 0 is never issued,
 * so wr_id 0 is never valid.
 *
 * Pure data structure: no verbs calls, no clock, no locks (the owning transfer actor is the
 * only user).
 */
#ifndef KVP_XFER_RDMA_WRID_H
#define KVP_XFER_RDMA_WRID_H

#include <stdbool.h>
#include <stdint.h>

#define KVP_RDMA_WRID_GEN_BITS 24u
#define KVP_RDMA_WRID_GEN_MASK ((1u << KVP_RDMA_WRID_GEN_BITS) - 1u)
/* Most slots one table may hold (the slot index must fit in 40 bits; kvpool needs far fewer). */
#define KVP_RDMA_WRID_MAX_SLOTS (1u << 24)

struct kvp_rdma_slot {
    uint32_t gen;   /* current generation, 1..2^24-1 */
    bool in_use;
    void *owner;    /* who posted it (the transport's QP record); not owned */
    uint64_t cookie;/* the owner's value (slice index, batch id); opaque here */
};

struct kvp_rdma_slots {
    struct kvp_rdma_slot *v; /* n slots, owned */
    uint32_t n;
    uint32_t *free_idx;      /* stack of free slot indexes, owned */
    uint32_t n_free;
    uint64_t stale;          /* lookups that matched no live slot (stale generation, bad id) */
};

/** Encode a wr_id from a slot index and a generation (gen is masked to 24 bits). */
static inline uint64_t kvp_rdma_wrid_encode(uint32_t slot, uint32_t gen)
{
    return ((uint64_t)slot << KVP_RDMA_WRID_GEN_BITS) | (gen & KVP_RDMA_WRID_GEN_MASK);
}
static inline uint32_t kvp_rdma_wrid_slot(uint64_t wr_id)
{
    return (uint32_t)(wr_id >> KVP_RDMA_WRID_GEN_BITS);
}
static inline uint32_t kvp_rdma_wrid_gen(uint64_t wr_id)
{
    return (uint32_t)(wr_id & KVP_RDMA_WRID_GEN_MASK);
}

/**
 * Initialise a table of n slots (1..KVP_RDMA_WRID_MAX_SLOTS). `first_gen` is the generation
 * every slot starts at (1..2^24-1; 0 means 1). Keep ONE table per transfer actor for its whole
 * life, across reconnects: a slot's generation then only moves forward, so a wr_id of an old
 * QP is never issued again until that slot has been reused 2^24 times. A fresh table per
 * reconnect would hand out the old wr_ids again (slot 0, generation 2, ...): the reconnect
 * test found exactly that. Errors: KVP_ERR_INVALID (s NULL, n out of range; logged),
 * KVP_ERR_NOMEM. Release with kvp_rdma_slots_fini.
 */
int kvp_rdma_slots_init(struct kvp_rdma_slots *s, uint32_t n, uint32_t first_gen);
/** Free the table's memory (s may be NULL). Slots still in use are simply forgotten. */
void kvp_rdma_slots_fini(struct kvp_rdma_slots *s);

/**
 * Take a free slot for a WR posted by `owner` and return its wr_id in *wr_id.
 * Errors: KVP_ERR_BUSY when every slot is in use (the caller keeps the slice pending),
 * KVP_ERR_INVALID when s or wr_id is NULL.
 */
int kvp_rdma_slot_alloc(struct kvp_rdma_slots *s, void *owner, uint64_t cookie, uint64_t *wr_id);

/**
 * The live slot a completion's wr_id names, or NULL when the index is out of range, the slot is
 * free, or the generation differs (then s->stale is incremented). Never dereferences wr_id.
 */
struct kvp_rdma_slot *kvp_rdma_slot_lookup(struct kvp_rdma_slots *s, uint64_t wr_id);

/**
 * Free the slot of a wr_id that kvp_rdma_slot_lookup accepted, bumping its generation (24-bit,
 * wrapping past 0 to 1). Returns KVP_OK, or KVP_ERR_NOT_FOUND (stale or bad wr_id; counted,
 * nothing freed).
 */
int kvp_rdma_slot_free(struct kvp_rdma_slots *s, uint64_t wr_id);

/** Slots in use. */
static inline uint32_t kvp_rdma_slots_used(const struct kvp_rdma_slots *s)
{
    return s->n - s->n_free;
}

#endif
