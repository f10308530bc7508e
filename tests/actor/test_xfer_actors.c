/*
 * test_xfer_actors.c — the transfer engine as actors (issue 19): a call returns only after its
 * batch actor's fini ran (contract C2), a stop (what kvp_client_close does) returns only after
 * the batches in flight were fenced and finished, and one batch spanning two transfer actors (the
 * local one and a tcp one), one of which times out, returns only after both reported.
 *
 * The batch actors' fini hook (kvp_xfer_params.on_batch_fini) records, on the batch actor's
 * host thread, which call finished, on which thread, and the status of each of its slices at that
 * moment; it sleeps a little first, so an engine that answered before its fini would be seen
 * returning early.
 *
 * Each test runs twice: with the batch actors hosted by the tcp transfer actors (an engine
 * without a batch host: a segment's mover), and hosted by a batch host actor as the client
 * actor hosts them (kvp_xfer_params.batch_host, xfer_host.c): there the fini must run on the
 * host's thread, and the batch reaches the transfer actors by message only.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/transfer/transfer.h"
#include "kvpool.h"
#include "runtime/actor.h"

/* ---- what the fini hook saw */

#define MAX_SEEN 64
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static const struct kvp_xfer_slice *g_seen[MAX_SEEN];
static int g_seen_status[MAX_SEEN][2];
static pthread_t g_seen_thread[MAX_SEEN];
static int g_n_seen;

static void on_fini(const struct kvp_xfer_slice *s, size_t n, void *arg)
{
    (void)arg;
    usleep(20000); /* an engine answering before this returns would let the caller see no record */
    pthread_mutex_lock(&g_mu);
    if (g_n_seen < MAX_SEEN) {
        g_seen[g_n_seen] = s;
        g_seen_thread[g_n_seen] = pthread_self();
        for (size_t i = 0; i < n && i < 2; i++)
            g_seen_status[g_n_seen][i] = s[i].status;
        g_n_seen++;
    }
    pthread_mutex_unlock(&g_mu);
}

/* Index of the record for call `s`, or -1. */
static int seen(const struct kvp_xfer_slice *s)
{
    pthread_mutex_lock(&g_mu);
    int r = -1;
    for (int i = 0; i < g_n_seen; i++)
        if (g_seen[i] == s)
            r = i;
    pthread_mutex_unlock(&g_mu);
    return r;
}

static void seen_reset(void)
{
    pthread_mutex_lock(&g_mu);
    g_n_seen = 0;
    pthread_mutex_unlock(&g_mu);
}

/* ---- a peer that accepts connections and never answers */

struct mute {
    int lfd;
    char ep[64];
    pthread_t th;
    atomic_bool stop;
    atomic_size_t got; /* bytes received (a request reached the peer) */
};

static void *mute_main(void *arg)
{
    struct mute *m = arg;
    int fds[16];
    int n = 0;
    while (!atomic_load(&m->stop)) {
        struct pollfd pf[17];
        pf[0] = (struct pollfd){.fd = m->lfd, .events = POLLIN};
        for (int i = 0; i < n; i++)
            pf[i + 1] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        if (poll(pf, (nfds_t)n + 1, 20) <= 0)
            continue;
        if ((pf[0].revents & POLLIN) && n < 16) {
            int fd = accept(m->lfd, NULL, NULL);
            if (fd >= 0)
                fds[n++] = fd;
        }
        for (int i = 0; i < n; i++)
            if (pf[i + 1].revents & POLLIN) {
                char junk[4096];
                ssize_t r = recv(fds[i], junk, sizeof junk, MSG_DONTWAIT);
                if (r > 0)
                    atomic_fetch_add(&m->got, (size_t)r);
            }
    }
    for (int i = 0; i < n; i++)
        close(fds[i]);
    return NULL;
}

static void mute_start(struct mute *m)
{
    memset(m, 0, sizeof *m);
    m->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    assert_int_equal(bind(m->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(m->lfd, 16), 0);
    assert_int_equal(getsockname(m->lfd, (struct sockaddr *)&a, &al), 0);
    snprintf(m->ep, sizeof m->ep, "127.0.0.1:%u", ntohs(a.sin_port));
    pthread_create(&m->th, NULL, mute_main, m);
}

static void mute_stop(struct mute *m)
{
    atomic_store(&m->stop, true);
    pthread_join(m->th, NULL);
    close(m->lfd);
}

/* ---- a batch host, as the client actor is one: its handler passes the engine's messages on */

struct host {
    struct kvp_xfer_host *xh;
    pthread_t thread; /* the host's thread (set by its init) */
};

static int host_init(struct kvp_rt_ctx *ctx)
{
    struct host *h = kvp_rt_state(ctx);
    h->thread = pthread_self();
    return KVP_OK;
}

static int host_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m)
{
    struct host *h = kvp_rt_state(ctx);
    if (m->type >= KVP_XFER_HOST_MSG_FIRST && m->type <= KVP_XFER_HOST_MSG_LAST)
        return kvp_xfer_host_handle(ctx, &h->xh, m);
    return KVP_OK;
}

static void host_fini(struct kvp_rt_ctx *ctx)
{
    struct host *h = kvp_rt_state(ctx);
    kvp_xfer_host_free(&h->xh);
}

/* The test's mode (cmocka state): hosted by a batch host actor or by the tcp actors. */
struct mode {
    bool hosted;
    struct host h;
    struct kvp_rt_actor *actor;
};

static struct mode g_tcp_hosted = {.hosted = false};
static struct mode g_host_hosted = {.hosted = true};

static struct kvp_xfer_engine *engine(struct mode *md, unsigned io_threads)
{
    struct kvp_xfer_params p = {.conns_per_peer = 1, .io_threads = io_threads, .fence_bound_ms = 500,
                                .on_batch_fini = on_fini};
    if (md->hosted) {
        memset(&md->h, 0, sizeof md->h);
        struct kvp_rt_spec spec = {.name = "test-host", .init = host_init, .handle = host_handle,
                                   .fini = host_fini, .state = &md->h};
        assert_int_equal(kvp_rt_spawn(&md->actor, &spec, NULL), KVP_OK);
        p.batch_host = md->actor;
    }
    struct kvp_xfer_engine *e = NULL;
    assert_int_equal(kvp_xfer_engine_new(&e, &p), KVP_OK);
    return e;
}

/* Destroy the engine, then the host (the order transfer.h asks: the client does the same). */
static void engine_destroy(struct mode *md, struct kvp_xfer_engine **e)
{
    kvp_xfer_engine_destroy(e);
    if (md->hosted)
        kvp_rt_destroy(&md->actor);
}

/* Record k was made on the batch actor's host: the host actor's thread when there is one. */
static void assert_host_thread(struct mode *md, int k)
{
    if (md->hosted)
        assert_true(pthread_equal(g_seen_thread[k], md->h.thread));
    else
        assert_false(pthread_equal(g_seen_thread[k], pthread_self()));
}

/* C2: a call returns only after its batch actor's fini ran — completed, failed and timed-out
 * calls alike. */
static void test_xfer_call_returns_after_batch_fini(void **state)
{
    struct mode *md = *state;
    seen_reset();
    struct kvp_xfer_engine *e = engine(md, 2);
    static uint8_t region[1 << 16];
    memset(region, 0x5a, sizeof region);
    assert_int_equal(kvp_xfer_register_local(e, 9, region, sizeof region), KVP_OK);
    struct mute m;
    mute_start(&m);
    for (int round = 0; round < 6; round++) {
        uint8_t buf[4096];
        struct kvp_xfer_slice s[2];
        int want;
        if (round % 3 == 0) { /* completes: local */
            s[0] = (struct kvp_xfer_slice){.local = buf, .length = sizeof buf, .segment_id = 9,
                                           .remote_offset = 0, .op = KVP_XFER_READ};
            want = KVP_OK;
        } else if (round % 3 == 1) { /* fails: an endpoint that does not parse */
            s[0] = (struct kvp_xfer_slice){.local = buf, .length = sizeof buf, .segment_id = 3,
                                           .endpoint = "no-port", .op = KVP_XFER_READ};
            want = KVP_ERR_INVALID;
        } else { /* times out: a peer that never answers */
            s[0] = (struct kvp_xfer_slice){.local = buf, .length = sizeof buf, .segment_id = 3,
                                           .endpoint = m.ep, .op = KVP_XFER_READ};
            want = KVP_ERR_TIMEOUT;
        }
        assert_int_equal(kvp_xfer_run(e, s, 1, 100), want);
        int k = seen(s); /* recorded by the fini hook before the call returned */
        assert_true(k >= 0);
        assert_int_equal(g_seen_status[k][0], want);
        assert_host_thread(md, k);
        seen_reset();
    }
    mute_stop(&m);
    engine_destroy(md, &e);
}

struct run_arg {
    struct kvp_xfer_engine *e;
    struct kvp_xfer_slice s;
    uint8_t buf[4096];
    int rc;
    atomic_bool returned;
};

static void *run_main(void *arg)
{
    struct run_arg *r = arg;
    r->rc = kvp_xfer_run(r->e, &r->s, 1, 0); /* no timeout: only the stop ends it */
    atomic_store(&r->returned, true);
    return NULL;
}

/* A batch actor still waiting for slices when the engine stops (kvp_client_close does that):
 * the stop returns only after the batch was fenced and its actor finished; the call gets
 * KVP_ERR_CLOSED. */
static void test_xfer_stop_waits_for_fence(void **state)
{
    struct mode *md = *state;
    seen_reset();
    struct kvp_xfer_engine *e = engine(md, 1);
    struct mute m;
    mute_start(&m);
    struct run_arg r = {.e = e};
    r.s = (struct kvp_xfer_slice){.local = r.buf, .length = sizeof r.buf, .segment_id = 3,
                                  .endpoint = m.ep, .op = KVP_XFER_WRITE};
    pthread_t th;
    pthread_create(&th, NULL, run_main, &r);
    /* the call is in flight once its WRITE reached the mute peer (10 s at most), and sits
     * unanswered there */
    for (int i = 0; i < 10000 && atomic_load(&m.got) == 0; i++)
        usleep(1000);
    assert_true(atomic_load(&m.got) > 0);
    assert_false(atomic_load(&r.returned));
    assert_int_equal(seen(&r.s), -1);
    kvp_xfer_engine_stop(e);
    int k = seen(&r.s); /* the batch actor's fini ran before the stop returned */
    assert_true(k >= 0);
    assert_int_equal(g_seen_status[k][0], KVP_ERR_CLOSED);
    assert_host_thread(md, k);
    pthread_join(th, NULL);
    assert_int_equal(r.rc, KVP_ERR_CLOSED);
    assert_int_equal(r.s.status, KVP_ERR_CLOSED);
    /* a stopped engine refuses new calls */
    assert_int_equal(kvp_xfer_run(e, &r.s, 1, 100), KVP_ERR_CLOSED);
    engine_destroy(md, &e);
    mute_stop(&m);
}

/* One batch on two transfer actors: a local slice (xfer-local, completes at once) and a remote one
 * (a tcp actor, its peer never answers, so it times out). The call returns only after both
 * reported: at its batch actor's fini both slices already had their terminal status. */
static void test_xfer_batch_spanning_two_actors_one_times_out(void **state)
{
    struct mode *md = *state;
    seen_reset();
    struct kvp_xfer_engine *e = engine(md, 2);
    static uint8_t region[1 << 16];
    for (size_t i = 0; i < sizeof region; i++)
        region[i] = (uint8_t)i;
    assert_int_equal(kvp_xfer_register_local(e, 9, region, sizeof region), KVP_OK);
    struct mute m;
    mute_start(&m);
    uint8_t a[8192], b[4096];
    memset(a, 0, sizeof a);
    struct kvp_xfer_slice s[2] = {
        {.local = a, .length = sizeof a, .segment_id = 9, .remote_offset = 256, .op = KVP_XFER_READ},
        {.local = b, .length = sizeof b, .segment_id = 3, .endpoint = m.ep, .op = KVP_XFER_READ},
    };
    assert_int_equal(kvp_xfer_run(e, s, 2, 150), KVP_ERR_TIMEOUT);
    assert_int_equal(s[0].status, KVP_OK);
    assert_int_equal(s[1].status, KVP_ERR_TIMEOUT);
    assert_memory_equal(a, region + 256, sizeof a);
    int k = seen(s);
    assert_true(k >= 0);
    assert_int_equal(g_seen_status[k][0], KVP_OK);
    assert_int_equal(g_seen_status[k][1], KVP_ERR_TIMEOUT);
    assert_host_thread(md, k);
    struct kvp_xfer_stats st;
    kvp_xfer_stats(e, &st);
    assert_int_equal(st.timeouts, 1);
    assert_true(st.fenced >= 1);
    assert_int_equal(st.batches, 1);
    assert_int_equal(kvp_xfer_unregister_local(e, 9), KVP_OK);
    mute_stop(&m);
    engine_destroy(md, &e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_xfer_call_returns_after_batch_fini, &g_tcp_hosted),
        cmocka_unit_test_prestate(test_xfer_stop_waits_for_fence, &g_tcp_hosted),
        cmocka_unit_test_prestate(test_xfer_batch_spanning_two_actors_one_times_out, &g_tcp_hosted),
        cmocka_unit_test_prestate(test_xfer_call_returns_after_batch_fini, &g_host_hosted),
        cmocka_unit_test_prestate(test_xfer_stop_waits_for_fence, &g_host_hosted),
        cmocka_unit_test_prestate(test_xfer_batch_spanning_two_actors_one_times_out, &g_host_hosted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
