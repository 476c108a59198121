/*
 * endpoint.h — where corrald listens and clients connect by default, and how an ipc:// endpoint's
 * directory is made private. Shared by the daemon and the C client so the two always agree.
 *
 * The default is ipc://$XDG_RUNTIME_DIR/corral/corral.sock, or ipc:///tmp/corral-$UID/corral.sock
 * when XDG_RUNTIME_DIR is unset; CORRAL_ENDPOINT overrides it on the client side.
 */
#ifndef CORRAL_ENDPOINT_H
#define CORRAL_ENDPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include "corral/status.h"

/* The longest endpoint string corral handles, including the NUL. */
#define ENDPOINT_MAX 256

/* Write the default endpoint into buf. Returns CORRAL_OK, or CORRAL_INVALID_ARGUMENT with a message
 * when the path would not fit in buf or in a Unix socket address. */
corral_status endpoint_default(char *buf, size_t size, corral_error *err);

/* The endpoint clients should use: CORRAL_ENDPOINT when set and non-empty, else the default. */
corral_status endpoint_for_client(char *buf, size_t size, corral_error *err);

/* Check that an endpoint is one corral accepts: ipc://ABSOLUTE_PATH (short enough for a Unix socket
 * address) or tcp://127.0.0.1:PORT / tcp://[::1]:PORT (loopback only: corral is a local service).
 */
corral_status endpoint_validate(const char *endpoint, corral_error *err);

/* Before the daemon binds an ipc:// endpoint: create its directory with mode 0700 if missing, and
 * refuse one that is not a directory, not owned by this user, or writable by group/others (who
 * may still be let in to connect: corrald authenticates each connection); refuse a
 * socket file another process is still listening on (ZeroMQ would silently take it over). A stale
 * socket file is left for ZeroMQ to replace. tcp:// endpoints need no preparation. */
corral_status endpoint_prepare_bind(const char *endpoint, corral_error *err);

/* A TCP address to listen on (corrald's HTTP front end): "HOST:PORT" with HOST an IPv4 literal,
 * "localhost" (127.0.0.1) or a bracketed IPv6 literal ("[::1]:11435"), PORT 1-65535. */
typedef struct endpoint_addr {
    struct sockaddr_storage addr;
    socklen_t len;
    bool ipv6;
    bool loopback; /* 127.0.0.0/8 or ::1 */
} endpoint_addr;

/* Parse `text` into *out. Returns CORRAL_OK, or CORRAL_INVALID_ARGUMENT with a message quoting the
 * text and saying what was expected. Never resolves names other than "localhost". */
corral_status endpoint_parse_address(const char *text, endpoint_addr *out, corral_error *err);

#endif /* CORRAL_ENDPOINT_H */
