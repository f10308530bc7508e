/*
 * client.c — the public client API: open/close (embedded segment included), the calls that
 * are one RPC (exists, remove, get_size), buffer registration, and the helpers of client.h.
 * Puts are in batch_put.c, gets in batch_get.c. Behaviour: docs/client.md.
 */
#include "actors/client/client.h"
#ifdef KVP_HAVE_VERBS
#include "actors/transfer/rdma/xport_rdma.h"
#include "wire/rdma_hello.h"
#endif
#include "actors/session/dtoken.h"
#include "actors/client/client_metrics.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "actors/client/api_config.h"
#include "auth/auth.h"
#include "runtime/clock.h"
#include "runtime/log.h"

/* ------------------------------------------------------------------ helpers (client.h) */

/* kvp_client_enter, kvp_client_leave and kvp_client_closing: client_actor.c. */

uint64_t kvp_client_deadline(const struct kvp_client *c, uint32_t timeout_ms)
{
    if (timeout_ms == 0)
        timeout_ms = c->cfg.transfer_timeout_ms ? c->cfg.transfer_timeout_ms : 10000;
    return kvp_clock_now_ms() + timeout_ms;
}

uint32_t kvp_client_remaining(uint64_t deadline_ms)
{
    uint64_t now = kvp_clock_now_ms();
    return deadline_ms > now ? (uint32_t)(deadline_ms - now) : 0;
}

int kvp_client_chunk_gate(struct kvp_client *c, uint64_t deadline_ms, const char *what, size_t n, size_t off)
{
    int why = kvp_client_closing(c) ? KVP_ERR_CLOSED : kvp_client_remaining(deadline_ms) == 0 ? KVP_ERR_TIMEOUT : 0;
    if (why)
        kvp_log_warn(c->name, "%s of %zu items: %zu not started (%s)", what, n, n - off, kvp_errname(why));
    return why;
}

int kvp_client_check_key(const char *key)
{
    if (!key)
        return kvp_client_invalid(__func__, "key is NULL");
    size_t l = strnlen(key, KVP_MAX_KEY_BYTES + 1);
    if (l == 0)
        return kvp_client_invalid(__func__, "empty key");
    if (l > KVP_MAX_KEY_BYTES)
        return kvp_client_invalid(__func__, "key longer than 512 bytes");
    return KVP_OK;
}

struct kvp_client_obj *kvp_client_objs_new(size_t n, const char *const keys[], const kvp_iov *const iovs[],
                                           const size_t iovcnt[], void *const bufs[], const size_t lens[])
{
    /* Flat calls keep their single piece per object right after the objects. */
    size_t extra = iovs ? 0 : n * sizeof(kvp_iov);
    struct kvp_client_obj *objs = malloc(n * sizeof *objs + extra);
    if (!objs)
        return NULL;
    kvp_iov *flat = (kvp_iov *)(objs + n);
    for (size_t i = 0; i < n; i++) {
        if (iovs) {
            objs[i] = (struct kvp_client_obj){.key = keys[i], .iov = iovs[i], .iovcnt = iovcnt[i]};
        } else {
            flat[i] = (kvp_iov){.base = bufs[i], .len = lens[i]};
            objs[i] = (struct kvp_client_obj){.key = keys[i], .iov = &flat[i], .iovcnt = 1};
        }
    }
    return objs;
}

int kvp_client_invalid(const char *fn, const char *what)
{
    kvp_log_warn("client", "%s: invalid argument: %s (KVP_ERR_INVALID)", fn, what);
    return KVP_ERR_INVALID;
}

int kvp_client_rpc(struct kvp_client *c, Kvp__Request *req, uint64_t deadline_ms,
                   Kvp__Response__BodyCase expect, Kvp__Response **out)
{
    *out = NULL;
    uint32_t t = kvp_client_remaining(deadline_ms);
    if (t == 0)
        return KVP_ERR_TIMEOUT;
    if (c->cfg.rpc_timeout_ms && t > c->cfg.rpc_timeout_ms)
        t = c->cfg.rpc_timeout_ms;
    Kvp__Response *resp = NULL;
    int rc = kvp_msession_call(c->ms, req, t, &resp);
    if (rc != KVP_OK)
        return rc;
    if (resp->status != KVP_OK) {
        rc = resp->status;
        kvp_log_debug(c->name, "rpc %d: %s (%s)", (int)req->body_case, kvp_errname(rc),
                      resp->error ? resp->error : "");
        kvp_msession_response_free(resp);
        return rc < 0 && rc > KVP_ERR__LAST ? rc : KVP_ERR_INTERNAL;
    }
    if (resp->body_case != expect) {
        kvp_log_warn(c->name, "rpc %d: reply body %d, expected %d", (int)req->body_case,
                     (int)resp->body_case, (int)expect);
        kvp_msession_response_free(resp);
        return KVP_ERR_MALFORMED;
    }
    *out = resp;
    return KVP_OK;
}

/* ------------------------------------------------------------------ open / close */

/* protocol=rdma (issue 20): open the rdma transport with this client's RDMA keys to see whether
 * a device is usable; if so the engine runs its transfer actors on it (each actor opens its own
 * instance with these options, a random writer id each) and the handshake with each segment goes
 * over the segment's data-plane TCP port (kvp_rdma_hello_tcp). Exactly one log line either way.
 * Returns the transport for the engine (NULL: tcp). */
#ifdef KVP_HAVE_VERBS
struct rdma_opts_box { /* c->rdma_opts */
    struct kvp_xport_rdma_opts o;
    struct kvp_rdma_hello_tcp_opts h;
};
#endif

static const struct kvp_xport_ops *client_rdma_probe(struct kvp_client *c)
{
    snprintf(c->transport, sizeof c->transport, "tcp");
#ifdef KVP_HAVE_VERBS
    struct rdma_opts_box *b = calloc(1, sizeof *b);
    if (!b) {
        kvp_log_warn(c->name, "protocol=rdma: out of memory; using tcp");
        return NULL;
    }
    b->o.cfg = (struct kvp_rdma_cfg){.ops = kvp_verbs_ops_ibv(), .devices = c->cfg.device_name,
                                     .gid_index = kvp_cfg_gid_index(c->cfg.gid_index),
                                     .qps_per_peer = c->cfg.rdma_qps_per_peer,
                                     .slice_bytes = c->cfg.rdma_slice_bytes,
                                     .fence_bound_ms = c->cfg.rdma_fence_bound_ms,
                                     .nodev_log_level = KVP_LOG_WARN};
    b->h.timeout_ms = c->cfg.rpc_timeout_ms ? c->cfg.rpc_timeout_ms : 2000;
    /* every transfer actor's writer id shares the client id's high half: a PutRevoke names them
     * all, and segments fence only them (docs/rdma.md "Per-writer fence") */
    b->o.writer_prefix = c->client_id & KVP_RDMA_WRITER_FAMILY_MASK;
    b->o.hello = kvp_rdma_hello_tcp;
    b->o.hello_arg = &b->h;
    struct kvp_xport_params p = {.name = c->name, .wrap_opts = &b->o};
    struct kvp_xport *t = NULL;
    int rc = kvp_xport_rdma.open(&t, &p);
    if (rc == KVP_OK) {
        kvp_xport_rdma.close(t);
        kvp_log_info(c->name, "protocol=rdma: data over RDMA (a segment without RDMA, or that "
                              "refuses the handshake, is reached over TCP: one WARN per segment)");
        snprintf(c->transport, sizeof c->transport, "rdma");
        c->rdma_opts = b;
        return &kvp_xport_rdma;
    }
    if (rc != KVP_ERR_UNSUPPORTED)
        kvp_log_warn(c->name, "protocol=rdma: RDMA unusable (%s, see above); using tcp", kvp_errname(rc));
    free(b);
#else
    kvp_log_warn(c->name, "protocol=rdma: this build has no RDMA (libibverbs not found); using tcp");
#endif
    return NULL;
}

/* Segment hook (segment thread): (re)register the embedded region with the local transport. */
static void on_segment_mount(void *ctx, uint32_t old_id, uint32_t new_id, void *base, uint64_t size)
{
    struct kvp_client *c = ctx;
    atomic_store(&c->local_seg_id, 0u);
    if (old_id)
        kvp_xfer_unregister_local(c->xfer, old_id);
    if (new_id && base) {
        int rc = kvp_xfer_register_local(c->xfer, new_id, base, size);
        if (rc == KVP_OK)
            atomic_store(&c->local_seg_id, new_id);
        else
            kvp_log_warn(c->name, "segment %u: local transport: %s (reads go over TCP)", new_id,
                         kvp_errname(rc));
    }
    kvp_log_info(c->name, "embedded segment mounted as %u (was %u)", new_id, old_id);
}

static int probe_leader(struct kvp_client *c)
{
    Kvp__Request req;
    Kvp__ExistsReq ex;
    kvp__request__init(&req);
    kvp__exists_req__init(&ex);
    req.body_case = KVP__REQUEST__BODY_EXISTS;
    req.exists = &ex;
    Kvp__Response *resp = NULL;
    uint32_t t = c->cfg.rpc_timeout_ms ? c->cfg.rpc_timeout_ms : 5000;
    int rc = kvp_msession_call(c->ms, &req, t, &resp);
    kvp_msession_response_free(resp);
    return rc;
}

static void client_free(struct kvp_client *c)
{
    kvp_client_metrics_stop(c); /* the HTTP thread reads the engine and the counters: first */
    /* No call is in flight: drop the local registration before the region is unmapped. */
    uint32_t local = c->xfer ? atomic_exchange(&c->local_seg_id, 0u) : 0;
    if (local)
        kvp_xfer_unregister_local(c->xfer, local);
    kvp_segment_stop(&c->seg);
    kvp_devstage_destroy(&c->devstage); /* [GPU hook] no call is in flight: no lane is busy */
    kvp_xfer_engine_destroy(&c->xfer);
    free(c->rdma_opts); /* after the engine: its transfer actors read it */
    kvp_dtoken_destroy(&c->dtok); /* after the engine (made with its key) */
    kvp_msession_destroy(&c->ms);
    kvp_client_actor_stop(c); /* no call is inside: nothing sends to it any more */
    free(c);
}

int kvp_client_open(const kvp_config *cfg, kvp_client **out)
{
    if (!cfg || !out)
        return kvp_client_invalid(__func__, "cfg or out is NULL");
    *out = NULL;
    struct kvp_client *c = calloc(1, sizeof *c);
    if (!c)
        return KVP_ERR_NOMEM;
    c->cfg = cfg->c;
    snprintf(c->name, sizeof c->name, "client-%d", (int)getpid());
    snprintf(c->transport, sizeof c->transport, "tcp");
    if (getrandom(&c->client_id, sizeof c->client_id, 0) != sizeof c->client_id)
        c->client_id = kvp_clock_now_ns() ^ ((uint64_t)getpid() << 32);
    c->client_id &= ~0xffffffffull; /* the counter fills the low half: op ids never repeat within a client */

    int rc = kvp_client_actor_start(c);
    if (rc != KVP_OK) {
        kvp_log_error(c->name, "client actor: %s", kvp_errname(rc));
        c->actor = NULL;
        goto fail;
    }
    const struct kvp_xport_ops *xport = NULL;
    if (strcmp(c->cfg.protocol, "rdma") == 0) {
        /* no device: vLLM's and SGLang's default: run, on TCP, rather than refuse the whole client */
        xport = client_rdma_probe(c);
    } else if (strcmp(c->cfg.protocol, "tcp") != 0 && c->cfg.protocol[0]) {
        kvp_log_error(c->name, "protocol=%s: only tcp is available in this build", c->cfg.protocol);
        rc = KVP_ERR_UNSUPPORTED;
        goto fail;
    }
    char *masters[KVP_CFG_MAX_MASTERS];
    size_t n_masters = 0;
    rc = kvp_cfg_masters(c->cfg.master_server_address, c->cfg.cluster_file, masters,
                         KVP_CFG_MAX_MASTERS, &n_masters);
    if (rc != KVP_OK) {
        kvp_log_error(c->name, "no master list (master_server_address or cluster_file): %s",
                      kvp_errname(rc));
        goto fail;
    }
    struct kvp_auth_client *auth = NULL; /* CURVE keys and the key's tenant (docs/security.md) */
    rc = kvp_auth_client_load(&auth, c->cfg.auth, c->cfg.auth_key, c->cfg.auth_master_keys, c->cfg.cluster_file,
                              "client_key", c->name);
    if (rc == KVP_OK)
        rc = kvp_auth_client_check_tenant(auth, c->cfg.tenant_id, c->name);
    /* auth on and the masters' certificates carry token keys: segments require data-plane
     * tokens, so present them (docs/security.md "Data plane: tokens") */
    c->n_token_keys = kvp_auth_client_token_keys(auth, c->token_keys, 16);
    if (rc == KVP_OK && c->n_token_keys > 0)
        rc = kvp_dtoken_new(&c->dtok, c->name);
    /* The RDMA hello opens its own connection to the segment's data port and must pass the same
     * token check: each rdma instance answers it from its transfer actor's wallet
     * (xport_rdma.c, kvp_xfer_params.token_wallet below). */
    if (rc == KVP_OK)
        rc = kvp_msession_new_auth(&c->ms, (const char *const *)masters, n_masters, c->name, &auth);
    kvp_auth_client_destroy(&auth);
    kvp_cfg_free_masters(masters, n_masters);
    if (rc != KVP_OK)
        goto fail;
    /* An inference server's prefill must not wait seconds per call while the store is down
     * (issue 18 item 3): after one whole timeout without any master answering, fail at once. */
    kvp_msession_set_fail_fast(c->ms, true);

    struct kvp_xfer_params xp = {
        .conns_per_peer = c->cfg.conns_per_peer ? c->cfg.conns_per_peer : 4,
        .slice_bytes = c->cfg.slice_bytes ? c->cfg.slice_bytes : (1u << 20),
        .connect_timeout_ms = 1000,
        .io_threads = c->cfg.transfer_io_threads ? c->cfg.transfer_io_threads : 2,
        .transport = xport,
        .transport_opts = xport ? c->rdma_opts : NULL,
        .rdma_reprobe_ms = c->cfg.rdma_reprobe_ms ? c->cfg.rdma_reprobe_ms : UINT32_MAX,
        .token_wallet = kvp_dtoken_key(c->dtok), /* NULL without tokens */
        .batch_host = c->actor, /* the client actor hosts the batch actors (DESIGN.md "Actors") */
    };
    rc = kvp_xfer_engine_new(&c->xfer, &xp);
    if (rc != KVP_OK)
        goto fail;
    rc = kvp_devstage_new_owned(&c->devstage, c->xfer, 0, c->actor); /* [GPU hook] lanes are made on first use */
    if (rc != KVP_OK)
        goto fail;

    rc = probe_leader(c);
    if (rc != KVP_OK) {
        kvp_log_error(c->name, "no master leader reachable: %s", kvp_errname(rc));
        rc = KVP_ERR_UNAVAILABLE;
        goto fail;
    }

    if (c->cfg.global_segment_size > 0) {
        struct kvp_cfg_segment sc;
        kvp_cfg_defaults(KVP_CFG_SEGMENT, &sc);
        snprintf(sc.name, sizeof sc.name, "client-%.60s-%d-%04x", c->cfg.local_hostname, (int)getpid(),
                 (unsigned)(c->client_id >> 48));
        snprintf(sc.local_hostname, sizeof sc.local_hostname, "%s", c->cfg.local_hostname);
        sc.port = 0;
        sc.global_segment_size = c->cfg.global_segment_size;
        sc.segment_prefault = c->cfg.segment_prefault;
        snprintf(sc.master_server_address, sizeof sc.master_server_address, "%s",
                 c->cfg.master_server_address);
        snprintf(sc.cluster_file, sizeof sc.cluster_file, "%s", c->cfg.cluster_file);
        if (c->cfg.heartbeat_ms)
            sc.heartbeat_ms = c->cfg.heartbeat_ms;
        snprintf(sc.log_level, sizeof sc.log_level, "%s", c->cfg.log_level);
        struct kvp_segment_hooks hooks = {.ctx = c, .on_mount = on_segment_mount};
        memcpy(hooks.token_keys, c->token_keys, sizeof hooks.token_keys);
        hooks.n_token_keys = c->n_token_keys;
        rc = kvp_segment_start(&c->seg, &sc, c->ms, &hooks);
        if (rc != KVP_OK) {
            kvp_log_error(c->name, "embedded segment (%llu bytes): %s",
                          (unsigned long long)sc.global_segment_size, kvp_errname(rc));
            goto fail;
        }
    }
    rc = kvp_client_metrics_start(c);
    if (rc != KVP_OK) {
        kvp_log_error(c->name, "metrics endpoint on port %u: %s", c->cfg.metrics_port, kvp_errname(rc));
        goto fail;
    }
    kvp_log_info(c->name, "open (%s%s%s%s)", c->cfg.master_server_address[0] ? c->cfg.master_server_address
                                                                              : c->cfg.cluster_file,
                 c->seg ? ", embedded segment " : "", c->seg ? kvp_segment_name(c->seg) : "",
                 c->cfg.tenant_id[0] ? ", tenant_id kept, not yet enforced" : "");
    *out = c;
    return KVP_OK;

fail:
    client_free(c);
    return rc;
}

void kvp_client_close(kvp_client **cp)
{
    if (!cp || !*cp)
        return;
    struct kvp_client *c = *cp;
    *cp = NULL;
    /* New calls get KVP_ERR_CLOSED from here on. */
    uint64_t inside = kvp_client_mark_closed(c);
    /* Fence the transfers of the calls in flight now (their slices end KVP_ERR_CLOSED) instead
     * of waiting for their timeouts; each call still returns only once its slices are terminal. */
    if (c->xfer)
        kvp_xfer_engine_stop(c->xfer);
    /* the client actor answers once the last call inside left */
    if (kvp_client_close_wait(c, inside) != KVP_OK) {
        /* Not known to be idle (the client actor stopped answering, logged): freeing could pull
         * the client from under a call still inside, so it is left allocated. */
        kvp_log_error(c->name, "close: the client is not freed (a call may still be inside)");
        return;
    }
    kvp_log_info(c->name, "closing");
    client_free(c); /* segment (unmount) → engine → session */
}

/* ------------------------------------------------------------------ exists / remove / size */

int kvp_batch_exists(kvp_client *c, size_t n, const char *const keys[], int results[])
{
    if (!c || (n > 0 && (!keys || !results)))
        return kvp_client_invalid(__func__, "client NULL, or a NULL keys/results array with n > 0");
    if (n == 0)
        return KVP_OK;
    int rc = kvp_client_enter(c);
    if (rc != KVP_OK)
        return rc;
    uint64_t t0 = kvp_client_metrics_t0(c);
    char **valid = calloc(n, sizeof *valid);
    size_t *pos = calloc(n, sizeof *pos);
    if (!valid || !pos) {
        rc = KVP_ERR_NOMEM;
        goto out;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        results[i] = kvp_client_check_key(keys[i]);
        if (results[i] == KVP_OK) {
            pos[m] = i;
            valid[m++] = (char *)keys[i];
        }
    }
    if (m > 0) {
        Kvp__Request req;
        Kvp__ExistsReq ex;
        kvp__request__init(&req);
        kvp__exists_req__init(&ex);
        ex.n_keys = m;
        ex.keys = valid;
        req.body_case = KVP__REQUEST__BODY_EXISTS;
        req.exists = &ex;
        Kvp__Response *resp = NULL;
        int r = kvp_client_rpc(c, &req, kvp_client_deadline(c, 0), KVP__RESPONSE__BODY_EXISTS, &resp);
        if (r == KVP_OK && resp->exists->n_results != m)
            r = KVP_ERR_MALFORMED;
        for (size_t j = 0; j < m; j++)
            results[pos[j]] = r == KVP_OK ? resp->exists->results[j] : r;
        kvp_msession_response_free(resp);
    }
out:
    free(valid);
    free(pos);
    kvp_client_metrics_exists(c, rc, n, rc == KVP_OK ? results : NULL, t0);
    kvp_client_leave(c);
    return rc;
}

int kvp_exists(kvp_client *c, const char *key)
{
    int r = 0;
    const char *keys[1] = {key};
    int rc = kvp_batch_exists(c, 1, keys, &r);
    return rc != KVP_OK ? rc : r;
}

int kvp_remove(kvp_client *c, const char *key, bool force)
{
    if (!c || kvp_client_check_key(key) != KVP_OK)
        return kvp_client_invalid(__func__, "client NULL, or bad key (NULL, empty or over 512 bytes)");
    int rc = kvp_client_enter(c);
    if (rc != KVP_OK)
        return rc;
    Kvp__Request req;
    Kvp__RemoveReq rm;
    kvp__request__init(&req);
    kvp__remove_req__init(&rm);
    char *keys[1] = {(char *)key};
    rm.n_keys = 1;
    rm.keys = keys;
    rm.force = force;
    req.body_case = KVP__REQUEST__BODY_REMOVE;
    req.remove = &rm;
    Kvp__Response *resp = NULL;
    rc = kvp_client_rpc(c, &req, kvp_client_deadline(c, 0), KVP__RESPONSE__BODY_REMOVE, &resp);
    if (rc == KVP_OK)
        rc = resp->remove->n_status == 1 ? resp->remove->status[0] : KVP_ERR_MALFORMED;
    kvp_msession_response_free(resp);
    kvp_client_leave(c);
    return rc;
}

int64_t kvp_get_size(kvp_client *c, const char *key)
{
    if (!c || kvp_client_check_key(key) != KVP_OK)
        return kvp_client_invalid(__func__, "client NULL, or bad key (NULL, empty or over 512 bytes)");
    int rc = kvp_client_enter(c);
    if (rc != KVP_OK)
        return rc;
    Kvp__Request req;
    Kvp__GetSizeReq gs;
    kvp__request__init(&req);
    kvp__get_size_req__init(&gs);
    char *keys[1] = {(char *)key};
    gs.n_keys = 1;
    gs.keys = keys;
    req.body_case = KVP__REQUEST__BODY_GET_SIZE;
    req.get_size = &gs;
    Kvp__Response *resp = NULL;
    int64_t r = kvp_client_rpc(c, &req, kvp_client_deadline(c, 0), KVP__RESPONSE__BODY_GET_SIZE, &resp);
    if (r == KVP_OK)
        r = resp->get_size->n_sizes == 1 ? resp->get_size->sizes[0] : KVP_ERR_MALFORMED;
    kvp_msession_response_free(resp);
    kvp_client_leave(c);
    return r;
}

/* ------------------------------------------------------------------ registered buffers */

int kvp_client_register_range(kvp_client *c, void *addr, size_t len, bool allow_overlap, const char *fn)
{
    if (!c || !addr || len == 0 || (uintptr_t)addr + len < (uintptr_t)addr)
        return kvp_client_invalid(fn, "client or addr NULL, len 0, or the range wraps around");
    int rc = kvp_client_enter(c);
    if (rc != KVP_OK)
        return rc;
    rc = kvp_client_buf_add(c, (uintptr_t)addr, len, allow_overlap);
    if (rc == KVP_OK) {
        kvp_client_dev_register(c, addr, len); /* [GPU hook] device memory: cache, pin bounce buffers */
        /* rdma: memory regions, so transfers from/to the buffer skip the bounce pool */
        int r2 = c->rdma_opts ? kvp_xfer_mem_register(c->xfer, addr, len) : KVP_OK;
        if (r2 != KVP_OK)
            kvp_log_warn(c->name, "%s %p+%zu: RDMA registration failed (%s): its transfers are staged "
                         "through the bounce pool", fn, addr, len, kvp_errname(r2));
    }
    kvp_client_leave(c);
    return rc;
}

int kvp_register_buffer(kvp_client *c, void *addr, size_t len)
{
    return kvp_client_register_range(c, addr, len, false, __func__);
}

int kvp_unregister_buffer(kvp_client *c, void *addr)
{
    if (!c || !addr)
        return kvp_client_invalid(__func__, "client or addr NULL");
    int rc = kvp_client_enter(c);
    if (rc != KVP_OK)
        return rc;
    size_t len = 0;
    rc = kvp_client_buf_del(c, (uintptr_t)addr, &len);
    if (rc == KVP_OK && c->rdma_opts)
        (void)kvp_xfer_mem_unregister(c->xfer, addr, len); /* not registered there (logged then): NOT_FOUND */
    if (rc == KVP_OK)
        kvp_devmem_forget((uintptr_t)addr); /* [GPU hook] no-op for host memory */
    kvp_client_leave(c);
    return rc;
}
