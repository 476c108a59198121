/*
 * quantize_impl.h — what the two halves of the quantize module share (private to the engine):
 * quantize_plan.c decides each tensor's type (llama.cpp's recipe), quantize.c measures, budgets
 * and writes.
 */
#ifndef CORRAL_ENGINE_QUANTIZE_IMPL_H
#define CORRAL_ENGINE_QUANTIZE_IMPL_H

#include <stdint.h>

#include "corral/quantize.h"
#include "corral/threadpool.h"

/* One tensor of a plan, in the output's order. */
typedef struct quant_tensor {
    const gguf_tensor *t; /* in the input file */
    uint64_t index;       /* its index there */
    char name[QUANTIZE_NAME_MAX];
    int layer; /* N of "blk.N.", or -1 */
    uint64_t n_elements;
    int64_t n_rows; /* n_elements / ne[0] */
    uint32_t type;  /* the output type */
    quantize_reason reason;
    int eligible;              /* target_bpw may choose its type */
    int from_source;           /* its rows come from params->source */
    int convert;               /* its bytes are produced (else copied from the input) */
    const float *importance;   /* its importance matrix entry (ne[0] * ne[2] floats), or NULL */
    int64_t importance_stride; /* floats of importance per matrix (ne[0]); 0 when none */
    double sensitivity; /* the budget's weight of its noise-to-signal ratio (quantize.h) */
    double budget_error; /* the budget's chosen type: that ratio times the sensitivity */
    int measured;
    double weight_error, output_error;
} quant_tensor;

/* The input's tensors in llama.cpp's order with their output types, as quantize.h describes
 * (overrides, recipe, fallbacks), importance entries looked up and every tensor checked for
 * conversion. *out (n_tensors entries) is the caller's to free. *n_fallback counts fallbacks.
 * Errors as quantize_plan's. */
corral_status quantize__plan_types(const gguf_file *in, const quantize_params *p,
                                   quant_tensor **out, uint32_t *n_fallback, corral_error *err);

/* 1 if the engine can write tensors of `type` (it has kernels for it: tensor_type_is_supported). */
int quantize__type_writable(uint32_t type);

/* The sensitivity probe (quantize_probe.c): the model at `path` evaluated on calibration text
 * (at most max_tokens of it, in chunks of up to 256 tokens, each from an empty cache with BOS
 * first), its log-probabilities kept as the reference. Errors: model_load's, the tokenizer's,
 * CORRAL_INVALID_ARGUMENT for a text under 16 tokens, CORRAL_OUT_OF_MEMORY. */
typedef struct quant_probe quant_probe;
corral_status quant_probe_new(const char *path, const char *text, size_t len, uint32_t max_tokens,
                              threadpool *pool, quant_probe **out, corral_error *err);
void quant_probe_destroy(quant_probe **p);

/* Tokens whose predictions are compared (every position of every chunk). */
uint64_t quant_probe_scored(const quant_probe *p);

/* The mean KL(reference || model) over the scored tokens with the tensor named `tensor` replaced
 * by `data`: its rows in `type` (tensor_quantize_rows's layout, same shape); the model is as it
 * was afterwards. */
corral_status quant_probe_kl(quant_probe *p, const char *tensor, tensor_type type, const void *data,
                             double *kl, corral_error *err);

#endif /* CORRAL_ENGINE_QUANTIZE_IMPL_H */
