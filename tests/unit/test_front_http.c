/*
 * test_front_http.c — Check suite for the HTTP front end's text (daemon/front_http_fields.c,
 * front_http_openai.c, front_http_ollama.c): JSON escaping and streamed UTF-8 cut between pieces,
 * each API's bodies into core requests (fields, corral's extras, keep_alive), the limits on them,
 * and refusals that name the field, with the HTTP status of each core status. The server itself
 * (connections, limits in time, keys) is tested black-box in tests/python/test_http.py and through
 * the official clients in tests/http/.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "front_http_impl.h"
#include "testutil.h"

static const http_route *route_for(const char *path) {
    const http_route *const tables[] = {http_openai_routes, http_ollama_routes};
    for (size_t t = 0; t < 2; t++)
        for (const http_route *r = tables[t]; r->method; r++)
            if (strcmp(r->path, path) == 0) return r;
    ck_abort_msg("no route %s", path);
    return NULL;
}

/* A request of `path` with `body` through its route's prepare. */
typedef struct prepared {
    hreq r;
    job j;
    http_problem p;
    bool ok;
} prepared;

static prepared *prepare(const char *path, const char *body) {
    prepared *x = calloc(1, sizeof *x);
    ck_assert_ptr_nonnull(x);
    json_error_t jerr;
    x->r.doc = json_loads(body, 0, &jerr);
    ck_assert_msg(x->r.doc != NULL, "test body: %s", jerr.text);
    x->r.route = route_for(path);
    x->ok = x->r.route->prepare(&x->r, x->r.doc, &x->j, &x->p);
    return x;
}

static void prepared_free(prepared *x) {
    json_decref(x->r.doc);
    free(x->r.messages);
    free(x->r.stops);
    hbuf_free(&x->r.out);
    free(x);
}

/* The body must be refused with `status`, naming `param`. */
static void expect_refused(const char *path, const char *body, unsigned status, const char *param) {
    prepared *x = prepare(path, body);
    ck_assert_msg(!x->ok, "%s accepted", body);
    ck_assert_uint_eq(x->p.status, status);
    ck_assert_msg(strcmp(x->p.param, param) == 0, "%s: param '%s', want '%s' (%s)", body,
                  x->p.param, param, x->p.message);
    ck_assert(x->p.message[0]);
    prepared_free(x);
}

START_TEST(test_json_escape) {
    hbuf b = {0};
    static const char plain[] = "a\"b\\c\nd\te\x01 caf\xC3\xA9";
    hbuf_json_escape(&b, plain, sizeof plain - 1);
    ck_assert_str_eq(b.data, "a\\\"b\\\\c\\nd\\te\\u0001 caf\xC3\xA9");
    hbuf_reset(&b);
    /* Ill-formed: a lone continuation byte, a cut sequence, an overlong form. */
    static const char bad[] = "x\x80y\xE2\x82z\xC0\xAF";
    hbuf_json_escape(&b, bad, sizeof bad - 1);
    ck_assert_str_eq(b.data, "x\xEF\xBF\xBDy\xEF\xBF\xBDz\xEF\xBF\xBD\xEF\xBF\xBD");
    hbuf_free(&b);
}
END_TEST

START_TEST(test_stream_text_keeps_cut_characters) {
    hreq r = {0};
    /* "é" (C3 A9) and "😀" (F0 9F 98 80) cut across pieces come out whole, once. */
    http_escape_stream_text(&r, "caf\xC3", 4, false);
    ck_assert_str_eq(r.out.data, "caf");
    http_escape_stream_text(&r, "\xA9 \xF0", 3, false);
    ck_assert_str_eq(r.out.data, "caf\xC3\xA9 ");
    http_escape_stream_text(&r, "\x9F", 1, false);
    http_escape_stream_text(&r, "\x98\x80!", 3, false);
    ck_assert_str_eq(r.out.data, "caf\xC3\xA9 \xF0\x9F\x98\x80!");
    /* A cut sequence that a wrong byte breaks: one U+FFFD, the byte goes on. */
    hbuf_reset(&r.out);
    http_escape_stream_text(&r, "\xE2\x82", 2, false);
    http_escape_stream_text(&r, "A", 1, false);
    ck_assert_str_eq(r.out.data, "\xEF\xBF\xBD"
                                 "A");
    /* At the end of the stream a cut sequence is U+FFFD. */
    hbuf_reset(&r.out);
    http_escape_stream_text(&r, "\xE2\x82", 2, false);
    ck_assert_uint_eq(r.out.len, 0);
    http_escape_stream_text(&r, "", 0, true);
    ck_assert_str_eq(r.out.data, "\xEF\xBF\xBD");
    hbuf_free(&r.out);
}
END_TEST

START_TEST(test_openai_chat_body) {
    prepared *x = prepare(
        "/v1/chat/completions",
        "{\"model\": \"stories\", \"messages\": [{\"role\": \"developer\", \"content\": \"be "
        "brief\"},"
        " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"},"
        " {\"type\": \"text\", \"text\": \"b\"}]}], \"max_completion_tokens\": 9,"
        " \"temperature\": 0.5, \"top_p\": 0.25, \"seed\": -3, \"stop\": \"END\", \"stream\": true,"
        " \"stream_options\": {\"include_usage\": true}, \"n\": 1, \"user\": \"ignored\","
        " \"logprobs\": true, \"top_logprobs\": 2,"
        " \"corral\": {\"priority\": \"realtime\", \"session\": \"s1\", \"regex\": \"[a-z]+\","
        " \"top_k\": 4, \"deadline_ms\": 5000}}");
    ck_assert_msg(x->ok, "%s", x->p.message);
    const core_generate *g = &x->j.req.generate;
    ck_assert_int_eq(x->j.req.kind, CORE_GENERATE);
    ck_assert_str_eq(g->model, "stories");
    ck_assert_uint_eq(g->n_messages, 2);
    ck_assert_str_eq(g->messages[0].role, "system");
    ck_assert_str_eq(g->messages[1].content, "ab");
    ck_assert_uint_eq(g->messages[1].content_len, 2);
    ck_assert(g->sampling.has_max_tokens && g->sampling.max_tokens == 9);
    ck_assert(g->sampling.has_temperature && g->sampling.temperature == 0.5f);
    ck_assert(g->sampling.has_top_p && g->sampling.top_p == 0.25f);
    ck_assert(g->sampling.has_seed && g->sampling.seed == (uint64_t)-3);
    ck_assert(g->sampling.has_top_k && g->sampling.top_k == 4);
    ck_assert_uint_eq(g->n_stop, 1);
    ck_assert_str_eq(g->stop[0], "END");
    ck_assert(g->stream && x->r.stream && x->r.include_usage);
    ck_assert(g->logprobs && g->top_logprobs == 2);
    ck_assert_int_eq(g->priority, CFG_PRIORITY_REALTIME);
    ck_assert_str_eq(g->session, "s1");
    ck_assert_str_eq(g->constraint, "[a-z]+");
    ck_assert_uint_eq(g->deadline_ms, 5000);
    prepared_free(x);
}
END_TEST

START_TEST(test_ollama_bodies_and_keep_alive) {
    static const struct {
        const char *keep_alive;
        http_residency want;
    } cases[] = {
        {"-1", HTTP_RESIDENCY_PIN},       {"\"-1m\"", HTTP_RESIDENCY_PIN},
        {"0", HTTP_RESIDENCY_UNLOAD},     {"\"0s\"", HTTP_RESIDENCY_UNLOAD},
        {"\"5m\"", HTTP_RESIDENCY_UNPIN}, {"\"1h30m\"", HTTP_RESIDENCY_UNPIN},
        {"300", HTTP_RESIDENCY_UNPIN},    {"null", HTTP_RESIDENCY_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"model\": \"m\", \"prompt\": \"hi\", \"system\": \"sys\", \"keep_alive\": %s,"
                 " \"options\": {\"num_predict\": 7, \"repeat_last_n\": 5, \"stop\": [\"x\"]}}",
                 cases[i].keep_alive);
        prepared *x = prepare("/api/generate", body);
        ck_assert_msg(x->ok, "%s: %s", body, x->p.message);
        ck_assert_int_eq(x->r.residency, cases[i].want);
        const core_generate *g = &x->j.req.generate;
        ck_assert(x->r.stream); /* Ollama streams unless told not to */
        ck_assert_uint_eq(g->n_messages, 2);
        ck_assert_str_eq(g->messages[0].role, "system");
        ck_assert(g->sampling.max_tokens == 7 && g->sampling.penalty_last_n == 5);
        prepared_free(x);
    }
    /* Without a prompt: load, or unload with keep_alive 0. */
    prepared *x = prepare("/api/generate", "{\"model\": \"m\", \"keep_alive\": 0}");
    ck_assert(x->ok && x->r.residency_only);
    ck_assert_int_eq(x->j.req.kind, CORE_UNLOAD);
    ck_assert_str_eq(x->j.req.target.model, "m");
    prepared_free(x);
    x = prepare("/api/generate", "{\"model\": \"m\", \"raw\": true, \"prompt\": \"p\","
                                 " \"stream\": false}");
    ck_assert(x->ok && !x->r.stream);
    ck_assert_str_eq(x->j.req.generate.prompt, "p");
    prepared_free(x);
}
END_TEST

START_TEST(test_limits) {
    char body[4096];
    int at = snprintf(body, sizeof body, "{\"model\": \"m\", \"prompt\": \"p\", \"stop\": [");
    for (int i = 0; i < 17; i++)
        at += snprintf(body + at, sizeof body - (size_t)at, "%s\"s%d\"", i ? "," : "", i);
    snprintf(body + at, sizeof body - (size_t)at, "]}");
    expect_refused("/v1/completions", body, 400, "stop");
    char long_stop[400];
    memset(long_stop, 'a', 257);
    long_stop[257] = '\0';
    snprintf(body, sizeof body, "{\"model\": \"m\", \"prompt\": \"p\", \"stop\": \"%s\"}",
             long_stop);
    expect_refused("/v1/completions", body, 400, "stop");
    expect_refused("/v1/completions",
                   "{\"model\": \"m\", \"prompt\": \"p\", \"max_tokens\": 1048577}", 400,
                   "max_tokens");
    expect_refused("/v1/chat/completions",
                   "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}],"
                   " \"logprobs\": true, \"top_logprobs\": 21}",
                   400, "top_logprobs");
    char model[200];
    memset(model, 'm', 150);
    model[150] = '\0';
    snprintf(body, sizeof body, "{\"model\": \"%s\", \"prompt\": \"p\"}", model);
    expect_refused("/v1/completions", body, 400, "model");
    expect_refused("/v1/completions",
                   "{\"model\": \"m\", \"prompt\": \"p\", \"corral\": {\"session\": \"\"}}", 400,
                   "corral.session");
}
END_TEST

START_TEST(test_refusals_name_the_field) {
    static const struct {
        const char *path, *body, *param;
    } cases[] = {
        {"/v1/chat/completions", "{\"messages\": []}", "model"},
        {"/v1/chat/completions", "{\"model\": \"m\"}", "messages"},
        {"/v1/chat/completions", "{\"model\": \"m\", \"messages\": [{\"role\": \"tool\"}]}",
         "messages[0].role"},
        {"/v1/chat/completions",
         "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": 3}]}",
         "messages[0].content"},
        {"/v1/chat/completions",
         "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
         "\"image_url\"}]}]}",
         "messages[0].content"},
        {"/v1/completions", "{\"model\": \"m\", \"prompt\": \"p\", \"temperature\": \"hot\"}",
         "temperature"},
        {"/v1/completions", "{\"model\": \"m\", \"prompt\": \"p\", \"temperature\": 3}",
         "temperature"},
        {"/v1/completions", "{\"model\": \"m\", \"prompt\": \"p\", \"n\": 2}", "n"},
        {"/v1/completions", "{\"model\": \"m\", \"prompt\": \"p\", \"best_of\": 3}", "best_of"},
        {"/v1/completions", "{\"model\": \"m\", \"prompt\": \"p\", \"echo\": true}", "echo"},
        {"/v1/completions", "{\"model\": \"m\", \"prompt\": [1, 2]}", "prompt"},
        {"/v1/completions", "{\"model\": \"m\", \"prompt\": \"p\", \"logit_bias\": {\"1\": 5}}",
         "logit_bias"},
        {"/v1/completions", "{\"model\": \"m\", \"prompt\": \"p\", \"stream\": 1}", "stream"},
        {"/v1/completions",
         "{\"model\": \"m\", \"prompt\": \"p\", \"response_format\": {\"type\": \"json_schema\"}}",
         "response_format.json_schema"},
        {"/v1/completions",
         "{\"model\": \"m\", \"prompt\": \"p\", \"response_format\": {\"type\": \"yaml\"}}",
         "response_format.type"},
        {"/v1/completions",
         "{\"model\": \"m\", \"prompt\": \"p\", \"response_format\": {\"type\": \"json_object\"}, "
         "\"corral\": {\"regex\": \"a+\"}}",
         "response_format"},
        {"/v1/completions",
         "{\"model\": \"m\", \"prompt\": \"p\", \"response_format\": {\"type\": \"json_schema\", "
         "\"json_schema\": {\"name\": \"x\", \"schema\": 3}}}",
         "response_format.json_schema.schema"},
        {"/v1/completions", "{\"model\": \"m\", \"prompt\": \"p\", \"corral\": {\"x\": 1}}",
         "corral"},
        {"/v1/completions",
         "{\"model\": \"m\", \"prompt\": \"p\", \"corral\": {\"priority\": \"asap\"}}",
         "corral.priority"},
        {"/v1/chat/completions",
         "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"tools\": [{}]}",
         "tools"},
        {"/api/generate", "{\"model\": \"m\", \"prompt\": \"p\", \"keep_alive\": \"5 minutes\"}",
         "keep_alive"},
        {"/api/generate", "{\"model\": \"m\", \"prompt\": \"p\", \"images\": [\"eA==\"]}",
         "images"},
        {"/api/generate", "{\"model\": \"m\", \"prompt\": \"p\", \"format\": \"xml\"}", "format"},
        {"/api/generate", "{\"model\": \"m\", \"prompt\": \"p\", \"format\": 3}", "format"},
        {"/api/generate", "{\"model\": \"m\", \"prompt\": \"p\", \"options\": 1}", "options"},
        {"/api/chat",
         "{\"model\": \"m\", \"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}",
         "messages[0]"},
        {"/api/show", "{}", "model"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_refused(cases[i].path, cases[i].body, 400, cases[i].param);
}
END_TEST

START_TEST(test_status_table_and_error_bodies) {
    ck_assert_uint_eq(http_status_for(CORRAL_INVALID_ARGUMENT), 400);
    ck_assert_uint_eq(http_status_for(CORRAL_NOT_FOUND), 404);
    ck_assert_uint_eq(http_status_for(CORRAL_PERMISSION_DENIED), 403);
    ck_assert_uint_eq(http_status_for(CORRAL_RESOURCE_EXHAUSTED), 429);
    ck_assert_uint_eq(http_status_for(CORRAL_DEADLINE_EXCEEDED), 408);
    ck_assert_uint_eq(http_status_for(CORRAL_UNAVAILABLE), 503);
    ck_assert_uint_eq(http_status_for(CORRAL_SANITIZER_REJECTED), 400);
    ck_assert_uint_eq(http_status_for(CORRAL_INTERNAL), 500);
    ck_assert_str_eq(http_error_type(CORRAL_PERMISSION_DENIED), "permission_error");
    /* An app's rate and concurrency rules are retryable: 429; its other rules stay 403. */
    ck_assert_uint_eq(http_status_for_rule(CORRAL_PERMISSION_DENIED, "requests_per_minute"), 429);
    ck_assert_uint_eq(http_status_for_rule(CORRAL_PERMISSION_DENIED, "max_concurrent"), 429);
    ck_assert_uint_eq(http_status_for_rule(CORRAL_PERMISSION_DENIED, "models"), 403);
    ck_assert_uint_eq(http_status_for_rule(CORRAL_PERMISSION_DENIED, NULL), 403);
    ck_assert_uint_eq(http_status_for_rule(CORRAL_NOT_FOUND, "max_concurrent"), 404);
    /* RESOURCE_EXHAUSTED for good (a constraint over the compile limits, a model that can never
     * fit) is not the retryable 429 of a full queue. */
    ck_assert_uint_eq(http_status_for_rule(CORRAL_RESOURCE_EXHAUSTED, JOB_RULE_OUTPUT_CONSTRAINT),
                      400);
    ck_assert_uint_eq(http_status_for_rule(CORRAL_RESOURCE_EXHAUSTED, JOB_RULE_MEMORY_LIMIT), 500);
    ck_assert_uint_eq(http_status_for_rule(CORRAL_RESOURCE_EXHAUSTED, NULL), 429);
    /* A sanitizer profile that is not configured is a bad field, not a missing model. */
    ck_assert_uint_eq(http_status_for_rule(CORRAL_NOT_FOUND, JOB_RULE_SANITIZER_PROFILE), 400);
    hbuf b = {0};
    http_write_rule_error(&b, false, CORRAL_PERMISSION_DENIED, "requests_per_minute", NULL, "slow");
    ck_assert_str_eq(b.data, "{\"error\":{\"message\":\"slow\",\"type\":\"rate_limit_error\","
                             "\"param\":null,\"code\":\"rate_limit_exceeded\"}}");
    hbuf_reset(&b);
    http_write_rule_error(&b, false, CORRAL_RESOURCE_EXHAUSTED, JOB_RULE_OUTPUT_CONSTRAINT,
                          "corral.regex", "big");
    ck_assert_str_eq(b.data, "{\"error\":{\"message\":\"big\",\"type\":\"invalid_request_error\","
                             "\"param\":\"corral.regex\",\"code\":\"constraint_too_complex\"}}");
    hbuf_reset(&b);
    http_write_error(&b, false, CORRAL_NOT_FOUND, "model", "no \"x\"");
    ck_assert_str_eq(b.data, "{\"error\":{\"message\":\"no \\\"x\\\"\",\"type\":"
                             "\"invalid_request_error\",\"param\":\"model\",\"code\":"
                             "\"model_not_found\"}}");
    hbuf_reset(&b);
    http_write_error(&b, true, CORRAL_NOT_FOUND, "model", "gone");
    ck_assert_str_eq(b.data, "{\"error\":\"gone\"}");
    hbuf_free(&b);
}
END_TEST

static Suite *front_http_suite(void) {
    Suite *s = suite_create("front_http");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_json_escape);
    tcase_add_test(core, test_stream_text_keeps_cut_characters);
    tcase_add_test(core, test_openai_chat_body);
    tcase_add_test(core, test_ollama_bodies_and_keep_alive);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_limits);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_refusals_name_the_field);
    tcase_add_test(errors, test_status_table_and_error_bodies);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(front_http_suite)
