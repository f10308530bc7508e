/* test_sdnotify.c — runtime/sdnotify: sd_notify's datagram to $NOTIFY_SOCKET (path and abstract
 * forms), nothing without it, and the errors of a bad or absent socket. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvpool.h"
#include "runtime/sdnotify.h"

/* A datagram socket bound at `name` ("@x" abstract, else a path); returns the fd. */
static int bind_dgram(const char *name)
{
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t len = strlen(name);
    assert_true(len < sizeof sa.sun_path);
    memcpy(sa.sun_path, name, len);
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    if (name[0] == '@')
        sa.sun_path[0] = '\0';
    else
        salen++;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, salen), 0);
    return fd;
}

/* What is queued on fd now (the send has returned, so it is there or never will be). */
static ssize_t take(int fd, char *buf, size_t cap)
{
    ssize_t n = recv(fd, buf, cap - 1, MSG_DONTWAIT);
    buf[n > 0 ? n : 0] = '\0';
    return n;
}

static void test_sdnotify_path_socket_gets_the_state(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvp-sdnotify-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/notify", dir);
    int fd = bind_dgram(path);
    setenv("NOTIFY_SOCKET", path, 1);
    assert_int_equal(kvp_sd_notify("test", "READY=1\nSTATUS=serving"), 1);
    char buf[256];
    assert_int_equal(take(fd, buf, sizeof buf), 22);
    assert_string_equal(buf, "READY=1\nSTATUS=serving");
    assert_int_equal(kvp_sd_notify("test", "STOPPING=1"), 1);
    assert_int_equal(take(fd, buf, sizeof buf), 10);
    assert_string_equal(buf, "STOPPING=1");
    /* the receiver gone: an error, not a crash, not a block */
    close(fd);
    unlink(path);
    assert_int_equal(kvp_sd_notify("test", "READY=1"), KVP_ERR_IO);
    rmdir(dir);
    unsetenv("NOTIFY_SOCKET");
}

static void test_sdnotify_abstract_socket_gets_the_state(void **state)
{
    (void)state;
    char name[64];
    snprintf(name, sizeof name, "@kvp-sdnotify-test-%d", (int)getpid());
    int fd = bind_dgram(name);
    setenv("NOTIFY_SOCKET", name, 1);
    assert_int_equal(kvp_sd_notify("test", "READY=1"), 1);
    char buf[64];
    assert_int_equal(take(fd, buf, sizeof buf), 7);
    assert_string_equal(buf, "READY=1");
    close(fd);
    unsetenv("NOTIFY_SOCKET");
}

static void test_sdnotify_unset_sends_nothing_bad_values_invalid(void **state)
{
    (void)state;
    unsetenv("NOTIFY_SOCKET");
    assert_int_equal(kvp_sd_notify("test", "READY=1"), 0);
    setenv("NOTIFY_SOCKET", "", 1);
    assert_int_equal(kvp_sd_notify("test", "READY=1"), 0);
    setenv("NOTIFY_SOCKET", "relative/path", 1);
    assert_int_equal(kvp_sd_notify("test", "READY=1"), KVP_ERR_INVALID);
    setenv("NOTIFY_SOCKET", "@", 1);
    assert_int_equal(kvp_sd_notify("test", "READY=1"), KVP_ERR_INVALID);
    char longp[200];
    memset(longp, 'x', sizeof longp - 1);
    longp[0] = '/';
    longp[sizeof longp - 1] = '\0';
    setenv("NOTIFY_SOCKET", longp, 1);
    assert_int_equal(kvp_sd_notify("test", "READY=1"), KVP_ERR_INVALID);
    setenv("NOTIFY_SOCKET", "/nonexistent/kvp-notify", 1);
    assert_int_equal(kvp_sd_notify("test", "READY=1"), KVP_ERR_IO);
    assert_int_equal(kvp_sd_notify("test", NULL), KVP_ERR_INVALID);
    unsetenv("NOTIFY_SOCKET");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sdnotify_path_socket_gets_the_state),
        cmocka_unit_test(test_sdnotify_abstract_socket_gets_the_state),
        cmocka_unit_test(test_sdnotify_unset_sends_nothing_bad_values_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
