/*
 * bench.c — machine measurements for `corral bench` (contract in corral/bench.h).
 *
 * The bandwidth read is deliberately plain C: eight independent 64-bit sums per 64-byte line keep
 * the loop bound by loads rather than by an add chain, and even scalar loads at two per cycle
 * outrun the memory bandwidth a core gets, so no SIMD is needed to saturate it. A core reads
 * faster from several streams far apart than from one (the decode kernels read Q4_0, Q8_0 and
 * F16 weights so), so half the passes read each thread's share as BENCH_BANDWIDTH_STREAMS runs
 * side by side; the best pass of either kind counts.
 */
#include "corral/bench.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"

const char *bench_kernel_path(corral_error *err) {
    const kernel_ops *k = kernels_get(err);
    return k ? k->name : NULL;
}

typedef struct bench_bw_job {
    uint64_t *buf;
    size_t n_lines; /* 64-byte lines */
    int write;
    int streams; /* a thread's share read as this many runs side by side */
    uint64_t sink[THREADPOOL_MAX_THREADS * 8]; /* one cache line per thread: no false sharing */
} bench_bw_job;

uint64_t bench_read_lines(const void *buf, size_t n_lines, int streams) {
    const uint64_t *p = buf;
    uint64_t s[8] = {0};
    if (streams < 1) streams = 1;
    /* `streams` runs of equal length, line k of every run in turn (the rest after). */
    const size_t run = n_lines / (size_t)streams;
    for (size_t k = 0; k < run; k++)
        for (int r = 0; r < streams; r++) {
            const uint64_t *line = p + ((size_t)r * run + k) * 8;
            for (int w = 0; w < 8; w++) s[w] += line[w];
        }
    for (const uint64_t *q = p + run * (size_t)streams * 8; q < p + n_lines * 8; q += 8)
        for (int w = 0; w < 8; w++) s[w] += q[w];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static void bench_bw_run(void *arg, uint32_t ith, uint32_t nth) {
    bench_bw_job *job = arg;
    const size_t l0 = job->n_lines * ith / nth, l1 = job->n_lines * (ith + 1) / nth;
    uint64_t *p = job->buf + l0 * 8, *end = job->buf + l1 * 8;
    if (job->write) {
        for (uint64_t *q = p; q < end; q++) *q = (uint64_t)(q - job->buf);
        return;
    }
    /* Stored, so the compiler cannot drop the reads. */
    job->sink[ith * 8] = bench_read_lines(p, l1 - l0, job->streams);
}

static double bench_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

struct bench_bandwidth {
    threadpool *pool;
    bench_bw_job job;
};

bench_bandwidth *bench_bandwidth_new(threadpool *pool, uint64_t bytes) {
    if (bytes < 64 || bytes > SIZE_MAX) return NULL;
    bench_bandwidth *b = calloc(1, sizeof *b);
    void *buf = NULL;
    if (!b || posix_memalign(&buf, 4096, (size_t)bytes) != 0) {
        free(b);
        return NULL;
    }
    b->pool = pool;
    b->job.buf = buf;
    b->job.n_lines = (size_t)bytes / 64;
    /* Writing first faults the pages in on the threads that will read them. */
    b->job.write = 1;
    threadpool_run(pool, bench_bw_run, &b->job);
    b->job.write = 0;
    return b;
}

double bench_bandwidth_measure(bench_bandwidth *b) {
    double best = 0;
    for (int pass = 0; pass < BENCH_BANDWIDTH_PASSES; pass++) {
        b->job.streams = pass % 2 ? BENCH_BANDWIDTH_STREAMS : 1;
        double t0 = bench_seconds();
        threadpool_run(b->pool, bench_bw_run, &b->job);
        double bw = (double)b->job.n_lines * 64.0 / (bench_seconds() - t0);
        if (bw > best) best = bw;
    }
    return best;
}

void bench_bandwidth_free(bench_bandwidth **b) {
    if (!*b) return;
    free((*b)->job.buf);
    free(*b);
    *b = NULL;
}

double bench_memory_bandwidth(threadpool *pool, uint64_t bytes) {
    bench_bandwidth *b = bench_bandwidth_new(pool, bytes);
    if (!b) return -1;
    const double bw = bench_bandwidth_measure(b);
    bench_bandwidth_free(&b);
    return bw;
}

uint64_t bench_llc_bytes(void) {
    uint64_t best = 0;
    for (int i = 0; i < 8; i++) {
        char path[96], text[32];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        unsigned long long v = 0;
        char unit = 0;
        if (fgets(text, sizeof text, f) && sscanf(text, "%llu%c", &v, &unit) >= 1) {
            uint64_t b = v * (unit == 'K' ? 1024ull : unit == 'M' ? 1048576ull : 1ull);
            if (b > best) best = b;
        }
        fclose(f);
    }
    return best;
}

double bench_cached_fraction(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    double cached = -1;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_size > 0) {
        void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        const size_t n_pages = ((size_t)st.st_size + page - 1) / page;
        unsigned char *vec = malloc(n_pages);
        if (map != MAP_FAILED && vec && mincore(map, (size_t)st.st_size, vec) == 0) {
            size_t in = 0;
            for (size_t i = 0; i < n_pages; i++) in += vec[i] & 1;
            cached = (double)in / (double)n_pages;
        }
        free(vec);
        if (map != MAP_FAILED) munmap(map, (size_t)st.st_size);
    }
    close(fd);
    return cached;
}

double bench_huge_page_fraction(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    uint64_t rss = 0, file_pmd = 0, anon_huge = 0, kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "Rss: %" SCNu64 " kB", &kb) == 1) rss = kb;
        else if (sscanf(line, "FilePmdMapped: %" SCNu64 " kB", &kb) == 1) file_pmd = kb;
        else if (sscanf(line, "AnonHugePages: %" SCNu64 " kB", &kb) == 1) anon_huge = kb;
    }
    fclose(f);
    if (rss == 0) return -1;
    const double fraction = (double)(file_pmd + anon_huge) / (double)rss;
    return fraction > 1 ? 1 : fraction;
}

uint64_t bench_peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %" SCNu64 " kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}
