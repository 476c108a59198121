/*
 * test_eval.c — Check suite for perplexity: llama-perplexity's figure on the shared sample text,
 * the same figure with a thread pool, and the argument checks.
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

static Suite *eval_suite(void) {
    Suite *s = suite_create("eval");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_perplexity_matches_llama_cpp);
    tcase_add_test(core, test_perplexity_same_with_threads);
    suite_add_tcase(s, core);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_perplexity_argument_errors);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(eval_suite)
