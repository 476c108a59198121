/*
 * test_generate.c — Check suite for the generation state machine: seeded sampling is
 * reproducible, top-k 1 is greedy, stop strings, max tokens, end-of-generation, context limits.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "corral/generate.h"
#include "corral/prompt.h"
#include "refdata.h"
#include "testutil.h"

enum { TEXT_MAX = 16384 };

typedef struct run_result {
    char text[TEXT_MAX];
    size_t len;
    int32_t ids[1024];
    int n_ids;
    gen_stop stop;
} run_result;

static model *load(const char *rel) {
    corral_error err;
    model *m = model_load(test_shared_path(rel), NULL, &err);
    ck_assert_msg(m != NULL, "%s", err.message);
    return m;
}

/* Generate from "Once upon a time" with the given params; collect text and ids. */
static void run(model *m, const gen_params *gp, uint32_t n_ctx, run_result *out) {
    corral_error err;
    kv_cache *kv = kv_cache_new(m, n_ctx, KV_TYPE_F32, &err);
    model_runner *r = model_runner_new(m, 0, NULL, &err);
    generator *g = gen_new(m, r, kv, gp, &err);
    ck_assert_msg(g != NULL, "%s", err.message);
    int32_t *prompt;
    size_t n_prompt;
    const char *text = "Once upon a time";
    ck_assert_int_eq(
        prompt_tokenize_text(model_get_tokenizer(m), text, strlen(text), &prompt, &n_prompt, &err),
        CORRAL_OK);
    ck_assert_int_eq(gen_prefill(g, prompt, (uint32_t)n_prompt, &err), CORRAL_OK);
    free(prompt);
    memset(out, 0, sizeof *out);
    gen_token t;
    do {
        ck_assert_int_eq(gen_next(g, &t, &err), CORRAL_OK);
        if (t.id >= 0 && out->n_ids < 1024) out->ids[out->n_ids++] = t.id;
        ck_assert_uint_le(out->len + t.len, TEXT_MAX);
        memcpy(out->text + out->len, t.text, t.len);
        out->len += t.len;
    } while (t.stop == GEN_STOP_NONE);
    out->stop = t.stop;
    ck_assert_int_eq(gen_next(g, &t, &err), CORRAL_FAILED_PRECONDITION);
    const gen_stats *s = gen_get_stats(g);
    ck_assert_uint_eq(s->n_prompt, (uint32_t)n_prompt);
    ck_assert_uint_eq(s->n_generated, (uint32_t)out->n_ids);
    gen_destroy(&g);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
}

static gen_params sampled(uint64_t seed, uint32_t max_tokens) {
    gen_params gp = gen_params_default();
    gp.sampling.temperature = 1.0f;
    gp.sampling.seed = seed;
    gp.max_tokens = max_tokens;
    return gp;
}

START_TEST(test_same_seed_same_text_different_seed_differs) {
    model *m = load("models/stories260K.gguf");
    run_result *a = malloc(sizeof *a), *b = malloc(sizeof *b), *c = malloc(sizeof *c);
    gen_params gp = sampled(42, 64);
    run(m, &gp, 256, a);
    run(m, &gp, 256, b);
    ck_assert_int_eq(a->n_ids, b->n_ids);
    ck_assert_uint_eq(a->len, b->len);
    ck_assert(memcmp(a->text, b->text, a->len) == 0);
    gp = sampled(43, 64);
    run(m, &gp, 256, c);
    ck_assert_msg(c->len != a->len || memcmp(a->text, c->text, a->len) != 0,
                  "seeds 42 and 43 gave the same text");
    free(a);
    free(b);
    free(c);
    model_destroy(&m);
}
END_TEST

START_TEST(test_top_k_one_equals_greedy_reference) {
    model *m = load("models/stories260K.gguf");
    run_result *a = malloc(sizeof *a);
    gen_params gp = sampled(7, 256);
    gp.sampling.top_k = 1;
    run(m, &gp, 512, a);
    int32_t ref[512];
    int n_ref = ref_read_ids("reference/stories260K.greedy.ids.txt", ref, 512);
    ck_assert_int_eq(a->n_ids, n_ref);
    ck_assert(memcmp(a->ids, ref, (size_t)n_ref * sizeof ref[0]) == 0);
    size_t ref_len;
    char *ref_text = ref_read_file("reference/stories260K.greedy.txt", &ref_len);
    ck_assert_uint_eq(a->len, ref_len);
    ck_assert(memcmp(a->text, ref_text, ref_len) == 0);
    ck_assert_int_eq(a->stop, GEN_STOP_MAX_TOKENS);
    free(ref_text);
    free(a);
    model_destroy(&m);
}
END_TEST

START_TEST(test_stop_string_cuts_text) {
    model *m = load("models/stories260K.gguf");
    run_result *a = malloc(sizeof *a);
    gen_params gp = gen_params_default();
    gp.sampling.temperature = 0;
    gp.max_tokens = 256;
    const char *stops[] = {"Lily"};
    gp.stop = stops;
    gp.n_stop = 1;
    run(m, &gp, 512, a);
    /* The greedy text is ", there was a little girl named Lily. ..." */
    ck_assert_int_eq(a->stop, GEN_STOP_STRING);
    ck_assert_uint_eq(a->len, strlen(", there was a little girl named "));
    ck_assert(memcmp(a->text, ", there was a little girl named ", a->len) == 0);
    free(a);
    model_destroy(&m);
}
END_TEST

START_TEST(test_context_limit_stops_generation) {
    model *m = load("models/stories260K.gguf");
    run_result *a = malloc(sizeof *a);
    gen_params gp = gen_params_default();
    gp.sampling.temperature = 0;
    run(m, &gp, 16, a); /* 5 prompt tokens, then 11 positions, plus the last sampled token */
    ck_assert_int_eq(a->stop, GEN_STOP_CONTEXT);
    ck_assert_int_eq(a->n_ids, 12);
    free(a);
    model_destroy(&m);
}
END_TEST

/* A processor that lets the model run for `after` steps, then allows only `token`. */
typedef struct force_token {
    int calls, after;
    int32_t token;
} force_token;

static void force_apply(void *user, float *logits, int32_t n_vocab) {
    force_token *f = user;
    if (f->calls++ < f->after) return;
    for (int32_t i = 0; i < n_vocab; i++)
        if (i != f->token) logits[i] = -INFINITY;
}

START_TEST(test_eog_stops_and_is_not_emitted) {
    model *m = load("models/stories260K.gguf");
    const int32_t eos = tok_eos(model_get_tokenizer(m));
    ck_assert_int_eq(eos, 2);
    force_token force = {.after = 6, .token = eos};
    sampler_processor proc = {.user = &force, .apply = force_apply};
    run_result *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    gen_params gp = sampled(5, 100);
    gp.processor = &proc;
    run(m, &gp, 256, a);
    ck_assert_int_eq(a->stop, GEN_STOP_EOG);
    ck_assert_int_eq(a->n_ids, 7);
    ck_assert_int_eq(a->ids[6], eos);
    ck_assert_ptr_null(memmem(a->text, a->len, "</s>", 4));
    /* The text is exactly the decoding of the six tokens before EOS. */
    char want[1024];
    size_t want_len;
    corral_error err;
    ck_assert_int_eq(
        tok_decode(model_get_tokenizer(m), a->ids, 6, 0, want, sizeof want, &want_len, &err),
        CORRAL_OK);
    ck_assert_uint_eq(a->len, want_len);
    ck_assert(memcmp(a->text, want, want_len) == 0);
    /* With ignore_eog the same run goes on to max_tokens. */
    force = (force_token){.after = 6, .token = eos};
    gp.ignore_eog = 1;
    gp.max_tokens = 10;
    run(m, &gp, 256, b);
    ck_assert_int_eq(b->stop, GEN_STOP_MAX_TOKENS);
    ck_assert_int_eq(b->n_ids, 10);
    free(a);
    free(b);
    model_destroy(&m);
}
END_TEST

START_TEST(test_bad_use) {
    model *m = load("models/stories260K.gguf");
    corral_error err;
    kv_cache *kv = kv_cache_new(m, 32, KV_TYPE_F32, &err);
    model_runner *r = model_runner_new(m, 0, NULL, &err);
    gen_params gp = gen_params_default();
    gp.sampling.top_p = 2.0f;
    ck_assert_ptr_null(gen_new(m, r, kv, &gp, &err));
    ck_assert_ptr_nonnull(strstr(err.message, "top_p"));
    gp = gen_params_default();
    const char *empty[] = {""};
    gp.stop = empty;
    gp.n_stop = 1;
    ck_assert_ptr_null(gen_new(m, r, kv, &gp, &err));
    gp = gen_params_default();
    generator *g = gen_new(m, r, kv, &gp, &err);
    gen_token t;
    ck_assert_int_eq(gen_next(g, &t, &err), CORRAL_FAILED_PRECONDITION); /* no prefill */
    const int32_t bad = 99999;
    ck_assert_int_eq(gen_prefill(g, &bad, 1, &err), CORRAL_INVALID_ARGUMENT);
    const int32_t bos = 1;
    ck_assert_int_eq(gen_prefill(g, &bos, 1, &err), CORRAL_OK);
    ck_assert_int_eq(gen_next(g, &t, &err), CORRAL_OK);
    ck_assert_int_eq(gen_prefill(g, &bos, 1, &err), CORRAL_FAILED_PRECONDITION);
    gen_finish(g, GEN_STOP_MAX_TOKENS, &t);
    ck_assert_int_eq(t.stop, GEN_STOP_MAX_TOKENS);
    ck_assert_int_eq(gen_next(g, &t, &err), CORRAL_FAILED_PRECONDITION);
    gen_destroy(&g);
    gen_destroy(&g);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
    model_destroy(&m);
}
END_TEST

/* A processor with the accept/finished hooks: it counts accepted tokens, says it is finished
 * after `finish_after` of them, can refuse a token, and can mask everything. */
typedef struct hook_proc {
    int accepted, finish_after, mask_all;
    int32_t refuse;
    int finished_value; /* what finished returns once finish_after is reached */
} hook_proc;

static corral_status hook_accept(void *user, int32_t token) {
    hook_proc *h = user;
    if (token == h->refuse) return CORRAL_INVALID_ARGUMENT;
    h->accepted++;
    return CORRAL_OK;
}

static int hook_finished(void *user) {
    const hook_proc *h = user;
    return h->accepted >= h->finish_after ? h->finished_value : 0;
}

static void hook_mask(void *user, float *logits, int32_t n_vocab) {
    const hook_proc *h = user;
    if (!h->mask_all) return;
    for (int32_t i = 0; i < n_vocab; i++) logits[i] = -INFINITY;
}

START_TEST(test_processor_finished_and_errors) {
    model *m = load("models/stories260K.gguf");
    const tokenizer *tok = model_get_tokenizer(m);
    run_result *a = malloc(sizeof *a);
    /* finished after 5 tokens: the generation ends right there, with their text */
    hook_proc h = {.finish_after = 5, .refuse = -1, .finished_value = 1};
    sampler_processor proc = {.user = &h, .accept = hook_accept, .finished = hook_finished};
    gen_params gp = sampled(11, 100);
    gp.processor = &proc;
    run(m, &gp, 256, a);
    ck_assert_int_eq(a->stop, GEN_STOP_CONSTRAINT);
    ck_assert_int_eq(a->n_ids, 5);
    ck_assert_int_eq(h.accepted, 5);
    char want[1024];
    size_t want_len;
    corral_error err;
    ck_assert_int_eq(tok_decode(tok, a->ids, 5, 0, want, sizeof want, &want_len, &err), CORRAL_OK);
    ck_assert_uint_eq(a->len, want_len);
    ck_assert(memcmp(a->text, want, want_len) == 0);
    /* finished before any token: no token at all */
    h = (hook_proc){.finish_after = 0, .refuse = -1, .finished_value = 1};
    run(m, &gp, 256, a);
    ck_assert_int_eq(a->stop, GEN_STOP_CONSTRAINT);
    ck_assert_int_eq(a->n_ids, 0);
    ck_assert_uint_eq(a->len, 0);
    /* finished wins over max_tokens on the same step */
    h = (hook_proc){.finish_after = 3, .refuse = -1, .finished_value = 1};
    gp.max_tokens = 3;
    run(m, &gp, 256, a);
    ck_assert_int_eq(a->stop, GEN_STOP_CONSTRAINT);
    gp.max_tokens = 100;

    kv_cache *kv = kv_cache_new(m, 64, KV_TYPE_F32, &err);
    model_runner *r = model_runner_new(m, 0, NULL, &err);
    const int32_t bos = 1;
    gen_token t;
    /* a refused token fails gen_next with the processor's status (greedy: learn the first
     * token, then refuse it) */
    h = (hook_proc){.finish_after = 1000, .refuse = -1};
    gen_params g1 = gen_params_default();
    g1.sampling.top_k = 1;
    g1.processor = &proc;
    generator *g = gen_new(m, r, kv, &g1, &err);
    ck_assert_int_eq(gen_prefill(g, &bos, 1, &err), CORRAL_OK);
    ck_assert_int_eq(gen_next(g, &t, &err), CORRAL_OK);
    const int32_t first = t.id;
    gen_destroy(&g);
    kv_cache_truncate(kv, 0);
    h = (hook_proc){.finish_after = 1000, .refuse = first};
    g = gen_new(m, r, kv, &g1, &err);
    ck_assert_int_eq(gen_prefill(g, &bos, 1, &err), CORRAL_OK);
    ck_assert_int_eq(gen_next(g, &t, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "refused token"));
    gen_destroy(&g);
    /* everything masked: GEN_STOP_CONSTRAINT when finished says 0 or 1, an error when negative */
    proc.mask = hook_mask;
    for (int v = -1; v <= 0; v++) {
        kv_cache_truncate(kv, 0);
        h = (hook_proc){.finish_after = 0,
                        .refuse = -1,
                        .mask_all = 1,
                        .finished_value = v < 0 ? CORRAL_FAILED_PRECONDITION : 0};
        g = gen_new(m, r, kv, &g1, &err);
        ck_assert_int_eq(gen_prefill(g, &bos, 1, &err), CORRAL_OK);
        const corral_status st = gen_next(g, &t, &err);
        if (v < 0) {
            ck_assert_int_eq(st, CORRAL_FAILED_PRECONDITION);
            ck_assert_ptr_nonnull(strstr(err.message, "cannot be completed"));
        } else {
            ck_assert_int_eq(st, CORRAL_OK);
            ck_assert_int_eq(t.stop, GEN_STOP_CONSTRAINT);
            ck_assert_int_eq(t.id, -1);
        }
        gen_destroy(&g);
    }
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
    free(a);
    model_destroy(&m);
}
END_TEST

static Suite *generate_suite(void) {
    Suite *s = suite_create("generate");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_same_seed_same_text_different_seed_differs);
    tcase_add_test(core, test_top_k_one_equals_greedy_reference);
    tcase_add_test(core, test_stop_string_cuts_text);
    tcase_add_test(core, test_eog_stops_and_is_not_emitted);
    tcase_add_test(core, test_processor_finished_and_errors);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_context_limit_stops_generation);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_bad_use);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(generate_suite)
