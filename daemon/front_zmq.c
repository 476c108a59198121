/*
 * front_zmq.c — the ZeroMQ front end's loop (see front_zmq.h).
 *
 * Framing: a DEALER client sends one frame (a serialized Request); the ROUTER socket hands us
 * [peer identity][payload]. Every answer goes back as [peer identity][serialized Response]. A
 * message that is not a valid Request gets an Error(PROTOCOL) with id 0, and the loop goes on:
 * nothing a client sends can stop the front end. Ping and Cancel are answered here; every other
 * request becomes a job for the core (front_zmq_proto.c translates both ways).
 *
 * Requests in flight: each job has a `zreq` holding the decoded request (the job's strings point
 * into it), the client's routing identity, and what was taken from the job but not yet accepted
 * by ZeroMQ. Sends never block: with ZMQ_ROUTER_MANDATORY and ZMQ_DONTWAIT a full pipe gives
 * EAGAIN — the zreq keeps what it holds and marks the job paused, so the core computes nothing
 * more for it — and a vanished peer gives EHOSTUNREACH (the job is cancelled). Held output is
 * retried every few milliseconds; a stream paused longer than limits.stall_timeout_ms is
 * cancelled. A client whose last message is older than limits.peer_timeout_ms has its requests
 * cancelled; its connection is still there, so each gets its final message (Done CANCELLED, or
 * Error CANCELLED for one that had not started), which a client that stopped reading never sees.
 *
 * Requests belong to the connection they came through, not only to a routing identity: a client
 * may choose its own (ZMQ_ROUTING_ID), and once its connection closes another client could connect
 * under the same one and be sent the rest of the first client's output. Each request records the
 * connection's descriptor (ZMQ_SRCFD), the router's monitor reports every connection that closes,
 * and the requests of a closed connection are cancelled at once (JOB_CANCEL_GONE: their output is
 * dropped). The monitor is read before every read from the router and before every pass that
 * sends, so the close is known before a message of a connection that reuses the descriptor or
 * the routing identity is read, and before output would be routed to it.
 *
 * The core tells us of new events through the sink's notify callback, which writes to an eventfd
 * that the loop polls with the sockets.
 */
#include "front_zmq.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "corral.pb-c.h"
#include "corral/endpoint.h"
#include "corral/log.h"
#include "front_zmq_auth.h"
#include "front_zmq_proto.h"
#include "job.h"

enum { FRONT_MAX_ENDPOINTS = 64, FRONT_SNDHWM = 256, SHUTDOWN_GRACE_MS = 1500, PEER_ID_MAX = 256 };

/* The transport cap (ZMQ_MAXMSGSIZE): this many times limits.max_message_bytes, but at most the
 * limit plus FRONT_TRANSPORT_SLACK_MAX. */
#define FRONT_TRANSPORT_FACTOR    4
#define FRONT_TRANSPORT_SLACK_MAX ((uint64_t)64 << 20)

/* The id of a serialized Request without decoding the rest: its first field when that is field 1
 * (protobuf writers put fields in number order), else 0. */
static uint64_t leading_request_id(const uint8_t *data, size_t len) {
    if (len < 2 || data[0] != 0x08) return 0; /* field 1, varint */
    uint64_t id = 0;
    for (size_t i = 1; i < len && i <= 10; i++) {
        id |= (uint64_t)(data[i] & 0x7f) << (7 * (i - 1));
        if (!(data[i] & 0x80)) return id;
    }
    return 0;
}

/* One request in flight: the front end's side of a job. */
typedef struct zreq {
    job *j;
    Corral__V1__Request *wire; /* the decoded request; the job's strings point into it */
    void *extra;               /* arrays of the core request beyond the decoded message */
    uint8_t peer[PEER_ID_MAX]; /* the client's routing identity */
    size_t peer_len;
    int conn_fd; /* the descriptor of the connection the request came through, or -1 */
    uint64_t id; /* the client's request id */
    bool stream;
    /* Taken from the job, not yet accepted by ZeroMQ (sent in this order). */
    uint32_t n_progress, progress_sent; /* reports taken; of those, sent */
    job_progress progress[JOB_PROGRESS_MAX];
    job_text text;
    bool final_seen;         /* the job's final event was taken */
    uint32_t chunk_index;    /* the next Chunk's index */
    int64_t paused_since_us; /* 0 while the client reads */
    bool dead;               /* the client is gone: drop its output */
    struct zreq *next;
} zreq;

typedef struct peer {
    uint8_t id[PEER_ID_MAX];
    size_t len;
    int64_t last_seen_us;
    struct peer *next;
} peer;

struct front_zmq {
    core *core;
    const cfg *config; /* limits, endpoints: the configuration the core started with */
    core_sink *sink;
    void *zctx;
    void *router;
    zauth *auth; /* the ZAP handler and the handshake monitor */
    char *endpoints[FRONT_MAX_ENDPOINTS];
    size_t n_endpoints;
    int event_fd;
    zproto_buf buf; /* packing buffer, reused */
    zreq *inflight;
    peer *peers;
    bool stopping;
    char config_path[PATH_MAX]; /* the config file, absolute, for Pong ("" on defaults) */
};

static int64_t mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The sink's notify: runs on the core's threads, so it only writes the eventfd. */
static void notify_event_fd(void *ctx) {
    const front_zmq *f = ctx;
    const uint64_t one = 1;
    if (write(f->event_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        log_warn("cannot wake the ZeroMQ front end", LOG_STR("error", strerror(errno)));
}

/* ---- setup ----------------------------------------------------------------------------------- */

static corral_status front_bind(front_zmq *f, const char *endpoint, corral_error *err) {
    if (f->n_endpoints == FRONT_MAX_ENDPOINTS)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "more than %d endpoints",
                                FRONT_MAX_ENDPOINTS);
    corral_status st = endpoint_prepare_bind(endpoint, err);
    if (st != CORRAL_OK) return st;
    /* ZeroMQ takes the host of a bind as an interface name, and "localhost" is none: bind the
     * address it stands for. */
    char address[ENDPOINT_MAX];
    if (strncmp(endpoint, "tcp://localhost:", 16) == 0)
        snprintf(address, sizeof address, "tcp://127.0.0.1:%s", endpoint + 16);
    else
        snprintf(address, sizeof address, "%s", endpoint);
    if (zmq_bind(f->router, address) != 0)
        return corral_error_set(err, CORRAL_IO, "cannot bind %s: %s", endpoint,
                                zmq_strerror(zmq_errno()));
    /* Connecting to a Unix socket takes write permission on it. Who may reach it is the
     * directory's mode (endpoint_prepare_bind: ours, writable by nobody else; 0700 unless the
     * operator lets others in), and who may use it is the ZAP handler's decision. */
    if (strncmp(endpoint, "ipc://", 6) == 0 && chmod(endpoint + 6, 0666) != 0)
        log_warn("cannot make the socket connectable by other users", LOG_STR("endpoint", endpoint),
                 LOG_STR("error", strerror(errno)));
    f->endpoints[f->n_endpoints] = strdup(endpoint);
    if (!f->endpoints[f->n_endpoints])
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    f->n_endpoints++;
    return CORRAL_OK;
}

front_zmq *front_zmq_new(const cfg *c, corral_error *err) {
    front_zmq *f = calloc(1, sizeof *f);
    if (!f) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    f->config = c;
    /* Absolute, so that a client (`corral add`) can tell whether this is the file it edits. */
    if (c->source_path && !realpath(c->source_path, f->config_path))
        snprintf(f->config_path, sizeof f->config_path, "%s", c->source_path);
    f->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (f->event_fd < 0) {
        corral_error_set(err, CORRAL_INTERNAL, "eventfd: %s", strerror(errno));
        goto fail;
    }
    if (!(f->sink = core_sink_new(notify_event_fd, f, err))) goto fail;
    f->zctx = zmq_ctx_new();
    if (!f->zctx) {
        corral_error_set(err, CORRAL_INTERNAL, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    f->router = zmq_socket(f->zctx, ZMQ_ROUTER);
    if (!f->router) {
        corral_error_set(err, CORRAL_INTERNAL, "zmq_socket: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    /* A message over limits.max_message_bytes is read and refused with an Error for its request
     * (handle_request); ZeroMQ drops the connection only above the transport cap, which bounds
     * the memory one message can take while it arrives. Dropping at the limit itself lost every
     * other request of that connection without a word. */
    const uint64_t cap = c->max_message_bytes * FRONT_TRANSPORT_FACTOR;
    int64_t max_msg = (int64_t)(cap < c->max_message_bytes + FRONT_TRANSPORT_SLACK_MAX
                                    ? cap
                                    : c->max_message_bytes + FRONT_TRANSPORT_SLACK_MAX);
    int one = 1, linger = 0, hwm = FRONT_SNDHWM, heartbeat = 5000;
    /* IPv4 and IPv6 endpoints (tcp://[::1]:PORT) on one socket. */
    zmq_setsockopt(f->router, ZMQ_IPV6, &one, sizeof one);
    zmq_setsockopt(f->router, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
    /* Unroutable replies (peer gone) and full pipes become errors instead of silent drops. */
    zmq_setsockopt(f->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(f->router, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(f->router, ZMQ_SNDHWM, &hwm, sizeof hwm);
    /* Transport heartbeats close dead connections, so their peers become unroutable. */
    zmq_setsockopt(f->router, ZMQ_HEARTBEAT_IVL, &heartbeat, sizeof heartbeat);
    heartbeat *= 3;
    zmq_setsockopt(f->router, ZMQ_HEARTBEAT_TIMEOUT, &heartbeat, sizeof heartbeat);

    /* Every connection is authenticated (front_zmq_auth.h): the ZAP handler is bound before the
     * first listener, ipc listeners come first, then the socket turns CURVE server for tcp. */
    if (!(f->auth = zauth_new(f->zctx, f->router, err))) goto fail;
    if (zauth_prepare_ipc(f->router, err) != CORRAL_OK) goto fail;
    if (c->n_listen == 0) {
        char endpoint[ENDPOINT_MAX];
        if (endpoint_default(endpoint, sizeof endpoint, err) != CORRAL_OK) goto fail;
        if (front_bind(f, endpoint, err) != CORRAL_OK) goto fail;
    }
    for (size_t i = 0; i < c->n_listen; i++)
        if (strncmp(c->listen[i], "tcp://", 6) != 0 &&
            front_bind(f, c->listen[i], err) != CORRAL_OK)
            goto fail;
    bool curve = false;
    for (size_t i = 0; i < c->n_listen; i++) {
        if (strncmp(c->listen[i], "tcp://", 6) != 0) continue;
        if (!curve && zauth_prepare_tcp(f->router, c, c->listen[i], err) != CORRAL_OK) goto fail;
        curve = true;
        if (front_bind(f, c->listen[i], err) != CORRAL_OK) goto fail;
    }
    return f;
fail:
    front_zmq_destroy(&f);
    return NULL;
}

corral_status front_zmq_check(const cfg *c, corral_error *err) {
    front_zmq *f = front_zmq_new(c, err);
    if (!f) return err->status;
    front_zmq_destroy(&f);
    return CORRAL_OK;
}

size_t front_zmq_endpoint_count(const front_zmq *f) {
    return f->n_endpoints;
}

const char *front_zmq_endpoint(const front_zmq *f, size_t i) {
    return i < f->n_endpoints ? f->endpoints[i] : NULL;
}

/* ---- sending --------------------------------------------------------------------------------- */

/* Send one packed Response (in f->buf) to a peer without blocking: 0, or the zmq errno. */
static int send_to(front_zmq *f, const uint8_t *peer_id, size_t peer_len, size_t len) {
    if (len == 0) return ENOMEM;
    if (zmq_send(f->router, peer_id, peer_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return zmq_errno();
    /* The identity frame was accepted, so the pipe had room: the payload follows it. */
    if (zmq_send(f->router, f->buf.data, len, ZMQ_DONTWAIT) < 0) return zmq_errno();
    return 0;
}

/* A reply that is not part of a job (ping, cancel, refusals): best effort. */
static void send_direct(front_zmq *f, const uint8_t *peer_id, size_t peer_len, size_t len,
                        uint64_t id) {
    const int rc = send_to(f, peer_id, peer_len, len);
    if (rc)
        log_debug("response not delivered", LOG_STR("reason", zmq_strerror(rc)),
                  LOG_UINT("id", id));
}

/* A request the front end refuses itself (undecodable, not UTF-8, not allowed, ...): logged at
 * warn with its reason, as the core logs the requests it fails (job.c). */
static void send_error(front_zmq *f, const uint8_t *peer_id, size_t peer_len, uint64_t id,
                       corral_status code, const char *message) {
    log_warn("request failed", LOG_UINT("id", id), LOG_STR("code", corral_status_name(code)),
             LOG_STR("reason", message));
    send_direct(f, peer_id, peer_len, zproto_pack_error(&f->buf, id, code, message), id);
}

/* ---- requests in flight ---------------------------------------------------------------------- */

/* The job's `front` destructor: the decoded request and the zreq itself. */
static void zreq_free(void *p) {
    zreq *q = p;
    if (q->wire) corral__v1__request__free_unpacked(q->wire, NULL);
    free(q->extra);
    job_text_free(&q->text);
    free(q);
}

static zreq *inflight_find(front_zmq *f, const uint8_t *peer_id, size_t peer_len, uint64_t id) {
    for (zreq *q = f->inflight; q; q = q->next)
        if (q->id == id && q->peer_len == peer_len && memcmp(q->peer, peer_id, peer_len) == 0)
            return q;
    return NULL;
}

/* Unlink q and free its job (which frees q). Only once the job's final event was taken, or if
 * it was never submitted. */
static void inflight_remove(front_zmq *f, zreq *q) {
    for (zreq **pp = &f->inflight; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    job *j = q->j;
    job_free(&j);
}

static void cancel_job(front_zmq *f, zreq *q, job_cancel why) {
    int expected = JOB_CANCEL_NONE;
    atomic_compare_exchange_strong(&q->j->cancel, &expected, why);
    if (why == JOB_CANCEL_GONE || why == JOB_CANCEL_STALLED) {
        /* Nothing more will reach this client: drop what is held and let the core run it to its
         * end (the final event then frees it). */
        q->dead = true;
        q->n_progress = q->progress_sent = 0;
        job_text_clear(&q->text);
        atomic_store(&q->j->paused, 0);
    }
    core_poke(f->core);
}

/* The packed final Response of q's job. */
static size_t pack_final(front_zmq *f, const zreq *q) {
    const job *j = q->j;
    switch (j->final) {
        case JOB_FINAL_DONE:
            return zproto_pack_done(&f->buf, q->id, &j->done);
        case JOB_FINAL_ERROR:
            return zproto_pack_error(&f->buf, q->id, j->error_code, j->error_message);
        case JOB_FINAL_REPLY:
            return zproto_pack_reply(&f->buf, q->id, j->reply);
        case JOB_FINAL_NONE:
            break;
    }
    return 0;
}

/* The model q's request names, for its Progress messages. */
static const char *zreq_model(const zreq *q) {
    const core_request *r = &q->j->req;
    switch (r->kind) {
        case CORE_GENERATE:
            return r->generate.model;
        case CORE_LOAD:
        case CORE_PIN:
            return r->target.model;
        default:
            return "";
    }
}

/* Send what q holds, in order (progress, text, the final event), taking more from the job as it
 * goes. Returns false when q was freed (its final event went out, or its client is gone). On
 * EAGAIN it keeps what is left and marks the job paused. */
static bool zreq_flush(front_zmq *f, zreq *q) {
    for (;;) {
        if (q->dead) {
            /* Take and drop everything until the final event. */
            job_taken t;
            job_take(q->j, true, &q->text, &t);
            job_text_clear(&q->text);
            if (t.final == JOB_FINAL_NONE) return true;
            inflight_remove(f, q);
            return false;
        }
        int rc = 0;
        while (rc == 0 && q->progress_sent < q->n_progress) {
            rc = send_to(f, q->peer, q->peer_len,
                         zproto_pack_progress(&f->buf, q->id, &q->progress[q->progress_sent],
                                              zreq_model(q)));
            if (rc == 0) q->progress_sent++;
        }
        if (rc == 0) q->n_progress = q->progress_sent = 0;
        /* A streamed job sends its text as it comes; a whole one sends one Chunk (even empty)
         * before its Done. */
        const bool send_text =
            q->stream ? (q->text.len || q->text.n_ids)
                      : q->final_seen && q->j->final == JOB_FINAL_DONE && q->chunk_index == 0;
        if (rc == 0 && send_text) {
            rc = send_to(f, q->peer, q->peer_len,
                         zproto_pack_chunk(&f->buf, q->id, &q->text, q->chunk_index));
            if (rc == 0) {
                q->chunk_index++;
                job_text_clear(&q->text);
            }
        }
        if (rc == 0 && q->final_seen) {
            rc = send_to(f, q->peer, q->peer_len, pack_final(f, q));
            if (rc != EAGAIN) {
                if (rc)
                    log_debug("final response not delivered", LOG_UINT("id", q->id),
                              LOG_STR("reason", zmq_strerror(rc)));
                inflight_remove(f, q);
                return false;
            }
        }
        if (rc == EAGAIN) {
            if (!q->paused_since_us) q->paused_since_us = mono_us();
            atomic_store(&q->j->paused, 1);
            return true;
        }
        if (rc) {
            /* EHOSTUNREACH: the client is gone. */
            log_debug("client gone", LOG_UINT("id", q->id), LOG_STR("reason", zmq_strerror(rc)));
            cancel_job(f, q, JOB_CANCEL_GONE);
            continue;
        }
        if (q->paused_since_us) {
            q->paused_since_us = 0;
            atomic_store(&q->j->paused, 0);
            core_poke(f->core);
        }
        if (q->final_seen) continue; /* cannot happen: sent above */
        /* Everything held went out: take what came since. */
        job_taken t;
        job_take(q->j, q->stream, &q->text, &t);
        if (t.n_progress) {
            q->n_progress = t.n_progress;
            q->progress_sent = 0;
            memcpy(q->progress, t.progress, t.n_progress * sizeof *t.progress);
        }
        if (t.final != JOB_FINAL_NONE) {
            /* A whole reply's text is taken once it is final. (No progress comes after the
             * final event, so the reports taken above are all there are: a load that ended as
             * it was looked at still shows its phases.) */
            if (!q->stream) job_take(q->j, true, &q->text, &t);
            q->final_seen = true;
        }
        if (!q->final_seen && !q->n_progress && !q->text.len && !q->text.n_ids) return true;
    }
}

/* The monitor's report of a closed connection: its requests can reach no one any more (and must
 * not reach a client that takes over its routing identity). */
static void connection_closed(void *ctx, int fd) {
    front_zmq *f = ctx;
    for (zreq *q = f->inflight; q; q = q->next) {
        if (q->conn_fd != fd || q->dead) continue;
        log_debug("client disconnected", LOG_UINT("id", q->id), LOG_STR("app", q->j->app));
        cancel_job(f, q, JOB_CANCEL_GONE);
    }
}

/* Take in what the monitor reported (closed connections above all): before reading from the
 * router and before sending on it. */
static void read_monitor(front_zmq *f) {
    zauth_read_monitor(f->auth, connection_closed, f);
}

/* Deliver the events of the jobs the core queued. */
static void deliver_events(front_zmq *f) {
    uint64_t count;
    if (read(f->event_fd, &count, sizeof count) < 0 && errno != EAGAIN)
        log_warn("eventfd read failed", LOG_STR("error", strerror(errno)));
    read_monitor(f);
    job *ready[64];
    size_t n;
    do {
        n = core_sink_take_ready(f->sink, ready, sizeof ready / sizeof ready[0]);
        for (size_t i = 0; i < n; i++) {
            zreq *q = ready[i]->front;
            /* A paused zreq holds output the client has not taken: the retry loop sends it. */
            if (!q->paused_since_us || q->dead) zreq_flush(f, q);
        }
    } while (n == sizeof ready / sizeof ready[0]);
}

/* ---- liveness -------------------------------------------------------------------------------- */

static peer *peer_touch(front_zmq *f, const uint8_t *id, size_t len) {
    for (peer *p = f->peers; p; p = p->next)
        if (p->len == len && memcmp(p->id, id, len) == 0) {
            p->last_seen_us = mono_us();
            return p;
        }
    peer *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    memcpy(p->id, id, len);
    p->len = len;
    p->last_seen_us = mono_us();
    p->next = f->peers;
    f->peers = p;
    return p;
}

static int64_t peer_last_seen(front_zmq *f, const zreq *q) {
    for (peer *p = f->peers; p; p = p->next)
        if (p->len == q->peer_len && memcmp(p->id, q->peer, p->len) == 0) return p->last_seen_us;
    return 0;
}

/* Cancel the requests of silent clients and of stalled streams; retry held output; forget peers
 * with nothing in flight that have been quiet for a while. */
static void check_liveness(front_zmq *f) {
    const int64_t now = mono_us();
    const int64_t peer_timeout = f->config->peer_timeout_ms * 1000;
    const int64_t stall_timeout = f->config->stall_timeout_ms * 1000;
    read_monitor(f);
    for (zreq *q = f->inflight, *next; q; q = next) {
        next = q->next;
        if (q->dead) continue;
        if (q->paused_since_us && !zreq_flush(f, q)) continue;
        if (q->paused_since_us && now - q->paused_since_us > stall_timeout) {
            log_info("stream stalled: client stopped reading", LOG_UINT("id", q->id),
                     LOG_STR("app", q->j->app));
            cancel_job(f, q, JOB_CANCEL_STALLED);
            continue;
        }
        /* Once: a silent client's request stays here until its final event is sent. */
        if (now - peer_last_seen(f, q) > peer_timeout &&
            atomic_load(&q->j->cancel) == JOB_CANCEL_NONE) {
            log_info("client silent past the liveness timeout", LOG_UINT("id", q->id),
                     LOG_STR("app", q->j->app));
            cancel_job(f, q, JOB_CANCEL_SILENT);
        }
    }
    for (peer **pp = &f->peers; *pp;) {
        peer *p = *pp;
        bool busy = false;
        for (zreq *q = f->inflight; q && !busy; q = q->next)
            busy = q->peer_len == p->len && memcmp(q->peer, p->id, p->len) == 0;
        if (!busy && now - p->last_seen_us > peer_timeout) {
            *pp = p->next;
            free(p);
        } else {
            pp = &p->next;
        }
    }
}

/* ---- receiving ------------------------------------------------------------------------------- */

static void handle_request(front_zmq *f, const uint8_t *peer_id, size_t peer_len,
                           zmq_msg_t *payload) {
    const uint8_t *data = zmq_msg_data(payload);
    const size_t len = zmq_msg_size(payload);
    /* Who sent it: the ZAP handler named the connection's peer (front_zmq_auth.h). */
    auth_peer who;
    if (zauth_peer_of(payload, &who) != CORRAL_OK) {
        static log_limit unauthenticated_log = LOG_LIMIT_INIT(20, 10000);
        uint64_t left_out;
        if (log_limit_allow(&unauthenticated_log, &left_out))
            log_warn("message refused: its connection was not authenticated",
                     LOG_UINT("left_out", left_out));
        send_error(f, peer_id, peer_len, 0, CORRAL_PERMISSION_DENIED,
                   "this connection was not authenticated by corrald");
        return;
    }
    if (len > f->config->max_message_bytes) {
        peer_touch(f, peer_id, peer_len);
        char message[160];
        snprintf(message, sizeof message,
                 "the message has %zu bytes: more than limits.max_message_bytes (%llu)", len,
                 (unsigned long long)f->config->max_message_bytes);
        log_info("request refused: message too large", LOG_UINT("bytes", len));
        send_error(f, peer_id, peer_len, leading_request_id(data, len), CORRAL_INVALID_ARGUMENT,
                   message);
        return;
    }
    Corral__V1__Request *req = corral__v1__request__unpack(NULL, len, data);
    if (!req) {
        log_debug("undecodable request", LOG_UINT("bytes", len));
        send_error(f, peer_id, peer_len, 0, CORRAL_PROTOCOL,
                   "message is not a valid corral.v1.Request");
        return;
    }
    peer_touch(f, peer_id, peer_len);
    corral_error err;
    if (req->protocol_version > CORRAL__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT) {
        char message[160];
        snprintf(message, sizeof message,
                 "protocol version %u is not supported: this daemon speaks version %d",
                 req->protocol_version, CORRAL__V1__PROTOCOL_VERSION__PROTOCOL_VERSION_CURRENT);
        send_error(f, peer_id, peer_len, req->id, CORRAL_UNSUPPORTED, message);
        corral__v1__request__free_unpacked(req, NULL);
        return;
    }
    if (zproto_check_strings(data, len, &err) != CORRAL_OK) {
        send_error(f, peer_id, peer_len, req->id, err.status, err.message);
        corral__v1__request__free_unpacked(req, NULL);
        return;
    }
    if (req->body_case == CORRAL__V1__REQUEST__BODY_PING) {
        send_direct(f, peer_id, peer_len,
                    zproto_pack_pong(&f->buf, req->id, core_uptime_ms(f->core), f->config_path),
                    req->id);
        corral__v1__request__free_unpacked(req, NULL);
        return;
    }
    if (req->body_case == CORRAL__V1__REQUEST__BODY_CANCEL) {
        zreq *q = inflight_find(f, peer_id, peer_len, req->cancel->request_id);
        if (!q || q->dead) {
            char message[128];
            snprintf(message, sizeof message, "no request %llu of this client is in flight",
                     (unsigned long long)req->cancel->request_id);
            send_error(f, peer_id, peer_len, req->id, CORRAL_NOT_FOUND, message);
        } else {
            cancel_job(f, q, JOB_CANCEL_CLIENT);
            send_direct(f, peer_id, peer_len, zproto_pack_ack(&f->buf, req->id, "cancelling"),
                        req->id);
        }
        corral__v1__request__free_unpacked(req, NULL);
        return;
    }
    core_request creq;
    void *extra = NULL;
    if (zproto_to_core(req, &creq, &extra, &err) != CORRAL_OK) {
        send_error(f, peer_id, peer_len, req->id, err.status, err.message);
        corral__v1__request__free_unpacked(req, NULL);
        return;
    }
    /* The app it runs as: the peer's own, or the one Request.app names if the peer may act as
     * it (auth.h); the client's word alone never decides. */
    auth_grant grant;
    auth_table *table = core_auth_acquire(f->core);
    const corral_status granted = auth_select(table, &who, req->app, &grant, &err);
    auth_table_release(&table);
    if (granted != CORRAL_OK) {
        char peer_name[128];
        auth_peer_describe(&who, peer_name, sizeof peer_name);
        log_warn("permission denied", LOG_STR("app", req->app), LOG_STR("rule", "Request.app"),
                 LOG_STR("peer", peer_name), LOG_UINT("id", req->id));
        send_error(f, peer_id, peer_len, req->id, granted, err.message);
        free(extra);
        corral__v1__request__free_unpacked(req, NULL);
        return;
    }
    const char *problem = NULL;
    corral_status code = CORRAL_INVALID_ARGUMENT;
    if (f->stopping) {
        problem = "corrald is shutting down";
        code = CORRAL_UNAVAILABLE;
    } else if (req->id == 0) {
        problem = "request id 0 is reserved; use ids from 1";
    } else if (peer_len > PEER_ID_MAX) {
        problem = "routing identity too long";
    } else if (inflight_find(f, peer_id, peer_len, req->id)) {
        problem = "a request with this id is already in flight on this connection";
    }
    if (problem) {
        send_error(f, peer_id, peer_len, req->id, code, problem);
        free(extra);
        corral__v1__request__free_unpacked(req, NULL);
        return;
    }
    zreq *q = calloc(1, sizeof *q);
    job *j = q ? job_new(f->sink, &err) : NULL;
    if (!j || job_text_init(&q->text, &err) != CORRAL_OK) {
        job_free(&j);
        if (q) job_text_free(&q->text);
        free(q);
        send_error(f, peer_id, peer_len, req->id, CORRAL_OUT_OF_MEMORY, "out of memory");
        free(extra);
        corral__v1__request__free_unpacked(req, NULL);
        return;
    }
    q->j = j;
    q->wire = req;
    memcpy(q->peer, peer_id, peer_len);
    q->peer_len = peer_len;
    q->conn_fd = zmq_msg_get(payload, ZMQ_SRCFD);
    q->id = req->id;
    q->extra = extra;
    j->front = q;
    j->front_free = zreq_free;
    j->req = creq;
    q->stream = j->req.kind == CORE_GENERATE && j->req.generate.stream;
    j->id = req->id;
    snprintf(j->app, sizeof j->app, "%s", grant.app);
    j->owner = grant.owner;
    j->received_us = mono_us();
    if (j->req.kind == CORE_GENERATE && j->req.generate.deadline_ms)
        j->deadline_us = j->received_us + (int64_t)j->req.generate.deadline_ms * 1000;
    q->next = f->inflight;
    f->inflight = q;
    core_submit(f->core, j);
}

/* Read one whole multipart message from the router: [identity][payload]. Extra frames mean the
 * sender is not a plain DEALER speaking our framing. */
static void front_receive(front_zmq *f) {
    read_monitor(f);
    zmq_msg_t identity, payload;
    zmq_msg_init(&identity);
    zmq_msg_init(&payload);
    if (zmq_msg_recv(&identity, f->router, ZMQ_DONTWAIT) < 0) goto done;
    if (!zmq_msg_more(&identity)) goto done; /* cannot happen with ROUTER; ignore */
    if (zmq_msg_recv(&payload, f->router, 0) < 0) goto done;
    if (zmq_msg_more(&payload)) {
        /* Drain the rest so the next read starts at a message boundary. */
        zmq_msg_t extra;
        zmq_msg_init(&extra);
        do {
            if (zmq_msg_recv(&extra, f->router, 0) < 0) break;
        } while (zmq_msg_more(&extra));
        zmq_msg_close(&extra);
        send_error(f, zmq_msg_data(&identity), zmq_msg_size(&identity), 0, CORRAL_PROTOCOL,
                   "expected exactly one frame per request");
        goto done;
    }
    handle_request(f, zmq_msg_data(&identity), zmq_msg_size(&identity), &payload);
done:
    zmq_msg_close(&payload);
    zmq_msg_close(&identity);
}

/* ---- the loop -------------------------------------------------------------------------------- */

corral_status front_zmq_run(front_zmq *f, core *k, int signal_fd, const char *config_path,
                            corral_error *err) {
    f->core = k;
    int64_t last_check = mono_us(), stop_deadline = 0;
    for (;;) {
        zmq_pollitem_t items[] = {
            {.socket = f->router, .events = ZMQ_POLLIN},
            {.fd = signal_fd, .events = ZMQ_POLLIN},
            {.fd = f->event_fd, .events = ZMQ_POLLIN},
            {.socket = zauth_zap_socket(f->auth), .events = ZMQ_POLLIN},
            {.socket = zauth_monitor_socket(f->auth), .events = ZMQ_POLLIN},
        };
        bool held = false;
        for (zreq *q = f->inflight; q && !held; q = q->next) held = q->paused_since_us != 0;
        int rc = zmq_poll(items, 5, held || f->stopping ? 5 : 250);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            return corral_error_set(err, CORRAL_INTERNAL, "zmq_poll: %s",
                                    zmq_strerror(zmq_errno()));
        }
        if (items[1].revents & ZMQ_POLLIN) {
            struct signalfd_siginfo info;
            if (read(signal_fd, &info, sizeof info) == (ssize_t)sizeof info) {
                if (info.ssi_signo == SIGHUP) {
                    if (config_path)
                        core_reload(f->core, config_path);
                    else
                        log_warn("SIGHUP ignored: running on built-in defaults, no file to reload");
                } else if (!f->stopping) {
                    size_t n = 0;
                    for (zreq *q = f->inflight; q; q = q->next) n++;
                    log_info("stopping", LOG_STR("signal", strsignal((int)info.ssi_signo)),
                             LOG_UINT("zmq_requests", n));
                    f->stopping = true;
                    stop_deadline = mono_us() + SHUTDOWN_GRACE_MS * 1000;
                    core_shutdown(f->core);
                }
            }
        }
        if (items[2].revents & ZMQ_POLLIN) deliver_events(f);
        /* A handshake waits for its ZAP answer: answer every request that is there. */
        if (items[3].revents & ZMQ_POLLIN) {
            int events = 0;
            size_t events_len = sizeof events;
            do {
                zauth_answer_zap(f->auth, f->core);
                if (zmq_getsockopt(zauth_zap_socket(f->auth), ZMQ_EVENTS, &events, &events_len))
                    break;
            } while (events & ZMQ_POLLIN);
        }
        if (items[4].revents & ZMQ_POLLIN) read_monitor(f);
        if (items[0].revents & ZMQ_POLLIN) {
            /* Drain everything that is ready, then poll again. */
            int events = 0;
            size_t events_len = sizeof events;
            do {
                front_receive(f);
                if (zmq_getsockopt(f->router, ZMQ_EVENTS, &events, &events_len) != 0) break;
            } while (events & ZMQ_POLLIN);
        }
        const int64_t now = mono_us();
        if (held || now - last_check > 250000) {
            check_liveness(f);
            last_check = now;
        }
        if (f->stopping) {
            deliver_events(f);
            if ((!f->inflight && core_idle(f->core)) || now > stop_deadline) return CORRAL_OK;
        }
    }
}

void front_zmq_destroy(front_zmq **pf) {
    if (!pf || !*pf) return;
    front_zmq *f = *pf;
    while (f->inflight) inflight_remove(f, f->inflight);
    for (peer *p = f->peers, *next; p; p = next) {
        next = p->next;
        free(p);
    }
    zauth_destroy(&f->auth);
    if (f->router) {
        for (size_t i = 0; i < f->n_endpoints; i++) zmq_unbind(f->router, f->endpoints[i]);
        zmq_close(f->router);
    }
    if (f->zctx) zmq_ctx_term(f->zctx);
    for (size_t i = 0; i < f->n_endpoints; i++) {
        /* ZeroMQ leaves the socket file of an ipc endpoint behind; it is ours, remove it. */
        if (strncmp(f->endpoints[i], "ipc://", 6) == 0) unlink(f->endpoints[i] + 6);
        free(f->endpoints[i]);
    }
    core_sink_destroy(&f->sink);
    if (f->event_fd >= 0) close(f->event_fd);
    zproto_buf_free(&f->buf);
    free(f);
    *pf = NULL;
}
