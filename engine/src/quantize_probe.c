/*
 * quantize_probe.c — how much quantizing one tensor moves a model's predictions: the KL divergence,
 * on calibration text, of the model with that one tensor replaced by its quantized bytes from the
 * model as it is. The size budget (quantize.c) divides it by the tensor's noise-to-signal ratio to
 * get the tensor's measured sensitivity (quantize.h).
 *
 * The model is loaded once in its file's layout (model_params.keep_file_layout), so that a tensor
 * is swapped by pointing its weights at other bytes (model__substitute_tensor) and back; the
 * reference pass's log-probabilities are kept, one float per vocabulary entry per scored token.
 * Each measurement makes its own runner, since a runner's scratch is sized for the weights' types.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "corral/eval.h"
#include "corral/prompt.h"
#include "model_impl.h"
#include "quantize_impl.h"

/* The longest chunk the probe evaluates at once: long enough for attention to matter, short
 * enough that a small text still makes several chunks. */
#define PROBE_CHUNK_MAX 256
#define PROBE_CHUNK_MIN 16

struct quant_probe {
    model *m;
    threadpool *pool;
    uint32_t n_vocab;
    uint32_t n_ctx;    /* tokens per chunk */
    uint32_t n_chunks; /* chunks evaluated */
    int32_t *tokens;   /* [n_chunks][n_ctx], each chunk's first token BOS when the model has one */
    float *ref;        /* [n_chunks * n_ctx][n_vocab]: the reference's log-probabilities */
    float *logits;     /* [n_ctx][n_vocab] */
    double *log_probs; /* [n_vocab] */
    kv_cache *kv;
};

void quant_probe_destroy(quant_probe **pp) {
    if (!pp || !*pp) return;
    quant_probe *p = *pp;
    kv_cache_destroy(&p->kv);
    free(p->tokens);
    free(p->ref);
    free(p->logits);
    free(p->log_probs);
    model_destroy(&p->m);
    free(p);
    *pp = NULL;
}

uint64_t quant_probe_scored(const quant_probe *p) {
    return (uint64_t)p->n_chunks * p->n_ctx;
}

/* Run every chunk; with ref NULL, add each position's KL(reference || model) to *kl_sum, else
 * store the log-probabilities there. */
static corral_status run_chunks(quant_probe *p, float *ref, double *kl_sum, corral_error *err) {
    model_runner *r = model_runner_new(p->m, p->n_ctx, p->pool, err);
    if (!r) return err ? err->status : CORRAL_OUT_OF_MEMORY;
    corral_status st = CORRAL_OK;
    double sum = 0;
    for (uint32_t c = 0; c < p->n_chunks && st == CORRAL_OK; c++) {
        kv_cache_truncate(p->kv, 0);
        st = model_forward(r, p->kv, p->tokens + (size_t)c * p->n_ctx, p->n_ctx, MODEL_LOGITS_ALL,
                           p->logits, err);
        for (uint32_t j = 0; st == CORRAL_OK && j < p->n_ctx; j++) {
            const size_t pos = (size_t)c * p->n_ctx + j;
            eval_log_softmax(p->logits + (size_t)j * p->n_vocab, p->n_vocab, p->log_probs);
            if (ref) {
                for (uint32_t v = 0; v < p->n_vocab; v++)
                    ref[pos * p->n_vocab + v] = (float)p->log_probs[v];
                continue;
            }
            /* Rounded as the reference was stored, so that equal predictions give exactly 0. */
            const float *lr = p->ref + pos * p->n_vocab;
            double kl = 0;
            for (uint32_t v = 0; v < p->n_vocab; v++)
                kl += exp((double)lr[v]) * ((double)lr[v] - (double)(float)p->log_probs[v]);
            sum += kl > 0 ? kl : 0;
        }
    }
    model_runner_destroy(&r);
    if (kl_sum) *kl_sum = sum;
    return st;
}

corral_status quant_probe_new(const char *path, const char *text, size_t len, uint32_t max_tokens,
                              threadpool *pool, quant_probe **out, corral_error *err) {
    *out = NULL;
    quant_probe *p = calloc(1, sizeof *p);
    if (!p) return corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    p->pool = pool;
    model_params mp = model_params_default();
    mp.keep_file_layout = 1;
    p->m = model_load(path, &mp, err);
    if (!p->m) {
        quant_probe_destroy(&p);
        corral_error_prefix(err, "the calibration text needs the input as a model");
        return err ? err->status : CORRAL_INVALID_ARGUMENT;
    }
    const model_hparams *hp = model_get_hparams(p->m);
    const tokenizer *tok = model_get_tokenizer(p->m);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    corral_status st = prompt_tokenize_text(tok, text, len, &ids, &n_ids, err);
    if (st != CORRAL_OK) {
        quant_probe_destroy(&p);
        corral_error_prefix(err, "the calibration text");
        return st;
    }
    /* Chunks of at most PROBE_CHUNK_MAX tokens (and the model's context), as many as the text
     * and max_tokens allow, at least one. */
    uint32_t n_ctx = PROBE_CHUNK_MAX < hp->n_ctx_train ? PROBE_CHUNK_MAX : hp->n_ctx_train;
    const size_t usable = n_ids < max_tokens ? n_ids : max_tokens;
    if (usable < n_ctx) n_ctx = (uint32_t)usable;
    if (n_ctx < PROBE_CHUNK_MIN) {
        free(ids);
        quant_probe_destroy(&p);
        return corral_error_set(err, CORRAL_INVALID_ARGUMENT,
                                "the calibration text has %zu tokens; measuring the tensors' "
                                "sensitivity needs at least %d",
                                n_ids, PROBE_CHUNK_MIN);
    }
    p->n_vocab = hp->n_vocab;
    p->n_ctx = n_ctx;
    p->n_chunks = (uint32_t)(usable / n_ctx);
    const size_t n_tok = (size_t)p->n_chunks * n_ctx;
    p->tokens = malloc(n_tok * sizeof *p->tokens);
    p->ref = malloc(n_tok * p->n_vocab * sizeof *p->ref);
    p->logits = malloc((size_t)n_ctx * p->n_vocab * sizeof *p->logits);
    p->log_probs = malloc(p->n_vocab * sizeof *p->log_probs);
    if (!p->tokens || !p->ref || !p->logits || !p->log_probs) {
        free(ids);
        quant_probe_destroy(&p);
        return corral_error_set(err, CORRAL_OUT_OF_MEMORY,
                                "out of memory for the calibration's %zu tokens of %u "
                                "probabilities",
                                n_tok, hp->n_vocab);
    }
    memcpy(p->tokens, ids, n_tok * sizeof *ids);
    free(ids);
    const int32_t bos = tok_adds_bos(tok) ? tok_bos(tok) : -1;
    for (uint32_t c = 0; bos >= 0 && c < p->n_chunks; c++) p->tokens[(size_t)c * n_ctx] = bos;
    p->kv = kv_cache_new(p->m, n_ctx, KV_TYPE_F32, err);
    st = p->kv ? run_chunks(p, p->ref, NULL, err) : (err ? err->status : CORRAL_OUT_OF_MEMORY);
    if (st != CORRAL_OK) {
        quant_probe_destroy(&p);
        return st;
    }
    *out = p;
    return CORRAL_OK;
}

corral_status quant_probe_kl(quant_probe *p, const char *tensor, tensor_type type, const void *data,
                             double *kl, corral_error *err) {
    *kl = 0;
    const gguf_tensor *t = gguf_find_tensor(model_get_gguf(p->m), tensor);
    if (!t) /* not the model's (the file changed under us?): nothing the model reads */
        return corral_error_set(err, CORRAL_FAILED_PRECONDITION,
                                "tensor %s is not in the model the calibration runs", tensor);
    model__substitute_tensor(p->m, t, type, data);
    double sum = 0;
    const corral_status st = run_chunks(p, NULL, &sum, err);
    model__substitute_tensor(p->m, t, type, NULL);
    if (st != CORRAL_OK) return st;
    *kl = sum / (double)quant_probe_scored(p);
    return CORRAL_OK;
}
