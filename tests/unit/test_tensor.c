/*
 * test_tensor.c — Check suite for the tensor types (engine/include/corral/tensor.h) and their
 * scalar reference kernels (engine/src/tensor_quant.c).
 *
 * core:   the half and bfloat16 conversions over every bit pattern, against an independent
 *         decoder and the exact rounding midpoints; hand-built blocks of each layout, with the
 *         expected values worked out by hand from the format; quantize/dequantize round trips
 *         and dot products of every type within the named error budgets below.
 * golden: llama.cpp's own files of the synthetic model: quantizing the F32 weights here must give
 *         byte for byte the tensors llama-quantize wrote, and dequantizing those must come back
 *         to the F32 weights within budget.
 * limits: one block, many blocks, all-zero blocks, huge and tiny magnitudes, saturating values.
 * errors: unknown type ids and names.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "corral/gguf.h"
#include "corral/tensor.h"
#include "testutil.h"

/* An assertion for hot loops: Check's ck_assert macros record a checkpoint through a pipe on
 * every call, which makes loops over millions of values take a minute; this only calls into
 * Check when the condition fails. */
#define EXPECT(cond, ...)                       \
    do {                                        \
        if (!(cond)) ck_abort_msg(__VA_ARGS__); \
    } while (0)

/* ---- error budgets --------------------------------------------------------------------------- */

/*
 * Round trip: rms(dequantize(quantize(x)) - x) / rms(x) for N(0, 1) data. A grid of step d rounds
 * with an rms error of d / sqrt(12), and d follows from each format (for Q8_0, amax of 32 values
 * ~2.1 over 127 steps: 0.0048, plus the fp16 rounding of d). Measured values (the largest over
 * the tests below: 4096 and 65536 values, scaled by 1, 1e4 and 1e-3, and llama.cpp's own
 * quantized synthetic model, whose weights are Gaussian too) are in the comments; each budget is
 * about 1.2 times that. A single block gives a noisier rms, so it is held to twice the budget.
 */
#define RT_BUDGET_F32  0.0     /* exact */
#define RT_BUDGET_F16  0.00025 /* 2^-11 relative steps: measured 0.000209 */
#define RT_BUDGET_BF16 0.0021  /* 2^-8 relative steps: measured 0.00170 */
#define RT_BUDGET_Q8_0 0.0066  /* measured 0.00546 */
#define RT_BUDGET_Q8_1 0.0066  /* same codes as Q8_0: measured 0.00546 */
#define RT_BUDGET_Q8_K 0.0083  /* one scale per 256: measured 0.00692 */
#define RT_BUDGET_Q4_0 0.105   /* measured 0.0879 */
#define RT_BUDGET_Q4_1 0.094   /* measured 0.0785 */
#define RT_BUDGET_Q5_0 0.052   /* measured 0.0434 */
#define RT_BUDGET_Q5_1 0.047   /* measured 0.0389 */
#define RT_BUDGET_Q4_K 0.087   /* measured 0.0721 */
#define RT_BUDGET_Q5_K 0.044   /* measured 0.0368 */
#define RT_BUDGET_Q6_K 0.024   /* measured 0.0180; 0.0200 at 1e-3, where fp16 d is subnormal */

/*
 * Dot products of x quantized to the type with y quantized to its vec_dot_type (4096 N(0, 1)
 * values, one block, and 65536 values). Errors relative to sum |x_i * y_i|, the scale of any
 * rounding that can build up:
 *   DOT_BUDGET_EXACT: against the double-precision dot of both dequantized rows; the kernel
 *     differs only by float rounding of its per-block scaled integer sums (measured 1.2e-8);
 *   DOT_BUDGET_EXACT_Q8_1: the same for Q4_1/Q5_1, whose minimum term uses the activation
 *     block's d * sum(qs) rounded to fp16, as llama.cpp does (measured 1.3e-5);
 *   DOT_BUDGET_ACT_*: against the dot with the unrounded float y, i.e. the cost of rounding the
 *     activations. F16 and BF16 round each y to 2^-11 and 2^-8 relative, which bounds the error
 *     (measured 5.5e-5 and 7.5e-4); 8-bit blocks measured at most 4.4e-4.
 */
#define DOT_BUDGET_EXACT      1e-6
#define DOT_BUDGET_EXACT_Q8_1 1e-4
#define DOT_BUDGET_ACT_F32    1e-6
#define DOT_BUDGET_ACT_F16    0x1.0p-11
#define DOT_BUDGET_ACT_BF16   0x1.0p-8
#define DOT_BUDGET_ACT_Q8     1e-3

/* Values far below the range of fp16 scales (1e-7): codes are chosen against the float scale
 * but stored with an fp16 one that is subnormal there, off by up to half its step, which for
 * Q4_1/Q5_1 is as large as the values (measured 2.3 times their rms). */
#define TINY_ERROR_BOUND 4.0

/* ---- helpers --------------------------------------------------------------------------------- */

typedef struct type_case {
    tensor_type type;
    double rt_budget;  /* round trip */
    double act_budget; /* dot product against the unrounded activations */
} type_case;

/* Every type with kernels: the 11 the engine computes with, then the two activation-only ones. */
static const type_case TYPE_CASES[] = {
    {TENSOR_TYPE_F32, RT_BUDGET_F32, DOT_BUDGET_ACT_F32},
    {TENSOR_TYPE_F16, RT_BUDGET_F16, DOT_BUDGET_ACT_F16},
    {TENSOR_TYPE_BF16, RT_BUDGET_BF16, DOT_BUDGET_ACT_BF16},
    {TENSOR_TYPE_Q4_0, RT_BUDGET_Q4_0, DOT_BUDGET_ACT_Q8},
    {TENSOR_TYPE_Q4_1, RT_BUDGET_Q4_1, DOT_BUDGET_ACT_Q8},
    {TENSOR_TYPE_Q5_0, RT_BUDGET_Q5_0, DOT_BUDGET_ACT_Q8},
    {TENSOR_TYPE_Q5_1, RT_BUDGET_Q5_1, DOT_BUDGET_ACT_Q8},
    {TENSOR_TYPE_Q8_0, RT_BUDGET_Q8_0, DOT_BUDGET_ACT_Q8},
    {TENSOR_TYPE_Q4_K, RT_BUDGET_Q4_K, DOT_BUDGET_ACT_Q8},
    {TENSOR_TYPE_Q5_K, RT_BUDGET_Q5_K, DOT_BUDGET_ACT_Q8},
    {TENSOR_TYPE_Q6_K, RT_BUDGET_Q6_K, DOT_BUDGET_ACT_Q8},
    {TENSOR_TYPE_Q8_1, RT_BUDGET_Q8_1, 0},
    {TENSOR_TYPE_Q8_K, RT_BUDGET_Q8_K, 0},
};
#define N_TYPE_CASES (sizeof TYPE_CASES / sizeof TYPE_CASES[0])
#define N_SUPPORTED  11

/* xorshift64* — a fixed, portable sequence, so every run tests the same data. */
static uint64_t rng_next(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 2685821657736338717ull;
}

static double rng_uniform(uint64_t *state) {
    return (double)((rng_next(state) >> 11) + 1) * 0x1.0p-53; /* (0, 1] */
}

/* n values of N(0, scale^2) by Box-Muller. */
static void fill_gaussian(float *x, int64_t n, uint64_t seed, double scale) {
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i += 2) {
        const double r = sqrt(-2.0 * log(rng_uniform(&state)));
        const double t = 2.0 * M_PI * rng_uniform(&state);
        x[i] = (float)(scale * r * cos(t));
        if (i + 1 < n) x[i + 1] = (float)(scale * r * sin(t));
    }
}

static const tensor_type_traits *traits_of(tensor_type type) {
    const tensor_type_traits *t = tensor_type_get_traits(type);
    ck_assert_msg(t != NULL, "type %d has no traits", (int)type);
    return t;
}

/* Quantize n values to `type` in a fresh buffer (caller frees). */
static void *quantize_new(tensor_type type, const float *x, int64_t n) {
    const tensor_type_traits *t = traits_of(type);
    ck_assert_msg(t->from_float != NULL, "%s has no from_float", t->name);
    void *q = malloc(tensor_row_size(type, n));
    ck_assert_ptr_nonnull(q);
    t->from_float(x, q, n);
    return q;
}

static float *dequantize_new(tensor_type type, const void *q, int64_t n) {
    const tensor_type_traits *t = traits_of(type);
    ck_assert_msg(t->to_float != NULL, "%s has no to_float", t->name);
    float *y = malloc((size_t)n * sizeof *y);
    ck_assert_ptr_nonnull(y);
    t->to_float(q, y, n);
    return y;
}

static double rms(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s / (double)n);
}

/* rms(a - b) / rms(b); fails on a non-finite value in a. */
static double rel_rms_error(const float *a, const float *b, int64_t n, const char *what) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) {
        EXPECT(isfinite(a[i]), "%s: element %lld is %g", what, (long long)i, a[i]);
        const double d = (double)a[i] - b[i];
        s += d * d;
    }
    const double r = rms(b, n);
    return r > 0 ? sqrt(s / (double)n) / r : sqrt(s / (double)n);
}

/* Quantize, dequantize and return the relative rms error. */
static double round_trip_error(tensor_type type, const float *x, int64_t n) {
    void *q = quantize_new(type, x, n);
    float *y = dequantize_new(type, q, n);
    const double err = rel_rms_error(y, x, n, tensor_type_name(type));
    free(q);
    free(y);
    return err;
}

static int64_t block_of(tensor_type type) {
    return traits_of(type)->block_size;
}

/* ---- core: half and bfloat16 ----------------------------------------------------------------- */

/* IEEE binary16 decoded straight from its definition (not with the code under test). */
static double half_reference(uint16_t h) {
    const int exp = (h >> 10) & 31, mant = h & 1023;
    double v;
    if (exp == 0)
        v = ldexp(mant, -24);
    else if (exp == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexp(1024 + mant, exp - 25);
    return (h & 0x8000) ? -v : v;
}

START_TEST(test_fp16_every_bit_pattern) {
    for (uint32_t h = 0; h <= 0xFFFF; h++) {
        const double ref = half_reference((uint16_t)h);
        const float f = tensor_fp16_to_f32((uint16_t)h);
        if (isnan(ref)) {
            EXPECT(isnan(f), "half 0x%04x should decode to NaN, got %g", h, f);
            const uint16_t back = tensor_f32_to_fp16(f);
            EXPECT((back & 0x7C00) == 0x7C00 && (back & 0x03FF) != 0,
                   "NaN from 0x%04x encoded as 0x%04x, not a NaN", h, back);
            continue;
        }
        EXPECT((double)f == ref && !signbit(f) == !signbit(ref),
               "half 0x%04x decodes to %a, expected %a", h, f, ref);
        EXPECT(tensor_f32_to_fp16(f) == h, "half 0x%04x does not round-trip: 0x%04x", h,
               tensor_f32_to_fp16(f));
    }
}
END_TEST

/* Every midpoint between neighbouring halves (exact in float) rounds to the even one, and the
 * floats just either side of it round to their nearer neighbour; 65520, the midpoint above the
 * largest half, overflows to infinity. */
START_TEST(test_fp16_rounds_to_nearest_even) {
    for (uint32_t h = 0; h <= 0x7BFF; h++) {
        const float lo = (float)half_reference((uint16_t)h);
        const float hi = h == 0x7BFF ? 65536.0f : (float)half_reference((uint16_t)(h + 1));
        const float mid = (lo + hi) / 2;
        EXPECT((double)mid == ((double)lo + hi) / 2, "midpoint above 0x%04x not exact", h);
        const uint16_t even = (uint16_t)((h & 1) ? h + 1 : h);
        for (int sign = 0; sign < 2; sign++) {
            const float s = sign ? -1.0f : 1.0f;
            const uint16_t sb = sign ? 0x8000 : 0;
            EXPECT(tensor_f32_to_fp16(s * mid) == (even | sb), "midpoint %a -> 0x%04x", s * mid,
                   tensor_f32_to_fp16(s * mid));
            const uint16_t below = tensor_f32_to_fp16(s * nextafterf(mid, 0));
            const uint16_t above = tensor_f32_to_fp16(s * nextafterf(mid, INFINITY));
            EXPECT(below == (h | sb), "just below midpoint %a -> 0x%04x", s * mid, below);
            EXPECT(above == ((h + 1) | sb), "just above midpoint %a -> 0x%04x", s * mid, above);
        }
    }
}
END_TEST

START_TEST(test_fp16_known_values) {
    ck_assert_uint_eq(tensor_f32_to_fp16(1.0f), 0x3C00);
    ck_assert_uint_eq(tensor_f32_to_fp16(-2.0f), 0xC000);
    ck_assert_uint_eq(tensor_f32_to_fp16(0.5f), 0x3800);
    ck_assert_uint_eq(tensor_f32_to_fp16(65504.0f), 0x7BFF);   /* largest half */
    ck_assert_uint_eq(tensor_f32_to_fp16(0x1.0p-14f), 0x0400); /* smallest normal */
    ck_assert_uint_eq(tensor_f32_to_fp16(0x1.0p-24f), 0x0001); /* smallest subnormal */
    ck_assert_uint_eq(tensor_f32_to_fp16(1e-8f), 0x0000);      /* below half of it */
    ck_assert_uint_eq(tensor_f32_to_fp16(-0.0f), 0x8000);
    ck_assert_uint_eq(tensor_f32_to_fp16(INFINITY), 0x7C00);
    ck_assert_uint_eq(tensor_f32_to_fp16(-INFINITY), 0xFC00);
    ck_assert_uint_eq(tensor_f32_to_fp16(1e5f), 0x7C00); /* saturates to infinity */
    ck_assert_uint_eq(tensor_f32_to_fp16(1.0f / 3.0f), 0x3555);
    ck_assert(tensor_fp16_to_f32(0x3555) == 0.333251953125f);
    ck_assert(tensor_fp16_to_f32(0xC000) == -2.0f);
    ck_assert(isinf(tensor_fp16_to_f32(0x7C00)));
    ck_assert(isnan(tensor_fp16_to_f32(0x7E00)));
    const uint16_t nan_half = tensor_f32_to_fp16(NAN);
    ck_assert((nan_half & 0x7C00) == 0x7C00 && (nan_half & 0x03FF) != 0);
}
END_TEST

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bfloat16 is the top half of a float: decoding is a shift, and encoding rounds the dropped 16
 * bits to nearest even. Checked over every pattern, with the exact midpoints either side. */
START_TEST(test_bf16_every_bit_pattern) {
    for (uint32_t h = 0; h <= 0xFFFF; h++) {
        const float f = tensor_bf16_to_f32((uint16_t)h);
        EXPECT(f32_bits(f) == h << 16, "bf16 0x%04x decodes to 0x%08x", h, f32_bits(f));
        const int is_nan = (h & 0x7F80) == 0x7F80 && (h & 0x007F) != 0;
        if (is_nan) {
            EXPECT(isnan(tensor_bf16_to_f32(tensor_f32_to_bf16(f))), "NaN 0x%04x lost", h);
            continue;
        }
        EXPECT(tensor_f32_to_bf16(f) == h, "bf16 0x%04x does not round-trip: 0x%04x", h,
               tensor_f32_to_bf16(f));
        if ((h & 0x7F80) == 0x7F80) continue; /* infinities: no neighbour above */
        const uint32_t mid = h << 16 | 0x8000;
        const uint32_t even = (h & 1) ? h + 1 : h;
        const uint16_t at = tensor_f32_to_bf16(f32_from_bits(mid));
        const uint16_t below = tensor_f32_to_bf16(f32_from_bits(mid - 1));
        const uint16_t above = tensor_f32_to_bf16(f32_from_bits(mid + 1));
        EXPECT(at == even, "bf16 midpoint 0x%08x -> 0x%04x", mid, at);
        EXPECT(below == h, "just below bf16 midpoint 0x%08x -> 0x%04x", mid, below);
        EXPECT(above == h + 1, "just above bf16 midpoint 0x%08x -> 0x%04x", mid, above);
    }
}
END_TEST

START_TEST(test_bf16_known_values) {
    ck_assert_uint_eq(tensor_f32_to_bf16(1.0f), 0x3F80);
    ck_assert_uint_eq(tensor_f32_to_bf16(-2.0f), 0xC000);
    ck_assert_uint_eq(tensor_f32_to_bf16(1.0f + 0x1.0p-8f), 0x3F80); /* tie, to even */
    ck_assert_uint_eq(tensor_f32_to_bf16(1.0f + 0x3.0p-8f), 0x3F82); /* tie, to even */
    ck_assert_uint_eq(tensor_f32_to_bf16(FLT_MAX), 0x7F80);          /* saturates to infinity */
    ck_assert(isnan(tensor_bf16_to_f32(tensor_f32_to_bf16(NAN))));
    ck_assert(tensor_bf16_to_f32(0x4049) == 3.140625f);
}
END_TEST

/* ---- core: block layouts, built by hand ------------------------------------------------------ */

static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xFF);
    p[1] = (uint8_t)(v >> 8);
}

/* Q4_0: 2 bytes fp16 d, then 16 bytes; byte j holds element j (low nibble) and j + 16 (high);
 * x = d * (nibble - 8). */
START_TEST(test_layout_q4_0) {
    uint8_t block[18];
    put_u16(block, 0x3800); /* d = 0.5 */
    for (int j = 0; j < 16; j++) block[2 + j] = (uint8_t)(j | (15 - j) << 4);
    static const float expected[32] = {
        -4.0f, -3.5f, -3.0f, -2.5f, -2.0f, -1.5f, -1.0f, -0.5f, /* low nibbles 0..7 */
        0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  2.5f,  3.0f,  3.5f,  /* 8..15 */
        3.5f,  3.0f,  2.5f,  2.0f,  1.5f,  1.0f,  0.5f,  0.0f,  /* high nibbles 15..8 */
        -0.5f, -1.0f, -1.5f, -2.0f, -2.5f, -3.0f, -3.5f, -4.0f, /* 7..0 */
    };
    float out[32];
    traits_of(TENSOR_TYPE_Q4_0)->to_float(block, out, 32);
    for (int i = 0; i < 32; i++) {
        ck_assert_msg(out[i] == expected[i], "Q4_0 element %d: %g, expected %g", i, out[i],
                      expected[i]);
    }
}
END_TEST

/* Q4_1: fp16 d, fp16 m, 16 bytes of nibbles as Q4_0; x = d * nibble + m. */
START_TEST(test_layout_q4_1) {
    uint8_t block[20];
    put_u16(block, 0x3C00);     /* d = 1 */
    put_u16(block + 2, 0xBC00); /* m = -1 */
    for (int j = 0; j < 16; j++) block[4 + j] = (uint8_t)(j | (15 - j) << 4);
    float out[32];
    traits_of(TENSOR_TYPE_Q4_1)->to_float(block, out, 32);
    ck_assert(out[0] == -1.0f);  /* nibble 0 */
    ck_assert(out[5] == 4.0f);   /* nibble 5 */
    ck_assert(out[15] == 14.0f); /* nibble 15 */
    ck_assert(out[16] == 14.0f); /* high nibble of byte 0: 15 */
    ck_assert(out[31] == -1.0f); /* high nibble of byte 15: 0 */
}
END_TEST

/* Q5_0: fp16 d, 4 bytes qh (bit j = fifth bit of element j, little-endian), 16 bytes of nibbles;
 * x = d * (q - 16). Bits 0 and 31 set: elements 0 and 31 get their fifth bit. */
START_TEST(test_layout_q5_0) {
    uint8_t block[22];
    put_u16(block, 0x3C00); /* d = 1 */
    block[2] = 0x01, block[3] = 0x00, block[4] = 0x00, block[5] = 0x80;
    for (int j = 0; j < 16; j++) block[6 + j] = (uint8_t)(j | j << 4);
    static const float expected[32] = {
        0.0f,   -15.0f, -14.0f, -13.0f, -12.0f, -11.0f, -10.0f, -9.0f, /* 16, 1..7 */
        -8.0f,  -7.0f,  -6.0f,  -5.0f,  -4.0f,  -3.0f,  -2.0f,  -1.0f, /* 8..15 */
        -16.0f, -15.0f, -14.0f, -13.0f, -12.0f, -11.0f, -10.0f, -9.0f, /* 0..7 */
        -8.0f,  -7.0f,  -6.0f,  -5.0f,  -4.0f,  -3.0f,  -2.0f,  15.0f, /* 8..14, 31 */
    };
    float out[32];
    traits_of(TENSOR_TYPE_Q5_0)->to_float(block, out, 32);
    for (int i = 0; i < 32; i++) {
        ck_assert_msg(out[i] == expected[i], "Q5_0 element %d: %g, expected %g", i, out[i],
                      expected[i]);
    }
}
END_TEST

/*
 * Q4_K: fp16 d, fp16 dmin, 12 bytes of 6-bit scales sc[8] and mins m[8], 128 bytes of nibbles.
 * Here d = 1, dmin = 0.5, sc = {1, 2, 3, 4, 17, 33, 50, 63}, m = {0, 1, 2, 3, 16, 32, 48, 60},
 * packed by hand: bytes 0-3 = sc[0..3] | (sc[4..7] >> 4) << 6, bytes 4-7 = m[0..3] |
 * (m[4..7] >> 4) << 6, bytes 8-11 = (sc[4..7] & 15) | (m[4..7] & 15) << 4. Byte k of the quants
 * is (k % 16) | (15 - k % 16) << 4; byte 32c + l holds element 64c + l (low nibble) and
 * 64c + 32 + l (high). Element e is in sub-block e / 32: x = d * sc * q - dmin * m.
 */
START_TEST(test_layout_q4_K) {
    uint8_t block[144];
    put_u16(block, 0x3C00);
    put_u16(block + 2, 0x3800);
    static const uint8_t scales[12] = {0x41, 0x82, 0xC3, 0xC4, 0x40, 0x81,
                                       0xC2, 0xC3, 0x01, 0x01, 0x02, 0xCF};
    memcpy(block + 4, scales, sizeof scales);
    for (int k = 0; k < 128; k++) block[16 + k] = (uint8_t)((k % 16) | (15 - k % 16) << 4);
    static const struct {
        int e;
        float x;
    } expected[] = {
        {0, 0.0f},     /* sc 1, m 0, q 0 */
        {5, 5.0f},     /* q 5 */
        {32, 29.5f},   /* sub-block 1 (sc 2, m 1), high nibble of byte 0: 15 -> 30 - 0.5 */
        {47, -0.5f},   /* q 0 */
        {64, -1.0f},   /* sub-block 2 (sc 3, m 2), q 0 */
        {100, 42.5f},  /* sub-block 3 (sc 4, m 3), byte 36, high: 11 -> 44 - 1.5 */
        {128, -8.0f},  /* sub-block 4 (sc 17, m 16), q 0 -> -8 */
        {140, 196.0f}, /* q 12 -> 204 - 8 */
        {170, 149.0f}, /* sub-block 5 (sc 33, m 32), byte 74 high: 5 -> 165 - 16 */
        {200, 376.0f}, /* sub-block 6 (sc 50, m 48), byte 104 low: 8 -> 400 - 24 */
        {240, 915.0f}, /* sub-block 7 (sc 63, m 60), byte 112 high: 15 -> 945 - 30 */
        {255, -30.0f}, /* byte 127 high: 0 */
    };
    float out[256];
    traits_of(TENSOR_TYPE_Q4_K)->to_float(block, out, 256);
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        ck_assert_msg(out[expected[i].e] == expected[i].x, "Q4_K element %d: %g, expected %g",
                      expected[i].e, out[expected[i].e], expected[i].x);
    }
}
END_TEST

/*
 * Q6_K: 128 bytes ql, 64 bytes qh, 16 int8 scales, fp16 d; x = d * scale[e / 16] * (q - 32).
 * In each half h of 128 elements, ql[64h + l] has element l (low nibble) and 64 + l (high),
 * ql[64h + 32 + l] has 32 + l and 96 + l, and qh[32h + l] has their top two bits at shifts
 * 0, 2, 4, 6. Here d = 1, scale[j] = 2j - 15, everything else zero except:
 *   ql[0] = 0x21, ql[32] = 0x43, qh[0] = 0xE4 (top bits 0, 1, 2, 3):
 *     element 0: q = 1, 32: q = 3 | 1 << 4 = 19, 64: q = 2 | 2 << 4 = 34, 96: q = 4 | 3 << 4 = 52
 *   ql[69] = 0xF0 (second half, l = 5), qh[37] = 0x0C (top bits of element 128 + 32 + 5 = 3):
 *     element 133: q = 0, 197: q = 15, 165: q = 0 | 3 << 4 = 48
 */
START_TEST(test_layout_q6_K) {
    uint8_t block[210];
    memset(block, 0, sizeof block);
    block[0] = 0x21, block[32] = 0x43, block[128 + 0] = 0xE4;
    block[69] = 0xF0, block[128 + 37] = 0x0C;
    for (int j = 0; j < 16; j++) block[192 + j] = (uint8_t)(int8_t)(2 * j - 15);
    put_u16(block + 208, 0x3C00);
    static const struct {
        int e;
        float x;
    } expected[] = {
        {0, 465.0f},    /* scale -15, q 1: -15 * -31 */
        {1, 480.0f},    /* scale -15, q 0: -15 * -32 */
        {32, 143.0f},   /* scale -11, q 19 */
        {64, -14.0f},   /* scale -7, q 34 */
        {96, -60.0f},   /* scale -3, q 52 */
        {133, -32.0f},  /* scale 1, q 0 */
        {165, 80.0f},   /* scale 5, q 48 */
        {197, -153.0f}, /* scale 9, q 15 */
        {255, -480.0f}, /* scale 15, q 0 */
    };
    float out[256];
    traits_of(TENSOR_TYPE_Q6_K)->to_float(block, out, 256);
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        ck_assert_msg(out[expected[i].e] == expected[i].x, "Q6_K element %d: %g, expected %g",
                      expected[i].e, out[expected[i].e], expected[i].x);
    }
}
END_TEST

/* The activation types carry the sums their dot products use. */
START_TEST(test_activation_sums) {
    enum { N = 512 };
    float x[N];
    fill_gaussian(x, N, 7, 1.0);
    uint8_t *q81 = quantize_new(TENSOR_TYPE_Q8_1, x, N);
    for (int b = 0; b < N / 32; b++) {
        const uint8_t *blk = q81 + 36 * b;
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * b + j]));
        const float s = tensor_fp16_to_f32((uint16_t)(blk[2] | blk[3] << 8));
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += (int8_t)blk[4 + j];
        /* s is the unrounded scale amax / 127 times the sum of the codes, rounded to fp16. */
        const double want = (double)(amax / 127.0f) * sum;
        ck_assert_msg(fabs(s - want) <= fabs(want) * 0x1.0p-11,
                      "Q8_1 block %d: s = %g, d * sum = %g", b, s, want);
    }
    free(q81);

    uint8_t *q8k = quantize_new(TENSOR_TYPE_Q8_K, x, N);
    for (int b = 0; b < N / 256; b++) {
        const uint8_t *blk = q8k + 292 * b;
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += (int8_t)blk[4 + 16 * g + j];
            int16_t bsum;
            memcpy(&bsum, blk + 4 + 256 + 2 * g, sizeof bsum);
            ck_assert_int_eq(bsum, sum);
        }
    }
    free(q8k);
}
END_TEST

/* ---- core: round trips and dot products ------------------------------------------------------ */

START_TEST(test_round_trip_every_type) {
    enum { N = 4096 };
    float *x = malloc(N * sizeof *x);
    ck_assert_ptr_nonnull(x);
    fill_gaussian(x, N, 1, 1.0);
    for (size_t i = 0; i < N_TYPE_CASES; i++) {
        const type_case *c = &TYPE_CASES[i];
        const double err = round_trip_error(c->type, x, N);
        ck_assert_msg(err <= c->rt_budget, "%s round trip: relative rms error %.6f > budget %.6f",
                      tensor_type_name(c->type), err, c->rt_budget);
    }
    free(x);
}
END_TEST

/* Check vec_dot of x (quantized to `type`) and y (quantized to its vec_dot_type) against both
 * double-precision references; n values. */
static void check_vec_dot(const type_case *c, const float *x, const float *y, int64_t n,
                          const char *what) {
    const tensor_type_traits *t = traits_of(c->type);
    ck_assert_msg(t->vec_dot != NULL, "%s has no vec_dot", t->name);
    void *qx = quantize_new(c->type, x, n);
    void *qy = quantize_new(t->vec_dot_type, y, n);
    float *dx = dequantize_new(c->type, qx, n);
    float *dy = dequantize_new(t->vec_dot_type, qy, n);
    double exact = 0, act = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        exact += (double)dx[i] * dy[i];
        act += (double)dx[i] * y[i];
        scale += fabs((double)dx[i] * y[i]);
    }
    float s = NAN;
    t->vec_dot(n, &s, qx, qy);
    ck_assert_msg(isfinite(s), "%s %s: vec_dot gave %g", t->name, what, s);
    const double exact_budget =
        t->vec_dot_type == TENSOR_TYPE_Q8_1 ? DOT_BUDGET_EXACT_Q8_1 : DOT_BUDGET_EXACT;
    const double tol = scale > 0 ? scale : 1e-30;
    ck_assert_msg(fabs(s - exact) <= exact_budget * tol,
                  "%s %s: vec_dot %.9g vs dequantized dot %.9g (rel %.3g > %.3g)", t->name, what, s,
                  exact, fabs(s - exact) / tol, exact_budget);
    ck_assert_msg(fabs(s - act) <= c->act_budget * tol,
                  "%s %s: vec_dot %.9g vs float-activation dot %.9g (rel %.3g > %.3g)", t->name,
                  what, s, act, fabs(s - act) / tol, c->act_budget);
    free(qx);
    free(qy);
    free(dx);
    free(dy);
}

START_TEST(test_vec_dot_every_type) {
    enum { N = 4096 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    ck_assert(x && y);
    ck_assert_ptr_nonnull(x);
    fill_gaussian(x, N, 2, 1.0);
    fill_gaussian(y, N, 3, 1.0);
    for (size_t i = 0; i < N_SUPPORTED; i++) check_vec_dot(&TYPE_CASES[i], x, y, N, "N(0,1)");
    free(x);
    free(y);
}
END_TEST

/* F32, F16 and BF16 dot products accumulate in double, like ggml's scalar paths: after a first
 * product of 2^24, float addition would drop each following product of 1 (2^24 + 1 rounds back
 * to 2^24), while the double sum keeps them: 2^24 + 31, rounded once to float (spacing 2). */
START_TEST(test_float_dots_accumulate_in_double) {
    enum { N = 32 };
    float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = y[i] = 1.0f;
    x[0] = 512.0f;   /* 2^9 */
    y[0] = 32768.0f; /* 2^15 */
    static const tensor_type types[] = {TENSOR_TYPE_F32, TENSOR_TYPE_F16, TENSOR_TYPE_BF16};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const tensor_type_traits *t = traits_of(types[i]);
        void *qx = quantize_new(types[i], x, N), *qy = quantize_new(types[i], y, N);
        float s = 0;
        t->vec_dot(N, &s, qx, qy);
        ck_assert_msg(fabs((double)s - (16777216.0 + 31)) <= 1.0, "%s: dot %.1f, expected %.1f",
                      t->name, s, 16777216.0 + 31);
        free(qx);
        free(qy);
    }
}
END_TEST

START_TEST(test_supported_types) {
    for (uint32_t id = 0; id < TENSOR_TYPE_COUNT + 8; id++) {
        int expected = 0;
        for (size_t i = 0; i < N_SUPPORTED; i++) expected |= TYPE_CASES[i].type == id;
        ck_assert_msg(tensor_type_is_supported(id) == expected, "type %u (%s): supported = %d", id,
                      tensor_type_name(id), tensor_type_is_supported(id));
    }
    /* The activation-only types can be produced and read but are not weight types. */
    ck_assert_ptr_nonnull(traits_of(TENSOR_TYPE_Q8_1)->from_float);
    ck_assert_ptr_nonnull(traits_of(TENSOR_TYPE_Q8_K)->to_float);
    ck_assert_int_eq(traits_of(TENSOR_TYPE_Q4_K)->vec_dot_type, TENSOR_TYPE_Q8_K);
    ck_assert_int_eq(traits_of(TENSOR_TYPE_Q5_1)->vec_dot_type, TENSOR_TYPE_Q8_1);
    ck_assert_int_eq(traits_of(TENSOR_TYPE_Q5_0)->vec_dot_type, TENSOR_TYPE_Q8_0);
    ck_assert_int_eq(traits_of(TENSOR_TYPE_BF16)->vec_dot_type, TENSOR_TYPE_BF16);
}
END_TEST

/* ---- golden: llama.cpp's quantized files ----------------------------------------------------- */

typedef struct golden_file {
    const char *stem; /* models/synth-llama-<stem>.gguf */
    tensor_type type; /* the type of its 2-D tensors (q4_k_m mixes Q4_K and Q6_K) */
} golden_file;

static const golden_file GOLDEN_FILES[] = {
    {"q8_0", TENSOR_TYPE_Q8_0}, {"q4_0", TENSOR_TYPE_Q4_0},   {"q4_1", TENSOR_TYPE_Q4_1},
    {"q5_0", TENSOR_TYPE_Q5_0}, {"q5_1", TENSOR_TYPE_Q5_1},   {"q4_k", TENSOR_TYPE_Q4_K},
    {"q5_k", TENSOR_TYPE_Q5_K}, {"q6_k", TENSOR_TYPE_Q6_K},   {"f16", TENSOR_TYPE_F16},
    {"bf16", TENSOR_TYPE_BF16}, {"q4_k_m", TENSOR_TYPE_Q4_K},
};

/* The synthetic weights are Gaussian, so the round-trip budgets apply to them too. */
static double golden_budget(tensor_type type) {
    for (size_t i = 0; i < N_TYPE_CASES; i++) {
        if (TYPE_CASES[i].type == type) return TYPE_CASES[i].rt_budget;
    }
    return 0;
}

static gguf_file *open_shared(const char *relative) {
    corral_error err;
    gguf_file *f = gguf_open(test_shared_path(relative), &err);
    ck_assert_msg(f != NULL, "cannot open %s: %s", test_shared_path(relative), err.message);
    return f;
}

/* For every quantized tensor of every golden file: quantize the same-named F32 tensor row by row
 * (as llama-quantize does) and compare bytes, then dequantize the file's tensor and compare it
 * with the F32 weights. Each file must hold at least one tensor of its type, so that a file
 * without the expected types cannot pass vacuously. */
START_TEST(test_golden_llama_cpp_files) {
    gguf_file *ref = open_shared("models/synth-llama-f32.gguf");
    for (size_t fi = 0; fi < sizeof GOLDEN_FILES / sizeof GOLDEN_FILES[0]; fi++) {
        char rel[128];
        snprintf(rel, sizeof rel, "models/synth-llama-%s.gguf", GOLDEN_FILES[fi].stem);
        gguf_file *f = open_shared(rel);
        int n_of_type = 0;
        for (uint64_t ti = 0; ti < gguf_tensor_count(f); ti++) {
            const gguf_tensor *t = gguf_tensor_at(f, ti);
            if (t->type == TENSOR_TYPE_F32) continue;
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
            const tensor_type_traits *tr = traits_of((tensor_type)t->type);
            ck_assert_msg(tensor_type_is_supported(t->type), "%s: %s has unsupported type %s", rel,
                          name, tr->name);
            n_of_type += t->type == (uint32_t)GOLDEN_FILES[fi].type;
            const gguf_tensor *w = gguf_find_tensor(ref, name);
            ck_assert_msg(w != NULL && w->type == TENSOR_TYPE_F32, "%s: no F32 twin", name);
            const int64_t n_per_row = t->ne[0];
            const int64_t n = (int64_t)(w->size / sizeof(float));
            ck_assert_int_eq(w->ne[0], n_per_row);
            const size_t row_bytes = tensor_row_size((tensor_type)t->type, n_per_row);
            ck_assert_uint_eq(row_bytes * (uint64_t)(n / n_per_row), t->size);

            uint8_t *mine = malloc(t->size);
            float *deq = malloc((size_t)n * sizeof *deq);
            ck_assert(mine && deq);
            const float *wf = w->data;
            const uint8_t *theirs = t->data;
            int64_t first_bad = -1, n_bad = 0;
            for (int64_t r = 0; r < n / n_per_row; r++) {
                tr->from_float(wf + r * n_per_row, mine + r * row_bytes, n_per_row);
                if (memcmp(mine + r * row_bytes, theirs + r * row_bytes, row_bytes) != 0) {
                    if (first_bad < 0) first_bad = r;
                    n_bad++;
                }
                tr->to_float(theirs + r * row_bytes, deq + r * n_per_row, n_per_row);
            }
            ck_assert_msg(n_bad == 0,
                          "%s %s (%s): %lld of %lld rows differ from llama.cpp's, "
                          "first row %lld",
                          rel, name, tr->name, (long long)n_bad, (long long)(n / n_per_row),
                          (long long)first_bad);
            const double err = rel_rms_error(deq, wf, n, name);
            ck_assert_msg(err <= golden_budget((tensor_type)t->type),
                          "%s %s (%s): dequantized vs F32 relative rms %.6f > budget %.6f", rel,
                          name, tr->name, err, golden_budget((tensor_type)t->type));
            free(mine);
            free(deq);
        }
        ck_assert_msg(n_of_type > 0, "%s holds no %s tensor", rel,
                      tensor_type_name(GOLDEN_FILES[fi].type));
        gguf_destroy(&f);
    }
    gguf_destroy(&ref);
}
END_TEST

/* ---- limits ---------------------------------------------------------------------------------- */

/* A single block (a single value for the float types) and a long row of many blocks. */
START_TEST(test_one_block_and_many_blocks) {
    enum { MANY = 1 << 16 };
    float *x = malloc(MANY * sizeof *x), *y = malloc(MANY * sizeof *y);
    ck_assert(x && y);
    ck_assert_ptr_nonnull(x);
    fill_gaussian(x, MANY, 11, 1.0);
    fill_gaussian(y, MANY, 12, 1.0);
    for (size_t i = 0; i < N_TYPE_CASES; i++) {
        const type_case *c = &TYPE_CASES[i];
        const int64_t one = block_of(c->type);
        /* One block has too few values for a stable rms: allow twice the budget. */
        const double err1 = round_trip_error(c->type, x, one);
        ck_assert_msg(err1 <= 2 * c->rt_budget, "%s one block: %.6f", tensor_type_name(c->type),
                      err1);
        const double err_many = round_trip_error(c->type, x, MANY);
        ck_assert_msg(err_many <= c->rt_budget, "%s %d values: %.6f", tensor_type_name(c->type),
                      MANY, err_many);
        if (i < N_SUPPORTED) {
            check_vec_dot(c, x, y, one, "one block");
            check_vec_dot(c, x, y, MANY, "many blocks");
        }
    }
    free(x);
    free(y);
}
END_TEST

/* Zeros quantize to zeros: a scale of 0 must not turn into NaN (0 * inf or 0 / 0), whether the
 * whole row is zero, one block is, or one sub-block of 32 inside a non-zero K-quant block is. */
START_TEST(test_zero_blocks) {
    enum { N = 1024 };
    float zeros[N] = {0}, x[N], y[N];
    fill_gaussian(x, N, 21, 1.0);
    fill_gaussian(y, N, 22, 1.0);
    memset(x + 256, 0, 256 * sizeof *x); /* a whole block of every type */
    memset(x + 32, 0, 32 * sizeof *x);   /* one sub-block of 32 */
    for (size_t i = 0; i < N_TYPE_CASES; i++) {
        const tensor_type type = TYPE_CASES[i].type;
        void *q = quantize_new(type, zeros, N);
        float *d = dequantize_new(type, q, N);
        for (int j = 0; j < N; j++) {
            EXPECT(d[j] == 0.0f, "%s zeros: element %d is %g", tensor_type_name(type), j, d[j]);
        }
        free(d);
        void *qx = quantize_new(type, x, N);
        d = dequantize_new(type, qx, N);
        for (int j = 0; j < N; j++) {
            EXPECT(isfinite(d[j]), "%s: element %d is %g", tensor_type_name(type), j, d[j]);
            if ((j >= 256 && j < 512) || (j >= 32 && j < 64)) {
                EXPECT(d[j] == 0.0f, "%s zero block: element %d is %g", tensor_type_name(type), j,
                       d[j]);
            }
        }
        free(d);
        if (i < N_SUPPORTED) {
            const tensor_type_traits *t = traits_of(type);
            void *qy = quantize_new(t->vec_dot_type, y, N);
            void *qz = quantize_new(t->vec_dot_type, zeros, N);
            float s = NAN;
            t->vec_dot(N, &s, q, qy);
            EXPECT(s == 0.0f, "%s: zero row . y = %g", t->name, s);
            s = NAN;
            t->vec_dot(N, &s, qx, qz);
            EXPECT(s == 0.0f, "%s: x . zero row = %g", t->name, s);
            free(qy);
            free(qz);
        }
        free(q);
        free(qx);
    }
}
END_TEST

/* Scaling the data scales the grids: relative errors stay within budget from 1e4 down to 1e-3
 * (fp16 scales are normal there), and dot products stay accurate. */
START_TEST(test_large_and_small_magnitudes) {
    enum { N = 4096 };
    static const double scales[] = {1e4, 1e-3};
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    ck_assert(x && y);
    ck_assert_ptr_nonnull(x);
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
        fill_gaussian(x, N, 31, scales[k]);
        fill_gaussian(y, N, 32, 1.0);
        for (size_t i = 0; i < N_TYPE_CASES; i++) {
            const type_case *c = &TYPE_CASES[i];
            const double err = round_trip_error(c->type, x, N);
            ck_assert_msg(err <= c->rt_budget, "%s at scale %g: relative rms %.6f > %.6f",
                          tensor_type_name(c->type), scales[k], err, c->rt_budget);
            if (i < N_SUPPORTED) check_vec_dot(c, x, y, N, scales[k] > 1 ? "x1e4" : "x1e-3");
        }
    }
    free(x);
    free(y);
}
END_TEST

/* Data of one sign, and data far from zero: the affine types (Q4_1, Q5_1, Q4_K, Q5_K) must then
 * fit an offset, and the K-quant search pins a positive fitted offset to 0 (mins are stored
 * unsigned). Errors are relative to the data's rms, so they stay within the Gaussian budgets. */
START_TEST(test_one_signed_and_offset_data) {
    enum { N = 4096 };
    float *x = malloc(N * sizeof *x);
    ck_assert_ptr_nonnull(x);
    for (int kind = 0; kind < 3; kind++) {
        fill_gaussian(x, N, 51 + (uint64_t)kind, 1.0);
        for (int i = 0; i < N; i++) {
            x[i] = kind == 0 ? fabsf(x[i]) : kind == 1 ? -fabsf(x[i]) : 5.0f + x[i];
        }
        for (size_t i = 0; i < N_TYPE_CASES; i++) {
            const type_case *c = &TYPE_CASES[i];
            const double err = round_trip_error(c->type, x, N);
            ck_assert_msg(err <= c->rt_budget, "%s on %s data: relative rms %.6f > %.6f",
                          tensor_type_name(c->type),
                          kind == 0   ? "positive"
                          : kind == 1 ? "negative"
                                      : "offset",
                          err, c->rt_budget);
        }
    }
    free(x);
}
END_TEST

/* Below the range of fp16 scales (values of 1e-7, and float subnormals) precision is lost, but
 * nothing becomes NaN or infinite and the error stays within a few times the values. */
START_TEST(test_tiny_magnitudes) {
    enum { N = 1024 };
    static const double scales[] = {1e-7, 1e-40};
    float x[N];
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
        fill_gaussian(x, N, 41, scales[k]);
        for (size_t i = 0; i < N_TYPE_CASES; i++) {
            const tensor_type type = TYPE_CASES[i].type;
            void *q = quantize_new(type, x, N);
            float *d = dequantize_new(type, q, N);
            double err2 = 0, ref2 = 0;
            for (int j = 0; j < N; j++) {
                EXPECT(isfinite(d[j]), "%s at %g: element %d is %g", tensor_type_name(type),
                       scales[k], j, d[j]);
                err2 += ((double)d[j] - x[j]) * ((double)d[j] - x[j]);
                ref2 += (double)x[j] * x[j];
            }
            EXPECT(err2 <= TINY_ERROR_BOUND * TINY_ERROR_BOUND * ref2,
                   "%s at %g: error rms %g, data rms %g", tensor_type_name(type), scales[k],
                   sqrt(err2 / N), sqrt(ref2 / N));
            free(q);
            free(d);
        }
    }
}
END_TEST

/*
 * Values that hit the end of the code range. A block of alternating +1, -1 (the first +1 is the
 * value of largest magnitude):
 *   Q4_0: d = 1 / -8; +1 -> code 0 -> +1 exactly; -1 -> 16.5 truncates to 16, capped at 15 ->
 *         (15 - 8) * -1/8 = -0.875.
 *   Q5_0: d = 1 / -16; -1 -> 32.5 -> 31 -> (31 - 16) * -1/16 = -0.9375.
 *   Q6_K: sub-blocks of 16 alternating all +1 and all -1: their scales are -1/32 and +1/32; the
 *         first maps to -128, so d = 1/4096 and the second's 128 is capped at 127; -1 / (127 /
 *         4096) = -32.25 rounds to code -32 -> 127/4096 * -32 = -0.9921875.
 *   Q8_K: -1 maps to +127, the top code, and comes back as -1 exactly.
 */
START_TEST(test_saturating_values) {
    float x[256], out[256];
    for (int i = 0; i < 256; i++) x[i] = (i % 2) ? -1.0f : 1.0f;

    void *q = quantize_new(TENSOR_TYPE_Q4_0, x, 32);
    traits_of(TENSOR_TYPE_Q4_0)->to_float(q, out, 32);
    for (int i = 0; i < 32; i++) ck_assert(out[i] == ((i % 2) ? -0.875f : 1.0f));
    free(q);

    q = quantize_new(TENSOR_TYPE_Q5_0, x, 32);
    traits_of(TENSOR_TYPE_Q5_0)->to_float(q, out, 32);
    for (int i = 0; i < 32; i++) ck_assert(out[i] == ((i % 2) ? -0.9375f : 1.0f));
    free(q);

    q = quantize_new(TENSOR_TYPE_Q8_K, x, 256);
    traits_of(TENSOR_TYPE_Q8_K)->to_float(q, out, 256);
    for (int i = 0; i < 256; i++) ck_assert(out[i] == x[i]);
    free(q);

    for (int i = 0; i < 256; i++) x[i] = ((i / 16) % 2) ? -1.0f : 1.0f;
    q = quantize_new(TENSOR_TYPE_Q6_K, x, 256);
    traits_of(TENSOR_TYPE_Q6_K)->to_float(q, out, 256);
    for (int i = 0; i < 256; i++) {
        ck_assert_msg(out[i] == (((i / 16) % 2) ? -0.9921875f : 1.0f), "Q6_K element %d: %g", i,
                      out[i]);
    }
    free(q);

    /* Floats beyond the 16-bit formats' range become infinities (IEEE overflow). */
    const float big[2] = {1e5f, -FLT_MAX};
    uint16_t h[2];
    traits_of(TENSOR_TYPE_F16)->from_float(big, h, 2);
    ck_assert_uint_eq(h[0], 0x7C00);
    ck_assert_uint_eq(h[1], 0xFC00);
    traits_of(TENSOR_TYPE_BF16)->from_float(big, h, 2);
    ck_assert_uint_eq(h[1], 0xFF80);
}
END_TEST

/* ---- errors ---------------------------------------------------------------------------------- */

START_TEST(test_unknown_type_ids) {
    static const uint32_t bad[] = {4, 5, 31, 32, 33, 36, 37, 38, 40, 1000, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(tensor_type_get_traits(bad[i]) == NULL, "type id %u has traits", bad[i]);
        ck_assert_str_eq(tensor_type_name(bad[i]), "unknown");
        ck_assert_int_eq(tensor_type_is_supported(bad[i]), 0);
    }
}
END_TEST

START_TEST(test_type_names) {
    tensor_type t = TENSOR_TYPE_F32;
    ck_assert_int_eq(tensor_type_from_name("q4_k", &t), 0);
    ck_assert_int_eq(t, TENSOR_TYPE_Q4_K);
    ck_assert_int_eq(tensor_type_from_name("Bf16", &t), 0);
    ck_assert_int_eq(t, TENSOR_TYPE_BF16);
    static const char *const bad[] = {"",      "Q4",    "Q4_2",     "Q4_0 ",   " Q4_0",
                                      "q4_00", "F32\n", "Q4_0_4_4", "unknown", "Q4-K"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        t = TENSOR_TYPE_F16;
        ck_assert_msg(tensor_type_from_name(bad[i], &t) == -1, "'%s' accepted", bad[i]);
        ck_assert_int_eq(t, TENSOR_TYPE_F16);
    }
    ck_assert_int_eq(tensor_type_from_name(NULL, &t), -1);
}
END_TEST

static Suite *tensor_suite(void) {
    Suite *s = suite_create("tensor");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_fp16_every_bit_pattern);
    tcase_add_test(core, test_fp16_rounds_to_nearest_even);
    tcase_add_test(core, test_fp16_known_values);
    tcase_add_test(core, test_bf16_every_bit_pattern);
    tcase_add_test(core, test_bf16_known_values);
    tcase_add_test(core, test_layout_q4_0);
    tcase_add_test(core, test_layout_q4_1);
    tcase_add_test(core, test_layout_q5_0);
    tcase_add_test(core, test_layout_q4_K);
    tcase_add_test(core, test_layout_q6_K);
    tcase_add_test(core, test_activation_sums);
    tcase_add_test(core, test_round_trip_every_type);
    tcase_add_test(core, test_vec_dot_every_type);
    tcase_add_test(core, test_float_dots_accumulate_in_double);
    tcase_add_test(core, test_supported_types);
    suite_add_tcase(s, core);
    TCase *golden = tcase_create("golden");
    tcase_add_test(golden, test_golden_llama_cpp_files);
    suite_add_tcase(s, golden);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_one_block_and_many_blocks);
    tcase_add_test(limits, test_zero_blocks);
    tcase_add_test(limits, test_large_and_small_magnitudes);
    tcase_add_test(limits, test_one_signed_and_offset_data);
    tcase_add_test(limits, test_tiny_magnitudes);
    tcase_add_test(limits, test_saturating_values);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_unknown_type_ids);
    tcase_add_test(errors, test_type_names);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(tensor_suite)
