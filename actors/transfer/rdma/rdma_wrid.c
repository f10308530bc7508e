/* rdma_wrid.c — generation-checked wr_id slots; see rdma_wrid.h. */
#include "actors/transfer/rdma/rdma_wrid.h"

#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "runtime/log.h"

int kvp_rdma_slots_init(struct kvp_rdma_slots *s, uint32_t n, uint32_t first_gen)
{
    if (!s) {
        kvp_log_error("rdma", "wr_id slots: no table given");
        return KVP_ERR_INVALID;
    }
    if (n == 0 || n > KVP_RDMA_WRID_MAX_SLOTS) {
        kvp_log_error("rdma", "wr_id slots: bad table size %u (1..%u)", n, KVP_RDMA_WRID_MAX_SLOTS);
        return KVP_ERR_INVALID;
    }
    memset(s, 0, sizeof *s);
    s->v = calloc(n, sizeof *s->v);
    s->free_idx = malloc((size_t)n * sizeof *s->free_idx);
    if (!s->v || !s->free_idx) {
        free(s->v);
        free(s->free_idx);
        memset(s, 0, sizeof *s);
        return KVP_ERR_NOMEM;
    }
    first_gen &= KVP_RDMA_WRID_GEN_MASK;
    if (first_gen == 0)
        first_gen = 1;
    s->n = n;
    for (uint32_t i = 0; i < n; i++) {
        s->v[i].gen = first_gen;
        s->free_idx[i] = n - 1 - i; /* pop order 0, 1, 2, ... */
    }
    s->n_free = n;
    return KVP_OK;
}

void kvp_rdma_slots_fini(struct kvp_rdma_slots *s)
{
    if (!s)
        return;
    free(s->v);
    free(s->free_idx);
    memset(s, 0, sizeof *s);
}

int kvp_rdma_slot_alloc(struct kvp_rdma_slots *s, void *owner, uint64_t cookie, uint64_t *wr_id)
{
    if (!s || !wr_id)
        return KVP_ERR_INVALID;
    if (s->n_free == 0)
        return KVP_ERR_BUSY;
    uint32_t i = s->free_idx[--s->n_free];
    struct kvp_rdma_slot *sl = &s->v[i];
    sl->in_use = true;
    sl->owner = owner;
    sl->cookie = cookie;
    *wr_id = kvp_rdma_wrid_encode(i, sl->gen);
    return KVP_OK;
}

struct kvp_rdma_slot *kvp_rdma_slot_lookup(struct kvp_rdma_slots *s, uint64_t wr_id)
{
    uint64_t idx = wr_id >> KVP_RDMA_WRID_GEN_BITS;
    if (idx >= s->n || !s->v[idx].in_use || s->v[idx].gen != kvp_rdma_wrid_gen(wr_id)) {
        s->stale++;
        return NULL;
    }
    return &s->v[idx];
}

int kvp_rdma_slot_free(struct kvp_rdma_slots *s, uint64_t wr_id)
{
    struct kvp_rdma_slot *sl = kvp_rdma_slot_lookup(s, wr_id);
    if (!sl)
        return KVP_ERR_NOT_FOUND;
    sl->in_use = false;
    sl->owner = NULL;
    sl->cookie = 0;
    sl->gen = (sl->gen + 1) & KVP_RDMA_WRID_GEN_MASK;
    if (sl->gen == 0)
        sl->gen = 1;
    s->free_idx[s->n_free++] = (uint32_t)(sl - s->v);
    return KVP_OK;
}
