/* test_runtime_containers.c — the runtime's intrusive u64 hash map and timer heap, checked
 * against a plain reference model under random operations (fixed seed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "kvpool.h"
#include "runtime/actor_internal.h"

static uint64_t g_rng = 0x1234567;

static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

#define N 4096

static void test_runtime_hmap_random_ops_match_model(void **unused)
{
    struct rt_hmap m;
    rt_hmap_init(&m);
    static struct rt_hnode nodes[N];
    static bool present[N];
    size_t count = 0;
    for (int op = 0; op < 200000; op++) {
        size_t k = rnd() % N;
        switch (rnd() % 3) {
        case 0:
            if (!present[k]) {
                nodes[k].key = (uint64_t)k * 7919u + 1; /* sparse keys */
                assert_int_equal(rt_hmap_put(&m, &nodes[k]), KVP_OK);
                present[k] = true;
                count++;
            }
            break;
        case 1: {
            struct rt_hnode *n = rt_hmap_del(&m, (uint64_t)k * 7919u + 1);
            assert_int_equal(n != NULL, present[k]);
            if (n) {
                assert_ptr_equal(n, &nodes[k]);
                present[k] = false;
                count--;
            }
            break;
        }
        default: {
            struct rt_hnode *n = rt_hmap_get(&m, (uint64_t)k * 7919u + 1);
            assert_int_equal(n != NULL, present[k]);
            break;
        }
        }
        assert_int_equal(m.n, count);
    }
    while (count) {
        struct rt_hnode *n = rt_hmap_any(&m);
        assert_non_null(n);
        assert_ptr_equal(rt_hmap_del(&m, n->key), n);
        count--;
    }
    assert_null(rt_hmap_any(&m));
    assert_null(rt_hmap_get(&m, 1));
    rt_hmap_fini(&m);
}

static void test_runtime_heap_pops_in_due_order_with_removals(void **unused)
{
    struct rt_heap h = {0};
    static struct rt_timer t[N];
    static bool in[N];
    for (int i = 0; i < N; i++) {
        t[i].due_us = rnd() % 100000;
        assert_int_equal(rt_heap_push(&h, &t[i]), KVP_OK);
        in[i] = true;
    }
    /* Remove a third from arbitrary positions (the path a cancelled timer takes). */
    for (int i = 0; i < N; i += 3) {
        rt_heap_remove(&h, &t[i]);
        in[i] = false;
    }
    size_t left = 0;
    for (int i = 0; i < N; i++)
        left += in[i];
    assert_int_equal(h.n, left);
    uint64_t last = 0;
    while (h.n) {
        struct rt_timer *top = rt_heap_top(&h);
        assert_true(top->due_us >= last);
        last = top->due_us;
        for (size_t i = 0; i < h.n; i++) /* heap invariant holds everywhere */
            assert_int_equal(h.v[i]->idx, i);
        rt_heap_remove(&h, top);
        in[top - t] = false;
    }
    for (int i = 0; i < N; i++)
        assert_false(in[i]);
    assert_null(rt_heap_top(&h));
    rt_heap_fini(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runtime_hmap_random_ops_match_model),
        cmocka_unit_test(test_runtime_heap_pops_in_due_order_with_removals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
