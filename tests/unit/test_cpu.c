/*
 * test_cpu.c — Check suite for CPU feature detection: implied features are consistent, names
 * format as documented, the core count is sane.
 */
#include <check.h>
#include <string.h>

#include "corral/cpu.h"
#include "testutil.h"

START_TEST(test_implications_hold) {
    cpu_features f = cpu_detect_features();
    if (cpu_has(f, CPU_FEATURE_AVX2)) ck_assert(cpu_has(f, CPU_FEATURE_AVX));
    if (cpu_has(f, CPU_FEATURE_AVX512BW)) ck_assert(cpu_has(f, CPU_FEATURE_AVX512F));
    if (cpu_has(f, CPU_FEATURE_AVX512F)) ck_assert(cpu_has(f, CPU_FEATURE_AVX));
    ck_assert_uint_eq(cpu_detect_features(), f); /* cached and stable */
#if defined(__x86_64__)
    ck_assert(cpu_has(f, CPU_FEATURE_SSE3)); /* every x86-64 CPU of the last 15 years */
    ck_assert(!cpu_has(f, CPU_FEATURE_NEON));
    ck_assert(!cpu_has(f, CPU_FEATURE_DOTPROD));
    ck_assert(!cpu_has(f, CPU_FEATURE_I8MM));
#elif defined(__aarch64__)
    /* From AT_HWCAP: Advanced SIMD always; the ARM extensions never on their own. */
    ck_assert(cpu_has(f, CPU_FEATURE_NEON));
    ck_assert(!cpu_has(f, CPU_FEATURE_AVX2));
    if (cpu_has(f, CPU_FEATURE_DOTPROD) || cpu_has(f, CPU_FEATURE_I8MM) ||
        cpu_has(f, CPU_FEATURE_FP16))
        ck_assert(cpu_has(f, CPU_FEATURE_NEON));
#endif
}
END_TEST

START_TEST(test_format_names) {
    char buf[256];
    cpu_features set = (1u << CPU_FEATURE_AVX2) | (1u << CPU_FEATURE_FMA);
    size_t len = cpu_format_features(set, buf, sizeof buf);
    ck_assert_str_eq(buf, "avx2 fma");
    ck_assert_uint_eq(len, strlen("avx2 fma"));
    set = (1u << CPU_FEATURE_NEON) | (1u << CPU_FEATURE_DOTPROD) | (1u << CPU_FEATURE_I8MM);
    cpu_format_features(set, buf, sizeof buf);
    ck_assert_str_eq(buf, "neon dotprod i8mm");
}
END_TEST

START_TEST(test_core_count) {
    int cores = cpu_count_physical_cores();
    ck_assert_int_ge(cores, 1);
    ck_assert_int_le(cores, 4096);
}
END_TEST

START_TEST(test_format_limits) {
    char buf[5];
    cpu_features all = (1u << CPU_FEATURE_COUNT) - 1;
    size_t needed = cpu_format_features(all, buf, sizeof buf);
    ck_assert_uint_gt(needed, sizeof buf);
    ck_assert_uint_eq(strlen(buf), sizeof buf - 1); /* truncated, terminated */
    cpu_format_features(0, buf, sizeof buf);
    ck_assert_str_eq(buf, "none");
}
END_TEST

static Suite *cpu_suite(void) {
    Suite *s = suite_create("cpu");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_implications_hold);
    tcase_add_test(core, test_format_names);
    tcase_add_test(core, test_core_count);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_format_limits);
    suite_add_tcase(s, limits);
    return s;
}

CORRAL_CHECK_MAIN(cpu_suite)
