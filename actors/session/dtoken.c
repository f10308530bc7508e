/*
 * dtoken.c — a process's data-plane tokens (dtoken.h).
 *
 * Who owns what:
 *  - the tokens themselves: each network transfer actor of the engine keeps its own wallet, made
 *    from this key pair at engine start, and signs the segments' challenges from it inside its
 *    poll; tokens reach it by message (kvp_xfer_tokens_put). Nothing here signs.
 *  - the key pair (`key`, a wallet that never holds a token): written at new, read-only after.
 *  - the record of what was handed over (`held`) and `off`: read by every caller thread before
 *    each transfer, written by the one that asked. These are atomics, not a message to an owner,
 *    because that would add a request and a reply to every put and get (the caller asks only when
 *    the record says a token is missing or ends within a minute). A slot is one 64-bit word
 *    (segment id, expiry), stored with release only after the tokens were sent to every transfer
 *    actor, and read with acquire: a caller that reads it as held and then starts a transfer
 *    sends that transfer after the tokens in the actor's mailbox, which is FIFO
 *    (docs/runtime.md "Messages"). Two callers may ask for the same segment at once, as before.
 */
#include "actors/session/dtoken.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/session/msession.h"
#include "actors/transfer/transfer.h"
#include "auth/auth_token.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "wire/kvpool.pb-c.h"

#define DTOKEN_MARGIN_MS 60000u /* ask again when a token ends within this */
#define DTOKEN_MAX_IDS 64       /* the masters' limit per request (KVP_XFER_TOKENS_MAX) */
#define DTOKEN_SLOTS 1024u      /* segments recorded at once (a pool has tens); a power of 2 */

struct kvp_dtoken {
    struct kvp_dt_wallet *key; /* the key pair only: see the file comment */
    uint8_t pk[KVP_DT_PK_BYTES];
    atomic_bool off;           /* the masters do not issue tokens: stop asking */
    atomic_bool full_logged;
    /* Open addressing, linear probing: segment id << 32 | expiry in wall seconds (rounded down);
     * 0 is empty. A slot whose expiry passed may be taken over by another segment. */
    _Atomic uint64_t held[DTOKEN_SLOTS];
    char who[64];
};

int kvp_dtoken_new(struct kvp_dtoken **out, const char *who)
{
    struct kvp_dtoken *d = calloc(1, sizeof *d);
    if (!d)
        return KVP_ERR_NOMEM;
    int rc = kvp_dt_wallet_new(&d->key);
    if (rc != KVP_OK) {
        free(d);
        return rc;
    }
    kvp_dt_wallet_public_key(d->key, d->pk);
    snprintf(d->who, sizeof d->who, "%s", who ? who : "client");
    *out = d;
    return KVP_OK;
}

const struct kvp_dt_wallet *kvp_dtoken_key(const struct kvp_dtoken *d)
{
    return d ? d->key : NULL;
}

static size_t slot_of(uint32_t segment_id)
{
    return (size_t)((segment_id * 2654435761u) & (DTOKEN_SLOTS - 1));
}

/* The recorded expiry of segment_id's token (wall seconds), 0 when none. */
static uint32_t held_expiry(const struct kvp_dtoken *d, uint32_t segment_id)
{
    size_t i = slot_of(segment_id);
    for (size_t k = 0; k < DTOKEN_SLOTS; k++, i = (i + 1) & (DTOKEN_SLOTS - 1)) {
        uint64_t v = atomic_load_explicit(&d->held[i], memory_order_acquire);
        if (v == 0)
            return 0;
        if ((uint32_t)(v >> 32) == segment_id)
            return (uint32_t)v;
    }
    return 0;
}

bool kvp_dtoken_held(const struct kvp_dtoken *d, uint32_t segment_id, uint64_t now_ms, uint64_t margin_ms)
{
    return d && now_ms + margin_ms < (uint64_t)held_expiry(d, segment_id) * 1000u;
}

bool kvp_dtoken_off(const struct kvp_dtoken *d)
{
    return d && atomic_load_explicit(&d->off, memory_order_acquire);
}

/* Record segment_id's token as handed over, valid until exp_s (wall seconds). Called only after
 * kvp_xfer_tokens_put returned KVP_OK for it. A record never lowers an expiry (two askers may
 * finish in either order; the actors keep the later token too). If a race leaves two slots for
 * one segment, a lookup finds the first: its expiry was also recorded after a hand-over. */
static void held_record(struct kvp_dtoken *d, uint32_t segment_id, uint32_t exp_s, uint32_t now_s)
{
    uint64_t want = (uint64_t)segment_id << 32 | exp_s;
    for (int attempt = 0; attempt < 8; attempt++) {
        size_t i = slot_of(segment_id), reuse = SIZE_MAX;
        uint64_t reuse_v = 0;
        bool raced = false;
        for (size_t k = 0; k < DTOKEN_SLOTS && !raced; k++, i = (i + 1) & (DTOKEN_SLOTS - 1)) {
            uint64_t v = atomic_load_explicit(&d->held[i], memory_order_acquire);
            if (v != 0 && (uint32_t)(v >> 32) == segment_id) {
                while ((uint32_t)(v >> 32) == segment_id && (uint32_t)v < exp_s &&
                       !atomic_compare_exchange_weak_explicit(&d->held[i], &v, want, memory_order_release,
                                                              memory_order_acquire))
                    ;
                return; /* raised, already later, or the slot went to another segment (asked again) */
            }
            if (v == 0) {
                size_t at = reuse != SIZE_MAX ? reuse : i;
                uint64_t expect = reuse != SIZE_MAX ? reuse_v : 0;
                if (atomic_compare_exchange_strong_explicit(&d->held[at], &expect, want, memory_order_release,
                                                            memory_order_relaxed))
                    return;
                raced = true; /* another caller took that slot: look again */
            } else if (reuse == SIZE_MAX && (uint32_t)v < now_s) {
                reuse = i; /* expired: may hold this segment instead */
                reuse_v = v;
            }
        }
        if (!raced) { /* no empty slot */
            uint64_t expect = reuse_v;
            if (reuse != SIZE_MAX && atomic_compare_exchange_strong_explicit(&d->held[reuse], &expect, want,
                                                                             memory_order_release,
                                                                             memory_order_relaxed))
                return;
            if (reuse == SIZE_MAX)
                break;
        }
    }
    if (!atomic_exchange(&d->full_logged, true))
        kvp_log_warn(d->who, "segment %u's data token could not be recorded (over %u segments at once): it is "
                     "asked for again before its transfers (logged once)", segment_id, DTOKEN_SLOTS);
}

/* One DataToken call for ids: KVP_OK when the tokens were handed to xe's transfer actors and
 * recorded, or the masters issue none (d->off), else why not. */
static int ask(struct kvp_dtoken *d, struct kvp_msession *ms, struct kvp_xfer_engine *xe, uint32_t *ids, size_t nid,
               uint32_t timeout_ms)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__DataTokenReq dt = KVP__DATA_TOKEN_REQ__INIT;
    dt.n_segment_ids = nid;
    dt.segment_ids = ids;
    dt.client_key.data = d->pk;
    dt.client_key.len = KVP_DT_PK_BYTES;
    req.body_case = KVP__REQUEST__BODY_DATA_TOKEN;
    req.data_token = &dt;
    Kvp__Response *resp = NULL;
    int rc = kvp_msession_call(ms, &req, timeout_ms, &resp);
    if (rc != KVP_OK)
        return rc;
    if (resp->status == KVP_ERR_UNSUPPORTED || resp->status == KVP_ERR_INVALID) {
        /* auth none, or a master from before data tokens: nothing to present */
        if (!atomic_exchange_explicit(&d->off, true, memory_order_acq_rel))
            kvp_log_info(d->who, "the masters issue no data-plane tokens (%s): not asking again",
                         kvp_errname(resp->status));
        rc = KVP_OK;
    } else if (resp->status == KVP_OK && resp->body_case == KVP__RESPONSE__BODY_DATA_TOKEN) {
        const uint8_t *tok[DTOKEN_MAX_IDS];
        size_t len[DTOKEN_MAX_IDS], nt = 0;
        uint32_t seg[DTOKEN_MAX_IDS];
        uint64_t exp_ms[DTOKEN_MAX_IDS];
        for (size_t i = 0; i < resp->data_token->n_tokens; i++) {
            const ProtobufCBinaryData *t = &resp->data_token->tokens[i];
            if (nt == DTOKEN_MAX_IDS || kvp_dt_token_peek(t->data, t->len, d->pk, &seg[nt], &exp_ms[nt]) != KVP_OK) {
                kvp_log_warn(d->who, "data token %zu of the master's answer: not a token for this key", i);
                rc = KVP_ERR_MALFORMED;
                continue;
            }
            tok[nt] = t->data;
            len[nt++] = t->len;
        }
        int put = nt ? kvp_xfer_tokens_put(xe, tok, len, nt) : KVP_OK;
        if (put != KVP_OK) {
            kvp_log_warn(d->who, "data tokens for %zu segment(s): not handed to the transfer actors (%s)", nt,
                         kvp_errname(put));
            rc = put;
        } else {
            uint32_t now_s = (uint32_t)(kvp_clock_wall_ms() / 1000u);
            for (size_t i = 0; i < nt; i++)
                held_record(d, seg[i], (uint32_t)(exp_ms[i] / 1000u), now_s);
        }
    } else {
        rc = resp->status != KVP_OK ? resp->status : KVP_ERR_MALFORMED;
    }
    kvp_msession_response_free(resp);
    return rc;
}

void kvp_dtoken_ensure(struct kvp_dtoken *d, struct kvp_msession *ms, struct kvp_xfer_engine *xe,
                       const struct kvp_xfer_slice *sl, size_t n, uint32_t timeout_ms)
{
    if (!d || !ms || !xe || kvp_dtoken_off(d))
        return;
    uint32_t ids[DTOKEN_MAX_IDS];
    size_t nid = 0;
    uint64_t now = kvp_clock_wall_ms();
    for (size_t i = 0; i < n && nid < DTOKEN_MAX_IDS; i++) {
        bool seen = false;
        for (size_t j = 0; j < nid && !seen; j++)
            seen = ids[j] == sl[i].segment_id;
        if (!seen && !kvp_dtoken_held(d, sl[i].segment_id, now, DTOKEN_MARGIN_MS))
            ids[nid++] = sl[i].segment_id;
    }
    if (nid == 0)
        return;
    /* A refused or failed ask is retried (3 tries, 50 ms apart, within timeout_ms): a transfer
     * to a segment without a token fails at its connect. A fresh-clone CI run once saw a put fail
     * that way right after the cluster came up; the ask's outcome was then logged at debug level
     * only, so the cause is not known: the last failure is now a WARN. */
    uint64_t deadline = kvp_clock_now_ms() + (timeout_ms ? timeout_ms : 2000);
    int last = KVP_OK;
    for (int attempt = 0; attempt < 3; attempt++) {
        uint64_t now_ms = kvp_clock_now_ms();
        if (attempt > 0) {
            if (now_ms + 50 >= deadline)
                break;
            kvp_clock_sleep_ms(50);
            now_ms += 50;
        }
        last = ask(d, ms, xe, ids, nid, (uint32_t)(deadline > now_ms ? deadline - now_ms : 1));
        if (last == KVP_OK)
            return;
    }
    kvp_log_warn(d->who, "data tokens for %zu segment(s) (first id %u): %s; transfers to them will be refused",
                 nid, ids[0], kvp_errname(last));
}

void kvp_dtoken_destroy(struct kvp_dtoken **dp)
{
    if (!dp || !*dp)
        return;
    kvp_dt_wallet_destroy(&(*dp)->key);
    free(*dp);
    *dp = NULL;
}
