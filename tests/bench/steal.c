/*
 * steal.c — how much of each CPU's time this machine takes away from a busy thread: one thread
 * per CPU, pinned, reads the monotonic clock in a tight loop for a few seconds and adds up every
 * gap between two reads longer than a threshold (the thread was not running: the hypervisor ran
 * another guest's vCPU, or the kernel ran an interrupt or another thread).
 *
 *   build/tests/bench/steal [--seconds 3] [--threshold-us 5] [--cpus N]
 *
 * Per CPU it prints the share of the time lost and the gaps by length. A benchmark thread loses
 * the same share, in pieces of the same length; on a 2-core VM each vCPU lost about 6.5 % in
 * 20-100 us gaps, some 1600 a second (README, engine speed), which no measurement there can
 * average away. Run it on an otherwise idle machine (it keeps every CPU busy itself). Nothing
 * here is run by the tests.
 */
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchutil.h"

/* Upper bounds of the gap classes, in microseconds; the last class is everything longer. */
static const double steal_class_us[] = {20, 100, 1000, 10000};
#define STEAL_CLASSES (sizeof steal_class_us / sizeof steal_class_us[0] + 1)

typedef struct steal_probe {
    int cpu;
    double seconds, threshold_s;
    int pinned;
    double lost_s;
    long gaps[STEAL_CLASSES];
} steal_probe;

static void *steal_run(void *arg) {
    steal_probe *p = arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(p->cpu, &set);
    p->pinned = pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
    const double start = now_s();
    double last = start;
    for (;;) {
        const double t = now_s(), gap = t - last;
        last = t;
        if (gap > p->threshold_s) {
            p->lost_s += gap;
            size_t c = 0;
            while (c < STEAL_CLASSES - 1 && gap * 1e6 >= steal_class_us[c]) c++;
            p->gaps[c]++;
        }
        if (t - start >= p->seconds) break;
    }
    return NULL;
}

/* *out = the number in text when it is one in (lo, hi]; else a message naming the option. */
static int parse_in_range(const char *option, const char *text, double lo, double hi, double *out) {
    char *end = NULL;
    const double v = strtod(text, &end);
    if (end == text || *end || !(v > lo && v <= hi)) {
        fprintf(stderr, "steal: %s '%s' is not in (%.0f, %.0f]\n", option, text, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static void usage(FILE *out) {
    fprintf(out, "usage: steal [--seconds S] [--threshold-us U] [--cpus N]\n"
                 "  --seconds S       how long each CPU is probed (default 3)\n"
                 "  --threshold-us U  shortest gap counted as lost (default 5)\n"
                 "  --cpus N          probe CPUs 0..N-1 (default: every online CPU)\n");
}

int main(int argc, char **argv) {
    double seconds = 3, threshold_us = 5;
    long n_cpus = sysconf(_SC_NPROCESSORS_ONLN);
    static const struct option options[] = {
        {"seconds", required_argument, NULL, 's'},
        {"threshold-us", required_argument, NULL, 'u'},
        {"cpus", required_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        char *end = NULL;
        switch (opt) {
            case 's':
                if (parse_in_range("--seconds", optarg, 0, 3600, &seconds)) return 2;
                break;
            case 'u':
                if (parse_in_range("--threshold-us", optarg, 0, 1e6, &threshold_us)) return 2;
                break;
            case 'c':
                n_cpus = strtol(optarg, &end, 10);
                if (*end || n_cpus < 1 || n_cpus > CPU_SETSIZE) {
                    fprintf(stderr, "steal: --cpus '%s' is not in 1..%d\n", optarg, CPU_SETSIZE);
                    return 2;
                }
                break;
            case 'h':
                usage(stdout);
                return 0;
            default:
                usage(stderr);
                return 2;
        }
    }
    if (optind != argc || n_cpus < 1) {
        usage(stderr);
        return 2;
    }
    steal_probe *probes = calloc((size_t)n_cpus, sizeof *probes);
    pthread_t *threads = calloc((size_t)n_cpus, sizeof *threads);
    if (!probes || !threads) {
        fprintf(stderr, "steal: out of memory\n");
        return 1;
    }
    long started = 0;
    for (long i = 0; i < n_cpus; i++) {
        probes[i] =
            (steal_probe){.cpu = (int)i, .seconds = seconds, .threshold_s = threshold_us * 1e-6};
        if (pthread_create(&threads[i], NULL, steal_run, &probes[i]) != 0) {
            fprintf(stderr, "steal: cannot start the thread for CPU %ld\n", i);
            break;
        }
        started++;
    }
    for (long i = 0; i < started; i++) pthread_join(threads[i], NULL);
    printf("gaps longer than %.0f us while a thread spins on the clock, %.1f s per CPU\n",
           threshold_us, seconds);
    for (long i = 0; i < started; i++) {
        const steal_probe *p = &probes[i];
        printf("cpu %ld%s: lost %.1f ms (%.2f %%); gaps", i, p->pinned ? "" : " (not pinned)",
               p->lost_s * 1e3, 100.0 * p->lost_s / seconds);
        long total = 0;
        for (size_t c = 0; c < STEAL_CLASSES; c++) {
            const double lo = c == 0 ? threshold_us : steal_class_us[c - 1];
            if (c < STEAL_CLASSES - 1)
                printf(" %.0f-%.0f us: %ld,", lo, steal_class_us[c], p->gaps[c]);
            else
                printf(" longer: %ld", p->gaps[c]);
            total += p->gaps[c];
        }
        printf(" (%.0f a second)\n", (double)total / seconds);
    }
    free(threads);
    free(probes);
    return started == n_cpus ? 0 : 1;
}
