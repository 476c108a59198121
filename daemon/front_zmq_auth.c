/*
 * front_zmq_auth.c — the ZAP handler, CURVE listeners and the handshake monitor (see
 * front_zmq_auth.h).
 *
 * Options of a ZeroMQ socket are copied into each listener when it binds, so one ROUTER socket
 * serves ipc listeners with the NULL mechanism and tcp listeners with CURVE: the front end binds
 * every ipc endpoint first, then switches the socket to CURVE and binds the tcp ones. The ZAP
 * domain, set before each group, tells the handler which listener a connection came through.
 */
#include "front_zmq_auth.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral/curve.h"
#include "corral/log.h"

#define ZAP_ENDPOINT       "inproc://zeromq.zap.01"
#define MONITOR_ENDPOINT   "inproc://corrald.handshakes"
/* ZMQ_ZAP_ENFORCE_DOMAIN (a draft option in libzmq 4.3): refuse a connection when no ZAP handler
 * answers, rather than let it in. Set when the library knows it; the handler is bound before any
 * listener anyway, and a message without a User-Id is refused by the loop. */
#define ZAP_ENFORCE_DOMAIN 93

enum { ZAP_FRAMES_MAX = 8 };

struct zauth {
    void *zap;     /* REP: ZAP requests */
    void *monitor; /* PAIR: the router's handshake events */
    void *router;  /* borrowed */
};

zauth *zauth_new(void *zctx, void *router, corral_error *err) {
    zauth *a = calloc(1, sizeof *a);
    if (!a) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    a->router = router;
    int linger = 0;
    a->zap = zmq_socket(zctx, ZMQ_REP);
    if (!a->zap || zmq_setsockopt(a->zap, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_bind(a->zap, ZAP_ENDPOINT) != 0) {
        corral_error_set(err, CORRAL_INTERNAL, "cannot bind the ZAP handler at %s: %s",
                         ZAP_ENDPOINT, zmq_strerror(zmq_errno()));
        zauth_destroy(&a);
        return NULL;
    }
    const int events = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                       ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_DISCONNECTED;
    if (zmq_socket_monitor(router, MONITOR_ENDPOINT, events) != 0 ||
        !(a->monitor = zmq_socket(zctx, ZMQ_PAIR)) ||
        zmq_setsockopt(a->monitor, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_connect(a->monitor, MONITOR_ENDPOINT) != 0) {
        corral_error_set(err, CORRAL_INTERNAL, "cannot monitor the server socket: %s",
                         zmq_strerror(zmq_errno()));
        zauth_destroy(&a);
        return NULL;
    }
    int one = 1;
    zmq_setsockopt(router, ZAP_ENFORCE_DOMAIN, &one, sizeof one); /* unknown option: ignored */
    return a;
}

void zauth_destroy(zauth **pa) {
    if (!pa || !*pa) return;
    zauth *a = *pa;
    if (a->monitor) {
        zmq_socket_monitor(a->router, NULL, 0);
        zmq_close(a->monitor);
    }
    if (a->zap) zmq_close(a->zap);
    free(a);
    *pa = NULL;
}

void *zauth_zap_socket(const zauth *a) {
    return a->zap;
}

void *zauth_monitor_socket(const zauth *a) {
    return a->monitor;
}

/* Refused connections, by the ZAP handler or at the handshake: a peer retrying in a loop is
 * logged 20 times per 10 s at most, each record saying how many were left out before it. */
static log_limit refusal_log = LOG_LIMIT_INIT(20, 10000);

/* ---- listeners ------------------------------------------------------------------------------ */

corral_status zauth_prepare_ipc(void *router, corral_error *err) {
    const int zero = 0;
    if (zmq_setsockopt(router, ZMQ_CURVE_SERVER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(router, ZMQ_ZAP_DOMAIN, AUTH_ZAP_DOMAIN_IPC, strlen(AUTH_ZAP_DOMAIN_IPC)) !=
            0)
        return corral_error_set(err, CORRAL_INTERNAL, "cannot set the ZAP domain: %s",
                                zmq_strerror(zmq_errno()));
    return CORRAL_OK;
}

corral_status zauth_prepare_tcp(void *router, const cfg *c, const char *endpoint,
                                corral_error *err) {
    if (!c->server_key_file)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "endpoint '%s': tcp endpoints need CURVE, and auth.server_key_file "
                                "is not set. Make keys with `corral keygen DIR`, set "
                                "auth.server_key_file to DIR/corral.key and list each client's "
                                "public key in its app's curve_keys (see SECURITY.md), or listen "
                                "on ipc:// instead",
                                endpoint);
    if (!zmq_has("curve"))
        return corral_error_set(err, CORRAL_UNSUPPORTED,
                                "endpoint '%s': this libzmq has no CURVE support (it must be built "
                                "with libsodium)",
                                endpoint);
    char secret[CURVE_KEY_TEXT];
    corral_error why;
    if (curve_key_read(c->server_key_file, CURVE_KEY_SECRET, secret, &why) != CORRAL_OK)
        return corral_error_set(err, why.status, "auth.server_key_file: %s", why.message);
    char public_key[CURVE_KEY_TEXT];
    if (zmq_curve_public(public_key, secret) != 0)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "auth.server_key_file: %s does not hold a CURVE secret key",
                                c->server_key_file);
    const int one = 1;
    const bool ok = zmq_setsockopt(router, ZMQ_CURVE_SERVER, &one, sizeof one) == 0 &&
                    zmq_setsockopt(router, ZMQ_CURVE_SECRETKEY, secret, CURVE_KEY_TEXT - 1) == 0 &&
                    zmq_setsockopt(router, ZMQ_ZAP_DOMAIN, AUTH_ZAP_DOMAIN_TCP,
                                   strlen(AUTH_ZAP_DOMAIN_TCP)) == 0;
    memset(secret, 0, sizeof secret);
    if (!ok)
        return corral_error_set(err, CORRAL_INTERNAL, "cannot set up CURVE for %s: %s", endpoint,
                                zmq_strerror(zmq_errno()));
    log_info("tcp clients authenticate with CURVE", LOG_STR("endpoint", endpoint),
             LOG_STR("server_public_key", public_key));
    return CORRAL_OK;
}

/* ---- the ZAP handler ------------------------------------------------------------------------ */

/* Send a ZAP reply: version, request id, status code and text, user id, no metadata. */
static void zap_reply(zauth *a, const zmq_msg_t *request_id, const char *code, const char *text,
                      const char *user_id) {
    const char *frames[] = {"1.0", NULL, code, text, user_id, ""};
    for (size_t i = 0; i < 6; i++) {
        const int more = i < 5 ? ZMQ_SNDMORE : 0;
        if (i == 1)
            zmq_send(a->zap, zmq_msg_data((zmq_msg_t *)request_id),
                     zmq_msg_size((zmq_msg_t *)request_id), more);
        else
            zmq_send(a->zap, frames[i], strlen(frames[i]), more);
    }
}

void zauth_answer_zap(zauth *a, core *k) {
    zmq_msg_t frames[ZAP_FRAMES_MAX];
    size_t n = 0;
    for (bool more = true, first = true; more; first = false) {
        zmq_msg_t extra; /* frames beyond the ones a request has are read and dropped */
        zmq_msg_t *m = n < ZAP_FRAMES_MAX ? &frames[n] : &extra;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, a->zap, first ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(m);
            if (first) return; /* nothing after all */
            break;
        }
        more = zmq_msg_more(m);
        if (m == &extra)
            zmq_msg_close(m);
        else
            n++;
    }
    /* version, request id, domain, address, routing id, mechanism, credentials... */
    corral_error err = {0};
    auth_peer peer;
    const char *frame[ZAP_FRAMES_MAX];
    size_t size[ZAP_FRAMES_MAX];
    for (size_t i = 0; i < n; i++) {
        frame[i] = zmq_msg_data(&frames[i]);
        size[i] = zmq_msg_size(&frames[i]);
    }
    corral_status st = CORRAL_OK;
    if (n < 6 || size[0] != 3 || memcmp(frame[0], "1.0", 3) != 0) {
        st = corral_error_set(&err, CORRAL_PERMISSION_DENIED, "a malformed ZAP request");
    } else {
        const bool ipc = size[2] == strlen(AUTH_ZAP_DOMAIN_IPC) &&
                         memcmp(frame[2], AUTH_ZAP_DOMAIN_IPC, size[2]) == 0;
        const bool tcp = size[2] == strlen(AUTH_ZAP_DOMAIN_TCP) &&
                         memcmp(frame[2], AUTH_ZAP_DOMAIN_TCP, size[2]) == 0;
        if (!ipc && !tcp)
            st = corral_error_set(&err, CORRAL_PERMISSION_DENIED, "an unknown ZAP domain");
        else
            st = auth_peer_from_zap(
                ipc ? AUTH_VIA_IPC : AUTH_VIA_CURVE, frame[5], size[5], frame[3], size[3],
                n > 6 ? (const unsigned char *)frame[6] : NULL, n > 6 ? size[6] : 0, &peer, &err);
    }
    char who[128] = "an unknown peer";
    if (st == CORRAL_OK) {
        auth_peer_describe(&peer, who, sizeof who);
        auth_table *t = k ? core_auth_acquire(k) : NULL;
        st = t ? auth_admit(t, &peer, &err)
               : corral_error_set(&err, CORRAL_UNAVAILABLE, "corrald is starting");
        auth_table_release(&t);
    }
    char user_id[96] = "";
    if (st == CORRAL_OK && auth_peer_format(&peer, user_id, sizeof user_id) == 0)
        st = corral_error_set(&err, CORRAL_INTERNAL, "peer name too long");
    if (st == CORRAL_OK) {
        log_debug("connection accepted", LOG_STR("peer", who));
        zap_reply(a, n > 1 ? &frames[1] : &frames[0], "200", "OK", user_id);
    } else {
        uint64_t left_out;
        if (log_limit_allow(&refusal_log, &left_out))
            log_warn("connection refused", LOG_STR("peer", who), LOG_STR("reason", err.message),
                     LOG_UINT("left_out", left_out));
        zap_reply(a, n > 1 ? &frames[1] : &frames[0],
                  st == CORRAL_PERMISSION_DENIED ? "400" : "500", "refused", "");
    }
    for (size_t i = 0; i < n; i++) zmq_msg_close(&frames[i]);
}

/* ---- the monitor ---------------------------------------------------------------------------- */

/* What a failed handshake's code means, for the log. */
static const char *handshake_reason(uint16_t event, uint32_t value, const char *endpoint) {
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) return "refused by the ZAP handler";
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        return strncmp(endpoint, "tcp://", 6) == 0
                   ? "the client left the CURVE handshake (a client without CURVE keys?)"
                   : "the client left the handshake";
    switch (value) {
        case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return "the client does not use CURVE (tcp endpoints need it: SECURITY.md)";
        case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            return "the CURVE handshake failed (the client has a wrong server key?)";
        default:
            return "protocol error in the handshake";
    }
}

void zauth_read_monitor(zauth *a, void (*closed)(void *ctx, int fd), void *ctx) {
    for (;;) {
        zmq_msg_t head, address;
        zmq_msg_init(&head);
        if (zmq_msg_recv(&head, a->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&head);
            return;
        }
        zmq_msg_init(&address);
        const bool two = zmq_msg_more(&head) && zmq_msg_recv(&address, a->monitor, 0) >= 0;
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&head) >= 6) {
            memcpy(&event, zmq_msg_data(&head), 2);
            memcpy(&value, (char *)zmq_msg_data(&head) + 2, 4);
        }
        char endpoint[256] = "";
        if (two) {
            const size_t len = zmq_msg_size(&address) < sizeof endpoint - 1 ? zmq_msg_size(&address)
                                                                            : sizeof endpoint - 1;
            memcpy(endpoint, zmq_msg_data(&address), len);
            endpoint[len] = '\0';
        }
        /* ZAP refusals were logged with their reason by the handler. */
        uint64_t left_out;
        if (event == ZMQ_EVENT_DISCONNECTED) {
            if (closed) closed(ctx, (int)value);
        } else if (event != ZMQ_EVENT_HANDSHAKE_FAILED_AUTH &&
                   log_limit_allow(&refusal_log, &left_out)) {
            log_warn("connection refused", LOG_STR("endpoint", endpoint),
                     LOG_STR("reason", handshake_reason(event, value, endpoint)),
                     LOG_UINT("left_out", left_out));
        }
        zmq_msg_close(&address);
        zmq_msg_close(&head);
    }
}

corral_status zauth_peer_of(zmq_msg_t *msg, auth_peer *out) {
    return auth_peer_parse(zmq_msg_gets(msg, "User-Id"), out);
}
