/*
 * msession.c — a session with the master quorum (see msession.h and msession_internal.h).
 *
 * Threading: callers enqueue a call and sleep on its condvar; the I/O thread does every
 * socket operation. Leader discovery (docs/internals.md "Leadership"): send to the last known
 * leader; NOT_LEADER with a hint → the hinted master (added when unknown); NOT_LEADER without
 * a hint → the next master after a short pause; no reply within the per-attempt timeout
 * (300 ms, doubling to 2 s, never past the call's deadline) → the next master. At the call's
 * deadline: KVP_ERR_UNAVAILABLE.
 *
 * Fail fast (when enabled, as the client library does): after a call waited its whole timeout
 * and no leader answered meanwhile nor within KVP_MS_FAILOVER_MS before, the breaker opens:
 * calls fail at once with KVP_ERR_UNAVAILABLE while the I/O thread probes one master every
 * 200 ms; a reply that shows a leader closes it. A failover in progress (a leader known within
 * KVP_MS_FAILOVER_MS) never opens it; a lost quorum does, although the surviving followers
 * keep answering "not leader".
 */
#include "actors/session/msession_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include "include/kvpool.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "wire/envelope.h"

#define DEFAULT_CALL_TIMEOUT_MS 5000u

/* "tcp://host:port" → "host:port"; anything else unchanged. */
static const char *strip_scheme(const char *a)
{
    return strncmp(a, "tcp://", 6) == 0 ? a + 6 : a;
}

static int open_socket(struct kvp_msession *s, size_t i)
{
    void *z = zmq_socket(s->zctx, ZMQ_DEALER);
    if (!z)
        return KVP_ERR_IO;
    int zero = 0, one = 1, ivl = 100, ivl_max = 1000;
    zmq_setsockopt(z, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(z, ZMQ_IMMEDIATE, &one, sizeof one); /* never queue to a master that is not connected */
    zmq_setsockopt(z, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(z, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max);
    char ep[300];
    snprintf(ep, sizeof ep, "tcp://%s", s->masters[i]);
    if (zmq_connect(z, ep) != 0) {
        kvp_log_warn(s->name, "master %s: connect: %s", s->masters[i], zmq_strerror(errno));
        zmq_close(z);
        return KVP_ERR_INVALID;
    }
    s->socks[i] = z;
    return KVP_OK;
}

/* Under mu. Complete a call and wake its caller. */
static void complete(struct kvp_msession *s, struct kvp_ms_call *c, int status, Kvp__Response *resp)
{
    struct kvp_ms_call **pp = &s->calls;
    while (*pp && *pp != c)
        pp = &(*pp)->next;
    if (*pp)
        *pp = c->next;
    c->next = NULL;
    c->done = true;
    c->status = status;
    c->resp = resp;
    pthread_cond_signal(&c->cv);
}

/* Under mu. Send the next attempt of c to master c->target (chosen by the caller of this). */
static void send_attempt(struct kvp_msession *s, struct kvp_ms_call *c, uint64_t now)
{
    uint64_t remaining = c->deadline_ms > now ? c->deadline_ms - now : 0;
    c->attempt++;
    c->req->req_id = (c->seq << 8) | (c->attempt & 0xffu);
    c->req->timeout_ms = (uint32_t)remaining;
    uint32_t wait = c->attempt_ms;
    if (wait > remaining)
        wait = (uint32_t)remaining;
    c->next_action_ms = now + wait;
    c->sent = true;

    void *z = s->socks[c->target];
    s->sent_ms[c->target] = now ? now : 1;
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = kvp_wire_encode_request(c->req, &buf, &len);
    if (rc != KVP_OK) {
        /* C6: say why (a batch whose keys add up to more than the 64 MiB message limit) */
        kvp_log_warn(s->name, "request (body %d) not sent: cannot encode it: %s%s", (int)c->req->body_case,
                     kvp_errname(rc), rc == KVP_ERR_TOO_LARGE ? " (over the message limit: fewer or shorter keys)" : "");
        complete(s, c, rc, NULL);
        return;
    }
    if (!z || zmq_send(z, buf, len, ZMQ_DONTWAIT) < 0) {
        /* Not connected (ZMQ_IMMEDIATE) or queue full: retry this master a few times (a fresh
         * connection takes a moment), then move on to the next one. */
        c->next_action_ms = now + 10;
        if (c->next_action_ms > c->deadline_ms)
            c->next_action_ms = c->deadline_ms;
        if (++c->unsent >= 10) { /* 100 ms */
            c->unsent = 0;
            c->target = (c->target + 1) % (int)s->n_masters;
        }
        c->attempt--; /* nothing went out */
        c->sent = false;
    } else {
        c->unsent = 0;
    }
    free(buf);
}

/* Under mu. Breaker open: send one Members request (answered by any master, leader or not) to
 * the next master. A send refused (not connected) just moves on at the next probe time. */
static void send_probe(struct kvp_msession *s, uint64_t now)
{
    s->probe_next_ms = now + KVP_MS_PROBE_MS;
    int i = s->probe_target % (int)s->n_masters;
    s->probe_target = (i + 1) % (int)s->n_masters;
    Kvp__Request req = KVP__REQUEST__INIT;
    Kvp__MembersReq mr = KVP__MEMBERS_REQ__INIT;
    req.body_case = KVP__REQUEST__BODY_MEMBERS;
    req.members = &mr;
    req.req_id = ((uint64_t)KVP_MS_PROBE_SEQ << 8) | (++s->probe_attempt & 0xffu);
    req.timeout_ms = KVP_MS_PROBE_MS;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (kvp_wire_encode_request(&req, &buf, &len) != KVP_OK)
        return;
    if (s->socks[i] && zmq_send(s->socks[i], buf, len, ZMQ_DONTWAIT) >= 0)
        s->sent_ms[i] = now ? now : 1;
    free(buf);
}

/* Under mu. Index of master `addr`, adding it when unknown and there is room; -1 otherwise. */
static int find_or_add_master(struct kvp_msession *s, const char *addr)
{
    addr = strip_scheme(addr);
    if (!*addr)
        return -1;
    for (size_t i = 0; i < s->n_masters; i++)
        if (strcmp(s->masters[i], addr) == 0)
            return (int)i;
    if (s->n_masters >= KVP_MS_MAX_MASTERS)
        return -1;
    size_t i = s->n_masters;
    s->masters[i] = strdup(addr);
    if (!s->masters[i])
        return -1;
    if (open_socket(s, i) != KVP_OK) {
        free(s->masters[i]);
        s->masters[i] = NULL;
        return -1;
    }
    s->n_masters++;
    kvp_log_info(s->name, "master %s added from a leader hint", addr);
    return (int)i;
}

/* Under mu. A reply from master `from`. */
static void on_reply(struct kvp_msession *s, int from, Kvp__Response *resp, uint64_t now)
{
    uint64_t seq = resp->req_id >> 8;
    uint32_t attempt = (uint32_t)(resp->req_id & 0xffu);
    s->last_heard_ms = now ? now : 1;
    /* A leader exists: an answer that is not "not leader", a hint, or a probe's Members reply
     * naming one (any master answers Members; a follower without a leader names none). */
    bool leader_shown = resp->status == KVP_ERR_NOT_LEADER ? resp->leader_hint && resp->leader_hint[0]
                        : seq == KVP_MS_PROBE_SEQ && resp->body_case == KVP__RESPONSE__BODY_MEMBERS
                            ? resp->status == KVP_OK && resp->members && resp->members->leader_id != 0
                            : true;
    if (leader_shown)
        s->last_leader_ms = s->last_heard_ms;
    if (s->breaker_open && leader_shown) {
        s->breaker_open = false;
        kvp_log_info(s->name, "master %s answered: calls go through again (they failed at once for %llu ms: %llu calls)",
                     s->masters[from], (unsigned long long)(now - s->breaker_opened_ms),
                     (unsigned long long)s->fast_failed_open);
    }
    if (seq == KVP_MS_PROBE_SEQ) {
        kvp__response__free_unpacked(resp, NULL);
        return;
    }
    struct kvp_ms_call *c = s->calls;
    while (c && c->seq != seq)
        c = c->next;
    if (!c) {
        kvp_log_debug(s->name, "reply req_id %llu: no such call, dropped", (unsigned long long)resp->req_id);
        kvp__response__free_unpacked(resp, NULL);
        return;
    }
    if (resp->status == KVP_ERR_NOT_LEADER) {
        bool current = (attempt == (c->attempt & 0xffu)) && from == c->target;
        if (s->leader == from)
            s->leader = -1;
        int hint = resp->leader_hint ? find_or_add_master(s, resp->leader_hint) : -1;
        kvp_log_debug(s->name, "master %s: not leader (hint \"%s\")", s->masters[from],
                      resp->leader_hint ? resp->leader_hint : "");
        kvp__response__free_unpacked(resp, NULL);
        if (!current)
            return; /* a stale attempt: the current one is still outstanding */
        if (hint >= 0 && hint != from) {
            c->target = hint;
            s->leader = hint;
            c->next_action_ms = now;
        } else {
            c->target = (from + 1) % (int)s->n_masters;
            c->next_action_ms = now + KVP_MS_NOHINT_BACKOFF_MS;
        }
        if (c->next_action_ms > c->deadline_ms)
            c->next_action_ms = c->deadline_ms;
        c->sent = false;
        return;
    }
    if (s->leader != from)
        kvp_log_info(s->name, "leader is %s", s->masters[from]);
    s->leader = from;
    complete(s, c, KVP_OK, resp);
}

/* Under mu. Start, resend or expire calls; returns the poll timeout in ms. */
static long drive(struct kvp_msession *s, uint64_t now)
{
    long timeout = 1000;
    struct kvp_ms_call *c = s->calls, *next;
    for (; c; c = next) {
        next = c->next;
        if (now >= c->deadline_ms) {
            kvp_log_debug(s->name, "call %llu: no leader answered in time", (unsigned long long)c->seq);
            bool no_leader = s->last_leader_ms < c->start_ms && now - s->last_leader_ms > KVP_MS_FAILOVER_MS;
            if (s->fail_fast && !s->breaker_open && (s->last_heard_ms < c->start_ms || no_leader)) {
                s->breaker_open = true;
                s->breaker_opened_ms = now;
                s->probe_next_ms = now;
                s->probe_target = c->target >= 0 ? c->target : 0;
                s->probe_attempt = 0;
                s->fast_failed_open = 0;
                kvp_log_warn(s->name, "%s for %llu ms (a whole call timeout): calls fail at once with UNAVAILABLE "
                             "until one shows a leader (probing every %u ms)",
                             s->last_heard_ms < c->start_ms ? "no master answered" : "no leader (masters answer "
                             "\"not leader\" without one: no quorum?)",
                             (unsigned long long)(now - c->start_ms), KVP_MS_PROBE_MS);
            }
            complete(s, c, KVP_ERR_UNAVAILABLE, NULL);
            continue;
        }
        if (c->target < 0) { /* new call */
            c->target = s->leader >= 0 ? s->leader : 0;
            send_attempt(s, c, now);
        } else if (now >= c->next_action_ms) {
            if (c->sent) { /* the attempt timed out: next master, longer wait */
                if (s->leader == c->target)
                    s->leader = -1;
                c->target = (c->target + 1) % (int)s->n_masters;
                c->attempt_ms *= 2;
                if (c->attempt_ms > KVP_MS_MAX_ATTEMPT_MS)
                    c->attempt_ms = KVP_MS_MAX_ATTEMPT_MS;
            }
            send_attempt(s, c, now);
        }
        if (c->done)
            continue;
        long t = c->next_action_ms > now ? (long)(c->next_action_ms - now) : 0;
        if (t < timeout)
            timeout = t;
    }
    if (s->breaker_open) {
        if (now >= s->probe_next_ms)
            send_probe(s, now);
        long t = s->probe_next_ms > now ? (long)(s->probe_next_ms - now) : 0;
        if (t < timeout)
            timeout = t;
    }
    return timeout;
}

/* A master not sent to for this long is left out of the poll (unless it is the leader): every
 * zmq socket in a zmq_poll costs two system calls per pass (its mailbox is checked before and
 * after the wait), so polling the three sockets of a three-master list made ~14 poll and ~16
 * getpid calls per RPC. A reply can only come from a master a request went to; one arriving
 * after this long (a call long timed out) waits in its socket until that master is sent to
 * again, and is then dropped as unknown. */
#define MS_QUIET_MS 60000u

static void *io_main(void *arg)
{
    struct kvp_msession *s = arg;
    zmq_pollitem_t items[KVP_MS_MAX_MASTERS + 1];
    size_t idx[KVP_MS_MAX_MASTERS]; /* items[k] polls socks[idx[k]] */
    for (;;) {
        pthread_mutex_lock(&s->mu);
        if (s->closing) {
            while (s->calls)
                complete(s, s->calls, KVP_ERR_CLOSED, NULL);
            pthread_mutex_unlock(&s->mu);
            break;
        }
        uint64_t now = kvp_clock_now_ms();
        long timeout = drive(s, now);
        size_t n = 0;
        for (size_t i = 0; i < s->n_masters; i++) {
            if ((int)i != s->leader && (s->sent_ms[i] == 0 || now - s->sent_ms[i] > MS_QUIET_MS))
                continue;
            items[n] = (zmq_pollitem_t){.socket = s->socks[i], .events = ZMQ_POLLIN};
            idx[n++] = i;
        }
        /* From here until the poll returns, a new call must write wake_fd; before, drive()
         * above has sent every call queued (both under mu, so no call falls in between). */
        s->io_polling = true;
        pthread_mutex_unlock(&s->mu);
        items[n] = (zmq_pollitem_t){.socket = NULL, .fd = s->wake_fd, .events = ZMQ_POLLIN};

        int rc = zmq_poll(items, (int)n + 1, timeout);
        if (rc < 0 && errno != EINTR) {
            kvp_log_error(s->name, "poll: %s", zmq_strerror(errno));
            usleep(10000);
            continue;
        }
        pthread_mutex_lock(&s->mu);
        s->io_polling = false;
        bool woken = s->wake_sent;
        s->wake_sent = false;
        pthread_mutex_unlock(&s->mu);
        if (woken || (items[n].revents & ZMQ_POLLIN)) {
            uint64_t v;
            if (read(s->wake_fd, &v, sizeof v) < 0 && errno != EAGAIN)
                kvp_log_warn(s->name, "wake read: %s", strerror(errno));
        }
        for (size_t k = 0; k < n; k++) {
            if (!(items[k].revents & ZMQ_POLLIN))
                continue;
            size_t i = idx[k];
            for (;;) { /* drain every reply waiting on this socket */
                zmq_msg_t m;
                zmq_msg_init(&m);
                if (zmq_msg_recv(&m, s->socks[i], ZMQ_DONTWAIT) < 0) {
                    zmq_msg_close(&m);
                    break;
                }
                Kvp__Response *resp = NULL;
                int drc = kvp_wire_decode_response(zmq_msg_data(&m), zmq_msg_size(&m), &resp);
                zmq_msg_close(&m);
                if (drc != KVP_OK) {
                    kvp_log_warn(s->name, "master %s: reply dropped: %s", s->masters[i], kvp_errname(drc));
                    continue;
                }
                pthread_mutex_lock(&s->mu);
                on_reply(s, (int)i, resp, kvp_clock_now_ms());
                pthread_mutex_unlock(&s->mu);
            }
        }
    }
    for (size_t i = 0; i < s->n_masters; i++)
        if (s->socks[i])
            zmq_close(s->socks[i]);
    return NULL;
}

int kvp_msession_new(struct kvp_msession **out, const char *const *masters, size_t n, const char *name)
{
    if (!out || !masters || n == 0 || n > KVP_MS_MAX_MASTERS)
        return KVP_ERR_INVALID;
    for (size_t i = 0; i < n; i++)
        if (!masters[i] || !*strip_scheme(masters[i]) || strlen(masters[i]) > 255)
            return KVP_ERR_INVALID;
    struct kvp_msession *s = calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NOMEM;
    snprintf(s->name, sizeof s->name, "%s", name && *name ? name : "msession");
    s->leader = -1;
    s->next_seq = 1;
    s->wake_fd = -1;
    int rc = KVP_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        s->masters[i] = strdup(strip_scheme(masters[i]));
        if (!s->masters[i])
            goto fail;
        s->n_masters++;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->zctx = zmq_ctx_new();
    rc = KVP_ERR_IO;
    if (s->wake_fd < 0 || !s->zctx)
        goto fail_sync;
    for (size_t i = 0; i < n; i++) {
        rc = open_socket(s, i);
        if (rc != KVP_OK)
            goto fail_sync;
    }
    if (pthread_create(&s->thread, NULL, io_main, s) != 0) {
        rc = KVP_ERR_NOMEM;
        goto fail_sync;
    }
    *out = s;
    return KVP_OK;

fail_sync:
    for (size_t i = 0; i < n; i++)
        if (s->socks[i])
            zmq_close(s->socks[i]);
    if (s->zctx)
        zmq_ctx_term(s->zctx);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    pthread_cond_destroy(&s->idle_cv);
    pthread_mutex_destroy(&s->mu);
fail:
    for (size_t i = 0; i < s->n_masters; i++)
        free(s->masters[i]);
    free(s);
    return rc;
}

static void wake(struct kvp_msession *s)
{
    uint64_t one = 1;
    if (write(s->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        kvp_log_warn(s->name, "wake: %s", strerror(errno));
}

/* Under mu. Wake the I/O thread only when it is polling and no wake-up is pending: while it
 * is busy it runs drive() again before it polls, and that sends the new call. Saves a write
 * (and the thread's read) per call when many threads call at once. */
static void wake_if_polling(struct kvp_msession *s)
{
    if (s->io_polling && !s->wake_sent) {
        s->wake_sent = true;
        wake(s);
    }
}

int kvp_msession_call(struct kvp_msession *s, Kvp__Request *req, uint32_t timeout_ms, Kvp__Response **out)
{
    if (!s || !req || !out)
        return KVP_ERR_INVALID;
    *out = NULL;
    if (timeout_ms == 0)
        timeout_ms = DEFAULT_CALL_TIMEOUT_MS;
    struct kvp_ms_call c;
    memset(&c, 0, sizeof c);
    c.req = req;
    c.target = -1;
    c.attempt_ms = KVP_MS_FIRST_ATTEMPT_MS;
    c.start_ms = kvp_clock_now_ms();
    c.deadline_ms = c.start_ms + timeout_ms;
    pthread_cond_init(&c.cv, NULL);

    pthread_mutex_lock(&s->mu);
    if (s->closing) {
        pthread_mutex_unlock(&s->mu);
        pthread_cond_destroy(&c.cv);
        return KVP_ERR_CLOSED;
    }
    if (s->breaker_open) { /* fail fast: no master answered a whole call timeout; probing */
        s->fast_failed++;
        s->fast_failed_open++;
        pthread_mutex_unlock(&s->mu);
        pthread_cond_destroy(&c.cv);
        return KVP_ERR_UNAVAILABLE;
    }
    s->inflight++;
    c.seq = s->next_seq++;
    c.next = s->calls;
    s->calls = &c;
    wake_if_polling(s);
    while (!c.done)
        pthread_cond_wait(&c.cv, &s->mu);
    if (--s->inflight == 0 && s->closing)
        pthread_cond_broadcast(&s->idle_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_cond_destroy(&c.cv);
    *out = c.resp;
    return c.status;
}

void kvp_msession_set_fail_fast(struct kvp_msession *s, bool on)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->fail_fast = on;
    if (!on)
        s->breaker_open = false;
    pthread_mutex_unlock(&s->mu);
}

bool kvp_msession_failing_fast(struct kvp_msession *s, uint64_t *fast_failed)
{
    if (!s)
        return false;
    pthread_mutex_lock(&s->mu);
    bool open = s->breaker_open;
    if (fast_failed)
        *fast_failed = s->fast_failed;
    pthread_mutex_unlock(&s->mu);
    return open;
}

void kvp_msession_response_free(Kvp__Response *resp)
{
    if (resp)
        kvp__response__free_unpacked(resp, NULL);
}

void kvp_msession_leader(struct kvp_msession *s, char *buf, size_t cap)
{
    if (!buf || cap == 0)
        return;
    buf[0] = '\0';
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    if (s->leader >= 0)
        snprintf(buf, cap, "%s", s->masters[s->leader]);
    pthread_mutex_unlock(&s->mu);
}

void kvp_msession_destroy(struct kvp_msession **sp)
{
    if (!sp || !*sp)
        return;
    struct kvp_msession *s = *sp;
    *sp = NULL;
    pthread_mutex_lock(&s->mu);
    s->closing = true;
    wake(s);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL); /* completes every pending call with CLOSED, closes sockets */
    pthread_mutex_lock(&s->mu);
    while (s->inflight > 0)
        pthread_cond_wait(&s->idle_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    zmq_ctx_term(s->zctx);
    close(s->wake_fd);
    for (size_t i = 0; i < s->n_masters; i++)
        free(s->masters[i]);
    pthread_cond_destroy(&s->idle_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
