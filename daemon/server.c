/*
 * server.c — ROUTER socket loop: decode each Request, dispatch on its body, encode the Response.
 *
 * Framing: a DEALER client sends one frame (the serialized Request); the ROUTER socket hands us
 * [peer identity][payload]. Every answer goes back as [peer identity][serialized Response]. A
 * message that is not a valid Request gets an Error(PROTOCOL) with id 0, and the loop goes on:
 * nothing a client sends can stop the server.
 */
#include "server.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "corral.pb-c.h"
#include "corral/endpoint.h"
#include "corral/log.h"
#include "corral/version.h"

enum { SERVER_MAX_ENDPOINTS = 64 };

struct server {
    const cfg *config;
    void *zctx;
    void *router;
    char *endpoints[SERVER_MAX_ENDPOINTS];
    size_t n_endpoints;
    int64_t started_ms;
};

static int64_t monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static corral_status server_bind(server *s, const char *endpoint, corral_error *err) {
    if (s->n_endpoints == SERVER_MAX_ENDPOINTS)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "more than %d endpoints",
                                SERVER_MAX_ENDPOINTS);
    corral_status st = endpoint_prepare_bind(endpoint, err);
    if (st != CORRAL_OK) return st;
    if (zmq_bind(s->router, endpoint) != 0)
        return corral_error_set(err, CORRAL_IO, "cannot bind %s: %s", endpoint,
                                zmq_strerror(zmq_errno()));
    s->endpoints[s->n_endpoints] = strdup(endpoint);
    if (!s->endpoints[s->n_endpoints])
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    s->n_endpoints++;
    return CORRAL_OK;
}

server *server_new(const cfg *c, corral_error *err) {
    server *s = calloc(1, sizeof *s);
    if (!s) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    s->config = c;
    s->started_ms = monotonic_ms();
    s->zctx = zmq_ctx_new();
    if (!s->zctx) {
        corral_error_set(err, CORRAL_INTERNAL, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    s->router = zmq_socket(s->zctx, ZMQ_ROUTER);
    if (!s->router) {
        corral_error_set(err, CORRAL_INTERNAL, "zmq_socket: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    int64_t max_msg = (int64_t)c->max_message_bytes;
    int one = 1, linger = 0;
    zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
    /* Report unroutable replies (peer gone) as errors instead of dropping them silently. */
    zmq_setsockopt(s->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(s->router, ZMQ_LINGER, &linger, sizeof linger);

    if (c->n_listen == 0) {
        char endpoint[ENDPOINT_MAX];
        if (endpoint_default(endpoint, sizeof endpoint, err) != CORRAL_OK) goto fail;
        if (server_bind(s, endpoint, err) != CORRAL_OK) goto fail;
    } else {
        for (size_t i = 0; i < c->n_listen; i++)
            if (server_bind(s, c->listen[i], err) != CORRAL_OK) goto fail;
    }
    return s;
fail:
    server_destroy(&s);
    return NULL;
}

size_t server_endpoint_count(const server *s) {
    return s->n_endpoints;
}

const char *server_endpoint(const server *s, size_t i) {
    return i < s->n_endpoints ? s->endpoints[i] : NULL;
}

/* Send one Response to a peer. A peer that has gone away is not an error worth more than a debug
 * line: its requests are cleaned up by the liveness logic. */
static void server_send(server *s, zmq_msg_t *identity, const Corral__V1__Response *resp) {
    size_t len = corral__v1__response__get_packed_size(resp);
    uint8_t stack_buf[1024];
    uint8_t *buf = len <= sizeof stack_buf ? stack_buf : malloc(len);
    if (!buf) {
        log_error("cannot allocate a response", LOG_UINT("bytes", len));
        return;
    }
    corral__v1__response__pack(resp, buf);
    if (zmq_send(s->router, zmq_msg_data(identity), zmq_msg_size(identity), ZMQ_SNDMORE) < 0 ||
        zmq_send(s->router, buf, len, 0) < 0)
        log_debug("response not delivered", LOG_STR("reason", zmq_strerror(zmq_errno())),
                  LOG_UINT("id", resp->id));
    if (buf != stack_buf) free(buf);
}

static void server_send_error(server *s, zmq_msg_t *identity, uint64_t id, corral_status code,
                              const char *message) {
    Corral__V1__Error error = CORRAL__V1__ERROR__INIT;
    error.code = (Corral__V1__ErrorCode)(-code);
    error.message = (char *)message;
    Corral__V1__Response resp = CORRAL__V1__RESPONSE__INIT;
    resp.id = id;
    resp.body_case = CORRAL__V1__RESPONSE__BODY_ERROR;
    resp.error = &error;
    server_send(s, identity, &resp);
}

static void server_handle(server *s, zmq_msg_t *identity, const uint8_t *data, size_t len) {
    Corral__V1__Request *req = corral__v1__request__unpack(NULL, len, data);
    if (!req) {
        log_debug("undecodable request", LOG_UINT("bytes", len));
        server_send_error(s, identity, 0, CORRAL_PROTOCOL,
                          "message is not a valid corral.v1.Request");
        return;
    }
    switch (req->body_case) {
        case CORRAL__V1__REQUEST__BODY_PING: {
            Corral__V1__Pong pong = CORRAL__V1__PONG__INIT;
            pong.version = CORRAL_VERSION;
            pong.protocol_version = CORRAL__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
            pong.uptime_ms = (uint64_t)(monotonic_ms() - s->started_ms);
            Corral__V1__Response resp = CORRAL__V1__RESPONSE__INIT;
            resp.id = req->id;
            resp.body_case = CORRAL__V1__RESPONSE__BODY_PONG;
            resp.pong = &pong;
            server_send(s, identity, &resp);
            break;
        }
        case CORRAL__V1__REQUEST__BODY__NOT_SET:
        default:
            /* An empty body, or a body from a newer protocol this daemon does not know. */
            server_send_error(s, identity, req->id, CORRAL_UNSUPPORTED,
                              "request has no body this daemon understands (protocol version 1)");
            break;
    }
    corral__v1__request__free_unpacked(req, NULL);
}

/* Read one whole multipart message from the router: [identity][payload]. Extra frames mean the
 * sender is not a plain DEALER speaking our framing. */
static void server_receive(server *s) {
    zmq_msg_t identity, payload;
    zmq_msg_init(&identity);
    zmq_msg_init(&payload);
    if (zmq_msg_recv(&identity, s->router, ZMQ_DONTWAIT) < 0) goto done;
    if (!zmq_msg_more(&identity)) goto done; /* cannot happen with ROUTER; ignore */
    if (zmq_msg_recv(&payload, s->router, 0) < 0) goto done;
    if (zmq_msg_more(&payload)) {
        /* Drain the rest so the next read starts at a message boundary. */
        zmq_msg_t extra;
        zmq_msg_init(&extra);
        do {
            if (zmq_msg_recv(&extra, s->router, 0) < 0) break;
        } while (zmq_msg_more(&extra));
        zmq_msg_close(&extra);
        server_send_error(s, &identity, 0, CORRAL_PROTOCOL,
                          "expected exactly one frame per request");
        goto done;
    }
    server_handle(s, &identity, zmq_msg_data(&payload), zmq_msg_size(&payload));
done:
    zmq_msg_close(&payload);
    zmq_msg_close(&identity);
}

corral_status server_run(server *s, int signal_fd, corral_error *err) {
    for (;;) {
        zmq_pollitem_t items[] = {
            {.socket = s->router, .events = ZMQ_POLLIN},
            {.fd = signal_fd, .events = ZMQ_POLLIN},
        };
        int rc = zmq_poll(items, 2, -1);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            return corral_error_set(err, CORRAL_INTERNAL, "zmq_poll: %s",
                                    zmq_strerror(zmq_errno()));
        }
        if (items[1].revents & ZMQ_POLLIN) {
            struct signalfd_siginfo info;
            if (read(signal_fd, &info, sizeof info) == (ssize_t)sizeof info &&
                (info.ssi_signo == SIGINT || info.ssi_signo == SIGTERM)) {
                log_info("stopping", LOG_STR("signal", strsignal((int)info.ssi_signo)));
                return CORRAL_OK;
            }
        }
        if (items[0].revents & ZMQ_POLLIN) {
            /* Drain everything that is ready, then poll again. */
            int events = 0;
            size_t events_len = sizeof events;
            do {
                server_receive(s);
                if (zmq_getsockopt(s->router, ZMQ_EVENTS, &events, &events_len) != 0) break;
            } while (events & ZMQ_POLLIN);
        }
    }
}

void server_destroy(server **ps) {
    if (!ps || !*ps) return;
    server *s = *ps;
    if (s->router) {
        for (size_t i = 0; i < s->n_endpoints; i++) zmq_unbind(s->router, s->endpoints[i]);
        zmq_close(s->router);
    }
    if (s->zctx) zmq_ctx_term(s->zctx);
    for (size_t i = 0; i < s->n_endpoints; i++) {
        /* ZeroMQ leaves the socket file of an ipc endpoint behind; it is ours, remove it. */
        if (strncmp(s->endpoints[i], "ipc://", 6) == 0) unlink(s->endpoints[i] + 6);
        free(s->endpoints[i]);
    }
    free(s);
    *ps = NULL;
}
