/*
 * cmd_bench.c — `corral bench`: how fast the engine runs a model file on this machine, and how
 * close decoding comes to what the memory allows.
 *
 * Decoding one token reads every weight once (plus the KV cache), so its speed is bounded by the
 * memory read bandwidth: tokens/s <= bandwidth / bytes_per_token. The benchmark measures both in
 * the same run, with the same thread count, and reports the fraction of that ceiling reached — a
 * number that compares across machines where raw tokens/s does not. Measured:
 *   pp   prompt processing: a batched prefill of p tokens from an empty cache, tokens/s
 *   tg   generation: n tokens one at a time (greedy, each fed back) after an 8-token prompt
 *   (with --depth d, both after d positions already in the cache: a long conversation, where
 *   attention over the cache adds to every token's cost)
 *   load load-to-first-token (model_load, cache, runner, one token's logits), warm (page cache
 *        holds the file) and cold (after posix_fadvise DONTNEED of the model file and of its
 *        repacked-weights image; best effort: pages that another process maps stay resident, so
 *        the fraction still resident is reported); and load-to-ready, warm (the same without the
 *        token: when a server could start on a request). An untimed load comes first, so that
 *        the image of repacked weights in the cache directory (model_params.cache_dir; made on
 *        a file's first load) exists before anything is timed
 *   bandwidth a multi-threaded streaming read of a buffer far larger than the last-level cache,
 *        best of several passes, measured right after each tg run (once, after pp, without tg);
 *        the ceiling fraction is each tg run's against its own bandwidth, so a machine whose
 *        bandwidth drifts between minutes (a shared host, a VM) compares like with like. The
 *        buffer exists only after the peak RSS is read, so it does not count in it
 * pp, tg, bandwidth and the ceiling fraction are the median of r runs, with their min and max.
 */
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "corral/bench.h"
#include "corral/cpu.h"
#include "corral/model.h"
#include "corral/tensor.h"
#include "corral/threadpool.h"
#include "json.h"

/* Tokens before the generated ones in a tg run: generation after a short prompt, as in chat. */
#define BENCH_TG_PROMPT     8u
/* The bandwidth buffer is at least this many times the last-level cache, and at least 256 MiB. */
#define BENCH_BW_LLC_FACTOR 8u
#define BENCH_BW_MIN_BYTES  (256ull << 20)

typedef struct bench_opts {
    const char *path;
    const char *cache_dir; /* for repacked weights; NULL: none (repacked in memory each load) */
    uint32_t threads;      /* 0: physical cores */
    uint32_t n_prompt, n_gen, reps;
    uint32_t depth; /* positions in the cache before each pp and tg run */
    int json, cold;
    uint64_t bw_bytes; /* 0: automatic */
    kv_type kv;
    cli_progress *progress; /* the terminal's progress line (between timed runs only) */
} bench_opts;

typedef struct bench_spread {
    double median, min, max;
} bench_spread;

typedef struct bench_result {
    model_hparams hp;
    uint32_t file_type; /* general.file_type, or UINT32_MAX */
    uint64_t file_bytes, weight_bytes, bytes_per_token;
    uint32_t threads;
    bench_spread pp, tg; /* tokens/s */
    double load_ms_warm, load_ms_cold, cold_resident, ready_ms_warm;
    uint64_t peak_rss;
    double huge_pages;      /* bench_huge_page_fraction after generating, -1 unknown */
    bench_spread bandwidth; /* bytes/s: one measurement after each tg run (or one, without tg) */
    bench_spread ceiling;   /* per tg run: tok/s / (its bandwidth / bytes_per_token) */
    uint64_t bw_bytes;
    char cpu_path[32];      /* the engine's kernel table: "avx512+vnni", "scalar", ... */
    char cpu_features[256]; /* what the CPU reports */
} bench_result;

static double bench_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v. */
static bench_spread bench_spread_of(double *v, uint32_t n) {
    qsort(v, n, sizeof *v, bench_cmp_double);
    double median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    return (bench_spread){median, v[0], v[n - 1]};
}

static int32_t bench_argmax(const float *x, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

/* Drop the model file from the page cache so that the next load reads it from disk. Returns the
 * fraction of its pages still resident afterwards (mapped elsewhere, or dirty), or -1. */
static double bench_drop_cache(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    fdatasync(fd); /* dirty pages cannot be dropped: write them first */
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return bench_cached_fraction(path);
}

/* Load the model and compute one token's logits: the time a user waits for the first token.
 * Returns the loaded model (caller owns it) and the time in *ms; *ready_ms (may be NULL) gets the
 * time until the model, a cache and a runner exist, before the token. */
static model *bench_load_first_token(const bench_opts *o, threadpool *pool, double *ms,
                                     double *ready_ms, corral_error *err) {
    double t0 = bench_now();
    model_params params = model_params_default();
    params.cache_dir = o->cache_dir;
    /* The first load of a file rearranges its weights (and writes their image): shown. */
    o->progress->engine_what = "repacking";
    params.repack_progress = (corral_progress){.fn = cli_progress_engine, .user = o->progress};
    model *m = model_load(o->path, &params, err);
    if (!m) return NULL;
    const model_hparams *hp = model_get_hparams(m);
    kv_cache *kv = kv_cache_new(m, hp->n_ctx_train < 16 ? hp->n_ctx_train : 16, o->kv, err);
    model_runner *r = kv ? model_runner_new(m, 1, pool, err) : NULL;
    if (ready_ms) *ready_ms = (bench_now() - t0) * 1e3;
    float *logits = r ? malloc((size_t)hp->n_vocab * sizeof *logits) : NULL;
    int32_t bos = tok_special_id(model_get_tokenizer(m), TOK_SPECIAL_BOS);
    if (bos < 0) bos = 0;
    bool ok = logits && model_forward(r, kv, &bos, 1, MODEL_LOGITS_LAST, logits, err) == CORRAL_OK;
    if (ok) (void)bench_argmax(logits, hp->n_vocab);
    *ms = (bench_now() - t0) * 1e3;
    if (r && !logits) corral_error_set(err, CORRAL_OUT_OF_MEMORY, "out of memory");
    free(logits);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
    if (!ok) model_destroy(&m);
    return m;
}

/* Bytes one generated token reads: every weight once — except an untied token_embd, of which a
 * token reads one row — plus the keys and values of `positions` earlier positions. */
static uint64_t bench_bytes_per_token(const model *m, kv_type kvt, double positions) {
    const model_hparams *hp = model_get_hparams(m);
    uint64_t bytes = model_weight_bytes(m);
    const gguf_tensor *embd = gguf_find_tensor(model_get_gguf(m), "token_embd.weight");
    if (embd && !hp->tied_output && embd->ne[1] > 0)
        bytes -= embd->size - embd->size / (uint64_t)embd->ne[1];
    /* Keys and values of every position a token attends to: all of them in a full layer, the
     * last n_swa in a sliding-window one. */
    const double kv_row = 2.0 * hp->n_head_kv * hp->head_dim * (kvt == KV_TYPE_F16 ? 2.0 : 4.0);
    const double window = positions < hp->n_swa ? positions : hp->n_swa;
    const double rows =
        (double)(hp->n_layer - hp->n_swa_layers) * positions + hp->n_swa_layers * window;
    return bytes + (uint64_t)(kv_row * rows);
}

/* Back to the depth's positions before a run. A cache with sliding-window layers cannot always
 * go back by truncating (its windows kept only the newest rows): it is copied from the snapshot
 * taken at the depth, untimed like the truncation. */
static int bench_rewind(kv_cache *kv, const kv_cache *snapshot, uint32_t depth, corral_error *err) {
    if (kv_cache_truncate(kv, depth) == depth) return 0;
    return snapshot && kv_cache_copy(kv, snapshot, err) == CORRAL_OK ? 0 : -1;
}

/* ---- the measurements ------------------------------------------------------------------------ */

/* Deterministic token ids spread over the vocabulary. */
static void bench_fill_tokens(int32_t *ids, uint32_t n, uint32_t n_vocab) {
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (uint32_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ids[i] = (int32_t)(x % n_vocab);
    }
}

static int bench_run(const bench_opts *o, bench_result *res) {
    corral_error err = {0};
    int rc = 1;
    model *m = NULL;
    kv_cache *kv = NULL, *snapshot = NULL;
    model_runner *r = NULL;
    float *logits = NULL;
    int32_t *ids = NULL;
    double *times = NULL, *bws = NULL, *fractions = NULL;
    bench_bandwidth *bw = NULL;
    threadpool *pool = threadpool_new(o->threads, &err);
    if (!pool) return cli_fail("bench", "%s", err.message);
    res->threads = threadpool_n_threads(pool);
    res->load_ms_cold = -1;
    res->cold_resident = -1;
    res->huge_pages = -1;

    struct stat st;
    if (stat(o->path, &st) != 0) {
        cli_fail("bench", "%s: cannot read the model file", o->path);
        goto done;
    }
    res->file_bytes = (uint64_t)st.st_size;
    /* An untimed load: it writes the image of repacked weights if there is none yet. */
    double untimed;
    m = bench_load_first_token(o, pool, &untimed, NULL, &err);
    if (!m) {
        cli_fail("bench", "%s", err.message);
        goto done;
    }
    char image[4096] = "";
    if (model_repack_path(m)) snprintf(image, sizeof image, "%s", model_repack_path(m));
    model_destroy(&m);
    /* Cold next: no mapping of the files may exist in this process when their pages are
     * dropped. */
    if (o->cold) {
        res->cold_resident = bench_drop_cache(o->path);
        if (image[0]) {
            const double in_image = bench_drop_cache(image);
            if (in_image > res->cold_resident) res->cold_resident = in_image;
        }
        m = bench_load_first_token(o, pool, &res->load_ms_cold, NULL, &err);
        if (!m) {
            cli_fail("bench", "%s", err.message);
            goto done;
        }
        model_destroy(&m);
    }
    m = bench_load_first_token(o, pool, &res->load_ms_warm, &res->ready_ms_warm, &err);
    if (!m) {
        cli_fail("bench", "%s", err.message);
        goto done;
    }
    res->hp = *model_get_hparams(m);
    res->file_type = UINT32_MAX;
    gguf_get_u32(model_get_gguf(m), "general.file_type", &res->file_type, NULL);
    res->weight_bytes = model_weight_bytes(m);
    const uint32_t n_vocab = res->hp.n_vocab;

    const uint32_t tg_len = o->n_gen ? BENCH_TG_PROMPT + o->n_gen : 0;
    const uint64_t n_ctx64 = (uint64_t)o->depth + (o->n_prompt > tg_len ? o->n_prompt : tg_len);
    const uint32_t n_ctx = n_ctx64 > res->hp.n_ctx_train ? UINT32_MAX : (uint32_t)n_ctx64;
    if (n_ctx > res->hp.n_ctx_train) {
        cli_fail("bench", "%" PRIu64 " positions are needed but %s has a context of %u tokens",
                 n_ctx64, o->path, res->hp.n_ctx_train);
        goto done;
    }
    const uint32_t max_batch = o->n_prompt > 512 ? 512 : o->n_prompt > 0 ? o->n_prompt : 8;
    kv = kv_cache_new(m, n_ctx > 0 ? n_ctx : 1, o->kv, &err);
    r = kv ? model_runner_new(m, max_batch, pool, &err) : NULL;
    if (!r) {
        cli_fail("bench", "%s", err.message);
        goto done;
    }
    logits = malloc((size_t)n_vocab * sizeof *logits);
    ids = malloc((size_t)(n_ctx > 0 ? n_ctx : 1) * sizeof *ids);
    times = malloc((size_t)o->reps * sizeof *times);
    bws = malloc((size_t)o->reps * sizeof *bws);
    fractions = malloc((size_t)o->reps * sizeof *fractions);
    if (!logits || !ids || !times || !bws || !fractions) {
        cli_fail("bench", "out of memory");
        goto done;
    }
    bench_fill_tokens(ids, n_ctx > 0 ? n_ctx : 1, n_vocab);
    /* The depth's positions once, untimed; every run then starts from them. */
    if (o->depth > 0 && model_forward(r, kv, ids, o->depth, MODEL_LOGITS_NONE, NULL, &err)) {
        cli_fail("bench", "%s", err.message);
        goto done;
    }
    if (o->depth > 0 && res->hp.n_swa_layers > 0) {
        snapshot = kv_cache_new(m, n_ctx, o->kv, &err);
        if (!snapshot || kv_cache_copy(snapshot, kv, &err) != CORRAL_OK) {
            cli_fail("bench", "%s", err.message);
            goto done;
        }
    }
    const int32_t *run_ids = ids + o->depth;

    if (o->n_prompt > 0) {
        /* A short untimed pass first, so the runner's scratch is touched. */
        uint32_t warm = o->n_prompt < 16 ? o->n_prompt : 16;
        if (model_forward(r, kv, run_ids, warm, MODEL_LOGITS_LAST, logits, &err) != CORRAL_OK) {
            cli_fail("bench", "%s", err.message);
            goto done;
        }
        for (uint32_t i = 0; i < o->reps; i++) {
            cli_progress_show(o->progress, "prompt runs", i, o->reps); /* (outside the timing) */
            if (bench_rewind(kv, snapshot, o->depth, &err)) {
                cli_fail("bench", "%s", err.message);
                goto done;
            }
            double t0 = bench_now();
            if (model_forward(r, kv, run_ids, o->n_prompt, MODEL_LOGITS_LAST, logits, &err)) {
                cli_fail("bench", "%s", err.message);
                goto done;
            }
            times[i] = o->n_prompt / (bench_now() - t0);
        }
        res->pp = bench_spread_of(times, o->reps);
    }
    /* Generated token k (0-based) attends to depth + BENCH_TG_PROMPT + k + 1 positions. */
    const double avg_positions =
        o->depth +
        (o->n_gen ? BENCH_TG_PROMPT + 0.5 * (double)(o->n_gen + 1) : (double)BENCH_TG_PROMPT);
    res->bytes_per_token = bench_bytes_per_token(m, o->kv, avg_positions);
    uint64_t bw_bytes = o->bw_bytes;
    if (bw_bytes == 0) {
        bw_bytes = BENCH_BW_LLC_FACTOR * bench_llc_bytes();
        if (bw_bytes < BENCH_BW_MIN_BYTES) bw_bytes = BENCH_BW_MIN_BYTES;
    }
    res->bw_bytes = bw_bytes;
    /* The first generation run (or the prompt runs) touched all the memory the engine uses; the
     * bandwidth buffer comes after the peak RSS is read, so that it does not count in it. */
    const uint32_t n_bw = o->n_gen > 0 ? o->reps : 1;
    for (uint32_t i = 0; i < o->reps && o->n_gen > 0; i++) {
        cli_progress_show(o->progress, "generation runs", i, o->reps);
        if (bench_rewind(kv, snapshot, o->depth, &err)) {
            cli_fail("bench", "%s", err.message);
            goto done;
        }
        if (model_forward(r, kv, run_ids, BENCH_TG_PROMPT, MODEL_LOGITS_LAST, logits, &err)) {
            cli_fail("bench", "%s", err.message);
            goto done;
        }
        int32_t tok = bench_argmax(logits, n_vocab);
        double t0 = bench_now();
        for (uint32_t k = 0; k < o->n_gen; k++) {
            if (model_forward(r, kv, &tok, 1, MODEL_LOGITS_LAST, logits, &err)) {
                cli_fail("bench", "%s", err.message);
                goto done;
            }
            tok = bench_argmax(logits, n_vocab);
        }
        times[i] = o->n_gen / (bench_now() - t0);
        if (i == 0) {
            res->peak_rss = bench_peak_rss_bytes();
            res->huge_pages = bench_huge_page_fraction();
        }
        /* This run's bandwidth, right after it: the fraction of the ceiling is a ratio of two
         * measurements a few tens of milliseconds apart, not minutes apart. */
        if (!bw && !(bw = bench_bandwidth_new(pool, bw_bytes))) goto no_buffer;
        bws[i] = bench_bandwidth_measure(bw);
        fractions[i] = times[i] * (double)res->bytes_per_token / bws[i];
    }
    if (o->n_gen == 0) {
        res->peak_rss = bench_peak_rss_bytes();
        res->huge_pages = bench_huge_page_fraction();
        if (!(bw = bench_bandwidth_new(pool, bw_bytes))) goto no_buffer;
        bws[0] = bench_bandwidth_measure(bw);
    } else {
        res->tg = bench_spread_of(times, o->reps);
        res->ceiling = bench_spread_of(fractions, o->reps);
    }
    res->bandwidth = bench_spread_of(bws, n_bw);
    rc = 0;
    goto done;
no_buffer:
    cli_fail("bench", "cannot allocate %" PRIu64 " MiB for the bandwidth test", bw_bytes >> 20);
done:
    bench_bandwidth_free(&bw);
    free(fractions);
    free(bws);
    free(times);
    free(ids);
    free(logits);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
    kv_cache_destroy(&snapshot);
    model_destroy(&m);
    threadpool_destroy(&pool);
    return rc;
}

/* ---- output ---------------------------------------------------------------------------------- */

/* A measured figure, or null for "not measured" (negative). */
static json_t *bench_json_num(double v) {
    return v < 0 ? json_null() : cli_json_real(v);
}

static int bench_print_json(FILE *out, const bench_opts *o, const bench_result *res) {
    json_t *doc = json_object();
    cli_json_set(doc, "model", cli_json_str(o->path));
    cli_json_set(doc, "arch", cli_json_str(res->hp.arch));
    cli_json_set(doc, "file_type",
                 json_integer(res->file_type == UINT32_MAX ? -1 : (json_int_t)res->file_type));
    cli_json_set(doc, "file_bytes", cli_json_uint(res->file_bytes));
    cli_json_set(doc, "weight_bytes", cli_json_uint(res->weight_bytes));
    cli_json_set(doc, "threads", cli_json_uint(res->threads));
    cli_json_set(doc, "n_prompt", cli_json_uint(o->n_prompt));
    cli_json_set(doc, "n_gen", cli_json_uint(o->n_gen));
    cli_json_set(doc, "depth", cli_json_uint(o->depth));
    cli_json_set(doc, "reps", cli_json_uint(o->reps));
    cli_json_set(doc, "kv_type", cli_json_str(o->kv == KV_TYPE_F16 ? "f16" : "f32"));
    /* -1 prints as null: the phase was skipped. */
    const bench_spread none = {-1, -1, -1};
    const bench_spread pp = o->n_prompt ? res->pp : none, tg = o->n_gen ? res->tg : none;
    cli_json_set(doc, "pp_tok_s", bench_json_num(pp.median));
    cli_json_set(doc, "pp_tok_s_min", bench_json_num(pp.min));
    cli_json_set(doc, "pp_tok_s_max", bench_json_num(pp.max));
    cli_json_set(doc, "tg_tok_s", bench_json_num(tg.median));
    cli_json_set(doc, "tg_tok_s_min", bench_json_num(tg.min));
    cli_json_set(doc, "tg_tok_s_max", bench_json_num(tg.max));
    cli_json_set(doc, "bytes_per_token", cli_json_uint(res->bytes_per_token));
    cli_json_set(doc, "bandwidth_gb_s", bench_json_num(res->bandwidth.median * 1e-9));
    cli_json_set(doc, "bandwidth_gb_s_min", bench_json_num(res->bandwidth.min * 1e-9));
    cli_json_set(doc, "bandwidth_gb_s_max", bench_json_num(res->bandwidth.max * 1e-9));
    cli_json_set(doc, "bandwidth_buffer_bytes", cli_json_uint(res->bw_bytes));
    const bench_spread ceiling = o->n_gen ? res->ceiling : none;
    cli_json_set(doc, "ceiling_fraction", bench_json_num(ceiling.median));
    cli_json_set(doc, "ceiling_fraction_min", bench_json_num(ceiling.min));
    cli_json_set(doc, "ceiling_fraction_max", bench_json_num(ceiling.max));
    cli_json_set(doc, "load_ms_warm", bench_json_num(res->load_ms_warm));
    cli_json_set(doc, "load_ms_cold", bench_json_num(res->load_ms_cold));
    cli_json_set(doc, "ready_ms_warm", bench_json_num(res->ready_ms_warm));
    cli_json_set(doc, "cold_resident_fraction", bench_json_num(res->cold_resident));
    cli_json_set(doc, "peak_rss_bytes", cli_json_uint(res->peak_rss));
    cli_json_set(doc, "huge_page_fraction", bench_json_num(res->huge_pages));
    cli_json_set(doc, "cpu_path", cli_json_str(res->cpu_path));
    cli_json_set(doc, "cpu_features", cli_json_str(res->cpu_features));
    return cli_json_print(&doc, out, 2);
}

static void bench_print_human(FILE *out, const bench_opts *o, const bench_result *res) {
    const model_hparams *hp = &res->hp;
    fprintf(out, "model      %s\n", o->path);
    fprintf(out,
            "           %s, %u layers x %u, vocab %u, file_type %d, %.1f MiB file, %.1f MiB "
            "weights\n",
            hp->arch, hp->n_layer, hp->n_embd, hp->n_vocab,
            res->file_type == UINT32_MAX ? -1 : (int)res->file_type,
            (double)res->file_bytes / 1048576.0, (double)res->weight_bytes / 1048576.0);
    fprintf(out, "threads    %u   kernels: %s   kv: %s\ncpu        %s\n", res->threads,
            res->cpu_path, o->kv == KV_TYPE_F16 ? "f16" : "f32", res->cpu_features);
    if (o->depth) fprintf(out, "depth      %u positions in the cache before each run\n", o->depth);
    if (o->n_prompt)
        fprintf(out, "pp%-6u   %9.2f tok/s   (min %.2f, max %.2f over %u runs)\n", o->n_prompt,
                res->pp.median, res->pp.min, res->pp.max, o->reps);
    if (o->n_gen)
        fprintf(out, "tg%-6u   %9.2f tok/s   (min %.2f, max %.2f over %u runs)\n", o->n_gen,
                res->tg.median, res->tg.min, res->tg.max, o->reps);
    fprintf(out, "bytes/tok  %.1f MiB (weights read per token + KV at the average position)\n",
            (double)res->bytes_per_token / 1048576.0);
    fprintf(out,
            "bandwidth  %.2f GB/s (min %.2f, max %.2f; streaming read of %" PRIu64
            " MiB, %u threads, best of %d with 1 and %d streams per thread, %s)\n",
            res->bandwidth.median * 1e-9, res->bandwidth.min * 1e-9, res->bandwidth.max * 1e-9,
            res->bw_bytes >> 20, res->threads, BENCH_BANDWIDTH_PASSES, BENCH_BANDWIDTH_STREAMS,
            o->n_gen ? "after each tg run" : "once");
    if (o->n_gen)
        fprintf(
            out,
            "ceiling    %.1f%% (min %.1f, max %.1f) of bandwidth / bytes_per_token, each tg run "
            "against the bandwidth measured right after it (%.2f tok/s at the median)\n",
            100.0 * res->ceiling.median, 100.0 * res->ceiling.min, 100.0 * res->ceiling.max,
            res->bandwidth.median / (double)res->bytes_per_token);
    fprintf(out, "load       %.1f ms warm", res->load_ms_warm);
    if (res->load_ms_cold >= 0) {
        fprintf(out, ", %.1f ms cold", res->load_ms_cold);
        if (res->cold_resident >= 0)
            fprintf(out, " (%.0f%% of the file stayed cached)", 100.0 * res->cold_resident);
    }
    fprintf(out, " (load + first token)\nready      %.1f ms warm (load, cache and runner)\n",
            res->ready_ms_warm);
    fprintf(out, "peak RSS   %.1f MiB\n", (double)res->peak_rss / 1048576.0);
    if (res->huge_pages >= 0)
        fprintf(out, "pages      %.0f%% of resident memory mapped in 2 MiB pages\n",
                100.0 * res->huge_pages);
}

/* ---- command line ---------------------------------------------------------------------------- */

static void bench_usage(FILE *out) {
    fprintf(out,
            "usage: corral bench MODEL.gguf [options]\n"
            "\n"
            "Measure prompt processing (pp) and generation (tg) speed, load time, peak memory and\n"
            "this machine's memory bandwidth, and how close generation comes to the bandwidth\n"
            "ceiling (bandwidth / bytes read per token), each generation run against the\n"
            "bandwidth measured right after it.\n"
            "\n"
            "options:\n"
            "  -t, --threads N   threads (default: physical cores)\n"
            "  -p, --prompt N    prompt tokens for pp (default 512; 0 = skip)\n"
            "  -n, --gen N       generated tokens for tg (default 128; 0 = skip)\n"
            "  -r, --reps N      runs of each, median reported (default 5)\n"
            "  -d, --depth N     positions already in the KV cache before each pp and tg run\n"
            "                    (default 0): speed deep into a conversation\n"
            "      --json        print one JSON object instead of text\n"
            "      --no-cold     skip the cold-cache load\n"
            "      --bw-mib N    bandwidth buffer size (default: 8 x LLC, at least 256)\n"
            "      --kv f16|f32  KV cache type (default f16)\n"
            "      --cache-dir DIR  where the weights rearranged for the kernels are kept between\n"
            "                    loads (default: $CORRAL_CACHE_DIR, else the user's cache folder,\n"
            "                    $XDG_CACHE_HOME/corral or ~/.cache/corral, as corrald's;\n"
            "                    'none': rearranged in memory at every load)\n"
            "\n"
            "environment: CORRAL_CPU=scalar|avx2|avx512 forces a kernel path (default: the best\n"
            "the CPU has)\n");
}

int cmd_bench(int argc, char **argv) {
    enum { OPT_JSON = 256, OPT_NO_COLD, OPT_BW, OPT_KV, OPT_CACHE, OPT_HELP };
    static const struct option options[] = {
        {"threads", required_argument, NULL, 't'},
        {"prompt", required_argument, NULL, 'p'},
        {"gen", required_argument, NULL, 'n'},
        {"reps", required_argument, NULL, 'r'},
        {"depth", required_argument, NULL, 'd'},
        {"json", no_argument, NULL, OPT_JSON},
        {"no-cold", no_argument, NULL, OPT_NO_COLD},
        {"bw-mib", required_argument, NULL, OPT_BW},
        {"kv", required_argument, NULL, OPT_KV},
        {"cache-dir", required_argument, NULL, OPT_CACHE},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    bench_opts o = {.n_prompt = 512, .n_gen = 128, .reps = 5, .cold = 1, .kv = KV_TYPE_F16};
    const char *cache_opt = NULL;
    long v;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "t:p:n:r:d:", options, NULL)) != -1) {
        switch (c) {
            case 't':
                if (cli_parse_long(optarg, 1, THREADPOOL_MAX_THREADS, &v))
                    return cli_fail("bench", "-t: '%s' is not in 1..%u", optarg,
                                    THREADPOOL_MAX_THREADS),
                           2;
                o.threads = (uint32_t)v;
                break;
            case 'p':
                if (cli_parse_long(optarg, 0, 1 << 20, &v))
                    return cli_fail("bench", "-p: '%s' is not a token count", optarg), 2;
                o.n_prompt = (uint32_t)v;
                break;
            case 'n':
                if (cli_parse_long(optarg, 0, 1 << 20, &v))
                    return cli_fail("bench", "-n: '%s' is not a token count", optarg), 2;
                o.n_gen = (uint32_t)v;
                break;
            case 'r':
                if (cli_parse_long(optarg, 1, 1000, &v))
                    return cli_fail("bench", "-r: '%s' is not in 1..1000", optarg), 2;
                o.reps = (uint32_t)v;
                break;
            case 'd':
                if (cli_parse_long(optarg, 0, 1 << 20, &v))
                    return cli_fail("bench", "-d: '%s' is not a token count", optarg), 2;
                o.depth = (uint32_t)v;
                break;
            case OPT_JSON:
                o.json = 1;
                break;
            case OPT_NO_COLD:
                o.cold = 0;
                break;
            case OPT_BW:
                if (cli_parse_long(optarg, 1, 1 << 20, &v))
                    return cli_fail("bench", "--bw-mib: '%s' is not in 1..1048576", optarg), 2;
                o.bw_bytes = (uint64_t)v << 20;
                break;
            case OPT_KV:
                if (strcmp(optarg, "f16") == 0)
                    o.kv = KV_TYPE_F16;
                else if (strcmp(optarg, "f32") == 0)
                    o.kv = KV_TYPE_F32;
                else
                    return cli_fail("bench", "--kv: '%s' is not f16 or f32", optarg), 2;
                break;
            case OPT_CACHE:
                cache_opt = optarg;
                break;
            case OPT_HELP:
                bench_usage(stdout);
                return 0;
            default:
                bench_usage(stderr);
                return 2;
        }
    }
    if (optind != argc - 1) {
        bench_usage(stderr);
        return 2;
    }
    o.path = argv[optind];
    char cache_buf[PATH_MAX];
    if (cli_cache_dir("bench", cache_opt, cache_buf, sizeof cache_buf, &o.cache_dir) != 0) return 2;
    if (o.n_prompt == 0 && o.n_gen == 0) return cli_fail("bench", "-p and -n are both 0"), 2;

    bench_result res = {0};
    cpu_format_features(cpu_detect_features(), res.cpu_features, sizeof res.cpu_features);
    corral_error err = {0};
    const char *path = bench_kernel_path(&err);
    if (!path) return cli_fail("bench", "%s", err.message);
    snprintf(res.cpu_path, sizeof res.cpu_path, "%s", path);
    cli_progress line;
    cli_progress_init(&line, o.path);
    o.progress = &line;
    int rc = bench_run(&o, &res);
    cli_progress_clear(&line);
    if (rc != 0) return rc;
    if (o.json) {
        if (bench_print_json(stdout, &o, &res) != 0)
            return cli_fail("bench", "writing the JSON document failed");
    } else {
        bench_print_human(stdout, &o, &res);
    }
    return 0;
}
