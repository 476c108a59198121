/*
 * regex_dfa.c — stages 3 and 4 of the regex compiler (regex.c has the list): the subset
 * construction over byte classes from regex_nfa.c's NFA, the removal of dead states, Hopcroft's
 * minimisation, the merge of equal columns and the breadth-first renumbering; and the driver of
 * stages 2-4. Every allocation and every step is charged to the compile's budget (regex_impl.h)
 * before it is made, so the limits of regex.h hold whatever the pattern.
 */
#include "regex_impl.h"

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
    uint32_t max_states; /* REGEX_MAX_DFA_STATES, or the REGEX_GENERATED limit */
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
    if (sb->n_d >= sb->max_states) {
        rx_fail(cx, CORRAL_RESOURCE_EXHAUSTED,
                "the pattern is too complex: its automaton needs more than %u states (limit "
                "%s)",
                sb->max_states,
                sb->max_states == REGEX_MAX_DFA_STATES ? "REGEX_MAX_DFA_STATES"
                                                       : "REGEX_MAX_GENERATED_DFA_STATES");
        return -1;
    }
    const uint32_t d = sb->n_d;
    if (!rx_work(cx, k) ||
        !rx_grow(cx, (void **)&sb->pool, &sb->pool_cap, (uint64_t)sb->pool_n + n,
                 sizeof *sb->pool) ||
        !rx_grow(cx, (void **)&sb->set_off, &sb->set_off_cap, (uint64_t)d + 2,
                 sizeof *sb->set_off) ||
        !rx_grow(cx, (void **)&sb->hash, &sb->hash_cap, (uint64_t)d + 1, sizeof *sb->hash) ||
        !rx_grow(cx, (void **)&sb->next, &sb->next_cap, ((uint64_t)d + 1) * k, sizeof *sb->next) ||
        !rx_grow(cx, (void **)&sb->acc, &sb->acc_cap, (uint64_t)d + 1, sizeof *sb->acc))
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
                if (!rx_grow(cx, (void **)&sb->pair_class, &cap, need, sizeof *sb->pair_class) ||
                    !rx_grow(cx, (void **)&sb->pair_to, &cap2, need, sizeof *sb->pair_to))
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
    if (!rx_work(cx, steps + n_pairs) || !rx_grow(cx, (void **)&sb->bucket, &sb->bucket_cap,
                                                  (uint64_t)n_pairs + 1, sizeof *sb->bucket))
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
        /* (An empty set may leave the pool unallocated: no pointer arithmetic on NULL.) */
        const uint32_t *set = sb->pool ? sb->pool + sb->set_off[d] : NULL;
        if (!gather_targets(sb, set, sb->set_off[d + 1] - sb->set_off[d])) return false;
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

/* ---- the stages in order ----------------------------------------------------------------------
 */

bool regex__automaton(parser *p, int32_t root, uint32_t flags, regex_dfa *out, regex_stats *st) {
    rx_ctx *cx = p->cx;
    nfa b = {.p = p, .cx = cx};
    subset sb = {.cx = cx,
                 .max_states = flags & REGEX_GENERATED ? REGEX_MAX_GENERATED_DFA_STATES
                                                       : REGEX_MAX_DFA_STATES};
    frag f;
    bool ok = false;
    cx->stage = "the NFA's construction";
    int64_t base = -1;
    if (!regex__nfa_build(&b, root, flags, &f, &base)) goto done;
    /* the tree is no longer needed, and the NFA's edge list only until its rows are built */
    regex__tree_free(p);
    cx->stage = "the subset construction";
    uint32_t start = (uint32_t)f.start;
    const bool rows = subset_init(&sb, &b, (uint32_t)f.end, &start);
    rx_free(cx, b.e);
    b.e = NULL;
    if (!rows || !subset_run(&sb, start, base)) goto done;
    subset_free_scratch(&sb);
    cx->stage = "the dead-state search";
    ok = dfa_finish(cx, sb.n_d, sb.n_classes, sb.next, sb.acc, sb.class_of, out);
done:
    rx_free(cx, b.e);
    subset_free(&sb);
    st->nfa_states = b.n_states;
    st->nfa_edges = b.n_edges;
    st->dfa_states = sb.n_d;
    return ok;
}
