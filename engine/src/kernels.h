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
 *   neon     AArch64 Advanced SIMD (every ARMv8-A CPU: Raspberry Pi 3/4, Cortex-A53/A72)
 *   dotprod  neon + SDOT/UDOT (ARMv8.2 dot product: Raspberry Pi 5's Cortex-A76, Neoverse N1)
 *   i8mm     dotprod + the ARMv8.6 int8 matrix multiply (SMMLA, USDOT: Cortex-A510/A710/X2
 *            and later, Neoverse V1/N2, Apple M2+)
 *
 * The SIMD kernels live in their own translation units, each compiled with exactly the
 * instruction-set flags of the CPUs that may run it (kernels_avx2.c, kernels_avx2_vnni.c,
 * kernels_avx512.c, kernels_avx512_vnni.c, built from kernels_avx2.inc / kernels_avx512.inc), so
 * the compiler can never slip an instruction into a path whose CPU lacks it, and one binary runs
 * on any x86-64. AArch64 builds do the same with kernels_neon.c, kernels_neon_dotprod.c and
 * kernels_neon_i8mm.c (from kernels_neon.inc, kernels_arm.inc and, for i8mm's SMMLA panel
 * kernels, kernels_arm_mmla.inc; the ARM features come from getauxval, base/src/cpu.c), in the
 * same panel layout. Other architectures build the scalar path only.
 *
 * Which path runs is decided once per process, at the first kernels_get(): the best the CPU
 * supports, or the one the environment variable CORRAL_CPU names (scalar, avx2, avx512, neon,
 * dotprod, i8mm, auto).
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
 *   - F16 panel products: summed in float with FMA (the twin: in double), within a bound that
 *     grows with the row length (F16_PANEL_REL_ERR)
 *   - attention dots: float sums in another order; attention accumulation: bit-identical
 *   - rms_norm: the same double sum of squares in another order; swiglu/geglu/softmax: a vector
 *     exp within a few ulp of libm's expf
 */
#ifndef CORRAL_ENGINE_KERNELS_H
#define CORRAL_ENGINE_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "corral/cpu.h"
#include "corral/status.h"
#include "corral/tensor.h"
#include "ops.h"

typedef enum kernel_path {
    KERNEL_PATH_SCALAR = 0,
    KERNEL_PATH_AVX2 = 1,
    KERNEL_PATH_AVX512 = 2,
    KERNEL_PATH_NEON = 3,
    KERNEL_PATH_DOTPROD = 4,
    KERNEL_PATH_I8MM = 5,
    KERNEL_PATH_COUNT
} kernel_path;

/* The kernels of one tensor type; NULL where the type has none (see tensor.h for the
 * signatures and contracts, which every path keeps). from_float is the activation quantizer: the
 * SIMD paths provide fast ones for the partner types (Q8_0, Q8_1, Q8_K, F16, BF16) and keep the
 * scalar ones elsewhere. */
/* ---- panels: weight rows interleaved for the matrix-product kernels ---------------------------
 *
 * A dot product kernel that takes one weight row at a time spends most of its instructions
 * rearranging: bytes into element order, a block's scale next to the sums it scales, horizontal
 * sums at the end. The panel kernels avoid all three by turning the matrix around: a panel is
 * KERNEL_PANEL_ROWS (16) consecutive rows of a weight stored together block by block, so that one
 * 64-byte register holds the same 4 bytes of 16 rows, one 32-bit lane per row. Multiplying it by
 * a broadcast group of 4 activation bytes (vpdpbusd) advances the dot products of 16 rows at
 * once, the 16 scales of a block are one 32-byte load, and no lane ever needs summing with
 * another: lane r is row r from start to end.
 *
 * The layout. A block of the type (Q4_0: 18 bytes, Q8_0: 34, Q4_K: 144, Q6_K: 210, F16: one
 * element, 2) is cut into
 * units: its fp16 scale fields are 2-byte units, every other byte is in a 4-byte unit. The panel
 * block b holds block b of each of the 16 rows, unit by unit: the unit at byte offset o of row r
 * goes to offset 16 * o + size * r. So a field keeps its place (times 16), each field becomes a
 * small [unit][row] array, and a panel is exactly as large as the 16 rows it holds. A weight
 * matrix in panel layout is its rows 16 at a time, then the rows left over (n_out % 16) as they
 * were (the dot kernel handles those). One type is rearranged within the block first: Q6_K's
 * code bytes (ql, qh) are regrouped so that each byte holds one code in its low 6 bits and two
 * bits of a fourth code on top (kernels_panel.c): the kernel takes three codes of four with one
 * AND each.
 *
 * The arithmetic. Lane r computes exactly what the scalar vec_dot of row r computes, in the same
 * order: the same exact integer block sums, then the same float multiplies and adds, block after
 * block (the SIMD files are built with -ffp-contract=off). A panel kernel's output is therefore
 * bit-identical to the scalar reference, for any number of activation rows, any split of rows
 * among threads and any path; the tests compare them with memcmp.
 *
 * F16 panels hold one element per block (2-byte units), and their activations come as floats (the
 * F16-rounded activations, widened once per batch). They are the exception to bit-identity: lane
 * r adds w * y with one float FMA per element, in element order (one chain), where the twin
 * adds exact products in double. Double sums ran at half the width and kept prefill compute-bound
 * at 0.4x llama.cpp. The difference is a float summation error: at most (n_in + 1) * 2^-24 of
 * sum(|w * y|) (the standard bound for n_in additions and the twin's rounding to float;
 * F16_PANEL_REL_ERR in test_kernels.c).
 *
 * Codes and offsets. Weight codes enter the unsigned side of the byte product: Q4_0 as q in
 * 0..15 for the value q - 8, Q8_0 as w + 128 (VNNI) for w, Q6_K as q in 0..63 for q - 32. The
 * offset is taken off once per block through the sum of the activation codes: sum((q - 8) * y)
 * = sum(q * y) - 8 * sum(y). Q8_0 activations carry no sum, so the matrix product computes it
 * once per activation block (kernel_act_aux, with the scale as a float); Q8_K carries bsums.
 */
#define KERNEL_PANEL_ROWS 16

/* Per Q8_0 activation block: its scale as a float, and the sum of its 32 codes times the negated
 * code offsets of the weight types (Q4_0: 8, Q8_0 with VNNI: 128), ready to start a block's
 * integer sum with. */
typedef struct kernel_act_aux {
    float d;
    int32_t neg8_sum;   /* -8 * sum */
    int32_t neg128_sum; /* -128 * sum */
} kernel_act_aux;

/* The products of n_panels consecutive panels (KERNEL_PANEL_ROWS rows each, the first at
 * `panels`, the next right after it) with n_tok activation rows: out[t * out_stride + 16 p + r]
 * = W_p[r] . y[t] for panel p, r < KERNEL_PANEL_ROWS, t < n_tok. The panels are of a weight with
 * n_in elements per row; activation row t is at y + t * y_stride (bytes) in the type's
 * vec_dot_type, except for F16 weights: n_in floats, the F16 activations widened; for types whose
 * activations are Q8_0, aux + t * aux_stride holds its n_in / 32 kernel_act_aux entries
 * (kernels_act_aux), for the others aux is unused. Bit-identical with the scalar vec_dot (F16:
 * within F16_PANEL_REL_ERR), and each output the same bits whatever n_panels and n_tok (a
 * result depends on its row and token only, never on the batch around them). */
typedef void (*kernel_panel_dot_fn)(int64_t n_in, const void *restrict panels, int64_t n_panels,
                                    const void *y, size_t y_stride, const kernel_act_aux *aux,
                                    size_t aux_stride, int64_t n_tok, float *restrict out,
                                    size_t out_stride);

typedef struct kernel_type_ops {
    tensor_to_float_fn to_float;
    tensor_from_float_fn from_float;
    tensor_vec_dot_fn vec_dot;
    kernel_panel_dot_fn panel_dot; /* NULL: this path has no panel kernel for the type */
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

/* Attention of n_heads query heads (at most KERNEL_ATTN_MAX_HEADS) that share one KV head, over
 * positions [0, n_pos): for head h (q + h * hd), scores[p] = (q_h . K[p]) * scale, scores =
 * softmax(scores), out_h (out + h * hd) = sum over p of scores[p] * V[p]. K[p] and V[p] are hd
 * elements at k + p * stride and v + p * stride (elements), IEEE half when f16, else float;
 * scores is n_heads * n_pos floats of scratch. Per head exactly the path's attn_dot, softmax and
 * attn_axpy applied in that order (bit for bit), in one call with the loops inlined: heads that
 * share K and V rows read them once, and their accumulations run side by side. 8: a whole group
 * of the usual models (Llama's 32 heads over 4 or 8 KV heads); larger groups are served by
 * several calls. */
#define KERNEL_ATTN_MAX_HEADS 8
typedef void (*kernel_attn_heads_fn)(uint32_t n_heads, const float *restrict q, const void *k,
                                     const void *v, size_t stride, uint32_t n_pos, uint32_t hd,
                                     float scale, int f16, float *restrict scores,
                                     float *restrict out);

typedef struct kernel_ops {
    kernel_path path;
    bool vnni;        /* this table uses the VNNI instructions of its path */
    const char *name; /* "scalar", "avx2", "avx2+vnni", "avx512", "avx512+vnni", "neon",
                         "dotprod", "i8mm" */
    kernel_type_ops type[TENSOR_TYPE_COUNT];
    /* Attention inner loops. */
    kernel_dot_f32_fn attn_dot_f32;
    kernel_dot_f16_fn attn_dot_f16;
    kernel_axpy_f32_fn attn_axpy_f32;
    kernel_axpy_f16_fn attn_axpy_f16;
    kernel_attn_heads_fn attn_heads;
    /* Row ops, with the contracts of their scalar twins in ops.h. */
    void (*rms_norm)(float *out, const float *x, const float *weight, int64_t n, float eps);
    void (*swiglu)(float *gate, const float *up, int64_t n);
    void (*geglu)(float *gate, const float *up, int64_t n);
    void (*softmax)(float *x, int64_t n);
    /* ops_rope_apply, bit for bit (each element's two products and their sum or difference). */
    void (*rope)(const rope_params *p, float *x, int32_t n_heads, int32_t head_dim,
                 const float *cos_sin);
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

/* "scalar", "avx2", "avx512", "neon", "dotprod", "i8mm"; "unknown" for other values. */
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

/* ---- panels (kernels_panel.c, portable) ------------------------------------------------------ */

/* 1 when the panel layout is defined for the type (Q4_0, Q8_0, Q4_K, Q6_K, F16). */
int kernels_panel_layout_known(tensor_type type);

/* Rearrange a weight of n_out rows of n_in elements (rows contiguous, as in a GGUF file) into the
 * panel layout: full panels first, then the n_out % KERNEL_PANEL_ROWS rows left over, unchanged.
 * dst has the same size as src (n_out * tensor_row_size) and must not overlap it. Panels
 * [p0, p1) only, so that callers can spread the work or stream it; the leftover rows are copied
 * by the call whose range ends at the last panel. The type's layout must be known. */
void kernels_panel_pack(tensor_type type, const void *src, int64_t n_in, int64_t n_out, int64_t p0,
                        int64_t p1, void *dst);

/* Row `row` of a weight in panel layout, in the file's row layout, into dst (tensor_row_size
 * bytes): the inverse of kernels_panel_pack for one row. */
void kernels_panel_get_row(tensor_type type, const void *packed, int64_t n_in, int64_t n_out,
                           int64_t row, void *dst);

/* The kernel_act_aux entries of one Q8_0 activation row of n elements (n / 32 entries). */
void kernels_act_aux(const void *y_q8_0, int64_t n, kernel_act_aux *aux);

/* ---- scalar twins of the attention loops (kernels.c); the scalar table uses them ---------- */

float kernels__dot_f32_scalar(const float *restrict a, const float *restrict b, int64_t n);
float kernels__dot_f16_scalar(const float *restrict a, const uint16_t *restrict b, int64_t n);
void kernels__axpy_f32_scalar(float *restrict y, float a, const float *restrict x, int64_t n);
void kernels__axpy_f16_scalar(float *restrict y, float a, const uint16_t *restrict x, int64_t n);
void kernels__attn_heads_scalar(uint32_t n_heads, const float *restrict q, const void *k,
                                const void *v, size_t stride, uint32_t n_pos, uint32_t hd,
                                float scale, int f16, float *restrict scores, float *restrict out);

/* ---- SIMD tables (x86-64 builds only) ------------------------------------------------------- */

/* Fill *ops with one SIMD path's kernels; entries a path does not implement are left as they
 * were (the caller starts from the scalar table). Each lives in its own translation unit. */
void kernels__fill_avx2(kernel_ops *ops);
void kernels__fill_avx2_vnni(kernel_ops *ops);
void kernels__fill_avx512(kernel_ops *ops);
void kernels__fill_avx512_vnni(kernel_ops *ops);

/* ---- SIMD tables (aarch64 builds only) ------------------------------------------------------- */

void kernels__fill_neon(kernel_ops *ops);
void kernels__fill_neon_dotprod(kernel_ops *ops);
void kernels__fill_neon_i8mm(kernel_ops *ops);

#endif /* CORRAL_ENGINE_KERNELS_H */
