/*
 * fuzz_http.c — the HTTP front end's request bodies (daemon/front_http_fields.c,
 * front_http_openai.c, front_http_ollama.c) on arbitrary bytes: the first byte picks the endpoint,
 * the rest is the body, checked and parsed as front_http.c does (UTF-8, then jansson); then the
 * endpoint's translation into a core request, and its answers: the body's bytes streamed as
 * generated text (ill-formed UTF-8 included) and the end of the answer.
 *
 * Invariants: a refused body is a 400 (or 503 when memory runs out) whose error body parses as
 * JSON; an accepted one is a core request within the limits the core relies on (a model name of
 * at most 127 bytes, at most 16 stop strings, a prompt or messages, sampling values in range);
 * every answer — a whole JSON body, every server-sent event, every NDJSON line — parses as JSON,
 * and streamed text comes back as the bytes sent (ill-formed sequences as U+FFFD).
 */
#include <jansson.h>
#include <math.h>

#include "corral/utf8.h"
#include "front_http_impl.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    return 0;
}

static const http_route *body_routes[8];
static size_t n_body_routes;

static void collect_routes(void) {
    if (n_body_routes) return;
    const http_route *const tables[] = {http_openai_routes, http_ollama_routes};
    for (size_t t = 0; t < 2; t++)
        for (const http_route *r = tables[t]; r->method; r++)
            if (strcmp(r->method, "POST") == 0) body_routes[n_body_routes++] = r;
}

static void check_json(const char *text, size_t len, const char *what) {
    json_error_t jerr;
    json_t *v = json_loadb(text, len, JSON_ALLOW_NUL, &jerr);
    FUZZ_CHECK(v != NULL, "%s is not JSON (%s): %.*s", what, jerr.text,
               (int)(len > 300 ? 300 : len), text);
    json_decref(v);
}

/* Every event or line of a stream's output parses; [DONE] only last. */
static void check_stream(const hreq *r) {
    const char *p = r->out.data ? r->out.data : "";
    const char *end = p + r->out.len;
    while (p < end) {
        const char *sep = r->ollama ? memchr(p, '\n', (size_t)(end - p))
                                    : memmem(p, (size_t)(end - p), "\n\n", 2);
        FUZZ_CHECK(sep != NULL, "an unterminated %s", r->ollama ? "line" : "event");
        if (r->ollama) {
            check_json(p, (size_t)(sep - p), "an NDJSON line");
            p = sep + 1;
            continue;
        }
        FUZZ_CHECK(strncmp(p, "data: ", 6) == 0, "an event without data: %.20s", p);
        if (strncmp(p, "data: [DONE]\n\n", 14) == 0)
            FUZZ_CHECK(sep + 2 == end, "events after [DONE]");
        else
            check_json(p + 6, (size_t)(sep - p - 6), "an event");
        p = sep + 2;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    collect_routes();
    if (size < 1) return 0;
    const http_route *route = body_routes[data[0] % n_body_routes];
    const char *body_text = (const char *)data + 1;
    const size_t body_len = size - 1;
    if (utf8_validate((const uint8_t *)body_text, body_len) != body_len) return 0;
    json_error_t jerr;
    json_t *body = json_loadb(body_text, body_len, JSON_ALLOW_NUL, &jerr);
    if (!body) return 0;
    if (!json_is_object(body)) {
        json_decref(body);
        return 0;
    }
    hreq *r = calloc(1, sizeof *r);
    job *j = calloc(1, sizeof *j);
    FUZZ_CHECK(r && j, "out of memory");
    r->route = route;
    r->doc = body;
    r->created = 1;
    snprintf(r->path, sizeof r->path, "%s", route->path);
    http_problem p = {0};
    if (!route->prepare(r, body, j, &p)) {
        FUZZ_CHECK(p.status == 400 || p.status == 503, "refused with %u", p.status);
        FUZZ_CHECK(p.message[0], "a refusal without a message");
        http_write_error(&r->out, route->ollama, p.code, p.param, p.message);
        check_json(r->out.data, r->out.len, "an error body");
        goto done;
    }
    if (j->req.kind != CORE_GENERATE) goto done; /* Ollama's load/unload and show */
    const core_generate *g = &j->req.generate;
    FUZZ_CHECK(g->model && g->model[0] && strlen(g->model) < 128, "model");
    FUZZ_CHECK(g->n_stop <= 16, "%zu stop strings", g->n_stop);
    for (size_t i = 0; i < g->n_stop; i++) FUZZ_CHECK(g->stop[i] && g->stop[i][0], "stop %zu", i);
    FUZZ_CHECK((g->prompt != NULL) != (g->n_messages > 0), "a prompt xor messages");
    for (size_t i = 0; i < g->n_messages; i++)
        FUZZ_CHECK(g->messages[i].role && g->messages[i].content, "message %zu", i);
    FUZZ_CHECK(g->session && g->constraint && g->sanitizer && g->template_name, "strings");
    const core_sampling *s = &g->sampling;
    FUZZ_CHECK(!s->has_temperature || (s->temperature >= 0 && s->temperature <= 100), "temp");
    FUZZ_CHECK(!s->has_top_p || (s->top_p > 0 && s->top_p <= 1), "top_p %g", s->top_p);
    FUZZ_CHECK(!s->has_max_tokens || s->max_tokens >= 1, "max_tokens");
    FUZZ_CHECK(g->top_logprobs <= 20, "top_logprobs");

    /* The answer: the body's bytes as the generated text, in two pieces when streamed. */
    char *text = fuzz_strdup(data, size);
    r->j = j;
    r->text = (job_text){.text = text, .len = size};
    j->final = JOB_FINAL_DONE;
    j->done = (core_done){.stop = CORE_STOP_MAX_TOKENS, .prompt_tokens = 3, .generated_tokens = 2};
    if (r->stream) {
        const size_t half = size / 2;
        route->chunk(r, text, half);
        r->started = true;
        route->chunk(r, text + half, size - half);
        r->text.len = 0;
        route->finish(r);
        check_stream(r);
    } else {
        route->finish(r);
        check_json(r->out.data, r->out.len, "an answer");
    }
    free(text);
done: /* what front_http.c's hreq_free frees of a request that never reached the core */
    json_decref(r->doc);
    free(r->messages);
    free(r->stops);
    free(r->text_arg);
    free(r->schema_text);
    hbuf_free(&r->out);
    free(r);
    free(j);
    return 0;
}
