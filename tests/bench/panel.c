/*
 * panel.c — throughput of the panel kernels alone (engine/src/kernels_panel.inc), without the
 * model, the other operations of a forward pass or the noise of a whole run. Two modes:
 *
 *   build/tests/bench/panel [-n N_IN] [--rows R] [--reps R] [--type NAME] [--tokens T,T,...]
 *   build/tests/bench/panel --stream [-n N_IN] [--mib M] [--threads T,T,...] [--block P]
 *                                    [--reps R] [--type NAME]
 *
 * Hot caches (default): one thread, weights and activations in the caches: what the matrix
 * products of a decode step (1 token) and of a prefill (tiles of many tokens) would reach if
 * memory and the thread pool cost nothing. n_in 2048 (TinyLlama's width), 128 rows (8 panels),
 * 7 repetitions, every panel type, tokens 1,16,64. Per type, SIMD variant and token count it prints
 * the median of multiply-adds per nanosecond (one weight element times one token), and for the
 * AVX-512 path the measured float FMA peak of this core in the same unit (16 lanes x the FMAs per
 * ns of independent vfmadd chains), so that the F16 kernel's fraction of peak can be read off.
 *
 * Streaming (--stream): decoding, one token against M MiB of weights (512: far more than any
 * cache), on the kernel path the engine picks (CORRAL_CPU applies), the weight cut into claims of
 * P panels (64) that the threads take in turn as forward.c's matrix products do. Each repetition
 * runs the kernel over the whole weight and then reads the same claims plainly (bench_read_lines);
 * it prints the medians in GB/s of weight bytes, the bandwidth `corral bench` measures for its
 * decode ceiling (bench_memory_bandwidth, same threads), and the kernel's fraction of it: the
 * share of the ceiling the kernel alone reaches on this machine, without a model around it.
 *
 * Nothing here is run by the tests.
 */
#include <getopt.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "corral/bench.h"
#include "corral/tensor.h"
#include "corral/threadpool.h"
#include "benchutil.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float rng_normalish(void) {
    /* Sum of four uniforms, centred: enough for data that only has to be finite and varied. */
    float s = 0;
    for (int k = 0; k < 4; k++) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        s += (float)(rng_state >> 40) / (float)(1u << 24);
    }
    return s - 2.0f;
}

#if defined(__x86_64__)
/* Independent 512-bit FMAs per nanosecond on this core: 12 chains, long enough to hide latency. */
__attribute__((target("avx512f"), noinline)) static double fma512_per_ns(void) {
    __m512 a[12];
    for (int k = 0; k < 12; k++) a[k] = _mm512_set1_ps((float)k * 1e-9f);
    const __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-9f);
    const long iters = 20000000;
    const double t0 = now_s();
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int k = 0; k < 12; k++) a[k] = _mm512_fmadd_ps(a[k], b, c);
    }
    const double t = now_s() - t0;
    __m512 s = a[0];
    for (int k = 1; k < 12; k++) s = _mm512_add_ps(s, a[k]);
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return (double)iters * 12 / t / 1e9;
}
#endif

typedef struct bench_type {
    tensor_type type;
    const char *name;
} bench_type;

static const bench_type types[] = {
    {TENSOR_TYPE_Q4_0, "q4_0"}, {TENSOR_TYPE_Q8_0, "q8_0"}, {TENSOR_TYPE_Q4_K, "q4_k"},
    {TENSOR_TYPE_Q6_K, "q6_k"}, {TENSOR_TYPE_F16, "f16"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: panel [-n N_IN] [--rows R] [--reps R] [--type NAME] [--tokens T,T,...]\n"
               "       panel --stream [-n N_IN] [--mib M] [--threads T,T,...] [--block P] "
               "[--reps R] [--type NAME]\n");
}

/* A comma-separated list of up to `max` integers into v; the count, or -1 when malformed. */
static int parse_list(const char *text, int64_t *v, int max) {
    int n = 0;
    for (const char *s = text; *s;) {
        char *end;
        const long long x = strtoll(s, &end, 10);
        if (end == s || n == max) return -1;
        v[n++] = x;
        if (*end == ',' && end[1])
            s = end + 1;
        else if (*end)
            return -1;
        else
            break;
    }
    return n;
}

/* The activations of n_tok random tokens for a weight of type wt: y in wt's partner type (F16
 * weights: widened to floats, as forward.c hands them to the kernel), aux for Q8_0 partners. */
typedef struct bench_acts {
    uint8_t *y;
    size_t y_row;
    kernel_act_aux *aux;
} bench_acts;

static bool acts_make(bench_acts *a, tensor_type wt, int64_t n_in, int64_t n_tok, const float *yf) {
    const tensor_type vt = tensor_type_get_traits(wt)->vec_dot_type;
    const tensor_type_traits *yt = tensor_type_get_traits(vt);
    const size_t q_row = tensor_row_size(vt, n_in);
    const bool widen = wt == TENSOR_TYPE_F16;
    a->y_row = widen ? (size_t)n_in * sizeof(float) : q_row;
    a->y = malloc(a->y_row * (size_t)n_tok);
    a->aux = malloc((size_t)n_tok * (size_t)(n_in / 32) * sizeof *a->aux);
    uint8_t *q = malloc(q_row);
    if (!a->y || !a->aux || !q) {
        free(q);
        return false;
    }
    for (int64_t k = 0; k < n_tok; k++) {
        yt->from_float(yf + k * n_in, q, n_in);
        if (vt == TENSOR_TYPE_Q8_0) kernels_act_aux(q, n_in, a->aux + k * (n_in / 32));
        if (widen)
            for (int64_t i = 0; i < n_in; i++)
                ((float *)(a->y + k * a->y_row))[i] = tensor_fp16_to_f32(((const uint16_t *)q)[i]);
        else
            memcpy(a->y + k * a->y_row, q, q_row);
    }
    free(q);
    return true;
}

static void acts_free(bench_acts *a) {
    free(a->y);
    free(a->aux);
}

/* Random rows of a weight of type `type` in the panel layout: `panels` panels of n_in. */
static uint8_t *panels_make(tensor_type type, int64_t n_in, int64_t panels, float *wf) {
    const tensor_type_traits *tt = tensor_type_get_traits(type);
    const size_t row = tensor_row_size(type, n_in);
    const int64_t rows = panels * KERNEL_PANEL_ROWS;
    uint8_t *w = malloc(row * (size_t)rows), *packed = malloc(row * (size_t)rows);
    if (!w || !packed) {
        free(w);
        free(packed);
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < n_in; i++) wf[i] = 0.05f * rng_normalish();
        tt->from_float(wf, w + r * row, n_in);
    }
    kernels_panel_pack(type, w, n_in, rows, 0, panels, packed);
    free(w);
    return packed;
}

/* Hot caches: every variant of every path the CPU runs, per token count. */
static int bench_hot(int64_t n_in, int64_t rows, int reps, const char *only, const int64_t *toks,
                     int n_toks) {
    int64_t max_tok = 0;
    for (int k = 0; k < n_toks; k++)
        if (toks[k] > max_tok) max_tok = toks[k];
    printf("panel kernels: n_in %lld, %lld rows, one thread, hot caches; multiply-adds per ns "
           "(median of %d)\n",
           (long long)n_in, (long long)rows, reps);
#if defined(__x86_64__)
    if (kernels_for_path(KERNEL_PATH_AVX512))
        printf("float FMA peak of this core (avx512): %.1f per ns\n", 16.0 * fma512_per_ns());
#endif
    float *wf = malloc((size_t)n_in * sizeof(float));
    float *yf = malloc((size_t)n_in * max_tok * sizeof(float));
    float *out = malloc((size_t)rows * max_tok * sizeof(float));
    double *t = malloc((size_t)reps * sizeof(double));
    if (!wf || !yf || !out || !t) {
        fprintf(stderr, "panel: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < n_in * max_tok; i++) yf[i] = rng_normalish();
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const bench_type *bt = &types[ti];
        if (only && strcmp(only, bt->name) != 0) continue;
        bench_acts a;
        uint8_t *packed = panels_make(bt->type, n_in, rows / KERNEL_PANEL_ROWS, wf);
        if (!packed || !acts_make(&a, bt->type, n_in, max_tok, yf)) {
            fprintf(stderr, "panel: out of memory\n");
            return 1;
        }
        const bool widen = bt->type == TENSOR_TYPE_F16;
        for (int p = KERNEL_PATH_AVX2; p < KERNEL_PATH_COUNT; p++) {
            for (int v = 1; v >= 0; v--) {
                const kernel_ops *ops = kernels_for_variant((kernel_path)p, v);
                if (!ops || !ops->type[bt->type].panel_dot) continue;
                /* Variants that differ only in VNNI give the same F16 kernel: print it once. */
                if (widen && v == 0 && kernels_for_variant((kernel_path)p, 1)) continue;
                const kernel_panel_dot_fn dot = ops->type[bt->type].panel_dot;
                printf("%-5s %-12s", bt->name,
                       widen ? kernel_path_name((kernel_path)p) : ops->name);
                for (int k = 0; k < n_toks; k++) {
                    const int64_t n_tok = toks[k];
                    /* About 20 ms of work per repetition, at 10 multiply-adds per ns. */
                    const double macs = (double)rows * (double)n_in * (double)n_tok;
                    int64_t calls = (int64_t)(2e8 / macs);
                    if (calls < 1) calls = 1;
                    for (int rep = -1; rep < reps; rep++) {
                        const double t0 = now_s();
                        for (int64_t c = 0; c < calls; c++)
                            dot(n_in, packed, rows / KERNEL_PANEL_ROWS, a.y, a.y_row, a.aux,
                                (size_t)(n_in / 32), n_tok, out, (size_t)rows);
                        if (rep >= 0) t[rep] = now_s() - t0; /* rep -1 warms the caches */
                    }
                    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
                    printf("  t=%-3lld %6.1f", (long long)n_tok,
                           macs * (double)calls / t[reps / 2] / 1e9);
                }
                printf("\n");
            }
        }
        free(packed);
        acts_free(&a);
    }
    free(wf);
    free(yf);
    free(out);
    free(t);
    return 0;
}

/* One pass of the streaming mode over the whole weight: claims of `block` panels, taken in turn
 * by the pool's threads, each computed by the kernel or (read) summed plainly. */
typedef struct stream_pass {
    kernel_panel_dot_fn dot;
    const uint8_t *w;
    size_t panel_bytes;
    int64_t n_panels, block, n_in;
    const bench_acts *a;
    float *out;
    bool read;
    _Atomic int64_t claim;
    _Atomic uint64_t sink;
} stream_pass;

static void stream_thread(void *arg, uint32_t ith, uint32_t nth) {
    (void)ith;
    (void)nth;
    stream_pass *s = arg;
    uint64_t sum = 0;
    for (;;) {
        const int64_t p0 = atomic_fetch_add(&s->claim, 1) * s->block;
        if (p0 >= s->n_panels) break;
        const int64_t np = p0 + s->block < s->n_panels ? s->block : s->n_panels - p0;
        const uint8_t *w = s->w + (size_t)p0 * s->panel_bytes;
        if (s->read)
            sum += bench_read_lines(w, (size_t)np * s->panel_bytes / 64, 1);
        else
            s->dot(s->n_in, w, np, s->a->y, s->a->y_row, s->a->aux, (size_t)(s->n_in / 32), 1,
                   s->out + p0 * KERNEL_PANEL_ROWS, (size_t)(s->n_panels * KERNEL_PANEL_ROWS));
    }
    atomic_fetch_add(&s->sink, sum); /* so the reads cannot be dropped */
}

/* Streaming: the engine's kernel path, one token, per type and thread count. */
static int bench_stream(int64_t n_in, int64_t mib, const int64_t *threads, int n_threads,
                        int64_t block, int reps, const char *only) {
    corral_error err = {0};
    const kernel_ops *ops = kernels_get(&err);
    if (!ops) {
        fprintf(stderr, "panel: %s\n", err.message);
        return 1;
    }
    const size_t bytes = (size_t)mib << 20;
    uint8_t *w = NULL;
    float *wf = malloc((size_t)n_in * sizeof(float)), *yf = malloc((size_t)n_in * sizeof(float));
    double *t = malloc((size_t)reps * 2 * sizeof(double));
    if (posix_memalign((void **)&w, 4096, bytes) != 0 || !wf || !yf || !t) {
        fprintf(stderr, "panel: cannot allocate %lld MiB\n", (long long)mib);
        return 1;
    }
    for (int64_t i = 0; i < n_in; i++) yf[i] = rng_normalish();
    printf("panel kernels streaming: %s, n_in %lld, %lld MiB of weights, 1 token, claims of %lld "
           "panels; GB/s of weight bytes (medians of %d), the kernel against a plain read of the "
           "same claims and against corral bench's bandwidth (the decode ceiling's)\n",
           ops->name, (long long)n_in, (long long)mib, (long long)block, reps);
    printf("%-5s %7s %8s %8s %10s %16s\n", "type", "threads", "kernel", "read", "bandwidth",
           "kernel/bandwidth");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const bench_type *bt = &types[ti];
        if ((only && strcmp(only, bt->name) != 0) || !ops->type[bt->type].panel_dot) continue;
        const size_t panel_bytes = KERNEL_PANEL_ROWS * tensor_row_size(bt->type, n_in);
        /* Distinct random panels, repeated to fill the weight: the kernels' speed does not
         * depend on the values, and quantizing 512 MiB would take longer than the benchmark. */
        const int64_t n_seed = 16, n_panels = (int64_t)(bytes / panel_bytes);
        uint8_t *seed = panels_make(bt->type, n_in, n_seed, wf);
        bench_acts a;
        float *out = malloc((size_t)n_panels * KERNEL_PANEL_ROWS * sizeof(float));
        if (!seed || !out || n_panels < 1 || !acts_make(&a, bt->type, n_in, 1, yf)) {
            fprintf(stderr, "panel: out of memory (or --mib too small for a panel)\n");
            return 1;
        }
        for (int64_t p = 0; p < n_panels; p++)
            memcpy(w + (size_t)p * panel_bytes, seed + (size_t)(p % n_seed) * panel_bytes,
                   panel_bytes);
        for (int k = 0; k < n_threads; k++) {
            threadpool *pool = threadpool_new((uint32_t)threads[k], &err);
            if (!pool) {
                fprintf(stderr, "panel: %s\n", err.message);
                return 1;
            }
            stream_pass s = {.dot = ops->type[bt->type].panel_dot,
                             .w = w,
                             .panel_bytes = panel_bytes,
                             .n_panels = n_panels,
                             .block = block,
                             .n_in = n_in,
                             .a = &a,
                             .out = out};
            /* Repetition -1 warms up (frequency, page tables); then the kernel and the read in
             * turn, so that a noisy moment hits both. */
            for (int rep = -1; rep < reps; rep++)
                for (int m = 0; m < 2; m++) {
                    s.read = m == 1;
                    atomic_store(&s.claim, 0);
                    const double t0 = now_s();
                    threadpool_run(pool, stream_thread, &s);
                    if (rep >= 0) t[m * reps + rep] = now_s() - t0;
                }
            double gbs[2];
            for (int m = 0; m < 2; m++) {
                qsort(t + m * reps, (size_t)reps, sizeof t[0], cmp_double);
                gbs[m] = (double)n_panels * (double)panel_bytes / t[m * reps + reps / 2] / 1e9;
            }
            const double bw = bench_memory_bandwidth(pool, (uint64_t)256 << 20) / 1e9;
            printf("%-5s %7lld %8.1f %8.1f %10.1f %16.2f\n", bt->name, (long long)threads[k],
                   gbs[0], gbs[1], bw, gbs[0] / bw);
            threadpool_destroy(&pool);
        }
        free(seed);
        free(out);
        acts_free(&a);
    }
    free(w);
    free(wf);
    free(yf);
    free(t);
    return 0;
}

int main(int argc, char **argv) {
    int64_t n_in = 2048, rows = 128, mib = 512, block = 64;
    int reps = 7, stream = 0;
    const char *only = NULL;
    int64_t toks[16] = {1, 16, 64}, threads[16] = {1, 2};
    int n_toks = 3, n_threads = 2;
    static const struct option opts[] = {
        {"rows", required_argument, NULL, 'R'},    {"reps", required_argument, NULL, 'r'},
        {"type", required_argument, NULL, 'T'},    {"tokens", required_argument, NULL, 'k'},
        {"stream", no_argument, NULL, 's'},        {"mib", required_argument, NULL, 'm'},
        {"threads", required_argument, NULL, 't'}, {"block", required_argument, NULL, 'b'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
    for (int c; (c = getopt_long(argc, argv, "n:h", opts, NULL)) != -1;) {
        switch (c) {
            case 'n':
                n_in = atoll(optarg);
                break;
            case 'R':
                rows = atoll(optarg);
                break;
            case 'r':
                reps = atoi(optarg);
                break;
            case 'T':
                only = optarg;
                break;
            case 'k':
                n_toks = parse_list(optarg, toks, 16);
                break;
            case 's':
                stream = 1;
                break;
            case 'm':
                mib = atoll(optarg);
                break;
            case 't':
                n_threads = parse_list(optarg, threads, 16);
                break;
            case 'b':
                block = atoll(optarg);
                break;
            case 'h':
                usage(stdout);
                return 0;
            default:
                usage(stderr);
                return 2;
        }
    }
    bool ok = n_in > 0 && n_in % 256 == 0 && rows > 0 && rows % KERNEL_PANEL_ROWS == 0 &&
              reps > 0 && n_toks > 0 && n_threads > 0 && mib > 0 && mib <= 1 << 20 && block > 0;
    for (int k = 0; ok && k < n_toks; k++) ok = toks[k] > 0;
    for (int k = 0; ok && k < n_threads; k++) ok = threads[k] > 0 && threads[k] <= THREADPOOL_MAX_THREADS;
    if (!ok) {
        fprintf(stderr,
                "panel: -n must be a positive multiple of 256, --rows of %d, --reps, --mib and "
                "--block positive, --tokens a list of positive counts, --threads of 1 to %d\n",
                KERNEL_PANEL_ROWS, THREADPOOL_MAX_THREADS);
        return 2;
    }
    return stream ? bench_stream(n_in, mib, threads, n_threads, block, reps, only)
                  : bench_hot(n_in, rows, reps, only, toks, n_toks);
}
