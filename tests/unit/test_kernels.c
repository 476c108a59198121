/*
 * test_kernels.c — Check suite for the kernel dispatch (engine/src/kernels.h): every SIMD kernel
 * of every path this CPU can run (avx2 and avx512, each with and without VNNI) against its scalar
 * twin on random data with fixed seeds, and the choice of path (CORRAL_CPU).
 *
 * Error budgets: how far a SIMD kernel may be from its scalar twin.
 *
 *   activation quantizers (Q8_0, Q8_1, Q8_K, F16, BF16)   byte-identical, for every input but
 *       one: a signalling NaN in a Q8_0/Q8_1 block. The scalar code finds the block maximum with
 *       fmaxf, which in glibc (not in every libc) turns a signalling NaN into a NaN maximum that
 *       the next element then replaces, so the scalar result itself is libc-dependent there;
 *       the SIMD maximum ignores every NaN. Arithmetic never produces signalling NaNs, and
 *       activations are always results of arithmetic, so the engine never meets this case; the
 *       test quiets them for those two quantizers and keeps them everywhere else.
 *   to_float (dequantization)                             bit-identical
 *   attention accumulation (y += a * x, F32 and F16 x)    bit-identical
 *
 *   QUANT_DOT_REL_ERR  quantized dot products, relative to S = sum of |terms|, where the terms are
 *       the products of the dequantized weights (each scale part separately: d and m of Q4_1,
 *       d and dmin of the K-quants) with the dequantized activations. The integer block sums are
 *       exact in both kernels; they differ only in how the float products d_block * sum_block are
 *       added up (one running float sum against 8 or 16 float lanes), and in the float rounding
 *       of large int32 sums. Each float addition errs by at most 2^-24 of a partial sum bounded
 *       by S, so the worst case grows with the number of blocks (~ n_blocks * 6e-8 * S), while
 *       for data with random signs it is about sqrt(n_blocks) * 6e-8 * S. The longest rows here
 *       have 129 blocks: 1e-6 leaves a margin of 10 over the random-sign expectation and is still
 *       far below what any real defect causes (a single wrong element costs about S / n_elems,
 *       >= 2.4e-4 * S at the longest length).
 *   F16_PANEL_REL_ERR(n)  the F16 panel kernel against tensor__vec_dot_f16: the products w * y of
 *       two halves are exact in float, but the kernel adds them in float (one FMA chain in
 *       element order) where the twin adds in double. n float additions err by at most
 *       n * 2^-24 of sum(|w * y|) = S, plus the twin's own rounding to float: (n + 1) * 2^-24 * S.
 *       A single wrong element costs about S / n, which is far above that for every length
 *       tested (n <= 300: 2e-5 * S against >= 3e-3 * S).
 *   FLOAT_DOT_ULPS / FLOAT_DOT_REL_ERR  F32, F16 and BF16 dot products: both kernels round the
 *       same float products and sum them in double, in different orders, so they agree up to
 *       the final rounding to float (1 ulp of the result), plus a double-rounding term 1e-12 * S
 *       that only matters under heavy cancellation.
 *   ATTN_DOT_REL_ERR  query-key dots, float accumulation in both (sequential against lanes with
 *       FMA): 2e-6 * S, for head dimensions up to 257 (random-sign error ~ sqrt(n) * 6e-8).
 *   RMS_NORM_REL_ERR  the same double sum of squares in another order can move the float mean
 *       by one ulp, hence the scale and the outputs by about one ulp: 3 * FLT_EPSILON relative.
 *   EXP_OPS_REL_ERR / EXP_OPS_ABS_ERR  swiglu, geglu and softmax use a vector e^x within ~2 ulp of
 *       libm's expf; with the divisions and products around it, 8 * FLT_EPSILON relative, and an
 *       absolute 1e-37 where results are subnormal (relative error means nothing there).
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "corral/cpu.h"
#include "corral/model.h"
#include "corral/tensor.h"
#include "kernels.h"
#include "ops.h"
#include "tensor_blocks.h"
#include "testutil.h"

#define QUANT_DOT_REL_ERR    1e-6
#define FLOAT_DOT_ULPS       1.0
#define FLOAT_DOT_REL_ERR    1e-12
#define F16_PANEL_REL_ERR(n) (((double)(n) + 1) * 0x1p-24)
#define ATTN_DOT_REL_ERR     2e-6
#define RMS_NORM_REL_ERR     (3 * FLT_EPSILON)
#define EXP_OPS_REL_ERR      (8 * FLT_EPSILON)
#define EXP_OPS_ABS_ERR      1e-37

/* ---- random data ----------------------------------------------------------------------------- */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r) {
    /* splitmix64 */
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float rng_uniform(rng *r) {
    return (float)((double)(rng_next(r) >> 11) * 0x1.0p-52 - 1.0);
}

/* Roughly normal (sum of four uniforms), times a per-call magnitude. */
static float rng_normal(rng *r) {
    return (rng_uniform(r) + rng_uniform(r) + rng_uniform(r) + rng_uniform(r)) * 0.8660254f;
}

static void rng_bytes(rng *r, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rng_next(r);
}

/* n floats, each block of `block` values with its own magnitude (activations vary by token and
 * channel group), occasionally with one large outlier as real activations have. */
static void rng_activations(rng *r, float *x, int64_t n, int64_t block) {
    for (int64_t b = 0; b < n; b += block) {
        const float mag = powf(10.0f, 2.0f * rng_uniform(r));
        for (int64_t i = b; i < b + block && i < n; i++) x[i] = rng_normal(r) * mag;
        if (rng_next(r) % 4 == 0) x[b + (int64_t)(rng_next(r) % (uint64_t)block) % (n - b)] *= 20;
    }
}

/* ---- the variants to test -------------------------------------------------------------------- */

typedef struct variant {
    const kernel_ops *ops;
    const char *name;
} variant;

/* The SIMD variants this CPU can run (never the scalar one). */
static int simd_variants(variant *out) {
    int n = 0;
    for (int p = KERNEL_PATH_AVX2; p < KERNEL_PATH_COUNT; p++) {
        for (int v = 0; v < 2; v++) {
            const kernel_ops *o = kernels_for_variant((kernel_path)p, v);
            if (o) out[n++] = (variant){o, o->name};
        }
    }
    return n;
}

static const tensor_type dot_types[] = {
    TENSOR_TYPE_F32,  TENSOR_TYPE_F16,  TENSOR_TYPE_BF16, TENSOR_TYPE_Q4_0,
    TENSOR_TYPE_Q4_1, TENSOR_TYPE_Q5_0, TENSOR_TYPE_Q5_1, TENSOR_TYPE_Q8_0,
    TENSOR_TYPE_Q4_K, TENSOR_TYPE_Q5_K, TENSOR_TYPE_Q6_K,
};
enum { N_DOT_TYPES = sizeof dot_types / sizeof dot_types[0] };

/* Byte offsets of a block's fp16 scale fields; zeroing all but one splits a weight row into the
 * parts whose products a dot kernel sums separately (for the budget's S). */
typedef struct scale_fields {
    int n;
    size_t off[2];
} scale_fields;

static scale_fields type_scale_fields(tensor_type t) {
    switch (t) {
        case TENSOR_TYPE_Q4_0:
        case TENSOR_TYPE_Q5_0:
        case TENSOR_TYPE_Q8_0:
            return (scale_fields){1, {0}};
        case TENSOR_TYPE_Q4_1:
        case TENSOR_TYPE_Q5_1:
        case TENSOR_TYPE_Q4_K:
        case TENSOR_TYPE_Q5_K:
            return (scale_fields){2, {0, 2}};
        case TENSOR_TYPE_Q6_K:
            return (scale_fields){1, {offsetof(block_q6_K, d)}};
        default:
            return (scale_fields){0, {0}};
    }
}

/* A random weight row: random codes (every bit pattern, including Q8_0's -128), finite scales
 * of varied magnitude; float types get normal values. */
static void make_weights(rng *r, tensor_type t, int64_t n, void *dst) {
    const tensor_type_traits *tt = tensor_type_get_traits(t);
    if (!tt->is_quantized) {
        for (int64_t i = 0; i < n; i++) {
            const float v = rng_normal(r) * 0.05f;
            if (t == TENSOR_TYPE_F32)
                ((float *)dst)[i] = v;
            else if (t == TENSOR_TYPE_F16)
                ((uint16_t *)dst)[i] = tensor_f32_to_fp16(v);
            else
                ((uint16_t *)dst)[i] = tensor_f32_to_bf16(v);
        }
        return;
    }
    const size_t row = tensor_row_size(t, n);
    rng_bytes(r, dst, row);
    const scale_fields sf = type_scale_fields(t);
    for (int64_t b = 0; b < n / tt->block_size; b++) {
        uint8_t *blk = (uint8_t *)dst + (size_t)b * tt->type_size;
        for (int k = 0; k < sf.n; k++) {
            const uint16_t h = tensor_f32_to_fp16(rng_uniform(r) * 0.01f * (float)(1 + k));
            memcpy(blk + sf.off[k], &h, sizeof h);
        }
    }
}

/* S = sum over the parts of the row of sum_i |w_part[i] * y[i]| (dequantized), in double. */
static double dot_scale(tensor_type t, const void *w, const void *y, int64_t n) {
    const tensor_type_traits *tt = tensor_type_get_traits(t);
    const tensor_type_traits *yt = tensor_type_get_traits(tt->vec_dot_type);
    float *wf = malloc((size_t)n * sizeof(float)), *yf = malloc((size_t)n * sizeof(float));
    const size_t row = tensor_row_size(t, n);
    void *part = malloc(row);
    yt->to_float(y, yf, n);
    const scale_fields sf = type_scale_fields(t);
    double s = 0.0;
    for (int keep = 0; keep < (sf.n ? sf.n : 1); keep++) {
        memcpy(part, w, row);
        for (int64_t b = 0; sf.n > 1 && b < n / tt->block_size; b++)
            for (int k = 0; k < sf.n; k++)
                if (k != keep)
                    memset((uint8_t *)part + (size_t)b * tt->type_size + sf.off[k], 0, 2);
        tt->to_float(part, wf, n);
        for (int64_t i = 0; i < n; i++) s += fabs((double)wf[i] * (double)yf[i]);
    }
    free(part);
    free(wf);
    free(yf);
    return s;
}

/* Distance between two floats in units of the spacing at the reference. */
static double ulps_apart(float got, float ref) {
    const double spacing = nextafterf(fabsf(ref), INFINITY) - fabsf(ref);
    return fabs((double)got - (double)ref) / spacing;
}

/* ---- dot products ---------------------------------------------------------------------------- */

START_TEST(test_vec_dot_matches_scalar) {
    variant vs[8];
    const int nv = simd_variants(vs);
    static const int64_t blocks[] = {1, 2, 3, 5, 7, 8, 31, 64, 129};
    static const int64_t kblocks[] = {1, 2, 3, 5, 11, 16};
    static const int64_t flens[] = {1,  2,  3,  7,  8,  9,   15,  16,  17,   31,
                                    32, 33, 63, 64, 65, 100, 255, 256, 1000, 4097};
    double worst[N_DOT_TYPES] = {0};
    int checked = 0;
    for (int ti = 0; ti < N_DOT_TYPES; ti++) {
        const tensor_type t = dot_types[ti];
        const tensor_type_traits *tt = tensor_type_get_traits(t);
        const tensor_type_traits *yt = tensor_type_get_traits(tt->vec_dot_type);
        const int64_t *lens = tt->block_size == 1 ? flens : tt->block_size == 32 ? blocks : kblocks;
        const int n_lens = tt->block_size == 1    ? (int)(sizeof flens / sizeof flens[0])
                           : tt->block_size == 32 ? (int)(sizeof blocks / sizeof blocks[0])
                                                  : (int)(sizeof kblocks / sizeof kblocks[0]);
        for (int li = 0; li < n_lens; li++) {
            const int64_t n = tt->block_size == 1 ? lens[li] : lens[li] * tt->block_size;
            for (uint64_t seed = 1; seed <= 4; seed++) {
                rng r = {seed * 7919 + (uint64_t)ti * 104729 + (uint64_t)n};
                void *w = malloc(tensor_row_size(t, n));
                void *y = malloc(tensor_row_size(tt->vec_dot_type, n));
                float *yf = malloc((size_t)n * sizeof(float));
                make_weights(&r, t, n, w);
                rng_activations(&r, yf, n, yt->block_size > 1 ? yt->block_size : 32);
                yt->from_float(yf, y, n); /* activations as the engine makes them */
                float ref;
                tt->vec_dot(n, &ref, w, y);
                const double S = dot_scale(t, w, y, n);
                for (int v = 0; v < nv; v++) {
                    float got;
                    vs[v].ops->type[t].vec_dot(n, &got, w, y);
                    const double d = fabs((double)got - (double)ref);
                    double budget, rel;
                    if (tt->is_quantized) {
                        budget = QUANT_DOT_REL_ERR * S;
                        rel = S > 0 ? d / S : d;
                    } else {
                        budget = FLOAT_DOT_ULPS * (nextafterf(fabsf(ref), INFINITY) - fabsf(ref)) +
                                 FLOAT_DOT_REL_ERR * S;
                        rel = ulps_apart(got, ref);
                    }
                    if (rel > worst[ti]) worst[ti] = rel;
                    ck_assert_msg(d <= budget,
                                  "%s vec_dot %s n=%lld seed %llu: %.9g vs scalar %.9g (|d| %.3g > "
                                  "budget %.3g, S %.3g)",
                                  vs[v].name, tt->name, (long long)n, (unsigned long long)seed, got,
                                  ref, d, budget, S);
                    checked++;
                }
                free(w);
                free(y);
                free(yf);
            }
        }
    }
    for (int ti = 0; ti < N_DOT_TYPES; ti++)
        printf("  vec_dot %-5s worst %s %.3g\n", tensor_type_name(dot_types[ti]),
               tensor_type_get_traits(dot_types[ti])->is_quantized ? "|d|/S" : "ulps", worst[ti]);
    printf("  %d dot products checked on %d SIMD variants\n", checked, nv);
}
END_TEST

/* ---- panel kernels --------------------------------------------------------------------------- */

static const tensor_type panel_types[] = {TENSOR_TYPE_Q4_0, TENSOR_TYPE_Q8_0, TENSOR_TYPE_Q4_K,
                                          TENSOR_TYPE_Q6_K, TENSOR_TYPE_F16};

/* A weight of n_out random rows of n elements, packed into panels and unpacked again row by row,
 * is the same bytes; the layout keeps the size and leaves the rows after the last panel alone. */
START_TEST(test_panel_pack_roundtrip) {
    static const int64_t n_outs[] = {16, 17, 31, 48, 53};
    for (size_t ti = 0; ti < sizeof panel_types / sizeof panel_types[0]; ti++) {
        const tensor_type t = panel_types[ti];
        ck_assert(kernels_panel_layout_known(t));
        const int64_t n = 3 * tensor_type_get_traits(t)->block_size;
        const size_t row = tensor_row_size(t, n);
        for (size_t oi = 0; oi < sizeof n_outs / sizeof n_outs[0]; oi++) {
            const int64_t n_out = n_outs[oi];
            rng r = {1000 + ti * 31 + oi};
            uint8_t *w = malloc(row * n_out), *packed = malloc(row * n_out), *back = malloc(row);
            rng_bytes(&r, w, row * n_out);
            const int64_t n_panels = n_out / KERNEL_PANEL_ROWS;
            /* Two calls, as a caller spreading the work would make them. */
            kernels_panel_pack(t, w, n, n_out, 0, n_panels / 2, packed);
            kernels_panel_pack(t, w, n, n_out, n_panels / 2, n_panels, packed);
            if (n_panels > 0)
                ck_assert_msg(memcmp(w, packed, row * KERNEL_PANEL_ROWS) != 0,
                              "%s: packing changed nothing", tensor_type_name(t));
            const size_t tail = (size_t)n_panels * KERNEL_PANEL_ROWS * row;
            ck_assert(memcmp(w + tail, packed + tail, row * n_out - tail) == 0);
            for (int64_t i = 0; i < n_out; i++) {
                kernels_panel_get_row(t, packed, n, n_out, i, back);
                ck_assert_msg(memcmp(back, w + i * row, row) == 0, "%s: row %lld of %lld differs",
                              tensor_type_name(t), (long long)i, (long long)n_out);
            }
            free(w);
            free(packed);
            free(back);
        }
    }
    ck_assert(!kernels_panel_layout_known(TENSOR_TYPE_Q5_K));
    ck_assert(!kernels_panel_layout_known(TENSOR_TYPE_BF16));
}
END_TEST

/* Every panel kernel of every SIMD variant against the scalar vec_dot, row by row and token by
 * token: bit-identical (kernels.h). Token counts cover full tiles and every kind of partial one;
 * row lengths cover one block up to many. */
START_TEST(test_panel_dot_matches_scalar) {
    variant vs[8];
    const int nv = simd_variants(vs);
    static const int64_t blocks[] = {1, 2, 3, 7, 64, 129};
    static const int64_t kblocks[] = {1, 2, 3, 11};
    static const int64_t flens[] = {1, 2, 3, 17, 64, 300};
    static const int64_t n_toks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 19, 31};
    /* 11 panels: every grouping the kernels make (up to 8 panels a tile) and a remainder. */
    const int64_t n_out = 11 * KERNEL_PANEL_ROWS;
    int checked = 0;
    double worst_f16 = 0;
    for (size_t ti = 0; ti < sizeof panel_types / sizeof panel_types[0]; ti++) {
        const tensor_type t = panel_types[ti];
        const tensor_type_traits *tt = tensor_type_get_traits(t);
        const tensor_type vt = tt->vec_dot_type;
        const tensor_type_traits *yt = tensor_type_get_traits(vt);
        const int64_t *lens = tt->block_size == 32 ? blocks : tt->block_size == 1 ? flens : kblocks;
        const size_t n_lens = tt->block_size == 32  ? sizeof blocks / sizeof blocks[0]
                              : tt->block_size == 1 ? sizeof flens / sizeof flens[0]
                                                    : sizeof kblocks / sizeof kblocks[0];
        /* F16 panels take the activations widened to float (kernels.h), and agree with the
         * twin within F16_PANEL_REL_ERR; the others bit for bit. */
        const bool widen = t == TENSOR_TYPE_F16;
        for (size_t li = 0; li < n_lens; li++) {
            const int64_t n = lens[li] * tt->block_size;
            const size_t row = tensor_row_size(t, n), yrow = tensor_row_size(vt, n);
            const int64_t max_tok = n_toks[sizeof n_toks / sizeof n_toks[0] - 1];
            rng r = {77 + ti * 1009 + (uint64_t)n};
            uint8_t *w = malloc(row * n_out), *packed = malloc(row * n_out);
            uint8_t *y = malloc(yrow * max_tok);
            float *yw = malloc((size_t)n * max_tok * sizeof(float));
            double *scale = malloc((size_t)max_tok * n_out * sizeof(double)); /* S per output */
            float *first = malloc((size_t)max_tok * n_out * sizeof(float));
            float *yf = malloc((size_t)n * sizeof(float));
            kernel_act_aux *aux = malloc((size_t)max_tok * (n / 32) * sizeof *aux);
            float *ref = malloc((size_t)max_tok * n_out * sizeof(float));
            float *got = malloc((size_t)max_tok * n_out * sizeof(float));
            float *alone = malloc((size_t)max_tok * n_out * sizeof(float));
            for (int64_t i = 0; i < n_out; i++) make_weights(&r, t, n, w + i * row);
            for (int64_t k = 0; k < max_tok; k++) {
                rng_activations(&r, yf, n, yt->block_size);
                yt->from_float(yf, y + k * yrow, n);
                if (vt == TENSOR_TYPE_Q8_0) kernels_act_aux(y + k * yrow, n, aux + k * (n / 32));
                for (int64_t i = 0; widen && i < n; i++)
                    yw[k * n + i] = tensor_fp16_to_f32(((const uint16_t *)(y + k * yrow))[i]);
                for (int64_t i = 0; i < n_out; i++) {
                    tt->vec_dot(n, &ref[k * n_out + i], w + i * row, y + k * yrow);
                    double S = 0;
                    for (int64_t e = 0; widen && e < n; e++)
                        S += fabs((double)tensor_fp16_to_f32(((const uint16_t *)(w + i * row))[e]) *
                                  yw[k * n + e]);
                    scale[k * n_out + i] = S;
                }
            }
            kernels_panel_pack(t, w, n, n_out, 0, n_out / KERNEL_PANEL_ROWS, packed);
            for (int v = 0; v < nv; v++) {
                const kernel_panel_dot_fn dot = vs[v].ops->type[t].panel_dot;
                ck_assert_msg(dot != NULL, "%s has no %s panel kernel", vs[v].name, tt->name);
                for (size_t ki = 0; ki < sizeof n_toks / sizeof n_toks[0]; ki++) {
                    const int64_t n_tok = n_toks[ki];
                    memset(got, 0xFF, (size_t)max_tok * n_out * sizeof(float));
                    /* All panels in one call, or (odd ki) in calls of 3 and the 2 left over. */
                    const int64_t n_panels = n_out / KERNEL_PANEL_ROWS,
                                  group = ki % 2 ? 3 : n_panels;
                    for (int64_t p = 0; p < n_panels; p += group)
                        dot(n, packed + p * KERNEL_PANEL_ROWS * row,
                            p + group <= n_panels ? group : n_panels - p,
                            widen ? (void *)yw : (void *)y,
                            widen ? (size_t)n * sizeof(float) : yrow, aux, n / 32, n_tok,
                            got + p * KERNEL_PANEL_ROWS, n_out);
                    for (int64_t k = 0; k < n_tok; k++)
                        for (int64_t i = 0; i < n_out; i++) {
                            const size_t o = (size_t)(k * n_out + i);
                            const float a = got[o], b = ref[o];
                            if (widen) {
                                const double d = fabs((double)a - b),
                                             budget = F16_PANEL_REL_ERR(n) * scale[o];
                                ck_assert_msg(d <= budget,
                                              "%s panel F16 n=%lld tokens=%lld: row %lld token "
                                              "%lld: %.9g vs scalar %.9g (|d| %.3g > %.3g)",
                                              vs[v].name, (long long)n, (long long)n_tok,
                                              (long long)i, (long long)k, a, b, d, budget);
                                if (d > 0 && d / scale[o] > worst_f16) worst_f16 = d / scale[o];
                            } else {
                                ck_assert_msg(memcmp(&a, &b, sizeof a) == 0,
                                              "%s panel %s n=%lld tokens=%lld: row %lld token "
                                              "%lld: %.9g vs scalar %.9g",
                                              vs[v].name, tt->name, (long long)n, (long long)n_tok,
                                              (long long)i, (long long)k, a, b);
                            }
                            /* A token's result does not depend on how many share its batch. */
                            if (ki == 0 && k == 0) first[i] = a;
                            if (k == 0)
                                ck_assert_msg(memcmp(&a, &first[i], sizeof a) == 0,
                                              "%s panel %s n=%lld: token 0 of %lld differs from "
                                              "token 0 alone",
                                              vs[v].name, tt->name, (long long)n, (long long)n_tok);
                            checked++;
                        }
                    /* ... nor on the panels computed beside its row: panel by panel, the same
                     * bits for every token. */
                    if (ki == sizeof n_toks / sizeof n_toks[0] - 1) {
                        for (int64_t p = 0; p < n_panels; p++)
                            dot(n, packed + p * KERNEL_PANEL_ROWS * row, 1,
                                widen ? (void *)yw : (void *)y,
                                widen ? (size_t)n * sizeof(float) : yrow, aux, n / 32, n_tok,
                                alone + p * KERNEL_PANEL_ROWS, n_out);
                        ck_assert_msg(memcmp(alone, got, (size_t)n_tok * n_out * sizeof(float)) ==
                                          0,
                                      "%s panel %s n=%lld: %lld tokens panel by panel differ "
                                      "from all panels in one call",
                                      vs[v].name, tt->name, (long long)n, (long long)n_tok);
                    }
                    /* Nothing written beyond the n_tok tokens asked for. */
                    for (int64_t k = n_tok; k < max_tok; k++) {
                        uint32_t u;
                        memcpy(&u, &got[k * n_out], sizeof u);
                        ck_assert_uint_eq(u, 0xFFFFFFFFu);
                    }
                }
            }
            free(w);
            free(packed);
            free(y);
            free(yw);
            free(scale);
            free(first);
            free(yf);
            free(aux);
            free(ref);
            free(got);
            free(alone);
        }
    }
    printf("  %d panel outputs checked on %d SIMD variants (bit-identical to scalar; F16 worst "
           "|d|/S %.3g)\n",
           checked, nv, worst_f16);
}
END_TEST

/* ---- activation quantizers ------------------------------------------------------------------- */

/* Inputs that reach every branch of the quantizers: ordinary blocks of varied magnitude, ties at
 * half-integers after scaling, zeros and -0, subnormals (a subnormal scale whose inverse
 * overflows), huge values, infinities and NaNs (with payloads and both signs), and random bit
 * patterns (anything a float can be). */
static void make_quantizer_input(rng *r, float *x, int64_t n, int64_t block, int kind) {
    switch (kind) {
        case 0:
            rng_activations(r, x, n, block);
            break;
        case 1: /* amax 127 (d = 1) or the signed max -127 (Q8_K iscale = 1): exact .5 ties */
            for (int64_t i = 0; i < n; i++)
                x[i] = (float)((int64_t)(rng_next(r) % 253) - 126) + (rng_next(r) % 2 ? 0.5f : 0);
            for (int64_t b = 0; b < n; b += block) x[b] = (rng_next(r) % 2) ? 127.0f : -127.0f;
            break;
        case 2: /* zeros, -0 and all-zero blocks */
            for (int64_t i = 0; i < n; i++) x[i] = (rng_next(r) % 3) ? 0.0f : -0.0f;
            if (n > block) x[block + 1] = 1.0f;
            break;
        case 3: /* subnormal and tiny */
            for (int64_t i = 0; i < n; i++) x[i] = rng_normal(r) * 1e-40f;
            break;
        case 4: /* huge */
            for (int64_t i = 0; i < n; i++) x[i] = rng_uniform(r) * 3.4e38f;
            break;
        case 5: /* specials sprinkled into ordinary data */
        {
            static const uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7fc00000u,
                                                0xffc00000u, 0x7f800001u, 0x7fa5a5a5u,
                                                0xffffffffu, 0x00000001u, 0x80000001u};
            rng_activations(r, x, n, block);
            for (int64_t i = 0; i < n; i++) {
                if (rng_next(r) % 16) continue;
                const uint32_t u = specials[rng_next(r) % (sizeof specials / sizeof specials[0])];
                memcpy(&x[i], &u, sizeof u);
            }
            break;
        }
        default: /* random bits */
            for (int64_t i = 0; i < n; i++) {
                const uint32_t u = (uint32_t)rng_next(r);
                memcpy(&x[i], &u, sizeof u);
            }
    }
}

/* Set the quiet bit of every NaN (see the budget notes at the top). */
static void quiet_signalling_nans(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;
        memcpy(&x[i], &u, sizeof u);
    }
}

START_TEST(test_quantizers_byte_identical) {
    variant vs[8];
    const int nv = simd_variants(vs);
    static const tensor_type types[] = {TENSOR_TYPE_Q8_0, TENSOR_TYPE_Q8_1, TENSOR_TYPE_Q8_K,
                                        TENSOR_TYPE_F16, TENSOR_TYPE_BF16};
    int checked = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const tensor_type t = types[ti];
        const tensor_type_traits *tt = tensor_type_get_traits(t);
        const int64_t block = tt->block_size > 1 ? tt->block_size : 16;
        static const int64_t counts[] = {1, 2, 3, 7, 16};
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
            /* Float types also get lengths that are no multiple of a vector. */
            for (int extra = 0; extra < (tt->block_size > 1 ? 1 : 3); extra++) {
                const int64_t n = counts[ci] * block + (extra ? 2 * extra + 1 : 0);
                for (int kind = 0; kind < 7; kind++) {
                    rng r = {1000 + ti * 131 + (uint64_t)n * 17 + (uint64_t)kind};
                    float *x = malloc((size_t)n * sizeof(float));
                    make_quantizer_input(&r, x, n, block, kind);
                    if (t == TENSOR_TYPE_Q8_0 || t == TENSOR_TYPE_Q8_1) quiet_signalling_nans(x, n);
                    const size_t row = tensor_row_size(t, n);
                    uint8_t *ref = calloc(1, row), *got = malloc(row);
                    tt->from_float(x, ref, n);
                    for (int v = 0; v < nv; v++) {
                        memset(got, 0xA5, row);
                        vs[v].ops->type[t].from_float(x, got, n);
                        size_t at = 0;
                        while (at < row && got[at] == ref[at]) at++;
                        ck_assert_msg(at == row,
                                      "%s quantize %s n=%lld input kind %d: byte %zu is 0x%02x, "
                                      "scalar 0x%02x",
                                      vs[v].name, tt->name, (long long)n, kind, at, got[at],
                                      ref[at]);
                        checked++;
                    }
                    free(x);
                    free(ref);
                    free(got);
                }
            }
        }
    }
    printf("  %d quantized rows byte-identical on %d SIMD variants\n", checked, nv);
}
END_TEST

/* One million random float words (half of them near the half-precision range) through the F16
 * and BF16 converters, byte for byte. */
START_TEST(test_half_conversions_random_bit_patterns) {
    variant vs[8];
    const int nv = simd_variants(vs);
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof(float));
    uint16_t *ref = malloc(N * 2), *got = malloc(N * 2);
    rng r = {77};
    for (int i = 0; i < N; i++) {
        /* Half of the words near the half-precision range, where rounding is subtle. */
        uint32_t u = (uint32_t)rng_next(&r);
        if (i % 2) u = (u & 0x8fffffffu) | 0x30000000u;
        memcpy(&x[i], &u, sizeof u);
    }
    for (int t = 0; t < 2; t++) {
        const tensor_type type = t ? TENSOR_TYPE_BF16 : TENSOR_TYPE_F16;
        tensor_type_get_traits(type)->from_float(x, ref, N);
        for (int v = 0; v < nv; v++) {
            vs[v].ops->type[type].from_float(x, got, N);
            /* Find the first difference before asserting: Check's asserts are slow in a loop. */
            int i = 0;
            while (i < N && got[i] == ref[i]) i++;
            uint32_t u = 0;
            if (i < N) memcpy(&u, &x[i], sizeof u);
            ck_assert_msg(i == N, "%s %s of 0x%08x: 0x%04x, scalar 0x%04x", vs[v].name,
                          tensor_type_name(type), u, got[i < N ? i : 0], ref[i < N ? i : 0]);
        }
    }
    free(x);
    free(ref);
    free(got);
}
END_TEST

/* ---- dequantization -------------------------------------------------------------------------- */

START_TEST(test_to_float_bit_identical) {
    variant vs[8];
    const int nv = simd_variants(vs);
    int checked = 0;
    for (uint32_t t = 0; t < TENSOR_TYPE_COUNT; t++) {
        const tensor_type_traits *tt = tensor_type_get_traits(t);
        if (!tt || !tt->to_float) continue;
        for (int64_t nb = 1; nb <= 9; nb += 4) {
            const int64_t n = nb * (tt->block_size > 1 ? tt->block_size : 37);
            rng r = {t * 31 + (uint64_t)nb};
            const size_t row = tensor_row_size(t, n);
            void *src = malloc(row);
            /* Random codes with finite scales; float types get every bit pattern. */
            if (tt->is_quantized) {
                if (t == TENSOR_TYPE_Q8_1 || t == TENSOR_TYPE_Q8_K) {
                    float *x = malloc((size_t)n * sizeof(float));
                    rng_activations(&r, x, n, tt->block_size);
                    tt->from_float(x, src, n);
                    free(x);
                } else {
                    make_weights(&r, t, n, src);
                }
            } else {
                rng_bytes(&r, src, row);
            }
            uint32_t *ref = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
            tt->to_float(src, (float *)ref, n);
            for (int v = 0; v < nv; v++) {
                vs[v].ops->type[t].to_float(src, (float *)got, n);
                int64_t i = 0;
                while (i < n && got[i] == ref[i]) i++;
                ck_assert_msg(i == n, "%s to_float %s n=%lld element %lld: %08x vs %08x",
                              vs[v].name, tt->name, (long long)n, (long long)i, got[i < n ? i : 0],
                              ref[i < n ? i : 0]);
                checked++;
            }
            free(src);
            free(ref);
            free(got);
        }
    }
    printf("  %d dequantized rows bit-identical on %d SIMD variants\n", checked, nv);
}
END_TEST

/* ---- attention ------------------------------------------------------------------------------- */

START_TEST(test_attention_loops) {
    variant vs[8];
    const int nv = simd_variants(vs);
    static const int64_t lens[] = {1,  2,  3,  5,  8,  15,  16,  17,  31,  32,
                                   33, 48, 64, 80, 96, 112, 128, 160, 256, 257};
    const kernel_ops *sc = kernels_for_path(KERNEL_PATH_SCALAR);
    double worst = 0;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int64_t n = lens[li];
        for (uint64_t seed = 1; seed <= 8; seed++) {
            rng r = {seed * 1315423911u + (uint64_t)n};
            float *q = malloc((size_t)n * 4), *k = malloc((size_t)n * 4),
                  *y0 = malloc((size_t)n * 4);
            float *yr = malloc((size_t)n * 4), *yg = malloc((size_t)n * 4);
            uint16_t *kh = malloc((size_t)n * 2);
            for (int64_t i = 0; i < n; i++) {
                q[i] = rng_normal(&r);
                k[i] = rng_normal(&r) * 3;
                kh[i] = tensor_f32_to_fp16(k[i]);
                y0[i] = rng_normal(&r);
            }
            const float a = rng_uniform(&r);
            double S32 = 0, S16 = 0;
            for (int64_t i = 0; i < n; i++) {
                S32 += fabs((double)q[i] * k[i]);
                S16 += fabs((double)q[i] * tensor_fp16_to_f32(kh[i]));
            }
            const float ref32 = sc->attn_dot_f32(q, k, n), ref16 = sc->attn_dot_f16(q, kh, n);
            ck_assert(ref32 == kernels__dot_f32_scalar(q, k, n));
            for (int v = 0; v < nv; v++) {
                const float g32 = vs[v].ops->attn_dot_f32(q, k, n);
                const float g16 = vs[v].ops->attn_dot_f16(q, kh, n);
                const double d32 = fabs((double)g32 - ref32), d16 = fabs((double)g16 - ref16);
                if (d32 / S32 > worst) worst = d32 / S32;
                if (d16 / S16 > worst) worst = d16 / S16;
                ck_assert_msg(d32 <= ATTN_DOT_REL_ERR * S32, "%s attn_dot_f32 n=%lld: %.9g vs %.9g",
                              vs[v].name, (long long)n, g32, ref32);
                ck_assert_msg(d16 <= ATTN_DOT_REL_ERR * S16, "%s attn_dot_f16 n=%lld: %.9g vs %.9g",
                              vs[v].name, (long long)n, g16, ref16);
                for (int f16 = 0; f16 < 2; f16++) {
                    memcpy(yr, y0, (size_t)n * 4);
                    memcpy(yg, y0, (size_t)n * 4);
                    if (f16) {
                        sc->attn_axpy_f16(yr, a, kh, n);
                        vs[v].ops->attn_axpy_f16(yg, a, kh, n);
                    } else {
                        sc->attn_axpy_f32(yr, a, k, n);
                        vs[v].ops->attn_axpy_f32(yg, a, k, n);
                    }
                    ck_assert_msg(memcmp(yr, yg, (size_t)n * 4) == 0,
                                  "%s attn_axpy_%s n=%lld differs", vs[v].name, f16 ? "f16" : "f32",
                                  (long long)n);
                }
            }
            free(q);
            free(k);
            free(y0);
            free(yr);
            free(yg);
            free(kh);
        }
    }
    printf("  attention dots worst |d|/S %.3g\n", worst);
}
END_TEST

/* attn_heads of every variant (the scalar one too) is, bit for bit and head by head, that
 * variant's attn_dot, softmax and attn_axpy applied in turn: K and V rows strided as in the cache
 * (other heads in between), every head count a call takes. */
START_TEST(test_attention_heads_are_the_loops) {
    variant vs[8];
    int nv = simd_variants(vs);
    vs[nv++] = (variant){kernels_for_path(KERNEL_PATH_SCALAR), "scalar"};
    static const uint32_t hds[] = {1, 17, 64, 80, 128};
    static const uint32_t positions[] = {1, 2, 7, 16, 33, 70};
    int checked = 0;
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++) {
        const uint32_t hd = hds[hi];
        const size_t stride = 3 * (size_t)hd;
        for (size_t pi = 0; pi < sizeof positions / sizeof positions[0]; pi++) {
            const uint32_t n_pos = positions[pi];
            rng r = {hd * 7919u + n_pos};
            float *q = malloc(KERNEL_ATTN_MAX_HEADS * hd * sizeof(float));
            float *k = malloc(n_pos * stride * sizeof(float));
            float *vv = malloc(n_pos * stride * sizeof(float));
            uint16_t *kh = malloc(n_pos * stride * 2), *vh = malloc(n_pos * stride * 2);
            for (uint32_t i = 0; i < KERNEL_ATTN_MAX_HEADS * hd; i++) q[i] = rng_normal(&r);
            for (size_t i = 0; i < n_pos * stride; i++) {
                k[i] = rng_normal(&r) * 2;
                vv[i] = rng_normal(&r);
                kh[i] = tensor_f32_to_fp16(k[i]);
                vh[i] = tensor_f32_to_fp16(vv[i]);
            }
            float *scores = malloc(KERNEL_ATTN_MAX_HEADS * n_pos * sizeof(float));
            float *want = malloc(KERNEL_ATTN_MAX_HEADS * hd * sizeof(float));
            float *got = malloc(KERNEL_ATTN_MAX_HEADS * hd * sizeof(float));
            const float scale = 1.0f / sqrtf((float)hd);
            for (int v = 0; v < nv; v++) {
                const kernel_ops *o = vs[v].ops;
                for (int f16 = 0; f16 < 2; f16++) {
                    const void *kb = f16 ? (const void *)kh : (const void *)k;
                    const void *vb = f16 ? (const void *)vh : (const void *)vv;
                    const size_t esz = f16 ? 2 : 4;
                    for (uint32_t h = 0; h < KERNEL_ATTN_MAX_HEADS; h++) {
                        const float *qh = q + h * hd;
                        float *wh = want + h * hd;
                        for (uint32_t p = 0; p < n_pos; p++) {
                            const void *kp = (const char *)kb + p * stride * esz;
                            scores[p] =
                                (f16 ? o->attn_dot_f16(qh, kp, hd) : o->attn_dot_f32(qh, kp, hd)) *
                                scale;
                        }
                        o->softmax(scores, n_pos);
                        memset(wh, 0, hd * sizeof(float));
                        for (uint32_t p = 0; p < n_pos; p++) {
                            const void *vp = (const char *)vb + p * stride * esz;
                            if (f16)
                                o->attn_axpy_f16(wh, scores[p], vp, hd);
                            else
                                o->attn_axpy_f32(wh, scores[p], vp, hd);
                        }
                    }
                    for (uint32_t nh = 1; nh <= KERNEL_ATTN_MAX_HEADS; nh++) {
                        memset(got, 0xFF, KERNEL_ATTN_MAX_HEADS * hd * sizeof(float));
                        o->attn_heads(nh, q, kb, vb, stride, n_pos, hd, scale, f16, scores, got);
                        ck_assert_msg(memcmp(got, want, nh * hd * sizeof(float)) == 0,
                                      "%s attn_heads (%u heads) hd=%u positions=%u %s differs from "
                                      "its loops",
                                      vs[v].name, nh, hd, n_pos, f16 ? "f16" : "f32");
                        checked++;
                    }
                }
            }
            free(q);
            free(k);
            free(vv);
            free(kh);
            free(vh);
            free(scores);
            free(want);
            free(got);
        }
    }
    printf("  %d attention calls bit-identical to their loops\n", checked);
}
END_TEST

/* ---- row ops --------------------------------------------------------------------------------- */

static void check_close(const char *what, const char *variant_name, int64_t n, const float *got,
                        const float *ref, double rel, double abs_err, double *worst) {
    for (int64_t i = 0; i < n; i++) {
        if (isnan(ref[i]) || isnan(got[i])) {
            if (!(isnan(ref[i]) && isnan(got[i])))
                ck_abort_msg("%s %s n=%lld [%lld]: %g vs %g", variant_name, what, (long long)n,
                             (long long)i, got[i], ref[i]);
            continue;
        }
        if (got[i] == ref[i]) continue; /* also equal infinities */
        const double d = fabs((double)got[i] - (double)ref[i]);
        const double r = d / fmax(fabs((double)ref[i]), 1e-300);
        if (fabs(ref[i]) > 1e-30 && r > *worst) *worst = r;
        if (d > rel * fabs((double)ref[i]) + abs_err)
            ck_abort_msg("%s %s n=%lld [%lld]: %.9g vs scalar %.9g", variant_name, what,
                         (long long)n, (long long)i, got[i], ref[i]);
    }
}

/* rope of every variant is ops_rope_apply bit for bit: both pairings, rotated dimensions that do
 * and do not fill the vectors (and part of a head only), positions near and far (large angles). */
START_TEST(test_rope_is_the_scalar) {
    variant vs[8];
    const int nv = simd_variants(vs);
    static const int32_t dims[][2] = {{64, 64}, {128, 128}, {64, 32}, {80, 80},
                                      {96, 24}, {6, 6},     {34, 34}, {48, 18}};
    int checked = 0;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const int32_t hd = dims[di][0], n_rot = dims[di][1], n_heads = 5;
        for (int neox = 0; neox < 2; neox++) {
            const rope_params p = {.style = neox ? ROPE_STYLE_NEOX : ROPE_STYLE_NORM,
                                   .n_rot = n_rot,
                                   .freq_base = 10000.0f,
                                   .freq_scale = 1.0f,
                                   .attn_factor = 1.0f};
            for (int32_t pos = 0; pos < 3000; pos += 997) {
                float cs[128], x[5 * 128], want[5 * 128], got[5 * 128];
                ops_rope_cache(&p, pos, cs);
                rng r = {(uint64_t)(hd * 131 + n_rot * 7 + pos + neox)};
                for (int32_t i = 0; i < n_heads * hd; i++) x[i] = rng_normal(&r) * 3.0f;
                memcpy(want, x, sizeof x);
                ops_rope_apply(&p, want, n_heads, hd, cs);
                for (int v = 0; v < nv; v++) {
                    memcpy(got, x, sizeof x);
                    vs[v].ops->rope(&p, got, n_heads, hd, cs);
                    ck_assert_msg(memcmp(got, want, (size_t)n_heads * hd * sizeof(float)) == 0,
                                  "%s rope (%s) head_dim %d n_rot %d position %d differs",
                                  vs[v].name, neox ? "neox" : "norm", hd, n_rot, pos);
                    checked++;
                }
            }
        }
    }
    printf("  rope: %d cases bit-identical\n", checked);
}
END_TEST

START_TEST(test_row_ops) {
    variant vs[8];
    const int nv = simd_variants(vs);
    static const int64_t lens[] = {1, 3, 7, 8, 15, 16, 17, 64, 100, 288, 2048, 5633};
    double worst_norm = 0, worst_swiglu = 0, worst_geglu = 0, worst_softmax = 0;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int64_t n = lens[li];
        for (uint64_t seed = 1; seed <= 3; seed++) {
            rng r = {seed * 2654435761u + (uint64_t)n};
            float *x = malloc((size_t)n * 4), *w = malloc((size_t)n * 4),
                  *up = malloc((size_t)n * 4);
            float *ref = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
            const float mag = powf(10.0f, 3.0f * rng_uniform(&r));
            for (int64_t i = 0; i < n; i++) {
                x[i] = rng_normal(&r) * mag;
                w[i] = 1.0f + 0.3f * rng_uniform(&r);
                up[i] = rng_normal(&r);
            }
            for (int v = 0; v < nv; v++) {
                /* rms_norm, in place as well as out of place */
                ops_rms_norm(ref, x, w, n, 1e-5f);
                vs[v].ops->rms_norm(got, x, w, n, 1e-5f);
                check_close("rms_norm", vs[v].name, n, got, ref, RMS_NORM_REL_ERR, 0, &worst_norm);
                memcpy(got, x, (size_t)n * 4);
                vs[v].ops->rms_norm(got, got, w, n, 1e-5f);
                check_close("rms_norm in place", vs[v].name, n, got, ref, RMS_NORM_REL_ERR, 0,
                            &worst_norm);

                /* swiglu over a wide range of gates, with specials */
                for (int64_t i = 0; i < n; i++)
                    ref[i] = got[i] = 30.0f * rng_uniform(&r) * (i % 5 ? 1 : 4);
                if (n > 8) {
                    ref[1] = got[1] = INFINITY;
                    ref[2] = got[2] = -INFINITY;
                    ref[3] = got[3] = NAN;
                    ref[4] = got[4] = -0.0f;
                    ref[5] = got[5] = -95.0f; /* e^95 overflows: the result is -0 */
                    ref[6] = got[6] = 89.5f;
                }
                ops_swiglu(ref, up, n);
                vs[v].ops->swiglu(got, up, n);
                check_close("swiglu", vs[v].name, n, got, ref, EXP_OPS_REL_ERR, EXP_OPS_ABS_ERR,
                            &worst_swiglu);

                /* geglu (GELU-tanh) over both signs, where the cube overflows too, with specials */
                for (int64_t i = 0; i < n; i++)
                    ref[i] = got[i] = 12.0f * (rng_uniform(&r) - 0.5f) * (i % 5 ? 1 : 8);
                if (n > 8) {
                    ref[1] = got[1] = INFINITY;
                    ref[2] = got[2] = -INFINITY;
                    ref[3] = got[3] = NAN;
                    ref[4] = got[4] = -0.0f;
                    ref[5] = got[5] = -3e13f; /* the cube overflows to -inf: the result is -0 */
                    ref[6] = got[6] = 3e13f;
                }
                ops_geglu(ref, up, n);
                vs[v].ops->geglu(got, up, n);
                check_close("geglu", vs[v].name, n, got, ref, EXP_OPS_REL_ERR, EXP_OPS_ABS_ERR,
                            &worst_geglu);

                /* softmax of scores with spread, some masked (-inf) */
                for (int64_t i = 0; i < n; i++) {
                    ref[i] = got[i] = rng_normal(&r) * mag * 0.01f + (i % 11 == 3 ? -INFINITY : 0);
                }
                ops_softmax(ref, n);
                vs[v].ops->softmax(got, n);
                check_close("softmax", vs[v].name, n, got, ref, EXP_OPS_REL_ERR, EXP_OPS_ABS_ERR,
                            &worst_softmax);
            }
            free(x);
            free(w);
            free(up);
            free(ref);
            free(got);
        }
    }
    /* A row that is entirely -inf becomes zeros, and a NaN score propagates, as in the scalar. */
    for (int v = 0; v < nv; v++) {
        float a[19], b[19];
        for (int i = 0; i < 19; i++) a[i] = b[i] = -INFINITY;
        ops_softmax(a, 19);
        vs[v].ops->softmax(b, 19);
        ck_assert(memcmp(a, b, sizeof a) == 0);
        for (int i = 0; i < 19; i++) a[i] = b[i] = (float)i;
        a[4] = b[4] = NAN;
        ops_softmax(a, 19);
        vs[v].ops->softmax(b, 19);
        for (int i = 0; i < 19; i++) ck_assert_int_eq(isnan(a[i]) != 0, isnan(b[i]) != 0);
    }
    printf("  row ops worst relative: rms_norm %.3g swiglu %.3g geglu %.3g softmax %.3g\n",
           worst_norm, worst_swiglu, worst_geglu, worst_softmax);
}
END_TEST

/* ---- dispatch -------------------------------------------------------------------------------- */

#define F(name) ((cpu_features)1u << CPU_FEATURE_##name)

START_TEST(test_select_picks_best_and_named_paths) {
    kernel_path p;
    bool vnni;
    corral_error err;
    ck_assert_int_eq(kernels_select(NULL, 0, &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_SCALAR);
    ck_assert(!vnni);
#if defined(__x86_64__)
    const cpu_features avx2 = F(AVX) | F(AVX2) | F(FMA) | F(F16C);
    const cpu_features avx512 = avx2 | F(AVX512F) | F(AVX512BW) | F(AVX512VL);
    ck_assert_int_eq(kernels_select(NULL, avx2, &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_AVX2);
    ck_assert(!vnni);
    ck_assert_int_eq(kernels_select("", avx2 | F(AVX_VNNI), &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_AVX2);
    ck_assert(vnni);
    ck_assert_int_eq(kernels_select("auto", avx512 | F(AVX512VNNI), &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_AVX512);
    ck_assert(vnni);
    /* AVX-VNNI (VEX) is not AVX512-VNNI: the avx512 path has no VNNI without the latter. */
    ck_assert_int_eq(kernels_select(NULL, avx512 | F(AVX_VNNI), &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_AVX512);
    ck_assert(!vnni);
    /* Named paths, any case; a lesser path on a better CPU. */
    ck_assert_int_eq(kernels_select("AVX2", avx512 | F(AVX_VNNI), &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_AVX2);
    ck_assert(vnni);
    ck_assert_int_eq(kernels_select("scalar", avx512, &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_SCALAR);
    /* AVX-512 without BW/VL (Knights Landing) falls to avx2 under auto. */
    ck_assert_int_eq(kernels_select(NULL, avx2 | F(AVX512F), &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_AVX2);
    /* The ARM paths are not in an x86-64 build, whatever the feature bits say. */
    ck_assert_int_eq(kernels_select(NULL, F(NEON) | F(DOTPROD) | F(I8MM), &p, &vnni, &err),
                     CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_SCALAR);
#elif defined(__aarch64__)
    /* The Cortex-A53 (ARMv8.0), the Cortex-A76 of a Raspberry Pi 5 (+ dotprod, fp16), a
     * Neoverse V1 / Cortex-A710 (+ i8mm, bf16). */
    const cpu_features a53 = F(NEON), a76 = a53 | F(DOTPROD) | F(FP16),
                       v1 = a76 | F(I8MM) | F(BF16);
    ck_assert_int_eq(kernels_select(NULL, a53, &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_NEON);
    ck_assert(!vnni);
    ck_assert_int_eq(kernels_select("auto", a76, &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_DOTPROD);
    ck_assert_int_eq(kernels_select("", v1, &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_I8MM);
    ck_assert(!vnni);
    /* i8mm without the dot product (no such CPU ships, but the bits are separate): neon. */
    ck_assert_int_eq(kernels_select(NULL, a53 | F(I8MM), &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_NEON);
    /* Named paths, any case; a lesser path on a better CPU. */
    ck_assert_int_eq(kernels_select("NEON", v1, &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_NEON);
    ck_assert_int_eq(kernels_select("dotprod", v1, &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_DOTPROD);
    ck_assert_int_eq(kernels_select("scalar", v1, &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_SCALAR);
    /* The x86 paths are not in an aarch64 build. */
    ck_assert_int_eq(kernels_select(NULL, ~(cpu_features)0 & ~F(NEON), &p, &vnni, &err), CORRAL_OK);
    ck_assert_int_eq(p, KERNEL_PATH_SCALAR);
#endif
}
END_TEST

START_TEST(test_select_refuses_missing_features_and_unknown_names) {
    const cpu_features avx2 = F(AVX) | F(AVX2) | F(FMA) | F(F16C);
    kernel_path p = KERNEL_PATH_COUNT;
    bool vnni = false;
    corral_error err;
    ck_assert_int_eq(kernels_select("avx512", avx2 | F(AVX512F), &p, &vnni, &err),
                     CORRAL_UNSUPPORTED);
    ck_assert_int_eq(p, KERNEL_PATH_COUNT); /* untouched */
#if defined(__x86_64__)
    ck_assert_msg(strstr(err.message, "avx512bw avx512vl") != NULL, "%s", err.message);
    ck_assert_ptr_null(strstr(err.message, "avx512f ")); /* present features are not listed */
    ck_assert_int_eq(kernels_select("avx2", F(AVX) | F(AVX2), &p, &vnni, &err), CORRAL_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "fma f16c") != NULL, "%s", err.message);
    ck_assert_int_eq(kernels_select("i8mm", ~(cpu_features)0, &p, &vnni, &err), CORRAL_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "no i8mm kernels (not an aarch64 build)"), "%s", err.message);
#elif defined(__aarch64__)
    /* A Raspberry Pi 5 asked for i8mm: the message names what it lacks, and only that. */
    ck_assert_int_eq(kernels_select("i8mm", F(NEON) | F(DOTPROD) | F(FP16), &p, &vnni, &err),
                     CORRAL_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "CORRAL_CPU=i8mm: this CPU lacks i8mm, which the i8mm"), "%s",
                  err.message);
    ck_assert_int_eq(kernels_select("dotprod", F(NEON) | F(I8MM), &p, &vnni, &err),
                     CORRAL_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "lacks dotprod,") != NULL, "%s", err.message);
    ck_assert_int_eq(kernels_select("i8mm", F(NEON), &p, &vnni, &err), CORRAL_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "lacks dotprod i8mm,") != NULL, "%s", err.message);
    ck_assert_int_eq(kernels_select("avx2", ~(cpu_features)0, &p, &vnni, &err), CORRAL_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "no avx2 kernels (not an x86-64 build)"), "%s", err.message);
#endif
    ck_assert_ptr_nonnull(strstr(err.message, "CORRAL_CPU="));
    ck_assert_int_eq(kernels_select("avx1024", ~(cpu_features)0, &p, &vnni, &err),
                     CORRAL_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.message, "'avx1024'") && strstr(err.message, "scalar, avx2, avx512"),
                  "%s", err.message);
    ck_assert_int_eq(kernels_select(" avx2", ~(cpu_features)0, &p, &vnni, &err),
                     CORRAL_INVALID_ARGUMENT);
    ck_assert_str_eq(kernel_path_name(KERNEL_PATH_AVX512), "avx512");
    ck_assert_str_eq(kernel_path_name(KERNEL_PATH_COUNT), "unknown");
}
END_TEST

START_TEST(test_tables_match_cpu_and_are_complete) {
    const cpu_features have = cpu_detect_features();
    for (int p = 0; p < KERNEL_PATH_COUNT; p++) {
        for (int v = 0; v < 2; v++) {
            const kernel_ops *o = kernels_for_variant((kernel_path)p, v);
            const cpu_features need = kernel_path_required_features((kernel_path)p) |
                                      (v ? kernel_path_vnni_features((kernel_path)p) : 0);
            bool can = (have & need) == need && !(v && p == KERNEL_PATH_SCALAR);
            /* Each architecture builds its own paths only. */
            const bool x86_path = p == KERNEL_PATH_AVX2 || p == KERNEL_PATH_AVX512;
            const bool arm_path = p >= KERNEL_PATH_NEON && p <= KERNEL_PATH_I8MM;
            (void)x86_path;
            (void)arm_path;
#if defined(__x86_64__)
            can = can && !arm_path;
#elif defined(__aarch64__)
            can = can && !x86_path && !v;
#else
            can = can && !x86_path && !arm_path;
#endif
            ck_assert_msg((o != NULL) == can, "path %s vnni %d: table %p, CPU can %d",
                          kernel_path_name((kernel_path)p), v, (const void *)o, can);
            if (!o) continue;
            ck_assert_int_eq(o->path, p);
            ck_assert_int_eq(o->vnni, v);
            ck_assert_ptr_nonnull(o->attn_dot_f32);
            ck_assert_ptr_nonnull(o->softmax);
            /* Every type the engine computes with has all three kernels on every path. */
            for (uint32_t t = 0; t < TENSOR_TYPE_COUNT; t++) {
                if (!tensor_type_is_supported(t)) continue;
                ck_assert_ptr_nonnull(o->type[t].to_float);
                ck_assert_ptr_nonnull(o->type[t].from_float);
                ck_assert_ptr_nonnull(o->type[t].vec_dot);
            }
            if (p != KERNEL_PATH_SCALAR) printf("  variant %s available\n", o->name);
        }
    }
    /* The scalar table is the trait table's reference kernels. */
    const kernel_ops *sc = kernels_for_path(KERNEL_PATH_SCALAR);
    ck_assert_ptr_nonnull(sc);
    ck_assert(sc->type[TENSOR_TYPE_Q4_K].vec_dot ==
              tensor_type_get_traits(TENSOR_TYPE_Q4_K)->vec_dot);
    ck_assert(sc->type[TENSOR_TYPE_Q8_K].from_float ==
              tensor_type_get_traits(TENSOR_TYPE_Q8_K)->from_float);
    /* kernels_for_path picks the VNNI variant when the CPU has it. */
    const kernel_ops *a512 = kernels_for_path(KERNEL_PATH_AVX512);
    if (a512) ck_assert_int_eq(a512->vnni, cpu_has(have, CPU_FEATURE_AVX512VNNI));
    ck_assert_ptr_null(kernels_for_path(KERNEL_PATH_COUNT));
    ck_assert_ptr_null(kernels_for_variant(KERNEL_PATH_SCALAR, true));
    /* Every ARM path has its own panel kernels, and i8mm its SMMLA ones for Q4_0 and Q8_0. */
    const kernel_ops *neon = kernels_for_path(KERNEL_PATH_NEON),
                     *dotprod = kernels_for_path(KERNEL_PATH_DOTPROD),
                     *i8mm = kernels_for_path(KERNEL_PATH_I8MM);
    if (neon) ck_assert_ptr_nonnull(neon->type[TENSOR_TYPE_Q4_K].panel_dot);
    if (dotprod && neon)
        ck_assert(dotprod->type[TENSOR_TYPE_Q4_0].panel_dot !=
                  neon->type[TENSOR_TYPE_Q4_0].panel_dot);
    if (i8mm && dotprod) {
        ck_assert(i8mm->type[TENSOR_TYPE_Q4_0].panel_dot !=
                  dotprod->type[TENSOR_TYPE_Q4_0].panel_dot);
        ck_assert(i8mm->type[TENSOR_TYPE_Q8_0].panel_dot !=
                  dotprod->type[TENSOR_TYPE_Q8_0].panel_dot);
    }
}
END_TEST

/* Run `probe` in a child process with CORRAL_CPU set (kernels_get decides once per process), and
 * return what it wrote to the pipe. */
static void in_child_with_env(const char *value, void (*probe)(int fd), char *out, size_t size) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        if (value)
            setenv("CORRAL_CPU", value, 1);
        else
            unsetenv("CORRAL_CPU");
        probe(fds[1]);
        _exit(0);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t got;
    while (len + 1 < size && (got = read(fds[0], out + len, size - 1 - len)) > 0)
        len += (size_t)got;
    out[len] = '\0';
    close(fds[0]);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void probe_kernels_get(int fd) {
    corral_error err = {0};
    const kernel_ops *o = kernels_get(&err);
    const kernel_ops *again = kernels_get(NULL);
    dprintf(fd, "%s|%s|%d", o ? o->name : "NULL", o ? "" : err.message, o == again);
}

static void probe_model_load(int fd) {
    corral_error err = {0};
    model *m = model_load(test_shared_path("models/stories260K.gguf"), NULL, &err);
    dprintf(fd, "%s|%s", m ? "loaded" : "failed", m ? "" : err.message);
    model_destroy(&m);
}

START_TEST(test_env_selects_path) {
    char out[1024];
    for (int p = 0; p < KERNEL_PATH_COUNT; p++) {
        const kernel_ops *want = kernels_for_path((kernel_path)p);
        in_child_with_env(kernel_path_name((kernel_path)p), probe_kernels_get, out, sizeof out);
        if (want) {
            char expect[64];
            snprintf(expect, sizeof expect, "%s||1", want->name);
            ck_assert_str_eq(out, expect);
        } else {
            ck_assert_msg(strncmp(out, "NULL|CORRAL_CPU=", 16) == 0, "%s", out);
        }
    }
    /* Unset and "auto": the best this CPU has. */
    const kernel_ops *best = kernels_for_path(KERNEL_PATH_SCALAR);
    for (int p = KERNEL_PATH_COUNT - 1; p >= 0; p--)
        if (kernels_for_path((kernel_path)p)) {
            best = kernels_for_path((kernel_path)p);
            break;
        }
    /* Where the runner knows which path this CPU must get (scripts/test-arm64 runs the suite
     * under qemu's Cortex-A53, Cortex-A76 and "max" CPU models), the choice is that one. */
    const char *must = getenv("CORRAL_TEST_EXPECT_PATH");
    if (must && *must) ck_assert_str_eq(best->name, must);
    char expect[64];
    snprintf(expect, sizeof expect, "%s||1", best->name);
    in_child_with_env(NULL, probe_kernels_get, out, sizeof out);
    ck_assert_str_eq(out, expect);
    in_child_with_env("auto", probe_kernels_get, out, sizeof out);
    ck_assert_str_eq(out, expect);
}
END_TEST

START_TEST(test_env_bogus_value_is_refused) {
    char out[1024];
    in_child_with_env("avx9000", probe_kernels_get, out, sizeof out);
    ck_assert_msg(strstr(out, "NULL|CORRAL_CPU='avx9000' is not a kernel path") == out, "%s", out);
    /* model_load refuses too, with the same message. */
    in_child_with_env("avx9000", probe_model_load, out, sizeof out);
    ck_assert_msg(strstr(out, "failed|CORRAL_CPU='avx9000'") == out, "%s", out);
    in_child_with_env("scalar", probe_model_load, out, sizeof out);
    ck_assert_str_eq(out, "loaded|");
}
END_TEST

/* A path this CPU lacks is refused by model_load with the missing features named. Only testable
 * where some path is missing; elsewhere the simulated-CPU cases of kernels_select cover it. */
START_TEST(test_env_unavailable_path_is_refused) {
    char out[1024];
    int tested = 0;
    for (int p = 0; p < KERNEL_PATH_COUNT; p++) {
        if (kernels_for_path((kernel_path)p)) continue;
        in_child_with_env(kernel_path_name((kernel_path)p), probe_model_load, out, sizeof out);
        ck_assert_msg(strstr(out, "failed|CORRAL_CPU=") == out, "%s", out);
        tested++;
    }
    printf("  %d unavailable paths refused\n", tested);
}
END_TEST

static Suite *kernels_suite(void) {
    Suite *s = suite_create("kernels");
    TCase *core = tcase_create("core");
    tcase_set_timeout(core, 300);
    tcase_add_test(core, test_vec_dot_matches_scalar);
    tcase_add_test(core, test_panel_pack_roundtrip);
    tcase_add_test(core, test_panel_dot_matches_scalar);
    tcase_add_test(core, test_quantizers_byte_identical);
    tcase_add_test(core, test_to_float_bit_identical);
    tcase_add_test(core, test_attention_loops);
    tcase_add_test(core, test_attention_heads_are_the_loops);
    tcase_add_test(core, test_row_ops);
    tcase_add_test(core, test_rope_is_the_scalar);
    tcase_add_test(core, test_select_picks_best_and_named_paths);
    tcase_add_test(core, test_tables_match_cpu_and_are_complete);
    tcase_add_test(core, test_env_selects_path);
    suite_add_tcase(s, core);

    TCase *limits = tcase_create("limits");
    tcase_set_timeout(limits, 300);
    tcase_add_test(limits, test_half_conversions_random_bit_patterns);
    suite_add_tcase(s, limits);

    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_select_refuses_missing_features_and_unknown_names);
    tcase_add_test(errors, test_env_bogus_value_is_refused);
    tcase_add_test(errors, test_env_unavailable_path_is_refused);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(kernels_suite)
