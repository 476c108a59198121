/*
 * kernels.c — the kernel tables of every path, the choice among them, and the scalar twins of
 * the attention loops.
 *
 * Every table starts as a copy of the scalar one (the reference kernels of the tensor trait table
 * and ops.c); a SIMD path then overwrites the entries it implements. So a kernel a path has not
 * (yet) specialised is still there, the scalar one, and the tables are always complete.
 *
 * The tables are plain data built once (pthread_once) on first use; the path choice is made once
 * too, so that CORRAL_CPU is read at one moment and every model in the process computes the same
 * way.
 */
#include "kernels.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "corral/log.h"
#include "ops.h"

/* The attention twins must not fuse y + a * x (the SIMD kernels match them bit for bit); GCC
 * never contracts in ISO C mode, Clang needs telling. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* Variants: scalar, then each x86 SIMD path without and with VNNI, then the ARM paths (one
 * variant each: what distinguishes them is the path itself). */
enum {
    VARIANT_SCALAR,
    VARIANT_AVX2,
    VARIANT_AVX2_VNNI,
    VARIANT_AVX512,
    VARIANT_AVX512_VNNI,
    VARIANT_NEON,
    VARIANT_DOTPROD,
    VARIANT_I8MM,
    VARIANT_COUNT
};

static kernel_ops kernel_tables[VARIANT_COUNT];
static pthread_once_t kernel_tables_once = PTHREAD_ONCE_INIT;

static const char *const kernel_path_names[KERNEL_PATH_COUNT] = {
    [KERNEL_PATH_SCALAR] = "scalar",   [KERNEL_PATH_AVX2] = "avx2",
    [KERNEL_PATH_AVX512] = "avx512",   [KERNEL_PATH_NEON] = "neon",
    [KERNEL_PATH_DOTPROD] = "dotprod", [KERNEL_PATH_I8MM] = "i8mm",
};

#define FEATURE(name) ((cpu_features)1u << CPU_FEATURE_##name)

/* ---- scalar twins of the attention loops ----------------------------------------------------- */

/* A plain left-to-right float sum: the loop the forward pass ran before there were paths. */
float kernels__dot_f32_scalar(const float *restrict a, const float *restrict b, int64_t n) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

float kernels__dot_f16_scalar(const float *restrict a, const uint16_t *restrict b, int64_t n) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += a[i] * tensor_fp16_to_f32(b[i]);
    return sum;
}

void kernels__axpy_f32_scalar(float *restrict y, float a, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void kernels__axpy_f16_scalar(float *restrict y, float a, const uint16_t *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * tensor_fp16_to_f32(x[i]);
}

/* The attention of each head from the loops above (the SIMD paths do the same with theirs). */
void kernels__attn_heads_scalar(uint32_t n_heads, const float *restrict q, const void *k,
                                const void *v, size_t stride, uint32_t n_pos, uint32_t hd,
                                float scale, int f16, float *restrict scores, float *restrict out) {
    const size_t step = stride * (f16 ? sizeof(uint16_t) : sizeof(float));
    for (uint32_t h = 0; h < n_heads; h++) {
        const float *qh = q + (size_t)h * hd;
        float *sh = scores + (size_t)h * n_pos, *oh = out + (size_t)h * hd;
        for (uint32_t p = 0; p < n_pos; p++) {
            const void *kp = (const char *)k + p * step;
            sh[p] =
                (f16 ? kernels__dot_f16_scalar(qh, kp, hd) : kernels__dot_f32_scalar(qh, kp, hd)) *
                scale;
        }
        ops_softmax(sh, n_pos);
        memset(oh, 0, hd * sizeof(float));
        for (uint32_t p = 0; p < n_pos; p++) {
            const void *vp = (const char *)v + p * step;
            if (f16)
                kernels__axpy_f16_scalar(oh, sh[p], vp, hd);
            else
                kernels__axpy_f32_scalar(oh, sh[p], vp, hd);
        }
    }
}

/* ---- tables ---------------------------------------------------------------------------------- */

static void kernel_fill_scalar(kernel_ops *o) {
    *o = (kernel_ops){.path = KERNEL_PATH_SCALAR, .name = "scalar"};
    for (uint32_t t = 0; t < TENSOR_TYPE_COUNT; t++) {
        const tensor_type_traits *tt = tensor_type_get_traits(t);
        if (!tt) continue;
        o->type[t] = (kernel_type_ops){
            .to_float = tt->to_float, .from_float = tt->from_float, .vec_dot = tt->vec_dot};
    }
    o->attn_dot_f32 = kernels__dot_f32_scalar;
    o->attn_dot_f16 = kernels__dot_f16_scalar;
    o->attn_axpy_f32 = kernels__axpy_f32_scalar;
    o->attn_axpy_f16 = kernels__axpy_f16_scalar;
    o->attn_heads = kernels__attn_heads_scalar;
    o->rms_norm = ops_rms_norm;
    o->swiglu = ops_swiglu;
    o->geglu = ops_geglu;
    o->softmax = ops_softmax;
    o->rope = ops_rope_apply;
}

/* The SIMD variants this build has, each with the function that fills in its kernels. */
static const struct {
    int variant;
    kernel_path path;
    bool vnni;
    const char *name;
    void (*fill)(kernel_ops *);
} kernel_simd[] = {
#if defined(__x86_64__)
    {VARIANT_AVX2, KERNEL_PATH_AVX2, false, "avx2", kernels__fill_avx2},
    {VARIANT_AVX2_VNNI, KERNEL_PATH_AVX2, true, "avx2+vnni", kernels__fill_avx2_vnni},
    {VARIANT_AVX512, KERNEL_PATH_AVX512, false, "avx512", kernels__fill_avx512},
    {VARIANT_AVX512_VNNI, KERNEL_PATH_AVX512, true, "avx512+vnni", kernels__fill_avx512_vnni},
#elif defined(__aarch64__)
    {VARIANT_NEON, KERNEL_PATH_NEON, false, "neon", kernels__fill_neon},
    {VARIANT_DOTPROD, KERNEL_PATH_DOTPROD, false, "dotprod", kernels__fill_neon_dotprod},
    {VARIANT_I8MM, KERNEL_PATH_I8MM, false, "i8mm", kernels__fill_neon_i8mm},
#endif
    {VARIANT_SCALAR, KERNEL_PATH_SCALAR, false, "scalar", NULL}, /* end; never filled twice */
};
enum { KERNEL_SIMD_COUNT = sizeof kernel_simd / sizeof kernel_simd[0] - 1 };

static void kernel_tables_build(void) {
    kernel_fill_scalar(&kernel_tables[VARIANT_SCALAR]);
    for (size_t i = 0; i < KERNEL_SIMD_COUNT; i++) {
        kernel_ops *o = &kernel_tables[kernel_simd[i].variant];
        *o = kernel_tables[VARIANT_SCALAR];
        o->path = kernel_simd[i].path;
        o->vnni = kernel_simd[i].vnni;
        o->name = kernel_simd[i].name;
        kernel_simd[i].fill(o);
    }
}

/* Whether this build has kernels for a path at all. */
static bool kernel_path_built(kernel_path path) {
    if (path == KERNEL_PATH_SCALAR) return true;
    for (size_t i = 0; i < KERNEL_SIMD_COUNT; i++)
        if (kernel_simd[i].path == path) return true;
    return false;
}

/* The architecture whose build has a path's kernels, for the message when this one has not. */
static const char *kernel_path_arch(kernel_path path) {
    return path == KERNEL_PATH_AVX2 || path == KERNEL_PATH_AVX512 ? "x86-64" : "aarch64";
}

static int kernel_variant_index(kernel_path path, bool vnni) {
    switch (path) {
        case KERNEL_PATH_SCALAR:
            return vnni ? -1 : VARIANT_SCALAR;
        case KERNEL_PATH_AVX2:
            return vnni ? VARIANT_AVX2_VNNI : VARIANT_AVX2;
        case KERNEL_PATH_AVX512:
            return vnni ? VARIANT_AVX512_VNNI : VARIANT_AVX512;
        case KERNEL_PATH_NEON:
            return vnni ? -1 : VARIANT_NEON;
        case KERNEL_PATH_DOTPROD:
            return vnni ? -1 : VARIANT_DOTPROD;
        case KERNEL_PATH_I8MM:
            return vnni ? -1 : VARIANT_I8MM;
        default:
            return -1;
    }
}

cpu_features kernel_path_required_features(kernel_path path) {
    switch (path) {
        case KERNEL_PATH_AVX2:
            return FEATURE(AVX) | FEATURE(AVX2) | FEATURE(FMA) | FEATURE(F16C);
        case KERNEL_PATH_AVX512:
            /* The AVX-512 tables keep some 256-bit AVX2 kernels, so they need AVX2 as well
             * (every AVX-512 CPU has it). */
            return kernel_path_required_features(KERNEL_PATH_AVX2) | FEATURE(AVX512F) |
                   FEATURE(AVX512BW) | FEATURE(AVX512VL);
        case KERNEL_PATH_NEON:
            return FEATURE(NEON);
        case KERNEL_PATH_DOTPROD:
            return FEATURE(NEON) | FEATURE(DOTPROD);
        case KERNEL_PATH_I8MM:
            /* The i8mm tables keep the dotprod kernels where a matrix multiply does not help. */
            return FEATURE(NEON) | FEATURE(DOTPROD) | FEATURE(I8MM);
        default:
            return 0;
    }
}

cpu_features kernel_path_vnni_features(kernel_path path) {
    switch (path) {
        case KERNEL_PATH_AVX2:
            return FEATURE(AVX_VNNI);
        case KERNEL_PATH_AVX512:
            return FEATURE(AVX512VNNI);
        default:
            return 0;
    }
}

const char *kernel_path_name(kernel_path path) {
    return path >= 0 && path < KERNEL_PATH_COUNT ? kernel_path_names[path] : "unknown";
}

static bool kernel_path_runs(kernel_path path, cpu_features have) {
    const cpu_features need = kernel_path_required_features(path);
    return kernel_path_built(path) && (have & need) == need;
}

static bool kernel_vnni_runs(kernel_path path, cpu_features have) {
    const cpu_features need = kernel_path_vnni_features(path);
    return need != 0 && (have & need) == need;
}

corral_status kernels_select(const char *request, cpu_features have, kernel_path *path, bool *vnni,
                             corral_error *err) {
    if (!request || !*request || strcasecmp(request, "auto") == 0) {
        kernel_path best = KERNEL_PATH_SCALAR;
        for (int p = KERNEL_PATH_COUNT - 1; p > KERNEL_PATH_SCALAR; p--) {
            if (kernel_path_runs((kernel_path)p, have)) {
                best = (kernel_path)p;
                break;
            }
        }
        *path = best;
        *vnni = kernel_vnni_runs(best, have);
        return CORRAL_OK;
    }
    int found = -1;
    for (int p = 0; p < KERNEL_PATH_COUNT; p++)
        if (strcasecmp(request, kernel_path_names[p]) == 0) found = p;
    if (found < 0)
        return corral_error_set(
            err, CORRAL_INVALID_ARGUMENT,
            "CORRAL_CPU='%.64s' is not a kernel path (use scalar, avx2, avx512, "
            "neon, dotprod, i8mm or auto)",
            request);
    const kernel_path p = (kernel_path)found;
    if (!kernel_path_built(p))
        return corral_error_set(err, CORRAL_UNSUPPORTED,
                                "CORRAL_CPU=%s: this build has no %s kernels (not an %s build)",
                                kernel_path_name(p), kernel_path_name(p), kernel_path_arch(p));
    const cpu_features missing = kernel_path_required_features(p) & ~have;
    if (missing) {
        char names[256];
        cpu_format_features(missing, names, sizeof names);
        return corral_error_set(err, CORRAL_UNSUPPORTED,
                                "CORRAL_CPU=%s: this CPU lacks %s, which the %s kernels need",
                                kernel_path_name(p), names, kernel_path_name(p));
    }
    *path = p;
    *vnni = kernel_vnni_runs(p, have);
    return CORRAL_OK;
}

const kernel_ops *kernels_for_variant(kernel_path path, bool vnni) {
    const int v = kernel_variant_index(path, vnni);
    if (v < 0) return NULL;
    const cpu_features have = cpu_detect_features();
    if (!kernel_path_runs(path, have) || (vnni && !kernel_vnni_runs(path, have))) return NULL;
    pthread_once(&kernel_tables_once, kernel_tables_build);
    return &kernel_tables[v];
}

const kernel_ops *kernels_for_path(kernel_path path) {
    if (path < 0 || path >= KERNEL_PATH_COUNT) return NULL;
    return kernels_for_variant(path, kernel_vnni_runs(path, cpu_detect_features()));
}

/* ---- the process-wide choice ----------------------------------------------------------------- */

static pthread_once_t kernel_choice_once = PTHREAD_ONCE_INIT;
static const kernel_ops *kernel_choice;
static corral_error kernel_choice_error;

static void kernel_choose(void) {
    const char *request = getenv("CORRAL_CPU");
    kernel_path path;
    bool vnni;
    if (kernels_select(request, cpu_detect_features(), &path, &vnni, &kernel_choice_error) !=
        CORRAL_OK) {
        log_debug("no kernels", LOG_STR("reason", kernel_choice_error.message));
        return;
    }
    kernel_choice = kernels_for_variant(path, vnni);
    log_debug("kernels chosen", LOG_STR("path", kernel_choice->name),
              LOG_STR("CORRAL_CPU", request ? request : ""));
}

const kernel_ops *kernels_get(corral_error *err) {
    pthread_once(&kernel_choice_once, kernel_choose);
    if (!kernel_choice && err) *err = kernel_choice_error;
    return kernel_choice;
}
