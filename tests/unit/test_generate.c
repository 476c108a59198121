/*
 * test_generate.c — Check suite for the generation state machine: seeded sampling is
 * reproducible, top-k 1 is greedy, stop strings, max tokens, end-of-generation, context limits,
 * and generations stepped together (gen_step_batch) exactly as each alone, errors item by item.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "corral/generate.h"
#include "corral/prompt.h"
#include "corral/threadpool.h"
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

/* Log-probabilities of a greedy run: the sampled token is the best alternative, its logprob the
 * first alternative's, alternatives best first, their probabilities a part of 1; the reference
 * text is unchanged by asking. */
START_TEST(test_logprobs_of_greedy_tokens) {
    model *m = load("models/stories260K.gguf");
    corral_error err;
    kv_cache *kv = kv_cache_new(m, 512, KV_TYPE_F32, &err);
    model_runner *r = model_runner_new(m, 0, NULL, &err);
    gen_params gp = gen_params_default();
    gp.sampling.temperature = 0;
    gp.max_tokens = 64;
    gp.logprobs = 1;
    gp.top_logprobs = 5;
    generator *g = gen_new(m, r, kv, &gp, &err);
    ck_assert_msg(g != NULL, "%s", err.message);
    int32_t *prompt;
    size_t n_prompt;
    const char *text = "Once upon a time";
    ck_assert_int_eq(
        prompt_tokenize_text(model_get_tokenizer(m), text, strlen(text), &prompt, &n_prompt, &err),
        CORRAL_OK);
    ck_assert_int_eq(gen_prefill(g, prompt, (uint32_t)n_prompt, &err), CORRAL_OK);
    free(prompt);
    int32_t ref[512];
    const int n_ref = ref_read_ids("reference/stories260K.greedy.ids.txt", ref, 512);
    gen_token t;
    int n = 0;
    do {
        ck_assert_int_eq(gen_next(g, &t, &err), CORRAL_OK);
        if (t.id < 0) continue;
        ck_assert_int_lt(n, n_ref);
        ck_assert_int_eq(t.id, ref[n]);
        n++;
        ck_assert_uint_eq(t.n_top, 5);
        ck_assert_int_eq(t.top[0].id, t.id);
        ck_assert_float_eq(t.top[0].logprob, t.logprob);
        ck_assert(t.logprob <= 0 && isfinite(t.logprob));
        double mass = 0;
        for (uint32_t k = 0; k < t.n_top; k++) {
            if (k) ck_assert(t.top[k].logprob <= t.top[k - 1].logprob);
            if (k) ck_assert_int_ne(t.top[k].id, t.top[0].id);
            mass += exp(t.top[k].logprob);
        }
        ck_assert(mass <= 1.0 + 1e-4);
    } while (t.stop == GEN_STOP_NONE);
    ck_assert_int_eq(n, 64);
    gen_destroy(&g);
    /* More alternatives than the limit are refused. */
    gp.top_logprobs = GEN_TOP_LOGPROBS_MAX + 1;
    ck_assert_ptr_null(gen_new(m, r, kv, &gp, &err));
    ck_assert_int_eq(err.status, CORRAL_INVALID_ARGUMENT);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
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

/* ---- batched steps (gen_step_batch) -------------------------------------------------------- */

enum { BATCH_GENS = 6, BATCH_MAX_STEPS = 300 };

/* What each generation of the batch produced, step by step. */
typedef struct transcript {
    int n;
    int32_t id[BATCH_MAX_STEPS];
    size_t len[BATCH_MAX_STEPS];
    gen_stop stop[BATCH_MAX_STEPS];
    char text[TEXT_MAX];
    size_t text_len;
    uint32_t n_prompt, n_generated;
} transcript;

static void transcript_add(transcript *tr, const gen_token *t) {
    ck_assert_int_lt(tr->n, BATCH_MAX_STEPS);
    tr->id[tr->n] = t->id;
    tr->len[tr->n] = t->len;
    tr->stop[tr->n] = t->stop;
    tr->n++;
    ck_assert_uint_le(tr->text_len + t->len, TEXT_MAX);
    memcpy(tr->text + tr->text_len, t->text, t->len);
    tr->text_len += t->len;
}

/* Generation k of the batch: its parameters (a processor's state in *force), context, prompt,
 * the step at which it starts, and the number of slices its prompt is prefilled in (one a
 * step). Greedy; seeded sampling with penalties; a stop string; a processor that forces the end
 * of generation; a context that fills; top-k/top-p sampling. */
typedef struct batch_gen {
    gen_params gp;
    uint32_t n_ctx;
    const char *prompt;
    int start, n_slices;
} batch_gen;

static const char *const STOP_LILY[] = {"Lily"};

static batch_gen batch_gen_setup(int k, force_token *force, sampler_processor *proc) {
    batch_gen b = {.gp = gen_params_default(), .n_ctx = 256, .prompt = "Once upon a time"};
    b.n_slices = 1;
    switch (k) {
        case 0:
            b.gp.sampling.temperature = 0;
            b.gp.max_tokens = 40;
            break;
        case 1:
            b.gp = sampled(42, 48);
            b.gp.sampling.repeat_penalty = 1.3f;
            b.gp.sampling.presence_penalty = 0.2f;
            b.gp.sampling.frequency_penalty = 0.1f;
            b.gp.sampling.penalty_last_n = 32;
            break;
        case 2: /* starts while the others decode */
            b.gp.sampling.temperature = 0;
            b.gp.max_tokens = 256;
            b.gp.stop = STOP_LILY;
            b.gp.n_stop = 1;
            b.start = 1;
            break;
        case 3:
            *force = (force_token){.after = 6, .token = 2 /* EOS */};
            *proc = (sampler_processor){.user = force, .apply = force_apply};
            b.gp = sampled(5, 100);
            b.gp.processor = proc;
            b.prompt = "The little dog ran";
            b.start = 2;
            b.n_slices = 2;
            break;
        case 4:
            b.gp.sampling.temperature = 0;
            b.n_ctx = 16;
            break;
        case 5:
            b.gp = sampled(9, 30);
            b.gp.sampling.top_k = 5;
            b.gp.sampling.top_p = 0.9f;
            b.prompt = "The little dog ran";
            b.start = 3;
            b.n_slices = 3;
            break;
    }
    return b;
}

static void tokenize(const model *m, const char *text, int32_t **ids, size_t *n) {
    corral_error err;
    ck_assert_int_eq(prompt_tokenize_text(model_get_tokenizer(m), text, strlen(text), ids, n, &err),
                     CORRAL_OK);
}

/* Slice j of n_slices of a prompt of n tokens: [begin, end). */
static void slice_of(size_t n, int j, int n_slices, size_t *begin, size_t *end) {
    *begin = n * (size_t)j / (size_t)n_slices;
    *end = n * (size_t)(j + 1) / (size_t)n_slices;
}

/* Generation k alone: gen_prefill of its slices, then gen_next to the end. */
static void run_alone(model *m, int k, transcript *tr) {
    force_token force;
    sampler_processor proc;
    const batch_gen b = batch_gen_setup(k, &force, &proc);
    corral_error err;
    kv_cache *kv = kv_cache_new(m, b.n_ctx, KV_TYPE_F16, &err);
    model_runner *r = model_runner_new(m, 0, NULL, &err);
    generator *g = gen_new(m, r, kv, &b.gp, &err);
    ck_assert_msg(g != NULL, "%s", err.message);
    int32_t *ids;
    size_t n_ids;
    tokenize(m, b.prompt, &ids, &n_ids);
    ck_assert_uint_ge(n_ids, (size_t)b.n_slices);
    for (int j = 0; j < b.n_slices; j++) {
        size_t s0, s1;
        slice_of(n_ids, j, b.n_slices, &s0, &s1);
        ck_assert_int_eq(gen_prefill(g, ids + s0, (uint32_t)(s1 - s0), &err), CORRAL_OK);
    }
    free(ids);
    memset(tr, 0, sizeof *tr);
    gen_token t;
    do {
        ck_assert_int_eq(gen_next(g, &t, &err), CORRAL_OK);
        transcript_add(tr, &t);
    } while (t.stop == GEN_STOP_NONE);
    tr->n_prompt = gen_get_stats(g)->n_prompt;
    tr->n_generated = gen_get_stats(g)->n_generated;
    gen_destroy(&g);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
}

/* All BATCH_GENS generations stepped together by gen_step_batch on one runner (max_batch, a pool
 * of n_threads): each step holds one item per generation that has started and not ended, its
 * prompt slices first (beside the others' decoding), then its decode steps. Every decode item's
 * result equals the same step of the generation run alone. */
static void check_batched(model *m, uint32_t max_batch, uint32_t n_threads,
                          const transcript *alone) {
    corral_error err;
    threadpool *pool = n_threads > 1 ? threadpool_new(n_threads, &err) : NULL;
    model_runner *r = model_runner_new(m, max_batch, pool, &err);
    ck_assert_ptr_nonnull(r);
    force_token force[BATCH_GENS];
    sampler_processor proc[BATCH_GENS];
    batch_gen b[BATCH_GENS];
    kv_cache *kv[BATCH_GENS];
    generator *g[BATCH_GENS];
    int32_t *ids[BATCH_GENS];
    size_t n_ids[BATCH_GENS];
    transcript *got = calloc(BATCH_GENS, sizeof *got);
    int done[BATCH_GENS] = {0};
    for (int k = 0; k < BATCH_GENS; k++) {
        b[k] = batch_gen_setup(k, &force[k], &proc[k]);
        kv[k] = kv_cache_new(m, b[k].n_ctx, KV_TYPE_F16, &err);
        g[k] = gen_new(m, r, kv[k], &b[k].gp, &err);
        ck_assert_ptr_nonnull(g[k]);
        tokenize(m, b[k].prompt, &ids[k], &n_ids[k]);
    }
    int n_done = 0, max_items = 0, mixed_steps = 0;
    for (int step = 0; n_done < BATCH_GENS; step++) {
        ck_assert_int_lt(step, BATCH_MAX_STEPS);
        gen_batch_item items[BATCH_GENS];
        int who[BATCH_GENS], n = 0, n_prefill = 0;
        for (int k = 0; k < BATCH_GENS; k++) {
            if (done[k] || step < b[k].start) continue;
            items[n] = (gen_batch_item){.g = g[k]};
            const int slice = step - b[k].start;
            if (slice < b[k].n_slices) {
                size_t s0, s1;
                slice_of(n_ids[k], slice, b[k].n_slices, &s0, &s1);
                items[n].prefill = ids[k] + s0;
                items[n].n_prefill = (uint32_t)(s1 - s0);
                n_prefill++;
            }
            who[n++] = k;
        }
        /* Another order every step. */
        for (int i = 0; i < n / 2; i++)
            if ((step + i) % 3 == 0) {
                const gen_batch_item ti = items[i];
                const int tw = who[i];
                items[i] = items[n - 1 - i];
                who[i] = who[n - 1 - i];
                items[n - 1 - i] = ti;
                who[n - 1 - i] = tw;
            }
        if (n > max_items) max_items = n;
        if (n_prefill > 0 && n_prefill < n) mixed_steps++;
        ck_assert_msg(gen_step_batch(items, (uint32_t)n, &err) == CORRAL_OK, "%s", err.message);
        for (int i = 0; i < n; i++) {
            const int k = who[i];
            ck_assert_msg(items[i].status == CORRAL_OK, "generation %d: %s", k,
                          items[i].err.message);
            if (items[i].prefill) continue;
            transcript *tr = &got[k];
            const int at = tr->n;
            transcript_add(tr, &items[i].token);
            ck_assert_int_le(tr->n, alone[k].n);
            ck_assert_msg(tr->id[at] == alone[k].id[at] && tr->len[at] == alone[k].len[at] &&
                              tr->stop[at] == alone[k].stop[at],
                          "generation %d, step %d (max_batch %u, %u threads): token %d len %zu "
                          "stop %d, alone %d len %zu stop %d",
                          k, at, max_batch, n_threads, tr->id[at], tr->len[at], tr->stop[at],
                          alone[k].id[at], alone[k].len[at], alone[k].stop[at]);
            if (items[i].token.stop != GEN_STOP_NONE) {
                done[k] = 1;
                n_done++;
            }
        }
    }
    ck_assert_int_eq(max_items, BATCH_GENS);
    ck_assert_int_ge(mixed_steps, 3);
    for (int k = 0; k < BATCH_GENS; k++) {
        ck_assert_int_eq(got[k].n, alone[k].n);
        ck_assert_uint_eq(got[k].text_len, alone[k].text_len);
        ck_assert(memcmp(got[k].text, alone[k].text, alone[k].text_len) == 0);
        ck_assert_uint_eq(gen_get_stats(g[k])->n_prompt, alone[k].n_prompt);
        ck_assert_uint_eq(gen_get_stats(g[k])->n_generated, alone[k].n_generated);
        /* An ended generation in a later batch: its own error, the others unaffected. */
        gen_batch_item again = {.g = g[k]};
        ck_assert_int_eq(gen_step_batch(&again, 1, &err), CORRAL_OK);
        ck_assert_int_eq(again.status, CORRAL_FAILED_PRECONDITION);
        ck_assert_ptr_nonnull(strstr(again.err.message, "has ended"));
        gen_destroy(&g[k]);
        kv_cache_destroy(&kv[k]);
        free(ids[k]);
    }
    free(got);
    model_runner_destroy(&r);
    threadpool_destroy(&pool);
}

START_TEST(test_batch_step_equals_alone) {
    model *m = load("models/stories260K.gguf");
    transcript *alone = calloc(BATCH_GENS, sizeof *alone);
    for (int k = 0; k < BATCH_GENS; k++) run_alone(m, k, &alone[k]);
    /* The setups end as they should: by max_tokens, a stop string, EOG, a full context. */
    ck_assert_int_eq(alone[0].stop[alone[0].n - 1], GEN_STOP_MAX_TOKENS);
    ck_assert_int_eq(alone[1].stop[alone[1].n - 1], GEN_STOP_MAX_TOKENS);
    ck_assert_int_eq(alone[2].stop[alone[2].n - 1], GEN_STOP_STRING);
    ck_assert_int_eq(alone[3].stop[alone[3].n - 1], GEN_STOP_EOG);
    ck_assert_int_eq(alone[4].stop[alone[4].n - 1], GEN_STOP_CONTEXT);
    ck_assert_int_eq(alone[5].stop[alone[5].n - 1], GEN_STOP_MAX_TOKENS);
    check_batched(m, 0, 2, alone);
    check_batched(m, 3, 1, alone); /* passes of 3 tokens: prompt slices straddle them */
    free(alone);
    model_destroy(&m);
}
END_TEST

/* One step of a batch whose items fail in their own ways: each gets the error it would have had
 * alone, and the healthy item beside them the token it would have had alone. */
START_TEST(test_batch_step_item_errors) {
    model *m = load("models/stories260K.gguf");
    corral_error err;
    model_runner *r = model_runner_new(m, 0, NULL, &err);
    gen_params greedy = gen_params_default();
    greedy.sampling.temperature = 0;
    const int32_t prompt[] = {1, 403, 407, 261, 378}, bad = 600;
    /* What the healthy generation gives alone: its first two tokens. */
    gen_token t;
    int32_t want[2];
    {
        kv_cache *kv = kv_cache_new(m, 64, KV_TYPE_F32, &err);
        generator *g = gen_new(m, r, kv, &greedy, &err);
        ck_assert_int_eq(gen_prefill(g, prompt, 5, &err), CORRAL_OK);
        for (int i = 0; i < 2; i++) {
            ck_assert_int_eq(gen_next(g, &t, &err), CORRAL_OK);
            want[i] = t.id;
        }
        gen_destroy(&g);
        kv_cache_destroy(&kv);
    }
    enum { N = 7 };
    kv_cache *kv[N];
    generator *g[N];
    hook_proc stuck = {.finish_after = 0,
                       .refuse = -1,
                       .mask_all = 1,
                       .finished_value = CORRAL_FAILED_PRECONDITION};
    hook_proc refuse = {.finish_after = 1000, .refuse = want[0]};
    sampler_processor stuck_proc = {.user = &stuck, .mask = hook_mask, .finished = hook_finished};
    sampler_processor refuse_proc = {.user = &refuse, .accept = hook_accept};
    for (int i = 0; i < N; i++) {
        gen_params gp = greedy;
        if (i == 1) gp.processor = &stuck_proc;
        if (i == 2) gp.processor = &refuse_proc;
        kv[i] = kv_cache_new(m, i == 4 ? 8 : 64, KV_TYPE_F32, &err);
        g[i] = gen_new(m, r, kv[i], &gp, &err);
        ck_assert_ptr_nonnull(g[i]);
        if (i < 3 || i == 6) ck_assert_int_eq(gen_prefill(g[i], prompt, 5, &err), CORRAL_OK);
    }
    ck_assert_int_eq(gen_next(g[6], &t, &err), CORRAL_OK); /* started: no prefill any more */
    gen_batch_item items[N] = {
        {.g = g[0]},                                    /* healthy */
        {.g = g[1]},                                    /* a constraint that cannot continue */
        {.g = g[2]},                                    /* a processor that refuses the token */
        {.g = g[3]},                                    /* a decode before any prefill */
        {.g = g[4], .prefill = prompt, .n_prefill = 5}, /* more than fits... */
        {.g = g[5], .prefill = &bad, .n_prefill = 1},   /* a token outside the vocabulary */
        {.g = g[6], .prefill = prompt, .n_prefill = 1}, /* a prefill after gen_next */
    };
    /* ... in 8 positions after 4 of them: */
    ck_assert_int_eq(gen_prefill(g[4], prompt, 4, &err), CORRAL_OK);
    ck_assert_int_eq(gen_step_batch(items, N, &err), CORRAL_OK);
    ck_assert_int_eq(items[0].status, CORRAL_OK);
    ck_assert_int_eq(items[0].token.id, want[0]);
    ck_assert_int_eq(items[1].status, CORRAL_FAILED_PRECONDITION);
    ck_assert_ptr_nonnull(strstr(items[1].err.message, "cannot be completed"));
    ck_assert_int_eq(items[2].status, CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(items[2].err.message, "refused token"));
    ck_assert_int_eq(items[3].status, CORRAL_FAILED_PRECONDITION);
    ck_assert_ptr_nonnull(strstr(items[3].err.message, "prefill the prompt first"));
    ck_assert_int_eq(items[4].status, CORRAL_RESOURCE_EXHAUSTED);
    ck_assert_ptr_nonnull(strstr(items[4].err.message, "do not fit"));
    ck_assert_uint_eq(kv_cache_n_pos(kv[4]), 4);
    ck_assert_int_eq(items[5].status, CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(items[5].err.message, "600"));
    ck_assert_int_eq(items[6].status, CORRAL_FAILED_PRECONDITION);
    ck_assert_ptr_nonnull(strstr(items[6].err.message, "has started"));
    /* The healthy one runs its sampled token next, beside a failing pass it is not part of. */
    gen_batch_item next = {.g = g[0]};
    ck_assert_int_eq(gen_step_batch(&next, 1, &err), CORRAL_OK);
    ck_assert_int_eq(next.status, CORRAL_OK);
    ck_assert_int_eq(next.token.id, want[1]);
    for (int i = 0; i < N; i++) {
        gen_destroy(&g[i]);
        kv_cache_destroy(&kv[i]);
    }
    model_runner_destroy(&r);
    model_destroy(&m);
}
END_TEST

/* Errors of the call as a whole (nothing runs, every item carries the error) and of the pass
 * (the items that needed it fail, the others keep their results). */
START_TEST(test_batch_step_call_errors) {
    model *m = load("models/stories260K.gguf");
    corral_error err;
    model_runner *r = model_runner_new(m, 0, NULL, &err), *r2 = model_runner_new(m, 0, NULL, &err);
    gen_params greedy = gen_params_default();
    greedy.sampling.temperature = 0;
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    kv_cache *a = kv_cache_new(m, 64, KV_TYPE_F32, &err),
             *b = kv_cache_new(m, 64, KV_TYPE_F32, &err);
    generator *ga = gen_new(m, r, a, &greedy, &err), *gb = gen_new(m, r, b, &greedy, &err);
    generator *other = gen_new(m, r2, b, &greedy, &err);
    ck_assert_int_eq(gen_step_batch(NULL, 0, &err), CORRAL_OK);
    /* Another runner. */
    gen_batch_item items[2] = {{.g = ga, .prefill = prompt, .n_prefill = 5}, {.g = other}};
    ck_assert_int_eq(gen_step_batch(items, 2, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "another model or runner"));
    ck_assert_int_eq(items[0].status, CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(items[1].status, CORRAL_INVALID_ARGUMENT);
    ck_assert_uint_eq(kv_cache_n_pos(a), 0); /* item 0's prefill did not run */
    /* The same generator twice. */
    items[1] = (gen_batch_item){.g = ga};
    ck_assert_int_eq(gen_step_batch(items, 2, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "item 1: its generator is item 0's too"));
    ck_assert_uint_eq(kv_cache_n_pos(a), 0);
    ck_assert_int_eq(gen_step_batch(items, 2, NULL), CORRAL_INVALID_ARGUMENT); /* err optional */
    ck_assert_ptr_nonnull(strstr(items[1].err.message, "item 1: its generator is item 0's too"));
    /* Two generators over one cache cannot share a pass: both fail, with the pass's error. */
    generator *gb2 = gen_new(m, r, b, &greedy, &err);
    ck_assert_int_eq(gen_prefill(ga, prompt, 5, &err), CORRAL_OK); /* its first decode: no pass */
    gen_batch_item three[3] = {{.g = gb, .prefill = prompt, .n_prefill = 5},
                               {.g = ga},
                               {.g = gb2, .prefill = prompt, .n_prefill = 5}};
    ck_assert_int_eq(gen_step_batch(three, 3, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "earlier sequence"));
    ck_assert_int_eq(three[0].status, CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(three[2].status, CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(three[1].status, CORRAL_OK);
    ck_assert_int_ge(three[1].token.id, 0);
    ck_assert_uint_eq(kv_cache_n_pos(b), 0);
    ck_assert_uint_eq(gen_get_stats(gb)->n_prompt, 0);
    /* Released weights: the pass fails for the items that need it. */
    model_weights_release(m);
    gen_batch_item one = {.g = ga};
    ck_assert_int_eq(gen_step_batch(&one, 1, &err), CORRAL_FAILED_PRECONDITION);
    ck_assert_int_eq(one.status, CORRAL_FAILED_PRECONDITION);
    ck_assert_ptr_nonnull(strstr(one.err.message, "released"));
    ck_assert_int_eq(model_weights_restore(m, &err), CORRAL_OK);
    ck_assert_int_eq(gen_step_batch(&one, 1, &err), CORRAL_OK); /* the same step, now it runs */
    ck_assert_int_eq(one.status, CORRAL_OK);
    gen_destroy(&ga);
    gen_destroy(&gb);
    gen_destroy(&gb2);
    gen_destroy(&other);
    kv_cache_destroy(&a);
    kv_cache_destroy(&b);
    model_runner_destroy(&r);
    model_runner_destroy(&r2);
    model_destroy(&m);
}
END_TEST

static Suite *generate_suite(void) {
    Suite *s = suite_create("generate");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_same_seed_same_text_different_seed_differs);
    tcase_add_test(core, test_top_k_one_equals_greedy_reference);
    tcase_add_test(core, test_stop_string_cuts_text);
    tcase_add_test(core, test_logprobs_of_greedy_tokens);
    tcase_add_test(core, test_eog_stops_and_is_not_emitted);
    tcase_add_test(core, test_processor_finished_and_errors);
    suite_add_tcase(s, core);
    tcase_add_test(core, test_batch_step_equals_alone);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_context_limit_stops_generation);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_bad_use);
    tcase_add_test(errors, test_batch_step_item_errors);
    tcase_add_test(errors, test_batch_step_call_errors);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(generate_suite)
