/*
 * bench.h — what `corral bench` measures about the machine rather than the model: the kernel path
 * the engine runs, the memory read bandwidth, the last-level cache and the peak resident memory.
 *
 * Decoding reads every weight once per token, so tokens/s is bounded by bandwidth / bytes read per
 * token; measuring the bandwidth in the same run, with the same threads, turns a tokens/s figure
 * into a fraction of what the machine allows, which compares across machines.
 */
#ifndef CORRAL_BENCH_H
#define CORRAL_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "corral/status.h"
#include "corral/threadpool.h"

/* Passes of bench_memory_bandwidth, alternately one stream and BENCH_BANDWIDTH_STREAMS streams per
 * thread; the best counts (the others absorb page faults, frequency ramps and neighbours'
 * noise). */
#define BENCH_BANDWIDTH_PASSES  6
#define BENCH_BANDWIDTH_STREAMS 4

/* The name of the kernel table the engine's forward pass uses in this process ("scalar", "avx2",
 * "avx2+vnni", "avx512", "avx512+vnni"), as chosen from the CPU and CORRAL_CPU. NULL with err
 * filled when CORRAL_CPU names a path this CPU cannot run. Static string; thread-safe. */
const char *bench_kernel_path(corral_error *err);

/* A buffer for repeated bandwidth measurements: `bytes` bytes, written once on creation by the
 * pool's threads (NULL pool: the calling thread), which then read it. NULL when `bytes` is less
 * than one 64-byte line or cannot be allocated. Measuring the bandwidth next to each timed run
 * pairs the two on a machine whose bandwidth drifts (shared hosts, VMs): `corral bench` does so
 * after every generation run. */
typedef struct bench_bandwidth bench_bandwidth;
bench_bandwidth *bench_bandwidth_new(threadpool *pool, uint64_t bytes);

/* Best read bandwidth in bytes/s of BENCH_BANDWIDTH_PASSES streaming reads of the buffer split over
 * the threads, each thread's share read as one stream or as BENCH_BANDWIDTH_STREAMS streams far
 * apart. Uses the pool for one run at a time (see threadpool.h). */
double bench_bandwidth_measure(bench_bandwidth *b);

/* Frees the buffer; *b becomes NULL (NULL *b: nothing). */
void bench_bandwidth_free(bench_bandwidth **b);

/* One measurement on a buffer of its own: bench_bandwidth_new, _measure, _free. -1 when the
 * buffer cannot be made. */
double bench_memory_bandwidth(threadpool *pool, uint64_t bytes);

/* The sum of the 64-bit words of n_lines 64-byte lines at buf (8-byte aligned), read as `streams`
 * runs of equal length side by side, line by line (the lines left over after them): the plain
 * read that bench_memory_bandwidth times, for benchmarks that set a kernel against it. */
uint64_t bench_read_lines(const void *buf, size_t n_lines, int streams);

/* Size of the largest CPU cache (the last level) in bytes from sysfs, 0 when unknown. */
uint64_t bench_llc_bytes(void);

/* The share of the pages of the file at path that are in the page cache (mincore over a mapping
 * of it), 0..1, or -1 when it cannot be told (no file, empty, no mapping). */
double bench_cached_fraction(const char *path);

/* The share of this process's resident memory that the kernel maps in 2 MiB pages (FilePmdMapped
 * + AnonHugePages over Rss, /proc/self/smaps_rollup), 0..1, or -1 when unknown. Decoding from
 * weights mapped 4 KiB at a time ran a third slower on a 2-core VM (README, engine speed): this
 * tells a benchmark which state it measured. */
double bench_huge_page_fraction(void);

/* Peak resident set size of this process (VmHWM of /proc/self/status) in bytes, 0 when unknown.
 * File-backed pages count: a mapped model's weights are in it once touched. */
uint64_t bench_peak_rss_bytes(void);

#endif /* CORRAL_BENCH_H */
