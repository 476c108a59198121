/*
 * cmd_quantize.c — `corral quantize`: make a quantized model file from a full-precision one, as
 * llama-quantize does (the same recipes, byte for byte), with an importance matrix, per-tensor
 * overrides, an error report and a bits-per-weight budget. The work is the engine's quantize
 * module (corral/quantize.h); this is its command line.
 *
 * --tensor-type patterns are regular expressions searched in tensor names, as llama-quantize's
 * (ECMAScript, lower-cased): they are compiled by corral's one regular expression engine, the
 * policies' DFA compiler (policies/src/regex.h), with its search flag.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "corral/imatrix.h"
#include "corral/quantize.h"
#include "regex.h"

#define QUANTIZE_MAX_RULES 256

static void quantize_usage(FILE *out) {
    fprintf(out,
            "usage: corral quantize [options] IN.gguf OUT.gguf TYPE [THREADS]\n"
            "\n"
            "Quantize a model file (F32, F16 or BF16) to TYPE, as llama-quantize does: the same\n"
            "tensor types for each mixture and the same bytes. TYPE is one of:\n"
            "  %s\n"
            "(Q4_K and Q5_K are llama-quantize's aliases of Q4_K_M and Q5_K_M.) The output is\n"
            "written atomically; progress goes to stderr.\n"
            "\n"
            "options:\n"
            "  --pure                        every quantized tensor in TYPE (no mixture)\n"
            "  --allow-requantize            accept an already quantized input (loses quality)\n"
            "  --leave-output-tensor         keep output.weight as it is\n"
            "  --output-tensor-type T        the type of output.weight\n"
            "  --token-embedding-type T      the type of token_embd.weight\n"
            "  --tensor-type PATTERN=T       tensors whose name contains a match of PATTERN (a\n"
            "                                regular expression) get T; repeatable, first wins\n"
            "  --imatrix FILE                an importance matrix (corral imatrix, or\n"
            "                                llama-imatrix's file) for the weighted quantizers\n"
            "  --target-bpw X                choose each tensor's type so that the file has at\n"
            "                                most X bits per weight with the least measured error\n"
            "  -f, --calibration TEXT        with --target-bpw: measure how much each tensor's\n"
            "                                rounding moves the model's predictions on TEXT\n"
            "                                (one pass of the model per tensor) and weigh its\n"
            "                                error by that, instead of by its role\n"
            "  --calibration-tokens N        evaluate at most N tokens of TEXT (default %d)\n"
            "  --report                      print every tensor's type and error, worst first,\n"
            "                                and the file's bits per weight (stdout)\n"
            "  --dry-run                     decide (and with --report measure) without writing\n"
            "  -t, --threads N               threads (default: physical cores)\n"
            "  -q, --quiet                   no per-tensor progress\n",
            quantize_ftype_names(), QUANTIZE_CALIBRATION_TOKENS);
}

/* ---- --tensor-type rules --------------------------------------------------------------------- */

typedef struct rules {
    quantize_override o[QUANTIZE_MAX_RULES];
    regex_dfa dfa[QUANTIZE_MAX_RULES];
    char *text[QUANTIZE_MAX_RULES];
    uint32_t n;
} rules;

/* 1 if the rule's pattern matches somewhere in name (the DFA, compiled to search, reaches an
 * accepting state). */
static int rule_match(void *user, uint32_t rule, const char *name) {
    const regex_dfa *d = &((const rules *)user)->dfa[rule];
    int32_t st = 0;
    if (d->accepting[0]) return 1;
    for (const char *c = name; *c && st != REGEX_DEAD; c++) {
        st = regex__step(d, st, (uint8_t)*c);
        if (st != REGEX_DEAD && d->accepting[st]) return 1;
    }
    return 0;
}

static int parse_rule(rules *r, const char *arg) {
    const char *eq = strrchr(arg, '=');
    if (!eq || eq == arg || !eq[1])
        return cli_fail("quantize", "--tensor-type '%s': expected PATTERN=TYPE", arg), -1;
    if (r->n == QUANTIZE_MAX_RULES)
        return cli_fail("quantize", "at most %d --tensor-type rules", QUANTIZE_MAX_RULES), -1;
    tensor_type type;
    if (tensor_type_from_name(eq + 1, &type) != 0)
        return cli_fail("quantize", "--tensor-type '%s': unknown type '%s'", arg, eq + 1), -1;
    char *text = strndup(arg, (size_t)(eq - arg));
    if (!text) return cli_fail("quantize", "out of memory"), -1;
    for (char *c = text; *c; c++) *c = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
    corral_error err;
    if (regex__compile(text, strlen(text), REGEX_SEARCH, &r->dfa[r->n], NULL, &err) != CORRAL_OK) {
        cli_fail("quantize", "--tensor-type '%s': %s", arg, err.message);
        free(text);
        return -1;
    }
    r->text[r->n] = text;
    r->o[r->n] = (quantize_override){.pattern = text, .type = type};
    r->n++;
    return 0;
}

static void rules_free(rules *r) {
    for (uint32_t i = 0; i < r->n; i++) {
        regex__free(&r->dfa[i]);
        free(r->text[i]);
    }
}

/* ---- progress and the report ----------------------------------------------------------------- */

static void progress(void *user, const char *phase, uint32_t done, uint32_t total,
                     const char *tensor, uint32_t src_type, uint32_t type) {
    (void)user;
    fprintf(stderr, "[%4u/%4u] %-7s %-40s %-5s -> %s\n", done, total, phase, tensor,
            tensor_type_name(src_type), tensor_type_name(type));
}

static double sort_key(const quantize_tensor_info *t) {
    if (!t->measured) return -1.0;
    return t->output_error >= 0 ? t->output_error : t->weight_error;
}

static int worst_first(const void *a, const void *b) {
    const double x = sort_key(a), y = sort_key(b);
    return x < y ? 1 : x > y ? -1 : 0;
}

static void print_report(const quantize_result *r, const char *ftype, int has_imatrix) {
    quantize_tensor_info *sorted = malloc(r->n_tensors * sizeof *sorted);
    if (!sorted) return;
    memcpy(sorted, r->tensors, r->n_tensors * sizeof *sorted);
    qsort(sorted, r->n_tensors, sizeof *sorted, worst_first);
    int budgeted = 0;
    for (uint32_t i = 0; i < r->n_tensors; i++)
        budgeted |= r->tensors[i].reason == QUANTIZE_REASON_BUDGET;
    printf("%-40s %-6s %-16s %-8s %12s", "tensor", "type", "shape", "why", "weight err");
    if (has_imatrix) printf(" %12s", "output err");
    printf(budgeted ? " %12s\n" : "\n", "sensitivity");
    for (uint32_t i = 0; i < r->n_tensors; i++) {
        const quantize_tensor_info *t = &sorted[i];
        char shape[48] = "";
        size_t len = 0;
        for (uint32_t d = 0; d < t->n_dims && len < sizeof shape; d++)
            len += (size_t)snprintf(shape + len, sizeof shape - len, "%s%lld", d ? " x " : "",
                                    (long long)t->ne[d]);
        printf("%-40s %-6s %-16s %-8s ", t->name, tensor_type_name(t->type), shape,
               quantize_reason_name(t->reason));
        if (t->measured)
            printf("%12.6f", t->weight_error);
        else
            printf("%12s", "-");
        if (has_imatrix && t->measured && t->output_error >= 0)
            printf(" %12.6f", t->output_error);
        else if (has_imatrix && budgeted)
            printf(" %12s", "-");
        if (budgeted && t->reason == QUANTIZE_REASON_BUDGET)
            printf(" %12.4g", t->sensitivity);
        else if (budgeted)
            printf(" %12s", "-");
        printf("\n");
    }
    printf("%s: %.4f bits per weight (%.2f MiB of tensor data; input %.4f bpw, %.2f MiB)\n", ftype,
           r->bpw_out, (double)r->bytes_out / 1048576.0, r->bpw_in,
           (double)r->bytes_in / 1048576.0);
    free(sorted);
}

/* ---- the command ----------------------------------------------------------------------------- */

static int parse_type_option(const char *opt, const char *arg, int *out) {
    tensor_type t;
    if (tensor_type_from_name(arg, &t) != 0)
        return cli_fail("quantize", "%s: unknown type '%s'", opt, arg), -1;
    *out = (int)t;
    return 0;
}

int cmd_quantize(int argc, char **argv) {
    enum {
        OPT_HELP = 256,
        OPT_PURE,
        OPT_REQUANT,
        OPT_LEAVE_OUTPUT,
        OPT_OUTPUT_TYPE,
        OPT_EMBD_TYPE,
        OPT_TENSOR_TYPE,
        OPT_IMATRIX,
        OPT_TARGET_BPW,
        OPT_REPORT,
        OPT_DRY_RUN,
        OPT_CALIBRATION_TOKENS,
    };
    static const struct option options[] = {
        {"pure", no_argument, NULL, OPT_PURE},
        {"allow-requantize", no_argument, NULL, OPT_REQUANT},
        {"leave-output-tensor", no_argument, NULL, OPT_LEAVE_OUTPUT},
        {"output-tensor-type", required_argument, NULL, OPT_OUTPUT_TYPE},
        {"token-embedding-type", required_argument, NULL, OPT_EMBD_TYPE},
        {"tensor-type", required_argument, NULL, OPT_TENSOR_TYPE},
        {"imatrix", required_argument, NULL, OPT_IMATRIX},
        {"target-bpw", required_argument, NULL, OPT_TARGET_BPW},
        {"calibration", required_argument, NULL, 'f'},
        {"calibration-tokens", required_argument, NULL, OPT_CALIBRATION_TOKENS},
        {"report", no_argument, NULL, OPT_REPORT},
        {"dry-run", no_argument, NULL, OPT_DRY_RUN},
        {"threads", required_argument, NULL, 't'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    quantize_params p = quantize_params_default();
    static rules r; /* large: kept off the stack */
    memset(&r, 0, sizeof r);
    const char *imatrix_path = NULL, *calibration_path = NULL;
    char *calibration = NULL;
    long threads = 0, calibration_tokens = 0;
    int report = 0, dry_run = 0, quiet = 0, status = 2;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "t:qf:", options, NULL)) != -1) {
        switch (c) {
            case OPT_PURE:
                p.pure = 1;
                break;
            case OPT_REQUANT:
                p.allow_requantize = 1;
                break;
            case OPT_LEAVE_OUTPUT:
                p.leave_output = 1;
                break;
            case OPT_OUTPUT_TYPE:
                if (parse_type_option("--output-tensor-type", optarg, &p.output_tensor_type))
                    goto done;
                break;
            case OPT_EMBD_TYPE:
                if (parse_type_option("--token-embedding-type", optarg, &p.token_embedding_type))
                    goto done;
                break;
            case OPT_TENSOR_TYPE:
                if (parse_rule(&r, optarg)) goto done;
                break;
            case OPT_IMATRIX:
                imatrix_path = optarg;
                break;
            case OPT_TARGET_BPW:
                if (cli_parse_double(optarg, 0.5, 64, &p.target_bpw)) {
                    cli_fail("quantize", "--target-bpw: '%s' is not in 0.5..64", optarg);
                    goto done;
                }
                break;
            case 'f':
                calibration_path = optarg;
                break;
            case OPT_CALIBRATION_TOKENS:
                if (cli_parse_long(optarg, 16, 1 << 24, &calibration_tokens)) {
                    cli_fail("quantize", "--calibration-tokens: '%s' is not in 16..%d", optarg,
                             1 << 24);
                    goto done;
                }
                break;
            case OPT_REPORT:
                report = 1;
                break;
            case OPT_DRY_RUN:
                dry_run = 1;
                break;
            case 't':
                if (cli_parse_long(optarg, 1, THREADPOOL_MAX_THREADS, &threads)) {
                    cli_fail("quantize", "--threads: '%s' is not in 1..%u", optarg,
                             THREADPOOL_MAX_THREADS);
                    goto done;
                }
                break;
            case 'q':
                quiet = 1;
                break;
            case OPT_HELP:
                quantize_usage(stdout);
                status = 0;
                goto done;
            default:
                quantize_usage(stderr);
                goto done;
        }
    }
    const int n_pos = argc - optind;
    if (n_pos < (dry_run ? 2 : 3) || n_pos > 4) {
        cli_fail("quantize", "expected IN.gguf OUT.gguf TYPE [THREADS] (see --help)");
        goto done;
    }
    const char *in = argv[optind];
    /* --dry-run may leave out the output: IN TYPE. */
    const int has_out = !(dry_run && n_pos == 2);
    const char *out = has_out ? argv[optind + 1] : NULL;
    const char *type_name = argv[optind + (has_out ? 2 : 1)];
    if (quantize_ftype_from_name(type_name, &p.ftype) != 0) {
        cli_fail("quantize", "unknown type '%s' (one of %s)", type_name, quantize_ftype_names());
        goto done;
    }
    if (optind + (has_out ? 3 : 2) < argc &&
        cli_parse_long(argv[optind + (has_out ? 3 : 2)], 1, THREADPOOL_MAX_THREADS, &threads)) {
        cli_fail("quantize", "THREADS: '%s' is not in 1..%u", argv[argc - 1],
                 THREADPOOL_MAX_THREADS);
        goto done;
    }
    p.overrides = r.o;
    p.n_overrides = r.n;
    p.match = rule_match;
    p.match_user = &r;
    p.measure = report;
    if (!quiet) p.progress = progress;
    if (calibration_path && !(p.target_bpw > 0)) {
        cli_fail("quantize", "--calibration is for --target-bpw (see --help)");
        goto done;
    }
    if (calibration_path) {
        FILE *fp = fopen(calibration_path, "rb");
        size_t len = 0;
        calibration = fp ? cli_read_stream(fp, &len) : NULL;
        if (fp) fclose(fp);
        if (!calibration) {
            cli_fail("quantize", "--calibration: cannot read %s: %s", calibration_path,
                     fp ? "read error" : strerror(errno));
            status = 1;
            goto done;
        }
        p.calibration_text = calibration;
        p.calibration_len = len;
        p.calibration_tokens = (uint32_t)calibration_tokens;
    }

    status = 1;
    corral_error err = {0};
    imatrix *im = NULL;
    threadpool *pool = NULL;
    if (imatrix_path) {
        if (!(im = imatrix_load(imatrix_path, &err))) {
            cli_fail("quantize", "%s", err.message);
            goto done;
        }
        p.imatrix = im;
        p.imatrix_path = imatrix_path;
        if (!quiet)
            fprintf(stderr, "corral quantize: importance matrix %s: %u entries, %u chunks\n",
                    imatrix_path, imatrix_n_entries(im), imatrix_chunk_count(im));
    }
    if (!(pool = threadpool_new((uint32_t)threads, &err))) {
        cli_fail("quantize", "%s", err.message);
        imatrix_destroy(&im);
        goto done;
    }
    p.pool = pool;
    quantize_result res = {0};
    corral_status st;
    if (dry_run) {
        gguf_file *f = gguf_open(in, &err);
        st = f ? quantize_plan(f, &p, &res, &err) : err.status;
        gguf_destroy(&f);
    } else {
        st = quantize_file(in, out, &p, &res, &err);
    }
    const uint32_t nth = threadpool_n_threads(pool);
    threadpool_destroy(&pool);
    if (st != CORRAL_OK) {
        cli_fail("quantize", "%s", err.message);
    } else {
        status = 0;
        if (report) print_report(&res, quantize_ftype_name(p.ftype), im != NULL);
        if (res.n_fallback)
            fprintf(stderr, "corral quantize: %u tensor(s) fell back to another type\n",
                    res.n_fallback);
        fprintf(stderr,
                "corral quantize: %s%s: %s, %.4f bits per weight, %.2f MiB of tensor data "
                "(input %.2f MiB), %u tensors with importance, %.2f s on %u thread%s\n",
                dry_run ? "planned " : "wrote ", dry_run ? in : out, quantize_ftype_name(p.ftype),
                res.bpw_out, (double)res.bytes_out / 1048576.0, (double)res.bytes_in / 1048576.0,
                res.n_importance, res.seconds, nth, nth == 1 ? "" : "s");
        if (res.predicted_kl >= 0)
            fprintf(stderr,
                    "corral quantize: predicted KL divergence from the input on %s: %.4g (the "
                    "tensors' measured effects, summed)\n",
                    calibration_path, res.predicted_kl);
    }
    quantize_result_free(&res);
    imatrix_destroy(&im);
done:
    free(calibration);
    rules_free(&r);
    return status;
}
