/*
 * endpoint.c — default endpoint, validation, and the private directory of ipc:// sockets.
 */
#include "corral/endpoint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/un.h>
#include <unistd.h>

#define IPC_PREFIX "ipc://"
#define TCP_PREFIX "tcp://"

static size_t unix_path_max(void) {
    struct sockaddr_un addr;
    return sizeof addr.sun_path - 1;
}

corral_status endpoint_default(char *buf, size_t size, corral_error *err) {
    const char *runtime = getenv("XDG_RUNTIME_DIR");
    int n;
    if (runtime && runtime[0] == '/')
        n = snprintf(buf, size, IPC_PREFIX "%s/corral/corral.sock", runtime);
    else
        n = snprintf(buf, size, IPC_PREFIX "/tmp/corral-%u/corral.sock", (unsigned)getuid());
    if (n < 0 || (size_t)n >= size || (size_t)n - strlen(IPC_PREFIX) > unix_path_max())
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "default endpoint under XDG_RUNTIME_DIR=%s is too long for a "
                                "Unix socket path",
                                runtime ? runtime : "(unset)");
    return CORRAL_OK;
}

corral_status endpoint_for_client(char *buf, size_t size, corral_error *err) {
    const char *env = getenv("CORRAL_ENDPOINT");
    if (env && *env) {
        if (strlen(env) >= size)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "CORRAL_ENDPOINT is too long");
        memcpy(buf, env, strlen(env) + 1);
        return CORRAL_OK;
    }
    return endpoint_default(buf, size, err);
}

static int parse_port(const char *s) {
    if (!*s) return -1;
    long port = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        port = port * 10 + (*s - '0');
        if (port > 65535) return -1;
    }
    return port >= 1 ? (int)port : -1;
}

corral_status endpoint_validate(const char *endpoint, corral_error *err) {
    if (!endpoint || !*endpoint)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "empty endpoint");
    if (strlen(endpoint) >= ENDPOINT_MAX)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "endpoint longer than %d bytes",
                                ENDPOINT_MAX - 1);
    if (strncmp(endpoint, IPC_PREFIX, strlen(IPC_PREFIX)) == 0) {
        const char *path = endpoint + strlen(IPC_PREFIX);
        if (path[0] != '/')
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "endpoint '%s': ipc path must be absolute", endpoint);
        if (strlen(path) > unix_path_max())
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "endpoint '%s': path longer than a Unix socket allows (%zu)",
                                    endpoint, unix_path_max());
        return CORRAL_OK;
    }
    if (strncmp(endpoint, TCP_PREFIX, strlen(TCP_PREFIX)) == 0) {
        const char *host = endpoint + strlen(TCP_PREFIX);
        const char *port = NULL;
        if (strncmp(host, "127.0.0.1:", 10) == 0)
            port = host + 10;
        else if (strncmp(host, "localhost:", 10) == 0)
            port = host + 10;
        else if (strncmp(host, "[::1]:", 6) == 0)
            port = host + 6;
        if (!port)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "endpoint '%s': tcp endpoints must be on loopback "
                                    "(127.0.0.1, localhost or [::1])",
                                    endpoint);
        if (parse_port(port) < 0)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "endpoint '%s': port must be a number from 1 to 65535",
                                    endpoint);
        return CORRAL_OK;
    }
    return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                            "endpoint '%s': must start with ipc:// or tcp://", endpoint);
}

/* Create dir (one level) with 0700 if missing; then insist it is ours and that nobody else can
 * write in it (replace the socket with their own). Group and others may be let in to connect
 * (mode 0711 or 0750): corrald authenticates every connection (daemon/auth.h, SECURITY.md). */
static corral_status ensure_private_dir(const char *dir, corral_error *err) {
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return corral_error_set(err, CORRAL_IO, "cannot create socket directory %s: %s", dir,
                                strerror(errno));
    struct stat st;
    if (lstat(dir, &st) != 0)
        return corral_error_set(err, CORRAL_IO, "cannot stat socket directory %s: %s", dir,
                                strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return corral_error_set(err, CORRAL_PERMISSION_DENIED,
                                "socket directory %s is not a directory", dir);
    if (st.st_uid != geteuid())
        return corral_error_set(err, CORRAL_PERMISSION_DENIED,
                                "socket directory %s belongs to uid %u, not to this user (%u)", dir,
                                (unsigned)st.st_uid, (unsigned)geteuid());
    if (st.st_mode & 022)
        return corral_error_set(err, CORRAL_PERMISSION_DENIED,
                                "socket directory %s has mode %03o: group or others could replace "
                                "the socket (chmod 700 it, or 711 to let other users connect)",
                                dir, (unsigned)(st.st_mode & 0777));
    return CORRAL_OK;
}

/* 1 if something accepts connections on the Unix socket at path. */
static int socket_is_live(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memcpy(addr.sun_path, path, strlen(path) + 1);
    int live = connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0;
    close(fd);
    return live;
}

corral_status endpoint_prepare_bind(const char *endpoint, corral_error *err) {
    corral_status st = endpoint_validate(endpoint, err);
    if (st != CORRAL_OK) return st;
    if (strncmp(endpoint, IPC_PREFIX, strlen(IPC_PREFIX)) != 0) return CORRAL_OK;

    const char *path = endpoint + strlen(IPC_PREFIX);
    char dir[ENDPOINT_MAX];
    memcpy(dir, path, strlen(path) + 1);
    char *slash = strrchr(dir, '/');
    if (slash == dir) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "endpoint '%s': the socket must live in a directory of its own, "
                                "not in /",
                                endpoint);
    }
    *slash = '\0';
    st = ensure_private_dir(dir, err);
    if (st != CORRAL_OK) return st;
    if (socket_is_live(path))
        return corral_error_set(err, CORRAL_UNAVAILABLE,
                                "endpoint '%s' is in use: another corrald is listening there",
                                endpoint);
    return CORRAL_OK;
}

corral_status endpoint_parse_address(const char *text, endpoint_addr *out, corral_error *err) {
    memset(out, 0, sizeof *out);
    const char *want = "HOST:PORT with HOST an IPv4 address, localhost or [IPv6], PORT 1-65535";
    const char *colon = strrchr(text, ':');
    char host[64];
    size_t host_len = colon ? (size_t)(colon - text) : 0;
    if (!colon || host_len == 0 || host_len >= sizeof host)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "'%s': expected %s", text, want);
    memcpy(host, text, host_len);
    host[host_len] = '\0';
    char *end;
    errno = 0;
    const unsigned long port = strtoul(colon + 1, &end, 10);
    if (!colon[1] || *end || errno || port == 0 || port > 65535 || colon[1] == '-' ||
        colon[1] == '+')
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "'%s': bad port; expected %s", text,
                                want);
    if (host[0] == '[') {
        if (host_len < 3 || host[host_len - 1] != ']')
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "'%s': expected %s", text, want);
        host[host_len - 1] = '\0';
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&out->addr;
        if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) != 1)
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "'%s': '%s' is not an IPv6 address", text, host + 1);
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        out->len = sizeof *a;
        out->ipv6 = true;
        out->loopback = IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
        return CORRAL_OK;
    }
    struct sockaddr_in *a = (struct sockaddr_in *)&out->addr;
    if (strcmp(host, "localhost") == 0) {
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else if (inet_pton(AF_INET, host, &a->sin_addr) != 1) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "'%s': '%s' is not an IPv4 address (names other than localhost "
                                "are not resolved)",
                                text, host);
    }
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    out->len = sizeof *a;
    out->loopback = (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    return CORRAL_OK;
}
