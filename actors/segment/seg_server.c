/*
 * seg_server.c — the TCP data plane of one segment (see seg_server.h, docs/data-plane.md).
 *
 * Actors: KVP_SEG_LOOPS threaded runtime actors ("seg-loop-N"), each owning an epoll set and
 * the connections in it; nothing else touches a connection. Loop 0 also owns the listen
 * sockets: it accepts and hands each new socket to a loop, round robin, by message
 * (SEG_MSG_CONN; to itself directly). A loop closing a connection tells loop 0 (SEG_MSG_GONE),
 * which keeps the count behind the per-segment connection cap. Loop 0 also owns the segment id
 * the loops check (its only writer) and, with protocol=rdma, the RDMA side: mount changes,
 * FenceWriter and the RDMA handshakes of every loop reach it by message (seg_server_rdma.c).
 * Every socket is non-blocking;
 * a loop never waits on one connection, so idle connections cost memory (a struct and, only
 * while bytes are buffered, a receive buffer), not threads, and a peer that stalls mid-frame
 * delays nobody (it is dropped after KVP_SEG_STALL_MS without progress).
 *
 * A connection serves its requests in order, so responses leave in request order. Payload
 * bytes move straight between the socket and the region: WRITE payloads are received into
 * base+offset, READ responses go out with one sendmsg of [header, region bytes].
 *
 * Stop: every loop actor is stopped (its fini closes its connections and epoll set), then
 * the listen sockets are closed and the server freed.
 */
#define _GNU_SOURCE
#include "actors/segment/seg_server.h"

#include <czmq.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "actors/segment/seg_rdma.h"
#include "actors/segment/seg_server_internal.h"
#include "actors/segment/segment_internal.h"
#include "auth/auth.h"
#include "auth/auth_token.h"
#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "wire/envelope.h"

#define ACTOR "seg-server"

/*
 * The region is written and read by several loops. Their order is set by the clients (a client
 * sends a READ only after its WRITE was answered), i.e. through sockets that ThreadSanitizer
 * cannot follow. In TSan builds every region access acquires/releases one sync object, which
 * tells TSan about that order; other builds compile this away.
 */
#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define REGION_ACQUIRE(s) __tsan_acquire(&(s)->region_sync)
#define REGION_RELEASE(s) __tsan_release(&(s)->region_sync)
#else
#define REGION_ACQUIRE(s) ((void)(s))
#define REGION_RELEASE(s) ((void)(s))
#endif

static inline void ctr_add(_Atomic uint64_t *c, uint64_t v)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v, memory_order_relaxed);
}

static int result_index(int st)
{
    switch (st) {
    case KVP_OK: return 0;
    case KVP_ERR_NOT_FOUND: return 1;
    case KVP_ERR_INVALID: return 2;
    case KVP_ERR_TIMEOUT: return 3;
    default: return 4;
    }
}

const char *const kvp_seg_op_names[KVP_SEG_OPS] = {"read", "write", "ping"};
const char *const kvp_seg_result_names[KVP_SEG_RESULTS] = {"ok", "not_found", "invalid", "deadline_passed",
                                                           "other"};

/* What an epoll event points to: a listen socket or a connection (first member of both). */
enum { EP_LISTEN = 1, EP_CONN = 2 };
struct seg_ep {
    int kind;
    int fd;
};

/*
 * Responses of one connection waiting to go out. A client pipelines many requests; the loop
 * answers into this queue while more requests are buffered and sends them together (one
 * sendmsg) when none is left, when OUT_FLUSH answers or OUT_FLUSH_BYTES are queued, and before
 * a WRITE payload is received while a READ answer is queued (READ payloads stay in the region
 * until sent; that flush keeps a READ from seeing a later WRITE of its connection). A send the
 * kernel takes only in part leaves the rest here (EPOLLOUT). At OUT_MAX answers or
 * KVP_SEG_CONN_INFLIGHT_BYTES unsent the loop stops reading the connection's requests until
 * the peer has taken them all: the per-connection cap on bytes in flight.
 */
#define OUT_MAX 64
#define OUT_FLUSH 32
#define OUT_FLUSH_BYTES (1u << 20)

struct out_q {
    uint8_t hdr[OUT_MAX][KVP_FRAME_HEADER_BYTES];
    struct iovec iov[2 * OUT_MAX];
    int n;      /* answers queued */
    int iovcnt; /* iovecs used */
    int head;   /* first iovec not yet (fully) sent */
    uint64_t bytes; /* unsent bytes */
    bool region;    /* some iovec points into the region (TSan annotation; WRITE ordering) */
};

/* Request headers (and the payloads of small WRITEs) are read through a buffer: one recv takes
 * every header a pipelining client has queued. A connection holds one only while it has
 * buffered bytes (a partial header is kept in the connection itself): idle ones hold none. */
#define IN_BYTES (64u * 1024u)
#define IN_CACHE 16 /* empty buffers (and out queues) a loop keeps for reuse */

/* What a connection is doing. ST_TOKEN: the challenge went out, the token response is awaited
 * (only when the server requires tokens); no request byte is read before it passes. */
enum { ST_HDR = 0, ST_PAYLOAD = 1, ST_DRAIN = 2, ST_HELLO = 3 /* an RDMA_HELLO's offer into hello */,
       ST_TOKEN = 4 };

/* The token handshake of one connection (held only while st == ST_TOKEN). */
struct seg_hs {
    bool sent; /* the challenge went out; false while the segment has no id yet (challenge_send) */
    uint8_t challenge[KVP_DT_CHALLENGE_BYTES];
    uint8_t resp[KVP_DT_RESPONSE_MAX];
    size_t n; /* response bytes received */
};

struct seg_conn {
    struct seg_ep ep; /* first */
    struct seg_loop *loop;
    struct seg_conn *prev, *next;
    uint32_t events; /* what epoll watches for it now */
    uint8_t *in;     /* receive buffer or NULL; unread bytes are in[off, len) */
    size_t off, len;
    uint8_t part[KVP_FRAME_HEADER_BYTES]; /* a partial header while no buffer is held */
    size_t npart;
    bool short_read; /* the last recv into the buffer got less than it asked: socket drained */
    int st;          /* ST_*: what the next bytes are */
    struct kvp_frame cur; /* ST_PAYLOAD / ST_DRAIN: the WRITE whose payload comes */
    uint64_t got;         /* payload bytes taken so far */
    int cur_status;       /* the WRITE's answer status */
    bool wait_out;        /* read no request bytes until the out queue is empty */
    bool capped;          /* the in-flight cap was logged for this connection */
    struct out_q *out;    /* NULL while nothing is queued */
    struct seg_hs *hs;    /* ST_TOKEN only */
    uint64_t progress_ms; /* monotonic time of the last byte in or out */
    char peer[64];
    uint8_t *hello;       /* ST_HELLO: the offer; then the answer until the next hello or close */
    bool hello_wait;      /* the offer went to loop 0 (hello_done): read nothing until it answers */
    uint64_t hello_corr;  /* that request's correlation id */
    uint64_t hello_epoch; /* the server's fence epoch when the hello's header was read */
};

struct seg_loop {
    struct kvp_seg_server *srv;
    int idx;
    struct kvp_rt_ctx *ctx; /* the running callback's (set on entry to each; used only inside) */
    struct seg_counters *ctr; /* &srv->ctr[idx] */
    int epfd;
    struct seg_conn *conns; /* every connection of this loop (doubly linked) */
    unsigned nconns;
    uint8_t *cache[IN_CACHE]; /* empty receive buffers */
    int ncache;
    struct out_q *ocache[IN_CACHE]; /* empty out queues */
    int nocache;
    uint8_t *scratch; /* drains refused or late WRITE payloads (KVP_SEG_SCRATCH_BYTES) */
    /* loop 0 only: the listen sockets and the connection count of the whole server */
    struct seg_ep lep[KVP_SEG_MAX_LISTEN];
    unsigned live;
    unsigned next_loop;
    bool accept_paused;
    uint64_t refused, refused_logged_ms;
    struct kvp_auth_ratelog token_log; /* token refusals: rate-limited per peer address */
    bool stopping; /* SEG_MSG_STOP came: loop_on_epoll returns after one pass */
};

/* Send a message to loop `to` (the runtime's mailbox wakes it: the loop never waits elsewhere). */
static int loop_send(struct kvp_seg_server *s, int to, uint32_t type, uint64_t arg, void **payload,
                     kvp_rt_free_fn free_fn)
{
    return kvp_rt_send(s->loops[to], 0, type, arg, payload, free_fn);
}

/* A socket handed to a loop (SEG_MSG_CONN). */
struct seg_newconn {
    int fd;
    char peer[64];
};

static void newconn_free(void *p)
{
    struct seg_newconn *nc = p;
    if (nc && nc->fd >= 0)
        close(nc->fd);
    free(nc);
}

int kvp_seg_strip_brackets(const char *host, char *buf, size_t cap)
{
    size_t n = strlen(host);
    if (n > 0 && host[0] == '[') {
        if (n < 2 || host[n - 1] != ']')
            return -1;
        host++;
        n -= 2;
    }
    if (n + 1 > cap)
        return -1;
    memcpy(buf, host, n);
    buf[n] = '\0';
    return 0;
}

int kvp_seg_format_endpoint(char *buf, size_t cap, const char *host, uint32_t port)
{
    if (strchr(host, ':') && host[0] != '[')
        return snprintf(buf, cap, "[%s]:%u", host, port);
    return snprintf(buf, cap, "%s:%u", host, port);
}

static void addr_to_string(const struct sockaddr *sa, char *buf, size_t cap)
{
    char h[INET6_ADDRSTRLEN + 8] = "?";
    char p[16] = "?";
    getnameinfo(sa, sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in),
                h, sizeof h, p, sizeof p, NI_NUMERICHOST | NI_NUMERICSERV);
    kvp_seg_format_endpoint(buf, cap, h, (uint32_t)atoi(p));
}

/* ------------------------------------------------------------------ one connection */

static void conn_close(struct seg_conn *c, bool gone_msg);

/* 0 when the request may touch the region, else the error code for the reply. */
static int check_request(const struct kvp_seg_server *s, const struct kvp_frame *f)
{
    uint32_t id = atomic_load_explicit(&s->segment_id, memory_order_relaxed);
    if (id == 0 || f->segment_id != id)
        return KVP_ERR_NOT_FOUND;
    if (f->offset > s->size || f->length > s->size - f->offset)
        return KVP_ERR_INVALID;
    return KVP_OK;
}

static bool out_pending(const struct seg_conn *c) { return c->out && c->out->n > 0; }

/* The out queue is at the in-flight cap: read no more requests until it drains. */
static bool out_full(const struct seg_conn *c)
{
    return c->out && (c->out->n >= OUT_MAX || c->out->bytes >= KVP_SEG_CONN_INFLIGHT_BYTES);
}

/* Send what the kernel takes of the out queue without waiting. Returns 0 (the queue is empty
 * now, or the kernel is full: EPOLLOUT will call again) or -1 (the connection failed). */
static int out_flush(struct seg_conn *c)
{
    struct out_q *o = c->out;
    struct kvp_seg_server *s = c->loop->srv;
    while (o && o->n > 0) {
        int cnt = o->iovcnt - o->head;
        struct msghdr m = {.msg_iov = o->iov + o->head, .msg_iovlen = (size_t)(cnt > 1024 ? 1024 : cnt)};
        ssize_t r = sendmsg(c->ep.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -1;
        }
        c->progress_ms = kvp_clock_now_ms();
        size_t left = (size_t)r;
        o->bytes -= left;
        while (o->head < o->iovcnt && left >= o->iov[o->head].iov_len) {
            left -= o->iov[o->head].iov_len;
            o->head++;
        }
        if (o->head < o->iovcnt) {
            o->iov[o->head].iov_base = (uint8_t *)o->iov[o->head].iov_base + left;
            o->iov[o->head].iov_len -= left;
            continue; /* the kernel took part: the next try says EAGAIN or takes more */
        }
        if (o->region)
            REGION_RELEASE(s);
        o->n = o->iovcnt = o->head = 0;
        o->bytes = 0;
        o->region = false;
        /* Empty: back to the loop, so idle connections hold no queue. */
        struct seg_loop *l = c->loop;
        if (l->nocache < IN_CACHE)
            l->ocache[l->nocache++] = o;
        else
            free(o);
        c->out = o = NULL;
    }
    return 0;
}

/* Queue an answer; a READ's payload points into the region. Flushes at the flush marks. */
static int out_add(struct seg_conn *c, uint8_t op, int status, const struct kvp_frame *req,
                   uint64_t length, const void *payload)
{
    if (c->out && c->out->n == OUT_MAX) { /* not reached: callers stop at out_full */
        if (out_flush(c) != 0)
            return -1;
        if (c->out)
            return -1;
    }
    if (!c->out) {
        struct seg_loop *l = c->loop;
        c->out = l->nocache > 0 ? l->ocache[--l->nocache] : calloc(1, sizeof *c->out);
        if (!c->out)
            return -1;
    }
    struct out_q *o = c->out;
    struct kvp_frame f = {.op = op,
                          .status = (int16_t)status,
                          .segment_id = req->segment_id,
                          .req_id = req->req_id,
                          .offset = req->offset,
                          .length = length};
    kvp_frame_encode(&f, o->hdr[o->n]);
    o->iov[o->iovcnt++] = (struct iovec){o->hdr[o->n], KVP_FRAME_HEADER_BYTES};
    o->bytes += KVP_FRAME_HEADER_BYTES;
    if (payload && length) {
        /* Each queued payload acquires (TSan builds): one acquired for an earlier answer still in
         * the queue predates the WRITE that this READ follows, and TSan then saw no order. */
        REGION_ACQUIRE(c->loop->srv);
        o->region = true;
        o->iov[o->iovcnt++] = (struct iovec){(void *)payload, length};
        o->bytes += length;
    }
    o->n++;
    if (o->n >= OUT_FLUSH || o->bytes >= OUT_FLUSH_BYTES)
        return out_flush(c);
    return 0;
}

static size_t in_avail(const struct seg_conn *c) { return c->in ? c->len - c->off : 0; }

/* Give the receive buffer back to the loop once empty; a partial header moves into c->part. */
static void in_release(struct seg_conn *c)
{
    if (!c->in)
        return;
    size_t n = c->len - c->off;
    if (n >= KVP_FRAME_HEADER_BYTES)
        return; /* a whole request is still buffered */
    memcpy(c->part, c->in + c->off, n);
    c->npart = n;
    struct seg_loop *l = c->loop;
    if (l->ncache < IN_CACHE)
        l->cache[l->ncache++] = c->in;
    else
        free(c->in);
    c->in = NULL;
    c->off = c->len = 0;
}

/* recv into the buffer without waiting. Returns 1 (got bytes), 0 (nothing there), -1 (EOF:
 * errno 0, or error). */
static int in_fill(struct seg_conn *c)
{
    if (!c->in) {
        struct seg_loop *l = c->loop;
        c->in = l->ncache > 0 ? l->cache[--l->ncache] : malloc(IN_BYTES);
        if (!c->in)
            return -1;
        memcpy(c->in, c->part, c->npart);
        c->off = 0;
        c->len = c->npart;
        c->npart = 0;
    } else if (c->off > 0) {
        memmove(c->in, c->in + c->off, c->len - c->off);
        c->len -= c->off;
        c->off = 0;
    }
    for (;;) {
        size_t room = IN_BYTES - c->len;
        ssize_t r = recv(c->ep.fd, c->in + c->len, room, MSG_DONTWAIT);
        if (r > 0) {
            c->len += (size_t)r;
            c->short_read = (size_t)r < room;
            c->progress_ms = kvp_clock_now_ms();
            return 1;
        }
        if (r == 0) {
            errno = 0;
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        return -1;
    }
}

/* Copy up to len buffered bytes to dst (NULL: discard them). Returns how many. */
static size_t in_take(struct seg_conn *c, void *dst, uint64_t len)
{
    size_t n = in_avail(c) < len ? in_avail(c) : (size_t)len;
    if (dst && n)
        memcpy(dst, c->in + c->off, n);
    c->off += n;
    return n;
}

/* The WRITE in c->cur got all its payload: answer it. */
static int write_done(struct seg_conn *c)
{
    c->st = ST_HDR;
    ctr_add(&c->loop->ctr->req[1][result_index(c->cur_status)], 1);
    return out_add(c, KVP_FRAME_WRITE_RESP, c->cur_status, &c->cur, 0, NULL);
}

/* Answer the RDMA_HELLO in c->cur with `ans` (the encoded answer, taken; NULL: none could be
 * made, st says why) as payload, and read nothing more until it is sent (c->hello holds it). */
static int hello_answer(struct seg_conn *c, int st, uint8_t *ans, size_t alen)
{
    free(c->hello);
    c->hello = ans;
    if (st != KVP_OK)
        kvp_log_info(ACTOR, "%s: RDMA handshake for segment %u: %s", c->peer, c->cur.segment_id,
                     kvp_errname(st));
    if (out_add(c, KVP_FRAME_RDMA_HELLO_RESP, ans ? KVP_OK : st, &c->cur, alen, ans) != 0 ||
        out_flush(c) != 0)
        return -1;
    c->wait_out = out_pending(c);
    return 0;
}

/*
 * The RDMA_HELLO in c->cur got its offer. The RDMA side is loop 0's (seg_server_rdma.c): loop 0
 * answers at once; another loop forwards the offer to loop 0 and the connection reads nothing
 * more (hello_wait) until the answer comes back (hello_reply). No deadline on the forward: loop
 * 0 answers every request, or CLOSED when it stops.
 */
static int hello_done(struct seg_conn *c)
{
    c->st = ST_HDR;
    struct seg_loop *l = c->loop;
    if (l->idx == 0) {
        uint8_t *ans = NULL;
        size_t alen = 0;
        int st = kvp_seg_rdma_loop_hello(l->srv, c->hello, c->cur.length, c->hello_epoch, &ans, &alen);
        return hello_answer(c, st, ans, alen);
    }
    kvp_seg_hello_hook hold = atomic_load_explicit(&l->srv->hello_hold, memory_order_acquire);
    if (hold) /* tests only: hold the hello here (kvp_seg_server_test_hold_hellos) */
        hold(atomic_load_explicit(&l->srv->hello_hold_arg, memory_order_acquire));
    /* The offer with the epoch it was read at: loop 0 refuses it if a fence since covered its
     * writer (seg_server_rdma.c). One copy of at most 64 KiB per handshake. */
    struct seg_hello_req *h = malloc(sizeof *h + c->cur.length);
    if (!h)
        return hello_answer(c, KVP_ERR_NOMEM, NULL, 0);
    h->epoch = c->hello_epoch;
    h->len = c->cur.length;
    memcpy(h->offer, c->hello, c->cur.length);
    void *p = h;
    int rc = kvp_rt_request(l->ctx, l->srv->loops[0], 0, SEG_MSG_RDMA_HELLO, c->cur.length, &p, NULL, 0,
                            &c->hello_corr);
    free(p); /* NULL when sent */
    if (rc != KVP_OK) /* loop 0 closed (stopping) or out of memory */
        return hello_answer(c, rc, NULL, 0);
    free(c->hello);
    c->hello = NULL;
    c->hello_wait = true;
    ctr_add(&l->ctr->rdma_hellos_fwd, 1);
    return out_flush(c); /* the answers queued before the hello go out meanwhile */
}

/*
 * Take WRITE payload bytes: buffered ones first, then straight from the socket into the region
 * (or into scratch when draining). The write deadline (contract C3, docs/fencing.md) is checked
 * before every copy into the region: past it, the rest is drained and the answer is TIMEOUT,
 * so no byte lands in the region after the deadline, give or take the one recv that copies
 * bytes already queued. Returns 1 (payload complete), 0 (the socket has no more now; *budget
 * may be spent), -1 (connection failed).
 */
static int take_payload(struct seg_conn *c, uint64_t *budget)
{
    struct seg_loop *l = c->loop;
    struct kvp_seg_server *s = l->srv;
    while (c->got < c->cur.length) {
        uint64_t want = c->cur.length - c->got;
        if (c->st == ST_PAYLOAD && c->cur.deadline &&
            kvp_frame_deadline_passed(c->cur.deadline, kvp_clock_wall_ms())) {
            /* The writer's call is over; the master may have given this space to another
             * object. Late bytes land nowhere (C3). */
            kvp_log_warn(ACTOR, "%s: WRITE seg %u off %lu len %lu arrived past its deadline: "
                         "%lu bytes landed before it, the rest drained",
                         c->peer, c->cur.segment_id, (unsigned long)c->cur.offset,
                         (unsigned long)c->cur.length, (unsigned long)c->got);
            c->st = ST_DRAIN;
            c->cur_status = KVP_ERR_TIMEOUT;
        }
        if (in_avail(c) > 0) { /* came in with the header */
            if (c->st == ST_HELLO) {
                c->got += in_take(c, c->hello + c->got, want);
            } else if (c->st == ST_PAYLOAD) {
                REGION_ACQUIRE(s);
                size_t took = in_take(c, s->base + c->cur.offset + c->got, want);
                REGION_RELEASE(s);
                c->got += took;
                ctr_add(&l->ctr->bytes_written, took);
            } else {
                c->got += in_take(c, NULL, want);
            }
            continue;
        }
        if (*budget == 0)
            return 0;
        uint8_t *dst;
        if (c->st == ST_HELLO) {
            dst = c->hello + c->got;
        } else if (c->st == ST_PAYLOAD) {
            dst = s->base + c->cur.offset + c->got;
        } else {
            if (!l->scratch && !(l->scratch = malloc(KVP_SEG_SCRATCH_BYTES)))
                return -1;
            dst = l->scratch;
            if (want > KVP_SEG_SCRATCH_BYTES)
                want = KVP_SEG_SCRATCH_BYTES;
        }
        if (want > *budget)
            want = *budget;
        if (c->st == ST_PAYLOAD)
            REGION_ACQUIRE(s);
        ssize_t r = recv(c->ep.fd, dst, (size_t)want, MSG_DONTWAIT);
        if (c->st == ST_PAYLOAD)
            REGION_RELEASE(s);
        if (r > 0) {
            c->got += (uint64_t)r;
            if (c->st == ST_PAYLOAD)
                ctr_add(&l->ctr->bytes_written, (uint64_t)r);
            *budget -= (uint64_t)r < *budget ? (uint64_t)r : *budget;
            c->progress_ms = kvp_clock_now_ms();
            if ((uint64_t)r < want)
                return 0; /* the socket is drained */
            continue;
        }
        if (r == 0) {
            errno = 0;
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        return -1;
    }
    return 1;
}

/* Bytes of socket input one connection may take per event, so that a fast sender does not keep
 * a loop from the others (level-triggered epoll brings it back). */
#define SERVE_BUDGET (4u << 20)

/*
 * Serve what a connection has: parse buffered requests, answer them, take WRITE payloads, read
 * more from the socket while it has some (within SERVE_BUDGET). Never waits. Returns 0, or -1
 * when the connection must be closed (logged here when it is the peer's fault).
 */
/* Refuse a connection at the token check: count, and log naming the peer (rate-limited). */
static void token_refuse(struct seg_conn *c, const char *why)
{
    struct seg_loop *l = c->loop;
    ctr_add(&l->ctr->token_refused, 1);
    uint64_t held = 0;
    if (kvp_auth_ratelog_allow(&l->token_log, c->peer, kvp_clock_now_ms(), &held))
        kvp_log_warn(ACTOR, "auth: refused data connection from %s: %s (%llu similar lines held back)", c->peer,
                     why, (unsigned long long)held);
}

/*
 * ST_TOKEN: take the token response without waiting (only its own bytes: requests pipelined
 * behind it stay in the socket for conn_serve), then check it (auth_token.h). Returns 1 (passed:
 * st is ST_HDR), 0 (more bytes needed), -1 (refused or failed: close).
 */
static int conn_token(struct seg_conn *c)
{
    struct seg_hs *h = c->hs;
    if (!h->sent) {
        /* The challenge is held (no id yet): a peer speaks only after it, so any byte now is
         * refused; EOF closes quietly. */
        uint8_t b;
        ssize_t r = recv(c->ep.fd, &b, 1, MSG_DONTWAIT);
        if (r > 0)
            token_refuse(c, "sent bytes before the segment's challenge");
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return 0;
        errno = 0;
        return -1;
    }
    for (;;) {
        int total = kvp_dt_response_length(h->resp, h->n);
        if (total < 0) {
            token_refuse(c, "no token (garbage or a request before the handshake)");
            errno = 0;
            return -1;
        }
        size_t want = total == 0 ? KVP_DT_RESPONSE_HEAD : (size_t)total;
        if (h->n == want)
            break;
        ssize_t r = recv(c->ep.fd, h->resp + h->n, want - h->n, MSG_DONTWAIT);
        if (r > 0) {
            h->n += (size_t)r;
            c->progress_ms = kvp_clock_now_ms();
            continue;
        }
        if (r == 0) {
            if (h->n > 0)
                token_refuse(c, "closed in the middle of the token handshake");
            errno = 0;
            return -1;
        }
        if (errno == EINTR)
            continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
    struct kvp_seg_server *s = c->loop->srv;
    const char *why = NULL;
    struct kvp_dt_claims cl;
    int rc = kvp_dt_verify(h->challenge, h->resp, h->n, atomic_load_explicit(&s->segment_id, memory_order_relaxed),
                           kvp_clock_wall_ms(), (const uint8_t(*)[KVP_DT_PK_BYTES])s->token_pks, s->n_token_pks,
                           &cl, &why);
    if (rc != KVP_OK) {
        token_refuse(c, why);
        errno = 0;
        return -1;
    }
    kvp_log_debug(ACTOR, "%s: token accepted (tenant '%s', expires at %llu ms)", c->peer, cl.tenant,
                  (unsigned long long)cl.expires_ms);
    free(c->hs);
    c->hs = NULL;
    c->st = ST_HDR;
    return 1;
}

static int conn_serve(struct seg_conn *c)
{
    struct kvp_seg_server *s = c->loop->srv;
    uint64_t budget = SERVE_BUDGET;
    if (c->st == ST_TOKEN) {
        int r = conn_token(c);
        if (r <= 0)
            return r;
    }
    for (;;) {
        if (c->hello_wait)
            return 0; /* hello_reply brings us back */
        if (c->wait_out) {
            if (out_pending(c))
                return 0; /* EPOLLOUT brings us back */
            c->wait_out = false;
        }
        if (c->st != ST_HDR) {
            int r = take_payload(c, &budget);
            if (r < 0)
                return -1;
            if (r == 0)
                return out_flush(c);
            if ((c->st == ST_HELLO ? hello_done(c) : write_done(c)) != 0)
                return -1;
            continue;
        }
        if (out_full(c)) {
            if (out_flush(c) != 0)
                return -1;
            if (out_full(c)) {
                if (!c->capped) {
                    c->capped = true;
                    kvp_log_info(ACTOR, "%s: %d answers (%lu bytes) not yet taken by the peer: "
                                 "reading its requests paused until it takes them (cap %d answers, "
                                 "%u bytes per connection; logged once per connection)",
                                 c->peer, c->out->n, (unsigned long)c->out->bytes, OUT_MAX,
                                 KVP_SEG_CONN_INFLIGHT_BYTES);
                }
                c->wait_out = true;
                return 0;
            }
        }
        if (in_avail(c) < KVP_FRAME_HEADER_BYTES) {
            /* After a short recv the socket was drained: answer now rather than look again. */
            if ((out_pending(c) && c->short_read) || budget == 0) {
                c->short_read = false;
                in_release(c);
                return out_flush(c);
            }
            int r = in_fill(c);
            if (r < 0)
                return -1;
            if (r == 0) {
                in_release(c);
                return out_flush(c);
            }
            budget -= c->len < budget ? c->len : budget;
            continue;
        }
        uint8_t hdr[KVP_FRAME_HEADER_BYTES];
        in_take(c, hdr, KVP_FRAME_HEADER_BYTES);
        struct kvp_frame f;
        int rc = kvp_frame_decode(hdr, &f);
        if (rc == KVP_OK && f.op != KVP_FRAME_READ && f.op != KVP_FRAME_WRITE && f.op != KVP_FRAME_PING &&
            (f.op != KVP_FRAME_RDMA_HELLO || f.length == 0 || f.length > KVP_FRAME_RDMA_HELLO_MAX))
            rc = KVP_ERR_MALFORMED;
        if (rc != KVP_OK) {
            ctr_add(&c->loop->ctr->bad_frames, 1);
            kvp_log_warn(ACTOR, "%s: bad frame header (%s, op %u): closing the connection", c->peer,
                         kvp_errname(rc), hdr[5]);
            (void)out_flush(c); /* the requests before it are answered, as far as the kernel takes them */
            return -1;
        }
        if (f.op == KVP_FRAME_RDMA_HELLO) { /* answered by hello_done (loop 0's RDMA side) */
            free(c->hello);
            if (!(c->hello = malloc(f.length)))
                return -1;
            c->cur = f;
            c->got = 0;
            c->st = ST_HELLO;
            /* read now: a fence loop 0 runs from here on is later than this hello */
            c->hello_epoch = atomic_load_explicit(&s->rdma_fence_epoch, memory_order_acquire);
            continue;
        }
        int st = check_request(s, &f);
        if (f.op == KVP_FRAME_PING) {
            ctr_add(&c->loop->ctr->req[2][result_index(st == KVP_ERR_NOT_FOUND ? st : KVP_OK)], 1);
            if (out_add(c, KVP_FRAME_PONG, st == KVP_ERR_NOT_FOUND ? st : KVP_OK, &f, 0, NULL) != 0)
                return -1;
        } else if (f.op == KVP_FRAME_READ) {
            if (st != KVP_OK)
                kvp_log_debug(ACTOR, "%s: READ seg %u off %lu len %lu: %s", c->peer, f.segment_id,
                              (unsigned long)f.offset, (unsigned long)f.length, kvp_errname(st));
            ctr_add(&c->loop->ctr->req[0][result_index(st)], 1);
            if (st == KVP_OK)
                ctr_add(&c->loop->ctr->bytes_read, f.length);
            if (out_add(c, KVP_FRAME_READ_RESP, st, &f, st == KVP_OK ? f.length : 0,
                        st == KVP_OK ? s->base + f.offset : NULL) != 0)
                return -1;
        } else { /* WRITE */
            c->cur = f;
            c->got = 0;
            c->cur_status = st;
            c->st = st == KVP_OK ? ST_PAYLOAD : ST_DRAIN;
            if (st != KVP_OK)
                kvp_log_debug(ACTOR, "%s: WRITE seg %u off %lu len %lu: %s (payload drained)", c->peer,
                              f.segment_id, (unsigned long)f.offset, (unsigned long)f.length,
                              kvp_errname(st));
            /* A queued READ answer still points into the region: send it before this payload
             * can overwrite its bytes. WRITE answers stay queued. */
            if (c->out && c->out->region) {
                if (out_flush(c) != 0)
                    return -1;
                if (out_pending(c))
                    c->wait_out = true;
            }
        }
    }
}

/* Make epoll watch what the connection needs now. */
static int conn_arm(struct seg_conn *c)
{
    uint32_t want = (c->wait_out || c->hello_wait ? 0 : EPOLLIN) | (out_pending(c) ? EPOLLOUT : 0);
    if (want == c->events)
        return 0;
    struct epoll_event ev = {.events = want, .data.ptr = &c->ep};
    if (epoll_ctl(c->loop->epfd, EPOLL_CTL_MOD, c->ep.fd, &ev) != 0)
        return -1;
    c->events = want;
    return 0;
}

static void conn_event(struct seg_conn *c, uint32_t events)
{
    if ((events & EPOLLOUT) && out_flush(c) != 0) {
        kvp_log_debug(ACTOR, "%s: send: %s", c->peer, strerror(errno));
        conn_close(c, true);
        return;
    }
    if (conn_serve(c) != 0 || conn_arm(c) != 0) {
        if (errno != 0)
            kvp_log_debug(ACTOR, "%s: %s", c->peer, strerror(errno));
        conn_close(c, true);
    }
}

/* Close and free a connection. gone_msg: tell loop 0 (not at stop). */
static void conn_close(struct seg_conn *c, bool gone_msg)
{
    struct seg_loop *l = c->loop;
    if (c->out && c->out->region)
        REGION_RELEASE(l->srv);
    close(c->ep.fd); /* also leaves the epoll set */
    if (c->prev)
        c->prev->next = c->next;
    else
        l->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    l->nconns--;
    atomic_store_explicit(&l->ctr->conns_open, l->nconns, memory_order_relaxed);
    free(c->in);
    free(c->out);
    free(c->hello);
    free(c->hs);
    kvp_log_debug(ACTOR, "%s: closed", c->peer);
    free(c);
    if (!gone_msg)
        return;
    if (l->idx == 0)
        l->live--;
    else
        (void)kvp_rt_send(l->srv->loops[0], 0, SEG_MSG_GONE, 1, NULL, NULL); /* loop 0 closed: stopping */
}

/*
 * Send c's token challenge, naming the segment's id as it is now. While the segment has no id
 * (started and not yet mounted, or fenced after a stall until the master confirms it) the
 * challenge is held and sent when set_id gives it one (SEG_MSG_ID): the master may place a
 * replica here and a client connect in the moment between the master committing the mount and
 * this process applying the mount's answer, and a challenge naming segment 0 would fail that
 * client's first transfer ("no data token for this segment"). A held connection that never gets
 * an id is dropped by sweep_stalled after KVP_SEG_STALL_MS. Returns false if the send failed.
 */
static bool challenge_send(struct seg_conn *c)
{
    uint32_t id = atomic_load_explicit(&c->loop->srv->segment_id, memory_order_relaxed);
    if (id == 0) {
        kvp_log_debug(ACTOR, "%s: token challenge held until the segment has an id", c->peer);
        return true;
    }
    kvp_dt_challenge(id, c->hs->challenge);
    c->hs->sent = true;
    c->progress_ms = kvp_clock_now_ms();
    /* A fresh socket's send buffer takes the 44 bytes whole. */
    return send(c->ep.fd, c->hs->challenge, KVP_DT_CHALLENGE_BYTES, MSG_DONTWAIT | MSG_NOSIGNAL) ==
           (ssize_t)KVP_DT_CHALLENGE_BYTES;
}

/* SEG_MSG_ID: the challenges held while the segment had no id go out now. */
static void challenges_release(struct seg_loop *l)
{
    struct seg_conn *c = l->conns;
    while (c) {
        struct seg_conn *next = c->next;
        if (c->st == ST_TOKEN && c->hs && !c->hs->sent && !challenge_send(c)) {
            kvp_log_warn(ACTOR, "%s: could not send the token challenge: connection closed", c->peer);
            conn_close(c, true);
        }
        c = next;
    }
}

/* Start serving a socket in this loop. Takes fd. */
static void conn_add(struct seg_loop *l, int fd, const char *peer)
{
    struct seg_conn *c = calloc(1, sizeof *c);
    if (!c) {
        kvp_log_warn(ACTOR, "%s: out of memory: connection closed", peer);
        close(fd);
        if (l->idx == 0)
            l->live--;
        else
            (void)kvp_rt_send(l->srv->loops[0], 0, SEG_MSG_GONE, 1, NULL, NULL);
        return;
    }
    c->ep = (struct seg_ep){EP_CONN, fd};
    c->loop = l;
    c->events = EPOLLIN;
    c->progress_ms = kvp_clock_now_ms();
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    c->next = l->conns;
    if (l->conns)
        l->conns->prev = c;
    l->conns = c;
    l->nconns++;
    atomic_store_explicit(&l->ctr->conns_open, l->nconns, memory_order_relaxed);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c->ep};
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        kvp_log_warn(ACTOR, "%s: epoll: %s: connection closed", peer, strerror(errno));
        conn_close(c, true);
        return;
    }
    if (l->srv->n_token_pks > 0) {
        /* The challenge goes out first, at once (or when the segment gets its id). */
        c->hs = calloc(1, sizeof *c->hs);
        c->st = ST_TOKEN;
        if (!c->hs || !challenge_send(c)) {
            kvp_log_warn(ACTOR, "%s: could not send the token challenge: connection closed", peer);
            conn_close(c, true);
            return;
        }
    }
    kvp_log_debug(ACTOR, "%s: connected (loop %d)", peer, l->idx);
}

/* Drop connections that stalled mid-frame (a partial request, a WRITE payload not finished, or
 * answers the peer does not take) for KVP_SEG_STALL_MS. Idle connections stay (TCP keepalive
 * finds vanished peers). */
static void sweep_stalled(struct seg_loop *l, uint64_t skew_ms)
{
    uint64_t now = kvp_clock_now_ms() + skew_ms;
    struct seg_conn *c = l->conns;
    while (c) {
        struct seg_conn *next = c->next;
        bool mid = c->st != ST_HDR || c->npart > 0 || in_avail(c) > 0 || out_pending(c);
        if (mid && now - c->progress_ms >= KVP_SEG_STALL_MS) {
            kvp_log_warn(ACTOR, "%s: no progress for %u ms in the middle of a %s: connection dropped",
                         c->peer, (unsigned)(now - c->progress_ms),
                         out_pending(c) ? "answer the peer does not take" : "request");
            conn_close(c, true);
        }
        c = next;
    }
}

/* ------------------------------------------------------------------ accepting (loop 0) */

/* Stop or resume watching the listen sockets (out of descriptors: retried after a pause). */
static void accept_pause(struct kvp_rt_ctx *ctx, struct seg_loop *l, bool pause)
{
    for (int i = 0; i < l->srv->n_lfd; i++) {
        struct epoll_event ev = {.events = pause ? 0 : EPOLLIN, .data.ptr = &l->lep[i]};
        (void)epoll_ctl(l->epfd, EPOLL_CTL_MOD, l->lep[i].fd, &ev);
    }
    l->accept_paused = pause;
    if (pause)
        (void)kvp_rt_timer_start(ctx, KVP_SEG_ACCEPT_RETRY_MS, 0, SEG_MSG_REARM, NULL);
}

/* Refusals are logged at most once a second, with how many there were. */
static void log_refused(struct seg_loop *l, const char *peer, const char *why)
{
    l->refused++;
    uint64_t now = kvp_clock_now_ms();
    if (l->refused_logged_ms != 0 && now - l->refused_logged_ms < 1000)
        return;
    kvp_log_warn(ACTOR, "%s: refused: %s (%lu refused since the last such line)", peer, why,
                 (unsigned long)l->refused);
    l->refused = 0;
    l->refused_logged_ms = now;
}

static void accept_some(struct kvp_rt_ctx *ctx, struct seg_loop *l, int lfd)
{
    struct kvp_seg_server *s = l->srv;
    for (int k = 0; k < 64; k++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                kvp_log_warn(ACTOR, "accept: %s (%u connections): not accepting for %u ms", strerror(errno),
                             l->live, KVP_SEG_ACCEPT_RETRY_MS);
                accept_pause(ctx, l, true);
            } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
                kvp_log_warn(ACTOR, "accept: %s", strerror(errno));
            }
            return;
        }
        char peer[64];
        addr_to_string((struct sockaddr *)&ss, peer, sizeof peer);
        if (l->live >= KVP_SEG_MAX_CONNS) {
            char why[64];
            snprintf(why, sizeof why, "already %u connections", KVP_SEG_MAX_CONNS);
            log_refused(l, peer, why);
            ctr_add(&l->ctr->conns_refused, 1);
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        /* A client host that vanished (no FIN/RST) is detected in about a minute. */
        int idle = 30, intvl = 10, cnt = 3;
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
        l->live++;
        ctr_add(&l->ctr->conns_accepted, 1);
        unsigned to = l->next_loop++ % (unsigned)s->n_loops;
        if (to == 0) {
            conn_add(l, fd, peer);
            continue;
        }
        struct seg_newconn *nc = malloc(sizeof *nc);
        if (!nc) {
            close(fd);
            l->live--;
            continue;
        }
        nc->fd = fd;
        snprintf(nc->peer, sizeof nc->peer, "%s", peer);
        void *p = nc;
        if (loop_send(s, (int)to, SEG_MSG_CONN, 0, &p, newconn_free) != KVP_OK) {
            newconn_free(p); /* that loop is closing: the server is stopping */
            l->live--;
        }
    }
}

/* ------------------------------------------------------------------ the loop actor */

/* Passes over a full epoll batch before the callback returns to the runtime anyway. */
#define LOOP_PASSES 16

/*
 * Watch callback: the epoll set has events. It takes what is there without waiting (epoll_wait
 * with timeout 0), again while a pass filled the whole event array (at most LOOP_PASSES), and
 * returns: the loop waits only in the runtime's own poll, which for an actor that watches only
 * fds is one epoll_wait over its mailbox, its pipe and this set (runtime/actor.c), so a wake-up
 * costs one system call more than a loop of its own, not three (docs/runtime.md). Messages and
 * timers run between two calls of this callback.
 */
static int loop_on_epoll(struct kvp_rt_ctx *ctx, void *handle)
{
    (void)handle;
    struct seg_loop *l = kvp_rt_state(ctx);
    l->ctx = ctx;
    struct epoll_event ev[64];
    for (int pass = 0; pass < LOOP_PASSES; pass++) {
        int n = epoll_wait(l->epfd, ev, 64, 0);
        if (n < 0) {
            if (errno != EINTR)
                kvp_log_error(ACTOR, "loop %d: epoll_wait: %s", l->idx, strerror(errno));
            return KVP_OK;
        }
        for (int i = 0; i < n; i++) {
            struct seg_ep *ep = ev[i].data.ptr;
            if (ep->kind == EP_LISTEN) {
                if (!l->accept_paused)
                    accept_some(ctx, l, ep->fd);
            } else {
                conn_event((struct seg_conn *)ep, ev[i].events);
            }
        }
        if (n < 64 || l->stopping)
            return KVP_OK;
    }
    return KVP_OK;
}

static int loop_init(struct kvp_rt_ctx *ctx)
{
    struct seg_loop *l = kvp_rt_state(ctx);
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (l->epfd < 0) {
        kvp_log_error(ACTOR, "loop %d: epoll_create1: %s", l->idx, strerror(errno));
        return KVP_ERR_IO;
    }
    int rc = kvp_rt_watch_fd(ctx, l->epfd, loop_on_epoll);
    if (rc == KVP_OK)
        rc = kvp_rt_timer_start(ctx, KVP_SEG_SWEEP_MS, KVP_SEG_SWEEP_MS, SEG_MSG_SWEEP, NULL);
    return rc;
}

/* Loop 0's answer to a forwarded RDMA_HELLO (hello_done): answer the connection, if it is still
 * open, and serve what it pipelined behind the hello. */
static void hello_reply(struct seg_loop *l, struct kvp_rt_msg *msg)
{
    struct seg_conn *c = l->conns;
    while (c && !(c->hello_wait && c->hello_corr == msg->corr_id))
        c = c->next;
    if (!c)
        return; /* closed meanwhile: the runtime frees the answer */
    c->hello_wait = false;
    uint8_t *ans = kvp_rt_msg_take(msg); /* also with a refusal's status; NULL: CLOSED */
    if (hello_answer(c, msg->status, ans, ans ? (size_t)msg->arg : 0) != 0) {
        conn_close(c, true);
        return;
    }
    conn_event(c, 0);
}

static int loop_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct seg_loop *l = kvp_rt_state(ctx);
    l->ctx = ctx;
    if (msg->kind == KVP_RT_REPLY) {
        if (msg->type == SEG_MSG_RDMA_HELLO)
            hello_reply(l, msg);
        return KVP_OK;
    }
    switch (msg->type) {
    case SEG_MSG_CONN: {
        struct seg_newconn *nc = msg->payload;
        if (nc) {
            conn_add(l, nc->fd, nc->peer);
            nc->fd = -1; /* taken */
        }
        break;
    }
    case SEG_MSG_GONE:
        l->live -= (unsigned)msg->arg <= l->live ? (unsigned)msg->arg : l->live;
        break;
    case SEG_MSG_SWEEP: /* the timer (arg 0) or kvp_seg_server_sweep (arg: ms ahead) */
        sweep_stalled(l, msg->arg);
        break;
    case SEG_MSG_REARM:
        if (l->accept_paused)
            accept_pause(ctx, l, false);
        break;
    case SEG_MSG_STOP:
        l->stopping = true;
        break;
    case SEG_MSG_ID:
        challenges_release(l);
        break;
    case SEG_MSG_SET_ID:
    case SEG_MSG_RDMA_OPEN:
    case SEG_MSG_RDMA_FENCE:
    case SEG_MSG_RDMA_HELLO:
    case SEG_MSG_RDMA_QPS:
    case SEG_MSG_RDMA_FENCED:
        if (l->idx == 0) /* the RDMA side's owner (seg_server_rdma.c) */
            return kvp_seg_rdma_loop_msg(l->srv, ctx, msg);
        kvp_log_warn(ACTOR, "loop %d: RDMA message %u is loop 0's", l->idx, msg->type);
        break;
    case SEG_MSG_LISTEN:
        /* Sent once every loop is spawned, so s->loops[] and s->n_loops are complete (and seen:
         * the message orders them) before the first accept hands a socket to another loop. */
        for (int i = 0; i < l->srv->n_lfd; i++) {
            l->lep[i] = (struct seg_ep){EP_LISTEN, l->srv->lfd[i]};
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &l->lep[i]};
            if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->srv->lfd[i], &ev) != 0) {
                kvp_log_error(ACTOR, "epoll add listen socket: %s", strerror(errno));
                return KVP_ERR_IO;
            }
        }
        break;
    default:
        kvp_log_warn(ACTOR, "loop %d: unknown message %u", l->idx, msg->type);
        break;
    }
    return KVP_OK;
}

static void loop_fini(struct kvp_rt_ctx *ctx)
{
    struct seg_loop *l = kvp_rt_state(ctx);
    while (l->conns)
        conn_close(l->conns, false);
    if (l->idx == 0)
        kvp_seg_rdma_loop_fini(l->srv); /* the RDMA side is loop 0's: fence, deregister, close */
    for (int i = 0; i < l->ncache; i++)
        free(l->cache[i]);
    for (int i = 0; i < l->nocache; i++)
        free(l->ocache[i]);
    free(l->scratch);
    if (l->epfd >= 0)
        close(l->epfd);
    free(l);
}

/* ------------------------------------------------------------------ listening */

static int listen_on(struct kvp_seg_server *s, const char *host, uint32_t port)
{
    char h[256];
    if (kvp_seg_strip_brackets(host ? host : "", h, sizeof h) != 0) {
        kvp_log_error(ACTOR, "listen: bad host '%s'", host);
        return KVP_ERR_INVALID;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    char ps[16];
    snprintf(ps, sizeof ps, "%u", port);
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(h[0] ? h : NULL, ps, &hints, &ai);
    if (g != 0) {
        kvp_log_error(ACTOR, "listen: cannot resolve '%s': %s", h, gai_strerror(g));
        return KVP_ERR_INVALID;
    }
    int err = KVP_ERR_IO;
    bool in_use = false; /* the first address failed with EADDRINUSE: the caller may retry */
    for (struct addrinfo *a = ai; a && s->n_lfd < KVP_SEG_MAX_LISTEN; a = a->ai_next) {
        /* Every address after the first binds the port the first one got. */
        if (s->n_lfd > 0) {
            if (a->ai_family == AF_INET)
                ((struct sockaddr_in *)a->ai_addr)->sin_port = htons((uint16_t)s->port);
            else if (a->ai_family == AF_INET6)
                ((struct sockaddr_in6 *)a->ai_addr)->sin6_port = htons((uint16_t)s->port);
        }
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (a->ai_family == AF_INET6)
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
            int e = errno;
            char as[96];
            addr_to_string(a->ai_addr, as, sizeof as);
            if (s->n_lfd == 0 && e == EADDRINUSE && a == ai)
                in_use = true; /* logged by the caller's retry (kvp_retry_start), once per try */
            else if (s->n_lfd == 0)
                kvp_log_warn(ACTOR, "listen on %s: %s", as, strerror(e));
            else
                kvp_log_info(ACTOR, "listen on %s: %s (serving the other addresses)", as, strerror(e));
            close(fd);
            continue;
        }
        if (s->n_lfd == 0) {
            struct sockaddr_storage ss;
            socklen_t sl = sizeof ss;
            getsockname(fd, (struct sockaddr *)&ss, &sl);
            s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                     : ((struct sockaddr_in *)&ss)->sin_port);
        }
        s->lfd[s->n_lfd++] = fd;
        err = KVP_OK;
    }
    freeaddrinfo(ai);
    if (err != KVP_OK && in_use)
        return KVP_ERR_BUSY;
    if (err != KVP_OK)
        kvp_log_error(ACTOR, "cannot listen on %s port %u", h[0] ? h : "*", port);
    return err;
}

static void stop_loops(struct kvp_seg_server *s)
{
    /* SEG_MSG_STOP first (the loops then return after one epoll pass), so that the runtime's stop is seen at
     * once. Stop them all before dropping any reference: a loop may still send to loop 0. */
    for (int i = 0; i < s->n_loops; i++)
        (void)loop_send(s, i, SEG_MSG_STOP, 0, NULL, NULL);
    for (int i = 0; i < s->n_loops; i++)
        (void)kvp_rt_stop(s->loops[i]);
    for (int i = 0; i < s->n_loops; i++)
        kvp_rt_destroy(&s->loops[i]);
    s->n_loops = 0;
}

int kvp_seg_server_start(struct kvp_seg_server **out, const char *host, uint32_t port, void *base,
                         uint64_t size)
{
    return kvp_seg_server_start_auth(out, host, port, base, size, NULL, 0);
}

int kvp_seg_server_start_auth(struct kvp_seg_server **out, const char *host, uint32_t port, void *base,
                              uint64_t size, const uint8_t (*token_pks)[KVP_DT_PK_BYTES], size_t n_token_pks)
{
    if (!out || port > 65535 || (!base && size > 0)) {
        kvp_log_error(ACTOR, "start: invalid arguments (port %u)", port);
        return KVP_ERR_INVALID;
    }
    struct kvp_seg_server *s = calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NOMEM;
    s->base = base;
    s->size = size;
    if (n_token_pks > 0) {
        s->token_pks = calloc(n_token_pks, sizeof *s->token_pks);
        if (!s->token_pks || kvp_dt_init() != KVP_OK) {
            free(s->token_pks);
            free(s);
            return KVP_ERR_NOMEM;
        }
        memcpy(s->token_pks, token_pks, n_token_pks * sizeof *s->token_pks);
        s->n_token_pks = n_token_pks;
    }
    /* The loops are the first runtime actors of a process that embeds a segment (a client with
     * global_segment_size, kvpool-segment): czmq's zsys_init (run by the process's first czmq
     * socket or zactor; the runtime's threads are plain pthreads) would install czmq's SIGINT/SIGTERM handlers and take Ctrl-C away from the application. Before
     * the server was an actor such processes never had them; keep it so (docs/runtime.md). */
    zsys_handler_set(NULL);
    int rc = listen_on(s, host, port);
    for (int i = 0; rc == KVP_OK && i < KVP_SEG_LOOPS; i++) {
        struct seg_loop *l = calloc(1, sizeof *l);
        if (!l) {
            rc = KVP_ERR_NOMEM;
            break;
        }
        l->srv = s;
        l->idx = i;
        l->ctr = &s->ctr[i];
        l->epfd = -1;
        char name[32];
        snprintf(name, sizeof name, "seg-loop-%d", i);
        struct kvp_rt_spec spec = {.name = name, .init = loop_init, .handle = loop_handle,
                                   .fini = loop_fini, .state = l};
        rc = kvp_rt_spawn(&s->loops[i], &spec, NULL); /* owns l from here: any failure ran loop_fini */
        if (rc == KVP_OK)
            s->n_loops++;
    }
    if (rc == KVP_OK)
        rc = loop_send(s, 0, SEG_MSG_LISTEN, 0, NULL, NULL);
    if (rc != KVP_OK) {
        stop_loops(s);
        for (int i = 0; i < s->n_lfd; i++)
            close(s->lfd[i]);
        free(s->token_pks);
        free(s);
        return rc;
    }
    kvp_log_info(ACTOR, "listening on %s port %u (%d address%s), region %lu bytes, %d loops, %s",
                 host && host[0] ? host : "*", s->port, s->n_lfd, s->n_lfd > 1 ? "es" : "",
                 (unsigned long)size, s->n_loops,
                 s->n_token_pks > 0 ? "data tokens required" : "no data tokens (any peer may connect)");
    *out = s;
    return KVP_OK;
}

uint32_t kvp_seg_server_port(const struct kvp_seg_server *s) { return s ? s->port : 0; }

void kvp_seg_server_sweep(struct kvp_seg_server *s, uint64_t ahead_ms)
{
    for (int i = 0; s && i < s->n_loops; i++)
        (void)loop_send(s, i, SEG_MSG_SWEEP, ahead_ms, NULL, NULL);
}

void kvp_seg_server_stats(struct kvp_seg_server *s, struct kvp_seg_server_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!s)
        return;
    for (int i = 0; i < KVP_SEG_LOOPS; i++) { /* relaxed loads: see struct seg_counters */
        struct seg_counters *c = &s->ctr[i];
        out->bytes_read += atomic_load_explicit(&c->bytes_read, memory_order_relaxed);
        out->bytes_written += atomic_load_explicit(&c->bytes_written, memory_order_relaxed);
        out->bad_frames += atomic_load_explicit(&c->bad_frames, memory_order_relaxed);
        for (int o = 0; o < KVP_SEG_OPS; o++)
            for (int r = 0; r < KVP_SEG_RESULTS; r++)
                out->requests[o][r] += atomic_load_explicit(&c->req[o][r], memory_order_relaxed);
        out->conns_open += atomic_load_explicit(&c->conns_open, memory_order_relaxed);
        out->conns_accepted += atomic_load_explicit(&c->conns_accepted, memory_order_relaxed);
        out->conns_refused += atomic_load_explicit(&c->conns_refused, memory_order_relaxed);
        out->token_refused += atomic_load_explicit(&c->token_refused, memory_order_relaxed);
        out->rdma_hellos_forwarded += atomic_load_explicit(&c->rdma_hellos_fwd, memory_order_relaxed);
    }
}

void kvp_seg_server_stop(struct kvp_seg_server **sp)
{
    if (!sp || !*sp)
        return;
    struct kvp_seg_server *s = *sp;
    *sp = NULL;
    stop_loops(s); /* loop 0's fini closed the RDMA side */
    for (int i = 0; i < s->n_lfd; i++)
        close(s->lfd[i]);
    kvp_log_info(ACTOR, "port %u: stopped", s->port);
    free(s->token_pks);
    free(s);
}
