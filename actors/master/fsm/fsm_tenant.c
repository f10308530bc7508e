/*
 * fsm_tenant.c — bytes and objects of complete objects per tenant, kept as entries are applied
 * (issue 22: the service used to recount them by walking every object under the FSM's read
 * lock, 18% of a 6M-object master's CPU and a hold of the raft thread's writes).
 *
 * A tenant is the key's prefix before KVP_AUTH_TENANT_SEP (auth/auth_scope.h), cut to
 * KVP_AUTH_TENANT_MAX - 1 bytes as the service names it; keys without one are tenant "".
 * Bytes are rounded up to 64 as quotas count them. Derived state: not in snapshots; a restore
 * rebuilds it while it places the objects. A tenant stays listed (at 0) once seen, until the
 * next restore or clear.
 */
#include <stdlib.h>
#include <string.h>

#include "actors/master/fsm/fsm_internal.h"
#include "auth/auth.h"
#include "kvpool.h"

#define ALIGN64(x) (((x) + 63u) & ~(uint64_t)63u)

struct kvp_fsm_tenant {
    char name[KVP_AUTH_TENANT_MAX];
    uint32_t hash;
    uint64_t used_bytes, objects;
};

static size_t tenant_of(const struct kvp_fsm_obj *o, const char **name)
{
    const char *key = kvp_fsm_obj_key(o);
    const char *sep = memchr(key, KVP_AUTH_TENANT_SEP, o->key_len);
    size_t tl = sep ? (size_t)(sep - key) : 0;
    *name = key;
    return tl < KVP_AUTH_TENANT_MAX - 1 ? tl : KVP_AUTH_TENANT_MAX - 1;
}

/* Index (into f->tenants) of the tenant, added when missing; -1 without memory. The index
 * f->tenant_idx (open addressing over tenant positions + 1, 0 = empty) is twice the count. */
static long tenant_find(struct kvp_master_fsm *f, const char *name, size_t len)
{
    uint32_t h = kvp_fsm_hash(name, len);
    uint32_t mask = f->tenant_idx_cap - 1;
    for (uint32_t i = f->tenant_idx_cap ? h & mask : 0; f->tenant_idx_cap && f->tenant_idx[i]; i = (i + 1) & mask) {
        struct kvp_fsm_tenant *t = &f->tenants[f->tenant_idx[i] - 1];
        if (t->hash == h && strlen(t->name) == len && memcmp(t->name, name, len) == 0)
            return (long)(f->tenant_idx[i] - 1);
    }
    if (f->n_tenants == f->tenants_cap) {
        uint32_t cap = f->tenants_cap ? f->tenants_cap * 2 : 4;
        struct kvp_fsm_tenant *nt = realloc(f->tenants, cap * sizeof(*nt));
        uint32_t *ni = calloc(cap * 2, sizeof(*ni));
        if (!nt || !ni) {
            if (nt)
                f->tenants = nt;
            free(ni);
            return -1;
        }
        f->tenants = nt;
        f->tenants_cap = cap;
        free(f->tenant_idx);
        f->tenant_idx = ni;
        f->tenant_idx_cap = cap * 2;
        for (uint32_t k = 0; k < f->n_tenants; k++) {
            uint32_t i = f->tenants[k].hash & (f->tenant_idx_cap - 1);
            while (ni[i])
                i = (i + 1) & (f->tenant_idx_cap - 1);
            ni[i] = k + 1;
        }
    }
    struct kvp_fsm_tenant *t = &f->tenants[f->n_tenants];
    memset(t, 0, sizeof(*t));
    memcpy(t->name, name, len);
    t->hash = h;
    uint32_t i = h & (f->tenant_idx_cap - 1);
    while (f->tenant_idx[i])
        i = (i + 1) & (f->tenant_idx_cap - 1);
    f->tenant_idx[i] = ++f->n_tenants;
    return (long)(f->n_tenants - 1);
}

void kvp_fsm_tenant_count(struct kvp_master_fsm *f, const struct kvp_fsm_obj *o, int sign)
{
    const char *name;
    size_t len = tenant_of(o, &name);
    long k = tenant_find(f, name, len);
    if (k < 0) {
        f->tenants_lost = true; /* out of memory: kvp_master_fsm_tenants says so */
        return;
    }
    struct kvp_fsm_tenant *t = &f->tenants[k];
    if (sign > 0) {
        t->used_bytes += ALIGN64(o->size);
        t->objects++;
    } else if (t->objects == 0 || t->used_bytes < ALIGN64(o->size)) {
        /* its +1 was lost for want of memory (or a new entry for it was just made): stay at 0,
         * not wrap to ~2^64 bytes, which the quota would read as far over and evict for */
        t->used_bytes = t->objects = 0;
        f->tenants_lost = true;
    } else {
        t->used_bytes -= ALIGN64(o->size);
        t->objects--;
    }
}

void kvp_fsm_tenants_clear(struct kvp_master_fsm *f)
{
    free(f->tenants);
    free(f->tenant_idx);
    f->tenants = NULL;
    f->tenant_idx = NULL;
    f->n_tenants = f->tenants_cap = f->tenant_idx_cap = 0;
    f->tenants_lost = false;
}

int kvp_master_fsm_tenants(const struct kvp_master_fsm *fsm,
                           void (*cb)(void *ctx, const char *tenant, uint64_t used_bytes, uint64_t objects),
                           void *ctx)
{
    if (!fsm || !cb)
        return KVP_ERR_INVALID;
    for (uint32_t i = 0; i < fsm->n_tenants; i++)
        cb(ctx, fsm->tenants[i].name, fsm->tenants[i].used_bytes, fsm->tenants[i].objects);
    return fsm->tenants_lost ? KVP_ERR_NOMEM : KVP_OK;
}

int kvp_fsm_tenants_check(const struct kvp_master_fsm *f)
{
    /* A recount from the table into a scratch state must equal the kept counts. */
    struct kvp_master_fsm scratch;
    memset(&scratch, 0, sizeof(scratch));
    int rc = 0;
    for (uint64_t i = 0; i < f->tab_cap; i++) {
        const struct kvp_fsm_obj *o = f->tab[i];
        if (o && o->state == KVP_FSM_OBJ_COMPLETE)
            kvp_fsm_tenant_count(&scratch, o, +1);
    }
    if (scratch.tenants_lost || f->tenants_lost)
        rc = -14;
    for (uint32_t i = 0; !rc && i < f->n_tenants; i++) {
        const struct kvp_fsm_tenant *t = &f->tenants[i];
        long k = tenant_find(&scratch, t->name, strlen(t->name));
        if (k < 0 || scratch.tenants[k].used_bytes != t->used_bytes || scratch.tenants[k].objects != t->objects)
            rc = -14;
    }
    if (!rc && scratch.n_tenants != f->n_tenants) {
        /* every tenant the recount saw must be kept (kept ones may also be at 0) */
        for (uint32_t i = 0; !rc && i < scratch.n_tenants; i++) {
            bool found = false;
            for (uint32_t j = 0; j < f->n_tenants && !found; j++)
                found = strcmp(f->tenants[j].name, scratch.tenants[i].name) == 0;
            if (!found)
                rc = -14;
        }
    }
    kvp_fsm_tenants_clear(&scratch);
    return rc;
}
