/*
 * client.c — libcorral's connection: a DEALER socket to corrald, request ids, the app name, and
 * the loop that reads Responses and sorts them by id (to a plain call waiting for its reply, to a
 * generation's queue, or away when nobody waits for them any more: pongs of keep-alive pings,
 * acks of cancels, answers to abandoned requests). Also ping, the one request every daemon
 * answers.
 *
 * Liveness: the loop is the only place that waits, so it is where pings go out (every
 * CORRAL_PING_INTERVAL_MS since the last send) and where a silent daemon is noticed (nothing
 * received for CORRAL_SILENCE_LIMIT_MS after a ping).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "client_impl.h"

corral_client *corral_client_new(const char *endpoint, corral_error *err) {
    corral_client *c = calloc(1, sizeof *c);
    if (!c) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    if (endpoint) {
        if (endpoint_validate(endpoint, err) != CORRAL_OK) goto fail;
        memcpy(c->endpoint, endpoint, strlen(endpoint) + 1);
    } else if (endpoint_for_client(c->endpoint, sizeof c->endpoint, err) != CORRAL_OK ||
               endpoint_validate(c->endpoint, err) != CORRAL_OK) {
        goto fail;
    }
    c->next_id = 1;
    c->queue_limit = CORRAL_QUEUE_LIMIT_DEFAULT;
    c->zctx = zmq_ctx_new();
    if (!c->zctx) {
        corral_error_set(err, CORRAL_INTERNAL, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    c->dealer = zmq_socket(c->zctx, ZMQ_DEALER);
    /* IPv6 on, so that tcp://[::1]:PORT connects as well as IPv4 addresses do. */
    int linger = 0, ipv6 = 1;
    if (!c->dealer || zmq_setsockopt(c->dealer, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(c->dealer, ZMQ_IPV6, &ipv6, sizeof ipv6) != 0 ||
        zmq_connect(c->dealer, c->endpoint) != 0) {
        corral_error_set(err, CORRAL_UNAVAILABLE, "cannot connect to %s: %s", c->endpoint,
                         zmq_strerror(zmq_errno()));
        goto fail;
    }
    return c;
fail:
    corral_client_destroy(&c);
    return NULL;
}

void corral_client_destroy(corral_client **pc) {
    if (!pc || !*pc) return;
    corral_client *c = *pc;
    while (c->generations) {
        corral_generation *g = c->generations;
        c->generations = g->next;
        generation__detach(g);
    }
    if (c->awaited_reply) corral__v1__response__free_unpacked(c->awaited_reply, NULL);
    if (c->dealer) {
        /* Give what is still queued (typically the Cancel of a generation destroyed just
         * before) a moment to leave; a daemon that is not there costs at most this wait. */
        int linger = CLIENT_CLOSE_LINGER_MS;
        zmq_setsockopt(c->dealer, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(c->dealer);
    }
    if (c->zctx) zmq_ctx_term(c->zctx);
    free(c);
    *pc = NULL;
}

const char *corral_client_endpoint(const corral_client *client) {
    return client->endpoint;
}

corral_status corral_client_set_app(corral_client *c, const char *app) {
    if (!app) app = "";
    size_t len = strlen(app);
    if (len >= sizeof c->app) return CORRAL_INVALID_ARGUMENT;
    memcpy(c->app, app, len + 1);
    return CORRAL_OK;
}

void corral_client_set_queue_limit(corral_client *c, size_t bytes) {
    c->queue_limit = bytes ? bytes : CORRAL_QUEUE_LIMIT_DEFAULT;
}

int64_t client__now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

corral_status client__send(corral_client *c, Corral__V1__Request *req, corral_error *err) {
    req->id = c->next_id++;
    req->app = c->app;
    req->protocol_version = CORRAL__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
    size_t len = corral__v1__request__get_packed_size(req);
    zmq_msg_t msg;
    if (zmq_msg_init_size(&msg, len) != 0)
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory for a %zu-byte request",
                                len);
    corral__v1__request__pack(req, zmq_msg_data(&msg));
    int rc;
    do {
        rc = zmq_msg_send(&msg, c->dealer, 0);
    } while (rc < 0 && zmq_errno() == EINTR);
    if (rc < 0) {
        int e = zmq_errno();
        zmq_msg_close(&msg);
        return corral_error_set(err, CORRAL_UNAVAILABLE, "send to corrald at %s failed: %s",
                                c->endpoint, zmq_strerror(e));
    }
    c->last_send_ms = client__now_ms();
    return CORRAL_OK;
}

corral_status client__send_cancel(corral_client *c, uint64_t id, corral_error *err) {
    Corral__V1__Cancel cancel = CORRAL__V1__CANCEL__INIT;
    cancel.request_id = id;
    Corral__V1__Request req = CORRAL__V1__REQUEST__INIT;
    req.body_case = CORRAL__V1__REQUEST__BODY_CANCEL;
    req.cancel = &cancel;
    return client__send(c, &req, err);
}

static corral_status client_send_ping(corral_client *c, corral_error *err) {
    Corral__V1__Ping ping = CORRAL__V1__PING__INIT;
    Corral__V1__Request req = CORRAL__V1__REQUEST__INIT;
    req.body_case = CORRAL__V1__REQUEST__BODY_PING;
    req.ping = &ping;
    return client__send(c, &req, err);
}

const char *client__body_name(Corral__V1__Response__BodyCase body) {
    switch (body) {
        case CORRAL__V1__RESPONSE__BODY_ERROR:
            return "Error";
        case CORRAL__V1__RESPONSE__BODY_PONG:
            return "Pong";
        case CORRAL__V1__RESPONSE__BODY_CHUNK:
            return "Chunk";
        case CORRAL__V1__RESPONSE__BODY_DONE:
            return "Done";
        case CORRAL__V1__RESPONSE__BODY_TOKENIZE:
            return "TokenizeReply";
        case CORRAL__V1__RESPONSE__BODY_MODELS:
            return "ModelList";
        case CORRAL__V1__RESPONSE__BODY_STATUS:
            return "StatusReply";
        case CORRAL__V1__RESPONSE__BODY_ACK:
            return "Ack";
        case CORRAL__V1__RESPONSE__BODY_PROGRESS:
            return "Progress";
        default:
            return "a message without a body";
    }
}

corral_status client__error_from(const Corral__V1__Error *e, corral_error *err) {
    int code = -(int)e->code;
    const char *message = e->message ? e->message : "";
    if (code == CORRAL_OK || !corral_status_name(code))
        return corral_error_set(err, CORRAL_PROTOCOL, "corrald sent error code %d: %s",
                                (int)e->code, message);
    return corral_error_set(err, (corral_status)code, "%s", message);
}

/* Hand one Response to whoever waits for it; drop it when nobody does. */
static void client_dispatch(corral_client *c, Corral__V1__Response *resp, size_t wire_size) {
    /* id 0 answers a message the daemon could not decode; only a plain call can be waiting for
     * such an answer (generations are sent the same way, but their queue is matched by id). */
    if (c->awaited_id && !c->awaited_reply && (resp->id == c->awaited_id || resp->id == 0)) {
        c->awaited_reply = resp;
        return;
    }
    for (corral_generation *g = c->generations; g; g = g->next) {
        if (g->id == resp->id && !g->finished) {
            generation__accept(g, resp, wire_size);
            return;
        }
    }
    corral__v1__response__free_unpacked(resp, NULL);
}

corral_status client__pump(corral_client *c, int64_t deadline_ms, corral_error *err) {
    for (;;) {
        int64_t now = client__now_ms();
        if (now - c->last_send_ms >= CORRAL_PING_INTERVAL_MS) {
            corral_status st = client_send_ping(c, err);
            if (st != CORRAL_OK) return st;
            if (!c->silent_since_ms) c->silent_since_ms = now;
        }
        if (c->silent_since_ms && now - c->silent_since_ms >= CORRAL_SILENCE_LIMIT_MS)
            return corral_error_set(err, CORRAL_UNAVAILABLE,
                                    "corrald at %s stopped answering (no reply to pings for %d s)",
                                    c->endpoint, CORRAL_SILENCE_LIMIT_MS / 1000);
        int64_t wait = c->last_send_ms + CORRAL_PING_INTERVAL_MS - now;
        if (deadline_ms >= 0 && deadline_ms - now < wait) wait = deadline_ms - now;
        if (wait < 0) wait = 0;
        zmq_pollitem_t item = {.socket = c->dealer, .events = ZMQ_POLLIN};
        int rc = zmq_poll(&item, 1, (long)wait);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            return corral_error_set(err, CORRAL_INTERNAL, "zmq_poll: %s",
                                    zmq_strerror(zmq_errno()));
        }
        if (rc == 0) {
            if (deadline_ms >= 0 && client__now_ms() >= deadline_ms)
                return CORRAL_DEADLINE_EXCEEDED;
            continue;
        }
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, c->dealer, ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&msg);
            if (e == EINTR || e == EAGAIN) continue;
            return corral_error_set(err, CORRAL_UNAVAILABLE, "receive from corrald at %s: %s",
                                    c->endpoint, zmq_strerror(e));
        }
        c->silent_since_ms = 0;
        size_t size = zmq_msg_size(&msg);
        Corral__V1__Response *resp = corral__v1__response__unpack(NULL, size, zmq_msg_data(&msg));
        zmq_msg_close(&msg);
        if (!resp)
            return corral_error_set(err, CORRAL_PROTOCOL,
                                    "undecodable %zu-byte message from corrald at %s", size,
                                    c->endpoint);
        client_dispatch(c, resp, size);
        return CORRAL_OK;
    }
}

corral_status client__call(corral_client *c, Corral__V1__Request *req,
                           Corral__V1__Response__BodyCase want, const char *what, int timeout_ms,
                           Corral__V1__Response **out, corral_error *err) {
    *out = NULL;
    if (c->awaited_id)
        return corral_error_set(err, CORRAL_FAILED_PRECONDITION,
                                "%s: the client is already waiting for a reply (a client is used "
                                "by one thread at a time, and not from its callbacks)",
                                what);
    int64_t deadline = client__deadline(timeout_ms);
    corral_status st = client__send(c, req, err);
    if (st != CORRAL_OK) return st;
    c->awaited_id = req->id;
    while (!c->awaited_reply) {
        st = client__pump(c, deadline, err);
        if (st == CORRAL_DEADLINE_EXCEEDED)
            corral_error_set(err, st,
                             "no answer to %s from corrald at %s within %d ms (is it running?)",
                             what, c->endpoint, timeout_ms);
        if (st != CORRAL_OK) break;
    }
    Corral__V1__Response *resp = c->awaited_reply;
    c->awaited_id = 0;
    c->awaited_reply = NULL;
    if (st != CORRAL_OK) {
        if (resp) corral__v1__response__free_unpacked(resp, NULL);
        return st;
    }
    if (resp->body_case == CORRAL__V1__RESPONSE__BODY_ERROR)
        st = client__error_from(resp->error, err);
    else if (resp->body_case != want)
        st = corral_error_set(err, CORRAL_PROTOCOL, "corrald at %s answered %s with %s",
                              c->endpoint, what, client__body_name(resp->body_case));
    if (st != CORRAL_OK) {
        corral__v1__response__free_unpacked(resp, NULL);
        return st;
    }
    *out = resp;
    return CORRAL_OK;
}

corral_status corral_client_ping(corral_client *c, int timeout_ms, corral_pong *pong,
                                 corral_error *err) {
    Corral__V1__Ping ping = CORRAL__V1__PING__INIT;
    Corral__V1__Request req = CORRAL__V1__REQUEST__INIT;
    req.body_case = CORRAL__V1__REQUEST__BODY_PING;
    req.ping = &ping;
    Corral__V1__Response *resp;
    corral_status st =
        client__call(c, &req, CORRAL__V1__RESPONSE__BODY_PONG, "Ping", timeout_ms, &resp, err);
    if (st != CORRAL_OK) return st;
    if (pong) {
        snprintf(pong->version, sizeof pong->version, "%s",
                 resp->pong->version ? resp->pong->version : "");
        pong->protocol_version = resp->pong->protocol_version;
        pong->uptime_ms = resp->pong->uptime_ms;
    }
    corral__v1__response__free_unpacked(resp, NULL);
    return CORRAL_OK;
}
