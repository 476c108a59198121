/*
 * test_json_schema.c — Check suite for the JSON Schema compiler (policies/include/corral/
 * json_schema.h): every supported keyword, the layout, exact number bounds, every refusal with the
 * JSON pointer it names, and the limits.
 *
 * Two oracles. Hand-written texts each schema must accept or reject (the layout, JSON's string
 * syntax, formats, patterns), and exhaustive sweeps where the truth is arithmetic (every integer
 * in a range against its bounds; every two-decimal number). Then, for a corpus of realistic
 * schemas, random strings the compiled automaton accepts (dfa_sample.h) must parse as JSON and
 * pass a small validator of the keywords the compiler supports (below, independent of the
 * compiler: it reads the schema, not the pattern). The Python suite validates real generations
 * with the jsonschema package (tests/python/test_json_schema.py).
 */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral/constraint.h"
#include "corral/gguf.h"
#include "corral/json_schema.h"
#include "corral/tokenizer.h"
#include "corral/utf8.h"
#include "dfa_sample.h"
#include "regex.h" /* policies/src: regex__compile with REGEX_GENERATED, the DFA */
#include "testutil.h"

#define EXPECT(cond, ...)                       \
    do {                                        \
        if (!(cond)) ck_abort_msg(__VA_ARGS__); \
    } while (0)

/* ---- helpers --------------------------------------------------------------------------------- */

static char *to_regex(const char *schema) {
    char *re = NULL;
    size_t n = 0;
    corral_error err = {0};
    const corral_status st = json_schema_to_regex(schema, strlen(schema), &re, &n, &err);
    ck_assert_msg(st == CORRAL_OK, "%s: %s", schema, err.message);
    ck_assert_uint_eq(strlen(re), n);
    return re;
}

static regex_dfa compile_schema(const char *schema) {
    char *re = to_regex(schema);
    regex_dfa d;
    corral_error err = {0};
    const corral_status st = regex__compile(re, strlen(re), REGEX_GENERATED, &d, NULL, &err);
    ck_assert_msg(st == CORRAL_OK, "%.200s: %.200s", schema, err.message);
    free(re);
    return d;
}

static int matches(const regex_dfa *d, const char *text) {
    return regex__match(d, text, strlen(text));
}

/* Each of yes[] must match, each of no[] must not (NULL-terminated lists). */
static void expect_language(const char *schema, const char *const *yes, const char *const *no) {
    regex_dfa d = compile_schema(schema);
    for (const char *const *y = yes; y && *y; y++)
        EXPECT(matches(&d, *y), "%s should accept %s", schema, *y);
    for (const char *const *x = no; x && *x; x++)
        EXPECT(!matches(&d, *x), "%s should reject %s", schema, *x);
    regex__free(&d);
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

static void expect_error(const char *schema, corral_status status, const char *needle) {
    char *re = (char *)"untouched";
    corral_error err = {0};
    const corral_status st = json_schema_to_regex(schema, strlen(schema), &re, NULL, &err);
    ck_assert_msg(st == status, "%s: status %d, expected %d (%s)", schema, (int)st, (int)status,
                  err.message);
    ck_assert_ptr_null(re);
    ck_assert_msg(strstr(err.message, needle) != NULL, "%s: message '%s' lacks '%s'", schema,
                  err.message, needle);
}

/* ---- a small validator (the oracle for the samples) ------------------------------------------
 *
 * The keywords the compiler supports, read from the schema as JSON Schema defines them; formats
 * and patterns are not checked here (the language tests cover them). Returns 1 if v is valid.
 */
static int valid(const json_t *root, const json_t *s, const json_t *v);

static int type_ok(const char *t, const json_t *v) {
    if (!strcmp(t, "object") || !strcmp(t, "json_object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v) ||
               (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v));
    return 0;
}

/* Code points of valid UTF-8 (what JSON Schema's lengths count). */
static size_t count_chars(const char *s, size_t n) {
    size_t chars = 0;
    for (size_t i = 0; i < n; i++) chars += !utf8_is_continuation((uint8_t)s[i]);
    return chars;
}

static double num(const json_t *v) {
    return json_number_value(v);
}

static int valid(const json_t *root, const json_t *s, const json_t *v) {
    if (json_is_true(s)) return 1;
    const json_t *k;
    if ((k = json_object_get(s, "$ref"))) {
        const char *ref = json_string_value(k);
        const json_t *t = root;
        char seg[128];
        for (const char *p = ref + 1; *p == '/';) {
            size_t n = 0;
            for (p++; *p && *p != '/'; p++) seg[n++] = *p;
            seg[n] = '\0';
            t = json_object_get(t, seg);
        }
        if (!valid(root, t, v)) return 0;
    }
    if ((k = json_object_get(s, "allOf")))
        for (size_t i = 0; i < json_array_size(k); i++)
            if (!valid(root, json_array_get(k, i), v)) return 0;
    if ((k = json_object_get(s, "anyOf"))) {
        int any = 0;
        for (size_t i = 0; i < json_array_size(k); i++) any |= valid(root, json_array_get(k, i), v);
        if (!any) return 0;
    }
    if ((k = json_object_get(s, "oneOf"))) {
        int n = 0;
        for (size_t i = 0; i < json_array_size(k); i++) n += valid(root, json_array_get(k, i), v);
        if (n != 1) return 0;
    }
    if ((k = json_object_get(s, "type"))) {
        int any = 0;
        if (json_is_string(k)) any = type_ok(json_string_value(k), v);
        for (size_t i = 0; i < json_array_size(k); i++)
            any |= type_ok(json_string_value(json_array_get(k, i)), v);
        if (json_is_true(json_object_get(s, "nullable")) && json_is_null(v)) any = 1;
        if (!any) return 0;
    }
    if ((k = json_object_get(s, "const")) && !json_equal((json_t *)k, (json_t *)v)) return 0;
    if ((k = json_object_get(s, "enum"))) {
        int any = 0;
        for (size_t i = 0; i < json_array_size(k); i++)
            any |= json_equal(json_array_get(k, i), (json_t *)v);
        if (!any) return 0;
    }
    if (json_is_string(v)) {
        const size_t n = count_chars(json_string_value(v), json_string_length(v));
        if ((k = json_object_get(s, "minLength")) && n < (size_t)json_integer_value(k)) return 0;
        if ((k = json_object_get(s, "maxLength")) && n > (size_t)json_integer_value(k)) return 0;
    }
    if (json_is_number(v)) {
        const json_t *ex;
        if ((k = json_object_get(s, "minimum")) && num(v) < num(k)) return 0;
        if ((k = json_object_get(s, "maximum")) && num(v) > num(k)) return 0;
        if ((ex = json_object_get(s, "exclusiveMinimum")) && json_is_number(ex) &&
            num(v) <= num(ex))
            return 0;
        if ((ex = json_object_get(s, "exclusiveMaximum")) && json_is_number(ex) &&
            num(v) >= num(ex))
            return 0;
    }
    if (json_is_array(v)) {
        const size_t n = json_array_size(v);
        if ((k = json_object_get(s, "minItems")) && n < (size_t)json_integer_value(k)) return 0;
        if ((k = json_object_get(s, "maxItems")) && n > (size_t)json_integer_value(k)) return 0;
        if ((k = json_object_get(s, "items")))
            for (size_t i = 0; i < n; i++)
                if (!valid(root, k, json_array_get(v, i))) return 0;
    }
    if (json_is_object(v)) {
        const json_t *props = json_object_get(s, "properties");
        const json_t *extra = json_object_get(s, "additionalProperties");
        for (size_t i = 0; i < json_array_size(json_object_get(s, "required")); i++)
            if (!json_object_get(
                    v, json_string_value(json_array_get(json_object_get(s, "required"), i))))
                return 0;
        const char *key;
        json_t *m;
        json_object_foreach((json_t *)v, key, m) {
            const json_t *ps = json_object_get(props, key);
            if (ps ? !valid(root, ps, m) : (extra && !valid(root, extra, m))) return 0;
            if (!ps && json_is_false(extra)) return 0;
        }
    }
    return 1;
}

/* Sample n strings of schema's pattern; each must parse as JSON and be valid. Returns the
 * largest nesting seen (for the depth tests). */
static int sample_and_validate(const char *schema, int n, uint64_t seed) {
    json_error_t je;
    json_t *s = json_loads(schema, JSON_DECODE_ANY, &je);
    ck_assert_msg(s != NULL, "%s: %s", schema, je.text);
    regex_dfa d = compile_schema(schema);
    uint32_t *dist = dfa_sample_distances(&d);
    ck_assert_ptr_nonnull(dist);
    static char buf[1 << 16];
    uint64_t rng = seed;
    int deepest = 0;
    for (int i = 0; i < n; i++) {
        const size_t len = dfa_sample(&d, dist, &rng, buf, sizeof buf, 300);
        ck_assert_msg(len != SIZE_MAX, "%s: no sample fits", schema);
        json_t *v = json_loadb(buf, len, JSON_DECODE_ANY, &je);
        EXPECT(v != NULL, "%s: sample does not parse (%s at %d): %s", schema, je.text, je.position,
               buf);
        EXPECT(valid(s, s, v), "%s: sample is not valid: %s", schema, buf);
        int depth = 0, max = 0;
        for (size_t b = 0; b < len; b++) { /* brackets outside strings */
            if (buf[b] == '"')
                for (b++; buf[b] != '"'; b++) b += buf[b] == '\\';
            else if (buf[b] == '{' || buf[b] == '[')
                max = ++depth > max ? depth : max;
            else if (buf[b] == '}' || buf[b] == ']')
                depth--;
        }
        if (max > deepest) deepest = max;
        json_decref(v);
    }
    free(dist);
    regex__free(&d);
    json_decref(s);
    return deepest;
}

/* ---- core: the layout, objects and arrays --------------------------------------------------- */

#define PERSON                                                                               \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":" \
    "\"integer\",\"minimum\":0,\"maximum\":150},\"email\":{\"type\":\"string\",\"format\":"  \
    "\"email\"}},\"required\":[\"name\",\"age\"]}"

START_TEST(test_object_order_required_layout) {
    expect_language(
        PERSON,
        L("{\"name\":\"Ann\",\"age\":31}", "{\"name\": \"Ann\", \"age\": 31}",
          "{\"name\":\"\",\"age\":0,\"email\":\"a@b.io\"}",
          "{\n    \"name\": \"Ann\",\n    \"age\": 150\n}",
          "{\n  \"name\": \"Ann\",\n  \"age\": 7,\n  \"email\": \"x.y@mail.example.org\"\n}",
          "{ \"name\":\"A\",\"age\":1 }"),
        L("{\"age\":31,\"name\":\"Ann\"}",                  /* not the schema's order */
          "{\"name\":\"Ann\"}",                             /* age is required */
          "{\"name\":\"Ann\",\"age\":31,\"x\":1}",          /* undeclared */
          "{\"name\":\"Ann\",\"age\":151}",                 /* maximum */
          "{\"name\":\"Ann\",\"age\":-1}",                  /* minimum */
          "{\"name\":\"Ann\",\"age\":31,\"email\":\"no\"}", /* format */
          " {\"name\":\"A\",\"age\":1}",                    /* nothing around */
          "{\"name\":\"A\",\"age\":1}\n",
          "{\"name\":  \"A\",\"age\":1}",      /* one space after ':' at most */
          "{\"name\" :\"A\",\"age\":1}",       /* none before it */
          "{  \"name\":\"A\",\"age\":1}",      /* one space after '{' */
          "{\n     \"name\":\"A\",\"age\":1}", /* 5 spaces: 4 per level */
          "{\"name\":\"A\",\"age\":1,}",       /* trailing comma */
          "{\"name\":\"A\" ,\"age\":1}"));
}
END_TEST

START_TEST(test_optional_properties_commas) {
    /* Nothing required: any subset, in order, commas only between. */
    const char *s = "{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"},"
                    "\"c\":{\"type\":\"integer\"}}}";
    expect_language(s,
                    L("{}", "{\"a\":1}", "{\"b\":2}", "{\"c\":3}", "{\"a\":1,\"c\":3}",
                      "{\"b\":2,\"c\":3}", "{\"a\":1,\"b\":2,\"c\":3}"),
                    L("{,}", "{\"a\":1,}", "{,\"b\":2}", "{\"b\":2,\"a\":1}", "{ }",
                      "{\"a\":1\"b\":2}", "[]", "null"));
    /* Optional members around a required one. */
    const char *r = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{"
                    "\"type\":\"null\"},\"c\":{\"type\":\"null\"}},\"required\":[\"b\"]}";
    expect_language(r,
                    L("{\"b\":null}", "{\"a\":null,\"b\":null}", "{\"b\":null,\"c\":null}",
                      "{\"a\":null,\"b\":null,\"c\":null}"),
                    L("{}", "{\"a\":null}", "{\"a\":null,\"c\":null}", "{\"b\":null,}"));
}
END_TEST

START_TEST(test_maps_and_any_object) {
    /* No properties: a map; its values follow additionalProperties. */
    expect_language("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
                    L("{}", "{\"x\":1}", "{\"x\":1,\"y\":-2}", "{\"\":0}", "{\"a\\\"b\":3}"),
                    L("{\"x\":\"1\"}", "{\"x\":1,}", "{x:1}"));
    expect_language("{\"type\":\"object\",\"additionalProperties\":false}", L("{}"),
                    L("{\"x\":1}"));
    /* json_object mode and a bare object: any object, containers at most ANY_DEPTH deep. */
    const char *deep = "{\"a\":{\"b\":[{\"c\":1}]}}";
    expect_language("{\"type\":\"json_object\"}",
                    L("{}", "{\"a\":[1,\"x\",{\"b\":null}]}", "{\"k\": true, \"n\": -0.5e3}"),
                    L("[]", "1", "{\"a\":{\"b\":{\"c\":{\"d\":1}}}}"));
    (void)deep;
    expect_language("{\"type\":\"object\"}", L("{}", "{\"a\":[1,2]}"), L("[]"));
    /* Any value: true and {}. */
    expect_language("true", L("1", "\"s\"", "null", "[1,[2]]", "{\"a\":{}}"),
                    L("[[[1]]]", "{\"a\":{\"b\":[]}}", "nul", ""));
    expect_language("{}", L("false", "{\"x\":[]}"), L("[[[]]]"));
}
END_TEST

START_TEST(test_arrays) {
    expect_language("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,"
                    "\"maxItems\":3}",
                    L("[1]", "[1,2]", "[1, 2, 3]", "[\n    1,\n    2\n]"),
                    L("[]", "[1,2,3,4]", "[1,]", "[\"1\"]", "[ 1 ,2]"));
    expect_language("{\"type\":\"array\",\"items\":{\"type\":\"string\"}}",
                    L("[]", "[\"a\"]", "[\"a\",\"b\",\"c\",\"d\",\"e\"]"), L("[,]", "[\"a\",]"));
    expect_language("{\"type\":\"array\",\"maxItems\":0}", L("[]"), L("[1]"));
    expect_language("{\"type\":\"array\",\"items\":false}", L("[]"), L("[null]"));
    expect_language("{\"type\":\"array\",\"minItems\":2}", L("[1,\"x\"]", "[{},[]]"), L("[1]"));
    /* Nested: the indentation follows the level. */
    expect_language("{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":"
                    "\"boolean\"}}}",
                    L("[[true],[false,true]]", "[\n    [\n        true\n    ]\n]"),
                    L("[\n    [\n         true\n    ]\n]"));
}
END_TEST

/* ---- core: strings ----------------------------------------------------------------------------
 */

START_TEST(test_string_syntax) {
    expect_language("{\"type\":\"string\"}",
                    L("\"\"", "\"plain\"",
                      "\"quote \\\" backslash \\\\ slash \\/ \\b\\f\\n\\r\\t\"",
                      "\"\\u00e9\\u00E9\"", "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"",
                      "\"\\ud83d\\ude00\"", "\"\\uD83D\\uDE00\"", "\"\\u0000\"", "\"tab\\t\"",
                      "\"\x7f\"", "\"'single'\""),
                    L("\"raw\nnewline\"", "\"raw\ttab\"", "\"\x01\"", "\"\\x41\"", "\"\\a\"",
                      "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"",
                      "\"unterminated", "\"bad \xc3\x28 utf8\"", "\"over\xc0\xaflong\"",
                      "\"\xed\xa0\x80\"", "'single'", "\"a\"\"b\""));
}
END_TEST

START_TEST(test_string_lengths) {
    /* Characters as JSON Schema counts them: an escape or a surrogate pair is one. */
    expect_language("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
                    L("\"ab\"", "\"abc\"", "\"\xc3\xa9\xe2\x82\xac\"", "\"\\u00e9x\"",
                      "\"\\ud83d\\ude00\\n\"", "\"\\\"\\\\\""),
                    L("\"a\"", "\"abcd\"", "\"\xf0\x9f\x98\x80\"", "\"\\n\"", "\"\""));
    expect_language("{\"type\":\"string\",\"minLength\":1}", L("\"x\"", "\"xyz\""), L("\"\""));
    expect_language("{\"type\":\"string\",\"maxLength\":0}", L("\"\""), L("\"a\""));
}
END_TEST

START_TEST(test_formats) {
    expect_language("{\"type\":\"string\",\"format\":\"date\"}",
                    L("\"2024-02-29\"", "\"2000-02-29\"", "\"1996-02-29\"", "\"2023-01-31\"",
                      "\"2023-04-30\"", "\"0001-01-01\"", "\"9999-12-31\""),
                    L("\"2023-02-29\"", "\"1900-02-29\"", "\"2023-04-31\"", "\"2023-13-01\"",
                      "\"2023-00-10\"", "\"2023-01-00\"", "\"0000-01-01\"", "\"23-01-01\"",
                      "\"2023-1-01\"", "2023-01-01", "\"2023-01-01T00:00:00Z\""));
    expect_language("{\"type\":\"string\",\"format\":\"time\"}",
                    L("\"00:00:00Z\"", "\"23:59:59+01:00\"", "\"12:30:00.123456-05:30\""),
                    L("\"24:00:00Z\"", "\"12:60:00Z\"", "\"12:00:60Z\"", "\"12:00:00\"",
                      "\"12:00Z\"", "\"12:00:00.1234567Z\"", "\"12:00:00+1:00\""));
    expect_language(
        "{\"type\":\"string\",\"format\":\"date-time\"}",
        L("\"2024-02-29T23:59:59Z\"", "\"1999-12-31T00:00:00.5+14:00\""),
        L("\"2024-02-29 23:59:59Z\"", "\"2024-02-30T00:00:00Z\"", "\"2024-02-29T23:59:59\""));
    expect_language(
        "{\"type\":\"string\",\"format\":\"uuid\"}", L("\"123e4567-e89b-12d3-a456-426614174000\""),
        L("\"123E4567-e89b-12d3-a456-426614174000\"", "\"123e4567e89b12d3a456426614174000\"",
          "\"123e4567-e89b-12d3-a456-42661417400\""));
    expect_language("{\"type\":\"string\",\"format\":\"email\"}",
                    L("\"a@b.io\"", "\"first.last+tag@mail.example.org\"", "\"x_y@a-b.co\""),
                    L("\"a@b\"", "\"@b.io\"", "\"a@.io\"", "\"a..b@c.io\"", "\".a@b.io\"",
                      "\"a@b-.io\"", "\"a b@c.io\"", "\"a@b.c1\""));
    expect_language("{\"type\":\"string\",\"format\":\"ipv4\"}",
                    L("\"0.0.0.0\"", "\"192.168.1.255\"", "\"255.255.255.255\""),
                    L("\"256.1.1.1\"", "\"01.1.1.1\"", "\"1.1.1\"", "\"1.1.1.1.1\""));
}
END_TEST

START_TEST(test_pattern_search_and_escaping) {
    /* JSON Schema's pattern is a search: unanchored ends take any characters. */
    expect_language("{\"type\":\"string\",\"pattern\":\"ab\"}",
                    L("\"ab\"", "\"xxabyy\"", "\"\\nab\\\"\""), L("\"a\"", "\"ba\""));
    expect_language("{\"type\":\"string\",\"pattern\":\"^ab\"}", L("\"ab\"", "\"abc\""),
                    L("\"xab\""));
    expect_language("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"}", L("\"AB-123\""),
                    L("\"AB-1234\"", "\"ab-123\"", "\"xAB-123\""));
    expect_language("{\"type\":\"string\",\"pattern\":\"^a|b$\"}",
                    L("\"a\"", "\"ax\"", "\"xb\"", "\"b\""), L("\"xa\"", "\"bx\""));
    /* Characters JSON must escape are matched in their escaped spelling. */
    expect_language("{\"type\":\"string\",\"pattern\":\"^[\\\"\\\\\\\\]+$\"}",
                    L("\"\\\"\"", "\"\\\\\\\"\""), L("\"\"\"", "\"x\""));
    expect_language("{\"type\":\"string\",\"pattern\":\"^a\\nb\\t\\u0001$\"}",
                    L("\"a\\nb\\t\\u0001\""), L("\"a\nb\t\x01\"", "\"a\\u000ab\\t\\u0001\""));
    expect_language("{\"type\":\"string\",\"pattern\":\"^.$\"}", L("\"x\"", "\"\\\"\"", "\"\\t\""),
                    L("\"\\n\"", "\"xy\"", "\"\""));
    expect_language("{\"type\":\"string\",\"pattern\":\"^[^a]$\"}",
                    L("\"b\"", "\"\\\"\"", "\"\\n\"", "\"\\u001f\"", "\"\\u001F\""),
                    L("\"a\"", "\"\""));
}
END_TEST

START_TEST(test_enum_const_and_literals) {
    expect_language(
        "{\"enum\":[\"red\",\"green\",1,null,true,{\"a\":[1,2]},\"q\\\"uote\"]}",
        L("\"red\"", "\"green\"", "1", "null", "true", "{\"a\":[1,2]}", "\"q\\\"uote\""),
        L("\"blue\"", "2", "false", "{\"a\": [1,2]}", "\"red\" "));
    expect_language("{\"type\":\"string\",\"enum\":[\"a\",1,\"b\"]}", L("\"a\"", "\"b\""), L("1"));
    expect_language("{\"type\":\"integer\",\"enum\":[1,2.0,2.5]}", L("1", "2.0"), L("2.5"));
    expect_language("{\"const\":\"caf\xc3\xa9\"}", L("\"caf\xc3\xa9\""), L("\"cafe\""));
    expect_language("{\"type\":[\"string\",\"null\"],\"enum\":[\"x\",null,3]}", L("\"x\"", "null"),
                    L("3"));
}
END_TEST

START_TEST(test_types_and_combinators) {
    expect_language("{\"type\":[\"integer\",\"null\"]}", L("1", "null"), L("\"1\"", "1.5"));
    expect_language("{\"type\":[\"integer\",\"number\"]}", L("1", "1.5"), L("\"1\""));
    expect_language("{\"type\":\"boolean\"}", L("true", "false"), L("0", "True"));
    expect_language("{\"type\":\"null\"}", L("null"), L("0"));
    expect_language("{\"type\":\"string\",\"nullable\":true}", L("\"x\"", "null"), L("1"));
    /* Without type, the keywords decide. */
    expect_language("{\"minLength\":2}", L("\"ab\""), L("1", "\"a\""));
    expect_language("{\"properties\":{\"a\":{\"const\":1}},\"required\":[\"a\"]}", L("{\"a\":1}"),
                    L("[]", "1"));
    expect_language("{\"anyOf\":[{\"type\":\"string\",\"maxLength\":1},{\"type\":\"integer\"}],"
                    "\"description\":\"either\"}",
                    L("\"a\"", "7"), L("\"ab\"", "null"));
    expect_language("{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\",\"minimum\":0}]}",
                    L("\"a\"", "7"), L("-1"));
    expect_language("{\"allOf\":[{\"type\":\"integer\",\"maximum\":3}],\"title\":\"t\"}", L("3"),
                    L("4"));
}
END_TEST

START_TEST(test_refs) {
    const char *s =
        "{\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"},"
        "\"y\":{\"type\":\"integer\"}},\"required\":[\"x\",\"y\"]}},\"type\":\"object\","
        "\"properties\":{\"from\":{\"$ref\":\"#/$defs/pt\"},\"to\":{\"$ref\":\"#/$defs/pt\","
        "\"description\":\"end\"}},\"required\":[\"from\",\"to\"]}";
    expect_language(s, L("{\"from\":{\"x\":1,\"y\":2},\"to\":{\"x\":3,\"y\":4}}"),
                    L("{\"from\":{\"x\":1},\"to\":{\"x\":3,\"y\":4}}"));
    expect_language("{\"definitions\":{\"s\":{\"type\":\"string\"}},\"type\":\"array\","
                    "\"items\":{\"$ref\":\"#/definitions/s\"}}",
                    L("[\"a\"]"), L("[1]"));
    /* Pointers with escapes, and a reference into properties. */
    expect_language("{\"$defs\":{\"a/b~c\":{\"const\":1}},\"properties\":{\"p\":{\"$ref\":"
                    "\"#/$defs/a~1b~0c\"},\"q\":{\"$ref\":\"#/properties/p\"}},"
                    "\"required\":[\"p\",\"q\"]}",
                    L("{\"p\":1,\"q\":1}"), L("{\"p\":1,\"q\":2}"));
    /* The same definition used twice along one path is fine when it is not recursive. */
    expect_language("{\"$defs\":{\"i\":{\"type\":\"integer\"},\"pair\":{\"type\":\"array\","
                    "\"items\":{\"$ref\":\"#/$defs/i\"}}},\"type\":\"array\",\"items\":{\"$ref\":"
                    "\"#/$defs/pair\"}}",
                    L("[[1,2],[3]]"), L("[[\"1\"]]"));
}
END_TEST

/* ---- core: numbers ----------------------------------------------------------------------------
 */

START_TEST(test_numbers_unbounded) {
    expect_language("{\"type\":\"integer\"}",
                    L("0", "7", "-7", "123456789012345", "-123456789012345"),
                    L("-0", "007", "1.0", "1e3", "+1", "1234567890123456", ""));
    expect_language("{\"type\":\"number\"}",
                    L("0", "-0", "1.5", "-0.25", "3e8", "1.5E-7", "0.000001", "12345.678"),
                    L("1.50", "1.", ".5", "01", "1e", "1e+", "1e100", "1e05", "NaN", "Infinity"));
}
END_TEST

/* Every integer in [-400, 400] against each combination of bounds. */
START_TEST(test_integer_bounds_exhaustive) {
    static const int values[] = {-120, -7, -1, 0, 1, 5, 99, 100, 250};
    const int nv = sizeof values / sizeof values[0];
    char schema[256], text[32];
    for (int li = -1; li < nv; li++) {
        for (int hi = -1; hi < nv; hi++) {
            for (int ex = 0; ex < 4; ex++) {
                const bool lo_ex = ex & 1, hi_ex = ex & 2;
                if ((li < 0 && lo_ex) || (hi < 0 && hi_ex)) continue;
                const int lo = li >= 0 ? values[li] : -100000, up = hi >= 0 ? values[hi] : 100000;
                const int first = lo + lo_ex, last = up - hi_ex;
                int n = snprintf(schema, sizeof schema, "{\"type\":\"integer\"");
                if (li >= 0)
                    n += snprintf(schema + n, sizeof schema - (size_t)n, ",\"%s\":%d",
                                  lo_ex ? "exclusiveMinimum" : "minimum", lo);
                if (hi >= 0)
                    n += snprintf(schema + n, sizeof schema - (size_t)n, ",\"%s\":%d",
                                  hi_ex ? "exclusiveMaximum" : "maximum", up);
                snprintf(schema + n, sizeof schema - (size_t)n, "}");
                if (first > last) {
                    char *re = NULL;
                    corral_error err = {0};
                    EXPECT(json_schema_to_regex(schema, strlen(schema), &re, NULL, &err) ==
                               CORRAL_INVALID_ARGUMENT,
                           "%s should be refused", schema);
                    continue;
                }
                regex_dfa d = compile_schema(schema);
                for (int x = -400; x <= 400; x++) {
                    snprintf(text, sizeof text, "%d", x);
                    EXPECT(matches(&d, text) == (x >= first && x <= last), "%s on %d", schema, x);
                }
                EXPECT(!matches(&d, "-0") && !matches(&d, "00") && !matches(&d, "1.0"), "%s",
                       schema);
                regex__free(&d);
            }
        }
    }
}
END_TEST

/* The canonical text of k/100: no trailing zeros in the fraction. */
static void centi_text(int k, char *out, size_t cap) {
    const int a = k < 0 ? -k : k;
    if (a % 100 == 0)
        snprintf(out, cap, "%s%d", k < 0 ? "-" : "", a / 100);
    else if (a % 10 == 0)
        snprintf(out, cap, "%s%d.%d", k < 0 ? "-" : "", a / 100, (a % 100) / 10);
    else
        snprintf(out, cap, "%s%d.%02d", k < 0 ? "-" : "", a / 100, a % 100);
}

/* Every number of hundredths in [-4, 4] against each combination of decimal bounds. */
START_TEST(test_number_bounds_exhaustive) {
    static const int bounds[] = {-250, -100, -25, 0, 10, 50, 100, 175, 300}; /* hundredths */
    const int nb = sizeof bounds / sizeof bounds[0];
    char schema[256], text[80], lo_t[32], hi_t[32];
    for (int li = -1; li < nb; li++) {
        for (int hi = -1; hi < nb; hi++) {
            for (int ex = 0; ex < 4; ex++) {
                const bool lo_ex = ex & 1, hi_ex = ex & 2;
                if ((li < 0 && lo_ex) || (hi < 0 && hi_ex)) continue;
                if (li >= 0 && hi >= 0 && bounds[li] >= bounds[hi]) continue;
                int n = snprintf(schema, sizeof schema, "{\"type\":\"number\"");
                if (li >= 0) {
                    centi_text(bounds[li], lo_t, sizeof lo_t);
                    n += snprintf(schema + n, sizeof schema - (size_t)n, ",\"%s\":%s",
                                  lo_ex ? "exclusiveMinimum" : "minimum", lo_t);
                }
                if (hi >= 0) {
                    centi_text(bounds[hi], hi_t, sizeof hi_t);
                    n += snprintf(schema + n, sizeof schema - (size_t)n, ",\"%s\":%s",
                                  hi_ex ? "exclusiveMaximum" : "maximum", hi_t);
                }
                snprintf(schema + n, sizeof schema - (size_t)n, "}");
                regex_dfa d = compile_schema(schema);
                for (int k = -400; k <= 400; k++) {
                    centi_text(k, text, sizeof text);
                    bool in = true;
                    if (li >= 0) in = in && (lo_ex ? k > bounds[li] : k >= bounds[li]);
                    if (hi >= 0) in = in && (hi_ex ? k < bounds[hi] : k <= bounds[hi]);
                    EXPECT(matches(&d, text) == in, "%s on %s", schema, text);
                }
                /* Just past a bound, by less than a hundredth. */
                if (li >= 0 && bounds[li] >= 0) {
                    snprintf(text, sizeof text, "%s%s001", lo_t, strchr(lo_t, '.') ? "" : ".");
                    EXPECT(matches(&d, text) == (hi < 0 || bounds[hi] > bounds[li]), "%s on %s",
                           schema, text);
                }
                EXPECT(!matches(&d, "1.50") &&
                           (li < 0 && hi < 0 ? matches(&d, "1e1") : !matches(&d, "1e1")),
                       "%s", schema);
                regex__free(&d);
            }
        }
    }
}
END_TEST

START_TEST(test_number_bounds_edges) {
    /* A real bound is its shortest decimal: 0.1 is 0.1, not 0.1000000000000000055... */
    expect_language("{\"type\":\"number\",\"maximum\":0.1}", L("0.1", "0.09999", "-3"),
                    L("0.10000000000001", "0.11"));
    expect_language("{\"type\":\"number\",\"exclusiveMinimum\":0}", L("0.00001", "5"),
                    L("0", "-0", "-0.5"));
    expect_language("{\"type\":\"number\",\"exclusiveMaximum\":0}", L("-0.00001", "-5"),
                    L("0", "0.1"));
    /* At most 15 significant digits once bounded. */
    expect_language("{\"type\":\"number\",\"minimum\":0,\"maximum\":10}",
                    L("9.99999999999999", "0.00000000000001"),
                    L("9.999999999999999", "0.000000000000001"));
    /* Integer bounds from reals, and draft 4's boolean exclusives. */
    expect_language("{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":3.5}", L("2", "3"),
                    L("1", "4"));
    expect_language("{\"type\":\"integer\",\"minimum\":2,\"exclusiveMinimum\":true,\"maximum\":4,"
                    "\"exclusiveMaximum\":true}",
                    L("3"), L("2", "4"));
    /* Tighter of the two on one side. */
    expect_language("{\"type\":\"integer\",\"minimum\":5,\"exclusiveMinimum\":5}", L("6"), L("5"));
    expect_language("{\"type\":\"integer\",\"minimum\":6,\"exclusiveMinimum\":2}", L("6"), L("5"));
    /* Large integer bounds, exactly. */
    expect_language("{\"type\":\"integer\",\"minimum\":999999999999999990,\"maximum\":"
                    "1000000000000000000}",
                    L("999999999999999990", "1000000000000000000"),
                    L("999999999999999989", "1000000000000000001"));
    expect_language("{\"type\":\"integer\",\"minimum\":10000000000000000}",
                    L("10000000000000000", "99999999999999999"), L("9999999999999999"));
}
END_TEST

/* ---- core: samples of realistic schemas validate ----------------------------------------------
 */

static const char *const corpus[] = {
    PERSON,
    "{\"type\":\"json_object\"}",
    "{\"$defs\":{\"addr\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\","
    "\"maxLength\":20},\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"},\"country\":{"
    "\"enum\":[\"DE\",\"FR\",\"US\"]}},\"required\":[\"street\",\"zip\"]}},\"type\":\"object\","
    "\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":12},\"home\":{"
    "\"$ref\":\"#/$defs/addr\"},\"work\":{\"anyOf\":[{\"$ref\":\"#/$defs/addr\"},{\"type\":"
    "\"null\"}]},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":8},"
    "\"maxItems\":4}},\"required\":[\"name\",\"home\"]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":"
    "\"string\",\"format\":\"uuid\"},\"when\":{\"type\":\"string\",\"format\":\"date-time\"},"
    "\"score\":{\"type\":\"number\",\"minimum\":-1,\"maximum\":1},\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"id\",\"score\"]},\"minItems\":1,\"maxItems\":3}",
    "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"circle\"},\"r\":{"
    "\"type\":\"number\",\"exclusiveMinimum\":0}},\"required\":[\"kind\",\"r\"]},{\"type\":"
    "\"object\",\"properties\":{\"kind\":{\"const\":\"rect\"},\"w\":{\"type\":\"integer\","
    "\"minimum\":1},\"h\":{\"type\":\"integer\",\"minimum\":1}},\"required\":[\"kind\",\"w\","
    "\"h\"]}]}",
    "{\"type\":\"object\",\"properties\":{\"temp\":{\"type\":\"number\",\"minimum\":-273.15,"
    "\"maximum\":1000},\"count\":{\"type\":\"integer\",\"exclusiveMinimum\":-5,"
    "\"exclusiveMaximum\":1000000},\"ratio\":{\"type\":\"number\",\"exclusiveMinimum\":0,"
    "\"exclusiveMaximum\":1}},\"required\":[\"temp\",\"count\",\"ratio\"]}",
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"array\",\"items\":{\"type\":"
    "[\"integer\",\"null\"]}}}",
    "{\"type\":\"object\",\"properties\":{\"day\":{\"type\":\"string\",\"format\":\"date\"},"
    "\"at\":{\"type\":\"string\",\"format\":\"time\"},\"mail\":{\"type\":\"string\",\"format\":"
    "\"email\"},\"ip\":{\"type\":\"string\",\"format\":\"ipv4\"},\"any\":true,\"note\":{"
    "\"type\":\"string\",\"pattern\":\"[\\\"\\\\\\\\]\"}}}",
};

START_TEST(test_samples_validate) {
#ifdef CORRAL_SANITIZE
    const int n = 50;
#else
    const int n = 300;
#endif
    for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++)
        sample_and_validate(corpus[i], n, 0x5EED0000u + i);
}
END_TEST

START_TEST(test_any_depth_is_bounded) {
    /* json_object: the object, then JSON_SCHEMA_ANY_DEPTH more levels of containers. */
    const int deepest = sample_and_validate("{\"type\":\"json_object\"}", 400, 7);
    ck_assert_int_le(deepest, JSON_SCHEMA_ANY_DEPTH + 1);
    ck_assert_int_ge(deepest, 2);
    const char *nested = "{\"a\":{\"b\":{\"c\":1}}}", *deeper = "{\"a\":{\"b\":{\"c\":{\"d\":1}}}}";
    expect_language("{\"type\":\"json_object\"}", L(nested), L(deeper));
}
END_TEST

/* ---- core: through the constraint API ---------------------------------------------------------
 */

START_TEST(test_constraint_compile_as) {
    corral_error err = {0};
    gguf_file *f = gguf_open(test_shared_path("models/stories260K.gguf"), &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    tokenizer *t = tok_new_from_gguf(f, &err);
    ck_assert_msg(t != NULL, "%s", err.message);
    constraint_cache *cc = constraint_cache_new(t, 4, &err);
    ck_assert_ptr_nonnull(cc);
    const char *schema = "{\"type\":\"integer\",\"minimum\":1,\"maximum\":3}";
    constraint *a =
        constraint_compile_cached_as(cc, CONSTRAINT_JSON_SCHEMA, schema, strlen(schema), &err);
    ck_assert_msg(a != NULL, "%s", err.message);
    ck_assert_int_eq(constraint_source_syntax(a), CONSTRAINT_JSON_SCHEMA);
    ck_assert(constraint_match(a, "2", 1) && !constraint_match(a, "4", 1));
    /* The same text as a regex is another constraint (the key is syntax and text). */
    constraint *b = constraint_compile_cached_as(cc, CONSTRAINT_REGEX, "[0-9]", 5, &err);
    constraint *c =
        constraint_compile_cached_as(cc, CONSTRAINT_JSON_SCHEMA, schema, strlen(schema), &err);
    ck_assert_ptr_eq(a, c);
    ck_assert_ptr_ne(a, b);
    uint64_t hits, misses;
    constraint_cache_stats(cc, &hits, &misses);
    ck_assert_uint_eq(hits, 1);
    ck_assert_uint_eq(misses, 2);
    /* Errors come back named. */
    const char *bad = "{\"type\":\"integer\",\"multipleOf\":3}";
    ck_assert_ptr_null(
        constraint_compile_cached_as(cc, CONSTRAINT_JSON_SCHEMA, bad, strlen(bad), &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    ck_assert_str_eq(err.message, "json schema: #/multipleOf: multipleOf is not supported");
    constraint_destroy(&a);
    constraint_destroy(&b);
    constraint_destroy(&c);
    constraint_cache_destroy(&cc);
    tok_destroy(&t);
    gguf_destroy(&f);
}
END_TEST

/* ---- limits -----------------------------------------------------------------------------------
 */

/* {"properties":{"p":{"properties":{"p":...{"type":"integer"}...}}}} with `levels` objects. */
static char *nested_schema(int levels) {
    char *s = malloc((size_t)levels * 32 + 64);
    size_t n = 0;
    for (int i = 0; i < levels; i++) n += (size_t)sprintf(s + n, "{\"properties\":{\"p\":");
    n += (size_t)sprintf(s + n, "{\"type\":\"integer\"}");
    for (int i = 0; i < levels; i++) n += (size_t)sprintf(s + n, "}}");
    s[n] = '\0';
    return s;
}

START_TEST(test_depth_limit) {
    /* The deepest schema allowed compiles all the way to a DFA (the regex compiler's group
     * nesting limit holds); one more level is refused by name, with its place. */
    char *ok = nested_schema(JSON_SCHEMA_MAX_DEPTH - 1);
    regex_dfa d = compile_schema(ok);
    regex__free(&d);
    free(ok);
    char *deep = nested_schema(JSON_SCHEMA_MAX_DEPTH);
    expect_error(deep, CORRAL_RESOURCE_EXHAUSTED, "JSON_SCHEMA_MAX_DEPTH");
    expect_error(deep, CORRAL_RESOURCE_EXHAUSTED, "#/properties/p/properties/p/properties/p");
    free(deep);
}
END_TEST

START_TEST(test_size_limits) {
    /* Schema text. */
    const size_t big = JSON_SCHEMA_MAX_BYTES + 1;
    char *s = malloc(big + 1);
    memset(s, ' ', big);
    s[0] = '{';
    s[big - 1] = '}';
    s[big] = '\0';
    expect_error(s, CORRAL_RESOURCE_EXHAUSTED, "JSON_SCHEMA_MAX_BYTES");
    free(s);
    /* Counts. */
    expect_error("{\"type\":\"string\",\"maxLength\":1001}", CORRAL_RESOURCE_EXHAUSTED,
                 "#/maxLength: maxLength 1001 is above the limit of 1000 (JSON_SCHEMA_MAX_COUNT)");
    expect_error("{\"type\":\"array\",\"minItems\":5000}", CORRAL_RESOURCE_EXHAUSTED, "#/minItems");
    /* The pattern: a definition used by many properties, each a copy. */
    char *wide = malloc(1 << 20);
    size_t n = (size_t)sprintf(wide, "{\"$defs\":{\"s\":{\"type\":\"string\",\"maxLength\":5}},"
                                     "\"properties\":{");
    for (int i = 0; i < 2000; i++)
        n += (size_t)sprintf(wide + n, "%s\"p%d\":{\"$ref\":\"#/$defs/s\"}", i ? "," : "", i);
    sprintf(wide + n, "},\"required\":[\"p0\"]}");
    expect_error(wide, CORRAL_RESOURCE_EXHAUSTED, "JSON_SCHEMA_MAX_REGEX");
    /* Subschemas visited: a fan-out of references, each small (8^5 uses of the last one). */
    n = (size_t)sprintf(wide, "{\"$defs\":{");
    for (int i = 0; i < 5; i++) {
        n += (size_t)sprintf(wide + n, "\"d%d\":{\"anyOf\":[", i);
        for (int k = 0; k < 8; k++)
            n += (size_t)sprintf(wide + n, "%s{\"$ref\":\"#/$defs/d%d\"}", k ? "," : "", i + 1);
        n += (size_t)sprintf(wide + n, "]},");
    }
    sprintf(wide + n, "\"d5\":{\"type\":\"null\"}},\"$ref\":\"#/$defs/d0\"}");
    expect_error(wide, CORRAL_RESOURCE_EXHAUSTED, "JSON_SCHEMA_MAX_NODES");
    /* oneOf branches checked. */
    n = (size_t)sprintf(wide, "{\"oneOf\":[");
    for (int i = 0; i <= JSON_SCHEMA_MAX_ONEOF; i++)
        n += (size_t)sprintf(wide + n, "%s{\"const\":%d}", i ? "," : "", i);
    sprintf(wide + n, "]}");
    expect_error(wide, CORRAL_RESOURCE_EXHAUSTED, "JSON_SCHEMA_MAX_ONEOF");
    free(wide);
    /* Bounds. */
    expect_error("{\"type\":\"integer\",\"maximum\":1000000000000000001}", CORRAL_INVALID_ARGUMENT,
                 "#/maximum: maximum 1000000000000000001 is not supported");
    expect_error("{\"type\":\"number\",\"minimum\":-1e15}", CORRAL_INVALID_ARGUMENT,
                 "#/minimum: minimum -1e+15 is not supported");
    expect_error("{\"type\":\"number\",\"minimum\":1e-40}", CORRAL_INVALID_ARGUMENT,
                 "at most 30 digits after the point");
}
END_TEST

START_TEST(test_typical_schemas_within_regex_limits) {
    /* What the corpus costs: the pattern and the automaton stay well within the limits (the time
     * is measured by tests/bench/constraint --schema). */
    for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++) {
        char *re = to_regex(corpus[i]);
        regex_dfa d;
        regex_stats st;
        corral_error err = {0};
        ck_assert_int_eq(regex__compile(re, strlen(re), REGEX_GENERATED, &d, &st, &err), CORRAL_OK);
        ck_assert_uint_lt(strlen(re), JSON_SCHEMA_MAX_REGEX / 4);
        ck_assert_uint_lt(st.dfa_states, REGEX_MAX_DFA_STATES * 3 / 4);
        ck_assert_uint_lt(st.work, REGEX_MAX_COMPILE_WORK / 2);
        regex__free(&d);
        free(re);
    }
}
END_TEST

START_TEST(test_long_pointer_is_cut) {
    char name[200];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    char schema[2048];
    snprintf(schema, sizeof schema,
             "{\"properties\":{\"%s\":{\"properties\":{\"%s\":{\"not\":{}}}}}}", name, name);
    expect_error(schema, CORRAL_INVALID_ARGUMENT, "/.../not: 'not' (negation) is not supported");
}
END_TEST

/* ---- errors -----------------------------------------------------------------------------------
 */

START_TEST(test_refusals_name_their_place) {
    static const struct {
        const char *schema;
        corral_status st;
        const char *message;
    } cases[] = {
        {"{\"type\":", CORRAL_INVALID_ARGUMENT, "json schema: not valid JSON: line 1, column"},
        {"{\"a\":1,\"a\":2}", CORRAL_INVALID_ARGUMENT, "duplicate object key"},
        {"false", CORRAL_INVALID_ARGUMENT, "json schema: #: the schema false accepts nothing"},
        {"[]", CORRAL_INVALID_ARGUMENT, "json schema: #: a schema must be an object or a boolean"},
        {"{\"type\":\"strin\"}", CORRAL_INVALID_ARGUMENT, "json schema: #/type: unknown type"},
        {"{\"type\":[]}", CORRAL_INVALID_ARGUMENT, "#/type: type must not be an empty array"},
        {"{\"not\":{}}", CORRAL_INVALID_ARGUMENT, "#/not: 'not' (negation) is not supported"},
        {"{\"properties\":{\"age\":{\"type\":\"integer\",\"multipleOf\":2}}}",
         CORRAL_INVALID_ARGUMENT, "json schema: #/properties/age/multipleOf: multipleOf is not"},
        {"{\"if\":{},\"then\":{}}", CORRAL_INVALID_ARGUMENT, "if/then/else is not supported"},
        {"{\"type\":\"object\",\"patternProperties\":{}}", CORRAL_INVALID_ARGUMENT,
         "#/patternProperties: patternProperties is not supported"},
        {"{\"type\":\"object\",\"minProperties\":1}", CORRAL_INVALID_ARGUMENT, "#/minProperties"},
        {"{\"prefixItems\":[{}]}", CORRAL_INVALID_ARGUMENT, "#/prefixItems: prefixItems"},
        {"{\"items\":[{}]}", CORRAL_INVALID_ARGUMENT, "#/items: items as an array"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", CORRAL_INVALID_ARGUMENT,
         "#/uniqueItems: uniqueItems true is not supported"},
        {"{\"type\":\"array\",\"contains\":{}}", CORRAL_INVALID_ARGUMENT, "#/contains"},
        {"{\"properties\":{\"a\":{}},\"required\":[\"a\",\"b\"]}", CORRAL_INVALID_ARGUMENT,
         "#/required/1: required property 'b' is not in properties"},
        {"{\"required\":[1]}", CORRAL_INVALID_ARGUMENT, "#/required/0: required must list strings"},
        {"{\"properties\":[]}", CORRAL_INVALID_ARGUMENT, "#/properties: properties must be"},
        {"{\"$ref\":\"http://example.com/s.json\"}", CORRAL_INVALID_ARGUMENT,
         "#/$ref: $ref 'http://example.com/s.json' is not supported: only references within"},
        {"{\"$ref\":\"#/$defs/none\"}", CORRAL_INVALID_ARGUMENT,
         "#/$ref: $ref '#/$defs/none' points nowhere"},
        {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#/$defs/"
         "node\"}}}},\"$ref\":\"#/$defs/node\"}",
         CORRAL_INVALID_ARGUMENT,
         "json schema: #/$defs/node/properties/next/$ref: recursive $ref '#/$defs/node' is not "
         "supported"},
        {"{\"properties\":{\"self\":{\"$ref\":\"#\"}}}", CORRAL_INVALID_ARGUMENT,
         "#/properties/self/$ref: recursive $ref '#'"},
        {"{\"$ref\":\"#/$defs/a\",\"type\":\"string\",\"$defs\":{\"a\":{}}}",
         CORRAL_INVALID_ARGUMENT, "#/type: 'type' beside $ref is not supported"},
        {"{\"$defs\":{\"a\":{\"$anchor\":\"x\"}},\"$ref\":\"#/$defs/a\"}", CORRAL_INVALID_ARGUMENT,
         "#/$defs/a/$anchor"},
        {"{\"type\":\"string\",\"format\":\"uri\"}", CORRAL_INVALID_ARGUMENT,
         "#/format: format 'uri' is not supported (supported: date, time, date-time, uuid, "
         "email, ipv4)"},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)\"}", CORRAL_INVALID_ARGUMENT,
         "#/pattern: regex: lookahead (?=...) is not supported"},
        /* A pattern no string matches, named where it is (found by fuzz_json_schema). */
        {"{\"properties\":{\"sku\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-[0-9]{4[]}$\"}}}",
         CORRAL_INVALID_ARGUMENT, "#/properties/sku/pattern: regex: the pattern matches nothing"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", CORRAL_INVALID_ARGUMENT,
         "#/pattern: regex: backreferences"},
        {"{\"type\":\"string\",\"pattern\":3}", CORRAL_INVALID_ARGUMENT,
         "#/pattern: pattern must be a string"},
        {"{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}", CORRAL_INVALID_ARGUMENT,
         "#/maxLength: maxLength together with pattern is not supported"},
        {"{\"type\":\"string\",\"format\":\"date\",\"pattern\":\"a\"}", CORRAL_INVALID_ARGUMENT,
         "#/pattern: pattern together with format"},
        {"{\"type\":\"string\",\"minLength\":-1}", CORRAL_INVALID_ARGUMENT,
         "#/minLength: minLength must be a non-negative integer"},
        {"{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", CORRAL_INVALID_ARGUMENT,
         "#/maxLength: maxLength 2 is below minLength 3"},
        {"{\"type\":\"integer\",\"minimum\":3,\"maximum\":2}", CORRAL_INVALID_ARGUMENT,
         "#/maximum: no integer is within minimum and maximum"},
        {"{\"type\":\"number\",\"exclusiveMinimum\":1,\"maximum\":1}", CORRAL_INVALID_ARGUMENT,
         "#/maximum: no number is within exclusiveMinimum and maximum"},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":2,\"exclusiveMaximum\":3}",
         CORRAL_INVALID_ARGUMENT, "#/exclusiveMinimum: no integer within the bounds"},
        {"{\"type\":\"number\",\"minimum\":\"1\"}", CORRAL_INVALID_ARGUMENT,
         "#/minimum: minimum must be a number"},
        {"{\"anyOf\":[{\"type\":\"string\"}],\"type\":\"string\"}", CORRAL_INVALID_ARGUMENT,
         "#/type: 'type' beside anyOf is not supported (move it into each branch)"},
        {"{\"anyOf\":[]}", CORRAL_INVALID_ARGUMENT, "#/anyOf: anyOf must be a non-empty array"},
        {"{\"anyOf\":[{}],\"oneOf\":[{}]}", CORRAL_INVALID_ARGUMENT,
         "anyOf and oneOf together are not supported"},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"not\":{}}]}", CORRAL_INVALID_ARGUMENT,
         "#/anyOf/1/not"},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", CORRAL_INVALID_ARGUMENT,
         "#/oneOf: branches 0 and 1 overlap: both accept 0;"},
        {"{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"string\",\"format\":\"date\"}]}",
         CORRAL_INVALID_ARGUMENT, "#/oneOf: branches 0 and 1 overlap: both accept \"0001-01-01\""},
        {"{\"allOf\":[{},{}]}", CORRAL_INVALID_ARGUMENT,
         "#/allOf: allOf is supported with exactly one schema"},
        {"{\"enum\":[]}", CORRAL_INVALID_ARGUMENT, "#/enum: enum must be a non-empty array"},
        {"{\"type\":\"string\",\"enum\":[1,2]}", CORRAL_INVALID_ARGUMENT,
         "#/enum: no value of enum has the schema's type"},
        {"{\"enum\":[1],\"minimum\":0}", CORRAL_INVALID_ARGUMENT,
         "#/minimum: 'minimum' together with enum is not supported"},
        {"{\"enum\":[1],\"const\":1}", CORRAL_INVALID_ARGUMENT,
         "#/const: const together with enum is not supported"},
        {"{\"properties\":{\"a\":{\"$id\":\"x\"}}}", CORRAL_INVALID_ARGUMENT,
         "#/properties/a/$id: $id in a subschema is not supported"},
        {"{\"properties\":{\"a\":{\"type\":\"json_object\"}}}", CORRAL_INVALID_ARGUMENT,
         "#/properties/a/type: \"json_object\" is only a whole schema"},
        {"{\"type\":\"json_object\",\"minProperties\":1}", CORRAL_INVALID_ARGUMENT,
         "#/minProperties"},
        {"{\"properties\":{\"a/b~c\":{\"type\":\"bogus\"}}}", CORRAL_INVALID_ARGUMENT,
         "#/properties/a~1b~0c/type: unknown type"},
        {"{\"type\":\"array\",\"items\":false,\"minItems\":1}", CORRAL_INVALID_ARGUMENT,
         "#/minItems: minItems 1 with items false accepts nothing"},
        {"{\"type\":\"object\",\"unevaluatedProperties\":{}}", CORRAL_INVALID_ARGUMENT,
         "#/unevaluatedProperties: unevaluatedProperties other than true or false"},
        {"{\"type\":\"object\",\"additionalProperties\":3}", CORRAL_INVALID_ARGUMENT,
         "#/additionalProperties: additionalProperties must be a schema"},
        {"{\"items\":3}", CORRAL_INVALID_ARGUMENT, "#/items: items must be a schema"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_error(cases[i].schema, cases[i].st, cases[i].message);
}
END_TEST

START_TEST(test_ignored_keywords) {
    /* Annotations, vendor extensions and no-op values change nothing. */
    char *a = to_regex("{\"type\":\"integer\"}");
    char *b =
        to_regex("{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"$id\":"
                 "\"urn:x\",\"title\":\"t\",\"description\":\"d\",\"default\":1,"
                 "\"examples\":[1],\"$comment\":\"c\",\"deprecated\":false,\"readOnly\":"
                 "true,\"x-vendor\":{\"not\":{}},\"propertyOrdering\":[],\"type\":\"integer\","
                 "\"uniqueItems\":false,\"nullable\":false,\"maxLength\":3}");
    ck_assert_str_eq(a, b);
    free(a);
    free(b);
}
END_TEST

START_TEST(test_bad_arguments) {
    corral_error err = {0};
    char *re;
    ck_assert_int_eq(json_schema_to_regex("{}", 2, NULL, NULL, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(json_schema_to_regex(NULL, 2, &re, NULL, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_null(re);
    ck_assert_int_eq(json_schema_to_regex("", 0, &re, NULL, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "not valid JSON"));
    /* Text with a NUL inside is not JSON. */
    ck_assert_int_eq(json_schema_to_regex("{}\0{}", 5, &re, NULL, &err), CORRAL_INVALID_ARGUMENT);
}
END_TEST

static Suite *json_schema_suite(void) {
    Suite *s = suite_create("json_schema");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_object_order_required_layout);
    tcase_add_test(core, test_optional_properties_commas);
    tcase_add_test(core, test_maps_and_any_object);
    tcase_add_test(core, test_arrays);
    tcase_add_test(core, test_string_syntax);
    tcase_add_test(core, test_string_lengths);
    tcase_add_test(core, test_formats);
    tcase_add_test(core, test_pattern_search_and_escaping);
    tcase_add_test(core, test_enum_const_and_literals);
    tcase_add_test(core, test_types_and_combinators);
    tcase_add_test(core, test_refs);
    tcase_add_test(core, test_numbers_unbounded);
    tcase_add_test(core, test_integer_bounds_exhaustive);
    tcase_add_test(core, test_number_bounds_exhaustive);
    tcase_add_test(core, test_number_bounds_edges);
    tcase_add_test(core, test_samples_validate);
    tcase_add_test(core, test_any_depth_is_bounded);
    tcase_add_test(core, test_constraint_compile_as);
    tcase_add_test(core, test_ignored_keywords);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_depth_limit);
    tcase_add_test(limits, test_size_limits);
    tcase_add_test(limits, test_typical_schemas_within_regex_limits);
    tcase_add_test(limits, test_long_pointer_is_cut);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_refusals_name_their_place);
    tcase_add_test(errors, test_bad_arguments);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(json_schema_suite)
