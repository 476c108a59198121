/*
 * regex_nfa.c — stage 2 of the regex compiler (regex.c has the list): Thompson's construction of
 * an NFA over byte ranges from the parser's tree. A set of code points becomes the byte sequences
 * of its UTF-8 encodings; a repetition builds its body once and copies it, after checking the
 * whole expansion against REGEX_MAX_NFA_STATES and REGEX_MAX_NFA_EDGES, so no pattern makes this
 * stage allocate more than the limits allow. For a search, a loop over any byte goes in front.
 */
#include "regex_impl.h"
#include "corral/utf8.h"

/* ---- stage 2: Thompson NFA over byte ranges ----------------------------------------------------
 */

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
    if (!rx_grow(b->cx, (void **)&b->e, &b->cap_edges, (uint64_t)b->n_edges + 1, sizeof *b->e))
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
        !rx_grow(b->cx, (void **)&b->e, &b->cap_edges, edges, sizeof *b->e))
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

bool regex__nfa_build(nfa *b, int32_t root, uint32_t flags, frag *out, int64_t *base) {
    *base = -1;
    if (!nfa_build(b, root, out)) return false;
    if (!(flags & REGEX_SEARCH)) return true;
    /* a loop over any byte, then the pattern; the loop's closure is the subset construction's
     * base set */
    const int32_t loop = nfa_state(b), any = nfa_state(b), back = nfa_state(b);
    if (loop < 0 || any < 0 || back < 0 || !nfa_eps(b, loop, any) ||
        !nfa_edge_add(b, any, back, 0, 255, false) || !nfa_eps(b, back, loop) ||
        !nfa_eps(b, loop, out->start))
        return false;
    out->start = loop;
    *base = loop;
    return true;
}
