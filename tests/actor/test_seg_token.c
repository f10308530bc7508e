/*
 * test_seg_token.c — the data-plane token (issue 25 item 2; auth/auth_token.h, docs/security.md
 * "Data plane: tokens") on a segment server's data port (actors/segment/seg_server.c):
 *  - pure: a token issued and answered verifies; response_length on partial and bad bytes;
 *  - on the port, each refused and logged (a WARN naming 127.0.0.1, stderr captured) while an
 *    authorised connection opened first keeps being served after each refusal:
 *    a peer without a token (a READ header first), garbage before the handshake, a token signed
 *    by an unknown key, a forged signature under a known key id, an altered token, a replayed
 *    response, a stolen token answered with another ephemeral key, an expired token, a valid
 *    token for another segment;
 *  - a response and requests sent together (the one extra round trip is the challenge);
 *  - the token_refused counter counts the refusals;
 *  - the client's wallet: tokens per segment, refresh before expiry, the response it makes;
 *  - the TCP transport (actors/transfer/xfer_tcp.c) with a token_respond callback answering from a
 *    wallet: a READ and a WRITE through it are served; the same transport without the callback,
 *    or with a wallet that holds no token for this segment, gets its xslices failed;
 *  - the transfer engine (kvp_xfer_params.token_respond, two transfer actors sharing one wallet
 *    behind a mutex): a batch of READs is served; an engine without tokens gets every slice
 *    failed;
 *  - a connection accepted before the segment has an id: its challenge waits for the id and names
 *    it (the first put right after `cluster up` failed on a challenge naming segment 0);
 *  - key distribution: a master certificate made by keygen publishes its token key, a client or
 *    segment loading the masters' directory finds it, and tokens the master signs with the key
 *    derived from its secret certificate verify with it.
 * Every blocking receive has a 20 s guard (SO_RCVTIMEO); nothing here is timed.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "actors/segment/seg_server.h"
#include "actors/transfer/transfer.h"
#include "actors/transfer/transport.h"
#include "auth/auth.h"
#include "auth/auth_token.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "tests/actor/seg_raw_client.h"
#include "wire/envelope.h"

#define REGION (1u << 20)
#define SEG_ID 7
#define BYTE(i) ((uint8_t)((i) * 13u + 5u))

static struct {
    struct kvp_seg_server *srv;
    uint8_t *region;
    uint32_t port;
    uint8_t mpk[KVP_DT_PK_BYTES], msk[KVP_DT_SK_BYTES];     /* the master's token key */
    uint8_t epk[KVP_DT_PK_BYTES], esk[KVP_DT_SK_BYTES];     /* the client's ephemeral key */
    uint8_t xpk[KVP_DT_PK_BYTES], xsk[KVP_DT_SK_BYTES];     /* an attacker's key */
    int good; /* the authorised connection kept open through the refusals */
    uint64_t req;
} T;

static void guard(int fd)
{
    struct timeval tv = {.tv_sec = 20};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

static int token(uint32_t seg, int64_t ttl_ms, const uint8_t *eph_pk, const uint8_t *ipk, const uint8_t *isk,
                 uint8_t *out)
{
    struct kvp_dt_claims c = {.segment_id = seg, .expires_ms = (uint64_t)((int64_t)kvp_clock_wall_ms() + ttl_ms)};
    memcpy(c.client_pk, eph_pk, KVP_DT_PK_BYTES);
    memset(c.client_id, 0xab, sizeof c.client_id);
    snprintf(c.tenant, sizeof c.tenant, "team-a");
    int n = kvp_dt_issue(ipk, isk, &c, out, KVP_DT_TOKEN_MAX);
    assert_true(n > 0);
    return n;
}

/* Connect and read the challenge. */
static int open_conn(uint8_t ch[KVP_DT_CHALLENGE_BYTES])
{
    int fd = seg_raw_connect(T.port);
    assert_true(fd >= 0);
    guard(fd);
    seg_raw_recv_all(fd, ch, KVP_DT_CHALLENGE_BYTES);
    assert_memory_equal(ch, "KVPC", 4);
    return fd;
}

/* A READ of 64 bytes at `off` on fd answers with the region's bytes. */
static void read_ok(int fd, uint64_t off)
{
    uint8_t h[KVP_FRAME_HEADER_BYTES], buf[64];
    seg_raw_header(h, KVP_FRAME_READ, SEG_ID, ++T.req, off, sizeof buf, 0);
    seg_raw_send_all(fd, h, sizeof h);
    struct kvp_frame f = seg_raw_response(fd);
    assert_int_equal(f.op, KVP_FRAME_READ_RESP);
    assert_int_equal(f.status, KVP_OK);
    assert_int_equal(f.length, sizeof buf);
    seg_raw_recv_all(fd, buf, sizeof buf);
    for (size_t i = 0; i < sizeof buf; i++)
        assert_int_equal(buf[i], BYTE(off + i));
}

/* The server closed fd without answering anything (EOF or reset, not the 20 s guard). */
static void closed_unanswered(int fd)
{
    uint8_t b[64];
    ssize_t r = recv(fd, b, sizeof b, 0);
    if (r < 0)
        assert_int_equal(errno, ECONNRESET);
    else
        assert_int_equal(r, 0);
    close(fd);
}

/* Run fn-like sends on a fresh connection, expect a refusal, and that the good one still works. */
#define REFUSED(sendbytes, len)                                                                    \
    do {                                                                                           \
        closed_unanswered_after(sendbytes, len);                                                   \
        read_ok(T.good, 128);                                                                      \
    } while (0)

static void closed_unanswered_after(const uint8_t *bytes, size_t len)
{
    uint8_t ch[KVP_DT_CHALLENGE_BYTES];
    int fd = open_conn(ch);
    seg_raw_send_all(fd, bytes, len);
    closed_unanswered(fd);
}

static int setup(void **state)
{
    (void)state;
    if (kvp_dt_init() != KVP_OK)
        return -1;
    T.region = malloc(REGION);
    if (!T.region)
        return -1;
    for (size_t i = 0; i < REGION; i++)
        T.region[i] = BYTE(i);
    kvp_dt_keypair(T.mpk, T.msk);
    kvp_dt_keypair(T.epk, T.esk);
    kvp_dt_keypair(T.xpk, T.xsk);
    uint8_t other[KVP_DT_PK_BYTES], othersk[KVP_DT_SK_BYTES];
    kvp_dt_keypair(other, othersk);
    uint8_t pks[2][KVP_DT_PK_BYTES];
    memcpy(pks[0], other, KVP_DT_PK_BYTES); /* a second master's key: the issuer is found by key id */
    memcpy(pks[1], T.mpk, KVP_DT_PK_BYTES);
    if (kvp_seg_server_start_auth(&T.srv, "127.0.0.1", 0, T.region, REGION, (const uint8_t(*)[32])pks, 2) != KVP_OK)
        return -1;
    kvp_seg_server_set_id(T.srv, SEG_ID);
    T.port = kvp_seg_server_port(T.srv);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvp_seg_server_stop(&T.srv);
    free(T.region);
    return 0;
}

static void test_pure(void **state)
{
    (void)state;
    uint8_t tok[KVP_DT_TOKEN_MAX], ch[KVP_DT_CHALLENGE_BYTES], resp[KVP_DT_RESPONSE_MAX];
    int tl = token(SEG_ID, 60000, T.epk, T.mpk, T.msk, tok);
    kvp_dt_challenge(SEG_ID, ch);
    int rl = kvp_dt_respond(ch, tok, (size_t)tl, T.esk, resp, sizeof resp);
    assert_int_equal(rl, KVP_DT_RESPONSE_HEAD + tl + KVP_DT_SIG_BYTES);
    const uint8_t(*pk)[KVP_DT_PK_BYTES] = (const uint8_t(*)[KVP_DT_PK_BYTES])T.mpk;
    struct kvp_dt_claims c;
    const char *why = NULL;
    assert_int_equal(kvp_dt_verify(ch, resp, (size_t)rl, SEG_ID, kvp_clock_wall_ms(), pk, 1, &c, &why), KVP_OK);
    assert_string_equal(c.tenant, "team-a");
    assert_int_equal(c.segment_id, SEG_ID);
    assert_memory_equal(c.client_pk, T.epk, KVP_DT_PK_BYTES);
    /* length: partial magic 0, full head the total, wrong bytes malformed, bad lengths malformed */
    assert_int_equal(kvp_dt_response_length(resp, 3), 0);
    assert_int_equal(kvp_dt_response_length(resp, KVP_DT_RESPONSE_HEAD), rl);
    assert_int_equal(kvp_dt_response_length((const uint8_t *)"KVPX", 4), KVP_ERR_MALFORMED);
    uint8_t bad[KVP_DT_RESPONSE_HEAD] = {'K', 'V', 'P', 'R', 0xff, 0xff};
    assert_int_equal(kvp_dt_response_length(bad, sizeof bad), KVP_ERR_MALFORMED);
    bad[4] = 1;
    bad[5] = 0;
    assert_int_equal(kvp_dt_response_length(bad, sizeof bad), KVP_ERR_MALFORMED);
    /* a truncated response and one with a lying tenant length are refused, not read past */
    assert_int_equal(kvp_dt_verify(ch, resp, (size_t)rl - 1, SEG_ID, kvp_clock_wall_ms(), pk, 1, NULL, &why),
                     KVP_ERR_MALFORMED);
    resp[KVP_DT_RESPONSE_HEAD + KVP_DT_TOKEN_FIXED - 1] = 60;
    assert_int_equal(kvp_dt_verify(ch, resp, (size_t)rl, SEG_ID, kvp_clock_wall_ms(), pk, 1, NULL, &why),
                     KVP_ERR_DENIED);
    /* an over-long tenant cannot be issued */
    struct kvp_dt_claims big = {.segment_id = 1};
    memset(big.tenant, 'a', sizeof big.tenant);
    assert_int_equal(kvp_dt_issue(T.mpk, T.msk, &big, tok, sizeof tok), KVP_ERR_INVALID);
}

static void test_port(void **state)
{
    (void)state;
    uint8_t ch[KVP_DT_CHALLENGE_BYTES], tok[KVP_DT_TOKEN_MAX], resp[KVP_DT_RESPONSE_MAX];
    struct kvp_seg_server_stats st, st_before;
    kvp_seg_server_stats(T.srv, &st_before); /* other tests of the group ran first */

    /* The authorised client: response and its first READ in one send (no wait after the
     * challenge: the challenge is the only extra round trip). */
    T.good = open_conn(ch);
    assert_int_equal(ch[8] | ch[9] << 8 | ch[10] << 16 | (uint32_t)ch[11] << 24, SEG_ID);
    int tl = token(SEG_ID, 60000, T.epk, T.mpk, T.msk, tok);
    int rl = kvp_dt_respond(ch, tok, (size_t)tl, T.esk, resp, sizeof resp);
    assert_true(rl > 0);
    uint8_t both[KVP_DT_RESPONSE_MAX + KVP_FRAME_HEADER_BYTES];
    memcpy(both, resp, (size_t)rl);
    seg_raw_header(both + rl, KVP_FRAME_READ, SEG_ID, ++T.req, 4096, 64, 0);
    seg_raw_send_all(T.good, both, (size_t)rl + KVP_FRAME_HEADER_BYTES);
    struct kvp_frame f = seg_raw_response(T.good);
    assert_int_equal(f.status, KVP_OK);
    uint8_t buf[64];
    seg_raw_recv_all(T.good, buf, sizeof buf);
    assert_int_equal(buf[0], BYTE(4096));
    read_ok(T.good, 0);
    uint8_t captured[KVP_DT_RESPONSE_MAX]; /* what a sniffer saw on the wire */
    memcpy(captured, resp, (size_t)rl);

    /* Capture stderr: the refusals must be logged naming the peer address. */
    char logpath[] = "/tmp/kvp_seg_token_log_XXXXXX";
    int lfd = mkstemp(logpath);
    assert_true(lfd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(lfd, 2);

    /* 1. no token: a request header first */
    uint8_t h[KVP_FRAME_HEADER_BYTES];
    seg_raw_header(h, KVP_FRAME_READ, SEG_ID, ++T.req, 0, 64, 0);
    REFUSED(h, sizeof h);
    /* 2. garbage before the handshake */
    uint8_t junk[300];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(i * 7 + 3);
    REFUSED(junk, sizeof junk);
    /* 3. a token signed by a key the segment does not know */
    {
        int fd = open_conn(ch);
        int n = token(SEG_ID, 60000, T.epk, T.xpk, T.xsk, tok);
        int m = kvp_dt_respond(ch, tok, (size_t)n, T.esk, resp, sizeof resp);
        seg_raw_send_all(fd, resp, (size_t)m);
        closed_unanswered(fd);
        read_ok(T.good, 128);
    }
    /* 4. forged: the master's key id, the attacker's signature */
    {
        int fd = open_conn(ch);
        int n = token(SEG_ID, 60000, T.xpk, T.xpk, T.xsk, tok);
        memcpy(tok + 4, T.mpk, KVP_DT_KEYID_BYTES);
        int m = kvp_dt_respond(ch, tok, (size_t)n, T.xsk, resp, sizeof resp);
        seg_raw_send_all(fd, resp, (size_t)m);
        closed_unanswered(fd);
        read_ok(T.good, 128);
    }
    /* 5. altered: a valid token with a later expiry written into it */
    {
        int fd = open_conn(ch);
        int n = token(SEG_ID, 60000, T.epk, T.mpk, T.msk, tok);
        tok[4 + KVP_DT_KEYID_BYTES + 4 + 5] ^= 0x10;
        int m = kvp_dt_respond(ch, tok, (size_t)n, T.esk, resp, sizeof resp);
        seg_raw_send_all(fd, resp, (size_t)m);
        closed_unanswered(fd);
        read_ok(T.good, 128);
    }
    /* 6. replayed: the authorised client's response, captured, sent on a new connection */
    REFUSED(captured, (size_t)rl);
    /* 7. stolen: the captured token answered with the attacker's own key */
    {
        int fd = open_conn(ch);
        int m = kvp_dt_respond(ch, captured + KVP_DT_RESPONSE_HEAD, (size_t)tl, T.xsk, resp, sizeof resp);
        seg_raw_send_all(fd, resp, (size_t)m);
        closed_unanswered(fd);
        read_ok(T.good, 128);
    }
    /* 8. expired */
    {
        int fd = open_conn(ch);
        int n = token(SEG_ID, -1000, T.epk, T.mpk, T.msk, tok);
        int m = kvp_dt_respond(ch, tok, (size_t)n, T.esk, resp, sizeof resp);
        seg_raw_send_all(fd, resp, (size_t)m);
        closed_unanswered(fd);
        read_ok(T.good, 128);
    }
    /* 9. a valid token for another segment */
    {
        int fd = open_conn(ch);
        int n = token(SEG_ID + 1, 60000, T.epk, T.mpk, T.msk, tok);
        int m = kvp_dt_respond(ch, tok, (size_t)n, T.esk, resp, sizeof resp);
        seg_raw_send_all(fd, resp, (size_t)m);
        closed_unanswered(fd);
        read_ok(T.good, 128);
    }

    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char log[16384] = "";
    ssize_t ln = pread(lfd, log, sizeof log - 1, 0);
    close(lfd);
    unlink(logpath);
    assert_true(ln > 0);
    log[ln] = '\0';
    /* one line for the address (rate-limited per address: the later refusals are held back) */
    assert_non_null(strstr(log, "refused data connection from 127.0.0.1"));
    assert_non_null(strstr(log, "no token"));

    kvp_seg_server_stats(T.srv, &st);
    assert_int_equal(st.token_refused - st_before.token_refused, 9);

    /* A second authorised connection, answered by a client's wallet, still gets in after all that. */
    struct kvp_dt_wallet *w = NULL;
    assert_int_equal(kvp_dt_wallet_new(&w), KVP_OK);
    uint8_t wpk[KVP_DT_PK_BYTES];
    kvp_dt_wallet_public_key(w, wpk);
    tl = token(SEG_ID, 60000, wpk, T.mpk, T.msk, tok);
    assert_int_equal(kvp_dt_wallet_put(w, tok, (size_t)tl), KVP_OK);
    int fd2 = open_conn(ch);
    rl = kvp_dt_wallet_respond(w, ch, kvp_clock_wall_ms(), resp, sizeof resp);
    assert_true(rl > 0);
    kvp_dt_wallet_destroy(&w);
    seg_raw_send_all(fd2, resp, (size_t)rl);
    read_ok(fd2, 512);
    close(fd2);
    close(T.good);
}

static void test_keys(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvp_seg_token_keys_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char mdir[128], m1[160], m1s[160], cl[160], cls[160];
    snprintf(mdir, sizeof mdir, "%s/masters", dir);
    assert_int_equal(mkdir(mdir, 0700), 0);
    snprintf(m1, sizeof m1, "%s/m1", mdir);
    snprintf(m1s, sizeof m1s, "%s/m1_secret", mdir);
    snprintf(cl, sizeof cl, "%s/client", dir);
    snprintf(cls, sizeof cls, "%s/client_secret", dir);
    assert_int_equal(kvp_auth_keygen(m1, "m1", "master", "", "127.0.0.1:1"), KVP_OK);
    assert_int_equal(kvp_auth_keygen(cl, "c1", "client", "team-a", NULL), KVP_OK);
    struct kvp_auth_client *a = NULL;
    assert_int_equal(kvp_auth_client_load(&a, "curve", cls, mdir, NULL, NULL, "test"), KVP_OK);
    uint8_t keys[4][32];
    assert_int_equal(kvp_auth_client_token_keys(a, keys, 4), 1);
    uint8_t pk[32], sk[64];
    assert_int_equal(kvp_auth_token_key_load(m1s, pk, sk), KVP_OK);
    assert_memory_equal(pk, keys[0], 32);
    uint8_t tok[KVP_DT_TOKEN_MAX], ch[KVP_DT_CHALLENGE_BYTES], resp[KVP_DT_RESPONSE_MAX];
    int tl = token(3, 60000, T.epk, pk, sk, tok);
    kvp_dt_challenge(3, ch);
    int rl = kvp_dt_respond(ch, tok, (size_t)tl, T.esk, resp, sizeof resp);
    assert_int_equal(kvp_dt_verify(ch, resp, (size_t)rl, 3, kvp_clock_wall_ms(), (const uint8_t(*)[32])keys, 1,
                                   NULL, NULL),
                     KVP_OK);
    /* the client's own (non-master) key derives another key: its tokens do not verify */
    uint8_t cpk[32], csk[64];
    assert_int_equal(kvp_auth_token_key_load(cls, cpk, csk), KVP_OK);
    tl = token(3, 60000, T.epk, cpk, csk, tok);
    rl = kvp_dt_respond(ch, tok, (size_t)tl, T.esk, resp, sizeof resp);
    assert_int_equal(kvp_dt_verify(ch, resp, (size_t)rl, 3, kvp_clock_wall_ms(), (const uint8_t(*)[32])keys, 1,
                                   NULL, NULL),
                     KVP_ERR_DENIED);
    kvp_auth_client_destroy(&a);
    unlink(m1);
    unlink(m1s);
    unlink(cl);
    unlink(cls);
    rmdir(mdir);
    rmdir(dir);
}

static void test_wallet(void **state)
{
    (void)state;
    struct kvp_dt_wallet *w = NULL;
    assert_int_equal(kvp_dt_wallet_new(&w), KVP_OK);
    uint8_t wpk[KVP_DT_PK_BYTES], tok[KVP_DT_TOKEN_MAX], ch[KVP_DT_CHALLENGE_BYTES], resp[KVP_DT_RESPONSE_MAX];
    kvp_dt_wallet_public_key(w, wpk);
    uint64_t now = kvp_clock_wall_ms();
    assert_true(kvp_dt_wallet_needs(w, 1, now, 0));
    /* a token for another ephemeral key is refused; garbage is refused */
    int tl = token(1, 60000, T.epk, T.mpk, T.msk, tok);
    assert_int_equal(kvp_dt_wallet_put(w, tok, (size_t)tl), KVP_ERR_INVALID);
    assert_int_equal(kvp_dt_wallet_put(w, tok, 10), KVP_ERR_INVALID);
    /* segment 1: valid for 60 s; segment 2: expired */
    tl = token(1, 60000, wpk, T.mpk, T.msk, tok);
    assert_int_equal(kvp_dt_wallet_put(w, tok, (size_t)tl), KVP_OK);
    tl = token(2, -1, wpk, T.mpk, T.msk, tok);
    assert_int_equal(kvp_dt_wallet_put(w, tok, (size_t)tl), KVP_OK);
    assert_false(kvp_dt_wallet_needs(w, 1, now, 1000));
    assert_true(kvp_dt_wallet_needs(w, 1, now, 120000)); /* refresh before it expires */
    assert_true(kvp_dt_wallet_needs(w, 2, now, 0));
    kvp_dt_challenge(2, ch);
    assert_int_equal(kvp_dt_wallet_respond(w, ch, now, resp, sizeof resp), KVP_ERR_NOT_FOUND);
    kvp_dt_challenge(3, ch);
    assert_int_equal(kvp_dt_wallet_respond(w, ch, now, resp, sizeof resp), KVP_ERR_NOT_FOUND);
    kvp_dt_challenge(1, ch);
    int rl = kvp_dt_wallet_respond(w, ch, now, resp, sizeof resp);
    assert_true(rl > 0);
    const uint8_t(*pk)[KVP_DT_PK_BYTES] = (const uint8_t(*)[KVP_DT_PK_BYTES])T.mpk;
    assert_int_equal(kvp_dt_verify(ch, resp, (size_t)rl, 1, now, pk, 1, NULL, NULL), KVP_OK);
    /* a fresher token for segment 2 replaces the expired one */
    tl = token(2, 60000, wpk, T.mpk, T.msk, tok);
    assert_int_equal(kvp_dt_wallet_put(w, tok, (size_t)tl), KVP_OK);
    assert_false(kvp_dt_wallet_needs(w, 2, now, 0));
    kvp_dt_wallet_destroy(&w);
    assert_null(w);
}

static int wallet_cb(void *ctx, const uint8_t *challenge, size_t len, uint8_t *out, size_t cap)
{
    if (len != KVP_DT_CHALLENGE_BYTES)
        return KVP_ERR_INVALID;
    return kvp_dt_wallet_respond(ctx, challenge, kvp_clock_wall_ms(), out, cap);
}

/* One xslice (op at remote offset off, 4096 bytes of buf) through a fresh tcp transport whose
 * token callback answers from `w` (NULL: no callback). Returns the completion status. */
static int xport_one(struct kvp_dt_wallet *w, uint8_t op, uint64_t off, uint8_t *buf)
{
    struct kvp_xport_params p = {.conns_per_peer = 1, .slice_bytes = 1u << 20, .connect_timeout_ms = 10000,
                                 .name = "test-xport", .token_respond = w ? wallet_cb : NULL, .token_ctx = w};
    struct kvp_xport *x = NULL;
    assert_int_equal(kvp_xport_tcp.open(&x, &p), KVP_OK);
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
    sin->sin_family = AF_INET;
    sin->sin_port = htons((uint16_t)T.port);
    sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char ep[32];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", T.port);
    struct kvp_xport_peer *peer = NULL;
    assert_int_equal(kvp_xport_tcp.connect(x, ep, &ss, sizeof(struct sockaddr_in), &peer), KVP_OK);
    struct kvp_xport_slice sl = {.id = 1, .op = op, .local = buf, .length = 4096, .segment_id = SEG_ID,
                                 .remote_offset = off};
    assert_int_equal(kvp_xport_tcp.post(x, peer, &sl, 1), KVP_OK);
    int fds[4];
    int nfd = kvp_xport_tcp.fds(x, fds, 4);
    assert_true(nfd >= 1);
    struct kvp_xport_completion comp;
    int got = 0;
    for (int spin = 0; spin < 2000 && got == 0; spin++) { /* 20 s at most, never timed */
        uint64_t next = UINT64_MAX;
        got = kvp_xport_tcp.poll(x, kvp_clock_now_ns(), &comp, 1, &next);
        if (got == 0) {
            struct pollfd pf = {.fd = fds[0], .events = POLLIN};
            (void)poll(&pf, 1, 10);
        }
    }
    assert_int_equal(got, 1);
    assert_int_equal(comp.id, 1);
    kvp_xport_tcp.close(x);
    return comp.status;
}

static void test_transport(void **state)
{
    (void)state;
    struct kvp_dt_wallet *w = NULL, *empty = NULL;
    assert_int_equal(kvp_dt_wallet_new(&w), KVP_OK);
    assert_int_equal(kvp_dt_wallet_new(&empty), KVP_OK);
    uint8_t wpk[KVP_DT_PK_BYTES], tok[KVP_DT_TOKEN_MAX];
    kvp_dt_wallet_public_key(w, wpk);
    int tl = token(SEG_ID, 60000, wpk, T.mpk, T.msk, tok);
    assert_int_equal(kvp_dt_wallet_put(w, tok, (size_t)tl), KVP_OK);
    kvp_dt_wallet_public_key(empty, wpk);
    tl = token(SEG_ID + 1, 60000, wpk, T.mpk, T.msk, tok); /* another segment's only */
    assert_int_equal(kvp_dt_wallet_put(empty, tok, (size_t)tl), KVP_OK);
    uint8_t *buf = malloc(4096);
    assert_non_null(buf);
    struct kvp_seg_server_stats st0, st1;
    kvp_seg_server_stats(T.srv, &st0);
    /* authorised: a READ returns the region's bytes, a WRITE lands */
    assert_int_equal(xport_one(w, KVP_XFER_READ, 8192, buf), KVP_OK);
    for (size_t i = 0; i < 4096; i++)
        assert_int_equal(buf[i], BYTE(8192 + i));
    memset(buf, 0x3c, 4096);
    assert_int_equal(xport_one(w, KVP_XFER_WRITE, 65536, buf), KVP_OK);
    assert_int_equal(T.region[65536], 0x3c);
    assert_int_equal(T.region[65536 + 4095], 0x3c);
    for (size_t i = 0; i < 4096; i++) /* put the region back for the other tests */
        T.region[65536 + i] = BYTE(65536 + i);
    /* no token callback: the segment refuses; a wallet without this segment's token: the client
     * does not even answer */
    assert_int_not_equal(xport_one(NULL, KVP_XFER_READ, 0, buf), KVP_OK);
    assert_int_not_equal(xport_one(empty, KVP_XFER_READ, 0, buf), KVP_OK);
    /* the server counts the refusal on its loop thread, maybe after the client saw the close */
    for (int i = 0; i < 500; i++) {
        kvp_seg_server_stats(T.srv, &st1);
        if (st1.token_refused >= st0.token_refused + 1)
            break;
        usleep(10 * 1000);
    }
    assert_true(st1.token_refused >= st0.token_refused + 1);
    free(buf);
    kvp_dt_wallet_destroy(&w);
    kvp_dt_wallet_destroy(&empty);
}

struct locked_wallet {
    pthread_mutex_t mu; /* the engine's transfer actors call in from their own threads */
    struct kvp_dt_wallet *w;
};

static int locked_cb(void *ctx, const uint8_t *challenge, size_t len, uint8_t *out, size_t cap)
{
    struct locked_wallet *lw = ctx;
    pthread_mutex_lock(&lw->mu);
    int rc = wallet_cb(lw->w, challenge, len, out, cap);
    pthread_mutex_unlock(&lw->mu);
    return rc;
}

static void test_engine(void **state)
{
    (void)state;
    struct locked_wallet lw = {.mu = PTHREAD_MUTEX_INITIALIZER};
    assert_int_equal(kvp_dt_wallet_new(&lw.w), KVP_OK);
    uint8_t wpk[KVP_DT_PK_BYTES], tok[KVP_DT_TOKEN_MAX];
    kvp_dt_wallet_public_key(lw.w, wpk);
    int tl = token(SEG_ID, 60000, wpk, T.mpk, T.msk, tok);
    assert_int_equal(kvp_dt_wallet_put(lw.w, tok, (size_t)tl), KVP_OK);
    char ep[32];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", T.port);
    enum { N = 8, LEN = 4096 };
    uint8_t *buf = malloc(N * LEN);
    assert_non_null(buf);
    for (int with = 1; with >= 0; with--) {
        struct kvp_xfer_params xp = {.conns_per_peer = 2, .slice_bytes = 1u << 20, .connect_timeout_ms = 5000,
                                     .io_threads = 2, .token_respond = with ? locked_cb : NULL,
                                     .token_ctx = with ? &lw : NULL};
        struct kvp_xfer_engine *e = NULL;
        assert_int_equal(kvp_xfer_engine_new(&e, &xp), KVP_OK);
        struct kvp_xfer_slice sl[N];
        memset(buf, 0, N * LEN);
        for (int i = 0; i < N; i++)
            sl[i] = (struct kvp_xfer_slice){.local = buf + i * LEN, .length = LEN, .segment_id = SEG_ID,
                                            .endpoint = ep, .remote_offset = (uint64_t)i * 3 * LEN,
                                            .op = KVP_XFER_READ};
        (void)kvp_xfer_run(e, sl, N, 10000);
        for (int i = 0; i < N; i++) {
            if (with) {
                assert_int_equal(sl[i].status, KVP_OK);
                for (size_t j = 0; j < LEN; j += 511)
                    assert_int_equal(buf[i * LEN + j], BYTE((uint64_t)i * 3 * LEN + j));
            } else {
                assert_int_not_equal(sl[i].status, KVP_OK);
            }
        }
        kvp_xfer_engine_destroy(&e);
    }
    free(buf);
    kvp_dt_wallet_destroy(&lw.w);
}

/* One READ of n pieces of LEN bytes from the token server through e; true when every piece
 * completed with the region's bytes. */
static bool engine_read_all(struct kvp_xfer_engine *e, const char *ep, uint8_t *buf, int n, size_t len)
{
    struct kvp_xfer_slice sl[8];
    assert_true(n <= 8);
    memset(buf, 0, (size_t)n * len);
    for (int i = 0; i < n; i++)
        sl[i] = (struct kvp_xfer_slice){.local = buf + (size_t)i * len, .length = len, .segment_id = SEG_ID,
                                        .endpoint = ep, .remote_offset = (uint64_t)i * 5 * len,
                                        .op = KVP_XFER_READ};
    (void)kvp_xfer_run(e, sl, (size_t)n, 10000);
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        ok = sl[i].status == KVP_OK;
        for (size_t j = 0; ok && j < len; j += 509)
            ok = buf[(size_t)i * len + j] == BYTE((uint64_t)i * 5 * len + j);
    }
    return ok;
}

/*
 * Tokens pushed to the transfer actors (kvp_xfer_params.token_wallet, kvp_xfer_tokens_put, what
 * the client and the mover use): each actor signs from its own copy of the key, filled by
 * message. Without a token, or with one for another key, the segment refuses the connection;
 * after the push the same engine's next run is served. Then the ordering the client relies on
 * (actors/session/dtoken.c): a run started right after the push returns, with no wait, finds the
 * token in whichever of the 4 actors is its home, because the push entered every actor's mailbox
 * before the run did. Each round is a fresh engine, so every connection meets a challenge.
 */
static void test_engine_pushed(void **state)
{
    (void)state;
    struct kvp_dt_wallet *key = NULL;
    assert_int_equal(kvp_dt_wallet_new(&key), KVP_OK);
    uint8_t wpk[KVP_DT_PK_BYTES], tok[KVP_DT_TOKEN_MAX], other[KVP_DT_TOKEN_MAX];
    kvp_dt_wallet_public_key(key, wpk);
    int tl = token(SEG_ID, 60000, wpk, T.mpk, T.msk, tok);
    int ol = token(SEG_ID, 60000, T.epk, T.mpk, T.msk, other); /* issued for another key */
    assert_true(tl > 0 && ol > 0);
    char ep[32];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", T.port);
    enum { ROUNDS = 12, N = 4, LEN = 4096 };
    uint8_t *buf = malloc(N * LEN);
    assert_non_null(buf);
    const uint8_t *tp = tok, *op = other;
    size_t tlen = (size_t)tl, olen = (size_t)ol;
    for (int round = 0; round < ROUNDS; round++) {
        struct kvp_xfer_params xp = {.conns_per_peer = 1, .slice_bytes = 1u << 20, .connect_timeout_ms = 5000,
                                     .io_threads = 4, .token_wallet = key};
        struct kvp_xfer_engine *e = NULL;
        assert_int_equal(kvp_xfer_engine_new(&e, &xp), KVP_OK);
        if (round == 0) {
            assert_false(engine_read_all(e, ep, buf, N, LEN)); /* no token yet: refused */
            assert_int_equal(kvp_xfer_tokens_put(e, &op, &olen, 1), KVP_OK);
            assert_false(engine_read_all(e, ep, buf, N, LEN)); /* not kept: another key's */
        }
        assert_int_equal(kvp_xfer_tokens_put(e, &tp, &tlen, 1), KVP_OK);
        assert_true(engine_read_all(e, ep, buf, N, LEN)); /* at once: no wait for the push */
        kvp_xfer_engine_destroy(&e);
    }
    /* bad arguments */
    struct kvp_xfer_params np = {.io_threads = 1};
    struct kvp_xfer_engine *e = NULL;
    assert_int_equal(kvp_xfer_engine_new(&e, &np), KVP_OK);
    assert_int_equal(kvp_xfer_tokens_put(e, &tp, &tlen, 1), KVP_ERR_INVALID); /* no token_wallet */
    kvp_xfer_engine_destroy(&e);
    np.token_wallet = key;
    assert_int_equal(kvp_xfer_engine_new(&e, &np), KVP_OK);
    assert_int_equal(kvp_xfer_tokens_put(e, &tp, &tlen, 0), KVP_ERR_INVALID);
    size_t big = KVP_DT_TOKEN_MAX + 1;
    assert_int_equal(kvp_xfer_tokens_put(e, &tp, &big, 1), KVP_ERR_INVALID);
    kvp_xfer_engine_destroy(&e);
    free(buf);
    kvp_dt_wallet_destroy(&key);
}

/* The segment server's accept counter reaches n (20 s at most; nothing timed). */
static void wait_accepted(struct kvp_seg_server *srv, uint64_t n)
{
    struct kvp_seg_server_stats st;
    for (int i = 0; i < 2000; i++) {
        kvp_seg_server_stats(srv, &st);
        if (st.conns_accepted >= n)
            return;
        kvp_clock_sleep_ms(10);
    }
    fail_msg("the segment server accepted %lu connections, expected %lu", (unsigned long)st.conns_accepted,
             (unsigned long)n);
}

struct engine_read {
    struct kvp_xfer_engine *e;
    struct kvp_xfer_slice sl;
};

static void *engine_read_run(void *arg)
{
    struct engine_read *r = arg;
    (void)kvp_xfer_run(r->e, &r->sl, 1, 20000);
    return NULL;
}

/* The unmounted server of the two tests below; stopped by their teardown, also after a failed
 * assert (a server left running made the process abort at exit). */
static struct {
    struct kvp_seg_server *srv;
    uint8_t *region;
    struct kvp_xfer_engine *e;
    struct locked_wallet lw;
    int fd;
} U = {.fd = -1};

static int unmounted_setup(void **state)
{
    (void)state;
    U.region = malloc(REGION);
    if (!U.region)
        return -1;
    for (size_t i = 0; i < REGION; i++)
        U.region[i] = BYTE(i);
    return kvp_seg_server_start_auth(&U.srv, "127.0.0.1", 0, U.region, REGION,
                                     (const uint8_t(*)[KVP_DT_PK_BYTES])T.mpk, 1) == KVP_OK
               ? 0
               : -1;
}

static int unmounted_teardown(void **state)
{
    (void)state;
    if (U.fd >= 0)
        close(U.fd);
    U.fd = -1;
    kvp_xfer_engine_destroy(&U.e);
    kvp_dt_wallet_destroy(&U.lw.w);
    kvp_seg_server_stop(&U.srv);
    free(U.region);
    U.region = NULL;
    return 0;
}

/*
 * A connection accepted before the segment has its id (the master committed the mount and placed
 * a replica here; this process has not applied the mount's answer yet): the challenge waits for
 * the id and then names it, so the client's token for that id is accepted. Before the fix the
 * challenge went out at once naming segment 0, and the client's first transfer failed with "no data
 * token for this segment" (a fresh-clone CI run of test_client_cluster_loss, first put after
 * `cluster up`). The order is forced: the id is set only after the server accepted.
 */
static void test_unmounted_raw(void **state)
{
    (void)state;
    U.fd = seg_raw_connect(kvp_seg_server_port(U.srv));
    assert_true(U.fd >= 0);
    guard(U.fd);
    wait_accepted(U.srv, 1);
    kvp_seg_server_set_id(U.srv, SEG_ID);
    uint8_t ch[KVP_DT_CHALLENGE_BYTES], tok[KVP_DT_TOKEN_MAX], resp[KVP_DT_RESPONSE_MAX];
    seg_raw_recv_all(U.fd, ch, sizeof ch);
    assert_memory_equal(ch, "KVPC", 4);
    assert_int_equal(ch[8] | ch[9] << 8 | ch[10] << 16 | (uint32_t)ch[11] << 24, SEG_ID);
    int tl = token(SEG_ID, 60000, T.epk, T.mpk, T.msk, tok);
    int rl = kvp_dt_respond(ch, tok, (size_t)tl, T.esk, resp, sizeof resp);
    assert_true(rl > 0);
    seg_raw_send_all(U.fd, resp, (size_t)rl);
    uint8_t h[KVP_FRAME_HEADER_BYTES], buf[64];
    seg_raw_header(h, KVP_FRAME_READ, SEG_ID, 1, 256, sizeof buf, 0);
    seg_raw_send_all(U.fd, h, sizeof h);
    struct kvp_frame f = seg_raw_response(U.fd);
    assert_int_equal(f.status, KVP_OK);
    seg_raw_recv_all(U.fd, buf, sizeof buf);
    assert_int_equal(buf[0], BYTE(256));
}

/* The same through the transfer engine (the client's path): the READ connects while the segment
 * has no id, the id comes after the accept, the READ is served. */
static void test_unmounted_engine(void **state)
{
    (void)state;
    U.lw = (struct locked_wallet){.mu = PTHREAD_MUTEX_INITIALIZER};
    assert_int_equal(kvp_dt_wallet_new(&U.lw.w), KVP_OK);
    uint8_t wpk[KVP_DT_PK_BYTES], tok[KVP_DT_TOKEN_MAX], buf[64];
    kvp_dt_wallet_public_key(U.lw.w, wpk);
    int tl = token(SEG_ID, 60000, wpk, T.mpk, T.msk, tok);
    assert_int_equal(kvp_dt_wallet_put(U.lw.w, tok, (size_t)tl), KVP_OK);
    char ep[32];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", kvp_seg_server_port(U.srv));
    struct kvp_xfer_params xp = {.conns_per_peer = 1, .slice_bytes = 1u << 20, .connect_timeout_ms = 20000,
                                 .io_threads = 1, .token_respond = locked_cb, .token_ctx = &U.lw};
    assert_int_equal(kvp_xfer_engine_new(&U.e, &xp), KVP_OK);
    struct engine_read r = {.e = U.e, .sl = {.local = buf, .length = sizeof buf, .segment_id = SEG_ID,
                                             .endpoint = ep, .remote_offset = 512, .op = KVP_XFER_READ}};
    memset(buf, 0, sizeof buf);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, engine_read_run, &r), 0);
    struct kvp_seg_server_stats st;
    bool accepted = false;
    for (int i = 0; i < 2000 && !accepted; i++) { /* 20 s at most; nothing timed */
        kvp_seg_server_stats(U.srv, &st);
        accepted = st.conns_accepted >= 1;
        if (!accepted)
            kvp_clock_sleep_ms(10);
    }
    kvp_seg_server_set_id(U.srv, SEG_ID); /* also when not accepted: the thread must end */
    pthread_join(th, NULL);
    assert_true(accepted);
    assert_int_equal(r.sl.status, KVP_OK);
    for (size_t i = 0; i < sizeof buf; i++)
        assert_int_equal(buf[i], BYTE(512 + i));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wallet),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_pure),
        cmocka_unit_test(test_port), /* first to be refused: its log lines are not held back */
        cmocka_unit_test(test_transport),
        cmocka_unit_test(test_engine),
        cmocka_unit_test(test_engine_pushed),
        cmocka_unit_test_setup_teardown(test_unmounted_raw, unmounted_setup, unmounted_teardown),
        cmocka_unit_test_setup_teardown(test_unmounted_engine, unmounted_setup, unmounted_teardown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
