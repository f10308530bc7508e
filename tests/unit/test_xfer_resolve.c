/* test_xfer_resolve.c — endpoint parsing and resolution (kvp_xfer_resolve). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "actors/transfer/transfer.h"
#include "kvpool.h"

static void test_xfer_resolve_ipv4_ok(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    unsigned len = 0;
    assert_int_equal(kvp_xfer_resolve("127.0.0.1:7001", &ss, &len), KVP_OK);
    assert_int_equal(ss.ss_family, AF_INET);
    assert_int_equal(len, sizeof(struct sockaddr_in));
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    assert_int_equal(ntohs(a->sin_port), 7001);
    assert_int_equal(ntohl(a->sin_addr.s_addr), 0x7f000001);
}

static void test_xfer_resolve_ipv6_ok(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    unsigned len = 0;
    assert_int_equal(kvp_xfer_resolve("[::1]:65535", &ss, &len), KVP_OK);
    assert_int_equal(ss.ss_family, AF_INET6);
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    assert_int_equal(ntohs(a->sin6_port), 65535);
    assert_true(IN6_IS_ADDR_LOOPBACK(&a->sin6_addr));
}

static void test_xfer_resolve_link_local_scope_ok(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    unsigned len = 0;
    assert_int_equal(kvp_xfer_resolve("[fe80::1%lo]:80", &ss, &len), KVP_OK);
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    assert_int_equal(a->sin6_scope_id, if_nametoindex("lo"));
    assert_true(a->sin6_scope_id != 0);
    assert_int_equal(kvp_xfer_resolve("[fe80::1%1]:80", &ss, &len), KVP_OK);
    assert_int_equal(((struct sockaddr_in6 *)&ss)->sin6_scope_id, 1);
}

static void test_xfer_resolve_hostname_ok(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    unsigned len = 0;
    assert_int_equal(kvp_xfer_resolve("localhost:9", &ss, &len), KVP_OK);
    assert_true(ss.ss_family == AF_INET || ss.ss_family == AF_INET6);
}

static void test_xfer_resolve_bad_input_invalid(void **state)
{
    (void)state;
    struct sockaddr_storage ss;
    unsigned len = 0;
    const char *bad[] = {"", "host", "host:", ":80", "::1:80", "[::1]80", "[::1", "[]:80", "h:0",
                         "h:65536", "h:12a", "h:-1", "[::1]:", "no.such.host.invalid:80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(kvp_xfer_resolve(bad[i], &ss, &len), KVP_ERR_INVALID);
    assert_int_equal(kvp_xfer_resolve(NULL, &ss, &len), KVP_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xfer_resolve_ipv4_ok),
        cmocka_unit_test(test_xfer_resolve_ipv6_ok),
        cmocka_unit_test(test_xfer_resolve_link_local_scope_ok),
        cmocka_unit_test(test_xfer_resolve_hostname_ok),
        cmocka_unit_test(test_xfer_resolve_bad_input_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
