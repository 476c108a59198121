/*
 * test_arch.c — Check suite for the model families beyond llama and qwen2 (engine/src/arch.c):
 * greedy generation of every synthetic reference model against llama.cpp's, Llama 3 RoPE
 * scaling 4096 positions out, a head size decoupled from n_embd / n_head, sliding-window
 * attention far past its window (its cache keeping only the window), logit softcapping, and files
 * of these families that must not load. The logits of the 32 reference positions of every file
 * are checked by test_model.c with the other models; this suite runs on every kernel path too
 * (unit.arch.scalar, .avx2, .avx512).
 *
 * Error budgets (test_model.c's, restated):
 *   fast mode vs llama.cpp or exact logits   F32 1e-3; quantized max 0.5 and rms 0.1
 *   greedy: the reference's ids up to the first step whose reference margin (top1 - top2) is
 *     below the numerical error, taken as twice the largest logit difference from llama.cpp
 *     over the 32 teacher-forced positions (plus GREEDY_MARGIN_FLOOR)
 *   a sliding-window logit at position p against the same tokens run from position 0
 *     WINDOW_SHIFT_MAX_ERR: only the RoPE angles' float rounding differs (absolute positions
 *     around 1300 instead of 15; measured 8e-6), where one token more or less in the window moves
 *     them by 0.03
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "corral/gguf.h"
#include "corral/model.h"
#include "corral/synth.h"
#include "corral/tensor.h"
#include "refdata.h"
#include "testutil.h"

#define FAST_F32_MAX_ERR     1e-3
#define FAST_QUANT_MAX_ERR   0.5
#define FAST_QUANT_RMS_ERR   0.1
#define GREEDY_MARGIN_FLOOR  1e-4
#define WINDOW_SHIFT_MAX_ERR 1e-3

enum { N_VOCAB = 512, MAX_STEMS = 64, N_REF = 32, N_LONG = 4096 };

/* ---- helpers ------------------------------------------------------------------------------ */

static char tmp_dir[] = "/tmp/corral-test-arch-XXXXXX";

static void tmp_setup(void) {
    ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
}

static void tmp_teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(tmp_dir, "/tmp/corral-test-arch-XXXXXX");
}

static model *load(const char *path, model_compute compute) {
    model_params mp = model_params_default();
    mp.compute = compute;
    corral_error err;
    model *m = model_load(path, &mp, &err);
    ck_assert_msg(m != NULL, "%s: %s", path, err.message);
    return m;
}

/* The largest |a - b| over n values, and the rms. */
static double max_diff(const float *a, const float *b, size_t n, double *rms) {
    double mx = 0, sq = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (double)b[i]);
        if (d > mx) mx = d;
        sq += d * d;
    }
    if (rms) *rms = sqrt(sq / (double)n);
    return mx;
}

/* Whether the model's attention weights are F32 (else quantized: the quantized budgets). */
static int is_f32_model(const model *m) {
    const gguf_file *f = model_get_gguf(m);
    const gguf_tensor *t = gguf_find_tensor(f, "blk.0.attn_q.weight");
    if (!t) t = gguf_find_tensor(f, "blk.0.attn_qkv.weight");
    ck_assert_ptr_nonnull(t);
    return t->type == TENSOR_TYPE_F32;
}

/* Teacher-forced logits of ids[0..n) on a fresh F32 cache of n_ctx, the last n_out rows into
 * out (the positions before them run without logits). */
static void run_tail(model *m, const int32_t *ids, uint32_t n, uint32_t n_out, uint32_t n_ctx,
                     uint32_t max_batch, float *out) {
    corral_error err;
    kv_cache *kv = kv_cache_new(m, n_ctx, KV_TYPE_F32, &err);
    model_runner *r = model_runner_new(m, max_batch, NULL, &err);
    ck_assert_ptr_nonnull(kv);
    ck_assert_ptr_nonnull(r);
    if (n > n_out)
        ck_assert_int_eq(model_forward(r, kv, ids, n - n_out, MODEL_LOGITS_NONE, NULL, &err),
                         CORRAL_OK);
    ck_assert_msg(model_forward(r, kv, ids + (n - n_out), n_out, MODEL_LOGITS_ALL, out, &err) ==
                      CORRAL_OK,
                  "%s", err.message);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
}

/* ---- greedy generation of every synthetic model ------------------------------------------ */

/* Reference margins of a stem's greedy run ("step token margin" per line). */
static int read_margins(const char *stem, double *margins, int max) {
    char rel[300];
    snprintf(rel, sizeof rel, "reference/%.127s.greedy.margins.txt", stem);
    size_t len;
    char *text = ref_read_file(rel, &len);
    ck_assert_msg(text != NULL, "cannot read %s", rel);
    int n = 0;
    for (char *line = strtok(text, "\n"); line && n < max; line = strtok(NULL, "\n")) {
        int step, tok;
        double mg;
        if (sscanf(line, "%d %d %lf", &step, &tok, &mg) == 3) margins[n++] = mg;
    }
    free(text);
    return n;
}

/* Greedy decoding from the stem's prompt ids in fast mode (F32 cache): equal to llama.cpp's ids up
 * to the first step whose reference margin is below twice the model's measured error. */
static void check_greedy_stem(const ref_stem *st) {
    model *m = load(test_shared_path(st->model), MODEL_COMPUTE_FAST);
    char rel[300];
    int32_t ids[N_REF], prompt[64], ref[128];
    snprintf(rel, sizeof rel, "reference/%.127s.ids.txt", st->stem);
    ck_assert_int_eq(ref_read_ids(rel, ids, N_REF), N_REF);
    /* The numerical error: teacher-forced logits against llama.cpp's. */
    float *got = malloc((size_t)N_REF * N_VOCAB * sizeof(float));
    run_tail(m, ids, N_REF, N_REF, 64, 0, got);
    snprintf(rel, sizeof rel, "reference/%.127s.logits.f32", st->stem);
    size_t n_ref_logits = 0;
    float *lcpp = ref_read_f32(rel, &n_ref_logits);
    ck_assert_uint_eq(n_ref_logits, (size_t)N_REF * N_VOCAB);
    const double floor = 2 * max_diff(got, lcpp, n_ref_logits, NULL) + GREEDY_MARGIN_FLOOR;
    free(got);
    free(lcpp);

    snprintf(rel, sizeof rel, "reference/%.127s.greedy.prompt_ids.txt", st->stem);
    const int n_prompt = ref_read_ids(rel, prompt, 64);
    snprintf(rel, sizeof rel, "reference/%.127s.greedy.ids.txt", st->stem);
    const int n_ref = ref_read_ids(rel, ref, 128);
    double margins[128];
    ck_assert_int_gt(n_prompt, 0);
    ck_assert_int_eq(read_margins(st->stem, margins, 128), n_ref);
    int must = n_ref;
    for (int i = 0; i < n_ref; i++)
        if (margins[i] < floor) {
            must = i;
            break;
        }
    corral_error err;
    kv_cache *kv = kv_cache_new(m, 128, KV_TYPE_F32, &err);
    model_runner *r = model_runner_new(m, 0, NULL, &err);
    float logits[N_VOCAB];
    ck_assert_int_eq(
        model_forward(r, kv, prompt, (uint32_t)n_prompt, MODEL_LOGITS_LAST, logits, &err),
        CORRAL_OK);
    int equal = -1;
    for (int i = 0; i < n_ref; i++) {
        int32_t next = ref_argmax(logits, N_VOCAB);
        if (equal < 0 && next != ref[i]) equal = i;
        if (i + 1 < n_ref)
            ck_assert_int_eq(model_forward(r, kv, &next, 1, MODEL_LOGITS_LAST, logits, &err),
                             CORRAL_OK);
    }
    if (equal < 0) equal = n_ref;
    printf("  greedy %-26s %2d of %d ids equal (must: %2d; error floor %.2e)\n", st->stem, equal,
           n_ref, must, floor);
    ck_assert_msg(equal >= must, "%s: greedy differs at step %d, before step %d", st->stem, equal,
                  must);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
    model_destroy(&m);
}

START_TEST(test_greedy_every_synthetic_model) {
    ref_stem rows[MAX_STEMS];
    const int n = ref_read_index(rows, MAX_STEMS);
    int checked = 0, new_archs = 0;
    for (int i = 0; i < n; i++) {
        if (strncmp(rows[i].stem, "synth-", 6) != 0 || strcmp(rows[i].lora, "-") != 0) continue;
        check_greedy_stem(&rows[i]);
        checked++;
        new_archs += strstr(rows[i].stem, "qwen3") || strstr(rows[i].stem, "gemma3") ||
                     strstr(rows[i].stem, "phi3") || strstr(rows[i].stem, "llama3rope");
    }
    ck_assert_int_ge(new_archs, 11);
    ck_assert_int_ge(checked, 25);
}
END_TEST

/* ---- Llama 3 RoPE scaling far out ------------------------------------------------------------ */

/* One teacher-forced run of the 4096 ids: positions 4064..4095 against llama.cpp's and the
 * float64 implementation's. rope_freqs.weight moves these logits by 1.4 (README), far outside
 * either budget, so the check fails if the factors are ignored. */
static void check_long(const char *stem) {
    char rel[300];
    snprintf(rel, sizeof rel, "models/%s.gguf", stem);
    model *m = load(test_shared_path(rel), MODEL_COMPUTE_FAST);
    ck_assert_int_eq(model_get_hparams(m)->rope_freq_factors, 1);
    ck_assert_uint_ge(model_get_hparams(m)->n_ctx_train, N_LONG);
    int32_t *ids = malloc(N_LONG * sizeof *ids);
    snprintf(rel, sizeof rel, "reference/%s.long.ids.txt", stem);
    ck_assert_int_eq(ref_read_ids(rel, ids, N_LONG), N_LONG);
    float *got = malloc((size_t)N_REF * N_VOCAB * sizeof(float));
    run_tail(m, ids, N_LONG, N_REF, N_LONG, 0, got);
    const int f32 = is_f32_model(m);
    const double budget = f32 ? FAST_F32_MAX_ERR : FAST_QUANT_MAX_ERR;
    const double rms_budget = f32 ? INFINITY : FAST_QUANT_RMS_ERR;
    int ok = 0;
    for (int k = 0; k < 2; k++) {
        snprintf(rel, sizeof rel, "reference/%s.long.%s", stem,
                 k ? "exact.logits.f32" : "logits.f32");
        size_t n = 0;
        float *want = ref_read_f32(rel, &n);
        ck_assert_uint_eq(n, (size_t)N_REF * N_VOCAB);
        double rms;
        const double mx = max_diff(got, want, n, &rms);
        printf("  long %-24s vs %-9s max %.2e rms %.2e\n", stem, k ? "exact" : "llama.cpp", mx,
               rms);
        ok |= mx <= budget && rms <= rms_budget;
        free(want);
    }
    ck_assert_msg(ok, "%s: positions 4064..4095 outside the budget", stem);
    free(got);
    free(ids);
    model_destroy(&m);
}

/* One file per loop iteration: each gets the whole test timeout (the scalar path under the
 * sanitizers takes minutes for 4096 positions). */
static const char *const LONG_STEMS[] = {"synth-llama3rope-f32", "synth-llama3rope-q8_0",
                                         "synth-llama3rope-q4_k_m"};

START_TEST(test_llama3_rope_scaling_4096_positions) {
    check_long(LONG_STEMS[_i]);
}
END_TEST

/* ---- variants of model files --------------------------------------------------------------- */

/* How to derive a file from a shared model. */
typedef struct variant {
    const char *drop_tensor;
    const char *drop_key;
    const char *set_key; /* a u32 key set to set_value */
    uint32_t set_value;
    const char *set_f32_key; /* an f32 key set to set_f32_value */
    float set_f32_value;
    const char *add_tensor; /* an F32 vector of add_len zeros */
    int64_t add_len;
    int pad_heads; /* qwen3: heads padded from 64 to 128 (see test_decoupled_head_size) */
} variant;

/* Tensor data of the padded-head model (freed by write_variant). */
typedef struct padded {
    float *data[64];
    int n;
} padded;

static float *padded_new(padded *p, size_t n) {
    ck_assert_int_lt(p->n, 64);
    return p->data[p->n++] = calloc(n, sizeof(float));
}

/* The rows of a [n_in x n_heads*64] projection, each head's 64 followed by 64 zero rows. */
static const float *pad_rows(padded *p, const gguf_tensor *t, int64_t *ne) {
    const int64_t n_in = t->ne[0], heads = t->ne[1] / 64;
    float *out = padded_new(p, (size_t)(n_in * heads * 128));
    for (int64_t h = 0; h < heads; h++)
        memcpy(out + h * 128 * n_in, (const float *)t->data + h * 64 * n_in,
               (size_t)(64 * n_in) * sizeof(float));
    ne[1] = heads * 128;
    return out;
}

/* attn_output: each row's inputs per head, 64 followed by 64 zeros. */
static const float *pad_columns(padded *p, const gguf_tensor *t, int64_t *ne) {
    const int64_t heads = t->ne[0] / 64, n_out = t->ne[1];
    float *out = padded_new(p, (size_t)(heads * 128 * n_out));
    for (int64_t r = 0; r < n_out; r++)
        for (int64_t h = 0; h < heads; h++)
            memcpy(out + r * heads * 128 + h * 128,
                   (const float *)t->data + r * heads * 64 + h * 64, 64 * sizeof(float));
    ne[0] = heads * 128;
    return out;
}

/* A norm of a head: 64 weights times `scale`, then 64 zeros. */
static const float *pad_norm(padded *p, const gguf_tensor *t, float scale, int64_t *ne) {
    float *out = padded_new(p, 128);
    for (int i = 0; i < 64; i++) out[i] = ((const float *)t->data)[i] * scale;
    ne[0] = 128;
    return out;
}

/* A copy of model_rel (a file of ../shared, or an absolute path) changed as v says. */
static const char *write_variant(const char *model_rel, const variant *v, const char *name) {
    static char path[300];
    snprintf(path, sizeof path, "%s/%s.gguf", tmp_dir, name);
    corral_error err;
    gguf_file *src = gguf_open(model_rel[0] == '/' ? model_rel : test_shared_path(model_rel), &err);
    ck_assert_msg(src != NULL, "%s", err.message);
    gguf_str arch;
    ck_assert_int_eq(gguf_get_str(src, "general.architecture", &arch, &err), CORRAL_OK);
    gguf_builder *b = gguf_builder_new();
    for (uint64_t i = 0; i < gguf_kv_count(src); i++) {
        const gguf_str key = gguf_kv_key(src, i);
        if (v->drop_key && key.len == strlen(v->drop_key) &&
            memcmp(key.data, v->drop_key, key.len) == 0)
            continue;
        ck_assert_int_eq(gguf_builder_copy_kv(b, src, i), CORRAL_OK);
    }
    if (v->set_key) gguf_builder_set_u32(b, v->set_key, v->set_value);
    if (v->set_f32_key) gguf_builder_set_f32(b, v->set_f32_key, v->set_f32_value);
    padded pad = {0};
    if (v->pad_heads) {
        char key[96];
        snprintf(key, sizeof key, "%.*s.attention.key_length", (int)arch.len, arch.data);
        gguf_builder_set_u32(b, key, 128);
        snprintf(key, sizeof key, "%.*s.attention.value_length", (int)arch.len, arch.data);
        gguf_builder_set_u32(b, key, 128);
        /* The rotation stays on the first 64 dimensions of a head, as before. */
        snprintf(key, sizeof key, "%.*s.rope.dimension_count", (int)arch.len, arch.data);
        gguf_builder_set_u32(b, key, 64);
    }
    for (uint64_t i = 0; i < gguf_tensor_count(src); i++) {
        const gguf_tensor *t = gguf_tensor_at(src, i);
        char tn[128];
        snprintf(tn, sizeof tn, "%.*s", (int)t->name.len, t->name.data);
        if (v->drop_tensor && strcmp(tn, v->drop_tensor) == 0) continue;
        int64_t ne[4];
        memcpy(ne, t->ne, sizeof ne);
        const void *data = t->data;
        if (v->pad_heads) {
            ck_assert_uint_eq(t->type, TENSOR_TYPE_F32);
            if (strstr(tn, "attn_q.weight") || strstr(tn, "attn_k.weight") ||
                strstr(tn, "attn_v.weight"))
                data = pad_rows(&pad, t, ne);
            else if (strstr(tn, "attn_output.weight"))
                data = pad_columns(&pad, t, ne);
            /* RMSNorm over 128 values of which 64 are zero scales a head by sqrt(2): the query
             * keeps it, the key's weights take it back, and the scores' 1/sqrt(128) instead of
             * 1/sqrt(64) undoes the query's. */
            else if (strstr(tn, "attn_q_norm.weight"))
                data = pad_norm(&pad, t, 1.0f, ne);
            else if (strstr(tn, "attn_k_norm.weight"))
                data = pad_norm(&pad, t, 1.0f / sqrtf(2.0f), ne);
        }
        ck_assert_int_eq(gguf_builder_add_tensor(b, tn, t->type, t->n_dims, ne, data, &err),
                         CORRAL_OK);
    }
    float *zeros = v->add_tensor ? calloc((size_t)v->add_len, sizeof(float)) : NULL;
    if (v->add_tensor) {
        const int64_t ne[1] = {v->add_len};
        ck_assert_int_eq(
            gguf_builder_add_tensor(b, v->add_tensor, TENSOR_TYPE_F32, 1, ne, zeros, &err),
            CORRAL_OK);
    }
    ck_assert_msg(gguf_builder_write(b, path, &err) == CORRAL_OK, "%s", err.message);
    gguf_builder_destroy(&b);
    gguf_destroy(&src);
    free(zeros);
    for (int i = 0; i < pad.n; i++) free(pad.data[i]);
    return path;
}

/* ---- a head size apart from n_embd / n_head -------------------------------------------------- */

/* synth-qwen3-f32 rewritten with heads of 128 (each head's 64 values, then 64 zeros: queries 512
 * wide on a residual of 256, key_length 128) computes the same function, so it must give the
 * original's reference logits. A loader that took the head size from n_embd / n_head would refuse
 * the shapes; one that sized attention, the cache or the output projection by n_embd would compute
 * something else. */
START_TEST(test_decoupled_head_size) {
    const char *path =
        write_variant("models/synth-qwen3-f32.gguf", &(variant){.pad_heads = 1}, "wide-heads");
    for (int mode = 0; mode < 2; mode++) {
        model *m = load(path, mode ? MODEL_COMPUTE_REFERENCE : MODEL_COMPUTE_FAST);
        const model_hparams *hp = model_get_hparams(m);
        ck_assert_uint_eq(hp->head_dim, 128);
        ck_assert_uint_eq(hp->n_embd / hp->n_head, 64);
        ck_assert_uint_eq(hp->n_rot, 64);
        ck_assert_uint_eq(kv_cache_bytes_for(m, 100, KV_TYPE_F16),
                          2ull * hp->n_layer * hp->n_head_kv * 100 * 128 * 2);
        int32_t ids[N_REF];
        ck_assert_int_eq(ref_read_ids("reference/synth-qwen3-f32.ids.txt", ids, N_REF), N_REF);
        float *got = malloc((size_t)N_REF * N_VOCAB * sizeof(float));
        run_tail(m, ids, N_REF, N_REF, 64, 0, got);
        size_t n = 0;
        float *exact = ref_read_f32("reference/synth-qwen3-f32.exact.logits.f32", &n);
        ck_assert_uint_eq(n, (size_t)N_REF * N_VOCAB);
        const double mx = max_diff(got, exact, n, NULL);
        printf("  heads of 128 (%s) vs exact: max %.2e\n", mode ? "reference" : "fast", mx);
        ck_assert_msg(mx <= FAST_F32_MAX_ERR, "max |d| %.3g", mx);
        free(got);
        free(exact);
        model_destroy(&m);
    }
}
END_TEST

/* ---- logit softcapping ----------------------------------------------------------------------- */

/* gemma3.final_logit_softcapping c makes every logit c * tanh(l / c) of what it was (Gemma 2's
 * rule, which llama.cpp applies to gemma3 files that have the key; the shared files have none). */
START_TEST(test_logit_softcap) {
    const char *capped = write_variant(
        "models/synth-gemma3-f32.gguf",
        &(variant){.set_f32_key = "gemma3.final_logit_softcapping", .set_f32_value = 2.5f},
        "softcap");
    int32_t ids[N_REF];
    ck_assert_int_eq(ref_read_ids("reference/synth-gemma3-f32.ids.txt", ids, N_REF), N_REF);
    model *m = load(test_shared_path("models/synth-gemma3-f32.gguf"), MODEL_COMPUTE_FAST);
    model *c = load(capped, MODEL_COMPUTE_FAST);
    ck_assert_float_eq(model_get_hparams(c)->logit_softcap, 2.5f);
    ck_assert_float_eq(model_get_hparams(m)->logit_softcap, 0.0f);
    float *plain = malloc((size_t)N_REF * N_VOCAB * sizeof(float));
    float *got = malloc((size_t)N_REF * N_VOCAB * sizeof(float));
    run_tail(m, ids, N_REF, N_REF, 64, 0, plain);
    run_tail(c, ids, N_REF, N_REF, 64, 0, got);
    double worst = 0, spread = 0;
    for (size_t i = 0; i < (size_t)N_REF * N_VOCAB; i++) {
        const double want = 2.5 * tanh(plain[i] / 2.5);
        worst = fmax(worst, fabs(got[i] - want));
        spread = fmax(spread, fabs(got[i] - plain[i]));
        ck_assert(fabsf(got[i]) <= 2.5f);
    }
    ck_assert_msg(worst <= 1e-5, "max |capped - c tanh(l/c)| %.3g", worst);
    ck_assert_double_gt(spread, 0.5); /* the cap changed the logits */
    free(plain);
    free(got);
    model_destroy(&c);
    model_destroy(&m);
}
END_TEST

/* ---- sliding-window attention far out ------------------------------------------------------ */

/* A small gemma3 with a window of 8 over 2048 positions (generated vocabulary of 300): every layer
 * slides (pattern 0), or one in two (pattern 2); n_layer layers (0: synth's default, 2). */
static const char *write_window_model_layers(uint32_t pattern, uint32_t n_layer, const char *name) {
    synth_params p = synth_params_default();
    snprintf(p.arch, sizeof p.arch, "gemma3");
    if (n_layer) p.n_layer = n_layer;
    p.n_embd = 64;
    p.n_head = 2;
    p.n_head_kv = 1;
    p.head_dim = 32;
    p.n_ff = 128;
    p.n_vocab = 300;
    p.n_ctx = 2048;
    p.rope_base = 1e6f;
    p.rms_eps = 1e-6f;
    p.tied = 1;
    p.n_swa = 8;
    p.swa_pattern = pattern;
    p.seed = 21;
    p.n_threads = 1;
    static char path[300];
    snprintf(path, sizeof path, "%s/%s.gguf", tmp_dir, name);
    corral_error err;
    ck_assert_msg(synth_write(&p, path, NULL, &err) == CORRAL_OK, "%s", err.message);
    return path;
}

static const char *write_window_model(uint32_t pattern, const char *name) {
    return write_window_model_layers(pattern, 0, name);
}

enum { WINDOW_RUN = 1300, WINDOW_VOCAB = 300 };

static void window_tokens(int32_t *ids, uint32_t n) {
    uint64_t s = 12345;
    for (uint32_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = 3 + (int32_t)((s >> 33) % (WINDOW_VOCAB - 3));
    }
}

/* With every layer sliding (2 layers, window 8), the logits at p depend on tokens p - 14 .. p
 * only, and rotary attention only on their relative positions: the same 15 tokens run from
 * position 0 give the same logits up to the angles' rounding. In passes of 512 the cache moves its
 * rows before positions 512 and 1024: the positions around those moves and the last ones are
 * checked, so rows kept from the wrong positions would show. The cache keeps 8 + KV_WINDOW_SLACK
 * rows per layer, not 2048. */
START_TEST(test_window_far_out_matches_a_fresh_run) {
    model *m = load(write_window_model(0, "all-sliding"), MODEL_COMPUTE_FAST);
    const model_hparams *hp = model_get_hparams(m);
    ck_assert_uint_eq(hp->n_swa, 8);
    ck_assert_uint_eq(hp->n_swa_layers, hp->n_layer);
    ck_assert_uint_eq(kv_cache_bytes_for(m, 2048, KV_TYPE_F32),
                      2ull * hp->n_layer * hp->n_head_kv * (8 + KV_WINDOW_SLACK) * 32 * 4);
    int32_t ids[WINDOW_RUN];
    window_tokens(ids, WINDOW_RUN);
    const uint32_t field = 2 * (hp->n_swa - 1) + 1;
    float *far = malloc((size_t)WINDOW_RUN * WINDOW_VOCAB * sizeof(float));
    run_tail(m, ids, WINDOW_RUN, WINDOW_RUN, 2048, 0, far);
    static const uint32_t spans[][2] = {{500, 550}, {1010, 1060}, {1260, WINDOW_RUN}};
    float fresh[WINDOW_VOCAB];
    double worst = 0;
    for (size_t k = 0; k < sizeof spans / sizeof spans[0]; k++)
        for (uint32_t p = spans[k][0]; p < spans[k][1]; p++) {
            run_tail(m, ids + p + 1 - field, field, 1, field, 0, fresh);
            const double d = max_diff(far + (size_t)p * WINDOW_VOCAB, fresh, WINDOW_VOCAB, NULL);
            if (d > worst) worst = d;
        }
    printf("  window 8, around positions 512, 1024 and 1300, against fresh runs of 15 tokens: "
           "max %.2e\n",
           worst);
    ck_assert_msg(worst <= WINDOW_SHIFT_MAX_ERR, "max |d| %.3g", worst);
    /* One token fewer than the receptive field changes the logits: the test can see a window
     * that is one position off. */
    run_tail(m, ids + WINDOW_RUN - field + 1, field - 1, 1, field, 0, fresh);
    ck_assert_double_gt(
        max_diff(far + (size_t)(WINDOW_RUN - 1) * WINDOW_VOCAB, fresh, WINDOW_VOCAB, NULL),
        10 * WINDOW_SHIFT_MAX_ERR);
    free(far);
    model_destroy(&m);
}
END_TEST

/* Logits of positions `at` of the run, computed by model_forward calls of `step` tokens (0: one
 * call) on a runner of max_batch. */
static void window_logits(model *m, const int32_t *ids, uint32_t step, uint32_t max_batch,
                          const uint32_t *at, int n_at, float *out) {
    corral_error err;
    kv_cache *kv = kv_cache_new(m, 2048, KV_TYPE_F16, &err);
    model_runner *r = model_runner_new(m, max_batch, NULL, &err);
    float *all = malloc((size_t)WINDOW_RUN * WINDOW_VOCAB * sizeof(float));
    if (step == 0) {
        ck_assert_int_eq(model_forward(r, kv, ids, WINDOW_RUN, MODEL_LOGITS_ALL, all, &err),
                         CORRAL_OK);
    } else {
        for (uint32_t i = 0; i < WINDOW_RUN; i += step) {
            const uint32_t n = WINDOW_RUN - i < step ? WINDOW_RUN - i : step;
            ck_assert_int_eq(model_forward(r, kv, ids + i, n, MODEL_LOGITS_ALL,
                                           all + (size_t)i * WINDOW_VOCAB, &err),
                             CORRAL_OK);
        }
    }
    for (int k = 0; k < n_at; k++)
        memcpy(out + (size_t)k * WINDOW_VOCAB, all + (size_t)at[k] * WINDOW_VOCAB,
               WINDOW_VOCAB * sizeof(float));
    free(all);
    model_runner_destroy(&r);
    kv_cache_destroy(&kv);
}

/* The window's rows move at different moments when the tokens come in other pieces (one call,
 * passes of 7, calls of 1, of 100, of 513): the logits are the same bits every time, with sliding
 * and full layers mixed. */
START_TEST(test_window_bit_identical_however_cut) {
    model *m = load(write_window_model(2, "half-sliding"), MODEL_COMPUTE_FAST);
    ck_assert_uint_eq(model_get_hparams(m)->n_swa_layers, 1);
    ck_assert_int_eq(model_layer_slides(m, 0), 1);
    ck_assert_int_eq(model_layer_slides(m, 1), 0);
    int32_t ids[WINDOW_RUN];
    window_tokens(ids, WINDOW_RUN);
    static const uint32_t at[] = {0, 7, 8, 9, 500, 520, 521, 522, 523, 1029, 1030, 1031, 1299};
    const int n_at = sizeof at / sizeof at[0];
    const size_t bytes = (size_t)n_at * WINDOW_VOCAB * sizeof(float);
    float *want = malloc(bytes), *got = malloc(bytes);
    window_logits(m, ids, 0, 0, at, n_at, want);
    static const struct {
        uint32_t step, max_batch;
    } cuts[] = {{0, 7}, {1, 0}, {100, 0}, {513, 0}, {37, 16}};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        window_logits(m, ids, cuts[c].step, cuts[c].max_batch, at, n_at, got);
        for (int k = 0; k < n_at; k++)
            ck_assert_msg(memcmp(got + (size_t)k * WINDOW_VOCAB, want + (size_t)k * WINDOW_VOCAB,
                                 WINDOW_VOCAB * sizeof(float)) == 0,
                          "calls of %u tokens, passes of %u: position %u differs", cuts[c].step,
                          cuts[c].max_batch, at[k]);
    }
    free(want);
    free(got);
    model_destroy(&m);
}
END_TEST

/* Gemma 3 files as llama.cpp's converter writes them have no sliding_window_pattern: llama.cpp
 * slides the first five layers of every six, and so must corral. A 12-layer model with the key
 * (6) and its copy without it: the same layers slide and the logits are the same bits; with the
 * key at 2 they differ (the check sees the pattern). */
START_TEST(test_gemma3_without_a_pattern_key_slides_five_layers_of_six) {
    char with_key[300];
    snprintf(with_key, sizeof with_key, "%s", write_window_model_layers(6, 12, "pattern-6"));
    char without[300]; /* write_variant's answer is its static buffer: kept before the next */
    snprintf(without, sizeof without, "%s",
             write_variant(with_key,
                           &(variant){.drop_key = "gemma3.attention.sliding_window_pattern"},
                           "no-pattern"));
    char other[300];
    snprintf(other, sizeof other, "%s",
             write_variant(
                 with_key,
                 &(variant){.set_key = "gemma3.attention.sliding_window_pattern", .set_value = 2},
                 "pattern-2"));
    model *a = load(with_key, MODEL_COMPUTE_FAST);
    model *b = load(without, MODEL_COMPUTE_FAST);
    model *c = load(other, MODEL_COMPUTE_FAST);
    const model_hparams *hp = model_get_hparams(b);
    ck_assert_uint_eq(hp->n_layer, 12);
    ck_assert_uint_eq(hp->swa_pattern, 6);
    ck_assert_uint_eq(hp->n_swa_layers, 10);
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        ck_assert_int_eq(model_layer_slides(b, il), il % 6 < 5);
        ck_assert_int_eq(model_layer_slides(a, il), model_layer_slides(b, il));
    }
    enum { N = 40 }; /* 5 windows of 8: the full layers see what the sliding ones do not */
    int32_t ids[N];
    window_tokens(ids, N);
    float *la = malloc(sizeof(float) * N * WINDOW_VOCAB);
    float *lb = malloc(sizeof(float) * N * WINDOW_VOCAB);
    float *lc = malloc(sizeof(float) * N * WINDOW_VOCAB);
    run_tail(a, ids, N, N, 64, 0, la);
    run_tail(b, ids, N, N, 64, 0, lb);
    run_tail(c, ids, N, N, 64, 0, lc);
    ck_assert(memcmp(la, lb, sizeof(float) * N * WINDOW_VOCAB) == 0);
    ck_assert_double_gt(max_diff(la, lc, (size_t)N * WINDOW_VOCAB, NULL), 1e-3);
    free(la);
    free(lb);
    free(lc);
    model_destroy(&c);
    model_destroy(&b);
    model_destroy(&a);
}
END_TEST

/* Truncation keeps what the window still has (else empties the cache); a cache written out row by
 * row (kv_cache_rows from kv_cache_layer_first) and read into a new one, or copied, continues
 * exactly as the original. */
START_TEST(test_window_truncate_copy_and_rows) {
    model *m = load(write_window_model(2, "half-sliding"), MODEL_COMPUTE_FAST);
    const model_hparams *hp = model_get_hparams(m);
    corral_error err;
    int32_t ids[WINDOW_RUN];
    window_tokens(ids, WINDOW_RUN);
    model_runner *r = model_runner_new(m, 0, NULL, &err);
    kv_cache *kv = kv_cache_new(m, 2048, KV_TYPE_F16, &err);
    ck_assert_int_eq(model_forward(r, kv, ids, 1200, MODEL_LOGITS_NONE, NULL, &err), CORRAL_OK);
    const uint32_t first = kv_cache_layer_first(kv, 0);
    ck_assert_uint_gt(first, 0); /* its rows moved */
    ck_assert_uint_le(1200 - first, 8 + KV_WINDOW_SLACK);
    ck_assert_uint_eq(kv_cache_layer_first(kv, 1), 0);

    /* Copy, and rows out and back into a new cache: the same next logits. */
    float want[WINDOW_VOCAB], got[WINDOW_VOCAB];
    kv_cache *copy = kv_cache_new(m, 1400, KV_TYPE_F16, &err);
    ck_assert_int_eq(kv_cache_copy(copy, kv, &err), CORRAL_OK);
    kv_cache *back = kv_cache_new(m, 2048, KV_TYPE_F16, &err);
    for (uint32_t il = 0; il < hp->n_layer; il++)
        for (uint32_t h = 0; h < hp->n_head_kv; h++)
            for (int values = 0; values < 2; values++) {
                size_t row_bytes;
                const void *rows = kv_cache_rows(kv, il, h, values, &row_bytes);
                ck_assert_ptr_nonnull(rows);
                ck_assert_int_eq(kv_cache_load_rows(back, il, h, values, rows,
                                                    kv_cache_layer_first(kv, il), 1200, &err),
                                 CORRAL_OK);
            }
    ck_assert_int_eq(model_forward(r, kv, ids + 1200, 50, MODEL_LOGITS_LAST, want, &err),
                     CORRAL_OK);
    ck_assert_int_eq(model_forward(r, copy, ids + 1200, 50, MODEL_LOGITS_LAST, got, &err),
                     CORRAL_OK);
    ck_assert(memcmp(got, want, sizeof got) == 0);
    ck_assert_int_eq(model_forward(r, back, ids + 1200, 50, MODEL_LOGITS_LAST, got, &err),
                     CORRAL_OK);
    ck_assert(memcmp(got, want, sizeof got) == 0);

    /* A sliding layer's rows that do not keep the window of the last position are refused. */
    size_t row_bytes;
    const void *rows = kv_cache_rows(kv, 0, 0, 0, &row_bytes);
    ck_assert_int_eq(kv_cache_load_rows(back, 0, 0, 0, rows, 1245, 1250, &err),
                     CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(kv_cache_load_rows(back, 1, 0, 0, rows, 5, 10, &err),
                     CORRAL_INVALID_ARGUMENT); /* a full layer starts at 0 */

    /* Truncation: a few positions back keeps them and runs on like the original. */
    ck_assert_uint_eq(kv_cache_truncate(kv, 1240), 1240);
    ck_assert_int_eq(model_forward(r, kv, ids + 1240, 10, MODEL_LOGITS_LAST, got, &err), CORRAL_OK);
    ck_assert(memcmp(got, want, sizeof got) == 0);
    /* Further back than the rows still held: the cache empties. */
    ck_assert_uint_eq(kv_cache_truncate(kv, 100), 0);
    ck_assert_uint_eq(kv_cache_n_pos(kv), 0);
    ck_assert_int_eq(model_forward(r, kv, ids, 1250, MODEL_LOGITS_LAST, got, &err), CORRAL_OK);
    ck_assert(memcmp(got, want, sizeof got) == 0);
    kv_cache_destroy(&back);
    kv_cache_destroy(&copy);
    kv_cache_destroy(&kv);
    model_runner_destroy(&r);
    model_destroy(&m);
}
END_TEST

/* ---- files that must not load ---------------------------------------------------------------- */

static void expect_refused(const char *model_rel, const variant *v, const char *name,
                           corral_status want, const char *text) {
    const char *path = write_variant(model_rel, v, name);
    corral_error err;
    model *m = model_load(path, NULL, &err);
    ck_assert_msg(m == NULL, "%s loaded", name);
    ck_assert_msg(err.status == want, "%s: %s", name, err.message);
    ck_assert_msg(strstr(err.message, text) != NULL, "%s: '%s' lacks '%s'", name, err.message,
                  text);
}

START_TEST(test_bad_files_of_new_archs) {
    expect_refused("models/synth-qwen3-f32.gguf",
                   &(variant){.set_key = "qwen3.attention.value_length", .set_value = 32},
                   "value-length", CORRAL_UNSUPPORTED, "value_length = 32");
    expect_refused("models/synth-qwen3-f32.gguf",
                   &(variant){.drop_tensor = "blk.1.attn_k_norm.weight"}, "no-k-norm",
                   CORRAL_FORMAT, "tensor blk.1.attn_k_norm.weight is missing");
    expect_refused("models/synth-phi3-q8_0.gguf",
                   &(variant){.add_tensor = "rope_factors_long.weight", .add_len = 32}, "longrope",
                   CORRAL_UNSUPPORTED, "LongRoPE");
    expect_refused("models/synth-phi3-q8_0.gguf",
                   &(variant){.set_key = "phi3.attention.head_count_kv", .set_value = 4},
                   "fused-shape", CORRAL_FORMAT,
                   "blk.0.attn_qkv.weight has shape [256, 512], expected [256, 768]");
    expect_refused("models/synth-gemma3-q8_0.gguf",
                   &(variant){.set_key = "gemma3.attention.sliding_window_pattern", .set_value = 9},
                   "pattern", CORRAL_FORMAT, "sliding_window_pattern = 9");
    expect_refused("models/synth-gemma3-q8_0.gguf",
                   &(variant){.drop_tensor = "blk.0.post_ffw_norm.weight"}, "no-post-norm",
                   CORRAL_FORMAT, "post_ffw_norm");
}
END_TEST

static Suite *arch_suite(void) {
    Suite *s = suite_create("arch");
    TCase *core = tcase_create("core");
    tcase_add_checked_fixture(core, tmp_setup, tmp_teardown);
    tcase_add_test(core, test_greedy_every_synthetic_model);
    tcase_add_loop_test(core, test_llama3_rope_scaling_4096_positions, 0,
                        (int)(sizeof LONG_STEMS / sizeof LONG_STEMS[0]));
    tcase_add_test(core, test_decoupled_head_size);
    tcase_add_test(core, test_logit_softcap);
    tcase_add_test(core, test_gemma3_without_a_pattern_key_slides_five_layers_of_six);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_checked_fixture(limits, tmp_setup, tmp_teardown);
    tcase_add_test(limits, test_window_far_out_matches_a_fresh_run);
    tcase_add_test(limits, test_window_bit_identical_however_cut);
    tcase_add_test(limits, test_window_truncate_copy_and_rows);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_checked_fixture(errors, tmp_setup, tmp_teardown);
    tcase_add_test(errors, test_bad_files_of_new_archs);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(arch_suite)
