/*
 * dtoken.c — a process's data-plane tokens (dtoken.h).
 *
 * The lock: the wallet is read by the transfer engine's actors (their TCP transports answer a
 * segment's challenge from inside poll, where they may not block waiting for a reply, so a
 * message to an owner would not do) and filled by application threads after a DataToken call.
 * It is held only to copy a token or sign one challenge (microseconds). This is the one client
 * file with a lock; the rest of the client's shared state is the client actor's (client_actor.c).
 */
#include "actors/client/dtoken.h"

#include <pthread.h>
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
#define DTOKEN_MAX_IDS 64       /* the masters' limit per request */

struct kvp_dtoken {
    pthread_mutex_t mu; /* see the file comment */
    struct kvp_dt_wallet *w;
    bool off; /* the masters do not issue tokens: stop asking */
    char who[64];
};

int kvp_dtoken_new(struct kvp_dtoken **out, const char *who)
{
    struct kvp_dtoken *d = calloc(1, sizeof *d);
    if (!d)
        return KVP_ERR_NOMEM;
    int rc = kvp_dt_wallet_new(&d->w);
    if (rc != KVP_OK) {
        free(d);
        return rc;
    }
    pthread_mutex_init(&d->mu, NULL);
    snprintf(d->who, sizeof d->who, "%s", who ? who : "client");
    *out = d;
    return KVP_OK;
}

/* One DataToken call for ids: KVP_OK when the tokens were stored or the masters issue none
 * (d->off), else why not. */
static int ask(struct kvp_dtoken *d, struct kvp_msession *ms, uint32_t *ids, size_t nid, uint8_t *pk,
               uint32_t timeout_ms)
{
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__DataTokenReq dt = KVP__DATA_TOKEN_REQ__INIT;
    dt.n_segment_ids = nid;
    dt.segment_ids = ids;
    dt.client_key.data = pk;
    dt.client_key.len = KVP_DT_PK_BYTES;
    req.body_case = KVP__REQUEST__BODY_DATA_TOKEN;
    req.data_token = &dt;
    Kvp__Response *resp = NULL;
    int rc = kvp_msession_call(ms, &req, timeout_ms, &resp);
    if (rc != KVP_OK)
        return rc;
    pthread_mutex_lock(&d->mu);
    if (resp->status == KVP_ERR_UNSUPPORTED || resp->status == KVP_ERR_INVALID) {
        /* auth none, or a master from before data tokens: nothing to present */
        if (!d->off)
            kvp_log_info(d->who, "the masters issue no data-plane tokens (%s): not asking again",
                         kvp_errname(resp->status));
        d->off = true;
        rc = KVP_OK;
    } else if (resp->status == KVP_OK && resp->body_case == KVP__RESPONSE__BODY_DATA_TOKEN) {
        for (size_t i = 0; i < resp->data_token->n_tokens; i++)
            if (kvp_dt_wallet_put(d->w, resp->data_token->tokens[i].data, resp->data_token->tokens[i].len) != KVP_OK) {
                kvp_log_warn(d->who, "data token %zu of the master's answer: not a token for this wallet", i);
                rc = KVP_ERR_MALFORMED;
            }
    } else {
        rc = resp->status != KVP_OK ? resp->status : KVP_ERR_MALFORMED;
    }
    pthread_mutex_unlock(&d->mu);
    kvp_msession_response_free(resp);
    return rc;
}

void kvp_dtoken_ensure(struct kvp_dtoken *d, struct kvp_msession *ms, const struct kvp_xfer_slice *sl, size_t n,
                       uint32_t timeout_ms)
{
    if (!d || !ms)
        return;
    uint32_t ids[DTOKEN_MAX_IDS];
    size_t nid = 0;
    uint8_t pk[KVP_DT_PK_BYTES];
    uint64_t now = kvp_clock_wall_ms();
    pthread_mutex_lock(&d->mu);
    bool off = d->off;
    for (size_t i = 0; !off && i < n && nid < DTOKEN_MAX_IDS; i++) {
        bool seen = false;
        for (size_t j = 0; j < nid && !seen; j++)
            seen = ids[j] == sl[i].segment_id;
        if (!seen && kvp_dt_wallet_needs(d->w, sl[i].segment_id, now, DTOKEN_MARGIN_MS))
            ids[nid++] = sl[i].segment_id;
    }
    kvp_dt_wallet_public_key(d->w, pk);
    pthread_mutex_unlock(&d->mu);
    if (off || nid == 0)
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
        last = ask(d, ms, ids, nid, pk, (uint32_t)(deadline > now_ms ? deadline - now_ms : 1));
        if (last == KVP_OK)
            return;
    }
    kvp_log_warn(d->who, "data tokens for %zu segment(s) (first id %u): %s; transfers to them will be refused",
                 nid, ids[0], kvp_errname(last));
}

int kvp_dtoken_respond(void *ctx, const uint8_t *challenge, size_t len, uint8_t *out, size_t cap)
{
    struct kvp_dtoken *d = ctx;
    if (len != KVP_DT_CHALLENGE_BYTES)
        return KVP_ERR_INVALID;
    pthread_mutex_lock(&d->mu);
    int rc = kvp_dt_wallet_respond(d->w, challenge, kvp_clock_wall_ms(), out, cap);
    pthread_mutex_unlock(&d->mu);
    return rc;
}

void kvp_dtoken_destroy(struct kvp_dtoken **dp)
{
    if (!dp || !*dp)
        return;
    kvp_dt_wallet_destroy(&(*dp)->w);
    pthread_mutex_destroy(&(*dp)->mu);
    free(*dp);
    *dp = NULL;
}
