/*
 * test_eval.c — Check suite for perplexity: llama-perplexity's figure on the shared sample text,
 * the same figure with a thread pool, and the argument checks; and the KL divergence of one
 * model from another (zero from itself, growing as fewer bits are kept).
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "corral/eval.h"
#include "corral/prompt.h"
#include "corral/threadpool.h"
#include "refdata.h"
#include "testutil.h"

#define PERPLEXITY_REL_TOLERANCE 0.005 /* the acceptance bound: within 0.5% of llama.cpp */

START_TEST(test_perplexity_matches_llama_cpp) {
    corral_error err;
    model *m = model_load(test_shared_path("models/stories260K.gguf"), NULL, &err);
    ck_assert_ptr_nonnull(m);
    size_t len;
    char *text = ref_read_file("reference/tinystories-sample.txt", &len);
    char *want_text = ref_read_file("reference/perplexity.txt", NULL);
    ck_assert_ptr_nonnull(text);
    ck_assert_ptr_nonnull(want_text);
    const double want = strtod(want_text, NULL);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(prompt_tokenize_text(model_get_tokenizer(m), text, len, &ids, &n, &err),
                     CORRAL_OK);
    eval_perplexity_result res;
    ck_assert_int_eq(eval_perplexity(m, NULL, ids, n, 128, &res, &err), CORRAL_OK);
    printf("  perplexity %.4f (llama.cpp %.4f), %u chunks, %llu scored\n", res.perplexity, want,
           res.n_chunks, (unsigned long long)res.n_scored);
    ck_assert_uint_eq(res.n_chunks, n / 128);
    ck_assert_uint_eq(res.n_scored, (uint64_t)res.n_chunks * 63);
    ck_assert_msg(fabs(res.perplexity - want) <= PERPLEXITY_REL_TOLERANCE * want,
                  "perplexity %.4f vs %.4f", res.perplexity, want);
    free(ids);
    free(text);
    free(want_text);
    model_destroy(&m);
}
END_TEST

START_TEST(test_perplexity_argument_errors) {
    corral_error err;
    model *m = model_load(test_shared_path("models/stories260K.gguf"), NULL, &err);
    int32_t ids[300];
    for (int i = 0; i < 300; i++) ids[i] = 1 + i % 400;
    eval_perplexity_result res;
    ck_assert_int_eq(eval_perplexity(m, NULL, ids, 300, 200, &res, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(err.message, "at least 2"));
    ck_assert_int_eq(eval_perplexity(m, NULL, ids, 300, 8, &res, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(eval_perplexity(m, NULL, ids, 300, 4096, &res, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(eval_perplexity(m, NULL, ids, 300, 151, &res, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(eval_perplexity(m, NULL, ids, 300, 128, &res, &err), CORRAL_OK);
    ck_assert(res.perplexity > 1.0 && isfinite(res.perplexity));
    model_destroy(&m);
}
END_TEST

/* A pool changes nothing: the forward pass gives the same bits for any thread count. */
START_TEST(test_perplexity_same_with_threads) {
    corral_error err;
    model *m = model_load(test_shared_path("models/stories260K-q8_0.gguf"), NULL, &err);
    ck_assert_ptr_nonnull(m);
    size_t len;
    char *text = ref_read_file("reference/tinystories-sample.txt", &len);
    ck_assert_ptr_nonnull(text);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(prompt_tokenize_text(model_get_tokenizer(m), text, len, &ids, &n, &err),
                     CORRAL_OK);
    eval_perplexity_result one, two;
    ck_assert_int_eq(eval_perplexity(m, NULL, ids, n, 128, &one, &err), CORRAL_OK);
    threadpool *pool = threadpool_new(2, &err);
    ck_assert_ptr_nonnull(pool);
    ck_assert_int_eq(eval_perplexity(m, pool, ids, n, 128, &two, &err), CORRAL_OK);
    ck_assert_msg(one.nll == two.nll, "nll %.17g with 1 thread, %.17g with 2", one.nll, two.nll);
    ck_assert_uint_eq(one.n_scored, two.n_scored);
    threadpool_destroy(&pool);
    free(ids);
    free(text);
    model_destroy(&m);
}
END_TEST

/* Tokens of the sample with m's tokenizer; caller frees. */
static int32_t *sample_ids(const model *m, size_t *n) {
    size_t len;
    char *text = ref_read_file("reference/tinystories-sample.txt", &len);
    ck_assert_ptr_nonnull(text);
    int32_t *ids;
    corral_error err;
    ck_assert_int_eq(prompt_tokenize_text(model_get_tokenizer(m), text, len, &ids, n, &err),
                     CORRAL_OK);
    free(text);
    return ids;
}

/* KL from itself is exactly 0 (with full agreement and the same perplexity); from the F32 model,
 * Q8_0 is closer than Q4_0, and the model's perplexity is eval_perplexity's. */
START_TEST(test_kl_divergence) {
    corral_error err;
    model *f32 = model_load(test_shared_path("models/stories260K.gguf"), NULL, &err);
    model *q8 = model_load(test_shared_path("models/stories260K-q8_0.gguf"), NULL, &err);
    model *q4 = model_load(test_shared_path("models/stories260K-q4_0.gguf"), NULL, &err);
    ck_assert(f32 && q8 && q4);
    size_t n;
    int32_t *ids = sample_ids(f32, &n);
    eval_kl_result self, k8, k4;
    ck_assert_int_eq(eval_kl_divergence(f32, f32, NULL, ids, n, 128, &self, &err), CORRAL_OK);
    ck_assert(self.kl_mean == 0.0 && self.kl_max == 0.0);
    ck_assert(self.top1_agreement == 1.0);
    ck_assert(self.perplexity == self.ref_perplexity);
    ck_assert_uint_eq(self.n_scored, (uint64_t)(n / 128) * 63);
    ck_assert_int_eq(eval_kl_divergence(f32, q8, NULL, ids, n, 128, &k8, &err), CORRAL_OK);
    ck_assert_int_eq(eval_kl_divergence(f32, q4, NULL, ids, n, 128, &k4, &err), CORRAL_OK);
    printf("  KL from F32: Q8_0 mean %.6f (p99 %.6f, top-1 %.3f), Q4_0 mean %.6f (top-1 %.3f)\n",
           k8.kl_mean, k8.kl_p99, k8.top1_agreement, k4.kl_mean, k4.top1_agreement);
    ck_assert(k8.kl_mean > 0 && k8.kl_mean < k4.kl_mean);
    ck_assert(k8.kl_p99 <= k8.kl_max && k8.kl_mean <= k8.kl_max);
    ck_assert(k4.top1_agreement < 1.0 && k4.top1_agreement > 0.5);
    eval_perplexity_result p8;
    ck_assert_int_eq(eval_perplexity(q8, NULL, ids, n, 128, &p8, &err), CORRAL_OK);
    ck_assert_double_eq_tol(k8.perplexity, p8.perplexity, 1e-9 * p8.perplexity);
    ck_assert_int_eq(eval_kl_divergence(f32, q8, NULL, ids, 300, 200, &k8, &err),
                     CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(eval_kl_divergence(f32, q8, NULL, ids, n, 4096, &k8, &err),
                     CORRAL_INVALID_ARGUMENT);
    free(ids);
    model_destroy(&q4);
    model_destroy(&q8);
    model_destroy(&f32);
}
END_TEST

static Suite *eval_suite(void) {
    Suite *s = suite_create("eval");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_perplexity_matches_llama_cpp);
    tcase_add_test(core, test_perplexity_same_with_threads);
    tcase_add_test(core, test_kl_divergence);
    suite_add_tcase(s, core);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_perplexity_argument_errors);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(eval_suite)
