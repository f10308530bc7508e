/* http_get.c — see http_get.h. */
#define _GNU_SOURCE
#include "tests/lib/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

int kvp_test_http(uint32_t port, const char *method, const char *path, int *status, char **body, char **headers,
                  unsigned timeout_ms)
{
    return kvp_test_http_at("127.0.0.1", port, method, path, status, body, headers, timeout_ms);
}

int kvp_test_http_at(const char *host, uint32_t port, const char *method, const char *path, int *status, char **body,
                     char **headers, unsigned timeout_ms)
{
    *status = 0;
    *body = NULL;
    if (headers)
        *headers = NULL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
        close(fd);
        return -1;
    }
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    char req[512];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", method, path);
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        return -1;
    }
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf)
            break;
        if (len == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb)
                break;
            buf = nb;
            cap *= 2;
        }
        ssize_t r = recv(fd, buf + len, cap - len, 0);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    if (!buf || len == 0) {
        free(buf);
        return -1;
    }
    buf[len] = '\0';
    int st = 0;
    if (sscanf(buf, "HTTP/1.%*d %d", &st) != 1) {
        free(buf);
        return -1;
    }
    char *sep = strstr(buf, "\r\n\r\n");
    *status = st;
    *body = strdup(sep ? sep + 4 : "");
    if (headers)
        *headers = sep ? strndup(buf, (size_t)(sep - buf)) : strdup(buf);
    free(buf);
    return 0;
}

uint32_t kvp_test_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof a;
    uint32_t port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &sl) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}
