/* test_raftlog_fixture.c — raftlog's FSM glue (group entries, per-command results, LZ4
 * snapshots) driven by canonical raft's in-memory fixture: elect, apply, depose, kill,
 * partition, catch-up by snapshot. Deterministic: fixture time only, no sleeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <raft.h>
#include <raft/fixture.h>

#include "kvpool.h"
#include "raftlog/raftlog_internal.h"
#include "runtime/log.h"

#define N 3
#define MAX_RES 256

/* A counter FSM: a command is a u64 to add; the result is the count of commands so far. */
struct counter {
    uint64_t count;
    uint64_t sum;
    uint64_t restores;
};

static int c_apply(void *ctx, const uint8_t *cmd, size_t len, uint8_t **res, size_t *res_len)
{
    struct counter *c = ctx;
    uint64_t v = 0;
    if (len != sizeof(v))
        return KVP_ERR_INVALID; /* an error result, still "applied" */
    memcpy(&v, cmd, sizeof(v));
    c->count++;
    c->sum += v;
    *res = malloc(sizeof(uint64_t));
    memcpy(*res, &c->count, sizeof(uint64_t));
    *res_len = sizeof(uint64_t);
    return KVP_OK;
}

static int c_snapshot(void *ctx, uint8_t **buf, size_t *len)
{
    struct counter *c = ctx;
    *buf = malloc(16);
    memcpy(*buf, &c->count, 8);
    memcpy(*buf + 8, &c->sum, 8);
    *len = 16;
    return KVP_OK;
}

static int c_restore(void *ctx, const uint8_t *buf, size_t len)
{
    struct counter *c = ctx;
    if (len != 16)
        return KVP_ERR_MALFORMED;
    memcpy(&c->count, buf, 8);
    memcpy(&c->sum, buf + 8, 8);
    c->restores++;
    return KVP_OK;
}

struct result {
    uint64_t corr;
    int status;
    uint64_t value;
};

struct node {
    struct counter fsm;
    struct kvp_rl_glue glue;
    struct result res[MAX_RES];
    unsigned n_res;
};

struct fx {
    struct raft_fixture f;
    struct node nodes[N];
};

static void on_deliver(void *ctx, uint64_t corr, int status, const uint8_t *r, size_t len)
{
    struct node *n = ctx;
    assert_true(n->n_res < MAX_RES);
    struct result *x = &n->res[n->n_res++];
    x->corr = corr;
    x->status = status;
    x->value = 0;
    if (r != NULL && len == 8)
        memcpy(&x->value, r, 8);
}

static int setup(void **state)
{
    kvp_log_set_level(KVP_LOG_WARN);
    struct fx *x = calloc(1, sizeof(*x));
    assert_int_equal(raft_fixture_initialize(&x->f), 0);
    for (unsigned i = 0; i < N; i++) {
        struct node *n = &x->nodes[i];
        struct kvp_raftlog_fsm user = {.ctx = &n->fsm, .apply = c_apply, .snapshot = c_snapshot,
                                       .restore = c_restore};
        kvp_rl_glue_init(&n->glue, &user, on_deliver, n, "raftlog-test");
        assert_int_equal(raft_fixture_grow(&x->f, &n->glue.fsm), 0);
        n->glue.raft = raft_fixture_get(&x->f, i);
    }
    struct raft_configuration conf;
    assert_int_equal(raft_fixture_configuration(&x->f, N, &conf), 0);
    assert_int_equal(raft_fixture_bootstrap(&x->f, &conf), 0);
    raft_configuration_close(&conf);
    *state = x;
    return 0;
}

static int teardown(void **state)
{
    struct fx *x = *state;
    raft_fixture_close(&x->f);
    for (unsigned i = 0; i < N; i++)
        kvp_rl_glue_fini(&x->nodes[i].glue);
    free(x);
    return 0;
}

static void start(struct fx *x)
{
    assert_int_equal(raft_fixture_start(&x->f), 0);
}

/* Propose values base..base+k-1 as ONE entry from node i with corrs base..; returns its index. */
static raft_index propose(struct fx *x, unsigned i, uint64_t base, unsigned k, int expect)
{
    uint64_t vals[64], corrs[64];
    struct kvp_rl_cmd cmds[64];
    for (unsigned j = 0; j < k; j++) {
        vals[j] = base + j;
        corrs[j] = base + j;
        cmds[j].data = (const uint8_t *)&vals[j];
        cmds[j].len = sizeof(uint64_t);
    }
    assert_int_equal(kvp_rl_glue_propose(&x->nodes[i].glue, corrs, cmds, k), expect);
    return raft_last_index(raft_fixture_get(&x->f, i));
}

static void test_raftlog_fixture_group_entry_applied_everywhere(void **state)
{
    struct fx *x = *state;
    start(x);
    raft_fixture_elect(&x->f, 0);
    raft_index idx = propose(x, 0, 100, 5, KVP_OK);
    assert_int_equal(x->nodes[0].glue.n_inflight, 1);
    assert_true(raft_fixture_step_until_applied(&x->f, N, idx, 5000));
    for (unsigned i = 0; i < N; i++) {
        assert_int_equal(x->nodes[i].fsm.count, 5);
        assert_int_equal(x->nodes[i].fsm.sum, 100 + 101 + 102 + 103 + 104);
        assert_int_equal(x->nodes[i].glue.entries_applied, 1);
    }
    /* the proposer got one result per command, in order; followers got none */
    struct node *l = &x->nodes[0];
    assert_int_equal(l->n_res, 5);
    for (unsigned j = 0; j < 5; j++) {
        assert_int_equal(l->res[j].corr, 100 + j);
        assert_int_equal(l->res[j].status, KVP_OK);
        assert_int_equal(l->res[j].value, j + 1);
    }
    assert_int_equal(x->nodes[1].n_res, 0);
    assert_int_equal(x->nodes[2].n_res, 0);
    raft_fixture_step_n(&x->f, 10); /* let the apply callback run */
    assert_int_equal(l->glue.n_inflight, 0);
    /* a follower refuses to propose: nothing is delivered */
    propose(x, 1, 7, 1, KVP_ERR_NOT_LEADER);
    assert_int_equal(x->nodes[1].n_res, 0);
    assert_int_equal(x->nodes[1].glue.n_inflight, 0);
}

static void test_raftlog_fixture_fsm_error_is_result(void **state)
{
    struct fx *x = *state;
    start(x);
    raft_fixture_elect(&x->f, 0);
    uint8_t bad[3] = {1, 2, 3};
    uint64_t good = 5, corrs[2] = {1, 2};
    struct kvp_rl_cmd cmds[2] = {{bad, 3}, {(const uint8_t *)&good, 8}};
    assert_int_equal(kvp_rl_glue_propose(&x->nodes[0].glue, corrs, cmds, 2), KVP_OK);
    raft_index idx = raft_last_index(raft_fixture_get(&x->f, 0));
    assert_true(raft_fixture_step_until_applied(&x->f, N, idx, 5000));
    assert_int_equal(x->nodes[0].n_res, 2);
    assert_int_equal(x->nodes[0].res[0].status, KVP_ERR_INVALID);
    assert_int_equal(x->nodes[0].res[1].status, KVP_OK);
    for (unsigned i = 0; i < N; i++)
        assert_int_equal(x->nodes[i].fsm.count, 1);
}

static void test_raftlog_fixture_depose_fails_inflight_not_leader(void **state)
{
    struct fx *x = *state;
    start(x);
    raft_fixture_elect(&x->f, 0);
    raft_index first = propose(x, 0, 1, 1, KVP_OK);
    assert_true(raft_fixture_step_until_applied(&x->f, N, first, 5000));
    x->nodes[0].n_res = 0;
    /* proposed, then the leader loses its quorum before the entry commits */
    propose(x, 0, 10, 3, KVP_OK);
    raft_fixture_depose(&x->f);
    assert_true(raft_fixture_step_until_has_no_leader(&x->f, 10000) ||
                raft_state(raft_fixture_get(&x->f, 0)) != RAFT_LEADER);
    raft_fixture_step_until_elapsed(&x->f, 100);
    struct node *l = &x->nodes[0];
    /* each command of the entry got exactly one answer: applied (it may have committed
     * before the step-down) or NOT_LEADER */
    assert_int_equal(l->n_res, 3);
    for (unsigned j = 0; j < 3; j++) {
        assert_int_equal(l->res[j].corr, 10 + j);
        assert_true(l->res[j].status == KVP_ERR_NOT_LEADER || l->res[j].status == KVP_OK);
    }
    assert_int_equal(l->glue.n_inflight, 0);
}

static bool other_leads(struct raft_fixture *f, void *arg)
{
    unsigned dead = *(unsigned *)arg;
    for (unsigned i = 0; i < N; i++)
        if (i != dead && raft_state(raft_fixture_get(f, i)) == RAFT_LEADER)
            return true;
    return false;
}

static void test_raftlog_fixture_kill_leader_new_leader_applies(void **state)
{
    struct fx *x = *state;
    start(x);
    raft_fixture_elect(&x->f, 0);
    raft_index idx = propose(x, 0, 1, 4, KVP_OK);
    assert_true(raft_fixture_step_until_applied(&x->f, N, idx, 5000));
    raft_fixture_kill(&x->f, 0);
    unsigned dead = 0;
    assert_true(raft_fixture_step_until(&x->f, other_leads, &dead, 10000));
    unsigned l = raft_state(raft_fixture_get(&x->f, 1)) == RAFT_LEADER ? 1 : 2;
    assert_int_equal(raft_state(raft_fixture_get(&x->f, l)), RAFT_LEADER);
    idx = propose(x, l, 50, 2, KVP_OK);
    assert_true(raft_fixture_step_until_applied(&x->f, 1, idx, 5000));
    assert_true(raft_fixture_step_until_applied(&x->f, 2, idx, 5000));
    assert_int_equal(x->nodes[1].fsm.count, 6);
    assert_int_equal(x->nodes[2].fsm.count, 6);
    assert_int_equal(x->nodes[0].fsm.count, 4);
    assert_int_equal(x->nodes[l].n_res, 2);
    assert_int_equal(x->nodes[l].res[1].value, 6);
}

static void test_raftlog_fixture_partitioned_leader_entry_discarded(void **state)
{
    struct fx *x = *state;
    start(x);
    raft_fixture_elect(&x->f, 0);
    raft_index idx = propose(x, 0, 1, 1, KVP_OK);
    assert_true(raft_fixture_step_until_applied(&x->f, N, idx, 5000));
    x->nodes[0].n_res = 0;
    raft_fixture_disconnect(&x->f, 0, 1);
    raft_fixture_disconnect(&x->f, 0, 2);
    propose(x, 0, 900, 2, KVP_OK); /* can never commit: no quorum */
    assert_true(raft_fixture_step_until_state_is(&x->f, 0, RAFT_FOLLOWER, 10000));
    assert_int_equal(x->nodes[0].n_res, 2);
    assert_int_equal(x->nodes[0].res[0].status, KVP_ERR_NOT_LEADER);
    assert_int_equal(x->nodes[0].res[1].status, KVP_ERR_NOT_LEADER);
    assert_true(raft_fixture_step_until_has_leader(&x->f, 10000));
    unsigned l = raft_fixture_leader_index(&x->f);
    assert_true(l == 1 || l == 2);
    idx = propose(x, l, 7, 1, KVP_OK);
    raft_fixture_reconnect(&x->f, 0, 1);
    raft_fixture_reconnect(&x->f, 0, 2);
    assert_true(raft_fixture_step_until_applied(&x->f, N, idx, 10000));
    /* the old leader's uncommitted entry was replaced, never applied */
    for (unsigned i = 0; i < N; i++) {
        assert_int_equal(x->nodes[i].fsm.count, 2);
        assert_int_equal(x->nodes[i].fsm.sum, 8);
    }
    assert_int_equal(x->nodes[0].n_res, 2); /* nothing more delivered to the old proposer */
}

static void test_raftlog_fixture_snapshot_catch_up_restores(void **state)
{
    struct fx *x = *state;
    for (unsigned i = 0; i < N; i++) {
        raft_set_snapshot_threshold(raft_fixture_get(&x->f, i), 4);
        raft_set_snapshot_trailing(raft_fixture_get(&x->f, i), 1);
    }
    start(x);
    raft_fixture_elect(&x->f, 0);
    raft_fixture_kill(&x->f, 2);
    raft_index idx = 0;
    uint64_t sum = 0;
    for (unsigned e = 0; e < 12; e++) {
        idx = propose(x, 0, 1000 + e * 10, 3, KVP_OK);
        sum += 3 * (1000 + e * 10) + 3;
        assert_true(raft_fixture_step_until_applied(&x->f, 0, idx, 5000));
    }
    assert_true(x->nodes[0].glue.snapshots_taken >= 1);
    raft_fixture_revive(&x->f, 2);
    assert_true(raft_fixture_step_until_applied(&x->f, 2, idx, 20000));
    assert_true(x->nodes[2].glue.snapshots_restored >= 1);
    assert_true(x->nodes[2].fsm.restores >= 1);
    assert_int_equal(x->nodes[2].fsm.count, 36);
    assert_int_equal(x->nodes[2].fsm.sum, sum);
    assert_int_equal(x->nodes[0].fsm.sum, sum);
}

/* The entry-count threshold is far away (1000), but the log's bytes pass snapshot_log_bytes:
 * a snapshot follows, the threshold is put back, the trailing entries are cut to the byte
 * budget, and the cluster keeps committing and catches up a follower from it. */
static void test_raftlog_fixture_log_bytes_trigger_snapshot(void **state)
{
    struct fx *x = *state;
    for (unsigned i = 0; i < N; i++) {
        raft_set_snapshot_threshold(raft_fixture_get(&x->f, i), 1000);
        raft_set_snapshot_trailing(raft_fixture_get(&x->f, i), 500);
        x->nodes[i].glue.base_threshold = 1000;
        x->nodes[i].glue.base_trailing = 500;
        x->nodes[i].glue.snap_log_bytes = 400; /* a few entries of 3 commands each */
    }
    start(x);
    raft_fixture_elect(&x->f, 0);
    raft_fixture_kill(&x->f, 2);
    raft_index idx = 0;
    uint64_t sum = 0;
    for (unsigned e = 0; e < 20; e++) {
        idx = propose(x, 0, 2000 + e, 3, KVP_OK);
        sum += 3 * (2000 + e) + 3;
        assert_true(raft_fixture_step_until_applied(&x->f, 0, idx, 5000));
    }
    struct raft *r0 = raft_fixture_get(&x->f, 0);
    assert_true(x->nodes[0].glue.snapshots_by_bytes >= 1);
    assert_true(x->nodes[0].glue.snapshots_taken >= 1);
    assert_false(x->nodes[0].glue.snap_forced);
    assert_int_equal(r0->snapshot.threshold, 1000); /* put back after the forced snapshot */
    assert_true(r0->snapshot.trailing < 500);       /* cut to the byte budget */
    assert_true(x->nodes[0].glue.log_bytes < 400);
    raft_fixture_revive(&x->f, 2);
    assert_true(raft_fixture_step_until_applied(&x->f, 2, idx, 20000));
    assert_int_equal(x->nodes[2].fsm.count, 60);
    assert_int_equal(x->nodes[2].fsm.sum, sum);
    assert_int_equal(x->nodes[0].fsm.sum, sum);
}

/* ---- a follower's finished log write answered to a leader it no longer knows ----
 * The master SIGSEGV of the issue-22 scale bench (core: strlen <- raft_uv's send <- the
 * AppendEntries result of libraft 0.15's follower append callback, address NULL). Server 1's
 * disk is slow; while its write of an entry is in flight the leader dies, server 1 stands and
 * loses to server 2, whose RequestVote turns it back into a follower with no leader known
 * (server 2's messages to it are then cut, so it learns none). When the write finishes, libraft answers it to "the current leader": no address.
 * Every message of the fixture's servers goes through raftlog's send check
 * (kvp_rl_send_checked), as raft_uv's does in a master; behind it a recorder counts messages
 * with no address that got through (raft_uv would have crashed on one). A libraft that no longer
 * answers such a write (upstream's fix, after 0.15) fails the "dropped" wait: then the check in
 * raftlog.c is no longer needed. */
static kvp_rl_io_send_fn g_inner_send[N];
static struct raft_io *g_io[N];
static uint64_t g_dropped[N], g_no_address_passed[N];

static unsigned io_index(struct raft_io *io)
{
    for (unsigned i = 0; i < N; i++)
        if (g_io[i] == io)
            return i;
    fail_msg("unknown raft_io");
    return 0;
}

static int recorder_send(struct raft_io *io, struct raft_io_send *req, const struct raft_message *m,
                         raft_io_send_cb cb)
{
    unsigned i = io_index(io);
    if (m->server_address == NULL || m->server_id == 0) {
        g_no_address_passed[i]++;
        return RAFT_NOCONNECTION;
    }
    return g_inner_send[i](io, req, m, cb);
}

static int checked_send(struct raft_io *io, struct raft_io_send *req, const struct raft_message *m,
                        raft_io_send_cb cb)
{
    return kvp_rl_send_checked(io, req, m, cb, recorder_send, &g_dropped[io_index(io)], "raftlog-test");
}

struct until_arg {
    struct raft *r;
    uint64_t v;
};

static bool has_index(struct raft_fixture *f, void *arg)
{
    (void)f;
    struct until_arg *a = arg;
    return raft_last_index(a->r) >= a->v;
}

static bool follower_above(struct raft_fixture *f, void *arg)
{
    (void)f;
    struct until_arg *a = arg;
    return a->r->current_term > a->v && raft_state(a->r) == RAFT_FOLLOWER;
}

static bool dropped_any(struct raft_fixture *f, void *arg)
{
    (void)f;
    return *(uint64_t *)arg > 0;
}

static void test_raftlog_fixture_answer_to_unknown_leader_dropped(void **state)
{
    struct fx *x = *state;
    struct raft_fixture *f = &x->f;
    start(x);
    raft_fixture_elect(f, 0);
    for (unsigned i = 0; i < N; i++) {
        struct raft *r = raft_fixture_get(f, i);
        g_io[i] = r->io;
        g_inner_send[i] = r->io->send;
        r->io->send = checked_send;
        g_dropped[i] = g_no_address_passed[i] = 0;
    }
    /* server 2 waits longest for a leader (the fixture draws a follower's timeout when it
     * becomes one: set both the next draw and the current one) */
    raft_fixture_set_randomized_election_timeout(f, 2, 3000);
    raft_fixture_get(f, 2)->follower_state.randomized_election_timeout = 3000;
    raft_fixture_set_disk_latency(f, 1, 15000);
    raft_index idx = propose(x, 0, 1, 1, KVP_OK);
    struct raft *r1 = raft_fixture_get(f, 1);
    struct until_arg a = {r1, idx};
    assert_true(raft_fixture_step_until(f, has_index, &a, 2000)); /* in server 1's log, not on its disk */
    struct until_arg a2 = {raft_fixture_get(f, 2), idx};
    assert_true(raft_fixture_step_until(f, has_index, &a2, 2000));
    /* The leader dies. Server 1 stands first and stays a candidate (server 2, which heard from
     * the leader as late, refuses it its vote); server 2 stands later, and its RequestVote of a
     * higher term makes server 1 a follower again, with no leader known. */
    raft_fixture_kill(f, 0);
    assert_true(raft_fixture_step_until_state_is(f, 1, RAFT_CANDIDATE, 3000));
    r1->candidate_state.randomized_election_timeout = 60000;
    raft_fixture_set_randomized_election_timeout(f, 1, 60000);
    a.v = r1->current_term;
    assert_true(raft_fixture_step_until(f, follower_above, &a, 10000));
    assert_int_equal(r1->follower_state.current_leader.id, 0);
    assert_null(r1->follower_state.current_leader.address);
    raft_fixture_saturate(f, 2, 1);
    /* the write finishes: its answer has no address and is refused before raft_uv */
    assert_true(raft_fixture_step_until(f, dropped_any, &g_dropped[1], 10000));
    assert_int_equal(g_no_address_passed[1], 0);
    assert_int_equal(raft_state(r1), RAFT_FOLLOWER);
    /* and the cluster goes on: the new leader's next entry commits both on the two live
     * servers (an entry of an earlier term commits with one of the leader's own) */
    raft_fixture_desaturate(f, 2, 1);
    raft_fixture_set_disk_latency(f, 1, 10);
    assert_true(raft_fixture_step_until_state_is(f, 2, RAFT_LEADER, 10000));
    raft_index idx2 = propose(x, 2, 2, 1, KVP_OK);
    assert_true(idx2 > idx);
    assert_true(raft_fixture_step_until_applied(f, 2, idx2, 20000));
    assert_true(raft_fixture_step_until_applied(f, 1, idx2, 20000));
    assert_int_equal(x->nodes[1].fsm.sum, 1 + 2);
    assert_int_equal(x->nodes[2].fsm.sum, 1 + 2);
    for (unsigned i = 0; i < N; i++)
        assert_int_equal(g_no_address_passed[i], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_raftlog_fixture_group_entry_applied_everywhere, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_raftlog_fixture_fsm_error_is_result, setup, teardown),
        cmocka_unit_test_setup_teardown(test_raftlog_fixture_depose_fails_inflight_not_leader, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_raftlog_fixture_kill_leader_new_leader_applies, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_raftlog_fixture_partitioned_leader_entry_discarded,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_raftlog_fixture_snapshot_catch_up_restores, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_raftlog_fixture_log_bytes_trigger_snapshot, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_raftlog_fixture_answer_to_unknown_leader_dropped, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
