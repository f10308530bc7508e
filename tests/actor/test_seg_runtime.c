/*
 * test_seg_runtime.c — the segment runtime (segment.h) against a scripted fake master (a
 * ZeroMQ ROUTER answering Mount/Heartbeat/Unmount/Drain/ClusterStatus), with its real
 * data-plane server checked through the transfer engine and the PING probe.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "actors/session/msession.h"
#include "actors/segment/segment.h"
#include "actors/transfer/transfer.h"
#include "config/config.h"
#include "kvpool.h"
#include "wire/envelope.h"
#include "seg_fake_master.h"

#if defined(__SANITIZE_THREAD__)
/* libzmq is not instrumented: its I/O thread hands received buffers to msession through
 * lock-free queues TSan cannot see, which shows up as races inside the master session. Ignore
 * what libzmq's own calls do (the segment code under test does not call libzmq). */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void) { return "called_from_lib:libzmq.so\n"; }
#endif

struct hook_log {
    pthread_mutex_t mu;
    int calls;
    uint32_t old_id[16], new_id[16];
    void *base[16];
    uint64_t size[16];
};

static void on_mount(void *ctx, uint32_t old_id, uint32_t new_id, void *base, uint64_t size)
{
    struct hook_log *h = ctx;
    pthread_mutex_lock(&h->mu);
    if (h->calls < 16) {
        h->old_id[h->calls] = old_id;
        h->new_id[h->calls] = new_id;
        h->base[h->calls] = base;
        h->size[h->calls] = size;
    }
    h->calls++;
    pthread_mutex_unlock(&h->mu);
}

static int hook_calls(struct hook_log *h)
{
    pthread_mutex_lock(&h->mu);
    int n = h->calls;
    pthread_mutex_unlock(&h->mu);
    return n;
}

struct fx {
    struct fake_master fm;
    struct kvp_msession *ms;
    struct kvp_cfg_segment cfg;
    struct hook_log hooks;
};

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);
    if (fm_start(&f->fm) != 0)
        return -1;
    const char *m[1] = {f->fm.addr};
    if (kvp_msession_new(&f->ms, m, 1, "test-seg") != KVP_OK)
        return -1;
    kvp_cfg_defaults(KVP_CFG_SEGMENT, &f->cfg);
    snprintf(f->cfg.local_hostname, sizeof f->cfg.local_hostname, "127.0.0.1");
    f->cfg.global_segment_size = 4 << 20;
    f->cfg.heartbeat_ms = 30;
    f->cfg.hugepages = true; /* exercises the fallback where no huge pages are reserved */
    pthread_mutex_init(&f->hooks.mu, NULL);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    kvp_msession_destroy(&f->ms);
    fm_stop(&f->fm);
    pthread_mutex_destroy(&f->hooks.mu);
    free(f);
    return 0;
}

static void wait_for(_Atomic int *v, int at_least)
{
    for (int i = 0; i < 5000 && atomic_load(v) < at_least; i++)
        usleep(1000);
}

static void test_seg_mount_heartbeat_unmount_ok(void **state)
{
    struct fx *f = *state;
    struct kvp_segment *s = NULL;
    struct kvp_segment_hooks h = {.ctx = &f->hooks, .on_mount = on_mount};
    assert_int_equal(kvp_segment_start(&s, &f->cfg, f->ms, &h), KVP_OK);
    assert_int_equal(kvp_segment_id(s), 1);
    char ep[128]; /* copied: the segment's string goes away at stop */
    snprintf(ep, sizeof ep, "%s", kvp_segment_endpoint(s));
    unsigned port = 0;
    assert_int_equal(sscanf(ep, "127.0.0.1:%u", &port), 1);
    char want[64];
    snprintf(want, sizeof want, "127.0.0.1-%u", port);
    assert_string_equal(kvp_segment_name(s), want); /* default name */
    wait_for(&f->fm.mounts, 1); /* orders the fake master's writes before our reads */
    assert_string_equal(f->fm.mount_name, want);
    assert_string_equal(f->fm.mount_endpoint, ep);
    assert_int_equal(f->fm.mount_pid, (uint64_t)getpid());
    assert_int_equal(hook_calls(&f->hooks), 1);
    assert_int_equal(f->hooks.old_id[0], 0);
    assert_int_equal(f->hooks.new_id[0], 1);
    assert_int_equal(f->hooks.size[0], 4 << 20);
    uint8_t *base = f->hooks.base[0];
    assert_non_null(base);

    /* The data plane serves the region under the mounted id. */
    assert_int_equal(kvp_xfer_probe(ep, 1, 1000), KVP_OK);
    assert_int_equal(kvp_xfer_probe(ep, 2, 1000), KVP_ERR_NOT_FOUND);
    struct kvp_xfer_engine *e;
    assert_int_equal(kvp_xfer_engine_new(&e, NULL), KVP_OK);
    char msg[] = "hello segment";
    struct kvp_xfer_slice sl = {.local = msg, .length = sizeof msg, .segment_id = 1, .endpoint = ep,
                                .remote_offset = (4 << 20) - sizeof msg, .op = KVP_XFER_WRITE};
    assert_int_equal(kvp_xfer_run(e, &sl, 1, 5000), KVP_OK);
    assert_memory_equal(base + (4 << 20) - sizeof msg, msg, sizeof msg);
    kvp_xfer_engine_destroy(&e);

    wait_for(&f->fm.heartbeats, 3);
    assert_true(atomic_load(&f->fm.heartbeats) >= 3);
    kvp_segment_stop(&s);
    assert_null(s);
    assert_int_equal(atomic_load(&f->fm.unmounts), 1);
    assert_int_equal(atomic_load(&f->fm.unmounted_id), 1);
    assert_int_equal(hook_calls(&f->hooks), 2); /* unmount: (1 -> 0) so the owner unregisters */
    assert_int_equal(f->hooks.old_id[1], 1);
    assert_int_equal(f->hooks.new_id[1], 0);
    assert_int_equal(kvp_xfer_probe(ep, 1, 1000), KVP_ERR_TRANSFER); /* nobody listens */
}

/* kvpool-segment's first mount (hooks.mount_retry) tried again after a try got no answer within
 * its window: both tries carry the same non-zero mount_nonce, so a master that registered the
 * first answers the second with that registration (test_master_quorum's nonce case). Before,
 * the tries had none and the master registered the segment twice, marking the first LOST. About
 * 3 s: the try's 2 s window, then the 1 s backoff. */
static void test_seg_first_mount_tries_share_nonce(void **state)
{
    struct fx *f = *state;
    atomic_store(&f->fm.drop_mount_calls, 1);
    struct kvp_segment *s = NULL;
    struct kvp_segment_hooks h = {.ctx = &f->hooks, .on_mount = on_mount, .mount_retry = true};
    assert_int_equal(kvp_segment_start(&s, &f->cfg, f->ms, &h), KVP_OK);
    wait_for(&f->fm.mounts, 1);
    uint64_t dropped = atomic_load(&f->fm.dropped_nonce), answered = atomic_load(&f->fm.answered_nonce);
    print_message("first try unanswered: nonce %llx; next try answered: nonce %llx\n", (unsigned long long)dropped,
                  (unsigned long long)answered);
    assert_int_equal(atomic_load(&f->fm.dropped_calls), 1);
    assert_true(atomic_load(&f->fm.mounts) >= 1); /* more when the session resent a slow copy */
    assert_true(dropped != 0);
    assert_int_equal(answered, dropped);
    assert_true(kvp_segment_id(s) != 0);
    kvp_segment_stop(&s);
}

static void test_seg_heartbeat_not_found_remounts(void **state)
{
    struct fx *f = *state;
    snprintf(f->cfg.name, sizeof f->cfg.name, "seg-remount");
    struct kvp_segment *s = NULL;
    struct kvp_segment_hooks h = {.ctx = &f->hooks, .on_mount = on_mount};
    assert_int_equal(kvp_segment_start(&s, &f->cfg, f->ms, &h), KVP_OK);
    assert_string_equal(kvp_segment_name(s), "seg-remount");
    assert_int_equal(kvp_segment_id(s), 1);
    atomic_store(&f->fm.lost_id, 1); /* the master declared segment 1 lost */
    wait_for(&f->fm.mounts, 2);
    for (int i = 0; i < 5000 && hook_calls(&f->hooks) < 2; i++)
        usleep(1000);
    assert_int_equal(atomic_load(&f->fm.mounts), 2);
    assert_int_equal(kvp_segment_id(s), 2);
    assert_int_equal(hook_calls(&f->hooks), 2);
    assert_int_equal(f->hooks.old_id[1], 1);
    assert_int_equal(f->hooks.new_id[1], 2);
    assert_string_equal(f->fm.mount_name, "seg-remount");
    const char *ep = kvp_segment_endpoint(s);
    assert_int_equal(kvp_xfer_probe(ep, 2, 1000), KVP_OK);
    assert_int_equal(kvp_xfer_probe(ep, 1, 1000), KVP_ERR_NOT_FOUND); /* old id refused */
    kvp_segment_stop(&s);
    assert_int_equal(atomic_load(&f->fm.unmounted_id), 2);
}

static void test_seg_drain_waits_for_zero_objects_ok(void **state)
{
    struct fx *f = *state;
    struct kvp_segment *s = NULL;
    assert_int_equal(kvp_segment_start(&s, &f->cfg, f->ms, NULL), KVP_OK);
    atomic_store(&f->fm.objects, 3);
    assert_int_equal(kvp_segment_drain(s, 10000), KVP_OK);
    assert_int_equal(atomic_load(&f->fm.drains), 1);
    assert_int_equal(atomic_load(&f->fm.drained_id), 1);
    assert_true(atomic_load(&f->fm.statuses) >= 3);
    assert_int_equal(atomic_load(&f->fm.objects), 0);
    kvp_segment_stop(&s);
}

static void test_seg_drain_stuck_timeout(void **state)
{
    struct fx *f = *state;
    struct kvp_segment *s = NULL;
    assert_int_equal(kvp_segment_start(&s, &f->cfg, f->ms, NULL), KVP_OK);
    atomic_store(&f->fm.objects, 2);
    atomic_store(&f->fm.objects_stuck, true);
    assert_int_equal(kvp_segment_drain(s, 500), KVP_ERR_TIMEOUT);
    kvp_segment_stop(&s);
    assert_int_equal(atomic_load(&f->fm.unmounts), 1);
}

static void test_seg_bad_config_invalid(void **state)
{
    struct fx *f = *state;
    struct kvp_segment *s = NULL;
    f->cfg.global_segment_size = 0;
    assert_int_equal(kvp_segment_start(&s, &f->cfg, f->ms, NULL), KVP_ERR_INVALID);
    assert_null(s);
    f->cfg.global_segment_size = 1 << 20;
    assert_int_equal(kvp_segment_start(&s, &f->cfg, NULL, NULL), KVP_ERR_INVALID);
    snprintf(f->cfg.local_hostname, sizeof f->cfg.local_hostname, "[::1");
    assert_int_not_equal(kvp_segment_start(&s, &f->cfg, f->ms, NULL), KVP_OK);
    assert_null(s);
    assert_int_equal(atomic_load(&f->fm.mounts), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_seg_mount_heartbeat_unmount_ok, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seg_heartbeat_not_found_remounts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seg_first_mount_tries_share_nonce, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seg_drain_waits_for_zero_objects_ok, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seg_drain_stuck_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seg_bad_config_invalid, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
