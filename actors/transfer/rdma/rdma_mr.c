/* rdma_mr.c — the rdma transport's memory: the MR cache (kvp_register_buffer), the bounce pool
 * for unregistered host memory, and GPU memory through dma-buf; see rdma_xport.h. */
#include "actors/transfer/rdma/rdma_xport_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "runtime/log.h"

/* Caller memory is LOCAL_WRITE only: no peer can read or write it through any key (note §0.2). */
#define CALLER_ACCESS IBV_ACCESS_LOCAL_WRITE

static void regions_dereg(struct kvp_rdma_xport *x, struct kvp_rdma_region *r)
{
    for (size_t i = 0; i < KVP_RDMA_MAX_NICS; i++)
        kvp_rdma_region_deregister(x->ops, &r[i]);
}

/* Register [base, base+len) of host memory on every NIC. */
static int host_register(struct kvp_rdma_xport *x, uint64_t base, uint64_t len,
                         struct kvp_rdma_region *r)
{
    for (size_t i = 0; i < x->n_nics; i++) {
        int rc = kvp_rdma_region_register(x->ops, x->nic[i].pd, (void *)(uintptr_t)base, len,
                                          x->nic[i].chunk_bytes, CALLER_ACCESS, &r[i]);
        if (rc != KVP_OK) {
            regions_dereg(x, r);
            return rc;
        }
        x->st.mr_regs += r[i].n;
    }
    return KVP_OK;
}

/* Register CUDA memory [addr, addr+len) through dma-buf: export the allocation once, import
 * the wanted range on every NIC (iova = the virtual address), close the fd (note §5).
 * KVP_ERR_UNSUPPORTED when the route is not available: the caller stages instead. */
static int cuda_register(struct kvp_rdma_xport *x, struct kvp_rdma_mrent *e)
{
    const struct kvp_rdma_cuda *cu = x->cfg.cuda;
    if (!cu || !cu->addr_range || !cu->dmabuf_fd || !x->ops->reg_dmabuf_mr)
        return KVP_ERR_UNSUPPORTED;
    uint64_t abase = 0, asize = 0;
    if (cu->addr_range(cu->arg, e->base, &abase, &asize) != 0 || e->base < abase ||
        e->base + e->len > abase + asize) {
        kvp_log_warn(x->who, "rdma: GPU memory %#llx+%llu: allocation range unknown; staging instead",
                     (unsigned long long)e->base, (unsigned long long)e->len);
        return KVP_ERR_UNSUPPORTED;
    }
    int fd = -1;
    if (cu->dmabuf_fd(cu->arg, abase, asize, &fd) != 0 || fd < 0) {
        kvp_log_warn(x->who, "rdma: GPU memory %#llx: cuMemGetHandleForAddressRange(DMA_BUF) "
                             "refused; staging through host memory instead",
                     (unsigned long long)abase);
        return KVP_ERR_UNSUPPORTED;
    }
    int rc = KVP_OK;
    for (size_t i = 0; i < x->n_nics && rc == KVP_OK; i++) {
        struct kvp_rdma_region *r = &e->region[i];
        uint64_t cb = x->nic[i].chunk_bytes;
        size_t n = (size_t)((e->len + cb - 1) / cb);
        r->chunks = calloc(n, sizeof *r->chunks);
        if (!r->chunks) {
            rc = KVP_ERR_NOMEM;
            break;
        }
        r->base = e->base;
        r->len = e->len;
        for (size_t k = 0; k < n; k++) {
            uint64_t cbase = e->base + k * cb;
            uint64_t clen = e->len - k * cb < cb ? e->len - k * cb : cb;
            struct ibv_mr *mr = x->ops->reg_dmabuf_mr(x->nic[i].pd, cbase - abase, clen, cbase, fd,
                                                      CALLER_ACCESS);
            if (!mr) {
                kvp_log_warn(x->who, "rdma: %s: ibv_reg_dmabuf_mr of GPU memory failed: %s; "
                                     "staging instead", x->nic[i].topo.name, strerror(errno));
                rc = KVP_ERR_UNSUPPORTED;
                break;
            }
            r->chunks[k] = (struct kvp_rdma_chunk){.base = cbase, .len = clen, .lkey = mr->lkey,
                                                   .rkey = mr->rkey, .mr = mr};
            r->n = k + 1;
            x->st.mr_regs++;
        }
    }
    if (cu->close_fd)
        cu->close_fd(cu->arg, fd);
    if (rc != KVP_OK) {
        regions_dereg(x, e->region);
        return rc;
    }
    e->dmabuf_base = abase;
    e->dmabuf_size = asize;
    e->needs_flush = cu->needs_flush && cu->needs_flush(cu->arg, e->ordinal);
    return KVP_OK;
}

struct kvp_rdma_mrent *kvp_rdma_mr_find(struct kvp_rdma_xport *x, uint64_t addr, uint64_t len)
{
    for (struct kvp_rdma_mrent *e = x->mrs; e; e = e->next)
        if (addr >= e->base && addr + len <= e->base + e->len && addr + len >= addr)
            return e;
    return NULL;
}

int kvp_rdma_register(struct kvp_rdma_xport *x, void *addr, uint64_t len,
                      const struct kvp_rdma_mem *mem)
{
    uint64_t a = (uint64_t)(uintptr_t)addr;
    if (!x || !addr || !len || a + len < a) {
        kvp_log_error(x ? x->who : "rdma", "rdma register: bad range");
        return KVP_ERR_INVALID;
    }
    int kind = mem ? mem->kind : KVP_RDMA_MEM_HOST;
    struct kvp_rdma_user *u = calloc(1, sizeof *u);
    if (!u)
        return KVP_ERR_NOMEM;
    u->addr = a;
    u->len = len;
    /* Nested: a registration of the same kind already covers the range. */
    struct kvp_rdma_mrent *e = kvp_rdma_mr_find(x, a, len);
    if (e && e->kind == kind) {
        e->refs++;
        x->st.mr_cache_hits++;
        u->ent = e;
        u->next = x->users;
        x->users = u;
        return KVP_OK;
    }
    /* Overlapping: register the union of the range with every entry it overlaps, once; the
     * older entries keep serving their own users until released. */
    uint64_t lo = a, hi = a + len;
    if (kind == KVP_RDMA_MEM_HOST)
        for (struct kvp_rdma_mrent *o = x->mrs; o; o = o->next)
            if (o->kind == kind && o->base < hi && a < o->base + o->len) {
                lo = o->base < lo ? o->base : lo;
                hi = o->base + o->len > hi ? o->base + o->len : hi;
            }
    e = calloc(1, sizeof *e);
    if (!e) {
        free(u);
        return KVP_ERR_NOMEM;
    }
    e->base = lo;
    e->len = hi - lo;
    e->kind = kind;
    e->ordinal = mem ? mem->ordinal : 0;
    int rc = kind == KVP_RDMA_MEM_CUDA ? cuda_register(x, e) : host_register(x, lo, hi - lo, e->region);
    if (rc != KVP_OK) {
        free(e);
        free(u);
        return rc;
    }
    e->refs = 1;
    e->next = x->mrs;
    x->mrs = e; /* newest first: lookups find the widest, newest registration */
    u->ent = e;
    u->next = x->users;
    x->users = u;
    return KVP_OK;
}

static void ent_release(struct kvp_rdma_xport *x, struct kvp_rdma_mrent *e)
{
    if (--e->refs)
        return;
    for (struct kvp_rdma_mrent **pp = &x->mrs; *pp; pp = &(*pp)->next)
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    regions_dereg(x, e->region);
    free(e);
}

int kvp_rdma_unregister(struct kvp_rdma_xport *x, void *addr, uint64_t len)
{
    if (!x)
        return KVP_ERR_INVALID;
    uint64_t a = (uint64_t)(uintptr_t)addr;
    for (struct kvp_rdma_user **pp = &x->users; *pp; pp = &(*pp)->next) {
        struct kvp_rdma_user *u = *pp;
        if (u->addr == a && u->len == len) {
            *pp = u->next;
            /* The union entry that replaced an overlapped one holds its own reference: an older
             * entry is freed once its last user is gone. */
            ent_release(x, u->ent);
            free(u);
            return KVP_OK;
        }
    }
    return KVP_ERR_NOT_FOUND;
}

void kvp_rdma_mr_fini(struct kvp_rdma_xport *x)
{
    while (x->users) {
        struct kvp_rdma_user *u = x->users;
        x->users = u->next;
        free(u);
    }
    while (x->mrs) {
        struct kvp_rdma_mrent *e = x->mrs;
        x->mrs = e->next;
        regions_dereg(x, e->region);
        free(e);
    }
}

/* After a wedged fence deregistered some chunks of nic (their mr is NULL now), register those
 * chunks again: new keys, and no QP that posted with the old ones exists any more. */
static void region_rereg(struct kvp_rdma_xport *x, size_t nic, struct kvp_rdma_region *r,
                         int kind, uint64_t dmabuf_base)
{
    for (size_t k = 0; k < r->n; k++) {
        struct kvp_rdma_chunk *c = &r->chunks[k];
        if (c->mr)
            continue;
        struct ibv_mr *mr = NULL;
        if (kind == KVP_RDMA_MEM_CUDA) {
            int fd = -1;
            const struct kvp_rdma_cuda *cu = x->cfg.cuda;
            if (cu && cu->dmabuf_fd(cu->arg, dmabuf_base, c->base + c->len - dmabuf_base, &fd) == 0) {
                mr = x->ops->reg_dmabuf_mr(x->nic[nic].pd, c->base - dmabuf_base, c->len, c->base,
                                           fd, CALLER_ACCESS);
                if (cu->close_fd)
                    cu->close_fd(cu->arg, fd);
            }
        } else {
            mr = x->ops->reg_mr(x->nic[nic].pd, (void *)(uintptr_t)c->base, c->len, CALLER_ACCESS);
        }
        if (!mr) {
            /* The chunk stays unregistered: slices over it go through the bounce pool. */
            kvp_log_error(x->who, "rdma: re-registering %llu B at %#llx after a wedged fence "
                                  "failed: %s", (unsigned long long)c->len,
                          (unsigned long long)c->base, strerror(errno));
            c->lkey = c->rkey = 0;
            continue;
        }
        x->st.mr_regs++;
        c->mr = mr;
        c->lkey = mr->lkey;
        c->rkey = mr->rkey;
    }
}

void kvp_rdma_mr_after_wedge(struct kvp_rdma_xport *x, size_t nic)
{
    for (struct kvp_rdma_mrent *e = x->mrs; e; e = e->next)
        region_rereg(x, nic, &e->region[nic], e->kind, e->dmabuf_base);
    region_rereg(x, nic, &x->bounce.region[nic], KVP_RDMA_MEM_HOST, 0);
}

/* ------------------------------------------------------------------ bounce pool */

int kvp_rdma_bounce_init(struct kvp_rdma_xport *x)
{
    struct kvp_rdma_bounce *b = &x->bounce;
    b->slot_bytes = x->cfg.slice_bytes;
    b->n = x->cfg.bounce_slots;
    size_t bytes = (size_t)(b->slot_bytes * b->n);
    /* page-aligned: MRs are DONTFORK page-wide (note §1.2 "Fork") */
    if (posix_memalign((void **)&b->mem, 4096, bytes) != 0)
        return KVP_ERR_NOMEM;
    memset(b->mem, 0, bytes);
    b->free_idx = calloc(b->n, sizeof *b->free_idx);
    if (!b->free_idx)
        return KVP_ERR_NOMEM;
    for (uint32_t i = 0; i < b->n; i++)
        b->free_idx[i] = b->n - 1 - i;
    b->n_free = b->n;
    return host_register(x, (uint64_t)(uintptr_t)b->mem, bytes, b->region);
}

void kvp_rdma_bounce_fini(struct kvp_rdma_xport *x)
{
    struct kvp_rdma_bounce *b = &x->bounce;
    regions_dereg(x, b->region);
    free(b->mem);
    free(b->free_idx);
    memset(b, 0, sizeof *b);
}
