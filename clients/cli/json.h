/*
 * json.h — a tiny streaming JSON writer for the CLI's --json output. It tracks nesting and commas
 * so callers only say what comes next, and escapes strings so the output is always valid JSON
 * (control characters as \u00XX; bytes that are not UTF-8 become U+FFFD).
 */
#ifndef CORRAL_CLI_JSON_H
#define CORRAL_CLI_JSON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define JSON_DEPTH_MAX 32

typedef struct json_writer {
    FILE *out;
    int depth;
    bool has_items[JSON_DEPTH_MAX]; /* per open container: something was written in it */
    bool after_key;                 /* a key was written; its value comes next */
} json_writer;

/* Start writing to out. The writer holds no resources. */
void json_writer_init(json_writer *w, FILE *out);

/* Open/close an object or array (as a value: after a key, in an array, or at the top). Nesting
 * beyond JSON_DEPTH_MAX is a programming error (asserted). */
void json_begin_object(json_writer *w);
void json_end_object(json_writer *w);
void json_begin_array(json_writer *w);
void json_end_array(json_writer *w);

/* The key of the next member of the current object. */
void json_key(json_writer *w, const char *key);

/* Values. json_string escapes its text (NULL writes null). json_double writes null for NaN and
 * infinities, which JSON cannot hold. */
void json_string(json_writer *w, const char *s);
void json_uint(json_writer *w, uint64_t v);
void json_int(json_writer *w, int64_t v);
void json_double(json_writer *w, double v);
void json_bool(json_writer *w, bool v);
void json_null(json_writer *w);

/* End the document with a newline. */
void json_finish(json_writer *w);

#endif /* CORRAL_CLI_JSON_H */
