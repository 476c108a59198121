/*
 * server.h — corrald's front door: the ZeroMQ ROUTER socket(s) and the loop that reads requests
 * and writes responses (the zguide's ROUTER/DEALER pattern). It owns the ZeroMQ context.
 *
 * The loop runs on the thread that calls server_run() and returns when the signal descriptor
 * reports SIGINT or SIGTERM.
 */
#ifndef CORRAL_DAEMON_SERVER_H
#define CORRAL_DAEMON_SERVER_H

#include "config.h"
#include "corral/status.h"

typedef struct server server;

/* Create the ZeroMQ context and bind every endpoint of the config (the default endpoint when it
 * lists none), creating private ipc directories as needed. Borrows `c` for the server's lifetime.
 * Returns NULL with err naming the endpoint that failed. Caller owns the result. */
server *server_new(const cfg *c, corral_error *err);

/* The endpoints actually bound, for logs and tests. Borrowed: valid until server_destroy. */
size_t server_endpoint_count(const server *s);
const char *server_endpoint(const server *s, size_t i);

/* Serve until `signal_fd` (a signalfd) delivers SIGINT or SIGTERM. Returns CORRAL_OK after a clean
 * stop, or an error when the sockets fail. */
corral_status server_run(server *s, int signal_fd, corral_error *err);

/* Close the sockets (removing ipc socket files) and the context. NULL-safe; sets *s to NULL. */
void server_destroy(server **s);

#endif /* CORRAL_DAEMON_SERVER_H */
