/*
 * client.c — libcorral: a DEALER socket to corrald, request ids, and waiting for the Response
 * that answers a given request (responses to other, abandoned requests are skipped).
 */
#include "corral.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "corral.pb-c.h"
#include "corral/endpoint.h"

struct corral_client {
    void *zctx;
    void *dealer;
    char endpoint[ENDPOINT_MAX];
    uint64_t next_id;
};

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
    c->zctx = zmq_ctx_new();
    if (!c->zctx) {
        corral_error_set(err, CORRAL_INTERNAL, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    c->dealer = zmq_socket(c->zctx, ZMQ_DEALER);
    int linger = 0;
    if (!c->dealer || zmq_setsockopt(c->dealer, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
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
    if (c->dealer) zmq_close(c->dealer);
    if (c->zctx) zmq_ctx_term(c->zctx);
    free(c);
    *pc = NULL;
}

const char *corral_client_endpoint(const corral_client *client) {
    return client->endpoint;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static corral_status client_send(corral_client *c, Corral__V1__Request *req, corral_error *err) {
    req->protocol_version = CORRAL__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
    size_t len = corral__v1__request__get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    corral__v1__request__pack(req, buf);
    int rc = zmq_send(c->dealer, buf, len, 0);
    free(buf);
    if (rc < 0)
        return corral_error_set(err, CORRAL_UNAVAILABLE, "send to %s failed: %s", c->endpoint,
                                zmq_strerror(zmq_errno()));
    return CORRAL_OK;
}

/* Wait for the next Response with the given id. Caller owns *out (free_unpacked). */
static corral_status client_receive(corral_client *c, uint64_t id, int timeout_ms,
                                    Corral__V1__Response **out, corral_error *err) {
    int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    for (;;) {
        int wait = -1;
        if (deadline >= 0) {
            int64_t left = deadline - now_ms();
            wait = left > 0 ? (int)left : 0;
        }
        zmq_pollitem_t item = {.socket = c->dealer, .events = ZMQ_POLLIN};
        int rc = zmq_poll(&item, 1, wait);
        if (rc < 0)
            return corral_error_set(err, CORRAL_INTERNAL, "zmq_poll: %s",
                                    zmq_strerror(zmq_errno()));
        if (rc == 0)
            return corral_error_set(err, CORRAL_DEADLINE_EXCEEDED,
                                    "no answer from corrald at %s within %d ms (is it running?)",
                                    c->endpoint, timeout_ms);
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, c->dealer, 0) < 0) {
            zmq_msg_close(&msg);
            return corral_error_set(err, CORRAL_UNAVAILABLE, "receive failed: %s",
                                    zmq_strerror(zmq_errno()));
        }
        Corral__V1__Response *resp =
            corral__v1__response__unpack(NULL, zmq_msg_size(&msg), zmq_msg_data(&msg));
        zmq_msg_close(&msg);
        if (!resp)
            return corral_error_set(err, CORRAL_PROTOCOL, "undecodable response from %s",
                                    c->endpoint);
        if (resp->id == id || resp->id == 0) {
            *out = resp;
            return CORRAL_OK;
        }
        corral__v1__response__free_unpacked(resp, NULL); /* answer to an abandoned request */
    }
}

/* Turn an Error body into a corral_status plus message. */
static corral_status client_error_from(const Corral__V1__Error *e, corral_error *err) {
    int code = -(int)e->code;
    if (!corral_status_name(code) || code == CORRAL_OK) code = CORRAL_PROTOCOL;
    return corral_error_set(err, (corral_status)code, "%s", e->message ? e->message : "");
}

corral_status corral_client_ping(corral_client *c, int timeout_ms, corral_pong *pong,
                                 corral_error *err) {
    Corral__V1__Ping ping = CORRAL__V1__PING__INIT;
    Corral__V1__Request req = CORRAL__V1__REQUEST__INIT;
    req.id = c->next_id++;
    req.body_case = CORRAL__V1__REQUEST__BODY_PING;
    req.ping = &ping;
    corral_status st = client_send(c, &req, err);
    if (st != CORRAL_OK) return st;
    Corral__V1__Response *resp = NULL;
    st = client_receive(c, req.id, timeout_ms, &resp, err);
    if (st != CORRAL_OK) return st;
    if (resp->body_case == CORRAL__V1__RESPONSE__BODY_PONG) {
        if (pong) {
            snprintf(pong->version, sizeof pong->version, "%s",
                     resp->pong->version ? resp->pong->version : "");
            pong->protocol_version = resp->pong->protocol_version;
            pong->uptime_ms = resp->pong->uptime_ms;
        }
    } else if (resp->body_case == CORRAL__V1__RESPONSE__BODY_ERROR) {
        st = client_error_from(resp->error, err);
    } else {
        st = corral_error_set(err, CORRAL_PROTOCOL, "unexpected answer to ping");
    }
    corral__v1__response__free_unpacked(resp, NULL);
    return st;
}
