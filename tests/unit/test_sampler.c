/*
 * test_sampler.c — Check suite for the sampler chain (engine/include/corral/sampler.h).
 *
 * Expected values come from independent computations in this file: argmax and softmax written
 * here in double, probability sets chosen by construction (logits = log of known probabilities),
 * penalties worked out by hand. Statistical checks use a fixed seed, so they are deterministic;
 * their tolerances are about six standard deviations of the sampling error.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "corral/sampler.h"
#include "testutil.h"

/* The test's own generator for logits, independent of the sampler's. */
static uint32_t test_rand_state = 12345u;
static float test_rand_logit(void) {
    test_rand_state = test_rand_state * 1664525u + 1013904223u;
    return (float)((test_rand_state >> 8) % 2000) / 200.0f - 5.0f; /* [-5, 5), many ties */
}

/* Plain sampling: temperature 1, every filter and penalty off. */
static sampler_params plain_params(uint64_t seed) {
    sampler_params p = sampler_params_default();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.penalty_last_n = 0;
    p.seed = seed;
    return p;
}

static sampler *make_sampler(const sampler_params *p, int32_t n_vocab) {
    corral_error err;
    sampler *s = sampler_new(p, n_vocab, &err);
    ck_assert_msg(s != NULL, "sampler_new: %s", err.message);
    return s;
}

static int32_t ref_argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++) {
        if (x[i] > x[best]) best = i;
    }
    return best;
}

/* Draw `draws` tokens from a copy of `logits` each time; count them. */
static void count_draws(sampler *s, const float *logits, int32_t n, int draws, int *counts) {
    float work[64];
    ck_assert_int_le(n, 64);
    memset(counts, 0, (size_t)n * sizeof *counts);
    for (int d = 0; d < draws; d++) {
        memcpy(work, logits, (size_t)n * sizeof *work);
        int32_t t = sampler_sample(s, work);
        ck_assert_int_ge(t, 0);
        ck_assert_int_lt(t, n);
        counts[t]++;
    }
}

/* ---- core ------------------------------------------------------------------------------------ */

START_TEST(test_same_seed_same_sequence) {
    enum { V = 50, STEPS = 1000 };
    sampler_params p = sampler_params_default(); /* the full default chain */
    p.seed = 0xC0FFEE;
    p.repeat_penalty = 1.1f;
    p.presence_penalty = 0.2f;
    sampler *a = make_sampler(&p, V);
    sampler *b = make_sampler(&p, V);
    static int32_t first[STEPS];
    test_rand_state = 7;
    for (int i = 0; i < STEPS; i++) {
        float la[V], lb[V];
        for (int j = 0; j < V; j++) la[j] = lb[j] = test_rand_logit() * 0.3f;
        int32_t ta = sampler_sample(a, la), tb = sampler_sample(b, lb);
        ck_assert_int_ge(ta, 0);
        ck_assert_int_eq(ta, tb);
        sampler_accept(a, ta);
        sampler_accept(b, tb);
        first[i] = ta;
    }
    /* reset makes it a new sampler again: the same sequence once more. */
    sampler_reset(a);
    test_rand_state = 7;
    for (int i = 0; i < STEPS; i++) {
        float la[V];
        for (int j = 0; j < V; j++) la[j] = test_rand_logit() * 0.3f;
        int32_t t = sampler_sample(a, la);
        ck_assert_int_eq(t, first[i]);
        sampler_accept(a, t);
    }
    sampler_destroy(&a);
    sampler_destroy(&b);
    ck_assert_ptr_null(a);
}
END_TEST

START_TEST(test_different_seeds_differ) {
    enum { V = 64, STEPS = 1000 };
    sampler_params p1 = plain_params(1), p2 = plain_params(2);
    sampler *a = make_sampler(&p1, V);
    sampler *b = make_sampler(&p2, V);
    float flat[V] = {0};
    int differ = 0;
    for (int i = 0; i < STEPS; i++) {
        float la[V], lb[V];
        memcpy(la, flat, sizeof la);
        memcpy(lb, flat, sizeof lb);
        differ += sampler_sample(a, la) != sampler_sample(b, lb);
    }
    /* Independent uniform draws over 64 tokens agree 1 time in 64. */
    ck_assert_int_gt(differ, 900);
    sampler_destroy(&a);
    sampler_destroy(&b);
}
END_TEST

START_TEST(test_greedy_picks_argmax) {
    sampler_params p = plain_params(3);
    p.temperature = 0.0f;
    sampler *s = make_sampler(&p, 6);
    float l1[6] = {0.1f, 2.5f, -3.0f, 2.4f, 1.0f, 0.0f};
    ck_assert_int_eq(sampler_sample(s, l1), 1);
    float l2[6] = {0.1f, 2.5f, -3.0f, 2.5f, 1.0f, 2.5f}; /* ties: lowest id */
    ck_assert_int_eq(sampler_sample(s, l2), 1);
    float l3[6] = {-1e30f, -1e30f, -1e30f, -1e30f, -1e30f, -1e29f};
    ck_assert_int_eq(sampler_sample(s, l3), 5);
    test_rand_state = 99;
    for (int trial = 0; trial < 200; trial++) {
        float l[6], copy[6];
        for (int j = 0; j < 6; j++) l[j] = copy[j] = test_rand_logit();
        ck_assert_int_eq(sampler_sample(s, l), ref_argmax(copy, 6));
    }
    sampler_destroy(&s);
}
END_TEST

START_TEST(test_top_k_1_equals_greedy) {
    enum { V = 40 };
    sampler_params g = plain_params(5);
    g.temperature = 0.0f;
    sampler_params k1 = sampler_params_default();
    k1.top_k = 1;
    k1.temperature = 1.7f;
    k1.seed = 77;
    sampler *sg = make_sampler(&g, V);
    sampler *sk = make_sampler(&k1, V);
    test_rand_state = 4242;
    for (int trial = 0; trial < 500; trial++) {
        float lg[V], lk[V], ref[V];
        for (int j = 0; j < V; j++) lg[j] = lk[j] = ref[j] = test_rand_logit();
        int32_t want = ref_argmax(ref, V);
        ck_assert_int_eq(sampler_sample(sg, lg), want);
        ck_assert_int_eq(sampler_sample(sk, lk), want);
    }
    sampler_destroy(&sg);
    sampler_destroy(&sk);
}
END_TEST

/* Frequencies of 100k draws against softmax(logits / T) computed here in double. */
static void check_distribution(float temperature) {
    enum { V = 5, DRAWS = 100000 };
    const float logits[V] = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f};
    double want[V], sum = 0.0;
    for (int i = 0; i < V; i++) sum += want[i] = exp((double)logits[i] / temperature);
    for (int i = 0; i < V; i++) want[i] /= sum;
    sampler_params p = plain_params(20240601);
    p.temperature = temperature;
    sampler *s = make_sampler(&p, V);
    int counts[V];
    count_draws(s, logits, V, DRAWS, counts);
    for (int i = 0; i < V; i++) {
        double got = (double)counts[i] / DRAWS;
        ck_assert_msg(fabs(got - want[i]) < 0.01, "T=%g token %d: frequency %.4f, softmax %.4f",
                      (double)temperature, i, got, want[i]);
    }
    sampler_destroy(&s);
}

START_TEST(test_distribution_matches_softmax) {
    check_distribution(1.0f);
    check_distribution(0.5f);
    check_distribution(2.0f);
}
END_TEST

/* Logits = log of these probabilities, so every filter's set is known. */
static const float known_p[4] = {0.5f, 0.3f, 0.15f, 0.05f};

static void check_kept_set(sampler_params p, const int *expect_kept) {
    float logits[4];
    for (int i = 0; i < 4; i++) logits[i] = logf(known_p[i]);
    sampler *s = make_sampler(&p, 4);
    int counts[4];
    count_draws(s, logits, 4, 4000, counts);
    double kept_mass = 0.0;
    for (int i = 0; i < 4; i++) kept_mass += expect_kept[i] ? known_p[i] : 0.0;
    for (int i = 0; i < 4; i++) {
        if (!expect_kept[i]) {
            ck_assert_msg(counts[i] == 0, "token %d should be filtered out, drawn %d times", i,
                          counts[i]);
        } else {
            double want = known_p[i] / kept_mass, got = counts[i] / 4000.0;
            ck_assert_msg(fabs(got - want) < 0.05, "token %d: frequency %.3f, expected %.3f", i,
                          got, want);
        }
    }
    sampler_destroy(&s);
}

START_TEST(test_top_p_keeps_smallest_prefix) {
    sampler_params p = plain_params(11);
    p.top_p = 0.75f; /* 0.5 < 0.75 <= 0.8 */
    check_kept_set(p, (const int[]){1, 1, 0, 0});
    p.top_p = 0.85f; /* 0.8 < 0.85 <= 0.95 */
    check_kept_set(p, (const int[]){1, 1, 1, 0});
    p.top_p = 0.4f; /* the first token alone reaches it */
    check_kept_set(p, (const int[]){1, 0, 0, 0});
    p.top_p = 1.0f;
    check_kept_set(p, (const int[]){1, 1, 1, 1});
}
END_TEST

START_TEST(test_min_p_keeps_relative_threshold) {
    sampler_params p = plain_params(12);
    p.min_p = 0.2f; /* threshold 0.1: keeps 0.5, 0.3, 0.15 */
    check_kept_set(p, (const int[]){1, 1, 1, 0});
    p.min_p = 0.35f; /* threshold 0.175: keeps 0.5, 0.3 */
    check_kept_set(p, (const int[]){1, 1, 0, 0});
    p.min_p = 1.0f; /* only the most likely */
    check_kept_set(p, (const int[]){1, 0, 0, 0});
}
END_TEST

START_TEST(test_top_k_keeps_k_best) {
    sampler_params p = plain_params(13);
    p.top_k = 2;
    check_kept_set(p, (const int[]){1, 1, 0, 0});
    p.top_k = 3;
    p.top_p = 0.75f; /* top-p after top-k: renormalised over 0.95, 0.5/0.95 < 0.75 */
    check_kept_set(p, (const int[]){1, 1, 0, 0});
    p.top_k = 100; /* more than the vocabulary: everything */
    p.top_p = 1.0f;
    check_kept_set(p, (const int[]){1, 1, 1, 1});
}
END_TEST

START_TEST(test_penalties_hand_computed) {
    sampler_params p = plain_params(14);
    p.temperature = 0.0f;
    p.repeat_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.penalty_last_n = 3;
    sampler *s = make_sampler(&p, 4);
    ck_assert_int_eq(sampler_accept(s, 0), CORRAL_OK);
    ck_assert_int_eq(sampler_accept(s, 0), CORRAL_OK);
    ck_assert_int_eq(sampler_accept(s, 1), CORRAL_OK);
    float l[4] = {2.0f, -1.0f, 0.5f, 1.0f};
    /* token 0: 2 / 2 - (2 * 0.25 + 0.5) = 0; token 1: -1 * 2 - (1 * 0.25 + 0.5) = -2.75 */
    ck_assert_int_eq(sampler_sample(s, l), 3);
    ck_assert_float_eq_tol(l[0], 0.0f, 1e-6f);
    ck_assert_float_eq_tol(l[1], -2.75f, 1e-6f);
    ck_assert_float_eq_tol(l[2], 0.5f, 1e-6f);
    ck_assert_float_eq_tol(l[3], 1.0f, 1e-6f);

    /* The window slides: accepting 2 pushes the oldest 0 out, leaving 0, 1, 2 once each. */
    sampler_accept(s, 2);
    float m[4] = {2.0f, -1.0f, 0.5f, 1.0f};
    sampler_sample(s, m);
    ck_assert_float_eq_tol(m[0], 2.0f / 2.0f - 0.75f, 1e-6f);
    ck_assert_float_eq_tol(m[1], -2.0f - 0.75f, 1e-6f);
    ck_assert_float_eq_tol(m[2], 0.25f - 0.75f, 1e-6f);
    ck_assert_float_eq_tol(m[3], 1.0f, 1e-6f);

    /* reset forgets the window */
    sampler_reset(s);
    float r[4] = {2.0f, -1.0f, 0.5f, 1.0f};
    ck_assert_int_eq(sampler_sample(s, r), 0);
    ck_assert_float_eq(r[0], 2.0f);
    ck_assert_float_eq(r[1], -1.0f);
    sampler_destroy(&s);
}
END_TEST

START_TEST(test_penalty_window_zero_is_off) {
    sampler_params p = plain_params(15);
    p.temperature = 0.0f;
    p.repeat_penalty = 10.0f;
    p.presence_penalty = 5.0f;
    p.penalty_last_n = 0;
    sampler *s = make_sampler(&p, 3);
    for (int i = 0; i < 10; i++) ck_assert_int_eq(sampler_accept(s, 0), CORRAL_OK);
    float l[3] = {1.0f, 0.5f, 0.0f};
    ck_assert_int_eq(sampler_sample(s, l), 0);
    ck_assert_float_eq(l[0], 1.0f);
    sampler_destroy(&s);
}
END_TEST

/* ---- processor hook -------------------------------------------------------------------------- */

typedef struct test_constraint {
    int32_t forbidden[8]; /* tokens not allowed */
    int n_forbidden;
    int allowed_calls, mask_calls, apply_calls;
    int32_t bias_token; /* apply: +10 to this token when >= 0 */
} test_constraint;

static int tc_allowed(void *user, int32_t token) {
    test_constraint *c = user;
    c->allowed_calls++;
    for (int i = 0; i < c->n_forbidden; i++) {
        if (c->forbidden[i] == token) return 0;
    }
    return 1;
}

static void tc_mask(void *user, float *logits, int32_t n_vocab) {
    test_constraint *c = user;
    c->mask_calls++;
    for (int i = 0; i < c->n_forbidden; i++) {
        if (c->forbidden[i] < n_vocab) logits[c->forbidden[i]] = -INFINITY;
    }
}

static void tc_mask_all(void *user, float *logits, int32_t n_vocab) {
    test_constraint *c = user;
    c->mask_calls++;
    for (int32_t i = 0; i < n_vocab; i++) logits[i] = -INFINITY;
}

static void tc_mask_nothing(void *user, float *logits, int32_t n_vocab) {
    (void)logits;
    (void)n_vocab;
    ((test_constraint *)user)->mask_calls++;
}

static int tc_allow_none(void *user, int32_t token) {
    (void)token;
    ((test_constraint *)user)->allowed_calls++;
    return 0;
}

static void tc_apply(void *user, float *logits, int32_t n_vocab) {
    test_constraint *c = user;
    c->apply_calls++;
    if (c->bias_token >= 0 && c->bias_token < n_vocab) logits[c->bias_token] += 10.0f;
}

START_TEST(test_processor_draw_first_then_mask) {
    sampler_params p = plain_params(21);
    p.temperature = 0.0f;
    sampler *s = make_sampler(&p, 5);
    test_constraint c = {.forbidden = {4}, .n_forbidden = 1, .bias_token = -1};
    sampler_set_processor(s,
                          &(sampler_processor){.user = &c, .allowed = tc_allowed, .mask = tc_mask});

    /* The argmax (1) is allowed: one check, no mask computed. */
    float l1[5] = {0.0f, 3.0f, 1.0f, 2.0f, -1.0f};
    ck_assert_int_eq(sampler_sample(s, l1), 1);
    ck_assert_int_eq(c.allowed_calls, 1);
    ck_assert_int_eq(c.mask_calls, 0);

    /* The argmax (4) is forbidden: the mask is computed once and the next best chosen. */
    float l2[5] = {0.0f, 1.0f, 2.0f, 3.0f, 5.0f};
    ck_assert_int_eq(sampler_sample(s, l2), 3);
    ck_assert_int_eq(c.mask_calls, 1);
    ck_assert(isinf(l2[4]) && l2[4] < 0); /* the masked logits are left in the buffer */
    sampler_destroy(&s);
}
END_TEST

START_TEST(test_processor_draw_first_keeps_distribution) {
    /* Draw-first then redraw gives an allowed token with probability p / P(allowed). */
    enum { V = 4, DRAWS = 40000 };
    const float logits[V] = {0.0f, 1.0f, 0.5f, 1.5f};
    sampler_params p = plain_params(22);
    sampler *s = make_sampler(&p, V);
    test_constraint c = {.forbidden = {3}, .n_forbidden = 1, .bias_token = -1};
    sampler_set_processor(s,
                          &(sampler_processor){.user = &c, .allowed = tc_allowed, .mask = tc_mask});
    int counts[V];
    count_draws(s, logits, V, DRAWS, counts);
    ck_assert_int_eq(counts[3], 0);
    double sum = 0.0;
    for (int i = 0; i < 3; i++) sum += exp((double)logits[i]);
    for (int i = 0; i < 3; i++) {
        double want = exp((double)logits[i]) / sum, got = (double)counts[i] / DRAWS;
        ck_assert_msg(fabs(got - want) < 0.015, "token %d: %.4f vs %.4f", i, got, want);
    }
    /* The mask ran only for the rejected draws (token 3 has probability ~0.41). */
    ck_assert_int_gt(c.mask_calls, DRAWS / 4);
    ck_assert_int_lt(c.mask_calls, DRAWS / 2);
    sampler_destroy(&s);
}
END_TEST

START_TEST(test_processor_full_mask_path) {
    /* mask without allowed: applied on every step before the draw. */
    enum { V = 6 };
    sampler_params p = plain_params(23);
    sampler *s = make_sampler(&p, V);
    test_constraint c = {.forbidden = {0, 2, 5}, .n_forbidden = 3, .bias_token = -1};
    sampler_set_processor(s, &(sampler_processor){.user = &c, .mask = tc_mask});
    const float logits[V] = {3.0f, 0.0f, 3.0f, 0.1f, 0.2f, 3.0f};
    int counts[V];
    count_draws(s, logits, V, 1000, counts);
    ck_assert_int_eq(counts[0] + counts[2] + counts[5], 0);
    ck_assert_int_gt(counts[1], 0);
    ck_assert_int_gt(counts[3], 0);
    ck_assert_int_gt(counts[4], 0);
    ck_assert_int_eq(c.mask_calls, 1000);

    /* allowed without mask: the sampler asks about every token after a rejected draw. */
    test_constraint d = {.forbidden = {0}, .n_forbidden = 1, .bias_token = -1};
    sampler_set_processor(s, &(sampler_processor){.user = &d, .allowed = tc_allowed});
    sampler_params g = plain_params(24);
    g.temperature = 0.0f;
    sampler *sg = make_sampler(&g, V);
    sampler_set_processor(sg, &(sampler_processor){.user = &d, .allowed = tc_allowed});
    float l[V] = {9.0f, 0.0f, 1.0f, 2.0f, 0.5f, 0.0f};
    ck_assert_int_eq(sampler_sample(sg, l), 3);
    ck_assert_int_eq(d.allowed_calls, 1 + V + 1); /* the draw, the mask, the redraw */

    /* removing the processor */
    sampler_set_processor(sg, NULL);
    float l2[V] = {9.0f, 0.0f, 1.0f, 2.0f, 0.5f, 0.0f};
    ck_assert_int_eq(sampler_sample(sg, l2), 0);
    sampler_destroy(&s);
    sampler_destroy(&sg);
}
END_TEST

START_TEST(test_processor_apply_hook) {
    sampler_params p = plain_params(25);
    p.temperature = 0.0f;
    sampler *s = make_sampler(&p, 4);
    test_constraint c = {.bias_token = 2};
    sampler_set_processor(s, &(sampler_processor){.user = &c, .apply = tc_apply});
    float l[4] = {5.0f, 1.0f, 0.0f, 4.0f};
    ck_assert_int_eq(sampler_sample(s, l), 2);
    ck_assert_float_eq(l[2], 10.0f);
    ck_assert_int_eq(c.apply_calls, 1);
    sampler_destroy(&s);
}
END_TEST

START_TEST(test_processor_all_masked_is_error) {
    sampler_params p = plain_params(26);
    sampler *s = make_sampler(&p, 5);
    test_constraint c = {.forbidden = {1}, .n_forbidden = 1, .bias_token = -1};
    /* draw-first, then a mask that leaves nothing */
    sampler_set_processor(
        s, &(sampler_processor){.user = &c, .allowed = tc_allowed, .mask = tc_mask_all});
    float l[5] = {0.0f, 50.0f, 0.0f, 0.0f, 0.0f}; /* token 1 is drawn, rejected */
    ck_assert_int_eq(sampler_sample(s, l), CORRAL_FAILED_PRECONDITION);
    ck_assert_int_eq(c.mask_calls, 1);
    /* eager mask that leaves nothing, greedy and stochastic */
    sampler_set_processor(s, &(sampler_processor){.user = &c, .mask = tc_mask_all});
    float m[5] = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f};
    ck_assert_int_eq(sampler_sample(s, m), CORRAL_FAILED_PRECONDITION);
    sampler_params g = plain_params(27);
    g.temperature = 0.0f;
    sampler *sg = make_sampler(&g, 5);
    sampler_set_processor(sg, &(sampler_processor){.user = &c, .mask = tc_mask_all});
    float n[5] = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f};
    ck_assert_int_eq(sampler_sample(sg, n), CORRAL_FAILED_PRECONDITION);
    /* a processor whose mask disagrees with allowed is caught, not obeyed */
    sampler_set_processor(
        sg, &(sampler_processor){.user = &c, .allowed = tc_allow_none, .mask = tc_mask_nothing});
    float o[5] = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f};
    ck_assert_int_eq(sampler_sample(sg, o), CORRAL_INTERNAL);
    sampler_destroy(&s);
    sampler_destroy(&sg);
}
END_TEST

/* ---- limits ---------------------------------------------------------------------------------- */

/* accept and finished: a processor that counts what it was given, refuses token 3, and says it
 * is finished after `finish_after` tokens (or reports an error code when that is negative). */
typedef struct test_counter {
    int accepted, finish_after, finished_calls;
    int32_t last;
    int error; /* what finished returns once finish_after tokens were accepted, if nonzero */
} test_counter;

static corral_status tcount_accept(void *user, int32_t token) {
    test_counter *c = user;
    if (token == 3) return CORRAL_INVALID_ARGUMENT;
    c->accepted++;
    c->last = token;
    return CORRAL_OK;
}

static int tcount_finished(void *user) {
    test_counter *c = user;
    c->finished_calls++;
    if (c->accepted < c->finish_after) return 0;
    return c->error ? c->error : 1;
}

START_TEST(test_processor_accept_and_finished) {
    sampler_params p = plain_params(16);
    p.temperature = 0.0f;
    p.repeat_penalty = 2.0f;
    p.penalty_last_n = 4;
    sampler *s = make_sampler(&p, 5);
    ck_assert_int_eq(sampler_finished(s), 0); /* no processor */
    test_counter c = {.finish_after = 2};
    sampler_set_processor(
        s, &(sampler_processor){.user = &c, .accept = tcount_accept, .finished = tcount_finished});
    ck_assert_int_eq(sampler_finished(s), 0);
    ck_assert_int_eq(sampler_accept(s, 1), CORRAL_OK);
    ck_assert_int_eq(c.accepted, 1);
    ck_assert_int_eq(c.last, 1);
    /* A refused token is not recorded: the penalty window does not see it. */
    ck_assert_int_eq(sampler_accept(s, 3), CORRAL_INVALID_ARGUMENT);
    float l[5] = {0.0f, 1.0f, 0.0f, 1.5f, 1.0f};
    ck_assert_int_eq(sampler_sample(s, l), 3);
    ck_assert_float_eq(l[3], 1.5f); /* not penalised */
    ck_assert_float_eq(l[1], 0.5f); /* token 1 was recorded: 1 / 2 */
    /* Out-of-range tokens never reach the processor. */
    ck_assert_int_eq(sampler_accept(s, 7), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(c.accepted, 1);
    ck_assert_int_eq(sampler_accept(s, 2), CORRAL_OK);
    ck_assert_int_eq(sampler_finished(s), 1);
    c.error = CORRAL_FAILED_PRECONDITION;
    ck_assert_int_eq(sampler_finished(s), CORRAL_FAILED_PRECONDITION);
    /* Removing the processor removes both hooks. */
    sampler_set_processor(s, NULL);
    const int calls = c.finished_calls;
    ck_assert_int_eq(sampler_finished(s), 0);
    ck_assert_int_eq(sampler_accept(s, 3), CORRAL_OK);
    ck_assert_int_eq(c.finished_calls, calls);
    ck_assert_int_eq(sampler_finished(NULL), 0);
    sampler_destroy(&s);
}
END_TEST

START_TEST(test_nan_and_inf_logits) {
    sampler_params g = plain_params(31);
    g.temperature = 0.0f;
    sampler_params d = sampler_params_default();
    d.seed = 32;
    sampler *sg = make_sampler(&g, 5);
    sampler *sd = make_sampler(&d, 5);
    sampler_params pl = plain_params(33);
    sampler *sp = make_sampler(&pl, 5);

    /* NaN counts as -inf: never chosen, even when it is "largest" by position. */
    const float nan_logits[5] = {NAN, NAN, 0.5f, NAN, NAN};
    int counts[5];
    float w[5];
    memcpy(w, nan_logits, sizeof w);
    ck_assert_int_eq(sampler_sample(sg, w), 2);
    count_draws(sd, nan_logits, 5, 200, counts);
    ck_assert_int_eq(counts[2], 200);

    /* +inf beats every finite logit; two of them share the draws. */
    const float inf_logits[5] = {1e30f, INFINITY, NAN, INFINITY, -INFINITY};
    memcpy(w, inf_logits, sizeof w);
    ck_assert_int_eq(sampler_sample(sg, w), 1);
    count_draws(sp, inf_logits, 5, 2000, counts);
    ck_assert_int_eq(counts[0] + counts[2] + counts[4], 0);
    ck_assert_int_gt(counts[1], 800);
    ck_assert_int_gt(counts[3], 800);

    /* Nothing finite at all: an error, not a token. */
    float none[5] = {NAN, -INFINITY, NAN, -INFINITY, NAN};
    ck_assert_int_eq(sampler_sample(sd, none), CORRAL_FAILED_PRECONDITION);
    float none2[5] = {NAN, -INFINITY, NAN, -INFINITY, NAN};
    ck_assert_int_eq(sampler_sample(sg, none2), CORRAL_FAILED_PRECONDITION);

    /* Huge logits and a tiny temperature stay finite: the largest wins. */
    sampler_params tiny = plain_params(34);
    tiny.temperature = 1e-20f;
    sampler *st = make_sampler(&tiny, 5);
    float big[5] = {3e38f, -3e38f, 2.9e38f, 0.0f, 3.1e38f};
    ck_assert_int_eq(sampler_sample(st, big), 4);
    sampler_destroy(&sg);
    sampler_destroy(&sd);
    sampler_destroy(&sp);
    sampler_destroy(&st);
}
END_TEST

START_TEST(test_large_vocab_window_and_top_k) {
    /* A realistic size: 32000 tokens, a long window, the default chain. */
    enum { V = 32000 };
    sampler_params p = sampler_params_default();
    p.penalty_last_n = SAMPLER_MAX_PENALTY_LAST_N;
    p.repeat_penalty = 1.3f;
    p.seed = 35;
    sampler *s = make_sampler(&p, V);
    float *l = malloc(V * sizeof *l);
    ck_assert_ptr_nonnull(l);
    test_rand_state = 36;
    for (int step = 0; step < 50; step++) {
        for (int j = 0; j < V; j++) l[j] = test_rand_logit();
        int32_t t = sampler_sample(s, l);
        ck_assert_int_ge(t, 0);
        ck_assert_int_lt(t, V);
        ck_assert_int_eq(sampler_accept(s, t), CORRAL_OK);
    }
    free(l);
    sampler_destroy(&s);
}
END_TEST

/* ---- errors ---------------------------------------------------------------------------------- */

static void expect_invalid(sampler_params p, const char *field) {
    corral_error err;
    corral_error_clear(&err);
    ck_assert_int_eq(sampler_validate_params(&p, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.message, field) != NULL, "message '%s' does not name %s", err.message,
                  field);
    corral_error_clear(&err);
    ck_assert_ptr_null(sampler_new(&p, 10, &err));
    ck_assert_msg(strstr(err.message, field) != NULL, "sampler_new message '%s' does not name %s",
                  err.message, field);
}

START_TEST(test_validation_names_each_field) {
    sampler_params ok = sampler_params_default();
    ck_assert_int_eq(sampler_validate_params(&ok, NULL), CORRAL_OK);
    sampler_params p;
    p = ok, p.temperature = -0.1f, expect_invalid(p, "temperature");
    p = ok, p.temperature = NAN, expect_invalid(p, "temperature");
    p = ok, p.temperature = INFINITY, expect_invalid(p, "temperature");
    p = ok, p.top_k = -1, expect_invalid(p, "top_k");
    p = ok, p.top_p = 0.0f, expect_invalid(p, "top_p");
    p = ok, p.top_p = 1.5f, expect_invalid(p, "top_p");
    p = ok, p.top_p = NAN, expect_invalid(p, "top_p");
    p = ok, p.min_p = -0.1f, expect_invalid(p, "min_p");
    p = ok, p.min_p = 1.01f, expect_invalid(p, "min_p");
    p = ok, p.min_p = NAN, expect_invalid(p, "min_p");
    p = ok, p.repeat_penalty = 0.0f, expect_invalid(p, "repeat_penalty");
    p = ok, p.repeat_penalty = -1.0f, expect_invalid(p, "repeat_penalty");
    p = ok, p.repeat_penalty = NAN, expect_invalid(p, "repeat_penalty");
    p = ok, p.presence_penalty = NAN, expect_invalid(p, "presence_penalty");
    p = ok, p.frequency_penalty = -INFINITY, expect_invalid(p, "frequency_penalty");
    p = ok, p.penalty_last_n = -1, expect_invalid(p, "penalty_last_n");
    p = ok, p.penalty_last_n = SAMPLER_MAX_PENALTY_LAST_N + 1, expect_invalid(p, "penalty_last_n");
    /* edges that are valid */
    p = ok, p.temperature = 0.0f, p.top_p = 1.0f, p.min_p = 1.0f, p.top_k = 0;
    p.presence_penalty = -2.0f, p.penalty_last_n = SAMPLER_MAX_PENALTY_LAST_N;
    ck_assert_int_eq(sampler_validate_params(&p, NULL), CORRAL_OK);
    ck_assert_int_eq(sampler_validate_params(NULL, NULL), CORRAL_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_bad_arguments) {
    corral_error err;
    sampler_params p = sampler_params_default();
    ck_assert_ptr_null(sampler_new(&p, 0, &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "n_vocab"));
    ck_assert_ptr_null(sampler_new(&p, SAMPLER_MAX_VOCAB + 1, &err));
    ck_assert_ptr_null(sampler_new(NULL, 10, &err));

    sampler *s = make_sampler(&p, 10);
    ck_assert_int_eq(sampler_accept(s, -1), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(sampler_accept(s, 10), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(sampler_accept(s, 9), CORRAL_OK);
    ck_assert_int_eq(sampler_sample(s, NULL), CORRAL_INVALID_ARGUMENT);
    float l[10] = {0};
    ck_assert_int_eq(sampler_sample(NULL, l), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(sampler_accept(NULL, 0), CORRAL_INVALID_ARGUMENT);
    sampler_destroy(&s);
    sampler_destroy(&s); /* NULL-safe */
    sampler_destroy(NULL);
    sampler_reset(NULL);
    sampler_set_processor(NULL, NULL);
}
END_TEST

static Suite *sampler_suite(void) {
    Suite *s = suite_create("sampler");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_same_seed_same_sequence);
    tcase_add_test(core, test_different_seeds_differ);
    tcase_add_test(core, test_greedy_picks_argmax);
    tcase_add_test(core, test_top_k_1_equals_greedy);
    tcase_add_test(core, test_distribution_matches_softmax);
    tcase_add_test(core, test_top_p_keeps_smallest_prefix);
    tcase_add_test(core, test_min_p_keeps_relative_threshold);
    tcase_add_test(core, test_top_k_keeps_k_best);
    tcase_add_test(core, test_penalties_hand_computed);
    tcase_add_test(core, test_penalty_window_zero_is_off);
    suite_add_tcase(s, core);
    TCase *proc = tcase_create("processor");
    tcase_add_test(proc, test_processor_draw_first_then_mask);
    tcase_add_test(proc, test_processor_draw_first_keeps_distribution);
    tcase_add_test(proc, test_processor_full_mask_path);
    tcase_add_test(proc, test_processor_apply_hook);
    tcase_add_test(proc, test_processor_all_masked_is_error);
    tcase_add_test(proc, test_processor_accept_and_finished);
    suite_add_tcase(s, proc);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_nan_and_inf_logits);
    tcase_add_test(limits, test_large_vocab_window_and_top_k);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_validation_names_each_field);
    tcase_add_test(errors, test_bad_arguments);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(sampler_suite)
