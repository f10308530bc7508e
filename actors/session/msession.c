/*
 * msession.c — the master session actor (see msession.h and msession_internal.h).
 *
 * Threading: the session is a runtime actor; its thread does every socket operation and owns
 * every field of struct kvp_ms_state. A caller's kvp_msession_call is a runtime request
 * (kvp_rt_call) that the actor answers once. Leader discovery (docs/internals.md
 * "Leadership"): send to the last known leader; NOT_LEADER with a hint → the hinted master
 * (added when unknown); NOT_LEADER without a hint → the next master after a short pause; no
 * reply within the per-attempt timeout (300 ms, doubling to 2 s, never past the call's deadline)
 * → the next master. At the call's deadline: KVP_ERR_UNAVAILABLE.
 *
 * Fail fast (when enabled, as the client library does): after a call waited its whole timeout
 * and no leader answered meanwhile nor within KVP_MS_FAILOVER_MS before, the breaker opens:
 * calls fail at once with KVP_ERR_UNAVAILABLE while the actor probes one master every
 * 200 ms; a reply that shows a leader closes it. A failover in progress (a leader known within
 * KVP_MS_FAILOVER_MS) never opens it; a lost quorum does, although the surviving followers
 * keep answering "not leader".
 */
#include "actors/session/msession_internal.h"

#include <czmq.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "auth/auth.h"
#include "include/kvpool.h"
#include "runtime/actor.h"
#include "runtime/clock.h"
#include "runtime/log.h"
#include "wire/envelope.h"

#define DEFAULT_CALL_TIMEOUT_MS 5000u

/* "tcp://host:port" → "host:port"; anything else unchanged. */
static const char *strip_scheme(const char *a)
{
    return strncmp(a, "tcp://", 6) == 0 ? a + 6 : a;
}

static int open_socket(struct kvp_ms_state *s, size_t i)
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
    if (kvp_auth_client_apply(s->auth, z, s->masters[i]) != KVP_OK) { /* CURVE (docs/security.md) */
        /* No public key for this master (logged): it stays unreachable, as a master down would. */
        zmq_close(z);
        return KVP_OK;
    }
    if (zmq_connect(z, ep) != 0) {
        kvp_log_warn(s->name, "master %s: connect: %s", s->masters[i], zmq_strerror(errno));
        zmq_close(z);
        return KVP_ERR_INVALID;
    }
    s->socks[i] = z;
    return KVP_OK;
}

static void call_free(struct kvp_ms_call *c)
{
    if (c->owned_req)
        kvp__request__free_unpacked(c->req, NULL);
    free(c);
}

/* Answer a call (its caller is blocked in kvp_rt_call, or an actor waits for the reply) and
 * forget it. */
static void complete(struct kvp_ms_state *s, struct kvp_ms_call *c, int status, Kvp__Response *resp)
{
    struct kvp_ms_call **pp = &s->calls;
    while (*pp && *pp != c)
        pp = &(*pp)->next;
    if (*pp)
        *pp = c->next;
    c->next = NULL;
    c->done = true;
    void *payload = resp;
    int rc = kvp_rt_reply(s->ctx, c->token, status, 0, resp ? &payload : NULL,
                          (kvp_rt_free_fn)kvp_msession_response_free);
    if (rc != KVP_OK) { /* the caller is gone (only at close): the reply stays ours */
        kvp_log_debug(s->name, "call %llu: reply not delivered: %s", (unsigned long long)c->seq,
                      kvp_errname(rc));
        kvp_msession_response_free(payload);
    }
    call_free(c);
}

/* Send the next attempt of c to master c->target (chosen by the caller of this). Returns true
 * when c was answered instead (the request cannot be encoded) and is gone. */
static bool send_attempt(struct kvp_ms_state *s, struct kvp_ms_call *c, uint64_t now)
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
        return true;
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
    return false;
}

/* Breaker open: send one Members request (answered by any master, leader or not) to
 * the next master. A send refused (not connected) just moves on at the next probe time. */
static void send_probe(struct kvp_ms_state *s, uint64_t now)
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

/* Index of master `addr`, adding it when unknown and there is room; -1 otherwise. */
static int find_or_add_master(struct kvp_ms_state *s, const char *addr)
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

/* A reply from master `from`. */
static void on_reply(struct kvp_ms_state *s, int from, Kvp__Response *resp, uint64_t now)
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

/* Start, resend or expire calls; returns the poll timeout in ms. */
static long drive(struct kvp_ms_state *s, uint64_t now)
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
            if (send_attempt(s, c, now))
                continue; /* answered (could not encode): c is gone */
        } else if (now >= c->next_action_ms) {
            if (c->sent) { /* the attempt timed out: next master, longer wait */
                if (s->leader == c->target)
                    s->leader = -1;
                c->target = (c->target + 1) % (int)s->n_masters;
                c->attempt_ms *= 2;
                if (c->attempt_ms > KVP_MS_MAX_ATTEMPT_MS)
                    c->attempt_ms = KVP_MS_MAX_ATTEMPT_MS;
            }
            if (send_attempt(s, c, now))
                continue;
        }
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

static int on_socket(struct kvp_rt_ctx *ctx, void *handle);

/* After every event: run the calls (drive), then fit the poll set and the timer to them. */
static int settle(struct kvp_rt_ctx *ctx, struct kvp_ms_state *s)
{
    uint64_t now = kvp_clock_now_ms();
    long timeout = drive(s, now);
    for (size_t i = 0; i < s->n_masters; i++) {
        bool want = s->socks[i] && ((int)i == s->leader || (s->sent_ms[i] && now - s->sent_ms[i] <= MS_QUIET_MS));
        if (want == s->watched[i])
            continue;
        int rc = want ? kvp_rt_watch(ctx, s->socks[i], on_socket) : kvp_rt_unwatch(ctx, s->socks[i]);
        if (rc != KVP_OK && rc != KVP_ERR_CLOSED) {
            kvp_log_error(s->name, "master %s: %s its socket: %s", s->masters[i], want ? "watch" : "unwatch",
                          kvp_errname(rc));
            return rc; /* fails the actor: supervision reports it */
        }
        s->watched[i] = want;
    }
    if (!s->calls && !s->breaker_open)
        return KVP_OK; /* nothing due: an armed timer just finds nothing to do */
    uint64_t due = now + (uint64_t)timeout;
    if (s->timer_id && s->timer_due_ms <= due)
        return KVP_OK; /* the armed timer comes first; drive() runs again then */
    if (s->timer_id)
        kvp_rt_timer_cancel(ctx, s->timer_id);
    s->timer_id = 0;
    int rc = kvp_rt_timer_start(ctx, (uint32_t)timeout, 0, MS_MSG_TICK, &s->timer_id);
    if (rc != KVP_OK && rc != KVP_ERR_CLOSED) {
        kvp_log_error(s->name, "timer: %s", kvp_errname(rc));
        return rc;
    }
    s->timer_due_ms = due;
    return KVP_OK;
}

/* A watched DEALER socket is readable: take every reply waiting on it. */
static int on_socket(struct kvp_rt_ctx *ctx, void *handle)
{
    struct kvp_ms_state *s = kvp_rt_state(ctx);
    s->ctx = ctx;
    size_t i = 0;
    while (i < s->n_masters && s->socks[i] != handle)
        i++;
    if (i == s->n_masters)
        return KVP_OK;
    for (;;) {
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
        on_reply(s, (int)i, resp, kvp_clock_now_ms());
    }
    return settle(ctx, s);
}

static int on_call(struct kvp_rt_ctx *ctx, struct kvp_ms_state *s, struct kvp_rt_msg *msg)
{
    const struct ms_call_msg *cm = msg->payload;
    if (s->breaker_open) { /* fail fast: no master answered a whole call timeout; probing */
        s->fast_failed++;
        s->fast_failed_open++;
        kvp_rt_reply(ctx, msg->corr_id, KVP_ERR_UNAVAILABLE, 0, NULL, NULL);
        return KVP_OK;
    }
    struct kvp_ms_call *c = calloc(1, sizeof *c);
    if (!c) {
        kvp_rt_reply(ctx, msg->corr_id, KVP_ERR_NOMEM, 0, NULL, NULL);
        return KVP_OK;
    }
    c->req = cm->req;
    c->owned_req = cm->owned;
    if (cm->owned)
        ((struct ms_call_msg *)msg->payload)->req = NULL; /* the record owns it now */
    c->token = msg->corr_id;
    c->target = -1;
    c->attempt_ms = KVP_MS_FIRST_ATTEMPT_MS;
    c->start_ms = cm->start_ms;
    c->deadline_ms = cm->start_ms + cm->timeout_ms;
    c->seq = s->next_seq++;
    c->next = s->calls;
    s->calls = c;
    return settle(ctx, s);
}

static int ms_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *msg)
{
    struct kvp_ms_state *s = kvp_rt_state(ctx);
    s->ctx = ctx;
    switch (msg->type) {
    case MS_MSG_CALL:
    case MS_MSG_REQUEST:
        if (msg->kind == KVP_RT_REQUEST && msg->payload)
            return on_call(ctx, s, msg);
        break;
    case MS_MSG_TICK:
        if (msg->kind == KVP_RT_TIMER && msg->corr_id == s->timer_id) {
            s->timer_id = 0;
            return settle(ctx, s);
        }
        return KVP_OK; /* a timer cancelled after it fired */
    case MS_MSG_FAIL_FAST:
        s->fail_fast = msg->arg != 0;
        if (!s->fail_fast)
            s->breaker_open = false;
        return KVP_OK;
    case MS_MSG_STATUS:
        kvp_rt_reply(ctx, msg->corr_id, KVP_OK, s->fast_failed << 1 | (s->breaker_open ? 1u : 0u), NULL, NULL);
        return KVP_OK;
    case MS_MSG_LEADER: {
        void *addr = s->leader >= 0 ? strdup(s->masters[s->leader]) : NULL;
        kvp_rt_reply(ctx, msg->corr_id, KVP_OK, 0, addr ? &addr : NULL, NULL);
        free(addr); /* NULL unless the reply failed */
        return KVP_OK;
    }
    default:
        break;
    }
    kvp_log_warn(s->name, "message type %u (kind %u) not handled here; dropped", msg->type, msg->kind);
    if (msg->kind == KVP_RT_REQUEST)
        kvp_rt_reply(ctx, msg->corr_id, KVP_ERR_INVALID, 0, NULL, NULL);
    return KVP_OK;
}

static void state_free(struct kvp_ms_state *s)
{
    for (size_t i = 0; i < KVP_MS_MAX_MASTERS; i++) {
        if (s->socks[i])
            zmq_close(s->socks[i]);
        free(s->masters[i]);
    }
    if (s->zctx)
        zmq_ctx_term(s->zctx);
    kvp_auth_client_destroy(&s->auth);
    free(s);
}

/* On the actor's thread: the sockets are made here, so only this thread ever touches them. */
static int ms_init(struct kvp_rt_ctx *ctx)
{
    struct kvp_ms_state *s = kvp_rt_state(ctx);
    s->zctx = zmq_ctx_new();
    if (!s->zctx)
        return KVP_ERR_IO;
    for (size_t i = 0; i < s->n_masters; i++) {
        int rc = open_socket(s, i);
        if (rc != KVP_OK)
            return rc;
    }
    return KVP_OK;
}

/* Calls still listed were answered CLOSED by the runtime at close (their tokens were owed);
 * the records, the sockets and the context go here, on the actor's thread. */
static void ms_fini(struct kvp_rt_ctx *ctx)
{
    struct kvp_ms_state *s = kvp_rt_state(ctx);
    while (s->calls) {
        struct kvp_ms_call *c = s->calls;
        s->calls = c->next;
        call_free(c);
    }
    state_free(s);
}

int kvp_msession_new(struct kvp_msession **out, const char *const *masters, size_t n, const char *name)
{
    return kvp_msession_new_auth(out, masters, n, name, NULL);
}

int kvp_msession_new_auth(struct kvp_msession **out, const char *const *masters, size_t n, const char *name,
                          struct kvp_auth_client **auth)
{
    if (!out || !masters || n == 0 || n > KVP_MS_MAX_MASTERS)
        return KVP_ERR_INVALID;
    for (size_t i = 0; i < n; i++)
        if (!masters[i] || !*strip_scheme(masters[i]) || strlen(masters[i]) > 255)
            return KVP_ERR_INVALID;
    struct kvp_msession *h = calloc(1, sizeof *h);
    struct kvp_ms_state *s = calloc(1, sizeof *s);
    if (!h || !s) {
        free(h);
        free(s);
        return KVP_ERR_NOMEM;
    }
    snprintf(s->name, sizeof s->name, "%s", name && *name ? name : "msession");
    s->auth = auth ? *auth : NULL; /* the session owns it from here on, even on error */
    if (auth)
        *auth = NULL;
    s->leader = -1;
    s->next_seq = 1;
    for (size_t i = 0; i < n; i++) {
        s->masters[i] = strdup(strip_scheme(masters[i]));
        if (!s->masters[i]) {
            state_free(s);
            free(h);
            return KVP_ERR_NOMEM;
        }
        s->n_masters++;
    }
    /* The session may be the first user of czmq in a process (a client, kvpool-segment,
     * kvpoolctl): czmq's zsys_init (run by the process's first czmq socket or zactor; the
     * runtime's threads are plain pthreads) would install czmq's
     * SIGINT/SIGTERM handlers and take Ctrl-C away from the application. Before the session was
     * an actor such processes never had them; keep it so (docs/runtime.md "Signals"). */
    zsys_handler_set(NULL);
    struct kvp_rt_spec spec = {.name = s->name, .init = ms_init, .handle = ms_handle,
                               .fini = ms_fini, .state = s};
    /* From here the runtime owns s: any failure ran ms_fini (s and the keys it owns freed). */
    int rc = kvp_rt_spawn(&h->actor, &spec, NULL);
    if (rc != KVP_OK) {
        free(h);
        return rc;
    }
    *out = h;
    return KVP_OK;
}

int kvp_msession_call(struct kvp_msession *s, Kvp__Request *req, uint32_t timeout_ms, Kvp__Response **out)
{
    if (!s || !req || !out)
        return KVP_ERR_INVALID;
    *out = NULL;
    struct ms_call_msg cm = {.req = req, .timeout_ms = timeout_ms ? timeout_ms : DEFAULT_CALL_TIMEOUT_MS,
                             .start_ms = kvp_clock_now_ms()};
    struct ms_call_msg *p = malloc(sizeof *p);
    if (!p)
        return KVP_ERR_NOMEM;
    *p = cm;
    void *payload = p;
    struct kvp_rt_msg *reply = NULL;
    /* No timeout here: the actor answers every call by its deadline (or CLOSED at destroy), and
     * it borrows `req` until then, so the caller must not return before the answer. */
    int rc = kvp_rt_call(s->actor, 0, MS_MSG_CALL, 0, &payload, NULL, 0, &reply);
    if (rc != KVP_OK) {
        free(payload); /* still ours when the send failed */
        return rc;
    }
    rc = reply->status;
    if (rc == KVP_OK)
        *out = kvp_rt_msg_take(reply);
    kvp_rt_msg_destroy(&reply);
    return rc;
}

static void call_msg_free(void *p)
{
    struct ms_call_msg *cm = p;
    if (cm && cm->owned && cm->req)
        kvp__request__free_unpacked(cm->req, NULL);
    free(cm);
}

int kvp_msession_request(struct kvp_rt_ctx *ctx, struct kvp_msession *s, const Kvp__Request *req,
                         uint32_t timeout_ms, uint64_t *corr_id)
{
    if (!ctx || !s || !req)
        return KVP_ERR_INVALID;
    /* The copy: packed and unpacked, so the session owns every byte of it. */
    size_t len = kvp__request__get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    struct ms_call_msg *cm = calloc(1, sizeof *cm);
    if (!buf || !cm) {
        free(buf);
        free(cm);
        return KVP_ERR_NOMEM;
    }
    kvp__request__pack(req, buf);
    cm->req = kvp__request__unpack(NULL, len, buf);
    free(buf);
    if (!cm->req) {
        free(cm);
        return KVP_ERR_MALFORMED;
    }
    cm->owned = true;
    cm->timeout_ms = timeout_ms ? timeout_ms : DEFAULT_CALL_TIMEOUT_MS;
    cm->start_ms = kvp_clock_now_ms();
    void *payload = cm;
    /* No runtime deadline: the session answers by the call's own timeout. */
    int rc = kvp_rt_request(ctx, s->actor, 0, MS_MSG_REQUEST, 0, &payload, call_msg_free, 0, corr_id);
    if (rc != KVP_OK)
        call_msg_free(payload);
    return rc;
}

void kvp_msession_set_fail_fast(struct kvp_msession *s, bool on)
{
    if (s)
        kvp_rt_send(s->actor, 0, MS_MSG_FAIL_FAST, on ? 1 : 0, NULL, NULL);
}

bool kvp_msession_failing_fast(struct kvp_msession *s, uint64_t *fast_failed)
{
    if (fast_failed)
        *fast_failed = 0;
    if (!s)
        return false;
    struct kvp_rt_msg *reply = NULL;
    if (kvp_rt_call(s->actor, 0, MS_MSG_STATUS, 0, NULL, NULL, 0, &reply) != KVP_OK)
        return false;
    bool open = reply->status == KVP_OK && (reply->arg & 1u);
    if (fast_failed && reply->status == KVP_OK)
        *fast_failed = reply->arg >> 1;
    kvp_rt_msg_destroy(&reply);
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
    struct kvp_rt_msg *reply = NULL;
    if (kvp_rt_call(s->actor, 0, MS_MSG_LEADER, 0, NULL, NULL, 0, &reply) != KVP_OK)
        return;
    if (reply->status == KVP_OK && reply->payload)
        snprintf(buf, cap, "%s", (const char *)reply->payload);
    kvp_rt_msg_destroy(&reply);
}

void kvp_msession_destroy(struct kvp_msession **sp)
{
    if (!sp || !*sp)
        return;
    struct kvp_msession *s = *sp;
    *sp = NULL;
    /* Close answers every call in flight CLOSED (queued ones and those the actor holds); stop
     * runs fini on the actor's thread (sockets, context, state). */
    int rc = kvp_rt_stop(s->actor);
    if (rc != KVP_OK)
        kvp_log_error("msession", "session actor %s had failed: %s", kvp_rt_name(s->actor), kvp_errname(rc));
    kvp_rt_destroy(&s->actor);
    free(s);
}
