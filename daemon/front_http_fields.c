/*
 * front_http_fields.c — reading the fields of an HTTP request body (jansson) into corral's core
 * request, for both APIs: typed getters that name the field at fault, stop strings, corral's own
 * extras, and the small conversions both APIs' answers need (finish reasons, timestamps).
 *
 * Every check here is on untrusted input: a wrong type or a value out of range is a 400 naming
 * the field, never an assertion.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "front_http_impl.h"

enum { HTTP_MAX_STOPS = 16, HTTP_STOP_MAX_BYTES = 256 };

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
