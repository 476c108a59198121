/*
 * eval.c — perplexity the way llama-perplexity computes it, and the KL divergence of one model
 * from another on the same chunks (see eval.h).
 */
#include "corral/eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "corral/tokenizer.h"

/* -log softmax(logits)[target], in double. */
static double neg_log_prob(const float *logits, uint32_t n_vocab, int32_t target) {
    float max = logits[0];
    for (uint32_t i = 1; i < n_vocab; i++)
        if (logits[i] > max) max = logits[i];
    double sum = 0.0;
    for (uint32_t i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - max);
    return log(sum) - ((double)logits[target] - max);
}

corral_status eval_perplexity(const model *m, threadpool *pool, const int32_t *tokens,
                              size_t n_tokens, uint32_t n_ctx, eval_perplexity_result *out,
                              corral_error *err) {
    const model_hparams *hp = model_get_hparams(m);
    if (n_ctx < 16 || n_ctx > hp->n_ctx_train)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "context %u is outside 16..%u (the model's context)", n_ctx,
                                hp->n_ctx_train);
    const size_t n_chunks = n_tokens / n_ctx;
    if (n_chunks < 2)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "%zu tokens make %zu chunk(s) of %u; perplexity needs at least 2 "
                                "(use a longer text or a smaller context)",
                                n_tokens, n_chunks, n_ctx);
    const int32_t bos = tok_bos(model_get_tokenizer(m));

    corral_status st = CORRAL_OUT_OF_MEMORY;
    kv_cache *kv = kv_cache_new(m, n_ctx, KV_TYPE_F32, err);
    model_runner *r = kv ? model_runner_new(m, n_ctx, pool, err) : NULL;
    int32_t *chunk = malloc(n_ctx * sizeof *chunk);
    float *logits = malloc((size_t)n_ctx * hp->n_vocab * sizeof *logits);
    if (!kv || !r) {
        st = err ? err->status : CORRAL_OUT_OF_MEMORY;
        goto done;
    }
    if (!chunk || !logits) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        goto done;
    }

    double total = 0.0;
    uint64_t count = 0;
    const uint32_t first = n_ctx / 2;
    for (size_t c = 0; c < n_chunks; c++) {
        memcpy(chunk, tokens + c * n_ctx, n_ctx * sizeof *chunk);
        if (bos >= 0) chunk[0] = bos;
        kv_cache_truncate(kv, 0);
        st = model_forward(r, kv, chunk, n_ctx, MODEL_LOGITS_ALL, logits, err);
        if (st != CORRAL_OK) goto done;
        for (uint32_t j = first; j + 1 < n_ctx; j++) {
            total += neg_log_prob(logits + (size_t)j * hp->n_vocab, hp->n_vocab, chunk[j + 1]);
            count++;
        }
    }
    out->n_chunks = (uint32_t)n_chunks;
    out->n_scored = count;
    out->nll = total / (double)count;
    out->perplexity = exp(out->nll);
    st = CORRAL_OK;
done:
    free(chunk);
    free(logits);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
    return st;
}

void eval_log_softmax(const float *logits, uint32_t n, double *out) {
    float max = logits[0];
    for (uint32_t i = 1; i < n; i++)
        if (logits[i] > max) max = logits[i];
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++) sum += exp((double)logits[i] - max);
    const double lse = log(sum) + max;
    for (uint32_t i = 0; i < n; i++) out[i] = (double)logits[i] - lse;
}

static uint32_t argmax(const float *x, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

corral_status eval_kl_divergence(const model *ref, const model *m, threadpool *pool,
                                 const int32_t *tokens, size_t n_tokens, uint32_t n_ctx,
                                 eval_kl_result *out, corral_error *err) {
    const model_hparams *hr = model_get_hparams(ref), *hm = model_get_hparams(m);
    if (hr->n_vocab != hm->n_vocab)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "the models' vocabularies differ (%u and %u tokens)", hr->n_vocab,
                                hm->n_vocab);
    const uint32_t ctx_max = hr->n_ctx_train < hm->n_ctx_train ? hr->n_ctx_train : hm->n_ctx_train;
    if (n_ctx < 16 || n_ctx > ctx_max)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "context %u is outside 16..%u (the models' context)", n_ctx,
                                ctx_max);
    const size_t n_chunks = n_tokens / n_ctx;
    if (n_chunks < 2)
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "%zu tokens make %zu chunk(s) of %u; at least 2 are needed (use a "
                                "longer text or a smaller context)",
                                n_tokens, n_chunks, n_ctx);
    const uint32_t n_vocab = hr->n_vocab, first = n_ctx / 2;
    const int32_t bos = tok_bos(model_get_tokenizer(ref));
    const size_t n_scored = n_chunks * (size_t)(n_ctx - 1 - first);

    corral_status st = CORRAL_OUT_OF_MEMORY;
    kv_cache *kv_r = kv_cache_new(ref, n_ctx, KV_TYPE_F32, err);
    kv_cache *kv_m = kv_r ? kv_cache_new(m, n_ctx, KV_TYPE_F32, err) : NULL;
    model_runner *rr = kv_m ? model_runner_new(ref, n_ctx, pool, err) : NULL;
    model_runner *rm = rr ? model_runner_new(m, n_ctx, pool, err) : NULL;
    int32_t *chunk = malloc(n_ctx * sizeof *chunk);
    float *lr = malloc((size_t)n_ctx * n_vocab * sizeof *lr);
    float *lm = malloc((size_t)n_ctx * n_vocab * sizeof *lm);
    double *pr = malloc(2 * (size_t)n_vocab * sizeof *pr);
    double *kls = malloc(n_scored * sizeof *kls);
    if (!rm) {
        st = err ? err->status : CORRAL_OUT_OF_MEMORY;
        goto done;
    }
    if (!chunk || !lr || !lm || !pr || !kls) {
        st = corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    double *pm = pr + n_vocab;
    double nll_r = 0, nll_m = 0, kl_sum = 0;
    uint64_t count = 0, agree = 0;
    for (size_t c = 0; c < n_chunks; c++) {
        memcpy(chunk, tokens + c * n_ctx, n_ctx * sizeof *chunk);
        if (bos >= 0) chunk[0] = bos;
        kv_cache_truncate(kv_r, 0);
        kv_cache_truncate(kv_m, 0);
        st = model_forward(rr, kv_r, chunk, n_ctx, MODEL_LOGITS_ALL, lr, err);
        if (st == CORRAL_OK) st = model_forward(rm, kv_m, chunk, n_ctx, MODEL_LOGITS_ALL, lm, err);
        if (st != CORRAL_OK) goto done;
        for (uint32_t j = first; j + 1 < n_ctx; j++) {
            const float *a = lr + (size_t)j * n_vocab, *b = lm + (size_t)j * n_vocab;
            eval_log_softmax(a, n_vocab, pr);
            eval_log_softmax(b, n_vocab, pm);
            double kl = 0;
            for (uint32_t v = 0; v < n_vocab; v++) kl += exp(pr[v]) * (pr[v] - pm[v]);
            kl = kl > 0 ? kl : 0; /* rounding can leave a tiny negative for equal distributions */
            kls[count] = kl;
            kl_sum += kl;
            nll_r -= pr[chunk[j + 1]];
            nll_m -= pm[chunk[j + 1]];
            agree += argmax(a, n_vocab) == argmax(b, n_vocab);
            count++;
        }
    }
    qsort(kls, count, sizeof *kls, cmp_double);
    out->kl_mean = kl_sum / (double)count;
    out->kl_max = kls[count - 1];
    out->kl_p99 = kls[(size_t)((double)(count - 1) * 0.99)];
    out->top1_agreement = (double)agree / (double)count;
    out->perplexity = exp(nll_m / (double)count);
    out->ref_perplexity = exp(nll_r / (double)count);
    out->n_chunks = (uint32_t)n_chunks;
    out->n_scored = count;
    st = CORRAL_OK;
done:
    free(chunk);
    free(lr);
    free(lm);
    free(pr);
    free(kls);
    model_runner_destroy(&rm);
    model_runner_destroy(&rr);
    kv_cache_destroy(&kv_m);
    kv_cache_destroy(&kv_r);
    return st;
}
