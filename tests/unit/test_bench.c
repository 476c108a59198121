/*
 * test_bench.c — Check suite for the machine measurements of `corral bench` (corral/bench.h):
 * the plain read sums every word once whatever the stream count, the bandwidth is a positive
 * rate with or without a pool, once or again and again on one buffer, and a buffer of less than
 * one line is refused; a file's cached
 * share cannot be told for a missing or empty file.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "corral/bench.h"
#include "corral/threadpool.h"
#include "testutil.h"

/* Lines whose words are all distinct, so a line read twice or skipped changes the sum. */
static uint64_t *lines_make(size_t n_lines, uint64_t *expect) {
    uint64_t *buf = malloc(n_lines * 64);
    ck_assert_ptr_nonnull(buf);
    *expect = 0;
    for (size_t i = 0; i < n_lines * 8; i++) {
        buf[i] = i * 0x9E3779B97F4A7C15ull + 1;
        *expect += buf[i];
    }
    return buf;
}

START_TEST(test_read_lines_sums_every_word_once) {
    /* Line counts that divide by the streams and ones that leave lines over. */
    static const size_t counts[] = {1, 3, 4, 7, 64, 1001};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        uint64_t expect;
        uint64_t *buf = lines_make(counts[c], &expect);
        for (int streams = 1; streams <= 9; streams++)
            ck_assert_msg(bench_read_lines(buf, counts[c], streams) == expect,
                          "%zu lines, %d streams", counts[c], streams);
        free(buf);
    }
}
END_TEST

START_TEST(test_bandwidth_positive) {
    corral_error err = {0};
    threadpool *pool = threadpool_new(2, &err);
    ck_assert_ptr_nonnull(pool);
    /* Small buffers: this checks the arithmetic and the pool use, not the machine. */
    ck_assert(bench_memory_bandwidth(pool, 1 << 20) > 0);
    ck_assert(bench_memory_bandwidth(NULL, 1 << 20) > 0);
    /* One buffer measured again and again, as corral bench does after each generation run. */
    bench_bandwidth *b = bench_bandwidth_new(pool, 1 << 20);
    ck_assert_ptr_nonnull(b);
    for (int i = 0; i < 3; i++) ck_assert(bench_bandwidth_measure(b) > 0);
    bench_bandwidth_free(&b);
    ck_assert_ptr_null(b);
    bench_bandwidth_free(&b); /* nothing left: no-op */
    threadpool_destroy(&pool);
    ck_assert(bench_peak_rss_bytes() > 0);
    /* Known wherever /proc/self/smaps_rollup is (Linux 4.14 and later), and a share. */
    const double huge = bench_huge_page_fraction();
    ck_assert(huge >= 0 && huge <= 1);
}
END_TEST

START_TEST(test_read_lines_limits) {
    uint64_t expect;
    uint64_t *buf = lines_make(5, &expect);
    ck_assert(bench_read_lines(buf, 0, 4) == 0);       /* nothing to read */
    ck_assert(bench_read_lines(buf, 5, 0) == expect);  /* fewer than one stream: one */
    ck_assert(bench_read_lines(buf, 5, -3) == expect);
    ck_assert(bench_read_lines(buf, 5, 100) == expect); /* more streams than lines */
    free(buf);
    ck_assert(bench_memory_bandwidth(NULL, 64) > 0); /* one line */
}
END_TEST

START_TEST(test_bandwidth_refuses_sizes) {
    ck_assert(bench_memory_bandwidth(NULL, 0) < 0);
    ck_assert(bench_memory_bandwidth(NULL, 63) < 0); /* less than one line */
    ck_assert_ptr_null(bench_bandwidth_new(NULL, 0));
    ck_assert_ptr_null(bench_bandwidth_new(NULL, 63));
    ck_assert(bench_cached_fraction("/nonexistent/corral-test-file") < 0);
    ck_assert(bench_cached_fraction("/dev/null") < 0); /* empty: nothing to tell */
}
END_TEST

static Suite *bench_suite(void) {
    Suite *s = suite_create("bench");
    TCase *core = tcase_create("core");
    tcase_add_test(core, test_read_lines_sums_every_word_once);
    tcase_add_test(core, test_bandwidth_positive);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_test(limits, test_read_lines_limits);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_test(errors, test_bandwidth_refuses_sizes);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(bench_suite)
