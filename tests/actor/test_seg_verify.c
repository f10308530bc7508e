/*
 * test_seg_verify.c — range verification on a real segment (actors/segment/seg_verify.h,
 * seg_heartbeat.c) against the scripted fake master: the "master" asks in a HeartbeatResp for
 * ranges of the region (RangeVerify) and checks the RangeSums of the heartbeats that follow:
 * inside the region → XXH3-64 of the bytes, in the very next heartbeat; outside, len 0 or an
 * overflowing range → INVALID (and the segment goes on serving); a range larger than the
 * per-heartbeat budget → answered a heartbeat later, with the checksum of the whole range.
 * No timing is asserted: heartbeats are counted.
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
#include <xxhash.h>
#include <zmq.h>

#include "actors/client/client.h"
#include "actors/segment/seg_verify.h"
#include "actors/segment/segment.h"
#include "actors/session/msession.h"
#include "actors/transfer/transfer.h"
#include "config/config.h"
#include "kvpool.h"
#include "seg_fake_master.h"

#if defined(__SANITIZE_THREAD__)
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void) { return "called_from_lib:libzmq.so\n"; }
#endif

#define MAX_ASKS 16

/* The script, shared by the test thread and the fake master's thread (mu). */
struct script {
    pthread_mutex_t mu;
    int beats;                      /* heartbeats seen */
    size_t n;                       /* asks defined */
    Kvp__RangeVerify rv[MAX_ASKS];
    Kvp__RangeVerify *rvp[MAX_ASKS];
    bool queued[MAX_ASKS];          /* to be sent in the next answer */
    int asked_beat[MAX_ASKS];       /* the heartbeat whose answer carried it (0: not yet) */
    int answers[MAX_ASKS];          /* RangeSums seen for it */
    int answer_beat[MAX_ASKS];
    int status[MAX_ASKS];
    uint64_t checksum[MAX_ASKS];
    int unknown_ids;                /* RangeSums for an id never asked */
};

static void on_heartbeat(void *arg, const Kvp__HeartbeatReq *hb, Kvp__HeartbeatResp *hr)
{
    struct script *sc = arg;
    pthread_mutex_lock(&sc->mu);
    sc->beats++;
    for (size_t k = 0; k < hb->n_verified; k++) {
        size_t i = 0;
        while (i < sc->n && sc->rv[i].id != hb->verified[k]->id)
            i++;
        if (i == sc->n) {
            sc->unknown_ids++;
            continue;
        }
        sc->answers[i]++;
        sc->answer_beat[i] = sc->beats;
        sc->status[i] = hb->verified[k]->status;
        sc->checksum[i] = hb->verified[k]->checksum;
    }
    static Kvp__RangeVerify *send[MAX_ASKS]; /* this thread only; read when the answer is encoded */
    size_t m = 0;
    for (size_t i = 0; i < sc->n; i++) {
        /* an answer lost on the way (the segment's call timed out under load): ask again, as the
         * leader does after its UNKNOWN */
        if (sc->asked_beat[i] && !sc->answers[i] && sc->beats - sc->asked_beat[i] >= 4)
            sc->queued[i] = true;
        if (sc->queued[i]) {
            sc->queued[i] = false;
            sc->asked_beat[i] = sc->beats;
            send[m++] = &sc->rv[i];
        }
    }
    hr->n_verify = m;
    hr->verify = m ? send : NULL;
    pthread_mutex_unlock(&sc->mu);
}

/* Queue n asks {id, offset, len} at once (one heartbeat answer carries them all); the index of
 * the first is returned, the others follow. */
static size_t ask_n(struct script *sc, const uint64_t (*r)[3], size_t n)
{
    pthread_mutex_lock(&sc->mu);
    size_t first = sc->n;
    for (size_t k = 0; k < n; k++) {
        size_t i = sc->n++;
        kvp__range_verify__init(&sc->rv[i]);
        sc->rv[i].id = r[k][0];
        sc->rv[i].offset = r[k][1];
        sc->rv[i].len = r[k][2];
        sc->queued[i] = true;
    }
    pthread_mutex_unlock(&sc->mu);
    return first;
}

static size_t ask(struct script *sc, uint64_t id, uint64_t offset, uint64_t len)
{
    const uint64_t r[1][3] = {{id, offset, len}};
    return ask_n(sc, r, 1);
}

static int answers(struct script *sc, size_t i)
{
    pthread_mutex_lock(&sc->mu);
    int n = sc->answers[i];
    pthread_mutex_unlock(&sc->mu);
    return n;
}

/* Wait (bounded: 20 s) until ask i has an answer. */
static bool wait_answer(struct script *sc, size_t i)
{
    for (int k = 0; k < 20000 && answers(sc, i) == 0; k++)
        usleep(1000);
    return answers(sc, i) > 0;
}

struct fx {
    struct fake_master fm;
    struct kvp_msession *ms;
    struct kvp_cfg_segment cfg;
    struct script sc;
    bool fill_all;                  /* on_mount: fill the whole region with pattern() */
    _Atomic(uint8_t *) base;
    _Atomic uint64_t size;
};

static uint8_t pattern(uint64_t i)
{
    return (uint8_t)(i * 131 + (i >> 12));
}

/* The region's bytes are written here, on the thread of kvp_segment_start, before the segment's
 * heartbeat actor is spawned: its reads are ordered after these writes (also for TSan). A write
 * from the test thread later would be ordered only through the fake master's ZeroMQ socket. */
static void on_mount(void *ctx, uint32_t old_id, uint32_t new_id, void *base, uint64_t size)
{
    struct fx *f = ctx;
    if (!new_id)
        return;
    uint8_t *b = base;
    if (f->fill_all)
        for (uint64_t i = 0; i < size; i++)
            b[i] = pattern(i);
    else /* the last page only (the large range's second step); the rest reads as zeros */
        memset(b + size - 4096, 0x77, 4096);
    atomic_store(&f->base, base);
    atomic_store(&f->size, size);
}

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);
    pthread_mutex_init(&f->sc.mu, NULL);
    if (fm_start_hb(&f->fm, on_heartbeat, &f->sc) != 0)
        return -1;
    const char *m[1] = {f->fm.addr};
    if (kvp_msession_new(&f->ms, m, 1, "test-seg-verify") != KVP_OK)
        return -1;
    kvp_cfg_defaults(KVP_CFG_SEGMENT, &f->cfg);
    snprintf(f->cfg.local_hostname, sizeof f->cfg.local_hostname, "127.0.0.1");
    f->cfg.global_segment_size = 4 << 20;
    f->cfg.heartbeat_ms = 30;
    f->cfg.hugepages = false;
    f->cfg.segment_prefault = false;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    kvp_msession_destroy(&f->ms);
    fm_stop(&f->fm);
    pthread_mutex_destroy(&f->sc.mu);
    free(f);
    return 0;
}

static void test_seg_verify_inside_outside_ok(void **state)
{
    struct fx *f = *state;
    struct kvp_segment *s = NULL;
    struct kvp_segment_hooks h = {.ctx = f, .on_mount = on_mount};
    f->fill_all = true;
    assert_int_equal(kvp_segment_start(&s, &f->cfg, f->ms, &h), KVP_OK);
    uint8_t *base = atomic_load(&f->base);
    uint64_t size = atomic_load(&f->size);
    assert_non_null(base);
    assert_int_equal(size, 4 << 20);
    struct script *sc = &f->sc;
    size_t a = ask(sc, 11, 4096, 100000);
    size_t b = ask(sc, 12, size - 10, 20);             /* runs past the end */
    size_t c = ask(sc, 13, 100, 0);                    /* empty */
    size_t d = ask(sc, 14, UINT64_MAX - 5, 10);        /* offset + len overflows */
    size_t e = ask(sc, 15, 0, size);                   /* the whole region */
    size_t g = ask(sc, 16, size, 1);                   /* starts at the end */
    for (size_t i = a; i <= g; i++)
        assert_true(wait_answer(sc, i));
    assert_int_equal(sc->status[a], KVP_OK);
    assert_true(sc->checksum[a] == XXH3_64bits(base + 4096, 100000));
    /* the client's object checksum over the same bytes in three pieces: the same function */
    kvp_iov iov[3] = {{base + 4096, 1000}, {base + 5096, 50000}, {base + 55096, 49000}};
    assert_true(sc->checksum[a] == kvp_client_checksum(iov, 3, 100000));
    assert_int_equal(sc->status[b], KVP_ERR_INVALID);
    assert_int_equal(sc->status[c], KVP_ERR_INVALID);
    assert_int_equal(sc->status[d], KVP_ERR_INVALID);
    assert_int_equal(sc->status[g], KVP_ERR_INVALID);
    assert_int_equal(sc->status[e], KVP_OK);
    assert_true(sc->checksum[e] == XXH3_64bits(base, size));
    /* each answered once, in a heartbeat after the answer that asked (the next one, unless a
     * heartbeat's call timed out on the way: counted, not timed) */
    pthread_mutex_lock(&sc->mu);
    for (size_t i = a; i <= g; i++) {
        assert_int_equal(sc->answers[i], 1);
        assert_true(sc->answer_beat[i] > sc->asked_beat[i]);
    }
    pthread_mutex_unlock(&sc->mu);
    /* the segment goes on serving: another ask after the refusals, and its data plane */
    size_t a2 = ask(sc, 17, 200000, 5000);
    assert_true(wait_answer(sc, a2));
    assert_int_equal(sc->status[a2], KVP_OK);
    assert_true(sc->checksum[a2] == XXH3_64bits(base + 200000, 5000));
    assert_true(sc->checksum[a2] != sc->checksum[a]);
    assert_int_equal(kvp_xfer_probe(kvp_segment_endpoint(s), kvp_segment_id(s), 1000), KVP_OK);
    /* a resent ask of an id still queued is answered once; an answered one again when asked */
    pthread_mutex_lock(&sc->mu);
    assert_int_equal(sc->unknown_ids, 0);
    pthread_mutex_unlock(&sc->mu);
    kvp_segment_stop(&s);
}

static void test_seg_verify_large_range_split_across_beats(void **state)
{
    struct fx *f = *state;
    /* one budget plus 64 MiB: two steps. Untouched anonymous memory reads as zeros. */
    f->cfg.global_segment_size = KVP_SEG_VERIFY_BUDGET_BYTES + (64u << 20);
    struct kvp_segment *s = NULL;
    struct kvp_segment_hooks h = {.ctx = f, .on_mount = on_mount};
    assert_int_equal(kvp_segment_start(&s, &f->cfg, f->ms, &h), KVP_OK);
    uint8_t *base = atomic_load(&f->base);
    uint64_t size = atomic_load(&f->size);
    assert_non_null(base); /* its last page 0x77 (on_mount), hashed in the second step */
    struct script *sc = &f->sc;
    /* the third is queued behind the big one's first step */
    const uint64_t r[3][3] = {{21, 0, 4096}, {22, 0, size}, {23, 8192, 4096}};
    size_t small = ask_n(sc, r, 3), big = small + 1, after = small + 2;
    assert_true(wait_answer(sc, small));
    assert_true(wait_answer(sc, big));
    assert_true(wait_answer(sc, after));
    assert_int_equal(sc->status[big], KVP_OK);
    assert_true(sc->checksum[big] == XXH3_64bits(base, size));
    assert_true(sc->checksum[small] == XXH3_64bits(base, 4096));
    assert_true(sc->checksum[after] == XXH3_64bits(base + 8192, 4096));
    /* asked together; the budget ran out in the big range: it and the one behind it came at least
     * a heartbeat after the small one (counted, not timed) */
    pthread_mutex_lock(&sc->mu);
    assert_int_equal(sc->asked_beat[small], sc->asked_beat[big]);
    assert_true(sc->answer_beat[big] > sc->answer_beat[small]);
    assert_true(sc->answer_beat[after] > sc->answer_beat[small]);
    pthread_mutex_unlock(&sc->mu);
    kvp_segment_stop(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_seg_verify_inside_outside_ok, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seg_verify_large_range_split_across_beats, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
