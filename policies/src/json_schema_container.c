/*
 * json_schema_container.c — the JSON Schema compiler's objects and arrays (json_schema.h,
 * "object", "array" and "Layout of the output"): the bounded whitespace between tokens, "any
 * value" for what a schema leaves open, maps, arrays with their counts, and objects with declared
 * properties in the schema's order.
 *
 * A container's member pattern is needed twice in `X(?:,X)*` (and an optional property twice in
 * the nested form below): it is written once into its own text and pasted, so the walk visits
 * each subschema once.
 */
#include <stdlib.h>
#include <string.h>

#include "json_schema_impl.h"

/* ---- whitespace ------------------------------------------------------------------------------ */

/* After `{`, `[` and `,` inside a container whose members are at nesting `level`: nothing, one
 * space, or a newline and up to JSON_SCHEMA_INDENT spaces per level. Before the closing bracket,
 * the same for level - 1. */
static void ws(regex_text *out, int level) {
    int n = level * JSON_SCHEMA_INDENT;
    if (n > JSON_SCHEMA_MAX_INDENT) n = JSON_SCHEMA_MAX_INDENT;
    if (n <= 0)
        regex__text_puts(out, "(?:[ ]|\\n)?");
    else
        regex__text_printf(out, "(?:[ ]|\\n[ ]{0,%d})?", n);
}

#define COLON "[ ]?" /* after ':' */

/* ---- any value ------------------------------------------------------------------------------- */

/* A map: any keys, each value `value` (a pattern), at nesting `level`. */
void js__map_of(regex_text *out, const regex_text *value, int level) {
    regex__text_puts(out, "(?:\\{\\}|\\{");
    for (int i = 0; i < 2; i++) {
        if (i) regex__text_puts(out, "(?:,");
        ws(out, level + 1);
        js__any_string(out);
        regex__text_puts(out, ":" COLON);
        regex__text_put(out, value->data, value->len);
        if (i) regex__text_puts(out, ")*");
    }
    ws(out, level);
    regex__text_puts(out, "\\})");
}

/* An array of `item` with counts min..max (max -1: any), at nesting `level`. */
static void array_of(regex_text *out, const regex_text *item, int level, int64_t min, int64_t max) {
    if (max == 0) {
        regex__text_puts(out, "\\[\\]");
        return;
    }
    if (min <= 0) regex__text_puts(out, "(?:\\[\\]|");
    regex__text_puts(out, "\\[");
    ws(out, level + 1);
    regex__text_put(out, item->data, item->len);
    regex__text_puts(out, "(?:,");
    ws(out, level + 1);
    regex__text_put(out, item->data, item->len);
    regex__text_puts(out, ")");
    const int64_t a = min > 1 ? min - 1 : 0;
    if (max < 0)
        regex__text_printf(out, a ? "{%lld,}" : "*", (long long)a);
    else
        regex__text_printf(out, "{%lld,%lld}", (long long)a, (long long)(max - 1));
    ws(out, level);
    regex__text_puts(out, "\\]");
    if (min <= 0) regex__text_puts(out, ")");
}

/* Any JSON value at nesting `level`, containers nested at most `depth` more. */
bool js__any_value(js_ctx *j, regex_text *out, int level, int depth) {
    regex__text_puts(out, "(?:");
    js__any_string(out);
    regex__text_puts(out, "|");
    js__any_number(out);
    regex__text_puts(out, "|true|false|null");
    if (depth > 0) {
        regex_text inner = {.limit = JSON_SCHEMA_MAX_REGEX};
        js__any_value(j, &inner, level + 1, depth - 1);
        if (inner.status != CORRAL_OK && out->status == CORRAL_OK) out->status = inner.status;
        regex__text_puts(out, "|");
        js__map_of(out, &inner, level);
        regex__text_puts(out, "|");
        array_of(out, &inner, level, 0, -1);
        free(inner.data);
    }
    return regex__text_puts(out, ")");
}

/* The JSON text of string s as a pattern (a property name). */
static bool literal_string(js_ctx *j, const char *s) {
    json_t *v = json_string(s);
    if (!v) return js__fail(j, NULL, CORRAL_OUT_OF_MEMORY, "out of memory");
    const bool ok = js__literal(j, v);
    json_decref(v);
    return ok;
}

/* An object with properties: the declared ones only, in the schema's order (json_schema.h). */
static bool object_declared(js_ctx *j, const json_t *props, const json_t *required, int level) {
    const size_t n = json_object_size(props);
    regex_text *members = calloc(n, sizeof *members);
    bool *req = calloc(n, sizeof *req);
    bool ok = members && req;
    if (!ok) js__fail(j, NULL, CORRAL_OUT_OF_MEMORY, "out of memory");
    /* Each member's text, "key": value, once. */
    size_t i = 0, first_required = n;
    const char *key;
    json_t *sub;
    const size_t mark = js__ptr_push(j, "properties");
    json_object_foreach((json_t *)props, key, sub) {
        if (!ok) break;
        regex_text value;
        ok = js__emit_to(j, &value, sub, key, 0, level + 1);
        if (ok) {
            regex_text *m = &members[i];
            *m = (regex_text){.limit = JSON_SCHEMA_MAX_REGEX};
            regex_text *saved = j->out;
            j->out = m;
            literal_string(j, key);
            regex__text_puts(m, ":" COLON);
            regex__text_put(m, value.data, value.len);
            j->out = saved;
            if (m->status != CORRAL_OK && j->out->status == CORRAL_OK) j->out->status = m->status;
            ok = js__ok(j);
        }
        free(value.data);
        for (size_t r = 0; ok && r < json_array_size(required); r++)
            if (strcmp(json_string_value(json_array_get(required, r)), key) == 0) req[i] = true;
        if (req[i] && first_required == n) first_required = i;
        i++;
    }
    js__ptr_pop(j, mark);
    regex_text *out = j->out;
    if (ok && first_required < n) {
        /* Optional members before the first required one are followed by a comma; after it,
         * each member is preceded by one. */
        regex__text_puts(out, "\\{");
        ws(out, level + 1);
        for (size_t k = 0; k < n; k++) {
            if (k < first_required) {
                regex__text_puts(out, "(?:");
                regex__text_put(out, members[k].data, members[k].len);
                regex__text_puts(out, ",");
                ws(out, level + 1);
                regex__text_puts(out, ")?");
            } else if (k == first_required) {
                regex__text_put(out, members[k].data, members[k].len);
            } else {
                regex__text_puts(out, req[k] ? "(?:," : "(?:,");
                ws(out, level + 1);
                regex__text_put(out, members[k].data, members[k].len);
                regex__text_puts(out, req[k] ? ")" : ")?");
            }
        }
        ws(out, level);
        regex__text_puts(out, "\\}");
    } else if (ok) {
        /* No member is required: any ordered subset. P(k), the non-empty subsets of the first k
         * members, is P(k-1) optionally followed by member k, or member k alone; written nested
         * so that each member appears twice (the flat "which one comes first" form repeats the
         * members after it for every choice: quadratic). */
        regex__text_puts(out, "(?:\\{\\}|\\{");
        ws(out, level + 1);
        for (size_t k = 1; k < n; k++) regex__text_puts(out, "(?:");
        regex__text_put(out, members[0].data, members[0].len);
        for (size_t k = 1; k < n; k++) {
            regex__text_puts(out, "(?:,");
            ws(out, level + 1);
            regex__text_put(out, members[k].data, members[k].len);
            regex__text_puts(out, ")?|");
            regex__text_put(out, members[k].data, members[k].len);
            regex__text_puts(out, ")");
        }
        ws(out, level);
        regex__text_puts(out, "\\})");
    }
    for (size_t k = 0; members && k < n; k++) free(members[k].data);
    free(members);
    free(req);
    return ok && js__ok(j);
}

bool js__object(js_ctx *j, const json_t *s, int level) {
    const json_t *props = json_object_get(s, "properties");
    const json_t *required = json_object_get(s, "required");
    const json_t *extra = json_object_get(s, "additionalProperties");
    const json_t *unevaluated = json_object_get(s, "unevaluatedProperties");
    if (props && !json_is_object(props))
        return js__fail(j, "properties", CORRAL_INVALID_ARGUMENT, "properties must be an object");
    if (extra && !json_is_object(extra) && !json_is_boolean(extra))
        return js__fail(j, "additionalProperties", CORRAL_INVALID_ARGUMENT,
                        "additionalProperties must be a schema (an object or a boolean)");
    if (unevaluated && !json_is_boolean(unevaluated))
        return js__fail(j, "unevaluatedProperties", CORRAL_INVALID_ARGUMENT,
                        "unevaluatedProperties other than true or false is not supported");
    if (required && !json_is_array(required))
        return js__fail(j, "required", CORRAL_INVALID_ARGUMENT, "required must be an array");
    for (size_t i = 0; i < json_array_size(required); i++) {
        const json_t *name = json_array_get(required, i);
        const size_t mark = js__ptr_push(j, "required");
        bool bad = false;
        if (!json_is_string(name)) {
            const size_t m2 = js__ptr_push_index(j, i);
            js__fail(j, NULL, CORRAL_INVALID_ARGUMENT, "required must list strings");
            js__ptr_pop(j, m2);
            bad = true;
        } else if (!json_object_get(props, json_string_value(name))) {
            const size_t m2 = js__ptr_push_index(j, i);
            js__fail(j, NULL, CORRAL_INVALID_ARGUMENT,
                     "required property '%.64s' is not in properties (its value would be "
                     "unconstrained: declare it)",
                     json_string_value(name));
            js__ptr_pop(j, m2);
            bad = true;
        }
        js__ptr_pop(j, mark);
        if (bad) return false;
    }
    if (json_object_size(props) > 0) return object_declared(j, props, required, level);
    /* No properties: a map whose values follow additionalProperties. */
    if (json_is_false(extra) || json_is_false(unevaluated))
        return regex__text_puts(j->out, "\\{\\}") && js__ok(j);
    regex_text value;
    if (json_is_object(extra)) {
        if (!js__emit_to(j, &value, extra, "additionalProperties", 0, level + 1)) {
            free(value.data);
            return false;
        }
    } else {
        value = (regex_text){.limit = JSON_SCHEMA_MAX_REGEX};
        js__any_value(j, &value, level + 1, JSON_SCHEMA_ANY_DEPTH);
    }
    js__map_of(j->out, &value, level);
    free(value.data);
    return js__ok(j);
}

bool js__array(js_ctx *j, const json_t *s, int level) {
    const json_t *items = json_object_get(s, "items");
    int64_t min, max;
    if (!js__counts(j, s, "minItems", "maxItems", &min, &max)) return false;
    if (json_is_array(items))
        return js__fail(j, "items", CORRAL_INVALID_ARGUMENT,
                        "items as an array (a tuple) is not supported");
    if (json_is_false(items)) {
        if (min > 0)
            return js__fail(j, "minItems", CORRAL_INVALID_ARGUMENT,
                            "minItems %lld with items false accepts nothing", (long long)min);
        max = 0;
    }
    if (items && !json_is_object(items) && !json_is_boolean(items))
        return js__fail(j, "items", CORRAL_INVALID_ARGUMENT,
                        "items must be a schema (an object or a boolean)");
    regex_text item = {.limit = JSON_SCHEMA_MAX_REGEX};
    if (max != 0) {
        if (json_is_object(items)) {
            if (!js__emit_to(j, &item, items, "items", 0, level + 1)) {
                free(item.data);
                return false;
            }
        } else {
            js__any_value(j, &item, level + 1, JSON_SCHEMA_ANY_DEPTH);
        }
    }
    array_of(j->out, &item, level, min, max);
    free(item.data);
    return js__ok(j);
}
