/*
 * test_master_verify.c — the leader's range verifier alone (actors/master/service/service_verify.h),
 * on a service state with no sockets: asks go out in a segment's heartbeat answer once, answers
 * match by id (an older term's id never does), MATCH / MISMATCH / UNKNOWN for an error status,
 * UNKNOWN after the heartbeats an unanswered ask waits (an older segment), for a segment gone
 * from the table, at a leadership change; the bound on asks held; a callback may ask again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "actors/master/service/service_state.h"
#include "actors/master/service/service_verify.h"
#include "kvpool.h"

#define MAXR 16

struct rec {
    int n;
    int result[MAXR];
    uint32_t idx[MAXR];
    uint64_t checksum[MAXR];
    bool ask_again;               /* the callback of idx 0 asks once more */
    struct kvp_master_service *s;
};

static void cb(struct kvp_master_service *s, void *arg, uint32_t idx, int result, uint64_t checksum)
{
    struct rec *r = arg;
    if (r->n < MAXR) {
        r->result[r->n] = result;
        r->idx[r->n] = idx;
        r->checksum[r->n] = checksum;
    }
    r->n++;
    if (r->ask_again && idx == 0) {
        r->ask_again = false;
        assert_int_equal(svc_verify_range(r->s, 5, 0, 10, 7, cb, r, 99), KVP_OK);
    }
}

static struct kvp_master_service *new_leader(uint64_t term)
{
    struct kvp_master_service *s = calloc(1, sizeof *s);
    assert_non_null(s);
    snprintf(s->actor, sizeof s->actor, "test");
    s->is_leader = true;
    s->term = term;
    s->segments_fresh_ms = 1;
    svc_map_put(&s->segments, 5, (uint64_t)KVP__SEGMENT_STATE__SEGMENT_ACTIVE + 1);
    svc_map_put(&s->segments, 6, (uint64_t)KVP__SEGMENT_STATE__SEGMENT_ACTIVE + 1);
    return s;
}

static void free_leader(struct kvp_master_service *s)
{
    svc_verify_destroy(s);
    svc_map_fini(&s->segments);
    free(s);
}

/* A heartbeat of seg carrying the answers {id, status, checksum}. */
static void beat(struct kvp_master_service *s, uint32_t seg, const uint64_t (*ans)[3], size_t n)
{
    Kvp__RangeSum sums[8], *sp[8];
    for (size_t i = 0; i < n; i++) {
        kvp__range_sum__init(&sums[i]);
        sums[i].id = ans[i][0];
        sums[i].status = (int32_t)(int64_t)ans[i][1];
        sums[i].checksum = ans[i][2];
        sp[i] = &sums[i];
    }
    Kvp__HeartbeatReq hb = KVP__HEARTBEAT_REQ__INIT;
    hb.segment_id = seg;
    hb.verified = n ? sp : NULL;
    hb.n_verified = n;
    svc_verify_on_heartbeat(s, seg, &hb);
}

static void test_master_verify_match_mismatch_error(void **state)
{
    (void)state;
    struct kvp_master_service *s = new_leader(7);
    struct rec r = {0};
    assert_int_equal(svc_verify_range(s, 5, 4096, 100, 0xaaa, cb, &r, 0), KVP_OK);
    assert_int_equal(svc_verify_range(s, 5, 8192, 100, 0xbbb, cb, &r, 1), KVP_OK);
    assert_int_equal(svc_verify_range(s, 5, 0, 100, 0xccc, cb, &r, 2), KVP_OK);
    assert_int_equal(svc_verify_range(s, 6, 0, 100, 0xddd, cb, &r, 3), KVP_OK);
    assert_int_equal(svc_verify_held(s), 4);
    Kvp__HeartbeatResp hr = KVP__HEARTBEAT_RESP__INIT;
    svc_verify_fill(s, 5, &hr);
    assert_int_equal(hr.n_verify, 3); /* only seg 5's */
    uint64_t id[3];
    for (size_t i = 0; i < 3; i++) {
        id[i] = hr.verify[i]->id;
        assert_int_equal(id[i] >> 32, 7); /* the term in the high bits */
    }
    assert_int_equal(hr.verify[0]->offset, 4096);
    assert_int_equal(hr.verify[0]->len, 100);
    Kvp__HeartbeatResp hr2 = KVP__HEARTBEAT_RESP__INIT;
    svc_verify_fill(s, 5, &hr2);
    assert_int_equal(hr2.n_verify, 0); /* asked once */
    /* an answer with an older term's id and the same low bits: not ours */
    const uint64_t stale[1][3] = {{(6ull << 32) | (id[0] & 0xffffffffu), KVP_OK, 0xaaa}};
    beat(s, 5, stale, 1);
    assert_int_equal(r.n, 0);
    /* an answer for seg 5's ask arriving in seg 6's heartbeat: not taken */
    const uint64_t wrongseg[1][3] = {{id[0], KVP_OK, 0xaaa}};
    beat(s, 6, wrongseg, 1);
    assert_int_equal(r.n, 0);
    const uint64_t ans[3][3] = {{id[0], KVP_OK, 0xaaa}, {id[1], KVP_OK, 0x123}, {id[2], (uint64_t)(int64_t)KVP_ERR_INVALID, 0}};
    beat(s, 5, ans, 3);
    assert_int_equal(r.n, 3);
    for (int i = 0; i < 3; i++) {
        if (r.idx[i] == 0)
            assert_int_equal(r.result[i], SVC_VERIFY_MATCH);
        else if (r.idx[i] == 1) {
            assert_int_equal(r.result[i], SVC_VERIFY_MISMATCH);
            assert_int_equal(r.checksum[i], 0x123);
        } else {
            assert_int_equal(r.idx[i], 2);
            assert_int_equal(r.result[i], SVC_VERIFY_UNKNOWN);
        }
    }
    assert_int_equal(svc_verify_held(s), 1); /* seg 6's */
    free_leader(s);
    assert_int_equal(r.n, 4); /* destroy ended it, quietly */
    assert_int_equal(r.result[3], SVC_VERIFY_UNKNOWN);
}

static void test_master_verify_unanswered_lost_reset(void **state)
{
    (void)state;
    struct kvp_master_service *s = new_leader(3);
    struct rec r = {0};
    /* an older segment: the ask goes out, no answer ever comes */
    assert_int_equal(svc_verify_range(s, 5, 0, 100, 1, cb, &r, 0), KVP_OK);
    Kvp__HeartbeatResp hr = KVP__HEARTBEAT_RESP__INIT;
    svc_verify_fill(s, 5, &hr);
    assert_int_equal(hr.n_verify, 1);
    for (unsigned i = 0; i < SVC_VERIFY_BEATS; i++) {
        beat(s, 5, NULL, 0);
        assert_int_equal(r.n, 0);
    }
    beat(s, 5, NULL, 0); /* SVC_VERIFY_BEATS + one per 256 MiB asked (here 1) */
    assert_int_equal(r.n, 1);
    assert_int_equal(r.result[0], SVC_VERIFY_UNKNOWN);
    /* a segment gone from the table: UNKNOWN at the next tick, sent or not */
    assert_int_equal(svc_verify_range(s, 6, 0, 100, 1, cb, &r, 1), KVP_OK);
    svc_map_del(&s->segments, 6, NULL);
    svc_verify_tick(s);
    assert_int_equal(r.n, 2);
    assert_int_equal(r.idx[1], 1);
    assert_int_equal(r.result[1], SVC_VERIFY_UNKNOWN);
    /* a leadership change ends every ask; a callback may ask again (the new one waits) */
    r.ask_again = true;
    r.s = s;
    assert_int_equal(svc_verify_range(s, 5, 0, 100, 1, cb, &r, 0), KVP_OK);
    s->term = 4;
    svc_verify_reset(s);
    assert_int_equal(r.n, 3);
    assert_int_equal(svc_verify_held(s), 1); /* the callback's new ask */
    Kvp__HeartbeatResp hr2 = KVP__HEARTBEAT_RESP__INIT;
    svc_verify_fill(s, 5, &hr2);
    assert_int_equal(hr2.n_verify, 1);
    assert_int_equal(hr2.verify[0]->id >> 32, 4); /* the new term's id */
    /* not the leader: refused, never called back */
    s->is_leader = false;
    assert_int_equal(svc_verify_range(s, 5, 0, 100, 1, cb, &r, 5), KVP_ERR_NOT_LEADER);
    s->is_leader = true;
    assert_int_equal(svc_verify_range(s, 5, 0, 0, 1, cb, &r, 5), KVP_ERR_INVALID);
    assert_int_equal(svc_verify_range(s, 0, 0, 10, 1, cb, &r, 5), KVP_ERR_INVALID);
    free_leader(s);
    assert_int_equal(r.n, 4);
}

static void test_master_verify_bounded(void **state)
{
    (void)state;
    struct kvp_master_service *s = new_leader(2);
    struct rec r = {0};
    for (unsigned i = 0; i < SVC_VERIFY_MAX; i++)
        assert_int_equal(svc_verify_range(s, 5, i, 1, 0, cb, &r, i), KVP_OK);
    assert_int_equal(svc_verify_range(s, 5, 0, 1, 0, cb, &r, 0), KVP_ERR_BUSY);
    assert_int_equal(svc_verify_held(s), SVC_VERIFY_MAX);
    /* per answer at most SVC_VERIFY_PER_BEAT; per segment at most SVC_VERIFY_OUT_PER_SEG out */
    size_t sent = 0;
    for (int k = 0; k < 10; k++) {
        Kvp__HeartbeatResp hr = KVP__HEARTBEAT_RESP__INIT;
        svc_verify_fill(s, 5, &hr);
        assert_true(hr.n_verify <= SVC_VERIFY_PER_BEAT);
        sent += hr.n_verify;
    }
    assert_int_equal(sent, SVC_VERIFY_OUT_PER_SEG);
    free_leader(s);
    assert_int_equal(r.n, SVC_VERIFY_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_master_verify_match_mismatch_error),
        cmocka_unit_test(test_master_verify_unanswered_lost_reset),
        cmocka_unit_test(test_master_verify_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
