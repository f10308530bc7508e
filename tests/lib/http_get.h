/*
 * http_get.h — a minimal blocking HTTP/1.0 client for the metrics tests (loopback only).
 */
#ifndef KVP_TEST_HTTP_GET_H
#define KVP_TEST_HTTP_GET_H

#include <stdint.h>

/**
 * `method path` to 127.0.0.1:port; reads the whole answer (the server closes). *status is the
 * HTTP status, *body (malloc'd, NUL-terminated) the body, *headers (malloc'd, may be NULL) the
 * header block. Returns 0, or -1 when nothing could be read (connection refused, timeout of
 * timeout_ms on connect/read: a test then polls again).
 */
int kvp_test_http(uint32_t port, const char *method, const char *path, int *status, char **body, char **headers,
                  unsigned timeout_ms);

/** The same to host (an IPv4 loopback address such as "127.0.0.2"). */
int kvp_test_http_at(const char *host, uint32_t port, const char *method, const char *path, int *status, char **body,
                     char **headers, unsigned timeout_ms);

/** A free TCP port on 127.0.0.1 (bound to port 0 and released; races are unlikely). 0 on error. */
uint32_t kvp_test_free_port(void);

#endif
