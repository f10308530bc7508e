/* rdma_chunk.c — chunked registration and chunk-clamped slices; see rdma_chunk.h. */
#include "actors/transfer/rdma/rdma_chunk.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "runtime/log.h"

#define ACTOR "rdma"

int kvp_rdma_chunk_bytes(uint64_t max_mr_size, uint64_t page_bytes, uint64_t *out)
{
    if (!out || page_bytes == 0 || (page_bytes & (page_bytes - 1)) || max_mr_size < page_bytes) {
        kvp_log_error(ACTOR, "chunk size: max_mr_size %llu, page %llu: no usable chunk",
                      (unsigned long long)max_mr_size, (unsigned long long)page_bytes);
        return KVP_ERR_INVALID;
    }
    uint64_t c = max_mr_size < KVP_RDMA_CHUNK_MAX_BYTES ? max_mr_size : KVP_RDMA_CHUNK_MAX_BYTES;
    *out = c & ~(page_bytes - 1);
    return KVP_OK;
}

void kvp_rdma_region_deregister(const struct kvp_verbs_ops *ops, struct kvp_rdma_region *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++) {
        if (!r->chunks[i].mr)
            continue;
        int err = ops ? ops->dereg_mr(r->chunks[i].mr) : EINVAL;
        if (err)
            kvp_log_error(ACTOR, "dereg of chunk %zu (%llu bytes) failed: %s", i,
                          (unsigned long long)r->chunks[i].len, strerror(err));
    }
    free(r->chunks);
    memset(r, 0, sizeof *r);
}

int kvp_rdma_region_register(const struct kvp_verbs_ops *ops, struct ibv_pd *pd, void *base,
                             uint64_t len, uint64_t chunk_bytes, int access,
                             struct kvp_rdma_region *out)
{
    if (!out)
        return KVP_ERR_INVALID;
    memset(out, 0, sizeof *out);
    if (!ops || !pd || !base || len == 0 || chunk_bytes == 0 ||
        (uint64_t)(uintptr_t)base + len < (uint64_t)(uintptr_t)base) {
        kvp_log_error(ACTOR, "register region: bad arguments (len %llu, chunk %llu)",
                      (unsigned long long)len, (unsigned long long)chunk_bytes);
        return KVP_ERR_INVALID;
    }
    size_t n = (size_t)((len + chunk_bytes - 1) / chunk_bytes);
    struct kvp_rdma_region r = {.base = (uint64_t)(uintptr_t)base, .len = len};
    r.chunks = calloc(n, sizeof *r.chunks);
    if (!r.chunks)
        return KVP_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        struct kvp_rdma_chunk *c = &r.chunks[i];
        c->base = r.base + (uint64_t)i * chunk_bytes;
        c->len = i + 1 < n ? chunk_bytes : len - (uint64_t)i * chunk_bytes;
        errno = 0;
        c->mr = ops->reg_mr(pd, (void *)(uintptr_t)c->base, (size_t)c->len, access);
        if (!c->mr) {
            int e = errno ? errno : EIO;
            kvp_log_error(ACTOR, "register region: chunk %zu of %zu (%llu bytes) failed: %s", i,
                          n, (unsigned long long)c->len, strerror(e));
            r.n = i;
            kvp_rdma_region_deregister(ops, &r);
            return e == ENOMEM ? KVP_ERR_NOMEM : e == EINVAL ? KVP_ERR_INVALID : KVP_ERR_IO;
        }
        c->lkey = c->mr->lkey;
        c->rkey = c->mr->rkey;
        r.n = i + 1;
    }
    *out = r;
    return KVP_OK;
}

int kvp_rdma_region_from_table(const struct kvp_rdma_chunk *tab, size_t n,
                               struct kvp_rdma_region *out)
{
    if (!out)
        return KVP_ERR_INVALID;
    memset(out, 0, sizeof *out);
    if (!tab || n == 0) {
        kvp_log_warn(ACTOR, "chunk table: empty");
        return KVP_ERR_INVALID;
    }
    for (size_t i = 0; i < n; i++) {
        if (tab[i].len == 0 || tab[i].base + tab[i].len < tab[i].base ||
            (i > 0 && tab[i].base != tab[i - 1].base + tab[i - 1].len)) {
            kvp_log_warn(ACTOR, "chunk table: entry %zu of %zu is empty, wraps or leaves a gap",
                         i, n);
            return KVP_ERR_INVALID;
        }
    }
    out->chunks = malloc(n * sizeof *out->chunks);
    if (!out->chunks)
        return KVP_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        out->chunks[i] = tab[i];
        out->chunks[i].mr = NULL;
    }
    out->n = n;
    out->base = tab[0].base;
    out->len = tab[n - 1].base + tab[n - 1].len - tab[0].base;
    return KVP_OK;
}

const struct kvp_rdma_chunk *kvp_rdma_region_find(const struct kvp_rdma_region *r, uint64_t addr)
{
    if (!r || r->n == 0 || addr < r->base || addr - r->base >= r->len)
        return NULL;
    size_t lo = 0, hi = r->n; /* the chunk is in [lo, hi) */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->chunks[mid].base <= addr)
            lo = mid;
        else
            hi = mid;
    }
    return &r->chunks[lo];
}

int kvp_rdma_spans(const struct kvp_rdma_region *local, uint64_t laddr,
                   const struct kvp_rdma_region *remote, uint64_t raddr, uint64_t len,
                   uint64_t slice_bytes, struct kvp_rdma_span *out, size_t cap, size_t *n)
{
    if (!local || !remote || !n || len == 0 || slice_bytes == 0 || slice_bytes > (2ull << 30) ||
        (cap && !out)) {
        kvp_log_error(ACTOR, "spans: bad arguments (len %llu, slice %llu)",
                      (unsigned long long)len, (unsigned long long)slice_bytes);
        return KVP_ERR_INVALID;
    }
    if (laddr < local->base || laddr - local->base > local->len ||
        len > local->len - (laddr - local->base) || raddr < remote->base ||
        raddr - remote->base > remote->len || len > remote->len - (raddr - remote->base)) {
        kvp_log_error(ACTOR, "spans: %llu bytes at local %#llx / remote %#llx fall outside the "
                             "registered regions", (unsigned long long)len,
                      (unsigned long long)laddr, (unsigned long long)raddr);
        return KVP_ERR_INVALID;
    }
    size_t k = 0;
    uint64_t done = 0;
    while (done < len) {
        const struct kvp_rdma_chunk *lc = kvp_rdma_region_find(local, laddr + done);
        const struct kvp_rdma_chunk *rc = kvp_rdma_region_find(remote, raddr + done);
        uint64_t piece = len - done;
        if (piece > slice_bytes)
            piece = slice_bytes;
        uint64_t lleft = lc->base + lc->len - (laddr + done);
        uint64_t rleft = rc->base + rc->len - (raddr + done);
        if (piece > lleft)
            piece = lleft;
        if (piece > rleft)
            piece = rleft;
        if (k < cap) {
            out[k].laddr = laddr + done;
            out[k].raddr = raddr + done;
            out[k].len = (uint32_t)piece;
            out[k].lkey = lc->lkey;
            out[k].rkey = rc->rkey;
        }
        k++;
        done += piece;
    }
    *n = k;
    return k <= cap ? KVP_OK : KVP_ERR_BUSY;
}
