/*
 * panel.c — throughput of the panel kernels alone (engine/src/kernels_panel.inc), one thread,
 * weights and activations hot in the caches: what the matrix products of a decode step (1 token)
 * and of a prefill (tiles of many tokens) would reach if memory and the thread pool cost nothing.
 * The figures to set against `corral bench`'s, and the quick A/B for a kernel change.
 *
 *   build/tests/bench/panel [-n N_IN] [--rows R] [--reps R] [--type NAME] [--tokens T,T,...]
 *
 * Defaults: n_in 2048 (TinyLlama's width), 128 rows (8 panels), 7 repetitions, every panel type,
 * tokens 1,16,64. Per type, SIMD variant and token count it prints the median over the repetitions
 * of multiply-adds per nanosecond (one weight element times one token), and for the AVX-512 path
 * the measured float FMA peak of this core in the same unit (16 lanes x the FMAs per ns of
 * independent vfmadd chains), so that the F16 kernel's fraction of peak can be read off.
 * Nothing here is run by the tests.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "corral/tensor.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
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
    fprintf(f, "usage: panel [-n N_IN] [--rows R] [--reps R] [--type NAME] [--tokens T,T,...]\n");
}

int main(int argc, char **argv) {
    int64_t n_in = 2048, rows = 128;
    int reps = 7;
    const char *only = NULL;
    int64_t toks[16] = {1, 16, 64};
    int n_toks = 3;
    static const struct option opts[] = {
        {"rows", required_argument, NULL, 'R'}, {"reps", required_argument, NULL, 'r'},
        {"type", required_argument, NULL, 'T'}, {"tokens", required_argument, NULL, 'k'},
        {"help", no_argument, NULL, 'h'},       {NULL, 0, NULL, 0}};
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
            case 'k': {
                n_toks = 0;
                for (char *s = optarg; *s && n_toks < 16;) {
                    toks[n_toks++] = strtoll(s, &s, 10);
                    if (*s == ',')
                        s++;
                    else if (*s)
                        break;
                }
                break;
            }
            case 'h':
                usage(stdout);
                return 0;
            default:
                usage(stderr);
                return 2;
        }
    }
    if (n_in <= 0 || n_in % 256 != 0 || rows <= 0 || rows % KERNEL_PANEL_ROWS != 0 || reps <= 0 ||
        n_toks == 0) {
        fprintf(stderr,
                "panel: -n must be a positive multiple of 256, --rows of %d, --reps "
                "positive, --tokens a list of positive counts\n",
                KERNEL_PANEL_ROWS);
        return 2;
    }
    int64_t max_tok = 0;
    for (int k = 0; k < n_toks; k++) {
        if (toks[k] <= 0) {
            fprintf(stderr, "panel: token counts must be positive\n");
            return 2;
        }
        if (toks[k] > max_tok) max_tok = toks[k];
    }
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
    for (int64_t i = 0; i < n_in * max_tok; i++) yf[i] = rng_normalish();
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const bench_type *bt = &types[ti];
        if (only && strcmp(only, bt->name) != 0) continue;
        const tensor_type_traits *tt = tensor_type_get_traits(bt->type);
        const tensor_type vt = tt->vec_dot_type;
        const size_t row = tensor_row_size(bt->type, n_in), yrow = tensor_row_size(vt, n_in);
        uint8_t *w = malloc(row * rows), *packed = malloc(row * rows);
        uint8_t *y = malloc(yrow * max_tok);
        float *yw = malloc((size_t)n_in * max_tok * sizeof(float));
        kernel_act_aux *aux = malloc((size_t)max_tok * (n_in / 32) * sizeof *aux);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < n_in; i++) wf[i] = 0.05f * rng_normalish();
            tt->from_float(wf, w + r * row, n_in);
        }
        kernels_panel_pack(bt->type, w, n_in, rows, 0, rows / KERNEL_PANEL_ROWS, packed);
        const tensor_type_traits *yt = tensor_type_get_traits(vt);
        for (int64_t k = 0; k < max_tok; k++) {
            yt->from_float(yf + k * n_in, y + k * yrow, n_in);
            if (vt == TENSOR_TYPE_Q8_0) kernels_act_aux(y + k * yrow, n_in, aux + k * (n_in / 32));
            for (int64_t i = 0; vt == TENSOR_TYPE_F16 && i < n_in; i++)
                yw[k * n_in + i] = tensor_fp16_to_f32(((const uint16_t *)(y + k * yrow))[i]);
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
                            dot(n_in, packed, rows / KERNEL_PANEL_ROWS,
                                widen ? (const void *)yw : (const void *)y,
                                widen ? (size_t)n_in * sizeof(float) : yrow, aux,
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
        free(w);
        free(packed);
        free(y);
        free(yw);
        free(aux);
    }
    free(wf);
    free(yf);
    free(out);
    free(t);
    return 0;
}
