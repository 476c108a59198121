/*
 * cmd_logits.c — `corral logits`: the teacher-forced logits of a list of token ids, in the layout
 * of the reference files llama.cpp-based tools and ../shared/reference use (little-endian float32,
 * row-major [n_positions][n_vocab], row i the prediction after ids 0..i), to check a model file
 * against another implementation; and the token-id lists both it and `run-local --prompt-ids`
 * read.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "corral/model.h"
#include "corral/threadpool.h"

int cli_parse_ids(const char *text, size_t len, int32_t **ids, size_t *n, char *why,
                  size_t why_size) {
    size_t cap = 64, count = 0;
    int32_t *out = malloc(cap * sizeof *out);
    if (!out) return snprintf(why, why_size, "out of memory"), -1;
    for (size_t i = 0; i < len;) {
        const char c = text[i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',') {
            i++;
            continue;
        }
        if (c < '0' || c > '9') {
            snprintf(why, why_size, "'%c' at byte %zu is not part of a token id", c, i);
            free(out);
            return -1;
        }
        long long v = 0;
        const size_t start = i;
        while (i < len && text[i] >= '0' && text[i] <= '9' && v <= INT32_MAX)
            v = v * 10 + (text[i++] - '0');
        if (v > INT32_MAX) {
            snprintf(why, why_size, "the id at byte %zu is too large", start);
            free(out);
            return -1;
        }
        if (count == cap) {
            int32_t *grown = realloc(out, 2 * cap * sizeof *out);
            if (!grown) {
                free(out);
                return snprintf(why, why_size, "out of memory"), -1;
            }
            out = grown;
            cap *= 2;
        }
        out[count++] = (int32_t)v;
    }
    if (count == 0) {
        snprintf(why, why_size, "no token ids");
        free(out);
        return -1;
    }
    *ids = out;
    *n = count;
    return 0;
}

static void logits_usage(FILE *out) {
    fprintf(out,
            "usage: corral logits MODEL.gguf --ids FILE -o OUT.f32 [options]\n"
            "\n"
            "Run the token ids of FILE (whitespace- or comma-separated; - for stdin) through the\n"
            "model in one teacher-forced sequence and write the logits of every position as\n"
            "little-endian float32, row-major [positions][n_vocab]: row i is the prediction after\n"
            "ids 0..i, the layout of llama.cpp-made reference files. Compare them with\n"
            "--compare, or with any tool that reads raw floats.\n"
            "\n"
            "options:\n"
            "      --ids FILE          the token ids (required)\n"
            "  -o, --output FILE       where the logits go (required unless --compare)\n"
            "      --last N            only the last N positions' rows (the earlier positions\n"
            "                          still run: a long context checked at its end)\n"
            "      --compare REF.f32   print the largest and rms difference from REF (same\n"
            "                          layout and rows) and how many positions agree on the\n"
            "                          top token\n"
            "      --kv f16|f32        KV cache type (default f32, as the references use)\n"
            "      --reference         exact F32 reference arithmetic (slow; for checking)\n"
            "  -t, --threads N         threads (default: the physical cores; the logits do not\n"
            "                          depend on it)\n");
}

/* Max |a - b|, rms, and the rows whose argmax agrees, over n_rows rows of n_vocab. */
static void compare_rows(const float *a, const float *b, size_t n_rows, size_t n_vocab, double *max,
                         double *rms, size_t *top1) {
    double sq = 0;
    *max = 0;
    *top1 = 0;
    for (size_t r = 0; r < n_rows; r++) {
        const float *x = a + r * n_vocab, *y = b + r * n_vocab;
        size_t ax = 0, ay = 0;
        for (size_t i = 0; i < n_vocab; i++) {
            const double d = fabs((double)x[i] - (double)y[i]);
            if (d > *max || isnan(d)) *max = isnan(d) ? INFINITY : d;
            sq += d * d;
            if (x[i] > x[ax]) ax = i;
            if (y[i] > y[ay]) ay = i;
        }
        *top1 += ax == ay;
    }
    *rms = sqrt(sq / (double)(n_rows * n_vocab));
}

/* Read a whole file ("-": stdin) into a NUL-terminated buffer. */
static char *slurp(const char *path, size_t *len) {
    FILE *fp = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!fp) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, fp);
        if (n < cap) break;
        char *grown = realloc(buf, 2 * cap + 1);
        if (!grown) free(buf);
        buf = grown;
        cap *= 2;
    }
    const int bad = ferror(fp);
    if (fp != stdin) fclose(fp);
    if (!buf || bad) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

int cmd_logits(int argc, char **argv) {
    enum { OPT_IDS = 256, OPT_LAST, OPT_COMPARE, OPT_KV, OPT_REFERENCE, OPT_HELP };
    static const struct option options[] = {
        {"ids", required_argument, NULL, OPT_IDS},
        {"output", required_argument, NULL, 'o'},
        {"last", required_argument, NULL, OPT_LAST},
        {"compare", required_argument, NULL, OPT_COMPARE},
        {"kv", required_argument, NULL, OPT_KV},
        {"reference", no_argument, NULL, OPT_REFERENCE},
        {"threads", required_argument, NULL, 't'},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    const char *ids_path = NULL, *out_path = NULL, *compare = NULL;
    long last = 0, n_threads = 0;
    kv_type kvt = KV_TYPE_F32;
    model_params mp = model_params_default();
    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, "o:t:", options, NULL)) != -1) {
        switch (opt) {
            case OPT_IDS:
                ids_path = optarg;
                break;
            case 'o':
                out_path = optarg;
                break;
            case OPT_LAST:
                if (cli_parse_long(optarg, 1, 1 << 24, &last))
                    return cli_fail("logits", "--last: '%s' is not a count", optarg), 2;
                break;
            case OPT_COMPARE:
                compare = optarg;
                break;
            case OPT_KV:
                if (strcmp(optarg, "f16") == 0)
                    kvt = KV_TYPE_F16;
                else if (strcmp(optarg, "f32") == 0)
                    kvt = KV_TYPE_F32;
                else
                    return cli_fail("logits", "--kv: '%s' is not f16 or f32", optarg), 2;
                break;
            case OPT_REFERENCE:
                mp.compute = MODEL_COMPUTE_REFERENCE;
                break;
            case 't':
                if (cli_parse_long(optarg, 1, THREADPOOL_MAX_THREADS, &n_threads))
                    return cli_fail("logits", "--threads: '%s' is not in 1..%u", optarg,
                                    THREADPOOL_MAX_THREADS),
                           2;
                break;
            case OPT_HELP:
                logits_usage(stdout);
                return 0;
            default:
                logits_usage(stderr);
                return 2;
        }
    }
    if (optind != argc - 1 || !ids_path || (!out_path && !compare)) {
        logits_usage(stderr);
        return 2;
    }
    size_t len = 0, n_ids = 0;
    char *text = slurp(ids_path, &len);
    if (!text) return cli_fail("logits", "cannot read %s: %s", ids_path, strerror(errno));
    int32_t *ids = NULL;
    char why[160];
    const int bad = cli_parse_ids(text, len, &ids, &n_ids, why, sizeof why);
    free(text);
    if (bad) return cli_fail("logits", "%s: %s", ids_path, why), 2;
    if (last == 0 || (size_t)last > n_ids) last = (long)n_ids;

    corral_error err;
    model *m = model_load(argv[optind], &mp, &err);
    threadpool *pool = NULL;
    kv_cache *kv = NULL;
    model_runner *r = NULL;
    FILE *out = NULL;
    float *rows = NULL, *ref = NULL;
    int status = 1;
    if (!m) {
        cli_fail("logits", "%s", err.message);
        goto done;
    }
    const uint32_t n_vocab = model_get_hparams(m)->n_vocab;
    if (n_ids > model_get_hparams(m)->n_ctx_train) {
        cli_fail("logits", "%zu ids exceed the model's context of %u", n_ids,
                 model_get_hparams(m)->n_ctx_train);
        goto done;
    }
    /* The rows asked for in one buffer (what --compare needs anyway); the positions before them
     * run without logits. */
    rows = malloc((size_t)last * n_vocab * sizeof *rows);
    pool = rows ? threadpool_new((uint32_t)n_threads, &err) : NULL;
    kv = pool ? kv_cache_new(m, (uint32_t)n_ids, kvt, &err) : NULL;
    r = kv ? model_runner_new(m, 0, pool, &err) : NULL;
    if (!r) {
        cli_fail("logits", "%s", rows ? err.message : "out of memory for the logits");
        goto done;
    }
    const size_t first = n_ids - (size_t)last;
    if ((first > 0 &&
         model_forward(r, kv, ids, (uint32_t)first, MODEL_LOGITS_NONE, NULL, &err) != CORRAL_OK) ||
        model_forward(r, kv, ids + first, (uint32_t)last, MODEL_LOGITS_ALL, rows, &err) !=
            CORRAL_OK) {
        cli_fail("logits", "%s", err.message);
        goto done;
    }
    const size_t n_floats = (size_t)last * n_vocab;
    if (out_path) {
        out = fopen(out_path, "wb");
        if (!out || fwrite(rows, sizeof *rows, n_floats, out) != n_floats || fclose(out) != 0) {
            out = NULL;
            cli_fail("logits", "cannot write %s: %s", out_path, strerror(errno));
            goto done;
        }
        out = NULL;
        fprintf(stderr, "corral logits: wrote %s: %ld positions (%zu..%zu) x %u logits\n", out_path,
                last, first, n_ids - 1, n_vocab);
    }
    if (compare) {
        size_t ref_len = 0;
        ref = (float *)slurp(compare, &ref_len);
        if (!ref || ref_len != n_floats * sizeof *rows) {
            cli_fail("logits", "%s: %zu bytes, not the %zu of %ld rows of %u floats", compare,
                     ref ? ref_len : 0, n_floats * sizeof *rows, last, n_vocab);
            goto done;
        }
        double max, rms;
        size_t top1;
        compare_rows(rows, ref, (size_t)last, n_vocab, &max, &rms, &top1);
        printf("max_abs_diff %.6g\nrms_diff %.6g\ntop1_agree %zu/%ld\n", max, rms, top1, last);
    }
    status = 0;
done:
    if (out) fclose(out);
    free(ref);
    free(rows);
    free(ids);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
    threadpool_destroy(&pool);
    model_destroy(&m);
    return status;
}
