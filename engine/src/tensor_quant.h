/*
 * tensor_quant.h — the scalar reference kernels behind the trait table (private to the engine).
 *
 * One function per type and operation, with the signatures of tensor.h's kernel types:
 *   tensor__dequantize_row_<type>(src, dst, n)   to_float
 *   tensor__quantize_row_<type>(src, dst, n)     from_float (bit-exact with ggml's *_ref)
 *   tensor__vec_dot_<type>_<vec_dot_type>(n, s, x, y)
 * n is always a multiple of the type's block size (asserted: callers derive it from tensor
 * shapes that the loader has already checked). The kernels keep no state and allocate nothing:
 * they are thread-safe and may run in the per-token path. These are the portable references
 * that SIMD kernels are tested against; tensor_quant.c explains the algorithms.
 */
#ifndef CORRAL_TENSOR_QUANT_H
#define CORRAL_TENSOR_QUANT_H

#include <stdint.h>
#include <string.h>

#include "tensor_blocks.h"

/* ---- helpers shared by the quantizers (tensor_quant.c, tensor_quant_weighted.c) -------------- */

/* Below this, a group of values is treated as all zero by the K-quant scale searches (ggml's
 * GROUP_MAX_EPS): dividing by such a maximum would overflow. */
#define GROUP_MAX_EPS 1e-15f

/* Round to nearest, ties to even, exactly as ggml's nearest_int: adding 1.5 * 2^23 moves v into
 * [2^23, 2^24), where a float's unit in the last place is 1, so the addition itself rounds v to
 * an integer and leaves integer + 2^22 in the low 23 mantissa bits. Exact for |v| < 2^22, the
 * range every caller guarantees for finite input; for anything else it returns some int without
 * undefined behaviour, and callers clamp the result. */
static inline int nearest_int(float v) {
    const float biased = v + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &biased, sizeof bits);
    return (bits & 0x007fffff) - 0x00400000;
}

static inline int clamp_int(int v, int lo, int hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/*
 * The 8 sub-block scales sc[j] and mins m[j] (6 bits each) of Q4_K/Q5_K packed in 12 bytes:
 *   bytes 0-3:  low 6 bits sc[0..3], top 2 bits = bits 4-5 of sc[4..7]
 *   bytes 4-7:  low 6 bits m[0..3],  top 2 bits = bits 4-5 of m[4..7]
 *   bytes 8-11: low nibble = bits 0-3 of sc[4..7], high nibble = bits 0-3 of m[4..7]
 * Packing values over 63 gives exactly the bytes ggml's packing gives them.
 */
static inline void tensor__k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0F) | (q[j - 4] >> 6) << 4);
        *m = (uint8_t)((q[j + 4] >> 4) | (q[j] >> 6) << 4);
    }
}

static inline void tensor__k4_pack_scale_min(uint8_t q[K_SCALE_SIZE], const uint8_t sc[8],
                                             const uint8_t m[8]) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        q[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        q[j + 8] = (uint8_t)((sc[j + 4] & 0x0F) | (m[j + 4] & 0x0F) << 4);
    }
}

/* Scale searches (tensor_quant.c explains them): x ~ scale * L - the_min with L in 0..nmax under
 * weights w (ggml's make_qkx2_quants / make_qkx3_quants), and x ~ scale * (L - nmax) with L in
 * 0..2*nmax-1 under weights w, or x^2 when w is NULL (make_qx_quants, rmse_type 1). */
float tensor__fit_scale_min(int n, int nmax, const float *restrict x, const float *restrict w,
                            uint8_t *restrict L, float *restrict the_min, float rmin, float rdelta,
                            int nstep);
float tensor__fit_scale_symmetric(int n, int nmax, const float *restrict x, const float *restrict w,
                                  uint8_t *restrict L);

/* The common ends of the K-quant quantizers, reference and weighted alike: Q4_K/Q5_K's packing
 * and re-rounding against the stored scales, their code stores, and one whole Q6_K super-block
 * (qw: its 256 importance weights, or NULL for the reference weighting). */
void tensor__k4_finish(const float *restrict x, int nmax, const uint8_t ls[QK_K / 32],
                       const uint8_t lm[QK_K / 32], float d, float dmin, uint8_t L[QK_K],
                       uint16_t *d_out, uint16_t *dmin_out, uint8_t packed[K_SCALE_SIZE]);
void tensor__q4_K_store_codes(void *restrict block, const uint8_t L[QK_K]);
void tensor__q5_K_store_codes(void *restrict block, const uint8_t L[QK_K]);
void tensor__q6_K_quantize_superblock(const float *restrict x, const float *restrict qw,
                                      void *restrict block);

/* ---- plain floating-point types ------------------------------------------------------------- */

void tensor__dequantize_row_f32(const void *restrict src, float *restrict dst, int64_t n);
void tensor__quantize_row_f32(const float *restrict src, void *restrict dst, int64_t n);
/* Products in float, accumulated in double (ggml's scalar ggml_vec_dot_f32). */
void tensor__vec_dot_f32(int64_t n, float *restrict s, const void *restrict x,
                         const void *restrict y);

void tensor__dequantize_row_f16(const void *restrict src, float *restrict dst, int64_t n);
void tensor__quantize_row_f16(const float *restrict src, void *restrict dst, int64_t n);
/* Accumulated in double (ggml's scalar ggml_vec_dot_f16); each product is exact in float. */
void tensor__vec_dot_f16(int64_t n, float *restrict s, const void *restrict x,
                         const void *restrict y);

void tensor__dequantize_row_bf16(const void *restrict src, float *restrict dst, int64_t n);
void tensor__quantize_row_bf16(const float *restrict src, void *restrict dst, int64_t n);
/* Accumulated in double (ggml's scalar ggml_vec_dot_bf16); each product is exact in float. */
void tensor__vec_dot_bf16(int64_t n, float *restrict s, const void *restrict x,
                          const void *restrict y);

/* ---- blocks of 32 --------------------------------------------------------------------------- */

void tensor__dequantize_row_q4_0(const void *restrict src, float *restrict dst, int64_t n);
void tensor__quantize_row_q4_0(const float *restrict src, void *restrict dst, int64_t n);
void tensor__vec_dot_q4_0_q8_0(int64_t n, float *restrict s, const void *restrict x,
                               const void *restrict y);

void tensor__dequantize_row_q4_1(const void *restrict src, float *restrict dst, int64_t n);
void tensor__quantize_row_q4_1(const float *restrict src, void *restrict dst, int64_t n);
void tensor__vec_dot_q4_1_q8_1(int64_t n, float *restrict s, const void *restrict x,
                               const void *restrict y);

void tensor__dequantize_row_q5_0(const void *restrict src, float *restrict dst, int64_t n);
void tensor__quantize_row_q5_0(const float *restrict src, void *restrict dst, int64_t n);
void tensor__vec_dot_q5_0_q8_0(int64_t n, float *restrict s, const void *restrict x,
                               const void *restrict y);

void tensor__dequantize_row_q5_1(const void *restrict src, float *restrict dst, int64_t n);
void tensor__quantize_row_q5_1(const float *restrict src, void *restrict dst, int64_t n);
void tensor__vec_dot_q5_1_q8_1(int64_t n, float *restrict s, const void *restrict x,
                               const void *restrict y);

void tensor__dequantize_row_q8_0(const void *restrict src, float *restrict dst, int64_t n);
void tensor__quantize_row_q8_0(const float *restrict src, void *restrict dst, int64_t n);
void tensor__vec_dot_q8_0_q8_0(int64_t n, float *restrict s, const void *restrict x,
                               const void *restrict y);

/* Activation type of Q4_1/Q5_1: no dot product of its own. */
void tensor__dequantize_row_q8_1(const void *restrict src, float *restrict dst, int64_t n);
void tensor__quantize_row_q8_1(const float *restrict src, void *restrict dst, int64_t n);

/* ---- K-quants (super-blocks of 256) --------------------------------------------------------- */

void tensor__dequantize_row_q4_K(const void *restrict src, float *restrict dst, int64_t n);
void tensor__quantize_row_q4_K(const float *restrict src, void *restrict dst, int64_t n);
void tensor__vec_dot_q4_K_q8_K(int64_t n, float *restrict s, const void *restrict x,
                               const void *restrict y);

void tensor__dequantize_row_q5_K(const void *restrict src, float *restrict dst, int64_t n);
void tensor__quantize_row_q5_K(const float *restrict src, void *restrict dst, int64_t n);
void tensor__vec_dot_q5_K_q8_K(int64_t n, float *restrict s, const void *restrict x,
                               const void *restrict y);

void tensor__dequantize_row_q6_K(const void *restrict src, float *restrict dst, int64_t n);
void tensor__quantize_row_q6_K(const float *restrict src, void *restrict dst, int64_t n);
void tensor__vec_dot_q6_K_q8_K(int64_t n, float *restrict s, const void *restrict x,
                               const void *restrict y);

/* Activation type of the K-quants: no dot product of its own. */
void tensor__dequantize_row_q8_K(const void *restrict src, float *restrict dst, int64_t n);
void tensor__quantize_row_q8_K(const float *restrict src, void *restrict dst, int64_t n);

/* ---- importance-weighted quantizers (tensor_quant_weighted.c) ---------------------------------
 *
 * tensor__quantize_row_<type>_weighted(src, dst, n, qw): one row of n elements (a multiple of the
 * block size) quantized as ggml's quantize_row_<type>_impl does with an importance matrix: qw[j]
 * is the importance of column j (the mean square of the activations it multiplies), and each
 * type's scale search minimises the error weighted by it. Bit-exact with ggml; the rows are
 * independent, so a tensor may be split across threads by rows. */
void tensor__quantize_row_q4_0_weighted(const float *restrict src, void *restrict dst, int64_t n,
                                        const float *restrict qw);
void tensor__quantize_row_q4_1_weighted(const float *restrict src, void *restrict dst, int64_t n,
                                        const float *restrict qw);
void tensor__quantize_row_q5_0_weighted(const float *restrict src, void *restrict dst, int64_t n,
                                        const float *restrict qw);
void tensor__quantize_row_q5_1_weighted(const float *restrict src, void *restrict dst, int64_t n,
                                        const float *restrict qw);
void tensor__quantize_row_q4_K_weighted(const float *restrict src, void *restrict dst, int64_t n,
                                        const float *restrict qw);
void tensor__quantize_row_q5_K_weighted(const float *restrict src, void *restrict dst, int64_t n,
                                        const float *restrict qw);
void tensor__quantize_row_q6_K_weighted(const float *restrict src, void *restrict dst, int64_t n,
                                        const float *restrict qw);

#endif /* CORRAL_TENSOR_QUANT_H */
