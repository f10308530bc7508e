/*
 * test_xfer_rdma_e2e.c — the rdma transport end to end in one process over the verbs double: a
 * real segment data-plane server (kvp_seg_server with kvp_seg_server_rdma: region registered at
 * mount, RdmaHello answered as a KVP_FRAME_RDMA_HELLO request on its TCP port) and a transfer
 * engine driving kvp_xport_rdma whose handshake goes over that TCP port (kvp_rdma_hello_tcp).
 * The double is shared by two threads (the server's loop, the engine's transfer actor) through
 * tests/lib/fakeverbs_locked.h.
 *
 *  - put/get: WRITE then READ patterns; the bytes are in the region and in the READ buffers, and
 *    the server's TCP counters show no READ/WRITE frame (the data went over the double's QPs).
 *  - C2 (contract, docs/fencing.md): rounds with random timeouts of 1..20 ms while the segment's
 *    NIC is paused (PFC) for random times: after the engine is gone and every packet in flight
 *    was delivered, no timed-out READ buffer (refilled with poison at return) changed, every OK
 *    READ holds the region's bytes, no WRITE placed poison in the region.
 *  - remount: a new segment id fences the old mount's QPs: the old id fails, the new one works.
 *  - remount while a handshake is forwarded: the hello lands on loop 1 and goes to loop 0 (the RDMA
 *    side's owner) by message while the mount changes, through the blocking set_id and through
 *    the actors' set_id_request: once set_id returns (or its reply came) no WRITE of the old mount
 *    places a byte in the region, whichever of the two loop 0 ran first.
 *  - FenceWriter through the segment's heartbeat actor (a kvpool segment with protocol=rdma and a
 *    scripted fake master): a WRITE held in flight by a PFC pause when the master asks for the
 *    fence places nothing in the region after the heartbeat that answers Fenced reached the
 *    master (the heartbeat waits for loop 0's fence before it sends Fenced).
 *  - tokens: a segment that requires data-plane tokens (kvp_seg_server_start_auth): the hello's own
 *    TCP connection answers the challenge through kvp_rdma_hello_tcp_opts.token_respond and the
 *    data goes over RDMA; without the callback, or with no token for this segment, the hello is
 *    refused (counted as token_refused) and the slice fails. The client's way: the engine's
 *    token_wallet, the hello signing from its transfer actor's wallet after kvp_xfer_tokens_put.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "actors/segment/seg_rdma.h"
#include "actors/segment/seg_server.h"
#include "actors/segment/segment.h"
#include "actors/segment/segment_state.h" /* the segment's server (seg->srv): its loop 0's queries */
#include "actors/session/msession.h"
#include "config/config.h"
#include "actors/transfer/rdma/rdma_xport_internal.h"
#include "actors/transfer/rdma/xport_rdma.h"
#include "actors/transfer/transfer.h"
#include "auth/auth_token.h"
#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "tests/lib/fakeverbs.h"
#include "tests/lib/fakeverbs_locked.h"
#include "tests/actor/seg_fake_master.h"
#include "tests/actor/seg_raw_client.h"
#include "wire/rdma_hello.h"

#define POISON 0xA5
#define SEG_BYTES (256 * 1024)
#define MS 1000000ull

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

struct rig {
    struct fv_fabric *f;
    struct fv_node *nc, *ns;
    struct kvp_rdma_env env;
    struct kvp_seg_server *srv;
    uint8_t *region;
    char ep[64];
    struct kvp_xport_rdma_opts o;
    struct kvp_rdma_hello_tcp_opts ho;
    struct kvp_xfer_engine *e;
};

/* The engine's rdma_reprobe_ms for the next rig_up (0: the default). */
static uint32_t rig_reprobe_ms;
/* The engine's token_wallet for the next rig_up (NULL: none). */
static const struct kvp_dt_wallet *rig_token_wallet;

/* rig_up_auth: token_pk non-NULL: the segment requires tokens signed by that key. */
static void rig_up_auth(struct rig *g, unsigned seed, int flush, const uint8_t *token_pk);

static void rig_up(struct rig *g, unsigned seed, int flush)
{
    rig_up_auth(g, seed, flush, NULL);
}

static void rig_up_auth(struct rig *g, unsigned seed, int flush, const uint8_t *token_pk)
{
    memset(g, 0, sizeof *g);
    struct fv_config fc = {.seed = seed, .jitter_ns = 2 * MS};
    assert_int_equal(fv_fabric_new(&g->f, &fc), KVP_OK);
    struct fv_node_config cc = {.name = "client", .n_devices = 1, .flush = flush};
    struct fv_node_config sc = {.name = "segment", .n_devices = 1};
    assert_int_equal(fv_node_add(g->f, &cc, &g->nc), KVP_OK);
    assert_int_equal(fv_node_add(g->f, &sc, &g->ns), KVP_OK);
    g->env = fv_locked_env(g->f);
    g->region = aligned_alloc(4096, SEG_BYTES);
    for (size_t i = 0; i < SEG_BYTES; i++)
        g->region[i] = (uint8_t)(i * 31 + 7) == POISON ? 0 : (uint8_t)(i * 31 + 7);
    assert_int_equal(kvp_seg_server_start_auth(&g->srv, "127.0.0.1", 0, g->region, SEG_BYTES,
                                               (const uint8_t(*)[32])token_pk, token_pk ? 1 : 0),
                     KVP_OK);
    kvp_seg_server_set_id(g->srv, 5);
    struct kvp_seg_rdma_cfg rc = {.who = "seg-e2e", .ops = fv_locked_ops(g->ns), .env = &g->env,
                                  .sysfs_root = "/nonexistent", .gid_index = -1, .psn_seed = seed + 1};
    assert_int_equal(kvp_seg_server_rdma(g->srv, &rc), KVP_OK);
    snprintf(g->ep, sizeof g->ep, "127.0.0.1:%u", kvp_seg_server_port(g->srv));
    g->ho.timeout_ms = 2000;
    g->o = (struct kvp_xport_rdma_opts){
        .cfg = {.ops = fv_locked_ops(g->nc), .gid_index = -1, .psn_seed = seed * 3 + 1,
                .sysfs_root = "/nonexistent"},
        .env = g->env, .client_id = 9, .hello = kvp_rdma_hello_tcp, .hello_arg = &g->ho,
        .drive_clock = true};
    struct kvp_xfer_params p = {.conns_per_peer = 2, .slice_bytes = 64 * 1024, .fence_bound_ms = 200,
                                .transport = &kvp_xport_rdma, .transport_opts = &g->o,
                                .rdma_reprobe_ms = rig_reprobe_ms, .token_wallet = rig_token_wallet};
    assert_int_equal(kvp_xfer_engine_new(&g->e, &p), KVP_OK);
}

static void rig_down(struct rig *g)
{
    kvp_xfer_engine_destroy(&g->e);
    kvp_seg_server_stop(&g->srv); /* fences the writers, deregisters the region */
    fv_locked_reset();
    fv_fabric_destroy(&g->f);
    free(g->region);
}

static void tcp_frames_none(struct rig *g)
{
    struct kvp_seg_server_stats st;
    kvp_seg_server_stats(g->srv, &st);
    for (int o = 0; o < 2; o++) /* read, write: no data-plane frame took the TCP path */
        for (int r = 0; r < KVP_SEG_RESULTS; r++)
            assert_int_equal(st.requests[o][r], 0);
    assert_int_equal(st.bytes_read + st.bytes_written, 0);
    assert_int_equal(st.bad_frames, 0);
}

static void test_rdma_e2e_put_get_over_segment_server(void **state)
{
    (void)state;
    struct rig g;
    rig_up(&g, 1, FV_FLUSH_ALL);
    enum { N = 8, LEN = 20000, CAP = 20480 };
    uint8_t *w[N], *r[N];
    struct kvp_xfer_slice s[N];
    for (int i = 0; i < N; i++) {
        w[i] = aligned_alloc(4096, CAP);
        r[i] = aligned_alloc(4096, CAP);
        memset(r[i], 0, CAP);
        for (int j = 0; j < LEN; j++)
            w[i][j] = (uint8_t)(i * 17 + j * 13 + 1);
        /* odd i: registered with the transport (kvp_register_buffer's path): the double places
         * READ responses straight into them; even i: staged through the bounce pool */
        if (i % 2) {
            assert_int_equal(kvp_xfer_mem_register(g.e, w[i], CAP), KVP_OK);
            assert_int_equal(kvp_xfer_mem_register(g.e, r[i], CAP), KVP_OK);
        }
        s[i] = (struct kvp_xfer_slice){.local = w[i], .length = LEN, .segment_id = 5, .endpoint = g.ep,
                                       .remote_offset = (uint64_t)i * 30000, .op = KVP_XFER_WRITE};
    }
    assert_int_equal(kvp_xfer_run(g.e, s, N, 5000), KVP_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(s[i].status, KVP_OK);
        assert_memory_equal(g.region + (size_t)i * 30000, w[i], LEN);
        s[i].local = r[i];
        s[i].op = KVP_XFER_READ;
    }
    assert_int_equal(kvp_xfer_run(g.e, s, N, 5000), KVP_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(s[i].status, KVP_OK);
        assert_memory_equal(r[i], w[i], LEN);
        fv_lock();
        size_t direct = fv_audit_placed_after(g.f, r[i], LEN, 0, NULL);
        fv_unlock();
        if (i % 2) {
            assert_true(direct > 0);
            assert_int_equal(kvp_xfer_mem_unregister(g.e, w[i], CAP), KVP_OK);
            assert_int_equal(kvp_xfer_mem_unregister(g.e, r[i], CAP), KVP_OK);
        } else {
            assert_int_equal(direct, 0);
        }
        free(w[i]);
        free(r[i]);
    }
    tcp_frames_none(&g);
    struct fv_stats fs;
    fv_lock();
    fv_stats_get(g.f, &fs);
    fv_unlock();
    assert_true(fs.packets > 0);
    rig_down(&g);
}

static void rounds(uint8_t op, int n_rounds, unsigned seed, int flush)
{
    struct rig g;
    rig_up(&g, seed, flush);
    if (op == KVP_XFER_WRITE)
        memset(g.region, 0, SEG_BYTES);
    uint8_t **kept = calloc((size_t)n_rounds * 16, sizeof *kept);
    uint64_t *klen = calloc((size_t)n_rounds * 16, sizeof *klen);
    size_t n_kept = 0, n_ok = 0, n_bad = 0;
    unsigned rs = seed;
    for (int round = 0; round < n_rounds; round++) {
        size_t n = 1 + (size_t)(rand_r(&rs) % 16);
        struct kvp_xfer_slice s[16];
        uint8_t *bufs[16];
        for (size_t i = 0; i < n; i++) {
            uint64_t len = 1 + (uint64_t)(rand_r(&rs) % (32 * 1024));
            bufs[i] = malloc(len);
            memset(bufs[i], op == KVP_XFER_WRITE ? 0x10 + round % 64 : 0, len);
            s[i] = (struct kvp_xfer_slice){.local = bufs[i], .length = len, .segment_id = 5,
                                           .endpoint = g.ep, .op = op,
                                           .remote_offset = (uint64_t)(rand_r(&rs) % (SEG_BYTES - 32 * 1024))};
        }
        /* the segment's NIC stops answering for 0..15 ms of virtual time (PFC pause) */
        uint64_t pause = (uint64_t)(rand_r(&rs) % 16) * MS;
        fv_lock();
        fv_node_pause(g.ns, pause);
        fv_unlock();
        (void)kvp_xfer_run(g.e, s, n, 1 + (uint32_t)(rand_r(&rs) % 20));
        for (size_t i = 0; i < n; i++) {
            if (s[i].status == KVP_OK) {
                n_ok++;
                if (op == KVP_XFER_READ)
                    assert_memory_equal(bufs[i], g.region + s[i].remote_offset, s[i].length);
                free(bufs[i]);
                continue;
            }
            assert_true(s[i].status == KVP_ERR_TIMEOUT || s[i].status == KVP_ERR_TRANSFER ||
                        s[i].status == KVP_ERR_FENCE_FAILED);
            n_bad++;
            memset(bufs[i], POISON, s[i].length); /* the caller reuses its memory at once */
            kept[n_kept] = bufs[i];
            klen[n_kept++] = s[i].length;
        }
    }
    kvp_xfer_engine_destroy(&g.e);
    fv_lock();
    fv_run_idle(g.f, 5000 * MS); /* every packet still in flight arrives now */
    fv_unlock();
    for (size_t k = 0; k < n_kept; k++) {
        for (uint64_t i = 0; i < klen[k]; i++)
            if (kept[k][i] != POISON)
                fail_msg("seed %u: byte %llu of a fenced buffer changed after its call returned", seed,
                         (unsigned long long)i);
        free(kept[k]);
    }
    if (op == KVP_XFER_WRITE)
        for (size_t i = 0; i < SEG_BYTES; i++)
            if (g.region[i] == POISON)
                fail_msg("seed %u: region byte %zu holds poison: a WRITE read caller memory after "
                         "its call returned", seed, i);
    fprintf(stderr, "seed %u %s flush %d: %zu ok, %zu timed out/failed\n", seed,
            op == KVP_XFER_READ ? "READ" : "WRITE", flush, n_ok, n_bad);
    assert_true(n_ok > 0);
    assert_true(n_bad > 0); /* the scenario is real */
    tcp_frames_none(&g);
    free(kept);
    free(klen);
    rig_down(&g);
}

static void test_rdma_e2e_timed_out_reads_never_land(void **state)
{
    (void)state;
    rounds(KVP_XFER_READ, 40, 3, FV_FLUSH_ALL);
    rounds(KVP_XFER_READ, 40, 4, FV_FLUSH_NOT_LATE);
}

static void test_rdma_e2e_timed_out_writes_never_read_late(void **state)
{
    (void)state;
    rounds(KVP_XFER_WRITE, 40, 13, FV_FLUSH_ALL);
}

static void test_rdma_e2e_remount_fences_old_qps(void **state)
{
    (void)state;
    struct rig g;
    rig_up(&g, 7, FV_FLUSH_ALL);
    uint8_t buf[4096];
    struct kvp_xfer_slice s = {.local = buf, .length = sizeof buf, .segment_id = 5, .endpoint = g.ep,
                               .remote_offset = 8192, .op = KVP_XFER_READ};
    assert_int_equal(kvp_xfer_run(g.e, &s, 1, 5000), KVP_OK);
    assert_memory_equal(buf, g.region + 8192, sizeof buf);
    kvp_seg_server_set_id(g.srv, 6); /* a new mount: the space may be reused */
    memset(buf, 0, sizeof buf);
    s.status = 0;
    (void)kvp_xfer_run(g.e, &s, 1, 2000);
    assert_int_not_equal(s.status, KVP_OK); /* the old id's QPs are gone; a new offer is refused */
    assert_true(all_zero(buf, sizeof buf));
    s.segment_id = 6;
    s.status = 0;
    assert_int_equal(kvp_xfer_run(g.e, &s, 1, 5000), KVP_OK);
    assert_memory_equal(buf, g.region + 8192, sizeof buf);
    tcp_frames_none(&g);
    rig_down(&g);
}

/* A WRITE of poison to the old mount (id 5), run by a thread while the test changes the mount. */
struct fwd_writer {
    struct rig *g;
    uint8_t *buf;
    struct kvp_xfer_slice s;
};

static void *fwd_writer_run(void *arg)
{
    struct fwd_writer *w = arg;
    (void)kvp_xfer_run(w->g->e, &w->s, 1, 2000);
    return NULL;
}

/* A manual actor playing the segment's heartbeat: asks loop 0 for a mount change by request and
 * notes when the reply came (the heartbeat then sends its MountSegment). */
struct fwd_hb {
    struct kvp_seg_server *srv;
    uint64_t corr;
    int status; /* 1: not yet answered */
};

static int fwd_hb_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct fwd_hb *h = kvp_rt_state(ctx);
    if (msg->kind == KVP_RT_SEND)
        return kvp_seg_server_set_id_request(ctx, h->srv, (uint32_t)msg->arg, &h->corr);
    if (msg->kind == KVP_RT_REPLY && msg->corr_id == h->corr)
        h->status = msg->status;
    return KVP_OK;
}

static uint64_t hellos_forwarded(struct kvp_seg_server *srv)
{
    struct kvp_seg_server_stats st;
    kvp_seg_server_stats(srv, &st);
    return st.rdma_hellos_forwarded;
}

static void nap_ms(long ms)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_rdma_e2e_remount_while_hello_forwarded_fences_old_writer(void **state)
{
    (void)state;
    enum { ROUNDS = 8, LEN = 16384 };
    unsigned seen_fwd = 0, seen_held = 0;
    for (int round = 0; round < ROUNDS; round++) {
        struct rig g;
        rig_up(&g, 40 + (unsigned)round, FV_FLUSH_ALL);
        memset(g.region, 0, SEG_BYTES);
        /* A first connection takes loop 0 (round robin from loop 0): the engine's hello then
         * comes on loop 1, which forwards it to loop 0 */
        int idle = seg_raw_connect(kvp_seg_server_port(g.srv));
        assert_true(idle >= 0);
        struct kvp_seg_server_stats st;
        for (int i = 0; i < 5000; i++) {
            kvp_seg_server_stats(g.srv, &st);
            if (st.conns_accepted >= 1)
                break;
            nap_ms(1);
        }
        assert_int_equal(st.conns_accepted, 1);
        /* odd rounds: the heartbeat's way (a request from an actor), even rounds: a plain thread */
        struct fwd_hb hb = {.srv = g.srv, .status = 1};
        struct kvp_rt_actor *a = NULL;
        if (round % 2) {
            struct kvp_rt_spec spec = {.name = "fwd-hb", .handle = fwd_hb_handle, .state = &hb};
            assert_int_equal(kvp_rt_spawn_manual(&a, &spec, NULL), KVP_OK);
        }
        /* rounds 4..7: the segment's NIC is paused (PFC) first, so the WRITE is posted on a QP
         * the hello made and held in flight when the mount changes: it must not land after */
        bool held = round >= 4;
        struct fv_stats fs0, fs;
        fv_lock();
        if (held)
            fv_node_pause(g.ns, 1500 * MS);
        fv_stats_get(g.f, &fs0);
        fv_unlock();
        struct fwd_writer w = {.g = &g, .buf = malloc(LEN)};
        memset(w.buf, POISON, LEN);
        w.s = (struct kvp_xfer_slice){.local = w.buf, .length = LEN, .segment_id = 5, .endpoint = g.ep,
                                      .remote_offset = 16384, .op = KVP_XFER_WRITE};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, fwd_writer_run, &w), 0);
        /* The mount changes as soon as the hello is on its way to loop 0 (bounded wait; the
         * change goes ahead anyway if it does not come) */
        for (int i = 0; i < 5000 && hellos_forwarded(g.srv) == 0; i++)
            nap_ms(1);
        for (int i = 0; held && i < 5000; i++) { /* held: until the WRITE's packets are out */
            fv_lock();
            fv_stats_get(g.f, &fs);
            fv_unlock();
            if (fs.packets > fs0.packets)
                break;
            nap_ms(1);
        }
        if (round % 2) {
            assert_int_equal(kvp_rt_send(a, 0, 1, 6, NULL, NULL), KVP_OK);
            for (int i = 0; i < 10000 && hb.status == 1; i++) {
                (void)kvp_rt_poll(a);
                if (hb.status == 1)
                    nap_ms(1);
            }
            assert_int_equal(hb.status, KVP_OK);
        } else {
            kvp_seg_server_set_id(g.srv, 6);
        }
        fv_lock();
        uint64_t t_fence = fv_now(g.f); /* the old mount's writers are fenced by now */
        fv_unlock();
        assert_int_equal(pthread_join(t, NULL), 0);
        kvp_xfer_engine_destroy(&g.e);
        fv_lock();
        fv_run_idle(g.f, 5000 * MS); /* every packet still in flight arrives now */
        const struct fv_dma *first = NULL;
        size_t late = fv_audit_placed_after(g.f, g.region, SEG_BYTES, t_fence, &first);
        fv_unlock();
        if (late)
            fail_msg("round %d: %zu placement(s) in the region after the remount returned", round, late);
        for (size_t i = 0; i < SEG_BYTES; i++)
            if (g.region[i] == POISON && fv_audit_placed_after(g.f, g.region + i, 1, t_fence, NULL))
                fail_msg("round %d: region byte %zu written by the old mount after the fence", round, i);
        uint64_t fwd = hellos_forwarded(g.srv);
        seen_fwd += fwd > 0;
        fv_lock();
        fv_stats_get(g.f, &fs);
        fv_unlock();
        seen_held += held && fs.dropped > fs0.dropped; /* held packets met a fenced QP */
        fprintf(stderr, "round %d (%s%s): write %s, %llu hello(s) forwarded, %llu packet(s) dropped\n",
                round, round % 2 ? "request" : "blocking", held ? ", held" : "", kvp_errname(w.s.status),
                (unsigned long long)fwd, (unsigned long long)(fs.dropped - fs0.dropped));
        kvp_rt_destroy(&a);
        close(idle);
        free(w.buf);
        rig_down(&g);
    }
    /* the scenario is real: hellos went through another loop, and WRITEs of the old mount were
     * in flight at the change */
    assert_true(seen_fwd > 0);
    assert_true(seen_held > 0);
}

/* The test's hold on a forwarded hello (kvp_seg_server_test_hold_hellos): loop 1 waits here. */
struct hello_hold {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered, go;
};

static void hello_hold_fn(void *arg)
{
    struct hello_hold *h = arg;
    pthread_mutex_lock(&h->mu);
    h->entered++;
    pthread_cond_broadcast(&h->cv);
    while (!h->go)
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
}

/* A hello read by loop 1 before a FenceWriter of every writer and run by loop 0 after the fence
 * and its answer (held on loop 1 by the test hook until then): loop 0 refuses it (the epoch it
 * carries is older than the fence that covers its writer), so no QP is made for the writer, its
 * WRITE of poison fails and no byte lands after the fence; its next call connects again and
 * writes. Before the fence epoch, the held hello got QPs after the fence and the WRITE landed. */
static void test_rdma_e2e_hello_read_before_fence_refused(void **state)
{
    (void)state;
    enum { LEN = 16384 };
    struct rig g;
    rig_up(&g, 61, FV_FLUSH_ALL);
    memset(g.region, 0, SEG_BYTES);
    int idle = seg_raw_connect(kvp_seg_server_port(g.srv)); /* takes loop 0: the hello goes to loop 1 */
    assert_true(idle >= 0);
    struct kvp_seg_server_stats st;
    for (int i = 0; i < 5000; i++) {
        kvp_seg_server_stats(g.srv, &st);
        if (st.conns_accepted >= 1)
            break;
        nap_ms(1);
    }
    assert_int_equal(st.conns_accepted, 1);
    struct hello_hold h = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    kvp_seg_server_test_hold_hellos(g.srv, hello_hold_fn, &h);
    struct fwd_writer w = {.g = &g, .buf = malloc(LEN)};
    memset(w.buf, POISON, LEN);
    w.s = (struct kvp_xfer_slice){.local = w.buf, .length = LEN, .segment_id = 5, .endpoint = g.ep,
                                  .remote_offset = 16384, .op = KVP_XFER_WRITE};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fwd_writer_run, &w), 0);
    pthread_mutex_lock(&h.mu);
    for (int i = 0; i < 100 && !h.entered; i++) { /* bounded: 100 x 100 ms */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&h.cv, &h.mu, &until);
    }
    int entered = h.entered;
    pthread_mutex_unlock(&h.mu);
    assert_int_equal(entered, 1); /* the hello was read by loop 1 and is held before loop 0 */
    /* FenceWriter of every writer (a put's expiry): loop 0 runs it and answers; the heartbeat
     * would now send Fenced and the master reuse the space */
    assert_true(kvp_seg_server_fence_writers(g.srv, 0, 0) >= 0);
    fv_lock();
    uint64_t t_fence = fv_now(g.f);
    fv_unlock();
    pthread_mutex_lock(&h.mu);
    h.go = 1;
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.mu);
    assert_int_equal(pthread_join(t, NULL), 0);
    kvp_seg_server_test_hold_hellos(g.srv, NULL, NULL);
    uint32_t qps = 99;
    assert_int_equal(kvp_seg_server_rdma_writer_qps(g.srv, 9, UINT64_MAX, &qps, NULL), KVP_OK);
    fprintf(stderr, "held hello after the fence: write %s, writer QPs on the segment %u\n",
            kvp_errname(w.s.status), qps);
    assert_int_equal(qps, 0);                      /* no QP for the fenced writer's old hello */
    assert_int_not_equal(w.s.status, KVP_OK);
    fv_lock();
    fv_run_idle(g.f, 5000 * MS); /* every packet still in flight arrives now */
    size_t late = fv_audit_placed_after(g.f, g.region, SEG_BYTES, t_fence, NULL);
    fv_unlock();
    assert_int_equal(late, 0);
    for (size_t i = 0; i < SEG_BYTES; i++)
        if (g.region[i] == POISON)
            fail_msg("region byte %zu holds the fenced writer's poison", i);
    /* the writer connects again (a hello read after the fence) and writes */
    uint8_t ok[4096];
    memset(ok, 0x42, sizeof ok);
    struct kvp_xfer_slice s2 = {.local = ok, .length = sizeof ok, .segment_id = 5, .endpoint = g.ep,
                                .remote_offset = 32768, .op = KVP_XFER_WRITE};
    int rc = KVP_ERR_TRANSFER;
    for (int i = 0; i < 3 && rc != KVP_OK; i++)
        rc = kvp_xfer_run(g.e, &s2, 1, 5000);
    assert_int_equal(rc, KVP_OK);
    assert_memory_equal(g.region + 32768, ok, sizeof ok);
    tcp_frames_none(&g);
    close(idle);
    free(w.buf);
    rig_down(&g);
}

#ifdef KVP_FAULT_INJECTION
struct fw_ack {
    struct fv_fabric *f;
    _Atomic uint64_t t_ack; /* the double's clock when the Fenced heartbeat reached the master */
};

/* The Fenced heartbeat reached the master: note the time, then let every held packet arrive now
 * (past the pause): a QP not yet fenced would place the held WRITE after t_ack. */
static void fw_on_fenced(void *arg)
{
    struct fw_ack *a = arg;
    fv_lock();
    atomic_store(&a->t_ack, fv_now(a->f));
    fv_run_idle(a->f, 2000 * MS);
    fv_unlock();
}

static void test_rdma_e2e_heartbeat_fence_writer_acks_after_fence(void **state)
{
    (void)state;
    enum { LEN = 16384 };
    struct fv_fabric *f;
    struct fv_node *nc, *ns;
    struct fv_config fc = {.seed = 77, .jitter_ns = 2 * MS};
    struct fv_node_config cc = {.name = "client", .n_devices = 1, .flush = FV_FLUSH_ALL};
    struct fv_node_config sc = {.name = "segment", .n_devices = 1};
    assert_int_equal(fv_fabric_new(&f, &fc), KVP_OK);
    assert_int_equal(fv_node_add(f, &cc, &nc), KVP_OK);
    assert_int_equal(fv_node_add(f, &sc, &ns), KVP_OK);
    struct kvp_rdma_env env = fv_locked_env(f);
    kvp_verbs_ops_set_test(fv_locked_ops(ns)); /* the segment's RDMA side opens on the double */

    struct fake_master fm;
    assert_int_equal(fm_start(&fm), 0);
    struct fw_ack ack = {.f = f};
    fm.on_fenced = fw_on_fenced;
    fm.on_fenced_arg = &ack;
    struct kvp_msession *ms = NULL;
    const char *m[1] = {fm.addr};
    assert_int_equal(kvp_msession_new(&ms, m, 1, "test-fw"), KVP_OK);
    struct kvp_cfg_segment cfg;
    kvp_cfg_defaults(KVP_CFG_SEGMENT, &cfg);
    snprintf(cfg.local_hostname, sizeof cfg.local_hostname, "127.0.0.1");
    snprintf(cfg.protocol, sizeof cfg.protocol, "rdma");
    cfg.global_segment_size = SEG_BYTES;
    cfg.heartbeat_ms = 30;
    struct kvp_segment *seg = NULL;
    assert_int_equal(kvp_segment_start(&seg, &cfg, ms, NULL), KVP_OK);
    uint32_t id = kvp_segment_id(seg);
    assert_true(id != 0);
    for (int i = 0; i < 5000 && atomic_load(&fm.rdma_beats) == 0; i++)
        nap_ms(1);
    assert_true(atomic_load(&fm.rdma_beats) > 0); /* the heartbeat says it serves RDMA writers */

    /* a writer: the engine on the double, its handshake over the segment's TCP port */
    struct kvp_rdma_hello_tcp_opts ho = {.timeout_ms = 2000};
    struct kvp_xport_rdma_opts o = {
        .cfg = {.ops = fv_locked_ops(nc), .gid_index = -1, .psn_seed = 5, .sysfs_root = "/nonexistent"},
        .env = env, .client_id = 9, .hello = kvp_rdma_hello_tcp, .hello_arg = &ho, .drive_clock = true};
    struct kvp_xfer_params p = {.conns_per_peer = 1, .slice_bytes = 64 * 1024, .fence_bound_ms = 200,
                                .transport = &kvp_xport_rdma, .transport_opts = &o};
    struct kvp_xfer_engine *e = NULL;
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    char ep[128];
    snprintf(ep, sizeof ep, "%s", kvp_segment_endpoint(seg));
    uint8_t *good = malloc(LEN);
    memset(good, 0x3c, LEN);
    struct kvp_xfer_slice s0 = {.local = good, .length = LEN, .segment_id = id, .endpoint = ep,
                                .remote_offset = 0, .op = KVP_XFER_WRITE};
    assert_int_equal(kvp_xfer_run(e, &s0, 1, 5000), KVP_OK); /* the writer's QP is up */
    struct kvp_xfer_stats xs;
    kvp_xfer_stats(e, &xs);
    assert_int_equal(xs.tcp_fallback_peers, 0);

    /* its next WRITE is held in flight by a PFC pause of the segment's NIC */
    struct fv_stats fs0, fs;
    fv_lock();
    fv_node_pause(ns, 1500 * MS);
    fv_stats_get(f, &fs0);
    fv_unlock();
    struct rig g = {.e = e};
    struct fwd_writer w = {.g = &g, .buf = malloc(LEN)};
    memset(w.buf, POISON, LEN);
    w.s = (struct kvp_xfer_slice){.local = w.buf, .length = LEN, .segment_id = id, .endpoint = ep,
                                  .remote_offset = 32768, .op = KVP_XFER_WRITE};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fwd_writer_run, &w), 0);
    for (int i = 0; i < 5000; i++) {
        fv_lock();
        fv_stats_get(f, &fs);
        fv_unlock();
        if (fs.packets > fs0.packets)
            break;
        nap_ms(1);
    }
    assert_true(fs.packets > fs0.packets);

    /* the master asks for the fence; the Fenced must come only after it */
    atomic_store(&fm.fw_seq, 7);
    for (int i = 0; i < 10000 && atomic_load(&fm.fenced_seq) != 7; i++)
        nap_ms(1);
    assert_int_equal(atomic_load(&fm.fenced_seq), 7);
    assert_true(atomic_load(&fm.fenced_qps) >= 1);
    uint64_t t_ack = atomic_load(&ack.t_ack);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_not_equal(w.s.status, KVP_OK);
    kvp_xfer_engine_destroy(&e);
    fv_lock();
    fv_run_idle(f, 5000 * MS); /* every packet still in flight arrives now */
    fv_stats_get(f, &fs);
    fv_unlock();
    assert_true(fs.dropped > fs0.dropped); /* the held WRITE met a fenced QP */
    /* the region is the segment's mapping: audit the range the held WRITE targeted */
    fv_lock();
    size_t late = 0;
    for (size_t i = 0; i < fv_audit_count(f); i++) {
        const struct fv_dma *d = fv_audit_get(f, i);
        if (d->t_ns > t_ack)
            late++;
    }
    fv_unlock();
    if (late)
        fail_msg("%zu placement(s) after the Fenced heartbeat reached the master", late);
    fprintf(stderr, "FenceWriter: %u QP(s) fenced, held write %s, %llu packet(s) dropped\n",
            atomic_load(&fm.fenced_qps), kvp_errname(w.s.status),
            (unsigned long long)(fs.dropped - fs0.dropped));
    kvp_segment_stop(&seg);
    kvp_msession_destroy(&ms);
    fm_stop(&fm);
    kvp_verbs_ops_set_test(NULL);
    fv_locked_reset();
    fv_fabric_destroy(&f);
    free(good);
    free(w.buf);
}

/* The per-writer fence through the segment's heartbeat actor: its heartbeats say fence_selectors;
 * a FenceWriter naming writer family A (writers = {A, KVP_RDMA_WRITER_FAMILY_MASK}) reaches loop 0
 * with the selectors copied into the heartbeat's message: A's QPs are destroyed, the Fenced counts
 * exactly them, and writer B's QPs (same generations) stay and keep writing with no QP destroyed. */
static void test_rdma_e2e_heartbeat_fence_writer_selectors(void **state)
{
    (void)state;
    enum { LEN = 8192 };
    const uint64_t fam = KVP_RDMA_WRITER_FAMILY_MASK, a_id = 0x0000000a00000001ull, b_id = 0x0000000b00000001ull;
    struct fv_fabric *f;
    struct fv_node *nc, *ns;
    struct fv_config fc = {.seed = 78, .jitter_ns = 2 * MS};
    struct fv_node_config cc = {.name = "client", .n_devices = 1, .flush = FV_FLUSH_ALL};
    struct fv_node_config sc = {.name = "segment", .n_devices = 1};
    assert_int_equal(fv_fabric_new(&f, &fc), KVP_OK);
    assert_int_equal(fv_node_add(f, &cc, &nc), KVP_OK);
    assert_int_equal(fv_node_add(f, &sc, &ns), KVP_OK);
    struct kvp_rdma_env env = fv_locked_env(f);
    kvp_verbs_ops_set_test(fv_locked_ops(ns));

    struct fake_master fm;
    assert_int_equal(fm_start(&fm), 0);
    struct kvp_msession *ms = NULL;
    const char *m[1] = {fm.addr};
    assert_int_equal(kvp_msession_new(&ms, m, 1, "test-fwsel"), KVP_OK);
    struct kvp_cfg_segment cfg;
    kvp_cfg_defaults(KVP_CFG_SEGMENT, &cfg);
    snprintf(cfg.local_hostname, sizeof cfg.local_hostname, "127.0.0.1");
    snprintf(cfg.protocol, sizeof cfg.protocol, "rdma");
    cfg.global_segment_size = SEG_BYTES;
    cfg.heartbeat_ms = 30;
    struct kvp_segment *seg = NULL;
    assert_int_equal(kvp_segment_start(&seg, &cfg, ms, NULL), KVP_OK);
    uint32_t id = kvp_segment_id(seg);
    assert_true(id != 0);
    for (int i = 0; i < 5000 && atomic_load(&fm.sel_beats) == 0; i++)
        nap_ms(1);
    assert_true(atomic_load(&fm.sel_beats) > 0); /* it says it runs FenceWriter.writers */

    /* two writers of two client families, each with its QPs up */
    struct kvp_rdma_hello_tcp_opts ho = {.timeout_ms = 2000};
    struct kvp_xport_rdma_opts oa = {
        .cfg = {.ops = fv_locked_ops(nc), .gid_index = -1, .psn_seed = 5, .sysfs_root = "/nonexistent"},
        .env = env, .client_id = a_id, .hello = kvp_rdma_hello_tcp, .hello_arg = &ho, .drive_clock = true};
    struct kvp_xport_rdma_opts ob = oa;
    ob.client_id = b_id;
    ob.cfg.psn_seed = 6;
    struct kvp_xfer_params pa = {.conns_per_peer = 1, .slice_bytes = 64 * 1024, .fence_bound_ms = 200,
                                 .transport = &kvp_xport_rdma, .transport_opts = &oa};
    struct kvp_xfer_params pb = pa;
    pb.transport_opts = &ob;
    struct kvp_xfer_engine *ea = NULL, *eb = NULL;
    assert_int_equal(kvp_xfer_engine_new(&ea, &pa), KVP_OK);
    assert_int_equal(kvp_xfer_engine_new(&eb, &pb), KVP_OK);
    char ep[128];
    snprintf(ep, sizeof ep, "%s", kvp_segment_endpoint(seg));
    uint8_t *buf = malloc(LEN);
    memset(buf, 0x5a, LEN);
    struct kvp_xfer_slice sa = {.local = buf, .length = LEN, .segment_id = id, .endpoint = ep,
                                .remote_offset = 0, .op = KVP_XFER_WRITE};
    struct kvp_xfer_slice sb = sa;
    sb.remote_offset = 65536;
    assert_int_equal(kvp_xfer_run(ea, &sa, 1, 5000), KVP_OK);
    assert_int_equal(kvp_xfer_run(eb, &sb, 1, 5000), KVP_OK);
    struct kvp_seg_server *srv = seg->srv;
    uint32_t qa = 0, qb = 0, q = 0;
    uint64_t gb = 0, g = 0, fenced0 = 0, fenced1 = 0;
    assert_int_equal(kvp_seg_server_rdma_writer_qps(srv, a_id, fam, &qa, NULL), KVP_OK);
    assert_int_equal(kvp_seg_server_rdma_writer_qps(srv, b_id, fam, &qb, &gb), KVP_OK);
    assert_true(qa > 0);
    assert_true(qb > 0);

    /* the master asks for A's family only */
    atomic_store(&fm.fw_sel_id, a_id & fam);
    atomic_store(&fm.fw_sel_mask, fam);
    atomic_store(&fm.fw_seq, 9);
    for (int i = 0; i < 10000 && atomic_load(&fm.fenced_seq) != 9; i++)
        nap_ms(1);
    assert_int_equal(atomic_load(&fm.fenced_seq), 9);
    assert_int_equal(atomic_load(&fm.fenced_qps), qa); /* exactly A's QPs, none of B's */
    assert_int_equal(kvp_seg_server_rdma_writer_qps(srv, a_id, fam, &q, NULL), KVP_OK);
    assert_int_equal(q, 0);
    assert_int_equal(kvp_seg_server_rdma_writer_qps(srv, b_id, fam, &q, &g), KVP_OK);
    assert_int_equal(q, qb);
    assert_int_equal(g, gb);
    /* B keeps writing on its QPs: nothing more destroyed */
    assert_int_equal(kvp_seg_server_rdma_writers_fenced(srv, &fenced0), KVP_OK);
    assert_int_equal(kvp_xfer_run(eb, &sb, 1, 5000), KVP_OK);
    assert_int_equal(kvp_seg_server_rdma_writers_fenced(srv, &fenced1), KVP_OK);
    assert_int_equal(fenced1, fenced0);
    fprintf(stderr, "FenceWriter.writers via the heartbeat: %u QP(s) of A fenced, B's %u kept\n", qa, qb);
    kvp_xfer_engine_destroy(&ea);
    kvp_xfer_engine_destroy(&eb);
    kvp_segment_stop(&seg);
    kvp_msession_destroy(&ms);
    fm_stop(&fm);
    kvp_verbs_ops_set_test(NULL);
    fv_locked_reset();
    fv_fabric_destroy(&f);
    free(buf);
}
#endif

/* The opcode on the wire: a server without the RDMA side answers UNSUPPORTED and keeps serving;
 * a garbage offer gets an encoded refusal and the connection keeps serving; a hello of length 0
 * or over KVP_FRAME_RDMA_HELLO_MAX is a malformed frame (connection closed, counted). */
static void test_rdma_e2e_hello_frames_bad_input(void **state)
{
    (void)state;
    uint8_t *region = calloc(1, 65536);
    struct kvp_seg_server *srv;
    int fd;
    assert_int_equal(seg_raw_server_start(region, 65536, 3, &srv, &fd), 0);
    uint8_t hdr[KVP_FRAME_HEADER_BYTES], offer[64];
    memset(offer, 0x5c, sizeof offer);
    seg_raw_header(hdr, KVP_FRAME_RDMA_HELLO, 3, 1, 0, sizeof offer, 0);
    seg_raw_send_all(fd, hdr, sizeof hdr);
    seg_raw_send_all(fd, offer, sizeof offer);
    struct kvp_frame f = seg_raw_response(fd);
    assert_int_equal(f.op, KVP_FRAME_RDMA_HELLO_RESP);
    assert_int_equal(f.status, KVP_ERR_UNSUPPORTED);
    assert_int_equal(f.length, 0);
    seg_raw_header(hdr, KVP_FRAME_PING, 3, 2, 0, 0, 0); /* still serving */
    seg_raw_send_all(fd, hdr, sizeof hdr);
    f = seg_raw_response(fd);
    assert_int_equal(f.op, KVP_FRAME_PONG);
    assert_int_equal(f.status, KVP_OK);

    /* now with the RDMA side: a garbage offer is refused inside an encoded answer */
    struct fv_fabric *fab;
    struct fv_node *ns;
    assert_int_equal(fv_fabric_new(&fab, NULL), KVP_OK);
    assert_int_equal(fv_node_add(fab, NULL, &ns), KVP_OK);
    struct kvp_rdma_env env = fv_locked_env(fab);
    struct kvp_seg_rdma_cfg rc = {.ops = fv_locked_ops(ns), .env = &env, .sysfs_root = "/nonexistent",
                                  .gid_index = -1, .psn_seed = 5};
    assert_int_equal(kvp_seg_server_rdma(srv, &rc), KVP_OK);
    assert_int_equal(kvp_seg_server_rdma(srv, &rc), KVP_ERR_INVALID); /* once per server */
    seg_raw_header(hdr, KVP_FRAME_RDMA_HELLO, 3, 3, 0, sizeof offer, 0);
    seg_raw_send_all(fd, hdr, sizeof hdr);
    seg_raw_send_all(fd, offer, sizeof offer);
    f = seg_raw_response(fd);
    assert_int_equal(f.op, KVP_FRAME_RDMA_HELLO_RESP);
    assert_int_equal(f.status, KVP_OK);
    assert_true(f.length > 0 && f.length < 4096);
    uint8_t ans[4096];
    seg_raw_recv_all(fd, ans, f.length);
    struct kvp_rdma_hello h;
    assert_int_equal(kvp_rdma_hello_decode(ans, f.length, &h, NULL, 0), KVP_OK);
    assert_int_not_equal(h.status, KVP_OK);
    kvp_rdma_hello_free(&h);
    seg_raw_header(hdr, KVP_FRAME_PING, 3, 4, 0, 0, 0);
    seg_raw_send_all(fd, hdr, sizeof hdr);
    assert_int_equal(seg_raw_response(fd).op, KVP_FRAME_PONG);

    /* length 0: malformed, the connection is closed */
    seg_raw_header(hdr, KVP_FRAME_RDMA_HELLO, 3, 5, 0, 0, 0);
    seg_raw_send_all(fd, hdr, sizeof hdr);
    uint8_t b;
    assert_int_equal(recv(fd, &b, 1, 0), 0);
    close(fd);
    /* over the cap: the same */
    fd = seg_raw_connect(kvp_seg_server_port(srv));
    seg_raw_header(hdr, KVP_FRAME_RDMA_HELLO, 3, 6, 0, KVP_FRAME_RDMA_HELLO_MAX + 1, 0);
    seg_raw_send_all(fd, hdr, sizeof hdr);
    assert_int_equal(recv(fd, &b, 1, 0), 0);
    struct kvp_seg_server_stats st;
    kvp_seg_server_stats(srv, &st);
    assert_int_equal(st.bad_frames, 2);
    seg_raw_server_stop(&srv, fd);
    fv_locked_reset();
    fv_fabric_destroy(&fab);
    free(region);
}

static int wallet_cb(void *ctx, const uint8_t *challenge, size_t len, uint8_t *out, size_t cap)
{
    if (len != KVP_DT_CHALLENGE_BYTES)
        return KVP_ERR_INVALID;
    return kvp_dt_wallet_respond(ctx, challenge, kvp_clock_wall_ms(), out, cap);
}

/* A wallet holding a token for segment `seg`, signed by the master key (mpk, msk). */
static struct kvp_dt_wallet *wallet_with_token(uint32_t seg, const uint8_t *mpk, const uint8_t *msk)
{
    struct kvp_dt_wallet *w = NULL;
    assert_int_equal(kvp_dt_wallet_new(&w), KVP_OK);
    struct kvp_dt_claims c = {.segment_id = seg, .expires_ms = kvp_clock_wall_ms() + 600000};
    kvp_dt_wallet_public_key(w, c.client_pk);
    memset(c.client_id, 0xcd, sizeof c.client_id);
    snprintf(c.tenant, sizeof c.tenant, "team-r");
    uint8_t tok[KVP_DT_TOKEN_MAX];
    int n = kvp_dt_issue(mpk, msk, &c, tok, sizeof tok);
    assert_true(n > 0);
    assert_int_equal(kvp_dt_wallet_put(w, tok, (size_t)n), KVP_OK);
    return w;
}

/* One 4096-byte READ at 12288 of segment 5 through the rig's engine: its status. */
static int read_one(struct rig *g, uint8_t *buf)
{
    memset(buf, 0, 4096);
    struct kvp_xfer_slice s = {.local = buf, .length = 4096, .segment_id = 5, .endpoint = g->ep,
                               .remote_offset = 12288, .op = KVP_XFER_READ};
    (void)kvp_xfer_run(g->e, &s, 1, 5000);
    return s.status;
}

static void test_rdma_e2e_hello_answers_token_challenge(void **state)
{
    (void)state;
    uint8_t mpk[KVP_DT_PK_BYTES], msk[KVP_DT_SK_BYTES];
    assert_int_equal(kvp_dt_keypair(mpk, msk), KVP_OK);
    uint8_t *buf = aligned_alloc(4096, 4096);
    struct kvp_seg_server_stats st;

    /* with a token for this segment: the hello passes the check, the data goes over RDMA */
    struct kvp_dt_wallet *w = wallet_with_token(5, mpk, msk);
    struct rig g;
    rig_up_auth(&g, 3, FV_FLUSH_ALL, mpk);
    g.ho.token_respond = wallet_cb;
    g.ho.token_ctx = w;
    assert_int_equal(read_one(&g, buf), KVP_OK);
    assert_memory_equal(buf, g.region + 12288, 4096);
    tcp_frames_none(&g);
    kvp_seg_server_stats(g.srv, &st);
    assert_int_equal(st.token_refused, 0);
    rig_down(&g);
    kvp_dt_wallet_destroy(&w);

    /* no callback: the segment refuses the hello's connection (it sent no token) */
    rig_up_auth(&g, 4, FV_FLUSH_ALL, mpk);
    assert_int_not_equal(read_one(&g, buf), KVP_OK);
    assert_true(all_zero(buf, 4096));
    /* The client gives up as soon as it reads the 44-byte challenge as a malformed answer
     * header, possibly before the server's loop has read its hello as a token response and
     * counted the refusal: wait for the count (bounded), do not race it. */
    for (int i = 0; i < 300; i++) {
        kvp_seg_server_stats(g.srv, &st);
        if (st.token_refused >= 1)
            break;
        usleep(10000);
    }
    assert_true(st.token_refused >= 1);
    rig_down(&g);

    /* a token for another segment only: the callback has nothing to answer with */
    w = wallet_with_token(9, mpk, msk);
    rig_up_auth(&g, 5, FV_FLUSH_ALL, mpk);
    g.ho.token_respond = wallet_cb;
    g.ho.token_ctx = w;
    assert_int_not_equal(read_one(&g, buf), KVP_OK);
    assert_true(all_zero(buf, 4096));
    rig_down(&g);
    kvp_dt_wallet_destroy(&w);
    free(buf);
}

/* The client's way (kvp_xfer_params.token_wallet): the hello options carry no token callback;
 * each rdma instance answers the hello's challenge from its own transfer actor's wallet, filled
 * by kvp_xfer_tokens_put. Before the push the hello is refused; after it the data goes over RDMA. */
static void test_rdma_e2e_hello_signs_from_pushed_tokens(void **state)
{
    (void)state;
    uint8_t mpk[KVP_DT_PK_BYTES], msk[KVP_DT_SK_BYTES];
    assert_int_equal(kvp_dt_keypair(mpk, msk), KVP_OK);
    uint8_t *buf = aligned_alloc(4096, 4096);
    struct kvp_dt_wallet *key = wallet_with_token(9, mpk, msk); /* its key; segment 9 only */
    struct kvp_dt_claims c = {.segment_id = 5, .expires_ms = kvp_clock_wall_ms() + 600000};
    kvp_dt_wallet_public_key(key, c.client_pk);
    memset(c.client_id, 0xcd, sizeof c.client_id);
    snprintf(c.tenant, sizeof c.tenant, "team-r");
    uint8_t tok[KVP_DT_TOKEN_MAX];
    int n = kvp_dt_issue(mpk, msk, &c, tok, sizeof tok);
    assert_true(n > 0);
    rig_token_wallet = key;
    struct rig g;
    rig_up_auth(&g, 6, FV_FLUSH_ALL, mpk);
    rig_token_wallet = NULL;
    assert_null(g.ho.token_respond);
    assert_int_not_equal(read_one(&g, buf), KVP_OK); /* no token pushed: the hello is refused */
    assert_true(all_zero(buf, 4096));
    const uint8_t *tp = tok;
    size_t tl = (size_t)n;
    assert_int_equal(kvp_xfer_tokens_put(g.e, &tp, &tl, 1), KVP_OK);
    assert_int_equal(read_one(&g, buf), KVP_OK);
    assert_memory_equal(buf, g.region + 12288, 4096);
    tcp_frames_none(&g);
    rig_down(&g);
    kvp_dt_wallet_destroy(&key);
    free(buf);
}

/* Per-peer TCP fallback: one engine on the rdma transport, two segments: the rig's (RDMA) and a
 * TCP-only one (protocol tcp: its data port answers RDMA_HELLO with UNSUPPORTED). Both get their
 * data; the RDMA one with no TCP data frame, the TCP-only one over TCP frames; the engine counts
 * one fallback peer, and a second batch to it makes no new handshake (the peer stays on TCP). */
static void test_rdma_e2e_tcp_only_segment_uses_tcp_for_that_peer(void **state)
{
    (void)state;
    struct rig g;
    rig_up(&g, 11, FV_FLUSH_ALL);
    uint8_t *region2 = aligned_alloc(4096, SEG_BYTES);
    memset(region2, 0, SEG_BYTES);
    struct kvp_seg_server *tcp_srv = NULL;
    assert_int_equal(kvp_seg_server_start(&tcp_srv, "127.0.0.1", 0, region2, SEG_BYTES), KVP_OK);
    kvp_seg_server_set_id(tcp_srv, 6);
    char ep2[64];
    snprintf(ep2, sizeof ep2, "127.0.0.1:%u", kvp_seg_server_port(tcp_srv));
    enum { LEN = 30000 };
    uint8_t *w = aligned_alloc(4096, 61440), *r = aligned_alloc(4096, 61440); /* >= 2 * LEN */
    for (int round = 0; round < 2; round++) {
        for (int j = 0; j < 2 * LEN; j++)
            w[j] = (uint8_t)(j * 7 + 3 + round);
        memset(r, 0, 2 * LEN);
        struct kvp_xfer_slice s[2] = {
            {.local = w, .length = LEN, .segment_id = 5, .endpoint = g.ep, .remote_offset = 4096,
             .op = KVP_XFER_WRITE},
            {.local = w + LEN, .length = LEN, .segment_id = 6, .endpoint = ep2, .remote_offset = 8192,
             .op = KVP_XFER_WRITE}};
        assert_int_equal(kvp_xfer_run(g.e, s, 2, 5000), KVP_OK);
        assert_memory_equal(g.region + 4096, w, LEN);
        assert_memory_equal(region2 + 8192, w + LEN, LEN);
        s[0].local = r;
        s[1].local = r + LEN;
        s[0].op = s[1].op = KVP_XFER_READ;
        assert_int_equal(kvp_xfer_run(g.e, s, 2, 5000), KVP_OK);
        assert_int_equal(s[0].status, KVP_OK);
        assert_int_equal(s[1].status, KVP_OK);
        assert_memory_equal(r, w, 2 * LEN);
    }
    tcp_frames_none(&g); /* the RDMA segment: everything over QPs */
    struct kvp_seg_server_stats st;
    kvp_seg_server_stats(tcp_srv, &st);
    assert_int_equal(st.requests[0][0], 2); /* two READ frames answered OK */
    assert_int_equal(st.requests[1][0], 2); /* two WRITE frames */
    struct kvp_xfer_stats xs;
    kvp_xfer_stats(g.e, &xs);
    assert_int_equal(xs.tcp_fallback_peers, 1);
    free(w);
    free(r);
    rig_down(&g);
    kvp_seg_server_stop(&tcp_srv);
    free(region2);
}


/* Item 3 of issue 20's closing: a segment moved to TCP (it had no RDMA) is tried over RDMA
 * again after rdma_reprobe_ms; while it still has none it stays on TCP, and once its device
 * appears (its RDMA side opens on the running server) new transfers go over the QPs. */
static void one_round(struct rig *g, const char *ep, uint8_t *region2, uint8_t *w, uint8_t *r, int round)
{
    enum { LEN = 20000 };
    for (int j = 0; j < LEN; j++)
        w[j] = (uint8_t)(j * 5 + 1 + round);
    struct kvp_xfer_slice s = {.local = w, .length = LEN, .segment_id = 6, .endpoint = ep,
                               .remote_offset = 4096, .op = KVP_XFER_WRITE};
    assert_int_equal(kvp_xfer_run(g->e, &s, 1, 5000), KVP_OK);
    assert_memory_equal(region2 + 4096, w, LEN);
    memset(r, 0, LEN);
    s.local = r;
    s.op = KVP_XFER_READ;
    assert_int_equal(kvp_xfer_run(g->e, &s, 1, 5000), KVP_OK);
    assert_memory_equal(r, w, LEN);
}

static uint64_t tcp_frames(struct kvp_seg_server *srv)
{
    struct kvp_seg_server_stats st;
    kvp_seg_server_stats(srv, &st);
    uint64_t n = 0;
    for (int o = 0; o < 2; o++)
        for (int k = 0; k < KVP_SEG_RESULTS; k++)
            n += st.requests[o][k];
    return n;
}

static void wait_ms_passed(uint64_t since, uint64_t ms)
{
    while (kvp_clock_now_ms() < since + ms)
        usleep(2000); /* the condition is the clock itself: a reprobe is due */
}

static void test_rdma_e2e_tcp_peer_back_on_rdma_after_reprobe(void **state)
{
    (void)state;
    struct rig g;
    rig_reprobe_ms = 300;
    rig_up(&g, 13, FV_FLUSH_ALL);
    rig_reprobe_ms = 0;
    uint8_t *region2 = aligned_alloc(4096, SEG_BYTES);
    memset(region2, 0, SEG_BYTES);
    struct kvp_seg_server *srv2 = NULL;
    assert_int_equal(kvp_seg_server_start(&srv2, "127.0.0.1", 0, region2, SEG_BYTES), KVP_OK);
    kvp_seg_server_set_id(srv2, 6);
    char ep2[64];
    snprintf(ep2, sizeof ep2, "127.0.0.1:%u", kvp_seg_server_port(srv2));
    uint8_t *w = aligned_alloc(4096, 20480), *r = aligned_alloc(4096, 20480);
    struct kvp_xfer_stats xs;

    one_round(&g, ep2, region2, w, r, 0); /* no RDMA there: TCP */
    assert_int_equal(tcp_frames(srv2), 2);
    kvp_xfer_stats(g.e, &xs);
    assert_int_equal(xs.tcp_fallback_peers, 1);

    wait_ms_passed(kvp_clock_now_ms(), 350); /* a try is due; still no RDMA there: TCP again */
    one_round(&g, ep2, region2, w, r, 1);
    assert_int_equal(tcp_frames(srv2), 4);
    kvp_xfer_stats(g.e, &xs);
    assert_true(xs.rdma_reprobes >= 1);
    assert_int_equal(xs.rdma_returned_peers, 0);
    uint64_t reprobes = xs.rdma_reprobes;

    /* its device appears: the running server opens its RDMA side */
    struct fv_node *n2 = NULL;
    struct fv_node_config sc2 = {.name = "segment2", .n_devices = 1};
    fv_lock();
    assert_int_equal(fv_node_add(g.f, &sc2, &n2), KVP_OK);
    fv_unlock();
    struct kvp_seg_rdma_cfg rc = {.who = "seg-e2e-2", .ops = fv_locked_ops(n2), .env = &g.env,
                                  .sysfs_root = "/nonexistent", .gid_index = -1, .psn_seed = 77};
    assert_int_equal(kvp_seg_server_rdma(srv2, &rc), KVP_OK);

    wait_ms_passed(kvp_clock_now_ms(), 350); /* the next try is due: it finds RDMA */
    for (int round = 2; round < 5; round++)
        one_round(&g, ep2, region2, w, r, round); /* over the QPs now */
    assert_int_equal(tcp_frames(srv2), 4);
    kvp_xfer_stats(g.e, &xs);
    assert_int_equal(xs.rdma_returned_peers, 1);
    assert_int_equal(xs.rdma_reprobes, reprobes + 1);
    assert_int_equal(xs.tcp_fallback_peers, 1);
    tcp_frames_none(&g);
    free(w);
    free(r);
    kvp_xfer_engine_destroy(&g.e);
    kvp_seg_server_stop(&srv2);
    rig_down(&g);
    free(region2);
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rdma_e2e_put_get_over_segment_server),
        cmocka_unit_test(test_rdma_e2e_timed_out_reads_never_land),
        cmocka_unit_test(test_rdma_e2e_timed_out_writes_never_read_late),
        cmocka_unit_test(test_rdma_e2e_remount_fences_old_qps),
        cmocka_unit_test(test_rdma_e2e_remount_while_hello_forwarded_fences_old_writer),
        cmocka_unit_test(test_rdma_e2e_hello_read_before_fence_refused),
#ifdef KVP_FAULT_INJECTION
        cmocka_unit_test(test_rdma_e2e_heartbeat_fence_writer_acks_after_fence),
        cmocka_unit_test(test_rdma_e2e_heartbeat_fence_writer_selectors),
#endif
        cmocka_unit_test(test_rdma_e2e_hello_frames_bad_input),
        cmocka_unit_test(test_rdma_e2e_hello_answers_token_challenge),
        cmocka_unit_test(test_rdma_e2e_hello_signs_from_pushed_tokens),
        cmocka_unit_test(test_rdma_e2e_tcp_only_segment_uses_tcp_for_that_peer),
        cmocka_unit_test(test_rdma_e2e_tcp_peer_back_on_rdma_after_reprobe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
