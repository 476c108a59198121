/*
 * front_http_impl.h — what the HTTP front end's mechanics (front_http.c: connections, the loop,
 * limits, auth, streaming) share with its translations (front_http_openai.c, front_http_ollama.c:
 * JSON bodies into core requests, the core's events into JSON, SSE and NDJSON).
 *
 * A translation sees one request (hreq) at a time, on the front end's thread: `prepare` reads the
 * parsed body and fills the job's core_request (or answers at once), `chunk` appends a piece of
 * streamed text to the request's output buffer, `finish` appends the end (the whole body of a
 * request that is not streamed, the last events of a stream, or the error). Nothing here blocks or
 * calls into the core.
 */
#ifndef CORRAL_DAEMON_FRONT_HTTP_IMPL_H
#define CORRAL_DAEMON_FRONT_HTTP_IMPL_H

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "job.h"

/* A growable byte buffer; `off` is where the unsent part starts (streams). */
typedef struct hbuf {
    char *data;
    size_t len, cap, off;
    bool failed; /* an append ran out of memory: the output is incomplete */
} hbuf;

void hbuf_free(hbuf *b);
void hbuf_reset(hbuf *b);
void hbuf_append(hbuf *b, const char *s, size_t n);
void hbuf_puts(hbuf *b, const char *s);
void hbuf_printf(hbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s[0..n) as the inside of a JSON string: quotes, backslashes and control characters escaped,
 * ill-formed UTF-8 written as U+FFFD. */
void hbuf_json_escape(hbuf *b, const char *s, size_t n);
/* A JSON value (compact), or "null" for NULL. */
void hbuf_json(hbuf *b, const json_t *v);

/* What the client asked beyond the core request, about the model's residency (Ollama
 * keep_alive), done after the generation's final event. */
typedef enum http_residency {
    HTTP_RESIDENCY_NONE = 0,
    HTTP_RESIDENCY_PIN = 1,    /* keep_alive < 0 */
    HTTP_RESIDENCY_UNLOAD = 2, /* keep_alive 0 */
    HTTP_RESIDENCY_UNPIN = 3,  /* keep_alive > 0: evictable again (ttl_ms and memory apply) */
} http_residency;

typedef struct http_route http_route;

/* One HTTP request: the body, the job it became, and the output not yet sent. */
typedef struct hreq {
    struct front_http *f;
    const http_route *route;
    struct MHD_Connection *conn; /* NULL once the connection is gone (the job may still run) */
    struct hconn *hc;

    char path[160];      /* the URL path (routes with a parameter read it) */
    char origin[256];    /* CORS: the allowed Origin to echo, or "" */
    char request_id[80]; /* X-Request-Id: the client's, or one made up */
    char app[64];
    int64_t started_us; /* the access handler's first call */

    hbuf body;
    bool body_too_big, answered;

    /* The translation's state. */
    json_t *doc;            /* the parsed body: the job's strings point into it */
    core_message *messages; /* arrays of the core request */
    const char **stops;
    char *text_arg;           /* a prompt the translation had to build (owned) */
    char *schema_text;        /* a structured-output schema serialized for the core (owned) */
    const char *schema_field; /* the field that asked for JSON output, or NULL */
    bool stream, include_usage, chat, ollama;
    bool logprobs;         /* OpenAI logprobs asked for */
    uint32_t top_logprobs; /* alternatives per token */
    uint64_t text_offset;  /* completions' logprobs: bytes of text before this piece */
    http_residency residency;
    bool residency_only; /* Ollama: a generate without a prompt only loads or unloads */
    char model[128];
    char id[64]; /* chatcmpl-..., cmpl-... */
    int64_t created;
    bool started;  /* a stream's first chunk was written */
    char carry[4]; /* a UTF-8 sequence cut at the end of the last piece */
    size_t n_carry;

    /* The answer. */
    job *j;        /* the core job, or NULL for answers made at once */
    job *j2;       /* the residency follow-up (Ollama keep_alive), or NULL */
    job_text text; /* taken from the job */
    hbuf out;
    unsigned status;  /* HTTP status of a whole (not streamed) answer */
    bool final_taken; /* the job's final event was taken */
    bool j2_over;     /* the follow-up's final event was taken */
    bool finished;    /* `finish` ran: out holds the end */
    bool suspended;   /* the connection is suspended (waiting for the core) */
    bool queued;      /* a response was queued on the connection */
    bool streaming;   /* the queued response is the stream */
    bool gone;        /* the client went away: cancel, close */
    bool paused;      /* the job is paused: the client reads slower than it generates */
    int64_t paused_since_us;
    struct hreq *next; /* the front end's list of requests with a job */
} hreq;

/* A problem with a request, answered with an error status. */
typedef struct http_problem {
    unsigned status;    /* 400, 401, ... */
    corral_status code; /* for the error's type */
    char param[64];     /* the field at fault, or "" */
    char message[CORRAL_ERROR_MESSAGE_MAX];
} http_problem;

/* Fill *p; returns false so a parser can `return http_fail(...)`. */
bool http_fail(http_problem *p, unsigned status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* One endpoint. */
struct http_route {
    const char *method;
    const char *path; /* exact, or a prefix ending in '/' when `prefix` */
    bool prefix;
    bool ollama; /* errors in Ollama's shape ({"error": "..."}) instead of OpenAI's */
    /* Build the job's request from the body (NULL without one) in r->j->req, or answer at once:
     * write r->out and r->status and leave r->j NULL... through `answered`. False with *p for a
     * request refused. */
    bool (*prepare)(hreq *r, json_t *body, job *j, http_problem *p);
    /* A streamed piece of text (may be empty: ids only); NULL for routes that never stream. */
    void (*chunk)(hreq *r, const char *text, size_t len);
    /* The end: the job's final event (r->j->final) as the whole body or the stream's last lines. */
    void (*finish)(hreq *r);
};

/* ---- access (front_http_access.c) ----------------------------------------------------------- */

/* The bearer keys of http.keys, read from their files. Caller owns the result
 * (http_keys_destroy). NULL with err naming the key file at fault. */
typedef struct http_keys http_keys;
http_keys *http_keys_load(const cfg *c, corral_error *err);
/* Free (and wipe) the keys. NULL-safe; sets *k to NULL. */
void http_keys_destroy(http_keys **k);

/* The app a request runs as (app_size bytes at app; "" for the default app) from its
 * Authorization header: a configured key gives its app; no key is the default app from a loopback
 * peer only; anything else is false with a 401 in *p. */
bool http_authenticate(const http_keys *keys, struct MHD_Connection *conn, char *app,
                       size_t app_size, http_problem *p);

/* CORS: the value of Access-Control-Allow-Origin for the request's Origin ("" when it is not
 * allowed by http.cors, or the request has none). */
void http_cors_origin(const cfg *c, struct MHD_Connection *conn, char *out, size_t size);

/* Answer an OPTIONS preflight: 204 with the CORS headers for an allowed origin, else 403. */
enum MHD_Result http_answer_preflight(hreq *r);

/* The routes of each API (NULL-terminated by a route without method). */
extern const http_route http_openai_routes[];
extern const http_route http_ollama_routes[];

/* The HTTP status, OpenAI error type and code for a core status. */
unsigned http_status_for(corral_status code);
const char *http_error_type(corral_status code);

/* The same for an answer the core gave with the rule that refused it (job.error_rule; NULL for
 * none): a refusal by the rate or concurrency rule (requests_per_minute, max_concurrent) is 429
 * rate_limit_error / rate_limit_exceeded, the other app rules as their status says (403); a
 * regex or schema over the compile limits is 400 constraint_too_complex and a model that can
 * never fit in memory.limit 500 insufficient_memory, where a RESOURCE_EXHAUSTED that may pass
 * (a full queue) is 429. */
unsigned http_status_for_rule(corral_status code, const char *rule);

/* Write an error body: OpenAI's {"error": {message, type, param, code}} or Ollama's
 * {"error": "..."}; the _rule form for an answer of the core (see http_status_for_rule). */
void http_write_error(hbuf *b, bool ollama, corral_status code, const char *param,
                      const char *message);
void http_write_rule_error(hbuf *b, bool ollama, corral_status code, const char *rule,
                           const char *param, const char *message);

/* Streamed text through the UTF-8 carry of r: the complete characters of carry+text escaped into
 * r->out; a sequence cut at the end is kept for the next piece (flush = true writes it as U+FFFD).
 */
void http_escape_stream_text(hreq *r, const char *text, size_t len, bool flush);

/* Body fields, with the problem named after the field. Each returns false with *p when the field
 * is present with the wrong type or out of range; a missing (or null) field leaves *out alone and
 * *has false. */
bool http_get_number(json_t *o, const char *key, double lo, double hi, double *out, bool *has,
                     http_problem *p);
bool http_get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out, bool *has,
                  http_problem *p);
bool http_get_bool(json_t *o, const char *key, bool *out, http_problem *p);
/* A string field: borrowed from o (valid while o lives); NULL when missing. */
bool http_get_string(json_t *o, const char *key, const char **out, size_t *len, http_problem *p);

/* Stop strings: a string or an array of at most 16 strings, into r->stops. */
bool http_get_stops(hreq *r, json_t *v, const char *param, core_generate *g, http_problem *p);

/* corral's own fields ({priority, session, sanitizer, regex, top_k, min_p, repeat_penalty,
 * deadline_ms}) from the object `v` (the body's "corral", or NULL). */
bool http_get_corral_extras(json_t *v, core_generate *g, http_problem *p);

/* Structured output (OpenAI's response_format, Ollama's format) for the core's JSON-schema
 * constraint: `schema` a JSON Schema object, or NULL for any JSON object. `field` names the
 * body's field in errors. Refused together with corral.regex (one output constraint). The
 * serialized schema is owned by r. */
bool http_set_json_output(hreq *r, core_generate *g, json_t *schema, const char *field,
                          http_problem *p);

/* The ISO-8601 UTC time of now (Ollama's created_at). */
void http_now_rfc3339(char *buf, size_t size);

/* Finish reasons. */
const char *http_finish_reason(core_stop stop);

#endif /* CORRAL_DAEMON_FRONT_HTTP_IMPL_H */
