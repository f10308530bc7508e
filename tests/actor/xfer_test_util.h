/*
 * xfer_test_util.h — helpers shared by the transfer/segment tests: payload patterns and a
 * scriptable fake segment server (accepts one connection at a time and can stall, reply late,
 * or close mid-response) for the fencing and failure cases.
 */
#ifndef KVP_TEST_XFER_UTIL_H
#define KVP_TEST_XFER_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wire/envelope.h"

static inline uint8_t pat_byte(uint32_t seed, uint64_t i)
{
    return (uint8_t)(seed * 131u + i * 31u + (i >> 9) * 7u);
}

/* The pattern is filled and checked a 512-byte block at a time with memcpy / memcmp: byte i of
 * block b is (seed * 131 + 7 * b + 31 * i) mod 256 (pat_byte: 512 * 31 is 0 mod 256), so a block
 * is one of 256 rows of a table built once. The same bytes as a per-byte loop, but under TSan a
 * per-byte loop was most of the transfer tests' time (test_xfer_tcp: ~6 min at load 18, over its
 * ctest limit at load 35-45), while memcpy / memcmp are checked a range at a time and still
 * report a race on the buffer. */
#define PAT_BLOCK 512u
static uint8_t pat_rows[256][PAT_BLOCK];
static pthread_once_t pat_rows_once = PTHREAD_ONCE_INIT;

static void pat_rows_build(void)
{
    for (unsigned r = 0; r < 256; r++)
        for (unsigned j = 0; j < PAT_BLOCK; j++)
            pat_rows[r][j] = (uint8_t)(r + 31u * j);
}

/* The row holding block b of seed's pattern. */
static inline const uint8_t *pat_row(uint32_t seed, uint64_t b)
{
    pthread_once(&pat_rows_once, pat_rows_build);
    return pat_rows[(uint8_t)(seed * 131u + b * 7u)];
}

static inline void pat_fill(void *buf, uint64_t len, uint32_t seed)
{
    uint8_t *p = buf;
    for (uint64_t i = 0; i < len;) {
        uint64_t j = i % PAT_BLOCK, n = PAT_BLOCK - j < len - i ? PAT_BLOCK - j : len - i;
        memcpy(p + i, pat_row(seed, i / PAT_BLOCK) + j, n);
        i += n;
    }
}

/* Index of the first byte that differs from the pattern, or -1. */
static inline int64_t pat_check(const void *buf, uint64_t len, uint32_t seed)
{
    const uint8_t *p = buf;
    for (uint64_t i = 0; i < len;) {
        uint64_t j = i % PAT_BLOCK, n = PAT_BLOCK - j < len - i ? PAT_BLOCK - j : len - i;
        const uint8_t *row = pat_row(seed, i / PAT_BLOCK) + j;
        if (memcmp(p + i, row, n) != 0)
            for (uint64_t k = 0; k < n; k++)
                if (p[i + k] != row[k])
                    return (int64_t)(i + k);
        i += n;
    }
    return -1;
}

static inline bool all_bytes(const void *buf, uint64_t len, uint8_t v)
{
    const uint8_t *p = buf;
    for (uint64_t i = 0; i < len; i++)
        if (p[i] != v)
            return false;
    return true;
}

/* ------------------------------------------------------------------ fake segment server */

enum fake_mode {
    FAKE_SERVE = 0,      /* answer every request at once: READ gets pattern(seed 7, offset-based) */
    FAKE_STALL = 1,      /* read requests (and WRITE payloads) but answer nothing until released */
    FAKE_NO_READ = 2,    /* do not even read the socket until released */
    FAKE_HALF_CLOSE = 3, /* answer a READ with its header and half its payload, then close */
    FAKE_DELAY = 4,      /* answer one request in four after a random delay of 0..delay_us */
};

struct fake_server {
    int lfd;
    uint16_t port;
    pthread_t thread;
    _Atomic int mode;
    atomic_bool release;     /* set by the test: stalled requests are answered, mode goes SERVE */
    atomic_bool stop;
    /* results, read by the test after fake_server_stop (join gives the ordering) */
    _Atomic int cur_fd;      /* the connection being served, -1 none */
    _Atomic uint64_t requests;     /* request headers read */
    _Atomic uint64_t write_bytes;  /* WRITE payload bytes received */
    _Atomic uint64_t write_bad;    /* WRITE payload bytes that were not pattern(seed 5) */
    _Atomic uint64_t late_replies; /* responses sent after a release */
    _Atomic unsigned delay_us;     /* FAKE_DELAY: upper bound of the delay (the test may change it) */
    unsigned seed;                 /* FAKE_DELAY: rand_r state (fake thread only) */
};

static inline int fake_read_full(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t r = recv(fd, p, len, 0);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return -1;
        }
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

static inline int fake_write_full(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t r = send(fd, p, len, MSG_NOSIGNAL);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return -1;
        }
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

static inline int fake_answer(struct fake_server *fs, int fd, const struct kvp_frame *f, uint64_t keep)
{
    struct kvp_frame r = *f;
    r.status = 0;
    r.op = f->op == KVP_FRAME_READ ? KVP_FRAME_READ_RESP
           : f->op == KVP_FRAME_WRITE ? KVP_FRAME_WRITE_RESP : KVP_FRAME_PONG;
    if (f->op != KVP_FRAME_READ)
        r.length = 0;
    uint8_t hdr[KVP_FRAME_HEADER_BYTES];
    kvp_frame_encode(&r, hdr);
    if (fake_write_full(fd, hdr, sizeof hdr))
        return -1;
    if (f->op == KVP_FRAME_READ) {
        uint64_t len = keep ? keep : f->length;
        uint8_t *buf = malloc(len);
        for (uint64_t i = 0; i < len; i++)
            buf[i] = pat_byte(7, f->offset + i);
        int rc = fake_write_full(fd, buf, len);
        free(buf);
        return rc;
    }
    return 0;
}

static inline void *fake_main(void *arg)
{
    struct fake_server *fs = arg;
    while (!atomic_load(&fs->stop)) {
        int fd = accept(fs->lfd, NULL, NULL);
        if (fd < 0)
            break;
        int one = 1; /* small responses back to back: no Nagle delay */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        atomic_store(&fs->cur_fd, fd);
        if (atomic_load(&fs->stop))
            shutdown(fd, SHUT_RDWR);
        static __thread struct kvp_frame held[4096];
        size_t n_held = 0;
        uint8_t *pay = malloc(1 << 20);
        for (;;) {
            if (atomic_load(&fs->mode) == FAKE_NO_READ) {
                while (!atomic_load(&fs->release) && !atomic_load(&fs->stop))
                    usleep(1000);
                atomic_store(&fs->mode, FAKE_SERVE);
            }
            uint8_t hdr[KVP_FRAME_HEADER_BYTES];
            if (fake_read_full(fd, hdr, sizeof hdr))
                break;
            struct kvp_frame f;
            if (kvp_frame_decode(hdr, &f) != 0)
                break;
            fs->requests++;
            if (f.op == KVP_FRAME_WRITE) {
                uint64_t left = f.length, off = 0;
                bool ok = true;
                while (left && ok) {
                    size_t c = left > (1 << 20) ? (1 << 20) : (size_t)left;
                    ok = fake_read_full(fd, pay, c) == 0;
                    if (ok) {
                        fs->write_bytes += c;
                        for (size_t i = 0; i < c; i++)
                            if (pay[i] != pat_byte(5, off + i))
                                fs->write_bad++;
                    }
                    off += c;
                    left -= c;
                }
                if (!ok)
                    break;
            }
            int mode = atomic_load(&fs->mode);
            if (mode == FAKE_STALL) {
                if (n_held < 4096)
                    held[n_held++] = f;
                /* Wait for more requests or the release; a poll would be nicer, a short sleep
                 * loop keeps the helper small. */
                while (!atomic_load(&fs->release) && !atomic_load(&fs->stop)) {
                    struct timeval tv = {0, 1000};
                    fd_set rs;
                    FD_ZERO(&rs);
                    FD_SET(fd, &rs);
                    if (select(fd + 1, &rs, NULL, NULL, &tv) > 0)
                        break; /* another request arrived: hold it too */
                }
                if (atomic_load(&fs->release)) {
                    for (size_t i = 0; i < n_held; i++) {
                        if (fake_answer(fs, fd, &held[i], 0))
                            break;
                        fs->late_replies++;
                    }
                    n_held = 0;
                    atomic_store(&fs->mode, FAKE_SERVE);
                }
                continue;
            }
            unsigned dmax = atomic_load(&fs->delay_us);
            if (mode == FAKE_DELAY && dmax && rand_r(&fs->seed) % 4 == 0)
                usleep((useconds_t)(rand_r(&fs->seed) % dmax)); /* one request in four */
            if (mode == FAKE_HALF_CLOSE && f.op == KVP_FRAME_READ) {
                fake_answer(fs, fd, &f, f.length / 2 ? f.length / 2 : 1);
                break;
            }
            if (fake_answer(fs, fd, &f, 0))
                break;
        }
        free(pay);
        atomic_store(&fs->cur_fd, -1);
        close(fd);
    }
    return NULL;
}

static inline int fake_server_start_seeded(struct fake_server *fs, int mode, unsigned delay_us,
                                           unsigned seed)
{
    memset(fs, 0, sizeof *fs);
    atomic_store(&fs->delay_us, delay_us);
    fs->seed = seed; /* before the thread starts: it owns the seed afterwards */
    atomic_store(&fs->cur_fd, -1);
    atomic_store(&fs->mode, mode);
    fs->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(fs->lfd, (struct sockaddr *)&a, sizeof a) || listen(fs->lfd, 16) ||
        getsockname(fs->lfd, (struct sockaddr *)&a, &al))
        return -1;
    fs->port = ntohs(a.sin_port);
    return pthread_create(&fs->thread, NULL, fake_main, fs);
}

static inline int fake_server_start(struct fake_server *fs, int mode)
{
    return fake_server_start_seeded(fs, mode, 0, 1);
}

static inline void fake_server_stop(struct fake_server *fs)
{
    atomic_store(&fs->stop, true);
    atomic_store(&fs->release, true);
    shutdown(fs->lfd, SHUT_RDWR);
    int fd = atomic_load(&fs->cur_fd);
    if (fd >= 0)
        shutdown(fd, SHUT_RDWR);
    pthread_join(fs->thread, NULL);
    close(fs->lfd);
}

#endif
