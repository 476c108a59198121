/*
 * regex_impl.h — private to the regex compiler: regex.c (code-point sets, the parser, the driver),
 * regex_nfa.c (Thompson's NFA) and regex_dfa.c (subset construction, minimisation). The compile's
 * budget, which they all draw on, the syntax tree the parser hands on, and the NFA.
 */
#ifndef CORRAL_POLICIES_REGEX_IMPL_H
#define CORRAL_POLICIES_REGEX_IMPL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "regex.h"

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
__attribute__((format(printf, 3, 4))) static inline bool rx_fail(rx_ctx *cx, corral_status st,
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
static inline bool rx_charge(rx_ctx *cx, uint64_t n) {
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
static inline void *rx_realloc(rx_ctx *cx, void *p, uint64_t n) {
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

static inline void *rx_alloc(rx_ctx *cx, uint64_t count, size_t elem) {
    if (count > REGEX_MAX_COMPILE_BYTES / (elem ? elem : 1)) return rx_charge(cx, UINT64_MAX), NULL;
    return rx_realloc(cx, NULL, count * elem);
}

static inline void *rx_zalloc(rx_ctx *cx, uint64_t count, size_t elem) {
    void *p = rx_alloc(cx, count, elem);
    if (p) memset(p, 0, (size_t)(count * elem));
    return p;
}

static inline void rx_free(rx_ctx *cx, void *p) {
    if (!p) return;
    rx_head *h = (rx_head *)p - 1;
    cx->bytes -= sizeof *h + h->size;
    free(h);
}

/* Pay for `units` steps before taking them. */
static inline bool rx_work(rx_ctx *cx, uint64_t units) {
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
static inline bool rx_grow(rx_ctx *cx, void **p, uint32_t *cap, uint64_t need, size_t elem) {
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

/* ---- the syntax tree --------------------------------------------------------------------------
 */

typedef struct cp_range {
    uint32_t lo, hi;
} cp_range;

typedef struct cpset {
    cp_range *r;
    uint32_t n, cap;
} cpset;

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
    /* A top-level NODE_CAT: ANCHOR_START if `^` began it, ANCHOR_END if `$` ended it (the
     * whole-match compile ignores them; regex__rewrite reads them). */
    uint8_t anchors;
} node;

enum { ANCHOR_START = 1, ANCHOR_END = 2 };

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

/* ---- the NFA -----------------------------------------------------------------------------------
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

/* Stage 2 (regex_nfa.c): Thompson's NFA of the tree at root into *b (b->p, b->cx set, the rest
 * zero), its start and accepting states into *out; with REGEX_SEARCH in flags, a loop over any
 * byte in front, which is then the start and *base (else -1). False with the error in b->cx (the
 * edges built so far stay in b->e for the caller to free). */
bool regex__nfa_build(nfa *b, int32_t root, uint32_t flags, frag *out, int64_t *base);

/* Stages 2-4 (regex_dfa.c): Thompson's NFA of the tree at root (a search when flags has
 * REGEX_SEARCH), its subset construction and the minimal DFA into *out. Frees p's tree once the NFA
 * is built (regex__tree_free). Returns false with the error in p->cx; st receives the NFA's and
 * the subset construction's sizes. */
bool regex__automaton(parser *p, int32_t root, uint32_t flags, regex_dfa *out, regex_stats *st);

/* Stage 1 (regex.c): parse p->pat[0..p->len) into p's tree (p->cx, p->flags set, the rest zero).
 * The root node, or -1 with the error in p->cx. Free the tree with regex__tree_free. */
int32_t regex__parse(parser *p);

/* Free p's nodes and sets (regex.c). Idempotent. */
void regex__tree_free(parser *p);

#endif /* CORRAL_POLICIES_REGEX_IMPL_H */
