/*
 * cpu.h — what the processor can do, detected once with cpuid (x86-64) or from the kernel's
 * hardware capability words getauxval(AT_HWCAP / AT_HWCAP2) (aarch64 Linux).
 *
 * The engine's kernel dispatch reads these flags; `corrald --version` and `corral bench` print
 * them. A feature counts as present only when the CPU reports it *and* the operating system saves
 * the register state it needs (XGETBV), so the flags are safe to act on.
 */
#ifndef CORRAL_CPU_H
#define CORRAL_CPU_H

#include <stddef.h>
#include <stdint.h>

/* X(NAME, printed name) — one bit per feature, in this order. Append only. */
#define CPU_FEATURE_TABLE(X)     \
    X(SSE3, "sse3")              \
    X(SSSE3, "ssse3")            \
    X(AVX, "avx")                \
    X(AVX2, "avx2")              \
    X(FMA, "fma")                \
    X(F16C, "f16c")              \
    X(AVX_VNNI, "avx_vnni")      \
    X(AVX512F, "avx512f")        \
    X(AVX512BW, "avx512bw")      \
    X(AVX512VL, "avx512vl")      \
    X(AVX512VNNI, "avx512_vnni") \
    X(AVX512BF16, "avx512_bf16") \
    X(NEON, "neon")              \
    X(DOTPROD, "dotprod")        \
    X(I8MM, "i8mm")              \
    X(FP16, "fp16")              \
    X(BF16, "bf16")

typedef enum cpu_feature {
#define CPU_FEATURE_ENUM_(name, text) CPU_FEATURE_##name,
    CPU_FEATURE_TABLE(CPU_FEATURE_ENUM_)
#undef CPU_FEATURE_ENUM_
        CPU_FEATURE_COUNT
} cpu_feature;

/* Bit set of cpu_feature values: bit (1u << CPU_FEATURE_X). */
typedef uint32_t cpu_features;

/* The features of the running CPU. Detected on first call, then cached; thread-safe. */
cpu_features cpu_detect_features(void);

/* 1 if `feature` is in `set`. */
static inline int cpu_has(cpu_features set, cpu_feature feature) {
    return (set >> feature) & 1u;
}

/* Write the names of the features in `set`, space-separated, into buf (always NUL-terminated;
 * "none" for the empty set). Returns the length the full string needs, like snprintf. */
size_t cpu_format_features(cpu_features set, char *buf, size_t size);

/* Number of physical cores (not hardware threads), from sysfs topology; falls back to the number
 * of online processors, and to 1. Used for the default thread count. */
int cpu_count_physical_cores(void);

#endif /* CORRAL_CPU_H */
