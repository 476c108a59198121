/*
 * tensor_quant.c — scalar reference kernels: dequantize, quantize and dot product per type.
 *
 * These are the portable kernels of the trait table (tensor.c) and the yardstick that SIMD
 * kernels are tested against, so they are written to be read, not to be fast.
 *
 * Quantizers are bit-exact with ggml's quantize_row_*_ref: a GGUF tensor quantized here is byte
 * for byte the tensor llama-quantize writes (without an importance matrix), and activations are
 * rounded exactly as llama.cpp rounds them. Bit-exactness needs the same float operations in the
 * same order with no fused multiply-add: the project builds in ISO C mode, where GCC does not
 * contract a * b + c into an FMA, and the pragma below stops Clang. The golden tests compare
 * against llama.cpp's own files. Where ggml's code would convert an out-of-range float to
 * an integer (undefined behaviour) the conversion here clamps first; that changes nothing for
 * finite input and keeps NaN or infinite input harmless (it gives garbage, never a crash).
 *
 * Dot products follow ggml's scalar ("generic") paths: for each block, an exact integer sum of
 * the quant products, then one float multiply by the two scales, accumulated in float over the
 * row. The weight's additive part (the minimum of Q4_1/Q5_1, the sub-block mins of Q4_K/Q5_K)
 * is applied through the activation's precomputed sums (Q8_1's s, Q8_K's bsums), as ggml does.
 */
#include "tensor_quant.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "corral/tensor.h"
#include "tensor_blocks.h"

/* GCC never contracts in ISO C mode (and warns about this pragma); Clang contracts by default. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- rounding helpers (nearest_int, clamp_int and GROUP_MAX_EPS are in tensor_quant.h) ----- */

/* The code ggml computes as MIN(hi, (int8_t)v) for v >= 0: truncation toward zero, capped. */
static inline int trunc_code(float v, int hi) {
    if (!(v > 0.0f)) return 0; /* also NaN */
    if (v >= (float)hi) return hi;
    return (int)v;
}

/* roundf (ties away from zero) to int8, as ggml's Q8_0/Q8_1 quantizers. */
static inline int8_t round_int8(float v) {
    if (isnan(v)) return 0;
    const float r = roundf(v);
    return (int8_t)(r < -128.0f ? -128 : r > 127.0f ? 127 : (int)r);
}

static inline float from_fp16(uint16_t h) {
    return tensor_fp16_to_f32(h);
}

/* The 32 fifth bits of a Q5_0/Q5_1 block as one little-endian word. */
static inline uint32_t q5_high_bits(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

static inline void q5_store_high_bits(uint8_t qh[4], uint32_t bits) {
    for (int i = 0; i < 4; i++) qh[i] = (uint8_t)(bits >> (8 * i));
}

/* ---- F32 ------------------------------------------------------------------------------------- */

void tensor__dequantize_row_f32(const void *restrict src, float *restrict dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void tensor__quantize_row_f32(const float *restrict src, void *restrict dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

/* Each product is rounded to float and the sum kept in double, like ggml's scalar
 * ggml_vec_dot_f32 (its SIMD paths sum in float lanes, so llama.cpp differs in the last bits). */
void tensor__vec_dot_f32(int64_t n, float *restrict s, const void *restrict x,
                         const void *restrict y) {
    const float *a = x, *b = y;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(a[i] * b[i]);
    *s = (float)sum;
}

/* ---- F16 ------------------------------------------------------------------------------------- */

void tensor__dequantize_row_f16(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = tensor_fp16_to_f32(h[i]);
}

void tensor__quantize_row_f16(const float *restrict src, void *restrict dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = tensor_f32_to_fp16(src[i]);
}

/* A product of two halves has at most 22 significant bits, so it is exact in float; the sum is
 * kept in double as in ggml's scalar ggml_vec_dot_f16. */
void tensor__vec_dot_f16(int64_t n, float *restrict s, const void *restrict x,
                         const void *restrict y) {
    const uint16_t *a = x, *b = y;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        sum += (double)(tensor_fp16_to_f32(a[i]) * tensor_fp16_to_f32(b[i]));
    }
    *s = (float)sum;
}

/* ---- BF16 ------------------------------------------------------------------------------------ */

void tensor__dequantize_row_bf16(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = tensor_bf16_to_f32(h[i]);
}

void tensor__quantize_row_bf16(const float *restrict src, void *restrict dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = tensor_f32_to_bf16(src[i]);
}

/* bfloat16 products (at most 16 significant bits) are exact in float; the sum is in double as in
 * ggml's scalar ggml_vec_dot_bf16. */
void tensor__vec_dot_bf16(int64_t n, float *restrict s, const void *restrict x,
                          const void *restrict y) {
    const uint16_t *a = x, *b = y;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        sum += (double)(tensor_bf16_to_f32(a[i]) * tensor_bf16_to_f32(b[i]));
    }
    *s = (float)sum;
}

/* ---- Q4_0 ------------------------------------------------------------------------------------ */

void tensor__dequantize_row_q4_0(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % QK4_0 == 0);
    const block_q4_0 *x = src;
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const float d = from_fp16(x[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            dst[i * QK4_0 + j] = (float)((x[i].qs[j] & 0x0F) - 8) * d;
            dst[i * QK4_0 + j + QK4_0 / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

/* The value of largest magnitude maps to code 0 (d = max / -8, so it is reproduced exactly up to
 * the fp16 rounding of d); the others round to nearest. Codes run 0..15, so the side opposite the
 * maximum saturates at 7 * |d|. */
void tensor__quantize_row_q4_0(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % QK4_0 == 0);
    block_q4_0 *y = dst;
    for (int64_t i = 0; i < n / QK4_0; i++) {
        const float *x = src + i * QK4_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tensor_f32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int q0 = trunc_code(x[j] * id + 8.5f, 15);
            const int q1 = trunc_code(x[j + QK4_0 / 2] * id + 8.5f, 15);
            y[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

void tensor__vec_dot_q4_0_q8_0(int64_t n, float *restrict s, const void *restrict vx,
                               const void *restrict vy) {
    assert(n % QK8_0 == 0);
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int32_t sumi = 0;
        for (int j = 0; j < QK8_0 / 2; j++) {
            sumi += ((x[i].qs[j] & 0x0F) - 8) * y[i].qs[j];
            sumi += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + QK8_0 / 2];
        }
        sum += (from_fp16(x[i].d) * from_fp16(y[i].d)) * (float)sumi;
    }
    *s = sum;
}

/* ---- Q4_1 ------------------------------------------------------------------------------------ */

void tensor__dequantize_row_q4_1(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % QK4_1 == 0);
    const block_q4_1 *x = src;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        const float d = from_fp16(x[i].d), m = from_fp16(x[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            dst[i * QK4_1 + j] = (float)(x[i].qs[j] & 0x0F) * d + m;
            dst[i * QK4_1 + j + QK4_1 / 2] = (float)(x[i].qs[j] >> 4) * d + m;
        }
    }
}

/* The block's range [min, max] is cut into 15 equal steps; codes round to nearest. */
void tensor__quantize_row_q4_1(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % QK4_1 == 0);
    block_q4_1 *y = dst;
    for (int64_t i = 0; i < n / QK4_1; i++) {
        const float *x = src + i * QK4_1;
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK4_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tensor_f32_to_fp16(d);
        y[i].m = tensor_f32_to_fp16(min);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int q0 = trunc_code((x[j] - min) * id + 0.5f, 15);
            const int q1 = trunc_code((x[j + QK4_1 / 2] - min) * id + 0.5f, 15);
            y[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

void tensor__vec_dot_q4_1_q8_1(int64_t n, float *restrict s, const void *restrict vx,
                               const void *restrict vy) {
    assert(n % QK8_1 == 0);
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        int32_t sumi = 0;
        for (int j = 0; j < QK8_1 / 2; j++) {
            sumi += (x[i].qs[j] & 0x0F) * y[i].qs[j];
            sumi += (x[i].qs[j] >> 4) * y[i].qs[j + QK8_1 / 2];
        }
        /* sum (d*q + m) * y = d * dy * sum(q * qy) + m * (dy * sum(qy)), the last factor being
         * the activation block's s. */
        sum += (from_fp16(x[i].d) * from_fp16(y[i].d)) * (float)sumi +
               from_fp16(x[i].m) * from_fp16(y[i].s);
    }
    *s = sum;
}

/* ---- Q5_0 ------------------------------------------------------------------------------------ */

void tensor__dequantize_row_q5_0(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % QK5_0 == 0);
    const block_q5_0 *x = src;
    for (int64_t i = 0; i < n / QK5_0; i++) {
        const float d = from_fp16(x[i].d);
        const uint32_t qh = q5_high_bits(x[i].qh);
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int q0 = (x[i].qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4;
            const int q1 = (x[i].qs[j] >> 4) | (int)((qh >> (j + QK5_0 / 2)) & 1) << 4;
            dst[i * QK5_0 + j] = (float)(q0 - 16) * d;
            dst[i * QK5_0 + j + QK5_0 / 2] = (float)(q1 - 16) * d;
        }
    }
}

/* As Q4_0 with 32 levels: the largest magnitude maps to code 0 (d = max / -16). */
void tensor__quantize_row_q5_0(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % QK5_0 == 0);
    block_q5_0 *y = dst;
    for (int64_t i = 0; i < n / QK5_0; i++) {
        const float *x = src + i * QK5_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK5_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tensor_f32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int q0 = trunc_code(x[j] * id + 16.5f, 31);
            const int q1 = trunc_code(x[j + QK5_0 / 2] * id + 16.5f, 31);
            y[i].qs[j] = (uint8_t)((q0 & 0x0F) | (q1 & 0x0F) << 4);
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + QK5_0 / 2);
        }
        q5_store_high_bits(y[i].qh, qh);
    }
}

void tensor__vec_dot_q5_0_q8_0(int64_t n, float *restrict s, const void *restrict vx,
                               const void *restrict vy) {
    assert(n % QK8_0 == 0);
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const uint32_t qh = q5_high_bits(x[i].qh);
        int32_t sumi = 0;
        for (int j = 0; j < QK8_0 / 2; j++) {
            const int q0 = (x[i].qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4;
            const int q1 = (x[i].qs[j] >> 4) | (int)((qh >> (j + QK8_0 / 2)) & 1) << 4;
            sumi += (q0 - 16) * y[i].qs[j];
            sumi += (q1 - 16) * y[i].qs[j + QK8_0 / 2];
        }
        sum += (from_fp16(x[i].d) * from_fp16(y[i].d)) * (float)sumi;
    }
    *s = sum;
}

/* ---- Q5_1 ------------------------------------------------------------------------------------ */

void tensor__dequantize_row_q5_1(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % QK5_1 == 0);
    const block_q5_1 *x = src;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        const float d = from_fp16(x[i].d), m = from_fp16(x[i].m);
        const uint32_t qh = q5_high_bits(x[i].qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int q0 = (x[i].qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4;
            const int q1 = (x[i].qs[j] >> 4) | (int)((qh >> (j + QK5_1 / 2)) & 1) << 4;
            dst[i * QK5_1 + j] = (float)q0 * d + m;
            dst[i * QK5_1 + j + QK5_1 / 2] = (float)q1 * d + m;
        }
    }
}

/* As Q4_1 with 31 steps. */
void tensor__quantize_row_q5_1(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % QK5_1 == 0);
    block_q5_1 *y = dst;
    for (int64_t i = 0; i < n / QK5_1; i++) {
        const float *x = src + i * QK5_1;
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK5_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tensor_f32_to_fp16(d);
        y[i].m = tensor_f32_to_fp16(min);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int q0 = trunc_code((x[j] - min) * id + 0.5f, 31);
            const int q1 = trunc_code((x[j + QK5_1 / 2] - min) * id + 0.5f, 31);
            y[i].qs[j] = (uint8_t)((q0 & 0x0F) | (q1 & 0x0F) << 4);
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + QK5_1 / 2);
        }
        q5_store_high_bits(y[i].qh, qh);
    }
}

void tensor__vec_dot_q5_1_q8_1(int64_t n, float *restrict s, const void *restrict vx,
                               const void *restrict vy) {
    assert(n % QK8_1 == 0);
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        const uint32_t qh = q5_high_bits(x[i].qh);
        int32_t sumi = 0;
        for (int j = 0; j < QK8_1 / 2; j++) {
            const int q0 = (x[i].qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4;
            const int q1 = (x[i].qs[j] >> 4) | (int)((qh >> (j + QK8_1 / 2)) & 1) << 4;
            sumi += q0 * y[i].qs[j];
            sumi += q1 * y[i].qs[j + QK8_1 / 2];
        }
        sum += (from_fp16(x[i].d) * from_fp16(y[i].d)) * (float)sumi +
               from_fp16(x[i].m) * from_fp16(y[i].s);
    }
    *s = sum;
}

/* ---- Q8_0 ------------------------------------------------------------------------------------ */

void tensor__dequantize_row_q8_0(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % QK8_0 == 0);
    const block_q8_0 *x = src;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float d = from_fp16(x[i].d);
        for (int j = 0; j < QK8_0; j++) dst[i * QK8_0 + j] = (float)x[i].qs[j] * d;
    }
}

/* Symmetric: d = amax / 127, codes round half away from zero (roundf). */
void tensor__quantize_row_q8_0(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % QK8_0 == 0);
    block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float *x = src + i * QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tensor_f32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = round_int8(x[j] * id);
    }
}

void tensor__vec_dot_q8_0_q8_0(int64_t n, float *restrict s, const void *restrict vx,
                               const void *restrict vy) {
    assert(n % QK8_0 == 0);
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int32_t sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += x[i].qs[j] * y[i].qs[j];
        sum += (from_fp16(x[i].d) * from_fp16(y[i].d)) * (float)sumi;
    }
    *s = sum;
}

/* ---- Q8_1 (activations of Q4_1 and Q5_1) ----------------------------------------------------- */

void tensor__dequantize_row_q8_1(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % QK8_1 == 0);
    const block_q8_1 *x = src;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        const float d = from_fp16(x[i].d);
        for (int j = 0; j < QK8_1; j++) dst[i * QK8_1 + j] = (float)x[i].qs[j] * d;
    }
}

/* As Q8_0, plus s = d * sum(qs) rounded to fp16. */
void tensor__quantize_row_q8_1(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % QK8_1 == 0);
    block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        const float *x = src + i * QK8_1;
        float amax = 0.0f;
        for (int j = 0; j < QK8_1; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = tensor_f32_to_fp16(d);
        int32_t sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            y[i].qs[j] = round_int8(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].s = tensor_f32_to_fp16((float)sum * d);
    }
}

/* ---- K-quant scale search -------------------------------------------------------------------- */

/*
 * Fit x[i] ~ scale * L[i] - the_min with integer codes L[i] in 0..nmax, minimising the weighted
 * squared error sum w[i] * (scale * L[i] - the_min - x[i])^2. (ggml's make_qkx2_quants with
 * use_mad off; Q4_K and Q5_K use it for each sub-block of 32.)
 *
 * The offset is the group's minimum, but never above 0 (then the_min >= 0 and is stored as an
 * unsigned 6-bit multiple of dmin). The starting point spreads [min, max] over nmax steps. Then
 * nstep + 1 candidate grids are tried, whose step is (max - min) / (nmax + rmin + rdelta * k)
 * for k = 0..nstep: slightly coarser or finer grids round some values the other way. For each
 * grid the codes are fixed by rounding, and scale and offset are then refitted to those codes by
 * weighted least squares (the 2x2 normal equations, determinant D); if the refitted offset comes
 * out positive it is pinned to 0 and only the scale is refitted. A candidate replaces the best
 * so far when its weighted error is strictly smaller. Returns the scale and sets *the_min.
 *
 * All sums are float and accumulated in index order, exactly as in ggml, so that the choice
 * between two nearly equal candidates is the same and the output is bit-identical.
 */
float tensor__fit_scale_min(int n, int nmax, const float *restrict x, const float *restrict w,
                            uint8_t *restrict L, float *restrict the_min, float rmin, float rdelta,
                            int nstep) {
    uint8_t Laux[32];
    assert(n <= 32);
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
        const float diff = scale * L[i] + min - x[i];
        best_error += w[i] * (diff * diff);
    }
    for (int k = 0; k <= nstep; k++) {
        iscale = (rmin + rdelta * (float)k + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float error = 0;
            for (int i = 0; i < n; i++) {
                const float diff = this_scale * Laux[i] + this_min - x[i];
                error += w[i] * (diff * diff);
            }
            if (error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/*
 * Fit x[i] ~ scale * (L[i] - nmax) with codes L[i] in 0..2*nmax-1, minimising the weighted squared
 * error sum w[i] * (scale * (L[i] - nmax) - x[i])^2. Without importance weights (w NULL) each
 * value weighs x[i]^2, so that large values are reproduced best. (ggml's make_qx_quants with
 * rmse_type 1: Q6_K uses it for each sub-block of 16 with nmax 32, and the importance-weighted
 * Q4_0/Q5_0/Q6_K quantizers of tensor_quant_weighted.c with their weights.)
 *
 * The starting grid maps the value of largest magnitude, `max`, to code -nmax (so the scale has
 * the sign of -max and that value is exact). Then 18 neighbouring grids are tried, mapping max to
 * -(nmax + 0.1 * k) for k = -9..9, k != 0. For each, codes are fixed by rounding and the best
 * scale for them has the closed form sum(w*x*l) / sum(w*l^2); its error is the total minus
 * sumlx^2 / suml2, so the grid with the largest sumlx^2 / suml2 wins (compared without division
 * as sumlx^2 > best * suml2). Returns the scale (0 for an all-zero group).
 */
float tensor__fit_scale_symmetric(int n, int nmax, const float *restrict x, const float *restrict w,
                                  uint8_t *restrict L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)-nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (uint8_t)(l + nmax);
        const float wi = w ? w[i] : x[i] * x[i];
        sumlx += wi * x[i] * (float)l;
        suml2 += wi * (float)l * (float)l;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int k = -9; k <= 9; k++) {
        if (k == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)k) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float wi = w ? w[i] : x[i] * x[i];
            sumlx += wi * x[i] * (float)l;
            suml2 += wi * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                L[i] = (uint8_t)(clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1) + nmax);
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* ---- Q4_K and Q5_K shared parts -------------------------------------------------------------- */

/*
 * The end of a Q4_K/Q5_K super-block, shared by the reference and the importance-weighted
 * quantizers: the 6-bit sub-block scales ls[] and mins lm[] are packed with their fp16
 * super-block scales d and dmin, and every value is re-rounded against its sub-block's stored
 * scale and min, so the codes fit the parameters actually stored. A sub-block whose stored
 * scale is 0 keeps the codes the caller put in L (they then dequantize to -min whatever they
 * are). Writes the codes (0..nmax) to L.
 */
void tensor__k4_finish(const float *restrict x, int nmax, const uint8_t ls[QK_K / 32],
                       const uint8_t lm[QK_K / 32], float d, float dmin, uint8_t L[QK_K],
                       uint16_t *d_out, uint16_t *dmin_out, uint8_t packed[K_SCALE_SIZE]) {
    tensor__k4_pack_scale_min(packed, ls, lm);
    *d_out = tensor_f32_to_fp16(d);
    *dmin_out = tensor_f32_to_fp16(dmin);
    const float d_all = from_fp16(*d_out), dmin_all = from_fp16(*dmin_out);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        tensor__k4_scale_min(j, packed, &sc, &m);
        const float dj = d_all * sc;
        if (dj == 0.0f) continue;
        const float dm = dmin_all * m;
        for (int i = 0; i < 32; i++) {
            L[32 * j + i] = (uint8_t)clamp_int(nearest_int((x[32 * j + i] + dm) / dj), 0, nmax);
        }
    }
}

/*
 * Quantize one super-block of 256 values for Q4_K (nmax 15) or Q5_K (nmax 31), as ggml's
 * quantize_row_q4_K_ref / q5_K_ref:
 *   1. each sub-block of 32 gets its own (scale, min) from tensor__fit_scale_min, weighting each
 *      value by rms(sub-block) + |x| (large values matter more, small ones still count);
 *   2. the 8 scales are quantized to 6 bits against d = max scale / 63, the 8 mins against
 *      dmin = max min / 63; d and dmin are stored as fp16;
 *   3. tensor__k4_finish re-rounds every value against the stored parameters.
 * Writes the codes (0..nmax) to L and the block header fields.
 */
static void k4_quantize_superblock(const float *restrict x, int nmax, float rmin, float rdelta,
                                   int nstep, uint8_t L[QK_K], uint16_t *d_out, uint16_t *dmin_out,
                                   uint8_t packed[K_SCALE_SIZE]) {
    float scales[QK_K / 32], mins[QK_K / 32], weights[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(xs[l]);
        scales[j] =
            tensor__fit_scale_min(32, nmax, xs, weights, L + 32 * j, &mins[j], rmin, rdelta, nstep);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }

    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t ls[QK_K / 32], lm[QK_K / 32];
    for (int j = 0; j < QK_K / 32; j++) {
        /* ggml stores these through uint8_t before capping at 63: a (theoretical) negative
         * scale wraps to a large value and is capped, exactly as there. */
        const uint8_t s = (uint8_t)nearest_int(inv_scale * scales[j]);
        const uint8_t m = (uint8_t)nearest_int(inv_min * mins[j]);
        ls[j] = s < 63 ? s : 63;
        lm[j] = m < 63 ? m : 63;
    }
    tensor__k4_finish(x, nmax, ls, lm, max_scale / 63.0f, max_min / 63.0f, L, d_out, dmin_out,
                      packed);
}

/* The codes L (0..15) of a Q4_K super-block into its nibbles (see tensor_blocks.h). */
void tensor__q4_K_store_codes(void *restrict block, const uint8_t L[QK_K]) {
    block_q4_K *y = block;
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            y->qs[32 * c + l] = (uint8_t)(L[64 * c + l] | L[64 * c + 32 + l] << 4);
        }
    }
}

/* The codes L (0..31) of a Q5_K super-block into its nibbles and fifth bits. */
void tensor__q5_K_store_codes(void *restrict block, const uint8_t L[QK_K]) {
    block_q5_K *y = block;
    memset(y->qh, 0, sizeof y->qh);
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            const int q0 = L[64 * c + l], q1 = L[64 * c + 32 + l];
            y->qs[32 * c + l] = (uint8_t)((q0 & 0x0F) | (q1 & 0x0F) << 4);
            y->qh[l] |= (uint8_t)((q0 >> 4) << (2 * c) | (q1 >> 4) << (2 * c + 1));
        }
    }
}

/* ---- Q4_K ------------------------------------------------------------------------------------ */

void tensor__dequantize_row_q4_K(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % QK_K == 0);
    const block_q4_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = from_fp16(x[i].d), dmin = from_fp16(x[i].dmin);
        float *y = dst + i * QK_K;
        for (int c = 0; c < 4; c++) {
            uint8_t sc0, m0, sc1, m1;
            tensor__k4_scale_min(2 * c, x[i].scales, &sc0, &m0);
            tensor__k4_scale_min(2 * c + 1, x[i].scales, &sc1, &m1);
            const float d0 = d * sc0, min0 = dmin * m0;
            const float d1 = d * sc1, min1 = dmin * m1;
            const uint8_t *q = x[i].qs + 32 * c;
            for (int l = 0; l < 32; l++) {
                y[64 * c + l] = d0 * (float)(q[l] & 0x0F) - min0;
                y[64 * c + 32 + l] = d1 * (float)(q[l] >> 4) - min1;
            }
        }
    }
}

void tensor__quantize_row_q4_K(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % QK_K == 0);
    block_q4_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t L[QK_K];
        k4_quantize_superblock(src + i * QK_K, 15, -1.0f, 0.1f, 20, L, &y[i].d, &y[i].dmin,
                               y[i].scales);
        tensor__q4_K_store_codes(&y[i], L);
    }
}

/* Sum over a K-quant super-block of (d*sc[j]*q - dmin*m[j]) * (dy*qy): the code products are
 * summed exactly in integers per sub-block and weighted by sc[j]; the mins need only the sums of
 * the activation codes per 16 (bsums), since sum(m[j] * qy) = m[j] * sum(qy). */
void tensor__vec_dot_q4_K_q8_K(int64_t n, float *restrict s, const void *restrict vx,
                               const void *restrict vy) {
    assert(n % QK_K == 0);
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], m[8];
        for (int j = 0; j < 8; j++) tensor__k4_scale_min(j, x[i].scales, &sc[j], &m[j]);
        int32_t sum_mins = 0;
        for (int j = 0; j < QK_K / 16; j++) sum_mins += y[i].bsums[j] * m[j / 2];
        int32_t sumi = 0;
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = x[i].qs + 32 * c;
            const int8_t *q8 = y[i].qs + 64 * c;
            int32_t lo = 0, hi = 0;
            for (int l = 0; l < 32; l++) {
                lo += (q[l] & 0x0F) * q8[l];
                hi += (q[l] >> 4) * q8[32 + l];
            }
            sumi += sc[2 * c] * lo + sc[2 * c + 1] * hi;
        }
        const float d = from_fp16(x[i].d) * y[i].d;
        const float dmin = from_fp16(x[i].dmin) * y[i].d;
        sum += d * (float)sumi - dmin * (float)sum_mins;
    }
    *s = sum;
}

/* ---- Q5_K ------------------------------------------------------------------------------------ */

void tensor__dequantize_row_q5_K(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % QK_K == 0);
    const block_q5_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = from_fp16(x[i].d), dmin = from_fp16(x[i].dmin);
        float *y = dst + i * QK_K;
        for (int c = 0; c < 4; c++) {
            uint8_t sc0, m0, sc1, m1;
            tensor__k4_scale_min(2 * c, x[i].scales, &sc0, &m0);
            tensor__k4_scale_min(2 * c + 1, x[i].scales, &sc1, &m1);
            const float d0 = d * sc0, min0 = dmin * m0;
            const float d1 = d * sc1, min1 = dmin * m1;
            const uint8_t *q = x[i].qs + 32 * c;
            for (int l = 0; l < 32; l++) {
                const int h0 = (x[i].qh[l] >> (2 * c)) & 1;
                const int h1 = (x[i].qh[l] >> (2 * c + 1)) & 1;
                y[64 * c + l] = d0 * (float)((q[l] & 0x0F) | h0 << 4) - min0;
                y[64 * c + 32 + l] = d1 * (float)((q[l] >> 4) | h1 << 4) - min1;
            }
        }
    }
}

void tensor__quantize_row_q5_K(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % QK_K == 0);
    block_q5_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t L[QK_K];
        k4_quantize_superblock(src + i * QK_K, 31, -0.5f, 0.1f, 15, L, &y[i].d, &y[i].dmin,
                               y[i].scales);
        tensor__q5_K_store_codes(&y[i], L);
    }
}

void tensor__vec_dot_q5_K_q8_K(int64_t n, float *restrict s, const void *restrict vx,
                               const void *restrict vy) {
    assert(n % QK_K == 0);
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], m[8];
        for (int j = 0; j < 8; j++) tensor__k4_scale_min(j, x[i].scales, &sc[j], &m[j]);
        int32_t sum_mins = 0;
        for (int j = 0; j < QK_K / 16; j++) sum_mins += y[i].bsums[j] * m[j / 2];
        int32_t sumi = 0;
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = x[i].qs + 32 * c;
            const int8_t *q8 = y[i].qs + 64 * c;
            int32_t lo = 0, hi = 0;
            for (int l = 0; l < 32; l++) {
                const int h0 = (x[i].qh[l] >> (2 * c)) & 1;
                const int h1 = (x[i].qh[l] >> (2 * c + 1)) & 1;
                lo += ((q[l] & 0x0F) | h0 << 4) * q8[l];
                hi += ((q[l] >> 4) | h1 << 4) * q8[32 + l];
            }
            sumi += sc[2 * c] * lo + sc[2 * c + 1] * hi;
        }
        const float d = from_fp16(x[i].d) * y[i].d;
        const float dmin = from_fp16(x[i].dmin) * y[i].d;
        sum += d * (float)sumi - dmin * (float)sum_mins;
    }
    *s = sum;
}

/* ---- Q6_K ------------------------------------------------------------------------------------ */

/* The 6-bit code (0..63) of element e (0..255) of a Q6_K block; see tensor_blocks.h. */
static inline int q6_code(const block_q6_K *b, int e) {
    const int h = e / 128, r = e % 128; /* half, and position in it */
    const int quarter = r / 32, l = r % 32;
    const uint8_t lo_byte = b->ql[64 * h + 32 * (quarter & 1) + l];
    const int lo = quarter < 2 ? lo_byte & 0x0F : lo_byte >> 4;
    const int hi = (b->qh[32 * h + l] >> (2 * quarter)) & 3;
    return lo | hi << 4;
}

void tensor__dequantize_row_q6_K(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % QK_K == 0);
    const block_q6_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = from_fp16(x[i].d);
        for (int e = 0; e < QK_K; e++) {
            dst[i * QK_K + e] = d * (float)x[i].scales[e / 16] * (float)(q6_code(&x[i], e) - 32);
        }
    }
}

/*
 * One Q6_K super-block, as ggml's quantize_row_q6_K_ref (qw NULL) and quantize_row_q6_K_impl
 * (qw: the 256 importance weights of these columns): each sub-block of 16 gets a signed scale
 * from tensor__fit_scale_symmetric (codes -32..31, each value weighted by x^2, or by its
 * importance); the 16 scales are quantized to int8 against d = -max_scale / 128, where max_scale
 * is the scale of largest magnitude (so it maps to -128 and the others, of either sign, into
 * -128..127); then every value is re-rounded against its quantized sub-block scale. A
 * super-block whose scales are all ~0 is stored as zeros.
 */
void tensor__q6_K_quantize_superblock(const float *restrict x, const float *restrict qw,
                                      void *restrict block) {
    block_q6_K *y = block;
    uint8_t L[QK_K];
    float scales[QK_K / 16];
    float max_scale = 0, max_abs_scale = 0;
    for (int j = 0; j < QK_K / 16; j++) {
        scales[j] =
            tensor__fit_scale_symmetric(16, 32, x + 16 * j, qw ? qw + 16 * j : NULL, L + 16 * j);
        if (fabsf(scales[j]) > max_abs_scale) {
            max_abs_scale = fabsf(scales[j]);
            max_scale = scales[j];
        }
    }
    if (max_abs_scale < GROUP_MAX_EPS) {
        memset(y, 0, sizeof *y);
        return;
    }
    const float iscale = -128.0f / max_scale;
    y->d = tensor_f32_to_fp16(1 / iscale);
    for (int j = 0; j < QK_K / 16; j++) {
        const int sc = nearest_int(iscale * scales[j]);
        y->scales[j] = (int8_t)clamp_int(sc, -128, 127);
    }
    const float d_all = from_fp16(y->d);
    for (int j = 0; j < QK_K / 16; j++) {
        const float d = d_all * y->scales[j];
        if (d == 0.0f) continue;
        for (int k = 0; k < 16; k++) {
            L[16 * j + k] = (uint8_t)(clamp_int(nearest_int(x[16 * j + k] / d), -32, 31) + 32);
        }
    }
    for (int h = 0; h < 2; h++) {
        const uint8_t *Lh = L + 128 * h;
        for (int l = 0; l < 32; l++) {
            y->ql[64 * h + l] = (uint8_t)((Lh[l] & 0x0F) | (Lh[64 + l] & 0x0F) << 4);
            y->ql[64 * h + 32 + l] = (uint8_t)((Lh[32 + l] & 0x0F) | (Lh[96 + l] & 0x0F) << 4);
            y->qh[32 * h + l] = (uint8_t)((Lh[l] >> 4) | (Lh[32 + l] >> 4) << 2 |
                                          (Lh[64 + l] >> 4) << 4 | (Lh[96 + l] >> 4) << 6);
        }
    }
}

void tensor__quantize_row_q6_K(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % QK_K == 0);
    block_q6_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++)
        tensor__q6_K_quantize_superblock(src + i * QK_K, NULL, &y[i]);
}

void tensor__vec_dot_q6_K_q8_K(int64_t n, float *restrict s, const void *restrict vx,
                               const void *restrict vy) {
    assert(n % QK_K == 0);
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t sumi = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            int32_t sub = 0;
            for (int k = 0; k < 16; k++) {
                const int e = 16 * j + k;
                sub += (q6_code(&x[i], e) - 32) * y[i].qs[e];
            }
            sumi += x[i].scales[j] * sub;
        }
        sum += (from_fp16(x[i].d) * y[i].d) * (float)sumi;
    }
    *s = sum;
}

/* ---- Q8_K (activations of the K-quants) ------------------------------------------------------ */

void tensor__dequantize_row_q8_K(const void *restrict src, float *restrict dst, int64_t n) {
    assert(n % QK_K == 0);
    const block_q8_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        for (int j = 0; j < QK_K; j++) dst[i * QK_K + j] = (float)x[i].qs[j] * x[i].d;
    }
}

/* The value of largest magnitude maps to -127 (codes round to nearest even; the opposite side
 * is capped at 127); the scale is kept as a float. bsums[j] = sum of codes 16j..16j+15. An
 * all-zero block is stored as zeros (ggml leaves its bsums unwritten; zero is their value). */
void tensor__quantize_row_q8_K(const float *restrict src, void *restrict dst, int64_t n) {
    assert(n % QK_K == 0);
    block_q8_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K;
        float max = 0, amax = 0;
        for (int j = 0; j < QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            y[i].qs[j] = (int8_t)clamp_int(nearest_int(iscale * x[j]), -128, 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int k = 0; k < 16; k++) sum += y[i].qs[16 * j + k];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}
