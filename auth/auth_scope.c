/*
 * auth_scope.c — role policy and tenant scope of requests (auth_scope.h).
 */
#include "auth/auth_scope.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"

/* What a role may ask (docs/security.md "Roles"). Admin and master: everything. A segment (a
 * storage host): its own lifecycle, drain, the mover's calls, status; not membership, not
 * whole-pool removal. A client: data calls within its tenant, status, and the lifecycle of an
 * embedded segment (inference servers contribute memory; a process that contributes a segment
 * holds whatever bytes are placed in it, of any tenant: docs/security.md says so). RemoveAll
 * (every tenant's objects) only with the default tenant's key (the pool owner's). */
static bool role_allows(enum kvp_auth_role role, const char *tenant, Kvp__Request__BodyCase b)
{
    if (role == KVP_AUTH_ROLE_ADMIN || role == KVP_AUTH_ROLE_MASTER)
        return true;
    switch (b) {
    case KVP__REQUEST__BODY_MOUNT:
    case KVP__REQUEST__BODY_UNMOUNT:
    case KVP__REQUEST__BODY_HEARTBEAT:
    case KVP__REQUEST__BODY_MOVER_POLL:
    case KVP__REQUEST__BODY_DRAIN:
    case KVP__REQUEST__BODY_PUT_START:
    case KVP__REQUEST__BODY_PUT_END:
    case KVP__REQUEST__BODY_PUT_INTENT:
    case KVP__REQUEST__BODY_PUT_REVOKE:
    case KVP__REQUEST__BODY_GET_REPLICAS:
    case KVP__REQUEST__BODY_EXISTS:
    case KVP__REQUEST__BODY_GET_SIZE:
    case KVP__REQUEST__BODY_REMOVE:
    case KVP__REQUEST__BODY_REPORT_UNREACHABLE:
    case KVP__REQUEST__BODY_CLUSTER_STATUS:
    case KVP__REQUEST__BODY_MEMBERS:
    case KVP__REQUEST__BODY_DATA_TOKEN: /* tokens carry the key's own tenant (service_auth.c) */
        return true;
    case KVP__REQUEST__BODY_REMOVE_ALL:
        /* Removes every object of the pool: the default tenant (the pool owner's key) only. */
        return role == KVP_AUTH_ROLE_CLIENT && tenant[0] == '\0';
    default:
        return false;
    }
}

/* *s = TENANT SEP *s. An empty string stays empty (the state machine refuses it as INVALID). */
static int scope_key(char **s, ProtobufCAllocator *al, const char *tenant, size_t tl, bool *bad)
{
    if (!*s || !**s)
        return KVP_OK;
    if (strchr(*s, KVP_AUTH_TENANT_SEP)) {
        *bad = true;
        return KVP_OK;
    }
    if (tl == 0)
        return KVP_OK;
    size_t kl = strlen(*s);
    char *n = al ? al->alloc(al->allocator_data, tl + 1 + kl + 1) : malloc(tl + 1 + kl + 1);
    if (!n)
        return KVP_ERR_NOMEM;
    memcpy(n, tenant, tl);
    n[tl] = KVP_AUTH_TENANT_SEP;
    memcpy(n + tl + 1, *s, kl + 1);
    if (al)
        al->free(al->allocator_data, *s);
    else
        free(*s);
    *s = n;
    return KVP_OK;
}

#define SCOPE(field)                                                                                                   \
    do {                                                                                                               \
        if ((rc = scope_key(&(field), al, p->tenant, tl, &bad)) != KVP_OK)                                             \
            return rc;                                                                                                 \
    } while (0)

int kvp_auth_scope_request(Kvp__Request *req, const struct kvp_auth_principal *p, char *why, size_t cap)
{
    return kvp_auth_scope_request_with(req, NULL, p, why, cap);
}

int kvp_auth_scope_request_with(Kvp__Request *req, ProtobufCAllocator *al, const struct kvp_auth_principal *p,
                                char *why, size_t cap)
{
    if (!p || p->role == KVP_AUTH_ROLE_ADMIN || p->role == KVP_AUTH_ROLE_MASTER)
        return KVP_OK;
    if (!role_allows(p->role, p->tenant, req->body_case)) {
        snprintf(why, cap, "request %d is not allowed for a %s key%s%s", (int)req->body_case,
                 kvp_auth_role_name(p->role), p->tenant[0] ? " of tenant " : "", p->tenant);
        return KVP_ERR_DENIED;
    }
    /* Segments act on whole stored keys (mover tasks): unscoped. */
    if (p->role == KVP_AUTH_ROLE_SEGMENT)
        return KVP_OK;
    size_t tl = strlen(p->tenant);
    bool bad = false;
    int rc = KVP_OK;
    switch (req->body_case) {
    case KVP__REQUEST__BODY_PUT_START:
        for (size_t i = 0; req->put_start && i < req->put_start->n_items; i++) {
            SCOPE(req->put_start->items[i]->key);
            SCOPE(req->put_start->items[i]->parent_key);
        }
        break;
    case KVP__REQUEST__BODY_PUT_END:
        for (size_t i = 0; req->put_end && i < req->put_end->n_items; i++)
            SCOPE(req->put_end->items[i]->key);
        break;
    case KVP__REQUEST__BODY_PUT_INTENT: /* scoped as its PutEnd, which must find the same key */
        for (size_t i = 0; req->put_intent && i < req->put_intent->n_items; i++)
            SCOPE(req->put_intent->items[i]->key);
        break;
    case KVP__REQUEST__BODY_PUT_REVOKE:
        for (size_t i = 0; req->put_revoke && i < req->put_revoke->n_items; i++)
            SCOPE(req->put_revoke->items[i]->key);
        break;
    case KVP__REQUEST__BODY_GET_REPLICAS:
        for (size_t i = 0; req->get_replicas && i < req->get_replicas->n_keys; i++)
            SCOPE(req->get_replicas->keys[i]);
        break;
    case KVP__REQUEST__BODY_EXISTS:
        for (size_t i = 0; req->exists && i < req->exists->n_keys; i++)
            SCOPE(req->exists->keys[i]);
        break;
    case KVP__REQUEST__BODY_GET_SIZE:
        for (size_t i = 0; req->get_size && i < req->get_size->n_keys; i++)
            SCOPE(req->get_size->keys[i]);
        break;
    case KVP__REQUEST__BODY_REMOVE:
        for (size_t i = 0; req->remove && i < req->remove->n_keys; i++)
            SCOPE(req->remove->keys[i]);
        break;
    default:
        break;
    }
    if (bad) {
        snprintf(why, cap, "a key holds the byte 0x1f (reserved for tenant scopes)");
        return KVP_ERR_DENIED;
    }
    return KVP_OK;
}

size_t kvp_auth_key_tenant(const char *key, char *buf, size_t cap)
{
    const char *sep = key ? strchr(key, KVP_AUTH_TENANT_SEP) : NULL;
    size_t tl = sep ? (size_t)(sep - key) : 0;
    if (cap) {
        size_t c = tl < cap - 1 ? tl : cap - 1;
        memcpy(buf, key, c);
        buf[c] = '\0';
    }
    return sep ? tl + 1 : 0;
}
