/*
 * fuzz_json_schema.c — the JSON Schema compiler (policies/include/corral/json_schema.h) on
 * arbitrary bytes: the schema text in; json_schema_to_regex; when it compiles, the pattern through
 * the regex compiler as a constraint compiles it (REGEX_GENERATED); then random strings the
 * automaton accepts (dfa_sample.h).
 *
 * Invariants: a failure is INVALID_ARGUMENT, RESOURCE_EXHAUSTED or OUT_OF_MEMORY, its message
 * starts "json schema: " and, for a schema that parsed, names a place ("#..."); a pattern the
 * compiler wrote is within JSON_SCHEMA_MAX_REGEX and parses as a regex (the regex compiler may
 * refuse it only over one of its own limits); every sampled string is a JSON document (jansson
 * parses it, UTF-8 included, with no lone surrogate escaped), and of the type the schema's
 * top-level `type` names when it names one.
 */
#include <jansson.h>

#include "corral/json_schema.h"
#include "dfa_sample.h"
#include "fuzz.h"
#include "regex.h"

#define SAMPLES    6
#define SAMPLE_CAP (64u << 10)

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    return 0;
}

/* Whether v has the type `name` names (JSON Schema's meaning). */
static int has_type(const json_t *v, const char *name) {
    if (!strcmp(name, "object") || !strcmp(name, "json_object")) return json_is_object(v);
    if (!strcmp(name, "array")) return json_is_array(v);
    if (!strcmp(name, "string")) return json_is_string(v);
    if (!strcmp(name, "boolean")) return json_is_boolean(v);
    if (!strcmp(name, "null")) return json_is_null(v);
    if (!strcmp(name, "number")) return json_is_number(v);
    if (!strcmp(name, "integer"))
        return json_is_integer(v) ||
               (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v));
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *re = NULL;
    size_t re_len = 0;
    corral_error err = {0};
    const corral_status st = json_schema_to_regex((const char *)data, size, &re, &re_len, &err);
    if (st != CORRAL_OK) {
        FUZZ_CHECK(st == CORRAL_INVALID_ARGUMENT || st == CORRAL_RESOURCE_EXHAUSTED ||
                       st == CORRAL_OUT_OF_MEMORY,
                   "status %d: %s", (int)st, err.message);
        FUZZ_CHECK(re == NULL, "a pattern with an error");
        FUZZ_CHECK(!strncmp(err.message, "json schema: ", 13), "message: %s", err.message);
        FUZZ_CHECK(!strncmp(err.message, "json schema: #", 14) ||
                       !strncmp(err.message, "json schema: not valid JSON", 27) ||
                       !strncmp(err.message, "json schema: the schema has", 27),
                   "message names no place: %s", err.message);
        return 0;
    }
    FUZZ_CHECK(re && strlen(re) == re_len && re_len <= JSON_SCHEMA_MAX_REGEX, "pattern length");
    regex_dfa d;
    const corral_status rs = regex__compile(re, re_len, REGEX_GENERATED, &d, NULL, &err);
    free(re);
    if (rs != CORRAL_OK) {
        FUZZ_CHECK(rs == CORRAL_RESOURCE_EXHAUSTED || rs == CORRAL_OUT_OF_MEMORY,
                   "the regex compiler refused a generated pattern: %s", err.message);
        return 0;
    }
    json_error_t je;
    json_t *schema = json_loadb((const char *)data, size, JSON_DECODE_ANY, &je);
    FUZZ_CHECK(schema != NULL, "the schema compiled but does not parse: %s", je.text);
    const json_t *type = json_object_get(schema, "type");
    uint32_t *dist = dfa_sample_distances(&d);
    FUZZ_CHECK(dist != NULL, "out of memory");
    char *buf = malloc(SAMPLE_CAP);
    FUZZ_CHECK(buf != NULL, "out of memory");
    uint64_t rng = size * 0x9E3779B97F4A7C15ull + (size ? data[0] : 0);
    for (int i = 0; i < SAMPLES; i++) {
        const size_t n = dfa_sample(&d, dist, &rng, buf, SAMPLE_CAP, 200);
        if (n == SIZE_MAX) break; /* the shortest document does not fit: nothing to check */
        json_t *v = json_loadb(buf, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        FUZZ_CHECK(v != NULL, "a sample is not JSON (%s at %d): %.300s", je.text, je.position, buf);
        if (json_is_string(type) &&
            !(json_is_null(v) && json_is_true(json_object_get(schema, "nullable"))))
            FUZZ_CHECK(has_type(v, json_string_value(type)), "a sample is not a %s: %.300s",
                       json_string_value(type), buf);
        json_decref(v);
    }
    free(buf);
    free(dist);
    json_decref(schema);
    regex__free(&d);
    return 0;
}
