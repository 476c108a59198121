/*
 * jsonr.h — a small strict JSON reader for the files adapters come with: the header of a
 * safetensors file and PEFT's adapter_config.json.
 *
 * Both come from outside, so the reader accepts exactly RFC 8259 and nothing more: one value with
 * optional whitespace around it; objects, arrays, strings, numbers, true, false, null. Strings
 * must be valid UTF-8 (no overlong forms, no surrogates), control characters must be escaped,
 * \u escapes must pair surrogates correctly. Numbers follow the JSON grammar exactly (no leading
 * zeros, no "+", no "NaN"); their text is kept so that integers up to 2^64 - 1 read back exactly
 * (safetensors offsets do not fit a double). Duplicate keys in an object are an error (two
 * readers could otherwise disagree on which one counts). Nesting is limited to JSONR_DEPTH_MAX.
 * Errors name the document, line:column and what was expected.
 *
 * The parsed document is a tree owned by a jsonr_doc; values are borrowed pointers into it.
 * Lookups by key are binary searches (objects keep a sorted index beside the member order).
 * Immutable after jsonr_parse: a document may be read by several threads.
 */
#ifndef CORRAL_ADAPTERS_JSONR_H
#define CORRAL_ADAPTERS_JSONR_H

#include <stddef.h>
#include <stdint.h>

#include "corral/status.h"

#define JSONR_DEPTH_MAX 64

typedef enum jsonr_kind {
    JSONR_NULL = 0,
    JSONR_FALSE = 1,
    JSONR_TRUE = 2,
    JSONR_NUMBER = 3,
    JSONR_STRING = 4,
    JSONR_ARRAY = 5,
    JSONR_OBJECT = 6,
    JSONR_KIND_COUNT
} jsonr_kind;

typedef struct jsonr_doc jsonr_doc;
typedef struct jsonr_value jsonr_value;

/* Parse len bytes of text (not necessarily NUL-terminated). `name` (a file name) is used in
 * messages. Caller owns the result (jsonr_destroy). NULL with err on failure: CORRAL_FORMAT with
 * "name:line:column: what" for bad JSON, CORRAL_OUT_OF_MEMORY. */
jsonr_doc *jsonr_parse(const char *text, size_t len, const char *name, corral_error *err);

/* NULL-safe; sets *d to NULL. Every value of the document becomes invalid. */
void jsonr_destroy(jsonr_doc **d);

/* The top-level value. Borrowed: valid until jsonr_destroy. */
const jsonr_value *jsonr_root(const jsonr_doc *d);

/* The kind of a value; "null", "false", "true", "number", "string", "array", "object" by name. */
jsonr_kind jsonr_value_kind(const jsonr_value *v);
const char *jsonr_kind_name(jsonr_kind k);

/* Members of an object or elements of an array (0 for other kinds). */
size_t jsonr_count(const jsonr_value *v);

/* Element i of an array, or the value of member i of an object (in document order); NULL when i
 * is out of range or v is neither. */
const jsonr_value *jsonr_at(const jsonr_value *v, size_t i);

/* The key of member i of an object (NUL-terminated; *len, when not NULL, gets its length, which
 * can differ from strlen when the key contains \u0000). NULL when out of range. */
const char *jsonr_key_at(const jsonr_value *obj, size_t i, size_t *len);

/* The value of member `key` of an object, or NULL (absent, or obj is not an object). */
const jsonr_value *jsonr_get(const jsonr_value *obj, const char *key);

/* A string's decoded bytes, NUL-terminated (*len as for jsonr_key_at); NULL for other kinds. */
const char *jsonr_str(const jsonr_value *v, size_t *len);

/* Numbers. Each returns 0 and sets *out, or -1 when v is not a number of that form:
 * jsonr_get_u64 takes only non-negative integers written without fraction or exponent that fit
 * 64 bits; jsonr_get_i64 the same with an optional minus; jsonr_get_f64 any number whose value is
 * finite as a double. */
int jsonr_get_u64(const jsonr_value *v, uint64_t *out);
int jsonr_get_i64(const jsonr_value *v, int64_t *out);
int jsonr_get_f64(const jsonr_value *v, double *out);

#endif /* CORRAL_ADAPTERS_JSONR_H */
