/*
 * seg_server.c — the TCP data plane of one segment (see seg_server.h, docs/data-plane.md).
 *
 * Threads: one accept thread (poll over the listen sockets and a wake-up eventfd) and one
 * thread per connection doing blocking I/O. A connection serves its requests one after the
 * other, in order, so responses leave in request order. Payload bytes move straight between
 * the socket and the region: WRITE payloads are received into base+offset, READ responses go
 * out with one sendmsg of [header, region bytes].
 *
 * Stop: the accept thread is woken and joined, then every connection socket is shut down
 * (which makes its blocking recv/send return) and every connection thread is joined.
 */
#define _GNU_SOURCE
#include "actors/segment/seg_server.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "actors/segment/segment_internal.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "wire/envelope.h"

#define ACTOR "seg-server"

/*
 * The region is written and read by several connection threads. Their order is set by the
 * clients (a client sends a READ only after its WRITE was answered), i.e. through sockets that
 * ThreadSanitizer cannot follow. In TSan builds every region access acquires/releases one sync
 * object, which tells TSan about that order; other builds compile this away.
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

/*
 * Request counters of one connection, for the metrics endpoint (kvp_seg_server_stats). Written
 * only by the connection's own thread, as load + store (one writer: no read-modify-write, so no
 * locked instruction on the request path); read by the metrics HTTP thread with relaxed loads.
 * Relaxed is enough: each counter is an independent monotonic value and nothing else is
 * published through it; a scrape may see one counter a request ahead of another. Atomics and
 * not a message: the reader is libmicrohttpd's thread and the writer a blocking I/O thread,
 * neither of which has a mailbox, and a scrape must not cost the data path a wake-up.
 */
struct seg_counters {
    _Atomic uint64_t bytes_read;    /* READ payload bytes queued for sending */
    _Atomic uint64_t bytes_written; /* WRITE payload bytes that landed in the region */
    _Atomic uint64_t req[KVP_SEG_OPS][KVP_SEG_RESULTS];
    _Atomic uint64_t bad_frames;
};

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

struct seg_conn {
    struct kvp_seg_server *srv;
    int fd;
    struct seg_counters ctr; /* see above */
    pthread_t thread;
    atomic_bool done; /* set by the connection thread as its last act; release/acquire with the reaper */
    char peer[64];
    struct seg_conn *next;
};

struct kvp_seg_server {
    uint8_t *base;
    uint64_t size;
    /* The id requests must carry. Written by set_id from any thread, read by every connection
     * thread before each request: relaxed is enough, the id is a single independent value and
     * no other memory is published through it. */
    _Atomic uint32_t segment_id;
    uint32_t port;
    int lfd[KVP_SEG_MAX_LISTEN];
    int n_lfd;
    int wake_fd;
    pthread_t accept_thread;
    atomic_bool stopping;
    pthread_mutex_t mu; /* guards conns and the counters below */
    struct seg_conn *conns;
    struct kvp_seg_server_stats closed; /* requests of reaped connections; conns_* counts */
    char region_sync;   /* TSan annotation address only (REGION_ACQUIRE/RELEASE) */
};

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

struct out_batch;
static int out_flush(struct kvp_seg_server *s, int fd, struct out_batch *o);
static bool out_pending(const struct out_batch *o);

/*
 * The receive side of one connection. Request headers are read through a buffer: one recv
 * takes every header a pipelining client has queued (a batch of 32 small READs costs one recv
 * instead of 32), and with them the payloads of small WRITEs (a batch of 4 KiB WRITEs: about
 * 16 per recv). Bytes of a WRITE payload that came in with its header are copied from the
 * buffer (at most IN_BYTES of it); the rest of the payload goes straight from the socket into
 * the region.
 *
 * timeo_ms is the SO_RCVTIMEO now set on the socket (0 = none: recv blocks until data). It is
 * set only to bound a WRITE payload's blocking receive before its deadline (recv_region); a
 * recv that times out (EAGAIN on this blocking socket) is simply retried elsewhere.
 */
#define IN_BYTES (64u * 1024u)

struct conn_in {
    int fd;
    struct kvp_seg_server *srv;
    struct out_batch *out; /* this connection's queued responses (recv_payload flushes them) */
    uint8_t buf[IN_BYTES];
    size_t off, len; /* unread bytes are buf[off, len) */
    bool short_read;  /* the last recv into buf returned less than it asked: socket drained */
    uint32_t timeo_ms;
};

static size_t in_avail(const struct conn_in *in) { return in->len - in->off; }

/* recv into the buffer. Returns 1 (got bytes), 0 (nothing there: only without `block`), -1 (EOF:
 * errno 0, or error). */
static int in_fill(struct conn_in *in, bool block)
{
    if (in->off > 0) {
        memmove(in->buf, in->buf + in->off, in->len - in->off);
        in->len -= in->off;
        in->off = 0;
    }
    for (;;) {
        size_t room = IN_BYTES - in->len;
        ssize_t r = recv(in->fd, in->buf + in->len, room, block ? 0 : MSG_DONTWAIT);
        if (r > 0) {
            in->len += (size_t)r;
            in->short_read = (size_t)r < room;
            return 1;
        }
        if (r == 0) {
            errno = 0;
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (!block)
                return 0;
            continue; /* SO_RCVTIMEO passed while idle */
        }
        return -1;
    }
}

/* Copy up to len buffered bytes to dst (NULL: discard them). Returns how many. */
static size_t in_take(struct conn_in *in, void *dst, uint64_t len)
{
    size_t n = in_avail(in) < len ? in_avail(in) : (size_t)len;
    if (dst && n)
        memcpy(dst, in->buf + in->off, n);
    in->off += n;
    if (in->off == in->len)
        in->off = in->len = 0;
    return n;
}

/*
 * recv of payload bytes straight from the socket (flags: MSG_WAITALL, or MSG_DONTWAIT). A
 * connection never waits for bytes with responses queued: while some are, a blocking receive
 * first looks without waiting, and if nothing is there it sends them and answers EAGAIN (the
 * caller checks its deadline again and calls again). So the answers of a pipelined batch of
 * WRITEs whose payloads are already in the socket leave in one sendmsg, as READ answers do,
 * and an answer never waits on a slow sender.
 */
static ssize_t recv_payload(struct conn_in *in, void *dst, size_t len, int flags)
{
    if (!(flags & MSG_DONTWAIT) && out_pending(in->out)) {
        ssize_t r = recv(in->fd, dst, len, MSG_DONTWAIT);
        if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            return r;
        if (out_flush(in->srv, in->fd, in->out) != 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                errno = EIO; /* not a retry */
            return -1;
        }
        errno = EAGAIN;
        return -1;
    }
    return recv(in->fd, dst, len, flags);
}

/* Receive exactly len bytes straight from the socket (the buffer must be empty). Returns 0, or
 * -1 on EOF/error (errno kept; 0 for EOF). */
static int recv_all(struct conn_in *in, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t r = recv_payload(in, p, len, MSG_WAITALL);
        if (r == 0) {
            errno = 0;
            return -1;
        }
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue; /* EAGAIN: SO_RCVTIMEO passed; keep waiting */
            return -1;
        }
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

/* Send an iovec completely (handles partial sends). Modifies iov. Returns 0 or -1. */
static int send_iov_all(int fd, struct iovec *iov, int cnt)
{
    while (cnt > 0) {
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
        ssize_t r = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        size_t left = (size_t)r;
        while (cnt > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

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

/*
 * Responses of one connection waiting to go out in one sendmsg. A client pipelines many
 * requests; while the next request header is already in the socket, the server answers into
 * this list instead of sending at once, and flushes before it would wait for bytes (no header
 * waiting, or a WRITE payload not yet arrived: recv_payload), when the list is full, and before
 * a WRITE payload is received while a READ response is queued. READ payloads stay in the
 * region until the sendmsg (no copy); that last flush keeps a READ on the same connection from
 * seeing a later WRITE.
 */
#define OUT_MAX 32
#define OUT_MAX_BYTES (1u << 20)

struct out_batch {
    uint8_t hdr[OUT_MAX][KVP_FRAME_HEADER_BYTES];
    struct iovec iov[2 * OUT_MAX];
    int n;      /* responses queued */
    int iovcnt;
    uint64_t bytes;
    bool region; /* some iovec points into the region (TSan annotation) */
};

static bool out_pending(const struct out_batch *o) { return o->n > 0; }

static int out_flush(struct kvp_seg_server *s, int fd, struct out_batch *o)
{
    if (o->n == 0)
        return 0;
    int rc = send_iov_all(fd, o->iov, o->iovcnt);
    if (o->region)
        REGION_RELEASE(s);
    o->n = o->iovcnt = 0;
    o->bytes = 0;
    o->region = false;
    return rc;
}

/* Queue a response; the payload (READ) points into the region. Flushes when full. */
static int out_add(struct kvp_seg_server *s, int fd, struct out_batch *o, uint8_t op, int status,
                   const struct kvp_frame *req, uint64_t length, const void *payload)
{
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
        if (!o->region)
            REGION_ACQUIRE(s);
        o->region = true;
        o->iov[o->iovcnt++] = (struct iovec){(void *)payload, length};
        o->bytes += length;
    }
    o->n++;
    if (o->n == OUT_MAX || o->bytes >= OUT_MAX_BYTES)
        return out_flush(s, fd, o);
    return 0;
}

/*
 * Read the next request header. With responses queued and no complete header buffered, first
 * look without blocking: if the header is not (all) there yet, flush and then wait. Returns 0
 * or -1 (EOF/error; errno 0 = EOF).
 */
static int next_header(struct kvp_seg_server *s, struct conn_in *in, struct out_batch *o, uint8_t *hdr)
{
    while (in_avail(in) < KVP_FRAME_HEADER_BYTES) {
        /* After a short recv the socket was drained: answer now rather than look again. */
        if (o->n > 0 && !in->short_read) {
            int r = in_fill(in, false);
            if (r < 0)
                return -1;
            if (r > 0)
                continue;
        }
        if (o->n > 0 && out_flush(s, in->fd, o) != 0)
            return -1;
        if (in_fill(in, true) < 0)
            return -1;
    }
    in_take(in, hdr, KVP_FRAME_HEADER_BYTES);
    return 0;
}

/* Drain len bytes (buffered first) into scratch. Returns 0, or -1 on EOF/error. */
static int drain(struct conn_in *in, uint8_t **scratch, uint64_t left)
{
    left -= in_take(in, NULL, left);
    if (left > 0 && !*scratch && !(*scratch = malloc(KVP_SEG_SCRATCH_BYTES)))
        return -1;
    while (left > 0) {
        size_t chunk = left > KVP_SEG_SCRATCH_BYTES ? KVP_SEG_SCRATCH_BYTES : (size_t)left;
        if (recv_all(in, *scratch, chunk) != 0)
            return -1;
        left -= chunk;
    }
    return 0;
}

/*
 * A WRITE payload's blocking receive runs with SO_RCVTIMEO at most (time left) - this, so it
 * returns well before the deadline even with the timer rounded up to the kernel tick; below
 * RECV_FAST_MIN_MS left, the receive polls instead (recv_region).
 */
#define RECV_TIMEO_MARGIN_MS 20
#define RECV_FAST_MIN_MS 500

/* SO_RCVTIMEO for a blocking receive that must end by `left_ms` from now: keep the one set while
 * it is short enough and not much shorter than needed (one setsockopt per call timeout, not per
 * request). Returns false if it could not be set. */
static bool set_timeo(struct conn_in *in, int32_t left_ms)
{
    uint32_t max = (uint32_t)(left_ms - RECV_TIMEO_MARGIN_MS);
    if (in->timeo_ms != 0 && in->timeo_ms <= max && in->timeo_ms >= max / 4)
        return true;
    uint32_t t = max / 2;
    struct timeval tv = {.tv_sec = t / 1000, .tv_usec = (suseconds_t)(t % 1000) * 1000};
    if (setsockopt(in->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0)
        return false;
    in->timeo_ms = t;
    return true;
}

/*
 * Receive a WRITE payload into the region, enforcing the frame's write deadline (contract C3,
 * docs/fencing.md): the clock is read before every copy into the region, and no receive into
 * the region can wait past the deadline: with more than RECV_FAST_MIN_MS left, one blocking
 * recv (MSG_WAITALL) bounded by SO_RCVTIMEO ending RECV_TIMEO_MARGIN_MS before the deadline at
 * the latest takes the whole payload (one syscall instead of one per arriving chunk); closer to
 * the deadline, recv never waits (MSG_DONTWAIT; poll waits instead). So no byte lands in the
 * region after the deadline — give or take the one recv call that copies bytes already queued.
 * Past the deadline the rest is drained into scratch. Returns 0 (all landed), 1 (deadline
 * passed, drained), -1 (EOF/error).
 */
static int recv_region(struct conn_in *in, uint8_t *dst, uint64_t len, uint32_t deadline,
                       uint8_t **scratch, uint64_t *landed)
{
    *landed = 0;
    if (deadline == 0) {
        *landed = in_take(in, dst, len);
        if (*landed < len && recv_all(in, dst + *landed, len - *landed) != 0)
            return -1;
        *landed = len;
        return 0;
    }
    while (*landed < len) {
        uint64_t now = kvp_clock_wall_ms();
        if (kvp_frame_deadline_passed(deadline, now))
            return drain(in, scratch, len - *landed) == 0 ? 1 : -1;
        if (in_avail(in) > 0) { /* came in with the header */
            *landed += in_take(in, dst + *landed, len - *landed);
            continue;
        }
        int32_t left_ms = (int32_t)(deadline - (uint32_t)now);
        bool fast = left_ms > RECV_FAST_MIN_MS && set_timeo(in, left_ms);
        ssize_t r = recv_payload(in, dst + *landed, len - *landed, fast ? MSG_WAITALL : MSG_DONTWAIT);
        if (r > 0) {
            *landed += (uint64_t)r;
            continue;
        }
        if (r == 0) {
            errno = 0;
            return -1;
        }
        if (errno == EINTR || (fast && (errno == EAGAIN || errno == EWOULDBLOCK)))
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        if (out_pending(in->out) && out_flush(in->srv, in->fd, in->out) != 0)
            return -1;
        struct pollfd pf = {.fd = in->fd, .events = POLLIN};
        if (poll(&pf, 1, 50) < 0 && errno != EINTR)
            return -1;
    }
    return 0;
}

static void *conn_main(void *arg)
{
    struct seg_conn *c = arg;
    struct kvp_seg_server *s = c->srv;
    uint8_t *scratch = NULL;
    uint8_t hdr[KVP_FRAME_HEADER_BYTES];
    struct out_batch *o = calloc(1, sizeof *o);
    struct conn_in *in = malloc(sizeof *in);
    if (!o || !in)
        goto out;
    in->fd = c->fd;
    in->srv = s;
    in->out = o;
    in->off = in->len = 0;
    in->short_read = false;
    in->timeo_ms = 0;
    for (;;) {
        if (next_header(s, in, o, hdr) != 0) {
            if (errno != 0 && !atomic_load(&s->stopping))
                kvp_log_debug(ACTOR, "%s: recv: %s", c->peer, strerror(errno));
            break;
        }
        struct kvp_frame f;
        int rc = kvp_frame_decode(hdr, &f);
        if (rc == KVP_OK && f.op != KVP_FRAME_READ && f.op != KVP_FRAME_WRITE && f.op != KVP_FRAME_PING)
            rc = KVP_ERR_MALFORMED;
        if (rc != KVP_OK) {
            ctr_add(&c->ctr.bad_frames, 1);
            kvp_log_warn(ACTOR, "%s: bad frame header (%s, op %u): closing the connection", c->peer,
                         kvp_errname(rc), hdr[5]);
            out_flush(s, c->fd, o); /* the requests before it are answered */
            break;
        }
        int st = check_request(s, &f);
        if (f.op == KVP_FRAME_PING) {
            ctr_add(&c->ctr.req[2][result_index(st == KVP_ERR_NOT_FOUND ? st : KVP_OK)], 1);
            if (out_add(s, c->fd, o, KVP_FRAME_PONG, st == KVP_ERR_NOT_FOUND ? st : KVP_OK, &f, 0, NULL) != 0)
                break;
        } else if (f.op == KVP_FRAME_READ) {
            if (st != KVP_OK)
                kvp_log_debug(ACTOR, "%s: READ seg %u off %lu len %lu: %s", c->peer, f.segment_id,
                              (unsigned long)f.offset, (unsigned long)f.length, kvp_errname(st));
            ctr_add(&c->ctr.req[0][result_index(st)], 1);
            if (st == KVP_OK)
                ctr_add(&c->ctr.bytes_read, f.length);
            if (out_add(s, c->fd, o, KVP_FRAME_READ_RESP, st, &f, st == KVP_OK ? f.length : 0,
                        st == KVP_OK ? s->base + f.offset : NULL) != 0)
                break;
        } else { /* WRITE */
            /* A queued READ response still points into the region: send it before this
             * payload can overwrite its bytes. WRITE answers stay queued (recv_payload). */
            if (o->region && out_flush(s, c->fd, o) != 0)
                break;
            if (st == KVP_OK) {
                uint64_t landed = 0;
                REGION_ACQUIRE(s);
                int got = f.length > 0 ? recv_region(in, s->base + f.offset, f.length, f.deadline,
                                                     &scratch, &landed)
                                       : 0;
                REGION_RELEASE(s);
                ctr_add(&c->ctr.bytes_written, landed);
                if (got < 0)
                    break;
                if (got == 1) {
                    /* The writer's call is over; the master may have given this space to
                     * another object. Late bytes land nowhere (C3). */
                    kvp_log_warn(ACTOR, "%s: WRITE seg %u off %lu len %lu arrived past its deadline: "
                                 "%lu bytes landed before it, the rest drained",
                                 c->peer, f.segment_id, (unsigned long)f.offset, (unsigned long)f.length,
                                 (unsigned long)landed);
                    st = KVP_ERR_TIMEOUT;
                }
            } else {
                kvp_log_debug(ACTOR, "%s: WRITE seg %u off %lu len %lu: %s (payload drained)", c->peer,
                              f.segment_id, (unsigned long)f.offset, (unsigned long)f.length,
                              kvp_errname(st));
                if (drain(in, &scratch, f.length) != 0)
                    break;
            }
            ctr_add(&c->ctr.req[1][result_index(st)], 1);
            if (out_add(s, c->fd, o, KVP_FRAME_WRITE_RESP, st, &f, 0, NULL) != 0)
                break;
        }
    }
    if (o && o->region)
        REGION_RELEASE(s);
out:
    free(o);
    free(in);
    free(scratch);
    /* The peer sees the end now; the descriptor itself is closed when the thread is reaped. */
    shutdown(c->fd, SHUT_RDWR);
    atomic_store_explicit(&c->done, true, memory_order_release);
    return NULL;
}

/* Add a connection's counters to st (relaxed loads: see struct seg_counters). */
static void fold_counters(struct kvp_seg_server_stats *st, struct seg_counters *c)
{
    st->bytes_read += atomic_load_explicit(&c->bytes_read, memory_order_relaxed);
    st->bytes_written += atomic_load_explicit(&c->bytes_written, memory_order_relaxed);
    st->bad_frames += atomic_load_explicit(&c->bad_frames, memory_order_relaxed);
    for (int o = 0; o < KVP_SEG_OPS; o++)
        for (int r = 0; r < KVP_SEG_RESULTS; r++)
            st->requests[o][r] += atomic_load_explicit(&c->req[o][r], memory_order_relaxed);
}

void kvp_seg_server_stats(struct kvp_seg_server *s, struct kvp_seg_server_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    *out = s->closed;
    out->conns_open = 0;
    for (struct seg_conn *c = s->conns; c; c = c->next) {
        fold_counters(out, &c->ctr);
        if (!atomic_load_explicit(&c->done, memory_order_acquire))
            out->conns_open++;
    }
    pthread_mutex_unlock(&s->mu);
}

/* Join and free connections whose thread has finished; returns how many are left.
 * Caller holds s->mu. */
static unsigned reap_done(struct kvp_seg_server *s)
{
    unsigned live = 0;
    struct seg_conn **pp = &s->conns;
    while (*pp) {
        struct seg_conn *c = *pp;
        if (atomic_load_explicit(&c->done, memory_order_acquire)) {
            *pp = c->next;
            fold_counters(&s->closed, &c->ctr);
            pthread_join(c->thread, NULL);
            close(c->fd);
            free(c);
        } else {
            pp = &c->next;
            live++;
        }
    }
    return live;
}

static void accept_one(struct kvp_seg_server *s, int lfd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
    if (fd < 0) {
        if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
            kvp_log_warn(ACTOR, "accept: %s", strerror(errno));
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* A client host that vanished (no FIN/RST) is detected in about a minute, so its
     * connection thread does not wait in recv forever. */
    int idle = 30, intvl = 10, cnt = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    struct seg_conn *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return;
    }
    c->srv = s;
    c->fd = fd;
    addr_to_string((struct sockaddr *)&ss, c->peer, sizeof c->peer);
    pthread_mutex_lock(&s->mu);
    if (reap_done(s) >= KVP_SEG_MAX_CONNS) {
        s->closed.conns_refused++;
        pthread_mutex_unlock(&s->mu);
        kvp_log_warn(ACTOR, "%s: refused: already %u connections", c->peer, KVP_SEG_MAX_CONNS);
        close(fd);
        free(c);
        return;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, KVP_SEG_THREAD_STACK_BYTES);
    int prc = pthread_create(&c->thread, &attr, conn_main, c);
    pthread_attr_destroy(&attr);
    if (prc != 0) {
        pthread_mutex_unlock(&s->mu);
        kvp_log_warn(ACTOR, "%s: cannot start a connection thread", c->peer);
        close(fd);
        free(c);
        return;
    }
    c->next = s->conns;
    s->conns = c;
    s->closed.conns_accepted++;
    pthread_mutex_unlock(&s->mu);
    kvp_log_debug(ACTOR, "%s: connected", c->peer);
}

static void *accept_main(void *arg)
{
    struct kvp_seg_server *s = arg;
    struct pollfd pf[KVP_SEG_MAX_LISTEN + 1];
    for (int i = 0; i < s->n_lfd; i++)
        pf[i] = (struct pollfd){.fd = s->lfd[i], .events = POLLIN};
    pf[s->n_lfd] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};
    while (!atomic_load(&s->stopping)) {
        int r = poll(pf, (nfds_t)s->n_lfd + 1, -1);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            kvp_log_error(ACTOR, "poll: %s", strerror(errno));
            break;
        }
        if (pf[s->n_lfd].revents)
            break;
        for (int i = 0; i < s->n_lfd; i++)
            if (pf[i].revents & POLLIN)
                accept_one(s, s->lfd[i]);
    }
    return NULL;
}

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
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (a->ai_family == AF_INET6)
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
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

int kvp_seg_server_start(struct kvp_seg_server **out, const char *host, uint32_t port, void *base,
                         uint64_t size)
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
    s->wake_fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    int rc = listen_on(s, host, port);
    if (rc == KVP_OK) {
        s->wake_fd = eventfd(0, EFD_CLOEXEC);
        if (s->wake_fd < 0)
            rc = KVP_ERR_IO;
    }
    if (rc == KVP_OK && pthread_create(&s->accept_thread, NULL, accept_main, s) != 0)
        rc = KVP_ERR_NOMEM;
    if (rc != KVP_OK) {
        for (int i = 0; i < s->n_lfd; i++)
            close(s->lfd[i]);
        if (s->wake_fd >= 0)
            close(s->wake_fd);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return rc;
    }
    kvp_log_info(ACTOR, "listening on %s port %u (%d address%s), region %lu bytes",
                 host && host[0] ? host : "*", s->port, s->n_lfd, s->n_lfd > 1 ? "es" : "",
                 (unsigned long)size);
    *out = s;
    return KVP_OK;
}

uint32_t kvp_seg_server_port(const struct kvp_seg_server *s) { return s ? s->port : 0; }

void kvp_seg_server_set_id(struct kvp_seg_server *s, uint32_t segment_id)
{
    if (s)
        atomic_store_explicit(&s->segment_id, segment_id, memory_order_relaxed);
}

void kvp_seg_server_stop(struct kvp_seg_server **sp)
{
    if (!sp || !*sp)
        return;
    struct kvp_seg_server *s = *sp;
    *sp = NULL;
    atomic_store(&s->stopping, true);
    uint64_t one = 1;
    if (write(s->wake_fd, &one, sizeof one) < 0)
        kvp_log_warn(ACTOR, "stop: wake: %s", strerror(errno));
    pthread_join(s->accept_thread, NULL);
    for (int i = 0; i < s->n_lfd; i++)
        close(s->lfd[i]);
    close(s->wake_fd);
    pthread_mutex_lock(&s->mu);
    for (struct seg_conn *c = s->conns; c; c = c->next)
        shutdown(c->fd, SHUT_RDWR);
    while (s->conns) {
        struct seg_conn *c = s->conns;
        s->conns = c->next;
        pthread_join(c->thread, NULL);
        close(c->fd);
        free(c);
    }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_destroy(&s->mu);
    kvp_log_info(ACTOR, "port %u: stopped", s->port);
    free(s);
}
