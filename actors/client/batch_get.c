/*
 * batch_get.c — kvp_get, kvp_batch_get, kvp_batch_get_iov (DESIGN.md "Core flows", Get;
 * docs/internals.md "Client flows").
 *
 * One call: validate → one GetReplicaList for the distinct valid keys → rounds of one
 * transfer batch each: every slot still pending reads from its current replica; a slot whose
 * read failed (transfer error or checksum mismatch) moves on to its next replica in the next
 * round; a slot whose replicas are exhausted fails (TRANSFER, or CORRUPT when a replica
 * returned wrong bytes). Each slot is read on its own, so a key present twice in one batch
 * fills both slots. Segments that failed with a transfer error are reported
 * (ReportUnreachable) at the end of the call. A batch of more than KVP_CLIENT_GET_CHUNK keys
 * runs this for each chunk in turn, within the call's one deadline.
 *
 * Silent peers (contract C4): a replica behind a frozen process or a dead host link keeps its
 * TCP connection open and never answers, so a round given the whole remaining time would spend
 * it all there. Rule: while some pending slot still has an untried replica after its current
 * one, a round's transfer time is capped at
 *     min(remaining / (most_untried + 1), budget),  budget = max(200 ms, transfer_timeout / 4)
 * (most_untried: the largest number of untried replicas after the current one over the pending
 * slots; transfer_timeout the client's configured call timeout, 10 s when unset). The engine
 * fences what is outstanding when the round's time runs out (a fenced READ's late bytes go to
 * engine scratch, never to the caller's buffer: docs/fencing.md), so the next round may reuse
 * the same destination for the next replica. A slot that timed out in a capped round moves to
 * its next replica; on its last replica it stays there and is tried again in the next round.
 * A round where no pending slot has another replica gets the full remaining time, and a
 * timeout then is the call's KVP_ERR_TIMEOUT. A segment whose slices timed out in a capped round
 * is reported unreachable unless another slice of the same round completed on it (it answers,
 * it is only slow).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "actors/client/client.h"
#include "actors/session/dtoken.h"
#include "actors/client/client_metrics.h"
#include "actors/client/devmem.h"
#include "actors/client/devstage.h"
#include "runtime/clock.h"
#include "runtime/log.h"

/* Per-slot state of one get call. */
struct get_slot {
    const Kvp__ObjectInfo *info; /* borrowed from the reply; NULL when the slot is done */
    size_t order[16];           /* replica indexes, best first */
    size_t n_order;
    size_t cursor;              /* index into order[] of the replica being tried */
    int last_err;               /* TRANSFER or CORRUPT: what exhausted replicas report */
    bool pending;
    bool retry;                 /* this round failed on the current replica: try the next one */
    bool again;                 /* timed out in a capped round on its last replica: same one again */
};

/* Floor of the per-replica round budget of the silent-peer rule (file comment). */
#define GET_REPLICA_BUDGET_MIN_MS 200u

/* Transfer time of one round: left, or the capped share when some pending slot has another
 * untried replica (file comment). */
static uint32_t round_budget(const struct kvp_client *c, const struct get_slot *sl, size_t n,
                             uint32_t left)
{
    size_t most = 0;
    for (size_t i = 0; i < n; i++)
        if (sl[i].pending && sl[i].n_order - sl[i].cursor - 1 > most)
            most = sl[i].n_order - sl[i].cursor - 1;
    if (most == 0)
        return left;
    uint32_t tt = c->cfg.transfer_timeout_ms ? c->cfg.transfer_timeout_ms : 10000;
    uint32_t budget = tt / 4 > GET_REPLICA_BUDGET_MIN_MS ? tt / 4 : GET_REPLICA_BUDGET_MIN_MS;
    uint32_t share = (uint32_t)(left / (most + 1));
    uint32_t r = share < budget ? share : budget;
    return r > 0 ? r : 1;
}

static int cmp_keys(const void *a, const void *b, void *arg)
{
    const char *const *keys = arg;
    return strcmp(keys[*(const size_t *)a], keys[*(const size_t *)b]);
}

static uint64_t cap_of(const struct kvp_client_obj *o)
{
    uint64_t cap = 0;
    for (size_t k = 0; k < o->iovcnt; k++)
        cap += o->iov[k].len;
    return cap;
}

static int check_obj(const struct kvp_client_obj *o, int *dev)
{
    *dev = -1;
    if (kvp_client_check_key(o->key) != KVP_OK || (!o->iov && o->iovcnt > 0))
        return kvp_client_invalid(__func__, "bad key (NULL, empty or over 512 bytes), or a NULL iov array with iovcnt > 0");
    for (size_t k = 0; k < o->iovcnt; k++)
        if (o->iov[k].len > 0 && !o->iov[k].base)
            return kvp_client_invalid(__func__, "an iov piece of non-zero length has a NULL base");
    /* [GPU hook] an object with device pieces is staged (devstage.h) */
    int cl = kvp_devmem_iov_class("get", o->key, o->iov, o->iovcnt, dev);
    if (cl <= 0)
        *dev = -1;
    return cl < 0 ? cl : KVP_OK;
}

static size_t count_pieces(const struct kvp_client_obj *o, uint64_t size)
{
    size_t n = 0;
    uint64_t left = size;
    for (size_t k = 0; k < o->iovcnt && left > 0; k++) {
        if (o->iov[k].len == 0)
            continue;
        n++;
        left -= o->iov[k].len < left ? o->iov[k].len : left;
    }
    return n;
}

void kvp_client_report_unreachable(struct kvp_client *c, const uint32_t *segs, size_t n, uint64_t deadline)
{
    for (size_t i = 0; i < n; i++)
        kvp_client_avoid_note(c, segs[i]);
    for (size_t i = 0; i < n; i++) {
        if (kvp_client_remaining(deadline) == 0)
            return;
        Kvp__Request req;
        Kvp__ReportUnreachableReq ru;
        kvp__request__init(&req);
        kvp__report_unreachable_req__init(&ru);
        ru.segment_id = segs[i];
        req.body_case = KVP__REQUEST__BODY_REPORT_UNREACHABLE;
        req.report_unreachable = &ru;
        Kvp__Response *resp = NULL;
        /* The body of the reply does not matter: any answer (or none) is fine. */
        uint32_t t = kvp_client_remaining(deadline);
        kvp_msession_call(c->ms, &req, t < 500 ? t : 500, &resp);
        kvp_msession_response_free(resp);
        kvp_log_info(c->name, "segment %u reported unreachable", segs[i]);
    }
}

/* One GetReplicaList and its transfer rounds for objs[0..n-1], until deadline (ms). */
static void get_objs_chunk(struct kvp_client *c, size_t n, const struct kvp_client_obj *objs,
                           uint64_t deadline, int64_t results[])
{
    uint64_t t_start = kvp_clock_now_us();
    uint64_t t_verify = 0; /* time spent verifying checksums (debug line) */
    unsigned rounds = 0;
    const char **keyv = calloc(n, sizeof *keyv);
    size_t *sorted = calloc(n, sizeof *sorted);
    size_t *uidx = calloc(n, sizeof *uidx);   /* slot → index of its key in the request */
    char **ukeys = calloc(n, sizeof *ukeys);
    struct get_slot *sl = calloc(n, sizeof *sl);
    uint32_t *bad = calloc(n, sizeof *bad);   /* segments that failed with a transfer error */
    size_t n_bad = 0;
    struct kvp_xfer_slice *slices = NULL;
    size_t *slice_slot = NULL;
    Kvp__Response *resp = NULL;
    int *obj_dev = calloc(n, sizeof *obj_dev);       /* [GPU hook] per slot: device ordinal or -1 */
    uint64_t *dsum = NULL;                           /* [GPU hook] per staged slot: XXH3 of its bounce bytes */
    bool any_dev = false;                            /* [GPU hook] some slot is staged */

    if (!keyv || !sorted || !uidx || !ukeys || !sl || !bad || !obj_dev) {
        for (size_t i = 0; i < n; i++)
            results[i] = KVP_ERR_NOMEM;
        goto out;
    }

    /* 1. validate; distinct keys for the request */
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        results[i] = check_obj(&objs[i], &obj_dev[i]);
        any_dev |= obj_dev[i] >= 0;
        keyv[i] = objs[i].key;
        if (results[i] == KVP_OK)
            sorted[m++] = i;
    }
    if (m == 0)
        goto out;
    qsort_r(sorted, m, sizeof *sorted, cmp_keys, keyv);
    size_t nu = 0;
    for (size_t j = 0; j < m; j++) {
        if (j == 0 || strcmp(keyv[sorted[j]], keyv[sorted[j - 1]]) != 0)
            ukeys[nu++] = (char *)keyv[sorted[j]];
        uidx[sorted[j]] = nu - 1;
    }

    /* 2. one GetReplicaList */
    Kvp__Request req;
    Kvp__GetReplicaListReq gr;
    kvp__request__init(&req);
    kvp__get_replica_list_req__init(&gr);
    gr.n_keys = nu;
    gr.keys = ukeys;
    gr.client_host = c->cfg.local_hostname;
    struct kvp_client_view view; /* witnesses taken, avoid list copied: one request (client_actor.c) */
    kvp_client_get_begin(c, &view);
    gr.n_read_segments = view.n_read_ok;
    gr.read_segments = view.read_ok;
    req.body_case = KVP__REQUEST__BODY_GET_REPLICAS;
    req.get_replicas = &gr;
    /* The lease runs from the master's reply; timing it from before the request is the safe
     * side (docs/eviction.md). */
    uint64_t reply_ms = kvp_clock_now_ms();
    int rc = kvp_client_rpc(c, &req, deadline, KVP__RESPONSE__BODY_GET_REPLICAS, &resp);
    uint64_t t_listed = kvp_clock_now_us();
    if (rc == KVP_OK && resp->get_replicas->n_objects != nu) {
        kvp_log_warn(c->name, "GetReplicaList: %zu objects for %zu keys", resp->get_replicas->n_objects, nu);
        rc = KVP_ERR_MALFORMED;
    }
    if (rc != KVP_OK) {
        for (size_t j = 0; j < m; j++)
            results[sorted[j]] = rc;
        goto out;
    }

    /* 3. per slot: status, size check, replica order */
    uint32_t local_seg = atomic_load(&c->local_seg_id);
    uint64_t pid = (uint64_t)getpid();
    uint64_t lease_ms = UINT64_MAX;
    size_t pending = 0;
    for (size_t j = 0; j < m; j++) {
        size_t i = sorted[j];
        const Kvp__ObjectInfo *info = resp->get_replicas->objects[uidx[i]];
        if (info->status != KVP_OK) {
            results[i] = info->status < 0 ? info->status : KVP_ERR_INTERNAL;
            continue;
        }
        if (info->n_replicas == 0 || info->size == 0) {
            results[i] = KVP_ERR_NOT_FOUND;
            continue;
        }
        if (info->size > cap_of(&objs[i])) {
            results[i] = KVP_ERR_BUFFER_TOO_SMALL; /* nothing transferred */
            continue;
        }
        if (info->lease_ttl_ms && info->lease_ttl_ms < lease_ms)
            lease_ms = info->lease_ttl_ms;
        struct get_slot *s = &sl[i];
        s->info = info;
        s->last_err = KVP_ERR_TRANSFER;
        size_t lim = info->n_replicas < 16 ? info->n_replicas : 16;
        /* the same process first (local transport), then the master's order, then the
         * replicas on segments this client could not reach lately (kvp_client_avoid_note) */
        uint64_t now_ms = kvp_clock_now_ms();
        bool avoided[16];
        for (size_t r = 0; r < lim; r++)
            avoided[r] = kvp_client_view_avoided(&view, info->replicas[r]->segment_id, now_ms);
        for (size_t r = 0; r < lim; r++) {
            const Kvp__Replica *rep = info->replicas[r];
            if (local_seg && rep->segment_id == local_seg && rep->owner_pid == pid &&
                strcmp(rep->host, c->cfg.local_hostname) == 0)
                s->order[s->n_order++] = r;
        }
        for (int pass = 0; pass < 2; pass++)
            for (size_t r = 0; r < lim; r++) {
                const Kvp__Replica *rep = info->replicas[r];
                if (!(local_seg && rep->segment_id == local_seg && rep->owner_pid == pid &&
                      strcmp(rep->host, c->cfg.local_hostname) == 0) &&
                    avoided[r] == (pass == 1))
                    s->order[s->n_order++] = r;
            }
        s->pending = true;
        pending++;
    }

    /* 4. rounds of transfers */
    size_t max_slices = 0;
    for (size_t i = 0; i < n; i++)
        if (sl[i].pending)
            max_slices += count_pieces(&objs[i], sl[i].info->size);
    if (max_slices > 0) {
        slices = calloc(max_slices, sizeof *slices);
        slice_slot = calloc(max_slices, sizeof *slice_slot);
        if (!slices || !slice_slot) {
            for (size_t i = 0; i < n; i++)
                if (sl[i].pending) {
                    sl[i].pending = false;
                    results[i] = KVP_ERR_NOMEM;
                }
            pending = 0;
        }
    }
    while (pending > 0) {
        uint32_t left = kvp_client_remaining(deadline);
        bool lease_over = lease_ms != UINT64_MAX && kvp_clock_now_ms() >= reply_ms + lease_ms;
        bool closing = kvp_client_closing(c);
        if (left == 0 || lease_over || closing) {
            int why = closing ? KVP_ERR_CLOSED : left == 0 ? KVP_ERR_TIMEOUT : KVP_ERR_LEASE_EXPIRED;
            for (size_t i = 0; i < n; i++)
                if (sl[i].pending) {
                    sl[i].pending = false;
                    results[i] = why;
                }
            break;
        }
        size_t ns = 0;
        for (size_t i = 0; i < n; i++) {
            if (!sl[i].pending)
                continue;
            const Kvp__Replica *rep = sl[i].info->replicas[sl[i].order[sl[i].cursor]];
            const struct kvp_client_obj *o = &objs[i];
            uint64_t off = 0, size = sl[i].info->size;
            for (size_t k = 0; k < o->iovcnt && off < size; k++) {
                if (o->iov[k].len == 0)
                    continue;
                uint64_t l = o->iov[k].len < size - off ? o->iov[k].len : size - off;
                slices[ns] = (struct kvp_xfer_slice){
                    .local = o->iov[k].base,
                    .length = l,
                    .segment_id = rep->segment_id,
                    .endpoint = rep->endpoint,
                    .remote_offset = rep->offset + off,
                    .op = KVP_XFER_READ,
                    .status = KVP_ERR_TIMEOUT,
                };
                slice_slot[ns++] = i;
                off += l;
            }
        }
        uint32_t round_ms = round_budget(c, sl, n, left);
        bool capped = round_ms < left;
        kvp_dtoken_ensure(c->dtok, c->ms, c->xfer, slices, ns, round_ms); /* tokens of new segments */
        /* returns when every slice is terminal: completed, failed or fenced (C2) */
        /* [GPU hook] slots with device pieces go through bounce buffers; the others run exactly
         * as kvp_xfer_run */
        if (any_dev && !dsum && !(dsum = calloc(n, sizeof *dsum))) {
            for (size_t q = 0; q < ns; q++)
                slices[q].status = KVP_ERR_NOMEM;
        } else if (any_dev) {
            struct kvp_devstage_batch db = {.slices = slices, .n = ns, .group = slice_slot, .group_dev = obj_dev,
                                            .n_groups = n, .sum = dsum, .timeout_ms = round_ms};
            kvp_devstage_run(c->devstage, &db);
            kvp_client_read_ok(c, slices, ns); /* (a staging transport set by a test has no batch actor) */
        } else {
            /* its batch actor, in the client actor, notes the read witnesses (no message here) */
            kvp_xfer_run(c->xfer, slices, ns, round_ms);
        }
        rounds++;
        /* A transfer that ended after the lease may have read an extent already reused by
         * another put: its bytes are never returned (docs/eviction.md). */
        if (lease_ms != UINT64_MAX && kvp_clock_now_ms() >= reply_ms + lease_ms) {
            for (size_t i = 0; i < n; i++)
                if (sl[i].pending) {
                    sl[i].pending = false;
                    results[i] = KVP_ERR_LEASE_EXPIRED;
                }
            break;
        }

        /* first failing slice per slot */
        size_t n_capped_to = 0; /* slots fenced by the capped round */
        for (size_t q = 0; q < ns; q++) {
            size_t i = slice_slot[q];
            if (slices[q].status == KVP_OK || !sl[i].pending)
                continue;
            int st = slices[q].status;
            sl[i].pending = false; /* decided below */
            if (capped && st == KVP_ERR_TIMEOUT) {
                /* the replica did not answer within its share: fenced; next replica, or this
                 * one again with the full time once no slot has another replica */
                n_capped_to++;
                if (sl[i].cursor + 1 >= sl[i].n_order) {
                    sl[i].again = true;
                    continue;
                }
                bool alive = false, known = false;
                for (size_t b = 0; b < n_bad; b++)
                    known |= bad[b] == slices[q].segment_id;
                for (size_t p = 0; p < ns && !alive && !known; p++)
                    alive = slices[p].segment_id == slices[q].segment_id && slices[p].status == KVP_OK;
                if (!alive && !known && n_bad < n)
                    bad[n_bad++] = slices[q].segment_id;
                kvp_log_debug(c->name, "get %s: segment %u: no answer within %u ms, next replica",
                              objs[i].key, slices[q].segment_id, round_ms);
                sl[i].retry = true;
                continue;
            }
            if (st == KVP_ERR_TIMEOUT || st == KVP_ERR_CLOSED || st == KVP_ERR_NOMEM ||
                st == KVP_ERR_FENCE_FAILED || st == KVP_ERR_DEVICE) {
                /* fence failure: reported, not retried (C2 item 3); [GPU hook] a GPU copy error is
                 * local: another replica would not help */
                results[i] = st;
                pending--;
                continue;
            }
            bool known = false;
            for (size_t b = 0; b < n_bad; b++)
                known |= bad[b] == slices[q].segment_id;
            if (!known && n_bad < n)
                bad[n_bad++] = slices[q].segment_id;
            kvp_log_debug(c->name, "get %s: segment %u: %s", objs[i].key, slices[q].segment_id,
                          kvp_errname(st));
            if (sl[i].last_err != KVP_ERR_CORRUPT) /* a corrupt replica seen earlier stays reported */
                sl[i].last_err = KVP_ERR_TRANSFER;
            sl[i].retry = true;
        }
        if (n_capped_to > 0)
            kvp_log_info(c->name, "get: %zu key(s) not answered within the %u ms round share, "
                         "retrying them", n_capped_to, round_ms);
        for (size_t i = 0; i < n; i++) {
            if (sl[i].again) { /* same replica, next round */
                sl[i].again = false;
                sl[i].pending = true;
                continue;
            }
            if (!sl[i].info || (!sl[i].pending && !sl[i].retry))
                continue;
            sl[i].retry = false;
            if (sl[i].pending) {
                /* every slice completed: verify */
                const struct kvp_client_obj *o = &objs[i];
                uint64_t tv = kvp_clock_now_us();
                /* [GPU hook] a staged slot was summed on its bounce buffers: the CPU never reads
                 * device memory */
                uint64_t h = obj_dev[i] >= 0 ? dsum[i] : kvp_client_checksum(o->iov, o->iovcnt, sl[i].info->size);
                t_verify += kvp_clock_now_us() - tv;
                if (h == sl[i].info->checksum) {
                    results[i] = (int64_t)sl[i].info->size;
                    sl[i].pending = false;
                    pending--;
                    continue;
                }
                kvp_log_warn(c->name, "get %s: segment %u: checksum mismatch", o->key,
                             sl[i].info->replicas[sl[i].order[sl[i].cursor]]->segment_id);
                sl[i].last_err = KVP_ERR_CORRUPT;
            }
            /* next replica, if any */
            if (++sl[i].cursor < sl[i].n_order) {
                sl[i].pending = true;
            } else {
                sl[i].pending = false;
                results[i] = sl[i].last_err;
                pending--;
            }
        }
    }
    kvp_log_debug(c->name, "get of %zu key(s): GetReplicaList %llu us, %u transfer round(s) %llu us "
                  "(checksums %llu us)",
                  m, (unsigned long long)(t_listed - t_start), rounds,
                  (unsigned long long)(kvp_clock_now_us() - t_listed), (unsigned long long)t_verify);
    kvp_client_report_unreachable(c, bad, n_bad, deadline);

out:
    kvp_msession_response_free(resp);
    free(slices);
    free(slice_slot);
    free(keyv);
    free(sorted);
    free(uidx);
    free(ukeys);
    free(sl);
    free(bad);
    free(obj_dev);
    free(dsum);
}

void kvp_client_get_objs(struct kvp_client *c, size_t n, const struct kvp_client_obj *objs,
                         uint32_t timeout_ms, int64_t results[])
{
    /* One deadline for the whole call; a large batch asks the master for KVP_CLIENT_GET_CHUNK
     * keys at a time (a GetReplicaList reply for 600,000 keys with 3 replicas each is over the
     * 64 MiB message limit: the master could not send it and every key got UNAVAILABLE). */
    uint64_t deadline = kvp_client_deadline(c, timeout_ms);
    for (size_t off = 0; off < n; off += KVP_CLIENT_GET_CHUNK) {
        size_t cn = n - off < KVP_CLIENT_GET_CHUNK ? n - off : KVP_CLIENT_GET_CHUNK;
        int why = off > 0 ? kvp_client_chunk_gate(c, deadline, "get", n, off) : 0;
        if (why) {
            for (size_t i = off; i < n; i++)
                results[i] = why;
            return;
        }
        get_objs_chunk(c, cn, objs + off, deadline, results + off);
    }
}

/* ------------------------------------------------------------------ public entry points */

/* The batch get after its arguments were checked (n > 0): the objects (iovs or bufs), the call
 * counted in the metrics. */
static int batch_get_run(kvp_client *c, size_t n, const char *const keys[], const kvp_iov *const iovs[],
                         const size_t iovcnt[], void *const bufs[], const size_t caps[], uint32_t timeout_ms,
                         int64_t results[])
{
    int rc = kvp_client_enter(c);
    if (rc != KVP_OK)
        return rc;
    uint64_t t0 = kvp_client_metrics_t0(c);
    struct kvp_client_obj *objs = kvp_client_objs_new(n, keys, iovs, iovcnt, bufs, caps);
    if (!objs) {
        kvp_client_metrics_get(c, KVP_ERR_NOMEM, n, NULL, t0);
        kvp_client_leave(c);
        return KVP_ERR_NOMEM;
    }
    kvp_client_get_objs(c, n, objs, timeout_ms, results);
    free(objs);
    kvp_client_metrics_get(c, KVP_OK, n, results, t0);
    kvp_client_leave(c);
    return KVP_OK;
}

int kvp_batch_get_iov(kvp_client *c, size_t n, const char *const keys[], const kvp_iov *const iovs[],
                      const size_t iovcnt[], uint32_t timeout_ms, int64_t results[])
{
    if (!c || (n > 0 && (!keys || !iovs || !iovcnt || !results)))
        return kvp_client_invalid(__func__, "client NULL, or a NULL keys/iovs/iovcnt/results array with n > 0");
    return n == 0 ? KVP_OK : batch_get_run(c, n, keys, iovs, iovcnt, NULL, NULL, timeout_ms, results);
}

int kvp_batch_get(kvp_client *c, size_t n, const char *const keys[], void *const bufs[],
                  const size_t caps[], uint32_t timeout_ms, int64_t results[])
{
    if (!c || (n > 0 && (!keys || !bufs || !caps || !results)))
        return kvp_client_invalid(__func__, "client NULL, or a NULL keys/bufs/caps/results array with n > 0");
    return n == 0 ? KVP_OK : batch_get_run(c, n, keys, NULL, NULL, bufs, caps, timeout_ms, results);
}

int64_t kvp_get(kvp_client *c, const char *key, void *buf, size_t cap, uint32_t timeout_ms)
{
    int64_t r = KVP_ERR_INTERNAL;
    const char *keys[1] = {key};
    void *bufs[1] = {buf};
    size_t caps[1] = {cap};
    int rc = kvp_batch_get(c, 1, keys, bufs, caps, timeout_ms, &r);
    return rc != KVP_OK ? rc : r;
}
