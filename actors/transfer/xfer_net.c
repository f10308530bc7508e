/*
 * xfer_net.c — endpoint parsing/resolution, socket helpers and the one-shot PING probe.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "actors/transfer/transfer_internal.h"
#include "wire/envelope.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define ACTOR "xfer"

/*
 * Split "host:port", "[v6]:port", "[fe80::1%eth0]:port" into host (brackets removed) and port.
 * A bare IPv6 address without brackets is ambiguous and refused.
 */
static int split_endpoint(const char *ep, char *host, size_t cap, char *port, size_t pcap)
{
    const char *colon;
    const char *h = ep;
    size_t hl;
    if (ep[0] == '[') {
        const char *close = strchr(ep, ']');
        if (!close || close[1] != ':')
            return KVP_ERR_INVALID;
        h = ep + 1;
        hl = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(ep, ':');
        if (!colon || memchr(ep, ':', (size_t)(colon - ep)))
            return KVP_ERR_INVALID; /* no port, or an unbracketed IPv6 address */
        hl = (size_t)(colon - ep);
    }
    if (hl == 0 || hl + 1 > cap)
        return KVP_ERR_INVALID;
    const char *ps = colon + 1;
    size_t pl = strlen(ps);
    if (pl == 0 || pl + 1 > pcap)
        return KVP_ERR_INVALID;
    for (size_t i = 0; i < pl; i++)
        if (ps[i] < '0' || ps[i] > '9')
            return KVP_ERR_INVALID;
    long pv = strtol(ps, NULL, 10);
    if (pv < 1 || pv > 65535)
        return KVP_ERR_INVALID;
    memcpy(host, h, hl);
    host[hl] = '\0';
    memcpy(port, ps, pl + 1);
    return KVP_OK;
}

int kvp_xfer_resolve(const char *endpoint, struct sockaddr_storage *out, unsigned *out_len)
{
    if (!endpoint || !out || !out_len)
        return KVP_ERR_INVALID;
    char host[256], port[8];
    if (split_endpoint(endpoint, host, sizeof host, port, sizeof port) != KVP_OK) {
        kvp_log_warn(ACTOR, "endpoint '%s': not host:port, [v6]:port or name:port", endpoint);
        return KVP_ERR_INVALID;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(host, port, &hints, &ai);
    if (g != 0 || !ai) {
        kvp_log_warn(ACTOR, "endpoint '%s': cannot resolve: %s", endpoint, gai_strerror(g));
        return KVP_ERR_INVALID;
    }
    memcpy(out, ai->ai_addr, ai->ai_addrlen);
    *out_len = (unsigned)ai->ai_addrlen;
    freeaddrinfo(ai);
    return KVP_OK;
}

int xfer_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -1;
    return 0;
}

/* Start a nonblocking connect. Returns 0 (connected), 1 (in progress) or -errno. */
int xfer_connect_start(const struct sockaddr_storage *addr, unsigned len, int *fd_out)
{
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* A peer that vanished (no RST) fails the connection once sent data stays unacknowledged
     * this long, instead of after the kernel's ~15 minutes of retransmissions. */
    unsigned user_timeout_ms = 30000;
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
    *fd_out = fd;
    if (connect(fd, (const struct sockaddr *)addr, len) == 0)
        return 0;
    if (errno == EINPROGRESS)
        return 1;
    int e = errno;
    close(fd);
    *fd_out = -1;
    return -e;
}

int xfer_wait_fd(int fd, short ev, uint64_t deadline_ms)
{
    for (;;) {
        uint64_t now = kvp_clock_now_ms();
        if (now >= deadline_ms)
            return 0;
        struct pollfd pf = {.fd = fd, .events = ev};
        int r = poll(&pf, 1, (int)(deadline_ms - now));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            return 0;
        return 1;
    }
}

int kvp_xfer_probe(const char *endpoint, uint32_t segment_id, uint32_t timeout_ms)
{
    struct sockaddr_storage sa;
    unsigned sl;
    if (kvp_xfer_resolve(endpoint, &sa, &sl) != KVP_OK)
        return KVP_ERR_TRANSFER;
    if (timeout_ms == 0)
        timeout_ms = XFER_DEFAULT_CONNECT_MS;
    uint64_t deadline = kvp_clock_now_ms() + timeout_ms;
    int fd = -1;
    int rc = xfer_connect_start(&sa, sl, &fd);
    if (rc < 0) {
        kvp_log_debug(ACTOR, "probe %s: connect: %s", endpoint, strerror(-rc));
        return KVP_ERR_TRANSFER;
    }
    int result = KVP_ERR_TRANSFER;
    if (rc == 1) {
        int w = xfer_wait_fd(fd, POLLOUT, deadline);
        if (w <= 0) {
            result = w == 0 ? KVP_ERR_TIMEOUT : KVP_ERR_TRANSFER;
            goto out;
        }
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0)
            goto out;
    }
    struct kvp_frame f = {.op = KVP_FRAME_PING, .segment_id = segment_id, .req_id = 1};
    uint8_t hdr[KVP_FRAME_HEADER_BYTES];
    kvp_frame_encode(&f, hdr);
    size_t off = 0;
    while (off < sizeof hdr) {
        ssize_t r = send(fd, hdr + off, sizeof hdr - off, MSG_NOSIGNAL);
        if (r > 0) {
            off += (size_t)r;
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
            int w = xfer_wait_fd(fd, POLLOUT, deadline);
            if (w <= 0) {
                result = w == 0 ? KVP_ERR_TIMEOUT : KVP_ERR_TRANSFER;
                goto out;
            }
            continue;
        }
        goto out;
    }
    off = 0;
    while (off < sizeof hdr) {
        ssize_t r = recv(fd, hdr + off, sizeof hdr - off, 0);
        if (r > 0) {
            off += (size_t)r;
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
            int w = xfer_wait_fd(fd, POLLIN, deadline);
            if (w <= 0) {
                result = w == 0 ? KVP_ERR_TIMEOUT : KVP_ERR_TRANSFER;
                goto out;
            }
            continue;
        }
        goto out; /* EOF or error */
    }
    if (memcmp(hdr, "KVPC", 4) == 0) {
        /* A segment that requires data-plane tokens speaks first: its challenge (44 bytes,
         * auth/auth_token.h) names its segment id at bytes 8..11, which answers the probe. */
        uint32_t id = (uint32_t)hdr[8] | (uint32_t)hdr[9] << 8 | (uint32_t)hdr[10] << 16 | (uint32_t)hdr[11] << 24;
        result = id == segment_id ? KVP_OK : KVP_ERR_NOT_FOUND;
        goto out;
    }
    struct kvp_frame resp;
    if (kvp_frame_decode(hdr, &resp) != KVP_OK || resp.op != KVP_FRAME_PONG || resp.req_id != 1) {
        kvp_log_warn(ACTOR, "probe %s: bad PONG", endpoint);
        goto out;
    }
    if (resp.status == 0)
        result = KVP_OK;
    else if (resp.status == KVP_ERR_NOT_FOUND)
        result = KVP_ERR_NOT_FOUND;
out:
    close(fd);
    return result;
}
