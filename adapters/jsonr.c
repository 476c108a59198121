/*
 * jsonr.c — the strict JSON reader (contract in jsonr.h).
 *
 * A recursive-descent parser over a bounded cursor. Every value is a node allocated from the
 * document's arena-free tree (plain malloc, freed recursively); containers hold growable arrays
 * of child pointers, and objects also a key index sorted once the object is complete, which
 * makes duplicate detection O(n log n) and lookups O(log n) even for a safetensors header with
 * thousands of tensors.
 */
#include "jsonr.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral/utf8.h"

struct jsonr_value {
    jsonr_kind kind;
    /* NUMBER: its text; STRING: the decoded bytes. NUL-terminated, `len` bytes. */
    char *text;
    size_t len;
    /* ARRAY: elements; OBJECT: member values, keys[i] naming values[i]. */
    jsonr_value **values;
    jsonr_value **keys; /* STRING nodes */
    size_t *sorted;     /* OBJECT: member indices ordered by key bytes */
    size_t n, cap;
};

struct jsonr_doc {
    jsonr_value *root;
};

static const char *const kind_names[JSONR_KIND_COUNT] = {
    "null", "false", "true", "number", "string", "array", "object",
};

const char *jsonr_kind_name(jsonr_kind k) {
    return (unsigned)k < JSONR_KIND_COUNT ? kind_names[k] : "?";
}

/* ---- the tree ---------------------------------------------------------------------------------
 */

static void value_free(jsonr_value *v) {
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) {
        value_free(v->values[i]);
        if (v->keys) value_free(v->keys[i]);
    }
    free(v->values);
    free(v->keys);
    free(v->sorted);
    free(v->text);
    free(v);
}

void jsonr_destroy(jsonr_doc **dp) {
    if (!dp || !*dp) return;
    value_free((*dp)->root);
    free(*dp);
    *dp = NULL;
}

/* ---- the parser ------------------------------------------------------------------------------ */

typedef struct parser {
    const unsigned char *s;
    size_t pos, len;
    const char *name;
    corral_error *err;
    bool failed;
} parser;

static bool fail_at(parser *p, size_t pos, corral_status status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Fails the parse with "name:line:column: message" for byte position pos. */
static bool fail_at(parser *p, size_t pos, corral_status status, const char *fmt, ...) {
    if (p->failed) return false;
    p->failed = true;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos && i < p->len; i++) {
        if (p->s[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    char msg[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    corral_error_set(p->err, status, "%s:%zu:%zu: %s", p->name, line, col, msg);
    return false;
}

static bool oom(parser *p) {
    return fail_at(p, p->pos, CORRAL_OUT_OF_MEMORY, "out of memory");
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

/* A description of the byte at pos for messages: 'x', byte 0x01, or end of input. */
static const char *describe(const parser *p, char *buf, size_t cap) {
    if (p->pos >= p->len) return "the end of the input";
    unsigned char c = p->s[p->pos];
    if (c >= 0x21 && c < 0x7f) {
        snprintf(buf, cap, "'%c'", c);
    } else {
        snprintf(buf, cap, "byte 0x%02x", c);
    }
    return buf;
}

static jsonr_value *new_value(parser *p, jsonr_kind kind) {
    jsonr_value *v = calloc(1, sizeof *v);
    if (!v) oom(p);
    if (v) v->kind = kind;
    return v;
}

/* Byte buffer for decoded strings. */
typedef struct strbuf {
    char *data;
    size_t len, cap;
} strbuf;

static bool sb_put(strbuf *b, const void *src, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 32;
        while (cap < b->len + n + 1) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) return false;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
    b->data[b->len] = '\0';
    return true;
}

static int hex_digit(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Four hex digits at pos; -1 when they are not. */
static long read_hex4(const parser *p, size_t pos) {
    if (pos + 4 > p->len) return -1;
    long v = 0;
    for (size_t i = 0; i < 4; i++) {
        int d = hex_digit(p->s[pos + i]);
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* A string starting at the opening quote; the decoded bytes go into a new STRING node. */
static jsonr_value *parse_string(parser *p) {
    size_t start = p->pos;
    p->pos++; /* the opening quote */
    strbuf b = {0};
    if (!sb_put(&b, "", 0)) {
        oom(p);
        return NULL;
    }
    for (;;) {
        if (p->pos >= p->len) {
            fail_at(p, start, CORRAL_FORMAT, "string not terminated");
            goto fail;
        }
        unsigned char c = p->s[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) {
            fail_at(p, p->pos, CORRAL_FORMAT,
                    "control character 0x%02x in a string (must be escaped)", c);
            goto fail;
        }
        if (c == '\\') {
            if (p->pos + 1 >= p->len) {
                fail_at(p, start, CORRAL_FORMAT, "string not terminated");
                goto fail;
            }
            unsigned char e = p->s[p->pos + 1];
            const char *simple = NULL;
            switch (e) {
                case '"':
                    simple = "\"";
                    break;
                case '\\':
                    simple = "\\";
                    break;
                case '/':
                    simple = "/";
                    break;
                case 'b':
                    simple = "\b";
                    break;
                case 'f':
                    simple = "\f";
                    break;
                case 'n':
                    simple = "\n";
                    break;
                case 'r':
                    simple = "\r";
                    break;
                case 't':
                    simple = "\t";
                    break;
                default:
                    break;
            }
            if (simple) {
                if (!sb_put(&b, simple, 1)) goto nomem;
                p->pos += 2;
                continue;
            }
            if (e != 'u') {
                fail_at(p, p->pos, CORRAL_FORMAT, "invalid escape '\\%c' in a string",
                        e >= 0x20 && e < 0x7f ? e : '?');
                goto fail;
            }
            long hi = read_hex4(p, p->pos + 2);
            if (hi < 0) {
                fail_at(p, p->pos, CORRAL_FORMAT, "\\u must be followed by four hex digits");
                goto fail;
            }
            uint32_t cp = (uint32_t)hi;
            size_t used = 6;
            if (hi >= 0xdc00 && hi <= 0xdfff) {
                fail_at(p, p->pos, CORRAL_FORMAT, "unpaired low surrogate \\u%04lx", hi);
                goto fail;
            }
            if (hi >= 0xd800 && hi <= 0xdbff) {
                long lo = -1;
                if (p->pos + 7 < p->len && p->s[p->pos + 6] == '\\' && p->s[p->pos + 7] == 'u') {
                    lo = read_hex4(p, p->pos + 8);
                }
                if (lo < 0xdc00 || lo > 0xdfff) {
                    fail_at(p, p->pos, CORRAL_FORMAT, "unpaired high surrogate \\u%04lx", hi);
                    goto fail;
                }
                cp = 0x10000 + (((uint32_t)hi - 0xd800) << 10) + ((uint32_t)lo - 0xdc00);
                used = 12;
            }
            uint8_t enc[UTF8_SEQUENCE_MAX];
            if (!sb_put(&b, enc, utf8_encode(cp, enc))) goto nomem; /* cp is no surrogate */
            p->pos += used;
            continue;
        }
        if (c < 0x80) {
            if (!sb_put(&b, &c, 1)) goto nomem;
            p->pos++;
            continue;
        }
        size_t n;
        if (utf8_decode(p->s + p->pos, p->len - p->pos, NULL, &n) != UTF8_OK) {
            fail_at(p, p->pos, CORRAL_FORMAT, "invalid UTF-8 (byte 0x%02x) in a string", c);
            goto fail;
        }
        if (!sb_put(&b, p->s + p->pos, n)) goto nomem;
        p->pos += n;
    }
    jsonr_value *v = new_value(p, JSONR_STRING);
    if (!v) goto fail;
    v->text = b.data;
    v->len = b.len;
    return v;
nomem:
    oom(p);
fail:
    free(b.data);
    return NULL;
}

static bool is_digit(unsigned char c) {
    return c >= '0' && c <= '9';
}

/* A number, by the JSON grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static jsonr_value *parse_number(parser *p) {
    size_t start = p->pos, i = p->pos;
    if (i < p->len && p->s[i] == '-') i++;
    if (i >= p->len || !is_digit(p->s[i])) {
        fail_at(p, start, CORRAL_FORMAT, "invalid number: a digit must follow '-'");
        return NULL;
    }
    if (p->s[i] == '0') {
        i++;
        if (i < p->len && is_digit(p->s[i])) {
            fail_at(p, start, CORRAL_FORMAT, "invalid number: leading zero");
            return NULL;
        }
    } else {
        while (i < p->len && is_digit(p->s[i])) i++;
    }
    if (i < p->len && p->s[i] == '.') {
        i++;
        if (i >= p->len || !is_digit(p->s[i])) {
            fail_at(p, start, CORRAL_FORMAT, "invalid number: a digit must follow '.'");
            return NULL;
        }
        while (i < p->len && is_digit(p->s[i])) i++;
    }
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        i++;
        if (i < p->len && (p->s[i] == '+' || p->s[i] == '-')) i++;
        if (i >= p->len || !is_digit(p->s[i])) {
            fail_at(p, start, CORRAL_FORMAT, "invalid number: a digit must follow the exponent");
            return NULL;
        }
        while (i < p->len && is_digit(p->s[i])) i++;
    }
    jsonr_value *v = new_value(p, JSONR_NUMBER);
    if (!v) return NULL;
    v->len = i - start;
    v->text = malloc(v->len + 1);
    if (!v->text) {
        free(v);
        oom(p);
        return NULL;
    }
    memcpy(v->text, p->s + start, v->len);
    v->text[v->len] = '\0';
    p->pos = i;
    return v;
}

static bool add_child(parser *p, jsonr_value *c, jsonr_value *key, jsonr_value *v) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        jsonr_value **vals = realloc(c->values, cap * sizeof *vals);
        if (!vals) return oom(p);
        c->values = vals;
        if (c->kind == JSONR_OBJECT) {
            jsonr_value **keys = realloc(c->keys, cap * sizeof *keys);
            if (!keys) return oom(p);
            c->keys = keys;
        }
        c->cap = cap;
    }
    c->values[c->n] = v;
    if (c->kind == JSONR_OBJECT) c->keys[c->n] = key;
    c->n++;
    return true;
}

static int key_cmp(const jsonr_value *a, const jsonr_value *b) {
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->text, b->text, n);
    if (c != 0) return c;
    return a->len < b->len ? -1 : a->len > b->len;
}

/* qsort has no context argument: the object being sorted is passed through this. */
static _Thread_local const jsonr_value *sort_obj;

static int sorted_cmp(const void *a, const void *b) {
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    int c = key_cmp(sort_obj->keys[i], sort_obj->keys[j]);
    if (c != 0) return c;
    return i < j ? -1 : i > j;
}

/* Builds the sorted key index of a complete object and rejects duplicate keys. */
static bool index_object(parser *p, jsonr_value *o, size_t start) {
    if (o->n == 0) return true;
    o->sorted = malloc(o->n * sizeof *o->sorted);
    if (!o->sorted) return oom(p);
    for (size_t i = 0; i < o->n; i++) o->sorted[i] = i;
    sort_obj = o;
    qsort(o->sorted, o->n, sizeof *o->sorted, sorted_cmp);
    sort_obj = NULL;
    for (size_t i = 1; i < o->n; i++) {
        const jsonr_value *a = o->keys[o->sorted[i - 1]], *b = o->keys[o->sorted[i]];
        if (key_cmp(a, b) == 0) {
            return fail_at(p, start, CORRAL_FORMAT, "duplicate key \"%.*s\" in an object",
                           (int)(a->len > 96 ? 96 : a->len), a->text);
        }
    }
    return true;
}

static jsonr_value *parse_value(parser *p, unsigned depth);

static jsonr_value *parse_container(parser *p, unsigned depth, bool object) {
    size_t start = p->pos;
    if (depth >= JSONR_DEPTH_MAX) {
        fail_at(p, start, CORRAL_FORMAT, "nesting deeper than %d levels", JSONR_DEPTH_MAX);
        return NULL;
    }
    p->pos++; /* '{' or '[' */
    jsonr_value *c = new_value(p, object ? JSONR_OBJECT : JSONR_ARRAY);
    if (!c) return NULL;
    char close = object ? '}' : ']';
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == (unsigned char)close) {
        p->pos++;
        return c;
    }
    char what[32];
    for (;;) {
        jsonr_value *key = NULL;
        skip_ws(p);
        if (object) {
            if (p->pos >= p->len || p->s[p->pos] != '"') {
                fail_at(p, p->pos, CORRAL_FORMAT, "expected a string key, found %s",
                        describe(p, what, sizeof what));
                goto fail;
            }
            key = parse_string(p);
            if (!key) goto fail;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') {
                fail_at(p, p->pos, CORRAL_FORMAT, "expected ':' after a key, found %s",
                        describe(p, what, sizeof what));
                value_free(key);
                goto fail;
            }
            p->pos++;
        }
        jsonr_value *v = parse_value(p, depth + 1);
        if (!v || !add_child(p, c, key, v)) {
            value_free(key);
            value_free(v);
            goto fail;
        }
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == (unsigned char)close) {
            p->pos++;
            break;
        }
        fail_at(p, p->pos, CORRAL_FORMAT, "expected ',' or '%c' in %s, found %s", close,
                object ? "an object" : "an array", describe(p, what, sizeof what));
        goto fail;
    }
    if (object && !index_object(p, c, start)) goto fail;
    return c;
fail:
    value_free(c);
    return NULL;
}

static jsonr_value *parse_literal(parser *p, const char *word, jsonr_kind kind) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) {
        char what[32];
        fail_at(p, p->pos, CORRAL_FORMAT, "expected a value, found %s",
                describe(p, what, sizeof what));
        return NULL;
    }
    p->pos += n;
    return new_value(p, kind);
}

static jsonr_value *parse_value(parser *p, unsigned depth) {
    skip_ws(p);
    if (p->pos >= p->len) {
        fail_at(p, p->pos, CORRAL_FORMAT, "expected a value, found the end of the input");
        return NULL;
    }
    unsigned char c = p->s[p->pos];
    switch (c) {
        case '{':
            return parse_container(p, depth, true);
        case '[':
            return parse_container(p, depth, false);
        case '"':
            return parse_string(p);
        case 't':
            return parse_literal(p, "true", JSONR_TRUE);
        case 'f':
            return parse_literal(p, "false", JSONR_FALSE);
        case 'n':
            return parse_literal(p, "null", JSONR_NULL);
        default:
            if (c == '-' || is_digit(c)) return parse_number(p);
            char what[32];
            fail_at(p, p->pos, CORRAL_FORMAT, "expected a value, found %s",
                    describe(p, what, sizeof what));
            return NULL;
    }
}

jsonr_doc *jsonr_parse(const char *text, size_t len, const char *name, corral_error *err) {
    parser p = {(const unsigned char *)text, 0, len, name ? name : "<json>", err, false};
    if (!text && len > 0) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "jsonr_parse: NULL text");
        return NULL;
    }
    if (!text) p.s = (const unsigned char *)"";
    jsonr_value *root = parse_value(&p, 0);
    if (!root) return NULL;
    skip_ws(&p);
    if (p.pos < p.len) {
        char what[32];
        fail_at(&p, p.pos, CORRAL_FORMAT, "unexpected %s after the top-level value",
                describe(&p, what, sizeof what));
        value_free(root);
        return NULL;
    }
    jsonr_doc *d = malloc(sizeof *d);
    if (!d) {
        value_free(root);
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "%s: out of memory", p.name);
        return NULL;
    }
    d->root = root;
    return d;
}

/* ---- access ---------------------------------------------------------------------------------- */

const jsonr_value *jsonr_root(const jsonr_doc *d) {
    return d ? d->root : NULL;
}

jsonr_kind jsonr_value_kind(const jsonr_value *v) {
    return v ? v->kind : JSONR_NULL;
}

size_t jsonr_count(const jsonr_value *v) {
    return v && (v->kind == JSONR_ARRAY || v->kind == JSONR_OBJECT) ? v->n : 0;
}

const jsonr_value *jsonr_at(const jsonr_value *v, size_t i) {
    return v && (v->kind == JSONR_ARRAY || v->kind == JSONR_OBJECT) && i < v->n ? v->values[i]
                                                                                : NULL;
}

const char *jsonr_key_at(const jsonr_value *obj, size_t i, size_t *len) {
    if (!obj || obj->kind != JSONR_OBJECT || i >= obj->n) return NULL;
    if (len) *len = obj->keys[i]->len;
    return obj->keys[i]->text;
}

const jsonr_value *jsonr_get(const jsonr_value *obj, const char *key) {
    if (!obj || obj->kind != JSONR_OBJECT || !key) return NULL;
    jsonr_value probe = {.kind = JSONR_STRING, .text = (char *)key, .len = strlen(key)};
    size_t lo = 0, hi = obj->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = key_cmp(obj->keys[obj->sorted[mid]], &probe);
        if (c == 0) return obj->values[obj->sorted[mid]];
        if (c < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return NULL;
}

const char *jsonr_str(const jsonr_value *v, size_t *len) {
    if (!v || v->kind != JSONR_STRING) return NULL;
    if (len) *len = v->len;
    return v->text;
}

int jsonr_get_u64(const jsonr_value *v, uint64_t *out) {
    if (!v || v->kind != JSONR_NUMBER) return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < v->len; i++) {
        unsigned char c = (unsigned char)v->text[i];
        if (!is_digit(c)) return -1; /* sign, fraction or exponent */
        if (x > (UINT64_MAX - (c - '0')) / 10) return -1;
        x = x * 10 + (c - '0');
    }
    *out = x;
    return 0;
}

int jsonr_get_i64(const jsonr_value *v, int64_t *out) {
    if (!v || v->kind != JSONR_NUMBER) return -1;
    bool neg = v->text[0] == '-';
    jsonr_value mag = *v;
    mag.text += neg;
    mag.len -= neg;
    uint64_t m;
    if (jsonr_get_u64(&mag, &m) != 0) return -1;
    if (neg) {
        if (m > (uint64_t)INT64_MAX + 1) return -1;
        *out = m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m;
    } else {
        if (m > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)m;
    }
    return 0;
}

int jsonr_get_f64(const jsonr_value *v, double *out) {
    if (!v || v->kind != JSONR_NUMBER) return -1;
    errno = 0;
    char *end;
    double d = strtod(v->text, &end);
    if (*end != '\0' || !isfinite(d)) return -1;
    *out = d;
    return 0;
}
