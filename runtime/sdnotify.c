/* sdnotify.c — sd_notify(3)'s datagram without libsystemd: see sdnotify.h. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvpool.h"
#include "runtime/log.h"
#include "runtime/sdnotify.h"

int kvp_sd_notify(const char *actor, const char *state)
{
    if (!actor)
        actor = "sd_notify";
    if (!state)
        return KVP_ERR_INVALID;
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path)
        return 0;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t len = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || len < 2 || len >= sizeof sa.sun_path) {
        kvp_log_warn(actor, "NOTIFY_SOCKET=%.128s: not an absolute path or @abstract name of at most %zu bytes; "
                            "the service manager is not told '%.*s'", path, sizeof sa.sun_path - 1,
                     (int)strcspn(state, "\n"), state);
        return KVP_ERR_INVALID;
    }
    memcpy(sa.sun_path, path, len);
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    if (path[0] == '@')
        sa.sun_path[0] = '\0'; /* abstract: the name is the bytes after the NUL, no terminator */
    else
        salen++;               /* a path: count its NUL */
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        kvp_log_warn(actor, "NOTIFY_SOCKET=%s: socket: %s", path, strerror(errno));
        return KVP_ERR_IO;
    }
    size_t n = strlen(state);
    ssize_t sent = sendto(fd, state, n, MSG_NOSIGNAL | MSG_DONTWAIT, (struct sockaddr *)&sa, salen);
    int err = errno;
    close(fd);
    if (sent != (ssize_t)n) {
        kvp_log_warn(actor, "NOTIFY_SOCKET=%s: cannot send '%.*s': %s", path, (int)strcspn(state, "\n"), state,
                     sent < 0 ? strerror(err) : "short write");
        return KVP_ERR_IO;
    }
    return 1;
}
