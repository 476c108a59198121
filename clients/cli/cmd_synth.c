/*
 * cmd_synth.c — `corral synth`: write a synthetic model (real shape, random weights) for benchmarks
 * and tests. The work is corral_synth's (engine/include/corral/synth.h); this is its command line.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "corral/synth.h"
#include "lora.h"
#include "corral/tensor.h"

static void synth_usage(FILE *out) {
    fprintf(
        out,
        "usage: corral synth (--like PRESET | --n-embd N ...) --type TYPE [options] -o OUT.gguf\n"
        "       corral synth --lora-for BASE.gguf [--rank R] [--alpha A] [--seed N] -o OUT.gguf\n"
        "\n"
        "Write a GGUF model with the shape of a real one and random weights (deterministic:\n"
        "the same arguments give the same bytes). Tensor types follow llama-quantize's rules\n"
        "(output.weight Q6_K, the _M mixes' attn_v/ffn_down, shape fallbacks) unless --pure.\n"
        "\n"
        "options:\n"
        "      --like PRESET       shape of a real model: %s\n"
        "      --type TYPE         %s\n"
        "      --pure              every 2-D weight in TYPE (llama-quantize --pure)\n"
        "      --vocab-from FILE   copy the tokenizer of this GGUF file (padded to n_vocab);\n"
        "                          default: a generated SentencePiece vocabulary\n"
        "      --seed N            weight seed (default 1)\n"
        "  -o, --output FILE       the model to write (required)\n"
        "      --name TEXT         general.name\n"
        "  -t, --threads N         generating threads (default: physical cores)\n"
        "shape (override the preset, or give all of them without --like):\n"
        "      --arch ARCH         %s: the tensors and keys of that architecture\n"
        "                          (qwen2: Q/K/V biases; qwen3: q/k norms; gemma3: q/k and\n"
        "                          post norms; phi3: fused attn_qkv and gate+up)\n"
        "      --n-embd N --n-layer N --n-head N --n-head-kv N --n-ff N\n"
        "      --n-vocab N --n-ctx N --rope-base F --rms-eps F\n"
        "      --head-dim N        attention.key_length when not n-embd / n-head (0: that)\n"
        "      --n-swa N           gemma3: sliding window of N positions (0: none)\n"
        "      --swa-pattern N     gemma3: layer i slides iff N is 0 or i %% N < N - 1\n"
        "      --tied              no output.weight: the output projection is token_embd\n"
        "      --untied            a separate output.weight\n"
        "a LoRA adapter instead (llama.cpp's GGUF-LoRA format, F32 factors of standard\n"
        "deviation 0.02 on every attention and feed-forward projection of BASE):\n"
        "      --lora-for BASE     the model the adapter is for\n"
        "      --rank R            1..4096 (default 16)\n"
        "      --alpha A           its alpha (default 2 x rank)\n",
        synth_preset_names(), "f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k q4_k_m q5_k_m",
        synth_arch_names());
}

int cmd_synth(int argc, char **argv) {
    enum {
        OPT_LIKE = 256,
        OPT_TYPE,
        OPT_PURE,
        OPT_VOCAB,
        OPT_SEED,
        OPT_NAME,
        OPT_ARCH,
        OPT_EMBD,
        OPT_LAYER,
        OPT_HEAD,
        OPT_HEAD_KV,
        OPT_FF,
        OPT_VOCAB_N,
        OPT_CTX,
        OPT_ROPE,
        OPT_EPS,
        OPT_TIED,
        OPT_UNTIED,
        OPT_LORA_FOR,
        OPT_RANK,
        OPT_ALPHA,
        OPT_HEAD_DIM,
        OPT_SWA,
        OPT_SWA_PATTERN,
        OPT_HELP
    };
    static const struct option options[] = {
        {"like", required_argument, NULL, OPT_LIKE},
        {"type", required_argument, NULL, OPT_TYPE},
        {"pure", no_argument, NULL, OPT_PURE},
        {"vocab-from", required_argument, NULL, OPT_VOCAB},
        {"seed", required_argument, NULL, OPT_SEED},
        {"output", required_argument, NULL, 'o'},
        {"name", required_argument, NULL, OPT_NAME},
        {"threads", required_argument, NULL, 't'},
        {"arch", required_argument, NULL, OPT_ARCH},
        {"n-embd", required_argument, NULL, OPT_EMBD},
        {"n-layer", required_argument, NULL, OPT_LAYER},
        {"n-head", required_argument, NULL, OPT_HEAD},
        {"n-head-kv", required_argument, NULL, OPT_HEAD_KV},
        {"n-ff", required_argument, NULL, OPT_FF},
        {"n-vocab", required_argument, NULL, OPT_VOCAB_N},
        {"n-ctx", required_argument, NULL, OPT_CTX},
        {"rope-base", required_argument, NULL, OPT_ROPE},
        {"rms-eps", required_argument, NULL, OPT_EPS},
        {"tied", no_argument, NULL, OPT_TIED},
        {"untied", no_argument, NULL, OPT_UNTIED},
        {"lora-for", required_argument, NULL, OPT_LORA_FOR},
        {"rank", required_argument, NULL, OPT_RANK},
        {"alpha", required_argument, NULL, OPT_ALPHA},
        {"head-dim", required_argument, NULL, OPT_HEAD_DIM},
        {"n-swa", required_argument, NULL, OPT_SWA},
        {"swa-pattern", required_argument, NULL, OPT_SWA_PATTERN},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    /* The preset goes first and explicit dimensions over it, whatever the order on the line, so
     * options are collected in one pass and applied in a second. */
    const char *like = NULL, *type_name = NULL, *out = NULL;
    synth_params p = synth_params_default();
    struct {
        int set;
        long value;
    } dims[OPT_CTX - OPT_EMBD + 1] = {{0}};
    static const char *const dim_names[] = {"n-embd", "n-layer", "n-head", "n-head-kv",
                                            "n-ff",   "n-vocab", "n-ctx"};
    const char *arch = NULL, *lora_for = NULL;
    long rank = 16;
    double alpha = 0;
    int tied = -1;
    long head_dim = -1, n_swa = -1, swa_pattern = -1;
    double rope = 0, eps = 0;
    long v;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "o:t:", options, NULL)) != -1) {
        switch (c) {
            case OPT_LIKE:
                like = optarg;
                break;
            case OPT_TYPE:
                type_name = optarg;
                break;
            case OPT_PURE:
                p.pure = 1;
                break;
            case OPT_VOCAB:
                p.vocab_from = optarg;
                break;
            case OPT_SEED: {
                char *end;
                unsigned long long s = strtoull(optarg, &end, 10);
                if (!*optarg || *end || optarg[0] == '-')
                    return cli_fail("synth", "--seed: '%s' is not a whole number", optarg), 2;
                p.seed = s;
                break;
            }
            case 'o':
                out = optarg;
                break;
            case OPT_NAME:
                snprintf(p.name, sizeof p.name, "%s", optarg);
                break;
            case 't':
                if (cli_parse_long(optarg, 1, 512, &v))
                    return cli_fail("synth", "--threads: '%s' is not in 1..512", optarg), 2;
                p.n_threads = (uint32_t)v;
                break;
            case OPT_ARCH:
                if (strlen(optarg) >= sizeof p.arch)
                    return cli_fail("synth", "--arch: unknown arch '%s' (known: %s)", optarg,
                                    synth_arch_names()),
                           2;
                arch = optarg; /* checked with the other parameters (synth_validate) */
                break;
            case OPT_HEAD_DIM:
            case OPT_SWA:
            case OPT_SWA_PATTERN:
                if (cli_parse_long(optarg, 0, 1u << 24, &v))
                    return cli_fail("synth", "--%s: '%s' is not a whole number in 0..2^24",
                                    c == OPT_HEAD_DIM ? "head-dim"
                                    : c == OPT_SWA    ? "n-swa"
                                                      : "swa-pattern",
                                    optarg),
                           2;
                *(c == OPT_HEAD_DIM ? &head_dim : c == OPT_SWA ? &n_swa : &swa_pattern) = v;
                break;
            case OPT_EMBD:
            case OPT_LAYER:
            case OPT_HEAD:
            case OPT_HEAD_KV:
            case OPT_FF:
            case OPT_VOCAB_N:
            case OPT_CTX:
                if (cli_parse_long(optarg, 1, UINT32_MAX, &v))
                    return cli_fail("synth", "--%s: '%s' is not a positive whole number",
                                    dim_names[c - OPT_EMBD], optarg),
                           2;
                dims[c - OPT_EMBD].set = 1;
                dims[c - OPT_EMBD].value = v;
                break;
            case OPT_ROPE:
                if (cli_parse_double(optarg, 1.0, 1e30, &rope) || rope <= 1.0)
                    return cli_fail("synth", "--rope-base: '%s' must be a number above 1", optarg),
                           2;
                break;
            case OPT_EPS:
                if (cli_parse_double(optarg, 0.0, 1.0, &eps) || eps <= 0.0 || eps >= 1.0)
                    return cli_fail("synth", "--rms-eps: '%s' must be in (0, 1)", optarg), 2;
                break;
            case OPT_TIED:
                tied = 1;
                break;
            case OPT_UNTIED:
                tied = 0;
                break;
            case OPT_LORA_FOR:
                lora_for = optarg;
                break;
            case OPT_RANK:
                if (cli_parse_long(optarg, 1, 4096, &rank))
                    return cli_fail("synth", "--rank: '%s' is not in 1..4096", optarg), 2;
                break;
            case OPT_ALPHA:
                if (cli_parse_double(optarg, 1e-6, 1e6, &alpha))
                    return cli_fail("synth", "--alpha: '%s' must be a number in (0, 1e6]", optarg),
                           2;
                break;
            case OPT_HELP:
                synth_usage(stdout);
                return 0;
            default:
                synth_usage(stderr);
                return 2;
        }
    }
    if (optind < argc) return cli_fail("synth", "unexpected argument '%s'", argv[optind]), 2;
    if (!out) return cli_fail("synth", "no output file (-o OUT.gguf)"), 2;
    corral_error err = {0};
    if (lora_for) {
        const lora_synth_params lp = {.base_path = lora_for,
                                      .rank = (uint32_t)rank,
                                      .alpha = alpha > 0 ? (float)alpha : 2.0f * (float)rank,
                                      .targets = LORA_SYNTH_ALL_LINEAR,
                                      .seed = p.seed,
                                      .a_std = 0.02f,
                                      .b_std = 0.02f,
                                      .type = TENSOR_TYPE_F32};
        if (lora_synth_write(&lp, out, &err) != CORRAL_OK) {
            cli_fail("synth", "%s", err.message);
            return err.status == CORRAL_INVALID_ARGUMENT ? 2 : 1;
        }
        fprintf(stderr, "corral synth: wrote %s: LoRA rank %ld for %s\n", out, rank, lora_for);
        return 0;
    }
    if (!type_name) return cli_fail("synth", "no --type"), 2;
    if (synth_type_parse(type_name, &p.type, &err) != CORRAL_OK)
        return cli_fail("synth", "--type: %s", err.message), 2;
    if (like) {
        if (synth_params_set_preset(&p, like, &err) != CORRAL_OK)
            return cli_fail("synth", "--like: %s", err.message), 2;
    } else {
        /* Without a preset every dimension must be given: silently using the small defaults
         * for a forgotten one would make a model of the wrong size. */
        for (int i = 0; i <= OPT_CTX - OPT_EMBD; i++) {
            if (!dims[i].set)
                return cli_fail("synth", "without --like, --%s is required", dim_names[i]), 2;
        }
    }
    uint32_t *fields[] = {&p.n_embd, &p.n_layer, &p.n_head, &p.n_head_kv,
                          &p.n_ff,   &p.n_vocab, &p.n_ctx};
    for (int i = 0; i <= OPT_CTX - OPT_EMBD; i++) {
        if (dims[i].set) *fields[i] = (uint32_t)dims[i].value;
    }
    if (arch) snprintf(p.arch, sizeof p.arch, "%s", arch);
    if (rope > 0) p.rope_base = (float)rope;
    if (eps > 0) p.rms_eps = (float)eps;
    if (tied >= 0) p.tied = tied;
    if (head_dim >= 0) p.head_dim = (uint32_t)head_dim;
    if (n_swa >= 0) p.n_swa = (uint32_t)n_swa;
    if (swa_pattern >= 0) p.swa_pattern = (uint32_t)swa_pattern;

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    synth_report rep;
    cli_progress line;
    cli_progress_init(&line, out);
    line.engine_what = "writing";
    p.progress = (corral_progress){.fn = cli_progress_engine, .user = &line};
    const corral_status written = synth_write(&p, out, &rep, &err);
    cli_progress_clear(&line);
    if (written != CORRAL_OK) {
        cli_fail("synth", "%s", err.message);
        return err.status == CORRAL_INVALID_ARGUMENT ? 2 : 1; /* bad shape: a usage error */
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    fprintf(stderr,
            "corral synth: wrote %s: %s %s%s, %u layers x %u, vocab %u, %u tensors, %.3f G params, "
            "%.1f MiB, %.1f s\n",
            out, p.arch, synth_type_name(p.type), p.pure ? " (pure)" : "", p.n_layer, p.n_embd,
            p.n_vocab, rep.n_tensors, (double)rep.n_params * 1e-9,
            (double)rep.file_bytes / (1024.0 * 1024.0), secs);
    return 0;
}
