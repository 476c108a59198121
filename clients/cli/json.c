/*
 * json.c — the CLI's JSON writer (see json.h): separators from a per-level "has items" flag,
 * and string escaping that validates UTF-8 (with the base codec) as it goes.
 */
#include "json.h"

#include <assert.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "corral/utf8.h"

void json_writer_init(json_writer *w, FILE *out) {
    memset(w, 0, sizeof *w);
    w->out = out;
}

/* Write the comma that separates this value from the previous one, unless it follows a key. */
static void json_before_value(json_writer *w) {
    if (w->after_key) {
        w->after_key = false;
        return;
    }
    if (w->depth > 0) {
        if (w->has_items[w->depth - 1]) fputc(',', w->out);
        w->has_items[w->depth - 1] = true;
    }
}

static void json_open(json_writer *w, char c) {
    json_before_value(w);
    assert(w->depth < JSON_DEPTH_MAX);
    fputc(c, w->out);
    w->has_items[w->depth++] = false;
}

static void json_close(json_writer *w, char c) {
    assert(w->depth > 0 && !w->after_key);
    w->depth--;
    fputc(c, w->out);
}

void json_begin_object(json_writer *w) {
    json_open(w, '{');
}

void json_end_object(json_writer *w) {
    json_close(w, '}');
}

void json_begin_array(json_writer *w) {
    json_open(w, '[');
}

void json_end_array(json_writer *w) {
    json_close(w, ']');
}

/* Write text as a JSON string. Each byte that does not begin a well-formed UTF-8 sequence
 * becomes one U+FFFD of its own: the CLI's output maps bad bytes one by one (test_cli_json pins
 * it), where the sanitizers' repair gives one U+FFFD per maximal subpart. */
static void json_write_escaped(FILE *out, const char *text) {
    fputc('"', out);
    const unsigned char *s = (const unsigned char *)text;
    const unsigned char *end = s + strlen(text);
    while (*s) {
        unsigned char c = *s;
        if (c == '"' || c == '\\') {
            fputc('\\', out);
            fputc(c, out);
            s++;
        } else if (c < 0x20) {
            switch (c) {
                case '\n':
                    fputs("\\n", out);
                    break;
                case '\r':
                    fputs("\\r", out);
                    break;
                case '\t':
                    fputs("\\t", out);
                    break;
                default:
                    fprintf(out, "\\u%04x", c);
                    break;
            }
            s++;
        } else {
            size_t n;
            if (utf8_decode(s, (size_t)(end - s), NULL, &n) != UTF8_OK) {
                fputs("\\ufffd", out);
                s++;
            } else {
                fwrite(s, 1, n, out);
                s += n;
            }
        }
    }
    fputc('"', out);
}

void json_key(json_writer *w, const char *key) {
    assert(w->depth > 0 && !w->after_key);
    json_before_value(w);
    json_write_escaped(w->out, key);
    fputc(':', w->out);
    w->after_key = true;
}

void json_string(json_writer *w, const char *s) {
    json_before_value(w);
    if (s)
        json_write_escaped(w->out, s);
    else
        fputs("null", w->out);
}

void json_uint(json_writer *w, uint64_t v) {
    json_before_value(w);
    fprintf(w->out, "%" PRIu64, v);
}

void json_int(json_writer *w, int64_t v) {
    json_before_value(w);
    fprintf(w->out, "%" PRId64, v);
}

void json_double(json_writer *w, double v) {
    json_before_value(w);
    if (isfinite(v))
        fprintf(w->out, "%.17g", v);
    else
        fputs("null", w->out);
}

void json_bool(json_writer *w, bool v) {
    json_before_value(w);
    fputs(v ? "true" : "false", w->out);
}

void json_null(json_writer *w) {
    json_before_value(w);
    fputs("null", w->out);
}

void json_finish(json_writer *w) {
    fputc('\n', w->out);
}
