/*
 * bench_runtime.c — kvpool-bench-runtime: message hop latency and throughput between two
 * kvp_rt actors on one host, next to a raw czmq inproc PAIR baseline measured in the same run.
 *
 *   kvpool-bench-runtime [--rounds N] [--msgs M] [--window W]
 *
 * Latency: N ping-pong round trips between two threads (after 1,000 warm-up rounds); one hop
 * is half a round trip; median and p99 in microseconds.
 * Throughput: M one-way 8-byte messages from one thread to the other; the runtime case uses
 * credit-based flow control (the receiver acks every W/4 messages, at most W in flight)
 * because kvp_rt mailboxes are unbounded, the PAIR case the socket's own HWM (1,000).
 * Figures are printed, not asserted: the machine may be shared and noisy.
 */
#include <czmq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool.h"
#include "runtime/actor.h"
#include "runtime/clock.h"

enum { MSG_START = 1, MSG_PING, MSG_PONG, MSG_DONE, MSG_DATA, MSG_ACK, MSG_TSTART };

static uint64_t g_rounds = 50000, g_msgs = 1000000, g_window = 4096;
#define WARMUP 1000

struct result {
    double median_us, p99_us, msgs_per_s;
};

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void hop_stats(uint64_t *rtt_ns, uint64_t n, struct result *r)
{
    qsort(rtt_ns, n, sizeof(*rtt_ns), cmp_u64);
    r->median_us = (double)rtt_ns[n / 2] / 2000.0;
    r->p99_us = (double)rtt_ns[(n * 99) / 100] / 2000.0;
}

/* ------------------------------------------------------------------ raw czmq PAIR baseline */

static void pair_echo(zsock_t *pipe, void *arg)
{
    const char *ep = arg;
    zsock_t *s = zsock_new_pair(ep); /* connects (">" prefix) */
    zsock_signal(pipe, 0);
    void *h = zsock_resolve(s);
    uint64_t v;
    for (;;) {
        if (zmq_recv(h, &v, sizeof(v), 0) != sizeof(v))
            break;
        if (v == UINT64_MAX)
            break;
        zmq_send(h, &v, sizeof(v), 0);
    }
    zsock_destroy(&s);
    char *cmd = zstr_recv(pipe); /* $TERM */
    zstr_free(&cmd);
}

static void pair_sink(zsock_t *pipe, void *arg)
{
    const char *ep = arg;
    zsock_t *s = zsock_new_pair(ep);
    zsock_signal(pipe, 0);
    void *h = zsock_resolve(s);
    uint64_t v, n = 0;
    for (;;) {
        if (zmq_recv(h, &v, sizeof(v), 0) != sizeof(v))
            break;
        if (v == UINT64_MAX)
            break;
        n++;
    }
    zmq_send(h, &n, sizeof(n), 0);
    zsock_destroy(&s);
    char *cmd = zstr_recv(pipe);
    zstr_free(&cmd);
}

static int bench_pair(struct result *r, uint64_t *rtt)
{
    /* latency */
    zsock_t *s = zsock_new_pair("@inproc://kvp-bench-lat");
    zactor_t *echo = zactor_new(pair_echo, ">inproc://kvp-bench-lat");
    void *h = zsock_resolve(s);
    for (uint64_t i = 0; i < WARMUP + g_rounds; i++) {
        uint64_t t0 = kvp_clock_now_ns(), v = i;
        zmq_send(h, &v, sizeof(v), 0);
        if (zmq_recv(h, &v, sizeof(v), 0) != sizeof(v))
            return -1;
        if (i >= WARMUP)
            rtt[i - WARMUP] = kvp_clock_now_ns() - t0;
    }
    uint64_t stop = UINT64_MAX;
    zmq_send(h, &stop, sizeof(stop), 0);
    zactor_destroy(&echo);
    zsock_destroy(&s);
    hop_stats(rtt, g_rounds, r);

    /* throughput */
    s = zsock_new_pair("@inproc://kvp-bench-tput");
    zactor_t *sink = zactor_new(pair_sink, ">inproc://kvp-bench-tput");
    h = zsock_resolve(s);
    uint64_t t0 = kvp_clock_now_ns();
    for (uint64_t i = 0; i < g_msgs; i++)
        zmq_send(h, &i, sizeof(i), 0);
    zmq_send(h, &stop, sizeof(stop), 0);
    uint64_t n = 0;
    if (zmq_recv(h, &n, sizeof(n), 0) != sizeof(n) || n != g_msgs)
        return -1;
    uint64_t dt = kvp_clock_now_ns() - t0;
    r->msgs_per_s = (double)g_msgs * 1e9 / (double)dt;
    zactor_destroy(&sink);
    zsock_destroy(&s);
    return 0;
}

/* ------------------------------------------------------------------ kvp_rt actors */

struct pinger {
    struct kvp_rt_actor *peer, *sink;
    uint64_t *rtt;
    uint64_t i, n, t0;
};

static int on_pinger(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct pinger *p = kvp_rt_state(ctx);
    if (msg->type == MSG_START) {
        p->i = 0;
        p->n = msg->arg;
    } else if (msg->type == MSG_PONG) {
        uint64_t dt = kvp_clock_now_ns() - p->t0;
        if (p->i >= WARMUP)
            p->rtt[p->i - WARMUP] = dt;
        if (++p->i == p->n)
            return kvp_rt_send(p->sink, 0, MSG_DONE, 0, NULL, NULL);
    } else {
        return KVP_OK;
    }
    p->t0 = kvp_clock_now_ns();
    return kvp_rt_send(p->peer, 0, MSG_PING, p->i, NULL, NULL);
}

struct ponger {
    struct kvp_rt_actor *peer; /* pinger, or producer for throughput */
    struct kvp_rt_actor *sink;
    uint64_t got, expect, ack_every;
};

static int on_ponger(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct ponger *p = kvp_rt_state(ctx);
    switch (msg->type) {
    case MSG_PING:
        return kvp_rt_send(p->peer, 0, MSG_PONG, msg->arg, NULL, NULL);
    case MSG_TSTART:
        p->got = 0;
        p->expect = msg->arg;
        return KVP_OK;
    case MSG_DATA:
        p->got++;
        if (p->got == p->expect)
            return kvp_rt_send(p->sink, 0, MSG_DONE, p->got, NULL, NULL);
        if (p->got % p->ack_every == 0)
            return kvp_rt_send(p->peer, 0, MSG_ACK, p->got, NULL, NULL);
        return KVP_OK;
    default:
        return KVP_OK;
    }
}

struct producer {
    struct kvp_rt_actor *peer;
    uint64_t sent, acked, total;
};

static int produce(struct producer *p)
{
    while (p->sent < p->total && p->sent - p->acked < g_window) {
        int rc = kvp_rt_send(p->peer, 0, MSG_DATA, p->sent, NULL, NULL);
        if (rc)
            return rc;
        p->sent++;
    }
    return KVP_OK;
}

static int on_producer(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct producer *p = kvp_rt_state(ctx);
    if (msg->type == MSG_START) {
        p->sent = p->acked = 0;
        p->total = msg->arg;
    } else if (msg->type == MSG_ACK) {
        if (msg->arg > p->acked)
            p->acked = msg->arg;
    }
    return produce(p);
}

static int bench_rt(struct result *r, uint64_t *rtt)
{
    struct kvp_rt_actor *sink = NULL, *ping = NULL, *pong = NULL, *prod = NULL;
    struct pinger pi = {.rtt = rtt};
    struct ponger po = {.ack_every = g_window / 4 ? g_window / 4 : 1};
    struct producer pr = {0};
    struct kvp_rt_spec s1 = {.name = "pinger", .handle = on_pinger, .state = &pi};
    struct kvp_rt_spec s2 = {.name = "ponger", .handle = on_ponger, .state = &po};
    struct kvp_rt_spec s3 = {.name = "producer", .handle = on_producer, .state = &pr};
    if (kvp_rt_sink_new(&sink, "bench") || kvp_rt_spawn(&ping, &s1, NULL) ||
        kvp_rt_spawn(&pong, &s2, NULL) || kvp_rt_spawn(&prod, &s3, NULL))
        return -1;
    /* Peers are set before any message flows; the spawn handshake and the mailbox mutex
     * order these writes before the handlers read them. */
    pi.peer = pong;
    pi.sink = sink;
    po.peer = ping;
    po.sink = sink;
    pr.peer = pong;
    struct kvp_rt_msg *m = NULL;
    int rc = kvp_rt_send(ping, 0, MSG_START, WARMUP + g_rounds, NULL, NULL);
    if (rc || kvp_rt_recv(sink, UINT32_MAX, &m))
        return -1;
    kvp_rt_msg_destroy(&m);
    hop_stats(rtt, g_rounds, r);

    /* The ponger now acks to the producer. Its state changes only through its own mailbox
     * order: TSTART is handled before any DATA. */
    kvp_rt_destroy(&ping);
    po.peer = prod;
    if (kvp_rt_send(pong, 0, MSG_TSTART, g_msgs, NULL, NULL))
        return -1;
    uint64_t t0 = kvp_clock_now_ns();
    if (kvp_rt_send(prod, 0, MSG_START, g_msgs, NULL, NULL) || kvp_rt_recv(sink, UINT32_MAX, &m))
        return -1;
    uint64_t dt = kvp_clock_now_ns() - t0;
    if (m->arg != g_msgs)
        return -1;
    kvp_rt_msg_destroy(&m);
    r->msgs_per_s = (double)g_msgs * 1e9 / (double)dt;
    kvp_rt_destroy(&prod);
    kvp_rt_destroy(&pong);
    kvp_rt_destroy(&sink);
    return 0;
}

static void usage(const char *argv0)
{
    fprintf(stderr, "usage: %s [--rounds N] [--msgs M] [--window W]\n", argv0);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--rounds") == 0)
            g_rounds = strtoull(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--msgs") == 0)
            g_msgs = strtoull(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--window") == 0)
            g_window = strtoull(argv[++i], NULL, 10);
        else {
            usage(argv[0]);
            return 2;
        }
    }
    if (g_rounds < 100 || g_msgs < 1 || g_window < 4) {
        fprintf(stderr, "kvpool-bench-runtime: --rounds >= 100, --msgs >= 1, --window >= 4\n");
        return 2;
    }
    zsys_init();
    zsys_handler_set(NULL);
    uint64_t *rtt = malloc(g_rounds * sizeof(*rtt));
    if (!rtt)
        return 1;
    struct result raw = {0}, rt = {0};
    if (bench_pair(&raw, rtt) != 0) {
        fprintf(stderr, "kvpool-bench-runtime: czmq baseline failed\n");
        return 1;
    }
    if (bench_rt(&rt, rtt) != 0) {
        fprintf(stderr, "kvpool-bench-runtime: kvp_rt run failed\n");
        return 1;
    }
    free(rtt);
    printf("kvpool-bench-runtime: %llu round trips (hop = RTT/2), %llu one-way messages\n",
           (unsigned long long)g_rounds, (unsigned long long)g_msgs);
    printf("%-26s %14s %12s %16s\n", "case", "hop median us", "hop p99 us", "msgs/s");
    printf("%-26s %14.2f %12.2f %16.0f\n", "czmq inproc PAIR (raw)", raw.median_us, raw.p99_us,
           raw.msgs_per_s);
    printf("%-26s %14.2f %12.2f %16.0f\n", "kvp_rt actor -> actor", rt.median_us, rt.p99_us,
           rt.msgs_per_s);
    printf("%-26s %14.2f %12.2f %16.2f\n", "ratio kvp_rt / czmq", rt.median_us / raw.median_us,
           rt.p99_us / raw.p99_us, rt.msgs_per_s / raw.msgs_per_s);
    return 0;
}
