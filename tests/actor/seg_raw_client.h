/*
 * seg_raw_client.h — a raw TCP client of the segment server's frame protocol (wire/envelope.h)
 * for actor tests that need to pace or pipeline bytes themselves: connect, send and receive
 * exactly, encode one request header, read one response header; and the fixture both tests
 * share (a segment server on a test-owned region plus one raw connection). Failures are cmocka
 * assertions; include after <cmocka.h>.
 */
#ifndef KVP_TESTS_SEG_RAW_CLIENT_H
#define KVP_TESTS_SEG_RAW_CLIENT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#include "actors/segment/seg_server.h"
#include "kvpool.h"
#include "wire/envelope.h"

/* A TCP_NODELAY connection to 127.0.0.1:port; the fd, or -1. */
static inline int seg_raw_connect(uint32_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/*
 * Start a segment server on 127.0.0.1 (any port) serving `region` (size bytes, owned by the
 * caller, which frees it after seg_raw_server_stop) as segment seg_id, and connect to it.
 * *srv and *fd are set; returns 0, or -1 on failure (a cmocka setup's return value).
 */
static inline int seg_raw_server_start(uint8_t *region, size_t size, uint32_t seg_id, struct kvp_seg_server **srv,
                                       int *fd)
{
    *fd = -1;
    if (!region || kvp_seg_server_start(srv, "127.0.0.1", 0, region, size) != KVP_OK)
        return -1;
    kvp_seg_server_set_id(*srv, seg_id);
    *fd = seg_raw_connect(kvp_seg_server_port(*srv));
    return *fd < 0 ? -1 : 0;
}

/* Close the connection and stop the server (*srv becomes NULL). */
static inline void seg_raw_server_stop(struct kvp_seg_server **srv, int fd)
{
    if (fd >= 0)
        close(fd);
    kvp_seg_server_stop(srv);
}

static inline void seg_raw_send_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t r = send(fd, p, len, MSG_NOSIGNAL);
        assert_true(r > 0);
        p += r;
        len -= (size_t)r;
    }
}

static inline void seg_raw_recv_all(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t r = recv(fd, p, len, 0);
        assert_true(r > 0);
        p += r;
        len -= (size_t)r;
    }
}

/* A request header (KVP_FRAME_HEADER_BYTES at out). */
static inline void seg_raw_header(uint8_t *out, uint8_t op, uint32_t seg, uint64_t req, uint64_t off,
                                  uint64_t len, uint32_t deadline)
{
    struct kvp_frame f = {.op = op, .segment_id = seg, .req_id = req, .offset = off, .length = len,
                          .deadline = deadline};
    kvp_frame_encode(&f, out);
}

/* The next response header on fd, decoded (its payload, if any, is still in the socket). */
static inline struct kvp_frame seg_raw_response(int fd)
{
    uint8_t h[KVP_FRAME_HEADER_BYTES];
    seg_raw_recv_all(fd, h, sizeof h);
    struct kvp_frame f;
    assert_int_equal(kvp_frame_decode(h, &f), KVP_OK);
    return f;
}

#endif
