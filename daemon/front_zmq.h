/*
 * front_zmq.h — corrald's ZeroMQ front end: the ROUTER socket(s), the requests in flight from
 * ZeroMQ clients, and the loop that reads requests, submits them to the core and writes the
 * core's answers back (the zguide's ROUTER/DEALER pattern).
 *
 * The loop runs on the thread that calls front_zmq_run(). It enforces the transport's rules:
 * who the client is (every connection passes corrald's ZAP handler, front_zmq_auth.h, and each
 * request runs as an app the connection may act as: auth.h), message size limits, liveness
 * (requests of silent or vanished clients are cancelled) and flow control (a client that stops
 * reading has its stream paused, then cancelled after the stall timeout), so nothing a client does
 * can make the daemon's memory grow without bound.
 */
#ifndef CORRAL_DAEMON_FRONT_ZMQ_H
#define CORRAL_DAEMON_FRONT_ZMQ_H

#include <stddef.h>

#include "config.h"
#include "core.h"
#include "corral/status.h"

typedef struct front_zmq front_zmq;

/* Create the ZeroMQ context and bind every endpoint of c (the default endpoint when it lists
 * none, creating private ipc directories as needed; tcp ones only with c's CURVE server key). corrald does this before its core touches
 * any state, so a daemon that cannot listen (another one is there) changes nothing. Borrows c: it
 * must outlive the front end. Returns NULL with err naming the endpoint that failed. Caller owns
 * the result. tcp://localhost:PORT binds 127.0.0.1:PORT; tcp://[::1]:PORT binds IPv6 loopback. */
front_zmq *front_zmq_new(const cfg *c, corral_error *err);

/* What front_zmq_new would refuse about c's endpoints, for --check-config: each is bound and
 * released again. */
corral_status front_zmq_check(const cfg *c, corral_error *err);

/* The endpoints actually bound, for logs and tests. Borrowed: valid until front_zmq_destroy. */
size_t front_zmq_endpoint_count(const front_zmq *f);
const char *front_zmq_endpoint(const front_zmq *f, size_t i);

/* Serve until `signal_fd` (a signalfd) delivers SIGINT or SIGTERM; SIGHUP asks the core to
 * reload `config_path` (NULL: SIGHUP is ignored with a warning). On a stop signal the front end
 * stops taking work, the core ends the requests in flight with Error UNAVAILABLE, and this returns
 * within 2 seconds. Returns CORRAL_OK after a clean stop, or an error when the sockets fail. */
corral_status front_zmq_run(front_zmq *f, core *k, int signal_fd, const char *config_path,
                            corral_error *err);

/* Close the sockets (removing ipc socket files) and the context, and free every job still in
 * flight. Call after core_destroy (the core may still hold those jobs until then). NULL-safe;
 * sets *f to NULL. */
void front_zmq_destroy(front_zmq **f);

#endif /* CORRAL_DAEMON_FRONT_ZMQ_H */
