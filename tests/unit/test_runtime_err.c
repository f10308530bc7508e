/* test_runtime_err.c — the error table generated from KVP_ERR_LIST (include/kvpool.h): every code
 * has its own name and text, the values are the public ones, unknown codes are named as such. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "kvpool.h"

static void test_err_every_listed_code_named_as_listed(void **state)
{
    (void)state;
    int n = 0;
#define CHECK(name, value, text)                                                                   \
    assert_int_equal(name, value);                                                                 \
    assert_string_equal(kvp_errname(value), #name);                                                \
    assert_string_equal(kvp_strerror(value), text);                                                \
    n++;
    KVP_ERR_LIST(CHECK)
#undef CHECK
    assert_int_equal(n, -KVP_ERR__LAST);
}

static void test_err_public_values_unchanged(void **state)
{
    (void)state;
    /* values cross the wire: a few pinned by hand so a reordered list fails here */
    assert_int_equal(KVP_OK, 0);
    assert_int_equal(KVP_ERR_NOT_FOUND, -1);
    assert_int_equal(KVP_ERR_UNAVAILABLE, -8);
    assert_int_equal(KVP_ERR_NOT_LEADER, -16);
    assert_int_equal(KVP_ERR_DEVICE, -25);
    assert_int_equal(KVP_ERR_DENIED, -26);
    assert_int_equal(KVP_ERR__LAST, -27);
    assert_string_equal(kvp_strerror(KVP_ERR_TIMEOUT), "timed out (outstanding transfers were fenced)");
}

static void test_err_unknown_code_named_unknown(void **state)
{
    (void)state;
    assert_string_equal(kvp_errname(KVP_ERR__LAST), "KVP_ERR_UNKNOWN");
    assert_string_equal(kvp_errname(1), "KVP_ERR_UNKNOWN");
    assert_string_equal(kvp_errname(-1000), "KVP_ERR_UNKNOWN");
    assert_string_equal(kvp_strerror(-1000), "unknown error");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_every_listed_code_named_as_listed),
        cmocka_unit_test(test_err_public_values_unchanged),
        cmocka_unit_test(test_err_unknown_code_named_unknown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
