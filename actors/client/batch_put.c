/*
 * batch_put.c — kvp_put, kvp_batch_put, kvp_batch_put_iov (DESIGN.md "Core flows", Put;
 * docs/internals.md "Client flows").
 *
 * One call: validate → one PutStart for every valid item → one transfer batch writing every
 * replica of every started item (a slice per replica per iov piece; the items' XXH3-64 is
 * computed in the calling thread while the bytes are on the wire) → one PutEnd (XXH3-64) for
 * the items whose slices all completed → one PutRevoke for the rest. An item becomes visible
 * only through PutEnd, after all of its bytes are written: a put never leaves a key visible
 * without its bytes. A batch of more than KVP_CLIENT_PUT_CHUNK items runs this for each chunk in
 * turn, within the call's one deadline.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/client/client.h"
#include "actors/session/dtoken.h"
#include "actors/client/client_metrics.h"
#include "actors/client/devmem.h"
#include "actors/client/devstage.h"
#include "actors/client/put_retry.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "wire/rdma_hello.h"

/* Per-item state of one put call. */
/* Most replicas a PutEnd echoes per item (KVP_FSM_MAX_REPLICAS). */
#define KVP_PUT_PLACE_MAX 16u

struct put_item {
    size_t obj;           /* index into objs/results */
    uint64_t size;        /* object bytes */
    uint64_t op_id;
    int status;           /* running status of the item */
    const Kvp__PutStartResult *start; /* PutStart result (borrowed from the response) */
    int dev;              /* [GPU hook] device ordinal of its device pieces, -1: host memory only */
};

static uint64_t obj_size(const struct kvp_client_obj *o, int *rc)
{
    uint64_t size = 0;
    *rc = KVP_OK;
    if (!o->iov && o->iovcnt > 0) {
        *rc = kvp_client_invalid(__func__, "a NULL iov array with iovcnt > 0");
        return 0;
    }
    for (size_t k = 0; k < o->iovcnt; k++) {
        if (o->iov[k].len > 0 && !o->iov[k].base)
            *rc = kvp_client_invalid(__func__, "an iov piece of non-zero length has a NULL base");
        if (size + o->iov[k].len < size) { /* the slices carry the pieces' own lengths */
            *rc = kvp_client_invalid(__func__, "the iov pieces' lengths add up to more than 2^64 bytes");
            return 0;
        }
        size += o->iov[k].len;
    }
    if (size == 0)
        *rc = kvp_client_invalid(__func__, "an object of 0 bytes (objects are 1 byte or larger)");
    return size;
}

/* Map a slice's terminal status to the put's per-key error. */
static int slice_error(int st)
{
    if (st == KVP_ERR_TIMEOUT || st == KVP_ERR_CLOSED || st == KVP_ERR_NOMEM || st == KVP_ERR_FENCE_FAILED ||
        st == KVP_ERR_DEVICE)
        return st;
    return KVP_ERR_TRANSFER;
}

/* Best-effort PutRevoke of the items with revoke[j] set. The pending put's deadline revokes
 * anything this does not reach. */
static void send_revoke(struct kvp_client *c, struct put_item *it, size_t m, const bool *revoke,
                        const struct kvp_client_obj *objs, uint64_t deadline)
{
    Kvp__PutRevokeItem *ri = calloc(m, sizeof *ri);
    Kvp__PutRevokeItem **rp = calloc(m, sizeof *rp);
    size_t k = 0;
    if (!ri || !rp)
        goto out;
    for (size_t j = 0; j < m; j++) {
        if (!revoke[j])
            continue;
        kvp__put_revoke_item__init(&ri[k]);
        ri[k].key = (char *)objs[it[j].obj].key;
        ri[k].op_id = it[j].op_id;
        rp[k] = &ri[k];
        k++;
    }
    if (k > 0) {
        Kvp__Request req;
        Kvp__PutRevokeReq pr;
        kvp__request__init(&req);
        kvp__put_revoke_req__init(&pr);
        pr.n_items = k;
        pr.items = rp;
        if (c->rdma_opts) {
            /* its RDMA writers (client.c): segments fence only them (docs/rdma.md "Per-writer
             * fence"); a TCP client names none, and an RDMA segment then fences every writer */
            pr.writer_id = c->client_id & KVP_RDMA_WRITER_FAMILY_MASK;
            pr.writer_mask = KVP_RDMA_WRITER_FAMILY_MASK;
        }
        req.body_case = KVP__REQUEST__BODY_PUT_REVOKE;
        req.put_revoke = &pr;
        Kvp__Response *resp = NULL;
        int rc = kvp_client_rpc(c, &req, deadline, KVP__RESPONSE__BODY_PUT_REVOKE, &resp);
        if (rc != KVP_OK)
            kvp_log_warn(c->name, "put revoke of %zu item(s): %s (their deadline will revoke them)", k,
                         kvp_errname(rc));
        kvp_msession_response_free(resp);
    }
out:
    free(ri);
    free(rp);
}

/* The checksums of the items being written, computed while their bytes are on the wire
 * (kvp_xfer_run_overlap): the CPU pass over the object overlaps the transfer. */
struct put_sums {
    const struct put_item *it;
    size_t m;
    const struct kvp_client_obj *objs;
    uint64_t *sum;
    bool *have;
    /* Level 6: send PutIntent for the items with intent[j] once their checksums are known. */
    struct kvp_client *c;
    const bool *intent;
    uint64_t deadline;
    uint32_t replica_num;
    bool soft_pin;
};

/* The PutEnd item of it (key, op, checksum, and the placement echoed from its PutStart result
 * when placed from a reservation). place: KVP_PUT_PLACE_MAX slots for it. */
static void end_item_fill(Kvp__PutEndItem *ei, const struct put_item *it, const struct kvp_client_obj *o,
                          uint64_t checksum, uint32_t replica_num, bool soft_pin, Kvp__ReplicaPlace *place,
                          Kvp__ReplicaPlace **placep)
{
    kvp__put_end_item__init(ei);
    ei->key = (char *)o->key;
    ei->op_id = it->op_id;
    ei->checksum = checksum;
    const Kvp__PutStartResult *sr = it->start;
    if (!sr || !sr->term || sr->n_replicas > KVP_PUT_PLACE_MAX || !place || !placep)
        return;
    /* Placed by the leader in its reservations: echo the placement, so that a new leader can
     * commit this put after a failover (docs/master.md "One-commit put"). */
    ei->term = sr->term;
    ei->deadline_ms = sr->deadline_ms;
    ei->size = it->size;
    ei->replica_num = replica_num;
    ei->soft_pin = soft_pin;
    ei->replicas = placep;
    for (size_t k = 0; k < sr->n_replicas; k++) {
        kvp__replica_place__init(&place[k]);
        place[k].segment_id = sr->replicas[k]->segment_id;
        place[k].offset = sr->replicas[k]->offset;
        ei->replicas[ei->n_replicas++] = &place[k];
    }
}

/* Level 6 (docs/master.md "Intent overlapped with the transfer (level 6)"): a put placed from a
 * reservation may have its intent committed while its bytes move, so that its PutEnd is
 * answered without a commit: the put then costs max(checksum + commit, transfer) instead of
 * transfer + commit. Only for calls of at least `put_intent_min_bytes` (default 1 MiB; 0 =
 * never): a smaller transfer is shorter than a commit (a 1 MiB write on loopback ~0.4 ms, a
 * commit ~1 ms), so the intent would be the longer leg and its extra RPC would only add master
 * work for no gain. On a host whose cores are all busy the overlap has no spare CPU to run on
 * (docs/master.md, figures), which is what the key is for.
 *
 * PutIntent for the items marked in ps->intent whose checksums are known; its answer is only
 * logged: whatever it was, the PutEnd that follows ends each put (sealing a committed intent,
 * committing the others as before), and a failed put is revoked as before. */
static void put_send_intent(struct put_sums *ps)
{
    size_t m = ps->m, n = 0;
    Kvp__PutEndItem *ii = calloc(m, sizeof *ii);
    Kvp__PutEndItem **ip = calloc(m, sizeof *ip);
    Kvp__ReplicaPlace *place = calloc(m * KVP_PUT_PLACE_MAX, sizeof *place);
    Kvp__ReplicaPlace **placep = calloc(m * KVP_PUT_PLACE_MAX, sizeof *placep);
    if (ii && ip && place && placep) {
        for (size_t j = 0; j < m; j++) {
            if (!ps->intent[j] || !ps->have[j] || ps->it[j].status != KVP_OK)
                continue;
            end_item_fill(&ii[n], &ps->it[j], &ps->objs[ps->it[j].obj], ps->sum[j], ps->replica_num, ps->soft_pin,
                          &place[n * KVP_PUT_PLACE_MAX], &placep[n * KVP_PUT_PLACE_MAX]);
            ip[n] = &ii[n];
            n++;
        }
    }
    if (n > 0) {
        Kvp__Request req;
        Kvp__PutIntentReq pi;
        kvp__request__init(&req);
        kvp__put_intent_req__init(&pi);
        pi.n_items = n;
        pi.items = ip;
        req.body_case = KVP__REQUEST__BODY_PUT_INTENT;
        req.put_intent = &pi;
        Kvp__Response *resp = NULL;
        int rc = kvp_client_rpc(ps->c, &req, ps->deadline, KVP__RESPONSE__BODY_PUT_END, &resp);
        if (rc != KVP_OK)
            kvp_log_debug(ps->c->name, "PutIntent of %zu item(s): %s (PutEnd commits them)", n, kvp_errname(rc));
        kvp_msession_response_free(resp);
    }
    free(ii);
    free(ip);
    free(place);
    free(placep);
}

static void put_sums_compute(void *arg)
{
    struct put_sums *ps = arg;
    for (size_t j = 0; j < ps->m; j++) {
        if (ps->it[j].status != KVP_OK || ps->it[j].dev >= 0) /* [GPU hook] staged: summed on its bounce buffers */
            continue;
        const struct kvp_client_obj *o = &ps->objs[ps->it[j].obj];
        ps->sum[j] = kvp_client_checksum(o->iov, o->iovcnt, ps->it[j].size);
        ps->have[j] = true;
    }
    if (ps->intent) /* still in the calling thread while the bytes move */
        put_send_intent(ps);
}

/* Most segments one put call reports unreachable. */
#define KVP_PUT_MAX_REPORTS 16

/* PutStart ttl = the call's remaining time + this (clock-skew and apply-delay margin). */
#define KVP_CLIENT_PUT_TTL_MARGIN_MS 2000u

/* One PutStart/transfer/PutEnd round for objs[0..n-1], the items base..base+n-1 of the call,
 * until deadline (ms). */
static void put_objs_chunk(struct kvp_client *c, size_t n, const struct kvp_client_obj *objs,
                           size_t base, const kvp_put_opts *opts, uint64_t deadline, int results[])
{
    uint64_t t_start = kvp_clock_now_us();
    uint64_t t_started = 0, t_written = 0;
    uint32_t replica_num = opts && opts->replica_num ? opts->replica_num : c->cfg.replica_num;
    if (replica_num == 0)
        replica_num = 1;

    struct put_item *it = calloc(n, sizeof *it);
    Kvp__PutStartItem *si = calloc(n, sizeof *si);
    Kvp__PutStartItem **sp = calloc(n, sizeof *sp);
    bool *revoke = calloc(n, sizeof *revoke);
    Kvp__PutEndItem *ei = calloc(n, sizeof *ei);
    Kvp__PutEndItem **ep = calloc(n, sizeof *ep);
    Kvp__ReplicaPlace *place = NULL, **placep = NULL; /* PutEnd placements (one-commit put) */
    size_t *epos = calloc(n, sizeof *epos);
    uint64_t *sum = calloc(n, sizeof *sum);
    bool *have_sum = calloc(n, sizeof *have_sum);
    bool *want_intent = calloc(n, sizeof *want_intent); /* NULL: no intents (today's flow) */
    struct kvp_xfer_slice *slices = NULL;
    size_t *slice_item = NULL;
    uint8_t *slice_feed = NULL; /* [GPU hook] 1: replica 0's slices, which feed the staged checksum */
    int *item_dev = NULL;       /* [GPU hook] per item: it[j].dev */
    uint32_t bad[KVP_PUT_MAX_REPORTS]; /* segments whose slices failed with a transfer error */
    size_t n_bad = 0;
    uint32_t wrote[KVP_PUT_MAX_REPORTS]; /* segments that took a slice: witnesses sent in PutEnd */
    size_t n_wrote = 0;
    Kvp__Response *start_resp = NULL, *end_resp = NULL;
    size_t m = 0;
    /* NO_SPACE retries while the master evicts (put_retry.c): latest result per item. */
    const Kvp__PutStartResult **res = NULL;
    int *rpc_st = NULL;
    Kvp__Response **extra = NULL;
    size_t n_extra = 0;

    if (!it || !si || !sp || !revoke || !ei || !ep || !epos || !sum || !have_sum) {
        for (size_t i = 0; i < n; i++)
            results[i] = KVP_ERR_NOMEM;
        goto out;
    }

    /* 1. validate, build PutStart items */
    for (size_t i = 0; i < n; i++) {
        int rc = kvp_client_check_key(objs[i].key);
        uint64_t size = 0;
        if (rc == KVP_OK)
            size = obj_size(&objs[i], &rc);
        int dev = -1; /* [GPU hook] device pieces are staged (devstage.h) */
        if (rc == KVP_OK) {
            int cl = kvp_devmem_iov_class("put", objs[i].key, objs[i].iov, objs[i].iovcnt, &dev);
            rc = cl < 0 ? cl : KVP_OK;
            if (cl <= 0)
                dev = -1;
        }
        results[i] = rc;
        if (rc != KVP_OK)
            continue;
        it[m] = (struct put_item){
            .obj = i,
            .size = size,
            .op_id = c->client_id ^ (atomic_fetch_add(&c->op_counter, 1) + 1),
            .status = KVP_OK,
            .dev = dev,
        };
        kvp__put_start_item__init(&si[m]);
        si[m].key = (char *)objs[i].key;
        si[m].size = size;
        si[m].replica_num = replica_num;
        si[m].soft_pin = opts ? opts->soft_pin : false;
        si[m].preferred_segment = (char *)(opts && opts->preferred_segment ? opts->preferred_segment : "");
        si[m].op_id = it[m].op_id;
        si[m].client_host = c->cfg.local_hostname;
        si[m].parent_key = (char *)kvp_client_put_parent(base + i); /* kvp_batch_put_hinted, else "" */
        sp[m] = &si[m];
        m++;
    }
    if (m == 0)
        goto out;
    bool any_dev = false; /* [GPU hook] some item is staged */
    for (size_t j = 0; j < m; j++)
        any_dev |= it[j].dev >= 0;

    /* 2. PutStart for the whole batch */
    {
        Kvp__Request req;
        Kvp__PutStartReq ps;
        kvp__request__init(&req);
        kvp__put_start_req__init(&ps);
        ps.n_items = m;
        ps.items = sp;
        /* The pending put outlives this call's write deadline (the segment lands no byte after
         * it): the master revokes it at ttl, then quarantines the space fence_grace_ms more
         * (contract C3, docs/fencing.md). */
        ps.ttl_ms = (uint64_t)kvp_client_remaining(deadline) + KVP_CLIENT_PUT_TTL_MARGIN_MS;
        /* segments this client could not reach lately: placed last (issue 18 item 2) */
        uint32_t avoid[KVP_CLIENT_AVOID_MAX];
        ps.n_avoid_segments = kvp_client_avoid_list(c, avoid, KVP_CLIENT_AVOID_MAX);
        ps.avoid_segments = avoid;
        req.body_case = KVP__REQUEST__BODY_PUT_START;
        req.put_start = &ps;
        int rc = kvp_client_rpc(c, &req, deadline, KVP__RESPONSE__BODY_PUT_START, &start_resp);
        if (rc == KVP_OK && start_resp->put_start->n_results != m) {
            kvp_log_warn(c->name, "PutStart: %zu results for %zu items", start_resp->put_start->n_results, m);
            rc = KVP_ERR_MALFORMED;
        }
        if (rc != KVP_OK) {
            /* The master may have started some items: revoke all (idempotent, by op id). */
            for (size_t j = 0; j < m; j++) {
                results[it[j].obj] = rc;
                revoke[j] = rc != KVP_ERR_INVALID;
            }
            send_revoke(c, it, m, revoke, objs, deadline);
            goto out;
        }
    }

    /* 2b. items that found no space while the master evicts: wait and retry (put_retry.c) */
    res = calloc(m, sizeof *res);
    rpc_st = calloc(m, sizeof *rpc_st);
    if (res && rpc_st) {
        for (size_t j = 0; j < m; j++)
            res[j] = start_resp->put_start->results[j];
        kvp_client_put_start_retry(c, sp, m, res, rpc_st, deadline, &extra, &n_extra);
        for (size_t j = 0; j < m; j++)
            it[j].op_id = si[j].op_id;
    }

    /* 3. one transfer batch: every replica × every iov piece of every started item */
    t_started = kvp_clock_now_us();
    bool closing = kvp_client_closing(c);
    size_t ns = 0;
    for (size_t j = 0; j < m; j++) {
        const Kvp__PutStartResult *r = res && rpc_st ? res[j] : start_resp->put_start->results[j];
        if (!r) { /* its retry RPC failed: the master may have started it */
            it[j].status = rpc_st[j];
            revoke[j] = true;
            continue;
        }
        it[j].start = r;
        it[j].status = r->status;
        if (r->status == KVP_OK && closing) {
            it[j].status = KVP_ERR_CLOSED;
            revoke[j] = true;
        }
        if (r->status == KVP_OK && r->n_replicas == 0) {
            it[j].status = KVP_ERR_INTERNAL;
            revoke[j] = true;
        }
        if (it[j].status != KVP_OK)
            continue;
        const struct kvp_client_obj *o = &objs[it[j].obj];
        size_t pieces = 0;
        for (size_t k = 0; k < o->iovcnt; k++)
            pieces += o->iov[k].len > 0;
        ns += pieces * r->n_replicas;
    }
    if (ns > 0) {
        slices = calloc(ns, sizeof *slices);
        slice_item = calloc(ns, sizeof *slice_item);
        if (any_dev) {
            slice_feed = calloc(ns, sizeof *slice_feed);
            item_dev = calloc(m, sizeof *item_dev);
        }
        if (!slices || !slice_item || (any_dev && (!slice_feed || !item_dev))) {
            for (size_t j = 0; j < m; j++)
                if (it[j].status == KVP_OK) {
                    it[j].status = KVP_ERR_NOMEM;
                    revoke[j] = true;
                }
            ns = 0;
        }
        size_t s = 0;
        for (size_t j = 0; j < m && ns > 0; j++) {
            if (it[j].status != KVP_OK)
                continue;
            const struct kvp_client_obj *o = &objs[it[j].obj];
            for (size_t r = 0; r < it[j].start->n_replicas; r++) {
                const Kvp__Replica *rep = it[j].start->replicas[r];
                uint64_t off = 0;
                for (size_t k = 0; k < o->iovcnt; k++) {
                    if (o->iov[k].len == 0)
                        continue;
                    slices[s] = (struct kvp_xfer_slice){
                        .local = o->iov[k].base,
                        .length = o->iov[k].len,
                        .segment_id = rep->segment_id,
                        .endpoint = rep->endpoint,
                        .remote_offset = rep->offset + off,
                        .op = KVP_XFER_WRITE,
                        .status = KVP_ERR_TIMEOUT,
                    };
                    if (slice_feed)
                        slice_feed[s] = r == 0;
                    slice_item[s++] = j;
                    off += o->iov[k].len;
                }
            }
        }
        if (ns > 0) {
            uint32_t left = kvp_client_remaining(deadline);
            if (left == 0) {
                for (size_t q = 0; q < ns; q++)
                    slices[q].status = KVP_ERR_TIMEOUT;
            } else {
                struct put_sums ps = {.it = it, .m = m, .objs = objs, .sum = sum, .have = have_sum,
                                      .c = c, .deadline = deadline, .replica_num = replica_num,
                                      .soft_pin = opts && opts->soft_pin};
                /* Level 6: which items' intents go while the bytes move (none with device pieces:
                 * theirs are summed on bounce buffers after the transfer) */
                uint64_t intent_bytes = 0;
                for (size_t j = 0; j < m && !any_dev && want_intent; j++)
                    if (it[j].status == KVP_OK && it[j].start && it[j].start->term && it[j].start->intent_ok &&
                        it[j].start->n_replicas <= KVP_PUT_PLACE_MAX) {
                        want_intent[j] = true;
                        intent_bytes += it[j].size;
                    }
                if (c->cfg.put_intent_min_bytes && intent_bytes >= c->cfg.put_intent_min_bytes)
                    ps.intent = want_intent;
                kvp_dtoken_ensure(c->dtok, c->ms, c->xfer, slices, ns, left); /* tokens of new segments */
                /* per-slice status is authoritative */
                if (!any_dev) {
                    kvp_xfer_run_overlap(c->xfer, slices, ns, left, put_sums_compute, &ps);
                } else {
                    /* [GPU hook] items with device pieces go through bounce buffers; the others
                     * run as in kvp_xfer_run_overlap */
                    for (size_t j = 0; j < m; j++)
                        item_dev[j] = it[j].status == KVP_OK ? it[j].dev : -1;
                    struct kvp_devstage_batch db = {.slices = slices, .n = ns, .group = slice_item,
                                                    .feed = slice_feed, .group_dev = item_dev, .n_groups = m,
                                                    .sum = sum, .timeout_ms = left, .overlap = put_sums_compute,
                                                    .arg = &ps};
                    kvp_devstage_run(c->devstage, &db);
                    for (size_t j = 0; j < m; j++)
                        if (item_dev[j] >= 0)
                            have_sum[j] = true; /* used only when all of the item's slices completed */
                }
            }
            for (size_t q = 0; q < ns; q++) {
                size_t j = slice_item[q];
                /* a segment that refused or dropped the connection: reported at the end, so the
                 * master probes it and stops placing new replicas there once it is found dead
                 * (before, every put with a replica there failed until client_ttl passed) */
                if (slices[q].status == KVP_OK && slices[q].segment_id) {
                    bool known = false;
                    for (size_t b = 0; b < n_wrote && !known; b++)
                        known = wrote[b] == slices[q].segment_id;
                    if (!known && n_wrote < KVP_PUT_MAX_REPORTS)
                        wrote[n_wrote++] = slices[q].segment_id;
                }
                if (slices[q].status == KVP_ERR_TRANSFER) {
                    bool known = false;
                    for (size_t b = 0; b < n_bad && !known; b++)
                        known = bad[b] == slices[q].segment_id;
                    if (!known && n_bad < KVP_PUT_MAX_REPORTS)
                        bad[n_bad++] = slices[q].segment_id;
                }
                if (slices[q].status == KVP_ERR_TIMEOUT && slices[q].segment_id) {
                    /* silent (a dropped link, a partition from this client only): placed last
                     * by this client's next PutStarts and read last, unless a slice of this
                     * same batch completed there (then it is only slow) */
                    bool answered = false;
                    for (size_t q2 = 0; q2 < ns && !answered; q2++)
                        answered = slices[q2].segment_id == slices[q].segment_id && slices[q2].status == KVP_OK;
                    if (!answered)
                        kvp_client_avoid_note(c, slices[q].segment_id);
                }
                if (slices[q].status != KVP_OK && it[j].status == KVP_OK) {
                    it[j].status = slice_error(slices[q].status);
                    revoke[j] = true;
                    kvp_log_debug(c->name, "put %s: slice to segment %u: %s", objs[it[j].obj].key,
                                  slices[q].segment_id, kvp_errname(slices[q].status));
                }
            }
        }
    }

    /* 4. PutEnd for the items whose bytes are all written */
    t_written = kvp_clock_now_us();
    closing = kvp_client_closing(c);
    size_t ne = 0;
    for (size_t j = 0; j < m; j++) {
        if (it[j].status == KVP_OK && closing) {
            it[j].status = KVP_ERR_CLOSED;
            revoke[j] = true;
        }
        if (it[j].status != KVP_OK)
            continue;
        const struct kvp_client_obj *o = &objs[it[j].obj];
        const Kvp__PutStartResult *sr = it[j].start;
        if (sr && sr->term && !place) {
            place = calloc(m * KVP_PUT_PLACE_MAX, sizeof *place);
            placep = calloc(m * KVP_PUT_PLACE_MAX, sizeof *placep);
        }
        end_item_fill(&ei[ne], &it[j], o, have_sum[j] ? sum[j] : kvp_client_checksum(o->iov, o->iovcnt, it[j].size),
                      replica_num, opts && opts->soft_pin, place ? &place[ne * KVP_PUT_PLACE_MAX] : NULL,
                      placep ? &placep[ne * KVP_PUT_PLACE_MAX] : NULL);
        ep[ne] = &ei[ne];
        epos[ne++] = j;
    }
    if (ne > 0) {
        Kvp__Request req;
        Kvp__PutEndReq pe;
        kvp__request__init(&req);
        kvp__put_end_req__init(&pe);
        pe.n_items = ne;
        pe.items = ep;
        pe.n_written_segments = n_wrote;
        pe.written_segments = wrote;
        req.body_case = KVP__REQUEST__BODY_PUT_END;
        req.put_end = &pe;
        int rc = kvp_client_rpc(c, &req, deadline, KVP__RESPONSE__BODY_PUT_END, &end_resp);
        if (rc == KVP_OK && end_resp->put_end->n_status != ne)
            rc = KVP_ERR_MALFORMED;
        for (size_t e = 0; e < ne; e++) {
            size_t j = epos[e];
            int st = rc == KVP_OK ? end_resp->put_end->status[e] : rc;
            if (st == KVP_ERR_NOT_FOUND)
                st = KVP_ERR_TIMEOUT; /* the pending put passed its deadline and was revoked */
            it[j].status = st;
            if (st != KVP_OK && rc != KVP_OK)
                revoke[j] = true; /* outcome unknown: PutRevoke removes the put only if it is still
                                     pending; if PutEnd did commit, the object is complete (its
                                     bytes are all written) and stays */
        }
    }

    /* 5. PutRevoke for the items that started but failed */
    send_revoke(c, it, m, revoke, objs, deadline);
    kvp_client_report_unreachable(c, bad, n_bad, deadline);
    for (size_t j = 0; j < m; j++)
        results[it[j].obj] = it[j].status;
    kvp_log_debug(c->name, "put of %zu item(s): PutStart %llu us, transfer %llu us (%zu slices), PutEnd+revoke %llu us",
                  m, (unsigned long long)(t_started - t_start), (unsigned long long)(t_written - t_started), ns,
                  (unsigned long long)(kvp_clock_now_us() - t_written));

out:
    for (size_t q = 0; q < n_extra; q++)
        kvp_msession_response_free(extra[q]);
    free(extra);
    free(res);
    free(rpc_st);
    kvp_msession_response_free(start_resp);
    kvp_msession_response_free(end_resp);
    free(slices);
    free(slice_item);
    free(slice_feed);
    free(item_dev);
    free(it);
    free(si);
    free(sp);
    free(revoke);
    free(ei);
    free(ep);
    free(place);
    free(placep);
    free(epos);
    free(sum);
    free(have_sum);
    free(want_intent);
}

void kvp_client_put_objs(struct kvp_client *c, size_t n, const struct kvp_client_obj *objs,
                         const kvp_put_opts *opts, int results[])
{
    /* One deadline for the whole call; a large batch goes to the master in chunks of
     * KVP_CLIENT_PUT_CHUNK items (one PutStart is one Raft command, applied in one go on every
     * master). A key repeated in a later chunk gets KVP_ERR_EXISTS, as inside one chunk. */
    uint64_t deadline = kvp_client_deadline(c, opts ? opts->timeout_ms : 0);
    for (size_t off = 0; off < n; off += KVP_CLIENT_PUT_CHUNK) {
        size_t cn = n - off < KVP_CLIENT_PUT_CHUNK ? n - off : KVP_CLIENT_PUT_CHUNK;
        int why = off > 0 ? kvp_client_chunk_gate(c, deadline, "put", n, off) : 0;
        if (why) {
            for (size_t i = off; i < n; i++)
                results[i] = why;
            return;
        }
        put_objs_chunk(c, cn, objs + off, off, opts, deadline, results + off);
    }
}

static int check_opts(const char *fn, const kvp_put_opts *opts)
{
    if (opts && opts->replica_num > KVP_CLIENT_MAX_REPLICAS) {
        char what[96];
        snprintf(what, sizeof what, "opts->replica_num %u is over %u", opts->replica_num,
                 KVP_CLIENT_MAX_REPLICAS);
        return kvp_client_invalid(fn, what);
    }
    return KVP_OK;
}

/* ------------------------------------------------------------------ public entry points */

/* The batch put after its arguments were checked (n > 0): the objects (iovs or bufs), the call
 * counted in the metrics. */
static int batch_put_run(kvp_client *c, size_t n, const char *const keys[], const kvp_iov *const iovs[],
                         const size_t iovcnt[], const void *const bufs[], const size_t lens[],
                         const kvp_put_opts *opts, int results[])
{
    int rc = kvp_client_enter(c);
    if (rc != KVP_OK)
        return rc;
    uint64_t t0 = kvp_client_metrics_t0(c);
    struct kvp_client_obj *objs = kvp_client_objs_new(n, keys, iovs, iovcnt, (void *const *)bufs, lens);
    if (!objs) {
        kvp_client_metrics_put(c, KVP_ERR_NOMEM, n, NULL, NULL, t0);
        kvp_client_leave(c);
        return KVP_ERR_NOMEM;
    }
    kvp_client_put_objs(c, n, objs, opts, results);
    kvp_client_metrics_put(c, KVP_OK, n, objs, results, t0);
    free(objs);
    kvp_client_leave(c);
    return KVP_OK;
}

int kvp_batch_put_iov(kvp_client *c, size_t n, const char *const keys[], const kvp_iov *const iovs[],
                      const size_t iovcnt[], const kvp_put_opts *opts, int results[])
{
    if (!c || (n > 0 && (!keys || !iovs || !iovcnt || !results)))
        return kvp_client_invalid(__func__, "client NULL, or a NULL keys/iovs/iovcnt/results array with n > 0");
    if (check_opts(__func__, opts) != KVP_OK)
        return KVP_ERR_INVALID;
    return n == 0 ? KVP_OK : batch_put_run(c, n, keys, iovs, iovcnt, NULL, NULL, opts, results);
}

int kvp_batch_put(kvp_client *c, size_t n, const char *const keys[], const void *const bufs[],
                  const size_t lens[], const kvp_put_opts *opts, int results[])
{
    if (!c || (n > 0 && (!keys || !bufs || !lens || !results)))
        return kvp_client_invalid(__func__, "client NULL, or a NULL keys/bufs/lens/results array with n > 0");
    if (check_opts(__func__, opts) != KVP_OK)
        return KVP_ERR_INVALID;
    return n == 0 ? KVP_OK : batch_put_run(c, n, keys, NULL, NULL, bufs, lens, opts, results);
}

int kvp_put(kvp_client *c, const char *key, const void *buf, size_t len, const kvp_put_opts *opts)
{
    int r = KVP_ERR_INTERNAL;
    const char *keys[1] = {key};
    const void *bufs[1] = {buf};
    size_t lens[1] = {len};
    int rc = kvp_batch_put(c, 1, keys, bufs, lens, opts, &r);
    return rc != KVP_OK ? rc : r;
}
