/*
 * test_repair_crash.c — crashes and stalls under a continuous mixed load (issue 7, contract C4).
 * Real processes: 3 kvpool-master + 4 kvpool-segment (`kvpoolctl cluster up`), 2 forked client
 * processes (batch_put replica_num 3, batch_get with self-checking payloads).
 *  - SIGKILL one segment: zero failed gets, zero corrupt bytes; the leader declares it lost (a
 *    client report + failed probe) and re-replicates every object back to 3 replicas on the
 *    other segments; prints detection time, time to restore, bytes moved, throughput before and
 *    during the repair;
 *  - SIGSTOP another segment past client_ttl: declared lost while silent; after SIGCONT it
 *    remounts under a new id and its data plane refuses the old id.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "actors/transfer/transfer.h"
#include "tests/integration/test_drain_util.h"
#include "tests/lib/proc_stop.h"

static struct tc_cluster CL;

static int setup(void **state)
{
    (void)state;
    setenv("KVPOOL_DEFAULT_KV_LEASE_TTL", "2000", 1); /* inherited by the masters and segments */
    setenv("KVPOOL_CLIENT_TTL", "3000ms", 1);
    setenv("KVPOOL_HEARTBEAT_MS", "300", 1);
    setenv("KVPOOL_REPAIR_BANDWIDTH_BYTES_PER_S", "64M", 1);
    int rc = td_cluster_up(&CL, 4, "48M");
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
    (void)kvp_test_children_kill();
    tc_cluster_down(&CL);
    return 0;
}

static void test_repair_segment_killed_zero_failed_gets_replicas_restored(void **state)
{
    (void)state;
    char name[128];
    pid_t victim = tc_segment(&CL, 0, name, sizeof name);
    assert_true(victim > 0);

    struct td_load L;
    assert_int_equal(td_load_start(&L, &CL, 3, 500), 0);
    struct kvp_msession *ms = td_session(&CL);
    assert_non_null(ms);
    uint64_t t0 = kvp_clock_now_ms();
    while (kvp_clock_now_ms() - t0 < 30000 &&
           (atomic_load(&L.sh->ch[0].n_keys) < 200 || atomic_load(&L.sh->ch[1].n_keys) < 200))
        usleep(50000);
    json_t *doc = td_status(ms);
    assert_non_null(doc);
    uint32_t vid = td_segment_id(doc, name, NULL);
    json_decref(doc);
    assert_true(vid != 0);

    /* puts stop here so "restored" has a fixed key set, and so that the throughput before and
     * during the repair compare the same get-only load */
    atomic_store(&L.sh->pause_puts, true);
    usleep(300000);
    unsigned long po, pf, go, gf, co, br, go0, br0;
    td_load_totals(&L, &po, &pf, &go0, &gf, &co, &br0);
    uint64_t tb = kvp_clock_now_ms();
    usleep(2000000);
    td_load_totals(&L, &po, &pf, &go, &gf, &co, &br);
    double before = (double)(br - br0) / ((double)(kvp_clock_now_ms() - tb) / 1000.0);

    /* the crash */
    td_load_totals(&L, &po, &pf, &go0, &gf, &co, &br0);
    uint64_t tk = kvp_clock_now_ms();
    assert_int_equal(kill(victim, SIGKILL), 0);
    uint64_t lost_ms = 0, restored_ms = 0;
    unsigned nk = 0, nshort = 0, nbad = 0, nmiss = 0;
    while (kvp_clock_now_ms() - tk < 40000 && !restored_ms) {
        usleep(200000);
        if (!lost_ms) {
            doc = td_status(ms);
            if (doc && td_segment_id(doc, name, NULL) != vid)
                lost_ms = kvp_clock_now_ms() - tk;
            json_decref(doc);
            continue;
        }
        td_check_replicas(ms, &L, 3, vid, &nk, &nshort, &nbad, &nmiss);
        if (nshort == 0 && nbad == 0 && nmiss == 0)
            restored_ms = kvp_clock_now_ms() - tk;
    }
    uint64_t tr = kvp_clock_now_ms() - tk;
    td_load_totals(&L, &po, &pf, &go, &gf, &co, &br);
    double during = (double)(br - br0) / ((double)tr / 1000.0);
    doc = td_status(ms);
    json_t *rep = doc ? json_object_get(doc, "repair") : NULL;
    long long moved = td_jint(rep, "moved_objects"), moved_b = td_jint(rep, "moved_bytes");
    json_decref(doc);
    usleep(500000);
    int bad_children = td_load_stop(&L);
    td_load_totals(&L, &po, &pf, &go, &gf, &co, &br);
    td_check_replicas(ms, &L, 3, vid, &nk, &nshort, &nbad, &nmiss);
    printf("crash of %s (segment %u): declared lost after %llu ms, 3 replicas again after %llu ms\n", name, vid,
           (unsigned long long)lost_ms, (unsigned long long)restored_ms);
    printf("repair: %lld objects (%lld bytes) copied (cap 64 MiB/s)\n", moved, moved_b);
    printf("load: puts ok %lu failed %lu, gets ok %lu failed %lu corrupt %lu\n", po, pf, go, gf, co);
    printf("get throughput: before %.1f MiB/s, from the crash until restored %.1f MiB/s\n", before / 1048576.0,
           during / 1048576.0);
    printf("replicas: %u keys, %u with fewer than 3, %u on the dead segment, %u missing\n", nk, nshort, nbad, nmiss);
    kvp_msession_destroy(&ms);

    assert_int_equal(bad_children, 0);
    assert_true(lost_ms > 0);
    assert_true(restored_ms > 0);
    assert_int_equal(gf, 0);
    assert_int_equal(co, 0);
    assert_true(nk > 0);
    assert_int_equal(nmiss, 0);
    assert_int_equal(nshort, 0);
    assert_int_equal(nbad, 0);
}

/* A stopped segment is lost while silent; after SIGCONT its old id is refused and it remounts. */
static void test_repair_segment_stalled_lost_then_remounts_old_id_refused(void **state)
{
    (void)state;
    char name[128];
    pid_t victim = tc_segment(&CL, 1, name, sizeof name);
    assert_true(victim > 0);
    struct kvp_msession *ms = td_session(&CL);
    assert_non_null(ms);
    json_t *doc = td_status(ms);
    assert_non_null(doc);
    uint32_t vid = td_segment_id(doc, name, NULL);
    char endpoint[300] = "";
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(doc, "segments"), i, s) if ((uint32_t)td_jint(s, "id") == vid)
        snprintf(endpoint, sizeof endpoint, "%s", json_string_value(json_object_get(s, "endpoint")));
    json_decref(doc);
    assert_true(vid != 0 && endpoint[0]);

    assert_true(kvp_test_stop_process(victim, 5000)); /* silent from here on (proc_stop.h) */
    uint64_t t0 = kvp_clock_now_ms(), lost_ms = 0;
    while (kvp_clock_now_ms() - t0 < 15000 && !lost_ms) {
        usleep(200000);
        doc = td_status(ms);
        if (doc && td_segment_id(doc, name, NULL) != vid)
            lost_ms = kvp_clock_now_ms() - t0;
        json_decref(doc);
    }
    kill(victim, SIGCONT);
    assert_true(lost_ms > 0);
    uint32_t nid = 0;
    t0 = kvp_clock_now_ms();
    while (kvp_clock_now_ms() - t0 < 10000 && (nid == 0 || nid == vid)) {
        usleep(200000);
        doc = td_status(ms);
        nid = doc ? td_segment_id(doc, name, NULL) : 0;
        json_decref(doc);
    }
    int old_probe = kvp_xfer_probe(endpoint, vid, 1000);
    int new_probe = kvp_xfer_probe(endpoint, nid, 1000);
    printf("stall of %s: declared lost after %llu ms (client_ttl 3000); back as segment %u; old id %u -> %s, "
           "new id -> %s\n",
           name, (unsigned long long)lost_ms, nid, vid, kvp_errname(old_probe), kvp_errname(new_probe));
    kvp_msession_destroy(&ms);
    assert_true(nid != 0 && nid != vid);
    assert_int_equal(old_probe, KVP_ERR_NOT_FOUND);
    assert_int_equal(new_probe, KVP_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_repair_segment_killed_zero_failed_gets_replicas_restored, kvp_test_children_teardown),
        cmocka_unit_test_teardown(test_repair_segment_stalled_lost_then_remounts_old_id_refused, kvp_test_children_teardown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
