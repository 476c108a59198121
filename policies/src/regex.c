/*
 * regex.c — ECMAScript-like patterns to minimal byte DFAs (see regex.h for the syntax).
 *
 * Four stages, each in its own section below:
 *   1. a recursive-descent parser builds a small tree (sets of code points, concatenation,
 *      alternation, repetition); every error names the construct and its byte offset;
 *   2. Thompson's construction turns the tree into an NFA over byte ranges: a set of code points
 *      becomes the byte sequences of its UTF-8 encodings (ranges are split where the encoded
 *      length or a continuation byte's range changes, so that each piece is a product of byte
 *      ranges); a repetition {m,n} is m copies followed by n-m optional ones;
 *   3. the subset construction over byte classes (bytes that no NFA edge tells apart share a
 *      column) gives a DFA; states that cannot reach an accepting state are dropped, so a missing
 *      transition always means "this can no longer match";
 *   4. Moore's partition refinement minimises it, equal columns are merged, and states are
 *      renumbered breadth-first from the start.
 * Nothing here is on a per-token path: compilation happens once per pattern.
 */
#include "regex.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral/utf8.h"

#define CP_MAX        0x10FFFFu
#define SURR_FIRST    0xD800u
#define SURR_LAST     0xDFFFu
#define MAX_NFA_EDGES (4u * REGEX_MAX_NFA_STATES)

/* Grow *p (elements of `elem` bytes, capacity *cap) to hold at least `need`. */
static bool grow(void **p, uint32_t *cap, uint64_t need, size_t elem) {
    if (need <= *cap) return true;
    uint64_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    if (n > UINT32_MAX / 2) return false;
    void *q = realloc(*p, (size_t)n * elem);
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

static bool cpset_add(cpset *s, uint32_t lo, uint32_t hi) {
    if (!grow((void **)&s->r, &s->cap, (uint64_t)s->n + 1, sizeof *s->r)) return false;
    s->r[s->n++] = (cp_range){lo, hi};
    return true;
}

static int range_cmp(const void *a, const void *b) {
    const cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sort and merge, and cut out the surrogates (UTF-8 cannot encode them). */
static bool cpset_normalize(cpset *s) {
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
            if (!grow((void **)&s->r, &s->cap, (uint64_t)s->n + 1, sizeof *s->r)) return false;
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
static bool cpset_negate(cpset *s) {
    cpset out = {0};
    uint32_t next = 0;
    bool ok = true;
    for (uint32_t i = 0; i < s->n && ok; i++) {
        if (s->r[i].lo > next) ok = cpset_add(&out, next, s->r[i].lo - 1);
        next = s->r[i].hi + 1;
    }
    if (ok && next <= CP_MAX) ok = cpset_add(&out, next, CP_MAX);
    ok = ok && cpset_normalize(&out);
    free(s->r);
    *s = out;
    return ok;
}

/* Add the other case of every ASCII letter in s. */
static bool cpset_fold_ascii(cpset *s) {
    const uint32_t n = s->n;
    for (uint32_t i = 0; i < n; i++) {
        const cp_range r = s->r[i];
        const uint32_t lo_u = r.lo > 'A' ? r.lo : 'A', hi_u = r.hi < 'Z' ? r.hi : 'Z';
        if (lo_u <= hi_u && !cpset_add(s, lo_u + 32, hi_u + 32)) return false;
        const uint32_t lo_l = r.lo > 'a' ? r.lo : 'a', hi_l = r.hi < 'z' ? r.hi : 'z';
        if (lo_l <= hi_l && !cpset_add(s, lo_l - 32, hi_l - 32)) return false;
    }
    return cpset_normalize(s);
}

/* ---- stage 1: the parser -----------------------------------------------------------------------
 */

typedef enum node_type {
    NODE_EMPTY = 0,
    NODE_SET = 1,      /* one code point of a set */
    NODE_CAT = 2,      /* children in sequence (none: the empty string) */
    NODE_ALT = 3,      /* one of the children */
    NODE_REPEAT = 4,   /* the only child, min..max times (max -1: unbounded) */
    NODE_ANY_BYTE = 5, /* any single byte (the REGEX_SEARCH prefix) */
} node_type;

typedef struct node {
    node_type type;
    int32_t first_child, last_child, next_sibling;
    int32_t min, max;
    int32_t set; /* NODE_SET: index into parser.sets */
} node;

typedef struct parser {
    const char *pat;
    size_t len, pos;
    uint32_t flags;
    node *nodes;
    uint32_t n_nodes, cap_nodes;
    cpset *sets;
    uint32_t n_sets, cap_sets;
    corral_error *err;
    corral_status status;
} parser;

/* Record the first error; returns -1 so that `return perr(...)` ends a parse function. */
__attribute__((format(printf, 4, 5))) static int32_t perr(parser *p, corral_status st, size_t at,
                                                          const char *fmt, ...) {
    if (p->status != CORRAL_OK) return -1;
    char msg[CORRAL_ERROR_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->status = corral_error_set(p->err, st, "regex: %s (at offset %zu)", msg, at);
    return -1;
}

static int32_t oom(parser *p) {
    if (p->status == CORRAL_OK)
        p->status = corral_error_set(p->err, CORRAL_OUT_OF_MEMORY, "regex: out of memory");
    return -1;
}

static int32_t new_node(parser *p, node_type type) {
    if (!grow((void **)&p->nodes, &p->cap_nodes, (uint64_t)p->n_nodes + 1, sizeof *p->nodes))
        return oom(p);
    p->nodes[p->n_nodes] =
        (node){.type = type, .first_child = -1, .last_child = -1, .next_sibling = -1, .set = -1};
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
    if (!grow((void **)&p->sets, &p->cap_sets, (uint64_t)p->n_sets + 1, sizeof *p->sets))
        return oom(p);
    p->sets[p->n_sets] = (cpset){0};
    return (int32_t)p->n_sets++;
}

/* A NODE_SET over set index `set`, case-folded when the flags ask. */
static int32_t set_node(parser *p, int32_t set) {
    if (!cpset_normalize(&p->sets[set])) return oom(p);
    if ((p->flags & REGEX_CASELESS) && !cpset_fold_ascii(&p->sets[set])) return oom(p);
    int32_t n = new_node(p, NODE_SET);
    if (n >= 0) p->nodes[n].set = set;
    return n;
}

static bool at(const parser *p, char c) {
    return p->pos < p->len && p->pat[p->pos] == c;
}

/* The character at pos, which must be well-formed UTF-8: 1 with *cp and pos past it, or -1. */
static int parse_char(parser *p, uint32_t *cp) {
    size_t n;
    if (utf8_decode((const uint8_t *)p->pat + p->pos, p->len - p->pos, cp, &n) != UTF8_OK)
        return perr(p, CORRAL_INVALID_ARGUMENT, p->pos, "invalid UTF-8 in the pattern");
    p->pos += n;
    return 1;
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
static bool add_class_escape(cpset *s, char c) {
    bool ok = true;
    switch (c) {
        case 'd':
        case 'D':
            ok = cpset_add(s, '0', '9');
            break;
        case 'w':
        case 'W':
            ok = cpset_add(s, '0', '9') && cpset_add(s, 'A', 'Z') && cpset_add(s, 'a', 'z') &&
                 cpset_add(s, '_', '_');
            break;
        case 's':
        case 'S': { /* ECMAScript's WhiteSpace and LineTerminator */
            static const cp_range space[] = {
                {0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                {0x3000, 0x3000}, {0xFEFF, 0xFEFF},
            };
            for (size_t i = 0; i < sizeof space / sizeof space[0] && ok; i++)
                ok = cpset_add(s, space[i].lo, space[i].hi);
            break;
        }
    }
    if (!ok) return false;
    if (c == 'D' || c == 'W' || c == 'S') return cpset_normalize(s) && cpset_negate(s);
    return cpset_normalize(s);
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
            if (!add_class_escape(&p->sets[*set], c)) return oom(p);
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
    return parse_char(p, cp);
}

/* A literal character at pos. */
static int32_t parse_literal(parser *p) {
    uint32_t cp;
    if (parse_char(p, &cp) < 0) return -1;
    int32_t set = new_set(p);
    if (set < 0) return -1;
    if (!cpset_add(&p->sets[set], cp, cp)) return oom(p);
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
    return parse_char(p, cp);
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
                if (!cpset_add(&p->sets[set], e->r[i].lo, e->r[i].hi)) return oom(p);
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
        if (!cpset_add(&p->sets[set], lo, hi)) return oom(p);
    }
    cpset *s = &p->sets[set];
    if (!cpset_normalize(s)) return oom(p);
    if ((p->flags & REGEX_CASELESS) && !cpset_fold_ascii(s)) return oom(p);
    if (negate && !cpset_negate(s)) return oom(p);
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
                            "repetition count above the limit of %d", REGEX_MAX_REPEAT);
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
        return perr(p, CORRAL_RESOURCE_EXHAUSTED, open, "groups nested deeper than %d",
                    REGEX_MAX_DEPTH);
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
            if (!cpset_add(s, '\n', '\n') || !cpset_add(s, '\r', '\r') ||
                !cpset_add(s, 0x2028, 0x2029) || !cpset_normalize(s) || !cpset_negate(s))
                return oom(p);
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
                if (!cpset_add(&p->sets[set], cp, cp)) return oom(p);
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
        if (p->status != CORRAL_OK) return -1;
        p->pos = save;
    }
    int32_t rep = new_node(p, NODE_REPEAT);
    if (rep < 0) return -1;
    p->nodes[rep].min = min;
    p->nodes[rep].max = max;
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
    corral_error *err;
    corral_status status;
} nfa;

typedef struct frag {
    int32_t start, end;
} frag;

static int32_t nfa_fail(nfa *b, corral_status st, const char *msg) {
    if (b->status == CORRAL_OK) b->status = corral_error_set(b->err, st, "regex: %s", msg);
    return -1;
}

static int32_t nfa_state(nfa *b) {
    if (b->n_states >= REGEX_MAX_NFA_STATES)
        return nfa_fail(b, CORRAL_RESOURCE_EXHAUSTED,
                        "the pattern is too large: more than 200000 automaton states once "
                        "repetitions are expanded (use smaller {m,n} counts)");
    return (int32_t)b->n_states++;
}

static bool nfa_edge_add(nfa *b, int32_t from, int32_t to, uint8_t lo, uint8_t hi, bool eps) {
    if (b->n_edges >= MAX_NFA_EDGES) {
        nfa_fail(b, CORRAL_RESOURCE_EXHAUSTED, "the pattern is too large (automaton edges)");
        return false;
    }
    if (!grow((void **)&b->e, &b->cap_edges, (uint64_t)b->n_edges + 1, sizeof *b->e)) {
        nfa_fail(b, CORRAL_OUT_OF_MEMORY, "out of memory");
        return false;
    }
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
    const int n = (int)utf8_encode(lo, a); /* lo and hi are scalar values: never 0 */
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

static bool nfa_build(nfa *b, const parser *p, int32_t idx, frag *out) {
    const node *nd = &p->nodes[idx];
    switch (nd->type) {
        case NODE_EMPTY: {
            int32_t s = nfa_state(b);
            if (s < 0) return false;
            *out = (frag){s, s};
            return true;
        }
        case NODE_ANY_BYTE:
        case NODE_SET: {
            int32_t s = nfa_state(b), e = nfa_state(b);
            if (s < 0 || e < 0) return false;
            if (nd->type == NODE_ANY_BYTE) {
                if (!nfa_edge_add(b, s, e, 0, 255, false)) return false;
            } else {
                const cpset *set = &p->sets[nd->set];
                for (uint32_t i = 0; i < set->n; i++)
                    if (!nfa_utf8_range(b, s, e, set->r[i].lo, set->r[i].hi)) return false;
            }
            *out = (frag){s, e};
            return true;
        }
        case NODE_CAT: {
            int32_t s = nfa_state(b);
            if (s < 0) return false;
            int32_t cur = s;
            for (int32_t c = nd->first_child; c >= 0; c = p->nodes[c].next_sibling) {
                frag f;
                if (!nfa_build(b, p, c, &f) || !nfa_eps(b, cur, f.start)) return false;
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
                if (!nfa_build(b, p, c, &f) || !nfa_eps(b, s, f.start) || !nfa_eps(b, f.end, e))
                    return false;
            }
            *out = (frag){s, e};
            return true;
        }
        case NODE_REPEAT: {
            int32_t s = nfa_state(b);
            if (s < 0) return false;
            int32_t cur = s;
            frag f;
            for (int32_t i = 0; i < nd->min; i++) {
                if (!nfa_build(b, p, nd->first_child, &f) || !nfa_eps(b, cur, f.start))
                    return false;
                cur = f.end;
            }
            if (nd->max < 0) { /* a loop through one more copy */
                int32_t loop = nfa_state(b);
                if (loop < 0 || !nfa_build(b, p, nd->first_child, &f) || !nfa_eps(b, cur, loop) ||
                    !nfa_eps(b, loop, f.start) || !nfa_eps(b, f.end, loop))
                    return false;
                *out = (frag){s, loop};
                return true;
            }
            int32_t e = nfa_state(b);
            if (e < 0) return false;
            for (int32_t i = nd->min; i < nd->max; i++) {
                if (!nfa_build(b, p, nd->first_child, &f) || !nfa_eps(b, cur, e) ||
                    !nfa_eps(b, cur, f.start))
                    return false;
                cur = f.end;
            }
            if (!nfa_eps(b, cur, e)) return false;
            *out = (frag){s, e};
            return true;
        }
    }
    return false;
}

/* ---- stage 3: subset construction -------------------------------------------------------------
 */

typedef struct byte_edge {
    uint8_t lo, hi;
    uint32_t to;
} byte_edge;

/* The NFA in compressed rows, and the working state of the subset construction. */
typedef struct subset {
    uint32_t n_nfa, accept;
    uint32_t *eps_off, *eps_to;
    uint32_t *byte_off;
    byte_edge *byte_e;
    uint8_t class_of[256];
    uint32_t n_classes;

    /* DFA states: sorted NFA state sets stored back to back. */
    uint32_t *pool;
    uint32_t pool_n, pool_cap;
    uint32_t *set_off; /* [n_d + 1] */
    uint32_t set_off_cap;
    uint32_t n_d;
    int32_t *next; /* [n_d][n_classes] */
    uint32_t next_cap;
    uint8_t *acc;
    uint32_t acc_cap;
    int32_t *slots; /* open-addressing hash of sets -> DFA state */
    uint32_t n_slots;

    /* scratch */
    uint32_t *stamp, stamp_now;
    uint32_t *stack, *list;
    uint32_t *pair_class, *pair_to;
    uint32_t pair_cap;
    uint32_t *bucket_off; /* [n_classes + 1] */
    uint32_t *bucket;
    uint32_t bucket_cap;
} subset;

static uint64_t hash_set(const uint32_t *s, uint32_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint32_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static int u32_cmp(const void *a, const void *b) {
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The epsilon closure of seeds[0..n) into sb->list (sorted); returns its size. */
static uint32_t closure(subset *sb, const uint32_t *seeds, uint32_t n) {
    if (++sb->stamp_now == 0) {
        memset(sb->stamp, 0, sb->n_nfa * sizeof *sb->stamp);
        sb->stamp_now = 1;
    }
    uint32_t top = 0, count = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (sb->stamp[seeds[i]] == sb->stamp_now) continue;
        sb->stamp[seeds[i]] = sb->stamp_now;
        sb->stack[top++] = seeds[i];
    }
    while (top) {
        const uint32_t s = sb->stack[--top];
        sb->list[count++] = s;
        for (uint32_t j = sb->eps_off[s]; j < sb->eps_off[s + 1]; j++) {
            const uint32_t t = sb->eps_to[j];
            if (sb->stamp[t] == sb->stamp_now) continue;
            sb->stamp[t] = sb->stamp_now;
            sb->stack[top++] = t;
        }
    }
    qsort(sb->list, count, sizeof *sb->list, u32_cmp);
    return count;
}

static bool rehash(subset *sb) {
    const uint32_t n = sb->n_slots ? sb->n_slots * 2 : 1024;
    int32_t *slots = malloc(n * sizeof *slots);
    if (!slots) return false;
    for (uint32_t i = 0; i < n; i++) slots[i] = -1;
    for (uint32_t d = 0; d < sb->n_d; d++) {
        const uint32_t *s = sb->pool + sb->set_off[d];
        uint32_t h = (uint32_t)hash_set(s, sb->set_off[d + 1] - sb->set_off[d]) & (n - 1);
        while (slots[h] >= 0) h = (h + 1) & (n - 1);
        slots[h] = (int32_t)d;
    }
    free(sb->slots);
    sb->slots = slots;
    sb->n_slots = n;
    return true;
}

/* The DFA state for the set in sb->list[0..n), added if new. -1 on out of memory, -2 over the
 * state limit. */
static int32_t find_or_add(subset *sb, uint32_t n) {
    if ((uint64_t)(sb->n_d + 1) * 2 > sb->n_slots && !rehash(sb)) return -1;
    const uint32_t mask = sb->n_slots - 1;
    uint32_t h = (uint32_t)hash_set(sb->list, n) & mask;
    for (; sb->slots[h] >= 0; h = (h + 1) & mask) {
        const uint32_t d = (uint32_t)sb->slots[h];
        const uint32_t len = sb->set_off[d + 1] - sb->set_off[d];
        if (len == n && memcmp(sb->pool + sb->set_off[d], sb->list, n * sizeof *sb->list) == 0)
            return (int32_t)d;
    }
    if (sb->n_d >= REGEX_MAX_DFA_STATES) return -2;
    const uint32_t d = sb->n_d;
    if (!grow((void **)&sb->pool, &sb->pool_cap, (uint64_t)sb->pool_n + n, sizeof *sb->pool) ||
        !grow((void **)&sb->set_off, &sb->set_off_cap, (uint64_t)d + 2, sizeof *sb->set_off) ||
        !grow((void **)&sb->next, &sb->next_cap, ((uint64_t)d + 1) * sb->n_classes,
              sizeof *sb->next) ||
        !grow((void **)&sb->acc, &sb->acc_cap, (uint64_t)d + 1, sizeof *sb->acc))
        return -1;
    memcpy(sb->pool + sb->pool_n, sb->list, n * sizeof *sb->list);
    sb->set_off[d] = sb->pool_n;
    sb->pool_n += n;
    sb->set_off[d + 1] = sb->pool_n;
    sb->acc[d] = bsearch(&sb->accept, sb->list, n, sizeof *sb->list, u32_cmp) != NULL;
    for (uint32_t c = 0; c < sb->n_classes; c++) sb->next[(size_t)d * sb->n_classes + c] = -1;
    sb->slots[h] = (int32_t)d;
    sb->n_d++;
    return (int32_t)d;
}

static void subset_free(subset *sb) {
    free(sb->eps_off);
    free(sb->eps_to);
    free(sb->byte_off);
    free(sb->byte_e);
    free(sb->pool);
    free(sb->set_off);
    free(sb->next);
    free(sb->acc);
    free(sb->slots);
    free(sb->stamp);
    free(sb->stack);
    free(sb->list);
    free(sb->pair_class);
    free(sb->pair_to);
    free(sb->bucket_off);
    free(sb->bucket);
}

/* Compressed rows of the NFA and the byte classes. */
static bool subset_init(subset *sb, const nfa *b, uint32_t accept) {
    const uint32_t n = b->n_states;
    sb->n_nfa = n;
    sb->accept = accept;
    sb->eps_off = calloc(n + 1, sizeof *sb->eps_off);
    sb->byte_off = calloc(n + 1, sizeof *sb->byte_off);
    sb->stamp = calloc(n, sizeof *sb->stamp);
    sb->stack = malloc(n * sizeof *sb->stack);
    sb->list = malloc(n * sizeof *sb->list);
    if (!sb->eps_off || !sb->byte_off || !sb->stamp || !sb->stack || !sb->list) return false;
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
    for (uint32_t s = 0; s < n; s++) {
        sb->eps_off[s + 1] += sb->eps_off[s];
        sb->byte_off[s + 1] += sb->byte_off[s];
    }
    sb->eps_to = malloc((sb->eps_off[n] + 1) * sizeof *sb->eps_to);
    sb->byte_e = malloc((sb->byte_off[n] + 1) * sizeof *sb->byte_e);
    uint32_t *fill_e = calloc(n, sizeof *fill_e), *fill_b = calloc(n, sizeof *fill_b);
    bool ok = sb->eps_to && sb->byte_e && fill_e && fill_b;
    for (uint32_t i = 0; ok && i < b->n_edges; i++) {
        const nfa_edge *e = &b->e[i];
        if (e->eps) {
            sb->eps_to[sb->eps_off[e->from] + fill_e[e->from]++] = e->to;
        } else {
            sb->byte_e[sb->byte_off[e->from] + fill_b[e->from]++] =
                (byte_edge){.lo = e->lo, .hi = e->hi, .to = e->to};
        }
    }
    free(fill_e);
    free(fill_b);
    if (!ok) return false;
    uint32_t cls = 0;
    for (int v = 0; v < 256; v++) {
        if (v > 0 && brk[v]) cls++;
        sb->class_of[v] = (uint8_t)cls;
    }
    sb->n_classes = cls + 1;
    sb->bucket_off = malloc((sb->n_classes + 1) * sizeof *sb->bucket_off);
    return sb->bucket_off != NULL;
}

/* Double the (class, target) pair arrays. */
static bool grow_pairs(subset *sb) {
    const uint32_t cap = sb->pair_cap ? sb->pair_cap * 2 : 1024;
    uint32_t *pc = realloc(sb->pair_class, cap * sizeof *pc);
    if (!pc) return false;
    sb->pair_class = pc;
    uint32_t *pt = realloc(sb->pair_to, cap * sizeof *pt);
    if (!pt) return false;
    sb->pair_to = pt;
    sb->pair_cap = cap;
    return true;
}

/* Run the subset construction from NFA state `start`. */
static corral_status subset_run(subset *sb, uint32_t start, corral_error *err) {
    uint32_t n = closure(sb, &start, 1);
    if (find_or_add(sb, n) < 0)
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "regex: out of memory");
    const uint32_t k = sb->n_classes;
    for (uint32_t d = 0; d < sb->n_d; d++) {
        /* (class, target) pairs of every byte edge leaving the set, bucketed by class. */
        uint32_t n_pairs = 0;
        memset(sb->bucket_off, 0, (k + 1) * sizeof *sb->bucket_off);
        for (uint32_t i = sb->set_off[d]; i < sb->set_off[d + 1]; i++) {
            const uint32_t s = sb->pool[i];
            for (uint32_t j = sb->byte_off[s]; j < sb->byte_off[s + 1]; j++) {
                const byte_edge *e = &sb->byte_e[j];
                for (uint32_t c = sb->class_of[e->lo]; c <= sb->class_of[e->hi]; c++) {
                    if (n_pairs == sb->pair_cap && !grow_pairs(sb))
                        return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "regex: out of memory");
                    sb->pair_class[n_pairs] = c;
                    sb->pair_to[n_pairs++] = e->to;
                    sb->bucket_off[c + 1]++;
                }
            }
        }
        for (uint32_t c = 0; c < k; c++) sb->bucket_off[c + 1] += sb->bucket_off[c];
        if (!grow((void **)&sb->bucket, &sb->bucket_cap, (uint64_t)n_pairs + 1, sizeof *sb->bucket))
            return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "regex: out of memory");
        /* counting sort; bucket_off[c] walks up to the old bucket_off[c + 1] */
        for (uint32_t i = 0; i < n_pairs; i++)
            sb->bucket[sb->bucket_off[sb->pair_class[i]]++] = sb->pair_to[i];
        uint32_t begin = 0;
        for (uint32_t c = 0; c < k; c++) {
            const uint32_t end = sb->bucket_off[c];
            if (end > begin) {
                n = closure(sb, sb->bucket + begin, end - begin);
                const int32_t t = find_or_add(sb, n);
                if (t == -1)
                    return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "regex: out of memory");
                if (t == -2)
                    return corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                                            "regex: the pattern is too complex: its automaton "
                                            "needs more than %d states",
                                            REGEX_MAX_DFA_STATES);
                sb->next[(size_t)d * k + c] = t;
            }
            begin = end;
        }
    }
    return CORRAL_OK;
}

/* ---- stage 4: dead states, minimisation, renumbering -------------------------------------------
 */

typedef struct sig_ctx {
    const int32_t *sig;
    uint32_t width;
} sig_ctx;

static int sig_cmp(const void *a, const void *b, void *ctx) {
    const sig_ctx *c = ctx;
    const int32_t *x = c->sig + (size_t) * (const uint32_t *)a * c->width;
    const int32_t *y = c->sig + (size_t) * (const uint32_t *)b * c->width;
    for (uint32_t i = 0; i < c->width; i++)
        if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
}

/* From the raw DFA (n states, k classes, next, acc) build the minimal one into *out. */
static corral_status dfa_finish(uint32_t n, uint32_t k, const int32_t *next, const uint8_t *acc,
                                const uint8_t class_of[256], regex_dfa *out, corral_error *err) {
    corral_status st = CORRAL_OUT_OF_MEMORY;
    uint8_t *live = calloc(n, 1);
    uint32_t *queue = malloc(n * sizeof *queue);
    uint32_t *rev_off = calloc(n + 1, sizeof *rev_off);
    uint32_t *rev = malloc(((size_t)n * k + 1) * sizeof *rev);
    int32_t *block = malloc(n * sizeof *block);
    uint32_t *order = malloc(n * sizeof *order);
    int32_t *sig = malloc((size_t)n * (k + 1) * sizeof *sig);
    int32_t *newblock = malloc(n * sizeof *newblock);
    int32_t *mnext = NULL, *renum = NULL, *bfs = NULL, *colmap = NULL;
    uint8_t *macc = NULL;
    if (!live || !queue || !rev_off || !rev || !block || !order || !sig || !newblock) goto done;

    /* States that can reach an accepting state, by a backwards search. */
    for (uint32_t s = 0; s < n; s++)
        for (uint32_t c = 0; c < k; c++)
            if (next[(size_t)s * k + c] >= 0) rev_off[next[(size_t)s * k + c] + 1]++;
    for (uint32_t s = 0; s < n; s++) rev_off[s + 1] += rev_off[s];
    {
        uint32_t *fill = calloc(n, sizeof *fill);
        if (!fill) goto done;
        for (uint32_t s = 0; s < n; s++)
            for (uint32_t c = 0; c < k; c++) {
                const int32_t t = next[(size_t)s * k + c];
                if (t >= 0) rev[rev_off[t] + fill[t]++] = s;
            }
        free(fill);
    }
    uint32_t head = 0, tail = 0;
    for (uint32_t s = 0; s < n; s++)
        if (acc[s]) live[s] = 1, queue[tail++] = s;
    while (head < tail) {
        const uint32_t t = queue[head++];
        for (uint32_t j = rev_off[t]; j < rev_off[t + 1]; j++)
            if (!live[rev[j]]) live[rev[j]] = 1, queue[tail++] = rev[j];
    }
    if (!live[0]) {
        st = corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                              "regex: the pattern matches nothing (no string can match it)");
        goto done;
    }

    /* Moore: split blocks by (own block, blocks of the successors) until nothing splits. Dead
     * states take no part: a transition to one counts as "none" (-1). */
    uint32_t n_live = 0;
    for (uint32_t s = 0; s < n; s++)
        if (live[s]) order[n_live++] = s;
    bool has_acc = false, has_rej = false;
    for (uint32_t s = 0; s < n; s++) {
        block[s] = live[s] ? acc[s] : -1;
        if (live[s] && acc[s]) has_acc = true;
        if (live[s] && !acc[s]) has_rej = true;
    }
    uint32_t n_blocks = (uint32_t)has_acc + (uint32_t)has_rej;
    const uint32_t w = k + 1;
    for (;;) {
        for (uint32_t i = 0; i < n_live; i++) {
            const uint32_t s = order[i];
            int32_t *g = sig + (size_t)s * w;
            g[0] = block[s];
            for (uint32_t c = 0; c < k; c++) {
                const int32_t t = next[(size_t)s * k + c];
                g[c + 1] = t >= 0 && live[t] ? block[t] : -1;
            }
        }
        sig_ctx ctx = {sig, w};
        qsort_r(order, n_live, sizeof *order, sig_cmp, &ctx);
        uint32_t nb = 0;
        for (uint32_t i = 0; i < n_live; i++) {
            if (i > 0 && sig_cmp(&order[i - 1], &order[i], &ctx) != 0) nb++;
            newblock[order[i]] = (int32_t)nb;
        }
        nb = n_live ? nb + 1 : 0;
        for (uint32_t i = 0; i < n_live; i++) block[order[i]] = newblock[order[i]];
        if (nb == n_blocks) break;
        n_blocks = nb;
    }

    /* The minimal table, one row per block. */
    mnext = malloc((size_t)n_blocks * k * sizeof *mnext);
    macc = malloc(n_blocks);
    if (!mnext || !macc) goto done;
    for (uint32_t i = 0; i < n_live; i++) {
        const uint32_t s = order[i], b = (uint32_t)block[s];
        macc[b] = acc[s];
        for (uint32_t c = 0; c < k; c++) {
            const int32_t t = next[(size_t)s * k + c];
            mnext[(size_t)b * k + c] = t >= 0 && live[t] ? block[t] : REGEX_DEAD;
        }
    }

    /* Merge classes whose columns are equal. */
    colmap = malloc(k * sizeof *colmap);
    if (!colmap) goto done;
    uint32_t n_cols = 0;
    int32_t *first_of = malloc(k * sizeof *first_of); /* new column -> an old class */
    uint64_t *col_hash = malloc(k * sizeof *col_hash);
    if (!first_of || !col_hash) {
        free(first_of);
        free(col_hash);
        goto done;
    }
    for (uint32_t c = 0; c < k; c++) {
        uint64_t h = 1469598103934665603ull;
        for (uint32_t b = 0; b < n_blocks; b++) {
            h ^= (uint32_t)mnext[(size_t)b * k + c];
            h *= 1099511628211ull;
        }
        col_hash[c] = h;
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
    free(col_hash);

    /* Breadth-first renumbering from the start's block. */
    renum = malloc(n_blocks * sizeof *renum);
    bfs = malloc(n_blocks * sizeof *bfs);
    if (!renum || !bfs) {
        free(first_of);
        goto done;
    }
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
    out->n_states = tail; /* every block is reachable; tail == n_blocks */
    out->n_classes = n_cols;
    out->next = malloc((size_t)tail * n_cols * sizeof *out->next);
    out->accepting = malloc(tail);
    out->final = malloc(tail);
    if (!out->next || !out->accepting || !out->final) {
        free(first_of);
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
    free(first_of);
    st = CORRAL_OK;
done:
    if (st == CORRAL_OUT_OF_MEMORY) corral_error_set(err, st, "regex: out of memory");
    free(live);
    free(queue);
    free(rev_off);
    free(rev);
    free(block);
    free(order);
    free(sig);
    free(newblock);
    free(mnext);
    free(macc);
    free(colmap);
    free(renum);
    free(bfs);
    return st;
}

/* ---- the whole ----------------------------------------------------------------------------------
 */

corral_status regex__compile(const char *pattern, size_t len, uint32_t flags, regex_dfa *out,
                             corral_error *err) {
    if (!out) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "regex: no output");
    memset(out, 0, sizeof *out);
    if (!pattern && len) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "regex: no pattern");
    if (len > REGEX_MAX_PATTERN)
        return corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                                "regex: the pattern has %zu bytes; the limit is %d", len,
                                REGEX_MAX_PATTERN);
    parser p = {.pat = pattern ? pattern : "", .len = len, .flags = flags, .err = err};
    nfa b = {.err = err};
    subset sb = {0};
    corral_status st;

    int32_t root = parse_alt(&p, 0);
    if (root >= 0 && p.pos < p.len)
        root = perr(&p, CORRAL_INVALID_ARGUMENT, p.pos, "unmatched ')'");
    if (root >= 0 && (flags & REGEX_SEARCH)) { /* any bytes, then the pattern */
        int32_t any = new_node(&p, NODE_ANY_BYTE), rep = new_node(&p, NODE_REPEAT),
                cat = new_node(&p, NODE_CAT);
        if (any >= 0 && rep >= 0 && cat >= 0) {
            p.nodes[rep].min = 0;
            p.nodes[rep].max = -1;
            add_child(&p, rep, any);
            add_child(&p, cat, rep);
            add_child(&p, cat, root);
            root = cat;
        } else {
            root = -1;
        }
    }
    if (root < 0) {
        st = p.status;
        goto done;
    }
    frag f;
    if (!nfa_build(&b, &p, root, &f)) {
        st = b.status;
        goto done;
    }
    if (!subset_init(&sb, &b, (uint32_t)f.end)) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "regex: out of memory");
        goto done;
    }
    st = subset_run(&sb, (uint32_t)f.start, err);
    if (st == CORRAL_OK)
        st = dfa_finish(sb.n_d, sb.n_classes, sb.next, sb.acc, sb.class_of, out, err);
done:
    for (uint32_t i = 0; i < p.n_sets; i++) free(p.sets[i].r);
    free(p.sets);
    free(p.nodes);
    free(b.e);
    subset_free(&sb);
    if (st != CORRAL_OK) regex__free(out);
    return st;
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
