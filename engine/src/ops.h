/*
 * ops.h — the elementwise and row operations of a transformer forward pass (private to the
 * engine): RMS normalisation, rotary position embedding, softmax, SwiGLU and GeGLU.
 *
 * These are the portable reference versions. They follow ggml's arithmetic closely (sums of
 * squares in double, the same RoPE angle recurrence) so that corral's logits agree with
 * llama.cpp's to float rounding.
 */
#ifndef CORRAL_ENGINE_OPS_H
#define CORRAL_ENGINE_OPS_H

#include <stdint.h>

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i], for n elements. out may equal x. */
void ops_rms_norm(float *out, const float *x, const float *weight, int64_t n, float eps);

/* Rotary embedding parameters shared by all heads of one model. */
typedef enum rope_style {
    ROPE_STYLE_NORM = 0, /* rotate adjacent pairs (x[2i], x[2i+1]): llama as stored in GGUF */
    ROPE_STYLE_NEOX = 2, /* rotate halves (x[i], x[i + n_rot/2]): qwen2, GPT-NeoX */
} rope_style;

typedef struct rope_params {
    rope_style style;
    int32_t n_rot;     /* rotated dimensions per head (even, <= head_dim) */
    float freq_base;   /* theta base, e.g. 10000 */
    float freq_scale;  /* 1 / linear scaling factor; 1 = none */
    float ext_factor;  /* YaRN extrapolation mix; 0 = none */
    float attn_factor; /* YaRN magnitude scale; 1 = none */
    float beta_fast, beta_slow;
    int32_t n_ctx_orig;        /* YaRN: the context the model was trained with */
    const float *freq_factors; /* n_rot/2 divisors of the angles (Llama 3.1 rope_freqs), or NULL */
} rope_params;

/* Fill cos_sin[2*i], cos_sin[2*i+1] (i < n_rot/2) with the cosine and sine of the rotation
 * angle of pair i at position pos. */
void ops_rope_cache(const rope_params *p, int32_t pos, float *cos_sin);

/* Rotate n_heads heads of head_dim floats in place with a cache from ops_rope_cache. */
void ops_rope_apply(const rope_params *p, float *x, int32_t n_heads, int32_t head_dim,
                    const float *cos_sin);

/* In-place softmax over n values; returns nothing. Values of -INFINITY get probability 0. */
void ops_softmax(float *x, int64_t n);

/* gate[i] = silu(gate[i]) * up[i]. */
void ops_swiglu(float *gate, const float *up, int64_t n);

/* gate[i] = gelu(gate[i]) * up[i] with GELU's tanh approximation, 0.5 x (1 + tanh(u)),
 * u = sqrt(2/pi) (x + 0.044715 x^3), computed as x / (1 + e^(-2u)) (the same function; one exp,
 * like SiLU's, so the SIMD twins share its vector exp). The constants of u are OPS_GELU_C1 and
 * OPS_GELU_C2 = C1 * 0.044715: u = x * (C1 + C2 * x * x). */
#define OPS_GELU_C1 0.7978845608028654f
#define OPS_GELU_C2 0.035677408136300125f
void ops_geglu(float *gate, const float *up, int64_t n);

/* y[i] += x[i]. */
void ops_add(float *y, const float *x, int64_t n);

#endif /* CORRAL_ENGINE_OPS_H */
