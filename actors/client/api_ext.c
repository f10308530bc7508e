/*
 * api_ext.c — the calls of include/kvpool.h added for language bindings (issue 16, the Python
 * binding): remove-all, a batch size query, an allocate-and-return get, replica counts, the
 * client's own segment name, overlapping registrations, and a bounded drain of the embedded
 * segment. Behaviour: docs/client.md "Calls for bindings".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/client/client.h"
#include "runtime/log.h"

int kvp_remove_all(kvp_client *c, bool force, uint64_t *removed)
{
    if (removed)
        *removed = 0;
    if (!c)
        return kvp_client_invalid(__func__, "client is NULL");
    int rc = kvp_client_enter(c);
    if (rc != KVP_OK)
        return rc;
    Kvp__Request req;
    Kvp__RemoveAllReq ra;
    kvp__request__init(&req);
    kvp__remove_all_req__init(&ra);
    ra.force = force;
    req.body_case = KVP__REQUEST__BODY_REMOVE_ALL;
    req.remove_all = &ra;
    Kvp__Response *resp = NULL;
    rc = kvp_client_rpc(c, &req, kvp_client_deadline(c, 0), KVP__RESPONSE__BODY_REMOVE_ALL, &resp);
    if (rc == KVP_OK && removed)
        *removed = resp->remove_all->removed;
    kvp_msession_response_free(resp);
    kvp_client_leave(c);
    return rc;
}

/* Valid keys of keys[0..n-1] into valid[], their positions into pos[]; results[] of the
 * invalid ones set to their error. Returns how many are valid. */
static size_t valid_keys(size_t n, const char *const keys[], char **valid, size_t *pos, int64_t results[])
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        results[i] = kvp_client_check_key(keys[i]);
        if (results[i] == KVP_OK) {
            pos[m] = i;
            valid[m++] = (char *)keys[i];
        }
    }
    return m;
}

int kvp_batch_get_size(kvp_client *c, size_t n, const char *const keys[], int64_t sizes[])
{
    if (!c || (n > 0 && (!keys || !sizes)))
        return kvp_client_invalid(__func__, "client NULL, or a NULL keys/sizes array with n > 0");
    if (n == 0)
        return KVP_OK;
    int rc = kvp_client_enter(c);
    if (rc != KVP_OK)
        return rc;
    char **valid = calloc(n, sizeof *valid);
    size_t *pos = calloc(n, sizeof *pos);
    if (!valid || !pos) {
        rc = KVP_ERR_NOMEM;
        goto out;
    }
    size_t m = valid_keys(n, keys, valid, pos, sizes);
    /* One GetSize RPC per KVP_CLIENT_GET_CHUNK keys, as the batch get does. */
    for (size_t off = 0; off < m; off += KVP_CLIENT_GET_CHUNK) {
        size_t k = m - off < KVP_CLIENT_GET_CHUNK ? m - off : KVP_CLIENT_GET_CHUNK;
        Kvp__Request req;
        Kvp__GetSizeReq gs;
        kvp__request__init(&req);
        kvp__get_size_req__init(&gs);
        gs.n_keys = k;
        gs.keys = valid + off;
        req.body_case = KVP__REQUEST__BODY_GET_SIZE;
        req.get_size = &gs;
        Kvp__Response *resp = NULL;
        int r = kvp_client_rpc(c, &req, kvp_client_deadline(c, 0), KVP__RESPONSE__BODY_GET_SIZE, &resp);
        if (r == KVP_OK && resp->get_size->n_sizes != k)
            r = KVP_ERR_MALFORMED;
        for (size_t j = 0; j < k; j++)
            sizes[pos[off + j]] = r == KVP_OK ? resp->get_size->sizes[j] : r;
        kvp_msession_response_free(resp);
    }
out:
    free(valid);
    free(pos);
    kvp_client_leave(c);
    return rc;
}

int kvp_batch_replica_count(kvp_client *c, size_t n, const char *const keys[], int results[])
{
    if (!c || (n > 0 && (!keys || !results)))
        return kvp_client_invalid(__func__, "client NULL, or a NULL keys/results array with n > 0");
    if (n == 0)
        return KVP_OK;
    int rc = kvp_client_enter(c);
    if (rc != KVP_OK)
        return rc;
    char **valid = calloc(n, sizeof *valid);
    size_t *pos = calloc(n, sizeof *pos);
    int64_t *r64 = calloc(n, sizeof *r64);
    if (!valid || !pos || !r64) {
        rc = KVP_ERR_NOMEM;
        goto out;
    }
    size_t m = valid_keys(n, keys, valid, pos, r64);
    for (size_t i = 0; i < n; i++)
        results[i] = (int)r64[i];
    for (size_t off = 0; off < m; off += KVP_CLIENT_GET_CHUNK) {
        size_t k = m - off < KVP_CLIENT_GET_CHUNK ? m - off : KVP_CLIENT_GET_CHUNK;
        Kvp__Request req;
        Kvp__GetReplicaListReq gr;
        kvp__request__init(&req);
        kvp__get_replica_list_req__init(&gr);
        gr.n_keys = k;
        gr.keys = valid + off;
        gr.client_host = c->cfg.local_hostname;
        req.body_case = KVP__REQUEST__BODY_GET_REPLICAS;
        req.get_replicas = &gr;
        Kvp__Response *resp = NULL;
        int r = kvp_client_rpc(c, &req, kvp_client_deadline(c, 0), KVP__RESPONSE__BODY_GET_REPLICAS, &resp);
        if (r == KVP_OK && resp->get_replicas->n_objects != k)
            r = KVP_ERR_MALFORMED;
        for (size_t j = 0; j < k; j++) {
            int v = r;
            if (r == KVP_OK) {
                const Kvp__ObjectInfo *info = resp->get_replicas->objects[j];
                v = info->status != KVP_OK ? (info->status < 0 ? info->status : KVP_ERR_INTERNAL)
                    : info->n_replicas == 0 ? KVP_ERR_NOT_FOUND
                                            : (int)info->n_replicas;
            }
            results[pos[off + j]] = v;
        }
        kvp_msession_response_free(resp);
    }
out:
    free(valid);
    free(pos);
    free(r64);
    kvp_client_leave(c);
    return rc;
}

int64_t kvp_get_alloc(kvp_client *c, const char *key, void **out, uint32_t timeout_ms)
{
    if (out)
        *out = NULL;
    if (!c || !out || kvp_client_check_key(key) != KVP_OK)
        return kvp_client_invalid(__func__, "client or out NULL, or bad key (NULL, empty or over 512 bytes)");
    /* An object's size never changes while it exists (write-once); a remove and a new put of a
     * larger object between the two calls is retried a few times. */
    for (int attempt = 0; attempt < 4; attempt++) {
        int64_t size = kvp_get_size(c, key);
        if (size < 0)
            return size;
        if (size == 0)
            return KVP_ERR_NOT_FOUND;
        void *buf = malloc((size_t)size);
        if (!buf)
            return KVP_ERR_NOMEM;
        int64_t r = kvp_get(c, key, buf, (size_t)size, timeout_ms);
        if (r > 0) {
            *out = buf;
            return r;
        }
        free(buf);
        if (r != KVP_ERR_BUFFER_TOO_SMALL)
            return r;
    }
    return KVP_ERR_BUSY;
}

/* Copy the embedded segment's name or endpoint (which) into buf: the two calls below. */
static int segment_string(kvp_client *c, char *buf, size_t cap, bool endpoint, const char *fn)
{
    if (!c || !buf || cap == 0)
        return kvp_client_invalid(fn, "client or buf NULL, or cap 0");
    buf[0] = '\0';
    if (!c->seg)
        return KVP_ERR_NOT_FOUND;
    const char *v = endpoint ? kvp_segment_endpoint(c->seg) : kvp_segment_name(c->seg);
    size_t n = strlen(v) + 1;
    if (n > cap)
        return KVP_ERR_BUFFER_TOO_SMALL;
    memcpy(buf, v, n);
    return KVP_OK;
}

int kvp_client_segment_name(kvp_client *c, char *buf, size_t cap)
{
    return segment_string(c, buf, cap, false, __func__);
}

int kvp_client_segment_endpoint(kvp_client *c, char *buf, size_t cap)
{
    return segment_string(c, buf, cap, true, __func__);
}

int kvp_register_buffer_overlap(kvp_client *c, void *addr, size_t len)
{
    return kvp_client_register_range(c, addr, len, true, __func__);
}

int kvp_client_drain(kvp_client *c, uint32_t timeout_ms, uint64_t *left)
{
    if (left)
        *left = 0;
    if (!c)
        return kvp_client_invalid(__func__, "client is NULL");
    if (!c->seg)
        return KVP_OK; /* nothing contributed, nothing to move */
    int rc = kvp_client_enter(c);
    if (rc != KVP_OK)
        return rc;
    if (timeout_ms == 0)
        timeout_ms = c->cfg.drain_timeout_ms;
    int64_t n = 0;
    if (timeout_ms == 0) {
        kvp_log_warn(c->name, "drain: drain_timeout_ms is 0: segment %s is not drained", kvp_segment_name(c->seg));
        kvp_client_leave(c);
        return KVP_ERR_TIMEOUT;
    }
    rc = kvp_segment_drain_left(c->seg, timeout_ms, true, &n);
    if (left)
        *left = n > 0 ? (uint64_t)n : 0;
    if (rc == KVP_OK)
        kvp_log_info(c->name, "drain: segment %s drained", kvp_segment_name(c->seg));
    else if (n < 0)
        kvp_log_warn(c->name, "drain: segment %s: %s: the master did not take the drain request, so the number of "
                     "replicas not moved is unknown (all of this segment's replicas stay here; objects whose only "
                     "copy they are are dropped when the client closes)", kvp_segment_name(c->seg), kvp_errname(rc));
    else
        kvp_log_warn(c->name, "drain: segment %s: %s: %lld replicas not moved (objects whose only copy they are "
                     "are dropped when the client closes)", kvp_segment_name(c->seg), kvp_errname(rc), (long long)n);
    kvp_client_leave(c);
    return rc;
}
