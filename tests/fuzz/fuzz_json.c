/*
 * fuzz_json.c — adapters' strict JSON reader (adapters/jsonr.h), which reads PEFT's
 * adapter_config.json and every safetensors header, on arbitrary bytes; then a walk of the whole
 * tree through the public accessors, and the lookups the PEFT config reader makes (lora.c).
 *
 * Invariants: a failure is CORRAL_FORMAT with "fuzz.json:line:column: ..." (or out of memory);
 * nesting never exceeds JSONR_DEPTH_MAX; every string and key is valid UTF-8 of the length
 * reported; every member is found again by its key (keys are unique; a key with a NUL inside
 * cannot be asked for by C string); the number getters agree with one another; out-of-range
 * indices give NULL.
 */
#include <math.h>

#include "corral/utf8.h"
#include "fuzz.h"
#include "jsonr.h"

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

static void check_number(const jsonr_value *v) {
    uint64_t u;
    int64_t i;
    double d;
    const int is_u = jsonr_get_u64(v, &u) == 0, is_i = jsonr_get_i64(v, &i) == 0;
    const int is_d = jsonr_get_f64(v, &d) == 0;
    if (is_u && u <= INT64_MAX)
        FUZZ_CHECK(is_i && (uint64_t)i == u, "u64 %llu but not i64", (unsigned long long)u);
    /* "-0" reads as i64 0 but is not a u64 (it has a sign): only positive values must agree. */
    if (is_i && i > 0) FUZZ_CHECK(is_u && u == (uint64_t)i, "i64 %lld but not u64", (long long)i);
    if (is_d) FUZZ_CHECK(isfinite(d), "f64 not finite");
    /* strtod and the conversion of the integer both round to the nearest double. */
    if (is_i) FUZZ_CHECK(is_d && d == (double)i, "i64 %lld but f64 %g", (long long)i, d);
}

static void walk(const jsonr_value *v, int depth) {
    FUZZ_CHECK(depth <= JSONR_DEPTH_MAX + 1, "nesting %d", depth);
    const jsonr_kind k = jsonr_value_kind(v);
    FUZZ_CHECK(k < JSONR_KIND_COUNT, "kind %d", (int)k);
    FUZZ_CHECK(jsonr_kind_name(k) != NULL, "kind %d has no name", (int)k);
    const size_t n = jsonr_count(v);
    FUZZ_CHECK(n == 0 || k == JSONR_ARRAY || k == JSONR_OBJECT, "a %s with %zu members",
               jsonr_kind_name(k), n);
    FUZZ_CHECK(jsonr_at(v, n) == NULL, "member past the count");
    FUZZ_CHECK(jsonr_key_at(v, n, NULL) == NULL, "key past the count");
    size_t len = 0;
    const char *s = jsonr_str(v, &len);
    FUZZ_CHECK((s != NULL) == (k == JSONR_STRING), "jsonr_str on a %s", jsonr_kind_name(k));
    if (s) check_string(s, len, "string");
    if (k == JSONR_NUMBER) check_number(v);
    for (size_t i = 0; i < n; i++) {
        const jsonr_value *m = jsonr_at(v, i);
        FUZZ_CHECK(m != NULL, "member %zu of %zu missing", i, n);
        if (k == JSONR_OBJECT) {
            size_t klen = 0;
            const char *key = jsonr_key_at(v, i, &klen);
            check_string(key, klen, "key");
            if (strlen(key) == klen)
                FUZZ_CHECK(jsonr_get(v, key) == m, "member '%s' not found by its key", key);
        } else {
            FUZZ_CHECK(jsonr_key_at(v, i, NULL) == NULL, "an array element has a key");
        }
        walk(m, depth + 1);
    }
}

/* What peft_config_read asks of a config. */
static void read_like_peft(const jsonr_value *root) {
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
        const jsonr_value *v = jsonr_get(root, fields[i]);
        FUZZ_CHECK(v == NULL || jsonr_value_kind(root) == JSONR_OBJECT, "get on a non-object");
        uint64_t u;
        double d;
        (void)jsonr_get_u64(v, &u);
        (void)jsonr_get_f64(v, &d);
        (void)jsonr_str(v, NULL);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    corral_error err = {0};
    jsonr_doc *doc = jsonr_parse((const char *)data, size, NAME, &err);
    if (!doc) {
        FUZZ_CHECK(err.status == CORRAL_FORMAT || err.status == CORRAL_OUT_OF_MEMORY,
                   "status %d: %s", (int)err.status, err.message);
        FUZZ_CHECK(err.status != CORRAL_FORMAT || strncmp(err.message, NAME ":", sizeof NAME) == 0,
                   "message does not name the document: %s", err.message);
        return 0;
    }
    const jsonr_value *root = jsonr_root(doc);
    FUZZ_CHECK(root != NULL, "no root");
    walk(root, 1);
    read_like_peft(root);
    jsonr_destroy(&doc);
    FUZZ_CHECK(doc == NULL, "jsonr_destroy left the pointer");
    return 0;
}
