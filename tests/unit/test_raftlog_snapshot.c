/* test_raftlog_snapshot.c — incremental snapshots of the master FSM through raftlog's glue on
 * canonical raft's fixture (issue 22): builds a few KiB per step while the cluster commits,
 * catch-up by snapshot install with equal FSM digests, a snapshot built while a membership
 * change and a leadership transfer run, restore of a version-1 (pre-issue-22) snapshot, and
 * refusal of truncated or corrupted snapshots with the member then installing a good one from
 * its leader. Deterministic: fixture time only, no sleeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <raft.h>
#include <raft/fixture.h>

#include "actors/master/fsm/fsm.h"
#include "kvpool.h"
#include "raftlog/raftlog_internal.h"
#include "runtime/log.h"

#define MAXN 4

struct node {
    struct kvp_master_fsm *fsm;
    struct kvp_rl_glue glue;
    unsigned corrupt_next; /* restores still to corrupt before they reach the glue */
    unsigned refused;      /* restores the glue refused */
    uint64_t chain;        /* FNV-1a over every command applied, in order */
};

struct fx {
    struct raft_fixture f;
    struct node nodes[MAXN];
    unsigned n;
    uint64_t op;
};

static int (*glue_restore)(struct raft_fsm *, struct raft_buffer *);
static struct fx *cur_fx; /* for apply_chained: the node whose FSM is ctx */

/* The master FSM's apply, first chaining the command into its node's order hash: two nodes
 * that applied the same commands in the same order (from the same start) hold equal chains. */
static int apply_chained(void *ctx, const uint8_t *cmd, size_t len, uint8_t **res, size_t *res_len)
{
    for (unsigned i = 0; cur_fx != NULL && i < cur_fx->n; i++) {
        struct node *n = &cur_fx->nodes[i];
        if (n->fsm != ctx)
            continue;
        uint64_t h = n->chain ? n->chain : 1469598103934665603ull;
        for (size_t b = 0; b < len; b++)
            h = (h ^ cmd[b]) * 1099511628211ull;
        n->chain = h;
    }
    return kvp_master_fsm_apply_bytes(ctx, cmd, len, res, res_len);
}

static void on_deliver(void *ctx, uint64_t corr, int status, const uint8_t *r, size_t len)
{
    (void)ctx, (void)corr, (void)status, (void)r, (void)len;
}

/* A restore that flips a byte of the snapshot first (a bad disk or transfer), n times. */
static int restore_maybe_corrupt(struct raft_fsm *fsm, struct raft_buffer *buf)
{
    struct kvp_rl_glue *g = fsm->data;
    struct node *n = (struct node *)((char *)g - offsetof(struct node, glue));
    if (n->corrupt_next > 0) {
        n->corrupt_next--;
        ((uint8_t *)buf->base)[buf->len / 2] ^= 0x5a;
    }
    int rv = glue_restore(fsm, buf);
    if (rv != 0)
        n->refused++;
    return rv;
}

static void node_init(struct fx *x, unsigned i)
{
    struct node *n = &x->nodes[i];
    struct kvp_master_fsm_params p = {.fence_grace_ms = 100, .put_ttl_ms = 5000};
    assert_int_equal(kvp_master_fsm_new(&n->fsm, &p), KVP_OK);
    struct kvp_raftlog_fsm user = {.ctx = n->fsm,
                                   .apply = apply_chained,
                                   .query = kvp_master_fsm_query_bytes,
                                   .snapshot = kvp_master_fsm_snapshot_bytes,
                                   .restore = kvp_master_fsm_restore_bytes,
                                   .snap_begin = kvp_master_fsm_snap_begin_bytes,
                                   .snap_next = kvp_master_fsm_snap_next_bytes,
                                   .snap_abort = kvp_master_fsm_snap_abort_bytes,
                                   .restore_begin = kvp_master_fsm_restore_begin_bytes,
                                   .restore_step = kvp_master_fsm_restore_step_bytes,
                                   .restore_end = kvp_master_fsm_restore_end_bytes,
                                   .restore_drop = kvp_master_fsm_restore_drop_bytes};
    kvp_rl_glue_init(&n->glue, &user, on_deliver, n, "raftlog-snap-test");
    cur_fx = x;
    assert_true(n->glue.inc);
    n->glue.steps = true;             /* installs in steps, as raftlog does once raft runs */
    n->glue.restore_step_bytes = 512; /* many steps per install */
    glue_restore = n->glue.fsm.restore;
    n->glue.fsm.restore = restore_maybe_corrupt;
    n->glue.chunk_raw = 1024;     /* many steps per build */
    n->glue.base_threshold = 16;  /* entries between snapshots */
    n->glue.base_trailing = 4;
    assert_int_equal(raft_fixture_grow(&x->f, &n->glue.fsm), 0);
    struct raft *r = raft_fixture_get(&x->f, i);
    n->glue.raft = r;
    raft_set_snapshot_threshold(r, 0xFFFFFFFFu); /* as raftlog.c: the glue triggers builds */
    raft_set_snapshot_trailing(r, 4);
    x->n++;
}

static int setup(void **state)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    struct fx *x = calloc(1, sizeof(*x));
    assert_int_equal(raft_fixture_initialize(&x->f), 0);
    for (unsigned i = 0; i < 3; i++)
        node_init(x, i);
    struct raft_configuration conf;
    assert_int_equal(raft_fixture_configuration(&x->f, 3, &conf), 0);
    assert_int_equal(raft_fixture_bootstrap(&x->f, &conf), 0);
    raft_configuration_close(&conf);
    *state = x;
    return 0;
}

static int teardown(void **state)
{
    struct fx *x = *state;
    raft_fixture_close(&x->f);
    for (unsigned i = 0; i < x->n; i++) {
        kvp_rl_glue_fini(&x->nodes[i].glue);
        kvp_master_fsm_destroy(&x->nodes[i].fsm);
    }
    free(x);
    return 0;
}

/* One fixture step, then on every live node what raftlog does per loop iteration: a leader
 * that is behind catches up at once; otherwise one unit of catch-up work (an install step or a
 * deferred entry) or else one build step. */
static void step(struct fx *x)
{
    raft_fixture_step(&x->f);
    for (unsigned i = 0; i < x->n; i++) {
        if (!raft_fixture_alive(&x->f, i))
            continue;
        struct kvp_rl_glue *g = &x->nodes[i].glue;
        kvp_rl_glue_next_iteration(g);
        if (kvp_rl_glue_behind(g) && raft_state(raft_fixture_get(&x->f, i)) == RAFT_LEADER)
            assert_int_equal(kvp_rl_glue_catch_up(g), KVP_OK);
        if (kvp_rl_glue_catch_up_pending(g))
            assert_int_equal(kvp_rl_glue_catch_up_step(g, 0), KVP_OK);
        else
            kvp_rl_glue_snap_work(g);
    }
}

/* Step until no live node has catch-up work left (its FSM at raft's applied index). */
static void step_until_caught_up(struct fx *x)
{
    for (unsigned k = 0; k < 200000; k++) {
        bool any = false;
        for (unsigned i = 0; i < x->n; i++)
            if (raft_fixture_alive(&x->f, i) && kvp_rl_glue_catch_up_pending(&x->nodes[i].glue))
                any = true;
        if (!any)
            return;
        step(x);
    }
    fail_msg("catch-up did not finish");
}

static bool step_until_applied(struct fx *x, unsigned i, raft_index idx, unsigned max_ms)
{
    raft_time t0 = raft_fixture_time(&x->f);
    while (raft_fixture_time(&x->f) - t0 < max_ms) {
        bool ok = true;
        for (unsigned k = 0; k < x->n; k++)
            if ((i == x->n || k == i) && raft_last_applied(raft_fixture_get(&x->f, k)) < idx)
                ok = false;
        if (ok)
            return true;
        step(x);
    }
    return false;
}

/* ---- commands ---- */

static uint8_t *pack(Kvp__Command *c, size_t *len)
{
    *len = kvp__command__get_packed_size(c);
    uint8_t *b = malloc(*len + 1);
    kvp__command__pack(c, b);
    return b;
}

static uint8_t *cmd_mount(const char *name, size_t *len)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__MountSegmentReq m = KVP__MOUNT_SEGMENT_REQ__INIT;
    char ep[64];
    snprintf(ep, sizeof(ep), "%s:7000", name);
    m.name = (char *)name;
    m.host = (char *)name;
    m.endpoint = ep;
    m.size = 1ull << 32;
    m.owner_pid = 7;
    c.now_wall_ms = 1000;
    c.body_case = KVP__COMMAND__BODY_MOUNT;
    c.mount = &m;
    return pack(&c, len);
}

static uint8_t *cmd_put_start(const char *key, uint64_t op, size_t *len)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutStartReq q = KVP__PUT_START_REQ__INIT;
    Kvp__PutStartItem it = KVP__PUT_START_ITEM__INIT, *items[1] = {&it};
    it.key = (char *)key;
    it.size = 100 + op % 1000;
    it.replica_num = 2;
    it.op_id = op;
    q.n_items = 1;
    q.items = items;
    c.now_wall_ms = 2000 + op;
    c.term = 2;
    c.body_case = KVP__COMMAND__BODY_PUT_START;
    c.put_start = &q;
    return pack(&c, len);
}

static uint8_t *cmd_put_end(const char *key, uint64_t op, size_t *len)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__PutEndReq q = KVP__PUT_END_REQ__INIT;
    Kvp__PutEndItem it = KVP__PUT_END_ITEM__INIT, *items[1] = {&it};
    it.key = (char *)key;
    it.op_id = op;
    it.checksum = op * 0x9E3779B97F4A7C15ull;
    q.n_items = 1;
    q.items = items;
    c.now_wall_ms = 2000 + op;
    c.body_case = KVP__COMMAND__BODY_PUT_END;
    c.put_end = &q;
    return pack(&c, len);
}

static uint8_t *cmd_remove(const char *key, uint64_t now, size_t *len)
{
    Kvp__Command c = KVP__COMMAND__INIT;
    Kvp__RemoveReq q = KVP__REMOVE_REQ__INIT;
    char *keys[1] = {(char *)key};
    q.n_keys = 1;
    q.keys = keys;
    c.now_wall_ms = now;
    c.body_case = KVP__COMMAND__BODY_REMOVE;
    c.remove = &q;
    return pack(&c, len);
}

/* One entry from node i: k raw commands. Returns the entry's index. */
static raft_index propose_raw(struct fx *x, unsigned i, uint8_t **bufs, size_t *lens, unsigned k)
{
    struct kvp_rl_cmd cmds[16] = {{0}};
    uint64_t corrs[16] = {0};
    for (unsigned j = 0; j < k; j++) {
        cmds[j].data = bufs[j];
        cmds[j].len = lens[j];
        corrs[j] = ++x->op;
    }
    assert_int_equal(kvp_rl_glue_propose(&x->nodes[i].glue, corrs, cmds, k), KVP_OK);
    for (unsigned j = 0; j < k; j++)
        free(bufs[j]);
    return raft_last_index(raft_fixture_get(&x->f, i));
}

static raft_index mount2(struct fx *x, unsigned l)
{
    uint8_t *b[2];
    size_t n[2];
    b[0] = cmd_mount("seg-a", &n[0]);
    b[1] = cmd_mount("seg-b", &n[1]);
    return propose_raw(x, l, b, n, 2);
}

/* An entry of 4 puts (start + end each) of fresh keys, plus the removal of an older key. */
static raft_index put_batch(struct fx *x, unsigned l, unsigned *next_key)
{
    uint8_t *b[9];
    size_t n[9];
    unsigned k = 0;
    char key[64];
    for (unsigned j = 0; j < 4; j++) {
        unsigned id = (*next_key)++;
        snprintf(key, sizeof(key), "model/block-%06u", id);
        b[k] = cmd_put_start(key, 10 + id, &n[k]);
        k++;
        b[k] = cmd_put_end(key, 10 + id, &n[k]);
        k++;
    }
    if (*next_key > 20) {
        snprintf(key, sizeof(key), "model/block-%06u", *next_key - 17);
        b[k] = cmd_remove(key, 9000 + *next_key, &n[k]);
        k++;
    }
    return propose_raw(x, l, b, n, k);
}

/* Start the fixture, elect node 0 and mount two segments through it: the mount's index. */
static raft_index start_led_by_0(struct fx *x)
{
    assert_int_equal(raft_fixture_start(&x->f), 0);
    raft_fixture_elect(&x->f, 0);
    return mount2(x, 0);
}

/* n entries of put_batch from node l, each applied on l before the next: the last one's index. */
static raft_index put_batches(struct fx *x, unsigned l, unsigned n, unsigned *next_key)
{
    raft_index idx = 0;
    for (unsigned e = 0; e < n; e++) {
        idx = put_batch(x, l, next_key);
        assert_true(step_until_applied(x, l, idx, 5000));
    }
    return idx;
}

static void assert_digests_equal(struct fx *x)
{
    step_until_caught_up(x);
    uint64_t d0 = kvp_master_fsm_digest(x->nodes[0].fsm);
    for (unsigned i = 0; i < x->n; i++) {
        assert_int_equal(kvp_master_fsm_check(x->nodes[i].fsm), 0);
        assert_true(kvp_master_fsm_digest(x->nodes[i].fsm) == d0);
    }
}

/* ---- tests ---- */

/* A follower is down while the leader takes several incremental snapshots (each built over
 * many steps while entries keep committing, so each carries a log tail) and compacts its log;
 * revived under continuing writes, it catches up by installing one. Digests then agree. */
static void test_raftlog_snap_install_and_catch_up_under_writes(void **state)
{
    struct fx *x = *state;
    raft_index idx = start_led_by_0(x);
    unsigned key = 0;
    assert_true(step_until_applied(x, 3, idx, 5000));
    raft_fixture_kill(&x->f, 2);
    idx = put_batches(x, 0, 150, &key);
    assert_true(step_until_applied(x, 0, idx, 10000));
    struct kvp_rl_glue *g0 = &x->nodes[0].glue;
    print_message("leader: %llu snapshots, %llu tail entries in them\n", (unsigned long long)g0->snapshots_taken,
                  (unsigned long long)g0->snap_tail_entries);
    assert_true(g0->snapshots_taken >= 2);
    assert_true(g0->snap_tail_entries > g0->snapshots_taken); /* built while entries applied */
    assert_true(raft_fixture_get(&x->f, 0)->log.offset > 0); /* compacted */
    raft_fixture_revive(&x->f, 2);
    idx = put_batches(x, 0, 60, &key);
    assert_true(step_until_applied(x, 3, idx, 30000));
    assert_true(x->nodes[2].glue.snapshots_restored >= 1);
    assert_digests_equal(x);
    struct kvp_master_fsm_stats st;
    kvp_master_fsm_stats(x->nodes[2].fsm, &st);
    assert_true(st.objects > 500);
}

static void change_cb(struct raft_change *req, int status)
{
    *(int *)req->data = status;
}

static void transfer_cb(struct raft_transfer *req)
{
    *(int *)req->data = 1;
}

/* A build runs on the leader while a fourth member is added (as voter) and leadership is
 * handed to another member; writes go on throughout. The build finishes, a snapshot is taken,
 * the new member catches up (by snapshot install: the log was compacted) and all four agree. */
static void test_raftlog_snap_during_membership_change_and_transfer(void **state)
{
    struct fx *x = *state;
    raft_index idx = start_led_by_0(x);
    unsigned key = 0;
    idx = put_batches(x, 0, 40, &key);
    assert_true(step_until_applied(x, 3, idx, 10000));
    uint64_t taken0 = x->nodes[0].glue.snapshots_taken;
    /* A fresh build, many steps long, is running on the leader. */
    while (kvp_rl_glue_snap_pending(&x->nodes[0].glue))
        step(x);
    assert_int_equal(kvp_rl_glue_snap_start(&x->nodes[0].glue), KVP_OK);
    assert_true(kvp_rl_glue_snap_pending(&x->nodes[0].glue));
    node_init(x, 3); /* id 4, not in the configuration yet */
    assert_int_equal(raft_start(raft_fixture_get(&x->f, 3)), 0);
    struct raft *r0 = raft_fixture_get(&x->f, 0);
    struct raft_change add = {0}, assign = {0};
    int add_st = -1, assign_st = -1, moved = 0;
    add.data = &add_st;
    assign.data = &assign_st;
    assert_int_equal(raft_add(r0, &add, 4, "4", change_cb), 0);
    idx = put_batch(x, 0, &key);
    for (unsigned s = 0; s < 2000 && add_st == -1; s++)
        step(x);
    assert_int_equal(add_st, 0);
    assert_true(kvp_rl_glue_snap_pending(&x->nodes[0].glue) || x->nodes[0].glue.build == 2 ||
                x->nodes[0].glue.snapshots_taken > taken0);
    assert_int_equal(raft_assign(r0, &assign, 4, RAFT_VOTER, change_cb), 0);
    struct raft_transfer tr = {0};
    tr.data = &moved;
    assert_int_equal(raft_transfer(r0, &tr, 2, transfer_cb), 0);
    for (unsigned s = 0; s < 20000 && (assign_st == -1 || !moved); s++) {
        if (s % 3 == 0 && raft_state(r0) == RAFT_LEADER && r0->transfer == NULL)
            idx = put_batch(x, 0, &key);
        step(x);
    }
    assert_true(moved);
    print_message("assign during the transfer: %d\n", assign_st);
    assert_true(raft_fixture_step_until_has_leader(&x->f, 10000));
    unsigned l = raft_fixture_leader_index(&x->f);
    assert_int_equal(l, 1); /* the transfer target (id 2) leads */
    struct raft *rl = raft_fixture_get(&x->f, l);
    const struct raft_server *srv = NULL;
    for (unsigned i = 0; i < rl->configuration.n; i++)
        if (rl->configuration.servers[i].id == 4)
            srv = &rl->configuration.servers[i];
    assert_non_null(srv);
    if (srv->role != RAFT_VOTER) { /* the handover cut the promotion short: ask the new leader */
        struct raft_change again = {0};
        int st = -1;
        again.data = &st;
        int rv = RAFT_CANTCHANGE;
        for (unsigned s = 0; s < 20000 && rv == RAFT_CANTCHANGE; s++) { /* its own change settles first */
            rv = raft_assign(rl, &again, 4, RAFT_VOTER, change_cb);
            if (rv == RAFT_CANTCHANGE)
                step(x);
        }
        assert_int_equal(rv, 0);
        for (unsigned s = 0; s < 20000 && st == -1; s++)
            step(x);
        assert_int_equal(st, 0);
    }
    for (unsigned e = 0; e < 40; e++) {
        idx = put_batch(x, l, &key);
        assert_true(step_until_applied(x, l, idx, 5000));
    }
    assert_true(step_until_applied(x, 4, idx, 30000));
    assert_true(x->nodes[0].glue.snapshots_taken > taken0);
    assert_true(x->nodes[3].glue.snapshots_restored >= 1 || x->nodes[3].glue.entries_applied > 0);
    assert_digests_equal(x);
}

/* Frame a master snapshot as the pre-issue-22 code did: version-1 container (one LZ4 frame)
 * around kvp_master_fsm_snapshot's sorted bytes. Both codecs are kept unchanged for this. */
static struct kvp_master_fsm *old_state(uint8_t **v1, size_t *v1_len)
{
    struct kvp_master_fsm_params p = {.fence_grace_ms = 100, .put_ttl_ms = 5000};
    struct kvp_master_fsm *f = NULL;
    assert_int_equal(kvp_master_fsm_new(&f, &p), KVP_OK);
    size_t n;
    uint8_t *b = cmd_mount("seg-a", &n);
    uint8_t *res = NULL;
    size_t rl = 0;
    assert_int_equal(kvp_master_fsm_apply_bytes(f, b, n, &res, &rl), KVP_OK);
    free(b);
    free(res);
    for (unsigned i = 0; i < 500; i++) {
        char key[32];
        snprintf(key, sizeof(key), "old/%u", i);
        b = cmd_put_start(key, 1 + i, &n);
        assert_int_equal(kvp_master_fsm_apply_bytes(f, b, n, &res, &rl), KVP_OK);
        free(b);
        free(res);
        if (i % 5) {
            b = cmd_put_end(key, 1 + i, &n);
            assert_int_equal(kvp_master_fsm_apply_bytes(f, b, n, &res, &rl), KVP_OK);
            free(b);
            free(res);
        }
    }
    uint8_t *raw = NULL;
    size_t raw_len = 0;
    assert_int_equal(kvp_master_fsm_snapshot(f, &raw, &raw_len), KVP_OK);
    assert_int_equal(kvp_rl_snap_pack(raw, raw_len, v1, v1_len), KVP_OK);
    free(raw);
    assert_int_equal((*v1)[4], KVP_RL_SNAP_VERSION);
    return f;
}

/* An upgraded member restores a version-1 snapshot (through raft's fixture at start, as at a
 * restart from an old data dir), then serves and snapshots in version 2. */
static void test_raftlog_snap_restores_version1(void **state)
{
    struct fx *x = *state;
    uint8_t *v1 = NULL;
    size_t v1_len = 0;
    struct kvp_master_fsm *old = old_state(&v1, &v1_len);
    for (unsigned i = 0; i < 3; i++) {
        struct raft_snapshot *s = raft_malloc(sizeof(*s));
        memset(s, 0, sizeof(*s));
        s->index = 1;
        s->term = 1;
        assert_int_equal(raft_fixture_configuration(&x->f, 3, &s->configuration), 0);
        s->configuration_index = 1;
        s->bufs = raft_malloc(sizeof(*s->bufs));
        s->n_bufs = 1;
        s->bufs[0].base = raft_malloc(v1_len);
        s->bufs[0].len = v1_len;
        memcpy(s->bufs[0].base, v1, v1_len);
        raft_fixture_set_snapshot(&x->f, i, s);
    }
    assert_int_equal(raft_fixture_start(&x->f), 0);
    for (unsigned i = 0; i < 3; i++) {
        assert_int_equal(x->nodes[i].glue.snapshots_restored, 1);
        assert_true(kvp_master_fsm_digest(x->nodes[i].fsm) == kvp_master_fsm_digest(old));
    }
    raft_fixture_elect(&x->f, 0);
    unsigned key = 1000;
    raft_index idx = 0;
    idx = put_batches(x, 0, 40, &key);
    assert_true(step_until_applied(x, 3, idx, 10000));
    assert_true(x->nodes[0].glue.snapshots_taken >= 1);
    assert_digests_equal(x);
    free(v1);
    kvp_master_fsm_destroy(&old);
}

/* Take a version-2 snapshot of node i by hand (build + raft's snapshot callback). */
static uint8_t *take_v2(struct fx *x, unsigned i, size_t *len)
{
    struct kvp_rl_glue *g = &x->nodes[i].glue;
    assert_int_equal(kvp_rl_glue_snap_start(g), KVP_OK);
    while (kvp_rl_glue_snap_pending(g))
        assert_int_equal(kvp_rl_glue_snap_work(g), KVP_OK);
    struct raft_buffer *bufs = NULL;
    unsigned n = 0;
    assert_int_equal(g->fsm.snapshot(&g->fsm, &bufs, &n), 0);
    size_t total = 0;
    for (unsigned k = 0; k < n; k++)
        total += bufs[k].len;
    uint8_t *out = malloc(total);
    size_t off = 0;
    for (unsigned k = 0; k < n; k++) {
        memcpy(out + off, bufs[k].base, bufs[k].len);
        off += bufs[k].len;
    }
    g->fsm.snapshot_finalize(&g->fsm, &bufs, &n);
    *len = total;
    return out;
}

static int restore_copy(struct node *n, const uint8_t *b, size_t len)
{
    struct raft_buffer buf = {.base = raft_malloc(len ? len : 1), .len = len};
    memcpy(buf.base, b, len);
    int rv = glue_restore(&n->glue.fsm, &buf);
    if (rv != 0)
        raft_free(buf.base); /* on success the FSM side freed it */
    return rv;
}

/* A follower far behind installs the leader's snapshot in steps: the install is accepted at
 * once (checks only), its chunks are decompressed and the new state built over many loop
 * iterations while entries keep committing (queued behind it, with the snapshot's log tail);
 * until the swap the follower's state is exactly what it was. Digests then agree. */
static void test_raftlog_snap_install_in_steps(void **state)
{
    struct fx *x = *state;
    raft_index idx = start_led_by_0(x);
    unsigned key = 0;
    assert_true(step_until_applied(x, 3, idx, 5000));
    raft_fixture_kill(&x->f, 2);
    idx = put_batches(x, 0, 150, &key);
    assert_true(raft_fixture_get(&x->f, 0)->log.offset > 0); /* compacted: an install is needed */
    struct kvp_rl_glue *g2 = &x->nodes[2].glue;
    uint64_t before = kvp_master_fsm_digest(x->nodes[2].fsm);
    raft_fixture_revive(&x->f, 2);
    unsigned staged = 0, max_queue = 0;
    for (unsigned e = 0; e < 60 || g2->restores_in_steps == 0; e++) {
        assert_true(e < 3000);
        idx = put_batch(x, 0, &key);
        for (unsigned k = 0; k < 4; k++) {
            step(x);
            if (g2->rs == 1 || g2->rs == 2) {
                staged++;
                assert_true(kvp_master_fsm_digest(x->nodes[2].fsm) == before);
                if (g2->q_len > max_queue)
                    max_queue = (unsigned)g2->q_len;
            }
        }
    }
    assert_true(step_until_applied(x, 3, idx, 30000));
    print_message("follower: install over %u steps, %u entries queued behind it at most, %llu deferred applies\n",
                  staged, max_queue, (unsigned long long)g2->entries_deferred);
    assert_true(staged > 10);
    assert_true(max_queue > 0);
    assert_true(g2->restores_in_steps >= 1);
    assert_true(g2->snapshots_restored == g2->restores_in_steps);
    assert_digests_equal(x);
    assert_int_equal(g2->rs, 0);
}

/* A follower that missed many entries (no snapshot in between) is sent them at once; with an
 * apply budget of 1 us per loop iteration it applies the first and defers the rest to later
 * iterations, in order. Digests then agree. */
static void test_raftlog_lagging_follower_applies_in_steps(void **state)
{
    struct fx *x = *state;
    for (unsigned i = 0; i < x->n; i++)
        x->nodes[i].glue.base_threshold = 100000; /* no snapshot: the follower replays the log */
    x->nodes[2].glue.apply_budget_us = 1;
    raft_index idx = start_led_by_0(x);
    unsigned key = 0;
    assert_true(step_until_applied(x, 3, idx, 5000));
    raft_fixture_kill(&x->f, 2);
    idx = put_batches(x, 0, 100, &key);
    raft_fixture_revive(&x->f, 2);
    assert_true(step_until_applied(x, 3, idx, 30000));
    struct kvp_rl_glue *g2 = &x->nodes[2].glue;
    print_message("follower: %llu of %llu entries deferred to a later loop iteration\n",
                  (unsigned long long)g2->entries_deferred, (unsigned long long)g2->entries_applied);
    assert_true(g2->entries_deferred > 0);
    assert_int_equal(g2->snapshots_restored, 0);
    assert_digests_equal(x);

    /* The memory bound: with it at 1 byte the follower holds one queued entry at most; each
     * arrival applies the queued one first (inside raft's callback), however many arrive. */
    g2->defer_max_bytes = 1;
    raft_fixture_kill(&x->f, 2);
    idx = put_batches(x, 0, 60, &key);
    raft_fixture_revive(&x->f, 2);
    uint64_t deferred0 = g2->entries_deferred, max_q = 0;
    for (unsigned k = 0; k < 200000 && raft_last_applied(raft_fixture_get(&x->f, 2)) < idx; k++) {
        step(x);
        if (g2->q_len > max_q)
            max_q = g2->q_len;
    }
    print_message("memory bound: %llu more deferred, at most %llu queued, %llu applied at once\n",
                  (unsigned long long)(g2->entries_deferred - deferred0), (unsigned long long)max_q,
                  (unsigned long long)g2->max_backlog_applied);
    assert_true(max_q <= 1);
    assert_true(g2->entries_deferred > deferred0);
    assert_true(g2->max_backlog_applied >= 1);
    assert_digests_equal(x);
    assert_true(x->nodes[2].chain == x->nodes[0].chain);

    /* A burst (session 31, issue 22): a revived follower is handed the entries it missed in a
     * few callbacks. With the time bound at about 8 entries' apply time and no memory bound,
     * no arrival applies queued entries inside the callback any more (before, each arrival at
     * the bound did, so the burst was applied in that one loop iteration: 320 entries, 1,031 ms
     * of CPU after a failover restart). Here a loop iteration applies at most one entry inline
     * (the 1 us budget) plus the one unit step() does, the queue takes the burst past the time
     * bound, and the entries are applied in the leader's order. */
    g2->defer_max_bytes = 0;
    g2->max_backlog_applied = 0;
    g2->defer_max_us = 8 * (g2->apply_mean_us > 0 ? g2->apply_mean_us : 1);
    raft_fixture_kill(&x->f, 2);
    idx = put_batches(x, 0, 60, &key);
    step_until_caught_up(x);
    g2->max_iter_applied = 0;
    raft_fixture_revive(&x->f, 2);
    max_q = 0;
    unsigned raised = 0; /* iterations whose idle step would get half the bound (raftlog.c) */
    for (unsigned k = 0; k < 200000 && raft_last_applied(raft_fixture_get(&x->f, 2)) < idx; k++) {
        step(x);
        if (g2->q_len > max_q)
            max_q = g2->q_len;
        if (kvp_rl_glue_catch_up_budget_us(g2, 1) == g2->defer_max_us / 2)
            raised++;
    }
    uint64_t iter_max = g2->max_iter_applied;
    step_until_caught_up(x);
    print_message("burst: %llu queued at most, at most %llu entries applied in one loop iteration "
                  "(%llu over the whole catch-up), %llu applied inside a callback at once\n",
                  (unsigned long long)max_q, (unsigned long long)iter_max,
                  (unsigned long long)g2->max_iter_applied, (unsigned long long)g2->max_backlog_applied);
    assert_true(max_q > 8); /* past the time bound: the burst was not applied on arrival */
    assert_true(g2->defer_max_us >= 8 && raised > 0);
    assert_true(iter_max >= 1);
    assert_true(iter_max <= 2);
    assert_true(g2->max_iter_applied <= 2);
    assert_int_equal(g2->max_backlog_applied, 0);
    assert_true(kvp_rl_glue_catch_up_budget_us(g2, 1) == 1); /* caught up: the usual step again */
    assert_digests_equal(x);
    assert_true(x->nodes[2].chain == x->nodes[0].chain);
    assert_int_equal(g2->snapshots_restored, 0);
}

/* A snapshot() that writes the state with one byte of it flipped: the container built around
 * it is intact (its checksums are computed over the damaged bytes), the state inside is not. */
static int snapshot_damaged(void *ctx, uint8_t **buf, size_t *len)
{
    int rc = kvp_master_fsm_snapshot(ctx, buf, len);
    if (rc == KVP_OK && *len > 0)
        (*buf)[*len / 2] ^= 0x01;
    return rc;
}

static void staged_node_init(struct node *n)
{
    struct kvp_master_fsm_params p = {.fence_grace_ms = 100, .put_ttl_ms = 5000};
    memset(n, 0, sizeof(*n));
    assert_int_equal(kvp_master_fsm_new(&n->fsm, &p), KVP_OK);
    struct kvp_raftlog_fsm user = {.ctx = n->fsm, .apply = kvp_master_fsm_apply_bytes,
                                   .snapshot = kvp_master_fsm_snapshot_bytes, .restore = kvp_master_fsm_restore_bytes,
                                   .restore_begin = kvp_master_fsm_restore_begin_bytes,
                                   .restore_step = kvp_master_fsm_restore_step_bytes,
                                   .restore_end = kvp_master_fsm_restore_end_bytes,
                                   .restore_drop = kvp_master_fsm_restore_drop_bytes};
    kvp_rl_glue_init(&n->glue, &user, on_deliver, n, "probe-steps");
    n->glue.steps = true;
    n->glue.restore_step_bytes = 256;
}

/* The same refusals on a member that installs in steps: a damaged container is refused before
 * raft counts it installed, with nothing staged; the intact one is accepted with the state
 * untouched, then built over many steps to the leader's digest. A container whose checks pass
 * around damaged state bytes is accepted, fails in its first FSM step, leaves the state as it
 * was and applies nothing more (raftlog then stops the member). */
static void staged_probe(const uint8_t *good, size_t len, uint64_t want, struct kvp_master_fsm *src)
{
    struct node sp;
    staged_node_init(&sp);
    uint64_t empty = kvp_master_fsm_digest(sp.fsm);
    size_t cuts[] = {0, 5, 36, 40, len / 2, len - 1};
    for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
        assert_int_equal(restore_copy(&sp, good, cuts[c]), RAFT_MALFORMED);
        assert_false(kvp_rl_glue_catch_up_pending(&sp.glue));
    }
    size_t flips[] = {9, 30, 40, 60, len / 2, len - 1};
    for (size_t c = 0; c < sizeof(flips) / sizeof(flips[0]); c++) {
        uint8_t *bad = malloc(len);
        memcpy(bad, good, len);
        bad[flips[c]] ^= 0x10;
        assert_int_equal(restore_copy(&sp, bad, len), RAFT_MALFORMED);
        assert_false(kvp_rl_glue_catch_up_pending(&sp.glue));
        free(bad);
    }
    assert_true(kvp_master_fsm_digest(sp.fsm) == empty);
    assert_int_equal(restore_copy(&sp, good, len), 0);
    assert_true(kvp_rl_glue_behind(&sp.glue));
    assert_true(kvp_master_fsm_digest(sp.fsm) == empty); /* accepted, not yet applied */
    unsigned steps = 0;
    while (kvp_rl_glue_behind(&sp.glue)) {
        assert_int_equal(kvp_rl_glue_catch_up_step(&sp.glue, 0), KVP_OK);
        if (kvp_rl_glue_behind(&sp.glue))
            assert_true(kvp_master_fsm_digest(sp.fsm) == empty);
        steps++;
    }
    print_message("staged install: %u steps\n", steps);
    assert_true(steps > 5);
    assert_true(kvp_master_fsm_digest(sp.fsm) == want);
    assert_int_equal(kvp_master_fsm_check(sp.fsm), 0);
    while (kvp_rl_glue_catch_up_pending(&sp.glue)) /* the replaced (empty) state is freed */
        assert_int_equal(kvp_rl_glue_catch_up_step(&sp.glue, 0), KVP_OK);

    /* Damaged state bytes in an intact container. */
    struct node src_node;
    memset(&src_node, 0, sizeof(src_node));
    struct kvp_raftlog_fsm user = {.ctx = src, .apply = kvp_master_fsm_apply_bytes, .snapshot = snapshot_damaged,
                                   .restore = kvp_master_fsm_restore_bytes};
    kvp_rl_glue_init(&src_node.glue, &user, on_deliver, &src_node, "damaged-source");
    struct raft_buffer *bufs = NULL;
    unsigned nb = 0;
    assert_int_equal(src_node.glue.fsm.snapshot(&src_node.glue.fsm, &bufs, &nb), 0);
    size_t blen = 0;
    for (unsigned k = 0; k < nb; k++)
        blen += bufs[k].len;
    uint8_t *bad = malloc(blen);
    size_t off = 0;
    for (unsigned k = 0; k < nb; k++) {
        memcpy(bad + off, bufs[k].base, bufs[k].len);
        off += bufs[k].len;
    }
    src_node.glue.fsm.snapshot_finalize(&src_node.glue.fsm, &bufs, &nb);
    kvp_rl_glue_fini(&src_node.glue);
    const char *why = NULL;
    assert_int_equal(kvp_rl_snap_check(bad, blen, &why), KVP_OK); /* the container is intact */
    assert_int_equal(restore_copy(&sp, bad, blen), 0);
    int rc = KVP_OK;
    for (unsigned k = 0; k < 100000 && rc == KVP_OK && kvp_rl_glue_catch_up_pending(&sp.glue); k++)
        rc = kvp_rl_glue_catch_up_step(&sp.glue, 0);
    assert_int_equal(rc, KVP_ERR_MALFORMED);
    assert_true(sp.glue.failed);
    assert_non_null(strstr(sp.glue.failed_why, "checksum"));
    assert_true(kvp_master_fsm_digest(sp.fsm) == want);
    size_t cl = 0;
    uint8_t *cmd = cmd_mount("seg-late", &cl);
    struct kvp_rl_cmd one = {.data = cmd, .len = cl};
    size_t esz = kvp_rl_entry_size(&one, 1), ew = 0;
    uint8_t *entry = malloc(esz);
    assert_int_equal(kvp_rl_entry_encode(entry, esz, &one, 1, &ew), KVP_OK);
    struct raft_buffer eb = {.base = entry, .len = ew};
    void *res = NULL;
    assert_int_equal(sp.glue.fsm.apply(&sp.glue.fsm, &eb, &res), 0);
    assert_true(kvp_master_fsm_digest(sp.fsm) == want); /* nothing applied after the failure */
    free(entry);
    free(cmd);
    free(bad);
    kvp_rl_glue_fini(&sp.glue);
    kvp_master_fsm_destroy(&sp.fsm);
}

/* Truncated, bit-flipped (header, chunk, log tail) and lengthened snapshots are refused with
 * RAFT_MALFORMED and the state is left as it was; the intact one restores. Then a follower
 * whose first installs arrive corrupted refuses them and recovers from its leader's next try. */
static void test_raftlog_snap_corrupt_refused_then_recovered_from_peer(void **state)
{
    struct fx *x = *state;
    raft_index idx = start_led_by_0(x);
    unsigned key = 0;
    idx = put_batches(x, 0, 30, &key);
    assert_true(step_until_applied(x, 3, idx, 10000));
    /* A build with a log tail: entries applied while it ran. */
    struct kvp_rl_glue *g0 = &x->nodes[0].glue;
    while (kvp_rl_glue_snap_pending(g0))
        step(x);
    size_t len = 0;
    uint8_t *good = take_v2(x, 0, &len);
    uint64_t want = kvp_master_fsm_digest(x->nodes[0].fsm);
    const char *why = NULL;
    assert_int_equal(kvp_rl_snap_check(good, len, &why), KVP_OK);

    struct kvp_master_fsm_params p = {.fence_grace_ms = 100, .put_ttl_ms = 5000};
    struct node probe;
    memset(&probe, 0, sizeof(probe));
    assert_int_equal(kvp_master_fsm_new(&probe.fsm, &p), KVP_OK);
    struct kvp_raftlog_fsm user = {.ctx = probe.fsm, .apply = kvp_master_fsm_apply_bytes,
                                   .snapshot = kvp_master_fsm_snapshot_bytes, .restore = kvp_master_fsm_restore_bytes};
    kvp_rl_glue_init(&probe.glue, &user, on_deliver, &probe, "probe");
    uint64_t empty = kvp_master_fsm_digest(probe.fsm);
    size_t cuts[] = {0, 4, 5, 20, 36, 37, 40, len / 3, len / 2, len - 13, len - 1};
    for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
        assert_int_equal(kvp_rl_snap_check(good, cuts[c], &why), KVP_ERR_MALFORMED);
        assert_int_equal(restore_copy(&probe, good, cuts[c]), RAFT_MALFORMED);
        assert_true(kvp_master_fsm_digest(probe.fsm) == empty);
    }
    size_t flips[] = {0, 4, 9, 14, 30, 36, 40, 60, len / 2, len - 20, len - 1};
    for (size_t c = 0; c < sizeof(flips) / sizeof(flips[0]); c++) {
        uint8_t *bad = malloc(len);
        memcpy(bad, good, len);
        bad[flips[c]] ^= 0x10;
        int rc = kvp_rl_snap_check(bad, len, &why);
        assert_true(rc == KVP_ERR_MALFORMED || rc == KVP_ERR_VERSION);
        assert_int_equal(restore_copy(&probe, bad, len), RAFT_MALFORMED);
        assert_true(kvp_master_fsm_digest(probe.fsm) == empty);
        free(bad);
    }
    uint8_t *longer = malloc(len + 8);
    memcpy(longer, good, len);
    memset(longer + len, 0, 8);
    assert_int_equal(restore_copy(&probe, longer, len + 8), RAFT_MALFORMED);
    free(longer);
    assert_int_equal(restore_copy(&probe, good, len), 0);
    assert_true(kvp_master_fsm_digest(probe.fsm) == want);
    kvp_rl_glue_fini(&probe.glue);
    kvp_master_fsm_destroy(&probe.fsm);
    staged_probe(good, len, want, x->nodes[0].fsm);
    free(good);

    /* Node 2 misses enough to need an install; its first two arrive corrupted. */
    raft_fixture_kill(&x->f, 2);
    idx = put_batches(x, 0, 80, &key);
    assert_true(step_until_applied(x, 0, idx, 10000));
    x->nodes[2].corrupt_next = 2;
    raft_fixture_revive(&x->f, 2);
    assert_true(step_until_applied(x, 3, idx, 200000));
    print_message("follower: %u installs refused, %llu restored\n", x->nodes[2].refused,
                  (unsigned long long)x->nodes[2].glue.snapshots_restored);
    assert_int_equal(x->nodes[2].refused, 2);
    assert_true(x->nodes[2].glue.snapshots_restored >= 1);
    assert_digests_equal(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_raftlog_snap_install_and_catch_up_under_writes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_raftlog_snap_during_membership_change_and_transfer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_raftlog_snap_restores_version1, setup, teardown),
        cmocka_unit_test_setup_teardown(test_raftlog_snap_install_in_steps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_raftlog_lagging_follower_applies_in_steps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_raftlog_snap_corrupt_refused_then_recovered_from_peer, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
