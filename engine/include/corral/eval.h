/*
 * eval.h — evaluating a model on text: perplexity, computed exactly as llama.cpp's
 * llama-perplexity does, so that users can compare a model file or a quantization with figures
 * published for llama.cpp.
 */
#ifndef CORRAL_EVAL_H
#define CORRAL_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "corral/model.h"
#include "corral/status.h"

typedef struct eval_perplexity_result {
    double perplexity; /* exp(mean negative log-likelihood) */
    double nll;        /* mean negative log-likelihood, nats per token */
    uint32_t n_chunks; /* chunks of n_ctx tokens evaluated */
    uint64_t n_scored; /* tokens whose likelihood was counted */
} eval_perplexity_result;

/* Perplexity of `tokens` (the whole text tokenized once, with BOS) in non-overlapping chunks of
 * n_ctx tokens: the remainder is dropped; each chunk's first token is replaced by BOS and the
 * chunk is evaluated from an empty KV cache; the predictions of tokens n_ctx/2+1 .. n_ctx-1 of
 * each chunk are scored (the first half only provides context). Needs at least 2 chunks and
 * 16 <= n_ctx <= the model's context: CORRAL_INVALID_ARGUMENT otherwise, naming the numbers.
 * Uses its own KV cache (F32) and runner; the forward passes run on `pool` (borrowed; NULL:
 * the calling thread alone), which must not run anything else meanwhile. */
corral_status eval_perplexity(const model *m, threadpool *pool, const int32_t *tokens,
                              size_t n_tokens, uint32_t n_ctx, eval_perplexity_result *out,
                              corral_error *err);

/* How far a model's predictions are from a reference model's on the same text. */
typedef struct eval_kl_result {
    double kl_mean;        /* mean over scored tokens of KL(reference || model), nats */
    double kl_max;         /* the largest of them */
    double kl_p99;         /* their 99th percentile */
    double top1_agreement; /* share of scored tokens whose most likely next token is the same */
    double perplexity;     /* the model's perplexity on the same tokens */
    double ref_perplexity; /* the reference's */
    uint32_t n_chunks;
    uint64_t n_scored;
} eval_kl_result;

/* KL divergence of model m from the reference ref (e.g. a quantized model from its F32 original:
 * llama-perplexity's --kl-divergence): the same chunks and scored positions as eval_perplexity,
 * and at each, KL(p_ref || p_m) = sum_v p_ref(v) (log p_ref(v) - log p_m(v)) over the vocabulary,
 * in double. The two models must have the same vocabulary size (CORRAL_INVALID_ARGUMENT
 * otherwise); the tokens are the reference's tokenization. Errors and the pool as
 * eval_perplexity's. */
corral_status eval_kl_divergence(const model *ref, const model *m, threadpool *pool,
                                 const int32_t *tokens, size_t n_tokens, uint32_t n_ctx,
                                 eval_kl_result *out, corral_error *err);

/* The log softmax of n logits, in double: out[i] = logits[i] - log sum_j exp(logits[j]). */
void eval_log_softmax(const float *logits, uint32_t n, double *out);

#endif /* CORRAL_EVAL_H */
