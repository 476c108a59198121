/*
 * test_quantize.c — Check suite for the quantize module (corral/quantize.h): every type and
 * mixture against the files llama-quantize made (../shared/models/synth-*-q*.gguf, tensor for
 * tensor, byte for byte), the recipe's choices, the importance-weighted quantizers lowering the
 * output error they aim at, measured errors, the size budget, row sources, streaming with any
 * number of threads, and the errors.
 *
 * Bounds: the output must equal llama.cpp's bytes exactly (no budget); importance must lower the
 * importance-weighted error of every tensor and type it applies to (by any amount: the weighted
 * quantizers are llama.cpp's, whose gain on these random weights is 1-3%).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "corral/gguf.h"
#include "corral/imatrix.h"
#include "corral/quantize.h"
#include "corral/tensor.h"
#include "corral/threadpool.h"
#include "quantize_impl.h"
#include "testutil.h"

/* ---- helpers --------------------------------------------------------------------------------- */

static char tmp_dir[] = "/tmp/corral-test-quantize-XXXXXX";

static void tmp_setup(void) {
    ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
}

static void tmp_teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(tmp_dir, "/tmp/corral-test-quantize-XXXXXX");
}

static const char *tmp_path(const char *name) {
    static char path[8][512];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 512, "%s/%s", tmp_dir, name);
    return p;
}

static char *shared(const char *rel) {
    return strdup(test_shared_path(rel));
}

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static gguf_file *open_ok(const char *path) {
    corral_error err;
    gguf_file *f = gguf_open(path, &err);
    ck_assert_msg(f != NULL, "%s", err.message);
    return f;
}

/* Quantize the shared model `model` (relative to the shared dir) to out with params p. */
static void quantize_ok(const char *model, const char *out, const quantize_params *p,
                        quantize_result *res) {
    char *in = shared(model);
    corral_error err;
    ck_assert_msg(quantize_file(in, out, p, res, &err) == CORRAL_OK, "%s -> %s: %s", in, out,
                  err.message);
    free(in);
}

/* Every tensor of ref is in got with the same type, shape and bytes; and the order is the same. */
static void assert_same_tensors(const char *got_path, const char *ref_rel) {
    char *ref_path = shared(ref_rel);
    gguf_file *got = open_ok(got_path), *ref = open_ok(ref_path);
    ck_assert_uint_eq(gguf_tensor_count(got), gguf_tensor_count(ref));
    for (uint64_t i = 0; i < gguf_tensor_count(ref); i++) {
        const gguf_tensor *r = gguf_tensor_at(ref, i), *g = gguf_tensor_at(got, i);
        ck_assert_msg(g->name.len == r->name.len &&
                          memcmp(g->name.data, r->name.data, (size_t)r->name.len) == 0,
                      "%s: tensor %llu is %.*s, the reference has %.*s", ref_rel,
                      (unsigned long long)i, (int)g->name.len, g->name.data, (int)r->name.len,
                      r->name.data);
        ck_assert_msg(g->type == r->type, "%s: %.*s is %s, the reference %s", ref_rel,
                      (int)r->name.len, r->name.data, tensor_type_name(g->type),
                      tensor_type_name(r->type));
        ck_assert_uint_eq(g->n_dims, r->n_dims);
        for (uint32_t d = 0; d < r->n_dims; d++) ck_assert_int_eq(g->ne[d], r->ne[d]);
        ck_assert_uint_eq(g->size, r->size);
        ck_assert_msg(memcmp(g->data, r->data, (size_t)r->size) == 0, "%s: %.*s: bytes differ",
                      ref_rel, (int)r->name.len, r->name.data);
    }
    gguf_destroy(&got);
    gguf_destroy(&ref);
    free(ref_path);
}

/* Matches a rule when its pattern is a substring of the name (enough for the engine's tests; the
 * CLI matches regular expressions). */
static int substring_match(void *user, uint32_t rule, const char *name) {
    const quantize_override *o = user;
    return strstr(name, o[rule].pattern) != NULL;
}

static const quantize_tensor_info *find_info(const quantize_result *r, const char *name) {
    for (uint32_t i = 0; i < r->n_tensors; i++)
        if (strcmp(r->tensors[i].name, name) == 0) return &r->tensors[i];
    ck_abort_msg("tensor %s not in the result", name);
    return NULL;
}

/* ---- core: llama.cpp's bytes ----------------------------------------------------------------- */

/* The shared synth-llama-<t>.gguf files are llama-quantize --pure of synth-llama-f32.gguf, and
 * synth-llama-q4_k_m.gguf its Q4_K_M mixture: corral's output has the same tensors, in the same
 * order, with the same bytes. */
START_TEST(test_synth_llama_matches_llama_quantize) {
    static const struct {
        const char *type, *ref;
        int pure;
    } cases[] = {
        {"Q4_0", "models/synth-llama-q4_0.gguf", 1},
        {"Q4_1", "models/synth-llama-q4_1.gguf", 1},
        {"Q5_0", "models/synth-llama-q5_0.gguf", 1},
        {"Q5_1", "models/synth-llama-q5_1.gguf", 1},
        {"Q8_0", "models/synth-llama-q8_0.gguf", 1},
        {"Q4_K_S", "models/synth-llama-q4_k.gguf", 1},
        {"Q5_K_S", "models/synth-llama-q5_k.gguf", 1},
        {"Q6_K", "models/synth-llama-q6_k.gguf", 1},
        {"Q4_K_M", "models/synth-llama-q4_k_m.gguf", 0},
        {"F16", "models/synth-llama-f16.gguf", 0},
        {"BF16", "models/synth-llama-bf16.gguf", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        quantize_params p = quantize_params_default();
        ck_assert_int_eq(quantize_ftype_from_name(cases[i].type, &p.ftype), 0);
        p.pure = cases[i].pure;
        const char *out = tmp_path("out.gguf");
        quantize_ok("models/synth-llama-f32.gguf", out, &p, NULL);
        assert_same_tensors(out, cases[i].ref);
    }
}
END_TEST

/* The qwen2 shape (biases) for the one quantized reference it has, and stories260K, whose rows of
 * 64 and 172 make llama.cpp fall back: its shared Q4_0 and Q8_0 files (an older llama-quantize)
 * keep ffn_down in F16 and the output in Q8_0, as corral does. */
START_TEST(test_qwen2_and_stories_match_shared_files) {
    quantize_params p = quantize_params_default();
    p.ftype = QUANTIZE_FTYPE_Q8_0;
    quantize_ok("models/synth-qwen2-f32.gguf", tmp_path("q.gguf"), &p, NULL);
    assert_same_tensors(tmp_path("q.gguf"), "models/synth-qwen2-q8_0.gguf");
    p.ftype = QUANTIZE_FTYPE_F16;
    quantize_ok("models/synth-qwen2-f32.gguf", tmp_path("q.gguf"), &p, NULL);
    assert_same_tensors(tmp_path("q.gguf"), "models/synth-qwen2-f16.gguf");
    const struct {
        quantize_ftype ft;
        const char *ref;
    } stories[] = {{QUANTIZE_FTYPE_Q4_0, "models/stories260K-q4_0.gguf"},
                   {QUANTIZE_FTYPE_Q8_0, "models/stories260K-q8_0.gguf"}};
    for (int i = 0; i < 2; i++) {
        quantize_params sp = quantize_params_default();
        sp.ftype = stories[i].ft;
        quantize_result res;
        quantize_ok("models/stories260K.gguf", tmp_path("s.gguf"), &sp, &res);
        /* The shared files list their tensors in another order: compare by name. */
        char *ref_path = shared(stories[i].ref);
        gguf_file *got = open_ok(tmp_path("s.gguf")), *ref = open_ok(ref_path);
        for (uint64_t t = 0; t < gguf_tensor_count(ref); t++) {
            const gguf_tensor *r = gguf_tensor_at(ref, t);
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)r->name.len, r->name.data);
            const gguf_tensor *g = gguf_find_tensor(got, name);
            ck_assert_ptr_nonnull(g);
            ck_assert_msg(g->type == r->type && g->size == r->size &&
                              memcmp(g->data, r->data, (size_t)r->size) == 0,
                          "%s: %s differs", stories[i].ref, name);
        }
        ck_assert_uint_eq(res.n_fallback, i == 0 ? 6 : 5); /* output (Q6_K) and 5 ffn_down */
        gguf_destroy(&got);
        gguf_destroy(&ref);
        free(ref_path);
        quantize_result_free(&res);
    }
}
END_TEST

/* The whole file, metadata included, is the same with 1 and 2 threads (rows are independent),
 * and it ends with llama-quantize's two keys. */
START_TEST(test_threads_do_not_change_the_file) {
    quantize_params p = quantize_params_default();
    p.ftype = QUANTIZE_FTYPE_Q4_K_M;
    corral_error err;
    threadpool *pool = threadpool_new(2, &err);
    ck_assert_ptr_nonnull(pool);
    quantize_ok("models/synth-qwen2-f32.gguf", tmp_path("one.gguf"), &p, NULL);
    p.pool = pool;
    quantize_ok("models/synth-qwen2-f32.gguf", tmp_path("two.gguf"), &p, NULL);
    threadpool_destroy(&pool);
    gguf_file *a = open_ok(tmp_path("one.gguf")), *b = open_ok(tmp_path("two.gguf"));
    ck_assert_uint_eq(gguf_file_size(a), gguf_file_size(b));
    ck_assert(memcmp(gguf_file_data(a), gguf_file_data(b), (size_t)gguf_file_size(a)) == 0);
    const uint64_t n_kv = gguf_kv_count(a);
    ck_assert(gguf_str_eq(gguf_kv_key(a, n_kv - 2), "general.quantization_version"));
    ck_assert(gguf_str_eq(gguf_kv_key(a, n_kv - 1), "general.file_type"));
    uint32_t ft;
    ck_assert_int_eq(gguf_get_u32(a, "general.file_type", &ft, &err), CORRAL_OK);
    ck_assert_uint_eq(ft, QUANTIZE_FTYPE_Q4_K_M);
    gguf_destroy(&a);
    gguf_destroy(&b);
}
END_TEST

/* The recipe's choices, explained: Q4_K_M gives the output Q6_K and, of 2 layers, layer 1's
 * attn_v and ffn_down Q6_K (use_more_bits); Q4_K_S gives the first 4 attn_v Q5_K; the aliases
 * name the mixtures. */
START_TEST(test_recipe_choices) {
    char *in = shared("models/synth-llama-f32.gguf");
    gguf_file *f = open_ok(in);
    quantize_params p = quantize_params_default();
    quantize_result r;
    corral_error err;
    ck_assert_int_eq(quantize_ftype_from_name("q4_k", &p.ftype), 0);
    ck_assert_int_eq(p.ftype, QUANTIZE_FTYPE_Q4_K_M);
    ck_assert_int_eq(quantize_plan(f, &p, &r, &err), CORRAL_OK);
    ck_assert_uint_eq(find_info(&r, "output.weight")->type, TENSOR_TYPE_Q6_K);
    ck_assert_int_eq(find_info(&r, "output.weight")->reason, QUANTIZE_REASON_RECIPE);
    ck_assert_uint_eq(find_info(&r, "blk.0.attn_v.weight")->type, TENSOR_TYPE_Q4_K);
    ck_assert_uint_eq(find_info(&r, "blk.1.attn_v.weight")->type, TENSOR_TYPE_Q6_K);
    ck_assert_uint_eq(find_info(&r, "blk.1.ffn_down.weight")->type, TENSOR_TYPE_Q6_K);
    ck_assert_uint_eq(find_info(&r, "blk.0.attn_norm.weight")->type, TENSOR_TYPE_F32);
    ck_assert_int_eq(find_info(&r, "blk.0.attn_norm.weight")->reason, QUANTIZE_REASON_KEPT);
    /* llama.cpp's order: the tensors outside the layers first, by name. */
    ck_assert_str_eq(r.tensors[0].name, "output.weight");
    ck_assert_str_eq(r.tensors[2].name, "token_embd.weight");
    ck_assert_str_eq(r.tensors[3].name, "blk.0.attn_k.weight");
    quantize_result_free(&r);
    p.ftype = QUANTIZE_FTYPE_Q4_K_S;
    ck_assert_int_eq(quantize_plan(f, &p, &r, &err), CORRAL_OK);
    ck_assert_uint_eq(find_info(&r, "blk.1.attn_v.weight")->type, TENSOR_TYPE_Q5_K);
    ck_assert_uint_eq(find_info(&r, "blk.1.ffn_down.weight")->type, TENSOR_TYPE_Q4_K);
    quantize_result_free(&r);
    ck_assert_str_eq(quantize_ftype_name(QUANTIZE_FTYPE_Q5_K_M), "Q5_K_M");
    ck_assert_int_eq(quantize_ftype_default_type(QUANTIZE_FTYPE_Q5_K_S), TENSOR_TYPE_Q5_K);
    ck_assert_int_ne(quantize_ftype_from_name("q3_k_m", &p.ftype), 0);
    gguf_destroy(&f);
    free(in);
}
END_TEST

/* --output-tensor-type, --token-embedding-type and --tensor-type in llama.cpp's precedence, and
 * --leave-output-tensor. */
START_TEST(test_overrides) {
    char *in = shared("models/synth-llama-f32.gguf");
    gguf_file *f = open_ok(in);
    quantize_override rules[] = {{"attn_v", TENSOR_TYPE_Q8_0}, {"blk.1.", TENSOR_TYPE_Q5_0}};
    quantize_params p = quantize_params_default();
    p.ftype = QUANTIZE_FTYPE_Q4_K_M;
    p.output_tensor_type = TENSOR_TYPE_Q8_0;
    p.token_embedding_type = TENSOR_TYPE_Q6_K;
    p.overrides = rules;
    p.n_overrides = 2;
    p.match = substring_match;
    p.match_user = rules;
    quantize_result r;
    corral_error err;
    ck_assert_int_eq(quantize_plan(f, &p, &r, &err), CORRAL_OK);
    ck_assert_uint_eq(find_info(&r, "output.weight")->type, TENSOR_TYPE_Q8_0);
    ck_assert_uint_eq(find_info(&r, "token_embd.weight")->type, TENSOR_TYPE_Q6_K);
    ck_assert_uint_eq(find_info(&r, "blk.0.attn_v.weight")->type, TENSOR_TYPE_Q8_0);
    ck_assert_uint_eq(find_info(&r, "blk.1.attn_v.weight")->type, TENSOR_TYPE_Q8_0); /* first */
    ck_assert_uint_eq(find_info(&r, "blk.1.ffn_down.weight")->type, TENSOR_TYPE_Q5_0);
    ck_assert_uint_eq(find_info(&r, "blk.0.ffn_down.weight")->type, TENSOR_TYPE_Q4_K);
    ck_assert_int_eq(find_info(&r, "blk.1.ffn_down.weight")->reason, QUANTIZE_REASON_OVERRIDE);
    quantize_result_free(&r);
    quantize_params q = quantize_params_default();
    q.ftype = QUANTIZE_FTYPE_Q4_0;
    q.leave_output = 1;
    ck_assert_int_eq(quantize_plan(f, &q, &r, &err), CORRAL_OK);
    ck_assert_uint_eq(find_info(&r, "output.weight")->type, TENSOR_TYPE_F32);
    ck_assert(!find_info(&r, "output.weight")->converted);
    quantize_result_free(&r);
    gguf_destroy(&f);
    free(in);
}
END_TEST

/* For every type with a weighted quantizer, importance lowers the importance-weighted error of
 * the very rows it is given for (what the weighted quantizers minimise), on real rows of a
 * synthetic model with a strongly uneven importance. */
START_TEST(test_importance_lowers_weighted_error) {
    char *in = shared("models/synth-llama-f32.gguf");
    gguf_file *f = open_ok(in);
    const gguf_tensor *t = gguf_find_tensor(f, "blk.0.ffn_down.weight");
    ck_assert_ptr_nonnull(t);
    const int64_t n = t->ne[0], rows = 64;
    float *imp = malloc((size_t)n * sizeof *imp);
    uint64_t s = 42;
    for (int64_t j = 0; j < n; j++)
        imp[j] = 0.05f + 20.0f * powf((float)(test_splitmix64(&s) >> 40) / 16777216.0f, 4.0f);
    const tensor_type types[] = {TENSOR_TYPE_Q4_0, TENSOR_TYPE_Q4_1, TENSOR_TYPE_Q5_0,
                                 TENSOR_TYPE_Q5_1, TENSOR_TYPE_Q4_K, TENSOR_TYPE_Q5_K,
                                 TENSOR_TYPE_Q6_K};
    float *deq = malloc((size_t)(n * rows) * sizeof *deq);
    void *q = malloc((size_t)(n * rows) * 4);
    const float *w = t->data;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        ck_assert_ptr_nonnull(tensor_type_get_traits(types[k])->quantize_weighted);
        double e[2];
        for (int with = 0; with < 2; with++) {
            tensor_quantize_rows(types[k], w, q, rows, n, with ? imp : NULL);
            tensor_type_get_traits(types[k])->to_float(q, deq, n * rows);
            e[with] = 0;
            for (int64_t i = 0; i < n * rows; i++) {
                const double d = (double)w[i] - deq[i];
                e[with] += imp[i % n] * d * d;
            }
        }
        printf("  %-5s weighted error without %.5g, with importance %.5g (%.1f%%)\n",
               tensor_type_name(types[k]), e[0], e[1], 100.0 * (e[1] / e[0] - 1.0));
        ck_assert_msg(e[1] < e[0], "%s: importance did not lower the weighted error",
                      tensor_type_name(types[k]));
    }
    ck_assert_ptr_null(tensor_type_get_traits(TENSOR_TYPE_Q8_0)->quantize_weighted);
    free(imp);
    free(deq);
    free(q);
    gguf_destroy(&f);
    free(in);
}
END_TEST

/* Measured errors: relative RMS in (0, 1), smaller for more bits, an output error only with an
 * importance matrix; and with one, llama.cpp's Q4_0 recipe change (first eighth of ffn_down in
 * Q4_1) and the entries used. */
START_TEST(test_measured_errors_and_importance) {
    char *in = shared("models/synth-llama-f32.gguf");
    gguf_file *f = open_ok(in);
    quantize_params p = quantize_params_default();
    p.measure = 1;
    quantize_result r4, r8;
    corral_error err;
    p.ftype = QUANTIZE_FTYPE_Q4_0;
    p.pure = 1;
    ck_assert_int_eq(quantize_plan(f, &p, &r4, &err), CORRAL_OK);
    p.ftype = QUANTIZE_FTYPE_Q8_0;
    ck_assert_int_eq(quantize_plan(f, &p, &r8, &err), CORRAL_OK);
    for (uint32_t i = 0; i < r4.n_tensors; i++) {
        const quantize_tensor_info *a = &r4.tensors[i], *b = &r8.tensors[i];
        ck_assert_int_eq(a->measured, a->converted);
        if (!a->measured) continue;
        ck_assert(a->weight_error > 0 && a->weight_error < 1);
        ck_assert(b->weight_error > 0 && b->weight_error < a->weight_error / 4);
        ck_assert(a->output_error == -1.0);
    }
    ck_assert(r4.bpw_out < r8.bpw_out && r8.bpw_out < r8.bpw_in);
    quantize_result_free(&r4);
    quantize_result_free(&r8);

    imatrix *im = imatrix_new();
    ck_assert_ptr_nonnull(im);
    float ones[768];
    for (int j = 0; j < 768; j++) ones[j] = 1.0f + (float)(j % 7);
    ck_assert_int_eq(imatrix_set(im, "blk.0.ffn_down.weight", ones, 768, 100, &err), CORRAL_OK);
    ck_assert_int_eq(imatrix_set(im, "blk.0.attn_q.weight", ones, 256, 100, &err), CORRAL_OK);
    p.ftype = QUANTIZE_FTYPE_Q4_0;
    p.pure = 0;
    p.imatrix = im;
    quantize_result ri;
    ck_assert_int_eq(quantize_plan(f, &p, &ri, &err), CORRAL_OK);
    ck_assert_uint_eq(ri.n_importance, 2);
    /* llama.cpp's Q4_1 guard for the first eighth of ffn_down with an importance matrix: of 2
     * layers, none (0 < 2 / 8 is false). */
    ck_assert_uint_eq(find_info(&ri, "blk.0.ffn_down.weight")->type, TENSOR_TYPE_Q4_0);
    ck_assert(find_info(&ri, "blk.0.attn_q.weight")->output_error > 0);
    ck_assert(find_info(&ri, "blk.0.attn_k.weight")->output_error == -1.0);
    quantize_result_free(&ri);
    imatrix_destroy(&im);
    gguf_destroy(&f);
    free(in);
}
END_TEST

/* A budget is met (never exceeded) and spent: at Q4_K_M's size the chosen types measure less
 * total error than Q4_K_M's, and a larger budget gives less error still. */
START_TEST(test_budget) {
    char *in = shared("models/synth-llama-f32.gguf");
    gguf_file *f = open_ok(in);
    corral_error err;
    quantize_params p = quantize_params_default();
    p.ftype = QUANTIZE_FTYPE_Q4_K_M;
    p.measure = 1;
    quantize_result fixed;
    ck_assert_int_eq(quantize_plan(f, &p, &fixed, &err), CORRAL_OK);
    double budgets[2] = {fixed.bpw_out, 6.0}, total[2];
    for (int b = 0; b < 2; b++) {
        p.target_bpw = budgets[b];
        quantize_result r;
        ck_assert_msg(quantize_plan(f, &p, &r, &err) == CORRAL_OK, "%s", err.message);
        ck_assert(r.bpw_out <= budgets[b]);
        ck_assert(r.bpw_out > budgets[b] - 0.25);
        total[b] = 0;
        for (uint32_t i = 0; i < r.n_tensors; i++) {
            if (r.tensors[i].measured)
                total[b] += r.tensors[i].weight_error * r.tensors[i].weight_error;
            if (r.tensors[i].converted)
                ck_assert_int_eq(r.tensors[i].reason, QUANTIZE_REASON_BUDGET);
        }
        quantize_result_free(&r);
    }
    double total_fixed = 0;
    for (uint32_t i = 0; i < fixed.n_tensors; i++)
        if (fixed.tensors[i].measured)
            total_fixed += fixed.tensors[i].weight_error * fixed.tensors[i].weight_error;
    printf("  budget %.3f bpw: total error %.5g (Q4_K_M %.5g); 6.0 bpw: %.5g\n", budgets[0],
           total[0], total_fixed, total[1]);
    ck_assert(total[0] < total_fixed);
    ck_assert(total[1] < total[0]);
    quantize_result_free(&fixed);
    gguf_destroy(&f);
    free(in);
}
END_TEST

/* A row source (a merge) feeds the tensors it claims: the output is the quantization of its rows
 * (here the base doubled), and a tensor it claims is converted even when its type stays. */
typedef struct double_source {
    const gguf_file *f;
    int began, ended;
} double_source;

static corral_status ds_begin(void *user, uint64_t index, corral_error *err) {
    (void)index;
    (void)err;
    ((double_source *)user)->began++;
    return CORRAL_OK;
}

static corral_status ds_rows(void *user, uint64_t index, int64_t row0, int64_t n_rows, float *dst,
                             corral_error *err) {
    (void)err;
    const gguf_tensor *t = gguf_tensor_at(((double_source *)user)->f, index);
    const float *src = (const float *)t->data + row0 * t->ne[0];
    for (int64_t i = 0; i < n_rows * t->ne[0]; i++) dst[i] = 2.0f * src[i];
    return CORRAL_OK;
}

static void ds_end(void *user, uint64_t index) {
    (void)index;
    ((double_source *)user)->ended++;
}

START_TEST(test_row_source) {
    char *in = shared("models/synth-llama-f32.gguf");
    gguf_file *f = open_ok(in);
    uint8_t *from = calloc(gguf_tensor_count(f), 1);
    uint64_t iq = 0, inorm = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (gguf_str_eq(t->name, "blk.0.attn_q.weight")) iq = i;
        if (gguf_str_eq(t->name, "blk.0.attn_norm.weight")) inorm = i;
    }
    from[iq] = 1;
    double_source ds = {.f = f};
    const quantize_source src = {
        .from_source = from, .begin = ds_begin, .rows = ds_rows, .end = ds_end, .user = &ds};
    quantize_params p = quantize_params_default();
    p.ftype = QUANTIZE_FTYPE_F32; /* attn_q stays F32: converted only because it is claimed */
    p.source = &src;
    corral_error err;
    ck_assert_int_eq(quantize_write(f, tmp_path("src.gguf"), &p, NULL, &err), CORRAL_OK);
    ck_assert_int_eq(ds.began, 1);
    ck_assert_int_eq(ds.ended, 1);
    gguf_file *g = open_ok(tmp_path("src.gguf"));
    const gguf_tensor *a = gguf_tensor_at(f, iq), *b = gguf_find_tensor(g, "blk.0.attn_q.weight");
    for (int64_t i = 0; i < a->ne[0] * a->ne[1]; i++)
        ck_assert(((const float *)b->data)[i] == 2.0f * ((const float *)a->data)[i]);
    const gguf_tensor *na = gguf_tensor_at(f, inorm),
                      *nb = gguf_find_tensor(g, "blk.0.attn_norm.weight");
    ck_assert(memcmp(na->data, nb->data, (size_t)na->size) == 0);
    gguf_destroy(&g);
    gguf_destroy(&f);
    free(from);
    free(in);
}
END_TEST

/* ---- limits ---------------------------------------------------------------------------------- */

/* Rows that fit no block: Q4_K falls back to Q5_0, and for rows of 172 to F16, as llama.cpp's
 * table says; 1-D tensors are never quantized. */
START_TEST(test_fallbacks) {
    char *in = shared("models/stories260K.gguf");
    gguf_file *f = open_ok(in);
    quantize_params p = quantize_params_default();
    p.ftype = QUANTIZE_FTYPE_Q4_K_M;
    quantize_result r;
    corral_error err;
    ck_assert_int_eq(quantize_plan(f, &p, &r, &err), CORRAL_OK);
    ck_assert_uint_eq(find_info(&r, "blk.0.attn_q.weight")->type, TENSOR_TYPE_Q5_0);
    ck_assert_int_eq(find_info(&r, "blk.0.attn_q.weight")->reason, QUANTIZE_REASON_FALLBACK);
    ck_assert_uint_eq(find_info(&r, "blk.0.ffn_down.weight")->type, TENSOR_TYPE_F16);
    /* The output goes to Q8_0 directly (the recipe's rule for rows that fit no Q6_K block). */
    ck_assert_uint_eq(find_info(&r, "output.weight")->type, TENSOR_TYPE_Q8_0);
    ck_assert_int_eq(find_info(&r, "output.weight")->reason, QUANTIZE_REASON_RECIPE);
    ck_assert_uint_eq(r.n_fallback, gguf_tensor_count(f) - 12); /* not the 11 norms, the output */
    quantize_result_free(&r);
    gguf_destroy(&f);
    free(in);
}
END_TEST

/* A row source that always fails. */
static corral_status bad_rows(void *user, uint64_t index, int64_t row0, int64_t n_rows, float *dst,
                              corral_error *err) {
    (void)user, (void)index, (void)row0, (void)n_rows, (void)dst;
    return corral_error_set(err, CORRAL_IO, "the source broke");
}

/* The calibration text of these tests: the TinyStories sample (malloc'ed, *len bytes). */
static char *sample_text(size_t *len) {
    FILE *fp = fopen(test_shared_path("reference/tinystories-sample.txt"), "rb");
    ck_assert_ptr_nonnull(fp);
    char *text = malloc(1 << 16);
    *len = fread(text, 1, 1 << 16, fp);
    fclose(fp);
    ck_assert(*len > 1000);
    return text;
}

/* The probe swaps one tensor and puts it back: the tensor's own bytes move nothing (exactly 0),
 * its quantized bytes move the predictions, the more the coarser the type, and after each
 * measurement the model is as it was. */
START_TEST(test_probe) {
    char *in = shared("models/synth-llama-f32.gguf");
    size_t len;
    char *text = sample_text(&len);
    corral_error err;
    threadpool *pool = threadpool_new(2, &err);
    ck_assert_ptr_nonnull(pool);
    quant_probe *probe;
    ck_assert_msg(quant_probe_new(in, text, len, 256, pool, &probe, &err) == CORRAL_OK, "%s",
                  err.message);
    ck_assert_uint_eq(quant_probe_scored(probe), 256);
    gguf_file *f = open_ok(in);
    const char *names[] = {"output.weight", "blk.1.ffn_down.weight"};
    for (int i = 0; i < 2; i++) {
        const gguf_tensor *t = gguf_find_tensor(f, names[i]);
        const int64_t n = t->ne[0] * t->ne[1];
        float *copy = malloc((size_t)n * sizeof *copy);
        memcpy(copy, t->data, (size_t)n * sizeof *copy);
        double kl_same, kl[2], kl_after;
        ck_assert_int_eq(quant_probe_kl(probe, names[i], TENSOR_TYPE_F32, copy, &kl_same, &err),
                         CORRAL_OK);
        const tensor_type types[2] = {TENSOR_TYPE_Q4_0, TENSOR_TYPE_Q8_0};
        for (int k = 0; k < 2; k++) {
            void *q = malloc(tensor_row_size(types[k], t->ne[0]) * (size_t)t->ne[1]);
            tensor_quantize_rows(types[k], copy, q, t->ne[1], t->ne[0], NULL);
            ck_assert_int_eq(quant_probe_kl(probe, names[i], types[k], q, &kl[k], &err), CORRAL_OK);
            free(q);
        }
        ck_assert_int_eq(quant_probe_kl(probe, names[i], TENSOR_TYPE_F32, copy, &kl_after, &err),
                         CORRAL_OK);
        printf("  %s: KL %g (own bytes), %g (Q4_0), %g (Q8_0), %g (own bytes again)\n", names[i],
               kl_same, kl[0], kl[1], kl_after);
        ck_assert(kl_same == 0.0 && kl_after == 0.0);
        ck_assert(kl[1] > 0 && kl[0] > 4 * kl[1]);
        free(copy);
    }
    ck_assert_int_eq(
        quant_probe_kl(probe, "nope.weight", TENSOR_TYPE_F32, NULL, &(double){0}, &err),
        CORRAL_FAILED_PRECONDITION);
    quant_probe_destroy(&probe);
    /* A text too short to measure anything; a file that is no model. */
    ck_assert_int_eq(quant_probe_new(in, "Once", 4, 256, pool, &probe, &err),
                     CORRAL_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.message, "at least 16") != NULL, "%s", err.message);
    ck_assert_ptr_null(probe);
    char *im_path = shared("models/TENSOR_TYPES.txt");
    ck_assert_int_ne(quant_probe_new(im_path, text, len, 256, pool, &probe, &err), CORRAL_OK);
    ck_assert_ptr_null(probe);
    free(im_path);
    gguf_destroy(&f);
    threadpool_destroy(&pool);
    free(text);
    free(in);
}
END_TEST

/* With calibration text the budget weighs each tensor by its measured effect: the weights differ
 * from the roles' (on these random weights the embedding's noise matters about as much as the
 * output's, several times more than a layer matrix's; a key projection's least), the budget
 * still holds, and the parameters that cannot go with it are refused. */
START_TEST(test_budget_calibrated) {
    char *in = shared("models/synth-llama-f32.gguf");
    gguf_file *f = open_ok(in);
    size_t len;
    char *text = sample_text(&len);
    corral_error err;
    quantize_params p = quantize_params_default();
    p.ftype = QUANTIZE_FTYPE_Q4_K_S;
    p.target_bpw = 4.7;
    quantize_result r;
    ck_assert_int_eq(quantize_plan(f, &p, &r, &err), CORRAL_OK);
    ck_assert(find_info(&r, "token_embd.weight")->sensitivity == 1.0);
    ck_assert(r.predicted_kl == -1);
    quantize_result_free(&r);
    p.calibration_text = text;
    p.calibration_len = len;
    p.calibration_tokens = 256;
    ck_assert_msg(quantize_plan(f, &p, &r, &err) == CORRAL_OK, "%s", err.message);
    ck_assert(r.bpw_out <= 4.7);
    const double embd = find_info(&r, "token_embd.weight")->sensitivity,
                 out = find_info(&r, "output.weight")->sensitivity,
                 ffn = find_info(&r, "blk.0.ffn_up.weight")->sensitivity,
                 key = find_info(&r, "blk.1.attn_k.weight")->sensitivity;
    printf("  measured sensitivity: token_embd %.3g, output %.3g, blk.0.ffn_up %.3g, blk.1.attn_k "
           "%.3g\n",
           embd, out, ffn, key);
    ck_assert(embd > 3 && out > 3 && embd > 2 * ffn && ffn > key && key > 0);
    /* The sum of the chosen types' measured effects: a KL divergence of the size the file has
     * (0.078 on held-back stories at this size). */
    printf("  predicted KL divergence %.4f\n", r.predicted_kl);
    ck_assert(r.predicted_kl > 0.02 && r.predicted_kl < 0.3);
    for (uint32_t i = 0; i < r.n_tensors; i++)
        if (r.tensors[i].reason == QUANTIZE_REASON_BUDGET) ck_assert(r.tensors[i].sensitivity > 0);
    quantize_result_free(&r);
    /* Calibration without a budget; with a row source (the model is not the file). */
    p.target_bpw = 0;
    ck_assert_int_eq(quantize_plan(f, &p, &r, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.message, "size budget") != NULL, "%s", err.message);
    p.target_bpw = 4.7;
    uint8_t *from = calloc(gguf_tensor_count(f), 1);
    const quantize_source src = {.from_source = from, .rows = bad_rows};
    p.source = &src;
    ck_assert_int_eq(quantize_plan(f, &p, &r, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.message, "merge") != NULL, "%s", err.message);
    free(from);
    free(text);
    gguf_destroy(&f);
    free(in);
}
END_TEST

/* Budgets at the edges: below the smallest file is refused, naming the least possible; a budget
 * above every candidate gives each eligible tensor its largest candidate (F16). */
START_TEST(test_budget_limits) {
    char *in = shared("models/synth-llama-f32.gguf");
    gguf_file *f = open_ok(in);
    quantize_params p = quantize_params_default();
    p.ftype = QUANTIZE_FTYPE_Q4_K_M;
    p.target_bpw = 2.0;
    quantize_result r;
    corral_error err;
    ck_assert_int_eq(quantize_plan(f, &p, &r, &err), CORRAL_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.message, "smallest file") != NULL, "%s", err.message);
    p.target_bpw = 40;
    ck_assert_int_eq(quantize_plan(f, &p, &r, &err), CORRAL_OK);
    ck_assert_uint_eq(find_info(&r, "blk.0.attn_q.weight")->type, TENSOR_TYPE_F16);
    ck_assert(r.bpw_out <= 40);
    quantize_result_free(&r);
    p.target_bpw = 65;
    ck_assert_int_eq(quantize_plan(f, &p, &r, &err), CORRAL_INVALID_ARGUMENT);
    gguf_destroy(&f);
    free(in);
}
END_TEST

/* ---- errors ---------------------------------------------------------------------------------- */

START_TEST(test_errors) {
    char *in = shared("models/synth-llama-f32.gguf");
    char *q8 = shared("models/synth-llama-q8_0.gguf");
    corral_error err;
    quantize_params p = quantize_params_default();
    /* A quantized input is refused unless requantizing is allowed, naming the tensor. */
    p.ftype = QUANTIZE_FTYPE_Q4_0;
    ck_assert_int_eq(quantize_file(q8, tmp_path("rq.gguf"), &p, NULL, &err), CORRAL_UNSUPPORTED);
    ck_assert_msg(strstr(err.message, "requantizing from type Q8_0") != NULL, "%s", err.message);
    ck_assert(!file_exists(tmp_path("rq.gguf")));
    p.allow_requantize = 1;
    ck_assert_int_eq(quantize_file(q8, tmp_path("rq.gguf"), &p, NULL, &err), CORRAL_OK);
    p = quantize_params_default();
    /* Parameters. */
    p.ftype = (quantize_ftype)5;
    ck_assert_int_eq(quantize_file(in, tmp_path("x.gguf"), &p, NULL, &err),
                     CORRAL_INVALID_ARGUMENT);
    p = quantize_params_default();
    p.output_tensor_type = TENSOR_TYPE_Q2_K; /* a type corral does not run */
    ck_assert_int_eq(quantize_file(in, tmp_path("x.gguf"), &p, NULL, &err),
                     CORRAL_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.message, "Q2_K") != NULL, "%s", err.message);
    p = quantize_params_default();
    quantize_override rule = {"attn", TENSOR_TYPE_Q4_0};
    p.overrides = &rule;
    p.n_overrides = 1; /* no matcher */
    ck_assert_int_eq(quantize_file(in, tmp_path("x.gguf"), &p, NULL, &err),
                     CORRAL_INVALID_ARGUMENT);
    /* The type options bypass the fallback: rows that fit no block are an error, not garbage. */
    char *stories = shared("models/stories260K.gguf");
    p = quantize_params_default();
    p.output_tensor_type = TENSOR_TYPE_Q4_K;
    ck_assert_int_eq(quantize_file(stories, tmp_path("x.gguf"), &p, NULL, &err),
                     CORRAL_INVALID_ARGUMENT);
    ck_assert_msg(strstr(err.message, "output.weight") && strstr(err.message, "rows of 64"), "%s",
                  err.message);
    free(stories);
    /* An importance entry of the wrong size, naming it. */
    p = quantize_params_default();
    imatrix *im = imatrix_new();
    float v[100];
    for (int i = 0; i < 100; i++) v[i] = 1;
    ck_assert_int_eq(imatrix_set(im, "blk.0.attn_q.weight", v, 100, 1, &err), CORRAL_OK);
    p.imatrix = im;
    ck_assert_int_eq(quantize_file(in, tmp_path("x.gguf"), &p, NULL, &err), CORRAL_FORMAT);
    ck_assert_msg(strstr(err.message, "blk.0.attn_q.weight") != NULL, "%s", err.message);
    imatrix_destroy(&im);
    /* The same file in and out; a missing input; an unwritable output. */
    p = quantize_params_default();
    ck_assert_int_eq(quantize_file(tmp_path("rq.gguf"), tmp_path("rq.gguf"), &p, NULL, &err),
                     CORRAL_INVALID_ARGUMENT);
    ck_assert_int_eq(quantize_file(tmp_path("none.gguf"), tmp_path("x.gguf"), &p, NULL, &err),
                     CORRAL_NOT_FOUND);
    ck_assert_int_ne(quantize_file(in, tmp_path("no/dir/x.gguf"), &p, NULL, &err), CORRAL_OK);
    ck_assert(!file_exists(tmp_path("x.gguf")));
    /* Cancelled: nothing is left. */
    atomic_int cancel = 1;
    p.cancel = &cancel;
    ck_assert_int_eq(quantize_file(in, tmp_path("c.gguf"), &p, NULL, &err), CORRAL_CANCELLED);
    ck_assert(!file_exists(tmp_path("c.gguf")));
    free(in);
    free(q8);
}
END_TEST

/* A source that fails mid-tensor fails the write with its error, leaving no file. */
START_TEST(test_source_error) {
    char *in = shared("models/synth-llama-f32.gguf");
    gguf_file *f = open_ok(in);
    uint8_t *from = calloc(gguf_tensor_count(f), 1);
    from[3] = 1;
    const quantize_source src = {.from_source = from, .rows = bad_rows};
    quantize_params p = quantize_params_default();
    p.source = &src;
    corral_error err;
    ck_assert_int_eq(quantize_write(f, tmp_path("bad.gguf"), &p, NULL, &err), CORRAL_IO);
    ck_assert_msg(strstr(err.message, "the source broke") != NULL, "%s", err.message);
    ck_assert(!file_exists(tmp_path("bad.gguf")));
    free(from);
    gguf_destroy(&f);
    free(in);
}
END_TEST

static Suite *quantize_suite(void) {
    Suite *s = suite_create("quantize");
    TCase *core = tcase_create("core");
    tcase_add_checked_fixture(core, tmp_setup, tmp_teardown);
    tcase_add_test(core, test_synth_llama_matches_llama_quantize);
    tcase_add_test(core, test_qwen2_and_stories_match_shared_files);
    tcase_add_test(core, test_threads_do_not_change_the_file);
    tcase_add_test(core, test_recipe_choices);
    tcase_add_test(core, test_overrides);
    tcase_add_test(core, test_importance_lowers_weighted_error);
    tcase_add_test(core, test_measured_errors_and_importance);
    tcase_add_test(core, test_budget);
    tcase_add_test(core, test_probe);
    tcase_add_test(core, test_budget_calibrated);
    tcase_add_test(core, test_row_source);
    suite_add_tcase(s, core);
    TCase *limits = tcase_create("limits");
    tcase_add_checked_fixture(limits, tmp_setup, tmp_teardown);
    tcase_add_test(limits, test_fallbacks);
    tcase_add_test(limits, test_budget_limits);
    suite_add_tcase(s, limits);
    TCase *errors = tcase_create("errors");
    tcase_add_checked_fixture(errors, tmp_setup, tmp_teardown);
    tcase_add_test(errors, test_errors);
    tcase_add_test(errors, test_source_error);
    suite_add_tcase(s, errors);
    return s;
}

CORRAL_CHECK_MAIN(quantize_suite)
