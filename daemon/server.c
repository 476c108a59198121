/*
 * server.c — the I/O loop: ROUTER socket, requests in flight, delivery of the scheduler's answers.
 *
 * Framing: a DEALER client sends one frame (the serialized Request); the ROUTER socket hands us
 * [peer identity][payload]. Every answer goes back as [peer identity][serialized Response]. A
 * message that is not a valid Request gets an Error(PROTOCOL) with id 0, and the loop goes on:
 * nothing a client sends can stop the server.
 *
 * Requests in flight: every request handed to the scheduler has an `inflight` entry holding the
 * job, the messages that could not be sent yet, and since when its client has not been reading.
 * Sends never block: with ZMQ_ROUTER_MANDATORY and ZMQ_DONTWAIT a full pipe gives EAGAIN (the
 * entry keeps the message and marks the job paused, so the scheduler computes nothing more for
 * it) and a vanished peer gives EHOSTUNREACH (the job is cancelled). Pending messages are retried
 * every few milliseconds; a stream paused longer than limits.stall_timeout_ms is cancelled. A
 * client whose last message is older than limits.peer_timeout_ms has its requests cancelled.
 */
#include "server.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "corral.pb-c.h"
#include "corral/endpoint.h"
#include "corral/log.h"
#include "corral/version.h"
#include "job.h"
#include "scheduler.h"

enum { SERVER_MAX_ENDPOINTS = 64, SERVER_SNDHWM = 256, SHUTDOWN_GRACE_MS = 1500 };

typedef struct inflight {
    job *j;
    outmsg *pending_head, *pending_tail; /* not yet accepted by ZeroMQ, in order */
    int64_t paused_since_us;             /* 0 when the client reads */
    bool dead;                           /* the client is gone: drop its messages */
    struct inflight *next;
} inflight;

typedef struct peer {
    uint8_t id[256];
    size_t len;
    int64_t last_seen_us;
    struct peer *next;
} peer;

struct server {
    const cfg *config; /* the first configuration; owned by the scheduler */
    char *config_path; /* for SIGHUP */
    void *zctx;
    void *router;
    char *endpoints[SERVER_MAX_ENDPOINTS];
    size_t n_endpoints;
    int64_t started_ms;
    int event_fd;
    sched *sched;
    inflight *inflight;
    peer *peers;
    bool stopping;
};

static int64_t mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- setup ------------------------------------------------------------------------------------
 */

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

server *server_new(cfg *c, corral_error *err) {
    server *s = calloc(1, sizeof *s);
    if (!s) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        cfg_destroy(&c);
        return NULL;
    }
    s->config = c;
    s->event_fd = -1;
    s->started_ms = mono_us() / 1000;
    if (c->source_path && !(s->config_path = strdup(c->source_path))) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        cfg_destroy(&c);
        goto fail;
    }
    s->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->event_fd < 0) {
        corral_error_set(err, CORRAL_INTERNAL, "eventfd: %s", strerror(errno));
        cfg_destroy(&c);
        goto fail;
    }
    /* The scheduler owns the configuration from here on (it keeps it alive until the end). */
    s->sched = sched_new(c, s->event_fd, err);
    if (!s->sched) goto fail;
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
    int one = 1, linger = 0, hwm = SERVER_SNDHWM, heartbeat = 5000;
    zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
    /* Unroutable replies (peer gone) and full pipes become errors instead of silent drops. */
    zmq_setsockopt(s->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(s->router, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s->router, ZMQ_SNDHWM, &hwm, sizeof hwm);
    /* Transport heartbeats close dead connections, so their peers become unroutable. */
    zmq_setsockopt(s->router, ZMQ_HEARTBEAT_IVL, &heartbeat, sizeof heartbeat);
    heartbeat *= 3;
    zmq_setsockopt(s->router, ZMQ_HEARTBEAT_TIMEOUT, &heartbeat, sizeof heartbeat);

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

/* ---- sending ----------------------------------------------------------------------------------
 */

/* Send one packed Response to a peer without blocking: 0, or the zmq errno. */
static int send_to(server *s, const uint8_t *peer_id, size_t peer_len, const uint8_t *data,
                   size_t len) {
    if (zmq_send(s->router, peer_id, peer_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return zmq_errno();
    /* The identity frame was accepted, so the pipe had room: the payload follows it. */
    if (zmq_send(s->router, data, len, ZMQ_DONTWAIT) < 0) return zmq_errno();
    return 0;
}

static void send_response(server *s, const uint8_t *peer_id, size_t peer_len,
                          const Corral__V1__Response *resp) {
    size_t len = corral__v1__response__get_packed_size(resp);
    uint8_t stack_buf[1024];
    uint8_t *buf = len <= sizeof stack_buf ? stack_buf : malloc(len);
    if (!buf) {
        log_error("cannot allocate a response", LOG_UINT("bytes", len));
        return;
    }
    corral__v1__response__pack(resp, buf);
    int rc = send_to(s, peer_id, peer_len, buf, len);
    if (rc)
        log_debug("response not delivered", LOG_STR("reason", zmq_strerror(rc)),
                  LOG_UINT("id", resp->id));
    if (buf != stack_buf) free(buf);
}

static void send_error(server *s, const uint8_t *peer_id, size_t peer_len, uint64_t id,
                       corral_status code, const char *message) {
    Corral__V1__Error error = CORRAL__V1__ERROR__INIT;
    error.code = (Corral__V1__ErrorCode)(-code);
    error.message = (char *)message;
    Corral__V1__Response resp = CORRAL__V1__RESPONSE__INIT;
    resp.id = id;
    resp.body_case = CORRAL__V1__RESPONSE__BODY_ERROR;
    resp.error = &error;
    send_response(s, peer_id, peer_len, &resp);
}

static void send_ack(server *s, const uint8_t *peer_id, size_t peer_len, uint64_t id,
                     const char *message) {
    Corral__V1__Ack ack = CORRAL__V1__ACK__INIT;
    ack.message = (char *)message;
    Corral__V1__Response resp = CORRAL__V1__RESPONSE__INIT;
    resp.id = id;
    resp.body_case = CORRAL__V1__RESPONSE__BODY_ACK;
    resp.ack = &ack;
    send_response(s, peer_id, peer_len, &resp);
}

/* ---- requests in flight -----------------------------------------------------------------------
 */

static inflight *inflight_of(server *s, const job *j) {
    for (inflight *f = s->inflight; f; f = f->next)
        if (f->j == j) return f;
    return NULL;
}

static inflight *inflight_find(server *s, const uint8_t *peer_id, size_t peer_len, uint64_t id) {
    for (inflight *f = s->inflight; f; f = f->next)
        if (f->j->id == id && f->j->peer_len == peer_len &&
            memcmp(f->j->peer, peer_id, peer_len) == 0)
            return f;
    return NULL;
}

static void inflight_remove(server *s, inflight *f) {
    for (inflight **pp = &s->inflight; *pp; pp = &(*pp)->next)
        if (*pp == f) {
            *pp = f->next;
            break;
        }
    for (outmsg *m = f->pending_head, *next; m; m = next) {
        next = m->next;
        free(m->data);
        free(m);
    }
    job_free(f->j);
    free(f);
}

static void cancel_job(server *s, inflight *f, job_cancel why) {
    int expected = JOB_CANCEL_NONE;
    atomic_compare_exchange_strong(&f->j->cancel, &expected, why);
    if (why == JOB_CANCEL_GONE || why == JOB_CANCEL_STALLED) {
        f->dead = true;
        /* Nothing more will reach this client: drop what waits and let the scheduler run. */
        for (outmsg *m = f->pending_head, *next; m; m = next) {
            next = m->next;
            if (m->final) {
                /* The final message was waiting: the job is over. */
                f->pending_head = f->pending_tail = NULL;
                free(m->data);
                free(m);
                for (outmsg *r = next; r; r = next) {
                    next = r->next;
                    free(r->data);
                    free(r);
                }
                inflight_remove(s, f);
                sched_poke(s->sched);
                return;
            }
            free(m->data);
            free(m);
        }
        f->pending_head = f->pending_tail = NULL;
        atomic_store(&f->j->paused, 0);
    }
    sched_poke(s->sched);
}

/* Try to send f's pending messages in order. Returns false if f was freed (its final message
 * went out). */
static bool flush_pending(server *s, inflight *f) {
    while (f->pending_head) {
        outmsg *m = f->pending_head;
        int rc = send_to(s, f->j->peer, f->j->peer_len, m->data, m->len);
        if (rc == EAGAIN) {
            if (!f->paused_since_us) f->paused_since_us = mono_us();
            atomic_store(&f->j->paused, 1);
            return true;
        }
        f->pending_head = m->next;
        if (!f->pending_head) f->pending_tail = NULL;
        const bool final = m->final;
        free(m->data);
        free(m);
        if (rc) {
            /* EHOSTUNREACH: the client is gone. */
            log_debug("client gone", LOG_UINT("id", f->j->id));
            if (final) {
                inflight_remove(s, f);
                return false;
            }
            cancel_job(s, f, JOB_CANCEL_GONE);
            return inflight_of(s, f->j) != NULL;
        }
        if (final) {
            inflight_remove(s, f);
            return false;
        }
    }
    if (f->paused_since_us) {
        f->paused_since_us = 0;
        atomic_store(&f->j->paused, 0);
        sched_poke(s->sched);
    }
    return true;
}

/* Deliver the scheduler's messages. */
static void deliver_outbox(server *s) {
    uint64_t count;
    if (read(s->event_fd, &count, sizeof count) < 0 && errno != EAGAIN)
        log_warn("eventfd read failed", LOG_STR("error", strerror(errno)));
    for (outmsg *m = sched_take_outbox(s->sched), *next; m; m = next) {
        next = m->next;
        m->next = NULL;
        inflight *f = inflight_of(s, m->job);
        if (!f) {
            /* Cannot happen: every job the scheduler answers is in flight. */
            log_error("answer for an unknown request", LOG_UINT("id", m->job->id));
            free(m->data);
            free(m);
            continue;
        }
        if (f->dead) {
            const bool final = m->final;
            free(m->data);
            free(m);
            if (final) inflight_remove(s, f);
            continue;
        }
        if (f->pending_tail)
            f->pending_tail->next = m;
        else
            f->pending_head = m;
        f->pending_tail = m;
        flush_pending(s, f);
    }
}

/* ---- liveness ---------------------------------------------------------------------------------
 */

static peer *peer_touch(server *s, const uint8_t *id, size_t len) {
    for (peer *p = s->peers; p; p = p->next)
        if (p->len == len && memcmp(p->id, id, len) == 0) {
            p->last_seen_us = mono_us();
            return p;
        }
    peer *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    memcpy(p->id, id, len);
    p->len = len;
    p->last_seen_us = mono_us();
    p->next = s->peers;
    s->peers = p;
    return p;
}

static int64_t peer_last_seen(server *s, const job *j) {
    for (peer *p = s->peers; p; p = p->next)
        if (p->len == j->peer_len && memcmp(p->id, j->peer, p->len) == 0) return p->last_seen_us;
    return 0;
}

/* Cancel the requests of silent clients and of stalled streams; retry pending sends; forget
 * peers with nothing in flight that have been quiet for a while. */
static void check_liveness(server *s) {
    const int64_t now = mono_us();
    const int64_t peer_timeout = s->config->peer_timeout_ms * 1000;
    const int64_t stall_timeout = s->config->stall_timeout_ms * 1000;
    for (inflight *f = s->inflight, *next; f; f = next) {
        next = f->next;
        if (f->dead) continue;
        if (f->pending_head && !flush_pending(s, f)) continue;
        if (f->paused_since_us && now - f->paused_since_us > stall_timeout) {
            log_info("stream stalled: client stopped reading", LOG_UINT("id", f->j->id),
                     LOG_STR("app", f->j->app));
            cancel_job(s, f, JOB_CANCEL_STALLED);
            continue;
        }
        if (now - peer_last_seen(s, f->j) > peer_timeout) {
            log_info("client silent past the liveness timeout", LOG_UINT("id", f->j->id),
                     LOG_STR("app", f->j->app));
            cancel_job(s, f, JOB_CANCEL_GONE);
        }
    }
    for (peer **pp = &s->peers; *pp;) {
        peer *p = *pp;
        bool busy = false;
        for (inflight *f = s->inflight; f && !busy; f = f->next)
            busy = f->j->peer_len == p->len && memcmp(f->j->peer, p->id, p->len) == 0;
        if (!busy && now - p->last_seen_us > peer_timeout) {
            *pp = p->next;
            free(p);
        } else {
            pp = &p->next;
        }
    }
}

/* ---- receiving --------------------------------------------------------------------------------
 */

static void handle_request(server *s, const uint8_t *peer_id, size_t peer_len, const uint8_t *data,
                           size_t len) {
    Corral__V1__Request *req = corral__v1__request__unpack(NULL, len, data);
    if (!req) {
        log_debug("undecodable request", LOG_UINT("bytes", len));
        send_error(s, peer_id, peer_len, 0, CORRAL_PROTOCOL,
                   "message is not a valid corral.v1.Request");
        return;
    }
    peer_touch(s, peer_id, peer_len);
    switch (req->body_case) {
        case CORRAL__V1__REQUEST__BODY_PING: {
            Corral__V1__Pong pong = CORRAL__V1__PONG__INIT;
            pong.version = CORRAL_VERSION;
            pong.protocol_version = CORRAL__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT;
            pong.uptime_ms = (uint64_t)(mono_us() / 1000 - s->started_ms);
            Corral__V1__Response resp = CORRAL__V1__RESPONSE__INIT;
            resp.id = req->id;
            resp.body_case = CORRAL__V1__RESPONSE__BODY_PONG;
            resp.pong = &pong;
            send_response(s, peer_id, peer_len, &resp);
            corral__v1__request__free_unpacked(req, NULL);
            return;
        }
        case CORRAL__V1__REQUEST__BODY_CANCEL: {
            inflight *f = inflight_find(s, peer_id, peer_len, req->cancel->request_id);
            if (!f || f->dead) {
                char message[128];
                snprintf(message, sizeof message, "no request %llu of this client is in flight",
                         (unsigned long long)req->cancel->request_id);
                send_error(s, peer_id, peer_len, req->id, CORRAL_NOT_FOUND, message);
            } else {
                cancel_job(s, f, JOB_CANCEL_CLIENT);
                send_ack(s, peer_id, peer_len, req->id, "cancelling");
            }
            corral__v1__request__free_unpacked(req, NULL);
            return;
        }
        case CORRAL__V1__REQUEST__BODY_GENERATE:
        case CORRAL__V1__REQUEST__BODY_TOKENIZE:
        case CORRAL__V1__REQUEST__BODY_LIST_MODELS:
        case CORRAL__V1__REQUEST__BODY_STATUS:
        case CORRAL__V1__REQUEST__BODY_LOAD:
        case CORRAL__V1__REQUEST__BODY_UNLOAD:
        case CORRAL__V1__REQUEST__BODY_PIN:
        case CORRAL__V1__REQUEST__BODY_UNPIN:
            break;
        case CORRAL__V1__REQUEST__BODY__NOT_SET:
        default:
            /* An empty body, or a body from a newer protocol this daemon does not know. */
            send_error(s, peer_id, peer_len, req->id, CORRAL_UNSUPPORTED,
                       "request has no body this daemon understands (protocol version 1)");
            corral__v1__request__free_unpacked(req, NULL);
            return;
    }
    const char *problem = NULL;
    corral_status code = CORRAL_INVALID_ARGUMENT;
    if (s->stopping) {
        problem = "corrald is shutting down";
        code = CORRAL_UNAVAILABLE;
    } else if (req->id == 0) {
        problem = "request id 0 is reserved; use ids from 1";
    } else if (strlen(req->app) >= sizeof(((job *)0)->app)) {
        problem = "app name longer than 63 bytes";
    } else if (peer_len > sizeof(((job *)0)->peer)) {
        problem = "routing identity too long";
    } else if (inflight_find(s, peer_id, peer_len, req->id)) {
        problem = "a request with this id is already in flight on this connection";
    }
    if (problem) {
        send_error(s, peer_id, peer_len, req->id, code, problem);
        corral__v1__request__free_unpacked(req, NULL);
        return;
    }
    job *j = calloc(1, sizeof *j);
    inflight *f = calloc(1, sizeof *f);
    if (!j || !f) {
        free(j);
        free(f);
        send_error(s, peer_id, peer_len, req->id, CORRAL_OUT_OF_MEMORY, "out of memory");
        corral__v1__request__free_unpacked(req, NULL);
        return;
    }
    j->id = req->id;
    memcpy(j->peer, peer_id, peer_len);
    j->peer_len = peer_len;
    snprintf(j->app, sizeof j->app, "%s", req->app);
    j->req = req;
    j->received_us = mono_us();
    if (req->body_case == CORRAL__V1__REQUEST__BODY_GENERATE && req->generate->deadline_ms)
        j->deadline_us = j->received_us + (int64_t)req->generate->deadline_ms * 1000;
    f->j = j;
    f->next = s->inflight;
    s->inflight = f;
    sched_submit(s->sched, j);
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
        send_error(s, zmq_msg_data(&identity), zmq_msg_size(&identity), 0, CORRAL_PROTOCOL,
                   "expected exactly one frame per request");
        goto done;
    }
    handle_request(s, zmq_msg_data(&identity), zmq_msg_size(&identity), zmq_msg_data(&payload),
                   zmq_msg_size(&payload));
done:
    zmq_msg_close(&payload);
    zmq_msg_close(&identity);
}

/* ---- the loop ---------------------------------------------------------------------------------
 */

static void reload_config(server *s) {
    if (!s->config_path) {
        log_warn("SIGHUP ignored: running on built-in defaults, no file to reload");
        return;
    }
    corral_error err;
    cfg *c = cfg_load_file(s->config_path, &err);
    if (!c) {
        log_error("config reload failed; keeping the running configuration",
                  LOG_STR("error", err.message));
        return;
    }
    log_info("reloading configuration", LOG_STR("config", s->config_path),
             LOG_STR("note", "listen, limits and threads apply at the next start"));
    sched_reload(s->sched, c);
}

corral_status server_run(server *s, int signal_fd, corral_error *err) {
    int64_t last_check = mono_us(), stop_deadline = 0;
    for (;;) {
        zmq_pollitem_t items[] = {
            {.socket = s->router, .events = ZMQ_POLLIN},
            {.fd = signal_fd, .events = ZMQ_POLLIN},
            {.fd = s->event_fd, .events = ZMQ_POLLIN},
        };
        bool pending = false;
        for (inflight *f = s->inflight; f && !pending; f = f->next) pending = f->pending_head;
        int rc = zmq_poll(items, 3, pending || s->stopping ? 5 : 250);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            return corral_error_set(err, CORRAL_INTERNAL, "zmq_poll: %s",
                                    zmq_strerror(zmq_errno()));
        }
        if (items[1].revents & ZMQ_POLLIN) {
            struct signalfd_siginfo info;
            if (read(signal_fd, &info, sizeof info) == (ssize_t)sizeof info) {
                if (info.ssi_signo == SIGHUP) {
                    reload_config(s);
                } else if (!s->stopping) {
                    size_t n = 0;
                    for (inflight *f = s->inflight; f; f = f->next) n++;
                    log_info("stopping", LOG_STR("signal", strsignal((int)info.ssi_signo)),
                             LOG_UINT("in_flight", n));
                    s->stopping = true;
                    stop_deadline = mono_us() + SHUTDOWN_GRACE_MS * 1000;
                    sched_shutdown(s->sched);
                }
            }
        }
        if (items[2].revents & ZMQ_POLLIN) deliver_outbox(s);
        if (items[0].revents & ZMQ_POLLIN) {
            /* Drain everything that is ready, then poll again. */
            int events = 0;
            size_t events_len = sizeof events;
            do {
                server_receive(s);
                if (zmq_getsockopt(s->router, ZMQ_EVENTS, &events, &events_len) != 0) break;
            } while (events & ZMQ_POLLIN);
        }
        const int64_t now = mono_us();
        if (pending || now - last_check > 250000) {
            check_liveness(s);
            last_check = now;
        }
        if (s->stopping) {
            deliver_outbox(s);
            if ((!s->inflight && sched_idle(s->sched)) || now > stop_deadline) return CORRAL_OK;
        }
    }
}

void server_destroy(server **ps) {
    if (!ps || !*ps) return;
    server *s = *ps;
    /* The scheduler first: it may still post messages for jobs we hold. */
    sched_destroy(&s->sched);
    while (s->inflight) inflight_remove(s, s->inflight);
    for (peer *p = s->peers, *next; p; p = next) {
        next = p->next;
        free(p);
    }
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
    if (s->event_fd >= 0) close(s->event_fd);
    free(s->config_path);
    free(s);
    *ps = NULL;
}
