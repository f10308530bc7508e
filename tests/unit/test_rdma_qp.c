/*
 * test_rdma_qp.c — RC QP bring-up with kvpool's attributes and RoCE v2 GID selection
 * (actors/transfer/rdma/rdma_qp.h) against the verbs test double: the selection rules and the
 * override, "no suitable GID", RESET→RTS with random PSNs over many seeds on RoCE and
 * InfiniBand (then data moves), the handshake values checked, a failing modify, and a PSN
 * mismatch that the responder never accepts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "actors/transfer/rdma/rdma_qp.h"
#include "kvpool.h"
#include "runtime/log.h"
#include "tests/lib/fakeverbs.h"
#include "tests/lib/fv_conn.h"

#define MS 1000000ull

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct side {
    struct fv_node *n;
    struct fv_end e;
    int gid_index;
    union ibv_gid gid;
    struct ibv_qp *qp;
};

static void side_up(struct fv_fabric *f, struct side *s, uint8_t link_layer, bool no_rocev2)
{
    memset(s, 0, sizeof *s);
    struct fv_node_config c = {.n_devices = 1, .link_layer = link_layer, .no_rocev2 = no_rocev2};
    assert_int_equal(fv_node_add(f, &c, &s->n), KVP_OK);
    assert_int_equal(fv_end_open(fv_node_ops(s->n), 0, 64, &s->e), 0);
}

static void test_rdma_gid_select_rules(void **state)
{
    (void)state;
    struct fv_fabric *f;
    assert_int_equal(fv_fabric_new(&f, NULL), KVP_OK);
    struct side roce, v1only, ib;
    side_up(f, &roce, IBV_LINK_LAYER_ETHERNET, false);
    side_up(f, &v1only, IBV_LINK_LAYER_ETHERNET, true);
    side_up(f, &ib, IBV_LINK_LAYER_INFINIBAND, false);
    int idx;
    union ibv_gid g;
    /* auto: the RoCE v2 entry with an IPv4-mapped address (index 3), not the link-local v2 */
    assert_int_equal(kvp_rdma_gid_select(roce.e.ops, roce.e.ctx, 1, -1, &idx, &g), KVP_OK);
    assert_int_equal(idx, 3);
    assert_int_equal(g.raw[10], 0xff);
    assert_int_equal(g.raw[12], 10);
    /* override */
    assert_int_equal(kvp_rdma_gid_select(roce.e.ops, roce.e.ctx, 1, 1, &idx, &g), KVP_OK);
    assert_int_equal(idx, 1);
    assert_int_equal(g.raw[0], 0xfe);
    assert_int_equal(kvp_rdma_gid_select(roce.e.ops, roce.e.ctx, 1, 9, &idx, &g),
                     KVP_ERR_UNSUPPORTED);
    /* no RoCE v2 entry at all: "No suitable GID"; an empty entry as override too */
    assert_int_equal(kvp_rdma_gid_select(v1only.e.ops, v1only.e.ctx, 1, -1, &idx, &g),
                     KVP_ERR_UNSUPPORTED);
    assert_int_equal(kvp_rdma_gid_select(v1only.e.ops, v1only.e.ctx, 1, 3, &idx, &g),
                     KVP_ERR_UNSUPPORTED);
    assert_int_equal(kvp_rdma_gid_select(v1only.e.ops, v1only.e.ctx, 1, 2, &idx, &g), KVP_OK);
    /* InfiniBand: no GRH */
    assert_int_equal(kvp_rdma_gid_select(ib.e.ops, ib.e.ctx, 1, -1, &idx, &g), KVP_OK);
    assert_int_equal(idx, -1);
    assert_int_equal(kvp_rdma_gid_select(roce.e.ops, roce.e.ctx, 2, -1, &idx, &g), KVP_ERR_IO);
    assert_int_equal(kvp_rdma_gid_select(NULL, roce.e.ctx, 1, -1, &idx, &g), KVP_ERR_INVALID);
    fv_fabric_destroy(&f);
}

/* Both sides: select a GID, create a QP, exchange kvp_rdma_peer, bring up to RTS. */
static int connect_pair(struct side *a, struct side *b, uint32_t psn_a, uint32_t psn_b,
                        uint32_t psn_b_told)
{
    struct kvp_rdma_qp_attrs at;
    kvp_rdma_qp_attrs_default(&at);
    struct side *s[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(kvp_rdma_gid_select(s[i]->e.ops, s[i]->e.ctx, 1, -1, &s[i]->gid_index,
                                             &s[i]->gid), KVP_OK);
        assert_int_equal(kvp_rdma_qp_create(s[i]->e.ops, s[i]->e.pd, s[i]->e.cq, &at, &s[i]->qp),
                         KVP_OK);
    }
    struct kvp_rdma_peer pa = {.gid = a->gid, .lid = a->e.lid, .qpn = a->qp->qp_num, .psn = psn_a,
                               .mtu = IBV_MTU_4096, .max_rd_atomic = 16};
    struct kvp_rdma_peer pb = {.gid = b->gid, .lid = b->e.lid, .qpn = b->qp->qp_num,
                               .psn = psn_b_told, .mtu = IBV_MTU_4096, .max_rd_atomic = 16};
    struct kvp_rdma_local la = {.ctx = a->e.ctx, .port = 1, .gid_index = a->gid_index,
                                .psn = psn_a, .access = 0};
    struct kvp_rdma_local lb = {.ctx = b->e.ctx, .port = 1, .gid_index = b->gid_index,
                                .psn = psn_b,
                                .access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE};
    int rc = kvp_rdma_qp_to_rts(a->e.ops, a->qp, &la, &pb, &at);
    if (rc == KVP_OK)
        rc = kvp_rdma_qp_to_rts(b->e.ops, b->qp, &lb, &pa, &at);
    return rc;
}

static void test_rdma_qp_connect_random_psns_data_moves_many_seeds(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 200; seed++) {
        uint64_t rng = seed;
        struct fv_config fc = {.seed = seed};
        struct fv_fabric *f;
        assert_int_equal(fv_fabric_new(&f, &fc), KVP_OK);
        uint8_t ll = seed % 2 ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
        struct side a, b;
        side_up(f, &a, ll, false);
        side_up(f, &b, ll, false);
        uint32_t pa = (uint32_t)mix(&rng) & 0xffffff, pb = (uint32_t)mix(&rng) & 0xffffff;
        assert_int_equal(connect_pair(&a, &b, pa, pb, pb), KVP_OK);
        struct ibv_qp_attr q;
        struct ibv_qp_init_attr qi;
        assert_int_equal(a.e.ops->query_qp(a.qp, &q, IBV_QP_STATE, &qi), 0);
        assert_int_equal(q.qp_state, IBV_QPS_RTS);
        assert_int_equal(q.timeout, 14);
        assert_int_equal(q.retry_cnt, 7);
        assert_int_equal(q.rnr_retry, 6);
        assert_int_equal(q.path_mtu, IBV_MTU_4096);
        assert_int_equal(q.dest_qp_num, b.qp->qp_num);
        assert_int_equal(q.rq_psn, pb);
        assert_int_equal(qi.cap.max_send_wr, 256);
        assert_int_equal(qi.sq_sig_all, 0);
        static uint8_t src[9000], dst[9000], seg[9000];
        memset(src, (int)seed, sizeof src);
        struct ibv_mr *ms = a.e.ops->reg_mr(a.e.pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
        struct ibv_mr *md = a.e.ops->reg_mr(a.e.pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE);
        struct ibv_mr *mg = b.e.ops->reg_mr(b.e.pd, seg, sizeof seg, IBV_ACCESS_LOCAL_WRITE |
                                                IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
        struct ibv_send_wr wr, *bad;
        struct ibv_sge sge;
        fv_wr(&wr, &sge, IBV_WR_RDMA_WRITE, 1, src, sizeof src, ms->lkey,
              (uint64_t)(uintptr_t)seg, mg->rkey);
        assert_int_equal(a.e.ops->post_send(a.qp, &wr, &bad), 0);
        fv_wr(&wr, &sge, IBV_WR_RDMA_READ, 2, dst, sizeof dst, md->lkey, (uint64_t)(uintptr_t)seg,
              mg->rkey);
        assert_int_equal(a.e.ops->post_send(a.qp, &wr, &bad), 0);
        fv_run_idle(f, 10 * MS);
        struct ibv_wc wc[2];
        assert_int_equal(a.e.ops->poll_cq(a.e.cq, 2, wc), 2);
        assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
        assert_int_equal(wc[1].status, IBV_WC_SUCCESS);
        assert_memory_equal(dst, src, sizeof src);
        fv_fabric_destroy(&f);
    }
}

/* A peer told us the wrong start PSN (a stale or forged handshake): the responder accepts none
 * of our packets and the WR ends in RETRY_EXC_ERR. */
static void test_rdma_qp_psn_mismatch_never_accepted(void **state)
{
    (void)state;
    struct fv_fabric *f;
    assert_int_equal(fv_fabric_new(&f, NULL), KVP_OK);
    struct side a, b;
    side_up(f, &a, IBV_LINK_LAYER_ETHERNET, false);
    side_up(f, &b, IBV_LINK_LAYER_ETHERNET, false);
    /* b expects a's PSN 100, a starts at 5000 (b's side of the exchange was stale) */
    struct kvp_rdma_qp_attrs at;
    kvp_rdma_qp_attrs_default(&at);
    for (int i = 0; i < 2; i++) {
        struct side *s = i ? &b : &a;
        assert_int_equal(kvp_rdma_gid_select(s->e.ops, s->e.ctx, 1, -1, &s->gid_index, &s->gid),
                         KVP_OK);
        assert_int_equal(kvp_rdma_qp_create(s->e.ops, s->e.pd, s->e.cq, &at, &s->qp), KVP_OK);
    }
    struct kvp_rdma_peer pa = {.gid = a.gid, .qpn = a.qp->qp_num, .psn = 100, .mtu = 5,
                               .max_rd_atomic = 16};
    struct kvp_rdma_peer pb = {.gid = b.gid, .qpn = b.qp->qp_num, .psn = 7, .mtu = 5,
                               .max_rd_atomic = 16};
    struct kvp_rdma_local la = {.ctx = a.e.ctx, .port = 1, .gid_index = a.gid_index, .psn = 5000};
    struct kvp_rdma_local lb = {.ctx = b.e.ctx, .port = 1, .gid_index = b.gid_index, .psn = 7,
                                .access = IBV_ACCESS_REMOTE_WRITE};
    assert_int_equal(kvp_rdma_qp_to_rts(a.e.ops, a.qp, &la, &pb, &at), KVP_OK);
    assert_int_equal(kvp_rdma_qp_to_rts(b.e.ops, b.qp, &lb, &pa, &at), KVP_OK);
    static uint8_t src[64], seg[64];
    struct ibv_mr *ms = a.e.ops->reg_mr(a.e.pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *mg = b.e.ops->reg_mr(b.e.pd, seg, sizeof seg,
                                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    struct ibv_send_wr wr, *bad;
    struct ibv_sge sge;
    fv_wr(&wr, &sge, IBV_WR_RDMA_WRITE, 1, src, 64, ms->lkey, (uint64_t)(uintptr_t)seg, mg->rkey);
    assert_int_equal(a.e.ops->post_send(a.qp, &wr, &bad), 0);
    fv_run_idle(f, 2000 * MS);
    struct ibv_wc wc;
    assert_int_equal(a.e.ops->poll_cq(a.e.cq, 1, &wc), 1);
    assert_int_equal(wc.status, IBV_WC_RETRY_EXC_ERR);
    assert_int_equal(fv_audit_count(f), 0);
    fv_fabric_destroy(&f);
}

static void test_rdma_qp_bad_handshake_values_invalid(void **state)
{
    (void)state;
    struct fv_fabric *f;
    assert_int_equal(fv_fabric_new(&f, NULL), KVP_OK);
    struct side a;
    side_up(f, &a, IBV_LINK_LAYER_ETHERNET, false);
    struct kvp_rdma_qp_attrs at;
    kvp_rdma_qp_attrs_default(&at);
    assert_int_equal(kvp_rdma_gid_select(a.e.ops, a.e.ctx, 1, -1, &a.gid_index, &a.gid), KVP_OK);
    assert_int_equal(kvp_rdma_qp_create(a.e.ops, a.e.pd, a.e.cq, &at, &a.qp), KVP_OK);
    struct kvp_rdma_local la = {.ctx = a.e.ctx, .port = 1, .gid_index = a.gid_index, .psn = 1};
    struct kvp_rdma_peer good = {.gid = a.gid, .qpn = 77, .psn = 5, .mtu = 5, .max_rd_atomic = 16};
    struct kvp_rdma_peer p;
    p = good, p.qpn = 0;
    assert_int_equal(kvp_rdma_qp_to_rts(a.e.ops, a.qp, &la, &p, &at), KVP_ERR_INVALID);
    p = good, p.qpn = 1u << 24;
    assert_int_equal(kvp_rdma_qp_to_rts(a.e.ops, a.qp, &la, &p, &at), KVP_ERR_INVALID);
    p = good, p.psn = 1u << 24;
    assert_int_equal(kvp_rdma_qp_to_rts(a.e.ops, a.qp, &la, &p, &at), KVP_ERR_INVALID);
    p = good, p.mtu = 0;
    assert_int_equal(kvp_rdma_qp_to_rts(a.e.ops, a.qp, &la, &p, &at), KVP_ERR_INVALID);
    p = good, p.mtu = 6;
    assert_int_equal(kvp_rdma_qp_to_rts(a.e.ops, a.qp, &la, &p, &at), KVP_ERR_INVALID);
    p = good, p.max_rd_atomic = 17;
    assert_int_equal(kvp_rdma_qp_to_rts(a.e.ops, a.qp, &la, &p, &at), KVP_ERR_INVALID);
    struct kvp_rdma_qp_attrs z = at;
    z.timeout = 0; /* never: the ACK timer would be off */
    assert_int_equal(kvp_rdma_qp_to_rts(a.e.ops, a.qp, &la, &good, &z), KVP_ERR_INVALID);
    struct kvp_rdma_local nogid = la;
    nogid.gid_index = -1; /* RoCE needs one */
    assert_int_equal(kvp_rdma_qp_to_rts(a.e.ops, a.qp, &nogid, &good, &at), KVP_ERR_INVALID);
    assert_int_equal(fv_qp_state(a.qp), IBV_QPS_RESET); /* nothing was applied */
    fv_node_fail_next(a.n, FV_OP_MODIFY, EIO);
    assert_int_equal(kvp_rdma_qp_to_rts(a.e.ops, a.qp, &la, &good, &at), KVP_ERR_IO);
    assert_int_equal(kvp_rdma_qp_to_rts(a.e.ops, a.qp, &la, &good, &at), KVP_OK);
    struct ibv_qp *q2;
    struct kvp_rdma_qp_attrs big = at;
    big.max_inline = 4096; /* beyond what the device allows */
    assert_int_equal(kvp_rdma_qp_create(a.e.ops, a.e.pd, a.e.cq, &big, &q2), KVP_ERR_IO);
    big = at, big.max_send_wr = 0;
    assert_int_equal(kvp_rdma_qp_create(a.e.ops, a.e.pd, a.e.cq, &big, &q2), KVP_ERR_INVALID);
    fv_fabric_destroy(&f);
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rdma_gid_select_rules),
        cmocka_unit_test(test_rdma_qp_connect_random_psns_data_moves_many_seeds),
        cmocka_unit_test(test_rdma_qp_psn_mismatch_never_accepted),
        cmocka_unit_test(test_rdma_qp_bad_handshake_values_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
