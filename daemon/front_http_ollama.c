/*
 * front_http_ollama.c — the Ollama-compatible endpoints of the HTTP front end, so that Ollama's
 * clients work unchanged: POST /api/generate, POST /api/chat (NDJSON streams, streamed unless
 * `stream: false`, as Ollama does), GET /api/tags, GET /api/ps, POST /api/show, GET /api/version.
 *
 * keep_alive maps onto corral's residency instead of a timer per model: a negative duration pins
 * the model (never evicted), 0 unloads it once the request is done, a positive one unpins it (it
 * stays until memory is needed or its configured ttl_ms runs out). The change is made before the
 * answer's last line, so /api/ps asked next shows it. A generate without a prompt only loads (or,
 * with keep_alive 0, unloads) the model, as in Ollama.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "corral/version.h"
#include "front_http_impl.h"

enum { MAX_MESSAGES = 4096 };

/* keep_alive: a number of seconds, or a duration string ("5m", "1h30m", "-1", "0"); only its
 * sign matters here. */
static bool read_keep_alive(hreq *r, json_t *body, http_problem *p) {
    json_t *v = json_object_get(body, "keep_alive");
    if (!v || json_is_null(v)) return true;
    double sign;
    if (json_is_number(v)) {
        sign = json_number_value(v);
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        const char *at = s;
        bool negative = false;
        if (*at == '-' || *at == '+') negative = *at++ == '-';
        double total = 0;
        bool any = false;
        while (*at) {
            char *end;
            const double x = strtod(at, &end);
            if (end == at || x < 0)
                return http_fail(p, 400, "keep_alive", "keep_alive '%s' is not a duration", s);
            at = end;
            static const struct {
                const char *unit;
                double seconds;
            } units[] = {{"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9},
                         {"h", 3600},  {"m", 60},    {"s", 1}};
            double scale = 1;
            bool unit = false;
            for (size_t i = 0; i < sizeof units / sizeof units[0] && !unit; i++) {
                const size_t n = strlen(units[i].unit);
                if (strncmp(at, units[i].unit, n) == 0) {
                    scale = units[i].seconds;
                    at += n;
                    unit = true;
                }
            }
            if (!unit && *at)
                return http_fail(p, 400, "keep_alive", "keep_alive '%s' is not a duration", s);
            total += x * scale;
            any = true;
        }
        if (!any) return http_fail(p, 400, "keep_alive", "keep_alive '%s' is not a duration", s);
        sign = negative ? -total : total;
    } else {
        return http_fail(p, 400, "keep_alive", "keep_alive must be a number or a duration");
    }
    r->residency = sign < 0    ? HTTP_RESIDENCY_PIN
                   : sign == 0 ? HTTP_RESIDENCY_UNLOAD
                               : HTTP_RESIDENCY_UNPIN;
    return true;
}

/* Ollama's `options`: the sampling ones corral has; the others (num_ctx, num_gpu, ...) are
 * settings of Ollama's runner and are ignored, as Ollama ignores options it does not know. */
static bool read_options(hreq *r, json_t *o, core_generate *g, http_problem *p) {
    if (!o || json_is_null(o)) return true;
    if (!json_is_object(o)) return http_fail(p, 400, "options", "options must be an object");
    core_sampling *s = &g->sampling;
    double d;
    int64_t i64;
    bool has;
    if (!http_get_int(o, "num_predict", -2, 1 << 20, &i64, &has, p)) return false;
    if (has && i64 > 0) s->has_max_tokens = true, s->max_tokens = (uint32_t)i64;
    if (!http_get_number(o, "temperature", 0, 100, &d, &has, p)) return false;
    if (has) s->has_temperature = true, s->temperature = (float)d;
    if (!http_get_int(o, "top_k", 0, 1 << 24, &i64, &has, p)) return false;
    if (has) s->has_top_k = true, s->top_k = (int32_t)i64;
    if (!http_get_number(o, "top_p", 0, 1, &d, &has, p)) return false;
    if (has) s->has_top_p = true, s->top_p = d > 0 ? (float)d : 1e-9f;
    if (!http_get_number(o, "min_p", 0, 1, &d, &has, p)) return false;
    if (has) s->has_min_p = true, s->min_p = (float)d;
    if (!http_get_number(o, "repeat_penalty", 1e-9, 100, &d, &has, p)) return false;
    if (has) s->has_repeat_penalty = true, s->repeat_penalty = (float)d;
    if (!http_get_number(o, "presence_penalty", -100, 100, &d, &has, p)) return false;
    if (has) s->has_presence_penalty = true, s->presence_penalty = (float)d;
    if (!http_get_number(o, "frequency_penalty", -100, 100, &d, &has, p)) return false;
    if (has) s->has_frequency_penalty = true, s->frequency_penalty = (float)d;
    if (!http_get_int(o, "repeat_last_n", 0, 65536, &i64, &has, p)) return false;
    if (has) s->has_penalty_last_n = true, s->penalty_last_n = (int32_t)i64;
    if (!http_get_int(o, "seed", INT64_MIN, INT64_MAX, &i64, &has, p)) return false;
    if (has) s->has_seed = true, s->seed = (uint64_t)i64;
    return http_get_stops(r, json_object_get(o, "stop"), "options.stop", g, p);
}

static bool refuse_unsupported(json_t *body, http_problem *p) {
    json_t *v;
    if ((v = json_object_get(body, "format")) && json_is_string(v) && json_string_length(v) &&
        strcmp(json_string_value(v), "json") != 0)
        return http_fail(p, 400, "format", "format must be \"json\" or a JSON Schema object");
    static const char *const lists[] = {"images", "tools", "context"};
    for (size_t i = 0; i < 3; i++)
        if ((v = json_object_get(body, lists[i])) && !json_is_null(v) &&
            !(json_is_array(v) && json_array_size(v) == 0))
            return http_fail(p, 400, lists[i], "%s is not supported%s", lists[i],
                             i == 2 ? " (corral keeps conversations in sessions: corral.session)"
                                    : "");
    if ((v = json_object_get(body, "suffix")) && json_is_string(v) && json_string_length(v))
        return http_fail(p, 400, "suffix", "suffix (fill-in-the-middle) is not supported");
    if ((v = json_object_get(body, "template")) && json_is_string(v) && json_string_length(v))
        return http_fail(p, 400, "template",
                         "Go templates are not supported (corral.template names a built-in one)");
    return true;
}

static bool read_common(hreq *r, json_t *body, core_generate *g, http_problem *p) {
    r->ollama = true;
    const char *model;
    size_t len;
    if (!http_get_string(body, "model", &model, &len, p)) return false;
    if (!model || !model[0]) return http_fail(p, 400, "model", "model is required");
    if (len >= sizeof r->model || strlen(model) != len)
        return http_fail(p, 400, "model", "model must be a name of at most %zu bytes",
                         sizeof r->model - 1);
    snprintf(r->model, sizeof r->model, "%s", model);
    g->model = r->model;
    g->session = "";
    g->constraint = "";
    g->sanitizer = "";
    g->template_name = "";
    if (!refuse_unsupported(body, p)) return false;
    r->stream = true; /* Ollama streams unless told not to */
    if (!http_get_bool(body, "stream", &r->stream, p)) return false;
    g->stream = r->stream;
    if (!read_keep_alive(r, body, p)) return false;
    if (!read_options(r, json_object_get(body, "options"), g, p)) return false;
    if (!http_get_corral_extras(json_object_get(body, "corral"), g, p)) return false;
    /* format: "json" (any JSON object) or a JSON Schema. */
    json_t *format = json_object_get(body, "format");
    if (json_is_string(format) && json_string_length(format))
        return http_set_json_output(r, g, NULL, "format", p);
    if (format && !json_is_null(format) && !json_is_string(format))
        return http_set_json_output(r, g, format, "format", p);
    return true;
}

static bool generate_prepare(hreq *r, json_t *body, job *j, http_problem *p) {
    core_generate *g = &j->req.generate;
    j->req.kind = CORE_GENERATE;
    if (!read_common(r, body, g, p)) return false;
    const char *prompt, *system;
    size_t prompt_len, system_len;
    bool raw = false;
    if (!http_get_string(body, "prompt", &prompt, &prompt_len, p) ||
        !http_get_string(body, "system", &system, &system_len, p) ||
        !http_get_bool(body, "raw", &raw, p))
        return false;
    if (!prompt || !prompt_len) {
        /* Load, or unload with keep_alive 0. */
        r->residency_only = true;
        const bool unload = r->residency == HTTP_RESIDENCY_UNLOAD;
        memset(&j->req, 0, sizeof j->req);
        j->req.kind = unload ? CORE_UNLOAD : CORE_LOAD;
        j->req.target.model = r->model;
        j->req.target.force = true; /* keep_alive 0 undoes a pin made by keep_alive -1 */
        if (unload) r->residency = HTTP_RESIDENCY_NONE;
        r->stream = false;
        return true;
    }
    if (raw) {
        g->prompt = prompt;
        g->prompt_len = prompt_len;
        return true;
    }
    r->messages = calloc(2, sizeof *r->messages);
    if (!r->messages) return http_fail(p, 503, NULL, "out of memory");
    size_t n = 0;
    if (system && system_len)
        r->messages[n++] =
            (core_message){.role = "system", .content = system, .content_len = system_len};
    r->messages[n++] = (core_message){.role = "user", .content = prompt, .content_len = prompt_len};
    g->messages = r->messages;
    g->n_messages = n;
    return true;
}

static bool chat_prepare(hreq *r, json_t *body, job *j, http_problem *p) {
    core_generate *g = &j->req.generate;
    j->req.kind = CORE_GENERATE;
    r->chat = true;
    if (!read_common(r, body, g, p)) return false;
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return http_fail(p, 400, "messages", "messages must be a non-empty array");
    const size_t n = json_array_size(msgs);
    if (n > MAX_MESSAGES)
        return http_fail(p, 400, "messages", "messages: at most %d", MAX_MESSAGES);
    r->messages = calloc(n, sizeof *r->messages);
    if (!r->messages) return http_fail(p, 503, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i);
        char param[48];
        snprintf(param, sizeof param, "messages[%zu]", i);
        json_t *role = json_is_object(m) ? json_object_get(m, "role") : NULL;
        json_t *content = json_is_object(m) ? json_object_get(m, "content") : NULL;
        if (!json_is_string(role) ||
            (content && !json_is_null(content) && !json_is_string(content)))
            return http_fail(p, 400, param, "%s must have a role and a string content", param);
        const char *rs = json_string_value(role);
        if (strcmp(rs, "system") != 0 && strcmp(rs, "user") != 0 && strcmp(rs, "assistant") != 0)
            return http_fail(p, 400, param,
                             "%s: role '%s' is not supported (system, user, "
                             "assistant)",
                             param, rs);
        json_t *images = json_object_get(m, "images");
        if (images && json_is_array(images) && json_array_size(images))
            return http_fail(p, 400, param, "%s: images are not supported", param);
        r->messages[i].role = rs;
        r->messages[i].content = json_is_string(content) ? json_string_value(content) : "";
        r->messages[i].content_len = json_is_string(content) ? json_string_length(content) : 0;
    }
    g->messages = r->messages;
    g->n_messages = n;
    return true;
}

/* ---- answers --------------------------------------------------------------------------------- */

static void line_head(hreq *r) {
    char now[48];
    http_now_rfc3339(now, sizeof now);
    hbuf_puts(&r->out, "{\"model\":\"");
    hbuf_json_escape(&r->out, r->model, strlen(r->model));
    hbuf_printf(&r->out, "\",\"created_at\":\"%s\",", now);
}

static void stream_chunk(hreq *r, const char *text, size_t len) {
    if (!len) return;
    line_head(r);
    hbuf_puts(&r->out,
              r->chat ? "\"message\":{\"role\":\"assistant\",\"content\":\"" : "\"response\":\"");
    http_escape_stream_text(r, text, len, false);
    hbuf_puts(&r->out, r->chat ? "\"},\"done\":false}\n" : "\",\"done\":false}\n");
}

static void generate_finish(hreq *r) {
    r->status = 200;
    line_head(r);
    if (r->residency_only) {
        hbuf_printf(&r->out, "\"response\":\"\",\"done\":true,\"done_reason\":\"%s\"}",
                    r->j->req.kind == CORE_UNLOAD ? "unload" : "load");
        return;
    }
    const core_done *d = &r->j->done;
    hbuf_puts(&r->out,
              r->chat ? "\"message\":{\"role\":\"assistant\",\"content\":\"" : "\"response\":\"");
    if (r->stream)
        http_escape_stream_text(r, "", 0, true);
    else
        http_escape_stream_text(r, r->text.text, r->text.len, true);
    hbuf_puts(&r->out, r->chat ? "\"}," : "\",");
    hbuf_printf(&r->out,
                "\"done\":true,\"done_reason\":\"%s\",\"total_duration\":%lld,"
                "\"load_duration\":%lld,\"prompt_eval_count\":%u,\"prompt_eval_duration\":%lld,"
                "\"eval_count\":%u,\"eval_duration\":%lld}",
                http_finish_reason(d->stop), (long long)d->total_us * 1000,
                (long long)d->load_us * 1000, d->prompt_tokens, (long long)d->prefill_us * 1000,
                d->generated_tokens, (long long)d->decode_us * 1000);
    if (r->stream) hbuf_puts(&r->out, "\n");
}

/* ---- models ---------------------------------------------------------------------------------- */

static bool list_prepare(hreq *r, json_t *body, job *j, http_problem *p) {
    (void)body, (void)p;
    r->ollama = true;
    j->req.kind = CORE_STATUS;
    j->req.target.model = "";
    return true;
}

static void details(hreq *r, const core_model_info *m) {
    hbuf_puts(&r->out, "\"details\":{\"parent_model\":\"\",\"format\":\"gguf\",\"family\":\"");
    hbuf_json_escape(&r->out, m->arch, strlen(m->arch));
    hbuf_puts(&r->out, "\",\"families\":[\"");
    hbuf_json_escape(&r->out, m->arch, strlen(m->arch));
    hbuf_puts(&r->out, "\"],\"parameter_size\":\"\",\"quantization_level\":\"\"}");
}

static void rfc3339_of(time_t t, char *buf, size_t size) {
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static void model_head(hreq *r, const core_model_info *m) {
    hbuf_puts(&r->out, "{\"name\":\"");
    hbuf_json_escape(&r->out, m->name, strlen(m->name));
    hbuf_puts(&r->out, "\",\"model\":\"");
    hbuf_json_escape(&r->out, m->name, strlen(m->name));
    hbuf_puts(&r->out, "\",\"digest\":\"\",");
    details(r, m);
}

static void tags_finish(hreq *r) {
    const core_reply *reply = r->j->reply;
    r->status = 200;
    hbuf_puts(&r->out, "{\"models\":[");
    for (size_t i = 0; i < reply->n_models; i++) {
        const core_model_info *m = &reply->models[i];
        struct stat st;
        const bool have = stat(m->path, &st) == 0;
        char when[32];
        rfc3339_of(have ? st.st_mtime : 0, when, sizeof when);
        if (i) hbuf_puts(&r->out, ",");
        model_head(r, m);
        hbuf_printf(&r->out, ",\"size\":%lld,\"modified_at\":\"%s\"}",
                    have ? (long long)st.st_size : 0LL, when);
    }
    hbuf_puts(&r->out, "]}");
}

static void ps_finish(hreq *r) {
    const core_reply *reply = r->j->reply;
    r->status = 200;
    hbuf_puts(&r->out, "{\"models\":[");
    bool first = true;
    const time_t now = time(NULL);
    for (size_t i = 0; i < reply->n_models; i++) {
        const core_model_info *m = &reply->models[i];
        if (m->state != CORE_MODEL_RESIDENT && m->state != CORE_MODEL_LOADING) continue;
        /* Until when it stays: pinned or without a ttl, as long as memory allows. */
        char until[32];
        if (m->pinned || m->ttl_ms == 0) {
            snprintf(until, sizeof until, "9999-12-31T23:59:59Z");
        } else {
            const uint64_t idle = reply->daemon.uptime_ms > m->last_used_ms
                                      ? reply->daemon.uptime_ms - m->last_used_ms
                                      : 0;
            const int64_t left = idle < m->ttl_ms ? (int64_t)(m->ttl_ms - idle) / 1000 : 0;
            rfc3339_of(now + (time_t)left, until, sizeof until);
        }
        if (!first) hbuf_puts(&r->out, ",");
        first = false;
        model_head(r, m);
        hbuf_printf(&r->out,
                    ",\"size\":%llu,\"size_vram\":0,\"expires_at\":\"%s\","
                    "\"corral\":{\"pinned\":%s,\"state\":\"%s\"}}",
                    (unsigned long long)m->bytes, until, m->pinned ? "true" : "false",
                    m->state == CORE_MODEL_RESIDENT ? "resident" : "loading");
    }
    hbuf_puts(&r->out, "]}");
}

static bool show_prepare(hreq *r, json_t *body, job *j, http_problem *p) {
    r->ollama = true;
    const char *model;
    size_t len;
    if (!http_get_string(body, "model", &model, &len, p)) return false;
    if (!model && !http_get_string(body, "name", &model, &len, p)) return false;
    if (!model || !model[0]) return http_fail(p, 400, "model", "model is required");
    if (len >= sizeof r->model) return http_fail(p, 400, "model", "model name too long");
    snprintf(r->model, sizeof r->model, "%s", model);
    j->req.kind = CORE_LIST_MODELS;
    return true;
}

static void show_finish(hreq *r) {
    const core_reply *reply = r->j->reply;
    for (size_t i = 0; i < reply->n_models; i++) {
        const core_model_info *m = &reply->models[i];
        if (strcmp(m->name, r->model) != 0) continue;
        r->status = 200;
        hbuf_puts(&r->out, "{\"modelfile\":\"\",\"parameters\":\"\",\"template\":\"");
        hbuf_json_escape(&r->out, m->chat_template, strlen(m->chat_template));
        hbuf_puts(&r->out, "\",");
        details(r, m);
        hbuf_puts(&r->out, ",\"model_info\":{\"general.architecture\":\"");
        hbuf_json_escape(&r->out, m->arch, strlen(m->arch));
        hbuf_puts(&r->out, "\",\"");
        hbuf_json_escape(&r->out, m->arch[0] ? m->arch : "model",
                         strlen(m->arch[0] ? m->arch : "model"));
        hbuf_printf(&r->out, ".context_length\":%u},\"capabilities\":[\"completion\"]}",
                    m->context);
        return;
    }
    char message[256];
    snprintf(message, sizeof message, "model '%.200s' not found", r->model);
    r->status = 404;
    http_write_error(&r->out, true, CORRAL_NOT_FOUND, NULL, message);
}

static bool version_prepare(hreq *r, json_t *body, job *j, http_problem *p) {
    (void)body, (void)j, (void)p;
    r->ollama = true;
    r->status = 200;
    hbuf_puts(&r->out, "{\"version\":\"" CORRAL_VERSION "\"}");
    r->finished = true;
    return true;
}

const http_route http_ollama_routes[] = {
    {.method = "POST",
     .path = "/api/generate",
     .ollama = true,
     .prepare = generate_prepare,
     .chunk = stream_chunk,
     .finish = generate_finish},
    {.method = "POST",
     .path = "/api/chat",
     .ollama = true,
     .prepare = chat_prepare,
     .chunk = stream_chunk,
     .finish = generate_finish},
    {.method = "GET",
     .path = "/api/tags",
     .ollama = true,
     .prepare = list_prepare,
     .finish = tags_finish},
    {.method = "GET",
     .path = "/api/ps",
     .ollama = true,
     .prepare = list_prepare,
     .finish = ps_finish},
    {.method = "POST",
     .path = "/api/show",
     .ollama = true,
     .prepare = show_prepare,
     .finish = show_finish},
    {.method = "GET",
     .path = "/api/version",
     .ollama = true,
     .prepare = version_prepare,
     .finish = NULL},
    {0},
};
