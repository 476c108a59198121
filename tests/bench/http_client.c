/*
 * http_client.c — one HTTP/1.1 request per connection over a blocking socket (see
 * http_client.h).
 */
#include "http_client.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static bool http_send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

static int http_fail(int fd) {
    const int saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

int http_request(int port, const char *method, const char *path, const char *body, char *out,
                 size_t size, int timeout_s) {
    out[0] = '\0';
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    const struct timeval tv = {.tv_sec = timeout_s};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    const struct sockaddr_in addr = {.sin_family = AF_INET,
                                     .sin_port = htons((uint16_t)port),
                                     .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (const struct sockaddr *)&addr, sizeof addr) != 0) return http_fail(fd);
    const size_t body_len = body ? strlen(body) : 0;
    char head[512];
    const int head_len = snprintf(head, sizeof head,
                                  "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                                  "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                                  "Connection: close\r\n\r\n",
                                  method, path, port, body_len);
    if (head_len < 0 || (size_t)head_len >= sizeof head) return errno = EINVAL, http_fail(fd);
    if (!http_send_all(fd, head, (size_t)head_len) || (body && !http_send_all(fd, body, body_len)))
        return http_fail(fd);
    size_t len = 0;
    for (;;) {
        char scratch[4096];
        const size_t room = size - 1 - len;
        const ssize_t r = recv(fd, room ? out + len : scratch, room ? room : sizeof scratch, 0);
        if (r == 0) break;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return http_fail(fd);
        if (room) len += (size_t)r;
    }
    close(fd);
    out[len] = '\0';
    int status = -1;
    if (sscanf(out, "HTTP/1.%*d %d", &status) != 1) return errno = EPROTO, -1;
    const char *sep = strstr(out, "\r\n\r\n");
    if (sep)
        memmove(out, sep + 4, strlen(sep + 4) + 1);
    else
        out[0] = '\0';
    return status;
}

long http_json_integer(const char *json, const char *key) {
    char pattern[128];
    snprintf(pattern, sizeof pattern, "\"%s\"", key);
    for (const char *p = strstr(json, pattern); p; p = strstr(p + 1, pattern)) {
        const char *q = p + strlen(pattern);
        while (*q == ' ') q++;
        if (*q != ':') continue; /* the key's text as a value, not the key */
        q++;
        char *end;
        const long v = strtol(q, &end, 10);
        if (end != q) return v;
    }
    return -1;
}

int http_free_port(void) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    const bool ok = bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0 &&
                    getsockname(fd, (struct sockaddr *)&addr, &len) == 0;
    close(fd);
    return ok ? ntohs(addr.sin_port) : -1;
}
