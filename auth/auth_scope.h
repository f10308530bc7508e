/*
 * auth_scope.h — what an authenticated principal may ask the masters, and the tenant scope of
 * its keys (docs/security.md "Tenants"). Pure: no I/O, no clock; unit-tested directly.
 *
 * A tenant's keys live in the masters under TENANT + KVP_AUTH_TENANT_SEP + KEY, so tenants
 * partition the key space (and every per-key structure: leases, LRU, eviction) without any
 * change to the state machine; the default tenant ("") keeps its keys as they are. A key that
 * itself contains the separator is refused from every principal but admin and master.
 */
#ifndef KVP_AUTH_SCOPE_H
#define KVP_AUTH_SCOPE_H

#include <stddef.h>

#include "auth/auth.h"
#include "wire/kvpool.pb-c.h"

/**
 * Admit `req` from `p`: KVP_OK (every object key of the request now carries p's tenant, in
 * place: strings are reallocated with malloc and the old ones freed, as protobuf-c's default
 * allocator expects), or KVP_ERR_DENIED (a request the role may not make, a key holding the
 * separator) with a reason in why[cap]. Requests of admin and master principals pass
 * unchanged. Errors: KVP_ERR_NOMEM (the request is then partly rewritten; refuse it).
 */
int kvp_auth_scope_request(Kvp__Request *req, const struct kvp_auth_principal *p, char *why, size_t cap);

/**
 * kvp_auth_scope_request for a request decoded with `al` (kvp_wire_decode_with): the scoped
 * strings come from al and the replaced ones go back to it (NULL: malloc and free, as above).
 */
int kvp_auth_scope_request_with(Kvp__Request *req, ProtobufCAllocator *al, const struct kvp_auth_principal *p,
                                char *why, size_t cap);

/**
 * The tenant of a stored key (the part before the separator; "" for the default tenant) into
 * buf[cap]; returns the length of the tenant's prefix including the separator (0 for "").
 */
size_t kvp_auth_key_tenant(const char *key, char *buf, size_t cap);

#endif
