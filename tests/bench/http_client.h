/*
 * http_client.h — the least HTTP/1.1 a benchmark needs to drive a local server such as
 * llama-server: one request per connection to 127.0.0.1 (Content-Length, Connection: close, the
 * answer read to EOF), and a number picked out of a JSON answer.
 *
 * No chunked bodies, no redirects, no TLS: the servers it talks to are on the loopback and answer
 * a non-streamed request with one Content-Length body. Every function is thread-safe.
 */
#ifndef CORRAL_BENCH_HTTP_CLIENT_H
#define CORRAL_BENCH_HTTP_CLIENT_H

#include <stddef.h>

/* Send `method path` with body (JSON, or NULL for none) to 127.0.0.1:port and wait up to
 * timeout_s for the whole answer. The response body goes to out, NUL-terminated and truncated to
 * size (the rest is read and dropped). Returns the HTTP status, or -1 (errno set) when the
 * exchange failed: nothing listens, the connection broke, the timeout passed. */
int http_request(int port, const char *method, const char *path, const char *body, char *out,
                 size_t size, int timeout_s);

/* The integer after "key": in a JSON text (the first occurrence, at any depth), or -1 when there
 * is none. */
long http_json_integer(const char *json, const char *key);

/* A kept-alive connection to 127.0.0.1:port, for clients that send request after request (and for
 * streams: the body is handed over piece by piece as it arrives, chunked framing removed). */
typedef struct http_conn http_conn;

/* Connect, with timeout_s for every later send and receive. NULL (errno set) on failure. Caller
 * owns the result (http_conn_close). */
http_conn *http_conn_open(int port, int timeout_s);

/* Send one request on c and read its whole answer, calling on_body (may be NULL) with each piece
 * of the body as it arrives. Returns the HTTP status, or -1 when the exchange failed (c is then
 * unusable). The answer must have a Content-Length or be chunked. */
int http_conn_request(http_conn *c, const char *method, const char *path, const char *body,
                      void (*on_body)(const char *data, size_t len, void *user), void *user);

/* Close and free. NULL-safe; sets *c to NULL. */
void http_conn_close(http_conn **c);

/* A loopback TCP port that nothing listens on at the moment of the call, or -1. */
int http_free_port(void);

#endif /* CORRAL_BENCH_HTTP_CLIENT_H */
