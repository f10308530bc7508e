/*
 * xfer_local.c — the local transport of the transfer engine: segments registered in this process
 * (kvp_xfer_register_local) are read and written with memcpy in the caller's thread, under the
 * engine's local_lock (read), which kvp_xfer_unregister_local takes for writing: so unregister
 * waits for copies in progress (docs/data-plane.md, "Local transport").
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "actors/transfer/fault.h"
#include "actors/transfer/transfer_internal.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define ACTOR "xfer"

static int register_local_one(struct kvp_xfer_engine *e, uint32_t segment_id, void *base, uint64_t size);
static int unregister_local_one(struct kvp_xfer_engine *e, uint32_t segment_id);

/* On this engine and every sibling: a batch sees the same local segments whichever runs it. */
int kvp_xfer_register_local(struct kvp_xfer_engine *e, uint32_t segment_id, void *base, uint64_t size)
{
    if (!e || segment_id == 0 || !base || size == 0)
        return KVP_ERR_INVALID;
    int rc = register_local_one(e, segment_id, base, size);
    for (unsigned i = 0; i < e->n_sib && rc == KVP_OK; i++)
        rc = register_local_one(e->sib[i], segment_id, base, size);
    if (rc != KVP_OK)
        kvp_xfer_unregister_local(e, segment_id);
    return rc;
}

int kvp_xfer_unregister_local(struct kvp_xfer_engine *e, uint32_t segment_id)
{
    if (!e)
        return KVP_ERR_INVALID;
    int rc = unregister_local_one(e, segment_id);
    for (unsigned i = 0; i < e->n_sib; i++)
        unregister_local_one(e->sib[i], segment_id);
    return rc;
}

static int register_local_one(struct kvp_xfer_engine *e, uint32_t segment_id, void *base, uint64_t size)
{
    pthread_rwlock_wrlock(&e->local_lock);
    int rc = KVP_OK;
    size_t i;
    for (i = 0; i < e->n_locals; i++)
        if (e->locals[i].segment_id == segment_id)
            break;
    if (i == e->n_locals) {
        if (e->n_locals == e->cap_locals) {
            size_t nc = e->cap_locals ? e->cap_locals * 2 : 4;
            struct xfer_local *nl = realloc(e->locals, nc * sizeof *nl);
            if (!nl) {
                rc = KVP_ERR_NOMEM;
                goto out;
            }
            e->locals = nl;
            e->cap_locals = nc;
        }
        e->n_locals++;
    }
    e->locals[i] = (struct xfer_local){segment_id, base, size};
out:
    pthread_rwlock_unlock(&e->local_lock);
    return rc;
}

static int unregister_local_one(struct kvp_xfer_engine *e, uint32_t segment_id)
{
    /* The write lock waits for every batch doing local copies (they hold the read lock). */
    pthread_rwlock_wrlock(&e->local_lock);
    int rc = KVP_ERR_NOT_FOUND;
    for (size_t i = 0; i < e->n_locals; i++)
        if (e->locals[i].segment_id == segment_id) {
            e->locals[i] = e->locals[--e->n_locals];
            rc = KVP_OK;
            break;
        }
    pthread_rwlock_unlock(&e->local_lock);
    return rc;
}

/* Caller holds local_lock (read). */
const struct xfer_local *xfer_local_find(const struct kvp_xfer_engine *e, uint32_t id)
{
    for (size_t i = 0; i < e->n_locals; i++)
        if (e->locals[i].segment_id == id)
            return &e->locals[i];
    return NULL;
}

/*
 * One local slice: bounds check, the fault rules of KVP_FAULT_LOCAL, then the copy, in the calling
 * thread (so it cannot outlive the call). Sets s->status on failure. Caller holds local_lock
 * (read) and found the slice's segment with xfer_local_find.
 */
void xfer_local_copy(struct kvp_xfer_engine *e, struct kvp_xfer_slice *s, uint64_t start_ns, uint32_t timeout_ms)
{
    const struct xfer_local *l = xfer_local_find(e, s->segment_id);
    if (s->remote_offset > l->size || s->length > l->size - s->remote_offset) {
        s->status = KVP_ERR_INVALID;
        return;
    }
    struct xfer_fault_hit hit;
    if (xfer_fault_match(KVP_FAULT_LOCAL, s->op, s->segment_id, s->endpoint, &hit)) {
        /* The local copy runs in this thread, so it cannot outlive the call: a fault only
         * delays it, fails it or (WEDGE) keeps it past the fence bound. */
        uint64_t now = kvp_clock_now_ns();
        uint64_t dl = timeout_ms ? start_ns + (uint64_t)timeout_ms * 1000000ull : UINT64_MAX;
        uint64_t until = now + (uint64_t)hit.ms * 1000000ull;
        if (hit.action == KVP_FAULT_FAIL) {
            s->status = KVP_ERR_TRANSFER;
            return;
        }
        if (hit.action == KVP_FAULT_DROP || hit.action == KVP_FAULT_WEDGE)
            until = UINT64_MAX;
        if (hit.action == KVP_FAULT_WEDGE && dl != UINT64_MAX)
            until = dl + (uint64_t)e->p.fence_bound_ms * 1000000ull;
        uint64_t stop = until < dl ? until : dl;
        if (stop == UINT64_MAX)
            stop = now + (uint64_t)e->p.fence_bound_ms * 1000000ull; /* DROP without timeout */
        while (kvp_clock_now_ns() < stop)
            usleep(1000);
        if (hit.action == KVP_FAULT_WEDGE) {
            kvp_log_error(ACTOR, "local copy to segment %u could not be fenced within %u ms",
                          s->segment_id, e->p.fence_bound_ms);
            STAT_ADD(e, st_fence_failed, 1);
            s->status = KVP_ERR_FENCE_FAILED;
            return;
        }
        if (until > dl || hit.action == KVP_FAULT_DROP) { /* never started: fenced */
            STAT_ADD(e, st_fenced, 1);
            s->status = KVP_ERR_TIMEOUT;
            return;
        }
    }
    if (s->op == KVP_XFER_READ)
        memcpy(s->local, l->base + s->remote_offset, s->length);
    else
        memcpy(l->base + s->remote_offset, s->local, s->length);
}
