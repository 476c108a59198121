/*
 * cmd_local.c — the engine's own tools, no daemon needed: `corral run-local`,
 * `corral tokenize-local`, `corral perplexity` (and its KL divergence from a base model) and
 * `corral imatrix`. They use the same engine code as corrald.
 */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "corral/chat.h"
#include "corral/constraint.h"
#include "corral/eval.h"
#include "corral/generate.h"
#include "corral/imatrix.h"
#include "corral/model.h"
#include "corral/prompt.h"
#include "corral/threadpool.h"
#include "corral/tokenizer.h"

static double seconds_since(const struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) * 1e-9;
}

static void print_ids(FILE *out, const char *label, const int32_t *ids, size_t n) {
    fprintf(out, "%s:", label);
    for (size_t i = 0; i < n; i++) fprintf(out, " %d", ids[i]);
    fputc('\n', out);
}

/* ---- run-local ------------------------------------------------------------------------------ */

static void run_local_usage(FILE *out) {
    fprintf(out,
            "usage: corral run-local MODEL.gguf (-p PROMPT | --prompt-ids IDS) [options]\n"
            "\n"
            "Generate text with a model file in this process. The prompt (as given) and the\n"
            "generated text go to stdout; statistics (prompt and generation tokens/s, memory) to\n"
            "stderr.\n"
            "\n"
            "options:\n"
            "  -p, --prompt TEXT       the prompt\n"
            "      --prompt-ids IDS    the prompt as token ids (\"1 2 3\" or \"1,2,3\"), run as\n"
            "                          given (no BOS added); only the generated text is printed.\n"
            "                          With --temp 0 --ids: greedy ids to compare with references\n"
            "  -n, --max-tokens N      tokens to generate (default 128; 0 = until the end)\n"
            "      --temp T            temperature (default 0.8; 0 = greedy)\n"
            "      --top-k K           (default 40; 0 = off)\n"
            "      --top-p P           (default 0.95; 1 = off)\n"
            "      --min-p P           (default 0.05; 0 = off)\n"
            "      --repeat-penalty R  (default 1 = off)\n"
            "      --seed S            sampling seed (default: from the clock)\n"
            "      --stop TEXT         stop before this text (repeatable)\n"
            "      --regex R           the whole output must match the regular expression R\n"
            "                          (ECMAScript-like: classes, \\d \\w \\s, groups, |,\n"
            "                          * + ? {m,n}; no backreferences or lookaround)\n"
            "      --json-schema FILE  the output is a JSON document this JSON Schema validates\n"
            "  -c, --ctx N             context size (default: the prompt and -n tokens; with\n"
            "                          -n 0, the model's own, as much as half the RAM holds)\n"
            "      --chat              treat the prompt as a user message in the model's chat\n"
            "                          template (and print only the reply)\n"
            "      --system TEXT       system message for --chat\n"
            "      --template NAME     chat template instead of the model's (chatml, llama2,\n"
            "                          llama3, llama3-instruct, qwen3, gemma3, mistral-v1, phi3,\n"
            "                          gemma, zephyr, ...)\n"
            "      --ignore-eos        keep generating past end-of-generation tokens\n"
            "      --ids               also print the prompt and generated token ids (stderr)\n"
            "      --kv f16|f32        KV cache type (default f16)\n"
            "      --reference         exact F32 reference arithmetic (slow; for checking)\n"
            "      --cache-dir DIR     where weights rearranged for the kernels are kept\n"
            "                          between runs (default: $CORRAL_CACHE_DIR, else the\n"
            "                          user's $XDG_CACHE_HOME/corral, as corrald's; 'none':\n"
            "                          rearranged in memory at every run)\n"
            "  -t, --threads N         threads for the forward pass (default: the number of\n"
            "                          physical cores; the output does not depend on it)\n");
}

/* The context when --ctx is not given: the prompt and the tokens asked for, within the model's
 * own; with no limit on the tokens (-n 0), the model's own context, less if a KV cache of that
 * many positions would take more than half the machine's memory. */
static uint32_t default_context(const model *m, kv_type kvt, size_t n_prompt, uint32_t max_tokens) {
    const uint32_t train = model_get_hparams(m)->n_ctx_train;
    if (max_tokens > 0) {
        const uint64_t want = (uint64_t)n_prompt + max_tokens + 1;
        return want < train ? (uint32_t)want : train;
    }
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const uint64_t half = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 2 : 0;
    uint32_t ctx = train;
    while (half && ctx > n_prompt + 1 && ctx > 256 && kv_cache_bytes_for(m, ctx, kvt) > half)
        ctx /= 2;
    if (ctx < train)
        fprintf(stderr,
                "corral run-local: context %u of the model's %u (a KV cache of %u "
                "positions takes more than half the memory; --ctx sets it)\n",
                ctx, train, train);
    return ctx;
}

int cmd_run_local(int argc, char **argv) {
    enum {
        OPT_TEMP = 256,
        OPT_TOP_K,
        OPT_TOP_P,
        OPT_MIN_P,
        OPT_REPEAT,
        OPT_SEED,
        OPT_STOP,
        OPT_CHAT,
        OPT_SYSTEM,
        OPT_TEMPLATE,
        OPT_IGNORE_EOS,
        OPT_IDS,
        OPT_KV,
        OPT_REFERENCE,
        OPT_REGEX,
        OPT_JSON_SCHEMA,
        OPT_PROMPT_IDS,
        OPT_CACHE,
        OPT_HELP
    };
    static const struct option options[] = {
        {"prompt", required_argument, NULL, 'p'},
        {"max-tokens", required_argument, NULL, 'n'},
        {"ctx", required_argument, NULL, 'c'},
        {"threads", required_argument, NULL, 't'},
        {"temp", required_argument, NULL, OPT_TEMP},
        {"top-k", required_argument, NULL, OPT_TOP_K},
        {"top-p", required_argument, NULL, OPT_TOP_P},
        {"min-p", required_argument, NULL, OPT_MIN_P},
        {"repeat-penalty", required_argument, NULL, OPT_REPEAT},
        {"seed", required_argument, NULL, OPT_SEED},
        {"stop", required_argument, NULL, OPT_STOP},
        {"chat", no_argument, NULL, OPT_CHAT},
        {"system", required_argument, NULL, OPT_SYSTEM},
        {"template", required_argument, NULL, OPT_TEMPLATE},
        {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
        {"ids", no_argument, NULL, OPT_IDS},
        {"kv", required_argument, NULL, OPT_KV},
        {"reference", no_argument, NULL, OPT_REFERENCE},
        {"regex", required_argument, NULL, OPT_REGEX},
        {"json-schema", required_argument, NULL, OPT_JSON_SCHEMA},
        {"prompt-ids", required_argument, NULL, OPT_PROMPT_IDS},
        {"cache-dir", required_argument, NULL, OPT_CACHE},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    const char *prompt = NULL, *system = NULL, *template_name = NULL, *regex = NULL;
    const char *schema_path = NULL;
    const char *prompt_ids = NULL;
    const char *cache_opt = NULL;
    const char *stops[16];
    size_t n_stops = 0;
    long max_tokens = 128, n_ctx = 0, n_threads = 0;
    int chat = 0, show_ids = 0, seed_given = 0;
    gen_params gp = gen_params_default();
    model_params mp = model_params_default();
    kv_type kvt = KV_TYPE_F16;
    double d;
    long l;

    optind = 1;
    int opt;
    while ((opt = getopt_long(argc, argv, "p:n:c:t:", options, NULL)) != -1) {
        switch (opt) {
            case 'p':
                prompt = optarg;
                break;
            case 'n':
                if (cli_parse_long(optarg, 0, 1 << 20, &max_tokens))
                    return cli_fail("run-local", "-n: '%s' is not a count", optarg), 2;
                break;
            case 'c':
                if (cli_parse_long(optarg, 1, 1 << 24, &n_ctx))
                    return cli_fail("run-local", "--ctx: '%s' is not a size", optarg), 2;
                break;
            case 't':
                if (cli_parse_long(optarg, 1, THREADPOOL_MAX_THREADS, &n_threads))
                    return cli_fail("run-local", "--threads: '%s' is not in 1..%u", optarg,
                                    THREADPOOL_MAX_THREADS),
                           2;
                break;
            case OPT_TEMP:
                if (cli_parse_double(optarg, 0, 100, &d))
                    return cli_fail("run-local", "--temp: '%s' is not in [0, 100]", optarg), 2;
                gp.sampling.temperature = (float)d;
                break;
            case OPT_TOP_K:
                if (cli_parse_long(optarg, 0, 1 << 24, &l))
                    return cli_fail("run-local", "--top-k: '%s' is not a count", optarg), 2;
                gp.sampling.top_k = (int32_t)l;
                break;
            case OPT_TOP_P:
                if (cli_parse_double(optarg, 0, 1, &d))
                    return cli_fail("run-local", "--top-p: '%s' is not in (0, 1]", optarg), 2;
                gp.sampling.top_p = (float)d;
                break;
            case OPT_MIN_P:
                if (cli_parse_double(optarg, 0, 1, &d))
                    return cli_fail("run-local", "--min-p: '%s' is not in [0, 1]", optarg), 2;
                gp.sampling.min_p = (float)d;
                break;
            case OPT_REPEAT:
                if (cli_parse_double(optarg, 0, 100, &d))
                    return cli_fail("run-local", "--repeat-penalty: '%s' is not valid", optarg), 2;
                gp.sampling.repeat_penalty = (float)d;
                break;
            case OPT_SEED:
                if (cli_parse_long(optarg, 0, 0x7fffffffffffffffL, &l))
                    return cli_fail("run-local", "--seed: '%s' is not a number", optarg), 2;
                gp.sampling.seed = (uint64_t)l;
                seed_given = 1;
                break;
            case OPT_STOP:
                if (n_stops == sizeof stops / sizeof stops[0])
                    return cli_fail("run-local", "at most 16 --stop strings"), 2;
                stops[n_stops++] = optarg;
                break;
            case OPT_CHAT:
                chat = 1;
                break;
            case OPT_SYSTEM:
                system = optarg;
                break;
            case OPT_TEMPLATE:
                template_name = optarg;
                break;
            case OPT_IGNORE_EOS:
                gp.ignore_eog = 1;
                break;
            case OPT_IDS:
                show_ids = 1;
                break;
            case OPT_KV:
                if (strcmp(optarg, "f16") == 0)
                    kvt = KV_TYPE_F16;
                else if (strcmp(optarg, "f32") == 0)
                    kvt = KV_TYPE_F32;
                else
                    return cli_fail("run-local", "--kv: '%s' is not f16 or f32", optarg), 2;
                break;
            case OPT_REFERENCE:
                mp.compute = MODEL_COMPUTE_REFERENCE;
                break;
            case OPT_REGEX:
                regex = optarg;
                break;
            case OPT_JSON_SCHEMA:
                schema_path = optarg;
                break;
            case OPT_PROMPT_IDS:
                prompt_ids = optarg;
                break;
            case OPT_CACHE:
                cache_opt = optarg;
                break;
            case OPT_HELP:
                run_local_usage(stdout);
                return 0;
            default:
                run_local_usage(stderr);
                return 2;
        }
    }
    if (optind != argc - 1 || !prompt == !prompt_ids) {
        run_local_usage(stderr);
        return 2;
    }
    if ((system || template_name) && !chat)
        return cli_fail("run-local", "--system and --template need --chat"), 2;
    if (regex && schema_path)
        return cli_fail("run-local", "--regex and --json-schema cannot be used together"), 2;
    if (prompt_ids && chat) return cli_fail("run-local", "--prompt-ids is not a chat message"), 2;
    const char *path = argv[optind];
    char cache_buf[PATH_MAX];
    if (cli_cache_dir("run-local", cache_opt, cache_buf, sizeof cache_buf, &mp.cache_dir) != 0)
        return 2;
    if (!seed_given) gp.sampling.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    gp.max_tokens = (uint32_t)max_tokens;
    gp.stop = stops;
    gp.n_stop = n_stops;

    struct timespec t_load;
    clock_gettime(CLOCK_MONOTONIC, &t_load);
    corral_error err;
    model *m = model_load(path, &mp, &err);
    if (!m) return cli_fail("run-local", "%s", err.message);
    const double load_s = seconds_since(&t_load);
    const model_hparams *hp = model_get_hparams(m);
    const tokenizer *tok = model_get_tokenizer(m);

    int status = 1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    kv_cache *kv = NULL;
    threadpool *pool = NULL;
    model_runner *r = NULL;
    generator *g = NULL;
    constraint_index *cix = NULL;
    constraint *con = NULL;
    constraint_matcher *matcher = NULL;
    sampler_processor proc;
    if (regex || schema_path) {
        size_t len = regex ? strlen(regex) : 0;
        char *schema = NULL;
        if (schema_path) {
            FILE *fp = fopen(schema_path, "rb");
            schema = fp ? cli_read_stream(fp, &len) : NULL;
            if (fp) fclose(fp);
            if (!schema) {
                cli_fail("run-local", "--json-schema: cannot read %s", schema_path);
                goto done;
            }
        }
        cix = constraint_index_new(tok, &err);
        con = cix ? constraint_compile_as(cix, schema ? CONSTRAINT_JSON_SCHEMA : CONSTRAINT_REGEX,
                                          schema ? schema : regex, len, &err)
                  : NULL;
        free(schema);
        matcher = con ? constraint_matcher_new(con, &err) : NULL;
        if (!matcher) {
            cli_fail("run-local", "%s: %s", schema_path ? "--json-schema" : "--regex", err.message);
            goto done;
        }
        proc = constraint_matcher_processor(matcher);
        gp.processor = &proc;
    }
    if (chat) {
        chat_template tmpl;
        if (template_name) {
            tmpl = chat_template_from_name(template_name, &err);
            if (tmpl == CHAT_TEMPLATE_UNKNOWN) {
                cli_fail("run-local", "%s", err.message);
                goto done;
            }
        } else {
            tmpl = prompt_file_chat_template(model_get_gguf(m));
        }
        chat_message msgs[2];
        size_t n_msgs = 0;
        if (system) msgs[n_msgs++] = (chat_message){.role = "system", .content = system};
        msgs[n_msgs++] = (chat_message){.role = "user", .content = prompt};
        if (prompt_tokenize_chat(tok, tmpl, msgs, n_msgs, &ids, &n_ids, &err) != CORRAL_OK) {
            cli_fail("run-local", "%s", err.message);
            goto done;
        }
    } else if (prompt_ids) {
        char why[160];
        if (cli_parse_ids(prompt_ids, strlen(prompt_ids), &ids, &n_ids, why, sizeof why)) {
            cli_fail("run-local", "--prompt-ids: %s", why);
            status = 2;
            goto done;
        }
        for (size_t i = 0; i < n_ids; i++)
            if (ids[i] >= (int32_t)hp->n_vocab) {
                cli_fail("run-local",
                         "--prompt-ids: id %d at index %zu is outside the vocabulary "
                         "(%u)",
                         ids[i], i, hp->n_vocab);
                status = 2;
                goto done;
            }
    } else if (prompt_tokenize_text(tok, prompt, strlen(prompt), &ids, &n_ids, &err) != CORRAL_OK) {
        cli_fail("run-local", "%s", err.message);
        goto done;
    }
    if (n_ids == 0) {
        cli_fail("run-local", "the prompt is empty and the model adds no BOS token");
        goto done;
    }
    uint32_t ctx = (uint32_t)n_ctx;
    if (!n_ctx) ctx = default_context(m, kvt, n_ids, (uint32_t)max_tokens);
    if (ctx > hp->n_ctx_train) {
        cli_fail("run-local", "--ctx %u exceeds the model's context of %u", ctx, hp->n_ctx_train);
        goto done;
    }
    if (n_ids >= ctx) {
        cli_fail("run-local", "the prompt has %zu tokens; the context holds %u", n_ids, ctx);
        goto done;
    }
    kv = kv_cache_new(m, ctx, kvt, &err);
    pool = kv ? threadpool_new((uint32_t)n_threads, &err) : NULL;
    r = pool ? model_runner_new(m, 0, pool, &err) : NULL;
    g = r ? gen_new(m, r, kv, &gp, &err) : NULL;
    if (!g) {
        cli_fail("run-local", "%s", err.message);
        goto done;
    }
    if (show_ids) print_ids(stderr, "prompt_ids", ids, n_ids);
    if (!chat && prompt) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    if (gen_prefill(g, ids, (uint32_t)n_ids, &err) != CORRAL_OK) {
        cli_fail("run-local", "%s", err.message);
        goto done;
    }
    int32_t *out_ids = malloc(((size_t)max_tokens + 1) * sizeof *out_ids);
    size_t n_out = 0;
    gen_token t;
    do {
        if (gen_next(g, &t, &err) != CORRAL_OK) {
            free(out_ids);
            cli_fail("run-local", "%s", err.message);
            goto done;
        }
        if (t.id >= 0 && out_ids && (max_tokens == 0 || n_out < (size_t)max_tokens + 1))
            out_ids[n_out++] = t.id;
        fwrite(t.text, 1, t.len, stdout);
        fflush(stdout);
        if (max_tokens == 0 && out_ids && n_out % 1024 == 0) {
            int32_t *grown = realloc(out_ids, (n_out + 1025) * sizeof *out_ids);
            if (!grown) free(out_ids);
            out_ids = grown;
        }
    } while (t.stop == GEN_STOP_NONE);
    fputc('\n', stdout);
    if (show_ids && out_ids) print_ids(stderr, "generated_ids", out_ids, n_out);
    free(out_ids);

    const gen_stats *s = gen_get_stats(g);
    fprintf(stderr,
            "\nstop: %s\nload: %.1f ms\nprompt: %u tokens, %.1f tok/s\n"
            "generation: %u tokens, %.1f tok/s\nthreads: %u\n"
            "memory: weights %.1f MiB (mapped), KV cache %.1f MiB (%s, %u positions)\n",
            gen_stop_name(t.stop), load_s * 1e3, s->n_prompt,
            s->prefill_ns ? s->n_prompt / (s->prefill_ns * 1e-9) : 0.0, s->n_generated,
            s->decode_ns ? s->n_generated / (s->decode_ns * 1e-9) : 0.0, threadpool_n_threads(pool),
            model_weight_bytes(m) / 1048576.0, kv_cache_bytes(kv) / 1048576.0,
            kvt == KV_TYPE_F16 ? "f16" : "f32", ctx);
    status = 0;
done:
    gen_destroy(&g);
    constraint_matcher_destroy(&matcher);
    constraint_destroy(&con);
    constraint_index_destroy(&cix);
    model_runner_destroy(&r);
    threadpool_destroy(&pool);
    kv_cache_destroy(&kv);
    free(ids);
    model_destroy(&m);
    return status;
}

/* ---- tokenize-local ------------------------------------------------------------------------- */

int cmd_tokenize_local(int argc, char **argv) {
    int parse_special = 0, no_bos = 0;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--parse-special") == 0)
            parse_special = 1;
        else if (strcmp(argv[i], "--no-bos") == 0)
            no_bos = 1;
        else if (strcmp(argv[i], "--help") == 0)
            path = NULL, argc = -1;
        else if (argv[i][0] == '-' && argv[i][1])
            return cli_fail("tokenize-local", "unknown option %s", argv[i]), 2;
        else if (!path)
            path = argv[i];
        else
            return cli_fail("tokenize-local", "unexpected argument %s", argv[i]), 2;
    }
    if (!path) {
        fprintf(argc < 0 ? stdout : stderr,
                "usage: corral tokenize-local MODEL.gguf [--parse-special] [--no-bos] < TEXT\n\n"
                "Print the token ids of stdin's text, exactly as given (no newline added or\n"
                "removed), space-separated. --no-bos: add no BOS/EOS. --parse-special: match\n"
                "control tokens written in the text (never do this for user input).\n");
        return argc < 0 ? 0 : 2;
    }
    size_t len = 0;
    char *text = cli_read_stream(stdin, &len);
    if (!text) return cli_fail("tokenize-local", "cannot read stdin");
    corral_error err;
    gguf_file *f = gguf_open(path, &err);
    tokenizer *tok = f ? tok_new_from_gguf(f, &err) : NULL;
    int status = 1;
    if (!tok) {
        cli_fail("tokenize-local", "%s", err.message);
    } else {
        uint32_t flags = (no_bos ? 0 : TOK_ADD_SPECIAL) | (parse_special ? TOK_PARSE_SPECIAL : 0);
        size_t n = 0;
        int32_t *ids = NULL;
        corral_status st = tok_encode(tok, text, len, flags, NULL, 0, &n, &err);
        if (st == CORRAL_RESOURCE_EXHAUSTED || st == CORRAL_OK) {
            ids = malloc((n ? n : 1) * sizeof *ids);
            st = ids ? tok_encode(tok, text, len, flags, ids, n, &n, &err) : CORRAL_OUT_OF_MEMORY;
        }
        if (st != CORRAL_OK) {
            cli_fail("tokenize-local", "%s", err.message);
        } else {
            for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
            printf("\n");
            status = 0;
        }
        free(ids);
    }
    tok_destroy(&tok);
    gguf_destroy(&f);
    free(text);
    return status;
}

/* ---- perplexity ----------------------------------------------------------------------------- */

/* Tokenize a text file with m's tokenizer (with BOS, as llama-perplexity does). 0 on success. */
static int tokenize_file(const char *cmd, const model *m, const char *text_path, int32_t **ids,
                         size_t *n_ids) {
    FILE *fp = fopen(text_path, "rb");
    if (!fp) return cli_fail(cmd, "cannot open %s", text_path), -1;
    size_t len = 0;
    char *text = cli_read_stream(fp, &len);
    fclose(fp);
    if (!text) return cli_fail(cmd, "cannot read %s", text_path), -1;
    corral_error err;
    int rc = 0;
    if (prompt_tokenize_text(model_get_tokenizer(m), text, len, ids, n_ids, &err) != CORRAL_OK) {
        cli_fail(cmd, "%s", err.message);
        rc = -1;
    }
    free(text);
    return rc;
}

int cmd_perplexity(int argc, char **argv) {
    const char *path = NULL, *text_path = NULL, *kl_base = NULL;
    long n_ctx = 512, n_threads = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-f") == 0 && i + 1 < argc)
            text_path = argv[++i];
        else if (strcmp(argv[i], "--kl-divergence") == 0 && i + 1 < argc)
            kl_base = argv[++i];
        else if (strcmp(argv[i], "-c") == 0 && i + 1 < argc) {
            if (cli_parse_long(argv[++i], 16, 1 << 20, &n_ctx))
                return cli_fail("perplexity", "-c: '%s' is not a context size", argv[i]), 2;
        } else if ((strcmp(argv[i], "-t") == 0 || strcmp(argv[i], "--threads") == 0) &&
                   i + 1 < argc) {
            if (cli_parse_long(argv[++i], 1, THREADPOOL_MAX_THREADS, &n_threads))
                return cli_fail("perplexity", "--threads: '%s' is not in 1..%u", argv[i],
                                THREADPOOL_MAX_THREADS),
                       2;
        } else if (strcmp(argv[i], "--help") == 0) {
            printf("usage: corral perplexity MODEL.gguf -f TEXT [-c CTX] [-t THREADS]\n"
                   "                         [--kl-divergence BASE.gguf]\n\n"
                   "Perplexity of the model over the text, computed as llama-perplexity does:\n"
                   "non-overlapping chunks of CTX tokens (default 512), each scored on its second\n"
                   "half. Needs a text of at least 2*CTX tokens. THREADS: threads for the forward\n"
                   "pass (default: the number of physical cores; the result does not depend on\n"
                   "it).\n\n"
                   "--kl-divergence BASE.gguf: also run BASE (e.g. the F32 model MODEL was\n"
                   "quantized from) on the same chunks and print, over the scored tokens, the\n"
                   "mean, 99th percentile and largest KL(BASE || MODEL) in nats, how often the\n"
                   "two agree on the most likely token, and both perplexities (one 'name value'\n"
                   "per line).\n");
            return 0;
        } else if (!path && argv[i][0] != '-')
            path = argv[i];
        else
            return cli_fail("perplexity", "unexpected argument %s (see --help)", argv[i]), 2;
    }
    if (!path || !text_path)
        return cli_fail("perplexity", "need MODEL.gguf and -f TEXT (see --help)"), 2;

    corral_error err;
    model *m = model_load(path, NULL, &err);
    model *base = NULL;
    threadpool *pool = NULL;
    int status = 1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (!m || (kl_base && !(base = model_load(kl_base, NULL, &err))) ||
        !(pool = threadpool_new((uint32_t)n_threads, &err))) {
        cli_fail("perplexity", "%s", err.message);
    } else if (tokenize_file("perplexity", base ? base : m, text_path, &ids, &n_ids) == 0) {
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        eval_perplexity_result res;
        eval_kl_result kl;
        if (base) {
            if (eval_kl_divergence(base, m, pool, ids, n_ids, (uint32_t)n_ctx, &kl, &err) !=
                CORRAL_OK) {
                cli_fail("perplexity", "%s", err.message);
            } else {
                printf("perplexity %.4f\nbase_perplexity %.4f\nkl_divergence_mean %.6f\n"
                       "kl_divergence_p99 %.6f\nkl_divergence_max %.6f\ntop1_agreement %.4f\n",
                       kl.perplexity, kl.ref_perplexity, kl.kl_mean, kl.kl_p99, kl.kl_max,
                       kl.top1_agreement);
                fprintf(stderr,
                        "KL divergence from %s: mean %.6f over %u chunks of %ld tokens (%llu "
                        "scored), %.2f s, %u threads\n",
                        kl_base, kl.kl_mean, kl.n_chunks, n_ctx, (unsigned long long)kl.n_scored,
                        seconds_since(&t0), threadpool_n_threads(pool));
                status = 0;
            }
        } else if (eval_perplexity(m, pool, ids, n_ids, (uint32_t)n_ctx, &res, &err) != CORRAL_OK) {
            cli_fail("perplexity", "%s", err.message);
        } else {
            printf("%.4f\n", res.perplexity);
            fprintf(stderr,
                    "perplexity %.4f over %u chunks of %ld tokens (%llu scored), %.2f s, "
                    "%u threads\n",
                    res.perplexity, res.n_chunks, n_ctx, (unsigned long long)res.n_scored,
                    seconds_since(&t0), threadpool_n_threads(pool));
            status = 0;
        }
    }
    free(ids);
    threadpool_destroy(&pool);
    model_destroy(&base);
    model_destroy(&m);
    return status;
}

/* ---- imatrix -------------------------------------------------------------------------------- */

static void imatrix_progress(void *user, uint32_t done, uint32_t n_chunks) {
    (void)user;
    fprintf(stderr, "corral imatrix: chunk %u of %u\n", done, n_chunks);
}

int cmd_imatrix(int argc, char **argv) {
    const char *path = NULL, *text_path = NULL, *out_path = NULL;
    long n_ctx = 0, n_threads = 0, chunks = 0;
    int process_output = 0, quiet = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-f") == 0 && i + 1 < argc)
            text_path = argv[++i];
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc)
            out_path = argv[++i];
        else if (strcmp(argv[i], "-c") == 0 && i + 1 < argc) {
            if (cli_parse_long(argv[++i], 16, 1 << 20, &n_ctx))
                return cli_fail("imatrix", "-c: '%s' is not a context size", argv[i]), 2;
        } else if (strcmp(argv[i], "--chunks") == 0 && i + 1 < argc) {
            if (cli_parse_long(argv[++i], 1, 1 << 30, &chunks))
                return cli_fail("imatrix", "--chunks: '%s' is not a count", argv[i]), 2;
        } else if ((strcmp(argv[i], "-t") == 0 || strcmp(argv[i], "--threads") == 0) &&
                   i + 1 < argc) {
            if (cli_parse_long(argv[++i], 1, THREADPOOL_MAX_THREADS, &n_threads))
                return cli_fail("imatrix", "--threads: '%s' is not in 1..%u", argv[i],
                                THREADPOOL_MAX_THREADS),
                       2;
        } else if (strcmp(argv[i], "--process-output") == 0) {
            process_output = 1;
        } else if (strcmp(argv[i], "-q") == 0 || strcmp(argv[i], "--quiet") == 0) {
            quiet = 1;
        } else if (strcmp(argv[i], "--help") == 0) {
            printf(
                "usage: corral imatrix MODEL.gguf -f TEXT -o IMATRIX.gguf [-c CTX] [--chunks N]\n"
                "                      [--process-output] [-t THREADS] [-q]\n\n"
                "Compute an importance matrix for `corral quantize --imatrix`: for every weight\n"
                "matrix of the model's layers, the mean square of each input column's\n"
                "activations over the text, as llama-imatrix computes it (chunks of CTX tokens,\n"
                "default 512, each from an empty cache with BOS first; at least 2 chunks).\n"
                "Written in llama.cpp's imatrix GGUF format (llama-quantize reads it).\n"
                "--process-output also collects output.weight; --chunks N stops after N\n"
                "chunks.\n");
            return 0;
        } else if (!path && argv[i][0] != '-')
            path = argv[i];
        else
            return cli_fail("imatrix", "unexpected argument %s (see --help)", argv[i]), 2;
    }
    if (!path || !text_path || !out_path)
        return cli_fail("imatrix", "need MODEL.gguf, -f TEXT and -o FILE (see --help)"), 2;
    corral_error err;
    model *m = model_load(path, NULL, &err);
    threadpool *pool = NULL;
    int status = 1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (!m || !(pool = threadpool_new((uint32_t)n_threads, &err))) {
        cli_fail("imatrix", "%s", err.message);
    } else if (tokenize_file("imatrix", m, text_path, &ids, &n_ids) == 0) {
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        const imatrix_params ip = {.n_ctx = (uint32_t)n_ctx,
                                   .max_chunks = (uint32_t)chunks,
                                   .process_output = process_output,
                                   .dataset = text_path,
                                   .progress = quiet ? NULL : imatrix_progress};
        imatrix *im = imatrix_compute(m, pool, ids, n_ids, &ip, &err);
        if (!im || imatrix_save(im, out_path, &err) != CORRAL_OK) {
            cli_fail("imatrix", "%s", err.message);
        } else {
            fprintf(stderr,
                    "corral imatrix: wrote %s: %u entries over %u chunks of %u tokens, %.2f s, "
                    "%u threads\n",
                    out_path, imatrix_n_entries(im), imatrix_chunk_count(im),
                    imatrix_chunk_size(im), seconds_since(&t0), threadpool_n_threads(pool));
            status = 0;
        }
        imatrix_destroy(&im);
    }
    free(ids);
    threadpool_destroy(&pool);
    model_destroy(&m);
    return status;
}
