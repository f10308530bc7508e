/*
 * test_segment_lost_cmd.c — the operator's way out of a withheld episode that does not end
 * (issue 18 review; docs/operations.md "How a segment is declared lost"). Real cluster: 3
 * masters, 4 segments via `kvpoolctl cluster up`, client_ttl 1 s.
 *
 * Three of four segments SIGKILLed and no client traffic: the leader hears 1 of 4, suspects
 * itself and withholds (rule 4), and nothing ever ends the episode by itself. Then:
 *  - `kvpoolctl segment-lost ID` without --yes prints its warning, exits 2, changes nothing;
 *  - `kvpoolctl segment-lost ID --yes` declares it lost: exit 0, the segment is LOST, the objects
 *    only it held are gone (NOT_FOUND, not a transfer error on a dead replica);
 *  - an unknown or already lost segment: exit 1.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <signal.h>

#include "tests/integration/test_drain_util.h"

static struct tc_cluster CL;

static int setup(void **state)
{
    (void)state;
    setenv("KVPOOL_CLIENT_TTL", "1000ms", 1); /* inherited by the masters cluster up starts */
    int rc = td_cluster_up(&CL, 4, "16M");
    unsetenv("KVPOOL_CLIENT_TTL");
    if (rc != 0) {
        fprintf(stderr, "kvpoolctl cluster up failed (dir %s)\n", CL.dir);
        tc_cluster_down(&CL);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tc_cluster_down(&CL);
    return 0;
}

static bool withholding(struct kvp_msession *ms)
{
    json_t *d = td_status(ms);
    bool w = d && json_is_true(json_object_get(json_object_get(d, "liveness"), "withholding"));
    json_decref(d);
    return w;
}

static int seg_lost_cmd(uint32_t id, bool yes)
{
    char ids[16];
    snprintf(ids, sizeof ids, "%u", id);
    char *argv[] = {CL.ctl, "--cluster", CL.file, "segment-lost", ids, yes ? "--yes" : NULL, NULL};
    return tc_run(argv);
}

static void test_segment_lost_cmd_ends_a_withheld_episode(void **state)
{
    (void)state;
    struct kvp_msession *ms = td_session(&CL);
    assert_non_null(ms);
    char name[4][128];
    int pid[4];
    uint32_t id[4];
    json_t *d = td_status(ms);
    assert_non_null(d);
    for (size_t i = 0; i < 4; i++) {
        pid[i] = tc_segment(&CL, i, name[i], sizeof name[i]);
        assert_true(pid[i] > 0);
        id[i] = td_segment_id(d, name[i], NULL);
        assert_true(id[i] > 0);
    }
    json_decref(d);

    kvp_client *c = tc_open(&CL, 5000);
    assert_non_null(c);
    uint8_t buf[4096];
    tc_fill("solo", buf, sizeof buf);
    kvp_put_opts o1 = {.replica_num = 1, .preferred_segment = name[0]};
    assert_int_equal(kvp_put(c, "solo", buf, sizeof buf, &o1), KVP_OK);
    tc_close(&c);

    for (int i = 0; i < 3; i++)
        assert_int_equal(kill(pid[i], SIGKILL), 0);
    /* The leader suspects itself: 1 of 4 heard (no client traffic to witness anything). */
    bool w = false;
    for (int i = 0; i < 100 && !w; i++) {
        w = withholding(ms);
        if (!w)
            usleep(100000);
    }
    assert_true(w);
    d = td_status(ms);
    assert_non_null(d);
    for (int i = 0; i < 3; i++)
        assert_int_equal(td_segment_id(d, name[i], NULL), id[i]); /* not lost */
    json_decref(d);

    assert_int_equal(seg_lost_cmd(id[0], false), 2); /* the warning only */
    assert_true(withholding(ms));
    d = td_status(ms);
    assert_int_equal(td_segment_id(d, name[0], NULL), id[0]);
    json_decref(d);

    assert_int_equal(seg_lost_cmd(id[0], true), 0);
    d = td_status(ms);
    assert_non_null(d);
    assert_int_equal(td_segment_id(d, name[0], NULL), 0); /* LOST */
    json_decref(d);
    c = tc_open(&CL, 5000);
    assert_non_null(c);
    assert_int_equal(kvp_exists(c, "solo"), 0);
    assert_int_equal(kvp_get(c, "solo", buf, sizeof buf, 0), KVP_ERR_NOT_FOUND);
    tc_close(&c);

    assert_int_equal(seg_lost_cmd(id[0], true), 1); /* already lost */
    assert_int_equal(seg_lost_cmd(99999, true), 1); /* unknown */
    kvp_msession_destroy(&ms);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_segment_lost_cmd_ends_a_withheld_episode),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
