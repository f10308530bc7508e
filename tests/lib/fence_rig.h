/*
 * fence_rig.h — the set-up the FenceWriter tests share on the verbs double (test_rdma_fence_writer.c,
 * test_rdma_fence_selector.c; docs/rdma.md "FenceWriter and Fenced"): a fabric in virtual time with
 * the test's client nodes and one segment node, the segment's RDMA side over its region
 * (actors/segment/seg_rdma.h), a master FSM with that segment mounted, the leader's fence record
 * (actors/master/service/fence_track.h) and the segment's last fence answer. The tests drive the
 * heartbeats and the leader's timers themselves; the rig gives the steps each of them repeats.
 *
 * Only with libibverbs (KVP_HAVE_VERBS). The helpers assert with cmocka: call them from cmocka
 * tests only. Virtual time: nothing sleeps.
 */
#ifndef KVP_TESTS_LIB_FENCE_RIG_H
#define KVP_TESTS_LIB_FENCE_RIG_H

#include <stdbool.h>
#include <stdint.h>

#include "actors/master/fsm/fsm.h"
#include "actors/master/service/fence_track.h"
#include "actors/segment/seg_rdma.h"
#include "actors/transfer/rdma/rdma_xport_internal.h"
#include "tests/lib/fakeverbs.h"
#include "wire/envelope.h"

#define FENCE_RIG_MS 1000000ull
#define FENCE_RIG_US 1000ull
#define FENCE_RIG_WALL0 1700000000000ull /* wall ms at virtual time 0 */

struct fence_rig {
    struct fv_fabric *f;
    struct fv_node *ns;            /* the segment's node */
    struct kvp_rdma_env env;       /* the fabric's clock, for the rdma code of both sides */
    struct kvp_seg_rdma *sr;       /* the segment's RDMA side */
    struct kvp_master_fsm *fsm;
    struct kvp_fence_track track;  /* the leader's record */
    struct kvp_seg_fence_ack ack;  /* the segment's last fence answer */
    uint8_t *seg;                  /* the region (seg_len bytes, 4 KiB aligned, filled 0x5a) */
    uint64_t seg_len;
    uint32_t seg_id;
};

/* A splitmix64 step (the tests' own randomness, apart from the double's). */
uint64_t fence_rig_mix(uint64_t *s);
/* n seeds, times KVP_RDMA_SEED_SCALE when set (a longer run by hand). */
uint64_t fence_rig_seeds(uint64_t n);
/* Wall ms now (FENCE_RIG_WALL0 at virtual time 0). */
uint64_t fence_rig_wall(const struct fence_rig *r);

/* Zero r; a fabric seeded with `seed` (per-packet jitter 1 ns .. 30 µs), the n client nodes of
 * `clients` (their handles in nodes[i]) and then the segment's node, named "segment". */
void fence_rig_fabric(struct fence_rig *r, uint64_t seed, const struct fv_node_config *clients, int n,
                      struct fv_node **nodes);
/* The segment: its region of seg_len bytes, its RDMA side (PSNs from seed), an FSM
 * (fence_grace_ms grace_ms, put ttl 30 s) with it mounted as "seg-a" on "host-a", the id set. */
void fence_rig_segment(struct fence_rig *r, uint64_t seed, uint64_t seg_len, uint64_t grace_ms);
/* Close what fence_rig_fabric and fence_rig_segment made (after the test's clients). */
void fence_rig_down(struct fence_rig *r);

/* A client endpoint of writer `writer_id` on transport x toward the segment: the RdmaHello
 * offer, the segment's accept, the answer applied. */
void fence_rig_connect(struct fence_rig *r, struct kvp_rdma_xport *x, uint64_t writer_id, struct kvp_rdma_ep **ep);

/* PutStart of one object (1 replica, op_id op, ttl_ms) now; *st its status, the offset (or
 * UINT64_MAX when not KVP_OK). */
uint64_t fence_rig_put_start(struct fence_rig *r, const char *key, uint64_t size, uint64_t op, uint64_t ttl_ms, int *st);

/* The segment's heartbeat as the leader decodes it (seg_heartbeat.c's fill, through the codec);
 * asserts that the segment says fence_selectors, and with `older` clears it (a segment built
 * before the flag). Free with kvp__request__free_unpacked. */
Kvp__Request *fence_rig_heartbeat(struct fence_rig *r, bool older);
/* The leader's FenceWriter (seq; seq 0: none) naming the n selectors sel (n 0: every writer),
 * through the segment's half. True when the segment ran a fence. */
bool fence_rig_fence_writer(struct fence_rig *r, uint64_t seq, const struct kvp_fence_sel *sel, uint32_t n);

#endif
