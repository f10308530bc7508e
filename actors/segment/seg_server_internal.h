/*
 * seg_server_internal.h — the segment data-plane server's shared state (seg_server.c, the loops;
 * seg_server_rdma.c, the RDMA side owned by loop 0). Not a public interface.
 */
#ifndef KVP_SEG_SERVER_INTERNAL_H
#define KVP_SEG_SERVER_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "actors/segment/seg_rdma.h"
#include "actors/segment/seg_server.h"
#include "actors/segment/segment_internal.h"
#include "auth/auth_token.h"

struct kvp_rt_actor;
struct kvp_rt_ctx;
struct kvp_rt_msg;
struct kvp_seg_rdma;

/* The fences loop 0 remembers to refuse late handshakes (struct kvp_seg_server.fence_log): a
 * hello more fences old than this is refused whoever it is from. */
#define SEG_FENCE_LOG 8

/*
 * Request counters of one loop, for the metrics endpoint (kvp_seg_server_stats). Written only by
 * the loop's own thread, as load + store (one writer: no read-modify-write, so no locked
 * instruction on the request path); read by the metrics HTTP thread with relaxed loads. Relaxed
 * is enough: each counter is an independent monotonic value and nothing else is published
 * through it; a scrape may see one counter a request ahead of another. Atomics and not a
 * message: the reader is libmicrohttpd's thread, which has no mailbox to take a reply, and a
 * scrape must not cost the data path a wake-up.
 */
struct seg_counters {
    _Atomic uint64_t bytes_read;    /* READ payload bytes queued for sending */
    _Atomic uint64_t bytes_written; /* WRITE payload bytes that landed in the region */
    _Atomic uint64_t req[KVP_SEG_OPS][KVP_SEG_RESULTS];
    _Atomic uint64_t bad_frames;
    _Atomic uint64_t conns_open;     /* this loop's connections now */
    _Atomic uint64_t conns_accepted; /* loop 0 only */
    _Atomic uint64_t conns_refused;  /* loop 0 only */
    _Atomic uint64_t token_refused;  /* connections refused by the data-plane token check */
    _Atomic uint64_t rdma_hellos_fwd; /* RDMA handshakes this loop forwarded to loop 0 */
};

/* Messages to the loops. SEG_MSG_RDMA_* go to loop 0, the RDMA side's owner (seg_server_rdma.c). */
enum {
    SEG_MSG_CONN = 1, /* payload struct seg_newconn: a socket for this loop to serve */
    SEG_MSG_GONE = 2, /* to loop 0: arg connections of the sender were closed */
    SEG_MSG_SWEEP = 3,  /* timer: drop connections stalled mid-frame */
    SEG_MSG_REARM = 4,  /* timer: accept again after running out of descriptors */
    SEG_MSG_STOP = 5,   /* the server stops: wait in the runtime's poll from now on */
    SEG_MSG_LISTEN = 6, /* to loop 0, once every loop runs: start accepting */
    SEG_MSG_ID = 7,     /* loop 0 set a non-zero id: send the challenges held until then */
    SEG_MSG_SET_ID = 8,      /* to loop 0 (send or request): arg the new id (set_id) */
    SEG_MSG_RDMA_OPEN = 9,   /* to loop 0 (request): payload the opened struct kvp_seg_rdma */
    SEG_MSG_RDMA_FENCE = 10, /* to loop 0 (request): payload struct seg_fence_req; reply arg: QPs */
    SEG_MSG_RDMA_HELLO = 11, /* to loop 0 (request): payload struct seg_hello_req (the offer and the
                              * fence epoch seen when it was read); the reply carries the encoded
                              * answer (arg its length) and its status */
    SEG_MSG_RDMA_QPS = 12,   /* to loop 0 (request): payload struct seg_qps_req, filled in and sent
                              * back as the reply's payload (status and tests) */
    SEG_MSG_RDMA_FENCED = 13, /* to loop 0 (request): reply arg: the RDMA side's writers_fenced */
};

struct kvp_seg_server {
    uint8_t *base;
    uint64_t size;
    /* The id requests must carry. Written by loop 0 alone (SEG_MSG_SET_ID, after the RDMA side
     * fenced the old mount's writers), read by every loop before each request. Relaxed is
     * enough: a single independent value, no other memory is published through it; the loops
     * that held a challenge learn of a new id by SEG_MSG_ID, sent after the store. */
    _Atomic uint32_t segment_id;
    uint32_t port;
    int lfd[KVP_SEG_MAX_LISTEN];
    int n_lfd;
    struct kvp_rt_actor *loops[KVP_SEG_LOOPS];
    int n_loops;
    struct seg_counters ctr[KVP_SEG_LOOPS]; /* loop i writes ctr[i]; see struct seg_counters */
    /* The masters' token keys (docs/security.md "Data plane: tokens"): n_token_pks > 0 makes
     * every connection present a token first. Written once by start before any loop runs,
     * read-only afterwards (no synchronisation needed beyond the spawn). */
    uint8_t (*token_pks)[KVP_DT_PK_BYTES];
    size_t n_token_pks;
    char region_sync; /* TSan annotation address only (REGION_ACQUIRE/RELEASE) */
    /* protocol=rdma: the RDMA side (seg_rdma.h). Owned by loop 0: handed to it by message
     * (SEG_MSG_RDMA_OPEN) and touched only on its thread from then on, closed by its fini. */
    struct kvp_seg_rdma *rdma;
    /* Whether an RDMA side was handed to loop 0: set once by kvp_seg_server_rdma when loop 0
     * took it, read by the heartbeat (kvp_seg_server_has_rdma: its beats then say rdma_writers).
     * A flag only, never a way to the object; release/acquire. Atomic and not a message: the
     * heartbeat reads it at every beat, and it never changes back. */
    _Atomic bool rdma_on;
    /* The fence epoch (docs/rdma.md "A handshake read before a fence"): how many fences of RDMA
     * writers loop 0 has run (FenceWriter, and a mount change, which fences every writer).
     * Written by loop 0 alone, after each fence and before its reply; read by every loop when an
     * RdmaHello's header is read, and carried with the offer to loop 0, which refuses a hello
     * whose writer a later fence covered (fence_log). Atomic and not a message: the loop needs
     * the value at the instant it reads the hello; asking loop 0 would give the value at the
     * time loop 0 answers, which is the race this closes. Release/acquire. */
    _Atomic uint64_t rdma_fence_epoch;
    /* Loop 0's own: the last SEG_FENCE_LOG fences (entry e % SEG_FENCE_LOG is epoch e), and the
     * epoch it last stored. Touched only on loop 0's thread. */
    struct seg_fence_rec {
        uint64_t gen; /* the fence covered conn_generation <= gen */
        uint32_t n_sel;
        struct kvp_seg_writer_sel sel[KVP_SEG_FENCE_SELECTORS_MAX]; /* mask 0: every writer */
    } fence_log[SEG_FENCE_LOG];
    uint64_t fence_epoch;
    /* Tests only (kvp_seg_server_test_hold_hellos): called on a loop other than 0 after it read an
     * RdmaHello and its epoch, before it forwards the offer; may block that loop. Set once by a
     * test before any hello; an atomic because the loops read it with no message from the test's
     * thread (the verbs_ibv.c test hook does the same). */
    _Atomic(kvp_seg_hello_hook) hello_hold;
    void *_Atomic hello_hold_arg;
};

/* A forwarded RdmaHello (SEG_MSG_RDMA_HELLO): the offer and the fence epoch when it was read. */
struct seg_hello_req {
    uint64_t epoch;
    uint32_t len;
    uint8_t offer[];
};

/* FenceWriter's arguments (SEG_MSG_RDMA_FENCE). */
struct seg_fence_req {
    uint64_t client_id; /* 0: every writer (or those sel selects) */
    uint64_t gen;       /* 0: any generation */
    uint32_t n_sel;     /* FenceWriter.writers, copied (kvp_seg_rdma_fence_run) */
    struct kvp_seg_writer_sel sel[KVP_SEG_FENCE_SELECTORS_MAX];
};

/* A writer_qps query (SEG_MSG_RDMA_QPS): loop 0 fills n and gen_sum. */
struct seg_qps_req {
    uint64_t client_id, mask; /* in */
    uint32_t n;               /* out: QPs */
    uint64_t gen_sum;         /* out */
};

/**
 * Loop 0's handler for SEG_MSG_SET_ID, SEG_MSG_RDMA_OPEN, SEG_MSG_RDMA_FENCE, SEG_MSG_RDMA_HELLO,
 * SEG_MSG_RDMA_QPS and SEG_MSG_RDMA_FENCED (seg_server_rdma.c); runs on loop 0's thread only. Requests are answered here.
 * Returns KVP_OK (a failure to answer is logged; the requester then sees CLOSED or its timeout).
 */
int kvp_seg_rdma_loop_msg(struct kvp_seg_server *s, struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg);

/**
 * Answer one RdmaHello offer on loop 0 (loop 0's own connections call it directly; the others
 * forward it by SEG_MSG_RDMA_HELLO). As kvp_seg_rdma_accept, with s->rdma (NULL: UNSUPPORTED),
 * except that an offer read at fence epoch `epoch` whose writer (client_id, conn_generation) a
 * fence run since then covered is refused with KVP_ERR_BUSY and no answer: its QPs would outlive
 * that fence. The writer connects again (a new hello, read after the fence).
 */
int kvp_seg_rdma_loop_hello(struct kvp_seg_server *s, const uint8_t *offer, size_t len, uint64_t epoch,
                            uint8_t **answer, size_t *answer_len);

/** Loop 0's fini: fence every writer, deregister and close the RDMA side (NULL: nothing). */
void kvp_seg_rdma_loop_fini(struct kvp_seg_server *s);

#endif
