/*
 * bench_cluster.c — how kvpool-bench reaches a cluster: a client for the public API, the master
 * list for a raw master session, and the pool capacity from ClusterStatus.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "actors/session/msession.h"
#include "tools/bench/bench_internal.h"
#include "auth/auth.h"

int bench_client_open(const struct bench_target *t, kvp_client **out)
{
    kvp_config *cfg = NULL;
    int rc = kvp_config_new(&cfg);
    if (rc)
        return rc;
    if (t->config_file && (rc = kvp_config_load_file(cfg, t->config_file))) {
        fprintf(stderr, "kvpool-bench: --config %s: %s\n", t->config_file, kvp_strerror(rc));
        goto out;
    }
    if (t->cluster_file && (rc = kvp_config_set(cfg, "cluster_file", t->cluster_file))) {
        fprintf(stderr, "kvpool-bench: cluster_file %s: %s\n", t->cluster_file, kvp_strerror(rc));
        goto out;
    }
    if (t->masters && (rc = kvp_config_set(cfg, "master_server_address", t->masters))) {
        fprintf(stderr, "kvpool-bench: --masters %s: %s\n", t->masters, kvp_strerror(rc));
        goto out;
    }
    /* The bench plays inference servers that only use the pool, so it contributes no memory. */
    kvp_config_set(cfg, "global_segment_size", "0");
    rc = kvp_client_open(cfg, out);
    if (rc)
        fprintf(stderr, "kvpool-bench: client open: %s\n", kvp_errname(rc));
out:
    kvp_config_destroy(&cfg);
    return rc;
}

char *bench_target_masters(const struct bench_target *t)
{
    if (t->masters)
        return strdup(t->masters);
    if (!t->cluster_file) {
        fprintf(stderr, "kvpool-bench: give --cluster DIR/cluster.json or --masters host:port,...\n");
        return NULL;
    }
    json_error_t e;
    json_t *o = json_load_file(t->cluster_file, 0, &e);
    if (!o) {
        fprintf(stderr, "kvpool-bench: %s: %s (line %d)\n", t->cluster_file, e.text, e.line);
        return NULL;
    }
    char *r = NULL;
    const char *s = json_string_value(json_object_get(o, "master_server_address"));
    if (s && *s) {
        r = strdup(s);
    } else {
        /* Fall back to the masters[] array. */
        json_t *ms = json_object_get(o, "masters");
        size_t i;
        json_t *m;
        size_t len = 0;
        json_array_foreach(ms, i, m) {
            const char *a = json_string_value(json_object_get(m, "address"));
            if (!a)
                continue;
            char *nr = realloc(r, len + strlen(a) + 2);
            if (!nr)
                break;
            r = nr;
            len += (size_t)sprintf(r + len, "%s%s", len ? "," : "", a);
        }
    }
    json_decref(o);
    if (!r)
        fprintf(stderr, "kvpool-bench: %s: no master_server_address\n", t->cluster_file);
    return r;
}

/* Split "a,b,c" into a malloc'd array of pointers into the malloc'd copy *store. */
static size_t split_masters(char *list, const char **out, size_t max)
{
    size_t n = 0;
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok && n < max;
         tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        if (!strncmp(tok, "tcp://", 6))
            tok += 6;
        if (*tok)
            out[n++] = tok;
    }
    return n;
}

int bench_msession_open(const struct bench_target *t, const char *name, struct kvp_msession **out)
{
    char *list = bench_target_masters(t);
    if (!list)
        return KVP_ERR_INVALID;
    const char *m[16];
    size_t n = split_masters(list, m, 16);
    struct kvp_auth_client *auth = NULL; /* the cluster file's admin key, or KVPOOL_AUTH* (docs/security.md) */
    int rc = n ? kvp_auth_client_load(&auth, getenv("KVPOOL_AUTH"), getenv("KVPOOL_AUTH_KEY"),
                                      getenv("KVPOOL_AUTH_MASTER_KEYS"), t->cluster_file, "admin_key", name)
               : KVP_ERR_INVALID;
    if (rc == KVP_OK)
        rc = kvp_msession_new_auth(out, m, n, name, &auth);
    kvp_auth_client_destroy(&auth);
    free(list);
    return rc;
}

/* The leader's ClusterStatus document (*out: caller decrefs). Returns 0 or a negative code. */
static int cluster_status(const struct bench_target *t, json_t **out)
{
    *out = NULL;
    struct kvp_msession *s = NULL;
    int rc = bench_msession_open(t, "bench", &s);
    if (rc)
        return rc;
    Kvp__ClusterStatusReq cs = KVP__CLUSTER_STATUS_REQ__INIT;
    Kvp__Request req = KVP__REQUEST__INIT;
    req.body_case = KVP__REQUEST__BODY_CLUSTER_STATUS;
    req.cluster_status = &cs;
    Kvp__Response *resp = NULL;
    rc = kvp_msession_call(s, &req, 5000, &resp);
    if (rc == 0) {
        rc = resp->status;
        if (rc == 0 && resp->body_case == KVP__RESPONSE__BODY_CLUSTER_STATUS && resp->cluster_status->json) {
            json_error_t e;
            *out = json_loads(resp->cluster_status->json, 0, &e);
            if (*out == NULL)
                rc = KVP_ERR_MALFORMED;
        } else if (rc == 0) {
            rc = KVP_ERR_MALFORMED;
        }
        kvp_msession_response_free(resp);
    }
    kvp_msession_destroy(&s);
    return rc;
}

int bench_cluster_capacity(const struct bench_target *t, uint64_t *capacity_bytes,
                           uint64_t *used_bytes)
{
    json_t *o = NULL;
    int rc = cluster_status(t, &o);
    if (rc)
        return rc;
    json_t *cap = json_object_get(o, "capacity_bytes");
    if (json_is_integer(cap)) {
        *capacity_bytes = (uint64_t)json_integer_value(cap);
        *used_bytes = (uint64_t)json_integer_value(json_object_get(o, "used_bytes"));
    } else {
        rc = KVP_ERR_MALFORMED;
    }
    json_decref(o);
    return rc;
}

int bench_cluster_objects(const struct bench_target *t, uint64_t *objects)
{
    json_t *o = NULL;
    int rc = cluster_status(t, &o);
    if (rc)
        return rc;
    json_t *n = json_object_get(o, "objects");
    if (json_is_integer(n))
        *objects = (uint64_t)json_integer_value(n);
    else
        rc = KVP_ERR_MALFORMED;
    json_decref(o);
    return rc;
}
