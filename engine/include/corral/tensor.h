/*
 * tensor.h — the element types of model tensors and what the engine can do with each.
 *
 * Type ids are ggml's (they are stored in GGUF files). Every id ggml has defined is described
 * (name, block size, bytes per block) so that any GGUF file can be listed; the types corral can
 * compute with also have kernels in their row of the trait table:
 *   - to_float:   dequantize n elements (n a multiple of the block size)
 *   - from_float: the reference quantizer (deterministic round-to-nearest, as ggml's *_ref
 *                 functions), used for activations, LoRA merging and `corral quantize`
 *   - quantize_weighted: the quantizer llama.cpp uses when it has an importance matrix (ggml's
 *                 quantize_row_*_impl): a row whose columns carry weights; NULL for types that
 *                 ignore importance (Q8_0, the float types)
 *   - vec_dot:    dot product of a row of this type with a row of its vec_dot_type: activations
 *                 are quantized per block to that type first (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for
 *                 Q4_1/Q5_1, Q8_K for the K-quants, F16 for F16, BF16 for BF16, F32 for F32), the
 *                 way llama.cpp does, so that results agree closely with it.
 * The kernels in this table are the portable scalar references; SIMD kernels (the speed issue)
 * are tested against them. Block layouts live in tensor_blocks.h, pinned by static_assert.
 */
#ifndef CORRAL_TENSOR_H
#define CORRAL_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum tensor_type {
    TENSOR_TYPE_F32 = 0,
    TENSOR_TYPE_F16 = 1,
    TENSOR_TYPE_Q4_0 = 2,
    TENSOR_TYPE_Q4_1 = 3,
    /* 4 and 5 were Q4_2 and Q4_3, removed from ggml */
    TENSOR_TYPE_Q5_0 = 6,
    TENSOR_TYPE_Q5_1 = 7,
    TENSOR_TYPE_Q8_0 = 8,
    TENSOR_TYPE_Q8_1 = 9,
    TENSOR_TYPE_Q2_K = 10,
    TENSOR_TYPE_Q3_K = 11,
    TENSOR_TYPE_Q4_K = 12,
    TENSOR_TYPE_Q5_K = 13,
    TENSOR_TYPE_Q6_K = 14,
    TENSOR_TYPE_Q8_K = 15,
    TENSOR_TYPE_IQ2_XXS = 16,
    TENSOR_TYPE_IQ2_XS = 17,
    TENSOR_TYPE_IQ3_XXS = 18,
    TENSOR_TYPE_IQ1_S = 19,
    TENSOR_TYPE_IQ4_NL = 20,
    TENSOR_TYPE_IQ3_S = 21,
    TENSOR_TYPE_IQ2_S = 22,
    TENSOR_TYPE_IQ4_XS = 23,
    TENSOR_TYPE_I8 = 24,
    TENSOR_TYPE_I16 = 25,
    TENSOR_TYPE_I32 = 26,
    TENSOR_TYPE_I64 = 27,
    TENSOR_TYPE_F64 = 28,
    TENSOR_TYPE_IQ1_M = 29,
    TENSOR_TYPE_BF16 = 30,
    /* 31-33 were the Q4_0_4_4/4_8/8_8 repacked types, removed from ggml */
    TENSOR_TYPE_TQ1_0 = 34,
    TENSOR_TYPE_TQ2_0 = 35,
    /* 36-38 were the IQ4_NL_4_4/4_8/8_8 repacked types, removed from ggml */
    TENSOR_TYPE_MXFP4 = 39,
    TENSOR_TYPE_COUNT = 40
} tensor_type;

/* Dequantize n elements (a multiple of the block size) of a row. */
typedef void (*tensor_to_float_fn)(const void *restrict src, float *restrict dst, int64_t n);
/* Quantize n elements (a multiple of the block size) into a row of blocks. */
typedef void (*tensor_from_float_fn)(const float *restrict src, void *restrict dst, int64_t n);
/* *s = sum over n elements of x[i] * y[i], x a row of this type, y a row of its vec_dot_type. */
typedef void (*tensor_vec_dot_fn)(int64_t n, float *restrict s, const void *restrict x,
                                  const void *restrict y);
/* Quantize one row of n elements (a multiple of the block size) minimising the error weighted by
 * importance[j] per column j (importance >= 0, finite). */
typedef void (*tensor_quantize_weighted_fn)(const float *restrict src, void *restrict dst,
                                            int64_t n, const float *restrict importance);

typedef struct tensor_type_traits {
    const char *name;   /* "Q4_K" */
    int64_t block_size; /* elements per block */
    size_t type_size;   /* bytes per block */
    bool is_quantized;  /* block-quantized (not a plain float or integer type) */
    /* Kernels: NULL for types corral can describe but not compute with. */
    tensor_to_float_fn to_float;
    tensor_from_float_fn from_float;
    tensor_vec_dot_fn vec_dot;
    tensor_type vec_dot_type;
    tensor_quantize_weighted_fn quantize_weighted;
} tensor_type_traits;

/* The traits of a type id, or NULL for an id ggml never defined (4, 5, 31-33, 36-38, >= 40).
 * The table is static: thread-safe. */
const tensor_type_traits *tensor_type_get_traits(uint32_t type);

/* 1 if the engine can run matrix products with weights of this type (to_float, from_float and
 * vec_dot are all present): F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K. */
int tensor_type_is_supported(uint32_t type);

/* "Q4_K"; "unknown" for ids with no traits. */
const char *tensor_type_name(uint32_t type);

/* Parse a type name, case-insensitively ("q4_k", "F16"). Returns 0 and sets *out, or -1. */
int tensor_type_from_name(const char *name, tensor_type *out);

/* Bytes of a row of n elements; n must be a multiple of the block size (asserted). */
size_t tensor_row_size(tensor_type type, int64_t n);

/* Quantize (or convert) n_rows rows of n_per_row floats into `type`, as llama.cpp's
 * ggml_quantize_chunk does: with importance (n_per_row weights, one per column, >= 0 and finite)
 * the type's importance-weighted quantizer where it has one, else the reference quantizer.
 * n_per_row must be a multiple of the block size and the type must have a from_float kernel
 * (asserted: callers check tensor_type_get_traits first). Rows are quantized independently, so a
 * matrix may be split across threads by rows. Returns the bytes written
 * (n_rows * tensor_row_size). Allocates nothing; thread-safe. */
size_t tensor_quantize_rows(tensor_type type, const float *restrict src, void *restrict dst,
                            int64_t n_rows, int64_t n_per_row, const float *restrict importance);

/* IEEE half and bfloat16 conversions, bit-exact with ggml's scalar ones (round to nearest even;
 * NaN stays NaN). */
float tensor_fp16_to_f32(uint16_t h);
uint16_t tensor_f32_to_fp16(float f);
float tensor_bf16_to_f32(uint16_t h);
uint16_t tensor_f32_to_bf16(float f);

#endif /* CORRAL_TENSOR_H */
