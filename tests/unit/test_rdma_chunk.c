/*
 * test_rdma_chunk.c — chunked registration and chunk-clamped slices
 * (actors/transfer/rdma/rdma_chunk.h) against the verbs test double: chunk sizing, cleanup on a
 * failing chunk (max_mr_size, memlock), the chunk table from a peer, binary-search lookup, and
 * over many seeds, spans that never cross a chunk on either side, moved end to end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "actors/transfer/rdma/rdma_chunk.h"
#include "actors/transfer/rdma/rdma_fence.h"
#include "kvpool.h"
#include "runtime/log.h"
#include "tests/lib/fakeverbs.h"
#include "tests/lib/fv_conn.h"

#define KIB 1024ull
#define SEG_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void test_rdma_chunk_bytes_clamped_and_page_aligned(void **state)
{
    (void)state;
    uint64_t c;
    assert_int_equal(kvp_rdma_chunk_bytes(64ull << 30, 4096, &c), KVP_OK);
    assert_int_equal(c, 4ull << 30);
    assert_int_equal(kvp_rdma_chunk_bytes(64 * KIB + 100, 4096, &c), KVP_OK);
    assert_int_equal(c, 64 * KIB);
    assert_int_equal(kvp_rdma_chunk_bytes(UINT64_MAX, 2ull << 20, &c), KVP_OK);
    assert_int_equal(c, 4ull << 30);
    assert_int_equal(kvp_rdma_chunk_bytes(100, 4096, &c), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_chunk_bytes(1 << 20, 3000, &c), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_chunk_bytes(1 << 20, 0, &c), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_chunk_bytes(1 << 20, 4096, NULL), KVP_ERR_INVALID);
}

struct node1 {
    struct fv_fabric *f;
    struct fv_node *n;
    struct fv_end e;
};

static void node1_up(struct node1 *x, uint64_t max_mr, uint64_t memlock)
{
    assert_int_equal(fv_fabric_new(&x->f, NULL), KVP_OK);
    struct fv_node_config c = {.n_devices = 1, .max_mr_size = max_mr, .memlock_bytes = memlock};
    assert_int_equal(fv_node_add(x->f, &c, &x->n), KVP_OK);
    assert_int_equal(fv_end_open(fv_node_ops(x->n), 0, 64, &x->e), 0);
}

static void test_rdma_region_register_chunks_and_find(void **state)
{
    (void)state;
    struct node1 x;
    node1_up(&x, 64 * KIB, 0);
    size_t len = 1024 * KIB + 123;
    uint8_t *mem = malloc(len);
    assert_non_null(mem);
    uint64_t cb;
    assert_int_equal(kvp_rdma_chunk_bytes(64 * KIB, 4096, &cb), KVP_OK);
    struct kvp_rdma_region r;
    assert_int_equal(kvp_rdma_region_register(x.e.ops, x.e.pd, mem, len, cb, SEG_ACCESS, &r), KVP_OK);
    assert_int_equal(r.n, 17);
    assert_int_equal(r.chunks[16].len, 123);
    for (size_t i = 0; i < r.n; i++) {
        assert_non_null(r.chunks[i].mr);
        for (size_t j = 0; j < i; j++)
            assert_true(r.chunks[i].rkey != r.chunks[j].rkey);
    }
    uint64_t b = (uint64_t)(uintptr_t)mem;
    for (uint64_t off = 0; off < len; off += 1000) {
        const struct kvp_rdma_chunk *c = kvp_rdma_region_find(&r, b + off);
        assert_non_null(c);
        assert_true(c->base <= b + off && b + off < c->base + c->len);
    }
    assert_ptr_equal(kvp_rdma_region_find(&r, b + 64 * KIB - 1), &r.chunks[0]);
    assert_ptr_equal(kvp_rdma_region_find(&r, b + 64 * KIB), &r.chunks[1]);
    assert_ptr_equal(kvp_rdma_region_find(&r, b + len - 1), &r.chunks[16]);
    assert_null(kvp_rdma_region_find(&r, b + len));
    assert_null(kvp_rdma_region_find(&r, b - 1));
    kvp_rdma_region_deregister(x.e.ops, &r);
    assert_int_equal(r.n, 0);
    kvp_rdma_region_deregister(x.e.ops, &r); /* empty: no-op */
    free(mem);
    fv_fabric_destroy(&x.f);
}

/* A chunk the device refuses (larger than max_mr_size: EINVAL; past the memlock budget:
 * ENOMEM) fails the whole registration and leaves nothing registered. */
static void test_rdma_region_register_failure_cleans_up(void **state)
{
    (void)state;
    struct node1 x;
    size_t len = 512 * KIB;
    node1_up(&x, 64 * KIB, len);
    uint8_t *mem = malloc(len);
    assert_non_null(mem);
    struct kvp_rdma_region r;
    assert_int_equal(kvp_rdma_region_register(x.e.ops, x.e.pd, mem, len, 128 * KIB, SEG_ACCESS, &r),
                     KVP_ERR_INVALID);
    assert_int_equal(r.n, 0);
    assert_null(r.chunks);
    /* memlock: 64 KiB taken by another MR, so the 8th chunk fails after 7 were registered;
     * they must all be released again */
    struct ibv_mr *hog = x.e.ops->reg_mr(x.e.pd, mem, 64 * KIB, IBV_ACCESS_LOCAL_WRITE);
    assert_non_null(hog);
    assert_int_equal(kvp_rdma_region_register(x.e.ops, x.e.pd, mem, len, 64 * KIB, SEG_ACCESS, &r),
                     KVP_ERR_NOMEM); /* memlock: 64 KiB already taken */
    assert_int_equal(x.e.ops->dereg_mr(hog), 0);
    /* the whole budget is free again: nothing leaked from the two failed attempts */
    assert_int_equal(kvp_rdma_region_register(x.e.ops, x.e.pd, mem, len, 64 * KIB, SEG_ACCESS, &r),
                     KVP_OK);
    kvp_rdma_region_deregister(x.e.ops, &r);
    fv_node_fail_next(x.n, FV_OP_REG, EFAULT);
    assert_int_equal(kvp_rdma_region_register(x.e.ops, x.e.pd, mem, len, 64 * KIB, SEG_ACCESS, &r),
                     KVP_ERR_IO);
    assert_int_equal(kvp_rdma_region_register(NULL, x.e.pd, mem, len, 64 * KIB, SEG_ACCESS, &r),
                     KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_region_register(x.e.ops, x.e.pd, mem, 0, 64 * KIB, SEG_ACCESS, &r),
                     KVP_ERR_INVALID);
    free(mem);
    fv_fabric_destroy(&x.f);
}

static void test_rdma_region_from_table_checks_entries(void **state)
{
    (void)state;
    struct kvp_rdma_chunk t[3] = {{.base = 0x10000, .len = 0x1000, .rkey = 1},
                                  {.base = 0x11000, .len = 0x1000, .rkey = 2},
                                  {.base = 0x12000, .len = 0x10, .rkey = 3}};
    struct kvp_rdma_region r;
    assert_int_equal(kvp_rdma_region_from_table(t, 3, &r), KVP_OK);
    assert_int_equal(r.len, 0x2010);
    assert_int_equal(kvp_rdma_region_find(&r, 0x11fff)->rkey, 2);
    assert_null(r.chunks[0].mr);
    kvp_rdma_region_deregister(NULL, &r);
    t[1].base = 0x11001; /* gap */
    assert_int_equal(kvp_rdma_region_from_table(t, 3, &r), KVP_ERR_INVALID);
    t[1].base = 0x11000;
    t[2].len = 0; /* empty */
    assert_int_equal(kvp_rdma_region_from_table(t, 3, &r), KVP_ERR_INVALID);
    t[2].len = 0x10;
    t[2].base = UINT64_MAX - 4; /* wraps (and a gap) */
    assert_int_equal(kvp_rdma_region_from_table(t, 3, &r), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_region_from_table(t, 0, &r), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_region_from_table(NULL, 1, &r), KVP_ERR_INVALID);
}

/* Pure: spans cover the range in order, each inside one local and one remote chunk, at most
 * slice_bytes, with the right keys. Many seeds, odd chunk sizes on both sides. */
static void test_rdma_spans_never_cross_a_chunk_many_seeds(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 2000; seed++) {
        uint64_t rng = seed;
        uint64_t lchunk = KIB + mix(&rng) % (95 * KIB), rchunk = KIB + mix(&rng) % (95 * KIB);
        uint64_t llen = 1 + mix(&rng) % (1024 * KIB), rlen = 1 + mix(&rng) % (1024 * KIB);
        struct kvp_rdma_chunk lt[1025], rt[1025]; /* chunks >= 1 KiB over <= 1 MiB */
        size_t ln = 0, rn = 0;
        for (uint64_t o = 0; o < llen; o += lchunk, ln++)
            lt[ln] = (struct kvp_rdma_chunk){.base = 0x100000 + o,
                                             .len = llen - o < lchunk ? llen - o : lchunk,
                                             .lkey = (uint32_t)(1000 + ln)};
        for (uint64_t o = 0; o < rlen; o += rchunk, rn++)
            rt[rn] = (struct kvp_rdma_chunk){.base = 0x7000000 + o,
                                             .len = rlen - o < rchunk ? rlen - o : rchunk,
                                             .rkey = (uint32_t)(5000 + rn)};
        struct kvp_rdma_region L, R;
        assert_int_equal(kvp_rdma_region_from_table(lt, ln, &L), KVP_OK);
        assert_int_equal(kvp_rdma_region_from_table(rt, rn, &R), KVP_OK);
        uint64_t maxlen = llen < rlen ? llen : rlen;
        uint64_t len = 1 + mix(&rng) % maxlen;
        uint64_t lo = mix(&rng) % (llen - len + 1), ro = mix(&rng) % (rlen - len + 1);
        uint64_t slice = 1 + mix(&rng) % (300 * KIB);
        size_t need = 0;
        int rc = kvp_rdma_spans(&L, L.base + lo, &R, R.base + ro, len, slice, NULL, 0, &need);
        assert_int_equal(rc, KVP_ERR_BUSY);
        struct kvp_rdma_span *sp = calloc(need, sizeof *sp);
        assert_non_null(sp);
        size_t n;
        assert_int_equal(kvp_rdma_spans(&L, L.base + lo, &R, R.base + ro, len, slice, sp, need, &n),
                         KVP_OK);
        assert_int_equal(n, need);
        uint64_t at = 0;
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(sp[i].laddr, L.base + lo + at);
            assert_int_equal(sp[i].raddr, R.base + ro + at);
            assert_true(sp[i].len > 0 && sp[i].len <= slice);
            const struct kvp_rdma_chunk *a = kvp_rdma_region_find(&L, sp[i].laddr);
            const struct kvp_rdma_chunk *b = kvp_rdma_region_find(&R, sp[i].raddr);
            assert_ptr_equal(a, kvp_rdma_region_find(&L, sp[i].laddr + sp[i].len - 1));
            assert_ptr_equal(b, kvp_rdma_region_find(&R, sp[i].raddr + sp[i].len - 1));
            assert_int_equal(sp[i].lkey, a->lkey);
            assert_int_equal(sp[i].rkey, b->rkey);
            at += sp[i].len;
        }
        assert_int_equal(at, len);
        free(sp);
        /* outside the regions */
        assert_int_equal(kvp_rdma_spans(&L, L.base + llen - len + 1, &R, R.base, len, slice, NULL, 0,
                                        &n),
                         KVP_ERR_INVALID);
        assert_int_equal(kvp_rdma_spans(&L, L.base, &R, R.base - 1, len, slice, NULL, 0, &n),
                         KVP_ERR_INVALID);
        kvp_rdma_region_deregister(NULL, &L);
        kvp_rdma_region_deregister(NULL, &R);
    }
    struct kvp_rdma_chunk one = {.base = 4096, .len = 4096};
    struct kvp_rdma_region L;
    assert_int_equal(kvp_rdma_region_from_table(&one, 1, &L), KVP_OK);
    size_t n;
    assert_int_equal(kvp_rdma_spans(&L, 4096, &L, 4096, 0, 64, NULL, 0, &n), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_spans(&L, 4096, &L, 4096, 16, 0, NULL, 0, &n), KVP_ERR_INVALID);
    assert_int_equal(kvp_rdma_spans(&L, 4096, &L, 4096, 16, 4ull << 30, NULL, 0, &n), KVP_ERR_INVALID);
    kvp_rdma_region_deregister(NULL, &L);
}

/* End to end on the double: a segment registered in 64 KiB chunks (its device's max_mr_size),
 * a client buffer in 40 KiB chunks; random transfers split into spans land byte for byte, and
 * one WR that straddles a segment chunk edge fails with REM_ACCESS_ERR (why spans exist). */
static void test_rdma_spans_move_bytes_on_the_double_many_seeds(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 100; seed++) {
        uint64_t rng = seed * 97;
        struct fv_config fc = {.seed = seed, .jitter_ns = 5000};
        struct fv_fabric *f;
        struct fv_node *na, *nb;
        assert_int_equal(fv_fabric_new(&f, &fc), KVP_OK);
        struct fv_node_config ca = {.name = "client", .n_devices = 1, .max_mr_size = 40 * KIB};
        struct fv_node_config cb = {.name = "segment", .n_devices = 1, .max_mr_size = 64 * KIB};
        assert_int_equal(fv_node_add(f, &ca, &na), KVP_OK);
        assert_int_equal(fv_node_add(f, &cb, &nb), KVP_OK);
        struct fv_end a, b;
        assert_int_equal(fv_end_open(fv_node_ops(na), 0, 512, &a), 0);
        assert_int_equal(fv_end_open(fv_node_ops(nb), 0, 512, &b), 0);
        struct ibv_qp *qa, *qb;
        assert_int_equal(fv_connect(&a, &b, NULL, &qa, &qb), 0);
        size_t blen = 300 * KIB, slen = 512 * KIB;
        uint8_t *buf = malloc(blen), *seg = calloc(1, slen);
        assert_non_null(buf);
        assert_non_null(seg);
        struct kvp_rdma_region L, R;
        assert_int_equal(kvp_rdma_region_register(a.ops, a.pd, buf, blen, 40 * KIB,
                                                  IBV_ACCESS_LOCAL_WRITE, &L), KVP_OK);
        assert_int_equal(kvp_rdma_region_register(b.ops, b.pd, seg, slen, 64 * KIB, SEG_ACCESS, &R),
                         KVP_OK);
        struct kvp_rdma_slots slots;
        assert_int_equal(kvp_rdma_slots_init(&slots, 512, 1), KVP_OK);
        struct kvp_rdma_reaper rp = {.ops = a.ops, .slots = &slots, .who = "test"};
        struct kvp_rdma_cq cq = {.cq = a.cq, .size = 512};
        struct kvp_rdma_qp q = {.qp = qa, .cq = &cq, .max_send_wr = 256};
        uint64_t len = 1 + mix(&rng) % (200 * KIB);
        uint64_t lo = mix(&rng) % (blen - len + 1), ro = mix(&rng) % (slen - len + 1);
        for (uint64_t i = 0; i < len; i++)
            buf[lo + i] = (uint8_t)(seed + i * 31);
        struct kvp_rdma_span sp[64];
        size_t n;
        for (int dir = 0; dir < 2; dir++) { /* WRITE buf→seg, then READ seg→buf+other place */
            uint64_t l = dir ? (lo + len <= blen / 2 ? blen - len : 0) : lo;
            assert_int_equal(kvp_rdma_spans(&L, L.base + l, &R, R.base + ro, len, 16 * KIB, sp, 64,
                                            &n), KVP_OK);
            for (size_t i = 0; i < n; i++) {
                struct ibv_send_wr wr;
                struct ibv_sge sge;
                fv_wr(&wr, &sge, dir ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE, 0,
                      (void *)(uintptr_t)sp[i].laddr, sp[i].len, sp[i].lkey, sp[i].raddr,
                      sp[i].rkey);
                assert_int_equal(kvp_rdma_post(&rp, &q, &wr, i, NULL), KVP_OK);
            }
            fv_run_idle(f, 100 * 1000000ull);
            assert_int_equal(kvp_rdma_reap(&rp, &cq, 512), (int)n);
            assert_int_equal(q.outstanding, 0);
            if (dir)
                for (uint64_t i = 0; i < len; i++)
                    assert_int_equal(buf[l + i], (uint8_t)(seed + i * 31));
            else
                assert_memory_equal(seg + ro, buf + lo, len);
        }
        /* one WR across the segment's first chunk edge */
        struct ibv_send_wr wr, *bad;
        struct ibv_sge sge;
        fv_wr(&wr, &sge, IBV_WR_RDMA_WRITE, 99, buf, 8192, L.chunks[0].lkey,
              R.chunks[0].base + R.chunks[0].len - 4096, R.chunks[0].rkey);
        assert_int_equal(a.ops->post_send(qa, &wr, &bad), 0);
        fv_run_idle(f, 100 * 1000000ull);
        struct ibv_wc wc;
        assert_int_equal(a.ops->poll_cq(a.cq, 1, &wc), 1);
        assert_int_equal(wc.status, IBV_WC_REM_ACCESS_ERR);
        kvp_rdma_slots_fini(&slots);
        assert_int_equal(a.ops->destroy_qp(qa), 0);
        assert_int_equal(b.ops->destroy_qp(qb), 0);
        kvp_rdma_region_deregister(a.ops, &L);
        kvp_rdma_region_deregister(b.ops, &R);
        fv_end_close(&a);
        fv_end_close(&b);
        fv_fabric_destroy(&f);
        free(buf);
        free(seg);
    }
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rdma_chunk_bytes_clamped_and_page_aligned),
        cmocka_unit_test(test_rdma_region_register_chunks_and_find),
        cmocka_unit_test(test_rdma_region_register_failure_cleans_up),
        cmocka_unit_test(test_rdma_region_from_table_checks_entries),
        cmocka_unit_test(test_rdma_spans_never_cross_a_chunk_many_seeds),
        cmocka_unit_test(test_rdma_spans_move_bytes_on_the_double_many_seeds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
