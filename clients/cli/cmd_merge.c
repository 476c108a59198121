/*
 * cmd_merge.c — `corral merge`: merge LoRA adapters into a base model offline and write the
 * merged model, or with --type merge in f32 and quantize the result once. The work is
 * corral_adapters' lora_merge_file and lora_merge_quantize_file (adapters/lora.h), the same code
 * the daemon's cache of merged and quantized models runs; this is its command line.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "corral/quantize.h"
#include "corral/threadpool.h"
#include "lora.h"

static void merge_usage(FILE *out) {
    fprintf(
        out,
        "usage: corral merge BASE.gguf --lora ADAPTER[:SCALE] [--lora ...] [--type TYPE]\n"
        "                    -o OUT.gguf\n"
        "\n"
        "Merge LoRA adapters into a base model: W' = W + sum scale * (alpha/r) * B A, computed\n"
        "in f32 row by row and re-quantized to each tensor's own type. The result is an\n"
        "ordinary model file (a corral image recording its base and adapters).\n"
        "\n"
        "With --type TYPE the base must be full precision (F32, F16, BF16): the merge stays in\n"
        "f32 and the merged model is quantized once to TYPE with llama-quantize's recipe for\n"
        "it (as `corral quantize` would), instead of rounding twice. TYPE: %s.\n"
        "\n"
        "ADAPTER is a llama.cpp GGUF LoRA file or a Hugging Face PEFT directory (with\n"
        "adapter_config.json and adapter_model.safetensors); SCALE defaults to 1. A path that\n"
        "itself ends in ':<number>' needs an explicit scale (path:1:1.0).\n"
        "\n"
        "options:\n"
        "  -l, --lora ADAPTER[:SCALE]  an adapter (repeatable, up to %d)\n"
        "  -o, --output FILE           the merged model to write (required)\n"
        "  --type TYPE                 merge in f32, then quantize to TYPE\n"
        "  -t, --threads N             merging threads (default: physical cores)\n",
        quantize_ftype_names(), LORA_MAX_ADAPTERS);
}

/* Splits "path:scale" at the last ':' when what follows is a number. */
static int parse_adapter(char *arg, lora_source *out) {
    out->path = arg;
    out->scale = 1.0f;
    char *colon = strrchr(arg, ':');
    double scale;
    if (colon && colon != arg && cli_parse_double(colon + 1, -1e6, 1e6, &scale) == 0) {
        *colon = '\0';
        out->scale = (float)scale;
    }
    return out->path[0] ? 0 : -1;
}

int cmd_merge(int argc, char **argv) {
    enum { OPT_HELP = 256, OPT_TYPE };
    static const struct option options[] = {
        {"lora", required_argument, NULL, 'l'},    {"output", required_argument, NULL, 'o'},
        {"threads", required_argument, NULL, 't'}, {"type", required_argument, NULL, OPT_TYPE},
        {"help", no_argument, NULL, OPT_HELP},     {NULL, 0, NULL, 0},
    };
    lora_source src[LORA_MAX_ADAPTERS];
    uint32_t n = 0;
    const char *out = NULL, *type = NULL, *type_name = NULL;
    long threads = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "l:o:t:", options, NULL)) != -1) {
        switch (c) {
            case 'l':
                if (n == LORA_MAX_ADAPTERS)
                    return cli_fail("merge", "at most %d adapters", LORA_MAX_ADAPTERS), 2;
                if (parse_adapter(optarg, &src[n]) != 0)
                    return cli_fail("merge", "--lora: empty adapter path"), 2;
                n++;
                break;
            case 'o':
                out = optarg;
                break;
            case 't':
                if (cli_parse_long(optarg, 1, THREADPOOL_MAX_THREADS, &threads))
                    return cli_fail("merge", "--threads: '%s' is not in 1..%u", optarg,
                                    THREADPOOL_MAX_THREADS),
                           2;
                break;
            case OPT_TYPE: {
                quantize_ftype ft;
                if (quantize_ftype_from_name(optarg, &ft) != 0)
                    return cli_fail("merge", "--type: unknown type '%s' (one of %s)", optarg,
                                    quantize_ftype_names()),
                           2;
                type = optarg;
                type_name = quantize_ftype_name(ft);
                break;
            }
            case OPT_HELP:
                merge_usage(stdout);
                return 0;
            default:
                merge_usage(stderr);
                return 2;
        }
    }
    if (optind >= argc) return cli_fail("merge", "no base model (corral merge BASE.gguf ...)"), 2;
    if (optind + 1 < argc)
        return cli_fail("merge", "unexpected argument '%s'", argv[optind + 1]), 2;
    if (n == 0) return cli_fail("merge", "no adapter (--lora ADAPTER[:SCALE])"), 2;
    if (!out) return cli_fail("merge", "no output file (-o OUT.gguf)"), 2;
    const char *base = argv[optind];

    corral_error err = {0};
    threadpool *pool = threadpool_new((uint32_t)threads, &err);
    if (!pool) return cli_fail("merge", "%s", err.message);
    lora_merge_report rep;
    cli_progress line;
    cli_progress_init(&line, out);
    line.engine_what = type ? "merging and quantizing" : "merging";
    const corral_progress progress = {.fn = cli_progress_engine, .user = &line};
    corral_status st =
        type ? lora_merge_quantize_file_progress(base, src, n, type, out, pool, &progress, &rep,
                                                 &err)
             : lora_merge_file_progress(base, src, n, out, pool, &progress, &rep, &err);
    cli_progress_clear(&line);
    uint32_t nth = threadpool_n_threads(pool);
    threadpool_destroy(&pool);
    if (st != CORRAL_OK) {
        return cli_fail("merge", "%s", err.message);
    }
    fprintf(stderr,
            "corral merge: wrote %s: %u adapter%s, %u of %u tensors merged%s%s, %.1f MiB, "
            "fingerprint %s, %.2f s on %u thread%s\n",
            out, rep.n_adapters, rep.n_adapters == 1 ? "" : "s", rep.n_merged_tensors,
            rep.n_tensors, type ? ", quantized to " : "", type ? type_name : "",
            (double)rep.file_bytes / (1024.0 * 1024.0), rep.fingerprint, rep.seconds, nth,
            nth == 1 ? "" : "s");
    return 0;
}
