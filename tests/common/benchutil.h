/*
 * benchutil.h — the timing helpers every benchmark program under tests/bench uses: a monotonic
 * clock in seconds and the comparison that qsort needs to take medians of timings.
 */
#ifndef CORRAL_BENCHUTIL_H
#define CORRAL_BENCHUTIL_H

#include <time.h>

/* Seconds on the monotonic clock. */
static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* qsort comparison of doubles, ascending. */
static inline int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
