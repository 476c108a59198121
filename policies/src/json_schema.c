/*
 * json_schema.c — JSON Schema to regular expression (json_schema.h has what is supported, the
 * layout of the output and the limits): the walk over the schema.
 *
 * One recursive walk writes the pattern as it goes (jansson parses the schema; its objects keep
 * the document's member order, which is the order properties are generated in). Each subschema
 * becomes an atom that the caller can concatenate and quantify: keywords are looked up in one
 * table that says what each one does (handled, an annotation, or refused with a reason), and the
 * subschema is then, in this order, a $ref, an allOf of one, an anyOf/oneOf, an enum/const, or the
 * union of its types. Objects, arrays and the layout are in json_schema_container.c, strings in
 * json_schema_string.c, numbers in json_schema_number.c.
 *
 * Where the walk is, as a JSON pointer, is kept for messages; a $ref moves it to the target for
 * the time of the expansion. Recursion is found by keeping the subschemas on the current path:
 * a $ref to one of them would expand forever, and its language is not regular, so it is refused.
 *
 * oneOf asks for exactly one branch, and a union of patterns only gives "at least one": the
 * branches are compiled alone (regex__compile) and each pair's product automaton is searched for
 * a common string, refused with the shortest one as the example.
 */
#include "corral/json_schema.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema_impl.h"

_Static_assert(JSON_SCHEMA_MAX_REGEX == REGEX_MAX_GENERATED_PATTERN,
               "the schema compiler writes what the regex compiler reads");

/* ---- errors and the pointer ------------------------------------------------------------------
 */

bool js__fail(js_ctx *j, const char *key, corral_status st, const char *fmt, ...) {
    if (j->status != CORRAL_OK) return false;
    char msg[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    j->status = corral_error_set(j->err, st, "json schema: #%s%s%s: %s", j->ptr, key ? "/" : "",
                                 key ? key : "", msg);
    return false;
}

bool js__ok(js_ctx *j) {
    if (j->status != CORRAL_OK) return false;
    if (j->out->status == CORRAL_OK) return true;
    if (j->out->status == CORRAL_RESOURCE_EXHAUSTED)
        return js__fail(j, NULL, CORRAL_RESOURCE_EXHAUSTED,
                        "the schema's pattern passes %u bytes (limit JSON_SCHEMA_MAX_REGEX)",
                        JSON_SCHEMA_MAX_REGEX);
    return js__fail(j, NULL, j->out->status, "out of memory");
}

/* Append one pointer segment (escaped: ~ as ~0, / as ~1); returns the length to restore. A
 * pointer that does not fit is cut with "/..." once. */
size_t js__ptr_push(js_ctx *j, const char *seg) {
    const size_t old = j->ptr_len;
    char buf[JS_POINTER_MAX];
    size_t n = 0;
    buf[n++] = '/';
    for (const char *c = seg; *c && n + 2 < sizeof buf; c++) {
        if (*c == '~' || *c == '/') {
            buf[n++] = '~';
            buf[n++] = *c == '~' ? '0' : '1';
        } else {
            buf[n++] = *c;
        }
    }
    if (old + n + 5 >= JS_POINTER_MAX) {
        if (old + 5 <= JS_POINTER_MAX && strcmp(j->ptr + (old >= 4 ? old - 4 : 0), "/...") != 0)
            memcpy(j->ptr + old, "/...", 5), j->ptr_len = old + 4;
        return old;
    }
    memcpy(j->ptr + old, buf, n);
    j->ptr_len = old + n;
    j->ptr[j->ptr_len] = '\0';
    return old;
}

size_t js__ptr_push_index(js_ctx *j, size_t i) {
    char buf[24];
    snprintf(buf, sizeof buf, "%zu", i);
    return js__ptr_push(j, buf);
}

void js__ptr_pop(js_ctx *j, size_t old) {
    j->ptr_len = old;
    j->ptr[old] = '\0';
}

/* ---- keywords -------------------------------------------------------------------------------- */

enum {
    T_NULL = 1 << 0,
    T_BOOLEAN = 1 << 1,
    T_OBJECT = 1 << 2,
    T_ARRAY = 1 << 3,
    T_STRING = 1 << 4,
    T_NUMBER = 1 << 5,
    T_INTEGER = 1 << 6,
    T_ALL = (1 << 7) - 1,
};

static const struct {
    const char *name;
    unsigned bit;
} type_names[] = {
    {"object", T_OBJECT},   {"array", T_ARRAY},     {"string", T_STRING}, {"number", T_NUMBER},
    {"integer", T_INTEGER}, {"boolean", T_BOOLEAN}, {"null", T_NULL},
};

typedef enum kw_role {
    KW_ANNOTATION = 0, /* says nothing about valid values: ignored */
    KW_HANDLED = 1,    /* restricts values, and is compiled */
    KW_REFUSED = 2,    /* restricts values in a way this compiler cannot express */
} kw_role;

/* Every keyword JSON Schema defines (2020-12, 2019-09, draft 7 and 4) and OpenAPI's nullable.
 * `types`: the instance types a handled keyword speaks of (for a schema without `type`). */
static const struct keyword {
    const char *name;
    kw_role role;
    unsigned types;
    const char *why; /* KW_REFUSED: the message */
} keywords[] = {
    {"type", KW_HANDLED, 0, NULL},
    {"enum", KW_HANDLED, 0, NULL},
    {"const", KW_HANDLED, 0, NULL},
    {"properties", KW_HANDLED, T_OBJECT, NULL},
    {"required", KW_HANDLED, T_OBJECT, NULL},
    {"additionalProperties", KW_HANDLED, T_OBJECT, NULL},
    {"unevaluatedProperties", KW_HANDLED, T_OBJECT, NULL},
    {"items", KW_HANDLED, T_ARRAY, NULL},
    {"minItems", KW_HANDLED, T_ARRAY, NULL},
    {"maxItems", KW_HANDLED, T_ARRAY, NULL},
    {"uniqueItems", KW_HANDLED, T_ARRAY, NULL},
    {"minLength", KW_HANDLED, T_STRING, NULL},
    {"maxLength", KW_HANDLED, T_STRING, NULL},
    {"pattern", KW_HANDLED, T_STRING, NULL},
    {"format", KW_HANDLED, T_STRING, NULL},
    {"minimum", KW_HANDLED, T_NUMBER, NULL},
    {"maximum", KW_HANDLED, T_NUMBER, NULL},
    {"exclusiveMinimum", KW_HANDLED, T_NUMBER, NULL},
    {"exclusiveMaximum", KW_HANDLED, T_NUMBER, NULL},
    {"anyOf", KW_HANDLED, 0, NULL},
    {"oneOf", KW_HANDLED, 0, NULL},
    {"allOf", KW_HANDLED, 0, NULL},
    {"$ref", KW_HANDLED, 0, NULL},
    {"nullable", KW_HANDLED, 0, NULL},
    {"title", KW_ANNOTATION, 0, NULL},
    {"description", KW_ANNOTATION, 0, NULL},
    {"default", KW_ANNOTATION, 0, NULL},
    {"examples", KW_ANNOTATION, 0, NULL},
    {"example", KW_ANNOTATION, 0, NULL},
    {"$comment", KW_ANNOTATION, 0, NULL},
    {"$schema", KW_ANNOTATION, 0, NULL},
    {"$id", KW_ANNOTATION, 0, NULL},
    {"$vocabulary", KW_ANNOTATION, 0, NULL},
    {"$defs", KW_ANNOTATION, 0, NULL},
    {"definitions", KW_ANNOTATION, 0, NULL},
    {"deprecated", KW_ANNOTATION, 0, NULL},
    {"readOnly", KW_ANNOTATION, 0, NULL},
    {"writeOnly", KW_ANNOTATION, 0, NULL},
    {"contentMediaType", KW_ANNOTATION, 0, NULL},
    {"contentEncoding", KW_ANNOTATION, 0, NULL},
    {"contentSchema", KW_ANNOTATION, 0, NULL},
    {"not", KW_REFUSED, 0, "'not' (negation) is not supported"},
    {"if", KW_REFUSED, 0, "if/then/else is not supported"},
    {"then", KW_REFUSED, 0, "if/then/else is not supported"},
    {"else", KW_REFUSED, 0, "if/then/else is not supported"},
    {"multipleOf", KW_REFUSED, 0, "multipleOf is not supported"},
    {"patternProperties", KW_REFUSED, 0, "patternProperties is not supported"},
    {"propertyNames", KW_REFUSED, 0, "propertyNames is not supported"},
    {"minProperties", KW_REFUSED, 0, "minProperties is not supported"},
    {"maxProperties", KW_REFUSED, 0, "maxProperties is not supported"},
    {"dependentRequired", KW_REFUSED, 0, "dependentRequired is not supported"},
    {"dependentSchemas", KW_REFUSED, 0, "dependentSchemas is not supported"},
    {"dependencies", KW_REFUSED, 0, "dependencies is not supported"},
    {"prefixItems", KW_REFUSED, 0, "prefixItems (tuples) is not supported"},
    {"additionalItems", KW_REFUSED, 0, "additionalItems (tuples) is not supported"},
    {"contains", KW_REFUSED, 0, "contains is not supported"},
    {"minContains", KW_REFUSED, 0, "minContains is not supported"},
    {"maxContains", KW_REFUSED, 0, "maxContains is not supported"},
    {"unevaluatedItems", KW_REFUSED, 0, "unevaluatedItems is not supported"},
    {"$dynamicRef", KW_REFUSED, 0, "$dynamicRef is not supported"},
    {"$dynamicAnchor", KW_REFUSED, 0, "$dynamicAnchor is not supported"},
    {"$recursiveRef", KW_REFUSED, 0, "$recursiveRef is not supported"},
    {"$recursiveAnchor", KW_REFUSED, 0, "$recursiveAnchor is not supported"},
    {"$anchor", KW_REFUSED, 0, "$anchor is not supported (use $ref with a JSON pointer)"},
};

static const struct keyword *find_keyword(const char *name) {
    for (size_t i = 0; i < sizeof keywords / sizeof keywords[0]; i++)
        if (strcmp(keywords[i].name, name) == 0) return &keywords[i];
    return NULL;
}

/* The first handled keyword of s not in the NULL-terminated list `allowed`, or NULL. */
static const char *other_keyword(const json_t *s, const char *const *allowed) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)s, key, v) {
        const struct keyword *kw = find_keyword(key);
        if (!kw || kw->role != KW_HANDLED) continue;
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++) ok = strcmp(*a, key) == 0;
        /* These two say nothing when they hold their no-op values. */
        if (!ok && strcmp(key, "uniqueItems") == 0) ok = json_is_false(v);
        if (!ok && strcmp(key, "nullable") == 0) ok = json_is_false(v);
        if (!ok) return key;
    }
    return NULL;
}

/* ---- the walk -------------------------------------------------------------------------------- */

/* The pattern of subschema s (at pointer segment `seg`, or index when seg is NULL) into its own
 * text t (limit as the output's); the caller frees t->data. */
bool js__emit_to(js_ctx *j, regex_text *t, const json_t *s, const char *seg, size_t index,
                 int level) {
    *t = (regex_text){.limit = JSON_SCHEMA_MAX_REGEX};
    regex_text *saved = j->out;
    j->out = t;
    const size_t mark = seg ? js__ptr_push(j, seg) : js__ptr_push_index(j, index);
    const bool ok = js__emit(j, s, level) && js__ok(j);
    js__ptr_pop(j, mark);
    j->out = saved;
    return ok;
}

/* ---- oneOf: the branches must not overlap ----------------------------------------------------
 *
 * Breadth-first search of the product of two DFAs from (0, 0) for a pair of accepting states;
 * bytes are tried one per joint class (bytes neither DFA tells apart). The first accepting pair
 * found gives a shortest common string, which the message shows.
 */

#define ONEOF_MAX_PAIRS   (1u << 20)   /* product states searched */
#define ONEOF_MAX_PRODUCT (1ull << 24) /* states of the two DFAs multiplied (a 2 MiB bitmap) */

typedef struct pair_node {
    int32_t a, b;
    uint32_t parent;
    uint8_t byte;
} pair_node;

/* 1 and a shortest common string in witness (printable, cut) if a and b share a string; 0 if
 * not; -1 when the product is too large to search or memory runs out. */
static int dfa_overlap(const regex_dfa *a, const regex_dfa *b, char *witness, size_t cap) {
    uint8_t reps[256];
    int n_reps = 0;
    for (int x = 0; x < 256; x++) {
        bool seen = false;
        for (int r = 0; r < n_reps && !seen; r++)
            seen = a->byte_class[reps[r]] == a->byte_class[x] &&
                   b->byte_class[reps[r]] == b->byte_class[x];
        if (!seen) reps[n_reps++] = (uint8_t)x;
    }
    const uint64_t n_pairs = (uint64_t)a->n_states * b->n_states;
    if (n_pairs > ONEOF_MAX_PRODUCT) return -1;
    uint8_t *seen = calloc((size_t)(n_pairs + 7) / 8, 1);
    uint32_t qcap = 1024;
    pair_node *q = malloc(qcap * sizeof *q);
    int result = -1;
    if (!seen || !q) goto done;
    uint32_t head = 0, tail = 0;
    q[tail++] = (pair_node){0, 0, UINT32_MAX, 0};
    seen[0] |= 1;
    result = 0;
    while (head < tail) {
        const uint32_t at = head++;
        const pair_node p = q[at];
        if (a->accepting[p.a] && b->accepting[p.b]) {
            /* Walk back to the start, then write the bytes forward. */
            uint8_t bytes[64];
            size_t n = 0, total = 0;
            for (uint32_t k = at; q[k].parent != UINT32_MAX; k = q[k].parent) total++;
            const size_t skip = total > sizeof bytes ? total - sizeof bytes : 0;
            size_t idx = total;
            for (uint32_t k = at; q[k].parent != UINT32_MAX; k = q[k].parent) {
                idx--;
                if (idx < skip) break;
                bytes[idx - skip] = q[k].byte;
                n++;
            }
            size_t w = 0;
            for (size_t i = 0; i < n && w + 5 < cap; i++) {
                const uint8_t c = bytes[i];
                if (c >= 0x20 && c < 0x7F)
                    witness[w++] = (char)c;
                else
                    w += (size_t)snprintf(witness + w, cap - w, "\\x%02X", c);
            }
            if (total > n && w + 4 < cap) memcpy(witness + w, "...", 4), w += 3;
            witness[w < cap ? w : cap - 1] = '\0';
            result = 1;
            break;
        }
        for (int r = 0; r < n_reps; r++) {
            const int32_t na = regex__step(a, p.a, reps[r]);
            const int32_t nb = na == REGEX_DEAD ? REGEX_DEAD : regex__step(b, p.b, reps[r]);
            if (nb == REGEX_DEAD) continue;
            const uint64_t id = (uint64_t)na * b->n_states + (uint64_t)nb;
            if (seen[id / 8] & (1u << (id % 8))) continue;
            if (tail == ONEOF_MAX_PAIRS) {
                result = -1;
                goto done;
            }
            if (tail == qcap) {
                pair_node *bigger = realloc(q, 2 * (size_t)qcap * sizeof *q);
                if (!bigger) {
                    result = -1;
                    goto done;
                }
                q = bigger;
                qcap *= 2;
            }
            seen[id / 8] |= (uint8_t)(1u << (id % 8));
            q[tail++] = (pair_node){na, nb, at, reps[r]};
        }
    }
done:
    free(seen);
    free(q);
    return result;
}

/* Refuse a oneOf whose branches (their patterns in t[0..n)) can match the same text. */
static bool check_disjoint(js_ctx *j, const regex_text *t, size_t n) {
    if (n > JSON_SCHEMA_MAX_ONEOF)
        return js__fail(j, "oneOf", CORRAL_RESOURCE_EXHAUSTED,
                        "oneOf has %zu branches; at most %d can be checked for overlap "
                        "(JSON_SCHEMA_MAX_ONEOF; anyOf has no such limit)",
                        n, JSON_SCHEMA_MAX_ONEOF);
    regex_dfa *d = calloc(n, sizeof *d);
    if (!d) return js__fail(j, "oneOf", CORRAL_OUT_OF_MEMORY, "out of memory");
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        corral_error e = {0};
        if (regex__compile(t[i].data, t[i].len, REGEX_GENERATED, &d[i], NULL, &e) != CORRAL_OK) {
            const size_t mark = js__ptr_push(j, "oneOf");
            const size_t m2 = js__ptr_push_index(j, i);
            ok = js__fail(j, NULL, e.status, "the branch is too complex to check for overlap: %s",
                          e.message);
            js__ptr_pop(j, m2);
            js__ptr_pop(j, mark);
        }
    }
    for (size_t x = 0; x < n && ok; x++) {
        for (size_t y = x + 1; y < n && ok; y++) {
            char witness[96];
            const int r = dfa_overlap(&d[x], &d[y], witness, sizeof witness);
            if (r < 0)
                ok = js__fail(j, "oneOf", CORRAL_RESOURCE_EXHAUSTED,
                              "branches %zu and %zu are too large to check for overlap (use "
                              "anyOf)",
                              x, y);
            else if (r > 0)
                ok = js__fail(j, "oneOf", CORRAL_INVALID_ARGUMENT,
                              "branches %zu and %zu overlap: both accept %s; oneOf needs exactly "
                              "one to match (use anyOf, or make them disjoint)",
                              x, y, witness);
        }
    }
    for (size_t i = 0; i < n; i++) regex__free(&d[i]);
    free(d);
    return ok;
}

/* ---- combinators, references, literals ---------------------------------------------------------
 */

static bool emit_alternatives(js_ctx *j, const json_t *s, const char *key, int level) {
    const json_t *list = json_object_get(s, key);
    static const char *const allowed[] = {"anyOf", "oneOf", NULL};
    const char *other = other_keyword(s, allowed);
    if (json_object_get(s, "anyOf") && json_object_get(s, "oneOf"))
        return js__fail(j, "oneOf", CORRAL_INVALID_ARGUMENT,
                        "anyOf and oneOf together are not supported");
    if (other)
        return js__fail(j, other, CORRAL_INVALID_ARGUMENT,
                        "'%s' beside %s is not supported (move it into each branch)", other, key);
    if (!json_is_array(list) || json_array_size(list) == 0)
        return js__fail(j, key, CORRAL_INVALID_ARGUMENT, "%s must be a non-empty array", key);
    const size_t n = json_array_size(list);
    regex_text *t = calloc(n, sizeof *t);
    if (!t) return js__fail(j, key, CORRAL_OUT_OF_MEMORY, "out of memory");
    bool ok = true;
    const size_t mark = js__ptr_push(j, key);
    for (size_t i = 0; i < n && ok; i++)
        ok = js__emit_to(j, &t[i], json_array_get(list, i), NULL, i, level);
    js__ptr_pop(j, mark);
    if (ok && strcmp(key, "oneOf") == 0 && n > 1) ok = check_disjoint(j, t, n);
    if (ok) {
        regex__text_puts(j->out, "(?:");
        for (size_t i = 0; i < n; i++) {
            if (i) regex__text_puts(j->out, "|");
            regex__text_put(j->out, t[i].data, t[i].len);
        }
        regex__text_puts(j->out, ")");
        ok = js__ok(j);
    }
    for (size_t i = 0; i < n; i++) free(t[i].data);
    free(t);
    return ok;
}

/* The subschema a local reference points to, or NULL. */
static const json_t *resolve(const json_t *doc, const char *ref) {
    const json_t *at = doc;
    const char *p = ref + 1; /* past '#' */
    while (*p && at) {
        if (*p != '/') return NULL;
        p++;
        char seg[256];
        size_t n = 0;
        for (; *p && *p != '/'; p++) {
            char c = *p;
            if (c == '~') {
                if (p[1] != '0' && p[1] != '1') return NULL;
                c = p[1] == '0' ? '~' : '/';
                p++;
            }
            if (n + 1 >= sizeof seg) return NULL;
            seg[n++] = c;
        }
        seg[n] = '\0';
        if (json_is_object(at)) {
            at = json_object_get(at, seg);
        } else if (json_is_array(at)) {
            char *end;
            const unsigned long i = strtoul(seg, &end, 10);
            if (!n || *end || (n > 1 && seg[0] == '0')) return NULL;
            at = json_array_get(at, i);
        } else {
            return NULL;
        }
    }
    return at;
}

static bool emit_ref(js_ctx *j, const json_t *s, int level, const json_t *const *stack,
                     int n_stack) {
    static const char *const allowed[] = {"$ref", NULL};
    const char *other = other_keyword(s, allowed);
    if (other)
        return js__fail(j, other, CORRAL_INVALID_ARGUMENT,
                        "'%s' beside $ref is not supported (only annotations may stand beside it)",
                        other);
    const json_t *r = json_object_get(s, "$ref");
    if (!json_is_string(r))
        return js__fail(j, "$ref", CORRAL_INVALID_ARGUMENT, "$ref must be a string");
    const char *ref = json_string_value(r);
    if (ref[0] != '#')
        return js__fail(j, "$ref", CORRAL_INVALID_ARGUMENT,
                        "$ref '%.96s' is not supported: only references within the schema "
                        "(#/$defs/Name) are",
                        ref);
    const json_t *target = resolve(j->doc, ref);
    if (!target)
        return js__fail(j, "$ref", CORRAL_INVALID_ARGUMENT,
                        "$ref '%.96s' points nowhere in the schema", ref);
    for (int i = 0; i < n_stack; i++)
        if (stack[i] == target)
            return js__fail(j, "$ref", CORRAL_INVALID_ARGUMENT,
                            "recursive $ref '%.96s' is not supported (it refers back to a schema "
                            "that contains it; the documents it describes have no depth bound)",
                            ref);
    /* The expansion reports places in the target. */
    char saved[JS_POINTER_MAX];
    const size_t saved_len = j->ptr_len;
    memcpy(saved, j->ptr, saved_len + 1);
    snprintf(j->ptr, sizeof j->ptr, "%s", ref + 1);
    j->ptr_len = strlen(j->ptr);
    const bool ok = js__emit(j, target, level);
    memcpy(j->ptr, saved, saved_len + 1);
    j->ptr_len = saved_len;
    return ok;
}

/* The JSON type bit of a value (an integral real counts as an integer, as JSON Schema says). */
static unsigned value_type(const json_t *v) {
    switch (json_typeof(v)) {
        case JSON_OBJECT:
            return T_OBJECT;
        case JSON_ARRAY:
            return T_ARRAY;
        case JSON_STRING:
            return T_STRING;
        case JSON_INTEGER:
            return T_INTEGER | T_NUMBER;
        case JSON_REAL: {
            const double d = json_real_value(v);
            return d == (double)(long long)d ? T_INTEGER | T_NUMBER : T_NUMBER;
        }
        case JSON_TRUE:
        case JSON_FALSE:
            return T_BOOLEAN;
        case JSON_NULL:
            return T_NULL;
    }
    return 0;
}

static bool emit_enum(js_ctx *j, const json_t *s, unsigned types) {
    static const char *const allowed[] = {"enum", "const", "type", "nullable", NULL};
    const char *other = other_keyword(s, allowed);
    const json_t *list = json_object_get(s, "enum"), *single = json_object_get(s, "const");
    const char *key = list ? "enum" : "const";
    if (other)
        return js__fail(j, other, CORRAL_INVALID_ARGUMENT, "'%s' together with %s is not supported",
                        other, key);
    if (list && single)
        return js__fail(j, "const", CORRAL_INVALID_ARGUMENT,
                        "const together with enum is not supported");
    if (list && (!json_is_array(list) || json_array_size(list) == 0))
        return js__fail(j, "enum", CORRAL_INVALID_ARGUMENT, "enum must be a non-empty array");
    const size_t n = list ? json_array_size(list) : 1;
    size_t written = 0;
    regex__text_puts(j->out, "(?:");
    for (size_t i = 0; i < n; i++) {
        const json_t *v = list ? json_array_get(list, i) : single;
        if (!(value_type(v) & types)) continue;
        if (written++) regex__text_puts(j->out, "|");
        if (!js__literal(j, v)) return false;
    }
    if (!written)
        return js__fail(j, key, CORRAL_INVALID_ARGUMENT, "no value of %s has the schema's type",
                        key);
    regex__text_puts(j->out, ")");
    return js__ok(j);
}

/* The types `type` allows (or, without it, those the keywords speak of; all when none does). */
static bool read_types(js_ctx *j, const json_t *s, unsigned *types) {
    const json_t *t = json_object_get(s, "type");
    *types = 0;
    if (!t) {
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)s, key, v) {
            const struct keyword *kw = find_keyword(key);
            if (kw && kw->role == KW_HANDLED) *types |= kw->types;
        }
        if (*types & T_NUMBER) *types |= T_INTEGER;
        if (!*types) *types = T_ALL;
    } else {
        const size_t n = json_is_array(t) ? json_array_size(t) : 1;
        if (json_is_array(t) && n == 0)
            return js__fail(j, "type", CORRAL_INVALID_ARGUMENT, "type must not be an empty array");
        for (size_t i = 0; i < n; i++) {
            const json_t *name = json_is_array(t) ? json_array_get(t, i) : t;
            unsigned bit = 0;
            for (size_t k = 0; json_is_string(name) && k < sizeof type_names / sizeof type_names[0];
                 k++)
                if (strcmp(json_string_value(name), type_names[k].name) == 0)
                    bit = type_names[k].bit;
            if (!bit && json_is_string(name) && strcmp(json_string_value(name), "json_object") == 0)
                return js__fail(
                    j, "type", CORRAL_INVALID_ARGUMENT,
                    "\"json_object\" is only a whole schema ({\"type\": \"json_object\"})");
            if (!bit)
                return js__fail(j, "type", CORRAL_INVALID_ARGUMENT,
                                "unknown type (known: object, array, string, number, integer, "
                                "boolean, null)");
            *types |= bit;
        }
    }
    if (json_is_true(json_object_get(s, "nullable"))) *types |= T_NULL;
    return true;
}

bool js__emit(js_ctx *j, const json_t *s, int level) {
    if (++j->nodes > JSON_SCHEMA_MAX_NODES)
        return js__fail(j, NULL, CORRAL_RESOURCE_EXHAUSTED,
                        "more than %d subschemas to compile, $ref expansions included "
                        "(limit JSON_SCHEMA_MAX_NODES)",
                        JSON_SCHEMA_MAX_NODES);
    if (j->depth >= JSON_SCHEMA_MAX_DEPTH)
        return js__fail(j, NULL, CORRAL_RESOURCE_EXHAUSTED,
                        "subschemas nested deeper than %d, $ref expansions included (limit "
                        "JSON_SCHEMA_MAX_DEPTH)",
                        JSON_SCHEMA_MAX_DEPTH);
    if (json_is_true(s)) return js__any_value(j, j->out, level, JSON_SCHEMA_ANY_DEPTH) && js__ok(j);
    if (json_is_false(s))
        return js__fail(j, NULL, CORRAL_INVALID_ARGUMENT, "the schema false accepts nothing");
    if (!json_is_object(s))
        return js__fail(j, NULL, CORRAL_INVALID_ARGUMENT,
                        "a schema must be an object or a boolean");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)s, key, v) {
        const struct keyword *kw = find_keyword(key);
        if (kw && kw->role == KW_REFUSED)
            return js__fail(j, key, CORRAL_INVALID_ARGUMENT, "%s", kw->why);
        if (strcmp(key, "$id") == 0 && s != j->doc)
            return js__fail(j, key, CORRAL_INVALID_ARGUMENT,
                            "$id in a subschema is not supported (it changes what $ref means)");
        if (strcmp(key, "uniqueItems") == 0 && !json_is_false(v))
            return js__fail(j, key, CORRAL_INVALID_ARGUMENT, "uniqueItems true is not supported");
    }
    j->path[j->depth++] = s;
    bool ok;
    unsigned types = 0;
    if (json_object_get(s, "$ref")) {
        ok = emit_ref(j, s, level, j->path, j->depth);
    } else if (json_object_get(s, "allOf")) {
        static const char *const allowed[] = {"allOf", NULL};
        const json_t *all = json_object_get(s, "allOf");
        const char *other = other_keyword(s, allowed);
        if (!json_is_array(all) || json_array_size(all) != 1)
            ok = js__fail(j, "allOf", CORRAL_INVALID_ARGUMENT,
                          "allOf is supported with exactly one schema");
        else if (other)
            ok = js__fail(j, other, CORRAL_INVALID_ARGUMENT, "'%s' beside allOf is not supported",
                          other);
        else {
            const size_t mark = js__ptr_push(j, "allOf");
            const size_t m2 = js__ptr_push_index(j, 0);
            ok = js__emit(j, json_array_get(all, 0), level);
            js__ptr_pop(j, m2);
            js__ptr_pop(j, mark);
        }
    } else if (json_object_get(s, "anyOf")) {
        ok = emit_alternatives(j, s, "anyOf", level);
    } else if (json_object_get(s, "oneOf")) {
        ok = emit_alternatives(j, s, "oneOf", level);
    } else if (!(ok = read_types(j, s, &types))) {
        /* the error is recorded */
    } else if (json_object_get(s, "enum") || json_object_get(s, "const")) {
        ok = emit_enum(j, s, json_object_get(s, "type") ? types : T_ALL);
    } else if (types == T_ALL && !json_object_get(s, "type")) { /* nothing said: as `true` */
        ok = js__any_value(j, j->out, level, JSON_SCHEMA_ANY_DEPTH);
    } else {
        if ((types & T_NUMBER) && (types & T_INTEGER)) types &= ~(unsigned)T_INTEGER;
        int n = 0;
        for (unsigned t = types; t; t &= t - 1) n++;
        if (n > 1) regex__text_puts(j->out, "(?:");
        ok = true;
        int written = 0;
        for (size_t k = 0; ok && k < sizeof type_names / sizeof type_names[0]; k++) {
            const unsigned bit = type_names[k].bit;
            if (!(types & bit)) continue;
            if (written++) regex__text_puts(j->out, "|");
            switch (bit) {
                case T_OBJECT:
                    ok = js__object(j, s, level);
                    break;
                case T_ARRAY:
                    ok = js__array(j, s, level);
                    break;
                case T_STRING:
                    ok = js__string(j, s);
                    break;
                case T_NUMBER:
                case T_INTEGER:
                    ok = js__number(j, s, bit == T_INTEGER);
                    break;
                case T_BOOLEAN:
                    ok = regex__text_puts(j->out, "(?:true|false)");
                    break;
                default:
                    ok = regex__text_puts(j->out, "null");
                    break;
            }
        }
        if (ok && n > 1) regex__text_puts(j->out, ")");
        ok = ok && js__ok(j);
    }
    j->depth--;
    return ok && js__ok(j);
}

/* ---- the whole ----------------------------------------------------------------------------------
 */

/* {"type": "json_object"} with nothing else but annotations. */
static bool is_json_object_mode(const json_t *doc) {
    const json_t *t = json_object_get(doc, "type");
    if (!json_is_string(t) || strcmp(json_string_value(t), "json_object") != 0) return false;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)doc, key, v) {
        const struct keyword *kw = find_keyword(key);
        if (kw && kw->role != KW_ANNOTATION && strcmp(key, "type") != 0) return false;
    }
    return true;
}

corral_status json_schema_to_regex(const char *schema, size_t len, char **regex, size_t *regex_len,
                                   corral_error *err) {
    if (regex) *regex = NULL;
    if (regex_len) *regex_len = 0;
    if (!regex || (!schema && len))
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "json schema: no schema or output");
    if (len > JSON_SCHEMA_MAX_BYTES)
        return corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                                "json schema: the schema has %zu bytes; the limit is %u "
                                "(JSON_SCHEMA_MAX_BYTES)",
                                len, JSON_SCHEMA_MAX_BYTES);
    json_error_t je;
    json_t *doc =
        json_loadb(schema ? schema : "", len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!doc)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "json schema: not valid JSON: line %d, column %d: %s", je.line,
                                je.column, je.text);
    regex_text out = {.limit = JSON_SCHEMA_MAX_REGEX};
    js_ctx j = {.doc = doc, .out = &out, .err = err};
    bool ok;
    if (json_is_object(doc) && is_json_object_mode(doc)) {
        regex_text value = {.limit = JSON_SCHEMA_MAX_REGEX};
        js__any_value(&j, &value, 1, JSON_SCHEMA_ANY_DEPTH);
        if (value.status != CORRAL_OK) out.status = value.status;
        js__map_of(&out, &value, 0);
        free(value.data);
        ok = js__ok(&j);
    } else {
        ok = js__emit(&j, doc, 0) && js__ok(&j);
    }
    json_decref(doc);
    if (!ok) {
        free(out.data);
        if (j.status == CORRAL_OK)
            j.status = corral_error_set(err, CORRAL_INTERNAL, "json schema: internal error");
        return j.status;
    }
    *regex = out.data;
    if (regex_len) *regex_len = out.len;
    return CORRAL_OK;
}
