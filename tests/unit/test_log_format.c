/* test_log_format.c — runtime/log: log_format json (one JSON object per line, every line parses
 * whatever the message holds) and text (unchanged), and the format's parser and environment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "runtime/log.h"

static int saved_fd2 = -1;
static FILE *cap_file;

static void cap_start(void)
{
    fflush(stderr);
    cap_file = tmpfile();
    assert_non_null(cap_file);
    saved_fd2 = dup(2);
    dup2(fileno(cap_file), 2);
}

static char *cap_end(void)
{
    fflush(stderr);
    dup2(saved_fd2, 2);
    close(saved_fd2);
    long n = ftell(cap_file);
    rewind(cap_file);
    char *s = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
    assert_non_null(s);
    size_t got = fread(s, 1, (size_t)(n > 0 ? n : 0), cap_file);
    s[got] = '\0';
    fclose(cap_file);
    return s;
}

/* The one line in `text` as a JSON object (fails unless exactly one line that parses). */
static json_t *one_json_line(const char *text)
{
    const char *nl = strchr(text, '\n');
    assert_non_null(nl);
    assert_int_equal(nl[1], '\0');
    json_error_t e;
    json_t *o = json_loadb(text, (size_t)(nl - text), 0, &e);
    if (!o)
        fail_msg("not JSON (%s): %s", e.text, text);
    assert_true(json_is_object(o));
    return o;
}

/* Runs first: nothing has logged yet, so the environment is read now. */
static void test_log_format_env_read_at_first_use(void **state)
{
    (void)state;
    setenv("KVPOOL_LOG_FORMAT", "JSON", 1);
    assert_int_equal(kvp_log_format(), KVP_LOG_FORMAT_JSON);
    unsetenv("KVPOOL_LOG_FORMAT");
    assert_int_equal(kvp_log_format(), KVP_LOG_FORMAT_JSON); /* read once */
    assert_int_equal(kvp_log_parse_format("text"), KVP_LOG_FORMAT_TEXT);
    assert_int_equal(kvp_log_parse_format("Json"), KVP_LOG_FORMAT_JSON);
    assert_int_equal(kvp_log_parse_format("xml"), -1);
    assert_int_equal(kvp_log_parse_format(""), -1);
    assert_int_equal(kvp_log_parse_format(NULL), -1);
}

static void test_log_format_json_fields_and_escapes(void **state)
{
    (void)state;
    kvp_log_set_format(KVP_LOG_FORMAT_JSON);
    kvp_log_set_level(KVP_LOG_INFO);
    cap_start();
    kvp_log_warn("master-\"1\"", "key \"%s\" back\\slash\nnew line\ttab \x01 caf\xc3\xa9 bad \xff\xfe end", "k");
    char *out = cap_end();
    json_t *o = one_json_line(out);
    assert_string_equal(json_string_value(json_object_get(o, "level")), "warn");
    assert_string_equal(json_string_value(json_object_get(o, "actor")), "master-\"1\"");
    assert_int_equal(json_integer_value(json_object_get(o, "pid")), getpid());
    const char *ts = json_string_value(json_object_get(o, "ts"));
    assert_non_null(ts);
    assert_int_equal(strlen(ts), 24); /* 2026-12-01T21:53:46.904Z */
    assert_int_equal(ts[23], 'Z');
    assert_string_equal(json_string_value(json_object_get(o, "msg")),
                        "key \"k\" back\\slash\nnew line\ttab \x01 caf\xc3\xa9 bad \xef\xbf\xbd\xef\xbf\xbd end");
    json_decref(o);
    free(out);

    /* below the level: nothing; error: "error" */
    cap_start();
    kvp_log_debug("a", "hidden");
    kvp_log_error("a", "shown");
    out = cap_end();
    o = one_json_line(out);
    assert_string_equal(json_string_value(json_object_get(o, "level")), "error");
    assert_string_equal(json_string_value(json_object_get(o, "msg")), "shown");
    json_decref(o);
    free(out);
}

/* A message past the line limit, made of characters that escape to 6 bytes: still one valid
 * JSON line, cut on a character boundary. */
static void test_log_format_json_long_message_stays_valid(void **state)
{
    (void)state;
    kvp_log_set_format(KVP_LOG_FORMAT_JSON);
    char big[5000];
    for (size_t i = 0; i < sizeof big - 1; i++)
        big[i] = (char)(i % 3 == 0 ? 0x02 : i % 3 == 1 ? '"' : 'x');
    big[sizeof big - 1] = '\0';
    cap_start();
    kvp_log_error("a", "%s", big);
    char *out = cap_end();
    json_t *o = one_json_line(out);
    const char *msg = json_string_value(json_object_get(o, "msg"));
    assert_non_null(msg);
    assert_true(strlen(msg) > 100 && strlen(msg) < 2048);
    json_decref(o);
    free(out);
}

static void test_log_format_text_unchanged(void **state)
{
    (void)state;
    kvp_log_set_format(KVP_LOG_FORMAT_TEXT);
    cap_start();
    kvp_log_warn("master-1", "segment %d: heartbeat missed", 3);
    char *out = cap_end();
    char want[64];
    snprintf(want, sizeof want, " WARN  master-1[%d]: segment 3: heartbeat missed\n", (int)getpid());
    assert_non_null(strstr(out, want));
    assert_int_equal(out[0], '2'); /* the timestamp first */
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_format_env_read_at_first_use),
        cmocka_unit_test(test_log_format_json_fields_and_escapes),
        cmocka_unit_test(test_log_format_json_long_message_stays_valid),
        cmocka_unit_test(test_log_format_text_unchanged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
