/*
 * adapter_json.c — the adapters' strict JSON parsing on jansson (contract in adapter_json.h): the
 * flags, the messages, and the nesting check, which walks the parsed tree once (jansson's own
 * limit is 2048 levels).
 */
#include "adapter_json.h"

#include <stdbool.h>

/* The deepest nesting under v (a scalar is 0), stopping once past limit. */
static int depth(const json_t *v, int limit) {
    int deepest = 0;
    if (limit < 0) return 1;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v) && deepest <= limit; i++) {
            const int d = depth(json_array_get(v, i), limit - 1);
            if (d > deepest) deepest = d;
        }
        return deepest + 1;
    }
    if (json_is_object(v)) {
        const char *key;
        json_t *m;
        json_object_foreach((json_t *)v, key, m) {
            const int d = depth(m, limit - 1);
            if (d > deepest) deepest = d;
            if (deepest > limit) break;
        }
        return deepest + 1;
    }
    return 0;
}

json_t *adapter_json_parse(const char *text, size_t len, const char *name, corral_error *err) {
    if (!name) name = "<json>";
    if (!text && len) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "%s: no text", name);
        return NULL;
    }
    json_error_t je;
    json_t *v = json_loadb(text ? text : "", len,
                           JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!v) {
        const bool oom = json_error_code(&je) == json_error_out_of_memory;
        corral_error_set(err, oom ? CORRAL_OUT_OF_MEMORY : CORRAL_FORMAT, "%s:%d:%d: %s", name,
                         je.line, je.column, je.text);
        return NULL;
    }
    if (depth(v, ADAPTER_JSON_DEPTH_MAX) > ADAPTER_JSON_DEPTH_MAX) {
        json_decref(v);
        corral_error_set(err, CORRAL_FORMAT, "%s: nesting deeper than %d levels", name,
                         ADAPTER_JSON_DEPTH_MAX);
        return NULL;
    }
    return v;
}

int adapter_json_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

int adapter_json_f64(const json_t *v, double *out) {
    if (!json_is_number(v)) return -1;
    *out = json_number_value(v);
    return 0;
}

const char *adapter_json_kind(const json_t *v) {
    if (!v) return "absent";
    switch (json_typeof(v)) {
        case JSON_OBJECT:
            return "object";
        case JSON_ARRAY:
            return "array";
        case JSON_STRING:
            return "string";
        case JSON_INTEGER:
            return "integer";
        case JSON_REAL:
            return "real";
        case JSON_TRUE:
            return "true";
        case JSON_FALSE:
            return "false";
        case JSON_NULL:
            return "null";
    }
    return "?";
}
