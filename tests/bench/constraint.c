/*
 * constraint.c — benchmark of regex-constrained output (policies/include/corral/constraint.h).
 *
 *   build/tests/bench/constraint [--vocab FILE.gguf] [--model FILE.gguf] [--tokens N] [--reps R]
 *   build/tests/bench/constraint --compile
 *   build/tests/bench/constraint --schema [DIR] [--vocab FILE.gguf]
 *
 * --model: the model for the decode measurement; when the file does not exist, the synthetic
 * model is written there and kept for the next run.
 *
 * Measures, and prints as Markdown for the README:
 *   1. the vocabulary index (token-byte trie) build time for a 32000-token vocabulary
 *      (default ../shared/vocab/ggml-vocab-llama-spm.gguf), once per model;
 *   2. per pattern of the soundness corpus: DFA compile time, DFA states, and the time to build
 *      the allowed set of its start state (one trie walk);
 *   3. the constraint's cost per generated token — allowed() on the drawn token, the mask when
 *      the draw is refused, accept() — in generations driven by random logits (temperature 1,
 *      so most draws are refused and the mask path is taken), median and p99 over all tokens:
 *      once from cold (allowed sets built on first use, as for a pattern's first request) and
 *      once warm (the sets cached, as for every later request);
 *   4. decode speed with and without a constraint on a synthetic model with the same 32000-token
 *      vocabulary (default: SmolLM2-135M's shape, Q8_0, written to a temporary file; or --model),
 *      median of R runs of N tokens; the constrained runs use a pattern that keeps generating;
 *   5. (alone with --compile) the compile budget: for hostile patterns (nested counted
 *      repetitions, DFA blow-ups, huge classes repeated, 8 KiB of nesting, of alternatives, of
 *      literal text) and literals of 1-8 KiB, as a constraint and as a deny rule (REGEX_SEARCH):
 *      the outcome (the limit hit), wall and CPU time (median of 5), the compile's own counters
 *      (steps, peak bytes held) and the DFA's size.
 *   6. (alone with --schema) JSON schemas (json_schema.h): every *.json of DIR (default
 *      tests/schemas, the schemas the tests use): the schema -> regex time, the whole compile
 *      (schema, regex, DFA) for the vocabulary, median of 5, the DFA's states and the pattern's
 *      size, the start state's allowed set; then the per-token constraint cost of generations
 *      under each schema, cold and warm, as in 3.
 * Timing uses CLOCK_MONOTONIC (and CLOCK_PROCESS_CPUTIME_ID for CPU time); nothing here is run by
 * the tests.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <unistd.h>

#include "corral/constraint.h"
#include "corral/generate.h"
#include "corral/json_schema.h"
#include "corral/model.h"
#include "corral/prompt.h"
#include "corral/synth.h"
#include "corral/threadpool.h"
#include "benchutil.h"
#include "regex.h" /* policies/src: the compile's limits and counters */

static const char *const corpus[] = {
    "\\d{4}-\\d{2}-\\d{2}",
    "(19|20)\\d{2}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])",
    "(0?[1-9]|[12]\\d|3[01])/(0?[1-9]|1[0-2])/\\d{4}",
    "([01]\\d|2[0-3]):[0-5]\\d",
    "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d",
    "(1[0-2]|0?[1-9]):[0-5]\\d ?(AM|PM|am|pm)",
    "P\\d{1,3}D(T\\d{1,2}H)?",
    "\\+?1?[ -]?\\(?\\d{3}\\)?[ -]?\\d{3}-\\d{4}",
    "\\+\\d{1,3} \\d{2,4} \\d{3,4} \\d{3,4}",
    "0\\d{2,3}-\\d{7,8}",
    "1[3-9]\\d{9}",
    "(turn_on|turn_off|set_temperature|play_music|stop|weather|timer)",
    "greet|goodbye|affirm|deny|mood_great|mood_unhappy|bot_challenge",
    "yes|no",
    "(Yes|No)\\.",
    "(true|false|null)",
    "-?\\d{1,9}",
    "-?(0|[1-9]\\d{0,8})",
    "-?\\d{1,6}\\.\\d{1,4}",
    "[+-]?(\\d{1,5}(\\.\\d{0,3})?|\\.\\d{1,3})",
    "\\d{1,3}(,\\d{3}){0,3}",
    "\\d{5}(-\\d{4})?",
    "[\\u4e00-\\u9fa5，。！？]{1,12}",
    "[\\u4e00-\\u9fa5]{2,4}[，。！？]",
    "[\\u00c0-\\u00ff]{1,5}",
    "(\\u{1F600}|\\u{1F642}|\\u{1F622}){1,3}",
    "\\{\"name\": \"[a-z]{1,10}\", \"age\": \\d{1,3}\\}",
    "\\{\"intent\": \"(on|off|up|down)\", \"room\": \"[A-Za-z ]{1,12}\", \"level\": "
    "(\\d|[1-9]\\d|100)\\}",
    "\\{\"ok\": (true|false), \"count\": -?\\d{1,4}, \"note\": \"[^\"\\\\\\n]{0,16}\"\\}",
    "[a-z]{1,8}@[a-z]{1,8}\\.(com|org|net)",
    "#[0-9a-fA-F]{6}",
    "(\\d{1,3}\\.){3}\\d{1,3}",
    "[A-Z][a-z]{1,10}( [A-Z][a-z]{1,10}){0,2}",
    "\\w{1,10}",
    "(Once|Lily|Tom)( [a-z]{1,8}){1,5}\\.",
    ".{1,12}",
    "\\S{1,8}",
    "[a-z]{1,6}\\s[a-z]{1,6}",
};
#define N_CORPUS (sizeof corpus / sizeof corpus[0])

/* Patterns that keep generating: prose of any length (2 DFA states: every allowed set is built
 * at once and then reused), and 300 to 400 bytes of it (a counter: ~400 states, so a new allowed
 * set is built for most tokens of a first request — the expensive case). */
static const char *const decode_patterns[] = {"[A-Za-z ,.'\\n]+", "[A-Za-z ,.'\\n]{300,400}"};

static double quantile(double *v, size_t n, double q) {
    if (!n) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

/* A pattern as Markdown code in a table cell: '|' must be escaped there. */
static void print_code(const char *pattern) {
    putchar('`');
    for (const char *p = pattern; *p; p++) {
        if (*p == '|') putchar('\\');
        putchar(*p);
    }
    putchar('`');
}

static void die(const char *what, const corral_error *err) {
    fprintf(stderr, "constraint bench: %s: %s\n", what, err ? err->message : "");
    exit(1);
}

/* ---- per-token cost: a timing wrapper around the matcher's processor ------------------------- */

typedef struct timed {
    sampler_processor inner;
    double spent; /* seconds in the constraint's callbacks this token */
} timed;

static int timed_allowed(void *user, int32_t token) {
    timed *t = user;
    const double t0 = now_s();
    const int r = t->inner.allowed(t->inner.user, token);
    t->spent += now_s() - t0;
    return r;
}

static void timed_mask(void *user, float *logits, int32_t n) {
    timed *t = user;
    const double t0 = now_s();
    t->inner.mask(t->inner.user, logits, n);
    t->spent += now_s() - t0;
}

static corral_status timed_accept(void *user, int32_t token) {
    timed *t = user;
    const double t0 = now_s();
    const corral_status r = t->inner.accept(t->inner.user, token);
    t->spent += now_s() - t0;
    return r;
}

static int timed_finished(void *user) {
    timed *t = user;
    const double t0 = now_s();
    const int r = t->inner.finished(t->inner.user);
    t->spent += now_s() - t0;
    return r;
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Generations of one pattern with random logits; appends each token's constraint time. */
static void run_random(constraint *c, int32_t n_vocab, int gens, uint64_t seed, double *times,
                       size_t *n_times, size_t cap) {
    corral_error err;
    sampler_params sp = sampler_params_default();
    sp.temperature = 1.0f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    for (int g = 0; g < gens; g++) {
        sp.seed = seed + (uint64_t)g;
        sampler *s = sampler_new(&sp, n_vocab, &err);
        constraint_matcher *m = constraint_matcher_new(c, &err);
        if (!s || !m) die("sampler", &err);
        timed t = {.inner = constraint_matcher_processor(m)};
        sampler_set_processor(s, &(sampler_processor){.user = &t,
                                                      .allowed = timed_allowed,
                                                      .mask = timed_mask,
                                                      .accept = timed_accept,
                                                      .finished = timed_finished});
        uint64_t r = seed * 7919u + (uint64_t)g;
        for (int step = 0; step < 200 && sampler_finished(s) == 0; step++) {
            for (int32_t i = 0; i < n_vocab; i++)
                logits[i] = (float)((double)(rng_next(&r) >> 11) * 0x1.0p-53 * 8.0);
            t.spent = 0;
            const int32_t tok = sampler_sample(s, logits);
            if (tok < 0 || sampler_accept(s, tok) != CORRAL_OK) break;
            if (*n_times < cap) times[(*n_times)++] = t.spent;
        }
        sampler_destroy(&s);
        constraint_matcher_destroy(&m);
    }
    free(logits);
}

/* ---- decode speed ---------------------------------------------------------------------------- */

typedef struct decode_run {
    double tok_s;      /* end to end: forward passes and sampling */
    double forward_us; /* per token */
    double sample_us;  /* per token: sampler_sample + sampler_accept (with the constraint's work) */
    double callback_us; /* per token: of that, in the constraint's callbacks */
    uint32_t n;
} decode_run;

/* The generator's loop, written out so that the forward pass and the sampling are timed apart:
 * prefill "Once upon a time", then up to n_tokens of sample -> accept -> forward. */
static decode_run decode(model *m, threadpool *pool, constraint *c, uint32_t n_tokens,
                         uint64_t seed) {
    corral_error err;
    const tokenizer *tok = model_get_tokenizer(m);
    const uint32_t n_vocab = model_get_hparams(m)->n_vocab;
    kv_cache *kv = kv_cache_new(m, 1024, KV_TYPE_F16, &err);
    model_runner *r = kv ? model_runner_new(m, 0, pool, &err) : NULL;
    if (!r) die("runner", &err);
    sampler_params sp = sampler_params_default();
    sp.temperature = 1.0f;
    sp.seed = seed;
    sampler *s = sampler_new(&sp, (int32_t)n_vocab, &err);
    constraint_matcher *mt = c ? constraint_matcher_new(c, &err) : NULL;
    timed t = {0};
    if (mt) {
        t.inner = constraint_matcher_processor(mt);
        sampler_set_processor(s, &(sampler_processor){.user = &t,
                                                      .allowed = timed_allowed,
                                                      .mask = timed_mask,
                                                      .accept = timed_accept,
                                                      .finished = timed_finished});
    }
    float *logits = malloc(n_vocab * sizeof *logits), *work = malloc(n_vocab * sizeof *work);
    int32_t *ids;
    size_t n;
    if (prompt_tokenize_text(tok, "Once upon a time", 16, &ids, &n, &err)) die("prompt", &err);
    if (model_forward(r, kv, ids, (uint32_t)n, MODEL_LOGITS_LAST, logits, &err)) die("fwd", &err);
    free(ids);
    double t_fwd = 0, t_smp = 0;
    decode_run out = {0};
    const double t_start = now_s();
    for (uint32_t i = 0; i < n_tokens; i++) {
        memcpy(work, logits, n_vocab * sizeof *work);
        const double t0 = now_s();
        const int32_t id = sampler_sample(s, work);
        if (id < 0 || sampler_accept(s, id) != CORRAL_OK) break;
        const double t1 = now_s();
        t_smp += t1 - t0;
        out.n++;
        if (sampler_finished(s) > 0) break;
        if (model_forward(r, kv, &id, 1, MODEL_LOGITS_LAST, logits, &err)) die("fwd", &err);
        t_fwd += now_s() - t1;
    }
    const double total = now_s() - t_start;
    out.tok_s = out.n / total;
    out.forward_us = 1e6 * t_fwd / (out.n ? out.n : 1);
    out.sample_us = 1e6 * t_smp / (out.n ? out.n : 1);
    out.callback_us = 1e6 * t.spent / (out.n ? out.n : 1);
    free(logits);
    free(work);
    constraint_matcher_destroy(&mt);
    sampler_destroy(&s);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
    return out;
}

/* ---- compile budget ---------------------------------------------------------------------- */

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Pattern texts built to a length; each returns the length written into buf. */
static size_t gen_text(char *buf, size_t n) { /* prose without metacharacters */
    static const char words[] = "the quick brown fox jumps over the lazy dog, 0123456789; ";
    for (size_t i = 0; i < n; i++) buf[i] = words[(i * 7 + i / 57) % (sizeof words - 1)];
    return n;
}

static size_t gen_words(char *buf, size_t n) { /* six-letter words joined by '|' */
    size_t len = 0;
    for (uint32_t i = 0;; i++) {
        uint32_t v = i * 7919u + 13u;
        if (len + (i ? 7 : 6) > n) break;
        if (i) buf[len++] = '|';
        for (int k = 0; k < 6; k++, v /= 26) buf[len++] = (char)('a' + v % 26);
    }
    return len;
}

static size_t gen_class(char *buf, size_t n) { /* [\u0100\u0103...]{1000} */
    size_t len = 0;
    buf[len++] = '[';
    for (uint32_t i = 0; len + 7 + 7 < n; i++)
        len += (size_t)snprintf(buf + len, 8, "\\u%04X", 0x100u + 3u * i);
    memcpy(buf + len, "]{1000}", 7);
    return len + 7;
}

static size_t gen_nested(char *buf, size_t n, const char *q) { /* ((((a)q)q)q...) to the limit */
    const size_t d = REGEX_MAX_DEPTH, ql = strlen(q), one = d + 1 + d * (1 + ql);
    size_t len = 0;
    while (len + one <= n) {
        memset(buf + len, '(', d);
        len += d;
        buf[len++] = 'a';
        for (size_t i = 0; i < d; i++) {
            buf[len++] = ')';
            memcpy(buf + len, q, ql);
            len += ql;
        }
    }
    return len;
}

static void bench_compile(void) {
    enum { LIT, SAME, WORDS, CLASS, NEST, NEST2 };
    static const struct {
        const char *name; /* the pattern itself when gen < 0 */
        int gen;
        size_t len;
    } rows[] = {
        {"((a|b){0,12}){0,1000}", -1, 0},
        {"((a{0,100}){0,100}){0,100}", -1, 0},
        {"(.*a){20}", -1, 0},
        {".*a.{20}", -1, 0},
        {"(a|b)*a(a|b){20}", -1, 0},
        {"[\\s\\S]{1000}", -1, 0},
        {"(.?){1000}", -1, 0},
        {"(a?){1000}", -1, 0},
        {"[A-Za-z ]{1,200}", -1, 0},
        {"8 KiB class [\\u0100\\u0103...]{1000}", CLASS, 8192},
        {"8 KiB of groups 128 deep, ((a){2}){2}...", NEST2, 8192},
        {"8 KiB of groups 128 deep, ((a)*)*...", NEST, 8192},
        {"8 KiB of alternatives word|word|...", WORDS, 8192},
        {"8 KiB of one byte, aaa...", SAME, 8192},
        {"1 KiB literal", LIT, 1024},
        {"2 KiB literal", LIT, 2048},
        {"4 KiB literal", LIT, 4096},
        {"8 KiB literal", LIT, 8192},
    };
    char *buf = malloc(REGEX_MAX_PATTERN + 64);
    printf("## regex compile budget\n\nlimits: %d NFA states, %d DFA states, %llu steps, %llu MiB; "
           "time: median of 5 compiles\n\n",
           REGEX_MAX_NFA_STATES, REGEX_MAX_DFA_STATES, (unsigned long long)REGEX_MAX_COMPILE_WORK,
           (unsigned long long)(REGEX_MAX_COMPILE_BYTES >> 20));
    printf("| pattern | bytes | as | outcome | wall ms | CPU ms | steps | peak MiB | DFA states "
           "(made, if refused) "
           "|\n|---|---|---|---|---|---|---|---|---|\n");
    double worst_wall = 0, worst_cpu = 0, worst_mib = 0;
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        size_t len;
        switch (rows[r].gen) {
            case LIT:
                len = gen_text(buf, rows[r].len);
                break;
            case SAME:
                len = rows[r].len;
                memset(buf, 'a', len);
                break;
            case WORDS:
                len = gen_words(buf, rows[r].len);
                break;
            case CLASS:
                len = gen_class(buf, rows[r].len);
                break;
            case NEST:
            case NEST2:
                len = gen_nested(buf, rows[r].len, rows[r].gen == NEST ? "*" : "{2}");
                break;
            default:
                len = strlen(rows[r].name);
                memcpy(buf, rows[r].name, len);
        }
        for (int search = 0; search < 2; search++) {
            double wall[5], cpu[5];
            regex_stats st;
            corral_error err;
            corral_status rc = CORRAL_OK;
            uint32_t n_states = 0;
            for (int i = 0; i < 5; i++) {
                regex_dfa d;
                const double w0 = now_s(), c0 = cpu_s();
                rc = regex__compile(buf, len, search ? REGEX_SEARCH : 0, &d, &st, &err);
                cpu[i] = cpu_s() - c0;
                wall[i] = now_s() - w0;
                n_states = rc == CORRAL_OK ? d.n_states : 0;
                regex__free(&d);
            }
            const double w = quantile(wall, 5, 0.5), c = quantile(cpu, 5, 0.5);
            const double mib = (double)st.peak_bytes / (1 << 20);
            worst_wall = w > worst_wall ? w : worst_wall;
            worst_cpu = c > worst_cpu ? c : worst_cpu;
            worst_mib = mib > worst_mib ? mib : worst_mib;
            const char *limit = rc == CORRAL_OK ? NULL : strstr(err.message, "REGEX_MAX_");
            char outcome[48];
            if (rc == CORRAL_OK) {
                snprintf(outcome, sizeof outcome, "compiles");
            } else {
                snprintf(outcome, sizeof outcome, "%s", limit ? limit : corral_status_name(rc));
                outcome[strcspn(outcome, ";)")] = '\0';
            }
            printf("| ");
            if (rows[r].gen < 0) {
                print_code(rows[r].name);
            } else {
                printf("%s", rows[r].name);
            }
            printf(" | %zu | %s | %s | %.2f | %.2f | %llu | %.1f | %u |\n", len,
                   search ? "deny" : "constraint", outcome, 1e3 * w, 1e3 * c,
                   (unsigned long long)st.work, mib, n_states ? n_states : st.dfa_states);
        }
    }
    printf("\nworst: %.1f ms wall, %.1f ms CPU, %.1f MiB held\n\n", 1e3 * worst_wall,
           1e3 * worst_cpu, worst_mib);
    free(buf);
}

/* ---- JSON schemas ------------------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static char *read_file(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    const long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    if (buf) buf[n] = '\0', *len = (size_t)n;
    return buf;
}

static void bench_schemas(const char *dir, const char *vocab) {
    corral_error err;
    gguf_file *f = gguf_open(vocab, &err);
    tokenizer *tok = f ? tok_new_from_gguf(f, &err) : NULL;
    if (!tok) die(vocab, &err);
    const int32_t n_vocab = tok_vocab_size(tok);
    constraint_index *ix = constraint_index_new(tok, &err);
    if (!ix) die("index", &err);
    char *names[64];
    size_t n = 0;
    DIR *d = opendir(dir);
    if (!d) die(dir, NULL);
    for (struct dirent *e; (e = readdir(d)) && n < 64;) {
        const size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".json")) names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    printf("## JSON schema constraints\n\nvocabulary: %s (%d tokens); schemas: %s; median of 5\n\n"
           "| schema | schema bytes | pattern bytes | DFA states | schema -> regex ms | compile "
           "ms (all) | start-state mask ms |\n|---|---|---|---|---|---|---|\n",
           vocab, (int)n_vocab, dir);
    constraint **compiled = calloc(n, sizeof *compiled);
    char **texts = calloc(n, sizeof *texts);
    size_t *lens = calloc(n, sizeof *lens);
    double worst = 0, sum = 0;
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    for (size_t i = 0; i < n; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        texts[i] = read_file(path, &lens[i]);
        if (!texts[i]) die(path, NULL);
        double tr[5], tc[5];
        size_t re_len = 0;
        for (int r = 0; r < 5; r++) {
            char *re;
            double t0 = now_s();
            if (json_schema_to_regex(texts[i], lens[i], &re, &re_len, &err)) die(path, &err);
            tr[r] = now_s() - t0;
            free(re);
            constraint_destroy(&compiled[i]);
            t0 = now_s();
            compiled[i] =
                constraint_compile_as(ix, CONSTRAINT_JSON_SCHEMA, texts[i], lens[i], &err);
            tc[r] = now_s() - t0;
            if (!compiled[i]) die(path, &err);
        }
        constraint_matcher *m = constraint_matcher_new(compiled[i], &err);
        for (int32_t k = 0; k < n_vocab; k++) logits[k] = 0;
        const double t0 = now_s();
        constraint_matcher_mask(m, logits, n_vocab);
        const double mask_ms = 1e3 * (now_s() - t0);
        constraint_matcher_destroy(&m);
        const double med = quantile(tc, 5, 0.5);
        worst = med > worst ? med : worst;
        sum += med;
        printf("| %s | %zu | %zu | %u | %.3f | %.3f | %.3f |\n", names[i], lens[i], re_len,
               constraint_n_states(compiled[i]), 1e3 * quantile(tr, 5, 0.5), 1e3 * med, mask_ms);
    }
    printf("\ncompile (schema to DFA): worst %.3f ms, mean %.3f ms over %zu schemas\n\n",
           1e3 * worst, n ? 1e3 * sum / (double)n : 0, n);
    const size_t cap = n * 20 * 210 + 1;
    double *times = malloc(cap * sizeof *times);
    for (int warm = 0; warm < 2; warm++) {
        size_t n_times = 0;
        for (size_t i = 0; i < n; i++) {
            if (!warm) {
                constraint_destroy(&compiled[i]);
                compiled[i] =
                    constraint_compile_as(ix, CONSTRAINT_JSON_SCHEMA, texts[i], lens[i], &err);
            }
            run_random(compiled[i], n_vocab, 20, 2000 + i, times, &n_times, cap);
        }
        printf("per-token constraint time, %s (%zu tokens): median %.1f us, p99 %.1f us\n",
               warm ? "warm" : "cold", n_times, 1e6 * quantile(times, n_times, 0.5),
               1e6 * quantile(times, n_times, 0.99));
    }
    for (size_t i = 0; i < n; i++) {
        constraint_destroy(&compiled[i]);
        free(texts[i]);
        free(names[i]);
    }
    free(times);
    free(logits);
    free(compiled);
    free(texts);
    free(lens);
    constraint_index_destroy(&ix);
    tok_destroy(&tok);
    gguf_destroy(&f);
}

int main(int argc, char **argv) {
    const char *shared = getenv("CORRAL_SHARED_DIR");
    char vocab_path[1024];
    snprintf(vocab_path, sizeof vocab_path, "%s/vocab/ggml-vocab-llama-spm.gguf",
             shared && *shared ? shared : "../shared");
    const char *vocab = vocab_path, *model_path = NULL, *schema_dir = NULL;
    uint32_t n_tokens = 128, reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--vocab") && i + 1 < argc) {
            vocab = argv[++i];
        } else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            model_path = argv[++i];
        } else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
            n_tokens = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--compile")) {
            bench_compile();
            return 0;
        } else if (!strcmp(argv[i], "--schema")) {
            schema_dir = i + 1 < argc && argv[i + 1][0] != '-' ? argv[++i] : CORRAL_SCHEMA_DIR;
        } else {
            fprintf(stderr, "usage: constraint [--vocab FILE.gguf] [--model FILE.gguf] "
                            "[--tokens N] [--reps R] | --compile | --schema [DIR]\n");
            return 2;
        }
    }
    if (schema_dir) {
        bench_schemas(schema_dir, vocab);
        return 0;
    }
    if (!reps) reps = 1;
    corral_error err;
    gguf_file *f = gguf_open(vocab, &err);
    tokenizer *tok = f ? tok_new_from_gguf(f, &err) : NULL;
    if (!tok) die(vocab, &err);
    const int32_t n_vocab = tok_vocab_size(tok);

    /* 1. index */
    double ix_times[5];
    constraint_index *ix = NULL;
    for (int i = 0; i < 5; i++) {
        constraint_index_destroy(&ix);
        const double t0 = now_s();
        ix = constraint_index_new(tok, &err);
        ix_times[i] = now_s() - t0;
        if (!ix) die("index", &err);
    }
    printf("## constraint benchmark\n\nvocabulary: %s (%d tokens); index: %u trie nodes, "
           "built in %.2f ms (median of 5)\n\n",
           vocab, (int)n_vocab, constraint_index_n_nodes(ix), 1e3 * quantile(ix_times, 5, 0.5));

    /* 2. compile per pattern */
    printf("| pattern | DFA states | compile ms | start-state mask ms |\n|---|---|---|---|\n");
    double worst_compile = 0, sum_compile = 0;
    constraint *compiled[N_CORPUS];
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    for (size_t p = 0; p < N_CORPUS; p++) {
        double ct[5];
        constraint *c = NULL;
        for (int i = 0; i < 5; i++) {
            constraint_destroy(&c);
            const double t0 = now_s();
            c = constraint_compile(ix, corpus[p], strlen(corpus[p]), &err);
            ct[i] = now_s() - t0;
            if (!c) die(corpus[p], &err);
        }
        constraint_matcher *m = constraint_matcher_new(c, &err);
        for (int32_t i = 0; i < n_vocab; i++) logits[i] = 0;
        const double t0 = now_s();
        constraint_matcher_mask(m, logits, n_vocab);
        const double mask_ms = 1e3 * (now_s() - t0);
        constraint_matcher_destroy(&m);
        const double med = quantile(ct, 5, 0.5);
        worst_compile = med > worst_compile ? med : worst_compile;
        sum_compile += med;
        printf("| ");
        print_code(corpus[p]);
        printf(" | %u | %.3f | %.3f |\n", constraint_n_states(c), 1e3 * med, mask_ms);
        compiled[p] = c;
    }
    printf("\ncompile: worst %.3f ms, mean %.3f ms over %zu patterns\n\n", 1e3 * worst_compile,
           1e3 * sum_compile / N_CORPUS, N_CORPUS);

    /* 3. per-token cost, cold then warm (the same constraints: their sets are now cached) */
    const size_t cap = N_CORPUS * 20 * 210;
    double *times = malloc(cap * sizeof *times);
    for (int warm = 0; warm < 2; warm++) {
        size_t n_times = 0;
        for (size_t p = 0; p < N_CORPUS; p++) {
            if (!warm) { /* fresh constraints: nothing cached */
                constraint_destroy(&compiled[p]);
                compiled[p] = constraint_compile(ix, corpus[p], strlen(corpus[p]), &err);
            }
            run_random(compiled[p], n_vocab, 20, 1000 + p, times, &n_times, cap);
        }
        double sum = 0;
        for (size_t i = 0; i < n_times; i++) sum += times[i];
        const double mean = n_times ? sum / (double)n_times : 0;
        printf("per-token constraint time, %s (%zu tokens, %d-token vocabulary): median %.1f us, "
               "p99 %.1f us, mean %.1f us\n",
               warm ? "warm (allowed sets cached)" : "cold (first requests of each pattern)",
               n_times, (int)n_vocab, 1e6 * quantile(times, n_times, 0.5),
               1e6 * quantile(times, n_times, 0.99), 1e6 * mean);
    }
    printf("\n");
    free(times);
    free(logits);

    /* 4. decode speed on a synthetic model with the same vocabulary */
    char tmp_dir[64] = "", tmp_model[128] = "";
    const int synthetic = !model_path || access(model_path, R_OK) != 0;
    if (!model_path) {
        snprintf(tmp_dir, sizeof tmp_dir, "/tmp/corral-bench-constraint-XXXXXX");
        if (!mkdtemp(tmp_dir)) die("mkdtemp", NULL);
        snprintf(tmp_model, sizeof tmp_model, "%s/model.gguf", tmp_dir);
        model_path = tmp_model;
    }
    if (synthetic) { /* written here; kept when --model named the file */
        synth_params sp = synth_params_default();
        if (synth_params_set_preset(&sp, "smollm2-135m", &err)) die("preset", &err);
        sp.n_vocab = (uint32_t)n_vocab;
        sp.type = SYNTH_TYPE_Q8_0;
        sp.vocab_from = vocab;
        fprintf(stderr,
                "constraint bench: writing a synthetic SmolLM2-135M-shaped Q8_0 model to "
                "%s\n",
                model_path);
        if (synth_write(&sp, model_path, NULL, &err)) die("synth", &err);
    }
    model *m = model_load(model_path, NULL, &err);
    threadpool *pool = m ? threadpool_new(0, &err) : NULL;
    if (!pool) die(model_path, &err);
    constraint_cache *cc = constraint_cache_new(model_get_tokenizer(m), 0, &err);
    printf("decode on %s, %u threads, temperature 1, top-k 40 (the defaults), median of %u "
           "runs, unconstrained and constrained runs alternating:\n\n",
           synthetic ? "a synthetic SmolLM2-135M-shaped Q8_0 model, 32000-token vocabulary"
                     : model_path,
           threadpool_n_threads(pool), reps);
    printf("| constraint | tokens/run | tok/s | forward us/token | sampling us/token | of which "
           "constraint callbacks | sampling overhead, %% of a token |\n"
           "|---|---|---|---|---|---|---|\n");
    for (size_t d = 0; d < sizeof decode_patterns / sizeof decode_patterns[0]; d++) {
        const char *pat = decode_patterns[d];
        constraint *dc = constraint_compile_cached(cc, pat, strlen(pat), &err);
        if (!dc) die("decode pattern", &err);
        double *v[7];
        for (int k = 0; k < 7; k++) v[k] = malloc(reps * sizeof(double));
        uint32_t n_con = 0, n_free = 0;
        decode(m, pool, dc, 16, 1);           /* warm-up: page cache, first allowed sets */
        for (uint32_t i = 0; i < reps; i++) { /* alternate, so both see the same machine state */
            const decode_run a = decode(m, pool, NULL, n_tokens, 100 + i);
            const decode_run b = decode(m, pool, dc, n_tokens, 100 + i);
            v[0][i] = a.tok_s, v[1][i] = b.tok_s;
            v[2][i] = a.forward_us, v[3][i] = b.forward_us;
            v[4][i] = a.sample_us, v[5][i] = b.sample_us;
            v[6][i] = b.callback_us;
            n_free = a.n, n_con = b.n;
        }
        double med[7];
        for (int k = 0; k < 7; k++) med[k] = quantile(v[k], reps, 0.5);
        const double token_us = med[2] + med[4]; /* an unconstrained token */
        printf("| none | %u | %.2f | %.1f | %.1f | | |\n", n_free, med[0], med[2], med[4]);
        printf("| ");
        print_code(pat);
        printf(" | %u | %.2f | %.1f | %.1f | %.1f | %+.2f%% |\n", n_con, med[1], med[3], med[5],
               med[6], 100.0 * (med[5] - med[4]) / token_us);
        for (int k = 0; k < 7; k++) free(v[k]);
        constraint_destroy(&dc);
    }
    printf("\nThe overhead column compares sampling time only (the forward pass is the same work "
           "either way; its timing moves with machine noise).\n");
    constraint_cache_destroy(&cc);
    threadpool_destroy(&pool);
    model_destroy(&m);
    if (tmp_model[0]) {
        unlink(tmp_model);
        rmdir(tmp_dir);
    }
    for (size_t p = 0; p < N_CORPUS; p++) constraint_destroy(&compiled[p]);
    constraint_index_destroy(&ix);
    tok_destroy(&tok);
    gguf_destroy(&f);
    return 0;
}
