/*
 * service_repair.c — the leader's drain and repair driver. See service_repair.h and
 * docs/drain-repair.md.
 */
#define _GNU_SOURCE
#include "actors/master/service/service_repair.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "actors/master/service/repair_pass.h"
#include "actors/master/service/service_state.h"
#include "kvpool.h"
#include "runtime/log.h"

#define REPAIR_TICK_MS 100u
#define SCAN_BUSY_MS 200u
#define SCAN_IDLE_MS 1000u
#define SCAN_MAX 512u
/* Table slots one RepairScan query walks on the raft thread (issue 22). An occupied slot costs
 * a cache miss (~50-80 ns measured at 2M objects: a 4M-slot walk held the thread 330-350 ms),
 * so a slice is a few ms; a pass over a 16M-slot table (10M objects) is 128 slices, one per
 * REPAIR_TICK_MS (~13 s). Needs a slice finds are acted on at once, not at the pass's end. */
#define SCAN_SLICE_SLOTS (1u << 17)
#define MAX_TASKS 256u
#define START_BATCH 64u
#define TASK_RESEND_MS 15000u  /* a handed task not reported on is handed again */
#define TASK_ABORT_MS 40000u   /* ... and abandoned (its replica freed) after this */
#define STALE_PENDING_MS 12000u /* a PENDING repair replica no task of ours covers (a new leader's orphans; > the mover's 8 s copy timeout) */
#define POLL_MAX_TASKS 16u
#define LOG_EVERY_MS 2000u
#define RATE_WINDOW_MS 2000u

struct rtask {
    uint64_t id;
    char *key;
    uint64_t key_hash;
    uint64_t size, checksum;
    uint32_t src_seg;
    uint64_t src_off;
    Kvp__Replica *target; /* owned */
    uint64_t created_ms, handed_ms;
};

struct svc_repair {
    struct kvp_master_service *s;
    struct rtask **tasks;
    size_t n_tasks, cap_tasks;
    uint64_t next_task;
    struct repair_scan_ticket scan; /* the RepairScan query in flight (repair_pass.h) */
    bool start_inflight;
    uint64_t last_scan_ms;
    bool busy; /* the last scan found work */
    /* FSM repair epoch when the scan in flight was sent (0: unknown), and the epoch of the last
     * scan that found no work at all (0: none): while the FSM's epoch still equals clean_epoch,
     * nothing can need repair and the O(objects) scan is skipped. */
    uint64_t scan_epoch, clean_epoch;
    /* A clean scan that still counted objects short of copies (too few ACTIVE segments) is
     * trusted for 10 scan periods only, so its counters in ClusterStatus (under_replicated)
     * are at most that old after removes, which do not move the epoch. */
    uint64_t clean_until_ms;
    uint64_t scans_run, scans_skipped;
    /* The pass in progress: slices of SCAN_SLICE_SLOTS table slots, one query each (the rules
     * in repair_pass.h). `pass.sum` sums the slices' counters (published to `last` when the pass
     * ends); pass_seen_* are the droppable/stale entries seen in it. */
    struct repair_pass pass;
    uint64_t slice; /* slots per query: SCAN_SLICE_SLOTS (test builds: $KVPOOL_TEST_REPAIR_SCAN_SLOTS) */
    uint64_t pass_epoch, passes;
    struct svc_map pass_seen_drop, pass_seen_stale;
    struct svc_map droppable;    /* hash(key, seg) -> first seen droppable (ms) */
    struct svc_map stale;        /* hash(key, seg, off) -> first seen unknown PENDING (ms) */
    struct svc_map probe_failed; /* segment id -> time of a failed probe */
    double tokens;
    uint64_t tokens_ms;
    /* progress (since this node became leader) */
    Kvp__RepairScanResp last; /* counters only */
    uint64_t moved_objects, moved_bytes, dropped, failed_copies;
    uint64_t rate_t0_ms, rate_b0; /* window start for the rate */
    double rate_bps;
    uint64_t last_log_ms, last_space_log_ms;
    uint64_t drain_started_ms;
};

/* ------------------------------------------------------------------ the repair state
 * s->repair, made at first use. Service thread only, like the rest of the service state. */

static struct svc_repair *R(struct kvp_master_service *s)
{
    struct svc_repair *r = s->repair;
    if (r)
        return r;
    r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->s = s;
    r->next_task = 1;
    r->slice = SCAN_SLICE_SLOTS;
#ifdef KVP_FAULT_INJECTION
    /* tests: small slices, so a pass of a small table has many of them */
    const char *ts = getenv("KVPOOL_TEST_REPAIR_SCAN_SLOTS");
    if (ts && strtoull(ts, NULL, 10) > 0) {
        r->slice = strtoull(ts, NULL, 10);
        kvp_log_info(s->actor, "repair scan: slices of %llu table slots (KVPOOL_TEST_REPAIR_SCAN_SLOTS)",
                     (unsigned long long)r->slice);
    }
#endif
    svc_map_init(&r->droppable);
    svc_map_init(&r->stale);
    svc_map_init(&r->probe_failed);
    svc_map_init(&r->pass_seen_drop);
    svc_map_init(&r->pass_seen_stale);
    kvp__repair_scan_resp__init(&r->last);
    repair_pass_reset(&r->pass);
    s->repair = r;
    return r;
}

static void task_free(struct rtask *t)
{
    if (!t)
        return;
    free(t->key);
    if (t->target)
        protobuf_c_message_free_unpacked(&t->target->base, NULL);
    free(t);
}

static void task_del(struct svc_repair *r, size_t i)
{
    task_free(r->tasks[i]);
    r->tasks[i] = r->tasks[--r->n_tasks];
}

/* Forget the pass in progress: the next scan starts one at slot 0. */
static void pass_reset(struct svc_repair *r)
{
    repair_pass_reset(&r->pass);
    r->pass_epoch = 0;
    svc_map_clear(&r->pass_seen_drop);
    svc_map_clear(&r->pass_seen_stale);
}

void svc_repair_reset(struct kvp_master_service *s)
{
    struct svc_repair *r = R(s);
    if (!r)
        return;
    while (r->n_tasks)
        task_del(r, r->n_tasks - 1);
    svc_map_clear(&r->droppable);
    svc_map_clear(&r->stale);
    svc_map_clear(&r->probe_failed);
    repair_scan_forget(&r->scan); /* its answer, if it still comes, is dropped in svc_repair_on_result */
    r->start_inflight = false;
    r->busy = false;
    r->scan_epoch = r->clean_epoch = 0;
    r->moved_objects = r->moved_bytes = r->dropped = r->failed_copies = 0;
    r->rate_t0_ms = r->rate_b0 = 0;
    r->rate_bps = 0;
    r->drain_started_ms = 0;
    kvp__repair_scan_resp__init(&r->last);
    pass_reset(r);
}

void svc_repair_free(struct kvp_master_service *s)
{
    struct svc_repair *r = s->repair;
    if (!r)
        return;
    s->repair = NULL;
    while (r->n_tasks)
        task_del(r, r->n_tasks - 1);
    free(r->tasks);
    svc_map_fini(&r->droppable);
    svc_map_fini(&r->stale);
    svc_map_fini(&r->probe_failed);
    svc_map_fini(&r->pass_seen_drop);
    svc_map_fini(&r->pass_seen_stale);
    free(r);
}

static uint64_t pair_hash(const char *key, uint32_t seg, uint64_t off)
{
    uint64_t h = XXH3_64bits(key, strlen(key)) ^ ((uint64_t)seg * 0x9e3779b97f4a7c15ull) ^
                 (off * 0xc2b2ae3d27d4eb4full);
    return h ? h : 1;
}

/* ------------------------------------------------------------------ submitting */

static void submit(struct kvp_master_service *s, int kind, Kvp__Command *cmd)
{
    struct svc_pending *p = svc_pending_new(s, NULL, NULL);
    if (!p)
        return;
    p->internal = kind;
    svc_submit(s, p, cmd);
}

static void repair_end(struct kvp_master_service *s, Kvp__RepairEndItem **items, size_t n)
{
    if (n == 0)
        return;
    Kvp__RepairEndCmd body = KVP__REPAIR_END_CMD__INIT;
    body.items = items;
    body.n_items = n;
    Kvp__Command cmd = KVP__COMMAND__INIT;
    cmd.body_case = KVP__COMMAND__BODY_REPAIR_END;
    cmd.repair_end = &body;
    submit(s, SVC_INT_REPAIR_END, &cmd);
}

static void abort_task(struct kvp_master_service *s, struct rtask *t, const char *why)
{
    kvp_log_warn(s->actor, "copy of %s (segment %u -> %u): %s: freeing the new replica", t->key, t->src_seg,
                 t->target->segment_id, why);
    Kvp__RepairEndItem it = KVP__REPAIR_END_ITEM__INIT, *ip = &it;
    it.key = t->key;
    it.segment_id = t->target->segment_id;
    it.offset = t->target->offset;
    it.ok = false;
    repair_end(s, &ip, 1);
}

/* ------------------------------------------------------------------ timer */

static int on_tick(struct kvp_master_service *s)
{
    struct svc_repair *r = R(s);
    if (!r || !s->is_leader || !s->segments_fresh_ms)
        return 0;
    uint64_t now = svc_now_ms();
    /* tasks nobody finished */
    for (size_t i = 0; i < r->n_tasks;) {
        struct rtask *t = r->tasks[i];
        if (now - t->created_ms > TASK_ABORT_MS) {
            abort_task(s, t, t->handed_ms ? "no report from the mover" : "the mover never asked for it");
            r->failed_copies++;
            task_del(r, i);
        } else {
            i++;
        }
    }
    if (repair_scan_in_flight(&r->scan) || r->start_inflight)
        return 0;
    if (!r->pass.in_pass) {
        uint64_t every = (r->busy || r->n_tasks) ? SCAN_BUSY_MS : SCAN_IDLE_MS;
        if (now - r->last_scan_ms < every)
            return 0;
        r->last_scan_ms = now;
        /* A pass walks every object on the raft thread (tens of ms per million, a slice per
         * tick). Skip it while nothing that could create work has been applied since a pass
         * that found none. */
        uint64_t epoch = 0;
        if (kvp_raftlog_read_begin(s->rl) == KVP_OK) {
            epoch = kvp_master_fsm_repair_epoch(s->fsm);
            kvp_raftlog_read_end(s->rl);
        }
        if (epoch != 0 && epoch == r->clean_epoch && !r->n_tasks && now < r->clean_until_ms) {
            r->scans_skipped++;
            return 0;
        }
        pass_reset(r);
        r->pass.in_pass = true;
        r->pass_epoch = epoch;
        r->scans_run++;
    }
    struct svc_pending *p = svc_pending_new(s, NULL, NULL);
    if (!p)
        return 0;
    p->internal = SVC_INT_REPAIR_SCAN;
    Kvp__RepairScanReq q = KVP__REPAIR_SCAN_REQ__INIT;
    q.max = SCAN_MAX;
    q.cursor = r->pass.cursor;
    q.slots = r->slice;
    Kvp__Request req = KVP__REQUEST__INIT;
    req.body_case = KVP__REQUEST__BODY_REPAIR_SCAN;
    req.repair_scan = &q;
    p->repair_scan_ticket = repair_scan_send(&r->scan);
    if (svc_query(s, p, &req) != KVP_OK)
        repair_scan_forget(&r->scan);
    return 0;
}

int svc_repair_start(struct kvp_master_service *s)
{
    if (!R(s))
        return KVP_ERR_NOMEM;
    if (svc_timer_every(s, REPAIR_TICK_MS, on_tick) != KVP_OK)
        return KVP_ERR_NOMEM;
    return KVP_OK;
}

/* ------------------------------------------------------------------ scan results */

static bool has_task(const struct svc_repair *r, const char *key, uint32_t seg, uint64_t off, bool any_target)
{
    for (size_t i = 0; i < r->n_tasks; i++) {
        const struct rtask *t = r->tasks[i];
        if (strcmp(t->key, key) != 0)
            continue;
        if (any_target || (t->target->segment_id == seg && t->target->offset == off))
            return true;
    }
    return false;
}

static void account_rate(struct svc_repair *r, uint64_t now);

static void log_progress(struct kvp_master_service *s, struct svc_repair *r, uint64_t now)
{
    account_rate(r, now);
    const Kvp__RepairScanResp *b = &r->last;
    bool work = b->draining_objects || (b->under_replicated && b->n_needs) || r->n_tasks;
    if (!work) {
        r->drain_started_ms = 0;
        return;
    }
    if (!r->drain_started_ms)
        r->drain_started_ms = now;
    if (now - r->last_log_ms >= LOG_EVERY_MS) {
        r->last_log_ms = now;
        kvp_log_info(s->actor,
                     "drain/repair: %llu replicas (%llu bytes) left on draining segments, %llu objects "
                     "under-replicated, %zu copies in flight; moved %llu objects (%llu bytes), %.0f bytes/s",
                     (unsigned long long)b->draining_objects, (unsigned long long)b->draining_bytes,
                     (unsigned long long)b->under_replicated, r->n_tasks, (unsigned long long)r->moved_objects,
                     (unsigned long long)r->moved_bytes, r->rate_bps);
    }
    if (b->no_space && now - r->last_space_log_ms >= LOG_EVERY_MS) {
        r->last_space_log_ms = now;
        kvp_log_warn(s->actor,
                     "drain/repair: no room elsewhere for %llu objects' copies (%llu of them only on draining "
                     "segments): free space or add a segment; they stay where they are",
                     (unsigned long long)b->no_space, (unsigned long long)b->lost_if_drained);
    }
}

static void on_scan(struct kvp_master_service *s, struct svc_repair *r, const Kvp__RepairScanResp *b)
{
    uint64_t now = svc_now_ms();
    uint64_t lease = s->cfg.default_kv_lease_ttl_ms;
    enum repair_pass_step step = repair_pass_add(&r->pass, b, SCAN_MAX);
    if (step == REPAIR_PASS_RESTARTED) {
        /* The table's size changed within the pass (a growth swapped tables): its slots name
         * other objects now, so the pass starts over at slot 0 (this slice's needs are still
         * acted on below; its counters are not the pass's). */
        svc_map_clear(&r->pass_seen_drop);
        svc_map_clear(&r->pass_seen_stale);
        r->pass_epoch = r->scan_epoch;
    }
    bool pass_done = step == REPAIR_PASS_DONE;
    const Kvp__RepairScanResp *sum = &r->pass.sum;
    r->busy = sum->n_needs > 0 || sum->draining_objects > 0 || b->n_needs > 0 ||
              (!pass_done && r->last.draining_objects);
    if (pass_done) {
        r->last.draining_objects = sum->draining_objects;
        r->last.draining_bytes = sum->draining_bytes;
        r->last.under_replicated = sum->under_replicated;
        r->last.in_flight = sum->in_flight;
        r->last.no_space = sum->no_space;
        r->last.lost_if_drained = sum->lost_if_drained;
        r->last.n_needs = sum->n_needs;
        r->passes++;
    }

    Kvp__RepairItem *items = calloc(START_BATCH, sizeof *items);
    Kvp__RepairItem **ip = calloc(START_BATCH, sizeof *ip);
    Kvp__ReplicaDropItem *drops = calloc(b->n_needs ? b->n_needs : 1, sizeof *drops);
    Kvp__ReplicaDropItem **dp = calloc(b->n_needs ? b->n_needs : 1, sizeof *dp);
    Kvp__RepairEndItem *ends = calloc(b->n_needs ? b->n_needs : 1, sizeof *ends);
    Kvp__RepairEndItem **ep = calloc(b->n_needs ? b->n_needs : 1, sizeof *ep);
    if (!items || !ip || !drops || !dp || !ends || !ep)
        goto out;
    size_t n_items = 0, n_drops = 0, n_ends = 0;
    struct svc_map *seen_drop = &r->pass_seen_drop, *seen_stale = &r->pass_seen_stale;
    for (size_t i = 0; i < b->n_needs; i++) {
        const Kvp__RepairNeed *n = b->needs[i];
        if (!n->key)
            continue;
        if (n->kind == 0) {
            if (n_items >= START_BATCH || r->n_tasks + n_items >= MAX_TASKS ||
                has_task(r, n->key, 0, 0, true))
                continue;
            kvp__repair_item__init(&items[n_items]);
            items[n_items].key = n->key;
            items[n_items].src_segment_id = n->src_segment_id;
            ip[n_items] = &items[n_items];
            n_items++;
        } else if (n->kind == 1) {
            uint64_t h = pair_hash(n->key, n->drop_segment_id, 0), since = 0;
            svc_map_put(seen_drop, h, 1);
            if (!svc_map_get(&r->droppable, h, &since)) {
                svc_map_put(&r->droppable, h, now);
                continue;
            }
            if (now - since < lease || svc_in_election_grace(s))
                continue;
            kvp__replica_drop_item__init(&drops[n_drops]);
            drops[n_drops].key = n->key;
            drops[n_drops].segment_id = n->drop_segment_id;
            dp[n_drops] = &drops[n_drops];
            n_drops++;
        } else if (n->kind == 2) {
            if (has_task(r, n->key, n->drop_segment_id, n->offset, false))
                continue;
            uint64_t h = pair_hash(n->key, n->drop_segment_id, n->offset), since = 0;
            svc_map_put(seen_stale, h, 1);
            if (!svc_map_get(&r->stale, h, &since)) {
                svc_map_put(&r->stale, h, now);
                continue;
            }
            if (now - since < STALE_PENDING_MS)
                continue;
            kvp_log_warn(s->actor, "repair replica of %s on segment %u: no mover reported on it: freeing it",
                         n->key, n->drop_segment_id);
            kvp__repair_end_item__init(&ends[n_ends]);
            ends[n_ends].key = n->key;
            ends[n_ends].segment_id = n->drop_segment_id;
            ends[n_ends].offset = n->offset;
            ends[n_ends].ok = false;
            ep[n_ends] = &ends[n_ends];
            n_ends++;
        }
    }
    /* forget entries no longer reported in a whole pass (the scan list is bounded, so only when
     * no slice's list overflowed) */
    if (pass_done && !r->pass.full) {
        struct svc_map *keep[2] = {seen_drop, seen_stale};
        struct svc_map *tabs[2] = {&r->droppable, &r->stale};
        for (int t = 0; t < 2; t++) {
            size_t pos = 0;
            uint64_t k, v;
            uint64_t gone[256];
            size_t n_gone = 0;
            while (svc_map_next(tabs[t], &pos, &k, &v) && n_gone < 256)
                if (!svc_map_get(keep[t], k, NULL))
                    gone[n_gone++] = k;
            for (size_t g = 0; g < n_gone; g++)
                svc_map_del(tabs[t], gone[g], NULL);
        }
    }
    if (pass_done) {
        svc_map_clear(seen_drop);
        svc_map_clear(seen_stale);
    }
    if (n_items) {
        Kvp__RepairStartCmd body = KVP__REPAIR_START_CMD__INIT;
        body.items = ip;
        body.n_items = n_items;
        Kvp__Command cmd = KVP__COMMAND__INIT;
        cmd.body_case = KVP__COMMAND__BODY_REPAIR_START;
        cmd.repair_start = &body;
        r->start_inflight = true;
        struct svc_pending *p = svc_pending_new(s, NULL, NULL);
        if (p) {
            p->internal = SVC_INT_REPAIR_START;
            if (svc_submit(s, p, &cmd) != KVP_OK)
                r->start_inflight = false;
        } else {
            r->start_inflight = false;
        }
    }
    if (n_drops) {
        Kvp__ReplicaDropCmd body = KVP__REPLICA_DROP_CMD__INIT;
        body.items = dp;
        body.n_items = n_drops;
        Kvp__Command cmd = KVP__COMMAND__INIT;
        cmd.body_case = KVP__COMMAND__BODY_REPLICA_DROP;
        cmd.replica_drop = &body;
        submit(s, SVC_INT_REPLICA_DROP, &cmd);
        r->dropped += n_drops;
    }
    repair_end(s, ep, n_ends);
out:
    free(items);
    free(ip);
    free(drops);
    free(dp);
    free(ends);
    free(ep);
    log_progress(s, r, now);
}

static void on_start(struct kvp_master_service *s, struct svc_repair *r, const Kvp__RepairStartResp *b)
{
    uint64_t now = svc_now_ms();
    size_t no_space = 0;
    for (size_t i = 0; i < b->n_results; i++) {
        const Kvp__RepairStartResult *res = b->results[i];
        if (res->status == KVP_ERR_NO_SPACE)
            no_space++;
        if (res->status != KVP_OK || !res->target || !res->source || !res->key)
            continue;
        if (r->n_tasks == r->cap_tasks) {
            size_t cap = r->cap_tasks ? r->cap_tasks * 2 : 64;
            struct rtask **nt = realloc(r->tasks, cap * sizeof *nt);
            if (!nt)
                break;
            r->tasks = nt;
            r->cap_tasks = cap;
        }
        struct rtask *t = calloc(1, sizeof *t);
        uint8_t buf[1024];
        size_t len = kvp__replica__get_packed_size(res->target);
        if (!t || len > sizeof buf) {
            free(t);
            continue;
        }
        kvp__replica__pack(res->target, buf);
        t->target = kvp__replica__unpack(NULL, len, buf);
        t->key = strdup(res->key);
        if (!t->target || !t->key) {
            task_free(t);
            continue;
        }
        t->id = r->next_task++;
        t->key_hash = svc_key_hash(res->key);
        t->size = res->size;
        t->checksum = res->checksum;
        t->src_seg = res->source->segment_id;
        t->src_off = res->source->offset;
        t->created_ms = now;
        r->tasks[r->n_tasks++] = t;
    }
    if (no_space)
        kvp_log_debug(s->actor, "repair: %zu copies found no room", no_space);
}

void svc_repair_on_result(struct kvp_master_service *s, struct svc_pending *p, int status,
                          const Kvp__Response *resp)
{
    struct svc_repair *r = R(s);
    if (!r)
        return;
    int st = status != KVP_OK ? status : (resp ? resp->status : KVP_ERR_INTERNAL);
    switch (p->internal) {
    case SVC_INT_REPAIR_SCAN:
        if (!repair_scan_answered(&r->scan, p->repair_scan_ticket)) {
            /* sent before a reset (leadership lost, then won again): it walked a slice from the
             * old pass's cursor; the new leader's passes do not count it */
            kvp_log_debug(s->actor, "RepairScan: dropped the answer to query %llu, no longer awaited (sent before a "
                          "leadership change; %s; awaited: %llu)",
                          (unsigned long long)p->repair_scan_ticket, kvp_strerror(st),
                          (unsigned long long)r->scan.awaited);
            break;
        }
        if (st == KVP_OK && resp->body_case == KVP__RESPONSE__BODY_REPAIR_SCAN && resp->repair_scan &&
            s->is_leader) {
            r->scan_epoch = r->pass_epoch;
            on_scan(s, r, resp->repair_scan);
            if (!r->pass.in_pass) {
                /* A whole pass with no work of any kind (objects short of copies only because
                 * too few segments are ACTIVE are no work: a mount bumps the epoch). Removals do
                 * not move the epoch, but their backward shifts may have moved an object that
                 * needs work from ahead of a slice's cursor to behind it (repair_pass.h): then
                 * the verdict holds 10 idle periods, not until the epoch moves. */
                const Kvp__RepairScanResp *b = &r->last;
                bool clean = b->n_needs == 0 && b->in_flight == 0 && b->no_space == 0 && b->draining_objects == 0;
                r->clean_epoch = clean ? r->pass_epoch : 0;
                r->clean_until_ms =
                    (b->under_replicated || r->pass.moved) ? svc_now_ms() + 10u * SCAN_IDLE_MS : UINT64_MAX;
            }
        }
        else if (st != KVP_ERR_NOT_LEADER)
            kvp_log_debug(s->actor, "RepairScan: %s", kvp_strerror(st));
        break;
    case SVC_INT_REPAIR_START:
        r->start_inflight = false;
        if (st == KVP_OK && resp->body_case == KVP__RESPONSE__BODY_REPAIR_START && resp->repair_start &&
            s->is_leader)
            on_start(s, r, resp->repair_start);
        else if (st != KVP_ERR_NOT_LEADER)
            kvp_log_warn(s->actor, "RepairStart: %s", kvp_strerror(st));
        break;
    case SVC_INT_REPAIR_END:
    case SVC_INT_REPLICA_DROP:
        if (st != KVP_OK && st != KVP_ERR_NOT_LEADER)
            kvp_log_warn(s->actor, "%s: %s", p->internal == SVC_INT_REPAIR_END ? "RepairEnd" : "ReplicaDrop",
                         kvp_strerror(st));
        break;
    default:
        break;
    }
}

/* ------------------------------------------------------------------ MoverPoll */

static void account_rate(struct svc_repair *r, uint64_t now)
{
    if (!r->rate_t0_ms) {
        r->rate_t0_ms = now;
        r->rate_b0 = r->moved_bytes;
        return;
    }
    if (now - r->rate_t0_ms >= RATE_WINDOW_MS) {
        r->rate_bps = (double)(r->moved_bytes - r->rate_b0) * 1000.0 / (double)(now - r->rate_t0_ms);
        r->rate_t0_ms = now;
        r->rate_b0 = r->moved_bytes;
    }
}

void svc_repair_on_mover_poll(struct kvp_master_service *s, zframe_t *identity, const Kvp__Request *req)
{
    struct svc_repair *r = R(s);
    const Kvp__MoverPollReq *q = req->mover_poll;
    if (!r || !q || q->segment_id == 0) {
        svc_reply_status(s, identity, req->req_id, KVP_ERR_INVALID, "mover poll: no segment id");
        return;
    }
    uint64_t now = svc_now_ms();
    /* reports */
    if (q->n_done) {
        Kvp__RepairEndItem *ends = calloc(q->n_done, sizeof *ends);
        Kvp__RepairEndItem **ep = calloc(q->n_done, sizeof *ep);
        size_t n = 0;
        for (size_t i = 0; ends && ep && i < q->n_done; i++) {
            const Kvp__MoveDone *d = q->done[i];
            if (!d->key || !d->key[0])
                continue;
            uint64_t size = 0;
            for (size_t k = 0; k < r->n_tasks; k++)
                if (r->tasks[k]->id == d->task_id && strcmp(r->tasks[k]->key, d->key) == 0) {
                    size = r->tasks[k]->size;
                    task_del(r, k);
                    break;
                }
            kvp__repair_end_item__init(&ends[n]);
            ends[n].key = d->key;
            ends[n].segment_id = d->target_segment_id;
            ends[n].offset = d->target_offset;
            ends[n].ok = d->status == KVP_OK;
            ep[n] = &ends[n];
            n++;
            if (d->status == KVP_OK) {
                r->moved_objects++;
                r->moved_bytes += size;
            } else {
                r->failed_copies++;
                kvp_log_warn(s->actor, "segment %u: copy of %s to segment %u failed: %s", q->segment_id, d->key,
                             d->target_segment_id, kvp_strerror(d->status));
            }
        }
        repair_end(s, ep, n);
        free(ends);
        free(ep);
        account_rate(r, now);
    }
    Kvp__MoverPollResp body = KVP__MOVER_POLL_RESP__INIT;
    Kvp__MoveTask tasks[POLL_MAX_TASKS], *tp[POLL_MAX_TASKS];
    size_t want = q->max_tasks ? q->max_tasks : POLL_MAX_TASKS;
    if (want > POLL_MAX_TASKS)
        want = POLL_MAX_TASKS;
    /* bandwidth cap: a token bucket refilled at repair_bandwidth_bytes_per_s, burst 200 ms */
    uint64_t bw = s->cfg.repair_bandwidth_bytes_per_s;
    if (bw) {
        if (!r->tokens_ms)
            r->tokens_ms = now;
        r->tokens += (double)bw * (double)(now - r->tokens_ms) / 1000.0;
        r->tokens_ms = now;
        if (r->tokens > (double)bw / 5.0)
            r->tokens = (double)bw / 5.0;
    }
    if (s->is_leader) {
        for (size_t k = 0; k < r->n_tasks && body.n_tasks < want; k++) {
            struct rtask *t = r->tasks[k];
            if (t->src_seg != q->segment_id || (t->handed_ms && now - t->handed_ms < TASK_RESEND_MS))
                continue;
            if (bw && r->tokens <= 0)
                break;
            r->tokens -= (double)t->size;
            t->handed_ms = now;
            Kvp__MoveTask *m = &tasks[body.n_tasks];
            kvp__move_task__init(m);
            m->task_id = t->id;
            m->key = t->key;
            m->size = t->size;
            m->checksum = t->checksum;
            m->src_segment_id = t->src_seg;
            m->src_offset = t->src_off;
            m->target = t->target;
            tp[body.n_tasks++] = m;
        }
    }
    body.tasks = tp;
    Kvp__Response resp = KVP__RESPONSE__INIT;
    resp.body_case = KVP__RESPONSE__BODY_MOVER_POLL;
    resp.mover_poll = &body;
    if (!s->is_leader)
        svc_reply_status(s, identity, req->req_id, KVP_ERR_NOT_LEADER, "not the leader");
    else
        svc_reply(s, identity, req->req_id, &resp);
}

/* ------------------------------------------------------------------ probes and status */

void svc_repair_note_probe(struct kvp_master_service *s, uint32_t segment_id, int rc)
{
    struct svc_repair *r = R(s);
    if (!r)
        return;
    if (rc == KVP_OK)
        svc_map_del(&r->probe_failed, segment_id, NULL);
    else
        svc_map_put(&r->probe_failed, segment_id, svc_now_ms());
}

uint64_t svc_repair_probe_failed_at(struct kvp_master_service *s, uint32_t segment_id)
{
    struct svc_repair *r = R(s);
    uint64_t at = 0;
    return r && svc_map_get(&r->probe_failed, segment_id, &at) ? at : 0;
}

json_t *svc_repair_status(struct kvp_master_service *s)
{
    struct svc_repair *r = R(s);
    json_t *o = json_object();
    if (!r || !o)
        return o;
    const Kvp__RepairScanResp *b = &r->last;
    json_object_set_new(o, "draining_objects", json_integer((json_int_t)b->draining_objects));
    json_object_set_new(o, "draining_bytes", json_integer((json_int_t)b->draining_bytes));
    json_object_set_new(o, "under_replicated", json_integer((json_int_t)b->under_replicated));
    json_object_set_new(o, "no_space", json_integer((json_int_t)b->no_space));
    json_object_set_new(o, "only_on_draining", json_integer((json_int_t)b->lost_if_drained));
    json_object_set_new(o, "copies_in_flight", json_integer((json_int_t)r->n_tasks));
    json_object_set_new(o, "moved_objects", json_integer((json_int_t)r->moved_objects));
    json_object_set_new(o, "scans_run", json_integer((json_int_t)r->scans_run));
    json_object_set_new(o, "scans_skipped", json_integer((json_int_t)r->scans_skipped));
    json_object_set_new(o, "scan_passes", json_integer((json_int_t)r->passes));
    json_object_set_new(o, "moved_bytes", json_integer((json_int_t)r->moved_bytes));
    json_object_set_new(o, "failed_copies", json_integer((json_int_t)r->failed_copies));
    json_object_set_new(o, "dropped_replicas", json_integer((json_int_t)r->dropped));
    json_object_set_new(o, "rate_bytes_per_s", json_real(r->rate_bps));
    json_object_set_new(o, "bandwidth_cap_bytes_per_s",
                        json_integer((json_int_t)s->cfg.repair_bandwidth_bytes_per_s));
    json_object_set_new(o, "active_for_ms", json_integer(r->drain_started_ms ? (json_int_t)(svc_now_ms() -
                                                                                           r->drain_started_ms)
                                                                             : 0));
    return o;
}
