/*
 * regex.c — ECMAScript-like patterns to minimal byte DFAs (see regex.h for the syntax).
 *
 * Four stages, each in its own section below, after the budget they all draw on:
 *   1. a recursive-descent parser builds a small tree (sets of code points, concatenation,
 *      alternation, repetition); every error names the construct and its byte offset;
 *   2. Thompson's construction turns the tree into an NFA over byte ranges: a set of code points
 *      becomes the byte sequences of its UTF-8 encodings (ranges are split where the encoded
 *      length or a continuation byte's range changes, so that each piece is a product of byte
 *      ranges); a repetition {m,n} is m copies followed by n-m optional ones;
 *   3. the subset construction over byte classes (bytes that no NFA edge tells apart share a
 *      column) gives a DFA; states that cannot reach an accepting state are dropped, so a missing
 *      transition always means "this can no longer match";
 *   4. Hopcroft's partition refinement minimises it, equal columns are merged, and states are
 *      renumbered breadth-first from the start.
 * Every stage is linear in what it builds (Hopcroft: that times log(states)), and what it builds
 * is bounded by the limits of regex.h, counted as it is built. Nothing here is on a per-token
 * path: compilation happens once per pattern.
 */
#include "regex.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

#define CP_MAX     0x10FFFFu
#define SURR_FIRST 0xD800u
#define SURR_LAST  0xDFFFu

/* ---- the budget -------------------------------------------------------------------------------
 *
 * One rx_ctx per compile, shared by every stage: the bytes it holds (each block carries its size
 * in a small header, so a free gives them back), the steps it has taken, and its first error.
 * Every allocation of the compile goes through rx_realloc, which refuses one that would take the
 * total above REGEX_MAX_COMPILE_BYTES; every loop whose length the pattern decides pays for its
 * iterations with rx_work (or a local allowance taken from it) before it runs them. A stage that
 * fails returns false or -1 and the driver returns cx->status: the message is written once, where
 * the limit was hit, naming it.
 */

typedef struct rx_ctx {
    uint64_t bytes, peak_bytes; /* held now, most held at once */
    uint64_t work;              /* steps taken, <= REGEX_MAX_COMPILE_WORK */
    const char *stage;          /* for messages: "the subset construction" */
    corral_error *err;
    corral_status status; /* the first error */
} rx_ctx;

typedef union rx_head {
    size_t size; /* of the block after the header */
    max_align_t align;
} rx_head;

/* Record the first error ("regex: " and the message); returns false. */
__attribute__((format(printf, 3, 4))) static bool rx_fail(rx_ctx *cx, corral_status st,
                                                          const char *fmt, ...) {
    if (cx->status != CORRAL_OK) return false;
    char msg[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cx->status = corral_error_set(cx->err, st, "regex: %s", msg);
    return false;
}

/* Charge n more bytes held (and refuse them over the limit) without allocating them: for the
 * finished DFA, which is allocated plainly because its owner frees it with free(). */
static bool rx_charge(rx_ctx *cx, uint64_t n) {
    if (n > REGEX_MAX_COMPILE_BYTES - cx->bytes)
        return rx_fail(
            cx, CORRAL_RESOURCE_EXHAUSTED,
            "the pattern is too complex: compiling it needs more than %llu MiB of memory "
            "in %s (limit REGEX_MAX_COMPILE_BYTES)",
            (unsigned long long)(REGEX_MAX_COMPILE_BYTES >> 20), cx->stage);
    cx->bytes += n;
    if (cx->bytes > cx->peak_bytes) cx->peak_bytes = cx->bytes;
    return true;
}

/* realloc(p, n) within the budget (p NULL or from rx_realloc); NULL with the error recorded. The
 * old block is counted until the new one exists: a realloc that moves holds both. */
static void *rx_realloc(rx_ctx *cx, void *p, uint64_t n) {
    rx_head *h = p ? (rx_head *)p - 1 : NULL;
    const uint64_t old = h ? sizeof *h + h->size : 0;
    if (n > REGEX_MAX_COMPILE_BYTES) return rx_charge(cx, n), NULL;
    if (!rx_charge(cx, sizeof *h + n)) return NULL;
    rx_head *q = realloc(h, sizeof *q + (size_t)n);
    if (!q) {
        cx->bytes -= sizeof *h + n;
        rx_fail(cx, CORRAL_OUT_OF_MEMORY, "out of memory");
        return NULL;
    }
    cx->bytes -= old;
    q->size = (size_t)n;
    return q + 1;
}

static void *rx_alloc(rx_ctx *cx, uint64_t count, size_t elem) {
    if (count > REGEX_MAX_COMPILE_BYTES / (elem ? elem : 1)) return rx_charge(cx, UINT64_MAX), NULL;
    return rx_realloc(cx, NULL, count * elem);
}

static void *rx_zalloc(rx_ctx *cx, uint64_t count, size_t elem) {
    void *p = rx_alloc(cx, count, elem);
    if (p) memset(p, 0, (size_t)(count * elem));
    return p;
}

static void rx_free(rx_ctx *cx, void *p) {
    if (!p) return;
    rx_head *h = (rx_head *)p - 1;
    cx->bytes -= sizeof *h + h->size;
    free(h);
}

/* Pay for `units` steps before taking them. */
static bool rx_work(rx_ctx *cx, uint64_t units) {
    if (units > REGEX_MAX_COMPILE_WORK - cx->work) {
        cx->work = REGEX_MAX_COMPILE_WORK;
        return rx_fail(cx, CORRAL_RESOURCE_EXHAUSTED,
                       "the pattern is too complex: compiling it takes more than %llu steps in %s "
                       "(limit REGEX_MAX_COMPILE_WORK)",
                       (unsigned long long)REGEX_MAX_COMPILE_WORK, cx->stage);
    }
    cx->work += units;
    return true;
}

/* Grow *p (elements of `elem` bytes, capacity *cap) to hold at least `need`. */
static bool grow(rx_ctx *cx, void **p, uint32_t *cap, uint64_t need, size_t elem) {
    if (need <= *cap) return true;
    uint64_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    if (n > UINT32_MAX / 2) return rx_charge(cx, UINT64_MAX);
    void *q = rx_realloc(cx, *p, n * elem);
    if (!q) return false;
    *p = q;
    *cap = (uint32_t)n;
    return true;
}

/* ---- sets of code points --------------------------------------------------------------------- */

typedef struct cp_range {
    uint32_t lo, hi;
} cp_range;

typedef struct cpset {
    cp_range *r;
    uint32_t n, cap;
} cpset;

static bool cpset_add(rx_ctx *cx, cpset *s, uint32_t lo, uint32_t hi) {
    if (!grow(cx, (void **)&s->r, &s->cap, (uint64_t)s->n + 1, sizeof *s->r)) return false;
    s->r[s->n++] = (cp_range){lo, hi};
    return true;
}

static int range_cmp(const void *a, const void *b) {
    const cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sort and merge, and cut out the surrogates (UTF-8 cannot encode them). The work is paid by the
 * parser: every range was added by the pattern's text. */
static bool cpset_normalize(rx_ctx *cx, cpset *s) {
    if (s->n == 0) return true;
    qsort(s->r, s->n, sizeof *s->r, range_cmp);
    uint32_t k = 0;
    for (uint32_t i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[k].hi + 1) {
            if (s->r[i].hi > s->r[k].hi) s->r[k].hi = s->r[i].hi;
        } else {
            s->r[++k] = s->r[i];
        }
    }
    s->n = k + 1;
    for (uint32_t i = 0; i < s->n; i++) {
        cp_range r = s->r[i];
        if (r.hi < SURR_FIRST || r.lo > SURR_LAST) continue;
        if (r.lo < SURR_FIRST && r.hi > SURR_LAST) { /* split in two */
            if (!grow(cx, (void **)&s->r, &s->cap, (uint64_t)s->n + 1, sizeof *s->r)) return false;
            memmove(&s->r[i + 2], &s->r[i + 1], (s->n - i - 1) * sizeof *s->r);
            s->r[i] = (cp_range){r.lo, SURR_FIRST - 1};
            s->r[i + 1] = (cp_range){SURR_LAST + 1, r.hi};
            s->n++;
            i++;
        } else if (r.lo < SURR_FIRST) {
            s->r[i].hi = SURR_FIRST - 1;
        } else if (r.hi > SURR_LAST) {
            s->r[i].lo = SURR_LAST + 1;
        } else { /* entirely surrogates */
            memmove(&s->r[i], &s->r[i + 1], (s->n - i - 1) * sizeof *s->r);
            s->n--;
            i--;
        }
    }
    return true;
}

/* Complement within the Unicode scalar values. s must be normalized. */
static bool cpset_negate(rx_ctx *cx, cpset *s) {
    cpset out = {0};
    uint32_t next = 0;
    bool ok = true;
    for (uint32_t i = 0; i < s->n && ok; i++) {
        if (s->r[i].lo > next) ok = cpset_add(cx, &out, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (ok && next <= CP_MAX) ok = cpset_add(cx, &out, next, CP_MAX);
    ok = ok && cpset_normalize(cx, &out);
    rx_free(cx, s->r);
    *s = out;
    return ok;
}

/* Add the other case of every ASCII letter in s. */
static bool cpset_fold_ascii(rx_ctx *cx, cpset *s) {
    const uint32_t n = s->n;
    for (uint32_t i = 0; i < n; i++) {
        const cp_range r = s->r[i];
        const uint32_t lo_u = r.lo > 'A' ? r.lo : 'A', hi_u = r.hi < 'Z' ? r.hi : 'Z';
        if (lo_u <= hi_u && !cpset_add(cx, s, lo_u + 32, hi_u + 32)) return false;
        const uint32_t lo_l = r.lo > 'a' ? r.lo : 'a', hi_l = r.hi < 'z' ? r.hi : 'z';
        if (lo_l <= hi_l && !cpset_add(cx, s, lo_l - 32, hi_l - 32)) return false;
    }
    return cpset_normalize(cx, s);
}

/* ---- stage 1: the parser -----------------------------------------------------------------------
 */

typedef enum node_type {
    NODE_EMPTY = 0,
    NODE_SET = 1,    /* one code point of a set */
    NODE_CAT = 2,    /* children in sequence (none: the empty string) */
    NODE_ALT = 3,    /* one of the children */
    NODE_REPEAT = 4, /* the only child, min..max times (max -1: unbounded) */
} node_type;

typedef struct node {
    node_type type;
    int32_t first_child, last_child, next_sibling;
    int32_t min, max;
    int32_t set;      /* NODE_SET: index into parser.sets */
    uint32_t at, len; /* where it is in the pattern (NODE_REPEAT: its quantifier) */
} node;

typedef struct parser {
    const char *pat;
    size_t len, pos;
    uint32_t flags;
    node *nodes;
    uint32_t n_nodes, cap_nodes;
    cpset *sets;
    uint32_t n_sets, cap_sets;
    rx_ctx *cx;
} parser;

/* Record the first error; returns -1 so that `return perr(...)` ends a parse function. */
__attribute__((format(printf, 4, 5))) static int32_t perr(parser *p, corral_status st, size_t at,
                                                          const char *fmt, ...) {
    if (p->cx->status != CORRAL_OK) return -1;
    char msg[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rx_fail(p->cx, st, "%s (at offset %zu)", msg, at);
    return -1;
}

static int32_t new_node(parser *p, node_type type) {
    if (!grow(p->cx, (void **)&p->nodes, &p->cap_nodes, (uint64_t)p->n_nodes + 1, sizeof *p->nodes))
        return -1;
    p->nodes[p->n_nodes] = (node){.type = type,
                                  .first_child = -1,
                                  .last_child = -1,
                                  .next_sibling = -1,
                                  .set = -1,
                                  .at = (uint32_t)p->pos};
    return (int32_t)p->n_nodes++;
}

static void add_child(parser *p, int32_t parent, int32_t child) {
    node *n = &p->nodes[parent];
    if (n->last_child < 0) {
        n->first_child = child;
    } else {
        p->nodes[n->last_child].next_sibling = child;
    }
    n->last_child = child;
}

static int32_t new_set(parser *p) {
    if (!grow(p->cx, (void **)&p->sets, &p->cap_sets, (uint64_t)p->n_sets + 1, sizeof *p->sets))
        return -1;
    p->sets[p->n_sets] = (cpset){0};
    return (int32_t)p->n_sets++;
}

/* A NODE_SET over set index `set`, case-folded when the flags ask. */
static int32_t set_node(parser *p, int32_t set) {
    if (!cpset_normalize(p->cx, &p->sets[set])) return -1;
    if ((p->flags & REGEX_CASELESS) && !cpset_fold_ascii(p->cx, &p->sets[set])) return -1;
    int32_t n = new_node(p, NODE_SET);
    if (n >= 0) p->nodes[n].set = set;
    return n;
}

static bool at(const parser *p, char c) {
    return p->pos < p->len && p->pat[p->pos] == c;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Read exactly n hex digits at pos; -1 if they are not there. */
static int64_t read_hex(parser *p, int n) {
    if (p->len - p->pos < (size_t)n) return -1;
    int64_t v = 0;
    for (int i = 0; i < n; i++) {
        const int h = hexval(p->pat[p->pos + i]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    p->pos += (size_t)n;
    return v;
}

/* The predefined classes. */
static bool add_class_escape(rx_ctx *cx, cpset *s, char c) {
    bool ok = true;
    switch (c) {
        case 'd':
        case 'D':
            ok = cpset_add(cx, s, '0', '9');
            break;
        case 'w':
        case 'W':
            ok = cpset_add(cx, s, '0', '9') && cpset_add(cx, s, 'A', 'Z') &&
                 cpset_add(cx, s, 'a', 'z') && cpset_add(cx, s, '_', '_');
            break;
        case 's':
        case 'S': { /* ECMAScript's WhiteSpace and LineTerminator */
            static const cp_range space[] = {
                {0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                {0x3000, 0x3000}, {0xFEFF, 0xFEFF},
            };
            for (size_t i = 0; i < sizeof space / sizeof space[0] && ok; i++)
                ok = cpset_add(cx, s, space[i].lo, space[i].hi);
            break;
        }
    }
    if (!ok) return false;
    if (c == 'D' || c == 'W' || c == 'S') return cpset_normalize(cx, s) && cpset_negate(cx, s);
    return cpset_normalize(cx, s);
}

/* Parse the escape at pos (a backslash). Returns 1 with *cp for a single character, 2 with the
 * class added to sets[*set] (a new set) for \d \w \s and their negations, -1 on error. */
static int parse_escape(parser *p, bool in_class, uint32_t *cp, int32_t *set) {
    const size_t start = p->pos++;
    if (p->pos >= p->len)
        return perr(p, CORRAL_INVALID_ARGUMENT, start, "lone backslash at the end");
    const char c = p->pat[p->pos++];
    switch (c) {
        case 'd':
        case 'D':
        case 'w':
        case 'W':
        case 's':
        case 'S':
            *set = new_set(p);
            if (*set < 0) return -1;
            if (!add_class_escape(p->cx, &p->sets[*set], c)) return -1;
            return 2;
        case 'n':
            *cp = '\n';
            return 1;
        case 'r':
            *cp = '\r';
            return 1;
        case 't':
            *cp = '\t';
            return 1;
        case 'f':
            *cp = '\f';
            return 1;
        case 'v':
            *cp = '\v';
            return 1;
        case '0':
            if (p->pos < p->len && p->pat[p->pos] >= '0' && p->pat[p->pos] <= '9')
                return perr(p, CORRAL_INVALID_ARGUMENT, start, "octal escapes are not supported");
            *cp = 0;
            return 1;
        case 'b':
            if (in_class) {
                *cp = 0x08;
                return 1;
            }
            return perr(p, CORRAL_INVALID_ARGUMENT, start,
                        "word-boundary assertions (\\b) are not supported");
        case 'B':
            return perr(p, CORRAL_INVALID_ARGUMENT, start,
                        "word-boundary assertions (\\B) are not supported");
        case 'k':
            return perr(p, CORRAL_INVALID_ARGUMENT, start,
                        "backreferences (\\k<name>) are not supported");
        case 'p':
        case 'P':
            return perr(p, CORRAL_INVALID_ARGUMENT, start,
                        "Unicode property escapes (\\%c{...}) are not supported", c);
        case 'c': {
            const char l = p->pos < p->len ? p->pat[p->pos] : 0;
            if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z')))
                return perr(p, CORRAL_INVALID_ARGUMENT, start, "\\c must be followed by a letter");
            p->pos++;
            *cp = (uint32_t)l % 32;
            return 1;
        }
        case 'x': {
            const int64_t v = read_hex(p, 2);
            if (v < 0) return perr(p, CORRAL_INVALID_ARGUMENT, start, "\\x needs two hex digits");
            *cp = (uint32_t)v;
            return 1;
        }
        case 'u': {
            int64_t v;
            if (at(p, '{')) {
                const size_t open = p->pos++;
                v = 0;
                int digits = 0;
                while (p->pos < p->len && hexval(p->pat[p->pos]) >= 0) {
                    v = v * 16 + hexval(p->pat[p->pos++]);
                    if (v > CP_MAX)
                        return perr(p, CORRAL_INVALID_ARGUMENT, start,
                                    "\\u{...} is above U+10FFFF");
                    digits++;
                }
                if (!digits || !at(p, '}'))
                    return perr(p, CORRAL_INVALID_ARGUMENT, open,
                                "\\u{...} needs hex digits and a closing '}'");
                p->pos++;
            } else {
                v = read_hex(p, 4);
                if (v < 0)
                    return perr(p, CORRAL_INVALID_ARGUMENT, start,
                                "\\u needs four hex digits (or \\u{...})");
            }
            if (v >= 0xD800 && v <= 0xDBFF && p->len - p->pos >= 6 && p->pat[p->pos] == '\\' &&
                p->pat[p->pos + 1] == 'u') {
                const size_t save = p->pos;
                p->pos += 2;
                const int64_t lo = read_hex(p, 4);
                if (lo >= 0xDC00 && lo <= 0xDFFF) {
                    *cp = 0x10000u + (((uint32_t)v - 0xD800u) << 10) + ((uint32_t)lo - 0xDC00u);
                    return 1;
                }
                p->pos = save;
            }
            if (v >= SURR_FIRST && v <= SURR_LAST)
                return perr(p, CORRAL_INVALID_ARGUMENT, start,
                            "lone surrogate \\u%04X cannot appear in UTF-8 text", (unsigned)v);
            *cp = (uint32_t)v;
            return 1;
        }
        default:
            break;
    }
    if (c >= '1' && c <= '9')
        return perr(p, CORRAL_INVALID_ARGUMENT, start, "backreferences (\\%c) are not supported",
                    c);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')
        return perr(p, CORRAL_INVALID_ARGUMENT, start, "unknown escape \\%c", c);
    /* An identity escape: the character itself (punctuation, or any non-ASCII character). */
    p->pos--;
    const int n = utf8_decode((const uint8_t *)p->pat + p->pos, p->len - p->pos, cp);
    if (n <= 0) return perr(p, CORRAL_INVALID_ARGUMENT, p->pos, "invalid UTF-8 in the pattern");
    p->pos += (size_t)n;
    return 1;
}

/* A literal character at pos. */
static int32_t parse_literal(parser *p) {
    uint32_t cp;
    const int n = utf8_decode((const uint8_t *)p->pat + p->pos, p->len - p->pos, &cp);
    if (n <= 0) return perr(p, CORRAL_INVALID_ARGUMENT, p->pos, "invalid UTF-8 in the pattern");
    p->pos += (size_t)n;
    int32_t set = new_set(p);
    if (set < 0) return -1;
    if (!cpset_add(p->cx, &p->sets[set], cp, cp)) return -1;
    return set_node(p, set);
}

/* One item of a class: 1 with *cp, 2 with a class escape in *set, -1 on error. */
static int parse_class_atom(parser *p, uint32_t *cp, int32_t *set) {
    if (p->pat[p->pos] == '\\') {
        if (p->len - p->pos >= 2 && p->pat[p->pos + 1] == '-') {
            p->pos += 2;
            *cp = '-';
            return 1;
        }
        return parse_escape(p, true, cp, set);
    }
    const int n = utf8_decode((const uint8_t *)p->pat + p->pos, p->len - p->pos, cp);
    if (n <= 0) return perr(p, CORRAL_INVALID_ARGUMENT, p->pos, "invalid UTF-8 in the pattern");
    p->pos += (size_t)n;
    return 1;
}

static int32_t parse_class(parser *p) {
    const size_t open = p->pos++;
    bool negate = false;
    if (at(p, '^')) {
        negate = true;
        p->pos++;
    }
    int32_t set = new_set(p);
    if (set < 0) return -1;
    for (;;) {
        if (p->pos >= p->len)
            return perr(p, CORRAL_INVALID_ARGUMENT, open, "missing ']' for this class");
        if (at(p, ']')) {
            p->pos++;
            break;
        }
        const size_t item = p->pos;
        uint32_t lo, hi;
        int32_t esc = -1;
        const int k = parse_class_atom(p, &lo, &esc);
        if (k < 0) return -1;
        const bool range =
            p->len - p->pos >= 2 && p->pat[p->pos] == '-' && p->pat[p->pos + 1] != ']';
        if (k == 2) {
            if (range)
                return perr(p, CORRAL_INVALID_ARGUMENT, item,
                            "a class escape like \\d cannot be the end of a range");
            const cpset *e = &p->sets[esc];
            for (uint32_t i = 0; i < e->n; i++)
                if (!cpset_add(p->cx, &p->sets[set], e->r[i].lo, e->r[i].hi)) return -1;
            continue;
        }
        hi = lo;
        if (range) {
            p->pos++; /* '-' */
            const int k2 = parse_class_atom(p, &hi, &esc);
            if (k2 < 0) return -1;
            if (k2 == 2)
                return perr(p, CORRAL_INVALID_ARGUMENT, item,
                            "a class escape like \\d cannot be the end of a range");
            if (hi < lo)
                return perr(p, CORRAL_INVALID_ARGUMENT, item,
                            "range out of order in the class (U+%04X > U+%04X)", (unsigned)lo,
                            (unsigned)hi);
        }
        if (!cpset_add(p->cx, &p->sets[set], lo, hi)) return -1;
    }
    cpset *s = &p->sets[set];
    if (!cpset_normalize(p->cx, s)) return -1;
    if ((p->flags & REGEX_CASELESS) && !cpset_fold_ascii(p->cx, s)) return -1;
    if (negate && !cpset_negate(p->cx, s)) return -1;
    int32_t n = new_node(p, NODE_SET);
    if (n >= 0) p->nodes[n].set = set;
    return n;
}

/* {m}, {m,} or {m,n} at pos: 1 (consumed; *min and *max set; max -1 = unbounded), 0 when the text
 * is not a quantifier (then '{' is a literal), -1 on error. */
static int parse_braces(parser *p, int32_t *min, int32_t *max) {
    size_t i = p->pos + 1;
    int64_t v[2] = {-1, -1};
    int part = 0;
    bool comma = false;
    for (; i < p->len; i++) {
        const char c = p->pat[i];
        if (c >= '0' && c <= '9') {
            v[part] = (v[part] < 0 ? 0 : v[part]) * 10 + (c - '0');
            if (v[part] > REGEX_MAX_REPEAT)
                return perr(p, CORRAL_RESOURCE_EXHAUSTED, p->pos,
                            "repetition count above the limit of %d (REGEX_MAX_REPEAT)",
                            REGEX_MAX_REPEAT);
        } else if (c == ',' && !comma) {
            comma = true;
            part = 1;
        } else if (c == '}') {
            break;
        } else {
            return 0;
        }
    }
    if (i >= p->len || v[0] < 0) return 0;
    *min = (int32_t)v[0];
    *max = comma ? (int32_t)v[1] : (int32_t)v[0];
    if (*max >= 0 && *max < *min)
        return perr(p, CORRAL_INVALID_ARGUMENT, p->pos, "numbers out of order in {%d,%d}", *min,
                    *max);
    p->pos = i + 1;
    return 1;
}

static int32_t parse_alt(parser *p, int depth);

static int32_t parse_group(parser *p, int depth) {
    const size_t open = p->pos++;
    if (at(p, '?')) {
        const char *s = p->pat + p->pos;
        const size_t left = p->len - p->pos;
        if (left >= 2 && s[1] == ':') {
            p->pos += 2;
        } else if (left >= 2 && (s[1] == '=' || s[1] == '!')) {
            return perr(p, CORRAL_INVALID_ARGUMENT, open, "lookahead (?%c...) is not supported",
                        s[1]);
        } else if (left >= 3 && s[1] == '<' && (s[2] == '=' || s[2] == '!')) {
            return perr(p, CORRAL_INVALID_ARGUMENT, open, "lookbehind (?<%c...) is not supported",
                        s[2]);
        } else if (left >= 2 && s[1] == '<') {
            size_t i = 2;
            while (i < left && (s[i] == '_' || s[i] == '$' || (s[i] >= '0' && s[i] <= '9') ||
                                (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
                i++;
            if (i == 2 || i >= left || s[i] != '>')
                return perr(p, CORRAL_INVALID_ARGUMENT, open, "malformed group name (?<name>...)");
            p->pos += i + 1;
        } else {
            return perr(p, CORRAL_INVALID_ARGUMENT, open,
                        "unsupported group syntax '(?%.1s' (flags and other extensions)",
                        left >= 2 ? s + 1 : "");
        }
    }
    if (depth + 1 > REGEX_MAX_DEPTH)
        return perr(p, CORRAL_RESOURCE_EXHAUSTED, open,
                    "groups nested deeper than %d (limit REGEX_MAX_DEPTH)", REGEX_MAX_DEPTH);
    int32_t inner = parse_alt(p, depth + 1);
    if (inner < 0) return -1;
    if (!at(p, ')')) return perr(p, CORRAL_INVALID_ARGUMENT, open, "missing ')' for this group");
    p->pos++;
    return inner;
}

static int32_t parse_atom(parser *p, int depth) {
    const char c = p->pat[p->pos];
    int32_t min, max;
    switch (c) {
        case '(':
            return parse_group(p, depth);
        case '[':
            return parse_class(p);
        case '.': {
            p->pos++;
            int32_t set = new_set(p);
            if (set < 0) return -1;
            cpset *s = &p->sets[set];
            if (!cpset_add(p->cx, s, '\n', '\n') || !cpset_add(p->cx, s, '\r', '\r') ||
                !cpset_add(p->cx, s, 0x2028, 0x2029) || !cpset_normalize(p->cx, s) ||
                !cpset_negate(p->cx, s))
                return -1;
            int32_t n = new_node(p, NODE_SET);
            if (n >= 0) p->nodes[n].set = set;
            return n;
        }
        case '\\': {
            uint32_t cp;
            int32_t set = -1;
            const int k = parse_escape(p, false, &cp, &set);
            if (k < 0) return -1;
            if (k == 1) {
                set = new_set(p);
                if (set < 0) return -1;
                if (!cpset_add(p->cx, &p->sets[set], cp, cp)) return -1;
            }
            return set_node(p, set);
        }
        case '*':
        case '+':
        case '?':
            return perr(p, CORRAL_INVALID_ARGUMENT, p->pos, "nothing to repeat before '%c'", c);
        case '{': {
            const size_t brace = p->pos;
            const int k = parse_braces(p, &min, &max);
            if (k < 0) return -1;
            if (k > 0)
                return perr(p, CORRAL_INVALID_ARGUMENT, brace, "nothing to repeat before '{'");
            return parse_literal(p);
        }
        default:
            return parse_literal(p);
    }
}

/* An atom and its quantifier, if any. */
static int32_t parse_quantified(parser *p, int depth) {
    int32_t atom = parse_atom(p, depth);
    if (atom < 0 || p->pos >= p->len) return atom;
    const size_t quant = p->pos;
    int32_t min, max;
    switch (p->pat[p->pos]) {
        case '*':
            min = 0, max = -1, p->pos++;
            break;
        case '+':
            min = 1, max = -1, p->pos++;
            break;
        case '?':
            min = 0, max = 1, p->pos++;
            break;
        case '{': {
            const int k = parse_braces(p, &min, &max);
            if (k < 0) return -1;
            if (k == 0) return atom;
            break;
        }
        default:
            return atom;
    }
    if (at(p, '?')) p->pos++; /* lazy: the same language */
    if (p->pos < p->len) {
        int32_t m2, x2;
        const char c = p->pat[p->pos];
        const size_t save = p->pos;
        if (c == '*' || c == '+' || c == '?' || (c == '{' && parse_braces(p, &m2, &x2) > 0))
            return perr(p, CORRAL_INVALID_ARGUMENT, save,
                        "a quantifier cannot follow another quantifier");
        if (p->cx->status != CORRAL_OK) return -1;
        p->pos = save;
    }
    int32_t rep = new_node(p, NODE_REPEAT);
    if (rep < 0) return -1;
    p->nodes[rep].min = min;
    p->nodes[rep].max = max;
    p->nodes[rep].at = (uint32_t)quant;
    p->nodes[rep].len = (uint32_t)(p->pos - quant);
    add_child(p, rep, atom);
    return rep;
}

static int32_t parse_cat(parser *p, int depth) {
    int32_t cat = new_node(p, NODE_CAT);
    if (cat < 0) return -1;
    while (p->pos < p->len) {
        const char c = p->pat[p->pos];
        if (c == '|' || c == ')') break;
        if (c == '^') {
            if (depth == 0 && p->nodes[cat].first_child < 0) {
                p->pos++;
                continue;
            }
            return perr(p, CORRAL_INVALID_ARGUMENT, p->pos,
                        "'^' is supported only at the start of the pattern or of a top-level "
                        "alternative (the whole output is matched)");
        }
        if (c == '$') {
            const size_t next = p->pos + 1;
            if (depth == 0 && (next == p->len || p->pat[next] == '|')) {
                p->pos++;
                continue;
            }
            return perr(p, CORRAL_INVALID_ARGUMENT, p->pos,
                        "'$' is supported only at the end of the pattern or of a top-level "
                        "alternative (the whole output is matched)");
        }
        int32_t item = parse_quantified(p, depth);
        if (item < 0) return -1;
        add_child(p, cat, item);
    }
    return cat;
}

static int32_t parse_alt(parser *p, int depth) {
    int32_t first = parse_cat(p, depth);
    if (first < 0 || !at(p, '|')) return first;
    int32_t alt = new_node(p, NODE_ALT);
    if (alt < 0) return -1;
    add_child(p, alt, first);
    while (at(p, '|')) {
        p->pos++;
        int32_t c = parse_cat(p, depth);
        if (c < 0) return -1;
        add_child(p, alt, c);
    }
    return alt;
}

/* ---- stage 2: Thompson NFA over byte ranges ----------------------------------------------------
 */

typedef struct nfa_edge {
    uint32_t from, to;
    uint8_t lo, hi, eps;
} nfa_edge;

typedef struct nfa {
    uint32_t n_states;
    nfa_edge *e;
    uint32_t n_edges, cap_edges;
    const parser *p;
    uint32_t at; /* offset of the construct being built, for messages */
    rx_ctx *cx;
} nfa;

typedef struct frag {
    int32_t start, end;
} frag;

static bool nfa_too_large(nfa *b, const char *what, unsigned long long limit, const char *name) {
    return rx_fail(b->cx, CORRAL_RESOURCE_EXHAUSTED,
                   "the pattern is too large: more than %llu automaton %s once repetitions are "
                   "expanded (limit %s; at offset %u)",
                   limit, what, name, (unsigned)b->at);
}

static int32_t nfa_state(nfa *b) {
    if (b->n_states >= REGEX_MAX_NFA_STATES) {
        nfa_too_large(b, "states", REGEX_MAX_NFA_STATES, "REGEX_MAX_NFA_STATES");
        return -1;
    }
    return (int32_t)b->n_states++;
}

static bool nfa_edge_add(nfa *b, int32_t from, int32_t to, uint8_t lo, uint8_t hi, bool eps) {
    if (b->n_edges >= REGEX_MAX_NFA_EDGES)
        return nfa_too_large(b, "edges", REGEX_MAX_NFA_EDGES, "REGEX_MAX_NFA_EDGES");
    if (!grow(b->cx, (void **)&b->e, &b->cap_edges, (uint64_t)b->n_edges + 1, sizeof *b->e))
        return false;
    b->e[b->n_edges++] = (nfa_edge){(uint32_t)from, (uint32_t)to, lo, hi, eps};
    return true;
}

static bool nfa_eps(nfa *b, int32_t from, int32_t to) {
    return nfa_edge_add(b, from, to, 0, 0, true);
}

/* A chain s -r[0]-> . -r[1]-> ... -> e for one UTF-8 sequence of byte ranges. */
static bool nfa_chain(nfa *b, int32_t s, int32_t e, const uint8_t lo[4], const uint8_t hi[4],
                      int n) {
    int32_t cur = s;
    for (int i = 0; i < n; i++) {
        int32_t to = i == n - 1 ? e : nfa_state(b);
        if (to < 0 || !nfa_edge_add(b, cur, to, lo[i], hi[i], false)) return false;
        cur = to;
    }
    return true;
}

/* The byte sequences of the code points lo..hi (no surrogates, same encoded length or not),
 * each a product of byte ranges, added as chains from s to e. The split points: encoded-length
 * boundaries first, then, from the last byte up, wherever a continuation byte's full range 80..BF
 * is not covered at both ends. */
static bool nfa_utf8_range(nfa *b, int32_t s, int32_t e, uint32_t lo, uint32_t hi) {
    static const uint32_t len_max[] = {0x7F, 0x7FF, 0xFFFF, CP_MAX};
    for (int k = 0; k < 3; k++) {
        if (lo <= len_max[k] && hi > len_max[k])
            return nfa_utf8_range(b, s, e, lo, len_max[k]) &&
                   nfa_utf8_range(b, s, e, len_max[k] + 1, hi);
    }
    uint8_t a[4], z[4];
    const int n = utf8_encode(lo, a);
    if (n > 1) {
        for (int i = 1; i < n; i++) {
            const uint32_t m = (1u << (6 * i)) - 1; /* the bits of the last i bytes */
            if ((lo & ~m) != (hi & ~m)) {
                if ((lo & m) != 0)
                    return nfa_utf8_range(b, s, e, lo, lo | m) &&
                           nfa_utf8_range(b, s, e, (lo | m) + 1, hi);
                if ((hi & m) != m)
                    return nfa_utf8_range(b, s, e, lo, (hi & ~m) - 1) &&
                           nfa_utf8_range(b, s, e, hi & ~m, hi);
            }
        }
    }
    utf8_encode(hi, z);
    return nfa_chain(b, s, e, a, z, n);
}

static bool nfa_repeat(nfa *b, const node *nd, frag *out);

/* Thompson's construction of the subtree at idx into *out. A subtree's states and edges are made
 * in one contiguous run and only its own edges touch its states, so a repetition builds its body
 * once and makes the other copies by copying that run with the state numbers shifted: the whole
 * expansion is known, and checked against the limits, before any copy is allocated. */
static bool nfa_build(nfa *b, int32_t idx, frag *out) {
    const parser *p = b->p;
    const node *nd = &p->nodes[idx];
    b->at = nd->at;
    switch (nd->type) {
        case NODE_EMPTY: {
            int32_t s = nfa_state(b);
            if (s < 0) return false;
            *out = (frag){s, s};
            return true;
        }
        case NODE_SET: {
            int32_t s = nfa_state(b), e = nfa_state(b);
            if (s < 0 || e < 0) return false;
            const cpset *set = &p->sets[nd->set];
            for (uint32_t i = 0; i < set->n; i++)
                if (!nfa_utf8_range(b, s, e, set->r[i].lo, set->r[i].hi)) return false;
            *out = (frag){s, e};
            return true;
        }
        case NODE_CAT: {
            int32_t s = nfa_state(b);
            if (s < 0) return false;
            int32_t cur = s;
            for (int32_t c = nd->first_child; c >= 0; c = p->nodes[c].next_sibling) {
                frag f;
                if (!nfa_build(b, c, &f) || !nfa_eps(b, cur, f.start)) return false;
                cur = f.end;
            }
            *out = (frag){s, cur};
            return true;
        }
        case NODE_ALT: {
            int32_t s = nfa_state(b), e = nfa_state(b);
            if (s < 0 || e < 0) return false;
            for (int32_t c = nd->first_child; c >= 0; c = p->nodes[c].next_sibling) {
                frag f;
                if (!nfa_build(b, c, &f) || !nfa_eps(b, s, f.start) || !nfa_eps(b, f.end, e))
                    return false;
            }
            *out = (frag){s, e};
            return true;
        }
        case NODE_REPEAT:
            return nfa_repeat(b, nd, out);
    }
    return false;
}

/* X{min,max}: min copies of X in a row, then max-min optional ones (each may be skipped to the
 * end); X{min,}: min copies, then a loop through one more. */
static bool nfa_repeat(nfa *b, const node *nd, frag *out) {
    const bool loop = nd->max < 0;
    const uint32_t copies = (uint32_t)(loop ? nd->min + 1 : nd->max);
    if (copies == 0) { /* X{0}: the empty string; X is never built */
        int32_t s = nfa_state(b);
        if (s < 0) return false;
        *out = (frag){s, s};
        return true;
    }
    const uint32_t s0 = b->n_states, e0 = b->n_edges;
    frag f;
    if (!nfa_build(b, nd->first_child, &f)) return false;
    b->at = nd->at;
    const uint32_t ns = b->n_states - s0, ne = b->n_edges - e0;
    /* the states and edges of every copy, and the repetition's own: 2 states, and one epsilon edge
     * per required copy plus three for the loop, or two per optional copy plus one */
    const uint64_t opt = loop ? 0 : copies - (uint32_t)nd->min;
    const uint64_t own_edges = (uint64_t)nd->min + (loop ? 3 : 2 * opt + 1);
    const uint64_t states = (uint64_t)b->n_states + (uint64_t)(copies - 1) * ns + 2;
    const uint64_t edges = (uint64_t)b->n_edges + (uint64_t)(copies - 1) * ne + own_edges;
    if (states > REGEX_MAX_NFA_STATES || edges > REGEX_MAX_NFA_EDGES)
        return rx_fail(b->cx, CORRAL_RESOURCE_EXHAUSTED,
                       "the pattern is too large: the repetition %.*s at offset %u expands to "
                       "%llu automaton %s (limit %s; use smaller {m,n} counts)",
                       (int)nd->len, b->p->pat + nd->at, (unsigned)nd->at,
                       (unsigned long long)(states > REGEX_MAX_NFA_STATES ? states : edges),
                       states > REGEX_MAX_NFA_STATES ? "states" : "edges",
                       states > REGEX_MAX_NFA_STATES ? "REGEX_MAX_NFA_STATES"
                                                     : "REGEX_MAX_NFA_EDGES");
    if (!rx_work(b->cx, (uint64_t)(copies - 1) * ne + (copies - 1) * ns) ||
        !grow(b->cx, (void **)&b->e, &b->cap_edges, edges, sizeof *b->e))
        return false;
    for (uint32_t k = 1; k < copies; k++) {
        const uint32_t shift = k * ns;
        for (uint32_t i = 0; i < ne; i++) {
            nfa_edge e = b->e[e0 + i];
            e.from += shift;
            e.to += shift;
            b->e[b->n_edges++] = e;
        }
    }
    b->n_states += (copies - 1) * ns;
    /* copy k is f shifted by k * ns */
    const int32_t s = nfa_state(b), end = nfa_state(b);
    if (s < 0 || end < 0) return false;
    int32_t cur = s;
    uint32_t k = 0;
    for (; k < (uint32_t)nd->min; k++) {
        if (!nfa_eps(b, cur, f.start + (int32_t)(k * ns))) return false;
        cur = f.end + (int32_t)(k * ns);
    }
    if (loop) { /* `end` is the loop state: in through it, and back to it after one more copy */
        const int32_t shift = (int32_t)(k * ns);
        if (!nfa_eps(b, cur, end) || !nfa_eps(b, end, f.start + shift) ||
            !nfa_eps(b, f.end + shift, end))
            return false;
        *out = (frag){s, end};
        return true;
    }
    for (; k < copies; k++) {
        if (!nfa_eps(b, cur, end) || !nfa_eps(b, cur, f.start + (int32_t)(k * ns))) return false;
        cur = f.end + (int32_t)(k * ns);
    }
    if (!nfa_eps(b, cur, end)) return false;
    *out = (frag){s, end};
    return true;
}

/* ---- stage 3: subset construction -------------------------------------------------------------
 */

typedef struct byte_edge {
    uint8_t lo, hi;
    uint32_t to;
} byte_edge;

/* The NFA in compressed rows, and the working state of the subset construction.
 *
 * A base set (REGEX_SEARCH): the closure B of the search prefix's loop state is part of every DFA
 * state (its any-byte edge leads back into it from anywhere), so it is left implicit: a DFA state
 * is stored as its NFA states outside B, the closures never enter B (its states carry the stamp
 * BASE, "always visited"), and the targets of B's own byte edges are gathered once per class
 * (base_off, base_to) and added to every transition. A transition on which a state adds nothing
 * of its own is then the same for all states (base_next). Without this, every DFA state of a
 * search would carry, and every transition recompute, the closure of the whole pattern's start:
 * a list of alternatives would cost (states x classes x alternatives). */
#define BASE 0xFFFFFFFFu

/* Steps charged for a closure apart from the states it visits: the stamp, the sort's set-up, the
 * hash lookup. */
#define CLOSURE_STEPS 8

typedef struct subset {
    rx_ctx *cx;
    uint32_t n_nfa, accept;
    uint32_t *eps_off, *eps_to; /* [n_nfa + 1], [epsilon edges] */
    uint32_t *byte_off;         /* [n_nfa + 1] */
    byte_edge *byte_e;
    uint8_t class_of[256];
    uint32_t n_classes;
    uint32_t radix_passes; /* 6-bit digits of the largest NFA state number */

    /* the base set, if any */
    bool has_base, base_accepts;
    uint32_t *base_off; /* [n_classes + 1] */
    uint32_t *base_to;  /* targets of the base's byte edges, by class */
    int32_t *base_next; /* [n_classes]: the DFA state of the base's targets alone, -2 not yet */

    /* DFA states: their sets of important NFA states (see closure), sorted, back to back. */
    uint32_t *pool;
    uint32_t pool_n, pool_cap;
    uint32_t *set_off; /* [n_d + 1] */
    uint32_t set_off_cap;
    uint32_t *hash; /* [n_d]: of each set */
    uint32_t hash_cap;
    uint32_t n_d;
    int32_t *next; /* [n_d][n_classes] */
    uint32_t next_cap;
    uint8_t *acc;
    uint32_t acc_cap;
    int32_t *slots; /* open-addressing hash of sets -> DFA state */
    uint32_t n_slots;

    /* scratch */
    uint32_t *stamp, stamp_now;   /* stamp_now marks the current closure; BASE marks the base */
    uint32_t *stack, *list, *tmp; /* [n_nfa] each */
    uint32_t *pair_class, *pair_to;
    uint32_t pair_cap;
    uint32_t *bucket_off; /* [n_classes + 1] */
    uint32_t *bucket;
    uint32_t bucket_cap;
} subset;

static uint32_t hash_set(const uint32_t *s, uint32_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint32_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ull;
    }
    return (uint32_t)(h ^ (h >> 32));
}

/* Sort sb->list[0..n) (NFA state numbers): insertion for a few, else least-significant-digit
 * radix over 6-bit digits, so that the cost is linear in n (a closure can hold most of the NFA).
 * Returns the steps it takes, for the caller to pay before calling it with sort = true. */
static uint64_t sort_states(subset *sb, uint32_t n, bool sort) {
    if (n <= 16) {
        if (!sort) return n + n * n / 4;
        uint32_t *a = sb->list;
        for (uint32_t i = 1; i < n; i++) {
            const uint32_t v = a[i];
            uint32_t j = i;
            for (; j > 0 && a[j - 1] > v; j--) a[j] = a[j - 1];
            a[j] = v;
        }
        return 0;
    }
    if (!sort) return (uint64_t)sb->radix_passes * (n + 64);
    for (uint32_t pass = 0; pass < sb->radix_passes; pass++) {
        const uint32_t shift = 6 * pass;
        uint32_t count[65] = {0};
        for (uint32_t i = 0; i < n; i++) count[((sb->list[i] >> shift) & 63) + 1]++;
        for (uint32_t d = 0; d < 64; d++) count[d + 1] += count[d];
        for (uint32_t i = 0; i < n; i++)
            sb->tmp[count[(sb->list[i] >> shift) & 63]++] = sb->list[i];
        uint32_t *t = sb->list;
        sb->list = sb->tmp;
        sb->tmp = t;
    }
    return 0;
}

/* A new stamp for a closure; the base keeps BASE across the reset when the counter wraps. */
static void new_stamp(subset *sb) {
    if (++sb->stamp_now == BASE) {
        for (uint32_t i = 0; i < sb->n_nfa; i++)
            if (sb->stamp[i] != BASE) sb->stamp[i] = 0;
        sb->stamp_now = 1;
    }
}

/* The epsilon closure of seeds a[0..na) and b[0..nb) outside the base, kept to its important
 * states: those with a byte edge, and the accepting one. Two closures with the same important
 * states have the same transitions and the same acceptance, so they are the same DFA state, and
 * the rest (states with only epsilon edges out) need not be stored. Into sb->list, sorted; returns
 * their number, or -1 when the work budget runs out (a step per state and per epsilon edge
 * visited, and per state sorted). */
static int64_t closure(subset *sb, const uint32_t *a, uint32_t na, const uint32_t *b, uint32_t nb) {
    rx_ctx *cx = sb->cx;
    const uint64_t allow = REGEX_MAX_COMPILE_WORK - cx->work;
    uint64_t steps = CLOSURE_STEPS + na + nb;
    new_stamp(sb);
    const uint32_t now = sb->stamp_now;
    uint32_t top = 0, count = 0;
    for (uint32_t i = 0; i < na + nb; i++) {
        const uint32_t s = i < na ? a[i] : b[i - na];
        if (sb->stamp[s] >= now) continue; /* this closure's, or the base's */
        sb->stamp[s] = now;
        sb->stack[top++] = s;
    }
    while (top) {
        const uint32_t s = sb->stack[--top];
        steps += 1 + sb->eps_off[s + 1] - sb->eps_off[s];
        if (steps > allow) return rx_work(cx, steps), -1;
        if (sb->byte_off[s + 1] > sb->byte_off[s] || s == sb->accept) sb->list[count++] = s;
        for (uint32_t j = sb->eps_off[s]; j < sb->eps_off[s + 1]; j++) {
            const uint32_t t = sb->eps_to[j];
            if (sb->stamp[t] >= now) continue;
            sb->stamp[t] = now;
            sb->stack[top++] = t;
        }
    }
    if (!rx_work(cx, steps + sort_states(sb, count, false))) return -1;
    sort_states(sb, count, true);
    return count;
}

static bool rehash(subset *sb) {
    const uint32_t n = sb->n_slots ? sb->n_slots * 2 : 1024;
    int32_t *slots = rx_alloc(sb->cx, n, sizeof *slots);
    if (!slots || !rx_work(sb->cx, n)) {
        rx_free(sb->cx, slots);
        return false;
    }
    for (uint32_t i = 0; i < n; i++) slots[i] = -1;
    for (uint32_t d = 0; d < sb->n_d; d++) {
        uint32_t h = sb->hash[d] & (n - 1);
        while (slots[h] >= 0) h = (h + 1) & (n - 1);
        slots[h] = (int32_t)d;
    }
    rx_free(sb->cx, sb->slots);
    sb->slots = slots;
    sb->n_slots = n;
    return true;
}

/* The DFA state for the set in sb->list[0..n), added if new; -1 on an error (the DFA state
 * limit, the budget). */
static int32_t find_or_add(subset *sb, uint32_t n) {
    rx_ctx *cx = sb->cx;
    const uint32_t k = sb->n_classes;
    if ((uint64_t)(sb->n_d + 1) * 2 > sb->n_slots && !rehash(sb)) return -1;
    if (!rx_work(cx, n)) return -1;
    const uint32_t hv = hash_set(sb->list, n), mask = sb->n_slots - 1;
    uint32_t h = hv & mask;
    for (; sb->slots[h] >= 0; h = (h + 1) & mask) {
        const uint32_t d = (uint32_t)sb->slots[h];
        const uint32_t len = sb->set_off[d + 1] - sb->set_off[d];
        if (!rx_work(cx, 1 + (sb->hash[d] == hv && len == n ? n : 0))) return -1;
        if (sb->hash[d] == hv && len == n &&
            (n == 0 || memcmp(sb->pool + sb->set_off[d], sb->list, n * sizeof *sb->list) == 0))
            return (int32_t)d;
    }
    if (sb->n_d >= REGEX_MAX_DFA_STATES) {
        rx_fail(cx, CORRAL_RESOURCE_EXHAUSTED,
                "the pattern is too complex: its automaton needs more than %d states (limit "
                "REGEX_MAX_DFA_STATES)",
                REGEX_MAX_DFA_STATES);
        return -1;
    }
    const uint32_t d = sb->n_d;
    if (!rx_work(cx, k) ||
        !grow(cx, (void **)&sb->pool, &sb->pool_cap, (uint64_t)sb->pool_n + n, sizeof *sb->pool) ||
        !grow(cx, (void **)&sb->set_off, &sb->set_off_cap, (uint64_t)d + 2, sizeof *sb->set_off) ||
        !grow(cx, (void **)&sb->hash, &sb->hash_cap, (uint64_t)d + 1, sizeof *sb->hash) ||
        !grow(cx, (void **)&sb->next, &sb->next_cap, ((uint64_t)d + 1) * k, sizeof *sb->next) ||
        !grow(cx, (void **)&sb->acc, &sb->acc_cap, (uint64_t)d + 1, sizeof *sb->acc))
        return -1;
    if (n) memcpy(sb->pool + sb->pool_n, sb->list, n * sizeof *sb->list); /* pool may be NULL */
    sb->set_off[d] = sb->pool_n;
    sb->pool_n += n;
    sb->set_off[d + 1] = sb->pool_n;
    sb->hash[d] = hv;
    bool acc = sb->base_accepts; /* or is the accepting NFA state in the (sorted) set? */
    for (uint32_t lo = 0, hi = n; lo < hi && !acc;) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (sb->list[mid] == sb->accept)
            acc = true;
        else if (sb->list[mid] < sb->accept)
            lo = mid + 1;
        else
            hi = mid;
    }
    sb->acc[d] = acc;
    for (uint32_t c = 0; c < k; c++) sb->next[(size_t)d * k + c] = -1;
    sb->slots[h] = (int32_t)d;
    sb->n_d++;
    return (int32_t)d;
}

/* Free the NFA's rows and the construction's scratch; the table (next, acc) stays. */
static void subset_free_scratch(subset *sb) {
    rx_ctx *cx = sb->cx;
    void *blocks[] = {sb->eps_off,    sb->eps_to,    sb->byte_off,   sb->byte_e,  sb->base_off,
                      sb->base_to,    sb->base_next, sb->pool,       sb->set_off, sb->hash,
                      sb->slots,      sb->stamp,     sb->stack,      sb->list,    sb->tmp,
                      sb->pair_class, sb->pair_to,   sb->bucket_off, sb->bucket};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) rx_free(cx, blocks[i]);
    sb->eps_off = sb->eps_to = sb->byte_off = sb->base_off = sb->base_to = NULL;
    sb->pool = sb->set_off = sb->hash = sb->stamp = sb->stack = sb->list = sb->tmp = NULL;
    sb->pair_class = sb->pair_to = sb->bucket_off = sb->bucket = NULL;
    sb->byte_e = NULL;
    sb->base_next = sb->slots = NULL;
}

static void subset_free(subset *sb) {
    subset_free_scratch(sb);
    rx_free(sb->cx, sb->next);
    rx_free(sb->cx, sb->acc);
    sb->next = NULL;
    sb->acc = NULL;
}

/* Where an edge into each NFA state may as well lead: a state whose only edge out is one epsilon
 * edge (Thompson's construction makes many: a concatenation's joins, a group's entry) is passed
 * through to the first state along that chain that is not one, so the closures never visit
 * them; they have no byte edges and do not accept, so no DFA state changes. A cycle of them
 * (an empty loop body) is represented by one of its states. Into rep[0..n) (then rep[s] == s for
 * the states kept). */
static bool pass_through(subset *sb, const nfa *b, uint32_t *rep) {
    rx_ctx *cx = sb->cx;
    const uint32_t n = b->n_states, unset = UINT32_MAX, on_path = UINT32_MAX - 1;
    uint32_t *only = rx_alloc(cx, n, sizeof *only); /* the epsilon target, or unset */
    if (!only || !rx_work(cx, 2 * (uint64_t)n + b->n_edges)) {
        rx_free(cx, only);
        return false;
    }
    for (uint32_t i = 0; i < n; i++) only[i] = unset, rep[i] = unset;
    for (uint32_t i = 0; i < b->n_edges; i++) {
        const nfa_edge *e = &b->e[i];
        if (e->eps && sb->eps_off[e->from + 1] == 1 && sb->byte_off[e->from + 1] == 0 &&
            e->from != sb->accept)
            only[e->from] = e->to;
    }
    for (uint32_t s = 0; s < n; s++) {
        uint32_t top = 0, t = s;
        while (only[t] != unset && rep[t] == unset) {
            rep[t] = on_path;
            sb->stack[top++] = t;
            t = only[t];
        }
        uint32_t r = rep[t];
        if (r == on_path) { /* a cycle closed at t */
            r = t;
        } else if (r == unset) { /* a state kept */
            r = rep[t] = t;
        }
        while (top) rep[sb->stack[--top]] = r;
    }
    rx_free(cx, only);
    return true;
}

/* Compressed rows of the NFA, edges led past the pass-through states, and the byte classes.
 * *start is mapped likewise. */
static bool subset_init(subset *sb, const nfa *b, uint32_t accept, uint32_t *start) {
    rx_ctx *cx = sb->cx;
    const uint32_t n = b->n_states;
    sb->n_nfa = n;
    sb->accept = accept;
    sb->radix_passes = 1;
    while (sb->radix_passes < 6 && (n - 1) >> (6 * sb->radix_passes)) sb->radix_passes++;
    if (!rx_work(cx, (uint64_t)n + b->n_edges)) return false;
    sb->eps_off = rx_zalloc(cx, n + 1, sizeof *sb->eps_off);
    sb->byte_off = rx_zalloc(cx, n + 1, sizeof *sb->byte_off);
    sb->stamp = rx_zalloc(cx, n, sizeof *sb->stamp);
    sb->stack = rx_alloc(cx, n, sizeof *sb->stack);
    sb->list = rx_alloc(cx, n, sizeof *sb->list);
    sb->tmp = rx_alloc(cx, n, sizeof *sb->tmp);
    if (!sb->eps_off || !sb->byte_off || !sb->stamp || !sb->stack || !sb->list || !sb->tmp)
        return false;
    bool brk[257] = {false};
    for (uint32_t i = 0; i < b->n_edges; i++) {
        const nfa_edge *e = &b->e[i];
        if (e->eps) {
            sb->eps_off[e->from + 1]++;
        } else {
            sb->byte_off[e->from + 1]++;
            brk[e->lo] = brk[e->hi + 1] = true;
        }
    }
    uint32_t *rep = sb->tmp; /* free until the closures start */
    if (!pass_through(sb, b, rep)) return false;
    *start = rep[*start];
    for (uint32_t s = 0; s < n; s++) {
        sb->eps_off[s + 1] += sb->eps_off[s];
        sb->byte_off[s + 1] += sb->byte_off[s];
    }
    sb->eps_to = rx_alloc(cx, (uint64_t)sb->eps_off[n] + 1, sizeof *sb->eps_to);
    sb->byte_e = rx_alloc(cx, (uint64_t)sb->byte_off[n] + 1, sizeof *sb->byte_e);
    uint32_t *fill_e = rx_zalloc(cx, n, sizeof *fill_e), *fill_b = rx_zalloc(cx, n, sizeof *fill_b);
    const bool ok = sb->eps_to && sb->byte_e && fill_e && fill_b;
    for (uint32_t i = 0; ok && i < b->n_edges; i++) {
        const nfa_edge *e = &b->e[i];
        if (e->eps) {
            sb->eps_to[sb->eps_off[e->from] + fill_e[e->from]++] = rep[e->to];
        } else {
            sb->byte_e[sb->byte_off[e->from] + fill_b[e->from]++] =
                (byte_edge){.lo = e->lo, .hi = e->hi, .to = rep[e->to]};
        }
    }
    rx_free(cx, fill_e);
    rx_free(cx, fill_b);
    if (!ok) return false;
    uint32_t cls = 0;
    for (int v = 0; v < 256; v++) {
        if (v > 0 && brk[v]) cls++;
        sb->class_of[v] = (uint8_t)cls;
    }
    sb->n_classes = cls + 1;
    sb->bucket_off = rx_alloc(cx, sb->n_classes + 1, sizeof *sb->bucket_off);
    return sb->bucket_off != NULL;
}

/* The (class, target) pairs of the byte edges of the NFA states set[0..n), bucketed by class
 * (a counting sort) into sb->bucket, class c's run ending at sb->bucket_off[c]. */
static bool gather_targets(subset *sb, const uint32_t *set, uint32_t n) {
    rx_ctx *cx = sb->cx;
    const uint32_t k = sb->n_classes;
    const uint64_t allow = REGEX_MAX_COMPILE_WORK - cx->work;
    uint64_t steps = k;
    uint32_t n_pairs = 0;
    memset(sb->bucket_off, 0, (k + 1) * sizeof *sb->bucket_off);
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t s = set[i];
        for (uint32_t j = sb->byte_off[s]; j < sb->byte_off[s + 1]; j++) {
            const byte_edge *e = &sb->byte_e[j];
            const uint32_t c0 = sb->class_of[e->lo], c1 = sb->class_of[e->hi];
            steps += 1 + c1 - c0;
            if (steps > allow) return rx_work(cx, steps);
            const uint64_t need = (uint64_t)n_pairs + (c1 - c0) + 1;
            if (need > sb->pair_cap) {
                uint32_t cap = sb->pair_cap, cap2 = cap;
                if (!grow(cx, (void **)&sb->pair_class, &cap, need, sizeof *sb->pair_class) ||
                    !grow(cx, (void **)&sb->pair_to, &cap2, need, sizeof *sb->pair_to))
                    return false;
                sb->pair_cap = cap;
            }
            for (uint32_t c = c0; c <= c1; c++) {
                sb->pair_class[n_pairs] = c;
                sb->pair_to[n_pairs++] = e->to;
                sb->bucket_off[c + 1]++;
            }
        }
    }
    if (!rx_work(cx, steps + n_pairs) ||
        !grow(cx, (void **)&sb->bucket, &sb->bucket_cap, (uint64_t)n_pairs + 1, sizeof *sb->bucket))
        return false;
    for (uint32_t c = 0; c < k; c++) sb->bucket_off[c + 1] += sb->bucket_off[c];
    /* bucket_off[c] walks up to the old bucket_off[c + 1] */
    for (uint32_t i = 0; i < n_pairs; i++)
        sb->bucket[sb->bucket_off[sb->pair_class[i]]++] = sb->pair_to[i];
    return true;
}

/* Make the closure of NFA state `base` the base set (see above): stamp it, note whether it
 * accepts, and keep the targets of its byte edges by class. */
static bool subset_set_base(subset *sb, uint32_t base) {
    rx_ctx *cx = sb->cx;
    const uint32_t k = sb->n_classes;
    uint32_t top = 0, count = 0;
    uint64_t steps = 0;
    sb->stamp[base] = BASE;
    sb->stack[top++] = base;
    while (top) {
        const uint32_t s = sb->stack[--top];
        steps += 1 + sb->eps_off[s + 1] - sb->eps_off[s];
        if (sb->byte_off[s + 1] > sb->byte_off[s]) sb->list[count++] = s;
        if (s == sb->accept) sb->base_accepts = true;
        for (uint32_t j = sb->eps_off[s]; j < sb->eps_off[s + 1]; j++) {
            const uint32_t t = sb->eps_to[j];
            if (sb->stamp[t] == BASE) continue;
            sb->stamp[t] = BASE;
            sb->stack[top++] = t;
        }
    }
    if (!rx_work(cx, steps) || !gather_targets(sb, sb->list, count)) return false;
    const uint32_t n = sb->bucket_off[k - 1];
    sb->base_off = rx_alloc(cx, (uint64_t)k + 1, sizeof *sb->base_off);
    sb->base_to = rx_alloc(cx, (uint64_t)n + 1, sizeof *sb->base_to);
    sb->base_next = rx_alloc(cx, k, sizeof *sb->base_next);
    if (!sb->base_off || !sb->base_to || !sb->base_next) return false;
    sb->base_off[0] = 0;
    for (uint32_t c = 0; c < k; c++) {
        sb->base_off[c + 1] = sb->bucket_off[c];
        sb->base_next[c] = -2;
    }
    memcpy(sb->base_to, sb->bucket, n * sizeof *sb->base_to);
    sb->has_base = true;
    return true;
}

/* Run the subset construction from NFA state `start`, or, with a base (base >= 0; then start is
 * base), from the base alone: each DFA state in turn, the targets of its set's byte edges by
 * class, and for each class the closure of those and the base's targets looked up or added.
 * Errors are in sb->cx. */
static bool subset_run(subset *sb, uint32_t start, int64_t base) {
    if (base >= 0 && !subset_set_base(sb, (uint32_t)base)) return false;
    int64_t n = base >= 0 ? closure(sb, NULL, 0, NULL, 0) : closure(sb, &start, 1, NULL, 0);
    if (n < 0 || find_or_add(sb, (uint32_t)n) < 0) return false;
    const uint32_t k = sb->n_classes;
    for (uint32_t d = 0; d < sb->n_d; d++) {
        if (!gather_targets(sb, sb->pool + sb->set_off[d], sb->set_off[d + 1] - sb->set_off[d]))
            return false;
        /* The byte edges of a wide class span many classes in one piece, so neighbouring classes
         * often have the same targets: then they have the same closure, found once. */
        uint32_t begin = 0, prev_begin = 0, prev_end = 0;
        int32_t prev = -1;
        for (uint32_t c = 0; c < k; c++) {
            const uint32_t end = sb->bucket_off[c];
            const uint32_t b0 = sb->has_base ? sb->base_off[c] : 0;
            const uint32_t nb = sb->has_base ? sb->base_off[c + 1] - b0 : 0;
            const uint32_t n_own = end - begin;
            int32_t t = -1;
            if (!n_own && nb && sb->base_next[c] != -2) { /* the base's targets alone */
                t = sb->base_next[c];
            } else if (n_own && !nb && prev >= 0 && n_own == prev_end - prev_begin &&
                       memcmp(sb->bucket + begin, sb->bucket + prev_begin,
                              n_own * sizeof *sb->bucket) == 0) {
                if (!rx_work(sb->cx, n_own)) return false;
                t = prev;
            } else if (n_own || nb) {
                if (!rx_work(sb->cx, n_own)) return false; /* the comparison above */
                n = closure(sb, sb->bucket + begin, n_own, sb->has_base ? sb->base_to + b0 : NULL,
                            nb);
                t = n < 0 ? -1 : find_or_add(sb, (uint32_t)n);
                if (t < 0) return false;
                if (!n_own) sb->base_next[c] = t;
            }
            if (n_own && !nb) {
                prev = t;
                prev_begin = begin;
                prev_end = end;
            } else {
                prev = -1;
            }
            sb->next[(size_t)d * k + c] = t;
            begin = end;
        }
    }
    return true;
}

/* ---- stage 4: dead states, minimisation, renumbering -------------------------------------------
 *
 * Hopcroft's algorithm, in the form for a partial transition function (Valmari and Lehtinen): the
 * blocks of a partition of the live states, each a contiguous range of `elems`, refined until for
 * every block B and class c every block lies entirely inside or entirely outside pre_c(B), the
 * states with a c-transition into B. The partition starts as {accepting, not accepting}; both go
 * on the list of splitters, because a missing transition (to a dead state) is itself a difference
 * (with a complete DFA one of the two could be left out). Taking a splitter B, the transitions into
 * B are gathered from the reverse edges and bucketed by class; for each class, the states found are
 * marked (moved to the front of their block), and every block with some but not all of its states
 * marked splits in two. When a block splits and is still a pending splitter, both halves are; if
 * not, only the smaller half is needed (being stable against the whole and against one half gives
 * stability against the other), so a state takes part in at most log2(n) splitters and the whole
 * costs O(transitions x log(states)), where Moore's refinement took a round per state of the
 * longest chain (quadratic on a long literal).
 */

typedef struct refine {
    uint32_t *elems, *loc, *blk; /* [n]: states by block, position of a state, block of a state */
    uint32_t *first, *end;       /* [n]: a block's range of elems */
    uint32_t *marked;            /* [n]: marked states at the front of each block */
    uint32_t *touched, n_touched;
    uint32_t *pending, n_pending; /* splitters to take */
    uint8_t *is_pending;
    uint32_t n_blocks;
} refine;

static void refine_mark(refine *r, uint32_t s) {
    const uint32_t b = r->blk[s], i = r->loc[s], j = r->first[b] + r->marked[b];
    if (i < j) return; /* already marked */
    const uint32_t t = r->elems[j];
    r->elems[j] = s, r->loc[s] = j;
    r->elems[i] = t, r->loc[t] = i;
    if (r->marked[b]++ == 0) r->touched[r->n_touched++] = b;
}

/* Split every touched block at its marks (the marked part becomes a new block). */
static void refine_split(refine *r) {
    for (uint32_t i = 0; i < r->n_touched; i++) {
        const uint32_t b = r->touched[i], m = r->marked[b];
        r->marked[b] = 0;
        if (m == r->end[b] - r->first[b]) continue; /* all of it: no split */
        const uint32_t nb = r->n_blocks++;          /* the marked front becomes block nb */
        r->first[nb] = r->first[b];
        r->end[nb] = r->first[b] + m;
        r->first[b] += m;
        r->marked[nb] = 0;
        for (uint32_t j = r->first[nb]; j < r->end[nb]; j++) r->blk[r->elems[j]] = nb;
        const uint32_t add =
            r->is_pending[b] || m < r->end[b] - r->first[b] ? nb : b; /* the smaller half */
        r->is_pending[add] = 1; /* nb is new; b is pending already only when add is nb */
        r->pending[r->n_pending++] = add;
    }
    r->n_touched = 0;
}

/* From the raw DFA (n states, k classes, next, acc) build the minimal one into *out. */
static bool dfa_finish(rx_ctx *cx, uint32_t n, uint32_t k, const int32_t *next, const uint8_t *acc,
                       const uint8_t class_of[256], regex_dfa *out) {
    const uint64_t cells = (uint64_t)n * k;
    bool ok = false;
    refine r = {0};
    uint8_t *live = rx_zalloc(cx, n, 1);
    uint32_t *queue = rx_alloc(cx, n, sizeof *queue);
    uint32_t *rev_off = rx_zalloc(cx, (uint64_t)n + 1, sizeof *rev_off);
    uint32_t *rev = NULL, *gather = NULL, *count = NULL;
    int32_t *mnext = NULL, *renum = NULL, *bfs = NULL, *colmap = NULL, *first_of = NULL;
    int32_t *block = NULL;
    uint32_t *col_hash = NULL;
    uint8_t *macc = NULL;
    if (!live || !queue || !rev_off || !rx_work(cx, 2 * cells)) goto done;

    /* The transitions backwards, each as its cell s * k + c, grouped by target. */
    uint32_t m = 0;
    for (uint64_t i = 0; i < cells; i++)
        if (next[i] >= 0) rev_off[next[i] + 1]++, m++;
    for (uint32_t s = 0; s < n; s++) rev_off[s + 1] += rev_off[s];
    rev = rx_alloc(cx, (uint64_t)m + 1, sizeof *rev);
    if (!rev) goto done;
    for (uint64_t i = 0; i < cells; i++)
        if (next[i] >= 0) rev[rev_off[next[i]]++] = (uint32_t)i;
    for (uint32_t s = n; s > 0; s--) rev_off[s] = rev_off[s - 1]; /* the fill moved each start */
    rev_off[0] = 0;

    /* States that can reach an accepting state, by a backwards search. */
    uint32_t head = 0, tail = 0;
    for (uint32_t s = 0; s < n; s++)
        if (acc[s]) live[s] = 1, queue[tail++] = s;
    while (head < tail) {
        const uint32_t t = queue[head++];
        for (uint32_t j = rev_off[t]; j < rev_off[t + 1]; j++) {
            const uint32_t s = rev[j] / k;
            if (!live[s]) live[s] = 1, queue[tail++] = s;
        }
    }
    if (!live[0]) {
        rx_fail(cx, CORRAL_INVALID_ARGUMENT,
                "the pattern matches nothing (no string can match it)");
        goto done;
    }

    /* Hopcroft over the live states (the dead ones take no part: a transition to one is
     * "none"). */
    cx->stage = "the minimisation";
    r.elems = rx_alloc(cx, n, sizeof *r.elems);
    r.loc = rx_alloc(cx, n, sizeof *r.loc);
    r.blk = rx_alloc(cx, n, sizeof *r.blk);
    r.first = rx_alloc(cx, n, sizeof *r.first);
    r.end = rx_alloc(cx, n, sizeof *r.end);
    r.marked = rx_zalloc(cx, n, sizeof *r.marked);
    r.touched = rx_alloc(cx, n, sizeof *r.touched);
    r.pending = rx_alloc(cx, n, sizeof *r.pending);
    r.is_pending = rx_zalloc(cx, n, 1);
    gather = rx_alloc(cx, (uint64_t)m + 1, sizeof *gather);
    count = rx_alloc(cx, (uint64_t)k + 1, sizeof *count);
    if (!r.elems || !r.loc || !r.blk || !r.first || !r.end || !r.marked || !r.touched ||
        !r.pending || !r.is_pending || !gather || !count)
        goto done;
    uint32_t n_live = 0;
    for (int pass = 1; pass >= 0; pass--) { /* accepting states first, then the others */
        const uint32_t from = n_live;
        for (uint32_t s = 0; s < n; s++) {
            if (!live[s] || acc[s] != pass) continue;
            r.loc[s] = n_live;
            r.blk[s] = r.n_blocks;
            r.elems[n_live++] = s;
        }
        if (n_live > from) {
            r.first[r.n_blocks] = from;
            r.end[r.n_blocks] = n_live;
            r.is_pending[r.n_blocks] = 1;
            r.pending[r.n_pending++] = r.n_blocks++;
        }
    }
    while (r.n_pending) {
        const uint32_t b = r.pending[--r.n_pending];
        r.is_pending[b] = 0;
        /* paid for first: reading the transitions into b twice, then marking and splitting at
         * most one state per transition, and a pass over the classes */
        uint64_t in = 0;
        for (uint32_t i = r.first[b]; i < r.end[b]; i++)
            in += 1 + rev_off[r.elems[i] + 1] - rev_off[r.elems[i]];
        if (!rx_work(cx, 2 * (uint64_t)k + 4 * in)) goto done;
        /* the live transitions into b, bucketed by class (b's members are read before any
         * split of this round moves them) */
        memset(count, 0, (k + 1) * sizeof *count);
        for (uint32_t i = r.first[b]; i < r.end[b]; i++) {
            const uint32_t t = r.elems[i];
            for (uint32_t j = rev_off[t]; j < rev_off[t + 1]; j++)
                if (live[rev[j] / k]) count[rev[j] % k + 1]++;
        }
        for (uint32_t c = 0; c < k; c++) count[c + 1] += count[c];
        for (uint32_t i = r.first[b]; i < r.end[b]; i++) {
            const uint32_t t = r.elems[i];
            for (uint32_t j = rev_off[t]; j < rev_off[t + 1]; j++)
                if (live[rev[j] / k]) gather[count[rev[j] % k]++] = rev[j] / k;
        }
        /* count[c] is now the end of class c's run */
        uint32_t begin = 0;
        for (uint32_t c = 0; c < k; c++) {
            for (uint32_t i = begin; i < count[c]; i++) refine_mark(&r, gather[i]);
            begin = count[c];
            refine_split(&r);
        }
    }
    const uint32_t n_blocks = r.n_blocks;

    /* The minimal table, one row per block. */
    cx->stage = "the final table";
    block = rx_alloc(cx, n, sizeof *block);
    mnext = rx_alloc(cx, (uint64_t)n_blocks * k, sizeof *mnext);
    macc = rx_alloc(cx, n_blocks, 1);
    colmap = rx_alloc(cx, k, sizeof *colmap);
    first_of = rx_alloc(cx, k, sizeof *first_of); /* new column -> an old class */
    col_hash = rx_alloc(cx, k, sizeof *col_hash);
    renum = rx_alloc(cx, n_blocks, sizeof *renum);
    bfs = rx_alloc(cx, n_blocks, sizeof *bfs);
    if (!block || !mnext || !macc || !colmap || !first_of || !col_hash || !renum || !bfs ||
        !rx_work(cx, 4 * (uint64_t)n_blocks * k + (uint64_t)k * k + n))
        goto done;
    for (uint32_t s = 0; s < n; s++) block[s] = live[s] ? (int32_t)r.blk[s] : -1;
    for (uint32_t b = 0; b < n_blocks; b++) {
        const uint32_t s = r.elems[r.first[b]]; /* any member: they agree */
        macc[b] = acc[s];
        for (uint32_t c = 0; c < k; c++) {
            const int32_t t = next[(size_t)s * k + c];
            mnext[(size_t)b * k + c] = t >= 0 ? block[t] : REGEX_DEAD;
        }
    }

    /* Merge classes whose columns are equal. */
    uint32_t n_cols = 0;
    for (uint32_t c = 0; c < k; c++) {
        uint64_t h = 1469598103934665603ull;
        for (uint32_t b = 0; b < n_blocks; b++) {
            h ^= (uint32_t)mnext[(size_t)b * k + c];
            h *= 1099511628211ull;
        }
        col_hash[c] = (uint32_t)(h ^ (h >> 32));
    }
    for (uint32_t c = 0; c < k; c++) {
        int32_t found = -1;
        for (uint32_t j = 0; j < n_cols && found < 0; j++) {
            const uint32_t o = (uint32_t)first_of[j];
            if (col_hash[o] != col_hash[c]) continue;
            bool same = true;
            for (uint32_t b = 0; b < n_blocks && same; b++)
                same = mnext[(size_t)b * k + c] == mnext[(size_t)b * k + o];
            if (same) found = (int32_t)j;
        }
        if (found < 0) {
            first_of[n_cols] = (int32_t)c;
            found = (int32_t)n_cols++;
        }
        colmap[c] = found;
    }

    /* Breadth-first renumbering from the start's block. */
    for (uint32_t b = 0; b < n_blocks; b++) renum[b] = -1;
    head = tail = 0;
    renum[block[0]] = 0;
    bfs[tail++] = block[0];
    while (head < tail) {
        const int32_t b = bfs[head++];
        for (uint32_t c = 0; c < k; c++) {
            const int32_t t = mnext[(size_t)b * k + c];
            if (t >= 0 && renum[t] < 0) {
                renum[t] = (int32_t)tail;
                bfs[tail++] = t;
            }
        }
    }
    /* every block is reachable; tail == n_blocks. The result is allocated plainly (its owner
     * frees it with regex__free) but counted. */
    if (!rx_charge(cx, (uint64_t)tail * n_cols * sizeof *out->next + 2 * (uint64_t)tail)) goto done;
    out->n_states = tail;
    out->n_classes = n_cols;
    out->next = malloc((size_t)tail * n_cols * sizeof *out->next);
    out->accepting = malloc(tail);
    out->final = malloc(tail);
    if (!out->next || !out->accepting || !out->final) {
        rx_fail(cx, CORRAL_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    for (int v = 0; v < 256; v++) out->byte_class[v] = (uint8_t)colmap[class_of[v]];
    for (uint32_t i = 0; i < tail; i++) {
        const int32_t b = bfs[i];
        out->accepting[i] = macc[b];
        bool any = false;
        for (uint32_t j = 0; j < n_cols; j++) {
            const int32_t t = mnext[(size_t)b * k + first_of[j]];
            out->next[(size_t)i * n_cols + j] = t >= 0 ? renum[t] : REGEX_DEAD;
            any |= t >= 0;
        }
        out->final[i] = macc[b] && !any;
    }
    ok = true;
done:;
    void *blocks[] = {live,  queue,   rev_off, rev,      gather,    count,     r.elems,      r.loc,
                      r.blk, r.first, r.end,   r.marked, r.touched, r.pending, r.is_pending, block,
                      mnext, macc,    colmap,  first_of, col_hash,  renum,     bfs};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) rx_free(cx, blocks[i]);
    return ok;
}

/* ---- the whole ----------------------------------------------------------------------------------
 */

corral_status regex__compile(const char *pattern, size_t len, uint32_t flags, regex_dfa *out,
                             regex_stats *stats, corral_error *err) {
    if (stats) memset(stats, 0, sizeof *stats);
    if (!out) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "regex: no output");
    memset(out, 0, sizeof *out);
    if (!pattern && len) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "regex: no pattern");
    if (len > REGEX_MAX_PATTERN)
        return corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                                "regex: the pattern has %zu bytes; the limit is %d "
                                "(REGEX_MAX_PATTERN)",
                                len, REGEX_MAX_PATTERN);
    rx_ctx cx = {.stage = "the parse", .err = err};
    parser p = {.pat = pattern ? pattern : "", .len = len, .flags = flags, .cx = &cx};
    nfa b = {.p = &p, .cx = &cx};
    subset sb = {.cx = &cx};

    int32_t root = parse_alt(&p, 0);
    if (root >= 0 && p.pos < p.len)
        root = perr(&p, CORRAL_INVALID_ARGUMENT, p.pos, "unmatched ')'");
    frag f;
    bool ok = false;
    cx.stage = "the NFA's construction";
    if (root < 0 || !nfa_build(&b, root, &f)) goto done;
    int64_t base = -1;
    if (flags & REGEX_SEARCH) { /* a loop over any byte, then the pattern */
        const int32_t loop = nfa_state(&b), any = nfa_state(&b), back = nfa_state(&b);
        if (loop < 0 || any < 0 || back < 0 || !nfa_eps(&b, loop, any) ||
            !nfa_edge_add(&b, any, back, 0, 255, false) || !nfa_eps(&b, back, loop) ||
            !nfa_eps(&b, loop, f.start))
            goto done;
        f.start = base = loop;
    }
    /* the tree is no longer needed, and the NFA's edge list only until its rows are built */
    for (uint32_t i = 0; i < p.n_sets; i++) rx_free(&cx, p.sets[i].r);
    rx_free(&cx, p.sets);
    rx_free(&cx, p.nodes);
    p.sets = NULL, p.nodes = NULL, p.n_sets = 0;
    cx.stage = "the subset construction";
    uint32_t start = (uint32_t)f.start;
    const bool rows = subset_init(&sb, &b, (uint32_t)f.end, &start);
    rx_free(&cx, b.e);
    b.e = NULL;
    if (!rows || !subset_run(&sb, start, base)) goto done;
    subset_free_scratch(&sb);
    cx.stage = "the dead-state search";
    ok = dfa_finish(&cx, sb.n_d, sb.n_classes, sb.next, sb.acc, sb.class_of, out);
done:
    if (!ok && cx.status == CORRAL_OK) rx_fail(&cx, CORRAL_INTERNAL, "internal error");
    for (uint32_t i = 0; i < p.n_sets; i++) rx_free(&cx, p.sets[i].r);
    rx_free(&cx, p.sets);
    rx_free(&cx, p.nodes);
    rx_free(&cx, b.e);
    subset_free(&sb);
    if (!ok) regex__free(out);
    if (stats)
        *stats = (regex_stats){.nfa_states = b.n_states,
                               .nfa_edges = b.n_edges,
                               .dfa_states = sb.n_d,
                               .work = cx.work,
                               .peak_bytes = cx.peak_bytes};
    return cx.status;
}

void regex__free(regex_dfa *d) {
    if (!d) return;
    free(d->next);
    free(d->accepting);
    free(d->final);
    memset(d, 0, sizeof *d);
}

int32_t regex__run(const regex_dfa *d, int32_t from, const char *s, size_t n) {
    int32_t st = from;
    for (size_t i = 0; i < n && st != REGEX_DEAD; i++) st = regex__step(d, st, (uint8_t)s[i]);
    return st;
}

int regex__match(const regex_dfa *d, const char *s, size_t n) {
    const int32_t st = regex__run(d, 0, s, n);
    return st != REGEX_DEAD && d->accepting[st];
}
