/*
 * test_client_devmem_regs.c — reclamation of the registered-range table (actors/client/devmem.c):
 * many register/unregister changes leave no replaced table behind when no thread looks ranges
 * up at the same time; lookups on reader threads while two writers change the table always
 * find the range that stays registered (run under TSan/ASan: a table freed while a reader scans
 * it is reported there). Against the CUDA driver double (classification needs a driver).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <cmocka.h>

#include "actors/client/devmem.h"
#include "kvpool.h"
#include "tests/lib/fakecuda/fakecuda_load.h"

#define KEEP_BASE ((uintptr_t)0x7e0000000000ull) /* never dereferenced: only compared */
#define KEEP_LEN ((size_t)1 << 20)
#define CHURN_BASE ((uintptr_t)0x7f0000000000ull)

static void test_devmem_regs_churn_frees_replaced_tables(void **state)
{
    (void)state;
    assert_int_equal(kvp_devmem_registered_bytes(), 0);
    for (int i = 0; i < 20000; i++) {
        uintptr_t b = CHURN_BASE + (uintptr_t)(i % 7) * 4096;
        assert_int_equal(kvp_devmem_remember(b, 4096, 0), KVP_OK);
        assert_int_equal(kvp_devmem_retired_tables(), 0);
        if (i % 3 == 0) { /* sometimes two ranges at once */
            assert_int_equal(kvp_devmem_remember(b + 1024 * 1024, 64, 1), KVP_OK);
            kvp_devmem_forget(b + 1024 * 1024);
        }
        struct kvp_devmem_info info;
        assert_int_equal(kvp_devmem_classify((void *)(b + 10), &info), 1);
        assert_int_equal(info.base, b);
        kvp_devmem_forget(b);
        assert_int_equal(kvp_devmem_retired_tables(), 0);
    }
    assert_int_equal(kvp_devmem_registered_bytes(), 0);
}

static atomic_int stop;
static atomic_long lookups;

static void *reader(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        struct kvp_devmem_info info;
        int c = kvp_devmem_classify((void *)(KEEP_BASE + 100), &info);
        if (c != 1 || info.base != KEEP_BASE || info.size != KEEP_LEN || info.ordinal != 0)
            return (void *)1;
        if (kvp_devmem_registered_bytes() < KEEP_LEN)
            return (void *)1;
        atomic_fetch_add(&lookups, 1);
    }
    return NULL;
}

static void *writer(void *arg)
{
    uintptr_t base = CHURN_BASE + (uintptr_t)arg * (1u << 24);
    for (int i = 0; i < 3000; i++) {
        if (kvp_devmem_remember(base + (uintptr_t)(i % 5) * 4096, 4096, 1) != KVP_OK)
            return (void *)1;
        kvp_devmem_forget(base + (uintptr_t)(i % 5) * 4096);
    }
    return NULL;
}

static void test_devmem_regs_lookups_during_changes(void **state)
{
    (void)state;
    assert_int_equal(kvp_devmem_remember(KEEP_BASE, KEEP_LEN, 0), KVP_OK);
    atomic_store(&stop, 0);
    pthread_t rd[3], wr[2];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&rd[i], NULL, reader, NULL), 0);
    for (uintptr_t i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&wr[i], NULL, writer, (void *)i), 0);
    void *ret;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pthread_join(wr[i], &ret), 0);
        assert_null(ret);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pthread_join(rd[i], &ret), 0);
        assert_null(ret);
    }
    print_message("# %ld lookups during 12000 changes; %zu replaced tables left before the last change\n",
                  atomic_load(&lookups), kvp_devmem_retired_tables());
    kvp_devmem_forget(KEEP_BASE); /* no reader now: this change frees every replaced table */
    assert_int_equal(kvp_devmem_retired_tables(), 0);
    assert_int_equal(kvp_devmem_registered_bytes(), 0);
}

int main(void)
{
    if (fakecuda_load() != 0)
        return 1;
    if (!kvp_devmem_available())
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_devmem_regs_churn_frees_replaced_tables),
        cmocka_unit_test(test_devmem_regs_lookups_during_changes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
