/*
 * bench_msession.c — kvpool-bench-msession: calls per second through the master session
 * (kvp_msession_call) with N caller threads against an in-process answering master (one ZeroMQ
 * ROUTER thread that answers every request at once with an empty OK Response), and the CPU
 * time of the whole process per call (getrusage; the master thread's share included).
 *
 *   kvpool-bench-msession CALLERS SECONDS
 *   -> one line: "callers=N calls=C failed=F secs=S calls_per_s=R cpu_us_per_call=U max_call_ms=M"
 *
 * Only the session's public calls are declared here (not its header), so this one file also
 * builds against older trees whose session lived elsewhere (scripts/bench_msession.sh builds it
 * against a base tree and runs both binaries in alternating pairs).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <zmq.h>

#include "wire/envelope.h"
#include "wire/kvpool.pb-c.h"

struct kvp_msession;
int kvp_msession_new(struct kvp_msession **out, const char *const *masters, size_t n, const char *name);
int kvp_msession_call(struct kvp_msession *s, Kvp__Request *req, uint32_t timeout_ms, Kvp__Response **out);
void kvp_msession_response_free(Kvp__Response *resp);
void kvp_msession_destroy(struct kvp_msession **s);

static atomic_bool stop_master, stop_callers;
static atomic_ullong calls_done, calls_failed, max_call_us;
static struct kvp_msession *session;

struct master {
    void *ctx, *router;
    int port;
};

static void *master_main(void *arg)
{
    struct master *m = arg;
    zmq_pollitem_t it = {.socket = m->router, .events = ZMQ_POLLIN};
    while (!atomic_load(&stop_master)) {
        if (zmq_poll(&it, 1, 100) <= 0)
            continue;
        for (;;) {
            zmq_msg_t id, body;
            zmq_msg_init(&id);
            zmq_msg_init(&body);
            if (zmq_msg_recv(&id, m->router, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&id);
                zmq_msg_close(&body);
                break;
            }
            if (zmq_msg_recv(&body, m->router, 0) < 0) {
                zmq_msg_close(&id);
                zmq_msg_close(&body);
                break;
            }
            Kvp__Request *req = NULL;
            if (kvp_wire_decode_request(zmq_msg_data(&body), zmq_msg_size(&body), &req) == 0) {
                Kvp__Response resp = KVP__RESPONSE__INIT;
                resp.req_id = req->req_id;
                resp.status = 0;
                uint8_t *buf = NULL;
                size_t len = 0;
                if (kvp_wire_encode_response(&resp, &buf, &len) == 0) {
                    zmq_msg_send(&id, m->router, ZMQ_SNDMORE);
                    zmq_send(m->router, buf, len, 0);
                    free(buf);
                }
                kvp__request__free_unpacked(req, NULL);
            }
            zmq_msg_close(&id);
            zmq_msg_close(&body);
        }
    }
    return NULL;
}

static void *caller_main(void *arg)
{
    (void)arg;
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__MembersReq mr = KVP__MEMBERS_REQ__INIT;
    req.body_case = KVP__REQUEST__BODY_MEMBERS;
    req.members = &mr;
    unsigned long long worst = 0;
    while (!atomic_load_explicit(&stop_callers, memory_order_relaxed)) {
        Kvp__Response *resp = NULL;
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int rc = kvp_msession_call(session, &req, 5000, &resp);
        clock_gettime(CLOCK_MONOTONIC, &b);
        unsigned long long us = (unsigned long long)((b.tv_sec - a.tv_sec) * 1000000 + (b.tv_nsec - a.tv_nsec) / 1000);
        if (us > worst)
            worst = us;
        if (rc == 0) {
            atomic_fetch_add_explicit(&calls_done, 1, memory_order_relaxed);
            kvp_msession_response_free(resp);
        } else {
            atomic_fetch_add_explicit(&calls_failed, 1, memory_order_relaxed);
        }
    }
    unsigned long long cur = atomic_load(&max_call_us);
    while (worst > cur && !atomic_compare_exchange_weak(&max_call_us, &cur, worst))
        ;
    return NULL;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s CALLERS SECONDS\n", argv[0]);
        return 2;
    }
    int callers = atoi(argv[1]);
    double secs = atof(argv[2]);
    if (callers < 1 || callers > 1024 || secs <= 0) {
        fprintf(stderr, "CALLERS must be 1..1024 and SECONDS > 0\n");
        return 2;
    }
    struct master m = {0};
    m.ctx = zmq_ctx_new();
    m.router = zmq_socket(m.ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(m.router, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(m.router, "tcp://127.0.0.1:*") != 0) {
        fprintf(stderr, "bind: %s\n", zmq_strerror(zmq_errno()));
        return 1;
    }
    char ep[128];
    size_t epl = sizeof ep;
    zmq_getsockopt(m.router, ZMQ_LAST_ENDPOINT, ep, &epl);
    const char *hostport = strstr(ep, "://") ? strstr(ep, "://") + 3 : ep;
    pthread_t mt;
    pthread_create(&mt, NULL, master_main, &m);

    const char *masters[1] = {hostport};
    if (kvp_msession_new(&session, masters, 1, "bench") != 0) {
        fprintf(stderr, "kvp_msession_new failed\n");
        return 1;
    }
    /* Warm up: connect and learn the leader outside the measurement. */
    {
        Kvp__Request req = KVP__REQUEST__INIT;
        Kvp__MembersReq mr = KVP__MEMBERS_REQ__INIT;
        req.body_case = KVP__REQUEST__BODY_MEMBERS;
        req.members = &mr;
        for (int i = 0; i < 200; i++) {
            Kvp__Response *resp = NULL;
            if (kvp_msession_call(session, &req, 5000, &resp) == 0)
                kvp_msession_response_free(resp);
        }
    }
    pthread_t *th = calloc((size_t)callers, sizeof *th);
    double t0 = now_s(), c0 = cpu_s();
    for (int i = 0; i < callers; i++)
        pthread_create(&th[i], NULL, caller_main, NULL);
    struct timespec d = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
    nanosleep(&d, NULL);
    atomic_store(&stop_callers, true);
    for (int i = 0; i < callers; i++)
        pthread_join(th[i], NULL);
    double el = now_s() - t0, cpu = cpu_s() - c0;
    unsigned long long n = atomic_load(&calls_done);
    printf("callers=%d calls=%llu failed=%llu secs=%.3f calls_per_s=%.0f cpu_us_per_call=%.2f max_call_ms=%.1f\n",
           callers, n, (unsigned long long)atomic_load(&calls_failed), el, (double)n / el,
           n ? cpu * 1e6 / (double)n : 0.0, (double)atomic_load(&max_call_us) / 1000.0);
    kvp_msession_destroy(&session);
    atomic_store(&stop_master, true);
    pthread_join(mt, NULL);
    zmq_close(m.router);
    zmq_ctx_term(m.ctx);
    free(th);
    return n ? 0 : 1;
}
