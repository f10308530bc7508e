/*
 * test_client_fakemaster.c — the client library's flows against the real master state
 * machine (actors/master/fsm/fsm.h) behind a one-thread fake master service (tests/lib/fake_master.h:
 * a ROUTER in this process, no Raft, every mutation applied directly) and three real segment
 * data-plane servers (actors/segment/seg_server.h) over loopback TCP.
 *
 * Covers: sizes, replica_num 1..3, batches, scatter-gather, exists/size/remove, the batch
 * semantics of issue 4 item 4 (duplicate key in batch_get, one existing key in batch_put, two
 * clients racing on one key, dead-only replica fails fast then exists says no once the segment
 * is lost, buffer too small), replica failover, checksum mismatch → CORRUPT, many threads,
 * register_buffer, closed client. Every payload derives from its key; every read buffer is
 * poisoned first.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>
#include <zmq.h>

#include "actors/client/api_config.h"
#include "actors/client/client.h"
#include "actors/client/client_state.h"
#include "actors/session/msession.h"
#include "actors/master/fsm/fsm.h"
#include "actors/segment/seg_server.h"
#include "kvpool.h"
#include "runtime/clock.h"
#include "tests/integration/test_batch_util.h"
#include "tests/lib/fake_master.h"
#include "wire/envelope.h"

#define NSEG 3
#define SEG_BYTES (96ull << 20)
#define POISON 0xA5

/* ------------------------------------------------------------------ fake master */

static struct kvp_fake_master M;

static struct {
    struct kvp_seg_server *srv;
    void *base;
    uint32_t id;
    char endpoint[64];
} S[NSEG];

/* Mount segment i through a session (as a segment daemon would). */
static void mount_segment(int i)
{
    char name[32];
    snprintf(name, sizeof name, "seg-%d", i);
    S[i].id = kvp_fake_master_mount(&M, name, S[i].endpoint, SEG_BYTES);
    kvp_seg_server_set_id(S[i].srv, S[i].id);
}

static void start_segment(int i)
{
    S[i].base = calloc(1, SEG_BYTES);
    assert_non_null(S[i].base);
    assert_int_equal(kvp_seg_server_start(&S[i].srv, "127.0.0.1", 0, S[i].base, SEG_BYTES), KVP_OK);
    snprintf(S[i].endpoint, sizeof S[i].endpoint, "127.0.0.1:%u", kvp_seg_server_port(S[i].srv));
    mount_segment(i);
}

/* Apply SegmentLost for segment i (what the master does after client_ttl). */
static void declare_lost(int i)
{
    Kvp__Command cmd;
    Kvp__SegmentLostCmd sl;
    kvp__command__init(&cmd);
    kvp__segment_lost_cmd__init(&sl);
    sl.segment_id = S[i].id;
    cmd.now_wall_ms = kvp_clock_wall_ms();
    cmd.term = 1;
    cmd.body_case = KVP__COMMAND__BODY_SEGMENT_LOST;
    cmd.segment_lost = &sl;
    Kvp__Response *resp = NULL;
    pthread_mutex_lock(&M.mu);
    assert_int_equal(kvp_master_fsm_apply(M.fsm, &cmd, &resp), KVP_OK);
    pthread_mutex_unlock(&M.mu);
    kvp_master_fsm_response_free(resp);
}

/* Segment indexes holding replicas of key (asks the FSM directly). */
static size_t replica_segments(const char *key, int *idx, uint64_t *offsets)
{
    Kvp__Response *resp = kvp_fake_master_get_replicas(&M, key);
    size_t n = 0;
    const Kvp__ObjectInfo *o = resp->get_replicas->objects[0];
    for (size_t r = 0; o->status == KVP_OK && r < o->n_replicas; r++)
        for (int i = 0; i < NSEG; i++)
            if (S[i].id == o->replicas[r]->segment_id) {
                idx[n] = i;
                offsets[n++] = o->replicas[r]->offset;
            }
    kvp_master_fsm_response_free(resp);
    return n;
}

/* ------------------------------------------------------------------ payloads */

/* payloads derive from the key (tests/integration/test_client_util.h) */
static void fill(const char *key, uint8_t *buf, size_t len) { tc_fill(key, buf, len); }

static bool check(const char *key, const uint8_t *buf, size_t len) { return tc_check(key, buf, len); }

static bool all_poison(const uint8_t *buf, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (buf[i] != POISON)
            return false;
    return true;
}

static kvp_client *open_client(uint32_t timeout_ms)
{
    return kvp_fake_master_open_client(&M, timeout_ms);
}

static int setup(void **state)
{
    (void)state;
    struct kvp_master_fsm_params p = {.fence_grace_ms = 5000, .put_ttl_ms = 30000};
    if (kvp_fake_master_start(&M, &p) != 0)
        return -1;
    for (int i = 0; i < NSEG; i++)
        start_segment(i);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvp_fake_master_stop(&M);
    for (int i = 0; i < NSEG; i++) {
        kvp_seg_server_stop(&S[i].srv);
        free(S[i].base);
    }
    return 0;
}

/* ------------------------------------------------------------------ tests */

static void roundtrip(kvp_client *c, const char *key, size_t len, uint32_t replicas)
{
    uint8_t *src = malloc(len), *dst = malloc(len + 64);
    fill(key, src, len);
    kvp_put_opts o = {.replica_num = replicas};
    assert_int_equal(kvp_put(c, key, src, len, &o), KVP_OK);
    memset(dst, POISON, len + 64);
    assert_int_equal(kvp_get(c, key, dst, len + 64, 0), (int64_t)len);
    assert_true(check(key, dst, len));
    assert_true(all_poison(dst + len, 64)); /* nothing past the object */
    assert_int_equal(kvp_exists(c, key), 1);
    assert_int_equal(kvp_get_size(c, key), (int64_t)len);
    int idx[NSEG];
    uint64_t off[NSEG];
    assert_int_equal(replica_segments(key, idx, off), replicas);
    for (uint32_t r = 0; r < replicas; r++) /* every replica holds the bytes */
        assert_memory_equal((uint8_t *)S[idx[r]].base + off[r], src, len);
    free(src);
    free(dst);
}

static void test_client_sizes_and_replicas_roundtrip(void **state)
{
    (void)state;
    kvp_client *c = open_client(20000);
    const size_t sizes[] = {1, 4096, 1u << 20, 32u << 20};
    char key[64];
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (uint32_t r = 1; r <= 3; r++) {
            snprintf(key, sizeof key, "size-%zu-r%u", sizes[s], r);
            roundtrip(c, key, sizes[s], r);
        }
    /* A longest key works, one byte more does not. */
    char big[KVP_MAX_KEY_BYTES + 2];
    memset(big, 'k', sizeof big);
    big[KVP_MAX_KEY_BYTES] = '\0';
    roundtrip(c, big, 100, 1);
    big[KVP_MAX_KEY_BYTES] = 'k';
    big[KVP_MAX_KEY_BYTES + 1] = '\0';
    uint8_t b = 1;
    assert_int_equal(kvp_put(c, big, &b, 1, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_put(c, "", &b, 1, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_put(c, "zero", &b, 0, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_put(c, NULL, &b, 1, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_get(c, "", &b, 1, 0), KVP_ERR_INVALID);
    assert_int_equal(kvp_get(c, "never-put", &b, 1, 0), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_exists(c, "never-put"), 0);
    assert_int_equal(kvp_get_size(c, "never-put"), KVP_ERR_NOT_FOUND);
    tc_close(&c);
    assert_null(c);
}

/* keys "<tag>-<i>", lengths len + i % 7 */
static void batch_roundtrip(kvp_client *c, size_t n, size_t len, uint32_t replicas, const char *tag)
{
    tb_batch_roundtrip(c, n, tag, len, 7, replicas);
}

static void test_client_batches_roundtrip(void **state)
{
    (void)state;
    kvp_client *c = open_client(20000);
    batch_roundtrip(c, 1, 4096, 1, "b1");
    batch_roundtrip(c, 32, 4096, 2, "b32");
    batch_roundtrip(c, 1024, 4096, 3, "b1024");
    batch_roundtrip(c, 1024, 1, 1, "b1024-tiny");
    tc_close(&c);
}

static void test_client_iov_scatter_gather_roundtrip(void **state)
{
    (void)state;
    kvp_client *c = open_client(10000);
    /* object "iov-0" = 3 pieces (one empty); read back into 4 pieces of other sizes */
    uint8_t whole[10000];
    fill("iov-0", whole, sizeof whole);
    kvp_iov put_iov[4] = {{whole, 3000}, {whole + 3000, 0}, {whole + 3000, 6999}, {whole + 9999, 1}};
    const kvp_iov *piov[1] = {put_iov};
    size_t pcnt[1] = {4};
    const char *keys[1] = {"iov-0"};
    int res[1];
    assert_int_equal(kvp_batch_put_iov(c, 1, keys, piov, pcnt, NULL, res), KVP_OK);
    assert_int_equal(res[0], KVP_OK);
    uint8_t a[1], b[5000], d[7000];
    memset(a, POISON, sizeof a);
    memset(b, POISON, sizeof b);
    memset(d, POISON, sizeof d);
    kvp_iov get_iov[3] = {{a, 1}, {b, 5000}, {d, 7000}};
    const kvp_iov *giov[1] = {get_iov};
    size_t gcnt[1] = {3};
    int64_t gres[1];
    assert_int_equal(kvp_batch_get_iov(c, 1, keys, giov, gcnt, 0, gres), KVP_OK);
    assert_int_equal(gres[0], 10000);
    assert_memory_equal(a, whole, 1);
    assert_memory_equal(b, whole + 1, 5000);
    assert_memory_equal(d, whole + 5001, 4999);
    assert_true(all_poison(d + 4999, 7000 - 4999));
    /* pieces too small in total: BUFFER_TOO_SMALL, nothing written */
    memset(b, POISON, sizeof b);
    kvp_iov small_iov[1] = {{b, 5000}};
    const kvp_iov *siov[1] = {small_iov};
    size_t scnt[1] = {1};
    assert_int_equal(kvp_batch_get_iov(c, 1, keys, siov, scnt, 0, gres), KVP_OK);
    assert_int_equal(gres[0], KVP_ERR_BUFFER_TOO_SMALL);
    assert_true(all_poison(b, sizeof b));
    tc_close(&c);
}

static void test_client_batch_get_duplicate_key_both_filled(void **state)
{
    (void)state;
    kvp_client *c = open_client(10000);
    uint8_t src[8192];
    fill("dup", src, sizeof src);
    kvp_put_opts o = {.replica_num = 2};
    assert_int_equal(kvp_put(c, "dup", src, sizeof src, &o), KVP_OK);
    uint8_t b0[8192], b1[8192], b2[100];
    memset(b0, POISON, sizeof b0);
    memset(b1, POISON, sizeof b1);
    memset(b2, POISON, sizeof b2);
    const char *keys[4] = {"dup", "missing", "dup", "dup"};
    void *bufs[4] = {b0, b2, b1, b2};
    size_t caps[4] = {sizeof b0, sizeof b2, sizeof b1, sizeof b2};
    int64_t res[4];
    assert_int_equal(kvp_batch_get(c, 4, keys, bufs, caps, 0, res), KVP_OK);
    assert_int_equal(res[0], 8192);
    assert_int_equal(res[1], KVP_ERR_NOT_FOUND);
    assert_int_equal(res[2], 8192);
    assert_int_equal(res[3], KVP_ERR_BUFFER_TOO_SMALL);
    assert_true(check("dup", b0, sizeof b0));
    assert_true(check("dup", b1, sizeof b1));
    assert_true(all_poison(b2, sizeof b2));
    tc_close(&c);
}

static void test_client_batch_put_one_existing_key_exists_only(void **state)
{
    (void)state;
    kvp_client *c = open_client(10000);
    uint8_t old[300], v[5][1000];
    fill("bp-old", old, sizeof old);
    assert_int_equal(kvp_put(c, "bp-2", old, sizeof old, NULL), KVP_OK);
    const char *keys[5] = {"bp-0", "bp-1", "bp-2", "bp-3", "bp-1"}; /* bp-2 exists; bp-1 twice */
    const void *bufs[5];
    size_t lens[5];
    for (int i = 0; i < 5; i++) {
        fill(keys[i], v[i], sizeof v[i]);
        bufs[i] = v[i];
        lens[i] = sizeof v[i];
    }
    int res[5];
    assert_int_equal(kvp_batch_put(c, 5, keys, bufs, lens, NULL, res), KVP_OK);
    assert_int_equal(res[0], KVP_OK);
    assert_int_equal(res[1], KVP_OK);
    assert_int_equal(res[2], KVP_ERR_EXISTS);
    assert_int_equal(res[3], KVP_OK);
    assert_int_equal(res[4], KVP_ERR_EXISTS); /* the second bp-1 of the batch loses */
    uint8_t buf[1000];
    for (int i = 0; i < 4; i++) {
        memset(buf, POISON, sizeof buf);
        int64_t r = kvp_get(c, keys[i], buf, sizeof buf, 0);
        if (i == 2) {
            assert_int_equal(r, sizeof old); /* the old object is untouched */
            uint8_t want[300];
            fill("bp-old", want, sizeof want);
            assert_memory_equal(buf, want, sizeof want);
        } else {
            assert_int_equal(r, sizeof buf);
            assert_true(check(keys[i], buf, sizeof buf));
        }
    }
    tc_close(&c);
}

struct racer {
    kvp_client *c;
    const char *key;
    uint8_t *buf;
    size_t len;
    atomic_int *go;
    int rc;
};

static void *racer_main(void *arg)
{
    struct racer *r = arg;
    while (!atomic_load(r->go))
        ;
    r->rc = kvp_put(r->c, r->key, r->buf, r->len, NULL);
    return NULL;
}

static void test_client_two_clients_race_one_stores(void **state)
{
    (void)state;
    kvp_client *c1 = open_client(10000), *c2 = open_client(10000);
    for (int round = 0; round < 10; round++) {
        char key[32];
        snprintf(key, sizeof key, "race-%d", round);
        size_t len = 256 << 10;
        uint8_t *b1 = malloc(len), *b2 = malloc(len);
        fill(key, b1, len);
        fill(key, b2, len);
        atomic_int go = 0;
        struct racer r1 = {c1, key, b1, len, &go, 1}, r2 = {c2, key, b2, len, &go, 1};
        pthread_t t1, t2;
        pthread_create(&t1, NULL, racer_main, &r1);
        pthread_create(&t2, NULL, racer_main, &r2);
        atomic_store(&go, 1);
        pthread_join(t1, NULL);
        pthread_join(t2, NULL);
        assert_true((r1.rc == KVP_OK && r2.rc == KVP_ERR_EXISTS) ||
                    (r1.rc == KVP_ERR_EXISTS && r2.rc == KVP_OK));
        memset(b1, POISON, len);
        assert_int_equal(kvp_get(c2, key, b1, len, 0), (int64_t)len);
        assert_true(check(key, b1, len));
        free(b1);
        free(b2);
    }
    tc_close(&c1);
    tc_close(&c2);
}

static void test_client_remove_then_not_found(void **state)
{
    (void)state;
    kvp_client *c = open_client(10000);
    uint8_t v[64];
    fill("rm", v, sizeof v);
    assert_int_equal(kvp_put(c, "rm", v, sizeof v, NULL), KVP_OK);
    assert_int_equal(kvp_put(c, "rm", v, sizeof v, NULL), KVP_ERR_EXISTS);
    assert_int_equal(kvp_remove(c, "rm", true), KVP_OK);
    assert_int_equal(kvp_exists(c, "rm"), 0);
    assert_int_equal(kvp_get(c, "rm", v, sizeof v, 0), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_remove(c, "rm", false), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_remove(c, "", false), KVP_ERR_INVALID);
    tc_close(&c);
}

static void test_client_corrupt_replica_corrupt_or_next(void **state)
{
    (void)state;
    kvp_client *c = open_client(10000);
    uint8_t v[4096], buf[4096];
    fill("corrupt-1", v, sizeof v);
    assert_int_equal(kvp_put(c, "corrupt-1", v, sizeof v, NULL), KVP_OK);
    int idx[NSEG];
    uint64_t off[NSEG];
    assert_int_equal(replica_segments("corrupt-1", idx, off), 1);
    ((uint8_t *)S[idx[0]].base)[off[0] + 100] ^= 0xff; /* flip one byte of the only replica */
    memset(buf, POISON, sizeof buf);
    assert_int_equal(kvp_get(c, "corrupt-1", buf, sizeof buf, 0), KVP_ERR_CORRUPT);
    ((uint8_t *)S[idx[0]].base)[off[0] + 100] ^= 0xff;

    /* two replicas, the first corrupt: the read moves on to the good one */
    fill("corrupt-2", v, sizeof v);
    kvp_put_opts o = {.replica_num = 2};
    assert_int_equal(kvp_put(c, "corrupt-2", v, sizeof v, &o), KVP_OK);
    assert_int_equal(replica_segments("corrupt-2", idx, off), 2);
    ((uint8_t *)S[idx[0]].base)[off[0]] ^= 0x01;
    memset(buf, POISON, sizeof buf);
    assert_int_equal(kvp_get(c, "corrupt-2", buf, sizeof buf, 0), (int64_t)sizeof buf);
    assert_true(check("corrupt-2", buf, sizeof buf));
    ((uint8_t *)S[idx[0]].base)[off[0]] ^= 0x01;
    tc_close(&c);
}

struct worker {
    kvp_client *c;
    int id;
    int failures;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    for (int i = 0; i < 40; i++) {
        char key[64];
        snprintf(key, sizeof key, "thr-%d-%d", w->id, i);
        size_t len = 1000 + (size_t)i * 97;
        uint8_t *b = malloc(len);
        fill(key, b, len);
        if (kvp_put(w->c, key, b, len, NULL) != KVP_OK)
            w->failures++;
        memset(b, POISON, len);
        if (kvp_get(w->c, key, b, len, 0) != (int64_t)len || !check(key, b, len))
            w->failures++;
        free(b);
    }
    return NULL;
}

static void test_client_many_threads_one_client_ok(void **state)
{
    (void)state;
    kvp_client *c = open_client(20000);
    struct worker w[6];
    pthread_t t[6];
    for (int i = 0; i < 6; i++) {
        w[i] = (struct worker){.c = c, .id = i};
        pthread_create(&t[i], NULL, worker_main, &w[i]);
    }
    for (int i = 0; i < 6; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    tc_close(&c);
}

static void test_client_register_buffer_overlap_invalid(void **state)
{
    (void)state;
    kvp_client *c = open_client(10000);
    static uint8_t region[8192];
    assert_int_equal(kvp_register_buffer(c, region, 4096), KVP_OK);
    assert_int_equal(kvp_register_buffer(c, region + 4095, 10), KVP_ERR_INVALID);
    assert_int_equal(kvp_register_buffer(c, region + 4096, 4096), KVP_OK);
    assert_int_equal(kvp_register_buffer(c, NULL, 10), KVP_ERR_INVALID);
    assert_int_equal(kvp_register_buffer(c, region, 0), KVP_ERR_INVALID);
    assert_int_equal(kvp_unregister_buffer(c, region + 1), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_unregister_buffer(c, region), KVP_OK);
    assert_int_equal(kvp_unregister_buffer(c, region), KVP_ERR_NOT_FOUND);
    tc_close(&c);
    tc_close(&c); /* NULL */
    tc_close(NULL);
}

static void test_client_bad_arguments_invalid(void **state)
{
    (void)state;
    kvp_client *c = open_client(10000);
    uint8_t v[16] = {1, 2, 3};
    const char *keys[4] = {"args-ok", NULL, "", "args-null-buf"};
    const void *bufs[4] = {v, v, v, NULL};
    size_t lens[4] = {sizeof v, sizeof v, sizeof v, 8};
    int res[4];
    /* whole-call errors */
    assert_int_equal(kvp_batch_put(NULL, 4, keys, bufs, lens, NULL, res), KVP_ERR_INVALID);
    assert_int_equal(kvp_batch_put(c, 4, NULL, bufs, lens, NULL, res), KVP_ERR_INVALID);
    assert_int_equal(kvp_batch_put(c, 4, keys, bufs, lens, NULL, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_batch_put(c, 0, NULL, NULL, NULL, NULL, NULL), KVP_OK);
    int64_t gres[4];
    assert_int_equal(kvp_batch_get(c, 4, keys, NULL, lens, 0, gres), KVP_ERR_INVALID);
    assert_int_equal(kvp_batch_exists(c, 4, keys, NULL), KVP_ERR_INVALID);
    /* per-key errors; the valid key is stored */
    assert_int_equal(kvp_batch_put(c, 4, keys, bufs, lens, NULL, res), KVP_OK);
    assert_int_equal(res[0], KVP_OK);
    assert_int_equal(res[1], KVP_ERR_INVALID);
    assert_int_equal(res[2], KVP_ERR_INVALID);
    assert_int_equal(res[3], KVP_ERR_INVALID);
    uint8_t b0[16], b3[8];
    memset(b0, POISON, sizeof b0);
    void *gb[4] = {b0, b0, b0, NULL};
    size_t gc[4] = {sizeof b0, sizeof b0, sizeof b0, sizeof b3};
    assert_int_equal(kvp_batch_get(c, 4, keys, gb, gc, 0, gres), KVP_OK);
    assert_int_equal(gres[0], sizeof v);
    assert_memory_equal(b0, v, sizeof v);
    assert_int_equal(gres[1], KVP_ERR_INVALID);
    assert_int_equal(gres[2], KVP_ERR_INVALID);
    assert_int_equal(gres[3], KVP_ERR_INVALID);
    int ex[4];
    assert_int_equal(kvp_batch_exists(c, 4, keys, ex), KVP_OK);
    assert_int_equal(ex[0], 1);
    assert_int_equal(ex[1], KVP_ERR_INVALID);
    assert_int_equal(ex[2], KVP_ERR_INVALID);
    assert_int_equal(ex[3], 0);
    assert_int_equal(kvp_get_size(c, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_exists(c, ""), KVP_ERR_INVALID);
    kvp_client *none = NULL;
    assert_int_equal(kvp_client_open(NULL, &none), KVP_ERR_INVALID);
    kvp_config *cfg = NULL;
    assert_int_equal(kvp_config_new(&cfg), KVP_OK);
    assert_int_equal(kvp_client_open(cfg, &none), KVP_ERR_INVALID); /* no master list */
    assert_null(none);
    kvp_config_destroy(&cfg);
    tc_close(&c);
}

/* opts->replica_num above the limit: the whole call is refused (KVP_ERR_INVALID), nothing is
 * stored; at the limit the call runs (the master places as many as there are segments). */
static void test_client_put_replica_num_over_limit_invalid(void **state)
{
    (void)state;
    kvp_client *c = open_client(10000);
    uint8_t v[64];
    memset(v, 7, sizeof v);
    kvp_put_opts o = {.replica_num = KVP_CLIENT_MAX_REPLICAS + 1};
    assert_int_equal(kvp_put(c, "rn-over", v, sizeof v, &o), KVP_ERR_INVALID);
    const char *keys[1] = {"rn-over"};
    const void *bufs[1] = {v};
    size_t lens[1] = {sizeof v};
    int res[1] = {1};
    assert_int_equal(kvp_batch_put(c, 1, keys, bufs, lens, &o, res), KVP_ERR_INVALID);
    kvp_iov iov[1] = {{v, sizeof v}};
    const kvp_iov *iovs[1] = {iov};
    size_t cnt[1] = {1};
    assert_int_equal(kvp_batch_put_iov(c, 1, keys, iovs, cnt, &o, res), KVP_ERR_INVALID);
    assert_int_equal(kvp_exists(c, "rn-over"), 0);
    o.replica_num = KVP_CLIENT_MAX_REPLICAS;
    assert_int_equal(kvp_put(c, "rn-max", v, sizeof v, &o), KVP_OK);
    assert_int_equal(kvp_exists(c, "rn-max"), 1);
    tc_close(&c);
}

/* A batch put larger than KVP_CLIENT_PUT_CHUNK reaches the master as PutStarts of at most that
 * many items (one PutStart is one Raft command: a million items in one stalled the leader into
 * elections and the call failed UNAVAILABLE); every key is stored and read back, a key repeated
 * across chunks gets EXISTS in its second slot only. The batch get asks GetReplicaList for at
 * most KVP_CLIENT_GET_CHUNK keys at a time (600,000 keys x 3 replicas made a reply over the
 * 64 MiB message limit: every key UNAVAILABLE). */
static void test_client_large_batches_chunked(void **state)
{
    (void)state;
    kvp_client *c = open_client(60000);
    const size_t n = 2 * KVP_CLIENT_PUT_CHUNK + 5;
    char **keys = calloc(n, sizeof *keys);
    const void **bufs = calloc(n, sizeof *bufs);
    size_t *lens = calloc(n, sizeof *lens);
    int *res = calloc(n, sizeof *res);
    uint8_t *vals = malloc(n);
    for (size_t i = 0; i < n; i++) {
        keys[i] = malloc(32);
        snprintf(keys[i], 32, "chunk-%zu", i);
        vals[i] = (uint8_t)(i * 31 + 7);
        bufs[i] = &vals[i];
        lens[i] = 1;
    }
    snprintf(keys[n - 1], 32, "chunk-%d", 3); /* the last slot repeats a key of the first chunk */
    atomic_store(&M.max_put_start_items, 0);
    assert_int_equal(kvp_batch_put(c, n, (const char *const *)keys, bufs, lens, NULL, res), KVP_OK);
    for (size_t i = 0; i + 1 < n; i++)
        if (res[i] != KVP_OK)
            fail_msg("slot %zu (%s): %s", i, keys[i], kvp_errname(res[i]));
    assert_int_equal(res[n - 1], KVP_ERR_EXISTS);
    assert_true(atomic_load(&M.max_put_start_items) <= KVP_CLIENT_PUT_CHUNK);
    assert_true(atomic_load(&M.max_put_start_items) > 0);
    uint8_t *got = malloc(n);
    memset(got, POISON, n);
    void **gb = calloc(n, sizeof *gb);
    size_t *gc = calloc(n, sizeof *gc);
    int64_t *gr = calloc(n, sizeof *gr);
    for (size_t i = 0; i < n; i++) {
        gb[i] = &got[i];
        gc[i] = 1;
    }
    atomic_store(&M.max_get_replicas_keys, 0);
    assert_int_equal(kvp_batch_get(c, n - 1, (const char *const *)keys, gb, gc, 0, gr), KVP_OK);
    assert_true(atomic_load(&M.max_get_replicas_keys) <= KVP_CLIENT_GET_CHUNK);
    assert_true(atomic_load(&M.max_get_replicas_keys) > 0);
    for (size_t i = 0; i + 1 < n; i++) {
        assert_int_equal(gr[i], 1);
        assert_int_equal(got[i], vals[i]);
    }
    for (size_t i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
    free(bufs);
    free(lens);
    free(res);
    free(vals);
    free(got);
    free(gb);
    free(gc);
    free(gr);
    tc_close(&c);
}

/* iov lengths whose sum wraps around 2^64 (here to 9 bytes): KVP_ERR_INVALID for that key
 * before anything is sent (the master would have placed 9 bytes while the slices carried the
 * pieces' real lengths past the allocation into other objects' space); a neighbour stored
 * just before keeps its bytes. */
static void test_client_put_iov_length_overflow_invalid(void **state)
{
    (void)state;
    kvp_client *c = open_client(5000);
    uint8_t nb[4096], a[32], b[32];
    fill("ovf-neighbour", nb, sizeof nb);
    assert_int_equal(kvp_put(c, "ovf-neighbour", nb, sizeof nb, NULL), KVP_OK);
    memset(a, 1, sizeof a);
    memset(b, 2, sizeof b);
    kvp_iov iv[2] = {{a, SIZE_MAX - 10}, {b, 20}};
    const kvp_iov *ivs[1] = {iv};
    size_t cnt[1] = {2};
    const char *keys[1] = {"ovf"};
    int res[1] = {1};
    assert_int_equal(kvp_batch_put_iov(c, 1, keys, ivs, cnt, NULL, res), KVP_OK);
    assert_int_equal(res[0], KVP_ERR_INVALID);
    assert_int_equal(kvp_exists(c, "ovf"), 0);
    uint8_t got[4096];
    memset(got, POISON, sizeof got);
    assert_int_equal(kvp_get(c, "ovf-neighbour", got, sizeof got, 0), (int64_t)sizeof got);
    assert_true(check("ovf-neighbour", got, sizeof got));
    tc_close(&c);
}

struct closer_put {
    kvp_client *c;
    uint8_t *buf;
    size_t len;
    int rc;
};

static void *closer_put_main(void *arg)
{
    struct closer_put *p = arg;
    kvp_put_opts o = {.replica_num = 3};
    p->rc = kvp_put(p->c, "close-race", p->buf, p->len, &o);
    return NULL;
}

/* kvp_client_close while a put runs on another thread: the put ends (OK, or CLOSED with nothing
 * visible), close returns after it. */
static void test_client_close_during_put_returns(void **state)
{
    (void)state;
    kvp_client *c = open_client(20000);
    struct closer_put p = {.c = c, .len = 16u << 20, .rc = 1};
    p.buf = malloc(p.len);
    fill("close-race", p.buf, p.len);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, closer_put_main, &p), 0);
    for (;;) { /* wait until the put is inside the client */
        uint64_t n = atomic_load(&c->life) & ~(UINT64_C(1) << 63); /* calls inside (client_state.h) */
        if (n > 0)
            break;
        usleep(100);
    }
    tc_close(&c);
    pthread_join(t, NULL);
    assert_true(p.rc == KVP_OK || p.rc == KVP_ERR_CLOSED);
    kvp_client *c2 = open_client(10000);
    assert_int_equal(kvp_exists(c2, "close-race"), p.rc == KVP_OK ? 1 : 0);
    tc_close(&c2);
    free(p.buf);
}

struct closer_many {
    kvp_client *c;
    char key[32];
    uint8_t *buf;
    size_t len;
    int rc;
    atomic_bool returned;
};

static void *closer_many_main(void *arg)
{
    struct closer_many *p = arg;
    kvp_put_opts o = {.replica_num = 1};
    p->rc = kvp_put(p->c, p->key, p->buf, p->len, &o);
    atomic_store(&p->returned, true);
    return NULL;
}

/* kvp_client_close with several calls inside (the client actor's close protocol: the call that
 * leaves last tells the actor, which answers close): close returns, and every call returns OK or
 * CLOSED. */
static void test_client_close_with_several_calls_inside_returns_after_all(void **state)
{
    (void)state;
    enum { N = 6 };
    kvp_client *c = open_client(20000);
    static struct closer_many p[N];
    pthread_t t[N];
    for (int i = 0; i < N; i++) {
        p[i].c = c;
        snprintf(p[i].key, sizeof p[i].key, "close-many-%d", i);
        p[i].len = 1u << 20;
        p[i].buf = malloc(p[i].len);
        p[i].rc = 1;
        atomic_store(&p[i].returned, false);
        fill(p[i].key, p[i].buf, p[i].len);
        assert_int_equal(pthread_create(&t[i], NULL, closer_many_main, &p[i]), 0);
    }
    /* wait (bounded, 20 s) until every call entered the client: inside now, or already returned
     * (a call not entered yet would use the client after close freed it) */
    bool all = false;
    for (int k = 0; k < 200000 && !all; k++) {
        uint64_t n = atomic_load(&c->life) & ~(UINT64_C(1) << 63);
        int done = 0;
        for (int i = 0; i < N; i++)
            done += atomic_load(&p[i].returned);
        all = n + (uint64_t)done >= N;
        if (!all)
            usleep(100);
    }
    assert_true(all);
    /* close returns only once the last call inside left (its CA_IDLE answered close): the client
     * is freed then, so a call still inside would touch freed memory (ASan/TSan stages) */
    tc_close(&c);
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        assert_true(p[i].rc == KVP_OK || p[i].rc == KVP_ERR_CLOSED);
        free(p[i].buf);
    }
    kvp_client *c2 = open_client(10000); /* the later tests need the space */
    for (int i = 0; i < N; i++)
        (void)kvp_remove(c2, p[i].key, true);
    tc_close(&c2);
}

/* Must run last: stops segments. */
static void test_client_dead_replica_failover_then_dead_only_fails_fast(void **state)
{
    (void)state;
    kvp_client *c = open_client(4000);
    /* replica_num 2 objects, and one single-replica object per segment */
    enum { N = 16 };
    char keys[N][32];
    const char *kp[N];
    void *bufs[N];
    size_t caps[N];
    int64_t res[N];
    kvp_put_opts o2 = {.replica_num = 2};
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "fo-%d", i);
        kp[i] = keys[i];
        caps[i] = 65536;
        bufs[i] = malloc(caps[i]);
        fill(keys[i], bufs[i], caps[i]);
        assert_int_equal(kvp_put(c, keys[i], bufs[i], caps[i], &o2), KVP_OK);
    }
    /* find a single-replica key on segment 0 */
    char solo[32] = "";
    uint8_t sv[2048];
    kvp_put_opts o1 = {.replica_num = 1, .preferred_segment = "seg-0"};
    for (int i = 0; i < 20 && !solo[0]; i++) {
        char k[32];
        snprintf(k, sizeof k, "solo-%d", i);
        fill(k, sv, sizeof sv);
        assert_int_equal(kvp_put(c, k, sv, sizeof sv, &o1), KVP_OK);
        int idx[NSEG];
        uint64_t off[NSEG];
        if (replica_segments(k, idx, off) == 1 && idx[0] == 0)
            snprintf(solo, sizeof solo, "%s", k);
    }
    assert_true(solo[0] != '\0');

    kvp_seg_server_stop(&S[0].srv); /* segment 0 dies (its bytes stay in S[0].base, unserved) */
    int before = atomic_load(&M.unreachable_reports);
    for (int i = 0; i < N; i++)
        memset(bufs[i], POISON, caps[i]);
    assert_int_equal(kvp_batch_get(c, N, kp, bufs, caps, 0, res), KVP_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(res[i], (int64_t)caps[i]);
        assert_true(check(keys[i], bufs[i], caps[i]));
    }
    /* at least one object had a replica on segment 0 listed first, or none did: either way the
     * dead-only read below must be reported */
    memset(sv, POISON, sizeof sv);
    uint64_t t0 = kvp_clock_now_ms();
    assert_int_equal(kvp_get(c, solo, sv, sizeof sv, 0), KVP_ERR_TRANSFER);
    assert_true(kvp_clock_now_ms() - t0 <= 4000 + 1000); /* within the call's timeout */
    assert_true(all_poison(sv, sizeof sv));
    assert_true(atomic_load(&M.unreachable_reports) > before);
    assert_int_equal(kvp_exists(c, solo), 1); /* not yet declared lost */

    /* a put with a replica on the dead segment fails as a whole and leaves nothing visible;
     * its pending put is revoked at once */
    uint8_t *big = malloc(1 << 20);
    fill("half-written", big, 1 << 20);
    kvp_put_opts o3d = {.replica_num = 3};
    int before_put = atomic_load(&M.unreachable_reports);
    assert_int_equal(kvp_put(c, "half-written", big, 1 << 20, &o3d), KVP_ERR_TRANSFER);
    /* the put reports the dead segment too, so the master probes it and stops placing there
     * (before, puts kept failing on it until client_ttl) */
    assert_true(atomic_load(&M.unreachable_reports) > before_put);
    assert_int_equal(kvp_exists(c, "half-written"), 0);
    assert_int_equal(kvp_get(c, "half-written", big, 1 << 20, 0), KVP_ERR_NOT_FOUND);
    struct kvp_master_fsm_stats st;
    pthread_mutex_lock(&M.mu);
    kvp_master_fsm_stats(M.fsm, &st);
    pthread_mutex_unlock(&M.mu);
    assert_int_equal(st.pending_puts, 0);
    free(big);
    declare_lost(0);
    assert_int_equal(kvp_exists(c, solo), 0);
    assert_int_equal(kvp_get(c, solo, sv, sizeof sv, 0), KVP_ERR_NOT_FOUND);
    /* a put now lands on the live segments only */
    fill("after-loss", sv, sizeof sv);
    kvp_put_opts o3 = {.replica_num = 3};
    assert_int_equal(kvp_put(c, "after-loss", sv, sizeof sv, &o3), KVP_OK);
    memset(sv, POISON, sizeof sv);
    assert_int_equal(kvp_get(c, "after-loss", sv, sizeof sv, 0), (int64_t)sizeof sv);
    assert_true(check("after-loss", sv, sizeof sv));
    for (int i = 0; i < N; i++)
        free(bufs[i]);
    tc_close(&c);
    /* closed client */
    assert_int_equal(kvp_put(NULL, "x", sv, 1, NULL), KVP_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_sizes_and_replicas_roundtrip),
        cmocka_unit_test(test_client_batches_roundtrip),
        cmocka_unit_test(test_client_iov_scatter_gather_roundtrip),
        cmocka_unit_test(test_client_batch_get_duplicate_key_both_filled),
        cmocka_unit_test(test_client_batch_put_one_existing_key_exists_only),
        cmocka_unit_test(test_client_two_clients_race_one_stores),
        cmocka_unit_test(test_client_remove_then_not_found),
        cmocka_unit_test(test_client_corrupt_replica_corrupt_or_next),
        cmocka_unit_test(test_client_many_threads_one_client_ok),
        cmocka_unit_test(test_client_register_buffer_overlap_invalid),
        cmocka_unit_test(test_client_bad_arguments_invalid),
        cmocka_unit_test(test_client_put_replica_num_over_limit_invalid),
        cmocka_unit_test(test_client_large_batches_chunked),
        cmocka_unit_test(test_client_put_iov_length_overflow_invalid),
        cmocka_unit_test(test_client_close_during_put_returns),
        cmocka_unit_test(test_client_close_with_several_calls_inside_returns_after_all),
        cmocka_unit_test(test_client_dead_replica_failover_then_dead_only_fails_fast),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
