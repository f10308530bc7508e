/*
 * test_xfer_spec.c — adversarial tests of the engine's speculative READ receive path and its
 * pushback buffer (xfer_engine.c conn_recv; docs/data-plane.md "Speculative reads").
 *
 * A scripted segment server answers every READ by a code carried in the low 4 bits of its
 * remote offset: OK (pattern bytes), an error status, a wrong length, an out-of-order id, a
 * close, or a delay; it collects the requests pipelined behind the first one and writes the
 * answers in random chunks (or one byte at a time). The client side checks the contract on
 * every slice: an OK slot holds exactly its bytes, an error-coded slot is never OK, nothing is
 * written outside [local, local + length), and after a call returned nothing touches its
 * buffers again (they are refilled with a canary when the call returns and checked after the
 * engine is gone).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <poll.h>

#include "actors/transfer/fault.h"
#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "xfer_test_util.h"

/* ------------------------------------------------------------------ scripted server */

enum {
    CODE_OK_MAX = 7,    /* 0..7: OK, pattern(seed 7, offset-based) */
    CODE_NOT_FOUND = 8, /* status NOT_FOUND, no payload */
    CODE_INVALID = 9,   /* status INVALID, no payload */
    CODE_LONG = 10,     /* OK with length + 1 (a protocol error: the connection goes) */
    CODE_CLOSE = 11,    /* the answers before it are written, then the connection closes */
    CODE_DELAY = 12,    /* answered after a pause of 2..20 ms (the answers before it go first) */
    CODE_BAD_ID = 13,   /* OK answer with another req_id (out of order: the connection goes) */
};

enum chunking { CHUNK_RANDOM = 0, CHUNK_DRIBBLE = 1, CHUNK_WHOLE = 2 };

#define SS_MAX_CONNS 512

struct sserver {
    int lfd;
    uint16_t port;
    pthread_t thread;
    atomic_bool stop;
    _Atomic int chunking;
    pthread_mutex_t mu;
    int fds[SS_MAX_CONNS];
    pthread_t threads[SS_MAX_CONNS];
    int n;
    atomic_ulong write_bad; /* WRITE payload bytes that were not the pattern */
};

struct sconn {
    struct sserver *s;
    int fd;
    unsigned seed;
};

struct outbuf {
    uint8_t *p;
    size_t len, cap;
};

static void out_put(struct outbuf *o, const void *b, size_t n)
{
    if (o->len + n > o->cap) {
        o->cap = (o->len + n) * 2;
        o->p = realloc(o->p, o->cap);
    }
    if (n)
        memcpy(o->p + o->len, b, n);
    o->len += n;
}

/* Write o in the server's chunking; returns -1 if the peer is gone. */
static int out_flush(struct sconn *sc, struct outbuf *o)
{
    int mode = atomic_load(&sc->s->chunking);
    size_t off = 0;
    while (off < o->len) {
        size_t n = o->len - off;
        if (mode == CHUNK_DRIBBLE) {
            n = 1;
        } else if (mode == CHUNK_RANDOM) {
            size_t lim = (rand_r(&sc->seed) % 4 == 0) ? 3 * KVP_FRAME_HEADER_BYTES : 9000;
            size_t k = 1 + (size_t)rand_r(&sc->seed) % lim;
            n = k < n ? k : n;
        }
        if (fake_write_full(sc->fd, o->p + off, n))
            return -1;
        off += n;
        if (mode == CHUNK_DRIBBLE ? rand_r(&sc->seed) % 64 == 0 : (mode == CHUNK_RANDOM && rand_r(&sc->seed) % 3 == 0))
            usleep(50); /* let the client read what is there: reads stop at odd places */
    }
    o->len = 0;
    return 0;
}

/* A READ, or a WRITE whose payload is read and checked (pattern seed 5, offset-based). */
static int take_request(struct sconn *sc, const struct kvp_frame *f)
{
    if (f->op == KVP_FRAME_READ)
        return 0;
    if (f->op != KVP_FRAME_WRITE)
        return -1;
    uint8_t buf[4096];
    for (uint64_t off = 0; off < f->length;) {
        size_t c = f->length - off < sizeof buf ? (size_t)(f->length - off) : sizeof buf;
        if (fake_read_full(sc->fd, buf, c))
            return -1;
        for (size_t i = 0; i < c; i++)
            if (buf[i] != pat_byte(5, f->offset + off + i))
                atomic_fetch_add(&sc->s->write_bad, 1);
        off += c;
    }
    return 0;
}

static void answer(struct outbuf *o, const struct kvp_frame *f, int code)
{
    struct kvp_frame r = *f;
    if (f->op == KVP_FRAME_WRITE) {
        r.op = KVP_FRAME_WRITE_RESP;
        if (code == CODE_BAD_ID)
            r.req_id = f->req_id + 1000000;
        r.status = code == CODE_NOT_FOUND ? KVP_ERR_NOT_FOUND : code == CODE_INVALID ? KVP_ERR_INVALID : 0;
        r.length = 0;
        r.deadline = 0;
        uint8_t hdr[KVP_FRAME_HEADER_BYTES];
        kvp_frame_encode(&r, hdr);
        out_put(o, hdr, sizeof hdr);
        return;
    }
    r.op = KVP_FRAME_READ_RESP;
    r.status = 0;
    r.deadline = 0;
    if (code == CODE_NOT_FOUND || code == CODE_INVALID) {
        r.status = code == CODE_NOT_FOUND ? KVP_ERR_NOT_FOUND : KVP_ERR_INVALID;
        r.length = 0;
    } else if (code == CODE_LONG) {
        r.length = f->length + 1;
    } else if (code == CODE_BAD_ID) {
        r.req_id = f->req_id + 1000000;
    }
    uint8_t hdr[KVP_FRAME_HEADER_BYTES];
    kvp_frame_encode(&r, hdr);
    out_put(o, hdr, sizeof hdr);
    if (r.status != 0)
        return;
    out_put(o, NULL, 0);
    if (o->len + r.length > o->cap) {
        o->cap = (o->len + r.length) * 2;
        o->p = realloc(o->p, o->cap);
    }
    for (uint64_t i = 0; i < r.length; i++)
        o->p[o->len + i] = pat_byte(7, f->offset + i);
    o->len += r.length;
}

static void *sconn_main(void *arg)
{
    struct sconn *sc = arg;
    struct outbuf o = {0};
    enum { MAXQ = 256 };
    struct kvp_frame q[MAXQ];
    for (;;) {
        uint8_t hdr[KVP_FRAME_HEADER_BYTES];
        if (fake_read_full(sc->fd, hdr, sizeof hdr))
            break;
        size_t n = 0;
        if (kvp_frame_decode(hdr, &q[n]) != 0 || take_request(sc, &q[n]))
            break;
        n++;
        /* the requests pipelined behind it: answered together */
        struct pollfd pf = {.fd = sc->fd, .events = POLLIN};
        while (n < MAXQ && poll(&pf, 1, 2) == 1 && (pf.revents & POLLIN)) {
            if (fake_read_full(sc->fd, hdr, sizeof hdr) || kvp_frame_decode(hdr, &q[n]) != 0 ||
                take_request(sc, &q[n]))
                goto out;
            n++;
        }
        for (size_t i = 0; i < n; i++) {
            int code = (int)(q[i].offset & 15);
            if (code == CODE_CLOSE) {
                /* FIN after the answers so far; requests still coming are read and dropped (a
                 * close with unread bytes would send a RST, which may cost the client answers it
                 * has not read yet) */
                out_flush(sc, &o);
                shutdown(sc->fd, SHUT_WR);
                uint8_t junk[4096];
                while (recv(sc->fd, junk, sizeof junk, 0) > 0)
                    ;
                goto out;
            }
            if (code == CODE_DELAY) {
                if (out_flush(sc, &o))
                    goto out;
                usleep(2000 + (useconds_t)(rand_r(&sc->seed) % 18000));
            }
            answer(&o, &q[i], code);
        }
        if (out_flush(sc, &o))
            break;
    }
out:
    shutdown(sc->fd, SHUT_RDWR);
    free(o.p);
    free(sc);
    return NULL;
}

static void *saccept_main(void *arg)
{
    struct sserver *s = arg;
    unsigned seed = 99;
    for (;;) {
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0)
            break;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        pthread_mutex_lock(&s->mu);
        if (atomic_load(&s->stop) || s->n == SS_MAX_CONNS) { /* the test fails on this reset */
            pthread_mutex_unlock(&s->mu);
            close(fd);
            continue;
        }
        struct sconn *sc = calloc(1, sizeof *sc);
        sc->s = s;
        sc->fd = fd;
        sc->seed = (unsigned)rand_r(&seed);
        s->fds[s->n] = fd;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setstacksize(&at, 256u << 10);
        pthread_create(&s->threads[s->n], &at, sconn_main, sc);
        pthread_attr_destroy(&at);
        s->n++;
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

static void sserver_start(struct sserver *s, int chunking)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    atomic_store(&s->chunking, chunking);
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s->lfd, 64), 0);
    assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&a, &al), 0);
    s->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&s->thread, NULL, saccept_main, s), 0);
}

static void sserver_stop(struct sserver *s)
{
    atomic_store(&s->stop, true);
    shutdown(s->lfd, SHUT_RDWR);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&s->mu);
    int n = s->n;
    for (int i = 0; i < n; i++)
        shutdown(s->fds[i], SHUT_RDWR);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++) {
        pthread_join(s->threads[i], NULL);
        close(s->fds[i]);
    }
    close(s->lfd);
    pthread_mutex_destroy(&s->mu);
}

/* ------------------------------------------------------------------ client side */

#define GUARD 64u
#define CANARY 0xA5
#define GUARD_BYTE 0x5A

/* Buffers of finished calls: refilled with CANARY, checked once the engine is destroyed. */
struct retired {
    pthread_mutex_t mu;
    uint8_t **p;
    size_t *len;
    size_t n, cap;
};

static struct retired g_ret = {.mu = PTHREAD_MUTEX_INITIALIZER};
static int g_round; /* for failure messages of the single-caller tests */

static void retire(uint8_t *p, size_t len)
{
    memset(p, CANARY, len);
    pthread_mutex_lock(&g_ret.mu);
    if (g_ret.n == g_ret.cap) {
        g_ret.cap = g_ret.cap ? g_ret.cap * 2 : 256;
        g_ret.p = realloc(g_ret.p, g_ret.cap * sizeof *g_ret.p);
        g_ret.len = realloc(g_ret.len, g_ret.cap * sizeof *g_ret.len);
    }
    g_ret.p[g_ret.n] = p;
    g_ret.len[g_ret.n] = len;
    g_ret.n++;
    pthread_mutex_unlock(&g_ret.mu);
}

/* After the engine is destroyed: no retired buffer was touched; frees them. */
static void check_retired(void)
{
    size_t bad = 0;
    for (size_t i = 0; i < g_ret.n; i++) {
        if (!all_bytes(g_ret.p[i], g_ret.len[i], CANARY))
            bad++;
        free(g_ret.p[i]);
    }
    free(g_ret.p);
    free(g_ret.len);
    g_ret.p = NULL;
    g_ret.len = NULL;
    g_ret.n = g_ret.cap = 0;
    if (bad)
        fail_msg("%zu buffers were written after their call returned", bad);
}

struct round_opts {
    int n;             /* slices */
    uint64_t max_len;  /* payload length 1..max_len */
    int pct_err;       /* NOT_FOUND / INVALID */
    int pct_fatal;     /* LONG / CLOSE / BAD_ID */
    int pct_delay;
    int pct_write;     /* WRITE slices (codes OK, NOT_FOUND, INVALID, BAD_ID, CLOSE, DELAY) */
    uint32_t timeout_ms;
    bool exact;        /* one connection, one caller: statuses are predictable */
};

/* One batch: returns the number of slices that ended OK. */
static int run_round(struct kvp_xfer_engine *e, const char *ep, unsigned *seed, const struct round_opts *o,
                     uint64_t *spec_ok)
{
    int n = o->n;
    struct kvp_xfer_slice *s = calloc((size_t)n, sizeof *s);
    uint8_t **mem = calloc((size_t)n, sizeof *mem);
    int *code = calloc((size_t)n, sizeof *code);
    assert_true(s && mem && code);
    for (int i = 0; i < n; i++) {
        uint64_t len = 1 + (uint64_t)rand_r(seed) % o->max_len;
        int r = rand_r(seed) % 100;
        int c = rand_r(seed) % (CODE_OK_MAX + 1);
        if (r < o->pct_err)
            c = rand_r(seed) % 2 ? CODE_NOT_FOUND : CODE_INVALID;
        else if (r < o->pct_err + o->pct_fatal)
            c = (int[]){CODE_LONG, CODE_CLOSE, CODE_BAD_ID}[rand_r(seed) % 3];
        else if (r < o->pct_err + o->pct_fatal + o->pct_delay)
            c = CODE_DELAY;
        bool wr = rand_r(seed) % 100 < o->pct_write;
        if (wr && c == CODE_LONG)
            c = 0;
        code[i] = c;
        mem[i] = malloc(len + 2 * GUARD);
        assert_non_null(mem[i]);
        memset(mem[i], GUARD_BYTE, len + 2 * GUARD);
        uint64_t off = ((uint64_t)rand_r(seed) << 4) | (uint64_t)c;
        if (wr)
            for (uint64_t k = 0; k < len; k++)
                mem[i][GUARD + k] = pat_byte(5, off + k);
        s[i] = (struct kvp_xfer_slice){.local = mem[i] + GUARD, .length = len, .segment_id = 3,
                                       .endpoint = ep, .remote_offset = off,
                                       .op = wr ? KVP_XFER_WRITE : KVP_XFER_READ, .status = 12345};
    }
    kvp_xfer_run(e, s, (size_t)n, o->timeout_ms);
    int ok = 0;
    bool dead = false; /* exact mode: a fatal code closed the connection */
    for (int i = 0; i < n; i++) {
        int c = code[i];
        int st = s[i].status;
        if (!all_bytes(mem[i], GUARD, GUARD_BYTE) || !all_bytes(mem[i] + GUARD + s[i].length, GUARD, GUARD_BYTE))
            fail_msg("slice %d (code %d, len %lu): written outside its memory", i, c, (unsigned long)s[i].length);
        if (s[i].op == KVP_XFER_WRITE) {
            for (uint64_t k = 0; k < s[i].length; k++)
                if (mem[i][GUARD + k] != pat_byte(5, s[i].remote_offset + k))
                    fail_msg("slice %d: the source of a WRITE was written at %lu", i, (unsigned long)k);
        } else if (st == KVP_OK) {
            ok++;
            if (c > CODE_OK_MAX && c != CODE_DELAY)
                fail_msg("slice %d: code %d answered OK", i, c);
            for (uint64_t k = 0; k < s[i].length; k++)
                if (mem[i][GUARD + k] != pat_byte(7, s[i].remote_offset + k))
                    fail_msg("slice %d (len %lu): OK with a wrong byte at %lu", i, (unsigned long)s[i].length,
                             (unsigned long)k);
        } else if (c == CODE_NOT_FOUND && st != KVP_ERR_NOT_FOUND && st != KVP_ERR_TRANSFER &&
                   st != KVP_ERR_TIMEOUT) {
            fail_msg("slice %d: NOT_FOUND answer reported %d", i, st);
        } else if (c == CODE_INVALID && st != KVP_ERR_INVALID && st != KVP_ERR_TRANSFER && st != KVP_ERR_TIMEOUT) {
            fail_msg("slice %d: INVALID answer reported %d", i, st);
        }
        if (o->exact) {
            int want = dead ? KVP_ERR_TRANSFER
                       : c == CODE_NOT_FOUND ? KVP_ERR_NOT_FOUND
                       : c == CODE_INVALID   ? KVP_ERR_INVALID
                       : (c == CODE_LONG || c == CODE_CLOSE || c == CODE_BAD_ID) ? KVP_ERR_TRANSFER
                                                                                  : KVP_OK;
            if (c == CODE_LONG || c == CODE_CLOSE || c == CODE_BAD_ID)
                dead = true;
            if (st != want)
                fail_msg("round %d slice %d (code %d, len %lu): status %d, expected %d", g_round, i, c,
                         (unsigned long)s[i].length, st, want);
        }
        retire(mem[i], s[i].length + 2 * GUARD);
    }
    if (spec_ok)
        *spec_ok += (uint64_t)ok;
    free(s);
    free(mem);
    free(code);
    return ok;
}

/* One scripted server, its endpoint, and an engine with `conns` connections per peer on it. */
struct spec_env {
    struct sserver srv;
    char ep[64];
    struct kvp_xfer_engine *e;
};

static void env_start(struct spec_env *v, int chunking, uint32_t conns, uint64_t slice_bytes)
{
    sserver_start(&v->srv, chunking);
    snprintf(v->ep, sizeof v->ep, "127.0.0.1:%u", v->srv.port);
    struct kvp_xfer_params p = {.conns_per_peer = conns, .slice_bytes = slice_bytes, .connect_timeout_ms = 2000};
    assert_int_equal(kvp_xfer_engine_new(&v->e, &p), KVP_OK);
}

/* Engine gone, server stopped: no buffer written after its call returned, no WRITE payload
 * arrived wrong. */
static void env_stop(struct spec_env *v)
{
    kvp_xfer_engine_destroy(&v->e);
    sserver_stop(&v->srv);
    check_retired();
    assert_int_equal(atomic_load(&v->srv.write_bad), 0);
}

/* Errors between OK answers, answers written in random pieces: every status is exact. */
static void test_spec_errors_random_chunks_exact(void **state)
{
    (void)state;
    struct spec_env v;
    env_start(&v, CHUNK_RANDOM, 1, 1 << 20);
    unsigned seed = 4242;
    for (int round = 0; round < 150; round++) {
        struct round_opts o = {.n = 1 + round % 48, .max_len = round % 3 == 0 ? 64 : round % 3 == 1 ? 5000 : 70000,
                               .pct_err = 5 + round % 40, .timeout_ms = 20000, .exact = true};
        run_round(v.e, v.ep, &seed, &o, NULL);
    }
    struct kvp_xfer_stats st;
    kvp_xfer_stats(v.e, &st);
    printf("spec_pieces %lu pushbacks %lu stray %lu\n", (unsigned long)st.spec_pieces, (unsigned long)st.pushbacks,
           (unsigned long)st.stray_bytes);
    assert_true(st.spec_pieces > 0);
    assert_true(st.pushbacks > 0);
    assert_int_equal(st.stray_bytes, 0);
    env_stop(&v);
}

/* The same, one byte per send: headers and payloads end at every possible place. */
static void test_spec_errors_dribbled_exact(void **state)
{
    (void)state;
    struct spec_env v;
    env_start(&v, CHUNK_DRIBBLE, 1, 1 << 20);
    unsigned seed = 777;
    for (int round = 0; round < 40; round++) {
        struct round_opts o = {.n = 2 + round % 20, .max_len = round % 2 ? 8 : 200, .pct_err = 30,
                               .timeout_ms = 20000, .exact = true};
        run_round(v.e, v.ep, &seed, &o, NULL);
    }
    env_stop(&v);
}

/* Protocol errors (a wrong length, another req_id, a close) behind speculative reads: the
 * pieces before it end as answered, the connection fails the rest, and the next batch works. */
static void test_spec_protocol_errors_exact(void **state)
{
    (void)state;
    struct spec_env v;
    env_start(&v, CHUNK_RANDOM, 1, 1 << 20);
    unsigned seed = 31337;
    for (int round = 0; round < 120; round++) {
        g_round = round;
        struct round_opts o = {.n = 2 + round % 40, .max_len = round % 2 ? 300 : 9000, .pct_err = 20,
                               .pct_fatal = 4, .pct_write = round % 2 ? 0 : 25, .timeout_ms = 20000, .exact = true};
        run_round(v.e, v.ep, &seed, &o, NULL);
    }
    env_stop(&v);
}

struct worker {
    struct kvp_xfer_engine *e;
    const char *ep;
    unsigned seed;
    int rounds;
    uint64_t max_len;
    uint64_t ok;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    for (int r = 0; r < w->rounds; r++) {
        struct round_opts o = {.n = 1 + rand_r(&w->seed) % (w->max_len > 100000 ? 8 : 40),
                               .max_len = r % 2 ? 700 : w->max_len, .pct_err = 15,
                               .pct_fatal = r % 5 == 0 ? 2 : 0, .pct_delay = 3, .pct_write = r % 4 == 1 ? 20 : 0,
                               .timeout_ms = r % 3 == 0 ? 1 + (uint32_t)(rand_r(&w->seed) % 15) : 20000};
        run_round(w->e, w->ep, &w->seed, &o, &w->ok);
    }
    return NULL;
}

static void run_workers(struct kvp_xfer_engine *e, const char *ep, int t, int rounds, uint64_t max_len)
{
    struct worker w[8];
    pthread_t th[8];
    for (int i = 0; i < t; i++) {
        w[i] = (struct worker){.e = e, .ep = ep, .seed = 1000u + (unsigned)i, .rounds = rounds, .max_len = max_len};
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    uint64_t ok = 0;
    for (int i = 0; i < t; i++) {
        pthread_join(th[i], NULL);
        ok += w[i].ok;
    }
    assert_true(ok > 0);
    struct kvp_xfer_stats st;
    kvp_xfer_stats(e, &st);
    printf("ok %lu spec_pieces %lu pushbacks %lu fenced %lu stray %lu\n", (unsigned long)ok,
           (unsigned long)st.spec_pieces, (unsigned long)st.pushbacks, (unsigned long)st.fenced,
           (unsigned long)st.stray_bytes);
}

/* Many callers on one engine (2 connections), errors, protocol errors, delays and timeouts
 * that fence batches mid-stream; small pieces (slice_bytes 4 KiB) split slices. Invariants only. */
static void test_spec_concurrent_fencing_invariants(void **state)
{
    (void)state;
    struct spec_env v;
    env_start(&v, CHUNK_RANDOM, 2, 4096);
    run_workers(v.e, v.ep, 4, 60, 12000);
    env_stop(&v);
}

/* Pieces larger than the 256 KiB scratch buffer, fenced mid-payload by short timeouts, with
 * speculative reads of the small pieces behind them. Invariants only. */
static void test_spec_large_pieces_fenced_invariants(void **state)
{
    (void)state;
    struct spec_env v;
    env_start(&v, CHUNK_RANDOM, 2, 1 << 20);
    run_workers(v.e, v.ep, 3, 16, 600000);
    env_stop(&v);
}

/*
 * Fault LATE on a READ queued behind two error answers: the bytes read speculatively after the
 * first error hold the LATE piece's answer, so the connection pauses with them in its pushback
 * buffer. A timeout fences the LATE piece and the one behind it during the pause; released
 * afterwards, their bytes go to scratch, never into the (refilled) caller memory.
 */
static void test_spec_late_pause_with_pushback_fenced(void **state)
{
    (void)state;
#ifndef KVP_FAULT_INJECTION
    skip();
#endif
    struct spec_env v;
    env_start(&v, CHUNK_WHOLE, 1, 1 << 20);
    for (int round = 0; round < 6; round++) {
        bool fence = round % 2 == 0;
        kvp_xfer_fault_clear();
        struct kvp_xfer_fault_rule r = {.action = KVP_FAULT_LATE, .transport = KVP_FAULT_TCP, .op = KVP_XFER_READ,
                                        .segment_id = 77, .ms = fence ? 600000 : 30, .count = 1};
        assert_int_equal(kvp_xfer_fault_add(&r), KVP_OK);
        enum { N = 5 };
        int codes[N] = {CODE_NOT_FOUND, CODE_NOT_FOUND, 0, 1, 2};
        uint64_t lens[N] = {4096, 4096, 3000 + (uint64_t)round * 7, 2000, 100};
        uint8_t *mem[N];
        struct kvp_xfer_slice s[N];
        for (int i = 0; i < N; i++) {
            mem[i] = malloc(lens[i] + 2 * GUARD);
            memset(mem[i], GUARD_BYTE, lens[i] + 2 * GUARD);
            s[i] = (struct kvp_xfer_slice){.local = mem[i] + GUARD, .length = lens[i], .segment_id = i == 2 ? 77 : 3,
                                           .endpoint = v.ep,
                                           .remote_offset = ((uint64_t)(round * 10 + i) << 8) | (uint64_t)codes[i],
                                           .op = KVP_XFER_READ, .status = 12345};
        }
        kvp_xfer_run(v.e, s, N, fence ? 5000 : 20000);
        assert_int_equal(s[0].status, KVP_ERR_NOT_FOUND);
        assert_int_equal(s[1].status, KVP_ERR_NOT_FOUND);
        for (int i = 2; i < N; i++) {
            if (fence) {
                assert_int_equal(s[i].status, KVP_ERR_TIMEOUT);
            } else {
                assert_int_equal(s[i].status, KVP_OK);
                for (uint64_t k = 0; k < lens[i]; k++)
                    assert_int_equal(mem[i][GUARD + k], pat_byte(7, s[i].remote_offset + k));
            }
        }
        for (int i = 0; i < N; i++) {
            assert_true(all_bytes(mem[i], GUARD, GUARD_BYTE));
            assert_true(all_bytes(mem[i] + GUARD + lens[i], GUARD, GUARD_BYTE));
            retire(mem[i], lens[i] + 2 * GUARD);
        }
        kvp_xfer_fault_release();
        assert_int_equal(kvp_xfer_fault_quiesce(10000), KVP_OK);
        /* the connection still works */
        uint8_t small[512];
        struct kvp_xfer_slice t = {.local = small, .length = sizeof small, .segment_id = 3, .endpoint = v.ep,
                                   .remote_offset = 4096, .op = KVP_XFER_READ};
        assert_int_equal(kvp_xfer_run(v.e, &t, 1, 20000), KVP_OK);
        for (int k = 0; k < (int)sizeof small; k++)
            assert_int_equal(small[k], pat_byte(7, 4096 + (uint64_t)k));
    }
    kvp_xfer_fault_clear();
    struct kvp_xfer_stats st;
    kvp_xfer_stats(v.e, &st);
    printf("pushbacks %lu fenced %lu stray %lu\n", (unsigned long)st.pushbacks, (unsigned long)st.fenced,
           (unsigned long)st.stray_bytes);
    env_stop(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_errors_random_chunks_exact),
        cmocka_unit_test(test_spec_errors_dribbled_exact),
        cmocka_unit_test(test_spec_protocol_errors_exact),
        cmocka_unit_test(test_spec_concurrent_fencing_invariants),
        cmocka_unit_test(test_spec_large_pieces_fenced_invariants),
        cmocka_unit_test(test_spec_late_pause_with_pushback_fenced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
