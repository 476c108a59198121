/*
 * json_schema_impl.h — private to the JSON Schema compiler: json_schema.c (the walk over the
 * schema: keywords, combinators, $ref, enum, types, errors), json_schema_container.c (objects,
 * arrays, the layout, open values), json_schema_string.c (strings: JSON's string syntax, lengths,
 * formats, pattern) and json_schema_number.c (numbers and integers with their bounds). They share
 * the compile's context, which holds the pattern being written, the JSON pointer of the place being
 * compiled, and the first error.
 */
#ifndef CORRAL_POLICIES_JSON_SCHEMA_IMPL_H
#define CORRAL_POLICIES_JSON_SCHEMA_IMPL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "corral/json_schema.h"
#include "regex.h"

/* The JSON pointer kept for messages; a deeper one is cut with "...". */
#define JS_POINTER_MAX 256

typedef struct js_ctx {
    json_t *doc;       /* the whole schema ($ref targets are looked up in it) */
    regex_text *out;   /* where the pattern goes (swapped for a branch that is checked alone) */
    corral_error *err; /* the first error */
    corral_status status;
    char ptr[JS_POINTER_MAX]; /* "/properties/age": the place being compiled ("" the root) */
    size_t ptr_len;
    const json_t *path[JSON_SCHEMA_MAX_DEPTH]; /* the subschemas being compiled, outermost first */
    int depth;                                 /* how many: subschemas entered */
    uint32_t nodes;                            /* subschemas visited */
} js_ctx;

/* Record the first error: "json schema: #<pointer>[/key]: message" (key NULL: the subschema
 * itself). Returns false, so that `return js__fail(...)` ends a compile function. */
bool js__fail(js_ctx *j, const char *key, corral_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The current output; false once the pattern has failed (its limit), with the error recorded. */
bool js__ok(js_ctx *j);

/* Append a pointer segment (a key, escaped; or an index); each returns the length js__ptr_pop
 * restores. */
size_t js__ptr_push(js_ctx *j, const char *seg);
size_t js__ptr_push_index(js_ctx *j, size_t i);
void js__ptr_pop(js_ctx *j, size_t old);

/* The pattern of subschema s, for a value at container nesting `level`, onto j->out. */
bool js__emit(js_ctx *j, const json_t *s, int level);

/* The same into its own text t (limit as the output's; the caller frees t->data), s being at
 * pointer segment `seg` below the current place, or at `index` when seg is NULL. */
bool js__emit_to(js_ctx *j, regex_text *t, const json_t *s, const char *seg, size_t index,
                 int level);

/* ---- json_schema_container.c ---------------------------------------------------------------- */

/* Any JSON value at nesting `level`, its containers nested at most `depth` more. */
bool js__any_value(js_ctx *j, regex_text *out, int level, int depth);

/* An object of any keys whose values are `value` (a pattern), at nesting `level`. */
void js__map_of(regex_text *out, const regex_text *value, int level);

/* The object / array type of schema s. */
bool js__object(js_ctx *j, const json_t *s, int level);
bool js__array(js_ctx *j, const json_t *s, int level);

/* ---- json_schema_string.c ------------------------------------------------------------------- */

/* One character of a JSON string's text (as itself, or an escape), as an atom. */
bool js__json_char(regex_text *out);

/* Any JSON string: "CHAR*". */
bool js__any_string(regex_text *out);

/* The string type of schema s (minLength/maxLength, pattern, format); the other keywords were
 * checked by the caller. */
bool js__string(js_ctx *j, const json_t *s);

/* A pair of count keywords (minLength/maxLength, minItems/maxItems): each absent (-1) or a whole
 * number 0..JSON_SCHEMA_MAX_COUNT, max >= min. */
bool js__counts(js_ctx *j, const json_t *s, const char *min_key, const char *max_key, int64_t *min,
                int64_t *max);

/* The pattern matching exactly the compact JSON text of value v (an enum or const member). */
bool js__literal(js_ctx *j, const json_t *v);

/* ---- json_schema_number.c ------------------------------------------------------------------- */

/* The number (integer = false) or integer type of schema s with its bounds. */
bool js__number(js_ctx *j, const json_t *s, bool integer);

/* Any JSON number, unbounded (the "any value" pattern uses it). */
bool js__any_number(regex_text *out);

#endif /* CORRAL_POLICIES_JSON_SCHEMA_IMPL_H */
