/*
 * regex_text.c — writing patterns (regex.h, "writing patterns"): a growing text with a size
 * limit, and regex__rewrite, which parses a pattern with the compiler's own parser and writes the
 * same structure back with every character set spelled by the caller.
 *
 * The rewrite is how a JSON schema's `pattern` (a regex over a string's characters) becomes a
 * pattern over the string's JSON text (json_schema_string.c): the structure (groups, alternation,
 * repetition) carries over unchanged, each set of characters becomes the alternatives of their
 * JSON spellings, and the ends a search leaves open are filled. Parsing with the compiler's parser
 * means the rewrite accepts and refuses exactly what a constraint does, with the same messages.
 */
#include "regex_impl.h"

/* ---- the text -------------------------------------------------------------------------------- */

static bool text_fail(regex_text *t, corral_status st) {
    if (t->status == CORRAL_OK) t->status = st;
    return false;
}

bool regex__text_put(regex_text *t, const char *s, size_t n) {
    if (t->status != CORRAL_OK) return false;
    if (n > t->limit || t->len > t->limit - n) return text_fail(t, CORRAL_RESOURCE_EXHAUSTED);
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n + 1) cap *= 2;
        char *d = realloc(t->data, cap);
        if (!d) return text_fail(t, CORRAL_OUT_OF_MEMORY);
        t->data = d;
        t->cap = cap;
    }
    if (n) memcpy(t->data + t->len, s, n);
    t->len += n;
    t->data[t->len] = '\0';
    return true;
}

bool regex__text_puts(regex_text *t, const char *s) {
    return regex__text_put(t, s, strlen(s));
}

bool regex__text_printf(regex_text *t, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof buf) return text_fail(t, CORRAL_INTERNAL);
    return regex__text_put(t, buf, (size_t)n);
}

bool regex__text_put_cp(regex_text *t, uint32_t cp) {
    if ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
        cp == ' ' || cp == '_') { /* (\_ would be an unknown escape) */
        const char c = (char)cp;
        return regex__text_put(t, &c, 1);
    }
    if (cp < 0x20 || cp == 0x7F) return regex__text_printf(t, "\\x%02X", (unsigned)cp);
    if (cp < 0x80) { /* punctuation: an identity escape means itself inside a class and out */
        const char e[2] = {'\\', (char)cp};
        return regex__text_put(t, e, 2);
    }
    if (cp > CP_MAX || (cp >= SURR_FIRST && cp <= SURR_LAST)) return text_fail(t, CORRAL_INTERNAL);
    return regex__text_printf(t, "\\u{%X}", (unsigned)cp);
}

/* ---- the rewrite ----------------------------------------------------------------------------- */

typedef struct rewriter {
    parser *p;
    const regex_rewrite *how;
    regex_text *out;
    uint32_t (*ranges)[2]; /* scratch for one set, as wide as the widest set */
} rewriter;

static bool write_node(rewriter *w, int32_t n, bool top);

/* A concatenation; at the top level, the open ends of a search filled. */
static bool write_cat(rewriter *w, const node *nd, bool top) {
    const bool fill = top && w->how->unanchored;
    if (fill && !(nd->anchors & ANCHOR_START)) regex__text_puts(w->out, w->how->unanchored);
    for (int32_t c = nd->first_child; c >= 0; c = w->p->nodes[c].next_sibling)
        if (!write_node(w, c, false)) return false;
    if (fill && !(nd->anchors & ANCHOR_END)) regex__text_puts(w->out, w->how->unanchored);
    return w->out->status == CORRAL_OK;
}

static bool write_node(rewriter *w, int32_t n, bool top) {
    const node *nd = &w->p->nodes[n];
    regex_text *out = w->out;
    switch (nd->type) {
        case NODE_EMPTY:
            return true;
        case NODE_SET: {
            const cpset *s = &w->p->sets[nd->set];
            for (uint32_t i = 0; i < s->n; i++) {
                w->ranges[i][0] = s->r[i].lo;
                w->ranges[i][1] = s->r[i].hi;
            }
            return w->how->set(w->how->user, (const uint32_t(*)[2])w->ranges, s->n, out);
        }
        case NODE_CAT:
            if (!top) regex__text_puts(out, "(?:");
            if (!write_cat(w, nd, top)) return false;
            if (!top) regex__text_puts(out, ")");
            return out->status == CORRAL_OK;
        case NODE_ALT:
            regex__text_puts(out, "(?:");
            for (int32_t c = nd->first_child; c >= 0; c = w->p->nodes[c].next_sibling) {
                if (c != nd->first_child) regex__text_puts(out, "|");
                /* The parser makes every alternative a NODE_CAT. */
                const node *alt = &w->p->nodes[c];
                if (alt->type == NODE_CAT ? !write_cat(w, alt, top) : !write_node(w, c, false))
                    return false;
            }
            return regex__text_puts(out, ")");
        case NODE_REPEAT:
            regex__text_puts(out, "(?:");
            if (!write_node(w, nd->first_child, false)) return false;
            regex__text_puts(out, ")");
            if (nd->max < 0) return regex__text_printf(out, "{%d,}", (int)nd->min);
            return regex__text_printf(out, "{%d,%d}", (int)nd->min, (int)nd->max);
    }
    return text_fail(out, CORRAL_INTERNAL);
}

corral_status regex__rewrite(const char *pattern, size_t len, const regex_rewrite *how,
                             regex_text *out, corral_error *err) {
    if (!how || !how->set || !out || (!pattern && len))
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "regex: bad rewrite arguments");
    if (len > REGEX_MAX_PATTERN)
        return corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                                "regex: the pattern has %zu bytes; the limit is %d "
                                "(REGEX_MAX_PATTERN)",
                                len, REGEX_MAX_PATTERN);
    rx_ctx cx = {.stage = "the parse", .err = err};
    parser p = {.pat = pattern ? pattern : "", .len = len, .cx = &cx};
    const int32_t root = regex__parse(&p);
    if (root < 0) {
        if (cx.status == CORRAL_OK) rx_fail(&cx, CORRAL_INTERNAL, "internal error");
        regex__tree_free(&p);
        return cx.status;
    }
    uint32_t widest = 1;
    for (uint32_t i = 0; i < p.n_sets; i++)
        if (p.sets[i].n > widest) widest = p.sets[i].n;
    rewriter w = {.p = &p, .how = how, .out = out, .ranges = malloc(widest * sizeof *w.ranges)};
    corral_status st = CORRAL_OK;
    if (!w.ranges) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "regex: out of memory");
    } else if (!write_node(&w, root, true)) {
        st = out->status != CORRAL_OK ? out->status : CORRAL_INTERNAL;
        corral_error_set(err, st, "regex: the rewritten pattern could not be written (%s)",
                         st == CORRAL_RESOURCE_EXHAUSTED ? "over its size limit" : "out of memory");
    }
    free(w.ranges);
    regex__tree_free(&p);
    return st;
}
