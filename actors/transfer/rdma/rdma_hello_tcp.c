/*
 * rdma_hello_tcp.c — the rdma transport's handshake channel over the segment's data-plane TCP
 * port: one KVP_FRAME_RDMA_HELLO request carrying the RdmaHello offer, one
 * KVP_FRAME_RDMA_HELLO_RESP carrying the answer (wire/envelope.h; the segment side is
 * actors/segment/seg_rdma.c). A kvp_xport_rdma_opts.hello function (xport_rdma.h).
 *
 * It blocks the calling thread (the transfer actor, at an endpoint's connect) for at most the
 * channel's timeout: one round trip per segment connection generation, not per transfer (two
 * when the segment requires data-plane tokens: its challenge, then the token response and the
 * hello, as the tcp transport's connections do; docs/security.md "Data plane: tokens").
 */
#include "actors/transfer/rdma/xport_rdma.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "actors/transfer/transfer.h"
#include "actors/transfer/transfer_internal.h"
#include "auth/auth_token.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "wire/envelope.h"

/* Move len bytes (send when out, else recv). KVP_OK, KVP_ERR_TIMEOUT, KVP_ERR_TRANSFER. */
static int hmove(int fd, bool out, uint8_t *p, size_t len, uint64_t deadline_ms)
{
    size_t off = 0;
    while (off < len) {
        ssize_t r = out ? send(fd, p + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(fd, p + off, len - off, MSG_DONTWAIT);
        if (r > 0) {
            off += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int w = xfer_wait_fd(fd, out ? POLLOUT : POLLIN, deadline_ms);
            if (w == 0)
                return KVP_ERR_TIMEOUT;
            if (w < 0)
                return KVP_ERR_TRANSFER;
            continue;
        }
        return KVP_ERR_TRANSFER; /* EOF (an older segment closes on the unknown op) or error */
    }
    return KVP_OK;
}

int kvp_rdma_hello_tcp(void *arg, const char *endpoint, const uint8_t *offer, size_t len,
                       uint8_t **answer, size_t *answer_len)
{
    const struct kvp_rdma_hello_tcp_opts *o = arg;
    if (!endpoint || !offer || !answer || !answer_len || len == 0 || len > KVP_FRAME_RDMA_HELLO_MAX)
        return KVP_ERR_INVALID;
    *answer = NULL;
    *answer_len = 0;
    uint32_t timeout_ms = o && o->timeout_ms ? o->timeout_ms : 2000;
    uint64_t deadline = kvp_clock_now_ms() + timeout_ms;
    struct sockaddr_storage sa;
    unsigned sl;
    if (kvp_xfer_resolve(endpoint, &sa, &sl) != KVP_OK)
        return KVP_ERR_TRANSFER;
    int fd = -1;
    int rc = xfer_connect_start(&sa, sl, &fd);
    if (rc < 0)
        return KVP_ERR_TRANSFER;
    if (rc == 1) {
        int w = xfer_wait_fd(fd, POLLOUT, deadline), err = 0;
        socklen_t el = sizeof err;
        if (w <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
            close(fd);
            return w == 0 ? KVP_ERR_TIMEOUT : KVP_ERR_TRANSFER;
        }
    }
    rc = KVP_OK;
    if (o && o->token_respond) { /* the segment requires data-plane tokens: answer its challenge first */
        uint8_t ch[KVP_DT_CHALLENGE_BYTES], resp[KVP_DT_RESPONSE_MAX];
        rc = hmove(fd, false, ch, sizeof ch, deadline);
        int n = rc == KVP_OK ? o->token_respond(o->token_ctx, ch, sizeof ch, resp, sizeof resp) : 0;
        if (rc == KVP_OK && n <= 0) {
            kvp_log_warn("xfer-rdma", "RDMA handshake with %s: no data token for this segment (%s)", endpoint,
                         kvp_errname(n < 0 ? n : KVP_ERR_NOT_FOUND));
            rc = KVP_ERR_TRANSFER;
        }
        if (rc == KVP_OK)
            rc = hmove(fd, true, resp, (size_t)n, deadline);
    }
    uint8_t hdr[KVP_FRAME_HEADER_BYTES];
    struct kvp_frame f = {.op = KVP_FRAME_RDMA_HELLO, .req_id = 1, .length = len};
    kvp_frame_encode(&f, hdr);
    if (rc == KVP_OK)
        rc = hmove(fd, true, hdr, sizeof hdr, deadline);
    if (rc == KVP_OK)
        rc = hmove(fd, true, (uint8_t *)offer, len, deadline);
    if (rc == KVP_OK)
        rc = hmove(fd, false, hdr, sizeof hdr, deadline);
    struct kvp_frame a;
    if (rc == KVP_OK && (kvp_frame_decode(hdr, &a) != KVP_OK || a.op != KVP_FRAME_RDMA_HELLO_RESP ||
                         a.req_id != 1 || a.length > (1u << 26))) {
        kvp_log_warn("xfer-rdma", "RDMA handshake with %s: malformed answer frame", endpoint);
        rc = KVP_ERR_MALFORMED;
    }
    if (rc == KVP_OK && a.length == 0)
        rc = a.status != KVP_OK ? a.status : KVP_ERR_MALFORMED; /* e.g. UNSUPPORTED: no RDMA there */
    if (rc == KVP_OK) {
        uint8_t *buf = malloc(a.length);
        rc = buf ? hmove(fd, false, buf, a.length, deadline) : KVP_ERR_NOMEM;
        if (rc == KVP_OK) {
            *answer = buf;
            *answer_len = a.length;
        } else {
            free(buf);
        }
    }
    close(fd);
    return rc;
}
