/*
 * regex.c — ECMAScript-like patterns to minimal byte DFAs (see regex.h for the syntax and the
 * limits): the syntax half and the driver.
 *
 * Four stages, under one budget (regex_impl.h: every allocation counted, every step paid for):
 *   1. (here) a recursive-descent parser builds a small tree (sets of code points, concatenation,
 *      alternation, repetition); every error names the construct and its byte offset;
 *   2. (regex_nfa.c) Thompson's construction turns the tree into an NFA over byte ranges: a set of
 *      code points becomes the byte sequences of its UTF-8 encodings (ranges are split where the
 *      encoded length or a continuation byte's range changes, so that each piece is a product of
 *      byte ranges); a repetition {m,n} is m copies followed by n-m optional ones;
 *   3. (regex_dfa.c) the subset construction over byte classes (bytes that no NFA edge tells
 *      apart share a column) gives a DFA; states that cannot reach an accepting state are
 *      dropped, so a missing transition always means "this can no longer match";
 *   4. (regex_dfa.c) Hopcroft's partition refinement minimises it, equal columns are merged, and
 *      states are renumbered breadth-first from the start.
 * Every stage is linear in what it builds (Hopcroft: that times log(states)), and what it builds
 * is bounded by the limits of regex.h, counted as it is built; the parser is linear in the
 * pattern, whose length is bounded. Nothing here is on a per-token path: compilation happens once
 * per pattern.
 */
#include "regex.h"

#include "regex_impl.h"
#include "corral/utf8.h"

/* ---- sets of code points --------------------------------------------------------------------- */

static bool cpset_add(rx_ctx *cx, cpset *s, uint32_t lo, uint32_t hi) {
    if (!rx_grow(cx, (void **)&s->r, &s->cap, (uint64_t)s->n + 1, sizeof *s->r)) return false;
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
            if (!rx_grow(cx, (void **)&s->r, &s->cap, (uint64_t)s->n + 1, sizeof *s->r))
                return false;
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
    if (!rx_grow(p->cx, (void **)&p->nodes, &p->cap_nodes, (uint64_t)p->n_nodes + 1,
                 sizeof *p->nodes))
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
    if (!rx_grow(p->cx, (void **)&p->sets, &p->cap_sets, (uint64_t)p->n_sets + 1, sizeof *p->sets))
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
    return parse_char(p, cp);
}

/* A literal character at pos. */
static int32_t parse_literal(parser *p) {
    uint32_t cp;
    if (parse_char(p, &cp) < 0) return -1;
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
    if (!(p->flags & REGEX_GENERATED) && depth + 1 > REGEX_MAX_DEPTH)
        return perr(p, CORRAL_RESOURCE_EXHAUSTED, open,
                    "groups nested deeper than %d (limit REGEX_MAX_DEPTH)", REGEX_MAX_DEPTH);
    if (depth + 1 > REGEX_MAX_GENERATED_DEPTH)
        return perr(p, CORRAL_RESOURCE_EXHAUSTED, open,
                    "groups nested deeper than %d (limit REGEX_MAX_GENERATED_DEPTH)",
                    REGEX_MAX_GENERATED_DEPTH);
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
                p->nodes[cat].anchors |= ANCHOR_START;
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
                p->nodes[cat].anchors |= ANCHOR_END;
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

/* ---- the whole ----------------------------------------------------------------------------------
 */

int32_t regex__parse(parser *p) {
    int32_t root = parse_alt(p, 0);
    if (root >= 0 && p->pos < p->len)
        root = perr(p, CORRAL_INVALID_ARGUMENT, p->pos, "unmatched ')'");
    return root;
}

void regex__tree_free(parser *p) {
    for (uint32_t i = 0; i < p->n_sets; i++) rx_free(p->cx, p->sets[i].r);
    rx_free(p->cx, p->sets);
    rx_free(p->cx, p->nodes);
    p->sets = NULL;
    p->nodes = NULL;
    p->n_sets = p->n_nodes = 0;
}

corral_status regex__compile(const char *pattern, size_t len, uint32_t flags, regex_dfa *out,
                             regex_stats *stats, corral_error *err) {
    if (stats) memset(stats, 0, sizeof *stats);
    if (!out) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "regex: no output");
    memset(out, 0, sizeof *out);
    if (!pattern && len) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "regex: no pattern");
    if (flags & REGEX_GENERATED) {
        if (len > REGEX_MAX_GENERATED_PATTERN)
            return corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                                    "regex: the generated pattern has %zu bytes; the limit is %u "
                                    "(REGEX_MAX_GENERATED_PATTERN)",
                                    len, REGEX_MAX_GENERATED_PATTERN);
    } else if (len > REGEX_MAX_PATTERN) {
        return corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                                "regex: the pattern has %zu bytes; the limit is %d "
                                "(REGEX_MAX_PATTERN)",
                                len, REGEX_MAX_PATTERN);
    }
    rx_ctx cx = {.stage = "the parse", .err = err};
    parser p = {.pat = pattern ? pattern : "", .len = len, .flags = flags, .cx = &cx};
    regex_stats st = {0};
    const int32_t root = regex__parse(&p);
    const bool ok = root >= 0 && regex__automaton(&p, root, flags, out, &st);
    if (!ok && cx.status == CORRAL_OK) rx_fail(&cx, CORRAL_INTERNAL, "internal error");
    regex__tree_free(&p);
    if (!ok) regex__free(out);
    st.work = cx.work;
    st.peak_bytes = cx.peak_bytes;
    if (stats) *stats = st;
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
