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
 *
 * Refusals: a monitor on the socket reports handshakes that fail — corrald's ZAP handler refused
 * the connection, or a tcp endpoint wants CURVE and the client has no keys. The loop reads it
 * beside the socket, so the call waiting fails at once with a message that says what to fix.
 * libzmq goes on reconnecting (each attempt is refused again), so a later call fails the same way
 * unless corrald's configuration changed meanwhile.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "client_impl.h"
#include "corral/curve.h"

#define CLIENT_MONITOR_ENDPOINT "inproc://corral-client.handshakes"

/* The environment variable's value, or NULL when unset or empty. */
static const char *env_or_null(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* CURVE keys for a tcp endpoint from the options, else the environment: both, or neither (*use
 * false), or an error naming the one missing. */
static corral_status client_curve_keys(const corral_connect_options *o, char server[CURVE_KEY_TEXT],
                                       char secret[CURVE_KEY_TEXT], bool *use, corral_error *err) {
    *use = false;
    const char *server_text = o->server_key, *server_file = o->server_key_file;
    if (!server_text && !server_file) {
        server_text = env_or_null("CORRAL_SERVER_KEY");
        if (!server_text) server_file = env_or_null("CORRAL_SERVER_KEY_FILE");
    }
    const char *client_file =
        o->client_key_file ? o->client_key_file : env_or_null("CORRAL_CLIENT_KEY_FILE");
    if (!server_text && !server_file && !client_file) return CORRAL_OK;
    if (!client_file)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "CURVE needs this client's secret key as well as corrald's public "
                                "key: set CORRAL_CLIENT_KEY_FILE (or --client-key-file) to the "
                                "NAME.key file `corral keygen` wrote");
    if (!server_text && !server_file)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "CURVE needs corrald's public key as well as this client's secret "
                                "key: set CORRAL_SERVER_KEY (or CORRAL_SERVER_KEY_FILE, "
                                "--server-key) to the key of corrald's NAME.pub");
    if (server_text) {
        if (!curve_key_valid(server_text))
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "the server key is not a CURVE public key (40 characters of "
                                    "z85, as in the NAME.pub file `corral keygen` writes)");
        memcpy(server, server_text, CURVE_KEY_TEXT);
    } else {
        corral_status st = curve_key_read(server_file, CURVE_KEY_PUBLIC, server, err);
        if (st != CORRAL_OK) return st;
    }
    corral_status st = curve_key_read(client_file, CURVE_KEY_SECRET, secret, err);
    if (st != CORRAL_OK) return st;
    *use = true;
    return CORRAL_OK;
}

/* Make the connection a CURVE client with these keys. */
static corral_status client_set_curve(corral_client *c, const char *server, const char *secret,
                                      corral_error *err) {
    char public_key[CURVE_KEY_TEXT];
    if (!zmq_has("curve"))
        return corral_error_set(err, CORRAL_UNSUPPORTED,
                                "this libzmq has no CURVE support (it must be built with "
                                "libsodium)");
    if (zmq_curve_public(public_key, secret) != 0 ||
        zmq_setsockopt(c->dealer, ZMQ_CURVE_SERVERKEY, server, CURVE_KEY_TEXT - 1) != 0 ||
        zmq_setsockopt(c->dealer, ZMQ_CURVE_PUBLICKEY, public_key, CURVE_KEY_TEXT - 1) != 0 ||
        zmq_setsockopt(c->dealer, ZMQ_CURVE_SECRETKEY, secret, CURVE_KEY_TEXT - 1) != 0)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "cannot use the CURVE keys: %s",
                                zmq_strerror(zmq_errno()));
    c->curve = true;
    return CORRAL_OK;
}

corral_client *corral_client_new(const char *endpoint, corral_error *err) {
    const corral_connect_options o = {.endpoint = endpoint};
    return corral_client_new_with(&o, err);
}

corral_client *corral_client_new_with(const corral_connect_options *o, corral_error *err) {
    const char *endpoint = o->endpoint;
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
        zmq_setsockopt(c->dealer, ZMQ_IPV6, &ipv6, sizeof ipv6) != 0) {
        corral_error_set(err, CORRAL_INTERNAL, "zmq_socket: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    /* CURVE on tcp only: corrald knows ipc clients by their user. */
    if (strncmp(c->endpoint, "tcp://", 6) == 0) {
        char server[CURVE_KEY_TEXT], secret[CURVE_KEY_TEXT];
        bool use;
        corral_status st = client_curve_keys(o, server, secret, &use, err);
        if (st == CORRAL_OK && use) st = client_set_curve(c, server, secret, err);
        memset(secret, 0, sizeof secret);
        if (st != CORRAL_OK) goto fail;
    }
    const int events = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                       ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_CONNECTED |
                       ZMQ_EVENT_CONNECT_RETRIED;
    if (zmq_socket_monitor(c->dealer, CLIENT_MONITOR_ENDPOINT, events) != 0 ||
        !(c->monitor = zmq_socket(c->zctx, ZMQ_PAIR)) ||
        zmq_setsockopt(c->monitor, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_connect(c->monitor, CLIENT_MONITOR_ENDPOINT) != 0) {
        corral_error_set(err, CORRAL_INTERNAL, "cannot monitor the connection: %s",
                         zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (zmq_connect(c->dealer, c->endpoint) != 0) {
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
    if (c->monitor) {
        zmq_socket_monitor(c->dealer, NULL, 0);
        zmq_close(c->monitor);
    }
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

/* Read one event of the monitor: a failed handshake becomes the caller's error (PERMISSION_DENIED
 * saying what to fix), CORRAL_OK for an event that is not one. */
static corral_status client_read_refusal(corral_client *c, corral_error *err) {
    zmq_msg_t head, address;
    zmq_msg_init(&head);
    zmq_msg_init(&address);
    uint16_t event = 0;
    uint32_t value = 0;
    if (zmq_msg_recv(&head, c->monitor, ZMQ_DONTWAIT) >= 0) {
        if (zmq_msg_size(&head) >= 6) {
            memcpy(&event, zmq_msg_data(&head), 2);
            memcpy(&value, (char *)zmq_msg_data(&head) + 2, 4);
        }
        if (zmq_msg_more(&head)) zmq_msg_recv(&address, c->monitor, 0);
    }
    zmq_msg_close(&address);
    zmq_msg_close(&head);
    if (event == ZMQ_EVENT_CONNECTED) {
        c->connected = true; /* a daemon is there */
        return CORRAL_OK;
    }
    if (event == ZMQ_EVENT_CONNECT_RETRIED) {
        c->connect_refused = true; /* an attempt failed: nothing accepted it (yet) */
        return CORRAL_OK;
    }
    const bool tcp = strncmp(c->endpoint, "tcp://", 6) == 0;
    c->refused_final =
        event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH || event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL;
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
        if (c->curve)
            return corral_error_set(err, CORRAL_PERMISSION_DENIED,
                                    "corrald at %s refused this client's CURVE key: no app lists "
                                    "its public key in curve_keys",
                                    c->endpoint);
        return corral_error_set(err, CORRAL_PERMISSION_DENIED,
                                "corrald at %s refused this connection: no app lists this user "
                                "(uid %u, gid %u) in its uids or gids, and it is not corrald's "
                                "owner",
                                c->endpoint, (unsigned)getuid(), (unsigned)getgid());
    }
    if (event != ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
        event != ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        return CORRAL_OK;
    /* corrald serves tcp with CURVE only: a client without keys is refused there, whichever side
     * notices the mechanisms differ first (the other sees the connection drop). */
    if (tcp && !c->curve)
        return corral_error_set(err, CORRAL_PERMISSION_DENIED,
                                "corrald at %s refused the connection: tcp needs CURVE keys (set "
                                "CORRAL_SERVER_KEY and CORRAL_CLIENT_KEY_FILE, or --server-key and "
                                "--client-key-file; see SECURITY.md)",
                                c->endpoint);
    /* A connection lost in the handshake (corrald restarting) is retried by libzmq. */
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) return CORRAL_OK;
    if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
        return corral_error_set(err, CORRAL_PERMISSION_DENIED,
                                "corrald at %s refused the connection: it does not use CURVE there",
                                c->endpoint);
    return corral_error_set(err, c->curve ? CORRAL_PERMISSION_DENIED : CORRAL_PROTOCOL,
                            "the handshake with corrald at %s failed%s", c->endpoint,
                            c->curve ? " (is the server key corrald's public key?)" : "");
}

/* The connection's refusal, if corrald refused it: the monitor's events are read first (without
 * waiting). A refused handshake (ZMQ_EVENT_HANDSHAKE_FAILED_AUTH or _PROTOCOL) is final: libzmq
 * drops the connection for good, so every later call fails the same way at once instead of
 * waiting on a socket that will never send. CORRAL_OK when nothing was refused. */
static corral_status client_check_refused(corral_client *c, corral_error *err) {
    for (;;) {
        if (c->refused != CORRAL_OK)
            return corral_error_set(err, c->refused, "%s", c->refused_message);
        zmq_pollitem_t item = {.socket = c->monitor, .events = ZMQ_POLLIN};
        if (zmq_poll(&item, 1, 0) <= 0) return CORRAL_OK;
        corral_error why;
        const corral_status st = client_read_refusal(c, &why);
        if (st == CORRAL_OK) continue;
        if (!c->refused_final) {
            /* Not final (a tcp client without keys whose connection dropped first): this call
             * fails; libzmq retries, and the retry's refusal is final. */
            return corral_error_set(err, st, "%s", why.message);
        }
        c->refused = st;
        snprintf(c->refused_message, sizeof c->refused_message, "%s", why.message);
    }
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
    corral_status st = client_check_refused(c, err);
    /* Never blocks for good: a full queue, or no connection to queue on (a refused one is gone),
     * waits for room or a refusal, at most CORRAL_SILENCE_LIMIT_MS. */
    const int64_t until = client__now_ms() + CORRAL_SILENCE_LIMIT_MS;
    while (st == CORRAL_OK && zmq_msg_send(&msg, c->dealer, ZMQ_DONTWAIT) < 0) {
        const int e = zmq_errno();
        const int64_t left = until - client__now_ms();
        if (e == EINTR) continue;
        if (e != EAGAIN || left <= 0) {
            st = corral_error_set(err, CORRAL_UNAVAILABLE,
                                  e == EAGAIN ? "cannot send to corrald at %s: %s (is it running?)"
                                              : "send to corrald at %s failed: %s",
                                  c->endpoint,
                                  e == EAGAIN ? "too many messages are waiting" : zmq_strerror(e));
            break;
        }
        zmq_pollitem_t items[2] = {{.socket = c->dealer, .events = ZMQ_POLLOUT},
                                   {.socket = c->monitor, .events = ZMQ_POLLIN}};
        if (zmq_poll(items, 2, (long)left) > 0 && (items[1].revents & ZMQ_POLLIN))
            st = client_check_refused(c, err);
    }
    if (st != CORRAL_OK) {
        zmq_msg_close(&msg);
        return st;
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

void client__progress_from(const Corral__V1__Progress *p, corral_progress_info *out) {
    memset(out, 0, sizeof *out);
    /* A phase from a newer daemon that this library does not know reads as unspecified. */
    out->phase = p->phase <= CORRAL__V1__PROGRESS_PHASE__PROGRESS_PHASE_QUANTIZING
                     ? (corral_progress_phase)p->phase
                     : CORRAL_PHASE_UNSPECIFIED;
    out->done = p->done;
    out->total = p->total;
    /* A daemon from before phases sends prefill's two fields only. */
    if (p->phase == CORRAL__V1__PROGRESS_PHASE__PROGRESS_PHASE_UNSPECIFIED &&
        (p->prefilled_tokens || p->total_tokens)) {
        out->phase = CORRAL_PHASE_PREFILL;
        out->done = p->prefilled_tokens;
        out->total = p->total_tokens;
    }
    snprintf(out->model, sizeof out->model, "%s", p->model ? p->model : "");
}

/* Hand one Response to whoever waits for it; drop it when nobody does. */
static void client_dispatch(corral_client *c, Corral__V1__Response *resp, size_t wire_size) {
    /* id 0 answers a message the daemon could not decode; only a plain call can be waiting for
     * such an answer (generations are sent the same way, but their queue is matched by id). */
    if (c->awaited_id && !c->awaited_reply && resp->id == c->awaited_id &&
        resp->body_case == CORRAL__V1__RESPONSE__BODY_PROGRESS) {
        /* A Load or Pin that asked for progress: reports come before the reply. */
        if (c->awaited_progress) {
            corral_progress_info info;
            client__progress_from(resp->progress, &info);
            c->awaited_progress(&info, c->awaited_progress_user);
        }
        corral__v1__response__free_unpacked(resp, NULL);
        return;
    }
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

/* The call's error when no daemon accepted the connection in time (the CLI's words). */
static corral_status client_not_running(const corral_client *c, corral_error *err) {
    return corral_error_set(err, CORRAL_UNAVAILABLE,
                            "no answer from corrald at %s (is it running? start it with `make run` "
                            "or corrald -c FILE): nothing accepted a connection within %d ms",
                            c->endpoint, CORRAL_CONNECT_TIMEOUT_MS);
}

corral_status client__pump(corral_client *c, int64_t deadline_ms, corral_error *err) {
    if (c->refused != CORRAL_OK) return corral_error_set(err, c->refused, "%s", c->refused_message);
    if (!c->connect_since_ms) c->connect_since_ms = client__now_ms();
    for (;;) {
        int64_t now = client__now_ms();
        if (!c->connected) {
            /* The monitor may have news the last poll did not wait for. */
            corral_status st = client_check_refused(c, err);
            if (st != CORRAL_OK) return st;
            if (!c->connected && c->connect_refused &&
                now - c->connect_since_ms >= CORRAL_CONNECT_TIMEOUT_MS)
                return client_not_running(c, err);
        }
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
        /* Wake at the connect deadline (after it, a failed attempt's event wakes the poll). */
        const int64_t connect_by = c->connect_since_ms + CORRAL_CONNECT_TIMEOUT_MS;
        if (!c->connected && connect_by > now && connect_by - now < wait) wait = connect_by - now;
        if (wait < 0) wait = 0;
        zmq_pollitem_t items[2] = {{.socket = c->dealer, .events = ZMQ_POLLIN},
                                   {.socket = c->monitor, .events = ZMQ_POLLIN}};
        int rc = zmq_poll(items, 2, (long)wait);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            return corral_error_set(err, CORRAL_INTERNAL, "zmq_poll: %s",
                                    zmq_strerror(zmq_errno()));
        }
        if (items[1].revents & ZMQ_POLLIN) {
            corral_status st = client_check_refused(c, err);
            if (st != CORRAL_OK) return st;
        }
        if (!(items[0].revents & ZMQ_POLLIN)) {
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
        pong->pid = resp->pong->pid;
        snprintf(pong->config_path, sizeof pong->config_path, "%s",
                 resp->pong->config_path ? resp->pong->config_path : "");
    }
    corral__v1__response__free_unpacked(resp, NULL);
    return CORRAL_OK;
}
