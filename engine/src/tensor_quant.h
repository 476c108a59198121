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

#endif /* CORRAL_TENSOR_QUANT_H */
