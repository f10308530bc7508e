/*
 * service_resolve.c — a leader's resolution of pending intents (feature level 6, issue 21;
 * docs/master.md "Resolving pending intents"). Leader-only soft state on the service thread.
 *
 * An intent is a put whose metadata committed while its bytes moved (PutCommitItem.intent). Its
 * leader answers the client's PutEnd at once and seals the put later (PutSealCmd): a leader that
 * dies in between leaves intents that it may have acknowledged. A leader finds them in the state
 * machine (kvp_fsm_intent_each) once its state is current, and every second while any remain:
 *  - every replica on a live segment is checksummed by its segment (service_verify.h);
 *  - all of them MATCH (at least one live) → PutSealCmd {key, op_id, checksum}: the object is
 *    complete with the bytes its client wrote;
 *  - a MISMATCH from asks made after the put's deadline plus fence_grace_ms (when the asks were
 *    made counts, not when the last answer came), or no live replica once that has passed →
 *    PutRevoke {key, op_id}: its space goes to quarantine. Before that, verified again then; an
 *    intent this leader acknowledged itself (its sealing table) is never revoked here;
 *  - UNKNOWN (a segment that did not answer, an older segment) → verified again a second later;
 *    once asked after the deadline plus fence_grace_ms, one MATCH and no MISMATCH seals it.
 * An intent of this leader's own term waits for its deadline plus fence_grace_ms first: its
 * client's PutEnd seals it on the normal path; the resolver only takes what was left.
 *
 * Why this is safe (DESIGN.md C1, C3, C5):
 *  - C1 (nothing acknowledged is lost): a client sends PutEnd only once every replica's bytes are
 *    written, so an acknowledged put MATCHes on every live replica and is sealed, never revoked;
 *    a revoke needs a MISMATCH (or no live replica) after the deadline, which no acknowledged put
 *    shows unless its bytes were lost with their segment.
 *  - C3 (no writer lands in space handed to another object): a revoked intent's space is freed
 *    only after the put's deadline (the FSM quarantines it at max(now, deadline) +
 *    fence_grace_ms); segments refuse WRITE frames past the deadline (seg_server.c), and RDMA
 *    writers are fenced first (svc_fence_note_failure), as for expired puts.
 *  - C5 (no reader gets another object's bytes): a seal makes visible exactly the bytes that hash
 *    to the committed checksum on every replica that answered (at least one), checked after the
 *    writer's last possible write when some replica did not match or answer before; a matching
 *    range is the client's own bytes (XXH3-64), and every get checks each replica it reads again.
 * Until resolved an intent is invisible; a read of an older term's intent on the leader is held
 * (svc_put_hold_intent, up to 3 s) and the key verified at once (svc_resolve_urge): the read is
 * answered when the seal or revoke applies (svc_resolve_on_result → svc_put_redispatch_held).
 */
#include "actors/master/service/service_resolve.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "actors/master/fsm/fsm.h"
#include "actors/master/service/service_state.h"
#include "actors/master/service/service_verify.h"
#include "kvpool.h"
#include "raftlog/raftlog.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define RESOLVE_MAX 1024u         /* intents held at once; the rest wait for the next pass */
#define RESOLVE_RETRY_MS 1000u    /* an UNKNOWN is verified again this much later */

enum rstate { R_IDLE, R_VERIFYING, R_SUBMITTED };

struct rentry {
    uint64_t id;                  /* this leadership's ticket (svc_pending.resolve_id) */
    char *key;
    uint64_t op_id, size, checksum, term, deadline_ms; /* deadline: wall-clock ms */
    uint32_t n;
    struct {
        uint32_t segment_id;
        uint64_t offset;
        int result;               /* enum svc_verify_result of the last verification */
        bool live;                /* the segment was live when asked */
    } rep[KVP_FSM_INTENT_MAX_REPLICAS];
    enum rstate st;
    uint32_t open;                /* verify asks not called back */
    uint64_t next_ms;             /* monotonic ms of the next verification (R_IDLE) */
    uint64_t asked_wall;          /* wall-clock ms when the last verification's asks were made */
    bool seen;                    /* listed by the last pass */
    bool dead;                    /* dropped from the table: freed at its last callback */
};

struct svc_resolve {
    struct rentry *e[RESOLVE_MAX];
    size_t n;
    uint64_t next_id;
    bool full_logged;
    uint64_t urged_ms;            /* svc_resolve_urge's last pass (monotonic ms) */
    bool test_intent_only;        /* KVP_TEST_PUT_INTENT_ONLY (see svc_resolve_test_hook) */
    uint64_t sealed, revoked;     /* since this master started (status) */
};

static void entry_free(struct rentry *e)
{
    if (e) {
        free(e->key);
        free(e);
    }
}

/* Drop entry i from the table; freed now or at its last verify callback. */
static void drop(struct svc_resolve *r, size_t i)
{
    struct rentry *e = r->e[i];
    r->e[i] = r->e[--r->n];
    if (e->open)
        e->dead = true;
    else
        entry_free(e);
}

static struct rentry *find_id(struct svc_resolve *r, uint64_t id, size_t *at)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->e[i]->id == id) {
            if (at)
                *at = i;
            return r->e[i];
        }
    return NULL;
}

/* The monotonic ms at which wall-clock ms `wall` falls (now when it has passed). */
static uint64_t wall_to_mono(uint64_t wall)
{
    uint64_t now = svc_now_ms(), w = kvp_clock_wall_ms();
    return wall > w ? now + (wall - w) : now;
}

static bool seg_live(struct kvp_master_service *s, uint32_t seg)
{
    uint64_t st = 0;
    return svc_map_get(&s->segments, seg, &st) && st - 1 != KVP__SEGMENT_STATE__SEGMENT_LOST;
}

/* ------------------------------------------------------------------ commands */

static void submit(struct kvp_master_service *s, struct rentry *e, bool seal)
{
    if (!seal && svc_put_sealing_op(s, e->key, e->op_id)) {
        /* this leader acknowledged it: its own PutSealCmd is on its way; never revoked here */
        kvp_log_warn(s->actor, "intent %s (op %llu): not revoked: this leader acknowledged it and is sealing it",
                     e->key, (unsigned long long)e->op_id);
        e->st = R_IDLE;
        e->next_ms = svc_now_ms() + RESOLVE_RETRY_MS;
        return;
    }
    struct svc_pending *p = svc_pending_new(s, NULL, NULL);
    if (!p) {
        e->st = R_IDLE;
        e->next_ms = svc_now_ms() + RESOLVE_RETRY_MS;
        return;
    }
    if (!seal && svc_put_revoking_note(s, p, e->key, e->op_id) != KVP_OK) {
        svc_pending_free(p);
        e->st = R_IDLE;
        e->next_ms = svc_now_ms() + RESOLVE_RETRY_MS;
        return;
    }
    p->internal = seal ? SVC_INT_RESOLVE_SEAL : SVC_INT_RESOLVE_REVOKE;
    p->resolve_id = e->id;
    e->st = R_SUBMITTED;
    Kvp__Command cmd = KVP__COMMAND__INIT;
    Kvp__PutSealCmd sc = KVP__PUT_SEAL_CMD__INIT;
    Kvp__PutSealItem si = KVP__PUT_SEAL_ITEM__INIT, *sip[1] = {&si};
    Kvp__PutRevokeReq rv = KVP__PUT_REVOKE_REQ__INIT;
    Kvp__PutRevokeItem ri = KVP__PUT_REVOKE_ITEM__INIT, *rip[1] = {&ri};
    if (seal) {
        si.key = e->key;
        si.op_id = e->op_id;
        si.checksum = e->checksum;
        sc.items = sip;
        sc.n_items = 1;
        svc_command_set(&cmd, KVP__COMMAND__BODY_PUT_SEAL, &sc);
    } else {
        ri.key = e->key;
        ri.op_id = e->op_id;
        rv.items = rip;
        rv.n_items = 1;
        svc_command_set(&cmd, KVP__COMMAND__BODY_PUT_REVOKE, &rv);
    }
    svc_submit(s, p, &cmd); /* on error the result step runs with the error */
}

void svc_resolve_on_result(struct kvp_master_service *s, struct svc_pending *p, int status, Kvp__Response *resp)
{
    struct svc_resolve *r = s->resolve;
    size_t at = 0;
    struct rentry *e = r ? find_id(r, p->resolve_id, &at) : NULL;
    if (!e)
        return; /* from before a leadership change */
    bool seal = p->internal == SVC_INT_RESOLVE_SEAL;
    int st = status != KVP_OK ? status : resp ? resp->status : KVP_ERR_INTERNAL;
    if (st == KVP_OK) {
        if (seal)
            st = resp->put_end && resp->put_end->n_status == 1 ? resp->put_end->status[0] : KVP_ERR_INTERNAL;
        else
            st = resp->put_revoke && resp->put_revoke->n_status == 1 ? resp->put_revoke->status[0] : KVP_ERR_INTERNAL;
    }
    if (st == KVP_OK && seal) {
        r->sealed++;
        kvp_log_info(s->actor, "intent %s (op %llu, term %llu): sealed: its bytes verified on %u replica(s)", e->key,
                     (unsigned long long)e->op_id, (unsigned long long)e->term, e->n);
    } else if (st == KVP_OK) {
        r->revoked++;
        kvp_log_warn(s->actor, "intent %s (op %llu, term %llu): revoked: its bytes did not verify by the deadline "
                     "(a put never finished by its writer)", e->key, (unsigned long long)e->op_id,
                     (unsigned long long)e->term);
        svc_fence_note_failure(s, 0, "revoked intents"); /* RDMA writers fenced before reuse */
        s->fsm_quarantined_bytes++; /* let QuarantineRelease look */
    } else if (st == KVP_ERR_NOT_FOUND || st == KVP_ERR_EXISTS) {
        /* sealed or revoked meanwhile (its client's PutEnd, another pass): nothing left to do */
        kvp_log_info(s->actor, "intent %s (op %llu): %s: %s", e->key, (unsigned long long)e->op_id,
                     seal ? "seal" : "revoke", kvp_errname(st));
    } else {
        if (st != KVP_ERR_NOT_LEADER)
            kvp_log_warn(s->actor, "intent %s (op %llu): %s not committed: %s (again in %u ms)", e->key,
                         (unsigned long long)e->op_id, seal ? "seal" : "revoke", kvp_errname(st), RESOLVE_RETRY_MS);
        e->st = R_IDLE;
        e->next_ms = svc_now_ms() + RESOLVE_RETRY_MS;
        return;
    }
    drop(r, at);
    svc_put_redispatch_held(s); /* reads held for it (svc_put_hold_intent) are answered now */
}

/* ------------------------------------------------------------------ verification */

enum svc_resolve_verdict svc_resolve_rule(uint32_t live, uint32_t match, uint32_t mismatch, uint64_t asked_wall,
                                          uint64_t now_wall, uint64_t until)
{
    if (live > 0 && match == live)
        return SVC_RESOLVE_SEAL;
    if (live == 0) /* nothing was asked: the time that counts is now */
        return now_wall > until ? SVC_RESOLVE_REVOKE : SVC_RESOLVE_AFTER_UNTIL;
    if (mismatch > 0) /* final only when hashed after the writer's last possible write */
        return asked_wall > until ? SVC_RESOLVE_REVOKE : SVC_RESOLVE_AFTER_UNTIL;
    /* Some replica did not answer (an older segment, a silent one not yet lost). After the
     * writer's last possible write, one MATCH and no MISMATCH is enough: the client's bytes are
     * there, and a reader checks every replica's checksum (a bad one is skipped). Without this an
     * acknowledged put would stay invisible as long as one replica cannot answer. */
    if (match >= 1 && asked_wall > until)
        return SVC_RESOLVE_SEAL;
    return SVC_RESOLVE_RETRY;
}

static void decide(struct kvp_master_service *s, struct rentry *e)
{
    uint32_t live = 0, match = 0, mismatch = 0;
    for (uint32_t i = 0; i < e->n; i++) {
        if (!e->rep[i].live)
            continue;
        live++;
        match += e->rep[i].result == SVC_VERIFY_MATCH;
        mismatch += e->rep[i].result == SVC_VERIFY_MISMATCH;
    }
    uint64_t until = e->deadline_ms + s->cfg.fence_grace_ms; /* no WRITE of it lands after (wall ms) */
    e->st = R_IDLE;
    switch (svc_resolve_rule(live, match, mismatch, e->asked_wall, kvp_clock_wall_ms(), until)) {
    case SVC_RESOLVE_SEAL:
        submit(s, e, true);
        break;
    case SVC_RESOLVE_REVOKE:
        submit(s, e, false);
        break;
    case SVC_RESOLVE_AFTER_UNTIL:
        e->next_ms = wall_to_mono(until) + 1; /* its writer may still be writing: look again then */
        kvp_log_debug(s->actor, "intent %s: %s before its deadline: verified again after it", e->key,
                      live ? "a replica mismatches" : "no live replica");
        break;
    case SVC_RESOLVE_RETRY:
        e->next_ms = svc_now_ms() + RESOLVE_RETRY_MS;
        break;
    }
}

static void on_verified(struct kvp_master_service *s, void *arg, uint32_t idx, int result, uint64_t checksum)
{
    struct rentry *e = arg;
    if (idx < e->n)
        e->rep[idx].result = result;
    if (--e->open > 0)
        return;
    if (e->dead) {
        entry_free(e);
        return;
    }
    if (!s || !s->is_leader) {
        e->st = R_IDLE;
        return;
    }
    decide(s, e);
}

static void verify(struct kvp_master_service *s, struct rentry *e)
{
    e->st = R_VERIFYING;
    e->asked_wall = kvp_clock_wall_ms(); /* every answer is hashed after this (svc_resolve_rule) */
    e->open = 1; /* held while the asks are made */
    for (uint32_t i = 0; i < e->n; i++) {
        e->rep[i].result = SVC_VERIFY_UNKNOWN;
        e->rep[i].live = seg_live(s, e->rep[i].segment_id);
        if (e->rep[i].live && svc_verify_range(s, e->rep[i].segment_id, e->rep[i].offset, e->size, e->checksum,
                                               on_verified, e, i) == KVP_OK)
            e->open++;
    }
    on_verified(s, e, UINT32_MAX, SVC_VERIFY_UNKNOWN, 0);
}

/* ------------------------------------------------------------------ the passes */

struct scan {
    struct kvp_master_service *s;
    struct svc_resolve *r;
    size_t added;
};

static bool on_intent(const struct kvp_fsm_intent *it, void *arg)
{
    struct scan *sc = arg;
    struct svc_resolve *r = sc->r;
    if (r->test_intent_only && it->term == sc->s->term)
        return true; /* the test hook: a leader that never seals its own term's intents */
    for (size_t i = 0; i < r->n; i++)
        if (r->e[i]->op_id == it->op_id && strcmp(r->e[i]->key, it->key) == 0) {
            r->e[i]->seen = true;
            return true;
        }
    if (r->n == RESOLVE_MAX) {
        if (!r->full_logged)
            kvp_log_warn(sc->s->actor, "intents: %u held for resolution already: the rest wait for a later pass",
                         RESOLVE_MAX);
        r->full_logged = true;
        return true;
    }
    struct rentry *e = calloc(1, sizeof *e);
    if (!e || !(e->key = strdup(it->key))) {
        free(e);
        return false;
    }
    e->id = ++r->next_id;
    e->op_id = it->op_id;
    e->size = it->size;
    e->checksum = it->checksum;
    e->term = it->term;
    e->deadline_ms = it->deadline_ms;
    e->n = it->nreplicas < KVP_FSM_INTENT_MAX_REPLICAS ? it->nreplicas : KVP_FSM_INTENT_MAX_REPLICAS;
    for (uint32_t i = 0; i < e->n; i++) {
        e->rep[i].segment_id = it->replicas[i].segment_id;
        e->rep[i].offset = it->replicas[i].offset;
    }
    e->seen = true;
    /* this leader's own put: its client's PutEnd seals it; only what is left at the deadline */
    e->next_ms = it->term == sc->s->term ? wall_to_mono(it->deadline_ms + sc->s->cfg.fence_grace_ms) + 1 : 0;
    r->e[r->n++] = e;
    sc->added++;
    return true;
}

static struct svc_resolve *resolver(struct kvp_master_service *s)
{
    if (!s->resolve && (s->resolve = calloc(1, sizeof *s->resolve))) {
        const char *t = getenv("KVP_TEST_PUT_INTENT_ONLY");
        s->resolve->test_intent_only = t && strcmp(t, "1") == 0;
        if (s->resolve->test_intent_only)
            kvp_log_warn(s->actor, "KVP_TEST_PUT_INTENT_ONLY=1 (tests only): every put commits as an intent "
                         "that this leader never seals nor resolves");
    }
    return s->resolve;
}

void svc_resolve_tick(struct kvp_master_service *s)
{
    if (!s->is_leader || !s->segments_fresh_ms)
        return;
    struct svc_resolve *r = resolver(s);
    if (!r || kvp_raftlog_read_begin(s->rl) != KVP_OK)
        return; /* not vouched for now: the next pass */
    if (r->n == 0 && kvp_fsm_intent_count(s->fsm) == 0) {
        kvp_raftlog_read_end(s->rl);
        return;
    }
    for (size_t i = 0; i < r->n; i++)
        r->e[i]->seen = false;
    struct scan sc = {.s = s, .r = r};
    kvp_fsm_intent_each(s->fsm, on_intent, &sc);
    kvp_raftlog_read_end(s->rl);
    if (sc.added)
        kvp_log_info(s->actor, "intents: %zu pending found (term %llu): verifying their bytes on the segments",
                     sc.added, (unsigned long long)s->term);
    uint64_t now = svc_now_ms();
    for (size_t i = 0; i < r->n;) {
        struct rentry *e = r->e[i];
        if (!e->seen && e->st != R_SUBMITTED) { /* sealed or revoked by someone else */
            drop(r, i);
            continue;
        }
        i++;
    }
    r->full_logged = r->n == RESOLVE_MAX && r->full_logged;
    /* verify after the scan: a verification's callback may drop entries */
    struct rentry *due[RESOLVE_MAX];
    size_t n_due = 0;
    for (size_t i = 0; i < r->n; i++)
        if (r->e[i]->st == R_IDLE && r->e[i]->next_ms <= now)
            due[n_due++] = r->e[i];
    for (size_t i = 0; i < n_due; i++)
        verify(s, due[i]);
}

void svc_resolve_urge(struct kvp_master_service *s, const char *key)
{
    if (!s->is_leader || !s->segments_fresh_ms)
        return; /* the first pass runs when this leader's state is current (on_leader_ready) */
    struct svc_resolve *r = resolver(s);
    if (!r)
        return;
    uint64_t now = svc_now_ms();
    for (size_t i = 0; i < r->n; i++) {
        struct rentry *e = r->e[i];
        if (strcmp(e->key, key) != 0)
            continue;
        if (e->st == R_IDLE && (e->asked_wall == 0 || kvp_clock_wall_ms() >= e->asked_wall + 500))
            verify(s, e);
        return;
    }
    if (now - r->urged_ms >= 100) { /* not listed yet: a pass now */
        r->urged_ms = now;
        svc_resolve_tick(s);
    }
}

void svc_resolve_reset(struct kvp_master_service *s)
{
    struct svc_resolve *r = s->resolve;
    if (!r)
        return;
    if (r->n)
        kvp_log_info(s->actor, "intents: leadership changed: %zu left to the next leader", r->n);
    while (r->n)
        drop(r, r->n - 1);
}

void svc_resolve_destroy(struct kvp_master_service *s)
{
    svc_resolve_reset(s); /* entries with asks open are freed by svc_verify_destroy's callbacks */
    if (s->resolve && (s->resolve->sealed || s->resolve->revoked))
        kvp_log_info(s->actor, "intents resolved as leader: %llu sealed, %llu revoked",
                     (unsigned long long)s->resolve->sealed, (unsigned long long)s->resolve->revoked);
    free(s->resolve);
    s->resolve = NULL;
}

size_t svc_resolve_held(const struct kvp_master_service *s)
{
    return s->resolve ? s->resolve->n : 0;
}

void svc_resolve_status(struct kvp_master_service *s, json_t *soft)
{
    const struct svc_resolve *r = s->resolve;
    json_object_set_new(soft, "verify_asks", json_integer((json_int_t)svc_verify_held(s)));
    json_object_set_new(soft, "intents_resolving", json_integer(r ? (json_int_t)r->n : 0));
    json_object_set_new(soft, "intents_sealed", json_integer(r ? (json_int_t)r->sealed : 0));
    json_object_set_new(soft, "intents_revoked", json_integer(r ? (json_int_t)r->revoked : 0));
}

void svc_resolve_test_hook(struct kvp_master_service *s, Kvp__Command *cmd)
{
    if (!s->resolve || !s->resolve->test_intent_only || cmd->body_case != KVP__COMMAND__BODY_PUT_COMMIT ||
        !cmd->put_commit)
        return;
    for (size_t i = 0; i < cmd->put_commit->n_items; i++)
        if (cmd->put_commit->items[i])
            cmd->put_commit->items[i]->intent = true;
}
