/*
 * front_http_openai.c — the OpenAI-compatible endpoints of the HTTP front end: POST
 * /v1/chat/completions, POST /v1/completions, GET /v1/models and GET /v1/models/{id}.
 *
 * Bodies are read as OpenAI documents them: unknown fields are ignored (clients send fields this
 * server has no use for, such as `user` or `store`), but a field that would change the answer and
 * that corral does not do (n > 1, tools, logit_bias, logprobs, audio, ...) is refused with a 400
 * that names it, rather than silently answered differently. corral's own options travel in the
 * extra object `corral` (front_http_fields.c).
 *
 * Answers: a whole chat.completion / text_completion object, or server-sent events of chunks
 * ending in `data: [DONE]`. Chunks are written straight into the request's output buffer from a
 * fixed prefix and the escaped text, so a streamed token costs no JSON tree. The usage object
 * carries the core's Done figures under usage.corral.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "corral/version.h"
#include "front_http_impl.h"

enum { MAX_MESSAGES = 4096, MAX_TOKENS_LIMIT = 1 << 20 };

/* Fields corral does not do; present with a value other than the neutral one, they are refused. */
static bool refuse_unsupported(json_t *body, http_problem *p) {
    json_t *v;
    if ((v = json_object_get(body, "n")) && !json_is_null(v) &&
        !(json_is_integer(v) && json_integer_value(v) == 1))
        return http_fail(p, 400, "n", "n: only 1 choice per request is supported");
    if ((v = json_object_get(body, "best_of")) && !json_is_null(v) &&
        !(json_is_integer(v) && json_integer_value(v) == 1))
        return http_fail(p, 400, "best_of", "best_of: only 1 is supported");
    static const char *const lists[] = {"tools", "functions"};
    for (size_t i = 0; i < 2; i++)
        if ((v = json_object_get(body, lists[i])) && !json_is_null(v) &&
            !(json_is_array(v) && json_array_size(v) == 0))
            return http_fail(p, 400, lists[i], "%s: tool and function calling is not supported",
                             lists[i]);
    static const char *const calls[] = {"tool_choice", "function_call"};
    for (size_t i = 0; i < 2; i++)
        if ((v = json_object_get(body, calls[i])) && !json_is_null(v) &&
            !(json_is_string(v) && strcmp(json_string_value(v), "none") == 0))
            return http_fail(p, 400, calls[i], "%s: tool and function calling is not supported",
                             calls[i]);
    if ((v = json_object_get(body, "logit_bias")) && !json_is_null(v) &&
        !(json_is_object(v) && json_object_size(v) == 0))
        return http_fail(p, 400, "logit_bias", "logit_bias is not supported");
    if ((v = json_object_get(body, "echo")) && json_is_true(v))
        return http_fail(p, 400, "echo", "echo is not supported");
    if ((v = json_object_get(body, "suffix")) && !json_is_null(v) &&
        !(json_is_string(v) && json_string_length(v) == 0))
        return http_fail(p, 400, "suffix", "suffix (fill-in-the-middle) is not supported");
    if ((v = json_object_get(body, "audio")) && !json_is_null(v))
        return http_fail(p, 400, "audio", "audio output is not supported");
    if ((v = json_object_get(body, "modalities")) && json_is_array(v)) {
        size_t i;
        json_t *m;
        json_array_foreach(v, i,
                           m) if (!json_is_string(m) ||
                                  strcmp(json_string_value(m), "text") !=
                                      0) return http_fail(p, 400, "modalities",
                                                          "modalities: only \"text\" is supported");
    }
    if ((v = json_object_get(body, "prediction")) && !json_is_null(v))
        return http_fail(p, 400, "prediction", "predicted outputs are not supported");
    if ((v = json_object_get(body, "response_format")) && !json_is_null(v)) {
        json_t *type = json_is_object(v) ? json_object_get(v, "type") : NULL;
        if (!json_is_string(type))
            return http_fail(p, 400, "response_format",
                             "response_format must be an object with a type");
        const char *t = json_string_value(type);
        if (strcmp(t, "text") != 0 && strcmp(t, "json_object") != 0 &&
            strcmp(t, "json_schema") != 0)
            return http_fail(p, 400, "response_format.type",
                             "response_format.type must be text, json_object or json_schema");
    }
    return true;
}

/* response_format (its type was checked by refuse_unsupported): json_object is any JSON object,
 * json_schema the schema in json_schema.schema (`strict` or not: the output always matches). */
static bool read_response_format(hreq *r, json_t *v, core_generate *g, http_problem *p) {
    if (!v || json_is_null(v)) return true;
    const char *t = json_string_value(json_object_get(v, "type"));
    if (strcmp(t, "json_object") == 0)
        return http_set_json_output(r, g, NULL, "response_format", p);
    if (strcmp(t, "json_schema") != 0) return true;
    json_t *js = json_object_get(v, "json_schema");
    if (!json_is_object(js))
        return http_fail(p, 400, "response_format.json_schema",
                         "response_format.json_schema must be an object with a schema");
    json_t *schema = json_object_get(js, "schema");
    if (!schema)
        return http_fail(p, 400, "response_format.json_schema.schema",
                         "response_format.json_schema.schema is required");
    return http_set_json_output(r, g, schema, "response_format.json_schema.schema", p);
}

/* What chat and completions share: model, stream, sampling, stop, corral's extras. */
static bool read_common(hreq *r, json_t *body, core_generate *g, http_problem *p) {
    const char *model;
    size_t len;
    if (!http_get_string(body, "model", &model, &len, p)) return false;
    if (!model || !model[0]) return http_fail(p, 400, "model", "model is required");
    if (len >= sizeof r->model || strlen(model) != len)
        return http_fail(p, 400, "model", "model must be a name of at most %zu bytes",
                         sizeof r->model - 1);
    snprintf(r->model, sizeof r->model, "%s", model);
    g->model = model;
    g->session = "";
    g->constraint = "";
    g->sanitizer = "";
    g->template_name = "";
    if (!refuse_unsupported(body, p)) return false;
    if (!http_get_bool(body, "stream", &r->stream, p)) return false;
    g->stream = r->stream;
    json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return http_fail(p, 400, "stream_options", "stream_options must be an object");
        if (!http_get_bool(so, "include_usage", &r->include_usage, p)) return false;
    }
    core_sampling *s = &g->sampling;
    double d;
    int64_t i64;
    bool has;
    if (!http_get_int(body, "max_completion_tokens", 1, MAX_TOKENS_LIMIT, &i64, &has, p))
        return false;
    if (!has && !http_get_int(body, "max_tokens", 1, MAX_TOKENS_LIMIT, &i64, &has, p)) return false;
    if (has) s->has_max_tokens = true, s->max_tokens = (uint32_t)i64;
    if (!http_get_number(body, "temperature", 0, 2, &d, &has, p)) return false;
    if (has) s->has_temperature = true, s->temperature = (float)d;
    if (!http_get_number(body, "top_p", 0, 1, &d, &has, p)) return false;
    if (has) s->has_top_p = true, s->top_p = d > 0 ? (float)d : 1e-9f;
    if (!http_get_number(body, "presence_penalty", -2, 2, &d, &has, p)) return false;
    if (has) s->has_presence_penalty = true, s->presence_penalty = (float)d;
    if (!http_get_number(body, "frequency_penalty", -2, 2, &d, &has, p)) return false;
    if (has) s->has_frequency_penalty = true, s->frequency_penalty = (float)d;
    if (!http_get_int(body, "seed", INT64_MIN, INT64_MAX, &i64, &has, p)) return false;
    if (has) s->has_seed = true, s->seed = (uint64_t)i64;
    if (!http_get_stops(r, json_object_get(body, "stop"), "stop", g, p)) return false;
    /* logprobs: chat takes a boolean and top_logprobs (0-20), completions a number (0-5) of
     * alternatives. */
    if (r->chat) {
        if (!http_get_bool(body, "logprobs", &r->logprobs, p)) return false;
        if (!http_get_int(body, "top_logprobs", 0, 20, &i64, &has, p)) return false;
        if (has && i64 > 0 && !r->logprobs)
            return http_fail(p, 400, "top_logprobs", "top_logprobs needs logprobs: true");
        if (has) r->top_logprobs = (uint32_t)i64;
    } else {
        if (!http_get_int(body, "logprobs", 0, 5, &i64, &has, p)) return false;
        if (has) r->logprobs = true, r->top_logprobs = (uint32_t)i64;
    }
    g->logprobs = r->logprobs;
    g->top_logprobs = r->top_logprobs;
    if (!http_get_corral_extras(json_object_get(body, "corral"), g, p)) return false;
    return read_response_format(r, json_object_get(body, "response_format"), g, p);
}

/* A message's content: a string, or an array of text parts joined (stored back into the body as
 * one string, which then owns it). */
static bool message_text(json_t *msg, size_t i, const char **text, size_t *len, http_problem *p) {
    char param[48];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    json_t *c = json_object_get(msg, "content");
    if (!c || json_is_null(c)) {
        *text = "";
        *len = 0;
        return true;
    }
    if (json_is_string(c)) {
        *text = json_string_value(c);
        *len = json_string_length(c);
        return true;
    }
    if (!json_is_array(c))
        return http_fail(p, 400, param, "%s must be a string or an array of text parts", param);
    size_t total = 0, k;
    json_t *part;
    json_array_foreach(c, k, part) {
        json_t *type = json_object_get(part, "type"), *t = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
            !json_is_string(t))
            return http_fail(p, 400, param,
                             "%s[%zu]: only text parts ({type: \"text\", text}) are supported",
                             param, k);
        total += json_string_length(t);
    }
    char *joined = malloc(total + 1);
    if (!joined) return http_fail(p, 503, NULL, "out of memory");
    size_t at = 0;
    json_array_foreach(c, k, part) {
        json_t *t = json_object_get(part, "text");
        memcpy(joined + at, json_string_value(t), json_string_length(t));
        at += json_string_length(t);
    }
    joined[at] = '\0';
    json_t *s = json_stringn_nocheck(joined, at);
    free(joined);
    if (!s || json_object_set_new(msg, "content", s) != 0)
        return http_fail(p, 503, NULL, "out of memory");
    c = json_object_get(msg, "content");
    *text = json_string_value(c);
    *len = json_string_length(c);
    return true;
}

static const struct {
    const char *given, *role;
} roles[] = {
    {"system", "system"},
    {"developer", "system"},
    {"user", "user"},
    {"assistant", "assistant"},
};

static bool chat_prepare(hreq *r, json_t *body, job *j, http_problem *p) {
    j->req.kind = CORE_GENERATE;
    core_generate *g = &j->req.generate;
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
        snprintf(param, sizeof param, "messages[%zu].role", i);
        json_t *role = json_is_object(m) ? json_object_get(m, "role") : NULL;
        if (!json_is_string(role)) return http_fail(p, 400, param, "%s must be a string", param);
        const char *mapped = NULL;
        for (size_t k = 0; k < sizeof roles / sizeof roles[0] && !mapped; k++)
            if (strcmp(json_string_value(role), roles[k].given) == 0) mapped = roles[k].role;
        if (!mapped)
            return http_fail(p, 400, param,
                             "%s '%s' is not supported (system, developer, user, assistant)", param,
                             json_string_value(role));
        json_t *calls = json_object_get(m, "tool_calls");
        if (calls && !json_is_null(calls) && !(json_is_array(calls) && !json_array_size(calls))) {
            snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
            return http_fail(p, 400, param, "%s: tool calls are not supported", param);
        }
        r->messages[i].role = mapped;
        if (!message_text(m, i, &r->messages[i].content, &r->messages[i].content_len, p))
            return false;
    }
    g->messages = r->messages;
    g->n_messages = n;
    snprintf(r->id, sizeof r->id, "chatcmpl-%llx%llx", (unsigned long long)r->created,
             (unsigned long long)r->started_us & 0xffffffffull);
    return true;
}

static bool completion_prepare(hreq *r, json_t *body, job *j, http_problem *p) {
    j->req.kind = CORE_GENERATE;
    core_generate *g = &j->req.generate;
    if (!read_common(r, body, g, p)) return false;
    json_t *prompt = json_object_get(body, "prompt");
    if (json_is_array(prompt) && json_array_size(prompt) == 1) prompt = json_array_get(prompt, 0);
    if (!json_is_string(prompt))
        return http_fail(p, 400, "prompt",
                         "prompt must be a string (or an array of one string; token arrays and "
                         "batches are not supported)");
    g->prompt = json_string_value(prompt);
    g->prompt_len = json_string_length(prompt);
    snprintf(r->id, sizeof r->id, "cmpl-%llx%llx", (unsigned long long)r->created,
             (unsigned long long)r->started_us & 0xffffffffull);
    return true;
}

/* ---- answers --------------------------------------------------------------------------------- */

/* `{"id":...,"object":...,"created":...,"model":...,"system_fingerprint":...,` */
static void head(hreq *r, const char *object) {
    hbuf_printf(&r->out, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":\"", r->id,
                object, (long long)r->created);
    hbuf_json_escape(&r->out, r->model, strlen(r->model));
    hbuf_puts(&r->out, "\",\"system_fingerprint\":\"corral-" CORRAL_VERSION "\",");
}

static void usage(hreq *r) {
    const core_done *d = &r->j->done;
    hbuf_printf(&r->out,
                "\"usage\":{\"prompt_tokens\":%u,\"completion_tokens\":%u,\"total_tokens\":%u,"
                "\"prompt_tokens_details\":{\"cached_tokens\":%u},\"corral\":{\"queue_us\":%lld,"
                "\"load_us\":%lld,\"prefill_us\":%lld,\"decode_us\":%lld,\"total_us\":%lld,"
                "\"queue_steps\":%u,\"prefilled_tokens\":%u,\"sanitizer_report\":",
                d->prompt_tokens, d->generated_tokens, d->prompt_tokens + d->generated_tokens,
                d->prompt_tokens > d->prefilled_tokens ? d->prompt_tokens - d->prefilled_tokens : 0,
                (long long)d->queue_us, (long long)d->load_us, (long long)d->prefill_us,
                (long long)d->decode_us, (long long)d->total_us, d->queue_steps,
                d->prefilled_tokens);
    if (d->sanitizer_report) {
        hbuf_puts(&r->out, "\"");
        hbuf_json_escape(&r->out, d->sanitizer_report, strlen(d->sanitizer_report));
        hbuf_puts(&r->out, "\"");
    } else {
        hbuf_puts(&r->out, "null");
    }
    hbuf_puts(&r->out, "}}");
}

/* ---- log-probabilities ---------------------------------------------------------------------- */

static void put_logprob(hbuf *b, float lp) {
    hbuf_printf(b, "%.6g", isfinite(lp) ? (double)lp : -9999.0);
}

/* `"token":"...","logprob":x,"bytes":[...]` of one entry. */
static void put_token(hbuf *b, const job_text *t, const job_logprob *e) {
    const char *text = t->lp_text + e->text_off;
    hbuf_puts(b, "\"token\":\"");
    hbuf_json_escape(b, text, e->text_len);
    hbuf_puts(b, "\",\"logprob\":");
    put_logprob(b, e->logprob);
    hbuf_puts(b, ",\"bytes\":[");
    for (uint32_t i = 0; i < e->text_len; i++) hbuf_printf(b, i ? ",%u" : "%u", (uint8_t)text[i]);
    hbuf_puts(b, "]");
}

/* The logprobs of the tokens in t: chat's {"content": [...]}, or completions' {tokens,
 * token_logprobs, top_logprobs, text_offset}; "null" when none were asked for (or the entries do
 * not line up with the ids, which cannot happen). */
static void put_logprobs(hreq *r, const job_text *t) {
    const size_t stride = 1 + r->top_logprobs;
    hbuf *b = &r->out;
    if (!r->logprobs || t->n_lps != t->n_ids * stride) {
        hbuf_puts(b, "null");
        return;
    }
    if (r->chat) {
        hbuf_puts(b, "{\"content\":[");
        for (size_t i = 0; i < t->n_ids; i++) {
            const job_logprob *e = &t->lps[i * stride];
            hbuf_puts(b, i ? ",{" : "{");
            put_token(b, t, e);
            hbuf_puts(b, ",\"top_logprobs\":[");
            for (size_t k = 1; k < stride; k++) {
                hbuf_puts(b, k > 1 ? ",{" : "{");
                put_token(b, t, &e[k]);
                hbuf_puts(b, "}");
            }
            hbuf_puts(b, "]}");
        }
        hbuf_puts(b, "],\"refusal\":null}");
        return;
    }
    hbuf_puts(b, "{\"tokens\":[");
    for (size_t i = 0; i < t->n_ids; i++) {
        const job_logprob *e = &t->lps[i * stride];
        hbuf_puts(b, i ? ",\"" : "\"");
        hbuf_json_escape(b, t->lp_text + e->text_off, e->text_len);
        hbuf_puts(b, "\"");
    }
    hbuf_puts(b, "],\"token_logprobs\":[");
    for (size_t i = 0; i < t->n_ids; i++) {
        if (i) hbuf_puts(b, ",");
        put_logprob(b, t->lps[i * stride].logprob);
    }
    hbuf_puts(b, "],\"top_logprobs\":[");
    for (size_t i = 0; i < t->n_ids; i++) {
        hbuf_puts(b, i ? ",{" : "{");
        for (size_t k = 1; k < stride; k++) {
            const job_logprob *e = &t->lps[i * stride + k];
            hbuf_puts(b, k > 1 ? ",\"" : "\"");
            hbuf_json_escape(b, t->lp_text + e->text_off, e->text_len);
            hbuf_puts(b, "\":");
            put_logprob(b, e->logprob);
        }
        hbuf_puts(b, "}");
    }
    hbuf_puts(b, "],\"text_offset\":[");
    for (size_t i = 0; i < t->n_ids; i++) {
        hbuf_printf(b, i ? ",%llu" : "%llu", (unsigned long long)r->text_offset);
        r->text_offset += t->lps[i * stride].text_len;
    }
    hbuf_puts(b, "]}");
}

/* One SSE chunk: `delta` is written by the caller between the two halves. */
static void chunk_begin(hreq *r) {
    hbuf_puts(&r->out, "data: ");
    head(r, r->chat ? "chat.completion.chunk" : "text_completion");
    hbuf_puts(&r->out, "\"choices\":[{\"index\":0,");
}

static void chunk_end(hreq *r, const job_text *t, const char *finish_reason) {
    hbuf_puts(&r->out, ",\"logprobs\":");
    if (t)
        put_logprobs(r, t);
    else
        hbuf_puts(&r->out, "null");
    hbuf_puts(&r->out, ",\"finish_reason\":");
    if (finish_reason)
        hbuf_printf(&r->out, "\"%s\"", finish_reason);
    else
        hbuf_puts(&r->out, "null");
    hbuf_puts(&r->out, "}]");
    if (r->include_usage) hbuf_puts(&r->out, ",\"usage\":null");
    hbuf_puts(&r->out, "}\n\n");
}

/* The first chunk of a chat stream names the role. */
static void chat_role_chunk(hreq *r) {
    chunk_begin(r);
    hbuf_puts(&r->out, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}");
    chunk_end(r, NULL, NULL);
}

static void stream_chunk(hreq *r, const char *text, size_t len) {
    if (!r->started && r->chat) chat_role_chunk(r);
    if (!len && !(r->logprobs && r->text.n_ids)) return;
    chunk_begin(r);
    hbuf_puts(&r->out, r->chat ? "\"delta\":{\"content\":\"" : "\"text\":\"");
    http_escape_stream_text(r, text, len, false);
    hbuf_puts(&r->out, r->chat ? "\"}" : "\"");
    chunk_end(r, &r->text, NULL);
}

static void generate_finish(hreq *r) {
    const char *reason = http_finish_reason(r->j->done.stop);
    if (r->stream) {
        if (!r->started && r->chat) chat_role_chunk(r);
        chunk_begin(r);
        hbuf_puts(&r->out, r->chat ? "\"delta\":{\"content\":\"" : "\"text\":\"");
        http_escape_stream_text(r, "", 0, true); /* a cut character at the very end */
        hbuf_puts(&r->out, r->chat ? "\"}" : "\"");
        chunk_end(r, NULL, reason);
        if (r->include_usage) {
            hbuf_puts(&r->out, "data: ");
            head(r, r->chat ? "chat.completion.chunk" : "text_completion");
            hbuf_puts(&r->out, "\"choices\":[],");
            usage(r);
            hbuf_puts(&r->out, "}\n\n");
        }
        hbuf_puts(&r->out, "data: [DONE]\n\n");
        return;
    }
    r->status = 200;
    head(r, r->chat ? "chat.completion" : "text_completion");
    hbuf_puts(&r->out, r->chat ? "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                                 "\"content\":\""
                               : "\"choices\":[{\"index\":0,\"text\":\"");
    http_escape_stream_text(r, r->text.text, r->text.len, true);
    hbuf_puts(&r->out, r->chat ? "\",\"refusal\":null},\"logprobs\":" : "\",\"logprobs\":");
    put_logprobs(r, &r->text);
    hbuf_printf(&r->out, ",\"finish_reason\":\"%s\"}],", reason);
    usage(r);
    hbuf_puts(&r->out, "}");
}

/* ---- models ---------------------------------------------------------------------------------- */

static const char *const state_names[] = {
    [CORE_MODEL_UNLOADED] = "unloaded",
    [CORE_MODEL_LOADING] = "loading",
    [CORE_MODEL_RESIDENT] = "resident",
    [CORE_MODEL_SWAPPED] = "swapped",
};

static bool models_prepare(hreq *r, json_t *body, job *j, http_problem *p) {
    (void)body, (void)p, (void)r;
    j->req.kind = CORE_LIST_MODELS;
    return true;
}

static void model_object(hreq *r, const core_model_info *m) {
    hbuf_puts(&r->out, "{\"id\":\"");
    hbuf_json_escape(&r->out, m->name, strlen(m->name));
    hbuf_printf(&r->out,
                "\",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"corral\","
                "\"corral\":{\"state\":\"%s\",\"pinned\":%s,\"context\":%u,\"arch\":\"",
                (long long)r->created,
                m->state >= CORE_MODEL_UNLOADED && m->state <= CORE_MODEL_SWAPPED
                    ? state_names[m->state]
                    : "unknown",
                m->pinned ? "true" : "false", m->context);
    hbuf_json_escape(&r->out, m->arch, strlen(m->arch));
    hbuf_puts(&r->out, "\",\"chat_template\":\"");
    hbuf_json_escape(&r->out, m->chat_template, strlen(m->chat_template));
    hbuf_puts(&r->out, "\"}}");
}

static void models_finish(hreq *r) {
    const core_reply *reply = r->j->reply;
    r->status = 200;
    const char *one = strncmp(r->path, "/v1/models/", 11) == 0 ? r->path + 11 : NULL;
    if (one) {
        for (size_t i = 0; i < reply->n_models; i++)
            if (strcmp(reply->models[i].name, one) == 0) {
                model_object(r, &reply->models[i]);
                return;
            }
        char message[256];
        snprintf(message, sizeof message, "The model '%.200s' does not exist", one);
        r->status = 404;
        http_write_error(&r->out, false, CORRAL_NOT_FOUND, "model", message);
        return;
    }
    hbuf_puts(&r->out, "{\"object\":\"list\",\"data\":[");
    for (size_t i = 0; i < reply->n_models; i++) {
        if (i) hbuf_puts(&r->out, ",");
        model_object(r, &reply->models[i]);
    }
    hbuf_puts(&r->out, "]}");
}

const http_route http_openai_routes[] = {
    {.method = "POST",
     .path = "/v1/chat/completions",
     .prepare = chat_prepare,
     .chunk = stream_chunk,
     .finish = generate_finish},
    {.method = "POST",
     .path = "/v1/completions",
     .prepare = completion_prepare,
     .chunk = stream_chunk,
     .finish = generate_finish},
    {.method = "GET",
     .path = "/v1/models",
     .prepare = models_prepare,
     .finish = models_finish},
    {.method = "GET",
     .path = "/v1/models/",
     .prefix = true,
     .prepare = models_prepare,
     .finish = models_finish},
    {0},
};
