/*
 * xfer_engine.c — the transfer engine: batches of slices over TCP (one I/O thread, epoll,
 * nonblocking sockets, several pipelined connections per endpoint) and the local memcpy
 * transport. See transfer.h for the contract and docs/data-plane.md for the design.
 *
 * A batch is a small state machine hosted by the I/O thread (the "batch actor"): its pieces
 * are queued on connections, each piece ends completed, failed or fenced, and when the last one
 * is terminal the I/O thread marks the batch done and wakes its caller. Fencing happens on the
 * I/O thread, which is also the only thread that touches caller memory for TCP slices, so once
 * a piece is marked terminal (piece->batch = NULL) nothing reads or writes its memory again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "actors/transfer/fault.h"
#include "actors/transfer/transfer_internal.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define ACTOR "xfer"
#define XFER_DEFAULT_FENCE_BOUND_MS 2000u

static void wake(struct kvp_xfer_engine *e)
{
    uint64_t one = 1;
    if (write(e->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        kvp_log_warn(ACTOR, "wake: %s", strerror(errno));
}

#ifdef KVP_FAULT_INJECTION
static void wake_cb(void *arg) { wake(arg); }
#endif

/* ------------------------------------------------------------------ lists */

static void list_push(struct xfer_list *l, struct xfer_piece *p)
{
    p->next = NULL;
    p->prev = l->tail;
    if (l->tail)
        l->tail->next = p;
    else
        l->head = p;
    l->tail = p;
}

static void list_unlink(struct xfer_list *l, struct xfer_piece *p)
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

static uint64_t piece_cost(const struct xfer_piece *p) { return p->length + XFER_PIECE_COST; }

static void piece_free(struct xfer_piece *p)
{
#ifdef KVP_FAULT_INJECTION
    if (p && p->fault && p->fault != KVP_FAULT_FAIL)
        xfer_fault_outstanding_add(-1);
#endif
    free(p);
}

/* ------------------------------------------------------------------ batch completion */

static void batch_complete(struct kvp_xfer_engine *e, struct xfer_batch *b)
{
    if (b->aprev)
        b->aprev->anext = b->anext;
    else if (e->active == b)
        e->active = b->anext;
    if (b->anext)
        b->anext->aprev = b->aprev;
    b->aprev = b->anext = NULL;
    pthread_mutex_lock(&e->mu);
    b->done = true;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&e->mu);
    /* b belongs to its caller again: not touched after this point. */
}

/*
 * Make p terminal with `status`. The piece itself is not freed (the caller of this function
 * decides: a piece still on a connection's inflight list stays there to be drained).
 * After this returns, p->local is never used again.
 */
static void piece_finish(struct kvp_xfer_engine *e, struct xfer_piece *p, int status)
{
    struct xfer_batch *b = p->batch;
    if (!b)
        return;
    struct kvp_xfer_slice *s = &b->slices[p->slice];
    if (status != KVP_OK && s->status == KVP_OK)
        s->status = status;
    p->batch = NULL;
    p->local = NULL;
    b->pieces[p->idx] = NULL;
    if (--b->left == 0)
        batch_complete(e, b);
}

/* ------------------------------------------------------------------ connections */

static void conn_set_events(struct kvp_xfer_engine *e, struct xfer_conn *c, uint32_t ev)
{
    if (c->fd < 0 || c->events == ev)
        return;
    struct epoll_event ee = {.events = ev, .data.ptr = c};
    if (epoll_ctl(e->ep, EPOLL_CTL_MOD, c->fd, &ee) == 0)
        c->events = ev;
}

static void conn_want_out(struct kvp_xfer_engine *e, struct xfer_conn *c, bool out)
{
    conn_set_events(e, c, (c->paused ? 0 : EPOLLIN) | (out ? EPOLLOUT : 0));
}

static void drop_list(struct kvp_xfer_engine *e, struct xfer_list *l, int status)
{
    struct xfer_piece *p;
    while ((p = l->head)) {
        list_unlink(l, p);
        piece_finish(e, p, status);
        piece_free(p);
    }
}

static bool conn_has_write(const struct xfer_conn *c)
{
    for (const struct xfer_piece *p = c->sendq.head; p; p = p->next)
        if (p->op == KVP_XFER_WRITE)
            return true;
    for (const struct xfer_piece *p = c->inflight.head; p; p = p->next)
        if (p->op == KVP_XFER_WRITE)
            return true;
    return false;
}

/* Close the connection; every piece on it that is not terminal fails with `status`. */
static void conn_fail(struct kvp_xfer_engine *e, struct xfer_conn *c, int status, const char *why)
{
    if (c->fd >= 0) {
        bool busy = c->sendq.head || c->inflight.head || c->rpiece;
        /* One WARN per peer until a connection to it succeeds again (a dead segment with
         * several connections and many batches would otherwise flood the log). */
        if (busy && status != KVP_ERR_CLOSED && !c->peer->down_logged) {
            kvp_log_warn(ACTOR, "%s: connection closed: %s", c->peer->endpoint, why);
            c->peer->down_logged = true;
        } else {
            kvp_log_debug(ACTOR, "%s: connection closed: %s", c->peer->endpoint, why);
        }
        epoll_ctl(e->ep, EPOLL_CTL_DEL, c->fd, NULL);
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
    drop_list(e, &c->sendq, status);
    drop_list(e, &c->inflight, status);
    if (c->rpiece) {
        piece_finish(e, c->rpiece, status);
        piece_free(c->rpiece);
        c->rpiece = NULL;
    }
    c->rgot = 0;
    c->rhdr_got = 0;
    c->load = 0;
    free(c->pb);
    c->pb = NULL;
    c->pb_len = c->pb_off = 0;
}

static void conn_connect(struct kvp_xfer_engine *e, struct xfer_conn *c)
{
    int fd = -1;
    int rc = xfer_connect_start(&c->peer->addr, c->peer->addr_len, &fd);
    if (rc < 0) {
        char why[128];
        snprintf(why, sizeof why, "connect: %s", strerror(-rc));
        conn_fail(e, c, KVP_ERR_TRANSFER, why);
        return;
    }
    c->fd = fd;
    c->state = rc == 0 ? CONN_UP : CONN_CONNECTING;
    c->events = rc == 0 ? EPOLLIN | EPOLLOUT : EPOLLOUT;
    c->connect_deadline_ns = kvp_clock_now_ns() + (uint64_t)e->p.connect_timeout_ms * 1000000ull;
    struct epoll_event ee = {.events = c->events, .data.ptr = c};
    if (epoll_ctl(e->ep, EPOLL_CTL_ADD, fd, &ee) != 0) {
        close(fd);
        c->fd = -1;
        conn_fail(e, c, KVP_ERR_TRANSFER, "epoll_ctl failed");
    }
}

/* Send as much of the send queue as the socket takes. Returns false if the conn failed. */
static bool conn_send(struct kvp_xfer_engine *e, struct xfer_conn *c)
{
    while (c->state == CONN_UP && c->sendq.head) {
        struct iovec iov[XFER_MAX_IOV];
        int cnt = 0;
        for (struct xfer_piece *p = c->sendq.head; p && cnt + 2 <= XFER_MAX_IOV; p = p->next) {
            /* Pieces on sendq are not terminal, except a fenced READ whose header is partly
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
                conn_want_out(e, c, true);
                return true;
            }
            char why[128];
            snprintf(why, sizeof why, "send: %s", strerror(errno));
            conn_fail(e, c, KVP_ERR_TRANSFER, why);
            return false;
        }
        uint64_t left = (uint64_t)r;
        while (left > 0) {
            struct xfer_piece *p = c->sendq.head;
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
        conn_want_out(e, c, false);
    return c->state == CONN_UP;
}

/* A complete response header is in c->rhdr. Returns false if the conn failed. */
static bool conn_on_header(struct kvp_xfer_engine *e, struct xfer_conn *c)
{
    struct kvp_frame f;
    int rc = kvp_frame_decode(c->rhdr, &f);
    c->rhdr_got = 0;
    struct xfer_piece *p = c->inflight.head;
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
        conn_fail(e, c, KVP_ERR_TRANSFER, bad);
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
        kvp_log_debug(ACTOR, "%s: segment %u answered %s", c->peer->endpoint, f.segment_id,
                      kvp_errname(st));
    piece_finish(e, p, st);
    piece_free(p);
    return true;
}

/* Fully received response header `h` is the one READ piece q expects: OK, with q's length. */
static bool header_expected(const uint8_t *h, const struct xfer_piece *q)
{
    struct kvp_frame f;
    return kvp_frame_decode(h, &f) == KVP_OK && f.req_id == q->req_id && f.op == KVP_FRAME_READ_RESP &&
           f.status == 0 && f.length == q->length;
}

/* Serve a "read" from the connection's pushback bytes instead of the socket (see conn_recv). */
static size_t pushback_copy(struct xfer_conn *c, const struct iovec *iov, int cnt)
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
 * speculative readv put them where the response turned out not to go. Called before any piece
 * whose memory holds them is finished (after a finish the caller may free that memory).
 */
static bool pushback_keep(struct xfer_conn *c, const struct iovec *iov, int cnt, uint64_t from, uint64_t n)
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

/*
 * Read what the socket has. Returns false if the conn failed.
 *
 * Responses come back in request order, and a READ piece knows the payload length its OK answer
 * carries. So after the header being read, the readv also asks for the payloads of the READs in
 * flight behind it, each straight into its caller memory, with their headers between them
 * (speculation; up to XFER_MAX_IOV iovecs): a pipelined batch of small READs costs one readv,
 * not one per piece. Only pieces that are not terminal (the fence check), carry no fault rule
 * and are fully sent take part. Every header read that way is checked before its payload counts;
 * the first one that is not the expected OK answer (an error status) is handled as usual, and
 * the bytes read after it were read into the wrong place: they are copied to the connection's
 * pushback buffer, before any piece holding them is finished, and parsed from there first. That
 * copy happens only after an error answer; the speculative bytes written into that piece's memory
 * are overwritten or belong to a slot that ends in an error, and nothing lands outside a piece's
 * [local, local + length) or in the memory of a terminal piece.
 */
static bool conn_recv(struct kvp_xfer_engine *e, struct xfer_conn *c)
{
    for (int rounds = 0; rounds < 64 || c->pb; rounds++) {
        struct iovec iov[XFER_MAX_IOV];
        struct xfer_piece *spec[XFER_MAX_IOV];
        int cnt = 0, nspec = 0;
        uint64_t pay_want = 0;
        bool to_caller = false;
        bool hdr_last = false; /* the iov list ends with (the rest of) c->rhdr */
        if (c->rpiece) {
            struct xfer_piece *p = c->rpiece;
            uint64_t rem = p->length - c->rgot;
            /* The fence check: caller memory only while the piece is not terminal. */
            if (p->batch) {
                to_caller = true;
                pay_want = rem;
                iov[cnt++] = (struct iovec){p->local + c->rgot, rem};
            } else {
                pay_want = rem < XFER_SCRATCH_BYTES ? rem : XFER_SCRATCH_BYTES;
                iov[cnt++] = (struct iovec){e->scratch, pay_want};
            }
            if (pay_want == rem) {
                iov[cnt++] = (struct iovec){c->rhdr, KVP_FRAME_HEADER_BYTES};
                hdr_last = true;
            }
        } else {
#ifdef KVP_FAULT_INJECTION
            /* Fault LATE on a READ: its response waits in the socket (as a delayed completion
             * would) until the delay passes or the test releases it, fenced or not. */
            struct xfer_piece *h = c->inflight.head;
            if (c->rhdr_got == 0 && h && h->fault == KVP_FAULT_LATE && h->op == KVP_XFER_READ) {
                if (kvp_clock_now_ns() < h->fault_until_ns && xfer_fault_generation() == h->fault_gen) {
                    c->paused = true;
                    c->pause_until_ns = h->fault_until_ns;
                    c->pause_gen = h->fault_gen;
                    conn_set_events(e, c, c->events & ~(uint32_t)EPOLLIN);
                    return true;
                }
                h->fault_until_ns = 0; /* delay over: read it (into scratch if it was fenced) */
            }
#endif
            iov[cnt++] = (struct iovec){c->rhdr + c->rhdr_got, KVP_FRAME_HEADER_BYTES - c->rhdr_got};
            hdr_last = true;
        }
        uint64_t base_want = 0;
        for (int k = 0; k < cnt; k++)
            base_want += iov[k].iov_len;
        int base_cnt = cnt;
        /* Speculation (not while pushback bytes come first): spec[j]'s payload, then the header
         * of spec[j + 1] in e->spec_hdr[j], ... The header of spec[0] is c->rhdr. */
        if (hdr_last && !c->pb) {
            struct xfer_piece *q = c->inflight.head;
            while (q && q->op == KVP_XFER_READ && q->batch && !q->fault && q->where == PIECE_INFLIGHT &&
                   cnt + 1 <= XFER_MAX_IOV) {
                iov[cnt++] = (struct iovec){q->local, q->length};
                spec[nspec++] = q;
                struct xfer_piece *nq = q->next;
                if (!nq || nq->op != KVP_XFER_READ || !nq->batch || nq->fault || nq->where != PIECE_INFLIGHT ||
                    cnt + 2 > XFER_MAX_IOV)
                    break;
                iov[cnt++] = (struct iovec){e->spec_hdr[nspec - 1], KVP_FRAME_HEADER_BYTES};
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
            conn_fail(e, c, KVP_ERR_TRANSFER, why);
            return false;
        }
        if (r == 0) {
            conn_fail(e, c, KVP_ERR_TRANSFER, "closed by the segment");
            return false;
        }
        uint64_t got = (uint64_t)r < base_want ? (uint64_t)r : base_want;
        uint64_t sgot = (uint64_t)r - got; /* bytes that went to the speculative iovecs */
        if (c->rpiece) {
            uint64_t pay = got < pay_want ? got : pay_want;
            if (!to_caller)
                STAT_ADD(e, st_stray, pay);
            c->rgot += pay;
            got -= pay;
            c->rhdr_got = (size_t)got; /* header bytes read past the payload (rhdr_got was 0) */
            if (c->rgot == c->rpiece->length) {
                struct xfer_piece *p = c->rpiece;
                c->rpiece = NULL;
                c->rgot = 0;
                piece_finish(e, p, KVP_OK); /* no-op if it was fenced */
                piece_free(p);
            }
        } else {
            c->rhdr_got += (size_t)got;
        }
        if (sgot == 0) {
            if (!c->rpiece && c->rhdr_got == KVP_FRAME_HEADER_BYTES && !conn_on_header(e, c))
                return false;
        } else {
            /* c->rhdr is complete (speculative bytes follow it); spec[0] answers it. */
            uint64_t pos = 0; /* offset in the speculative bytes */
            for (int j = 0; j < nspec; j++) {
                if (j > 0)
                    memcpy(c->rhdr, e->spec_hdr[j - 1], KVP_FRAME_HEADER_BYTES);
                c->rhdr_got = KVP_FRAME_HEADER_BYTES;
                if (!header_expected(c->rhdr, spec[j])) {
                    /* Everything after this header was read into the wrong place. */
                    if (!pushback_keep(c, iov + base_cnt, cnt - base_cnt, pos, sgot - pos)) {
                        conn_fail(e, c, KVP_ERR_TRANSFER, "out of memory for a pushback buffer");
                        return false;
                    }
                    if (c->pb)
                        STAT_ADD(e, st_pushback, 1);
                    if (!conn_on_header(e, c))
                        return false;
                    break;
                }
                if (!conn_on_header(e, c)) /* sets c->rpiece = spec[j] */
                    return false;
                uint64_t pay = sgot - pos < spec[j]->length ? sgot - pos : spec[j]->length;
                pos += pay;
                c->rgot = pay;
                if (pay < spec[j]->length)
                    break; /* the rest of this payload comes with the next read */
                c->rpiece = NULL;
                c->rgot = 0;
                STAT_ADD(e, st_spec, 1);
                piece_finish(e, spec[j], KVP_OK);
                piece_free(spec[j]);
                uint64_t hb = sgot - pos < KVP_FRAME_HEADER_BYTES ? sgot - pos : KVP_FRAME_HEADER_BYTES;
                if (j + 1 == nspec || hb < KVP_FRAME_HEADER_BYTES) {
                    if (j + 1 < nspec) {
                        memcpy(c->rhdr, e->spec_hdr[j], (size_t)hb);
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

static void conn_on_event(struct kvp_xfer_engine *e, struct xfer_conn *c, uint32_t ev)
{
    if (c->state == CONN_CONNECTING) {
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
            err = errno;
        if (err != 0) {
            char why[128];
            snprintf(why, sizeof why, "connect: %s", strerror(err));
            conn_fail(e, c, KVP_ERR_TRANSFER, why);
            return;
        }
        if (!(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            return;
        c->state = CONN_UP;
        if (c->peer->down_logged) {
            kvp_log_info(ACTOR, "%s: connected again", c->peer->endpoint);
            c->peer->down_logged = false;
        }
        conn_set_events(e, c, EPOLLIN);
        conn_send(e, c);
        return;
    }
    if (c->state != CONN_UP)
        return;
    if ((ev & (EPOLLIN | EPOLLERR | EPOLLHUP)) && !c->paused && !conn_recv(e, c))
        return;
    if ((ev & EPOLLOUT) && !conn_send(e, c))
        return;
    if ((ev & (EPOLLERR | EPOLLHUP)) && c->state == CONN_UP)
        conn_fail(e, c, KVP_ERR_TRANSFER, "socket error");
}

/* ------------------------------------------------------------------ dispatch and fencing */

static struct xfer_conn *pick_conn(struct kvp_xfer_engine *e, struct xfer_peer *peer)
{
    if (!peer->io_known) {
        peer->io_known = true;
        peer->io_next = e->io_peers;
        e->io_peers = peer;
    }
    /* Small requests are packed onto the first connection that still has room below
     * XFER_PACK_BYTES: a batch of many small pieces then wakes one server thread per peer
     * instead of conns_per_peer of them (wake-ups dominate small transfers). Larger loads
     * spread over the least loaded connection. */
    struct xfer_conn *best = &peer->conns[0];
    for (uint32_t i = 0; i < e->p.conns_per_peer; i++) {
        struct xfer_conn *c = &peer->conns[i];
        if (c->load < XFER_PACK_BYTES)
            return c;
        if (c->load < best->load)
            best = c;
    }
    return best;
}

static void dispatch_batch(struct kvp_xfer_engine *e, struct xfer_batch *b)
{
    b->aprev = NULL;
    b->anext = e->active;
    if (e->active)
        e->active->aprev = b;
    e->active = b;
    /* Queue every piece first; connect/send afterwards (a failing connect finishes pieces, and
     * the batch must not complete while we are still walking its piece array). */
    size_t n = b->n_pieces;
    bool any_fail = false;
    for (size_t i = 0; i < n; i++) {
        struct xfer_piece *p = b->pieces[i];
#ifdef KVP_FAULT_INJECTION
        if (p->fault) {
            uint64_t now = kvp_clock_now_ns();
            p->fault_gen = xfer_fault_generation();
            p->fault_until_ns = now + (uint64_t)p->fault_ms * 1000000ull;
            if (p->fault == KVP_FAULT_FAIL) {
                any_fail = true;
                continue;
            }
            if (p->fault == KVP_FAULT_LATE && p->op == KVP_XFER_WRITE)
                xfer_fault_late_write(&p->peer->addr, p->peer->addr_len, p->hdr, p->local, p->length,
                                      p->fault_ms);
            if (p->fault != KVP_FAULT_LATE || p->op == KVP_XFER_WRITE) {
                if (p->fault == KVP_FAULT_DROP || p->fault == KVP_FAULT_WEDGE)
                    p->fault_until_ns = UINT64_MAX;
                (void)pick_conn(e, p->peer); /* the peer is known to the I/O thread */
                p->where = PIECE_HELD;
                list_push(&e->held, p);
                continue;
            }
        }
#endif
        struct xfer_conn *c = pick_conn(e, p->peer);
        p->conn = c;
        p->where = PIECE_SENDQ;
        c->load += piece_cost(p);
        list_push(&c->sendq, p);
    }
    if (any_fail) /* fault FAIL: those pieces fail now (none is on a connection yet) */
        for (size_t i = 0; i < n; i++) {
            struct xfer_piece *p = b->pieces[i];
            if (p && p->fault == KVP_FAULT_FAIL && p->where == PIECE_NEW) {
                bool last = b->left == 1;
                piece_finish(e, p, KVP_ERR_TRANSFER);
                piece_free(p);
                if (last)
                    return;
            }
        }
    /* From here b may complete (and be gone) at any call: do not touch b. */
    for (struct xfer_peer *peer = e->io_peers; peer; peer = peer->io_next) {
        for (uint32_t i = 0; i < e->p.conns_per_peer; i++) {
            struct xfer_conn *c = &peer->conns[i];
            if (!c->sendq.head)
                continue;
            if (c->state == CONN_IDLE)
                conn_connect(e, c);
            else if (c->state == CONN_UP && !(c->events & EPOLLOUT))
                conn_send(e, c);
        }
    }
}

/* Tear down what holds b's pieces that could not be fenced: their transport is closed, so they
 * are fenced for sure now, and they end with KVP_ERR_FENCE_FAILED (logged, counted). */
static void fence_teardown(struct kvp_xfer_engine *e, struct xfer_batch *b, const char *why)
{
    char owners[256];
    size_t olen = 0, count = 0;
    owners[0] = 0;
    for (size_t i = 0; i < b->n_pieces; i++) {
        struct xfer_piece *p = b->pieces[i];
        if (!p)
            continue;
        count++;
        if (olen < sizeof owners - 64) {
            char one[96];
            snprintf(one, sizeof one, "%sseg %u@%s", olen ? ", " : "", p->segment_id, p->peer->endpoint);
            if (!strstr(owners, one + (olen ? 2 : 0))) {
                snprintf(owners + olen, sizeof owners - olen, "%s", one);
                olen = strlen(owners);
            }
        }
    }
    kvp_log_error(ACTOR, "batch of %zu slices: %zu pieces could not be fenced (%s); tearing down "
                  "their transport: %s", b->n, count, why, owners);
    STAT_ADD(e, st_fence_failed, count);
    size_t n = b->n_pieces;
    for (size_t i = 0; i < n; i++) {
        struct xfer_piece *p = b->pieces[i];
        if (!p)
            continue;
        /* The whole peer's transport goes (for RDMA: the QP to error, CQ drained). */
        for (uint32_t k = 0; k < e->p.conns_per_peer; k++)
            if (p->peer->conns[k].fd >= 0)
                conn_fail(e, &p->peer->conns[k], KVP_ERR_TRANSFER, "torn down: a piece could not be fenced");
        p = b->pieces[i];
        if (!p)
            continue;
        if (p->where == PIECE_HELD)
            list_unlink(&e->held, p);
        b->slices[p->slice].status = KVP_ERR_FENCE_FAILED;
        bool last = b->left == 1;
        piece_finish(e, p, KVP_ERR_FENCE_FAILED);
        piece_free(p);
        if (last)
            return; /* b is gone */
    }
}

/*
 * Close c because a fenced WRITE was mid-send on it. The requests of other batches on it are not
 * a failure of the peer: they go out again on a fresh connection instead of failing with
 * KVP_ERR_TRANSFER (which a put or get reports to the master as "segment unreachable"; a live
 * segment would be probed, and declared lost if the probe and a heartbeat were late under load).
 * Those queued behind it never reached the wire; those sent before it await their answers, which
 * the close discards: a READ is read again, a WRITE writes the same bytes to the same place again
 * under the same write deadline (a copy the segment already took from the closed connection lands
 * before that deadline or not at all, as for any fenced WRITE). A READ whose answer is being
 * received (c->rpiece) still fails with the connection.
 */
static void conn_close_fenced(struct kvp_xfer_engine *e, struct xfer_conn *c)
{
    struct xfer_list keep = {0};
    for (struct xfer_piece *p = c->inflight.head, *np; p; p = np) {
        np = p->next;
        if (p->batch) {
            list_unlink(&c->inflight, p);
            c->load -= piece_cost(p);
            p->sent = 0;
            p->where = PIECE_SENDQ;
            list_push(&keep, p);
        }
    }
    for (struct xfer_piece *p = c->sendq.head, *np; p; p = np) {
        np = p->next;
        if (p->batch && p->sent == 0) {
            list_unlink(&c->sendq, p);
            c->load -= piece_cost(p);
            list_push(&keep, p);
        }
    }
    conn_fail(e, c, KVP_ERR_TRANSFER, "fenced a request mid-send");
    struct xfer_peer *peer = c->peer;
    struct xfer_piece *p;
    while ((p = keep.head)) {
        list_unlink(&keep, p);
        struct xfer_conn *nc = pick_conn(e, peer);
        p->conn = nc;
        nc->load += piece_cost(p);
        list_push(&nc->sendq, p);
    }
    for (uint32_t i = 0; i < e->p.conns_per_peer; i++) {
        struct xfer_conn *q = &peer->conns[i];
        if (!q->sendq.head || q->close_pending) /* closed next by fence_batch, which requeues */
            continue;
        if (q->state == CONN_IDLE)
            conn_connect(e, q);
        else if (q->state == CONN_UP && !(q->events & EPOLLOUT))
            conn_send(e, q);
    }
}

/* Fence every piece of b that is not terminal with `status` (TIMEOUT or CLOSED). `now`: a
 * stopping engine tears down a wedged piece at once instead of waiting for the bound. */
static void fence_batch(struct kvp_xfer_engine *e, struct xfer_batch *b, int status, bool now)
{
    b->fenced = true;
    size_t wedged = 0;
    size_t left = b->left;
    size_t n = b->n_pieces;
    struct xfer_conn *to_close[XFER_MAX_IOV];
    size_t n_close = 0;
    bool overflow = false;
    kvp_log_info(ACTOR, "batch of %zu slices: %s; fencing %zu pieces", b->n, kvp_errname(status), left);
    for (size_t i = 0; i < n && left > 0; i++) {
        struct xfer_piece *p = b->pieces[i];
        if (!p)
            continue;
        struct xfer_conn *c = p->conn;
        left--;
        switch (p->where) {
        case PIECE_HELD:
            if (p->fault == KVP_FAULT_WEDGE) { /* this transport cannot fence it now */
                wedged++;
                break;
            }
            list_unlink(&e->held, p);
            STAT_ADD(e, st_fenced, 1);
            piece_finish(e, p, status);
            piece_free(p);
            break;
        case PIECE_SENDQ:
            STAT_ADD(e, st_fenced, 1);
            if (p->sent == 0) { /* not started: dropped */
                list_unlink(&c->sendq, p);
                c->load -= piece_cost(p);
                piece_finish(e, p, status);
                piece_free(p);
            } else if (p->op == KVP_XFER_READ) {
                /* Only its header is partly sent (engine memory): finish sending it and drain
                 * the response into scratch like any fenced in-flight READ. */
                piece_finish(e, p, status);
            } else { /* WRITE mid-send from caller memory: the connection must go */
                piece_finish(e, p, status);
                if (!c->close_pending) {
                    c->close_pending = true;
                    if (n_close < XFER_MAX_IOV)
                        to_close[n_close++] = c;
                    else
                        overflow = true;
                }
            }
            break;
        case PIECE_INFLIGHT: /* response not started: it will be drained into scratch */
        case PIECE_RECV:     /* response mid-receive: the rest goes to scratch */
            STAT_ADD(e, st_fenced, 1);
            piece_finish(e, p, status);
            break;
        default: /* PIECE_NEW cannot happen after dispatch */
            piece_finish(e, p, status);
            piece_free(p);
            break;
        }
    }
    /* b may be gone now, unless pieces are wedged (then it is still active). */
    if (wedged > 0) {
        if (now)
            fence_teardown(e, b, "engine stopping");
        else
            b->fence_deadline_ns = kvp_clock_now_ns() + (uint64_t)e->p.fence_bound_ms * 1000000ull;
    }
    for (size_t i = 0; i < n_close; i++)
        conn_close_fenced(e, to_close[i]);
    if (overflow)
        for (struct xfer_peer *peer = e->io_peers; peer; peer = peer->io_next)
            for (uint32_t i = 0; i < e->p.conns_per_peer; i++)
                if (peer->conns[i].close_pending)
                    conn_close_fenced(e, &peer->conns[i]);
}

/* The epoll timeout until the next deadline, in ms (-1 none). Fences what is due. */
static int handle_deadlines(struct kvp_xfer_engine *e)
{
    uint64_t now = kvp_clock_now_ns();
    uint64_t next = UINT64_MAX;
    /* Fencing one batch may close connections and so complete (unlink) other batches:
     * restart the walk after every fence. */
restart:
    for (struct xfer_batch *b = e->active; b; b = b->anext) {
        if (b->fenced) {
            if (b->fence_deadline_ns && b->fence_deadline_ns <= now) {
                fence_teardown(e, b, "fence bound passed");
                goto restart;
            }
            if (b->fence_deadline_ns && b->fence_deadline_ns < next)
                next = b->fence_deadline_ns;
            continue;
        }
        if (b->deadline_ns && b->deadline_ns <= now) {
            STAT_ADD(e, st_timeouts, 1);
            fence_batch(e, b, KVP_ERR_TIMEOUT, false);
            goto restart;
        }
        if (b->deadline_ns && b->deadline_ns < next)
            next = b->deadline_ns;
    }
#ifdef KVP_FAULT_INJECTION
    /* Held pieces whose stall is over (or released): out on the wire, or freed if fenced. */
    unsigned long gen = xfer_fault_generation();
    for (struct xfer_piece *p = e->held.head, *np; p; p = np) {
        np = p->next;
        if (now < p->fault_until_ns && gen == p->fault_gen) {
            if (p->fault_until_ns < next)
                next = p->fault_until_ns;
            continue;
        }
        list_unlink(&e->held, p);
        if (!p->batch) {
            piece_free(p);
            continue;
        }
        p->fault = p->fault == KVP_FAULT_WEDGE ? KVP_FAULT_STALL : p->fault; /* fenceable now */
        struct xfer_conn *c = pick_conn(e, p->peer);
        p->conn = c;
        p->where = PIECE_SENDQ;
        c->load += piece_cost(p);
        list_push(&c->sendq, p);
        if (c->state == CONN_IDLE)
            conn_connect(e, c);
        else if (c->state == CONN_UP && !(c->events & EPOLLOUT))
            conn_send(e, c);
        goto restart; /* sending may have failed pieces and completed batches */
    }
    for (struct xfer_peer *peer = e->io_peers; peer; peer = peer->io_next)
        for (uint32_t i = 0; i < e->p.conns_per_peer; i++) {
            struct xfer_conn *c = &peer->conns[i];
            if (!c->paused)
                continue;
            if (now < c->pause_until_ns && gen == c->pause_gen) {
                if (c->pause_until_ns < next)
                    next = c->pause_until_ns;
                continue;
            }
            c->paused = false;
            conn_set_events(e, c, c->events | EPOLLIN);
            conn_recv(e, c);
            goto restart;
        }
#endif
    for (struct xfer_peer *peer = e->io_peers; peer; peer = peer->io_next)
        for (uint32_t i = 0; i < e->p.conns_per_peer; i++) {
            struct xfer_conn *c = &peer->conns[i];
            if (c->state != CONN_CONNECTING)
                continue;
            if (c->connect_deadline_ns <= now)
                conn_fail(e, c, KVP_ERR_TRANSFER, "connect timeout");
            else if (c->connect_deadline_ns < next)
                next = c->connect_deadline_ns;
        }
    if (next == UINT64_MAX)
        return -1;
    uint64_t ms = (next - now + 999999ull) / 1000000ull;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static void *io_main(void *arg)
{
    struct kvp_xfer_engine *e = arg;
    struct epoll_event evs[64];
    for (;;) {
        int timeout = handle_deadlines(e);
        int n = epoll_wait(e->ep, evs, 64, timeout);
        if (n < 0 && errno != EINTR) {
            kvp_log_error(ACTOR, "epoll_wait: %s", strerror(errno));
            n = 0;
        }
        for (int i = 0; i < n; i++) {
            if (!evs[i].data.ptr) {
                uint64_t v;
                if (read(e->wake_fd, &v, sizeof v) < 0 && errno != EAGAIN)
                    kvp_log_warn(ACTOR, "wake read: %s", strerror(errno));
                continue;
            }
            conn_on_event(e, evs[i].data.ptr, evs[i].events);
        }
        pthread_mutex_lock(&e->mu);
        struct xfer_batch *sub = e->submitted_head;
        e->submitted_head = e->submitted_tail = NULL;
        bool stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);
        while (sub) {
            struct xfer_batch *nb = sub->next;
            sub->next = NULL;
            dispatch_batch(e, sub);
            sub = nb;
        }
        if (stopping)
            break;
    }
    /* Stop: every batch is fenced with CLOSED, every connection closed. */
    while (e->active)
        fence_batch(e, e->active, KVP_ERR_CLOSED, true);
    struct xfer_piece *hp;
    while ((hp = e->held.head)) { /* held pieces of fenced batches */
        list_unlink(&e->held, hp);
        piece_free(hp);
    }
    for (struct xfer_peer *peer = e->io_peers; peer; peer = peer->io_next)
        for (uint32_t i = 0; i < e->p.conns_per_peer; i++)
            conn_fail(e, &peer->conns[i], KVP_ERR_CLOSED, "engine stopped");
    return NULL;
}

/* ------------------------------------------------------------------ public API */

int kvp_xfer_engine_new(struct kvp_xfer_engine **out, const struct kvp_xfer_params *p)
{
    if (!out)
        return KVP_ERR_INVALID;
    struct kvp_xfer_engine *e = calloc(1, sizeof *e);
    if (!e)
        return KVP_ERR_NOMEM;
    if (p)
        e->p = *p;
    if (e->p.conns_per_peer == 0)
        e->p.conns_per_peer = XFER_DEFAULT_CONNS;
    if (e->p.conns_per_peer > XFER_MAX_CONNS)
        e->p.conns_per_peer = XFER_MAX_CONNS;
    if (e->p.slice_bytes == 0)
        e->p.slice_bytes = XFER_DEFAULT_SLICE_BYTES;
    if (e->p.slice_bytes > KVP_FRAME_MAX_LENGTH)
        e->p.slice_bytes = KVP_FRAME_MAX_LENGTH;
    if (e->p.connect_timeout_ms == 0)
        e->p.connect_timeout_ms = XFER_DEFAULT_CONNECT_MS;
    if (e->p.fence_bound_ms == 0)
        e->p.fence_bound_ms = XFER_DEFAULT_FENCE_BOUND_MS;
    if (e->p.io_threads == 0)
        e->p.io_threads = 1;
    if (e->p.io_threads > XFER_MAX_IO_THREADS)
        e->p.io_threads = XFER_MAX_IO_THREADS;
    e->ep = -1;
    e->wake_fd = -1;
    e->scratch = malloc(XFER_SCRATCH_BYTES);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->users_cv, NULL);
    /* Writer preference: an unregister (segment remount/stop) must not starve behind a steady
     * stream of batches holding the read lock. */
    pthread_rwlockattr_t rwa;
    pthread_rwlockattr_init(&rwa);
    pthread_rwlockattr_setkind_np(&rwa, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&e->local_lock, &rwa);
    pthread_rwlockattr_destroy(&rwa);
    int rc = KVP_OK;
    if (!e->scratch)
        rc = KVP_ERR_NOMEM;
    if (rc == KVP_OK && (e->ep = epoll_create1(EPOLL_CLOEXEC)) < 0)
        rc = KVP_ERR_IO;
    if (rc == KVP_OK && (e->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
        rc = KVP_ERR_IO;
    if (rc == KVP_OK) {
        struct epoll_event ee = {.events = EPOLLIN, .data.ptr = NULL};
        if (epoll_ctl(e->ep, EPOLL_CTL_ADD, e->wake_fd, &ee) != 0)
            rc = KVP_ERR_IO;
    }
    if (rc == KVP_OK && pthread_create(&e->io_thread, NULL, io_main, e) != 0)
        rc = KVP_ERR_NOMEM;
    if (rc != KVP_OK) {
        if (e->ep >= 0)
            close(e->ep);
        if (e->wake_fd >= 0)
            close(e->wake_fd);
        pthread_rwlock_destroy(&e->local_lock);
        pthread_cond_destroy(&e->users_cv);
        pthread_mutex_destroy(&e->mu);
        free(e->scratch);
        free(e);
        return rc;
    }
#ifdef KVP_FAULT_INJECTION
    xfer_fault_env_once();
    xfer_fault_register_engine(wake_cb, e);
#endif
    if (e->p.io_threads > 1) {
        struct kvp_xfer_params sp = e->p;
        sp.io_threads = 1;
        for (unsigned i = 0; i + 1 < e->p.io_threads; i++) {
            rc = kvp_xfer_engine_new(&e->sib[i], &sp);
            if (rc != KVP_OK) {
                kvp_xfer_engine_destroy(&e);
                return rc;
            }
            e->n_sib++;
        }
    }
    *out = e;
    return KVP_OK;
}

static void stats_add(const struct kvp_xfer_engine *e, struct kvp_xfer_stats *out)
{
    out->batches += __atomic_load_n(&e->st_batches, __ATOMIC_RELAXED);
    out->slices += __atomic_load_n(&e->st_slices, __ATOMIC_RELAXED);
    out->timeouts += __atomic_load_n(&e->st_timeouts, __ATOMIC_RELAXED);
    out->fenced += __atomic_load_n(&e->st_fenced, __ATOMIC_RELAXED);
    out->fence_failed += __atomic_load_n(&e->st_fence_failed, __ATOMIC_RELAXED);
    out->stray_bytes += __atomic_load_n(&e->st_stray, __ATOMIC_RELAXED);
    out->spec_pieces += __atomic_load_n(&e->st_spec, __ATOMIC_RELAXED);
    out->pushbacks += __atomic_load_n(&e->st_pushback, __ATOMIC_RELAXED);
}

void kvp_xfer_stats(struct kvp_xfer_engine *e, struct kvp_xfer_stats *out)
{
    if (!out)
        return;
    *out = (struct kvp_xfer_stats){0};
    if (!e)
        return;
    stats_add(e, out);
    for (unsigned i = 0; i < e->n_sib; i++)
        stats_add(e->sib[i], out);
}

void kvp_xfer_engine_stop(struct kvp_xfer_engine *e)
{
    if (!e)
        return;
    for (unsigned i = 0; i < e->n_sib; i++)
        kvp_xfer_engine_stop(e->sib[i]);
    pthread_mutex_lock(&e->mu);
    e->stopping = true;
    pthread_mutex_unlock(&e->mu);
    wake(e);
}

void kvp_xfer_engine_destroy(struct kvp_xfer_engine **ep)
{
    if (!ep || !*ep)
        return;
    struct kvp_xfer_engine *e = *ep;
    *ep = NULL;
    for (unsigned i = 0; i < e->n_sib; i++)
        kvp_xfer_engine_destroy(&e->sib[i]);
#ifdef KVP_FAULT_INJECTION
    xfer_fault_unregister_engine(e);
#endif
    pthread_mutex_lock(&e->mu);
    e->stopping = true;
    pthread_mutex_unlock(&e->mu);
    wake(e);
    pthread_join(e->io_thread, NULL);
    /* Batches submitted after the I/O thread's last look are completed here with CLOSED. */
    pthread_mutex_lock(&e->mu);
    struct xfer_batch *sub = e->submitted_head;
    e->submitted_head = e->submitted_tail = NULL;
    while (sub) {
        struct xfer_batch *nb = sub->next;
        for (size_t i = 0; i < sub->n_pieces; i++) {
            struct xfer_piece *p = sub->pieces[i];
            struct kvp_xfer_slice *s = &sub->slices[p->slice];
            if (s->status == KVP_OK)
                s->status = KVP_ERR_CLOSED;
            sub->pieces[i] = NULL;
            piece_free(p);
        }
        sub->left = 0;
        sub->done = true;
        pthread_cond_signal(&sub->cv);
        sub = nb;
    }
    while (e->users > 0)
        pthread_cond_wait(&e->users_cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    struct xfer_peer *peer = e->peers;
    while (peer) {
        struct xfer_peer *np = peer->next;
        free(peer->conns);
        free(peer->endpoint);
        free(peer);
        peer = np;
    }
    close(e->ep);
    close(e->wake_fd);
    free(e->locals);
    pthread_rwlock_destroy(&e->local_lock);
    pthread_cond_destroy(&e->users_cv);
    pthread_mutex_destroy(&e->mu);
    free(e->scratch);
    free(e);
}

/* Find or create the peer for an endpoint. Caller holds e->mu (it may be dropped to resolve). */
static struct xfer_peer *get_peer(struct kvp_xfer_engine *e, const char *endpoint, int *err)
{
    for (struct xfer_peer *p = e->peers; p; p = p->next)
        if (!strcmp(p->endpoint, endpoint))
            return p;
    struct sockaddr_storage sa;
    unsigned sl = 0;
    pthread_mutex_unlock(&e->mu);
    int rc = kvp_xfer_resolve(endpoint, &sa, &sl);
    pthread_mutex_lock(&e->mu);
    if (rc != KVP_OK) {
        *err = rc;
        return NULL;
    }
    for (struct xfer_peer *p = e->peers; p; p = p->next)
        if (!strcmp(p->endpoint, endpoint))
            return p;
    struct xfer_peer *p = calloc(1, sizeof *p);
    if (p) {
        p->endpoint = strdup(endpoint);
        p->conns = calloc(e->p.conns_per_peer, sizeof *p->conns);
    }
    if (!p || !p->endpoint || !p->conns) {
        if (p) {
            free(p->endpoint);
            free(p->conns);
            free(p);
        }
        *err = KVP_ERR_NOMEM;
        return NULL;
    }
    p->addr = sa;
    p->addr_len = sl;
    for (uint32_t i = 0; i < e->p.conns_per_peer; i++) {
        p->conns[i].peer = p;
        p->conns[i].fd = -1;
    }
    p->next = e->peers;
    e->peers = p;
    return p;
}

static bool slice_valid(const struct kvp_xfer_slice *s)
{
    if (!s->local || s->length == 0)
        return false;
    if (s->op != KVP_XFER_READ && s->op != KVP_XFER_WRITE)
        return false;
    if (s->remote_offset + s->length < s->remote_offset)
        return false;
    return true;
}

int kvp_xfer_run(struct kvp_xfer_engine *e, struct kvp_xfer_slice *slices, size_t n, uint32_t timeout_ms)
{
    return kvp_xfer_run_overlap(e, slices, n, timeout_ms, NULL, NULL);
}

static int run_one(struct kvp_xfer_engine *e, struct kvp_xfer_slice *slices, size_t n, uint32_t timeout_ms,
                   void (*overlap)(void *arg), void *arg);

int kvp_xfer_run_overlap(struct kvp_xfer_engine *e, struct kvp_xfer_slice *slices, size_t n,
                         uint32_t timeout_ms, void (*overlap)(void *arg), void *arg)
{
    if (!e || (n > 0 && !slices))
        return KVP_ERR_INVALID;
    /* The I/O thread with the fewest batches running takes the whole batch (ties: the first). */
    struct kvp_xfer_engine *t = e;
    unsigned least = __atomic_load_n(&e->running, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < e->n_sib && least > 0; i++) {
        unsigned r = __atomic_load_n(&e->sib[i]->running, __ATOMIC_RELAXED);
        if (r < least) {
            least = r;
            t = e->sib[i];
        }
    }
    /* run_one counts itself in t->running while it holds t as a user: once it has let go, a
     * concurrent kvp_xfer_engine_destroy may free t, so nothing here touches t afterwards. */
    return run_one(t, slices, n, timeout_ms, overlap, arg);
}

static int run_one(struct kvp_xfer_engine *e, struct kvp_xfer_slice *slices, size_t n, uint32_t timeout_ms,
                   void (*overlap)(void *arg), void *arg)
{
    bool bad = false;
    for (size_t i = 0; i < n; i++)
        if (!slice_valid(&slices[i]))
            bad = true;
    if (bad) {
        for (size_t i = 0; i < n; i++)
            slices[i].status = slice_valid(&slices[i]) ? KVP_ERR_CANCELLED : KVP_ERR_INVALID;
        kvp_log_warn(ACTOR, "run: invalid slice (NULL buffer, zero length, bad op or offset overflow)");
        return KVP_ERR_INVALID;
    }
    uint64_t start_ns = kvp_clock_now_ns();
    /* The write deadline the segment server enforces (C3): no later than this call's end. */
    uint32_t wdeadline = timeout_ms ? kvp_frame_deadline_make(kvp_clock_wall_ms() + timeout_ms) : 0;
    if (n > 0) {
        STAT_ADD(e, st_batches, 1);
        STAT_ADD(e, st_slices, n);
    }
    /* Which slices are local: decided once, under the read lock held until the copies are done. */
    pthread_rwlock_rdlock(&e->local_lock);
    size_t n_remote = 0;
    uint8_t *is_local = n ? calloc(n, 1) : NULL;
    if (n && !is_local) {
        pthread_rwlock_unlock(&e->local_lock);
        return KVP_ERR_NOMEM;
    }
    size_t n_pieces = 0;
    for (size_t i = 0; i < n; i++) {
        slices[i].status = KVP_OK;
        if (e->n_locals && xfer_local_find(e, slices[i].segment_id)) {
            is_local[i] = 1;
            continue;
        }
        n_remote++;
        n_pieces += (size_t)((slices[i].length + e->p.slice_bytes - 1) / e->p.slice_bytes);
    }
    struct xfer_batch b = {.slices = slices, .n = n};
    pthread_cond_init(&b.cv, NULL);
    int rc = KVP_OK;
    pthread_mutex_lock(&e->mu);
    if (e->stopping) {
        /* Not a user: once e->mu is released a destroy may free e, so the read lock goes first. */
        pthread_rwlock_unlock(&e->local_lock);
        pthread_mutex_unlock(&e->mu);
        for (size_t i = 0; i < n; i++)
            slices[i].status = KVP_ERR_CLOSED;
        rc = KVP_ERR_CLOSED;
        goto out;
    }
    e->users++;
    __atomic_add_fetch(&e->running, 1, __ATOMIC_RELAXED);
    if (n_remote > 0) {
        b.pieces = calloc(n_pieces, sizeof *b.pieces);
        if (!b.pieces) {
            rc = KVP_ERR_NOMEM;
        } else {
            const char *last_ep = NULL;
            struct xfer_peer *last_peer = NULL;
            for (size_t i = 0; i < n && rc == KVP_OK; i++) {
                struct kvp_xfer_slice *s = &slices[i];
                if (is_local[i])
                    continue;
                struct xfer_peer *peer = last_peer;
                if (!s->endpoint) {
                    s->status = KVP_ERR_INVALID;
                    continue;
                }
                if (!last_ep || strcmp(last_ep, s->endpoint)) {
                    int err = KVP_ERR_INVALID;
                    peer = get_peer(e, s->endpoint, &err);
                    if (!peer) {
                        s->status = err;
                        continue;
                    }
                    last_ep = s->endpoint;
                    last_peer = peer;
                }
                for (uint64_t off = 0; off < s->length; off += e->p.slice_bytes) {
                    uint64_t len = s->length - off < e->p.slice_bytes ? s->length - off : e->p.slice_bytes;
                    struct xfer_piece *p = calloc(1, sizeof *p);
                    if (!p) {
                        rc = KVP_ERR_NOMEM;
                        break;
                    }
                    p->batch = &b;
                    p->peer = peer;
                    p->slice = i;
                    p->idx = b.n_pieces;
                    p->op = s->op;
                    p->local = (uint8_t *)s->local + off;
                    p->length = len;
                    p->req_id = __atomic_add_fetch(&e->next_req_id, 1, __ATOMIC_RELAXED);
                    struct kvp_frame f = {.op = s->op == KVP_XFER_READ ? KVP_FRAME_READ : KVP_FRAME_WRITE,
                                          .segment_id = s->segment_id,
                                          .req_id = p->req_id,
                                          .offset = s->remote_offset + off,
                                          .length = len,
                                          .deadline = s->op == KVP_XFER_WRITE ? wdeadline : 0};
                    kvp_frame_encode(&f, p->hdr);
                    p->segment_id = s->segment_id;
                    struct xfer_fault_hit hit;
                    if (xfer_fault_match(KVP_FAULT_TCP, s->op, s->segment_id, s->endpoint, &hit)) {
                        p->fault = hit.action;
                        p->fault_ms = hit.ms;
#ifdef KVP_FAULT_INJECTION
                        if (hit.action != KVP_FAULT_FAIL)
                            xfer_fault_outstanding_add(1);
#endif
                    }
                    b.pieces[b.n_pieces++] = p;
                }
            }
        }
        if (rc != KVP_OK) {
            for (size_t i = 0; i < b.n_pieces; i++)
                piece_free(b.pieces[i]);
            b.n_pieces = 0;
            for (size_t i = 0; i < n; i++)
                slices[i].status = rc;
        }
        b.left = b.n_pieces;
        if (b.n_pieces > 0) {
            b.deadline_ns = timeout_ms ? start_ns + (uint64_t)timeout_ms * 1000000ull : 0;
            if (e->submitted_tail)
                e->submitted_tail->next = &b;
            else
                e->submitted_head = &b;
            e->submitted_tail = &b;
        }
    }
    pthread_mutex_unlock(&e->mu);
    if (b.n_pieces > 0)
        wake(e);
    /* Local slices: memcpy in this thread while the network works. */
    if (rc == KVP_OK)
        for (size_t i = 0; i < n; i++) {
            if (!is_local[i])
                continue;
            xfer_local_copy(e, &slices[i], start_ns, timeout_ms);
        }
    pthread_rwlock_unlock(&e->local_lock);
    /* The caller's own work while the I/O thread moves the remote slices (it runs in the
     * caller's thread inside this call, so it adds no fencing concern). */
    if (overlap && rc == KVP_OK)
        overlap(arg);
    pthread_mutex_lock(&e->mu);
    if (b.n_pieces > 0)
        while (!b.done)
            pthread_cond_wait(&b.cv, &e->mu);
    __atomic_sub_fetch(&e->running, 1, __ATOMIC_RELAXED);
    if (--e->users == 0 && e->stopping)
        pthread_cond_broadcast(&e->users_cv);
    pthread_mutex_unlock(&e->mu);
    free(b.pieces);
    if (rc == KVP_OK)
        for (size_t i = 0; i < n; i++)
            if (slices[i].status != KVP_OK) {
                rc = slices[i].status;
                break;
            }
out:
    pthread_cond_destroy(&b.cv);
    free(is_local);
    return rc;
}
