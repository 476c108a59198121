/*
 * corral.h — libcorral, the C client library of corral.
 *
 * A corral_client is one connection (a ZeroMQ DEALER socket) to corrald. It is not thread-safe:
 * use one client per thread, or guard it with a lock. Every call that talks to the daemon takes a
 * timeout in milliseconds (-1: wait forever) and fills a corral_error on failure; the status codes
 * are corral's project-wide ones (corral/status.h).
 */
#ifndef CORRAL_CLIENT_H
#define CORRAL_CLIENT_H

#include <stdint.h>

#include "corral/status.h"

typedef struct corral_client corral_client;

/* Connect to corrald at `endpoint` (NULL: $CORRAL_ENDPOINT, else the default endpoint). Connecting
 * does not wait for the daemon; the first request does. Caller owns the result
 * (corral_client_destroy). Returns NULL with err set for an invalid endpoint. */
corral_client *corral_client_new(const char *endpoint, corral_error *err);

/* Close the connection. NULL-safe; sets *client to NULL. */
void corral_client_destroy(corral_client **client);

/* The endpoint this client connects to. Borrowed: valid until the client is destroyed. */
const char *corral_client_endpoint(const corral_client *client);

/* What the daemon answered to a ping. */
typedef struct corral_pong {
    char version[32];          /* corral version of the daemon, e.g. "0.1.0" */
    uint32_t protocol_version; /* the daemon's protocol revision */
    uint64_t uptime_ms;        /* milliseconds since the daemon started */
} corral_pong;

/* Ask the daemon whether it is alive. Returns CORRAL_OK and fills *pong (may be NULL), or
 * CORRAL_DEADLINE_EXCEEDED when no answer came within timeout_ms, or the daemon's error. */
corral_status corral_client_ping(corral_client *client, int timeout_ms, corral_pong *pong,
                                 corral_error *err);

#endif /* CORRAL_CLIENT_H */
