/*
 * front_zmq_auth.h — who the ZeroMQ front end's clients are: corrald's ZAP handler (ZeroMQ RFC
 * 27), the CURVE settings of its tcp listeners, and a monitor of handshakes that fail.
 *
 * libzmq asks the ZAP handler, an inproc REP socket bound at "inproc://zeromq.zap.01" in the
 * front end's context, about every connection to a socket that has a ZAP domain, before the
 * connection carries any message. corrald's listeners each get one: ipc ones the domain
 * AUTH_ZAP_DOMAIN_IPC and the NULL mechanism (libzmq passes the peer's SO_PEERCRED uid, gid and
 * pid in the request's address), tcp ones AUTH_ZAP_DOMAIN_TCP and CURVE as the server (the
 * client's public key is the credential). The handler asks the core's current auth table
 * (auth.h) whether the peer may connect: yes gives status 200 and a User-Id naming the peer,
 * which libzmq attaches to every message of the connection; no gives 400, which the client sees
 * as ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, and a log line saying who was refused and why.
 *
 * Handshakes that fail before any ZAP request (a tcp client without CURVE, a wrong server key)
 * are logged from the router's monitor, which also reports each connection that closes (by its
 * file descriptor, as ZMQ_SRCFD names the connection a message came through).
 *
 * Everything here runs on the front end's thread: the loop polls the two sockets below.
 */
#ifndef CORRAL_DAEMON_FRONT_ZMQ_AUTH_H
#define CORRAL_DAEMON_FRONT_ZMQ_AUTH_H

#include <zmq.h>

#include "auth.h"
#include "config.h"
#include "core.h"
#include "corral/status.h"

typedef struct zauth zauth;

/* Bind the ZAP handler in context zctx and start monitoring router's failed handshakes. Call
 * before router binds anything. Caller owns the result (zauth_destroy). NULL with err set. */
zauth *zauth_new(void *zctx, void *router, corral_error *err);

/* Stop the monitor and close both sockets (before the context is terminated). NULL-safe; sets *a
 * to NULL. */
void zauth_destroy(zauth **a);

/* Set router up for the listeners it binds next: ipc ones (NULL mechanism), or tcp ones (CURVE
 * server with the secret key of c's auth.server_key_file, read and checked here). A tcp endpoint
 * without auth.server_key_file is refused with the way to fix it. */
corral_status zauth_prepare_ipc(void *router, corral_error *err);
corral_status zauth_prepare_tcp(void *router, const cfg *c, const char *endpoint,
                                corral_error *err);

/* The sockets the loop polls (POLLIN), and what it calls when they are readable. The ZAP handler
 * asks k's current auth table. */
void *zauth_zap_socket(const zauth *a);
void *zauth_monitor_socket(const zauth *a);
void zauth_answer_zap(zauth *a, core *k);

/* Read every monitor event there is (never blocks): failed handshakes are logged, and for each
 * connection that closed, closed(ctx, fd) is called with the descriptor it had. Call it before
 * reading the router and before sending on it, so that a closed connection is known before a
 * message of a new one that reuses its descriptor or its routing id is. */
void zauth_read_monitor(zauth *a, void (*closed)(void *ctx, int fd), void *ctx);

/* The peer a received message came from (its User-Id, set by the handler). CORRAL_OK, or
 * CORRAL_PERMISSION_DENIED for a message whose connection did not pass the handler. */
corral_status zauth_peer_of(zmq_msg_t *msg, auth_peer *out);

#endif /* CORRAL_DAEMON_FRONT_ZMQ_AUTH_H */
