/*
 * fuzz_json.c — how the adapters read JSON (adapters/adapter_json.h: jansson, strictly), which
 * reads PEFT's adapter_config.json and every safetensors header, on arbitrary bytes; then a walk
 * of the whole tree through jansson's accessors and adapter_json's typed reads, and the lookups
 * the PEFT config reader makes (lora.c).
 *
 * Invariants: a failure is CORRAL_FORMAT with "fuzz.json:line:column: ..." or "fuzz.json: nesting
 * deeper than 64 levels" (or out of memory); nesting never exceeds ADAPTER_JSON_DEPTH_MAX; every
 * string and key is valid UTF-8 of the length reported; every member is found again by its key
 * (keys are unique; a key with a NUL inside cannot be asked for by C string); the typed reads
 * agree with the value's type; a parsed document dumps and parses back to an equal one.
 */
#include <math.h>

#include "adapter_json.h"
#include "corral/utf8.h"
#include "fuzz.h"

#define NAME "fuzz.json"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    return 0;
}

static void check_string(const char *s, size_t len, const char *what) {
    FUZZ_CHECK(s != NULL && s[len] == '\0', "%s not NUL-terminated", what);
    FUZZ_CHECK(utf8_validate((const uint8_t *)s, len) == len, "%s is not valid UTF-8", what);
}

static void check_number(const json_t *v) {
    uint64_t u;
    double d;
    const int is_u = adapter_json_u64(v, &u) == 0, is_d = adapter_json_f64(v, &d) == 0;
    FUZZ_CHECK(is_d == json_is_number(v), "f64 read of a %s", adapter_json_kind(v));
    FUZZ_CHECK(is_u == (json_is_integer(v) && json_integer_value(v) >= 0), "u64 read of %s",
               adapter_json_kind(v));
    if (is_d) FUZZ_CHECK(isfinite(d), "f64 not finite");
    if (is_u)
        FUZZ_CHECK(d == (double)json_integer_value(v), "u64 %llu but f64 %g", (unsigned long long)u,
                   d);
}

static void walk(const json_t *v, int depth) {
    FUZZ_CHECK(depth <= ADAPTER_JSON_DEPTH_MAX + 1, "nesting %d", depth);
    FUZZ_CHECK(strcmp(adapter_json_kind(v), "?") != 0, "unknown kind");
    if (json_is_string(v)) check_string(json_string_value(v), json_string_length(v), "string");
    if (json_is_number(v)) check_number(v);
    if (json_is_array(v)) {
        const size_t n = json_array_size(v);
        FUZZ_CHECK(json_array_get(v, n) == NULL, "element past the size");
        for (size_t i = 0; i < n; i++) {
            const json_t *m = json_array_get(v, i);
            FUZZ_CHECK(m != NULL, "element %zu of %zu missing", i, n);
            walk(m, depth + 1);
        }
    }
    if (json_is_object(v)) {
        const char *key;
        size_t klen, n = 0;
        json_t *m;
        json_object_keylen_foreach((json_t *)v, key, klen, m) {
            check_string(key, klen, "key");
            if (strlen(key) == klen)
                FUZZ_CHECK(json_object_get(v, key) == m, "member '%s' not found by its key", key);
            walk(m, depth + 1);
            n++;
        }
        FUZZ_CHECK(n == json_object_size(v), "%zu members walked of %zu", n, json_object_size(v));
    }
}

/* What peft_config_read asks of a config. */
static void read_like_peft(const json_t *root) {
    static const char *const fields[] = {"peft_type",
                                         "r",
                                         "lora_alpha",
                                         "use_rslora",
                                         "rank_pattern",
                                         "alpha_pattern",
                                         "target_modules",
                                         "init_lora_weights",
                                         "base_model_name_or_path",
                                         "use_dora",
                                         "bias",
                                         "modules_to_save"};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const json_t *v = json_object_get(root, fields[i]);
        FUZZ_CHECK(v == NULL || json_is_object(root), "get on a non-object");
        uint64_t u;
        double d;
        (void)adapter_json_u64(v, &u);
        (void)adapter_json_f64(v, &d);
        (void)json_string_value(v);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    corral_error err = {0};
    json_t *doc = adapter_json_parse((const char *)data, size, NAME, &err);
    if (!doc) {
        FUZZ_CHECK(err.status == CORRAL_FORMAT || err.status == CORRAL_OUT_OF_MEMORY,
                   "status %d: %s", (int)err.status, err.message);
        FUZZ_CHECK(err.status != CORRAL_FORMAT || strncmp(err.message, NAME ":", sizeof NAME) == 0,
                   "message does not name the document: %s", err.message);
        return 0;
    }
    walk(doc, 1);
    read_like_peft(doc);
    /* What was read is what the text said: written back and read again, it is equal. */
    char *text = json_dumps(doc, JSON_ENCODE_ANY | JSON_COMPACT);
    FUZZ_CHECK(text != NULL, "dump failed");
    json_t *again = adapter_json_parse(text, strlen(text), NAME, &err);
    FUZZ_CHECK(again != NULL, "the dump does not parse: %s", err.message);
    FUZZ_CHECK(json_equal(doc, again), "the dump parses to another document");
    json_decref(again);
    free(text);
    json_decref(doc);
    return 0;
}
