/*
 * test_seg_memcg.c — segment_prefault's cgroup guard (actors/segment/memcg.c): the tightest
 * memory cgroup limit of the process is read from a /proc/self/cgroup text and a cgroup tree
 * (built here in a temporary directory, in the v2, v1 and hybrid layouts), and the prefault
 * stops while the room under it is below max(limit / 10, 512 MiB).
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "actors/segment/segment_internal.h"

#define MIB (1ull << 20)
#define GIB (1ull << 30)

static char root[256];

/* mkdir -p root/rel */
static void mkdirs(const char *rel)
{
    char p[768];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    for (char *s = p + strlen(root) + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            assert_true(mkdir(p, 0755) == 0 || errno == EEXIST);
            *s = '/';
        }
    assert_true(mkdir(p, 0755) == 0 || errno == EEXIST);
}

/* root/rel/file := text */
static void put(const char *rel, const char *file, const char *text)
{
    mkdirs(rel);
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/%s", root, rel, file);
    FILE *fp = fopen(p, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/kvp-test-memcg-XXXXXX");
    return mkdtemp(root) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_v2_limit_of_an_ancestor(void **state)
{
    (void)state;
    /* the process's own cgroup has no limit ("max"); its parent has 2 GiB, 1 GiB used */
    put("kubepods/pod1/ctr", "memory.max", "max\n");
    put("kubepods/pod1/ctr", "memory.current", "104857600\n");
    put("kubepods/pod1", "memory.max", "2147483648\n");
    put("kubepods/pod1", "memory.current", "1073741824\n");
    struct kvp_seg_memcg m;
    assert_true(kvp_seg_memcg_read("0::/kubepods/pod1/ctr\n", root, &m));
    assert_int_equal(m.limit, 2 * GIB);
    assert_int_equal(m.usage, 1 * GIB);
    assert_non_null(strstr(m.path, "/kubepods/pod1"));
    assert_null(strstr(m.path, "ctr"));
}

static void test_v2_tightest_room_wins(void **state)
{
    (void)state;
    /* parent 8 GiB with 1 GiB used (7 GiB room); child 4 GiB with 3.5 GiB used (0.5 GiB room) */
    put("a", "memory.max", "8589934592\n");
    put("a", "memory.current", "1073741824\n");
    put("a/b", "memory.max", "4294967296\n");
    put("a/b", "memory.current", "3758096384\n");
    struct kvp_seg_memcg m;
    assert_true(kvp_seg_memcg_read("0::/a/b", root, &m));
    assert_int_equal(m.limit, 4 * GIB);
    assert_int_equal(m.usage, 3584 * MIB);
}

static void test_v2_namespace_root(void **state)
{
    (void)state;
    /* a container with its own cgroup namespace sees itself as "/": the mount's top has the limit */
    put(".", "memory.max", "1073741824\n");
    put(".", "memory.current", "52428800\n");
    struct kvp_seg_memcg m;
    assert_true(kvp_seg_memcg_read("0::/\n", root, &m));
    assert_int_equal(m.limit, 1 * GIB);
    assert_int_equal(m.usage, 50 * MIB);
}

static void test_v1_memory_controller_line(void **state)
{
    (void)state;
    /* v1: the leaf is unlimited (PAGE_COUNTER_MAX pages), its parent has 1 GiB */
    put("memory/docker/abc", "memory.limit_in_bytes", "9223372036854771712\n");
    put("memory/docker/abc", "memory.usage_in_bytes", "10485760\n");
    put("memory/docker", "memory.limit_in_bytes", "1073741824\n");
    put("memory/docker", "memory.usage_in_bytes", "104857600\n");
    put("memory", "memory.limit_in_bytes", "9223372036854771712\n");
    put("memory", "memory.usage_in_bytes", "5368709120\n");
    const char *text = "12:pids:/docker/abc\n4:cpu,memory:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n";
    struct kvp_seg_memcg m;
    assert_true(kvp_seg_memcg_read(text, root, &m));
    assert_int_equal(m.limit, 1 * GIB);
    assert_int_equal(m.usage, 100 * MIB);
    /* the controller is named exactly: "memoryx" is not "memory" */
    assert_false(kvp_seg_memcg_read("4:memoryx:/docker/abc\n", root, &m));
}

static void test_hybrid_unified_mount(void **state)
{
    (void)state;
    put("unified/svc", "memory.max", "3221225472\n");
    put("unified/svc", "memory.current", "1073741824\n");
    struct kvp_seg_memcg m;
    assert_true(kvp_seg_memcg_read("4:memory:/\n0::/svc\n", root, &m));
    assert_int_equal(m.limit, 3 * GIB);
}

static void test_nothing_known_means_no_guard(void **state)
{
    (void)state;
    struct kvp_seg_memcg m;
    assert_false(kvp_seg_memcg_read(NULL, root, &m));
    assert_false(kvp_seg_memcg_read("", root, &m));
    assert_false(kvp_seg_memcg_read("garbage\nno colons here\n1:x\n", root, &m));
    assert_false(kvp_seg_memcg_read("0::/does/not/exist\n", root, &m));
    /* a limit without a usage, or either not a number, is no limit known */
    put("half", "memory.max", "1073741824\n");
    assert_false(kvp_seg_memcg_read("0::/half\n", root, &m));
    put("bad", "memory.max", "12abc\n");
    put("bad", "memory.current", "1\n");
    assert_false(kvp_seg_memcg_read("0::/bad\n", root, &m));
    assert_int_equal(kvp_seg_memcg_allow(&m, 64 * MIB), 64 * MIB);
    assert_int_equal(kvp_seg_memcg_allow(NULL, 64 * MIB), 64 * MIB);
}

static void test_allow_keeps_a_floor(void **state)
{
    (void)state;
    struct kvp_seg_memcg m = {.found = true, .limit = 4 * GIB, .usage = 1 * GIB};
    /* 4 GiB: a tenth is 410 MiB, the floor 512 MiB; room 3 GiB - 512 MiB */
    assert_int_equal(kvp_seg_memcg_allow(&m, 64 * MIB), 64 * MIB);
    m.usage = 4 * GIB - 512 * MIB - 16 * MIB;
    assert_int_equal(kvp_seg_memcg_allow(&m, 64 * MIB), 16 * MIB);
    m.usage = 4 * GIB - 512 * MIB;
    assert_int_equal(kvp_seg_memcg_allow(&m, 64 * MIB), 0);
    m.usage = 5 * GIB; /* over the limit (it can be, briefly) */
    assert_int_equal(kvp_seg_memcg_allow(&m, 64 * MIB), 0);
    /* 20 GiB: the floor is a tenth, 2 GiB */
    m.limit = 20 * GIB;
    m.usage = 18 * GIB - 8 * MIB;
    assert_int_equal(kvp_seg_memcg_allow(&m, 64 * MIB), 8 * MIB);
    /* a limit below the floor allows nothing */
    m.limit = 256 * MIB;
    m.usage = 0;
    assert_int_equal(kvp_seg_memcg_allow(&m, 64 * MIB), 0);
}

static void test_this_process_parses(void **state)
{
    (void)state;
    FILE *fp = fopen("/proc/self/cgroup", "r");
    if (!fp)
        skip();
    char b[4096];
    size_t n = fread(b, 1, sizeof b - 1, fp);
    fclose(fp);
    b[n] = 0;
    struct kvp_seg_memcg m;
    /* whatever this machine's cgroups are: a limit found has a path, and the guard never gives
     * more than asked */
    if (kvp_seg_memcg_read(b, "/sys/fs/cgroup", &m))
        assert_true(m.path[0] == '/');
    assert_true(kvp_seg_memcg_allow(&m, 1) <= 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_v2_limit_of_an_ancestor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_v2_tightest_room_wins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_v2_namespace_root, setup, teardown),
        cmocka_unit_test_setup_teardown(test_v1_memory_controller_line, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hybrid_unified_mount, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nothing_known_means_no_guard, setup, teardown),
        cmocka_unit_test(test_allow_keeps_a_floor),
        cmocka_unit_test(test_this_process_parses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
