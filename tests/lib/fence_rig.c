/* fence_rig.c — see fence_rig.h. Built only with KVP_HAVE_VERBS (as the verbs double). */
#ifdef KVP_HAVE_VERBS
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "tests/lib/fence_rig.h"
#include "tests/unit/test_fsm_helpers.h"

uint64_t fence_rig_mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t fence_rig_seeds(uint64_t n)
{
    const char *e = getenv("KVP_RDMA_SEED_SCALE");
    long k = e ? atol(e) : 1;
    return n * (uint64_t)(k > 0 ? k : 1);
}

uint64_t fence_rig_wall(const struct fence_rig *r) { return FENCE_RIG_WALL0 + fv_now(r->f) / FENCE_RIG_MS; }

static uint64_t rig_now(void *a) { return fv_now(((struct fence_rig *)a)->f); }
static void rig_wait(void *a, uint64_t ns) { fv_advance(((struct fence_rig *)a)->f, ns ? ns : FENCE_RIG_US); }

void fence_rig_fabric(struct fence_rig *r, uint64_t seed, const struct fv_node_config *clients, int n,
                      struct fv_node **nodes)
{
    memset(r, 0, sizeof *r);
    struct fv_config fc = {.seed = seed, .jitter_ns = 1 + seed % (30 * FENCE_RIG_US)};
    assert_int_equal(fv_fabric_new(&r->f, &fc), KVP_OK);
    for (int i = 0; i < n; i++)
        assert_int_equal(fv_node_add(r->f, &clients[i], &nodes[i]), KVP_OK);
    struct fv_node_config sc = {.name = "segment", .n_devices = 1};
    assert_int_equal(fv_node_add(r->f, &sc, &r->ns), KVP_OK);
    r->env = (struct kvp_rdma_env){.now_ns = rig_now, .wait = rig_wait, .arg = r};
}

void fence_rig_segment(struct fence_rig *r, uint64_t seed, uint64_t seg_len, uint64_t grace_ms)
{
    r->seg_len = seg_len;
    r->seg = aligned_alloc(4096, seg_len);
    assert_non_null(r->seg);
    memset(r->seg, 0x5a, seg_len);
    struct kvp_seg_rdma_cfg scfg = {.who = "segment", .ops = fv_node_ops(r->ns), .env = &r->env,
                                    .gid_index = -1, .psn_seed = seed * 3 + 1, .sysfs_root = "/nonexistent"};
    assert_int_equal(kvp_seg_rdma_open(&r->sr, &scfg, r->seg, seg_len), KVP_OK);
    r->fsm = tf_new(grace_ms, 30000);
    assert_int_equal(tf_mount(r->fsm, "seg-a", "host-a", seg_len, fence_rig_wall(r), &r->seg_id), KVP_OK);
    kvp_seg_rdma_set_id(r->sr, r->seg_id);
}

void fence_rig_down(struct fence_rig *r)
{
    kvp_seg_rdma_close(&r->sr);
    fv_fabric_destroy(&r->f);
    kvp_master_fsm_destroy(&r->fsm);
    kvp_fence_track_fini(&r->track);
    free(r->seg);
    r->seg = NULL;
}

void fence_rig_connect(struct fence_rig *r, struct kvp_rdma_xport *x, uint64_t writer_id, struct kvp_rdma_ep **ep)
{
    uint8_t *offer = NULL, *ans = NULL;
    size_t ol = 0, al = 0;
    assert_int_equal(kvp_rdma_ep_offer(x, r->seg_id, writer_id, NULL, ep, &offer, &ol), KVP_OK);
    assert_int_equal(kvp_seg_rdma_accept(r->sr, offer, ol, &ans, &al), KVP_OK);
    assert_int_equal(kvp_rdma_ep_complete(*ep, ans, al), KVP_OK);
    free(offer);
    free(ans);
}

uint64_t fence_rig_put_start(struct fence_rig *r, const char *key, uint64_t size, uint64_t op, uint64_t ttl_ms, int *st)
{
    struct tf_put p = {.key = key, .size = size, .replica_num = 1, .op_id = op};
    Kvp__Response *rp = tf_put_start_r(r->fsm, &p, fence_rig_wall(r), ttl_ms, st);
    uint64_t off = *st == KVP_OK ? rp->put_start->results[0]->replicas[0]->offset : UINT64_MAX;
    kvp_master_fsm_response_free(rp);
    return off;
}

Kvp__Request *fence_rig_heartbeat(struct fence_rig *r, bool older)
{
    Kvp__Request rq = KVP__REQUEST__INIT;
    Kvp__HeartbeatReq hb = KVP__HEARTBEAT_REQ__INIT;
    Kvp__Fenced fd;
    hb.segment_id = r->seg_id;
    kvp_seg_rdma_hb_fill(r->sr != NULL, &r->ack, &hb, &fd);
    assert_true(hb.fence_selectors);
    if (older)
        hb.fence_selectors = 0; /* as a segment built before the flag */
    rq.body_case = KVP__REQUEST__BODY_HEARTBEAT;
    rq.heartbeat = &hb;
    uint8_t *b = NULL;
    size_t l = 0;
    assert_int_equal(kvp_wire_encode_request(&rq, &b, &l), KVP_OK);
    Kvp__Request *d = NULL;
    assert_int_equal(kvp_wire_decode_request(b, l, &d), KVP_OK);
    free(b);
    return d;
}

bool fence_rig_fence_writer(struct fence_rig *r, uint64_t seq, const struct kvp_fence_sel *sel, uint32_t n)
{
    Kvp__FenceWriter fw = KVP__FENCE_WRITER__INIT;
    Kvp__WriterSelector ws[KVP_FENCE_SELECTORS_MAX], *wp[KVP_FENCE_SELECTORS_MAX];
    assert_true(n <= KVP_FENCE_SELECTORS_MAX);
    fw.seq = seq;
    for (uint32_t i = 0; i < n; i++) {
        kvp__writer_selector__init(&ws[i]);
        ws[i].client_id = sel[i].client_id;
        ws[i].mask = sel[i].mask;
        wp[i] = &ws[i];
    }
    fw.n_writers = n;
    fw.writers = n ? wp : NULL;
    return kvp_seg_rdma_on_fence_writer(r->sr, seq ? &fw : NULL, &r->ack);
}
#endif
