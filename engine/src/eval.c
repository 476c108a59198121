/*
 * eval.c — perplexity the way llama-perplexity computes it (see eval.h).
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
