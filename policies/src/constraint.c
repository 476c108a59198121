/*
 * constraint.c — token masks from a byte DFA (see constraint.h): the vocabulary trie, the
 * per-state allowed sets, the per-generation matcher and the cache by pattern.
 *
 * The trie is stored flat in pre-order: node i's subtree is nodes i .. i + subtree - 1, and each
 * node knows its depth. Walking it with the DFA needs no recursion and no pointers: keep the DFA
 * state reached at each depth in an array; at node i (depth d) step from the state at depth d - 1
 * (its parent is the last node seen at that depth); a dead step skips the whole subtree. Tokens
 * with identical bytes (a byte token <0x41> and "A") end at the same node.
 */
#include "corral/constraint.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "corral/json_schema.h"
#include "regex.h"

/* Upper bound on the bitsets one constraint may reserve (virtual; touched pages only). */
#define CONSTRAINT_MAX_MASK_BYTES (512ull << 20)

/* The matcher's state after an end-of-generation token. */
#define MATCHER_DONE (-2)

/* ---- index ----------------------------------------------------------------------------------- */

typedef struct trie_node {
    uint32_t subtree;   /* nodes in this subtree, itself included */
    uint32_t tok_first; /* tokens ending here: ix->trie_tokens[tok_first .. + tok_count) */
    uint32_t tok_count;
    uint32_t depth; /* bytes from the root; the root is 0 */
    uint8_t byte;   /* the byte on the edge from the parent */
} trie_node;

struct constraint_index {
    atomic_uint refs;
    const tokenizer *tok;
    int32_t n_vocab;
    uint32_t *tok_off; /* [n_vocab + 1] token bytes in `bytes` */
    char *bytes;
    uint8_t *is_eog; /* [n_vocab] */
    int32_t *eog;    /* the end-of-generation ids */
    uint32_t n_eog;
    trie_node *nodes;
    uint32_t n_nodes;
    int32_t *trie_tokens; /* token ids sorted by their bytes */
    uint32_t n_trie_tokens;
    uint32_t max_depth;
};

typedef struct sort_ctx {
    const uint32_t *off;
    const char *bytes;
} sort_ctx;

static int token_bytes_cmp(const void *a, const void *b, void *ctx) {
    const sort_ctx *c = ctx;
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const uint32_t lx = c->off[x + 1] - c->off[x], ly = c->off[y + 1] - c->off[y];
    const int r = memcmp(c->bytes + c->off[x], c->bytes + c->off[y], lx < ly ? lx : ly);
    if (r) return r;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void index_free(constraint_index *ix) {
    free(ix->tok_off);
    free(ix->bytes);
    free(ix->is_eog);
    free(ix->eog);
    free(ix->nodes);
    free(ix->trie_tokens);
    free(ix);
}

/* Build the pre-order trie from the token ids sorted by bytes: each token adds the nodes for its
 * bytes past the common prefix with the previous token. */
static bool index_build_trie(constraint_index *ix) {
    uint64_t total = 1;
    for (uint32_t i = 0; i < ix->n_trie_tokens; i++) {
        const int32_t t = ix->trie_tokens[i];
        total += ix->tok_off[t + 1] - ix->tok_off[t];
    }
    if (total > UINT32_MAX) return false;
    ix->nodes = malloc((size_t)total * sizeof *ix->nodes);
    uint32_t *path = malloc(((size_t)ix->max_depth + 1) * sizeof *path); /* node at each depth */
    if (!ix->nodes || !path) {
        free(path);
        return false;
    }
    ix->nodes[0] = (trie_node){0};
    uint32_t n = 1;
    path[0] = 0;
    const char *prev = NULL;
    uint32_t prev_len = 0;
    for (uint32_t i = 0; i < ix->n_trie_tokens; i++) {
        const int32_t t = ix->trie_tokens[i];
        const char *b = ix->bytes + ix->tok_off[t];
        const uint32_t len = ix->tok_off[t + 1] - ix->tok_off[t];
        uint32_t lcp = 0;
        while (prev && lcp < len && lcp < prev_len && b[lcp] == prev[lcp]) lcp++;
        for (uint32_t d = lcp + 1; d <= len; d++) {
            ix->nodes[n] = (trie_node){.depth = d, .byte = (uint8_t)b[d - 1]};
            path[d] = n++;
        }
        trie_node *end = &ix->nodes[path[len]];
        if (end->tok_count == 0) end->tok_first = i;
        end->tok_count++;
        prev = b;
        prev_len = len;
    }
    ix->n_nodes = n;
    /* Subtree sizes: a node's subtree ends where the next node at its depth or above starts. */
    uint32_t *open = path; /* reuse as a stack of node ids; depth strictly increases on it */
    uint32_t top = 0;
    for (uint32_t i = 0; i <= n; i++) {
        const uint32_t d = i < n ? ix->nodes[i].depth : 0;
        while (top > 0 && (i == n || ix->nodes[open[top - 1]].depth >= d)) {
            const uint32_t j = open[--top];
            ix->nodes[j].subtree = i - j;
        }
        if (i < n) {
            if (top > ix->max_depth) { /* cannot happen: depths are <= max_depth */
                free(path);
                return false;
            }
            open[top++] = i;
        }
    }
    free(path);
    return true;
}

constraint_index *constraint_index_new(const tokenizer *t, corral_error *err) {
    if (!t) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "constraint index: no tokenizer");
        return NULL;
    }
    const int32_t n_vocab = tok_vocab_size(t);
    constraint_index *ix = calloc(1, sizeof *ix);
    const size_t cap = tok_max_piece_len(t) + 16;
    char *piece = malloc(cap);
    if (!ix || !piece) goto oom;
    atomic_init(&ix->refs, 1);
    ix->tok = t;
    ix->n_vocab = n_vocab;
    ix->tok_off = calloc((size_t)n_vocab + 1, sizeof *ix->tok_off);
    ix->is_eog = calloc((size_t)n_vocab + 1, 1);
    ix->eog = malloc(((size_t)n_vocab + 1) * sizeof *ix->eog);
    ix->trie_tokens = malloc(((size_t)n_vocab + 1) * sizeof *ix->trie_tokens);
    if (!ix->tok_off || !ix->is_eog || !ix->eog || !ix->trie_tokens) goto oom;

    /* The bytes each token adds to the output, exactly as the generator's decoder emits them. */
    size_t used = 0, bytes_cap = 0;
    for (int32_t id = 0; id < n_vocab; id++) {
        ix->tok_off[id] = (uint32_t)used;
        if (tok_is_eog(t, id)) {
            ix->is_eog[id] = 1;
            ix->eog[ix->n_eog++] = id;
            continue;
        }
        size_t n = 0;
        if (tok_decode_piece(t, id, 0, piece, cap, &n, NULL) != CORRAL_OK) n = 0;
        if (n == 0) continue;
        if (used + n > bytes_cap) {
            size_t grown = bytes_cap ? bytes_cap * 2 : 1 << 16;
            while (grown < used + n) grown *= 2;
            char *b = realloc(ix->bytes, grown);
            if (!b) goto oom;
            ix->bytes = b;
            bytes_cap = grown;
        }
        if (used + n > UINT32_MAX) goto oom;
        memcpy(ix->bytes + used, piece, n);
        used += n;
        ix->trie_tokens[ix->n_trie_tokens++] = id;
        if (n > ix->max_depth) ix->max_depth = (uint32_t)n;
    }
    ix->tok_off[n_vocab] = (uint32_t)used;
    if (!ix->bytes && !(ix->bytes = malloc(1))) goto oom;
    free(piece);
    piece = NULL;
    sort_ctx ctx = {ix->tok_off, ix->bytes};
    qsort_r(ix->trie_tokens, ix->n_trie_tokens, sizeof *ix->trie_tokens, token_bytes_cmp, &ctx);
    if (!index_build_trie(ix)) goto oom;
    return ix;
oom:
    free(piece);
    if (ix) index_free(ix);
    corral_error_set(err, CORRAL_OUT_OF_MEMORY, "constraint index: out of memory (%d tokens)",
                     (int)n_vocab);
    return NULL;
}

void constraint_index_destroy(constraint_index **pix) {
    if (!pix || !*pix) return;
    constraint_index *ix = *pix;
    *pix = NULL;
    if (atomic_fetch_sub_explicit(&ix->refs, 1, memory_order_acq_rel) == 1) index_free(ix);
}

uint32_t constraint_index_n_nodes(const constraint_index *ix) {
    return ix ? ix->n_nodes : 0;
}

uint32_t constraint_index_n_tokens(const constraint_index *ix) {
    return ix ? ix->n_trie_tokens : 0;
}

/* ---- compiled constraints ----------------------------------------------------------------------
 */

struct constraint {
    atomic_uint refs;
    constraint_index *ix; /* a reference */
    regex_dfa dfa;
    char *pattern;            /* the regex compiled (for a JSON schema: the one it became) */
    constraint_syntax syntax; /* what the source is */
    char *source;             /* the text compiled from (== pattern for CONSTRAINT_REGEX) */
    size_t source_len;
    uint32_t words;      /* uint64 words per allowed set */
    uint64_t *bits;      /* [n_states][words], zeroed, filled lazily */
    atomic_uchar *ready; /* [n_states]: bits and n_allowed of the state are valid */
    uint32_t *n_allowed; /* [n_states] */
    int32_t *walk;       /* [max_depth + 1] DFA state per trie depth; under `lock` */
    atomic_uint n_built;
    pthread_mutex_t lock;
};

constraint *constraint_compile(constraint_index *ix, const char *pattern, size_t len,
                               corral_error *err) {
    return constraint_compile_as(ix, CONSTRAINT_REGEX, pattern, len, err);
}

/* The DFA of a generated pattern; its errors say which schema they come from. */
static corral_status compile_generated(const char *pattern, size_t len, regex_dfa *dfa,
                                       corral_error *err) {
    corral_error e = {0};
    const corral_status st = regex__compile(pattern, len, REGEX_GENERATED, dfa, NULL, &e);
    if (st != CORRAL_OK)
        corral_error_set(err, st, "json schema: the schema is too complex to compile: %s",
                         e.message);
    return st;
}

constraint *constraint_compile_as(constraint_index *ix, constraint_syntax syntax,
                                  const char *source, size_t source_len, corral_error *err) {
    if (!ix || (!source && source_len) ||
        (syntax != CONSTRAINT_REGEX && syntax != CONSTRAINT_JSON_SCHEMA)) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "constraint: no index or pattern");
        return NULL;
    }
    constraint *c = calloc(1, sizeof *c);
    if (!c) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "constraint: out of memory");
        return NULL;
    }
    char *generated = NULL;
    const char *pattern = source;
    size_t len = source_len;
    corral_status st;
    if (syntax == CONSTRAINT_JSON_SCHEMA) {
        st = json_schema_to_regex(source, source_len, &generated, &len, err);
        if (st == CORRAL_OK) st = compile_generated(generated, len, &c->dfa, err);
        pattern = generated;
    } else {
        st = regex__compile(pattern, len, 0, &c->dfa, NULL, err);
    }
    if (st != CORRAL_OK) {
        free(generated);
        free(c);
        return NULL;
    }
    c->syntax = syntax;
    c->source_len = source_len;
    c->source = malloc(source_len + 1);
    if (c->source) {
        if (source_len) memcpy(c->source, source, source_len);
        c->source[source_len] = '\0';
    }
    const uint32_t n = c->dfa.n_states;
    c->words = (uint32_t)(((uint64_t)ix->n_vocab + 63) / 64);
    const uint64_t mask_bytes = (uint64_t)n * c->words * sizeof(uint64_t);
    if (mask_bytes > CONSTRAINT_MAX_MASK_BYTES) {
        corral_error_set(err, CORRAL_RESOURCE_EXHAUSTED,
                         "regex: the pattern is too complex for this vocabulary: %u states x %d "
                         "tokens",
                         n, (int)ix->n_vocab);
        regex__free(&c->dfa);
        free(generated);
        free(c->source);
        free(c);
        return NULL;
    }
    c->pattern = malloc(len + 1);
    c->bits = calloc((size_t)n * c->words + 1, sizeof *c->bits);
    c->ready = calloc(n, sizeof *c->ready);
    c->n_allowed = calloc(n, sizeof *c->n_allowed);
    c->walk = malloc(((size_t)ix->max_depth + 1) * sizeof *c->walk);
    if (!c->pattern || !c->source || !c->bits || !c->ready || !c->n_allowed || !c->walk ||
        pthread_mutex_init(&c->lock, NULL) != 0) {
        free(generated);
        free(c->source);
        free(c->pattern);
        free(c->bits);
        free(c->ready);
        free(c->n_allowed);
        free(c->walk);
        regex__free(&c->dfa);
        free(c);
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "constraint: out of memory");
        return NULL;
    }
    if (len) memcpy(c->pattern, pattern, len);
    c->pattern[len] = '\0';
    free(generated);
    atomic_init(&c->refs, 1);
    atomic_init(&c->n_built, 0);
    atomic_fetch_add_explicit(&ix->refs, 1, memory_order_relaxed);
    c->ix = ix;
    return c;
}

constraint *constraint_ref(constraint *c) {
    if (c) atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
    return c;
}

void constraint_destroy(constraint **pc) {
    if (!pc || !*pc) return;
    constraint *c = *pc;
    *pc = NULL;
    if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1) return;
    pthread_mutex_destroy(&c->lock);
    regex__free(&c->dfa);
    free(c->pattern);
    free(c->source);
    free(c->bits);
    free(c->ready);
    free(c->n_allowed);
    free(c->walk);
    constraint_index_destroy(&c->ix);
    free(c);
}

const char *constraint_pattern(const constraint *c) {
    return c ? c->pattern : NULL;
}

constraint_syntax constraint_source_syntax(const constraint *c) {
    return c ? c->syntax : CONSTRAINT_REGEX;
}

uint32_t constraint_n_states(const constraint *c) {
    return c ? c->dfa.n_states : 0;
}

uint32_t constraint_n_masks_built(const constraint *c) {
    return c ? atomic_load_explicit(&((constraint *)c)->n_built, memory_order_relaxed) : 0;
}

int constraint_match(const constraint *c, const char *text, size_t len) {
    return c && (text || !len) && regex__match(&c->dfa, text, len);
}

/* The allowed set of DFA state s: one walk of the trie in step with the DFA (see the top of the
 * file), plus the end-of-generation tokens when s accepts. Called with c->lock held. */
static void compute_allowed(constraint *c, int32_t s) {
    const constraint_index *ix = c->ix;
    const regex_dfa *d = &c->dfa;
    uint64_t *bits = c->bits + (size_t)s * c->words;
    uint32_t count = 0;
    int32_t *walk = c->walk;
    walk[0] = s;
    const uint32_t k = d->n_classes;
    for (uint32_t i = 1; i < ix->n_nodes;) {
        const trie_node *nd = &ix->nodes[i];
        const int32_t t = d->next[(size_t)walk[nd->depth - 1] * k + d->byte_class[nd->byte]];
        if (t == REGEX_DEAD) {
            i += nd->subtree;
            continue;
        }
        walk[nd->depth] = t;
        for (uint32_t j = 0; j < nd->tok_count; j++) {
            const int32_t id = ix->trie_tokens[nd->tok_first + j];
            bits[id >> 6] |= 1ull << (id & 63);
        }
        count += nd->tok_count;
        i++;
    }
    if (d->accepting[s]) {
        for (uint32_t j = 0; j < ix->n_eog; j++) {
            const int32_t id = ix->eog[j];
            bits[id >> 6] |= 1ull << (id & 63);
        }
        count += ix->n_eog;
    }
    c->n_allowed[s] = count;
}

/* The allowed set of state s, computed on first use. */
static const uint64_t *allowed_bits(constraint *c, int32_t s) {
    if (!atomic_load_explicit(&c->ready[s], memory_order_acquire)) {
        pthread_mutex_lock(&c->lock);
        if (!atomic_load_explicit(&c->ready[s], memory_order_relaxed)) {
            compute_allowed(c, s);
            atomic_fetch_add_explicit(&c->n_built, 1, memory_order_relaxed);
            atomic_store_explicit(&c->ready[s], 1, memory_order_release);
        }
        pthread_mutex_unlock(&c->lock);
    }
    return c->bits + (size_t)s * c->words;
}

/* ---- matcher --------------------------------------------------------------------------------- */

struct constraint_matcher {
    constraint *c; /* a reference */
    int32_t state; /* DFA state, or MATCHER_DONE */
    int stuck;     /* the last mask allowed nothing */
};

constraint_matcher *constraint_matcher_new(constraint *c, corral_error *err) {
    if (!c) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "constraint matcher: no constraint");
        return NULL;
    }
    constraint_matcher *m = calloc(1, sizeof *m);
    if (!m) {
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "constraint matcher: out of memory");
        return NULL;
    }
    m->c = constraint_ref(c);
    return m;
}

void constraint_matcher_destroy(constraint_matcher **pm) {
    if (!pm || !*pm) return;
    constraint_destroy(&(*pm)->c);
    free(*pm);
    *pm = NULL;
}

void constraint_matcher_reset(constraint_matcher *m) {
    if (!m) return;
    m->state = 0;
    m->stuck = 0;
}

int constraint_matcher_allowed(const constraint_matcher *m, int32_t token) {
    const constraint *c = m->c;
    const constraint_index *ix = c->ix;
    if (m->state < 0 || token < 0 || token >= ix->n_vocab) return 0;
    if (atomic_load_explicit(&c->ready[m->state], memory_order_acquire)) {
        const uint64_t *bits = c->bits + (size_t)m->state * c->words;
        return (int)((bits[token >> 6] >> (token & 63)) & 1);
    }
    if (ix->is_eog[token]) return c->dfa.accepting[m->state];
    const uint32_t len = ix->tok_off[token + 1] - ix->tok_off[token];
    return len > 0 &&
           regex__run(&c->dfa, m->state, ix->bytes + ix->tok_off[token], len) != REGEX_DEAD;
}

void constraint_matcher_mask(constraint_matcher *m, float *logits, int32_t n_vocab) {
    constraint *c = m->c;
    const int32_t n_ix = c->ix->n_vocab;
    const int32_t n = n_vocab < n_ix ? n_vocab : n_ix;
    for (int32_t i = n; i < n_vocab; i++) logits[i] = -INFINITY;
    if (m->state < 0) {
        for (int32_t i = 0; i < n; i++) logits[i] = -INFINITY;
        return;
    }
    const uint64_t *bits = allowed_bits(c, m->state);
    m->stuck = c->n_allowed[m->state] == 0;
    for (int32_t base = 0; base < n; base += 64) {
        const uint64_t w = bits[base >> 6];
        const int32_t end = base + 64 < n ? base + 64 : n;
        if (w == ~0ull) continue;
        if (w == 0) {
            for (int32_t i = base; i < end; i++) logits[i] = -INFINITY;
            continue;
        }
        /* a mixed word: visit only the refused tokens */
        for (uint64_t refused = ~w; refused; refused &= refused - 1) {
            const int32_t i = base + __builtin_ctzll(refused);
            if (i < end) logits[i] = -INFINITY;
        }
    }
}

corral_status constraint_matcher_accept(constraint_matcher *m, int32_t token) {
    const constraint *c = m->c;
    const constraint_index *ix = c->ix;
    if (m->state < 0 || token < 0 || token >= ix->n_vocab) return CORRAL_INVALID_ARGUMENT;
    if (ix->is_eog[token]) {
        if (!c->dfa.accepting[m->state]) return CORRAL_INVALID_ARGUMENT;
        m->state = MATCHER_DONE;
        return CORRAL_OK;
    }
    const uint32_t len = ix->tok_off[token + 1] - ix->tok_off[token];
    const int32_t next =
        len ? regex__run(&c->dfa, m->state, ix->bytes + ix->tok_off[token], len) : REGEX_DEAD;
    if (next == REGEX_DEAD) return CORRAL_INVALID_ARGUMENT;
    m->state = next;
    m->stuck = 0;
    return CORRAL_OK;
}

int constraint_matcher_finished(const constraint_matcher *m) {
    if (m->state == MATCHER_DONE) return 1;
    const regex_dfa *d = &m->c->dfa;
    if (d->final[m->state]) return 1;
    if (m->stuck) return d->accepting[m->state] ? 1 : CORRAL_FAILED_PRECONDITION;
    return 0;
}

int constraint_matcher_is_accepting(const constraint_matcher *m) {
    return m->state == MATCHER_DONE || (m->state >= 0 && m->c->dfa.accepting[m->state]);
}

static int proc_allowed(void *user, int32_t token) {
    return constraint_matcher_allowed(user, token);
}

static void proc_mask(void *user, float *logits, int32_t n_vocab) {
    constraint_matcher_mask(user, logits, n_vocab);
}

static corral_status proc_accept(void *user, int32_t token) {
    return constraint_matcher_accept(user, token);
}

static int proc_finished(void *user) {
    return constraint_matcher_finished(user);
}

sampler_processor constraint_matcher_processor(constraint_matcher *m) {
    return (sampler_processor){.user = m,
                               .allowed = proc_allowed,
                               .mask = proc_mask,
                               .accept = proc_accept,
                               .finished = proc_finished};
}

/* ---- cache ----------------------------------------------------------------------------------- */

typedef struct cache_entry {
    constraint *c; /* the cache's reference; its syntax and source are the key */
} cache_entry;

struct constraint_cache {
    const tokenizer *tok;
    constraint_index *ix; /* built on the first compile */
    pthread_mutex_t lock;
    uint32_t capacity, n;
    cache_entry *entries; /* most recently used first */
    uint64_t hits, misses;
};

constraint_cache *constraint_cache_new(const tokenizer *t, uint32_t capacity, corral_error *err) {
    if (!t) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "constraint cache: no tokenizer");
        return NULL;
    }
    constraint_cache *cc = calloc(1, sizeof *cc);
    if (cc) {
        cc->tok = t;
        cc->capacity = capacity ? capacity : 64;
        cc->entries = calloc(cc->capacity, sizeof *cc->entries);
    }
    if (!cc || !cc->entries || pthread_mutex_init(&cc->lock, NULL) != 0) {
        if (cc) free(cc->entries);
        free(cc);
        corral_error_set(err, CORRAL_OUT_OF_MEMORY, "constraint cache: out of memory");
        return NULL;
    }
    return cc;
}

void constraint_cache_destroy(constraint_cache **pcc) {
    if (!pcc || !*pcc) return;
    constraint_cache *cc = *pcc;
    for (uint32_t i = 0; i < cc->n; i++) constraint_destroy(&cc->entries[i].c);
    free(cc->entries);
    constraint_index_destroy(&cc->ix);
    pthread_mutex_destroy(&cc->lock);
    free(cc);
    *pcc = NULL;
}

constraint *constraint_compile_cached(constraint_cache *cc, const char *pattern, size_t len,
                                      corral_error *err) {
    return constraint_compile_cached_as(cc, CONSTRAINT_REGEX, pattern, len, err);
}

constraint *constraint_compile_cached_as(constraint_cache *cc, constraint_syntax syntax,
                                         const char *pattern, size_t len, corral_error *err) {
    if (!cc || (!pattern && len)) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "constraint cache: no cache or pattern");
        return NULL;
    }
    pthread_mutex_lock(&cc->lock);
    constraint *found = NULL;
    for (uint32_t i = 0; i < cc->n && !found; i++) {
        cache_entry e = cc->entries[i];
        if (e.c->syntax != syntax || e.c->source_len != len ||
            (len && memcmp(e.c->source, pattern, len) != 0))
            continue;
        memmove(&cc->entries[1], &cc->entries[0], i * sizeof *cc->entries);
        cc->entries[0] = e;
        found = constraint_ref(e.c);
        cc->hits++;
    }
    if (!found) {
        if (!cc->ix) cc->ix = constraint_index_new(cc->tok, err);
        constraint *c = cc->ix ? constraint_compile_as(cc->ix, syntax, pattern, len, err) : NULL;
        if (c) {
            cc->misses++;
            if (cc->n == cc->capacity) constraint_destroy(&cc->entries[--cc->n].c);
            memmove(&cc->entries[1], &cc->entries[0], cc->n * sizeof *cc->entries);
            cc->entries[0] = (cache_entry){.c = c};
            cc->n++;
            found = constraint_ref(c);
        }
    }
    pthread_mutex_unlock(&cc->lock);
    return found;
}

void constraint_cache_stats(const constraint_cache *cc, uint64_t *hits, uint64_t *misses) {
    constraint_cache *m = (constraint_cache *)cc;
    pthread_mutex_lock(&m->lock);
    if (hits) *hits = m->hits;
    if (misses) *misses = m->misses;
    pthread_mutex_unlock(&m->lock);
}
