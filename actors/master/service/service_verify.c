/*
 * service_verify.c — the leader's range verifier and the Verify RPC (see service_verify.h).
 *
 * The asks live in one array (at most SVC_VERIFY_MAX); a heartbeat scans it for its segment
 * (a few thousand entries at most, once per heartbeat). Finished asks are moved to a done list
 * and called back after the scan, so that a callback may ask again.
 */
#include "actors/master/service/service_verify.h"

#include <stdlib.h>
#include <string.h>

#include "actors/master/service/service_state.h"
#include "kvpool.h"
#include "runtime/log.h"

#define SVC_VERIFY_BEAT_BYTES (256ull << 20) /* a segment hashes this much per heartbeat (seg_verify.h) */
#define SVC_VERIFY_KEYS_MAX 64u              /* keys per Verify call */

struct svc_vask {
    uint64_t id;
    uint32_t seg;
    uint64_t offset, len, expect;
    bool sent;
    uint32_t beats_left;   /* sent: heartbeats of seg without its answer before UNKNOWN */
    uint64_t asked_ms;     /* monotonic ms of svc_verify_range */
    svc_verify_fn fn;
    void *arg;
    uint32_t idx;
    int result;            /* when done */
    uint64_t checksum;
};

struct svc_verify {
    struct svc_vask *asks;
    size_t n, cap;
    struct svc_vask *done; /* finished, waiting for their callback */
    size_t n_done, cap_done;
    uint64_t term;         /* the term of the ids made */
    uint32_t seq;          /* low 32 bits of the next id */
    bool busy_logged;      /* a BUSY refusal was logged and no ask ended since */
    bool quiet;            /* destroy: callbacks must not reply */
    Kvp__RangeVerify rv[SVC_VERIFY_PER_BEAT];
    Kvp__RangeVerify *rvp[SVC_VERIFY_PER_BEAT];
    uint64_t matched, mismatched, unknown; /* results so far (logged at destroy) */
};

static struct svc_verify *verifier(struct kvp_master_service *s)
{
    if (!s->verify)
        s->verify = calloc(1, sizeof *s->verify);
    return s->verify;
}

/* Move ask i to the done list with its result (the array keeps its order otherwise irrelevant:
 * the last entry takes its slot). */
static void finish(struct svc_verify *v, size_t i, int result, uint64_t checksum)
{
    struct svc_vask a = v->asks[i];
    v->asks[i] = v->asks[--v->n];
    a.result = result;
    a.checksum = checksum;
    if (v->n_done == v->cap_done) {
        size_t cap = v->cap_done ? v->cap_done * 2 : 64;
        struct svc_vask *d = realloc(v->done, cap * sizeof *d);
        if (!d) {
            /* cannot happen often: the done list is at most the asks' size. The ask's owner
             * still gets its answer: called back now, before the scan ends (documented as after) */
            a.fn(NULL, a.arg, a.idx, result, checksum);
            return;
        }
        v->done = d;
        v->cap_done = cap;
    }
    v->done[v->n_done++] = a;
    v->busy_logged = false;
    if (result == SVC_VERIFY_MATCH)
        v->matched++;
    else if (result == SVC_VERIFY_MISMATCH)
        v->mismatched++;
    else
        v->unknown++;
}

/* Call back every finished ask. The list is taken first: a callback may ask again. */
static void flush(struct kvp_master_service *s)
{
    struct svc_verify *v = s->verify;
    while (v && v->n_done) {
        struct svc_vask *d = v->done;
        size_t n = v->n_done;
        v->done = NULL;
        v->n_done = v->cap_done = 0;
        for (size_t i = 0; i < n; i++)
            d[i].fn(v->quiet ? NULL : s, d[i].arg, d[i].idx, d[i].result, d[i].checksum);
        free(d);
        v = s->verify;
    }
}

int svc_verify_range(struct kvp_master_service *s, uint32_t segment_id, uint64_t offset, uint64_t len,
                     uint64_t expect, svc_verify_fn fn, void *arg, uint32_t idx)
{
    if (!s->is_leader)
        return KVP_ERR_NOT_LEADER;
    if (!segment_id || !len || !fn)
        return KVP_ERR_INVALID;
    struct svc_verify *v = verifier(s);
    if (!v)
        return KVP_ERR_NOMEM;
    if (v->n >= SVC_VERIFY_MAX) {
        if (!v->busy_logged)
            kvp_log_warn(s->actor, "range verify: %u asks held already: refusing more until some end",
                         SVC_VERIFY_MAX);
        v->busy_logged = true;
        return KVP_ERR_BUSY;
    }
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        struct svc_vask *a = realloc(v->asks, cap * sizeof *a);
        if (!a)
            return KVP_ERR_NOMEM;
        v->asks = a;
        v->cap = cap;
    }
    if (v->term != s->term) {
        v->term = s->term;
        v->seq = 0;
    }
    struct svc_vask *a = &v->asks[v->n++];
    memset(a, 0, sizeof *a);
    a->id = (s->term << 32) | ++v->seq; /* seq 0 never used: an id is never 0 */
    a->seg = segment_id;
    a->offset = offset;
    a->len = len;
    a->expect = expect;
    a->asked_ms = svc_now_ms();
    a->fn = fn;
    a->arg = arg;
    a->idx = idx;
    return KVP_OK;
}

void svc_verify_on_heartbeat(struct kvp_master_service *s, uint32_t seg, const Kvp__HeartbeatReq *hb)
{
    struct svc_verify *v = s->verify;
    if (!v || !s->is_leader)
        return;
    for (size_t k = 0; k < hb->n_verified; k++) {
        const Kvp__RangeSum *r = hb->verified[k];
        if (!r)
            continue;
        for (size_t i = 0; i < v->n; i++) {
            struct svc_vask *a = &v->asks[i];
            if (a->id != r->id || a->seg != seg || !a->sent)
                continue;
            if (r->status != KVP_OK) {
                kvp_log_warn(s->actor, "segment %u: range verify [%llu, +%llu): %s: unknown", seg,
                             (unsigned long long)a->offset, (unsigned long long)a->len, kvp_errname(r->status));
                finish(v, i, SVC_VERIFY_UNKNOWN, 0);
            } else {
                finish(v, i, r->checksum == a->expect ? SVC_VERIFY_MATCH : SVC_VERIFY_MISMATCH, r->checksum);
            }
            break;
        }
    }
    /* one more heartbeat for the asks this one did not answer */
    for (size_t i = 0; i < v->n;) {
        struct svc_vask *a = &v->asks[i];
        if (a->seg == seg && a->sent && a->beats_left-- <= 1) {
            kvp_log_info(s->actor, "segment %u: range verify [%llu, +%llu) not answered within its heartbeats "
                         "(an older segment?): unknown", seg, (unsigned long long)a->offset,
                         (unsigned long long)a->len);
            finish(v, i, SVC_VERIFY_UNKNOWN, 0);
            continue;
        }
        i++;
    }
    flush(s);
}

void svc_verify_fill(struct kvp_master_service *s, uint32_t seg, Kvp__HeartbeatResp *hb)
{
    struct svc_verify *v = s->verify;
    if (!v || !v->n || !s->is_leader)
        return;
    uint64_t queued = 0; /* bytes this segment has been asked for and not answered */
    size_t out = 0, k = 0;
    for (size_t i = 0; i < v->n; i++)
        if (v->asks[i].seg == seg && v->asks[i].sent) {
            queued += v->asks[i].len;
            out++;
        }
    for (size_t i = 0; i < v->n && k < SVC_VERIFY_PER_BEAT && out < SVC_VERIFY_OUT_PER_SEG; i++) {
        struct svc_vask *a = &v->asks[i];
        if (a->seg != seg || a->sent)
            continue;
        queued += a->len;
        a->sent = true;
        /* the segment hashes SVC_VERIFY_BEAT_BYTES per heartbeat, in order of arrival */
        a->beats_left = SVC_VERIFY_BEATS + (uint32_t)((queued + SVC_VERIFY_BEAT_BYTES - 1) / SVC_VERIFY_BEAT_BYTES);
        kvp__range_verify__init(&v->rv[k]);
        v->rv[k].id = a->id;
        v->rv[k].offset = a->offset;
        v->rv[k].len = a->len;
        v->rvp[k] = &v->rv[k];
        k++;
        out++;
    }
    hb->n_verify = k;
    hb->verify = k ? v->rvp : NULL;
}

void svc_verify_tick(struct kvp_master_service *s)
{
    struct svc_verify *v = s->verify;
    if (!v || !v->n)
        return;
    uint64_t now = svc_now_ms(), st = 0;
    for (size_t i = 0; i < v->n;) {
        struct svc_vask *a = &v->asks[i];
        bool gone = s->segments_fresh_ms &&
                    (!svc_map_get(&s->segments, a->seg, &st) || st - 1 == KVP__SEGMENT_STATE__SEGMENT_LOST);
        if (gone || now - a->asked_ms > SVC_VERIFY_TIMEOUT_MS) {
            kvp_log_info(s->actor, "segment %u: range verify [%llu, +%llu): %s: unknown", a->seg,
                         (unsigned long long)a->offset, (unsigned long long)a->len,
                         gone ? "segment lost or unknown" : "no answer in time");
            finish(v, i, SVC_VERIFY_UNKNOWN, 0);
            continue;
        }
        i++;
    }
    flush(s);
}

static void cancel_all(struct kvp_master_service *s)
{
    struct svc_verify *v = s->verify;
    if (!v)
        return;
    while (v->n)
        finish(v, v->n - 1, SVC_VERIFY_UNKNOWN, 0);
    flush(s);
}

void svc_verify_reset(struct kvp_master_service *s)
{
    if (s->verify && s->verify->n)
        kvp_log_info(s->actor, "range verify: leadership changed: %zu asks end unknown", s->verify->n);
    cancel_all(s);
}

void svc_verify_destroy(struct kvp_master_service *s)
{
    struct svc_verify *v = s->verify;
    if (!v)
        return;
    v->quiet = true;
    cancel_all(s);
    if (v->matched || v->mismatched || v->unknown)
        kvp_log_info(s->actor, "range verify: %llu match, %llu mismatch, %llu unknown", (unsigned long long)v->matched,
                     (unsigned long long)v->mismatched, (unsigned long long)v->unknown);
    free(v->asks);
    free(v->done);
    free(v);
    s->verify = NULL;
}

size_t svc_verify_held(const struct kvp_master_service *s)
{
    return s->verify ? s->verify->n : 0;
}

/* ------------------------------------------------------------------ the Verify RPC */

/* One Verify call: the caller, the objects found and every replica's result. */
struct svc_vjob {
    zframe_t *identity;
    uint64_t req_id;
    uint64_t deadline_ms;
    size_t n_keys;
    Kvp__ObjectVerify *objs;       /* n_keys */
    Kvp__ObjectVerify **objp;
    Kvp__ReplicaVerify *reps;      /* every replica of every object, flat */
    Kvp__ReplicaVerify **repp;
    size_t n_reps;
    size_t open;                   /* asks not called back yet */
};

static void job_free(struct svc_vjob *j)
{
    if (!j)
        return;
    zframe_destroy(&j->identity);
    free(j->objs);
    free(j->objp);
    free(j->reps);
    free(j->repp);
    free(j);
}

void svc_verify_job_drop(void *job)
{
    job_free(job);
}

static void job_answer(struct kvp_master_service *s, struct svc_vjob *j)
{
    if (s && !(j->deadline_ms && svc_now_ms() > j->deadline_ms)) {
        Kvp__Response resp = KVP__RESPONSE__INIT;
        Kvp__VerifyResp vr = KVP__VERIFY_RESP__INIT;
        vr.objects = j->objp;
        vr.n_objects = j->n_keys;
        resp.body_case = KVP__RESPONSE__BODY_VERIFY;
        resp.verify = &vr;
        svc_reply(s, j->identity, j->req_id, &resp);
    }
    job_free(j);
}

static void on_replica_verified(struct kvp_master_service *s, void *arg, uint32_t idx, int result,
                                uint64_t checksum)
{
    struct svc_vjob *j = arg;
    j->reps[idx].result = (Kvp__VerifyResult)result;
    j->reps[idx].checksum = checksum;
    if (result == SVC_VERIFY_MISMATCH && s)
        kvp_log_warn(s->actor, "verify: segment %u offset %llu: checksum %016llx, not the object's",
                     j->reps[idx].segment_id, (unsigned long long)j->reps[idx].offset,
                     (unsigned long long)checksum);
    if (--j->open == 0)
        job_answer(s, j);
}

void svc_on_verify_req(struct kvp_master_service *s, zframe_t *identity, Kvp__Request *req)
{
    const Kvp__VerifyReq *vq = req->verify;
    if (!vq || vq->n_keys == 0 || vq->n_keys > SVC_VERIFY_KEYS_MAX) {
        kvp_log_warn(s->actor, "verify: %zu keys (1..%u allowed): refused", vq ? vq->n_keys : 0, SVC_VERIFY_KEYS_MAX);
        svc_reply_status(s, identity, req->req_id, KVP_ERR_INVALID, "verify: 1 to 64 keys");
        return;
    }
    struct svc_vjob *j = calloc(1, sizeof *j);
    struct svc_pending *p = svc_pending_new(s, NULL, NULL);
    if (!j || !p || !(j->identity = zframe_dup(identity))) {
        job_free(j);
        svc_pending_free(p);
        svc_reply_status(s, identity, req->req_id, KVP_ERR_NOMEM, "out of memory");
        return;
    }
    j->req_id = req->req_id;
    j->deadline_ms = req->timeout_ms ? svc_now_ms() + req->timeout_ms : 0;
    j->n_keys = vq->n_keys;
    p->internal = SVC_INT_VERIFY_LOOKUP;
    p->verify_job = j;
    /* The committed objects, as a read (the raft thread's query: quorum contact vouched). */
    Kvp__Request q = KVP__REQUEST__INIT;
    Kvp__GetReplicaListReq g = KVP__GET_REPLICA_LIST_REQ__INIT;
    g.keys = vq->keys;
    g.n_keys = vq->n_keys;
    q.body_case = KVP__REQUEST__BODY_GET_REPLICAS;
    q.get_replicas = &g;
    svc_query(s, p, &q); /* on error the result path runs with the error */
}

void svc_verify_on_lookup(struct kvp_master_service *s, struct svc_pending *p, int status, Kvp__Response *resp)
{
    struct svc_vjob *j = p->verify_job;
    p->verify_job = NULL;
    if (!j)
        return;
    int st = status != KVP_OK ? status : (resp ? resp->status : KVP_ERR_INTERNAL);
    const Kvp__GetReplicaListResp *g = st == KVP_OK && resp ? resp->get_replicas : NULL;
    if (st == KVP_OK && (!g || g->n_objects != j->n_keys))
        st = KVP_ERR_INTERNAL;
    if (st != KVP_OK) {
        svc_reply_status(s, j->identity, j->req_id, st, "verify: object lookup failed");
        job_free(j);
        return;
    }
    size_t n_reps = 0;
    for (size_t i = 0; i < g->n_objects; i++)
        if (g->objects[i] && g->objects[i]->status == KVP_OK)
            n_reps += g->objects[i]->n_replicas;
    j->objs = calloc(j->n_keys, sizeof *j->objs);
    j->objp = calloc(j->n_keys, sizeof *j->objp);
    j->reps = calloc(n_reps ? n_reps : 1, sizeof *j->reps);
    j->repp = calloc(n_reps ? n_reps : 1, sizeof *j->repp);
    if (!j->objs || !j->objp || !j->reps || !j->repp) {
        svc_reply_status(s, j->identity, j->req_id, KVP_ERR_NOMEM, "out of memory");
        job_free(j);
        return;
    }
    j->n_reps = n_reps;
    size_t r = 0;
    for (size_t i = 0; i < j->n_keys; i++) {
        const Kvp__ObjectInfo *oi = g->objects[i];
        Kvp__ObjectVerify *o = &j->objs[i];
        kvp__object_verify__init(o);
        j->objp[i] = o;
        o->status = oi ? oi->status : KVP_ERR_INTERNAL;
        if (!oi || oi->status != KVP_OK)
            continue;
        o->size = oi->size;
        o->checksum = oi->checksum;
        o->replicas = &j->repp[r];
        o->n_replicas = oi->n_replicas;
        for (size_t k = 0; k < oi->n_replicas; k++, r++) {
            kvp__replica_verify__init(&j->reps[r]);
            j->repp[r] = &j->reps[r];
            j->reps[r].segment_id = oi->replicas[k]->segment_id;
            j->reps[r].offset = oi->replicas[k]->offset;
            j->reps[r].result = KVP__VERIFY_RESULT__VERIFY_UNKNOWN;
        }
    }
    /* Ask for every replica; the answer goes out when the last one is called back. One more
     * than the asks keeps the job alive while they are made (a refused ask stays UNKNOWN). */
    j->open = 1;
    r = 0;
    for (size_t i = 0; i < j->n_keys; i++) {
        const Kvp__ObjectVerify *o = &j->objs[i];
        for (size_t k = 0; k < o->n_replicas; k++, r++)
            if (svc_verify_range(s, j->reps[r].segment_id, j->reps[r].offset, o->size, o->checksum,
                                 on_replica_verified, j, (uint32_t)r) == KVP_OK)
                j->open++;
    }
    if (--j->open == 0)
        job_answer(s, j);
}
