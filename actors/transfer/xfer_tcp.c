/*
 * xfer_tcp.c — the tcp transport behind the transport seam (transport.h): the kvpool data-plane
 * frame protocol (wire/envelope.h) over nonblocking sockets, conns_per_peer pipelined
 * connections per segment endpoint, one epoll set. docs/data-plane.md has the design.
 *
 * An instance belongs to one transfer actor (xfer_engine.c) and runs on its thread only, so no
 * field here needs a lock. An xslice is a "piece" here: it sits on a connection's send queue,
 * then on its in-flight list (answers come back in request order), then, for a READ answered OK,
 * is the connection's rpiece while its payload is received. A piece is reported (its completion
 * queued for poll) at most once; from then on `done` is set and its caller memory is never used:
 * a fenced READ's answer is still read off the socket, into scratch memory.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "actors/transfer/transfer_internal.h"
#include "actors/transfer/transport.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "wire/envelope.h"

#define TCP_PIECE_COST 4096u          /* extra load per piece when choosing a connection */
#define TCP_PACK_BYTES (256u * 1024u) /* a connection below this load takes the next piece first */
#define TCP_SCRATCH_BYTES (256u * 1024u)
#define TCP_MAX_IOV 64

enum tcp_where {
    PIECE_SENDQ = 1,    /* on conn->sendq; p->sent bytes of header+payload already sent */
    PIECE_INFLIGHT = 2, /* request sent; on conn->inflight waiting for its answer */
    PIECE_RECV = 3,     /* its READ payload is being received (conn->rpiece) */
};

struct tcp_conn;
struct tcp_peer;

struct tcp_piece {
    uint64_t id;              /* the engine's xslice id */
    struct tcp_peer *peer;
    struct tcp_conn *conn;
    uint8_t op;               /* KVP_XFER_READ / KVP_XFER_WRITE */
    uint8_t where;            /* enum tcp_where */
    bool done;                /* reported: local is never used again */
    uint8_t *local;           /* caller memory (NULL once done) */
    uint64_t length;
    uint64_t req_id;
    uint64_t sent;            /* bytes of hdr + payload sent */
    uint64_t late_until_ns;   /* delay(): its answer is not read before this (0 = no delay) */
    uint8_t hdr[KVP_FRAME_HEADER_BYTES];
    struct tcp_piece *prev, *next;
};

struct tcp_list {
    struct tcp_piece *head, *tail;
};

/* CONN_TOKEN: connected, waiting for the segment's token challenge (params.token_respond set). */
enum { CONN_IDLE = 0, CONN_CONNECTING = 1, CONN_UP = 2, CONN_TOKEN = 3 };
#define TCP_CHALLENGE_BYTES 44 /* KVP_DT_CHALLENGE_BYTES (auth/auth_token.h) */
#define TCP_TOKEN_RESP_MAX 512 /* >= KVP_DT_RESPONSE_MAX */

struct tcp_conn {
    struct tcp_peer *peer;
    int fd;
    int state;
    uint32_t events;            /* the epoll mask now registered */
    uint64_t connect_deadline_ns;
    uint64_t load;              /* bytes (plus TCP_PIECE_COST per piece) queued or in flight */
    struct tcp_list sendq;      /* requests to send, head first (head may be partly sent) */
    struct tcp_list inflight;   /* requests sent, in order; answers come back in this order */
    struct tcp_piece *rpiece;   /* piece whose READ payload is being received */
    uint64_t rgot;              /* payload bytes of rpiece received */
    uint8_t rhdr[KVP_FRAME_HEADER_BYTES];
    size_t rhdr_got;
    uint8_t *pb;                /* pushback: answer bytes a speculative readv misplaced (conn_recv) */
    size_t pb_len, pb_off;      /* bytes in pb, bytes of them already parsed */
    bool close_pending;         /* fencing found a WRITE mid-send: close after the fence pass */
    bool kick;                  /* on t->kicks: post() queued requests, poll() sends them */
    bool paused;                /* delay(): not reading until pause_until_ns or undelay */
    uint64_t pause_until_ns;
    uint8_t challenge[TCP_CHALLENGE_BYTES]; /* CONN_TOKEN: the segment's challenge so far */
    size_t challenge_got;
};

struct tcp_peer {
    char *endpoint;
    struct sockaddr_storage addr;
    unsigned addr_len;
    struct tcp_conn *conns;     /* conns_per_peer of them */
    bool down_logged;           /* a connection failure was logged at WARN; reset on connect */
    struct tcp_peer *next;
};

struct tcp_xport {
    struct kvp_xport_params p;
    char name[32];
    int ep;
    uint8_t *scratch;
    uint8_t spec_hdr[TCP_MAX_IOV][KVP_FRAME_HEADER_BYTES]; /* headers of speculative reads */
    struct tcp_peer *peers;
    uint64_t next_req_id;
    uint64_t now_ns;            /* the clock of the current op (poll's now_ns; post/fence: last seen) */
    struct kvp_xport_completion *cq; /* completions not yet handed out by poll */
    size_t cq_n, cq_cap;
    size_t live;                /* pieces posted and not reported yet */
    struct kvp_xport_stats st;
    /* Connections post() queued requests on: poll() starts their connect / send, so that all the
     * requests of one call (posted in several runs, one per endpoint run) go out in one sendmsg
     * per connection, not one per run. */
    struct tcp_conn **kicks;
    size_t n_kicks, cap_kicks;
    /* Pieces let go of, kept for the next post (linked by next; at most TCP_PIECE_POOL): a 4 KiB
     * batch_get of 32 keys posts 32 pieces per call, each a calloc/free pair before (callgrind:
     * this pool and xfer_engine.c's one-block work cut ~7k of ~400k client instructions per call). */
    struct tcp_piece *pool;
    size_t pool_n;
};

/* Sanitizer builds keep no pool: a stale piece pointer must hit freed memory, where ASan sees
 * it, not a recycled piece. */
#define TCP_PIECE_POOL 1024
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TCP_PIECE_POOL_ON false
#else
#define TCP_PIECE_POOL_ON true
#endif

#define T(x) ((struct tcp_xport *)(x))

/* A zeroed piece: from the pool, else calloc. NULL when out of memory. */
static struct tcp_piece *piece_get(struct tcp_xport *t)
{
    struct tcp_piece *p = t->pool;
    if (!p)
        return calloc(1, sizeof *p);
    t->pool = p->next;
    t->pool_n--;
    memset(p, 0, sizeof *p);
    return p;
}

/* Let go of a piece (reported, on no list, no connection's rpiece). */
static void piece_put(struct tcp_xport *t, struct tcp_piece *p)
{
    if (!TCP_PIECE_POOL_ON || t->pool_n >= TCP_PIECE_POOL) {
        free(p);
        return;
    }
    p->local = NULL;
    p->next = t->pool;
    t->pool = p;
    t->pool_n++;
}

/* ------------------------------------------------------------------ lists, reports */

static void list_push(struct tcp_list *l, struct tcp_piece *p)
{
    p->next = NULL;
    p->prev = l->tail;
    if (l->tail)
        l->tail->next = p;
    else
        l->head = p;
    l->tail = p;
}

static void list_unlink(struct tcp_list *l, struct tcp_piece *p)
{
    if (p->prev)
        p->prev->next = p->next;
    else
        l->head = p->next;
    if (p->next)
        p->next->prev = p->prev;
    else
        l->tail = p->prev;
    p->prev = p->next = NULL;
}

static uint64_t piece_cost(const struct tcp_piece *p) { return p->length + TCP_PIECE_COST; }

/* Queue p's completion (once). After this p->local is never used again. post() keeps the
 * queue's room at least the number of completions queued plus pieces not reported, so a report
 * never needs memory and is never lost. */
static void report(struct tcp_xport *t, struct tcp_piece *p, int status)
{
    if (p->done)
        return;
    p->done = true;
    p->local = NULL;
    t->live--;
    t->cq[t->cq_n++] = (struct kvp_xport_completion){p->id, status};
}

/* Reserve queue room for n more completions (post() calls it for the pieces it accepts). */
static int cq_reserve(struct tcp_xport *t, size_t outstanding)
{
    if (outstanding <= t->cq_cap)
        return KVP_OK;
    size_t nc = t->cq_cap ? t->cq_cap : 64;
    while (nc < outstanding)
        nc *= 2;
    struct kvp_xport_completion *q = realloc(t->cq, nc * sizeof *q);
    if (!q)
        return KVP_ERR_NOMEM;
    t->cq = q;
    t->cq_cap = nc;
    return KVP_OK;
}

/* ------------------------------------------------------------------ connections */

static void conn_set_events(struct tcp_xport *t, struct tcp_conn *c, uint32_t ev)
{
    if (c->fd < 0 || c->events == ev)
        return;
    struct epoll_event ee = {.events = ev, .data.ptr = c};
    if (epoll_ctl(t->ep, EPOLL_CTL_MOD, c->fd, &ee) == 0)
        c->events = ev;
}

static void conn_want_out(struct tcp_xport *t, struct tcp_conn *c, bool out)
{
    conn_set_events(t, c, (c->paused ? 0 : EPOLLIN) | (out ? EPOLLOUT : 0));
}

static void drop_list(struct tcp_xport *t, struct tcp_list *l, int status)
{
    struct tcp_piece *p;
    while ((p = l->head)) {
        list_unlink(l, p);
        report(t, p, status);
        piece_put(t, p);
    }
}

static bool conn_has_write(const struct tcp_conn *c)
{
    for (const struct tcp_piece *p = c->sendq.head; p; p = p->next)
        if (p->op == KVP_XFER_WRITE)
            return true;
    for (const struct tcp_piece *p = c->inflight.head; p; p = p->next)
        if (p->op == KVP_XFER_WRITE)
            return true;
    return false;
}

/* Close the connection; every piece on it that is not reported fails with `status`. */
static void conn_fail(struct tcp_xport *t, struct tcp_conn *c, int status, const char *why)
{
    if (c->fd >= 0) {
        bool busy = c->sendq.head || c->inflight.head || c->rpiece;
        /* One WARN per peer until a connection to it succeeds again (a dead segment with
         * several connections and many batches would otherwise flood the log). */
        if (busy && status != KVP_ERR_CLOSED && !c->peer->down_logged) {
            kvp_log_warn(t->name, "%s: connection closed: %s", c->peer->endpoint, why);
            c->peer->down_logged = true;
        } else {
            kvp_log_debug(t->name, "%s: connection closed: %s", c->peer->endpoint, why);
        }
        epoll_ctl(t->ep, EPOLL_CTL_DEL, c->fd, NULL);
        if (status != KVP_OK && conn_has_write(c)) {
            /* Abortive close (RST): the kernel drops WRITE bytes still queued on this socket
             * instead of delivering them after the call returned (C3; docs/fencing.md). */
            struct linger lg = {.l_onoff = 1, .l_linger = 0};
            setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        }
        close(c->fd);
    }
    c->fd = -1;
    c->state = CONN_IDLE;
    c->events = 0;
    c->close_pending = false;
    c->paused = false;
    drop_list(t, &c->sendq, status);
    drop_list(t, &c->inflight, status);
    if (c->rpiece) {
        report(t, c->rpiece, status);
        free(c->rpiece);
        c->rpiece = NULL;
    }
    c->rgot = 0;
    c->rhdr_got = 0;
    c->load = 0;
    free(c->pb);
    c->pb = NULL;
    c->pb_len = c->pb_off = 0;
}

static void conn_connect(struct tcp_xport *t, struct tcp_conn *c)
{
    int fd = -1;
    int rc = xfer_connect_start(&c->peer->addr, c->peer->addr_len, &fd);
    if (rc < 0) {
        char why[128];
        snprintf(why, sizeof why, "connect: %s", strerror(-rc));
        conn_fail(t, c, KVP_ERR_TRANSFER, why);
        return;
    }
    c->fd = fd;
    c->state = rc == 0 ? (t->p.token_respond ? CONN_TOKEN : CONN_UP) : CONN_CONNECTING;
    c->events = rc != 0 ? EPOLLOUT : c->state == CONN_TOKEN ? EPOLLIN : EPOLLIN | EPOLLOUT;
    c->challenge_got = 0;
    c->connect_deadline_ns = kvp_clock_now_ns() + (uint64_t)t->p.connect_timeout_ms * 1000000ull;
    struct epoll_event ee = {.events = c->events, .data.ptr = c};
    if (epoll_ctl(t->ep, EPOLL_CTL_ADD, fd, &ee) != 0) {
        close(fd);
        c->fd = -1;
        conn_fail(t, c, KVP_ERR_TRANSFER, "epoll_ctl failed");
    }
}

/* Send as much of the send queue as the socket takes. Returns false if the conn failed. */
static bool conn_send(struct tcp_xport *t, struct tcp_conn *c)
{
    while (c->state == CONN_UP && c->sendq.head) {
        struct iovec iov[TCP_MAX_IOV];
        int cnt = 0;
        for (struct tcp_piece *p = c->sendq.head; p && cnt + 2 <= TCP_MAX_IOV; p = p->next) {
            /* Pieces on sendq are not reported, except a fenced READ whose header is partly
             * sent: its iovec is the header only, never caller memory. */
            uint64_t total = KVP_FRAME_HEADER_BYTES + (p->op == KVP_XFER_WRITE ? p->length : 0);
            uint64_t off = p->sent;
            if (off < KVP_FRAME_HEADER_BYTES) {
                iov[cnt++] = (struct iovec){p->hdr + off, KVP_FRAME_HEADER_BYTES - off};
                off = KVP_FRAME_HEADER_BYTES;
            }
            if (off < total)
                iov[cnt++] = (struct iovec){p->local + (off - KVP_FRAME_HEADER_BYTES), total - off};
        }
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
        ssize_t r = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                conn_want_out(t, c, true);
                return true;
            }
            char why[128];
            snprintf(why, sizeof why, "send: %s", strerror(errno));
            conn_fail(t, c, KVP_ERR_TRANSFER, why);
            return false;
        }
        uint64_t left = (uint64_t)r;
        while (left > 0) {
            struct tcp_piece *p = c->sendq.head;
            uint64_t total = KVP_FRAME_HEADER_BYTES + (p->op == KVP_XFER_WRITE ? p->length : 0);
            uint64_t take = total - p->sent < left ? total - p->sent : left;
            p->sent += take;
            left -= take;
            if (p->sent == total) {
                list_unlink(&c->sendq, p);
                list_push(&c->inflight, p);
                p->where = PIECE_INFLIGHT;
            }
        }
    }
    if (c->state == CONN_UP)
        conn_want_out(t, c, false);
    return c->state == CONN_UP;
}

/* A complete answer header is in c->rhdr. Returns false if the conn failed. */
static bool conn_on_header(struct tcp_xport *t, struct tcp_conn *c)
{
    struct kvp_frame f;
    int rc = kvp_frame_decode(c->rhdr, &f);
    c->rhdr_got = 0;
    struct tcp_piece *p = c->inflight.head;
    const char *bad = NULL;
    if (rc != KVP_OK)
        bad = "malformed response header";
    else if (!p)
        bad = "unsolicited response";
    else if (f.req_id != p->req_id)
        bad = "response out of order";
    else if ((p->op == KVP_XFER_READ && f.op != KVP_FRAME_READ_RESP) ||
             (p->op == KVP_XFER_WRITE && f.op != KVP_FRAME_WRITE_RESP))
        bad = "response of the wrong type";
    else if (f.status == 0 && p->op == KVP_XFER_READ && f.length != p->length)
        bad = "READ response of the wrong length";
    else if (f.op == KVP_FRAME_READ_RESP && f.status != 0 && f.length != 0)
        bad = "error response with a payload";
    if (bad) {
        conn_fail(t, c, KVP_ERR_TRANSFER, bad);
        return false;
    }
    list_unlink(&c->inflight, p);
    c->load -= piece_cost(p);
    if (p->op == KVP_XFER_READ && f.status == 0) {
        p->where = PIECE_RECV;
        c->rpiece = p;
        c->rgot = 0;
        return true;
    }
    int st = f.status;
    if (st > 0 || st <= KVP_ERR__LAST)
        st = KVP_ERR_TRANSFER;
    if (st != 0)
        kvp_log_debug(t->name, "%s: segment %u answered %s", c->peer->endpoint, f.segment_id,
                      kvp_errname(st));
    report(t, p, st);
    piece_put(t, p);
    return true;
}

/* Fully received answer header `h` is the one READ piece q expects: OK, with q's length. */
static bool header_expected(const uint8_t *h, const struct tcp_piece *q)
{
    struct kvp_frame f;
    return kvp_frame_decode(h, &f) == KVP_OK && f.req_id == q->req_id && f.op == KVP_FRAME_READ_RESP &&
           f.status == 0 && f.length == q->length;
}

/* Serve a "read" from the connection's pushback bytes instead of the socket (see conn_recv). */
static size_t pushback_copy(struct tcp_conn *c, const struct iovec *iov, int cnt)
{
    size_t n = 0;
    for (int k = 0; k < cnt && c->pb_off < c->pb_len; k++) {
        size_t left = c->pb_len - c->pb_off;
        size_t take = iov[k].iov_len < left ? iov[k].iov_len : left;
        memcpy(iov[k].iov_base, c->pb + c->pb_off, take);
        c->pb_off += take;
        n += take;
        if (take < iov[k].iov_len)
            break;
    }
    if (c->pb_off == c->pb_len) {
        free(c->pb);
        c->pb = NULL;
        c->pb_len = c->pb_off = 0;
    }
    return n;
}

/*
 * Keep the `n` bytes that follow stream position `from` of the iov list as pushback: a
 * speculative readv put them where the answer turned out not to go. Called before any piece
 * whose memory holds them is reported (after a report the caller may free that memory).
 */
static bool pushback_keep(struct tcp_conn *c, const struct iovec *iov, int cnt, uint64_t from, uint64_t n)
{
    if (n == 0)
        return true;
    c->pb = malloc(n);
    if (!c->pb)
        return false;
    c->pb_len = n;
    c->pb_off = 0;
    uint64_t pos = 0, out = 0;
    for (int k = 0; k < cnt && out < n; k++) {
        uint64_t a = pos, b = pos + iov[k].iov_len;
        pos = b;
        if (b <= from)
            continue;
        uint64_t lo = a > from ? a : from;
        uint64_t take = b - lo < n - out ? b - lo : n - out;
        memcpy(c->pb + out, (uint8_t *)iov[k].iov_base + (lo - a), take);
        out += take;
    }
    return true;
}

/* A piece whose memory a speculative readv may fill: not reported, no delay, fully sent. */
static bool spec_ok(const struct tcp_piece *q)
{
    return q && q->op == KVP_XFER_READ && !q->done && !q->late_until_ns && q->where == PIECE_INFLIGHT;
}

/*
 * Read what the socket has. Returns false if the conn failed.
 *
 * Answers come back in request order, and a READ piece knows the payload length its OK answer
 * carries. So after the header being read, the readv also asks for the payloads of the READs in
 * flight behind it, each straight into its caller memory, with their headers between them
 * (speculation; up to TCP_MAX_IOV iovecs): a pipelined batch of small READs costs one readv,
 * not one per piece. Only pieces that are not reported (the fence check), carry no delay and are
 * fully sent take part. Every header read that way is checked before its payload counts; the
 * first one that is not the expected OK answer (an error status) is handled as usual, and the
 * bytes read after it were read into the wrong place: they are copied to the connection's
 * pushback buffer, before any piece holding them is reported, and parsed from there first. That
 * copy happens only after an error answer; the speculative bytes written into that piece's memory
 * are overwritten or belong to a slot that ends in an error, and nothing lands outside a piece's
 * [local, local + length) or in the memory of a reported piece.
 */
static bool conn_recv(struct tcp_xport *t, struct tcp_conn *c)
{
    for (int rounds = 0; rounds < 64 || c->pb; rounds++) {
        struct iovec iov[TCP_MAX_IOV];
        struct tcp_piece *spec[TCP_MAX_IOV];
        int cnt = 0, nspec = 0;
        uint64_t pay_want = 0;
        bool to_caller = false;
        bool hdr_last = false; /* the iov list ends with (the rest of) c->rhdr */
        if (c->rpiece) {
            struct tcp_piece *p = c->rpiece;
            uint64_t rem = p->length - c->rgot;
            /* The fence check: caller memory only while the piece is not reported. */
            if (!p->done) {
                to_caller = true;
                pay_want = rem;
                iov[cnt++] = (struct iovec){p->local + c->rgot, rem};
            } else {
                pay_want = rem < TCP_SCRATCH_BYTES ? rem : TCP_SCRATCH_BYTES;
                iov[cnt++] = (struct iovec){t->scratch, pay_want};
            }
            if (pay_want == rem) {
                iov[cnt++] = (struct iovec){c->rhdr, KVP_FRAME_HEADER_BYTES};
                hdr_last = true;
            }
        } else {
            /* delay(): the answer of the piece next in line waits in the socket (as a late
             * completion would) until the delay passes or is lifted, reported or not. */
            struct tcp_piece *h = c->inflight.head;
            if (c->rhdr_got == 0 && h && h->late_until_ns) {
                if (t->now_ns < h->late_until_ns) {
                    c->paused = true;
                    c->pause_until_ns = h->late_until_ns;
                    conn_set_events(t, c, c->events & ~(uint32_t)EPOLLIN);
                    return true;
                }
                h->late_until_ns = 0; /* delay over: read it (into scratch if it was fenced) */
            }
            iov[cnt++] = (struct iovec){c->rhdr + c->rhdr_got, KVP_FRAME_HEADER_BYTES - c->rhdr_got};
            hdr_last = true;
        }
        uint64_t base_want = 0;
        for (int k = 0; k < cnt; k++)
            base_want += iov[k].iov_len;
        int base_cnt = cnt;
        /* Speculation (not while pushback bytes come first): spec[j]'s payload, then the header
         * of spec[j + 1] in t->spec_hdr[j], ... The header of spec[0] is c->rhdr. */
        if (hdr_last && !c->pb) {
            struct tcp_piece *q = c->inflight.head;
            while (spec_ok(q) && cnt + 1 <= TCP_MAX_IOV) {
                iov[cnt++] = (struct iovec){q->local, q->length};
                spec[nspec++] = q;
                struct tcp_piece *nq = q->next;
                if (!spec_ok(nq) || cnt + 2 > TCP_MAX_IOV)
                    break;
                iov[cnt++] = (struct iovec){t->spec_hdr[nspec - 1], KVP_FRAME_HEADER_BYTES};
                q = nq;
            }
        }
        uint64_t want = 0;
        for (int k = 0; k < cnt; k++)
            want += iov[k].iov_len;
        ssize_t r;
        if (c->pb)
            r = (ssize_t)pushback_copy(c, iov, cnt);
        else
            r = readv(c->fd, iov, cnt);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return true;
            char why[128];
            snprintf(why, sizeof why, "recv: %s", strerror(errno));
            conn_fail(t, c, KVP_ERR_TRANSFER, why);
            return false;
        }
        if (r == 0) {
            conn_fail(t, c, KVP_ERR_TRANSFER, "closed by the segment");
            return false;
        }
        uint64_t got = (uint64_t)r < base_want ? (uint64_t)r : base_want;
        uint64_t sgot = (uint64_t)r - got; /* bytes that went to the speculative iovecs */
        if (c->rpiece) {
            uint64_t pay = got < pay_want ? got : pay_want;
            if (!to_caller)
                t->st.stray_bytes += pay;
            c->rgot += pay;
            got -= pay;
            c->rhdr_got = (size_t)got; /* header bytes read past the payload (rhdr_got was 0) */
            if (c->rgot == c->rpiece->length) {
                struct tcp_piece *p = c->rpiece;
                c->rpiece = NULL;
                c->rgot = 0;
                report(t, p, KVP_OK); /* no-op if it was fenced */
                piece_put(t, p);
            }
        } else {
            c->rhdr_got += (size_t)got;
        }
        if (sgot == 0) {
            if (!c->rpiece && c->rhdr_got == KVP_FRAME_HEADER_BYTES && !conn_on_header(t, c))
                return false;
        } else {
            /* c->rhdr is complete (speculative bytes follow it); spec[0] answers it. */
            uint64_t pos = 0; /* offset in the speculative bytes */
            for (int j = 0; j < nspec; j++) {
                if (j > 0)
                    memcpy(c->rhdr, t->spec_hdr[j - 1], KVP_FRAME_HEADER_BYTES);
                c->rhdr_got = KVP_FRAME_HEADER_BYTES;
                if (!header_expected(c->rhdr, spec[j])) {
                    /* Everything after this header was read into the wrong place. */
                    if (!pushback_keep(c, iov + base_cnt, cnt - base_cnt, pos, sgot - pos)) {
                        conn_fail(t, c, KVP_ERR_TRANSFER, "out of memory for a pushback buffer");
                        return false;
                    }
                    if (c->pb)
                        t->st.pushbacks++;
                    if (!conn_on_header(t, c))
                        return false;
                    break;
                }
                if (!conn_on_header(t, c)) /* sets c->rpiece = spec[j] */
                    return false;
                uint64_t pay = sgot - pos < spec[j]->length ? sgot - pos : spec[j]->length;
                pos += pay;
                c->rgot = pay;
                if (pay < spec[j]->length)
                    break; /* the rest of this payload comes with the next read */
                c->rpiece = NULL;
                c->rgot = 0;
                t->st.spec_pieces++;
                report(t, spec[j], KVP_OK);
                free(spec[j]);
                uint64_t hb = sgot - pos < KVP_FRAME_HEADER_BYTES ? sgot - pos : KVP_FRAME_HEADER_BYTES;
                if (j + 1 == nspec || hb < KVP_FRAME_HEADER_BYTES) {
                    if (j + 1 < nspec) {
                        memcpy(c->rhdr, t->spec_hdr[j], (size_t)hb);
                        c->rhdr_got = (size_t)hb;
                    }
                    break;
                }
                pos += KVP_FRAME_HEADER_BYTES;
            }
        }
        if (c->pb)
            continue; /* parse the pushback bytes first: epoll does not know of them */
        /* A short read drained the socket, and with nothing in flight nothing more is due:
         * wait for epoll (level-triggered) instead of a readv that would answer EAGAIN. */
        if ((uint64_t)r < want || (!c->rpiece && !c->inflight.head && c->rhdr_got == 0))
            return true;
    }
    return true;
}

/* CONN_TOKEN: take the segment's challenge; when whole, send the token response (a fresh
 * socket's send buffer takes it at once) and go up. Returns false if the conn failed. */
static bool conn_token(struct tcp_xport *t, struct tcp_conn *c)
{
    while (c->challenge_got < TCP_CHALLENGE_BYTES) {
        ssize_t r = recv(c->fd, c->challenge + c->challenge_got, TCP_CHALLENGE_BYTES - c->challenge_got, MSG_DONTWAIT);
        if (r > 0) {
            c->challenge_got += (size_t)r;
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return true;
        conn_fail(t, c, KVP_ERR_TRANSFER, r == 0 ? "closed before the token challenge" : "token challenge: recv failed");
        return false;
    }
    uint8_t out[TCP_TOKEN_RESP_MAX];
    int n = t->p.token_respond(t->p.token_ctx, c->challenge, TCP_CHALLENGE_BYTES, out, sizeof out);
    if (n <= 0) {
        conn_fail(t, c, KVP_ERR_TRANSFER, "no data token for this segment");
        return false;
    }
    if (send(c->fd, out, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL) != n) {
        conn_fail(t, c, KVP_ERR_TRANSFER, "token response: send failed");
        return false;
    }
    c->state = CONN_UP;
    conn_set_events(t, c, EPOLLIN);
    return conn_send(t, c);
}

static void conn_on_event(struct tcp_xport *t, struct tcp_conn *c, uint32_t ev)
{
    if (c->state == CONN_CONNECTING) {
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
            err = errno;
        if (err != 0) {
            char why[128];
            snprintf(why, sizeof why, "connect: %s", strerror(err));
            conn_fail(t, c, KVP_ERR_TRANSFER, why);
            return;
        }
        if (!(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            return;
        c->state = CONN_UP;
        if (c->peer->down_logged) {
            kvp_log_info(t->name, "%s: connected again", c->peer->endpoint);
            c->peer->down_logged = false;
        }
        conn_set_events(t, c, EPOLLIN);
        if (t->p.token_respond) {
            c->state = CONN_TOKEN;
            c->challenge_got = 0;
            return;
        }
        conn_send(t, c);
        return;
    }
    if (c->state == CONN_TOKEN && !conn_token(t, c))
        return;
    if (c->state != CONN_UP)
        return;
    if ((ev & (EPOLLIN | EPOLLERR | EPOLLHUP)) && !c->paused && !conn_recv(t, c))
        return;
    if ((ev & EPOLLOUT) && !conn_send(t, c))
        return;
    if ((ev & (EPOLLERR | EPOLLHUP)) && c->state == CONN_UP)
        conn_fail(t, c, KVP_ERR_TRANSFER, "socket error");
}

/* Start whatever a connection with queued requests needs: a connect or a send. */
static void conn_kick(struct tcp_xport *t, struct tcp_conn *c)
{
    if (!c->sendq.head || c->close_pending)
        return;
    if (c->state == CONN_IDLE)
        conn_connect(t, c);
    else if (c->state == CONN_UP && !(c->events & EPOLLOUT))
        conn_send(t, c);
}

static struct tcp_conn *pick_conn(struct tcp_xport *t, struct tcp_peer *peer)
{
    /* Small requests are packed onto the first connection that still has room below
     * TCP_PACK_BYTES: a batch of many small pieces then wakes one server loop per peer
     * instead of conns_per_peer of them (wake-ups dominate small transfers). Larger loads
     * spread over the least loaded connection. */
    struct tcp_conn *best = &peer->conns[0];
    for (uint32_t i = 0; i < t->p.conns_per_peer; i++) {
        struct tcp_conn *c = &peer->conns[i];
        if (c->load < TCP_PACK_BYTES)
            return c;
        if (c->load < best->load)
            best = c;
    }
    return best;
}

static void piece_enqueue(struct tcp_xport *t, struct tcp_piece *p)
{
    struct tcp_conn *c = pick_conn(t, p->peer);
    p->conn = c;
    p->where = PIECE_SENDQ;
    c->load += piece_cost(p);
    list_push(&c->sendq, p);
}

/* ------------------------------------------------------------------ fencing */

/*
 * Close c because a fenced WRITE was mid-send on it. The requests of other calls on it are not a
 * failure of the peer: they go out again on a fresh connection instead of failing with
 * KVP_ERR_TRANSFER (which a put or get reports to the master as "segment unreachable"; a live
 * segment would be probed, and declared lost if the probe and a heartbeat were late under load).
 * Those queued behind it never reached the wire; those sent before it await their answers, which
 * the close discards: a READ is read again, a WRITE writes the same bytes to the same place again
 * under the same write deadline (a copy the segment already took from the closed connection lands
 * before that deadline or not at all, as for any fenced WRITE). A READ whose answer is being
 * received (c->rpiece) still fails with the connection.
 */
static void conn_close_fenced(struct tcp_xport *t, struct tcp_conn *c)
{
    struct tcp_list keep = {0};
    for (struct tcp_piece *p = c->inflight.head, *np; p; p = np) {
        np = p->next;
        if (!p->done) {
            list_unlink(&c->inflight, p);
            c->load -= piece_cost(p);
            p->sent = 0;
            p->where = PIECE_SENDQ;
            list_push(&keep, p);
        }
    }
    for (struct tcp_piece *p = c->sendq.head, *np; p; p = np) {
        np = p->next;
        if (!p->done && p->sent == 0) {
            list_unlink(&c->sendq, p);
            c->load -= piece_cost(p);
            list_push(&keep, p);
        }
    }
    conn_fail(t, c, KVP_ERR_TRANSFER, "fenced a request mid-send");
    struct tcp_peer *peer = c->peer;
    struct tcp_piece *p;
    while ((p = keep.head)) {
        list_unlink(&keep, p);
        piece_enqueue(t, p);
    }
    for (uint32_t i = 0; i < t->p.conns_per_peer; i++)
        conn_kick(t, &peer->conns[i]); /* skips close_pending ones: closed next by the caller */
}

static int id_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bool id_in(const uint64_t *sorted, size_t n, uint64_t id)
{
    return n && bsearch(&id, sorted, n, sizeof id, id_cmp) != NULL;
}

/* Fence one piece (see transport.h); a WRITE mid-send marks its connection close_pending. */
static void fence_piece(struct tcp_xport *t, struct tcp_piece *p, int status, struct tcp_conn **to_close,
                        size_t *n_close, bool *overflow)
{
    struct tcp_conn *c = p->conn;
    switch (p->where) {
    case PIECE_SENDQ:
        if (p->sent == 0) { /* not started: dropped */
            list_unlink(&c->sendq, p);
            c->load -= piece_cost(p);
            report(t, p, status);
            piece_put(t, p);
        } else if (p->op == KVP_XFER_READ) {
            /* Only its header is partly sent (transport memory): finish sending it and drain
             * the answer into scratch like any fenced in-flight READ. */
            report(t, p, status);
        } else { /* WRITE mid-send from caller memory: the connection must go */
            report(t, p, status);
            if (!c->close_pending) {
                c->close_pending = true;
                if (*n_close < TCP_MAX_IOV)
                    to_close[(*n_close)++] = c;
                else
                    *overflow = true;
            }
        }
        break;
    default: /* PIECE_INFLIGHT: answer not started; PIECE_RECV: mid-receive: the rest goes to scratch */
        report(t, p, status);
        break;
    }
}

static void tcp_fence(struct kvp_xport *x, const uint64_t *ids, size_t n, int status)
{
    struct tcp_xport *t = T(x);
    if (n == 0)
        return;
    uint64_t *sorted = malloc(n * sizeof *sorted);
    if (sorted) {
        memcpy(sorted, ids, n * sizeof *sorted);
        qsort(sorted, n, sizeof *sorted, id_cmp);
    }
    struct tcp_conn *to_close[TCP_MAX_IOV];
    size_t n_close = 0;
    bool overflow = false;
    for (struct tcp_peer *peer = t->peers; peer; peer = peer->next)
        for (uint32_t i = 0; i < t->p.conns_per_peer; i++) {
            struct tcp_conn *c = &peer->conns[i];
            struct tcp_list *lists[2] = {&c->sendq, &c->inflight};
            for (int l = 0; l < 2; l++)
                for (struct tcp_piece *p = lists[l]->head, *np; p; p = np) {
                    np = p->next;
                    bool hit = sorted ? id_in(sorted, n, p->id) : true; /* no memory: fence all */
                    if (!p->done && hit)
                        fence_piece(t, p, status, to_close, &n_close, &overflow);
                }
            if (c->rpiece && !c->rpiece->done && (sorted ? id_in(sorted, n, c->rpiece->id) : true))
                report(t, c->rpiece, status);
        }
    free(sorted);
    for (size_t i = 0; i < n_close; i++)
        conn_close_fenced(t, to_close[i]);
    if (overflow)
        for (struct tcp_peer *peer = t->peers; peer; peer = peer->next)
            for (uint32_t i = 0; i < t->p.conns_per_peer; i++)
                if (peer->conns[i].close_pending)
                    conn_close_fenced(t, &peer->conns[i]);
}

/* TCP fences at once, so abort only closes: every connection that holds one of the ids. */
static void tcp_abort(struct kvp_xport *x, const uint64_t *ids, size_t n)
{
    struct tcp_xport *t = T(x);
    for (size_t k = 0; k < n; k++)
        for (struct tcp_peer *peer = t->peers; peer; peer = peer->next)
            for (uint32_t i = 0; i < t->p.conns_per_peer; i++) {
                struct tcp_conn *c = &peer->conns[i];
                bool has = c->rpiece && c->rpiece->id == ids[k] && !c->rpiece->done;
                struct tcp_list *lists[2] = {&c->sendq, &c->inflight};
                for (int l = 0; l < 2 && !has; l++)
                    for (struct tcp_piece *p = lists[l]->head; p && !has; p = p->next)
                        has = p->id == ids[k] && !p->done;
                if (has) {
                    /* report the aborted one FENCE_FAILED before the close fails the rest */
                    for (int l = 0; l < 2; l++)
                        for (struct tcp_piece *p = lists[l]->head; p; p = p->next)
                            if (p->id == ids[k])
                                report(t, p, KVP_ERR_FENCE_FAILED);
                    if (c->rpiece && c->rpiece->id == ids[k])
                        report(t, c->rpiece, KVP_ERR_FENCE_FAILED);
                    t->st.aborted++;
                    conn_fail(t, c, KVP_ERR_TRANSFER, "torn down: a piece could not be fenced");
                }
            }
}

/* ------------------------------------------------------------------ ops */

static int tcp_open(struct kvp_xport **out, const struct kvp_xport_params *p)
{
    struct tcp_xport *t = calloc(1, sizeof *t);
    if (!t)
        return KVP_ERR_NOMEM;
    t->p = *p;
    t->p.name = NULL;
    t->p.inner = NULL;
    t->p.wrap_opts = NULL;
    if (t->p.conns_per_peer == 0)
        t->p.conns_per_peer = 4;
    snprintf(t->name, sizeof t->name, "%s", p->name ? p->name : "xfer-tcp");
    t->scratch = malloc(TCP_SCRATCH_BYTES);
    t->ep = epoll_create1(EPOLL_CLOEXEC);
    if (!t->scratch || t->ep < 0 || cq_reserve(t, 64) != KVP_OK) {
        int rc = t->ep < 0 ? KVP_ERR_IO : KVP_ERR_NOMEM;
        if (t->ep >= 0)
            close(t->ep);
        free(t->scratch);
        free(t->cq);
        free(t);
        return rc;
    }
    *out = (struct kvp_xport *)t;
    return KVP_OK;
}

static int tcp_fds(struct kvp_xport *x, int *fds, size_t max)
{
    if (max < 1)
        return 0;
    fds[0] = T(x)->ep;
    return 1;
}

static int tcp_connect(struct kvp_xport *x, const char *endpoint, const struct sockaddr_storage *addr,
                       unsigned addr_len, struct kvp_xport_peer **out)
{
    struct tcp_xport *t = T(x);
    struct tcp_peer *p = calloc(1, sizeof *p);
    if (p) {
        p->endpoint = strdup(endpoint);
        p->conns = calloc(t->p.conns_per_peer, sizeof *p->conns);
    }
    if (!p || !p->endpoint || !p->conns) {
        if (p) {
            free(p->endpoint);
            free(p->conns);
            free(p);
        }
        return KVP_ERR_NOMEM;
    }
    p->addr = *addr;
    p->addr_len = addr_len;
    for (uint32_t i = 0; i < t->p.conns_per_peer; i++) {
        p->conns[i].peer = p;
        p->conns[i].fd = -1;
    }
    p->next = t->peers;
    t->peers = p;
    *out = (struct kvp_xport_peer *)p;
    return KVP_OK;
}

static int tcp_post(struct kvp_xport *x, struct kvp_xport_peer *xp, const struct kvp_xport_slice *s, size_t n)
{
    struct tcp_xport *t = T(x);
    struct tcp_peer *peer = (struct tcp_peer *)xp;
    for (size_t i = 0; i < n; i++)
        if ((s[i].op != KVP_XFER_READ && s[i].op != KVP_XFER_WRITE) || s[i].length == 0 ||
            s[i].length > KVP_FRAME_MAX_LENGTH || !s[i].local)
            return KVP_ERR_INVALID;
    /* Room for every completion that can be queued before the next poll: a report never fails. */
    if (cq_reserve(t, t->cq_n + t->live + n + 1) != KVP_OK)
        return KVP_ERR_NOMEM;
    /* Every piece first (all or none is posted), chained through next until enqueued. */
    struct tcp_piece *ps = NULL;
    for (size_t i = 0; i < n; i++) {
        struct tcp_piece *p = piece_get(t);
        if (!p) {
            while (ps) {
                struct tcp_piece *np = ps->next;
                piece_put(t, ps);
                ps = np;
            }
            return KVP_ERR_NOMEM;
        }
        p->next = ps;
        ps = p;
    }
    for (size_t i = 0; i < n; i++) {
        struct tcp_piece *p = ps;
        ps = p->next;
        p->id = s[i].id;
        p->peer = peer;
        p->op = s[i].op;
        p->local = s[i].local;
        p->length = s[i].length;
        p->req_id = ++t->next_req_id;
        struct kvp_frame f = {.op = s[i].op == KVP_XFER_READ ? KVP_FRAME_READ : KVP_FRAME_WRITE,
                              .segment_id = s[i].segment_id,
                              .req_id = p->req_id,
                              .offset = s[i].remote_offset,
                              .length = s[i].length,
                              .deadline = s[i].op == KVP_XFER_WRITE && s[i].write_deadline_ms
                                              ? kvp_frame_deadline_make(s[i].write_deadline_ms)
                                              : 0};
        kvp_frame_encode(&f, p->hdr);
        piece_enqueue(t, p);
        t->live++;
    }
    for (uint32_t i = 0; i < t->p.conns_per_peer; i++) {
        struct tcp_conn *c = &peer->conns[i];
        if (!c->sendq.head || c->kick)
            continue;
        if (t->n_kicks == t->cap_kicks) {
            size_t nc = t->cap_kicks ? t->cap_kicks * 2 : 16;
            struct tcp_conn **nk = realloc(t->kicks, nc * sizeof *nk);
            if (!nk) { /* send now instead of batching it with the next runs */
                conn_kick(t, c);
                continue;
            }
            t->kicks = nk;
            t->cap_kicks = nc;
        }
        c->kick = true;
        t->kicks[t->n_kicks++] = c;
    }
    return KVP_OK;
}

static int tcp_poll(struct kvp_xport *x, uint64_t now_ns, struct kvp_xport_completion *out, size_t max,
                    uint64_t *next_ns)
{
    struct tcp_xport *t = T(x);
    t->now_ns = now_ns;
    for (size_t i = 0; i < t->n_kicks; i++) {
        t->kicks[i]->kick = false;
        conn_kick(t, t->kicks[i]);
    }
    t->n_kicks = 0;
    if (t->cq_n < max) {
        struct epoll_event evs[64];
        int n = epoll_wait(t->ep, evs, 64, 0);
        if (n < 0 && errno != EINTR)
            kvp_log_error(t->name, "epoll_wait: %s", strerror(errno));
        for (int i = 0; i < n; i++)
            conn_on_event(t, evs[i].data.ptr, evs[i].events);
    }
    uint64_t next = UINT64_MAX;
    for (struct tcp_peer *peer = t->peers; peer; peer = peer->next)
        for (uint32_t i = 0; i < t->p.conns_per_peer; i++) {
            struct tcp_conn *c = &peer->conns[i];
            if (c->paused) {
                if (now_ns >= c->pause_until_ns) {
                    c->paused = false;
                    conn_set_events(t, c, c->events | EPOLLIN);
                    conn_recv(t, c);
                } else if (c->pause_until_ns < next) {
                    next = c->pause_until_ns;
                }
            }
            if (c->state == CONN_CONNECTING || c->state == CONN_TOKEN) {
                if (c->connect_deadline_ns <= now_ns)
                    conn_fail(t, c, KVP_ERR_TRANSFER, "connect timeout");
                else if (c->connect_deadline_ns < next)
                    next = c->connect_deadline_ns;
            }
        }
    size_t k = t->cq_n < max ? t->cq_n : max;
    if (k > 0) {
        memcpy(out, t->cq, k * sizeof *out);
        memmove(t->cq, t->cq + k, (t->cq_n - k) * sizeof *t->cq);
        t->cq_n -= k;
    }
    if (t->cq_n > 0)
        next = now_ns; /* more to hand out */
    *next_ns = next;
    return (int)k;
}

static void tcp_stats(struct kvp_xport *x, struct kvp_xport_stats *out)
{
    struct tcp_xport *t = T(x);
    out->stray_bytes += t->st.stray_bytes;
    out->spec_pieces += t->st.spec_pieces;
    out->pushbacks += t->st.pushbacks;
    out->aborted += t->st.aborted;
}

static void tcp_close(struct kvp_xport *x)
{
    struct tcp_xport *t = T(x);
    if (!t)
        return;
    struct tcp_peer *peer = t->peers;
    while (peer) {
        struct tcp_peer *np = peer->next;
        for (uint32_t i = 0; i < t->p.conns_per_peer; i++)
            conn_fail(t, &peer->conns[i], KVP_ERR_CLOSED, "transport closed");
        free(peer->conns);
        free(peer->endpoint);
        free(peer);
        peer = np;
    }
    close(t->ep);
    while (t->pool) {
        struct tcp_piece *np = t->pool->next;
        free(t->pool);
        t->pool = np;
    }
    free(t->scratch);
    free(t->cq);
    free(t->kicks);
    free(t);
}

/* Fault injection's LATE on a READ (fault.h): its answer is not read before until_ns; 0 lifts it. */
void xfer_tcp_delay(struct kvp_xport *x, uint64_t id, uint64_t until_ns)
{
    struct tcp_xport *t = T(x);
    for (struct tcp_peer *peer = t->peers; peer; peer = peer->next)
        for (uint32_t i = 0; i < t->p.conns_per_peer; i++) {
            struct tcp_conn *c = &peer->conns[i];
            struct tcp_list *lists[2] = {&c->sendq, &c->inflight};
            for (int l = 0; l < 2; l++)
                for (struct tcp_piece *p = lists[l]->head; p; p = p->next)
                    if (p->id == id) {
                        p->late_until_ns = until_ns;
                        if (c->paused && (until_ns == 0 || until_ns < c->pause_until_ns))
                            c->pause_until_ns = until_ns; /* poll resumes it */
                        return;
                    }
        }
}

const struct kvp_xport_ops kvp_xport_tcp = {
    .name = "tcp",
    .open = tcp_open,
    .fds = tcp_fds,
    .connect = tcp_connect,
    .post = tcp_post,
    .poll = tcp_poll,
    .fence = tcp_fence,
    .abort = tcp_abort,
    .stats = tcp_stats,
    .close = tcp_close,
};
