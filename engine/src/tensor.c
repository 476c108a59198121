/*
 * tensor.c — the type trait table and the float16/bfloat16 conversions.
 *
 * Rows for every type id ggml has defined, so any GGUF file can be described; kernels only for
 * the types the engine computes with (tensor_quant.c holds them). Block sizes and byte sizes are
 * pinned to the block structs by static_asserts in tensor_blocks.h.
 */
#include "corral/tensor.h"

#include <assert.h>
#include <math.h>
#include <string.h>
#include <strings.h>

#include "tensor_quant.h"

#define QK_K 256

static const tensor_type_traits tensor_traits_table[TENSOR_TYPE_COUNT] = {
    [TENSOR_TYPE_F32] = {.name = "F32", .block_size = 1, .type_size = 4,
                         .to_float = tensor__dequantize_row_f32,
                         .from_float = tensor__quantize_row_f32, .vec_dot = tensor__vec_dot_f32,
                         .vec_dot_type = TENSOR_TYPE_F32},
    [TENSOR_TYPE_F16] = {.name = "F16", .block_size = 1, .type_size = 2,
                         .to_float = tensor__dequantize_row_f16,
                         .from_float = tensor__quantize_row_f16, .vec_dot = tensor__vec_dot_f16,
                         .vec_dot_type = TENSOR_TYPE_F16},
    [TENSOR_TYPE_Q4_0] = {.name = "Q4_0", .block_size = 32, .type_size = 18, .is_quantized = true,
                          .to_float = tensor__dequantize_row_q4_0,
                          .from_float = tensor__quantize_row_q4_0,
                          .quantize_weighted = tensor__quantize_row_q4_0_weighted,
                          .vec_dot = tensor__vec_dot_q4_0_q8_0, .vec_dot_type = TENSOR_TYPE_Q8_0},
    [TENSOR_TYPE_Q4_1] = {.name = "Q4_1", .block_size = 32, .type_size = 20, .is_quantized = true,
                          .to_float = tensor__dequantize_row_q4_1,
                          .from_float = tensor__quantize_row_q4_1,
                          .quantize_weighted = tensor__quantize_row_q4_1_weighted,
                          .vec_dot = tensor__vec_dot_q4_1_q8_1, .vec_dot_type = TENSOR_TYPE_Q8_1},
    [TENSOR_TYPE_Q5_0] = {.name = "Q5_0", .block_size = 32, .type_size = 22, .is_quantized = true,
                          .to_float = tensor__dequantize_row_q5_0,
                          .from_float = tensor__quantize_row_q5_0,
                          .quantize_weighted = tensor__quantize_row_q5_0_weighted,
                          .vec_dot = tensor__vec_dot_q5_0_q8_0, .vec_dot_type = TENSOR_TYPE_Q8_0},
    [TENSOR_TYPE_Q5_1] = {.name = "Q5_1", .block_size = 32, .type_size = 24, .is_quantized = true,
                          .to_float = tensor__dequantize_row_q5_1,
                          .from_float = tensor__quantize_row_q5_1,
                          .quantize_weighted = tensor__quantize_row_q5_1_weighted,
                          .vec_dot = tensor__vec_dot_q5_1_q8_1, .vec_dot_type = TENSOR_TYPE_Q8_1},
    [TENSOR_TYPE_Q8_0] = {.name = "Q8_0", .block_size = 32, .type_size = 34, .is_quantized = true,
                          .to_float = tensor__dequantize_row_q8_0,
                          .from_float = tensor__quantize_row_q8_0,
                          .vec_dot = tensor__vec_dot_q8_0_q8_0, .vec_dot_type = TENSOR_TYPE_Q8_0},
    [TENSOR_TYPE_Q8_1] = {.name = "Q8_1", .block_size = 32, .type_size = 36, .is_quantized = true,
                          .to_float = tensor__dequantize_row_q8_1,
                          .from_float = tensor__quantize_row_q8_1},
    [TENSOR_TYPE_Q2_K] = {.name = "Q2_K", .block_size = QK_K, .type_size = 84, .is_quantized = true},
    [TENSOR_TYPE_Q3_K] = {.name = "Q3_K", .block_size = QK_K, .type_size = 110, .is_quantized = true},
    [TENSOR_TYPE_Q4_K] = {.name = "Q4_K", .block_size = QK_K, .type_size = 144, .is_quantized = true,
                          .to_float = tensor__dequantize_row_q4_K,
                          .from_float = tensor__quantize_row_q4_K,
                          .quantize_weighted = tensor__quantize_row_q4_K_weighted,
                          .vec_dot = tensor__vec_dot_q4_K_q8_K, .vec_dot_type = TENSOR_TYPE_Q8_K},
    [TENSOR_TYPE_Q5_K] = {.name = "Q5_K", .block_size = QK_K, .type_size = 176, .is_quantized = true,
                          .to_float = tensor__dequantize_row_q5_K,
                          .from_float = tensor__quantize_row_q5_K,
                          .quantize_weighted = tensor__quantize_row_q5_K_weighted,
                          .vec_dot = tensor__vec_dot_q5_K_q8_K, .vec_dot_type = TENSOR_TYPE_Q8_K},
    [TENSOR_TYPE_Q6_K] = {.name = "Q6_K", .block_size = QK_K, .type_size = 210, .is_quantized = true,
                          .to_float = tensor__dequantize_row_q6_K,
                          .from_float = tensor__quantize_row_q6_K,
                          .quantize_weighted = tensor__quantize_row_q6_K_weighted,
                          .vec_dot = tensor__vec_dot_q6_K_q8_K, .vec_dot_type = TENSOR_TYPE_Q8_K},
    [TENSOR_TYPE_Q8_K] = {.name = "Q8_K", .block_size = QK_K, .type_size = 292, .is_quantized = true,
                          .to_float = tensor__dequantize_row_q8_K,
                          .from_float = tensor__quantize_row_q8_K},
    [TENSOR_TYPE_IQ2_XXS] = {.name = "IQ2_XXS", .block_size = QK_K, .type_size = 66, .is_quantized = true},
    [TENSOR_TYPE_IQ2_XS] = {.name = "IQ2_XS", .block_size = QK_K, .type_size = 74, .is_quantized = true},
    [TENSOR_TYPE_IQ3_XXS] = {.name = "IQ3_XXS", .block_size = QK_K, .type_size = 98, .is_quantized = true},
    [TENSOR_TYPE_IQ1_S] = {.name = "IQ1_S", .block_size = QK_K, .type_size = 50, .is_quantized = true},
    [TENSOR_TYPE_IQ4_NL] = {.name = "IQ4_NL", .block_size = 32, .type_size = 18, .is_quantized = true},
    [TENSOR_TYPE_IQ3_S] = {.name = "IQ3_S", .block_size = QK_K, .type_size = 110, .is_quantized = true},
    [TENSOR_TYPE_IQ2_S] = {.name = "IQ2_S", .block_size = QK_K, .type_size = 82, .is_quantized = true},
    [TENSOR_TYPE_IQ4_XS] = {.name = "IQ4_XS", .block_size = QK_K, .type_size = 136, .is_quantized = true},
    [TENSOR_TYPE_I8] = {.name = "I8", .block_size = 1, .type_size = 1},
    [TENSOR_TYPE_I16] = {.name = "I16", .block_size = 1, .type_size = 2},
    [TENSOR_TYPE_I32] = {.name = "I32", .block_size = 1, .type_size = 4},
    [TENSOR_TYPE_I64] = {.name = "I64", .block_size = 1, .type_size = 8},
    [TENSOR_TYPE_F64] = {.name = "F64", .block_size = 1, .type_size = 8},
    [TENSOR_TYPE_IQ1_M] = {.name = "IQ1_M", .block_size = QK_K, .type_size = 56, .is_quantized = true},
    [TENSOR_TYPE_BF16] = {.name = "BF16", .block_size = 1, .type_size = 2,
                          .to_float = tensor__dequantize_row_bf16,
                          .from_float = tensor__quantize_row_bf16, .vec_dot = tensor__vec_dot_bf16,
                          .vec_dot_type = TENSOR_TYPE_BF16},
    [TENSOR_TYPE_TQ1_0] = {.name = "TQ1_0", .block_size = QK_K, .type_size = 54, .is_quantized = true},
    [TENSOR_TYPE_TQ2_0] = {.name = "TQ2_0", .block_size = QK_K, .type_size = 66, .is_quantized = true},
    [TENSOR_TYPE_MXFP4] = {.name = "MXFP4", .block_size = 32, .type_size = 17, .is_quantized = true},
};

const tensor_type_traits *tensor_type_get_traits(uint32_t type) {
    if (type >= TENSOR_TYPE_COUNT) return NULL;
    const tensor_type_traits *t = &tensor_traits_table[type];
    return t->name ? t : NULL;
}

int tensor_type_is_supported(uint32_t type) {
    const tensor_type_traits *t = tensor_type_get_traits(type);
    return t && t->to_float && t->from_float && t->vec_dot;
}

const char *tensor_type_name(uint32_t type) {
    const tensor_type_traits *t = tensor_type_get_traits(type);
    return t ? t->name : "unknown";
}

int tensor_type_from_name(const char *name, tensor_type *out) {
    if (!name) return -1;
    for (uint32_t i = 0; i < TENSOR_TYPE_COUNT; i++) {
        const tensor_type_traits *t = tensor_type_get_traits(i);
        if (t && strcasecmp(t->name, name) == 0) {
            *out = (tensor_type)i;
            return 0;
        }
    }
    return -1;
}

size_t tensor_row_size(tensor_type type, int64_t n) {
    const tensor_type_traits *t = tensor_type_get_traits(type);
    assert(t && n % t->block_size == 0);
    return (size_t)(n / t->block_size) * t->type_size;
}

size_t tensor_quantize_rows(tensor_type type, const float *restrict src, void *restrict dst,
                            int64_t n_rows, int64_t n_per_row, const float *restrict importance) {
    const tensor_type_traits *t = tensor_type_get_traits(type);
    assert(t && t->from_float && n_per_row % t->block_size == 0);
    const size_t row = tensor_row_size(type, n_per_row);
    if (!importance || !t->quantize_weighted) {
        /* The reference quantizers work block by block, so all rows go in one call. */
        t->from_float(src, dst, n_rows * n_per_row);
    } else {
        for (int64_t r = 0; r < n_rows; r++) {
            t->quantize_weighted(src + r * n_per_row, (char *)dst + (size_t)r * row, n_per_row,
                                 importance);
        }
    }
    return (size_t)n_rows * row;
}

/* ---- float16 / bfloat16 ---------------------------------------------------------------------- */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Half to float by re-biasing the exponent with float arithmetic (exact for every input). */
float tensor_fp16_to_f32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = 0xE0u << 23;
    const float exp_scale = 0x1.0p-112f;
    const float normalized = f32_from_bits((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = 126u << 23;
    const float magic_bias = 0.5f;
    const float denormalized = f32_from_bits((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denormalized_cutoff = 1u << 27;
    const uint32_t result =
        sign | (two_w < denormalized_cutoff ? f32_bits(denormalized) : f32_bits(normalized));
    return f32_from_bits(result);
}

/* Float to half, round to nearest even, using the float unit to do the rounding. */
uint16_t tensor_f32_to_fp16(float f) {
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = f32_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = f32_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

float tensor_bf16_to_f32(uint16_t h) {
    return f32_from_bits((uint32_t)h << 16);
}

/* Round to nearest even; NaNs are kept quiet NaNs (ggml does the same). */
uint16_t tensor_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}
