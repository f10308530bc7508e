/*
 * client_actor.c — the client actor: the one thread that owns an open client's shared state.
 *
 * The public API runs on the application's threads (include/kvpool.h: a call blocks its caller).
 * What those calls share lives here, in a runtime actor named like the client ("client-<pid>"),
 * and is changed only by messages, on the actor's thread:
 *  - the registered buffers (kvp_register_buffer / kvp_unregister_buffer: a request each);
 *  - the avoid list: segments this client could not reach lately, whose replicas gets try last
 *    and puts ask the master to place on last (issue 18 item 2);
 *  - the read witnesses: segments read from successfully, named to the master in the next
 *    GetReplicaList (issue 18 rule 5);
 *  - the GPU staging lanes (devstage.c: a staged batch takes a lane and gives it back by request);
 *  - the batch actors, one per transfer call of a put/get (the engine's batch host,
 *    kvp_xfer_params.batch_host; actors/transfer/xfer_host.c): the caller's thread sends the call
 *    here and blocks on the reply; the batch actor sends one work to each transfer actor it
 *    needs, and replies from its fini once every one reported every slice terminal;
 *  - the wait of kvp_client_close for the calls still inside.
 *
 * Hops (docs/data-plane.md "Client actor"): every transfer round of a put or get is one request
 * here (its batch actor; issue 19 item 2: two hand-offs more per round than when the tcp actor
 * hosted it), and that batch actor also notes the round's read witnesses (no message of their
 * own; CA_READ_OK remains for a staged round whose transport a test replaced). Otherwise, calls
 * that need none of this state send nothing here. A get asks once per GetReplicaList
 * (CA_GET_BEGIN: the witnesses it carries and a copy of the avoid list, one request for the whole
 * batch, not per key). A put asks only while the avoid list holds an
 * entry (kvp_client_avoid_list). Calls skip the request when the hints below say there is nothing
 * to fetch.
 *
 * Two things stay on the callers' threads, each an atomic with its reason:
 *  - c->life (closed flag + calls inside): every call enters and leaves through it; a message
 *    there would add two hops to every call, exists and get_size included. The actor does the
 *    waiting part: the call that leaves last after close sends CA_IDLE, and close's request
 *    (CA_CLOSE_WAIT) is answered then.
 *  - c->avoid_until_hint / c->read_ok_hint: published by this actor, read by callers to skip a
 *    request that would return nothing (both tables are empty most of the time). A stale hint
 *    costs one request or one witness named a call later (within KVP_CLIENT_READ_WITNESS_MS),
 *    never a wrong answer: the tables themselves are only read here.
 */
#include "actors/client/client.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/actor.h"
#include "runtime/clock.h"
#include "runtime/log.h"

#define CLIENT_LIFE_CLOSED (UINT64_C(1) << 63)

enum {
    CA_CLOSE_WAIT = 1, /* request: answered once no call is inside (after CA_IDLE) */
    CA_IDLE,           /* one-way: the last call inside a closing client left */
    CA_AVOID_NOTE,     /* request, arg = segment id */
    CA_AVOID_LIST,     /* request: reply payload struct kvp_client_view (avoid part) */
    CA_GET_BEGIN,      /* request: reply payload struct kvp_client_view (witnesses taken) */
    CA_READ_OK,        /* one-way: payload struct ids */
    CA_BUF_ADD,        /* request: payload struct buf_req */
    CA_BUF_DEL,        /* request: arg = address; reply arg = length */
};

struct ids {
    size_t n;
    uint32_t id[];
};

struct buf_req {
    uintptr_t addr;
    size_t len;
    bool allow_overlap;
};

/* The state this actor owns (nothing else reads or writes it). */
struct ca {
    struct kvp_client *c; /* for the hints and the name; the client outlives this actor */
    struct { uint32_t segment_id; uint64_t until_ms; } avoid[KVP_CLIENT_AVOID_MAX];
    struct { uint32_t segment_id; uint64_t at_ms; } read_ok[KVP_CLIENT_AVOID_MAX];
    struct kvp_client_buf *bufs; /* registered buffers (unsorted) */
    size_t n_bufs, cap_bufs;
    bool idle;               /* CA_IDLE arrived */
    bool close_waiting;      /* close_token holds an unanswered CA_CLOSE_WAIT */
    uint64_t close_token;
    struct kvp_xfer_host *xh; /* the batch actors hosted here (xfer_host.c; made on first use) */
};

static void publish_avoid_hint(struct ca *s)
{
    uint64_t until = 0;
    for (size_t k = 0; k < KVP_CLIENT_AVOID_MAX; k++)
        if (s->avoid[k].segment_id && s->avoid[k].until_ms > until)
            until = s->avoid[k].until_ms;
    atomic_store_explicit(&s->c->avoid_until_hint, until, memory_order_relaxed);
}

static void avoid_note(struct ca *s, uint32_t segment_id)
{
    uint64_t now = kvp_clock_now_ms();
    size_t slot = 0;
    for (size_t k = 0; k < KVP_CLIENT_AVOID_MAX; k++) {
        if (s->avoid[k].segment_id == segment_id) {
            slot = k;
            break;
        }
        if (s->avoid[k].until_ms < s->avoid[slot].until_ms)
            slot = k; /* the oldest (or an empty) entry */
    }
    s->avoid[slot].segment_id = segment_id;
    s->avoid[slot].until_ms = now + KVP_CLIENT_AVOID_MS;
    publish_avoid_hint(s);
}

static void avoid_copy(struct ca *s, struct kvp_client_view *v)
{
    uint64_t now = kvp_clock_now_ms();
    v->n_avoid = 0;
    for (size_t k = 0; k < KVP_CLIENT_AVOID_MAX; k++)
        if (s->avoid[k].segment_id && s->avoid[k].until_ms > now) {
            v->avoid[v->n_avoid].segment_id = s->avoid[k].segment_id;
            v->avoid[v->n_avoid++].until_ms = s->avoid[k].until_ms;
        }
}

/* Successful reads: one entry per segment, the oldest replaced when the table is full. */
static void read_ok_note(struct ca *s, const uint32_t *id, size_t n)
{
    uint64_t now = kvp_clock_now_ms();
    for (size_t q = 0; q < n; q++) {
        size_t slot = 0;
        for (size_t k = 0; k < KVP_CLIENT_AVOID_MAX; k++) {
            if (s->read_ok[k].segment_id == id[q]) {
                slot = k;
                break;
            }
            if (s->read_ok[k].at_ms < s->read_ok[slot].at_ms)
                slot = k;
        }
        s->read_ok[slot].segment_id = id[q];
        s->read_ok[slot].at_ms = now;
    }
    if (n)
        atomic_store_explicit(&s->c->read_ok_hint, true, memory_order_relaxed);
}

/* The segments of the slices (reads_only: READ slices) that completed (at most KVP_CLIENT_AVOID_MAX, each once). */
static size_t read_ok_ids(const struct kvp_xfer_slice *slices, size_t ns, bool reads_only, uint32_t *seen)
{
    size_t n = 0;
    for (size_t q = 0; q < ns && n < KVP_CLIENT_AVOID_MAX; q++) {
        if (slices[q].status != KVP_OK || slices[q].segment_id == 0 || (reads_only && slices[q].op != KVP_XFER_READ))
            continue;
        size_t k = 0;
        while (k < n && seen[k] != slices[q].segment_id)
            k++;
        if (k == n)
            seen[n++] = slices[q].segment_id;
    }
    return n;
}

/* A batch actor hosted here finished (xfer_host.c, this thread): its completed reads are read
 * witnesses. Noted here, in the batch, rather than by a CA_READ_OK message from the caller. */
static void ca_batch_done(void *arg, const struct kvp_xfer_slice *slices, size_t n)
{
    uint32_t seen[KVP_CLIENT_AVOID_MAX];
    size_t k = read_ok_ids(slices, n, true, seen);
    if (k)
        read_ok_note(arg, seen, k);
}

/* The witnesses for the next GetReplicaList: segments read within KVP_CLIENT_READ_WITNESS_MS;
 * each reading is named once (the table is emptied). */
static void read_ok_take(struct ca *s, struct kvp_client_view *v)
{
    uint64_t now = kvp_clock_now_ms();
    v->n_read_ok = 0;
    for (size_t k = 0; k < KVP_CLIENT_AVOID_MAX; k++) {
        if (s->read_ok[k].segment_id && now - s->read_ok[k].at_ms <= KVP_CLIENT_READ_WITNESS_MS)
            v->read_ok[v->n_read_ok++] = s->read_ok[k].segment_id;
        s->read_ok[k].segment_id = 0;
        s->read_ok[k].at_ms = 0;
    }
    atomic_store_explicit(&s->c->read_ok_hint, false, memory_order_relaxed);
}

static int buf_add(struct ca *s, const struct buf_req *r)
{
    for (size_t i = 0; !r->allow_overlap && i < s->n_bufs; i++) {
        if (r->addr < s->bufs[i].addr + s->bufs[i].len && s->bufs[i].addr < r->addr + r->len) {
            kvp_log_warn(s->c->name, "register_buffer %p+%zu overlaps a registered buffer", (void *)r->addr,
                         r->len);
            return KVP_ERR_INVALID;
        }
    }
    if (s->n_bufs == s->cap_bufs) {
        size_t cap = s->cap_bufs ? s->cap_bufs * 2 : 8;
        struct kvp_client_buf *nb = realloc(s->bufs, cap * sizeof *nb);
        if (!nb)
            return KVP_ERR_NOMEM;
        s->bufs = nb;
        s->cap_bufs = cap;
    }
    s->bufs[s->n_bufs++] = (struct kvp_client_buf){.addr = r->addr, .len = r->len};
    return KVP_OK;
}

/* The latest registration at addr first (kvp_register_buffer_overlap may have nested ones).
 * Returns its length, 0 when there is none. */
static size_t buf_del(struct ca *s, uintptr_t addr)
{
    for (size_t i = s->n_bufs; i-- > 0;) {
        if (s->bufs[i].addr == addr) {
            size_t len = s->bufs[i].len;
            memmove(&s->bufs[i], &s->bufs[i + 1], (s->n_bufs - i - 1) * sizeof s->bufs[0]);
            s->n_bufs--;
            return len;
        }
    }
    return 0;
}

static void close_answer(struct kvp_rt_ctx *ctx, struct ca *s)
{
    if (s->close_waiting && s->idle) {
        s->close_waiting = false;
        (void)kvp_rt_reply(ctx, s->close_token, KVP_OK, 0, NULL, NULL);
    }
}

static int ca_handle(struct kvp_rt_ctx *ctx, struct kvp_rt_msg *m)
{
    struct ca *s = kvp_rt_state(ctx);
    if (m->kind != KVP_RT_SEND && m->kind != KVP_RT_REQUEST)
        return KVP_OK;
    if (m->type >= KVP_DEVSTAGE_MSG_FIRST && m->type <= KVP_DEVSTAGE_MSG_LAST) /* the staging lanes */
        return kvp_devstage_handle(s->c->devstage, ctx, m);
    if (m->type >= KVP_XFER_HOST_MSG_FIRST && m->type <= KVP_XFER_HOST_MSG_LAST) /* batch actors */
        return kvp_xfer_host_handle(ctx, &s->xh, m);
    switch (m->type) {
    case CA_IDLE:
        s->idle = true;
        close_answer(ctx, s);
        return KVP_OK;
    case CA_CLOSE_WAIT:
        s->close_waiting = true;
        s->close_token = m->corr_id;
        close_answer(ctx, s);
        return KVP_OK;
    case CA_READ_OK:
        if (m->payload)
            read_ok_note(s, ((const struct ids *)m->payload)->id, ((const struct ids *)m->payload)->n);
        return KVP_OK;
    case CA_AVOID_NOTE:
        avoid_note(s, (uint32_t)m->arg);
        break;
    case CA_AVOID_LIST:
    case CA_GET_BEGIN: {
        struct kvp_client_view *v = malloc(sizeof *v);
        if (!v) {
            (void)kvp_rt_reply(ctx, m->corr_id, KVP_ERR_NOMEM, 0, NULL, NULL);
            return KVP_OK;
        }
        avoid_copy(s, v);
        v->n_read_ok = 0;
        if (m->type == CA_GET_BEGIN)
            read_ok_take(s, v);
        void *p = v;
        if (kvp_rt_reply(ctx, m->corr_id, KVP_OK, 0, &p, NULL) != KVP_OK)
            free(p);
        return KVP_OK;
    }
    case CA_BUF_ADD: {
        int rc = m->payload ? buf_add(s, m->payload) : KVP_ERR_INVALID;
        (void)kvp_rt_reply(ctx, m->corr_id, rc, 0, NULL, NULL);
        return KVP_OK;
    }
    case CA_BUF_DEL: {
        size_t len = buf_del(s, (uintptr_t)m->arg);
        if (!len)
            kvp_log_warn(s->c->name, "unregister_buffer %p: no registered buffer starts there",
                         (void *)(uintptr_t)m->arg);
        (void)kvp_rt_reply(ctx, m->corr_id, len ? KVP_OK : KVP_ERR_NOT_FOUND, len, NULL, NULL);
        return KVP_OK;
    }
    default:
        kvp_log_warn(s->c->name, "client actor: unknown message %u dropped", (unsigned)m->type);
        if (m->kind == KVP_RT_REQUEST) /* an unknown request is not done: say so */
            (void)kvp_rt_reply(ctx, m->corr_id, KVP_ERR_INVALID, 0, NULL, NULL);
        return KVP_OK;
    }
    if (m->kind == KVP_RT_REQUEST)
        (void)kvp_rt_reply(ctx, m->corr_id, KVP_OK, 0, NULL, NULL);
    return KVP_OK;
}

static void ca_fini(struct kvp_rt_ctx *ctx)
{
    struct ca *s = kvp_rt_state(ctx);
    if (!s)
        return;
    kvp_xfer_host_free(&s->xh);
    free(s->bufs);
    free(s);
}

int kvp_client_actor_start(struct kvp_client *c)
{
    struct ca *s = calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NOMEM;
    s->c = c;
    int rc = kvp_xfer_host_new(&s->xh, ca_batch_done, s);
    if (rc != KVP_OK) {
        free(s);
        return rc;
    }
    struct kvp_rt_spec spec = {.name = c->name, .handle = ca_handle, .fini = ca_fini, .state = s};
    return kvp_rt_spawn(&c->actor, &spec, NULL); /* fini frees s on every failure */
}

void kvp_client_actor_stop(struct kvp_client *c)
{
    kvp_rt_destroy(&c->actor);
}

/* ------------------------------------------------------------------ callers' side */

/* One request to the client actor, waited for; the reply's status, *arg_out its arg, *view its
 * payload (the caller's; free()). */
static int ca_call(struct kvp_client *c, uint32_t type, uint64_t arg, void *payload, uint64_t *arg_out,
                   void **reply_payload)
{
    struct kvp_rt_msg *r = NULL;
    void *p = payload;
    int rc = kvp_rt_call(c->actor, 0, type, arg, p ? &p : NULL, NULL, 0, &r);
    if (rc != KVP_OK) {
        free(p);
        return rc;
    }
    rc = r->status;
    if (arg_out)
        *arg_out = r->arg;
    if (reply_payload)
        *reply_payload = kvp_rt_msg_take(r);
    kvp_rt_msg_destroy(&r);
    return rc;
}

int kvp_client_enter(struct kvp_client *c)
{
    uint64_t v = atomic_load(&c->life);
    do {
        if (v & CLIENT_LIFE_CLOSED)
            return KVP_ERR_CLOSED;
    } while (!atomic_compare_exchange_weak(&c->life, &v, v + 1));
    return KVP_OK;
}

/* A message close depends on (CA_IDLE, CA_CLOSE_WAIT) may not be dropped: a send or a call that
 * found no memory is tried again every millisecond, logged once. The mailbox is unbounded, so
 * NOMEM is the only transient failure; any other error is returned. */
static void nomem_pause(struct kvp_client *c, int tries, const char *what)
{
    if (tries == 1)
        kvp_log_error(c->name, "close: %s: out of memory; trying again every 1 ms", what);
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 1000000};
    nanosleep(&ts, NULL);
}

void kvp_client_leave(struct kvp_client *c)
{
    uint64_t old = atomic_fetch_sub(&c->life, 1);
    if (old == (CLIENT_LIFE_CLOSED | 1)) {
        /* The last call inside a closing client: close waits for this message, so the client
         * and its actor are still there; the reference covers the send's own end. Dropping it
         * would leave close waiting forever. */
        struct kvp_rt_actor *a = kvp_rt_ref(c->actor);
        int rc;
        for (int tries = 1; (rc = kvp_rt_send(a, 0, CA_IDLE, 0, NULL, NULL)) == KVP_ERR_NOMEM; tries++)
            nomem_pause(c, tries, "telling the client actor the last call left");
        if (rc != KVP_OK) /* the actor closed (it never fails itself): close got CLOSED and leaks */
            kvp_log_error(c->name, "close: the last call could not tell the client actor (%s)",
                          kvp_errname(rc));
        kvp_rt_unref(&a);
    }
}

bool kvp_client_closing(struct kvp_client *c)
{
    return (atomic_load(&c->life) & CLIENT_LIFE_CLOSED) != 0;
}

uint64_t kvp_client_mark_closed(struct kvp_client *c)
{
    return atomic_fetch_or(&c->life, CLIENT_LIFE_CLOSED) & ~CLIENT_LIFE_CLOSED;
}

int kvp_client_close_wait(struct kvp_client *c, uint64_t inside)
{
    /* inside == 0: no call was in, and none can enter now. Otherwise the one that leaves last
     * sends CA_IDLE, which this must wait for even if it already left: it may still be sending. */
    if (inside == 0 || !c->actor)
        return KVP_OK;
    int rc;
    for (int tries = 1; (rc = ca_call(c, CA_CLOSE_WAIT, 0, NULL, NULL, NULL)) == KVP_ERR_NOMEM; tries++)
        nomem_pause(c, tries, "waiting for the calls in flight");
    if (rc != KVP_OK)
        kvp_log_error(c->name, "close: waiting for the calls in flight failed (%s)", kvp_errname(rc));
    return rc;
}

void kvp_client_avoid_note(struct kvp_client *c, uint32_t segment_id)
{
    (void)ca_call(c, CA_AVOID_NOTE, segment_id, NULL, NULL, NULL);
}

size_t kvp_client_avoid_list(struct kvp_client *c, uint32_t *out, size_t cap)
{
    if (kvp_clock_now_ms() >= atomic_load_explicit(&c->avoid_until_hint, memory_order_relaxed))
        return 0; /* nothing avoided now: no request */
    struct kvp_client_view *v = NULL;
    if (ca_call(c, CA_AVOID_LIST, 0, NULL, NULL, (void **)&v) != KVP_OK || !v) {
        free(v);
        return 0;
    }
    size_t n = 0;
    for (size_t k = 0; k < v->n_avoid && n < cap; k++)
        out[n++] = v->avoid[k].segment_id;
    free(v);
    return n;
}

void kvp_client_get_begin(struct kvp_client *c, struct kvp_client_view *v)
{
    v->n_avoid = 0;
    v->n_read_ok = 0;
    bool witnesses = atomic_load_explicit(&c->read_ok_hint, memory_order_relaxed);
    bool avoiding = kvp_clock_now_ms() < atomic_load_explicit(&c->avoid_until_hint, memory_order_relaxed);
    if (!witnesses && !avoiding)
        return; /* nothing to take or copy: no request */
    struct kvp_client_view *r = NULL;
    if (ca_call(c, CA_GET_BEGIN, 0, NULL, NULL, (void **)&r) == KVP_OK && r)
        *v = *r;
    free(r);
}

bool kvp_client_view_avoided(const struct kvp_client_view *v, uint32_t segment_id, uint64_t now_ms)
{
    for (size_t k = 0; k < v->n_avoid; k++)
        if (v->avoid[k].segment_id == segment_id && v->avoid[k].until_ms > now_ms)
            return true;
    return false;
}

void kvp_client_read_ok(struct kvp_client *c, const struct kvp_xfer_slice *slices, size_t ns)
{
    uint32_t seen[KVP_CLIENT_AVOID_MAX];
    size_t n = read_ok_ids(slices, ns, false, seen);
    if (n == 0)
        return;
    struct ids *ids = malloc(sizeof *ids + n * sizeof ids->id[0]);
    if (!ids)
        return; /* a witness less: the master's rule has others (it is a hint, not a duty) */
    ids->n = n;
    memcpy(ids->id, seen, n * sizeof seen[0]);
    void *p = ids;
    if (kvp_rt_send(c->actor, 0, CA_READ_OK, 0, &p, NULL) != KVP_OK)
        free(p);
}

int kvp_client_buf_add(struct kvp_client *c, uintptr_t addr, size_t len, bool allow_overlap)
{
    struct buf_req *r = malloc(sizeof *r);
    if (!r)
        return KVP_ERR_NOMEM;
    *r = (struct buf_req){.addr = addr, .len = len, .allow_overlap = allow_overlap};
    return ca_call(c, CA_BUF_ADD, 0, r, NULL, NULL);
}

int kvp_client_buf_del(struct kvp_client *c, uintptr_t addr, size_t *len)
{
    uint64_t l = 0;
    int rc = ca_call(c, CA_BUF_DEL, addr, NULL, &l, NULL);
    *len = (size_t)l;
    return rc;
}
