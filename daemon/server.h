/*
 * server.h — corrald's front door: the ZeroMQ ROUTER socket(s), the table of requests in flight,
 * and the loop that reads requests, hands work to the scheduler and writes responses (the
 * zguide's ROUTER/DEALER pattern). It owns the ZeroMQ context and the scheduler.
 *
 * The loop runs on the thread that calls server_run(). It also enforces the transport rules:
 * message size limits, liveness (requests of silent or vanished clients are cancelled), and flow
 * control (a client that stops reading has its stream paused, then cancelled after the stall
 * timeout), so nothing a client does can make the daemon's memory grow without bound.
 */
#ifndef CORRAL_DAEMON_SERVER_H
#define CORRAL_DAEMON_SERVER_H

#include "config.h"
#include "corral/status.h"

typedef struct server server;

/* Create the ZeroMQ context, bind every endpoint of the config (the default endpoint when it lists
 * none, creating private ipc directories as needed) and start the scheduler. Takes ownership of
 * c, even on failure. Returns NULL with err naming the endpoint or model that failed. Caller owns
 * the result. */
server *server_new(cfg *c, corral_error *err);

/* The endpoints actually bound, for logs and tests. Borrowed: valid until server_destroy. */
size_t server_endpoint_count(const server *s);
const char *server_endpoint(const server *s, size_t i);

/* Serve until `signal_fd` (a signalfd) delivers SIGINT or SIGTERM; SIGHUP reloads the
 * configuration file. On a stop signal the server stops taking work, ends the requests in flight
 * with Error UNAVAILABLE and returns within 2 seconds. Returns CORRAL_OK after a clean stop, or an
 * error when the sockets fail. */
corral_status server_run(server *s, int signal_fd, corral_error *err);

/* Stop the scheduler, close the sockets (removing ipc socket files) and the context. NULL-safe;
 * sets *s to NULL. */
void server_destroy(server **s);

#endif /* CORRAL_DAEMON_SERVER_H */
