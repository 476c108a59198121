/*
 * batch.c — what decoding several sequences in one batched forward pass (model_forward_batch)
 * costs against decoding one: the figure the scheduler's continuous batching rests on.
 *
 *   build/tests/bench/batch MODEL.gguf [-t 2] [--batches 1,2,4,8,16] [--depth 300] [--steps 16]
 *                           [--reps 3] [--kv f16|f32] [--no-logits]
 *
 * For each batch size B: B sequences whose caches hold `depth` positions (one prefill, copied
 * into the others) decode `steps` tokens each, one token of every sequence per model_forward_batch
 * call, each with its logits (--no-logits: none, which leaves the output projection out). Printed
 * per B: milliseconds per pass, tokens per second over all sequences and per sequence, and the
 * pass's cost against B = 1 (a pass of B tokens that costs as much as one token's is the ideal),
 * and the CPU time the process used per pass, against which a wall time far above it / threads
 * shows a machine busy with other work. Medians over the repetitions; each repetition truncates
 * the caches back to `depth`. --depth 0
 * against the default separates attention (which grows with the positions) from the rest. The
 * kernel path is the engine's (CORRAL_CPU applies). Nothing here is run by the tests.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "corral/model.h"
#include "corral/threadpool.h"
#include "benchutil.h"

enum { MAX_BATCHES = 16, MAX_B = 256 };

typedef struct options {
    const char *model;
    uint32_t threads, depth, steps, reps;
    uint32_t batches[MAX_BATCHES];
    int n_batches, logits;
    kv_type kvt;
} options;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static int32_t rng_token(uint32_t n_vocab) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (int32_t)(3 + rng_state % (n_vocab - 3)); /* past <unk>, <s>, </s> */
}

/* User and system CPU seconds of the process so far. */
static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* The median seconds of `steps` batched decode passes of B sequences (and in *cpu the CPU seconds
 * of that repetition), or a negative value on an error (printed). */
static double bench_batch(model_runner *r, kv_cache *const *kv, uint32_t B, const options *o,
                          uint32_t n_vocab, float *logits, double *cpu) {
    model_seq seqs[MAX_B];
    int32_t tok[MAX_B];
    double *t = malloc(o->reps * sizeof *t), *c = malloc(o->reps * sizeof *c);
    corral_error err;
    for (int rep = -1; rep < (int)o->reps; rep++) { /* rep -1 warms up */
        for (uint32_t s = 0; s < B; s++) kv_cache_truncate(kv[s], o->depth);
        const double t0 = now_s(), c0 = cpu_s();
        for (uint32_t step = 0; step < o->steps; step++) {
            for (uint32_t s = 0; s < B; s++) {
                tok[s] = rng_token(n_vocab);
                seqs[s] = (model_seq){.kv = kv[s],
                                      .tokens = &tok[s],
                                      .n_tokens = 1,
                                      .logits = o->logits ? logits + (size_t)s * n_vocab : NULL};
            }
            if (model_forward_batch(r, seqs, B, &err) != CORRAL_OK) {
                fprintf(stderr, "batch: %s\n", err.message);
                free(t);
                free(c);
                return -1;
            }
        }
        if (rep >= 0) {
            t[rep] = now_s() - t0;
            c[rep] = cpu_s() - c0;
        }
    }
    qsort(t, o->reps, sizeof *t, cmp_double);
    qsort(c, o->reps, sizeof *c, cmp_double);
    const double median = t[o->reps / 2];
    *cpu = c[o->reps / 2];
    free(t);
    free(c);
    return median;
}

static void usage(FILE *f) {
    fprintf(f, "usage: batch MODEL.gguf [-t 2] [--batches 1,2,4,8,16] [--depth 300] [--steps 16] "
               "[--reps 3] [--kv f16|f32] [--no-logits]\n");
}

/* A positive number up to max, or 0. */
static uint32_t parse_count(const char *s, uint32_t max) {
    char *end;
    const long v = strtol(s, &end, 10);
    return *s && !*end && v > 0 && v <= (long)max ? (uint32_t)v : 0;
}

static int parse_options(int argc, char **argv, options *o) {
    static const struct option longopts[] = {{"threads", required_argument, NULL, 't'},
                                             {"batches", required_argument, NULL, 'b'},
                                             {"depth", required_argument, NULL, 'd'},
                                             {"steps", required_argument, NULL, 's'},
                                             {"reps", required_argument, NULL, 'r'},
                                             {"kv", required_argument, NULL, 'k'},
                                             {"no-logits", no_argument, NULL, 'n'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "t:h", longopts, NULL)) != -1) {
        switch (c) {
            case 't':
                if (!(o->threads = parse_count(optarg, THREADPOOL_MAX_THREADS))) return -1;
                break;
            case 'b': {
                o->n_batches = 0;
                for (char *p = strtok(optarg, ","); p; p = strtok(NULL, ",")) {
                    if (o->n_batches == MAX_BATCHES) return -1;
                    if (!(o->batches[o->n_batches++] = parse_count(p, MAX_B))) return -1;
                }
                if (o->n_batches == 0) return -1;
                break;
            }
            case 'd':
                o->depth = strcmp(optarg, "0") == 0 ? 0 : parse_count(optarg, 1u << 20);
                if (o->depth == 0 && strcmp(optarg, "0") != 0) return -1;
                break;
            case 's':
                if (!(o->steps = parse_count(optarg, 1u << 16))) return -1;
                break;
            case 'r':
                if (!(o->reps = parse_count(optarg, 1000))) return -1;
                break;
            case 'k':
                if (strcmp(optarg, "f16") == 0)
                    o->kvt = KV_TYPE_F16;
                else if (strcmp(optarg, "f32") == 0)
                    o->kvt = KV_TYPE_F32;
                else
                    return -1;
                break;
            case 'n':
                o->logits = 0;
                break;
            case 'h':
                usage(stdout);
                exit(0);
            default:
                return -1;
        }
    }
    if (optind + 1 != argc) return -1;
    o->model = argv[optind];
    return 0;
}

int main(int argc, char **argv) {
    options o = {.threads = 2,
                 .depth = 300,
                 .steps = 16,
                 .reps = 3,
                 .batches = {1, 2, 4, 8, 16},
                 .n_batches = 5,
                 .logits = 1,
                 .kvt = KV_TYPE_F16};
    if (parse_options(argc, argv, &o) != 0) {
        usage(stderr);
        return 2;
    }
    uint32_t max_b = 0;
    for (int i = 0; i < o.n_batches; i++)
        if (o.batches[i] > max_b) max_b = o.batches[i];
    corral_error err;
    model_params mp = model_params_default();
    mp.cache_dir = getenv("CORRAL_CACHE_DIR");
    model *m = model_load(o.model, &mp, &err);
    if (!m) {
        fprintf(stderr, "batch: %s\n", err.message);
        return 1;
    }
    const model_hparams *hp = model_get_hparams(m);
    const uint32_t n_ctx = o.depth + o.steps + 1;
    threadpool *pool = o.threads > 1 ? threadpool_new(o.threads, &err) : NULL;
    model_runner *r = model_runner_new(m, 0, pool, &err);
    kv_cache **kv = calloc(max_b, sizeof *kv);
    float *logits = malloc((size_t)max_b * hp->n_vocab * sizeof(float));
    int32_t *prompt = malloc((o.depth + 1) * sizeof *prompt);
    if ((o.threads > 1 && !pool) || !r || !kv || !logits || !prompt || n_ctx > hp->n_ctx_train) {
        fprintf(stderr, "batch: %s\n",
                n_ctx > hp->n_ctx_train ? "depth + steps exceed the model's context" : err.message);
        return 1;
    }
    for (uint32_t s = 0; s < max_b; s++)
        if (!(kv[s] = kv_cache_new(m, n_ctx, o.kvt, &err))) {
            fprintf(stderr, "batch: %s\n", err.message);
            return 1;
        }
    /* One prefill of `depth` positions, copied into every cache. */
    for (uint32_t i = 0; i < o.depth; i++) prompt[i] = i == 0 ? 1 : rng_token(hp->n_vocab);
    if (o.depth > 0 &&
        model_forward(r, kv[0], prompt, o.depth, MODEL_LOGITS_NONE, NULL, &err) != CORRAL_OK) {
        fprintf(stderr, "batch: %s\n", err.message);
        return 1;
    }
    for (uint32_t s = 1; s < max_b; s++)
        if (kv_cache_copy(kv[s], kv[0], &err) != CORRAL_OK) {
            fprintf(stderr, "batch: %s\n", err.message);
            return 1;
        }
    printf("model    %s (%s, %u layers x %u, vocab %u)\n", o.model, hp->arch, hp->n_layer,
           hp->n_embd, hp->n_vocab);
    printf("setup    %u threads, kv %s, depth %u, %u steps, median of %u, logits %s\n", o.threads,
           o.kvt == KV_TYPE_F16 ? "f16" : "f32", o.depth, o.steps, o.reps,
           o.logits ? "every sequence" : "none");
    printf("%4s %10s %10s %12s %12s %12s\n", "B", "ms/pass", "tok/s", "tok/s/seq", "pass vs B=1",
           "cpu ms/pass");
    double one = 0;
    for (int i = 0; i < o.n_batches; i++) {
        const uint32_t B = o.batches[i];
        double cpu;
        const double sec = bench_batch(r, kv, B, &o, hp->n_vocab, logits, &cpu);
        if (sec < 0) return 1;
        const double pass_ms = sec / o.steps * 1e3;
        if (B == 1) one = pass_ms;
        printf("%4u %10.2f %10.2f %12.2f", B, pass_ms, B * o.steps / sec, o.steps / sec);
        if (one > 0)
            printf(" %11.2fx", pass_ms / one);
        else
            printf(" %12s", "-");
        printf(" %12.2f\n", cpu / o.steps * 1e3);
    }
    for (uint32_t s = 0; s < max_b; s++) kv_cache_destroy(&kv[s]);
    free(kv);
    free(logits);
    free(prompt);
    model_runner_destroy(&r);
    threadpool_destroy(&pool);
    model_destroy(&m);
    return 0;
}
