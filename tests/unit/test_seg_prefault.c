/*
 * test_seg_prefault.c — segment_prefault's memory guard (kvp_seg_prefault_allow): populating a
 * normal-page region the host cannot back runs the kernel's OOM killer instead of failing, so
 * the prefault stops while MemAvailable is near max(MemTotal / 10, 512 MiB).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>

#include "actors/segment/segment_internal.h"

#define MIB (1ull << 20)
#define GIB (1ull << 30)

static void meminfo(char *buf, size_t cap, uint64_t total, uint64_t avail)
{
    snprintf(buf, cap,
             "MemTotal:       %llu kB\nMemFree:        %llu kB\nMemAvailable:   %llu kB\nBuffers:  0 kB\n",
             (unsigned long long)(total / 1024), (unsigned long long)(avail / 1024),
             (unsigned long long)(avail / 1024));
}

static void test_plenty_of_memory_allows_the_step(void **state)
{
    (void)state;
    char b[512];
    meminfo(b, sizeof b, 24 * GIB, 20 * GIB);
    assert_int_equal(kvp_seg_prefault_allow(b, 64 * MIB), 64 * MIB);
}

static void test_floor_is_a_tenth_of_total(void **state)
{
    (void)state;
    char b[512];
    /* 20 GiB host: floor 2 GiB */
    meminfo(b, sizeof b, 20 * GIB, 2 * GIB + 16 * MIB);
    assert_int_equal(kvp_seg_prefault_allow(b, 64 * MIB), 16 * MIB);
    meminfo(b, sizeof b, 20 * GIB, 2 * GIB);
    assert_int_equal(kvp_seg_prefault_allow(b, 64 * MIB), 0);
    meminfo(b, sizeof b, 20 * GIB, 1 * GIB);
    assert_int_equal(kvp_seg_prefault_allow(b, 64 * MIB), 0);
}

static void test_floor_at_least_512_mib(void **state)
{
    (void)state;
    char b[512];
    /* 2 GiB host: a tenth is 205 MiB, the floor is 512 MiB */
    meminfo(b, sizeof b, 2 * GIB, 540 * MIB);
    assert_int_equal(kvp_seg_prefault_allow(b, 64 * MIB), 28 * MIB);
    meminfo(b, sizeof b, 2 * GIB, 300 * MIB);
    assert_int_equal(kvp_seg_prefault_allow(b, 64 * MIB), 0);
}

static void test_unreadable_text_means_no_guard(void **state)
{
    (void)state;
    assert_int_equal(kvp_seg_prefault_allow(NULL, 64 * MIB), 64 * MIB);
    assert_int_equal(kvp_seg_prefault_allow("", 64 * MIB), 64 * MIB);
    assert_int_equal(kvp_seg_prefault_allow("MemTotal: 100 kB\n", 64 * MIB), 64 * MIB); /* no MemAvailable */
    assert_int_equal(kvp_seg_prefault_allow("garbage\nMemAvailable: x kB\n", 64 * MIB), 64 * MIB);
}

/* The host-memory WARN's figure: MemTotal + SwapTotal; 0 (no WARN) without MemTotal. */
static void test_host_memory_total_plus_swap(void **state)
{
    (void)state;
    assert_int_equal(kvp_seg_host_memory("MemTotal:  1024 kB\nMemFree: 5 kB\nSwapTotal:  2048 kB\n"),
                     3ull * 1024 * 1024);
    assert_int_equal(kvp_seg_host_memory("SwapTotal: 2048 kB\nMemTotal: 1024 kB\n"), 3ull * 1024 * 1024);
    assert_int_equal(kvp_seg_host_memory("MemTotal: 1024 kB\n"), 1024ull * 1024);
    assert_int_equal(kvp_seg_host_memory("SwapTotal: 2048 kB\n"), 0);
    assert_int_equal(kvp_seg_host_memory(""), 0);
    assert_int_equal(kvp_seg_host_memory(NULL), 0);
    assert_int_equal(kvp_seg_host_memory("MemTotal: 99999999999999999999 kB\n"), 0);
    char b[4096];
    FILE *fp = fopen("/proc/meminfo", "r");
    if (fp) {
        size_t n = fread(b, 1, sizeof b - 1, fp);
        fclose(fp);
        b[n] = 0;
        assert_true(kvp_seg_host_memory(b) >= 64ull << 20);
    }
}

static void test_this_host_parses(void **state)
{
    (void)state;
    FILE *fp = fopen("/proc/meminfo", "r");
    if (!fp)
        skip();
    char b[4096];
    size_t n = fread(b, 1, sizeof b - 1, fp);
    fclose(fp);
    b[n] = 0;
    /* whatever the host has free, 1 byte is either allowed or refused; never more than asked */
    assert_true(kvp_seg_prefault_allow(b, 1) <= 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plenty_of_memory_allows_the_step),
        cmocka_unit_test(test_floor_is_a_tenth_of_total),
        cmocka_unit_test(test_floor_at_least_512_mib),
        cmocka_unit_test(test_unreadable_text_means_no_guard),
        cmocka_unit_test(test_host_memory_total_plus_swap),
        cmocka_unit_test(test_this_host_parses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
