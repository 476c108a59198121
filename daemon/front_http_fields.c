/*
 * front_http_fields.c — the text both HTTP APIs read and write: the fields of a request body
 * (jansson) into corral's core request, with typed getters that name the field at fault, stop
 * strings and corral's own extras; and the answers' side: the output buffer, JSON string escaping
 * (streamed text keeps a UTF-8 sequence cut between two pieces for the next), error bodies and the
 * HTTP status of each core status, finish reasons, timestamps.
 *
 * Every check here is on untrusted input: a wrong type or a value out of range is a 400 naming
 * the field, never an assertion.
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "corral/utf8.h"
#include "front_http_impl.h"

enum { HTTP_MAX_STOPS = 16, HTTP_STOP_MAX_BYTES = 256 };

/* ---- buffers and JSON text ------------------------------------------------------------------- */

void hbuf_free(hbuf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

void hbuf_reset(hbuf *b) {
    b->len = b->off = 0;
    if (b->data) b->data[0] = '\0';
}

static bool hbuf_reserve(hbuf *b, size_t extra) {
    if (b->failed) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 512;
    while (cap < b->len + extra + 1) cap *= 2;
    char *data = realloc(b->data, cap);
    if (!data) {
        b->failed = true;
        return false;
    }
    b->data = data;
    b->cap = cap;
    return true;
}

void hbuf_append(hbuf *b, const char *s, size_t n) {
    if (!hbuf_reserve(b, n)) return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void hbuf_puts(hbuf *b, const char *s) {
    hbuf_append(b, s, strlen(s));
}

void hbuf_printf(hbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    const int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        hbuf_append(b, small, (size_t)n);
        return;
    }
    if (!hbuf_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void hbuf_json_escape(hbuf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    size_t i = 0;
    while (i < n) {
        /* Runs of plain bytes go in one copy. */
        size_t run = i;
        while (run < n && (uint8_t)s[run] >= 0x20 && (uint8_t)s[run] < 0x80 && s[run] != '"' &&
               s[run] != '\\')
            run++;
        if (run > i) {
            hbuf_append(b, s + i, run - i);
            i = run;
            continue;
        }
        const uint8_t c = (uint8_t)s[i];
        if (c >= 0x80) {
            size_t len;
            if (utf8_decode((const uint8_t *)s + i, n - i, NULL, &len) == UTF8_OK) {
                hbuf_append(b, s + i, len);
            } else {
                hbuf_append(b, "\xEF\xBF\xBD", 3);
                if (len == 0) len = 1;
            }
            i += len;
            continue;
        }
        char esc[7] = {'\\', 0, 0, 0, 0, 0, 0};
        size_t esc_len = 2;
        switch (c) {
            case '"':
                esc[1] = '"';
                break;
            case '\\':
                esc[1] = '\\';
                break;
            case '\n':
                esc[1] = 'n';
                break;
            case '\r':
                esc[1] = 'r';
                break;
            case '\t':
                esc[1] = 't';
                break;
            case '\b':
                esc[1] = 'b';
                break;
            case '\f':
                esc[1] = 'f';
                break;
            default:
                esc[1] = 'u', esc[2] = '0', esc[3] = '0', esc[4] = hex[c >> 4],
                esc[5] = hex[c & 15];
                esc_len = 6;
                break;
        }
        hbuf_append(b, esc, esc_len);
        i++;
    }
}

void hbuf_json(hbuf *b, const json_t *v) {
    if (!v) {
        hbuf_puts(b, "null");
        return;
    }
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) {
        b->failed = true;
        return;
    }
    hbuf_puts(b, text);
    free(text);
}

void http_escape_stream_text(hreq *r, const char *text, size_t len, bool flush) {
    /* Complete the sequence cut at the end of the last piece first. */
    while (r->n_carry && len) {
        r->carry[r->n_carry++] = *text++;
        len--;
        size_t used;
        const utf8_status st = utf8_decode((const uint8_t *)r->carry, r->n_carry, NULL, &used);
        if (st == UTF8_TRUNCATED && r->n_carry < UTF8_SEQUENCE_MAX) continue;
        if (st == UTF8_OK) {
            hbuf_append(&r->out, r->carry, r->n_carry);
        } else {
            /* Ill-formed: one U+FFFD for what was carried, the byte that broke it goes on. */
            hbuf_append(&r->out, "\xEF\xBF\xBD", 3);
            if (r->n_carry > 1) text--, len++;
        }
        r->n_carry = 0;
    }
    /* A well-formed start cut at the end waits for the next piece. */
    size_t keep = 0;
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        const uint8_t c = (uint8_t)text[len - back];
        if (!utf8_is_continuation(c)) {
            size_t used;
            if (c >= 0xC0 && utf8_decode((const uint8_t *)text + len - back, back, NULL, &used) ==
                                 UTF8_TRUNCATED)
                keep = back;
            break;
        }
    }
    hbuf_json_escape(&r->out, text, len - keep);
    memcpy(r->carry + r->n_carry, text + len - keep, keep);
    r->n_carry += keep;
    if (flush && r->n_carry) {
        hbuf_append(&r->out, "\xEF\xBF\xBD", 3);
        r->n_carry = 0;
    }
}

/* ---- errors -------------------------------------------------------------------------------- */

bool http_fail(http_problem *p, unsigned status, const char *param, const char *fmt, ...) {
    p->status = status;
    p->code = status == 404   ? CORRAL_NOT_FOUND
              : status == 401 ? CORRAL_PERMISSION_DENIED
              : status == 413 ? CORRAL_RESOURCE_EXHAUSTED
              : status == 503 ? CORRAL_UNAVAILABLE
              : status == 408 ? CORRAL_DEADLINE_EXCEEDED
                              : CORRAL_INVALID_ARGUMENT;
    snprintf(p->param, sizeof p->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->message, sizeof p->message, fmt, ap);
    va_end(ap);
    return false;
}

/* Core statuses as HTTP answers: status, OpenAI error type, code. */
typedef struct http_error_kind {
    corral_status code;
    const char *rule; /* job.error_rule this row is for, or NULL: any other */
    unsigned http;
    const char *type;
    const char *name;
} http_error_kind;

static const http_error_kind error_kinds[] = {
    /* The rate and concurrency rules: 429, which clients retry after a while (OpenAI's SDKs do so
     * by themselves), where the other app rules' 403 tells them not to. */
    {CORRAL_PERMISSION_DENIED, "requests_per_minute", 429, "rate_limit_error",
     "rate_limit_exceeded"},
    {CORRAL_PERMISSION_DENIED, "max_concurrent", 429, "rate_limit_error", "rate_limit_exceeded"},
    /* Exhausted for good, not for now: a retry gets the same answer, so no 429. */
    {CORRAL_RESOURCE_EXHAUSTED, JOB_RULE_OUTPUT_CONSTRAINT, 400, "invalid_request_error",
     "constraint_too_complex"},
    {CORRAL_RESOURCE_EXHAUSTED, JOB_RULE_MEMORY_LIMIT, 500, "server_error", "insufficient_memory"},
    /* Not a model that is missing: a 404 model_not_found would send the user looking for one. */
    {CORRAL_NOT_FOUND, JOB_RULE_SANITIZER_PROFILE, 400, "invalid_request_error", "invalid_value"},

    {CORRAL_INVALID_ARGUMENT, NULL, 400, "invalid_request_error", "invalid_value"},
    {CORRAL_NOT_FOUND, NULL, 404, "invalid_request_error", "model_not_found"},
    {CORRAL_UNSUPPORTED, NULL, 400, "invalid_request_error", "unsupported_parameter"},
    {CORRAL_SANITIZER_REJECTED, NULL, 400, "invalid_request_error", "sanitizer_rejected"},
    {CORRAL_PERMISSION_DENIED, NULL, 403, "permission_error", "permission_denied"},
    {CORRAL_RESOURCE_EXHAUSTED, NULL, 429, "rate_limit_error", "resource_exhausted"},
    {CORRAL_DEADLINE_EXCEEDED, NULL, 408, "timeout_error", "deadline_exceeded"},
    {CORRAL_UNAVAILABLE, NULL, 503, "server_error", "unavailable"},
    {CORRAL_FAILED_PRECONDITION, NULL, 409, "invalid_request_error", "failed_precondition"},
    {CORRAL_CANCELLED, NULL, 499, "server_error", "cancelled"},
    {CORRAL_OUT_OF_MEMORY, NULL, 503, "server_error", "out_of_memory"},
};

static const http_error_kind *error_kind(corral_status code, const char *rule) {
    static const http_error_kind internal = {CORRAL_INTERNAL, NULL, 500, "server_error",
                                             "internal_error"};
    for (size_t i = 0; i < sizeof error_kinds / sizeof error_kinds[0]; i++) {
        const http_error_kind *e = &error_kinds[i];
        if (e->code == code && (!e->rule || (rule && strcmp(rule, e->rule) == 0))) return e;
    }
    return &internal;
}

unsigned http_status_for_rule(corral_status code, const char *rule) {
    return error_kind(code, rule)->http;
}

unsigned http_status_for(corral_status code) {
    return http_status_for_rule(code, NULL);
}

const char *http_error_type(corral_status code) {
    return error_kind(code, NULL)->type;
}

void http_write_error(hbuf *b, bool ollama, corral_status code, const char *param,
                      const char *message) {
    http_write_rule_error(b, ollama, code, NULL, param, message);
}

void http_write_rule_error(hbuf *b, bool ollama, corral_status code, const char *rule,
                           const char *param, const char *message) {
    hbuf_puts(b, "{\"error\":");
    if (ollama) {
        hbuf_puts(b, "\"");
        hbuf_json_escape(b, message, strlen(message));
        hbuf_puts(b, "\"}");
        return;
    }
    hbuf_puts(b, "{\"message\":\"");
    hbuf_json_escape(b, message, strlen(message));
    hbuf_printf(b, "\",\"type\":\"%s\",\"param\":", error_kind(code, rule)->type);
    if (param && param[0]) {
        hbuf_puts(b, "\"");
        hbuf_json_escape(b, param, strlen(param));
        hbuf_puts(b, "\"");
    } else {
        hbuf_puts(b, "null");
    }
    hbuf_printf(b, ",\"code\":\"%s\"}}", error_kind(code, rule)->name);
}

/* ---- body fields ----------------------------------------------------------------------------- */

bool http_get_number(json_t *o, const char *key, double lo, double hi, double *out, bool *has,
                     http_problem *p) {
    json_t *v = json_object_get(o, key);
    *has = false;
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) return http_fail(p, 400, key, "%s must be a number", key);
    const double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi)
        return http_fail(p, 400, key, "%s must be between %g and %g", key, lo, hi);
    *out = d;
    *has = true;
    return true;
}

bool http_get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out, bool *has,
                  http_problem *p) {
    json_t *v = json_object_get(o, key);
    *has = false;
    if (!v || json_is_null(v)) return true;
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9e15) {
        x = (int64_t)json_real_value(v);
    } else {
        return http_fail(p, 400, key, "%s must be an integer", key);
    }
    if (x < lo || x > hi)
        return http_fail(p, 400, key, "%s must be between %lld and %lld", key, (long long)lo,
                         (long long)hi);
    *out = x;
    *has = true;
    return true;
}

bool http_get_bool(json_t *o, const char *key, bool *out, http_problem *p) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) return http_fail(p, 400, key, "%s must be true or false", key);
    *out = json_is_true(v);
    return true;
}

bool http_get_string(json_t *o, const char *key, const char **out, size_t *len, http_problem *p) {
    json_t *v = json_object_get(o, key);
    *out = NULL;
    if (len) *len = 0;
    if (!v || json_is_null(v)) return true;
    if (!json_is_string(v)) return http_fail(p, 400, key, "%s must be a string", key);
    *out = json_string_value(v);
    if (len) *len = json_string_length(v);
    return true;
}

bool http_get_stops(hreq *r, json_t *v, const char *param, core_generate *g, http_problem *p) {
    if (!v || json_is_null(v)) return true;
    const size_t n = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_string(v) && !json_is_array(v))
        return http_fail(p, 400, param, "%s must be a string or an array of strings", param);
    if (n > HTTP_MAX_STOPS)
        return http_fail(p, 400, param, "%s: at most %d stop strings", param, HTTP_MAX_STOPS);
    if (n == 0) return true;
    r->stops = calloc(n, sizeof *r->stops);
    if (!r->stops) return http_fail(p, 503, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_string(v) ? v : json_array_get(v, i);
        if (!json_is_string(s))
            return http_fail(p, 400, param, "%s[%zu] must be a string", param, i);
        const size_t len = json_string_length(s);
        if (len == 0 || len > HTTP_STOP_MAX_BYTES || strlen(json_string_value(s)) != len)
            return http_fail(p, 400, param, "%s[%zu] must be 1 to %d bytes without NUL", param, i,
                             HTTP_STOP_MAX_BYTES);
        r->stops[i] = json_string_value(s);
    }
    g->stop = r->stops;
    g->n_stop = n;
    return true;
}

static const struct {
    const char *name;
    cfg_priority priority;
} priority_names[] = {
    {"background", CFG_PRIORITY_BACKGROUND},
    {"interactive", CFG_PRIORITY_INTERACTIVE},
    {"realtime", CFG_PRIORITY_REALTIME},
};

bool http_get_corral_extras(json_t *v, core_generate *g, http_problem *p) {
    if (!v || json_is_null(v)) return true;
    if (!json_is_object(v)) return http_fail(p, 400, "corral", "corral must be an object");
    static const char *const known[] = {"priority",       "session",     "sanitizer",
                                        "regex",          "top_k",       "min_p",
                                        "repeat_penalty", "deadline_ms", "template"};
    const char *key;
    json_t *value;
    json_object_foreach(v, key, value) {
        bool ok = false;
        for (size_t i = 0; i < sizeof known / sizeof known[0] && !ok; i++)
            ok = strcmp(key, known[i]) == 0;
        if (!ok)
            return http_fail(p, 400, "corral",
                             "corral.%s is not a corral field (priority, session, sanitizer, "
                             "regex, top_k, min_p, repeat_penalty, deadline_ms, template)",
                             key);
    }
    const char *s;
    size_t len;
    if (!http_get_string(v, "priority", &s, NULL, p)) return false;
    if (s) {
        g->priority = 0;
        for (size_t i = 0; i < sizeof priority_names / sizeof priority_names[0]; i++)
            if (strcmp(s, priority_names[i].name) == 0) g->priority = priority_names[i].priority;
        if (!g->priority)
            return http_fail(p, 400, "corral.priority",
                             "corral.priority must be background, interactive or realtime");
    }
    if (!http_get_string(v, "session", &s, &len, p)) return false;
    if (s) {
        if (len == 0 || len > 128 || strlen(s) != len)
            return http_fail(p, 400, "corral.session", "corral.session must be 1 to 128 bytes");
        g->session = s;
    }
    if (!http_get_string(v, "sanitizer", &s, NULL, p)) return false;
    if (s) g->sanitizer = s;
    if (!http_get_string(v, "template", &s, NULL, p)) return false;
    if (s) g->template_name = s;
    if (!http_get_string(v, "regex", &s, &len, p)) return false;
    if (s) {
        g->constraint = s;
        g->constraint_len = len;
    }
    int64_t i64;
    double d;
    bool has;
    if (!http_get_int(v, "top_k", 0, 1 << 24, &i64, &has, p)) return false;
    if (has) g->sampling.has_top_k = true, g->sampling.top_k = (int32_t)i64;
    if (!http_get_number(v, "min_p", 0, 1, &d, &has, p)) return false;
    if (has) g->sampling.has_min_p = true, g->sampling.min_p = (float)d;
    if (!http_get_number(v, "repeat_penalty", 1e-9, 100, &d, &has, p)) return false;
    if (has) g->sampling.has_repeat_penalty = true, g->sampling.repeat_penalty = (float)d;
    if (!http_get_int(v, "deadline_ms", 1, 86400000, &i64, &has, p)) return false;
    if (has) g->deadline_ms = (uint32_t)i64;
    /* The getters name the inner key alone: say where it is. */
    return true;
}

bool http_set_json_output(hreq *r, core_generate *g, json_t *schema, const char *field,
                          http_problem *p) {
    if (g->constraint && g->constraint[0])
        return http_fail(p, 400, field, "%s cannot be combined with corral.regex", field);
    r->schema_field = field;
    if (!schema) {
        /* policies/json_schema.h: this exact schema means any JSON object. */
        static const char any_object[] = "{\"type\":\"json_object\"}";
        g->json_schema = any_object;
        g->json_schema_len = sizeof any_object - 1;
        return true;
    }
    if (!json_is_object(schema))
        return http_fail(p, 400, field, "%s must be a JSON Schema (an object)", field);
    free(r->schema_text);
    r->schema_text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!r->schema_text) return http_fail(p, 500, field, "out of memory");
    g->json_schema = r->schema_text;
    g->json_schema_len = strlen(r->schema_text);
    return true;
}

void http_now_rfc3339(char *buf, size_t size) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char base[32];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, size, "%s.%06ldZ", base, ts.tv_nsec / 1000);
}

const char *http_finish_reason(core_stop stop) {
    switch (stop) {
        case CORE_STOP_MAX_TOKENS:
        case CORE_STOP_CONTEXT:
            return "length";
        case CORE_STOP_EOG:
        case CORE_STOP_STRING:
        case CORE_STOP_CONSTRAINT:
        case CORE_STOP_CANCELLED:
            break;
    }
    return "stop";
}
