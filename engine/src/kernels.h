/*
 * kernels.h — runtime CPU dispatch of the engine's compute kernels (private to the engine).
 *
 * The forward pass spends its time in a handful of loops: the dot product of a weight row with
 * quantized activations (one kernel per weight type), the quantization of activations to each
 * weight type's partner type, the attention inner loops over the KV cache, and a few row ops.
 * A kernel_ops table holds one implementation of each for one instruction set ("path"):
 *
 *   scalar   the portable reference kernels (tensor_quant.c, ops.c, and the attention loops in
 *            kernels.c); every other path is tested against these
 *   avx2     AVX2 + FMA + F16C (Haswell and later); AVX-VNNI (vpdpbusd/vpdpwssd, VEX) when the
 *            CPU has it
 *   avx512   AVX-512 F + BW + VL (Skylake-X and later); AVX512-VNNI when present
 *
 * The SIMD kernels live in their own translation units, each compiled with exactly the
 * instruction-set flags of the CPUs that may run it (kernels_avx2.c, kernels_avx2_vnni.c,
 * kernels_avx512.c, kernels_avx512_vnni.c, built from kernels_avx2.inc / kernels_avx512.inc), so
 * the compiler can never slip an instruction into a path whose CPU lacks it, and one binary runs
 * on any x86-64. Other architectures build the scalar path only; the table leaves room for NEON.
 *
 * Which path runs is decided once per process, at the first kernels_get(): the best the CPU
 * supports, or the one the environment variable CORRAL_CPU names (scalar, avx2, avx512, auto).
 * Naming a path this CPU cannot run, or a name that is no path, is an error, never a silent
 * fallback: model_load fails with the message (naming the missing CPU features).
 *
 * Numerical contract of each SIMD kernel against its scalar twin (the budgets are named
 * constants in tests/unit/test_kernels.c, which explains them):
 *   - activation quantizers (Q8_0, Q8_1, Q8_K, F16, BF16): byte-identical output (Q8_0/Q8_1
 *     only up to signalling NaNs, which arithmetic never produces; see test_kernels.c)
 *   - to_float: bit-identical
 *   - quantized dot products: the integer block sums are exact; only the float accumulation of
 *     the scaled block sums is ordered differently (float rounding of the final sum)
 *   - F32/F16/BF16 dot products: the same float products, summed in double in another order
 *   - attention dots: float sums in another order; attention accumulation: bit-identical
 *   - rms_norm: the same double sum of squares in another order; swiglu/softmax: a vector exp
 *     within a few ulp of libm's expf
 */
#ifndef CORRAL_ENGINE_KERNELS_H
#define CORRAL_ENGINE_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "corral/cpu.h"
#include "corral/status.h"
#include "corral/tensor.h"

typedef enum kernel_path {
    KERNEL_PATH_SCALAR = 0,
    KERNEL_PATH_AVX2 = 1,
    KERNEL_PATH_AVX512 = 2,
    KERNEL_PATH_COUNT
} kernel_path;

/* The kernels of one tensor type; NULL where the type has none (see tensor.h for the
 * signatures and contracts, which every path keeps). from_float is the activation quantizer: the
 * SIMD paths provide fast ones for the partner types (Q8_0, Q8_1, Q8_K, F16, BF16) and keep the
 * scalar ones elsewhere. */
typedef struct kernel_type_ops {
    tensor_to_float_fn to_float;
    tensor_from_float_fn from_float;
    tensor_vec_dot_fn vec_dot;
} kernel_type_ops;

/* sum of a[i] * b[i] for i < n (float accumulation): a query head against a key row. */
typedef float (*kernel_dot_f32_fn)(const float *restrict a, const float *restrict b, int64_t n);
/* The same against a key row stored as IEEE half. */
typedef float (*kernel_dot_f16_fn)(const float *restrict a, const uint16_t *restrict b, int64_t n);
/* y[i] += a * x[i] for i < n (product rounded, then added: never fused): a weighted value row
 * accumulated into an attention output head. */
typedef void (*kernel_axpy_f32_fn)(float *restrict y, float a, const float *restrict x, int64_t n);
/* The same with the value row stored as IEEE half. */
typedef void (*kernel_axpy_f16_fn)(float *restrict y, float a, const uint16_t *restrict x,
                                   int64_t n);

typedef struct kernel_ops {
    kernel_path path;
    bool vnni;        /* this table uses the VNNI instructions of its path */
    const char *name; /* "scalar", "avx2", "avx2+vnni", "avx512", "avx512+vnni" */
    kernel_type_ops type[TENSOR_TYPE_COUNT];
    /* Attention inner loops. */
    kernel_dot_f32_fn attn_dot_f32;
    kernel_dot_f16_fn attn_dot_f16;
    kernel_axpy_f32_fn attn_axpy_f32;
    kernel_axpy_f16_fn attn_axpy_f16;
    /* Row ops, with the contracts of their scalar twins in ops.h. */
    void (*rms_norm)(float *out, const float *x, const float *weight, int64_t n, float eps);
    void (*swiglu)(float *gate, const float *up, int64_t n);
    void (*softmax)(float *x, int64_t n);
} kernel_ops;

/* The kernel table this process uses: chosen at the first call from the CPU's features and the
 * environment variable CORRAL_CPU (unset, "" or "auto": the best path; "scalar", "avx2",
 * "avx512": that path, which must be available), then fixed for the life of the process.
 * Returns the table (static: never freed), or NULL with *err filled (err may be NULL) when
 * CORRAL_CPU names an unknown path (CORRAL_INVALID_ARGUMENT) or one this CPU or build cannot run
 * (CORRAL_UNSUPPORTED, naming the missing CPU features); every later call reports the same.
 * Thread-safe. */
const kernel_ops *kernels_get(corral_error *err);

/* The table of a path with its best variant for this CPU (VNNI when present), or NULL when the
 * CPU or this build cannot run that path. For tests and benchmarks; thread-safe. */
const kernel_ops *kernels_for_path(kernel_path path);

/* The table of a path with VNNI forced on or off, or NULL when the CPU or build cannot run that
 * variant (the scalar path has no VNNI variant). Lets tests cover the non-VNNI kernels on a CPU
 * that has VNNI. Thread-safe. */
const kernel_ops *kernels_for_variant(kernel_path path, bool vnni);

/* "scalar", "avx2", "avx512"; "unknown" for other values. */
const char *kernel_path_name(kernel_path path);

/* The CPU features a path needs (cpu_has bits), and the one that adds its VNNI variant
 * (0 for scalar). */
cpu_features kernel_path_required_features(kernel_path path);
cpu_features kernel_path_vnni_features(kernel_path path);

/* The decision kernels_get makes, without caching or reading the environment: `request` is the
 * value of CORRAL_CPU (NULL when unset), `have` the CPU's features. Sets *path and *vnni and
 * returns CORRAL_OK, or returns CORRAL_INVALID_ARGUMENT (unknown name) / CORRAL_UNSUPPORTED
 * (path not available: the message names the missing features) with *err filled. Pure. */
corral_status kernels_select(const char *request, cpu_features have, kernel_path *path, bool *vnni,
                             corral_error *err);

/* ---- scalar twins of the attention loops (kernels.c); the scalar table uses them ---------- */

float kernels__dot_f32_scalar(const float *restrict a, const float *restrict b, int64_t n);
float kernels__dot_f16_scalar(const float *restrict a, const uint16_t *restrict b, int64_t n);
void kernels__axpy_f32_scalar(float *restrict y, float a, const float *restrict x, int64_t n);
void kernels__axpy_f16_scalar(float *restrict y, float a, const uint16_t *restrict x, int64_t n);

/* ---- SIMD tables (x86-64 builds only) -------------------------------------------------------- */

/* Fill *ops with one SIMD path's kernels; entries a path does not implement are left as they
 * were (the caller starts from the scalar table). Each lives in its own translation unit. */
void kernels__fill_avx2(kernel_ops *ops);
void kernels__fill_avx2_vnni(kernel_ops *ops);
void kernels__fill_avx512(kernel_ops *ops);
void kernels__fill_avx512_vnni(kernel_ops *ops);

#endif /* CORRAL_ENGINE_KERNELS_H */
