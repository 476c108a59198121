/*
 * front_http.h — corrald's HTTP front end: the OpenAI-compatible API (/v1/chat/completions,
 * /v1/completions, /v1/models) and the Ollama-compatible one (/api/generate, /api/chat,
 * /api/tags, /api/ps, /api/show, /api/version), as a second front end of the same core as the
 * ZeroMQ one (front_zmq.h).
 *
 * It runs on a thread of its own: one libmicrohttpd daemon per listen address, driven from that
 * thread's poll loop (MHD's epoll fd in external-polling mode) together with the eventfd the core
 * wakes it through. Every connection, every request in flight and every job of the front end is
 * touched by that thread only, so the HTTP callbacks and the core's events need no lock between
 * them. Streams are MHD responses whose content callback suspends the connection while the job
 * has nothing new, and the core's next event resumes it.
 *
 * Configuration: http.listen (off when empty), http.keys (bearer keys → apps), http.cors and the
 * http.* limits (config.h). Without a key a request runs as the default app, and only from a
 * loopback peer; a key that does not match is refused with 401.
 */
#ifndef CORRAL_DAEMON_FRONT_HTTP_H
#define CORRAL_DAEMON_FRONT_HTTP_H

#include <stddef.h>

#include "config.h"
#include "core.h"
#include "corral/status.h"

typedef struct front_http front_http;

/* Read the key files and bind every address of c->http_listen (nothing when it is empty: the
 * front end then serves nothing and front_http_start starts no thread). corrald does this before
 * its core touches any state, like the ZeroMQ endpoints. Borrows c: it must outlive the front
 * end. Returns NULL with err naming the address or key file that failed. Caller owns the result
 * (front_http_destroy). */
front_http *front_http_new(const cfg *c, corral_error *err);

/* What front_http_new would refuse about c, for --check-config: the key files are read and each
 * address is bound and released again. */
corral_status front_http_check(const cfg *c, corral_error *err);

/* The addresses bound, for logs. Borrowed: valid until front_http_destroy. */
size_t front_http_address_count(const front_http *f);
const char *front_http_address(const front_http *f, size_t i);

/* Start serving on a thread of the front end's own, submitting to k. Returns CORRAL_OK (also when
 * there is nothing to serve), or an error when the thread cannot start. */
corral_status front_http_start(front_http *f, core *k, corral_error *err);

/* Stop serving: new requests are refused with 503, the requests in flight get what the core
 * answers (after core_shutdown: Error UNAVAILABLE) for up to 1.5 s, then the thread ends and this
 * returns. Call before core_destroy. NULL-safe; idempotent. */
void front_http_stop(front_http *f);

/* Close every connection, stop the daemons and free every request still in flight. Call after
 * core_destroy (the core may hold the front end's jobs until then). NULL-safe; sets *f to NULL. */
void front_http_destroy(front_http **f);

#endif /* CORRAL_DAEMON_FRONT_HTTP_H */
