/*
 * sampler.c — the sampler chain of sampler.h: penalties, processor hook, greedy or
 * top-k → softmax → top-p → min-p → temperature → seeded draw.
 *
 * Everything a step needs is allocated once in sampler_new: a candidate array of n_vocab entries
 * (sorted in place by a heap selection, so no qsort and none of the temporary buffers glibc's
 * qsort may allocate; for a small top-k the k best are picked straight from the logits, which
 * matters for large vocabularies and for the second draw of a constrained step), the per-token
 * counts and "already penalised" stamps, and the ring of the last penalty_last_n accepted
 * tokens. Probabilities are computed in double from logits shifted by the maximum, so that
 * +/-large logits and small temperatures neither overflow nor lose the order of the candidates.
 */
#include "corral/sampler.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct sampler_cand {
    float logit;
    int32_t id;
    double p; /* probability, later the draw weight */
} sampler_cand;

struct sampler {
    sampler_params params;
    int32_t n_vocab;
    sampler_processor proc;
    uint64_t rng[4]; /* xoshiro256** state */

    sampler_cand *cand; /* [n_vocab] scratch for one step */
    int32_t *counts;    /* [n_vocab] occurrences of each token in the penalty window */
    uint32_t *stamp;    /* [n_vocab] == stamp_now: token already penalised this step */
    uint32_t stamp_now;
    int32_t *ring;     /* [penalty_last_n] the window, oldest at ring_head when full */
    int32_t ring_len;  /* tokens in the window */
    int32_t ring_head; /* next slot to write */
};

/* ---- parameters ---------------------------------------------------------------------------- */

sampler_params sampler_params_default(void) {
    return (sampler_params){
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .penalty_last_n = 64,
        .seed = 0,
    };
}

corral_status sampler_validate_params(const sampler_params *p, corral_error *err) {
    if (!p) return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "sampler params missing");
    /* NaN and infinity first: every range test below is false for NaN. */
    const struct {
        const char *name;
        float value;
    } floats[] = {
        {"temperature", p->temperature},
        {"top_p", p->top_p},
        {"min_p", p->min_p},
        {"repeat_penalty", p->repeat_penalty},
        {"presence_penalty", p->presence_penalty},
        {"frequency_penalty", p->frequency_penalty},
    };
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
        if (!isfinite(floats[i].value)) {
            return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                    "%s must be a finite number, got %g", floats[i].name,
                                    (double)floats[i].value);
        }
    }
    if (p->temperature < 0.0f) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "temperature must be >= 0, got %g",
                                (double)p->temperature);
    }
    if (p->top_k < 0) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "top_k must be >= 0, got %d",
                                (int)p->top_k);
    }
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "top_p must be in (0, 1], got %g",
                                (double)p->top_p);
    }
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "min_p must be in [0, 1], got %g",
                                (double)p->min_p);
    }
    if (!(p->repeat_penalty > 0.0f)) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT, "repeat_penalty must be > 0, got %g",
                                (double)p->repeat_penalty);
    }
    if (p->penalty_last_n < 0 || p->penalty_last_n > SAMPLER_MAX_PENALTY_LAST_N) {
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "penalty_last_n must be in [0, %d], got %d",
                                SAMPLER_MAX_PENALTY_LAST_N, (int)p->penalty_last_n);
    }
    return CORRAL_OK;
}

/* ---- random numbers -------------------------------------------------------------------------- */

/* splitmix64 spreads one 64-bit seed over xoshiro's 256-bit state (its authors' advice: an
 * all-zero state would be a fixed point, and nearby seeds must give unrelated streams). */
static uint64_t splitmix64_next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t s[4]) {
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(sampler *s) {
    return (double)(xoshiro_next(s->rng) >> 11) * 0x1.0p-53;
}

static void rng_seed(sampler *s) {
    uint64_t x = s->params.seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64_next(&x);
}

/* ---- lifetime -------------------------------------------------------------------------------- */

sampler *sampler_new(const sampler_params *params, int32_t n_vocab, corral_error *err) {
    if (sampler_validate_params(params, err) != CORRAL_OK) return NULL;
    if (n_vocab < 1 || n_vocab > SAMPLER_MAX_VOCAB) {
        corral_error_set(err, CORRAL_INVALID_ARGUMENT, "n_vocab must be in [1, %d], got %d",
                         SAMPLER_MAX_VOCAB, (int)n_vocab);
        return NULL;
    }
    sampler *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->params = *params;
    s->n_vocab = n_vocab;
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
    s->stamp = calloc((size_t)n_vocab, sizeof *s->stamp);
    /* One slot even for a zero window keeps the ring code free of special cases. */
    size_t ring_slots = params->penalty_last_n > 0 ? (size_t)params->penalty_last_n : 1;
    s->ring = malloc(ring_slots * sizeof *s->ring);
    if (!s->cand || !s->counts || !s->stamp || !s->ring) goto oom;
    sampler_reset(s);
    return s;
oom:
    sampler_destroy(&s);
    corral_error_set(err, CORRAL_OUT_OF_MEMORY, "sampler for %d tokens: out of memory",
                     (int)n_vocab);
    return NULL;
}

void sampler_destroy(sampler **sp) {
    if (!sp || !*sp) return;
    sampler *s = *sp;
    free(s->cand);
    free(s->counts);
    free(s->stamp);
    free(s->ring);
    free(s);
    *sp = NULL;
}

void sampler_set_processor(sampler *s, const sampler_processor *processor) {
    if (!s) return;
    if (processor) {
        s->proc = *processor;
    } else {
        memset(&s->proc, 0, sizeof s->proc);
    }
}

void sampler_reset(sampler *s) {
    if (!s) return;
    memset(s->counts, 0, (size_t)s->n_vocab * sizeof *s->counts);
    s->ring_len = 0;
    s->ring_head = 0;
    rng_seed(s);
}

corral_status sampler_accept(sampler *s, int32_t token) {
    if (!s || token < 0 || token >= s->n_vocab) return CORRAL_INVALID_ARGUMENT;
    if (s->proc.accept) {
        corral_status st = s->proc.accept(s->proc.user, token);
        if (st != CORRAL_OK) return st;
    }
    int32_t cap = s->params.penalty_last_n;
    if (cap == 0) return CORRAL_OK;
    if (s->ring_len == cap) {
        s->counts[s->ring[s->ring_head]]--; /* the oldest token leaves the window */
    } else {
        s->ring_len++;
    }
    s->ring[s->ring_head] = token;
    s->counts[token]++;
    s->ring_head = s->ring_head + 1 == cap ? 0 : s->ring_head + 1;
    return CORRAL_OK;
}

int sampler_finished(const sampler *s) {
    if (!s || !s->proc.finished) return 0;
    return s->proc.finished(s->proc.user);
}

/* ---- the chain ------------------------------------------------------------------------------- */

/* NaN can never be chosen; +inf must stay the largest value yet keep arithmetic finite. */
static void sanitize_logits(float *logits, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        if (isnan(logits[i])) {
            logits[i] = -INFINITY;
        } else if (logits[i] == INFINITY) {
            logits[i] = FLT_MAX;
        }
    }
}

/* Each distinct token of the window is penalised once, with its count; the stamps say which
 * tokens were already done this step without clearing an n_vocab array every time. */
static void apply_penalties(sampler *s, float *logits) {
    const sampler_params *p = &s->params;
    if (s->ring_len == 0) return;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) {
        return;
    }
    if (++s->stamp_now == 0) { /* wrapped: old stamps could collide */
        memset(s->stamp, 0, (size_t)s->n_vocab * sizeof *s->stamp);
        s->stamp_now = 1;
    }
    for (int32_t i = 0; i < s->ring_len; i++) {
        int32_t t = s->ring[i];
        if (s->stamp[t] == s->stamp_now) continue;
        s->stamp[t] = s->stamp_now;
        float x = logits[t];
        x = x <= 0.0f ? x * p->repeat_penalty : x / p->repeat_penalty;
        x -= (float)s->counts[t] * p->frequency_penalty + p->presence_penalty;
        logits[t] = x;
    }
}

/* Greedy: the largest logit, lowest id on ties. -1 when every logit is -inf. */
static int32_t argmax_logits(const float *logits, int32_t n) {
    int32_t best = -1;
    float best_logit = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        if (logits[i] > best_logit) {
            best_logit = logits[i];
            best = i;
        }
    }
    return best;
}

/* Candidate order: larger logit first, then lower id, so that top-k's first entry is exactly the
 * greedy token. */
static bool cand_before(const sampler_cand *a, const sampler_cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static void heap_sift_down(sampler_cand *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, top = i;
        if (l < n && cand_before(&h[l], &h[top])) top = l;
        if (r < n && cand_before(&h[r], &h[top])) top = r;
        if (top == i) return;
        sampler_cand t = h[i];
        h[i] = h[top];
        h[top] = t;
        i = top;
    }
}

/* The heap of select_top_k_small: the WORST kept candidate at the root. */
static void worst_heap_sift_down(sampler_cand *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, top = i;
        if (l < n && cand_before(&h[top], &h[l])) top = l;
        if (r < n && cand_before(&h[top], &h[r])) top = r;
        if (top == i) return;
        sampler_cand t = h[i];
        h[i] = h[top];
        h[top] = t;
        i = top;
    }
}

/* top-k straight from the logits, for a small k: the k best candidates go into a heap at
 * c[0..k) whose root is the worst kept one, so most logits cost one comparison and nothing is
 * written for them (building all n candidates first costs more than the selection). *count gets
 * the number of finite logits. When it exceeds k, c[0..k) ends sorted best-first — exactly what
 * select_top_k gives, cand_before being a total order — and k is returned; otherwise the caller
 * must build the candidates the usual way (the result then depends on top-p's sorting rule). */
static int32_t top_k_from_logits(sampler *s, const float *logits, int32_t k, int32_t *count) {
    sampler_cand *c = s->cand;
    int32_t m = 0, finite = 0;
    for (int32_t i = 0; i < s->n_vocab; i++) {
        if (logits[i] == -INFINITY) continue;
        finite++;
        const sampler_cand x = {.logit = logits[i], .id = i};
        if (m < k) {
            c[m++] = x;
            if (m == k)
                for (int32_t j = k / 2 - 1; j >= 0; j--) worst_heap_sift_down(c, k, j);
        } else if (cand_before(&x, &c[0])) {
            c[0] = x;
            worst_heap_sift_down(c, k, 0);
        }
    }
    *count = finite;
    if (finite <= k) return 0;
    for (int32_t last = k - 1; last > 0; last--) {
        sampler_cand t = c[0];
        c[0] = c[last];
        c[last] = t;
        worst_heap_sift_down(c, last, 0);
    }
    return k;
}

/* Put the first k candidates in order at c[n-k .. n) reversed, then flip them to the front of
 * that range. A heap selection: O(n + k log n), in place, no allocation. Returns the start of
 * the sorted k. */
static sampler_cand *select_top_k(sampler_cand *c, int32_t n, int32_t k) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) heap_sift_down(c, n, i);
    for (int32_t popped = 0; popped < k; popped++) {
        int32_t last = n - 1 - popped;
        sampler_cand t = c[0];
        c[0] = c[last];
        c[last] = t;
        heap_sift_down(c, last, 0);
    }
    sampler_cand *top = c + (n - k);
    for (int32_t i = 0, j = k - 1; i < j; i++, j--) {
        sampler_cand t = top[i];
        top[i] = top[j];
        top[j] = t;
    }
    return top;
}

/* The stochastic path. Returns a token, or -1 when every logit is -inf. */
static int32_t draw_token(sampler *s, const float *logits) {
    const sampler_params *p = &s->params;
    sampler_cand *c = s->cand;
    int32_t n = 0, finite = 0;
    bool sorted = false;
    if (p->top_k > 0 && p->top_k <= 256 && p->top_k < s->n_vocab / 8 &&
        top_k_from_logits(s, logits, p->top_k, &finite) > 0) {
        n = p->top_k; /* c[0..n) sorted: the common case, top-k of a large vocabulary */
        sorted = true;
    } else {
        for (int32_t i = 0; i < s->n_vocab; i++) {
            if (logits[i] == -INFINITY) continue; /* probability 0 whatever the chain does */
            c[n++] = (sampler_cand){.logit = logits[i], .id = i};
        }
        if (n == 0) return -1;

        /* top-k, and the full order that top-p needs. */
        int32_t k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
        if (k < n || p->top_p < 1.0f) {
            c = select_top_k(c, n, k);
            n = k;
            sorted = true;
        }
    }

    /* softmax */
    float max_logit = c[0].logit;
    if (!sorted) {
        for (int32_t i = 1; i < n; i++) max_logit = c[i].logit > max_logit ? c[i].logit : max_logit;
    }
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        c[i].p = exp((double)c[i].logit - (double)max_logit);
        sum += c[i].p;
    }
    for (int32_t i = 0; i < n; i++) c[i].p /= sum;

    /* top-p: the shortest sorted prefix whose probability reaches top_p (at least one token). */
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        for (int32_t i = 0; i < n; i++) {
            cum += c[i].p;
            if (cum >= (double)p->top_p) {
                n = i + 1;
                break;
            }
        }
    }

    /* min-p: keep what is at least min_p times as likely as the most likely token (which is
     * kept, since min_p <= 1). */
    if (p->min_p > 0.0f) {
        double p_max = 1.0 / sum; /* the max logit's weight was exp(0) */
        double threshold = (double)p->min_p * p_max;
        int32_t kept = 0;
        for (int32_t i = 0; i < n; i++) {
            if (c[i].p >= threshold) c[kept++] = c[i];
        }
        n = kept;
    }

    /* temperature, then the draw: weights exp((l - max) / T) over what is left. */
    double t = (double)p->temperature;
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) {
        c[i].p = exp(((double)c[i].logit - (double)max_logit) / t);
        total += c[i].p;
    }
    double u = rng_uniform(s) * total;
    double acc = 0.0;
    int32_t last_positive = -1; /* set at least once: the max has weight exactly 1 */
    for (int32_t i = 0; i < n; i++) {
        if (c[i].p <= 0.0) continue;
        acc += c[i].p;
        last_positive = c[i].id;
        if (u < acc) return c[i].id;
    }
    return last_positive; /* rounding left u just above the last partial sum */
}

static int32_t pick_token(sampler *s, const float *logits) {
    if (s->params.temperature <= 0.0f) return argmax_logits(logits, s->n_vocab);
    return draw_token(s, logits);
}

/* The mask for a processor that only has `allowed`. */
static void mask_from_allowed(sampler *s, float *logits) {
    for (int32_t i = 0; i < s->n_vocab; i++) {
        if (!s->proc.allowed(s->proc.user, i)) logits[i] = -INFINITY;
    }
}

int32_t sampler_sample(sampler *s, float *logits) {
    if (!s || !logits) return CORRAL_INVALID_ARGUMENT;
    const sampler_processor *proc = &s->proc;

    apply_penalties(s, logits);
    if (proc->apply) proc->apply(proc->user, logits, s->n_vocab);
    bool eager_mask = proc->mask && !proc->allowed;
    if (eager_mask) proc->mask(proc->user, logits, s->n_vocab);
    sanitize_logits(logits, s->n_vocab);

    int32_t token = pick_token(s, logits);
    if (token < 0) return CORRAL_FAILED_PRECONDITION;
    if (!proc->allowed || proc->allowed(proc->user, token)) return token;

    /* The draw was rejected: mask everything that is not allowed and draw again. */
    if (proc->mask) {
        proc->mask(proc->user, logits, s->n_vocab);
    } else {
        mask_from_allowed(s, logits);
    }
    sanitize_logits(logits, s->n_vocab);
    token = pick_token(s, logits);
    if (token < 0) return CORRAL_FAILED_PRECONDITION;
    if (!proc->allowed(proc->user, token)) return CORRAL_INTERNAL;
    return token;
}
