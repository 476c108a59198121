/*
 * cpu.c — feature detection with cpuid/xgetbv on x86-64, with getauxval on aarch64 Linux, and
 * core counting from sysfs.
 */
#include "corral/cpu.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t cpu_read_xcr0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

static cpu_features cpu_detect_uncached(void) {
    cpu_features f = 0;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    if (c & bit_SSE3) f |= 1u << CPU_FEATURE_SSE3;
    if (c & bit_SSSE3) f |= 1u << CPU_FEATURE_SSSE3;

    /* AVX state must be enabled by the OS (XCR0 bits 1 and 2), AVX-512 state too (bits 5-7). */
    int os_avx = 0, os_avx512 = 0;
    if ((c & bit_OSXSAVE) && (c & bit_AVX)) {
        uint64_t xcr0 = cpu_read_xcr0();
        os_avx = (xcr0 & 0x6) == 0x6;
        os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
    }
    if (!os_avx) return f;
    f |= 1u << CPU_FEATURE_AVX;
    if (c & bit_FMA) f |= 1u << CPU_FEATURE_FMA;
    if (c & bit_F16C) f |= 1u << CPU_FEATURE_F16C;

    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 7) return f;
    __cpuid_count(7, 0, a, b, c, d);
    if (b & bit_AVX2) f |= 1u << CPU_FEATURE_AVX2;
    if (os_avx512) {
        if (b & bit_AVX512F) f |= 1u << CPU_FEATURE_AVX512F;
        if (b & bit_AVX512BW) f |= 1u << CPU_FEATURE_AVX512BW;
        if (b & bit_AVX512VL) f |= 1u << CPU_FEATURE_AVX512VL;
        if (c & bit_AVX512VNNI) f |= 1u << CPU_FEATURE_AVX512VNNI;
    }
    unsigned sub_leaves = a;
    if (sub_leaves >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        if (a & (1u << 4)) f |= 1u << CPU_FEATURE_AVX_VNNI; /* CPUID.(7,1):EAX[4] */
        if (os_avx512 && (a & (1u << 5))) f |= 1u << CPU_FEATURE_AVX512BF16;
    }
    return f;
}
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>

/* The kernel's capability bits (arch/arm64/include/uapi/asm/hwcap.h), spelled out so that older
 * C libraries' headers are not needed. */
enum {
    ARM_HWCAP_ASIMD = 1 << 1,    /* Advanced SIMD (NEON) */
    ARM_HWCAP_ASIMDHP = 1 << 10, /* half-precision arithmetic in Advanced SIMD */
    ARM_HWCAP_ASIMDDP = 1 << 20, /* SDOT / UDOT (ARMv8.2 dot product) */
    ARM_HWCAP2_I8MM = 1 << 13,   /* SMMLA / UMMLA / USMMLA / USDOT (ARMv8.6 int8 matrix mul) */
    ARM_HWCAP2_BF16 = 1 << 14,   /* BFDOT / BFMMLA / BFCVT */
};

static cpu_features cpu_detect_uncached(void) {
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    /* Advanced SIMD is mandatory on AArch64 Linux; trust the bit anyway when it is there. */
    cpu_features f = 1u << CPU_FEATURE_NEON;
    if (hw && !(hw & ARM_HWCAP_ASIMD)) f = 0;
    if (hw & ARM_HWCAP_ASIMDDP) f |= 1u << CPU_FEATURE_DOTPROD;
    if (hw & ARM_HWCAP_ASIMDHP) f |= 1u << CPU_FEATURE_FP16;
    if (hw2 & ARM_HWCAP2_I8MM) f |= 1u << CPU_FEATURE_I8MM;
    if (hw2 & ARM_HWCAP2_BF16) f |= 1u << CPU_FEATURE_BF16;
    return f;
}
#elif defined(__aarch64__)
static cpu_features cpu_detect_uncached(void) {
    return 1u << CPU_FEATURE_NEON; /* Advanced SIMD is mandatory on AArch64. */
}
#else
static cpu_features cpu_detect_uncached(void) {
    return 0;
}
#endif

cpu_features cpu_detect_features(void) {
    /* Detection is idempotent, so a race between two first callers is harmless. */
    static atomic_uint cached;
    static atomic_int done;
    if (!atomic_load(&done)) {
        atomic_store(&cached, cpu_detect_uncached());
        atomic_store(&done, 1);
    }
    return atomic_load(&cached);
}

size_t cpu_format_features(cpu_features set, char *buf, size_t size) {
    static const char *const names[CPU_FEATURE_COUNT] = {
#define CPU_FEATURE_NAME_(name, text) [CPU_FEATURE_##name] = text,
        CPU_FEATURE_TABLE(CPU_FEATURE_NAME_)
#undef CPU_FEATURE_NAME_
    };
    char all[256] = "";
    size_t len = 0;
    for (int i = 0; i < CPU_FEATURE_COUNT; i++) {
        if (!cpu_has(set, (cpu_feature)i)) continue;
        len += (size_t)snprintf(all + len, sizeof all - len, "%s%s", len ? " " : "", names[i]);
    }
    if (len == 0) len = (size_t)snprintf(all, sizeof all, "none");
    if (size > 0) snprintf(buf, size, "%s", all);
    return len;
}

int cpu_count_physical_cores(void) {
    /* Count distinct (package, core) pairs among online CPUs. */
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1) return 1;
    enum { MAX_CPUS = 1024 };
    int seen_pkg[MAX_CPUS], seen_core[MAX_CPUS];
    int n_unique = 0;
    for (long cpu = 0; cpu < online && cpu < MAX_CPUS; cpu++) {
        char path[128];
        int pkg = -1, core = -1;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/topology/physical_package_id",
                 cpu);
        FILE *fp = fopen(path, "r");
        if (!fp) return (int)online;
        if (fscanf(fp, "%d", &pkg) != 1) pkg = -1;
        fclose(fp);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%ld/topology/core_id", cpu);
        fp = fopen(path, "r");
        if (!fp) return (int)online;
        if (fscanf(fp, "%d", &core) != 1) core = -1;
        fclose(fp);
        int dup = 0;
        for (int i = 0; i < n_unique; i++) dup |= seen_pkg[i] == pkg && seen_core[i] == core;
        if (!dup) {
            seen_pkg[n_unique] = pkg;
            seen_core[n_unique] = core;
            n_unique++;
        }
    }
    return n_unique > 0 ? n_unique : (int)online;
}
