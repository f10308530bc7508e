/*
 * kvpoolctl_verify.c — `kvpoolctl verify KEY...`: a scrub of the named objects. The leader has
 * every replica's segment checksum the replica's bytes (RangeVerify in its heartbeat answer,
 * docs/master.md "Range verification") and compares it with the object's committed checksum.
 * Prints one line per replica: match, MISMATCH (with the segment's checksum) or unknown (no
 * answer: segment lost or silent, an older segment, leadership changed).
 *
 * Exit status: 0 every replica of every key matches; 1 a replica mismatches or the call failed;
 * 3 no mismatch, but a key is not found (or not complete) or a replica is unknown; 2 usage.
 * The call waits at least 15 s (--timeout above that): an unanswered replica is declared unknown
 * after a few of its segment's heartbeats.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "tools/kvpoolctl/kvpoolctl_ctl.h"

#define VERIFY_KEYS_PER_CALL 64u /* the master's limit per Verify call */
#define VERIFY_MIN_TIMEOUT_MS 15000u

static const char *result_name(Kvp__VerifyResult r)
{
    switch (r) {
    case KVP__VERIFY_RESULT__VERIFY_MATCH:
        return "match";
    case KVP__VERIFY_RESULT__VERIFY_MISMATCH:
        return "mismatch";
    default:
        return "unknown";
    }
}

/* Print one call's answer (keys[i] ↔ objects[i]); updates the worst outcome seen. */
static void print_objects(struct ctl *c, char **keys, const Kvp__VerifyResp *vr, json_t *arr, bool *mismatch,
                          bool *incomplete)
{
    for (size_t i = 0; i < vr->n_objects; i++) {
        const Kvp__ObjectVerify *o = vr->objects[i];
        json_t *jo = NULL, *jr = NULL;
        if (c->json) {
            jo = json_pack("{s:s, s:s}", "key", keys[i], "status", o->status == KVP_OK ? "ok" : kvp_errname(o->status));
            jr = json_array();
        }
        if (o->status != KVP_OK) {
            *incomplete = true;
            if (!c->json)
                printf("%s: %s (%s)\n", keys[i], kvp_errname(o->status), kvp_strerror(o->status));
        } else {
            char sum[20];
            snprintf(sum, sizeof sum, "%016" PRIx64, o->checksum);
            if (c->json) {
                json_object_set_new(jo, "size", json_integer((json_int_t)o->size));
                json_object_set_new(jo, "checksum", json_string(sum));
            } else {
                printf("%s: %" PRIu64 " bytes, checksum %s, %zu replicas\n", keys[i], o->size, sum, o->n_replicas);
            }
        }
        for (size_t k = 0; o->status == KVP_OK && k < o->n_replicas; k++) {
            const Kvp__ReplicaVerify *r = o->replicas[k];
            if (r->result == KVP__VERIFY_RESULT__VERIFY_MISMATCH)
                *mismatch = true;
            else if (r->result != KVP__VERIFY_RESULT__VERIFY_MATCH)
                *incomplete = true;
            char got[20] = "";
            if (r->result != KVP__VERIFY_RESULT__VERIFY_UNKNOWN)
                snprintf(got, sizeof got, "%016" PRIx64, r->checksum);
            if (c->json) {
                json_t *x = json_pack("{s:i, s:I, s:s}", "segment_id", (int)r->segment_id, "offset",
                                      (json_int_t)r->offset, "result", result_name(r->result));
                if (got[0])
                    json_object_set_new(x, "checksum", json_string(got));
                json_array_append_new(jr, x);
            } else if (r->result == KVP__VERIFY_RESULT__VERIFY_MISMATCH) {
                printf("  segment %u offset %" PRIu64 ": MISMATCH (the segment's bytes hash to %s)\n", r->segment_id,
                       r->offset, got);
            } else {
                printf("  segment %u offset %" PRIu64 ": %s\n", r->segment_id, r->offset, result_name(r->result));
            }
        }
        if (c->json) {
            json_object_set_new(jo, "replicas", jr);
            json_array_append_new(arr, jo);
        }
    }
}

int ctl_cmd_verify(struct ctl *c, int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: kvpoolctl verify KEY...   (check every replica's bytes against the object's checksum)\n");
        return 2;
    }
    for (int i = 1; i < argc; i++)
        if (!argv[i][0]) {
            fprintf(stderr, "kvpoolctl verify: empty key\n");
            return 2;
        }
    uint32_t timeout = c->timeout_ms > VERIFY_MIN_TIMEOUT_MS ? c->timeout_ms : VERIFY_MIN_TIMEOUT_MS;
    json_t *arr = c->json ? json_array() : NULL;
    bool mismatch = false, incomplete = false;
    int rc = 0;
    for (int at = 1; at < argc && rc == 0;) {
        size_t n = (size_t)(argc - at);
        if (n > VERIFY_KEYS_PER_CALL)
            n = VERIFY_KEYS_PER_CALL;
        Kvp__Request req = KVP__REQUEST__INIT;
        Kvp__VerifyReq vq = KVP__VERIFY_REQ__INIT;
        vq.keys = &argv[at];
        vq.n_keys = n;
        req.body_case = KVP__REQUEST__BODY_VERIFY;
        req.verify = &vq;
        Kvp__Response *resp = NULL;
        int err = ctl_call(c, &req, timeout, &resp);
        const char *ctx = NULL;
        if (err == KVP_OK && resp->status != KVP_OK) {
            err = resp->status;
            ctx = resp->error;
        } else if (err == KVP_OK && (!resp->verify || resp->verify->n_objects != n)) {
            err = KVP_ERR_MALFORMED;
            ctx = "the answer does not list every key (an older master answers INVALID)";
        }
        if (err != KVP_OK)
            rc = ctl_fail(c, "verify", err, ctx);
        else
            print_objects(c, &argv[at], resp->verify, arr, &mismatch, &incomplete);
        ctl_response_free(resp);
        at += (int)n;
    }
    if (rc == 0 && c->json) {
        json_t *j = json_pack("{s:o, s:s}", "objects", arr, "result",
                              mismatch ? "mismatch" : incomplete ? "incomplete" : "ok");
        ctl_print_json(j);
        json_decref(j);
        arr = NULL;
    }
    json_decref(arr);
    if (rc != 0)
        return rc;
    return mismatch ? 1 : incomplete ? 3 : 0;
}
