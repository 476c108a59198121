/*
 * attention.c — the attention kernel alone (kernels.h, attn_heads), as the decode step of the
 * forward pass calls it: one query token against n positions of a layer's KV cache, every KV head
 * in turn, one thread.
 *
 *   build/tests/bench/attention [--positions 64,512,2048] [--heads 32] [--kv-heads 4]
 *                               [--head-dim 64] [--layers 22] [--set-heads N] [--layout head|row]
 *                               [--reps 20]
 *
 * Defaults are TinyLlama's shapes. Per position count it prints microseconds per layer (median of
 * the repetitions), hot (the layers' K and V rows in the caches, as far as they fit) and cold (a
 * buffer far larger than the last-level cache read between repetitions, as the weights a decode
 * step streams push the cache out of the caches). --set-heads is how many query heads a call
 * serves (default: the whole group, as forward.c does when the units share out evenly); --layout
 * row lays the cache out as one row of all KV heads per position, the engine's layout before
 * each KV head got rows of its own (`head`). The kernel path is the engine's (CORRAL_CPU
 * applies). Nothing here is run by the tests.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "corral/tensor.h"
#include "benchutil.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float rng_unit(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)(rng_state >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

typedef struct shape {
    int heads, kv_heads, head_dim, layers, set_heads, per_head_layout;
} shape;

/* Medians over reps of the microseconds one layer's attention takes at n_pos positions. */
static int bench_positions(const kernel_ops *ops, const shape *s, int n_pos, int reps,
                           double *hot_us, double *cold_us) {
    const size_t hd = (size_t)s->head_dim, group = (size_t)(s->heads / s->kv_heads);
    const size_t layer_elems = (size_t)s->kv_heads * (size_t)n_pos * hd;
    const size_t flush_bytes = (size_t)256 << 20;
    uint16_t *k = malloc(layer_elems * s->layers * sizeof *k);
    uint16_t *v = malloc(layer_elems * s->layers * sizeof *v);
    float *q = malloc((size_t)s->heads * hd * sizeof *q);
    float *out = malloc((size_t)s->heads * hd * sizeof *out);
    float *scores = malloc((size_t)KERNEL_ATTN_MAX_HEADS * (size_t)n_pos * sizeof *scores);
    unsigned char *flush = malloc(flush_bytes);
    double *t = malloc((size_t)reps * sizeof *t);
    if (!k || !v || !q || !out || !scores || !flush || !t) {
        fprintf(stderr, "attention: out of memory at %d positions\n", n_pos);
        return 1;
    }
    for (size_t i = 0; i < layer_elems * s->layers; i++) {
        k[i] = tensor_f32_to_fp16(rng_unit() * 2.0f);
        v[i] = tensor_f32_to_fp16(rng_unit());
    }
    for (size_t i = 0; i < (size_t)s->heads * hd; i++) q[i] = rng_unit();
    memset(flush, 1, flush_bytes);
    /* Where a KV head's rows start and how far apart they are, in elements. */
    const size_t head_offset = s->per_head_layout ? (size_t)n_pos * hd : hd;
    const size_t stride = s->per_head_layout ? hd : (size_t)s->kv_heads * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    volatile unsigned sink = 0;
    for (int cold = 0; cold < 2; cold++) {
        for (int rep = -1; rep < reps; rep++) {
            if (cold)
                for (size_t i = 0; i < flush_bytes; i += 64) sink += flush[i];
            const double t0 = now_s();
            for (int il = 0; il < s->layers; il++) {
                const uint16_t *kl = k + (size_t)il * layer_elems,
                               *vl = v + (size_t)il * layer_elems;
                for (size_t kvh = 0; kvh < (size_t)s->kv_heads; kvh++)
                    for (size_t h0 = kvh * group; h0 < (kvh + 1) * group; h0 += s->set_heads) {
                        const size_t end = (kvh + 1) * group;
                        const size_t n = h0 + s->set_heads < end ? (size_t)s->set_heads : end - h0;
                        ops->attn_heads((uint32_t)n, q + h0 * hd, kl + kvh * head_offset,
                                        vl + kvh * head_offset, stride, (uint32_t)n_pos,
                                        (uint32_t)hd, scale, 1, scores, out + h0 * hd);
                    }
            }
            if (rep >= 0) t[rep] = (now_s() - t0) / s->layers * 1e6;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        *(cold ? cold_us : hot_us) = t[reps / 2];
    }
    free(k);
    free(v);
    free(q);
    free(out);
    free(scores);
    free(flush);
    free(t);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: attention [--positions 64,512,2048] [--heads 32] [--kv-heads 4] "
               "[--head-dim 64] [--layers 22] [--set-heads N] [--layout head|row] [--reps 20]\n");
}

/* A positive int option, or -1. */
static int parse_positive(const char *s, int max) {
    char *end;
    const long v = strtol(s, &end, 10);
    return *s && !*end && v > 0 && v <= max ? (int)v : -1;
}

int main(int argc, char **argv) {
    shape s = {.heads = 32, .kv_heads = 4, .head_dim = 64, .layers = 22, .per_head_layout = 1};
    int positions[16] = {64, 512, 2048}, n_positions = 3, reps = 20;
    static const struct option options[] = {
        {"positions", required_argument, NULL, 'p'},
        {"heads", required_argument, NULL, 'h'},
        {"kv-heads", required_argument, NULL, 'k'},
        {"head-dim", required_argument, NULL, 'd'},
        {"layers", required_argument, NULL, 'l'},
        {"set-heads", required_argument, NULL, 's'},
        {"layout", required_argument, NULL, 'y'},
        {"reps", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'H'},
        {NULL, 0, NULL, 0},
    };
    int c, index = 0;
    while ((c = getopt_long(argc, argv, "", options, &index)) != -1) {
        int *field = c == 'h'   ? &s.heads
                     : c == 'k' ? &s.kv_heads
                     : c == 'd' ? &s.head_dim
                     : c == 'l' ? &s.layers
                     : c == 's' ? &s.set_heads
                     : c == 'r' ? &reps
                                : NULL;
        if (field) {
            if ((*field = parse_positive(optarg, 1 << 16)) < 0) {
                fprintf(stderr, "attention: --%s wants a positive count, not '%s'\n",
                        options[index].name, optarg);
                return 2;
            }
        } else if (c == 'p') {
            n_positions = 0;
            for (char *tok = strtok(optarg, ","); tok; tok = strtok(NULL, ",")) {
                const int p = parse_positive(tok, 1 << 20);
                if (p < 0 || n_positions == 16) {
                    fprintf(stderr, "attention: --positions wants up to 16 positive counts\n");
                    return 2;
                }
                positions[n_positions++] = p;
            }
        } else if (c == 'y') {
            if (strcmp(optarg, "head") != 0 && strcmp(optarg, "row") != 0) {
                fprintf(stderr, "attention: --layout is head or row, not '%s'\n", optarg);
                return 2;
            }
            s.per_head_layout = strcmp(optarg, "head") == 0;
        } else {
            usage(c == 'H' ? stdout : stderr);
            return c == 'H' ? 0 : 2;
        }
    }
    if (optind != argc || n_positions == 0) {
        usage(stderr);
        return 2;
    }
    if (s.heads % s.kv_heads != 0) {
        fprintf(stderr, "attention: %d heads do not share out over %d KV heads\n", s.heads,
                s.kv_heads);
        return 2;
    }
    const int group = s.heads / s.kv_heads;
    if (s.set_heads == 0)
        s.set_heads = group < KERNEL_ATTN_MAX_HEADS ? group : KERNEL_ATTN_MAX_HEADS;
    if (s.set_heads > KERNEL_ATTN_MAX_HEADS) {
        fprintf(stderr, "attention: --set-heads is at most %d\n", KERNEL_ATTN_MAX_HEADS);
        return 2;
    }
    corral_error err = {0};
    const kernel_ops *ops = kernels_get(&err);
    if (!ops) {
        fprintf(stderr, "attention: %s\n", err.message);
        return 1;
    }
    printf("attention kernel: %s, %d heads over %d KV heads of %d, %d heads a call, %s layout, "
           "F16 cache, one thread; us per layer (median of %d)\n",
           ops->name, s.heads, s.kv_heads, s.head_dim, s.set_heads,
           s.per_head_layout ? "per-head" : "row", reps);
    printf("%9s %9s %9s\n", "positions", "hot", "cold");
    for (int i = 0; i < n_positions; i++) {
        double hot, cold;
        if (bench_positions(ops, &s, positions[i], reps, &hot, &cold) != 0) return 1;
        printf("%9d %9.2f %9.2f\n", positions[i], hot, cold);
    }
    return 0;
}
