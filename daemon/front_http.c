/*
 * front_http.c — the HTTP front end's mechanics (see front_http.h): the libmicrohttpd daemons and
 * the thread that drives them, connections and their limits, routing, and the life of a request
 * from its body to its last byte. Who may call is in front_http_access.c (keys, CORS); what the
 * bodies mean in front_http_openai.c and front_http_ollama.c (front_http_impl.h).
 *
 * Why an external poll loop on a thread of our own rather than MHD's internal polling thread: the
 * core reports events through a sink whose notify callback may only write an eventfd, and taking
 * those events, resuming suspended connections and MHD's own callbacks then all happen on this one
 * thread, so requests, jobs and connections need no lock. The loop polls MHD's epoll fd (one per
 * daemon), the eventfd, and a timeout of at most 100 ms for the liveness checks.
 *
 * A request's life. MHD calls the access handler with the headers (we check the route, the key,
 * CORS and the announced body size), then with pieces of the body (kept up to http.max_body_bytes,
 * else 413), then once more with none: the body is checked (UTF-8, JSON), translated, and the job
 * submitted; the connection is suspended. The core's events are taken as they come and formatted
 * at once into the request's output buffer; the first one that matters (text of a stream, or the
 * final event) resumes the connection, and MHD calls the handler again, which queues the answer:
 * the buffer for a whole answer (or an error before a stream began), else a stream whose content
 * callback hands out the buffer and suspends the connection while it is empty.
 *
 * Disconnects. MHD does not watch suspended connections, so every 100 ms the loop peeks at the
 * socket of each suspended request: end-of-file or an error means the client went away, the job
 * is cancelled and the connection closed; the request lives on, detached, until the core's final
 * event. A stream whose client reads slower than the model writes has its job paused once 64 KiB
 * wait, and cancelled after limits.stall_timeout_ms.
 *
 * Slow clients. MHD closes a connection idle for http.idle_timeout_ms. On top of that a request
 * must arrive whole in time: a connection that has not delivered a request's headers within
 * http.idle_timeout_ms of connecting or of its previous request is shut down (a slow loris that
 * trickles header bytes), and so is one whose body is still arriving http.request_timeout_ms
 * after its headers (MHD gives no way to answer while it reads a body, so no status is sent).
 */
#include "front_http.h"

#include <errno.h>
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "corral/endpoint.h"
#include "corral/log.h"
#include "corral/utf8.h"
#include "front_http_impl.h"
#include "job.h"

enum {
    HTTP_MAX_ADDRESSES = 16,
    HTTP_SHUTDOWN_GRACE_MS = 1500,
    HTTP_TICK_MS = 100,
    HTTP_OUT_HIGH = 64 * 1024, /* a stream's unsent bytes beyond which its job is paused */
};

/* A connection (MHD's socket context): when it started waiting for its next request. */
typedef struct hconn {
    int fd;
    int64_t waiting_since_us; /* connect, or the end of its last request */
    bool in_request;          /* the access handler has seen a request's headers */
    bool shut;                /* shut down for being too slow */
    hreq *r;                  /* the request being received or answered, or NULL */
    struct hconn *prev, *next;
} hconn;

struct front_http {
    const cfg *config;
    core *core;
    core_sink *sink;
    int event_fd;
    struct MHD_Daemon *daemons[HTTP_MAX_ADDRESSES];
    char *addresses[HTTP_MAX_ADDRESSES];
    size_t n_daemons;
    http_keys *keys;
    hreq *inflight; /* requests with a job not yet finished or freed */
    hconn *conns;
    uint64_t next_id;
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;
    bool stopping;
};

static int64_t mono_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void notify_event_fd(void *ctx) {
    const front_http *f = ctx;
    const uint64_t one = 1;
    if (write(f->event_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        log_warn("cannot wake the HTTP front end", LOG_STR("error", strerror(errno)));
}

/* ---- routing --------------------------------------------------------------------------------- */

static const http_route *find_route(const char *method, const char *path, bool *method_mismatch) {
    const http_route *const tables[] = {http_openai_routes, http_ollama_routes};
    *method_mismatch = false;
    for (size_t t = 0; t < 2; t++)
        for (const http_route *r = tables[t]; r->method; r++) {
            const size_t n = strlen(r->path);
            const bool match =
                r->prefix ? strncmp(path, r->path, n) == 0 && path[n] : strcmp(path, r->path) == 0;
            if (!match) continue;
            if (strcmp(method, r->method) == 0 ||
                (strcmp(method, "HEAD") == 0 && strcmp(r->method, "GET") == 0))
                return r;
            *method_mismatch = true;
        }
    return NULL;
}

/* ---- requests -------------------------------------------------------------------------------- */

static void hreq_free(hreq *r) {
    if (!r) return;
    job_free(&r->j);
    job_free(&r->j2);
    job_text_free(&r->text);
    hbuf_free(&r->body);
    hbuf_free(&r->out);
    if (r->doc) json_decref(r->doc);
    free(r->messages);
    free(r->stops);
    free(r->text_arg);
    free(r->schema_text);
    free(r);
}

static void inflight_unlink(front_http *f, hreq *r) {
    for (hreq **pp = &f->inflight; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            return;
        }
}

/* Whether the request's jobs have all had their final events (so it may be freed). */
static bool hreq_jobs_over(const hreq *r) {
    return (!r->j || r->final_taken) && (!r->j2 || r->j2_over);
}

static void cancel_request(front_http *f, hreq *r, job_cancel why) {
    if (!r->j || r->final_taken) return;
    int expected = JOB_CANCEL_NONE;
    atomic_compare_exchange_strong(&r->j->cancel, &expected, why);
    atomic_store(&r->j->paused, 0);
    if (f->core) core_poke(f->core); /* NULL once the core is gone (front_http_destroy) */
}

static void resume(hreq *r) {
    if (r->suspended && r->conn) {
        r->suspended = false;
        MHD_resume_connection(r->conn);
    }
}

/* Common headers of every answer. */
static void add_headers(const hreq *r, struct MHD_Response *resp, const char *content_type) {
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    MHD_add_response_header(resp, "X-Request-Id", r->request_id);
    if (r->origin[0]) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->origin);
        MHD_add_response_header(resp, "Access-Control-Expose-Headers", "X-Request-Id");
        MHD_add_response_header(resp, "Vary", "Origin");
    }
}

static enum MHD_Result queue_buffer(hreq *r, unsigned status, const char *content_type) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        r->out.len - r->out.off, r->out.data ? r->out.data + r->out.off : (char *)"",
        MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    add_headers(r, resp, content_type);
    r->queued = true;
    const enum MHD_Result rc = MHD_queue_response(r->conn, status, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* Answer with an error at once (before any job). */
static enum MHD_Result answer_problem(hreq *r, const http_problem *p) {
    hbuf_reset(&r->out);
    http_write_error(&r->out, r->route ? r->route->ollama : false, p->code, p->param, p->message);
    if (r->out.failed) return MHD_NO;
    /* Every failed request is logged at warn, as the core logs the ones it fails (job.c). */
    log_warn("http request refused", LOG_STR("request_id", r->request_id), LOG_STR("path", r->path),
             LOG_UINT("status", p->status), LOG_STR("error", p->message));
    return queue_buffer(r, p->status, "application/json");
}

static void take_events(front_http *f, hreq *r, job *j);

/* The stream's content callback: hand out what is buffered; suspend while there is nothing. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    hreq *r = cls;
    if (r->gone) return MHD_CONTENT_READER_END_WITH_ERROR;
    const size_t avail = r->out.len - r->out.off;
    if (avail) {
        const size_t n = avail < max ? avail : max;
        memcpy(buf, r->out.data + r->out.off, n);
        r->out.off += n;
        if (r->out.off == r->out.len) hbuf_reset(&r->out);
        if (r->paused && r->out.len - r->out.off < HTTP_OUT_HIGH / 2) {
            r->paused = false;
            r->paused_since_us = 0;
            if (r->j && !r->final_taken) {
                atomic_store(&r->j->paused, 0);
                if (r->f->core) core_poke(r->f->core);
                /* What the core queued while we held back is taken now: it may not wake us
                 * again. */
                take_events(r->f, r, r->j);
            }
        }
        return (ssize_t)n;
    }
    if (r->finished) return MHD_CONTENT_READER_END_OF_STREAM;
    r->suspended = true;
    MHD_suspend_connection(r->conn);
    return 0;
}

/* The request is answered by the core: queue what it gave. */
static enum MHD_Result queue_answer(hreq *r) {
    const bool ollama = r->route->ollama;
    if (!r->stream || (!r->started && r->final_taken && r->j->final == JOB_FINAL_ERROR)) {
        if (r->out.failed) return MHD_NO;
        return queue_buffer(r, r->status ? r->status : 200, "application/json");
    }
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, r, NULL);
    if (!resp) return MHD_NO;
    add_headers(r, resp, ollama ? "application/x-ndjson" : "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (!ollama) MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    r->queued = true;
    r->streaming = true;
    const enum MHD_Result rc = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* Ollama keep_alive: change the model's residency after the generation, before the answer ends,
 * so that a client that asks /api/ps next sees the result. */
static void submit_residency(front_http *f, hreq *r) {
    static const core_kind kinds[] = {[HTTP_RESIDENCY_PIN] = CORE_PIN,
                                      [HTTP_RESIDENCY_UNLOAD] = CORE_UNLOAD,
                                      [HTTP_RESIDENCY_UNPIN] = CORE_UNPIN};
    corral_error err;
    job *j2 = job_new(f->sink, &err);
    if (!j2) return;
    j2->req.kind = kinds[r->residency];
    j2->req.target.model = r->model;
    /* keep_alive is Ollama's one residency control: 0 unloads even what -1 pinned. */
    j2->req.target.force = true;
    j2->front = r;
    snprintf(j2->app, sizeof j2->app, "%s", r->app);
    j2->id = r->j->id;
    j2->received_us = mono_us();
    r->j2 = j2;
    core_submit(f->core, j2);
}

/* The request field an error of the core is about (OpenAI's `param`), or NULL. */
static const char *field_at_fault(const hreq *r, const job *j) {
    const char *rule = j->error_rule ? j->error_rule : "";
    if (strcmp(rule, JOB_RULE_OUTPUT_CONSTRAINT) == 0)
        return r->schema_field ? r->schema_field : "corral.regex";
    if (strcmp(rule, JOB_RULE_SANITIZER_PROFILE) == 0) return "corral.sanitizer";
    return j->error_code == CORRAL_NOT_FOUND ? "model" : NULL;
}

/* The end of r's answer, once every job of it is over: the translation's, or an error. */
static void finish_answer(hreq *r) {
    const job *j = r->j;
    if (j->final == JOB_FINAL_ERROR) {
        const bool ollama = r->route->ollama;
        if (!r->stream || !r->started) {
            hbuf_reset(&r->out);
            r->status = http_status_for_rule(j->error_code, j->error_rule);
            http_write_rule_error(&r->out, ollama, j->error_code, j->error_rule,
                                  field_at_fault(r, j), j->error_message);
        } else {
            /* The stream began with 200: the error is its last event. */
            if (!ollama) hbuf_puts(&r->out, "data: ");
            http_write_rule_error(&r->out, ollama, j->error_code, j->error_rule, NULL,
                                  j->error_message);
            hbuf_puts(&r->out, ollama ? "\n" : "\n\n");
        }
        log_debug("http request failed", LOG_STR("request_id", r->request_id),
                  LOG_STR("error", j->error_message));
    } else {
        r->route->finish(r);
    }
    r->finished = true;
}

/* Take what the core has for job j of r and format it; resume the connection when there is
 * something to send. Frees r when it is detached and over. */
static void take_events(front_http *f, hreq *r, job *j) {
    job_taken t;
    if (j == r->j2) {
        job_take(j, false, NULL, &t);
        if (t.final != JOB_FINAL_NONE) {
            r->j2_over = true;
            if (j->final == JOB_FINAL_ERROR)
                log_info("keep_alive not applied", LOG_STR("model", r->model),
                         LOG_STR("error", j->error_message));
        }
    } else if (!r->final_taken && !r->paused) {
        job_take(j, r->stream, &r->text, &t);
        if (t.final != JOB_FINAL_NONE && !r->stream) job_take(j, true, &r->text, &t);
        if (r->stream) {
            if ((r->text.len || r->text.n_ids) && r->conn && !r->gone && r->route->chunk) {
                r->route->chunk(r, r->text.text, r->text.len);
                r->started = true;
            }
            job_text_clear(&r->text);
        }
        if (t.final != JOB_FINAL_NONE) {
            r->final_taken = true;
            if (r->conn && !r->gone && r->residency != HTTP_RESIDENCY_NONE &&
                j->final != JOB_FINAL_ERROR)
                submit_residency(f, r);
        }
    }
    if (!r->conn) {
        if (hreq_jobs_over(r)) {
            if (r->j->final == JOB_FINAL_DONE)
                log_info("http request ended after its client left",
                         LOG_STR("request_id", r->request_id),
                         LOG_STR("stop",
                                 r->j->done.stop == CORE_STOP_CANCELLED ? "cancelled" : "finished"),
                         LOG_UINT("generated_tokens", r->j->done.generated_tokens));
            inflight_unlink(f, r);
            hreq_free(r);
        }
        return;
    }
    if (r->gone) return;
    if (r->final_taken && hreq_jobs_over(r) && !r->finished) finish_answer(r);
    if (r->stream && r->streaming && !r->final_taken && r->out.len - r->out.off > HTTP_OUT_HIGH) {
        r->paused = true;
        r->paused_since_us = mono_us();
        atomic_store(&r->j->paused, 1);
    }
    if (r->finished || (r->stream && r->out.len > r->out.off)) resume(r);
}

static void deliver_events(front_http *f) {
    uint64_t count;
    if (read(f->event_fd, &count, sizeof count) < 0 && errno != EAGAIN)
        log_warn("eventfd read failed", LOG_STR("error", strerror(errno)));
    job *ready[64];
    size_t n;
    do {
        n = core_sink_take_ready(f->sink, ready, sizeof ready / sizeof ready[0]);
        for (size_t i = 0; i < n; i++) take_events(f, ready[i]->front, ready[i]);
    } while (n == sizeof ready / sizeof ready[0]);
}

/* ---- the access handler ---------------------------------------------------------------------- */

/* The whole body is in: check it, translate it, submit the job. Returns the MHD result of
 * answering at once, or MHD_YES after suspending the connection. */
static enum MHD_Result start_request(front_http *f, hreq *r) {
    http_problem p = {0};
    json_t *body = NULL;
    if (f->stopping || atomic_load(&f->stop)) {
        http_fail(&p, 503, NULL, "corrald is shutting down");
        return answer_problem(r, &p);
    }
    if (strcmp(r->route->method, "POST") == 0) {
        const size_t bad = utf8_validate((const uint8_t *)r->body.data, r->body.len);
        if (bad != r->body.len) {
            http_fail(&p, 400, NULL, "the request body is not valid UTF-8 (at byte %zu)", bad);
            return answer_problem(r, &p);
        }
        json_error_t jerr;
        body = r->body.len ? json_loadb(r->body.data, r->body.len, JSON_ALLOW_NUL, &jerr) : NULL;
        if (!body) {
            if (r->body.len)
                http_fail(&p, 400, NULL,
                          "the request body is not valid JSON: %s at line %d, "
                          "column %d",
                          jerr.text, jerr.line, jerr.column);
            else
                http_fail(&p, 400, NULL, "the request needs a JSON body");
            return answer_problem(r, &p);
        }
        if (!json_is_object(body)) {
            json_decref(body);
            http_fail(&p, 400, NULL, "the request body must be a JSON object");
            return answer_problem(r, &p);
        }
        r->doc = body;
    }
    corral_error err;
    job *j = job_new(f->sink, &err);
    if (!j || job_text_init(&r->text, &err) != CORRAL_OK) {
        job_free(&j);
        http_fail(&p, 503, NULL, "out of memory");
        return answer_problem(r, &p);
    }
    if (!r->route->prepare(r, body, j, &p)) {
        job_free(&j);
        return answer_problem(r, &p);
    }
    if (r->finished) {
        /* Answered without the core (e.g. /api/version). */
        job_free(&j);
        return queue_buffer(r, r->status ? r->status : 200, "application/json");
    }
    j->front = r;
    snprintf(j->app, sizeof j->app, "%s", r->app);
    j->id = ++f->next_id;
    j->received_us = mono_us();
    if (j->req.kind == CORE_GENERATE && j->req.generate.deadline_ms)
        j->deadline_us = j->received_us + (int64_t)j->req.generate.deadline_ms * 1000;
    r->j = j;
    r->next = f->inflight;
    f->inflight = r;
    r->suspended = true;
    MHD_suspend_connection(r->conn);
    core_submit(f->core, j);
    return MHD_YES;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls) {
    (void)version;
    front_http *f = cls;
    hreq *r = *con_cls;
    if (!r) {
        /* The headers are in. */
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        *con_cls = r;
        r->f = f;
        r->conn = conn;
        r->started_us = mono_us();
        r->created = (int64_t)time(NULL);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        r->hc = ci ? ci->socket_context : NULL;
        if (r->hc) r->hc->in_request = true, r->hc->r = r;
        snprintf(r->path, sizeof r->path, "%s", url);
        const char *rid = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
        size_t rid_len = rid ? strlen(rid) : 0;
        bool rid_ok = rid_len > 0 && rid_len < sizeof r->request_id;
        for (size_t i = 0; rid_ok && i < rid_len; i++)
            rid_ok = (uint8_t)rid[i] > 0x20 && (uint8_t)rid[i] < 0x7F;
        if (rid_ok)
            memcpy(r->request_id, rid, rid_len + 1);
        else
            snprintf(r->request_id, sizeof r->request_id, "corral-%llx-%llx",
                     (unsigned long long)r->started_us, (unsigned long long)++f->next_id);
        http_cors_origin(f->config, conn, r->origin, sizeof r->origin);
        if (strcmp(method, "OPTIONS") == 0) return http_answer_preflight(r);
        bool wrong_method;
        r->route = find_route(method, url, &wrong_method);
        http_problem p = {0};
        if (!r->route) {
            if (wrong_method)
                http_fail(&p, 405, NULL, "%s is not allowed on %s", method, url);
            else
                http_fail(&p, 404, NULL, "no endpoint %s %s", method, url);
            p.code = CORRAL_NOT_FOUND;
            return answer_problem(r, &p);
        }
        if (!http_authenticate(f->keys, conn, r->app, sizeof r->app, &p))
            return answer_problem(r, &p);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > f->config->http_max_body_bytes) {
            http_fail(&p, 413, NULL,
                      "the request body is larger than %llu bytes "
                      "(http.max_body_bytes)",
                      (unsigned long long)f->config->http_max_body_bytes);
            return answer_problem(r, &p);
        }
        return MHD_YES;
    }
    if (r->queued) {
        /* Answered already (an early refusal): discard the rest of the body. */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        /* A body that outgrows the limit is read to its end and dropped (libmicrohttpd queues no
         * answer while a body arrives), then refused; a body that takes too long is cut off by
         * check_liveness. */
        if (!r->body_too_big && r->body.len + *upload_size > f->config->http_max_body_bytes) {
            r->body_too_big = true;
            hbuf_free(&r->body);
        }
        if (!r->body_too_big) hbuf_append(&r->body, upload, *upload_size);
        *upload_size = 0;
        if (r->body.failed) return MHD_NO;
        return MHD_YES;
    }
    if (r->body_too_big) {
        http_problem p = {0};
        http_fail(&p, 413, NULL, "the request body is larger than %llu bytes (http.max_body_bytes)",
                  (unsigned long long)f->config->http_max_body_bytes);
        return answer_problem(r, &p);
    }
    /* The body is complete, or the core has answered (the connection was resumed). */
    if (r->gone) return MHD_NO;
    if (!r->j && !r->finished) return start_request(f, r);
    if (r->streaming) return MHD_YES; /* cannot happen: the stream's callback runs now */
    return queue_answer(r);
}

/* MHD is done with a request (answered, or the connection failed). */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)conn;
    front_http *f = cls;
    hreq *r = *con_cls;
    *con_cls = NULL;
    if (!r) return;
    if (r->hc) {
        r->hc->in_request = false;
        r->hc->r = NULL;
        r->hc->waiting_since_us = mono_us();
    }
    r->conn = NULL;
    r->hc = NULL;
    if (r->j && !hreq_jobs_over(r)) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) {
            log_info("http client gone: cancelling", LOG_STR("request_id", r->request_id),
                     LOG_STR("app", r->app));
            cancel_request(f, r, JOB_CANCEL_GONE);
        }
        return; /* freed at its final event */
    }
    if (r->j) inflight_unlink(f, r);
    hreq_free(r);
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    front_http *f = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        hconn *hc = calloc(1, sizeof *hc);
        if (!hc) return;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        hc->fd = ci ? ci->connect_fd : -1;
        /* Streams write a small chunk per token: without this, Nagle's algorithm holds a chunk
         * back until the client acknowledges the one before (up to its delayed-ACK timeout). */
        const int one = 1;
        if (hc->fd >= 0) setsockopt(hc->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        hc->waiting_since_us = mono_us();
        hc->next = f->conns;
        if (f->conns) f->conns->prev = hc;
        f->conns = hc;
        *socket_context = hc;
        return;
    }
    hconn *hc = *socket_context;
    if (!hc) return;
    if (hc->prev)
        hc->prev->next = hc->next;
    else
        f->conns = hc->next;
    if (hc->next) hc->next->prev = hc->prev;
    for (hreq *r = f->inflight; r; r = r->next)
        if (r->hc == hc) r->hc = NULL;
    free(hc);
    *socket_context = NULL;
}

/* ---- liveness -------------------------------------------------------------------------------- */

/* 1 when the peer of fd has closed or reset its side. */
static bool peer_gone(int fd) {
    if (fd < 0) return false;
    char byte;
    const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

static void check_liveness(front_http *f) {
    const int64_t now = mono_us();
    for (hreq *r = f->inflight, *next; r; r = next) {
        next = r->next;
        if (!r->conn || r->gone) continue;
        if (r->suspended && r->hc && peer_gone(r->hc->fd)) {
            log_info("http client disconnected: cancelling", LOG_STR("request_id", r->request_id),
                     LOG_STR("app", r->app));
            r->gone = true;
            cancel_request(f, r, JOB_CANCEL_GONE);
            resume(r);
            continue;
        }
        if (r->paused && now - r->paused_since_us > f->config->stall_timeout_ms * 1000) {
            log_info("http stream stalled: client stopped reading",
                     LOG_STR("request_id", r->request_id), LOG_STR("app", r->app));
            r->gone = true;
            r->paused = false;
            cancel_request(f, r, JOB_CANCEL_STALLED);
            resume(r);
        }
    }
    /* A connection that takes longer than the idle timeout to send a request's headers trickles
     * them (MHD's own timeout restarts with every byte), and one whose body is still coming after
     * http.request_timeout_ms is as slow: shut them down; MHD then closes them. */
    const int64_t header_limit = f->config->http_idle_timeout_ms * 1000;
    const int64_t body_limit = f->config->http_request_timeout_ms * 1000;
    for (hconn *hc = f->conns; hc; hc = hc->next) {
        if (hc->shut || hc->fd < 0) continue;
        const bool slow_headers = !hc->in_request && now - hc->waiting_since_us > header_limit;
        const bool slow_body = hc->in_request && hc->r && !hc->r->j && !hc->r->queued &&
                               !hc->r->finished && now - hc->r->started_us > body_limit;
        if (slow_headers || slow_body) {
            log_info(slow_headers ? "http client too slow to send its headers: disconnected"
                                  : "http client too slow to send its body: disconnected",
                     LOG_STR("path", hc->r ? hc->r->path : ""));
            hc->shut = true;
            shutdown(hc->fd, SHUT_RDWR);
        }
    }
}

/* ---- setup and the loop ---------------------------------------------------------------------- */

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    log_debug("libmicrohttpd", LOG_STR("message", line));
}

static corral_status bind_address(front_http *f, const char *text, corral_error *err) {
    endpoint_addr addr;
    corral_status st = endpoint_parse_address(text, &addr, err);
    if (st != CORRAL_OK) return corral_error_prefix(err, "http.listen");
    if (f->n_daemons == HTTP_MAX_ADDRESSES)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "http.listen: more than %d addresses",
                                HTTP_MAX_ADDRESSES);
    const cfg *c = f->config;
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (addr.ipv6) flags |= MHD_USE_IPv6;
    const unsigned idle_s = (unsigned)((c->http_idle_timeout_ms + 999) / 1000);
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_access, f, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr.addr,
        MHD_OPTION_CONNECTION_TIMEOUT, idle_s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)c->http_max_connections, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, f, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        f, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    if (!d)
        return corral_error_set(err, CORRAL_IO, "http.listen: cannot listen on %s: %s", text,
                                errno ? strerror(errno) : "libmicrohttpd refused");
    f->daemons[f->n_daemons] = d;
    if (!(f->addresses[f->n_daemons] = strdup(text))) {
        MHD_stop_daemon(d);
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    }
    f->n_daemons++;
    return CORRAL_OK;
}

front_http *front_http_new(const cfg *c, corral_error *err) {
    front_http *f = calloc(1, sizeof *f);
    if (!f) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    f->config = c;
    f->event_fd = -1;
    atomic_init(&f->stop, false);
    if (c->n_http_listen == 0) return f;
    if (!(f->keys = http_keys_load(c, err))) goto fail;
    f->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (f->event_fd < 0) {
        corral_error_set(err, CORRAL_INTERNAL, "eventfd: %s", strerror(errno));
        goto fail;
    }
    if (!(f->sink = core_sink_new(notify_event_fd, f, err))) goto fail;
    for (size_t i = 0; i < c->n_http_listen; i++)
        if (bind_address(f, c->http_listen[i], err) != CORRAL_OK) goto fail;
    return f;
fail:
    front_http_destroy(&f);
    return NULL;
}

corral_status front_http_check(const cfg *c, corral_error *err) {
    front_http *f = front_http_new(c, err);
    if (!f) return err->status;
    front_http_destroy(&f);
    return CORRAL_OK;
}

size_t front_http_address_count(const front_http *f) {
    return f ? f->n_daemons : 0;
}

const char *front_http_address(const front_http *f, size_t i) {
    return f && i < f->n_daemons ? f->addresses[i] : NULL;
}

static bool requests_pending(const front_http *f) {
    return f->inflight != NULL;
}

static void *http_thread(void *arg) {
    front_http *f = arg;
    int64_t last_check = mono_us(), stop_deadline = 0;
    for (;;) {
        struct pollfd fds[HTTP_MAX_ADDRESSES + 1];
        size_t n = 0;
        fds[n++] = (struct pollfd){.fd = f->event_fd, .events = POLLIN};
        for (size_t i = 0; i < f->n_daemons; i++) {
            const union MHD_DaemonInfo *di =
                MHD_get_daemon_info(f->daemons[i], MHD_DAEMON_INFO_EPOLL_FD);
            fds[n++] = (struct pollfd){.fd = di ? di->epoll_fd : -1, .events = POLLIN};
        }
        int timeout = HTTP_TICK_MS;
        for (size_t i = 0; i < f->n_daemons; i++) {
            MHD_UNSIGNED_LONG_LONG mhd_timeout;
            if (MHD_get_timeout(f->daemons[i], &mhd_timeout) == MHD_YES &&
                mhd_timeout < (MHD_UNSIGNED_LONG_LONG)timeout)
                timeout = (int)mhd_timeout;
        }
        if (poll(fds, n, timeout) < 0 && errno != EINTR) {
            log_error("http front end: poll failed", LOG_STR("error", strerror(errno)));
            break;
        }
        if (fds[0].revents & POLLIN) deliver_events(f);
        for (size_t i = 0; i < f->n_daemons; i++) MHD_run(f->daemons[i]);
        const int64_t now = mono_us();
        if (now - last_check >= HTTP_TICK_MS * 1000) {
            check_liveness(f);
            last_check = now;
            /* Resumed connections are processed by the next MHD_run. */
            for (size_t i = 0; i < f->n_daemons; i++) MHD_run(f->daemons[i]);
        }
        if (atomic_load(&f->stop) && !f->stopping) {
            f->stopping = true;
            stop_deadline = now + HTTP_SHUTDOWN_GRACE_MS * 1000;
        }
        if (f->stopping) {
            deliver_events(f);
            for (size_t i = 0; i < f->n_daemons; i++) MHD_run(f->daemons[i]);
            if (!requests_pending(f) || now > stop_deadline) break;
        }
    }
    return NULL;
}

corral_status front_http_start(front_http *f, core *k, corral_error *err) {
    f->core = k;
    if (f->n_daemons == 0) return CORRAL_OK;
    const int rc = pthread_create(&f->thread, NULL, http_thread, f);
    if (rc != 0) return corral_error_set(err, CORRAL_INTERNAL, "pthread_create: %s", strerror(rc));
    f->thread_started = true;
    pthread_setname_np(f->thread, "corral-http");
    return CORRAL_OK;
}

void front_http_stop(front_http *f) {
    if (!f || !f->thread_started) return;
    atomic_store(&f->stop, true);
    const uint64_t one = 1;
    if (write(f->event_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        log_warn("cannot wake the HTTP front end", LOG_STR("error", strerror(errno)));
    pthread_join(f->thread, NULL);
    f->thread_started = false;
}

void front_http_destroy(front_http **pf) {
    if (!pf || !*pf) return;
    front_http *f = *pf;
    front_http_stop(f);
    /* The core is destroyed by now (or never started): closing connections below must not poke
     * it. */
    f->core = NULL;
    /* MHD must not stop with suspended connections: resume them all, as gone. */
    for (hreq *r = f->inflight; r; r = r->next) {
        r->gone = true;
        resume(r);
    }
    for (size_t i = 0; i < f->n_daemons; i++) {
        MHD_run(f->daemons[i]);
        MHD_stop_daemon(f->daemons[i]);
        free(f->addresses[i]);
    }
    /* Requests left are detached (their connections closed above); the core is gone. */
    while (f->inflight) {
        hreq *r = f->inflight;
        f->inflight = r->next;
        hreq_free(r);
    }
    for (hconn *hc = f->conns, *next; hc; hc = next) {
        next = hc->next;
        free(hc);
    }
    core_sink_destroy(&f->sink);
    if (f->event_fd >= 0) close(f->event_fd);
    http_keys_destroy(&f->keys);
    free(f);
    *pf = NULL;
}
