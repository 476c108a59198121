/*
 * adapter_json.h — how the adapters read JSON: a safetensors file's header, PEFT's
 * adapter_config.json and a base model's config.json, with jansson.
 *
 * Those files come from outside, so parsing is strict: one JSON value (RFC 8259; jansson checks
 * the grammar, UTF-8 and surrogate pairs), duplicate keys refused (two readers could disagree on
 * which one counts), nesting at most ADAPTER_JSON_DEPTH_MAX deep. \u0000 is allowed in strings and
 * keys so that the readers can name a key that contains one instead of failing with jansson's
 * words. Integers must fit 64-bit signed (jansson's json_int_t): an offset or a dimension beyond
 * that is no real file. Errors name the document and the place: "NAME:LINE:COLUMN: what".
 */
#ifndef CORRAL_ADAPTERS_ADAPTER_JSON_H
#define CORRAL_ADAPTERS_ADAPTER_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "corral/status.h"

#define ADAPTER_JSON_DEPTH_MAX 64

/* Parse len bytes of text (not necessarily NUL-terminated); `name` (a file name) goes into
 * messages. Caller owns the result (json_decref). NULL with err on failure: CORRAL_FORMAT
 * "name:line:column: ..." for bad JSON, "name: nesting deeper than 64 levels", or
 * CORRAL_OUT_OF_MEMORY. Thread-safe. */
json_t *adapter_json_parse(const char *text, size_t len, const char *name, corral_error *err);

/* 0 and *out for a JSON integer >= 0; -1 for anything else (a real, even 8.0, is not). */
int adapter_json_u64(const json_t *v, uint64_t *out);

/* 0 and *out for any JSON number; -1 for anything else. */
int adapter_json_f64(const json_t *v, double *out);

/* "object", "array", "string", "integer", "real", "true", "false", "null" ("absent" for NULL). */
const char *adapter_json_kind(const json_t *v);

#endif /* CORRAL_ADAPTERS_ADAPTER_JSON_H */
