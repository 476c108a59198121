/*
 * ops.c — reference implementations of the row operations in ops.h.
 */
#include "ops.h"

#include <math.h>

void ops_rms_norm(float *out, const float *x, const float *weight, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)x[i] * (double)x[i];
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * weight[i];
}

/* YaRN's ramp: 1 below the low correction dimension, 0 above the high one, linear between. */
static float rope_yarn_ramp(float low, float high, int32_t i0) {
    const float y = ((float)(i0 / 2) - low) / fmaxf(0.001f, high - low);
    return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

/* The dimension at which a rotation makes n_rot full turns over the original context. */
static float rope_yarn_corr_dim(int32_t n_dims, int32_t n_ctx_orig, float n_rot, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2.0f * (float)M_PI)) /
           (2.0f * logf(base));
}

void ops_rope_cache(const rope_params *p, int32_t pos, float *cos_sin) {
    const float theta_scale = powf(p->freq_base, -2.0f / (float)p->n_rot);
    float corr_low = 0.0f, corr_high = 0.0f;
    if (p->ext_factor != 0.0f) {
        corr_low = floorf(rope_yarn_corr_dim(p->n_rot, p->n_ctx_orig, p->beta_fast, p->freq_base));
        corr_high = ceilf(rope_yarn_corr_dim(p->n_rot, p->n_ctx_orig, p->beta_slow, p->freq_base));
        corr_low = fmaxf(0.0f, corr_low);
        corr_high = fminf((float)(p->n_rot - 1), corr_high);
    }
    /* The angle of pair i is pos * theta_scale^i, computed by the same running product as ggml
     * so that the rounding matches. */
    float theta_extrap = (float)pos;
    for (int32_t i0 = 0; i0 < p->n_rot; i0 += 2) {
        const float ff = p->freq_factors ? p->freq_factors[i0 / 2] : 1.0f;
        const float extrap = theta_extrap / ff;
        const float interp = p->freq_scale * extrap;
        float theta = interp;
        float mscale = p->attn_factor;
        if (p->ext_factor != 0.0f) {
            const float mix = rope_yarn_ramp(corr_low, corr_high, i0) * p->ext_factor;
            theta = interp * (1.0f - mix) + extrap * mix;
            mscale *= 1.0f + 0.1f * logf(1.0f / p->freq_scale);
        }
        cos_sin[i0] = cosf(theta) * mscale;
        cos_sin[i0 + 1] = sinf(theta) * mscale;
        theta_extrap *= theta_scale;
    }
}

void ops_rope_apply(const rope_params *p, float *x, int32_t n_heads, int32_t head_dim,
                    const float *cos_sin) {
    const int32_t half = p->n_rot / 2;
    for (int32_t h = 0; h < n_heads; h++) {
        float *v = x + (int64_t)h * head_dim;
        for (int32_t i = 0; i < half; i++) {
            const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
            /* NORM pairs neighbours; NEOX pairs element i with element i + n_rot/2. */
            const int32_t a = p->style == ROPE_STYLE_NEOX ? i : 2 * i;
            const int32_t b = p->style == ROPE_STYLE_NEOX ? i + half : 2 * i + 1;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

void ops_softmax(float *x, int64_t n) {
    float max = -INFINITY;
    for (int64_t i = 0; i < n; i++) max = fmaxf(max, x[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float e = x[i] == -INFINITY ? 0.0f : expf(x[i] - max);
        x[i] = e;
        sum += e;
    }
    const float inv = sum > 0.0 ? (float)(1.0 / sum) : 0.0f;
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void ops_swiglu(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void ops_geglu(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        const float z = (g * g * OPS_GELU_C2 + OPS_GELU_C1) * g * -2.0f;
        gate[i] = g / (1.0f + expf(z)) * up[i];
    }
}

void ops_add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}
