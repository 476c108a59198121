/*
 * http_client.c — HTTP/1.1 over blocking sockets: one request per connection, or many on a
 * kept-alive one (see http_client.h).
 */
#include "http_client.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
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

struct http_conn {
    int fd;
    int port;
    char buf[16384]; /* received, not yet parsed: buf[at..len) */
    size_t at, len;
};

http_conn *http_conn_open(int port, int timeout_s) {
    http_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->port = port;
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        free(c);
        return NULL;
    }
    const struct timeval tv = {.tv_sec = timeout_s};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    const int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const struct sockaddr_in addr = {.sin_family = AF_INET,
                                     .sin_port = htons((uint16_t)port),
                                     .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(c->fd, (const struct sockaddr *)&addr, sizeof addr) != 0) {
        http_conn_close(&c);
        return NULL;
    }
    return c;
}

void http_conn_close(http_conn **pc) {
    if (!pc || !*pc) return;
    close((*pc)->fd);
    free(*pc);
    *pc = NULL;
}

/* More bytes into c->buf; false at EOF or on an error. */
static bool conn_fill(http_conn *c) {
    if (c->at > 0) {
        memmove(c->buf, c->buf + c->at, c->len - c->at);
        c->len -= c->at;
        c->at = 0;
    }
    if (c->len == sizeof c->buf) return errno = EMSGSIZE, false;
    for (;;) {
        const ssize_t r = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        c->len += (size_t)r;
        return true;
    }
}

/* The next CRLF-terminated line (NUL-terminated in place, without the CRLF), or NULL. */
static char *conn_line(http_conn *c) {
    for (;;) {
        char *start = c->buf + c->at;
        char *end = memmem(start, c->len - c->at, "\r\n", 2);
        if (end) {
            *end = '\0';
            c->at = (size_t)(end + 2 - c->buf);
            return start;
        }
        if (!conn_fill(c)) return NULL;
    }
}

/* Hand `n` body bytes to on_body, reading as needed. */
static bool conn_body(http_conn *c, size_t n, void (*on_body)(const char *, size_t, void *),
                      void *user) {
    while (n > 0) {
        if (c->at == c->len && !conn_fill(c)) return false;
        size_t k = c->len - c->at;
        if (k > n) k = n;
        if (on_body) on_body(c->buf + c->at, k, user);
        c->at += k;
        n -= k;
    }
    return true;
}

int http_conn_request(http_conn *c, const char *method, const char *path, const char *body,
                      void (*on_body)(const char *data, size_t len, void *user), void *user) {
    const size_t body_len = body ? strlen(body) : 0;
    char head[512];
    const int head_len = snprintf(head, sizeof head,
                                  "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                                  "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                                  method, path, c->port, body_len);
    if (head_len < 0 || (size_t)head_len >= sizeof head) return errno = EINVAL, -1;
    if (!http_send_all(c->fd, head, (size_t)head_len) ||
        (body && !http_send_all(c->fd, body, body_len)))
        return -1;
    const char *line = conn_line(c);
    int status = -1;
    if (!line || sscanf(line, "HTTP/1.%*d %d", &status) != 1) return errno = EPROTO, -1;
    long content_length = -1;
    bool chunked = false;
    while ((line = conn_line(c)) && line[0]) {
        if (!strncasecmp(line, "Content-Length:", 15)) content_length = strtol(line + 15, NULL, 10);
        if (!strncasecmp(line, "Transfer-Encoding:", 18) && strstr(line + 18, "chunked"))
            chunked = true;
    }
    if (!line) return -1;
    if (!chunked) {
        if (content_length < 0) return errno = EPROTO, -1;
        return conn_body(c, (size_t)content_length, on_body, user) ? status : -1;
    }
    for (;;) {
        line = conn_line(c);
        if (!line) return -1;
        const unsigned long size = strtoul(line, NULL, 16);
        if (size == 0) break;
        if (!conn_body(c, size, on_body, user) || !(line = conn_line(c))) return -1;
    }
    while ((line = conn_line(c)) && line[0]) {
    } /* trailers */
    return line ? status : -1;
}
