/*
 * json.h — the CLI's --json output, built with jansson. The commands build a document of
 * json_t values and print it; these helpers make values from what the CLI has (C strings that
 * may hold bytes that are not UTF-8, 64-bit counts, doubles JSON cannot hold) and print a
 * document the way every command does: compact (or indented), then a newline.
 *
 * Ownership follows jansson's _new calls: cli_json_set and cli_json_append take the reference to
 * their value. A value that could not be made (memory ran out) is NULL; setting it fails, and the
 * failure is remembered so that cli_json_print reports it instead of printing a partial document.
 * Not thread-safe (the CLI is single-threaded).
 */
#ifndef CORRAL_CLI_JSON_H
#define CORRAL_CLI_JSON_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

/* A JSON string of s (NULL gives null). Each byte that does not begin a well-formed UTF-8
 * sequence becomes one U+FFFD of its own. New reference. */
json_t *cli_json_str(const char *s);

/* v as a JSON integer (above INT64_MAX, which jansson's integers cannot hold: a real). */
json_t *cli_json_uint(uint64_t v);

/* v as a JSON real; null for NaN and infinities, which JSON cannot hold. */
json_t *cli_json_real(double v);

/* obj[key] = v / append v to arr; both take v's reference (also on failure). */
void cli_json_set(json_t *obj, const char *key, json_t *v);
void cli_json_append(json_t *arr, json_t *v);

/* Print *doc (compact, or with `indent` spaces per level when > 0) and a newline to out; drop the
 * reference and set *doc to NULL. 0, or -1 when a value could not be made or the write failed. */
int cli_json_print(json_t **doc, FILE *out, int indent);

#endif /* CORRAL_CLI_JSON_H */
