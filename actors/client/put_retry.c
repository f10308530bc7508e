/*
 * put_retry.c — retry of PutStart items that found no space while the master evicts, and the
 * prefix hints of kvp_batch_put_hinted (put_retry.h, kvpool_hint.h, docs/eviction.md).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "actors/client/put_retry.h"
#include "actors/session/msession.h"
#include "kvpool_hint.h"
#include "runtime/log.h"

/* Parent keys of the kvp_batch_put_hinted call running on this thread (NULL: none). */
static __thread const char *const *t_parents;
static __thread size_t t_n_parents;

const char *kvp_client_put_parent(size_t i)
{
    if (!t_parents || i >= t_n_parents || !t_parents[i])
        return "";
    return t_parents[i];
}

int kvp_batch_put_hinted(kvp_client *c, size_t n, const char *const keys[], const void *const bufs[],
                         const size_t lens[], const char *const parent_keys[], const kvp_put_opts *opts,
                         int results[])
{
    t_parents = parent_keys;
    t_n_parents = parent_keys ? n : 0;
    int rc = kvp_batch_put(c, n, keys, bufs, lens, opts, results);
    t_parents = NULL;
    t_n_parents = 0;
    return rc;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

unsigned kvp_put_retry_pause_ms(unsigned backoff_ms, uint64_t *rng)
{
    /* xorshift64* (Vigna, "An experimental exploration of Marsaglia's xorshift generators"):
     * enough to spread clients, no quality needed */
    uint64_t x = *rng ? *rng : 0x9E3779B97F4A7C15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *rng = x;
    uint64_t r = x * 0x2545F4914F6CDD1Dull;
    unsigned lo = (backoff_ms + 1) / 2, span = backoff_ms - lo;
    return lo + (unsigned)((r >> 32) % ((uint64_t)span + 1));
}

static uint64_t pause_seed(const Kvp__PutStartItem *first)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t seed = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
    seed ^= (uint64_t)(uintptr_t)&ts; /* another thread, another stack */
    if (first)
        seed ^= first->op_id;
    return seed ? seed : 1;
}

unsigned kvp_client_put_start_retry(struct kvp_client *c, Kvp__PutStartItem **items, size_t m,
                                    const Kvp__PutStartResult **res, int *rpc_status, uint64_t deadline,
                                    Kvp__Response ***extra, size_t *n_extra)
{
    size_t *idx = calloc(m ? m : 1, sizeof *idx);
    Kvp__PutStartItem **sub = calloc(m ? m : 1, sizeof *sub);
    unsigned rounds = 0, backoff = 5;
    uint64_t rng = pause_seed(m ? items[0] : NULL);
    if (!idx || !sub)
        goto out;
    for (;;) {
        size_t nr = 0;
        for (size_t j = 0; j < m; j++)
            if (res[j] && res[j]->status == KVP_ERR_NO_SPACE && res[j]->evicting)
                idx[nr++] = j;
        if (nr == 0 || kvp_client_closing(c))
            break;
        uint32_t left = kvp_client_remaining(deadline);
        /* Jittered: clients that got NO_SPACE together (a full pool, a new leader's first
         * puts) would otherwise ask again in lockstep, every one at the same 5, 10, 20 … ms. */
        unsigned pause = kvp_put_retry_pause_ms(backoff, &rng);
        if (left <= pause + 50) /* keep time for the transfer and PutEnd of a late success */
            break;
        sleep_ms(pause);
        backoff = backoff * 2 > 200 ? 200 : backoff * 2;
        for (size_t k = 0; k < nr; k++) {
            Kvp__PutStartItem *it = items[idx[k]];
            it->op_id = it->op_id * 6364136223846793005ull + 1442695040888963407ull; /* fresh op id */
            sub[k] = it;
        }
        Kvp__Request req;
        Kvp__PutStartReq ps;
        kvp__request__init(&req);
        kvp__put_start_req__init(&ps);
        ps.n_items = nr;
        ps.items = sub;
        ps.ttl_ms = (uint64_t)kvp_client_remaining(deadline) + 2000u; /* as the first PutStart */
        req.body_case = KVP__REQUEST__BODY_PUT_START;
        req.put_start = &ps;
        Kvp__Response *resp = NULL;
        int rc = kvp_client_rpc(c, &req, deadline, KVP__RESPONSE__BODY_PUT_START, &resp);
        if (rc == KVP_OK && resp->put_start->n_results != nr)
            rc = KVP_ERR_MALFORMED;
        rounds++;
        if (rc != KVP_OK) {
            kvp_msession_response_free(resp);
            for (size_t k = 0; k < nr; k++) {
                res[idx[k]] = NULL;
                rpc_status[idx[k]] = rc;
            }
            break;
        }
        Kvp__Response **v = realloc(*extra, (*n_extra + 1) * sizeof *v);
        if (!v) {
            kvp_msession_response_free(resp);
            for (size_t k = 0; k < nr; k++) {
                res[idx[k]] = NULL;
                rpc_status[idx[k]] = KVP_ERR_NOMEM;
            }
            break;
        }
        *extra = v;
        v[(*n_extra)++] = resp;
        for (size_t k = 0; k < nr; k++)
            res[idx[k]] = resp->put_start->results[k];
    }
    for (size_t j = 0; j < m; j++)
        if (res[j] && res[j]->status == KVP_ERR_NO_SPACE)
            kvp_log_warn(c->name, "put %s: %s (after %u retries)", items[j]->key,
                         res[j]->reason && res[j]->reason[0] ? res[j]->reason : "no space", rounds);
out:
    free(idx);
    free(sub);
    return rounds;
}
