/*
 * merge.c — the LoRA merge benchmark (build target bench_merge; never run by the tests).
 *
 * Measures what the adapters issue asks for, on a TinyLlama-1.1B-shaped Q4_0 model with a
 * rank-16 adapter on every attention and feed-forward projection (154 tensors):
 *   1. merge time: lora_variant_prepare on an empty cache entry (fingerprint, open and check,
 *      merge on T threads, write the merged image, fsync), T = 2 by default;
 *   2. second load: lora_variant_prepare again (a cache hit: fingerprint, map, verify every
 *      checksum) + model_load of the cached image + the first token's logits (one forward pass
 *      of BOS), with the image in the page cache (warm) and after dropping it with
 *      posix_fadvise(DONTNEED) (cold, best effort); and the check alone with the image's pages
 *      in memory (the CPU cost of a hit: the checksums' hash);
 *   3. for comparison, the base model's own load-to-first-token, warm.
 * Models load as corrald loads them: with the cache directory as model_params.cache_dir, so the
 * weights rearranged for the kernels come from their image there (written by an untimed load
 * after each merge; cold drops it from the page cache too).
 *
 * Inputs are made on first use and reused (delete them to regenerate): the base with corral
 * synth (`corral synth --like tinyllama-1.1b --type q4_0`, the file tests/bench/run-all uses) and
 * the adapter with lora_synth_write (seed 1, alpha 32, F32 factors of standard deviation 0.02),
 * both deterministic.
 *
 *   bench_merge [--dir DIR] [-t THREADS] [--rank R] [--reps N]
 *   DIR defaults to $CORRAL_BENCH_DIR or /var/tmp/corral-bench (about 700 MB for the base, 70 MB
 *   for the adapter, 700 MB for the merged image).
 */
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "corral/log.h"
#include "corral/model.h"
#include "corral/synth.h"
#include "corral/tensor.h"
#include "corral/threadpool.h"
#include "corral/tokenizer.h"
#include "lora.h"
#include "benchutil.h"

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static void drop_cache(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* Load a model (rearranged weights from cache_dir) and compute the logits after BOS: seconds to
 * the first token. The path of the rearranged image goes to repack (size LORA_PATH_MAX; "" when
 * none). */
static double load_first_token(const char *path, threadpool *pool, const char *cache_dir,
                               char *repack) {
    corral_error err;
    double t0 = now_s();
    const model_params mp = {.compute = MODEL_COMPUTE_FAST, .cache_dir = cache_dir};
    model *m = model_load(path, &mp, &err);
    if (!m) {
        fprintf(stderr, "bench_merge: %s\n", err.message);
        exit(1);
    }
    const model_hparams *hp = model_get_hparams(m);
    kv_cache *kv = kv_cache_new(m, 16, KV_TYPE_F16, &err);
    model_runner *r = model_runner_new(m, 1, pool, &err);
    float *logits = malloc((size_t)hp->n_vocab * sizeof *logits);
    int32_t bos = tok_special_id(model_get_tokenizer(m), TOK_SPECIAL_BOS);
    if (bos < 0) bos = 0;
    if (!kv || !r || !logits ||
        model_forward(r, kv, &bos, 1, MODEL_LOGITS_LAST, logits, &err) != CORRAL_OK) {
        fprintf(stderr, "bench_merge: first token: %s\n", err.message);
        exit(1);
    }
    double t = now_s() - t0;
    const char *rp = model_repack_path(m);
    snprintf(repack, LORA_PATH_MAX, "%s", rp ? rp : "");
    free(logits);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
    model_destroy(&m);
    return t;
}

int main(int argc, char **argv) {
    const char *env_dir = getenv("CORRAL_BENCH_DIR");
    const char *dir = env_dir && *env_dir ? env_dir : "/var/tmp/corral-bench";
    long threads = 2, rank = 16, reps = 3;
    static const struct option options[] = {{"dir", required_argument, NULL, 'd'},
                                            {"threads", required_argument, NULL, 't'},
                                            {"rank", required_argument, NULL, 'r'},
                                            {"reps", required_argument, NULL, 'n'},
                                            {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "d:t:r:n:", options, NULL)) != -1) {
        switch (c) {
            case 'd':
                dir = optarg;
                break;
            case 't':
                threads = strtol(optarg, NULL, 10);
                break;
            case 'r':
                rank = strtol(optarg, NULL, 10);
                break;
            case 'n':
                reps = strtol(optarg, NULL, 10);
                break;
            default:
                fprintf(stderr, "usage: bench_merge [--dir DIR] [-t THREADS] [--rank R] "
                                "[--reps N]\n");
                return 2;
        }
    }
    if (threads < 1 || threads > 512 || rank < 1 || rank > 4096 || reps < 1 || reps > 100) {
        fprintf(stderr, "bench_merge: bad --threads, --rank or --reps\n");
        return 2;
    }
    log_set_level(LOG_LEVEL_WARN);
    mkdir(dir, 0755);
    char base[4096], adapter[4096], cache[4096];
    snprintf(base, sizeof base, "%s/tinyllama-1.1b-q4_0.gguf", dir);
    snprintf(adapter, sizeof adapter, "%s/tinyllama-1.1b-lora-r%ld.gguf", dir, rank);
    snprintf(cache, sizeof cache, "%s/lora-cache", dir);
    corral_error err;
    if (!exists(base)) {
        fprintf(stderr, "bench_merge: generating %s\n", base);
        synth_params p = synth_params_default();
        p.type = SYNTH_TYPE_Q4_0;
        if (synth_params_set_preset(&p, "tinyllama-1.1b", &err) != CORRAL_OK ||
            synth_write(&p, base, NULL, &err) != CORRAL_OK) {
            fprintf(stderr, "bench_merge: %s\n", err.message);
            return 1;
        }
    }
    if (!exists(adapter)) {
        fprintf(stderr, "bench_merge: generating %s\n", adapter);
        lora_synth_params p = {.base_path = base,
                               .rank = (uint32_t)rank,
                               .alpha = 2.0f * (float)rank,
                               .targets = LORA_SYNTH_ALL_LINEAR,
                               .seed = 1,
                               .a_std = 0.02f,
                               .b_std = 0.02f,
                               .type = TENSOR_TYPE_F32};
        if (lora_synth_write(&p, adapter, &err) != CORRAL_OK) {
            fprintf(stderr, "bench_merge: %s\n", err.message);
            return 1;
        }
    }
    threadpool *pool = threadpool_new((uint32_t)threads, &err);
    if (!pool) {
        fprintf(stderr, "bench_merge: %s\n", err.message);
        return 1;
    }
    lora_source src = {adapter, 1.0f};
    lora_variant_request req = {.base_path = base,
                                .adapters = &src,
                                .n_adapters = 1,
                                .cache_dir = cache,
                                .pool = pool,
                                .verify = IMAGE_VERIFY_FULL};

    double merge[100], hit[100], check[100], warm[100], cold[100], base_warm[100];
    uint64_t image_bytes = 0;
    uint32_t merged_tensors = 0;
    for (long i = 0; i < reps; i++) {
        /* 1. A miss: remove the cached image first. */
        lora_variant v;
        char fp[IMAGE_FINGERPRINT_CHARS + 1];
        if (lora_fingerprint(base, &src, 1, fp, &err) != CORRAL_OK) {
            fprintf(stderr, "bench_merge: %s\n", err.message);
            return 1;
        }
        char img[4200];
        snprintf(img, sizeof img, "%s/lora-%s.gguf", cache, fp);
        unlink(img);
        uint64_t before = lora_merge_count();
        double t0 = now_s();
        if (lora_variant_prepare(&req, &v, &err) != CORRAL_OK || v.cache_hit) {
            fprintf(stderr, "bench_merge: merge: %s\n", err.message);
            return 1;
        }
        merge[i] = now_s() - t0;
        image_bytes = v.image_bytes;
        if (i == 0) {
            gguf_file *g = gguf_open(v.path, &err);
            for (uint64_t k = 0; g && k < gguf_tensor_count(g); k++) {
                const gguf_tensor *t = gguf_tensor_at(g, k);
                merged_tensors +=
                    t->n_dims == 2 && t->name.len > 4 && memcmp(t->name.data, "blk.", 4) == 0;
            }
            gguf_destroy(&g);
        }
        /* 2. Second load, warm then cold: a hit, then the model and its first token. */
        t0 = now_s();
        if (lora_variant_prepare(&req, &v, &err) != CORRAL_OK || !v.cache_hit ||
            lora_merge_count() != before + 1) {
            fprintf(stderr, "bench_merge: second load was not a cache hit\n");
            return 1;
        }
        hit[i] = now_s() - t0;
        char repack[LORA_PATH_MAX];
        load_first_token(v.path, pool, cache, repack); /* writes the rearranged image */
        warm[i] = hit[i] + load_first_token(v.path, pool, cache, repack);
        /* The check alone with the image in the page cache (the hit above read it): fingerprint,
         * map, every tensor's checksum — the CPU cost of a hit, which the hash decides. */
        t0 = now_s();
        if (lora_variant_prepare(&req, &v, &err) != CORRAL_OK || !v.cache_hit) return 1;
        check[i] = now_s() - t0;
        drop_cache(v.path);
        if (repack[0]) drop_cache(repack);
        t0 = now_s();
        if (lora_variant_prepare(&req, &v, &err) != CORRAL_OK || !v.cache_hit) return 1;
        cold[i] = now_s() - t0 + load_first_token(v.path, pool, cache, repack);
        /* 3. The base alone (its rearranged image made by the first run's untimed load). */
        if (i == 0) load_first_token(base, pool, cache, repack);
        base_warm[i] = load_first_token(base, pool, cache, repack);
        fprintf(stderr,
                "bench_merge: run %ld: merge %.2f s; second load %.3f s (cache hit %.3f s, "
                "check in page cache %.3f s), cold %.3f s; base %.3f s\n",
                i + 1, merge[i], warm[i], hit[i], check[i], cold[i], base_warm[i]);
    }
    double *series[] = {merge, hit, check, warm, cold, base_warm};
    for (int s = 0; s < 6; s++) qsort(series[s], (size_t)reps, sizeof(double), cmp_double);
    long mid = reps / 2;
    printf("| model | adapter | threads | merge s | cache hit s | check in page cache s | "
           "load-to-first-token (cached variant) warm / cold s | base load-to-first-token s | "
           "image MiB |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    printf("| TinyLlama-1.1B shape, Q4_0 (corral synth) | rank %ld, all linear (%u tensors), F32 | "
           "%ld | %.2f (%.2f–%.2f) | %.3f | %.3f (%.3f–%.3f) | %.3f / %.3f | %.3f | %.0f |\n",
           rank, merged_tensors, threads, merge[mid], merge[0], merge[reps - 1], hit[mid],
           check[mid], check[0], check[reps - 1], warm[mid], cold[mid], base_warm[mid],
           (double)image_bytes / (1024.0 * 1024.0));
    printf("medians of %ld runs (merge, check: min–max); cache hit = fingerprint + map + verify of "
           "every checksum, right after the merge (the image read from disk); check in page "
           "cache = the same with the image's pages in memory\n",
           reps);
    threadpool_destroy(&pool);
    return 0;
}
